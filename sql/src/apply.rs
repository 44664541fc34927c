//! The state machine: applies committed commands to the catalog and the
//! stream logs, and checkpoints them.
//!
//! Invariants:
//! - Applying is deterministic: the same command at the same index gives
//!   the same result on every replica. Offsets come from the stream's
//!   `next_offset`, `ts` from the command's proposed time.
//! - A command's ops are validated in full before any is applied, so a
//!   deterministic error leaves no trace (all or nothing).
//! - The checkpoint record holds the applied index together with every
//!   stream's definition and durable position and every table's definition
//!   and versions. It is written after the stream files are fsynced, in the
//!   same durable redb transaction that writes the table rows changed since
//!   the previous checkpoint (see [`crate::table::store`]); a periodic one
//!   is begun here and written on the checkpoint thread (`apply/checkpoint.rs`). On restart,
//!   everything after the checkpoint is discarded from the stream files (and
//!   was never written to the table file) and is replayed from the Raft log,
//!   so nothing is applied twice or half. (Data directories from before
//!   tables kept the record in `checkpoint.json`; it is read once.)
//! - Table writes are validated with the rest of the command: a read that
//!   changed since the transaction's snapshot (40001), a duplicate key
//!   (23505) or a dropped table fails the whole command.
//! - A recovered checkpoint never points at a deleted segment: a dropped
//!   stream's files go once a checkpoint after its whole command is durable
//!   (`apply/checkpoint.rs`), a truncation checkpoints before itself.
//! - A table a command creates can be written later in the same command
//!   (a transaction block's DDL): the write names it by a local id
//!   ([`crate::block_catalog::LOCAL_ID_BASE`] + the position of its
//!   `CreateTable` op), resolved here to the id the table gets.

use std::collections::HashMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use prost::Message as _;
use serde::{Deserialize, Serialize};
use sluice_consensus::StateMachine;
use sluice_storage::{durable, StreamCheckpoint, StreamLog, StreamLogOptions};

use crate::block_catalog::LOCAL_ID_BASE;
use crate::catalog::{Catalog, Stream};
use crate::command::{op, Command, CommandResult, OpOutcome};
use crate::definition::{StreamDef, TableDef, ViewDef, CONSUMER_OFFSETS};
use crate::error::{sqlstate, Error};
use crate::roles::{CatalogView, RoleChange, Roles};
use crate::table::store::{TableStore, TableVersions, Write};
use crate::table::{write_kind, Table};

mod checkpoint;
mod copies;
mod indexes;
mod views;

pub(crate) use indexes::{constraint_requires, missing_index, on_stream, relation_exists};

/// Where checkpoints were kept before tables (read once, then removed).
const LEGACY_CHECKPOINT_FILE: &str = "checkpoint.json";
const STREAMS_DIR: &str = "streams";
const TABLES_FILE: &str = "tables.redb";
/// Table changes held in memory between checkpoints; beyond this the state
/// machine checkpoints early.
const MAX_TABLE_DELTA_BYTES: usize = 64 << 20;

#[derive(Debug, Default, Serialize, Deserialize)]
struct CheckpointFile {
    /// The data format of the files this record describes ([`crate::format`]).
    #[serde(default = "first_format")]
    format: u32,
    applied_index: u64,
    /// Next PostgreSQL OID to hand out to a created relation.
    #[serde(default = "first_user_oid")]
    next_oid: u32,
    streams: Vec<CheckpointedStream>,
    /// User tables (the built-in ones are defined in code).
    #[serde(default)]
    tables: Vec<TableDef>,
    #[serde(default)]
    table_versions: Vec<(u64, TableVersions)>,
    /// (index, term) of the Raft snapshot this checkpoint was restored from, while the
    /// checkpoint is still exactly at it.
    #[serde(default)]
    snapshot_point: Option<(u64, u64)>,
    /// Roles, owners and grants (absent from data directories made before roles).
    #[serde(default)]
    roles: Roles,
    /// Views (absent from data directories made before views).
    #[serde(default)]
    views: Vec<ViewDef>,
    /// Staged COPYs not yet committed or aborted (see `apply/copies.rs`).
    #[serde(default)]
    copies: Vec<copies::CheckpointedCopy>,
}

