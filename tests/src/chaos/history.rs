//! What the workloads observed, in the shapes the checker reads: one record per append
//! attempt, the rows each tail received, the bank reads, and the leaders the monitor saw.
//! Times are offsets from the run's start ([`Clock`]), so records from different tasks
//! compare directly.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The run's time origin.
#[derive(Clone, Copy, Debug)]
pub struct Clock(Instant);

impl Clock {
    pub fn start() -> Clock {
        Clock(Instant::now())
    }

    /// Time since the run started.
    pub fn now(&self) -> Duration {
        self.0.elapsed()
    }
}

/// How an append attempt ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Acknowledged at this offset.
    Ok(i64),
    /// Refused with an error that guarantees it was not applied (the SQLSTATE).
    Failed(String),
    /// It may or may not have been applied (timeout, lost connection, 40003, ...).
    Unknown(String),
}

/// One `INSERT INTO chaos_log (client, seq) ... RETURNING offset` attempt.
#[derive(Clone, Debug)]
pub struct Op {
    pub client: i64,
    pub seq: i64,
    /// The node the client was connected to.
    pub node: u64,
    pub start: Duration,
    pub end: Duration,
    pub outcome: Outcome,
}

/// One row of `chaos_log`, as text where the server formats it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LogRow {
    pub offset: i64,
    pub client: i64,
    pub seq: i64,
    pub ts: String,
}

/// Everything one node's COPY tail received, in arrival order, across reconnects.
#[derive(Debug, Default)]
pub struct TailLog {
    pub node: u64,
    pub rows: Vec<LogRow>,
    /// COPY statements started (1 + reconnects).
    pub copies: u64,
    /// Errors that ended a COPY (kept short).
    pub errors: Vec<String>,
    /// Set once the tail task stopped for good (the node left the cluster).
    pub stopped: bool,
}

/// One read of the bank's accounts on one node.
#[derive(Clone, Debug)]
pub struct BankRead {
    pub at: Duration,
    pub node: u64,
    pub total: i64,
    pub accounts: i64,
    pub min_balance: i64,
}

/// A leader as reported by a node about itself.
#[derive(Clone, Debug)]
pub struct LeaderSeen {
    pub at: Duration,
    pub term: i64,
    pub leader: u64,
}

/// Shared, append-only records of the whole run.
#[derive(Default)]
pub struct History {
    pub ops: Mutex<Vec<Op>>,
    pub tails: Mutex<Vec<Arc<Mutex<TailLog>>>>,
    pub bank_reads: Mutex<Vec<BankRead>>,
    /// Transfers committed / attempted.
    pub bank_committed: Mutex<(u64, u64)>,
    pub leaders: Mutex<Vec<LeaderSeen>>,
}

impl History {
    pub fn push_op(&self, op: Op) {
        lock(&self.ops).push(op);
    }

    pub fn ops(&self) -> Vec<Op> {
        lock(&self.ops).clone()
    }

    /// Ops acknowledged in `[from, to)` (by acknowledgement time), with their end times.
    pub fn acks_between(&self, from: Duration, to: Duration) -> Vec<Duration> {
        lock(&self.ops)
            .iter()
            .filter(|o| matches!(o.outcome, Outcome::Ok(_)) && o.end >= from && o.end < to)
            .map(|o| o.end)
            .collect()
    }
}

/// Locks a mutex, ignoring poisoning: a panicked task must not hide the history.
pub fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}
