//! The state machine: applies committed commands to the catalog and the
//! stream logs, and checkpoints them.
//!
//! Invariants:
//! - Applying is deterministic: the same command at the same index gives
//!   the same result on every replica. Offsets come from the stream's
//!   `next_offset`, `ts` from the command's proposed time.
//! - A command's ops are validated in full before any is applied, so a
//!   deterministic error leaves no trace (all or nothing).
//! - `checkpoint.json` records the applied index together with every
//!   stream's definition and durable position, written atomically (tmp,
//!   fsync, rename, fsync dir) after the stream files are fsynced. On
//!   restart, everything after the checkpoint is discarded from the stream
//!   files and replayed from the Raft log, so nothing is applied twice.
//! - Dropping or truncating a stream checkpoints before deleting files, so
//!   a recovered checkpoint never points at a deleted segment.

use std::collections::HashMap;
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use sluice_consensus::StateMachine;
use sluice_storage::{StreamCheckpoint, StreamLog, StreamLogOptions};

use crate::catalog::{Catalog, Stream, StreamDef};
use crate::command::{op, Command, CommandResult, OpOutcome};
use crate::error::{sqlstate, Error};

const CHECKPOINT_FILE: &str = "checkpoint.json";
const STREAMS_DIR: &str = "streams";

#[derive(Debug, Default, Serialize, Deserialize)]
struct CheckpointFile {
    applied_index: u64,
    /// Next PostgreSQL OID to hand out to a created relation.
    #[serde(default = "first_user_oid")]
    next_oid: u32,
    streams: Vec<CheckpointedStream>,
}

/// PostgreSQL's first OID for user objects.
fn first_user_oid() -> u32 {
    16384
}

#[derive(Debug, Serialize, Deserialize)]
struct CheckpointedStream {
    def: StreamDef,
    position: StreamCheckpoint,
}

/// Counters of applied work, shared with `sluice_stats`.
#[derive(Debug, Default)]
pub struct ApplyStats {
    pub appended_rows: AtomicU64,
    pub applied_commands: AtomicU64,
}

/// The Sluice state machine over a data directory.
pub struct Database {
    dir: PathBuf,
    catalog: Arc<Catalog>,
    stats: Arc<ApplyStats>,
    /// Index of the last applied command.
    applied: u64,
    /// Index covered by the last checkpoint.
    checkpointed: u64,
    default_segment_bytes: u64,
    next_oid: u32,
}

impl Database {
    /// Recover from `dir`: load the checkpoint, open every stream at its
    /// durable position (dropping anything later, which the Raft log will
    /// replay) and remove directories of streams the checkpoint doesn't know.
    pub fn open(
        dir: &Path,
        catalog: Arc<Catalog>,
        stats: Arc<ApplyStats>,
        default_segment_bytes: u64,
    ) -> Result<Database, Error> {
        let streams_dir = dir.join(STREAMS_DIR);
        fs::create_dir_all(&streams_dir)
            .map_err(|e| Error::io(format!("{}: {e}", streams_dir.display())))?;
        let cp_path = dir.join(CHECKPOINT_FILE);
        let cp: CheckpointFile = match fs::read(&cp_path) {
            Ok(bytes) => serde_json::from_slice(&bytes)
                .map_err(|e| Error::io(format!("unreadable {}: {e}", cp_path.display())))?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => CheckpointFile::default(),
            Err(e) => return Err(Error::io(format!("{}: {e}", cp_path.display()))),
        };
        catalog.clear();
        let mut known = Vec::new();
        let mut next_oid = cp.next_oid.max(first_user_oid());
        let mut streams: Vec<&CheckpointedStream> = cp.streams.iter().collect();
        streams.sort_by_key(|s| s.def.id);
        for s in streams {
            // streams from before OIDs existed get one now, in creation order
            let mut def = s.def.clone();
            if def.oid == 0 {
                def.oid = next_oid;
                next_oid += 1;
            }
            let sdir = stream_dir(dir, s.def.id);
            let log = StreamLog::open(
                &sdir,
                stream_options(&s.def, default_segment_bytes),
                &s.position,
            )?;
            catalog.insert(Arc::new(Stream::new(def, Arc::new(log))));
            known.push(sdir);
        }
        if let Ok(entries) = fs::read_dir(&streams_dir) {
            for entry in entries.flatten() {
                let p = entry.path();
                if !known.contains(&p) {
                    tracing::info!(path = %p.display(), "removing stream directory not in the checkpoint");
                    let _ = fs::remove_dir_all(&p);
                }
            }
        }
        Ok(Database {
            next_oid,
            dir: dir.to_path_buf(),
            catalog,
            stats,
            applied: cp.applied_index,
            checkpointed: cp.applied_index,
            default_segment_bytes,
        })
    }

