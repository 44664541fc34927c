//! PostgreSQL constructs in client catalog queries that DataFusion has no
//! direct equivalent for, rewritten into ones it plans:
//!
//! - `generate_subscripts(a, 1)` (a set-returning function in a select
//!   list) → `unnest(range(1, array_length(a, 1) + 1))`;
//! - `information_schema._pg_expandarray(a)` (set-returning, composite
//!   `(x, n)`) → `unnest(pg_expandarray_struct(a))`, whose struct fields
//!   `(...).x` / `(...).n` read as in PostgreSQL;
//! - `CAST(f(...) AS regclass)` of a computed name → `to_regclass(f(...))`
//!   (literal names are resolved by the crate's rewrite);
//! - `'{1,2,7}'::int[]` (array text cast to an array type) →
//!   `CAST(ARRAY['1', '2', '7'] AS INT[])`, each element then cast as
//!   DataFusion casts lists;
//! - `bool_col = 't'` and friends: an untyped string literal compared with
//!   a boolean takes the boolean type, as PostgreSQL's unknown literals do
//!   ([`BoolLiterals`], an analyzer rule, since it needs the types).

use std::ops::ControlFlow;
use std::sync::Arc;

use datafusion::common::tree_node::{Transformed, TreeNode};
use datafusion::common::{DFSchema, ScalarValue};
use datafusion::config::ConfigOptions;
use datafusion::error::Result as DFResult;
use datafusion::logical_expr::{BinaryExpr, Expr as LExpr, ExprSchemable, LogicalPlan, Operator};
use datafusion::optimizer::AnalyzerRule;
use datafusion::sql::sqlparser::ast::{
    DataType as SqlType, Expr, FunctionArg, FunctionArgExpr, FunctionArguments, Statement, Value,
    VisitMut, VisitorMut,
};
use datafusion::sql::sqlparser::dialect::PostgreSqlDialect;
use datafusion::sql::sqlparser::parser::Parser;
use datafusion_pg_catalog::sql::rules::SqlStatementRewriteRule;

/// Unqualified names of Sluice's own pg_catalog relations that the crate's list
/// (`PG_CATALOG_TABLES`, which its own rule qualifies) does not have.
pub const OWN_UNLISTED: &[&str] = &["pg_stat_ssl", "pg_user", "pg_indexes"];

/// Qualifies [`OWN_UNLISTED`] names with `pg_catalog`, as the search path would.
#[derive(Debug)]
pub struct OwnRelations;

impl SqlStatementRewriteRule for OwnRelations {
    fn rewrite(&self, mut s: Statement) -> Statement {
        struct Qualify;
        impl VisitorMut for Qualify {
            type Break = ();
            fn pre_visit_relation(
                &mut self,
                name: &mut datafusion::sql::sqlparser::ast::ObjectName,
            ) -> ControlFlow<()> {
                use datafusion::sql::sqlparser::ast::{Ident, ObjectNamePart};
                if let [ObjectNamePart::Identifier(ident)] = name.0.as_slice() {
                    let lower = ident.value.to_ascii_lowercase();
                    if ident.quote_style.is_none() && OWN_UNLISTED.contains(&lower.as_str()) {
                        name.0
                            .insert(0, ObjectNamePart::Identifier(Ident::new("pg_catalog")));
                    }
                }
                ControlFlow::Continue(())
            }
        }
        let _ = s.visit(&mut Qualify);
        s
    }
}

/// `SELECT current_user` names its column `current_user`, as PostgreSQL does (the crate's
/// rule renames the call to `session_user`, whose name the column would take otherwise):
/// an unaliased select item that is one of the parenthesis-less keyword functions gets its
/// own name as an alias.
#[derive(Debug)]
pub struct KeywordColumnNames;

