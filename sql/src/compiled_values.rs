//! VALUES expressions compiled once per session and evaluated per row.
//!
//! A VALUES expression that reads no relation (`repeat('x', 1000)`,
//! `$1 * 2`, `now()`, `gen_random_uuid()`) would otherwise go through
//! DataFusion's SQL-to-expression translation, its analyzer (type coercion,
//! [`crate::arithmetic`]'s checked operations), the simplifier and physical
//! planning on every row of every execution ([`crate::insert::eval_expression`]).
//! Here that work is done once per (expression text, target type, parameter
//! count): parameters become columns of a one-row input batch, and so do the
//! functions whose value is the statement's start time (`now()`,
//! `current_date`, `current_time`), so the cached physical expression is
//! evaluated per row against that row's parameters and start time. Volatile
//! functions (`random()`, `gen_random_uuid()`) stay in the expression and are
//! called for each row, as PostgreSQL does.
//!
//! Invariants:
//! - A compiled expression yields what [`crate::insert::eval_expression`] yields
//!   for the same parameters and start time; whatever it cannot compile is
//!   remembered as such and evaluated by that function instead.
//! - Only immutable parts are folded at compile time: an expression calling a
//!   stable function other than the start-time ones (`current_setting()`,
//!   `txid_current()`: one value per statement) is not compiled.
//! - A compiled expression is used only for parameters of the types it was
//!   compiled for; other types compile it again.
//! - The cache holds at most [`MAX_ENTRIES`] expressions of at most
//!   [`MAX_TEXT_BYTES`] bytes of text each (longer ones are not cached); when it
//!   is full it starts over. The session empties it when a setting changes.

use std::collections::HashMap;
use std::sync::Arc;

use arrow::array::{ArrayRef, RecordBatch, RecordBatchOptions};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion::common::tree_node::{Transformed, TreeNode};
use datafusion::common::{Column, DFSchema};
use datafusion::execution::SessionState;
use datafusion::logical_expr::simplify::{ExprSimplifyResult, SimplifyContext};
use datafusion::logical_expr::{Expr as LogicalExpr, ExprSchemable, Volatility};
use datafusion::optimizer::simplify_expressions::ExprSimplifier;
use datafusion::physical_plan::{ColumnarValue, PhysicalExpr};
use datafusion::scalar::ScalarValue;
use datafusion::sql::sqlparser::ast::{Expr, ExprWithAlias};

use crate::error::{Error, Result};
use crate::insert;
use crate::types::ColumnType;

/// Expressions kept per session.
pub const MAX_ENTRIES: usize = 256;
/// Expressions with longer text are evaluated without caching.
pub const MAX_TEXT_BYTES: usize = 4096;

/// Functions whose value is the statement's start time: columns of the
/// input batch, their values computed per statement by their own simplify.
const START_TIME_FUNCTIONS: [&str; 3] = ["now", "current_date", "current_time"];

/// What an expression was compiled for besides the expression itself.
#[derive(Debug, Clone, PartialEq, Eq)]
struct For {
    target: DataType,
    params: usize,
}

enum Entry {
    Compiled(Arc<Compiled>),
    /// Evaluated by [`insert::eval_expression`] each time.
    NotCompiled,
}

/// A session's compiled VALUES expressions, by expression (sqlparser's `Expr` compares and
/// hashes by meaning, not by position in the text: a lookup costs a hash of the tree, not
/// its text), then by what they were compiled for.
#[derive(Default)]
pub struct ValuesCache {
    entries: HashMap<Expr, Vec<(For, Entry)>>,
    /// Entries over all expressions.
    len: usize,
    compilations: u64,
}

impl ValuesCache {
    /// The value of `expr` for a column of type `target`, evaluated as
    /// [`insert::eval_expression`] does, from a compiled form when it has
    /// one; `None` when the expression needs the planner.
    pub fn value(
        &mut self,
        state: &SessionState,
        expr: &Expr,
        target: ColumnType,
        start: chrono::DateTime<chrono::Utc>,
        params: &[ScalarValue],
    ) -> Option<Result<ScalarValue>> {
        let key = For {
            target: target.arrow_type(),
            params: params.len(),
        };
        let found = self
            .entries
            .get(expr)
            .and_then(|slots| slots.iter().find(|(k, _)| *k == key));
        match found {
            Some((_, Entry::Compiled(c))) if c.accepts(params) => {
                return Some(c.evaluate(state, start, params))
            }
            Some((_, Entry::NotCompiled)) => {
                return insert::eval_expression(state, expr, target, start, params)
            }
            _ => {}
        }
        if expr.to_string().len() > MAX_TEXT_BYTES {
            return insert::eval_expression(state, expr, target, start, params);
        }
        self.compilations += 1;
        let entry = match Compiled::new(state, expr, key.target.clone(), params) {
            Some(c) => Entry::Compiled(Arc::new(c)),
            None => Entry::NotCompiled,
        };
        let value = match &entry {
            Entry::Compiled(c) => Some(c.evaluate(state, start, params)),
            Entry::NotCompiled => insert::eval_expression(state, expr, target, start, params),
        };
        if self.len >= MAX_ENTRIES {
            self.clear();
        }
        let slots = self.entries.entry(expr.clone()).or_default();
        // compiled again for other parameter types: the new entry replaces the old
        match slots.iter_mut().find(|(k, _)| *k == key) {
            Some(slot) => slot.1 = entry,
            None => {
                slots.push((key, entry));
                self.len += 1;
            }
        }
        value
    }

