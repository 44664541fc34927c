//! End-to-end tests for Sluice: every test starts a real `sluice` process
//! ([`Server`]) and talks to it with real clients (tokio-postgres, psql,
//! psycopg). This crate holds the harness and small SQL helpers shared by the
//! test binaries in `tests/`.
//!
//! The binary under test is `$SLUICE_BIN` or the `sluice` built next to the
//! test binaries; build it first with `cargo build --bins`.

pub mod chaos;
pub mod cluster;
pub mod hostile;
pub mod psql;
mod server;
pub mod suite;
pub mod wire;

use std::collections::HashMap;
use std::future::Future;
use std::time::Duration;

use tokio_postgres::error::SqlState;
use tokio_postgres::{Client, SimpleQueryMessage};

pub use server::{
    binary_path, parse_listening_port, spawn_sluice, spawn_sluice_with, Launch, Server, BIN_ENV,
    STARTUP_TIMEOUT,
};

/// Default bound for one statement or one short sequence of them.
pub const STATEMENT_TIMEOUT: Duration = Duration::from_secs(30);

/// Awaits `fut`, panicking with `what` if it takes longer than `limit`.
pub async fn within<F: Future>(limit: Duration, what: &str, fut: F) -> F::Output {
    match tokio::time::timeout(limit, fut).await {
        Ok(out) => out,
        Err(_) => panic!("{what}: timed out after {limit:?}"),
    }
}

/// The SQLSTATE of a server error, if it is one.
pub fn sqlstate(err: &tokio_postgres::Error) -> Option<&str> {
    err.code().map(SqlState::code)
}

/// The server's error message (without SQLSTATE), or the client error text.
pub fn error_message(err: &tokio_postgres::Error) -> String {
    match err.as_db_error() {
        Some(db) => db.message().to_string(),
        None => err.to_string(),
    }
}

/// Asserts that `result` failed with SQLSTATE `expected`; returns the error.
#[track_caller]
pub fn expect_sqlstate<T: std::fmt::Debug>(
    result: Result<T, tokio_postgres::Error>,
    expected: &SqlState,
    context: &str,
) -> tokio_postgres::Error {
    match result {
        Ok(value) => panic!(
            "{context}: expected SQLSTATE {}, got success: {value:?}",
            expected.code()
        ),
        Err(err) => {
            assert_eq!(
                sqlstate(&err),
                Some(expected.code()),
                "{context}: wrong SQLSTATE for error {err:?}"
            );
            err
        }
    }
}

/// Runs `sql` with the simple query protocol and returns the rows of its
/// (last) result set as text; SQL NULL is `None`.
pub async fn simple_rows(client: &Client, sql: &str) -> Vec<Vec<Option<String>>> {
    try_simple_rows(client, sql)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e:?}"))
}

/// Like [`simple_rows`], with the statement's error returned.
pub async fn try_simple_rows(
    client: &Client,
    sql: &str,
) -> Result<Vec<Vec<Option<String>>>, tokio_postgres::Error> {
    let messages = within(STATEMENT_TIMEOUT, sql, client.simple_query(sql)).await?;
    let mut rows = Vec::new();
    for message in messages {
        match message {
            SimpleQueryMessage::RowDescription(_) => rows.clear(),
            SimpleQueryMessage::Row(row) => rows.push(
                (0..row.len())
                    .map(|i| row.get(i).map(str::to_string))
                    .collect(),
            ),
            _ => {}
        }
    }
    Ok(rows)
}

/// Like [`simple_rows`] for results without NULLs: `"NULL"` stands for one.
pub async fn text_rows(client: &Client, sql: &str) -> Vec<Vec<String>> {
    simple_rows(client, sql)
        .await
        .into_iter()
        .map(|row| {
            row.into_iter()
                .map(|v| v.unwrap_or_else(|| "NULL".into()))
                .collect()
        })
        .collect()
}

/// Runs one statement (simple protocol), panicking with its text on error.
pub async fn exec(client: &Client, sql: &str) {
    within(STATEMENT_TIMEOUT, sql, client.batch_execute(sql))
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e:?}"));
}

/// The counters of `sluice_stats` (cumulative since server start).
pub async fn stats(client: &Client) -> HashMap<String, i64> {
    let sql = "SELECT metric, value FROM sluice_stats";
    let rows = within(STATEMENT_TIMEOUT, sql, client.query(sql, &[]))
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e:?}"));
    rows.iter()
        .map(|row| (row.get::<_, String>(0), row.get::<_, i64>(1)))
        .collect()
}

/// `SELECT offset FROM stream ORDER BY offset`, asserting it is `0..n`;
/// returns n.
pub async fn assert_gapless(client: &Client, stream: &str) -> i64 {
    let sql = format!("SELECT offset FROM {stream} ORDER BY offset");
    let rows = within(STATEMENT_TIMEOUT, &sql, client.query(sql.as_str(), &[]))
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e:?}"));
    for (expected, row) in rows.iter().enumerate() {
        let offset: i64 = row.get(0);
        assert_eq!(
            offset, expected as i64,
            "offsets of {stream} are not gapless from 0"
        );
    }
    rows.len() as i64
}

/// A simple query's messages as sqllogictest output: the last result's rows, each value
/// rendered by `render(column, value)`, or the statement's row count.
pub fn slt_output(
    messages: Vec<SimpleQueryMessage>,
    render: impl Fn(usize, Option<&str>) -> String,
) -> sqllogictest::DBOutput<sqllogictest::DefaultColumnType> {
    let mut columns = None;
    let mut rows = Vec::new();
    let mut count = 0;
    for message in messages {
        match message {
            SimpleQueryMessage::RowDescription(desc) => {
                columns = Some(desc.len());
                rows.clear();
            }
            SimpleQueryMessage::Row(row) => {
                rows.push((0..row.len()).map(|i| render(i, row.get(i))).collect());
            }
            SimpleQueryMessage::CommandComplete(n) => count = n,
            _ => {}
        }
    }
    match columns {
        Some(n) => sqllogictest::DBOutput::Rows {
            types: vec![sqllogictest::DefaultColumnType::Any; n],
            rows,
        },
        None => sqllogictest::DBOutput::StatementComplete(count),
    }
}
