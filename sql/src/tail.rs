//! Tails: following a stream as rows commit.
//!
//! A query is tailable when it reads one stream, bounds `offset` from below
//! and not from above, and has no aggregation, join, grouping or ordering
//! other than by offset. A [`Tail`] runs such a query chunk by chunk: for
//! each committed range `[pos, end)` it plans the user's query with that
//! range added to its WHERE and lets DataFusion do projection and
//! filtering. A lower bound on `ts` (`WHERE offset >= 0 AND ts >= '...'`)
//! also seeks: the tail starts at the first frame of about that time
//! ([`sluice_storage::StreamLog::offset_at_ts`]), so catching up from a time
//! does not plan every chunk of older history. The common tail — plain columns (or `*`) and nothing in the
//! WHERE but the offset bound — skips planning: it reads the range's frames
//! and picks the columns, so many tails woken by every commit cost little. Positions advance by offset range, so rows are delivered
//! exactly once and in offset order whatever the filter keeps. A tail holds
//! at most one chunk of rows; it reads ahead only when asked, so a client
//! that stops reading stops the tail (TCP backpressure) and costs nothing.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use arrow::array::RecordBatch;
use arrow::datatypes::{Schema, SchemaRef};
use datafusion::execution::context::SessionContext;
use datafusion::execution::SendableRecordBatchStream;
use datafusion::scalar::ScalarValue;
use datafusion::sql::parser::Statement as DFStatement;
use futures::StreamExt;
use sqlparser::ast::{
    BinaryOperator, Expr, Ident, LimitClause, Query, SelectItem, SetExpr, Statement, TableFactor,
    Value, WildcardAdditionalOptions,
};
use tokio::sync::watch;

use crate::catalog::{Catalog, Current, Stream};
use crate::definition::{OFFSET_COLUMN, TS_COLUMN};
use crate::error::{sqlstate, Error, Result};
use crate::interrupt::{cancelled_error, CancelWatch};
use crate::statement::{self, sqlparser};
use crate::types::ColumnType;

/// Offsets covered by one planned chunk.
const CHUNK_OFFSETS: u64 = 65_536;

/// How much earlier than a `ts` bound a tail starts reading: the bound is read as UTC here,
/// the query reads it in the session's time zone (at most a day away, daylight saving
/// included). Rows in between are read and filtered out by the query; none is skipped.
const SEEK_MARGIN_MICROS: i64 = 26 * 3600 * 1_000_000;

/// A tailable query, recognized.
#[derive(Debug, Clone)]
pub struct TailSpec {
    pub stream: String,
    /// The query without LIMIT and ORDER BY.
    pub query: Query,
    /// First offset to deliver.
    pub from: u64,
    /// A `ts` the rows delivered are at or after, less `SEEK_MARGIN_MICROS` (µs): the
    /// tail starts no earlier than the first frame stamped then.
    pub ts_from: Option<i64>,
    pub limit: Option<usize>,
}

