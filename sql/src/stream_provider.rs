//! DataFusion's view of a stream: a table provider that scans segments and
//! a sink that turns an INSERT plan's rows into pending appends.
//!
//! A scan is a snapshot: it fixes the stream's `next_offset` when planned
//! and never reads past it, so it always terminates. Range predicates on
//! `offset` and `ts` are pushed down (inexactly: DataFusion re-checks them)
//! and used to skip whole frames via the stream's index, so `WHERE offset >
//! n` reads only the frames at or after n. Frames are read lazily, one at a
//! time, so memory stays bounded by one frame plus what the query keeps.

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;

use arrow::array::{ArrayRef, Int64Array, RecordBatch, TimestampMicrosecondArray};
use arrow::datatypes::SchemaRef;
use async_trait::async_trait;
use datafusion::catalog::Session;
use datafusion::datasource::sink::{DataSink, DataSinkExec};
use datafusion::datasource::{TableProvider, TableType};
use datafusion::error::{DataFusionError, Result as DFResult};
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::logical_expr::dml::InsertOp;
use datafusion::logical_expr::{BinaryExpr, Expr, Operator, TableProviderFilterPushDown};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::streaming::{PartitionStream, StreamingTableExec};
use datafusion::physical_plan::{DisplayAs, DisplayFormatType, ExecutionPlan};
use datafusion::scalar::ScalarValue;
use futures::StreamExt;
use parking_lot::Mutex;
use sluice_storage::BatchMeta;

use crate::catalog::Stream;
use crate::definition::{OFFSET_COLUMN, TS_COLUMN};
use crate::error::Error;
use crate::pushdown::{column_cmp, inexact_where};

/// The table provider of one stream.
#[derive(Debug)]
pub struct StreamTable {
    stream: Arc<Stream>,
    /// Rows the reading transaction appended but has not committed (user
    /// columns): scanned after the committed rows, `offset`/`ts` NULL.
    pending: Vec<RecordBatch>,
    /// Column defaults, for INSERTs DataFusion plans that omit the column.
    defaults: HashMap<String, Expr>,
}

impl StreamTable {
    pub fn new(stream: Arc<Stream>) -> StreamTable {
        let defaults = stream
            .def
            .columns
            .iter()
            .enumerate()
            .filter_map(|(i, c)| {
                let v = stream.default_value(i)?.clone();
                Some((c.name.clone(), datafusion::logical_expr::lit(v)))
            })
            .collect();
        StreamTable {
            stream,
            pending: Vec::new(),
            defaults,
        }
    }

    pub fn with_pending(mut self, pending: Vec<RecordBatch>) -> StreamTable {
        self.pending = pending;
        self
    }
}

/// Offset and ts bounds extracted from pushed-down filters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ScanBounds {
    /// Inclusive lower offset bound.
    pub from: u64,
    /// Exclusive upper offset bound.
    pub to: u64,
    pub ts_min: i64,
    pub ts_max: i64,
}

impl Default for ScanBounds {
    fn default() -> Self {
        ScanBounds {
            from: 0,
            to: u64::MAX,
            ts_min: i64::MIN,
            ts_max: i64::MAX,
        }
    }
}

impl ScanBounds {
    pub fn from_filters(filters: &[Expr]) -> ScanBounds {
        let mut b = ScanBounds::default();
        for f in filters {
            b.narrow(f);
        }
        b
    }

    fn narrow(&mut self, e: &Expr) {
        match e {
            Expr::BinaryExpr(BinaryExpr {
                left,
                op: Operator::And,
                right,
            }) => {
                self.narrow(left);
                self.narrow(right);
            }
            Expr::BinaryExpr(BinaryExpr { left, op, right }) => {
                if let Some((col, op, v)) = column_cmp(left, *op, right) {
                    if col == OFFSET_COLUMN {
                        if let Some(n) = as_i128(&v) {
                            self.offset(op, n);
                        }
                    } else if col == TS_COLUMN {
                        if let Some(t) = as_micros(&v) {
                            self.ts(op, t);
                        }
                    }
                }
            }
            Expr::Between(bt) if !bt.negated => {
                if let Expr::Column(c) = bt.expr.as_ref() {
                    let lo = Expr::BinaryExpr(BinaryExpr::new(
                        bt.expr.clone(),
                        Operator::GtEq,
                        bt.low.clone(),
                    ));
                    let hi = Expr::BinaryExpr(BinaryExpr::new(
                        bt.expr.clone(),
                        Operator::LtEq,
                        bt.high.clone(),
                    ));
                    if c.name == OFFSET_COLUMN || c.name == TS_COLUMN {
                        self.narrow(&lo);
                        self.narrow(&hi);
                    }
                }
            }
            _ => {}
        }
    }

