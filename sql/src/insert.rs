//! The append path: turning INSERT rows into an Arrow batch ready to be
//! proposed, and computing RETURNING from the committed offsets.
//!
//! `INSERT ... VALUES` whose values are literals, parameters and casts of
//! them (what drivers send) is evaluated here directly: no query planning
//! on the hot path. A VALUES expression that reads no relation (a function
//! call, arithmetic, a cast of an expression: `repeat('x', 10)`, `now()`,
//! `$1 * 2`) is evaluated alone by [`eval_expression`]: DataFusion's
//! analyzer and simplifier on that expression, then its physical form on one
//! row, with no statement planning. Anything else (`INSERT ... SELECT`,
//! subqueries) is planned by DataFusion and its rows validated the same way.
//! Either way a batch leaving this module satisfies the stream's column
//! types, NOT NULL and the row-size limit.

use std::sync::Arc;

use arrow::array::{new_null_array, ArrayRef, RecordBatch, RecordBatchOptions};
use datafusion::common::tree_node::{Transformed, TreeNode};
use datafusion::common::DFSchema;
use datafusion::execution::SessionState;
use datafusion::logical_expr::simplify::SimplifyContext;
use datafusion::logical_expr::{lit, ColumnarValue, LogicalPlan, LogicalPlanBuilder};
use datafusion::optimizer::simplify_expressions::ExprSimplifier;
use datafusion::scalar::ScalarValue;
use datafusion::sql::sqlparser;
use sqlparser::ast::{Expr, UnaryOperator, Value};

pub use crate::ast::has_subquery;
use crate::ast::{any_expr, is_subquery};
use crate::catalog::Stream;
use crate::error::{sqlstate, Error, Result};
use crate::param_type::ParamType;
use crate::types::ColumnType;

/// An INSERT's row of `values` for its `targets` columns must match them
/// one to one (42601 otherwise).
pub fn check_arity(values: usize, targets: usize) -> Result<()> {
    match values.cmp(&targets) {
        std::cmp::Ordering::Equal => Ok(()),
        std::cmp::Ordering::Greater => Err(Error::syntax(
            "INSERT has more expressions than target columns",
        )),
        std::cmp::Ordering::Less => Err(Error::syntax(
            "INSERT has more target columns than expressions",
        )),
    }
}

/// Evaluate a VALUES expression without a planner, or `None` if it needs one.
pub fn eval_simple(
    expr: &Expr,
    target: ColumnType,
    params: &[ScalarValue],
) -> Option<Result<ScalarValue>> {
    match expr {
        Expr::Nested(e) => eval_simple(e, target, params),
        Expr::Value(v) => Some(match &v.value {
            Value::Null => Ok(ScalarValue::Null),
            Value::Boolean(b) => Ok(ScalarValue::Boolean(Some(*b))),
            Value::Number(n, _) => number(n, target),
            Value::SingleQuotedString(s)
            | Value::EscapedStringLiteral(s)
            | Value::DollarQuotedString(sqlparser::ast::DollarQuotedString { value: s, .. }) => {
                target.parse_text(s)
            }
            Value::Placeholder(p) => param(p, params),
            _ => return None,
        }),
        Expr::UnaryOp {
            op: UnaryOperator::Minus,
            expr,
        } => match expr.as_ref() {
            Expr::Value(v) => match &v.value {
                Value::Number(n, _) => Some(number(&format!("-{n}"), target)),
                _ => None,
            },
            _ => None,
        },
        Expr::Cast {
            expr, data_type, ..
        } => {
            let ty = ColumnType::parse(&data_type.to_string()).ok()?;
            let inner = eval_simple(expr, ty, params)?;
            Some(inner.and_then(|v| ty.coerce(v)))
        }
        Expr::TypedString(ts) => {
            let ty = ColumnType::parse(&ts.data_type.to_string()).ok()?;
            match &ts.value.value {
                Value::SingleQuotedString(s) => Some(ty.parse_text(s)),
                _ => None,
            }
        }
        _ => None,
    }
}

fn number(n: &str, target: ColumnType) -> Result<ScalarValue> {
    match target {
        ColumnType::Bool => Err(Error::new(
            sqlstate::DATATYPE_MISMATCH,
            "column is of type boolean but expression is of type integer",
        )),
        ColumnType::Bytea
        | ColumnType::Timestamptz
        | ColumnType::Timestamp
        | ColumnType::Date
        | ColumnType::Uuid
        | ColumnType::Array(_) => Err(Error::new(
            sqlstate::DATATYPE_MISMATCH,
            format!(
                "column is of type {} but expression is of type {}",
                target.sql_name(),
                number_type(n)
            ),
        )),
        _ => target.parse_text(n),
    }
}

