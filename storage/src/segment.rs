//! One segment file: a run of frames holding consecutive offsets, named by
//! the offset of its first row (`{base:020}.seg`), and the compact in-memory
//! index of those frames.
//!
//! Invariants: frames lie back to back from byte 0; each frame's base offset
//! is the previous frame's end offset, and the first frame's is the segment's
//! base. Only the stream's single writer writes, always at the byte after the
//! last indexed frame, and a frame enters the index only once its bytes are
//! written, so a reader that reads indexed ranges never sees a partial frame.
//! All file I/O is positional, so readers and the writer share one `File`
//! without contending on a cursor.

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io::{BufReader, Read};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use arrow::buffer::Buffer;
use arrow::ipc::reader::StreamDecoder;
use arrow::record_batch::RecordBatch;
use tracing::{info, warn};

use crate::error::{Error, Result};
use crate::frame::{self, Parts, HEADER_LEN};

const FILE_SUFFIX: &str = ".seg";
const RECOVERY_READ_BUFFER: usize = 1 << 20;
/// Frames with a payload up to this size are written with one system call.
pub(crate) const SMALL_FRAME: usize = 16 << 10;
/// Frames at least this long keep their [`Parts`] in memory, so a read of some of their
/// columns reads only those; shorter ones are read whole (one system call beats several).
pub const PARTS_MIN_FRAME: usize = 64 << 10;
/// A frame's parts are kept only while they take at most this fraction of the frame's
/// length in memory (a very wide, short frame is read whole instead).
const PARTS_MAX_SHARE: usize = 256;

/// The file name of the segment whose first offset is `base`.
pub fn file_name(base: u64) -> String {
    format!("{base:020}{FILE_SUFFIX}")
}

