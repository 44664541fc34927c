//! Functions whose result can be far larger than their arguments check the size they would
//! build before they build it.
//!
//! DataFusion builds a function's result whole, outside any memory pool: `repeat('x',
//! 2147483647)` took gigabytes before anything could refuse it. Each of `repeat`, `lpad`,
//! `rpad`, `replace`, `array_repeat`, `array_resize` and the array forms of `range` and
//! `generate_series` is wrapped ([`crate::checked_fn`]) with a check that computes, from the
//! arguments alone, an upper bound of every result's size:
//!
//! - one value beyond [`max_value_bytes`] — PostgreSQL's 1 GB, or the session's
//!   `max_statement_memory` when that is lower — is `54000` "requested length too large";
//! - one call's values together beyond `max_statement_memory` are `53200` (out of memory).
//!
//! The bounds: `repeat(s, n)` is `len(s) * n` bytes; `lpad`/`rpad(s, n)` `4 * n` (n
//! characters of up to 4 bytes, PostgreSQL's own rule); `replace(s, from, to)` `len(s) +
//! len(s) / len(from) * len(to)`; `array_repeat(x, n)` and `array_resize(a, n)` n elements
//! of at least 8 bytes (or the element's length, for text); `range`/`generate_series` over
//! integers their element count times 8. `string_agg` and `array_agg` grow in an
//! aggregate's accounted state and meet the memory pool instead ([`crate::memory`]).

use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray};
use arrow::datatypes::{DataType, Int64Type};
use datafusion::common::Result as DFResult;
use datafusion::error::DataFusionError;
use datafusion::execution::context::SessionContext;
use datafusion::execution::FunctionRegistry;
use datafusion::logical_expr::ColumnarValue;

use crate::checked_fn::{checked, Check};
use crate::error::{sqlstate, Error, OUT_OF_MEMORY_MESSAGE};
use crate::memory::{format_bytes, StatementMemory, SETTING};

/// PostgreSQL's largest value (`MaxAllocSize`, 1 GB).
pub const MAX_VALUE_BYTES: usize = 1 << 30;

/// The largest single value a function may build in a session with this memory.
pub fn max_value_bytes(memory: &StatementMemory) -> usize {
    MAX_VALUE_BYTES.min(memory.limit())
}

/// The functions this module bounds.
const BOUNDED: [&str; 8] = [
    "repeat",
    "lpad",
    "rpad",
    "replace",
    "array_repeat",
    "array_resize",
    "range",
    "generate_series",
];

/// Replaces each bounded function of `ctx` by one that checks its result's size against
/// `memory`'s limit first.
pub fn install(ctx: &SessionContext, memory: Arc<StatementMemory>) {
    let check: Arc<dyn Check> = Arc::new(ResultSize { memory });
    for name in BOUNDED {
        if let Ok(f) = ctx.udf(name) {
            ctx.register_udf(checked(f.as_ref().clone(), check.clone()));
        }
    }
}

#[derive(Debug)]
struct ResultSize {
    memory: Arc<StatementMemory>,
}

