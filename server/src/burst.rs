//! One log line per burst of like events, so that a flood of connections cannot flood the log.
//!
//! [`Burst::admit`] lets the first event of a window through and counts the others; the next
//! event let through carries the count of those left out, so no event goes unreported for
//! longer than it takes the next one to arrive. Invariant: at most one line per window.

use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

pub struct Burst {
    window: Duration,
    state: Mutex<State>,
}

struct State {
    logged_at: Option<Instant>,
    left_out: u64,
}

impl Burst {
    pub const fn new(window: Duration) -> Burst {
        Burst {
            window,
            state: Mutex::new(State {
                logged_at: None,
                left_out: 0,
            }),
        }
    }

    /// `Some(n)` if this event is to be logged, `n` like events having been left out since the
    /// last one logged; `None` if it is to be left out (and counted).
    pub fn admit(&self) -> Option<u64> {
        self.admit_at(Instant::now())
    }

    fn admit_at(&self, now: Instant) -> Option<u64> {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        match state.logged_at {
            Some(at) if now.saturating_duration_since(at) < self.window => {
                state.left_out += 1;
                None
            }
            _ => {
                state.logged_at = Some(now);
                Some(std::mem::take(&mut state.left_out))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_event_per_window_is_let_through_with_the_count_of_the_rest() {
        let burst = Burst::new(Duration::from_secs(10));
        let t0 = Instant::now();
        assert_eq!(burst.admit_at(t0), Some(0));
        for i in 1..100 {
            assert_eq!(burst.admit_at(t0 + Duration::from_millis(i)), None);
        }
        assert_eq!(burst.admit_at(t0 + Duration::from_secs(10)), Some(99));
        assert_eq!(burst.admit_at(t0 + Duration::from_secs(11)), None);
        assert_eq!(burst.admit_at(t0 + Duration::from_secs(30)), Some(1));
    }
}
