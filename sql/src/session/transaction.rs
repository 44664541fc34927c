//! The transaction block of a session: BEGIN, COMMIT, ROLLBACK, savepoints
//! and the read-only mode.
//!
//! A [`Block`] holds the writes buffered since BEGIN (bounded by
//! `max_statement_bytes`); COMMIT proposes them as one command with the
//! block's snapshot and reads, so they commit all or nothing, and ROLLBACK
//! drops them. A savepoint records how much of the block (writes, bytes,
//! pending notifications) ROLLBACK TO keeps. After an error the block is
//! [`Txn::Failed`]: COMMIT then rolls back. A read-only transaction refuses
//! every statement [`write_verb`] names with 25006.

use std::sync::atomic::Ordering;

use super::{Output, Session};
use crate::block_catalog::LOCAL_ID_BASE;
use crate::command::Op;
use crate::error::{sqlstate, Error, Result};
use crate::notify::{self, Notification};
use crate::statement::Parsed;

#[derive(Debug)]
pub(super) enum Txn {
    Idle,
    /// Inside BEGIN: writes are buffered until COMMIT.
    Block(Block),
    /// An error aborted the block; only ROLLBACK [TO SAVEPOINT] or COMMIT.
    Failed(Block),
}

#[derive(Debug, Default)]
pub(super) struct Block {
    pub(super) ops: Vec<Op>,
    pub(super) bytes: usize,
    savepoints: Vec<SavepointMark>,
    /// `BEGIN READ ONLY` (or `default_transaction_read_only` at BEGIN, or
    /// `SET TRANSACTION READ ONLY`): writes fail with 25006.
    pub(super) read_only: bool,
    /// A statement other than transaction control or a setting ran in the
    /// block: it can no longer become read-write.
    pub(super) used: bool,
    /// Opened by a pipeline, not BEGIN: it ends at the pipeline's Sync
    /// (see `pipeline`).
    pub(super) implicit: bool,
}

/// How much of the block (writes, pending notifications) a savepoint keeps.
#[derive(Debug)]
struct SavepointMark {
    name: String,
    ops: usize,
    bytes: usize,
    notifications: usize,
}

/// Position of the newest savepoint called `name` (3B001 if none).
fn savepoint_index(b: &Block, name: &str) -> Result<usize> {
    b.savepoints
        .iter()
        .rposition(|s| s.name == name)
        .ok_or_else(|| {
            Error::new(
                sqlstate::INVALID_SAVEPOINT,
                format!("savepoint \"{name}\" does not exist"),
            )
        })
}

pub(super) fn no_transaction(what: &str) -> Error {
    Error::new(
        sqlstate::NO_ACTIVE_SQL_TRANSACTION,
        format!("{what} can only be used in transaction blocks"),
    )
}

/// What a read-only transaction refuses, by the name its error gives.
fn write_verb(p: &Parsed) -> Option<&'static str> {
    Some(match p {
        Parsed::Insert(_) => "INSERT",
        Parsed::Update(_) => "UPDATE",
        Parsed::Delete(_) => "DELETE",
        Parsed::CopyFrom(_) => "COPY FROM",
        Parsed::CreateStream { .. } => "CREATE STREAM",
        Parsed::CreateTable { .. } => "CREATE TABLE",
        Parsed::DropRelation { view: true, .. } => "DROP VIEW",
        Parsed::DropRelation { stream: true, .. } => "DROP STREAM",
        Parsed::CreateView { .. } => "CREATE VIEW",
        Parsed::CreateIndex { .. } => "CREATE INDEX",
        Parsed::DropIndex { .. } => "DROP INDEX",
        Parsed::DropRelation { .. } => "DROP TABLE",
        Parsed::AlterCluster(_) => "ALTER CLUSTER",
        Parsed::AlterStream { stream: true, .. } => "ALTER STREAM",
        Parsed::AlterStream { .. } => "ALTER TABLE",
        Parsed::Roles(c) => c.tag(),
        _ => return None,
    })
}