    fn write_checkpoint(&mut self, index: u64) -> Result<u64, String> {
        let mut streams = Vec::new();
        for s in self.catalog.list() {
            let position = s.log.sync().map_err(|e| e.to_string())?;
            streams.push(CheckpointedStream {
                def: s.def.clone(),
                position,
            });
        }
        let file = CheckpointFile {
            applied_index: index,
            next_oid: self.next_oid,
            streams,
        };
        let bytes = serde_json::to_vec_pretty(&file).map_err(|e| e.to_string())?;
        let tmp = self.dir.join(format!("{CHECKPOINT_FILE}.tmp"));
        let write = || -> std::io::Result<()> {
            let mut f = fs::File::create(&tmp)?;
            f.write_all(&bytes)?;
            f.sync_all()?;
            fs::rename(&tmp, self.dir.join(CHECKPOINT_FILE))?;
            fs::File::open(&self.dir)?.sync_all()
        };
        write().map_err(|e| format!("writing checkpoint in {}: {e}", self.dir.display()))?;
        self.checkpointed = index;
        Ok(index)
    }

    /// Check every op against the catalog as it will be when the op runs.
    fn validate(&self, cmd: &Command) -> Result<(), Error> {
        // name -> Some(id) exists / None dropped, for names touched earlier in the command
        let mut overlay: HashMap<&str, Option<u64>> = HashMap::new();
        let exists = |overlay: &HashMap<&str, Option<u64>>, name: &str| -> Option<u64> {
            match overlay.get(name) {
                Some(v) => *v,
                None => self.catalog.get(name).map(|s| s.def.id),
            }
        };
        for o in &cmd.ops {
            match &o.kind {
                Some(op::Kind::CreateStream(c)) => {
                    if exists(&overlay, &c.name).is_some() {
                        if !c.if_not_exists {
                            return Err(Error::new(
                                sqlstate::DUPLICATE_TABLE,
                                format!("relation \"{}\" already exists", c.name),
                            ));
                        }
                    } else {
                        overlay.insert(&c.name, Some(0));
                    }
                }
                Some(op::Kind::DropStream(d)) => {
                    if exists(&overlay, &d.name).is_none() {
                        if !d.if_exists {
                            return Err(Error::undefined_table(&d.name));
                        }
                    } else {
                        overlay.insert(&d.name, None);
                    }
                }
                Some(op::Kind::Append(a)) => {
                    check_target(exists(&overlay, &a.stream), &a.stream, a.stream_id)?
                }
                Some(op::Kind::Truncate(t)) => {
                    check_target(exists(&overlay, &t.stream), &t.stream, t.stream_id)?
                }
                None => return Err(Error::internal("empty op in command")),
            }
        }
        Ok(())
    }

