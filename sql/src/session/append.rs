//! Appends to a stream: INSERT (with RETURNING), the rows of COPY FROM
//! (see [`super::copy_from`]), and the one DELETE a stream accepts,
//! `DELETE FROM s WHERE offset < n`, which drops a prefix.
//!
//! A statement's rows become one Arrow batch that satisfies the stream's
//! types, NOT NULL and row-size limit ([`crate::insert`]), then one
//! `Append` op: proposed at once, or buffered in the open block (bounded by
//! `max_statement_bytes`). Offsets and timestamps are assigned at commit,
//! so RETURNING is answered at once outside a block, after the commit in a
//! pipeline's implicit block (see `pipeline`), and in an explicit one at
//! once with `offset` and `ts` NULL (`sluice_last_offsets()` has them after
//! COMMIT: see `last_appends`). A prefix DELETE cannot be undone and never
//! runs inside a block.

use std::sync::Arc;

use arrow::array::RecordBatch;
use datafusion::scalar::ScalarValue;
use datafusion::sql::parser::Statement as DFStatement;
use sqlparser::ast::{BinaryOperator, Expr, SetExpr, Statement, TableObject, Value};

use super::transaction::{Block, Txn};
use super::{returning, Output, Session};
use crate::block_catalog::{self, LOCAL_ID_BASE};
use crate::catalog::Stream;
use crate::command::{op, Append, Op, OpOutcome, Truncate};
use crate::definition::{ColumnDef, OFFSET_COLUMN, TS_COLUMN};
use crate::error::{sqlstate, Error, Result};
use crate::insert;
use crate::statement::{self, sqlparser};
use crate::stream_provider::{with_system_columns, InsertCollector};

/// Where a committed append put its rows.
#[derive(Debug)]
pub(super) struct Appended {
    pub(super) base_offset: u64,
    pub(super) ts_micros: i64,
    /// Rows appended (duplicates of a dedup stream are not).
    pub(super) rows: u32,
    /// Per input row (offset, ts), for dedup streams.
    pub(super) row_offsets: Vec<(u64, i64)>,
}

impl Session {
    /// The stream called `name`, as the open block sees it (see [`crate::block_catalog`]).
    pub(super) fn stream(&self, name: &str) -> Result<Arc<Stream>> {
        self.block
            .stream(name, &self.engine.catalog)
            .ok_or_else(|| Error::undefined_table(name))
    }

    /// How many VALUES expressions this session has compiled (see
    /// `compiled_values.rs`): an INSERT run again compiles none.
    pub fn compiled_expressions(&self) -> u64 {
        self.values.compilations()
    }

    /// INSERT into a stream.
    pub(super) async fn insert(
        &mut self,
        ins: &sqlparser::ast::Insert,
        params: &[ScalarValue],
    ) -> Result<Output> {
        if ins.on.is_some() {
            return Err(Error::unsupported(
                "ON CONFLICT is not supported on a stream (streams have no keys)",
            ));
        }
        let stream = self.stream(&insert_target(ins)?)?;
        let targets = insert_targets(&stream, ins)?;
        let batch = match self.fast_values(&stream, &targets, ins, params)? {
            Some(b) => b,
            None => Box::pin(self.planned_insert(&stream, ins, params)).await?,
        };
        let rows = batch.num_rows();
        if rows == 0 {
            return Ok(Output::Tag("INSERT 0 0".into()));
        }
        let outcome = self.append(&stream, &batch).await?;
        // duplicates of a dedup stream are not appended (nor counted)
        let appended = outcome.as_ref().map(|o| o.rows as usize).unwrap_or(rows);
        let Some(items) = &ins.returning else {
            return Ok(Output::Tag(format!("INSERT 0 {appended}")));
        };
        match outcome {
            Some(o) => Box::pin(returning_rows(&stream, &batch, items, Some(&o))).await,
            // in a pipeline: answered when its block commits (see `pipeline`)
            None if self.in_implicit() => self.defer_returning(stream, batch, items),
            // in an explicit block: `offset` and `ts` NULL now, the offsets after COMMIT
            // from sluice_last_offsets() (see `last_appends`)
            None => Box::pin(returning_rows(&stream, &batch, items, None)).await,
        }
    }