impl SqlStatementRewriteRule for KeywordColumnNames {
    fn rewrite(&self, mut s: Statement) -> Statement {
        use datafusion::sql::sqlparser::ast::{Ident, Query, SelectItem, SetExpr};
        struct Alias;
        impl VisitorMut for Alias {
            type Break = ();
            fn pre_visit_query(&mut self, q: &mut Query) -> ControlFlow<()> {
                let SetExpr::Select(select) = q.body.as_mut() else {
                    return ControlFlow::Continue(());
                };
                for item in &mut select.projection {
                    let SelectItem::UnnamedExpr(Expr::Function(f)) = item else {
                        continue;
                    };
                    let name = match f.name.0.as_slice() {
                        [part] => part.as_ident().filter(|i| i.quote_style.is_none()),
                        _ => None,
                    };
                    let Some(name) = name.map(|i| i.value.to_ascii_lowercase()) else {
                        continue;
                    };
                    if matches!(f.args, FunctionArguments::None)
                        && ["current_user", "current_role", "current_catalog"]
                            .contains(&name.as_str())
                    {
                        *item = SelectItem::ExprWithAlias {
                            expr: Expr::Function(f.clone()),
                            alias: Ident::new(name),
                        };
                    }
                }
                ControlFlow::Continue(())
            }
        }
        let _ = s.visit(&mut Alias);
        s
    }
}

/// The AST rewrites listed in the module docs.
#[derive(Debug)]
pub struct PgFunctions;

impl SqlStatementRewriteRule for PgFunctions {
    fn rewrite(&self, mut s: Statement) -> Statement {
        let _ = s.visit(&mut PgFunctionsVisitor);
        s
    }
}

struct PgFunctionsVisitor;

fn function_args(f: &datafusion::sql::sqlparser::ast::Function) -> Vec<&Expr> {
    match &f.args {
        FunctionArguments::List(list) => list
            .args
            .iter()
            .filter_map(|a| match a {
                FunctionArg::Unnamed(FunctionArgExpr::Expr(e)) => Some(e),
                _ => None,
            })
            .collect(),
        _ => vec![],
    }
}

/// `ARRAY['1', '2', NULL]` from the array text `{1,2,NULL}`; `None` when it is not one (the
/// cast then fails as it would have).
fn array_of_strings(text: &str) -> Option<Expr> {
    let elements = crate::types::arrays::parse_text_elements(text).ok()?;
    let items: Vec<String> = elements
        .iter()
        .map(|e| match e {
            Some(e) => format!("'{}'", e.replace('\'', "''")),
            None => "NULL".into(),
        })
        .collect();
    parse_expr(&format!("ARRAY[{}]", items.join(", ")))
}

fn parse_expr(sql: &str) -> Option<Expr> {
    Parser::new(&PostgreSqlDialect {})
        .try_with_sql(sql)
        .ok()?
        .parse_expr()
        .ok()
}

/// PostgreSQL functions written in terms of DataFusion's: `generate_subscripts`,
/// `_pg_expandarray`, and `x = ANY($1)` (after the crate's rewrite to `array_has`) with array
/// text for its parameter.
fn function_replacement(f: &datafusion::sql::sqlparser::ast::Function) -> Option<Expr> {
    let name = f
        .name
        .0
        .last()
        .and_then(|p| p.as_ident())
        .map(|i| i.value.to_ascii_lowercase());
    let args = function_args(f);
    match (name.as_deref(), args.as_slice()) {
        (Some("generate_subscripts"), [a, _dim]) => parse_expr(&format!(
            "unnest(range(1, CAST(array_length({a}, 1) AS BIGINT) + 1))"
        )),
        (Some("_pg_expandarray"), [a]) => {
            parse_expr(&format!("unnest(pg_expandarray_struct({a}))"))
        }
        (Some("array_has" | "array_contains"), [a, x]) if is_placeholder(a) => {
            parse_expr(&format!("array_has(pg_array_in({a}), {x})"))
        }
        _ => None,
    }
}

impl VisitorMut for PgFunctionsVisitor {
    type Break = ();

