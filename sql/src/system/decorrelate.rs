//! Correlated scalar subqueries that DataFusion cannot decorrelate,
//! rewritten into joins it plans.
//!
//! DataFusion decorrelates a scalar subquery only when it is correlated by
//! equalities (`WHERE x.k = t.k`); `SELECT (SELECT count(*) FROM t1 AS x
//! WHERE x.b < t1.b) FROM t1` fails to plan (0A000). PostgreSQL runs such a
//! subquery once per outer row. An aggregate over one relation gives the
//! same answer when every distinct combination of the outer values it reads
//! is joined with the inner rows its condition accepts and aggregated per
//! combination (decorrelation over the outer values' domain):
//!
//! ```sql
//! SELECT (SELECT count(*) FROM t1 AS x WHERE x.b < t1.b) FROM t1
//! -- becomes
//! SELECT __sluice_sq1.__sluice_v FROM t1 LEFT JOIN (
//!     SELECT __sluice_o.__sluice_k1, count(x.__sluice_m) AS __sluice_v
//!     FROM (SELECT DISTINCT t1.b AS __sluice_k1 FROM t1) AS __sluice_o
//!     LEFT JOIN (SELECT *, 1 AS __sluice_m FROM t1) AS x ON x.b < __sluice_o.__sluice_k1
//!     GROUP BY __sluice_o.__sluice_k1
//! ) AS __sluice_sq1 ON (__sluice_sq1.__sluice_k1 IS NOT DISTINCT FROM t1.b)
//! ```
//!
//! An outer value that no inner row matches keeps its group through the
//! left join, with one all-NULL inner row: `count(*)` (and `count` of a
//! constant) becomes a count of the marker column, 0 there, and every other
//! aggregate reads only NULLs there and is NULL, as over no rows. A NULL
//! outer value matches nothing (every comparison with it is NULL), as in
//! PostgreSQL. The join back matches at most one group per outer row, so
//! the outer query keeps its rows. Every name the rewrite adds starts with
//! `__sluice_`, so no column of the user's query becomes ambiguous.
//!
//! Rewritten only when all of this holds; anything else is left to
//! DataFusion as written:
//! - the subquery is `SELECT <expression with an aggregate> FROM <table>
//!   [AS x] [WHERE ...]`: one relation, no DISTINCT, GROUP BY, HAVING, ORDER
//!   BY, LIMIT, WITH, or subquery of its own;
//! - it reads the outer query through qualified columns (`t1.b`) of
//!   relations of one FROM item of the enclosing SELECT (a table or a chain
//!   of joins), only in its WHERE, and not only through equalities (those
//!   DataFusion decorrelates itself);
//! - every aggregate but `count(*)`/`count(constant)` reads an inner column;
//! - it sits in the WHERE of the enclosing SELECT, or in its select list
//!   when that SELECT does not group or aggregate itself.

use std::ops::ControlFlow;

use datafusion::sql::sqlparser::ast::{
    BinaryOperator, Expr, FunctionArg, FunctionArgExpr, FunctionArguments, GroupByExpr, Ident,
    Join, Query, Select, SelectItem, SetExpr, Statement, TableFactor, Visit, VisitMut, Visitor,
    VisitorMut,
};
use datafusion::sql::sqlparser::dialect::PostgreSqlDialect;
use datafusion::sql::sqlparser::parser::Parser;
use datafusion_pg_catalog::sql::rules::SqlStatementRewriteRule;

use super::rewrite::is_aggregate;
use crate::ast::{has_subquery, normalize_ident};

/// The marker column added to the inner relation: NULL only where the left
/// join found no inner row.
const MARKER: &str = "__sluice_m";

/// At most this much SQL text is added to one statement. Each rewrite copies
/// the outer FROM item into the derived table, and a copied FROM item may
/// hold correlated subqueries of its own, so without a bound a statement
/// within `max_statement_bytes` could grow without end; past it, the rest is
/// left to DataFusion (`0A000`, as before this rewrite).
pub const MAX_ADDED_BYTES: usize = 256 << 10;

/// The rewrite described in the module docs.
#[derive(Debug)]
pub struct CorrelatedAggregates;

impl SqlStatementRewriteRule for CorrelatedAggregates {
    fn rewrite(&self, mut s: Statement) -> Statement {
        let mut budget = Budget {
            next: 1,
            left: MAX_ADDED_BYTES,
        };
        let _ = VisitMut::visit(&mut s, &mut Decorrelate(&mut budget));
        s
    }
}

