//! COPY text and CSV rows typed straight into a stream's Arrow columns ([`typed_batch`]):
//! a `text` field goes from the COPY data into a string builder (its one copy), other
//! types through their text input ([`ColumnType::parse_text`]) a value at a time.
//!
//! Invariant: the batch, or the error, is the one that typing every field into a
//! `ScalarValue` ([`ColumnType::parse_text`] then [`ColumnType::coerce`]) and
//! [`insert::build_batch`] give: the first field error in row and column order wins and
//! names its COPY line, then the first row over `max_row_bytes` (counted as
//! [`ScalarValue::size`] counts a typed row), then NOT NULL. (`tests` compares both on
//! random rows of every type.)

use std::borrow::Cow;
use std::mem::size_of;

use arrow::array::{ArrayRef, RecordBatch, StringBuilder};
use arrow::datatypes::DataType;
use datafusion::scalar::ScalarValue;

use crate::catalog::Stream;
use crate::copy::Rows;
use crate::error::{sqlstate, Error, Result};
use crate::insert;
use crate::types::ColumnType;

/// Where the rows come from, for errors: `COPY <relation>, line <n>`, rows counted from
/// `rows_before`.
pub struct Origin<'a> {
    pub relation: &'a str,
    pub rows_before: u64,
}

impl Origin<'_> {
    /// The error detail naming row `i` of these rows.
    pub fn line(&self, i: usize) -> String {
        format!(
            "COPY {}, line {}",
            self.relation,
            self.rows_before + i as u64 + 1
        )
    }
}

/// `rows` of fields for the user columns `targets` of `stream` (every row holds one field
/// per target) as the stream's batch: the other columns take their default or NULL.
pub fn typed_batch(
    stream: &Stream,
    targets: &[usize],
    rows: Rows<'_>,
    origin: &Origin<'_>,
    max_row_bytes: usize,
) -> Result<RecordBatch> {
    let n = rows.len();
    let mut columns: Vec<Column> = targets
        .iter()
        .enumerate()
        .map(|(c, &t)| {
            // each string column takes about the text of its fields: reserved whole
            let text_bytes = rows
                .iter()
                .filter_map(|row| row.get(c)?.as_ref().map(|f| f.len()))
                .sum();
            Column::new(stream.def.columns[t].ty, n, text_bytes)
        })
        .collect();
    let mut too_big = None;
    for (i, row) in rows.into_iter().enumerate() {
        if row.len() != targets.len() {
            let msg = if row.len() < targets.len() {
                "missing data for column"
            } else {
                "extra data after last expected column"
            };
            return Err(
                Error::new(sqlstate::INVALID_TEXT_REPRESENTATION, msg).with_detail(origin.line(i))
            );
        }
        let mut row_bytes = 0;
        for (field, column) in row.into_iter().zip(&mut columns) {
            row_bytes += column
                .push(field)
                .map_err(|e| e.with_detail(origin.line(i)))?;
        }
        if row_bytes > max_row_bytes && too_big.is_none() {
            too_big = Some(insert::row_too_big(row_bytes, max_row_bytes));
        }
    }
    if let Some(e) = too_big {
        return Err(e);
    }
    let mut built: Vec<Option<ArrayRef>> = vec![None; stream.user_schema.fields().len()];
    for (column, &t) in columns.into_iter().zip(targets) {
        built[t] = Some(column.finish()?);
    }
    let arrays = built
        .into_iter()
        .enumerate()
        .map(|(i, a)| match a {
            Some(a) => Ok(a),
            None => stream.missing_column(i, n),
        })
        .collect::<Result<Vec<_>>>()?;
    insert::check_not_null(stream, &arrays)?;
    RecordBatch::try_new(stream.user_schema.clone(), arrays).map_err(Error::from)
}

/// One copied column being built.
enum Column {
    /// A type stored as UTF-8 (`text`, `varchar`, `json`, `jsonb`, `uuid`): a `text` field as
    /// it is, the others as their type's input makes them.
    Strings(ColumnType, StringBuilder),
    /// Any other type: typed values, made an array at the end.
    Values(ColumnType, Vec<ScalarValue>),
}

impl Column {
    /// A column for `rows` rows whose fields' text takes `text_bytes`.
    fn new(ty: ColumnType, rows: usize, text_bytes: usize) -> Column {
        match ty.arrow_type() {
            DataType::Utf8 => Column::Strings(ty, StringBuilder::with_capacity(rows, text_bytes)),
            _ => Column::Values(ty, Vec::with_capacity(rows)),
        }
    }

    /// Adds a field (`None` = NULL); returns what it counts towards its row's size.
    fn push(&mut self, field: Option<Cow<'_, str>>) -> Result<usize> {
        match (self, field) {
            (Column::Strings(_, b), None) => {
                b.append_null();
                Ok(size_of::<ScalarValue>())
            }
            // text's input is the text itself
            (Column::Strings(ColumnType::Text, b), Some(s)) => {
                b.append_value(&s);
                Ok(size_of::<ScalarValue>() + s.len())
            }
            (Column::Strings(ty, b), Some(s)) => {
                let v = ty.parse_text(&s).and_then(|v| ty.coerce(v))?;
                let size = v.size();
                match v {
                    ScalarValue::Utf8(Some(t)) => b.append_value(t),
                    other => {
                        return Err(Error::internal(format!(
                            "{} input made {other:?}",
                            ty.sql_name()
                        )))
                    }
                }
                Ok(size)
            }
            (Column::Values(ty, values), field) => {
                let v = match field {
                    None => ty.coerce(ScalarValue::Null)?,
                    Some(s) => ty.parse_text(&s).and_then(|v| ty.coerce(v))?,
                };
                let size = v.size();
                values.push(v);
                Ok(size)
            }
        }
    }

    fn finish(self) -> Result<ArrayRef> {
        match self {
            Column::Strings(_, mut b) => Ok(std::sync::Arc::new(b.finish())),
            Column::Values(ty, values) if values.is_empty() => {
                Ok(arrow::array::new_null_array(&ty.arrow_type(), 0))
            }
            Column::Values(_, values) => Ok(ScalarValue::iter_to_array(values)?),
        }
    }
}
