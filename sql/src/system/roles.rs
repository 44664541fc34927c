//! The roles as the catalogs show them: `pg_roles`, `pg_authid` (superusers only),
//! `pg_auth_members`, `pg_user`, each relation's owner and ACL (`pg_class.relowner`,
//! `relacl`), `information_schema.table_privileges`, and the functions that ask
//! (`has_table_privilege`, `has_any_column_privilege`, `has_schema_privilege`,
//! `pg_get_userbyid`, and `sluice_role_memberof`, which psql's `\du` is rewritten to).
//!
//! Invariants: every answer is computed from the catalog's current [`Roles`] when the query
//! runs, with the same rules the privilege check of [`crate::session`] applies ([`Roles::may`]),
//! so what a client is told is what it will be allowed. The superuser outside the roles (the
//! bootstrap `--superuser`, or a trusted client whose user names no role) is OID 10; it is
//! shown under the session's user name when the session is that superuser, and under the
//! bootstrap name otherwise. Relations no role owns are owned by OID 10.

use arrow::array::{Array, AsArray, BooleanArray, ListBuilder, StringArray, StringBuilder};
use datafusion::error::DataFusionError;
use datafusion::logical_expr::{ScalarUDF, TypeSignature, Volatility};

use super::pg_functions::{texts, udf};
use super::*;
use crate::error::{sqlstate, Error};
use crate::roles::{Privilege, Role, Roles};
use crate::settings::SessionVars;

/// Namespace OID of `public`.
const NAMESPACE_PUBLIC_OID: i64 = 2200;

/// The roles and who the session is, as of one query.
pub(super) struct Who {
    roles: Arc<Roles>,
    /// The session's role; `None`: the superuser outside the roles.
    role: Option<String>,
    /// The name OID 10 is shown under.
    bootstrap: String,
}

impl Who {
    pub(super) fn new(engine: &dyn CatalogSource, vars: &SessionVars) -> Who {
        let bootstrap = match &vars.role {
            None if !vars.user.is_empty() => vars.user.clone(),
            _ => engine.superuser().to_string(),
        };
        Who {
            roles: engine.catalog().roles(),
            role: vars.role.clone(),
            bootstrap,
        }
    }

    pub(super) fn is_superuser(&self) -> bool {
        self.is_superuser_role(self.role.as_deref())
    }

    fn is_superuser_role(&self, role: Option<&str>) -> bool {
        match role {
            None => true,
            Some(r) => self.roles.get(r).is_some_and(|r| r.superuser),
        }
    }

    /// The owner of a user relation: its role, or `None` for OID 10.
    fn owner(&self, relation: &str) -> Option<&Role> {
        self.roles.owner(relation).and_then(|o| self.roles.get(o))
    }

    pub(super) fn owner_oid(&self, relation: &str) -> i32 {
        self.owner(relation).map_or(OWNER_OID, |r| r.oid as i32)
    }

    pub(super) fn owner_name(&self, relation: &str) -> String {
        self.owner(relation)
            .map_or_else(|| self.bootstrap.clone(), |r| r.name.clone())
    }

    /// `relacl`: NULL while nothing was granted on the relation (the owner's default
    /// rights), else the owner's entry then each grantee's, as `grantee=letters/grantor`.
    pub(super) fn acl(&self, relation: &str) -> ScalarValue {
        let Some(grants) = self.roles.grants_on(relation) else {
            return null_array();
        };
        let owner = self.owner_name(relation);
        let letters = |ps: &mut dyn Iterator<Item = Privilege>| {
            let mut ps: Vec<Privilege> = ps.collect();
            ps.sort_by_key(|p| acl_order(*p));
            ps.iter().map(|p| p.letter()).collect::<String>()
        };
        let mut items = vec![format!(
            "{owner}={}/{owner}",
            letters(&mut Privilege::ALL.into_iter())
        )];
        for (grantee, ps) in grants {
            items.push(format!(
                "{grantee}={}/{owner}",
                letters(&mut ps.iter().copied())
            ));
        }
        text_list(&items)
    }

    fn name_of(&self, oid: i64) -> Option<String> {
        if oid == OWNER_OID as i64 {
            return Some(self.bootstrap.clone());
        }
        self.roles
            .list()
            .find(|r| r.oid as i64 == oid)
            .map(|r| r.name.clone())
    }

