//! Property tests for the decoders that read what a crash or a disk can corrupt: segment files
//! and frames. A valid stream log is written once per template; every case copies it into a
//! fresh directory, damages it (bit flips, truncation, zeroed ranges, garbage or a bogus frame
//! header appended, header fields overwritten, a segment deleted or duplicated under another
//! name, a stale checkpoint) and opens and reads it. Promised: no panic, no case longer than
//! [`CASE_LIMIT`], no allocation beyond a small multiple of the bytes on disk, and either a
//! clean error or rows that were written, with the offsets they were written at, in order.
//!
//! `SLUICE_FUZZ_CASES` sets the cases per property (default [`DEFAULT_CASES`]);
//! `SLUICE_FUZZ_SEED` the seed. See `docs/fuzzing.md`.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use arrow::array::{Array, StringArray, UInt64Array};
use arrow::datatypes::{DataType, Field, Schema};
use arrow::ipc::writer::StreamWriter;
use arrow::record_batch::RecordBatch;
use proptest::prelude::*;
use proptest::test_runner::{TestCaseError, TestRunner};
use sluice_storage::frame::{self, HEADER_LEN, MAGIC};
use sluice_storage::segment::{self, Segment, TornTail};
use sluice_storage::{StreamCheckpoint, StreamLog, StreamLogOptions};

mod harness;
use harness::*;

// ---------------------------------------------------------------------------------------------
// Valid logs to damage.

/// Frames of at least this many rows get a wide third column, so they are long enough to
/// keep their parts (`segment::PARTS_MIN_FRAME`) and be read column by column.
const WIDE_ROWS: u32 = 1_000;

/// IPC bytes of one batch whose `offset` column holds `base..base + rows`, then `msg`, then
/// (in frames of [`WIDE_ROWS`] or more) 60 bytes of `pad` per row.
fn ipc(base: u64, rows: u32) -> Vec<u8> {
    let schema = Arc::new(Schema::new(vec![
        Field::new("offset", DataType::UInt64, false),
        Field::new("msg", DataType::Utf8, false),
        Field::new("pad", DataType::Utf8, false),
    ]));
    let offsets: Vec<u64> = (base..base + u64::from(rows)).collect();
    let msgs: Vec<String> = offsets.iter().map(|o| format!("row {o}")).collect();
    let pad = if rows >= WIDE_ROWS {
        "p".repeat(60)
    } else {
        String::new()
    };
    let batch = RecordBatch::try_new(
        schema.clone(),
        vec![
            Arc::new(UInt64Array::from(offsets)),
            Arc::new(StringArray::from(msgs)),
            Arc::new(StringArray::from(vec![pad; rows as usize])),
        ],
    )
    .expect("batch");
    let mut writer = StreamWriter::try_new(Vec::new(), &schema).expect("writer");
    writer.write(&batch).expect("write");
    writer.finish().expect("finish");
    writer.into_inner().expect("into_inner")
}

/// A stream log as it was on disk at a crash, and what had been written to it.
struct Template {
    /// Segment files by name, in name order.
    files: Vec<(String, Vec<u8>)>,
    checkpoint: StreamCheckpoint,
    /// `(base_offset, rows)` of every frame ever appended.
    written: BTreeSet<(u64, u32)>,
    /// Frame start positions per file, for damage aimed at header fields.
    frames: Vec<Vec<u64>>,
    segment_bytes: u64,
}

impl Template {
    fn total_bytes(&self) -> usize {
        self.files.iter().map(|(_, b)| b.len()).sum()
    }
}

/// Writes `before` batches, syncs (the checkpoint), optionally truncates the prefix, then
/// writes `after` batches that the crash leaves unsynced.
fn template(segment_bytes: u64, before: &[u32], truncate: Option<u64>, after: &[u32]) -> Template {
    let dir = tempfile::tempdir().expect("tempdir");
    let opts = StreamLogOptions { segment_bytes };
    let log = StreamLog::create(dir.path(), opts).expect("create");
    let mut written = BTreeSet::new();
    let mut append = |rows: &[u32]| {
        for &n in rows {
            let base = log.next_offset();
            log.append(&ipc(base, n), n, base as i64 * 1000)
                .expect("append");
            written.insert((base, n));
        }
    };
    append(before);
    let mut checkpoint = log.sync().expect("sync");
    if let Some(before) = truncate {
        log.truncate_prefix(before).expect("truncate_prefix");
        checkpoint = log.sync().expect("sync");
    }
    append(after);
    let mut files = Vec::new();
    let mut frames = Vec::new();
    for info in log.segments() {
        let name = segment::file_name(info.base_offset);
        let bytes = std::fs::read(dir.path().join(&name)).expect("read segment");
        let positions = log
            .batches(info.base_offset, info.next_offset)
            .iter()
            .filter(|b| b.segment_base == info.base_offset)
            .map(|b| b.position)
            .collect();
        files.push((name, bytes));
        frames.push(positions);
    }
    Template {
        files,
        checkpoint,
        written,
        frames,
        segment_bytes,
    }
}