impl Check for ResultSize {
    fn before(&self, name: &str, args: &[ColumnarValue], rows: usize) -> DFResult<()> {
        // constant arguments give one value, which a batch of `rows` repeats
        let (rows, repeats) = if args.iter().all(|a| matches!(a, ColumnarValue::Scalar(_))) {
            (1, rows.max(1) as u128)
        } else {
            (rows, 1)
        };
        let arg = |i: usize| args.get(i).cloned();
        let bound: Box<dyn Fn(usize) -> Option<u128>> = match name {
            "repeat" => {
                let s = arg(0).map(Measure::byte_len).transpose()?;
                let n = arg(1).map(Measure::int).transpose()?;
                Box::new(move |i| Some(get(&s, i)? * get(&n, i)?))
            }
            "lpad" | "rpad" => {
                let n = arg(1).map(Measure::int).transpose()?;
                Box::new(move |i| Some(4 * get(&n, i)?))
            }
            "replace" => {
                let s = arg(0).map(Measure::byte_len).transpose()?;
                let from = arg(1).map(Measure::byte_len).transpose()?;
                let to = arg(2).map(Measure::byte_len).transpose()?;
                Box::new(move |i| {
                    let (s, from, to) = (get(&s, i)?, get(&from, i)?, get(&to, i)?);
                    Some(s.checked_div(from).map_or(s, |n| s + n * to))
                })
            }
            "array_repeat" => {
                let elem = arg(0).map(Measure::element_len).transpose()?;
                let n = arg(1).map(Measure::int).transpose()?;
                Box::new(move |i| Some(get(&elem, i).unwrap_or(8) * get(&n, i)?))
            }
            "array_resize" => {
                let n = arg(1).map(Measure::int).transpose()?;
                Box::new(move |i| Some(8 * get(&n, i)?))
            }
            "range" | "generate_series" => {
                if !args.iter().all(|a| a.data_type().is_integer()) {
                    return Ok(()); // dates and timestamps: not bounded here
                }
                let (a, b, step) = (
                    arg(0).map(Measure::int).transpose()?,
                    arg(1).map(Measure::int).transpose()?,
                    arg(2).map(Measure::int).transpose()?,
                );
                let one_arg = args.len() == 1;
                Box::new(move |i| {
                    let (start, stop) = if one_arg {
                        (0, get_signed(&a, i)?)
                    } else {
                        (get_signed(&a, i)?, get_signed(&b, i)?)
                    };
                    let step = match &step {
                        Some(_) => get_signed(&step, i)?,
                        None => 1,
                    };
                    let span = (stop - start).unsigned_abs();
                    let count = match step.unsigned_abs() {
                        0 => 0,
                        s => span / s + 1,
                    };
                    Some(8 * count)
                })
            }
            _ => return Ok(()),
        };
        let max_value = max_value_bytes(&self.memory) as u128;
        let limit = self.memory.limit() as u128;
        let mut total = 0u128;
        for i in 0..rows {
            let Some(bytes) = bound(i) else { continue };
            if bytes > max_value {
                return Err(too_large(name, bytes, max_value));
            }
            total += bytes * repeats;
            if total > limit {
                return Err(DataFusionError::ResourcesExhausted(format!(
                    "{OUT_OF_MEMORY_MESSAGE}: the statement needs more than {SETTING} ({}); {name} \
                     would build {} for its rows",
                    format_bytes(limit as usize),
                    format_bytes(total.min(usize::MAX as u128) as usize),
                )));
            }
        }
        Ok(())
    }
}

fn too_large(name: &str, bytes: u128, max: u128) -> DataFusionError {
    let e = Error::new(
        sqlstate::PROGRAM_LIMIT_EXCEEDED,
        "requested length too large",
    )
    .with_detail(format!(
        "{name} would build a value of {bytes} bytes; the largest is {max} bytes \
             (1 GB, or {SETTING} if lower)"
    ));
    DataFusionError::External(Box::new(e))
}

/// One argument's values as the bounds need them: a number per row (`None` for NULL).
enum Values {
    Scalar(Option<i128>),
    Array(ArrayRef),
}

fn get(v: &Option<Values>, i: usize) -> Option<u128> {
    get_signed(v, i).map(|n| n.max(0) as u128)
}

fn get_signed(v: &Option<Values>, i: usize) -> Option<i128> {
    match v.as_ref()? {
        Values::Scalar(n) => *n,
        Values::Array(a) => {
            let a = a.as_primitive::<Int64Type>();
            a.is_valid(i).then(|| a.value(i) as i128)
        }
    }
}

trait Measure {
    fn int(self) -> DFResult<Values>;
    fn byte_len(self) -> DFResult<Values>;
    fn element_len(self) -> DFResult<Values>;
}

