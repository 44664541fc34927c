//! What `StreamLog` promises: gapless offsets, batches read back as written,
//! rollover by size, recovery to exactly the checkpoint (torn tails cut,
//! corruption refused), prefix truncation, and readers concurrent with the
//! writer.

use std::fs::{self, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;

use arrow::array::{Array, StringArray, UInt64Array};
use arrow::datatypes::{DataType, Field, Schema};
use arrow::ipc::writer::StreamWriter;
use arrow::record_batch::RecordBatch;
use sluice_storage::frame::{self, HEADER_LEN};
use sluice_storage::{Error, StreamCheckpoint, StreamLog, StreamLogOptions};

/// IPC bytes of one batch whose `offset` column holds `base..base + rows`.
fn ipc(base: u64, rows: u32) -> Vec<u8> {
    let schema = Arc::new(Schema::new(vec![
        Field::new("offset", DataType::UInt64, false),
        Field::new("msg", DataType::Utf8, false),
    ]));
    let offsets: Vec<u64> = (base..base + u64::from(rows)).collect();
    let msgs: Vec<String> = offsets.iter().map(|o| format!("row {o}")).collect();
    let batch = RecordBatch::try_new(
        schema.clone(),
        vec![
            Arc::new(UInt64Array::from(offsets)),
            Arc::new(StringArray::from(msgs)),
        ],
    )
    .expect("batch");
    let mut writer = StreamWriter::try_new(Vec::new(), &schema).expect("writer");
    writer.write(&batch).expect("write");
    writer.finish().expect("finish");
    writer.into_inner().expect("into_inner")
}

/// Asserts that `batch` is the one `ipc(base, rows)` encoded.
fn assert_batch(batch: &RecordBatch, base: u64, rows: u32) {
    assert_eq!(batch.num_rows(), rows as usize);
    let offsets = batch
        .column(0)
        .as_any()
        .downcast_ref::<UInt64Array>()
        .expect("u64 column");
    let msgs = batch
        .column(1)
        .as_any()
        .downcast_ref::<StringArray>()
        .expect("utf8 column");
    for i in 0..batch.num_rows() {
        let expected = base + i as u64;
        assert_eq!(offsets.value(i), expected);
        assert_eq!(msgs.value(i), format!("row {expected}"));
    }
}

/// Appends one batch per entry of `rows`, each at ts = 1000 * its base offset.
fn append_all(log: &StreamLog, rows: &[u32]) -> Vec<u64> {
    rows.iter()
        .map(|&n| {
            let base = log.next_offset();
            let got = log
                .append(&ipc(base, n), n, base as i64 * 1000)
                .expect("append");
            assert_eq!(got, base);
            got
        })
        .collect()
}

fn opts(segment_bytes: u64) -> StreamLogOptions {
    StreamLogOptions { segment_bytes }
}

fn segment_path(dir: &Path, base: u64) -> PathBuf {
    dir.join(format!("{base:020}.seg"))
}

fn segment_files(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = fs::read_dir(dir)
        .expect("read_dir")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .filter(|name| name.ends_with(".seg"))
        .collect();
    names.sort();
    names
}

fn file_len(path: &Path) -> u64 {
    fs::metadata(path).expect("metadata").len()
}

/// Reads every batch in `[from, next_offset)` and checks it is gapless.
fn read_all(log: &StreamLog, from: u64) -> u64 {
    let mut pos = from;
    for meta in log.batches(from, log.next_offset()) {
        assert_eq!(meta.base_offset, pos, "gap before {meta:?}");
        assert_batch(&log.read(&meta).expect("read"), meta.base_offset, meta.rows);
        pos = meta.end_offset();
    }
    pos
}

#[test]
fn stream_log_is_send_and_sync() {
    fn check<T: Send + Sync>() {}
    check::<StreamLog>();
    check::<Arc<StreamLog>>();
}

#[test]
fn append_and_read_back() {
    let dir = tempfile::tempdir().expect("tempdir");
    let log = StreamLog::create(dir.path(), StreamLogOptions::default()).expect("create");
    assert_eq!((log.first_offset(), log.next_offset()), (0, 0));
    assert_eq!(log.last_ts_micros(), None);

    assert_eq!(append_all(&log, &[3, 5, 2]), vec![0, 3, 8]);
    assert_eq!(log.next_offset(), 10);
    assert_eq!(log.last_ts_micros(), Some(8000));

    let metas = log.batches(0, 10);
    let shape: Vec<_> = metas
        .iter()
        .map(|m| (m.base_offset, m.rows, m.ts_micros))
        .collect();
    assert_eq!(shape, vec![(0, 3, 0), (3, 5, 3000), (8, 2, 8000)]);
    for meta in &metas {
        assert_batch(&log.read(meta).expect("read"), meta.base_offset, meta.rows);
    }
    assert_eq!(metas[1].position, u64::from(metas[0].len));

    let middle: Vec<_> = log.batches(4, 9).iter().map(|m| m.base_offset).collect();
    assert_eq!(middle, vec![3, 8]);
    assert_eq!(log.batches(7, 8).len(), 1);
    assert!(log.batches(10, 20).is_empty());
    assert!(log.batches(5, 5).is_empty());
    assert_eq!(
        log.size_bytes(),
        metas.iter().map(|m| u64::from(m.len)).sum::<u64>()
    );
}

/// Frames appended unpublished (a staged COPY's commit) are invisible to readers — also
/// across a segment rollover — until `publish` shows them all; the writer's offsets go on.
#[test]
fn unpublished_frames_appear_together_at_publish() {
    let dir = tempfile::tempdir().expect("tempdir");
    let log = StreamLog::create(dir.path(), opts(256)).expect("create");
    append_all(&log, &[2]);
    let mut bases = Vec::new();
    for (i, rows) in [3u32, 4, 5].into_iter().enumerate() {
        let base = log.write_offset();
        bases.push(
            log.append_unpublished(&ipc(base, rows), rows, 9_000 + i as i64)
                .expect("append unpublished"),
        );
        assert_eq!(
            log.next_offset(),
            2,
            "readers still end at the published offset"
        );
        assert_eq!(
            log.batches(0, u64::MAX).len(),
            1,
            "only the published frame"
        );
        assert_eq!(
            log.offset_at_ts(9_000),
            2,
            "a tail from the new frames' time waits"
        );
    }
    assert_eq!(bases, vec![2, 5, 9]);
    assert_eq!(log.write_offset(), 14);
    assert!(log.segments().len() > 1, "the frames rolled over a segment");
    // the payloads read back verbatim and verified
    let copy = tempfile::tempdir().expect("tempdir");
    let moved = StreamLog::create(copy.path(), StreamLogOptions::default()).expect("create");
    log.publish().expect("publish");
    assert_eq!(log.next_offset(), 14);
    let metas = log.batches(0, u64::MAX);
    assert_eq!(metas.len(), 4);
    for meta in &metas {
        assert_batch(&log.read(meta).expect("read"), meta.base_offset, meta.rows);
        let payload = log.read_payload(meta).expect("payload");
        moved
            .append(&payload, meta.rows, meta.ts_micros)
            .expect("append the payload");
    }
    for meta in moved.batches(0, u64::MAX) {
        assert_batch(
            &moved.read(&meta).expect("read"),
            meta.base_offset,
            meta.rows,
        );
    }
    // a damaged payload is refused, not moved
    let last = metas.last().expect("a frame");
    let path = segment_path(dir.path(), last.segment_base);
    let file = OpenOptions::new().write(true).open(&path).expect("open");
    file.write_all_at(b"X", last.position + u64::from(last.len) - 3)
        .expect("damage");
    assert!(matches!(log.read_payload(last), Err(Error::Corrupt { .. })));
}

#[test]
fn rollover_names_segments_by_base_offset_and_batches_prune() {
    let dir = tempfile::tempdir().expect("tempdir");
    let frame_len = (HEADER_LEN + ipc(0, 4).len()) as u64;
    // Two frames fit in a segment before it reaches the rollover size.
    let log = StreamLog::create(dir.path(), opts(frame_len * 2 - 1)).expect("create");
    append_all(&log, &[4; 10]);

    assert_eq!(
        segment_files(dir.path()),
        [
            "00000000000000000000.seg",
            "00000000000000000008.seg",
            "00000000000000000016.seg",
            "00000000000000000024.seg",
            "00000000000000000032.seg"
        ]
    );
    let segments = log.segments();
    assert_eq!(segments.len(), 5);
    for (i, s) in segments.iter().enumerate() {
        let base = i as u64 * 8;
        assert_eq!((s.base_offset, s.next_offset), (base, base + 8));
        assert_eq!(s.bytes, frame_len * 2);
        assert_eq!(s.min_ts_micros, Some(base as i64 * 1000));
        assert_eq!(s.max_ts_micros, Some((base as i64 + 4) * 1000));
        assert_eq!(s.path, segment_path(dir.path(), base));
        assert_eq!(file_len(&s.path), s.bytes);
    }

    let metas = log.batches(13, 22);
    let found: Vec<_> = metas
        .iter()
        .map(|m| (m.base_offset, m.segment_base))
        .collect();
    assert_eq!(found, vec![(12, 8), (16, 16), (20, 16)]);
    for meta in &metas {
        assert_batch(&log.read(meta).expect("read"), meta.base_offset, meta.rows);
    }
    assert_eq!(read_all(&log, 0), 40);

    // seeks by time (frame `b` is stamped b * 1000): the first frame at or after it
    assert_eq!(log.offset_at_ts(i64::MIN), 0);
    assert_eq!(log.offset_at_ts(12_000), 12);
    assert_eq!(log.offset_at_ts(12_001), 16);
    assert_eq!(log.offset_at_ts(36_000), 36);
    assert_eq!(log.offset_at_ts(36_001), 40);
}

#[test]
fn reopen_after_sync_keeps_everything() {
    let dir = tempfile::tempdir().expect("tempdir");
    let frame_len = (HEADER_LEN + ipc(0, 3).len()) as u64;
    let log = StreamLog::create(dir.path(), opts(frame_len * 3)).expect("create");
    append_all(&log, &[3; 7]);
    let checkpoint = log.sync().expect("sync");
    assert_eq!(
        checkpoint,
        StreamCheckpoint {
            first_offset: 0,
            segment_base: 18,
            segment_len: frame_len
        }
    );
    let before = log.segments();
    drop(log);

    let log = StreamLog::open(dir.path(), opts(frame_len * 3), &checkpoint).expect("open");
    assert_eq!((log.first_offset(), log.next_offset()), (0, 21));
    assert_eq!(log.last_ts_micros(), Some(18_000));
    assert_eq!(log.segments(), before);
    assert_eq!(read_all(&log, 0), 21);
    assert_eq!(append_all(&log, &[2]), vec![21]);
    assert_eq!(read_all(&log, 0), 23);
}

#[test]
fn reopen_removes_everything_past_the_checkpoint() {
    let dir = tempfile::tempdir().expect("tempdir");
    let frame_len = (HEADER_LEN + ipc(0, 2).len()) as u64;
    let log = StreamLog::create(dir.path(), opts(frame_len * 2)).expect("create");
    append_all(&log, &[2; 3]);
    let checkpoint = log.sync().expect("sync");
    assert_eq!(
        (checkpoint.segment_base, checkpoint.segment_len),
        (4, frame_len)
    );
    append_all(&log, &[2; 4]); // fills segment 4, then segments 8 and 12
    assert_eq!(log.segments().len(), 4);
    drop(log);

    let log = StreamLog::open(dir.path(), opts(frame_len * 2), &checkpoint).expect("open");
    assert_eq!(log.next_offset(), 6);
    assert_eq!(
        segment_files(dir.path()),
        ["00000000000000000000.seg", "00000000000000000004.seg"]
    );
    assert_eq!(file_len(&segment_path(dir.path(), 4)), frame_len);
    assert_eq!(read_all(&log, 0), 6);
    // The caller replays: offsets continue where the checkpoint ended.
    assert_eq!(append_all(&log, &[5]), vec![6]);
    assert_eq!(read_all(&log, 0), 11);
}

/// Writes the first `keep` bytes of the frame holding `ipc(base, rows)` at
/// the end of `path`, as a write interrupted by a crash would.
fn write_partial_frame(path: &Path, base: u64, rows: u32, keep: usize) -> u64 {
    let payload = ipc(base, rows);
    let mut bytes = frame::encode_header(base, rows, 0, &payload)
        .expect("fits")
        .to_vec();
    bytes.extend_from_slice(&payload);
    let file = OpenOptions::new().write(true).open(path).expect("open");
    let end = file.metadata().expect("metadata").len();
    file.write_all_at(&bytes[..keep], end).expect("write");
    end + keep as u64
}

#[test]
fn torn_final_frame_is_truncated_and_offsets_continue() {
    for keep in [HEADER_LEN / 2, HEADER_LEN + 10] {
        let dir = tempfile::tempdir().expect("tempdir");
        let log = StreamLog::create(dir.path(), StreamLogOptions::default()).expect("create");
        append_all(&log, &[3, 4]);
        let synced = log.sync().expect("sync");
        drop(log);

        let path = segment_path(dir.path(), 0);
        let torn_len = write_partial_frame(&path, 7, 5, keep);
        // The checkpoint claims the torn bytes: the write was lost after all.
        let checkpoint = StreamCheckpoint {
            segment_len: torn_len,
            ..synced.clone()
        };
        let log = StreamLog::open(dir.path(), StreamLogOptions::default(), &checkpoint)
            .expect("open cuts the torn frame");
        assert_eq!(log.next_offset(), 7, "keep={keep}");
        assert_eq!(file_len(&path), synced.segment_len, "keep={keep}");
        assert_eq!(append_all(&log, &[5, 1]), vec![7, 12]);
        assert_eq!(read_all(&log, 0), 13);

        let checkpoint = log.sync().expect("sync");
        drop(log);
        let log =
            StreamLog::open(dir.path(), StreamLogOptions::default(), &checkpoint).expect("reopen");
        assert_eq!(read_all(&log, 0), 13);
    }
}

/// Flips one byte of `path` at `position`.
fn flip_byte(path: &Path, position: u64) {
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .expect("open");
    let mut byte = [0u8];
    file.read_exact_at(&mut byte, position).expect("read");
    file.write_all_at(&[byte[0] ^ 0x20], position)
        .expect("write");
}

#[test]
fn flipped_byte_in_a_complete_frame_is_corruption_named_by_file_and_position() {
    let dir = tempfile::tempdir().expect("tempdir");
    let frame_len = (HEADER_LEN + ipc(0, 2).len()) as u64;
    let log = StreamLog::create(dir.path(), opts(frame_len * 3)).expect("create");
    append_all(&log, &[2; 5]); // segment 0: three frames; segment 6: two
    let checkpoint = log.sync().expect("sync");
    let victim = log.batches(2, 3)[0];
    assert_eq!((victim.segment_base, victim.position), (0, frame_len));
    drop(log);

    let path = segment_path(dir.path(), 0);
    flip_byte(&path, victim.position + HEADER_LEN as u64 + 20);
    let err = StreamLog::open(dir.path(), opts(frame_len * 3), &checkpoint)
        .expect_err("corruption must refuse to open");
    match &err {
        Error::Corrupt {
            path: p, position, ..
        } => {
            assert_eq!((p, *position), (&path, victim.position));
        }
        other => panic!("expected Corrupt, got {other}"),
    }
    let message = err.to_string();
    assert!(message.contains(&path.display().to_string()), "{message}");
    assert!(
        message.contains(&format!("at byte {}", victim.position)),
        "{message}"
    );
    assert!(!err.is_deterministic());
    // Nothing was cut to "repair" it.
    assert_eq!(file_len(&path), frame_len * 3);
}

#[test]
fn flipped_byte_in_the_active_segment_is_corruption_not_a_torn_tail() {
    let dir = tempfile::tempdir().expect("tempdir");
    let log = StreamLog::create(dir.path(), StreamLogOptions::default()).expect("create");
    append_all(&log, &[2; 3]);
    let checkpoint = log.sync().expect("sync");
    let last = log.batches(4, 6)[0];
    let path = segment_path(dir.path(), 0);
    flip_byte(&path, last.position + u64::from(last.len) - 1);

    let err = log.read(&last).expect_err("read verifies the checksum");
    assert!(
        matches!(&err, Error::Corrupt { position, .. } if *position == last.position),
        "{err}"
    );
    drop(log);
    let err =
        StreamLog::open(dir.path(), StreamLogOptions::default(), &checkpoint).expect_err("open");
    assert!(
        matches!(&err, Error::Corrupt { position, .. } if *position == last.position),
        "{err}"
    );
}

#[test]
fn missing_middle_segment_is_corruption() {
    let dir = tempfile::tempdir().expect("tempdir");
    let log = StreamLog::create(dir.path(), opts(1)).expect("create");
    append_all(&log, &[1; 3]);
    let checkpoint = log.sync().expect("sync");
    drop(log);
    fs::remove_file(segment_path(dir.path(), 1)).expect("remove");
    let err = StreamLog::open(dir.path(), opts(1), &checkpoint).expect_err("gap");
    assert!(
        matches!(&err, Error::Corrupt { path, .. } if *path == segment_path(dir.path(), 2)),
        "{err}"
    );
}

/// Issue 20, case 5: a deleted first segment opened as a log that silently
/// started at the next segment's base (the old code returned `Ok` here).
#[test]
fn missing_first_segment_is_corruption() {
    let dir = tempfile::tempdir().expect("tempdir");
    let log = StreamLog::create(dir.path(), opts(1)).expect("create");
    append_all(&log, &[5; 3]); // segments 0, 5, 10
    let checkpoint = log.sync().expect("sync");
    drop(log);
    fs::remove_file(segment_path(dir.path(), 0)).expect("remove");
    let err = StreamLog::open(dir.path(), opts(1), &checkpoint).expect_err("missing");
    assert!(
        matches!(&err, Error::Corrupt { path, .. } if *path == segment_path(dir.path(), 5)),
        "{err}"
    );
    assert!(
        err.to_string().contains("offsets from 0 must exist"),
        "{err}"
    );
}

/// The segments a prefix truncation deletes stay accounted for when the node
/// stops before its next checkpoint: reopening from the older checkpoint
/// (whose `first_offset` is still 0) is not mistaken for a missing segment,
/// while deleting the first segment still kept is.
#[test]
fn truncated_prefix_is_remembered_across_a_crash_before_the_checkpoint() {
    let dir = tempfile::tempdir().expect("tempdir");
    let log = StreamLog::create(dir.path(), opts(1)).expect("create");
    append_all(&log, &[5; 4]); // segments 0, 5, 10, 15
    let checkpoint = log.sync().expect("sync");
    assert_eq!(checkpoint.first_offset, 0);
    assert_eq!(log.truncate_prefix(12).expect("truncate"), 12);
    drop(log); // crash: no checkpoint records 12
    let log = StreamLog::open(dir.path(), opts(1), &checkpoint).expect("open");
    assert_eq!((log.first_offset(), log.next_offset()), (12, 20));
    drop(log);
    fs::remove_file(segment_path(dir.path(), 10)).expect("remove");
    let err = StreamLog::open(dir.path(), opts(1), &checkpoint).expect_err("missing");
    assert!(
        err.to_string().contains("offsets from 12 must exist"),
        "{err}"
    );
}

#[test]
fn truncate_prefix_deletes_old_segments_but_keeps_the_active_one() {
    let dir = tempfile::tempdir().expect("tempdir");
    let log = StreamLog::create(dir.path(), opts(1)).expect("create");
    append_all(&log, &[5; 4]); // one frame per segment: 0, 5, 10, 15
    let stale = log.batches(0, 5)[0];
    log.sync().expect("sync");

    assert_eq!(log.truncate_prefix(7).expect("truncate"), 7);
    assert_eq!(log.first_offset(), 7);
    let bases: Vec<_> = log.segments().iter().map(|s| s.base_offset).collect();
    assert_eq!(bases, vec![5, 10, 15]);
    assert!(!segment_path(dir.path(), 0).exists());
    assert_eq!(log.batches(0, 20)[0].base_offset, 5);
    assert!(matches!(
        log.read(&stale),
        Err(Error::OffsetTruncated {
            requested: 0,
            first: 7
        })
    ));

    // Never backwards, never past next_offset, never the active segment.
    assert_eq!(log.truncate_prefix(3).expect("truncate"), 7);
    assert_eq!(log.truncate_prefix(1000).expect("truncate"), 20);
    assert_eq!(segment_files(dir.path()), ["00000000000000000015.seg"]);
    assert!(log.batches(0, 20).is_empty());
    assert_eq!(append_all(&log, &[2]), vec![20]);
    assert_eq!(read_all(&log, 20), 22);

    let checkpoint = log.sync().expect("sync");
    assert_eq!(checkpoint.first_offset, 20);
    drop(log);
    let log = StreamLog::open(dir.path(), opts(1), &checkpoint).expect("open");
    assert_eq!((log.first_offset(), log.next_offset()), (20, 22));
}

#[test]
fn truncate_prefix_keeps_segments_the_last_checkpoint_needs() {
    let dir = tempfile::tempdir().expect("tempdir");
    let log = StreamLog::create(dir.path(), opts(1)).expect("create");
    append_all(&log, &[5]);
    let checkpoint = log.sync().expect("sync"); // points into segment 0
    append_all(&log, &[5; 2]); // segments 5 and 10
    assert_eq!(log.truncate_prefix(15).expect("truncate"), 15);
    assert_eq!(
        segment_files(dir.path()).len(),
        3,
        "segment 0 is still needed"
    );
    assert!(log.batches(0, 15).is_empty());

    // A crash now: the checkpoint still restores offsets 0..5 for replay.
    let reopened = StreamLog::open(dir.path(), opts(1), &checkpoint).expect("open");
    assert_eq!(reopened.next_offset(), 5);
    drop(reopened);

    let log = StreamLog::open(dir.path(), opts(1), &checkpoint).expect("open");
    append_all(&log, &[5; 2]);
    log.sync().expect("sync");
    log.truncate_prefix(15).expect("truncate");
    assert_eq!(segment_files(dir.path()), ["00000000000000000010.seg"]);
}

#[test]
fn create_starts_clean() {
    let dir = tempfile::tempdir().expect("tempdir");
    let log = StreamLog::create(dir.path(), opts(1)).expect("create");
    append_all(&log, &[3; 3]);
    fs::write(dir.path().join("stray"), b"x").expect("write");
    drop(log);

    let log = StreamLog::create(dir.path(), opts(1)).expect("create again");
    assert_eq!(log.next_offset(), 0);
    assert_eq!(segment_files(dir.path()), ["00000000000000000000.seg"]);
    assert_eq!(append_all(&log, &[1]), vec![0]);
}

#[test]
fn destroy_removes_the_directory_and_refuses_writes() {
    let parent = tempfile::tempdir().expect("tempdir");
    let dir = parent.path().join("stream");
    let log = StreamLog::create(&dir, StreamLogOptions::default()).expect("create");
    append_all(&log, &[1]);
    log.destroy().expect("destroy");
    assert!(!dir.exists());
    assert!(matches!(
        log.append(&ipc(1, 1), 1, 0),
        Err(Error::Poisoned(_))
    ));
}

#[test]
fn io_error_poisons_the_log() {
    let parent = tempfile::tempdir().expect("tempdir");
    let dir = parent.path().join("stream");
    let log = StreamLog::create(&dir, opts(1)).expect("create");
    append_all(&log, &[1]);
    // The next append must start a segment, in a directory that is gone.
    fs::remove_dir_all(&dir).expect("remove");
    let err = log.append(&ipc(1, 1), 1, 0).expect_err("rollover fails");
    assert!(matches!(err, Error::Io { .. }), "{err}");
    fs::create_dir_all(&dir).expect("recreate");
    assert!(matches!(
        log.append(&ipc(1, 1), 1, 0),
        Err(Error::Poisoned(_))
    ));
    assert!(matches!(log.sync(), Err(Error::Poisoned(_))));
    assert!(matches!(log.truncate_prefix(1), Err(Error::Poisoned(_))));
    assert_eq!(log.next_offset(), 1);
}

#[test]
fn concurrent_readers_see_gapless_consistent_data() {
    const BATCHES: u64 = 400;
    let dir = tempfile::tempdir().expect("tempdir");
    let log = Arc::new(StreamLog::create(dir.path(), opts(4096)).expect("create"));
    let done = Arc::new(AtomicBool::new(false));

    let readers: Vec<_> = (0..3)
        .map(|_| {
            let (log, done) = (Arc::clone(&log), Arc::clone(&done));
            thread::spawn(move || {
                let (mut pos, mut passes) = (0u64, 0u64);
                loop {
                    let finished = done.load(Ordering::Acquire);
                    let next = log.next_offset();
                    assert!(next >= pos);
                    for meta in log.batches(pos, next) {
                        assert_eq!(meta.base_offset, pos, "gap");
                        let batch = log.read(&meta).expect("read");
                        assert_batch(&batch, meta.base_offset, meta.rows);
                        pos = meta.end_offset();
                    }
                    assert_eq!(pos, next, "batches stopped short of next_offset");
                    passes += 1;
                    if finished {
                        return (pos, passes);
                    }
                }
            })
        })
        .collect();

    let mut total = 0u64;
    for i in 0..BATCHES {
        let rows = (i % 7 + 1) as u32;
        assert_eq!(
            log.append(&ipc(total, rows), rows, i as i64)
                .expect("append"),
            total
        );
        total += u64::from(rows);
        if i % 50 == 0 {
            log.sync().expect("sync");
        }
    }
    done.store(true, Ordering::Release);

    for reader in readers {
        let (pos, passes) = reader.join().expect("reader panicked");
        assert_eq!(pos, total);
        assert!(passes > 1);
    }
    assert!(log.segments().len() > 5, "the test should span rollovers");
}

#[test]
fn checkpoint_round_trips_through_serde() {
    let checkpoint = StreamCheckpoint {
        first_offset: 3,
        segment_base: 10,
        segment_len: 999,
    };
    let json = serde_json::to_string(&checkpoint).expect("serialize");
    let back: StreamCheckpoint = serde_json::from_str(&json).expect("deserialize");
    assert_eq!(back, checkpoint);
}

/// Background write-back runs beside a writer (across rollovers) without
/// changing what a checkpoint says: recovery goes to the checkpoint, not to
/// what was merely written back.
#[test]
fn write_back_runs_beside_appends_and_does_not_move_the_checkpoint() {
    let dir = tempfile::tempdir().expect("tempdir");
    let opts = StreamLogOptions {
        segment_bytes: 2048,
    };
    let log = Arc::new(StreamLog::create(dir.path(), opts.clone()).expect("create"));
    assert!(log.write_back().is_ok(), "nothing to write back is fine");
    let stop = Arc::new(AtomicBool::new(false));
    let syncer = {
        let (log, stop) = (log.clone(), stop.clone());
        thread::spawn(move || {
            let mut rounds = 0;
            while !stop.load(Ordering::Relaxed) || rounds == 0 {
                log.write_back().expect("write back");
                rounds += 1;
            }
            rounds
        })
    };
    append_all(&log, &[4; 40]);
    let checkpoint = log.sync().expect("sync");
    append_all(&log, &[4; 10]);
    stop.store(true, Ordering::Relaxed);
    assert!(syncer.join().expect("syncer") > 0);
    log.write_back().expect("write back the tail");
    assert_eq!(log.next_offset(), 200);
    assert!(log.segments().len() > 1, "the test should cross rollovers");
    drop(log);
    let reopened = StreamLog::open(dir.path(), opts, &checkpoint).expect("reopen");
    assert_eq!(reopened.next_offset(), 160, "recovery is to the checkpoint");
    assert_eq!(read_all(&reopened, 0), 160);
}

#[test]
fn read_columns_decodes_only_the_columns_asked_for() {
    let dir = tempfile::tempdir().expect("tempdir");
    let log = StreamLog::create(dir.path(), StreamLogOptions::default()).expect("create");
    append_all(&log, &[3, 4]);
    for meta in log.batches(0, log.next_offset()) {
        let both = log.read_columns(&meta, Some(&[0, 1])).expect("both");
        assert_batch(&both, meta.base_offset, meta.rows);
        let msg = log.read_columns(&meta, Some(&[1])).expect("msg");
        assert_eq!(msg.num_columns(), 1);
        assert_eq!(msg.schema().field(0).name(), "msg");
        assert_eq!(msg.column(0), both.column(1));
        // no column: the row count still comes through (count(*))
        let none = log.read_columns(&meta, Some(&[])).expect("none");
        assert_eq!(
            (none.num_columns(), none.num_rows()),
            (0, meta.rows as usize)
        );
        // a column the batch predates (added to the stream later) is left out
        let later = log.read_columns(&meta, Some(&[0, 2, 5])).expect("later");
        assert_eq!(later.num_columns(), 1);
        assert_eq!(later.column(0), both.column(0));
    }
}

/// A read of some columns of a large frame reads only those columns' bytes, each checked
/// against its own checksum: damage in another column does not fail it (a whole read
/// does), damage in a column read or in the frame's head does. Holds for a frame indexed by
/// recovery and for one appended since.
#[test]
fn a_column_read_of_a_large_frame_reads_and_verifies_only_that_column() {
    let dir = tempfile::tempdir().expect("tempdir");
    let log = StreamLog::create(dir.path(), StreamLogOptions::default()).expect("create");
    // 10,000 rows: an 80 KB offset column, then a ~100 KB msg column
    append_all(&log, &[10_000]);
    let checkpoint = log.sync().expect("sync");
    drop(log);
    let log = StreamLog::open(dir.path(), StreamLogOptions::default(), &checkpoint).expect("open");
    append_all(&log, &[10_000]);
    let path = segment_path(dir.path(), 0);
    for meta in log.batches(0, log.next_offset()) {
        let frame_end = meta.position + u64::from(meta.len);
        let whole = log.read(&meta).expect("undamaged");
        assert_batch(&whole, meta.base_offset, meta.rows);
        // the msg column's values run to the end of the batch body
        flip_byte(&path, frame_end - 100);
        let offsets = log.read_columns(&meta, Some(&[0])).expect("offsets only");
        assert_eq!(offsets.column(0), whole.column(0));
        let count = log.read_columns(&meta, Some(&[])).expect("no column");
        assert_eq!(count.num_rows(), 10_000);
        for columns in [None, Some(&[1usize][..]), Some(&[0, 1][..])] {
            let err = log.read_columns(&meta, columns).expect_err("damaged msg");
            assert!(matches!(err, Error::Corrupt { .. }), "{columns:?}: {err}");
        }
        // damage inside the offset column (past the head, before the msg column)
        flip_byte(&path, frame_end - 100);
        flip_byte(&path, meta.position + HEADER_LEN as u64 + 40_000);
        let err = log
            .read_columns(&meta, Some(&[0]))
            .expect_err("damaged offsets");
        assert!(matches!(err, Error::Corrupt { .. }), "{err}");
        log.read_columns(&meta, Some(&[1]))
            .expect_err("whole read: frame checksum");
        flip_byte(&path, meta.position + HEADER_LEN as u64 + 40_000);
        // damage in the head: the schema message
        flip_byte(&path, meta.position + HEADER_LEN as u64 + 20);
        let err = log
            .read_columns(&meta, Some(&[]))
            .expect_err("damaged head");
        assert!(matches!(err, Error::Corrupt { .. }), "{err}");
        flip_byte(&path, meta.position + HEADER_LEN as u64 + 20);
        assert_eq!(log.read(&meta).expect("repaired"), whole);
    }
}

/// A checksum-valid frame whose schema message makes Arrow's schema conversion panic (a
/// crafted backup or snapshot: here a schema without its field list) does not stop
/// recovery: the frame is indexed without parts, as every frame was before them.
#[test]
fn a_large_frame_with_a_malformed_schema_is_recovered() {
    let mut fbb = flatbuffers::FlatBufferBuilder::new();
    let schema = arrow::ipc::SchemaBuilder::new(&mut fbb).finish();
    let mut message = arrow::ipc::MessageBuilder::new(&mut fbb);
    message.add_version(arrow::ipc::MetadataVersion::V5);
    message.add_header_type(arrow::ipc::MessageHeader::Schema);
    message.add_header(schema.as_union_value());
    message.add_bodyLength(0);
    let message = message.finish();
    fbb.finish(message, None);
    let mut meta = fbb.finished_data().to_vec();
    meta.resize(meta.len().div_ceil(8) * 8, 0);
    let mut payload = u32::MAX.to_le_bytes().to_vec();
    payload.extend_from_slice(&(meta.len() as u32).to_le_bytes());
    payload.extend_from_slice(&meta);
    // then a real batch message, large enough for parts to be tried
    let real = ipc(0, 10_000);
    let mut at = 0usize;
    let skip = |at: &mut usize| {
        let len = u32::from_le_bytes([real[*at + 4], real[*at + 5], real[*at + 6], real[*at + 7]]);
        *at += 8 + len as usize;
    };
    skip(&mut at); // the real schema message (no body)
    payload.extend_from_slice(&real[at..]);
    assert!(payload.len() > 64 << 10);
    assert!(
        std::panic::catch_unwind(|| arrow::ipc::convert::fb_to_schema(
            arrow::ipc::root_as_message(&meta)
                .expect("message")
                .header_as_schema()
                .expect("schema")
        ))
        .is_err(),
        "the crafted schema should make Arrow's conversion panic"
    );

    let dir = tempfile::tempdir().expect("tempdir");
    let log = StreamLog::create(dir.path(), StreamLogOptions::default()).expect("create");
    log.append(&payload, 10_000, 0).expect("append");
    let checkpoint = log.sync().expect("sync");
    drop(log);
    let log = StreamLog::open(dir.path(), StreamLogOptions::default(), &checkpoint)
        .expect("recovery is not stopped by the frame");
    assert_eq!(log.next_offset(), 10_000);
}

/// Appends one staged batch per entry of `rows` at the log's write offset.
fn stage_all(log: &StreamLog, rows: &[u32]) -> Vec<u64> {
    rows.iter()
        .map(|&n| {
            let base = log.write_offset();
            let got = log
                .append_staged(&ipc(base, n), n, base as i64 * 1000, None)
                .expect("append staged");
            assert_eq!(got, base);
            got
        })
        .collect()
}

#[test]
fn staged_frames_are_written_together_and_seen_only_after_the_flush() {
    let dir = tempfile::tempdir().expect("tempdir");
    let log = StreamLog::create(dir.path(), StreamLogOptions::default()).expect("create");
    append_all(&log, &[2]);
    let path = segment_path(dir.path(), 0);
    let written = file_len(&path);
    assert_eq!(stage_all(&log, &[1, 3, 1]), vec![2, 3, 6]);
    assert_eq!(log.write_offset(), 7, "offsets are assigned at once");
    assert_eq!(
        log.next_offset(),
        2,
        "readers still end before the staged frames"
    );
    assert_eq!(log.batches(0, u64::MAX).len(), 1);
    assert_eq!(
        file_len(&path),
        written,
        "no byte of a staged frame is written yet"
    );

    log.publish().expect("publish");
    assert_eq!(log.next_offset(), 7);
    assert_eq!(read_all(&log, 0), 7);
    assert_eq!(
        file_len(&path),
        log.segments()[0].bytes,
        "the flush wrote every staged frame"
    );
    // a plain append after staged frames writes them first, then itself
    stage_all(&log, &[2]);
    assert_eq!(log.append(&ipc(9, 1), 1, 9_000).expect("append"), 9);
    assert_eq!(read_all(&log, 0), 10);
}

#[test]
fn a_checkpoint_covers_staged_frames_only_once_they_are_on_disk() {
    let dir = tempfile::tempdir().expect("tempdir");
    let frame_len = (HEADER_LEN + ipc(0, 2).len()) as u64;
    // three frames per segment: staging crosses two rollovers
    let log = StreamLog::create(dir.path(), opts(frame_len * 3)).expect("create");
    stage_all(&log, &[2; 7]);
    let checkpoint = log.sync().expect("sync");
    assert_eq!(
        (checkpoint.segment_base, checkpoint.segment_len),
        (12, frame_len),
        "sync wrote the staged frames before taking the position"
    );
    // staged after the checkpoint and never flushed: a crash loses them (the WAL replays
    // them), and leaves no partial frame behind
    stage_all(&log, &[2; 2]);
    drop(log);
    let log = StreamLog::open(dir.path(), opts(frame_len * 3), &checkpoint).expect("open");
    assert_eq!(log.next_offset(), 14);
    assert_eq!(read_all(&log, 0), 14);
    assert_eq!(stage_all(&log, &[2]), vec![14]);
    log.publish().expect("publish");
    assert_eq!(read_all(&log, 0), 16);
}

#[test]
fn staging_is_bounded_and_large_frames_are_written_at_once() {
    let dir = tempfile::tempdir().expect("tempdir");
    let log = StreamLog::create(dir.path(), StreamLogOptions::default()).expect("create");
    let path = segment_path(dir.path(), 0);
    // a frame larger than the staging limit for one frame goes straight to the file
    let large = ipc(0, 2_000);
    assert!(large.len() > 16 << 10);
    log.append_staged(&large, 2_000, 0, None).expect("stage");
    assert_eq!(file_len(&path), (HEADER_LEN + large.len()) as u64);
    assert_eq!(log.next_offset(), 0, "written, not yet published");
    // small frames past the staging limit are written before more are staged
    let small = (HEADER_LEN + ipc(2_000, 100).len()) as u64;
    let mut staged = 0u64;
    while staged <= sluice_storage::stream_log::STAGE_BYTES as u64 {
        stage_all(&log, &[100]);
        staged += small;
    }
    assert!(
        file_len(&path) > (HEADER_LEN + large.len()) as u64,
        "staging stopped at its limit"
    );
    log.publish().expect("publish");
    assert_eq!(read_all(&log, 0), log.write_offset());
}

#[test]
fn a_failed_flush_poisons_the_log() {
    let parent = tempfile::tempdir().expect("tempdir");
    let dir = parent.path().join("stream");
    let log = StreamLog::create(&dir, opts(1)).expect("create");
    append_all(&log, &[1]);
    stage_all(&log, &[1]); // rolls to segment 1, in the directory
    fs::remove_dir_all(&dir).expect("remove");
    // the staged frame's file is unlinked but open: the flush still writes; the next
    // rollover cannot create its file, and the log refuses everything after
    log.publish().expect("publish to the open file");
    let err = log
        .append_staged(&ipc(2, 1), 1, 0, None)
        .expect_err("rollover fails");
    assert!(matches!(err, Error::Io { .. }), "{err}");
    assert!(matches!(log.publish(), Err(Error::Poisoned(_))));
    assert!(matches!(
        log.append_staged(&ipc(2, 1), 1, 0, None),
        Err(Error::Poisoned(_))
    ));
    assert!(matches!(log.sync(), Err(Error::Poisoned(_))));
    assert_eq!(log.next_offset(), 2);
}
