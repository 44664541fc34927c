//! The filters a scan recognises, shared by the stream provider
//! ([`crate::stream_provider`]: `offset`/`ts` ranges skip frames) and the table
//! provider ([`crate::table::provider`]: equality on the whole primary key
//! reads one row). Recognising a filter never changes a result: both push
//! it down as inexact, so DataFusion checks it again.

use datafusion::logical_expr::{Expr, Operator, TableProviderFilterPushDown};
use datafusion::scalar::ScalarValue;

/// A provider's answer to `supports_filters_pushdown`: inexact for each
/// filter its scan `recognises`, unsupported for the others.
pub(crate) fn inexact_where(
    filters: &[&Expr],
    recognises: impl Fn(&Expr) -> bool,
) -> Vec<TableProviderFilterPushDown> {
    filters
        .iter()
        .map(|f| {
            if recognises(f) {
                TableProviderFilterPushDown::Inexact
            } else {
                TableProviderFilterPushDown::Unsupported
            }
        })
        .collect()
}

/// `col op literal` or `literal op col`, normalized to `col op literal`.
pub(crate) fn column_cmp(
    left: &Expr,
    op: Operator,
    right: &Expr,
) -> Option<(String, Operator, ScalarValue)> {
    let strip = |e: &Expr| -> Option<ScalarValue> {
        match e {
            Expr::Literal(v, _) => Some(v.clone()),
            Expr::Cast(c) => match c.expr.as_ref() {
                Expr::Literal(v, _) => v.cast_to(c.field.data_type()).ok(),
                _ => None,
            },
            _ => None,
        }
    };
    match (left, right) {
        (Expr::Column(c), r) => strip(r).map(|v| (c.name.clone(), op, v)),
        (l, Expr::Column(c)) => strip(l).and_then(|v| Some((c.name.clone(), op.swap()?, v))),
        _ => None,
    }
}
