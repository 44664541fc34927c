//! `sluice-bench`: a load generator that speaks the Postgres protocol, so the
//! same workload runs against Sluice and against PostgreSQL.
//!
//! Modes:
//! - `sweep`: closed-loop peak throughput of acknowledged single-row INSERTs
//!   over a list of connection counts (the group-commit curve);
//! - `latency`: open-loop, fixed-rate INSERTs; each latency is measured from
//!   the time the request was *scheduled*, so stalls count against every
//!   request queued behind them (coordinated omission corrected), recorded
//!   in an HDR histogram and reported to 99.9999 and max; with `--metrics`,
//!   beside what Sluice saw meanwhile (its fsync, commit, request and
//!   checkpoint times, see [`server_side`]);
//! - `tail-latency`, `stalled-tail`: see [`tail`];
//! - `ingest`, `load`, `scan`, `aggregate`: see [`bulk`];
//! - `compression`: one stream per `compression` setting, its size and its
//!   scans, see [`compression`];
//! - `disk`, `floor`: the disk's own limits and the latency of an ideal
//!   group-commit log on it, see [`disk`].
//!
//! Results go to stdout as `JSON {...}` lines, one object per measured
//! point, each with a `workload` field; progress goes to stderr.
//! `bench/report.py` turns a run's lines into tables, plots and the README.
#![cfg_attr(test, allow(clippy::unwrap_used))]

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::{Parser, Subcommand, ValueEnum};
use hdrhistogram::Histogram;
use serde::Serialize;
use tokio_postgres::{Client, NoTls};

mod bulk;
mod compression;
mod disk;
mod rawcopy;
mod server_side;
mod tail;

/// Errors travel as their message: every failure ends the run with it.
fn err(e: impl std::fmt::Display) -> String {
    e.to_string()
}

#[derive(Parser)]
#[command(
    name = "sluice-bench",
    about = "Postgres-protocol load generator for Sluice and PostgreSQL"
)]
struct Cli {
    #[command(subcommand)]
    mode: Mode,
}

#[derive(Clone, Copy, Debug, ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum Target {
    Sluice,
    Postgres,
}

#[derive(clap::Args, Clone)]
pub(crate) struct Common {
    /// Connection string, e.g. "host=127.0.0.1 port=5499 user=sluice"
    #[arg(long)]
    pub(crate) url: String,
    /// What the server is (decides the DDL used to set up the table)
    #[arg(long, value_enum)]
    pub(crate) target: Target,
    /// Table / stream name to create and append to
    #[arg(long, default_value = "bench")]
    pub(crate) table: String,
    /// Payload size in bytes
    #[arg(long, default_value_t = 1024)]
    pub(crate) size: usize,
    /// Label for the result rows
    #[arg(long, default_value = "")]
    pub(crate) label: String,
}

