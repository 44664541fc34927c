//! Column types: the PostgreSQL types a stream column can have, how each is
//! stored in Arrow, and how text input becomes a value.
//!
//! Invariant: a value that passes [`ColumnType::parse_text`] (or
//! [`ColumnType::coerce`]) is valid for the column; the apply path never
//! re-validates. Types Arrow cannot tell apart (json, jsonb, uuid, varchar)
//! are Utf8 columns whose field metadata `pg_type` names the real type, so
//! the wire layer can report the right OID.

use std::collections::HashMap;
use std::sync::Arc;

use arrow::array::{Array, ArrayRef};
use arrow::datatypes::{DataType, Field, TimeUnit};
use chrono::{DateTime, NaiveDate, NaiveDateTime, NaiveTime, Utc};
use datafusion::scalar::ScalarValue;
use serde::{Deserialize, Serialize};

use crate::error::{sqlstate, Error, Result};

pub mod arrays;

/// Field-metadata key naming the PostgreSQL type of an Arrow field.
pub const PG_TYPE_KEY: &str = "pg_type";

/// Precision and scale used for `numeric` without a type modifier.
pub const DEFAULT_NUMERIC: (u8, i8) = (38, 10);

/// PostgreSQL type OIDs Sluice reports.
pub mod oid {
    pub const BOOL: u32 = 16;
    pub const BYTEA: u32 = 17;
    pub const INT8: u32 = 20;
    pub const INT2: u32 = 21;
    pub const INT2VECTOR: u32 = 22;
    pub const INT4: u32 = 23;
    pub const TEXT: u32 = 25;
    pub const OID: u32 = 26;
    pub const OIDVECTOR: u32 = 30;
    pub const JSON: u32 = 114;
    pub const FLOAT4: u32 = 700;
    pub const FLOAT8: u32 = 701;
    pub const UNKNOWN: u32 = 705;
    pub const VARCHAR: u32 = 1043;
    pub const DATE: u32 = 1082;
    pub const TIME: u32 = 1083;
    pub const TIMESTAMP: u32 = 1114;
    pub const TIMESTAMPTZ: u32 = 1184;
    pub const INTERVAL: u32 = 1186;
    pub const NUMERIC: u32 = 1700;
    pub const UUID: u32 = 2950;
    pub const JSONB: u32 = 3802;
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ColumnType {
    Bool,
    Int2,
    Int4,
    Int8,
    Float4,
    Float8,
    /// `numeric(p, s)`; `None` for unconstrained `numeric`.
    Numeric(Option<(u8, i8)>),
    Text,
    Varchar(Option<u32>),
    Bytea,
    Timestamptz,
    Timestamp,
    Date,
    Json,
    Jsonb,
    Uuid,
    /// A one-dimensional array (`text[]`, `numeric(12,2)[]`), stored as an Arrow list whose
    /// items are the element type's Arrow type.
    Array(ElementType),
}

/// The element type of an array column: every [`ColumnType`] but an array (PostgreSQL
/// has no arrays of arrays; more dimensions are one array type). Kept apart so
/// `ColumnType` stays `Copy`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ElementType {
    Bool,
    Int2,
    Int4,
    Int8,
    Float4,
    Float8,
    Numeric(Option<(u8, i8)>),
    Text,
    Varchar(Option<u32>),
    Bytea,
    Timestamptz,
    Timestamp,
    Date,
    Json,
    Jsonb,
    Uuid,
}

impl ElementType {
    /// The column type of one element.
    pub fn column(self) -> ColumnType {
        match self {
            ElementType::Bool => ColumnType::Bool,
            ElementType::Int2 => ColumnType::Int2,
            ElementType::Int4 => ColumnType::Int4,
            ElementType::Int8 => ColumnType::Int8,
            ElementType::Float4 => ColumnType::Float4,
            ElementType::Float8 => ColumnType::Float8,
            ElementType::Numeric(m) => ColumnType::Numeric(m),
            ElementType::Text => ColumnType::Text,
            ElementType::Varchar(m) => ColumnType::Varchar(m),
            ElementType::Bytea => ColumnType::Bytea,
            ElementType::Timestamptz => ColumnType::Timestamptz,
            ElementType::Timestamp => ColumnType::Timestamp,
            ElementType::Date => ColumnType::Date,
            ElementType::Json => ColumnType::Json,
            ElementType::Jsonb => ColumnType::Jsonb,
            ElementType::Uuid => ColumnType::Uuid,
        }
    }

    /// The element type of `ty`; `None` for an array.
    pub fn of(ty: ColumnType) -> Option<ElementType> {
        Some(match ty {
            ColumnType::Bool => ElementType::Bool,
            ColumnType::Int2 => ElementType::Int2,
            ColumnType::Int4 => ElementType::Int4,
            ColumnType::Int8 => ElementType::Int8,
            ColumnType::Float4 => ElementType::Float4,
            ColumnType::Float8 => ElementType::Float8,
            ColumnType::Numeric(m) => ElementType::Numeric(m),
            ColumnType::Text => ElementType::Text,
            ColumnType::Varchar(m) => ElementType::Varchar(m),
            ColumnType::Bytea => ElementType::Bytea,
            ColumnType::Timestamptz => ElementType::Timestamptz,
            ColumnType::Timestamp => ElementType::Timestamp,
            ColumnType::Date => ElementType::Date,
            ColumnType::Json => ElementType::Json,
            ColumnType::Jsonb => ElementType::Jsonb,
            ColumnType::Uuid => ElementType::Uuid,
            ColumnType::Array(_) => return None,
        })
    }
}

impl ColumnType {
    /// An array of `elem`; an array of an array is the same array type, as in PostgreSQL.
    pub fn array_of(elem: ColumnType) -> ColumnType {
        match ElementType::of(elem) {
            Some(e) => ColumnType::Array(e),
            None => elem,
        }
    }

