//! Compression of stream history (issue 23): `WITH (compression = 'lz4' | 'zstd' | 'none')`
//! compresses appended batches with Arrow's own IPC buffer compression; every reader gets
//! the same rows whatever a frame was written with; `sluice_streams` reports the stored and
//! the uncompressed size and their ratio — also after a restart from the checkpoint or the
//! log, where the sizes are rebuilt from the frames on disk.
//!
//! Before: the option was refused (`unrecognized stream option "compression"`) and nothing
//! was compressed.

use sluice_tests::{exec, expect_sqlstate, simple_rows, Server};
use tokio_postgres::error::SqlState;
use tokio_postgres::Client;

/// Rows like application events: a customer, an amount and ~1 KiB of repetitive text.
fn rows(n: usize) -> String {
    let words = [
        "order", "paid", "shipped", "eu", "us", "item", "price", "customer",
    ];
    let mut out = String::new();
    for i in 0..n {
        let payload: Vec<&str> = (0..150)
            .map(|j| words[(i * 7 + j * j) % words.len()])
            .collect();
        out.push_str(&format!("c{}\t{i}\t{}\n", i % 10, payload.join(" ")));
    }
    out
}

async fn copy_in(client: &Client, stream: &str, data: &str) {
    use futures::SinkExt;
    let sink = client
        .copy_in(&format!(
            "COPY {stream} (customer, amount, payload) FROM STDIN"
        ))
        .await
        .expect("COPY FROM");
    futures::pin_mut!(sink);
    sink.send(bytes::Bytes::from(data.to_string()))
        .await
        .expect("COPY data");
    sink.finish().await.expect("COPY end");
}

/// (bytes, logical_bytes, compression_ratio, compression) of `stream`.
async fn sizes(client: &Client, stream: &str) -> (i64, i64, f64, String) {
    let rows = simple_rows(
        client,
        &format!(
            "SELECT bytes, logical_bytes, compression_ratio, compression FROM sluice_streams \
             WHERE name = '{stream}'"
        ),
    )
    .await;
    let r = &rows[0];
    let field = |i: usize| r[i].clone().expect("not NULL");
    (
        field(0).parse().expect("bytes"),
        field(1).parse().expect("logical_bytes"),
        field(2).parse().expect("ratio"),
        field(3),
    )
}

/// Every stream's user columns, in offset order.
async fn content(client: &Client, stream: &str) -> Vec<Vec<Option<String>>> {
    simple_rows(
        client,
        &format!("SELECT offset, customer, amount, payload FROM {stream} ORDER BY offset"),
    )
    .await
}

/// The three codecs' streams and the default hold `expected` (the `none` stream's rows)
/// and report their sizes as compressed.
async fn check(client: &Client, expected: &[Vec<Option<String>>]) {
    let (plain, plain_logical, plain_ratio, c) = sizes(client, "s_none").await;
    assert_eq!(
        (plain, plain_ratio, c.as_str()),
        (plain_logical, 1.0, "none")
    );
    for (s, name, at_least) in [
        ("s_lz4", "lz4", 1.5),
        ("s_zstd", "zstd", 3.0),
        ("s_default", "lz4", 1.5),
    ] {
        assert_eq!(
            content(client, s).await,
            expected,
            "{s} reads the same rows"
        );
        let (bytes, logical, ratio, c) = sizes(client, s).await;
        assert_eq!(c, name);
        assert!(ratio >= at_least, "{s}: ratio {ratio}");
        assert!(
            bytes * 3 / 2 <= plain,
            "{s}: {bytes} bytes vs {plain} uncompressed"
        );
        // the uncompressed size is the plain stream's, within Arrow's buffer padding
        assert!(
            logical.abs_diff(plain) <= 64 * 8,
            "{s}: logical {logical} vs {plain}"
        );
    }
    // a filter and an aggregate over compressed frames
    assert_eq!(
        simple_rows(
            client,
            "SELECT count(*), sum(amount) FROM s_zstd WHERE customer = 'c3'"
        )
        .await,
        simple_rows(
            client,
            "SELECT count(*), sum(amount) FROM s_none WHERE customer = 'c3'"
        )
        .await
    );
}

