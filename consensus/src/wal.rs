//! The durable Raft log: entries and HardStates appended to segment files, plus a small
//! metadata file holding the compaction point.
//!
//! Layout of the directory:
//! - `<first index, 20 digits>.wal` segments. A segment is named by the first index it was
//!   opened for; names strictly increase, so name order is write order. Every segment starts
//!   with the HardState current when it was opened, so deleting older segments never loses it.
//!   Records are framed as `[len u32][crc32c u32][kind u8][payload]` (module `record`). A
//!   segment is fsynced before the next one is created, so only the newest segment can end in a
//!   torn record.
//! - `wal.meta`: the compaction point as a `SnapshotMetadata` (index, term, ConfState), replaced
//!   atomically (tmp file, fsync, rename, directory fsync). Entries at or below its index are
//!   covered by the state machine's checkpoint and are never read again. It is rewritten when a
//!   compaction deletes a segment, when the ConfState changes and on a snapshot's reset; a
//!   compaction that deletes nothing moves the point in memory only, so the file's point may
//!   be older than the last compaction's (never newer than the state machine's checkpoint).
//!
//! Preallocation: a small append (a group commit) is written into space that already holds
//! durable zeros, so its `fdatasync` flushes only data blocks — no size change, no journal
//! commit. A helper thread keeps the active segment zero-filled `ZERO_CHUNK` (4 MiB) ahead of the
//! write position (never past the segment size), writing and fsyncing `ZERO_PIECE` (256 KiB) at
//! a time so that a group commit's fsync never queues behind a long one of its own; a writer
//! that would write into the range being zeroed stops the fill after its current piece and
//! extends the file past what was zeroed. Large appends (bulk loads), and the HardState-only
//! records written between them, do not start a fill: a bulk load just extends the file, whose
//! metadata flush is amortized over the batch. On replay, a zero-filled tail is the unused
//! preallocation of the newest segment, not damage; a bad record there that only zeros follow,
//! or whose header is zeros, is the append a crash interrupted (as PostgreSQL reads a bad
//! record at the end of its WAL as the end), while a bad record followed by data is corruption.
//!
//! Invariants: replay is "last write wins" per index — an entry at index `i` discards any
//! entries at `>= i` before it (as Raft's own append does), so the log is always contiguous; the
//! compaction point is durable before any segment it covers is deleted; a segment is deleted only
//! when every entry in it is at or below the compaction point. Nothing here is durable until
//! [`Wal::sync`] returns.

mod record;

use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

use protobuf::Message as _;
use raft::eraftpb::{Entry, HardState, SnapshotMetadata};

use crate::error::{Error, IoContext, Result};
use record::{Decoded, Kind};

const META_FILE: &str = "wal.meta";
const META_TMP: &str = "wal.meta.tmp";
const SEGMENT_EXT: &str = "wal";
/// How far ahead of the write position the active segment is zero-filled.
const ZERO_CHUNK: u64 = 4 << 20;
/// A fill writes and fsyncs this much at a time. A group commit's `fdatasync` on the same file
/// waits for the block-allocation metadata the fill's own fsync has in flight, which the disk
/// writes after the fill's data: with the whole chunk in one fsync that wait was the time to
/// write 4 MiB (2.4–2.75 ms measured here, at 1.3 GB/s); one piece takes a tenth of that.
const ZERO_PIECE: u64 = 256 << 10;
/// How far past the write position a fill starts when nothing is zeroed ahead yet.
const ZERO_GAP: u64 = 256 << 10;
/// Appends at least this large do not start zero-filling: they are bulk writes.
const ZERO_AHEAD_MAX_APPEND: usize = 256 << 10;

/// A helper thread zero-filling `[start, end)` of the active segment, a piece at a time, each
/// fsynced. It returns how far it got: it stops early when asked to (the writer needs the
/// range, the segment rolls, the log is reset).
#[derive(Debug)]
struct Zeroing {
    start: u64,
    stop: Arc<AtomicBool>,
    handle: JoinHandle<std::io::Result<u64>>,
}

