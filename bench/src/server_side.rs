//! What Sluice itself saw during a latency run, read from its Prometheus endpoint
//! (`sluice serve --metrics-listen`) before and after the run: its Raft log's fsync times,
//! its commit times (proposal sent to the Raft node → answered, the node's queue included),
//! its request times (first message read → ReadyForQuery written) and its checkpoints' times
//! (the Raft node's thread does nothing else meanwhile).
//!
//! The point: an append's latency as the client sees it is the request's time in the server
//! plus the network and the client; a request is its commit plus the connection's own work;
//! a commit waits for the fsync under way (or a checkpoint) and its own. Side by side, they show where an
//! append's tail comes from, and whether the disk's own tail is the floor.
//!
//! Owns: the scrape (one HTTP/1.0 GET), the text-format parsing of a histogram's cumulative
//! `_bucket` samples, and the percentiles of the difference between two scrapes.
//! Invariants: a percentile is a bucket's upper bound (the true value is at or below it),
//! `None` when it falls in the `+Inf` bucket; the counts are the run's alone (after minus
//! before).

use serde::Serialize;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::err;

/// The histograms read, by their Prometheus names.
const FSYNC: &str = "sluice_log_fsync_seconds";
const COMMIT: &str = "sluice_commit_seconds";
const REQUEST: &str = "sluice_request_seconds";
const CHECKPOINT: &str = "sluice_checkpoint_seconds";

/// The quantiles reported, then `max` (the highest bucket with an observation).
const QUANTILES: [f64; 4] = [50.0, 99.0, 99.9, 99.99];

/// The server's own view of a run.
#[derive(Debug, Serialize, PartialEq)]
pub(crate) struct ServerSide {
    /// Raft log fsyncs during the run.
    pub(crate) fsyncs: u64,
    /// Upper bounds of their time's buckets at p50 .. p99.99 and max, in µs.
    pub(crate) fsync_le_us: Bounds,
    /// Commits (requests answered by the Raft node) during the run.
    pub(crate) commits: u64,
    /// Upper bounds of the commit time's buckets at p50 .. p99.99 and max, in µs.
    pub(crate) commit_le_us: Bounds,
    /// Client requests the server finished during the run.
    pub(crate) requests: u64,
    /// Upper bounds of the request time's buckets at p50 .. p99.99 and max, in µs.
    pub(crate) request_le_us: Bounds,
    /// Checkpoints during the run.
    pub(crate) checkpoints: u64,
    /// Upper bounds of the checkpoint time's buckets at p50 .. p99.99 and max, in µs.
    pub(crate) checkpoint_le_us: Bounds,
}

/// The histograms at one instant: (upper bound in seconds, `+Inf` as infinity; cumulative
/// count), in the order the server lists them.
#[derive(Debug, Clone)]
pub(crate) struct Scrape {
    fsync: Vec<(f64, u64)>,
    commit: Vec<(f64, u64)>,
    request: Vec<(f64, u64)>,
    checkpoint: Vec<(f64, u64)>,
}

/// Reads the metrics endpoint at `addr` (host:port).
pub(crate) async fn scrape(addr: &str) -> Result<Scrape, String> {
    let mut stream = tokio::net::TcpStream::connect(addr)
        .await
        .map_err(|e| format!("metrics endpoint {addr}: {e}"))?;
    stream
        .write_all(b"GET /metrics HTTP/1.0\r\nHost: bench\r\n\r\n")
        .await
        .map_err(err)?;
    let mut response = String::new();
    stream.read_to_string(&mut response).await.map_err(err)?;
    let body = response
        .split_once("\r\n\r\n")
        .map(|(_, b)| b)
        .ok_or_else(|| format!("metrics endpoint {addr}: no HTTP body"))?;
    Ok(Scrape {
        fsync: buckets(body, FSYNC)?,
        commit: buckets(body, COMMIT)?,
        request: buckets(body, REQUEST)?,
        checkpoint: buckets(body, CHECKPOINT)?,
    })
}

/// The run between two scrapes.
pub(crate) fn between(before: &Scrape, after: &Scrape) -> Result<ServerSide, String> {
    let (fsyncs, fsync_le_us) = summary(&before.fsync, &after.fsync)?;
    let (commits, commit_le_us) = summary(&before.commit, &after.commit)?;
    let (requests, request_le_us) = summary(&before.request, &after.request)?;
    let (checkpoints, checkpoint_le_us) = summary(&before.checkpoint, &after.checkpoint)?;
    Ok(ServerSide {
        fsyncs,
        fsync_le_us,
        commits,
        commit_le_us,
        requests,
        request_le_us,
        checkpoints,
        checkpoint_le_us,
    })
}

