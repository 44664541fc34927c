//! Secondary indexes in the state machine: `CREATE [UNIQUE] INDEX`, `DROP INDEX`, and the
//! index entries every table write adds and removes (see [`crate::table::index`]).
//!
//! Invariants:
//! - Everything that can fail is decided in [`Database::plan_indexes`], before any op of
//!   the command applies, from the replicated state alone: a missing table or column, a
//!   name taken, an index to drop that is not there, a duplicate under a UNIQUE index. So
//!   every replica refuses the same commands, and a refused command leaves no trace.
//! - An index's entries are exactly its table's rows as the command leaves them: an index
//!   the command creates is built from them; an existing one changes by what the command
//!   writes (the old row's entry out, the new row's in). They are table-store writes of the
//!   same command, so they become durable, checkpointed and replicated with the rows.
//! - Uniqueness is checked on the state the command leaves (like a deferred constraint):
//!   rows that swap values within one transaction do not conflict.
//! - An index id is `index * 1024 + op + 1` of its `CreateIndex` op, like table ids:
//!   never another table's or index's.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use super::{created_table, Applied, Database};
use crate::block_catalog::LOCAL_ID_BASE;
use crate::catalog::Catalog;
use crate::command::{op, Command, CreateIndex, DropIndex, OpOutcome};
use crate::definition::IndexDef;
use crate::error::{sqlstate, Error};
use crate::table::codec::RowBytes;
use crate::table::index;
use crate::table::store::{Snapshot, Write};
use crate::table::Table;

/// A table's indexes as the command leaves them; `true`: created by the command.
struct Indexed {
    table: Arc<Table>,
    indexes: Vec<(IndexDef, bool)>,
}

impl Database {
    /// Checks the command's index ops and returns the index entries its table writes
    /// (`writes`, already planned) and new indexes need.
    pub(super) fn plan_indexes(
        &self,
        index: u64,
        cmd: &Command,
        creates_table: &[usize],
        writes: &[Write],
    ) -> Result<Vec<Write>, Error> {
        let mut tables: BTreeMap<u64, Indexed> = BTreeMap::new();
        // index names the command's earlier ops created (Some: on that table) or dropped
        let mut names: HashMap<String, Option<u64>> = HashMap::new();
        for (i, o) in cmd.ops.iter().enumerate() {
            match &o.kind {
                Some(op::Kind::CreateIndex(c)) => {
                    let table = self.index_target(index, cmd, i, c, creates_table)?;
                    let taken = match names.get(&c.name) {
                        Some(t) => t.is_some(),
                        None => {
                            self.catalog.index(&c.name).is_some() || self.catalog.exists(&c.name)
                        }
                    };
                    if taken {
                        if c.if_not_exists {
                            continue;
                        }
                        return Err(relation_exists(&c.name));
                    }
                    let def = IndexDef {
                        id: index * 1024 + i as u64 + 1,
                        oid: 0,
                        name: c.name.clone(),
                        columns: column_positions(&table, &c.columns)?,
                        options: c.options.clone(),
                        unique: c.unique,
                        constraint: c.constraint,
                    };
                    names.insert(c.name.clone(), Some(table.def.id));
                    indexed(&mut tables, &table).indexes.push((def, true));
                }
                Some(op::Kind::DropIndex(d)) => {
                    let on = match names.get(&d.name) {
                        Some(t) => *t,
                        None => self.catalog.index(&d.name).map(|(t, _)| t.def.id),
                    };
                    let Some(table_id) = on else {
                        if d.if_exists {
                            continue;
                        }
                        return Err(missing_index(&self.catalog, &d.name));
                    };
                    if let Some((t, x)) = self.catalog.index(&d.name) {
                        if x.constraint && !names.contains_key(&d.name) {
                            return Err(constraint_requires(&d.name, &t.def.name));
                        }
                    }
                    names.insert(d.name.clone(), None);
                    if let Some(t) = tables.get_mut(&table_id) {
                        t.indexes.retain(|(x, _)| x.name != d.name);
                    } else if let Some(table) = self.catalog.table_by_id(table_id) {
                        indexed(&mut tables, &table)
                            .indexes
                            .retain(|(x, _)| x.name != d.name);
                    }
                }
                Some(op::Kind::DropRelation(d)) => {
                    if let Some(id) = self.catalog.table(&d.name).map(|t| t.def.id) {
                        tables.remove(&id);
                        names.extend(
                            self.catalog
                                .table(&d.name)
                                .into_iter()
                                .flat_map(|t| t.def.indexes.clone())
                                .map(|x| (x.name, None)),
                        );
                    }
                }
                _ => {}
            }
        }
        let mut looked_up = std::collections::HashSet::new();
        for w in writes {
            if tables.contains_key(&w.table) || !looked_up.insert(w.table) {
                continue;
            }
            if let Some(t) = self.catalog.table_by_id(w.table) {
                if !t.def.indexes.is_empty() {
                    indexed(&mut tables, &t);
                }
            }
        }
        let last_write = last_writes(index, cmd);
        let snap = self.tables.snapshot();
        let mut out = Vec::new();
        for t in tables.values() {
            let mut changed: BTreeMap<&[u8], Option<&RowBytes>> = BTreeMap::new();
            for w in writes.iter().filter(|w| w.table == t.table.def.id) {
                changed.insert(&w.key, w.row.as_ref());
            }
            for (def, new) in &t.indexes {
                // a duplicate is the new index's if every write to the table came before it
                // (PostgreSQL's CREATE UNIQUE INDEX over the rows), else a write's
                let building = *new
                    && last_write
                        .get(&t.table.def.id)
                        .is_none_or(|&w| w < (def.id - index * 1024) as usize);
                let entries = entries(&snap, &t.table, def, *new, &changed);
                out.extend(entries.map_err(|e| match e {
                    Duplicate::Of(row) => index::duplicate(&t.table, def, &row, building),
                    Duplicate::Error(e) => e,
                })?);
            }
        }
        Ok(out)
    }

