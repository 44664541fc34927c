//! Hostile and careless clients: statements and messages that used to crash, freeze or fool
//! the server. Each case gets a clean SQLSTATE (or a closed connection for a broken message),
//! and afterwards the server still serves another client and still has every acknowledged
//! row. Each test here failed on the code before the fix that it names.

use std::time::{Duration, Instant};

use sluice_tests::wire::{cstr, error_code, message, Read, Wire};
use sluice_tests::{exec, expect_sqlstate, simple_rows, Server};
use tokio::io::AsyncWriteExt;
use tokio_postgres::error::SqlState;

/// How long a refused statement may take: far below what the old code took (an abort, a
/// frozen thread, minutes of parsing).
const PROMPT: Duration = Duration::from_secs(20);

fn chain(n: usize, term: &str, op: &str) -> String {
    vec![term; n].join(op)
}

/// The server still answers, and still has the rows written before the attack.
async fn still_serving(server: &Server) {
    let client = server.client().await;
    let rows = simple_rows(&client, "SELECT count(*) FROM canary").await;
    assert_eq!(rows[0][0].as_deref(), Some("3"));
}

async fn canary(server: &Server) {
    let client = server.client().await;
    exec(&client, "CREATE STREAM canary (v int)").await;
    exec(&client, "INSERT INTO canary (v) VALUES (1), (2), (3)").await;
}

/// Before: `SELECT 1+1+...` with ~1,800 terms, ~2,000 ANDs, ~600 UNION ALLs or 1,000 chained
/// CTEs overflowed the connection thread's stack and aborted the process.
#[tokio::test]
async fn statements_nested_too_deep_get_54001_and_the_server_lives() {
    let server = Server::start().await;
    canary(&server).await;
    let client = server.client().await;
    let ctes: Vec<String> = (1..=1200)
        .map(|i| format!("c{i} AS (SELECT x FROM c{})", i - 1))
        .collect();
    let deep = [
        format!("SELECT {}", chain(1815, "1", "+")),
        format!("SELECT {}", chain(5000, "true", " AND ")),
        chain(2000, "SELECT 1", " UNION ALL "),
        format!(
            "WITH c0 AS (SELECT 1 AS x), {} SELECT x FROM c1200",
            ctes.join(", ")
        ),
        format!("SELECT {}1{}", "(".repeat(5000), ")".repeat(5000)),
        format!("SELECT {}", chain(20_000, "1", "*")),
    ];
    for sql in &deep {
        let started = Instant::now();
        let result = client.simple_query(sql).await;
        expect_sqlstate(
            result,
            &SqlState::from_code("54001"),
            &sql[..40.min(sql.len())],
        );
        assert!(started.elapsed() < PROMPT, "took {:?}", started.elapsed());
    }
    still_serving(&server).await;
}

/// What PostgreSQL takes, Sluice takes too: hundreds of levels of nesting.
#[tokio::test]
async fn statements_nested_hundreds_deep_run() {
    let server = Server::start().await;
    let client = server.client().await;
    let sql = format!("SELECT {}", chain(200, "1", "+"));
    assert_eq!(
        simple_rows(&client, &sql).await[0][0].as_deref(),
        Some("200")
    );
    let sql = format!("SELECT {}1{}", "(".repeat(900), ")".repeat(900));
    assert_eq!(simple_rows(&client, &sql).await[0][0].as_deref(), Some("1"));
    let sql = format!(
        "SELECT count(*) FROM ({}) AS u",
        chain(600, "SELECT 1", " UNION ALL ")
    );
    assert_eq!(
        simple_rows(&client, &sql).await[0][0].as_deref(),
        Some("600")
    );
    let sql = format!("SELECT {}", chain(900, "true", " AND "));
    assert_eq!(simple_rows(&client, &sql).await[0][0].as_deref(), Some("t"));
}