    /// The element type of an array type.
    pub fn element(&self) -> Option<ColumnType> {
        match self {
            ColumnType::Array(e) => Some(e.column()),
            _ => None,
        }
    }

    /// Parse a type name as written in SQL (`integer`, `varchar(20)`,
    /// `timestamp with time zone`, `numeric(12,2)`, `text[]`, `_int4`, ...).
    pub fn parse(name: &str) -> Result<ColumnType> {
        if let Some(elem) = array_element_name(name) {
            return ColumnType::parse(elem).map(ColumnType::array_of);
        }
        let norm = name
            .trim()
            .to_ascii_lowercase()
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ");
        let norm = norm.trim_start_matches("pg_catalog.").to_string();
        let (base, args) = match norm.find('(') {
            Some(i) if norm.ends_with(')') => {
                let args: Vec<String> = norm[i + 1..norm.len() - 1]
                    .split(',')
                    .map(|a| a.trim().to_string())
                    .collect();
                (norm[..i].trim().to_string(), args)
            }
            _ => (norm.clone(), vec![]),
        };
        let num_arg = |i: usize| -> Result<Option<i64>> {
            match args.get(i) {
                None => Ok(None),
                Some(a) => a
                    .parse::<i64>()
                    .map(Some)
                    .map_err(|_| Error::syntax(format!("invalid type modifier in {name}"))),
            }
        };
        let ty = match base.as_str() {
            "bool" | "boolean" => ColumnType::Bool,
            "int2" | "smallint" => ColumnType::Int2,
            "int" | "int4" | "integer" => ColumnType::Int4,
            "int8" | "bigint" => ColumnType::Int8,
            "float4" | "real" => ColumnType::Float4,
            "float8" | "double precision" | "double" => ColumnType::Float8,
            "float" => match num_arg(0)? {
                Some(p) if p <= 24 => ColumnType::Float4,
                _ => ColumnType::Float8,
            },
            "numeric" | "decimal" => match (num_arg(0)?, num_arg(1)?) {
                (None, _) => ColumnType::Numeric(None),
                (Some(p), s) => {
                    let s = s.unwrap_or(0);
                    if !(1..=38).contains(&p) {
                        return Err(Error::new(
                            sqlstate::INVALID_PARAMETER_VALUE,
                            format!("NUMERIC precision {p} must be between 1 and 38"),
                        ));
                    }
                    if s < 0 || s > p {
                        return Err(Error::new(
                            sqlstate::INVALID_PARAMETER_VALUE,
                            format!("NUMERIC scale {s} must be between 0 and precision {p}"),
                        ));
                    }
                    ColumnType::Numeric(Some((p as u8, s as i8)))
                }
            },
            "text" | "string" => ColumnType::Text,
            "varchar" | "character varying" | "char varying" => {
                ColumnType::Varchar(num_arg(0)?.map(|n| n.max(1) as u32))
            }
            "char" | "character" | "bpchar" => {
                ColumnType::Varchar(num_arg(0)?.map(|n| n.max(1) as u32))
            }
            "bytea" => ColumnType::Bytea,
            "timestamptz" | "timestamp with time zone" => ColumnType::Timestamptz,
            "timestamp" | "timestamp without time zone" => ColumnType::Timestamp,
            "date" => ColumnType::Date,
            "json" => ColumnType::Json,
            "jsonb" => ColumnType::Jsonb,
            "uuid" => ColumnType::Uuid,
            _ => {
                return Err(Error::new(
                    sqlstate::UNDEFINED_OBJECT,
                    format!("type \"{}\" does not exist", name.trim()),
                ))
            }
        };
        Ok(ty)
    }

    /// The name PostgreSQL's `format_type` would print.
    pub fn sql_name(&self) -> String {
        match self {
            ColumnType::Bool => "boolean".into(),
            ColumnType::Int2 => "smallint".into(),
            ColumnType::Int4 => "integer".into(),
            ColumnType::Int8 => "bigint".into(),
            ColumnType::Float4 => "real".into(),
            ColumnType::Float8 => "double precision".into(),
            ColumnType::Numeric(None) => "numeric".into(),
            ColumnType::Numeric(Some((p, s))) => format!("numeric({p},{s})"),
            ColumnType::Text => "text".into(),
            ColumnType::Varchar(None) => "character varying".into(),
            ColumnType::Varchar(Some(n)) => format!("character varying({n})"),
            ColumnType::Bytea => "bytea".into(),
            ColumnType::Timestamptz => "timestamp with time zone".into(),
            ColumnType::Timestamp => "timestamp without time zone".into(),
            ColumnType::Date => "date".into(),
            ColumnType::Json => "json".into(),
            ColumnType::Jsonb => "jsonb".into(),
            ColumnType::Uuid => "uuid".into(),
            ColumnType::Array(e) => format!("{}[]", e.column().sql_name()),
        }
    }

