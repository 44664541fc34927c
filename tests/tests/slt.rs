//! Runs every `slt/*.slt` file against its own fresh `sluice` server.
//!
//! Statements go through tokio-postgres' simple query protocol, so values
//! come back exactly as the server renders them as text: NULL is `NULL`, the
//! empty string is `(empty)`. Errors display as `SQLSTATE: message`, so a
//! file can say `statement error 0A000: .*append-only`. Column type letters
//! (`query ITR`) are checked for their count only: the simple protocol does
//! not tell us the column types. A `connection name` line applies to the one
//! record after it (sqllogictest's rule). Set `SLT_FILTER=word` to run only
//! the files whose name contains `word`.

use std::path::{Path, PathBuf};
use std::time::Duration;

use async_trait::async_trait;
use sluice_tests::{slt_output, within, Server};
use sqllogictest::{AsyncDB, DBOutput, DefaultColumnType, Runner};
use tokio_postgres::{Client, NoTls};

/// One file may take this long in total.
const FILE_TIMEOUT: Duration = Duration::from_secs(180);

#[derive(Debug)]
struct SltError {
    sqlstate: Option<String>,
    message: String,
}

impl std::fmt::Display for SltError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.sqlstate {
            Some(code) => write!(f, "{code}: {}", self.message),
            None => write!(f, "{}", self.message),
        }
    }
}

impl std::error::Error for SltError {}

impl From<tokio_postgres::Error> for SltError {
    fn from(err: tokio_postgres::Error) -> Self {
        match err.as_db_error() {
            Some(db) => SltError {
                sqlstate: Some(db.code().code().to_string()),
                message: db.message().to_string(),
            },
            None => SltError {
                sqlstate: None,
                message: err.to_string(),
            },
        }
    }
}

/// A sqllogictest connection over the simple query protocol.
struct SimpleConn {
    client: Client,
}

impl SimpleConn {
    async fn connect(conn_string: String) -> Result<SimpleConn, SltError> {
        let (client, connection) = tokio_postgres::connect(&conn_string, NoTls).await?;
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                eprintln!("[slt] connection ended: {e}");
            }
        });
        Ok(SimpleConn { client })
    }
}

fn render(value: Option<&str>) -> String {
    match value {
        None => "NULL".to_string(),
        Some("") => "(empty)".to_string(),
        Some(text) => text.to_string(),
    }
}

#[async_trait]
impl AsyncDB for SimpleConn {
    type Error = SltError;
    type ColumnType = DefaultColumnType;

    async fn run(&mut self, sql: &str) -> Result<DBOutput<DefaultColumnType>, SltError> {
        let messages = self.client.simple_query(sql).await?;
        Ok(slt_output(messages, |_, value| render(value)))
    }

    async fn shutdown(&mut self) {}

    fn engine_name(&self) -> &str {
        "sluice"
    }

    async fn sleep(dur: Duration) {
        tokio::time::sleep(dur).await;
    }

    fn error_sql_state(err: &SltError) -> Option<String> {
        err.sqlstate.clone()
    }
}

// The signature is sqllogictest's `ColumnTypeValidator`.
#[allow(clippy::ptr_arg)]
fn same_column_count(actual: &Vec<DefaultColumnType>, expected: &Vec<DefaultColumnType>) -> bool {
    actual.len() == expected.len()
}

fn slt_files() -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("slt");
    let filter = std::env::var("SLT_FILTER").unwrap_or_default();
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("read {}: {e}", dir.display()))
        .map(|entry| entry.expect("read slt directory entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "slt"))
        .filter(|p| p.to_string_lossy().contains(&filter))
        .collect();
    files.sort();
    files
}

async fn run_file(path: &Path) -> Result<(), String> {
    let server = Server::start().await;
    let conn_string = server.conn_string();
    let mut runner = Runner::new(move || SimpleConn::connect(conn_string.clone()));
    runner.add_label("sluice");
    runner.with_column_validator(same_column_count);
    let name = path.display().to_string();
    let result = within(FILE_TIMEOUT, &name, runner.run_file_async(path)).await;
    drop(runner);
    drop(server);
    result.map_err(|e| e.display(false).to_string())
}

#[tokio::test(flavor = "multi_thread")]
async fn sqllogictest_files() {
    let files = slt_files();
    assert!(!files.is_empty(), "no .slt files selected");
    let mut failures = Vec::new();
    for file in &files {
        let name = file.file_name().expect("file name").to_string_lossy();
        match run_file(file).await {
            Ok(()) => println!("slt {name}: ok"),
            Err(e) => {
                println!("slt {name}: FAILED\n{e}\n");
                failures.push(name.to_string());
            }
        }
    }
    println!(
        "slt summary: {} files, {} passed, {} failed {failures:?}",
        files.len(),
        files.len() - failures.len(),
        failures.len()
    );
    assert!(failures.is_empty(), "failing slt files: {failures:?}");
}