/// A histogram's cumulative buckets from the text format.
fn buckets(text: &str, name: &str) -> Result<Vec<(f64, u64)>, String> {
    let prefix = format!("{name}_bucket{{le=\"");
    let mut out = Vec::new();
    for line in text.lines() {
        let Some(rest) = line.strip_prefix(&prefix) else {
            continue;
        };
        let (le, count) = rest
            .split_once("\"} ")
            .ok_or_else(|| format!("metrics: cannot read {line:?}"))?;
        let le = if le == "+Inf" {
            f64::INFINITY
        } else {
            le.parse::<f64>()
                .map_err(|e| format!("metrics: {line:?}: {e}"))?
        };
        let count = count
            .trim()
            .parse::<u64>()
            .map_err(|e| format!("metrics: {line:?}: {e}"))?;
        out.push((le, count));
    }
    if out.is_empty() {
        return Err(format!("metrics: no {name} histogram"));
    }
    Ok(out)
}

/// Quantile labels ("p99", …, "max") and their buckets' upper bounds in µs (`None`: `+Inf`).
type Bounds = Vec<(String, Option<u64>)>;

/// The count and the quantiles' bucket bounds of `after - before`.
fn summary(before: &[(f64, u64)], after: &[(f64, u64)]) -> Result<(u64, Bounds), String> {
    if before.len() != after.len() || before.iter().zip(after).any(|(b, a)| b.0 != a.0) {
        return Err("metrics: the histogram's buckets changed between scrapes".into());
    }
    let run: Vec<(f64, u64)> = before
        .iter()
        .zip(after)
        .map(|(b, a)| (a.0, a.1.saturating_sub(b.1)))
        .collect();
    let total = run.last().map_or(0, |(_, n)| *n);
    let micros = |le: f64| le.is_finite().then(|| (le * 1e6).round() as u64);
    let mut out: Bounds = QUANTILES
        .iter()
        .map(|q| {
            let rank = (q / 100.0 * total as f64).ceil() as u64;
            let le = run
                .iter()
                .find(|(_, n)| *n >= rank.max(1))
                .map_or(f64::INFINITY, |(le, _)| *le);
            (format!("p{q}"), micros(le))
        })
        .collect();
    let max = run
        .iter()
        .find(|(_, n)| *n == total)
        .filter(|_| total > 0)
        .map_or(f64::INFINITY, |(le, _)| *le);
    out.push(("max".into(), micros(max)));
    Ok((total, out))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(fsync: &[(&str, u64)]) -> String {
        let mut t = String::from("# HELP sluice_log_fsync_seconds x\n");
        for (le, n) in fsync {
            t.push_str(&format!("{FSYNC}_bucket{{le=\"{le}\"}} {n}\n"));
        }
        t.push_str(&format!("{FSYNC}_sum 1.5\n{FSYNC}_count 0\n"));
        t
    }

    #[test]
    fn quantiles_are_bucket_bounds_of_the_run_alone() {
        let before = buckets(
            &text(&[("0.0001", 5), ("0.001", 5), ("0.01", 5), ("+Inf", 5)]),
            FSYNC,
        )
        .unwrap();
        // the run: 9,990 at ≤ 100 µs, 9 in (0.1, 1] ms, 1 in (1, 10] ms
        let after = buckets(
            &text(&[
                ("0.0001", 9_995),
                ("0.001", 10_004),
                ("0.01", 10_005),
                ("+Inf", 10_005),
            ]),
            FSYNC,
        )
        .unwrap();
        let (n, q) = summary(&before, &after).unwrap();
        assert_eq!(n, 10_000);
        let q: std::collections::BTreeMap<_, _> = q.into_iter().collect();
        assert_eq!(q["p50"], Some(100));
        assert_eq!(q["p99"], Some(100));
        assert_eq!(q["p99.9"], Some(1_000));
        assert_eq!(q["p99.99"], Some(1_000));
        assert_eq!(q["max"], Some(10_000));
    }

    #[test]
    fn the_inf_bucket_has_no_bound_and_changed_buckets_are_refused() {
        let before = buckets(&text(&[("0.001", 0), ("+Inf", 0)]), FSYNC).unwrap();
        let after = buckets(&text(&[("0.001", 1), ("+Inf", 2)]), FSYNC).unwrap();
        let (_, q) = summary(&before, &after).unwrap();
        assert_eq!(q.last(), Some(&("max".to_string(), None)));
        assert_eq!(q[0], ("p50".to_string(), Some(1_000)));
        let other = buckets(&text(&[("0.002", 1), ("+Inf", 2)]), FSYNC).unwrap();
        assert!(summary(&before, &other).is_err());
        assert!(buckets("nothing here", FSYNC).is_err());
    }
}
