use std::fs;
use std::io::Write;

use raft::eraftpb::{Entry, HardState, SnapshotMetadata};

use super::*;

fn entry(index: u64, term: u64) -> Entry {
    Entry {
        index,
        term,
        data: format!("command {index}@{term}").into_bytes().into(),
        ..Default::default()
    }
}

fn hs(term: u64, commit: u64) -> HardState {
    HardState {
        term,
        vote: 1,
        commit,
        ..Default::default()
    }
}

fn meta(index: u64, term: u64) -> SnapshotMetadata {
    let mut m = SnapshotMetadata {
        index,
        term,
        ..Default::default()
    };
    m.mut_conf_state().voters = vec![1];
    m
}

fn segment_files(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<_> = fs::read_dir(dir)
        .unwrap()
        .map(|d| d.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "wal"))
        .collect();
    files.sort();
    files
}

fn indexes(entries: &[Entry]) -> Vec<u64> {
    entries.iter().map(|e| e.index).collect()
}

/// A WAL in `dir` holding entries `1..=last` (term 1), each appended with a HardState and
/// synced one by one, like group commits; any zero-fill in progress has finished.
fn wal_of_small_appends(dir: &Path, segment_bytes: u64, last: u64) -> Wal {
    let (mut wal, _) = Wal::open(dir, segment_bytes).unwrap();
    wal.save_meta(meta(0, 0)).unwrap();
    for i in 1..=last {
        wal.append(&[entry(i, 1)], Some(&hs(1, i - 1))).unwrap();
        wal.sync().unwrap();
    }
    wal.finish_zeroing().unwrap();
    wal
}

#[test]
fn round_trip_across_segments() {
    let dir = tempfile::tempdir().unwrap();
    {
        let (mut wal, rec) = Wal::open(dir.path(), 256).unwrap();
        assert!(rec.meta.is_none() && rec.entries.is_empty());
        wal.save_meta(meta(0, 0)).unwrap();
        for i in 1..=40 {
            wal.append(&[entry(i, 1)], Some(&hs(1, i - 1))).unwrap();
            wal.sync().unwrap();
        }
        assert!(wal.segment_count() > 3, "small segments should roll");
    }
    let (_wal, rec) = Wal::open(dir.path(), 256).unwrap();
    assert_eq!(rec.meta, Some(meta(0, 0)));
    assert_eq!(
        rec.entries,
        (1..=40).map(|i| entry(i, 1)).collect::<Vec<_>>()
    );
    assert_eq!(rec.hard_state, hs(1, 39));
    // Every segment is named by the first index it holds.
    for file in segment_files(dir.path()).iter().skip(1) {
        let first: u64 = file.file_stem().unwrap().to_str().unwrap().parse().unwrap();
        let data = fs::read(file).unwrap();
        let record::Decoded::Record { size, .. } = record::decode(&data) else {
            panic!("segment must start with a HardState record");
        };
        let record::Decoded::Record { payload, .. } = record::decode(&data[size..]) else {
            panic!("expected an entry after the HardState");
        };
        assert_eq!(Entry::parse_from_bytes(payload).unwrap().index, first);
    }
}

#[test]
fn later_entries_overwrite_conflicting_suffix() {
    let dir = tempfile::tempdir().unwrap();
    {
        let (mut wal, _) = Wal::open(dir.path(), 1 << 20).unwrap();
        wal.save_meta(meta(0, 0)).unwrap();
        wal.append(&(1..=10).map(|i| entry(i, 1)).collect::<Vec<_>>(), None)
            .unwrap();
        wal.append(&[entry(6, 2), entry(7, 2)], Some(&hs(2, 5)))
            .unwrap();
        wal.sync().unwrap();
    }
    let (_wal, rec) = Wal::open(dir.path(), 1 << 20).unwrap();
    assert_eq!(indexes(&rec.entries), (1..=7).collect::<Vec<_>>());
    assert_eq!(rec.entries[5], entry(6, 2));
    assert_eq!(rec.entries[6], entry(7, 2));
}

