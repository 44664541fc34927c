//! Range predicates on `offset` and `ts` prune frames instead of scanning
//! the whole stream: counted with the `frames_read` metric, never timed.

use sluice_tests::{exec, stats, text_rows, Server};

fn frames_read(s: &std::collections::HashMap<String, i64>) -> i64 {
    *s.get("frames_read").expect("sluice_stats has frames_read")
}

#[tokio::test(flavor = "multi_thread")]
async fn offset_and_ts_predicates_skip_frames() {
    // small segments, so the stream also spans several segment files
    let server = Server::start_with(&["--segment-bytes", "4096"]).await;
    let client = server.client().await;
    exec(&client, "CREATE STREAM p (n integer NOT NULL)").await;
    // one statement = one frame
    for i in 0..100 {
        exec(&client, &format!("INSERT INTO p VALUES ({i})")).await;
    }
    let segments = text_rows(
        &client,
        "SELECT segments FROM sluice_streams WHERE name = 'p'",
    )
    .await;
    assert!(
        segments[0][0].parse::<i64>().expect("segments is a number") > 1,
        "expected rollover, got {segments:?}"
    );

    let before = frames_read(&stats(&client).await);
    let rows = text_rows(&client, "SELECT count(*), min(n) FROM p WHERE offset > 95").await;
    assert_eq!(rows, vec![vec!["4".to_string(), "96".to_string()]]);
    let after = frames_read(&stats(&client).await);
    assert!(
        after - before <= 4,
        "offset > 95 read {} frames of 100",
        after - before
    );

    let before = after;
    let rows = text_rows(
        &client,
        "SELECT count(*) FROM p WHERE offset BETWEEN 10 AND 19",
    )
    .await;
    assert_eq!(rows, vec![vec!["10".to_string()]]);
    let after = frames_read(&stats(&client).await);
    assert!(
        after - before <= 10,
        "BETWEEN 10 AND 19 read {} frames",
        after - before
    );

    // a ts bound after every commit reads nothing; a full scan reads all 100
    let before = after;
    let rows = text_rows(
        &client,
        "SELECT count(*) FROM p WHERE ts > now() + interval '1 hour'",
    )
    .await;
    assert_eq!(rows, vec![vec!["0".to_string()]]);
    let after = frames_read(&stats(&client).await);
    assert_eq!(
        after - before,
        0,
        "a ts bound past every frame still read frames"
    );
    let before = after;
    let rows = text_rows(&client, "SELECT count(*) FROM p").await;
    assert_eq!(rows, vec![vec!["100".to_string()]]);
    assert_eq!(frames_read(&stats(&client).await) - before, 100);
}

/// A view over a stream prunes as the stream does: its query is expanded into the statement,
/// so `offset` and `ts` bounds on the view reach the stream's scan (issue 22).
#[tokio::test(flavor = "multi_thread")]
async fn predicates_through_a_view_skip_frames() {
    let server = Server::start().await;
    let client = server.client().await;
    exec(&client, "CREATE STREAM pv (n integer NOT NULL, note text)").await;
    for i in 0..50 {
        exec(&client, &format!("INSERT INTO pv VALUES ({i}, 'x')")).await;
    }
    exec(
        &client,
        "CREATE VIEW evens AS SELECT offset, ts, n FROM pv WHERE n % 2 = 0",
    )
    .await;
    exec(
        &client,
        "CREATE VIEW late (o, n) AS SELECT offset, n FROM evens",
    )
    .await;

    let before = frames_read(&stats(&client).await);
    let rows = text_rows(
        &client,
        "SELECT count(*), min(n) FROM evens WHERE offset >= 40",
    )
    .await;
    assert_eq!(rows, vec![vec!["5".to_string(), "40".to_string()]]);
    let read = frames_read(&stats(&client).await) - before;
    assert!(
        read <= 10,
        "offset >= 40 through a view read {read} frames of 50"
    );

    // through a view over the view, under a renamed column
    let before = frames_read(&stats(&client).await);
    let rows = text_rows(&client, "SELECT n FROM late WHERE o > 46 ORDER BY n").await;
    assert_eq!(rows, vec![vec!["48".to_string()]]);
    let read = frames_read(&stats(&client).await) - before;
    assert!(
        read <= 3,
        "o > 46 through two views read {read} frames of 50"
    );

    let before = frames_read(&stats(&client).await);
    let rows = text_rows(
        &client,
        "SELECT count(*) FROM evens WHERE ts > now() + interval '1 hour'",
    )
    .await;
    assert_eq!(rows, vec![vec!["0".to_string()]]);
    assert_eq!(frames_read(&stats(&client).await) - before, 0);
}

fn bytes_read(s: &std::collections::HashMap<String, i64>) -> i64 {
    *s.get("segment_bytes_read")
        .expect("sluice_stats has segment_bytes_read")
}

/// A query over small columns of a frame of wide rows reads those columns' bytes from the
/// segment file, not the frame (issue 25): counted with `segment_bytes_read`, never timed.
/// Holds for a frame appended by this process and, after a restart, for one recovered.
#[tokio::test(flavor = "multi_thread")]
async fn a_query_over_small_columns_reads_only_their_bytes() {
    let mut server = Server::start().await;
    let client = server.client().await;
    // 400 rows of ~1 KiB that compress poorly (hex digests), in one frame
    exec(
        &client,
        "CREATE STREAM wide (customer text NOT NULL, amount numeric(12,2), payload text) \
         WITH (compression = 'lz4')",
    )
    .await;
    let payload = (0..32)
        .map(|k| format!("md5(g::text || '{k}')"))
        .collect::<Vec<_>>()
        .join(" || ");
    exec(
        &client,
        &format!(
            "INSERT INTO wide SELECT 'c' || (g % 4), g * 0.25, {payload} \
             FROM generate_series(1, 400) AS t(g)"
        ),
    )
    .await;
    let on_disk: i64 = text_rows(
        &client,
        "SELECT bytes FROM sluice_streams WHERE name = 'wide'",
    )
    .await[0][0]
        .parse()
        .expect("bytes");
    assert!(
        on_disk > 300_000,
        "the frame should stay large: {on_disk} bytes"
    );
    for round in ["appended", "recovered"] {
        let client = server.client().await;
        let before = bytes_read(&stats(&client).await);
        let rows = text_rows(
            &client,
            "SELECT customer, count(*), sum(amount) FROM wide GROUP BY customer ORDER BY customer",
        )
        .await;
        assert_eq!(rows.len(), 4, "{round}: {rows:?}");
        assert_eq!(rows[1], vec!["c1", "100", "4975.00"], "{round}");
        let small = bytes_read(&stats(&client).await) - before;
        assert!(
            small > 0 && small < on_disk / 10,
            "{round}: GROUP BY over two small columns read {small} of {on_disk} bytes"
        );
        let before = bytes_read(&stats(&client).await);
        let rows = text_rows(&client, "SELECT sum(length(payload)) FROM wide").await;
        assert_eq!(rows, vec![vec!["409600".to_string()]], "{round}");
        let whole = bytes_read(&stats(&client).await) - before;
        assert!(
            whole >= on_disk * 9 / 10,
            "{round}: reading the payload read {whole} of {on_disk} bytes"
        );
        if round == "appended" {
            server.restart().await;
        }
    }
}