/// Recognize a tailable query (see the module docs); `None` means it runs
/// as an ordinary snapshot.
pub fn tail_spec(q: &Query, params: &[ScalarValue]) -> Option<TailSpec> {
    if q.with.is_some() || q.fetch.is_some() || !q.locks.is_empty() {
        return None;
    }
    let SetExpr::Select(select) = q.body.as_ref() else {
        return None;
    };
    if select.from.len() != 1
        || !select.from[0].joins.is_empty()
        || select.distinct.is_some()
        || select.having.is_some()
        || !matches!(&select.group_by, sqlparser::ast::GroupByExpr::Expressions(e, _) if e.is_empty())
    {
        return None;
    }
    let TableFactor::Table {
        name, args: None, ..
    } = &select.from[0].relation
    else {
        return None;
    };
    let stream = statement::table_name(name);
    if select.projection.iter().any(has_aggregate_or_window) {
        return None;
    }
    if let Some(ob) = &q.order_by {
        match &ob.kind {
            sqlparser::ast::OrderByKind::Expressions(exprs) => {
                let only_offset_asc = exprs
                    .iter()
                    .all(|e| is_offset(&e.expr) && e.options.asc != Some(false));
                if !only_offset_asc {
                    return None;
                }
            }
            _ => return None,
        }
    }
    let selection = select.selection.as_ref()?;
    let mut lower: Option<u64> = None;
    let mut ts_from: Option<i64> = None;
    let mut conjuncts = Vec::new();
    split_and(selection, &mut conjuncts);
    for c in &conjuncts {
        match c {
            Expr::BinaryOp { left, op, right } => {
                if let Some(t) = ts_lower_bound(left, op, right, params) {
                    ts_from = Some(ts_from.map_or(t, |f| f.max(t)));
                    continue;
                }
                let (col, op, val) = if is_offset(left) {
                    (true, op.clone(), right.as_ref())
                } else if is_offset(right) {
                    (true, flip(op)?, left.as_ref())
                } else {
                    (false, op.clone(), right.as_ref())
                };
                if !col {
                    continue;
                }
                let n = literal_i128(val, params)?;
                match op {
                    BinaryOperator::Gt => {
                        lower = Some(lower.unwrap_or(0).max((n + 1).max(0) as u64))
                    }
                    BinaryOperator::GtEq => lower = Some(lower.unwrap_or(0).max(n.max(0) as u64)),
                    _ => return None, // an upper bound or equality: a snapshot
                }
            }
            Expr::Between { expr, .. } if is_offset(expr) => return None,
            _ => {}
        }
    }
    let from = lower?;
    let limit = match &q.limit_clause {
        None => None,
        Some(LimitClause::LimitOffset {
            limit: None,
            offset: None,
            limit_by,
        }) if limit_by.is_empty() => None,
        Some(LimitClause::LimitOffset {
            limit: Some(e),
            offset: None,
            limit_by,
        }) if limit_by.is_empty() => Some(literal_i128(e, params)?.max(0) as usize),
        Some(_) => return None,
    };
    let mut query = q.clone();
    query.limit_clause = None;
    query.order_by = None;
    Some(TailSpec {
        stream,
        query,
        from,
        ts_from,
        limit,
    })
}

/// `ts > X` or `ts >= X` (either way round) with X a timestamp literal or parameter: X less
/// [`SEEK_MARGIN_MICROS`].
fn ts_lower_bound(
    left: &Expr,
    op: &BinaryOperator,
    right: &Expr,
    params: &[ScalarValue],
) -> Option<i64> {
    let (op, value) = if is_column(left, TS_COLUMN) {
        (op.clone(), right)
    } else if is_column(right, TS_COLUMN) {
        (flip(op)?, left)
    } else {
        return None;
    };
    if !matches!(op, BinaryOperator::Gt | BinaryOperator::GtEq) {
        return None;
    }
    Some(literal_ts(value, params)?.saturating_sub(SEEK_MARGIN_MICROS))
}

/// A timestamp a literal or parameter holds, in µs (text read as UTC when it names no zone).
fn literal_ts(e: &Expr, params: &[ScalarValue]) -> Option<i64> {
    let parse = |text: &str| match ColumnType::Timestamptz.parse_text(text) {
        Ok(ScalarValue::TimestampMicrosecond(Some(t), _)) => Some(t),
        _ => None,
    };
    match e {
        Expr::Value(v) => match &v.value {
            Value::SingleQuotedString(text) => parse(text),
            Value::Placeholder(p) => {
                let i: usize = p.trim_start_matches('$').parse().ok()?;
                match params.get(i.checked_sub(1)?)? {
                    ScalarValue::Utf8(Some(text)) => parse(text),
                    ScalarValue::TimestampMicrosecond(Some(t), _) => Some(*t),
                    _ => None,
                }
            }
            _ => None,
        },
        Expr::TypedString(t) => match &t.value.value {
            Value::SingleQuotedString(text) => parse(text),
            _ => None,
        },
        Expr::Cast { expr, .. } | Expr::Nested(expr) => literal_ts(expr, params),
        _ => None,
    }
}

fn has_aggregate_or_window(item: &sqlparser::ast::SelectItem) -> bool {
    let text = item.to_string().to_lowercase();
    [
        "count(",
        "sum(",
        "avg(",
        "min(",
        "max(",
        "array_agg(",
        "string_agg(",
        " over ",
        "over(",
        "bool_and(",
        "bool_or(",
        "stddev",
        "variance(",
        "median(",
        "first_value(",
        "last_value(",
    ]
    .iter()
    .any(|f| text.contains(f))
}

