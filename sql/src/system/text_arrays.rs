//! Text meeting an array in a plan, read as PostgreSQL reads an untyped literal: by the
//! array's input function. DataFusion casts text to a list by wrapping it (`'{a,b}'` would
//! become the one-element list `{"{a,b}"}`) and cannot compare a list with text at all.
//!
//! [`TextArrays`] (an analyzer rule, run before type coercion) therefore rewrites
//! - a cast of a string literal to a list type — what an INSERT's or UPDATE's planning
//!   puts over `'{a,b}'` for an array column — into the parsed list literal;
//! - a comparison of a list with a string literal (`tags = '{a,b}'`) into one with the
//!   literal parsed as the list's type;
//! - `a @> b` / `a <@ b` of lists into `array_has_all` (DataFusion has no physical
//!   operator for them);
//! - a cast of any other text expression to a list (`INSERT ... SELECT '{a,b}'`,
//!   `lower(x)::text[]`) into [`ArrayIn`], which parses each value when the plan runs.
//!
//! Invariant: no text reaches a list type as a wrapped one-element list.

use std::sync::Arc;

use arrow::array::{new_empty_array, Array, AsArray};
use arrow::datatypes::DataType;
use datafusion::common::tree_node::{Transformed, TreeNode};
use datafusion::common::{DFSchema, ScalarValue};
use datafusion::config::ConfigOptions;
use datafusion::error::{DataFusionError, Result as DFResult};
use datafusion::functions_nested::expr_fn::array_has_all;
use datafusion::logical_expr::expr::ScalarFunction;
use datafusion::logical_expr::{
    BinaryExpr, Cast, ColumnarValue, Expr as LExpr, ExprSchemable, LogicalPlan, Operator,
    ScalarFunctionArgs, ScalarUDF, ScalarUDFImpl, Signature, TryCast, Volatility,
};
use datafusion::optimizer::AnalyzerRule;

use crate::types::ColumnType;

/// See the module documentation.
#[derive(Debug, Default)]
pub struct TextArrays;

impl AnalyzerRule for TextArrays {
    fn name(&self) -> &str {
        "sluice_text_arrays"
    }

    fn analyze(&self, plan: LogicalPlan, _: &ConfigOptions) -> DFResult<LogicalPlan> {
        plan.transform_up_with_subqueries(|plan| {
            let mut schema = DFSchema::empty();
            for input in plan.inputs() {
                schema.merge(input.schema());
            }
            let schema = Arc::new(schema);
            plan.map_expressions(|e| e.transform_up(|e| rewrite(e, &schema)))
        })
        .map(|t| t.data)
    }
}

fn rewrite(e: LExpr, schema: &DFSchema) -> DFResult<Transformed<LExpr>> {
    match e {
        LExpr::Cast(Cast { expr, field }) if is_list(field.data_type()) => {
            text_as_list(expr, &field.data_type().clone(), schema, |expr| {
                LExpr::Cast(Cast::new_from_field(expr, field.clone()))
            })
        }
        LExpr::TryCast(TryCast { expr, field }) if is_list(field.data_type()) => {
            text_as_list(expr, &field.data_type().clone(), schema, |expr| {
                LExpr::TryCast(TryCast::new_from_field(expr, field.clone()))
            })
        }
        LExpr::BinaryExpr(b) if is_comparison(b.op) => {
            let lt = b.left.get_type(schema).ok();
            let rt = b.right.get_type(schema).ok();
            let (left, right) = (b.left, b.right);
            let (left, right, changed) = match (&lt, &rt) {
                (Some(l), _) if is_list(l) && text_literal(&right).is_some() => {
                    (left, Box::new(parsed(&right, l)?), true)
                }
                (_, Some(r)) if is_list(r) && text_literal(&left).is_some() => {
                    (Box::new(parsed(&left, r)?), right, true)
                }
                _ => (left, right, false),
            };
            let lists = lt.as_ref().is_some_and(is_list) || rt.as_ref().is_some_and(is_list);
            // DataFusion plans `@>`/`<@` of lists but has no physical operator for them
            let e = match b.op {
                Operator::AtArrow if lists => array_has_all(*left, *right),
                Operator::ArrowAt if lists => array_has_all(*right, *left),
                op => {
                    let e = LExpr::BinaryExpr(BinaryExpr { left, op, right });
                    return Ok(if changed {
                        Transformed::yes(e)
                    } else {
                        Transformed::no(e)
                    });
                }
            };
            Ok(Transformed::yes(e))
        }
        other => Ok(Transformed::no(other)),
    }
}

