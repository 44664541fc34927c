//! The on-disk frame: one appended batch, written as a fixed header followed
//! by the payload (the Arrow IPC stream bytes, verbatim).
//!
//! Header layout, little endian, [`HEADER_LEN`] bytes:
//!
//! | field       | type | bytes  |
//! |-------------|------|--------|
//! | magic       | u32  | 0..4   |
//! | payload_len | u32  | 4..8   |
//! | crc32c      | u32  | 8..12  |
//! | base_offset | u64  | 12..20 |
//! | rows        | u32  | 20..24 |
//! | ts_micros   | i64  | 24..32 |
//!
//! The checksum covers header bytes 12..32 and the payload, so a frame whose
//! checksum verifies has the offsets, row count, timestamp and data that were
//! written. `payload_len` is covered indirectly: a wrong length makes the
//! checksum run over the wrong bytes. The magic lets recovery tell a frame
//! boundary from garbage without trusting the length field.

/// Marks the start of every frame ("FCLS" on disk).
pub const MAGIC: u32 = 0x534C_4346;

/// Size of the fixed frame header in bytes.
pub const HEADER_LEN: usize = 32;

/// Largest payload a frame can carry, so that a whole frame's length fits a u32.
pub const MAX_PAYLOAD_LEN: usize = u32::MAX as usize - HEADER_LEN;

const CRC_START: usize = 12;

use arrow::buffer::Buffer;
use arrow::record_batch::RecordBatch;

/// The decoded fields of a frame header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameHeader {
    pub payload_len: u32,
    pub crc: u32,
    pub base_offset: u64,
    pub rows: u32,
    pub ts_micros: i64,
}

impl FrameHeader {
    /// Length of the whole frame: header plus payload.
    pub fn frame_len(&self) -> u64 {
        HEADER_LEN as u64 + u64::from(self.payload_len)
    }
}

/// Encodes the header for a frame carrying `payload`, checksum included.
/// Returns `None` if the payload is longer than [`MAX_PAYLOAD_LEN`].
pub fn encode_header(
    base_offset: u64,
    rows: u32,
    ts_micros: i64,
    payload: &[u8],
) -> Option<[u8; HEADER_LEN]> {
    if payload.len() > MAX_PAYLOAD_LEN {
        return None;
    }
    let payload_len = u32::try_from(payload.len()).ok()?;
    let mut buf = [0u8; HEADER_LEN];
    buf[0..4].copy_from_slice(&MAGIC.to_le_bytes());
    buf[4..8].copy_from_slice(&payload_len.to_le_bytes());
    buf[12..20].copy_from_slice(&base_offset.to_le_bytes());
    buf[20..24].copy_from_slice(&rows.to_le_bytes());
    buf[24..32].copy_from_slice(&ts_micros.to_le_bytes());
    let crc = crc32c::crc32c_append(crc32c::crc32c(&buf[CRC_START..]), payload);
    buf[8..12].copy_from_slice(&crc.to_le_bytes());
    Some(buf)
}

/// Decodes a header. Returns `None` if the magic is wrong, i.e. `buf` is not
/// the start of a frame. The checksum is not verified here; see
/// [`verify_checksum`].
pub fn decode_header(buf: &[u8; HEADER_LEN]) -> Option<FrameHeader> {
    if u32_at(buf, 0) != MAGIC {
        return None;
    }
    Some(FrameHeader {
        payload_len: u32_at(buf, 4),
        crc: u32_at(buf, 8),
        base_offset: u64::from_le_bytes(bytes_at(buf, 12)),
        rows: u32_at(buf, 20),
        ts_micros: i64::from_le_bytes(bytes_at(buf, 24)),
    })
}

fn bytes_at<const N: usize>(buf: &[u8; HEADER_LEN], at: usize) -> [u8; N] {
    let mut out = [0u8; N];
    out.copy_from_slice(&buf[at..at + N]);
    out
}

fn u32_at(buf: &[u8; HEADER_LEN], at: usize) -> u32 {
    u32::from_le_bytes(bytes_at(buf, at))
}