#[test]
fn torn_tail_is_truncated_and_log_stays_appendable() {
    let dir = tempfile::tempdir().unwrap();
    let valid = {
        let (mut wal, _) = Wal::open(dir.path(), 1 << 20).unwrap();
        wal.save_meta(meta(0, 0)).unwrap();
        for i in 1..=5 {
            wal.append(&[entry(i, 1)], None).unwrap();
        }
        wal.sync().unwrap();
        wal.active_len
    };
    let file = segment_files(dir.path()).pop().unwrap();
    // Cut the last record short, as a crash mid-write would.
    fs::OpenOptions::new()
        .write(true)
        .open(&file)
        .unwrap()
        .set_len(valid - 3)
        .unwrap();
    {
        let (mut wal, rec) = Wal::open(dir.path(), 1 << 20).unwrap();
        assert_eq!(indexes(&rec.entries), vec![1, 2, 3, 4]);
        assert!(
            fs::metadata(&file).unwrap().len() < valid - 3,
            "tail truncated"
        );
        wal.append(&[entry(5, 2)], None).unwrap();
        wal.sync().unwrap();
    }
    // A zero-filled tail (file extended but data never written) is not an entry.
    fs::OpenOptions::new()
        .append(true)
        .open(&file)
        .unwrap()
        .write_all(&[0u8; 100])
        .unwrap();
    let (_wal, rec) = Wal::open(dir.path(), 1 << 20).unwrap();
    assert_eq!(indexes(&rec.entries), vec![1, 2, 3, 4, 5]);
    assert_eq!(rec.entries[4].term, 2);
}

#[test]
fn small_appends_land_in_preallocated_zeros_and_replay_ignores_them() {
    let dir = tempfile::tempdir().unwrap();
    let segment = 64 << 20;
    let valid = {
        let wal = wal_of_small_appends(dir.path(), segment, 50);
        assert!(
            wal.zeroed >= ZERO_CHUNK,
            "zero-filled ahead: {}",
            wal.zeroed
        );
        wal.active_len
    };
    let file = segment_files(dir.path()).pop().unwrap();
    let len = fs::metadata(&file).unwrap().len();
    assert!(len >= ZERO_CHUNK && len < segment, "file length {len}");
    assert!(fs::read(&file).unwrap()[valid as usize..]
        .iter()
        .all(|b| *b == 0));
    // Reopening keeps the preallocation and appends where the records end.
    {
        let (mut wal, rec) = Wal::open(dir.path(), segment).unwrap();
        assert_eq!(indexes(&rec.entries), (1..=50).collect::<Vec<_>>());
        assert_eq!(rec.hard_state, hs(1, 49));
        assert_eq!(wal.active_len, valid);
        assert_eq!(fs::metadata(&file).unwrap().len(), len, "not truncated");
        wal.append(&[entry(51, 2)], None).unwrap();
        wal.sync().unwrap();
    }
    let (_wal, rec) = Wal::open(dir.path(), segment).unwrap();
    assert_eq!(indexes(&rec.entries), (1..=51).collect::<Vec<_>>());
    assert_eq!(rec.entries[50].term, 2);
}

#[test]
fn bulk_appends_and_their_hard_states_do_not_zero_fill() {
    let dir = tempfile::tempdir().unwrap();
    let (mut wal, _) = Wal::open(dir.path(), 64 << 20).unwrap();
    wal.save_meta(meta(0, 0)).unwrap();
    let big = |index: u64| Entry {
        data: vec![7u8; ZERO_AHEAD_MAX_APPEND].into(),
        ..entry(index, 1)
    };
    for i in 1..=3 {
        wal.append(&[big(i)], None).unwrap();
        // the commit index written after each batch
        wal.append(&[], Some(&hs(1, i))).unwrap();
        wal.sync().unwrap();
        assert!(wal.zeroing.is_none(), "no fill after a bulk append");
        assert_eq!(wal.zeroed, wal.active_len, "the file just grows");
    }
    // a small append of entries is a group commit: it starts the fill
    wal.append(&[entry(4, 1)], Some(&hs(1, 3))).unwrap();
    wal.finish_zeroing().unwrap();
    assert!(wal.zeroed > wal.active_len);
}