    fn offset(&mut self, op: Operator, n: i128) {
        let clamp = |x: i128| x.clamp(0, u64::MAX as i128) as u64;
        match op {
            Operator::Gt => self.from = self.from.max(clamp(n + 1)),
            Operator::GtEq => self.from = self.from.max(clamp(n)),
            Operator::Lt => self.to = self.to.min(clamp(n)),
            Operator::LtEq => self.to = self.to.min(clamp(n + 1)),
            Operator::Eq => {
                self.from = self.from.max(clamp(n));
                self.to = self.to.min(clamp(n + 1));
            }
            _ => {}
        }
    }

    fn ts(&mut self, op: Operator, t: i64) {
        match op {
            Operator::Gt | Operator::GtEq => self.ts_min = self.ts_min.max(t),
            Operator::Lt | Operator::LtEq => self.ts_max = self.ts_max.min(t),
            Operator::Eq => {
                self.ts_min = self.ts_min.max(t);
                self.ts_max = self.ts_max.min(t);
            }
            _ => {}
        }
    }

    fn wants_frame(&self, m: &BatchMeta) -> bool {
        m.ts_micros >= self.ts_min && m.ts_micros <= self.ts_max
    }
}

fn as_i128(v: &ScalarValue) -> Option<i128> {
    match v {
        ScalarValue::Int8(Some(x)) => Some(*x as i128),
        ScalarValue::Int16(Some(x)) => Some(*x as i128),
        ScalarValue::Int32(Some(x)) => Some(*x as i128),
        ScalarValue::Int64(Some(x)) => Some(*x as i128),
        ScalarValue::UInt8(Some(x)) => Some(*x as i128),
        ScalarValue::UInt16(Some(x)) => Some(*x as i128),
        ScalarValue::UInt32(Some(x)) => Some(*x as i128),
        ScalarValue::UInt64(Some(x)) => Some(*x as i128),
        _ => None,
    }
}

fn as_micros(v: &ScalarValue) -> Option<i64> {
    match v {
        ScalarValue::TimestampSecond(Some(x), _) => x.checked_mul(1_000_000),
        ScalarValue::TimestampMillisecond(Some(x), _) => x.checked_mul(1_000),
        ScalarValue::TimestampMicrosecond(Some(x), _) => Some(*x),
        // round outward so the bound never excludes a matching row
        ScalarValue::TimestampNanosecond(Some(x), _) => Some(x.div_euclid(1_000)),
        _ => None,
    }
}

fn is_bound_filter(e: &Expr) -> bool {
    match e {
        Expr::BinaryExpr(BinaryExpr { left, op, right }) => column_cmp(left, *op, right)
            .map(|(c, _, _)| c == OFFSET_COLUMN || c == TS_COLUMN)
            .unwrap_or(false),
        Expr::Between(bt) => {
            matches!(bt.expr.as_ref(), Expr::Column(c) if c.name == OFFSET_COLUMN || c.name == TS_COLUMN)
        }
        _ => false,
    }
}

#[async_trait]
impl TableProvider for StreamTable {
    fn schema(&self) -> SchemaRef {
        self.stream.full_schema.clone()
    }

    fn table_type(&self) -> TableType {
        TableType::Base
    }

    fn get_column_default(&self, column: &str) -> Option<&Expr> {
        self.defaults.get(column)
    }

    fn supports_filters_pushdown(
        &self,
        filters: &[&Expr],
    ) -> DFResult<Vec<TableProviderFilterPushDown>> {
        Ok(inexact_where(filters, is_bound_filter))
    }

    async fn scan(
        &self,
        _state: &dyn Session,
        projection: Option<&Vec<usize>>,
        filters: &[Expr],
        limit: Option<usize>,
    ) -> DFResult<Arc<dyn ExecutionPlan>> {
        let bounds = ScanBounds::from_filters(filters);
        let snapshot_end = self.stream.log.next_offset();
        let external = |e: Error| DataFusionError::External(Box::new(e));
        let columns = Projection::new(&self.stream, projection).map_err(external)?;
        let pending = self
            .pending
            .iter()
            .map(|b| uncommitted_rows(&self.stream, b).and_then(|full| columns.of_full(&full)))
            .collect::<Result<Vec<_>, Error>>()
            .map_err(external)?;
        let schema = columns.schema.clone();
        let partition = SegmentScan {
            stream: self.stream.clone(),
            bounds,
            end: snapshot_end,
            columns,
            pending,
        };
        // Rows come out in offset order: say so when `offset` is projected,
        // so `ORDER BY offset` (tails, consumers) needs no sort.
        let offset_at = match projection {
            Some(p) => p.iter().position(|&i| i == 0),
            None => Some(0),
        };
        let ordering = offset_at.and_then(|at| {
            datafusion::physical_expr::LexOrdering::new(vec![
                datafusion::physical_expr::PhysicalSortExpr::new(
                    Arc::new(datafusion::physical_expr::expressions::Column::new(
                        OFFSET_COLUMN,
                        at,
                    )),
                    // ASC NULLS LAST is what `ORDER BY offset` asks for (and
                    // offset is never NULL)
                    arrow::compute::SortOptions {
                        descending: false,
                        nulls_first: false,
                    },
                ),
            ])
        });
        Ok(Arc::new(StreamingTableExec::try_new(
            schema,
            vec![Arc::new(partition)],
            None, // the partition projects
            ordering,
            false,
            limit,
        )?))
    }