/// Computes the checksum a frame with these fields and payload must carry.
pub fn checksum(base_offset: u64, rows: u32, ts_micros: i64, payload: &[u8]) -> u32 {
    let mut covered = [0u8; HEADER_LEN - CRC_START];
    covered[0..8].copy_from_slice(&base_offset.to_le_bytes());
    covered[8..12].copy_from_slice(&rows.to_le_bytes());
    covered[12..20].copy_from_slice(&ts_micros.to_le_bytes());
    crc32c::crc32c_append(crc32c::crc32c(&covered), payload)
}

/// True if `payload` has the length and checksum recorded in `header`.
pub fn verify_checksum(header: &FrameHeader, payload: &[u8]) -> bool {
    payload.len() == header.payload_len as usize
        && checksum(header.base_offset, header.rows, header.ts_micros, payload) == header.crc
}

/// The size `payload` (Arrow IPC stream bytes) would have without buffer compression: its
/// length, with each compressed buffer counted at the length its 8-byte prefix records
/// (Arrow's LZ4/ZSTD buffer compression). A payload that does not parse counts as its
/// length. Reads only message headers and buffer prefixes: nothing is decompressed.
pub fn logical_len(payload: &[u8]) -> u64 {
    let stored = payload.len() as u64;
    compressed_sizes(payload)
        .and_then(|(compressed, uncompressed)| {
            stored.checked_sub(compressed)?.checked_add(uncompressed)
        })
        .unwrap_or(stored)
}

/// (stored, uncompressed) bytes of every compressed buffer in `payload`; `None` if
/// anything does not add up.
fn compressed_sizes(payload: &[u8]) -> Option<(u64, u64)> {
    let mut at = 0usize;
    let (mut compressed, mut uncompressed) = (0u64, 0u64);
    while let Some((message, body)) = next_message(payload, &mut at) {
        let batch = message
            .header_as_record_batch()
            .or_else(|| message.header_as_dictionary_batch().and_then(|d| d.data()));
        let Some(batch) = batch.filter(|b| b.compression().is_some()) else {
            continue;
        };
        for buffer in batch.buffers().into_iter().flatten() {
            let offset = usize::try_from(buffer.offset()).ok()?;
            let len = usize::try_from(buffer.length()).ok()?;
            let bytes = body.get(offset..offset.checked_add(len)?)?;
            let Some(prefix) = bytes.get(..8) else {
                continue; // an empty buffer carries no length
            };
            let mut raw = [0u8; 8];
            raw.copy_from_slice(prefix);
            let recorded = i64::from_le_bytes(raw);
            compressed = compressed.checked_add(len as u64)?;
            uncompressed = uncompressed.checked_add(if recorded < 0 {
                len as u64 - 8
            } else {
                recorded as u64
            })?;
        }
    }
    Some((compressed, uncompressed))
}

/// Decodes only `columns` (indices into the payload's own schema, ascending, no repeats) of a
/// payload holding one schema message and one record batch without dictionaries: the other
/// columns' buffers are skipped — neither decompressed nor validated. Indices past the
/// payload's schema (columns added to the stream after it was written) are left out, so the
/// batch holds the first `k` requested columns, where `k` counts those the payload has.
/// `None` when the payload is not of that plain shape (dictionaries, views, more messages,
/// node or buffer counts other than the schema's, anything that does not parse): the caller
/// decodes it whole instead, which also reports what is wrong with it. Skipping a column
/// trusts the batch to list its buffers, so the counts are checked first.
pub fn decode_columns(
    payload: &Buffer,
    columns: &[usize],
) -> Option<Result<RecordBatch, arrow::error::ArrowError>> {
    let bytes = payload.as_slice();
    let plain = Plain::parse(bytes)?;
    if !plain.ends_with_the_batch(bytes) {
        return None;
    }
    let body = payload.slice_with_length(plain.body_start, plain.body_len);
    Some(plain.decode(&body, columns))
}

/// A payload of the plain shape [`decode_columns`] reads, parsed from its metadata alone
/// (the bytes before the batch body): one schema message, then one record batch message
/// whose node and buffer counts are those its schema's columns take.
struct Plain<'a> {
    schema: arrow::datatypes::Schema,
    batch: arrow::ipc::Message<'a>,
    /// Where the batch body starts in the payload, and its length.
    body_start: usize,
    body_len: usize,
    /// How many IPC buffers each column of the schema takes, in order.
    buffers_per_column: Vec<usize>,
}