    /// `pg_type.typname` (`int4`, `timestamptz`, ...); also how PostgreSQL
    /// names a cast column (`'1'::int` → `int4`).
    pub fn typname(&self) -> &'static str {
        match self {
            ColumnType::Bool => "bool",
            ColumnType::Int2 => "int2",
            ColumnType::Int4 => "int4",
            ColumnType::Int8 => "int8",
            ColumnType::Float4 => "float4",
            ColumnType::Float8 => "float8",
            ColumnType::Numeric(_) => "numeric",
            ColumnType::Text => "text",
            ColumnType::Varchar(_) => "varchar",
            ColumnType::Bytea => "bytea",
            ColumnType::Timestamptz => "timestamptz",
            ColumnType::Timestamp => "timestamp",
            ColumnType::Date => "date",
            ColumnType::Json => "json",
            ColumnType::Jsonb => "jsonb",
            ColumnType::Uuid => "uuid",
            ColumnType::Array(e) => match e {
                ElementType::Bool => "_bool",
                ElementType::Int2 => "_int2",
                ElementType::Int4 => "_int4",
                ElementType::Int8 => "_int8",
                ElementType::Float4 => "_float4",
                ElementType::Float8 => "_float8",
                ElementType::Numeric(_) => "_numeric",
                ElementType::Text => "_text",
                ElementType::Varchar(_) => "_varchar",
                ElementType::Bytea => "_bytea",
                ElementType::Timestamptz => "_timestamptz",
                ElementType::Timestamp => "_timestamp",
                ElementType::Date => "_date",
                ElementType::Json => "_json",
                ElementType::Jsonb => "_jsonb",
                ElementType::Uuid => "_uuid",
            },
        }
    }

    /// Short name used in error messages (`integer`, `uuid`, ...).
    fn input_name(&self) -> &'static str {
        match self {
            ColumnType::Bool => "boolean",
            ColumnType::Int2 => "smallint",
            ColumnType::Int4 => "integer",
            ColumnType::Int8 => "bigint",
            ColumnType::Float4 => "real",
            ColumnType::Float8 => "double precision",
            ColumnType::Numeric(_) => "numeric",
            ColumnType::Text | ColumnType::Varchar(_) => "text",
            ColumnType::Bytea => "bytea",
            ColumnType::Timestamptz => "timestamp with time zone",
            ColumnType::Timestamp => "timestamp without time zone",
            ColumnType::Date => "date",
            ColumnType::Json => "json",
            ColumnType::Jsonb => "jsonb",
            ColumnType::Uuid => "uuid",
            ColumnType::Array(e) => e.column().input_name(),
        }
    }

    /// One of each type (numeric and varchar unconstrained).
    pub const ALL: [ColumnType; 16] = [
        ColumnType::Bool,
        ColumnType::Int2,
        ColumnType::Int4,
        ColumnType::Int8,
        ColumnType::Float4,
        ColumnType::Float8,
        ColumnType::Numeric(None),
        ColumnType::Text,
        ColumnType::Varchar(None),
        ColumnType::Bytea,
        ColumnType::Timestamptz,
        ColumnType::Timestamp,
        ColumnType::Date,
        ColumnType::Json,
        ColumnType::Jsonb,
        ColumnType::Uuid,
    ];

    /// The column type a (parameter's) OID stands for, if Sluice has one.
    pub fn of_oid(o: u32) -> Option<ColumnType> {
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
            _ => {
                return ColumnType::ALL
                    .iter()
                    .find(|t| t.array_oid() == o)
                    .map(|&t| ColumnType::array_of(t))
            }
        })
    }

    /// The OID of the array type of this type (`text[]` is 1009, ...); 0 for an array
    /// type, which has none.
    pub fn array_oid(&self) -> u32 {
        match self {
            ColumnType::Bool => 1000,
            ColumnType::Int2 => 1005,
            ColumnType::Int4 => 1007,
            ColumnType::Int8 => 1016,
            ColumnType::Float4 => 1021,
            ColumnType::Float8 => 1022,
            ColumnType::Numeric(_) => 1231,
            ColumnType::Text => 1009,
            ColumnType::Varchar(_) => 1015,
            ColumnType::Bytea => 1001,
            ColumnType::Timestamptz => 1185,
            ColumnType::Timestamp => 1115,
            ColumnType::Date => 1182,
            ColumnType::Json => 199,
            ColumnType::Jsonb => 3807,
            ColumnType::Uuid => 2951,
            ColumnType::Array(_) => 0,
        }
    }

    pub fn oid(&self) -> u32 {
        match self {
            ColumnType::Bool => oid::BOOL,
            ColumnType::Int2 => oid::INT2,
            ColumnType::Int4 => oid::INT4,
            ColumnType::Int8 => oid::INT8,
            ColumnType::Float4 => oid::FLOAT4,
            ColumnType::Float8 => oid::FLOAT8,
            ColumnType::Numeric(_) => oid::NUMERIC,
            ColumnType::Text => oid::TEXT,
            ColumnType::Varchar(_) => oid::VARCHAR,
            ColumnType::Bytea => oid::BYTEA,
            ColumnType::Timestamptz => oid::TIMESTAMPTZ,
            ColumnType::Timestamp => oid::TIMESTAMP,
            ColumnType::Date => oid::DATE,
            ColumnType::Json => oid::JSON,
            ColumnType::Jsonb => oid::JSONB,
            ColumnType::Uuid => oid::UUID,
            ColumnType::Array(e) => e.column().array_oid(),
        }
    }

    /// This type with the modifier `typmod` (as [`typmod`](Self::typmod) gives it): a
    /// numeric's precision and scale, a varchar's length; an array's element's.
    pub fn with_typmod(self, typmod: i32) -> ColumnType {
        let m = typmod - 4;
        match self {
            ColumnType::Numeric(_) if m >= 0 => {
                ColumnType::Numeric(Some((((m >> 16) & 0xffff) as u8, (m & 0xffff) as i8)))
            }
            ColumnType::Varchar(_) if m >= 0 => ColumnType::Varchar(Some(m as u32)),
            ColumnType::Array(e) => ColumnType::array_of(e.column().with_typmod(typmod)),
            other => other,
        }
    }

    /// `pg_attribute.atttypmod` for this type (an array's is its element's).
    pub fn typmod(&self) -> i32 {
        match self {
            ColumnType::Array(e) => e.column().typmod(),
            ColumnType::Numeric(Some((p, s))) => ((*p as i32) << 16 | (*s as i32 & 0xffff)) + 4,
            ColumnType::Varchar(Some(n)) => *n as i32 + 4,
            _ => -1,
        }
    }

    pub fn arrow_type(&self) -> DataType {
        match self {
            ColumnType::Bool => DataType::Boolean,
            ColumnType::Int2 => DataType::Int16,
            ColumnType::Int4 => DataType::Int32,
            ColumnType::Int8 => DataType::Int64,
            ColumnType::Float4 => DataType::Float32,
            ColumnType::Float8 => DataType::Float64,
            ColumnType::Numeric(ps) => {
                let (p, s) = ps.unwrap_or(DEFAULT_NUMERIC);
                DataType::Decimal128(p, s)
            }
            ColumnType::Text
            | ColumnType::Varchar(_)
            | ColumnType::Json
            | ColumnType::Jsonb
            | ColumnType::Uuid => DataType::Utf8,
            ColumnType::Bytea => DataType::Binary,
            ColumnType::Timestamptz => {
                DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into()))
            }
            ColumnType::Timestamp => DataType::Timestamp(TimeUnit::Microsecond, None),
            ColumnType::Date => DataType::Date32,
            // items carry no metadata: the list type then equals what DataFusion's array
            // functions build, and the column's own `pg_type` names the element type
            ColumnType::Array(e) => DataType::new_list(e.column().arrow_type(), true),
        }
    }

    /// Arrow field for a column of this type, with the `pg_type` metadata.
    pub fn field(&self, name: &str, nullable: bool) -> Field {
        let mut md = HashMap::new();
        md.insert(PG_TYPE_KEY.to_string(), self.sql_name());
        Field::new(name, self.arrow_type(), nullable).with_metadata(md)
    }

    /// Recover the column type of an Arrow field: its metadata if present,
    /// else the natural PostgreSQL type of the Arrow type.
    pub fn of_field(field: &Field) -> Option<ColumnType> {
        if let Some(name) = field.metadata().get(PG_TYPE_KEY) {
            if let Ok(t) = ColumnType::parse(name) {
                let list = matches!(field.data_type(), DataType::List(_));
                if t.arrow_type() == *field.data_type()
                    || matches!(t, ColumnType::Numeric(_))
                    || matches!(t, ColumnType::Array(_)) && list
                {
                    return Some(t);
                }
            }
        }
        Self::of_arrow(field.data_type())
    }

    pub fn of_arrow(dt: &DataType) -> Option<ColumnType> {
        Some(match dt {
            DataType::Boolean => ColumnType::Bool,
            DataType::Int8 | DataType::Int16 | DataType::UInt8 => ColumnType::Int2,
            DataType::Int32 | DataType::UInt16 => ColumnType::Int4,
            DataType::Int64 | DataType::UInt32 => ColumnType::Int8,
            DataType::UInt64 => ColumnType::Numeric(Some((20, 0))),
            DataType::Float16 | DataType::Float32 => ColumnType::Float4,
            DataType::Float64 => ColumnType::Float8,
            DataType::Decimal128(p, s) | DataType::Decimal256(p, s) => {
                ColumnType::Numeric(Some(((*p).min(38), (*s).max(0))))
            }
            DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View | DataType::Null => {
                ColumnType::Text
            }
            DataType::Binary
            | DataType::LargeBinary
            | DataType::BinaryView
            | DataType::FixedSizeBinary(_) => ColumnType::Bytea,
            DataType::Timestamp(_, Some(_)) => ColumnType::Timestamptz,
            DataType::Timestamp(_, None) => ColumnType::Timestamp,
            DataType::Date32 | DataType::Date64 => ColumnType::Date,
            DataType::Dictionary(_, v) => return Self::of_arrow(v),
            // (a LargeList, which nothing Sluice stores makes, stays unnamed)
            DataType::List(item) => {
                ColumnType::Array(ElementType::of(Self::of_arrow(item.data_type())?)?)
            }
            _ => return None,
        })
    }

    /// Parse PostgreSQL text input for this type.
    pub fn parse_text(&self, s: &str) -> Result<ScalarValue> {
        let bad = || Error::invalid_text(self.input_name(), s);
        Ok(match self {
            ColumnType::Bool => ScalarValue::Boolean(Some(parse_bool(s).ok_or_else(bad)?)),
            ColumnType::Int2 => {
                let v = parse_int(s).ok_or_else(bad)?;
                let v = i16::try_from(v).map_err(|_| out_of_range(s, "smallint"))?;
                ScalarValue::Int16(Some(v))
            }
            ColumnType::Int4 => {
                let v = parse_int(s).ok_or_else(bad)?;
                let v = i32::try_from(v).map_err(|_| out_of_range(s, "integer"))?;
                ScalarValue::Int32(Some(v))
            }
            ColumnType::Int8 => {
                let v = parse_int(s).ok_or_else(bad)?;
                let v = i64::try_from(v).map_err(|_| out_of_range(s, "bigint"))?;
                ScalarValue::Int64(Some(v))
            }
            ColumnType::Float4 => {
                ScalarValue::Float32(Some(parse_float(s).ok_or_else(bad)? as f32))
            }
            ColumnType::Float8 => ScalarValue::Float64(Some(parse_float(s).ok_or_else(bad)?)),
            ColumnType::Numeric(ps) => {
                let (p, sc) = ps.unwrap_or(DEFAULT_NUMERIC);
                // an unconstrained numeric keeps DEFAULT_NUMERIC's scale: a
                // value with more decimals is refused, never rounded
                if ps.is_none() && decimal_places(s) > sc as i32 {
                    return Err(Error::new(
                        sqlstate::NUMERIC_VALUE_OUT_OF_RANGE,
                        format!(
                            "numeric value {} has more than {sc} decimal places, the most an unconstrained numeric column keeps",
                            s.trim()
                        ),
                    )
                    .with_detail("Declare the column numeric(p,s) to round to a fixed scale."));
                }
                let v = parse_decimal(s, p, sc)?;
                ScalarValue::Decimal128(Some(v), p, sc)
            }
            ColumnType::Text => ScalarValue::Utf8(Some(s.to_string())),
            ColumnType::Varchar(limit) => {
                if let Some(n) = limit {
                    if s.chars().count() > *n as usize {
                        return Err(Error::new(
                            sqlstate::STRING_DATA_RIGHT_TRUNCATION,
                            format!("value too long for type character varying({n})"),
                        ));
                    }
                }
                ScalarValue::Utf8(Some(s.to_string()))
            }
            ColumnType::Bytea => ScalarValue::Binary(Some(parse_bytea(s).ok_or_else(bad)?)),
            ColumnType::Timestamptz => {
                let dt = parse_timestamp(s, true).ok_or_else(bad)?;
                ScalarValue::TimestampMicrosecond(Some(dt), Some("UTC".into()))
            }
            ColumnType::Timestamp => {
                let dt = parse_timestamp(s, false).ok_or_else(bad)?;
                ScalarValue::TimestampMicrosecond(Some(dt), None)
            }
            ColumnType::Date => {
                // a timestamp's date part is a date, as in PostgreSQL
                let d = parse_date(s.trim())
                    .or_else(|| {
                        parse_timestamp(s, false)
                            .and_then(chrono::DateTime::from_timestamp_micros)
                            .map(|t| t.date_naive())
                    })
                    .ok_or_else(bad)?;
                ScalarValue::Date32(Some(date_to_days(d)))
            }
            ColumnType::Json => {
                serde_json::from_str::<serde_json::Value>(s)
                    .map_err(|_| Error::invalid_text("json", s))?;
                ScalarValue::Utf8(Some(s.to_string()))
            }
            ColumnType::Jsonb => {
                let v: serde_json::Value =
                    serde_json::from_str(s).map_err(|_| Error::invalid_text("json", s))?;
                ScalarValue::Utf8(Some(format_jsonb(&v)))
            }
            ColumnType::Uuid => {
                let u = uuid::Uuid::parse_str(s.trim()).map_err(|_| bad())?;
                ScalarValue::Utf8(Some(u.hyphenated().to_string()))
            }
            ColumnType::Array(e) => arrays::parse_text(e.column(), s)?,
        })
    }

    /// Convert any value to this column's type, validating it; text goes
    /// through [`parse_text`](Self::parse_text) so literals behave like input.
    pub fn coerce(&self, v: ScalarValue) -> Result<ScalarValue> {
        if v.is_null() {
            return ScalarValue::try_from(self.arrow_type()).map_err(Error::from);
        }
        match &v {
            ScalarValue::Utf8(Some(s))
            | ScalarValue::LargeUtf8(Some(s))
            | ScalarValue::Utf8View(Some(s)) => return self.parse_text(s),
            _ => {}
        }
        if let ColumnType::Array(e) = self {
            return arrays::coerce(e.column(), &v);
        }
        let target = self.arrow_type();
        if v.data_type() == target {
            return self.validate(v);
        }
        let ok = matches!(
            (self, &v),
            (ColumnType::Bool, ScalarValue::Boolean(_))
                | (
                    ColumnType::Int2 | ColumnType::Int4 | ColumnType::Int8 | ColumnType::Numeric(_),
                    ScalarValue::Int8(_)
                        | ScalarValue::Int16(_)
                        | ScalarValue::Int32(_)
                        | ScalarValue::Int64(_)
                        | ScalarValue::UInt8(_)
                        | ScalarValue::UInt16(_)
                        | ScalarValue::UInt32(_)
                        | ScalarValue::UInt64(_)
                        | ScalarValue::Decimal128(..)
                )
                | (
                    ColumnType::Float4 | ColumnType::Float8,
                    ScalarValue::Int8(_)
                        | ScalarValue::Int16(_)
                        | ScalarValue::Int32(_)
                        | ScalarValue::Int64(_)
                        | ScalarValue::Float32(_)
                        | ScalarValue::Float64(_)
                        | ScalarValue::Decimal128(..)
                )
                | (
                    ColumnType::Numeric(_),
                    ScalarValue::Float32(_) | ScalarValue::Float64(_)
                )
                | (
                    ColumnType::Timestamptz | ColumnType::Timestamp | ColumnType::Date,
                    ScalarValue::TimestampMicrosecond(..)
                        | ScalarValue::TimestampNanosecond(..)
                        | ScalarValue::TimestampMillisecond(..)
                        | ScalarValue::TimestampSecond(..)
                        | ScalarValue::Date32(_)
                        | ScalarValue::Date64(_)
                )
                | (
                    ColumnType::Bytea,
                    ScalarValue::Binary(_)
                        | ScalarValue::LargeBinary(_)
                        | ScalarValue::FixedSizeBinary(..)
                        | ScalarValue::BinaryView(_)
                )
        );
        if !ok {
            return Err(self.mismatch(&v));
        }
        if let (ColumnType::Numeric(_), ScalarValue::Float32(_) | ScalarValue::Float64(_)) =
            (self, &v)
        {
            return self.parse_text(&v.to_string());
        }
        let cast = v.cast_to(&target).map_err(|_| {
            Error::new(
                sqlstate::NUMERIC_VALUE_OUT_OF_RANGE,
                format!("value {v} is out of range for type {}", self.sql_name()),
            )
        })?;
        if cast.is_null() {
            return Err(Error::new(
                sqlstate::NUMERIC_VALUE_OUT_OF_RANGE,
                format!("value {v} is out of range for type {}", self.sql_name()),
            ));
        }
        self.validate(cast)
    }

    fn validate(&self, v: ScalarValue) -> Result<ScalarValue> {
        match (self, &v) {
            (ColumnType::Numeric(Some((p, s))), ScalarValue::Decimal128(Some(x), _, _)) => {
                check_precision(*x, *p, *s)?;
                Ok(v)
            }
            _ => Ok(v),
        }
    }

    /// 42804: `v` cannot be a value of this column type.
    pub(crate) fn mismatch(&self, v: &ScalarValue) -> Error {
        Error::new(
            sqlstate::DATATYPE_MISMATCH,
            format!(
                "column is of type {} but expression is of type {}",
                self.sql_name(),
                ColumnType::of_arrow(&v.data_type())
                    .map(|t| t.sql_name())
                    .unwrap_or_else(|| v.data_type().to_string())
            ),
        )
    }

    /// Whether every value of this type's Arrow type is a valid value: no length,
    /// precision or syntax rule on top of it.
    pub fn arrow_type_suffices(&self) -> bool {
        !matches!(
            self,
            ColumnType::Varchar(Some(_))
                | ColumnType::Numeric(Some(_))
                | ColumnType::Json
                | ColumnType::Jsonb
                | ColumnType::Uuid
                | ColumnType::Array(_)
        )
    }

    /// Check a whole column of already-typed values (from DataFusion) against
    /// this type's constraints: varchar length, numeric precision, uuid and
    /// json syntax. Returns a possibly normalized array.
    pub fn validate_array(&self, array: &ArrayRef) -> Result<ArrayRef> {
        use arrow::array::{AsArray, StringArray};
        match self {
            ColumnType::Varchar(Some(_))
            | ColumnType::Json
            | ColumnType::Jsonb
            | ColumnType::Uuid => {
                let strings = array.as_string::<i32>();
                let mut out = Vec::with_capacity(strings.len());
                for v in strings.iter() {
                    match v {
                        None => out.push(None),
                        Some(s) => match self.parse_text(s)? {
                            ScalarValue::Utf8(x) => out.push(x),
                            _ => return Err(Error::internal("text type parsed to non-text")),
                        },
                    }
                }
                Ok(Arc::new(StringArray::from(out)))
            }
            ColumnType::Numeric(Some((p, s))) => {
                let d = array.as_primitive::<arrow::datatypes::Decimal128Type>();
                for x in d.iter().flatten() {
                    check_precision(x, *p, *s)?;
                }
                Ok(array.clone())
            }
            ColumnType::Array(e) => arrays::coerce_column(e.column(), array),
            _ => Ok(array.clone()),
        }
    }
}

