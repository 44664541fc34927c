//! Roles and privileges: who exists, who may log in (with which SCRAM verifier), who owns
//! which relation and who was granted what on it.
//!
//! A [`Roles`] value is part of the replicated state: only the state machine
//! ([`crate::apply`]) changes it, by applying a [`RoleChange`] carried JSON-encoded in a
//! command (`op::Kind::RoleChange`), and it is saved in the checkpoint record with the
//! catalog. Invariants: applying a change is deterministic — passwords arrive already as
//! verifiers (the proposing session salts them), role OIDs come from the state machine's OID
//! counter; a change is validated in full before anything changes (a failed change leaves no
//! trace); a user name that names no role is the bootstrap superuser's (or, in trust mode,
//! any client's) and is not governed by this module; owners have every privilege on what
//! they own; membership is inherited (PostgreSQL's default `INHERIT`).

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use crate::error::{sqlstate, Error, Result};

/// A privilege on a relation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum Privilege {
    Select,
    Insert,
    Update,
    Delete,
}

impl Privilege {
    pub const ALL: [Privilege; 4] = [
        Privilege::Insert,
        Privilege::Select,
        Privilege::Update,
        Privilege::Delete,
    ];

    /// The letter of PostgreSQL's aclitem text form.
    pub fn letter(self) -> char {
        match self {
            Privilege::Select => 'r',
            Privilege::Insert => 'a',
            Privilege::Update => 'w',
            Privilege::Delete => 'd',
        }
    }

    pub fn keyword(self) -> &'static str {
        match self {
            Privilege::Select => "SELECT",
            Privilege::Insert => "INSERT",
            Privilege::Update => "UPDATE",
            Privilege::Delete => "DELETE",
        }
    }
}

/// One role.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Role {
    pub name: String,
    pub oid: u32,
    pub superuser: bool,
    pub login: bool,
    /// SCRAM verifier in PostgreSQL's text form; `None`: no password.
    #[serde(default)]
    pub verifier: Option<String>,
    /// Roles this one is a member of (directly).
    #[serde(default)]
    pub member_of: BTreeSet<String>,
}

/// Which relations a GRANT or REVOKE names.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Relations {
    Named(Vec<String>),
    /// `ALL TABLES IN SCHEMA public`: every stream and table existing when it applies.
    AllInPublic,
}

/// A change to the roles, as proposed (JSON in `op::Kind::RoleChange`). Its `Debug` form
/// hides passwords (a statement may be logged while it still holds one in clear).
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum RoleChange {
    Create {
        name: String,
        superuser: bool,
        login: bool,
        /// A verifier when proposed (a session holding the statement has the password here
        /// until [`RoleChange::hash_password`]).
        password: Option<String>,
    },
    Alter {
        name: String,
        superuser: Option<bool>,
        login: Option<bool>,
        /// `Some(None)`: `PASSWORD NULL` (JSON `null`; an absent field is "unchanged").
        #[serde(
            default,
            skip_serializing_if = "Option::is_none",
            deserialize_with = "null_is_some_none"
        )]
        password: Option<Option<String>>,
    },
    Drop {
        names: Vec<String>,
        if_exists: bool,
    },
    Privileges {
        grant: bool,
        privileges: Vec<Privilege>,
        relations: Relations,
        roles: Vec<String>,
    },
    /// `GRANT/REVOKE CREATE ON SCHEMA public`.
    SchemaCreate {
        grant: bool,
        roles: Vec<String>,
    },
    /// `GRANT/REVOKE granted TO/FROM members`.
    Membership {
        grant: bool,
        granted: Vec<String>,
        members: Vec<String>,
    },
}

