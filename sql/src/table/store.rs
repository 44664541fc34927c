//! Table storage: a redb file holding every table as of the last
//! checkpoint, plus an in-memory delta of what was applied since.
//!
//! Invariants:
//! - The redb file changes only at a checkpoint, in one durable write
//!   transaction that also stores the checkpoint record (the applied index,
//!   every stream's durable position, table definitions and versions). So
//!   the table rows on disk always match the applied index next to them;
//!   commands after it are applied again from the Raft log on restart, as
//!   for streams. Nothing is ever applied twice or half.
//! - Only the state machine writes: applies on its thread, and a checkpoint's
//!   durable transaction of the view taken when it began (on the checkpoint
//!   thread, one at a time). While it runs, applies also record what they
//!   change in a second persistent map; once the file holds the view, that
//!   map becomes the delta and the file the base, in one O(1) step under the
//!   live view's lock (readers never wait for a checkpoint).
//! - A [`Snapshot`] is the redb read transaction of the last checkpoint plus
//!   an immutable copy of the delta (a persistent map: copying is O(1)), so
//!   readers see one applied index, never block the writer, and keep seeing
//!   it across later applies and checkpoints.
//! - Every stored row carries the Raft index that last wrote it (its
//!   version); every table keeps the index of its last write and last
//!   delete. Optimistic validation compares these with a transaction's
//!   snapshot index; all of it is replicated state, so every replica makes
//!   the same decision.

use std::path::Path;
use std::sync::Arc;

use imbl::OrdMap;
use parking_lot::RwLock;
use redb::{ReadableDatabase, ReadableTable, TableDefinition, TableError, TableHandle};
use serde::{Deserialize, Serialize};

use super::codec::RowBytes;
use crate::error::{Error, Result};

const META: TableDefinition<&str, &[u8]> = TableDefinition::new("meta");
const CHECKPOINT_KEY: &str = "checkpoint";

/// A row and the Raft index that wrote it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Versioned {
    pub version: u64,
    pub row: RowBytes,
}

/// When a table last changed (Raft indexes).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TableVersions {
    pub last_write: u64,
    pub last_delete: u64,
}

/// One row change: `row: None` deletes.
#[derive(Debug, Clone)]
pub struct Write {
    pub table: u64,
    pub key: Vec<u8>,
    pub row: Option<RowBytes>,
}

type DeltaKey = (u64, Vec<u8>);
/// A table's rows in redb, open in a write transaction.
type RowTable<'t> = redb::Table<'t, &'static [u8], &'static [u8]>;

/// A consistent read view of every table at one applied index.
#[derive(Clone)]
pub struct Snapshot {
    /// Raft index of the last command that changed any table (or of the
    /// checkpoint): a later change has a higher index.
    pub index: u64,
    delta: OrdMap<DeltaKey, Option<Versioned>>,
    versions: OrdMap<u64, TableVersions>,
    /// Ids dropped since the server started (an index's entries may linger in the file
    /// until the next checkpoint: nothing reads them).
    retired: OrdMap<u64, ()>,
    base: Arc<redb::ReadTransaction>,
}

impl std::fmt::Debug for Snapshot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Snapshot")
            .field("index", &self.index)
            .field("delta", &self.delta.len())
            .finish_non_exhaustive()
    }
}

fn storage_err(e: impl std::fmt::Display) -> Error {
    Error::io(format!("table storage: {e}"))
}

fn redb_name(table: u64) -> String {
    format!("t{table}")
}

/// What one delta entry counts toward [`TableStore::delta_bytes`].
fn delta_entry_bytes(key: &[u8], row: Option<&RowBytes>) -> usize {
    key.len() + row.map_or(0, |r| r.len()) + 48
}

fn decode_versioned(bytes: &[u8]) -> Result<Versioned> {
    if bytes.len() < 8 {
        return Err(Error::internal("truncated row version in table storage"));
    }
    let mut v = [0u8; 8];
    v.copy_from_slice(&bytes[..8]);
    Ok(Versioned {
        version: u64::from_le_bytes(v),
        row: Arc::from(&bytes[8..]),
    })
}

