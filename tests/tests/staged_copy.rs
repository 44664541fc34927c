//! COPY FROM of any size: a COPY larger than one chunk (`--copy-chunk-bytes 65536` here, so
//! a megabyte is ~20 chunks) is staged on every replica and shown whole by its commit, or
//! not at all: a bad row at the end, a CopyFail, a client gone, a server killed, a copy
//! left idle past its timeout — each leaves nothing visible and no staged files behind. A
//! reader during the COPY sees none of it or all of it. On a cluster every node agrees,
//! including a follower that was down while the copy was staged and catches up from a
//! snapshot that carries it.

use std::path::Path;
use std::time::{Duration, Instant};

use futures::SinkExt;
use sluice_tests::cluster::Cluster;
use sluice_tests::wire::{self, Read, Wire};
use sluice_tests::{exec, expect_sqlstate, text_rows, within, Server, STATEMENT_TIMEOUT};
use tokio_postgres::error::SqlState;
use tokio_postgres::Client;

const CHUNK: &str = "65536";
const ROWS: u64 = 20_000;
/// The CopyData messages the tests send: rows are cut anywhere.
const PIECE: usize = 8191;

/// CSV rows `from..from + n`, each with a quoted field holding a comma, doubled quotes and a
/// newline (a row boundary must not be taken inside it).
fn csv_rows(from: u64, n: u64) -> String {
    let mut out = String::new();
    for i in from..from + n {
        out.push_str(&format!(
            "c{},{i}.25,\"payload {i}, with \"\"quotes\"\"\nand a second line\"\n",
            i % 10
        ));
    }
    out
}

const COPY_SQL: &str = "COPY h (customer, amount, payload) FROM STDIN WITH (FORMAT csv)";

/// Sends `data` as a COPY in pieces of [`PIECE`] bytes; the row count, or the error.
async fn copy_csv(client: &Client, data: &str) -> Result<u64, tokio_postgres::Error> {
    let sink = client.copy_in(COPY_SQL).await?;
    futures::pin_mut!(sink);
    for piece in data.as_bytes().chunks(PIECE) {
        sink.send(bytes::Bytes::copy_from_slice(piece)).await?;
    }
    sink.finish().await
}

/// A server started with `args`, a client of it, and the stream `h` the COPYs go into.
async fn server_with_h(args: &[&str]) -> (Server, Client) {
    let server = Server::start_with(args).await;
    let client = server.client().await;
    exec(
        &client,
        "CREATE STREAM h (customer text, amount numeric(12,2), payload text)",
    )
    .await;
    (server, client)
}

async fn count(client: &Client) -> u64 {
    let rows = text_rows(client, "SELECT count(*) FROM h").await;
    rows[0][0].parse().expect("a count")
}

/// Directories of staged copies in a data directory.
fn staged(data_dir: &Path) -> Vec<String> {
    std::fs::read_dir(data_dir.join("streams"))
        .map(|entries| {
            entries
                .flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.starts_with("copy-"))
                .collect()
        })
        .unwrap_or_default()
}