fn split_and<'a>(e: &'a Expr, out: &mut Vec<&'a Expr>) {
    match e {
        Expr::BinaryOp {
            left,
            op: BinaryOperator::And,
            right,
        } => {
            split_and(left, out);
            split_and(right, out);
        }
        Expr::Nested(inner) => split_and(inner, out),
        other => out.push(other),
    }
}

fn is_offset(e: &Expr) -> bool {
    is_column(e, OFFSET_COLUMN)
}

fn is_column(e: &Expr, name: &str) -> bool {
    match e {
        Expr::Identifier(id) => statement::normalize_ident(id) == name,
        Expr::CompoundIdentifier(ids) => ids
            .last()
            .map(|i| statement::normalize_ident(i) == name)
            .unwrap_or(false),
        Expr::Nested(inner) => is_column(inner, name),
        _ => false,
    }
}

fn flip(op: &BinaryOperator) -> Option<BinaryOperator> {
    Some(match op {
        BinaryOperator::Lt => BinaryOperator::Gt,
        BinaryOperator::LtEq => BinaryOperator::GtEq,
        BinaryOperator::Gt => BinaryOperator::Lt,
        BinaryOperator::GtEq => BinaryOperator::LtEq,
        BinaryOperator::Eq => BinaryOperator::Eq,
        _ => return None,
    })
}

fn literal_i128(e: &Expr, params: &[ScalarValue]) -> Option<i128> {
    match e {
        Expr::Value(v) => match &v.value {
            Value::Number(n, _) => n.parse().ok(),
            Value::SingleQuotedString(s) => s.trim().parse().ok(),
            Value::Placeholder(p) => {
                let i: usize = p.trim_start_matches('$').parse().ok()?;
                match params.get(i.checked_sub(1)?)? {
                    ScalarValue::Int16(Some(x)) => Some(*x as i128),
                    ScalarValue::Int32(Some(x)) => Some(*x as i128),
                    ScalarValue::Int64(Some(x)) => Some(*x as i128),
                    ScalarValue::Utf8(Some(s)) => s.trim().parse().ok(),
                    ScalarValue::Decimal128(Some(x), _, s) => Some(*x / 10i128.pow(*s as u32)),
                    _ => None,
                }
            }
            _ => None,
        },
        Expr::UnaryOp {
            op: sqlparser::ast::UnaryOperator::Minus,
            expr,
        } => literal_i128(expr, params).map(|v| -v),
        Expr::Nested(inner) => literal_i128(inner, params),
        Expr::Cast { expr, .. } => literal_i128(expr, params),
        _ => None,
    }
}

/// A running tail over one stream.
pub struct Tail {
    catalog: Arc<Catalog>,
    stream: Arc<Stream>,
    ctx: SessionContext,
    query: Query,
    params: Vec<ScalarValue>,
    pos: u64,
    remaining: Option<usize>,
    buffered: VecDeque<RecordBatch>,
    advanced: watch::Receiver<u64>,
    /// Changes when a snapshot install replaced every stream (see [`Catalog::current`]).
    restores: watch::Receiver<u64>,
    schema: SchemaRef,
    /// Columns of the stream's full schema the query returns, when it reads them directly
    /// (see [`direct_columns`]).
    direct: Option<Vec<usize>>,
}

impl std::fmt::Debug for Tail {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tail")
            .field("stream", &self.stream.name())
            .field("pos", &self.pos)
            .finish()
    }
}

impl Tail {
    /// Starts a tail. `may_read_directly` is false when the query must see more than the
    /// committed frames (a transaction block's own pending rows).
    pub async fn start(
        catalog: Arc<Catalog>,
        ctx: SessionContext,
        spec: TailSpec,
        params: Vec<ScalarValue>,
        may_read_directly: bool,
    ) -> Result<Tail> {
        let stream = catalog
            .get(&spec.stream)
            .ok_or_else(|| Error::undefined_table(&spec.stream))?;
        let advanced = stream.subscribe();
        let restores = catalog.restores();
        let from = match spec.ts_from {
            Some(t) => spec.from.max(stream.log.offset_at_ts(t)),
            None => spec.from,
        };
        let mut tail = Tail {
            catalog,
            stream,
            ctx,
            query: spec.query,
            params,
            pos: from,
            remaining: spec.limit,
            buffered: VecDeque::new(),
            advanced,
            restores,
            schema: Arc::new(arrow::datatypes::Schema::empty()),
            direct: None,
        };
        // plan an empty range once: validates the query and fixes the schema
        let (schema, _) = tail.run_chunk(0, 0).await?;
        // the tail keeps the columns it started with, whatever an ALTER adds later
        expand_wildcard(&mut tail.query, &schema);
        if may_read_directly {
            tail.direct = direct_columns(&tail.query, &tail.stream.full_schema, &schema);
        }
        tail.schema = schema;
        Ok(tail)
    }

