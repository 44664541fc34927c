//! PostgreSQL's arithmetic where DataFusion's differs: an error instead of a wrong number.
//!
//! DataFusion adds, subtracts and multiplies integers with wrapping kernels (so
//! `9223372036854775807::bigint + 1` is `-9223372036854775808`), divides floats by zero into
//! `Infinity` (and takes a float modulo zero as `NaN`), computes math functions in IEEE
//! floats (`10::numeric ^ 1000` is `Infinity`, `ln(0)` `-Infinity`, `sqrt(-1)` `NaN`), and
//! sums `bigint`s into a `bigint` that wraps. PostgreSQL raises `22003` ("bigint out of
//! range", "value out of range: overflow"), `22012` ("division by zero"), `2201E` (a
//! logarithm of zero or of a negative number) and `2201F` (a square root of a negative
//! number, a negative number to a fractional power). [`CheckedArithmetic`], an analyzer rule
//! that runs after type coercion, rewrites every such operation in a plan (subqueries
//! included) into [`checked`] functions that raise those errors, folding constant operands
//! itself, and wraps the math functions whose results it must vet ([`MATH_FUNCTIONS`]) with
//! a check of each result against its arguments ([`crate::checked_fn`]); output names stay
//! as written. [`checked_sum`] replaces `sum` with one whose `bigint` total raises `22003`
//! instead of wrapping (PostgreSQL sums `bigint` into `numeric`; Sluice keeps `bigint` and
//! refuses what does not fit).
//!
//! Invariants: a rewritten operation has the type the original had (both operands already
//! coerced to one type), so a plan's schema does not change; an overflow among constants is
//! an error at planning, as PostgreSQL's is; a NaN or infinite argument passes through, as
//! in PostgreSQL (`'Infinity'::float8 * 2` is `Infinity`).

use std::sync::{Arc, LazyLock};

use arrow::array::{Array, ArrayRef, AsArray};
use arrow::compute::kernels::numeric;
use arrow::datatypes::{DataType, FieldRef, Float32Type, Float64Type, Int64Type};
use datafusion::common::config::ConfigOptions;
use datafusion::common::tree_node::{Transformed, TreeNode};
use datafusion::common::{DFSchema, Result as DFResult, ScalarValue};
use datafusion::error::DataFusionError;
use datafusion::logical_expr::expr::ScalarFunction;
use datafusion::logical_expr::expr_rewriter::NamePreserver;
use datafusion::logical_expr::function::{AccumulatorArgs, StateFieldsArgs};
use datafusion::logical_expr::type_coercion::binary::BinaryTypeCoercer;
use datafusion::logical_expr::utils::merge_schema;
use datafusion::logical_expr::utils::AggregateOrderSensitivity;
use datafusion::logical_expr::{
    lit, Accumulator, AggregateUDF, AggregateUDFImpl, BinaryExpr, ColumnarValue, Expr,
    ExprSchemable, GroupsAccumulator, LogicalPlan, Operator, ReversedUDAF, ScalarFunctionArgs,
    ScalarUDF, ScalarUDFImpl, SetMonotonicity, Signature, Volatility,
};
use datafusion::optimizer::AnalyzerRule;

use crate::checked_fn::{self, Check};
use crate::error::sqlstate;

/// The analyzer rule (see the module doc).
#[derive(Debug, Default)]
pub struct CheckedArithmetic;

impl AnalyzerRule for CheckedArithmetic {
    fn analyze(&self, plan: LogicalPlan, _: &ConfigOptions) -> DFResult<LogicalPlan> {
        plan.transform_up_with_subqueries(|plan| {
            let schema = merge_schema(&plan.inputs());
            let names = NamePreserver::new(&plan);
            let rewritten = plan.map_expressions(|expr| {
                let name = names.save(&expr);
                let (expr, _) = typed_rewrite(expr, &schema)?;
                Ok(Transformed::yes(name.restore(expr)))
            })?;
            // a rewritten `sum` below changes the types this node passes on
            rewritten.map_data(|p| p.recompute_schema())
        })
        .map(|t| t.data)
    }

    fn name(&self) -> &str {
        "sluice_checked_arithmetic"
    }
}

