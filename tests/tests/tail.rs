//! Tailing a stream with tokio-postgres: `COPY (SELECT ... WHERE offset > n)
//! TO STDOUT`, cursors (`DECLARE` / `FETCH`), row-limited portals, and
//! `LISTEN` / `NOTIFY`. The consistency test runs all four tails at once
//! against concurrent writers (some rolling back) and demands that they
//! deliver exactly the committed rows, gapless and in offset order.

use std::collections::{BTreeMap, BTreeSet};
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::{Stream, StreamExt};
use sluice_tests::{
    error_message, exec, expect_sqlstate, sqlstate, text_rows, within, Server, STATEMENT_TIMEOUT,
};
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_postgres::binary_copy::BinaryCopyOutStream;
use tokio_postgres::error::SqlState;
use tokio_postgres::types::Type;
use tokio_postgres::{AsyncMessage, Client, NoTls, Notification};

/// How long one expected row or notification may take to arrive.
const ARRIVAL: Duration = Duration::from_secs(10);
/// How long we watch for something that must not arrive.
const QUIET: Duration = Duration::from_millis(700);

/// `CREATE STREAM name (v text)` and `rows` single-row INSERTs `r0`, `r1`...
/// (one statement each, so the rows land in separate commits).
async fn stream_with_rows(client: &Client, name: &str, rows: usize) {
    exec(client, &format!("CREATE STREAM {name} (v text)")).await;
    for i in 0..rows {
        exec(client, &format!("INSERT INTO {name} VALUES ('r{i}')")).await;
    }
}

/// Inserts `('r{i}')` for each i, one statement each; returns the offsets.
async fn insert_rows(client: &Client, name: &str, range: std::ops::Range<usize>) -> Vec<i64> {
    let mut offsets = Vec::new();
    for i in range {
        let sql = format!("INSERT INTO {name} VALUES ('r{i}') RETURNING offset");
        let rows = text_rows(client, &sql).await;
        offsets.push(rows[0][0].parse().expect("offset is an integer"));
    }
    offsets
}

/// `(offset, v)` pairs `(i, "r{i}")` for i in `range`, as text.
fn expected_pairs(range: std::ops::Range<usize>) -> Vec<Vec<String>> {
    range
        .map(|i| vec![i.to_string(), format!("r{i}")])
        .collect()
}

// ---------------------------------------------------------------------------
// COPY (...) TO STDOUT

/// The lines of a text or csv COPY-out, as they arrive.
struct CopyLines {
    stream: Pin<Box<dyn Stream<Item = Result<Bytes, tokio_postgres::Error>> + Send>>,
    buf: Vec<u8>,
    ended: bool,
}

impl CopyLines {
    async fn start(client: &Client, sql: &str) -> CopyLines {
        let stream = within(STATEMENT_TIMEOUT, sql, client.copy_out(sql))
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e:?}"));
        CopyLines {
            stream: Box::pin(stream),
            buf: Vec::new(),
            ended: false,
        }
    }

    /// The next line; `Ok(None)` when the COPY completed. Cancel-safe.
    async fn next(&mut self) -> Result<Option<String>, tokio_postgres::Error> {
        loop {
            if let Some(nl) = self.buf.iter().position(|&b| b == b'\n') {
                let line: Vec<u8> = self.buf.drain(..=nl).collect();
                let text = String::from_utf8(line[..nl].to_vec()).expect("COPY text is utf-8");
                return Ok(Some(text));
            }
            if self.ended {
                assert!(
                    self.buf.is_empty(),
                    "COPY ended inside a line: {:?}",
                    String::from_utf8_lossy(&self.buf)
                );
                return Ok(None);
            }
            match self.stream.next().await {
                Some(Ok(chunk)) => self.buf.extend_from_slice(&chunk),
                Some(Err(e)) => {
                    self.ended = true;
                    return Err(e);
                }
                None => self.ended = true,
            }
        }
    }

    /// The next line within [`ARRIVAL`]; panics on errors and on the end.
    async fn expect_line(&mut self, what: &str) -> String {
        match within(ARRIVAL, what, self.next()).await {
            Ok(Some(line)) => line,
            Ok(None) => panic!("{what}: the COPY ended"),
            Err(e) => panic!("{what}: COPY failed: {e:?}"),
        }
    }

    /// Asserts nothing arrives for [`QUIET`] (the tail is waiting).
    async fn expect_quiet(&mut self, what: &str) {
        if let Ok(out) = tokio::time::timeout(QUIET, self.next()).await {
            panic!("{what}: expected the tail to wait, got {out:?}");
        }
    }

    /// The outcome after the last line: `Ok(())` for CommandComplete.
    async fn finish(&mut self, what: &str) -> Result<(), tokio_postgres::Error> {
        match within(ARRIVAL, what, self.next()).await {
            Ok(None) => Ok(()),
            Ok(Some(line)) => panic!("{what}: expected the end of the COPY, got line {line:?}"),
            Err(e) => Err(e),
        }
    }
}