    /// VALUES of literals, parameters and expressions that read no relation, evaluated
    /// without planning the statement (expressions compiled once per session, see
    /// [`crate::compiled_values`]).
    fn fast_values(
        &mut self,
        stream: &Stream,
        targets: &[usize],
        ins: &sqlparser::ast::Insert,
        params: &[ScalarValue],
    ) -> Result<Option<RecordBatch>> {
        let Some(rows) = values_rows(ins) else {
            return Ok(None);
        };
        let mut out = Vec::with_capacity(rows.len());
        // the statement's start time (now()), taken when an expression first needs it
        let mut start = None;
        for row in rows {
            insert::check_arity(row.len(), targets.len())?;
            let mut vals = Vec::with_capacity(row.len());
            for (e, &t) in row.iter().zip(targets) {
                let ty = stream.def.columns[t].ty;
                let value = match insert::eval_simple(e, ty, params) {
                    Some(v) => v,
                    None => {
                        let start = *start.get_or_insert_with(chrono::Utc::now);
                        let state = self.ctx.state_ref();
                        let state = state.read();
                        match self.values.value(&state, e, ty, start, params) {
                            Some(v) => v,
                            None => return Ok(None),
                        }
                    }
                };
                vals.push(ty.coerce(value?)?);
            }
            out.push(vals);
        }
        Ok(Some(insert::build_batch(
            stream,
            targets,
            out,
            self.engine.limits.max_row_bytes,
        )?))
    }

    /// INSERT whose rows need planning (INSERT ... SELECT, expressions).
    async fn planned_insert(
        &self,
        stream: &Arc<Stream>,
        ins: &sqlparser::ast::Insert,
        params: &[ScalarValue],
    ) -> Result<RecordBatch> {
        let width = implicit_width(ins, stream.def.columns.len())?;
        let mut ins = ins.clone();
        ins.returning = None;
        if let Some(source) = ins.source.as_mut() {
            insert::values_with_subqueries_as_selects(source)?;
        }
        if ins.columns.is_empty() {
            let mut names = user_column_names(stream);
            names.truncate(width.unwrap_or(names.len()));
            ins.columns = names;
        }
        let mut state = self.ctx.state();
        let collector = Arc::new(InsertCollector::default());
        state.config_mut().set_extension(collector.clone());
        let mut stmt = Statement::Insert(ins);
        self.expand_views(&mut stmt)?;
        let mut plan = state
            .statement_to_plan(DFStatement::Statement(Box::new(stmt)))
            .await?;
        if !params.is_empty() {
            plan = plan.with_param_values(params.to_vec())?;
        }
        let physical = state.create_physical_plan(&plan).await?;
        datafusion::physical_plan::collect(physical, state.task_ctx()).await?;
        let mut batches = Vec::new();
        for (s, b) in collector.take() {
            if s.def.id != stream.def.id {
                return Err(Error::internal("INSERT produced rows for another stream"));
            }
            batches.push(insert::from_planned(
                stream,
                &b,
                self.engine.limits.max_row_bytes,
            )?);
        }
        insert::concat(stream, &batches)
    }

    /// Propose an append now, or buffer it in the open block. Returns
    /// where the rows went when it committed now.
    pub(super) async fn append(
        &mut self,
        stream: &Arc<Stream>,
        batch: &RecordBatch,
    ) -> Result<Option<Appended>> {
        if stream.def.id >= LOCAL_ID_BASE && stream.def.options.dedup_key.is_some() {
            // its dedup index starts when the stream is committed
            return Err(block_catalog::new_stream_error(
                stream.name(),
                "written (it has a dedup_key)",
            ));
        }
        let (encoded, size) = encode_append(stream, batch, self.engine.limits.max_statement_bytes)?;
        let max = self.engine.limits.max_statement_bytes;
        let op = Op {
            kind: Some(op::Kind::Append(Append {
                stream: stream.name().to_string(),
                stream_id: stream.def.id,
                rows: batch.num_rows() as u32,
                ipc: encoded.ipc.into(),
                logical_len: encoded.logical_len,
            })),
        };
        if let Txn::Block(Block { ops, bytes, .. }) = &mut self.txn {
            if *bytes + size > max {
                return Err(Error::new(
                    sqlstate::PROGRAM_LIMIT_EXCEEDED,
                    format!(
                        "transaction block exceeds the maximum of {max} bytes of writes (max_statement_bytes)"
                    ),
                ));
            }
            *bytes += size;
            ops.push(op);
            self.tables.record_append(stream.def.id, batch.clone());
            return Ok(None);
        }
        let outcomes = self.propose(vec![op], 0, vec![]).await?;
        match outcomes.into_iter().next() {
            Some(OpOutcome::Appended {
                base_offset,
                ts_micros,
                rows,
                row_offsets,
                ..
            }) => Ok(Some(Appended {
                base_offset,
                ts_micros,
                rows,
                row_offsets,
            })),
            _ => Err(Error::internal("append produced no outcome")),
        }
    }
}

