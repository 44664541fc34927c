//! `COPY r [(columns)] FROM STDIN`: the statement names the stream or table and
//! its target columns ([`PendingCopy`]); the data arrives later, message by message, into
//! a [`CopyIn`] ([`Session::copy_data`], then [`Session::copy_done`]), or inline, for COPY
//! given data in the statement. A COPY is all or nothing: a bad line writes nothing.
//!
//! - Into a stream, outside a transaction block, in text or CSV (and without a
//!   `dedup_key`): the data is cut at row boundaries into chunks of `copy_chunk_bytes`;
//!   each chunk is parsed, typed and proposed as a `CopyChunk` op, staged on every replica
//!   and invisible (see `apply/copies.rs`), and the last one goes with the `CopyCommit`
//!   that shows every row at once. So a COPY of any size holds a few chunks in memory:
//!   one being parsed, at most [`MAX_CHUNKS_IN_FLIGHT`] being encoded or replicated; the
//!   next data is read from the client only when there is room (backpressure). A failure aborts what was staged; a client gone mid-COPY leaves a
//!   copy that is aborted when it drops (or, a node gone, by the idle timeout). A COPY
//!   that fits in one chunk is one append, as before.
//! - Otherwise (a table, a block, binary, a dedup stream) the data, at most
//!   `max_copy_bytes` of it, is parsed whole: into a stream one append like an INSERT's
//!   ([`super::append`]), into a table one write of new rows like a plain INSERT's
//!   ([`super::dml`]: a key already present is 23505).

use std::borrow::Cow;
use std::collections::VecDeque;
use std::sync::Arc;

use arrow::array::RecordBatch;
use datafusion::scalar::ScalarValue;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use super::append::target_columns;
use super::transaction::Txn;
use super::{Output, Session};
use crate::block_catalog::LOCAL_ID_BASE;
use crate::catalog::Stream;
use crate::command::{op, Append, CopyAbort, CopyChunk, CopyCommit, Op, OpOutcome};
use crate::copy;
use crate::copy_columns::{Budget, Origin, TypedColumns};
use crate::engine::Engine;
use crate::error::{sqlstate, Error, Result};
use crate::insert;
use crate::statement::{CopyFormat, CopyFrom};
use crate::types::ColumnType;

/// Chunks of one COPY encoded or proposed at a time (see [`CopyIn::in_flight`]): with one
/// being parsed, about three chunks' worth of memory.
const MAX_CHUNKS_IN_FLIGHT: usize = 2;

/// Room in a chunk's buffer past `copy_chunk_bytes`, for the message that fills it.
const SLACK_BYTES: usize = 1 << 20;

/// A COPY FROM STDIN waiting for its data.
#[derive(Debug, Clone)]
pub struct PendingCopy {
    pub target: CopyTarget,
    /// Positions of the copied columns in the relation's user columns.
    pub targets: Vec<usize>,
    pub format: CopyFormat,
    /// Its data may be staged in chunks (see the module's notes).
    pub staged: bool,
}

/// A COPY FROM STDIN receiving its data (see the module's notes). Dropped with rows
/// staged (the client went away), it aborts them.
pub struct CopyIn {
    pending: PendingCopy,
    /// Data received and not yet staged (from a row's start).
    buf: Vec<u8>,
    /// A chunk's buffer back from its parse, for the next chunk: its pages stay mapped.
    spare: Vec<u8>,
    /// The staged copy, once a chunk went.
    copy_id: Option<u64>,
    /// Chunks handed to tasks and not yet known applied, oldest first, at most
    /// [`MAX_CHUNKS_IN_FLIGHT`]: each task encodes (compresses) its chunk while the next is
    /// parsed, waits until the chunk before it is applied, then proposes it — so chunks
    /// stage in order.
    in_flight: VecDeque<JoinHandle<Result<Option<u64>>>>,
    /// What the newest task sends when its chunk is applied (or failed): the next task
    /// waits for it.
    last_applied: Option<oneshot::Receiver<Result<()>>>,
    /// Rows and lines staged so far (for the tag and for error lines).
    rows: u64,
    lines: usize,
    received: u64,
    /// The first failure: the rest of the data is read and dropped, then it is reported.
    failed: Option<Error>,
    /// The end-of-data marker was read: the rest of the data is dropped.
    ended: bool,
    /// A row longer than a chunk is looked for again once the buffer reaches this length.
    next_look: usize,
    /// Set once a chunk is staged: what aborts it when the COPY is dropped.
    engine: Option<Arc<Engine>>,
}