/// The base offset encoded in a segment file name, or `None` if `name` is not
/// a segment file name.
pub fn parse_file_name(name: &str) -> Option<u64> {
    let digits = name.strip_suffix(FILE_SUFFIX)?;
    if digits.len() != 20 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// An open segment file, shared between the writer and readers.
#[derive(Debug)]
pub struct SegmentFile {
    base: u64,
    path: PathBuf,
    file: File,
    /// Bytes read from the file by [`SegmentFile::read_batch`] (not by recovery).
    bytes_read: AtomicU64,
}

impl SegmentFile {
    /// Creates (or empties) the segment file for `base` in `dir`.
    pub fn create(dir: &Path, base: u64) -> Result<SegmentFile> {
        let path = dir.join(file_name(base));
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)
            .map_err(Error::io(&path))?;
        Ok(SegmentFile::new(base, path, file))
    }

    fn new(base: u64, path: PathBuf, file: File) -> SegmentFile {
        SegmentFile {
            base,
            path,
            file,
            bytes_read: AtomicU64::new(0),
        }
    }

    pub fn base(&self) -> u64 {
        self.base
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Bytes [`SegmentFile::read_batch`] has read from this file.
    pub fn bytes_read(&self) -> u64 {
        self.bytes_read.load(Ordering::Relaxed)
    }

    /// Reads `buf.len()` bytes at `position`, counted in [`SegmentFile::bytes_read`].
    fn read_at(&self, buf: &mut [u8], position: u64) -> Result<()> {
        self.bytes_read
            .fetch_add(buf.len() as u64, Ordering::Relaxed);
        self.file
            .read_exact_at(buf, position)
            .map_err(Error::io(&self.path))
    }

    /// Writes one frame at `position`. No fsync.
    pub fn write_frame(
        &self,
        position: u64,
        header: &[u8; HEADER_LEN],
        payload: &[u8],
    ) -> Result<()> {
        // A small frame (a single-row INSERT) goes out in one write: copying a few KiB costs
        // less than a second system call. A large one is written in place.
        if payload.len() <= SMALL_FRAME {
            let mut frame = Vec::with_capacity(HEADER_LEN + payload.len());
            frame.extend_from_slice(header);
            frame.extend_from_slice(payload);
            self.write_at(position, &frame)
        } else {
            self.write_at(position, header)?;
            self.write_at(position + HEADER_LEN as u64, payload)
        }
    }

    /// Writes `bytes` at `position`. No fsync.
    pub fn write_at(&self, position: u64, bytes: &[u8]) -> Result<()> {
        self.file
            .write_all_at(bytes, position)
            .map_err(Error::io(&self.path))
    }

    /// Makes everything written so far durable.
    pub fn sync(&self) -> Result<()> {
        self.file.sync_data().map_err(Error::io(&self.path))
    }

    /// Reads the frame of `len` bytes at `position`, verifies that it is the
    /// frame holding `base_offset` and that its checksum holds, and decodes its
    /// record batch: every column, or with `columns` only those (see
    /// [`frame::decode_columns`]; a column the frame predates is left out).
    ///
    /// With the frame's `parts` (see [`Parts`]), a read of columns that take at most half
    /// of the frame reads only the frame's head and those columns' ranges, each verified
    /// against its own checksum; the frame checksum is then not read. Without them, or for
    /// more columns, the whole frame is read and verified.
    pub fn read_batch(
        &self,
        position: u64,
        len: u32,
        base_offset: u64,
        columns: Option<&[usize]>,
        parts: Option<&Parts>,
    ) -> Result<RecordBatch> {
        let len = self.check_extent(position, len)?;
        if let (Some(columns), Some(parts)) = (columns, parts) {
            if parts.frame_len() as usize == len {
                if let Some(batch) = self.read_parts(position, base_offset, columns, parts)? {
                    return Ok(batch);
                }
            }
        }
        let (header, buf) = self.read_verified(position, len, base_offset)?;
        let ipc = Buffer::from_vec(buf).slice(HEADER_LEN);
        let batch = match columns.map(|c| frame::decode_columns(&ipc, c)) {
            Some(Some(decoded)) => decoded?,
            Some(None) => {
                let whole = decode_whole(ipc, &self.path, position)?;
                let present =
                    frame::present_columns(columns.unwrap_or_default(), whole.num_columns());
                whole.project(&present)?
            }
            None => decode_whole(ipc, &self.path, position)?,
        };
        self.check_rows(&batch, &header, position)?;
        Ok(batch)
    }

    /// The payload (Arrow IPC bytes) of the frame of `len` bytes at `position`, verified as
    /// [`SegmentFile::read_batch`] verifies a whole frame, not decoded.
    pub fn read_payload(&self, position: u64, len: u32, base_offset: u64) -> Result<Vec<u8>> {
        let len = self.check_extent(position, len)?;
        let (_, mut buf) = self.read_verified(position, len, base_offset)?;
        buf.drain(..HEADER_LEN);
        Ok(buf)
    }

    /// `len` as a size, once it holds a header and lies within the file: the index is
    /// verified against the file at recovery, but the file may have shrunk since (or the
    /// caller's entry is wrong), and nothing is allocated for bytes that are not there.
    fn check_extent(&self, position: u64, len: u32) -> Result<usize> {
        let corrupt = |detail: String| Error::corrupt(&self.path, position, detail);
        let len = len as usize;
        if len < HEADER_LEN {
            return Err(corrupt(format!(
                "frame length {len} is shorter than a header"
            )));
        }
        let file_len = self.file.metadata().map_err(Error::io(&self.path))?.len();
        if position.saturating_add(len as u64) > file_len {
            return Err(corrupt(format!(
                "frame of {len} bytes runs past the end of the {file_len}-byte file"
            )));
        }
        Ok(len)
    }

    /// The whole frame of `len` bytes at `position` (header included), checked against the
    /// index and its checksum.
    fn read_verified(
        &self,
        position: u64,
        len: usize,
        base_offset: u64,
    ) -> Result<(frame::FrameHeader, Vec<u8>)> {
        let mut buf = vec![0u8; len];
        self.read_at(&mut buf, position)?;
        let header = self.check_header(&buf, position, len, base_offset)?;
        if !frame::verify_checksum(&header, &buf[HEADER_LEN..]) {
            return Err(Error::corrupt(
                &self.path,
                position,
                "frame checksum mismatch".to_string(),
            ));
        }
        Ok((header, buf))
    }

    /// The batch of `columns` read from the frame's head and those columns' ranges only,
    /// each piece verified against its checksum in `parts`; the body is zero where other
    /// columns lie and ends with the last column asked for. `None` when a sparse read does
    /// not pay (the columns take more than half the frame) or the head does not decode as
    /// the plain shape `parts` were built from: the caller reads the frame whole.
    fn read_parts(
        &self,
        position: u64,
        base_offset: u64,
        columns: &[usize],
        parts: &Parts,
    ) -> Result<Option<RecordBatch>> {
        let (head_range, head_crc) = parts.head();
        let pieces: Vec<_> = columns.iter().filter_map(|&i| parts.column(i)).collect();
        let wanted = head_range.len() + pieces.iter().map(|(r, _)| r.len()).sum::<usize>();
        if wanted.saturating_mul(2) > parts.frame_len() as usize {
            return Ok(None);
        }
        let read_piece = |buf: &mut [u8], at: usize, crc: u32| -> Result<()> {
            self.read_at(buf, position + at as u64)?;
            if crc32c::crc32c(buf) != crc {
                return Err(Error::corrupt(
                    &self.path,
                    position,
                    format!("checksum mismatch in frame bytes {at}..{}", at + buf.len()),
                ));
            }
            Ok(())
        };
        let mut head = vec![0u8; head_range.len()];
        read_piece(&mut head, 0, head_crc)?;
        let header = self.check_header(&head, position, parts.frame_len() as usize, base_offset)?;
        let body_end = pieces
            .iter()
            .map(|(r, _)| r.end)
            .max()
            .unwrap_or(head_range.end);
        let mut body = vec![0u8; body_end - head_range.end];
        for (range, crc) in &pieces {
            let within = range.start - head_range.end..range.end - head_range.end;
            read_piece(&mut body[within], range.start, *crc)?;
        }
        let body = Buffer::from_vec(body);
        match frame::decode_columns_split(&head, &body, columns) {
            Some(decoded) => {
                let batch = decoded?;
                self.check_rows(&batch, &header, position)?;
                Ok(Some(batch))
            }
            None => Ok(None),
        }
    }

    /// The header at the start of `frame`, checked against the index's `len` and
    /// `base_offset`.
    fn check_header(
        &self,
        frame: &[u8],
        position: u64,
        len: usize,
        base_offset: u64,
    ) -> Result<frame::FrameHeader> {
        let corrupt = |detail: String| Error::corrupt(&self.path, position, detail);
        let mut header_bytes = [0u8; HEADER_LEN];
        header_bytes.copy_from_slice(&frame[..HEADER_LEN]);
        let header = frame::decode_header(&header_bytes)
            .ok_or_else(|| corrupt("no frame magic".to_string()))?;
        if header.frame_len() != len as u64 || header.base_offset != base_offset {
            return Err(corrupt(format!(
                "frame of {} bytes at offset {} does not match the index ({len} bytes at offset {base_offset})",
                header.frame_len(),
                header.base_offset,
            )));
        }
        Ok(header)
    }

    fn check_rows(
        &self,
        batch: &RecordBatch,
        header: &frame::FrameHeader,
        position: u64,
    ) -> Result<()> {
        if batch.num_rows() != header.rows as usize {
            return Err(Error::corrupt(
                &self.path,
                position,
                format!(
                    "frame header says {} rows but its batch has {}",
                    header.rows,
                    batch.num_rows()
                ),
            ));
        }
        Ok(())
    }

    fn truncate(&self, len: u64) -> Result<()> {
        self.file
            .set_len(len)
            .and_then(|()| self.file.sync_data())
            .map_err(Error::io(&self.path))
    }
}

/// The one record batch of the payload of the frame at `position` of `path`, every column.
fn decode_whole(mut ipc: Buffer, path: &Path, position: u64) -> Result<RecordBatch> {
    let corrupt = |detail: &str| Error::corrupt(path, position, detail);
    let mut decoder = StreamDecoder::new();
    let batch = decoder
        .decode(&mut ipc)?
        .ok_or_else(|| corrupt("frame holds no record batch"))?;
    if decoder.decode(&mut ipc)?.is_some() {
        return Err(corrupt("frame holds more than one record batch"));
    }
    Ok(batch)
}

/// The [`Parts`] of the frame `header ‖ payload` (bytes just written or verified) if it is
/// long enough for a partial read to pay and they take little memory beside it. Arrow's
/// schema conversion panics on some malformed schema messages (a checksum-valid frame
/// from a crafted backup or snapshot); such a frame gets no parts — it is read whole, as
/// before parts existed — rather than stopping recovery.
pub fn parts_worth_keeping(header: &[u8; HEADER_LEN], payload: &[u8]) -> Option<Parts> {
    let frame_len = HEADER_LEN + payload.len();
    if frame_len < PARTS_MIN_FRAME {
        return None;
    }
    std::panic::catch_unwind(|| frame::Parts::of(header, payload))
        .ok()
        .flatten()
        .filter(|p| p.heap_bytes() * PARTS_MAX_SHARE <= frame_len)
}

/// Index entry for one frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameEntry {
    pub base_offset: u64,
    pub position: u64,
    pub len: u32,
    pub rows: u32,
    pub ts_micros: i64,
}

