//! Staged COPY in the state machine: a COPY FROM larger than one command arrives as
//! `CopyChunk` ops, each staged in a hidden log of its own on every replica, and becomes
//! visible only by its `CopyCommit` (see `session/copy_from.rs` for the proposing side).
//!
//! Invariants:
//! - A staged copy is a [`StreamLog`] in `streams/copy-<id>` (its id: the Raft index of the
//!   chunk that started it), checkpointed like a stream (the record lists every open copy
//!   with its durable position), so a restart replays its chunks exactly, and a Raft
//!   snapshot carries its files like a stream's.
//! - Nothing staged is visible: readers see a stream, never a copy. The commit appends the
//!   staged frames to the stream unpublished and publishes them at once
//!   ([`StreamLog::append_unpublished`]), all at the commit's `ts`; a crash before the
//!   checkpoint that follows replays the commit from the Raft log (the copy's files go only
//!   after a checkpoint no longer names it, as a dropped stream's do).
//! - A copy ends by its commit, by `CopyAbort`, or — a client or node gone mid-COPY — when a
//!   command is applied more than the copy's idle timeout (carried in its chunks) after its
//!   last chunk, by the commands' proposed times: the same decision on every replica.
//! - Copies into streams with a `dedup_key` are not staged (the session commits those in
//!   one command); a commit into a stream that gained one meanwhile is refused.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use sluice_storage::{PendingSync, StreamCheckpoint, StreamLog, StreamLogOptions};

use super::{check_target, Applied, Database, STREAMS_DIR};
use crate::command::{CopyAbort, CopyChunk, CopyCommit, OpOutcome};
use crate::error::{sqlstate, Error};

/// One open staged copy.
pub(super) struct StagedCopy {
    pub(super) stream_id: u64,
    pub(super) log: Arc<StreamLog>,
    /// Proposed time of the command that staged its last chunk (µs).
    pub(super) last_ts_micros: i64,
    pub(super) idle_timeout_ms: u64,
}

/// A staged copy as the checkpoint record keeps it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(super) struct CheckpointedCopy {
    pub(super) id: u64,
    pub(super) stream_id: u64,
    pub(super) last_ts_micros: i64,
    pub(super) idle_timeout_ms: u64,
    pub(super) position: StreamCheckpoint,
}

/// Where the copy `id` is staged.
pub(super) fn copy_dir(dir: &Path, id: u64) -> PathBuf {
    dir.join(STREAMS_DIR).join(format!("copy-{id:020}"))
}

/// Opens the copies a checkpoint record lists, each at its durable position.
pub(super) fn open_copies(
    dir: &Path,
    copies: &[CheckpointedCopy],
    segment_bytes: u64,
) -> Result<BTreeMap<u64, StagedCopy>, Error> {
    let mut open = BTreeMap::new();
    for c in copies {
        let log = StreamLog::open(
            &copy_dir(dir, c.id),
            StreamLogOptions { segment_bytes },
            &c.position,
        )?;
        open.insert(
            c.id,
            StagedCopy {
                stream_id: c.stream_id,
                log: Arc::new(log),
                last_ts_micros: c.last_ts_micros,
                idle_timeout_ms: c.idle_timeout_ms,
            },
        );
    }
    Ok(open)
}

fn discarded(id: u64) -> Error {
    Error::new(
        sqlstate::OBJECT_NOT_IN_PREREQUISITE_STATE,
        format!("the rows this COPY staged are gone (copy {id} was aborted or idle too long)"),
    )
}

impl Database {
    /// Drops the copies idle for longer than their timeout at `ts_micros` (a command's
    /// proposed time).
    pub(super) fn expire_copies(&mut self, ts_micros: i64) {
        let idle: Vec<u64> = self
            .copies
            .iter()
            .filter(|(_, c)| {
                let timeout =
                    i64::try_from(c.idle_timeout_ms.saturating_mul(1000)).unwrap_or(i64::MAX);
                ts_micros.saturating_sub(c.last_ts_micros) > timeout
            })
            .map(|(id, _)| *id)
            .collect();
        for id in idle {
            tracing::info!(
                copy = id,
                "dropping a staged COPY idle for longer than its timeout"
            );
            self.end_copy(id);
        }
    }

    /// Forgets copy `id`; its files go after the next checkpoint (see
    /// `remove_dropped_streams`).
    fn end_copy(&mut self, id: u64) {
        if self.copies.remove(&id).is_some() {
            self.dropped_streams.push(copy_dir(&self.dir, id));
        }
    }

    /// The record of every open copy, at positions its pending sync (pushed onto `syncs`)
    /// makes durable.
    pub(super) fn checkpoint_copies(
        &self,
        syncs: &mut Vec<(Arc<StreamLog>, PendingSync)>,
    ) -> Result<Vec<CheckpointedCopy>, String> {
        let mut copies = Vec::new();
        for (id, c) in &self.copies {
            let pending = c.log.begin_sync().map_err(|e| e.to_string())?;
            copies.push(CheckpointedCopy {
                id: *id,
                stream_id: c.stream_id,
                last_ts_micros: c.last_ts_micros,
                idle_timeout_ms: c.idle_timeout_ms,
                position: pending.checkpoint.clone(),
            });
            syncs.push((Arc::clone(&c.log), pending));
        }
        Ok(copies)
    }