/// `expr` cast to the list type `to`: a string literal parsed now, other text parsed as
/// the plan runs; any other expression left to `rebuild` (DataFusion casts lists to lists
/// element-wise).
fn text_as_list(
    expr: Box<LExpr>,
    to: &DataType,
    schema: &DFSchema,
    rebuild: impl Fn(Box<LExpr>) -> LExpr,
) -> DFResult<Transformed<LExpr>> {
    if text_literal(&expr).is_some() {
        return Ok(Transformed::yes(parsed(&expr, to)?));
    }
    let from = expr.get_type(schema).ok();
    let text = matches!(
        from,
        Some(DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View)
    );
    match ColumnType::of_arrow(to) {
        Some(ty) if text => {
            let udf = ScalarUDF::new_from_impl(ArrayIn::new(ty, to.clone()));
            Ok(Transformed::yes(LExpr::ScalarFunction(
                ScalarFunction::new_udf(Arc::new(udf), vec![*expr]),
            )))
        }
        _ => Ok(Transformed::no(rebuild(expr))),
    }
}

fn is_list(t: &DataType) -> bool {
    matches!(t, DataType::List(_))
}

fn is_comparison(op: Operator) -> bool {
    matches!(
        op,
        Operator::Eq
            | Operator::NotEq
            | Operator::Lt
            | Operator::LtEq
            | Operator::Gt
            | Operator::GtEq
            | Operator::IsDistinctFrom
            | Operator::IsNotDistinctFrom
            | Operator::AtArrow
            | Operator::ArrowAt
    )
}

fn text_literal(e: &LExpr) -> Option<&str> {
    match e {
        LExpr::Literal(
            ScalarValue::Utf8(Some(s))
            | ScalarValue::LargeUtf8(Some(s))
            | ScalarValue::Utf8View(Some(s)),
            _,
        ) => Some(s),
        _ => None,
    }
}

/// The string literal `e` read as a value of the list type `to`.
fn parsed(e: &LExpr, to: &DataType) -> DFResult<LExpr> {
    let (Some(text), Some(ty)) = (text_literal(e), ColumnType::of_arrow(to)) else {
        return Err(DataFusionError::Internal(format!(
            "{e} is not text for {to}"
        )));
    };
    let value = ty.parse_text(text).map_err(external)?;
    let value = if value.data_type() == *to {
        value
    } else {
        value.cast_to(to)?
    };
    Ok(LExpr::Literal(value, None))
}

fn external(e: crate::error::Error) -> DataFusionError {
    DataFusionError::External(Box::new(e))
}

/// `text::T[]` for text known only when the plan runs: PostgreSQL's `array_in`, each
/// value read by [`ColumnType::parse_text`] (NULL stays NULL).
#[derive(Debug, PartialEq, Eq, Hash)]
struct ArrayIn {
    ty: ColumnType,
    to: DataType,
    signature: Signature,
}

impl ArrayIn {
    fn new(ty: ColumnType, to: DataType) -> ArrayIn {
        ArrayIn {
            ty,
            to,
            signature: Signature::any(1, Volatility::Immutable),
        }
    }
}

impl ScalarUDFImpl for ArrayIn {
    fn name(&self) -> &str {
        "array_in"
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, _: &[DataType]) -> DFResult<DataType> {
        Ok(self.to.clone())
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> DFResult<ColumnarValue> {
        let [arg] = args.args.as_slice() else {
            return Err(DataFusionError::Internal(
                "array_in takes one argument".into(),
            ));
        };
        let input = arg.to_array(args.number_rows)?;
        let text = arrow::compute::cast(&input, &DataType::Utf8)?;
        let values = text
            .as_string::<i32>()
            .iter()
            .map(|s| match s {
                None => ScalarValue::try_from(&self.to),
                Some(s) => {
                    let v = self.ty.parse_text(s).map_err(external)?;
                    if v.data_type() == self.to {
                        Ok(v)
                    } else {
                        v.cast_to(&self.to)
                    }
                }
            })
            .collect::<DFResult<Vec<_>>>()?;
        let out = if values.is_empty() {
            new_empty_array(&self.to)
        } else {
            ScalarValue::iter_to_array(values)?
        };
        debug_assert_eq!(out.len(), text.len());
        Ok(ColumnarValue::Array(out))
    }
}