/// The type PostgreSQL gives a numeric literal: integer, bigint, or numeric.
fn number_type(n: &str) -> &'static str {
    match n.trim_start_matches('-').parse::<i64>() {
        Ok(v) if i32::try_from(v).is_ok() => "integer",
        Ok(_) => "bigint",
        Err(_) => "numeric",
    }
}

fn param(p: &str, params: &[ScalarValue]) -> Result<ScalarValue> {
    let n = param_number(p)?;
    params.get(n.wrapping_sub(1)).cloned().ok_or_else(|| {
        Error::new(
            sqlstate::PROTOCOL_VIOLATION,
            format!("there is no parameter ${n}"),
        )
    })
}

/// The `n` of a placeholder `$n`.
pub(crate) fn param_number(p: &str) -> Result<usize> {
    p.trim_start_matches('$')
        .parse()
        .map_err(|_| Error::syntax(format!("invalid parameter {p}")))
}

/// Evaluates a VALUES expression that reads no relation, per row as PostgreSQL does (so a
/// volatile function such as `random()` or `gen_random_uuid()` is called for each row), or
/// `None` if it needs the planner: a subquery or a column reference, or anything this path
/// cannot convert or type — the planned path then reports the error the statement deserves.
/// What it runs is what planning would: the session's analyzer rules (type coercion,
/// [`crate::arithmetic`]'s checked operations) and the simplifier (`now()` is `start`, the
/// statement's start time), without the INSERT plan, the optimizer or an execution. The value is cast to
/// the column's Arrow type as the planned INSERT's type coercion casts it.
pub fn eval_expression(
    state: &SessionState,
    expr: &Expr,
    target: ColumnType,
    start: chrono::DateTime<chrono::Utc>,
    params: &[ScalarValue],
) -> Option<Result<ScalarValue>> {
    eval_constant(state, expr, Some(target.arrow_type()), start, params)
}

/// [`eval_expression`] without a column: the value of an expression that reads no relation,
/// cast to `cast` when given; `None` when it needs the planner.
pub fn eval_constant(
    state: &SessionState,
    expr: &Expr,
    cast: Option<arrow::datatypes::DataType>,
    start: chrono::DateTime<chrono::Utc>,
    params: &[ScalarValue],
) -> Option<Result<ScalarValue>> {
    if reads_relations(expr) {
        return None;
    }
    let schema = DFSchema::empty();
    let sql = sqlparser::ast::ExprWithAlias {
        expr: expr.clone(),
        alias: None,
    };
    let logical = state.create_logical_expr_from_sql_expr(sql, &schema).ok()?;
    let logical = logical
        .transform_up(|e| match e {
            datafusion::logical_expr::Expr::Placeholder(p) => param(&p.id, params)
                .map(|v| Transformed::yes(lit(v)))
                .map_err(|e| datafusion::error::DataFusionError::External(Box::new(e))),
            other => Ok(Transformed::no(other)),
        })
        .ok()?
        .data;
    let projected = match cast {
        Some(ty) => datafusion::logical_expr::cast(logical, ty),
        None => logical,
    };
    let analyzed = analyze(state, projected, &schema)?;
    let context = SimplifyContext::builder()
        .with_schema(Arc::new(schema.clone()))
        .with_config_options(Arc::clone(state.config_options()))
        .with_query_execution_start_time(Some(start))
        .build();
    let simplified = match ExprSimplifier::new(context).simplify(analyzed) {
        Ok(e) => e,
        Err(e) => return Some(Err(e.into())),
    };
    let physical = state.create_physical_expr(simplified, &schema).ok()?;
    let one_row = RecordBatch::try_new_with_options(
        Arc::new(arrow::datatypes::Schema::empty()),
        vec![],
        &RecordBatchOptions::new().with_row_count(Some(1)),
    )
    .ok()?;
    Some(match physical.evaluate(&one_row) {
        Ok(ColumnarValue::Scalar(v)) => Ok(v),
        Ok(ColumnarValue::Array(a)) => ScalarValue::try_from_array(&a, 0).map_err(Into::into),
        Err(e) => Err(e.into()),
    })
}

