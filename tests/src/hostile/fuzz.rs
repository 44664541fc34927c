//! Fuzzed protocol messages: raw sockets that send random and mutated frontend messages.
//! Each session is one [`Plan`] drawn from a seeded generator: garbage before startup, a
//! startup packet cut short or mutated, or a login (with [`Wire`](crate::wire::Wire)) followed by a few broken
//! messages — random tags and bodies, valid messages with flipped bytes, lengths that lie
//! (short, negative, huge), a Bind that declares a parameter and sends none, an Execute with
//! `max_rows` -1, NUL or invalid UTF-8 in a Query, COPY messages outside COPY, unframed
//! garbage — then a Sync, half a message, or a plain close. A client opens a new connection
//! for every session, so it reconnects after the server closes one.
//!
//! Whatever the server answers is expected (an error and a close is the usual answer), except
//! an internal error (`XX` SQLSTATEs) or a login refused; panics are looked for in the
//! server's log by the run.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::login;
use super::tally::{short, Class, Tally};
use super::timeline::Timeline;
use crate::wire::{bind, cstr, error_code, execute, message, parse, startup, Read};

/// How long a session waits for answers once quiet.
const QUIET: Duration = Duration::from_millis(300);
/// Bound on one client's sessions in one run.
const MAX_SESSIONS: u64 = 10_000_000;
/// Frontend message tags (and a few that are not).
const TAGS: &[u8] = b"BCDEFHPQSXdcfp";

/// One fuzz session.
#[derive(Clone, Debug)]
pub enum Plan {
    /// Bytes on a fresh socket instead of a startup packet.
    Garbage(Vec<u8>),
    /// The first bytes of a startup packet, then a close.
    HalfStartup(Vec<u8>),
    /// A whole startup packet with lying lengths or mutated bytes.
    BadStartup(Vec<u8>),
    /// A login, then these messages (with what each is), then `then`.
    LoggedIn {
        messages: Vec<(&'static str, Vec<u8>)>,
        then: Then,
    },
}

/// How a logged-in session ends.
#[derive(Clone, Debug)]
pub enum Then {
    /// A Sync, and the answers read until the server is quiet or closes.
    Sync,
    /// The first bytes of one more message, then a close.
    Cut(Vec<u8>),
    /// A close.
    Close,
}

impl Plan {
    pub fn name(&self) -> &'static str {
        match self {
            Plan::Garbage(_) => "garbage before startup",
            Plan::HalfStartup(_) => "half a startup packet",
            Plan::BadStartup(_) => "mutated startup packet",
            Plan::LoggedIn { .. } => "broken messages after login",
        }
    }
}

fn random_bytes(rng: &mut StdRng, max: usize) -> Vec<u8> {
    let mut b = vec![0u8; rng.gen_range(0..=max)];
    rng.fill(&mut b[..]);
    b
}

/// A well-formed message or sequence, to be mutated.
fn valid(rng: &mut StdRng) -> Vec<u8> {
    let sql = *[
        "SELECT 1",
        "SELECT $1::int",
        "SELECT count(*) FROM w",
        "SELECT k, v FROM w WHERE offset < 3",
        "SHOW statement_timeout",
    ]
    .choose(rng)
    .unwrap_or(&"SELECT 1");
    match rng.gen_range(0..5) {
        0 => message(b'Q', &cstr(sql)),
        1 => [parse(sql), bind(), execute()].concat(),
        2 => {
            let mut body = vec![b'P'];
            body.extend(cstr(""));
            message(b'D', &body)
        }
        3 => crate::wire::close(),
        _ => {
            // a Bind with one text parameter
            let mut body = cstr("");
            body.extend(cstr(""));
            body.extend_from_slice(&[0, 1, 0, 0]);
            body.extend_from_slice(&[0, 1, 0, 0, 0, 1, b'7']);
            body.extend_from_slice(&[0, 0]);
            [parse("SELECT $1::int"), message(b'B', &body)].concat()
        }
    }
}

/// `bytes` with a few bytes flipped, cut short, a length field rewritten, or garbage added.
fn mutate(rng: &mut StdRng, mut bytes: Vec<u8>) -> Vec<u8> {
    if bytes.is_empty() {
        return bytes;
    }
    match rng.gen_range(0..4) {
        0 => {
            for _ in 0..rng.gen_range(1..5) {
                let i = rng.gen_range(0..bytes.len());
                bytes[i] = rng.gen();
            }
        }
        1 => bytes.truncate(rng.gen_range(0..bytes.len())),
        2 if bytes.len() >= 5 => {
            let len = lying_length(rng, bytes.len() - 1);
            bytes[1..5].copy_from_slice(&len.to_be_bytes());
        }
        _ => bytes.extend(random_bytes(rng, 64)),
    }
    bytes
}