/// The element type's name of an array type's name: `text[]`, `int[3]`, `int[][]`,
/// `integer array`, `_int4`.
fn array_element_name(name: &str) -> Option<&str> {
    let t = name.trim();
    if let Some(open) = t.find('[') {
        let dims = &t[open..];
        let mut rest = dims;
        while let Some(r) = rest.strip_prefix('[') {
            let close = r.find(']')?;
            if !r[..close].trim().chars().all(|c| c.is_ascii_digit()) {
                return None;
            }
            rest = r[close + 1..].trim_start();
        }
        return rest.is_empty().then(|| t[..open].trim_end());
    }
    if t.len() > 6 && t[t.len() - 6..].eq_ignore_ascii_case(" array") {
        return Some(t[..t.len() - 6].trim_end());
    }
    let bare = t.trim_start_matches("pg_catalog.");
    bare.strip_prefix('_').filter(|e| !e.is_empty())
}

fn out_of_range(s: &str, ty: &str) -> Error {
    Error::new(
        sqlstate::NUMERIC_VALUE_OUT_OF_RANGE,
        format!("value \"{s}\" is out of range for type {ty}"),
    )
}

fn check_precision(x: i128, p: u8, s: i8) -> Result<()> {
    let limit = 10i128.pow(p as u32);
    if x.abs() >= limit {
        return Err(Error::new(
            sqlstate::NUMERIC_VALUE_OUT_OF_RANGE,
            "numeric field overflow",
        )
        .with_detail(format!(
            "A field with precision {p}, scale {s} must round to an absolute value less than 10^{}.",
            p as i32 - s as i32
        )));
    }
    Ok(())
}