    /// The role a function's user argument names (`None`: the superuser outside the roles).
    fn user_by_name(&self, name: &str) -> Result<Option<String>, Error> {
        if self.roles.get(name).is_some() {
            Ok(Some(name.to_string()))
        } else if name == self.bootstrap {
            Ok(None)
        } else {
            Err(Error::new(
                sqlstate::UNDEFINED_OBJECT,
                format!("role \"{name}\" does not exist"),
            ))
        }
    }

    fn user_by_oid(&self, oid: i64) -> Result<Option<String>, Error> {
        if oid == OWNER_OID as i64 {
            return Ok(None);
        }
        match self.roles.list().find(|r| r.oid as i64 == oid) {
            Some(r) => Ok(Some(r.name.clone())),
            None => Err(Error::new(
                sqlstate::UNDEFINED_OBJECT,
                format!("role with OID {oid} does not exist"),
            )),
        }
    }

    /// Whether `role` may do everything in `wanted` on `relation` (any of them suffices, as
    /// in PostgreSQL). A system relation may be read by everyone and changed by superusers.
    fn may(&self, role: Option<&str>, relation: &Target, wanted: &[Wanted]) -> bool {
        let superuser = self.is_superuser_role(role);
        wanted.iter().any(|w| match (relation, w) {
            (_, _) if superuser => true,
            (Target::System, Wanted::Privilege(Privilege::Select, false)) => true,
            (Target::System, _) => false,
            (Target::User(rel), Wanted::Privilege(p, grant_option)) => {
                let owns = role.is_some_and(|r| self.roles.owns(r, rel));
                owns || (!grant_option && self.roles.may(role, rel, *p))
            }
            (Target::User(rel), Wanted::OwnerOnly) => role.is_some_and(|r| self.roles.owns(r, rel)),
        })
    }
}

/// PostgreSQL's order of privilege letters in an ACL item (`arwdDxt`).
fn acl_order(p: Privilege) -> u8 {
    match p {
        Privilege::Insert => 0,
        Privilege::Select => 1,
        Privilege::Update => 2,
        Privilege::Delete => 3,
    }
}

fn text_list(items: &[String]) -> ScalarValue {
    let items: Vec<ScalarValue> = items.iter().map(|i| s(i.as_str())).collect();
    ScalarValue::List(ScalarValue::new_list_nullable(&items, &DataType::Utf8))
}

/// The columns shared by `pg_roles` and `pg_authid`, for one role.
struct RoleRow {
    oid: i32,
    name: String,
    superuser: bool,
    login: bool,
    has_password: bool,
    verifier: Option<String>,
}

fn role_rows(who: &Who) -> Vec<RoleRow> {
    let mut rows = vec![RoleRow {
        oid: OWNER_OID,
        name: who.bootstrap.clone(),
        superuser: true,
        login: true,
        has_password: false,
        verifier: None,
    }];
    for r in who.roles.list() {
        if r.name == who.bootstrap {
            // a role named like the bootstrap superuser governs that name
            rows.remove(0);
        }
        rows.push(RoleRow {
            oid: r.oid as i32,
            name: r.name.clone(),
            superuser: r.superuser,
            login: r.login,
            has_password: r.verifier.is_some(),
            verifier: r.verifier.clone(),
        });
    }
    rows
}

pub(super) fn pg_roles(who: &Who) -> DFResult<Arc<dyn TableProvider>> {
    let mut t = TableBuilder::new(vec![
        text("rolname"),
        boolean("rolsuper"),
        boolean("rolinherit"),
        boolean("rolcreaterole"),
        boolean("rolcreatedb"),
        boolean("rolcanlogin"),
        boolean("rolreplication"),
        int4("rolconnlimit"),
        text("rolpassword"),
        timestamptz("rolvaliduntil"),
        boolean("rolbypassrls"),
        text_array("rolconfig"),
        oid(
            "oid",
            datafusion_pg_catalog::pg_catalog::oid_field::kind::OID,
        ),
    ]);
    for r in role_rows(who) {
        t.row(vec![
            s(r.name),
            b(r.superuser),
            b(true),
            b(r.superuser),
            b(r.superuser),
            b(r.login),
            b(r.superuser),
            i4(-1),
            if r.has_password {
                s("********")
            } else {
                null_s()
            },
            no_time(),
            b(r.superuser),
            null_array(),
            i4(r.oid),
        ]);
    }
    t.build()
}