/// A batch of `stream`'s user columns as an append carries it (Arrow IPC, with the stream's
/// compression), and its size as `max_statement_bytes` (`max`) counts it: what a reader
/// decodes, not what compression made of it.
pub(super) fn encode_append(
    stream: &Stream,
    batch: &RecordBatch,
    max: usize,
) -> Result<(crate::ipc::Encoded, usize)> {
    let compression = stream.def.options.compression.arrow();
    let schema = batch.schema();
    // a batch built for the stream shares its schema: no field-by-field comparison
    let encoded = if Arc::ptr_eq(&schema, &stream.user_schema) || *schema == *stream.user_schema {
        crate::ipc::encode_batch(stream.ipc_schema()?, batch, compression)?
    } else {
        let schema = crate::ipc::ipc_schema_message(&schema)?;
        crate::ipc::encode_batch(&schema, batch, compression)?
    };
    let size = encoded.ipc.len().max(encoded.data_len.unwrap_or(0));
    if size > max {
        return Err(Error::new(
            sqlstate::PROGRAM_LIMIT_EXCEEDED,
            format!(
                "write of {size} bytes exceeds the maximum of {max} bytes per command (max_statement_bytes)"
            ),
        ));
    }
    Ok((encoded, size))
}

impl Session {
    /// `DELETE FROM s WHERE offset < n` drops a prefix; any other DELETE is refused.
    pub(super) async fn truncate_prefix(&mut self, d: &sqlparser::ast::Delete) -> Result<Output> {
        // a missing relation is 42P01 whatever the DELETE's shape
        self.stream(&super::dml::delete_target(d)?.0)?;
        let (name, before) = truncation_target(d)?;
        let stream = self.stream(&name)?;
        self.outside_block("prefix truncation")?;
        let first_before = stream.log.first_offset();
        let op = Op {
            kind: Some(op::Kind::Truncate(Truncate {
                stream: name,
                stream_id: stream.def.id,
                before,
            })),
        };
        let outcomes = self.propose(vec![op], 0, vec![]).await?;
        let removed = match outcomes.first() {
            Some(OpOutcome::Truncated { first_offset }) => {
                first_offset.saturating_sub(first_before)
            }
            _ => 0,
        };
        Ok(Output::Tag(format!("DELETE {removed}")))
    }
}

/// The RETURNING rows of an append: with the `offset` and `ts` it got, or
/// NULL when it did not commit (`None`).
pub(super) async fn returning_rows(
    stream: &Stream,
    batch: &RecordBatch,
    items: &[sqlparser::ast::SelectItem],
    appended: Option<&Appended>,
) -> Result<Output> {
    let full = match appended {
        None => crate::stream_provider::uncommitted_rows(stream, batch)?,
        Some(o) if o.row_offsets.is_empty() => {
            with_system_columns(stream, batch, o.base_offset, o.ts_micros)?
        }
        Some(o) => with_row_offsets(stream, batch, &o.row_offsets)?,
    };
    returning::rows(
        stream.full_schema.clone(),
        "returning_rows",
        vec![full],
        items,
        &[],
        "INSERT 0",
    )
    .await
}

/// The input rows with the `offset` and `ts` each got (its own, or the
/// original's for a duplicate).
fn with_row_offsets(
    stream: &Stream,
    user: &RecordBatch,
    row_offsets: &[(u64, i64)],
) -> Result<RecordBatch> {
    use arrow::array::{ArrayRef, Int64Array, TimestampMicrosecondArray};
    let offsets: ArrayRef = Arc::new(Int64Array::from_iter_values(
        row_offsets.iter().map(|(o, _)| *o as i64),
    ));
    let tss: ArrayRef = Arc::new(
        TimestampMicrosecondArray::from_iter_values(row_offsets.iter().map(|(_, t)| *t))
            .with_timezone("UTC"),
    );
    let mut cols = vec![offsets, tss];
    cols.extend(user.columns().iter().cloned());
    Ok(RecordBatch::try_new(stream.full_schema.clone(), cols)?)
}

/// The relation an INSERT names.
/// A stream's own columns (not `offset`, `ts`) as an INSERT's column list.
pub(super) fn user_column_names(stream: &Stream) -> Vec<sqlparser::ast::ObjectName> {
    stream
        .def
        .columns
        .iter()
        .map(|c| {
            sqlparser::ast::ObjectName::from(vec![sqlparser::ast::Ident::with_quote(
                '"',
                c.name.clone(),
            )])
        })
        .collect()
}

pub(super) fn insert_target(ins: &sqlparser::ast::Insert) -> Result<String> {
    match &ins.table {
        TableObject::TableName(n) => Ok(statement::table_name(n)),
        other => Err(Error::unsupported(format!(
            "INSERT INTO {other} is not supported"
        ))),
    }
}

/// Indices (into the user columns) the INSERT's column list names, in order.
pub(super) fn insert_targets(stream: &Stream, ins: &sqlparser::ast::Insert) -> Result<Vec<usize>> {
    if let Some(n) = implicit_width(ins, stream.def.columns.len())? {
        return Ok((0..n).collect());
    }
    let names: Vec<String> = ins
        .columns
        .iter()
        .map(|c| {
            c.0.last()
                .and_then(|p| p.as_ident())
                .map(statement::normalize_ident)
                .unwrap_or_default()
        })
        .collect();
    target_columns(stream, &names)
}

