//! `LogStore`: raft-rs's [`Storage`] over the [`Wal`]. It keeps the uncompacted log in memory
//! (like raft-rs's `MemStorage`) and writes every change through to the WAL first.
//!
//! Why not `MemStorage` itself: after `MemStorage::compact` the term of `first_index() - 1` is
//! lost (it only remembers the term of an *installed snapshot*), and Raft needs that term to
//! match appends after compaction. Here the compaction point `(index, term)` is kept next to the
//! entries and is durable in the WAL's metadata file.
//!
//! Invariants: `entries` is contiguous and starts at `compacted.index + 1`; an in-memory change
//! happens only after the WAL write succeeded, except a raised commit index, which the next
//! append of entries writes (see [`LogStore::set_commit`]); `hard_state.commit <= last_index()`.
//!
//! The entries a compaction discards (a checkpoint interval's worth: ~20,000 at 64 connections)
//! are freed on a thread of their own, [`DropLater`], not on the Raft thread, which would spend
//! milliseconds on their buffers' frees between two Readies; at most two such batches wait
//! there, and a third is freed in place.

use raft::eraftpb::{ConfState, Entry, HardState, Snapshot, SnapshotMetadata};
use raft::{GetEntriesContext, RaftState, Storage, StorageError};

use crate::error::{Error, Result};
use crate::wal::Wal;

/// The node's Raft log: in-memory view plus the durable WAL behind it.
pub(crate) struct LogStore {
    wal: Wal,
    entries: Vec<Entry>,
    hard_state: HardState,
    /// `hard_state.commit` was raised by [`LogStore::set_commit`] and not written yet: the
    /// next append of entries carries it.
    commit_unwritten: bool,
    conf_state: ConfState,
    /// Last compacted entry: everything at or below `index` is gone, but its `term` is kept.
    compacted: (u64, u64),
    /// The last snapshot built for followers (served while it still covers the compaction
    /// point).
    snapshot: Option<Snapshot>,
    /// Raft asked for a snapshot we did not have; the node task builds one.
    snapshot_wanted: std::cell::Cell<bool>,
    /// Frees compacted entries off this thread.
    compacted_entries: DropLater<Vec<Entry>>,
}

impl LogStore {
    /// Opens and recovers the log in `dir`. A brand-new directory is bootstrapped with
    /// `ConfState { voters }`. `applied` is the state machine's recovered index: applied implies
    /// committed, so the commit index is raised to it if the log's is lower (the commit index
    /// is written without fsync and may lag the state machine's own durable state). If the
    /// state machine is past the end of the log at `snapshot_point` — a snapshot was restored
    /// but the node stopped before the log was reset to it — the reset is finished here.
    pub(crate) fn open(
        dir: &std::path::Path,
        segment_bytes: u64,
        voters: &[u64],
        applied: u64,
        snapshot_point: Option<(u64, u64)>,
    ) -> Result<LogStore> {
        let (mut wal, recovered) = Wal::open(dir, segment_bytes)?;
        let meta = match recovered.meta {
            Some(meta) => meta,
            // A new log over a state that did not come from it: a restored backup. Its
            // history is not the cluster's; started with other voters that are empty, they
            // could elect a leader without it and overwrite it.
            None if snapshot_point.is_some_and(|(index, _)| index > 0) && voters.len() > 1 => {
                return Err(Error::Config(format!(
                    "this data directory was restored from a backup (index {}) and has no Raft \
                     log yet: start it alone (no --peers, or --peers with only itself) and add \
                     the other members with ALTER CLUSTER ADD NODE",
                    snapshot_point.map_or(0, |(i, _)| i)
                )));
            }
            None => {
                let mut meta = SnapshotMetadata::default();
                meta.mut_conf_state().voters = voters.to_vec();
                wal.save_meta(meta.clone())?;
                meta
            }
        };
        let mut store = LogStore {
            wal,
            entries: recovered.entries,
            hard_state: recovered.hard_state,
            commit_unwritten: false,
            conf_state: meta.get_conf_state().clone(),
            compacted: (meta.index, meta.term),
            snapshot: None,
            snapshot_wanted: std::cell::Cell::new(false),
            compacted_entries: DropLater::new("sluice-log-free"),
        };
        if let Some((index, term)) = snapshot_point {
            if index == applied && index > store.last_index() {
                tracing::warn!(index, term, "finishing an interrupted snapshot install");
                let mut meta = meta.clone();
                meta.index = index;
                meta.term = term;
                store.install_snapshot(&meta)?;
            }
        }
        let last = store.last_index();
        if applied < store.compacted.0 {
            return Err(Error::Config(format!(
                "state machine recovered to index {applied}, but the log is compacted up to {}: \
                 the entries needed to catch it up are gone",
                store.compacted.0
            )));
        }
        if applied > last {
            return Err(Error::Config(format!(
                "state machine recovered to index {applied}, beyond the end of the Raft log \
                 ({last}): the log has lost acknowledged entries"
            )));
        }
        let commit = store.hard_state.commit.max(applied).max(store.compacted.0);
        if commit > last {
            return Err(Error::Config(format!(
                "recovered commit index {commit} is beyond the end of the Raft log ({last})"
            )));
        }
        store.hard_state.commit = commit;
        store.hard_state.term = store.hard_state.term.max(store.compacted.1);
        // The metadata file's compaction point may be older than the last compaction (see
        // `Wal::compact`): drop what the state machine's checkpoint covers, as that compaction
        // did, so a restarted node holds no more of the log in memory than before it stopped.
        store.compact(applied)?;
        Ok(store)
    }

