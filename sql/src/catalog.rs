//! The catalog: which streams and tables exist (their definitions are in
//! [`crate::definition`]), and the open [`StreamLog`] behind each stream.
//!
//! Only the state machine ([`crate::apply`]) mutates the catalog, and only
//! while applying a committed command, so every replica holds the same
//! catalog at the same applied index. Sessions read it concurrently: a
//! [`Stream`] handle stays valid (and readable) even if the stream is
//! dropped while a query runs. Views ([`View`]) share the one namespace of relations.
//! The catalog also holds the [`Roles`] (replaced whole by
//! each applied role change, so a reader sees one consistent version).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::Arc;

use arrow::array::{ArrayRef, RecordBatch};
use arrow::datatypes::SchemaRef;
use datafusion::scalar::ScalarValue;
use parking_lot::{Mutex, MutexGuard, RwLock};
use sluice_storage::StreamLog;
use tokio::sync::watch;

use crate::definition::{StreamDef, View};
use crate::error::Result;
use crate::roles::Roles;
use crate::table::Table;

/// A live stream: definition, log and change notification.
#[derive(Debug)]
pub struct Stream {
    pub def: StreamDef,
    pub log: Arc<StreamLog>,
    pub user_schema: SchemaRef,
    pub full_schema: SchemaRef,
    /// Commit time of the last append (µs), for non-decreasing `ts`.
    last_ts: AtomicI64,
    /// Publishes `next_offset` after every apply, for tails (shared by the handles an ALTER
    /// makes, so a tail on the old one still wakes).
    advanced: Arc<watch::Sender<u64>>,
    /// Frames read by scans (shows that range predicates prune).
    pub frames_read: AtomicU64,
    /// The Arrow IPC schema message of `user_schema`, encoded once.
    ipc_schema: std::sync::OnceLock<Vec<u8>>,
    /// Each user column's default (`None`: NULL), read from `def`.
    defaults: Vec<Option<ScalarValue>>,
    /// Each user column's [`Stream::missing_column`] of one row, made once: a single-row
    /// INSERT that leaves columns out shares them (Arrow arrays are immutable).
    missing_row: Vec<std::sync::OnceLock<ArrayRef>>,
}

impl Stream {
    pub fn new(def: StreamDef, log: Arc<StreamLog>) -> Stream {
        let next = log.next_offset();
        let last_ts = log.last_ts_micros().unwrap_or(i64::MIN);
        Stream {
            user_schema: def.user_schema(),
            full_schema: def.full_schema(),
            defaults: column_defaults(&def),
            missing_row: missing_rows(&def),
            def,
            log,
            last_ts: AtomicI64::new(last_ts),
            advanced: Arc::new(watch::channel(next).0),
            frames_read: AtomicU64::new(0),
            ipc_schema: std::sync::OnceLock::new(),
        }
    }

    /// This stream under `def` (new options, name or columns; the same id): one log, one
    /// commit clock, one wake-up channel. New columns mean new schemas (and a new IPC schema
    /// message: an append encoded with the old one must never carry a wider batch).
    pub(crate) fn altered(&self, def: StreamDef) -> Stream {
        let same_columns = def.columns == self.def.columns;
        Stream {
            user_schema: if same_columns {
                self.user_schema.clone()
            } else {
                def.user_schema()
            },
            full_schema: if same_columns {
                self.full_schema.clone()
            } else {
                def.full_schema()
            },
            ipc_schema: if same_columns {
                self.ipc_schema.clone()
            } else {
                std::sync::OnceLock::new()
            },
            defaults: column_defaults(&def),
            missing_row: missing_rows(&def),
            def,
            log: self.log.clone(),
            last_ts: AtomicI64::new(self.last_ts.load(Ordering::Acquire)),
            advanced: self.advanced.clone(),
            frames_read: AtomicU64::new(self.frames_read.load(Ordering::Relaxed)),
        }
    }

    /// User column `i`'s default (`None`: NULL).
    pub fn default_value(&self, i: usize) -> Option<&ScalarValue> {
        self.defaults.get(i)?.as_ref()
    }

    /// `n` rows of user column `i` for rows that did not give it: its default, or NULL.
    pub fn missing_column(&self, i: usize, n: usize) -> Result<ArrayRef> {
        let Some(cell) = self.missing_row.get(i).filter(|_| n == 1) else {
            return self.make_missing_column(i, n);
        };
        if let Some(a) = cell.get() {
            return Ok(a.clone());
        }
        let a = self.make_missing_column(i, 1)?;
        Ok(cell.get_or_init(|| a).clone())
    }

    fn make_missing_column(&self, i: usize, n: usize) -> Result<ArrayRef> {
        let ty = self.user_schema.field(i).data_type();
        match self.default_value(i) {
            Some(v) => {
                let a = v.to_array_of_size(n)?;
                Ok(if a.data_type() == ty {
                    a
                } else {
                    arrow::compute::cast(&a, ty)?
                })
            }
            None => Ok(arrow::array::new_null_array(ty, n)),
        }
    }

