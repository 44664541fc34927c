//! Retention: the leader drops whole sealed segments that fall outside a stream's
//! `retention` (by their newest `ts`) or `retention_bytes`.
//!
//! The server starts [`run`] once the engine has recovered. It wakes every [`CHECK_INTERVAL`] on every node; on the leader it asks [`cut`] where
//! each stream with a retention option may begin and proposes the same replicated prefix
//! truncation as `DELETE FROM s WHERE offset < n`, so every replica drops the same segments
//! and reports the same `first_offset`. A tail or cursor whose position falls below the new
//! first offset fails with `22023` naming the first retained offset (see `tail.rs`).
//!
//! Invariants: a cut is always a segment boundary; the active (last) segment is never cut,
//! by time or by size; only the leader proposes (a follower's proposal would be forwarded,
//! but two nodes deciding on their own clocks would race for nothing); a failed proposal is
//! logged and retried at the next check.

use std::sync::{Arc, Weak};
use std::time::Duration;

use sluice_storage::SegmentInfo;

use crate::command::{op, Op, Truncate};
use crate::definition::StreamOptions;
use crate::engine::Engine;

/// How often each node looks for segments to drop.
pub const CHECK_INTERVAL: Duration = Duration::from_secs(1);

/// Where a stream may begin under its retention options at `now_micros`: the base offset
/// of the first segment to keep, if that drops at least one segment. `segments` are in
/// offset order, the last one active.
pub fn cut(segments: &[SegmentInfo], options: &StreamOptions, now_micros: i64) -> Option<u64> {
    let sealed = segments.len().checked_sub(1)?;
    let mut drop = 0;
    if let Some(ms) = options.retention_ms {
        let horizon =
            now_micros.saturating_sub(i64::try_from(ms).unwrap_or(i64::MAX / 1000) * 1000);
        drop = segments[..sealed]
            .iter()
            .take_while(|s| s.max_ts_micros.is_none_or(|ts| ts < horizon))
            .count();
    }
    if let Some(max_bytes) = options.retention_bytes {
        let mut total: u64 = segments.iter().map(|s| s.bytes).sum();
        let mut by_size = 0;
        while by_size < sealed && total > max_bytes {
            total -= segments[by_size].bytes;
            by_size += 1;
        }
        drop = drop.max(by_size);
    }
    (drop > 0).then(|| segments[drop].base_offset)
}

/// Starts [`run`] on the current tokio runtime, if there is one.
pub fn start(engine: &Arc<Engine>) {
    match tokio::runtime::Handle::try_current() {
        Ok(handle) => {
            handle.spawn(run(Arc::downgrade(engine)));
        }
        Err(_) => tracing::warn!("no runtime for the retention task: retention does not run"),
    }
}

/// Checks every stream with a retention option each [`CHECK_INTERVAL`] until the engine is
/// dropped; proposes the cuts on the leader.
pub async fn run(engine: Weak<Engine>) {
    let mut ticks = tokio::time::interval(CHECK_INTERVAL);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        let Some(engine) = engine.upgrade() else {
            return;
        };
        let status = engine.node_status();
        if status.leader_id != status.id || status.poisoned.is_some() || status.removed {
            continue;
        }
        let now = chrono::Utc::now().timestamp_micros();
        for stream in engine.catalog.list() {
            let options = &stream.def.options;
            if options.retention_ms.is_none() && options.retention_bytes.is_none() {
                continue;
            }
            let Some(before) = cut(&stream.log.segments(), options, now) else {
                continue;
            };
            if before <= stream.log.first_offset() {
                continue;
            }
            let op = Op {
                kind: Some(op::Kind::Truncate(Truncate {
                    stream: stream.def.name.clone(),
                    stream_id: stream.def.id,
                    before,
                })),
            };
            match engine.propose(vec![op]).await {
                Ok(_) => tracing::debug!(stream = stream.name(), before, "retention cut"),
                Err(e) => tracing::info!(stream = stream.name(), "retention cut not made: {e}"),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    fn seg(base: u64, next: u64, bytes: u64, max_ts: Option<i64>) -> SegmentInfo {
        SegmentInfo {
            base_offset: base,
            next_offset: next,
            bytes,
            logical_bytes: bytes,
            min_ts_micros: max_ts,
            max_ts_micros: max_ts,
            path: PathBuf::new(),
        }
    }

    #[test]
    fn cuts_are_segment_boundaries_and_never_the_active_segment() {
        let segs = [
            seg(0, 10, 100, Some(1_000_000)),
            seg(10, 20, 100, Some(2_000_000)),
            seg(20, 30, 100, Some(9_000_000)),
            seg(30, 35, 50, Some(9_500_000)),
        ];
        let by_time = |ms| StreamOptions {
            retention_ms: Some(ms),
            ..Default::default()
        };
        // at t = 10 s with 7.5 s retention: segments ending before 2.5 s go
        assert_eq!(cut(&segs, &by_time(7_500), 10_000_000), Some(20));
        assert_eq!(cut(&segs, &by_time(9_500), 10_000_000), None);
        // everything is old: the active segment stays
        assert_eq!(cut(&segs, &by_time(1), 100_000_000), Some(30));
        let by_size = |b| StreamOptions {
            retention_bytes: Some(b),
            ..Default::default()
        };
        assert_eq!(cut(&segs, &by_size(350), 0), None);
        assert_eq!(cut(&segs, &by_size(349), 0), Some(10));
        assert_eq!(cut(&segs, &by_size(0), 0), Some(30));
        // both: the later cut wins
        let both = StreamOptions {
            retention_ms: Some(7_500),
            retention_bytes: Some(260),
            ..Default::default()
        };
        assert_eq!(cut(&segs, &both, 10_000_000), Some(20));
        assert_eq!(cut(&segs[3..], &by_size(0), 0), None);
        assert_eq!(cut(&[], &by_size(0), 0), None);
    }
}