    /// The table a `CREATE INDEX` names, as the command's earlier ops leave it.
    fn index_target(
        &self,
        index: u64,
        cmd: &Command,
        i: usize,
        c: &CreateIndex,
        creates_table: &[usize],
    ) -> Result<Arc<Table>, Error> {
        if c.table_id >= LOCAL_ID_BASE {
            let j = (c.table_id - LOCAL_ID_BASE) as usize;
            return created_table(index, cmd, i, j, &c.table, creates_table);
        }
        let dropped = cmd.ops[..i]
            .iter()
            .any(|o| matches!(&o.kind, Some(op::Kind::DropRelation(d)) if d.name == c.table));
        match self.catalog.table(&c.table) {
            Some(t) if !dropped && t.def.id == c.table_id => Ok(t),
            Some(_) if !dropped => Err(Error::new(
                sqlstate::SERIALIZATION_FAILURE,
                format!(
                    "table \"{}\" was dropped and re-created while the transaction ran",
                    c.table
                ),
            )),
            _ if self.catalog.get(&c.table).is_some() && !dropped => Err(on_stream(&c.table)),
            _ => Err(Error::undefined_table(&c.table)),
        }
    }

    /// `CREATE INDEX` (op `i` of the command at `index`): the table's definition gains it;
    /// its entries are among the command's table writes (see `plan_indexes`).
    pub(super) fn create_index(&mut self, index: u64, i: usize, c: CreateIndex) -> Applied {
        if self.catalog.index(&c.name).is_some() || self.catalog.exists(&c.name) {
            return Ok(Ok(OpOutcome::Created { existed: true }));
        }
        let Some(table) = self.catalog.table(&c.table) else {
            return Ok(Err(Error::internal("CREATE INDEX of a table that is gone")));
        };
        let columns = match column_positions(&table, &c.columns) {
            Ok(c) => c,
            Err(e) => return Ok(Err(e)),
        };
        let mut def = table.def.clone();
        def.indexes.push(IndexDef {
            id: index * 1024 + i as u64 + 1,
            oid: self.next_oid,
            name: c.name,
            columns,
            options: c.options,
            unique: c.unique,
            constraint: c.constraint,
        });
        self.next_oid += 1;
        self.catalog.insert_table(Arc::new(Table::new(def)));
        Ok(Ok(OpOutcome::Created { existed: false }))
    }

    /// `DROP INDEX`: the definition loses it; its entries go at the next checkpoint.
    pub(super) fn drop_index(&mut self, index: u64, d: DropIndex) -> Applied {
        let Some((table, gone)) = self.catalog.index(&d.name) else {
            return Ok(Ok(OpOutcome::Dropped { existed: false }));
        };
        let mut def = table.def.clone();
        def.indexes.retain(|x| x.name != d.name);
        self.catalog.insert_table(Arc::new(Table::new(def)));
        self.tables.retire(index, gone.id);
        self.dropped_tables.push(gone.id);
        Ok(Ok(OpOutcome::Dropped { existed: true }))
    }

    /// The index storage a dropped table leaves: gone with it.
    pub(super) fn drop_table_indexes(&mut self, index: u64, table: &Table) {
        for x in &table.def.indexes {
            self.tables.retire(index, x.id);
            self.dropped_tables.push(x.id);
        }
    }
}

/// Op position (+ 1) of the command's last write to each table, by the id it will have.
fn last_writes(index: u64, cmd: &Command) -> HashMap<u64, usize> {
    let mut last = HashMap::new();
    for (i, o) in cmd.ops.iter().enumerate() {
        if let Some(op::Kind::TableWrite(w)) = &o.kind {
            let id = match w.table_id.checked_sub(LOCAL_ID_BASE) {
                Some(j) => index * 1024 + j + 1,
                None => w.table_id,
            };
            last.insert(id, i + 1);
        }
    }
    last
}

fn indexed<'m>(tables: &'m mut BTreeMap<u64, Indexed>, table: &Arc<Table>) -> &'m mut Indexed {
    tables.entry(table.def.id).or_insert_with(|| Indexed {
        table: table.clone(),
        indexes: table
            .def
            .indexes
            .iter()
            .map(|x| (x.clone(), false))
            .collect(),
    })
}

