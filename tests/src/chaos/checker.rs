//! The checks, as pure functions over what was recorded: they return anomalies (text with
//! the evidence) instead of panicking, so one run reports everything it found.
//!
//! - every node's dump of `chaos_log` is identical, offsets gapless from 0, `ts` never
//!   decreasing by offset;
//! - every acknowledged append is in the dump exactly once, at the offset it was
//!   acknowledged with; no append refused with a "not applied" SQLSTATE is in it; no row is
//!   there that no client tried; unknown outcomes are counted either way;
//! - each tail received offsets 0, 1, 2, ... (no gap, no repeat) and the same rows as the
//!   dump;
//! - every bank read saw all accounts, the fixed total and no negative balance;
//! - no two nodes claimed leadership in the same term.
//!
//! Timing measures (failover, availability, acks after membership steps) are here too.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::Duration;

use chrono::{DateTime, FixedOffset};

use super::history::{BankRead, LeaderSeen, LogRow, Op, Outcome, TailLog};

/// Unknown-outcome appends found in the log and not found.
#[derive(Clone, Copy, Debug, Default)]
pub struct UnknownCounts {
    pub present: usize,
    pub absent: usize,
}

/// A `ts` value as the server prints it (`2024-01-01 10:00:00.123456+00`).
pub fn parse_ts(ts: &str) -> Option<DateTime<FixedOffset>> {
    DateTime::parse_from_str(ts, "%Y-%m-%d %H:%M:%S%.f%#z")
        .or_else(|_| DateTime::parse_from_rfc3339(ts))
        .ok()
}

fn row_text(r: &LogRow) -> String {
    format!("({}, c{}, s{}, {})", r.offset, r.client, r.seq, r.ts)
}

/// All nodes hold the same rows; returns the anomalies (empty if identical).
pub fn compare_dumps(dumps: &BTreeMap<u64, Vec<LogRow>>) -> Vec<String> {
    let mut out = Vec::new();
    let Some((&first_id, first)) = dumps.iter().next() else {
        return out;
    };
    for (&id, dump) in dumps.iter().skip(1) {
        if dump == first {
            continue;
        }
        let at = first
            .iter()
            .zip(dump.iter())
            .position(|(a, b)| a != b)
            .unwrap_or(first.len().min(dump.len()));
        out.push(format!(
            "node {id} and node {first_id} differ: {} vs {} rows, first difference at index {at}: \
             {:?} vs {:?}",
            dump.len(),
            first.len(),
            dump.get(at).map(row_text),
            first.get(at).map(row_text),
        ));
    }
    out
}

/// Offsets gapless from 0 and `ts` non-decreasing.
pub fn check_dump_shape(node: u64, dump: &[LogRow]) -> Vec<String> {
    let mut out = Vec::new();
    if let Some((i, r)) = dump.iter().enumerate().find(|(i, r)| r.offset != *i as i64) {
        out.push(format!(
            "node {node}: offsets not gapless: index {i} holds offset {} ({} rows)",
            r.offset,
            dump.len()
        ));
    }
    let mut prev: Option<(&LogRow, DateTime<FixedOffset>)> = None;
    for r in dump {
        let Some(ts) = parse_ts(&r.ts) else {
            out.push(format!("node {node}: unparsable ts in row {}", row_text(r)));
            break;
        };
        if let Some((p, pts)) = prev {
            if ts < pts {
                out.push(format!(
                    "node {node}: ts decreases from {} to {}",
                    row_text(p),
                    row_text(r)
                ));
                break;
            }
        }
        prev = Some((r, ts));
    }
    out
}