fn templates() -> &'static [Template] {
    static TEMPLATES: OnceLock<Vec<Template>> = OnceLock::new();
    TEMPLATES.get_or_init(|| {
        vec![
            // One segment, one unsynced append after the checkpoint.
            template(1 << 20, &[3, 1, 0, 5], None, &[2]),
            // Several small segments; the unsynced appends roll into new ones.
            template(700, &[2, 4, 1, 3, 2, 6], None, &[1, 2, 3]),
            // Prefix truncation deleted the first segments.
            template(500, &[1, 2, 3, 4, 5, 6, 7], Some(9), &[]),
            // Large frames, read column by column; one unsynced.
            template(1 << 20, &[1_000, 3, 1_200], None, &[1_500]),
        ]
    })
}

// ---------------------------------------------------------------------------------------------
// Damage.

#[derive(Debug, Clone)]
enum Damage {
    FlipBit {
        file: usize,
        at: usize,
        bit: u8,
    },
    Truncate {
        file: usize,
        at: usize,
    },
    Zero {
        file: usize,
        at: usize,
        len: usize,
    },
    Garbage {
        file: usize,
        bytes: Vec<u8>,
    },
    /// A frame header's magic, then a length and random bytes: garbage that looks like a frame.
    BogusFrame {
        file: usize,
        len: u32,
        rest: Vec<u8>,
    },
    /// Overwrites a u32 of a frame header (`word` 0..8) with `value`.
    HeaderWord {
        file: usize,
        frame: usize,
        word: usize,
        value: u32,
    },
    Delete {
        file: usize,
    },
    /// Copies a segment file under the name of another base offset.
    Duplicate {
        file: usize,
        base: u64,
    },
}

fn interesting_u32() -> impl Strategy<Value = u32> {
    prop_oneof![
        any::<u32>(),
        0..256u32,
        Just(u32::MAX),
        (u32::MAX - 64)..=u32::MAX,
        Just(1 << 30),
    ]
}

fn damage() -> impl Strategy<Value = Damage> {
    let file = 0..16usize;
    let at = 0..8192usize;
    prop_oneof![
        4 => (file.clone(), at.clone(), 0..8u8).prop_map(|(file, at, bit)| Damage::FlipBit { file, at, bit }),
        2 => (file.clone(), at.clone()).prop_map(|(file, at)| Damage::Truncate { file, at }),
        2 => (file.clone(), at.clone(), 1..256usize).prop_map(|(file, at, len)| Damage::Zero { file, at, len }),
        1 => (file.clone(), proptest::collection::vec(any::<u8>(), 1..128)).prop_map(|(file, bytes)| Damage::Garbage { file, bytes }),
        1 => (file.clone(), interesting_u32(), proptest::collection::vec(any::<u8>(), 0..64)).prop_map(|(file, len, rest)| Damage::BogusFrame { file, len, rest }),
        3 => (file.clone(), 0..16usize, 0..8usize, interesting_u32()).prop_map(|(file, frame, word, value)| Damage::HeaderWord { file, frame, word, value }),
        1 => file.clone().prop_map(|file| Damage::Delete { file }),
        1 => (file, prop_oneof![0..64u64, any::<u64>()]).prop_map(|(file, base)| Damage::Duplicate { file, base }),
    ]
}

/// A checkpoint other than the one the files were synced with: a stale or wrong one.
fn checkpoint_override() -> impl Strategy<Value = Option<StreamCheckpoint>> {
    let small = prop_oneof![0..64u64, 0..8192u64, any::<u64>()];
    prop_oneof![
        6 => Just(None),
        1 => (small.clone(), small.clone(), small).prop_map(|(first_offset, segment_base, segment_len)| {
            Some(StreamCheckpoint { first_offset, segment_base, segment_len })
        }),
    ]
}

