//! The honest load: writers, each a tokio-postgres connection inserting ~100-byte rows in a
//! closed loop with a prepared `INSERT INTO w (k, v) VALUES ($1, $2) RETURNING offset`.
//! Every attempt ends as acknowledged (its `(k, offset)` kept for the check), refused with
//! an SQLSTATE that means "not applied", or unknown (a lost connection, a timeout: the row
//! may or may not be there). Keys are unique over the run: phase, writer and sequence number
//! are packed into `k`.
//!
//! Throughput counts acknowledgements that arrive before the phase's end, per second and in
//! all; latency is from sending an INSERT to its acknowledgement (closed loop: a stall
//! delays the next request instead of counting against it).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;

use super::login;
use super::tally::error_key;
use super::timeline::Timeline;

pub const INSERT: &str = "INSERT INTO w (k, v) VALUES ($1, $2) RETURNING offset";
pub const CREATE: &str = "CREATE STREAM w (k bigint NOT NULL, v text)";
/// A writer gives up on one INSERT after this long (its outcome is then unknown): a hang
/// guard, far above any latency worth measuring.
pub const OP_TIMEOUT: Duration = Duration::from_secs(60);
/// Bound on one writer's attempts in one phase.
pub const MAX_OPS_PER_WRITER: u64 = 50_000_000;
/// The highest latency the histograms hold (longer ones are recorded as this).
const MAX_LATENCY_US: u64 = 3_600_000_000;

/// The unique key of attempt `seq` of `writer` in `phase`.
pub fn key(phase: usize, writer: usize, seq: u64) -> i64 {
    (((phase as i64) << 8 | writer as i64) << 40) | seq as i64
}

/// A value of 100 bytes that names its key.
pub fn value(k: i64) -> String {
    format!("{k:020}-{}", "v".repeat(79))
}

/// Whether an INSERT that failed with `e` was certainly not applied.
fn not_applied(e: &tokio_postgres::Error) -> bool {
    e.code().is_some_and(|c| {
        let c = c.code();
        c == "40001" || c == "57P03" || ["42", "22", "23", "25", "0A", "53"].contains(&&c[..2])
    })
}

/// The writers' side of one phase.
#[derive(Clone, Debug)]
pub struct Writes {
    /// Acknowledged `(k, offset)`, in no order.
    pub acks: Vec<(i64, i64)>,
    /// Keys of attempts whose outcome is unknown.
    pub unknown: Vec<i64>,
    /// Keys of attempts refused as not applied.
    pub refused: Vec<i64>,
    /// Errors by outcome key (SQLSTATE, `connection lost`, `timeout`, `login: ...`).
    pub errors: BTreeMap<String, u64>,
    /// Microseconds from INSERT to acknowledgement.
    pub latency: Histogram<u64>,
    /// Acknowledgements per whole second of the phase.
    pub per_second: Vec<u64>,
    /// Acknowledgements before the phase's end.
    pub in_phase: u64,
    pub duration: Duration,
}

impl Writes {
    fn new(duration: Duration) -> Writes {
        Writes {
            acks: Vec::new(),
            unknown: Vec::new(),
            refused: Vec::new(),
            errors: BTreeMap::new(),
            latency: new_histogram(),
            per_second: vec![0; duration.as_secs() as usize],
            in_phase: 0,
            duration,
        }
    }

    fn merge(&mut self, other: Writes) {
        self.acks.extend(other.acks);
        self.unknown.extend(other.unknown);
        self.refused.extend(other.refused);
        for (k, n) in other.errors {
            *self.errors.entry(k).or_default() += n;
        }
        let _ = self.latency.add(&other.latency);
        for (a, b) in self.per_second.iter_mut().zip(other.per_second) {
            *a += b;
        }
        self.in_phase += other.in_phase;
    }

    /// Acknowledged rows per second over the whole phase.
    pub fn rate(&self) -> f64 {
        self.in_phase as f64 / self.duration.as_secs_f64().max(1e-9)
    }
}

fn new_histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, MAX_LATENCY_US, 3)
        .unwrap_or_else(|e| unreachable!("constant histogram bounds: {e}"))
}