impl FrameEntry {
    pub fn end_offset(&self) -> u64 {
        self.base_offset + u64::from(self.rows)
    }
}

/// What recovery does with an incomplete frame at the end of a segment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TornTail {
    /// Cut it off: the write was interrupted (only valid for the last segment).
    Truncate,
    /// Report corruption: the segment was complete before the next began.
    Reject,
}

/// A segment file and the index of its frames.
#[derive(Debug)]
pub struct Segment {
    file: Arc<SegmentFile>,
    frames: Vec<FrameEntry>,
    bytes: u64,
    /// What the frames' payloads would take without buffer compression
    /// ([`frame::logical_len`]), headers included.
    logical_bytes: u64,
    min_ts_micros: Option<i64>,
    max_ts_micros: Option<i64>,
    /// The parts of the frames that keep them (see [`Segment::push`]), by position.
    parts: HashMap<u64, Arc<Parts>>,
}

impl Segment {
    /// An empty segment for a freshly created file.
    pub fn new(file: Arc<SegmentFile>) -> Segment {
        Segment {
            file,
            frames: Vec::new(),
            bytes: 0,
            logical_bytes: 0,
            min_ts_micros: None,
            max_ts_micros: None,
            parts: HashMap::new(),
        }
    }

    /// Opens the segment at `path` and rebuilds its index from the frame
    /// headers, verifying every frame's checksum and offsets. Bytes past
    /// `limit` are removed first. An incomplete final frame is handled as
    /// `torn_tail` says; a complete frame that does not verify is
    /// [`Error::Corrupt`].
    pub fn recover(
        path: PathBuf,
        base: u64,
        limit: Option<u64>,
        torn_tail: TornTail,
    ) -> Result<Segment> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .map_err(Error::io(&path))?;
        let mut len = file.metadata().map_err(Error::io(&path))?.len();
        let file = Arc::new(SegmentFile::new(base, path, file));
        let path = file.path();
        match limit {
            Some(limit) if len > limit => {
                info!(path = %path.display(), checkpointed = limit, found = len,
                    "removing bytes written after the last checkpoint");
                file.truncate(limit)?;
                len = limit;
            }
            Some(limit) if len < limit => {
                warn!(path = %path.display(), checkpointed = limit, found = len,
                    "segment is shorter than its checkpoint says");
            }
            _ => {}
        }

