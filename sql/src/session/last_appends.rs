//! `sluice_last_offsets()`: where the rows of the session's last transaction block went.
//!
//! Offsets and timestamps are assigned when a block commits, so inside an explicit block a
//! stream INSERT's RETURNING answers at once with `offset` and `ts` NULL (and its other
//! columns). After COMMIT, `SELECT * FROM sluice_last_offsets()` lists every row the block
//! appended, in the order it appended them: `n` (1, 2, ...), `stream`, `offset`, `ts` — for
//! a row a dedup stream did not append again, the original's. It is the last block that
//! wrote: one that only read (psycopg opens one for every query outside `autocommit`) and
//! single statements outside a block (their RETURNING has the offsets) leave it as it was;
//! a block that wrote and rolled back or failed to commit leaves it empty. The list is read when the query runs (a prepared
//! statement sees the latest block) and is bounded: more than [`MAX_ROWS`] rows is 54000.

use std::sync::Arc;

use arrow::array::{Int64Builder, RecordBatch, StringBuilder, TimestampMicrosecondBuilder};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef, TimeUnit};
use datafusion::catalog::streaming::StreamingTable;
use datafusion::catalog::{TableFunctionArgs, TableFunctionImpl};
use datafusion::datasource::TableProvider;
use datafusion::error::{DataFusionError, Result as DfResult};
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::streaming::PartitionStream;
use parking_lot::Mutex;

use crate::command::OpOutcome;
use crate::error::{sqlstate, Error};

/// Name of the table function.
pub const FUNCTION: &str = "sluice_last_offsets";
/// Rows the function lists at most (a block of tiny rows can append millions).
pub const MAX_ROWS: u64 = 1_000_000;

/// The appends of the session's last block, as its commit reported them.
#[derive(Debug, Default)]
pub(super) struct LastAppends(Mutex<Vec<OpOutcome>>);

impl LastAppends {
    /// A block ended: what it appended if it committed (`outcomes`), else nothing.
    pub(super) fn set(&self, outcomes: Option<&[OpOutcome]>) {
        let appends = outcomes
            .unwrap_or_default()
            .iter()
            .filter(|o| matches!(o, OpOutcome::Appended { .. }))
            .cloned()
            .collect();
        *self.0.lock() = appends;
    }

    fn batch(&self) -> Result<RecordBatch, Error> {
        let appends = self.0.lock().clone();
        let total: u64 = appends.iter().map(rows_of).sum();
        if total > MAX_ROWS {
            return Err(Error::new(
                sqlstate::PROGRAM_LIMIT_EXCEEDED,
                format!(
                    "{FUNCTION}() lists at most {MAX_ROWS} rows; the last block appended {total}"
                ),
            ));
        }
        let mut n = Int64Builder::new();
        let mut stream = StringBuilder::new();
        let mut offset = Int64Builder::new();
        let mut ts = TimestampMicrosecondBuilder::new().with_timezone("+00:00");
        let mut i = 0i64;
        for a in &appends {
            let OpOutcome::Appended {
                stream: name,
                base_offset,
                rows,
                ts_micros,
                row_offsets,
            } = a
            else {
                continue;
            };
            let each: Vec<(u64, i64)> = if row_offsets.is_empty() {
                (0..*rows as u64)
                    .map(|r| (base_offset + r, *ts_micros))
                    .collect()
            } else {
                row_offsets.clone()
            };
            for (o, t) in each {
                i += 1;
                n.append_value(i);
                stream.append_value(name);
                offset.append_value(o as i64);
                ts.append_value(t);
            }
        }
        Ok(RecordBatch::try_new(
            schema(),
            vec![
                Arc::new(n.finish()),
                Arc::new(stream.finish()),
                Arc::new(offset.finish()),
                Arc::new(ts.finish()),
            ],
        )?)
    }
}

fn rows_of(o: &OpOutcome) -> u64 {
    match o {
        OpOutcome::Appended {
            rows, row_offsets, ..
        } if row_offsets.is_empty() => *rows as u64,
        OpOutcome::Appended { row_offsets, .. } => row_offsets.len() as u64,
        _ => 0,
    }
}

fn schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("n", DataType::Int64, false),
        Field::new("stream", DataType::Utf8, false),
        Field::new("offset", DataType::Int64, false),
        Field::new(
            "ts",
            DataType::Timestamp(TimeUnit::Microsecond, Some("+00:00".into())),
            false,
        ),
    ]))
}

/// `sluice_last_offsets()`, registered in the session's context.
#[derive(Debug)]
pub(super) struct LastOffsetsFunction(pub(super) Arc<LastAppends>);

impl TableFunctionImpl for LastOffsetsFunction {
    fn call_with_args(&self, args: TableFunctionArgs) -> DfResult<Arc<dyn TableProvider>> {
        if !args.exprs().is_empty() {
            return Err(DataFusionError::External(Box::new(Error::new(
                sqlstate::UNDEFINED_FUNCTION,
                format!("{FUNCTION}() takes no arguments"),
            ))));
        }
        let partition = LastOffsetsPartition {
            appends: self.0.clone(),
            schema: schema(),
        };
        Ok(Arc::new(StreamingTable::try_new(
            schema(),
            vec![Arc::new(partition)],
        )?))
    }
}

/// The function's rows, read each time the plan executes.
#[derive(Debug)]
struct LastOffsetsPartition {
    appends: Arc<LastAppends>,
    schema: SchemaRef,
}

impl PartitionStream for LastOffsetsPartition {
    fn schema(&self) -> &SchemaRef {
        &self.schema
    }

    fn execute(&self, _ctx: Arc<TaskContext>) -> SendableRecordBatchStream {
        let batch = self
            .appends
            .batch()
            .map_err(|e| DataFusionError::External(Box::new(e)));
        Box::pin(RecordBatchStreamAdapter::new(
            self.schema.clone(),
            futures::stream::iter([batch]),
        ))
    }
}