/// What one statement's rewrites share.
struct Budget {
    /// Number of the next derived table (`__sluice_sqN`), unique in the statement.
    next: usize,
    /// SQL text that may still be added (see [`MAX_ADDED_BYTES`]).
    left: usize,
}

struct Decorrelate<'a>(&'a mut Budget);

impl VisitorMut for Decorrelate<'_> {
    type Break = ();

    fn pre_visit_query(&mut self, q: &mut Query) -> ControlFlow<()> {
        self.set_expr(&mut q.body);
        ControlFlow::Continue(())
    }
}

impl Decorrelate<'_> {
    fn set_expr(&mut self, body: &mut SetExpr) {
        match body {
            SetExpr::Select(select) => self.select(select),
            SetExpr::SetOperation { left, right, .. } => {
                self.set_expr(left);
                self.set_expr(right);
            }
            _ => {}
        }
    }

    /// Rewrites the qualifying subqueries of one SELECT's select list and WHERE.
    fn select(&mut self, select: &mut Select) {
        let candidates = select.projection.iter().any(|item| match item {
            SelectItem::UnnamedExpr(e) | SelectItem::ExprWithAlias { expr: e, .. } => {
                has_subquery(e)
            }
            _ => false,
        }) || select.selection.as_ref().is_some_and(has_subquery);
        if !candidates || self.0.left == 0 {
            return;
        }
        let outer = Outer::of(select);
        if outer.relations.is_empty() {
            return;
        }
        let mut found = Vec::new();
        // a grouped or aggregating SELECT reads the new column only in WHERE,
        // which runs before grouping
        let grouped = !matches!(&select.group_by, GroupByExpr::Expressions(g, _) if g.is_empty())
            || select.having.is_some()
            || aggregates_itself(select);
        for item in select.projection.iter_mut().filter(|_| !grouped) {
            let name = match item {
                SelectItem::UnnamedExpr(Expr::Subquery(q)) => Some(subquery_name(q)),
                _ => None,
            };
            let (SelectItem::UnnamedExpr(expr) | SelectItem::ExprWithAlias { expr, .. }) = item
            else {
                continue;
            };
            let _ = VisitMut::visit(expr, &mut Replace::new(&outer, self.0, &mut found));
            // `SELECT (SELECT count(*) ...)` keeps the column name PostgreSQL gives it
            if let Some(name) = name.filter(|_| !matches!(expr, Expr::Subquery(_))) {
                *item = SelectItem::ExprWithAlias {
                    expr: expr.clone(),
                    // quoted: the name is already as PostgreSQL spells it
                    alias: Ident::with_quote('"', name),
                };
            }
        }
        if let Some(selection) = &mut select.selection {
            let _ = VisitMut::visit(selection, &mut Replace::new(&outer, self.0, &mut found));
        }
        for (from, join) in found {
            select.from[from].joins.push(join);
        }
    }
}

/// The enclosing SELECT's FROM as the rewrite reads it.
struct Outer {
    /// Each named relation: its name in column references and the FROM
    /// item it belongs to.
    relations: Vec<(String, usize)>,
    /// Each FROM item as written (before any join is added to it).
    items: Vec<String>,
}

impl Outer {
    fn of(select: &Select) -> Outer {
        let mut relations = Vec::new();
        for (from, twj) in select.from.iter().enumerate() {
            let factors =
                std::iter::once(&twj.relation).chain(twj.joins.iter().map(|j| &j.relation));
            for factor in factors {
                if let Some(qualifier) = qualifier(factor) {
                    relations.push((qualifier, from));
                }
            }
        }
        Outer {
            relations,
            items: select.from.iter().map(|twj| twj.to_string()).collect(),
        }
    }

    /// The FROM item holding the relation a qualifier names.
    fn item_of(&self, qualifier: &str) -> Option<usize> {
        self.relations
            .iter()
            .find(|(q, _)| q == qualifier)
            .map(|(_, from)| *from)
    }
}