    /// Forget every compiled expression (a setting they may depend on changed).
    pub fn clear(&mut self) {
        self.entries.clear();
        self.len = 0;
    }

    /// How many expressions were compiled (or found not compilable) so far.
    pub fn compilations(&self) -> u64 {
        self.compilations
    }
}

/// One expression, ready to evaluate against a row's parameters.
struct Compiled {
    physical: Arc<dyn PhysicalExpr>,
    /// The input batch's schema: the parameters used, then one column per
    /// start-time function.
    schema: SchemaRef,
    /// (index into the parameters, its type), in schema order.
    params: Vec<(usize, DataType)>,
    /// The start-time function calls, in schema order after the parameters.
    start_functions: Vec<LogicalExpr>,
}

impl Compiled {
    /// Compile `expr`, cast to `target`, for parameters of the types of
    /// `params`; `None` where [`insert::eval_expression`] must decide.
    fn new(
        state: &SessionState,
        expr: &Expr,
        target: DataType,
        params: &[ScalarValue],
    ) -> Option<Compiled> {
        if insert::reads_relations(expr) {
            return None;
        }
        let sql = ExprWithAlias {
            expr: expr.clone(),
            alias: None,
        };
        let logical = state
            .create_logical_expr_from_sql_expr(sql, &DFSchema::empty())
            .ok()?;
        let (logical, used) = parameters_as_columns(logical, params)?;
        let param_fields: Vec<Field> = used
            .iter()
            .map(|(i, ty)| Field::new(param_name(*i), ty.clone(), true))
            .collect();
        let schema = DFSchema::try_from(Schema::new(param_fields.clone())).ok()?;
        let cast = datafusion::logical_expr::cast(logical, target);
        let analyzed = insert::analyze(state, cast, &schema)?;
        // a stable function (current_setting(), txid_current()) has one value per statement,
        // which folding it here would keep for every later statement
        if calls_stable_functions(&analyzed)? {
            return None;
        }
        // constant parts folded once; the start-time functions are left as
        // they are (no start time given) and become input columns below
        let context = SimplifyContext::builder()
            .with_schema(Arc::new(schema.clone()))
            .with_config_options(Arc::clone(state.config_options()))
            .build();
        let simplified = ExprSimplifier::new(context).simplify(analyzed).ok()?;
        let (simplified, start_functions, start_fields) =
            start_times_as_columns(simplified, &schema)?;
        let mut fields = param_fields;
        fields.extend(start_fields);
        let input = DFSchema::try_from(Schema::new(fields)).ok()?;
        let physical = state.create_physical_expr(simplified, &input).ok()?;
        Some(Compiled {
            physical,
            schema: Arc::new(input.as_arrow().clone()),
            params: used,
            start_functions,
        })
    }

    /// Whether the bound parameters have the types this was compiled for.
    fn accepts(&self, params: &[ScalarValue]) -> bool {
        self.params
            .iter()
            .all(|(i, ty)| params.get(*i).is_some_and(|v| v.data_type() == *ty))
    }

    fn evaluate(
        &self,
        state: &SessionState,
        start: chrono::DateTime<chrono::Utc>,
        params: &[ScalarValue],
    ) -> Result<ScalarValue> {
        let mut columns: Vec<ArrayRef> = Vec::with_capacity(self.schema.fields().len());
        for (i, _) in &self.params {
            columns.push(params[*i].to_array_of_size(1)?);
        }
        if !self.start_functions.is_empty() {
            let context = SimplifyContext::builder()
                .with_config_options(Arc::clone(state.config_options()))
                .with_query_execution_start_time(Some(start))
                .build();
            for f in &self.start_functions {
                columns.push(start_time_value(f, &context)?.to_array_of_size(1)?);
            }
        }
        let batch = RecordBatch::try_new_with_options(
            self.schema.clone(),
            columns,
            &RecordBatchOptions::new().with_row_count(Some(1)),
        )?;
        match self.physical.evaluate(&batch)? {
            ColumnarValue::Scalar(v) => Ok(v),
            ColumnarValue::Array(a) => Ok(ScalarValue::try_from_array(&a, 0)?),
        }
    }
}

