//! The accept loop: hands each new socket on, and rides out failures to accept.
//!
//! When accept fails (out of file descriptors, EMFILE/ENFILE, or anything else) the listener
//! is ready again at once, so retrying straight away would spin. Instead the loop backs off,
//! from [`FIRST_BACKOFF`] doubling to [`MAX_BACKOFF`], until an accept succeeds; open
//! connections run on their own tasks meanwhile. A burst of failures is logged once when it
//! starts, once a minute while it lasts, and once when it is over: an accept has succeeded and
//! [`QUIET`] has passed without a failure (so a server sitting at its descriptor limit, where
//! accepts fail and succeed in turn, logs one burst, not a pair of lines per connection). A
//! connection aborted or reset while it waited in the queue is no failure of the server's: it
//! counts as a working accept (a burst whose last accept met one used to never end).

use std::net::SocketAddr;
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

pub const FIRST_BACKOFF: Duration = Duration::from_millis(5);
pub const MAX_BACKOFF: Duration = Duration::from_millis(500);
/// How long accepts must go without failing for a burst to be over.
pub const QUIET: Duration = Duration::from_secs(5);
/// How often a burst that goes on is reported.
const REMINDER: Duration = Duration::from_secs(60);

/// Accepts until `shutdown`, handing every socket to `accepted`.
pub async fn run(
    listener: &TcpListener,
    shutdown: &CancellationToken,
    mut accepted: impl FnMut(TcpStream, SocketAddr),
) {
    let mut failing = Failing::default();
    loop {
        let over_at = failing.over_at();
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = sleep_until(over_at), if over_at.is_some() => failing.end(),
            result = listener.accept() => match result {
                Ok((socket, peer)) => {
                    failing.succeeded();
                    accepted(socket, peer);
                }
                // a connection that went away while it waited in the queue: accepting works
                // (and a burst that ended on one must still end)
                Err(e) if is_per_connection(&e) => {
                    tracing::debug!("a queued connection was gone when accepted: {e}");
                    failing.succeeded();
                }
                Err(e) => {
                    let backoff = failing.failed(&e);
                    tokio::select! {
                        _ = shutdown.cancelled() => return,
                        _ = tokio::time::sleep(backoff) => {}
                    }
                }
            }
        }
    }
}

/// An accept error about the one connection (aborted or reset while queued), not about the
/// server's resources.
fn is_per_connection(e: &std::io::Error) -> bool {
    matches!(
        e.kind(),
        std::io::ErrorKind::ConnectionAborted | std::io::ErrorKind::ConnectionReset
    )
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// Failed accepts: the current burst, and the backoff.
#[derive(Default)]
struct Failing {
    burst: Option<Burst>,
    backoff: Duration,
}

struct Burst {
    since: Instant,
    failures: u64,
    last_failure: Instant,
    reported: Instant,
    /// An accept has succeeded since the last failure.
    recovered: bool,
}

impl Failing {
    /// Notes a failure; returns how long to wait before accepting again.
    fn failed(&mut self, e: &std::io::Error) -> Duration {
        let now = Instant::now();
        self.backoff = if self.backoff.is_zero() {
            FIRST_BACKOFF
        } else {
            (self.backoff * 2).min(MAX_BACKOFF)
        };
        match &mut self.burst {
            None => {
                self.burst = Some(Burst {
                    since: now,
                    failures: 1,
                    last_failure: now,
                    reported: now,
                    recovered: false,
                });
                tracing::warn!(
                    "accept failed: {e}; backing off up to {MAX_BACKOFF:?} and retrying \
                     (open connections are served meanwhile; repeats are counted, not logged)"
                );
            }
            Some(burst) => {
                burst.failures += 1;
                burst.last_failure = now;
                burst.recovered = false;
                if now - burst.reported >= REMINDER {
                    burst.reported = now;
                    tracing::warn!(
                        "accept still failing: {e} ({} failures in {:?})",
                        burst.failures,
                        now - burst.since
                    );
                }
            }
        }
        self.backoff
    }

    /// An accept succeeded.
    fn succeeded(&mut self) {
        self.backoff = Duration::ZERO;
        if let Some(burst) = &mut self.burst {
            burst.recovered = true;
        }
    }

    /// When the burst is over, if accepts work again.
    fn over_at(&self) -> Option<Instant> {
        self.burst
            .as_ref()
            .filter(|b| b.recovered)
            .map(|b| b.last_failure + QUIET)
    }

    /// The burst is over.
    fn end(&mut self) {
        if let Some(burst) = self.burst.take() {
            tracing::info!(
                "accepting connections again after {} failed accepts in {:?}",
                burst.failures,
                burst.last_failure - burst.since
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_resource_errors_count_as_failed_accepts() {
        use std::io::{Error, ErrorKind};
        assert!(is_per_connection(&Error::from(
            ErrorKind::ConnectionAborted
        )));
        assert!(is_per_connection(&Error::from(ErrorKind::ConnectionReset)));
        assert!(!is_per_connection(&Error::from_raw_os_error(24))); // EMFILE
        assert!(!is_per_connection(&Error::from_raw_os_error(23))); // ENFILE
    }

    #[tokio::test]
    async fn backoff_doubles_to_the_cap_and_resets_after_a_success() {
        let e = std::io::Error::other("Too many open files");
        let mut f = Failing::default();
        let waits: Vec<Duration> = (0..10).map(|_| f.failed(&e)).collect();
        assert_eq!(waits[0], FIRST_BACKOFF);
        assert_eq!(waits[1], FIRST_BACKOFF * 2);
        assert_eq!(*waits.last().unwrap(), MAX_BACKOFF);
        assert!(waits.windows(2).all(|w| w[0] <= w[1]));
        assert_eq!(f.over_at(), None, "not over before an accept succeeds");
        f.succeeded();
        assert_eq!(f.failed(&e), FIRST_BACKOFF);
        assert_eq!(
            f.burst.as_ref().map(|b| b.failures),
            Some(11),
            "the same burst"
        );
        f.succeeded();
        let over_at = f.over_at().unwrap();
        assert!(over_at >= Instant::now() + QUIET - Duration::from_secs(1));
        f.end();
        assert!(f.burst.is_none());
        assert_eq!(f.over_at(), None);
    }
}