    /// Writes entries and the HardState to the WAL, then to memory. Not durable until
    /// [`LogStore::sync`]. Returns the bytes written.
    pub(crate) fn append(&mut self, entries: &[Entry], hs: Option<&HardState>) -> Result<u64> {
        if let Some(first) = entries.first() {
            if first.index <= self.compacted.0 || first.index > self.last_index() + 1 {
                return Err(Error::Config(format!(
                    "append at index {} outside the log ({}..={})",
                    first.index,
                    self.compacted.0 + 1,
                    self.last_index() + 1
                )));
            }
        }
        // Raft's HardState keeps a commit index raised since (never lowered); without one,
        // entries carry a commit index not written yet
        let hs = hs.map(|hs| HardState {
            commit: hs.commit.max(self.hard_state.commit),
            ..hs.clone()
        });
        let carry_commit = hs.is_none() && self.commit_unwritten && !entries.is_empty();
        let written = match &hs {
            Some(hs) => self.wal.append(entries, Some(hs))?,
            None if carry_commit => self.wal.append(entries, Some(&self.hard_state))?,
            None => self.wal.append(entries, None)?,
        };
        if let Some(first) = entries.first() {
            self.entries
                .truncate((first.index - self.compacted.0 - 1) as usize);
            self.entries.extend_from_slice(entries);
        }
        if let Some(hs) = hs {
            self.hard_state = hs;
            self.commit_unwritten = false;
        } else if carry_commit {
            self.commit_unwritten = false;
        }
        Ok(written)
    }

    /// fsyncs everything appended so far.
    pub(crate) fn sync(&mut self) -> Result<()> {
        self.wal.sync()
    }

    /// Records a new commit index, in memory: the next append of entries writes it (in the
    /// same write), never fsynced on its own. Nothing depends on it being durable: recovery
    /// raises the commit index to the state machine's applied index, and Raft allows a
    /// restarted node a commit index behind the one it had (the leader sends it again).
    pub(crate) fn set_commit(&mut self, commit: u64) {
        if commit > self.hard_state.commit {
            self.hard_state.commit = commit;
            self.commit_unwritten = true;
        }
    }

    /// Persists a ConfState produced by applying a configuration change.
    pub(crate) fn set_conf_state(&mut self, cs: ConfState) -> Result<()> {
        let mut meta = self.wal.meta().clone();
        meta.set_conf_state(cs.clone());
        self.wal.save_meta(meta)?;
        self.conf_state = cs;
        Ok(())
    }

    /// Discards entries up to and including `index` (covered by a state-machine checkpoint),
    /// keeping its term as the compaction point. Returns the number of WAL segments deleted.
    pub(crate) fn compact(&mut self, index: u64) -> Result<usize> {
        if index <= self.compacted.0 {
            return Ok(0);
        }
        let term = self.term(index).map_err(|_| {
            Error::Config(format!(
                "cannot compact to {index}: the log ends at {}",
                self.last_index()
            ))
        })?;
        let mut meta = SnapshotMetadata {
            index,
            term,
            ..Default::default()
        };
        meta.set_conf_state(self.conf_state.clone());
        let deleted = self.wal.compact(meta)?;
        let rest = self.entries.split_off((index - self.compacted.0) as usize);
        self.compacted_entries
            .drop_later(std::mem::replace(&mut self.entries, rest));
        self.compacted = (index, term);
        Ok(deleted)
    }