/// `pg_authid`: with the verifiers, so only a superuser may read it.
pub(super) fn pg_authid(who: &Who) -> DFResult<Arc<dyn TableProvider>> {
    if !who.is_superuser() {
        return Err(DataFusionError::External(Box::new(Error::new(
            sqlstate::INSUFFICIENT_PRIVILEGE,
            "permission denied for table pg_authid",
        ))));
    }
    let mut t = TableBuilder::new(vec![
        oid(
            "oid",
            datafusion_pg_catalog::pg_catalog::oid_field::kind::OID,
        ),
        text("rolname"),
        boolean("rolsuper"),
        boolean("rolinherit"),
        boolean("rolcreaterole"),
        boolean("rolcreatedb"),
        boolean("rolcanlogin"),
        boolean("rolreplication"),
        boolean("rolbypassrls"),
        int4("rolconnlimit"),
        text("rolpassword"),
        timestamptz("rolvaliduntil"),
    ]);
    for r in role_rows(who) {
        t.row(vec![
            i4(r.oid),
            s(r.name),
            b(r.superuser),
            b(true),
            b(r.superuser),
            b(r.superuser),
            b(r.login),
            b(r.superuser),
            b(r.superuser),
            i4(-1),
            r.verifier.map_or_else(null_s, s),
            no_time(),
        ]);
    }
    t.build()
}

/// `pg_auth_members` (PostgreSQL 15's columns): one row per direct membership.
pub(super) fn pg_auth_members(who: &Who) -> DFResult<Arc<dyn TableProvider>> {
    use datafusion_pg_catalog::pg_catalog::oid_field::kind;
    let mut t = TableBuilder::new(vec![
        oid("roleid", kind::OID),
        oid("member", kind::OID),
        oid("grantor", kind::OID),
        boolean("admin_option"),
    ]);
    for member in who.roles.list() {
        for granted in &member.member_of {
            if let Some(g) = who.roles.get(granted) {
                t.row(vec![
                    i4(g.oid as i32),
                    i4(member.oid as i32),
                    i4(OWNER_OID),
                    b(false),
                ]);
            }
        }
    }
    t.build()
}

/// `pg_user`: the roles that may log in.
pub(super) fn pg_user(who: &Who) -> DFResult<Arc<dyn TableProvider>> {
    let mut t = TableBuilder::new(vec![
        text("usename"),
        oid(
            "usesysid",
            datafusion_pg_catalog::pg_catalog::oid_field::kind::OID,
        ),
        boolean("usecreatedb"),
        boolean("usesuper"),
        boolean("userepl"),
        boolean("usebypassrls"),
        text("passwd"),
        timestamptz("valuntil"),
        text_array("useconfig"),
    ]);
    for r in role_rows(who).into_iter().filter(|r| r.login) {
        t.row(vec![
            s(r.name),
            i4(r.oid),
            b(r.superuser),
            b(r.superuser),
            b(r.superuser),
            b(r.superuser),
            s("********"),
            no_time(),
            null_array(),
        ]);
    }
    t.build()
}

fn no_time() -> ScalarValue {
    ScalarValue::TimestampMicrosecond(None, Some("UTC".into()))
}