    /// A batch decoded from a frame as the stream's user columns now: columns added since
    /// it was written read their default (or NULL); a frame written after a handle was
    /// taken may hold columns the handle does not know, which are left out. Columns are
    /// matched by position (added columns go last; a rename keeps the position).
    pub fn user_columns(&self, user: &RecordBatch) -> Result<Vec<ArrayRef>> {
        let want = self.def.columns.len();
        let have = user.num_columns();
        let mut cols: Vec<ArrayRef> = user.columns().iter().take(want).cloned().collect();
        for i in have..want {
            cols.push(self.missing_column(i, user.num_rows())?);
        }
        Ok(cols)
    }

    /// The IPC schema message that opens an append's batch of `user_schema`
    /// (see [`crate::ipc::encode_ipc_with`]).
    pub fn ipc_schema(&self) -> Result<&[u8]> {
        if let Some(m) = self.ipc_schema.get() {
            return Ok(m);
        }
        let m = crate::ipc::ipc_schema_message(&self.user_schema)?;
        Ok(self.ipc_schema.get_or_init(|| m))
    }

    pub fn name(&self) -> &str {
        &self.def.name
    }

    /// The commit time for an append proposed at `proposed`: never earlier
    /// than the stream's previous commit time.
    pub fn next_ts(&self, proposed: i64) -> i64 {
        proposed.max(self.last_ts.load(Ordering::Acquire))
    }

    pub(crate) fn record_append(&self, ts: i64) {
        self.stamp(ts);
        self.advanced.send_replace(self.log.next_offset());
    }

    /// Records an append committed at `ts` that readers do not see yet
    /// ([`Stream::record_append`] shows it).
    pub(crate) fn stamp(&self, ts: i64) {
        self.last_ts.fetch_max(ts, Ordering::AcqRel);
    }

    /// Receiver that changes whenever rows are appended.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.advanced.subscribe()
    }
}

/// An empty cell per user column of `def`, for its one-row missing column.
fn missing_rows(def: &StreamDef) -> Vec<std::sync::OnceLock<ArrayRef>> {
    def.columns
        .iter()
        .map(|_| std::sync::OnceLock::new())
        .collect()
}

/// The user columns' defaults of `def`; one that does not read (it was checked when the
/// column was added) is NULL.
fn column_defaults(def: &StreamDef) -> Vec<Option<ScalarValue>> {
    def.columns
        .iter()
        .map(|c| c.default.as_deref().and_then(|t| c.ty.parse_text(t).ok()))
        .collect()
}

/// All streams and tables by name (one namespace).
///
/// Installing a Raft snapshot replaces every [`Stream`] object at once: readers that hold one
/// (tails, stream listeners) look the stream up again by name and id (see
/// [`Catalog::current`]) and go on from their position in the new one. While the install
/// runs the catalog is empty and [`Catalog::restoring`] is true, so nobody mistakes that for
/// a drop; [`Catalog::restores`] changes when an install ends.
#[derive(Debug)]
pub struct Catalog {
    streams: RwLock<BTreeMap<String, Arc<Stream>>>,
    tables: RwLock<BTreeMap<String, Arc<Table>>>,
    views: RwLock<BTreeMap<String, Arc<View>>>,
    /// Bumped on every DDL change, so cached plans can tell they are stale.
    version: AtomicU64,
    restoring: std::sync::atomic::AtomicBool,
    /// Count of finished snapshot installs.
    restores: watch::Sender<u64>,
    roles: RwLock<Arc<Roles>>,
    /// Held while stream files are deleted (a drop's directory, a truncation's segments),
    /// and by a backup from reading the checkpoint record until it has opened every file
    /// that record names: no file the backup reads can vanish in between.
    stream_file_deletions: Mutex<()>,
}

impl Default for Catalog {
    fn default() -> Self {
        Catalog {
            streams: RwLock::default(),
            tables: RwLock::default(),
            views: RwLock::default(),
            version: AtomicU64::new(0),
            restoring: std::sync::atomic::AtomicBool::new(false),
            restores: watch::channel(0).0,
            roles: RwLock::default(),
            stream_file_deletions: Mutex::new(()),
        }
    }
}

/// A stream as it is in the catalog now, for a reader that holds an older handle.
pub enum Current {
    /// The same stream; a new handle if a snapshot install replaced the old one.
    Stream(Arc<Stream>),
    /// A snapshot install is under way: look again when [`Catalog::restores`] changes.
    Restoring,
    /// Dropped (or dropped and created again: another id).
    Gone,
}

impl Catalog {
    pub fn new() -> Catalog {
        Catalog::default()
    }

    pub fn get(&self, name: &str) -> Option<Arc<Stream>> {
        self.streams.read().get(name).cloned()
    }

    pub fn list(&self) -> Vec<Arc<Stream>> {
        self.streams.read().values().cloned().collect()
    }

