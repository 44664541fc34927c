//! INSERT, UPDATE and DELETE on tables.
//!
//! Each statement reads through the session's [`TxnTables`] view (its
//! snapshot, its own writes, its read set) and turns into `TableWrite` ops:
//! buffered in an open block, or proposed at once with the statement's
//! reads. UPDATE and DELETE are planned by DataFusion as a SELECT over the
//! table's keyed view (rows plus their stored key), so any predicate,
//! subquery or function works; the assignments of `ON CONFLICT DO UPDATE`
//! are evaluated over the existing and the proposed (`excluded`) rows.
//! Outside a block a statement that loses a serialization race is retried
//! (it has no effects until its command commits).

use std::collections::HashSet;
use std::sync::Arc;

use arrow::array::{Array, ArrayRef, Int64Array, RecordBatch};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion::datasource::MemTable;
use datafusion::execution::context::SessionContext;
use datafusion::scalar::ScalarValue;
use datafusion::sql::parser::Statement as DFStatement;
use sqlparser::ast::{
    AssignmentTarget, Expr, FromTable, OnConflictAction, SelectItem, Statement, TableFactor,
    UpdateTableFromKind,
};

use super::append::{column_positions, insert_target, values_rows};
use super::naming::quote;
use super::transaction::Txn;
use super::{returning, upsert, Description, Output, Session};
use crate::command::{op, Op, TableWrite};
use crate::engine::keyed_name;
use crate::error::{sqlstate, Error, Result};
use crate::insert;
use crate::statement::{self, sqlparser, Parsed};
use crate::table::{write_kind, Table, KEY_COLUMN};

/// How long a statement outside a block keeps retrying after it lost a
/// serialization race before it reports 40001.
const AUTOCOMMIT_RETRY_FOR: std::time::Duration = std::time::Duration::from_secs(30);

const ROW_NUMBER: &str = "sluice$n";

/// A table-qualified reference to a column of the statement's alias.
fn column_ref(alias: &str, col: &str) -> String {
    format!("{}.{}", quote(alias), quote(col))
}

impl Session {
    /// The table an INSERT/UPDATE/DELETE targets, if it is a table.
    pub(super) fn table(&self, name: &str) -> Option<Arc<Table>> {
        self.block.table(name, &self.engine.catalog)
    }

    /// The table an UPDATE names; a stream is append-only.
    pub(super) fn updated_table(&self, u: &sqlparser::ast::Update) -> Result<Arc<Table>> {
        let name = match &u.table.relation {
            TableFactor::Table { name, .. } => statement::table_name(name),
            other => other.to_string(),
        };
        match self.table(&name) {
            Some(table) => Ok(table),
            // a stream is append-only; otherwise the lookup's own error (42P01)
            None => Err(self
                .stream(&name)
                .err()
                .unwrap_or_else(|| statement::append_only(&name))),
        }
    }

    /// Run a table DML statement; outside a block, retry it when its
    /// commit loses a serialization race. Retries take the engine's retry
    /// lane, so under contention every statement gets through in turn
    /// (bounded by [`AUTOCOMMIT_RETRY_FOR`]).
    pub(super) async fn table_dml(&mut self, p: &Parsed, params: &[ScalarValue]) -> Result<Output> {
        let engine = self.engine.clone();
        let mut lane = None;
        let mut since = None;
        loop {
            let r = match p {
                Parsed::Insert(ins) => self.table_insert(ins, params).await,
                Parsed::Update(u) => self.table_update(u, params).await,
                Parsed::Delete(d) => self.table_delete(d, params).await,
                _ => Err(Error::internal("not a table statement")),
            };
            match r {
                Err(e)
                    if e.code == sqlstate::SERIALIZATION_FAILURE
                        && matches!(self.txn, Txn::Idle)
                        && since.is_none_or(|t: std::time::Instant| {
                            t.elapsed() < AUTOCOMMIT_RETRY_FOR
                        }) =>
                {
                    since.get_or_insert_with(std::time::Instant::now);
                    if lane.is_none() {
                        lane = Some(engine.retry_lane.lock().await);
                    }
                    self.tables.reset();
                    tokio::task::yield_now().await;
                }
                other => return other,
            }
        }
    }

