//! Mutable tables: the live table built from its definition
//! ([`TableDef`], in [`crate::definition`]), storage, a transaction's view of
//! them, and their DataFusion provider.
//!
//! A table lives beside the streams in the same catalog namespace and is
//! changed only by replicated commands. Rows are keyed by the primary key
//! (or by a hidden row id when the table has none) and stored in
//! [`store::TableStore`]. A session reads tables through a [`TxnTables`]:
//! one snapshot per transaction (or per statement outside a block), the
//! transaction's own uncommitted writes on top, and a record of what it
//! read, which the state machine validates at commit (optimistic
//! concurrency: serializable, SQLSTATE 40001 on conflict).

pub mod codec;
pub mod index;
pub mod provider;
pub mod store;

use std::collections::BTreeMap;
use std::sync::Arc;

use arrow::datatypes::{Schema, SchemaRef};
use datafusion::scalar::ScalarValue;
use parking_lot::Mutex;

use crate::command::{op, Op, TableRead};
use crate::definition::TableDef;
use crate::error::{sqlstate, Error, Result};
use crate::types::ColumnType;
use codec::RowBytes;
use store::{Snapshot, TableStore};

/// Names starting with this are reserved for Sluice's internal relations
/// and columns (the keyed view of a table used by UPDATE and DELETE).
pub const RESERVED_PREFIX: &str = "sluice$";
/// The hidden key column of a table's keyed view.
pub const KEY_COLUMN: &str = "sluice$key";

/// Write kinds of a `TableWrite` op.
pub mod write_kind {
    /// Insert a new row; a row with the same key is a unique violation.
    pub const INSERT: i32 = 0;
    /// Insert or replace the row with this key.
    pub const PUT: i32 = 1;
    pub const DELETE: i32 = 2;
}

/// A live table: definition and derived schema.
#[derive(Debug)]
pub struct Table {
    pub def: TableDef,
    pub schema: SchemaRef,
    pub types: Vec<ColumnType>,
}

impl Table {
    pub fn new(def: TableDef) -> Table {
        let schema = Arc::new(Schema::new(
            def.columns
                .iter()
                .map(|c| c.ty.field(&c.name, !c.not_null))
                .collect::<Vec<_>>(),
        ));
        let types = def.columns.iter().map(|c| c.ty).collect();
        Table { def, schema, types }
    }

    pub fn name(&self) -> &str {
        &self.def.name
    }

    pub fn constraint_name(&self) -> String {
        self.def
            .key_name
            .clone()
            .unwrap_or_else(|| format!("{}_pkey", self.def.name))
    }

    /// The key of a full row (`None` for a table without a primary key,
    /// whose row id the state machine assigns).
    pub fn key_of(&self, row: &[ScalarValue]) -> Result<Option<Vec<u8>>> {
        if self.def.primary_key.is_empty() {
            return Ok(None);
        }
        let vals: Vec<&ScalarValue> = self.def.primary_key.iter().map(|&i| &row[i]).collect();
        codec::encode_key(&vals).map(Some)
    }

    /// NOT NULL (primary-key columns are NOT NULL too).
    pub fn check_not_null(&self, row: &[ScalarValue]) -> Result<()> {
        for (i, (c, v)) in self.def.columns.iter().zip(row).enumerate() {
            if v.is_null() && (c.not_null || self.def.primary_key.contains(&i)) {
                return Err(Error::new(
                    sqlstate::NOT_NULL_VIOLATION,
                    format!(
                        "null value in column \"{}\" of relation \"{}\" violates not-null constraint",
                        c.name, self.def.name
                    ),
                ));
            }
        }
        Ok(())
    }

    pub fn decode(&self, row: &[u8]) -> Result<Vec<ScalarValue>> {
        codec::decode_row(row, &self.types)
    }

    /// 23505 for a row whose key exists.
    pub fn duplicate(&self, row: &[ScalarValue]) -> Error {
        let cols: Vec<&str> = self
            .def
            .primary_key
            .iter()
            .map(|&i| self.def.columns[i].name.as_str())
            .collect();
        let vals: Vec<String> = self
            .def
            .primary_key
            .iter()
            .map(|&i| row.get(i).map(|v| v.to_string()).unwrap_or_default())
            .collect();
        let mut e = Error::new(
            sqlstate::UNIQUE_VIOLATION,
            format!(
                "duplicate key value violates unique constraint \"{}\"",
                self.constraint_name()
            ),
        );
        e.detail = Some(format!(
            "Key ({})=({}) already exists.",
            cols.join(", "),
            vals.join(", ")
        ));
        e
    }
}