    /// Resets the log to a snapshot's point: every entry goes, the compaction point becomes
    /// (index, term) and the ConfState the snapshot's. The state machine must already hold the
    /// snapshot durably.
    pub(crate) fn install_snapshot(&mut self, meta: &SnapshotMetadata) -> Result<()> {
        let mut hs = self.hard_state.clone();
        hs.commit = hs.commit.max(meta.index);
        hs.term = hs.term.max(meta.term);
        self.wal.reset(meta.clone(), &hs)?;
        self.entries.clear();
        self.compacted = (meta.index, meta.term);
        self.conf_state = meta.get_conf_state().clone();
        self.hard_state = hs;
        self.snapshot = None;
        Ok(())
    }

    /// Keeps a snapshot built for followers.
    pub(crate) fn set_snapshot(&mut self, snap: Snapshot) {
        self.snapshot = Some(snap);
    }

    /// Whether raft asked for a snapshot since the last call.
    pub(crate) fn take_snapshot_wanted(&self) -> bool {
        self.snapshot_wanted.replace(false)
    }

    pub(crate) fn last_index(&self) -> u64 {
        self.entries.last().map_or(self.compacted.0, |e| e.index)
    }

    fn first(&self) -> u64 {
        self.compacted.0 + 1
    }
}

/// Drops values on a thread of its own, so that freeing a large one (a compacted stretch of
/// the log) does not hold up the caller. Bounded: one value waits while another is being
/// dropped; past that, or if the thread could not be started, the caller drops the value
/// itself. The thread ends when the `DropLater` is dropped, after what it holds.
struct DropLater<T: Send + 'static> {
    queue: Option<std::sync::mpsc::SyncSender<T>>,
}

impl<T: Send + 'static> DropLater<T> {
    fn new(name: &str) -> DropLater<T> {
        let (queue, values) = std::sync::mpsc::sync_channel::<T>(1);
        let spawned = std::thread::Builder::new()
            .name(name.into())
            .spawn(move || values.into_iter().for_each(drop));
        match spawned {
            Ok(_) => DropLater { queue: Some(queue) },
            Err(e) => {
                tracing::warn!(error = %e, thread = name, "could not start a thread: values are freed in place");
                DropLater { queue: None }
            }
        }
    }

    fn drop_later(&self, value: T) {
        if let Some(queue) = &self.queue {
            // full or gone: the error holds the value, and dropping it here frees it in place
            let _ = queue.try_send(value);
        }
    }
}

impl Storage for LogStore {
    fn initial_state(&self) -> raft::Result<RaftState> {
        Ok(RaftState::new(
            self.hard_state.clone(),
            self.conf_state.clone(),
        ))
    }

    fn entries(
        &self,
        low: u64,
        high: u64,
        max_size: impl Into<Option<u64>>,
        _context: GetEntriesContext,
    ) -> raft::Result<Vec<Entry>> {
        if low < self.first() {
            return Err(raft::Error::Store(StorageError::Compacted));
        }
        if high > self.last_index() + 1 || low > high {
            return Err(raft::Error::Store(StorageError::Unavailable));
        }
        let offset = self.first();
        let mut entries = self.entries[(low - offset) as usize..(high - offset) as usize].to_vec();
        raft::util::limit_size(&mut entries, max_size.into());
        Ok(entries)
    }

    fn term(&self, idx: u64) -> raft::Result<u64> {
        if idx == self.compacted.0 {
            return Ok(self.compacted.1);
        }
        if idx < self.compacted.0 {
            return Err(raft::Error::Store(StorageError::Compacted));
        }
        match self.entries.get((idx - self.first()) as usize) {
            Some(e) => Ok(e.term),
            None => Err(raft::Error::Store(StorageError::Unavailable)),
        }
    }

    fn first_index(&self) -> raft::Result<u64> {
        Ok(self.first())
    }

    fn last_index(&self) -> raft::Result<u64> {
        Ok(LogStore::last_index(self))
    }

