//! Bound parameters (Bind message bytes) into typed values.
//!
//! The type of each parameter is the one the client declared in Parse, or
//! else the one Sluice inferred when it described the statement: a column
//! type or a one-dimensional array of one. Text parameters go through the
//! same input functions as SQL literals (an array's elements through their
//! type's); binary ones are decoded per type's `recv` format. A parameter of
//! no known type is passed as text and left for the planner to coerce.

use bytes::Bytes;
use datafusion::scalar::ScalarValue;
use pgwire::api::results::FieldFormat;
use sluice_sql::error::{sqlstate, Error};
use sluice_sql::param_type::ParamType;
use sluice_sql::types::ColumnType;

/// Decode one parameter.
pub fn decode(
    value: Option<&Bytes>,
    oid_value: u32,
    inferred: Option<ParamType>,
    format: FieldFormat,
) -> Result<ScalarValue, Error> {
    use ParamType::Scalar;
    // a declared numeric keeps the inferred column's precision, if any
    let ty = match (ParamType::of_oid(oid_value), inferred) {
        (Some(Scalar(ColumnType::Numeric(None))), Some(t @ Scalar(ColumnType::Numeric(_)))) => {
            Some(t)
        }
        (Some(Scalar(ColumnType::Varchar(None))), Some(t @ Scalar(ColumnType::Varchar(_)))) => {
            Some(t)
        }
        (Some(t), _) => Some(t),
        (None, t) => t,
    };
    let Some(bytes) = value else {
        return Ok(match ty {
            Some(t) => t.null(),
            None => ScalarValue::Utf8(None),
        });
    };
    if format == FieldFormat::Text {
        let s = std::str::from_utf8(bytes).map_err(|_| {
            Error::new(
                sqlstate::CHARACTER_NOT_IN_REPERTOIRE,
                "invalid byte sequence for encoding \"UTF8\"",
            )
        })?;
        return match ty {
            Some(t) => t.parse_text(s),
            None => Ok(ScalarValue::Utf8(Some(s.to_string()))),
        };
    }
    let Some(ty) = ty else {
        return Err(Error::new(
            sqlstate::PROTOCOL_VIOLATION,
            format!("binary parameter of unsupported type oid {oid_value}"),
        ));
    };
    ty.decode_binary(bytes)
}