/// What [`Wal::open`] found on disk.
#[derive(Debug, Default)]
pub struct Recovered {
    /// The compaction point and ConfState; `None` if the directory has never been initialized.
    pub meta: Option<SnapshotMetadata>,
    /// Contiguous entries after the compaction point, in index order.
    pub entries: Vec<Entry>,
    /// The last HardState written.
    pub hard_state: HardState,
}

#[derive(Debug)]
struct Segment {
    first_index: u64,
    path: PathBuf,
    /// Highest entry index written to this segment (0 if none).
    max_index: u64,
}

/// An open Raft log directory. Appends go to the newest segment.
#[derive(Debug)]
pub struct Wal {
    dir: PathBuf,
    segment_bytes: u64,
    segments: Vec<Segment>,
    active: File,
    active_len: u64,
    /// `[0, zeroed)` of the active segment exists on disk (records, then durable zeros).
    zeroed: u64,
    zeroing: Option<Zeroing>,
    hard_state: HardState,
    last_index: u64,
    meta: SnapshotMetadata,
    buf: Vec<u8>,
    unsynced: bool,
}

impl Wal {
    /// Opens (creating if needed) the log in `dir` and replays it. A torn final record is
    /// truncated with a warning; anything else that does not decode is [`Error::Corrupt`].
    pub fn open(dir: &Path, segment_bytes: u64) -> Result<(Wal, Recovered)> {
        fs::create_dir_all(dir).ctx(|| format!("create WAL directory {}", dir.display()))?;
        let tmp = dir.join(META_TMP);
        if tmp.exists() {
            fs::remove_file(&tmp).ctx(|| format!("remove {}", tmp.display()))?;
        }
        let meta = read_meta(&dir.join(META_FILE))?;
        let compacted = meta.as_ref().map_or(0, |m| m.index);

        let names = list_segments(dir)?;
        let mut replay = Replay {
            compacted,
            ..Replay::default()
        };
        let mut segments = Vec::with_capacity(names.len());
        let mut active_len = 0;
        for (i, (first_index, path)) in names.iter().enumerate() {
            let is_last = i + 1 == names.len();
            let (max_index, valid_len) = replay.segment(path, is_last)?;
            segments.push(Segment {
                first_index: *first_index,
                path: path.clone(),
                max_index,
            });
            active_len = valid_len;
        }
        let Replay {
            mut entries,
            hard_state,
            ..
        } = replay;
        let keep_from = entries.partition_point(|e| e.index <= compacted);
        entries.drain(..keep_from);
        if let Some(first) = entries.first() {
            if first.index != compacted + 1 {
                return Err(Error::Corrupt {
                    file: dir.to_path_buf(),
                    offset: 0,
                    reason: format!(
                        "log resumes at index {} but the compaction point is {compacted}",
                        first.index
                    ),
                });
            }
        }
        if meta.is_none() && !entries.is_empty() {
            return Err(Error::Corrupt {
                file: dir.join(META_FILE),
                offset: 0,
                reason: "log entries exist but the metadata file is missing".into(),
            });
        }
        let last_index = entries.last().map_or(compacted, |e| e.index);

        let (active, active_len, zeroed) = match segments.last() {
            Some(seg) => {
                let file = OpenOptions::new()
                    .write(true)
                    .open(&seg.path)
                    .ctx(|| format!("open {}", seg.path.display()))?;
                let len = file
                    .metadata()
                    .ctx(|| format!("stat {}", seg.path.display()))?
                    .len();
                (file, active_len, len)
            }
            None => {
                let seg = create_segment(dir, last_index + 1)?;
                let file = seg.1;
                segments.push(seg.0);
                (file, 0, 0)
            }
        };
        let mut wal = Wal {
            dir: dir.to_path_buf(),
            segment_bytes,
            segments,
            active,
            active_len,
            zeroed,
            zeroing: None,
            hard_state: hard_state.clone(),
            last_index,
            meta: meta.clone().unwrap_or_default(),
            buf: Vec::new(),
            unsynced: false,
        };
        if wal.active_len == 0 {
            // A brand-new (or crash-emptied) segment: start it with the HardState.
            wal.append(&[], Some(&hard_state))?;
            wal.sync()?;
        }
        let recovered = Recovered {
            meta,
            entries,
            hard_state,
        };
        Ok((wal, recovered))
    }