/// A length field that does not match a body of `real` bytes (with its own 4).
fn lying_length(rng: &mut StdRng, real: usize) -> i32 {
    *[
        0,
        1,
        3,
        -1,
        i32::MIN,
        i32::MAX,
        1 << 30,
        100_000_000,
        real as i32 + rng.gen_range(1..5000),
        (real as i32 - 1).max(0),
    ]
    .choose(rng)
    .unwrap_or(&0)
}

/// One broken message for a logged-in connection.
fn broken_message(rng: &mut StdRng) -> (&'static str, Vec<u8>) {
    match rng.gen_range(0..11) {
        0 => ("random tag and body", {
            let tag = rng.gen();
            message(tag, &random_bytes(rng, 512))
        }),
        1 => ("frontend tag, random body", {
            let tag = *TAGS.choose(rng).unwrap_or(&b'Q');
            message(tag, &random_bytes(rng, 512))
        }),
        2 | 3 => ("mutated valid message", {
            let v = valid(rng);
            mutate(rng, v)
        }),
        4 => ("lying length", {
            let tag = *TAGS.choose(rng).unwrap_or(&b'Q');
            let body = random_bytes(rng, 32);
            let mut m = vec![tag];
            m.extend_from_slice(&lying_length(rng, body.len() + 4).to_be_bytes());
            m.extend(body);
            m
        }),
        5 => ("Bind declaring a parameter it does not send", {
            let mut body = cstr("");
            body.extend(cstr(""));
            body.extend_from_slice(&[0, 1, 0, 0]); // one text format
            body.extend_from_slice(&[0, 1]); // one parameter... and no data
            [parse("SELECT $1::int"), message(b'B', &body)].concat()
        }),
        6 => ("Execute with max_rows -1", {
            let mut body = cstr("");
            body.extend_from_slice(&(-1i32).to_be_bytes());
            [parse("SELECT 1"), bind(), message(b'E', &body)].concat()
        }),
        7 => (
            "NUL inside a Query",
            message(b'Q', b"SELECT 1\0; SELECT 2\0"),
        ),
        8 => (
            "invalid UTF-8 in a Query",
            message(b'Q', b"SELECT '\xff\xfe\xc3'\0"),
        ),
        9 => ("COPY message outside COPY", {
            let tag = *b"dcf".choose(rng).unwrap_or(&b'd');
            message(tag, &random_bytes(rng, 64))
        }),
        _ => ("unframed garbage", random_bytes(rng, 256)),
    }
}

/// The next session of a fuzz client.
pub fn plan(rng: &mut StdRng) -> Plan {
    match rng.gen_range(0..10) {
        0 => Plan::Garbage(random_bytes(rng, 2048)),
        1 => {
            let s = startup();
            let cut = rng.gen_range(1..s.len());
            Plan::HalfStartup(s[..cut].to_vec())
        }
        2 => Plan::BadStartup(mutate_startup(rng)),
        _ => {
            let messages = (0..rng.gen_range(1..6))
                .map(|_| broken_message(rng))
                .collect();
            let then = match rng.gen_range(0..6) {
                0 => Then::Close,
                1 => {
                    let v = valid(rng);
                    let cut = rng.gen_range(1..v.len().max(2));
                    Then::Cut(v[..cut.min(v.len())].to_vec())
                }
                _ => Then::Sync,
            };
            Plan::LoggedIn { messages, then }
        }
    }
}

fn mutate_startup(rng: &mut StdRng) -> Vec<u8> {
    let mut s = startup();
    match rng.gen_range(0..4) {
        0 => {
            let len = lying_length(rng, s.len());
            s[0..4].copy_from_slice(&len.to_be_bytes());
        }
        1 => s[4..8].copy_from_slice(&rng.gen::<i32>().to_be_bytes()),
        2 => {
            for _ in 0..rng.gen_range(1..6) {
                let i = rng.gen_range(8..s.len());
                s[i] = rng.gen();
            }
        }
        _ => {
            // no terminating NUL: the parameters run into the end
            s.pop();
            let len = s.len() as i32;
            s[0..4].copy_from_slice(&len.to_be_bytes());
        }
    }
    s
}

/// One fuzz client: sessions until `end` or `stop`, a short random pause between them.
pub async fn fuzz_loop(
    port: u16,
    seed: u64,
    end: Instant,
    stop: &AtomicBool,
    tally: &Tally,
    timeline: &Timeline,
) {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut sessions = 0;
    while sessions < MAX_SESSIONS && Instant::now() < end && !stop.load(Ordering::SeqCst) {
        sessions += 1;
        let p = plan(&mut rng);
        let began = Instant::now();
        let result = run_plan(port, &p).await;
        timeline.hostile(
            || format!("fuzz: {}: {}", p.name(), short(&format!("{p:?}"), 60)),
            began,
        );
        match result {
            Ok(outcome) => tally.expected(Class::Fuzz, &format!("{}: {outcome}", p.name())),
            Err(what) => tally.unexpected(
                Class::Fuzz,
                &what,
                format!("{p:?}").chars().take(300).collect(),
            ),
        }
        tokio::time::sleep(Duration::from_millis(rng.gen_range(5..50))).await;
    }
}

