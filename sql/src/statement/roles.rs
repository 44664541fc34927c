//! Role statements as [`RoleChange`]s: CREATE/ALTER/DROP ROLE (and USER), GRANT and REVOKE
//! of table privileges, of `CREATE ON SCHEMA public` and of role membership.
//!
//! Everything sqlparser reads that is not implemented is refused with `0A000` naming it, so
//! no option is accepted and silently ignored.

use sqlparser::ast::{
    Action, AlterRoleOperation, CreateRole, Expr, GrantObjects, Grantee, GranteeName, GranteesType,
    Ident, ObjectName, Password, Privileges, RoleOption, Value,
};
use sqlparser::tokenizer::Word;

use super::{normalize_ident, object_name, sqlparser, Parsed};
use crate::error::{Error, Result};
use crate::roles::{Privilege, Relations, RoleChange};

/// Words after GRANT/REVOKE that name a privilege, not a role.
pub(super) fn is_privilege_word(w: &Word) -> bool {
    [
        "select",
        "insert",
        "update",
        "delete",
        "all",
        "create",
        "usage",
        "truncate",
        "references",
        "trigger",
        "connect",
        "temporary",
        "temp",
        "execute",
        "role",
    ]
    .iter()
    .any(|p| w.value.eq_ignore_ascii_case(p))
}

fn no(what: &str) -> Error {
    Error::unsupported(format!("{what} is not supported"))
}

fn password(p: &Password) -> Result<Option<String>> {
    match p {
        Password::NullPassword => Ok(None),
        Password::Password(Expr::Value(v)) => match &v.value {
            Value::SingleQuotedString(s) | Value::EscapedStringLiteral(s) => Ok(Some(s.clone())),
            Value::Null => Ok(None),
            _ => Err(no("a PASSWORD that is not a string literal")),
        },
        _ => Err(no("a PASSWORD that is not a string literal")),
    }
}

fn one_name(names: &[ObjectName]) -> Result<String> {
    match names {
        [n] => Ok(object_name(n)),
        _ => Err(no("creating several roles in one statement")),
    }
}

/// `CREATE ROLE` (`user`: written `CREATE USER`, which implies LOGIN).
pub(super) fn classify_create(c: &CreateRole, user: bool) -> Result<Parsed> {
    let refused = [
        (c.if_not_exists, "CREATE ROLE IF NOT EXISTS"),
        (c.inherit.is_some(), "INHERIT / NOINHERIT"),
        (c.bypassrls.is_some(), "BYPASSRLS"),
        (c.create_db.is_some(), "CREATEDB"),
        (c.create_role.is_some(), "CREATEROLE"),
        (c.replication.is_some(), "REPLICATION"),
        (c.connection_limit.is_some(), "CONNECTION LIMIT"),
        (c.valid_until.is_some(), "VALID UNTIL"),
        (
            !c.in_role.is_empty() || !c.in_group.is_empty(),
            "IN ROLE (use GRANT)",
        ),
        (
            !c.role.is_empty() || !c.user.is_empty(),
            "ROLE / USER (use GRANT)",
        ),
        (!c.admin.is_empty(), "ADMIN"),
        (c.authorization_owner.is_some(), "AUTHORIZATION"),
    ];
    if let Some((_, what)) = refused.iter().find(|(set, _)| *set) {
        return Err(no(&format!("CREATE ROLE ... {what}")));
    }
    let name = one_name(&c.names)?;
    check_role_name(&name)?;
    Ok(Parsed::Roles(RoleChange::Create {
        name,
        superuser: c.superuser.unwrap_or(false),
        login: c.login.unwrap_or(user),
        password: match &c.password {
            Some(p) => password(p)?,
            None => None,
        },
    }))
}

fn check_role_name(name: &str) -> Result<()> {
    if name == "public" || name == "none" || name.starts_with("pg_") {
        return Err(Error::new(
            crate::error::sqlstate::RESERVED_NAME,
            format!("role name \"{name}\" is reserved"),
        ));
    }
    Ok(())
}

pub(super) fn classify_alter(name: &Ident, op: &AlterRoleOperation) -> Result<Parsed> {
    let AlterRoleOperation::WithOptions { options } = op else {
        return Err(no("this form of ALTER ROLE"));
    };
    let (mut superuser, mut login, mut pw) = (None, None, None);
    for o in options {
        match o {
            RoleOption::SuperUser(b) => superuser = Some(*b),
            RoleOption::Login(b) => login = Some(*b),
            RoleOption::Password(p) => pw = Some(password(p)?),
            other => return Err(no(&format!("ALTER ROLE ... {other}"))),
        }
    }
    Ok(Parsed::Roles(RoleChange::Alter {
        name: normalize_ident(name),
        superuser,
        login,
        password: pw,
    }))
}

