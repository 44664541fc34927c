//! `StreamLog`: one stream's offsets, stored as a sequence of segment files
//! in the stream's directory, with an in-memory index of every frame.
//!
//! Invariants: offsets are gapless from the first segment's base to
//! `next_offset`; the last segment is the active one and the only one
//! written; an index entry (and `next_offset`) is published only after its
//! frame's bytes are written, so readers never see a partial frame. One
//! writer (append, sync, truncate_prefix) runs at a time under the writer
//! mutex; readers take the index read lock only to copy entries or clone a
//! file handle, never across I/O. Lock order: writer, then index.
//!
//! Durability is the caller's checkpoint: `sync` returns the position up to
//! which everything is on disk, and `open` discards whatever lies beyond the
//! checkpoint it is given. Hence a segment file is deleted only once a
//! checkpoint no longer needs it (its base is below the last checkpoint's
//! segment), and after any I/O error the log is poisoned and refuses writes
//! rather than pretend something is durable.
//!
//! Staged appends ([`StreamLog::append_staged`]) let an applier that appends many small
//! frames in a row (a Raft batch of single-row INSERTs) write them with one `pwrite`: their
//! bytes wait in memory, contiguous with the file's end, and their index entries wait
//! unpublished; [`StreamLog::publish`] writes the bytes and then publishes. Every other write
//! path (a plain append, `sync`, `truncate_prefix`, a segment roll) writes them first, so the
//! file never holds a frame after a gap, and a checkpoint never covers bytes still in memory.
//!
//! Which offsets must exist is recorded too: the checkpoint's `first_offset`,
//! and — because a prefix truncation deletes files before the next checkpoint
//! is taken — a `first_offset` file in the stream's directory, made durable
//! before any segment is deleted. `open` refuses a directory whose first
//! segment starts after the larger of the two (a deleted or lost segment file
//! is corruption, never a log that silently starts later).

use std::fmt;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use arrow::record_batch::RecordBatch;
use parking_lot::{Mutex, RwLock};
use serde::{Deserialize, Serialize};
use tracing::{debug, info};

use crate::durable::{list_segments, sync_dir};
use crate::error::{Error, Result};
use crate::frame::{self, HEADER_LEN};
use crate::segment::{self, FrameEntry, Segment, SegmentFile, TornTail};

/// Most bytes of frames [`StreamLog::append_staged`] keeps in memory before writing them.
pub const STAGE_BYTES: usize = 1 << 20;

/// A stream keeps a staging buffer up to this capacity between writes.
const STAGE_KEEP_BYTES: usize = 64 << 10;

/// Tuning for a [`StreamLog`].
#[derive(Debug, Clone)]
pub struct StreamLogOptions {
    /// Once the active segment holds at least this many bytes, the next
    /// append starts a new segment.
    pub segment_bytes: u64,
}

impl Default for StreamLogOptions {
    fn default() -> Self {
        StreamLogOptions {
            segment_bytes: 64 * 1024 * 1024,
        }
    }
}

/// Durable position recorded by the caller's checkpoint.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StreamCheckpoint {
    /// First retained offset (prefix truncation).
    pub first_offset: u64,
    /// Base offset of the segment that was active at the checkpoint.
    pub segment_base: u64,
    /// Bytes of that segment made durable.
    pub segment_len: u64,
}

/// Index entry for one frame (one appended batch).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchMeta {
    pub base_offset: u64,
    pub rows: u32,
    pub ts_micros: i64,
    pub segment_base: u64,
    /// Byte position of the frame in its segment file.
    pub position: u64,
    /// Length of the whole frame (header and payload).
    pub len: u32,
}

impl BatchMeta {
    /// The offset after this batch's last row.
    pub fn end_offset(&self) -> u64 {
        self.base_offset + u64::from(self.rows)
    }
}

/// Summary of one segment file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SegmentInfo {
    pub base_offset: u64,
    pub next_offset: u64,
    pub bytes: u64,
    /// `bytes` without Arrow buffer compression.
    pub logical_bytes: u64,
    pub min_ts_micros: Option<i64>,
    pub max_ts_micros: Option<i64>,
    pub path: PathBuf,
}