    async fn insert_into(
        &self,
        _state: &dyn Session,
        input: Arc<dyn ExecutionPlan>,
        insert_op: InsertOp,
    ) -> DFResult<Arc<dyn ExecutionPlan>> {
        if insert_op != InsertOp::Append {
            return Err(DataFusionError::External(Box::new(Error::unsupported(
                format!("stream \"{}\" is append-only", self.stream.name()),
            ))));
        }
        let sink = CollectingSink {
            stream: self.stream.clone(),
            schema: self.stream.full_schema.clone(),
        };
        Ok(Arc::new(DataSinkExec::new(input, Arc::new(sink), None)))
    }
}

/// Reads the frames of one stream within bounds, the projected columns only: the user
/// columns asked for are the only ones decoded, `offset` and `ts` are built only when asked.
#[derive(Debug)]
struct SegmentScan {
    stream: Arc<Stream>,
    bounds: ScanBounds,
    end: u64,
    columns: Projection,
    /// The transaction's own uncommitted rows (projected), after the rest.
    pending: Vec<RecordBatch>,
}

/// Which columns of a stream's full schema (`offset`, `ts`, the user columns) a scan
/// returns, in the scan's order.
#[derive(Debug, Clone)]
struct Projection {
    /// Indices into the full schema, in output order (may repeat).
    indices: Vec<usize>,
    /// The user columns among them (full-schema index - 2), ascending, once each.
    user: Vec<usize>,
    schema: SchemaRef,
}

impl Projection {
    /// `None` is every column.
    fn new(stream: &Stream, projection: Option<&Vec<usize>>) -> Result<Projection, Error> {
        let indices: Vec<usize> = match projection {
            Some(p) => p.clone(),
            None => (0..stream.full_schema.fields().len()).collect(),
        };
        let mut user: Vec<usize> = indices.iter().filter(|&&i| i >= 2).map(|i| i - 2).collect();
        user.sort_unstable();
        user.dedup();
        let schema = Arc::new(stream.full_schema.project(&indices)?);
        Ok(Projection {
            indices,
            user,
            schema,
        })
    }

    /// The projected columns of `full` (a batch of the full schema).
    fn of_full(&self, full: &RecordBatch) -> Result<RecordBatch, Error> {
        Ok(full.project(&self.indices)?)
    }
}

impl PartitionStream for SegmentScan {
    fn schema(&self) -> &SchemaRef {
        &self.columns.schema
    }

    fn execute(&self, _ctx: Arc<TaskContext>) -> SendableRecordBatchStream {
        let stream = self.stream.clone();
        let from = self.bounds.from.max(stream.log.first_offset());
        let to = self.bounds.to.min(self.end);
        let metas: Vec<BatchMeta> = if from < to {
            stream
                .log
                .batches(from, to)
                .into_iter()
                .filter(|m| self.bounds.wants_frame(m))
                .collect()
        } else {
            vec![]
        };
        let schema = self.columns.schema.clone();
        let columns = self.columns.clone();
        let batches = futures::stream::iter(metas).map(move |m| {
            read_projected(&stream, &m, from, to, &columns)
                .map_err(|e| DataFusionError::External(Box::new(e)))
        });
        let pending = futures::stream::iter(self.pending.clone().into_iter().map(Ok));
        Box::pin(RecordBatchStreamAdapter::new(
            schema,
            batches.chain(pending),
        ))
    }
}

/// One frame as a batch of the full schema, sliced to [from, to).
pub fn read_frame(
    stream: &Stream,
    m: &BatchMeta,
    from: u64,
    to: u64,
) -> Result<RecordBatch, Error> {
    let user = stream.log.read(m)?;
    stream
        .frames_read
        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let batch = with_system_columns(stream, &user, m.base_offset, m.ts_micros)?;
    Ok(slice_to(batch, m, from, to))
}