/// Rewrites `expr` bottom-up and returns its type with it: each operand's type comes from
/// the rewrite below it, so a chain of n operators costs O(n), not the O(n²) of asking each
/// node for its type (which walks its whole subtree).
fn typed_rewrite(expr: Expr, schema: &DFSchema) -> DFResult<(Expr, Option<DataType>)> {
    match expr {
        Expr::BinaryExpr(BinaryExpr { left, op, right }) => {
            let (left, lt) = typed_rewrite(*left, schema)?;
            let (right, rt) = typed_rewrite(*right, schema)?;
            let checked_op = match op {
                Operator::Plus => Some(Op::Add),
                Operator::Minus => Some(Op::Sub),
                Operator::Multiply => Some(Op::Mul),
                Operator::Divide => Some(Op::Div),
                Operator::Modulo => Some(Op::Mod),
                _ => None,
            };
            match (checked_op, lt, rt) {
                (Some(checked), Some(l), Some(r)) if l == r && checked.checks(&l) => {
                    if let (Expr::Literal(a, _), Expr::Literal(b, _)) = (&left, &right) {
                        // folded here, checked: DataFusion's constant folding would wrap
                        let out = compute(checked, &a.to_array()?, &b.to_array()?)?;
                        return Ok((lit(ScalarValue::try_from_array(&out, 0)?), Some(l)));
                    }
                    Ok((checked.udf().call(vec![left, right]), Some(l)))
                }
                (_, Some(l), Some(r)) => {
                    let t = BinaryTypeCoercer::new(&l, &op, &r).get_result_type().ok();
                    Ok((
                        Expr::BinaryExpr(BinaryExpr::new(Box::new(left), op, Box::new(right))),
                        t,
                    ))
                }
                _ => {
                    let e = Expr::BinaryExpr(BinaryExpr::new(Box::new(left), op, Box::new(right)));
                    let t = e.get_type(schema).ok();
                    Ok((e, t))
                }
            }
        }
        Expr::ScalarFunction(ScalarFunction { func, args })
            if MATH_FUNCTIONS.contains(&func.name()) && !checked_fn::is_checked(&func) =>
        {
            let args = args
                .into_iter()
                .map(|a| typed_rewrite(a, schema).map(|(a, _)| a))
                .collect::<DFResult<Vec<_>>>()?;
            let func = Arc::new(checked_fn::checked(func.as_ref().clone(), math_check()));
            let e = Expr::ScalarFunction(ScalarFunction { func, args });
            let t = e.get_type(schema).ok();
            Ok((e, t))
        }
        // Subqueries are plans of their own (`transform_up_with_subqueries` visits them).
        e @ (Expr::ScalarSubquery(_) | Expr::Exists(_) | Expr::InSubquery(_)) => {
            let t = e.get_type(schema).ok();
            Ok((e, t))
        }
        other => {
            let e = other
                .map_children(|c| typed_rewrite(c, schema).map(|(c, _)| Transformed::yes(c)))?
                .data;
            let t = e.get_type(schema).ok();
            Ok((e, t))
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Op {
    Add,
    Sub,
    Mul,
    Div,
    Mod,
}

impl Op {
    fn name(self) -> &'static str {
        match self {
            Op::Add => "sluice_checked_add",
            Op::Sub => "sluice_checked_sub",
            Op::Mul => "sluice_checked_mul",
            Op::Div => "sluice_checked_div",
            Op::Mod => "sluice_checked_mod",
        }
    }

    /// Whether DataFusion's own operator on `t` can give a wrong number PostgreSQL would
    /// refuse (integer division and modulo are already checked: a zero divisor is an error).
    fn checks(self, t: &DataType) -> bool {
        match t {
            DataType::Int16 | DataType::Int32 | DataType::Int64 => {
                !matches!(self, Op::Div | Op::Mod)
            }
            DataType::Float32 | DataType::Float64 => true,
            _ => false,
        }
    }

    fn udf(self) -> Arc<ScalarUDF> {
        static UDFS: LazyLock<[Arc<ScalarUDF>; 5]> = LazyLock::new(|| {
            [Op::Add, Op::Sub, Op::Mul, Op::Div, Op::Mod]
                .map(|op| Arc::new(ScalarUDF::from(Checked::new(op))))
        });
        UDFS[self as usize].clone()
    }
}

/// One checked operation as a scalar function of two operands of one type.
#[derive(Debug, PartialEq, Eq, Hash)]
struct Checked {
    op: Op,
    signature: Signature,
}

impl Checked {
    fn new(op: Op) -> Checked {
        Checked {
            op,
            signature: Signature::any(2, Volatility::Immutable),
        }
    }
}

/// The functions, for tests and `EXPLAIN` readers: [`CheckedArithmetic`] calls them.
pub fn checked() -> Vec<Arc<ScalarUDF>> {
    [Op::Add, Op::Sub, Op::Mul, Op::Div, Op::Mod]
        .map(Op::udf)
        .to_vec()
}

impl ScalarUDFImpl for Checked {
    fn name(&self) -> &str {
        self.op.name()
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, args: &[DataType]) -> DFResult<DataType> {
        Ok(args[0].clone())
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> DFResult<ColumnarValue> {
        let [l, r] = args.args.as_slice() else {
            return Err(DataFusionError::Internal(format!(
                "{} takes two arguments",
                self.op.name()
            )));
        };
        let scalar = matches!((l, r), (ColumnarValue::Scalar(_), ColumnarValue::Scalar(_)));
        let (la, ra) = (l.to_array(args.number_rows)?, r.to_array(args.number_rows)?);
        let out = compute(self.op, &la, &ra)?;
        if scalar {
            Ok(ColumnarValue::Scalar(ScalarValue::try_from_array(&out, 0)?))
        } else {
            Ok(ColumnarValue::Array(out))
        }
    }
}

fn compute(op: Op, l: &ArrayRef, r: &ArrayRef) -> DFResult<ArrayRef> {
    let t = l.data_type().clone();
    if matches!(t, DataType::Float32 | DataType::Float64) {
        return float(op, l, r);
    }
    let result = match op {
        Op::Add => numeric::add(l, r),
        Op::Sub => numeric::sub(l, r),
        Op::Mul => numeric::mul(l, r),
        Op::Div => numeric::div(l, r),
        Op::Mod => numeric::rem(l, r),
    };
    result.map_err(|_| out_of_range(&t))
}

/// Floats: a zero divisor is `22012`, and an infinite result from finite operands `22003`
/// (PostgreSQL's `float8` rules); NaN and infinite operands pass through.
fn float(op: Op, l: &ArrayRef, r: &ArrayRef) -> DFResult<ArrayRef> {
    let out = match op {
        Op::Add => numeric::add_wrapping(l, r),
        Op::Sub => numeric::sub_wrapping(l, r),
        Op::Mul => numeric::mul_wrapping(l, r),
        Op::Div => numeric::div(l, r),
        Op::Mod => numeric::rem(l, r),
    }?;
    let f64s = |a: &ArrayRef| -> Vec<Option<f64>> {
        match a.data_type() {
            DataType::Float32 => a
                .as_primitive::<Float32Type>()
                .iter()
                .map(|v| v.map(f64::from))
                .collect(),
            _ => a.as_primitive::<Float64Type>().iter().collect(),
        }
    };
    let (lv, rv, ov) = (f64s(l), f64s(r), f64s(&out));
    for i in 0..out.len() {
        let (Some(a), Some(b), Some(o)) = (lv[i], rv[i], ov[i]) else {
            continue;
        };
        if matches!(op, Op::Div | Op::Mod) && b == 0.0 && !a.is_nan() {
            return Err(DataFusionError::Execution("division by zero".into()));
        }
        if o.is_infinite() && a.is_finite() && b.is_finite() {
            return Err(DataFusionError::Execution(
                "value out of range: overflow".into(),
            ));
        }
    }
    Ok(out)
}

fn out_of_range(t: &DataType) -> DataFusionError {
    let name = match t {
        DataType::Int16 => "smallint",
        DataType::Int32 => "integer",
        _ => "bigint",
    };
    DataFusionError::Execution(format!("{name} out of range"))
}

/// Math functions whose IEEE results PostgreSQL refuses in part (see `MathCheck`).
pub const MATH_FUNCTIONS: [&str; 13] = [
    "power", "pow", "exp", "ln", "log", "log10", "log2", "sqrt", "asin", "acos", "acosh", "atanh",
    "degrees",
];

fn math_check() -> Arc<dyn Check> {
    static CHECK: LazyLock<Arc<dyn Check>> = LazyLock::new(|| Arc::new(MathCheck));
    CHECK.clone()
}

/// PostgreSQL's `float8` rules for [`MATH_FUNCTIONS`], applied to each result with the
/// arguments that gave it: an infinite result from finite arguments is an overflow
/// (`22003`), zero from `power`/`exp` of finite nonzero arguments an underflow (`22003`), a
/// logarithm of zero or a negative number `2201E` (base 1: `22012`), a square root of a
/// negative number or a negative number to a fractional power `2201F`, `asin`/`acos`/
/// `acosh`/`atanh` outside their domain `22003` ("input is out of range").
#[derive(Debug)]
struct MathCheck;

impl Check for MathCheck {
    fn after(
        &self,
        name: &str,
        args: &[ColumnarValue],
        rows: usize,
        out: &ColumnarValue,
    ) -> DFResult<()> {
        let floats = |v: &ColumnarValue| -> DFResult<Option<Vec<Option<f64>>>> {
            let a = v.to_array(rows)?;
            if !matches!(a.data_type(), DataType::Float32 | DataType::Float64) {
                return Ok(None);
            }
            let a = arrow::compute::cast(&a, &DataType::Float64)?;
            Ok(Some(a.as_primitive::<Float64Type>().iter().collect()))
        };
        let Some(out) = floats(out)? else {
            return Ok(()); // a decimal or integer result checks its own overflow
        };
        let underflows = matches!(name, "power" | "pow" | "exp");
        // the common case: every result an ordinary number
        if out
            .iter()
            .flatten()
            .all(|o| o.is_finite() && !(underflows && *o == 0.0))
        {
            return Ok(());
        }
        let mut vals = Vec::with_capacity(args.len());
        for a in args {
            match floats(a)? {
                Some(v) => vals.push(v),
                None => return Ok(()),
            }
        }
        for (i, o) in out.iter().enumerate() {
            let Some(o) = *o else { continue };
            let row: Option<Vec<f64>> = vals.iter().map(|v| v[i]).collect();
            let Some(row) = row else { continue };
            if row.iter().any(|a| !a.is_finite()) {
                continue; // NaN and infinities pass through
            }
            if let Some(e) = math_error(name, &row, o) {
                return Err(DataFusionError::External(Box::new(e)));
            }
        }
        Ok(())
    }
}

/// The error PostgreSQL raises for `name(args) = out`, all arguments finite.
fn math_error(name: &str, args: &[f64], out: f64) -> Option<crate::Error> {
    use crate::Error;
    let log_of = |x: f64| {
        (x <= 0.0).then(|| {
            Error::new(
                sqlstate::INVALID_ARGUMENT_FOR_LOG,
                if x == 0.0 {
                    "cannot take logarithm of zero"
                } else {
                    "cannot take logarithm of a negative number"
                },
            )
        })
    };
    let out_of_domain = || {
        Error::new(
            sqlstate::NUMERIC_VALUE_OUT_OF_RANGE,
            "input is out of range",
        )
    };
    match (name, args) {
        ("ln" | "log10" | "log2" | "log", [x]) => return log_of(*x),
        ("log", [base, x]) => {
            if let Some(e) = log_of(*base).or_else(|| log_of(*x)) {
                return Some(e);
            }
            if *base == 1.0 {
                return Some(Error::new(sqlstate::DIVISION_BY_ZERO, "division by zero"));
            }
        }
        ("sqrt", [x]) if *x < 0.0 => {
            return Some(Error::new(
                sqlstate::INVALID_ARGUMENT_FOR_POWER,
                "cannot take square root of a negative number",
            ))
        }
        ("power" | "pow", [base, exp]) if *base < 0.0 && exp.fract() != 0.0 => {
            return Some(Error::new(
                sqlstate::INVALID_ARGUMENT_FOR_POWER,
                "a negative number raised to a non-integer power yields a complex result",
            ))
        }
        ("asin" | "acos", [x]) if x.abs() > 1.0 => return Some(out_of_domain()),
        ("acosh", [x]) if *x < 1.0 => return Some(out_of_domain()),
        ("atanh", [x]) if x.abs() > 1.0 => return Some(out_of_domain()),
        ("atanh", _) => return None, // atanh(±1) is ±Infinity in PostgreSQL too
        _ => {}
    }
    if out.is_infinite() {
        return Some(Error::new(
            sqlstate::NUMERIC_VALUE_OUT_OF_RANGE,
            "value out of range: overflow",
        ));
    }
    let nonzero = args.first().is_some_and(|b| *b != 0.0);
    if out == 0.0 && nonzero && matches!(name, "power" | "pow" | "exp") {
        return Some(Error::new(
            sqlstate::NUMERIC_VALUE_OUT_OF_RANGE,
            "value out of range: underflow",
        ));
    }
    None
}

/// `sum` whose `bigint` total is checked (see the module doc); every other input type is
/// DataFusion's own `sum`.
pub fn checked_sum() -> AggregateUDF {
    AggregateUDF::from(CheckedSum {
        inner: datafusion::functions_aggregate::sum::sum_udaf(),
    })
}

#[derive(Debug, PartialEq, Eq, Hash)]
struct CheckedSum {
    inner: Arc<AggregateUDF>,
}

impl CheckedSum {
    /// The checked accumulator applies: a plain (not DISTINCT) sum into `bigint`.
    fn checks(args: &AccumulatorArgs) -> bool {
        !args.is_distinct && args.return_field.data_type() == &DataType::Int64
    }
}

impl AggregateUDFImpl for CheckedSum {
    fn name(&self) -> &str {
        self.inner.name()
    }

    fn signature(&self) -> &Signature {
        self.inner.signature()
    }

    fn return_type(&self, args: &[DataType]) -> DFResult<DataType> {
        self.inner.return_type(args)
    }

    fn accumulator(&self, args: AccumulatorArgs) -> DFResult<Box<dyn Accumulator>> {
        if Self::checks(&args) {
            return Ok(Box::new(BigintSum(None)));
        }
        self.inner.accumulator(args)
    }

    fn state_fields(&self, args: StateFieldsArgs) -> DFResult<Vec<FieldRef>> {
        self.inner.state_fields(args)
    }

    fn groups_accumulator_supported(&self, args: AccumulatorArgs) -> bool {
        // DataFusion's grouped bigint sum wraps; the checked one runs per group
        !Self::checks(&args) && self.inner.groups_accumulator_supported(args)
    }

    fn create_groups_accumulator(
        &self,
        args: AccumulatorArgs,
    ) -> DFResult<Box<dyn GroupsAccumulator>> {
        self.inner.create_groups_accumulator(args)
    }

    fn create_sliding_accumulator(&self, args: AccumulatorArgs) -> DFResult<Box<dyn Accumulator>> {
        self.inner.create_sliding_accumulator(args)
    }

    fn reverse_expr(&self) -> ReversedUDAF {
        ReversedUDAF::Identical
    }

    fn order_sensitivity(&self) -> AggregateOrderSensitivity {
        self.inner.inner().order_sensitivity()
    }

    fn set_monotonicity(&self, data_type: &DataType) -> SetMonotonicity {
        self.inner.inner().set_monotonicity(data_type)
    }
}

/// A `bigint` sum that refuses to wrap; NULL until it sees a value, as SQL's `sum`.
#[derive(Debug)]
struct BigintSum(Option<i64>);

impl Accumulator for BigintSum {
    fn update_batch(&mut self, values: &[ArrayRef]) -> DFResult<()> {
        let values = values[0].as_primitive::<Int64Type>();
        let batch =
            arrow::compute::sum_checked(values).map_err(|_| out_of_range(&DataType::Int64))?;
        if let Some(b) = batch {
            let total = self.0.unwrap_or(0).checked_add(b);
            self.0 = Some(total.ok_or_else(|| out_of_range(&DataType::Int64))?);
        }
        Ok(())
    }

    fn merge_batch(&mut self, states: &[ArrayRef]) -> DFResult<()> {
        self.update_batch(states)
    }

    fn state(&mut self) -> DFResult<Vec<ScalarValue>> {
        Ok(vec![ScalarValue::Int64(self.0)])
    }

    fn evaluate(&mut self) -> DFResult<ScalarValue> {
        Ok(ScalarValue::Int64(self.0))
    }

    fn size(&self) -> usize {
        std::mem::size_of_val(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::prelude::SessionContext;

    async fn run(sql: &str) -> Result<String, String> {
        let ctx = SessionContext::new();
        ctx.add_analyzer_rule(Arc::new(CheckedArithmetic));
        let out = async {
            let df = ctx.sql(sql).await?;
            let batches = df.collect().await?;
            let col = batches[0].column(0).clone();
            Ok::<_, DataFusionError>(format!(
                "{}:{}",
                col.data_type(),
                arrow::util::display::array_value_to_string(&col, 0)?
            ))
        };
        out.await.map_err(|e| e.to_string())
    }

    #[tokio::test]
    async fn integer_overflow_is_an_error_not_a_wrapped_number() {
        for sql in [
            "SELECT CAST(9223372036854775807 AS BIGINT) + 1",
            "SELECT CAST(-9223372036854775807 AS BIGINT) - 2",
            "SELECT CAST(4294967296 AS BIGINT) * 4294967296",
            "SELECT CAST(2147483647 AS INT) + CAST(1 AS INT)",
            "SELECT CAST(32767 AS SMALLINT) + CAST(1 AS SMALLINT)",
            "SELECT v + 1 FROM (VALUES (CAST(9223372036854775807 AS BIGINT))) AS t(v)",
        ] {
            let err = run(sql).await.unwrap_err();
            assert!(err.contains("out of range"), "{sql}: {err}");
        }
        assert_eq!(
            run("SELECT CAST(9223372036854775806 AS BIGINT) + 1")
                .await
                .unwrap(),
            "Int64:9223372036854775807"
        );
    }

    #[tokio::test]
    async fn float_division_by_zero_and_overflow_are_errors() {
        let err = run("SELECT CAST(1.0 AS DOUBLE) / CAST(0.0 AS DOUBLE)")
            .await
            .unwrap_err();
        assert!(err.contains("division by zero"), "{err}");
        let err = run("SELECT CAST(1e308 AS DOUBLE) * 10").await.unwrap_err();
        assert!(err.contains("out of range"), "{err}");
        assert_eq!(
            run("SELECT CAST(1.0 AS DOUBLE) / 4").await.unwrap(),
            "Float64:0.25"
        );
    }

    #[tokio::test]
    async fn math_functions_raise_what_postgres_raises() {
        for (sql, expected) in [
            (
                "SELECT power(CAST(10 AS DOUBLE), CAST(1000 AS DOUBLE))",
                "overflow",
            ),
            (
                "SELECT pow(v, 1000) FROM (VALUES (CAST(10 AS DOUBLE))) AS t(v)",
                "overflow",
            ),
            ("SELECT exp(CAST(-1000 AS DOUBLE))", "underflow"),
            ("SELECT ln(CAST(0 AS DOUBLE))", "logarithm of zero"),
            (
                "SELECT log(v) FROM (VALUES (CAST(-2 AS DOUBLE))) AS t(v)",
                "negative number",
            ),
            ("SELECT power(CAST(-8 AS DOUBLE), 0.5)", "complex result"),
            ("SELECT acos(CAST(2 AS DOUBLE))", "input is out of range"),
            (
                "SELECT CAST(5.5 AS DOUBLE) % CAST(0 AS DOUBLE)",
                "division by zero",
            ),
        ] {
            let err = run(sql).await.unwrap_err();
            assert!(err.contains(expected), "{sql}: {err}");
        }
        assert_eq!(
            run("SELECT power(CAST(2 AS DOUBLE), 10)").await.unwrap(),
            "Float64:1024.0"
        );
        // infinite arguments pass through, as in PostgreSQL
        assert_eq!(
            run("SELECT exp(CAST('Infinity' AS DOUBLE))").await.unwrap(),
            "Float64:inf"
        );
        assert_eq!(
            run("SELECT CAST(7.5 AS DOUBLE) % 2").await.unwrap(),
            "Float64:1.5"
        );
    }

    #[tokio::test]
    async fn sum_of_bigint_overflow_is_an_error_and_names_stay() {
        let ctx = SessionContext::new();
        ctx.register_udaf(checked_sum());
        let sql = "SELECT sum(v) FROM (VALUES (CAST(9223372036854775807 AS BIGINT)), \
                   (CAST(1 AS BIGINT))) AS t(v)";
        let err = ctx.sql(sql).await.unwrap().collect().await.unwrap_err();
        assert!(err.to_string().contains("bigint out of range"), "{err}");
        let sql = "SELECT k, sum(v) FROM (VALUES (1, CAST(9223372036854775807 AS BIGINT)), \
                   (1, CAST(1 AS BIGINT))) AS t(k, v) GROUP BY k";
        let err = ctx.sql(sql).await.unwrap().collect().await.unwrap_err();
        assert!(err.to_string().contains("bigint out of range"), "{err}");
        let sql = "SELECT sum(v) FROM (VALUES (CAST(2 AS BIGINT)), (CAST(3 AS BIGINT))) AS t(v)";
        let batches = ctx.sql(sql).await.unwrap().collect().await.unwrap();
        let col = batches[0]
            .column(0)
            .as_primitive::<arrow::datatypes::Int64Type>();
        assert_eq!(col.value(0), 5);

        ctx.add_analyzer_rule(Arc::new(CheckedArithmetic));
        let df = ctx
            .sql("SELECT sum(v), v + 1 FROM (VALUES (CAST(1 AS BIGINT))) AS t(v) GROUP BY v")
            .await
            .unwrap();
        let names: Vec<_> = df
            .schema()
            .fields()
            .iter()
            .map(|f| f.name().clone())
            .collect();
        assert_eq!(names, ["sum(t.v)", "t.v + Int64(1)"]);
        df.collect().await.unwrap();
    }
}