/// `information_schema.table_privileges`: the owner's privileges and every grant, on each
/// relation, as far as the session's roles are grantor or grantee (all of them for a
/// superuser); system views are readable by PUBLIC.
pub(super) fn table_privileges(
    who: &Who,
    db: &str,
    rels: &[Relation],
) -> DFResult<Arc<dyn TableProvider>> {
    let mut t = TableBuilder::new(text_fields(&[
        "grantor",
        "grantee",
        "table_catalog",
        "table_schema",
        "table_name",
        "privilege_type",
        "is_grantable",
        "with_hierarchy",
    ]));
    let mine = |name: &str| match &who.role {
        _ if who.is_superuser() => true,
        Some(r) => who.roles.closure(r).contains(name),
        None => true,
    };
    let mut row = |grantor: &str, grantee: &str, r: &Relation, p: &str, grantable: bool| {
        t.row(vec![
            s(grantor),
            s(grantee),
            s(db),
            s(r.schema),
            s(&r.name),
            s(p),
            s(if grantable { "YES" } else { "NO" }),
            s(if p == "SELECT" { "YES" } else { "NO" }),
        ]);
    };
    for r in rels {
        if r.kind != "r" {
            row(&who.bootstrap, "PUBLIC", r, "SELECT", false);
            continue;
        }
        let owner = who.owner_name(&r.name);
        let owner_visible = mine(&owner);
        if owner_visible {
            for p in Privilege::ALL {
                row(&owner, &owner, r, p.keyword(), true);
            }
        }
        for (grantee, ps) in who.roles.grants_on(&r.name).into_iter().flatten() {
            if owner_visible || mine(grantee) {
                for p in ps {
                    row(&owner, grantee, r, p.keyword(), false);
                }
            }
        }
    }
    t.build()
}

/// What a privilege function's relation argument names.
enum Target {
    User(String),
    System,
}

/// One privilege a function asks about.
#[derive(Debug, Clone, Copy)]
enum Wanted {
    /// (privilege, WITH GRANT OPTION)
    Privilege(Privilege, bool),
    /// TRUNCATE, REFERENCES, TRIGGER: not grantable in Sluice; owners and superusers have them.
    OwnerOnly,
}

fn parse_table_privileges(text: &str) -> Result<Vec<Wanted>, Error> {
    text.split(',')
        .map(|item| {
            let item = item.trim().to_ascii_uppercase();
            let (word, grant_option) = match item.strip_suffix("WITH GRANT OPTION") {
                Some(w) => (w.trim_end().to_string(), true),
                None => (item.clone(), false),
            };
            Ok(match word.as_str() {
                "SELECT" => Wanted::Privilege(Privilege::Select, grant_option),
                "INSERT" => Wanted::Privilege(Privilege::Insert, grant_option),
                "UPDATE" => Wanted::Privilege(Privilege::Update, grant_option),
                "DELETE" => Wanted::Privilege(Privilege::Delete, grant_option),
                "TRUNCATE" | "REFERENCES" | "TRIGGER" => Wanted::OwnerOnly,
                _ => {
                    return Err(Error::new(
                        sqlstate::INVALID_PARAMETER_VALUE,
                        format!("unrecognized privilege type: \"{}\"", item.trim()),
                    ))
                }
            })
        })
        .collect()
}

/// A name as SQL would read it: unquoted parts fold to lower case.
fn split_name(text: &str) -> (Option<String>, String) {
    fn part(p: &str) -> String {
        let p = p.trim();
        match p.strip_prefix('"').and_then(|p| p.strip_suffix('"')) {
            Some(q) => q.replace("\"\"", "\""),
            None => p.to_lowercase(),
        }
    }
    match text.split_once('.') {
        Some((schema, name)) if !text.trim_start().starts_with('"') || schema.ends_with('"') => {
            (Some(part(schema)), part(name))
        }
        _ => (None, part(text)),
    }
}

fn df(e: Error) -> DataFusionError {
    DataFusionError::External(Box::new(e))
}

/// Who the session is, as of one function call, and the engine (for what else a function
/// needs of the catalog).
type WhoNow = Arc<dyn Fn() -> DFResult<(Who, Arc<dyn CatalogSource>)> + Send + Sync>;

/// The role functions, bound to the session's identity and the engine's catalog.
pub(super) fn functions(vars: &SharedVars, engine: &Weak<dyn CatalogSource>) -> Vec<ScalarUDF> {
    let (vars, engine) = (vars.clone(), engine.clone());
    let who: WhoNow = Arc::new(move || {
        let e = engine
            .upgrade()
            .ok_or_else(|| DataFusionError::Execution("server is shutting down".into()))?;
        let who = Who::new(&*e, &vars.read());
        Ok((who, e))
    });
    let mut out: Vec<ScalarUDF> = ["has_table_privilege", "has_any_column_privilege"]
        .into_iter()
        .map(|name| table_privilege_fn(name, who.clone()))
        .collect();
    out.push(schema_privilege_fn(who.clone()));
    out.push(userbyid_fn(who.clone()));
    out.push(memberof_fn(who));
    out
}