/// Checks the appends' outcomes against the dump.
pub fn check_ops(dump: &[LogRow], ops: &[Op]) -> (Vec<String>, UnknownCounts) {
    let mut out = Vec::new();
    let mut at: HashMap<(i64, i64), Vec<i64>> = HashMap::new();
    for r in dump {
        at.entry((r.client, r.seq)).or_default().push(r.offset);
    }
    for ((c, s), offsets) in &at {
        if offsets.len() > 1 {
            out.push(format!(
                "(client {c}, seq {s}) is in the log {} times, at offsets {offsets:?}",
                offsets.len()
            ));
        }
    }
    let tried: HashMap<(i64, i64), &Op> = ops.iter().map(|o| ((o.client, o.seq), o)).collect();
    for ((c, s), offsets) in &at {
        if !tried.contains_key(&(*c, *s)) {
            out.push(format!(
                "(client {c}, seq {s}) at offset {offsets:?} was never sent by a client"
            ));
        }
    }
    let mut unknown = UnknownCounts::default();
    for op in ops {
        let found = at.get(&(op.client, op.seq));
        match &op.outcome {
            Outcome::Ok(offset) => match found {
                None => out.push(format!(
                    "acknowledged append lost: (client {}, seq {}) acked at offset {offset} by \
                     node {} at {:.3}s is not in the log",
                    op.client,
                    op.seq,
                    op.node,
                    op.end.as_secs_f64()
                )),
                Some(o) if !o.contains(offset) => out.push(format!(
                    "acknowledged append moved: (client {}, seq {}) acked at offset {offset} by \
                     node {} is at offset {o:?}",
                    op.client, op.seq, op.node
                )),
                Some(_) => {}
            },
            Outcome::Failed(code) => {
                if let Some(o) = found {
                    out.push(format!(
                        "failed append applied: (client {}, seq {}) refused with {code} by node {} \
                         at {:.3}s is in the log at offset {o:?}",
                        op.client,
                        op.seq,
                        op.node,
                        op.end.as_secs_f64()
                    ));
                }
            }
            Outcome::Unknown(_) => {
                if found.is_some() {
                    unknown.present += 1;
                } else {
                    unknown.absent += 1;
                }
            }
        }
    }
    (out, unknown)
}

/// A tail received offsets 0, 1, 2, ... and the same rows as the dump. Rows past the dump
/// are checked only when `complete` (nothing can commit after the dump).
pub fn check_tail(tail: &TailLog, dump: &[LogRow], complete: bool) -> Vec<String> {
    let mut out = Vec::new();
    if let Some((i, r)) = tail
        .rows
        .iter()
        .enumerate()
        .find(|(i, r)| r.offset != *i as i64)
    {
        let prev = i.checked_sub(1).and_then(|p| tail.rows.get(p));
        out.push(format!(
            "tail on node {}: gap or repeat at position {i}: offset {} after {:?} ({} COPYs)",
            tail.node,
            r.offset,
            prev.map(|p| p.offset),
            tail.copies
        ));
        return out;
    }
    if let Some((i, (t, d))) = tail
        .rows
        .iter()
        .zip(dump.iter())
        .enumerate()
        .find(|(_, (t, d))| t != d)
    {
        out.push(format!(
            "tail on node {}: row {i} is {} but the log has {}",
            tail.node,
            row_text(t),
            row_text(d)
        ));
    }
    if complete && tail.rows.len() > dump.len() {
        out.push(format!(
            "tail on node {}: received {} rows, the log has {}",
            tail.node,
            tail.rows.len(),
            dump.len()
        ));
    }
    out
}

/// Bank reads that broke the invariant (one anomaly per node, with a count).
pub fn check_bank(reads: &[BankRead], accounts: i64, total: i64) -> Vec<String> {
    let mut bad: BTreeMap<u64, (usize, &BankRead)> = BTreeMap::new();
    for r in reads {
        if r.accounts != accounts || r.total != total || r.min_balance < 0 {
            bad.entry(r.node).or_insert((0, r)).0 += 1;
        }
    }
    bad.into_iter()
        .map(|(node, (n, r))| {
            format!(
                "bank on node {node}: {n} reads broke the invariant, first at {:.3}s: {} accounts, \
                 total {} (expected {accounts} and {total}), min balance {}",
                r.at.as_secs_f64(),
                r.accounts,
                r.total,
                r.min_balance
            )
        })
        .collect()
}