    /// Buffer the ops in the block (visible to its later reads) or propose
    /// them now with what the statement read.
    async fn write_table(&mut self, ops: Vec<Op>) -> Result<()> {
        if ops.is_empty() {
            return Ok(());
        }
        let max = self.engine.limits.max_statement_bytes;
        match &mut self.txn {
            Txn::Block(b) => {
                for o in &ops {
                    if let Some(op::Kind::TableWrite(w)) = &o.kind {
                        b.bytes += w.key.len() + w.row.len() + w.table.len() + 16;
                        let row =
                            (w.kind != write_kind::DELETE).then(|| Arc::from(w.row.as_slice()));
                        self.tables.record_write(w.table_id, &w.key, row);
                    }
                }
                if b.bytes > max {
                    return Err(Error::new(
                        sqlstate::PROGRAM_LIMIT_EXCEEDED,
                        format!(
                            "transaction block exceeds the maximum of {max} bytes of writes (max_statement_bytes)"
                        ),
                    ));
                }
                b.ops.extend(ops);
                Ok(())
            }
            _ => {
                let snapshot = self.tables.snapshot_index();
                let reads = self.tables.reads();
                self.propose(ops, snapshot, reads).await?;
                Ok(())
            }
        }
    }

    fn write_op(table: &Table, kind: i32, key: Vec<u8>, row: &[ScalarValue]) -> Result<Op> {
        let row = if kind == write_kind::DELETE {
            Vec::new()
        } else {
            crate::table::codec::encode_row(row)?
        };
        Ok(Op {
            kind: Some(op::Kind::TableWrite(TableWrite {
                table: table.def.name.clone(),
                table_id: table.def.id,
                kind,
                key,
                row,
            })),
        })
    }

    /// Rows an INSERT provides, as full rows of the table. VALUES of literals, parameters and
    /// expressions that read no relation are evaluated as a stream INSERT's are (expressions
    /// compiled once per session); anything else is run as a query.
    async fn insert_rows(
        &mut self,
        table: &Table,
        ins: &sqlparser::ast::Insert,
        params: &[ScalarValue],
    ) -> Result<Vec<Vec<ScalarValue>>> {
        let targets = table_targets(table, ins)?;
        let types = &table.types;
        // the statement's start time (now()), taken when an expression first needs it
        let mut start = None;
        let state = self.ctx.state_ref();
        let simple = values_rows(ins).and_then(|rows| {
            let mut vals = Vec::with_capacity(rows.len());
            for row in rows {
                if let Err(e) = insert::check_arity(row.len(), targets.len()) {
                    return Some(Err(e));
                }
                let mut r = Vec::with_capacity(row.len());
                for (e, &t) in row.iter().zip(&targets) {
                    let value = match insert::eval_simple(e, types[t], params) {
                        Some(v) => Some(v),
                        None => {
                            let start = *start.get_or_insert_with(chrono::Utc::now);
                            self.values.value(&state.read(), e, types[t], start, params)
                        }
                    };
                    match value? {
                        Ok(v) => match types[t].coerce(v) {
                            Ok(v) => r.push(v),
                            Err(e) => return Some(Err(e)),
                        },
                        Err(e) => return Some(Err(e)),
                    }
                }
                vals.push(r);
            }
            Some(Ok(vals))
        });
        let provided: Vec<Vec<ScalarValue>> = match simple {
            Some(rows) => rows?,
            None => {
                let Some(source) = &ins.source else {
                    return Err(Error::unsupported(
                        "INSERT ... DEFAULT VALUES is not supported",
                    ));
                };
                // DataFusion runs no subquery inside VALUES: each row becomes a SELECT
                let mut source = source.clone();
                insert::values_with_subqueries_as_selects(&mut source)?;
                let batches = self
                    .collect_query(&Statement::Query(source), params)
                    .await?;
                let mut rows = Vec::new();
                for b in batches {
                    insert::check_arity(b.num_columns(), targets.len())?;
                    let cols: Vec<ArrayRef> = b
                        .columns()
                        .iter()
                        .zip(&targets)
                        .map(|(c, &t)| cast_to(c, table, t))
                        .collect::<Result<_>>()?;
                    for i in 0..b.num_rows() {
                        rows.push(
                            cols.iter()
                                .map(|c| ScalarValue::try_from_array(c, i))
                                .collect::<std::result::Result<Vec<_>, _>>()?,
                        );
                    }
                }
                rows
            }
        };
        full_rows(table, &targets, provided, self.engine.limits.max_row_bytes)
    }