    /// Rows of `[from, to)` read straight from the frames, projected to the query's columns.
    fn read_direct(&self, columns: &[usize], from: u64, to: u64) -> Result<Vec<RecordBatch>> {
        let mut out = Vec::new();
        for meta in self.stream.log.batches(from, to) {
            let frame = crate::stream_provider::read_frame(&self.stream, &meta, from, to)?;
            if frame.num_rows() > 0 {
                let picked = columns.iter().map(|&i| frame.column(i).clone()).collect();
                out.push(RecordBatch::try_new(self.schema.clone(), picked)?);
            }
        }
        Ok(out)
    }

    pub fn schema(&self) -> SchemaRef {
        self.schema.clone()
    }

    /// Next offset the tail will look at.
    pub fn position(&self) -> u64 {
        self.pos
    }

    /// The LIMIT has been reached.
    pub fn finished(&self) -> bool {
        self.remaining == Some(0)
    }

    async fn run_chunk(
        &self,
        from: u64,
        to: u64,
    ) -> Result<(SchemaRef, SendableRecordBatchStream)> {
        let mut q = self.query.clone();
        if let SetExpr::Select(select) = q.body.as_mut() {
            let range = range_expr(from, to);
            select.selection = Some(match select.selection.take() {
                Some(orig) => Expr::BinaryOp {
                    left: Box::new(Expr::Nested(Box::new(orig))),
                    op: BinaryOperator::And,
                    right: Box::new(range),
                },
                None => range,
            });
        }
        // rows of one chunk in offset order, whatever DataFusion's partitioning
        q.order_by = Some(sqlparser::ast::OrderBy {
            kind: sqlparser::ast::OrderByKind::Expressions(vec![sqlparser::ast::OrderByExpr {
                expr: Expr::Identifier(Ident::with_quote('"', OFFSET_COLUMN)),
                options: sqlparser::ast::OrderByOptions {
                    asc: Some(true),
                    nulls_first: None,
                },
                with_fill: None,
            }]),
            interpolate: None,
        });
        let mut stmt = Statement::Query(Box::new(q));
        if self.catalog.has_views() {
            crate::views::expand(&mut stmt, &|n| self.catalog.view(n))?;
        }
        let mut plan = self
            .ctx
            .state()
            .statement_to_plan(DFStatement::Statement(Box::new(stmt)))
            .await?;
        if !self.params.is_empty() {
            plan = plan.with_param_values(self.params.clone())?;
        }
        let df = self.ctx.execute_logical_plan(plan).await?;
        let schema: SchemaRef = Arc::new(df.schema().as_arrow().clone());
        Ok((schema, df.execute_stream().await?))
    }

    /// Follows the stream through a snapshot install (the catalog then holds a new handle
    /// for it) and checks that it still exists and still holds the tail's position. False
    /// while an install is under way: nothing can be read until it ends.
    fn check_stream(&mut self) -> Result<bool> {
        match self.catalog.current(&self.stream) {
            Current::Stream(s) => {
                if !Arc::ptr_eq(&s, &self.stream) {
                    self.advanced = s.subscribe();
                    self.stream = s;
                }
            }
            Current::Restoring => return Ok(false),
            Current::Gone => {
                return Err(Error::new(
                    sqlstate::UNDEFINED_TABLE,
                    format!(
                        "stream \"{}\" was dropped while being tailed",
                        self.stream.name()
                    ),
                ))
            }
        }
        let first = self.stream.log.first_offset();
        if self.pos < first {
            return Err(Error::new(
                sqlstate::INVALID_PARAMETER_VALUE,
                format!(
                    "offset {} of stream \"{}\" is no longer retained: the first retained offset is {first}",
                    self.pos,
                    self.stream.name()
                ),
            ));
        }
        Ok(true)
    }

