//! Sockets that never finish startup: each opens a connection, sends nothing or the first
//! bytes of a startup packet, and holds it until the server closes it (after
//! `--authentication-timeout`) or the phase ends; then it opens another. A connect that fails
//! while the server runs is unexpected; a close by the server is what it should do.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::login::LOGIN_TIMEOUT;
use super::tally::{Class, Tally};
use crate::wire::startup;

/// Bound on one socket's connections in one run.
const MAX_CONNECTIONS: u64 = 100_000;

/// One never-logging-in socket, again and again until `end` or `stop`.
pub async fn idle_loop(port: u16, seed: u64, end: Instant, stop: &AtomicBool, tally: &Tally) {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut opened = 0;
    while opened < MAX_CONNECTIONS && Instant::now() < end && !stop.load(Ordering::SeqCst) {
        opened += 1;
        let connect = TcpStream::connect(("127.0.0.1", port));
        let mut socket = match tokio::time::timeout(LOGIN_TIMEOUT, connect).await {
            Ok(Ok(s)) => s,
            Ok(Err(e)) => {
                tally.unexpected(Class::Idle, "connect failed", e.to_string());
                tokio::time::sleep(Duration::from_millis(500)).await;
                continue;
            }
            Err(_) => {
                tally.unexpected(Class::Idle, "connect timed out", String::new());
                continue;
            }
        };
        let partial = rng.gen_bool(0.5);
        if partial {
            let s = startup();
            let _ = socket.write_all(&s[..rng.gen_range(1..s.len())]).await;
        }
        let held = Instant::now();
        let mut chunk = [0u8; 1024];
        let closed = loop {
            if Instant::now() >= end || stop.load(Ordering::SeqCst) {
                break false;
            }
            match tokio::time::timeout(Duration::from_millis(500), socket.read(&mut chunk)).await {
                Ok(Ok(0)) | Ok(Err(_)) => break true,
                Ok(Ok(_)) | Err(_) => {}
            }
        };
        let what = if partial {
            "partial startup"
        } else {
            "no startup"
        };
        if closed {
            tally.expected(
                Class::Idle,
                &format!(
                    "{what}: closed by the server after ~{}s",
                    (held.elapsed().as_secs() + 2) / 5 * 5
                ),
            );
        } else {
            tally.expected(Class::Idle, &format!("{what}: held to the end"));
        }
    }
}
