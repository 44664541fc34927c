//! DDL of a session: CREATE, DROP and ALTER of streams and tables, CREATE and DROP of
//! views and indexes (`views`, `indexes`), and ALTER CLUSTER.
//!
//! Outside a block each statement is one proposed command that runs at once; inside one
//! its ops join the block's and commit with it (see `block_ddl`). A definition travels
//! as JSON; where the command applies, each node gives the relation the same id and OID
//! and finds the same name clash (42P07). ALTER CLUSTER changes Raft membership and
//! refuses to run inside a block.

use serde::Serialize;

use super::transaction::Txn;
use super::{Output, Session};
use crate::command::{op, AlterStream, CreateStream, CreateTable, DropRelation, Op};
use crate::definition::{StreamDef, TableDef};
use crate::error::{sqlstate, Error, Result};
use crate::statement::{sqlparser, Parsed, StreamChange};
use crate::types::ColumnType;

impl Session {
    /// CREATE, DROP and ALTER of a stream or table; ALTER CLUSTER.
    pub(super) async fn ddl(&mut self, p: &Parsed) -> Result<Output> {
        match p {
            Parsed::CreateTable { def, if_not_exists } => {
                self.create_table(def, *if_not_exists).await
            }
            Parsed::CreateStream { def, if_not_exists } => {
                self.create_stream(def, *if_not_exists).await
            }
            Parsed::DropRelation {
                names,
                if_exists,
                stream,
                view,
                cascade,
            } => {
                let tag = match (view, stream) {
                    (true, _) => "DROP VIEW",
                    (false, true) => "DROP STREAM",
                    (false, false) => "DROP TABLE",
                };
                self.drop_relations(names, *if_exists, *view, *cascade, tag)
                    .await
            }
            Parsed::CreateView {
                name,
                columns,
                query,
                or_replace,
            } => self.create_view(name, columns, query, *or_replace).await,
            Parsed::CreateIndex {
                name,
                table,
                columns,
                options,
                unique,
                if_not_exists,
            } => {
                self.create_index(
                    name.as_deref(),
                    table,
                    columns,
                    options,
                    *unique,
                    *if_not_exists,
                )
                .await
            }
            Parsed::DropIndex { names, if_exists } => self.drop_indexes(names, *if_exists).await,
            Parsed::AlterCluster(change) => self.alter_cluster(change).await,
            Parsed::AlterStream {
                name,
                if_exists,
                stream,
                change,
            } => self.alter_stream(name, *if_exists, *stream, change).await,
            _ => Err(Error::internal("not a DDL statement")),
        }
    }

    /// `CREATE TABLE`, and an index for each of its UNIQUE constraints (all one command).
    async fn create_table(&mut self, def: &TableDef, if_not_exists: bool) -> Result<Output> {
        let mut def = def.clone();
        let unique = std::mem::take(&mut def.indexes);
        if !unique.is_empty() && if_not_exists && self.block.exists(&def.name, &self.engine.catalog)
        {
            return Ok(Output::Tag("CREATE TABLE".into()));
        }
        let mut kinds = vec![op::Kind::CreateTable(CreateTable {
            name: def.name.clone(),
            definition_json: definition_json(&def)?,
            if_not_exists,
            owner: self.owner_name(),
        })];
        kinds.extend(self.constraint_indexes(&def, unique)?);
        self.run_ddl(kinds, "CREATE TABLE").await
    }

    async fn create_stream(&mut self, def: &StreamDef, if_not_exists: bool) -> Result<Output> {
        let kind = op::Kind::CreateStream(CreateStream {
            name: def.name.clone(),
            definition_json: definition_json(def)?,
            if_not_exists,
            owner: self.owner_name(),
        });
        self.run_ddl(vec![kind], "CREATE STREAM").await
    }