/// Without a column list, VALUES rows narrower than the relation fill its
/// first columns (PostgreSQL: "the first N column names, if there are only N
/// columns supplied by the VALUES clause"); `None` when the INSERT targets
/// all columns or names its own.
/// VALUES rows of different widths are `42601`, as in PostgreSQL.
pub(super) fn implicit_width(
    ins: &sqlparser::ast::Insert,
    columns: usize,
) -> Result<Option<usize>> {
    let Some(rows) = values_rows(ins) else {
        return Ok(None);
    };
    let width = rows.first().map_or(0, |r| r.len());
    if rows.iter().any(|r| r.len() != width) {
        return Err(Error::syntax("VALUES lists must all be the same length"));
    }
    Ok((ins.columns.is_empty() && width < columns).then_some(width))
}

/// Positions of the named user columns of a stream; its system columns
/// are assigned at commit and cannot be written (428C9).
pub(super) fn target_columns(stream: &Stream, names: &[String]) -> Result<Vec<usize>> {
    column_positions(&stream.def.columns, stream.name(), names, |n| {
        if n == OFFSET_COLUMN || n == TS_COLUMN {
            return Err(Error::new(
                sqlstate::GENERATED_ALWAYS,
                format!("cannot insert a non-DEFAULT value into column \"{n}\""),
            )
            .with_detail(format!(
                "Column \"{n}\" is a system column assigned at commit."
            )));
        }
        Ok(())
    })
}

/// Positions of the named columns of a relation (all of them if `names` is
/// empty), each at most once; `check` vets each name first.
pub(super) fn column_positions(
    columns: &[ColumnDef],
    relation: &str,
    names: &[String],
    check: impl Fn(&str) -> Result<()>,
) -> Result<Vec<usize>> {
    if names.is_empty() {
        return Ok((0..columns.len()).collect());
    }
    let mut out = Vec::with_capacity(names.len());
    for n in names {
        check(n)?;
        let i = columns.iter().position(|c| &c.name == n).ok_or_else(|| {
            Error::new(
                sqlstate::UNDEFINED_COLUMN,
                format!("column \"{n}\" of relation \"{relation}\" does not exist"),
            )
        })?;
        if out.contains(&i) {
            return Err(Error::new(
                sqlstate::DUPLICATE_COLUMN,
                format!("column \"{n}\" specified more than once"),
            ));
        }
        out.push(i);
    }
    Ok(out)
}

/// The rows of a plain `INSERT ... VALUES` (no WITH, ORDER BY or LIMIT).
pub(super) fn values_rows(ins: &sqlparser::ast::Insert) -> Option<Vec<&Vec<Expr>>> {
    let q = ins.source.as_ref()?;
    if q.with.is_some() || q.order_by.is_some() || q.limit_clause.is_some() {
        return None;
    }
    match q.body.as_ref() {
        SetExpr::Values(v) => Some(v.rows.iter().map(|r| &r.content).collect()),
        _ => None,
    }
}

fn literal_u64(e: &Expr) -> Option<u64> {
    match e {
        Expr::Value(v) => match &v.value {
            Value::Number(n, _) => n.parse().ok(),
            _ => None,
        },
        Expr::Nested(inner) => literal_u64(inner),
        _ => None,
    }
}

/// `DELETE FROM s WHERE offset < n` (or `<= n`): the stream and the first
/// offset to keep. Any other DELETE is refused: streams are append-only.
pub(super) fn truncation_target(d: &sqlparser::ast::Delete) -> Result<(String, u64)> {
    let tables = match &d.from {
        sqlparser::ast::FromTable::WithFromKeyword(t)
        | sqlparser::ast::FromTable::WithoutKeyword(t) => t,
    };
    let name = match tables.first().map(|t| &t.relation) {
        Some(sqlparser::ast::TableFactor::Table { name, .. }) => statement::table_name(name),
        _ => return Err(Error::syntax("DELETE needs a stream name")),
    };
    let before = match &d.selection {
        Some(Expr::BinaryOp { left, op, right }) => match (left.as_ref(), op, right.as_ref()) {
            (Expr::Identifier(id), BinaryOperator::Lt, v)
                if statement::normalize_ident(id) == OFFSET_COLUMN =>
            {
                literal_u64(v)
            }
            (Expr::Identifier(id), BinaryOperator::LtEq, v)
                if statement::normalize_ident(id) == OFFSET_COLUMN =>
            {
                literal_u64(v).map(|n| n + 1)
            }
            _ => None,
        },
        _ => None,
    };
    match before {
        Some(before) => Ok((name, before)),
        None => Err(statement::append_only(&name)),
    }
}