        let mut segment = Segment::new(Arc::clone(&file));
        // Sized to the file, so recovering a small segment allocates no more than it holds.
        let capacity =
            usize::try_from(len).map_or(RECOVERY_READ_BUFFER, |len| len.min(RECOVERY_READ_BUFFER));
        let mut reader = BufReader::with_capacity(capacity, &file.file);
        let mut header_bytes = [0u8; HEADER_LEN];
        let mut payload = Vec::new();
        while segment.bytes < len {
            let position = segment.bytes;
            let remaining = len - position;
            if remaining < HEADER_LEN as u64 {
                segment.cut_torn_tail(len, torn_tail, "frame header")?;
                break;
            }
            reader
                .read_exact(&mut header_bytes)
                .map_err(Error::io(path))?;
            let header = frame::decode_header(&header_bytes)
                .ok_or_else(|| Error::corrupt(path, position, "no frame magic"))?;
            if header.frame_len() > remaining {
                segment.cut_torn_tail(len, torn_tail, "frame payload")?;
                break;
            }
            payload.resize(header.payload_len as usize, 0);
            reader.read_exact(&mut payload).map_err(Error::io(path))?;
            if !frame::verify_checksum(&header, &payload) {
                return Err(Error::corrupt(path, position, "frame checksum mismatch"));
            }
            let expected = segment.end_offset();
            if header.base_offset != expected {
                return Err(Error::corrupt(
                    path,
                    position,
                    format!(
                        "frame starts at offset {} but offset {expected} comes next",
                        header.base_offset
                    ),
                ));
            }
            // frame_len <= u32::MAX: payload_len is at most MAX_PAYLOAD_LEN on write, and a
            // checksum-verified header is one we wrote.
            let len = u32::try_from(header.frame_len())
                .map_err(|_| Error::corrupt(path, position, "frame too long"))?;
            segment.push(
                HEADER_LEN as u64 + frame::logical_len(&payload),
                FrameEntry {
                    base_offset: header.base_offset,
                    position,
                    len,
                    rows: header.rows,
                    ts_micros: header.ts_micros,
                },
                parts_worth_keeping(&header_bytes, &payload),
            );
        }
        Ok(segment)
    }

    fn cut_torn_tail(&self, len: u64, torn_tail: TornTail, what: &str) -> Result<()> {
        let path = self.file.path();
        match torn_tail {
            TornTail::Reject => Err(Error::corrupt(
                path,
                self.bytes,
                format!("incomplete {what} in a sealed segment"),
            )),
            TornTail::Truncate => {
                warn!(path = %path.display(), position = self.bytes, cut = len - self.bytes,
                    "truncating torn final frame (incomplete {what})");
                self.file.truncate(self.bytes)
            }
        }
    }

    /// Adds the frame just written at the end of the segment; uncompressed it would take
    /// `logical` bytes (header included, see [`frame::logical_len`]). `parts` are the
    /// frame's, from [`parts_worth_keeping`] over its verified bytes.
    pub fn push(&mut self, logical: u64, entry: FrameEntry, parts: Option<Parts>) {
        if let Some(parts) = parts {
            self.parts.insert(entry.position, Arc::new(parts));
        }
        self.logical_bytes += logical;
        self.bytes = entry.position + u64::from(entry.len);
        self.min_ts_micros = Some(
            self.min_ts_micros
                .map_or(entry.ts_micros, |t| t.min(entry.ts_micros)),
        );
        self.max_ts_micros = Some(
            self.max_ts_micros
                .map_or(entry.ts_micros, |t| t.max(entry.ts_micros)),
        );
        self.frames.push(entry);
    }

    pub fn base(&self) -> u64 {
        self.file.base
    }

    pub fn file(&self) -> &Arc<SegmentFile> {
        &self.file
    }

    pub fn frames(&self) -> &[FrameEntry] {
        &self.frames
    }

    /// The parts kept for the frame at `position`, if any.
    pub fn parts(&self, position: u64) -> Option<Arc<Parts>> {
        self.parts.get(&position).cloned()
    }

    /// The frames holding any offset in `[from, to)`, in offset order.
    pub fn overlapping(&self, from: u64, to: u64) -> &[FrameEntry] {
        let start = self.frames.partition_point(|f| f.end_offset() <= from);
        let end = self.frames.partition_point(|f| f.base_offset < to);
        &self.frames[start..end.max(start)]
    }

    /// Bytes of complete frames in the file.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// What [`Segment::bytes`] would be without buffer compression.
    pub fn logical_bytes(&self) -> u64 {
        self.logical_bytes
    }

    /// The offset after the last frame (the base if there is none).
    pub fn end_offset(&self) -> u64 {
        self.frames
            .last()
            .map_or(self.base(), FrameEntry::end_offset)
    }

    pub fn min_ts_micros(&self) -> Option<i64> {
        self.min_ts_micros
    }

    pub fn max_ts_micros(&self) -> Option<i64> {
        self.max_ts_micros
    }

    pub fn last_ts_micros(&self) -> Option<i64> {
        self.frames.last().map(|f| f.ts_micros)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write_frames(dir: &Path, base: u64, frames: &[(u32, &[u8])]) -> (PathBuf, u64) {
        let file = SegmentFile::create(dir, base).expect("create");
        let (mut position, mut offset) = (0u64, base);
        for (i, (rows, payload)) in frames.iter().enumerate() {
            let header = frame::encode_header(offset, *rows, i as i64 * 10, payload).expect("fits");
            file.write_frame(position, &header, payload).expect("write");
            position += (HEADER_LEN + payload.len()) as u64;
            offset += u64::from(*rows);
        }
        (file.path().to_path_buf(), position)
    }

    #[test]
    fn file_names_round_trip_and_reject_strangers() {
        assert_eq!(file_name(1234), "00000000000000001234.seg");
        assert_eq!(parse_file_name("00000000000000001234.seg"), Some(1234));
        assert_eq!(parse_file_name(&file_name(u64::MAX)), Some(u64::MAX));
        assert_eq!(parse_file_name("1234.seg"), None);
        assert_eq!(parse_file_name("0000000000000000123x.seg"), None);
        assert_eq!(parse_file_name("00000000000000001234.seg.tmp"), None);
        assert_eq!(parse_file_name("99999999999999999999.seg"), None);
    }

    #[test]
    fn recover_indexes_frames_and_timestamps() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (path, len) = write_frames(dir.path(), 100, &[(3, b"aaa"), (0, b""), (5, b"bbbbb")]);
        let segment = Segment::recover(path, 100, None, TornTail::Reject).expect("recover");
        let bases: Vec<_> = segment
            .frames()
            .iter()
            .map(|f| (f.base_offset, f.rows))
            .collect();
        assert_eq!(bases, vec![(100, 3), (103, 0), (103, 5)]);
        assert_eq!(segment.bytes(), len);
        assert_eq!(segment.end_offset(), 108);
        assert_eq!(
            (segment.min_ts_micros(), segment.max_ts_micros()),
            (Some(0), Some(20))
        );
        assert_eq!(segment.overlapping(104, 105).len(), 1);
        assert_eq!(segment.overlapping(100, 101)[0].base_offset, 100);
        assert!(segment.overlapping(108, 200).is_empty());
    }

    #[test]
    fn recover_rejects_offset_gap() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (path, _) = write_frames(dir.path(), 0, &[(3, b"aaa")]);
        let err = Segment::recover(path, 1, None, TornTail::Reject).expect_err("gap");
        assert!(matches!(err, Error::Corrupt { position: 0, .. }), "{err}");
    }

    #[test]
    fn torn_tail_is_cut_only_when_allowed() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (path, len) = write_frames(dir.path(), 0, &[(1, b"a"), (2, b"bb")]);
        let full = len;
        // Cut the last frame in half.
        let file = OpenOptions::new().write(true).open(&path).expect("open");
        file.set_len(full - 1).expect("set_len");
        let err = Segment::recover(path.clone(), 0, None, TornTail::Reject).expect_err("sealed");
        assert!(
            matches!(err, Error::Corrupt { position, .. } if position == HEADER_LEN as u64 + 1)
        );
        let segment = Segment::recover(path.clone(), 0, None, TornTail::Truncate).expect("torn");
        assert_eq!(segment.frames().len(), 1);
        assert_eq!(
            std::fs::metadata(&path).expect("meta").len(),
            HEADER_LEN as u64 + 1
        );
    }

    #[test]
    fn read_batch_rejects_index_mismatch() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (path, _) = write_frames(dir.path(), 0, &[(1, b"a")]);
        let segment = Segment::recover(path, 0, None, TornTail::Reject).expect("recover");
        let entry = segment.frames()[0];
        let err = segment
            .file()
            .read_batch(entry.position, entry.len, 7, None, None)
            .expect_err("wrong offset");
        assert!(matches!(err, Error::Corrupt { .. }), "{err}");
    }
}
