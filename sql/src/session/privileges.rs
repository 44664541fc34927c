//! Who the session acts as, and the privilege check every statement passes before it runs,
//! plus the role statements themselves (CREATE/ALTER/DROP ROLE, GRANT, REVOKE).
//!
//! A session whose user names no role at startup acts as a superuser outside the roles (the
//! bootstrap `--superuser`, or any client in trust mode, as before roles existed). One whose
//! user names a role is checked against the catalog's current [`Roles`] at each execution
//! (prepared statements too); if that role is dropped, the session keeps no rights at all.
//! System catalogs are always readable; a user relation needs the privilege for what the
//! statement does with it (`42501 permission denied for table x` otherwise).

use std::collections::BTreeSet;
use std::ops::ControlFlow;

use sqlparser::ast::{ObjectName, Query, Statement, Visit, Visitor};

use super::append::insert_target;
use super::{dml, Output, Session};
use crate::error::{sqlstate, Error, Result};
use crate::roles::{Privilege, RoleChange, Roles};
use crate::statement::{self, sqlparser, Parsed};

impl Session {
    /// Whether the session has a superuser's rights now.
    pub fn is_superuser(&self) -> bool {
        match &self.role {
            None => true,
            Some(r) => self
                .engine
                .catalog
                .roles()
                .get(r)
                .is_some_and(|r| r.superuser),
        }
    }

    /// CREATE INDEX and DROP INDEX: by the owner of the table, as in PostgreSQL.
    fn may_index(&self, p: &Parsed, roles: &crate::roles::Roles, role: &str) -> Result<()> {
        match p {
            Parsed::CreateIndex { table, .. }
                if self.engine.catalog.exists(table) && !roles.owns(role, table) =>
            {
                return Err(denied(format!("must be owner of table {table}")));
            }
            Parsed::DropIndex { names, .. } => {
                for n in names {
                    if let Some((t, _)) = self.engine.catalog.index(n) {
                        if !roles.owns(role, &t.def.name) {
                            return Err(denied(format!("must be owner of index {n}")));
                        }
                    }
                }
            }
            _ => {}
        }
        Ok(())
    }

    /// Refuses `p` unless the session may run it.
    pub(super) fn check_privileges(&self, p: &Parsed) -> Result<()> {
        let Some(role) = self.role.clone() else {
            return Ok(());
        };
        let roles = self.engine.catalog.roles();
        if roles.get(&role).is_some_and(|r| r.superuser) {
            return Ok(());
        }
        let check = Check {
            session: self,
            roles: &roles,
            role: &role,
        };
        match p {
            // EXPLAIN needs what its statement would need (as in PostgreSQL)
            Parsed::Query(stmt) => match &**stmt {
                Statement::Explain { statement, .. }
                    if !matches!(**statement, Statement::Query(_)) =>
                {
                    self.check_privileges(&statement::classify((**statement).clone(), false)?)
                }
                _ => check.reads(stmt, None),
            },
            Parsed::CopyTo { query, .. } | Parsed::Declare { query, .. } => {
                check.reads(&Statement::Query(query.clone()), None)
            }
            Parsed::Insert(ins) => {
                let target = insert_target(ins)?;
                check.may(&target, Privilege::Insert)?;
                check.reads(&Statement::Insert((**ins).clone()), Some(&target))
            }
            Parsed::Update(u) => {
                let target = match &u.table.relation {
                    sqlparser::ast::TableFactor::Table { name, .. } => statement::table_name(name),
                    other => other.to_string(),
                };
                check.may(&target, Privilege::Update)?;
                check.reads(&Statement::Update((**u).clone()), Some(&target))
            }
            Parsed::Delete(d) => {
                let target = dml::delete_target(d)?.0;
                check.may(&target, Privilege::Delete)?;
                check.reads(&Statement::Delete((**d).clone()), Some(&target))
            }
            Parsed::CopyFrom(c) => check.may(&c.stream, Privilege::Insert),
            Parsed::Listen(channel) if self.engine.catalog.get(channel).is_some() => {
                check.may(channel, Privilege::Select)
            }
            Parsed::CreateStream { .. } | Parsed::CreateTable { .. } => {
                if roles.can_create_in_public(&role) {
                    Ok(())
                } else {
                    Err(denied("permission denied for schema public"))
                }
            }
            // the creator must be able to read what the view reads (checked once, here)
            Parsed::CreateView { query, name, .. } => {
                if !roles.can_create_in_public(&role) {
                    return Err(denied("permission denied for schema public"));
                }
                if self.engine.catalog.view(name).is_some() && !roles.owns(&role, name) {
                    return Err(denied(format!("must be owner of view {name}")));
                }
                check.reads(&Statement::Query(query.clone()), None)
            }
            Parsed::CreateIndex { .. } | Parsed::DropIndex { .. } => {
                self.may_index(p, &roles, &role)
            }
            Parsed::AlterStream { name, .. } => {
                if self.engine.catalog.exists(name) && !roles.owns(&role, name) {
                    return Err(denied(format!("must be owner of table {name}")));
                }
                Ok(())
            }
            Parsed::DropRelation { names, .. } => {
                for n in names {
                    if self.engine.catalog.exists(n) && !roles.owns(&role, n) {
                        let kind = if self.engine.catalog.view(n).is_some() {
                            "view"
                        } else {
                            "table"
                        };
                        return Err(denied(format!("must be owner of {kind} {n}")));
                    }
                }
                Ok(())
            }
            Parsed::Roles(_) => Err(denied(
                "permission denied: only a superuser may manage roles and privileges",
            )),
            Parsed::AlterCluster(_) => Err(denied(
                "permission denied: only a superuser may change the cluster",
            )),
            // no relation is touched (a cursor's query was checked when it was declared; a
            // refused statement fails with its own error)
            Parsed::Begin { .. }
            | Parsed::Commit
            | Parsed::Rollback
            | Parsed::Savepoint(_)
            | Parsed::ReleaseSavepoint(_)
            | Parsed::RollbackTo(_)
            | Parsed::Discard
            // what EXECUTE runs is checked when it runs
            | Parsed::Prepare(_)
            | Parsed::Execute { .. }
            | Parsed::Deallocate(_)
            | Parsed::Set { .. }
            | Parsed::Show(_)
            | Parsed::ShowStreams
            | Parsed::Reset(_)
            | Parsed::NoOp(_)
            | Parsed::Fetch { .. }
            | Parsed::Close(_)
            | Parsed::Listen(_)
            | Parsed::Unlisten(_)
            | Parsed::Notify { .. }
            | Parsed::Refused(_) => Ok(()),
        }
    }