impl std::fmt::Debug for RoleChange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        const HIDDEN: &str = "<hidden>";
        match self {
            RoleChange::Create {
                name,
                superuser,
                login,
                password,
            } => f
                .debug_struct("Create")
                .field("name", name)
                .field("superuser", superuser)
                .field("login", login)
                .field("password", &password.as_ref().map(|_| HIDDEN))
                .finish(),
            RoleChange::Alter {
                name,
                superuser,
                login,
                password,
            } => f
                .debug_struct("Alter")
                .field("name", name)
                .field("superuser", superuser)
                .field("login", login)
                .field(
                    "password",
                    &password.as_ref().map(|p| p.as_ref().map(|_| HIDDEN)),
                )
                .finish(),
            RoleChange::Drop { names, if_exists } => f
                .debug_struct("Drop")
                .field("names", names)
                .field("if_exists", if_exists)
                .finish(),
            RoleChange::Privileges {
                grant,
                privileges,
                relations,
                roles,
            } => f
                .debug_struct("Privileges")
                .field("grant", grant)
                .field("privileges", privileges)
                .field("relations", relations)
                .field("roles", roles)
                .finish(),
            RoleChange::SchemaCreate { grant, roles } => f
                .debug_struct("SchemaCreate")
                .field("grant", grant)
                .field("roles", roles)
                .finish(),
            RoleChange::Membership {
                grant,
                granted,
                members,
            } => f
                .debug_struct("Membership")
                .field("grant", grant)
                .field("granted", granted)
                .field("members", members)
                .finish(),
        }
    }
}

impl RoleChange {
    /// Replaces a plain password by a freshly salted verifier (one already in verifier form is
    /// kept as it is, as PostgreSQL does).
    pub fn hash_password(&mut self) {
        let slot = match self {
            RoleChange::Create { password, .. } => password.as_mut(),
            RoleChange::Alter { password, .. } => password.as_mut().and_then(|p| p.as_mut()),
            _ => None,
        };
        if let Some(p) = slot {
            if crate::scram::Verifier::parse(p).is_none() {
                *p = crate::scram::Verifier::new(p).to_text();
            }
        }
    }

    /// The command tag of the statement.
    pub fn tag(&self) -> &'static str {
        match self {
            RoleChange::Create { .. } => "CREATE ROLE",
            RoleChange::Alter { .. } => "ALTER ROLE",
            RoleChange::Drop { .. } => "DROP ROLE",
            RoleChange::Privileges { grant: true, .. }
            | RoleChange::SchemaCreate { grant: true, .. }
            | RoleChange::Membership { grant: true, .. } => "GRANT",
            _ => "REVOKE",
        }
    }
}

/// Reads a present field as `Some` even when it is `null`: serde's default reads `null` as
/// `None`, which lost `PASSWORD NULL` on its way through the log.
fn null_is_some_none<'de, D>(d: D) -> std::result::Result<Option<Option<String>>, D::Error>
where
    D: serde::Deserializer<'de>,
{
    Option::<String>::deserialize(d).map(Some)
}

/// Every role, owner and grant.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Roles {
    #[serde(default)]
    roles: BTreeMap<String, Role>,
    /// Relation name -> owning role (a relation not here is the bootstrap superuser's).
    #[serde(default)]
    owners: BTreeMap<String, String>,
    /// Relation name -> role -> privileges granted.
    #[serde(default)]
    grants: BTreeMap<String, BTreeMap<String, BTreeSet<Privilege>>>,
    /// Roles with `CREATE` on schema public.
    #[serde(default)]
    schema_create: BTreeSet<String>,
}

/// What `Roles::apply` needs of the catalog.
pub struct CatalogView<'a> {
    pub exists: &'a dyn Fn(&str) -> bool,
    pub all_relations: Vec<String>,
}

impl Roles {
    pub fn get(&self, name: &str) -> Option<&Role> {
        self.roles.get(name)
    }

    pub fn list(&self) -> impl Iterator<Item = &Role> {
        self.roles.values()
    }

    pub fn is_empty(&self) -> bool {
        self.roles.is_empty()
    }

    pub fn owner(&self, relation: &str) -> Option<&str> {
        self.owners.get(relation).map(String::as_str)
    }

