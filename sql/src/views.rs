//! Views: a stored query that statements name like a relation, expanded into them before
//! DataFusion plans them (as PostgreSQL's rewriter does).
//!
//! A view's definition ([`ViewDef`]) is replicated and checkpointed like a stream's; its
//! query is kept as text and parsed once into a [`View`] when the catalog takes it. Every
//! statement a session plans passes through [`expand`]: each `FROM v` becomes
//! `FROM (<v's query>) AS v(<v's columns>)`, recursively for views over views, so filters
//! on a view reach the stream underneath it (offset and `ts` bounds prune segments as they
//! do on the stream itself). Invariants:
//!
//! - A view's columns are fixed when it is created (names as PostgreSQL gives them, or as
//!   `CREATE VIEW v (a, b)` lists them) and applied as the derived table's column aliases,
//!   so `SELECT count FROM v` works over `SELECT count(*) FROM s`.
//! - The relations a view reads are recorded by name (`depends_on`). Apply refuses to drop
//!   them without CASCADE (`2BP01`), and to rename them or change their columns while the
//!   view exists, so the stored text always means what it meant when it was created.
//! - Nothing creates a cycle (checked when a view is created or replaced), and expansion
//!   stops at [`MAX_DEPTH`] levels anyway.
//! - A name is expanded only where it is not a CTE of the statement and is unqualified or
//!   qualified with `public`.

use std::collections::HashSet;
use std::ops::ControlFlow;
use std::sync::Arc;

use sqlparser::ast::{
    Ident, ObjectName, Query, Statement, TableAlias, TableAliasColumnDef, TableFactor, Visit,
    VisitMut, Visitor, VisitorMut,
};

use crate::command::AlterStream;
use crate::definition::{View, ViewDef};
use crate::error::{sqlstate, Error, Result};
use crate::statement::{self, sqlparser, Parsed};

/// Views over views deeper than this are refused when expanded (`54001`).
pub const MAX_DEPTH: usize = 32;

/// Parses a view definition's query (the same way a session parses a SELECT) into the
/// [`View`] the catalog holds.
pub fn parse(def: ViewDef) -> Result<View> {
    let query = match statement::parse(&def.query)?.pop() {
        Some(Parsed::Query(stmt)) => match *stmt {
            Statement::Query(q) => q,
            _ => return Err(not_a_query(&def.name)),
        },
        _ => return Err(not_a_query(&def.name)),
    };
    Ok(View { def, query })
}

fn not_a_query(name: &str) -> Error {
    Error::internal(format!(
        "the stored query of view \"{name}\" is not a query"
    ))
}

/// Finds a view by name (the catalog, or a test's map).
pub type Lookup<'a> = &'a dyn Fn(&str) -> Option<Arc<View>>;

/// Replaces every view `stmt` names with its query (see the module documentation).
pub fn expand(stmt: &mut Statement, lookup: Lookup<'_>) -> Result<()> {
    let ctes = cte_names(&*stmt);
    let mut e = Expander {
        lookup,
        ctes,
        depth: 0,
        error: None,
    };
    let _ = VisitMut::visit(stmt, &mut e);
    e.error.map_or(Ok(()), Err)
}

/// The relations a query reads by name (unqualified or in `public`), minus its own CTEs: what
/// a view over it depends on, once the caller keeps the names the catalog knows.
pub fn relations_read(q: &Query) -> Vec<String> {
    struct Names {
        out: Vec<String>,
    }
    impl Visitor for Names {
        type Break = ();
        fn pre_visit_relation(&mut self, name: &ObjectName) -> ControlFlow<()> {
            if let Some(n) = public_name(name) {
                if !self.out.contains(&n) {
                    self.out.push(n);
                }
            }
            ControlFlow::Continue(())
        }
    }
    let ctes = cte_names(q);
    let mut names = Names { out: Vec::new() };
    let _ = Visit::visit(q, &mut names);
    names.out.retain(|n| !ctes.contains(n));
    names.out
}

/// `name` as a relation of `public` (its last part), or `None` if it names another schema.
fn public_name(name: &ObjectName) -> Option<String> {
    let parts: Vec<&Ident> = name.0.iter().filter_map(|p| p.as_ident()).collect();
    if parts.len() != name.0.len() {
        return None;
    }
    match parts.as_slice() {
        [n] => Some(statement::normalize_ident(n)),
        [schema, n] if statement::normalize_ident(schema) == "public" => {
            Some(statement::normalize_ident(n))
        }
        _ => None,
    }
}