/// What a Raft snapshot of the database carries: the checkpoint record, every table's rows
/// (raw) and every stream file, all as of one checkpoint.
#[derive(Clone, PartialEq, prost::Message)]
struct SnapshotState {
    #[prost(bytes = "vec", tag = "1")]
    record: Vec<u8>,
    #[prost(message, repeated, tag = "2")]
    tables: Vec<SnapshotTable>,
    #[prost(message, repeated, tag = "3")]
    files: Vec<SnapshotFile>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct SnapshotTable {
    #[prost(string, tag = "1")]
    name: String,
    #[prost(bytes = "vec", repeated, tag = "2")]
    keys: Vec<Vec<u8>>,
    #[prost(bytes = "vec", repeated, tag = "3")]
    values: Vec<Vec<u8>>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct SnapshotFile {
    /// Path under the streams directory (`<stream id>/<file>`).
    #[prost(string, tag = "1")]
    path: String,
    #[prost(bytes = "vec", tag = "2")]
    data: Vec<u8>,
}

/// Records written before the field existed are format 1.
fn first_format() -> u32 {
    1
}

/// The term a restored backup's state starts at: its history is not the cluster's it came
/// from (a restored node seeds a new cluster), so any term does; Raft needs one above zero.
const RESTORED_TERM: u64 = 1;

/// A checkpoint record as a backup reads it: the applied index it covers and each stream's
/// directory and durable position.
pub(crate) struct RecordedState {
    pub applied_index: u64,
    pub streams: Vec<(PathBuf, StreamCheckpoint)>,
}

/// Reads a checkpoint record (from [`crate::table::store::StoreSnapshot::record`]); `dir`
/// is the data directory whose streams it names.
pub(crate) fn recorded_state(dir: &Path, record: &[u8]) -> Result<RecordedState, Error> {
    let cp: CheckpointFile = serde_json::from_slice(record)
        .map_err(|e| Error::io(format!("unreadable checkpoint record: {e}")))?;
    crate::format::check_version(cp.format, "the checkpoint record")?;
    Ok(RecordedState {
        applied_index: cp.applied_index,
        streams: cp
            .streams
            .iter()
            .map(|s| (stream_dir(dir, s.def.id), s.position.clone()))
            .collect(),
    })
}

/// The streams a backup's state file records, as paths relative to a data directory
/// (`streams/<id>`), and its applied index.
pub(crate) fn backup_state_streams(state: &[u8]) -> Result<RecordedState, Error> {
    let snap = SnapshotState::decode(state)
        .map_err(|e| Error::io(format!("undecodable backup state: {e}")))?;
    recorded_state(Path::new(""), &snap.record)
}

/// A backup's state file: the checkpoint record and every table, raw (a Raft snapshot's
/// message without the stream files, which a backup keeps as files).
pub(crate) fn encode_backup_state(
    record: Vec<u8>,
    tables: Vec<crate::table::store::RawTable>,
) -> Vec<u8> {
    SnapshotState {
        record,
        tables: snapshot_tables(tables),
        files: Vec::new(),
    }
    .encode_to_vec()
}

/// Tables as a snapshot carries them.
fn snapshot_tables(tables: Vec<crate::table::store::RawTable>) -> Vec<SnapshotTable> {
    tables
        .into_iter()
        .map(|(name, rows)| {
            let (keys, values) = rows.into_iter().unzip();
            SnapshotTable { name, keys, values }
        })
        .collect()
}

/// A snapshot's tables as the table store takes them.
fn raw_tables(tables: Vec<SnapshotTable>) -> Vec<crate::table::store::RawTable> {
    tables
        .into_iter()
        .map(|t| (t.name, t.keys.into_iter().zip(t.values).collect()))
        .collect()
}

/// A checkpoint record from a snapshot or a backup (`what`), checked for its format and
/// marked as restored at `point` (index, term) — its own index for a backup when `point`
/// is `None` — and the record as it is stored.
fn at_snapshot_point(
    record: &[u8],
    point: Option<(u64, u64)>,
    what: &str,
) -> Result<(CheckpointFile, Vec<u8>), Error> {
    let mut cp: CheckpointFile = serde_json::from_slice(record)
        .map_err(|e| Error::io(format!("unreadable checkpoint record in {what}: {e}")))?;
    crate::format::check_version(cp.format, what)?;
    let (index, term) = point.unwrap_or((cp.applied_index, RESTORED_TERM));
    if point.is_none() {
        // a backup keeps streams, not staged COPYs: they end with the cluster they ran in
        cp.copies.clear();
    }
    cp.applied_index = index;
    cp.snapshot_point = (index > 0).then_some((index, term));
    let stored = serde_json::to_vec(&cp).map_err(|e| Error::io(e.to_string()))?;
    Ok((cp, stored))
}

/// The directory of a data directory's streams (a backup's `streams/` mirrors it).
pub(crate) fn streams_dir(dir: &Path) -> PathBuf {
    dir.join(STREAMS_DIR)
}

/// Writes the table store of the new data directory `dir` from a backup's state file, as a
/// follower installs a snapshot: tables and the checkpoint record in one durable
/// transaction, the record marked as a snapshot point so that the first start builds the
/// Raft log at it. The stream files must already be in place. Returns the applied index.
pub(crate) fn restore_backup_state(dir: &Path, state: &[u8]) -> Result<u64, Error> {
    let snap = SnapshotState::decode(state)
        .map_err(|e| Error::io(format!("undecodable backup state: {e}")))?;
    let (cp, record) = at_snapshot_point(&snap.record, None, "the backup")?;
    let (store, existing) = TableStore::open(&dir.join(TABLES_FILE))?;
    if existing.is_some() {
        return Err(Error::io(format!(
            "{} already holds a database",
            dir.display()
        )));
    }
    store.replace_all(
        raw_tables(snap.tables),
        &record,
        cp.applied_index,
        cp.table_versions.iter().copied(),
    )?;
    Ok(cp.applied_index)
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
    tables: Arc<TableStore>,
    /// Tables dropped since the last checkpoint (their rows go at the next).
    dropped_tables: Vec<u64>,
    /// Directories of streams the command being applied dropped: removed once a
    /// checkpoint taken after the whole command no longer names them.
    dropped_streams: Vec<PathBuf>,
    /// Directories of streams and copies dropped by commands applied whole: the next
    /// checkpoint deletes them once it is durable.
    doomed: Vec<PathBuf>,
    /// See [`CheckpointFile::snapshot_point`].
    snapshot_point: Option<(u64, u64)>,
    /// Open staged COPYs by id (see `apply/copies.rs`).
    copies: std::collections::BTreeMap<u64, copies::StagedCopy>,
    /// Streams with appends staged in memory since the last [`StateMachine::applied`]:
    /// a Raft batch's appends to one stream are written with one `pwrite` and shown to
    /// readers together when the batch is done, before any proposer is answered.
    staged: Vec<Arc<crate::catalog::Stream>>,
    /// The checkpoint whose I/O runs on the checkpoint thread (see `apply/checkpoint.rs`).
    checkpoint_in_flight: Option<checkpoint::InFlight>,
    /// Index of the newest checkpoint made durable and not yet reported to the node.
    checkpoint_done: Option<u64>,
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
        let (tables, record) = TableStore::open(&dir.join(TABLES_FILE))?;
        let cp_path = dir.join(LEGACY_CHECKPOINT_FILE);
        let cp: CheckpointFile = match record {
            Some(bytes) => serde_json::from_slice(&bytes)
                .map_err(|e| Error::io(format!("unreadable checkpoint record: {e}")))?,
            None => match fs::read(&cp_path) {
                Ok(bytes) => serde_json::from_slice(&bytes)
                    .map_err(|e| Error::io(format!("unreadable {}: {e}", cp_path.display())))?,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => CheckpointFile {
                    format: crate::format::FORMAT_VERSION,
                    ..CheckpointFile::default()
                },
                Err(e) => return Err(Error::io(format!("{}: {e}", cp_path.display()))),
            },
        };
        crate::format::check_version(cp.format, "the checkpoint record")?;
        let next_oid = load_catalog(dir, &catalog, &tables, &cp, default_segment_bytes)?;
        let copies = copies::open_copies(dir, &cp.copies, default_segment_bytes)?;
        Ok(Database {
            copies,
            tables: Arc::new(tables),
            dropped_tables: Vec::new(),
            dropped_streams: Vec::new(),
            doomed: Vec::new(),
            snapshot_point: cp.snapshot_point,
            next_oid,
            dir: dir.to_path_buf(),
            catalog,
            stats,
            applied: cp.applied_index,
            checkpointed: cp.applied_index,
            default_segment_bytes,
            staged: Vec::new(),
            checkpoint_in_flight: None,
            checkpoint_done: None,
        })
    }

    /// Drop dedup index entries no append can match any more (older than
    /// the window before the stream's last commit time; commit times never
    /// decrease). Outcomes don't change: an expired entry counts as absent.
    fn prune_dedup(&self) -> Result<(), String> {
        let snap = self.tables.snapshot();
        let mut writes = Vec::new();
        for s in self.catalog.list() {
            if s.def.options.dedup_key.is_none() {
                continue;
            }
            let window = s
                .def
                .options
                .dedup_window_ms
                .unwrap_or(DEFAULT_DEDUP_WINDOW_MS) as i64
                * 1000;
            let horizon = s.next_ts(i64::MIN).saturating_sub(window);
            let id = dedup_table_id(s.def.id);
            for (key, v) in snap.scan(id).map_err(|e| e.to_string())? {
                if decode_dedup(&v.row).is_some_and(|(_, ts)| ts < horizon) {
                    writes.push(Write {
                        table: id,
                        key,
                        row: None,
                    });
                }
            }
        }
        if !writes.is_empty() {
            self.tables.apply(self.applied, writes);
        }
        Ok(())
    }

    /// Checkpoint, then the whole database as of that checkpoint: the record, every table
    /// (the delta is empty right after a checkpoint) and every stream file (exactly at the
    /// checkpointed positions: nothing appends between the checkpoint and the read, both run
    /// on the state-machine thread).
    fn take_snapshot(&mut self) -> Result<(u64, Vec<u8>), String> {
        let index = self.applied;
        let record = self.write_checkpoint_record(index)?;
        let tables = snapshot_tables(self.tables.dump().map_err(|e| e.to_string())?);
        let mut files = Vec::new();
        let streams_dir = self.dir.join(STREAMS_DIR);
        let io = |p: &Path, e: std::io::Error| format!("{}: {e}", p.display());
        let streams = self.catalog.list();
        let dirs = streams.iter().map(|s| stream_dir(&self.dir, s.def.id));
        for sdir in dirs.chain(self.copy_dirs()) {
            let mut names: Vec<PathBuf> = fs::read_dir(&sdir)
                .map_err(|e| io(&sdir, e))?
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.is_file())
                .collect();
            names.sort();
            for path in names {
                let data = fs::read(&path).map_err(|e| io(&path, e))?;
                let rel = path
                    .strip_prefix(&streams_dir)
                    .map_err(|e| e.to_string())?
                    .to_string_lossy()
                    .into_owned();
                files.push(SnapshotFile { path: rel, data });
            }
        }
        let state = SnapshotState {
            record,
            tables,
            files,
        };
        Ok((index, state.encode_to_vec()))
    }

    /// Replace everything with a leader's snapshot taken at `index` (Raft term `term`):
    /// stream files first (each fsynced), then tables and the checkpoint record in one
    /// durable transaction, then the catalog is rebuilt from that record.
    fn restore_snapshot(&mut self, index: u64, term: u64, data: &[u8]) -> Result<(), String> {
        self.collect_checkpoint(true)?;
        // every stream directory is replaced: nothing dropped here is left to delete
        self.doomed.clear();
        self.catalog.begin_restore();
        let restored = self.restore_snapshot_files(index, term, data);
        self.catalog.end_restore();
        restored
    }

