//! Checkpoints of the state machine, begun on its thread and written on another.
//!
//! A checkpoint at applied index `i` is three steps:
//! 1. begin (state-machine thread, no waiting on the disk): prune expired dedup keys, fix
//!    every stream's and open copy's position at `i` ([`StreamLog::begin_sync`]: it takes
//!    the files written since the last sync), take the tables' view at `i` (O(1):
//!    [`TableStore::begin_checkpoint`]) and build the record;
//! 2. run (the `sluice-checkpoint` thread, or inline when the caller needs it done): fsync
//!    those files, then write the tables' view and the record in one durable redb
//!    transaction ([`TableStore::checkpoint_as_of`]);
//! 3. finish (state-machine thread): the logs may delete what the record no longer names
//!    ([`StreamLog::synced`]), and the node may compact its Raft log up to `i`.
//!
//! Invariants:
//! - At most one checkpoint is in flight. Whatever needs a checkpoint done — one taken
//!   synchronously (the tables' delta is too big, a Raft snapshot, a backup, shutdown) or
//!   a restore — first waits for the one in flight.
//! - Applies go on while a checkpoint runs; nothing they write is in it: stream positions
//!   and the tables' view are fixed at begin, and the delta keeps what changed after it.
//! - The files of dropped streams and ended copies are deleted by the first checkpoint
//!   begun after the command that dropped them, once its record (which no longer names
//!   them) is durable; the state machine asks the node for that checkpoint at once
//!   (`checkpoint_wanted`). So a recovered record never names a deleted file, and a running
//!   checkpoint never fsyncs a directory that is gone (one in flight holds no doomed
//!   directory's sync: a stream or copy is dropped only after it was begun).
//! - A checkpoint that fails poisons the node (the failure is returned to it), as before:
//!   the record on disk is the previous one, still whole.

use std::fs;
use std::path::PathBuf;
use std::sync::Arc;
use std::thread::JoinHandle;

use sluice_storage::{PendingSync, StreamLog};

use super::{CheckpointFile, CheckpointedStream, Database, LEGACY_CHECKPOINT_FILE};
use crate::catalog::Catalog;
use crate::definition::CONSUMER_OFFSETS;
use crate::table::store::{Snapshot, TableStore};

/// A checkpoint begun, with what its run needs (all owned: it runs on another thread).
pub(super) struct Job {
    index: u64,
    record: Vec<u8>,
    syncs: Vec<(Arc<StreamLog>, PendingSync)>,
    tables: Arc<TableStore>,
    view: Snapshot,
    dropped_tables: Vec<u64>,
    legacy_file: PathBuf,
    snapshot_point: Option<(u64, u64)>,
    /// Directories of streams and copies dropped at or before `index`: deleted once the
    /// record no longer names them.
    doomed: Vec<PathBuf>,
    catalog: Arc<Catalog>,
}

impl Job {
    /// The checkpoint's I/O: stream files first, then the record that names their positions.
    pub(super) fn run(&self) -> Result<(), String> {
        for (log, pending) in &self.syncs {
            pending.run(log).map_err(|e| e.to_string())?;
        }
        self.tables
            .checkpoint_as_of(&self.view, self.index, &self.record, &self.dropped_tables)
            .map_err(|e| format!("writing checkpoint: {e}"))?;
        if self.legacy_file.exists() {
            fs::remove_file(&self.legacy_file)
                .map_err(|e| format!("{}: {e}", self.legacy_file.display()))?;
        }
        if !self.doomed.is_empty() {
            let _deleting = self.catalog.stream_file_deletions();
            for path in &self.doomed {
                if let Err(e) = fs::remove_dir_all(path) {
                    tracing::warn!(path = %path.display(), "could not remove a dropped stream: {e}");
                }
            }
        }
        Ok(())
    }
}

/// The checkpoint in flight on the checkpoint thread (which gives its job back).
pub(super) struct InFlight(JoinHandle<Option<(Job, Result<(), String>)>>);

impl Database {
    /// Makes everything applied up to `index` (the applied index) durable before returning,
    /// after the checkpoint in flight, if any.
    pub(super) fn write_checkpoint(&mut self, index: u64) -> Result<u64, String> {
        self.write_checkpoint_record(index).map(|_| index)
    }