    /// Appends entries and then the HardState (if any) in one write. Not durable until
    /// [`Wal::sync`]. Returns the number of bytes written.
    pub fn append(&mut self, entries: &[Entry], hs: Option<&HardState>) -> Result<u64> {
        if entries.is_empty() && hs.is_none() {
            return Ok(0);
        }
        self.buf.clear();
        if self.active_len >= self.segment_bytes {
            let first = entries.first().map_or(self.last_index + 1, |e| e.index);
            self.roll(first)?;
        }
        for entry in entries {
            record::encode(&mut self.buf, Kind::Entry, entry)?;
        }
        if let Some(hs) = hs {
            record::encode(&mut self.buf, Kind::HardState, hs)?;
        }
        let written = self.buf.len() as u64;
        if self
            .zeroing
            .as_ref()
            .is_some_and(|z| self.active_len + written > z.start)
        {
            self.stop_zeroing()?;
        }
        let path = &self.segments[self.segments.len() - 1].path;
        self.active
            .write_all_at(&self.buf, self.active_len)
            .ctx(|| format!("write {}", path.display()))?;
        self.unsynced = true;
        self.active_len += written;
        self.zeroed = self.zeroed.max(self.active_len);
        // Small appends of entries are what group commits look like; a HardState alone (the
        // commit index written after every batch) says nothing about the load.
        if !entries.is_empty() && self.buf.len() < ZERO_AHEAD_MAX_APPEND {
            self.zero_ahead()?;
        }
        if let Some(last) = entries.last() {
            self.last_index = last.index;
            if let Some(seg) = self.segments.last_mut() {
                seg.max_index = seg.max_index.max(last.index);
            }
        }
        if let Some(hs) = hs {
            self.hard_state = hs.clone();
        }
        Ok(written)
    }

    /// Makes everything appended so far durable (fdatasync of the newest segment).
    pub fn sync(&mut self) -> Result<()> {
        if self.unsynced {
            let path = &self.segments[self.segments.len() - 1].path;
            self.active
                .sync_data()
                .ctx(|| format!("fsync {}", path.display()))?;
            self.unsynced = false;
        }
        Ok(())
    }

    /// The compaction point and ConfState last saved.
    pub fn meta(&self) -> &SnapshotMetadata {
        &self.meta
    }

    /// Atomically replaces the metadata file (compaction point and ConfState).
    pub fn save_meta(&mut self, meta: SnapshotMetadata) -> Result<()> {
        let mut buf = Vec::new();
        record::encode(&mut buf, Kind::Meta, &meta)?;
        let tmp = self.dir.join(META_TMP);
        let mut file = File::create(&tmp).ctx(|| format!("create {}", tmp.display()))?;
        file.write_all(&buf)
            .ctx(|| format!("write {}", tmp.display()))?;
        file.sync_all().ctx(|| format!("fsync {}", tmp.display()))?;
        let dst = self.dir.join(META_FILE);
        fs::rename(&tmp, &dst).ctx(|| format!("rename {} to {}", tmp.display(), dst.display()))?;
        sync_dir(&self.dir)?;
        self.meta = meta;
        Ok(())
    }

    /// Records `meta` as the compaction point, then deletes the oldest segments whose entries
    /// all lie at or below it (never the newest). Returns how many segments were deleted.
    ///
    /// The metadata file is rewritten only when a segment goes, since only a deletion needs
    /// the point durable first. Otherwise the point is kept in memory and the file keeps an
    /// older one, every entry after which is still in the segments: a restart replays from
    /// there and `LogStore::open` drops what the state machine already holds. This keeps the
    /// file's write, fsync, rename and directory fsync (milliseconds, on the Raft thread) off
    /// most checkpoints: with the default sizes a segment outlives several of them.
    pub fn compact(&mut self, meta: SnapshotMetadata) -> Result<usize> {
        let sealed = &self.segments[..self.segments.len().saturating_sub(1)];
        let covered = sealed
            .iter()
            .take_while(|seg| seg.max_index <= meta.index)
            .count();
        if covered == 0 {
            self.meta = meta;
            return Ok(0);
        }
        self.save_meta(meta)?;
        for _ in 0..covered {
            let seg = self.segments.remove(0);
            fs::remove_file(&seg.path).ctx(|| format!("remove {}", seg.path.display()))?;
        }
        sync_dir(&self.dir)?;
        Ok(covered)
    }