fn column_positions(table: &Table, columns: &[String]) -> Result<Vec<usize>, Error> {
    columns
        .iter()
        .map(|name| {
            table
                .def
                .columns
                .iter()
                .position(|c| &c.name == name)
                .ok_or_else(|| {
                    Error::new(
                        sqlstate::UNDEFINED_COLUMN,
                        format!("column \"{name}\" does not exist"),
                    )
                })
        })
        .collect()
}

/// `DROP INDEX` of a name no index has: a primary key's index (2BP01), another relation
/// (42809), nothing (42704).
pub(crate) fn missing_index(catalog: &Catalog, name: &str) -> Error {
    let pkey = catalog
        .tables()
        .into_iter()
        .find(|t| !t.def.primary_key.is_empty() && t.constraint_name() == name);
    if let Some(t) = pkey {
        return constraint_requires(name, &t.def.name);
    }
    if catalog.exists(name) {
        return Error::new(
            sqlstate::WRONG_OBJECT_TYPE,
            format!("\"{name}\" is not an index"),
        );
    }
    Error::new(
        sqlstate::UNDEFINED_OBJECT,
        format!("index \"{name}\" does not exist"),
    )
}

/// `DROP INDEX` of the index of a primary key or UNIQUE constraint (2BP01).
pub(crate) fn constraint_requires(name: &str, table: &str) -> Error {
    Error::new(
        sqlstate::DEPENDENT_OBJECTS_STILL_EXIST,
        format!("cannot drop index {name} because constraint {name} on table {table} requires it"),
    )
}

pub(crate) fn relation_exists(name: &str) -> Error {
    Error::new(
        sqlstate::DUPLICATE_TABLE,
        format!("relation \"{name}\" already exists"),
    )
}

/// Streams have no secondary indexes (see the README: history is found by offset and `ts`).
pub(crate) fn on_stream(name: &str) -> Error {
    let mut e = Error::unsupported(format!(
        "cannot create an index on stream \"{name}\": streams are append-only logs found by offset and ts"
    ));
    e.detail = Some(
        "Filter history by offset or ts (each segment knows its ranges), or keep the rows you look up by key in a table."
            .into(),
    );
    e
}

/// The entry writes of one index: all rows of `changed` (the command's net writes to the
/// table, by key) out of and into it — or, for a new index, every row the table will hold —
/// after checking uniqueness.
/// Why an index's entries could not be planned.
enum Duplicate {
    /// Two rows have this row's values under a UNIQUE index.
    Of(Vec<datafusion::scalar::ScalarValue>),
    Error(Error),
}

impl From<Error> for Duplicate {
    fn from(e: Error) -> Duplicate {
        Duplicate::Error(e)
    }
}

fn entries(
    snap: &Snapshot,
    table: &Table,
    def: &IndexDef,
    new: bool,
    changed: &BTreeMap<&[u8], Option<&RowBytes>>,
) -> Result<Vec<Write>, Duplicate> {
    // entry -> Some(row key) added, None removed
    let mut delta: BTreeMap<Vec<u8>, Option<Vec<u8>>> = BTreeMap::new();
    let mut added: Vec<(Vec<u8>, usize, Vec<datafusion::scalar::ScalarValue>)> = Vec::new();
    let mut put = |delta: &mut BTreeMap<_, _>, key: &[u8], row: &[u8]| -> Result<(), Error> {
        let values = table.decode(row)?;
        let (e, at) = index::entry(def, &values, key)?;
        delta.insert(e.clone(), Some(key.to_vec()));
        added.push((e, at, values));
        Ok(())
    };
    if new {
        for (key, row) in snap.scan(table.def.id)? {
            if !changed.contains_key(key.as_slice()) {
                put(&mut delta, &key, &row.row)?;
            }
        }
    }
    for (key, row) in changed {
        if !new {
            if let Some(old) = snap.get(table.def.id, key)? {
                let (e, _) = index::entry(def, &table.decode(&old.row)?, key)?;
                delta.insert(e, None);
            }
        }
        if let Some(row) = row {
            put(&mut delta, key, row)?;
        }
    }
    if def.unique {
        for (e, at, values) in &added {
            if index::values(def, values).iter().any(|v| v.is_null()) {
                continue;
            }
            let prefix = &e[..*at];
            let to = index::successor(prefix);
            let mut holders: BTreeMap<Vec<u8>, bool> = BTreeMap::new();
            if !new {
                for (k, _) in snap.range(def.id, prefix, to.as_deref())? {
                    holders.insert(k, true);
                }
            }
            let upper = to
                .clone()
                .map_or(std::ops::Bound::Unbounded, std::ops::Bound::Excluded);
            for (k, v) in
                delta.range::<Vec<u8>, _>((std::ops::Bound::Included(prefix.to_vec()), upper))
            {
                holders.insert(k.clone(), v.is_some());
            }
            if holders.values().filter(|h| **h).count() > 1 {
                return Err(Duplicate::Of(values.clone()));
            }
        }
    }
    Ok(delta
        .into_iter()
        .map(|(key, row)| Write {
            table: def.id,
            key,
            row: row.map(|k| Arc::from(k.as_slice())),
        })
        .collect())
}
