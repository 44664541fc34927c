//! The session layer in-process: what a PostgreSQL client sees from one
//! [`Session`] — command tags, rows, SQLSTATEs, transaction status, settings,
//! cursors, notifications and statement descriptions — driven the way the
//! server's handler drives it (`parse_query` / `execute` / `describe`, rows
//! drained from the returned stream), without spawning a server.
//!
//! These tests exist so that the session's behaviour is pinned down fast and
//! close to the code: the end-to-end suites in `tests/` cover the same ground
//! through a real process and real drivers, but take minutes and report a
//! failure far from its cause. Each test opens its own single-node engine in a
//! temporary directory. Expected SQLSTATEs are PostgreSQL's for the same
//! mistake (SPEC.md: "where it is silent, do what a PostgreSQL user would
//! expect"); behaviour peculiar to Sluice (streams, offsets, tails, prefix
//! truncation) is what SPEC.md and README.md promise.

use std::sync::Arc;
use std::time::Duration;

use arrow::array::{Array, ArrayRef};
use arrow::util::display::array_value_to_string;
use datafusion::scalar::ScalarValue;
use futures::StreamExt;
use sluice_sql::error::sqlstate;
use sluice_sql::param_type::ParamType;
use sluice_sql::statement::{parse, Parsed};
use sluice_sql::types::ColumnType;
use sluice_sql::{Engine, EngineConfig, Error, Output, Session, TxnStatus};
use tempfile::TempDir;

// ---------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------

/// A single-node engine over a fresh temporary data directory.
struct Db {
    engine: Arc<Engine>,
    _dir: TempDir,
}

impl Db {
    async fn open() -> Db {
        let dir = tempfile::tempdir().expect("temporary directory");
        let engine =
            Engine::open(EngineConfig::single_node(dir.path().join("data"))).expect("open engine");
        engine.wait_ready().await.expect("engine ready");
        Db { engine, _dir: dir }
    }

    fn session(&self) -> Session {
        Session::new(self.engine.clone()).expect("new session")
    }

    /// Stops the Raft node before the directory goes away.
    async fn close(self) {
        self.engine.shutdown().await;
    }
}

/// An engine and one session on it.
async fn setup() -> (Db, Session) {
    let db = Db::open().await;
    let s = db.session();
    (db, s)
}

/// What one statement produced, as a client would see it.
#[derive(Debug, Clone, PartialEq)]
enum Reply {
    /// Rows, with the complete command tag (`SELECT 2`, `INSERT 0 1`).
    Rows {
        tag: String,
        columns: Vec<String>,
        rows: Vec<Vec<String>>,
    },
    Tag(String),
}

impl Reply {
    fn tag(&self) -> &str {
        match self {
            Reply::Rows { tag, .. } | Reply::Tag(tag) => tag,
        }
    }
}

/// A cell as text; SQL NULL as `NULL`.
fn cell(col: &ArrayRef, i: usize) -> String {
    if col.is_null(i) {
        "NULL".into()
    } else {
        array_value_to_string(col, i).expect("displayable value")
    }
}

/// Run one parsed statement and drain its rows. An error while the rows
/// stream aborts the block, as the server does.
async fn run_parsed(s: &mut Session, p: &Parsed, params: &[ScalarValue]) -> Result<Reply, Error> {
    match s.execute(p, params).await? {
        Output::Rows {
            schema,
            mut stream,
            tag,
        } => {
            let columns = schema.fields().iter().map(|f| f.name().clone()).collect();
            let mut rows = Vec::new();
            while let Some(batch) = stream.next().await {
                let batch = match batch {
                    Ok(b) => b,
                    Err(e) => {
                        s.abort_block();
                        return Err(Error::from(e));
                    }
                };
                for i in 0..batch.num_rows() {
                    rows.push(batch.columns().iter().map(|c| cell(c, i)).collect());
                }
            }
            Ok(Reply::Rows {
                tag: format!("{tag} {}", rows.len()),
                columns,
                rows,
            })
        }
        Output::Tag(t) => Ok(Reply::Tag(t)),
        other => panic!("unexpected output {other:?}"),
    }
}

/// Every statement of a simple query, in order, stopping at the first error.
async fn exec(s: &mut Session, sql: &str) -> Result<Vec<Reply>, Error> {
    let parsed = s.parse_query(sql).await?;
    let mut out = Vec::new();
    for p in &parsed {
        out.push(run_parsed(s, p, &[]).await?);
    }
    Ok(out)
}

/// The one reply of a statement that must succeed.
async fn one(s: &mut Session, sql: &str) -> Reply {
    match exec(s, sql).await {
        Ok(mut replies) if replies.len() == 1 => replies.remove(0),
        Ok(replies) => panic!("{sql}: expected one reply, got {replies:?}"),
        Err(e) => panic!("{sql}: failed with {} {}", e.code, e.message),
    }
}

/// The command tag of a statement that must succeed.
async fn ok(s: &mut Session, sql: &str) -> String {
    one(s, sql).await.tag().to_string()
}

/// The rows of a statement that must succeed.
async fn rows(s: &mut Session, sql: &str) -> Vec<Vec<String>> {
    match one(s, sql).await {
        Reply::Rows { rows, .. } => rows,
        other => panic!("{sql}: expected rows, got {other:?}"),
    }
}

/// The column names of a statement's rows.
async fn columns(s: &mut Session, sql: &str) -> Vec<String> {
    match one(s, sql).await {
        Reply::Rows { columns, .. } => columns,
        other => panic!("{sql}: expected rows, got {other:?}"),
    }
}

/// The single value of a one-row, one-column result.
async fn scalar(s: &mut Session, sql: &str) -> String {
    let r = rows(s, sql).await;
    assert_eq!(r.len(), 1, "{sql}: {r:?}");
    assert_eq!(r[0].len(), 1, "{sql}: {r:?}");
    r[0][0].clone()
}

/// Runs statements that must all succeed.
async fn script(s: &mut Session, sql: &str) {
    if let Err(e) = exec(s, sql).await {
        panic!("{sql}: failed with {} {}", e.code, e.message);
    }
}

/// The error of a statement that must fail with SQLSTATE `code`.
async fn fails(s: &mut Session, sql: &str, code: &str) -> Error {
    match exec(s, sql).await {
        Ok(replies) => panic!("{sql}: expected {code}, got {replies:?}"),
        Err(e) => {
            assert_eq!(e.code, code, "{sql}: {}", e.message);
            e
        }
    }
}

fn table(rows: &[&[&str]]) -> Vec<Vec<String>> {
    rows.iter()
        .map(|r| r.iter().map(|c| c.to_string()).collect())
        .collect()
}

fn one_statement(sql: &str) -> Parsed {
    let mut p = parse(sql).expect("parses");
    assert_eq!(p.len(), 1, "{sql}");
    p.remove(0)
}

const EVENTS: &str = "CREATE STREAM ev (n bigint NOT NULL, note text)";
const ACCOUNTS: &str =
    "CREATE TABLE acct (id bigint PRIMARY KEY, owner text NOT NULL, balance bigint)";