pub fn parse_bool(s: &str) -> Option<bool> {
    match s.trim().to_ascii_lowercase().as_str() {
        "t" | "true" | "y" | "yes" | "on" | "1" => Some(true),
        "f" | "false" | "n" | "no" | "off" | "0" => Some(false),
        _ => None,
    }
}

fn parse_int(s: &str) -> Option<i128> {
    let t = s.trim();
    if t.is_empty() {
        return None;
    }
    t.replace('_', "").parse::<i128>().ok()
}

fn parse_float(s: &str) -> Option<f64> {
    let t = s.trim();
    match t.to_ascii_lowercase().as_str() {
        "nan" => Some(f64::NAN),
        "infinity" | "inf" | "+infinity" => Some(f64::INFINITY),
        "-infinity" | "-inf" => Some(f64::NEG_INFINITY),
        _ => t.parse::<f64>().ok(),
    }
}

/// Significant decimal places of a decimal literal (`1.50` → 1, `1e-3` → 3).
fn decimal_places(s: &str) -> i32 {
    let t = s.trim().trim_start_matches(['-', '+']);
    let (mantissa, exp) = match t.find(['e', 'E']) {
        Some(i) => (&t[..i], t[i + 1..].parse::<i32>().unwrap_or(0)),
        None => (t, 0),
    };
    let frac = mantissa.split_once('.').map(|(_, f)| f).unwrap_or("");
    frac.trim_end_matches('0').len() as i32 - exp
}

