//! Counters the node task bumps as it works. They are plain relaxed atomics: each one is
//! monotonic on its own, and readers (the server's metrics endpoint, tests) never need a
//! consistent snapshot across counters.

use std::sync::atomic::{AtomicU64, Ordering};

/// Monotonic counters of the node's work.
#[derive(Debug, Default)]
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
    /// State-machine checkpoints (each followed by a log compaction).
    pub checkpoints: AtomicU64,
    /// Snapshots built for lagging followers.
    pub snapshots_built: AtomicU64,
    /// Snapshots received and installed.
    pub snapshots_installed: AtomicU64,
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