    /// COPY FROM into a table: the copied rows as new rows in one write (a key already
    /// present, or copied twice, is 23505 as for a plain INSERT).
    pub(super) async fn copy_into_table(
        &mut self,
        table: &Table,
        targets: &[usize],
        provided: Vec<Vec<ScalarValue>>,
    ) -> Result<()> {
        let rows = full_rows(table, targets, provided, self.engine.limits.max_row_bytes)?;
        let mut ops = Vec::with_capacity(rows.len());
        let mut seen: HashSet<Vec<u8>> = HashSet::new();
        for row in rows {
            let key = match table.key_of(&row)? {
                Some(k) => k,
                None => self.engine.next_row_id(),
            };
            if seen.contains(&key) || self.tables.peek(&self.engine.tables, table, &key)? {
                return Err(table.duplicate(&row));
            }
            seen.insert(key.clone());
            ops.push(Self::write_op(table, write_kind::INSERT, key, &row)?);
        }
        self.write_table(ops).await
    }

    async fn table_insert(
        &mut self,
        ins: &sqlparser::ast::Insert,
        params: &[ScalarValue],
    ) -> Result<Output> {
        let name = insert_target(ins)?;
        let table = self
            .table(&name)
            .ok_or_else(|| Error::undefined_table(&name))?;
        let alias = ins
            .table_alias
            .as_ref()
            .map(|a| statement::normalize_ident(&a.alias))
            .unwrap_or_else(|| name.clone());
        let rows = self.insert_rows(&table, ins, params).await?;
        let conflict = upsert::on_conflict(&table, ins)?;
        let mut ops = Vec::new();
        let mut result_rows = Vec::new();
        let mut seen: HashSet<Vec<u8>> = HashSet::new();
        let mut taken = upsert::Taken::default();
        let mut to_update: Vec<(Vec<u8>, Vec<ScalarValue>, Vec<ScalarValue>)> = Vec::new();
        // RETURNING lists rows in the order they were proposed
        let mut update_pos: std::collections::HashMap<Vec<u8>, usize> = Default::default();
        for (pos, row) in rows.into_iter().enumerate() {
            let key = match table.key_of(&row)? {
                Some(k) => k,
                None => self.engine.next_row_id(),
            };
            match &conflict {
                None => {
                    if seen.contains(&key) || self.tables.peek(&self.engine.tables, &table, &key)? {
                        return Err(table.duplicate(&row));
                    }
                }
                Some((OnConflictAction::DoNothing, arbiters)) => {
                    if seen.contains(&key)
                        || taken.clashes(arbiters, &row)?
                        || self
                            .conflicting_row(&table, arbiters, &key, &row)?
                            .is_some()
                    {
                        continue;
                    }
                    taken.take(arbiters, &row)?;
                }
                Some((OnConflictAction::DoUpdate(_), arbiters)) => {
                    let existing = self.conflicting_row(&table, arbiters, &key, &row)?;
                    let again = match &existing {
                        Some((k, _)) => seen.contains(k),
                        None => seen.contains(&key) || taken.clashes(arbiters, &row)?,
                    };
                    if again {
                        return Err(Error::new(
                            sqlstate::CARDINALITY_VIOLATION,
                            "ON CONFLICT DO UPDATE command cannot affect row a second time",
                        )
                        .with_detail("Ensure that no rows proposed for insertion within the same command have duplicate constrained values."));
                    }
                    if let Some((k, existing)) = existing {
                        seen.insert(k.clone());
                        update_pos.insert(k.clone(), pos);
                        to_update.push((k, existing, row));
                        continue;
                    }
                    taken.take(arbiters, &row)?;
                }
            }
            seen.insert(key.clone());
            ops.push(Self::write_op(&table, write_kind::INSERT, key, &row)?);
            result_rows.push((pos, row));
        }
        if let Some((OnConflictAction::DoUpdate(du), _)) = conflict {
            if !to_update.is_empty() {
                let updated = self
                    .eval_upsert(&table, &alias, &to_update, du, params)
                    .await?;
                for (key, new_row) in updated {
                    let pos = update_pos.get(&key).copied().unwrap_or(usize::MAX);
                    table.check_not_null(&new_row)?;
                    match table.key_of(&new_row)? {
                        Some(k) if k != key => {
                            if self.tables.peek(&self.engine.tables, &table, &k)? {
                                return Err(table.duplicate(&new_row));
                            }
                            ops.push(Self::write_op(&table, write_kind::DELETE, key, &[])?);
                            ops.push(Self::write_op(&table, write_kind::INSERT, k, &new_row)?);
                        }
                        _ => ops.push(Self::write_op(&table, write_kind::PUT, key, &new_row)?),
                    }
                    result_rows.push((pos, new_row));
                }
            }
        }
        result_rows.sort_by_key(|(pos, _)| *pos);
        let result_rows: Vec<Vec<ScalarValue>> = result_rows.into_iter().map(|(_, r)| r).collect();
        self.finish_change(
            &table,
            &alias,
            ops,
            result_rows,
            &ins.returning,
            params,
            "INSERT 0",
        )
        .await
    }