/// `expr` after the session's analyzer rules (type coercion, [`crate::arithmetic`]'s checked
/// operations), as a projection over one row of `schema`'s columns; `None` if it does not
/// analyze (the planned path then reports why).
pub(crate) fn analyze(
    state: &SessionState,
    expr: datafusion::logical_expr::Expr,
    schema: &DFSchema,
) -> Option<datafusion::logical_expr::Expr> {
    let relation = LogicalPlan::EmptyRelation(datafusion::logical_expr::EmptyRelation {
        produce_one_row: true,
        schema: Arc::new(schema.clone()),
    });
    let plan = LogicalPlanBuilder::from(relation)
        .project(vec![expr])
        .and_then(|b| b.build())
        .ok()?;
    let plan = state
        .analyzer()
        .execute_and_check(plan, state.config_options(), |_, _| {})
        .ok()?;
    let LogicalPlan::Projection(projection) = plan else {
        return None;
    };
    projection.expr.into_iter().next()
}

/// VALUES rows with a subquery in them, as `SELECT row UNION ALL SELECT row ...`: DataFusion
/// cannot run a scalar subquery inside VALUES ("ScalarSubqueryExpr evaluated before the
/// subquery was executed"), but plans it in a projection. Other sources are left as they are.
pub fn values_with_subqueries_as_selects(query: &mut sqlparser::ast::Query) -> Result<()> {
    let sqlparser::ast::SetExpr::Values(values) = query.body.as_ref() else {
        return Ok(());
    };
    let has_subquery = values
        .rows
        .iter()
        .flat_map(|r| &r.content)
        .any(|e| any_expr(e, is_subquery));
    if !has_subquery {
        return Ok(());
    }
    let selects: Vec<String> = values
        .rows
        .iter()
        .map(|row| {
            let items: Vec<String> = row.content.iter().map(|e| e.to_string()).collect();
            format!("SELECT {}", items.join(", "))
        })
        .collect();
    let sql = selects.join(" UNION ALL ");
    let parsed =
        sqlparser::parser::Parser::parse_sql(&sqlparser::dialect::PostgreSqlDialect {}, &sql)
            .map_err(|e| Error::syntax(format!("syntax error: {e}")))?;
    match parsed.into_iter().next() {
        Some(sqlparser::ast::Statement::Query(q)) => {
            query.body = q.body;
            Ok(())
        }
        _ => Err(Error::internal("VALUES rows did not read back as a query")),
    }
}

/// Whether a VALUES expression reads a relation: a subquery, or a name (a column).
pub(crate) fn reads_relations(expr: &Expr) -> bool {
    any_expr(expr, |e| {
        is_subquery(e) || matches!(e, Expr::Identifier(_) | Expr::CompoundIdentifier(_))
    })
}

/// The declared type of each `$n` in VALUES rows, from the target columns.
pub fn infer_param_types(
    rows: &[&Vec<Expr>],
    targets: &[ColumnType],
    out: &mut Vec<Option<ParamType>>,
) {
    fn visit(e: &Expr, ty: ColumnType, out: &mut Vec<Option<ParamType>>) {
        match e {
            Expr::Value(v) => {
                if let Value::Placeholder(p) = &v.value {
                    if let Ok(i) = p.trim_start_matches('$').parse::<usize>() {
                        if i >= 1 {
                            if out.len() < i {
                                out.resize(i, None);
                            }
                            if out[i - 1].is_none() {
                                out[i - 1] = Some(ParamType::of_type(ty));
                            }
                        }
                    }
                }
            }
            Expr::Nested(inner) => visit(inner, ty, out),
            Expr::Cast {
                expr, data_type, ..
            } => {
                let t = ColumnType::parse(&data_type.to_string()).unwrap_or(ty);
                visit(expr, t, out)
            }
            _ => {}
        }
    }
    for row in rows {
        for (e, ty) in row.iter().zip(targets) {
            visit(e, *ty, out);
        }
    }
}