    /// Replaces the whole log with a snapshot's point: deletes every segment, starts an empty
    /// one holding `hs`, then records `meta`. A crash in between leaves a log that ends before
    /// the state machine's snapshot, which `LogStore::open` completes.
    pub fn reset(&mut self, meta: SnapshotMetadata, hs: &HardState) -> Result<()> {
        self.stop_zeroing()?;
        for seg in self.segments.drain(..) {
            fs::remove_file(&seg.path).ctx(|| format!("remove {}", seg.path.display()))?;
        }
        let (seg, file) = create_segment(&self.dir, meta.index + 1)?;
        self.segments.push(seg);
        self.active = file;
        self.active_len = 0;
        self.zeroed = 0;
        self.last_index = meta.index;
        self.unsynced = false;
        self.append(&[], Some(hs))?;
        self.sync()?;
        self.save_meta(meta)
    }

    /// Number of segment files, for tests and diagnostics.
    pub fn segment_count(&self) -> usize {
        self.segments.len()
    }

    /// Seals the current segment (fsync) and starts a new one, whose first record — placed in
    /// `self.buf` ahead of the batch being written — is the current HardState.
    fn roll(&mut self, first: u64) -> Result<()> {
        self.stop_zeroing()?;
        if self.zeroed > self.active_len {
            // Preallocated zeros past the last record (possible when the segment size setting
            // shrank across a restart): a sealed segment ends exactly at its last record.
            let path = &self.segments[self.segments.len() - 1].path;
            self.active
                .set_len(self.active_len)
                .ctx(|| format!("truncate {}", path.display()))?;
            self.unsynced = true;
        }
        self.sync()?;
        let prev = self.segments.last().map_or(0, |s| s.first_index);
        let (seg, file) = create_segment(&self.dir, first.max(prev + 1))?;
        self.segments.push(seg);
        self.active = file;
        self.active_len = 0;
        self.zeroed = 0;
        record::encode(&mut self.buf, Kind::HardState, &self.hard_state)
    }

    /// Starts zero-filling the next [`ZERO_CHUNK`] of the active segment if the write position
    /// is within half a chunk of the zeroed end and the segment is not yet full size. With
    /// nothing zeroed ahead (a new segment), the fill starts [`ZERO_GAP`] ahead so the next
    /// appends need not wait for it.
    fn zero_ahead(&mut self) -> Result<()> {
        if self.zeroing.is_some() || self.zeroed - self.active_len >= ZERO_CHUNK / 2 {
            return Ok(());
        }
        let start = if self.zeroed == self.active_len {
            self.active_len + ZERO_GAP
        } else {
            self.zeroed
        };
        let end = (start + ZERO_CHUNK).min(self.segment_bytes);
        if end <= start {
            return Ok(());
        }
        let path = &self.segments[self.segments.len() - 1].path;
        let file = self
            .active
            .try_clone()
            .ctx(|| format!("reopen {}", path.display()))?;
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = stop.clone();
        let handle = std::thread::Builder::new()
            .name("sluice-wal-zero".into())
            .spawn(move || {
                let zeros = vec![0u8; (end - start).min(ZERO_PIECE) as usize];
                let mut at = start;
                while at < end && !stopped.load(Ordering::Acquire) {
                    let n = (end - at).min(zeros.len() as u64) as usize;
                    file.write_all_at(&zeros[..n], at)?;
                    // Each piece is made durable before the next is written: a group commit's
                    // fdatasync that meets the fill in flight waits behind one piece.
                    file.sync_data()?;
                    at += n as u64;
                }
                Ok(at)
            })
            .ctx(|| "start the WAL zero-fill thread".to_string())?;
        self.zeroing = Some(Zeroing {
            start,
            stop,
            handle,
        });
        Ok(())
    }

