//! Views in the state machine: `CREATE [OR REPLACE] VIEW` and the dependency rules that keep
//! a view's stored query meaningful (see [`crate::views`]).
//!
//! Every check here runs in `validate`, before any op of the command applies, and reads only
//! the replicated catalog, so every replica refuses the same commands: a view reads only
//! relations that exist and never itself; a relation views read is dropped only with them
//! (CASCADE, or all in one DROP) and is not renamed nor given new or renamed columns while
//! they exist.

use std::sync::Arc;

use super::{Applied, Database};
use crate::command::{op, AlterStream, Command, CreateView, DropRelation, OpOutcome};
use crate::definition::ViewDef;
use crate::error::{sqlstate, Error};
use crate::views;

impl Database {
    /// Checks a `CREATE [OR REPLACE] VIEW`; `exists` sees the command's earlier ops. True
    /// when it replaces a view.
    pub(super) fn validate_create_view(
        &self,
        c: &CreateView,
        exists: &dyn Fn(&str) -> Option<u64>,
    ) -> Result<bool, Error> {
        let def = view_def(c)?;
        let lookup = |n: &str| self.catalog.view(n);
        let old = self.catalog.view(&c.name);
        match (&old, exists(&c.name)) {
            (Some(_), Some(_)) if c.or_replace => {}
            (None, Some(_)) if c.or_replace => {
                return Err(Error::new(
                    sqlstate::WRONG_OBJECT_TYPE,
                    format!("\"{}\" is not a view", c.name),
                ))
            }
            (_, Some(_)) => {
                return Err(Error::new(
                    sqlstate::DUPLICATE_TABLE,
                    format!("relation \"{}\" already exists", c.name),
                ))
            }
            (_, None) => {}
        }
        if let Some(missing) = def.depends_on.iter().find(|d| exists(d).is_none()) {
            return Err(Error::undefined_table(missing));
        }
        if views::reaches(&c.name, &def.depends_on, &lookup) {
            return Err(Error::new(
                sqlstate::INVALID_OBJECT_DEFINITION,
                format!(
                    "infinite recursion detected in rules for relation \"{}\"",
                    c.name
                ),
            ));
        }
        let replaces = old.is_some() && exists(&c.name).is_some();
        if let Some(old) = old.filter(|_| replaces) {
            replaceable(&old.def, &def)?;
        }
        views::parse(def)?;
        Ok(replaces)
    }

    /// Checks a drop that names an existing relation: the right kind, and (without CASCADE)
    /// no view reading it that the command does not drop as well. `is_view`: as the
    /// command's earlier ops left the name.
    pub(super) fn validate_drop(
        &self,
        d: &DropRelation,
        is_view: bool,
        cmd: &Command,
    ) -> Result<(), Error> {
        if d.view != is_view {
            return Err(views::wrong_drop_kind(&d.name, d.view));
        }
        if d.cascade {
            return Ok(());
        }
        let dropped_too = |name: &str| {
            cmd.ops
                .iter()
                .any(|o| matches!(&o.kind, Some(op::Kind::DropRelation(x)) if x.name == name))
        };
        if let Some(v) = self
            .catalog
            .dependents(&d.name)
            .into_iter()
            .find(|v| !dropped_too(v))
        {
            let what = format!("{} {}", self.kind_of(&d.name), d.name);
            return Err(views::drop_blocked(&what, &v));
        }
        Ok(())
    }

    /// A rename, or a column added or renamed, is refused while views read the stream: their
    /// stored text names it and its columns as they were.
    pub(super) fn check_no_dependents(&self, a: &AlterStream) -> Result<(), Error> {
        if !views::alter_renames(a) {
            return Ok(());
        }
        match self.catalog.dependents(&a.name).first() {
            None => Ok(()),
            Some(v) => Err(views::alter_blocked(&a.name, v)),
        }
    }

    fn kind_of(&self, name: &str) -> &'static str {
        if self.catalog.get(name).is_some() {
            "stream"
        } else if self.catalog.view(name).is_some() {
            "view"
        } else {
            "table"
        }
    }

    /// `CREATE [OR REPLACE] VIEW` (op `i` of the command at `index`): a new view gets its
    /// id and OID from where it applies; a replaced one keeps them, and its owner.
    pub(super) fn create_view(&mut self, index: u64, i: usize, c: CreateView) -> Applied {
        let mut def = match view_def(&c) {
            Ok(d) => d,
            Err(e) => return Ok(Err(e)),
        };
        let old = self.catalog.view(&c.name);
        match &old {
            Some(v) => {
                def.id = v.def.id;
                def.oid = v.def.oid;
            }
            None => {
                def.id = index * 1024 + i as u64 + 1;
                def.oid = self.next_oid;
                self.next_oid += 1;
            }
        }
        let view = match views::parse(def) {
            Ok(v) => v,
            Err(e) => return Ok(Err(e)),
        };
        self.catalog.insert_view(Arc::new(view));
        if old.is_none() {
            self.owned_by(&c.name, &c.owner);
        }
        Ok(Ok(OpOutcome::Created { existed: false }))
    }

    /// Drops every view that reads `name`, and the views over those (CASCADE).
    pub(super) fn drop_dependents(&mut self, name: &str) {
        for v in self.catalog.dependents(name) {
            self.drop_dependents(&v);
            self.drop_view(&v);
        }
    }

    pub(super) fn drop_view(&mut self, name: &str) {
        if self.catalog.remove_view(name).is_some() {
            let mut roles = (*self.catalog.roles()).clone();
            roles.dropped(name);
            self.catalog.set_roles(roles);
        }
    }
}

fn view_def(c: &CreateView) -> Result<ViewDef, Error> {
    let mut def: ViewDef = serde_json::from_str(&c.definition_json)
        .map_err(|e| Error::internal(format!("bad view definition: {e}")))?;
    def.name = c.name.clone();
    Ok(def)
}

/// `CREATE OR REPLACE VIEW` keeps the old columns, in order, with their types (PostgreSQL's
/// rule: views over it still mean the same); it may add columns at the end.
fn replaceable(old: &ViewDef, new: &ViewDef) -> Result<(), Error> {
    if new.columns.len() < old.columns.len() {
        return Err(Error::new(
            sqlstate::INVALID_TABLE_DEFINITION,
            "cannot drop columns from view",
        ));
    }
    for (o, n) in old.columns.iter().zip(&new.columns) {
        if o.name != n.name {
            return Err(Error::new(
                sqlstate::INVALID_TABLE_DEFINITION,
                format!(
                    "cannot change name of view column \"{}\" to \"{}\"",
                    o.name, n.name
                ),
            ));
        }
        if o.ty != n.ty {
            return Err(Error::new(
                sqlstate::INVALID_TABLE_DEFINITION,
                format!(
                    "cannot change data type of view column \"{}\" from {} to {}",
                    o.name,
                    o.ty.sql_name(),
                    n.ty.sql_name()
                ),
            ));
        }
    }
    Ok(())
}