    fn post_visit_expr(&mut self, expr: &mut Expr) -> ControlFlow<()> {
        let replacement = match expr {
            Expr::Function(f) => function_replacement(f),
            // `'{1,2,7}'::int[]`: DataFusion casts no string to a list, but casts a list of
            // strings element by element
            Expr::Cast {
                expr: operand,
                data_type: SqlType::Array(_),
                ..
            } => {
                let array = match &**operand {
                    Expr::Value(v) => match &v.value {
                        Value::SingleQuotedString(text) => array_of_strings(text),
                        _ => None,
                    },
                    _ => None,
                };
                if let Some(array) = array {
                    **operand = array;
                }
                None
            }
            // `oid::regtype::text` is the type's name
            Expr::Cast {
                expr: operand,
                data_type,
                ..
            } if is_text(data_type)
                && matches!(&**operand, Expr::Cast { data_type: inner, .. } if is_regtype(inner)) =>
            {
                match &**operand {
                    Expr::Cast { expr: oid, .. } => {
                        parse_expr(&format!("format_type({oid}, NULL)"))
                    }
                    _ => None,
                }
            }
            Expr::Cast {
                expr: operand,
                data_type,
                ..
            } if matches!(**operand, Expr::Function(_)) && is_regclass(data_type) => {
                parse_expr(&format!("to_regclass({operand})"))
            }
            // `(composite).field`
            Expr::CompoundFieldAccess { root, access_chain }
                if !matches!(**root, Expr::Identifier(_) | Expr::CompoundIdentifier(_)) =>
            {
                match access_chain.as_slice() {
                    [datafusion::sql::sqlparser::ast::AccessExpr::Dot(Expr::Identifier(field))] => {
                        parse_expr(&format!("get_field({root}, '{}')", field.value))
                    }
                    _ => None,
                }
            }
            Expr::Like {
                pattern,
                escape_char,
                ..
            }
            | Expr::ILike {
                pattern,
                escape_char,
                ..
            } => {
                if let Some(esc) = escape_char.as_ref().and_then(escape_of) {
                    if esc != '\\' {
                        if literal_pattern(pattern) {
                            let _ = pattern.visit(&mut EscapeToBackslash(esc));
                            *escape_char = None;
                        } else if let Some(p) = parse_expr(&format!(
                            "pg_like_escape({pattern}, '{}')",
                            esc.to_string().replace('\'', "''")
                        )) {
                            // a computed pattern is converted when it is known
                            **pattern = p;
                            *escape_char = None;
                        }
                    }
                }
                None
            }
            Expr::AnyOp { right, .. } | Expr::AllOp { right, .. }
                if matches!(
                    &**right,
                    Expr::Value(v) if matches!(v.value, Value::Placeholder(_))
                ) =>
            {
                // `= ANY($1)`: an untyped parameter is PostgreSQL array text
                if let Some(r) = parse_expr(&format!("pg_array_in({right})")) {
                    **right = r;
                }
                None
            }
            _ => None,
        };
        if let Some(r) = replacement {
            *expr = r;
        }
        ControlFlow::Continue(())
    }
}

/// A LIKE pattern made of string literals only (possibly concatenated):
/// those can be rewritten to backslash escapes; anything computed cannot.
fn literal_pattern(e: &Expr) -> bool {
    match e {
        Expr::Value(v) => matches!(v.value, Value::SingleQuotedString(_)),
        Expr::BinaryOp {
            left,
            op: datafusion::sql::sqlparser::ast::BinaryOperator::StringConcat,
            right,
        } => literal_pattern(left) && literal_pattern(right),
        Expr::Nested(e) => literal_pattern(e),
        _ => false,
    }
}

/// The character of a `LIKE ... ESCAPE 'c'` clause.
fn escape_of(v: &datafusion::sql::sqlparser::ast::ValueWithSpan) -> Option<char> {
    match &v.value {
        Value::SingleQuotedString(s) if s.chars().count() == 1 => s.chars().next(),
        _ => None,
    }
}

/// A LIKE pattern written with escape character `esc`, rewritten to use
/// backslash (the only escape DataFusion accepts).
pub(crate) fn like_to_backslash(pattern: &str, esc: char) -> String {
    let mut out = String::with_capacity(pattern.len() + 2);
    let mut chars = pattern.chars();
    while let Some(c) = chars.next() {
        if c == esc {
            out.push('\\');
            if let Some(next) = chars.next() {
                out.push(next);
            }
        } else if c == '\\' {
            out.push_str("\\\\");
        } else {
            out.push(c);
        }
    }
    out
}

/// Rewrites string literals of a LIKE pattern from escape character `.0`
/// to backslash, the only one DataFusion accepts.
struct EscapeToBackslash(char);

impl VisitorMut for EscapeToBackslash {
    type Break = ();