fn encode_versioned(v: &Versioned) -> Vec<u8> {
    let mut out = Vec::with_capacity(8 + v.row.len());
    out.extend(v.version.to_le_bytes());
    out.extend(v.row.iter());
    out
}

impl Snapshot {
    /// The row stored under `key`, if any.
    pub fn get(&self, table: u64, key: &[u8]) -> Result<Option<Versioned>> {
        if let Some(v) = self.delta.get(&(table, key.to_vec())) {
            return Ok(v.clone());
        }
        let name = redb_name(table);
        let def: TableDefinition<&[u8], &[u8]> = TableDefinition::new(&name);
        match self.base.open_table(def) {
            Ok(t) => match t.get(key).map_err(storage_err)? {
                Some(g) => Ok(Some(decode_versioned(g.value())?)),
                None => Ok(None),
            },
            Err(TableError::TableDoesNotExist(_)) => Ok(None),
            Err(e) => Err(storage_err(e)),
        }
    }

    /// Every row of a table in key order.
    pub fn scan(&self, table: u64) -> Result<Vec<(Vec<u8>, Versioned)>> {
        self.range(table, &[], None)
    }

    /// The rows of a table whose keys are in `from..to` (`to: None`: to the end), in key
    /// order.
    pub fn range(
        &self,
        table: u64,
        from: &[u8],
        to: Option<&[u8]>,
    ) -> Result<Vec<(Vec<u8>, Versioned)>> {
        let mut rows: std::collections::BTreeMap<Vec<u8>, Versioned> = Default::default();
        let name = redb_name(table);
        let def: TableDefinition<&[u8], &[u8]> = TableDefinition::new(&name);
        let bounds = (
            std::ops::Bound::Included(from),
            to.map_or(std::ops::Bound::Unbounded, std::ops::Bound::Excluded),
        );
        match self.base.open_table(def) {
            Ok(t) => {
                for item in t.range::<&[u8]>(bounds).map_err(storage_err)? {
                    let (k, v) = item.map_err(storage_err)?;
                    rows.insert(k.value().to_vec(), decode_versioned(v.value())?);
                }
            }
            Err(TableError::TableDoesNotExist(_)) => {}
            Err(e) => return Err(storage_err(e)),
        }
        let end = match to {
            Some(to) => std::ops::Bound::Excluded((table, to.to_vec())),
            None => std::ops::Bound::Excluded((table + 1, Vec::new())),
        };
        let delta_bounds = (std::ops::Bound::Included((table, from.to_vec())), end);
        for ((_, k), v) in self.delta.range(delta_bounds) {
            match v {
                Some(v) => {
                    rows.insert(k.clone(), v.clone());
                }
                None => {
                    rows.remove(k);
                }
            }
        }
        Ok(rows.into_iter().collect())
    }

    pub fn versions(&self, table: u64) -> TableVersions {
        self.versions.get(&table).copied().unwrap_or_default()
    }

    /// Whether `id` (a table or an index) was dropped as of this snapshot.
    pub fn retired(&self, id: u64) -> bool {
        self.retired.contains_key(&id)
    }
}

/// The table store of one data directory.
pub struct TableStore {
    db: redb::Database,
    live: RwLock<Live>,
    /// Approximate bytes held by the delta (a checkpoint empties it).
    delta_bytes: std::sync::atomic::AtomicUsize,
}

/// The store's current state, under one lock.
struct Live {
    view: Snapshot,
    /// While a checkpoint is being written: the delta entries changed since it began,
    /// which are what the delta keeps once the file holds the rest.
    since_begin: Option<OrdMap<DeltaKey, Option<Versioned>>>,
    /// Approximate bytes of `since_begin`.
    since_begin_bytes: usize,
}

impl std::fmt::Debug for TableStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TableStore").finish_non_exhaustive()
    }
}