impl CopyIn {
    pub fn new(pending: PendingCopy) -> CopyIn {
        CopyIn {
            pending,
            buf: Vec::new(),
            spare: Vec::new(),
            copy_id: None,
            in_flight: VecDeque::new(),
            last_applied: None,
            rows: 0,
            lines: 0,
            received: 0,
            failed: None,
            ended: false,
            next_look: 0,
            engine: None,
        }
    }

    fn fail(&mut self, e: Error) {
        self.buf = Vec::new();
        if self.failed.is_none() {
            self.failed = Some(e);
        }
    }
}

impl Drop for CopyIn {
    fn drop(&mut self) {
        let Some(engine) = self.engine.take() else {
            return;
        };
        let (known, in_flight) = (self.copy_id.take(), std::mem::take(&mut self.in_flight));
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return; // the idle timeout ends it
        };
        runtime.spawn(async move {
            let mut copy_id = known;
            for handle in in_flight {
                if let Ok(Ok(staged)) = handle.await {
                    copy_id = copy_id.or(staged);
                }
            }
            let Some(copy_id) = copy_id else {
                return;
            };
            if let Err(e) = engine.propose(vec![abort_op(copy_id)]).await {
                tracing::info!(copy = copy_id, "could not abort an unfinished COPY: {e}");
            }
        });
    }
}

/// The copy a chunk's outcomes name.
fn staged_id(outcomes: &[OpOutcome]) -> Option<u64> {
    match outcomes.first() {
        Some(OpOutcome::CopyStaged { copy_id }) => Some(*copy_id),
        _ => None,
    }
}

fn abort_op(copy_id: u64) -> Op {
    Op {
        kind: Some(op::Kind::CopyAbort(CopyAbort { copy_id })),
    }
}