    /// [`Database::write_checkpoint`], returning the checkpoint record it stored.
    pub(super) fn write_checkpoint_record(&mut self, index: u64) -> Result<Vec<u8>, String> {
        self.collect_checkpoint(true)?;
        let job = self.begin_checkpoint(index)?;
        job.run()?;
        let record = job.record.clone();
        self.end_checkpoint(job);
        Ok(record)
    }

    /// Begins a checkpoint of everything applied and runs its I/O on the checkpoint
    /// thread: [`Database::collect_checkpoint`] says when it is done. (Inline, if no thread
    /// can be started.)
    pub(super) fn spawn_checkpoint(&mut self) -> Result<(), String> {
        self.collect_checkpoint(true)?;
        let job = self.begin_checkpoint(self.applied)?;
        // the job goes to the thread once it runs: if it cannot start, the job is still here
        let (tx, rx) = std::sync::mpsc::sync_channel::<Job>(1);
        let spawned = std::thread::Builder::new()
            .name("sluice-checkpoint".into())
            .spawn(move || {
                rx.recv().ok().map(|job| {
                    let result = job.run();
                    (job, result)
                })
            });
        match spawned {
            Ok(handle) => {
                self.checkpoint_in_flight = Some(InFlight(handle));
                tx.send(job)
                    .map_err(|_| "the checkpoint thread is gone".to_string())
            }
            Err(e) => {
                tracing::warn!("no checkpoint thread ({e}); checkpointing inline");
                job.run()?;
                self.end_checkpoint(job);
                Ok(())
            }
        }
    }

    /// The index of the newest checkpoint made durable since the last call, if any
    /// (`wait`: after the one in flight is done). A failed checkpoint is an `Err`.
    pub(super) fn collect_checkpoint(&mut self, wait: bool) -> Result<Option<u64>, String> {
        let done = match &self.checkpoint_in_flight {
            Some(InFlight(handle)) => wait || handle.is_finished(),
            None => false,
        };
        if done {
            if let Some(InFlight(handle)) = self.checkpoint_in_flight.take() {
                let (job, result) = handle
                    .join()
                    .map_err(|_| "the checkpoint thread panicked".to_string())?
                    .ok_or("the checkpoint thread never got its job")?;
                result?;
                self.end_checkpoint(job);
            }
        }
        Ok(self.checkpoint_done.take())
    }

    /// Step 1: see the module docs.
    pub(super) fn begin_checkpoint(&mut self, index: u64) -> Result<Job, String> {
        self.prune_dedup()?;
        let mut syncs = Vec::new();
        let mut streams = Vec::new();
        for s in self.catalog.list() {
            let pending = s.log.begin_sync().map_err(|e| e.to_string())?;
            streams.push(CheckpointedStream {
                def: s.def.clone(),
                position: pending.checkpoint.clone(),
            });
            syncs.push((Arc::clone(&s.log), pending));
        }
        let copies = self.checkpoint_copies(&mut syncs)?;
        let file = CheckpointFile {
            format: crate::format::FORMAT_VERSION,
            applied_index: index,
            next_oid: self.next_oid,
            streams,
            tables: self
                .catalog
                .tables()
                .iter()
                .filter(|t| t.def.name != CONSUMER_OFFSETS)
                .map(|t| t.def.clone())
                .collect(),
            table_versions: self.tables.versions(),
            snapshot_point: self.snapshot_point.filter(|(i, _)| *i == index),
            roles: (*self.catalog.roles()).clone(),
            views: self.catalog.views().iter().map(|v| v.def.clone()).collect(),
            copies,
        };
        Ok(Job {
            index,
            record: serde_json::to_vec(&file).map_err(|e| e.to_string())?,
            syncs,
            tables: Arc::clone(&self.tables),
            view: self.tables.begin_checkpoint(),
            dropped_tables: std::mem::take(&mut self.dropped_tables),
            legacy_file: self.dir.join(LEGACY_CHECKPOINT_FILE),
            snapshot_point: file.snapshot_point,
            doomed: std::mem::take(&mut self.doomed),
            catalog: Arc::clone(&self.catalog),
        })
    }

    /// Step 3, after a run that succeeded.
    pub(super) fn end_checkpoint(&mut self, job: Job) {
        for (log, pending) in &job.syncs {
            log.synced(&pending.checkpoint);
        }
        self.snapshot_point = job.snapshot_point;
        self.checkpointed = job.index;
        self.checkpoint_done = Some(job.index);
    }
}