impl TableStore {
    /// Open (or create) the store; returns it with the checkpoint record
    /// stored by the last checkpoint, if any.
    pub fn open(path: &Path) -> Result<(TableStore, Option<Vec<u8>>)> {
        let db = redb::Database::create(path).map_err(storage_err)?;
        let base = db.begin_read().map_err(storage_err)?;
        let checkpoint = checkpoint_record(&base)?;
        let store = TableStore {
            db,
            live: RwLock::new(Live {
                view: Snapshot {
                    index: 0,
                    delta: OrdMap::new(),
                    versions: OrdMap::new(),
                    retired: OrdMap::new(),
                    base: Arc::new(base),
                },
                since_begin: None,
                since_begin_bytes: 0,
            }),
            delta_bytes: Default::default(),
        };
        Ok((store, checkpoint))
    }

    /// Set what the checkpoint said (at open): its index and table versions.
    pub fn restore(&self, index: u64, versions: impl IntoIterator<Item = (u64, TableVersions)>) {
        let live = &mut self.live.write().view;
        live.index = index;
        live.versions = versions.into_iter().collect();
    }

    /// A read view of every table as of now.
    pub fn snapshot(&self) -> Snapshot {
        self.live.read().view.clone()
    }

    /// Apply the row changes of the command at `index` (already validated).
    pub fn apply(&self, index: u64, writes: Vec<Write>) {
        let mut guard = self.live.write();
        let Live {
            view: live,
            since_begin,
            since_begin_bytes,
        } = &mut *guard;
        let mut added = 0usize;
        for w in writes {
            let mut v = live.versions.get(&w.table).copied().unwrap_or_default();
            v.last_write = index;
            if w.row.is_none() {
                v.last_delete = index;
            }
            live.versions.insert(w.table, v);
            let bytes = delta_entry_bytes(&w.key, w.row.as_ref());
            added += bytes;
            let row = w.row.map(|row| Versioned {
                version: index,
                row,
            });
            let key = (w.table, w.key);
            if let Some(since) = since_begin {
                since.insert(key.clone(), row.clone());
                *since_begin_bytes += bytes;
            }
            live.delta.insert(key, row);
        }
        live.index = index;
        self.delta_bytes
            .fetch_add(added, std::sync::atomic::Ordering::Relaxed);
    }

    /// The command at `index` changed what tables mean without writing rows (an index with
    /// no entries): snapshots from now on are at least at it.
    pub fn advance(&self, index: u64) {
        let live = &mut self.live.write().view;
        live.index = live.index.max(index);
    }

    /// An index (or table) was dropped at `index`: like [`TableStore::reset_table`], and
    /// snapshots from now on say it is gone ([`Snapshot::retired`]).
    pub fn retire(&self, index: u64, id: u64) {
        self.reset_table(index, id);
        self.live.write().view.retired.insert(id, ());
    }

    /// A table was created or dropped at `index`: readers of it must
    /// notice (its versions restart; a dropped table's rows leave the delta).
    pub fn reset_table(&self, index: u64, table: u64) {
        let mut guard = self.live.write();
        let Live {
            view: live,
            since_begin,
            ..
        } = &mut *guard;
        let keys: Vec<DeltaKey> = live
            .delta
            .range((table, Vec::new())..(table + 1, Vec::new()))
            .map(|(k, _)| k.clone())
            .collect();
        for k in keys {
            live.delta.remove(&k);
            if let Some(since) = since_begin {
                since.remove(&k);
            }
        }
        live.versions.insert(
            table,
            TableVersions {
                last_write: index,
                last_delete: index,
            },
        );
        live.index = index;
    }

