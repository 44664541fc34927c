//! Cursors and tails of a session: `COPY ... TO STDOUT`, `DECLARE` /
//! `FETCH` / `CLOSE`, and row-limited portals of the extended protocol.
//! A cursor over a tailable query is a [`Tail`]; any other is a snapshot
//! stream read as far as each FETCH asks.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use arrow::array::RecordBatch;
use arrow::datatypes::SchemaRef;
use datafusion::execution::SendableRecordBatchStream;
use datafusion::scalar::ScalarValue;
use futures::StreamExt;
use sqlparser::ast::Statement;

use super::transaction::{no_transaction, Txn};
use super::{batches_stream, Output, Session, TxnStatus};
use crate::error::{sqlstate, Error, Result};
use crate::interrupt::CancelWatch;
use crate::statement::{sqlparser, CopyFormat, Parsed};
use crate::tail::{self, Tail};

pub(super) enum Cursor {
    Tail(Box<Tail>),
    /// The stream sits in a mutex only to make the session `Sync`; it is
    /// reached through `get_mut`, never locked.
    Snapshot {
        schema: SchemaRef,
        stream: parking_lot::Mutex<SendableRecordBatchStream>,
        buffered: VecDeque<RecordBatch>,
    },
}

pub(super) struct CursorEntry {
    pub(super) cursor: Cursor,
    pub(super) hold: bool,
}

/// Most row-limited tail portals one session keeps open.
pub(super) const MAX_PORTAL_TAILS: usize = 64;

pub(super) fn no_cursor(name: &str) -> Error {
    Error::new(
        sqlstate::INVALID_CURSOR_NAME,
        format!("cursor \"{name}\" does not exist"),
    )
}

/// Rows available now (up to `max`); if none, wait up to `wait` for one.
pub(super) async fn fetch_tail(
    tail: &mut Tail,
    max: usize,
    wait: Duration,
    cancel: &mut CancelWatch,
) -> Result<Vec<RecordBatch>> {
    let rows = tail.poll(max).await?;
    if !rows.is_empty() || tail.finished() {
        return Ok(rows);
    }
    if tail.wait(Some(wait), cancel).await? {
        tail.poll(max).await
    } else {
        Ok(vec![])
    }
}

impl Session {
    /// How long a FETCH on a tail waits for a row when none is there.
    fn tail_wait(&self) -> Duration {
        let text = self.setting("tail_wait").unwrap_or_else(|| "10s".into());
        Duration::from_millis(crate::units::parse_duration_ms(&text).unwrap_or(10_000))
    }

    async fn start_tail(&self, spec: tail::TailSpec, params: &[ScalarValue]) -> Result<Tail> {
        Tail::start(
            self.engine.catalog.clone(),
            self.ctx.clone(),
            spec,
            params.to_vec(),
            self.status() == TxnStatus::Idle,
        )
        .await
    }

    pub(super) async fn copy_to(
        &mut self,
        query: &sqlparser::ast::Query,
        format: CopyFormat,
        params: &[ScalarValue],
    ) -> Result<Output> {
        if let Some(spec) = tail::tail_spec(query, params) {
            let tail = self.start_tail(spec, params).await?;
            let schema = tail.schema();
            return Ok(Output::CopyOut {
                schema,
                format,
                stream: tail.into_stream(self.cancel_watch()),
                live: true,
            });
        }
        match self
            .query(&Statement::Query(Box::new(query.clone())), params)
            .await?
        {
            Output::Rows { schema, stream, .. } => Ok(Output::CopyOut {
                schema,
                format,
                stream,
                live: false,
            }),
            _ => Err(Error::internal("COPY query produced no rows")),
        }
    }

    /// `DECLARE name [WITH HOLD] CURSOR FOR query`: only WITH HOLD
    /// outlives (or may start outside) a transaction block.
    pub(super) async fn declare(
        &mut self,
        name: &str,
        query: &sqlparser::ast::Query,
        hold: bool,
        params: &[ScalarValue],
    ) -> Result<Output> {
        if !hold && matches!(self.txn, Txn::Idle) {
            return Err(no_transaction("DECLARE CURSOR"));
        }
        if self.cursors.contains_key(name) {
            return Err(Error::new(
                sqlstate::DUPLICATE_CURSOR,
                format!("cursor \"{name}\" already exists"),
            ));
        }
        let cursor = Box::pin(self.open_cursor(query, params)).await?;
        self.cursors
            .insert(name.to_string(), CursorEntry { cursor, hold });
        Ok(Output::Tag("DECLARE CURSOR".into()))
    }

    /// `CLOSE name`, or `CLOSE ALL` (`None`).
    pub(super) fn close(&mut self, name: Option<&str>) -> Result<Output> {
        let Some(name) = name else {
            self.cursors.clear();
            return Ok(Output::Tag("CLOSE CURSOR ALL".into()));
        };
        match self.cursors.remove(name) {
            Some(_) => Ok(Output::Tag("CLOSE CURSOR".into())),
            None => Err(no_cursor(name)),
        }
    }

    async fn open_cursor(
        &mut self,
        query: &sqlparser::ast::Query,
        params: &[ScalarValue],
    ) -> Result<Cursor> {
        if let Some(spec) = tail::tail_spec(query, params) {
            let tail = self.start_tail(spec, params).await?;
            return Ok(Cursor::Tail(Box::new(tail)));
        }
        match self
            .query(&Statement::Query(Box::new(query.clone())), params)
            .await?
        {
            Output::Rows { schema, stream, .. } => Ok(Cursor::Snapshot {
                schema,
                stream: parking_lot::Mutex::new(stream),
                buffered: VecDeque::new(),
            }),
            _ => Err(Error::internal("cursor query produced no rows")),
        }
    }