impl<'a> Plain<'a> {
    fn parse(bytes: &'a [u8]) -> Option<Plain<'a>> {
        let mut at = 0usize;
        let (schema_message, _) = next_message(bytes, &mut at)?;
        let schema = arrow::ipc::convert::fb_to_schema(schema_message.header_as_schema()?);
        let mut nodes = 0usize;
        let mut buffers_per_column = Vec::with_capacity(schema.fields().len());
        for field in schema.fields() {
            let (n, b) = layout_counts(field.data_type())?;
            nodes += n;
            buffers_per_column.push(b);
        }
        let (batch, body_start) = message_header(bytes, at)?;
        let record_batch = batch.header_as_record_batch()?;
        if record_batch.nodes()?.len() != nodes
            || record_batch.buffers()?.len() != buffers_per_column.iter().sum::<usize>()
        {
            return None;
        }
        Some(Plain {
            schema,
            body_start,
            body_len: usize::try_from(batch.bodyLength()).ok()?,
            batch,
            buffers_per_column,
        })
    }

    /// True if `payload` (the one parsed) holds the whole body and nothing after it but the
    /// end-of-stream marker.
    fn ends_with_the_batch(&self, payload: &[u8]) -> bool {
        let tail = self
            .body_start
            .checked_add(self.body_len)
            .and_then(|end| payload.get(end..));
        matches!(
            tail,
            Some([] | [0, 0, 0, 0] | [255, 255, 255, 255, 0, 0, 0, 0])
        )
    }

    /// Decodes `columns` (see [`decode_columns`]) from `body`, which holds the batch body
    /// at least up to the end of the last of them.
    fn decode(
        self,
        body: &Buffer,
        columns: &[usize],
    ) -> Result<RecordBatch, arrow::error::ArrowError> {
        let present = present_columns(columns, self.schema.fields().len());
        let batch = self
            .batch
            .header_as_record_batch()
            .ok_or_else(|| arrow::error::ArrowError::IpcError("not a record batch".to_string()))?;
        let version = self.batch.version();
        let dictionaries = std::collections::HashMap::new();
        arrow::ipc::reader::RecordBatchDecoder::try_new(
            body,
            batch,
            std::sync::Arc::new(self.schema),
            &dictionaries,
            &version,
        )
        .and_then(|d| d.with_projection(Some(&present)).read_record_batch())
    }
}

/// What keeping one [`Parts`] in an index costs beside the parts themselves: an `Arc`'s
/// two counts, a hash map's key, value and control byte, rounded up.
pub const PARTS_ENTRY_OVERHEAD: usize = 48;

/// The indices among `columns` that a batch of `width` columns has (those past it were
/// added to the stream after the batch was written), in order.
pub fn present_columns(columns: &[usize], width: usize) -> Vec<usize> {
    columns.iter().copied().filter(|&i| i < width).collect()
}

/// Where each piece of a frame of the plain shape (see [`decode_columns`]) lies, with the
/// checksum of each piece, so that a read of some columns reads and verifies only the bytes
/// it uses: the head (frame header, schema message, batch metadata), then each column's
/// range of the batch body, back to back (a column's range holds all its buffers and the
/// padding before the next column's). Built from bytes already verified whole (when the
/// frame is appended or recovered) and kept in memory: nothing on disk depends on it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Parts {
    frame_len: u32,
    head_end: u32,
    head_crc: u32,
    /// (end, crc) of each column's range, frame-relative; column `i` starts where column
    /// `i - 1` ends, column 0 at `head_end`; the last ends with the batch body.
    columns: Box<[(u32, u32)]>,
}