    /// Rows committed now, at most `max_rows`; never waits for new commits.
    pub async fn poll(&mut self, max_rows: usize) -> Result<Vec<RecordBatch>> {
        let mut out = Vec::new();
        let mut want = match self.remaining {
            Some(r) => max_rows.min(r),
            None => max_rows,
        };
        while want > 0 {
            if let Some(b) = self.buffered.pop_front() {
                let take = b.num_rows().min(want);
                if take < b.num_rows() {
                    self.buffered.push_front(b.slice(take, b.num_rows() - take));
                }
                want -= take;
                if let Some(r) = self.remaining.as_mut() {
                    *r -= take;
                }
                out.push(b.slice(0, take));
                continue;
            }
            if !self.check_stream()? {
                break;
            }
            let end = self.stream.log.next_offset();
            if self.pos >= end {
                break;
            }
            let to = end.min(self.pos + CHUNK_OFFSETS);
            if let Some(columns) = &self.direct {
                let batches = self.read_direct(columns, self.pos, to)?;
                self.buffered.extend(batches);
            } else {
                let (schema, mut rows) = self.run_chunk(self.pos, to).await?;
                if !same_columns(&schema, &self.schema) {
                    // an ALTER added or renamed columns the query's shape depends on
                    return Err(Error::unsupported(format!(
                        "stream \"{}\" was altered while it was tailed; start the tail again",
                        self.stream.name()
                    )));
                }
                while let Some(b) = rows.next().await {
                    let b = b?;
                    if b.num_rows() > 0 {
                        self.buffered.push_back(b);
                    }
                }
            }
            self.pos = to;
        }
        Ok(out)
    }

    /// Wait until rows past the position are committed, the timeout passes
    /// (false), or the client cancels (error).
    pub async fn wait(
        &mut self,
        timeout: Option<Duration>,
        cancel: &mut CancelWatch,
    ) -> Result<bool> {
        let deadline = timeout.map(|t| tokio::time::Instant::now() + t);
        loop {
            let live = self.check_stream()?;
            if !self.buffered.is_empty() || (live && self.stream.log.next_offset() > self.pos) {
                return Ok(true);
            }
            // wake at least every second to notice a dropped stream
            let tick = tokio::time::Instant::now() + Duration::from_secs(1);
            let until = deadline.map(|d| d.min(tick)).unwrap_or(tick);
            tokio::select! {
                _ = self.advanced.changed() => {}
                _ = self.restores.changed() => {}
                _ = tokio::time::sleep_until(until) => {}
                _ = cancel.wait() => return Err(cancelled_error()),
            }
            if let Some(d) = deadline {
                if tokio::time::Instant::now() >= d
                    && self.stream.log.next_offset() <= self.pos
                    && self.buffered.is_empty()
                {
                    return Ok(false);
                }
            }
        }
    }

    /// The tail as an endless stream of batches (until LIMIT, cancel or error).
    pub fn into_stream(self, cancel: CancelWatch) -> SendableRecordBatchStream {
        let schema = self.schema.clone();
        let s = futures::stream::unfold(
            (self, cancel, false),
            |(mut tail, mut cancel, done)| async move {
                if done || tail.finished() {
                    return None;
                }
                loop {
                    if cancel.cancelled() {
                        return Some((Err(cancelled_error()), (tail, cancel, true)));
                    }
                    match tail.poll(8192).await {
                        Err(e) => return Some((Err(e), (tail, cancel, true))),
                        Ok(batches) if !batches.is_empty() => {
                            let schema = tail.schema();
                            let batch = match arrow::compute::concat_batches(&schema, &batches) {
                                Ok(b) => Ok(b),
                                Err(e) => Err(Error::from(e)),
                            };
                            return Some((batch, (tail, cancel, false)));
                        }
                        Ok(_) => {
                            if tail.finished() {
                                return None;
                            }
                            if let Err(e) = tail.wait(None, &mut cancel).await {
                                return Some((Err(e), (tail, cancel, true)));
                            }
                        }
                    }
                }
            },
        );
        let s = s.map(|r| r.map_err(|e| datafusion::error::DataFusionError::External(Box::new(e))));
        Box::pin(datafusion::physical_plan::stream::RecordBatchStreamAdapter::new(schema, s))
    }
}

