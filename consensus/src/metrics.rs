//! Counters and histograms the node task bumps as it works. They are plain relaxed atomics:
//! each one is monotonic on its own, and readers (the server's metrics endpoint, tests)
//! never need a consistent snapshot across counters. A histogram has fixed buckets (no
//! allocation after start, bounded memory).

use std::sync::atomic::{AtomicU64, Ordering};

/// Monotonic counters of the node's work.
#[derive(Debug)]
pub struct Metrics {
    /// Proposals received by the node task (including ones it then rejected).
    pub proposals: AtomicU64,
    /// Committed entries handed to the apply path, including Raft's empty and
    /// configuration entries.
    pub committed_entries: AtomicU64,
    /// Writes to the Raft log (one per Ready with entries or a HardState).
    pub log_writes: AtomicU64,
    /// fsyncs of the Raft log. `committed_entries / log_fsyncs` is the group-commit factor.
    pub log_fsyncs: AtomicU64,
    /// Bytes written to the Raft log, framing included.
    pub log_bytes: AtomicU64,
    /// State-machine checkpoints made durable (each followed by a log compaction).
    pub checkpoints: AtomicU64,
    /// Snapshots built for lagging followers.
    pub snapshots_built: AtomicU64,
    /// Snapshots received and installed.
    pub snapshots_installed: AtomicU64,
    /// Time of each fsync of the Raft log, in microseconds.
    pub fsync_micros: Histogram,
    /// Log entries made durable by each fsync (the group-commit factor, per fsync).
    pub entries_per_fsync: Histogram,
    /// Time the node thread spends on each state-machine checkpoint and the log compaction
    /// after it, in microseconds (commits wait for it meanwhile): all of a synchronous one
    /// (a backup's, a snapshot's, shutdown's); of a periodic one, starting it and compacting,
    /// not its fsyncs and durable write, which run on the checkpoint thread.
    pub checkpoint_micros: Histogram,
    /// From a proposal being sent to the node task (its wait in the node's queue included)
    /// to its answer (applied here), in microseconds.
    pub commit_micros: Histogram,
}

/// Bucket bounds for latencies in microseconds: 25 µs .. 5 s, a few per doubling up to
/// 25 ms, so that a commit's tail can be read against the fsync's (bench/ does, per run).
pub const LATENCY_MICROS: &[u64] = &[
    25, 50, 75, 100, 150, 200, 300, 500, 750, 1_000, 1_500, 2_000, 3_000, 5_000, 7_500, 10_000,
    15_000, 25_000, 50_000, 100_000, 250_000, 1_000_000, 5_000_000,
];

/// Bucket bounds for counts: 1 .. 4096.
pub const COUNTS: &[u64] = &[1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 4096];

impl Default for Metrics {
    fn default() -> Metrics {
        Metrics {
            proposals: AtomicU64::new(0),
            committed_entries: AtomicU64::new(0),
            log_writes: AtomicU64::new(0),
            log_fsyncs: AtomicU64::new(0),
            log_bytes: AtomicU64::new(0),
            checkpoints: AtomicU64::new(0),
            snapshots_built: AtomicU64::new(0),
            snapshots_installed: AtomicU64::new(0),
            fsync_micros: Histogram::new(LATENCY_MICROS),
            entries_per_fsync: Histogram::new(COUNTS),
            checkpoint_micros: Histogram::new(LATENCY_MICROS),
            commit_micros: Histogram::new(LATENCY_MICROS),
        }
    }
}

/// Most buckets a [`Histogram`] has (its bounds, plus one for everything above them).
const MAX_BUCKETS: usize = 24;

/// A histogram with fixed upper bounds (Prometheus' `le`), observed with relaxed atomics.
#[derive(Debug)]
pub struct Histogram {
    bounds: &'static [u64],
    /// Per bucket (not cumulative); the last counts values above every bound.
    buckets: [AtomicU64; MAX_BUCKETS],
    sum: AtomicU64,
    count: AtomicU64,
}

/// A histogram as read: cumulative counts per bound, then the total.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HistogramSnapshot {
    /// (upper bound, observations at or below it), in bound order.
    pub buckets: Vec<(u64, u64)>,
    pub sum: u64,
    pub count: u64,
}

impl Histogram {
    /// `bounds` ascending, at most `MAX_BUCKETS - 1` of them.
    pub fn new(bounds: &'static [u64]) -> Histogram {
        assert!(bounds.len() < MAX_BUCKETS && bounds.is_sorted());
        Histogram {
            bounds,
            buckets: Default::default(),
            sum: AtomicU64::new(0),
            count: AtomicU64::new(0),
        }
    }

    pub fn observe(&self, value: u64) {
        let i = self.bounds.partition_point(|b| *b < value);
        self.buckets[i].fetch_add(1, Ordering::Relaxed);
        self.sum.fetch_add(value, Ordering::Relaxed);
        self.count.fetch_add(1, Ordering::Relaxed);
    }

    pub fn snapshot(&self) -> HistogramSnapshot {
        let mut cumulative = 0;
        let buckets = self
            .bounds
            .iter()
            .zip(&self.buckets)
            .map(|(bound, n)| {
                cumulative += n.load(Ordering::Relaxed);
                (*bound, cumulative)
            })
            .collect();
        HistogramSnapshot {
            buckets,
            sum: self.sum.load(Ordering::Relaxed),
            count: self.count.load(Ordering::Relaxed),
        }
    }
}

impl Metrics {
    pub(crate) fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }

    /// Reads a counter.
    pub fn get(counter: &AtomicU64) -> u64 {
        counter.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn observations_land_in_cumulative_buckets() {
        let h = Histogram::new(&[1, 10, 100]);
        for v in [0, 1, 2, 10, 11, 100, 1000] {
            h.observe(v);
        }
        assert_eq!(
            h.snapshot(),
            HistogramSnapshot {
                buckets: vec![(1, 2), (10, 4), (100, 6)],
                sum: 1124,
                count: 7
            }
        );
    }
}
