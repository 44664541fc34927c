//! The fuzz harness shared by `storage/tests/fuzz.rs` and `consensus/tests/fuzz.rs` (the
//! latter includes this file by path): case count and fixed seed from the environment, one
//! property at a time, a per-case CPU-time limit with a watchdog for hangs, an allocation budget
//! (a capped global allocator), and a count of panics anywhere, spawned tasks included.

#![allow(dead_code)] // each fuzz binary uses part of it

use std::alloc::System;
use std::path::Path;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard, Once};
use std::time::Duration;

use cap::Cap;
use proptest::prelude::*;
use proptest::test_runner::{Config, RngSeed, TestCaseError};

#[global_allocator]
pub static ALLOC: Cap<System> = Cap::new(System, usize::MAX);

pub const DEFAULT_CASES: u32 = 5000;
pub const CASE_LIMIT: Duration = Duration::from_secs(5);
/// Allocation allowed on top of a small multiple of the input (paths, decoding, indexes).
pub const ALLOC_SLACK: usize = 256 << 10;

pub fn cases() -> u32 {
    env("SLUICE_FUZZ_CASES").unwrap_or(DEFAULT_CASES)
}

pub fn env<T: std::str::FromStr>(name: &str) -> Option<T> {
    std::env::var(name).ok().and_then(|v| v.parse().ok())
}

pub fn config(cases: u32) -> Config {
    Config {
        cases,
        rng_seed: RngSeed::Fixed(env("SLUICE_FUZZ_SEED").unwrap_or(0x51_1ce)),
        failure_persistence: None,
        max_shrink_time: 60_000,
        ..Config::default()
    }
}

/// One property at a time: the allocation budget, the watchdog and the panic count are
/// process-wide.
pub fn serial() -> MutexGuard<'static, ()> {
    static SERIAL: Mutex<()> = Mutex::new(());
    let guard = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    count_panics();
    guard
}

pub static PANICS: AtomicUsize = AtomicUsize::new(0);

/// Counts panics anywhere, including in tasks the transport spawns (whose panics tokio would
/// otherwise swallow).
pub fn count_panics() {
    static HOOK: Once = Once::new();
    HOOK.call_once(|| {
        let default = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            PANICS.fetch_add(1, Ordering::SeqCst);
            default(info);
        }));
    });
}

/// The process's CPU time when the running case started, in microseconds (0: no case runs).
pub static CASE_STARTED_CPU_US: AtomicU64 = AtomicU64::new(0);
/// Watchdog ticks since the running case started.
pub static CASE_TICKS: AtomicU64 = AtomicU64::new(0);
/// How often the watchdog looks.
const TICK: Duration = Duration::from_millis(200);
/// A case blocked (using no CPU) for this many ticks is a hang too: a deadlock never returns.
const BLOCKED_TICKS: u64 = 300;

/// CPU time the whole process has used. Limits are on CPU time, not wall-clock time, so that a
/// long run at low priority beside other work (or stopped with SIGSTOP and resumed) does not
/// report a case as slow because it was not scheduled. One property runs at a time, so the
/// process's CPU time while a case runs is that case's (every thread it uses counts).
pub fn cpu_now() -> Duration {
    // utime and stime of /proc/self/stat, in clock ticks (100 per second on Linux): the 14th
    // and 15th fields, counted from the state after the command name's closing bracket.
    let stat = std::fs::read_to_string("/proc/self/stat").expect("read /proc/self/stat");
    let after = &stat[stat
        .rfind(')')
        .expect("/proc/self/stat has the command name")
        + 1..];
    let fields: Vec<&str> = after.split_whitespace().collect();
    let ticks: u64 =
        fields[11].parse::<u64>().expect("utime") + fields[12].parse::<u64>().expect("stime");
    Duration::from_millis(ticks * 10)
}

/// Runs one case: a watchdog ends the process if it hangs — uses more than twice
/// [`CASE_LIMIT`] of CPU, or stays blocked for a minute of watchdog ticks (a hang never
/// returns to be reported) — and a case that finishes having used more than [`CASE_LIMIT`] of
/// CPU fails like any other.
pub fn timed<T>(case: impl FnOnce() -> Result<T, TestCaseError>) -> Result<T, TestCaseError> {
    static WATCHDOG: Once = Once::new();
    WATCHDOG.call_once(|| {
        std::thread::spawn(|| loop {
            std::thread::sleep(TICK);
            let started = CASE_STARTED_CPU_US.load(Ordering::Relaxed);
            if started == 0 {
                continue;
            }
            let ticks = CASE_TICKS.fetch_add(1, Ordering::Relaxed) + 1;
            let used = (cpu_now().as_micros() as u64).saturating_sub(started);
            if used > 2 * CASE_LIMIT.as_micros() as u64 {
                eprintln!(
                    "fuzz: a case has used over {:?} of CPU: hang",
                    2 * CASE_LIMIT
                );
                std::process::exit(3);
            }
            if ticks > BLOCKED_TICKS {
                eprintln!(
                    "fuzz: a case has not finished in {:?} of watchdog ticks: hang",
                    TICK * BLOCKED_TICKS as u32
                );
                std::process::exit(3);
            }
        });
    });
    let panics = PANICS.load(Ordering::SeqCst);
    let start = cpu_now();
    CASE_TICKS.store(0, Ordering::Relaxed);
    CASE_STARTED_CPU_US.store((start.as_micros() as u64).max(1), Ordering::Relaxed);
    let out = case();
    CASE_STARTED_CPU_US.store(0, Ordering::Relaxed);
    let took = cpu_now().saturating_sub(start);
    prop_assert!(took <= CASE_LIMIT, "case used {took:?} of CPU");
    prop_assert_eq!(PANICS.load(Ordering::SeqCst), panics, "something panicked");
    out
}

/// Runs `f` with at most `budget` bytes allocated beyond what is live now. Exceeding it makes
/// the allocation fail, which aborts the process ("memory allocation of N bytes failed").
pub fn within_budget<T>(budget: usize, f: impl FnOnce() -> T) -> T {
    struct Reset;
    impl Drop for Reset {
        fn drop(&mut self) {
            let _ = ALLOC.set_limit(usize::MAX);
        }
    }
    let _reset = Reset;
    let _ = ALLOC.set_limit(ALLOC.allocated().saturating_add(budget));
    f()
}

pub fn scratch_dir() -> tempfile::TempDir {
    // tmpfs when there is one: a million cases of fsyncs on a real disk would take hours.
    let shm = Path::new("/dev/shm");
    if shm.is_dir() {
        if let Ok(dir) = tempfile::Builder::new()
            .prefix("sluice-fuzz")
            .tempdir_in(shm)
        {
            return dir;
        }
    }
    tempfile::tempdir().expect("tempdir")
}
