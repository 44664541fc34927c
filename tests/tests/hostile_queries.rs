//! Hostile and careless statements (issue 20): queries that run without end, take all the
//! memory, build one huge value, overflow a number, or write in a read-only session. Each
//! ends with a clean SQLSTATE — or stops when its client cancels, times out or leaves — and
//! afterwards the same session and other clients are served. Each test failed on the code
//! before the change (its doc comment says how).
//!
//! Whether a query really stopped is read from the server's CPU time (`/proc/<pid>/stat`):
//! after a stop the process is idle again. The stop latencies these tests print are
//! measurements, not assertions (the bounds asserted are hang guards).

use std::time::{Duration, Instant};

use sluice_tests::wire::{bind, cstr, error_code, execute, message, parse, Wire};
use sluice_tests::{
    error_message, exec, expect_sqlstate, simple_rows, sqlstate, text_rows, Server,
};
use tokio_postgres::error::SqlState;
use tokio_postgres::{Client, NoTls, SimpleQueryMessage};

/// A query that computes for hours and returns one row: a cross join of 10^14 rows, counted
/// (the old server counted 10^12 of them in 4.5 minutes on a 2-core VM).
const RUNAWAY: &str = "SELECT count(*) FROM generate_series(1, 1000000) AS a(x), \
                       generate_series(1, 100000000) AS b(y)";

/// A recursive CTE without a bound: it streams rows forever.
const ENDLESS_ROWS: &str =
    "WITH RECURSIVE t(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM t) SELECT n FROM t";

/// Hang guard for one stop (far above what a stop takes; see the printed measurements).
const STOPS_WITHIN: Duration = Duration::from_secs(10);

const QUERY_CANCELED: &str = "57014";

/// The `sluice` process serving `server` (found by its data directory).
fn server_pid(server: &Server) -> u32 {
    let dir = server.data_dir().to_string_lossy().into_owned();
    for entry in std::fs::read_dir("/proc").expect("read /proc") {
        let Ok(entry) = entry else { continue };
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(cmdline) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
            continue;
        };
        let args: Vec<String> = cmdline
            .split(|b| *b == 0)
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect();
        if args.iter().any(|a| a == "serve") && args.contains(&dir) {
            return pid;
        }
    }
    panic!("no sluice process serves {dir}");
}

/// CPU time (user + system) the process has used, in clock ticks (10 ms each on Linux).
fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("read stat");
    // fields after the command name, which is in parentheses
    let rest = &stat[stat.rfind(')').expect("stat format") + 2..];
    let fields: Vec<&str> = rest.split(' ').collect();
    let utime: u64 = fields[11].parse().expect("utime");
    let stime: u64 = fields[12].parse().expect("stime");
    utime + stime
}