impl Parts {
    /// The parts of the frame `header ‖ payload`; `None` unless the payload has the plain
    /// shape and every buffer of column `i` lies inside column `i`'s range (so reading a
    /// column's range reads all the bytes decoding it touches).
    pub fn of(header: &[u8; HEADER_LEN], payload: &[u8]) -> Option<Parts> {
        let plain = Plain::parse(payload)?;
        if !plain.ends_with_the_batch(payload) {
            return None;
        }
        let body = payload.get(plain.body_start..plain.body_start.checked_add(plain.body_len)?)?;
        let record_batch = plain.batch.header_as_record_batch()?;
        let mut buffers = record_batch.buffers()?.iter();
        let mut bounds = Vec::with_capacity(plain.buffers_per_column.len());
        let mut start = 0usize;
        for &count in &plain.buffers_per_column {
            let mut end = start;
            for buffer in buffers.by_ref().take(count) {
                let offset = usize::try_from(buffer.offset()).ok()?;
                let buffer_end = offset.checked_add(usize::try_from(buffer.length()).ok()?)?;
                if offset < start || buffer_end > body.len() {
                    return None;
                }
                end = end.max(buffer_end);
            }
            bounds.push((start, end));
            start = end;
        }
        if let Some(last) = bounds.last_mut() {
            last.1 = body.len();
        }
        let head_end = HEADER_LEN + plain.body_start;
        let head_crc =
            crc32c::crc32c_append(crc32c::crc32c(header), payload.get(..plain.body_start)?);
        let columns = bounds
            .iter()
            .map(|&(from, to)| {
                let end = u32::try_from(head_end + to).ok()?;
                Some((end, crc32c::crc32c(&body[from..to])))
            })
            .collect::<Option<Box<[_]>>>()?;
        Some(Parts {
            frame_len: u32::try_from(HEADER_LEN + payload.len()).ok()?,
            head_end: u32::try_from(head_end).ok()?,
            head_crc,
            columns,
        })
    }

    /// Length of the frame these are the parts of.
    pub fn frame_len(&self) -> u32 {
        self.frame_len
    }

    /// Bytes these parts take in memory, with what an index entry holding them adds (a
    /// reference count and a hash map slot, [`PARTS_ENTRY_OVERHEAD`]).
    pub fn heap_bytes(&self) -> usize {
        std::mem::size_of::<Parts>() + std::mem::size_of_val(&*self.columns) + PARTS_ENTRY_OVERHEAD
    }

    /// The head's range in the frame and its checksum.
    pub fn head(&self) -> (std::ops::Range<usize>, u32) {
        (0..self.head_end as usize, self.head_crc)
    }

    /// The frame range and checksum of column `i`, if the frame has it.
    pub fn column(&self, i: usize) -> Option<(std::ops::Range<usize>, u32)> {
        let &(end, crc) = self.columns.get(i)?;
        let start = match i {
            0 => self.head_end,
            _ => self.columns[i - 1].0,
        };
        Some((start as usize..end as usize, crc))
    }
}

/// Decodes `columns` of a frame of the plain shape from its head (the frame header, then
/// the payload up to the batch body) and `body`, the batch body up to at least the end of
/// the last of those columns — e.g. read piece by piece from [`Parts`], the bytes of the
/// other columns left zero. `None` when the head is not of the plain shape.
pub fn decode_columns_split(
    head: &[u8],
    body: &Buffer,
    columns: &[usize],
) -> Option<Result<RecordBatch, arrow::error::ArrowError>> {
    let plain = Plain::parse(head.get(HEADER_LEN..)?)?;
    Some(plain.decode(body, columns))
}

/// How many IPC field nodes and buffers a column of type `t` takes (as Arrow's reader
/// consumes them); `None` for the types [`decode_columns`] leaves to the whole decode:
/// dictionaries (which need their dictionary batches), views, unions, run-end encoding.
fn layout_counts(t: &arrow::datatypes::DataType) -> Option<(usize, usize)> {
    use arrow::datatypes::DataType as T;
    let child = |f: &arrow::datatypes::FieldRef, own: usize| {
        layout_counts(f.data_type()).map(|(n, b)| (1 + n, own + b))
    };
    match t {
        T::Null => Some((1, 0)),
        T::Utf8 | T::LargeUtf8 | T::Binary | T::LargeBinary => Some((1, 3)),
        T::List(f) | T::LargeList(f) | T::Map(f, _) => child(f, 2),
        T::FixedSizeList(f, _) => child(f, 1),
        T::Struct(fields) => fields.iter().try_fold((1, 1), |(n, b), f| {
            let (fn_, fb) = layout_counts(f.data_type())?;
            Some((n + fn_, b + fb))
        }),
        T::Dictionary(..)
        | T::Union(..)
        | T::RunEndEncoded(..)
        | T::ListView(_)
        | T::LargeListView(_)
        | T::Utf8View
        | T::BinaryView => None,
        _ => Some((1, 2)),
    }
}

