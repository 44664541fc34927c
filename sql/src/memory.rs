//! Statement memory: how much a session's running statement may hold, and where DataFusion
//! spills what does not fit.
//!
//! Every session has one [`StatementMemory`], the memory pool of its DataFusion runtime: the
//! hash tables of joins and aggregates (`count(DISTINCT ...)` included), sort buffers and
//! cross-join inputs reserve from it as they grow, and a reservation beyond its limit fails
//! with DataFusion's `ResourcesExhausted`, which a client sees as `53200` (out of memory).
//! Operators that can spill (sorts, grouped aggregates, sort-merge joins) first write to
//! the engine's spill directory, `<data dir>/spill`, bounded as a whole by
//! [`crate::Limits::max_spill_bytes`] and emptied at startup.
//!
//! Every session's pool also reserves from the server's one [`QueryMemory`]
//! (`max_query_memory`), so many sessions each within their own limit cannot together hold
//! more than the server allows: the statement that would pass it fails with `53200` too.
//!
//! Invariants: the limit is the server's `max_statement_memory`, or less when the session
//! lowers it (`SET max_statement_memory`); the bytes a session holds are also held in the
//! server's count, taken before and given back with the session's own; a session runs one
//! statement at a time, so this is the statement's budget (an open cursor's plan keeps its reservations, and counts
//! against the statements that run while it is open). Memory DataFusion does not account
//! (batches in flight between operators, a function's output array) is not counted; the
//! functions that can build one huge value from a small input are bounded on their own
//! ([`crate::value_size`]).

use std::fmt;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use datafusion::error::{DataFusionError, Result as DFResult};
use datafusion::execution::disk_manager::{DiskManager, DiskManagerBuilder, DiskManagerMode};
use datafusion::execution::memory_pool::{MemoryLimit, MemoryPool, MemoryReservation};

use crate::error::{Error, Result, OUT_OF_MEMORY_MESSAGE};

/// The name of the setting (and the server flag) that bounds a statement's memory.
pub const SETTING: &str = "max_statement_memory";

/// The smallest limit a session may set.
pub const MIN_STATEMENT_MEMORY: usize = 1 << 20;

/// The server's default: a quarter of the machine's memory (its cgroup's limit, when that
/// is lower) in whole megabytes, and at least 256 MiB. A few statements at their limit at
/// once still fit.
pub fn default_statement_memory() -> usize {
    (((machine_memory() / 4) >> 20) << 20).max(256 << 20)
}

/// The server's default for all statements together: half of the machine's memory, and
/// never less than one statement's default.
pub fn default_query_memory() -> usize {
    (((machine_memory() / 2) >> 20) << 20).max(default_statement_memory())
}

/// The name of the server flag bounding all running statements' memory together.
pub const SERVER_SETTING: &str = "max_query_memory";

/// What all sessions' running statements hold together, and the most they may.
#[derive(Debug)]
pub struct QueryMemory {
    limit: usize,
    used: AtomicUsize,
}

impl QueryMemory {
    pub fn new(limit: usize) -> Arc<QueryMemory> {
        Arc::new(QueryMemory {
            limit,
            used: AtomicUsize::new(0),
        })
    }

    pub fn limit(&self) -> usize {
        self.limit
    }

    /// Bytes reserved now by every session's running plans.
    pub fn used(&self) -> usize {
        self.used.load(Ordering::Relaxed)
    }

    fn try_take(&self, bytes: usize) -> bool {
        self.used
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |used| {
                used.checked_add(bytes).filter(|n| *n <= self.limit)
            })
            .is_ok()
    }
}

/// Physical memory, or the cgroup's limit if lower; 4 GiB when neither can be read.
fn machine_memory() -> usize {
    let total = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            m.lines()
                .find_map(|l| l.strip_prefix("MemTotal:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        })
        .map(|kb| kb.saturating_mul(1024));
    let cgroup = [
        "/sys/fs/cgroup/memory.max",
        "/sys/fs/cgroup/memory/memory.limit_in_bytes",
    ]
    .iter()
    .find_map(|p| std::fs::read_to_string(p).ok()?.trim().parse::<u64>().ok());
    let bytes = match (total, cgroup) {
        (Some(t), Some(c)) => t.min(c),
        (Some(t), None) => t,
        (None, Some(c)) => c,
        (None, None) => 4 << 30,
    };
    usize::try_from(bytes).unwrap_or(usize::MAX)
}

/// A session's memory pool: DataFusion's greedy policy (first come, first served) with a
/// limit the session can change between statements.
#[derive(Debug)]
pub struct StatementMemory {
    limit: AtomicUsize,
    used: AtomicUsize,
    server: Arc<QueryMemory>,
}

impl StatementMemory {
    pub fn new(limit: usize, server: Arc<QueryMemory>) -> Arc<StatementMemory> {
        Arc::new(StatementMemory {
            limit: AtomicUsize::new(limit),
            used: AtomicUsize::new(0),
            server,
        })
    }

    pub fn limit(&self) -> usize {
        self.limit.load(Ordering::Relaxed)
    }

    pub fn set_limit(&self, limit: usize) {
        self.limit.store(limit, Ordering::Relaxed);
    }

    /// Bytes reserved now by the session's running plans.
    pub fn used(&self) -> usize {
        self.used.load(Ordering::Relaxed)
    }
}

impl fmt::Display for StatementMemory {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "StatementMemory({} of {})", self.used(), self.limit())
    }
}

