//! The hostile SQL clients: deep statements and memory-hungry queries (the text from
//! [`statements`]), and cancels — a long query cancelled after a random
//! 10–500 ms (simple and extended protocol, and a stream of rows), a session whose short
//! `statement_timeout` ends it, and a client that disconnects mid-query.
//!
//! Each session starts with a `statement_timeout` (the startup option `-c
//! statement_timeout=...`), so every statement is bounded even if a cancel is lost; a client
//! waits [`BACKSTOP`] at most for any answer. A statement answered by an allowed SQLSTATE (or
//! a result, where allowed) is expected; a lost connection, another SQLSTATE, a forbidden
//! success, no answer, or a session that no longer answers `SELECT 1` after a cancel is not.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use futures::StreamExt;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio_postgres::{Client, NoTls, SimpleQueryMessage};

use super::login;
use super::statements::{self, Hostile, ENDLESS_COUNT, ENDLESS_ROWS, QUERY_CANCELED, RUNAWAY};
use super::tally::{error_key, short, Class, Tally};
use super::timeline::Timeline;
use crate::wire::{cstr, message, Read, Wire};

/// The longest a hostile client waits for any answer: far beyond every timeout it set.
pub const BACKSTOP: Duration = Duration::from_secs(60);
/// Bound on one client's attempts in one run.
const MAX_ATTEMPTS: u64 = 10_000_000;
/// The session timeout of a client whose mid-query disconnect should stop its query.
const DISCONNECT_TIMEOUT: &str = "20s";

/// A session with `statement_timeout` set at startup.
async fn connect(port: u16, timeout: Duration) -> Result<Client, String> {
    let options = format!("-c statement_timeout={}ms", timeout.as_millis());
    login::session(port, Some(&options)).await
}

/// What the loops share.
pub struct Target<'a> {
    pub port: u16,
    pub end: Instant,
    pub stop: &'a AtomicBool,
    pub tally: &'a Tally,
    pub timeline: &'a Timeline,
    /// Every hostile session's `statement_timeout`.
    pub timeout: Duration,
}

impl Target<'_> {
    fn going(&self) -> bool {
        Instant::now() < self.end && !self.stop.load(Ordering::SeqCst)
    }

    /// A session, or `None` (counted, after a pause) when the login fails.
    async fn session(&self, class: Class) -> Option<Client> {
        match connect(self.port, self.timeout).await {
            Ok(c) => Some(c),
            Err(e) => {
                self.tally
                    .unexpected(class, &e, "a hostile client's login".into());
                tokio::time::sleep(Duration::from_millis(500)).await;
                None
            }
        }
    }
}

