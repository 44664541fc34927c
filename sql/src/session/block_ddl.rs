//! DDL inside a transaction block: its ops join the block's writes and commit with them in
//! one command, all or nothing; ROLLBACK (or ROLLBACK TO) forgets them.
//!
//! Each statement is checked now against the block's view of the names (the shared catalog
//! under what the block already did: [`crate::block_catalog`]), so a clash, a missing name,
//! the wrong kind or a view in the way fails the statement, as in PostgreSQL; then its ops
//! are recorded there so the block's next statements see them. The state machine checks
//! every op again at COMMIT against the catalog as it is then (another session may have
//! taken a name meanwhile: the whole block fails). A view the block created cannot be
//! replaced in the same block (0A000): the state machine checks a replacement against the
//! committed view.

use prost::Message as _;

use super::transaction::Txn;
use super::Session;
use crate::block_catalog::Local;
use crate::command::{op, AlterStream, DropRelation, Op};
use crate::definition::CONSUMER_OFFSETS;
use crate::error::{sqlstate, Error, Result};
use crate::views;

impl Session {
    /// Add DDL ops to the open block (see the module comment).
    pub(super) fn buffer_ddl(&mut self, ops: Vec<Op>) -> Result<()> {
        let dropped_together: Vec<String> = ops
            .iter()
            .filter_map(|o| match &o.kind {
                Some(op::Kind::DropRelation(d)) => Some(d.name.clone()),
                _ => None,
            })
            .collect();
        let max = self.engine.limits.max_statement_bytes;
        for o in ops {
            if !self.ddl_needed(&o, &dropped_together)? {
                continue;
            }
            let Txn::Block(b) = &mut self.txn else {
                return Err(Error::internal("DDL buffered outside a block"));
            };
            let size = o.encoded_len();
            if b.bytes + size > max {
                return Err(Error::new(
                    sqlstate::PROGRAM_LIMIT_EXCEEDED,
                    format!(
                        "transaction block exceeds the maximum of {max} bytes of writes (max_statement_bytes)"
                    ),
                ));
            }
            self.block.record(b.ops.len(), &o, &self.engine.catalog)?;
            b.bytes += size;
            b.ops.push(o);
        }
        Ok(())
    }

    /// Whether the op changes anything (`IF [NOT] EXISTS` may make it a no-op), or the
    /// statement's error.
    fn ddl_needed(&self, o: &Op, dropped_together: &[String]) -> Result<bool> {
        let catalog = &self.engine.catalog;
        let exists = |n: &str| self.block.exists(n, catalog);
        match &o.kind {
            Some(op::Kind::CreateTable(c)) => created(exists(&c.name), &c.name, c.if_not_exists),
            Some(op::Kind::CreateStream(c)) => created(exists(&c.name), &c.name, c.if_not_exists),
            Some(op::Kind::CreateView(c)) => {
                if !exists(&c.name) {
                    return Ok(true);
                }
                if !c.or_replace {
                    return created(true, &c.name, false);
                }
                match self.block.lookup(&c.name) {
                    Some(Some(Local::View(_))) => Err(Error::unsupported(format!(
                        "view \"{}\" was created in this transaction block: it can be replaced once the block commits",
                        c.name
                    ))),
                    _ if self.block.view(&c.name, catalog).is_none() => Err(Error::new(
                        sqlstate::WRONG_OBJECT_TYPE,
                        format!("\"{}\" is not a view", c.name),
                    )),
                    _ => Ok(true),
                }
            }
            Some(op::Kind::DropRelation(d)) => {
                if !exists(&d.name) {
                    return if d.if_exists {
                        Ok(false)
                    } else {
                        Err(Error::undefined_table(&d.name))
                    };
                }
                self.check_drop(d, dropped_together)?;
                Ok(true)
            }
            Some(op::Kind::AlterStream(a)) => {
                self.check_alter(a)?;
                Ok(true)
            }
            _ => Ok(true),
        }
    }

    /// The right kind (DROP VIEW of a view, DROP STREAM/TABLE of anything else) and, without
    /// CASCADE, no view over it that the statement does not drop too (2BP01).
    fn check_drop(&self, d: &DropRelation, dropped_together: &[String]) -> Result<()> {
        if d.name == CONSUMER_OFFSETS {
            return Err(Error::new(
                sqlstate::INSUFFICIENT_PRIVILEGE,
                format!("permission denied: \"{CONSUMER_OFFSETS}\" is a system table"),
            ));
        }
        let catalog = &self.engine.catalog;
        let is_view = self.block.view(&d.name, catalog).is_some();
        if d.view != is_view {
            return Err(views::wrong_drop_kind(&d.name, d.view));
        }
        if d.cascade {
            return Ok(());
        }
        let blocking = self
            .block
            .dependents(&d.name, catalog)
            .into_iter()
            .find(|v| !dropped_together.contains(v));
        let Some(v) = blocking else {
            return Ok(());
        };
        let kind = if is_view {
            "view"
        } else if self.block.stream(&d.name, catalog).is_some() {
            "stream"
        } else {
            "table"
        };
        Err(views::drop_blocked(&format!("{kind} {}", d.name), &v))
    }

    /// A rename, or a column added or renamed, while views read the stream (2BP01).
    fn check_alter(&self, a: &AlterStream) -> Result<()> {
        if !views::alter_renames(a) {
            return Ok(());
        }
        match self.block.dependents(&a.name, &self.engine.catalog).first() {
            None => Ok(()),
            Some(v) => Err(views::alter_blocked(&a.name, v)),
        }
    }
}

/// A CREATE of a name that `exists`: skipped under `IF NOT EXISTS`, else 42P07.
fn created(exists: bool, name: &str, if_not_exists: bool) -> Result<bool> {
    match (exists, if_not_exists) {
        (false, _) => Ok(true),
        (true, true) => Ok(false),
        (true, false) => Err(Error::new(
            sqlstate::DUPLICATE_TABLE,
            format!("relation \"{name}\" already exists"),
        )),
    }
}
