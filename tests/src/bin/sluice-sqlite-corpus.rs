//! Runs files of SQLite's public sqllogictest corpus against Sluice (or, with
//! `--reference`, against a PostgreSQL server) and reports how many records
//! pass, file by file, with every failure and its reason.
//!
//! ```text
//! cargo build -p sluice-server --bin sluice
//! cargo run -p sluice-tests --bin sluice-sqlite-corpus -- \
//!     --corpus /path/to/sqllogictest/test --out tests/slt/sqlite/sluice.md
//! cargo run -p sluice-tests --bin sluice-sqlite-corpus -- --corpus ... \
//!     --reference 'host=127.0.0.1 port=5544 user=postgres' --out tests/slt/sqlite/postgres.md
//! ```
//!
//! The corpus is not in this repository (see `tests/slt/sqlite/README.md`).
//! Records are run as the corpus' own runner runs them for a PostgreSQL
//! engine: the label `postgresql` (so `skipif postgresql` records are
//! skipped and `onlyif` records for other engines too), `hash-threshold`
//! honoured (8 where a file sets none, the corpus runner's default), values rendered by the record's column letters — `I` as an
//! integer, `R` with three decimals, `T` as text, NULL as `NULL`, the empty
//! string as `(empty)`. Statements run as written; the one conversion is of
//! the file's format ([`convert`]). Every file gets a fresh server (a fresh
//! schema on the reference).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use clap::Parser;
use sluice_tests::{slt_output, Server};
use sqllogictest::{
    AsyncDB, Control, DBOutput, DefaultColumnType, QueryExpect, Record, RecordOutput, ResultMode,
    Runner,
};
use tokio_postgres::{Client, NoTls};

/// The files acceptance 1 of issue 22 names: select1–5 and the `index/*/10`
/// files this corpus copy carries (`between` and `in` are larger than the
/// mirror keeps).
const DEFAULT_FILES: &[&str] = &[
    "select1.test",
    "select2.test",
    "select3.test",
    "select4.test",
    "select5.test",
    "index/between/10/slt_good_0.test",
    "index/commute/10/slt_good_0.test",
    "index/delete/10/slt_good_0.test",
    "index/in/10/slt_good_0.test",
    "index/orderby/10/slt_good_0.test",
    "index/orderby_nosort/10/slt_good_0.test",
    "index/random/10/slt_good_0.test",
    "index/view/10/slt_good_0.test",
];