/// Parse a decimal literal into an integer scaled by `scale`, rounding half
/// away from zero like PostgreSQL, and check it fits `precision`.
pub fn parse_decimal(s: &str, precision: u8, scale: i8) -> Result<i128> {
    let bad = || Error::invalid_text("numeric", s);
    let t = s.trim();
    let (neg, body) = match t.as_bytes().first() {
        Some(b'-') => (true, &t[1..]),
        Some(b'+') => (false, &t[1..]),
        _ => (false, t),
    };
    let (mantissa, exp) = match body.find(['e', 'E']) {
        Some(i) => (&body[..i], body[i + 1..].parse::<i32>().map_err(|_| bad())?),
        None => (body, 0),
    };
    let (int_part, frac_part) = match mantissa.find('.') {
        Some(i) => (&mantissa[..i], &mantissa[i + 1..]),
        None => (mantissa, ""),
    };
    if int_part.is_empty() && frac_part.is_empty()
        || !int_part.bytes().all(|b| b.is_ascii_digit())
        || !frac_part.bytes().all(|b| b.is_ascii_digit())
    {
        return Err(bad());
    }
    let mut digits: Vec<u8> = int_part
        .bytes()
        .chain(frac_part.bytes())
        .map(|b| b - b'0')
        .collect();
    // value = digits * 10^(exp - frac_len); we want value * 10^scale
    let shift = exp - frac_part.len() as i32 + scale as i32;
    let mut round_up = false;
    if shift >= 0 {
        digits.extend(std::iter::repeat_n(0, shift as usize));
    } else {
        let drop = (-shift) as usize;
        if drop > digits.len() {
            digits.clear();
        } else {
            let keep = digits.len() - drop;
            round_up = digits[keep] >= 5;
            digits.truncate(keep);
        }
    }
    let overflow = || {
        Error::new(sqlstate::NUMERIC_VALUE_OUT_OF_RANGE, "numeric field overflow").with_detail(format!(
            "A field with precision {precision}, scale {scale} must round to an absolute value less than 10^{}.",
            precision as i32 - scale as i32
        ))
    };
    let mut v: i128 = 0;
    for d in digits {
        v = v
            .checked_mul(10)
            .and_then(|v| v.checked_add(d as i128))
            .ok_or_else(overflow)?;
    }
    if round_up {
        v = v.checked_add(1).ok_or_else(overflow)?;
    }
    if v >= 10i128.pow(precision as u32) {
        return Err(overflow());
    }
    Ok(if neg { -v } else { v })
}