/// Waits (bounded) until `data_dir` holds `n` staged copies.
async fn wait_staged(data_dir: &Path, n: usize, what: &str) {
    let deadline = Instant::now() + STATEMENT_TIMEOUT;
    while staged(data_dir).len() != n {
        assert!(
            Instant::now() < deadline,
            "{what}: staged copies {:?}, expected {n}",
            staged(data_dir)
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A raw connection in COPY FROM STDIN that has sent the first half of `data` (so chunks
/// are staged) and waits.
async fn half_a_copy(port: u16, data: &str) -> Wire {
    let mut w = Wire::connect(port).await;
    w.send(&wire::message(b'Q', &wire::cstr(COPY_SQL))).await;
    let (tag, _) = w.next(STATEMENT_TIMEOUT).await.expect("CopyInResponse");
    assert_eq!(tag, b'G', "COPY FROM STDIN answers CopyInResponse");
    let half = &data.as_bytes()[..data.len() / 2];
    for piece in half.chunks(PIECE) {
        w.send(&wire::message(b'd', piece)).await;
    }
    w
}

/// Sends the rest of `data` and CopyDone; the SQLSTATE of the error the COPY ends with, or
/// None when it commits.
async fn finish_raw(w: &mut Wire, data: &str) -> Option<String> {
    let rest = &data.as_bytes()[data.len() / 2..];
    for piece in rest.chunks(PIECE) {
        w.send(&wire::message(b'd', piece)).await;
    }
    w.send(&wire::message(b'c', &[])).await;
    let mut code = None;
    loop {
        match w.read_message(STATEMENT_TIMEOUT).await {
            Read::Message(b'E', body) => code = Some(wire::error_code(&body)),
            Read::Message(b'Z', _) => return code,
            Read::Message(..) => {}
            other => panic!("the COPY ended with {other:?}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_copy_is_staged_and_appears_whole() {
    // checkpoints every few entries: the staged copy is in checkpoint records too
    let (mut server, client) =
        server_with_h(&["--copy-chunk-bytes", CHUNK, "--checkpoint-entries", "3"]).await;
    let data = csv_rows(0, ROWS);

    // staged while it runs: files under the data directory, nothing in the stream
    let mut w = half_a_copy(server.port(), &data).await;
    wait_staged(server.data_dir(), 1, "half a COPY sent").await;
    assert_eq!(count(&client).await, 0, "staged rows are not visible");
    // a reader polling through the rest sees none of the COPY or all of it
    let reader = server.client().await;
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let polling = {
        let stop = stop.clone();
        tokio::spawn(async move {
            let mut seen = Vec::new();
            for _ in 0..10_000 {
                let n = count(&reader).await;
                seen.push(n);
                if stop.load(std::sync::atomic::Ordering::Acquire) {
                    break;
                }
            }
            seen
        })
    };
    assert_eq!(finish_raw(&mut w, &data).await, None, "the COPY commits");
    stop.store(true, std::sync::atomic::Ordering::Release);
    let seen = within(STATEMENT_TIMEOUT, "the reader", polling)
        .await
        .expect("reader task");
    assert!(
        seen.iter().all(|n| *n == 0 || *n == ROWS),
        "a reader saw part of the COPY: {seen:?}"
    );
    // its files go with the checkpoint the node starts after the commit
    wait_staged(server.data_dir(), 0, "the committed COPY's checkpoint").await;

    let check = |client: Client| async move {
        let rows = text_rows(
            &client,
            "SELECT count(*), count(DISTINCT payload), sum(amount), min(offset), max(offset), \
             count(DISTINCT ts) FROM h",
        )
        .await;
        let sum: f64 = (0..ROWS).map(|i| i as f64 + 0.25).sum();
        assert_eq!(
            rows[0],
            vec![
                ROWS.to_string(),
                ROWS.to_string(),
                format!("{sum:.2}"),
                "0".to_string(),
                (ROWS - 1).to_string(),
                "1".to_string(),
            ],
            "every row once, gapless, at one commit time"
        );
        let row = text_rows(&client, "SELECT payload FROM h WHERE offset = 12345").await;
        assert_eq!(
            row[0][0],
            "payload 12345, with \"quotes\"\nand a second line"
        );
    };
    check(client).await;
    // the commit replays from the Raft log after a crash, exactly once
    server.kill();
    server.restart().await;
    check(server.client().await).await;
    server.restart().await;
    let client = server.client().await;
    check(server.client().await).await;

    // a COPY into a stream that fits in one chunk is one append, as before
    let small = csv_rows(ROWS, 10);
    assert_eq!(copy_csv(&client, &small).await.expect("small COPY"), 10);
    assert_eq!(count(&client).await, ROWS + 10);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_copy_that_fails_late_or_is_cancelled_leaves_nothing() {
    let (server, client) = server_with_h(&["--copy-chunk-bytes", CHUNK]).await;
    // a bad row after ~20 staged chunks
    let mut data = csv_rows(0, ROWS);
    data.push_str("c1,not a number,\"x\"\n");
    data.push_str(&csv_rows(ROWS, 100));
    let e = copy_csv(&client, &data).await.expect_err("a bad row");
    expect_sqlstate::<()>(
        Err(e),
        &SqlState::INVALID_TEXT_REPRESENTATION,
        "a bad numeric at the end",
    );
    assert_eq!(
        count(&client).await,
        0,
        "nothing of a failed COPY is visible"
    );
    wait_staged(server.data_dir(), 0, "after the failed COPY").await;

    // the client gives up half-way (CopyFail)
    {
        let sink = client.copy_in(COPY_SQL).await.expect("COPY FROM");
        futures::pin_mut!(sink);
        let good = csv_rows(0, ROWS);
        for piece in good.as_bytes()[..good.len() / 2].chunks(PIECE) {
            sink.send(bytes::Bytes::copy_from_slice(piece))
                .await
                .expect("COPY data");
        }
        wait_staged(server.data_dir(), 1, "half a COPY").await;
        // dropped without finish: tokio-postgres sends CopyFail
    }
    wait_staged(server.data_dir(), 0, "after CopyFail").await;
    assert_eq!(count(&client).await, 0);

    // the client's connection goes away mid-COPY
    let w = half_a_copy(server.port(), &csv_rows(0, ROWS)).await;
    wait_staged(server.data_dir(), 1, "half a COPY on a raw connection").await;
    drop(w);
    wait_staged(server.data_dir(), 0, "after the client went away").await;
    assert_eq!(count(&client).await, 0);

    // and the stream takes a whole COPY afterwards
    let rows = copy_csv(&client, &csv_rows(0, ROWS)).await.expect("COPY");
    assert_eq!(rows, ROWS);
    assert_eq!(count(&client).await, ROWS);

    // text format, staged too: escapes (a tab, a newline, a backslash) across chunks
    exec(&client, "CREATE STREAM t (n bigint, payload text)").await;
    let mut text = String::new();
    for i in 0..ROWS {
        text.push_str(&format!(
            "{i}\tline {i}\\twith a tab\\nand a newline \\\\ end\n"
        ));
    }
    let sink = client
        .copy_in("COPY t FROM STDIN")
        .await
        .expect("COPY FROM text");
    futures::pin_mut!(sink);
    for piece in text.as_bytes().chunks(PIECE) {
        sink.send(bytes::Bytes::copy_from_slice(piece))
            .await
            .expect("COPY data");
    }
    assert_eq!(sink.finish().await.expect("text COPY"), ROWS);
    let row = text_rows(
        &client,
        "SELECT n, payload, (SELECT count(*) FROM t) FROM t WHERE offset = 777",
    )
    .await;
    assert_eq!(
        row[0],
        vec![
            "777".to_string(),
            "line 777\twith a tab\nand a newline \\ end".to_string(),
            ROWS.to_string()
        ]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_killed_during_a_copy_recovers_with_nothing_of_it() {
    let (mut server, client) = server_with_h(&[
        "--copy-chunk-bytes",
        CHUNK,
        "--checkpoint-entries",
        "3",
        "--copy-idle-timeout",
        "1s",
    ])
    .await;
    exec(&client, "INSERT INTO h VALUES ('before', 1, 'x')").await;
    let data = csv_rows(0, ROWS);
    let _w = half_a_copy(server.port(), &data).await;
    wait_staged(server.data_dir(), 1, "half a COPY").await;
    tokio::time::sleep(Duration::from_millis(300)).await; // a checkpoint lists the copy
    server.kill();
    server.restart().await;
    let client = server.client().await;
    assert_eq!(count(&client).await, 1, "only the row before the COPY");
    // the orphaned copy goes once a command applies past its idle timeout
    tokio::time::sleep(Duration::from_millis(1200)).await;
    exec(&client, "INSERT INTO h VALUES ('after', 2, 'y')").await;
    wait_staged(server.data_dir(), 0, "after the idle timeout").await;
    assert_eq!(count(&client).await, 2);
    server.restart().await;
    assert_eq!(count(&server.client().await).await, 2);
    assert_eq!(staged(server.data_dir()), Vec::<String>::new());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_copy_idle_past_its_timeout_is_dropped_and_says_so() {
    let (server, client) =
        server_with_h(&["--copy-chunk-bytes", CHUNK, "--copy-idle-timeout", "1s"]).await;
    let data = csv_rows(0, ROWS);
    let mut w = half_a_copy(server.port(), &data).await;
    wait_staged(server.data_dir(), 1, "half a COPY").await;
    tokio::time::sleep(Duration::from_millis(1200)).await;
    exec(&client, "INSERT INTO h VALUES ('other', 1, 'x')").await;
    wait_staged(server.data_dir(), 0, "after the idle timeout").await;
    assert_eq!(
        finish_raw(&mut w, &data).await.as_deref(),
        Some("55000"),
        "the COPY learns its rows are gone"
    );
    assert_eq!(count(&client).await, 1, "only the other client's row");
    w.send(&wire::message(b'Q', &wire::cstr("SELECT 1"))).await;
    assert!(w.until_ready().await.contains(&b'D'), "the session goes on");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_staged_copy_commits_or_vanishes_on_every_node() {
    let mut cluster = Cluster::start(
        3,
        false,
        &["--copy-chunk-bytes", CHUNK, "--checkpoint-entries", "5"],
    )
    .await;
    let leader = cluster
        .wait_leader(&[1, 2, 3], None, Duration::from_secs(30))
        .await;
    let follower = if leader == 3 { 2 } else { 3 };
    let client = cluster.client(leader).await;
    exec(
        &client,
        "CREATE STREAM h (customer text, amount numeric(12,2), payload text)",
    )
    .await;
    // a failed COPY: nothing on any node
    let mut bad = csv_rows(0, ROWS);
    bad.push_str("c1,2.5\n");
    let e = copy_csv(&client, &bad).await.expect_err("a short row");
    expect_sqlstate::<()>(
        Err(e),
        &SqlState::INVALID_TEXT_REPRESENTATION,
        "a row with a missing column",
    );

    // a follower is down while the next copy is staged (and the log compacted past it)
    cluster.kill(follower);
    let data = csv_rows(0, ROWS);
    let port = cluster.pg_port(leader).expect("leader up");
    let mut w = half_a_copy(port, &data).await;
    wait_staged(cluster.data_dir(leader), 1, "half a COPY on the leader").await;
    for i in 0..20 {
        exec(
            &client,
            &format!("INSERT INTO h VALUES ('filler', {i}, 'f')"),
        )
        .await;
    }
    cluster.restart(follower).await;
    let follower_client = cluster.client(follower).await;
    let deadline = Instant::now() + STATEMENT_TIMEOUT;
    while count(&follower_client).await != 20 {
        assert!(Instant::now() < deadline, "the follower did not catch up");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        staged(cluster.data_dir(follower)).len(),
        1,
        "the restarted follower holds the staged copy"
    );
    assert_eq!(finish_raw(&mut w, &data).await, None, "the COPY commits");
    for id in [1, 2, 3] {
        let c = cluster.client(id).await;
        let deadline = Instant::now() + STATEMENT_TIMEOUT;
        loop {
            let rows = text_rows(
                &c,
                "SELECT count(*), count(DISTINCT payload), max(offset) FROM h",
            )
            .await;
            if rows[0][0] == (ROWS + 20).to_string() {
                assert_eq!(rows[0][1], (ROWS + 1).to_string(), "node {id}");
                assert_eq!(rows[0][2], (ROWS + 19).to_string(), "node {id}");
                break;
            }
            assert!(
                Instant::now() < deadline,
                "node {id} has {:?} rows, expected {}",
                rows[0],
                ROWS + 20
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        wait_staged(cluster.data_dir(id), 0, "after the commit").await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rows_that_grow_when_typed_are_cut_again() {
    // a chunk of text may type into many times its size: NULLs and short numbers into
    // bigint take 8 bytes each; 256 KiB of ",,,,,,,\n" is 2 MiB typed, over the 1 MiB a
    // command may carry
    let server = Server::start_with(&[
        "--max-statement-bytes",
        "1048576",
        "--copy-chunk-bytes",
        "262144",
    ])
    .await;
    let client = server.client().await;
    exec(
        &client,
        "CREATE STREAM w (a bigint, b bigint, c bigint, d bigint, e bigint, f bigint, g bigint, \
         h bigint) WITH (compression = 'none')",
    )
    .await;
    let n: u64 = 100_000;
    let mut data = String::new();
    for i in 0..n {
        if i % 100 == 0 {
            data.push_str(&format!("{i},1,2,3,4,5,6,7\n"));
        } else {
            data.push_str(",,,,,,,\n");
        }
    }
    let sink = client
        .copy_in("COPY w FROM STDIN WITH (FORMAT csv)")
        .await
        .expect("COPY FROM");
    futures::pin_mut!(sink);
    // one message of it all: the session cuts it into chunks itself
    sink.send(bytes::Bytes::from(data))
        .await
        .expect("COPY data");
    assert_eq!(sink.finish().await.expect("COPY"), n);
    let rows = text_rows(&client, "SELECT count(*), count(a), sum(a), sum(h) FROM w").await;
    let sum: u64 = (0..n).step_by(100).sum();
    assert_eq!(
        rows[0],
        vec![
            n.to_string(),
            (n / 100).to_string(),
            sum.to_string(),
            (7 * n / 100).to_string()
        ]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_end_marker_ends_a_staged_copy_as_it_ends_a_small_one() {
    // `\.` ends the data, also in a COPY staged in chunks: what follows is not loaded
    let (server, client) = server_with_h(&["--copy-chunk-bytes", CHUNK]).await;
    let mut data = csv_rows(0, ROWS);
    data.push_str("\\.\n");
    data.push_str(&csv_rows(ROWS, ROWS));
    let copied = copy_csv(&client, &data)
        .await
        .expect("COPY with an end marker");
    assert_eq!(copied, ROWS);
    assert_eq!(count(&client).await, ROWS);
    wait_staged(server.data_dir(), 0, "the committed COPY's checkpoint").await;
}

/// Sends `data` in one message as the COPY `sql`, in a transaction block (so it is held
/// whole); the COPY's result, the block rolled back after it.
async fn copy_in_block(
    client: &Client,
    sql: &str,
    data: Vec<u8>,
) -> Result<u64, tokio_postgres::Error> {
    exec(client, "BEGIN").await;
    let copied = async {
        let sink = client.copy_in(sql).await?;
        futures::pin_mut!(sink);
        sink.send(bytes::Bytes::from(data)).await?;
        sink.finish().await
    }
    .await;
    exec(client, "ROLLBACK").await;
    copied
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_copy_held_whole_of_tiny_fields_stays_within_its_memory() {
    // An empty CSV line is a NULL: a byte of text, 50 or more once typed as a ScalarValue. 16 MiB
    // of them, held whole, once held every row's fields and then every typed row (100 MiB
    // of newlines took a release build to a 14 GB peak); a line of 8 million delimiters was
    // 8 million fields. Now rows are typed as they are parsed, a row keeps at most one field
    // more than it may have, and the typed rows of a COPY held whole take at most
    // 4 x --max-copy-bytes.
    let server = Server::start_with(&["--max-copy-bytes", "16777216"]).await;
    let client = server.client().await;
    exec(&client, "CREATE STREAM n (a bigint)").await;
    exec(&client, "CREATE TABLE t (k bigint PRIMARY KEY, v bigint)").await;
    let pid = server.pid().expect("the server runs");
    let newlines = vec![b'\n'; 16 << 20];
    let e = expect_sqlstate(
        copy_in_block(&client, "COPY n FROM STDIN WITH (FORMAT csv)", newlines).await,
        &SqlState::PROGRAM_LIMIT_EXCEEDED,
        "16 MiB of NULL rows into a stream, held whole",
    );
    assert!(format!("{e:?}").contains("once typed"), "{e:?}");
    let e = expect_sqlstate(
        copy_in_block(
            &client,
            "COPY t FROM STDIN WITH (FORMAT csv)",
            b",\n".repeat(8 << 20),
        )
        .await,
        &SqlState::PROGRAM_LIMIT_EXCEEDED,
        "16 MiB of NULL rows into a table",
    );
    assert!(format!("{e:?}").contains("once typed"), "{e:?}");
    let mut one_row = vec![b','; 8 << 20];
    one_row.push(b'\n');
    let e = expect_sqlstate(
        copy_in_block(&client, "COPY n FROM STDIN WITH (FORMAT csv)", one_row).await,
        &SqlState::INVALID_TEXT_REPRESENTATION,
        "a row of 8 million fields into one column",
    );
    assert!(
        format!("{e:?}").contains("extra data after last expected column"),
        "{e:?}"
    );
    // the peak: the data held whole, and what was typed of it before the limit
    let peak = sluice_tests::hostile::monitor::peak_rss(pid).expect("VmHWM");
    assert!(
        peak < 512 << 20,
        "the server's memory peaked at {} MiB",
        peak >> 20
    );
    // a COPY of the same rows outside a block is staged in chunks: every row loads
    let sink = client
        .copy_in("COPY n FROM STDIN WITH (FORMAT csv)")
        .await
        .expect("COPY FROM");
    futures::pin_mut!(sink);
    sink.send(bytes::Bytes::from(vec![b'\n'; 1 << 20]))
        .await
        .expect("COPY data");
    assert_eq!(sink.finish().await.expect("COPY"), 1 << 20);
    let rows = text_rows(&client, "SELECT count(*), count(a) FROM n").await;
    assert_eq!(rows[0], vec![(1u64 << 20).to_string(), "0".to_string()]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_binary_copy_held_whole_of_tiny_rows_stays_within_its_memory() {
    // A binary row of one NULL field is 6 bytes of input. The rows of a binary COPY held
    // whole were all split out first (a vector per row, one for the list: about 64 bytes a
    // row, ten times the input) and only then typed against the budget; now each row is
    // typed as it is split, so the budget (4 x --max-copy-bytes, each row's vector counted)
    // bounds the whole COPY. The old server fails the first check: it reached the cut row
    // at the end (22P02) before typing any row.
    const INPUT: usize = 16 << 20;
    let limit = INPUT.to_string();
    let server = Server::start_with(&["--max-copy-bytes", &limit]).await;
    let client = server.client().await;
    exec(&client, "CREATE STREAM nb (a bigint)").await;
    let pid = server.pid().expect("the server runs");
    let mut data = binary_header();
    let row = [0u8, 1, 0xff, 0xff, 0xff, 0xff];
    while data.len() + row.len() + 7 <= INPUT {
        data.extend_from_slice(&row);
    }
    // the last row is cut short: the old server split every row before typing any, and
    // failed on this (22P02) after taking the memory; now the budget stops it long before
    data.extend_from_slice(&[0, 1, 0, 0, 0, 8, 1]);
    let e = expect_sqlstate(
        copy_in_block(&client, "COPY nb FROM STDIN WITH (FORMAT binary)", data).await,
        &SqlState::PROGRAM_LIMIT_EXCEEDED,
        "16 MiB of one-NULL binary rows, held whole",
    );
    assert!(format!("{e:?}").contains("once typed"), "{e:?}");
    let peak = sluice_tests::hostile::monitor::peak_rss(pid).expect("VmHWM");
    assert!(
        peak < 512 << 20,
        "the server's memory peaked at {} MiB",
        peak >> 20
    );
    // the same rows, fewer of them, load
    let mut small = binary_header();
    for _ in 0..1000 {
        small.extend_from_slice(&row);
    }
    exec(&client, "BEGIN").await;
    let sink = client
        .copy_in("COPY nb FROM STDIN WITH (FORMAT binary)")
        .await
        .expect("COPY FROM");
    futures::pin_mut!(sink);
    sink.send(bytes::Bytes::from(small))
        .await
        .expect("COPY data");
    assert_eq!(sink.finish().await.expect("COPY"), 1000);
    exec(&client, "COMMIT").await;
    let rows = text_rows(&client, "SELECT count(*), count(a) FROM nb").await;
    assert_eq!(rows[0], vec!["1000".to_string(), "0".to_string()]);
}

/// The signature, flags and header extension of a binary COPY payload.
fn binary_header() -> Vec<u8> {
    let mut data = b"PGCOPY\n\xff\r\n\0".to_vec();
    data.extend(0i32.to_be_bytes());
    data.extend(0i32.to_be_bytes());
    data
}