    fn pre_visit_value(
        &mut self,
        v: &mut datafusion::sql::sqlparser::ast::ValueWithSpan,
    ) -> ControlFlow<()> {
        if let Value::SingleQuotedString(s) = &mut v.value {
            *s = like_to_backslash(s, self.0);
        }
        ControlFlow::Continue(())
    }
}

/// In a select list, integer literals that fit are `integer` (int4), as in
/// PostgreSQL, rather than DataFusion's `bigint`: `SELECT 1` and
/// `SELECT $1::int + 1` are int4 columns. An expression made only of such
/// literals and int4 casts is computed in bigint and cast to int4 as a
/// whole, so an overflow is an error (as in PostgreSQL), not a wraparound.
/// The cast is spelled `INT4`, which naming reads as "no name of its own"
/// (`?column?`).
#[derive(Debug)]
pub struct IntLiterals;

impl SqlStatementRewriteRule for IntLiterals {
    fn rewrite(&self, mut s: Statement) -> Statement {
        let _ = s.visit(&mut IntLiteralsVisitor);
        s
    }
}

struct IntLiteralsVisitor;

impl VisitorMut for IntLiteralsVisitor {
    type Break = ();

    fn pre_visit_query(
        &mut self,
        q: &mut datafusion::sql::sqlparser::ast::Query,
    ) -> ControlFlow<()> {
        use datafusion::sql::sqlparser::ast::{SelectItem, SetExpr};
        if let SetExpr::Select(select) = q.body.as_mut() {
            for item in select.projection.iter_mut() {
                if let SelectItem::UnnamedExpr(e) | SelectItem::ExprWithAlias { expr: e, .. } = item
                {
                    if int4_only(e) && has_int4_literal(e) {
                        let inner = std::mem::replace(e, Expr::value(Value::Null));
                        *e = Expr::Cast {
                            kind: datafusion::sql::sqlparser::ast::CastKind::DoubleColon,
                            expr: Box::new(inner),
                            data_type: SqlType::Int4(None),
                            array: false,
                            format: None,
                        };
                    }
                }
            }
        }
        ControlFlow::Continue(())
    }
}

fn int4_literal(e: &Expr) -> bool {
    matches!(e, Expr::Value(v) if matches!(&v.value, Value::Number(n, false) if n.parse::<i32>().is_ok()))
}

/// Integer literals and int4 casts combined with + - * / %.
fn int4_only(e: &Expr) -> bool {
    use datafusion::sql::sqlparser::ast::BinaryOperator as B;
    match e {
        e if int4_literal(e) => true,
        Expr::Cast { data_type, .. } => {
            matches!(
                data_type,
                SqlType::Integer(_) | SqlType::Int(_) | SqlType::Int4(_)
            )
        }
        Expr::BinaryOp { left, op, right } => {
            matches!(op, B::Plus | B::Minus | B::Multiply | B::Divide | B::Modulo)
                && int4_only(left)
                && int4_only(right)
        }
        Expr::UnaryOp { expr, .. } | Expr::Nested(expr) => int4_only(expr),
        _ => false,
    }
}

fn has_int4_literal(e: &Expr) -> bool {
    match e {
        e if int4_literal(e) => true,
        Expr::BinaryOp { left, right, .. } => has_int4_literal(left) || has_int4_literal(right),
        Expr::UnaryOp { expr, .. } | Expr::Nested(expr) => has_int4_literal(expr),
        _ => false,
    }
}

fn is_placeholder(e: &Expr) -> bool {
    matches!(e, Expr::Value(v) if matches!(v.value, Value::Placeholder(_)))
}

/// For catalog queries: a scalar subquery that picks one column without
/// aggregating is made to aggregate it (`max`), which DataFusion can
/// decorrelate wherever the subquery sits; the catalog lookups clients
/// write this way (defaults, collations, identity options) match at most
/// one row, so the value is the same.
#[derive(Debug)]
pub struct AggregateScalarSubqueries;

impl SqlStatementRewriteRule for AggregateScalarSubqueries {
    fn rewrite(&self, mut s: Statement) -> Statement {
        let _ = s.visit(&mut AggregateVisitor);
        s
    }
}

struct AggregateVisitor;

impl VisitorMut for AggregateVisitor {
    type Break = ();

