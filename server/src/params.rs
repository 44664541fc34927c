//! Bound parameters (Bind message bytes) into typed values.
//!
//! The type of each parameter is the one the client declared in Parse, or
//! else the one Sluice inferred when it described the statement. Text
//! parameters go through the same input functions as SQL literals; binary
//! ones are decoded per type's `recv` format. A parameter of no known type
//! is passed as text and left for the planner to coerce.

use bytes::Bytes;
use datafusion::scalar::ScalarValue;
use pgwire::api::results::FieldFormat;
use sluice_sql::error::{sqlstate, Error};
use sluice_sql::types::{oid, ColumnType};

/// The column type a parameter OID stands for, if Sluice has one.
pub fn column_type_of_oid(o: u32) -> Option<ColumnType> {
    Some(match o {
        oid::BOOL => ColumnType::Bool,
        oid::INT2 => ColumnType::Int2,
        oid::INT4 | oid::OID => ColumnType::Int4,
        oid::INT8 => ColumnType::Int8,
        oid::FLOAT4 => ColumnType::Float4,
        oid::FLOAT8 => ColumnType::Float8,
        oid::NUMERIC => ColumnType::Numeric(None),
        oid::TEXT | 1042 | 19 => ColumnType::Text,
        oid::VARCHAR => ColumnType::Varchar(None),
        oid::BYTEA => ColumnType::Bytea,
        oid::TIMESTAMPTZ => ColumnType::Timestamptz,
        oid::TIMESTAMP => ColumnType::Timestamp,
        oid::DATE => ColumnType::Date,
        oid::JSON => ColumnType::Json,
        oid::JSONB => ColumnType::Jsonb,
        oid::UUID => ColumnType::Uuid,
        _ => return None,
    })
}

/// Decode one parameter.
pub fn decode(
    value: Option<&Bytes>,
    oid_value: u32,
    inferred: Option<ColumnType>,
    format: FieldFormat,
) -> Result<ScalarValue, Error> {
    // a declared numeric keeps the inferred column's precision, if any
    let ty = match (column_type_of_oid(oid_value), inferred) {
        (Some(ColumnType::Numeric(None)), Some(t @ ColumnType::Numeric(_))) => Some(t),
        (Some(ColumnType::Varchar(None)), Some(t @ ColumnType::Varchar(_))) => Some(t),
        (Some(t), _) => Some(t),
        (None, t) => t,
    };
    let Some(bytes) = value else {
        return Ok(match ty {
            Some(t) => ScalarValue::try_from(t.arrow_type()).unwrap_or(ScalarValue::Null),
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
    sluice_sql::binary::decode(ty, bytes)
}
