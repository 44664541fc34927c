//! Bulk workloads: ingest throughput (multi-row INSERT and COPY FROM), and
//! the history workloads over a loaded table (a full `COPY ... TO STDOUT`
//! scan and a GROUP BY aggregate), each run the same way against Sluice and
//! PostgreSQL.
//!
//! - `ingest`: closed loop for a fixed time; each connection sends batches
//!   of `batch` rows, as one multi-row INSERT with parameters or as one
//!   COPY FROM STDIN; only acknowledged batches count.
//! - `load`: appends exactly `rows` rows of `(customer, amount, payload)`
//!   with COPY FROM, in chunks, from several connections; the data is a
//!   pure function of the row number, so both systems hold the same rows.
//! - `scan`: `COPY (SELECT * FROM t) TO STDOUT` on Sluice, `COPY t TO
//!   STDOUT` on PostgreSQL; counts the rows and bytes received, read with
//!   a lean client ([`crate::rawcopy`]) as psql would.
//! - `aggregate`: `SELECT customer, count(*), sum(amount) FROM t GROUP BY
//!   customer`, run several times; reports the best and the median.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use futures::SinkExt;
use serde::Serialize;
use tokio_postgres::types::ToSql;
use tokio_postgres::Client;

use crate::{connect, err, rawcopy, run_for, Common, Target};

/// Customers in the history table: the GROUP BY has this many groups.
const CUSTOMERS: u64 = 1000;
/// Rows per COPY statement when loading.
const LOAD_CHUNK_BYTES: usize = 8 << 20;

#[derive(Clone, Copy, Debug, clap::ValueEnum)]
pub enum Method {
    /// `INSERT INTO t (payload) VALUES ($1), ($2), ...`
    Insert,
    /// `COPY t (payload) FROM STDIN`
    Copy,
}

impl Method {
    fn name(self) -> &'static str {
        match self {
            Method::Insert => "multi-row INSERT",
            Method::Copy => "COPY FROM",
        }
    }
}

#[derive(Serialize)]
pub struct IngestRun {
    workload: &'static str,
    label: String,
    target: Target,
    method: &'static str,
    size: usize,
    connections: usize,
    batch_rows: usize,
    seconds: f64,
    rows: u64,
    bytes: u64,
    rows_per_sec: f64,
    mib_per_sec: f64,
}

#[derive(Serialize)]
pub struct LoadRun {
    workload: &'static str,
    target: Target,
    table: String,
    rows: u64,
    size: usize,
    seconds: f64,
    mib_per_sec: f64,
}

#[derive(Serialize)]
pub struct ScanRun {
    workload: &'static str,
    target: Target,
    query: String,
    rows: u64,
    bytes: u64,
    seconds: f64,
    mib_per_sec: f64,
}

#[derive(Serialize)]
pub struct AggregateRun {
    workload: &'static str,
    target: Target,
    rows: u64,
    groups: u64,
    query: String,
    runs: usize,
    seconds_best: f64,
    seconds_median: f64,
}

pub(crate) const MIB: f64 = 1024.0 * 1024.0;

/// Closed-loop batched ingest into the `setup` table of `common`.
pub async fn ingest(
    common: Common,
    method: Method,
    connections: usize,
    batch: usize,
    seconds: f64,
) -> Result<IngestRun, String> {
    crate::setup(&common).await?;
    let acked = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let body = crate::payload(common.size);
    let mut clients = Vec::with_capacity(connections);
    for _ in 0..connections {
        clients.push(connect(&common.url).await?);
    }
    let start = Instant::now();
    let mut tasks = Vec::new();
    for client in clients {
        let (acked, stop, body, table) = (
            acked.clone(),
            stop.clone(),
            body.clone(),
            common.table.clone(),
        );
        tasks.push(tokio::spawn(async move {
            match method {
                Method::Insert => {
                    let values: Vec<String> = (1..=batch).map(|i| format!("(${i})")).collect();
                    let sql = format!("INSERT INTO {table} (payload) VALUES {}", values.join(", "));
                    let stmt = client.prepare(&sql).await.map_err(err)?;
                    let params: Vec<&(dyn ToSql + Sync)> =
                        (0..batch).map(|_| &body as &(dyn ToSql + Sync)).collect();
                    while !stop.load(Ordering::Relaxed) {
                        client.execute(&stmt, &params).await.map_err(err)?;
                        acked.fetch_add(batch as u64, Ordering::Relaxed);
                    }
                }
                Method::Copy => {
                    let mut chunk = String::with_capacity(batch * (body.len() + 1));
                    for _ in 0..batch {
                        chunk.push_str(&body);
                        chunk.push('\n');
                    }
                    let chunk = Bytes::from(chunk);
                    let sql = format!("COPY {table} (payload) FROM STDIN");
                    while !stop.load(Ordering::Relaxed) {
                        let sink = client.copy_in::<_, Bytes>(&sql).await.map_err(err)?;
                        futures::pin_mut!(sink);
                        sink.send(chunk.clone()).await.map_err(err)?;
                        let n = sink.as_mut().finish().await.map_err(err)?;
                        acked.fetch_add(n, Ordering::Relaxed);
                    }
                }
            }
            Ok::<(), String>(())
        }));
    }
    run_for(seconds, &stop, tasks).await?;
    let elapsed = start.elapsed().as_secs_f64();
    let rows = acked.load(Ordering::Relaxed);
    let bytes = rows * common.size as u64;
    eprintln!(
        "{:>10} {}: {:.0} rows/s, {:.1} MiB/s",
        format!("{:?}", common.target),
        method.name(),
        rows as f64 / elapsed,
        bytes as f64 / MIB / elapsed
    );
    Ok(IngestRun {
        workload: "ingest",
        label: common.label.clone(),
        target: common.target,
        method: method.name(),
        size: common.size,
        connections,
        batch_rows: batch,
        seconds: elapsed,
        rows,
        bytes,
        rows_per_sec: rows as f64 / elapsed,
        mib_per_sec: bytes as f64 / MIB / elapsed,
    })
}

