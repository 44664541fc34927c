//! `format_type(oid, typmod)`: the pg-catalog crate's function, with the element's type
//! modifier kept for array types (`numeric(6,2)[]`, `character varying(3)[]`), which the
//! crate prints without it. psql's `\d` and SQLAlchemy's reflection read it.

use std::sync::Arc;

use arrow::array::{Array, AsArray, StringArray};
use arrow::datatypes::{DataType, Int32Type};
use datafusion::error::Result as DFResult;
use datafusion::logical_expr::{
    ColumnarValue, ScalarFunctionArgs, ScalarUDF, ScalarUDFImpl, Signature,
};

use crate::types::ColumnType;

/// The wrapped `format_type`.
pub(super) fn udf(inner: ScalarUDF) -> ScalarUDF {
    ScalarUDF::new_from_impl(FormatType { inner })
}

#[derive(Debug, PartialEq, Eq, Hash)]
struct FormatType {
    inner: ScalarUDF,
}

impl ScalarUDFImpl for FormatType {
    fn name(&self) -> &str {
        self.inner.name()
    }

    fn signature(&self) -> &Signature {
        self.inner.signature()
    }

    fn return_type(&self, arg_types: &[DataType]) -> DFResult<DataType> {
        self.inner.return_type(arg_types)
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> DFResult<ColumnarValue> {
        let rows = args.number_rows;
        let kept = args.args.clone();
        let out = self.inner.invoke_with_args(args)?;
        let [oids, mods] = kept.as_slice() else {
            return Ok(out);
        };
        let oids = arrow::compute::cast(&oids.to_array(rows)?, &DataType::Int32)?;
        let mods = arrow::compute::cast(&mods.to_array(rows)?, &DataType::Int32)?;
        let (oids, mods) = (
            oids.as_primitive::<Int32Type>(),
            mods.as_primitive::<Int32Type>(),
        );
        let names = out.to_array(rows)?;
        let names = arrow::compute::cast(&names, &DataType::Utf8)?;
        let names = names.as_string::<i32>();
        let fixed: StringArray = (0..names.len())
            .map(|i| {
                let name = names.is_valid(i).then(|| names.value(i).to_string());
                if oids.is_null(i) || mods.is_null(i) || mods.value(i) < 0 {
                    return name;
                }
                match ColumnType::of_oid(oids.value(i) as u32) {
                    Some(t @ ColumnType::Array(_)) => Some(t.with_typmod(mods.value(i)).sql_name()),
                    _ => name,
                }
            })
            .collect();
        Ok(match out {
            ColumnarValue::Scalar(_) if rows == 1 => {
                ColumnarValue::Scalar(datafusion::scalar::ScalarValue::try_from_array(&fixed, 0)?)
            }
            _ => ColumnarValue::Array(Arc::new(fixed)),
        })
    }
}