#[derive(Subcommand)]
enum Mode {
    /// Closed-loop peak throughput for each connection count
    Sweep {
        #[command(flatten)]
        common: Common,
        /// Connection counts, comma separated
        #[arg(long, default_value = "1,2,4,8,16,32,64,128")]
        connections: String,
        /// Seconds per point
        #[arg(long, default_value_t = 5.0)]
        seconds: f64,
    },
    /// Open-loop fixed-rate latency
    Latency {
        #[command(flatten)]
        common: Common,
        #[arg(long, default_value_t = 8)]
        connections: usize,
        /// Requests per second, all connections together
        #[arg(long, default_value_t = 3000.0)]
        rate: f64,
        /// Sluice's metrics endpoint (host:port of `--metrics-listen`): also report the
        /// server's own fsync, commit, request and checkpoint times during the run
        #[arg(long)]
        metrics: Option<String>,
        #[arg(long, default_value_t = 10.0)]
        seconds: f64,
    },
    /// Commit-acknowledged → received-by-a-COPY-tail latency at a fixed rate (Sluice only)
    TailLatency {
        #[arg(long)]
        url: String,
        #[arg(long, default_value_t = 3000.0)]
        rate: f64,
        #[arg(long, default_value_t = 10.0)]
        seconds: f64,
        #[arg(long, default_value_t = 1024)]
        size: usize,
        /// COPY tails following the stream at once (fan-out)
        #[arg(long, default_value_t = 1)]
        tails: usize,
    },
    /// Append throughput with and without a COPY tail that never reads (Sluice only)
    StalledTail {
        #[arg(long)]
        url: String,
        #[arg(long, default_value_t = 100_000)]
        rows: u64,
        #[arg(long, default_value_t = 32)]
        connections: usize,
        /// Server pid, to report its resident memory
        #[arg(long)]
        server_pid: Option<u32>,
    },
    /// Closed-loop batched ingest: multi-row INSERT or COPY FROM
    Ingest {
        #[command(flatten)]
        common: Common,
        #[arg(long, value_enum)]
        method: bulk::Method,
        #[arg(long, default_value_t = 4)]
        connections: usize,
        /// Rows per statement
        #[arg(long, default_value_t = 100)]
        batch: usize,
        #[arg(long, default_value_t = 5.0)]
        seconds: f64,
    },
    /// Create a history table (customer, amount, payload) holding exactly N rows
    Load {
        #[command(flatten)]
        common: Common,
        #[arg(long)]
        rows: u64,
        #[arg(long, default_value_t = 4)]
        connections: usize,
    },
    /// The whole history table out through COPY TO STDOUT
    Scan {
        #[command(flatten)]
        common: Common,
        #[arg(long, default_value_t = 2)]
        runs: usize,
    },
    /// GROUP BY customer over the history table
    Aggregate {
        #[command(flatten)]
        common: Common,
        #[arg(long, default_value_t = 3)]
        runs: usize,
    },
    /// Event rows in a stream WITH (compression = ...) (or a PostgreSQL
    /// table): size on disk and logical, load, COPY TO scan, GROUP BY
    Compression {
        #[command(flatten)]
        common: Common,
        /// The stream's compression (on PostgreSQL, the round's label)
        #[arg(long = "compression", value_enum)]
        codec: compression::Codec,
        #[arg(long)]
        rows: u64,
        #[arg(long, default_value_t = 4)]
        connections: usize,
        /// Rows per COPY FROM statement (one appended batch)
        #[arg(long, default_value_t = 1000)]
        batch: u64,
        /// Read the table loaded by an earlier point instead of loading it
        #[arg(long)]
        skip_load: bool,
        /// Scans (COPY TO) per point; the fastest is reported
        #[arg(long, default_value_t = 2)]
        runs: usize,
        #[arg(long, default_value_t = 3)]
        aggregate_runs: usize,
    },
    /// fdatasync latency and sequential write bandwidth of a directory's disk
    Disk {
        #[arg(long)]
        dir: std::path::PathBuf,
        #[arg(long, default_value_t = 2000)]
        count: u64,
        /// Bytes for the sequential write
        #[arg(long, default_value_t = 1 << 30)]
        seq_bytes: u64,
    },
    /// The ideal group-commit log on a directory's disk at a fixed rate: the
    /// floor under `latency` (pwrite + fdatasync of every request due)
    Floor {
        #[arg(long)]
        dir: std::path::PathBuf,
        #[arg(long, default_value_t = 1024)]
        size: usize,
        #[arg(long, default_value_t = 3000.0)]
        rate: f64,
        #[arg(long, default_value_t = 10.0)]
        seconds: f64,
    },
}

#[derive(Serialize)]
struct SweepPoint {
    workload: &'static str,
    label: String,
    target: Target,
    size: usize,
    connections: usize,
    seconds: f64,
    acknowledged: u64,
    rows_per_sec: f64,
    mib_per_sec: f64,
    /// Sluice only: committed rows per Raft-log fsync during the point.
    rows_per_fsync: Option<f64>,
}

#[derive(Serialize)]
struct LatencyRun {
    workload: &'static str,
    label: String,
    target: Target,
    size: usize,
    connections: usize,
    rate: f64,
    seconds: f64,
    acknowledged: u64,
    errors: u64,
    percentiles_us: Vec<(String, u64)>,
    max_us: u64,
    /// With `--metrics`: what the server saw during the run.
    server: Option<server_side::ServerSide>,
}

pub(crate) async fn connect(url: &str) -> Result<Client, String> {
    let (client, conn) = tokio_postgres::connect(url, NoTls)
        .await
        .map_err(|e| format!("connect {url}: {e}"))?;
    tokio::spawn(async move {
        let _ = conn.await;
    });
    Ok(client)
}

pub(crate) async fn setup(c: &Common) -> Result<(), String> {
    let client = connect(&c.url).await?;
    let ddl = match c.target {
        Target::Sluice => vec![
            format!("DROP STREAM IF EXISTS {}", c.table),
            format!("CREATE STREAM {} (payload text NOT NULL)", c.table),
        ],
        Target::Postgres => vec![
            format!("DROP TABLE IF EXISTS {}", c.table),
            format!("CREATE TABLE {} (id bigserial PRIMARY KEY, ts timestamptz NOT NULL DEFAULT now(), payload text NOT NULL)", c.table),
        ],
    };
    for stmt in ddl {
        client
            .batch_execute(&stmt)
            .await
            .map_err(|e| format!("{stmt}: {e}"))?;
    }
    Ok(())
}

/// A latency histogram in microseconds, 1 µs to an hour, 3 significant digits.
pub(crate) fn histogram() -> Result<Histogram<u64>, String> {
    Histogram::new_with_bounds(1, 3_600_000_000, 3).map_err(err)
}