    /// See the field: deleting stream files, or reading a checkpoint's.
    pub(crate) fn stream_file_deletions(&self) -> MutexGuard<'_, ()> {
        self.stream_file_deletions.lock()
    }

    pub fn version(&self) -> u64 {
        self.version.load(Ordering::Acquire)
    }

    pub(crate) fn insert(&self, stream: Arc<Stream>) {
        self.streams.write().insert(stream.def.name.clone(), stream);
        self.version.fetch_add(1, Ordering::AcqRel);
    }

    /// Puts `stream` where the stream `name` was (an ALTER: the name may change).
    pub(crate) fn replace(&self, name: &str, stream: Arc<Stream>) {
        let mut streams = self.streams.write();
        streams.remove(name);
        streams.insert(stream.def.name.clone(), stream);
        drop(streams);
        self.version.fetch_add(1, Ordering::AcqRel);
    }

    pub(crate) fn remove(&self, name: &str) -> Option<Arc<Stream>> {
        let removed = self.streams.write().remove(name);
        self.version.fetch_add(1, Ordering::AcqRel);
        removed
    }

    /// Starts replacing everything (a snapshot install): the catalog is emptied, and readers
    /// of the old streams are woken to notice.
    pub(crate) fn begin_restore(&self) {
        self.restoring.store(true, Ordering::Release);
        let old = std::mem::take(&mut *self.streams.write());
        self.tables.write().clear();
        self.views.write().clear();
        self.version.fetch_add(1, Ordering::AcqRel);
        for s in old.values() {
            s.advanced.send_modify(|_| {});
        }
    }

    /// The catalog holds the snapshot's streams and tables.
    pub(crate) fn end_restore(&self) {
        self.restoring.store(false, Ordering::Release);
        self.restores.send_modify(|n| *n += 1);
    }

    pub fn restoring(&self) -> bool {
        self.restoring.load(Ordering::Acquire)
    }

    /// Changes whenever a snapshot install finishes.
    pub fn restores(&self) -> watch::Receiver<u64> {
        self.restores.subscribe()
    }

    /// What became of `held`, a handle taken earlier.
    pub fn current(&self, held: &Stream) -> Current {
        let same = self
            .get(held.name())
            .filter(|s| s.def.id == held.def.id)
            // renamed since the handle was taken
            .or_else(|| self.by_id(held.def.id));
        match same {
            Some(s) => Current::Stream(s),
            None if self.restoring() => Current::Restoring,
            None => Current::Gone,
        }
    }

    fn by_id(&self, id: u64) -> Option<Arc<Stream>> {
        self.streams
            .read()
            .values()
            .find(|s| s.def.id == id)
            .cloned()
    }

    /// The roles as of the last applied change.
    pub fn roles(&self) -> Arc<Roles> {
        self.roles.read().clone()
    }

    pub(crate) fn set_roles(&self, roles: Roles) {
        *self.roles.write() = Arc::new(roles);
    }

    pub fn table(&self, name: &str) -> Option<Arc<Table>> {
        self.tables.read().get(name).cloned()
    }

    pub fn tables(&self) -> Vec<Arc<Table>> {
        self.tables.read().values().cloned().collect()
    }

    pub fn table_by_id(&self, id: u64) -> Option<Arc<Table>> {
        self.tables
            .read()
            .values()
            .find(|t| t.def.id == id)
            .cloned()
    }

    /// The table whose secondary index has this name, and the index.
    pub fn index(&self, name: &str) -> Option<(Arc<Table>, crate::definition::IndexDef)> {
        self.tables.read().values().find_map(|t| {
            t.def
                .indexes
                .iter()
                .find(|i| i.name == name)
                .map(|i| (t.clone(), i.clone()))
        })
    }

    /// Whether a stream, table or view has this name.
    pub fn exists(&self, name: &str) -> bool {
        self.get(name).is_some() || self.table(name).is_some() || self.view(name).is_some()
    }

    pub fn view(&self, name: &str) -> Option<Arc<View>> {
        self.views.read().get(name).cloned()
    }

    pub fn has_views(&self) -> bool {
        !self.views.read().is_empty()
    }

    pub fn views(&self) -> Vec<Arc<View>> {
        self.views.read().values().cloned().collect()
    }

    /// The views that read `name` directly, by name.
    pub fn dependents(&self, name: &str) -> Vec<String> {
        self.views
            .read()
            .values()
            .filter(|v| v.def.depends_on.iter().any(|d| d == name))
            .map(|v| v.def.name.clone())
            .collect()
    }

    /// Adds `view`, or replaces the view of that name (`CREATE OR REPLACE VIEW`).
    pub(crate) fn insert_view(&self, view: Arc<View>) {
        self.views.write().insert(view.def.name.clone(), view);
        self.version.fetch_add(1, Ordering::AcqRel);
    }

    pub(crate) fn remove_view(&self, name: &str) -> Option<Arc<View>> {
        let removed = self.views.write().remove(name);
        self.version.fetch_add(1, Ordering::AcqRel);
        removed
    }

    pub(crate) fn insert_table(&self, table: Arc<Table>) {
        self.tables.write().insert(table.def.name.clone(), table);
        self.version.fetch_add(1, Ordering::AcqRel);
    }

    pub(crate) fn remove_table(&self, name: &str) -> Option<Arc<Table>> {
        let removed = self.tables.write().remove(name);
        self.version.fetch_add(1, Ordering::AcqRel);
        removed
    }
}