/// The corpus as sqllogictest-rs reads it: a condition line may end in a
/// `#` comment (`skipif postgresql # needs AS`), which the crate's parser
/// refuses; the comment is dropped (lines keep their numbers).
fn convert(text: &str) -> String {
    text.lines()
        .map(|line| {
            let condition = line.starts_with("skipif ") || line.starts_with("onlyif ");
            match line.find('#') {
                Some(i) if condition => line[..i].trim_end(),
                _ => line,
            }
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The corpus runner's hash threshold where a file sets none (its
/// `DEFAULT_HASH_THRESHOLD`): a result of more values is compared by its MD5.
const DEFAULT_HASH_THRESHOLD: usize = 8;

/// One statement may take this long before it counts as failed.
const STATEMENT_TIMEOUT: Duration = Duration::from_secs(60);

#[derive(Parser, Debug)]
#[command(about = "Pass rate of SQLite's sqllogictest corpus on Sluice or PostgreSQL")]
struct Args {
    /// The corpus' `test` directory
    #[arg(long)]
    corpus: PathBuf,
    /// Files under it to run (default: select1-5 and index/*/10/slt_good_0
    /// where present)
    #[arg(long)]
    file: Vec<String>,
    /// A PostgreSQL connection string to run against instead of Sluice
    #[arg(long)]
    reference: Option<String>,
    /// Write the report (markdown) here as well as to stdout
    #[arg(long)]
    out: Option<PathBuf>,
}

#[derive(Debug)]
struct CorpusError(String);

impl std::fmt::Display for CorpusError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for CorpusError {}

impl From<tokio_postgres::Error> for CorpusError {
    fn from(err: tokio_postgres::Error) -> Self {
        CorpusError(match err.as_db_error() {
            Some(db) => format!("{}: {}", db.code().code(), db.message()),
            None => err.to_string(),
        })
    }
}

/// The column letters of the query about to run: values are rendered by
/// them, as the corpus' runner does.
type Letters = Arc<Mutex<Vec<DefaultColumnType>>>;

struct Conn {
    client: Client,
    letters: Letters,
}

/// Renders one value as the corpus' runner does for its column letter.
fn render(value: Option<&str>, letter: &DefaultColumnType) -> String {
    let Some(text) = value else {
        return "NULL".to_string();
    };
    match letter {
        DefaultColumnType::Integer => match text.parse::<i64>() {
            Ok(n) => n.to_string(),
            Err(_) => match text.parse::<f64>() {
                Ok(f) => (f.trunc() as i64).to_string(),
                Err(_) => text.to_string(),
            },
        },
        DefaultColumnType::FloatingPoint => match text.parse::<f64>() {
            Ok(f) => format!("{f:.3}"),
            Err(_) => text.to_string(),
        },
        _ if text.is_empty() => "(empty)".to_string(),
        _ => text
            .chars()
            .map(|c| if (' '..='~').contains(&c) { c } else { '@' })
            .collect(),
    }
}

#[async_trait]
impl AsyncDB for Conn {
    type Error = CorpusError;
    type ColumnType = DefaultColumnType;

    async fn run(&mut self, sql: &str) -> Result<DBOutput<DefaultColumnType>, CorpusError> {
        let messages = tokio::time::timeout(STATEMENT_TIMEOUT, self.client.simple_query(sql))
            .await
            .map_err(|_| CorpusError(format!("timed out after {STATEMENT_TIMEOUT:?}")))??;
        let letters = self.letters.lock().expect("letters lock").clone();
        Ok(slt_output(messages, |i, value| {
            render(value, letters.get(i).unwrap_or(&DefaultColumnType::Any))
        }))
    }

    async fn shutdown(&mut self) {}

    fn engine_name(&self) -> &str {
        "postgresql"
    }

    async fn sleep(dur: Duration) {
        tokio::time::sleep(dur).await;
    }
}

// The signature is sqllogictest's `ColumnTypeValidator`.
#[allow(clippy::ptr_arg)]
fn same_column_count(actual: &Vec<DefaultColumnType>, expected: &Vec<DefaultColumnType>) -> bool {
    actual.len() == expected.len()
}

async fn connect(config: String, letters: Letters) -> Result<Conn, CorpusError> {
    let (client, connection) = tokio_postgres::connect(&config, NoTls).await?;
    tokio::spawn(async move {
        let _ = connection.await;
    });
    Ok(Conn { client, letters })
}

/// What one file did: records run and passed, and each failure.
#[derive(Default)]
struct FileResult {
    run: usize,
    passed: usize,
    /// (line of the record, what went wrong)
    failures: Vec<(u32, String)>,
}

/// Where a file runs: a fresh Sluice server, or a fresh schema on the
/// reference PostgreSQL.
enum Target {
    Sluice(Server),
    Reference { config: String, schema: String },
}

impl Target {
    async fn open(reference: &Option<String>, n: usize) -> Target {
        let Some(base) = reference else {
            return Target::Sluice(Server::start().await);
        };
        let schema = format!("sqlite_corpus_{n}");
        let (client, connection) = tokio_postgres::connect(base, NoTls)
            .await
            .expect("connect to the reference");
        tokio::spawn(connection);
        client
            .batch_execute(&format!(
                "DROP SCHEMA IF EXISTS {schema} CASCADE; CREATE SCHEMA {schema}"
            ))
            .await
            .expect("create the reference schema");
        Target::Reference {
            config: format!("{base} options='-c search_path={schema}'"),
            schema,
        }
    }

    fn config(&self) -> String {
        match self {
            Target::Sluice(server) => server.conn_string(),
            Target::Reference { config, .. } => config.clone(),
        }
    }

    async fn close(self, reference: &Option<String>) {
        if let (Target::Reference { schema, .. }, Some(base)) = (&self, reference) {
            if let Ok((client, connection)) = tokio_postgres::connect(base, NoTls).await {
                tokio::spawn(connection);
                let _ = client
                    .batch_execute(&format!("DROP SCHEMA IF EXISTS {schema} CASCADE"))
                    .await;
            }
        }
    }
}

async fn run_file(path: &Path, reference: &Option<String>, n: usize) -> FileResult {
    let text =
        std::fs::read_to_string(path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
    let records = sqllogictest::parse_with_name::<DefaultColumnType>(
        &convert(&text),
        path.display().to_string(),
    )
    .unwrap_or_else(|e| panic!("parse {}: {e}", path.display()));
    let target = Target::open(reference, n).await;
    let letters: Letters = Arc::default();
    let config = target.config();
    let factory_letters = letters.clone();
    let mut runner = Runner::new(move || connect(config.clone(), factory_letters.clone()));
    runner.add_label("postgresql");
    runner.with_column_validator(same_column_count);
    runner.with_hash_threshold(DEFAULT_HASH_THRESHOLD);
    // SQLite's format writes one value per result line
    runner
        .run_async(Record::Control(Control::ResultMode(ResultMode::ValueWise)))
        .await
        .expect("set the result mode");
    let mut result = FileResult::default();
    for record in records {
        if matches!(record, Record::Halt { .. }) {
            break;
        }
        let line = match &record {
            Record::Statement { loc, .. } => loc.line(),
            Record::Query { loc, expected, .. } => {
                let types = match expected {
                    QueryExpect::Results { types, .. } => types.clone(),
                    QueryExpect::Error(_) => Vec::new(),
                };
                *letters.lock().expect("letters lock") = types;
                loc.line()
            }
            _ => 0,
        };
        match runner.run_async(record).await {
            Ok(RecordOutput::Nothing) => {}
            Ok(_) => {
                result.run += 1;
                result.passed += 1;
            }
            Err(e) => {
                result.run += 1;
                let reason = e.display(false).to_string();
                if result.failures.len() < 2 {
                    eprintln!("{}: {reason}", path.display());
                }
                result.failures.push((line, reason));
            }
        }
    }
    drop(runner);
    target.close(reference).await;
    result
}

/// The reason of a failure, shortened to what groups alike failures.
fn category(reason: &str) -> String {
    let first = reason
        .lines()
        .find(|l| !l.trim().is_empty())
        .unwrap_or_default();
    if reason.contains("query result mismatch") {
        return "wrong result".to_string();
    }
    let cut: String = first.chars().take(120).collect();
    cut.trim().to_string()
}

fn report(files: &[(String, FileResult)], target: &str) -> String {
    let mut out = format!("# SQLite sqllogictest corpus on {target}\n\n");
    out.push_str("| file | records run | passed | failed | pass rate |\n|---|---|---|---|---|\n");
    let (mut run, mut passed) = (0, 0);
    for (name, r) in files {
        run += r.run;
        passed += r.passed;
        out.push_str(&format!(
            "| {name} | {} | {} | {} | {:.2}% |\n",
            r.run,
            r.passed,
            r.failures.len(),
            rate(r.passed, r.run)
        ));
    }
    out.push_str(&format!(
        "| **all** | {run} | {passed} | {} | **{:.2}%** |\n\n",
        run - passed,
        rate(passed, run)
    ));
    let mut by_reason: BTreeMap<String, usize> = BTreeMap::new();
    for (_, r) in files {
        for (_, reason) in &r.failures {
            *by_reason.entry(category(reason)).or_default() += 1;
        }
    }
    let mut reasons: Vec<_> = by_reason.into_iter().collect();
    reasons.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    out.push_str("## Failures by reason\n\n| records | reason |\n|---|---|\n");
    for (reason, count) in reasons {
        out.push_str(&format!("| {count} | {} |\n", reason.replace('|', "\\|")));
    }
    out.push_str("\n## Every failure\n");
    for (name, r) in files {
        if r.failures.is_empty() {
            continue;
        }
        out.push_str(&format!("\n### {name}\n\n"));
        for (line, reason) in &r.failures {
            out.push_str(&format!(
                "- line {line}: {}\n",
                category(reason).replace('`', "'")
            ));
        }
    }
    out
}

fn rate(passed: usize, run: usize) -> f64 {
    if run == 0 {
        return 100.0;
    }
    100.0 * passed as f64 / run as f64
}

#[tokio::main(flavor = "multi_thread")]
async fn main() {
    let args = Args::parse();
    let names: Vec<String> = if args.file.is_empty() {
        DEFAULT_FILES
            .iter()
            .filter(|f| args.corpus.join(f).exists())
            .map(|f| f.to_string())
            .collect()
    } else {
        args.file.clone()
    };
    assert!(
        !names.is_empty(),
        "no corpus files found under {}",
        args.corpus.display()
    );
    let mut results = Vec::new();
    for (n, name) in names.iter().enumerate() {
        let started = Instant::now();
        let result = run_file(&args.corpus.join(name), &args.reference, n).await;
        eprintln!(
            "{name}: {} of {} records passed ({:.2}%) in {:.0?}",
            result.passed,
            result.run,
            rate(result.passed, result.run),
            started.elapsed()
        );
        results.push((name.clone(), result));
    }
    let target = if args.reference.is_some() {
        "PostgreSQL (reference)"
    } else {
        "Sluice"
    };
    let text = report(&results, target);
    println!("{text}");
    if let Some(out) = &args.out {
        std::fs::write(out, &text).unwrap_or_else(|e| panic!("write {}: {e}", out.display()));
    }
}