    fn restore_snapshot_files(&mut self, index: u64, term: u64, data: &[u8]) -> Result<(), String> {
        let snap = SnapshotState::decode(data).map_err(|e| format!("undecodable snapshot: {e}"))?;
        let (cp, record) = at_snapshot_point(&snap.record, Some((index, term)), "the snapshot")
            .map_err(|e| e.message)?;
        let io = |p: &Path, e: std::io::Error| format!("{}: {e}", p.display());
        // Old streams went first (`begin_restore`): their open files must not see the new
        // contents.
        let streams_dir = self.dir.join(STREAMS_DIR);
        match fs::remove_dir_all(&streams_dir) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(io(&streams_dir, e)),
        }
        fs::create_dir_all(&streams_dir).map_err(|e| io(&streams_dir, e))?;
        let mut dirs = std::collections::BTreeSet::new();
        for f in &snap.files {
            let rel = Path::new(&f.path);
            if rel.is_absolute()
                || rel
                    .components()
                    .any(|c| !matches!(c, std::path::Component::Normal(_)))
            {
                return Err(format!(
                    "snapshot file path {:?} escapes the data directory",
                    f.path
                ));
            }
            let path = streams_dir.join(rel);
            if let Some(parent) = path.parent() {
                fs::create_dir_all(parent).map_err(|e| io(parent, e))?;
                dirs.insert(parent.to_path_buf());
            }
            durable::write_synced(&path, &f.data).map_err(|e| e.to_string())?;
        }
        dirs.insert(streams_dir.clone());
        dirs.insert(self.dir.clone()); // it holds the new streams/ directory
        for d in dirs {
            durable::sync_dir(&d).map_err(|e| e.to_string())?;
        }
        self.tables
            .replace_all(
                raw_tables(snap.tables),
                &record,
                index,
                cp.table_versions.iter().copied(),
            )
            .map_err(|e| e.to_string())?;
        self.next_oid = load_catalog(
            &self.dir,
            &self.catalog,
            &self.tables,
            &cp,
            self.default_segment_bytes,
        )
        .map_err(|e| e.to_string())?;
        self.copies = copies::open_copies(&self.dir, &cp.copies, self.default_segment_bytes)
            .map_err(|e| e.to_string())?;
        self.applied = index;
        self.checkpointed = index;
        self.staged.clear(); // streams of the replaced state
        self.dropped_tables.clear();
        self.snapshot_point = cp.snapshot_point;
        Ok(())
    }

    /// Decide, before anything is applied, which rows of appends to
    /// streams with a `dedup_key` are duplicates: of a row appended within
    /// `dedup_window` before this command's commit time (the dedup index
    /// lives in the table store, so it is checkpointed and replicated like
    /// a table), or of an earlier row of the same command. Keyed by op.
    fn plan_dedup(&self, cmd: &Command) -> Result<HashMap<usize, DedupPlan>, Error> {
        let mut plans = HashMap::new();
        let mut snap = None;
        // per stream: next offset and rows kept so far in this command
        let mut next: HashMap<u64, u64> = HashMap::new();
        let mut seen: HashMap<(u64, Vec<u8>), (u64, i64)> = HashMap::new();
        for (i, o) in cmd.ops.iter().enumerate() {
            let Some(op::Kind::Append(a)) = &o.kind else {
                continue;
            };
            // a stream the command creates has no dedup index yet (a block may not
            // write one with a dedup_key); the name may still be an older stream's
            if a.stream_id >= LOCAL_ID_BASE {
                continue;
            }
            let Some(stream) = self.catalog.get(&a.stream) else {
                continue;
            };
            let Some(key_col) = stream.def.options.dedup_key.as_ref() else {
                continue;
            };
            let Some(col) = stream.def.columns.iter().position(|c| &c.name == key_col) else {
                continue;
            };
            let window = stream
                .def
                .options
                .dedup_window_ms
                .unwrap_or(DEFAULT_DEDUP_WINDOW_MS) as i64
                * 1000;
            let snap = snap.get_or_insert_with(|| self.tables.snapshot());
            let batch = crate::ipc::decode_ipc(&a.ipc)?;
            let ts = stream.next_ts(cmd.ts_micros);
            let id = dedup_table_id(stream.def.id);
            let first = *next
                .entry(stream.def.id)
                .or_insert_with(|| stream.log.write_offset());
            let mut offset = first;
            let mut keep = Vec::with_capacity(batch.num_rows());
            let mut row_offsets = Vec::with_capacity(batch.num_rows());
            let mut entries = Vec::new();
            let keys = batch.column(col);
            for r in 0..batch.num_rows() {
                let v = datafusion::scalar::ScalarValue::try_from_array(keys, r)
                    .map_err(|e| Error::internal(e.to_string()))?;
                if v.is_null() {
                    keep.push(true);
                    row_offsets.push((offset, ts));
                    offset += 1;
                    continue;
                }
                let key = crate::table::codec::encode_key(&[&v])?;
                let earlier = match seen.get(&(id, key.clone())) {
                    Some(e) => Some(*e),
                    None => snap.get(id, &key)?.and_then(|e| decode_dedup(&e.row)),
                };
                match earlier {
                    Some((off, at)) if at >= ts - window => {
                        keep.push(false);
                        row_offsets.push((off, at));
                    }
                    _ => {
                        keep.push(true);
                        row_offsets.push((offset, ts));
                        seen.insert((id, key.clone()), (offset, ts));
                        let mut row = Vec::with_capacity(16);
                        row.extend(offset.to_le_bytes());
                        row.extend(ts.to_le_bytes());
                        entries.push(Write {
                            table: id,
                            key,
                            row: Some(Arc::from(row.as_slice())),
                        });
                        offset += 1;
                    }
                }
            }
            next.insert(stream.def.id, offset);
            let kept = (offset - first) as u32;
            let ipc = if kept as usize == batch.num_rows() {
                None
            } else if kept == 0 {
                Some(Vec::new())
            } else {
                let mask = arrow::array::BooleanArray::from(keep);
                let filtered = arrow::compute::filter_record_batch(&batch, &mask)
                    .map_err(|e| Error::internal(e.to_string()))?;
                Some(crate::ipc::encode_ipc_with(
                    &crate::ipc::ipc_schema_message(&filtered.schema())?,
                    &filtered,
                    stream.def.options.compression.arrow(),
                )?)
            };
            plans.insert(
                i,
                DedupPlan {
                    ipc,
                    rows: kept,
                    first_offset: first,
                    row_offsets,
                    entries,
                },
            );
        }
        Ok(plans)
    }

    /// The table store, for sessions to read.
    pub fn table_store(&self) -> Arc<TableStore> {
        self.tables.clone()
    }

    /// Validate the table part of a command (its reads, then its writes in
    /// order) against the current state, and return the row changes.
    /// `creates_table`: the command's `CreateTable` ops that create (see `validate`).
    fn plan_table_writes(
        &self,
        index: u64,
        cmd: &Command,
        creates_table: &[usize],
    ) -> Result<Vec<Write>, Error> {
        let writes_tables = cmd
            .ops
            .iter()
            .any(|o| matches!(o.kind, Some(op::Kind::TableWrite(_))));
        if !writes_tables && cmd.reads.is_empty() {
            return Ok(Vec::new());
        }
        let conflict = || {
            let mut e = Error::new(
                sqlstate::SERIALIZATION_FAILURE,
                "could not serialize access due to read/write dependencies among transactions",
            );
            e.detail = Some(
                "Rows this transaction read were changed by a transaction that committed after it started."
                    .into(),
            );
            e
        };
        let snap = self.tables.snapshot();
        for r in &cmd.reads {
            if self.catalog.table_by_id(r.table_id).is_none() {
                return Err(conflict());
            }
            let v = snap.versions(r.table_id);
            let changed = match &r.key {
                Some(k) => match snap.get(r.table_id, k)? {
                    Some(row) => row.version > cmd.snapshot,
                    None => v.last_delete > cmd.snapshot,
                },
                None => v.last_write > cmd.snapshot,
            };
            if changed {
                return Err(conflict());
            }
        }
        let mut seen: HashMap<(u64, Vec<u8>), bool> = HashMap::new();
        let mut writes = Vec::new();
        let mut created: HashMap<usize, Arc<Table>> = HashMap::new();
        for (i, o) in cmd.ops.iter().enumerate() {
            let Some(op::Kind::TableWrite(w)) = &o.kind else {
                continue;
            };
            let table = if w.table_id >= LOCAL_ID_BASE {
                let j = (w.table_id - LOCAL_ID_BASE) as usize;
                match created.get(&j) {
                    Some(t) => t.clone(),
                    None => {
                        let t = created_table(index, cmd, i, j, &w.table, creates_table)?;
                        created.insert(j, t.clone());
                        t
                    }
                }
            } else {
                self.write_target(w)?
            };
            let k = (table.def.id, w.key.clone());
            let exists = match seen.get(&k) {
                Some(e) => *e,
                None => snap.get(table.def.id, &w.key)?.is_some(),
            };
            if w.kind == write_kind::INSERT && exists {
                return Err(table.duplicate(&table.decode(&w.row)?));
            }
            let row = (w.kind != write_kind::DELETE).then(|| Arc::from(w.row.as_slice()));
            seen.insert(k, row.is_some());
            writes.push(Write {
                table: table.def.id,
                key: w.key.clone(),
                row,
            });
        }
        Ok(writes)
    }

    /// The existing table a write names, if it is still the one the transaction wrote.
    fn write_target(&self, w: &crate::command::TableWrite) -> Result<Arc<Table>, Error> {
        let table = self
            .catalog
            .table(&w.table)
            .ok_or_else(|| Error::undefined_table(&w.table))?;
        if table.def.id != w.table_id {
            return Err(Error::new(
                sqlstate::SERIALIZATION_FAILURE,
                format!(
                    "table \"{}\" was dropped and re-created while the transaction ran",
                    w.table
                ),
            ));
        }
        Ok(table)
    }

    /// Check every op against the catalog as it will be when the op runs. Returns the
    /// positions of the `CreateTable` ops that create a table (not skipped by `IF NOT
    /// EXISTS`).
    fn validate(&self, cmd: &Command) -> Result<Vec<usize>, Error> {
        check_mix(cmd)?;
        // name -> Some(id) exists / None dropped, for names touched earlier in the command
        let mut overlay: HashMap<&str, Option<u64>> = HashMap::new();
        let exists = |overlay: &HashMap<&str, Option<u64>>, name: &str| -> Option<u64> {
            match overlay.get(name) {
                Some(v) => *v,
                None => self
                    .catalog
                    .get(name)
                    .map(|s| s.def.id)
                    .or_else(|| self.catalog.table(name).map(|t| t.def.id))
                    .or_else(|| self.catalog.view(name).map(|v| v.def.id)),
            }
        };
        let mut creates_table = Vec::new();
        // name -> is a view, for names the command's earlier ops created
        let mut made: HashMap<&str, bool> = HashMap::new();
        for (i, o) in cmd.ops.iter().enumerate() {
            match &o.kind {
                Some(op::Kind::CreateStream(crate::command::CreateStream {
                    name,
                    if_not_exists,
                    ..
                }))
                | Some(op::Kind::CreateTable(crate::command::CreateTable {
                    name,
                    if_not_exists,
                    ..
                })) => {
                    if exists(&overlay, name).is_some() || self.catalog.index(name).is_some() {
                        if !if_not_exists {
                            return Err(Error::new(
                                sqlstate::DUPLICATE_TABLE,
                                format!("relation \"{name}\" already exists"),
                            ));
                        }
                    } else {
                        overlay.insert(name, Some(0));
                        made.insert(name, false);
                        if matches!(o.kind, Some(op::Kind::CreateTable(_))) {
                            creates_table.push(i);
                        }
                    }
                }
                Some(op::Kind::TableWrite(_))
                | Some(op::Kind::RoleChange(_))
                | Some(op::Kind::DropIndex(_)) => {}
                // the rest is checked with the entries (`plan_indexes`)
                Some(op::Kind::CreateIndex(c)) => {
                    if exists(&overlay, &c.name).is_some() && !c.if_not_exists {
                        return Err(indexes::relation_exists(&c.name));
                    }
                }
                Some(op::Kind::CreateView(c)) => {
                    let replaces = self.validate_create_view(c, &|n| exists(&overlay, n))?;
                    if !replaces {
                        overlay.insert(&c.name, Some(0));
                        made.insert(&c.name, true);
                    }
                }
                Some(op::Kind::DropRelation(d)) => {
                    if d.name == CONSUMER_OFFSETS {
                        return Err(Error::new(
                            sqlstate::INSUFFICIENT_PRIVILEGE,
                            format!("permission denied: \"{CONSUMER_OFFSETS}\" is a system table"),
                        ));
                    }
                    if exists(&overlay, &d.name).is_none() {
                        if !d.if_exists {
                            return Err(Error::undefined_table(&d.name));
                        }
                    } else {
                        let is_view = made
                            .get(d.name.as_str())
                            .copied()
                            .unwrap_or_else(|| self.catalog.view(&d.name).is_some());
                        self.validate_drop(d, is_view, cmd)?;
                        overlay.insert(&d.name, None);
                    }
                }
                Some(op::Kind::Append(a)) => {
                    check_target(exists(&overlay, &a.stream), &a.stream, a.stream_id)?
                }
                Some(op::Kind::Truncate(t)) => {
                    check_target(exists(&overlay, &t.stream), &t.stream, t.stream_id)?
                }
                Some(op::Kind::CopyChunk(c)) => {
                    self.validate_chunk(c, exists(&overlay, &c.stream))?
                }
                Some(op::Kind::CopyCommit(c)) => {
                    self.validate_commit(c, exists(&overlay, &c.stream))?
                }
                Some(op::Kind::CopyAbort(_)) => {}
                Some(op::Kind::AlterStream(a)) => {
                    let id = exists(&overlay, &a.name);
                    check_target(id, &a.name, a.stream_id)?;
                    if let Some(stream) = self.catalog.get(&a.name) {
                        crate::alter::new_definition(&stream, a)?;
                        self.check_no_dependents(a)?;
                    }
                    if !a.new_name.is_empty() && a.new_name != a.name {
                        if exists(&overlay, &a.new_name).is_some() {
                            return Err(Error::new(
                                sqlstate::DUPLICATE_TABLE,
                                format!("relation \"{}\" already exists", a.new_name),
                            ));
                        }
                        overlay.insert(&a.name, None);
                        overlay.insert(&a.new_name, id);
                    }
                }
                None => return Err(Error::internal("empty op in command")),
            }
        }
        Ok(creates_table)
    }

    fn apply_command(&mut self, index: u64, cmd: Command) -> Result<CommandResult, String> {
        if !self.copies.is_empty() {
            self.expire_copies(cmd.ts_micros);
        }
        let result = self.apply_ops(index, cmd)?;
        self.remove_dropped_streams();
        Ok(result)
    }

    /// The files of streams (and copies) the command dropped go once a checkpoint of the
    /// state the whole command left is durable (a recovered checkpoint never names a deleted
    /// segment, and never holds half a command): the next checkpoint deletes them, and the
    /// node starts one at once ([`StateMachine::checkpoint_wanted`]).
    fn remove_dropped_streams(&mut self) {
        self.doomed.append(&mut self.dropped_streams);
    }

    fn apply_ops(&mut self, index: u64, cmd: Command) -> Result<CommandResult, String> {
        let creates_table = match self.validate(&cmd) {
            Ok(c) => c,
            Err(e) => return Ok(Err(e)),
        };
        let dropped_before = self.dropped_tables.len();
        let creates_index = cmd
            .ops
            .iter()
            .any(|o| matches!(o.kind, Some(op::Kind::CreateIndex(_))));
        let mut table_writes = match self.plan_table_writes(index, &cmd, &creates_table) {
            Ok(w) => w,
            Err(e) => return Ok(Err(e)),
        };
        match self.plan_indexes(index, &cmd, &creates_table, &table_writes) {
            Ok(entries) => table_writes.extend(entries),
            Err(e) => return Ok(Err(e)),
        }
        let mut dedup = match self.plan_dedup(&cmd) {
            Ok(d) => d,
            Err(e) => return Ok(Err(e)),
        };
        let mut outcomes = Vec::with_capacity(cmd.ops.len());
        for (i, o) in cmd.ops.into_iter().enumerate() {
            let outcome = match o.kind {
                Some(op::Kind::CreateStream(c)) => self.create_stream(index, i, c)?,
                Some(op::Kind::CreateTable(c)) => self.create_table(index, i, c)?,
                Some(op::Kind::TableWrite(_)) => Ok(OpOutcome::Written),
                Some(op::Kind::DropRelation(d)) => self.drop_relation(index, d)?,
                Some(op::Kind::Append(a)) => {
                    let plan = dedup.remove(&i);
                    self.append(a, cmd.ts_micros, plan, &mut table_writes)?
                }
                Some(op::Kind::Truncate(t)) => self.truncate(index, t)?,
                Some(op::Kind::RoleChange(r)) => self.change_roles(r),
                Some(op::Kind::AlterStream(a)) => self.alter_stream(a),
                Some(op::Kind::CreateView(c)) => self.create_view(index, i, c)?,
                Some(op::Kind::CreateIndex(c)) => self.create_index(index, i, c)?,
                Some(op::Kind::DropIndex(d)) => self.drop_index(index, d)?,
                Some(op::Kind::CopyChunk(c)) => self.stage_chunk(index, c, cmd.ts_micros)?,
                Some(op::Kind::CopyCommit(c)) => self.commit_copy(c, cmd.ts_micros)?,
                Some(op::Kind::CopyAbort(c)) => self.abort_copy(c)?,
                None => Err(Error::internal("empty op in command")),
            };
            match outcome {
                Ok(outcome) => outcomes.push(outcome),
                Err(e) => return Ok(Err(e)),
            }
        }
        // rows of a table the command dropped after writing it are not kept
        if let Some(dead) = self.dropped_tables.get(dropped_before..) {
            table_writes.retain(|w| !dead.contains(&w.table));
        }
        if !table_writes.is_empty() {
            // a command's rows are visible no later than its table writes (a consumer's
            // committed offset never shows before the rows it wrote)
            self.publish_staged()?;
            self.tables.apply(index, table_writes);
            if self.tables.delta_bytes() > MAX_TABLE_DELTA_BYTES {
                self.write_checkpoint(index)?;
            }
        } else if creates_index {
            // an index with no entries: snapshots from now on may read it
            self.tables.advance(index);
        }
        self.stats.applied_commands.fetch_add(1, Ordering::Relaxed);
        Ok(Ok(outcomes))
    }

    /// `CREATE STREAM` (op `i` of the command at `index`): its id and OID
    /// are derived from where it applies, so every replica agrees.
    fn create_stream(&mut self, index: u64, i: usize, c: crate::command::CreateStream) -> Applied {
        if self.catalog.get(&c.name).is_some() {
            return Ok(Ok(OpOutcome::Created { existed: true }));
        }
        let mut def: StreamDef = match serde_json::from_str(&c.definition_json) {
            Ok(d) => d,
            Err(e) => return Ok(Err(Error::internal(format!("bad stream definition: {e}")))),
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
        self.owned_by(&c.name, &c.owner);
        Ok(Ok(OpOutcome::Created { existed: false }))
    }

    /// `CREATE TABLE`: like a stream, plus an OID for its primary key index.
    fn create_table(&mut self, index: u64, i: usize, c: crate::command::CreateTable) -> Applied {
        if self.catalog.exists(&c.name) {
            return Ok(Ok(OpOutcome::Created { existed: true }));
        }
        let mut def: TableDef = match serde_json::from_str(&c.definition_json) {
            Ok(d) => d,
            Err(e) => return Ok(Err(Error::internal(format!("bad table definition: {e}")))),
        };
        def.id = index * 1024 + i as u64 + 1;
        def.name = c.name.clone();
        def.oid = self.next_oid;
        self.next_oid += 1;
        if !def.primary_key.is_empty() {
            def.index_oid = self.next_oid;
            self.next_oid += 1;
        }
        self.tables.reset_table(index, def.id);
        self.catalog.insert_table(Arc::new(Table::new(def)));
        self.owned_by(&c.name, &c.owner);
        Ok(Ok(OpOutcome::Created { existed: false }))
    }

    /// `ALTER STREAM`: the same stream — its log, tails and dedup keys — under new options
    /// and possibly a new name (its ownership and grants follow it).
    fn alter_stream(&mut self, a: crate::command::AlterStream) -> Result<OpOutcome, Error> {
        let stream = match self.catalog.get(&a.name) {
            Some(s) if s.def.id == a.stream_id => s,
            _ => return Err(Error::undefined_table(&a.name)),
        };
        let def = crate::alter::new_definition(&stream, &a)?;
        let renamed = !a.new_name.is_empty() && a.new_name != a.name;
        self.catalog.replace(&a.name, Arc::new(stream.altered(def)));
        if renamed {
            let mut roles = (*self.catalog.roles()).clone();
            roles.renamed(&a.name, &a.new_name);
            self.catalog.set_roles(roles);
        }
        Ok(OpOutcome::Altered)
    }

    /// A relation just created belongs to `owner` (empty: to the superuser).
    fn owned_by(&self, relation: &str, owner: &str) {
        let mut roles = (*self.catalog.roles()).clone();
        roles.created(relation, (!owner.is_empty()).then_some(owner));
        self.catalog.set_roles(roles);
    }

    /// `CREATE ROLE`, `GRANT` and the like: validated and applied whole, or not at all.
    fn change_roles(&mut self, r: crate::command::RoleChange) -> Result<OpOutcome, Error> {
        let change: RoleChange = serde_json::from_str(&r.change_json)
            .map_err(|e| Error::internal(format!("bad role change: {e}")))?;
        let catalog = self.catalog.clone();
        let exists = move |n: &str| catalog.exists(n);
        let mut all: Vec<String> = self
            .catalog
            .list()
            .iter()
            .map(|s| s.name().to_string())
            .collect();
        all.extend(
            self.catalog
                .tables()
                .iter()
                .filter(|t| t.def.name != CONSUMER_OFFSETS)
                .map(|t| t.def.name.clone()),
        );
        all.extend(self.catalog.views().iter().map(|v| v.def.name.clone()));
        let view = CatalogView {
            exists: &exists,
            all_relations: all,
        };
        let mut roles = (*self.catalog.roles()).clone();
        let mut next_oid = self.next_oid;
        roles.apply(change, &view, &mut next_oid)?;
        self.next_oid = next_oid;
        self.catalog.set_roles(roles);
        Ok(OpOutcome::RolesChanged)
    }

    /// `DROP STREAM` / `DROP TABLE` (either drops either): a stream's
    /// files go after the command, once a checkpoint no longer names them.
    fn drop_relation(&mut self, index: u64, d: crate::command::DropRelation) -> Applied {
        if d.cascade {
            self.drop_dependents(&d.name);
        }
        if self.catalog.view(&d.name).is_some() {
            self.drop_view(&d.name);
            return Ok(Ok(OpOutcome::Dropped { existed: true }));
        }
        if self.catalog.exists(&d.name) {
            let mut roles = (*self.catalog.roles()).clone();
            roles.dropped(&d.name);
            self.catalog.set_roles(roles);
        }
        if self.catalog.get(&d.name).is_none() {
            return Ok(Ok(match self.catalog.remove_table(&d.name) {
                Some(t) => {
                    self.tables.reset_table(index, t.def.id);
                    self.dropped_tables.push(t.def.id);
                    self.drop_table_indexes(index, &t);
                    OpOutcome::Dropped { existed: true }
                }
                None => OpOutcome::Dropped { existed: false },
            }));
        }
        let Some(stream) = self.catalog.remove(&d.name) else {
            return Ok(Ok(OpOutcome::Dropped { existed: false }));
        };
        // its staged rows are never shown (nor written: the directory goes)
        self.staged.retain(|s| s.def.id != stream.def.id);
        if stream.def.options.dedup_key.is_some() {
            let id = dedup_table_id(stream.def.id);
            self.tables.reset_table(index, id);
            self.dropped_tables.push(id);
        }
        self.dropped_streams
            .push(stream_dir(&self.dir, stream.def.id));
        Ok(Ok(OpOutcome::Dropped { existed: true }))
    }

    /// An append at the stream's next offset, stamped no earlier than
    /// `ts_micros`; a dedup stream appends only its plan's new rows and
    /// records their keys with the command's table writes.
    fn append(
        &mut self,
        a: crate::command::Append,
        ts_micros: i64,
        plan: Option<DedupPlan>,
        table_writes: &mut Vec<Write>,
    ) -> Applied {
        let Some(stream) = self.catalog.get(&a.stream) else {
            return Ok(Err(Error::undefined_table(&a.stream)));
        };
        let ts = stream.next_ts(ts_micros);
        // the proposer's logical length holds for its own bytes, not a dedup plan's
        let given = (a.logical_len > 0).then_some(a.logical_len);
        let (ipc, rows, logical_len) = match &plan {
            Some(DedupPlan {
                ipc: Some(ipc),
                rows,
                ..
            }) => (ipc.as_slice(), *rows, None),
            Some(p) => (&a.ipc[..], p.rows, given),
            None => (&a.ipc[..], a.rows, given),
        };
        let base = if rows == 0 {
            stream.log.write_offset()
        } else {
            let base = stream
                .log
                .append_staged(ipc, rows, ts, logical_len)
                .map_err(|e| e.to_string())?;
            stream.stamp(ts);
            if !self.staged.iter().any(|s| s.def.id == stream.def.id) {
                self.staged.push(stream);
            }
            base
        };
        self.stats
            .appended_rows
            .fetch_add(rows as u64, Ordering::Relaxed);
        let row_offsets = match plan {
            Some(p) => {
                if p.first_offset != base {
                    return Err(format!(
                        "dedup predicted offset {} but the append got {base}",
                        p.first_offset
                    ));
                }
                table_writes.extend(p.entries);
                p.row_offsets
            }
            None => Vec::new(),
        };
        Ok(Ok(OpOutcome::Appended {
            stream: a.stream,
            base_offset: base,
            rows,
            ts_micros: ts,
            row_offsets,
        }))
    }

    /// Writes the appends staged since the last call and shows them to readers (waking
    /// their tails). A failed write is a disk failure: the node stops.
    fn publish_staged(&mut self) -> Result<(), String> {
        for stream in std::mem::take(&mut self.staged) {
            stream.log.publish().map_err(|e| e.to_string())?;
            stream.record_append(stream.next_ts(i64::MIN));
        }
        Ok(())
    }

    /// A prefix truncation, after a checkpoint of the state before it (the
    /// checkpoint references the active segment, which is never deleted).
    fn truncate(&mut self, index: u64, t: crate::command::Truncate) -> Applied {
        let Some(stream) = self.catalog.get(&t.stream) else {
            return Ok(Err(Error::undefined_table(&t.stream)));
        };
        self.write_checkpoint(index - 1)?;
        let first = {
            let _deleting = self.catalog.stream_file_deletions();
            stream.log.truncate_prefix(t.before)
        }
        .map_err(|e| e.to_string())?;
        stream.record_append(stream.next_ts(i64::MIN));
        Ok(Ok(OpOutcome::Truncated {
            first_offset: first,
        }))
    }
}