    /// Grants on a relation, by role.
    pub fn grants_on(&self, relation: &str) -> Option<&BTreeMap<String, BTreeSet<Privilege>>> {
        self.grants.get(relation)
    }

    pub fn can_create_in_public(&self, role: &str) -> bool {
        self.closure(role)
            .iter()
            .any(|r| self.schema_create.contains(r))
    }

    /// `role` and every role it is a member of, directly or not.
    pub fn closure(&self, role: &str) -> BTreeSet<String> {
        let mut seen = BTreeSet::new();
        let mut todo = vec![role.to_string()];
        while let Some(r) = todo.pop() {
            if !seen.insert(r.clone()) {
                continue;
            }
            if let Some(role) = self.roles.get(&r) {
                todo.extend(role.member_of.iter().cloned());
            }
        }
        seen
    }

    /// Whether a session acting as `role` (`None`: the superuser outside the roles) may do
    /// `p` on `relation`: what the privilege check and the catalogs' functions both ask.
    pub fn may(&self, role: Option<&str>, relation: &str, p: Privilege) -> bool {
        match role {
            None => true,
            Some(r) => self.get(r).is_some_and(|r| r.superuser) || self.has(r, relation, p),
        }
    }

    /// Whether `role` (not a superuser: the caller checks that) may do `p` on `relation`.
    pub fn has(&self, role: &str, relation: &str, p: Privilege) -> bool {
        let roles = self.closure(role);
        if self.owners.get(relation).is_some_and(|o| roles.contains(o)) {
            return true;
        }
        self.grants.get(relation).is_some_and(|g| {
            roles
                .iter()
                .any(|r| g.get(r).is_some_and(|ps| ps.contains(&p)))
        })
    }

    /// Whether `role` owns `relation` (itself or through membership).
    pub fn owns(&self, role: &str, relation: &str) -> bool {
        self.owners
            .get(relation)
            .is_some_and(|o| self.closure(role).contains(o))
    }

    /// A relation was created by `owner` (`None`: a superuser outside the roles).
    pub(crate) fn created(&mut self, relation: &str, owner: Option<&str>) {
        self.grants.remove(relation);
        match owner {
            Some(o) if self.roles.contains_key(o) => {
                self.owners.insert(relation.to_string(), o.to_string());
            }
            _ => {
                self.owners.remove(relation);
            }
        }
    }

    /// A relation was dropped: its owner and grants go with it.
    /// `relation` is now called `to`: its owner and grants follow it.
    pub(crate) fn renamed(&mut self, relation: &str, to: &str) {
        if let Some(owner) = self.owners.remove(relation) {
            self.owners.insert(to.to_string(), owner);
        }
        if let Some(grants) = self.grants.remove(relation) {
            self.grants.insert(to.to_string(), grants);
        }
    }

    pub(crate) fn dropped(&mut self, relation: &str) {
        self.owners.remove(relation);
        self.grants.remove(relation);
    }

    /// Applies `change`, validated first (nothing changes on an error). New roles take OIDs
    /// from `next_oid`.
    pub(crate) fn apply(
        &mut self,
        change: RoleChange,
        catalog: &CatalogView<'_>,
        next_oid: &mut u32,
    ) -> Result<()> {
        match change {
            RoleChange::Create {
                name,
                superuser,
                login,
                password,
            } => self.create(name, superuser, login, password, next_oid),
            RoleChange::Alter {
                name,
                superuser,
                login,
                password,
            } => self.alter(&name, superuser, login, password),
            RoleChange::Drop { names, if_exists } => self.drop_roles(&names, if_exists),
            RoleChange::Privileges {
                grant,
                privileges,
                relations,
                roles,
            } => self.privileges(grant, &privileges, relations, &roles, catalog),
            RoleChange::SchemaCreate { grant, roles } => {
                self.check_roles(&roles)?;
                for r in roles {
                    if grant {
                        self.schema_create.insert(r);
                    } else {
                        self.schema_create.remove(&r);
                    }
                }
                Ok(())
            }
            RoleChange::Membership {
                grant,
                granted,
                members,
            } => self.membership(grant, &granted, &members),
        }
    }