/// Deep statements ([`Class::Deep`]) or memory-hungry queries ([`Class::Hungry`]), one after
/// another with a short pause, until the end.
pub async fn statement_loop(class: Class, seed: u64, target: &Target<'_>) {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut client = None;
    let mut attempts = 0;
    while attempts < MAX_ATTEMPTS && target.going() {
        let Some(c) = client.as_ref() else {
            client = target.session(class).await;
            continue;
        };
        attempts += 1;
        let h = match class {
            Class::Deep => statements::deep(&mut rng),
            _ => statements::hungry(&mut rng),
        };
        let extended = rng.gen_bool(0.25);
        let began = Instant::now();
        let result = run_hostile(c, &h, extended, target.timeout).await;
        target
            .timeline
            .hostile(|| format!("{}: {}", class.name(), h.excerpt()), began);
        match result {
            Ok(outcome) => target
                .tally
                .expected(class, &format!("{}: {outcome}", h.case)),
            Err((what, lost)) => {
                target
                    .tally
                    .unexpected(class, &format!("{}: {what}", h.case), h.excerpt());
                if lost {
                    client = None;
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(rng.gen_range(50..300))).await;
    }
}

/// Runs one hostile statement; the outcome key, or what was wrong and whether the session
/// is gone.
async fn run_hostile(
    client: &Client,
    h: &Hostile,
    extended: bool,
    session_timeout: Duration,
) -> Result<String, (String, bool)> {
    if let Some(t) = h.timeout {
        set_timeout(client, t).await?;
    }
    let run = async {
        if extended {
            client.query(h.sql.as_str(), &[]).await.map(drop)
        } else {
            client.simple_query(&h.sql).await.map(drop)
        }
    };
    let result = tokio::time::timeout(BACKSTOP, run).await;
    let outcome = match result {
        Err(_) => return Err((format!("no answer within {BACKSTOP:?}"), true)),
        Ok(Ok(())) if h.may_succeed => Ok("ok".to_string()),
        Ok(Ok(())) => Err(("succeeded, but must fail".to_string(), false)),
        Ok(Err(e)) => {
            let key = error_key(&e);
            if h.allows(&key) {
                Ok(key)
            } else {
                let lost = e.code().is_none();
                Err((
                    format!("{key} ({})", short(&crate::error_message(&e), 100)),
                    lost,
                ))
            }
        }
    };
    if h.timeout.is_some() {
        set_timeout(client, &format!("{}ms", session_timeout.as_millis())).await?;
    }
    outcome
}

async fn set_timeout(client: &Client, value: &str) -> Result<(), (String, bool)> {
    let sql = format!("SET statement_timeout = '{value}'");
    match tokio::time::timeout(BACKSTOP, client.simple_query(&sql)).await {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(e)) => Err((format!("{sql}: {}", error_key(&e)), e.code().is_none())),
        Err(_) => Err((format!("{sql}: no answer"), true)),
    }
}

/// The cancel client: a long query stopped by a cancel, by its own short timeout, or
/// abandoned by a client that disconnects, in turn at random.
pub async fn cancel_loop(seed: u64, target: &Target<'_>) {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut client = None;
    let mut attempts = 0;
    while attempts < MAX_ATTEMPTS && target.going() {
        attempts += 1;
        let kind = rng.gen_range(0..5);
        let delay = Duration::from_millis(rng.gen_range(10..=500));
        if kind == 4 {
            match disconnect_mid_query(target.port, delay, rng.gen_bool(0.5)).await {
                Ok(what) => target.tally.expected(Class::Cancel, &what),
                Err(what) => target.tally.unexpected(
                    Class::Cancel,
                    &what,
                    "a client that disconnects mid-query".into(),
                ),
            }
            continue;
        }
        let Some(c) = client.as_ref() else {
            client = target.session(Class::Cancel).await;
            continue;
        };
        let began = Instant::now();
        let (case, result) = match kind {
            0 => ("cancel (simple)", cancel(c, delay, Protocol::Simple).await),
            1 => (
                "cancel (extended)",
                cancel(c, delay, Protocol::Extended).await,
            ),
            2 => (
                "cancel (rows streaming)",
                cancel(c, delay, Protocol::Rows).await,
            ),
            _ => {
                let ms = rng.gen_range(100..1000);
                let sql = if rng.gen_bool(0.5) {
                    RUNAWAY
                } else {
                    ENDLESS_COUNT
                };
                (
                    "statement_timeout",
                    timed_out(c, ms, sql, target.timeout).await,
                )
            }
        };
        target
            .timeline
            .hostile(|| format!("{case} after {delay:?}"), began);
        let lost = matches!(&result, Err((_, true)));
        let after = if lost { Ok("") } else { still_answers(c).await };
        let usable = !lost && after.is_ok();
        match (result, after) {
            (Ok(outcome), Ok(then)) => target
                .tally
                .expected(Class::Cancel, &format!("{case}: {outcome}{then}")),
            (Ok(outcome), Err(e)) => target.tally.unexpected(
                Class::Cancel,
                &format!("{case}: session unusable after {outcome}"),
                format!("{e}; delay {delay:?}"),
            ),
            (Err((what, _)), _) => target.tally.unexpected(
                Class::Cancel,
                &format!("{case}: {what}"),
                format!("cancel after {delay:?}"),
            ),
        }
        if !usable {
            client = None;
        }
        tokio::time::sleep(Duration::from_millis(rng.gen_range(20..200))).await;
    }
}

#[derive(Clone, Copy)]
enum Protocol {
    Simple,
    Extended,
    /// Rows of an endless query, read as they stream.
    Rows,
}

/// Starts an endless query and cancels it after `delay`. Expected: 57014 for the cancel, or
/// for the session timeout when the cancel came before the statement started (a race
/// PostgreSQL has too; reported by delay).
async fn cancel(
    client: &Client,
    delay: Duration,
    protocol: Protocol,
) -> Result<String, (String, bool)> {
    let token = client.cancel_token();
    let running = async {
        match protocol {
            Protocol::Simple => client.simple_query(RUNAWAY).await.map(drop),
            Protocol::Extended => client.query(RUNAWAY, &[]).await.map(drop),
            Protocol::Rows => {
                let stream = client.simple_query_raw(ENDLESS_ROWS).await?;
                let mut stream = std::pin::pin!(stream);
                let mut rows = 0u64;
                while let Some(m) = stream.next().await {
                    if let SimpleQueryMessage::Row(_) = m? {
                        rows += 1;
                        if rows > 100_000_000 {
                            break;
                        }
                    }
                }
                Ok(())
            }
        }
    };
    let cancel = async {
        tokio::time::sleep(delay).await;
        token.cancel_query(NoTls).await
    };
    let Ok((result, sent)) =
        tokio::time::timeout(BACKSTOP, async { tokio::join!(running, cancel) }).await
    else {
        return Err((format!("no answer within {BACKSTOP:?}"), true));
    };
    if let Err(e) = sent {
        return Err((
            format!("CancelRequest failed: {}", short(&e.to_string(), 80)),
            false,
        ));
    }
    match result {
        Ok(()) => Err(("the endless query ended without an error".into(), false)),
        Err(e) if crate::sqlstate(&e) == Some(QUERY_CANCELED) => {
            let message = crate::error_message(&e);
            if message.contains("user request") {
                Ok("57014 by the cancel".into())
            } else {
                let band = match delay.as_millis() {
                    0..100 => "<100 ms",
                    100..300 => "100-300 ms",
                    _ => ">=300 ms",
                };
                Ok(format!(
                    "57014 by the session timeout (cancel at {band} missed)"
                ))
            }
        }
        Err(e) => {
            let key = error_key(&e);
            Err((
                format!("{key} ({})", short(&crate::error_message(&e), 100)),
                e.code().is_none(),
            ))
        }
    }
}

/// `SET statement_timeout` to `ms`, an endless `sql`, the session's timeout back.
async fn timed_out(
    client: &Client,
    ms: u64,
    sql: &str,
    session_timeout: Duration,
) -> Result<String, (String, bool)> {
    set_timeout(client, &format!("{ms}ms")).await?;
    let result = tokio::time::timeout(BACKSTOP, client.simple_query(sql)).await;
    let outcome = match result {
        Err(_) => return Err((format!("no answer within {BACKSTOP:?}"), true)),
        Ok(Ok(_)) => Err(("the endless query ended without an error".into(), false)),
        Ok(Err(e)) if crate::sqlstate(&e) == Some(QUERY_CANCELED) => Ok("57014".to_string()),
        Ok(Err(e)) => Err((error_key(&e), e.code().is_none())),
    };
    set_timeout(client, &format!("{}ms", session_timeout.as_millis())).await?;
    outcome
}

/// Whether the session still answers `SELECT 1` (within [`BACKSTOP`], a hang guard): with
/// a result, or with its own `statement_timeout` when the server is too busy to answer in
/// time (a slow server, not a broken session: noted in the outcome).
async fn still_answers(client: &Client) -> Result<&'static str, String> {
    let began = Instant::now();
    let result = tokio::time::timeout(BACKSTOP, client.simple_query("SELECT 1")).await;
    if began.elapsed() > Duration::from_secs(1) {
        eprintln!(
            "hostile: SELECT 1 after a cancel took {:?}",
            began.elapsed()
        );
    }
    match result {
        Ok(Ok(_)) => Ok(""),
        Ok(Err(e))
            if crate::sqlstate(&e) == Some(QUERY_CANCELED)
                && crate::error_message(&e).contains("statement timeout") =>
        {
            Ok("; then SELECT 1 ran into statement_timeout")
        }
        Ok(Err(e)) => Err(format!(
            "SELECT 1: {} ({})",
            error_key(&e),
            short(&crate::error_message(&e), 100)
        )),
        Err(_) => Err(format!("SELECT 1: no answer within {BACKSTOP:?}")),
    }
}

