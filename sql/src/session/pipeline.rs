//! Implicit transactions: statements a client sends together — pipelined
//! between two Syncs of the extended protocol (pgx `Batch`, JDBC
//! `executeBatch`, asyncpg `executemany`), or several in one simple Query —
//! commit together or not at all, as in PostgreSQL.
//!
//! The wire layer opens the implicit block ([`Session::begin_implicit`])
//! when a write is followed by more of the pipeline, and ends it at Sync
//! ([`Session::end_implicit`]); one statement alone keeps the direct path.
//! Inside it writes are buffered like an explicit block's. `BEGIN` turns it
//! into an explicit block, `COMMIT` commits it early.
//!
//! A stream INSERT's `RETURNING` cannot be answered before the commit
//! assigns offsets: inside an implicit block it answers
//! [`Output::Deferred`] and its rows are kept here ([`PendingReturning`]).
//! When the block ends they are settled with what the commit assigned, or
//! with `offset`/`ts` NULL when it did not commit, and the wire layer sends
//! them in their place ([`Session::take_returning`]).
//!
//! Invariants: a pending RETURNING is settled exactly once, by the end of
//! the block that buffered its op (commit, rollback, failure, or ROLLBACK TO
//! a savepoint taken before it); pending rows are bounded by the block's
//! write limit (`max_statement_bytes`), as their ops are.

use std::sync::Arc;

use crate::statement::sqlparser::ast::SelectItem;
use arrow::array::RecordBatch;

use super::append::{returning_rows, Appended};
use super::transaction::{Block, Txn};
use super::{dml, Output, Session};
use crate::catalog::Stream;
use crate::command::OpOutcome;
use crate::error::{sqlstate, Error, Result};
use crate::statement::Parsed;

/// The RETURNING of a stream INSERT inside an implicit block, waiting for
/// the block to end.
#[derive(Debug)]
pub(super) struct PendingReturning {
    /// The INSERT's op in its block.
    op: usize,
    stream: Arc<Stream>,
    batch: RecordBatch,
    items: Vec<SelectItem>,
    state: Settled,
}

#[derive(Debug)]
enum Settled {
    Waiting,
    Committed(Appended),
    NotCommitted,
}

impl Session {
    /// Whether `p`, run outside any block with more of the pipeline after
    /// it, opens an implicit block: a write that a block can hold (INSERT,
    /// UPDATE, a table's DELETE, DDL but ALTER CLUSTER and roles; not a
    /// stream's prefix DELETE, which never runs in a block).
    pub fn opens_implicit(&self, p: &Parsed) -> bool {
        if !matches!(self.txn, Txn::Idle) {
            return false;
        }
        match p {
            Parsed::Insert(_)
            | Parsed::Update(_)
            | Parsed::CreateTable { .. }
            | Parsed::CreateStream { .. }
            | Parsed::CreateView { .. }
            | Parsed::CreateIndex { .. }
            | Parsed::DropIndex { .. }
            | Parsed::DropRelation { .. }
            | Parsed::AlterStream { .. } => true,
            Parsed::Delete(d) => {
                dml::delete_target(d).is_ok_and(|(name, ..)| self.table(&name).is_some())
            }
            _ => false,
        }
    }

    /// Open the implicit block of a pipeline (outside any block only).
    pub fn begin_implicit(&mut self) {
        if matches!(self.txn, Txn::Idle) {
            self.start_block(self.read_only());
            if let Txn::Block(b) = &mut self.txn {
                b.implicit = true;
            }
        }
    }

    /// Whether an implicit block is open (or failed and not yet ended).
    pub fn in_implicit(&self) -> bool {
        matches!(&self.txn, Txn::Block(b) | Txn::Failed(b) if b.implicit)
    }

    /// End the implicit block: commit it, or roll it back if a statement
    /// failed. The error is the commit's (the block did not commit).
    pub async fn end_implicit(&mut self) -> Result<()> {
        match &self.txn {
            Txn::Block(b) if b.implicit => self.commit().await.map(|_| ()),
            Txn::Failed(b) if b.implicit => self.rollback().map(|_| ()),
            _ => Ok(()),
        }
    }

