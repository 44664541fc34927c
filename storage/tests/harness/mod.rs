//! The fuzz harness shared by `storage/tests/fuzz.rs` and `consensus/tests/fuzz.rs` (the
//! latter includes this file by path): case count and fixed seed from the environment, one
//! property at a time, a per-case time limit with a watchdog for hangs, an allocation budget
//! (a capped global allocator), and a count of panics anywhere, spawned tasks included.

#![allow(dead_code)] // each fuzz binary uses part of it

use std::alloc::System;
use std::path::Path;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard, Once, OnceLock};
use std::time::{Duration, Instant};

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

pub static CASE_STARTED_MS: AtomicU64 = AtomicU64::new(0);

pub fn epoch() -> Instant {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    *EPOCH.get_or_init(Instant::now)
}

/// Runs one case: a watchdog ends the process if it hangs past [`CASE_LIMIT`] (a hang never
/// returns to be reported), and a case that finishes late fails like any other.
pub fn timed<T>(case: impl FnOnce() -> Result<T, TestCaseError>) -> Result<T, TestCaseError> {
    static WATCHDOG: Once = Once::new();
    WATCHDOG.call_once(|| {
        epoch();
        std::thread::spawn(|| loop {
            std::thread::sleep(Duration::from_millis(200));
            let started = CASE_STARTED_MS.load(Ordering::Relaxed);
            let now = epoch().elapsed().as_millis() as u64;
            if started != 0 && now.saturating_sub(started) > 2 * CASE_LIMIT.as_millis() as u64 {
                eprintln!("fuzz: a case has been running for over {CASE_LIMIT:?}: hang");
                std::process::exit(3);
            }
        });
    });
    let panics = PANICS.load(Ordering::SeqCst);
    let start = Instant::now();
    CASE_STARTED_MS.store(
        epoch().elapsed().as_millis().max(1) as u64,
        Ordering::Relaxed,
    );
    let out = case();
    CASE_STARTED_MS.store(0, Ordering::Relaxed);
    let took = start.elapsed();
    prop_assert!(took <= CASE_LIMIT, "case took {took:?}");
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