fn too_large(max: usize) -> Error {
    Error::new(
        sqlstate::PROGRAM_LIMIT_EXCEEDED,
        format!("COPY data exceeds the maximum of {max} bytes (max_copy_bytes)"),
    )
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
        let staged = match &target {
            CopyTarget::Stream(s) => {
                matches!(self.txn, Txn::Idle)
                    && s.def.id < LOCAL_ID_BASE
                    && s.def.options.dedup_key.is_none()
                    && !matches!(c.format, CopyFormat::Binary)
            }
            CopyTarget::Table(_) => false,
        };
        let pending = PendingCopy {
            target,
            targets,
            format: c.format.clone(),
            staged,
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

    /// Data of a COPY arrived: kept, or (a staged COPY with a chunk's worth) the whole rows
    /// staged. A failure is kept in `copy` (what was staged is aborted) and reported by
    /// [`Session::copy_done`]; the data after it is dropped.
    pub async fn copy_data(&mut self, copy: &mut CopyIn, data: &[u8]) {
        copy.received += data.len() as u64;
        if copy.failed.is_some() || copy.ended {
            return;
        }
        let limits = &self.engine.limits;
        if copy.buf.len() + data.len() > limits.max_copy_bytes {
            // a COPY held whole, or a row with no end in sight
            copy.fail(too_large(limits.max_copy_bytes));
            self.abort_staged(copy).await;
            return;
        }
        if copy.received > limits.max_staged_copy_bytes {
            copy.fail(Error::new(
                sqlstate::PROGRAM_LIMIT_EXCEEDED,
                format!(
                    "COPY data exceeds the maximum of {} bytes (max_staged_copy_bytes)",
                    limits.max_staged_copy_bytes
                ),
            ));
            self.abort_staged(copy).await;
            return;
        }
        copy.buf.extend_from_slice(data);
        if !copy.pending.staged {
            return;
        }
        let chunk = limits.copy_chunk_bytes;
        while !copy.ended && copy.buf.len() >= chunk {
            // whole rows of at most a chunk (a message may bring many chunks)
            let mut whole = copy::complete_rows_len(&copy.buf[..chunk], &copy.pending.format);
            if whole == 0 {
                // a row longer than a chunk: looked for again each time another chunk came
                if copy.buf.len() < copy.next_look {
                    return;
                }
                whole = copy::complete_rows_len(&copy.buf, &copy.pending.format);
                if whole == 0 {
                    copy.next_look = copy.buf.len() + chunk;
                    return;
                }
            }
            copy.next_look = 0;
            if let Err(e) = self.stage(copy, whole, false).await {
                copy.fail(e);
                self.abort_staged(copy).await;
                return;
            }
        }
    }

    /// The client's CopyDone: the COPY commits (its last rows with it), or its failure is
    /// reported.
    pub async fn copy_done(&mut self, mut copy: CopyIn) -> Result<Output> {
        if let Some(e) = copy.failed.take() {
            return Err(self.fail_block(e));
        }
        if !copy.pending.staged {
            let data = std::mem::take(&mut copy.buf);
            return self.finish_copy(copy.pending.clone(), &data).await;
        }
        let rest = copy.buf.len();
        match self.stage(&mut copy, rest, true).await {
            Ok(()) => {
                copy.copy_id = None; // committed: nothing to abort
                copy.engine = None;
                Ok(Output::Tag(format!("COPY {}", copy.rows)))
            }
            Err(e) => {
                self.abort_staged(&mut copy).await;
                Err(e)
            }
        }
    }

    /// The client's CopyFail (or the end of the connection's COPY): what was staged goes.
    pub async fn copy_fail(&mut self, mut copy: CopyIn) {
        self.abort_staged(&mut copy).await;
    }

    async fn abort_staged(&mut self, copy: &mut CopyIn) {
        // every chunk in flight ends first (failed or staged): the abort comes after them
        while let Some(handle) = copy.in_flight.pop_front() {
            if let Ok(Ok(staged)) = handle.await {
                copy.copy_id = copy.copy_id.or(staged);
            }
        }
        copy.last_applied = None;
        if let Some(copy_id) = copy.copy_id.take() {
            if let Err(e) = self.propose(vec![abort_op(copy_id)], 0, vec![]).await {
                tracing::info!(copy = copy_id, "could not abort a failed COPY: {e}");
            }
        }
    }

    /// Stages the first `len` bytes of `copy`'s data (whole rows): parsed and typed on the
    /// blocking pool, then encoded (compressed) and proposed by a task while the next chunk
    /// is parsed (see [`CopyIn::in_flight`]). The first chunk is waited for (the rest name
    /// the copy it starts). With `commit`, the last rows go with the commit once every
    /// chunk before them is applied, and this waits for it; a COPY that never staged a
    /// chunk and fits in one command is one append.
    async fn stage(&mut self, copy: &mut CopyIn, len: usize, commit: bool) -> Result<()> {
        let CopyTarget::Stream(stream) = &copy.pending.target else {
            return Err(Error::internal("only a COPY into a stream is staged"));
        };
        let stream = stream.clone();
        // the rest goes into the spare buffer, sized for a chunk and the message after it
        let mut rest = std::mem::take(&mut copy.spare);
        rest.clear();
        rest.reserve(self.engine.limits.copy_chunk_bytes + SLACK_BYTES);
        rest.extend_from_slice(&copy.buf[len..]);
        copy.buf.truncate(len);
        let data = std::mem::replace(&mut copy.buf, rest);
        // the connection's worker goes on serving the other connections meanwhile
        let (pending, first_line, rows_before) = (copy.pending.clone(), copy.lines + 1, copy.rows);
        // a chunk's typed rows are bounded by the chunk (Arrow's compact form)
        let (max_row_bytes, budget) = (self.engine.limits.max_row_bytes, usize::MAX);
        let target = stream.clone();
        let (parsed, data) = tokio::task::spawn_blocking(move || {
            let parsed = parse_batch(
                &pending,
                &target,
                &data,
                first_line,
                rows_before,
                max_row_bytes,
                budget,
            )
            .map(|(batch, n, ended)| {
                let lines = memchr::memchr_iter(b'\n', &data).count();
                (batch, n, lines, ended)
            });
            (parsed, data)
        })
        .await
        .map_err(|e| Error::internal(format!("parsing a COPY chunk failed: {e}")))?;
        copy.spare = data;
        let (batch, n, lines, ended) = parsed?;
        copy.lines += lines;
        if ended {
            copy.ended = true;
            copy.buf = Vec::new();
        }
        let bound = if commit || copy.copy_id.is_none() {
            0
        } else {
            MAX_CHUNKS_IN_FLIGHT - 1
        };
        settle(copy, bound).await?;
        copy.rows += n as u64;
        let rows = StagedRows {
            engine: self.engine.clone(),
            stream,
            batch,
            copy_id: copy.copy_id,
            commit,
        };
        if commit {
            rows.propose(None).await?;
            return Ok(());
        }
        if rows.batch.is_none() {
            return Ok(());
        }
        copy.engine = Some(self.engine.clone());
        let before = copy.last_applied.take();
        let (applied, next) = oneshot::channel();
        copy.last_applied = Some(next);
        copy.in_flight.push_back(tokio::spawn(async move {
            let result = rows.propose(before).await;
            let _ = applied.send(result.as_ref().map(|_| ()).map_err(Error::clone));
            result
        }));
        Ok(())
    }

    async fn finish_copy_inner(&mut self, copy: PendingCopy, data: &[u8]) -> Result<Output> {
        if data.len() > self.engine.limits.max_copy_bytes {
            return Err(too_large(self.engine.limits.max_copy_bytes));
        }
        if let (CopyTarget::Stream(stream), false) =
            (&copy.target, matches!(copy.format, CopyFormat::Binary))
        {
            let (max_row_bytes, budget) = (self.engine.limits.max_row_bytes, self.typed_budget());
            let (batch, n, _) = parse_batch(&copy, stream, data, 1, 0, max_row_bytes, budget)?;
            if let Some(batch) = batch {
                self.append(stream, &batch).await?;
            }
            return Ok(Output::Tag(format!("COPY {n}")));
        }
        let (values, _) = parse_values(&copy, data, 1, 0, self.typed_budget())?;
        self.append_copied(&copy, values).await
    }

    /// At most how many bytes the rows of a COPY held whole take once typed, as
    /// `ScalarValue`s count (see [`crate::copy_columns::over_budget`]).
    fn typed_budget(&self) -> usize {
        self.engine.limits.max_copy_bytes.saturating_mul(4)
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

/// Rows of a staged COPY on their way into the log (see [`Session::stage`]).
struct StagedRows {
    engine: Arc<Engine>,
    stream: Arc<Stream>,
    batch: Option<RecordBatch>,
    /// The copy they continue (`None`: they start one).
    copy_id: Option<u64>,
    /// The copy's last rows: its commit goes with them.
    commit: bool,
}

impl StagedRows {
    /// Encodes the rows, waits until the chunk `before` them is applied, and proposes them:
    /// as `CopyChunk`s of at most half of `max_statement_bytes` each (data that grew when
    /// typed is cut again), the last one with the commit when `commit`. A copy that
    /// staged nothing before and fits in one command is one `Append`. Returns the copy.
    async fn propose(self, before: Option<oneshot::Receiver<Result<()>>>) -> Result<Option<u64>> {
        let StagedRows {
            engine,
            stream,
            batch,
            mut copy_id,
            commit,
        } = self;
        let max = engine.limits.max_statement_bytes;
        let pieces = match batch {
            Some(b) => fitting_pieces(&stream, b, max / 2)?,
            None => Vec::new(),
        };
        let idle_timeout_ms = engine.limits.copy_idle_timeout.as_millis() as u64;
        let count = pieces.len();
        let mut before = before;
        let mut committed = false;
        for (i, piece) in pieces.into_iter().enumerate() {
            let (s, rows) = (stream.clone(), piece.num_rows() as u32);
            let (encoded, _) =
                tokio::task::spawn_blocking(move || super::append::encode_append(&s, &piece, max))
                    .await
                    .map_err(|e| Error::internal(format!("encoding a COPY chunk failed: {e}")))??;
            if let Some(before) = before.take() {
                before
                    .await
                    .map_err(|_| Error::internal("the COPY chunk before this one was lost"))??;
            }
            let last = i + 1 == count;
            let mut ops = Vec::with_capacity(2);
            if commit && last && copy_id.is_none() {
                // nothing staged: the whole COPY is this one append
                ops.push(Op {
                    kind: Some(op::Kind::Append(Append {
                        stream: stream.name().to_string(),
                        stream_id: stream.def.id,
                        ipc: encoded.ipc.into(),
                        rows,
                        logical_len: encoded.logical_len,
                    })),
                });
                engine.propose(ops).await?;
                return Ok(None);
            }
            ops.push(Op {
                kind: Some(op::Kind::CopyChunk(CopyChunk {
                    copy_id: copy_id.unwrap_or(0),
                    stream: stream.name().to_string(),
                    stream_id: stream.def.id,
                    ipc: encoded.ipc.into(),
                    rows,
                    idle_timeout_ms,
                })),
            });
            if let (true, true, Some(id)) = (commit, last, copy_id) {
                ops.push(commit_op(&stream, id));
                committed = true;
            }
            let outcomes = engine.propose(ops).await?;
            copy_id = copy_id.or_else(|| staged_id(&outcomes));
        }
        if let Some(before) = before {
            before
                .await
                .map_err(|_| Error::internal("the COPY chunk before this one was lost"))??;
        }
        if let (true, false, Some(id)) = (commit, committed, copy_id) {
            engine.propose(vec![commit_op(&stream, id)]).await?;
        }
        Ok(copy_id)
    }
}

fn commit_op(stream: &Stream, copy_id: u64) -> Op {
    Op {
        kind: Some(op::Kind::CopyCommit(CopyCommit {
            copy_id,
            stream: stream.name().to_string(),
            stream_id: stream.def.id,
        })),
    }
}

/// `batch` cut into pieces whose data takes at most `limit` bytes each (rows typed from a
/// chunk of text may take several times its size: short numbers, NULLs), each compacted
/// so that its size is its own.
fn fitting_pieces(stream: &Stream, batch: RecordBatch, limit: usize) -> Result<Vec<RecordBatch>> {
    let size = crate::ipc::batch_data_len(&batch);
    let rows = batch.num_rows();
    if size <= limit || rows <= 1 {
        return Ok(vec![batch]);
    }
    let pieces = size.div_ceil(limit.max(1)).min(rows);
    let per = rows.div_ceil(pieces);
    (0..rows)
        .step_by(per)
        .map(|at| {
            let slice = batch.slice(at, per.min(rows - at));
            Ok(arrow::compute::concat_batches(
                &stream.user_schema,
                [&slice],
            )?)
        })
        .collect()
}

/// Waits until at most `bound` chunks are in flight (oldest first), learning the copy's id
/// from the first chunk.
async fn settle(copy: &mut CopyIn, bound: usize) -> Result<()> {
    while copy.in_flight.len() > bound {
        let Some(handle) = copy.in_flight.pop_front() else {
            break;
        };
        let staged = handle
            .await
            .map_err(|e| Error::internal(format!("a COPY chunk's proposal failed: {e}")))??;
        copy.copy_id = copy.copy_id.or(staged);
    }
    if copy.in_flight.is_empty() {
        copy.last_applied = None;
    }
    Ok(())
}

/// A piece of text or CSV COPY data into a stream (starting at line `first_line`, after
/// `rows_before` rows), typed straight into the stream's batch ([`crate::copy_columns`]): the
/// batch (none without rows), its rows, and whether the end marker ended the data.
fn parse_batch(
    copy: &PendingCopy,
    stream: &Stream,
    data: &[u8],
    first_line: usize,
    rows_before: u64,
    max_row_bytes: usize,
    budget: usize,
) -> Result<(Option<RecordBatch>, usize, bool)> {
    let origin = Origin {
        relation: copy.target.name(),
        rows_before,
    };
    let mut columns = TypedColumns::new(stream, &copy.targets, data.len(), max_row_bytes, budget);
    let mut n = 0;
    let ended = copy::for_each_row(
        utf8(data)?,
        &copy.format,
        first_line,
        copy.targets.len(),
        |fields| {
            n += 1;
            columns.push(fields, &origin)
        },
    )?;
    Ok((columns.finish()?, n, ended))
}

fn utf8(data: &[u8]) -> Result<&str> {
    std::str::from_utf8(data).map_err(|_| {
        Error::new(
            sqlstate::CHARACTER_NOT_IN_REPERTOIRE,
            "invalid byte sequence for encoding \"UTF8\"",
        )
    })
}

/// Typed rows from a piece of COPY data that starts at line `first_line` after `rows_before`
/// rows, held whole (a COPY into a table, in binary): at most `budget` bytes of them.
fn parse_values(
    copy: &PendingCopy,
    data: &[u8],
    first_line: usize,
    rows_before: u64,
    budget: usize,
) -> Result<(Vec<Vec<ScalarValue>>, bool)> {
    let mut held = HeldRows {
        copy,
        origin: Origin {
            relation: copy.target.name(),
            rows_before,
        },
        rows: Vec::new(),
        budget: Budget::new(budget),
    };
    if matches!(copy.format, CopyFormat::Binary) {
        crate::binary::for_each_copy_row(data, |row| {
            held.push(row.drain(..), crate::binary::decode)
        })?;
        return Ok((held.rows, false));
    }
    let ended = copy::for_each_row(
        utf8(data)?,
        &copy.format,
        first_line,
        copy.targets.len(),
        |fields| held.push(fields.drain(..), |ty, text: Cow<str>| ty.parse_text(&text)),
    )?;
    Ok((held.rows, ended))
}

/// Rows of a COPY held whole, typed as they come: at most `budget` bytes of them (as
/// `ScalarValue::size` counts, and each row's vector), so that data of many tiny fields
/// (a `ScalarValue` takes 48 bytes and more) cannot take the server's memory.
struct HeldRows<'c> {
    copy: &'c PendingCopy,
    origin: Origin<'c>,
    rows: Vec<Vec<ScalarValue>>,
    budget: Budget,
}

impl HeldRows<'_> {
    /// Types a row's fields (`None` = NULL) with `decode`; an error names the COPY line.
    fn push<F>(
        &mut self,
        fields: impl ExactSizeIterator<Item = Option<F>>,
        decode: impl Fn(ColumnType, F) -> Result<ScalarValue>,
    ) -> Result<()> {
        let (copy, i) = (self.copy, self.rows.len());
        self.origin
            .check_width(i, fields.len(), copy.targets.len())?;
        let row = fields
            .zip(&copy.targets)
            .map(|(f, &t)| {
                let ty = copy.target.column_type(t);
                match f {
                    None => ty.coerce(ScalarValue::Null),
                    Some(v) => decode(ty, v).and_then(|v| ty.coerce(v)),
                }
                .map_err(|e| e.with_detail(self.origin.line(i)))
            })
            .collect::<Result<Vec<_>>>()?;
        let vector = std::mem::size_of::<Vec<ScalarValue>>();
        self.budget
            .take(vector + row.iter().map(ScalarValue::size).sum::<usize>())?;
        self.rows.push(row);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::definition::{ColumnDef, StreamDef, StreamOptions};
    use rand::{Rng, SeedableRng};
    use sluice_storage::stream_log::{StreamLog, StreamLogOptions};

    fn column(name: &str, ty: &str, not_null: bool, default: Option<&str>) -> ColumnDef {
        ColumnDef {
            name: name.into(),
            ty: ColumnType::parse(ty).expect("a type"),
            not_null,
            default: default.map(str::to_string),
        }
    }

    /// Values each column type reads or refuses (quotes, commas, newlines, bad input).
    const POOLS: &[(&str, &[&str])] = &[
        (
            "text",
            &["", "a", "x,y", "say \"hi\"", "two\nlines", "日本"],
        ),
        ("varchar(3)", &["abc", "abcd", "é", ""]),
        ("int4", &["1", "-7", "2147483648", "x", " 3 "]),
        (
            "numeric(5,2)",
            &["1.5", "999.999", "12345", "-0.01", "1e2", "n"],
        ),
        ("bool", &["t", "false", "yes", "maybe"]),
        (
            "jsonb",
            &["{\"b\": 1, \"a\": [1,2]}", "[1, 2", "null", "\"s\""],
        ),
        ("uuid", &["A0EEBC99-9C0B-4EF8-BB6D-6BB9BD380A11", "nope"]),
        (
            "timestamptz",
            &["2024-01-02 03:04:05+02", "2024-13-01", "epoch"],
        ),
        ("date", &["2024-02-29", "2023-02-29", "2024-01-02 10:00"]),
        ("text[]", &["{a,b}", "{\"x y\",NULL}", "{unclosed"]),
        ("bytea", &["\\x00ff", "\\xzz", "plain"]),
        ("float8", &["1.5", "NaN", "-Infinity", "1e400", "f"]),
    ];

    /// A stream with a column of every pooled type, a NOT NULL `must` and a `later` with a
    /// default (left out of the targets), and a CSV COPY into all the others.
    fn pooled_stream(dir: &std::path::Path) -> (Arc<Stream>, Vec<usize>, PendingCopy) {
        let mut columns: Vec<ColumnDef> = POOLS
            .iter()
            .enumerate()
            .map(|(i, (ty, _))| column(&format!("c{i}"), ty, false, None))
            .collect();
        columns.push(column("must", "text", true, None));
        columns.push(column("later", "int8", false, Some("7")));
        let def = StreamDef {
            id: 1,
            oid: 1,
            name: "s".into(),
            columns,
            options: StreamOptions::default(),
        };
        let log = StreamLog::create(
            dir,
            StreamLogOptions {
                segment_bytes: 1 << 20,
            },
        )
        .expect("a log");
        let stream = Arc::new(Stream::new(def, Arc::new(log)));
        let targets: Vec<usize> = (0..=POOLS.len()).collect();
        let copy = PendingCopy {
            target: CopyTarget::Stream(stream.clone()),
            targets: targets.clone(),
            format: CopyFormat::Csv {
                delimiter: ',',
                quote: '"',
                escape: '"',
                null: String::new(),
                header: false,
            },
            staged: true,
        };
        (stream, targets, copy)
    }

    /// Typed straight into columns (`parse_batch`), random CSV rows give the batch or the
    /// error that typing every field into a `ScalarValue` and `build_batch` give.
    #[test]
    fn columns_typed_from_text_match_values_typed_one_by_one() {
        let dir = tempfile::tempdir().expect("a directory");
        let (stream, targets, copy) = pooled_stream(dir.path());
        let mut rng = rand::rngs::StdRng::seed_from_u64(25);
        let (mut same_batches, mut same_errors) = (0, 0);
        for case in 0..3_000 {
            let mut data = String::new();
            for _ in 0..rng.gen_range(1..6) {
                let mut fields: Vec<String> = Vec::new();
                let width = match rng.gen_range(0..40) {
                    0 => targets.len() - 1,
                    1 => targets.len() + 1,
                    _ => targets.len(),
                };
                for i in 0..width {
                    let pool = POOLS.get(i).map_or(&["m", "n"][..], |p| p.1);
                    // valid values mostly, so that whole rows get through
                    let v = match rng.gen_range(0..30) {
                        0 => None,
                        k if k < 28 => Some(pool[0]),
                        _ => Some(pool[rng.gen_range(0..pool.len())]),
                    };
                    fields.push(match v {
                        None => String::new(),
                        Some(v) => format!("\"{}\"", v.replace('"', "\"\"")),
                    });
                }
                data.push_str(&fields.join(","));
                data.push('\n');
            }
            let max_row_bytes = if case % 10 == 0 { 900 } else { 1 << 20 };
            let rows_before = case as u64;
            let got = parse_batch(
                &copy,
                &stream,
                data.as_bytes(),
                1,
                rows_before,
                max_row_bytes,
                usize::MAX,
            )
            .map(|(b, _, _)| b);
            let want = parse_values(&copy, data.as_bytes(), 1, rows_before, usize::MAX).and_then(
                |(v, _)| insert::build_batch(&stream, &targets, v, max_row_bytes).map(Some),
            );
            match (got, want) {
                (Ok(g), Ok(w)) => {
                    assert_eq!(g, w, "{data:?}");
                    same_batches += 1;
                }
                (Err(g), Err(w)) => {
                    assert_eq!(
                        (&g.code, &g.message, &g.detail),
                        (&w.code, &w.message, &w.detail),
                        "{data:?}"
                    );
                    same_errors += 1;
                }
                (g, w) => panic!("{data:?}: typed {g:?}, one by one {w:?}"),
            }
        }
        // both kinds of outcome were compared, many times
        assert!(
            same_batches > 500 && same_errors > 500,
            "{same_batches} / {same_errors}"
        );
    }

    /// A one-row INSERT's batch (each value straight to its array, the left-out columns
    /// shared from the stream) is the one the many-row path builds for that row: same
    /// arrays, same errors (NOT NULL, row size).
    #[test]
    fn one_row_batches_match_the_many_row_path() {
        let dir = tempfile::tempdir().expect("a directory");
        let (stream, targets, copy) = pooled_stream(dir.path());
        let mut rng = rand::rngs::StdRng::seed_from_u64(26);
        let (mut same_batches, mut same_errors) = (0, 0);
        for case in 0..1_000 {
            let fields: Vec<String> = (0..targets.len())
                .map(|i| {
                    let pool = POOLS.get(i).map_or(&["m", "n"][..], |p| p.1);
                    // valid values mostly (the first of each pool), so that rows get through
                    let v = match rng.gen_range(0..30) {
                        0 => return String::new(),
                        k if k < 28 => pool[0],
                        _ => pool[rng.gen_range(0..pool.len())],
                    };
                    format!("\"{}\"", v.replace('"', "\"\""))
                })
                .collect();
            let data = format!("{}\n", fields.join(","));
            let Ok((rows, _)) = parse_values(&copy, data.as_bytes(), 1, 0, usize::MAX) else {
                continue;
            };
            let max_row_bytes = if case % 10 == 0 { 40 } else { 1 << 20 };
            let one = insert::build_batch(&stream, &targets, rows.clone(), max_row_bytes);
            let twice = [rows.clone(), rows].concat();
            let many = insert::build_batch(&stream, &targets, twice, max_row_bytes);
            match (one, many) {
                (Ok(one), Ok(many)) => {
                    assert_eq!(one, many.slice(0, 1), "{data:?}");
                    same_batches += 1;
                }
                (Err(o), Err(m)) => {
                    assert_eq!((&o.code, &o.message), (&m.code, &m.message), "{data:?}");
                    same_errors += 1;
                }
                (o, m) => panic!("{data:?}: one row {o:?}, many rows {m:?}"),
            }
        }
        assert!(
            same_batches > 300 && same_errors > 50,
            "{same_batches} / {same_errors}"
        );
        // a second row leaving out the same column shares its one-row array
        let a = stream.missing_column(targets.len(), 1).expect("a default");
        let b = stream.missing_column(targets.len(), 1).expect("a default");
        assert!(Arc::ptr_eq(&a, &b));
        assert_eq!(a.len(), 1);
    }
}