    /// `DROP STREAM` / `DROP TABLE` / `DROP VIEW`: one command drops them all.
    async fn drop_relations(
        &mut self,
        names: &[String],
        if_exists: bool,
        view: bool,
        cascade: bool,
        tag: &str,
    ) -> Result<Output> {
        let kinds = names
            .iter()
            .map(|n| {
                op::Kind::DropRelation(DropRelation {
                    name: n.clone(),
                    if_exists,
                    cascade,
                    view,
                })
            })
            .collect();
        self.run_ddl(kinds, tag).await
    }

    /// `ALTER STREAM`: proposes the stream's whole new options (or name) for the stream it
    /// is now; a table cannot be altered yet.
    async fn alter_stream(
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
        if self.block.is_new_stream(name) {
            return Err(crate::block_catalog::new_stream_error(name, "altered"));
        }
        let Some(stream) = self.block.stream(name, &self.engine.catalog) else {
            if self.block.view(name, &self.engine.catalog).is_some() {
                return Err(Error::new(
                    sqlstate::WRONG_OBJECT_TYPE,
                    format!("\"{name}\" is a view: views cannot be altered (CREATE OR REPLACE VIEW can change one)"),
                ));
            }
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
        let mut alter = AlterStream {
            name: name.to_string(),
            stream_id: stream.def.id,
            ..AlterStream::default()
        };
        match change {
            StreamChange::Set(changes) => {
                alter.options_json = definition_json(&changes.applied_to(&stream.def.options)?)?
            }
            StreamChange::RenameTo(to) => {
                alter.options_json = definition_json(&stream.def.options)?;
                alter.new_name = to.clone();
            }
            StreamChange::AddColumn {
                column,
                default,
                if_not_exists,
            } => {
                let mut column = (**column).clone();
                if let Some(e) = default {
                    column.default = column_default(e, column.ty)?;
                }
                alter.add_column_json = definition_json(&column)?;
                alter.if_not_exists = *if_not_exists;
            }
            StreamChange::RenameColumn { from, to } => {
                alter.rename_column = from.clone();
                alter.rename_column_to = to.clone();
            }
        }
        // the same checks the state machine makes, for an answer without a round trip
        crate::alter::new_definition(&stream, &alter)?;
        self.run_ddl(vec![op::Kind::AlterStream(alter)], tag).await
    }

    async fn alter_cluster(&mut self, change: &sluice_consensus::Membership) -> Result<Output> {
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

    /// Propose one command of `kinds` and answer `tag`; inside a block, add them to the
    /// block's ops instead (they commit with it: see `block_ddl`).
    pub(super) async fn run_ddl(&mut self, kinds: Vec<op::Kind>, tag: &str) -> Result<Output> {
        let ops = kinds.into_iter().map(|k| Op { kind: Some(k) }).collect();
        if matches!(self.txn, Txn::Block(_)) {
            self.buffer_ddl(ops)?;
        } else {
            self.propose(ops, 0, vec![]).await?;
        }
        Ok(Output::Tag(tag.into()))
    }
}

pub(super) fn definition_json(def: &impl Serialize) -> Result<String> {
    serde_json::to_string(def).map_err(|e| Error::internal(e.to_string()))
}

/// A DEFAULT for a stream column, as text its type reads back to the same value; `None` for
/// `DEFAULT NULL`. Only constants: a stream column's default is fixed when it is added (rows
/// written before read it), so `now()` and the like are refused.
fn column_default(e: &sqlparser::ast::Expr, ty: ColumnType) -> Result<Option<String>> {
    let not_constant = || {
        Error::unsupported(format!(
            "DEFAULT {e} is not a constant: a stream column's default must be one"
        ))
    };
    let value = crate::insert::eval_simple(e, ty, &[]).ok_or_else(not_constant)??;
    let value = ty.coerce(value)?;
    if value.is_null() {
        return Ok(None);
    }
    let array = value.to_array()?;
    let text = match ty {
        ColumnType::Array(_) => crate::types::arrays::format_text(&array)?,
        _ => arrow::util::display::array_value_to_string(&array, 0)?,
    };
    // the text must read back as the same value (else the default is refused)
    if ty.parse_text(&text)? != value {
        return Err(not_constant());
    }
    Ok(Some(text))
}