    pub fn delta_bytes(&self) -> usize {
        self.delta_bytes.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Versions of every table, for the checkpoint record.
    pub fn versions(&self) -> Vec<(u64, TableVersions)> {
        self.live
            .read()
            .view
            .versions
            .iter()
            .map(|(k, v)| (*k, *v))
            .collect()
    }

    /// Make the delta durable together with `record` (the checkpoint), in
    /// one fsynced redb transaction, and drop the tables in `dropped`.
    pub fn checkpoint(&self, index: u64, record: &[u8], dropped: &[u64]) -> Result<()> {
        self.checkpoint_as_of(&self.begin_checkpoint(), index, record, dropped)
    }

    /// The view a checkpoint writes (at the applied index it covers); from now until it is
    /// written, the store also keeps apart what changes (the delta it keeps after).
    pub fn begin_checkpoint(&self) -> Snapshot {
        let mut live = self.live.write();
        live.since_begin = Some(OrdMap::new());
        live.since_begin_bytes = 0;
        live.view.clone()
    }

    /// [`TableStore::checkpoint`] of the view `live` from [`TableStore::begin_checkpoint`]
    /// while applies go on: the delta keeps what changed after it. Runs on the checkpoint
    /// thread; one at a time.
    pub fn checkpoint_as_of(
        &self,
        live: &Snapshot,
        index: u64,
        record: &[u8],
        dropped: &[u64],
    ) -> Result<()> {
        let txn = self.db.begin_write().map_err(storage_err)?;
        {
            let mut current: Option<(u64, RowTable)> = None;
            for ((table, key), v) in live.delta.iter() {
                if current.as_ref().map(|(t, _)| t) != Some(table) {
                    let name = redb_name(*table);
                    let def: TableDefinition<&[u8], &[u8]> = TableDefinition::new(&name);
                    current = Some((*table, txn.open_table(def).map_err(storage_err)?));
                }
                let Some((_, t)) = current.as_mut() else {
                    continue;
                };
                match v {
                    Some(v) => {
                        t.insert(key.as_slice(), encode_versioned(v).as_slice())
                            .map_err(storage_err)?;
                    }
                    None => {
                        t.remove(key.as_slice()).map_err(storage_err)?;
                    }
                }
            }
            drop(current);
            for table in dropped {
                let name = redb_name(*table);
                let def: TableDefinition<&[u8], &[u8]> = TableDefinition::new(&name);
                txn.delete_table(def).map_err(storage_err)?;
            }
        }
        let mut live = self.commit_with_record(txn, record)?;
        live.index = live.index.max(index);
        Ok(())
    }

    /// Stores `record` as the checkpoint record in `txn`, commits it (durably), and makes the
    /// live view read the new file. The delta keeps what the file does not hold: what
    /// changed since the checkpoint began, if one did, else nothing. Returns the live view,
    /// still locked, for the caller to set its index.
    fn commit_with_record(
        &self,
        txn: redb::WriteTransaction,
        record: &[u8],
    ) -> Result<parking_lot::MappedRwLockWriteGuard<'_, Snapshot>> {
        {
            let mut meta = txn.open_table(META).map_err(storage_err)?;
            meta.insert(CHECKPOINT_KEY, record).map_err(storage_err)?;
        }
        txn.commit().map_err(storage_err)?;
        let base = self.db.begin_read().map_err(storage_err)?;
        let mut live = self.live.write();
        let kept = live.since_begin.take().unwrap_or_default();
        self.delta_bytes.store(
            std::mem::take(&mut live.since_begin_bytes),
            std::sync::atomic::Ordering::Relaxed,
        );
        live.view.delta = kept;
        live.view.base = Arc::new(base);
        Ok(parking_lot::RwLockWriteGuard::map(live, |l| &mut l.view))
    }
}

/// Every row of one redb table, raw (key, versioned value), for a snapshot.
pub type RawTable = (String, Vec<(Vec<u8>, Vec<u8>)>);

impl TableStore {
    /// Every table as of the last checkpoint, raw. Call right after a checkpoint (the delta is
    /// then empty) to get the whole state.
    pub fn dump(&self) -> Result<Vec<RawTable>> {
        let txn = self.db.begin_read().map_err(storage_err)?;
        dump_tables(&txn)
    }

    /// A read view of the store as of the last checkpoint: its record and its tables agree
    /// whatever checkpoints run meanwhile (what a backup holds).
    pub fn checkpointed(&self) -> Result<StoreSnapshot> {
        Ok(StoreSnapshot(self.db.begin_read().map_err(storage_err)?))
    }

