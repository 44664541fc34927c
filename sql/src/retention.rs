//! Retention: the leader drops whole sealed segments that fall outside a stream's
//! `retention` (by their newest `ts`) or `retention_bytes`.
//!
//! The server starts [`run`] once the engine has recovered. It wakes every [`CHECK_INTERVAL`] on every node; on the leader it asks [`cut`] where
//! each stream with a retention option may begin and proposes the same replicated prefix
//! truncation as `DELETE FROM s WHERE offset < n`, so every replica drops the same segments
//! and reports the same `first_offset`. A tail or cursor whose position falls below the new
//! first offset fails with `22023` naming the first retained offset (see `tail.rs`).
//!
//! With `retain_for_consumers = true`, a stream keeps every row a consumer registered in
//! `consumer_offsets` has not processed: no segment holding an offset above the smallest
//! committed `offset` for the stream is dropped (consumers resume after what they
//! committed), however old or large the stream. A consumer holds retention from its first
//! commit until its row is deleted.
//!
//! Invariants: a cut is always a segment boundary; the active (last) segment is never cut,
//! by time or by size; only the leader proposes (a follower's proposal would be forwarded,
//! but two nodes deciding on their own clocks would race for nothing); a failed proposal is
//! logged and retried at the next check.

use std::sync::{Arc, Weak};
use std::time::Duration;

use sluice_storage::SegmentInfo;

use datafusion::scalar::ScalarValue;

use crate::command::{op, Op, Truncate};
use crate::definition::{StreamOptions, TableDef, CONSUMER_OFFSETS_ID};
use crate::engine::Engine;

/// How often each node looks for segments to drop.
pub const CHECK_INTERVAL: Duration = Duration::from_secs(1);

/// Where a stream may begin under its retention options at `now_micros`: the base offset
/// of the first segment to keep, if that drops at least one segment. `segments` are in
/// offset order, the last one active. `hold`: the first offset a consumer still needs (with
/// `retain_for_consumers`); no segment with rows at or after it is dropped.
pub fn cut(
    segments: &[SegmentInfo],
    options: &StreamOptions,
    now_micros: i64,
    hold: Option<u64>,
) -> Option<u64> {
    let held = hold.map_or(segments.len(), |h| {
        segments.iter().take_while(|s| s.next_offset <= h).count()
    });
    let sealed = segments.len().checked_sub(1)?.min(held);
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
            let hold = if options.retain_for_consumers {
                match consumers_hold(&engine, stream.name()) {
                    Ok(hold) => hold,
                    Err(e) => {
                        tracing::warn!(stream = stream.name(), "retention skipped: {e}");
                        continue;
                    }
                }
            } else {
                None
            };
            let Some(before) = cut(&stream.log.segments(), options, now, hold) else {
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
                Ok(_) => {
                    engine
                        .retention_cuts
                        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    tracing::debug!(stream = stream.name(), before, "retention cut")
                }
                Err(e) => tracing::info!(stream = stream.name(), "retention cut not made: {e}"),
            }
        }
    }
}

/// The first offset of `stream` a registered consumer still needs: one after the smallest
/// `offset` committed for it in `consumer_offsets` (read from this node's applied state).
fn consumers_hold(engine: &Engine, stream: &str) -> crate::error::Result<Option<u64>> {
    let def = TableDef::consumer_offsets();
    let types: Vec<_> = def.columns.iter().map(|c| c.ty).collect();
    let (stream_col, offset_col) = (
        def.columns.iter().position(|c| c.name == "stream"),
        def.columns.iter().position(|c| c.name == "offset"),
    );
    let (Some(stream_col), Some(offset_col)) = (stream_col, offset_col) else {
        return Err(crate::error::Error::internal(
            "consumer_offsets has no stream/offset",
        ));
    };
    let mut hold: Option<u64> = None;
    for (_, v) in engine.tables.snapshot().scan(CONSUMER_OFFSETS_ID)? {
        let row = crate::table::codec::decode_row(&v.row, &types)?;
        let (ScalarValue::Utf8(Some(s)), ScalarValue::Int64(Some(offset))) =
            (&row[stream_col], &row[offset_col])
        else {
            continue;
        };
        if s == stream {
            let needed = u64::try_from(offset.saturating_add(1)).unwrap_or(0);
            hold = Some(hold.map_or(needed, |h| h.min(needed)));
        }
    }
    Ok(hold)
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
        assert_eq!(cut(&segs, &by_time(7_500), 10_000_000, None), Some(20));
        assert_eq!(cut(&segs, &by_time(9_500), 10_000_000, None), None);
        // everything is old: the active segment stays
        assert_eq!(cut(&segs, &by_time(1), 100_000_000, None), Some(30));
        let by_size = |b| StreamOptions {
            retention_bytes: Some(b),
            ..Default::default()
        };
        assert_eq!(cut(&segs, &by_size(350), 0, None), None);
        assert_eq!(cut(&segs, &by_size(349), 0, None), Some(10));
        assert_eq!(cut(&segs, &by_size(0), 0, None), Some(30));
        // both: the later cut wins
        let both = StreamOptions {
            retention_ms: Some(7_500),
            retention_bytes: Some(260),
            ..Default::default()
        };
        assert_eq!(cut(&segs, &both, 10_000_000, None), Some(20));
        assert_eq!(cut(&segs[3..], &by_size(0), 0, None), None);
        assert_eq!(cut(&[], &by_size(0), 0, None), None);
        // a consumer that committed offset 14 needs 15..: only the first segment may go
        assert_eq!(cut(&segs, &by_size(0), 0, Some(15)), Some(10));
        assert_eq!(cut(&segs, &by_time(1), 100_000_000, Some(15)), Some(10));
        // one that needs offset 10 exactly: the first segment (0..10) may go
        assert_eq!(cut(&segs, &by_size(0), 0, Some(10)), Some(10));
        // one at the very start holds everything
        assert_eq!(cut(&segs, &by_size(0), 0, Some(0)), None);
        assert_eq!(cut(&segs, &by_size(0), 0, Some(9)), None);
        // caught up: retention as without it
        assert_eq!(cut(&segs, &by_size(0), 0, Some(35)), Some(30));
    }
}