    /// The rows of the deferred RETURNINGs from the `from`-th on, in the
    /// order they were deferred; the blocks that held them have ended.
    pub async fn take_returning(&mut self, from: usize) -> Result<Vec<Output>> {
        let pending: Vec<PendingReturning> = self
            .pending_returning
            .drain(from.min(self.pending_returning.len())..)
            .collect();
        let mut out = Vec::with_capacity(pending.len());
        for p in pending {
            let appended = match p.state {
                Settled::Committed(a) => Some(a),
                Settled::NotCommitted | Settled::Waiting => None,
            };
            out.push(
                Box::pin(returning_rows(
                    &p.stream,
                    &p.batch,
                    &p.items,
                    appended.as_ref(),
                ))
                .await?,
            );
        }
        Ok(out)
    }

    /// How many RETURNINGs are deferred (a position for [`Session::take_returning`]).
    pub fn deferred_returning(&self) -> usize {
        self.pending_returning.len()
    }

    /// A stream INSERT's RETURNING inside a block: deferred to the end of
    /// an implicit block; refused in an explicit one (the client waits for
    /// the rows before it sends COMMIT).
    pub(super) fn defer_returning(
        &mut self,
        stream: Arc<Stream>,
        batch: RecordBatch,
        items: &[SelectItem],
    ) -> Result<Output> {
        let op = match &self.txn {
            Txn::Block(b) if b.implicit => b.ops.len().saturating_sub(1),
            _ => {
                return Err(Error::internal(
                    "RETURNING deferred outside a pipeline's implicit block",
                ))
            }
        };
        self.pending_returning.push(PendingReturning {
            op,
            stream,
            batch,
            items: items.to_vec(),
            state: Settled::Waiting,
        });
        Ok(Output::Deferred)
    }

    /// The block ended: its waiting RETURNINGs get what the commit assigned
    /// (`outcomes`, one per op of the block) or nothing.
    pub(super) fn settle_returning(&mut self, outcomes: Option<&[OpOutcome]>) {
        for p in &mut self.pending_returning {
            if !matches!(p.state, Settled::Waiting) {
                continue;
            }
            p.state = match outcomes.and_then(|o| o.get(p.op)) {
                Some(OpOutcome::Appended {
                    base_offset,
                    ts_micros,
                    rows,
                    row_offsets,
                    ..
                }) => Settled::Committed(Appended {
                    base_offset: *base_offset,
                    ts_micros: *ts_micros,
                    rows: *rows,
                    row_offsets: row_offsets.clone(),
                }),
                _ => Settled::NotCommitted,
            };
        }
    }

    /// ROLLBACK TO kept the first `ops` ops: RETURNINGs of the ops it
    /// dropped will never commit.
    pub(super) fn drop_returning_after(&mut self, ops: usize) {
        for p in &mut self.pending_returning {
            if matches!(p.state, Settled::Waiting) && p.op >= ops {
                p.state = Settled::NotCommitted;
            }
        }
    }

    /// BEGIN inside an implicit block makes it explicit, unless RETURNING
    /// rows wait for its end (they must be sent at the pipeline's Sync).
    pub(super) fn make_explicit(&mut self) -> Result<()> {
        let waiting = self
            .pending_returning
            .iter()
            .any(|p| matches!(p.state, Settled::Waiting));
        match &mut self.txn {
            Txn::Block(Block { implicit, .. }) if *implicit => {
                if waiting {
                    return Err(Error::new(
                        sqlstate::FEATURE_NOT_SUPPORTED,
                        "BEGIN after INSERT ... RETURNING on a stream in the same pipeline is not supported: the RETURNING rows need a commit before the pipeline's Sync",
                    ));
                }
                *implicit = false;
                Ok(())
            }
            _ => Ok(()),
        }
    }
}