/// Logs in (raw), bounds the session with a timeout, sends an endless query (simple or
/// extended) and closes the socket after `delay`.
async fn disconnect_mid_query(
    port: u16,
    delay: Duration,
    extended: bool,
) -> Result<String, String> {
    let mut wire = login::raw(port).await?;
    let set = format!("SET statement_timeout = '{DISCONNECT_TIMEOUT}'");
    send(&mut wire, &message(b'Q', &cstr(&set))).await?;
    loop {
        match wire.read_message(BACKSTOP).await {
            Read::Message(b'Z', _) => break,
            Read::Message(..) => {}
            Read::Quiet => return Err(format!("no answer to {set}")),
            Read::Closed => return Err(format!("connection lost after {set}")),
        }
    }
    let query = if extended {
        use crate::wire::{bind, execute, parse};
        [parse(RUNAWAY), bind(), execute(), message(b'S', &[])].concat()
    } else {
        message(b'Q', &cstr(RUNAWAY))
    };
    send(&mut wire, &query).await?;
    tokio::time::sleep(delay).await;
    drop(wire);
    Ok(format!(
        "disconnect mid-query ({})",
        if extended { "extended" } else { "simple" }
    ))
}

async fn send(wire: &mut Wire, bytes: &[u8]) -> Result<(), String> {
    use tokio::io::AsyncWriteExt;
    wire.socket
        .write_all(bytes)
        .await
        .map_err(|e| format!("send: {}", e.kind()))
}