    /// Stops the zero-fill in progress, if any, after the piece it is writing (so a writer
    /// that caught up with it waits for one piece's write and fsync, not the chunk's), and
    /// takes what it made durable as zeroed. The writer then writes past that end as a bulk
    /// write does: extending the file.
    fn stop_zeroing(&mut self) -> Result<()> {
        self.end_zeroing(true)
    }

    /// Waits for the zero-fill in progress, if any, to reach its end.
    #[cfg(test)]
    fn finish_zeroing(&mut self) -> Result<()> {
        self.end_zeroing(false)
    }

    /// Joins the fill in progress, if any (`stop`: after its current piece), and takes what
    /// it made durable as zeroed.
    fn end_zeroing(&mut self, stop: bool) -> Result<()> {
        let Some(z) = self.zeroing.take() else {
            return Ok(());
        };
        if stop {
            z.stop.store(true, Ordering::Release);
        }
        let path = &self.segments[self.segments.len() - 1].path;
        let what = || format!("zero-fill {}", path.display());
        let reached = match z.handle.join() {
            Ok(result) => result.ctx(what)?,
            Err(_) => return Err(Error::io(what(), std::io::Error::other("thread panicked"))),
        };
        self.zeroed = self.zeroed.max(reached);
        Ok(())
    }
}

impl Drop for Wal {
    fn drop(&mut self) {
        // a fill's error no longer matters: nothing will be appended
        let _ = self.stop_zeroing();
    }
}

/// Replay state across segments.
#[derive(Default)]
struct Replay {
    entries: Vec<Entry>,
    hard_state: HardState,
    /// The compaction point: entries at or below it are dropped after replay.
    compacted: u64,
}

impl Replay {
    /// Replays one segment; returns its highest entry index and its valid length.
    fn segment(&mut self, path: &Path, is_last: bool) -> Result<(u64, u64)> {
        let data = fs::read(path).ctx(|| format!("read {}", path.display()))?;
        let corrupt = |offset: usize, reason: String| Error::Corrupt {
            file: path.to_path_buf(),
            offset: offset as u64,
            reason,
        };
        let mut pos = 0;
        let mut max_index = 0;
        loop {
            match record::decode(&data[pos..]) {
                Decoded::End => break,
                Decoded::Record {
                    kind,
                    payload,
                    size,
                } => {
                    match kind {
                        Kind::Entry => {
                            let entry: Entry = record::parse(payload, path, pos as u64)?;
                            max_index = max_index.max(entry.index);
                            self.push(entry).map_err(|r| corrupt(pos, r))?;
                        }
                        Kind::HardState => {
                            self.hard_state = record::parse(payload, path, pos as u64)?;
                        }
                        Kind::Meta => {
                            return Err(corrupt(pos, "metadata record in a segment".into()))
                        }
                    }
                    pos += size;
                }
                // The newest segment's unused preallocation.
                _ if is_last && zeros(&data[pos..]) => break,
                ref d if is_last && interrupted_append(d, &data[pos..]) => {
                    truncate_torn(path, pos, data.len())?;
                    break;
                }
                Decoded::Torn => {
                    return Err(corrupt(pos, "incomplete record in a sealed segment".into()))
                }
                Decoded::Corrupt { reason, .. } => return Err(corrupt(pos, reason)),
            }
        }
        Ok((max_index, pos as u64))
    }

    /// Appends with Raft's overwrite rule: an entry at `i` replaces everything at `>= i`. A
    /// gap at or below the compaction point is no gap: what precedes `compacted + 1` is dropped
    /// anyway (a log cut short below the compaction point, then appended to, looks like this).
    fn push(&mut self, entry: Entry) -> std::result::Result<(), String> {
        if let Some(first) = self.entries.first().map(|e| e.index) {
            let keep = entry.index.saturating_sub(first) as usize;
            self.entries.truncate(keep);
            if let Some(last) = self.entries.last() {
                if entry.index <= self.compacted.saturating_add(1) {
                    self.entries.clear();
                } else if entry.index != last.index.saturating_add(1) {
                    return Err(format!(
                        "gap in the log: index {} follows {}",
                        entry.index, last.index
                    ));
                }
            }
        }
        self.entries.push(entry);
        Ok(())
    }
}