    /// The role name a new relation's owner is recorded under (empty: a superuser outside
    /// the roles).
    pub(super) fn owner_name(&self) -> String {
        self.role.clone().unwrap_or_default()
    }

    /// `CREATE ROLE`, `GRANT` ...: the password becomes a verifier here, then one command.
    pub(super) async fn change_roles(&mut self, change: &RoleChange) -> Result<Output> {
        let mut change = change.clone();
        change.hash_password();
        let tag = change.tag();
        let change_json =
            serde_json::to_string(&change).map_err(|e| Error::internal(e.to_string()))?;
        let kind = crate::command::op::Kind::RoleChange(crate::command::RoleChange { change_json });
        // a command of its own, even inside a block (it does not roll back with it); what a
        // pipeline sent before it commits first, so it may name a relation created there
        if self.in_implicit() {
            self.end_implicit().await?;
        }
        let op = crate::command::Op { kind: Some(kind) };
        self.propose(vec![op], 0, vec![]).await?;
        Ok(Output::Tag(tag.into()))
    }
}

fn denied(message: impl Into<String>) -> Error {
    Error::new(sqlstate::INSUFFICIENT_PRIVILEGE, message)
}

struct Check<'a> {
    session: &'a Session,
    roles: &'a Roles,
    role: &'a str,
}

impl Check<'_> {
    fn may(&self, relation: &str, p: Privilege) -> Result<()> {
        let catalog = &self.session.engine.catalog;
        if !catalog.exists(relation) || self.roles.has(self.role, relation, p) {
            // a missing relation fails later with 42P01
            return Ok(());
        }
        Err(denied(format!("permission denied for table {relation}")))
    }

    /// Every user relation `stmt` reads (but `skip`, its write target) needs SELECT.
    fn reads(&self, stmt: &Statement, skip: Option<&str>) -> Result<()> {
        let mut found = Relations::default();
        let _ = stmt.visit(&mut found);
        for name in &found.names {
            // a CTE's name is skipped only when no relation has it: the visitor does not
            // track scopes, and `... FROM secret WHERE EXISTS (WITH secret AS (..) ..)` must
            // still check the real `secret` (denying a query whose CTE shadows a relation the
            // role may not read is the safe side)
            let cte_only = found.ctes.contains(name) && !self.session.engine.catalog.exists(name);
            if Some(name.as_str()) == skip || cte_only {
                continue;
            }
            self.may(name, Privilege::Select)?;
        }
        Ok(())
    }
}

/// The relation names a statement mentions (unqualified or in schema public) and the names
/// its WITH clauses define.
#[derive(Default)]
struct Relations {
    names: BTreeSet<String>,
    ctes: BTreeSet<String>,
}

impl Visitor for Relations {
    type Break = ();

    fn pre_visit_query(&mut self, q: &Query) -> ControlFlow<()> {
        if let Some(with) = &q.with {
            for cte in &with.cte_tables {
                self.ctes
                    .insert(statement::normalize_ident(&cte.alias.name));
            }
        }
        ControlFlow::Continue(())
    }

    fn pre_visit_relation(&mut self, name: &ObjectName) -> ControlFlow<()> {
        let parts: Vec<String> = name
            .0
            .iter()
            .map(|p| match p.as_ident() {
                Some(id) => statement::normalize_ident(id),
                None => p.to_string(),
            })
            .collect();
        match parts.as_slice() {
            [n] => {
                self.names.insert(n.clone());
            }
            [schema, n] if schema == "public" => {
                self.names.insert(n.clone());
            }
            [_, schema, n] if schema == "public" => {
                self.names.insert(n.clone());
            }
            _ => {}
        }
        ControlFlow::Continue(())
    }
}