/// The reported percentiles of a latency histogram, p50 to p99.9999, as `("p99", µs)`.
pub(crate) fn percentiles(hist: &Histogram<u64>) -> Vec<(String, u64)> {
    [50.0, 90.0, 99.0, 99.9, 99.99, 99.999, 99.9999]
        .iter()
        .map(|q| (format!("p{q}"), hist.value_at_quantile(q / 100.0)))
        .collect()
}

pub(crate) fn payload(size: usize) -> String {
    "x".repeat(size)
}

/// Sluice's log fsync counter, from `sluice_stats`.
/// Lets closed-loop workers run for `seconds`, then raises `stop` and waits for them all
/// (the first worker error ends the run).
async fn run_for(
    seconds: f64,
    stop: &AtomicBool,
    tasks: Vec<tokio::task::JoinHandle<Result<(), String>>>,
) -> Result<(), String> {
    tokio::time::sleep(Duration::from_secs_f64(seconds)).await;
    stop.store(true, Ordering::Relaxed);
    for t in tasks {
        t.await.map_err(err)??;
    }
    Ok(())
}

async fn log_fsyncs(c: &Common) -> Result<Option<i64>, String> {
    if !matches!(c.target, Target::Sluice) {
        return Ok(None);
    }
    let client = connect(&c.url).await?;
    let row = client
        .query_one(
            "SELECT value FROM sluice_stats WHERE metric = 'log_fsyncs'",
            &[],
        )
        .await
        .map_err(err)?;
    Ok(Some(row.get(0)))
}

