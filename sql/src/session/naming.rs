//! Result column names as PostgreSQL gives them, and the aliases that let
//! DataFusion plan what PostgreSQL accepts (`SELECT 1, 1`).

use std::sync::Arc;

use arrow::datatypes::{Field, Schema, SchemaRef};
use sqlparser::ast::{Expr, SelectItem, SetExpr, Statement};

use crate::statement::{self, sqlparser};
use crate::types::ColumnType;

/// Result column names as PostgreSQL gives them: an unaliased column keeps
/// its name, a function call is named after the function, a cast after its
/// operand, anything else is `?column?` (DataFusion would print the whole
/// expression).
pub(super) fn pg_column_names(stmt: &Statement, schema: &Schema) -> SchemaRef {
    let Statement::Query(q) = stmt else {
        return Arc::new(schema.clone());
    };
    let SetExpr::Select(select) = q.body.as_ref() else {
        return Arc::new(schema.clone());
    };
    if select.projection.len() != schema.fields().len()
        || select.projection.iter().any(|p| {
            matches!(
                p,
                SelectItem::Wildcard(_) | SelectItem::QualifiedWildcard(..)
            )
        })
    {
        return Arc::new(schema.clone());
    }
    let fields: Vec<Field> = select
        .projection
        .iter()
        .zip(schema.fields())
        .map(|(item, f)| match item {
            SelectItem::UnnamedExpr(e) => f.as_ref().clone().with_name(expr_name(e)),
            SelectItem::ExprWithAlias { alias, .. } => f
                .as_ref()
                .clone()
                .with_name(statement::normalize_ident(alias)),
            _ => f.as_ref().clone(),
        })
        .collect();
    Arc::new(Schema::new_with_metadata(fields, schema.metadata().clone()))
}

fn expr_name(e: &Expr) -> String {
    match e {
        Expr::Identifier(id) => statement::normalize_ident(id),
        Expr::CompoundIdentifier(ids) => ids
            .last()
            .map(statement::normalize_ident)
            .unwrap_or_default(),
        Expr::Function(f) => f
            .name
            .0
            .last()
            .and_then(|p| p.as_ident())
            .map(statement::normalize_ident)
            .unwrap_or_else(|| "?column?".into()),
        // the int4 cast Sluice puts around integer literals (system::rewrite)
        Expr::Cast {
            expr,
            data_type: sqlparser::ast::DataType::Int4(None),
            ..
        } if !matches!(
            expr.as_ref(),
            Expr::Identifier(_) | Expr::CompoundIdentifier(_) | Expr::Function(_)
        ) =>
        {
            "?column?".into()
        }
        Expr::Cast {
            expr, data_type, ..
        } => match expr.as_ref() {
            Expr::Identifier(_)
            | Expr::CompoundIdentifier(_)
            | Expr::Function(_)
            | Expr::Cast { .. } => expr_name(expr),
            _ => ColumnType::parse(&data_type.to_string())
                .map(|t| ColumnType::typname(&t).to_string())
                .unwrap_or_else(|_| data_type.to_string().to_lowercase()),
        },
        Expr::Nested(inner) => expr_name(inner),
        // a subscript is named after what it subscripts (`tags[1]` → tags)
        Expr::CompoundFieldAccess { root, .. } => expr_name(root),
        // a scalar subquery is named after its one column
        Expr::Subquery(q) => match q.body.as_ref() {
            SetExpr::Select(s) => match s.projection.as_slice() {
                [SelectItem::UnnamedExpr(e)] => expr_name(e),
                [SelectItem::ExprWithAlias { alias, .. }] => statement::normalize_ident(alias),
                _ => "?column?".into(),
            },
            _ => "?column?".into(),
        },
        Expr::Case { .. } => "case".into(),
        Expr::Exists { .. } => "exists".into(),
        Expr::Array(_) => "array".into(),
        _ => "?column?".into(),
    }
}

/// DataFusion requires distinct output names; PostgreSQL does not
/// (`SELECT 1, 1`, `SELECT a, b AS a`, `SELECT a AS x, b AS x`). Give every
/// unnamed non-column expression of the top SELECT a private alias, and every
/// later column or alias whose name an earlier one has (a name an ORDER BY may
/// use keeps its first holder); [`pg_column_names`] restores the PostgreSQL
/// names afterwards.
pub(super) fn with_unique_names(stmt: &Statement) -> Statement {
    let mut stmt = stmt.clone();
    if let Statement::Query(q) = &mut stmt {
        if let SetExpr::Select(select) = q.body.as_mut() {
            let wildcard = select.projection.iter().any(|p| {
                matches!(
                    p,
                    SelectItem::Wildcard(_) | SelectItem::QualifiedWildcard(..)
                )
            });
            if wildcard {
                return stmt;
            }
            let mut seen = std::collections::HashSet::new();
            for (i, item) in select.projection.iter_mut().enumerate() {
                let private = sqlparser::ast::Ident::new(format!("__sluice_col_{i}"));
                match item {
                    SelectItem::UnnamedExpr(
                        e @ (Expr::Identifier(_) | Expr::CompoundIdentifier(_)),
                    ) if !seen.insert(expr_name(e)) => {
                        *item = SelectItem::ExprWithAlias {
                            expr: e.clone(),
                            alias: private,
                        };
                    }
                    SelectItem::UnnamedExpr(Expr::Identifier(_) | Expr::CompoundIdentifier(_)) => {}
                    SelectItem::UnnamedExpr(e) => {
                        *item = SelectItem::ExprWithAlias {
                            expr: e.clone(),
                            alias: private,
                        };
                    }
                    SelectItem::ExprWithAlias { alias, .. }
                        if !seen.insert(statement::normalize_ident(alias)) =>
                    {
                        *alias = private;
                    }
                    _ => {}
                }
            }
        }
    }
    stmt
}

/// `name` as a quoted SQL identifier.
pub(super) fn quote(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}