/// `has_table_privilege([user,] table, privileges)` (and `has_any_column_privilege`: no
/// column has privileges of its own).
fn table_privilege_fn(name: &str, who: WhoNow) -> ScalarUDF {
    udf(
        name,
        TypeSignature::VariadicAny,
        DataType::Boolean,
        Volatility::Stable,
        move |args, rows| {
            let (who, engine) = who()?;
            let rels = relations(&*engine);
            privilege_rows(&who, args, rows, |who, role, object, privileges| {
                let target = match object {
                    Object::Name(n) => match split_name(&n) {
                        (Some(s), _) if s == "pg_catalog" || s == "information_schema" => {
                            Target::System
                        }
                        (s, n) if s.as_deref().is_none_or(|s| s == "public") => {
                            match rels.iter().find(|r| r.name == n) {
                                Some(r) if r.kind == "r" => Target::User(n),
                                Some(_) => Target::System,
                                None if datafusion_pg_catalog::pg_catalog::PG_CATALOG_TABLES
                                    .contains(&n.as_str()) =>
                                {
                                    Target::System
                                }
                                None => return Err(Error::undefined_table(&n)),
                            }
                        }
                        (_, n) => return Err(Error::undefined_table(&n)),
                    },
                    Object::Oid(oid) => match rels.iter().find(|r| r.oid as i64 == oid) {
                        Some(r) if r.kind == "r" => Target::User(r.name.clone()),
                        Some(_) => Target::System,
                        None => return Ok(None),
                    },
                };
                let wanted = parse_table_privileges(privileges)?;
                Ok(Some(who.may(role, &target, &wanted)))
            })
        },
    )
}

/// `has_schema_privilege([user,] schema, privileges)`: USAGE on every schema, CREATE on
/// public for superusers and roles granted it.
fn schema_privilege_fn(who: WhoNow) -> ScalarUDF {
    udf(
        "has_schema_privilege",
        TypeSignature::VariadicAny,
        DataType::Boolean,
        Volatility::Stable,
        move |args, rows| {
            let (who, _) = who()?;
            privilege_rows(&who, args, rows, |who, role, object, privileges| {
                let public = match object {
                    Object::Name(n) => match split_name(&n).1.as_str() {
                        "public" => true,
                        "pg_catalog" | "information_schema" => false,
                        other => {
                            return Err(Error::new(
                                sqlstate::INVALID_SCHEMA_NAME,
                                format!("schema \"{other}\" does not exist"),
                            ))
                        }
                    },
                    Object::Oid(oid) => oid == NAMESPACE_PUBLIC_OID,
                };
                let superuser = who.is_superuser_role(role);
                let mut any = false;
                for item in privileges.split(',') {
                    let item = item.trim().to_ascii_uppercase();
                    let word = item
                        .strip_suffix("WITH GRANT OPTION")
                        .map_or(item.as_str(), str::trim_end);
                    any |= match word {
                        "USAGE" => true,
                        "CREATE" => {
                            superuser
                                || (public
                                    && role.is_some_and(|r| who.roles.can_create_in_public(r)))
                        }
                        _ => {
                            return Err(Error::new(
                                sqlstate::INVALID_PARAMETER_VALUE,
                                format!("unrecognized privilege type: \"{item}\""),
                            ))
                        }
                    };
                }
                Ok(Some(any))
            })
        },
    )
}

/// `pg_get_userbyid(oid)`: the role's name, or PostgreSQL's `unknown (OID=n)`.
fn userbyid_fn(who: WhoNow) -> ScalarUDF {
    udf(
        "pg_get_userbyid",
        TypeSignature::Any(1),
        DataType::Utf8,
        Volatility::Stable,
        move |args, _| {
            let (who, _) = who()?;
            let oids = arrow::compute::cast(&args[0], &DataType::Int64)?;
            let oids = oids.as_primitive::<arrow::datatypes::Int64Type>();
            Ok(Arc::new(StringArray::from_iter(oids.iter().map(|o| {
                o.map(|o| {
                    who.name_of(o)
                        .unwrap_or_else(|| format!("unknown (OID={o})"))
                })
            }))))
        },
    )
}