async fn sweep(
    common: Common,
    counts: Vec<usize>,
    seconds: f64,
) -> Result<Vec<SweepPoint>, String> {
    let mut out = Vec::new();
    for n in counts {
        setup(&common).await?;
        let fsyncs_before = log_fsyncs(&common).await?;
        let mut clients = Vec::with_capacity(n);
        for _ in 0..n {
            clients.push(connect(&common.url).await?);
        }
        let acked = Arc::new(AtomicU64::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let sql = format!("INSERT INTO {} (payload) VALUES ($1)", common.table);
        let body = payload(common.size);
        let start = Instant::now();
        let mut tasks = Vec::new();
        for client in clients {
            let (acked, stop, sql, body) = (acked.clone(), stop.clone(), sql.clone(), body.clone());
            tasks.push(tokio::spawn(async move {
                let stmt = client.prepare(&sql).await.map_err(err)?;
                while !stop.load(Ordering::Relaxed) {
                    client.execute(&stmt, &[&body]).await.map_err(err)?;
                    acked.fetch_add(1, Ordering::Relaxed);
                }
                Ok::<(), String>(())
            }));
        }
        run_for(seconds, &stop, tasks).await?;
        let elapsed = start.elapsed().as_secs_f64();
        let acknowledged = acked.load(Ordering::Relaxed);
        let rows_per_fsync = match (fsyncs_before, log_fsyncs(&common).await?) {
            (Some(a), Some(b)) if b > a => Some(acknowledged as f64 / (b - a) as f64),
            _ => None,
        };
        let rows_per_sec = acknowledged as f64 / elapsed;
        eprintln!(
            "{:>10} {:>4} connections: {:>10.0} rows/s",
            format!("{:?}", common.target),
            n,
            rows_per_sec
        );
        out.push(SweepPoint {
            workload: "sweep",
            label: common.label.clone(),
            target: common.target,
            size: common.size,
            connections: n,
            seconds: elapsed,
            acknowledged,
            rows_per_sec,
            mib_per_sec: rows_per_sec * common.size as f64 / (1024.0 * 1024.0),
            rows_per_fsync,
        });
    }
    Ok(out)
}

/// Releases `total` requests at `rate` per second, round-robin over the
/// connections' queues, from a thread of its own: `std::thread::sleep` wakes
/// within tens of microseconds, where a tokio timer rounds every deadline up
/// to the next millisecond and would add up to a millisecond of the load
/// generator's own lateness to every latency measured from the schedule.
/// A request released to a connection still busy with an earlier one waits
/// in its queue, and its latency counts from its scheduled instant.
fn pace(release: Vec<tokio::sync::mpsc::Sender<Instant>>, rate: f64, total: u64) {
    let start = Instant::now() + Duration::from_millis(200);
    std::thread::spawn(move || {
        for i in 0..total {
            let scheduled = start + Duration::from_secs_f64(i as f64 / rate);
            if let Some(wait) = scheduled.checked_duration_since(Instant::now()) {
                std::thread::sleep(wait);
            }
            // each queue holds all of its connection's requests: never full
            let _ = release[(i % release.len() as u64) as usize].try_send(scheduled);
        }
    });
}

async fn latency(
    common: Common,
    connections: usize,
    rate: f64,
    seconds: f64,
    metrics: Option<String>,
) -> Result<LatencyRun, String> {
    setup(&common).await?;
    let total = (rate * seconds) as u64;
    let sql = format!("INSERT INTO {} (payload) VALUES ($1)", common.table);
    let body = payload(common.size);
    let mut clients = Vec::new();
    for _ in 0..connections {
        clients.push(connect(&common.url).await?);
    }
    let mut tasks = Vec::new();
    let mut release = Vec::new();
    for (c, client) in clients.into_iter().enumerate() {
        let (sql, body) = (sql.clone(), body.clone());
        let per_conn =
            total / connections as u64 + u64::from((c as u64) < total % connections as u64);
        // room for every request of the connection: the pacer never waits
        let (tx, mut rx) = tokio::sync::mpsc::channel::<Instant>(per_conn.max(1) as usize);
        release.push(tx);
        let stmt = client.prepare(&sql).await.map_err(err)?;
        tasks.push(tokio::spawn(async move {
            let mut hist = histogram()?;
            let mut errors = 0u64;
            while let Some(scheduled) = rx.recv().await {
                match client.execute(&stmt, &[&body]).await {
                    Ok(_) => {
                        let us = scheduled.elapsed().as_micros().max(1) as u64;
                        hist.saturating_record(us);
                    }
                    Err(_) => errors += 1,
                }
            }
            Ok::<_, String>((hist, errors))
        }));
    }
    let before = match &metrics {
        Some(addr) => Some(server_side::scrape(addr).await?),
        None => None,
    };
    pace(release, rate, total);
    let mut hist = histogram()?;
    let mut errors = 0;
    for t in tasks {
        let (h, e) = t.await.map_err(err)??;
        hist.add(&h).map_err(err)?;
        errors += e;
    }
    let server = match (&metrics, &before) {
        (Some(addr), Some(before)) => Some(server_side::between(
            before,
            &server_side::scrape(addr).await?,
        )?),
        _ => None,
    };
    Ok(LatencyRun {
        workload: "latency",
        label: common.label.clone(),
        target: common.target,
        size: common.size,
        connections,
        rate,
        seconds,
        acknowledged: hist.len(),
        errors,
        percentiles_us: percentiles(&hist),
        max_us: hist.max(),
        server,
    })
}

fn json<T: Serialize>(value: &T) -> Result<Vec<String>, String> {
    serde_json::to_string(value).map(|j| vec![j]).map_err(err)
}

async fn run(mode: Mode) -> Result<Vec<String>, String> {
    match mode {
        Mode::TailLatency {
            url,
            rate,
            seconds,
            size,
            tails,
        } => json(&tail::tail_latency(&url, rate, seconds, size, tails).await?),
        Mode::StalledTail {
            url,
            rows,
            connections,
            server_pid,
        } => json(&tail::stalled_tail(&url, rows, connections, server_pid).await?),
        Mode::Sweep {
            common,
            connections,
            seconds,
        } => {
            let counts = connections
                .split(',')
                .map(|c| c.trim().parse::<usize>())
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| format!("--connections: {e}"))?;
            sweep(common, counts, seconds)
                .await?
                .iter()
                .map(|p| serde_json::to_string(p).map_err(err))
                .collect()
        }
        Mode::Latency {
            common,
            connections,
            rate,
            seconds,
            metrics,
        } => json(&latency(common, connections, rate, seconds, metrics).await?),
        Mode::Ingest {
            common,
            method,
            connections,
            batch,
            seconds,
        } => json(&bulk::ingest(common, method, connections, batch, seconds).await?),
        Mode::Load {
            common,
            rows,
            connections,
        } => json(&bulk::load(common, rows, connections).await?),
        Mode::Scan { common, runs } => json(&bulk::scan(common, runs).await?),
        Mode::Aggregate { common, runs } => json(&bulk::aggregate(common, runs).await?),
        Mode::Compression {
            common,
            codec,
            rows,
            connections,
            batch,
            skip_load,
            runs,
            aggregate_runs,
        } => {
            let options = compression::Options {
                codec,
                rows,
                connections,
                batch,
                skip_load,
                scan_runs: runs,
                aggregate_runs,
            };
            json(&compression::point(common, options).await)
        }
        Mode::Disk {
            dir,
            count,
            seq_bytes,
        } => json(&disk::probe(&dir, count, seq_bytes)?),
        Mode::Floor {
            dir,
            size,
            rate,
            seconds,
        } => json(&disk::floor(&dir, size, rate, seconds)?),
    }
}

#[tokio::main]
async fn main() {
    match run(Cli::parse().mode).await {
        Ok(lines) => {
            for line in lines {
                println!("JSON {line}");
            }
        }
        Err(e) => {
            eprintln!("sluice-bench: {e}");
            std::process::exit(1);
        }
    }
}