/// The columns of `full` (the stream's schema) that a tail query returns, in order, when the
/// query is a plain column list or `*` and its WHERE holds nothing but offset bounds (which
/// [`tail_spec`] has checked are lower bounds), and the planned `output` schema has exactly
/// those types. `None`: the tail plans each chunk with DataFusion.
fn direct_columns(query: &Query, full: &Schema, output: &Schema) -> Option<Vec<usize>> {
    let SetExpr::Select(select) = query.body.as_ref() else {
        return None;
    };
    if select.top.is_some() || select.into.is_some() || select.prewhere.is_some() {
        return None;
    }
    let mut conjuncts = Vec::new();
    split_and(select.selection.as_ref()?, &mut conjuncts);
    let only_offset = conjuncts.iter().all(
        |c| matches!(c, Expr::BinaryOp { left, right, .. } if is_offset(left) || is_offset(right)),
    );
    if !only_offset {
        return None;
    }
    let mut columns = Vec::new();
    for item in &select.projection {
        match item {
            SelectItem::Wildcard(options) if *options == WildcardAdditionalOptions::default() => {
                columns.extend(0..full.fields().len())
            }
            SelectItem::UnnamedExpr(Expr::Identifier(id)) => {
                columns.push(full.index_of(&statement::normalize_ident(id)).ok()?)
            }
            _ => return None,
        }
    }
    let same_types = columns.len() == output.fields().len()
        && columns
            .iter()
            .zip(output.fields())
            .all(|(&i, f)| full.field(i).data_type() == f.data_type());
    same_types.then_some(columns)
}

/// `SELECT *` as the list of the columns `schema` has now.
fn expand_wildcard(query: &mut Query, schema: &Schema) {
    let SetExpr::Select(select) = query.body.as_mut() else {
        return;
    };
    let star = matches!(select.projection.as_slice(),
        [SelectItem::Wildcard(options)] if *options == WildcardAdditionalOptions::default());
    if star {
        select.projection = schema
            .fields()
            .iter()
            .map(|f| SelectItem::UnnamedExpr(Expr::Identifier(Ident::with_quote('"', f.name()))))
            .collect();
    }
}

fn range_expr(from: u64, to: u64) -> Expr {
    let col = || Box::new(Expr::Identifier(Ident::with_quote('"', OFFSET_COLUMN)));
    let num = |n: u64| Box::new(Expr::value(Value::Number(n.to_string(), false)));
    Expr::BinaryOp {
        left: Box::new(Expr::BinaryOp {
            left: col(),
            op: BinaryOperator::GtEq,
            right: num(from),
        }),
        op: BinaryOperator::And,
        right: Box::new(Expr::BinaryOp {
            left: col(),
            op: BinaryOperator::Lt,
            right: num(to),
        }),
    }
}

