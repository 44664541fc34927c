//! When the slow things happened: writer INSERTs that stalled and hostile statements that
//! ran long, as spans on one clock from the start of the run, so the report can say which
//! hostile statements were running while the writers waited.
//!
//! Bounded: only spans of at least [`SLOW`] are kept, at most [`MAX_SPANS`] of each kind.

use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

/// Shorter spans are not kept.
pub const SLOW: Duration = Duration::from_millis(500);
/// Spans kept per kind.
pub const MAX_SPANS: usize = 20_000;

/// One slow thing: what, when it started (from the run's start), how long it took.
#[derive(Clone, Debug)]
pub struct Span {
    pub what: String,
    pub start: Duration,
    pub took: Duration,
}

impl Span {
    fn end(&self) -> Duration {
        self.start + self.took
    }

    fn overlaps(&self, other: &Span) -> bool {
        self.start < other.end() && other.start < self.end()
    }
}

/// Writer stalls that overlap one another, merged.
#[derive(Clone, Debug)]
pub struct Episode {
    /// From the first stalled INSERT's sending to the last one's answer.
    pub span: Span,
    /// Stalled INSERTs in it.
    pub stalls: usize,
    /// The longest of them.
    pub longest: Duration,
    /// Slow hostile statements that overlapped it.
    pub during: Vec<Span>,
}

#[derive(Debug)]
pub struct Timeline {
    origin: Instant,
    stalls: Mutex<Vec<Span>>,
    hostile: Mutex<Vec<Span>>,
}

impl Default for Timeline {
    fn default() -> Self {
        Timeline {
            origin: Instant::now(),
            stalls: Mutex::default(),
            hostile: Mutex::default(),
        }
    }
}

fn push(spans: &Mutex<Vec<Span>>, span: Span) {
    let mut spans = spans.lock().unwrap_or_else(PoisonError::into_inner);
    if spans.len() < MAX_SPANS {
        spans.push(span);
    }
}

impl Timeline {
    fn span(&self, what: impl FnOnce() -> String, started: Instant) -> Option<Span> {
        let took = started.elapsed();
        (took >= SLOW).then(|| Span {
            what: what(),
            start: started.saturating_duration_since(self.origin),
            took,
        })
    }

    /// Time since the timeline's origin (the spans' clock).
    pub fn now(&self) -> Duration {
        self.origin.elapsed()
    }

    /// A writer's INSERT sent at `started` was just acknowledged or failed.
    pub fn writer(&self, what: impl FnOnce() -> String, started: Instant) {
        if let Some(s) = self.span(what, started) {
            push(&self.stalls, s);
        }
    }

    /// A hostile statement started at `started` just ended.
    pub fn hostile(&self, what: impl FnOnce() -> String, started: Instant) {
        if let Some(s) = self.span(what, started) {
            push(&self.hostile, s);
        }
    }

    /// The `n` worst stall episodes (writer stalls that overlap, merged), longest first,
    /// each with the slow hostile statements that overlapped it (longest first, at most 6).
    pub fn worst_stalls(&self, n: usize) -> Vec<Episode> {
        let mut stalls = self
            .stalls
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        stalls.sort_by_key(|s| s.start);
        let mut episodes: Vec<Episode> = Vec::new();
        for s in stalls {
            match episodes.last_mut() {
                Some(e) if s.start < e.span.end() => {
                    e.span.took = e.span.took.max(s.end() - e.span.start);
                    e.stalls += 1;
                    e.longest = e.longest.max(s.took);
                }
                _ => episodes.push(Episode {
                    span: Span {
                        what: "writer stall".into(),
                        ..s.clone()
                    },
                    stalls: 1,
                    longest: s.took,
                    during: Vec::new(),
                }),
            }
        }
        episodes.sort_by_key(|e| std::cmp::Reverse(e.longest));
        episodes.truncate(n);
        let hostile = self.hostile.lock().unwrap_or_else(PoisonError::into_inner);
        for e in &mut episodes {
            e.during = hostile
                .iter()
                .filter(|h| h.overlaps(&e.span))
                .cloned()
                .collect();
            e.during.sort_by_key(|h| std::cmp::Reverse(h.took));
            e.during.truncate(6);
        }
        episodes
    }

    /// How many writer stalls of at least [`SLOW`] there were.
    pub fn stall_count(&self) -> usize {
        self.stalls
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn span(what: &str, start: u64, took: u64) -> Span {
        Span {
            what: what.into(),
            start: Duration::from_millis(start),
            took: Duration::from_millis(took),
        }
    }

    #[test]
    fn overlapping_stalls_merge_into_episodes_with_what_ran_during_them() {
        let t = Timeline::default();
        push(&t.stalls, span("w1", 1000, 2000));
        push(&t.stalls, span("w2", 2500, 1000));
        push(&t.stalls, span("w3", 9000, 600));
        push(&t.hostile, span("big", 500, 1000));
        push(&t.hostile, span("bigger", 3200, 3000));
        push(&t.hostile, span("later", 4000, 1000));
        let worst = t.worst_stalls(5);
        assert_eq!(worst.len(), 2);
        let e = &worst[0];
        assert_eq!((e.stalls, e.longest), (2, Duration::from_millis(2000)));
        assert_eq!(
            (e.span.start, e.span.took),
            (Duration::from_millis(1000), Duration::from_millis(2500))
        );
        let during: Vec<&str> = e.during.iter().map(|h| h.what.as_str()).collect();
        assert_eq!(during, ["bigger", "big"]);
        assert_eq!(worst[1].stalls, 1);
        assert!(worst[1].during.is_empty());
        assert_eq!(t.stall_count(), 3);
    }

    #[test]
    fn quick_spans_are_not_kept() {
        let t = Timeline::default();
        t.writer(|| "quick".into(), Instant::now());
        assert_eq!(t.stall_count(), 0);
    }
}