impl MemoryPool for StatementMemory {
    fn name(&self) -> &str {
        "sluice_statement_memory"
    }

    fn grow(&self, _: &MemoryReservation, additional: usize) {
        self.server.used.fetch_add(additional, Ordering::Relaxed);
        self.used.fetch_add(additional, Ordering::Relaxed);
    }

    fn shrink(&self, _: &MemoryReservation, shrink: usize) {
        self.used.fetch_sub(shrink, Ordering::Relaxed);
        self.server.used.fetch_sub(shrink, Ordering::Relaxed);
    }

    fn try_grow(&self, reservation: &MemoryReservation, additional: usize) -> DFResult<()> {
        let limit = self.limit();
        let refused = |what: &str, limit: usize| {
            DataFusionError::ResourcesExhausted(format!(
                "{OUT_OF_MEMORY_MESSAGE}: {what} ({}); {} asked for {} more",
                format_bytes(limit),
                reservation.consumer().name(),
                format_bytes(additional),
            ))
        };
        self.used
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |used| {
                used.checked_add(additional).filter(|n| *n <= limit)
            })
            .map_err(|_| refused(&format!("the statement needs more than {SETTING}"), limit))?;
        if !self.server.try_take(additional) {
            self.used.fetch_sub(additional, Ordering::Relaxed);
            return Err(refused(
                &format!(
                    "the server's running statements together need more than {SERVER_SETTING}"
                ),
                self.server.limit,
            ));
        }
        Ok(())
    }

    fn reserved(&self) -> usize {
        self.used()
    }

    fn memory_limit(&self) -> MemoryLimit {
        MemoryLimit::Finite(self.limit())
    }
}

/// The engine's spill space: a fresh directory `<data dir>/spill` (what an earlier process
/// left there is removed), at most `max_bytes` in use at once across all statements.
pub fn spill_manager(data_dir: &Path, max_bytes: u64) -> Result<Arc<DiskManager>> {
    let dir = data_dir.join("spill");
    match std::fs::remove_dir_all(&dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(Error::io(format!("{}: {e}", dir.display()))),
    }
    std::fs::create_dir_all(&dir).map_err(|e| Error::io(format!("{}: {e}", dir.display())))?;
    let manager = DiskManagerBuilder::default()
        .with_mode(DiskManagerMode::Directories(vec![dir]))
        .with_max_temp_directory_size(max_bytes)
        .build()?;
    Ok(Arc::new(manager))
}

/// `64MB`, `1GB`, `1536kB`: PostgreSQL's memory units, the largest that divides evenly.
pub fn format_bytes(n: usize) -> String {
    const UNITS: [(&str, usize); 4] = [
        ("TB", 1 << 40),
        ("GB", 1 << 30),
        ("MB", 1 << 20),
        ("kB", 1 << 10),
    ];
    for (unit, size) in UNITS {
        if n >= size && n.is_multiple_of(size) {
            return format!("{}{unit}", n / size);
        }
    }
    if n >= 1 << 20 {
        return format!("{:.1}MB", n as f64 / (1u64 << 20) as f64);
    }
    format!("{n}B")
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::execution::memory_pool::MemoryConsumer;

    #[test]
    fn a_reservation_beyond_the_limit_fails_and_frees_nothing_it_did_not_take() {
        let server = QueryMemory::new(10_000);
        let pool: Arc<dyn MemoryPool> = StatementMemory::new(1000, server.clone());
        let a = MemoryConsumer::new("a").register(&pool);
        a.try_grow(600).unwrap();
        let b = MemoryConsumer::new("b").register(&pool);
        let err = b.try_grow(500).unwrap_err().to_string();
        assert!(
            err.contains("out of memory") && err.contains("b asked for 500B"),
            "{err}"
        );
        assert_eq!(pool.reserved(), 600);
        drop(a);
        b.try_grow(500).unwrap();
        assert_eq!(pool.reserved(), 500);
        assert_eq!(server.used(), 500);
    }

    #[test]
    fn sessions_within_their_limits_cannot_pass_the_servers_together() {
        let server = QueryMemory::new(1500);
        let one: Arc<dyn MemoryPool> = StatementMemory::new(1000, server.clone());
        let two: Arc<dyn MemoryPool> = StatementMemory::new(1000, server.clone());
        let a = MemoryConsumer::new("a").register(&one);
        a.try_grow(1000).unwrap();
        let b = MemoryConsumer::new("b").register(&two);
        let err = b.try_grow(600).unwrap_err().to_string();
        assert!(err.contains("max_query_memory (1500B)"), "{err}");
        assert_eq!((two.reserved(), server.used()), (0, 1000));
        // a refusal by the session's own limit takes nothing from the server
        let err = b.try_grow(1001).unwrap_err().to_string();
        assert!(err.contains("max_statement_memory"), "{err}");
        assert_eq!(server.used(), 1000);
        b.try_grow(500).unwrap();
        drop(a);
        drop(b);
        assert_eq!(server.used(), 0);
    }

    #[test]
    fn sizes_read_like_postgres_settings() {
        assert_eq!(format_bytes(64 << 20), "64MB");
        assert_eq!(format_bytes(6 << 30), "6GB");
        assert_eq!(format_bytes(1536 << 10), "1536kB");
        assert!(default_statement_memory() >= 256 << 20);
    }
}