/// A writer that catches up with a fill in flight stops it after its current piece instead of
/// waiting for the whole chunk: whatever the fill got to, the writer's records follow it with
/// no hole and no zeros written over them, and replay finds every entry.
#[test]
fn a_writer_catching_up_with_the_fill_stops_it_and_loses_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let segment = 64 << 20;
    // just under the bulk threshold: each append still starts a fill, and three of them
    // overtake the gap the first fill leaves
    let sized = |index: u64| Entry {
        data: vec![index as u8; ZERO_AHEAD_MAX_APPEND - 1024].into(),
        ..entry(index, 1)
    };
    {
        let (mut wal, _) = Wal::open(dir.path(), segment).unwrap();
        wal.save_meta(meta(0, 0)).unwrap();
        for i in 1..=40 {
            wal.append(&[sized(i)], Some(&hs(1, i - 1))).unwrap();
            wal.sync().unwrap();
            assert!(wal.zeroed >= wal.active_len, "[0, zeroed) exists on disk");
            let len = fs::metadata(segment_files(dir.path()).pop().unwrap())
                .unwrap()
                .len();
            assert!(len >= wal.active_len);
        }
        wal.stop_zeroing().unwrap();
        assert!(wal.zeroed >= wal.active_len);
    }
    let (_wal, rec) = Wal::open(dir.path(), segment).unwrap();
    assert_eq!(indexes(&rec.entries), (1..=40).collect::<Vec<_>>());
    for e in &rec.entries {
        assert!(
            e.data.iter().all(|b| *b == e.index as u8),
            "entry {} intact",
            e.index
        );
    }
    assert_eq!(rec.hard_state, hs(1, 39));
}

#[test]
fn sealed_segment_ends_at_its_last_record_when_segment_size_shrinks() {
    let dir = tempfile::tempdir().unwrap();
    {
        let wal = wal_of_small_appends(dir.path(), 64 << 20, 5);
        assert!(wal.zeroed > wal.active_len, "preallocated past the records");
    }
    // Restart with segments smaller than what the old one already holds: the next append
    // seals it, and the sealed segment must not keep the zeros.
    {
        let (mut wal, _) = Wal::open(dir.path(), 64).unwrap();
        for i in 6..=8 {
            wal.append(&[entry(i, 1)], Some(&hs(1, i - 1))).unwrap();
            wal.sync().unwrap();
        }
        assert!(wal.segment_count() >= 2);
    }
    let first = segment_files(dir.path()).remove(0);
    let data = fs::read(&first).unwrap();
    assert_ne!(
        *data.last().unwrap(),
        0,
        "sealed segment ends with a record"
    );
    let (_wal, rec) = Wal::open(dir.path(), 64).unwrap();
    assert_eq!(indexes(&rec.entries), (1..=8).collect::<Vec<_>>());
    assert_eq!(rec.hard_state, hs(1, 7));
}

#[test]
fn record_partly_written_into_preallocated_zeros_is_torn() {
    let dir = tempfile::tempdir().unwrap();
    let segment = 64 << 20;
    let last = {
        let (mut wal, _) = Wal::open(dir.path(), segment).unwrap();
        wal.save_meta(meta(0, 0)).unwrap();
        let mut last = 0;
        for i in 1..=5 {
            last = wal.active_len;
            wal.append(&[entry(i, 1)], None).unwrap();
        }
        wal.sync().unwrap();
        last as usize
    };
    let file = segment_files(dir.path()).pop().unwrap();
    let mut data = fs::read(&file).unwrap();
    // The header reached the disk, the payload did not.
    for b in &mut data[last + record::HEADER_LEN..last + record::HEADER_LEN + 4] {
        *b = 0;
    }
    fs::write(&file, &data).unwrap();
    let (_wal, rec) = Wal::open(dir.path(), segment).unwrap();
    assert_eq!(indexes(&rec.entries), vec![1, 2, 3, 4]);
    assert_eq!(fs::metadata(&file).unwrap().len(), last as u64);
}

#[test]
fn write_whose_later_pages_landed_past_the_preallocation_is_torn() {
    let dir = tempfile::tempdir().unwrap();
    let segment = 64 << 20;
    let valid = { wal_of_small_appends(dir.path(), segment, 3).active_len };
    let file = segment_files(dir.path()).pop().unwrap();
    // The start of a large append never reached the disk; its last bytes, beyond the zeros,
    // did.
    let mut data = fs::read(&file).unwrap();
    data.extend_from_slice(b"\x07\x07\x07");
    fs::write(&file, &data).unwrap();
    let (mut wal, rec) = Wal::open(dir.path(), segment).unwrap();
    assert_eq!(indexes(&rec.entries), vec![1, 2, 3]);
    assert_eq!(
        fs::metadata(&file).unwrap().len(),
        valid,
        "cut at the last record"
    );
    wal.append(&[entry(4, 1)], None).unwrap();
    wal.sync().unwrap();
    drop(wal);
    let (_wal, rec) = Wal::open(dir.path(), segment).unwrap();
    assert_eq!(indexes(&rec.entries), vec![1, 2, 3, 4]);
}