/// Terms in which more than one node claimed leadership, with evidence.
pub fn check_leaders(seen: &[LeaderSeen]) -> Vec<(i64, String)> {
    let mut by_term: BTreeMap<i64, BTreeMap<u64, (Duration, Duration)>> = BTreeMap::new();
    for s in seen {
        let e = by_term
            .entry(s.term)
            .or_default()
            .entry(s.leader)
            .or_insert((s.at, s.at));
        e.0 = e.0.min(s.at);
        e.1 = e.1.max(s.at);
    }
    by_term
        .into_iter()
        .filter(|(_, leaders)| leaders.len() > 1)
        .map(|(term, leaders)| {
            let who: Vec<String> = leaders
                .iter()
                .map(|(id, (a, b))| {
                    format!(
                        "node {id} claimed it from {:.3}s to {:.3}s",
                        a.as_secs_f64(),
                        b.as_secs_f64()
                    )
                })
                .collect();
            (
                term,
                format!("two leaders in term {term}: {}", who.join("; ")),
            )
        })
        .collect()
}

/// The terms seen and their leaders, for the report.
pub fn leader_terms(seen: &[LeaderSeen]) -> BTreeMap<i64, BTreeSet<u64>> {
    let mut out: BTreeMap<i64, BTreeSet<u64>> = BTreeMap::new();
    for s in seen {
        out.entry(s.term).or_default().insert(s.leader);
    }
    out
}

/// Time from `from` to the first acknowledgement of an append sent at or after `from`.
pub fn failover(ops: &[Op], from: Duration) -> Option<Duration> {
    ops.iter()
        .filter(|o| matches!(o.outcome, Outcome::Ok(_)) && o.start >= from)
        .map(|o| o.end - from)
        .min()
}

/// Time from `from` to the first acknowledgement after it (of any append).
pub fn next_ack(ops: &[Op], from: Duration) -> Option<Duration> {
    ops.iter()
        .filter(|o| matches!(o.outcome, Outcome::Ok(_)) && o.end >= from)
        .map(|o| o.end - from)
        .min()
}

/// Fraction of the 100 ms windows of `[from, to)` in which at least one append was acked.
pub fn availability(ops: &[Op], from: Duration, to: Duration) -> Option<f64> {
    let window = Duration::from_millis(100);
    let n = ((to.saturating_sub(from)).as_millis() / window.as_millis()) as usize;
    if n == 0 {
        return None;
    }
    let mut hit = vec![false; n];
    for o in ops {
        if matches!(o.outcome, Outcome::Ok(_)) && o.end >= from && o.end < to {
            let i = ((o.end - from).as_millis() / window.as_millis()) as usize;
            if i < n {
                hit[i] = true;
            }
        }
    }
    Some(hit.iter().filter(|h| **h).count() as f64 / n as f64)
}

