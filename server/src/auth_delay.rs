//! Throttling of failed logins per client address, in the spirit of PostgreSQL's `auth_delay`.
//!
//! The answer to a wrong password is held back: [`FIRST`] for the first failure from an
//! address, doubling with each consecutive failure from it up to [`CAP`] (100, 200, 400, 800,
//! 1,600, then 2,000 ms each). An address's count starts again after a success from it, or
//! when its last failure is [`WINDOW`] old. The connection (and its slot under
//! `--max-connections`) is held for the delay, so guesses from one address run at most one
//! per [`CAP`] per connection. Right passwords are answered at once. An IPv6 client counts
//! by its /64 prefix (what one host is usually given), an IPv4-mapped one as IPv4.
//!
//! Invariant: the table holds at most [`MAX_ADDRESSES`] addresses (about 64 bytes each); when
//! it is full, expired entries are dropped, then the one whose last failure is oldest.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

/// Delay of the first failure in a row.
pub const FIRST: Duration = Duration::from_millis(100);
/// Longest delay.
pub const CAP: Duration = Duration::from_secs(2);
/// Failures further apart than this are not in a row.
pub const WINDOW: Duration = Duration::from_secs(60);
/// Addresses remembered at most.
pub const MAX_ADDRESSES: usize = 10_000;

#[derive(Default)]
pub struct AuthDelay {
    failures: Mutex<HashMap<IpAddr, Failures>>,
}

#[derive(Clone, Copy)]
struct Failures {
    in_a_row: u32,
    last: Instant,
}

impl AuthDelay {
    /// Records a failed login from `ip`; returns how long to wait before answering it.
    pub fn failed(&self, ip: IpAddr) -> Duration {
        self.failed_at(ip, Instant::now())
    }

    /// Forgets `ip`'s failures: it logged in.
    pub fn succeeded(&self, ip: IpAddr) {
        self.lock().remove(&key(ip));
    }

    fn failed_at(&self, ip: IpAddr, now: Instant) -> Duration {
        let ip = key(ip);
        let mut table = self.lock();
        if table.len() >= MAX_ADDRESSES && !table.contains_key(&ip) {
            table.retain(|_, f| now.saturating_duration_since(f.last) < WINDOW);
            if table.len() >= MAX_ADDRESSES {
                let oldest = table.iter().min_by_key(|(_, f)| f.last).map(|(ip, _)| *ip);
                if let Some(oldest) = oldest {
                    table.remove(&oldest);
                }
            }
        }
        let entry = table.entry(ip).or_insert(Failures {
            in_a_row: 0,
            last: now,
        });
        if now.saturating_duration_since(entry.last) >= WINDOW {
            entry.in_a_row = 0;
        }
        entry.in_a_row = entry.in_a_row.saturating_add(1);
        entry.last = now;
        delay(entry.in_a_row)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<IpAddr, Failures>> {
        self.failures.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The address failures are counted under.
fn key(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6((v6.to_bits() & !u128::from(u64::MAX)).into()),
        },
        v4 => v4,
    }
}

/// The delay of the `n`th failure in a row (from 1).
fn delay(n: u32) -> Duration {
    let doublings = n.saturating_sub(1).min(16);
    FIRST.saturating_mul(1 << doublings).min(CAP)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(i: u32) -> IpAddr {
        IpAddr::from(i.to_be_bytes())
    }

    #[test]
    fn delays_double_up_to_the_cap() {
        let ms: Vec<u128> = (1..=8).map(|n| delay(n).as_millis()).collect();
        assert_eq!(ms, [100, 200, 400, 800, 1600, 2000, 2000, 2000]);
        assert_eq!(delay(u32::MAX), CAP);
    }

    #[test]
    fn failures_count_per_address_and_reset_on_success_or_after_the_window() {
        let d = AuthDelay::default();
        let t0 = Instant::now();
        assert_eq!(d.failed_at(ip(1), t0), FIRST);
        assert_eq!(d.failed_at(ip(1), t0), FIRST * 2);
        assert_eq!(d.failed_at(ip(2), t0), FIRST, "another address");
        d.succeeded(ip(1));
        assert_eq!(d.failed_at(ip(1), t0), FIRST, "after a success");
        assert_eq!(d.failed_at(ip(1), t0 + WINDOW / 2), FIRST * 2);
        assert_eq!(
            d.failed_at(ip(1), t0 + WINDOW * 2),
            FIRST,
            "after the window"
        );
    }

    #[test]
    fn ipv6_counts_by_its_64_prefix() {
        let d = AuthDelay::default();
        let t0 = Instant::now();
        let a: IpAddr = "2001:db8:1:2::1".parse().unwrap();
        let b: IpAddr = "2001:db8:1:2:ffff::9".parse().unwrap();
        let other: IpAddr = "2001:db8:1:3::1".parse().unwrap();
        assert_eq!(d.failed_at(a, t0), FIRST);
        assert_eq!(d.failed_at(b, t0), FIRST * 2);
        assert_eq!(d.failed_at(other, t0), FIRST);
        let mapped: IpAddr = "::ffff:10.0.0.1".parse().unwrap();
        assert_eq!(d.failed_at(mapped, t0), FIRST);
        assert_eq!(d.failed_at("10.0.0.1".parse().unwrap(), t0), FIRST * 2);
    }

    #[test]
    fn the_table_is_bounded() {
        let d = AuthDelay::default();
        let t0 = Instant::now();
        for i in 0..MAX_ADDRESSES as u32 + 500 {
            d.failed_at(ip(i), t0 + Duration::from_millis(u64::from(i)));
        }
        assert_eq!(d.lock().len(), MAX_ADDRESSES);
        assert!(!d.lock().contains_key(&ip(0)), "the oldest went first");
        let later = t0 + WINDOW * 10;
        d.failed_at(ip(u32::MAX), later);
        assert_eq!(d.lock().len(), 1, "expired entries are dropped when full");
    }
}