/// One frame's `columns`, sliced to [from, to): only the user columns projected are
/// decoded, `offset` and `ts` are built only if projected.
fn read_projected(
    stream: &Stream,
    m: &BatchMeta,
    from: u64,
    to: u64,
    columns: &Projection,
) -> Result<RecordBatch, Error> {
    let decoded = stream.log.read_columns(m, Some(&columns.user))?;
    stream
        .frames_read
        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let n = decoded.num_rows();
    let mut out = Vec::with_capacity(columns.indices.len());
    for &i in &columns.indices {
        out.push(match i {
            0 => offset_column(m.base_offset, n),
            1 => ts_column(m.ts_micros, n),
            _ => {
                // the frame holds the first `k` of the projected user columns (later ones
                // were added to the stream after it was written)
                let at = columns.user.partition_point(|&u| u < i - 2);
                if at < decoded.num_columns() {
                    decoded.column(at).clone()
                } else {
                    stream.missing_column(i - 2, n)?
                }
            }
        });
    }
    let options = arrow::array::RecordBatchOptions::new().with_row_count(Some(n));
    let batch = RecordBatch::try_new_with_options(columns.schema.clone(), out, &options)?;
    Ok(slice_to(batch, m, from, to))
}

/// The rows of `batch` (frame `m`'s) within [from, to).
fn slice_to(batch: RecordBatch, m: &BatchMeta, from: u64, to: u64) -> RecordBatch {
    let start = from.saturating_sub(m.base_offset).min(m.rows as u64) as usize;
    let end = to.saturating_sub(m.base_offset).min(m.rows as u64) as usize;
    if start == 0 && end == batch.num_rows() {
        batch
    } else {
        batch.slice(start, end.saturating_sub(start))
    }
}

/// Uncommitted rows as the full schema: `offset` and `ts` are NULL (COMMIT
/// assigns them).
pub(crate) fn uncommitted_rows(stream: &Stream, user: &RecordBatch) -> Result<RecordBatch, Error> {
    let n = user.num_rows();
    let mut cols = vec![
        arrow::array::new_null_array(&arrow::datatypes::DataType::Int64, n),
        arrow::array::new_null_array(&crate::definition::ts_type(), n),
    ];
    cols.extend(stream.user_columns(user)?);
    Ok(RecordBatch::try_new(stream.full_schema.clone(), cols)?)
}

/// Prepend `offset` (base..base+n) and `ts` columns to a batch of user columns.
pub fn with_system_columns(
    stream: &Stream,
    user: &RecordBatch,
    base: u64,
    ts: i64,
) -> Result<RecordBatch, Error> {
    let n = user.num_rows();
    let mut cols = vec![offset_column(base, n), ts_column(ts, n)];
    cols.extend(stream.user_columns(user)?);
    Ok(RecordBatch::try_new(stream.full_schema.clone(), cols)?)
}

/// The `offset` column of a frame's `n` rows from `base`.
fn offset_column(base: u64, n: usize) -> ArrayRef {
    Arc::new(Int64Array::from_iter_values(
        (0..n as i64).map(|i| base as i64 + i),
    ))
}

/// The `ts` column of a frame's `n` rows, all committed at `ts`.
fn ts_column(ts: i64, n: usize) -> ArrayRef {
    Arc::new(TimestampMicrosecondArray::from_value(ts, n).with_timezone("UTC"))
}

/// Rows an INSERT planned by DataFusion produced, per statement. The
/// session installs one in the statement's config and takes the rows out
/// after execution; nothing is written by the sink itself.
#[derive(Debug, Default)]
pub struct InsertCollector {
    batches: Mutex<Vec<(Arc<Stream>, RecordBatch)>>,
}

impl InsertCollector {
    pub fn take(&self) -> Vec<(Arc<Stream>, RecordBatch)> {
        std::mem::take(&mut *self.batches.lock())
    }
}

#[derive(Debug)]
struct CollectingSink {
    stream: Arc<Stream>,
    schema: SchemaRef,
}

impl DisplayAs for CollectingSink {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "StreamAppend: {}", self.stream.name())
    }
}

#[async_trait]
impl DataSink for CollectingSink {
    fn schema(&self) -> &SchemaRef {
        &self.schema
    }

    async fn write_all(
        &self,
        mut data: SendableRecordBatchStream,
        context: &Arc<TaskContext>,
    ) -> DFResult<u64> {
        let collector = context
            .session_config()
            .get_extension::<InsertCollector>()
            .ok_or_else(|| DataFusionError::Internal("INSERT without a collector".into()))?;
        let mut rows = 0u64;
        while let Some(batch) = data.next().await {
            let batch = batch?;
            rows += batch.num_rows() as u64;
            collector.batches.lock().push((self.stream.clone(), batch));
        }
        Ok(rows)
    }
}