    /// The snapshot last built, if it still reaches the compaction point (so the log after it
    /// is all here). Otherwise the node task is asked to build one, and raft tries again
    /// later.
    fn snapshot(&self, request_index: u64, _to: u64) -> raft::Result<Snapshot> {
        if let Some(s) = &self.snapshot {
            let index = s.get_metadata().index;
            if index >= self.compacted.0 && index >= request_index {
                return Ok(s.clone());
            }
        }
        self.snapshot_wanted.set(true);
        Err(raft::Error::Store(
            StorageError::SnapshotTemporarilyUnavailable,
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(index: u64, term: u64) -> Entry {
        Entry {
            index,
            term,
            data: vec![index as u8].into(),
            ..Default::default()
        }
    }

    /// Records, when dropped, the thread it was dropped on; with a gate, first waits for it.
    struct Traced {
        dropped_on: std::sync::mpsc::Sender<Option<String>>,
        gate: Option<std::sync::mpsc::Receiver<()>>,
    }

    impl Drop for Traced {
        fn drop(&mut self) {
            if let Some(gate) = &self.gate {
                let _ = gate.recv();
            }
            let name = std::thread::current().name().map(String::from);
            let _ = self.dropped_on.send(name);
        }
    }

    /// The compaction's values are freed on the dropper's thread, not the caller's; while
    /// that thread is busy one more waits, and a third is freed by the caller: at most two
    /// are ever held.
    #[test]
    fn values_are_dropped_on_their_own_thread_and_at_most_two_wait() {
        let (dropped_on, drops) = std::sync::mpsc::channel();
        let later = DropLater::new("test-drop-later");
        let caller = std::thread::current().name().map(String::from);
        later.drop_later(Traced {
            dropped_on: dropped_on.clone(),
            gate: None,
        });
        let on = drops.recv().unwrap();
        assert_eq!(on.as_deref(), Some("test-drop-later"));

        // a value whose drop blocks until released, then one that waits behind it
        let (release, gate) = std::sync::mpsc::channel();
        later.drop_later(Traced {
            dropped_on: dropped_on.clone(),
            gate: Some(gate),
        });
        let mut queued = false;
        for _ in 0..1000 {
            // the thread may not have taken the blocking value yet: until it has, the
            // queue's one place is taken and this value is freed here
            let (tx, rx) = std::sync::mpsc::channel();
            later.drop_later(Traced {
                dropped_on: tx,
                gate: None,
            });
            match rx.try_recv() {
                Ok(on) => assert_eq!(on, caller, "a value that found the queue full"),
                Err(_) => {
                    queued = true;
                    break;
                }
            }
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        assert!(
            queued,
            "the thread took the blocking value and one more waits"
        );
        // the queue is full and the thread busy: the next is freed in place, at once
        later.drop_later(Traced {
            dropped_on: dropped_on.clone(),
            gate: None,
        });
        assert_eq!(drops.try_recv().unwrap(), caller);
        release.send(()).unwrap();
        assert_eq!(drops.recv().unwrap().as_deref(), Some("test-drop-later"));
        // dropping the DropLater ends its thread after what it holds
        drop(later);
        drop(dropped_on);
        assert!(drops.recv().is_err());
    }

    #[test]
    fn term_of_compaction_point_survives_compaction_and_reopen() {
        let dir = tempfile::tempdir().unwrap();
        {
            let mut store = LogStore::open(dir.path(), 1 << 20, &[1], 0, None).unwrap();
            let ents: Vec<_> = (1..=10).map(|i| entry(i, 1 + i / 5)).collect();
            let hs = HardState {
                term: 3,
                commit: 10,
                ..Default::default()
            };
            store.append(&ents, Some(&hs)).unwrap();
            store.sync().unwrap();
            store.compact(6).unwrap();
            assert_eq!(store.first_index().unwrap(), 7);
            assert_eq!(store.term(6).unwrap(), 2);
            assert!(store.term(5).is_err());
            assert_eq!(
                store
                    .entries(7, 11, None, GetEntriesContext::empty(false))
                    .unwrap()
                    .len(),
                4
            );
        }
        let store = LogStore::open(dir.path(), 1 << 20, &[9], 6, None).unwrap();
        assert_eq!((store.first_index().unwrap(), store.last_index()), (7, 10));
        assert_eq!(store.term(6).unwrap(), 2);
        assert_eq!(store.term(10).unwrap(), 3);
        let state = store.initial_state().unwrap();
        assert_eq!(
            state.conf_state.voters,
            vec![1],
            "bootstrap ConfState persists"
        );
        assert_eq!(state.hard_state.commit, 10);
    }

    /// A commit index costs no write of its own: it rides on the next append of entries,
    /// and one never written leaves the recovered commit where the last write put it.
    #[test]
    fn a_commit_index_is_written_with_the_next_entries() {
        let dir = tempfile::tempdir().unwrap();
        {
            let mut store = LogStore::open(dir.path(), 1 << 20, &[1], 0, None).unwrap();
            let hs = HardState {
                term: 1,
                commit: 0,
                ..Default::default()
            };
            let ents: Vec<_> = (1..=3).map(|i| entry(i, 1)).collect();
            let alone = store.append(&ents, Some(&hs)).unwrap();
            store.set_commit(3);
            assert_eq!(store.initial_state().unwrap().hard_state.commit, 3);
            let with_commit = store.append(&[entry(4, 1)], None).unwrap();
            let without = store.append(&[entry(5, 1)], None).unwrap();
            assert!(
                with_commit > without,
                "the commit rides on the next entries"
            );
            assert!(alone > without);
            store.set_commit(5);
            store.set_commit(4); // never lowered
            assert_eq!(store.initial_state().unwrap().hard_state.commit, 5);
            // a HardState of Raft's with an older commit keeps the newer one
            let old = HardState {
                term: 2,
                commit: 1,
                ..Default::default()
            };
            store.append(&[], Some(&old)).unwrap();
            assert_eq!(store.initial_state().unwrap().hard_state.commit, 5);
            store.set_commit(5);
            store.sync().unwrap();
        }
        // the last commit written was 5 (with the term-2 HardState); nothing after it
        let store = LogStore::open(dir.path(), 1 << 20, &[1], 0, None).unwrap();
        let hs = store.initial_state().unwrap().hard_state;
        assert_eq!((hs.term, hs.commit), (2, 5));
        drop(store);
        let dir = tempfile::tempdir().unwrap();
        {
            let mut store = LogStore::open(dir.path(), 1 << 20, &[1], 0, None).unwrap();
            let ents: Vec<_> = (1..=4).map(|i| entry(i, 1)).collect();
            store.append(&ents, None).unwrap();
            store.set_commit(4);
            store.sync().unwrap();
        }
        // never written: recovery starts from the applied index given (here 2)
        let store = LogStore::open(dir.path(), 1 << 20, &[1], 2, None).unwrap();
        assert_eq!(store.initial_state().unwrap().hard_state.commit, 2);
    }

    /// Compactions that delete no segment leave the metadata file's point behind (see
    /// `Wal::compact`); a restart at the state machine's index holds, in memory and to raft,
    /// exactly the log after it, as before the restart.
    #[test]
    fn a_restart_after_compactions_kept_in_memory_starts_at_the_state_machines_index() {
        let dir = tempfile::tempdir().unwrap();
        {
            let mut store = LogStore::open(dir.path(), 1 << 20, &[1], 0, None).unwrap();
            let ents: Vec<_> = (1..=20).map(|i| entry(i, 1 + i / 10)).collect();
            let hs = HardState {
                term: 3,
                commit: 20,
                ..Default::default()
            };
            store.append(&ents, Some(&hs)).unwrap();
            store.sync().unwrap();
            assert_eq!(store.compact(8).unwrap(), 0);
            assert_eq!(store.compact(15).unwrap(), 0);
        }
        let store = LogStore::open(dir.path(), 1 << 20, &[1], 15, None).unwrap();
        assert_eq!((store.first_index().unwrap(), store.last_index()), (16, 20));
        assert_eq!(
            store.entries.len(),
            5,
            "entries the checkpoint covers stay in memory"
        );
        assert_eq!(store.term(15).unwrap(), 2);
        assert!(store.term(14).is_err());
        let got = store
            .entries(16, 21, None, GetEntriesContext::empty(false))
            .unwrap();
        assert_eq!(got.len(), 5);
        assert_eq!(store.initial_state().unwrap().hard_state.commit, 20);
        assert_eq!(store.initial_state().unwrap().conf_state.voters, vec![1]);
    }

    #[test]
    fn recovery_raises_commit_to_applied_and_rejects_impossible_states() {
        let dir = tempfile::tempdir().unwrap();
        {
            let mut store = LogStore::open(dir.path(), 1 << 20, &[1], 0, None).unwrap();
            let ents: Vec<_> = (1..=5).map(|i| entry(i, 1)).collect();
            let hs = HardState {
                term: 1,
                commit: 2,
                ..Default::default()
            };
            store.append(&ents, Some(&hs)).unwrap();
            store.sync().unwrap();
        }
        let store = LogStore::open(dir.path(), 1 << 20, &[1], 4, None).unwrap();
        assert_eq!(store.initial_state().unwrap().hard_state.commit, 4);
        drop(store);
        assert!(matches!(
            LogStore::open(dir.path(), 1 << 20, &[1], 6, None),
            Err(Error::Config(_))
        ));
    }

    /// `LogStore::open` over a Raft log damaged on disk, with any recovered applied index and
    /// snapshot point: a clean error, or a store whose every read answers without panicking
    /// and that takes the next append. (The decoding itself is fuzzed at length in
    /// `tests/fuzz.rs`; `SLUICE_FUZZ_CASES` sets the cases here too.)
    #[test]
    fn fuzz_open_damaged_log() {
        use proptest::prelude::*;
        use proptest::test_runner::{Config, RngSeed, TestRunner};

        let written = tempfile::tempdir().unwrap();
        {
            let mut store = LogStore::open(written.path(), 256, &[1, 2], 0, None).unwrap();
            for i in 1..=12 {
                let hs = HardState {
                    term: 1 + i / 6,
                    commit: i - 1,
                    ..Default::default()
                };
                store.append(&[entry(i, 1 + i / 6)], Some(&hs)).unwrap();
                store.sync().unwrap();
            }
            store.compact(4).unwrap();
        }
        let mut files: Vec<(std::path::PathBuf, Vec<u8>)> = std::fs::read_dir(written.path())
            .unwrap()
            .map(|d| {
                let name = d.unwrap().file_name();
                let bytes = std::fs::read(written.path().join(&name)).unwrap();
                (name.into(), bytes)
            })
            .collect();
        files.sort();

        let cases = std::env::var("SLUICE_FUZZ_CASES")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(300);
        let config = Config {
            cases,
            rng_seed: RngSeed::Fixed(0x51_1ce),
            failure_persistence: None,
            ..Config::default()
        };
        // (file, position, what): flip a bit (0..8), zero 16 bytes (8), truncate (9).
        let damage = proptest::collection::vec((0..8usize, any::<usize>(), 0..10u8), 1..4);
        let strategy = (damage, 0..16u64, proptest::option::of((0..20u64, 0..4u64)));
        TestRunner::new(config)
            .run(&strategy, |(damage, applied, snapshot_point)| {
                let dir = tempfile::tempdir().unwrap();
                let mut files = files.clone();
                for (file, at, what) in damage {
                    let n = files.len();
                    let bytes = &mut files[file % n].1;
                    let len = bytes.len();
                    let at = at % (len + 1);
                    match what {
                        0..8 if at < len => bytes[at] ^= 1 << what,
                        8 => bytes[at..(at + 16).min(len)].fill(0),
                        9 => bytes.truncate(at),
                        _ => {}
                    }
                }
                for (name, bytes) in &files {
                    std::fs::write(dir.path().join(name), bytes).unwrap();
                }
                let Ok(mut store) = LogStore::open(dir.path(), 256, &[1], applied, snapshot_point)
                else {
                    return Ok(());
                };
                let (first, last) = (store.first(), LogStore::last_index(&store));
                prop_assert!(first <= last + 1);
                let state = store.initial_state().unwrap();
                prop_assert!(state.hard_state.commit <= last);
                for low in first.saturating_sub(2)..last + 3 {
                    let _ = store.term(low);
                    for high in low.saturating_sub(1)..last + 3 {
                        let got = store.entries(low, high, None, GetEntriesContext::empty(false));
                        if let Ok(entries) = got {
                            prop_assert_eq!(entries.len() as u64, high - low);
                        }
                    }
                }
                let next = entry(last + 1, state.hard_state.term.max(1));
                store.append(&[next], None).map_err(|e| {
                    proptest::test_runner::TestCaseError::fail(format!("append: {e}"))
                })?;
                Ok(())
            })
            .unwrap();
    }
}
