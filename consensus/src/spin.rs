//! Brief spinning instead of sleeping while a local commit is moments away.
//!
//! At one connection a commit is a relay between threads: the connection's runtime hands the
//! proposal to the node thread and sleeps; the node thread wakes, writes and fsyncs the log,
//! applies and answers; the runtime wakes and replies. Each wake-up of a sleeping thread costs
//! tens of microseconds on a virtual machine (the idle vCPU is woken through the hypervisor),
//! a third of a commit's time where the fsync itself takes ~120 µs. So, on a single-voter node
//! (the commit is local, no network round trip to wait for):
//!
//! - the node thread, after a round that handled proposals, polls its queue for up to the
//!   budget before it parks (only while batches are single proposals: with more connections
//!   the queue is never empty for long, and spinning would only take CPU from them);
//! - a connection runtime's worker about to park while exactly one proposal of this process
//!   is outstanding spins, up to the budget, until the node thread reports a round done; then
//!   it parks as usual and finds the answer's wake-up already there.
//!
//! Owns: the process-wide budget ([`set_budget`]; 0 turns spinning off), the count of
//! proposals in flight, the node thread's round counter.
//! Invariants: spinning never decides anything — it replaces the start of a sleep with a
//! bounded busy wait, and every wait still ends through the ordinary wake-up; at most one
//! worker spins at a time; a spin never outlasts the budget.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// The default budget: a few fsyncs of a small write on the disks this was measured on
/// (~120 µs each), so a spin covers the usual commit and the client's turn around, and gives
/// up on a slow one (measured: 250 µs gained less at one connection than 500–1,000).
pub const DEFAULT_BUDGET: Duration = Duration::from_micros(500);

/// The process's spinner: node threads and connection runtimes of one process share it.
static SPIN: Spinner = Spinner::new(DEFAULT_BUDGET.as_nanos() as u64);

/// Sets how long a thread may spin for a commit instead of sleeping; zero turns it off.
pub fn set_budget(budget: Duration) {
    SPIN.set_budget(budget);
}

/// The current budget (zero: off).
pub fn budget() -> Duration {
    SPIN.budget()
}

/// For a connection runtime's `on_thread_park`: spins while exactly one proposal is in
/// flight on a local node, until the node thread finishes a round or the budget runs out.
pub fn before_park() {
    SPIN.before_park();
}

/// Counts one proposal in flight for as long as the guard lives.
pub(crate) fn in_flight() -> InFlight<'static> {
    SPIN.start()
}

/// The node thread finished a round (its answers are sent); `local`: it is a single voter
/// with no peers.
pub(crate) fn round_done(local: bool) {
    SPIN.round_done(local);
}

/// The shared state (one per process; tests make their own).
#[derive(Debug)]
pub(crate) struct Spinner {
    budget_nanos: AtomicU64,
    /// A single-voter node commits locally (set by its node thread).
    local: AtomicBool,
    /// `NodeHandle::propose` calls in progress.
    in_flight: AtomicU64,
    /// Bumped by a node thread after every round.
    rounds: AtomicU64,
    /// A worker is spinning in [`Spinner::before_park`].
    spinning: AtomicBool,
}

impl Spinner {
    pub(crate) const fn new(budget_nanos: u64) -> Spinner {
        Spinner {
            budget_nanos: AtomicU64::new(budget_nanos),
            local: AtomicBool::new(false),
            in_flight: AtomicU64::new(0),
            rounds: AtomicU64::new(0),
            spinning: AtomicBool::new(false),
        }
    }

    pub(crate) fn set_budget(&self, budget: Duration) {
        let nanos = u64::try_from(budget.as_nanos()).unwrap_or(u64::MAX);
        self.budget_nanos.store(nanos, Ordering::Relaxed);
    }

    pub(crate) fn budget(&self) -> Duration {
        Duration::from_nanos(self.budget_nanos.load(Ordering::Relaxed))
    }

    pub(crate) fn start(&self) -> InFlight<'_> {
        self.in_flight.fetch_add(1, Ordering::Relaxed);
        InFlight(self)
    }

    pub(crate) fn round_done(&self, local: bool) {
        if self.local.load(Ordering::Relaxed) != local {
            self.local.store(local, Ordering::Relaxed);
        }
        self.rounds.fetch_add(1, Ordering::Release);
    }

    pub(crate) fn before_park(&self) {
        let budget = self.budget();
        if budget.is_zero()
            || !self.local.load(Ordering::Relaxed)
            || self.in_flight.load(Ordering::Relaxed) != 1
            || self.spinning.swap(true, Ordering::Acquire)
        {
            return;
        }
        let seen = self.rounds.load(Ordering::Acquire);
        let start = Instant::now();
        while self.rounds.load(Ordering::Acquire) == seen && start.elapsed() < budget {
            std::hint::spin_loop();
        }
        self.spinning.store(false, Ordering::Release);
    }
}

/// One proposal in flight (see [`in_flight`]).
pub(crate) struct InFlight<'a>(&'a Spinner);

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::Relaxed);
    }
}

/// How the node thread decides whether to spin: a moving average of its batch sizes.
#[derive(Debug)]
pub(crate) struct BatchAverage {
    /// Proposals per batch × 256, averaged over the last ~8 batches.
    scaled: u32,
}

impl BatchAverage {
    pub(crate) fn new() -> BatchAverage {
        BatchAverage { scaled: 256 }
    }

    pub(crate) fn record(&mut self, proposals: usize) {
        let n = u32::try_from(proposals.min(1 << 16)).unwrap_or(1 << 16);
        self.scaled = self.scaled - self.scaled / 8 + n * 32;
    }

    /// Batches have been single proposals (at most 1.25 on average): one client at a time.
    pub(crate) fn single(&self) -> bool {
        self.scaled <= 320
    }
}

#[cfg(test)]
mod tests;