#[test]
fn corrupt_record_is_reported_with_file_and_offset() {
    let dir = tempfile::tempdir().unwrap();
    let mut offsets = Vec::new();
    {
        let (mut wal, _) = Wal::open(dir.path(), 1 << 20).unwrap();
        wal.save_meta(meta(0, 0)).unwrap();
        for i in 1..=5 {
            offsets.push(wal.active_len);
            wal.append(&[entry(i, 1)], None).unwrap();
        }
        wal.sync().unwrap();
    }
    let file = segment_files(dir.path()).pop().unwrap();
    let mut data = fs::read(&file).unwrap();
    let victim = offsets[2] as usize; // the record of entry 3
    data[victim + record::HEADER_LEN + 2] ^= 0xff;
    fs::write(&file, &data).unwrap();

    match Wal::open(dir.path(), 1 << 20) {
        Err(Error::Corrupt {
            file: f, offset, ..
        }) => {
            assert_eq!(f, file);
            assert_eq!(offset, victim as u64);
        }
        other => panic!("expected corruption, got {other:?}"),
    }
    // Refusing to start must not have "repaired" anything.
    assert_eq!(fs::read(&file).unwrap(), data);
}

#[test]
fn incomplete_record_in_sealed_segment_is_corruption() {
    let dir = tempfile::tempdir().unwrap();
    {
        let (mut wal, _) = Wal::open(dir.path(), 128).unwrap();
        wal.save_meta(meta(0, 0)).unwrap();
        for i in 1..=20 {
            wal.append(&[entry(i, 1)], None).unwrap();
        }
        wal.sync().unwrap();
    }
    let first = segment_files(dir.path()).remove(0);
    let len = fs::metadata(&first).unwrap().len();
    fs::OpenOptions::new()
        .write(true)
        .open(&first)
        .unwrap()
        .set_len(len - 1)
        .unwrap();
    assert!(matches!(
        Wal::open(dir.path(), 128),
        Err(Error::Corrupt { file, .. }) if file == first
    ));
}

#[test]
fn compaction_deletes_covered_segments_and_survives_reopen() {
    let dir = tempfile::tempdir().unwrap();
    {
        let (mut wal, _) = Wal::open(dir.path(), 200).unwrap();
        wal.save_meta(meta(0, 0)).unwrap();
        for i in 1..=100 {
            wal.append(&[entry(i, 3)], Some(&hs(3, i))).unwrap();
        }
        wal.sync().unwrap();
        let before = segment_files(dir.path());
        let deleted = wal.compact(meta(60, 3)).unwrap();
        let after = segment_files(dir.path());
        assert!(deleted > 0);
        assert_eq!(after.len(), before.len() - deleted);
        assert_eq!(wal.segment_count(), after.len());
        // The oldest remaining segment still holds an entry above the compaction point, and
        // every deleted one held only entries at or below it.
        let oldest: u64 = after[0]
            .file_stem()
            .unwrap()
            .to_str()
            .unwrap()
            .parse()
            .unwrap();
        assert!(
            oldest <= 61,
            "segment holding 61 must survive, oldest is {oldest}"
        );
        assert!(oldest > 1);
    }
    let (mut wal, rec) = Wal::open(dir.path(), 200).unwrap();
    assert_eq!(rec.meta, Some(meta(60, 3)));
    assert_eq!(indexes(&rec.entries), (61..=100).collect::<Vec<_>>());
    assert_eq!(rec.hard_state, hs(3, 100));

    // Compacting everything keeps the newest segment and the HardState.
    wal.compact(meta(100, 3)).unwrap();
    assert_eq!(wal.segment_count(), 1);
    drop(wal);
    let (_wal, rec) = Wal::open(dir.path(), 200).unwrap();
    assert!(rec.entries.is_empty());
    assert_eq!(rec.meta.unwrap().index, 100);
    assert_eq!(rec.hard_state, hs(3, 100));
}

