//! `CREATE INDEX` and `DROP INDEX` in a session: the checks PostgreSQL makes when the
//! statement runs (against the block's view of the names, as for other DDL), the name
//! PostgreSQL picks for an unnamed index, and the op. The state machine checks everything
//! again when the command applies (`apply::indexes`), and finds duplicates under a new
//! UNIQUE index there.

use super::transaction::Txn;
use super::{Output, Session};
use crate::apply::{constraint_requires, missing_index, on_stream, relation_exists};
use crate::block_catalog::LOCAL_ID_BASE;
use crate::command::{op, CreateIndex, DropIndex};
use crate::definition::{IndexDef, TableDef};
use crate::error::{sqlstate, Error, Result};
use crate::table::check_name;

/// PostgreSQL's longest identifier (NAMEDATALEN - 1 bytes).
const MAX_NAME_BYTES: usize = 63;

impl Session {
    pub(super) async fn create_index(
        &mut self,
        name: Option<&str>,
        table: &str,
        columns: &[String],
        options: &[u32],
        unique: bool,
        if_not_exists: bool,
    ) -> Result<Output> {
        let catalog = &self.engine.catalog;
        let Some(t) = self.table(table) else {
            if self.block.stream(table, catalog).is_some() {
                return Err(on_stream(table));
            }
            if self.block.view(table, catalog).is_some() {
                let mut e = Error::new(
                    sqlstate::WRONG_OBJECT_TYPE,
                    format!("cannot create index on relation \"{table}\""),
                );
                e.detail = Some("This operation is not supported for views.".into());
                return Err(e);
            }
            return Err(Error::undefined_table(table));
        };
        for c in columns {
            match t.def.columns.iter().find(|d| &d.name == c) {
                None => {
                    return Err(Error::new(
                        sqlstate::UNDEFINED_COLUMN,
                        format!("column \"{c}\" does not exist"),
                    ))
                }
                Some(d) => d.check_key_column()?,
            }
        }
        let name = match name {
            Some(n) => {
                check_name("index", n)?;
                n.to_string()
            }
            None => self.chosen_index_name(table, columns, "idx", &[]),
        };
        if self.index_name_taken(&name) {
            if if_not_exists {
                return Ok(Output::Tag("CREATE INDEX".into()));
            }
            return Err(relation_exists(&name));
        }
        let op = CreateIndex {
            name,
            table: table.to_string(),
            table_id: t.def.id,
            columns: columns.to_vec(),
            unique,
            if_not_exists,
            constraint: false,
            options: options.to_vec(),
        };
        self.run_ddl(vec![op::Kind::CreateIndex(op)], "CREATE INDEX")
            .await
    }

    /// `DROP INDEX a, b`: all or none (a missing one fails the statement unless `IF EXISTS`).
    pub(super) async fn drop_indexes(
        &mut self,
        names: &[String],
        if_exists: bool,
    ) -> Result<Output> {
        let mut kinds = Vec::new();
        for name in names {
            if let Some((t, x)) = self.engine.catalog.index(name) {
                if x.constraint && self.block_index(name).is_none() {
                    return Err(constraint_requires(name, &t.def.name));
                }
            }
            if !self.index_exists(name) {
                if if_exists {
                    continue;
                }
                return Err(missing_index(&self.engine.catalog, name));
            }
            kinds.push(op::Kind::DropIndex(DropIndex {
                name: name.clone(),
                if_exists,
            }));
        }
        if kinds.is_empty() {
            return Ok(Output::Tag("DROP INDEX".into()));
        }
        self.run_ddl(kinds, "DROP INDEX").await
    }

    /// What the open block's index ops made of `name` (`Some(true)` created, `Some(false)`
    /// dropped).
    fn block_index(&self, name: &str) -> Option<bool> {
        let Txn::Block(b) = &self.txn else {
            return None;
        };
        b.ops.iter().rev().find_map(|o| match &o.kind {
            Some(op::Kind::CreateIndex(c)) if c.name == name => Some(true),
            Some(op::Kind::DropIndex(d)) if d.name == name => Some(false),
            _ => None,
        })
    }

    fn index_exists(&self, name: &str) -> bool {
        self.block_index(name)
            .unwrap_or_else(|| self.engine.catalog.index(name).is_some())
    }

    /// Whether a relation or an index has the name (they share PostgreSQL's namespace).
    fn index_name_taken(&self, name: &str) -> bool {
        self.index_exists(name) || self.block.exists(name, &self.engine.catalog)
    }

    /// The `CreateIndex` ops of a new table's UNIQUE constraints (`def.indexes` as the
    /// statement gave them), to follow its `CreateTable` op: they name the table by the
    /// local id that op gives it (see `block_catalog`).
    pub(super) fn constraint_indexes(
        &self,
        def: &TableDef,
        unique: Vec<IndexDef>,
    ) -> Result<Vec<op::Kind>> {
        let at = match &self.txn {
            Txn::Block(b) => b.ops.len(),
            _ => 0,
        };
        let mut named: Vec<String> = Vec::new();
        let mut out = Vec::new();
        for u in unique {
            let columns: Vec<String> = u
                .columns
                .iter()
                .map(|&c| def.columns[c].name.clone())
                .collect();
            for &c in &u.columns {
                def.columns[c].check_key_column()?;
            }
            let name = if u.name.is_empty() {
                self.chosen_index_name(&def.name, &columns, "key", &named)
            } else {
                check_name("constraint", &u.name)?;
                u.name
            };
            if named.contains(&name) || name == def.name || self.index_name_taken(&name) {
                return Err(relation_exists(&name));
            }
            named.push(name.clone());
            out.push(op::Kind::CreateIndex(CreateIndex {
                name,
                table: def.name.clone(),
                table_id: LOCAL_ID_BASE + at as u64,
                columns,
                unique: true,
                if_not_exists: false,
                constraint: true,
                options: Vec::new(),
            }));
        }
        Ok(out)
    }

    /// PostgreSQL's name for `CREATE INDEX ON t (a, b)` (`label` "idx") or a `UNIQUE (a, b)`
    /// constraint ("key"): `t_a_b_idx`, cut to 63 bytes, then `t_a_b_idx1`, `t_a_b_idx2`...
    /// while taken (or in `also_taken`).
    fn chosen_index_name(
        &self,
        table: &str,
        columns: &[String],
        label: &str,
        also_taken: &[String],
    ) -> String {
        let base = format!("{table}_{}", columns.join("_"));
        (0u32..)
            .map(|n| {
                let label = if n == 0 {
                    label.to_string()
                } else {
                    format!("{label}{n}")
                };
                let mut cut = MAX_NAME_BYTES - label.len() - 1;
                while !base.is_char_boundary(cut.min(base.len())) {
                    cut -= 1;
                }
                format!("{}_{label}", &base[..cut.min(base.len())])
            })
            .find(|n| !self.index_name_taken(n) && !also_taken.contains(n))
            .unwrap_or_default()
    }
}