/// Every CTE name defined anywhere in `node`.
fn cte_names<V: Visit>(node: &V) -> HashSet<String> {
    struct Ctes(HashSet<String>);
    impl Visitor for Ctes {
        type Break = ();
        fn pre_visit_query(&mut self, q: &Query) -> ControlFlow<()> {
            if let Some(with) = &q.with {
                for cte in &with.cte_tables {
                    self.0.insert(statement::normalize_ident(&cte.alias.name));
                }
            }
            ControlFlow::Continue(())
        }
    }
    let mut c = Ctes(HashSet::new());
    let _ = node.visit(&mut c);
    c.0
}

struct Expander<'a> {
    lookup: Lookup<'a>,
    ctes: HashSet<String>,
    depth: usize,
    error: Option<Error>,
}

impl Expander<'_> {
    /// The derived table standing for `view` (its own views expanded first).
    fn derived(&mut self, view: &View, alias: Option<&TableAlias>) -> Result<TableFactor> {
        if self.depth >= MAX_DEPTH {
            return Err(Error::new(
                sqlstate::STATEMENT_TOO_COMPLEX,
                format!(
                    "views are nested more than {MAX_DEPTH} levels deep under \"{}\"",
                    view.name()
                ),
            ));
        }
        let mut query = view.query.clone();
        let mut inner = Expander {
            lookup: self.lookup,
            ctes: cte_names(&*query),
            depth: self.depth + 1,
            error: None,
        };
        let _ = VisitMut::visit(&mut *query, &mut inner);
        if let Some(e) = inner.error {
            return Err(e);
        }
        let alias = match alias {
            Some(a) if !a.columns.is_empty() => a.clone(),
            Some(a) => TableAlias {
                columns: column_aliases(view),
                ..a.clone()
            },
            None => TableAlias {
                explicit: true,
                name: Ident::with_quote('"', view.name()),
                columns: column_aliases(view),
                at: None,
            },
        };
        Ok(TableFactor::Derived {
            lateral: false,
            subquery: query,
            alias: Some(alias),
            sample: None,
        })
    }
}

fn column_aliases(view: &View) -> Vec<TableAliasColumnDef> {
    view.def
        .columns
        .iter()
        .map(|c| TableAliasColumnDef {
            name: Ident::with_quote('"', &c.name),
            data_type: None,
        })
        .collect()
}

impl VisitorMut for Expander<'_> {
    type Break = ();

    fn pre_visit_table_factor(&mut self, tf: &mut TableFactor) -> ControlFlow<()> {
        let TableFactor::Table {
            name,
            alias,
            args: None,
            ..
        } = tf
        else {
            return ControlFlow::Continue(());
        };
        let Some(view) = public_name(name)
            .filter(|n| !self.ctes.contains(n))
            .and_then(|n| (self.lookup)(&n))
        else {
            return ControlFlow::Continue(());
        };
        match self.derived(&view, alias.as_ref()) {
            Ok(derived) => {
                *tf = derived;
                ControlFlow::Continue(())
            }
            Err(e) => {
                self.error = Some(e);
                ControlFlow::Break(())
            }
        }
    }
}

/// Whether the views `lookup` finds (by name, starting from `deps`) reach `name`: a view
/// named `name` reading `deps` would be its own ancestor.
pub fn reaches(name: &str, deps: &[String], lookup: Lookup<'_>) -> bool {
    let mut seen = HashSet::new();
    let mut todo: Vec<String> = deps.to_vec();
    while let Some(d) = todo.pop() {
        if d == name {
            return true;
        }
        if !seen.insert(d.clone()) {
            continue;
        }
        if let Some(v) = lookup(&d) {
            todo.extend(v.def.depends_on.iter().cloned());
        }
    }
    false
}

/// 42809: `DROP VIEW` of what is not a view (`view_wanted`), or `DROP STREAM/TABLE` of a view.
pub fn wrong_drop_kind(name: &str, view_wanted: bool) -> Error {
    let (msg, detail) = if view_wanted {
        (
            "is not a view",
            "Use DROP STREAM or DROP TABLE to remove it.",
        )
    } else {
        ("is a view", "Use DROP VIEW to remove a view.")
    };
    Error::new(sqlstate::WRONG_OBJECT_TYPE, format!("\"{name}\" {msg}")).with_detail(detail)
}

/// 2BP01: a drop without CASCADE of `what` (`stream s`, `view v`) that `view` reads.
pub fn drop_blocked(what: &str, view: &str) -> Error {
    Error::new(
        sqlstate::DEPENDENT_OBJECTS_STILL_EXIST,
        format!("cannot drop {what} because other objects depend on it"),
    )
    .with_detail(format!(
        "view {view} depends on {what}. Use DROP ... CASCADE to drop the dependent objects too."
    ))
}