/// The name a table or (non-lateral) derived table is referred to by.
fn qualifier(factor: &TableFactor) -> Option<String> {
    match factor {
        TableFactor::Table {
            name,
            alias,
            args: None,
            ..
        } => match alias {
            Some(a) if a.columns.is_empty() => Some(normalize_ident(&a.name)),
            Some(_) => None,
            None => name.0.last()?.as_ident().map(normalize_ident),
        },
        TableFactor::Derived {
            lateral: false,
            alias: Some(a),
            ..
        } if a.columns.is_empty() => Some(normalize_ident(&a.name)),
        _ => None,
    }
}

/// Whether the SELECT's own select list aggregates (not counting subqueries).
fn aggregates_itself(select: &Select) -> bool {
    struct Find {
        depth: usize,
        found: bool,
    }
    impl Visitor for Find {
        type Break = ();
        fn pre_visit_query(&mut self, _: &Query) -> ControlFlow<()> {
            self.depth += 1;
            ControlFlow::Continue(())
        }
        fn post_visit_query(&mut self, _: &Query) -> ControlFlow<()> {
            self.depth -= 1;
            ControlFlow::Continue(())
        }
        fn pre_visit_expr(&mut self, e: &Expr) -> ControlFlow<()> {
            if self.depth == 0
                && (is_aggregate(e) || matches!(e, Expr::Function(f) if f.over.is_some()))
            {
                self.found = true;
            }
            ControlFlow::Continue(())
        }
    }
    let mut find = Find {
        depth: 0,
        found: false,
    };
    let _ = select.projection.visit(&mut find);
    find.found
}

/// The name PostgreSQL gives `SELECT (subquery)`: its one column's.
fn subquery_name(q: &Query) -> String {
    let SetExpr::Select(s) = q.body.as_ref() else {
        return "?column?".into();
    };
    match s.projection.as_slice() {
        [SelectItem::ExprWithAlias { alias, .. }] => normalize_ident(alias),
        [SelectItem::UnnamedExpr(Expr::Function(f))] => f
            .name
            .0
            .last()
            .and_then(|p| p.as_ident())
            .map(normalize_ident)
            .unwrap_or_else(|| "?column?".into()),
        [SelectItem::UnnamedExpr(Expr::Identifier(i))] => normalize_ident(i),
        [SelectItem::UnnamedExpr(Expr::CompoundIdentifier(parts))] => parts
            .last()
            .map(normalize_ident)
            .unwrap_or_else(|| "?column?".into()),
        _ => "?column?".into(),
    }
}

/// Replaces qualifying subqueries of the enclosing SELECT (not those nested
/// deeper) with a column of a new derived table, collecting the joins.
struct Replace<'a> {
    outer: &'a Outer,
    budget: &'a mut Budget,
    found: &'a mut Vec<(usize, Join)>,
    depth: usize,
}

impl<'a> Replace<'a> {
    fn new(outer: &'a Outer, budget: &'a mut Budget, found: &'a mut Vec<(usize, Join)>) -> Self {
        Replace {
            outer,
            budget,
            found,
            depth: 0,
        }
    }
}

impl VisitorMut for Replace<'_> {
    type Break = ();

    fn pre_visit_query(&mut self, _: &mut Query) -> ControlFlow<()> {
        self.depth += 1;
        ControlFlow::Continue(())
    }

    fn post_visit_query(&mut self, _: &mut Query) -> ControlFlow<()> {
        self.depth -= 1;
        ControlFlow::Continue(())
    }

    fn pre_visit_expr(&mut self, e: &mut Expr) -> ControlFlow<()> {
        if self.depth > 0 {
            return ControlFlow::Continue(());
        }
        let Expr::Subquery(q) = e else {
            return ControlFlow::Continue(());
        };
        let name = format!("__sluice_sq{}", self.budget.next);
        let Some((from, join)) = decorrelated(q, self.outer, &name, self.budget.left) else {
            return ControlFlow::Continue(());
        };
        let added = join.to_string().len();
        if added <= self.budget.left {
            self.budget.left -= added;
            self.budget.next += 1;
            self.found.push((from, join));
            *e = Expr::CompoundIdentifier(vec![Ident::new(name), Ident::new("__sluice_v")]);
        }
        ControlFlow::Continue(())
    }
}

/// The inner relation of a qualifying subquery: its table and its name.
struct Inner<'a> {
    select: &'a Select,
    table: String,
    qualifier: String,
}