/// The `p`-quantile (0..=1) of `values` (nearest rank).
pub fn quantile(values: &[Duration], p: f64) -> Option<Duration> {
    if values.is_empty() {
        return None;
    }
    let mut v = values.to_vec();
    v.sort();
    let rank = ((p * v.len() as f64).ceil() as usize).clamp(1, v.len());
    Some(v[rank - 1])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(offset: i64, client: i64, seq: i64, ts: &str) -> LogRow {
        LogRow {
            offset,
            client,
            seq,
            ts: ts.into(),
        }
    }

    fn op(client: i64, seq: i64, outcome: Outcome) -> Op {
        Op {
            client,
            seq,
            node: 1,
            start: Duration::from_millis(10),
            end: Duration::from_millis(20),
            outcome,
        }
    }

    const T0: &str = "2024-01-01 10:00:00.1+00";
    const T1: &str = "2024-01-01 10:00:00.25+00";

    #[test]
    fn a_consistent_history_passes() {
        let dump = vec![row(0, 0, 0, T0), row(1, 1, 0, T1), row(2, 0, 1, T1)];
        let ops = vec![
            op(0, 0, Outcome::Ok(0)),
            op(1, 0, Outcome::Ok(1)),
            op(0, 1, Outcome::Unknown("40003".into())),
            op(1, 1, Outcome::Failed("40001".into())),
        ];
        assert!(check_dump_shape(1, &dump).is_empty());
        let (anomalies, unknown) = check_ops(&dump, &ops);
        assert!(anomalies.is_empty(), "{anomalies:?}");
        assert_eq!((unknown.present, unknown.absent), (1, 0));
        let tail = TailLog {
            node: 2,
            rows: dump[..2].to_vec(),
            ..TailLog::default()
        };
        assert!(check_tail(&tail, &dump, true).is_empty());
    }

    #[test]
    fn lost_moved_duplicated_failed_and_phantom_rows_are_reported() {
        let dump = vec![
            row(0, 0, 1, T0),
            row(1, 0, 1, T0),
            row(2, 1, 1, T1),
            row(3, 9, 9, T1),
        ];
        let ops = vec![
            op(0, 0, Outcome::Ok(0)),
            op(0, 1, Outcome::Ok(2)),
            op(1, 1, Outcome::Failed("40001".into())),
        ];
        let (anomalies, _) = check_ops(&dump, &ops);
        let text = anomalies.join("\n");
        for needle in [
            "lost",
            "2 times",
            "moved",
            "failed append applied",
            "never sent",
        ] {
            assert!(text.contains(needle), "{needle} not in {text}");
        }
    }

    #[test]
    fn shape_gaps_decreasing_ts_and_divergence_are_reported() {
        let dump = vec![row(0, 0, 0, T1), row(2, 0, 1, T0)];
        let text = check_dump_shape(1, &dump).join("\n");
        assert!(
            text.contains("gapless") && text.contains("ts decreases"),
            "{text}"
        );
        let dumps = BTreeMap::from([(1, dump.clone()), (2, dump[..1].to_vec())]);
        assert_eq!(compare_dumps(&dumps).len(), 1);
    }

    #[test]
    fn tail_gaps_and_foreign_rows_are_reported() {
        let dump = vec![row(0, 0, 0, T0), row(1, 0, 1, T0), row(2, 0, 2, T0)];
        let mut tail = TailLog {
            node: 3,
            rows: vec![dump[0].clone(), dump[2].clone()],
            ..TailLog::default()
        };
        assert!(check_tail(&tail, &dump, false)[0].contains("gap"));
        tail.rows = vec![dump[0].clone(), row(1, 5, 5, T0)];
        assert!(check_tail(&tail, &dump, false)[0].contains("the log has"));
    }

    #[test]
    fn two_leaders_in_one_term_are_reported_and_timing_measures_add_up() {
        let seen = |at: u64, term: i64, leader: u64| LeaderSeen {
            at: Duration::from_millis(at),
            term,
            leader,
        };
        let leaders = [seen(0, 2, 1), seen(200, 3, 2), seen(400, 3, 4)];
        let found = check_leaders(&leaders);
        assert_eq!(found.len(), 1);
        assert_eq!(found[0].0, 3);
        let ops = vec![Op {
            start: Duration::from_millis(1100),
            end: Duration::from_millis(1250),
            ..op(0, 0, Outcome::Ok(0))
        }];
        assert_eq!(
            failover(&ops, Duration::from_secs(1)),
            Some(Duration::from_millis(250))
        );
        assert_eq!(
            availability(&ops, Duration::from_secs(1), Duration::from_secs(2)),
            Some(0.1)
        );
        let d = |ms| Duration::from_millis(ms);
        assert_eq!(quantile(&[d(3), d(1), d(2)], 0.5), Some(d(2)));
        assert_eq!(quantile(&[d(3), d(1), d(2)], 0.99), Some(d(3)));
        assert!(parse_ts("2024-01-01 10:00:00+00").is_some());
    }
}
