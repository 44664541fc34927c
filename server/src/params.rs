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

use crate::encode::{days_from_pg, decode_numeric_binary, micros_from_pg};

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

fn bad_binary(ty: &str) -> Error {
    Error::new(
        sqlstate::PROTOCOL_VIOLATION,
        format!("incorrect binary data format in bind parameter of type {ty}"),
    )
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
                sqlstate::INVALID_TEXT_REPRESENTATION,
                "invalid byte sequence for encoding \"UTF8\"",
            )
        })?;
        return match ty {
            Some(t) => t.parse_text(s),
            None => Ok(ScalarValue::Utf8(Some(s.to_string()))),
        };
    }
    let b = bytes.as_ref();
    let Some(ty) = ty else {
        return Err(Error::new(
            sqlstate::PROTOCOL_VIOLATION,
            format!("binary parameter of unsupported type oid {oid_value}"),
        ));
    };
    let fixed = |n: usize| -> Result<&[u8], Error> {
        if b.len() == n {
            Ok(b)
        } else {
            Err(bad_binary(&ty.sql_name()))
        }
    };
    Ok(match ty {
        ColumnType::Bool => ScalarValue::Boolean(Some(fixed(1)?[0] != 0)),
        ColumnType::Int2 => ScalarValue::Int16(Some(i16::from_be_bytes([fixed(2)?[0], b[1]]))),
        ColumnType::Int4 => {
            let v = fixed(4)?;
            ScalarValue::Int32(Some(i32::from_be_bytes([v[0], v[1], v[2], v[3]])))
        }
        ColumnType::Int8 => {
            let v = fixed(8)?;
            ScalarValue::Int64(Some(i64::from_be_bytes(
                v.try_into().map_err(|_| bad_binary("bigint"))?,
            )))
        }
        ColumnType::Float4 => {
            let v = fixed(4)?;
            ScalarValue::Float32(Some(f32::from_be_bytes([v[0], v[1], v[2], v[3]])))
        }
        ColumnType::Float8 => {
            let v = fixed(8)?;
            ScalarValue::Float64(Some(f64::from_be_bytes(
                v.try_into().map_err(|_| bad_binary("double precision"))?,
            )))
        }
        ColumnType::Numeric(_) => {
            let text = decode_numeric_binary(b).ok_or_else(|| bad_binary("numeric"))?;
            ty.parse_text(&text)?
        }
        ColumnType::Text | ColumnType::Varchar(_) | ColumnType::Json => {
            let s = std::str::from_utf8(b).map_err(|_| bad_binary("text"))?;
            ty.parse_text(s)?
        }
        ColumnType::Jsonb => {
            if b.first() != Some(&1) {
                return Err(bad_binary("jsonb"));
            }
            let s = std::str::from_utf8(&b[1..]).map_err(|_| bad_binary("jsonb"))?;
            ty.parse_text(s)?
        }
        ColumnType::Uuid => {
            let u = uuid::Uuid::from_slice(fixed(16)?).map_err(|_| bad_binary("uuid"))?;
            ScalarValue::Utf8(Some(u.hyphenated().to_string()))
        }
        ColumnType::Bytea => ScalarValue::Binary(Some(b.to_vec())),
        ColumnType::Timestamptz => {
            let v = fixed(8)?;
            let m = i64::from_be_bytes(v.try_into().map_err(|_| bad_binary("timestamptz"))?);
            ScalarValue::TimestampMicrosecond(Some(micros_from_pg(m)), Some("UTC".into()))
        }
        ColumnType::Timestamp => {
            let v = fixed(8)?;
            let m = i64::from_be_bytes(v.try_into().map_err(|_| bad_binary("timestamp"))?);
            ScalarValue::TimestampMicrosecond(Some(micros_from_pg(m)), None)
        }
        ColumnType::Date => {
            let v = fixed(4)?;
            ScalarValue::Date32(Some(days_from_pg(i32::from_be_bytes([
                v[0], v[1], v[2], v[3],
            ]))))
        }
    })
}