/// `sluice_role_memberof(oid)`: the roles a role is directly a member of (psql's `\du`).
fn memberof_fn(who: WhoNow) -> ScalarUDF {
    udf(
        "sluice_role_memberof",
        TypeSignature::Any(1),
        DataType::List(Arc::new(arrow::datatypes::Field::new(
            "item",
            DataType::Utf8,
            true,
        ))),
        Volatility::Stable,
        move |args, _| {
            let (who, _) = who()?;
            let oids = arrow::compute::cast(&args[0], &DataType::Int64)?;
            let oids = oids.as_primitive::<arrow::datatypes::Int64Type>();
            let mut list = ListBuilder::new(StringBuilder::new());
            for o in oids.iter() {
                let member = o.and_then(|o| who.roles.list().find(|r| r.oid as i64 == o));
                match member {
                    Some(m) => {
                        for g in &m.member_of {
                            list.values().append_value(g);
                        }
                        list.append(true);
                    }
                    None if o.is_some() => list.append(true),
                    None => list.append(false),
                }
            }
            Ok(Arc::new(list.finish()))
        },
    )
}

/// A privilege function's object argument.
enum Object {
    Name(String),
    Oid(i64),
}

/// Runs a `has_*_privilege([user,] object, privileges)` over its rows: NULL in, NULL out.
fn privilege_rows(
    who: &Who,
    args: &[ArrayRef],
    rows: usize,
    answer: impl Fn(&Who, Option<&str>, Object, &str) -> Result<Option<bool>, Error>,
) -> DFResult<ArrayRef> {
    let (user, object, privileges) = match args.len() {
        2 => (None, &args[0], texts(args, 1)?),
        3 => (Some(&args[0]), &args[1], texts(args, 2)?),
        n => {
            return Err(df(Error::new(
                sqlstate::UNDEFINED_FUNCTION,
                format!("privilege functions take 2 or 3 arguments, not {n}"),
            )))
        }
    };
    let users = user.map(values).transpose()?;
    let objects = values(object)?;
    let mut out = Vec::with_capacity(rows);
    for row in 0..rows {
        let role = match users.as_ref().map(|u| &u[row]) {
            None => who.role.clone(),
            Some(None) => {
                out.push(None);
                continue;
            }
            Some(Some(Object::Name(n))) => who.user_by_name(n).map_err(df)?,
            Some(Some(Object::Oid(o))) => who.user_by_oid(*o).map_err(df)?,
        };
        let (Some(object), Some(p)) = (objects[row].as_ref(), privileges[row].as_deref()) else {
            out.push(None);
            continue;
        };
        let object = match object {
            Object::Name(n) => Object::Name(n.clone()),
            Object::Oid(o) => Object::Oid(*o),
        };
        out.push(answer(who, role.as_deref(), object, p).map_err(df)?);
    }
    Ok(Arc::new(BooleanArray::from(out)))
}

/// An argument as names (text) or OIDs (any integer type).
fn values(a: &ArrayRef) -> DFResult<Vec<Option<Object>>> {
    if a.data_type().is_integer() {
        let a = arrow::compute::cast(a, &DataType::Int64)?;
        let a = a.as_primitive::<arrow::datatypes::Int64Type>();
        return Ok(a.iter().map(|v| v.map(Object::Oid)).collect());
    }
    let a = arrow::compute::cast(a, &DataType::Utf8)?;
    let a = a.as_string::<i32>();
    Ok((0..a.len())
        .map(|r| a.is_valid(r).then(|| Object::Name(a.value(r).to_string())))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_fold_like_sql() {
        assert_eq!(split_name("Orders"), (None, "orders".into()));
        assert_eq!(split_name("\"Orders\""), (None, "Orders".into()));
        assert_eq!(
            split_name("public.\"A.b\""),
            (Some("public".into()), "A.b".into())
        );
        assert_eq!(split_name("\"a.b\""), (None, "a.b".into()));
    }

    #[test]
    fn privilege_lists_parse_and_refuse_unknown_words() {
        let w = parse_table_privileges("select, INSERT WITH GRANT OPTION,truncate").unwrap();
        assert!(matches!(
            w.as_slice(),
            [
                Wanted::Privilege(Privilege::Select, false),
                Wanted::Privilege(Privilege::Insert, true),
                Wanted::OwnerOnly
            ]
        ));
        assert_eq!(parse_table_privileges("fly").unwrap_err().code, "22023");
    }
}