#[tokio::test]
async fn compressed_history_reads_back_and_reports_its_ratio_across_restarts() {
    let mut server = Server::start().await;
    let client = server.client().await;
    for c in ["none", "lz4", "zstd"] {
        exec(
            &client,
            &format!(
                "CREATE STREAM s_{c} (customer text, amount bigint, payload text) \
                 WITH (compression = '{c}')"
            ),
        )
        .await;
    }
    exec(
        &client,
        "CREATE STREAM s_default (customer text, amount bigint, payload text)",
    )
    .await;
    let data = rows(2000);
    for s in ["s_none", "s_lz4", "s_zstd", "s_default"] {
        // four COPYs: several frames, spread over the checkpoint below
        for part in data.lines().collect::<Vec<_>>().chunks(500) {
            copy_in(&client, s, &(part.join("\n") + "\n")).await;
        }
    }
    // one-row appends are too small to be worth compressing
    exec(
        &client,
        "INSERT INTO s_zstd (customer, amount, payload) VALUES ('tiny', 1, 'x')",
    )
    .await;
    exec(
        &client,
        "INSERT INTO s_none (customer, amount, payload) VALUES ('tiny', 1, 'x')",
    )
    .await;
    exec(
        &client,
        "INSERT INTO s_lz4 (customer, amount, payload) VALUES ('tiny', 1, 'x')",
    )
    .await;
    exec(
        &client,
        "INSERT INTO s_default (customer, amount, payload) VALUES ('tiny', 1, 'x')",
    )
    .await;

    let expected = content(&client, "s_none").await;
    assert_eq!(expected.len(), 2001);
    check(&client, &expected).await;
    // from the checkpoint a clean stop writes
    server.restart().await;
    check(&server.client().await, &expected).await;
    // from the log: appends after the last checkpoint are replayed into the segments
    let client = server.client().await;
    copy_in(&client, "s_zstd", &rows(300)).await;
    copy_in(&client, "s_none", &rows(300)).await;
    copy_in(&client, "s_lz4", &rows(300)).await;
    copy_in(&client, "s_default", &rows(300)).await;
    let expected = content(&client, "s_none").await;
    assert_eq!(expected.len(), 2301);
    server.kill();
    server.restart().await;
    check(&server.client().await, &expected).await;
}

#[tokio::test]
async fn compression_is_an_option_that_alter_changes_for_later_appends() {
    let server = Server::start().await;
    let client = server.client().await;
    let bad = client
        .simple_query("CREATE STREAM bad (a text) WITH (compression = 'gzip')")
        .await;
    let e = expect_sqlstate(bad, &SqlState::INVALID_PARAMETER_VALUE, "unknown codec");
    let message = sluice_tests::error_message(&e);
    assert!(message.contains("lz4, zstd, none"), "{message}");

    exec(
        &client,
        "CREATE STREAM ev (customer text, amount bigint, payload text) WITH (compression = 'none')",
    )
    .await;
    copy_in(&client, "ev", &rows(500)).await;
    let (before, _, ratio, _) = sizes(&client, "ev").await;
    assert_eq!(ratio, 1.0);
    exec(&client, "ALTER STREAM ev SET (compression = 'zstd')").await;
    copy_in(&client, "ev", &rows(500)).await;
    let (after, logical, ratio, c) = sizes(&client, "ev").await;
    assert_eq!(c, "zstd");
    assert!(ratio > 1.4, "half the history compressed: {ratio}");
    assert!(
        after - before < before / 2,
        "the second half took {} bytes, the first {before}",
        after - before
    );
    assert!(
        logical.abs_diff(2 * before) <= 64 * 8,
        "{logical} vs {}",
        2 * before
    );
    let bad = client
        .simple_query("ALTER STREAM ev SET (compression = 'brotli')")
        .await;
    expect_sqlstate(bad, &SqlState::INVALID_PARAMETER_VALUE, "unknown codec");
    // an offset range over frames of both kinds
    let rows = simple_rows(
        &client,
        "SELECT count(*), count(DISTINCT payload) FROM ev WHERE offset >= 0 AND offset < 1000",
    )
    .await;
    assert_eq!(rows[0][0].as_deref(), Some("1000"));
}