/// A compaction that deletes no segment leaves the metadata file as it was (no write, no
/// fsync on the Raft thread); a restart replays from the file's older point, every entry
/// after it still there. The compaction that deletes a segment makes its point durable first.
#[test]
fn a_compaction_deleting_nothing_moves_the_point_in_memory_and_replay_starts_from_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let meta_path = dir.path().join(META_FILE);
    {
        let mut wal = wal_of_small_appends(dir.path(), 1 << 20, 10);
        let written = fs::read(&meta_path).unwrap();
        assert_eq!(wal.compact(meta(6, 1)).unwrap(), 0);
        assert_eq!(wal.meta().index, 6);
        assert_eq!(
            fs::read(&meta_path).unwrap(),
            written,
            "the file was rewritten"
        );
        // a ConfState saved later carries the point compacted in memory
        let mut with_voters = wal.meta().clone();
        with_voters.mut_conf_state().voters = vec![1, 2];
        wal.save_meta(with_voters).unwrap();
    }
    let (_, rec) = Wal::open(dir.path(), 1 << 20).unwrap();
    let recovered = rec.meta.unwrap();
    assert_eq!(
        (recovered.index, recovered.get_conf_state().voters.clone()),
        (6, vec![1, 2])
    );
    assert_eq!(indexes(&rec.entries), (7..=10).collect::<Vec<_>>());

    let dir = tempfile::tempdir().unwrap();
    {
        let mut wal = wal_of_small_appends(dir.path(), 1 << 20, 10);
        wal.compact(meta(4, 1)).unwrap();
        wal.compact(meta(8, 1)).unwrap();
    }
    // restarted: the file's point is still 0, entries 1..=10 all replay
    let (_wal, rec) = Wal::open(dir.path(), 1 << 20).unwrap();
    assert_eq!(rec.meta.unwrap().index, 0);
    assert_eq!(indexes(&rec.entries), (1..=10).collect::<Vec<_>>());

    // small segments: the compaction that deletes one writes its point first
    let dir = tempfile::tempdir().unwrap();
    {
        let mut wal = wal_of_small_appends(dir.path(), 200, 40);
        assert!(wal.compact(meta(30, 1)).unwrap() > 0);
    }
    let (_wal, rec) = Wal::open(dir.path(), 200).unwrap();
    assert_eq!(rec.meta.unwrap().index, 30);
    assert_eq!(indexes(&rec.entries), (31..=40).collect::<Vec<_>>());
}

#[test]
fn corrupt_metadata_refuses_to_open() {
    let dir = tempfile::tempdir().unwrap();
    {
        let (mut wal, _) = Wal::open(dir.path(), 1 << 20).unwrap();
        wal.save_meta(meta(7, 2)).unwrap();
    }
    let path = dir.path().join(META_FILE);
    let mut data = fs::read(&path).unwrap();
    let last = data.len() - 1;
    data[last] ^= 1;
    fs::write(&path, data).unwrap();
    assert!(matches!(
        Wal::open(dir.path(), 1 << 20),
        Err(Error::Corrupt { .. })
    ));
}

/// Found by `tests/fuzz.rs`: a newest segment cut short below the compaction point (a torn
/// record there) recovers as "nothing after the compaction point"; the append that follows at
/// `compacted + 1` must not read as a gap on the next open.
#[test]
fn log_cut_below_the_compaction_point_takes_appends_and_reopens() {
    let dir = tempfile::tempdir().unwrap();
    let cut = {
        // Small segments: no zero-fill, so the file ends at its last record.
        let (mut wal, _) = Wal::open(dir.path(), 4096).unwrap();
        wal.save_meta(meta(0, 0)).unwrap();
        for i in 1..=5 {
            wal.append(&[entry(i, 1)], Some(&hs(1, i))).unwrap();
        }
        wal.sync().unwrap();
        let cut = fs::metadata(&segment_files(dir.path())[0]).unwrap().len();
        for i in 6..=8 {
            wal.append(&[entry(i, 1)], Some(&hs(1, i))).unwrap();
        }
        wal.sync().unwrap();
        // the point durable at 8 (a compaction that deleted nothing keeps it in memory only)
        wal.save_meta(meta(8, 1)).unwrap();
        cut
    };
    let file = OpenOptions::new()
        .write(true)
        .open(&segment_files(dir.path())[0])
        .unwrap();
    file.set_len(cut + 3).unwrap(); // entry 6's record, torn

    let (mut wal, rec) = Wal::open(dir.path(), 4096).unwrap();
    assert!(rec.entries.is_empty());
    wal.append(&[entry(9, 2)], Some(&hs(2, 8))).unwrap();
    wal.sync().unwrap();
    drop(wal);
    let (_wal, rec) = Wal::open(dir.path(), 4096).unwrap();
    assert_eq!(indexes(&rec.entries), vec![9]);
}