    pub(super) async fn fetch(&mut self, name: &str, count: Option<u64>) -> Result<Output> {
        let wait = self.tail_wait();
        let mut cancel = self.cancel_watch();
        let entry = self.cursors.get_mut(name).ok_or_else(|| no_cursor(name))?;
        let max = count
            .map(|c| c.min(usize::MAX as u64) as usize)
            .unwrap_or(usize::MAX);
        let (schema, batches) = match &mut entry.cursor {
            Cursor::Tail(tail) => (
                tail.schema(),
                fetch_tail(tail, max, wait, &mut cancel).await?,
            ),
            Cursor::Snapshot {
                schema,
                stream,
                buffered,
            } => {
                let mut out = Vec::new();
                let mut want = max;
                while want > 0 {
                    let batch = match buffered.pop_front() {
                        Some(b) => b,
                        None => match stream.get_mut().next().await {
                            Some(Ok(b)) => b,
                            Some(Err(e)) => {
                                // a failed plan is done: drop it now, with the memory its
                                // operators reserved, as PostgreSQL drops a failed portal
                                self.cursors.remove(name);
                                return Err(e.into());
                            }
                            None => break,
                        },
                    };
                    let take = batch.num_rows().min(want);
                    if take < batch.num_rows() {
                        buffered.push_front(batch.slice(take, batch.num_rows() - take));
                    }
                    want -= take;
                    out.push(batch.slice(0, take));
                }
                (schema.clone(), out)
            }
        };
        Ok(Output::Rows {
            schema: schema.clone(),
            stream: batches_stream(schema, batches),
            tag: "FETCH".into(),
        })
    }

    /// Execute with a row limit on a tailable query (extended protocol):
    /// like FETCH on a cursor kept per portal. `None` if the statement is
    /// not a tailable query, so the caller runs it normally. The flag says
    /// whether the portal is suspended (more may come) or complete. Cancel
    /// and `statement_timeout` stop it as they stop any statement.
    pub async fn portal_fetch(
        &mut self,
        portal: &PortalKey,
        p: &Parsed,
        params: &[ScalarValue],
        max_rows: usize,
    ) -> Result<Option<(SchemaRef, Vec<RecordBatch>, bool)>> {
        self.sync_settings();
        let mut interrupt = self.interrupt();
        let r = tokio::select! {
            biased;
            r = self.portal_fetch_inner(portal, p, params, max_rows) => r,
            e = interrupt.fired() => Err(e),
        };
        r.map_err(|e| self.fail_block(e))
    }

    async fn portal_fetch_inner(
        &mut self,
        portal: &PortalKey,
        p: &Parsed,
        params: &[ScalarValue],
        max_rows: usize,
    ) -> Result<Option<(SchemaRef, Vec<RecordBatch>, bool)>> {
        if matches!(self.txn, Txn::Failed(_)) {
            return Err(Error::new(
                sqlstate::IN_FAILED_TRANSACTION,
                "current transaction is aborted, commands ignored until end of transaction block",
            ));
        }
        let Parsed::Query(stmt) = p else {
            return Ok(None);
        };
        let Statement::Query(q) = stmt.as_ref() else {
            return Ok(None);
        };
        if !self.portal_tails.contains_key(&portal.addr) {
            let Some(spec) = tail::tail_spec(q, params) else {
                return Ok(None);
            };
            let tail = self.start_tail(spec, params).await;
            let tail = tail.map_err(|e| self.fail_block(e))?;
            // the tails of portals the client has closed go
            self.portal_tails
                .retain(|_, (alive, _)| alive.strong_count() > 0);
            if self.portal_tails.len() >= MAX_PORTAL_TAILS {
                self.portal_tails.clear();
            }
            self.portal_tails
                .insert(portal.addr, (portal.alive.clone(), tail));
        }
        let wait = self.tail_wait();
        let mut cancel = self.cancel_watch();
        let Some((_, tail)) = self.portal_tails.get_mut(&portal.addr) else {
            return Ok(None);
        };
        let batches = fetch_tail(tail, max_rows.max(1), wait, &mut cancel).await;
        let schema = tail.schema();
        let more = !tail.finished();
        let batches = batches.map_err(|e| self.fail_block(e))?;
        Ok(Some((schema, batches, more)))
    }

    /// Columns of an open SQL cursor (for Describe of a portal by that name).
    pub fn cursor_schema(&self, name: &str) -> Option<SchemaRef> {
        self.cursors.get(name).map(|c| match &c.cursor {
            Cursor::Tail(t) => t.schema(),
            Cursor::Snapshot { schema, .. } => schema.clone(),
        })
    }
}

/// A protocol portal as the session knows it: the address of its state, and a weak handle to
/// that state. The handle keeps the address from being reused while the session remembers
/// the portal (a new portal at a closed one's address would otherwise continue its tail) and
/// tells when the client has closed it.
pub struct PortalKey {
    addr: usize,
    alive: std::sync::Weak<dyn std::any::Any + Send + Sync>,
}

impl PortalKey {
    pub fn of<T: Send + Sync + 'static>(state: &Arc<T>) -> PortalKey {
        let weak: std::sync::Weak<T> = Arc::downgrade(state);
        PortalKey {
            addr: Arc::as_ptr(state) as *const () as usize,
            alive: weak,
        }
    }
}