    fn create(
        &mut self,
        name: String,
        superuser: bool,
        login: bool,
        password: Option<String>,
        next_oid: &mut u32,
    ) -> Result<()> {
        if self.roles.contains_key(&name) {
            return Err(Error::new(
                sqlstate::DUPLICATE_OBJECT,
                format!("role \"{name}\" already exists"),
            ));
        }
        check_verifier(password.as_deref())?;
        let oid = *next_oid;
        *next_oid += 1;
        self.roles.insert(
            name.clone(),
            Role {
                name,
                oid,
                superuser,
                login,
                verifier: password,
                member_of: BTreeSet::new(),
            },
        );
        Ok(())
    }

    fn alter(
        &mut self,
        name: &str,
        superuser: Option<bool>,
        login: Option<bool>,
        password: Option<Option<String>>,
    ) -> Result<()> {
        if let Some(p) = &password {
            check_verifier(p.as_deref())?;
        }
        let role = self.roles.get_mut(name).ok_or_else(|| no_role(name))?;
        if let Some(s) = superuser {
            role.superuser = s;
        }
        if let Some(l) = login {
            role.login = l;
        }
        if let Some(p) = password {
            role.verifier = p;
        }
        Ok(())
    }

    fn drop_roles(&mut self, names: &[String], if_exists: bool) -> Result<()> {
        for name in names {
            if !self.roles.contains_key(name) {
                if if_exists {
                    continue;
                }
                return Err(no_role(name));
            }
            if let Some(why) = self.depends(name) {
                return Err(Error::new(
                    sqlstate::DEPENDENT_OBJECTS_STILL_EXIST,
                    format!(
                        "role \"{name}\" cannot be dropped because some objects depend on it: {why}"
                    ),
                ));
            }
        }
        for name in names {
            self.roles.remove(name);
            for r in self.roles.values_mut() {
                r.member_of.remove(name);
            }
        }
        Ok(())
    }

    fn privileges(
        &mut self,
        grant: bool,
        privileges: &[Privilege],
        relations: Relations,
        roles: &[String],
        catalog: &CatalogView<'_>,
    ) -> Result<()> {
        self.check_roles(roles)?;
        let relations = match relations {
            Relations::Named(names) => {
                if let Some(missing) = names.iter().find(|n| !(catalog.exists)(n)) {
                    return Err(Error::undefined_table(missing));
                }
                names
            }
            Relations::AllInPublic => catalog.all_relations.clone(),
        };
        for rel in relations {
            let by_role = self.grants.entry(rel.clone()).or_default();
            for role in roles {
                let set = by_role.entry(role.clone()).or_default();
                for p in privileges {
                    if grant {
                        set.insert(*p);
                    } else {
                        set.remove(p);
                    }
                }
                if set.is_empty() {
                    by_role.remove(role);
                }
            }
            if by_role.is_empty() {
                self.grants.remove(&rel);
            }
        }
        Ok(())
    }

    fn membership(&mut self, grant: bool, granted: &[String], members: &[String]) -> Result<()> {
        self.check_roles(granted)?;
        self.check_roles(members)?;
        if grant {
            for g in granted {
                for m in members {
                    if self.closure(g).contains(m) {
                        return Err(Error::new(
                            sqlstate::INVALID_GRANT_OPERATION,
                            format!("role \"{m}\" is a member of role \"{g}\""),
                        ));
                    }
                }
            }
        }
        for m in members {
            if let Some(role) = self.roles.get_mut(m) {
                for g in granted {
                    if grant {
                        role.member_of.insert(g.clone());
                    } else {
                        role.member_of.remove(g);
                    }
                }
            }
        }
        Ok(())
    }

    fn check_roles(&self, names: &[String]) -> Result<()> {
        match names.iter().find(|n| !self.roles.contains_key(*n)) {
            Some(n) => Err(no_role(n)),
            None => Ok(()),
        }
    }