fn inner_of(q: &Query) -> Option<Inner<'_>> {
    if q.with.is_some()
        || q.order_by.is_some()
        || q.limit_clause.is_some()
        || q.fetch.is_some()
        || !q.locks.is_empty()
    {
        return None;
    }
    let SetExpr::Select(select) = q.body.as_ref() else {
        return None;
    };
    let plain = select.distinct.is_none()
        && matches!(&select.group_by, GroupByExpr::Expressions(g, _) if g.is_empty())
        && select.having.is_none()
        && select.projection.len() == 1
        && select.from.len() == 1
        && select.from[0].joins.is_empty();
    if !plain {
        return None;
    }
    let TableFactor::Table {
        name, args: None, ..
    } = &select.from[0].relation
    else {
        return None;
    };
    Some(Inner {
        select,
        table: name.to_string(),
        qualifier: qualifier(&select.from[0].relation)?,
    })
}

/// The join that computes `q` for every outer row, and which FROM item of
/// the enclosing SELECT it joins; `None` when `q` does not qualify or its
/// FROM item alone is longer than `left` bytes.
fn decorrelated(q: &Query, outer: &Outer, name: &str, left: usize) -> Option<(usize, Join)> {
    let inner = inner_of(q)?;
    let [SelectItem::UnnamedExpr(value) | SelectItem::ExprWithAlias { expr: value, .. }] =
        inner.select.projection.as_slice()
    else {
        return None;
    };
    let condition = inner.select.selection.as_ref()?;
    if has_subquery(value) || has_subquery(condition) {
        return None;
    }
    // the outer columns the condition reads, all from relations of one FROM item
    let refs = outer_refs(condition, &inner.qualifier)?;
    let from = outer.item_of(&refs.first()?.0)?;
    if outer.items[from].len() > left {
        return None;
    }
    if refs.iter().any(|(q, _)| outer.item_of(q) != Some(from))
        || !outer_refs(value, &inner.qualifier)?.is_empty()
        || only_equalities(condition, &inner.qualifier)
    {
        return None;
    }
    let mut keys: Vec<(String, Ident)> = Vec::new();
    for (q, column) in refs {
        if !keys
            .iter()
            .any(|(kq, kc)| *kq == q && normalize_ident(kc) == normalize_ident(&column))
        {
            keys.push((q, column));
        }
    }
    let value = counted_marker(value, &inner.qualifier)?;
    let mut on = condition.clone();
    let _ = VisitMut::visit(&mut on, &mut ToDomain { keys: &keys });
    let group: Vec<String> = (1..=keys.len())
        .map(|i| format!("__sluice_o.__sluice_k{i}"))
        .collect();
    let domain: Vec<String> = keys
        .iter()
        .enumerate()
        .map(|(i, (q, c))| format!("{}.{c} AS __sluice_k{}", quoted(q), i + 1))
        .collect();
    let back: Vec<String> = keys
        .iter()
        .enumerate()
        // parenthesized: sqlparser reads `IS NOT DISTINCT FROM b AND c` as `FROM (b AND c)`
        .map(|(i, (q, c))| {
            format!(
                "({name}.__sluice_k{} IS NOT DISTINCT FROM {}.{c})",
                i + 1,
                quoted(q)
            )
        })
        .collect();
    let sql = format!(
        "SELECT 1 FROM t LEFT JOIN (SELECT {group}, {value} AS __sluice_v \
         FROM (SELECT DISTINCT {domain} FROM {item}) AS __sluice_o \
         LEFT JOIN (SELECT *, 1 AS {MARKER} FROM {table}) AS {inner} ON {on} \
         GROUP BY {group}) AS {name} ON {back}",
        group = group.join(", "),
        domain = domain.join(", "),
        item = outer.items[from],
        table = inner.table,
        inner = quoted(&inner.qualifier),
        back = back.join(" AND "),
    );
    let Statement::Query(parsed) = Parser::new(&PostgreSqlDialect {})
        .try_with_sql(&sql)
        .ok()?
        .parse_statement()
        .ok()?
    else {
        return None;
    };
    let SetExpr::Select(mut select) = *parsed.body else {
        return None;
    };
    let join = select.from.pop()?.joins.pop()?;
    Some((from, join))
}

fn quoted(qualifier: &str) -> Ident {
    Ident::with_quote('"', qualifier)
}