/// One row of the history table as COPY text: a pure function of `i`.
fn history_row(i: u64, payload: &str, out: &mut String) {
    use std::fmt::Write;
    let customer = i % CUSTOMERS;
    let amount = (i % 10_007) as f64 / 100.0;
    let _ = writeln!(out, "{customer}\t{amount}\t{payload}");
}

/// After a load into PostgreSQL: fresh statistics and a set visibility map
/// (`VACUUM ANALYZE`), which it plans and scans better with, as any operator
/// would give it. Nothing to do on Sluice.
pub(crate) async fn settle(client: &Client, target: Target, table: &str) -> Result<(), String> {
    if matches!(target, Target::Postgres) {
        client
            .batch_execute(&format!("VACUUM ANALYZE {table}"))
            .await
            .map_err(err)?;
    }
    Ok(())
}

/// Create the history table (`customer`, `amount`, `payload`) and append
/// exactly `rows` rows with COPY FROM over `connections` connections.
pub async fn load(common: Common, rows: u64, connections: usize) -> Result<LoadRun, String> {
    let client = connect(&common.url).await?;
    let t = &common.table;
    let ddl = match common.target {
        Target::Sluice => format!(
            "DROP STREAM IF EXISTS {t}; CREATE STREAM {t} (customer bigint NOT NULL, amount double precision NOT NULL, payload text NOT NULL)"
        ),
        Target::Postgres => format!(
            "DROP TABLE IF EXISTS {t}; CREATE TABLE {t} (id bigserial PRIMARY KEY, ts timestamptz NOT NULL DEFAULT now(), customer bigint NOT NULL, amount double precision NOT NULL, payload text NOT NULL)"
        ),
    };
    client.batch_execute(&ddl).await.map_err(err)?;
    let body = crate::payload(common.size);
    let per_chunk = (LOAD_CHUNK_BYTES / (common.size + 24)).max(1) as u64;
    let start = Instant::now();
    copy_rows(
        &common.url,
        t,
        "customer, amount, payload",
        rows,
        connections,
        per_chunk,
        move |i: u64, out: &mut String| history_row(i, &body, out),
    )
    .await?;
    settle(&client, common.target, t).await?;
    let seconds = start.elapsed().as_secs_f64();
    let bytes = rows as f64 * common.size as f64;
    eprintln!(
        "{:>10} load {rows} rows: {seconds:.1} s",
        format!("{:?}", common.target)
    );
    Ok(LoadRun {
        workload: "load",
        target: common.target,
        table: t.clone(),
        rows,
        size: common.size,
        seconds,
        mib_per_sec: bytes / MIB / seconds,
    })
}