    fn pre_visit_expr(&mut self, e: &mut Expr) -> ControlFlow<()> {
        use datafusion::sql::sqlparser::ast::{GroupByExpr, SelectItem, SetExpr};
        if let Expr::Subquery(q) = e {
            if q.limit_clause.is_some() || q.fetch.is_some() || q.order_by.is_some() {
                return ControlFlow::Continue(());
            }
            if let SetExpr::Select(select) = q.body.as_mut() {
                let grouped =
                    !matches!(&select.group_by, GroupByExpr::Expressions(g, _) if g.is_empty());
                if grouped || select.projection.len() != 1 || select.having.is_some() {
                    return ControlFlow::Continue(());
                }
                if let SelectItem::UnnamedExpr(inner)
                | SelectItem::ExprWithAlias { expr: inner, .. } = &mut select.projection[0]
                {
                    if !contains_aggregate(inner) {
                        if let Some(agg) = parse_expr(&format!("max({inner})")) {
                            *inner = agg;
                        }
                    }
                }
            }
        }
        ControlFlow::Continue(())
    }
}

/// For catalog queries: a correlated scalar subquery inside a CASE (how
/// SQLAlchemy looks up column defaults, identity and collation options) is
/// NULL, as the crate already does for ones directly in a select list.
/// DataFusion cannot decorrelate these lookups; for Sluice's relations the
/// answer is NULL anyway (no defaults, identities or non-default
/// collations). Revisit when tables get column defaults.
#[derive(Debug)]
pub struct CaseSubqueries;

impl SqlStatementRewriteRule for CaseSubqueries {
    fn rewrite(&self, mut s: Statement) -> Statement {
        let _ = s.visit(&mut CaseVisitor);
        s
    }
}

struct CaseVisitor;

impl VisitorMut for CaseVisitor {
    type Break = ();

    fn pre_visit_expr(&mut self, e: &mut Expr) -> ControlFlow<()> {
        if let Expr::Case {
            conditions,
            else_result,
            ..
        } = e
        {
            let mut parts: Vec<&mut Expr> = Vec::new();
            for c in conditions.iter_mut() {
                parts.push(&mut c.condition);
                parts.push(&mut c.result);
            }
            if let Some(e) = else_result {
                parts.push(e);
            }
            for part in parts {
                let _ = part.visit(&mut NullCorrelated);
            }
        }
        ControlFlow::Continue(())
    }
}

struct NullCorrelated;

impl VisitorMut for NullCorrelated {
    type Break = ();

    fn pre_visit_expr(&mut self, e: &mut Expr) -> ControlFlow<()> {
        if let Expr::Subquery(q) = e {
            if is_correlated(q) {
                *e = Expr::value(Value::Null);
            }
        }
        ControlFlow::Continue(())
    }
}

/// Whether a subquery names columns qualified by a relation it does not
/// itself read from.
fn is_correlated(q: &datafusion::sql::sqlparser::ast::Query) -> bool {
    use datafusion::sql::sqlparser::ast::{SetExpr, TableFactor, Visit, Visitor};
    let SetExpr::Select(select) = q.body.as_ref() else {
        return false;
    };
    let mut local: Vec<String> = Vec::new();
    let mut add = |f: &TableFactor| {
        if let TableFactor::Table { name, alias, .. } = f {
            local.push(name.to_string().to_ascii_lowercase());
            if let Some(last) = name.0.last() {
                local.push(last.to_string().to_ascii_lowercase());
            }
            if let Some(a) = alias {
                local.push(a.name.value.to_ascii_lowercase());
            }
        }
    };
    for t in &select.from {
        add(&t.relation);
        for j in &t.joins {
            add(&j.relation);
        }
    }
    struct Outer<'a>(&'a [String], bool);
    impl Visitor for Outer<'_> {
        type Break = ();
        fn pre_visit_expr(&mut self, e: &Expr) -> ControlFlow<()> {
            if let Expr::CompoundIdentifier(parts) = e {
                if parts.len() > 1 {
                    let qualifier = parts[..parts.len() - 1]
                        .iter()
                        .map(|p| p.value.to_ascii_lowercase())
                        .collect::<Vec<_>>()
                        .join(".");
                    if !self.0.contains(&qualifier) {
                        self.1 = true;
                    }
                }
            }
            ControlFlow::Continue(())
        }
    }
    let mut outer = Outer(&local, false);
    let _ = q.visit(&mut outer);
    outer.1
}