/// Runs `writers` writers against `port` for `duration`; phase `phase` names their keys.
pub async fn run_phase(
    port: u16,
    writers: usize,
    phase: usize,
    duration: Duration,
    timeline: &Arc<Timeline>,
) -> Writes {
    let started = Instant::now();
    let end = started + duration;
    let tasks: Vec<_> = (0..writers)
        .map(|w| {
            let timeline = timeline.clone();
            tokio::spawn(async move {
                write_loop(port, phase, w, started, end, duration, &timeline).await
            })
        })
        .collect();
    let mut all = Writes::new(duration);
    for t in tasks {
        match t.await {
            Ok(writes) => all.merge(writes),
            Err(e) => *all.errors.entry(format!("writer task: {e}")).or_default() += 1,
        }
    }
    all
}

async fn write_loop(
    port: u16,
    phase: usize,
    writer: usize,
    started: Instant,
    end: Instant,
    duration: Duration,
    timeline: &Timeline,
) -> Writes {
    let mut out = Writes::new(duration);
    let mut session = None;
    let mut seq = 0;
    while seq < MAX_OPS_PER_WRITER && Instant::now() < end {
        let Some((client, insert)) = session.as_ref() else {
            let prepared = async {
                let client = login::session(port, None).await?;
                let insert = client.prepare(INSERT).await.map_err(|e| error_key(&e))?;
                Ok::<_, String>((client, insert))
            };
            match tokio::time::timeout(login::LOGIN_TIMEOUT + OP_TIMEOUT, prepared).await {
                Ok(Ok(s)) => session = Some(s),
                Ok(Err(e)) => *out.errors.entry(e).or_default() += 1,
                Err(_) => *out.errors.entry("login: timeout".into()).or_default() += 1,
            }
            if session.is_none() {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            continue;
        };
        let k = key(phase, writer, seq);
        seq += 1;
        let v = value(k);
        let sent = Instant::now();
        let result = tokio::time::timeout(OP_TIMEOUT, client.query_one(insert, &[&k, &v])).await;
        timeline.writer(|| format!("writer {writer} INSERT"), sent);
        let error = match result {
            Ok(Ok(row)) => match row.try_get::<_, i64>(0) {
                Ok(offset) => {
                    let now = Instant::now();
                    out.acks.push((k, offset));
                    let us = now.duration_since(sent).as_micros() as u64;
                    out.latency.saturating_record(us.clamp(1, MAX_LATENCY_US));
                    if now < end {
                        out.in_phase += 1;
                        let second = now.duration_since(started).as_secs() as usize;
                        if let Some(n) = out.per_second.get_mut(second) {
                            *n += 1;
                        }
                    }
                    continue;
                }
                Err(e) => {
                    out.unknown.push(k);
                    format!("bad RETURNING row: {e}")
                }
            },
            Ok(Err(e)) => {
                if not_applied(&e) {
                    out.refused.push(k);
                } else {
                    out.unknown.push(k);
                }
                error_key(&e)
            }
            Err(_) => {
                out.unknown.push(k);
                format!("no answer within {OP_TIMEOUT:?}")
            }
        };
        eprintln!("hostile: writer {writer}: INSERT k={k}: {error}");
        *out.errors.entry(error).or_default() += 1;
        session = None;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_unique_across_phases_and_writers() {
        let mut seen = std::collections::HashSet::new();
        for phase in 0..2 {
            for writer in 0..8 {
                for seq in [0, 1, (1 << 40) - 1] {
                    assert!(seen.insert(key(phase, writer, seq)));
                }
            }
        }
        assert!(key(1, 255, (1 << 40) - 1) > 0);
    }

    #[test]
    fn values_are_about_a_hundred_bytes() {
        assert_eq!(value(key(1, 7, 12345)).len(), 100);
    }

    #[test]
    fn merged_writes_add_up() {
        let mut a = Writes::new(Duration::from_secs(2));
        let mut b = Writes::new(Duration::from_secs(2));
        a.per_second = vec![3, 4];
        b.per_second = vec![1, 1];
        a.in_phase = 7;
        b.in_phase = 2;
        b.latency.record(10).expect("record");
        b.errors.insert("57014".into(), 1);
        a.merge(b);
        assert_eq!(a.per_second, vec![4, 5]);
        assert_eq!(a.in_phase, 9);
        assert_eq!(a.latency.len(), 1);
        assert!((a.rate() - 4.5).abs() < 1e-9);
    }
}