/// `$n` → a column of the input batch named `$n`, typed as the bound value;
/// also returns the parameters used (index, type) in column order. `None`
/// if a placeholder names no bound parameter.
fn parameters_as_columns(
    logical: LogicalExpr,
    params: &[ScalarValue],
) -> Option<(LogicalExpr, Vec<(usize, DataType)>)> {
    let mut used: Vec<(usize, DataType)> = Vec::new();
    let logical = logical
        .transform_up(|e| match e {
            LogicalExpr::Placeholder(p) => {
                let i = insert::param_number(&p.id)
                    .ok()
                    .and_then(|n| n.checked_sub(1))
                    .filter(|&i| i < params.len())
                    .ok_or_else(|| {
                        datafusion::error::DataFusionError::Plan("no such parameter".into())
                    })?;
                if !used.iter().any(|(u, _)| *u == i) {
                    used.push((i, params[i].data_type()));
                }
                Ok(Transformed::yes(column(&param_name(i))))
            }
            other => Ok(Transformed::no(other)),
        })
        .ok()?
        .data;
    Some((logical, used))
}

/// Whether `e` calls a stable function other than the start-time ones.
fn calls_stable_functions(e: &LogicalExpr) -> Option<bool> {
    e.exists(|e| {
        Ok(matches!(e, LogicalExpr::ScalarFunction(f)
            if f.func.signature().volatility == Volatility::Stable
                && !START_TIME_FUNCTIONS.contains(&f.func.name())))
    })
    .ok()
}

/// Each start-time function call → a column `__start_k` of its type; returns
/// the calls and the columns' fields, in order.
fn start_times_as_columns(
    e: LogicalExpr,
    schema: &DFSchema,
) -> Option<(LogicalExpr, Vec<LogicalExpr>, Vec<Field>)> {
    let mut calls = Vec::new();
    let mut fields = Vec::new();
    let e = e
        .transform_up(|e| match &e {
            LogicalExpr::ScalarFunction(f) if START_TIME_FUNCTIONS.contains(&f.func.name()) => {
                let ty = e.get_type(schema)?;
                let name = format!("__start_{}", calls.len());
                fields.push(Field::new(&name, ty, true));
                calls.push(e);
                Ok(Transformed::yes(column(&name)))
            }
            _ => Ok(Transformed::no(e)),
        })
        .ok()?
        .data;
    Some((e, calls, fields))
}

/// The value of a start-time function call, by its own simplification.
fn start_time_value(call: &LogicalExpr, context: &SimplifyContext) -> Result<ScalarValue> {
    let LogicalExpr::ScalarFunction(f) = call else {
        return Err(Error::internal("a start-time column that is not a call"));
    };
    match f.func.simplify(f.args.clone(), context)? {
        ExprSimplifyResult::Simplified(LogicalExpr::Literal(v, _)) => Ok(v),
        _ => Err(Error::internal(format!(
            "{}() did not simplify to the statement's start time",
            f.func.name()
        ))),
    }
}

fn param_name(i: usize) -> String {
    format!("${}", i + 1)
}