    /// Replaces every table with `tables` (from [`TableStore::dump`] on another replica) and
    /// the checkpoint record with `record`, in one durable transaction; the in-memory delta
    /// is dropped and the live view starts at `index` with `versions`.
    pub fn replace_all(
        &self,
        tables: Vec<RawTable>,
        record: &[u8],
        index: u64,
        versions: impl IntoIterator<Item = (u64, TableVersions)>,
    ) -> Result<()> {
        let txn = self.db.begin_write().map_err(storage_err)?;
        {
            let existing: Vec<String> = txn
                .list_tables()
                .map_err(storage_err)?
                .map(|h| h.name().to_string())
                .filter(|n| n != "meta")
                .collect();
            for name in existing {
                let def: TableDefinition<&[u8], &[u8]> = TableDefinition::new(&name);
                txn.delete_table(def).map_err(storage_err)?;
            }
            for (name, rows) in &tables {
                let def: TableDefinition<&[u8], &[u8]> = TableDefinition::new(name);
                let mut t = txn.open_table(def).map_err(storage_err)?;
                for (k, v) in rows {
                    t.insert(k.as_slice(), v.as_slice()).map_err(storage_err)?;
                }
            }
        }
        let mut live = self.commit_with_record(txn, record)?;
        live.index = index;
        live.versions = versions.into_iter().collect();
        Ok(())
    }
}

/// The checkpoint record `txn` sees, if a checkpoint was ever written.
/// One read transaction of the store (see [`TableStore::checkpointed`]).
pub struct StoreSnapshot(redb::ReadTransaction);

impl StoreSnapshot {
    /// The checkpoint record this view holds, if any checkpoint was taken.
    pub fn record(&self) -> Result<Option<Vec<u8>>> {
        checkpoint_record(&self.0)
    }

    /// Every table as of the record, raw.
    pub fn tables(&self) -> Result<Vec<RawTable>> {
        dump_tables(&self.0)
    }
}

fn checkpoint_record(txn: &redb::ReadTransaction) -> Result<Option<Vec<u8>>> {
    match txn.open_table(META) {
        Ok(t) => Ok(t
            .get(CHECKPOINT_KEY)
            .map_err(storage_err)?
            .map(|g| g.value().to_vec())),
        Err(TableError::TableDoesNotExist(_)) => Ok(None),
        Err(e) => Err(storage_err(e)),
    }
}