/// A stream's log of Arrow IPC record batches. `Send + Sync`: share it as
/// `Arc<StreamLog>` between one writer thread and any number of readers.
pub struct StreamLog {
    dir: PathBuf,
    opts: StreamLogOptions,
    index: RwLock<Index>,
    writer: Mutex<Writer>,
    /// Bytes read by reads from segment files deleted since (see [`StreamLog::bytes_read`]).
    deleted_bytes_read: AtomicU64,
}

/// What readers see.
struct Index {
    sealed: Vec<Segment>,
    active: Segment,
    first_offset: u64,
    /// The offset the next appended row gets (frames written so far).
    write_offset: u64,
    /// Readers see offsets below this: `write_offset` except while frames appended with
    /// [`StreamLog::append_unpublished`] wait for [`StreamLog::publish`].
    next_offset: u64,
    last_ts_micros: Option<i64>,
}

impl Index {
    fn segments(&self) -> impl Iterator<Item = &Segment> {
        self.sealed.iter().chain(std::iter::once(&self.active))
    }

    fn segment(&self, base: u64) -> Option<&Segment> {
        if self.active.base() == base {
            return Some(&self.active);
        }
        let i = self
            .sealed
            .binary_search_by_key(&base, Segment::base)
            .ok()?;
        self.sealed.get(i)
    }
}

/// What one checkpoint must fsync of a log, and the position that is durable once it has
/// (see [`StreamLog::begin_sync`]). Holds the files open: a segment deleted or sealed
/// meanwhile is still synced.
#[derive(Debug)]
pub struct PendingSync {
    files: Vec<Arc<SegmentFile>>,
    dirs: Vec<PathBuf>,
    /// The position to record once [`PendingSync::run`] returned `Ok`.
    pub checkpoint: StreamCheckpoint,
}

impl PendingSync {
    /// Fsyncs the files and directories, without the writer lock. A failure poisons `log`
    /// (the log these came from), as a failed [`StreamLog::sync`] does.
    pub fn run(&self, log: &StreamLog) -> Result<()> {
        let synced = self
            .files
            .iter()
            .try_for_each(|f| f.sync())
            .and_then(|()| self.dirs.iter().try_for_each(|d| sync_dir(d)));
        synced.map_err(|e| log.writer.lock().poison(e))
    }
}

/// The writer's private state.
struct Writer {
    active: Arc<SegmentFile>,
    active_len: u64,
    active_unsynced: bool,
    /// Sealed segments written since the last sync.
    sealed_unsynced: Vec<Arc<SegmentFile>>,
    dir_unsynced: bool,
    parent_unsynced: bool,
    /// Segment base of the last checkpoint handed out (or opened from):
    /// files from this segment on must survive until a later checkpoint.
    durable_base: u64,
    poisoned: Option<String>,
    /// Bytes of frames staged by [`StreamLog::append_staged`], to be written at
    /// `staged_at` in the active segment (`active_len` already counts them).
    staged: Vec<u8>,
    staged_at: u64,
}

impl Writer {
    fn check(&self) -> Result<()> {
        match &self.poisoned {
            Some(reason) => Err(Error::Poisoned(reason.clone())),
            None => Ok(()),
        }
    }

    fn poison(&mut self, err: Error) -> Error {
        self.poisoned = Some(err.to_string());
        err
    }
}