fn split_tabs(line: &str) -> Vec<String> {
    line.split('\t').map(str::to_string).collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn copy_tail_streams_existing_then_new_rows_until_limit() {
    let server = Server::start().await;
    let reader = server.client().await;
    let writer = server.client().await;
    stream_with_rows(&writer, "s", 4).await;

    // offset > 1 with LIMIT 6: the two rows after 1 exist, four are to come.
    let sql = "COPY (SELECT offset, v FROM s WHERE offset > 1 LIMIT 6) TO STDOUT";
    let mut copy = CopyLines::start(&reader, sql).await;
    let mut got = Vec::new();
    for _ in 0..2 {
        got.push(split_tabs(&copy.expect_line("an existing row").await));
    }
    assert_eq!(got, expected_pairs(2..4), "committed rows after offset 1");
    copy.expect_quiet("no rows after the committed ones").await;

    for i in 4..8 {
        let offsets = insert_rows(&writer, "s", i..i + 1).await;
        assert_eq!(offsets, [i as i64]);
        let line = copy.expect_line(&format!("row {i} after its INSERT")).await;
        assert_eq!(
            split_tabs(&line),
            [i.to_string(), format!("r{i}")],
            "row {i}"
        );
    }
    copy.finish("COPY after LIMIT 6 rows")
        .await
        .expect("LIMIT ends the COPY with CommandComplete");

    // Rows past the LIMIT were not sent, and the connection is ready.
    insert_rows(&writer, "s", 8..9).await;
    assert_eq!(text_rows(&reader, "SELECT 1").await, [["1"]]);
}

#[tokio::test(flavor = "multi_thread")]
async fn copy_tail_in_csv_format() {
    let server = Server::start().await;
    let reader = server.client().await;
    let writer = Arc::new(server.client().await);
    stream_with_rows(&writer, "s", 2).await;
    exec(&writer, "INSERT INTO s VALUES ('with, comma'), (NULL)").await;

    let sql =
        "COPY (SELECT offset, v FROM s WHERE offset >= 1 LIMIT 4) TO STDOUT WITH (FORMAT csv)";
    let mut copy = CopyLines::start(&reader, sql).await;
    let mut lines = Vec::new();
    for _ in 0..3 {
        lines.push(copy.expect_line("existing csv row").await);
    }
    insert_rows(&writer, "s", 4..5).await;
    lines.push(copy.expect_line("new csv row").await);
    copy.finish("csv COPY after LIMIT 4")
        .await
        .expect("LIMIT ends the csv COPY");
    assert_eq!(lines, ["1,r1", "2,\"with, comma\"", "3,", "4,r4"]);
}

/// tokio-postgres's `BinaryCopyOutStream` (like PostgreSQL itself) expects
/// the binary header in the same CopyData message as the first row.
#[tokio::test(flavor = "multi_thread")]
async fn copy_tail_in_binary_format() {
    let server = Server::start().await;
    let reader = server.client().await;
    let writer = Arc::new(server.client().await);
    stream_with_rows(&writer, "s", 5).await;

    let sql =
        "COPY (SELECT offset, v FROM s WHERE offset > 3 LIMIT 3) TO STDOUT WITH (FORMAT binary)";
    let stream = within(STATEMENT_TIMEOUT, sql, reader.copy_out(sql))
        .await
        .expect("start binary COPY tail");
    let rows = BinaryCopyOutStream::new(stream, &[Type::INT8, Type::TEXT]);
    let inserter = {
        let writer = writer.clone();
        tokio::spawn(async move { insert_rows(&writer, "s", 5..7).await })
    };
    let rows: Vec<_> = within(
        ARRIVAL * 2,
        "binary COPY tail with LIMIT 3",
        rows.collect::<Vec<_>>(),
    )
    .await
    .into_iter()
    .map(|r| {
        let row = r.expect("binary COPY row");
        (row.get::<i64>(0), row.get::<Option<String>>(1))
    })
    .collect();
    assert_eq!(inserter.await.expect("inserter task"), [5, 6]);
    assert_eq!(
        rows,
        [
            (4, Some("r4".into())),
            (5, Some("r5".into())),
            (6, Some("r6".into()))
        ]
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn cancel_ends_a_copy_tail_and_the_connection_stays_usable() {
    let server = Server::start().await;
    let reader = server.client().await;
    let writer = server.client().await;
    stream_with_rows(&writer, "s", 3).await;

    let mut copy = CopyLines::start(
        &reader,
        "COPY (SELECT offset, v FROM s WHERE offset > 0) TO STDOUT",
    )
    .await;
    for expected in expected_pairs(1..3) {
        assert_eq!(
            split_tabs(&copy.expect_line("existing row").await),
            expected
        );
    }
    insert_rows(&writer, "s", 3..4).await;
    assert_eq!(split_tabs(&copy.expect_line("new row").await), ["3", "r3"]);

    within(
        STATEMENT_TIMEOUT,
        "send CancelRequest",
        reader.cancel_token().cancel_query(NoTls),
    )
    .await
    .expect("send CancelRequest");
    let err = copy
        .finish("COPY tail after CancelRequest")
        .await
        .expect_err("a cancelled COPY tail ends with an error, not CommandComplete");
    assert_eq!(
        sqlstate(&err),
        Some(SqlState::QUERY_CANCELED.code()),
        "cancelled COPY: {err:?}"
    );
    assert_eq!(text_rows(&reader, "SELECT 1").await, [["1"]]);
    assert_eq!(
        text_rows(&reader, "SELECT count(*) FROM s").await,
        [["4"]],
        "the connection still queries"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn non_tailable_copies_are_snapshots() {
    let server = Server::start().await;
    let client = server.client().await;
    stream_with_rows(&client, "s", 3).await;
    // (statement, its rows in order; `sorted` when the order is unspecified)
    let cases: [(&str, &[&str], bool); 5] = [
        ("COPY s (v) TO STDOUT", &["r0", "r1", "r2"], false),
        (
            "COPY (SELECT v FROM s) TO STDOUT",
            &["r0", "r1", "r2"],
            true,
        ),
        (
            "COPY (SELECT v FROM s WHERE offset > 0 AND offset < 100) TO STDOUT",
            &["r1", "r2"],
            true,
        ),
        (
            "COPY (SELECT count(*) FROM s WHERE offset > 0) TO STDOUT",
            &["2"],
            false,
        ),
        (
            "COPY (SELECT v FROM s WHERE offset >= 0 ORDER BY offset DESC) TO STDOUT",
            &["r2", "r1", "r0"],
            false,
        ),
    ];
    for (sql, expected, sorted) in cases {
        let mut copy = CopyLines::start(&client, sql).await;
        let mut lines = Vec::new();
        loop {
            // A snapshot ends by itself, without waiting for new rows.
            match within(ARRIVAL, sql, copy.next()).await {
                Ok(Some(line)) => lines.push(line),
                Ok(None) => break,
                Err(e) => panic!("{sql}: {e:?}"),
            }
        }
        if sorted {
            lines.sort();
        }
        assert_eq!(lines, expected, "{sql}");
    }
}

// ---------------------------------------------------------------------------
// DECLARE / FETCH

#[tokio::test(flavor = "multi_thread")]
async fn cursor_fetch_follows_the_stream() {
    let server = Server::start().await;
    let reader = server.client().await;
    let writer = server.client().await;
    stream_with_rows(&writer, "s", 4).await;

    exec(&reader, "BEGIN").await;
    exec(
        &reader,
        "DECLARE c CURSOR FOR SELECT offset, v FROM s WHERE offset > 0",
    )
    .await;
    assert_eq!(
        text_rows(&reader, "FETCH 2 FROM c").await,
        expected_pairs(1..3)
    );
    assert_eq!(
        text_rows(&reader, "FETCH FORWARD 5 FROM c").await,
        expected_pairs(3..4),
        "FETCH returns what is available without waiting for 5 rows"
    );

    // A FETCH with nothing available waits for the next commit.
    exec(&reader, "SET tail_wait = '60s'").await;
    let fetch = reader.simple_query("FETCH 10 FROM c");
    let insert = async {
        tokio::time::sleep(Duration::from_millis(300)).await;
        insert_rows(&writer, "s", 4..5).await
    };
    let (fetched, _) = within(
        Duration::from_secs(30),
        "FETCH waiting for a commit (tail_wait 60s)",
        async { futures::join!(fetch, insert) },
    )
    .await;
    let fetched = rows_of(fetched.expect("FETCH that waited"));
    assert_eq!(
        fetched,
        expected_pairs(4..5),
        "the row committed while FETCH waited"
    );

    // Many rows committed later arrive over a FETCH loop, in order.
    insert_rows(&writer, "s", 5..12).await;
    let mut got = Vec::new();
    let deadline = Instant::now() + ARRIVAL;
    while got.len() < 7 && Instant::now() < deadline {
        got.extend(text_rows(&reader, "FETCH 3 FROM c").await);
    }
    assert_eq!(got, expected_pairs(5..12), "FETCH loop over later rows");

    // Nothing new: after tail_wait the FETCH returns, empty.
    exec(&reader, "SET tail_wait = '300ms'").await;
    let empty = text_rows(&reader, "FETCH 5 FROM c").await;
    assert!(empty.is_empty(), "FETCH with no new rows: {empty:?}");
    exec(&reader, "CLOSE c").await;
    let err = expect_sqlstate(
        reader.simple_query("FETCH 1 FROM c").await,
        &SqlState::INVALID_CURSOR_NAME,
        "FETCH from a closed cursor",
    );
    println!("FETCH after CLOSE: {}", error_message(&err));
    exec(&reader, "ROLLBACK").await;
}

/// A tail from a time (`ts >= '...'` beside the offset bound) delivers exactly the rows
/// stamped then or later, then follows the stream — whatever time zone the session reads
/// the literal in (the tail seeks a day early and lets the query's filter decide).
#[tokio::test(flavor = "multi_thread")]
async fn a_cursor_tails_from_a_time() {
    let server = Server::start().await;
    let reader = server.client().await;
    let writer = server.client().await;
    stream_with_rows(&writer, "s", 6).await;
    // the writer's session is in UTC: `...+00`
    let stamped = text_rows(&writer, "SELECT ts FROM s WHERE offset = 3").await;
    let at = &stamped[0][0]
        .strip_suffix("+00")
        .expect("ts in UTC")
        .to_string();
    for (zone, literal) in [
        ("UTC", format!("{at}+00")),
        ("UTC", at.clone()),
        ("Pacific/Kiritimati", format!("{at}+00")),
        ("Etc/GMT+12", format!("{at}+00")),
    ] {
        exec(&reader, &format!("SET TIME ZONE '{zone}'")).await;
        exec(&reader, "BEGIN").await;
        exec(&reader, "SET tail_wait = '200ms'").await;
        exec(
            &reader,
            &format!(
                "DECLARE c CURSOR FOR SELECT offset, v FROM s WHERE offset >= 0 AND ts >= '{literal}'"
            ),
        )
        .await;
        assert_eq!(
            text_rows(&reader, "FETCH 10 FROM c").await,
            expected_pairs(3..6),
            "{zone} {literal}"
        );
        exec(&reader, "ROLLBACK").await;
    }
    // and it goes on with rows committed later
    exec(&reader, "SET TIME ZONE 'UTC'").await;
    exec(&reader, "BEGIN").await;
    exec(&reader, "SET tail_wait = '200ms'").await;
    exec(
        &reader,
        &format!(
            "DECLARE c CURSOR FOR SELECT offset, v FROM s WHERE offset >= 0 AND ts > '{at}+00'"
        ),
    )
    .await;
    assert_eq!(
        text_rows(&reader, "FETCH 10 FROM c").await,
        expected_pairs(4..6)
    );
    insert_rows(&writer, "s", 6..8).await;
    let mut got = Vec::new();
    let deadline = Instant::now() + ARRIVAL;
    while got.len() < 2 && Instant::now() < deadline {
        got.extend(text_rows(&reader, "FETCH 10 FROM c").await);
    }
    assert_eq!(got, expected_pairs(6..8));
    exec(&reader, "ROLLBACK").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn cursors_outside_a_transaction_block() {
    let server = Server::start().await;
    let reader = server.client().await;
    let writer = server.client().await;
    stream_with_rows(&writer, "s", 3).await;

    expect_sqlstate(
        reader
            .simple_query("DECLARE c CURSOR FOR SELECT offset, v FROM s WHERE offset > 0")
            .await,
        &SqlState::NO_ACTIVE_SQL_TRANSACTION,
        "DECLARE without HOLD outside a transaction block",
    );
    assert_eq!(text_rows(&reader, "SELECT 1").await, [["1"]]);

    exec(
        &reader,
        "DECLARE h NO SCROLL CURSOR WITH HOLD FOR SELECT offset, v FROM s WHERE offset >= 1",
    )
    .await;
    assert_eq!(
        text_rows(&reader, "FETCH 10 FROM h").await,
        expected_pairs(1..3)
    );
    insert_rows(&writer, "s", 3..5).await;
    exec(&reader, "SET tail_wait = '5s'").await;
    let mut got = Vec::new();
    let deadline = Instant::now() + ARRIVAL;
    while got.len() < 2 && Instant::now() < deadline {
        got.extend(text_rows(&reader, "FETCH 10 FROM h").await);
    }
    assert_eq!(got, expected_pairs(3..5), "held cursor sees later commits");

    exec(
        &reader,
        "DECLARE h2 CURSOR WITH HOLD FOR SELECT v FROM s WHERE offset > 3",
    )
    .await;
    assert_eq!(text_rows(&reader, "FETCH 1 FROM h2").await, [["r4"]]);
    exec(&reader, "CLOSE ALL").await;
    for name in ["h", "h2"] {
        expect_sqlstate(
            reader.simple_query(&format!("FETCH 1 FROM {name}")).await,
            &SqlState::INVALID_CURSOR_NAME,
            "FETCH after CLOSE ALL",
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn snapshot_cursor_works_like_postgres() {
    let server = Server::start().await;
    let client = server.client().await;
    stream_with_rows(&client, "s", 5).await;
    let other = server.client().await;

    exec(&client, "SET tail_wait = '60s'").await;
    exec(&client, "BEGIN").await;
    exec(
        &client,
        "DECLARE d CURSOR FOR SELECT offset, v FROM s ORDER BY offset DESC",
    )
    .await;
    assert_eq!(
        text_rows(&client, "FETCH 2 FROM d").await,
        [["4", "r4"], ["3", "r3"]]
    );
    insert_rows(&other, "s", 5..6).await;
    assert_eq!(
        text_rows(&client, "FETCH ALL FROM d").await,
        [["2", "r2"], ["1", "r1"], ["0", "r0"]],
        "a snapshot cursor does not see later rows"
    );
    let rest = within(
        Duration::from_secs(20),
        "FETCH past the end of a snapshot cursor must not wait for tail_wait",
        client.simple_query("FETCH 1 FROM d"),
    )
    .await;
    assert!(rows_of(rest.expect("FETCH past the end")).is_empty());
    exec(&client, "COMMIT").await;
}

// ---------------------------------------------------------------------------
// Extended protocol: Execute with a row limit

#[tokio::test(flavor = "multi_thread")]
async fn row_limited_portal_follows_the_stream() {
    let server = Server::start().await;
    let mut reader = server.client().await;
    let writer = Arc::new(server.client().await);
    stream_with_rows(&writer, "s", 5).await;

    let tx = reader.transaction().await.expect("BEGIN");
    tx.batch_execute("SET tail_wait = '5s'")
        .await
        .expect("SET tail_wait");
    let stmt = tx
        .prepare("SELECT offset, v FROM s WHERE offset > $1")
        .await
        .expect("prepare tailable SELECT");
    let from: i64 = 0;
    let portal = tx.bind(&stmt, &[&from]).await.expect("bind");

    let pairs = |rows: Vec<tokio_postgres::Row>| -> Vec<(i64, String)> {
        rows.iter().map(|r| (r.get(0), r.get(1))).collect()
    };
    let want = |range: std::ops::Range<i64>| -> Vec<(i64, String)> {
        range.map(|i| (i, format!("r{i}"))).collect()
    };
    let batch = within(ARRIVAL, "Execute 2", tx.query_portal(&portal, 2))
        .await
        .expect("Execute 2");
    assert_eq!(pairs(batch), want(1..3));
    let batch = within(ARRIVAL, "Execute 2", tx.query_portal(&portal, 2))
        .await
        .expect("Execute 2");
    assert_eq!(pairs(batch), want(3..5));

    // Rows committed later, while Execute waits and between Executes.
    let inserter = {
        let writer = writer.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(300)).await;
            insert_rows(&writer, "s", 5..10).await
        })
    };
    let mut got = Vec::new();
    let deadline = Instant::now() + ARRIVAL * 2;
    while got.len() < 5 && Instant::now() < deadline {
        let batch = within(ARRIVAL, "Execute 2 on a tail", tx.query_portal(&portal, 2))
            .await
            .expect("Execute 2 on a tail");
        assert!(batch.len() <= 2, "Execute 2 returned {} rows", batch.len());
        got.extend(pairs(batch));
    }
    assert_eq!(inserter.await.expect("inserter"), [5, 6, 7, 8, 9]);
    assert_eq!(
        got,
        want(5..10),
        "rows committed after the portal was bound"
    );

    // Nothing new: Execute returns empty after tail_wait, and the portal
    // is still open afterwards.
    tx.batch_execute("SET tail_wait = '300ms'")
        .await
        .expect("SET tail_wait");
    let empty = within(
        ARRIVAL,
        "Execute on an idle tail",
        tx.query_portal(&portal, 2),
    )
    .await
    .expect("Execute on an idle tail");
    assert!(
        empty.is_empty(),
        "idle tail returned rows: {:?}",
        pairs(empty)
    );
    insert_rows(&writer, "s", 10..11).await;
    let mut late = Vec::new();
    let deadline = Instant::now() + ARRIVAL;
    while late.is_empty() && Instant::now() < deadline {
        late = within(
            ARRIVAL,
            "Execute after an empty one",
            tx.query_portal(&portal, 2),
        )
        .await
        .expect("Execute after an empty result: the tail portal must still be open");
    }
    assert_eq!(pairs(late), want(10..11));
    tx.rollback().await.expect("ROLLBACK");
}

// ---------------------------------------------------------------------------
// LISTEN / NOTIFY

/// A connection whose notifications are collected by our own driver task.
struct Listener {
    client: Client,
    rx: mpsc::UnboundedReceiver<Notification>,
}

impl Listener {
    async fn connect(server: &Server) -> Listener {
        let conn_string = server.conn_string();
        let connect = tokio_postgres::connect(&conn_string, NoTls);
        let (client, mut connection) = within(STATEMENT_TIMEOUT, "connect listener", connect)
            .await
            .expect("connect listener");
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(async move {
            let mut messages = futures::stream::poll_fn(move |cx| connection.poll_message(cx));
            while let Some(message) = messages.next().await {
                match message {
                    Ok(AsyncMessage::Notification(n)) => {
                        if tx.send(n).is_err() {
                            break;
                        }
                    }
                    Ok(_) => {}
                    Err(e) => {
                        eprintln!("[listener] connection ended: {e}");
                        break;
                    }
                }
            }
        });
        Listener { client, rx }
    }

    async fn next(&mut self, what: &str) -> Notification {
        within(ARRIVAL, what, self.rx.recv())
            .await
            .unwrap_or_else(|| panic!("{what}: listener connection closed"))
    }

    async fn expect_none(&mut self, what: &str) {
        if let Ok(n) = tokio::time::timeout(QUIET, self.rx.recv()).await {
            panic!("{what}: expected no notification, got {n:?}");
        }
    }
}

fn payload_json(n: &Notification) -> serde_json::Value {
    serde_json::from_str(n.payload())
        .unwrap_or_else(|e| panic!("payload of {n:?} is not JSON: {e}"))
}

#[tokio::test(flavor = "multi_thread")]
async fn listen_gets_one_notification_per_committed_row() {
    let server = Server::start().await;
    let writer = server.client().await;
    exec(
        &writer,
        "CREATE STREAM orders (customer text NOT NULL, amount numeric(12,2), note text)",
    )
    .await;
    exec(&writer, "INSERT INTO orders VALUES ('before', 1, NULL)").await;

    let mut listener = Listener::connect(&server).await;
    exec(&listener.client, "LISTEN orders").await;
    // From here on the listener only waits: notifications must arrive
    // while its connection is idle.
    let mut offsets = text_rows(
        &writer,
        "INSERT INTO orders VALUES ('ann', 10.50, 'a\"b'), ('bob', 3, NULL) RETURNING offset",
    )
    .await;
    offsets.extend(
        text_rows(
            &writer,
            "INSERT INTO orders (customer) VALUES ('cy') RETURNING offset",
        )
        .await,
    );
    let offsets: Vec<i64> = offsets
        .iter()
        .map(|r| r[0].parse().expect("offset"))
        .collect();
    assert_eq!(offsets, [1, 2, 3]);

    let mut payloads = Vec::new();
    for offset in &offsets {
        let n = listener
            .next(&format!("notification for offset {offset}"))
            .await;
        assert_eq!(n.channel(), "orders");
        payloads.push(payload_json(&n));
    }
    listener
        .expect_none("exactly one notification per row")
        .await;

    let got: Vec<i64> = payloads
        .iter()
        .map(|p| p["offset"].as_i64().expect("\"offset\" is an integer"))
        .collect();
    assert_eq!(
        got, offsets,
        "notifications in offset order, none for rows before LISTEN"
    );
    for p in &payloads {
        let ts = p["ts"]
            .as_str()
            .unwrap_or_else(|| panic!("\"ts\" string in {p}"));
        chrono::DateTime::parse_from_rfc3339(ts)
            .unwrap_or_else(|e| panic!("\"ts\" {ts:?} is not RFC 3339: {e}"));
    }
    let fields = |p: &serde_json::Value| {
        (
            p["customer"].clone(),
            p["amount"]
                .as_f64()
                .or_else(|| p["amount"].as_str().and_then(|s| s.parse().ok())),
            p["note"].clone(),
        )
    };
    assert_eq!(
        fields(&payloads[0]),
        (
            serde_json::json!("ann"),
            Some(10.5),
            serde_json::json!("a\"b")
        )
    );
    assert_eq!(
        fields(&payloads[1]),
        (serde_json::json!("bob"), Some(3.0), serde_json::Value::Null)
    );
    assert_eq!(
        fields(&payloads[2]),
        (serde_json::json!("cy"), None, serde_json::Value::Null)
    );

    // UNLISTEN stops them; UNLISTEN * too.
    exec(&listener.client, "UNLISTEN orders").await;
    exec(
        &writer,
        "INSERT INTO orders VALUES ('after-unlisten', 1, NULL)",
    )
    .await;
    listener.expect_none("after UNLISTEN orders").await;
    exec(&listener.client, "LISTEN orders").await;
    exec(&writer, "INSERT INTO orders VALUES ('again', 1, NULL)").await;
    let n = listener.next("after LISTEN again").await;
    assert_eq!(payload_json(&n)["customer"], "again");
    exec(&listener.client, "UNLISTEN *").await;
    exec(
        &writer,
        "INSERT INTO orders VALUES ('after-unlisten-all', 1, NULL)",
    )
    .await;
    listener.expect_none("after UNLISTEN *").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn notify_and_pg_notify_between_sessions() {
    let server = Server::start().await;
    let notifier = server.client().await;
    let mut listener = Listener::connect(&server).await;
    exec(&listener.client, "LISTEN jobs").await;

    exec(&notifier, "NOTIFY jobs, 'hello'").await;
    exec(&notifier, "NOTIFY other, 'not for us'").await;
    exec(&notifier, "SELECT pg_notify('jobs', 'world')").await;
    for expected in ["hello", "world"] {
        let n = listener.next(expected).await;
        assert_eq!((n.channel(), n.payload()), ("jobs", expected));
    }
    exec(&notifier, "NOTIFY jobs").await;
    let n = listener.next("NOTIFY without payload").await;
    assert_eq!((n.channel(), n.payload()), ("jobs", ""));

    // Inside the notifier's transaction block: delivered on COMMIT only.
    exec(&notifier, "BEGIN").await;
    exec(&notifier, "NOTIFY jobs, 'in-block-1'").await;
    exec(&notifier, "SELECT pg_notify('jobs', 'in-block-2')").await;
    listener.expect_none("NOTIFY in an open block").await;
    exec(&notifier, "COMMIT").await;
    for expected in ["in-block-1", "in-block-2"] {
        let n = listener.next(expected).await;
        assert_eq!(n.payload(), expected);
    }

    // Rolled back: never delivered.
    exec(&notifier, "BEGIN").await;
    exec(&notifier, "NOTIFY jobs, 'rolled-back'").await;
    exec(&notifier, "ROLLBACK").await;
    exec(&notifier, "NOTIFY jobs, 'after-rollback'").await;
    let n = listener.next("after-rollback").await;
    assert_eq!(
        n.payload(),
        "after-rollback",
        "a rolled-back NOTIFY was delivered"
    );
    listener.expect_none("nothing else").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn notifications_wait_for_transaction_boundaries() {
    let server = Server::start().await;
    let writer = server.client().await;
    exec(&writer, "CREATE STREAM s (v text)").await;
    let mut listener = Listener::connect(&server).await;
    exec(&listener.client, "LISTEN s").await;

    // Rows inserted inside the writer's block: notified at COMMIT.
    exec(&writer, "BEGIN").await;
    exec(&writer, "INSERT INTO s VALUES ('t1'), ('t2')").await;
    listener.expect_none("rows of an uncommitted block").await;
    exec(&writer, "COMMIT").await;
    for v in ["t1", "t2"] {
        let n = listener.next(v).await;
        assert_eq!(payload_json(&n)["v"], v);
    }
    exec(&writer, "BEGIN").await;
    exec(&writer, "INSERT INTO s VALUES ('rolled-back')").await;
    exec(&writer, "ROLLBACK").await;
    listener.expect_none("rows of a rolled-back block").await;

    // The listener inside its own open block: delivered after its COMMIT.
    exec(&listener.client, "BEGIN").await;
    exec(&writer, "INSERT INTO s VALUES ('while-listener-in-block')").await;
    listener
        .expect_none("a listener inside a transaction block")
        .await;
    exec(&listener.client, "COMMIT").await;
    let n = listener.next("after the listener's COMMIT").await;
    let p = payload_json(&n);
    assert_eq!(p["v"], "while-listener-in-block");
    assert_eq!(p["offset"], 2, "the rolled-back row used no offset");
}

/// PostgreSQL delivers notifications of different transactions in commit
/// order. A row acknowledged before a NOTIFY was even sent must be notified
/// before it (a marker NOTIFY is a common "caught up" signal).
#[tokio::test(flavor = "multi_thread")]
async fn row_and_notify_notifications_arrive_in_commit_order() {
    let server = Server::start().await;
    let writer = server.client().await;
    exec(&writer, "CREATE STREAM s (v text)").await;
    let mut listener = Listener::connect(&server).await;
    exec(&listener.client, "LISTEN s; LISTEN marker").await;

    let rounds = 20;
    for i in 0..rounds {
        exec(&writer, &format!("INSERT INTO s VALUES ('r{i}')")).await;
        exec(&writer, &format!("NOTIFY marker, 'm{i}'")).await;
    }
    let mut order = Vec::new();
    for _ in 0..2 * rounds {
        let n = listener.next("row or marker notification").await;
        order.push(match n.channel() {
            "s" => payload_json(&n)["v"]
                .as_str()
                .expect("v is text")
                .to_string(),
            _ => n.payload().to_string(),
        });
    }
    let expected: Vec<String> = (0..rounds)
        .flat_map(|i| [format!("r{i}"), format!("m{i}")])
        .collect();
    assert_eq!(order, expected, "notifications out of commit order");
}

// ---------------------------------------------------------------------------
// The end of a tail: dropped stream, truncated prefix

#[tokio::test(flavor = "multi_thread")]
async fn dropping_the_stream_ends_a_copy_tail_with_an_error() {
    let server = Server::start().await;
    let reader = server.client().await;
    let writer = server.client().await;
    stream_with_rows(&writer, "s", 2).await;

    let mut copy = CopyLines::start(
        &reader,
        "COPY (SELECT offset, v FROM s WHERE offset >= 0) TO STDOUT",
    )
    .await;
    // (Delivery order is checked elsewhere; this test is about the end.)
    let mut existing = Vec::new();
    for _ in 0..2 {
        existing.push(split_tabs(&copy.expect_line("existing row").await));
    }
    existing.sort();
    assert_eq!(existing, expected_pairs(0..2));
    exec(&writer, "DROP STREAM s").await;
    let err = copy
        .finish("COPY tail of a dropped stream")
        .await
        .expect_err("a dropped stream must end the tail with an error");
    assert!(
        err.as_db_error().is_some(),
        "expected an ErrorResponse from the server, got {err:?}"
    );
    println!(
        "dropped-stream tail error: {:?} {}",
        sqlstate(&err),
        error_message(&err)
    );
    assert_eq!(text_rows(&reader, "SELECT 1").await, [["1"]]);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_tail_from_a_truncated_prefix_fails() {
    let server = Server::start().await;
    let reader = server.client().await;
    let writer = server.client().await;
    stream_with_rows(&writer, "s", 10).await;
    exec(&writer, "DELETE FROM s WHERE offset < 5").await;

    exec(&reader, "SET tail_wait = '300ms'").await;
    exec(&reader, "BEGIN").await;
    let declared = reader
        .simple_query("DECLARE c CURSOR FOR SELECT offset, v FROM s WHERE offset >= 0")
        .await;
    let fetched = match declared {
        Err(e) => Err(e),
        Ok(_) => reader.simple_query("FETCH 10 FROM c").await,
    };
    match fetched {
        Ok(messages) => panic!(
            "a cursor from offset 0 after truncation below 5 returned rows {:?} instead of an error",
            rows_of(messages)
        ),
        Err(e) => {
            assert!(e.as_db_error().is_some(), "expected a server error: {e:?}");
            println!(
                "truncated cursor error: {:?} {}",
                sqlstate(&e),
                error_message(&e)
            );
        }
    }
    exec(&reader, "ROLLBACK").await;

    let mut copy = CopyLines::start(
        &reader,
        "COPY (SELECT offset, v FROM s WHERE offset > 2) TO STDOUT",
    )
    .await;
    match within(ARRIVAL, "COPY tail from a truncated offset", copy.next()).await {
        Err(e) => assert!(e.as_db_error().is_some(), "expected a server error: {e:?}"),
        Ok(line) => panic!("COPY tail from offset 3 (first retained: 5) gave {line:?}"),
    }

    // From the first retained offset on, the tail works.
    exec(&reader, "BEGIN").await;
    exec(
        &reader,
        "DECLARE c CURSOR FOR SELECT offset, v FROM s WHERE offset >= 5",
    )
    .await;
    let mut retained = text_rows(&reader, "FETCH 10 FROM c").await;
    retained.sort(); // delivery order is checked elsewhere
    assert_eq!(retained, expected_pairs(5..10));
    exec(&reader, "COMMIT").await;
}

// ---------------------------------------------------------------------------
// Issue acceptance 4: every kind of tail sees the same committed log.

const WRITERS: usize = 8;
const STATEMENTS: usize = 150;
const KIND_ROLLBACK: &str = "rollback";

/// One delivered row: (offset, writer, seq, kind).
type Delivered = (i64, i32, i32, String);

/// Writer `w`'s statements; returns the (writer, seq) of every committed row.
async fn run_writer(client: Client, w: i32) -> Vec<(i32, i32)> {
    let insert = client
        .prepare("INSERT INTO events (writer, seq, kind) VALUES ($1, $2, $3)")
        .await
        .expect("prepare INSERT");
    let mut committed = Vec::new();
    for i in 0..STATEMENTS as i32 {
        let seq = |k: i32| i * 10 + k;
        let row = |k: i32, kind: &str| format!("({w}, {}, '{kind}')", seq(k));
        match i % 6 {
            0 => {
                exec(
                    &client,
                    &format!("INSERT INTO events VALUES {}", row(0, "single")),
                )
                .await;
                committed.push((w, seq(0)));
            }
            1 => {
                let rows = (0..3)
                    .map(|k| row(k, "multi"))
                    .collect::<Vec<_>>()
                    .join(", ");
                exec(&client, &format!("INSERT INTO events VALUES {rows}")).await;
                committed.extend((0..3).map(|k| (w, seq(k))));
            }
            2 => {
                exec(&client, "BEGIN").await;
                exec(
                    &client,
                    &format!(
                        "INSERT INTO events VALUES {}, {}",
                        row(0, KIND_ROLLBACK),
                        row(1, KIND_ROLLBACK)
                    ),
                )
                .await;
                exec(&client, "ROLLBACK").await;
            }
            3 => {
                exec(&client, "BEGIN").await;
                exec(
                    &client,
                    &format!("INSERT INTO events VALUES {}", row(0, "tx")),
                )
                .await;
                exec(
                    &client,
                    &format!(
                        "INSERT INTO events VALUES {}, {}",
                        row(1, "tx"),
                        row(2, "tx")
                    ),
                )
                .await;
                exec(&client, "COMMIT").await;
                committed.extend((0..3).map(|k| (w, seq(k))));
            }
            4 => {
                within(
                    STATEMENT_TIMEOUT,
                    "extended-protocol INSERT",
                    client.execute(&insert, &[&w, &seq(0), &"prepared"]),
                )
                .await
                .expect("extended-protocol INSERT");
                committed.push((w, seq(0)));
            }
            _ => {
                // A block that fails and is rolled back.
                exec(&client, "BEGIN").await;
                exec(
                    &client,
                    &format!("INSERT INTO events VALUES {}", row(0, KIND_ROLLBACK)),
                )
                .await;
                let failed = client
                    .simple_query("INSERT INTO events (writer) VALUES (NULL)")
                    .await;
                assert!(failed.is_err(), "NULL into NOT NULL column must fail");
                exec(&client, "ROLLBACK").await;
            }
        }
    }
    committed
}

/// Shared stop condition of the collectors: the number of committed rows,
/// once the writers are done.
#[derive(Clone)]
struct Target(Arc<AtomicUsize>);

impl Target {
    fn reached(&self, have: usize) -> bool {
        have >= self.0.load(Ordering::SeqCst)
    }
}

const COLLECT_DEADLINE: Duration = Duration::from_secs(180);
const EVENTS_QUERY: &str = "SELECT offset, writer, seq, kind FROM events WHERE offset >= 0";

fn parse_text_row(fields: &[String]) -> Delivered {
    (
        fields[0].parse().expect("offset"),
        fields[1].parse().expect("writer"),
        fields[2].parse().expect("seq"),
        fields[3].clone(),
    )
}

async fn collect_copy(client: Client, target: Target, mut copy: CopyLines) -> Vec<Delivered> {
    let deadline = Instant::now() + COLLECT_DEADLINE;
    let mut rows = Vec::new();
    while !target.reached(rows.len()) && Instant::now() < deadline {
        tokio::select! {
            line = copy.next() => match line {
                Ok(Some(line)) => rows.push(parse_text_row(&split_tabs(&line))),
                Ok(None) => panic!("COPY tail ended without a LIMIT"),
                Err(e) => panic!("COPY tail failed: {e:?}"),
            },
            _ = tokio::time::sleep(Duration::from_millis(200)) => {}
        }
    }
    within(
        STATEMENT_TIMEOUT,
        "cancel the COPY tail",
        client.cancel_token().cancel_query(NoTls),
    )
    .await
    .expect("cancel COPY tail");
    rows
}

async fn collect_cursor(client: Client, target: Target) -> Vec<Delivered> {
    let deadline = Instant::now() + COLLECT_DEADLINE;
    let mut rows = Vec::new();
    while !target.reached(rows.len()) && Instant::now() < deadline {
        for fields in text_rows(&client, "FETCH 100 FROM c").await {
            rows.push(parse_text_row(&fields));
        }
    }
    exec(&client, "CLOSE c; COMMIT").await;
    rows
}

async fn collect_portal(mut client: Client, target: Target) -> Vec<Delivered> {
    let tx = client.transaction().await.expect("BEGIN");
    let stmt = tx
        .prepare("SELECT offset, writer, seq, kind FROM events WHERE offset >= $1")
        .await
        .expect("prepare portal query");
    let from: i64 = 0;
    let portal = tx.bind(&stmt, &[&from]).await.expect("bind");
    // Bound: this client is ready before the writers start.
    let deadline = Instant::now() + COLLECT_DEADLINE;
    let mut rows = Vec::new();
    while !target.reached(rows.len()) && Instant::now() < deadline {
        let batch = within(
            STATEMENT_TIMEOUT,
            "Execute 37",
            tx.query_portal(&portal, 37),
        )
        .await
        .expect("Execute 37 on the tail portal");
        assert!(batch.len() <= 37);
        rows.extend(
            batch
                .iter()
                .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3))),
        );
    }
    tx.rollback().await.expect("ROLLBACK");
    rows
}

async fn collect_listen(mut listener: Listener, target: Target) -> Vec<Delivered> {
    let deadline = Instant::now() + COLLECT_DEADLINE;
    let mut rows = Vec::new();
    while !target.reached(rows.len()) && Instant::now() < deadline {
        let Ok(n) = tokio::time::timeout(Duration::from_millis(200), listener.rx.recv()).await
        else {
            continue;
        };
        let n = n.expect("listener connection closed");
        assert_eq!(n.channel(), "events");
        let p = payload_json(&n);
        assert!(
            p.get("lagged").is_none(),
            "listener lagged although its connection is drained continuously: {p}"
        );
        let int = |k: &str| {
            p[k].as_i64()
                .unwrap_or_else(|| panic!("{k} is not an integer in {p}"))
        };
        rows.push((
            int("offset"),
            int("writer") as i32,
            int("seq") as i32,
            p["kind"].as_str().expect("kind").to_string(),
        ));
    }
    rows
}

/// What is wrong with one tail's rows, as sentences (empty when right).
fn problems(name: &str, rows: &[Delivered], committed: &BTreeSet<(i32, i32)>) -> Vec<String> {
    let mut out = Vec::new();
    let rolled_back: Vec<_> = rows.iter().filter(|r| r.3 == KIND_ROLLBACK).collect();
    if !rolled_back.is_empty() {
        out.push(format!(
            "{name}: {} rolled-back rows delivered, e.g. {:?}",
            rolled_back.len(),
            &rolled_back[..rolled_back.len().min(3)]
        ));
    }
    let mut seen = BTreeMap::new();
    for r in rows {
        *seen.entry((r.1, r.2)).or_insert(0) += 1;
    }
    let dups: Vec<_> = seen
        .iter()
        .filter(|(_, &c)| c > 1)
        .map(|(k, _)| k)
        .collect();
    if !dups.is_empty() {
        out.push(format!(
            "{name}: {} rows delivered more than once, e.g. {:?}",
            dups.len(),
            &dups[..dups.len().min(3)]
        ));
    }
    let missing: Vec<_> = committed.iter().filter(|k| !seen.contains_key(k)).collect();
    if !missing.is_empty() {
        out.push(format!(
            "{name}: {} of {} committed rows never delivered, e.g. {:?}",
            missing.len(),
            committed.len(),
            &missing[..missing.len().min(3)]
        ));
    }
    let extra: Vec<_> = seen.keys().filter(|k| !committed.contains(k)).collect();
    if !extra.is_empty() {
        out.push(format!(
            "{name}: {} rows delivered that no writer saw committed, e.g. {:?}",
            extra.len(),
            &extra[..extra.len().min(3)]
        ));
    }
    let mut offsets: Vec<i64> = rows.iter().map(|r| r.0).collect();
    let out_of_order = offsets.windows(2).position(|w| w[0] >= w[1]);
    if let Some(i) = out_of_order {
        out.push(format!(
            "{name}: not in offset order: position {i} has offset {} followed by {}",
            offsets[i],
            offsets[i + 1]
        ));
    }
    offsets.sort_unstable();
    if offsets != (0..rows.len() as i64).collect::<Vec<_>>() {
        out.push(format!(
            "{name}: offsets are not gapless 0..{} (first {:?}, last {:?})",
            rows.len(),
            offsets.first(),
            offsets.last()
        ));
    }
    // Rows from one connection keep their order.
    let mut last_seq: BTreeMap<i32, (i64, i32)> = BTreeMap::new();
    let mut by_offset: Vec<&Delivered> = rows.iter().collect();
    by_offset.sort_by_key(|r| r.0);
    for r in by_offset {
        if let Some(&(prev_offset, prev_seq)) = last_seq.get(&r.1) {
            if prev_seq >= r.2 {
                out.push(format!(
                    "{name}: writer {}'s seq {} (offset {}) precedes seq {} (offset {})",
                    r.1, prev_seq, prev_offset, r.2, r.0
                ));
                break;
            }
        }
        last_seq.insert(r.1, (r.0, r.2));
    }
    out
}

#[tokio::test(flavor = "multi_thread")]
async fn all_tails_agree_with_concurrent_writers() {
    let server = Server::start().await;
    let admin = server.client().await;
    exec(
        &admin,
        "CREATE STREAM events (writer int NOT NULL, seq int NOT NULL, kind text NOT NULL)",
    )
    .await;
    let target = Target(Arc::new(AtomicUsize::new(usize::MAX)));

    // Start all four tails at offset 0 before any write.
    let copy_client = server.client().await;
    let copy = CopyLines::start(&copy_client, &format!("COPY ({EVENTS_QUERY}) TO STDOUT")).await;
    let cursor_client = server.client().await;
    exec(
        &cursor_client,
        &format!("SET tail_wait = '500ms'; BEGIN; DECLARE c CURSOR FOR {EVENTS_QUERY}"),
    )
    .await;
    let portal_client = server.client().await;
    exec(&portal_client, "SET tail_wait = '500ms'").await;
    let listener = Listener::connect(&server).await;
    exec(&listener.client, "LISTEN events").await;

    let copy_task = tokio::spawn(collect_copy(copy_client, target.clone(), copy));
    let cursor_task = tokio::spawn(collect_cursor(cursor_client, target.clone()));
    let portal_task = tokio::spawn(collect_portal(portal_client, target.clone()));
    let listen_task = tokio::spawn(collect_listen(listener, target.clone()));

    let mut writers = Vec::new();
    for w in 0..WRITERS as i32 {
        let client = server.client().await;
        writers.push(tokio::spawn(run_writer(client, w)));
    }
    let mut committed = BTreeSet::new();
    for writer in writers {
        let rows = within(Duration::from_secs(300), "writer", writer)
            .await
            .expect("writer task panicked");
        committed.extend(rows);
    }
    target.0.store(committed.len(), Ordering::SeqCst);
    println!("{} rows committed by {WRITERS} writers", committed.len());

    let snapshot: Vec<Delivered> = text_rows(
        &admin,
        "SELECT offset, writer, seq, kind FROM events ORDER BY offset",
    )
    .await
    .iter()
    .map(|r| parse_text_row(r))
    .collect();

    let bound = COLLECT_DEADLINE + STATEMENT_TIMEOUT;
    let tails = [
        ("COPY", within(bound, "COPY collector", copy_task).await),
        (
            "cursor",
            within(bound, "cursor collector", cursor_task).await,
        ),
        (
            "portal",
            within(bound, "portal collector", portal_task).await,
        ),
        (
            "LISTEN",
            within(bound, "LISTEN collector", listen_task).await,
        ),
    ];
    let mut all_problems = problems("snapshot SELECT", &snapshot, &committed);
    let mut sequences = Vec::new();
    for (name, result) in tails {
        let rows = result.unwrap_or_else(|e| panic!("{name} collector panicked: {e}"));
        println!("{name}: {} rows", rows.len());
        all_problems.extend(problems(name, &rows, &committed));
        sequences.push((name, rows));
    }
    // The snapshot is the committed log in offset order; every tail must
    // have delivered exactly that sequence.
    for (name, rows) in &sequences {
        if *rows != snapshot {
            let first_diff = rows
                .iter()
                .zip(&snapshot)
                .position(|(a, b)| a != b)
                .unwrap_or(rows.len().min(snapshot.len()));
            all_problems.push(format!(
                "{name} differs from the log (SELECT ... ORDER BY offset) at position \
                 {first_diff}: {:?} instead of {:?}",
                rows.get(first_diff),
                snapshot.get(first_diff)
            ));
        }
    }
    assert!(
        all_problems.is_empty(),
        "tails disagree with the committed log:\n  {}",
        all_problems.join("\n  ")
    );
}

// ---------------------------------------------------------------------------
// small helpers

fn rows_of(messages: Vec<tokio_postgres::SimpleQueryMessage>) -> Vec<Vec<String>> {
    messages
        .into_iter()
        .filter_map(|m| match m {
            tokio_postgres::SimpleQueryMessage::Row(row) => Some(
                (0..row.len())
                    .map(|i| row.get(i).unwrap_or("NULL").to_string())
                    .collect(),
            ),
            _ => None,
        })
        .collect()
}
