//! LISTEN / NOTIFY: channels between sessions, and stream listeners.
//!
//! Every session has one bounded notification queue. `NOTIFY` (and
//! `pg_notify`) offers a notification to each listener's queue without
//! waiting: a full queue drops it for that listener only, so a client that
//! stops reading never slows anyone else. `LISTEN s` on a stream starts a
//! follower task that turns each committed row into a JSON notification;
//! when the queue is full the follower stops, waits for room, sends one
//! `{"lagged":true,"resume_from":N}` notification (N = first row not
//! delivered) and carries on from the stream's end. Followers are aborted
//! on UNLISTEN or when the session ends.

use std::collections::HashMap;
use std::sync::Arc;

use arrow::array::RecordBatch;
use parking_lot::Mutex;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use crate::catalog::{Catalog, Stream};
use crate::provider::read_frame;

/// Capacity of each session's notification queue.
pub const QUEUE_CAPACITY: usize = 1024;
/// Largest payload sent whole; larger rows are sent as `{"offset":N,"truncated":true}`.
pub const MAX_PAYLOAD: usize = 8000;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Notification {
    /// Backend pid of the notifying session (0 for stream rows).
    pub pid: i32,
    pub channel: String,
    pub payload: String,
}

/// Routes notifications to listening sessions.
#[derive(Debug, Default)]
pub struct Hub {
    channels: Mutex<HashMap<String, HashMap<u64, mpsc::Sender<Notification>>>>,
}

impl Hub {
    pub fn subscribe(&self, channel: &str, session: u64, tx: mpsc::Sender<Notification>) {
        self.channels
            .lock()
            .entry(channel.to_string())
            .or_default()
            .insert(session, tx);
    }

    pub fn unsubscribe(&self, channel: &str, session: u64) {
        let mut ch = self.channels.lock();
        if let Some(subs) = ch.get_mut(channel) {
            subs.remove(&session);
            if subs.is_empty() {
                ch.remove(channel);
            }
        }
    }

    pub fn unsubscribe_all(&self, session: u64) {
        let mut ch = self.channels.lock();
        ch.retain(|_, subs| {
            subs.remove(&session);
            !subs.is_empty()
        });
    }

    /// Offer a notification to every listener of `channel`, never waiting.
    pub fn publish(&self, n: &Notification) {
        let ch = self.channels.lock();
        if let Some(subs) = ch.get(&n.channel) {
            for tx in subs.values() {
                if tx.try_send(n.clone()).is_err() {
                    tracing::debug!(channel = %n.channel, "listener queue full; notification dropped");
                }
            }
        }
    }
}

/// Follow `stream` from its current end, sending one notification per row.
pub fn follow_stream(
    catalog: Arc<Catalog>,
    stream: Arc<Stream>,
    tx: mpsc::Sender<Notification>,
) -> JoinHandle<()> {
    tokio::spawn(async move {
        let mut advanced = stream.subscribe();
        let mut pos = stream.log.next_offset();
        loop {
            let end = stream.log.next_offset();
            if pos < end {
                match deliver(&stream, pos, end, &tx) {
                    Ok(next) => pos = next,
                    Err(Lag::Full(resume_from)) => {
                        // wait for room without reading the stream, then say where to resume
                        let Ok(permit) = tx.reserve().await else {
                            return;
                        };
                        permit.send(Notification {
                            pid: 0,
                            channel: stream.name().to_string(),
                            payload: format!("{{\"lagged\":true,\"resume_from\":{resume_from}}}"),
                        });
                        pos = stream.log.next_offset();
                    }
                    Err(Lag::Closed) => return,
                    Err(Lag::Failed(e)) => {
                        tracing::warn!(stream = %stream.name(), "stream listener stopped: {e}");
                        return;
                    }
                }
                continue;
            }
            if catalog.get(stream.name()).map(|s| s.def.id) != Some(stream.def.id) {
                return;
            }
            tokio::select! {
                r = advanced.changed() => if r.is_err() { return },
                _ = tokio::time::sleep(std::time::Duration::from_secs(1)) => {}
            }
        }
    })
}

enum Lag {
    Full(u64),
    Closed,
    Failed(String),
}

/// Send rows [from, to); returns the next position.
fn deliver(
    stream: &Stream,
    from: u64,
    to: u64,
    tx: &mpsc::Sender<Notification>,
) -> Result<u64, Lag> {
    let from = from.max(stream.log.first_offset());
    for meta in stream.log.batches(from, to) {
        let batch = read_frame(stream, &meta, from, to).map_err(|e| Lag::Failed(e.to_string()))?;
        let first = meta.base_offset.max(from);
        for (i, payload) in row_payloads(&batch)
            .map_err(Lag::Failed)?
            .into_iter()
            .enumerate()
        {
            let offset = first + i as u64;
            let payload = if payload.len() >= MAX_PAYLOAD {
                format!("{{\"offset\":{offset},\"truncated\":true}}")
            } else {
                payload
            };
            let n = Notification {
                pid: 0,
                channel: stream.name().to_string(),
                payload,
            };
            match tx.try_send(n) {
                Ok(()) => {}
                Err(mpsc::error::TrySendError::Full(_)) => return Err(Lag::Full(offset)),
                Err(mpsc::error::TrySendError::Closed(_)) => return Err(Lag::Closed),
            }
        }
    }
    Ok(to)
}

/// Each row of a batch as a JSON object (column name → value).
pub fn row_payloads(batch: &RecordBatch) -> Result<Vec<String>, String> {
    let mut buf = Vec::new();
    {
        let mut w = arrow::json::WriterBuilder::new()
            .with_explicit_nulls(true)
            .build::<_, arrow::json::writer::LineDelimited>(&mut buf);
        w.write(batch).map_err(|e| e.to_string())?;
        w.finish().map_err(|e| e.to_string())?;
    }
    let text = String::from_utf8(buf).map_err(|e| e.to_string())?;
    Ok(text.lines().map(|l| l.to_string()).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn full_queues_drop_only_for_that_listener() {
        let hub = Hub::default();
        let (tx1, mut rx1) = mpsc::channel(1);
        let (tx2, mut rx2) = mpsc::channel(8);
        hub.subscribe("c", 1, tx1);
        hub.subscribe("c", 2, tx2);
        for i in 0..3 {
            hub.publish(&Notification {
                pid: 9,
                channel: "c".into(),
                payload: i.to_string(),
            });
        }
        assert_eq!(rx1.try_recv().unwrap().payload, "0");
        assert!(rx1.try_recv().is_err());
        let got: Vec<String> = std::iter::from_fn(|| rx2.try_recv().ok())
            .map(|n| n.payload)
            .collect();
        assert_eq!(got, vec!["0", "1", "2"]);
        hub.unsubscribe_all(2);
        hub.publish(&Notification {
            pid: 9,
            channel: "c".into(),
            payload: "x".into(),
        });
        assert!(rx2.try_recv().is_err());
    }
}