/// Ops that may not share a command. A truncation checkpoints while it applies; table
/// writes reach the store at the end of the command: keeping them in separate commands
/// keeps every checkpoint exact (a drop checkpoints after the whole command: see
/// `remove_dropped_streams`). A role change is validated and applied on its own.
fn check_mix(cmd: &Command) -> Result<(), Error> {
    let has = |f: fn(&op::Kind) -> bool| cmd.ops.iter().any(|o| o.kind.as_ref().is_some_and(f));
    if has(|k| matches!(k, op::Kind::RoleChange(_))) && cmd.ops.len() > 1 {
        return Err(Error::internal(
            "a role change must be a command of its own",
        ));
    }
    let copy = |k: &op::Kind| {
        matches!(
            k,
            op::Kind::CopyChunk(_) | op::Kind::CopyCommit(_) | op::Kind::CopyAbort(_)
        )
    };
    if has(copy) && cmd.ops.iter().any(|o| !o.kind.as_ref().is_some_and(copy)) {
        return Err(Error::internal(
            "a staged COPY's ops must be a command of their own",
        ));
    }
    if has(|k| matches!(k, op::Kind::Truncate(_))) && has(|k| matches!(k, op::Kind::TableWrite(_)))
    {
        return Err(Error::unsupported(
            "prefix truncation cannot commit together with table writes",
        ));
    }
    Ok(())
}