// ---------------------------------------------------------------------------
// CREATE / DROP / SHOW STREAMS
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn create_stream_is_listed_by_show_streams() {
    let (db, mut s) = setup().await;
    assert_eq!(ok(&mut s, EVENTS).await, "CREATE STREAM");
    script(&mut s, "CREATE STREAM audit (who text)").await;
    script(&mut s, "INSERT INTO ev VALUES (1, 'a'), (2, 'b')").await;
    let shown = one(&mut s, "SHOW STREAMS").await;
    let Reply::Rows { tag, columns, rows } = shown else {
        panic!("SHOW STREAMS returned no rows: {shown:?}");
    };
    assert_eq!(tag, "SHOW 2");
    assert_eq!(
        columns,
        ["name", "first_offset", "next_offset", "bytes", "segments"]
    );
    let listed: Vec<(&str, &str, &str)> = rows
        .iter()
        .map(|r| (r[0].as_str(), r[1].as_str(), r[2].as_str()))
        .collect();
    assert_eq!(listed, [("audit", "0", "0"), ("ev", "0", "2")]);
    db.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn creating_an_existing_name_is_42p07() {
    let (db, mut s) = setup().await;
    script(&mut s, EVENTS).await;
    script(&mut s, ACCOUNTS).await;
    fails(&mut s, EVENTS, sqlstate::DUPLICATE_TABLE).await;
    fails(&mut s, ACCOUNTS, sqlstate::DUPLICATE_TABLE).await;
    // streams and tables share one namespace, as relations do in PostgreSQL
    fails(&mut s, "CREATE TABLE ev (x int)", sqlstate::DUPLICATE_TABLE).await;
    fails(
        &mut s,
        "CREATE STREAM acct (x int)",
        sqlstate::DUPLICATE_TABLE,
    )
    .await;
    db.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn if_not_exists_keeps_the_existing_relation() {
    let (db, mut s) = setup().await;
    script(&mut s, EVENTS).await;
    script(&mut s, "INSERT INTO ev VALUES (1, 'kept')").await;
    assert_eq!(
        ok(&mut s, "CREATE STREAM IF NOT EXISTS ev (other int)").await,
        "CREATE STREAM"
    );
    assert_eq!(
        rows(&mut s, "SELECT n, note FROM ev").await,
        table(&[&["1", "kept"]])
    );
    script(&mut s, ACCOUNTS).await;
    assert_eq!(
        ok(&mut s, "CREATE TABLE IF NOT EXISTS acct (x int)").await,
        "CREATE TABLE"
    );
    assert_eq!(
        columns(&mut s, "SELECT * FROM acct").await,
        ["id", "owner", "balance"]
    );
    db.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drop_removes_the_relation_and_a_missing_one_is_42p01() {
    let (db, mut s) = setup().await;
    script(&mut s, EVENTS).await;
    script(&mut s, ACCOUNTS).await;
    assert_eq!(ok(&mut s, "DROP STREAM ev").await, "DROP STREAM");
    assert_eq!(ok(&mut s, "DROP TABLE acct").await, "DROP TABLE");
    fails(&mut s, "SELECT * FROM ev", sqlstate::UNDEFINED_TABLE).await;
    fails(&mut s, "SELECT * FROM acct", sqlstate::UNDEFINED_TABLE).await;
    fails(
        &mut s,
        "INSERT INTO ev VALUES (1, 'x')",
        sqlstate::UNDEFINED_TABLE,
    )
    .await;
    fails(&mut s, "DROP STREAM ev", sqlstate::UNDEFINED_TABLE).await;
    fails(&mut s, "DROP TABLE acct", sqlstate::UNDEFINED_TABLE).await;
    assert_eq!(ok(&mut s, "DROP STREAM IF EXISTS ev").await, "DROP STREAM");
    assert_eq!(ok(&mut s, "DROP TABLE IF EXISTS acct").await, "DROP TABLE");
    // the name is free again, and a new stream starts at offset 0
    script(&mut s, EVENTS).await;
    script(&mut s, "INSERT INTO ev VALUES (5, 'again')").await;
    assert_eq!(scalar(&mut s, "SELECT offset FROM ev").await, "0");
    db.close().await;
}

// ---------------------------------------------------------------------------
// INSERT into a stream
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inserts_get_gapless_offsets_in_commit_order() {
    let (db, mut s) = setup().await;
    script(&mut s, EVENTS).await;
    assert_eq!(
        ok(&mut s, "INSERT INTO ev VALUES (10, 'a')").await,
        "INSERT 0 1"
    );
    assert_eq!(
        ok(
            &mut s,
            "INSERT INTO ev (note, n) VALUES ('b', 20), ('c', 30), ('d', 40)"
        )
        .await,
        "INSERT 0 3"
    );
    script(&mut s, "INSERT INTO ev (n) VALUES (50)").await;
    assert_eq!(
        rows(&mut s, "SELECT offset, n, note FROM ev").await,
        table(&[
            &["0", "10", "a"],
            &["1", "20", "b"],
            &["2", "30", "c"],
            &["3", "40", "d"],
            &["4", "50", "NULL"],
        ])
    );
    db.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn system_columns_come_first_and_ts_never_decreases() {
    let (db, mut s) = setup().await;
    script(&mut s, EVENTS).await;
    for i in 0..4 {
        script(&mut s, &format!("INSERT INTO ev VALUES ({i}, 'x')")).await;
    }
    assert_eq!(
        columns(&mut s, "SELECT * FROM ev").await,
        ["offset", "ts", "n", "note"]
    );
    assert_eq!(
        scalar(
            &mut s,
            "SELECT count(*) FROM ev WHERE ts IS NULL OR ts > now()"
        )
        .await,
        "0"
    );
    // every row's ts is at least its predecessor's
    assert_eq!(
        scalar(
            &mut s,
            "SELECT count(*) FROM ev a JOIN ev b ON b.offset = a.offset + 1 WHERE b.ts < a.ts"
        )
        .await,
        "0"
    );
    assert_eq!(
        scalar(
            &mut s,
            "SELECT count(*) FROM ev a JOIN ev b ON b.offset = a.offset + 1"
        )
        .await,
        "3"
    );
    db.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn returning_gives_the_assigned_offsets() {
    let (db, mut s) = setup().await;
    script(&mut s, EVENTS).await;
    script(&mut s, "INSERT INTO ev VALUES (1, 'first')").await;
    let reply = one(
        &mut s,
        "INSERT INTO ev VALUES (2, 'b'), (3, 'c') RETURNING offset, n, ts IS NOT NULL AS has_ts",
    )
    .await;
    let Reply::Rows { tag, columns, rows } = reply else {
        panic!("RETURNING gave no rows: {reply:?}");
    };
    assert_eq!(tag, "INSERT 0 2");
    assert_eq!(columns, ["offset", "n", "has_ts"]);
    assert_eq!(rows, table(&[&["1", "2", "true"], &["2", "3", "true"]]));
    db.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bound_parameters_insert_and_filter() {
    let (db, mut s) = setup().await;
    script(&mut s, EVENTS).await;
    let insert = one_statement("INSERT INTO ev (n, note) VALUES ($1, $2)");
    for (n, note) in [(7, "seven"), (8, "eight")] {
        let r = run_parsed(
            &mut s,
            &insert,
            &[
                ScalarValue::Int64(Some(n)),
                ScalarValue::Utf8(Some(note.into())),
            ],
        )
        .await
        .expect("insert with parameters");
        assert_eq!(r, Reply::Tag("INSERT 0 1".into()));
    }
    let select = one_statement("SELECT offset, note FROM ev WHERE n = $1");
    let r = run_parsed(&mut s, &select, &[ScalarValue::Int64(Some(8))])
        .await
        .expect("select with a parameter");
    let Reply::Rows { rows, .. } = r else {
        panic!("no rows: {r:?}");
    };
    assert_eq!(rows, table(&[&["1", "eight"]]));
    db.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_number_of_values_is_42601() {
    let (db, mut s) = setup().await;
    script(&mut s, EVENTS).await;
    let e = fails(
        &mut s,
        "INSERT INTO ev VALUES (1, 'a', 'extra')",
        sqlstate::SYNTAX_ERROR,
    )
    .await;
    assert!(e.message.contains("more expressions"), "{}", e.message);
    let e = fails(
        &mut s,
        "INSERT INTO ev (n, note) VALUES (1)",
        sqlstate::SYNTAX_ERROR,
    )
    .await;
    assert!(e.message.contains("more target columns"), "{}", e.message);
    assert_eq!(scalar(&mut s, "SELECT count(*) FROM ev").await, "0");
    db.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_column_is_42703() {
    let (db, mut s) = setup().await;
    script(&mut s, EVENTS).await;
    let e = fails(
        &mut s,
        "INSERT INTO ev (n, nope) VALUES (1, 'x')",
        sqlstate::UNDEFINED_COLUMN,
    )
    .await;
    assert!(e.message.contains("nope"), "{}", e.message);
    fails(&mut s, "SELECT nope FROM ev", sqlstate::UNDEFINED_COLUMN).await;
    fails(
        &mut s,
        "SELECT n FROM ev WHERE nope > 1",
        sqlstate::UNDEFINED_COLUMN,
    )
    .await;
    db.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_value_of_the_wrong_type_is_22p02() {
    let (db, mut s) = setup().await;
    script(&mut s, EVENTS).await;
    fails(
        &mut s,
        "INSERT INTO ev (n, note) VALUES ('abc', 'x')",
        sqlstate::INVALID_TEXT_REPRESENTATION,
    )
    .await;
    fails(
        &mut s,
        "SELECT 'abc'::bigint",
        sqlstate::INVALID_TEXT_REPRESENTATION,
    )
    .await;
    // a numeric string is accepted for a bigint column, as in PostgreSQL
    script(&mut s, "INSERT INTO ev (n, note) VALUES ('42', 'x')").await;
    assert_eq!(scalar(&mut s, "SELECT n FROM ev").await, "42");
    db.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn null_in_a_not_null_column_is_23502() {
    let (db, mut s) = setup().await;
    script(&mut s, EVENTS).await;
    let e = fails(
        &mut s,
        "INSERT INTO ev (n, note) VALUES (NULL, 'x')",
        sqlstate::NOT_NULL_VIOLATION,
    )
    .await;
    assert!(e.message.contains("\"n\""), "{}", e.message);
    // an omitted NOT NULL column is NULL too
    fails(
        &mut s,
        "INSERT INTO ev (note) VALUES ('x')",
        sqlstate::NOT_NULL_VIOLATION,
    )
    .await;
    // a failing row refuses the whole statement
    fails(
        &mut s,
        "INSERT INTO ev VALUES (1, 'ok'), (NULL, 'bad')",
        sqlstate::NOT_NULL_VIOLATION,
    )
    .await;
    assert_eq!(scalar(&mut s, "SELECT count(*) FROM ev").await, "0");
    db.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn system_columns_cannot_be_written_428c9() {
    let (db, mut s) = setup().await;
    script(&mut s, EVENTS).await;
    fails(
        &mut s,
        "INSERT INTO ev (offset, n) VALUES (5, 1)",
        sqlstate::GENERATED_ALWAYS,
    )
    .await;
    fails(
        &mut s,
        "INSERT INTO ev (ts, n) VALUES (now(), 1)",
        sqlstate::GENERATED_ALWAYS,
    )
    .await;
    db.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn insert_select_copies_rows_between_streams() {
    let (db, mut s) = setup().await;
    script(&mut s, EVENTS).await;
    script(&mut s, "CREATE STREAM big (n bigint, note text)").await;
    script(
        &mut s,
        "INSERT INTO ev VALUES (1, 'a'), (20, 'b'), (30, 'c')",
    )
    .await;
    assert_eq!(
        ok(
            &mut s,
            "INSERT INTO big SELECT n * 2, upper(note) FROM ev WHERE n > 10"
        )
        .await,
        "INSERT 0 2"
    );
    assert_eq!(
        rows(&mut s, "SELECT offset, n, note FROM big").await,
        table(&[&["0", "40", "B"], &["1", "60", "C"]])
    );
    db.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn copy_from_stdin_appends_rows() {
    let (db, mut s) = setup().await;
    script(&mut s, EVENTS).await;
    let copy = match s
        .execute(&one_statement("COPY ev (n, note) FROM STDIN"), &[])
        .await
    {
        Ok(Output::CopyIn(c)) => c,
        other => panic!("COPY FROM STDIN did not ask for data: {other:?}"),
    };
    assert_eq!(copy.columns(), 2);
    let out = s
        .finish_copy(copy, b"1\tone\n2\t\\N\n")
        .await
        .expect("COPY data accepted");
    assert!(matches!(&out, Output::Tag(t) if t == "COPY 2"), "{out:?}");
    assert_eq!(
        rows(&mut s, "SELECT offset, n, note FROM ev").await,
        table(&[&["0", "1", "one"], &["1", "2", "NULL"]])
    );
    // bad data refuses the whole COPY
    let copy = match s
        .execute(&one_statement("COPY ev (n, note) FROM STDIN"), &[])
        .await
    {
        Ok(Output::CopyIn(c)) => c,
        other => panic!("COPY FROM STDIN did not ask for data: {other:?}"),
    };
    let e = s
        .finish_copy(copy, b"3\tthree\nx\tbad\n")
        .await
        .expect_err("a bad bigint");
    assert_eq!(
        e.code,
        sqlstate::INVALID_TEXT_REPRESENTATION,
        "{}",
        e.message
    );
    assert_eq!(scalar(&mut s, "SELECT count(*) FROM ev").await, "2");
    db.close().await;
}

// ---------------------------------------------------------------------------
// SELECT over a stream
// ---------------------------------------------------------------------------

/// A stream `ev` with n = 10, 20, ..., 60 at offsets 0..5, notes alternating.
async fn six_events(s: &mut Session) {
    script(s, EVENTS).await;
    script(
        s,
        "INSERT INTO ev VALUES (10, 'odd'), (20, 'even'), (30, 'odd'), \
         (40, 'even'), (50, 'odd'), (60, 'even')",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn where_offset_reads_the_suffix() {
    let (db, mut s) = setup().await;
    six_events(&mut s).await;
    assert_eq!(
        rows(&mut s, "SELECT offset, n FROM ev WHERE offset > 3").await,
        table(&[&["4", "50"], &["5", "60"]])
    );
    assert_eq!(
        rows(&mut s, "SELECT n FROM ev WHERE offset >= 1 AND offset < 3").await,
        table(&[&["20"], &["30"]])
    );
    assert_eq!(
        rows(&mut s, "SELECT n FROM ev WHERE offset > 99").await,
        Vec::<Vec<String>>::new()
    );
    db.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn order_by_and_limit() {
    let (db, mut s) = setup().await;
    six_events(&mut s).await;
    let reply = one(&mut s, "SELECT offset, n FROM ev ORDER BY n DESC LIMIT 2").await;
    assert_eq!(reply.tag(), "SELECT 2");
    let Reply::Rows { rows, .. } = reply else {
        panic!("{reply:?}");
    };
    assert_eq!(rows, table(&[&["5", "60"], &["4", "50"]]));
    assert_eq!(
        rows_of(one(&mut s, "SELECT n FROM ev ORDER BY offset LIMIT 2 OFFSET 3").await),
        table(&[&["40"], &["50"]])
    );
    db.close().await;
}

fn rows_of(reply: Reply) -> Vec<Vec<String>> {
    match reply {
        Reply::Rows { rows, .. } => rows,
        other => panic!("expected rows, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn aggregates_over_a_stream() {
    let (db, mut s) = setup().await;
    six_events(&mut s).await;
    assert_eq!(
        rows(
            &mut s,
            "SELECT note, count(*), sum(n), min(offset), max(offset) FROM ev GROUP BY note ORDER BY note"
        )
        .await,
        table(&[&["even", "3", "120", "1", "5"], &["odd", "3", "90", "0", "4"]])
    );
    assert_eq!(
        scalar(&mut s, "SELECT count(*) FROM ev WHERE n > 25").await,
        "4"
    );
    db.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn count_of_an_empty_stream_is_zero() {
    let (db, mut s) = setup().await;
    script(&mut s, EVENTS).await;
    assert_eq!(scalar(&mut s, "SELECT count(*) FROM ev").await, "0");
    assert_eq!(scalar(&mut s, "SELECT sum(n) FROM ev").await, "NULL");
    let reply = one(&mut s, "SELECT * FROM ev").await;
    assert_eq!(reply.tag(), "SELECT 0");
    db.close().await;
}

// ---------------------------------------------------------------------------
// Tables
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn table_insert_update_delete_select() {
    let (db, mut s) = setup().await;
    script(&mut s, ACCOUNTS).await;
    assert_eq!(
        ok(
            &mut s,
            "INSERT INTO acct VALUES (1, 'ann', 10), (2, 'bob', 20), (3, 'cy', 30)"
        )
        .await,
        "INSERT 0 3"
    );
    assert_eq!(
        ok(
            &mut s,
            "UPDATE acct SET balance = balance + 5 WHERE id <= 2"
        )
        .await,
        "UPDATE 2"
    );
    assert_eq!(
        ok(&mut s, "DELETE FROM acct WHERE id = 3").await,
        "DELETE 1"
    );
    assert_eq!(
        ok(&mut s, "DELETE FROM acct WHERE id = 99").await,
        "DELETE 0"
    );
    assert_eq!(
        rows(&mut s, "SELECT id, owner, balance FROM acct ORDER BY id").await,
        table(&[&["1", "ann", "15"], &["2", "bob", "25"]])
    );
    fails(
        &mut s,
        "UPDATE acct SET owner = NULL WHERE id = 1",
        sqlstate::NOT_NULL_VIOLATION,
    )
    .await;
    db.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn duplicate_primary_key_is_23505() {
    let (db, mut s) = setup().await;
    script(&mut s, ACCOUNTS).await;
    script(&mut s, "INSERT INTO acct VALUES (1, 'ann', 10)").await;
    fails(
        &mut s,
        "INSERT INTO acct VALUES (1, 'again', 0)",
        sqlstate::UNIQUE_VIOLATION,
    )
    .await;
    // two rows of one statement colliding with each other
    fails(
        &mut s,
        "INSERT INTO acct VALUES (2, 'x', 0), (2, 'y', 0)",
        sqlstate::UNIQUE_VIOLATION,
    )
    .await;
    // an UPDATE moving a row onto an existing key
    script(&mut s, "INSERT INTO acct VALUES (3, 'cy', 30)").await;
    fails(
        &mut s,
        "UPDATE acct SET id = 1 WHERE id = 3",
        sqlstate::UNIQUE_VIOLATION,
    )
    .await;
    assert_eq!(
        rows(&mut s, "SELECT id, owner FROM acct ORDER BY id").await,
        table(&[&["1", "ann"], &["3", "cy"]])
    );
    db.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_conflict_do_update_upserts() {
    let (db, mut s) = setup().await;
    script(
        &mut s,
        "CREATE TABLE counts (customer text PRIMARY KEY, total bigint, last_offset bigint)",
    )
    .await;
    let upsert = "INSERT INTO counts VALUES ('ann', 10, 41) ON CONFLICT (customer) \
                  DO UPDATE SET total = counts.total + 10, last_offset = 41";
    assert_eq!(ok(&mut s, upsert).await, "INSERT 0 1");
    assert_eq!(ok(&mut s, upsert).await, "INSERT 0 1");
    assert_eq!(
        ok(
            &mut s,
            "INSERT INTO counts VALUES ('ann', 0, 0) ON CONFLICT DO NOTHING"
        )
        .await,
        "INSERT 0 0"
    );
    assert_eq!(
        rows(&mut s, "SELECT customer, total, last_offset FROM counts").await,
        table(&[&["ann", "20", "41"]])
    );
    db.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_refuse_update_and_general_delete_with_0a000() {
    let (db, mut s) = setup().await;
    six_events(&mut s).await;
    let e = fails(
        &mut s,
        "UPDATE ev SET note = 'x' WHERE offset = 0",
        sqlstate::FEATURE_NOT_SUPPORTED,
    )
    .await;
    assert!(e.message.contains("append-only"), "{}", e.message);
    let e = fails(
        &mut s,
        "DELETE FROM ev WHERE note = 'odd'",
        sqlstate::FEATURE_NOT_SUPPORTED,
    )
    .await;
    assert!(e.message.contains("append-only"), "{}", e.message);
    fails(&mut s, "DELETE FROM ev", sqlstate::FEATURE_NOT_SUPPORTED).await;
    fails(
        &mut s,
        "UPDATE nowhere SET x = 1",
        sqlstate::UNDEFINED_TABLE,
    )
    .await;
    assert_eq!(scalar(&mut s, "SELECT count(*) FROM ev").await, "6");
    db.close().await;
}

// ---------------------------------------------------------------------------
// Prefix truncation
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delete_below_an_offset_truncates_the_prefix() {
    let (db, mut s) = setup().await;
    six_events(&mut s).await;
    assert_eq!(
        ok(&mut s, "DELETE FROM ev WHERE offset < 3").await,
        "DELETE 3"
    );
    assert_eq!(
        rows(&mut s, "SELECT offset, n FROM ev").await,
        table(&[&["3", "40"], &["4", "50"], &["5", "60"]])
    );
    assert_eq!(
        scalar(&mut s, "SELECT count(*) FROM ev WHERE offset < 3").await,
        "0"
    );
    // offsets are never reused
    script(&mut s, "INSERT INTO ev VALUES (70, 'odd')").await;
    assert_eq!(scalar(&mut s, "SELECT max(offset) FROM ev").await, "6");
    let shown = rows(&mut s, "SHOW STREAMS").await;
    assert_eq!((&shown[0][1][..], &shown[0][2][..]), ("3", "7"));
    // truncating below the current start removes nothing
    assert_eq!(
        ok(&mut s, "DELETE FROM ev WHERE offset <= 1").await,
        "DELETE 0"
    );
    db.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tail_below_the_first_offset_is_22023() {
    let (db, mut s) = setup().await;
    six_events(&mut s).await;
    script(&mut s, "DELETE FROM ev WHERE offset < 4").await;
    script(&mut s, "SET tail_wait = '100ms'").await;
    script(&mut s, "BEGIN").await;
    let r = exec(
        &mut s,
        "DECLARE c CURSOR FOR SELECT n FROM ev WHERE offset >= 1; FETCH 10 FROM c",
    )
    .await;
    let e = r.expect_err("a tail from a truncated offset");
    assert_eq!(e.code, sqlstate::INVALID_PARAMETER_VALUE, "{}", e.message);
    assert!(e.message.contains('4'), "{}", e.message);
    script(&mut s, "ROLLBACK").await;
    db.close().await;
}

/// A tail keeps the columns it started with across `ALTER STREAM ... ADD COLUMN`, whether it
/// reads frames directly (`SELECT *` bounded by offset only) or plans each chunk (another
/// predicate, or any tail inside a block); a direct tail keeps its columns across a RENAME
/// COLUMN too, while a planned one that names the renamed column ends with its error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tails_keep_their_columns_across_add_column() {
    let (db, mut s) = setup().await;
    let mut w = db.session();
    script(
        &mut w,
        "CREATE STREAM tc (n bigint); INSERT INTO tc VALUES (1)",
    )
    .await;
    // cursors WITH HOLD outside a block: `d` reads frames directly, `p` plans each chunk
    script(&mut s, "SET tail_wait = '100ms'").await;
    script(
        &mut s,
        "DECLARE d CURSOR WITH HOLD FOR SELECT * FROM tc WHERE offset >= 0; \
         DECLARE p CURSOR WITH HOLD FOR SELECT * FROM tc WHERE offset >= 0 AND n > 0",
    )
    .await;
    let ns = |rows: Vec<Vec<String>>| -> Vec<(usize, String)> {
        rows.into_iter().map(|r| (r.len(), r[2].clone())).collect()
    };
    assert_eq!(ns(rows(&mut s, "FETCH 10 FROM d").await), [(3, "1".into())]);
    assert_eq!(ns(rows(&mut s, "FETCH 10 FROM p").await), [(3, "1".into())]);
    script(
        &mut w,
        "ALTER STREAM tc ADD COLUMN tag text DEFAULT 'x'; INSERT INTO tc VALUES (2, 'y')",
    )
    .await;
    assert_eq!(ns(rows(&mut s, "FETCH 10 FROM d").await), [(3, "2".into())]);
    assert_eq!(ns(rows(&mut s, "FETCH 10 FROM p").await), [(3, "2".into())]);
    script(
        &mut w,
        "ALTER STREAM tc RENAME COLUMN n TO m; INSERT INTO tc VALUES (3, 'z')",
    )
    .await;
    assert_eq!(ns(rows(&mut s, "FETCH 10 FROM d").await), [(3, "3".into())]);
    fails(&mut s, "FETCH 10 FROM p", "42703").await;
    db.close().await;
}

// ---------------------------------------------------------------------------
// Transactions
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn begin_commit_and_rollback_move_the_status() {
    let (db, mut s) = setup().await;
    assert_eq!(s.status(), TxnStatus::Idle);
    assert_eq!(ok(&mut s, "BEGIN").await, "BEGIN");
    assert_eq!(s.status(), TxnStatus::InBlock);
    assert_eq!(scalar(&mut s, "SELECT 1").await, "1");
    assert_eq!(s.status(), TxnStatus::InBlock);
    assert_eq!(ok(&mut s, "COMMIT").await, "COMMIT");
    assert_eq!(s.status(), TxnStatus::Idle);
    assert_eq!(
        ok(&mut s, "START TRANSACTION ISOLATION LEVEL SERIALIZABLE").await,
        "BEGIN"
    );
    assert_eq!(s.status(), TxnStatus::InBlock);
    assert_eq!(ok(&mut s, "ROLLBACK").await, "ROLLBACK");
    assert_eq!(s.status(), TxnStatus::Idle);
    db.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_error_aborts_the_block_until_rollback() {
    let (db, mut s) = setup().await;
    script(&mut s, EVENTS).await;
    script(&mut s, "BEGIN").await;
    script(&mut s, "INSERT INTO ev VALUES (1, 'lost')").await;
    fails(&mut s, "SELECT * FROM nowhere", sqlstate::UNDEFINED_TABLE).await;
    assert_eq!(s.status(), TxnStatus::Failed);
    fails(&mut s, "SELECT 1", sqlstate::IN_FAILED_TRANSACTION).await;
    fails(
        &mut s,
        "INSERT INTO ev VALUES (2, 'lost')",
        sqlstate::IN_FAILED_TRANSACTION,
    )
    .await;
    assert_eq!(s.status(), TxnStatus::Failed);
    assert_eq!(ok(&mut s, "ROLLBACK").await, "ROLLBACK");
    assert_eq!(s.status(), TxnStatus::Idle);
    assert_eq!(scalar(&mut s, "SELECT count(*) FROM ev").await, "0");
    db.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commit_of_a_failed_block_rolls_back() {
    let (db, mut s) = setup().await;
    script(&mut s, EVENTS).await;
    script(&mut s, "BEGIN").await;
    script(&mut s, "INSERT INTO ev VALUES (1, 'lost')").await;
    fails(&mut s, "SELECT 1/0", sqlstate::DIVISION_BY_ZERO).await;
    assert_eq!(s.status(), TxnStatus::Failed);
    // PostgreSQL answers COMMIT of an aborted block with ROLLBACK
    assert_eq!(ok(&mut s, "COMMIT").await, "ROLLBACK");
    assert_eq!(s.status(), TxnStatus::Idle);
    assert_eq!(scalar(&mut s, "SELECT count(*) FROM ev").await, "0");
    db.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_error_outside_a_block_leaves_the_session_idle() {
    let (db, mut s) = setup().await;
    fails(&mut s, "SELECT * FROM nowhere", sqlstate::UNDEFINED_TABLE).await;
    assert_eq!(s.status(), TxnStatus::Idle);
    assert_eq!(scalar(&mut s, "SELECT 2").await, "2");
    db.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rolled_back_appends_are_never_visible() {
    let db = Db::open().await;
    let mut s = db.session();
    let mut other = db.session();
    script(&mut s, EVENTS).await;
    script(&mut s, "BEGIN").await;
    script(&mut s, "INSERT INTO ev VALUES (1, 'a'), (2, 'b')").await;
    assert_eq!(scalar(&mut other, "SELECT count(*) FROM ev").await, "0");
    script(&mut s, "ROLLBACK").await;
    assert_eq!(scalar(&mut s, "SELECT count(*) FROM ev").await, "0");
    assert_eq!(scalar(&mut other, "SELECT count(*) FROM ev").await, "0");
    // the offsets the rolled-back rows would have had are still free
    script(&mut s, "INSERT INTO ev VALUES (3, 'c')").await;
    assert_eq!(
        rows(&mut other, "SELECT offset, n FROM ev").await,
        table(&[&["0", "3"]])
    );
    db.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn committed_block_appears_all_at_once() {
    let db = Db::open().await;
    let mut s = db.session();
    let mut other = db.session();
    script(&mut s, EVENTS).await;
    script(&mut s, "CREATE STREAM audit (who text)").await;
    script(&mut s, ACCOUNTS).await;
    script(&mut s, "BEGIN").await;
    script(&mut s, "INSERT INTO ev VALUES (1, 'a')").await;
    script(&mut s, "INSERT INTO ev VALUES (2, 'b')").await;
    script(&mut s, "INSERT INTO audit VALUES ('me')").await;
    script(&mut s, "INSERT INTO acct VALUES (1, 'ann', 5)").await;
    assert_eq!(scalar(&mut other, "SELECT count(*) FROM ev").await, "0");
    assert_eq!(scalar(&mut other, "SELECT count(*) FROM acct").await, "0");
    assert_eq!(ok(&mut s, "COMMIT").await, "COMMIT");
    assert_eq!(
        rows(&mut other, "SELECT offset, n FROM ev").await,
        table(&[&["0", "1"], &["1", "2"]])
    );
    assert_eq!(scalar(&mut other, "SELECT who FROM audit").await, "me");
    assert_eq!(
        scalar(&mut other, "SELECT owner FROM acct WHERE id = 1").await,
        "ann"
    );
    db.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_block_reads_its_own_table_writes() {
    let db = Db::open().await;
    let mut s = db.session();
    let mut other = db.session();
    script(&mut s, ACCOUNTS).await;
    script(&mut s, "INSERT INTO acct VALUES (1, 'ann', 10)").await;
    script(&mut s, "BEGIN").await;
    script(&mut s, "UPDATE acct SET balance = 99 WHERE id = 1").await;
    script(&mut s, "INSERT INTO acct VALUES (2, 'bob', 1)").await;
    assert_eq!(
        rows(&mut s, "SELECT id, balance FROM acct ORDER BY id").await,
        table(&[&["1", "99"], &["2", "1"]])
    );
    assert_eq!(
        rows(&mut other, "SELECT id, balance FROM acct ORDER BY id").await,
        table(&[&["1", "10"]])
    );
    script(&mut s, "ROLLBACK").await;
    assert_eq!(
        rows(&mut s, "SELECT id, balance FROM acct ORDER BY id").await,
        table(&[&["1", "10"]])
    );
    db.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_concurrent_change_to_what_a_block_read_is_40001() {
    let db = Db::open().await;
    let mut s = db.session();
    let mut other = db.session();
    script(&mut s, ACCOUNTS).await;
    script(&mut s, "INSERT INTO acct VALUES (1, 'ann', 10)").await;
    script(&mut s, "BEGIN").await;
    assert_eq!(
        scalar(&mut s, "SELECT balance FROM acct WHERE id = 1").await,
        "10"
    );
    script(&mut other, "UPDATE acct SET balance = 0 WHERE id = 1").await;
    script(&mut s, "UPDATE acct SET balance = 11 WHERE id = 1").await;
    fails(&mut s, "COMMIT", sqlstate::SERIALIZATION_FAILURE).await;
    assert_eq!(s.status(), TxnStatus::Idle);
    assert_eq!(
        scalar(&mut s, "SELECT balance FROM acct WHERE id = 1").await,
        "0"
    );
    db.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rollback_to_savepoint_drops_later_writes() {
    let (db, mut s) = setup().await;
    script(&mut s, EVENTS).await;
    script(&mut s, "BEGIN").await;
    script(&mut s, "INSERT INTO ev VALUES (1, 'kept')").await;
    assert_eq!(ok(&mut s, "SAVEPOINT sp").await, "SAVEPOINT");
    script(&mut s, "INSERT INTO ev VALUES (2, 'dropped')").await;
    assert_eq!(ok(&mut s, "ROLLBACK TO SAVEPOINT sp").await, "ROLLBACK");
    assert_eq!(s.status(), TxnStatus::InBlock);
    script(&mut s, "INSERT INTO ev VALUES (3, 'kept too')").await;
    script(&mut s, "COMMIT").await;
    assert_eq!(
        rows(&mut s, "SELECT offset, n FROM ev").await,
        table(&[&["0", "1"], &["1", "3"]])
    );
    db.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rollback_to_savepoint_recovers_a_failed_block() {
    let (db, mut s) = setup().await;
    script(&mut s, ACCOUNTS).await;
    script(&mut s, "BEGIN").await;
    script(&mut s, "INSERT INTO acct VALUES (1, 'ann', 10)").await;
    script(&mut s, "SAVEPOINT before_dup").await;
    fails(
        &mut s,
        "INSERT INTO acct VALUES (1, 'dup', 0)",
        sqlstate::UNIQUE_VIOLATION,
    )
    .await;
    assert_eq!(s.status(), TxnStatus::Failed);
    fails(&mut s, "SELECT 1", sqlstate::IN_FAILED_TRANSACTION).await;
    script(&mut s, "ROLLBACK TO before_dup").await;
    assert_eq!(s.status(), TxnStatus::InBlock);
    script(&mut s, "INSERT INTO acct VALUES (2, 'bob', 20)").await;
    assert_eq!(ok(&mut s, "COMMIT").await, "COMMIT");
    assert_eq!(
        rows(&mut s, "SELECT id, owner FROM acct ORDER BY id").await,
        table(&[&["1", "ann"], &["2", "bob"]])
    );
    db.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_forgets_the_savepoint() {
    let (db, mut s) = setup().await;
    script(&mut s, EVENTS).await;
    script(&mut s, "BEGIN").await;
    script(&mut s, "SAVEPOINT a").await;
    script(&mut s, "INSERT INTO ev VALUES (1, 'x')").await;
    assert_eq!(ok(&mut s, "RELEASE SAVEPOINT a").await, "RELEASE");
    assert_eq!(s.status(), TxnStatus::InBlock);
    fails(
        &mut s,
        "ROLLBACK TO SAVEPOINT a",
        sqlstate::INVALID_SAVEPOINT,
    )
    .await;
    // as in PostgreSQL, the failed ROLLBACK TO aborts the block
    assert_eq!(s.status(), TxnStatus::Failed);
    script(&mut s, "ROLLBACK").await;
    fails(
        &mut s,
        "RELEASE SAVEPOINT nope",
        sqlstate::NO_ACTIVE_SQL_TRANSACTION,
    )
    .await;
    db.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn savepoint_outside_a_block_is_25p01() {
    let (db, mut s) = setup().await;
    fails(&mut s, "SAVEPOINT sp", sqlstate::NO_ACTIVE_SQL_TRANSACTION).await;
    fails(
        &mut s,
        "ROLLBACK TO SAVEPOINT sp",
        sqlstate::NO_ACTIVE_SQL_TRANSACTION,
    )
    .await;
    assert_eq!(s.status(), TxnStatus::Idle);
    // COMMIT and ROLLBACK without a block only warn in PostgreSQL
    assert_eq!(ok(&mut s, "COMMIT").await, "COMMIT");
    assert_eq!(ok(&mut s, "ROLLBACK").await, "ROLLBACK");
    assert_eq!(s.status(), TxnStatus::Idle);
    db.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_simple_query_stops_at_its_first_error() {
    let (db, mut s) = setup().await;
    script(&mut s, EVENTS).await;
    let results = s
        .simple_query(
            "INSERT INTO ev VALUES (1, 'a'); SELECT * FROM nowhere; INSERT INTO ev VALUES (2, 'b')",
        )
        .await;
    assert_eq!(results.len(), 2, "{results:?}");
    assert!(matches!(&results[0], Ok(Output::Tag(t)) if t == "INSERT 0 1"));
    assert!(
        matches!(&results[1], Err(e) if e.code == sqlstate::UNDEFINED_TABLE),
        "{:?}",
        results[1]
    );
    drop(results);
    // the statements were one implicit transaction: the error undid the INSERT
    // (each committed on its own before, and the count was 1)
    assert_eq!(scalar(&mut s, "SELECT count(*) FROM ev").await, "0");
    assert_eq!(s.status(), TxnStatus::Idle);
    db.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_simple_query_answers_returning_after_its_commit() {
    let (db, mut s) = setup().await;
    script(&mut s, EVENTS).await;
    let results = s
        .simple_query(
            "INSERT INTO ev VALUES (1, 'a') RETURNING offset, n; \
             INSERT INTO ev VALUES (2, 'b'), (3, 'c') RETURNING offset, n",
        )
        .await;
    let mut offsets = Vec::new();
    for r in results {
        let Ok(Output::Rows { mut stream, .. }) = r else {
            panic!("expected rows, got {r:?}");
        };
        while let Some(batch) = stream.next().await {
            let batch = batch.expect("rows");
            for i in 0..batch.num_rows() {
                offsets.push((cell(batch.column(0), i), cell(batch.column(1), i)));
            }
        }
    }
    let want = [("0", "1"), ("1", "2"), ("2", "3")].map(|(o, n)| (o.to_string(), n.to_string()));
    assert_eq!(offsets, want);
    // inside BEGIN the client waits for the rows before COMMIT: they come at once with
    // offset NULL, and sluice_last_offsets() has the offsets after COMMIT (before: 0A000)
    script(&mut s, "BEGIN").await;
    assert_eq!(
        scalar(
            &mut s,
            "INSERT INTO ev VALUES (4, 'd') RETURNING offset IS NULL"
        )
        .await,
        "true"
    );
    script(&mut s, "COMMIT").await;
    assert_eq!(
        scalar(&mut s, "SELECT offset FROM sluice_last_offsets()").await,
        "3"
    );
    assert_eq!(scalar(&mut s, "SELECT count(*) FROM ev").await, "4");
    db.close().await;
}

// ---------------------------------------------------------------------------
// Settings and read-only transactions
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn set_show_and_reset() {
    let (db, mut s) = setup().await;
    assert_eq!(scalar(&mut s, "SHOW application_name").await, "");
    assert_eq!(ok(&mut s, "SET application_name = 'probe'").await, "SET");
    assert_eq!(scalar(&mut s, "SHOW application_name").await, "probe");
    assert_eq!(s.setting("application_name").as_deref(), Some("probe"));
    assert_eq!(
        columns(&mut s, "SHOW application_name").await,
        ["application_name"]
    );
    assert_eq!(ok(&mut s, "RESET application_name").await, "RESET");
    assert_eq!(scalar(&mut s, "SHOW application_name").await, "");
    script(&mut s, "SET TIME ZONE 'UTC'; SET tail_wait = '2s'").await;
    assert_eq!(scalar(&mut s, "SHOW tail_wait").await, "2s");
    script(&mut s, "RESET ALL").await;
    assert_eq!(scalar(&mut s, "SHOW tail_wait").await, "10s");
    assert_eq!(
        scalar(&mut s, "SELECT current_setting('server_version')").await,
        sluice_sql::SERVER_VERSION
    );
    db.close().await;
}

/// Before: a quote doubled inside a quoted identifier (`"a ""b"""`) was a syntax error: the
/// token rewrite printed the identifier's value with its quotes undoubled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quotes_doubled_inside_quoted_identifiers_are_kept() {
    let (db, mut s) = setup().await;
    script(
        &mut s,
        r#"CREATE STREAM "a ""b""" (v int); INSERT INTO "a ""b""" (v) VALUES (7)"#,
    )
    .await;
    assert_eq!(scalar(&mut s, r#"SELECT v FROM "a ""b""""#).await, "7");
    assert_eq!(
        scalar(&mut s, "SELECT name FROM sluice_streams").await,
        r#"a "b""#
    );
    assert_eq!(columns(&mut s, r#"SELECT 1 AS "x""y""#).await, [r#"x"y"#]);
    db.close().await;
}

/// Before: any name could be SET (`SET no_such_setting = 1` answered SET). Now, as in
/// PostgreSQL, an unknown name is 42704; PostgreSQL's own parameters and custom `a.b` names
/// are still accepted, so drivers' SETs keep working.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_settings_are_42704_and_postgres_and_custom_ones_are_accepted() {
    let (db, mut s) = setup().await;
    let e = fails(&mut s, "SET no_such_setting = 1", "42704").await;
    assert_eq!(
        e.message,
        "unrecognized configuration parameter \"no_such_setting\""
    );
    fails(
        &mut s,
        "SELECT set_config('no_such_setting', '1', false)",
        "42704",
    )
    .await;
    assert!(
        s.set_setting("work_mme", "4MB").is_err(),
        "a startup option"
    );
    for sql in [
        "SET extra_float_digits = 3",
        "SET work_mem = '64MB'",
        "SET DateStyle = 'ISO'",
        "SET SESSION CHARACTERISTICS AS TRANSACTION ISOLATION LEVEL READ COMMITTED",
        "SET myapp.tenant = 'acme'",
    ] {
        assert_eq!(ok(&mut s, sql).await, "SET", "{sql}");
    }
    assert_eq!(scalar(&mut s, "SHOW myapp.tenant").await, "acme");
    db.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reset_returns_to_the_startup_value() {
    let (db, mut s) = setup().await;
    s.set_setting("application_name", "from-startup")
        .expect("startup setting");
    assert_eq!(
        scalar(&mut s, "SHOW application_name").await,
        "from-startup"
    );
    script(&mut s, "SET application_name = 'changed'").await;
    script(&mut s, "RESET application_name").await;
    assert_eq!(
        scalar(&mut s, "SHOW application_name").await,
        "from-startup"
    );
    let e = s
        .set_setting("statement_timeout", "forever")
        .expect_err("a bad startup value");
    assert_eq!(e.code, sqlstate::INVALID_PARAMETER_VALUE);
    db.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_and_fixed_parameters() {
    let (db, mut s) = setup().await;
    let e = fails(&mut s, "SHOW no_such_setting", sqlstate::UNDEFINED_OBJECT).await;
    assert!(e.message.contains("no_such_setting"), "{}", e.message);
    fails(
        &mut s,
        "SET server_version = '9.0'",
        sqlstate::CANT_CHANGE_RUNTIME_PARAM,
    )
    .await;
    assert_eq!(
        scalar(&mut s, "SHOW server_version").await,
        sluice_sql::SERVER_VERSION
    );
    db.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn statement_timeout_is_parsed_and_shown_as_postgresql_does() {
    let (db, mut s) = setup().await;
    assert_eq!(scalar(&mut s, "SHOW statement_timeout").await, "0");
    for (value, shown) in [
        ("2000", "2s"),
        ("'250ms'", "250ms"),
        ("'90s'", "90s"),
        ("'1min'", "1min"),
        ("0", "0"),
    ] {
        script(&mut s, &format!("SET statement_timeout = {value}")).await;
        assert_eq!(
            scalar(&mut s, "SHOW statement_timeout").await,
            shown,
            "{value}"
        );
    }
    fails(
        &mut s,
        "SET statement_timeout = 'soon'",
        sqlstate::INVALID_PARAMETER_VALUE,
    )
    .await;
    fails(
        &mut s,
        "SET statement_timeout = '3000000000'",
        sqlstate::INVALID_PARAMETER_VALUE,
    )
    .await;
    assert_eq!(scalar(&mut s, "SHOW statement_timeout").await, "0");
    db.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn statement_timeout_stops_a_long_query_with_57014() {
    let (db, mut s) = setup().await;
    script(&mut s, "SET statement_timeout = '200ms'").await;
    let started = std::time::Instant::now();
    fails(
        &mut s,
        "SELECT count(*) FROM generate_series(1, 100000) a, generate_series(1, 100000) b",
        sqlstate::QUERY_CANCELED,
    )
    .await;
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "took {:?}",
        started.elapsed()
    );
    assert_eq!(s.status(), TxnStatus::Idle);
    script(&mut s, "SET statement_timeout = 0").await;
    assert_eq!(scalar(&mut s, "SELECT 3").await, "3");
    db.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_only_transaction_refuses_writes_with_25006() {
    let (db, mut s) = setup().await;
    script(&mut s, EVENTS).await;
    script(&mut s, ACCOUNTS).await;
    script(&mut s, "BEGIN READ ONLY").await;
    assert_eq!(scalar(&mut s, "SHOW transaction_read_only").await, "on");
    assert_eq!(scalar(&mut s, "SELECT count(*) FROM ev").await, "0");
    fails(
        &mut s,
        "INSERT INTO ev VALUES (1, 'x')",
        sqlstate::READ_ONLY_SQL_TRANSACTION,
    )
    .await;
    script(&mut s, "ROLLBACK").await;
    for write in [
        "INSERT INTO acct VALUES (1, 'a', 1)",
        "UPDATE acct SET balance = 1",
        "DELETE FROM acct",
        "DELETE FROM ev WHERE offset < 1",
        "CREATE STREAM other (x int)",
        "DROP TABLE acct",
    ] {
        script(&mut s, "START TRANSACTION READ ONLY").await;
        fails(&mut s, write, sqlstate::READ_ONLY_SQL_TRANSACTION).await;
        script(&mut s, "ROLLBACK").await;
    }
    assert_eq!(scalar(&mut s, "SHOW transaction_read_only").await, "off");
    script(&mut s, "INSERT INTO ev VALUES (1, 'x')").await;
    db.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn default_transaction_read_only_applies_to_every_transaction() {
    let (db, mut s) = setup().await;
    script(&mut s, EVENTS).await;
    script(&mut s, "SET default_transaction_read_only = on").await;
    assert_eq!(
        scalar(&mut s, "SHOW default_transaction_read_only").await,
        "on"
    );
    fails(
        &mut s,
        "INSERT INTO ev VALUES (1, 'x')",
        sqlstate::READ_ONLY_SQL_TRANSACTION,
    )
    .await;
    script(&mut s, "BEGIN").await;
    fails(
        &mut s,
        "INSERT INTO ev VALUES (1, 'x')",
        sqlstate::READ_ONLY_SQL_TRANSACTION,
    )
    .await;
    script(&mut s, "ROLLBACK").await;
    // an explicit READ WRITE overrides the default
    script(&mut s, "BEGIN READ WRITE").await;
    script(&mut s, "INSERT INTO ev VALUES (1, 'x')").await;
    script(&mut s, "COMMIT").await;
    assert_eq!(scalar(&mut s, "SELECT count(*) FROM ev").await, "1");
    db.close().await;
}

/// A session keeps what it derives from its settings between statements (issue 25); a
/// change by `set_config` inside a query, by SET or by RESET ALL is seen by the next
/// statement all the same.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn settings_changed_by_set_config_or_reset_apply_to_the_next_statement() {
    let (db, mut s) = setup().await;
    script(&mut s, EVENTS).await;
    script(&mut s, "INSERT INTO ev VALUES (1, 'x')").await;
    assert_eq!(scalar(&mut s, "SHOW transaction_read_only").await, "off");
    scalar(
        &mut s,
        "SELECT set_config('default_transaction_read_only', 'on', false)",
    )
    .await;
    fails(
        &mut s,
        "INSERT INTO ev VALUES (2, 'x')",
        sqlstate::READ_ONLY_SQL_TRANSACTION,
    )
    .await;
    assert_eq!(scalar(&mut s, "SHOW transaction_read_only").await, "on");
    script(&mut s, "RESET ALL").await;
    script(&mut s, "INSERT INTO ev VALUES (3, 'x')").await;
    assert_eq!(scalar(&mut s, "SHOW transaction_read_only").await, "off");
    // the statement memory limit follows max_statement_memory, set by a function too
    scalar(
        &mut s,
        "SELECT set_config('max_statement_memory', '32MB', false)",
    )
    .await;
    fails(
        &mut s,
        "SELECT count(DISTINCT a * 3000 + b) \
         FROM generate_series(1, 3000) AS x(a), generate_series(1, 3000) AS y(b)",
        sqlstate::OUT_OF_MEMORY,
    )
    .await;
    db.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_write_mode_must_be_set_before_any_query_25001() {
    let (db, mut s) = setup().await;
    script(&mut s, EVENTS).await;
    script(&mut s, "BEGIN READ ONLY").await;
    script(&mut s, "SELECT count(*) FROM ev").await;
    fails(
        &mut s,
        "SET TRANSACTION READ WRITE",
        sqlstate::ACTIVE_SQL_TRANSACTION,
    )
    .await;
    script(&mut s, "ROLLBACK").await;
    // before any query it may still change
    script(&mut s, "BEGIN READ ONLY").await;
    script(&mut s, "SET TRANSACTION READ WRITE").await;
    script(&mut s, "INSERT INTO ev VALUES (1, 'x')").await;
    script(&mut s, "COMMIT").await;
    assert_eq!(scalar(&mut s, "SELECT count(*) FROM ev").await, "1");
    db.close().await;
}

// ---------------------------------------------------------------------------
// Hostile input
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_statement_nested_past_the_limit_is_54001() {
    let (db, mut s) = setup().await;
    let depth = 1100;
    let sql = format!("SELECT {}1{}", "(".repeat(depth), ")".repeat(depth));
    fails(&mut s, &sql, sqlstate::STATEMENT_TOO_COMPLEX).await;
    let chain = format!("SELECT 1{}", " + 1".repeat(400));
    fails(&mut s, &chain, sqlstate::STATEMENT_TOO_COMPLEX).await;
    // a modest nesting still works
    let sql = format!("SELECT {}1{}", "(".repeat(20), ")".repeat(20));
    assert_eq!(scalar(&mut s, &sql).await, "1");
    db.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_syntax_error_is_42601_and_aborts_a_block() {
    let (db, mut s) = setup().await;
    fails(&mut s, "SELEC 1", sqlstate::SYNTAX_ERROR).await;
    fails(&mut s, "SELECT (1", sqlstate::SYNTAX_ERROR).await;
    assert_eq!(s.status(), TxnStatus::Idle);
    script(&mut s, "BEGIN").await;
    fails(&mut s, "INSRT INTO x VALUES (1)", sqlstate::SYNTAX_ERROR).await;
    assert_eq!(s.status(), TxnStatus::Failed);
    script(&mut s, "ROLLBACK").await;
    db.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_empty_query_has_no_statements() {
    let (db, mut s) = setup().await;
    for sql in ["", "   ", ";", " ; ;", "-- only a comment"] {
        let parsed = s.parse_query(sql).await.expect("empty query parses");
        assert!(parsed.is_empty(), "{sql:?}: {parsed:?}");
        assert!(s.simple_query(sql).await.is_empty(), "{sql:?}");
    }
    assert_eq!(s.status(), TxnStatus::Idle);
    db.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn division_by_zero_is_22012() {
    let (db, mut s) = setup().await;
    six_events(&mut s).await;
    fails(&mut s, "SELECT 1/0", sqlstate::DIVISION_BY_ZERO).await;
    fails(&mut s, "SELECT 1.5::float8 / 0", sqlstate::DIVISION_BY_ZERO).await;
    fails(
        &mut s,
        "SELECT n / (n - n) FROM ev",
        sqlstate::DIVISION_BY_ZERO,
    )
    .await;
    fails(&mut s, "SELECT n % 0 FROM ev", sqlstate::DIVISION_BY_ZERO).await;
    db.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn integer_overflow_is_22003() {
    let (db, mut s) = setup().await;
    script(&mut s, EVENTS).await;
    script(
        &mut s,
        "INSERT INTO ev VALUES (9223372036854775807, 'max'), (1, 'one')",
    )
    .await;
    fails(
        &mut s,
        "SELECT 9223372036854775807::bigint + 1",
        sqlstate::NUMERIC_VALUE_OUT_OF_RANGE,
    )
    .await;
    fails(
        &mut s,
        "SELECT n * 2 FROM ev",
        sqlstate::NUMERIC_VALUE_OUT_OF_RANGE,
    )
    .await;
    fails(
        &mut s,
        "SELECT sum(n) FROM ev",
        sqlstate::NUMERIC_VALUE_OUT_OF_RANGE,
    )
    .await;
    fails(
        &mut s,
        "SELECT 2147483647::int4 + 1::int4",
        sqlstate::NUMERIC_VALUE_OUT_OF_RANGE,
    )
    .await;
    db.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oversized_value_is_refused_with_54000() {
    let (db, mut s) = setup().await;
    fails(
        &mut s,
        "SELECT repeat('x', 2147483647)",
        sqlstate::PROGRAM_LIMIT_EXCEEDED,
    )
    .await;
    fails(
        &mut s,
        "SELECT length(lpad('', 2000000000, 'ab'))",
        sqlstate::PROGRAM_LIMIT_EXCEEDED,
    )
    .await;
    assert_eq!(
        scalar(&mut s, "SELECT length(repeat('x', 1000))").await,
        "1000"
    );
    db.close().await;
}

// ---------------------------------------------------------------------------
// Cursors
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn declare_fetch_close_in_a_block() {
    let (db, mut s) = setup().await;
    six_events(&mut s).await;
    script(&mut s, "BEGIN").await;
    assert_eq!(
        ok(&mut s, "DECLARE c CURSOR FOR SELECT n FROM ev ORDER BY n").await,
        "DECLARE CURSOR"
    );
    let first = one(&mut s, "FETCH 2 FROM c").await;
    assert_eq!(first.tag(), "FETCH 2");
    assert_eq!(rows_of(first), table(&[&["10"], &["20"]]));
    assert_eq!(
        rows(&mut s, "FETCH ALL FROM c").await,
        table(&[&["30"], &["40"], &["50"], &["60"]])
    );
    assert_eq!(one(&mut s, "FETCH 1 FROM c").await.tag(), "FETCH 0");
    assert_eq!(ok(&mut s, "CLOSE c").await, "CLOSE CURSOR");
    fails(&mut s, "FETCH 1 FROM c", sqlstate::INVALID_CURSOR_NAME).await;
    script(&mut s, "ROLLBACK").await;
    db.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cursors_end_with_their_block_unless_held() {
    let (db, mut s) = setup().await;
    six_events(&mut s).await;
    fails(
        &mut s,
        "DECLARE c CURSOR FOR SELECT n FROM ev",
        sqlstate::NO_ACTIVE_SQL_TRANSACTION,
    )
    .await;
    script(&mut s, "BEGIN").await;
    script(&mut s, "DECLARE c CURSOR FOR SELECT n FROM ev ORDER BY n").await;
    fails(
        &mut s,
        "DECLARE c CURSOR FOR SELECT 1",
        sqlstate::DUPLICATE_CURSOR,
    )
    .await;
    script(&mut s, "ROLLBACK").await;
    script(&mut s, "BEGIN").await;
    script(&mut s, "DECLARE c CURSOR FOR SELECT n FROM ev ORDER BY n").await;
    script(
        &mut s,
        "DECLARE h CURSOR WITH HOLD FOR SELECT n FROM ev ORDER BY n",
    )
    .await;
    script(&mut s, "COMMIT").await;
    fails(&mut s, "FETCH 1 FROM c", sqlstate::INVALID_CURSOR_NAME).await;
    assert_eq!(rows(&mut s, "FETCH 1 FROM h").await, table(&[&["10"]]));
    assert_eq!(ok(&mut s, "CLOSE ALL").await, "CLOSE CURSOR ALL");
    fails(&mut s, "FETCH 1 FROM h", sqlstate::INVALID_CURSOR_NAME).await;
    fails(&mut s, "CLOSE h", sqlstate::INVALID_CURSOR_NAME).await;
    db.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tailing_cursor_returns_rows_as_they_commit() {
    let db = Db::open().await;
    let mut s = db.session();
    let mut writer = db.session();
    script(&mut s, EVENTS).await;
    script(&mut s, "INSERT INTO ev VALUES (1, 'a'), (2, 'b')").await;
    script(&mut s, "SET tail_wait = '100ms'").await;
    script(
        &mut s,
        "DECLARE t CURSOR WITH HOLD FOR SELECT offset, n FROM ev WHERE offset >= 1",
    )
    .await;
    assert_eq!(rows(&mut s, "FETCH 10 FROM t").await, table(&[&["1", "2"]]));
    // nothing new: FETCH waits tail_wait, then returns no rows
    assert_eq!(rows(&mut s, "FETCH 10 FROM t").await.len(), 0);
    script(&mut writer, "INSERT INTO ev VALUES (3, 'c'), (4, 'd')").await;
    let mut got = Vec::new();
    for _ in 0..50 {
        got.extend(rows(&mut s, "FETCH 10 FROM t").await);
        if got.len() >= 2 {
            break;
        }
    }
    assert_eq!(got, table(&[&["2", "3"], &["3", "4"]]));
    script(&mut s, "CLOSE t").await;
    db.close().await;
}

// ---------------------------------------------------------------------------
// LISTEN / NOTIFY
// ---------------------------------------------------------------------------

async fn next_notification(
    rx: &mut tokio::sync::mpsc::Receiver<sluice_sql::notify::Notification>,
) -> sluice_sql::notify::Notification {
    tokio::time::timeout(Duration::from_secs(10), rx.recv())
        .await
        .expect("a notification within 10 s")
        .expect("the notification queue is open")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn notify_reaches_a_listening_session() {
    let db = Db::open().await;
    let mut listener = db.session();
    let mut sender = db.session();
    sender.set_backend_pid(4242);
    let mut rx = listener.take_notifications().expect("notification queue");
    assert!(listener.take_notifications().is_none());
    assert_eq!(ok(&mut listener, "LISTEN jobs").await, "LISTEN");
    assert_eq!(ok(&mut sender, "NOTIFY jobs, 'hello'").await, "NOTIFY");
    let n = next_notification(&mut rx).await;
    assert_eq!(
        (n.channel.as_str(), n.payload.as_str(), n.pid),
        ("jobs", "hello", 4242)
    );
    script(&mut sender, "SELECT pg_notify('jobs', 'via function')").await;
    assert_eq!(next_notification(&mut rx).await.payload, "via function");
    // another channel is not delivered
    script(&mut sender, "NOTIFY other, 'not for you'").await;
    script(&mut listener, "UNLISTEN jobs").await;
    script(&mut sender, "NOTIFY jobs, 'after unlisten'").await;
    script(&mut listener, "LISTEN last").await;
    script(&mut sender, "NOTIFY last, 'end'").await;
    assert_eq!(next_notification(&mut rx).await.payload, "end");
    db.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn notify_in_a_block_is_sent_at_commit_only() {
    let db = Db::open().await;
    let mut listener = db.session();
    let mut sender = db.session();
    let mut rx = listener.take_notifications().expect("notification queue");
    script(&mut listener, "LISTEN jobs").await;
    script(&mut sender, "BEGIN").await;
    script(&mut sender, "NOTIFY jobs, 'rolled back'").await;
    script(&mut sender, "ROLLBACK").await;
    script(&mut sender, "BEGIN").await;
    script(&mut sender, "NOTIFY jobs, 'committed'").await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(rx.try_recv().is_err(), "delivered before COMMIT");
    script(&mut sender, "COMMIT").await;
    assert_eq!(next_notification(&mut rx).await.payload, "committed");
    db.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listen_on_a_stream_sends_each_committed_row() {
    let db = Db::open().await;
    let mut listener = db.session();
    let mut writer = db.session();
    script(&mut writer, EVENTS).await;
    let mut rx = listener.take_notifications().expect("notification queue");
    script(&mut listener, "LISTEN ev").await;
    script(
        &mut writer,
        "INSERT INTO ev VALUES (7, 'seven'), (8, 'eight')",
    )
    .await;
    for (offset, n, note) in [(0, 7, "seven"), (1, 8, "eight")] {
        let got = next_notification(&mut rx).await;
        assert_eq!(got.channel, "ev");
        let row: serde_json::Value = serde_json::from_str(&got.payload).expect("payload is JSON");
        assert_eq!(row["offset"], offset, "{row}");
        assert_eq!(row["n"], n, "{row}");
        assert_eq!(row["note"], note, "{row}");
        assert!(row.get("ts").is_some(), "{row}");
    }
    db.close().await;
}

// ---------------------------------------------------------------------------
// Describe
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn describe_a_select_with_a_parameter() {
    let (db, mut s) = setup().await;
    script(&mut s, EVENTS).await;
    let p = one_statement("SELECT offset, note FROM ev WHERE n = $1");
    let d = s.describe(&p).await.expect("describe");
    assert_eq!(d.params, [Some(ParamType::Scalar(ColumnType::Int8))]);
    let schema = d.schema.expect("a query has result columns");
    let names: Vec<&str> = schema.fields().iter().map(|f| f.name().as_str()).collect();
    assert_eq!(names, ["offset", "note"]);
    let p = one_statement("SELECT $1::int4 + 1 AS next, $2::text AS label");
    let d = s.describe(&p).await.expect("describe casts");
    assert_eq!(
        d.params,
        [
            Some(ParamType::Scalar(ColumnType::Int4)),
            Some(ParamType::Scalar(ColumnType::Text))
        ]
    );
    // describing runs nothing and does not touch the block status
    assert_eq!(s.status(), TxnStatus::Idle);
    db.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn describe_inserts_and_other_statements() {
    let (db, mut s) = setup().await;
    script(&mut s, EVENTS).await;
    script(&mut s, ACCOUNTS).await;
    let d = s
        .describe(&one_statement("INSERT INTO ev (note, n) VALUES ($1, $2)"))
        .await
        .expect("describe insert");
    assert_eq!(
        d.params,
        [
            Some(ParamType::Scalar(ColumnType::Text)),
            Some(ParamType::Scalar(ColumnType::Int8))
        ]
    );
    assert!(d.schema.is_none());
    let d = s
        .describe(&one_statement(
            "INSERT INTO ev VALUES ($1, $2) RETURNING offset",
        ))
        .await
        .expect("describe insert returning");
    let schema = d.schema.expect("RETURNING has columns");
    assert_eq!(schema.field(0).name(), "offset");
    let d = s
        .describe(&one_statement("UPDATE acct SET balance = $1 WHERE id = $2"))
        .await
        .expect("describe update");
    assert_eq!(
        d.params,
        [
            Some(ParamType::Scalar(ColumnType::Int8)),
            Some(ParamType::Scalar(ColumnType::Int8))
        ]
    );
    let e = s
        .describe(&one_statement("SELECT * FROM nowhere WHERE x = $1"))
        .await
        .expect_err("an unknown table");
    assert_eq!(e.code, sqlstate::UNDEFINED_TABLE);
    // array parameters are described as arrays (int4[] is 1007; oid[] 1028, which asyncpg's
    // type introspection binds), and EXECUTE as the statement it runs
    let d = s
        .describe(&one_statement("SELECT $1::int[], 1 = ANY($2::oid[])"))
        .await
        .expect("describe array parameters");
    let oids: Vec<u32> = d.params.iter().map(|p| p.expect("typed").oid()).collect();
    assert_eq!(oids, [1007, 1028]);
    s.simple_query("PREPARE two AS SELECT 1 AS a, 'x' AS b")
        .await
        .pop()
        .expect("a result")
        .expect("prepare");
    let d = s
        .describe(&one_statement("EXECUTE two"))
        .await
        .expect("describe execute");
    let schema = d.schema.expect("EXECUTE of a query has columns");
    assert_eq!(schema.fields().len(), 2);
    assert_eq!(schema.field(1).name(), "b");
    let e = s
        .describe(&one_statement("UPDATE ev SET n = $1"))
        .await
        .expect_err("a stream is append-only");
    assert_eq!(e.code, sqlstate::FEATURE_NOT_SUPPORTED);
    db.close().await;
}

#[tokio::test]
async fn insert_expressions_are_evaluated_per_row_as_in_postgresql() {
    let (_db, mut s) = setup().await;
    ok(
        &mut s,
        "CREATE STREAM e (id uuid, r float8, n int, t text, at timestamptz)",
    )
    .await;
    ok(
        &mut s,
        "INSERT INTO e VALUES \
         (gen_random_uuid(), random(), 1 + 2, repeat('x', 3), now()), \
         (gen_random_uuid(), random(), 7 * 6, upper('ab') || 'c', now())",
    )
    .await;
    // volatile functions once per row; now() is the statement's one start time
    assert_eq!(
        rows(
            &mut s,
            "SELECT count(DISTINCT id), count(DISTINCT r), count(DISTINCT at) FROM e"
        )
        .await,
        table(&[&["2", "2", "1"]])
    );
    assert_eq!(
        rows(&mut s, "SELECT n, t FROM e ORDER BY offset").await,
        table(&[&["3", "xxx"], &["42", "ABc"]])
    );
    // parameters inside expressions
    let p = one_statement("INSERT INTO e (n, t) VALUES ($1 * 2, repeat($2, 2))");
    let params = [
        ScalarValue::Int64(Some(21)),
        ScalarValue::Utf8(Some("ab".into())),
    ];
    match run_parsed(&mut s, &p, &params).await {
        Ok(reply) => assert_eq!(reply.tag(), "INSERT 0 1"),
        Err(e) => panic!("INSERT with parameters failed: {} {}", e.code, e.message),
    }
    assert_eq!(
        rows(&mut s, "SELECT n, t FROM e WHERE offset = 2").await,
        table(&[&["42", "abab"]])
    );
    // errors are PostgreSQL's, with or without parameters
    // (an integer cast that overflows was 22P02 "Can't cast value ..." before)
    let e = fails(&mut s, "INSERT INTO e (n) VALUES (2147483647 + 1)", "22003").await;
    assert_eq!(e.message, "integer out of range");
    fails(&mut s, "INSERT INTO e (n) VALUES (1 / 0)", "22012").await;
    let p = one_statement("INSERT INTO e (n) VALUES (10 / $1)");
    match run_parsed(&mut s, &p, &[ScalarValue::Int64(Some(0))]).await {
        Ok(reply) => panic!("10 / 0 gave {reply:?}"),
        Err(e) => assert_eq!(e.code, "22012", "{}", e.message),
    }
    fails(&mut s, "INSERT INTO e (n) VALUES (nope)", "42703").await;
    fails(&mut s, "INSERT INTO e (n) VALUES (no_such_fn(1))", "42883").await;
    // what reads a relation still goes through the planner
    ok(
        &mut s,
        "INSERT INTO e (n) VALUES ((SELECT max(n) + 1 FROM e))",
    )
    .await;
    assert_eq!(
        rows(&mut s, "SELECT n FROM e WHERE offset = 3").await,
        table(&[&["43"]])
    );
    assert_eq!(
        rows(&mut s, "SELECT count(*) FROM e").await,
        table(&[&["4"]])
    );
}

/// A prepared INSERT whose VALUES hold expressions compiles each expression
/// once and evaluates it per execution: parameters, the statement's start
/// time and volatile functions are each execution's (and each row's), not
/// the first one's. A setting change compiles them again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prepared_insert_compiles_its_expressions_once() {
    let (db, mut s) = setup().await;
    script(
        &mut s,
        "CREATE STREAM c (n bigint, t text, at timestamptz, r double precision)",
    )
    .await;
    let p =
        one_statement("INSERT INTO c (n, t, at, r) VALUES ($1 * 2, upper($2), now(), random())");
    let run = |i: i64| {
        [
            ScalarValue::Int64(Some(i)),
            ScalarValue::Utf8(Some(format!("v{i}"))),
        ]
    };
    for i in 0..5 {
        let reply = run_parsed(&mut s, &p, &run(i)).await.expect("insert");
        assert_eq!(reply.tag(), "INSERT 0 1");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    // four expressions, each compiled at the first execution only
    assert_eq!(s.compiled_expressions(), 4);
    assert_eq!(
        rows(&mut s, "SELECT n, t FROM c ORDER BY offset").await,
        table(&[
            &["0", "V0"],
            &["2", "V1"],
            &["4", "V2"],
            &["6", "V3"],
            &["8", "V4"]
        ])
    );
    assert_eq!(
        rows(
            &mut s,
            "SELECT count(DISTINCT at), count(DISTINCT r) FROM c"
        )
        .await,
        table(&[&["5", "5"]])
    );
    // one statement's rows share its start time; random() is called per row
    ok(
        &mut s,
        "INSERT INTO c (at, r) VALUES (now(), random()), (now(), random())",
    )
    .await;
    assert_eq!(
        rows(
            &mut s,
            "SELECT count(DISTINCT at), count(DISTINCT r) FROM c WHERE offset >= 5"
        )
        .await,
        table(&[&["1", "2"]])
    );
    // a table's INSERT takes the same path
    script(
        &mut s,
        "CREATE TABLE ct (id bigint PRIMARY KEY, label text)",
    )
    .await;
    let before = s.compiled_expressions();
    let t = one_statement("INSERT INTO ct VALUES ($1, lower($2))");
    for i in 0..3 {
        run_parsed(&mut s, &t, &run(i)).await.expect("table insert");
    }
    assert_eq!(s.compiled_expressions(), before + 1);
    assert_eq!(
        rows(&mut s, "SELECT id, label FROM ct ORDER BY id").await,
        table(&[&["0", "v0"], &["1", "v1"], &["2", "v2"]])
    );
    let before = s.compiled_expressions();
    ok(&mut s, "SET application_name = 'again'").await;
    run_parsed(&mut s, &p, &run(9))
        .await
        .expect("insert after SET");
    assert_eq!(s.compiled_expressions(), before + 4);
    assert_eq!(
        rows(&mut s, "SELECT n, t FROM c WHERE offset = 7").await,
        table(&[&["18", "V9"]])
    );
    db.close().await;
}

#[tokio::test]
async fn keyword_functions_name_their_columns_as_in_postgresql() {
    let (_db, mut s) = setup().await;
    // (the first column was named session_user before)
    assert_eq!(
        columns(
            &mut s,
            "SELECT current_user, session_user, user, current_user AS x"
        )
        .await,
        ["current_user", "session_user", "user", "x"]
    );
}

#[tokio::test]
async fn output_names_may_repeat_as_in_postgresql() {
    let (_db, mut s) = setup().await;
    ok(&mut s, "CREATE STREAM d (a int, b int)").await;
    ok(&mut s, "INSERT INTO d VALUES (1, 2)").await;
    // each was "Projections require unique expression names" (22000) before
    for (sql, names, row) in [
        ("SELECT a AS x, b AS x FROM d", ["x", "x"], ["1", "2"]),
        ("SELECT a, b AS a FROM d", ["a", "a"], ["1", "2"]),
        ("SELECT a, a FROM d", ["a", "a"], ["1", "1"]),
        ("SELECT d.a, a FROM d", ["a", "a"], ["1", "1"]),
    ] {
        assert_eq!(columns(&mut s, sql).await, names, "{sql}");
        assert_eq!(rows(&mut s, sql).await, table(&[&row]), "{sql}");
    }
    // a scalar subquery is named after its column (was ?column?)
    assert_eq!(
        columns(
            &mut s,
            "SELECT (SELECT count(*) FROM d), (SELECT max(a) AS z FROM d), (SELECT 1 + 1)"
        )
        .await,
        ["count", "z", "?column?"]
    );
    // a subscript is named after what it subscripts (was ?column?)
    ok(&mut s, "CREATE STREAM arr (tags text[])").await;
    assert_eq!(
        columns(
            &mut s,
            "SELECT tags[1], (ARRAY[1, 2])[2], tags[1] || 'x' FROM arr"
        )
        .await,
        ["tags", "array", "?column?"]
    );
    // a subquery correlated by more than equalities is planned as a join (see
    // system/decorrelate.rs) and still named after its one column
    ok(&mut s, "CREATE TABLE cn (id int PRIMARY KEY, b int)").await;
    assert_eq!(
        columns(
            &mut s,
            "SELECT (SELECT count(*) FROM cn AS x WHERE x.b < cn.b), \
             (SELECT max(x.id) AS \"Top\" FROM cn AS x WHERE x.b > cn.b), \
             (SELECT min(x.b) FROM cn AS x WHERE x.id <> cn.id) + 1 FROM cn"
        )
        .await,
        ["count", "Top", "?column?"]
    );
    // EXPLAIN plans the same join (it printed physical_plan_error before)
    let plan = rows(
        &mut s,
        "EXPLAIN SELECT (SELECT count(*) FROM cn AS x WHERE x.b < cn.b) FROM cn",
    )
    .await;
    assert!(
        plan.iter().all(|r| r[0] != "physical_plan_error")
            && plan.iter().any(|r| r[1].contains("Left Join")),
        "{plan:?}"
    );
    // an ORDER BY on a repeated name takes the first, and an alias still sorts
    assert_eq!(
        rows(&mut s, "SELECT b AS x, a AS x FROM d ORDER BY x").await,
        table(&[&["2", "1"]])
    );
}

#[tokio::test]
async fn explain_insert_and_unary_operators_answer_as_postgresql() {
    let (_db, mut s) = setup().await;
    ok(&mut s, "CREATE STREAM s (v text)").await;
    // counted offset and ts as columns before: 42601 "Inconsistent data length"
    let plan = rows(&mut s, "EXPLAIN INSERT INTO s VALUES ('x')").await;
    assert!(
        plan.iter().any(|r| r[1].contains("Insert Into")),
        "{plan:?}"
    );
    assert_eq!(
        rows(&mut s, "SELECT count(*) FROM s").await,
        table(&[&["0"]])
    );
    // no such operator (was 22000)
    fails(&mut s, "SELECT - 'abc'::text", "42883").await;
}