impl Session {
    /// Before a statement runs in the transaction: a write in a read-only
    /// transaction fails (25006), and any statement but transaction
    /// control and settings marks an open block as used.
    pub(super) fn enter_statement(&mut self, p: &Parsed) -> Result<()> {
        if let Some(verb) = write_verb(p) {
            if self.read_only() {
                return Err(Error::new(
                    sqlstate::READ_ONLY_SQL_TRANSACTION,
                    format!("cannot execute {verb} in a read-only transaction"),
                ));
            }
        }
        if let Txn::Block(b) = &mut self.txn {
            b.used |= !matches!(
                p,
                Parsed::Begin { .. }
                    | Parsed::Set { .. }
                    | Parsed::Show(_)
                    | Parsed::Reset(_)
                    | Parsed::NoOp(_)
                    | Parsed::Prepare(_)
                    | Parsed::Deallocate(_)
                    | Parsed::Savepoint(_)
            );
        }
        Ok(())
    }

    /// Whether the current transaction refuses writes: the block's mode, or
    /// outside a block `default_transaction_read_only`.
    pub(super) fn read_only(&self) -> bool {
        match &self.txn {
            Txn::Block(b) | Txn::Failed(b) => b.read_only,
            Txn::Idle => self.default_read_only(),
        }
    }

    fn default_read_only(&self) -> bool {
        self.derived().default_read_only
    }

    /// A statement that may not run inside a block (DDL that cannot be
    /// undone, DISCARD ALL): 25001 there.
    pub(super) fn outside_block(&self, what: &str) -> Result<()> {
        if matches!(self.txn, Txn::Idle) {
            return Ok(());
        }
        Err(Error::new(
            sqlstate::ACTIVE_SQL_TRANSACTION,
            format!("{what} cannot run inside a transaction block"),
        ))
    }

    pub(super) fn begin(&mut self, read_only: Option<bool>) -> Result<Output> {
        match self.txn {
            Txn::Idle => self.start_block(read_only.unwrap_or_else(|| self.default_read_only())),
            _ if self.in_implicit() => self.make_explicit()?,
            _ => tracing::debug!("BEGIN inside a transaction block ignored"),
        }
        Ok(Output::Tag("BEGIN".into()))
    }

    /// A transaction starts or ends: its snapshot, reads, own writes and DDL are forgotten.
    pub(super) fn reset_txn_views(&mut self) {
        self.tables.reset();
        self.block.reset();
    }

    /// Open a block (explicit; `pipeline` marks the implicit ones).
    pub(super) fn start_block(&mut self, read_only: bool) {
        self.reset_txn_views();
        self.txn = Txn::Block(Block {
            read_only,
            ..Block::default()
        });
        self.notify.in_block.store(true, Ordering::Release);
    }

    pub(super) async fn commit(&mut self) -> Result<Output> {
        match std::mem::replace(&mut self.txn, Txn::Idle) {
            Txn::Block(Block { ops, .. }) => {
                let wrote = !ops.is_empty();
                // a block that only read needs no validation: it saw
                // one snapshot
                let result = if ops.is_empty() {
                    Ok(vec![])
                } else {
                    let snapshot = self.tables.snapshot_index();
                    // a table the block created has nothing to conflict with yet
                    let mut reads = self.tables.reads();
                    reads.retain(|r| r.table_id < LOCAL_ID_BASE);
                    self.propose(ops, snapshot, reads).await
                };
                if let Ok(outcomes) = &result {
                    self.settle_returning(Some(outcomes));
                }
                self.reset_txn_views();
                self.end_block(result.is_ok());
                if wrote {
                    self.last_appends.set(result.as_deref().ok());
                }
                result.map(|_| Output::Tag("COMMIT".into()))
            }
            Txn::Failed(b) => {
                if !b.ops.is_empty() {
                    self.last_appends.set(None);
                }
                self.reset_txn_views();
                self.end_block(false);
                Ok(Output::Tag("ROLLBACK".into()))
            }
            Txn::Idle => Ok(Output::Tag("COMMIT".into())),
        }
    }

