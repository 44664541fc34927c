//! `COPY r [(columns)] FROM STDIN`: the statement names the stream or table and
//! its target columns ([`PendingCopy`]); the data, at most `max_copy_bytes`
//! of it, arrives later through [`Session::finish_copy`] (or inline, for
//! COPY given data in the statement). Every row is parsed and typed before
//! any is written, so a bad line writes nothing; into a stream the rows become
//! one append like an INSERT's ([`super::append`]), into a table one write of
//! new rows like a plain INSERT's ([`super::dml`]: a key already present is 23505).

use std::sync::Arc;

use datafusion::scalar::ScalarValue;

use super::append::target_columns;
use super::{Output, Session};
use crate::catalog::Stream;
use crate::copy;
use crate::error::{sqlstate, Error, Result};
use crate::insert;
use crate::statement::{CopyFormat, CopyFrom};
use crate::types::ColumnType;

/// A COPY FROM STDIN waiting for its data.
#[derive(Debug, Clone)]
pub struct PendingCopy {
    pub target: CopyTarget,
    /// Positions of the copied columns in the relation's user columns.
    pub targets: Vec<usize>,
    pub format: CopyFormat,
}

/// What a COPY FROM writes into: a stream (one append) or a table (inserted rows).
#[derive(Debug, Clone)]
pub enum CopyTarget {
    Stream(Arc<Stream>),
    Table(Arc<crate::table::Table>),
}

impl CopyTarget {
    pub fn name(&self) -> &str {
        match self {
            CopyTarget::Stream(s) => s.name(),
            CopyTarget::Table(t) => t.name(),
        }
    }

    /// The type of user column `i`.
    pub fn column_type(&self, i: usize) -> ColumnType {
        match self {
            CopyTarget::Stream(s) => s.def.columns[i].ty,
            CopyTarget::Table(t) => t.types[i],
        }
    }
}

impl PendingCopy {
    pub fn columns(&self) -> usize {
        self.targets.len()
    }
}

impl Session {
    /// COPY FROM: wait for the client's data, or append the inline data now.
    pub(super) async fn copy_from(&mut self, c: &CopyFrom) -> Result<Output> {
        let (target, targets) = match self.table(&c.stream) {
            Some(table) => {
                let targets = super::append::column_positions(
                    &table.def.columns,
                    table.name(),
                    &c.columns,
                    |_| Ok(()),
                )?;
                (CopyTarget::Table(table), targets)
            }
            None => {
                let stream = self.stream(&c.stream)?;
                let targets = target_columns(&stream, &c.columns)?;
                (CopyTarget::Stream(stream), targets)
            }
        };
        let pending = PendingCopy {
            target,
            targets,
            format: c.format.clone(),
        };
        match &c.inline {
            Some(data) => self.finish_copy(pending, data.as_bytes()).await,
            None => Ok(Output::CopyIn(pending)),
        }
    }

    /// Parse COPY data and append it as one command (or into the block).
    pub async fn finish_copy(&mut self, copy: PendingCopy, data: &[u8]) -> Result<Output> {
        let r = self.finish_copy_inner(copy, data).await;
        r.map_err(|e| self.fail_block(e))
    }

    async fn finish_copy_inner(&mut self, copy: PendingCopy, data: &[u8]) -> Result<Output> {
        if data.len() > self.engine.limits.max_copy_bytes {
            return Err(Error::new(
                sqlstate::PROGRAM_LIMIT_EXCEEDED,
                format!(
                    "COPY data exceeds the maximum of {} bytes (max_copy_bytes)",
                    self.engine.limits.max_copy_bytes
                ),
            ));
        }
        if matches!(copy.format, CopyFormat::Binary) {
            let rows = crate::binary::copy_rows(data)?;
            let values = copy_values(&copy, rows, crate::binary::decode)?;
            return self.append_copied(&copy, values).await;
        }
        let text = std::str::from_utf8(data).map_err(|_| {
            Error::new(
                sqlstate::CHARACTER_NOT_IN_REPERTOIRE,
                "invalid byte sequence for encoding \"UTF8\"",
            )
        })?;
        let rows = copy::parse_rows(text, &copy.format)?;
        let values = copy_values(&copy, rows, |ty, text: String| ty.parse_text(&text))?;
        self.append_copied(&copy, values).await
    }

    async fn append_copied(
        &mut self,
        copy: &PendingCopy,
        values: Vec<Vec<ScalarValue>>,
    ) -> Result<Output> {
        let n = values.len();
        if n == 0 {
            return Ok(Output::Tag("COPY 0".into()));
        }
        match &copy.target {
            CopyTarget::Stream(stream) => {
                let batch = insert::build_batch(
                    stream,
                    &copy.targets,
                    values,
                    self.engine.limits.max_row_bytes,
                )?;
                self.append(stream, &batch).await?;
            }
            CopyTarget::Table(table) => self.copy_into_table(table, &copy.targets, values).await?,
        }
        Ok(Output::Tag(format!("COPY {n}")))
    }
}

/// Typed rows from COPY fields (`None` = NULL), decoded per format; an
/// error names the COPY line.
fn copy_values<F>(
    copy: &PendingCopy,
    rows: Vec<Vec<Option<F>>>,
    decode: impl Fn(ColumnType, F) -> Result<ScalarValue>,
) -> Result<Vec<Vec<ScalarValue>>> {
    let line = |i: usize| format!("COPY {}, line {}", copy.target.name(), i + 1);
    rows.into_iter()
        .enumerate()
        .map(|(i, row)| {
            if row.len() != copy.targets.len() {
                let msg = if row.len() < copy.targets.len() {
                    "missing data for column"
                } else {
                    "extra data after last expected column"
                };
                return Err(
                    Error::new(sqlstate::INVALID_TEXT_REPRESENTATION, msg).with_detail(line(i))
                );
            }
            row.into_iter()
                .zip(&copy.targets)
                .map(|(f, &t)| {
                    let ty = copy.target.column_type(t);
                    match f {
                        None => ty.coerce(ScalarValue::Null),
                        Some(v) => decode(ty, v).and_then(|v| ty.coerce(v)),
                    }
                    .map_err(|e| e.with_detail(line(i)))
                })
                .collect()
        })
        .collect()
}