fn parse_bytea(s: &str) -> Option<Vec<u8>> {
    if let Some(hex) = s.strip_prefix("\\x").or_else(|| s.strip_prefix("\\X")) {
        let hex: Vec<u8> = hex.bytes().filter(|b| !b.is_ascii_whitespace()).collect();
        if !hex.len().is_multiple_of(2) {
            return None;
        }
        return hex
            .chunks(2)
            .map(|c| u8::from_str_radix(std::str::from_utf8(c).ok()?, 16).ok())
            .collect();
    }
    // escape format: backslash followed by three octal digits or a backslash
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\' {
            if bytes.get(i + 1) == Some(&b'\\') {
                out.push(b'\\');
                i += 2;
            } else {
                let oct = s.get(i + 1..i + 4)?;
                out.push(u8::from_str_radix(oct, 8).ok()?);
                i += 4;
            }
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    Some(out)
}

fn parse_date(s: &str) -> Option<NaiveDate> {
    NaiveDate::parse_from_str(s, "%Y-%m-%d").ok()
}

pub fn date_to_days(d: NaiveDate) -> i32 {
    (d - NaiveDate::from_ymd_opt(1970, 1, 1).unwrap_or_default()).num_days() as i32
}

/// Parse `YYYY-MM-DD[( |T)HH:MM[:SS[.ffffff]]][Z|±HH[:MM]]` into microseconds
/// since the epoch. Without a zone the value is taken as UTC (the session
/// time zone); for `timestamp` a zone is ignored, as PostgreSQL does.
fn parse_timestamp(s: &str, with_zone: bool) -> Option<i64> {
    let t = s.trim();
    match t.to_ascii_lowercase().as_str() {
        "epoch" => return Some(0),
        "infinity" => return Some(i64::MAX),
        "-infinity" => return Some(i64::MIN),
        _ => {}
    }
    if t.len() < 10 {
        return None;
    }
    let date = parse_date(&t[..10])?;
    let rest = t[10..].trim_start_matches(['T', 't', ' ']);
    if rest.is_empty() {
        return Some(date.and_time(NaiveTime::MIN).and_utc().timestamp_micros());
    }
    // split the zone suffix off
    let (time_str, zone) = match rest.find(['+', '-', 'Z', 'z']) {
        Some(i) => (rest[..i].trim(), Some(rest[i..].trim())),
        None => match rest.find(' ') {
            Some(i) => (rest[..i].trim(), Some(rest[i..].trim())),
            None => (rest, None),
        },
    };
    let time = NaiveTime::parse_from_str(time_str, "%H:%M:%S%.f")
        .or_else(|_| NaiveTime::parse_from_str(time_str, "%H:%M"))
        .ok()?;
    let naive = NaiveDateTime::new(date, time);
    let offset_secs = match zone {
        None => 0,
        Some(z) if !with_zone => {
            let _ = z;
            0
        }
        Some(z) => parse_zone(z)?,
    };
    Some(naive.and_utc().timestamp_micros() - offset_secs as i64 * 1_000_000)
}

fn parse_zone(z: &str) -> Option<i32> {
    let zl = z.to_ascii_lowercase();
    if zl == "z" || zl == "utc" || zl == "gmt" || zl == "+00" || zl == "-00" {
        return Some(0);
    }
    let sign = match z.as_bytes().first()? {
        b'+' => 1,
        b'-' => -1,
        _ => return None,
    };
    let body = &z[1..];
    let (h, m, sec) = if body.contains(':') {
        let parts: Vec<&str> = body.split(':').collect();
        (
            parts.first()?.parse::<i32>().ok()?,
            parts
                .get(1)
                .map(|p| p.parse::<i32>().ok())
                .unwrap_or(Some(0))?,
            parts
                .get(2)
                .map(|p| p.parse::<i32>().ok())
                .unwrap_or(Some(0))?,
        )
    } else if body.len() == 4 {
        (body[..2].parse().ok()?, body[2..].parse().ok()?, 0)
    } else {
        (body.parse().ok()?, 0, 0)
    };
    if h > 15 || m > 59 {
        return None;
    }
    Some(sign * (h * 3600 + m * 60 + sec))
}