/// Whether an `ALTER STREAM` changes what a view's stored text names: the stream's name, or
/// its columns (added or renamed).
pub fn alter_renames(a: &AlterStream) -> bool {
    (!a.new_name.is_empty() && a.new_name != a.name)
        || !a.add_column_json.is_empty()
        || !a.rename_column.is_empty()
}

/// 2BP01: such an `ALTER STREAM` of stream `name` while `view` reads it.
pub fn alter_blocked(name: &str, view: &str) -> Error {
    Error::new(
        sqlstate::DEPENDENT_OBJECTS_STILL_EXIST,
        format!("cannot alter stream \"{name}\" because view \"{view}\" depends on it"),
    )
    .with_detail(
        "Renaming a stream or adding or renaming its columns needs its views dropped first (create them again after).",
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::definition::ColumnDef;
    use crate::types::ColumnType;

    fn view(name: &str, query: &str, columns: &[&str]) -> Arc<View> {
        let def = ViewDef {
            id: 1,
            oid: 1,
            name: name.into(),
            query: query.into(),
            columns: columns
                .iter()
                .map(|c| ColumnDef {
                    name: (*c).into(),
                    ty: ColumnType::Int8,
                    not_null: false,
                    default: None,
                })
                .collect(),
            depends_on: vec![],
        };
        Arc::new(parse(def).unwrap())
    }

    fn expanded(sql: &str, views: &[Arc<View>]) -> Result<String> {
        let lookup = |n: &str| views.iter().find(|v| v.name() == n).cloned();
        let mut stmt = match statement::parse(sql)?.pop() {
            Some(Parsed::Query(s)) => *s,
            _ => panic!("not a query"),
        };
        expand(&mut stmt, &lookup)?;
        Ok(stmt.to_string())
    }

    #[test]
    fn a_view_becomes_its_query_under_its_name_and_columns() {
        let v = [view("v", "SELECT count(*) FROM s", &["count"])];
        assert_eq!(
            expanded("SELECT count FROM v", &v).unwrap(),
            r#"SELECT count FROM (SELECT count(*) FROM s) AS "v" ("count")"#
        );
        // an alias keeps its name and gets the view's columns; its own columns win
        assert_eq!(
            expanded("SELECT x.count FROM public.v AS x", &v).unwrap(),
            r#"SELECT x.count FROM (SELECT count(*) FROM s) AS x ("count")"#
        );
        assert_eq!(
            expanded("SELECT n FROM v x(n)", &v).unwrap(),
            "SELECT n FROM (SELECT count(*) FROM s) x (n)"
        );
        // other schemas, CTEs of that name and table functions are left alone
        for sql in [
            "SELECT * FROM other.v",
            "WITH v AS (SELECT x FROM s) SELECT * FROM v",
        ] {
            assert_eq!(expanded(sql, &v).unwrap(), sql);
        }
    }

    #[test]
    fn views_over_views_expand_and_depth_is_bounded() {
        let a = view("a", "SELECT x FROM s WHERE x > 1", &["x"]);
        let b = view("b", "SELECT x FROM a", &["x"]);
        assert_eq!(
            expanded("SELECT * FROM b", &[a, b]).unwrap(),
            r#"SELECT * FROM (SELECT x FROM (SELECT x FROM s WHERE x > 1) AS "a" ("x")) AS "b" ("x")"#
        );
        // a cycle (which apply never lets in) stops at the depth limit
        let c = view("c", "SELECT x FROM c", &["x"]);
        let e = expanded("SELECT * FROM c", &[c]).unwrap_err();
        assert_eq!(e.code, sqlstate::STATEMENT_TOO_COMPLEX);
    }

    #[test]
    fn relations_read_and_cycles() {
        let q = match statement::parse(
            "WITH w AS (SELECT 1) SELECT * FROM s JOIN public.t ON true, w, pg_catalog.pg_class",
        )
        .unwrap()
        .pop()
        {
            Some(Parsed::Query(s)) => match *s {
                Statement::Query(q) => q,
                _ => unreachable!(),
            },
            _ => unreachable!(),
        };
        assert_eq!(relations_read(&q), vec!["s".to_string(), "t".to_string()]);
        let a = view("a", "SELECT 1", &["x"]);
        let mut b_def = view("b", "SELECT 1", &["x"]).def.clone();
        b_def.depends_on = vec!["a".into()];
        let b = Arc::new(parse(b_def).unwrap());
        let views = [a, b];
        let lookup = |n: &str| views.iter().find(|v| v.name() == n).cloned();
        assert!(reaches("a", &["b".to_string()], &lookup));
        assert!(!reaches("c", &["b".to_string()], &lookup));
    }
}
