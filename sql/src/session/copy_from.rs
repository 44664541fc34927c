//! `COPY s [(columns)] FROM STDIN`: the statement names the stream and its
//! target columns ([`PendingCopy`]); the data, at most `max_copy_bytes`
//! of it, arrives later through [`Session::finish_copy`] (or inline, for
//! COPY given data in the statement). Every row is parsed and typed before
//! any is appended, so a bad line appends nothing; the rows become one
//! append like an INSERT's ([`super::append`]).

use datafusion::scalar::ScalarValue;

use super::append::target_columns;
use super::{Output, PendingCopy, Session};
use crate::copy;
use crate::error::{sqlstate, Error, Result};
use crate::insert;
use crate::statement::{CopyFormat, CopyFrom};
use crate::types::ColumnType;

impl Session {
    /// COPY FROM: wait for the client's data, or append the inline data now.
    pub(super) async fn copy_from(&mut self, c: &CopyFrom) -> Result<Output> {
        let stream = self.stream(&c.stream)?;
        let targets = target_columns(&stream, &c.columns)?;
        let pending = PendingCopy {
            stream,
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
        let batch = insert::build_batch(
            &copy.stream,
            &copy.targets,
            values,
            self.engine.limits.max_row_bytes,
        )?;
        self.append(&copy.stream, &batch).await?;
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
    let line = |i: usize| format!("COPY {}, line {}", copy.stream.name(), i + 1);
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
                    let ty = copy.stream.def.columns[t].ty;
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