impl StreamLog {
    /// Creates a brand-new empty stream in `dir`, deleting anything already
    /// there (a replayed CREATE must start clean). The first segment's base
    /// is 0.
    pub fn create(dir: &Path, opts: StreamLogOptions) -> Result<StreamLog> {
        match fs::remove_dir_all(dir) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(Error::io(dir)(e)),
            _ => {}
        }
        fs::create_dir_all(dir).map_err(Error::io(dir))?;
        let file = Arc::new(SegmentFile::create(dir, 0)?);
        Ok(Self::assemble(
            dir,
            opts,
            Vec::new(),
            Segment::new(file),
            0,
            0,
            true,
        ))
    }

    /// Opens an existing stream after a restart. Everything past
    /// `checkpoint` was never made durable by a checkpoint and is removed (the
    /// caller replays it). Every remaining frame is verified: an incomplete
    /// final frame (torn write) is truncated with a warning; a complete frame
    /// that does not verify is [`Error::Corrupt`]. The index is rebuilt from
    /// the frame headers.
    pub fn open(
        dir: &Path,
        opts: StreamLogOptions,
        checkpoint: &StreamCheckpoint,
    ) -> Result<StreamLog> {
        let created_dir = !dir.exists();
        fs::create_dir_all(dir).map_err(Error::io(dir))?;
        let mut found = list_segments(dir)?;
        let mut dir_changed = created_dir;

        let keep = found.partition_point(|(base, _)| *base <= checkpoint.segment_base);
        for (_, path) in found.drain(keep..) {
            info!(path = %path.display(), "removing segment created after the last checkpoint");
            fs::remove_file(&path).map_err(Error::io(&path))?;
            dir_changed = true;
        }
        let (active_base, active_path) = match found.pop() {
            Some((base, path)) if base == checkpoint.segment_base => (base, path),
            other => {
                found.extend(other);
                let base = checkpoint.segment_base;
                let path = dir.join(segment::file_name(base));
                if checkpoint.segment_len > 0 {
                    return Err(Error::corrupt(
                        &path,
                        0,
                        format!(
                            "segment is missing but the checkpoint records {} durable bytes",
                            checkpoint.segment_len
                        ),
                    ));
                }
                SegmentFile::create(dir, base)?;
                dir_changed = true;
                (base, path)
            }
        };

        let mut sealed = Vec::with_capacity(found.len());
        let mut prev_end = None;
        let mut recover = |path: PathBuf, base: u64, limit, torn_tail| {
            if let Some(end) = prev_end.filter(|end| *end != base) {
                return Err(Error::corrupt(
                    &path,
                    0,
                    format!("segment starts at offset {base} but the previous one ends at {end}"),
                ));
            }
            let segment = Segment::recover(path, base, limit, torn_tail)?;
            prev_end = Some(segment.end_offset());
            Ok(segment)
        };
        for (base, path) in found {
            sealed.push(recover(path, base, None, TornTail::Reject)?);
        }
        let active = recover(
            active_path,
            active_base,
            Some(checkpoint.segment_len),
            TornTail::Truncate,
        )?;
        let first_offset = sealed.first().unwrap_or(&active).base();
        let required = checkpoint.first_offset.max(read_first_offset(dir)?);
        if first_offset > required {
            return Err(Error::corrupt(
                &dir.join(segment::file_name(first_offset)),
                0,
                format!(
                    "the first segment starts at offset {first_offset}, but offsets from \
                     {required} must exist: a segment file before it is missing"
                ),
            ));
        }
        let log = Self::assemble(
            dir,
            opts,
            sealed,
            active,
            required,
            checkpoint.segment_base,
            dir_changed,
        );
        Ok(log)
    }

    fn assemble(
        dir: &Path,
        opts: StreamLogOptions,
        sealed: Vec<Segment>,
        active: Segment,
        first_offset: u64,
        durable_base: u64,
        dir_unsynced: bool,
    ) -> StreamLog {
        let next_offset = active.end_offset();
        let last_ts_micros = active
            .last_ts_micros()
            .or_else(|| sealed.iter().rev().find_map(Segment::last_ts_micros));
        let writer = Writer {
            active: Arc::clone(active.file()),
            active_len: active.bytes(),
            active_unsynced: false,
            sealed_unsynced: Vec::new(),
            dir_unsynced,
            parent_unsynced: dir_unsynced,
            durable_base,
            poisoned: None,
            staged: Vec::new(),
            staged_at: 0,
        };
        let index = Index {
            sealed,
            active,
            first_offset: first_offset.min(next_offset),
            write_offset: next_offset,
            next_offset,
            last_ts_micros,
        };
        StreamLog {
            dir: dir.to_path_buf(),
            opts,
            index: RwLock::new(index),
            writer: Mutex::new(writer),
            deleted_bytes_read: AtomicU64::new(0),
        }
    }

    /// Appends one frame holding `ipc`, the bytes of an Arrow IPC stream with
    /// exactly one record batch of `rows` rows (written verbatim), committed
    /// at `ts_micros`. Assigns offsets `next_offset..next_offset + rows` and
    /// returns the first. No fsync; see [`StreamLog::sync`].
    pub fn append(&self, ipc: &[u8], rows: u32, ts_micros: i64) -> Result<u64> {
        self.append_frame(ipc, rows, ts_micros, None, true)
    }

    /// [`StreamLog::append`] without showing the frame to readers: frames appended this
    /// way become visible together at the next [`StreamLog::publish`] (or at the next
    /// plain append), so a batch of frames (a staged COPY's) is seen whole or not at all.
    pub fn append_unpublished(&self, ipc: &[u8], rows: u32, ts_micros: i64) -> Result<u64> {
        self.append_frame(ipc, rows, ts_micros, None, false)
    }

    /// [`StreamLog::append_unpublished`] that may keep a small frame's bytes in memory: they
    /// are written, with every frame staged after them, in one `pwrite` at the next
    /// [`StreamLog::publish`] (or any other write), which also publishes them. The offsets
    /// are assigned now. At most [`STAGE_BYTES`] wait; a frame beyond that, or one larger
    /// than a small frame, is written at once (still unpublished). `logical_len` is
    /// [`frame::logical_len`] of `ipc` when the caller knows it (its encoder does), so that
    /// the bytes are not parsed again here; `None`: computed.
    pub fn append_staged(
        &self,
        ipc: &[u8],
        rows: u32,
        ts_micros: i64,
        logical_len: Option<u64>,
    ) -> Result<u64> {
        if ipc.len() > segment::SMALL_FRAME {
            return self.append_frame(ipc, rows, ts_micros, logical_len, false);
        }
        let mut w = self.writer.lock();
        w.check()?;
        if w.staged.len() + HEADER_LEN + ipc.len() > STAGE_BYTES {
            self.write_staged(&mut w)?;
        }
        if w.active_len > 0 && w.active_len >= self.opts.segment_bytes {
            self.write_staged(&mut w)?;
            self.roll(&mut w).map_err(|e| w.poison(e))?;
        }
        let (header, entry) = self.next_frame(&w, ipc, rows, ts_micros)?;
        if w.staged.is_empty() {
            w.staged_at = entry.position;
        }
        w.staged.extend_from_slice(&header);
        w.staged.extend_from_slice(ipc);
        self.index_frame(&mut w, ipc, logical_len, &header, entry, false);
        Ok(entry.base_offset)
    }

    /// Writes the staged frames (one `pwrite`) and shows readers every frame appended so
    /// far. A failed write poisons the log.
    pub fn publish(&self) -> Result<()> {
        let mut w = self.writer.lock();
        w.check()?;
        self.write_staged(&mut w)?;
        let mut index = self.index.write();
        index.next_offset = index.write_offset;
        Ok(())
    }

    /// Writes the staged frames' bytes, unpublished. Callers check the log is not poisoned.
    fn write_staged(&self, w: &mut Writer) -> Result<()> {
        if w.staged.is_empty() {
            return Ok(());
        }
        let written = w.active.write_at(w.staged_at, &w.staged);
        w.staged.clear();
        if w.staged.capacity() > STAGE_KEEP_BYTES {
            w.staged = Vec::new(); // a burst's buffer is not kept by an idle stream
        }
        written.map_err(|e| w.poison(e))
    }

    /// The header and index entry of a frame of `ipc` at the next offset and at the end of
    /// the active segment.
    fn next_frame(
        &self,
        w: &Writer,
        ipc: &[u8],
        rows: u32,
        ts_micros: i64,
    ) -> Result<([u8; HEADER_LEN], FrameEntry)> {
        let base_offset = self.index.read().write_offset;
        match (
            frame::encode_header(base_offset, rows, ts_micros, ipc),
            u32::try_from(HEADER_LEN + ipc.len()),
        ) {
            (Some(header), Ok(len)) => Ok((
                header,
                FrameEntry {
                    base_offset,
                    position: w.active_len,
                    len,
                    rows,
                    ts_micros,
                },
            )),
            _ => Err(Error::io(w.active.path())(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("a batch of {} bytes does not fit in a frame", ipc.len()),
            ))),
        }
    }

    /// Counts the frame `entry` written (or staged) and adds it to the index.
    fn index_frame(
        &self,
        w: &mut Writer,
        ipc: &[u8],
        logical_len: Option<u64>,
        header: &[u8; HEADER_LEN],
        entry: FrameEntry,
        publish: bool,
    ) {
        w.active_len += u64::from(entry.len);
        w.active_unsynced = true;
        debug_assert!(logical_len.is_none_or(|l| l == frame::logical_len(ipc)));
        let logical = HEADER_LEN as u64 + logical_len.unwrap_or_else(|| frame::logical_len(ipc));
        let parts = segment::parts_worth_keeping(header, ipc);
        let mut index = self.index.write();
        index.write_offset = entry.base_offset + u64::from(entry.rows);
        if publish {
            index.next_offset = index.write_offset;
        }
        index.last_ts_micros = Some(entry.ts_micros);
        index.active.push(logical, entry, parts);
    }

    fn append_frame(
        &self,
        ipc: &[u8],
        rows: u32,
        ts_micros: i64,
        logical_len: Option<u64>,
        publish: bool,
    ) -> Result<u64> {
        let mut w = self.writer.lock();
        w.check()?;
        self.write_staged(&mut w)?;
        if w.active_len > 0 && w.active_len >= self.opts.segment_bytes {
            self.roll(&mut w).map_err(|e| w.poison(e))?;
        }
        let (header, entry) = self.next_frame(&w, ipc, rows, ts_micros)?;
        w.active
            .write_frame(entry.position, &header, ipc)
            .map_err(|e| w.poison(e))?;
        self.index_frame(&mut w, ipc, logical_len, &header, entry, publish);
        Ok(entry.base_offset)
    }

    /// Seals the active segment and starts a new one at `next_offset`.
    fn roll(&self, w: &mut Writer) -> Result<()> {
        let base = self.index.read().write_offset;
        let file = Arc::new(SegmentFile::create(&self.dir, base)?);
        debug!(path = %file.path().display(), "starting segment");
        let sealed = std::mem::replace(&mut w.active, Arc::clone(&file));
        if std::mem::take(&mut w.active_unsynced) {
            w.sealed_unsynced.push(sealed);
        }
        w.active_len = 0;
        w.dir_unsynced = true;
        let mut index = self.index.write();
        let sealed = std::mem::replace(&mut index.active, Segment::new(file));
        index.sealed.push(sealed);
        Ok(())
    }

    /// Fsyncs every segment file written since the last sync, and the
    /// directory if segments were created or deleted. Returns the durable
    /// position for the caller's checkpoint. The caller must store it before
    /// its next `truncate_prefix`, which may then delete the segments it no
    /// longer needs.
    pub fn sync(&self) -> Result<StreamCheckpoint> {
        let pending = self.begin_sync()?;
        pending.run(self)?;
        let checkpoint = pending.checkpoint.clone();
        self.synced(&checkpoint);
        Ok(checkpoint)
    }

    /// [`StreamLog::sync`] in three steps, so that a checkpoint's fsyncs run on another
    /// thread while appends go on: `begin_sync` (under the writer lock, no I/O but the
    /// staged bytes' write) fixes the position to make durable and takes the files
    /// written since the last sync; [`PendingSync::run`] fsyncs them (no lock held);
    /// [`StreamLog::synced`], once the caller's checkpoint naming the position is durable,
    /// lets `truncate_prefix` delete what that checkpoint no longer needs. One pending
    /// sync at a time per log: the next `begin_sync` comes after this one ran.
    pub fn begin_sync(&self) -> Result<PendingSync> {
        let mut w = self.writer.lock();
        w.check()?;
        self.write_staged(&mut w)?;
        let mut files = std::mem::take(&mut w.sealed_unsynced);
        if std::mem::take(&mut w.active_unsynced) {
            files.push(Arc::clone(&w.active));
        }
        let mut dirs = Vec::new();
        if std::mem::take(&mut w.dir_unsynced) {
            dirs.push(self.dir.clone());
        }
        if std::mem::take(&mut w.parent_unsynced) {
            dirs.push(parent_dir(&self.dir).to_path_buf());
        }
        Ok(PendingSync {
            files,
            dirs,
            checkpoint: StreamCheckpoint {
                first_offset: self.index.read().first_offset,
                segment_base: w.active.base(),
                segment_len: w.active_len,
            },
        })
    }

    /// A checkpoint naming `checkpoint` (from this log's [`StreamLog::begin_sync`]) is
    /// durable: segments below it may go.
    pub fn synced(&self, checkpoint: &StreamCheckpoint) {
        let mut w = self.writer.lock();
        w.durable_base = w.durable_base.max(checkpoint.segment_base);
    }

    /// Writes back (fdatasync) what was appended so far without holding
    /// the writer lock, so appends continue and the next [`StreamLog::sync`]
    /// has little left to flush. Durability bookkeeping is unchanged: only
    /// `sync` hands out a durable position. A failure poisons the log, as a
    /// failed `sync` does.
    pub fn write_back(&self) -> Result<()> {
        let files: Vec<Arc<SegmentFile>> = {
            let w = self.writer.lock();
            w.check()?;
            if !w.active_unsynced && w.sealed_unsynced.is_empty() {
                return Ok(());
            }
            w.sealed_unsynced
                .iter()
                .cloned()
                .chain(std::iter::once(Arc::clone(&w.active)))
                .collect()
        };
        for file in files {
            if let Err(e) = file.sync() {
                return Err(self.writer.lock().poison(e));
            }
        }
        Ok(())
    }

    /// The end of what readers see: the offset the next appended row gets, unless
    /// unpublished frames wait (see [`StreamLog::append_unpublished`]).
    pub fn next_offset(&self) -> u64 {
        self.index.read().next_offset
    }

    /// The offset the next appended row gets, published or not: what the writer (the
    /// state machine) predicts offsets from.
    pub fn write_offset(&self) -> u64 {
        self.index.read().write_offset
    }

    /// The first offset still retained.
    pub fn first_offset(&self) -> u64 {
        self.index.read().first_offset
    }

    /// Commit timestamp of the last appended batch.
    pub fn last_ts_micros(&self) -> Option<i64> {
        self.index.read().last_ts_micros
    }

    /// Index entries of the frames holding offsets in `[from, to)` at or
    /// after `first_offset`, in offset order. Frames with no rows are never
    /// returned.
    pub fn batches(&self, from: u64, to: u64) -> Vec<BatchMeta> {
        let index = self.index.read();
        let from = from.max(index.first_offset);
        let to = to.min(index.next_offset);
        if from >= to {
            return Vec::new();
        }
        let skip = index.sealed.partition_point(|s| s.end_offset() <= from);
        let mut out = Vec::new();
        for segment in index.segments().skip(skip) {
            if segment.base() >= to {
                break;
            }
            let batches = segment
                .overlapping(from, to)
                .iter()
                .filter(|f| f.rows > 0)
                .map(|f| BatchMeta {
                    base_offset: f.base_offset,
                    rows: f.rows,
                    ts_micros: f.ts_micros,
                    segment_base: segment.base(),
                    position: f.position,
                    len: f.len,
                });
            out.extend(batches);
        }
        out
    }

    /// Where a reader of the rows stamped at or after `ts_micros` starts: the first offset
    /// of the first frame (in offset order) with such a `ts`, or the next offset when there
    /// is none yet. Every frame before it is older. Whole segments are skipped by their
    /// newest `ts`; no file is read.
    pub fn offset_at_ts(&self, ts_micros: i64) -> u64 {
        let index = self.index.read();
        for segment in index.segments() {
            if segment.max_ts_micros().is_none_or(|m| m < ts_micros) {
                continue;
            }
            let first = segment
                .frames()
                .iter()
                .find(|f| f.rows > 0 && f.ts_micros >= ts_micros);
            if let Some(f) = first {
                return f.base_offset.max(index.first_offset);
            }
        }
        index.next_offset
    }

    /// Reads, verifies and decodes the batch `meta` describes. Returns
    /// [`Error::OffsetTruncated`] if its segment has been deleted.
    pub fn read(&self, meta: &BatchMeta) -> Result<RecordBatch> {
        self.read_columns(meta, None)
    }

    /// The Arrow IPC bytes of the frame `meta` describes, verified against its checksum,
    /// exactly as they were appended (a staged COPY's frames move into a stream this way,
    /// without decoding).
    pub fn read_payload(&self, meta: &BatchMeta) -> Result<Vec<u8>> {
        let (file, _) = self.frame_file(meta, false)?;
        file.read_payload(meta.position, meta.len, meta.base_offset)
    }

    /// The file holding the frame `meta` describes, and its parts when `with_parts`;
    /// [`Error::OffsetTruncated`] if its segment has been deleted.
    fn frame_file(
        &self,
        meta: &BatchMeta,
        with_parts: bool,
    ) -> Result<(Arc<SegmentFile>, Option<Arc<frame::Parts>>)> {
        let index = self.index.read();
        match index.segment(meta.segment_base) {
            Some(segment) => Ok((
                Arc::clone(segment.file()),
                with_parts.then(|| segment.parts(meta.position)).flatten(),
            )),
            None => Err(Error::OffsetTruncated {
                requested: meta.base_offset,
                first: index.first_offset,
            }),
        }
    }

    /// [`StreamLog::read`] decoding only `columns` (ascending indices of the batch's
    /// columns) when given: the others are neither decompressed nor validated, and a column
    /// the batch predates is left out (the result holds the given columns the batch has, in
    /// order). Of a large frame, only the bytes of those columns are read (each range
    /// verified by its own checksum), when they are at most half of it.
    pub fn read_columns(&self, meta: &BatchMeta, columns: Option<&[usize]>) -> Result<RecordBatch> {
        let (file, parts) = self.frame_file(meta, columns.is_some())?;
        file.read_batch(
            meta.position,
            meta.len,
            meta.base_offset,
            columns,
            parts.as_deref(),
        )
    }

    /// Logical prefix truncation: `first_offset = max(first_offset, before)`,
    /// capped at `next_offset` (after writing and publishing staged frames). Deletes the
    /// sealed segment files whose every offset is below the new `first_offset`, except the segment of the last
    /// checkpoint (and anything after it), which a restart from that
    /// checkpoint still needs. Never deletes the active segment. Returns the
    /// new `first_offset`.
    pub fn truncate_prefix(&self, before: u64) -> Result<u64> {
        let mut w = self.writer.lock();
        w.check()?;
        // staged frames count: where a truncation stops cannot depend on when frames are
        // written (every replica must truncate alike)
        self.write_staged(&mut w)?;
        let (first_offset, doomed) = {
            let mut index = self.index.write();
            index.next_offset = index.write_offset;
            let first_offset = index.first_offset.max(before).min(index.next_offset);
            index.first_offset = first_offset;
            let n = index
                .sealed
                .iter()
                .take_while(|s| s.end_offset() <= first_offset && s.base() < w.durable_base)
                .count();
            let doomed: Vec<_> = index
                .sealed
                .drain(..n)
                .map(|s| Arc::clone(s.file()))
                .collect();
            (first_offset, doomed)
        };
        if !doomed.is_empty() {
            write_first_offset(&self.dir, first_offset).map_err(|e| w.poison(e))?;
            w.sealed_unsynced
                .retain(|f| doomed.iter().all(|d| d.base() != f.base()));
            w.dir_unsynced = true;
        }
        for file in doomed {
            self.deleted_bytes_read
                .fetch_add(file.bytes_read(), Ordering::Relaxed);
            debug!(path = %file.path().display(), "deleting truncated segment");
            fs::remove_file(file.path()).map_err(|e| w.poison(Error::io(file.path())(e)))?;
        }
        Ok(first_offset)
    }

    /// Summaries of the segment files, in offset order.
    pub fn segments(&self) -> Vec<SegmentInfo> {
        self.index
            .read()
            .segments()
            .map(|s| SegmentInfo {
                base_offset: s.base(),
                next_offset: s.end_offset(),
                bytes: s.bytes(),
                logical_bytes: s.logical_bytes(),
                min_ts_micros: s.min_ts_micros(),
                max_ts_micros: s.max_ts_micros(),
                path: s.file().path().to_path_buf(),
            })
            .collect()
    }

    /// Bytes that reads of this log's frames have read from its segment files since it was
    /// opened (a large frame read by column counts only the bytes of those columns and its
    /// head; recovery's reads do not count).
    pub fn bytes_read(&self) -> u64 {
        let index = self.index.read();
        self.deleted_bytes_read.load(Ordering::Relaxed)
            + index.segments().map(|s| s.file().bytes_read()).sum::<u64>()
    }

    /// Bytes of all segment files.
    pub fn size_bytes(&self) -> u64 {
        self.index.read().segments().map(Segment::bytes).sum()
    }

    /// What [`StreamLog::size_bytes`] would be without Arrow buffer compression.
    pub fn logical_bytes(&self) -> u64 {
        self.index
            .read()
            .segments()
            .map(Segment::logical_bytes)
            .sum()
    }

    /// The stream's directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Removes the stream's directory (DROP STREAM). The log accepts no
    /// more writes afterwards; readers holding index entries may still read
    /// them from the unlinked files.
    pub fn destroy(&self) -> Result<()> {
        let mut w = self.writer.lock();
        w.poisoned = Some(format!("stream log {} was destroyed", self.dir.display()));
        match fs::remove_dir_all(&self.dir) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(Error::io(&self.dir)(e)),
            _ => {}
        }
        sync_dir(parent_dir(&self.dir))
    }
}