/// The qualified column references in `e` that do not name the inner
/// relation, as (qualifier, column); `None` when one has more than two
/// parts (a schema-qualified reference this rewrite does not resolve).
fn outer_refs(e: &Expr, inner: &str) -> Option<Vec<(String, Ident)>> {
    struct Find<'a> {
        inner: &'a str,
        refs: Vec<(String, Ident)>,
        unresolved: bool,
    }
    impl Visitor for Find<'_> {
        type Break = ();
        fn pre_visit_expr(&mut self, e: &Expr) -> ControlFlow<()> {
            if let Expr::CompoundIdentifier(parts) = e {
                match parts.as_slice() {
                    [q, c] if normalize_ident(q) != self.inner => {
                        self.refs.push((normalize_ident(q), c.clone()))
                    }
                    [_, _] => {}
                    _ => self.unresolved = true,
                }
            }
            ControlFlow::Continue(())
        }
    }
    let mut find = Find {
        inner,
        refs: Vec::new(),
        unresolved: false,
    };
    let _ = e.visit(&mut find);
    (!find.unresolved).then_some(find.refs)
}

/// Whether every conjunct of `condition` that reads the outer query is an
/// equality between an inner and an outer expression.
fn only_equalities(condition: &Expr, inner: &str) -> bool {
    let mut conjuncts = vec![condition];
    let mut all = true;
    while let Some(c) = conjuncts.pop() {
        match c {
            Expr::BinaryOp {
                left,
                op: BinaryOperator::And,
                right,
            } => {
                conjuncts.push(left);
                conjuncts.push(right);
            }
            Expr::Nested(inside) => conjuncts.push(inside),
            _ => {
                let reads_outer = outer_refs(c, inner).is_some_and(|r| !r.is_empty());
                let equality = match c {
                    Expr::BinaryOp {
                        left,
                        op: BinaryOperator::Eq,
                        right,
                    } => {
                        let l = outer_refs(left, inner).is_some_and(|r| !r.is_empty());
                        let r = outer_refs(right, inner).is_some_and(|r| !r.is_empty());
                        l != r
                    }
                    _ => false,
                };
                if reads_outer && !equality {
                    all = false;
                }
            }
        }
    }
    all
}

/// `value` with `count(*)` and `count(constant)` counting the marker
/// column; `None` when another aggregate reads no column (`max(1)` would
/// be 1 where no row matched, not NULL).
fn counted_marker(value: &Expr, inner: &str) -> Option<Expr> {
    struct Mark {
        marker: Expr,
        ok: bool,
        saw_aggregate: bool,
    }
    impl VisitorMut for Mark {
        type Break = ();
        fn pre_visit_expr(&mut self, e: &mut Expr) -> ControlFlow<()> {
            if !is_aggregate(e) {
                return ControlFlow::Continue(());
            }
            self.saw_aggregate = true;
            let Expr::Function(f) = e else {
                return ControlFlow::Continue(());
            };
            let FunctionArguments::List(list) = &mut f.args else {
                self.ok = false;
                return ControlFlow::Continue(());
            };
            let is_count = f
                .name
                .0
                .last()
                .and_then(|p| p.as_ident())
                .is_some_and(|i| normalize_ident(i) == "count");
            let constant = match list.args.as_slice() {
                [FunctionArg::Unnamed(FunctionArgExpr::Wildcard)] => true,
                [FunctionArg::Unnamed(FunctionArgExpr::Expr(Expr::Value(_)))] => true,
                _ => !reads_column(&list.args),
            };
            if constant && is_count {
                list.args = vec![FunctionArg::Unnamed(FunctionArgExpr::Expr(
                    self.marker.clone(),
                ))];
            } else if constant {
                self.ok = false;
            }
            ControlFlow::Continue(())
        }
    }
    let mut out = value.clone();
    let mut mark = Mark {
        marker: Expr::CompoundIdentifier(vec![quoted(inner), Ident::new(MARKER)]),
        ok: true,
        saw_aggregate: false,
    };
    let _ = VisitMut::visit(&mut out, &mut mark);
    (mark.ok && mark.saw_aggregate).then_some(out)
}