/// A pending write of the transaction, as its own reads see it.
type Overlay = BTreeMap<(u64, Vec<u8>), Option<RowBytes>>;

/// One session's transactional view of the tables: its snapshot, its own
/// writes (read-your-writes) and its read set. Shared between the session
/// and its DataFusion schema provider.
#[derive(Debug, Default)]
pub struct TxnTables {
    inner: Mutex<TxnInner>,
}

#[derive(Debug, Default)]
struct TxnInner {
    snapshot: Option<Snapshot>,
    reads: Vec<TableRead>,
    overlay: Overlay,
    /// Appends buffered in the block (stream id, user columns): scans of
    /// the stream inside the block show them, with `offset` and `ts` NULL
    /// until COMMIT assigns them.
    appends: Vec<(u64, arrow::array::RecordBatch)>,
}

/// Rows a reader sees: key and decoded values.
pub type KeyedRows = Vec<(Vec<u8>, Vec<ScalarValue>)>;

impl TxnTables {
    /// Forget everything: a new transaction (or statement) starts.
    pub fn reset(&self) {
        *self.inner.lock() = TxnInner::default();
    }

    /// The snapshot index, if the transaction has read anything.
    pub fn snapshot_index(&self) -> u64 {
        self.inner
            .lock()
            .snapshot
            .as_ref()
            .map(|s| s.index)
            .unwrap_or(0)
    }

    pub fn reads(&self) -> Vec<TableRead> {
        self.inner.lock().reads.clone()
    }

    pub fn reads_len(&self) -> usize {
        self.inner.lock().reads.len()
    }

    /// Back to a savepoint: its reads stay (they were made), the overlay
    /// and the pending appends are rebuilt from the ops that remain.
    pub fn rebuild_overlay(&self, ops: &[Op]) -> Result<()> {
        let mut inner = self.inner.lock();
        inner.overlay.clear();
        inner.appends.clear();
        for o in ops {
            match &o.kind {
                Some(op::Kind::TableWrite(w)) => {
                    inner.overlay.insert(
                        (w.table_id, w.key.clone()),
                        (w.kind != write_kind::DELETE).then(|| Arc::from(w.row.as_slice())),
                    );
                }
                Some(op::Kind::Append(a)) => {
                    let batch = crate::ipc::decode_ipc(&a.ipc)?;
                    inner.appends.push((a.stream_id, batch));
                }
                _ => {}
            }
        }
        Ok(())
    }

    /// Record an append buffered in the block.
    pub fn record_append(&self, stream: u64, batch: arrow::array::RecordBatch) {
        self.inner.lock().appends.push((stream, batch));
    }

    /// The block's buffered appends to a stream, in order.
    pub fn pending_appends(&self, stream: u64) -> Vec<arrow::array::RecordBatch> {
        self.inner
            .lock()
            .appends
            .iter()
            .filter(|(s, _)| *s == stream)
            .map(|(_, b)| b.clone())
            .collect()
    }

    /// Record a write so later reads in the transaction see it.
    pub fn record_write(&self, table: u64, key: &[u8], row: Option<RowBytes>) {
        self.inner.lock().overlay.insert((table, key.to_vec()), row);
    }

    fn snap(&self, inner: &mut TxnInner, store: &TableStore) -> Snapshot {
        inner
            .snapshot
            .get_or_insert_with(|| store.snapshot())
            .clone()
    }

    /// Read one row by key, recording the read.
    pub fn get(
        &self,
        store: &TableStore,
        table: &Table,
        key: &[u8],
    ) -> Result<Option<Vec<ScalarValue>>> {
        let mut inner = self.inner.lock();
        let id = table.def.id;
        inner.reads.push(TableRead {
            table_id: id,
            key: Some(key.to_vec()),
        });
        // the snapshot is fixed by the first read, even one the
        // transaction's own writes answer
        let snap = self.snap(&mut inner, store);
        if let Some(own) = inner.overlay.get(&(id, key.to_vec())) {
            return own.as_deref().map(|r| table.decode(r)).transpose();
        }
        drop(inner);
        snap.get(id, key)?.map(|v| table.decode(&v.row)).transpose()
    }