/// PostgreSQL's jsonb text form: object keys sorted by length then bytes,
/// duplicates resolved to the last value, `", "` and `": "` separators.
pub fn format_jsonb(v: &serde_json::Value) -> String {
    let mut out = String::new();
    write_jsonb(v, &mut out);
    out
}

fn write_jsonb(v: &serde_json::Value, out: &mut String) {
    match v {
        serde_json::Value::Object(map) => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort_by(|a, b| {
                a.len()
                    .cmp(&b.len())
                    .then_with(|| a.as_bytes().cmp(b.as_bytes()))
            });
            out.push('{');
            for (i, k) in keys.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                out.push_str(&serde_json::Value::String((*k).clone()).to_string());
                out.push_str(": ");
                if let Some(val) = map.get(*k) {
                    write_jsonb(val, out);
                }
            }
            out.push('}');
        }
        serde_json::Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                write_jsonb(item, out);
            }
            out.push(']');
        }
        other => out.push_str(&other.to_string()),
    }
}

/// Microseconds since the epoch of a wall-clock time.
pub fn micros(t: DateTime<Utc>) -> i64 {
    t.timestamp_micros()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_type_names() {
        assert_eq!(ColumnType::parse("INTEGER").unwrap(), ColumnType::Int4);
        for (name, elem) in [
            ("text[]", ElementType::Text),
            ("INT[]", ElementType::Int4),
            ("int[3]", ElementType::Int4),
            ("integer[][]", ElementType::Int4),
            ("bigint array", ElementType::Int8),
            ("_int8", ElementType::Int8),
            ("numeric(6, 2)[]", ElementType::Numeric(Some((6, 2)))),
        ] {
            let t = ColumnType::parse(name).unwrap();
            assert_eq!(t, ColumnType::Array(elem), "{name}");
            assert_eq!(ColumnType::parse(&t.sql_name()).unwrap(), t, "{name}");
            assert_eq!(
                ColumnType::of_oid(t.oid()).map(|o| o.oid()),
                Some(t.oid()),
                "{name}"
            );
        }
        assert_eq!(
            ColumnType::parse("numeric(6,2)[]")
                .unwrap()
                .with_typmod(-1)
                .sql_name(),
            "numeric(6,2)[]"
        );
        assert_eq!(
            ColumnType::Array(ElementType::Numeric(None))
                .with_typmod(ColumnType::Numeric(Some((6, 2))).typmod()),
            ColumnType::Array(ElementType::Numeric(Some((6, 2))))
        );
        assert!(ColumnType::parse("int[x]").is_err());
        assert_eq!(
            ColumnType::parse("numeric(12, 2)").unwrap(),
            ColumnType::Numeric(Some((12, 2)))
        );
        assert_eq!(
            ColumnType::parse("character varying(5)").unwrap(),
            ColumnType::Varchar(Some(5))
        );
        assert_eq!(
            ColumnType::parse("timestamp with time zone").unwrap(),
            ColumnType::Timestamptz
        );
        assert_eq!(
            ColumnType::parse("nope").unwrap_err().code,
            sqlstate::UNDEFINED_OBJECT
        );
    }

    #[test]
    fn decimals_round_half_away_from_zero() {
        assert_eq!(parse_decimal("10.505", 12, 2).unwrap(), 1051);
        assert_eq!(parse_decimal("-10.505", 12, 2).unwrap(), -1051);
        assert_eq!(parse_decimal("3", 12, 2).unwrap(), 300);
        assert_eq!(parse_decimal("1e2", 12, 2).unwrap(), 10000);
        assert_eq!(
            parse_decimal("123", 3, 1).unwrap_err().code,
            sqlstate::NUMERIC_VALUE_OUT_OF_RANGE
        );
        assert_eq!(
            parse_decimal("abc", 3, 1).unwrap_err().code,
            sqlstate::INVALID_TEXT_REPRESENTATION
        );
    }

    #[test]
    fn timestamps_with_zones() {
        let a = parse_timestamp("2024-01-02 03:04:05+00", true).unwrap();
        let b = parse_timestamp("2024-01-02T05:04:05+02:00", true).unwrap();
        assert_eq!(a, b);
        let c = parse_timestamp("2024-01-02 03:04:05.5", true).unwrap();
        assert_eq!(c - a, 500_000);
        assert!(parse_timestamp("2024-13-02", true).is_none());
    }

    #[test]
    fn text_input_validation() {
        assert!(ColumnType::Uuid.parse_text("not-a-uuid").is_err());
        assert_eq!(
            ColumnType::Varchar(Some(2))
                .parse_text("abc")
                .unwrap_err()
                .code,
            sqlstate::STRING_DATA_RIGHT_TRUNCATION
        );
        assert_eq!(
            ColumnType::Int2.parse_text("70000").unwrap_err().code,
            sqlstate::NUMERIC_VALUE_OUT_OF_RANGE
        );
        assert_eq!(
            ColumnType::Jsonb
                .parse_text("{\"b\":1,\"a\":[1,2]}")
                .unwrap(),
            ScalarValue::Utf8(Some("{\"a\": [1, 2], \"b\": 1}".into()))
        );
        assert_eq!(
            ColumnType::Bytea.parse_text("\\x0aff").unwrap(),
            ScalarValue::Binary(Some(vec![10, 255]))
        );
    }
}