/// The next encapsulated IPC message at `*at` (continuation marker, metadata length,
/// metadata, body): its header and its body. `None` at the end-of-stream marker, the end of
/// the bytes, or anything malformed.
fn next_message<'a>(
    bytes: &'a [u8],
    at: &mut usize,
) -> Option<(arrow::ipc::Message<'a>, &'a [u8])> {
    let (message, body_start) = message_header(bytes, *at)?;
    let body_len = usize::try_from(message.bodyLength()).ok()?;
    let body = bytes.get(body_start..body_start.checked_add(body_len)?)?;
    *at = body_start + body_len;
    Some((message, body))
}

/// The header of the encapsulated IPC message at `at` and where its body starts; the body
/// itself need not be in `bytes`. `None` at the end-of-stream marker, the end of the bytes,
/// or anything malformed.
fn message_header(bytes: &[u8], at: usize) -> Option<(arrow::ipc::Message<'_>, usize)> {
    let word = |i: usize| -> Option<u32> {
        let b = bytes.get(i..i.checked_add(4)?)?;
        Some(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    };
    let mut start = at;
    if word(start)? == u32::MAX {
        start += 4;
    }
    let meta_len = usize::try_from(word(start)?).ok()?;
    if meta_len == 0 {
        return None;
    }
    let meta = bytes.get(start + 4..(start + 4).checked_add(meta_len)?)?;
    let message = arrow::ipc::root_as_message(meta).ok()?;
    Some((message, start + 4 + meta_len))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Damaged or hostile payloads never panic and never count less than nothing.
    #[test]
    fn logical_len_survives_any_bytes() {
        use std::sync::Arc;

        use arrow::array::{RecordBatch, StringArray};
        use arrow::datatypes::{DataType, Field, Schema};
        use arrow::ipc::writer::{IpcWriteOptions, StreamWriter};

        let schema = Arc::new(Schema::new(vec![Field::new("p", DataType::Utf8, false)]));
        let rows: Vec<String> = (0..100)
            .map(|i| format!("row {i} {}", "y".repeat(50)))
            .collect();
        let batch = RecordBatch::try_new(schema.clone(), vec![Arc::new(StringArray::from(rows))])
            .expect("arrow");
        let options = IpcWriteOptions::default()
            .try_with_compression(Some(arrow::ipc::CompressionType::ZSTD))
            .expect("arrow");
        let mut good = Vec::new();
        {
            let mut w =
                StreamWriter::try_new_with_options(&mut good, &schema, options).expect("arrow");
            w.write(&batch).expect("arrow");
            w.finish().expect("arrow");
        }
        let logical = logical_len(&good);
        assert!(
            logical > good.len() as u64 * 3,
            "{logical} vs {}",
            good.len()
        );
        // every truncation, and a byte flipped at every position (a few values each)
        let mut seed = 7u64;
        for cut in 0..good.len() {
            logical_len(&good[..cut]);
        }
        for at in 0..good.len() {
            for _ in 0..3 {
                seed = seed
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                let mut bad = good.clone();
                bad[at] ^= (seed >> 56) as u8 | 1;
                logical_len(&bad);
            }
        }
        assert_eq!(logical_len(b""), 0);
        assert_eq!(logical_len(&[0xff; 12]), 12);
    }

    fn sample() -> ([u8; HEADER_LEN], Vec<u8>) {
        let payload = b"arrow ipc bytes".to_vec();
        let header = encode_header(1234, 7, -42, &payload).expect("small payload");
        (header, payload)
    }

    #[test]
    fn header_round_trips() {
        let (buf, payload) = sample();
        let header = decode_header(&buf).expect("magic");
        assert_eq!(header.payload_len as usize, payload.len());
        assert_eq!(header.base_offset, 1234);
        assert_eq!(header.rows, 7);
        assert_eq!(header.ts_micros, -42);
        assert_eq!(header.frame_len(), (HEADER_LEN + payload.len()) as u64);
        assert!(verify_checksum(&header, &payload));
    }

    #[test]
    fn layout_is_little_endian_at_documented_positions() {
        let (buf, _) = sample();
        assert_eq!(&buf[0..4], &MAGIC.to_le_bytes());
        assert_eq!(&buf[4..8], &15u32.to_le_bytes());
        assert_eq!(&buf[12..20], &1234u64.to_le_bytes());
        assert_eq!(&buf[20..24], &7u32.to_le_bytes());
        assert_eq!(&buf[24..32], &(-42i64).to_le_bytes());
    }

    #[test]
    fn wrong_magic_is_not_a_frame() {
        let (mut buf, _) = sample();
        buf[0] ^= 1;
        assert_eq!(decode_header(&buf), None);
        assert_eq!(decode_header(&[0u8; HEADER_LEN]), None);
    }

    #[test]
    fn any_flipped_bit_in_covered_bytes_fails_the_checksum() {
        let (buf, payload) = sample();
        for i in CRC_START..HEADER_LEN {
            let mut bad = buf;
            bad[i] ^= 0x10;
            let header = decode_header(&bad).expect("magic untouched");
            assert!(!verify_checksum(&header, &payload), "header byte {i}");
        }
        let header = decode_header(&buf).expect("magic");
        for i in 0..payload.len() {
            let mut bad = payload.clone();
            bad[i] ^= 0x01;
            assert!(!verify_checksum(&header, &bad), "payload byte {i}");
        }
    }

    #[test]
    fn wrong_length_or_crc_fails_verification() {
        let (buf, payload) = sample();
        let header = decode_header(&buf).expect("magic");
        assert!(!verify_checksum(&header, &payload[..payload.len() - 1]));
        let bad_crc = FrameHeader {
            crc: header.crc ^ 1,
            ..header
        };
        assert!(!verify_checksum(&bad_crc, &payload));
    }

    /// IPC stream bytes (schema, one batch, end marker) of `batch`.
    fn stream_bytes(schema: &arrow::datatypes::SchemaRef, batch: Option<&RecordBatch>) -> Vec<u8> {
        let mut writer =
            arrow::ipc::writer::StreamWriter::try_new(Vec::new(), schema).expect("writer");
        if let Some(batch) = batch {
            writer.write(batch).expect("write");
        }
        writer.finish().expect("finish");
        writer.into_inner().expect("bytes")
    }

    /// A batch listing fewer buffers than its schema needs (checksum-valid bytes from a
    /// peer's snapshot or a crafted backup) is left to the whole decode, which reports it:
    /// skipping the columns it lacks would otherwise panic inside Arrow's reader.
    #[test]
    fn a_batch_short_of_its_schemas_buffers_is_decoded_whole() {
        use std::sync::Arc;

        use arrow::array::{StringArray, UInt64Array};
        use arrow::datatypes::{DataType, Field, Schema};

        let a = Field::new("a", DataType::UInt64, false);
        let b = Field::new("b", DataType::Utf8, false);
        let two = Arc::new(Schema::new(vec![a.clone(), b.clone()]));
        let three = Arc::new(Schema::new(vec![
            a,
            b,
            Field::new("c", DataType::Utf8, true),
        ]));
        let batch = RecordBatch::try_new(
            two.clone(),
            vec![
                Arc::new(UInt64Array::from(vec![1, 2])),
                Arc::new(StringArray::from(vec!["x", "y"])),
            ],
        )
        .expect("batch");
        let honest = stream_bytes(&two, Some(&batch));
        let decoded = decode_columns(&Buffer::from_vec(honest.clone()), &[0, 1])
            .expect("plain shape")
            .expect("decodes");
        assert_eq!(decoded, batch);
        let only_b = decode_columns(&Buffer::from_vec(honest.clone()), &[1])
            .expect("plain shape")
            .expect("decodes");
        assert_eq!(only_b.column(0), batch.column(1));

        // the three-column schema message, then the two-column batch
        let schema_end = |bytes: &[u8]| {
            let mut at = 0;
            next_message(bytes, &mut at).expect("schema message");
            at
        };
        let three_bytes = stream_bytes(&three, None);
        let mut spliced = three_bytes[..schema_end(&three_bytes)].to_vec();
        spliced.extend_from_slice(&honest[schema_end(&honest)..]);
        for columns in [&[0usize][..], &[], &[1], &[0, 1, 2]] {
            assert!(
                decode_columns(&Buffer::from_vec(spliced.clone()), columns).is_none(),
                "{columns:?}"
            );
        }
        // bytes after the batch that are not the end marker: also whole
        let mut trailing = honest.clone();
        trailing.extend_from_slice(b"junk");
        assert!(decode_columns(&Buffer::from_vec(trailing), &[0]).is_none());
    }

    /// A batch of every column type Sluice stores, `n` rows with nulls, as IPC stream bytes
    /// (optionally with buffer compression).
    fn every_type(
        n: usize,
        compression: Option<arrow::ipc::CompressionType>,
    ) -> (RecordBatch, Vec<u8>) {
        use std::sync::Arc;

        use arrow::array::{
            ArrayRef, BinaryArray, BooleanArray, Date32Array, Decimal128Array,
            FixedSizeBinaryArray, Float64Array, Int16Array, Int32Array, Int64Array,
            IntervalMonthDayNanoArray, ListBuilder, StringArray, StringBuilder,
            Time64MicrosecondArray, TimestampMicrosecondArray,
        };
        use arrow::datatypes::{DataType, IntervalMonthDayNano};
        use arrow::ipc::writer::{IpcWriteOptions, StreamWriter};

        let some = |i: usize| i % 7 != 3;
        let mut tags = ListBuilder::new(StringBuilder::new());
        for i in 0..n {
            if some(i) {
                for j in 0..i % 3 {
                    tags.values().append_value(format!("t{i}.{j}"));
                }
                tags.append(true);
            } else {
                tags.append(false);
            }
        }
        let columns: Vec<ArrayRef> = vec![
            Arc::new(Int64Array::from_iter(
                (0..n).map(|i| some(i).then_some(i as i64)),
            )),
            Arc::new(StringArray::from_iter(
                (0..n).map(|i| some(i).then(|| format!("customer {}", i % 11))),
            )),
            Arc::new(BooleanArray::from_iter(
                (0..n).map(|i| some(i).then_some(i % 2 == 0)),
            )),
            Arc::new(
                Decimal128Array::from_iter((0..n).map(|i| some(i).then_some(i as i128 * 125)))
                    .with_precision_and_scale(12, 2)
                    .expect("decimal"),
            ),
            Arc::new(tags.finish()),
            Arc::new(
                FixedSizeBinaryArray::try_from_sparse_iter_with_size(
                    (0..n).map(|i| some(i).then_some([i as u8; 16])),
                    16,
                )
                .expect("uuid"),
            ),
            Arc::new(
                TimestampMicrosecondArray::from_iter((0..n).map(|i| some(i).then_some(i as i64)))
                    .with_timezone("UTC"),
            ),
            Arc::new(Int16Array::from_iter(
                (0..n).map(|i| some(i).then_some(i as i16)),
            )),
            Arc::new(Int32Array::from_iter(
                (0..n).map(|i| some(i).then_some(i as i32)),
            )),
            Arc::new(Float64Array::from_iter(
                (0..n).map(|i| some(i).then_some(i as f64 / 3.0)),
            )),
            Arc::new(Date32Array::from_iter(
                (0..n).map(|i| some(i).then_some(i as i32)),
            )),
            Arc::new(Time64MicrosecondArray::from_iter(
                (0..n).map(|i| some(i).then_some(i as i64)),
            )),
            Arc::new(IntervalMonthDayNanoArray::from_iter((0..n).map(|i| {
                some(i).then(|| IntervalMonthDayNano::new(1, i as i32, 5))
            }))),
            Arc::new(BinaryArray::from_iter(
                (0..n).map(|i| some(i).then(|| vec![i as u8; i % 5])),
            )),
            Arc::new(StringArray::from_iter_values(
                (0..n).map(|i| "x".repeat(i % 50)),
            )),
            // not stored by Sluice today, but laid out by layout_counts
            Arc::new(arrow::array::NullArray::new(n)),
            Arc::new(arrow::array::StructArray::from(vec![
                (
                    Arc::new(arrow::datatypes::Field::new("k", DataType::Utf8, true)),
                    Arc::new(StringArray::from_iter(
                        (0..n).map(|i| some(i).then(|| format!("k{i}"))),
                    )) as ArrayRef,
                ),
                (
                    Arc::new(arrow::datatypes::Field::new("v", DataType::Int32, true)),
                    Arc::new(Int32Array::from_iter(
                        (0..n).map(|i| some(i).then_some(i as i32)),
                    )) as ArrayRef,
                ),
            ])),
        ];
        let fields: Vec<_> = columns
            .iter()
            .enumerate()
            .map(|(i, c)| {
                arrow::datatypes::Field::new(format!("c{i}"), c.data_type().clone(), true)
            })
            .collect();
        let schema = Arc::new(arrow::datatypes::Schema::new(fields));
        let batch = RecordBatch::try_new(schema.clone(), columns).expect("batch");
        let options = IpcWriteOptions::default()
            .try_with_compression(compression)
            .expect("arrow");
        let mut writer =
            StreamWriter::try_new_with_options(Vec::new(), &schema, options).expect("writer");
        writer.write(&batch).expect("write");
        writer.finish().expect("finish");
        (batch, writer.into_inner().expect("bytes"))
    }

    /// A read of some columns needs only the head and those columns' ranges: decoded from
    /// them with every other byte of the body zeroed (and the body cut after the last
    /// column asked for), each column of every type equals the whole decode's, compressed or
    /// not. If Arrow touched a byte outside the ranges, zeroes would show up as wrong values
    /// or errors.
    #[test]
    fn columns_decode_from_their_own_ranges() {
        use arrow::ipc::CompressionType;

        for compression in [
            None,
            Some(CompressionType::LZ4_FRAME),
            Some(CompressionType::ZSTD),
        ] {
            let (batch, payload) = every_type(300, compression);
            let header = encode_header(9, 300, 1, &payload).expect("fits");
            let parts = Parts::of(&header, &payload).expect("plain shape");
            let mut frame = header.to_vec();
            frame.extend_from_slice(&payload);
            assert_eq!(parts.frame_len() as usize, frame.len());
            let (head, head_crc) = parts.head();
            assert_eq!(crc32c::crc32c(&frame[head.clone()]), head_crc);
            // the ranges partition the body
            let mut at = head.end;
            for i in 0..batch.num_columns() {
                let (range, crc) = parts.column(i).expect("column");
                assert_eq!(range.start, at, "column {i}");
                assert_eq!(crc32c::crc32c(&frame[range.clone()]), crc, "column {i}");
                at = range.end;
            }
            assert!(parts.column(batch.num_columns()).is_none());
            let n = batch.num_columns();
            let mut sets: Vec<Vec<usize>> = (0..n).map(|i| vec![i]).collect();
            sets.extend([vec![], vec![0, n - 1], vec![1, 4, 12], (0..n).collect()]);
            for columns in sets {
                let end = columns
                    .iter()
                    .map(|&i| parts.column(i).expect("column").0.end)
                    .max()
                    .unwrap_or(head.end);
                let mut body = vec![0u8; end - head.end];
                for &i in &columns {
                    let (range, _) = parts.column(i).expect("column");
                    body[range.start - head.end..range.end - head.end]
                        .copy_from_slice(&frame[range]);
                }
                let decoded =
                    decode_columns_split(&frame[head.clone()], &Buffer::from_vec(body), &columns)
                        .expect("plain shape")
                        .expect("decodes");
                assert_eq!(
                    decoded,
                    batch.project(&columns).expect("project"),
                    "{columns:?} {compression:?}"
                );
            }
        }
    }

    /// Parts are refused for payloads of another shape: those are read whole.
    #[test]
    fn parts_only_for_the_plain_shape() {
        let (_, payload) = every_type(10, None);
        let header = encode_header(0, 10, 0, &payload).expect("fits");
        assert!(Parts::of(&header, &payload).is_some());
        assert!(Parts::of(&header, &payload[..payload.len() - 100]).is_none());
        assert!(Parts::of(&header, b"not arrow").is_none());
        let mut trailing = payload.clone();
        trailing.extend_from_slice(b"junk");
        assert!(Parts::of(&header, &trailing).is_none());
        assert!(Parts::of(&header, &[]).is_none());
    }
}