    /// Evaluate `DO UPDATE SET ... [WHERE ...]` for rows whose key exists:
    /// (key, existing, proposed) → (key, new row) for those the WHERE keeps.
    async fn eval_upsert(
        &self,
        table: &Table,
        alias: &str,
        pairs: &[(Vec<u8>, Vec<ScalarValue>, Vec<ScalarValue>)],
        du: &sqlparser::ast::DoUpdate,
        params: &[ScalarValue],
    ) -> Result<Vec<(Vec<u8>, Vec<ScalarValue>)>> {
        let ctx = SessionContext::new();
        let existing: Vec<Vec<ScalarValue>> = pairs.iter().map(|(_, e, _)| e.clone()).collect();
        let proposed: Vec<Vec<ScalarValue>> = pairs.iter().map(|(_, _, p)| p.clone()).collect();
        ctx.register_table(alias, numbered_table(table, existing)?)?;
        ctx.register_table("excluded", numbered_table(table, proposed)?)?;
        let exprs = assigned_row(table, alias, &du.assignments)?;
        let mut sql = format!(
            "SELECT {}, {} FROM {} JOIN excluded ON {} = excluded.{}",
            column_ref(alias, ROW_NUMBER),
            exprs.join(", "),
            quote(alias),
            column_ref(alias, ROW_NUMBER),
            quote(ROW_NUMBER)
        );
        if let Some(w) = &du.selection {
            sql.push_str(&format!(" WHERE {w}"));
        }
        let plan = plan_in(&ctx, &sql, params).await?;
        let batches = ctx.execute_logical_plan(plan).await?.collect().await?;
        lead_and_rows(table, &batches)?
            .into_iter()
            .map(|(n, row)| match n {
                ScalarValue::Int64(Some(n)) => Ok((pairs[n as usize].0.clone(), row)),
                other => Err(Error::internal(format!("row number {other:?}"))),
            })
            .collect()
    }

    async fn table_update(
        &mut self,
        u: &sqlparser::ast::Update,
        params: &[ScalarValue],
    ) -> Result<Output> {
        let (name, alias) = update_target(&u.table.relation)?;
        let table = self
            .table(&name)
            .ok_or_else(|| Error::undefined_table(&name))?;
        let sql = update_sql(&table, &alias, u)?;
        let rows = self.keyed_rows(&table, &sql, params).await?;
        let mut ops = Vec::new();
        let mut done: HashSet<Vec<u8>> = HashSet::new();
        let mut new_keys: HashSet<Vec<u8>> = HashSet::new();
        let mut result = Vec::new();
        for (key, row) in rows {
            if !done.insert(key.clone()) {
                continue;
            }
            table.check_not_null(&row)?;
            check_row_size(&row, self.engine.limits.max_row_bytes)?;
            match table.key_of(&row)? {
                Some(k) if k != key => {
                    if !new_keys.insert(k.clone())
                        || (!done.contains(&k)
                            && self.tables.peek(&self.engine.tables, &table, &k)?)
                    {
                        return Err(table.duplicate(&row));
                    }
                    ops.push(Self::write_op(&table, write_kind::DELETE, key, &[])?);
                    ops.push(Self::write_op(&table, write_kind::INSERT, k, &row)?);
                }
                _ => {
                    if new_keys.contains(&key) {
                        return Err(table.duplicate(&row));
                    }
                    ops.push(Self::write_op(&table, write_kind::PUT, key, &row)?)
                }
            }
            result.push(row);
        }
        self.finish_change(&table, &alias, ops, result, &u.returning, params, "UPDATE")
            .await
    }