/// The files of template `t`, with `damage` applied in order, as `(name, bytes)`.
fn damaged(t: &Template, damage: &[Damage]) -> Vec<(String, Vec<u8>)> {
    let mut files = t.files.clone();
    for d in damage {
        if files.is_empty() {
            break;
        }
        let n = files.len();
        match d {
            Damage::FlipBit { file, at, bit } => {
                let bytes = &mut files[file % n].1;
                if !bytes.is_empty() {
                    let at = at % bytes.len();
                    bytes[at] ^= 1 << bit;
                }
            }
            Damage::Truncate { file, at } => {
                let bytes = &mut files[file % n].1;
                let at = at % (bytes.len() + 1);
                bytes.truncate(at);
            }
            Damage::Zero { file, at, len } => {
                let bytes = &mut files[file % n].1;
                let start = at % (bytes.len() + 1);
                let end = (start + len).min(bytes.len());
                bytes[start..end].fill(0);
            }
            Damage::Garbage { file, bytes } => files[file % n].1.extend_from_slice(bytes),
            Damage::BogusFrame { file, len, rest } => {
                let bytes = &mut files[file % n].1;
                bytes.extend_from_slice(&MAGIC.to_le_bytes());
                bytes.extend_from_slice(&len.to_le_bytes());
                bytes.extend_from_slice(rest);
            }
            Damage::HeaderWord {
                file,
                frame,
                word,
                value,
            } => {
                let i = file % n;
                // Frame positions are those of the undamaged file; earlier damage may have
                // moved or cut it, which is fine: the write lands wherever it lands.
                let Some(positions) = t.frames.get(i).filter(|p| !p.is_empty()) else {
                    continue;
                };
                let at = positions[frame % positions.len()] as usize + 4 * word;
                let bytes = &mut files[i].1;
                if at + 4 <= bytes.len() {
                    bytes[at..at + 4].copy_from_slice(&value.to_le_bytes());
                }
            }
            Damage::Delete { file } => {
                files.remove(file % n);
            }
            Damage::Duplicate { file, base } => {
                let copy = files[file % n].1.clone();
                let name = segment::file_name(*base);
                files.retain(|(n, _)| *n != name);
                files.push((name, copy));
                files.sort();
            }
        }
    }
    files
}

fn write_files(dir: &Path, files: &[(String, Vec<u8>)]) {
    for (name, bytes) in files {
        std::fs::write(dir.join(name), bytes).expect("write segment");
    }
}

// ---------------------------------------------------------------------------------------------
// What a recovered log must look like.

/// Checks that `batch` holds exactly the rows `ipc(base, rows)` wrote.
fn check_rows(batch: &RecordBatch, base: u64, rows: u32) -> Result<(), TestCaseError> {
    check_columns(batch, &[0, 1, 2], base, rows)
}

/// Checks that `batch` holds exactly the `columns` of the rows `ipc(base, rows)` wrote.
fn check_columns(
    batch: &RecordBatch,
    columns: &[usize],
    base: u64,
    rows: u32,
) -> Result<(), TestCaseError> {
    prop_assert_eq!(batch.num_rows(), rows as usize);
    prop_assert_eq!(batch.num_columns(), columns.len());
    for (at, &column) in columns.iter().enumerate() {
        let array = batch.column(at).as_any();
        for i in 0..batch.num_rows() {
            let expected = base + i as u64;
            match (
                column,
                array.downcast_ref::<UInt64Array>(),
                array.downcast_ref::<StringArray>(),
            ) {
                (0, Some(offsets), _) => prop_assert_eq!(offsets.value(i), expected),
                (1, _, Some(msgs)) => prop_assert_eq!(msgs.value(i), format!("row {expected}")),
                (2, _, Some(pad)) => prop_assert_eq!(
                    pad.value(i),
                    if rows >= WIDE_ROWS {
                        "p".repeat(60)
                    } else {
                        String::new()
                    }
                ),
                _ => return Err(TestCaseError::fail("batch has the wrong column types")),
            }
        }
    }
    Ok(())
}

/// The column sets reads ask for: none (count), each alone, the small ones, all.
const COLUMN_SETS: [&[usize]; 6] = [&[], &[0], &[1], &[2], &[0, 1], &[0, 1, 2]];

