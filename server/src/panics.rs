//! The process's panic hook: one line per place that panics, not a backtrace per panic.
//!
//! A panic in a connection's task (or one caught around pgwire's decoder, see
//! [`crate::wire`]) ends only that connection, but the default hook writes its message and,
//! with `RUST_BACKTRACE` set, a backtrace of some 17 KB every time: a client repeating the
//! message that triggers it floods the log. This hook logs the first panic at each source
//! location as one line (message and location; the backtrace too only if `RUST_BACKTRACE` is
//! set and not `0`), then counts repeats and reports the count at the 10th, 100th, 1,000th...
//!
//! Invariant: at most [`MAX_SITES`] locations are remembered; panics elsewhere beyond them are
//! counted together under one key.
//!
//! For tests, `--test-panic-application-name` makes a login panic on demand ([`test_trigger`]).

use std::collections::HashMap;
use std::panic::PanicHookInfo;
use std::sync::{Mutex, OnceLock, PoisonError};

/// Locations remembered at most.
pub const MAX_SITES: usize = 256;
/// The longest message logged, in bytes.
const MAX_MESSAGE: usize = 500;
const OTHER_SITES: &str = "(other locations)";

/// Installs the hook for the whole process.
pub fn install() {
    let backtraces = std::env::var_os("RUST_BACKTRACE").is_some_and(|v| v != "0");
    let sites = Sites::default();
    std::panic::set_hook(Box::new(move |info| {
        let location = info
            .location()
            .map_or_else(|| "unknown location".to_string(), ToString::to_string);
        let Some(count) = sites.note(&location) else {
            return;
        };
        let thread = std::thread::current();
        let thread = thread.name().unwrap_or("unnamed");
        let message = one_line(info);
        if count == 1 {
            tracing::error!(
                thread,
                "panic at {location}: {message} (logged once per location; repeats are counted)"
            );
            if backtraces {
                let trace = std::backtrace::Backtrace::force_capture();
                tracing::error!("backtrace of the panic at {location}:\n{trace}");
            }
        } else {
            tracing::error!(
                thread,
                "panic at {location} repeated: {count} times so far (this time: {message})"
            );
        }
    }));
}

/// The application_name that panics a login (`--test-panic-application-name`).
static TEST_TRIGGER: OnceLock<String> = OnceLock::new();

/// TEST ONLY: sets the application_name that panics a login.
pub fn set_test_trigger(application_name: String) {
    let _ = TEST_TRIGGER.set(application_name);
}

/// TEST ONLY: panics if `application_name` is the one set by [`set_test_trigger`].
pub fn test_trigger(application_name: Option<&str>) {
    if let (Some(trigger), Some(name)) = (TEST_TRIGGER.get(), application_name) {
        if trigger == name {
            panic!("test panic requested by application_name {name:?}");
        }
    }
}

/// Panic counts by location.
#[derive(Default)]
struct Sites(Mutex<HashMap<String, u64>>);

impl Sites {
    /// Counts a panic at `location`; `Some(count)` if this one is to be logged.
    fn note(&self, location: &str) -> Option<u64> {
        let mut sites = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        let key = if sites.contains_key(location) || sites.len() < MAX_SITES - 1 {
            location
        } else {
            OTHER_SITES
        };
        let count = sites.entry(key.to_string()).or_insert(0);
        *count += 1;
        let n = *count;
        (n == 1 || is_power_of_ten(n)).then_some(n)
    }
}

fn is_power_of_ten(mut n: u64) -> bool {
    while n >= 10 && n.is_multiple_of(10) {
        n /= 10;
    }
    n == 1
}

/// The panic's message on one line, at most [`MAX_MESSAGE`] bytes.
fn one_line(info: &PanicHookInfo<'_>) -> String {
    let payload = info.payload();
    let text = payload
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| payload.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("(a non-text panic payload)");
    let mut line = String::with_capacity(text.len().min(MAX_MESSAGE + 8));
    for c in text.chars() {
        if c.is_control() {
            line.extend(c.escape_default());
        } else {
            line.push(c);
        }
    }
    if line.len() > MAX_MESSAGE {
        let mut cut = MAX_MESSAGE;
        while !line.is_char_boundary(cut) {
            cut -= 1;
        }
        line.truncate(cut);
        line.push_str("...");
    }
    line
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_location_is_logged_once_then_at_powers_of_ten() {
        let sites = Sites::default();
        let logged: Vec<u64> = (0..1000).filter_map(|_| sites.note("a.rs:1:1")).collect();
        assert_eq!(logged, [1, 10, 100, 1000]);
        assert_eq!(sites.note("b.rs:2:2"), Some(1));
    }

    #[test]
    fn locations_are_bounded() {
        let sites = Sites::default();
        for i in 0..MAX_SITES * 2 {
            sites.note(&format!("f.rs:{i}:1"));
        }
        let map = sites.0.lock().unwrap();
        assert_eq!(map.len(), MAX_SITES);
        assert_eq!(map[OTHER_SITES], MAX_SITES as u64 + 1);
    }
}