    async fn table_delete(
        &mut self,
        d: &sqlparser::ast::Delete,
        params: &[ScalarValue],
    ) -> Result<Output> {
        let (name, alias, _) = delete_target(d)?;
        let table = self
            .table(&name)
            .ok_or_else(|| Error::undefined_table(&name))?;
        let sql = delete_sql(&table, &alias, d)?;
        let rows = self.keyed_rows(&table, &sql, params).await?;
        let mut ops = Vec::new();
        let mut done: HashSet<Vec<u8>> = HashSet::new();
        let mut result = Vec::new();
        for (key, row) in rows {
            if done.insert(key.clone()) {
                ops.push(Self::write_op(&table, write_kind::DELETE, key, &[])?);
                result.push(row);
            }
        }
        self.finish_change(&table, &alias, ops, result, &d.returning, params, "DELETE")
            .await
    }

    /// Run a query over the keyed view: (stored key, new row) per row.
    async fn keyed_rows(
        &self,
        table: &Table,
        sql: &str,
        params: &[ScalarValue],
    ) -> Result<Vec<(Vec<u8>, Vec<ScalarValue>)>> {
        let batches = self.collect_query(&*parse_query(sql)?, params).await?;
        lead_and_rows(table, &batches)?
            .into_iter()
            .map(|(key, row)| match key {
                ScalarValue::Binary(Some(k)) => Ok((k, row)),
                other => Err(Error::internal(format!("stored key {other:?}"))),
            })
            .collect()
    }

    /// Parameter types and result columns of a table UPDATE or DELETE:
    /// `SET col = $n` takes the column's type, the rest what planning the
    /// keyed query infers (`WHERE k = $n`).
    pub(super) async fn describe_table_change(&self, p: &Parsed) -> Result<Description> {
        let (table, alias, sql, set, returning) = match p {
            Parsed::Update(u) => {
                let (name, alias) = update_target(&u.table.relation)?;
                let table = self
                    .table(&name)
                    .ok_or_else(|| Error::undefined_table(&name))?;
                let sql = update_sql(&table, &alias, u)?;
                let set = assignments(&table, &u.assignments)?;
                (table, alias, sql, set, &u.returning)
            }
            Parsed::Delete(d) => {
                let (name, alias, _) = delete_target(d)?;
                let table = self
                    .table(&name)
                    .ok_or_else(|| Error::undefined_table(&name))?;
                let sql = delete_sql(&table, &alias, d)?;
                (table, alias, sql, vec![], &d.returning)
            }
            _ => return Err(Error::internal("not a table UPDATE or DELETE")),
        };
        let mut params = Vec::new();
        let values: Vec<Expr> = set.iter().map(|(_, e)| e.clone()).collect();
        let types: Vec<crate::types::ColumnType> =
            set.iter().map(|(i, _)| table.types[*i]).collect();
        insert::infer_param_types(&[&values], &types, &mut params);
        let q = parse_query(&sql)?;
        let plan = self.plan(&q).await?;
        super::describe::planned_param_types(&plan, &q, &mut params)?;
        let schema = match returning {
            Some(items) => Some(self.table_returning_schema(&table, &alias, items).await?),
            None => None,
        };
        Ok(Description { params, schema })
    }