    fn apply_command(&mut self, index: u64, cmd: Command) -> Result<CommandResult, String> {
        if let Err(e) = self.validate(&cmd) {
            return Ok(Err(e));
        }
        let mut outcomes = Vec::with_capacity(cmd.ops.len());
        for (i, o) in cmd.ops.into_iter().enumerate() {
            let outcome = match o.kind {
                Some(op::Kind::CreateStream(c)) => {
                    if self.catalog.get(&c.name).is_some() {
                        OpOutcome::Created { existed: true }
                    } else {
                        let mut def: StreamDef = match serde_json::from_str(&c.definition_json) {
                            Ok(d) => d,
                            Err(e) => {
                                return Ok(Err(Error::internal(format!(
                                    "bad stream definition: {e}"
                                ))))
                            }
                        };
                        // unique per op even when one command creates several streams
                        def.id = index * 1024 + i as u64 + 1;
                        def.name = c.name.clone();
                        def.oid = self.next_oid;
                        self.next_oid += 1;
                        let log = StreamLog::create(
                            &stream_dir(&self.dir, def.id),
                            stream_options(&def, self.default_segment_bytes),
                        )
                        .map_err(|e| e.to_string())?;
                        self.catalog
                            .insert(Arc::new(Stream::new(def, Arc::new(log))));
                        OpOutcome::Created { existed: false }
                    }
                }
                Some(op::Kind::DropStream(d)) => match self.catalog.remove(&d.name) {
                    None => OpOutcome::Dropped { existed: false },
                    Some(stream) => {
                        self.write_checkpoint(index)?;
                        let path = stream_dir(&self.dir, stream.def.id);
                        if let Err(e) = fs::remove_dir_all(&path) {
                            tracing::warn!(path = %path.display(), "could not remove dropped stream: {e}");
                        }
                        OpOutcome::Dropped { existed: true }
                    }
                },
                Some(op::Kind::Append(a)) => {
                    let Some(stream) = self.catalog.get(&a.stream) else {
                        return Ok(Err(Error::undefined_table(&a.stream)));
                    };
                    let ts = stream.next_ts(cmd.ts_micros);
                    let base = stream
                        .log
                        .append(&a.ipc, a.rows, ts)
                        .map_err(|e| e.to_string())?;
                    stream.record_append(ts);
                    self.stats
                        .appended_rows
                        .fetch_add(a.rows as u64, Ordering::Relaxed);
                    OpOutcome::Appended {
                        stream: a.stream,
                        base_offset: base,
                        rows: a.rows,
                        ts_micros: ts,
                    }
                }
                Some(op::Kind::Truncate(t)) => {
                    let Some(stream) = self.catalog.get(&t.stream) else {
                        return Ok(Err(Error::undefined_table(&t.stream)));
                    };
                    // checkpoint the state before this op, so the checkpoint
                    // references the active segment, which is never deleted
                    self.write_checkpoint(index - 1)?;
                    let first = stream
                        .log
                        .truncate_prefix(t.before)
                        .map_err(|e| e.to_string())?;
                    stream.record_append(stream.next_ts(i64::MIN));
                    OpOutcome::Truncated {
                        first_offset: first,
                    }
                }
                None => return Ok(Err(Error::internal("empty op in command"))),
            };
            outcomes.push(outcome);
        }
        self.stats.applied_commands.fetch_add(1, Ordering::Relaxed);
        Ok(Ok(outcomes))
    }
}

fn check_target(current: Option<u64>, name: &str, planned_id: u64) -> Result<(), Error> {
    match current {
        None => Err(Error::undefined_table(name)),
        Some(id) if planned_id != 0 && id != 0 && id != planned_id => Err(Error::new(
            sqlstate::SERIALIZATION_FAILURE,
            format!("stream \"{name}\" was dropped and re-created while the statement ran"),
        )),
        Some(_) => Ok(()),
    }
}

fn stream_dir(dir: &Path, id: u64) -> PathBuf {
    dir.join(STREAMS_DIR).join(format!("{id:020}"))
}

fn stream_options(def: &StreamDef, default_segment_bytes: u64) -> StreamLogOptions {
    StreamLogOptions {
        segment_bytes: def.options.segment_bytes.unwrap_or(default_segment_bytes),
    }
}

impl StateMachine for Database {
    type Response = CommandResult;

    fn apply(&mut self, index: u64, command: &[u8]) -> Result<CommandResult, String> {
        self.applied = index;
        match Command::decode_bytes(command) {
            Ok(cmd) => self.apply_command(index, cmd),
            Err(e) => Ok(Err(e)),
        }
    }

    fn applied_index(&self) -> u64 {
        self.checkpointed
    }

    fn checkpoint(&mut self) -> Result<u64, String> {
        self.write_checkpoint(self.applied)
    }
}