/// Build a batch of the stream's user columns from rows of values, one
/// value per target column; columns not targeted take their default (or NULL).
pub fn build_batch(
    stream: &Stream,
    targets: &[usize],
    rows: Vec<Vec<ScalarValue>>,
    max_row_bytes: usize,
) -> Result<RecordBatch> {
    if let [row] = rows.as_slice() {
        return build_row(stream, targets, row, max_row_bytes);
    }
    let schema = stream.user_schema.clone();
    let n = rows.len();
    let mut per_col: Vec<Option<Vec<ScalarValue>>> = vec![None; schema.fields().len()];
    for &t in targets {
        per_col[t] = Some(Vec::with_capacity(n));
    }
    for row in rows {
        let mut row_bytes = 0usize;
        for (v, &t) in row.into_iter().zip(targets) {
            row_bytes += v.size();
            if let Some(col) = per_col[t].as_mut() {
                col.push(v);
            }
        }
        if row_bytes > max_row_bytes {
            return Err(row_too_big(row_bytes, max_row_bytes));
        }
    }
    let mut arrays: Vec<ArrayRef> = Vec::with_capacity(per_col.len());
    for (i, col) in per_col.into_iter().enumerate() {
        let field = schema.field(i);
        let array = match col {
            Some(values) => {
                if values.is_empty() {
                    new_null_array(field.data_type(), 0)
                } else {
                    ScalarValue::iter_to_array(values)?
                }
            }
            None => stream.missing_column(i, n)?,
        };
        arrays.push(array);
    }
    check_not_null(stream, &arrays)?;
    RecordBatch::try_new(schema, arrays).map_err(Error::from)
}

/// [`build_batch`] of one row (the usual INSERT): each value straight to its one-row array,
/// the columns it leaves out shared from the stream (see [`Stream::missing_column`]).
fn build_row(
    stream: &Stream,
    targets: &[usize],
    row: &[ScalarValue],
    max_row_bytes: usize,
) -> Result<RecordBatch> {
    let row_bytes: usize = row.iter().map(ScalarValue::size).sum();
    if row_bytes > max_row_bytes {
        return Err(row_too_big(row_bytes, max_row_bytes));
    }
    let width = stream.user_schema.fields().len();
    let mut arrays: Vec<ArrayRef> = Vec::with_capacity(width);
    for i in 0..width {
        let array = match targets.iter().position(|&t| t == i) {
            Some(j) => row[j].to_array()?,
            None => stream.missing_column(i, 1)?,
        };
        arrays.push(array);
    }
    check_not_null(stream, &arrays)?;
    RecordBatch::try_new(stream.user_schema.clone(), arrays).map_err(Error::from)
}

pub(crate) fn row_too_big(size: usize, max: usize) -> Error {
    Error::new(
        sqlstate::PROGRAM_LIMIT_EXCEEDED,
        format!("row of {size} bytes exceeds the maximum row size of {max} bytes (max_row_bytes)"),
    )
}

/// NOT NULL, checked on the arrays before they become a batch (Arrow
/// would reject them with a less useful message).
pub fn check_not_null(stream: &Stream, columns: &[ArrayRef]) -> Result<()> {
    for (i, c) in stream.def.columns.iter().enumerate() {
        if c.not_null && columns.get(i).map(|a| a.null_count() > 0).unwrap_or(false) {
            return Err(Error::new(
                sqlstate::NOT_NULL_VIOLATION,
                format!(
                    "null value in column \"{}\" of relation \"{}\" violates not-null constraint",
                    c.name,
                    stream.name()
                ),
            ));
        }
    }
    Ok(())
}

/// Turn a batch produced by DataFusion (full schema, system columns null)
/// into a validated batch of user columns.
pub fn from_planned(
    stream: &Stream,
    batch: &RecordBatch,
    max_row_bytes: usize,
) -> Result<RecordBatch> {
    let mut arrays = Vec::with_capacity(stream.def.columns.len());
    for (i, c) in stream.def.columns.iter().enumerate() {
        let col = batch.column(i + 2);
        let want = c.ty.arrow_type();
        // text for an array column is read by the array input, not Arrow's cast (which
        // would make '{a,b}' a one-element list)
        let col = if col.data_type() != &want && c.ty.element().is_none() {
            arrow::compute::cast(col, &want)?
        } else {
            col.clone()
        };
        arrays.push(c.ty.validate_array(&col)?);
    }
    check_not_null(stream, &arrays)?;
    let out = RecordBatch::try_new(stream.user_schema.clone(), arrays)?;
    if out.num_rows() > 0 {
        let per_row = out.get_array_memory_size() / out.num_rows();
        if per_row > max_row_bytes {
            return Err(row_too_big(per_row, max_row_bytes));
        }
    }
    Ok(out)
}

/// Concatenate batches of the same schema.
pub fn concat(stream: &Stream, batches: &[RecordBatch]) -> Result<RecordBatch> {
    Ok(arrow::compute::concat_batches(
        &stream.user_schema,
        batches,
    )?)
}

pub fn user_schema_arc(stream: &Arc<Stream>) -> arrow::datatypes::SchemaRef {
    stream.user_schema.clone()
}