impl Measure for ColumnarValue {
    /// The argument as an integer (counts, lengths).
    fn int(self) -> DFResult<Values> {
        match self {
            ColumnarValue::Scalar(s) => {
                let a = s.to_array_of_size(1)?;
                let a = arrow::compute::cast(&a, &DataType::Int64)?;
                let a = a.as_primitive::<Int64Type>();
                Ok(Values::Scalar(a.is_valid(0).then(|| a.value(0) as i128)))
            }
            ColumnarValue::Array(a) => {
                Ok(Values::Array(arrow::compute::cast(&a, &DataType::Int64)?))
            }
        }
    }

    /// The argument's length in bytes (text and bytea).
    fn byte_len(self) -> DFResult<Values> {
        let lengths = |a: &ArrayRef| -> DFResult<ArrayRef> {
            let n = arrow::compute::kernels::length::length(a)?;
            Ok(arrow::compute::cast(&n, &DataType::Int64)?)
        };
        match self {
            ColumnarValue::Scalar(s) => {
                let n = lengths(&s.to_array_of_size(1)?)?;
                let n = n.as_primitive::<Int64Type>();
                Ok(Values::Scalar(n.is_valid(0).then(|| n.value(0) as i128)))
            }
            ColumnarValue::Array(a) => Ok(Values::Array(lengths(&a)?)),
        }
    }

    /// An array element's size: its length for text and bytea, else at least 8 bytes.
    fn element_len(self) -> DFResult<Values> {
        match self.data_type() {
            DataType::Utf8
            | DataType::LargeUtf8
            | DataType::Utf8View
            | DataType::Binary
            | DataType::LargeBinary
            | DataType::BinaryView => self.byte_len(),
            t => Ok(Values::Scalar(Some(
                t.primitive_width().unwrap_or(8).max(8) as i128,
            ))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn run(limit: usize, sql: &str) -> std::result::Result<usize, Error> {
        let ctx = SessionContext::new();
        install(
            &ctx,
            StatementMemory::new(limit, crate::memory::QueryMemory::new(usize::MAX)),
        );
        let batches = ctx.sql(sql).await?.collect().await?;
        Ok(batches.iter().map(|b| b.num_rows()).sum())
    }

    #[tokio::test]
    async fn results_beyond_the_bounds_are_refused_before_they_are_built() {
        let gb = 1 << 30;
        for sql in [
            "SELECT repeat('x', 2147483647)",
            "SELECT lpad('x', 300000000)",
            "SELECT rpad(v, 300000000, 'ab') FROM (VALUES ('x')) AS t(v)",
            "SELECT replace(repeat('x', 100000), 'x', repeat('y', 100000))",
            "SELECT array_repeat(1, 200000000)",
            "SELECT range(1, 200000000)",
        ] {
            let err = run(4 * gb, sql).await.unwrap_err();
            assert_eq!(err.code, sqlstate::PROGRAM_LIMIT_EXCEEDED, "{sql}: {err:?}");
            assert_eq!(err.message, "requested length too large");
        }
        // the session's memory limit, when lower, bounds one value and a batch's values
        let err = run(64 << 20, "SELECT repeat('x', 100000000)")
            .await
            .unwrap_err();
        assert_eq!(err.code, sqlstate::PROGRAM_LIMIT_EXCEEDED);
        let sql = "SELECT repeat(CAST(v AS TEXT), 10000000) FROM generate_series(1, 20) AS t(v)";
        let err = run(64 << 20, sql).await.unwrap_err();
        assert_eq!(err.code, sqlstate::OUT_OF_MEMORY, "{err:?}");
        // what fits runs
        assert_eq!(
            run(64 << 20, "SELECT repeat('ab', 1000), lpad('x', 10)")
                .await
                .unwrap(),
            1
        );
        assert_eq!(run(64 << 20, "SELECT range(1, 1000)").await.unwrap(), 1);
    }
}