/// The table op `j` of the command at `index` creates, for a write at op `i` that names it
/// by its local id (see [`crate::block_catalog`]): with the id `create_table` gives it.
fn created_table(
    index: u64,
    cmd: &Command,
    i: usize,
    j: usize,
    name: &str,
    creates_table: &[usize],
) -> Result<Arc<Table>, Error> {
    let create = match cmd.ops.get(j).and_then(|o| o.kind.as_ref()) {
        Some(op::Kind::CreateTable(c)) if j < i && c.name == name => c,
        _ => {
            return Err(Error::internal(format!(
                "a write to \"{name}\" names a table its command does not create"
            )))
        }
    };
    if !creates_table.contains(&j) {
        // CREATE TABLE IF NOT EXISTS found one another transaction committed meanwhile
        return Err(Error::new(
            sqlstate::SERIALIZATION_FAILURE,
            format!("table \"{name}\" was created by another transaction while this one ran"),
        ));
    }
    let mut def: TableDef = serde_json::from_str(&create.definition_json)
        .map_err(|e| Error::internal(format!("bad table definition: {e}")))?;
    def.id = index * 1024 + j as u64 + 1;
    def.name = name.to_string();
    Ok(Arc::new(Table::new(def)))
}

/// Default `dedup_window` of a stream with a `dedup_key`.
pub const DEFAULT_DEDUP_WINDOW_MS: u64 = 5 * 60 * 1000;