/// Appends rows `0..rows` to `table (columns)` with COPY FROM STDIN over
/// `connections` connections, `per_chunk` rows per statement, each row's
/// COPY text written by `row(i, text)`; returns the COPY text bytes sent.
pub(crate) async fn copy_rows<F>(
    url: &str,
    table: &str,
    columns: &str,
    rows: u64,
    connections: usize,
    per_chunk: u64,
    row: F,
) -> Result<u64, String>
where
    F: Fn(u64, &mut String) + Send + Sync + 'static,
{
    let row = Arc::new(row);
    let per_chunk = per_chunk.max(1);
    let next = Arc::new(AtomicU64::new(0));
    let sent = Arc::new(AtomicU64::new(0));
    let sql = format!("COPY {table} ({columns}) FROM STDIN");
    let mut tasks = Vec::new();
    for _ in 0..connections.max(1) {
        let client = connect(url).await?;
        let (next, sent, row, sql) = (next.clone(), sent.clone(), row.clone(), sql.clone());
        tasks.push(tokio::spawn(async move {
            let mut text = String::new();
            loop {
                let first = next.fetch_add(per_chunk, Ordering::Relaxed);
                if first >= rows {
                    break;
                }
                text.clear();
                for i in first..(first + per_chunk).min(rows) {
                    (*row)(i, &mut text);
                }
                sent.fetch_add(text.len() as u64, Ordering::Relaxed);
                let sink = client.copy_in::<_, Bytes>(&sql).await.map_err(err)?;
                futures::pin_mut!(sink);
                sink.send(Bytes::from(text.clone())).await.map_err(err)?;
                sink.as_mut().finish().await.map_err(err)?;
            }
            Ok::<(), String>(())
        }));
    }
    for task in tasks {
        task.await.map_err(err)??;
    }
    Ok(sent.load(Ordering::Relaxed))
}

/// The whole table out through COPY, `runs` times; reports the fastest.
pub async fn scan(common: Common, runs: usize) -> Result<ScanRun, String> {
    let query = copy_out_query(common.target, &common.table);
    let (seconds, bytes, rows) = fastest_copy_out(&common.url, &query, runs).await?;
    eprintln!(
        "{:>10} scan {rows} rows, {:.0} MiB: {seconds:.2} s",
        format!("{:?}", common.target),
        bytes as f64 / MIB
    );
    Ok(ScanRun {
        workload: "scan",
        target: common.target,
        query,
        rows,
        bytes,
        seconds,
        mib_per_sec: bytes as f64 / MIB / seconds,
    })
}

/// The whole of `t` out through COPY: `COPY (SELECT * FROM t)` on Sluice
/// (a stream is not a COPY source by name), `COPY t` on PostgreSQL.
pub(crate) fn copy_out_query(target: Target, t: &str) -> String {
    match target {
        Target::Sluice => format!("COPY (SELECT * FROM {t}) TO STDOUT"),
        Target::Postgres => format!("COPY {t} TO STDOUT"),
    }
}

/// `query` (a `COPY ... TO STDOUT`) read `runs` times with the lean client:
/// (seconds, bytes, rows) of the fastest run.
pub(crate) async fn fastest_copy_out(
    url: &str,
    query: &str,
    runs: usize,
) -> Result<(f64, u64, u64), String> {
    let mut best: Option<(f64, u64, u64)> = None;
    for _ in 0..runs.max(1) {
        let (url, q) = (url.to_string(), query.to_string());
        let start = Instant::now();
        let copied = tokio::task::spawn_blocking(move || rawcopy::copy_out(&url, &q))
            .await
            .map_err(err)??;
        let secs = start.elapsed().as_secs_f64();
        if best.is_none_or(|(s, _, _)| secs < s) {
            best = Some((secs, copied.bytes, copied.rows));
        }
    }
    Ok(best.unwrap_or_default())
}

/// The GROUP BY aggregate, `runs` times; checks the group count.
pub async fn aggregate(common: Common, runs: usize) -> Result<AggregateRun, String> {
    let client = connect(&common.url).await?;
    let query = aggregate_query(&common.table);
    let (times, rows, groups) = timed_aggregate(&client, &query, runs).await?;
    let median = times[times.len() / 2];
    eprintln!(
        "{:>10} aggregate over {rows} rows: median {median:.3} s",
        format!("{:?}", common.target)
    );
    Ok(AggregateRun {
        workload: "aggregate",
        target: common.target,
        rows,
        groups,
        query,
        runs: times.len(),
        seconds_best: times[0],
        seconds_median: median,
    })
}

/// The GROUP BY of the history workloads over `t`.
pub(crate) fn aggregate_query(t: &str) -> String {
    format!("SELECT customer, count(*), sum(amount) FROM {t} GROUP BY customer")
}

/// Runs `query` (an [`aggregate_query`]) `runs` times (at least once):
/// the run times in increasing order, and the rows counted (the sum of
/// the `count(*)` column) and groups of the last run.
pub(crate) async fn timed_aggregate(
    client: &Client,
    query: &str,
    runs: usize,
) -> Result<(Vec<f64>, u64, u64), String> {
    let mut times = Vec::new();
    let (mut rows, mut groups) = (0u64, 0u64);
    for _ in 0..runs.max(1) {
        let start = Instant::now();
        let result = client.query(query, &[]).await.map_err(err)?;
        times.push(start.elapsed().as_secs_f64());
        groups = result.len() as u64;
        rows = 0;
        for r in &result {
            rows += r.try_get::<_, i64>(1).map_err(err)? as u64;
        }
    }
    times.sort_by(f64::total_cmp);
    Ok((times, rows, groups))
}