fn column(name: &str) -> LogicalExpr {
    LogicalExpr::Column(Column::new_unqualified(name))
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::prelude::SessionContext;
    use datafusion::sql::sqlparser::dialect::PostgreSqlDialect;
    use datafusion::sql::sqlparser::parser::Parser;

    fn expr(sql: &str) -> Expr {
        Parser::new(&PostgreSqlDialect {})
            .try_with_sql(sql)
            .unwrap()
            .parse_expr()
            .unwrap()
    }

    fn at(secs: i64) -> chrono::DateTime<chrono::Utc> {
        chrono::DateTime::from_timestamp(secs, 0).unwrap()
    }

    /// The value of `sql` for a column of type `ty` at start time `secs`; it must have one.
    fn value(
        cache: &mut ValuesCache,
        state: &SessionState,
        sql: &str,
        ty: ColumnType,
        secs: i64,
        params: &[ScalarValue],
    ) -> ScalarValue {
        cache
            .value(state, &expr(sql), ty, at(secs), params)
            .unwrap()
            .unwrap()
    }

    #[test]
    fn compiles_once_and_evaluates_each_rows_parameters() {
        let ctx = SessionContext::new();
        let state = ctx.state();
        let mut cache = ValuesCache::default();
        let e = expr("$1 * 2 + 1");
        for n in [20i64, 5, -3] {
            let v = cache
                .value(
                    &state,
                    &e,
                    ColumnType::Int8,
                    at(0),
                    &[ScalarValue::Int64(Some(n))],
                )
                .unwrap()
                .unwrap();
            assert_eq!(v, ScalarValue::Int64(Some(n * 2 + 1)));
        }
        assert_eq!(cache.compilations(), 1);
        // the same text for parameters of another type compiles again
        let v = cache
            .value(
                &state,
                &e,
                ColumnType::Int8,
                at(0),
                &[ScalarValue::Int32(Some(4))],
            )
            .unwrap()
            .unwrap();
        assert_eq!(v, ScalarValue::Int64(Some(9)));
        assert_eq!(cache.compilations(), 2);
    }

    #[test]
    fn start_time_is_each_statements_not_the_first() {
        let ctx = SessionContext::new();
        let state = ctx.state();
        let mut cache = ValuesCache::default();
        let first = value(
            &mut cache,
            &state,
            "now()",
            ColumnType::Timestamptz,
            1_000,
            &[],
        );
        let second = value(
            &mut cache,
            &state,
            "now()",
            ColumnType::Timestamptz,
            2_000,
            &[],
        );
        assert_eq!(
            first,
            ScalarValue::TimestampMicrosecond(Some(1_000_000_000), Some("UTC".into()))
        );
        assert_eq!(
            second,
            ScalarValue::TimestampMicrosecond(Some(2_000_000_000), Some("UTC".into()))
        );
        assert_eq!(cache.compilations(), 1);
    }

    #[test]
    fn volatile_functions_are_called_per_row() {
        let ctx = SessionContext::new();
        let state = ctx.state();
        let mut cache = ValuesCache::default();
        let values: std::collections::HashSet<String> = (0..20)
            .map(|_| value(&mut cache, &state, "random()", ColumnType::Float8, 0, &[]).to_string())
            .collect();
        assert!(values.len() > 1, "random() was evaluated once: {values:?}");
        assert_eq!(cache.compilations(), 1);
    }

    #[test]
    fn what_it_cannot_compile_is_evaluated_as_before() {
        let ctx = SessionContext::new();
        let state = ctx.state();
        let mut cache = ValuesCache::default();
        // a missing parameter: the planned path reports it
        assert!(cache
            .value(&state, &expr("$2 + 1"), ColumnType::Int8, at(0), &[])
            .is_none());
        // a constant error surfaces as the error, every time
        for _ in 0..2 {
            let r = cache.value(&state, &expr("1 / 0"), ColumnType::Int8, at(0), &[]);
            assert!(matches!(r, Some(Err(_))), "{r:?}");
        }
        assert_eq!(cache.compilations(), 2);
    }

    #[test]
    fn the_cache_is_bounded() {
        let ctx = SessionContext::new();
        let state = ctx.state();
        let mut cache = ValuesCache::default();
        for i in 0..(MAX_ENTRIES + 10) {
            let v = cache
                .value(
                    &state,
                    &expr(&format!("{i} + 1")),
                    ColumnType::Int8,
                    at(0),
                    &[],
                )
                .unwrap()
                .unwrap();
            assert_eq!(v, ScalarValue::Int64(Some(i as i64 + 1)));
            assert!(cache.len <= MAX_ENTRIES);
            assert_eq!(
                cache.len,
                cache.entries.values().map(Vec::len).sum::<usize>()
            );
        }
        let long = format!("length('{}')", "x".repeat(MAX_TEXT_BYTES));
        let v = value(&mut cache, &state, &long, ColumnType::Int8, 0, &[]);
        assert_eq!(v, ScalarValue::Int64(Some(MAX_TEXT_BYTES as i64)));
        assert!(
            !cache.entries.contains_key(&expr(&long)),
            "a long text is not kept"
        );
        assert!(cache.len <= MAX_ENTRIES);
    }

    /// The cache finds an expression by meaning: the same expression written with other
    /// spacing (other positions in the text) is not compiled again; another target type
    /// or another constant is.
    #[test]
    fn the_same_expression_anywhere_in_the_text_is_compiled_once() {
        let ctx = SessionContext::new();
        let state = ctx.state();
        let mut cache = ValuesCache::default();
        let int8 = ColumnType::Int8;
        for text in ["length(repeat('x', 3))", "  length( repeat( 'x' ,3 ) )"] {
            let v = value(&mut cache, &state, text, int8, 0, &[]);
            assert_eq!(v, ScalarValue::Int64(Some(3)));
        }
        assert_eq!(cache.compilations(), 1);
        value(
            &mut cache,
            &state,
            "length(repeat('x', 3))",
            ColumnType::Float8,
            0,
            &[],
        );
        let v = value(&mut cache, &state, "length(repeat('x', 4))", int8, 0, &[]);
        assert_eq!(v, ScalarValue::Int64(Some(4)));
        assert_eq!(cache.compilations(), 3);
        assert_eq!(cache.len, 3);
    }
}