/// The table-store id of a stream's dedup index (high bit set: never a
/// table's id).
/// Rebuilds the catalog from a checkpoint record: tables, then every stream opened at its
/// durable position (dropping anything later, which the Raft log replays); removes stream
/// directories the record does not know. Returns the next OID to hand out.
fn load_catalog(
    dir: &Path,
    catalog: &Catalog,
    tables: &TableStore,
    cp: &CheckpointFile,
    default_segment_bytes: u64,
) -> Result<u32, Error> {
    let streams_dir = dir.join(STREAMS_DIR);
    catalog.insert_table(Arc::new(Table::new(TableDef::consumer_offsets())));
    catalog.set_roles(cp.roles.clone());
    for def in &cp.views {
        catalog.insert_view(Arc::new(crate::views::parse(def.clone())?));
    }
    for def in &cp.tables {
        catalog.insert_table(Arc::new(Table::new(def.clone())));
    }
    tables.restore(cp.applied_index, cp.table_versions.iter().copied());
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
    known.extend(cp.copies.iter().map(|c| copies::copy_dir(dir, c.id)));
    if let Ok(entries) = fs::read_dir(&streams_dir) {
        for entry in entries.flatten() {
            let p = entry.path();
            if !known.contains(&p) {
                tracing::info!(path = %p.display(), "removing stream directory not in the checkpoint");
                let _ = fs::remove_dir_all(&p);
            }
        }
    }
    Ok(next_oid)
}

fn dedup_table_id(stream_id: u64) -> u64 {
    stream_id | 1 << 63
}

/// An index entry: (offset, ts) of the row first appended with the key.
fn decode_dedup(row: &[u8]) -> Option<(u64, i64)> {
    let off: [u8; 8] = row.get(..8)?.try_into().ok()?;
    let ts: [u8; 8] = row.get(8..16)?.try_into().ok()?;
    Some((u64::from_le_bytes(off), i64::from_le_bytes(ts)))
}

/// What applying one op gives: its outcome, a deterministic rejection
/// that fails the command on every replica (inner `Err`), or a failure
/// that stops the node (outer `Err`, as [`StateMachine::apply`] reports).
type Applied = Result<Result<OpOutcome, Error>, String>;

/// How one append to a dedup stream applies.
struct DedupPlan {
    /// Batch of the rows to append, when some were dropped.
    ipc: Option<Vec<u8>>,
    rows: u32,
    first_offset: u64,
    /// (offset, ts) of every input row: its own, or the original's.
    row_offsets: Vec<(u64, i64)>,
    /// New index entries.
    entries: Vec<Write>,
}