/// Every table but `meta` in `txn`, raw.
fn dump_tables(txn: &redb::ReadTransaction) -> Result<Vec<RawTable>> {
    let mut out = Vec::new();
    for handle in txn.list_tables().map_err(storage_err)? {
        let name = handle.name().to_string();
        if name == "meta" {
            continue;
        }
        let def: TableDefinition<&[u8], &[u8]> = TableDefinition::new(&name);
        let table = txn.open_table(def).map_err(storage_err)?;
        let mut rows = Vec::new();
        for item in table.iter().map_err(storage_err)? {
            let (k, v) = item.map_err(storage_err)?;
            rows.push((k.value().to_vec(), v.value().to_vec()));
        }
        out.push((name, rows));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(b: &[u8]) -> Option<RowBytes> {
        Some(Arc::from(b))
    }

    #[test]
    fn snapshots_survive_applies_and_checkpoints() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tables.redb");
        let (store, cp) = TableStore::open(&path).unwrap();
        assert!(cp.is_none());
        store.apply(
            5,
            vec![
                Write {
                    table: 1,
                    key: b"a".to_vec(),
                    row: row(b"1"),
                },
                Write {
                    table: 1,
                    key: b"b".to_vec(),
                    row: row(b"2"),
                },
                Write {
                    table: 2,
                    key: b"a".to_vec(),
                    row: row(b"x"),
                },
            ],
        );
        let before = store.snapshot();
        store.checkpoint(5, b"cp5", &[]).unwrap();
        store.apply(
            7,
            vec![Write {
                table: 1,
                key: b"a".to_vec(),
                row: None,
            }],
        );
        let after = store.snapshot();
        // the old snapshot still sees index 5
        assert_eq!(before.scan(1).unwrap().len(), 2);
        assert_eq!(before.get(1, b"a").unwrap().unwrap().version, 5);
        // the new one sees the delete on top of the checkpointed rows
        let rows = after.scan(1).unwrap();
        assert_eq!(rows.len(), 1);
        assert_eq!(rows[0].0, b"b".to_vec());
        assert!(after.get(1, b"a").unwrap().is_none());
        assert_eq!(
            after.versions(1),
            TableVersions {
                last_write: 7,
                last_delete: 7
            }
        );
        assert_eq!(after.get(2, b"a").unwrap().unwrap().row.as_ref(), b"x");
        drop((before, after));
        // a crash here loses the delta; the checkpoint is what reopens
        drop(store);
        let (store, cp) = TableStore::open(&path).unwrap();
        assert_eq!(cp.as_deref(), Some(&b"cp5"[..]));
        assert_eq!(store.snapshot().scan(1).unwrap().len(), 2);
        store.checkpoint(9, b"cp9", &[2]).unwrap();
        assert!(store.snapshot().scan(2).unwrap().is_empty());
    }

    /// A checkpoint written while applies go on: afterwards the delta holds exactly what
    /// changed after it began (recorded apart as it changed, and swapped in), the file the
    /// rest. With the delta emptied at the commit, the later writes would vanish.
    #[test]
    fn a_checkpoint_leaves_in_the_delta_exactly_what_changed_after_it_began() {
        let dir = tempfile::tempdir().unwrap();
        let (store, _) = TableStore::open(&dir.path().join("tables.redb")).unwrap();
        let put = |table, key: &[u8], value: Option<&[u8]>| Write {
            table,
            key: key.to_vec(),
            row: value.map(Arc::from),
        };
        let many = (0..100u32)
            .map(|i| put(1, &i.to_be_bytes(), Some(b"v")))
            .collect();
        store.apply(3, many);
        store.apply(4, vec![put(2, b"gone", Some(b"g"))]);
        let view = store.begin_checkpoint();
        store.apply(5, vec![put(1, &7u32.to_be_bytes(), Some(b"new"))]);
        store.apply(6, vec![put(1, &8u32.to_be_bytes(), None)]);
        store.apply(7, vec![put(1, b"late", Some(b"l"))]);
        store.reset_table(8, 2);
        store.checkpoint_as_of(&view, 4, b"cp4", &[]).unwrap();
        let snap = store.snapshot();
        assert_eq!(snap.delta.len(), 3, "the three keys written after it began");
        assert_eq!(snap.index, 8);
        let version = |key: &[u8]| snap.get(1, key).unwrap().map(|v| v.version);
        assert_eq!(version(&7u32.to_be_bytes()), Some(5));
        assert_eq!(version(&8u32.to_be_bytes()), None);
        assert_eq!(version(&9u32.to_be_bytes()), Some(3), "from the file");
        assert_eq!(version(b"late"), Some(7));
        assert_eq!(
            store.delta_bytes(),
            [(4usize, 3usize), (4, 0), (4, 1)]
                .iter()
                .map(|(k, r)| k + r + 48)
                .sum::<usize>()
        );
        // a reopened store holds the checkpoint's view: none of the later writes
        drop((snap, store));
        let (store, cp) = TableStore::open(&dir.path().join("tables.redb")).unwrap();
        assert_eq!(cp.as_deref(), Some(&b"cp4"[..]));
        let snap = store.snapshot();
        assert_eq!(
            snap.get(1, &7u32.to_be_bytes()).unwrap().unwrap().version,
            3
        );
        assert!(snap.get(1, &8u32.to_be_bytes()).unwrap().is_some());
        assert!(snap.get(1, b"late").unwrap().is_none());
    }
}
