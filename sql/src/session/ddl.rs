//! DDL of a session: CREATE and DROP of streams and tables, and ALTER
//! CLUSTER.
//!
//! Each statement is one proposed command that runs at once, even inside a
//! transaction block (it is not part of the block and ROLLBACK does not
//! undo it; see docs/architecture.md). A definition travels as JSON; where
//! the command applies, each node gives the relation the same id and OID
//! and finds the same name clash (42P07). ALTER CLUSTER changes Raft
//! membership and refuses to run inside a block.

use serde::Serialize;

use super::transaction::Txn;
use super::{Output, Session};
use crate::command::{op, AlterStream, CreateStream, CreateTable, DropRelation, Op};
use crate::definition::{StreamDef, TableDef};
use crate::error::{sqlstate, Error, Result};
use crate::statement::StreamChange;

impl Session {
    pub(super) async fn create_table(
        &mut self,
        def: &TableDef,
        if_not_exists: bool,
    ) -> Result<Output> {
        let kind = op::Kind::CreateTable(CreateTable {
            name: def.name.clone(),
            definition_json: definition_json(def)?,
            if_not_exists,
            owner: self.owner_name(),
        });
        self.run_ddl(vec![kind], "CREATE TABLE").await
    }

    pub(super) async fn create_stream(
        &mut self,
        def: &StreamDef,
        if_not_exists: bool,
    ) -> Result<Output> {
        let kind = op::Kind::CreateStream(CreateStream {
            name: def.name.clone(),
            definition_json: definition_json(def)?,
            if_not_exists,
            owner: self.owner_name(),
        });
        self.run_ddl(vec![kind], "CREATE STREAM").await
    }

    /// `DROP STREAM` / `DROP TABLE`: one command drops them all.
    pub(super) async fn drop_relations(
        &mut self,
        names: &[String],
        if_exists: bool,
        stream: bool,
    ) -> Result<Output> {
        let kinds = names
            .iter()
            .map(|n| {
                op::Kind::DropRelation(DropRelation {
                    name: n.clone(),
                    if_exists,
                })
            })
            .collect();
        let tag = if stream { "DROP STREAM" } else { "DROP TABLE" };
        self.run_ddl(kinds, tag).await
    }

    /// `ALTER STREAM`: proposes the stream's whole new options (or name) for the stream it
    /// is now; a table cannot be altered yet.
    pub(super) async fn alter_stream(
        &mut self,
        name: &str,
        if_exists: bool,
        stream_keyword: bool,
        change: &StreamChange,
    ) -> Result<Output> {
        let tag = if stream_keyword {
            "ALTER STREAM"
        } else {
            "ALTER TABLE"
        };
        let Some(stream) = self.engine.catalog.get(name) else {
            if self.table(name).is_some() {
                return Err(Error::unsupported(format!(
                    "ALTER TABLE is not supported on table \"{name}\" yet (only streams can be altered)"
                )));
            }
            if if_exists {
                return Ok(Output::Tag(tag.into()));
            }
            return Err(Error::undefined_table(name));
        };
        let (options, new_name) = match change {
            StreamChange::Set(changes) => (changes.applied_to(&stream.def.options)?, String::new()),
            StreamChange::RenameTo(to) => (stream.def.options.clone(), to.clone()),
        };
        let kind = op::Kind::AlterStream(AlterStream {
            name: name.to_string(),
            stream_id: stream.def.id,
            options_json: definition_json(&options)?,
            new_name,
        });
        self.run_ddl(vec![kind], tag).await
    }

    pub(super) async fn alter_cluster(
        &mut self,
        change: &sluice_consensus::Membership,
    ) -> Result<Output> {
        if matches!(self.txn, Txn::Block(_)) {
            return Err(Error::new(
                sqlstate::ACTIVE_SQL_TRANSACTION,
                "ALTER CLUSTER cannot run inside a transaction block",
            ));
        }
        self.committing
            .store(true, std::sync::atomic::Ordering::Release);
        Box::pin(self.engine.change_membership(change.clone())).await?;
        Ok(Output::Tag("ALTER CLUSTER".into()))
    }

    /// Propose one command of `kinds` (outside any block) and answer `tag`.
    pub(super) async fn run_ddl(&mut self, kinds: Vec<op::Kind>, tag: &str) -> Result<Output> {
        let ops = kinds.into_iter().map(|k| Op { kind: Some(k) }).collect();
        self.propose(ops, 0, vec![]).await?;
        Ok(Output::Tag(tag.into()))
    }
}

fn definition_json(def: &impl Serialize) -> Result<String> {
    serde_json::to_string(def).map_err(|e| Error::internal(e.to_string()))
}