fn reads_column(args: &[FunctionArg]) -> bool {
    struct Find(bool);
    impl Visitor for Find {
        type Break = ();
        fn pre_visit_expr(&mut self, e: &Expr) -> ControlFlow<()> {
            if matches!(e, Expr::Identifier(_) | Expr::CompoundIdentifier(_)) {
                self.0 = true;
            }
            ControlFlow::Continue(())
        }
    }
    let mut find = Find(false);
    for arg in args {
        let _ = arg.visit(&mut find);
    }
    find.0
}

/// Points the outer columns at the domain's keys.
struct ToDomain<'a> {
    keys: &'a [(String, Ident)],
}

impl VisitorMut for ToDomain<'_> {
    type Break = ();

    fn pre_visit_expr(&mut self, e: &mut Expr) -> ControlFlow<()> {
        if let Expr::CompoundIdentifier(parts) = e {
            if let [q, c] = parts.as_slice() {
                let key = self.keys.iter().position(|(kq, kc)| {
                    *kq == normalize_ident(q) && normalize_ident(kc) == normalize_ident(c)
                });
                if let Some(i) = key {
                    *e = Expr::CompoundIdentifier(vec![
                        Ident::new("__sluice_o"),
                        Ident::new(format!("__sluice_k{}", i + 1)),
                    ]);
                }
            }
        }
        ControlFlow::Continue(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rewritten(sql: &str) -> String {
        let stmt = Parser::new(&PostgreSqlDialect {})
            .try_with_sql(sql)
            .and_then(|mut p| p.parse_statement())
            .expect("parse");
        CorrelatedAggregates.rewrite(stmt).to_string()
    }

    #[test]
    fn a_count_correlated_by_less_than_becomes_a_left_join() {
        let out = rewritten("SELECT a, (SELECT count(*) FROM t1 AS x WHERE x.b < t1.b) FROM t1");
        assert!(!out.contains("(SELECT count(*)"), "{out}");
        assert!(out.contains("count(\"x\".__sluice_m)"), "{out}");
        assert!(out.contains("IS NOT DISTINCT FROM \"t1\".b"), "{out}");
        assert!(out.contains("AS \"count\""), "{out}");
    }

    #[test]
    fn what_datafusion_decorrelates_or_this_cannot_is_left_alone() {
        for sql in [
            // equalities only: DataFusion's own decorrelation
            "SELECT (SELECT count(*) FROM t1 AS x WHERE x.b = t1.b) FROM t1",
            // not an aggregate
            "SELECT (SELECT x.a FROM t1 AS x WHERE x.b < t1.b LIMIT 1) FROM t1",
            // an aggregate of a constant other than count: 1 where nothing matches
            "SELECT (SELECT max(1) FROM t1 AS x WHERE x.b < t1.b) FROM t1",
            // the outer column outside WHERE
            "SELECT (SELECT count(*) + t1.a FROM t1 AS x WHERE x.b < t1.b) FROM t1",
            // in the select list of a grouped query
            "SELECT count(*), (SELECT count(*) FROM t1 AS x WHERE x.b < t1.b) FROM t1",
            // two inner relations
            "SELECT (SELECT count(*) FROM t1 AS x, t2 WHERE x.b < t1.b) FROM t1",
        ] {
            let parsed = Parser::new(&PostgreSqlDialect {})
                .try_with_sql(sql)
                .and_then(|mut p| p.parse_statement())
                .expect("parse")
                .to_string();
            assert_eq!(rewritten(sql), parsed, "{sql}");
        }
    }

    /// Each level's FROM item holds the level below with eight correlated subqueries, and
    /// every rewrite copies its FROM item: unbounded, the text would grow as 8^8. The rewrite
    /// stops adding at `MAX_ADDED_BYTES` (without the bound this test does not finish).
    #[test]
    fn nested_copies_stop_at_the_budget() {
        let mut sql = "SELECT b FROM t".to_string();
        for level in 0..8 {
            let subs: Vec<String> = (0..8)
                .map(|i| {
                    format!("(SELECT count(*) FROM t AS x WHERE x.b < l{level}.b + {i}) AS c{i}")
                })
                .collect();
            sql = format!(
                "SELECT l{level}.b, {} FROM ({sql}) AS l{level}",
                subs.join(", ")
            );
        }
        let out = rewritten(&sql);
        assert!(out.contains("__sluice_sq1"), "nothing was rewritten");
        assert!(
            out.len() <= sql.len() + MAX_ADDED_BYTES,
            "{} bytes from {}",
            out.len(),
            sql.len()
        );
    }
}
