//! A DataFusion scalar function with a check around each call.
//!
//! [`checked`] wraps a function so that a [`Check`] sees its arguments before it runs (and
//! may refuse them: a result that would be too large to build) and its result after (and
//! may refuse it: `Infinity` from finite arguments). Everything else — name, signature,
//! types, simplification, ordering — is the wrapped function's, so a plan reads the same
//! with the wrapper as without; a simplification that rewrites the call away drops the
//! check with it (it only does so where the result is the argument or a constant).
//!
//! Used by [`crate::arithmetic`] (PostgreSQL's errors for math functions) and
//! [`crate::value_size`] (bounded results of `repeat`, `lpad`, ...).

use std::any::Any;
use std::fmt::Debug;
use std::hash::{Hash, Hasher};
use std::sync::Arc;

use arrow::datatypes::{DataType, FieldRef};
use datafusion::common::config::ConfigOptions;
use datafusion::common::Result as DFResult;
use datafusion::logical_expr::interval_arithmetic::Interval;
use datafusion::logical_expr::simplify::{ExprSimplifyResult, SimplifyContext};
use datafusion::logical_expr::sort_properties::{ExprProperties, SortProperties};
use datafusion::logical_expr::{
    ColumnarValue, Documentation, Expr, ReturnFieldArgs, ScalarFunctionArgs, ScalarUDF,
    ScalarUDFImpl, Signature,
};

/// What to verify around a call of the function `name`.
pub trait Check: Debug + Send + Sync + 'static {
    /// Before the call; an error refuses it.
    fn before(&self, _name: &str, _args: &[ColumnarValue], _rows: usize) -> DFResult<()> {
        Ok(())
    }

    /// After the call, with its result; an error replaces it.
    fn after(
        &self,
        _name: &str,
        _args: &[ColumnarValue],
        _rows: usize,
        _out: &ColumnarValue,
    ) -> DFResult<()> {
        Ok(())
    }
}

/// `inner` with `check` around every call (see the module doc).
pub fn checked(inner: ScalarUDF, check: Arc<dyn Check>) -> ScalarUDF {
    ScalarUDF::new_from_impl(CheckedFn { inner, check })
}

/// Whether `f` is already a checked function.
pub fn is_checked(f: &ScalarUDF) -> bool {
    let imp: &dyn Any = f.inner().as_ref();
    imp.is::<CheckedFn>()
}

#[derive(Debug)]
struct CheckedFn {
    inner: ScalarUDF,
    check: Arc<dyn Check>,
}

impl CheckedFn {
    fn imp(&self) -> &Arc<dyn ScalarUDFImpl> {
        self.inner.inner()
    }
}

impl PartialEq for CheckedFn {
    fn eq(&self, other: &Self) -> bool {
        self.inner == other.inner
            && std::ptr::addr_eq(Arc::as_ptr(&self.check), Arc::as_ptr(&other.check))
    }
}

impl Eq for CheckedFn {}

impl Hash for CheckedFn {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.inner.hash(state);
        (Arc::as_ptr(&self.check) as *const () as usize).hash(state);
    }
}

impl ScalarUDFImpl for CheckedFn {
    fn name(&self) -> &str {
        self.imp().name()
    }

    fn aliases(&self) -> &[String] {
        self.imp().aliases()
    }

    fn schema_name(&self, args: &[Expr]) -> DFResult<String> {
        self.imp().schema_name(args)
    }

    fn signature(&self) -> &Signature {
        self.imp().signature()
    }

    fn return_type(&self, arg_types: &[DataType]) -> DFResult<DataType> {
        self.imp().return_type(arg_types)
    }

    fn with_updated_config(&self, config: &ConfigOptions) -> Option<ScalarUDF> {
        let updated = self.imp().with_updated_config(config)?;
        Some(checked(updated, self.check.clone()))
    }

    fn return_field_from_args(&self, args: ReturnFieldArgs) -> DFResult<FieldRef> {
        self.imp().return_field_from_args(args)
    }

    fn is_strict(&self) -> bool {
        self.imp().is_strict()
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> DFResult<ColumnarValue> {
        let name = self.name();
        let rows = args.number_rows;
        self.check.before(name, &args.args, rows)?;
        let kept = args.args.clone();
        let out = self.imp().invoke_with_args(args)?;
        self.check.after(name, &kept, rows, &out)?;
        Ok(out)
    }

    fn simplify(&self, args: Vec<Expr>, info: &SimplifyContext) -> DFResult<ExprSimplifyResult> {
        self.imp().simplify(args, info)
    }

    fn short_circuits(&self) -> bool {
        self.imp().short_circuits()
    }

    fn evaluate_bounds(&self, input: &[&Interval]) -> DFResult<Interval> {
        self.imp().evaluate_bounds(input)
    }

    fn propagate_constraints(
        &self,
        interval: &Interval,
        inputs: &[&Interval],
    ) -> DFResult<Option<Vec<Interval>>> {
        self.imp().propagate_constraints(interval, inputs)
    }

    fn output_ordering(&self, inputs: &[ExprProperties]) -> DFResult<SortProperties> {
        self.imp().output_ordering(inputs)
    }

    fn preserves_lex_ordering(&self, inputs: &[ExprProperties]) -> DFResult<bool> {
        self.imp().preserves_lex_ordering(inputs)
    }

    fn strictly_order_preserving(&self, inputs: &[ExprProperties]) -> DFResult<bool> {
        self.imp().strictly_order_preserving(inputs)
    }

    fn coerce_types(&self, arg_types: &[DataType]) -> DFResult<Vec<DataType>> {
        self.imp().coerce_types(arg_types)
    }

    fn documentation(&self) -> Option<&Documentation> {
        self.imp().documentation()
    }
}
