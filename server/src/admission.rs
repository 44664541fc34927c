//! Who may hold a connection, and for how long before logging in.
//!
//! Every accepted socket takes a slot from accept until it closes, logged in or not, so
//! `--max-connections` bounds descriptors, tasks and buffers, not only sessions. Beyond the
//! limit, at most [`REFUSALS`] more sockets are kept, each for at most [`REFUSAL_TIMEOUT`], to
//! read their startup packet: a cancel request is served (PostgreSQL serves them when full
//! too), a login is refused with FATAL `53300`. Any socket beyond those is sent the `53300`
//! at once and closed unread. A connection that has not completed startup and authentication
//! within `--authentication-timeout` of its accept is closed.
//!
//! Invariants: at most `max_connections` [`Ticket`]s admit a login and at most [`REFUSALS`]
//! refuse one; a ticket gives its slot back when dropped, whatever ends the connection.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::BytesMut;
use pgwire::error::ErrorInfo;
use pgwire::messages::response::ErrorResponse;
use pgwire::messages::Message;
use sluice_sql::error::sqlstate;
use tokio::net::TcpStream;
use tokio::time::Instant;

use crate::auth_delay::AuthDelay;
use crate::burst::Burst;

/// Sockets kept beyond `max_connections` to refuse them politely.
pub const REFUSALS: usize = 64;
/// How long such a socket may take to send its startup packet.
pub const REFUSAL_TIMEOUT: Duration = Duration::from_secs(5);

const TOO_MANY_MESSAGE: &str = "sorry, too many clients already";

pub struct Admission {
    max_connections: usize,
    authentication_timeout: Duration,
    open: AtomicUsize,
    refusing: AtomicUsize,
    /// Failed logins per client address.
    pub auth_delay: AuthDelay,
    refusals_logged: Burst,
    timeouts_logged: Burst,
}

/// What a new socket gets.
pub enum Admit {
    /// A slot; the ticket says whether it may log in.
    Ticket(Ticket),
    /// Nothing: answer `53300` at once ([`refuse_now`]).
    Full,
}

/// A socket's slot, given back on drop.
pub struct Ticket {
    admission: Arc<Admission>,
    over_limit: bool,
    accepted: Instant,
    deadline: Instant,
}

impl Admission {
    pub fn new(max_connections: usize, authentication_timeout: Duration) -> Arc<Admission> {
        Arc::new(Admission {
            max_connections,
            authentication_timeout,
            open: AtomicUsize::new(0),
            refusing: AtomicUsize::new(0),
            auth_delay: AuthDelay::default(),
            refusals_logged: Burst::new(Duration::from_secs(10)),
            timeouts_logged: Burst::new(Duration::from_secs(10)),
        })
    }

    /// A slot for a socket just accepted.
    pub fn admit(self: &Arc<Self>) -> Admit {
        let now = Instant::now();
        if take(&self.open, self.max_connections) {
            return Admit::Ticket(Ticket {
                admission: self.clone(),
                over_limit: false,
                accepted: now,
                deadline: now + self.authentication_timeout,
            });
        }
        if let Some(left_out) = self.refusals_logged.admit() {
            tracing::warn!(
                "{} connections are open (--max-connections): refusing logins with 53300{}",
                self.max_connections,
                also(left_out, "refused connection")
            );
        }
        if take(&self.refusing, REFUSALS) {
            return Admit::Ticket(Ticket {
                admission: self.clone(),
                over_limit: true,
                accepted: now,
                deadline: now + self.authentication_timeout.min(REFUSAL_TIMEOUT),
            });
        }
        Admit::Full
    }

    /// Connections holding a slot (refusals in progress not included).
    pub fn open(&self) -> usize {
        self.open.load(Ordering::Acquire)
    }
}

impl Ticket {
    /// Over the limit: serve a cancel request, refuse a login.
    pub fn over_limit(&self) -> bool {
        self.over_limit
    }

    /// When the connection must have completed startup and authentication.
    pub fn deadline(&self) -> Instant {
        self.deadline
    }

    pub fn auth_delay(&self) -> &AuthDelay {
        &self.admission.auth_delay
    }

    /// Logs that the connection from `peer` is closed for not logging in in time.
    pub fn log_timeout(&self, peer: SocketAddr) {
        if self.over_limit {
            return;
        }
        if let Some(left_out) = self.admission.timeouts_logged.admit() {
            tracing::info!(
                %peer,
                "closing a connection that did not log in within {:?} (--authentication-timeout){}",
                self.deadline - self.accepted,
                also(left_out, "such connection")
            );
        }
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        let counter = if self.over_limit {
            &self.admission.refusing
        } else {
            &self.admission.open
        };
        counter.fetch_sub(1, Ordering::AcqRel);
    }
}

/// The FATAL `53300` a login over the limit gets.
pub fn too_many() -> ErrorInfo {
    ErrorInfo::new(
        "FATAL".into(),
        sqlstate::TOO_MANY_CONNECTIONS.into(),
        TOO_MANY_MESSAGE.into(),
    )
}

/// Sends a socket that gets no slot the `53300` (if its send buffer takes it without waiting)
/// and closes it.
pub fn refuse_now(socket: TcpStream) {
    let mut buf = BytesMut::new();
    if ErrorResponse::from(too_many()).encode(&mut buf).is_ok() {
        let _ = socket.try_write(&buf);
    }
}

/// Takes one of `limit` places counted by `counter`, if one is free.
fn take(counter: &AtomicUsize, limit: usize) -> bool {
    counter
        .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
            (n < limit).then_some(n + 1)
        })
        .is_ok()
}

/// `" (and N more <what>s since the last such line)"`, or nothing.
fn also(left_out: u64, what: &str) -> String {
    if left_out == 0 {
        String::new()
    } else {
        format!(" (and {left_out} more {what}s since the last such line)")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ticket(a: Admit) -> Ticket {
        match a {
            Admit::Ticket(t) => t,
            Admit::Full => panic!("expected a ticket"),
        }
    }

    #[tokio::test]
    async fn slots_count_from_accept_and_come_back_on_drop() {
        let admission = Admission::new(2, Duration::from_secs(60));
        let a = ticket(admission.admit());
        let b = ticket(admission.admit());
        assert!(!a.over_limit() && !b.over_limit());
        assert_eq!(admission.open(), 2);
        let refusals: Vec<Ticket> = (0..REFUSALS).map(|_| ticket(admission.admit())).collect();
        assert!(refusals.iter().all(Ticket::over_limit));
        assert!(refusals[0].deadline() <= Instant::now() + REFUSAL_TIMEOUT);
        assert!(matches!(admission.admit(), Admit::Full));
        drop(a);
        assert_eq!(admission.open(), 1);
        let c = ticket(admission.admit());
        assert!(!c.over_limit());
        drop(refusals);
        assert!(ticket(admission.admit()).over_limit());
    }
}