/// Whether two row shapes have the same column names and types, in order.
fn same_columns(a: &SchemaRef, b: &SchemaRef) -> bool {
    a.fields().len() == b.fields().len()
        && a.fields()
            .iter()
            .zip(b.fields())
            .all(|(x, y)| x.name() == y.name() && x.data_type() == y.data_type())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::statement::Parsed;

    fn spec(sql: &str) -> Option<TailSpec> {
        match statement::parse(sql).unwrap().remove(0) {
            Parsed::Query(stmt) => match *stmt {
                Statement::Query(q) => tail_spec(&q, &[ScalarValue::Int64(Some(7))]),
                _ => None,
            },
            _ => None,
        }
    }

    #[test]
    fn recognizes_tailable_queries() {
        let s = spec("SELECT offset, customer FROM orders WHERE offset > 1").unwrap();
        assert_eq!((s.stream.as_str(), s.from, s.limit), ("orders", 2, None));
        let s = spec("SELECT * FROM orders WHERE amount > 3 AND offset >= $1 LIMIT 5").unwrap();
        assert_eq!((s.from, s.limit), (7, Some(5)));
        assert_eq!(
            spec("SELECT * FROM orders WHERE 10 < offset").unwrap().from,
            11
        );
    }

    #[test]
    fn a_ts_lower_bound_seeks_a_day_early() {
        let hour = 3600 * 1_000_000i64;
        let at = |sql: &str| spec(sql).and_then(|s| s.ts_from);
        let t = 1_700_000_000_000_000i64; // 2023-11-14 22:13:20 UTC
        for sql in [
            "SELECT * FROM o WHERE offset >= 0 AND ts >= '2023-11-14 22:13:20+00'",
            "SELECT * FROM o WHERE offset >= 0 AND '2023-11-14 22:13:20' <= ts",
            "SELECT * FROM o WHERE ts > timestamptz '2023-11-14 22:13:20Z' AND offset > 1",
            "SELECT * FROM o WHERE offset >= 0 AND ts >= '2023-11-14 22:13:20'::timestamptz",
        ] {
            assert_eq!(at(sql), Some(t - 26 * hour), "{sql}");
        }
        // the later of two bounds; an upper bound or a non-literal does not seek
        assert_eq!(
            at("SELECT * FROM o WHERE offset >= 0 AND ts >= '2023-11-14 22:13:20Z' AND ts > '2023-11-15 22:13:20Z'"),
            Some(t + 24 * hour - 26 * hour)
        );
        assert_eq!(
            at("SELECT * FROM o WHERE offset >= 0 AND ts <= '2023-11-14 22:13:20Z'"),
            None
        );
        assert_eq!(
            at("SELECT * FROM o WHERE offset >= 0 AND ts >= now()"),
            None
        );
    }

    #[test]
    fn everything_else_is_a_snapshot() {
        assert!(spec("SELECT * FROM orders").is_none());
        assert!(spec("SELECT * FROM orders WHERE offset > 1 AND offset < 10").is_none());
        assert!(spec("SELECT count(*) FROM orders WHERE offset > 1").is_none());
        assert!(spec("SELECT * FROM orders WHERE offset > 1 ORDER BY amount").is_none());
        assert!(spec("SELECT * FROM a JOIN b ON a.x = b.x WHERE offset > 1").is_none());
        assert!(spec("SELECT * FROM orders WHERE offset = 5").is_none());
    }

    #[test]
    fn plain_column_tails_read_frames_directly() {
        use arrow::datatypes::{DataType, Field};
        let full = Schema::new(vec![
            Field::new("offset", DataType::Int64, false),
            Field::new("customer", DataType::Utf8, false),
            Field::new("Amount", DataType::Float64, true),
        ]);
        // what DataFusion would plan: the picked fields, in order
        let planned = |cols: &[usize]| {
            Schema::new(
                cols.iter()
                    .map(|&i| full.field(i).clone())
                    .collect::<Vec<_>>(),
            )
        };
        let direct = |sql: &str, cols: &[usize]| {
            direct_columns(&spec(sql).unwrap().query, &full, &planned(cols))
        };
        assert_eq!(
            direct("SELECT * FROM orders WHERE offset > 1", &[0, 1, 2]),
            Some(vec![0, 1, 2])
        );
        assert_eq!(
            direct(
                "SELECT \"Amount\", offset FROM orders WHERE offset >= $1 LIMIT 3",
                &[2, 0]
            ),
            Some(vec![2, 0])
        );
        assert_eq!(
            direct("SELECT CUSTOMER FROM orders WHERE 4 < offset", &[1]),
            Some(vec![1])
        );
        // anything DataFusion must compute or filter is planned per chunk
        assert_eq!(
            direct(
                "SELECT * FROM orders WHERE customer = 'a' AND offset > 1",
                &[0, 1, 2]
            ),
            None
        );
        assert_eq!(
            direct("SELECT customer AS c FROM orders WHERE offset > 1", &[1]),
            None
        );
        assert_eq!(
            direct("SELECT upper(customer) FROM orders WHERE offset > 1", &[1]),
            None
        );
        assert_eq!(
            direct("SELECT amount FROM orders WHERE offset > 1", &[2]),
            None,
            "unquoted folds to lower case"
        );
        // a planned type that differs (e.g. a cast the planner added) is not read directly
        let other = Schema::new(vec![Field::new("customer", DataType::LargeUtf8, false)]);
        let q = spec("SELECT customer FROM orders WHERE offset > 1")
            .unwrap()
            .query;
        assert_eq!(direct_columns(&q, &full, &other), None);
    }
}