    /// Whether a row with this key exists, without recording a read: a
    /// plain INSERT's early duplicate check (the state machine re-checks).
    pub fn peek(&self, store: &TableStore, table: &Table, key: &[u8]) -> Result<bool> {
        let mut inner = self.inner.lock();
        let id = table.def.id;
        let snap = self.snap(&mut inner, store);
        if let Some(own) = inner.overlay.get(&(id, key.to_vec())) {
            return Ok(own.is_some());
        }
        drop(inner);
        Ok(snap.get(id, key)?.is_some())
    }

    /// Read every row, recording a read of the whole table.
    pub fn scan(&self, store: &TableStore, table: &Table) -> Result<KeyedRows> {
        let mut inner = self.inner.lock();
        let id = table.def.id;
        inner.reads.push(TableRead {
            table_id: id,
            key: None,
        });
        let snap = self.snap(&mut inner, store);
        let own = own_writes(&inner, id);
        drop(inner);
        let rows: BTreeMap<Vec<u8>, RowBytes> = snap
            .scan(id)?
            .into_iter()
            .map(|(k, v)| (k, v.row))
            .collect();
        with_own_writes(rows, own, table)
    }

    /// The rows an index lookup finds, with the transaction's own writes to the table on
    /// top (all of them: the filters run again above the scan), recording a read of the
    /// whole table (a row another transaction adds to the range must conflict too).
    /// `None` when the transaction's snapshot does not hold the index whole: it is older
    /// than the command that built it (a transaction that began before CREATE INDEX), or
    /// the index was dropped since the caller looked at the table's definition.
    pub fn index_scan(
        &self,
        store: &TableStore,
        table: &Table,
        lookup: &index::Lookup,
    ) -> Result<Option<KeyedRows>> {
        let mut inner = self.inner.lock();
        let id = table.def.id;
        let snap = self.snap(&mut inner, store);
        if snap.index < index::created_at(&lookup.index) || snap.retired(lookup.index.id) {
            return Ok(None);
        }
        inner.reads.push(TableRead {
            table_id: id,
            key: None,
        });
        let own = own_writes(&inner, id);
        drop(inner);
        let mut rows: BTreeMap<Vec<u8>, RowBytes> = BTreeMap::new();
        for (_, entry) in snap.range(lookup.index.id, &lookup.from, lookup.to.as_deref())? {
            let key = entry.row.to_vec();
            if let Some(row) = snap.get(id, &key)? {
                rows.insert(key, row.row);
            }
        }
        with_own_writes(rows, own, table).map(Some)
    }
}

/// The transaction's own writes to table `id`, in key order.
fn own_writes(inner: &TxnInner, id: u64) -> Vec<(Vec<u8>, Option<RowBytes>)> {
    inner
        .overlay
        .range((id, Vec::new())..(id + 1, Vec::new()))
        .map(|((_, k), v)| (k.clone(), v.clone()))
        .collect()
}

/// Rows read from a snapshot with the transaction's own writes on top, decoded.
fn with_own_writes(
    mut rows: BTreeMap<Vec<u8>, RowBytes>,
    own: Vec<(Vec<u8>, Option<RowBytes>)>,
    table: &Table,
) -> Result<KeyedRows> {
    for (k, v) in own {
        match v {
            Some(r) => rows.insert(k, r),
            None => rows.remove(&k),
        };
    }
    rows.into_iter()
        .map(|(k, r)| Ok((k, table.decode(&r)?)))
        .collect()
}

/// Reserved names are refused for user relations and columns.
pub fn check_name(kind: &str, name: &str) -> Result<()> {
    if name.starts_with(RESERVED_PREFIX) {
        return Err(Error::new(
            sqlstate::RESERVED_NAME,
            format!("{kind} name \"{name}\" is reserved: names starting with \"{RESERVED_PREFIX}\" are Sluice's"),
        ));
    }
    Ok(())
}