/// Before: `SELECT ARRAY[ARRAY[...]]` 48 deep spun a connection thread forever (the parser
/// retried each failed level two ways: 2^48 attempts); with an error at the bottom the same
/// happened at any depth past ~25.
#[tokio::test]
async fn nested_array_constructors_never_freeze_the_parser() {
    let server = Server::start().await;
    canary(&server).await;
    let client = server.client().await;
    for (depth, tail) in [(48, "1"), (60, "1"), (40, "1 +"), (45, "1 AS")] {
        let sql = format!(
            "SELECT {}{tail}{}",
            "ARRAY[".repeat(depth),
            "]".repeat(depth)
        );
        let started = Instant::now();
        let result = client.simple_query(&sql).await;
        assert!(result.is_err() || depth <= 60, "{sql}");
        assert!(
            started.elapsed() < PROMPT,
            "depth {depth} took {:?}",
            started.elapsed()
        );
    }
    // a reasonable array still works
    let rows = simple_rows(&client, "SELECT ARRAY[1, 2, 3]").await;
    assert_eq!(rows[0][0].as_deref(), Some("{1,2,3}"));
    still_serving(&server).await;
}

/// Before: integers wrapped, `sum(bigint)` wrapped (to -2 here), float division by zero was
/// Infinity.
#[tokio::test]
async fn arithmetic_overflow_and_division_by_zero_are_errors() {
    let server = Server::start().await;
    let client = server.client().await;
    for sql in [
        "SELECT 9223372036854775807::bigint + 1",
        "SELECT (-9223372036854775807)::bigint - 2",
        "SELECT 2147483647::int + 1::int",
        "SELECT 32767::smallint * 2::smallint",
        "SELECT 4294967296::bigint * 4294967296::bigint",
        "SELECT 1e308::float8 * 10",
    ] {
        expect_sqlstate(
            client.simple_query(sql).await,
            &SqlState::NUMERIC_VALUE_OUT_OF_RANGE,
            sql,
        );
    }
    for sql in ["SELECT 1.0::float8 / 0", "SELECT 1 / 0"] {
        expect_sqlstate(
            client.simple_query(sql).await,
            &SqlState::DIVISION_BY_ZERO,
            sql,
        );
    }
    exec(&client, "CREATE TABLE big (v bigint)").await;
    exec(
        &client,
        "INSERT INTO big VALUES (9223372036854775807), (9223372036854775807)",
    )
    .await;
    expect_sqlstate(
        client.simple_query("SELECT v + 1 FROM big").await,
        &SqlState::NUMERIC_VALUE_OUT_OF_RANGE,
        "stored bigint + 1",
    );
    expect_sqlstate(
        client.simple_query("SELECT sum(v) FROM big").await,
        &SqlState::NUMERIC_VALUE_OUT_OF_RANGE,
        "sum of two bigint maxima",
    );
    let ok = simple_rows(&client, "SELECT 9223372036854775806::bigint + 1").await;
    assert_eq!(ok[0][0].as_deref(), Some("9223372036854775807"));
}

/// Before: invalid UTF-8 was stored as U+FFFD and a NUL cut the query short silently.
#[tokio::test]
async fn invalid_utf8_and_inner_nul_are_refused() {
    let server = Server::start().await;
    canary(&server).await;
    let cases: [(&[u8], &str); 2] = [
        (b"INSERT INTO canary (v) VALUES (4) -- \xff\xfe\0", "22021"),
        (b"SELECT 1\0; DROP STREAM canary\0", "08P01"),
    ];
    for (query, code) in cases {
        let mut wire = Wire::connect(server.port()).await;
        wire.send(&message(b'Q', query)).await;
        match wire.read_message(PROMPT).await {
            Read::Message(b'E', body) => assert_eq!(error_code(&body), code),
            other => panic!("expected an error, got {other:?}"),
        }
        assert_eq!(wire.read_message(PROMPT).await, Read::Closed);
    }
    still_serving(&server).await;
}

/// Before: a logged-in client announcing a 1 GiB message got it buffered as it arrived.
#[tokio::test]
async fn a_message_larger_than_the_limit_is_refused_from_its_header() {
    let server = Server::start_with(&["--max-statement-bytes", "1048576"]).await;
    canary(&server).await;
    let mut wire = Wire::connect(server.port()).await;
    // Only the header: the old server waited for the gigabyte; this one answers at once.
    let header = [b'Q', 0x40, 0, 0, 0];
    wire.socket.write_all(&header).await.expect("send a header");
    match wire.read_message(PROMPT).await {
        Read::Message(b'E', body) => assert_eq!(error_code(&body), "54000"),
        other => panic!("expected 54000, got {other:?}"),
    }
    assert_eq!(wire.read_message(PROMPT).await, Read::Closed);
    still_serving(&server).await;
}