pub(super) fn classify_drop(
    names: &[ObjectName],
    if_exists: bool,
    cascade: bool,
) -> Result<Parsed> {
    if cascade {
        return Err(no("DROP ROLE ... CASCADE"));
    }
    Ok(Parsed::Roles(RoleChange::Drop {
        names: names.iter().map(object_name).collect(),
        if_exists,
    }))
}

fn grantees(gs: &[Grantee]) -> Result<Vec<String>> {
    gs.iter()
        .map(|g| match (&g.grantee_type, &g.name) {
            (GranteesType::Public, _) => Err(no("granting to PUBLIC")),
            (_, Some(GranteeName::ObjectName(n))) if object_name(n) == "public" => {
                Err(no("granting to PUBLIC"))
            }
            (
                GranteesType::None | GranteesType::Role | GranteesType::User | GranteesType::Group,
                Some(GranteeName::ObjectName(n)),
            ) => Ok(object_name(n)),
            _ => Err(no(&format!("grantee {g}"))),
        })
        .collect()
}

/// GRANT and REVOKE share this: privileges on relations, CREATE on schema public, or roles.
fn privileges_change(
    grant: bool,
    privileges: &Privileges,
    objects: Option<&GrantObjects>,
    roles: Vec<String>,
) -> Result<Parsed> {
    let verb = if grant { "GRANT" } else { "REVOKE" };
    let actions: &[Action] = match privileges {
        Privileges::All { .. } => &[],
        Privileges::Actions(a) => a,
    };
    let Some(objects) = objects else {
        // `GRANT r1, r2 TO m` (the tokenizer step wrote `ROLE r1`)
        let mut granted = Vec::new();
        for a in actions {
            match a {
                Action::Role { role } => granted.push(object_name(role)),
                other => return Err(no(&format!("{verb} {other} without ON"))),
            }
        }
        if granted.is_empty() {
            return Err(no(&format!("{verb} ALL without ON")));
        }
        return Ok(Parsed::Roles(RoleChange::Membership {
            grant,
            granted,
            members: roles,
        }));
    };
    let is_public = |schemas: &[ObjectName]| matches!(schemas, [s] if object_name(s) == "public");
    if let GrantObjects::Schemas(schemas) = objects {
        let only_create = matches!(actions, [Action::Create { obj_type: None }]);
        if !is_public(schemas) || !(only_create || matches!(privileges, Privileges::All { .. })) {
            return Err(no(&format!(
                "{verb} on schemas other than CREATE ON SCHEMA public"
            )));
        }
        return Ok(Parsed::Roles(RoleChange::SchemaCreate { grant, roles }));
    }
    let relations = match objects {
        GrantObjects::Tables(names) => Relations::Named(names.iter().map(object_name).collect()),
        GrantObjects::AllTablesInSchema { schemas } if is_public(schemas) => Relations::AllInPublic,
        other => return Err(no(&format!("{verb} ON {other}"))),
    };
    let privileges = match privileges {
        Privileges::All { .. } => Privilege::ALL.to_vec(),
        Privileges::Actions(actions) => actions
            .iter()
            .map(|a| match a {
                Action::Select { columns: None } => Ok(Privilege::Select),
                Action::Insert { columns: None } => Ok(Privilege::Insert),
                Action::Update { columns: None } => Ok(Privilege::Update),
                Action::Delete => Ok(Privilege::Delete),
                other => Err(no(&format!("{verb} {other} on a relation"))),
            })
            .collect::<Result<_>>()?,
    };
    Ok(Parsed::Roles(RoleChange::Privileges {
        grant,
        privileges,
        relations,
        roles,
    }))
}

pub(super) fn classify_grant(g: &sqlparser::ast::Grant) -> Result<Parsed> {
    if g.with_grant_option {
        return Err(no("WITH GRANT OPTION"));
    }
    if g.as_grantor.is_some() || g.granted_by.is_some() || g.current_grants.is_some() {
        return Err(no("GRANT ... GRANTED BY"));
    }
    privileges_change(
        true,
        &g.privileges,
        g.objects.as_ref(),
        grantees(&g.grantees)?,
    )
}

pub(super) fn classify_revoke(r: &sqlparser::ast::Revoke) -> Result<Parsed> {
    if r.granted_by.is_some() {
        return Err(no("REVOKE ... GRANTED BY"));
    }
    if matches!(r.cascade, Some(sqlparser::ast::CascadeOption::Cascade)) {
        return Err(no("REVOKE ... CASCADE"));
    }
    privileges_change(
        false,
        &r.privileges,
        r.objects.as_ref(),
        grantees(&r.grantees)?,
    )
}