    /// The directories of open copies (for a Raft snapshot, and as directories a
    /// recovery keeps).
    pub(super) fn copy_dirs(&self) -> Vec<PathBuf> {
        self.copies
            .keys()
            .map(|id| copy_dir(&self.dir, *id))
            .collect()
    }

    /// Checks a chunk before anything of its command applies; `stream` is the target's
    /// id as the command's earlier ops leave it.
    pub(super) fn validate_chunk(&self, c: &CopyChunk, stream: Option<u64>) -> Result<(), Error> {
        match c.copy_id {
            0 => self.check_copy_target(&c.stream, c.stream_id, stream),
            id => self.check_copy(id, &c.stream, c.stream_id, stream),
        }
    }

    /// Checks a commit before anything of its command applies.
    pub(super) fn validate_commit(&self, c: &CopyCommit, stream: Option<u64>) -> Result<(), Error> {
        self.check_copy(c.copy_id, &c.stream, c.stream_id, stream)
    }

    /// The copy `id` is open, into the stream `name` (`planned_id`; `current`: its id as the
    /// command's earlier ops leave it).
    fn check_copy(
        &self,
        id: u64,
        name: &str,
        planned_id: u64,
        current: Option<u64>,
    ) -> Result<(), Error> {
        self.check_copy_target(name, planned_id, current)?;
        match self.copies.get(&id) {
            Some(copy) if copy.stream_id == planned_id => Ok(()),
            Some(_) => Err(Error::internal("a COPY op names another stream's copy")),
            None => Err(discarded(id)),
        }
    }

    fn check_copy_target(
        &self,
        name: &str,
        planned_id: u64,
        current: Option<u64>,
    ) -> Result<(), Error> {
        check_target(current, name, planned_id)?;
        match self.catalog.get(name) {
            Some(s) if s.def.options.dedup_key.is_some() => Err(Error::new(
                sqlstate::OBJECT_NOT_IN_PREREQUISITE_STATE,
                format!("stream \"{name}\" gained a dedup_key while the COPY ran"),
            )),
            _ => Ok(()),
        }
    }

    /// Stages a chunk: in a new copy (id `index`) or the one it names.
    pub(super) fn stage_chunk(&mut self, index: u64, c: CopyChunk, ts_micros: i64) -> Applied {
        let id = if c.copy_id == 0 { index } else { c.copy_id };
        if c.copy_id == 0 {
            let log = StreamLog::create(
                &copy_dir(&self.dir, id),
                StreamLogOptions {
                    segment_bytes: self.default_segment_bytes,
                },
            )
            .map_err(|e| e.to_string())?;
            self.copies.insert(
                id,
                StagedCopy {
                    stream_id: c.stream_id,
                    log: Arc::new(log),
                    last_ts_micros: ts_micros,
                    idle_timeout_ms: c.idle_timeout_ms,
                },
            );
        }
        let Some(copy) = self.copies.get_mut(&id) else {
            return Ok(Err(discarded(id)));
        };
        if c.rows > 0 {
            copy.log
                .append(&c.ipc, c.rows, ts_micros)
                .map_err(|e| e.to_string())?;
        }
        copy.last_ts_micros = ts_micros;
        copy.idle_timeout_ms = c.idle_timeout_ms;
        Ok(Ok(OpOutcome::CopyStaged { copy_id: id }))
    }

    /// Moves a staged copy's frames into its stream (verbatim, verified on the way) and
    /// shows them to readers at once, all committed at one `ts`.
    pub(super) fn commit_copy(&mut self, c: CopyCommit, ts_micros: i64) -> Applied {
        let Some(stream) = self.catalog.get(&c.stream) else {
            return Ok(Err(Error::undefined_table(&c.stream)));
        };
        let Some(copy) = self.copies.get(&c.copy_id) else {
            return Ok(Err(discarded(c.copy_id)));
        };
        let ts = stream.next_ts(ts_micros);
        let base = stream.log.write_offset();
        let mut rows = 0u64;
        for meta in copy.log.batches(0, copy.log.next_offset()) {
            let ipc = copy.log.read_payload(&meta).map_err(|e| e.to_string())?;
            stream
                .log
                .append_unpublished(&ipc, meta.rows, ts)
                .map_err(|e| e.to_string())?;
            rows += u64::from(meta.rows);
        }
        stream.log.publish().map_err(|e| e.to_string())?;
        if rows > 0 {
            stream.record_append(ts);
        }
        self.stats
            .appended_rows
            .fetch_add(rows, std::sync::atomic::Ordering::Relaxed);
        self.end_copy(c.copy_id);
        Ok(Ok(OpOutcome::Appended {
            stream: c.stream,
            base_offset: base,
            rows: u32::try_from(rows).unwrap_or(u32::MAX),
            ts_micros: ts,
            row_offsets: Vec::new(),
        }))
    }

    /// Drops a staged copy (gone already is no error: it expired or was aborted twice).
    pub(super) fn abort_copy(&mut self, c: CopyAbort) -> Applied {
        self.end_copy(c.copy_id);
        Ok(Ok(OpOutcome::CopyAborted))
    }
}