    /// Plan and run a statement in this session's context, collecting rows.
    pub(super) async fn collect_query(
        &self,
        stmt: &Statement,
        params: &[ScalarValue],
    ) -> Result<Vec<RecordBatch>> {
        let mut plan = self.plan(stmt).await?;
        if !params.is_empty() {
            plan = plan.with_param_values(params.to_vec())?;
        }
        let df = self.ctx.execute_logical_plan(plan).await?;
        Ok(df.collect().await?)
    }

    /// RETURNING over the rows a statement wrote (or deleted).
    async fn table_returning(
        &self,
        table: &Table,
        alias: &str,
        rows: Vec<Vec<ScalarValue>>,
        items: &[SelectItem],
        params: &[ScalarValue],
        tag: &str,
    ) -> Result<Output> {
        let batch = rows_batch(table.schema.clone(), table, rows)?;
        let schema = table.schema.clone();
        returning::rows(schema, alias, vec![batch], items, params, tag).await
    }

    /// Result columns of `RETURNING items` for a table (Describe).
    pub(super) async fn table_returning_schema(
        &self,
        table: &Table,
        alias: &str,
        items: &[SelectItem],
    ) -> Result<SchemaRef> {
        returning::schema(table.schema.clone(), alias, items).await
    }

    /// Propose (or buffer) a statement's ops, then answer with its tag
    /// (`<tag> <rows>`) or its RETURNING rows.
    #[allow(clippy::too_many_arguments)]
    async fn finish_change(
        &mut self,
        table: &Table,
        alias: &str,
        ops: Vec<Op>,
        rows: Vec<Vec<ScalarValue>>,
        returning: &Option<Vec<SelectItem>>,
        params: &[ScalarValue],
        tag: &str,
    ) -> Result<Output> {
        let n = rows.len();
        self.write_table(ops).await?;
        match returning {
            None => Ok(Output::Tag(format!("{tag} {n}"))),
            Some(items) => {
                self.table_returning(table, alias, rows, items, params, tag)
                    .await
            }
        }
    }
}

/// One generated query, parsed.
fn parse_query(sql: &str) -> Result<Box<Statement>> {
    match statement::parse(sql)?.into_iter().next() {
        Some(Parsed::Query(q)) => Ok(q),
        _ => Err(Error::internal("generated query did not parse as a query")),
    }
}

/// A generated query planned in `ctx`, with the statement's parameters.
async fn plan_in(
    ctx: &SessionContext,
    sql: &str,
    params: &[ScalarValue],
) -> Result<datafusion::logical_expr::LogicalPlan> {
    let mut plan = ctx
        .state()
        .statement_to_plan(DFStatement::Statement(parse_query(sql)?))
        .await?;
    if !params.is_empty() {
        plan = plan.with_param_values(params.to_vec())?;
    }
    Ok(plan)
}

/// Rows of batches whose first column is a tag (row number or stored key)
/// followed by the table's columns: (tag, row cast to the table's types).
fn lead_and_rows(
    table: &Table,
    batches: &[RecordBatch],
) -> Result<Vec<(ScalarValue, Vec<ScalarValue>)>> {
    let mut out = Vec::new();
    for b in batches {
        let cols = (0..table.types.len())
            .map(|t| cast_to(b.column(t + 1), table, t))
            .collect::<Result<Vec<_>>>()?;
        for i in 0..b.num_rows() {
            let row = cols
                .iter()
                .map(|c| ScalarValue::try_from_array(c, i))
                .collect::<std::result::Result<Vec<_>, _>>()?;
            out.push((ScalarValue::try_from_array(b.column(0), i)?, row));
        }
    }
    Ok(out)
}

/// The keyed-view query behind `UPDATE`: each target row's key and its
/// new values.
fn update_sql(table: &Table, alias: &str, u: &sqlparser::ast::Update) -> Result<String> {
    if !u.table.joins.is_empty() {
        return Err(Error::unsupported(
            "UPDATE with JOIN is not supported; use FROM",
        ));
    }
    let exprs = assigned_row(table, alias, &u.assignments)?;
    let from = match &u.from {
        Some(UpdateTableFromKind::AfterSet(f)) | Some(UpdateTableFromKind::BeforeSet(f)) => {
            f.iter().map(|t| format!(", {t}")).collect::<String>()
        }
        None => String::new(),
    };
    Ok(keyed_select(
        table,
        alias,
        &exprs,
        &from,
        u.selection.as_ref(),
    ))
}

