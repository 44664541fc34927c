//! COPY text and CSV rows typed straight into a stream's Arrow columns ([`TypedColumns`]), a
//! row at a time as the parser hands them out:
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
use crate::copy::Fields;
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

    /// 22P02 when row `i` holds `fields` fields where `columns` are copied.
    pub fn check_width(&self, i: usize, fields: usize, columns: usize) -> Result<()> {
        if fields == columns {
            return Ok(());
        }
        let msg = if fields < columns {
            "missing data for column"
        } else {
            "extra data after last expected column"
        };
        Err(Error::new(sqlstate::INVALID_TEXT_REPRESENTATION, msg).with_detail(self.line(i)))
    }
}

/// What the typed rows of a COPY take, as `ScalarValue`s count (each row's vector
/// included), and at most how much ([`over_budget`] beyond).
pub struct Budget {
    bytes: usize,
    max: usize,
}

impl Budget {
    pub fn new(max: usize) -> Budget {
        Budget { bytes: 0, max }
    }

    /// Counts a typed row of `row_bytes`.
    pub fn take(&mut self, row_bytes: usize) -> Result<()> {
        self.bytes += size_of::<Vec<ScalarValue>>() + row_bytes;
        if self.bytes > self.max {
            return Err(over_budget(self.max));
        }
        Ok(())
    }
}

/// Values a column holds as `ScalarValue`s before they become an array: typing a chunk holds
/// its rows in Arrow's compact form, not at a `ScalarValue` (48 bytes and more) per value.
const VALUES_PER_ARRAY: usize = 4096;

/// Rows of fields for the user columns `targets` of `stream`, typed as they come
/// ([`TypedColumns::push`]), then the stream's batch ([`TypedColumns::finish`]: the other
/// columns take their default or NULL).
pub struct TypedColumns<'s> {
    stream: &'s Stream,
    targets: &'s [usize],
    columns: Vec<Column>,
    rows: usize,
    max_row_bytes: usize,
    /// The first row over `max_row_bytes`: reported after every field error.
    too_big: Option<Error>,
    budget: Budget,
}

impl<'s> TypedColumns<'s> {
    /// Columns for rows of fields whose text takes about `text_bytes`, at most `budget`
    /// bytes of them as [`ScalarValue::size`] counts (see [`over_budget`]).
    pub fn new(
        stream: &'s Stream,
        targets: &'s [usize],
        text_bytes: usize,
        max_row_bytes: usize,
        budget: usize,
    ) -> TypedColumns<'s> {
        let types: Vec<ColumnType> = targets.iter().map(|&t| stream.def.columns[t].ty).collect();
        let strings = types
            .iter()
            .filter(|t| t.arrow_type() == DataType::Utf8)
            .count();
        let columns = types
            .into_iter()
            .map(|ty| Column::new(ty, text_bytes / strings.max(1)))
            .collect();
        TypedColumns {
            stream,
            targets,
            columns,
            rows: 0,
            max_row_bytes,
            too_big: None,
            budget: Budget::new(budget),
        }
    }

    /// Types one row's fields (taken from `fields`); an error names its line in `origin`.
    pub fn push(&mut self, fields: &mut Fields<'_>, origin: &Origin<'_>) -> Result<()> {
        let i = self.rows;
        origin.check_width(i, fields.len(), self.targets.len())?;
        let mut row_bytes = 0;
        for (field, column) in fields.drain(..).zip(&mut self.columns) {
            row_bytes += column
                .push(field)
                .map_err(|e| e.with_detail(origin.line(i)))?;
        }
        if row_bytes > self.max_row_bytes && self.too_big.is_none() {
            self.too_big = Some(insert::row_too_big(row_bytes, self.max_row_bytes));
        }
        self.budget.take(row_bytes)?;
        self.rows += 1;
        Ok(())
    }

    /// The batch of the rows pushed; `None` without rows.
    pub fn finish(self) -> Result<Option<RecordBatch>> {
        if let Some(e) = self.too_big {
            return Err(e);
        }
        let (stream, n) = (self.stream, self.rows);
        if n == 0 {
            return Ok(None);
        }
        let mut built: Vec<Option<ArrayRef>> = vec![None; stream.user_schema.fields().len()];
        for (column, &t) in self.columns.into_iter().zip(self.targets) {
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
        RecordBatch::try_new(stream.user_schema.clone(), arrays)
            .map(Some)
            .map_err(Error::from)
    }
}

/// 54000: the typed rows of a COPY held whole would take more than `budget` bytes (counted
/// as `ScalarValue`s, each row's vector included): data of many tiny fields (a NULL takes a
/// byte of text and 48 or more as a `ScalarValue`) cannot take the server's memory.
pub fn over_budget(budget: usize) -> Error {
    Error::new(
        sqlstate::PROGRAM_LIMIT_EXCEEDED,
        format!(
            "COPY rows held whole take more than {budget} bytes once typed (4 x max_copy_bytes); load them in smaller COPYs"
        ),
    )
}

/// One copied column being built.
enum Column {
    /// A type stored as UTF-8 (`text`, `varchar`, `json`, `jsonb`, `uuid`): a `text` field as
    /// it is, the others as their type's input makes them.
    Strings(ColumnType, StringBuilder),
    /// Any other type: typed values, made an array every [`VALUES_PER_ARRAY`], and the
    /// arrays made.
    Values(ColumnType, Vec<ScalarValue>, Vec<ArrayRef>),
}

impl Column {
    /// A column whose fields' text takes about `text_bytes`.
    fn new(ty: ColumnType, text_bytes: usize) -> Column {
        match ty.arrow_type() {
            DataType::Utf8 => Column::Strings(ty, StringBuilder::with_capacity(1024, text_bytes)),
            _ => Column::Values(ty, Vec::with_capacity(VALUES_PER_ARRAY), Vec::new()),
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
            (Column::Values(ty, values, arrays), field) => {
                let v = match field {
                    None => ty.coerce(ScalarValue::Null)?,
                    Some(s) => ty.parse_text(&s).and_then(|v| ty.coerce(v))?,
                };
                let size = v.size();
                values.push(v);
                if values.len() == VALUES_PER_ARRAY {
                    arrays.push(ScalarValue::iter_to_array(values.drain(..))?);
                }
                Ok(size)
            }
        }
    }

    fn finish(self) -> Result<ArrayRef> {
        match self {
            Column::Strings(_, mut b) => Ok(std::sync::Arc::new(b.finish())),
            Column::Values(ty, values, mut arrays) => {
                if !values.is_empty() {
                    arrays.push(ScalarValue::iter_to_array(values)?);
                }
                match arrays.len() {
                    0 => Ok(arrow::array::new_null_array(&ty.arrow_type(), 0)),
                    1 => Ok(arrays.remove(0)),
                    _ => {
                        let parts: Vec<&dyn arrow::array::Array> =
                            arrays.iter().map(|a| a.as_ref()).collect();
                        Ok(arrow::compute::concat(&parts)?)
                    }
                }
            }
        }
    }
}