impl fmt::Debug for StreamLog {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let index = self.index.read();
        f.debug_struct("StreamLog")
            .field("dir", &self.dir)
            .field("first_offset", &index.first_offset)
            .field("write_offset", &index.write_offset)
            .field("segments", &(index.sealed.len() + 1))
            .finish()
    }
}

/// The file that records the first offset a prefix truncation kept.
const FIRST_OFFSET_FILE: &str = "first_offset";

/// The first offset the last prefix truncation kept (0 if none deleted files).
fn read_first_offset(dir: &Path) -> Result<u64> {
    let path = dir.join(FIRST_OFFSET_FILE);
    match fs::read_to_string(&path) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(0),
        Err(e) => Err(Error::io(&path)(e)),
        Ok(text) => text
            .trim_end_matches('\n')
            .parse()
            .map_err(|_| Error::corrupt(&path, 0, format!("not an offset: {text:?}"))),
    }
}

/// Records `offset` as the stream's first, durably (written aside, synced,
/// renamed over, directory synced), before segment files are deleted.
fn write_first_offset(dir: &Path, offset: u64) -> Result<()> {
    let path = dir.join(FIRST_OFFSET_FILE);
    let aside = dir.join(format!("{FIRST_OFFSET_FILE}.new"));
    let write = || -> io::Result<()> {
        let mut file = fs::File::create(&aside)?;
        io::Write::write_all(&mut file, format!("{offset}\n").as_bytes())?;
        file.sync_all()?;
        fs::rename(&aside, &path)
    };
    write().map_err(Error::io(&path))?;
    sync_dir(dir)
}

fn parent_dir(dir: &Path) -> &Path {
    match dir.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => parent,
        _ => Path::new("."),
    }
}