/// The keyed-view query behind `DELETE`: each target row's key and values.
fn delete_sql(table: &Table, alias: &str, d: &sqlparser::ast::Delete) -> Result<String> {
    let (_, _, using) = delete_target(d)?;
    let cols: Vec<String> = table
        .def
        .columns
        .iter()
        .map(|c| column_ref(alias, &c.name))
        .collect();
    Ok(keyed_select(
        table,
        alias,
        &cols,
        &using,
        d.selection.as_ref(),
    ))
}

/// `SELECT <key>, <exprs> FROM <keyed view> AS alias<more> [WHERE ...]`.
fn keyed_select(
    table: &Table,
    alias: &str,
    exprs: &[String],
    more_from: &str,
    selection: Option<&Expr>,
) -> String {
    format!(
        "SELECT {}, {} FROM {} AS {}{more_from}{}",
        column_ref(alias, KEY_COLUMN),
        exprs.join(", "),
        quote(&keyed_name(&table.def.name)),
        quote(alias),
        selection.map(|w| format!(" WHERE {w}")).unwrap_or_default()
    )
}

/// Whole rows of the table from values of its `targets` columns: the others NULL,
/// NOT NULL and the row size checked.
fn full_rows(
    table: &Table,
    targets: &[usize],
    provided: Vec<Vec<ScalarValue>>,
    max_row_bytes: usize,
) -> Result<Vec<Vec<ScalarValue>>> {
    let mut out = Vec::with_capacity(provided.len());
    for p in provided {
        let mut row: Vec<ScalarValue> = table
            .types
            .iter()
            .map(|t| ScalarValue::try_from(&t.arrow_type()))
            .collect::<std::result::Result<_, _>>()?;
        for (v, &t) in p.into_iter().zip(targets) {
            row[t] = v;
        }
        table.check_not_null(&row)?;
        check_row_size(&row, max_row_bytes)?;
        out.push(row);
    }
    Ok(out)
}

/// An array as column `t` of the table: cast and validated.
fn cast_to(a: &ArrayRef, table: &Table, t: usize) -> Result<ArrayRef> {
    let ty = table.types[t];
    let want = ty.arrow_type();
    // text for an array column is read by the array input, not Arrow's cast (which would
    // make '{a,b}' a one-element list)
    let a = if a.data_type() != &want && ty.element().is_none() {
        arrow::compute::cast(a, &want).map_err(|_| {
            Error::new(
                sqlstate::DATATYPE_MISMATCH,
                format!(
                    "column \"{}\" is of type {} but expression is of type {}",
                    table.def.columns[t].name,
                    ty.sql_name(),
                    crate::types::ColumnType::of_arrow(a.data_type())
                        .map(|c| c.sql_name())
                        .unwrap_or_else(|| a.data_type().to_string())
                ),
            )
        })?
    } else {
        a.clone()
    };
    ty.validate_array(&a)
}

fn rows_batch(
    schema: SchemaRef,
    table: &Table,
    rows: Vec<Vec<ScalarValue>>,
) -> Result<RecordBatch> {
    let cols = crate::table::codec::rows_to_arrays(rows, &table.types)?;
    Ok(RecordBatch::try_new(schema, cols)?)
}

/// A MemTable of rows plus their position, for joining existing rows with
/// the proposed (`excluded`) ones.
fn numbered_table(table: &Table, rows: Vec<Vec<ScalarValue>>) -> Result<Arc<MemTable>> {
    let n = rows.len() as i64;
    let mut fields: Vec<Field> = table
        .schema
        .fields()
        .iter()
        .map(|f| f.as_ref().clone())
        .collect();
    fields.push(Field::new(ROW_NUMBER, DataType::Int64, false));
    let schema = Arc::new(Schema::new(fields));
    let mut cols = crate::table::codec::rows_to_arrays(rows, &table.types)?;
    cols.push(Arc::new(Int64Array::from_iter_values(0..n)));
    let batch = RecordBatch::try_new(schema.clone(), cols)?;
    Ok(Arc::new(MemTable::try_new(schema, vec![vec![batch]])?))
}