fn contains_aggregate(e: &Expr) -> bool {
    use datafusion::sql::sqlparser::ast::{Visit, Visitor};
    struct Find(bool);
    impl Visitor for Find {
        type Break = ();
        fn pre_visit_expr(&mut self, e: &Expr) -> ControlFlow<()> {
            if is_aggregate(e) || matches!(e, Expr::Function(f) if f.over.is_some()) {
                self.0 = true;
            }
            ControlFlow::Continue(())
        }
    }
    let mut f = Find(false);
    let _ = e.visit(&mut f);
    f.0
}

pub(super) fn is_aggregate(e: &Expr) -> bool {
    match e {
        Expr::Function(f) => f
            .name
            .0
            .last()
            .and_then(|p| p.as_ident())
            .map(|i| {
                matches!(
                    i.value.to_ascii_lowercase().as_str(),
                    "count"
                        | "sum"
                        | "min"
                        | "max"
                        | "avg"
                        | "array_agg"
                        | "string_agg"
                        | "bool_and"
                        | "bool_or"
                )
            })
            .unwrap_or(false),
        _ => false,
    }
}

fn is_regtype(t: &SqlType) -> bool {
    let name = t.to_string().to_ascii_lowercase();
    name == "regtype" || name == "pg_catalog.regtype"
}

fn is_text(t: &SqlType) -> bool {
    let name = t.to_string().to_ascii_lowercase();
    matches!(name.as_str(), "text" | "pg_catalog.text" | "varchar")
}

fn is_regclass(t: &SqlType) -> bool {
    let name = t.to_string().to_ascii_lowercase();
    name == "regclass" || name == "pg_catalog.regclass"
}

/// `<boolean> <cmp> '<text literal>'` → the literal as a boolean.
#[derive(Debug, Default)]
pub struct BoolLiterals;

impl AnalyzerRule for BoolLiterals {
    fn name(&self) -> &str {
        "sluice_bool_literals"
    }

    fn analyze(&self, plan: LogicalPlan, _: &ConfigOptions) -> DFResult<LogicalPlan> {
        plan.transform_up_with_subqueries(|plan| {
            let inputs = plan.inputs();
            if inputs.is_empty() {
                return Ok(Transformed::no(plan));
            }
            let mut schema = DFSchema::empty();
            for input in inputs {
                schema.merge(input.schema());
            }
            let schema = Arc::new(schema);
            plan.map_expressions(|e| {
                e.transform_up(|e| match e {
                    LExpr::BinaryExpr(b) if is_comparison(b.op) => {
                        let (l, r) = (b.left, b.right);
                        let l_bool = l.get_type(schema.as_ref()).ok()
                            == Some(arrow::datatypes::DataType::Boolean);
                        let r_bool = r.get_type(schema.as_ref()).ok()
                            == Some(arrow::datatypes::DataType::Boolean);
                        let (l, r, changed) = match (l_bool, r_bool) {
                            (true, false) => match as_bool_literal(&r) {
                                Some(v) => (l, Box::new(v), true),
                                None => (l, r, false),
                            },
                            (false, true) => match as_bool_literal(&l) {
                                Some(v) => (Box::new(v), r, true),
                                None => (l, r, false),
                            },
                            _ => (l, r, false),
                        };
                        let e = LExpr::BinaryExpr(BinaryExpr {
                            left: l,
                            op: b.op,
                            right: r,
                        });
                        Ok(if changed {
                            Transformed::yes(e)
                        } else {
                            Transformed::no(e)
                        })
                    }
                    other => Ok(Transformed::no(other)),
                })
            })
        })
        .map(|t| t.data)
    }
}

fn is_comparison(op: Operator) -> bool {
    matches!(
        op,
        Operator::Eq | Operator::NotEq | Operator::IsDistinctFrom | Operator::IsNotDistinctFrom
    )
}

fn as_bool_literal(e: &LExpr) -> Option<LExpr> {
    let LExpr::Literal(ScalarValue::Utf8(Some(s)), _) = e else {
        return None;
    };
    crate::types::parse_bool(s).map(|b| LExpr::Literal(ScalarValue::Boolean(Some(b)), None))
}