/// The stream `name` (`current`: its id, 0 when the command created it) is the one the op
/// was planned against: `planned_id`, or a local id or 0 for one created earlier in the
/// same command (see [`crate::block_catalog`]).
fn check_target(current: Option<u64>, name: &str, planned_id: u64) -> Result<(), Error> {
    let created_here = planned_id == 0 || planned_id >= LOCAL_ID_BASE;
    match current {
        None => Err(Error::undefined_table(name)),
        Some(0) if created_here => Ok(()),
        Some(id) if id == planned_id => Ok(()),
        Some(_) => Err(Error::new(
            sqlstate::SERIALIZATION_FAILURE,
            format!("stream \"{name}\" was dropped and re-created while the statement ran"),
        )),
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

    fn apply(&mut self, index: u64, command: &Bytes) -> Result<CommandResult, String> {
        self.applied = index;
        // payloads stay slices of the entry: a row's bytes are copied once, into the segment
        match Command::decode_shared(command.clone()) {
            Ok(cmd) => self.apply_command(index, cmd),
            Err(e) => Ok(Err(e)),
        }
    }

    fn skip(&mut self, index: u64) {
        self.applied = index;
    }

    fn applied(&mut self) -> Result<(), String> {
        self.publish_staged()
    }

    fn applied_index(&self) -> u64 {
        self.checkpointed
    }

    fn checkpoint(&mut self) -> Result<u64, String> {
        let index = self.write_checkpoint(self.applied)?;
        self.checkpoint_done = None;
        Ok(index)
    }

    fn start_checkpoint(&mut self) -> Result<Option<u64>, String> {
        self.spawn_checkpoint()?;
        Ok(None)
    }

    fn finished_checkpoint(&mut self, wait: bool) -> Result<Option<u64>, String> {
        self.collect_checkpoint(wait)
    }

    fn checkpoint_wanted(&self) -> bool {
        !self.doomed.is_empty()
    }

    fn snapshot(&mut self) -> Result<(u64, Vec<u8>), String> {
        self.take_snapshot()
    }

    fn restore(&mut self, index: u64, term: u64, data: &[u8]) -> Result<(), String> {
        self.restore_snapshot(index, term, data)
    }

    fn snapshot_point(&self) -> Option<(u64, u64)> {
        self.snapshot_point
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::command::{CreateTable, Op, TableRead, TableWrite};
    use crate::table::codec::{encode_key, encode_row};
    use datafusion::scalar::ScalarValue;

    fn open(dir: &Path) -> Database {
        Database::open(
            dir,
            Arc::new(Catalog::new()),
            Arc::new(ApplyStats::default()),
            1 << 20,
        )
        .unwrap()
    }

    fn run(
        db: &mut Database,
        index: u64,
        snapshot: u64,
        reads: Vec<TableRead>,
        ops: Vec<Op>,
    ) -> CommandResult {
        let cmd = Command {
            ts_micros: 1_000_000 * index as i64,
            ops,
            snapshot,
            reads,
        };
        let result = db.apply(index, &cmd.encode_bytes().into()).unwrap();
        db.applied().unwrap();
        result
    }

    fn create(name: &str) -> Op {
        let def = TableDef {
            id: 0,
            oid: 0,
            name: name.into(),
            columns: vec![
                crate::definition::ColumnDef {
                    name: "k".into(),
                    ty: crate::types::ColumnType::Int8,
                    not_null: true,
                    default: None,
                },
                crate::definition::ColumnDef {
                    name: "v".into(),
                    ty: crate::types::ColumnType::Int8,
                    not_null: false,
                    default: None,
                },
            ],
            primary_key: vec![0],
            index_oid: 0,
            key_name: None,
            indexes: Vec::new(),
        };
        Op {
            kind: Some(op::Kind::CreateTable(CreateTable {
                name: name.into(),
                definition_json: serde_json::to_string(&def).unwrap(),
                if_not_exists: false,
                owner: String::new(),
            })),
        }
    }

    fn key(k: i64) -> Vec<u8> {
        encode_key(&[&ScalarValue::Int64(Some(k))]).unwrap()
    }

    fn write(db: &Database, kind: i32, k: i64, v: i64) -> Op {
        let t = db.catalog.table("t").unwrap();
        Op {
            kind: Some(op::Kind::TableWrite(TableWrite {
                table: "t".into(),
                table_id: t.def.id,
                kind,
                key: key(k),
                row: encode_row(&[ScalarValue::Int64(Some(k)), ScalarValue::Int64(Some(v))])
                    .unwrap(),
            })),
        }
    }

    fn create_stream(name: &str) -> Op {
        let def = StreamDef {
            id: 0,
            oid: 0,
            name: name.into(),
            columns: vec![crate::definition::ColumnDef {
                name: "m".into(),
                ty: crate::types::ColumnType::Text,
                not_null: false,
                default: None,
            }],
            options: Default::default(),
        };
        Op {
            kind: Some(op::Kind::CreateStream(crate::command::CreateStream {
                name: name.into(),
                definition_json: serde_json::to_string(&def).unwrap(),
                if_not_exists: false,
                owner: String::new(),
            })),
        }
    }

    fn drop_op(name: &str) -> Op {
        Op {
            kind: Some(op::Kind::DropRelation(crate::command::DropRelation {
                name: name.into(),
                ..Default::default()
            })),
        }
    }

    /// A write to table `name` as a block that created it at op `at` sends it.
    fn local_write(name: &str, at: u64, k: i64, v: i64) -> Op {
        Op {
            kind: Some(op::Kind::TableWrite(TableWrite {
                table: name.into(),
                table_id: LOCAL_ID_BASE + at,
                kind: write_kind::INSERT,
                key: key(k),
                row: encode_row(&[ScalarValue::Int64(Some(k)), ScalarValue::Int64(Some(v))])
                    .unwrap(),
            })),
        }
    }

    /// A transaction block's DDL commits in the block's one command (`session::block_ddl`):
    /// a table created there is written by its local id, a dropped stream's files go after
    /// a checkpoint of the whole command, a dropped table's writes are not kept. (Before,
    /// such a command was refused: "DROP ... cannot commit together with table writes".)
    #[test]
    fn one_command_creates_writes_and_drops() {
        let dir = tempfile::tempdir().unwrap();
        let mut db = open(dir.path());
        let first = vec![create("t"), create_stream("s"), create("gone")];
        assert_eq!(code(run(&mut db, 1, 0, vec![], first)), "ok");
        let s_dir = stream_dir(dir.path(), db.catalog.get("s").unwrap().def.id);
        let gone = db.catalog.table("gone").unwrap().def.id;
        assert!(s_dir.exists());
        let mut gone_write = local_write("gone", 0, 5, 50);
        if let Some(op::Kind::TableWrite(w)) = &mut gone_write.kind {
            w.table_id = gone;
        }
        let ops = vec![
            write(&db, write_kind::INSERT, 1, 10),
            create("u"),
            local_write("u", 1, 7, 70),
            drop_op("s"),
            gone_write,
            drop_op("gone"),
        ];
        assert_eq!(code(run(&mut db, 2, 0, vec![], ops)), "ok");
        let u = db.catalog.table("u").unwrap().def.id;
        assert_eq!(u, 2 * 1024 + 1 + 1);
        assert!(db.tables.snapshot().get(u, &key(7)).unwrap().is_some());
        // the dropped stream's files go with the next checkpoint, which the node starts now
        assert!(db.catalog.get("s").is_none() && s_dir.exists());
        assert!(db.checkpoint_wanted());
        assert_eq!(StateMachine::start_checkpoint(&mut db), Ok(None));
        assert!(!db.checkpoint_wanted());
        assert_eq!(db.finished_checkpoint(true), Ok(Some(2)));
        assert!(!s_dir.exists());
        assert!(db.tables.snapshot().get(gone, &key(5)).unwrap().is_none());
        // a local id must name a CreateTable op before the write, of the same name
        let bad = vec![create("v"), local_write("w", 0, 1, 1)];
        assert_eq!(code(run(&mut db, 3, 0, vec![], bad)), "XX000");
        let early = vec![local_write("v", 1, 1, 1), create("v")];
        assert_eq!(code(run(&mut db, 4, 0, vec![], early)), "XX000");
        // CREATE TABLE IF NOT EXISTS met a table committed meanwhile: the block fails
        let mut again = create("u");
        if let Some(op::Kind::CreateTable(c)) = &mut again.kind {
            c.if_not_exists = true;
        }
        let ops = vec![again, local_write("u", 0, 8, 80)];
        assert_eq!(code(run(&mut db, 5, 0, vec![], ops)), "40001");
        assert!(db.catalog.table("v").is_none());
        // the checkpoint after the drop holds the whole command, table rows included
        drop(db);
        let db = open(dir.path());
        assert_eq!(db.applied_index(), 2);
        let t = db.catalog.table("t").unwrap().def.id;
        assert!(db.tables.snapshot().get(t, &key(1)).unwrap().is_some());
        assert!(db.tables.snapshot().get(u, &key(7)).unwrap().is_some());
        assert!(db.catalog.get("s").is_none() && db.catalog.table("gone").is_none());
    }

    fn append_op(db: &Database, stream: &str, msg: &str) -> Op {
        let s = db.catalog.get(stream).unwrap();
        let batch = arrow::record_batch::RecordBatch::try_new(
            s.user_schema.clone(),
            vec![Arc::new(arrow::array::StringArray::from(vec![msg]))],
        )
        .unwrap();
        Op {
            kind: Some(op::Kind::Append(crate::command::Append {
                stream: stream.into(),
                stream_id: s.def.id,
                ipc: crate::ipc::encode_ipc(&batch).unwrap().into(),
                rows: 1,
                logical_len: 0,
            })),
        }
    }

    /// Applies (without ending the batch) one command appending `msg` to `stream`.
    fn append1(db: &mut Database, index: u64, stream: &str, msg: &str) -> &'static str {
        let op = append_op(db, stream, msg);
        apply_only(db, index, vec![op])
    }

    fn apply_only(db: &mut Database, index: u64, ops: Vec<Op>) -> &'static str {
        let cmd = Command {
            ts_micros: 1_000_000 * index as i64,
            ops,
            snapshot: 0,
            reads: vec![],
        };
        code(db.apply(index, &cmd.encode_bytes().into()).unwrap())
    }

    /// A Raft batch's appends wait in memory and reach the segment file in one write when
    /// the batch is applied, before any proposer is answered; readers and tails see them
    /// only then, offsets are assigned at once, and a command's table writes never show
    /// before the rows staged ahead of them.
    #[test]
    fn a_batch_of_appends_is_written_and_shown_when_the_batch_is_applied() {
        let dir = tempfile::tempdir().unwrap();
        let mut db = open(dir.path());
        let ddl = vec![create_stream("s"), create("t")];
        assert_eq!(code(run(&mut db, 1, 0, vec![], ddl)), "ok");
        let s = db.catalog.get("s").unwrap();
        let mut tail = s.subscribe();
        tail.mark_unchanged();
        let segment = s.log.segments()[0].path.clone();
        let empty = std::fs::metadata(&segment).unwrap().len();
        for (i, msg) in ["a", "b", "c"].into_iter().enumerate() {
            assert_eq!(append1(&mut db, 2 + i as u64, "s", msg), "ok");
        }
        assert_eq!(s.log.write_offset(), 3, "offsets assigned as applied");
        assert_eq!(
            s.log.next_offset(),
            0,
            "not shown before the batch is applied"
        );
        assert!(!tail.has_changed().unwrap(), "no tail woken yet");
        assert_eq!(
            std::fs::metadata(&segment).unwrap().len(),
            empty,
            "not written yet"
        );
        db.applied().unwrap();
        assert_eq!(s.log.next_offset(), 3);
        assert!(tail.has_changed().unwrap());
        assert_eq!(*tail.borrow_and_update(), 3);
        let metas = s.log.batches(0, u64::MAX);
        assert_eq!(metas.len(), 3);
        for (meta, msg) in metas.iter().zip(["a", "b", "c"]) {
            let batch = s.log.read(meta).unwrap();
            let col = batch.column(batch.num_columns() - 1);
            let text = col
                .as_any()
                .downcast_ref::<arrow::array::StringArray>()
                .unwrap();
            assert_eq!(text.value(0), msg);
        }
        // a command with table writes shows the rows staged before it first
        assert_eq!(append1(&mut db, 5, "s", "d"), "ok");
        let both = vec![
            append_op(&db, "s", "e"),
            write(&db, write_kind::INSERT, 1, 10),
        ];
        assert_eq!(apply_only(&mut db, 6, both), "ok");
        let t = db.catalog.table("t").unwrap().def.id;
        assert!(db.tables.snapshot().get(t, &key(1)).unwrap().is_some());
        assert_eq!(s.log.next_offset(), 5, "the rows came first");
        // a dropped stream's staged rows are neither written nor shown; the rest still are
        assert_eq!(apply_only(&mut db, 7, vec![create_stream("gone")]), "ok");
        assert_eq!(append1(&mut db, 8, "gone", "x"), "ok");
        assert_eq!(append1(&mut db, 9, "s", "f"), "ok");
        assert_eq!(apply_only(&mut db, 10, vec![drop_op("gone")]), "ok");
        db.applied().unwrap();
        assert_eq!(s.log.next_offset(), 6);
        // a checkpoint covers staged rows: reopened, everything is there
        assert_eq!(append1(&mut db, 11, "s", "g"), "ok");
        db.checkpoint().unwrap();
        db.applied().unwrap();
        drop(db);
        let db = open(dir.path());
        assert_eq!(db.applied_index(), 11);
        assert_eq!(db.catalog.get("s").unwrap().log.next_offset(), 7);
    }

    fn read(table_id: u64, k: Option<i64>) -> TableRead {
        TableRead {
            table_id,
            key: k.map(key),
        }
    }

    fn code(r: CommandResult) -> &'static str {
        match r {
            Ok(_) => "ok",
            Err(e) => e.code,
        }
    }

    #[test]
    fn optimistic_validation_and_unique_keys() {
        let dir = tempfile::tempdir().unwrap();
        let mut db = open(dir.path());
        assert_eq!(code(run(&mut db, 1, 0, vec![], vec![create("t")])), "ok");
        let t = db.catalog.table("t").unwrap().def.id;
        let ins1 = write(&db, write_kind::INSERT, 1, 10);
        let ins2 = write(&db, write_kind::INSERT, 2, 20);
        assert_eq!(
            code(run(&mut db, 2, 0, vec![], vec![ins1.clone(), ins2])),
            "ok"
        );
        // a duplicate key fails the whole command, nothing of it applies
        let ins3 = write(&db, write_kind::INSERT, 3, 30);
        assert_eq!(code(run(&mut db, 3, 0, vec![], vec![ins3, ins1])), "23505");
        assert!(db.tables.snapshot().get(t, &key(3)).unwrap().is_none());
        // key 1 changes at index 4
        let put1 = write(&db, write_kind::PUT, 1, 11);
        assert_eq!(
            code(run(&mut db, 4, 2, vec![read(t, Some(1))], vec![put1])),
            "ok"
        );
        // a transaction that read key 1 at snapshot 2 conflicts ...
        let put1b = write(&db, write_kind::PUT, 1, 12);
        assert_eq!(
            code(run(
                &mut db,
                5,
                2,
                vec![read(t, Some(1))],
                vec![put1b.clone()]
            )),
            "40001"
        );
        // ... one that read key 2 does not, nor one that read key 1 after it changed
        let put2 = write(&db, write_kind::PUT, 2, 21);
        assert_eq!(
            code(run(&mut db, 6, 2, vec![read(t, Some(2))], vec![put2])),
            "ok"
        );
        assert_eq!(
            code(run(&mut db, 7, 4, vec![read(t, Some(1))], vec![put1b])),
            "ok"
        );
        // a whole-table read conflicts with any later write
        let put9 = write(&db, write_kind::PUT, 9, 90);
        assert_eq!(
            code(run(&mut db, 8, 6, vec![read(t, None)], vec![put9.clone()])),
            "40001"
        );
        assert_eq!(
            code(run(&mut db, 9, 7, vec![read(t, None)], vec![put9])),
            "ok"
        );
        // reading an absent key conflicts with a later delete (its
        // insert-then-delete may have happened after the snapshot)
        let del9 = write(&db, write_kind::DELETE, 9, 0);
        assert_eq!(code(run(&mut db, 10, 9, vec![], vec![del9])), "ok");
        let ins5 = write(&db, write_kind::INSERT, 5, 50);
        assert_eq!(
            code(run(
                &mut db,
                11,
                9,
                vec![read(t, Some(5))],
                vec![ins5.clone()]
            )),
            "40001"
        );
        assert_eq!(
            code(run(&mut db, 12, 10, vec![read(t, Some(5))], vec![ins5])),
            "ok"
        );
        // checkpoint, reopen, replay: the same decisions
        db.checkpoint().unwrap();
        drop(db);
        let mut db = open(dir.path());
        let put5 = write(&db, write_kind::PUT, 5, 51);
        assert_eq!(
            code(run(
                &mut db,
                13,
                11,
                vec![read(t, Some(5))],
                vec![put5.clone()]
            )),
            "40001"
        );
        assert_eq!(
            code(run(&mut db, 14, 12, vec![read(t, Some(5))], vec![put5])),
            "ok"
        );
    }

    /// A checkpoint begun at one index and written while later commands apply (as on the
    /// checkpoint thread): the tables' delta keeps exactly what changed after it began, and
    /// a restart recovers the checkpoint's state, not the later commands' (the Raft log
    /// replays those). With the delta emptied at the checkpoint's commit, as a checkpoint
    /// on the state machine's own thread could, the later writes would vanish.
    #[test]
    fn a_checkpoint_written_while_commands_apply_covers_only_its_index() {
        use write_kind::{DELETE, INSERT, PUT};
        let dir = tempfile::tempdir().unwrap();
        let mut db = open(dir.path());
        let ddl = vec![create("t"), create_stream("s")];
        assert_eq!(code(run(&mut db, 1, 0, vec![], ddl)), "ok");
        let t = db.catalog.table("t").unwrap().def.id;
        let rows = (1..=3).map(|k| write(&db, INSERT, k, 10 * k)).collect();
        assert_eq!(code(run(&mut db, 2, 0, vec![], rows)), "ok");
        assert_eq!(append1(&mut db, 3, "s", "a"), "ok");
        db.applied().unwrap();
        let job = db.begin_checkpoint(3).unwrap();
        // meanwhile: key 1 changes, key 2 goes, key 4 comes, key 3 stays; the stream grows
        let later = vec![
            write(&db, PUT, 1, 11),
            write(&db, DELETE, 2, 0),
            write(&db, INSERT, 4, 40),
        ];
        assert_eq!(code(run(&mut db, 4, 0, vec![], later)), "ok");
        assert_eq!(append1(&mut db, 5, "s", "b"), "ok");
        db.applied().unwrap();
        job.run().unwrap();
        db.end_checkpoint(job);
        let versions = |db: &Database| -> Vec<Option<u64>> {
            let snap = db.tables.snapshot();
            (1..=4)
                .map(|k| snap.get(t, &key(k)).unwrap().map(|v| v.version))
                .collect()
        };
        assert_eq!(versions(&db), [Some(4), None, Some(2), Some(4)]);
        assert!(
            db.tables.delta_bytes() > 0,
            "the later writes are still in the delta"
        );
        assert_eq!(db.catalog.get("s").unwrap().log.next_offset(), 2);
        drop(db);
        let mut db = open(dir.path());
        assert_eq!(db.applied_index(), 3);
        assert_eq!(versions(&db), [Some(2), Some(2), Some(2), None]);
        assert_eq!(
            db.catalog.get("s").unwrap().log.next_offset(),
            1,
            "the later append is the Raft log's to replay"
        );
        // through the node's calls: started, then collected once durable
        assert_eq!(append1(&mut db, 4, "s", "b"), "ok");
        db.applied().unwrap();
        assert_eq!(StateMachine::start_checkpoint(&mut db), Ok(None));
        assert_eq!(db.finished_checkpoint(true), Ok(Some(4)));
        assert_eq!(db.finished_checkpoint(true), Ok(None), "reported once");
        assert_eq!(db.applied_index(), 4);
        drop(db);
        assert_eq!(open(dir.path()).applied_index(), 4);
    }
}
