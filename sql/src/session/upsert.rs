//! `INSERT ... ON CONFLICT`: which unique constraints arbitrate ([`Arbiters`]) and which
//! existing row a proposed row conflicts with under them.
//!
//! As in PostgreSQL: `ON CONFLICT (cols)` names the primary key or any UNIQUE index or
//! constraint on exactly those columns, `ON CONSTRAINT n` a primary key or UNIQUE
//! constraint by name, and no target (DO NOTHING only) means every one of them. NULLs
//! never conflict. The lookup reads through the index (or scans, when the transaction's
//! snapshot does not hold the index), recording a read of the whole table, so a
//! concurrent insert of the same value makes the statement retry (40001) rather than
//! both rows commit; the state machine's UNIQUE check stays the last word.

use std::collections::HashSet;

use datafusion::scalar::ScalarValue;
use sqlparser::ast::{ConflictTarget, OnConflictAction, OnInsert};

use super::Session;
use crate::definition::IndexDef;
use crate::error::{sqlstate, Error, Result};
use crate::statement::{self, sqlparser};
use crate::table::{index, Table};

/// The unique constraints that decide whether a proposed row conflicts.
pub(super) struct Arbiters {
    /// The primary key (a table without one never conflicts on its hidden row id).
    key: bool,
    /// UNIQUE indexes and constraints.
    indexes: Vec<IndexDef>,
}

/// An INSERT's ON CONFLICT action and its arbiters, if it has one.
pub(super) fn on_conflict<'a>(
    table: &Table,
    ins: &'a sqlparser::ast::Insert,
) -> Result<Option<(&'a OnConflictAction, Arbiters)>> {
    match &ins.on {
        None => Ok(None),
        Some(OnInsert::OnConflict(c)) => {
            if c.conflict_target.is_none() && matches!(c.action, OnConflictAction::DoUpdate(_)) {
                return Err(Error::syntax(
                    "ON CONFLICT DO UPDATE requires inference specification or constraint name",
                ));
            }
            let arbiters = arbiters(table, c.conflict_target.as_ref())?;
            Ok(Some((&c.action, arbiters)))
        }
        Some(other) => Err(Error::unsupported(format!(
            "{other} is not supported; use ON CONFLICT"
        ))),
    }
}

/// The arbiters of an ON CONFLICT target on `table`.
fn arbiters(table: &Table, target: Option<&ConflictTarget>) -> Result<Arbiters> {
    let unique = table.def.indexes.iter().filter(|i| i.unique);
    let has_key = !table.def.primary_key.is_empty();
    match target {
        None => Ok(Arbiters {
            key: has_key,
            indexes: unique.cloned().collect(),
        }),
        Some(ConflictTarget::Columns(cols)) => {
            let mut named: Vec<usize> = Vec::with_capacity(cols.len());
            for c in cols {
                let name = statement::normalize_ident(c);
                let Some(i) = table.def.columns.iter().position(|d| d.name == name) else {
                    return Err(Error::new(
                        sqlstate::UNDEFINED_COLUMN,
                        format!("column \"{name}\" does not exist"),
                    ));
                };
                named.push(i);
            }
            let same = |cols: &[usize]| {
                let mut a = cols.to_vec();
                let mut b = named.clone();
                a.sort_unstable();
                b.sort_unstable();
                b.dedup();
                a == b
            };
            if has_key && same(&table.def.primary_key) {
                return Ok(Arbiters {
                    key: true,
                    indexes: Vec::new(),
                });
            }
            let indexes: Vec<IndexDef> = unique.filter(|i| same(&i.columns)).cloned().collect();
            if indexes.is_empty() {
                return Err(Error::new(
                    sqlstate::INVALID_COLUMN_REFERENCE,
                    "there is no unique or exclusion constraint matching the ON CONFLICT specification",
                ));
            }
            Ok(Arbiters {
                key: false,
                indexes,
            })
        }
        Some(ConflictTarget::OnConstraint(n)) => {
            let name = statement::table_name(n);
            if has_key && name == table.constraint_name() {
                return Ok(Arbiters {
                    key: true,
                    indexes: Vec::new(),
                });
            }
            match unique.clone().find(|i| i.constraint && i.name == name) {
                Some(i) => Ok(Arbiters {
                    key: false,
                    indexes: vec![i.clone()],
                }),
                None => Err(Error::new(
                    sqlstate::UNDEFINED_OBJECT,
                    format!(
                        "constraint \"{name}\" for table \"{}\" does not exist",
                        table.def.name
                    ),
                )),
            }
        }
    }
}

/// Arbiter values the statement's own proposed rows already took: a later row with the
/// same values conflicts with the earlier one (PostgreSQL inserts rows one by one).
#[derive(Default)]
pub(super) struct Taken(HashSet<(u64, Vec<u8>)>);

impl Taken {
    /// Whether `row` takes values an earlier proposed row took.
    pub(super) fn clashes(&self, arbiters: &Arbiters, row: &[ScalarValue]) -> Result<bool> {
        for i in &arbiters.indexes {
            if let Some(p) = unique_prefix(i, row)? {
                if self.0.contains(&(i.id, p)) {
                    return Ok(true);
                }
            }
        }
        Ok(false)
    }

    /// Record the values `row` takes.
    pub(super) fn take(&mut self, arbiters: &Arbiters, row: &[ScalarValue]) -> Result<()> {
        for i in &arbiters.indexes {
            if let Some(p) = unique_prefix(i, row)? {
                self.0.insert((i.id, p));
            }
        }
        Ok(())
    }
}

/// The encoded values of `row` in a unique index; `None` when one is NULL (never conflicts).
fn unique_prefix(index: &IndexDef, row: &[ScalarValue]) -> Result<Option<Vec<u8>>> {
    let values = index::values(index, row);
    if values.iter().any(|v| v.is_null()) {
        return Ok(None);
    }
    index::prefix(&values).map(Some)
}

impl Session {
    /// The existing row (key and values) that `row`, with key `key`, conflicts with.
    pub(super) fn conflicting_row(
        &self,
        table: &Table,
        arbiters: &Arbiters,
        key: &[u8],
        row: &[ScalarValue],
    ) -> Result<Option<(Vec<u8>, Vec<ScalarValue>)>> {
        let store = &self.engine.tables;
        if arbiters.key {
            if let Some(existing) = self.tables.get(store, table, key)? {
                return Ok(Some((key.to_vec(), existing)));
            }
        }
        for i in &arbiters.indexes {
            let Some(from) = unique_prefix(i, row)? else {
                continue;
            };
            let lookup = index::Lookup {
                index: i.clone(),
                to: index::successor(&from),
                from,
                condition: String::new(),
            };
            let rows = match self.tables.index_scan(store, table, &lookup)? {
                Some(rows) => rows,
                None => self.tables.scan(store, table)?,
            };
            // the lookup holds the transaction's other own rows too: compare the values
            let found = rows
                .into_iter()
                .find(|(_, r)| i.columns.iter().all(|&c| r[c] == row[c]));
            if found.is_some() {
                return Ok(found);
            }
        }
        Ok(None)
    }
}