/// Reads everything `log` indexes and checks it is rows that were written, gapless and in
/// order, each frame one that was appended.
fn check_log(log: &StreamLog, t: &Template) -> Result<(), TestCaseError> {
    let (first, next) = (log.first_offset(), log.next_offset());
    prop_assert!(first <= next);
    let batches = log.batches(0, u64::MAX);
    let mut expected = batches.first().map(|b| b.base_offset);
    for meta in &batches {
        prop_assert!(
            t.written.contains(&(meta.base_offset, meta.rows)),
            "frame at offset {} with {} rows was never written",
            meta.base_offset,
            meta.rows
        );
        prop_assert_eq!(Some(meta.base_offset), expected, "offsets have a gap");
        expected = Some(meta.end_offset());
        let batch = log
            .read(meta)
            .map_err(|e| TestCaseError::fail(format!("recovered frame unreadable: {e}")))?;
        check_rows(&batch, meta.base_offset, meta.rows)?;
    }
    if let Some(end) = expected {
        prop_assert_eq!(end, next);
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Properties.

/// Opens damaged logs: a clean error, or a valid log that stays writable.
#[test]
fn fuzz_stream_log_open() {
    let _serial = serial();
    let strategy = (
        0..templates().len(),
        proptest::collection::vec(damage(), 0..4),
        checkpoint_override(),
    );
    TestRunner::new(config(cases()))
        .run(&strategy, |(which, damage, checkpoint)| {
            timed(|| {
                let t = &templates()[which];
                let files = damaged(t, &damage);
                let dir = scratch_dir();
                write_files(dir.path(), &files);
                let on_disk: usize = files.iter().map(|(_, b)| b.len()).sum();
                let checkpoint = checkpoint.unwrap_or_else(|| t.checkpoint.clone());
                let opts = StreamLogOptions {
                    segment_bytes: t.segment_bytes,
                };
                let opened = within_budget(2 * on_disk.max(t.total_bytes()) + ALLOC_SLACK, || {
                    match StreamLog::open(dir.path(), opts.clone(), &checkpoint) {
                        Ok(log) => check_log(&log, t).map(|()| true),
                        Err(_) => Ok(false),
                    }
                })?;
                if !opened {
                    return Ok(());
                }
                // Whatever was recovered takes appends, and a reopen from the new checkpoint
                // finds them.
                let log = StreamLog::open(dir.path(), opts.clone(), &checkpoint).map_err(|e| {
                    TestCaseError::fail(format!("a log that opened once fails to reopen: {e}"))
                })?;
                let base = log.next_offset();
                if base > u64::MAX / 2 {
                    return Ok(()); // a wild checkpoint's segment base: no room for offsets
                }
                log.append(&ipc(base, 2), 2, 0)
                    .map_err(|e| TestCaseError::fail(format!("append after recovery: {e}")))?;
                let synced = log
                    .sync()
                    .map_err(|e| TestCaseError::fail(format!("sync after recovery: {e}")))?;
                drop(log);
                let log = StreamLog::open(dir.path(), opts, &synced)
                    .map_err(|e| TestCaseError::fail(format!("reopen after append: {e}")))?;
                prop_assert_eq!(log.next_offset(), base + 2);
                let meta = log.batches(base, base + 2);
                prop_assert_eq!(meta.len(), 1);
                let batch = log
                    .read(&meta[0])
                    .map_err(|e| TestCaseError::fail(format!("read after reopen: {e}")))?;
                check_rows(&batch, base, 2)
            })
        })
        .expect("property");
}

/// Damage that happens while the log is open: reads of indexed frames whose bytes changed
/// underneath fail cleanly or return what was written.
#[test]
fn fuzz_stream_log_read_after_damage() {
    let _serial = serial();
    let strategy = (
        0..templates().len(),
        proptest::collection::vec(damage(), 1..4),
    );
    TestRunner::new(config(cases()))
        .run(&strategy, |(which, damage)| {
            timed(|| {
                let t = &templates()[which];
                let dir = scratch_dir();
                write_files(dir.path(), &t.files);
                let opts = StreamLogOptions {
                    segment_bytes: t.segment_bytes,
                };
                let log = StreamLog::open(dir.path(), opts, &t.checkpoint)
                    .map_err(|e| TestCaseError::fail(format!("undamaged log: {e}")))?;
                let files = damaged(t, &damage);
                for (name, _) in &t.files {
                    if !files.iter().any(|(n, _)| n == name) {
                        std::fs::write(dir.path().join(name), b"").expect("empty segment");
                    }
                }
                write_files(dir.path(), &files);
                within_budget(2 * t.total_bytes() + ALLOC_SLACK, || {
                    for meta in log.batches(0, u64::MAX) {
                        prop_assert!(t.written.contains(&(meta.base_offset, meta.rows)));
                        if let Ok(batch) = log.read(&meta) {
                            check_rows(&batch, meta.base_offset, meta.rows)?;
                        }
                        // by column: large frames read only those columns' bytes
                        for columns in COLUMN_SETS {
                            if let Ok(batch) = log.read_columns(&meta, Some(columns)) {
                                check_columns(&batch, columns, meta.base_offset, meta.rows)?;
                            }
                        }
                    }
                    Ok(())
                })
            })
        })
        .expect("property");
}

/// `Segment::recover` on arbitrary bytes and `SegmentFile::read_batch` at arbitrary positions
/// and lengths: no panic, no allocation for bytes that are not in the file.
#[test]
fn fuzz_segment_recover_and_read_batch() {
    let _serial = serial();
    let bytes = prop_oneof![
        proptest::collection::vec(any::<u8>(), 0..512),
        (
            0..templates().len(),
            proptest::collection::vec(damage(), 0..3)
        )
            .prop_map(|(which, damage)| {
                let files = damaged(&templates()[which], &damage);
                files.into_iter().next().map(|(_, b)| b).unwrap_or_default()
            }),
    ];
    let reads = proptest::collection::vec((0..4096u64, interesting_u32(), 0..64u64), 0..8);
    let strategy = (
        bytes,
        prop_oneof![Just(None), (0..4096u64).prop_map(Some)],
        any::<bool>(),
        reads,
    );
    TestRunner::new(config(cases()))
        .run(&strategy, |(bytes, limit, truncate, reads)| {
            timed(|| {
                let dir = scratch_dir();
                let path: PathBuf = dir.path().join(segment::file_name(0));
                std::fs::write(&path, &bytes).expect("write");
                let torn = if truncate {
                    TornTail::Truncate
                } else {
                    TornTail::Reject
                };
                within_budget(2 * bytes.len() + ALLOC_SLACK, || {
                    let Ok(segment) = Segment::recover(path, 0, limit, torn) else {
                        return Ok(());
                    };
                    prop_assert!(segment.bytes() <= bytes.len() as u64);
                    for f in segment.frames() {
                        // whole, and by column (from the frame's parts when it keeps them)
                        let parts = segment.parts(f.position);
                        for columns in [None, Some(&[0usize][..]), Some(&[][..])] {
                            segment
                                .file()
                                .read_batch(
                                    f.position,
                                    f.len,
                                    f.base_offset,
                                    columns,
                                    parts.as_deref(),
                                )
                                .map_err(|e| TestCaseError::fail(format!("indexed frame: {e}")))?;
                        }
                    }
                    let parts: Vec<_> = segment
                        .frames()
                        .iter()
                        .filter_map(|f| segment.parts(f.position))
                        .collect();
                    for (i, (position, len, base)) in reads.into_iter().enumerate() {
                        let columns = (i % 2 == 1).then_some(&[0usize, 1][..]);
                        // parts of another frame, or none
                        let parts = parts.get(i % 3).map(|p| &**p);
                        let _ = segment
                            .file()
                            .read_batch(position, len, base, columns, parts);
                    }
                    Ok(())
                })
            })
        })
        .expect("property");
}

/// `frame::decode_header` on any 32 bytes; `encode_header` round-trips.
#[test]
fn fuzz_frame_header() {
    let _serial = serial();
    let strategy = (
        proptest::array::uniform32(any::<u8>()),
        any::<u64>(),
        any::<u32>(),
        any::<i64>(),
        proptest::collection::vec(any::<u8>(), 0..64),
    );
    TestRunner::new(config(cases()))
        .run(&strategy, |(raw, base, rows, ts, payload)| {
            timed(|| {
                if let Some(h) = frame::decode_header(&raw) {
                    prop_assert_eq!(&raw[0..4], &MAGIC.to_le_bytes());
                    prop_assert_eq!(h.frame_len(), HEADER_LEN as u64 + u64::from(h.payload_len));
                    let _ = frame::verify_checksum(&h, &payload);
                }
                let encoded = frame::encode_header(base, rows, ts, &payload).expect("fits");
                let h = frame::decode_header(&encoded).expect("magic");
                prop_assert_eq!(
                    (h.base_offset, h.rows, h.ts_micros, h.payload_len as usize),
                    (base, rows, ts, payload.len())
                );
                prop_assert!(frame::verify_checksum(&h, &payload));
                Ok(())
            })
        })
        .expect("property");
}
