//! Tail workloads: end-to-end tail latency, and the cost of a tail that
//! stops reading.
//!
//! - `tail_latency`: writers insert at a fixed rate while a COPY-out tail
//!   follows the stream; for each row, latency = time the tail received it
//!   minus the time the writer got its acknowledgement (commit → received),
//!   clamped at zero (the tail may see a row before the ack reaches the
//!   writer). With `tails > 1`, that many COPY tails follow the stream at
//!   once (fan-out) and every tail's every row is recorded.
//! - `stalled_tail`: closed-loop inserts of N rows with no tail, then the
//!   same with a COPY-out tail that never reads; reports both throughputs,
//!   their ratio, and the server's resident memory (from /proc) before and
//!   after.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use parking_lot::Mutex;
use serde::Serialize;

use crate::{connect, err};

#[derive(Serialize)]
pub struct TailLatency {
    pub workload: &'static str,
    pub target: &'static str,
    /// Concurrent COPY tails following the stream (fan-out).
    pub tails: usize,
    pub rate: f64,
    pub seconds: f64,
    pub rows: u64,
    pub percentiles_us: Vec<(String, u64)>,
    pub max_us: u64,
}

#[derive(Serialize)]
pub struct StalledTail {
    pub workload: &'static str,
    pub rows: u64,
    pub connections: usize,
    pub baseline_rows_per_sec: f64,
    pub stalled_rows_per_sec: f64,
    pub ratio: f64,
    pub rss_before_kib: Option<u64>,
    pub rss_after_kib: Option<u64>,
}

async fn setup(url: &str, stream: &str) -> Result<(), String> {
    let c = connect(url).await?;
    c.batch_execute(&format!(
        "DROP STREAM IF EXISTS {stream}; CREATE STREAM {stream} (seq bigint NOT NULL, payload text NOT NULL)"
    ))
    .await
    .map_err(err)
}

pub async fn tail_latency(
    url: &str,
    rate: f64,
    seconds: f64,
    size: usize,
    tails: usize,
) -> Result<TailLatency, String> {
    setup(url, "tail_lat").await?;
    let total = (rate * seconds) as i64;
    let acks: Arc<Mutex<HashMap<i64, Instant>>> = Arc::new(Mutex::new(HashMap::new()));
    let mut readers = Vec::with_capacity(tails);
    for _ in 0..tails {
        let tail_client = connect(url).await?;
        let copy = tail_client
            .copy_out("COPY (SELECT seq FROM tail_lat WHERE offset >= 0) TO STDOUT")
            .await
            .map_err(err)?;
        readers.push(tokio::spawn(async move {
            // the client must outlive its COPY
            let _client = tail_client;
            let mut copy = Box::pin(copy);
            let mut received: Vec<(i64, Instant)> = Vec::with_capacity(total as usize);
            let deadline = Instant::now() + Duration::from_secs_f64(seconds + 30.0);
            while (received.len() as i64) < total && Instant::now() < deadline {
                match tokio::time::timeout(Duration::from_secs(5), copy.next()).await {
                    Ok(Some(Ok(chunk))) => {
                        let now = Instant::now();
                        for line in String::from_utf8_lossy(&chunk).lines() {
                            if let Ok(seq) = line.trim().parse::<i64>() {
                                received.push((seq, now));
                            }
                        }
                    }
                    _ => break,
                }
            }
            received
        }));
    }
    let writers = 4usize;
    let interval = Duration::from_secs_f64(writers as f64 / rate);
    let start = Instant::now() + Duration::from_millis(200);
    let body = "x".repeat(size);
    let mut tasks = Vec::new();
    for w in 0..writers {
        let client = connect(url).await?;
        let (acks, body) = (acks.clone(), body.clone());
        let offset = interval.mul_f64(w as f64 / writers as f64);
        tasks.push(tokio::spawn(async move {
            let stmt = client
                .prepare("INSERT INTO tail_lat (seq, payload) VALUES ($1, $2)")
                .await
                .map_err(err)?;
            let mut k = 0i64;
            loop {
                let seq = k * writers as i64 + w as i64;
                if seq >= total {
                    break;
                }
                tokio::time::sleep_until((start + offset + interval.mul_f64(k as f64)).into())
                    .await;
                client.execute(&stmt, &[&seq, &body]).await.map_err(err)?;
                acks.lock().insert(seq, Instant::now());
                k += 1;
            }
            Ok::<(), String>(())
        }));
    }
    for t in tasks {
        t.await.map_err(err)??;
    }
    let mut hist = crate::histogram()?;
    for reader in readers {
        let received = reader.await.map_err(err)?;
        let acks = acks.lock();
        let before = hist.len();
        for (seq, at) in &received {
            if let Some(ack) = acks.get(seq) {
                let us = at.saturating_duration_since(*ack).as_micros().max(1) as u64;
                hist.saturating_record(us);
            }
        }
        if hist.len() - before < total as u64 {
            return Err(format!(
                "a tail received {} of {} rows",
                hist.len() - before,
                total
            ));
        }
    }
    Ok(TailLatency {
        workload: "tail_latency",
        target: "sluice",
        tails,
        rate,
        seconds,
        rows: hist.len(),
        percentiles_us: crate::percentiles(&hist),
        max_us: hist.max(),
    })
}

fn rss_kib(pid: Option<u32>) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{}/status", pid?)).ok()?;
    status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
}

async fn insert_rows(
    url: &str,
    stream: &str,
    rows: u64,
    connections: usize,
) -> Result<f64, String> {
    let per = rows / connections as u64;
    let start = Instant::now();
    let mut tasks = Vec::new();
    for c in 0..connections {
        let client = connect(url).await?;
        let sql = format!("INSERT INTO {stream} (seq, payload) VALUES ($1, $2)");
        tasks.push(tokio::spawn(async move {
            let stmt = client.prepare(&sql).await.map_err(err)?;
            let body = "x".repeat(256);
            for i in 0..per {
                let seq = (c as u64 * per + i) as i64;
                client.execute(&stmt, &[&seq, &body]).await.map_err(err)?;
            }
            Ok::<(), String>(())
        }));
    }
    for t in tasks {
        t.await.map_err(err)??;
    }
    Ok((per * connections as u64) as f64 / start.elapsed().as_secs_f64())
}

pub async fn stalled_tail(
    url: &str,
    rows: u64,
    connections: usize,
    server_pid: Option<u32>,
) -> Result<StalledTail, String> {
    setup(url, "tail_base").await?;
    let baseline = insert_rows(url, "tail_base", rows, connections).await?;
    setup(url, "tail_stall").await?;
    let rss_before = rss_kib(server_pid);
    let tail_client = connect(url).await?;
    // start the tail, then never read from it
    let copy = tail_client
        .copy_out("COPY (SELECT seq, payload FROM tail_stall WHERE offset >= 0) TO STDOUT")
        .await
        .map_err(err)?;
    let stalled = insert_rows(url, "tail_stall", rows, connections).await?;
    let rss_after = rss_kib(server_pid);
    drop(copy);
    Ok(StalledTail {
        workload: "stalled_tail",
        rows,
        connections,
        baseline_rows_per_sec: baseline,
        stalled_rows_per_sec: stalled,
        ratio: stalled / baseline,
        rss_before_kib: rss_before,
        rss_after_kib: rss_after,
    })
}