fn zeros(bytes: &[u8]) -> bool {
    bytes.iter().all(|b| *b == 0)
}

/// Whether a record at the end of the newest segment that does not decode (`d`, at the start
/// of `rest`) is the append a crash interrupted: the file ends inside it; or it was only partly
/// written into preallocated zeros (nothing but zeros after it); or its header never reached
/// the disk while later pages of the same write did. Every acknowledged record lies before it,
/// so what follows belongs to that write. A bad record followed by data is corruption.
fn interrupted_append(d: &Decoded<'_>, rest: &[u8]) -> bool {
    match d {
        Decoded::Torn => true,
        Decoded::Corrupt { size, .. } => {
            zeros(&rest[..record::HEADER_LEN]) || zeros(&rest[*size..])
        }
        Decoded::Record { .. } | Decoded::End => false,
    }
}

/// Cuts the newest segment at `pos`, where a crash interrupted an append.
fn truncate_torn(path: &Path, pos: usize, len: usize) -> Result<()> {
    tracing::warn!(
        file = %path.display(),
        offset = pos,
        dropped_bytes = len - pos,
        "truncating torn record at the end of the Raft log"
    );
    let file = OpenOptions::new()
        .write(true)
        .open(path)
        .ctx(|| format!("open {}", path.display()))?;
    file.set_len(pos as u64)
        .ctx(|| format!("truncate {}", path.display()))?;
    file.sync_all().ctx(|| format!("fsync {}", path.display()))
}

fn segment_path(dir: &Path, first_index: u64) -> PathBuf {
    dir.join(format!("{first_index:020}.{SEGMENT_EXT}"))
}

fn create_segment(dir: &Path, first_index: u64) -> Result<(Segment, File)> {
    let path = segment_path(dir, first_index);
    let file = OpenOptions::new()
        .create_new(true)
        .write(true)
        .open(&path)
        .ctx(|| format!("create {}", path.display()))?;
    sync_dir(dir)?;
    let seg = Segment {
        first_index,
        path,
        max_index: 0,
    };
    Ok((seg, file))
}

/// Segment files in name (= write) order.
fn list_segments(dir: &Path) -> Result<Vec<(u64, PathBuf)>> {
    let mut out = Vec::new();
    for dirent in fs::read_dir(dir).ctx(|| format!("list {}", dir.display()))? {
        let path = dirent.ctx(|| format!("list {}", dir.display()))?.path();
        if path.extension().and_then(|e| e.to_str()) != Some(SEGMENT_EXT) {
            continue;
        }
        match path
            .file_stem()
            .and_then(|s| s.to_str()?.parse::<u64>().ok())
        {
            Some(first) => out.push((first, path)),
            None => tracing::warn!(file = %path.display(), "ignoring oddly named WAL file"),
        }
    }
    out.sort();
    Ok(out)
}

fn read_meta(path: &Path) -> Result<Option<SnapshotMetadata>> {
    let data = match fs::read(path) {
        Ok(data) => data,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(Error::io(format!("read {}", path.display()), e)),
    };
    let corrupt = |reason: &str| Error::Corrupt {
        file: path.to_path_buf(),
        offset: 0,
        reason: reason.into(),
    };
    match record::decode(&data) {
        Decoded::Record {
            kind: Kind::Meta,
            payload,
            size,
        } if size == data.len() => Ok(Some(
            SnapshotMetadata::parse_from_bytes(payload)
                .map_err(|e| corrupt(&format!("undecodable metadata: {e}")))?,
        )),
        Decoded::Corrupt { reason, .. } => Err(corrupt(&reason)),
        _ => Err(corrupt("metadata file is not exactly one metadata record")),
    }
}

/// fsyncs a directory so that file creations, renames and deletions in it are durable.
fn sync_dir(dir: &Path) -> Result<()> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .ctx(|| format!("fsync directory {}", dir.display()))
}

#[cfg(test)]
mod tests;