    pub(super) fn rollback(&mut self) -> Result<Output> {
        if let Txn::Block(b) | Txn::Failed(b) = &self.txn {
            if !b.ops.is_empty() {
                self.last_appends.set(None);
            }
        }
        self.txn = Txn::Idle;
        self.reset_txn_views();
        self.end_block(false);
        Ok(Output::Tag("ROLLBACK".into()))
    }

    pub(super) fn savepoint(&mut self, name: &str) -> Result<Output> {
        let notifications = self.notify.pending.lock().len();
        let Txn::Block(b) = &mut self.txn else {
            return Err(no_transaction("SAVEPOINT"));
        };
        b.savepoints.push(SavepointMark {
            name: name.to_string(),
            ops: b.ops.len(),
            bytes: b.bytes,
            notifications,
        });
        Ok(Output::Tag("SAVEPOINT".into()))
    }

    pub(super) fn release_savepoint(&mut self, name: &str) -> Result<Output> {
        let Txn::Block(b) = &mut self.txn else {
            return Err(no_transaction("RELEASE SAVEPOINT"));
        };
        let at = savepoint_index(b, name)?;
        b.savepoints.truncate(at);
        Ok(Output::Tag("RELEASE".into()))
    }

    /// Back to the savepoint: the block keeps what it held then (and is
    /// usable again if it had failed); an unknown name fails the block.
    pub(super) fn rollback_to(&mut self, name: &str) -> Result<Output> {
        let mut b = match std::mem::replace(&mut self.txn, Txn::Idle) {
            Txn::Block(b) | Txn::Failed(b) => b,
            Txn::Idle => return Err(no_transaction("ROLLBACK TO SAVEPOINT")),
        };
        let at = match savepoint_index(&b, name) {
            Ok(at) => at,
            Err(e) => {
                self.txn = Txn::Failed(b);
                return Err(e);
            }
        };
        let mark = &b.savepoints[at];
        let (ops, bytes, notifications) = (mark.ops, mark.bytes, mark.notifications);
        b.ops.truncate(ops);
        b.bytes = bytes;
        self.drop_returning_after(ops);
        b.savepoints.truncate(at + 1);
        let rebuilt = self
            .tables
            .rebuild_overlay(&b.ops)
            .and_then(|()| self.block.rebuild(&b.ops, &self.engine.catalog));
        if let Err(e) = rebuilt {
            self.txn = Txn::Failed(b);
            return Err(e);
        }
        self.notify.pending.lock().truncate(notifications);
        self.txn = Txn::Block(b);
        Ok(Output::Tag("ROLLBACK".into()))
    }

    /// The block ended: its notifications go out if it committed, and
    /// cursors not declared WITH HOLD close.
    pub(super) fn end_block(&mut self, committed: bool) {
        self.settle_returning(None);
        self.notify.in_block.store(false, Ordering::Release);
        let pending = std::mem::take(&mut *self.notify.pending.lock());
        if committed && !pending.is_empty() {
            let watermark = notify::watermark(&self.engine.catalog);
            for n in pending {
                self.engine.hub.publish(&Notification {
                    watermark: Some(watermark.clone()),
                    ..n
                });
            }
        }
        self.cursors.retain(|_, c| c.hold);
        self.portal_tails.clear();
    }

    /// Record a failure (in `execute`, or outside it such as at Parse):
    /// inside a block the block is now aborted.
    pub fn fail_block(&mut self, e: Error) -> Error {
        self.abort_block();
        e
    }

    /// A statement failed after `execute` returned (while its rows were
    /// sent: a cancel, a timeout, an error in the plan): inside a block the
    /// block is now aborted, as in PostgreSQL.
    pub fn abort_block(&mut self) {
        self.txn = match std::mem::replace(&mut self.txn, Txn::Idle) {
            Txn::Block(b) => Txn::Failed(b),
            other => other,
        };
    }
}