    /// What keeps `role` from being dropped, if anything.
    fn depends(&self, role: &str) -> Option<String> {
        if let Some((rel, _)) = self.owners.iter().find(|(_, o)| *o == role) {
            return Some(format!("owner of relation {rel}"));
        }
        if let Some((rel, _)) = self.grants.iter().find(|(_, g)| g.contains_key(role)) {
            return Some(format!("privileges for relation {rel}"));
        }
        if self.schema_create.contains(role) {
            return Some("privileges for schema public".into());
        }
        None
    }
}

fn no_role(name: &str) -> Error {
    Error::new(
        sqlstate::UNDEFINED_OBJECT,
        format!("role \"{name}\" does not exist"),
    )
}

/// A proposed password must already be a verifier (deterministic apply never salts).
fn check_verifier(v: Option<&str>) -> Result<()> {
    match v {
        Some(v) if crate::scram::Verifier::parse(v).is_none() => Err(Error::internal(
            "a role's password reached the state machine unhashed",
        )),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const EXISTS: fn(&str) -> bool = |n| n == "s" || n == "t";

    fn view() -> CatalogView<'static> {
        CatalogView {
            exists: &EXISTS,
            all_relations: vec!["s".into(), "t".into()],
        }
    }

    fn create(roles: &mut Roles, name: &str) -> Result<()> {
        let mut oid = 20000;
        roles.apply(
            RoleChange::Create {
                name: name.into(),
                superuser: false,
                login: true,
                password: None,
            },
            &view(),
            &mut oid,
        )
    }

    #[test]
    fn debug_never_shows_a_password() {
        let c = RoleChange::Create {
            name: "alice".into(),
            superuser: false,
            login: true,
            password: Some("hunter2".into()),
        };
        let a = RoleChange::Alter {
            name: "alice".into(),
            superuser: None,
            login: None,
            password: Some(Some("hunter2".into())),
        };
        for shown in [format!("{c:?}"), format!("{a:?}"), format!("{c:#?}")] {
            assert!(
                shown.contains("alice") && shown.contains("<hidden>"),
                "{shown}"
            );
            assert!(!shown.contains("hunter2"), "{shown}");
        }
    }

    #[test]
    fn grants_are_inherited_through_membership_and_block_drops() {
        let mut r = Roles::default();
        create(&mut r, "reader").unwrap();
        create(&mut r, "alice").unwrap();
        assert_eq!(create(&mut r, "alice").unwrap_err().code, "42710");
        let mut oid = 0;
        r.apply(
            RoleChange::Privileges {
                grant: true,
                privileges: vec![Privilege::Select],
                relations: Relations::Named(vec!["s".into()]),
                roles: vec!["reader".into()],
            },
            &view(),
            &mut oid,
        )
        .unwrap();
        assert!(r.has("reader", "s", Privilege::Select));
        assert!(!r.has("alice", "s", Privilege::Select));
        r.apply(
            RoleChange::Membership {
                grant: true,
                granted: vec!["reader".into()],
                members: vec!["alice".into()],
            },
            &view(),
            &mut oid,
        )
        .unwrap();
        assert!(r.has("alice", "s", Privilege::Select));
        assert!(!r.has("alice", "s", Privilege::Insert));
        assert!(!r.has("alice", "t", Privilege::Select));
        let drop = RoleChange::Drop {
            names: vec!["reader".into()],
            if_exists: false,
        };
        assert_eq!(
            r.apply(drop.clone(), &view(), &mut oid).unwrap_err().code,
            "2BP01"
        );
        let missing = RoleChange::Privileges {
            grant: true,
            privileges: vec![Privilege::Select],
            relations: Relations::Named(vec!["nope".into()]),
            roles: vec!["reader".into()],
        };
        assert_eq!(
            r.apply(missing, &view(), &mut oid).unwrap_err().code,
            "42P01"
        );
    }
}