/// CPU the server used from `since` (when it had used `ticks_then`) until it went idle —
/// at most 3 ticks (30 ms) of CPU over 300 ms — and when that was. Panics (hang guard)
/// after [`STOPS_WITHIN`]: a query still running keeps a core busy.
async fn stopped_after(pid: u32, since: Instant, ticks_then: u64) -> Stop {
    let mut samples: Vec<(Instant, u64)> = Vec::new();
    loop {
        let now = Instant::now();
        let ticks = cpu_ticks(pid);
        samples.push((now, ticks));
        // the earliest sample followed by 300 ms of (almost) no CPU
        if let Some((at, quiet_from)) = samples.iter().find(|(t, from)| {
            now.duration_since(*t) >= Duration::from_millis(300) && ticks - from <= 3
        }) {
            return Stop {
                after: at.saturating_duration_since(since),
                cpu_ms: (quiet_from - ticks_then) * 10,
            };
        }
        assert!(
            since.elapsed() < STOPS_WITHIN,
            "the server still uses CPU {:?} after the statement should have stopped",
            since.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// When the server's CPU use stopped, and how much CPU it used until then.
struct Stop {
    after: Duration,
    cpu_ms: u64,
}

impl std::fmt::Display for Stop {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "the server used {} ms of CPU after it (clock ticks of 10 ms) and was idle from {:?} on",
            self.cpu_ms, self.after
        )
    }
}

/// Waits until the server is busy (a runaway query is running): 150 ms of CPU used since
/// the call. Panics after [`STOPS_WITHIN`].
async fn busy(pid: u32) {
    let started = Instant::now();
    let before = cpu_ticks(pid);
    while cpu_ticks(pid) - before < 15 {
        assert!(started.elapsed() < STOPS_WITHIN, "the query never started");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Another client is served at once, and sees every row written before.
async fn others_served(server: &Server) {
    let other = server.client().await;
    let started = Instant::now();
    assert_eq!(text_rows(&other, "SELECT 1").await, [["1"]]);
    assert!(started.elapsed() < STOPS_WITHIN);
}

async fn connect_with(server: &Server, options: &str) -> Result<Client, tokio_postgres::Error> {
    let conn = format!("{} options='{options}'", server.conn_string());
    let (client, connection) = tokio::time::timeout(
        Duration::from_secs(10),
        tokio_postgres::connect(&conn, NoTls),
    )
    .await
    .expect("connect in time")?;
    tokio::spawn(async move {
        let _ = connection.await;
    });
    Ok(client)
}

fn code_of(err: &tokio_postgres::Error) -> String {
    sqlstate(err).unwrap_or("(none)").to_string()
}

/// Before: `SET statement_timeout` was stored and ignored — the runaway count ran for hours
/// under both protocols, recursive CTEs too; a startup `-c statement_timeout` likewise.
#[tokio::test(flavor = "multi_thread")]
async fn statement_timeout_stops_planning_and_computing_statements() {
    let server = Server::start().await;
    let pid = server_pid(&server);
    let client = server.client().await;
    exec(&client, "SET statement_timeout = '1s'").await;
    assert_eq!(text_rows(&client, "SHOW statement_timeout").await, [["1s"]]);
    let recursive_count = "WITH RECURSIVE t(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM t) \
                           SELECT count(*) FROM t";
    for sql in [RUNAWAY, recursive_count] {
        let started = Instant::now();
        let err = client.simple_query(sql).await.expect_err("timed out");
        assert_eq!(code_of(&err), QUERY_CANCELED, "{sql}: {err:?}");
        assert_eq!(
            error_message(&err),
            "canceling statement due to statement timeout"
        );
        let answered = Instant::now();
        let stop = stopped_after(pid, answered, cpu_ticks(pid)).await;
        eprintln!(
            "timeout (simple, {}): 57014 after {:?}; then {stop}",
            &sql[..20],
            answered - started
        );

        let started = Instant::now();
        let err = client.query(sql, &[]).await.expect_err("timed out");
        assert_eq!(code_of(&err), QUERY_CANCELED, "extended {sql}: {err:?}");
        let answered = Instant::now();
        let stop = stopped_after(pid, answered, cpu_ticks(pid)).await;
        eprintln!(
            "timeout (extended): 57014 after {:?}; then {stop}",
            answered - started
        );
    }
    // the session goes on; integer milliseconds and 0 as in PostgreSQL
    assert_eq!(text_rows(&client, "SELECT 1").await, [["1"]]);
    exec(&client, "SET statement_timeout = 1500").await;
    assert_eq!(
        text_rows(&client, "SHOW statement_timeout").await,
        [["1500ms"]]
    );
    exec(&client, "SET statement_timeout = 0").await;
    assert_eq!(text_rows(&client, "SHOW statement_timeout").await, [["0"]]);
    expect_sqlstate(
        client.simple_query("SET statement_timeout = 'soon'").await,
        &SqlState::INVALID_PARAMETER_VALUE,
        "a timeout that is not one",
    );
    exec(&client, "RESET statement_timeout").await;
    assert_eq!(text_rows(&client, "SHOW statement_timeout").await, [["0"]]);

    // from the startup packet, as `PGOPTIONS='-c statement_timeout=700ms'` sends it
    let timed = connect_with(&server, "-c statement_timeout=700ms")
        .await
        .expect("connect");
    assert_eq!(
        text_rows(&timed, "SHOW statement_timeout").await,
        [["700ms"]]
    );
    let err = timed.simple_query(RUNAWAY).await.expect_err("timed out");
    assert_eq!(code_of(&err), QUERY_CANCELED);
    let refused = connect_with(&server, "-c statement_timeout=never").await;
    assert_eq!(code_of(&refused.expect_err("refused")), "22023");
    others_served(&server).await;
}

/// Before: a cancel reached a statement only while it was planned; once rows streamed — or
/// the plan computed with no row yet, or a COPY TO ran — it was ignored, and the statement
/// ran on (a recursive CTE forever).
#[tokio::test(flavor = "multi_thread")]
async fn cancel_stops_statements_while_they_compute_and_stream() {
    let server = Server::start().await;
    let pid = server_pid(&server);
    let client = server.client().await;

    // computing, no row yet: simple, extended, COPY TO
    let copy = format!("COPY ({RUNAWAY}) TO STDOUT");
    for (what, sql) in [
        ("simple", RUNAWAY),
        ("extended", RUNAWAY),
        ("copy", copy.as_str()),
    ] {
        let token = client.cancel_token();
        let running = async {
            match what {
                "extended" => client.query(sql, &[]).await.map(|_| ()),
                "copy" => {
                    use futures::StreamExt;
                    let out = client.copy_out(sql).await?;
                    let mut out = std::pin::pin!(out);
                    while let Some(chunk) = out.next().await {
                        chunk?;
                    }
                    Ok(())
                }
                _ => client.simple_query(sql).await.map(|_| ()),
            }
        };
        let cancel = async {
            busy(pid).await;
            let ticks = cpu_ticks(pid);
            let sent = Instant::now();
            token.cancel_query(NoTls).await.expect("send CancelRequest");
            (sent, ticks)
        };
        let (result, (sent, ticks)) =
            tokio::time::timeout(STOPS_WITHIN * 2, async { tokio::join!(running, cancel) })
                .await
                .unwrap_or_else(|_| panic!("{what}: the cancelled statement did not end"));
        let err = result.expect_err("cancelled");
        assert_eq!(code_of(&err), QUERY_CANCELED, "{what}: {err:?}");
        assert_eq!(
            error_message(&err),
            "canceling statement due to user request"
        );
        let answered = sent.elapsed();
        let stop = stopped_after(pid, sent, ticks).await;
        eprintln!("cancel ({what}): 57014 {answered:?} after the CancelRequest was sent; {stop}");
        assert_eq!(
            text_rows(&client, "SELECT 1").await,
            [["1"]],
            "{what}: session usable"
        );
    }

    // streaming rows without end: cancel arrives between rows
    {
        use futures::StreamExt;
        let stream = client.simple_query_raw(ENDLESS_ROWS).await.expect("start");
        let mut stream = std::pin::pin!(stream);
        let mut rows = 0;
        while rows < 1000 {
            if let SimpleQueryMessage::Row(_) = stream.next().await.expect("rows").expect("a row") {
                rows += 1;
            }
        }
        let ticks = cpu_ticks(pid);
        let sent = Instant::now();
        client
            .cancel_token()
            .cancel_query(NoTls)
            .await
            .expect("cancel");
        let err = loop {
            match tokio::time::timeout(STOPS_WITHIN, stream.next()).await {
                Ok(Some(Ok(_))) => continue,
                Ok(Some(Err(e))) => break e,
                Ok(None) => panic!("the endless query ended by itself"),
                Err(_) => panic!("no end within {STOPS_WITHIN:?} of the cancel"),
            }
        };
        assert_eq!(code_of(&err), QUERY_CANCELED, "{err:?}");
        let answered = sent.elapsed();
        let stop = stopped_after(pid, sent, ticks).await;
        eprintln!("cancel while rows streamed: 57014 after {answered:?}; {stop}");
    }
    // ... and the same inside a block: the block is aborted, as in PostgreSQL
    exec(&client, "BEGIN").await;
    let token = client.cancel_token();
    let (result, _) = tokio::join!(client.simple_query(RUNAWAY), async {
        busy(pid).await;
        token.cancel_query(NoTls).await.expect("cancel");
    });
    assert_eq!(code_of(&result.expect_err("cancelled")), QUERY_CANCELED);
    expect_sqlstate(
        client.simple_query("SELECT 1").await,
        &SqlState::IN_FAILED_SQL_TRANSACTION,
        "after a cancel in a block",
    );
    exec(&client, "ROLLBACK").await;
    assert_eq!(text_rows(&client, "SELECT 2").await, [["2"]]);
    others_served(&server).await;
}

/// Before: a tail (`COPY (... WHERE offset > n) TO STDOUT`) ignored `statement_timeout` and
/// ran until cancelled. Sluice applies the timeout to tails as PostgreSQL applies it to any
/// statement; the cancel that always stopped a tail still does.
#[tokio::test(flavor = "multi_thread")]
async fn statement_timeout_ends_a_copy_tail() {
    use futures::StreamExt;
    let server = Server::start().await;
    let client = server.client().await;
    exec(&client, "CREATE STREAM s (v int)").await;
    exec(&client, "INSERT INTO s (v) VALUES (1), (2)").await;
    exec(&client, "SET statement_timeout = '700ms'").await;
    let started = Instant::now();
    let out = client
        .copy_out("COPY (SELECT v FROM s WHERE offset >= 0) TO STDOUT")
        .await
        .expect("the tail starts");
    let mut out = std::pin::pin!(out);
    let mut rows = 0;
    let err = loop {
        match tokio::time::timeout(STOPS_WITHIN, out.next()).await {
            Ok(Some(Ok(_))) => rows += 1,
            Ok(Some(Err(e))) => break e,
            Ok(None) => panic!("the tail ended without an error"),
            Err(_) => panic!("the tail ignored statement_timeout"),
        }
    };
    assert_eq!(rows, 2, "the rows committed before it");
    assert_eq!(code_of(&err), QUERY_CANCELED, "{err:?}");
    assert_eq!(
        error_message(&err),
        "canceling statement due to statement timeout"
    );
    assert!(started.elapsed() >= Duration::from_millis(700));
    exec(&client, "SET statement_timeout = 0").await;
    assert_eq!(text_rows(&client, "SELECT count(*) FROM s").await, [["2"]]);
    others_served(&server).await;
}

/// Before: a client that went away while its query computed left the query running (the
/// connection task waited on the plan, not the socket) — until the plan ended by itself.
#[tokio::test(flavor = "multi_thread")]
async fn a_client_that_disconnects_stops_its_query() {
    let server = Server::start().await;
    let pid = server_pid(&server);
    // simple protocol, then extended (Parse/Bind/Execute/Sync), then a COPY TO
    let extended = [parse(RUNAWAY), bind(), execute(), message(b'S', &[])].concat();
    let copy = message(b'Q', &cstr(&format!("COPY ({RUNAWAY}) TO STDOUT")));
    for (what, bytes) in [
        ("simple", message(b'Q', &cstr(RUNAWAY))),
        ("extended", extended),
        ("copy", copy),
    ] {
        let mut wire = Wire::connect(server.port()).await;
        wire.send(&bytes).await;
        busy(pid).await;
        let ticks = cpu_ticks(pid);
        drop(wire);
        let gone = Instant::now();
        let stop = stopped_after(pid, gone, ticks).await;
        eprintln!("disconnect ({what}): after the client closed its socket, {stop}");
        others_served(&server).await;
    }
}

/// Before: there was no memory limit: `count(DISTINCT ...)` over a cross join grew its hash
/// set without bound (11 GB reported), and `SET max_statement_memory` was stored and ignored.
#[tokio::test(flavor = "multi_thread")]
async fn count_distinct_over_a_cross_join_meets_the_memory_limit() {
    let server = Server::start().await;
    let client = server.client().await;
    let distinct = "SELECT count(DISTINCT a * 3000 + b) \
                    FROM generate_series(1, 3000) AS x(a), generate_series(1, 3000) AS y(b)";
    exec(&client, "SET max_statement_memory = '32MB'").await;
    assert_eq!(
        text_rows(&client, "SHOW max_statement_memory").await,
        [["32MB"]]
    );
    let err = client
        .simple_query(distinct)
        .await
        .expect_err("out of memory");
    assert_eq!(code_of(&err), "53200", "{err:?}");
    let msg = error_message(&err);
    assert!(
        msg.starts_with("out of memory") && msg.contains("max_statement_memory (32MB)"),
        "{msg}"
    );
    // the extended protocol meets the same limit; a smaller count fits
    let err = client
        .query(distinct, &[])
        .await
        .expect_err("out of memory");
    assert_eq!(code_of(&err), "53200");
    let small = "SELECT count(DISTINCT a * 1000 + b) \
                 FROM generate_series(1, 300) AS x(a), generate_series(1, 300) AS y(b)";
    assert_eq!(text_rows(&client, small).await, [["90000"]]);
    // a sort spills to disk instead of failing
    let sorted = "SELECT max(r) FROM (SELECT row_number() OVER (ORDER BY md5(v::text)) AS r \
                  FROM generate_series(1, 1000000) AS t(v)) AS s";
    assert_eq!(text_rows(&client, sorted).await, [["1000000"]]);
    // a session may lower its limit, not raise it beyond the server's
    expect_sqlstate(
        client
            .simple_query("SET max_statement_memory = '100TB'")
            .await,
        &SqlState::INVALID_PARAMETER_VALUE,
        "above the server's limit",
    );
    exec(&client, "RESET max_statement_memory").await;
    assert_ne!(
        text_rows(&client, "SHOW max_statement_memory").await,
        [["32MB"]]
    );
    others_served(&server).await;
}

/// Before: `statement_timeout` and `max_statement_memory` had no server flags (every session
/// started with no timeout and a quarter of memory), and each session's limit held on its
/// own: many sessions could together hold many times a statement's limit. Now the flags set
/// every session's defaults, `--max-query-memory` bounds all statements together, and a
/// cursor whose plan failed gives its memory back at once.
#[tokio::test(flavor = "multi_thread")]
async fn server_flags_bound_every_session_and_all_statements_together() {
    let server = Server::start_with(&[
        "--statement-timeout",
        "2s",
        "--max-statement-memory",
        "48MB",
        "--max-query-memory",
        "64MB",
    ])
    .await;
    let a = server.client().await;
    let b = server.client().await;
    assert_eq!(text_rows(&a, "SHOW statement_timeout").await, [["2s"]]);
    assert_eq!(text_rows(&a, "SHOW max_statement_memory").await, [["48MB"]]);
    let err = a.simple_query(RUNAWAY).await.expect_err("timed out");
    assert_eq!(code_of(&err), QUERY_CANCELED, "{err:?}");
    exec(&a, "SET statement_timeout = 0").await;
    exec(&a, "RESET statement_timeout").await;
    assert_eq!(text_rows(&a, "SHOW statement_timeout").await, [["2s"]]);
    expect_sqlstate(
        a.simple_query("SET max_statement_memory = '64MB'").await,
        &SqlState::INVALID_PARAMETER_VALUE,
        "above the server's limit",
    );

    // a hash join whose build side fits one statement (~32 MB over two partitions)
    let join = |n: u32, what: &str| {
        format!(
            "SELECT {what} FROM (SELECT v, md5(v::text) AS m FROM generate_series(1, {n}) AS t(v)) a \
             JOIN generate_series(1, 3000000) AS b(v) ON a.v = b.v"
        )
    };
    let count = join(250_000, "count(a.m)");
    assert_eq!(text_rows(&b, &count).await, [["250000"]]);
    // an open cursor keeps its build side; the same join beside it passes the total
    exec(&a, "BEGIN").await;
    exec(
        &a,
        &format!("DECLARE c CURSOR FOR {}", join(250_000, "a.m, b.v")),
    )
    .await;
    assert_eq!(simple_rows(&a, "FETCH 1 FROM c").await.len(), 1);
    let err = b.simple_query(&count).await.expect_err("over the total");
    assert_eq!(code_of(&err), "53200", "{err:?}");
    let msg = error_message(&err);
    assert!(msg.contains("max_query_memory (64MB)"), "{msg}");
    exec(&a, "COMMIT").await;
    assert_eq!(text_rows(&b, &count).await, [["250000"]]);

    // a cursor whose plan fails (over the statement's own limit) frees what it held, though
    // its block stays aborted until ROLLBACK
    exec(&a, "BEGIN").await;
    exec(
        &a,
        &format!("DECLARE d CURSOR FOR {}", join(600_000, "a.m, b.v")),
    )
    .await;
    let err = a.simple_query("FETCH 1 FROM d").await.expect_err("over");
    assert!(
        error_message(&err).contains("max_statement_memory (48MB)"),
        "{err:?}"
    );
    assert_eq!(text_rows(&b, &count).await, [["250000"]]);
    exec(&a, "ROLLBACK").await;
    others_served(&server).await;
}

/// Before: statements were parsed on the connection thread (one on a 2-core machine), so
/// while a 7 MB statement was parsed (5 s in a debug build) no other client was answered:
/// a `SELECT 1` sent during it came back after it. Now long statements are parsed on a
/// blocking thread and the `SELECT 1` comes back first.
#[tokio::test(flavor = "multi_thread")]
async fn a_long_statement_does_not_hold_up_other_clients_while_it_is_parsed() {
    let server = Server::start().await;
    let long = server.client().await;
    let other = server.client().await;
    // a million-element IN list whose syntax error is at its very end: all parse, no plan
    let mut sql = String::from("SELECT 1 WHERE 1 IN (0");
    for i in 1..1_000_000 {
        sql.push(',');
        sql.push_str(&i.to_string());
    }
    sql.push_str(")) oops");
    let (done_tx, mut done_rx) = tokio::sync::mpsc::unbounded_channel();
    let long_done = done_tx.clone();
    let parsing = tokio::spawn(async move {
        let r = long.simple_query(&sql).await;
        let _ = long_done.send("long");
        r
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    let select = tokio::spawn(async move {
        let r = other.simple_query("SELECT 1").await;
        let _ = done_tx.send("select");
        r
    });
    let first = tokio::time::timeout(STOPS_WITHIN * 6, done_rx.recv())
        .await
        .expect("an answer")
        .expect("a sender");
    let err = parsing.await.expect("join").expect_err("a syntax error");
    assert_eq!(code_of(&err), "42601", "{err:?}");
    select.await.expect("join").expect("SELECT 1");
    assert_eq!(
        first, "select",
        "SELECT 1 waited for the long statement's parse"
    );
}

/// Before: a statement short in bytes but deep in structure (900 chained CTEs, 26 KB) was
/// planned on the connection thread — one on a 2-core machine — for about a second, and
/// every other client of that thread, writers included, waited: an INSERT sent while the
/// statement was prepared (Parse and Describe plan it) was acknowledged after it (checked
/// against the old binary). Now a big statement is planned on the query runtime and the
/// INSERT comes back first.
#[tokio::test(flavor = "multi_thread")]
async fn a_deep_statement_is_planned_without_holding_up_writers() {
    let server = Server::start().await;
    let deep = server.client().await;
    let writer = server.client().await;
    exec(&writer, "CREATE STREAM beside_deep (v int)").await;
    let ctes: Vec<String> = (1..=900)
        .map(|i| format!("c{i} AS (SELECT x FROM c{})", i - 1))
        .collect();
    let sql = format!(
        "WITH c0 AS (SELECT 1 AS x), {} SELECT x FROM c900",
        ctes.join(", ")
    );
    let (done_tx, mut done_rx) = tokio::sync::mpsc::unbounded_channel();
    let deep_done = done_tx.clone();
    let planning = tokio::spawn(async move {
        let r = deep.prepare(&sql).await.map(|s| s.columns().len());
        let _ = deep_done.send("deep");
        r
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    let insert = tokio::spawn(async move {
        let r = writer
            .simple_query("INSERT INTO beside_deep (v) VALUES (1)")
            .await;
        let _ = done_tx.send("insert");
        r
    });
    let first = tokio::time::timeout(STOPS_WITHIN * 6, done_rx.recv())
        .await
        .expect("an answer")
        .expect("a sender");
    let columns = planning
        .await
        .expect("join")
        .expect("the deep statement plans");
    assert_eq!(columns, 1);
    insert.await.expect("join").expect("INSERT");
    assert_eq!(
        first, "insert",
        "the INSERT waited for the deep statement's plan"
    );
}

/// Before: parsing and planning a long statement took memory no limit counted — a 4 MB
/// `VALUES` list took the server to 1.4 GB whatever `max_statement_memory` said. Now
/// parsing a statement over 64 KiB reserves 256 bytes per byte of it, and planning a big
/// statement 4 KiB per expression, from the statement's limits: past them it is `53200`,
/// and what fits still runs.
#[tokio::test(flavor = "multi_thread")]
async fn parsing_and_planning_a_long_statement_count_against_its_memory_limit() {
    let server = Server::start_with(&[
        "--max-statement-memory",
        "64MB",
        "--max-query-memory",
        "128MB",
    ])
    .await;
    let client = server.client().await;
    let values = |n: usize| {
        let rows: Vec<String> = (0..n).map(|i| format!("({})", 100_000 + i)).collect();
        format!("SELECT count(*) FROM (VALUES {}) AS t(a)", rows.join(","))
    };
    // ~900 KB: parsing it would need ~230 MB
    let err = client
        .simple_query(&values(100_000))
        .await
        .expect_err("over the statement's memory");
    assert_eq!(code_of(&err), "53200", "{err:?}");
    assert!(
        error_message(&err).contains("parsing a statement"),
        "{err:?}"
    );
    // ~55 KB, parsed in place; planning its 6,000 rows takes ~24 MB: fits in 64MB
    let fits = values(6_000);
    assert!(fits.len() < 64 << 10);
    assert_eq!(text_rows(&client, &fits).await, [["6000"]]);
    // and not in 16MB
    exec(&client, "SET max_statement_memory = '16MB'").await;
    let err = client
        .simple_query(&fits)
        .await
        .expect_err("over the lowered limit");
    assert_eq!(code_of(&err), "53200", "{err:?}");
    assert!(
        error_message(&err).contains("planning a statement"),
        "{err:?}"
    );
    others_served(&server).await;
}

/// Before: a text parameter or COPY data that was not UTF-8 was refused with `22P02`;
/// PostgreSQL says `22021` (invalid byte sequence), and so does the server now.
#[tokio::test(flavor = "multi_thread")]
async fn bytes_that_are_not_utf8_are_refused_as_postgres_refuses_them() {
    let server = Server::start().await;
    exec(&server.client().await, "CREATE STREAM raw_text (v text)").await;
    let mut wire = Wire::connect(server.port()).await;
    let error_of = |answers: &[(u8, Vec<u8>)]| {
        answers
            .iter()
            .find(|(tag, _)| *tag == b'E')
            .map(|(_, body)| error_code(body))
    };
    // Parse "SELECT $1::text" (the parameter typed text), Bind one text value 0xff
    let mut p = cstr("");
    p.extend(cstr("SELECT $1::text"));
    p.extend(1i16.to_be_bytes());
    p.extend(25i32.to_be_bytes());
    let mut b = cstr("");
    b.extend(cstr(""));
    b.extend(0i16.to_be_bytes());
    b.extend(1i16.to_be_bytes());
    b.extend(1i32.to_be_bytes());
    b.push(0xff);
    b.extend(0i16.to_be_bytes());
    for m in [
        message(b'P', &p),
        message(b'B', &b),
        execute(),
        message(b'S', &[]),
    ] {
        wire.send(&m).await;
    }
    let answers = until_ready(&mut wire).await;
    assert_eq!(error_of(&answers).as_deref(), Some("22021"), "{answers:?}");
    // COPY text data
    wire.send(&message(b'Q', &cstr("COPY raw_text FROM STDIN")))
        .await;
    let (tag, _) = wire.next(STOPS_WITHIN).await.expect("CopyInResponse");
    assert_eq!(tag, b'G');
    wire.send(&message(b'd', b"ok\n\xff\xfe\n")).await;
    wire.send(&message(b'c', &[])).await;
    let answers = until_ready(&mut wire).await;
    assert_eq!(error_of(&answers).as_deref(), Some("22021"), "{answers:?}");
    // the session goes on, and nothing of the refused COPY was written
    let client = server.client().await;
    assert_eq!(
        text_rows(&client, "SELECT count(*) FROM raw_text").await,
        [["0"]]
    );
}

/// Every message up to and including ReadyForQuery.
async fn until_ready(wire: &mut Wire) -> Vec<(u8, Vec<u8>)> {
    let mut out = Vec::new();
    loop {
        let m = wire.next(STOPS_WITHIN).await.expect("an answer");
        let done = m.0 == b'Z';
        out.push(m);
        if done {
            return out;
        }
    }
}

/// Before: `repeat('x', 2147483647)` built a 2 GB string and `lpad` with the same length
/// more (6 GB reported): no function bounded its result.
#[tokio::test(flavor = "multi_thread")]
async fn functions_refuse_huge_results_before_building_them() {
    let server = Server::start().await;
    let client = server.client().await;
    for sql in [
        "SELECT length(repeat('x', 2147483647))",
        "SELECT length(lpad('x', 2147483647))",
        "SELECT length(rpad('x', 2147483647, 'ab'))",
        "SELECT length(replace(repeat('x', 100000), 'x', repeat('y', 100000)))",
        "SELECT cardinality(array_repeat(1, 2000000000))",
        "SELECT cardinality(range(1, 3000000000))",
    ] {
        let err = client.simple_query(sql).await.expect_err(sql);
        assert_eq!(code_of(&err), "54000", "{sql}: {err:?}");
        assert_eq!(error_message(&err), "requested length too large", "{sql}");
    }
    // the largest value follows the session's memory limit when that is lower than 1 GB
    exec(&client, "SET max_statement_memory = '64MB'").await;
    expect_sqlstate(
        client
            .simple_query("SELECT length(repeat('x', 100000000))")
            .await,
        &SqlState::PROGRAM_LIMIT_EXCEEDED,
        "100 MB under a 64 MB limit",
    );
    // values that fit, together beyond the limit: out of memory
    expect_sqlstate(
        client
            .simple_query("SELECT repeat(v::text, 10000000) FROM generate_series(1, 20) AS t(v)")
            .await,
        &SqlState::OUT_OF_MEMORY,
        "20 values of 10 MB under a 64 MB limit",
    );
    let rows = simple_rows(
        &client,
        "SELECT lpad('ab', 5, 'x'), repeat('ab', 3), length(repeat('x', 1000000))",
    )
    .await;
    assert_eq!(
        rows,
        [[
            Some("xxxab".into()),
            Some("ababab".into()),
            Some("1000000".into())
        ]]
    );
    others_served(&server).await;
}

/// Before: `10::numeric ^ 1000` was `Infinity`, `exp(1000)` `Infinity`, `ln(0)` `-Infinity`,
/// `sqrt(-1)` a 22000, a float modulo zero `NaN`, `asin(2)` `NaN`.
#[tokio::test(flavor = "multi_thread")]
async fn numeric_overflow_and_domain_errors_are_postgres_errors() {
    let server = Server::start().await;
    let client = server.client().await;
    exec(&client, "CREATE STREAM nums (v float8, n numeric)").await;
    exec(
        &client,
        "INSERT INTO nums (v, n) VALUES (10, 10), (0, 0), (-8, -8)",
    )
    .await;
    for (sql, code) in [
        ("SELECT 10::numeric ^ 1000", "22003"),
        ("SELECT power(10::float8, 1000)", "22003"),
        ("SELECT n ^ 1000 FROM nums WHERE v = 10", "22003"),
        ("SELECT exp(1000::float8)", "22003"),
        ("SELECT exp(v * 100) FROM nums", "22003"),
        ("SELECT exp(-1000::float8)", "22003"),
        ("SELECT 1.0 / 0.0", "22012"),
        ("SELECT 1.0::numeric / 0.0::numeric", "22012"),
        ("SELECT n / 0 FROM nums", "22012"),
        ("SELECT 5.5::float8 % 0", "22012"),
        ("SELECT ln(0::float8)", "2201E"),
        ("SELECT ln(v) FROM nums", "2201E"),
        ("SELECT log(-1::float8)", "2201E"),
        ("SELECT sqrt(-1::float8)", "2201F"),
        ("SELECT power(v, 0.5) FROM nums", "2201F"),
        ("SELECT power(0::float8, -1)", "2201F"),
        ("SELECT asin(2::float8)", "22003"),
    ] {
        let err = client.simple_query(sql).await.expect_err(sql);
        assert_eq!(code_of(&err), code, "{sql}: {err:?}");
    }
    let rows = simple_rows(
        &client,
        "SELECT 2::numeric ^ 10, 'Infinity'::float8 * 2, sqrt(16::float8), atanh(1::float8), ln(1::float8)",
    )
    .await;
    assert_eq!(
        rows,
        [["1024", "Infinity", "4", "Infinity", "0"].map(|v| Some(v.to_string()))]
    );
    others_served(&server).await;
}

/// Before: `SET default_transaction_read_only = on` (or as a startup option) was stored and
/// ignored: every write went through, and `SHOW transaction_read_only` said `off`; `SET
/// TRANSACTION READ ONLY` and `SET SESSION CHARACTERISTICS AS TRANSACTION READ ONLY` were
/// accepted and did nothing.
#[tokio::test(flavor = "multi_thread")]
async fn read_only_sessions_and_transactions_refuse_every_write() {
    let server = Server::start().await;
    let setup = server.client().await;
    exec(&setup, "CREATE STREAM s (v int)").await;
    exec(&setup, "CREATE TABLE t (k int PRIMARY KEY, v int)").await;
    exec(&setup, "INSERT INTO t VALUES (1, 1)").await;

    let client = server.client().await;
    exec(&client, "SET default_transaction_read_only = on").await;
    assert_eq!(
        text_rows(&client, "SHOW transaction_read_only").await,
        [["on"]]
    );
    assert_eq!(
        text_rows(&client, "SHOW default_transaction_read_only").await,
        [["on"]]
    );
    let writes = [
        "INSERT INTO s (v) VALUES (1)",
        "INSERT INTO t VALUES (2, 2)",
        "UPDATE t SET v = 3",
        "DELETE FROM t WHERE k = 1",
        "DELETE FROM s WHERE offset < 1",
        "INSERT INTO s (v) SELECT 1",
        "CREATE STREAM s2 (v int)",
        "CREATE TABLE t2 (k int PRIMARY KEY)",
        "DROP STREAM s",
        "DROP TABLE t",
        "INSERT INTO consumer_offsets VALUES ('c', 's', 1) \
         ON CONFLICT (consumer, stream) DO UPDATE SET \"offset\" = excluded.\"offset\"",
        "ALTER CLUSTER ADD NODE 2 '127.0.0.1:1'",
    ];
    for sql in writes {
        let err = client.simple_query(sql).await.expect_err(sql);
        assert_eq!(code_of(&err), "25006", "{sql}: {err:?}");
    }
    let err = client
        .query("INSERT INTO s (v) VALUES ($1)", &[&1i32])
        .await
        .expect_err("extended");
    assert_eq!(code_of(&err), "25006");
    expect_sqlstate(
        client.simple_query("COPY s (v) FROM STDIN").await,
        &SqlState::READ_ONLY_SQL_TRANSACTION,
        "COPY FROM",
    );
    // reads work; a block is read-only by default, BEGIN READ WRITE overrides
    assert_eq!(text_rows(&client, "SELECT count(*) FROM t").await, [["1"]]);
    exec(&client, "BEGIN").await;
    assert_eq!(
        text_rows(&client, "SHOW transaction_read_only").await,
        [["on"]]
    );
    expect_sqlstate(
        client.simple_query(writes[0]).await,
        &SqlState::READ_ONLY_SQL_TRANSACTION,
        "in a block",
    );
    exec(&client, "ROLLBACK").await;
    exec(&client, "BEGIN READ WRITE").await;
    assert_eq!(
        text_rows(&client, "SHOW transaction_read_only").await,
        [["off"]]
    );
    exec(&client, "INSERT INTO s (v) VALUES (10)").await;
    exec(&client, "COMMIT").await;
    // the default back off; SET TRANSACTION READ ONLY for one block
    exec(&client, "SET default_transaction_read_only = off").await;
    exec(&client, "INSERT INTO s (v) VALUES (11)").await;
    exec(&client, "BEGIN").await;
    exec(&client, "SET TRANSACTION READ ONLY").await;
    assert_eq!(
        text_rows(&client, "SHOW transaction_read_only").await,
        [["on"]]
    );
    expect_sqlstate(
        client.simple_query("UPDATE t SET v = 5").await,
        &SqlState::READ_ONLY_SQL_TRANSACTION,
        "SET TRANSACTION READ ONLY",
    );
    exec(&client, "ROLLBACK").await;
    assert_eq!(
        text_rows(&client, "SHOW transaction_read_only").await,
        [["off"]]
    );
    // once a read-only block has run a query it cannot turn read-write
    exec(&client, "BEGIN READ ONLY").await;
    assert_eq!(text_rows(&client, "SELECT 1").await, [["1"]]);
    expect_sqlstate(
        client.simple_query("SET TRANSACTION READ WRITE").await,
        &SqlState::ACTIVE_SQL_TRANSACTION,
        "read-write after a query",
    );
    exec(&client, "ROLLBACK").await;
    // SET SESSION CHARACTERISTICS is the session default
    exec(
        &client,
        "SET SESSION CHARACTERISTICS AS TRANSACTION READ ONLY",
    )
    .await;
    assert_eq!(
        text_rows(&client, "SHOW default_transaction_read_only").await,
        [["on"]]
    );
    expect_sqlstate(
        client.simple_query(writes[0]).await,
        &SqlState::READ_ONLY_SQL_TRANSACTION,
        "session characteristics",
    );
    exec(&client, "RESET ALL").await;
    exec(&client, "INSERT INTO s (v) VALUES (12)").await;

    // from the startup packet
    let ro = connect_with(&server, "-c default_transaction_read_only=on")
        .await
        .expect("connect");
    assert_eq!(text_rows(&ro, "SHOW transaction_read_only").await, [["on"]]);
    expect_sqlstate(
        ro.simple_query(writes[0]).await,
        &SqlState::READ_ONLY_SQL_TRANSACTION,
        "startup option",
    );
    // other sessions write as before; nothing refused was written
    exec(&setup, "INSERT INTO s (v) VALUES (13)").await;
    assert_eq!(
        text_rows(&setup, "SELECT v FROM s ORDER BY offset").await,
        [["10"], ["11"], ["12"], ["13"]]
    );
    assert_eq!(text_rows(&setup, "SELECT k, v FROM t").await, [["1", "1"]]);
}