/// The row `SET col = expr, ...` makes, as a projection over `alias`:
/// each column's new value, or its old one if it is not assigned.
fn assigned_row(
    table: &Table,
    alias: &str,
    list: &[sqlparser::ast::Assignment],
) -> Result<Vec<String>> {
    let assigned = assignments(table, list)?;
    Ok(table
        .def
        .columns
        .iter()
        .enumerate()
        .map(|(i, c)| match assigned.iter().find(|(t, _)| *t == i) {
            Some((_, e)) => format!("{e} AS {}", quote(&c.name)),
            None => column_ref(alias, &c.name),
        })
        .collect())
}

/// Column positions and value expressions of `SET col = expr, ...`.
fn assignments(table: &Table, list: &[sqlparser::ast::Assignment]) -> Result<Vec<(usize, Expr)>> {
    let mut out: Vec<(usize, Expr)> = Vec::new();
    for a in list {
        let AssignmentTarget::ColumnName(n) = &a.target else {
            return Err(Error::unsupported(
                "multiple-column assignment (a, b) = (...) is not supported",
            ));
        };
        let col = statement::table_name(n);
        let i = table
            .def
            .columns
            .iter()
            .position(|c| c.name == col)
            .ok_or_else(|| {
                Error::new(
                    sqlstate::UNDEFINED_COLUMN,
                    format!(
                        "column \"{col}\" of relation \"{}\" does not exist",
                        table.def.name
                    ),
                )
            })?;
        if out.iter().any(|(t, _)| *t == i) {
            return Err(Error::new(
                sqlstate::SYNTAX_ERROR,
                format!("multiple assignments to same column \"{col}\""),
            ));
        }
        out.push((i, a.value.clone()));
    }
    Ok(out)
}

/// Positions of the INSERT's target columns (all columns if none named).
pub(super) fn table_targets(table: &Table, ins: &sqlparser::ast::Insert) -> Result<Vec<usize>> {
    if let Some(n) = super::append::implicit_width(ins, table.def.columns.len())? {
        return Ok((0..n).collect());
    }
    let names: Vec<String> = ins.columns.iter().map(statement::table_name).collect();
    column_positions(&table.def.columns, &table.def.name, &names, |_| Ok(()))
}

/// Table name and alias of `UPDATE t [AS a]`.
pub(super) fn update_target(f: &TableFactor) -> Result<(String, String)> {
    match f {
        TableFactor::Table { name, alias, .. } => {
            let n = statement::table_name(name);
            let a = alias
                .as_ref()
                .map(|a| statement::normalize_ident(&a.name))
                .unwrap_or_else(|| n.clone());
            Ok((n, a))
        }
        other => Err(Error::unsupported(format!(
            "UPDATE of {other} is not supported"
        ))),
    }
}

/// The target name, its alias and a `, <using tables>` suffix of a DELETE.
pub(super) fn delete_target(d: &sqlparser::ast::Delete) -> Result<(String, String, String)> {
    let from = match &d.from {
        FromTable::WithFromKeyword(f) | FromTable::WithoutKeyword(f) => f,
    };
    let Some(first) = from.first() else {
        return Err(Error::syntax("DELETE without a table"));
    };
    if from.len() > 1 || !first.joins.is_empty() {
        return Err(Error::unsupported(
            "DELETE from several tables is not supported; use USING",
        ));
    }
    let (name, alias) = update_target(&first.relation)?;
    let using = d
        .using
        .as_ref()
        .map(|u| u.iter().map(|t| format!(", {t}")).collect::<String>())
        .unwrap_or_default();
    Ok((name, alias, using))
}

fn check_row_size(row: &[ScalarValue], max: usize) -> Result<()> {
    let size: usize = row.iter().map(|v| v.size()).sum();
    if size > max {
        return Err(Error::new(
            sqlstate::PROGRAM_LIMIT_EXCEEDED,
            format!(
                "row of {size} bytes exceeds the maximum row size of {max} bytes (max_row_bytes)"
            ),
        ));
    }
    Ok(())
}