/// Before: pgwire read Bind's counts and lengths unchecked, so a truncated Bind panicked the
/// connection's task. Every truncation of a valid Bind is now a clean 08P01.
#[tokio::test]
async fn truncated_and_lying_bind_messages_are_refused() {
    let server = Server::start().await;
    canary(&server).await;
    let mut parse = cstr("");
    parse.extend(cstr("SELECT $1::int"));
    parse.extend_from_slice(&0i16.to_be_bytes());
    let mut bind = cstr("");
    bind.extend(cstr(""));
    bind.extend_from_slice(&[0, 1, 0, 0]); // one text format
    bind.extend_from_slice(&[0, 1, 0, 0, 0, 1, b'7']); // one parameter "7"
    bind.extend_from_slice(&[0, 0]); // no result formats
    let lies: Vec<Vec<u8>> = (0..bind.len())
        .map(|cut| bind[..cut].to_vec())
        .chain([
            [&bind[..6], &[0x7f, 0xff]].concat(), // 32767 formats
            [&bind[..8], &[0, 1, 0x7f, 0xff, 0xff, 0xff]].concat(), // a 2 GiB parameter
            [&bind[..8], &[0xff, 0xff]].concat(), // -1 parameters
        ])
        .collect();
    for lie in lies {
        let mut wire = Wire::connect(server.port()).await;
        let mut batch = message(b'P', &parse);
        batch.extend(message(b'B', &lie));
        batch.extend(message(b'S', &[]));
        wire.send(&batch).await;
        let mut code = None;
        loop {
            match wire.read_message(PROMPT).await {
                Read::Message(b'E', body) => code = Some(error_code(&body)),
                Read::Message(..) => {}
                Read::Closed => break,
                Read::Quiet => panic!("no answer to a broken Bind"),
            }
        }
        assert_eq!(code.as_deref(), Some("08P01"), "bind {lie:?}");
    }
    still_serving(&server).await;
}

/// Before: deleting a stream's first segment file went unnoticed — the server started and the
/// stream began at the next segment's base offset. Now the start fails and names the file.
#[tokio::test]
async fn a_missing_first_segment_stops_the_start_with_the_file_named() {
    let mut server = Server::start().await;
    let client = server.client().await;
    exec(
        &client,
        "CREATE STREAM s (payload text) WITH (segment_bytes = '4096')",
    )
    .await;
    for _ in 0..20 {
        exec(
            &client,
            &format!(
                "INSERT INTO s (payload) VALUES {}",
                ["(repeat('x', 200))"; 10].join(", ")
            ),
        )
        .await;
    }
    drop(client);
    server.stop().await;
    let mut segments: Vec<std::path::PathBuf> = walk(server.data_dir())
        .into_iter()
        .filter(|p| p.extension().is_some_and(|e| e == "seg"))
        .collect();
    segments.sort();
    assert!(
        segments.len() > 2,
        "the stream rolled segments: {segments:?}"
    );
    std::fs::remove_file(&segments[0]).expect("delete the first segment");
    let output = tokio::time::timeout(
        PROMPT,
        tokio::process::Command::new(sluice_tests::binary_path())
            .args(["serve", "--data-dir"])
            .arg(server.data_dir())
            .args(["--listen", "127.0.0.1:0"])
            .kill_on_drop(true)
            .output(),
    )
    .await
    .expect("the server neither started nor stopped")
    .expect("run sluice");
    let log = String::from_utf8_lossy(&output.stderr).into_owned()
        + &String::from_utf8_lossy(&output.stdout);
    assert!(!output.status.success(), "the server started: {log}");
    assert!(
        log.contains("a segment file before it is missing"),
        "the refusal does not say what is wrong: {log}"
    );
}

fn walk(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = entry.path();
        if path.is_dir() {
            out.extend(walk(&path));
        } else {
            out.push(path);
        }
    }
    out
}