/// Runs one session; the outcome key, or `Err` with what was unexpected.
async fn run_plan(port: u16, plan: &Plan) -> Result<String, String> {
    match plan {
        Plan::Garbage(bytes) | Plan::BadStartup(bytes) => {
            let mut wire = login::open(port).await?;
            let _ = wire.socket.write_all(bytes).await;
            let answer = read_raw(&mut wire.socket).await;
            check_codes(&answer.0)?;
            Ok(answer.describe())
        }
        Plan::HalfStartup(bytes) => {
            let mut wire = login::open(port).await?;
            let _ = wire.socket.write_all(bytes).await;
            Ok("closed by us".into())
        }
        Plan::LoggedIn { messages, then } => {
            let mut wire = login::raw(port).await?;
            for (_, m) in messages {
                if wire.socket.write_all(m).await.is_err() {
                    break;
                }
            }
            match then {
                Then::Close => return Ok("closed by us".into()),
                Then::Cut(part) => {
                    let _ = wire.socket.write_all(part).await;
                    return Ok("cut and closed by us".into());
                }
                Then::Sync => {
                    let _ = wire.socket.write_all(&message(b'S', &[])).await;
                }
            }
            let mut codes = Vec::new();
            let end = loop {
                match wire.read_message(QUIET).await {
                    Read::Message(b'E', body) => codes.push(error_code(&body)),
                    Read::Message(..) => {}
                    Read::Quiet => break "open",
                    Read::Closed => break "closed",
                }
                if codes.len() > 100 {
                    break "open";
                }
            };
            check_codes(&codes)?;
            Ok(Answer(codes, end).describe())
        }
    }
}

/// Error codes seen and how the connection ended.
struct Answer(Vec<String>, &'static str);

impl Answer {
    fn describe(&self) -> String {
        let mut codes = self.0.clone();
        codes.dedup();
        if codes.is_empty() {
            self.1.to_string()
        } else {
            format!("{} then {}", codes.join("+"), self.1)
        }
    }
}

/// An internal error is never an answer to bad input.
fn check_codes(codes: &[String]) -> Result<(), String> {
    match codes.iter().find(|c| c.starts_with("XX")) {
        Some(c) => Err(format!("internal error {c}")),
        None => Ok(()),
    }
}

/// Reads what the server sends a socket that never logged in, until it closes or is quiet;
/// the error codes of the whole messages in it.
async fn read_raw(socket: &mut TcpStream) -> Answer {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    let end = loop {
        match tokio::time::timeout(QUIET, socket.read(&mut chunk)).await {
            Err(_) => break "open",
            Ok(Ok(0)) | Ok(Err(_)) => break "closed",
            Ok(Ok(n)) if buf.len() < 1 << 16 => buf.extend_from_slice(&chunk[..n]),
            Ok(Ok(_)) => break "open",
        }
    };
    let mut codes = Vec::new();
    let mut rest = &buf[..];
    while rest.len() >= 5 {
        let len = i32::from_be_bytes([rest[1], rest[2], rest[3], rest[4]]);
        let Ok(len) = usize::try_from(len) else { break };
        if len < 4 || rest.len() < 1 + len {
            break;
        }
        if rest[0] == b'E' {
            codes.push(error_code(&rest[5..1 + len]));
        }
        rest = &rest[1 + len..];
    }
    Answer(codes, end)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plans_are_deterministic_and_varied() {
        let a: Vec<String> = {
            let mut rng = StdRng::seed_from_u64(7);
            (0..200).map(|_| format!("{:?}", plan(&mut rng))).collect()
        };
        let b: Vec<String> = {
            let mut rng = StdRng::seed_from_u64(7);
            (0..200).map(|_| format!("{:?}", plan(&mut rng))).collect()
        };
        assert_eq!(a, b);
        let mut rng = StdRng::seed_from_u64(7);
        let mut kinds = std::collections::BTreeSet::new();
        for _ in 0..2000 {
            match plan(&mut rng) {
                Plan::LoggedIn { messages, .. } => kinds.extend(messages.iter().map(|m| m.0)),
                p => {
                    kinds.insert(p.name());
                }
            }
        }
        assert_eq!(kinds.len(), 3 + 10, "{kinds:?}");
    }

    #[test]
    fn internal_errors_are_unexpected() {
        assert!(check_codes(&["08P01".into()]).is_ok());
        assert!(check_codes(&["08P01".into(), "XX000".into()]).is_err());
    }

    #[test]
    fn answers_describe_codes_and_the_end() {
        assert_eq!(Answer(vec![], "closed").describe(), "closed");
        let codes = vec!["08P01".into(), "08P01".into()];
        assert_eq!(Answer(codes, "closed").describe(), "08P01 then closed");
    }
}
