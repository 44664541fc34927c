//! LISTEN / NOTIFY: channels between sessions, and stream listeners.
//!
//! Every listening session has a [`Dispatcher`] task and one bounded queue
//! to its client. `NOTIFY` (and `pg_notify`) offers a notification to each
//! listener's dispatcher without waiting: a full inbox drops it for that
//! listener only, so a client that stops reading never slows anyone else.
//! `LISTEN s` on a stream makes the dispatcher turn each committed row into
//! a JSON notification; when the client's queue is full it waits for room,
//! sends one `{"lagged":true,"resume_from":N}` notification (N = first row
//! not delivered) and carries on from the stream's end. The dispatcher
//! stops when the session ends.

use std::collections::HashMap;
use std::sync::Arc;

use arrow::array::RecordBatch;
use parking_lot::Mutex;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use crate::catalog::{Catalog, Current, Stream};
use crate::stream_provider::read_frame;

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
    /// For a NOTIFY: every stream's next offset when it was committed, so a
    /// listener delivers exactly the rows committed before it, first.
    pub watermark: Option<Arc<Vec<(u64, u64)>>>,
}

/// Every stream's next offset now: the commit point of a notification.
pub fn watermark(catalog: &Catalog) -> Arc<Vec<(u64, u64)>> {
    Arc::new(
        catalog
            .list()
            .iter()
            .map(|s| (s.def.id, s.log.next_offset()))
            .collect(),
    )
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

/// What a session asks of its dispatcher.
#[derive(Debug)]
pub enum Control {
    /// Start sending a notification per committed row of this stream.
    /// Follow a stream from `from`: the stream's next offset when LISTEN ran, so that a
    /// row committed after LISTEN returned is sent even if it commits before the
    /// dispatcher reads this (it used to take the position then, and skip such rows).
    Follow {
        stream: Arc<Stream>,
        from: u64,
    },
    Unfollow(String),
}

/// A session's notification dispatcher: the single writer of the session's
/// queue, so notifications reach the client in commit order. Before it
/// forwards a channel notification it first catches every followed stream
/// up to its current end: rows committed before a NOTIFY are delivered
/// before it, as in PostgreSQL.
#[derive(Debug)]
pub struct Dispatcher {
    /// Given to the hub for channel notifications (bounded; full = dropped).
    pub inbox: mpsc::Sender<Notification>,
    control: mpsc::Sender<Control>,
    task: JoinHandle<()>,
}

impl Dispatcher {
    pub fn start(catalog: Arc<Catalog>, out: mpsc::Sender<Notification>) -> Dispatcher {
        let (inbox, inbox_rx) = mpsc::channel(QUEUE_CAPACITY);
        let (control, control_rx) = mpsc::channel(64);
        let task = tokio::spawn(run(catalog, inbox_rx, control_rx, out));
        Dispatcher {
            inbox,
            control,
            task,
        }
    }

    /// Never blocks: a full control queue is a session doing thousands of
    /// LISTENs at once; the command is dropped with a warning.
    pub fn control(&self, c: Control) {
        if self.control.try_send(c).is_err() {
            tracing::warn!("notification dispatcher busy; LISTEN/UNLISTEN of a stream dropped");
        }
    }
}

impl Drop for Dispatcher {
    fn drop(&mut self) {
        self.task.abort();
    }
}

struct Follower {
    stream: Arc<Stream>,
    pos: u64,
    advanced: tokio::sync::watch::Receiver<u64>,
}

async fn run(
    catalog: Arc<Catalog>,
    mut inbox: mpsc::Receiver<Notification>,
    mut control: mpsc::Receiver<Control>,
    out: mpsc::Sender<Notification>,
) {
    let mut followers: HashMap<String, Follower> = HashMap::new();
    loop {
        // wake when any followed stream advances (or every second, to notice drops)
        let advanced = async {
            if followers.is_empty() {
                return futures::future::pending::<()>().await;
            }
            let waits = followers
                .values_mut()
                .map(|f| Box::pin(f.advanced.changed()));
            let _ = tokio::time::timeout(
                std::time::Duration::from_secs(1),
                futures::future::select_all(waits),
            )
            .await;
        };
        tokio::select! {
            // notifications first: one queued before a row committed goes out
            // before the catch-up that would deliver that row
            biased;
            n = inbox.recv() => {
                let Some(n) = n else { return };
                let watermark = n.watermark.clone();
                if !catch_up(&catalog, &mut followers, &out, watermark.as_deref().map(|w| w.as_slice())).await
                    || out.send(n).await.is_err()
                {
                    return;
                }
            }
            c = control.recv() => match c {
                None => return,
                Some(Control::Follow { stream, from }) => {
                    let advanced = stream.subscribe();
                    let pos = from;
                    followers.insert(stream.name().to_string(), Follower { stream, pos, advanced });
                }
                Some(Control::Unfollow(name)) => {
                    followers.remove(&name);
                }
            },
            _ = advanced => {
                if !catch_up(&catalog, &mut followers, &out, None).await {
                    return;
                }
            }
        }
    }
}

/// Deliver every followed stream's rows up to its current end. False when
/// the client is gone.
async fn catch_up(
    catalog: &Catalog,
    followers: &mut HashMap<String, Follower>,
    out: &mpsc::Sender<Notification>,
    watermark: Option<&[(u64, u64)]>,
) -> bool {
    // A snapshot install replaces every stream handle: follow the new one from the same
    // position; while it runs, wait (the follower is woken again when it ends).
    if catalog.restoring() {
        return true;
    }
    followers.retain(|_, f| match catalog.current(&f.stream) {
        Current::Stream(s) => {
            if !Arc::ptr_eq(&s, &f.stream) {
                f.advanced = s.subscribe();
                f.stream = s;
            }
            true
        }
        Current::Restoring | Current::Gone => false,
    });
    for f in followers.values_mut() {
        let mut end = f.stream.log.next_offset();
        if let Some(w) = watermark {
            let id = f.stream.def.id;
            end = end.min(
                w.iter()
                    .find(|(s, _)| *s == id)
                    .map(|(_, n)| *n)
                    .unwrap_or(f.pos),
            );
        }
        if f.pos >= end {
            continue;
        }
        match deliver(&f.stream, f.pos, end, out) {
            Ok(next) => f.pos = next,
            Err(Lag::Full(resume_from)) => {
                // wait for room, then say where to resume; skip to the end
                let Ok(permit) = out.reserve().await else {
                    return false;
                };
                permit.send(Notification {
                    pid: 0,
                    channel: f.stream.name().to_string(),
                    payload: format!("{{\"lagged\":true,\"resume_from\":{resume_from}}}"),
                    watermark: None,
                });
                f.pos = f.stream.log.next_offset();
            }
            Err(Lag::Closed) => return false,
            Err(Lag::Failed(e)) => {
                tracing::warn!(stream = %f.stream.name(), "stream listener skipped rows: {e}");
                f.pos = end;
            }
        }
    }
    true
}

enum Lag {
    Full(u64),
    Closed,
    Failed(String),
}

/// Send rows [from, to) without waiting; returns the next position.
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
                watermark: None,
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
                watermark: None,
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
            watermark: None,
        });
        assert!(rx2.try_recv().is_err());
    }
}
