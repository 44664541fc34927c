//! Small questions about sqlparser's AST that statement classification, INSERT building
//! and the SQL rewrites in `system/` all ask. This module imports none of them, so each
//! can use it without an import circle.

use std::ops::ControlFlow;

use datafusion::sql::sqlparser::ast::{Expr, Ident, Visit, Visitor};

/// PostgreSQL folds unquoted identifiers to lower case.
pub fn normalize_ident(id: &Ident) -> String {
    if id.quote_style.is_some() {
        id.value.clone()
    } else {
        id.value.to_lowercase()
    }
}

/// Whether `expr` holds a subquery anywhere.
pub fn has_subquery(expr: &Expr) -> bool {
    any_expr(expr, is_subquery)
}

pub(crate) fn is_subquery(e: &Expr) -> bool {
    matches!(
        e,
        Expr::Subquery(_) | Expr::Exists { .. } | Expr::InSubquery { .. }
    )
}

/// Whether `expr` or any expression inside it satisfies `found`.
pub(crate) fn any_expr(expr: &Expr, found: impl Fn(&Expr) -> bool) -> bool {
    struct Find<F>(F);
    impl<F: Fn(&Expr) -> bool> Visitor for Find<F> {
        type Break = ();
        fn pre_visit_expr(&mut self, e: &Expr) -> ControlFlow<()> {
            if (self.0)(e) {
                ControlFlow::Break(())
            } else {
                ControlFlow::Continue(())
            }
        }
    }
    expr.visit(&mut Find(found)).is_break()
}
