//! Arrow values to PostgreSQL wire values, text and binary.
//!
//! The PostgreSQL type of each result column comes from the field's
//! `pg_type` metadata when it has one (json, uuid, varchar, numeric(p,s)),
//! else from its Arrow type. Text output follows PostgreSQL's own output
//! functions (booleans `t`/`f`, `timestamptz` with a `+00` offset in the
//! session time zone, bytea as `\x` hex); binary output follows the
//! types' `send` functions. Types Sluice has no mapping for are sent as
//! text, formatted by Arrow.

use arrow::array::{Array, AsArray, RecordBatch};
use arrow::datatypes::{DataType, Field};
use arrow::util::display::{ArrayFormatter, FormatOptions};
use bytes::{BufMut, BytesMut};
use chrono::{DateTime, NaiveDate, Offset, TimeZone};
use chrono_tz::Tz;
use pgwire::api::results::{FieldFormat, FieldInfo};
use pgwire::api::Type;
use pgwire::messages::data::DataRow;
use sluice_sql::types::{oid, ColumnType};

/// Microseconds between 1970-01-01 and 2000-01-01 (PostgreSQL's epoch).
const PG_EPOCH_MICROS: i64 = 946_684_800_000_000;
const PG_EPOCH_DAYS: i32 = 10_957;

/// How a result column goes on the wire.
#[derive(Debug, Clone)]
pub struct ColumnEncoding {
    pub ty: Option<ColumnType>,
    /// For a one-dimensional array column: its element type.
    pub array_of: Option<ColumnType>,
    pub oid: u32,
    pub typmod: i32,
    /// `numeric` without a type modifier: trailing zeros are trimmed.
    pub trim_numeric: bool,
    /// `int2vector` / `oidvector` (catalog columns): text is the items joined by spaces.
    pub vector: bool,
}

pub fn column_encoding(field: &Field) -> ColumnEncoding {
    let pg_type = field
        .metadata()
        .get(sluice_sql::types::PG_TYPE_KEY)
        .map(String::as_str);
    let vector = match pg_type {
        Some("int2vector") => Some(oid::INT2VECTOR),
        Some("oidvector") => Some(oid::OIDVECTOR),
        _ => None,
    };
    match ColumnType::of_field(field) {
        Some(ty) if vector.is_none() => ColumnEncoding {
            ty: Some(ty),
            array_of: None,
            oid: ty.oid(),
            typmod: if pg_type.is_some() { ty.typmod() } else { -1 },
            trim_numeric: matches!(ty, ColumnType::Numeric(_)) && pg_type == Some("numeric"),
            vector: false,
        },
        ty => ColumnEncoding {
            ty: None,
            oid: vector.unwrap_or(oid::TEXT),
            array_of: ty.and_then(|t| t.element()),
            typmod: -1,
            trim_numeric: false,
            vector: vector.is_some(),
        },
    }
}

/// The elements of row `r` of a list column.
fn list_items(col: &dyn Array, r: usize) -> Result<arrow::array::ArrayRef, String> {
    let list = col
        .as_any()
        .downcast_ref::<arrow::array::ListArray>()
        .ok_or_else(|| format!("expected a list, got {}", col.data_type()))?;
    Ok(list.value(r))
}

/// A one-dimensional array in PostgreSQL's text format (`{1,NULL,"a b"}`): each element
/// in its type's own text form, quoted where PostgreSQL's `array_out` quotes it.
fn encode_array_text(
    col: &dyn Array,
    r: usize,
    elem: &ColumnType,
    ctx: &OutputContext,
    out: &mut BytesMut,
) -> Result<(), String> {
    let values = list_items(col, r)?;
    let trim = matches!(elem, ColumnType::Numeric(None));
    let mut item = BytesMut::new();
    out.put_u8(b'{');
    for i in 0..values.len() {
        if i > 0 {
            out.put_u8(b',');
        }
        if values.is_null(i) {
            out.put_slice(b"NULL");
            continue;
        }
        item.clear();
        encode_text(values.as_ref(), i, elem, trim, ctx, &mut item)?;
        let quote = item.is_empty()
            || item.eq_ignore_ascii_case(b"null")
            || item.iter().any(|&c| {
                matches!(c, b',' | b'{' | b'}' | b'"' | b'\\') || c.is_ascii_whitespace()
            });
        if !quote {
            out.put_slice(&item);
            continue;
        }
        out.put_u8(b'"');
        for &c in item.iter() {
            if c == b'"' || c == b'\\' {
                out.put_u8(b'\\');
            }
            out.put_u8(c);
        }
        out.put_u8(b'"');
    }
    out.put_u8(b'}');
    Ok(())
}

/// A one-dimensional array in PostgreSQL's binary format.
fn encode_array_binary(
    col: &dyn Array,
    r: usize,
    elem: &ColumnType,
    out: &mut BytesMut,
) -> Result<(), String> {
    let values = list_items(col, r)?;
    out.put_i32(1);
    out.put_i32(i32::from(values.null_count() > 0));
    out.put_u32(elem.oid());
    out.put_i32(values.len() as i32);
    out.put_i32(1);
    let trim = matches!(elem, ColumnType::Numeric(None));
    for i in 0..values.len() {
        if values.is_null(i) {
            out.put_i32(-1);
            continue;
        }
        let at = out.len();
        out.put_i32(0);
        encode_binary(values.as_ref(), i, elem, trim, out)?;
        let len = (out.len() - at - 4) as i32;
        out[at..at + 4].copy_from_slice(&len.to_be_bytes());
    }
    Ok(())
}

pub fn pg_type(oid_value: u32) -> Type {
    Type::from_oid(oid_value).unwrap_or(Type::TEXT)
}

/// RowDescription fields for a schema with per-column formats.
pub fn field_infos(
    schema: &arrow::datatypes::Schema,
    format: impl Fn(usize) -> FieldFormat,
) -> Vec<FieldInfo> {
    schema
        .fields()
        .iter()
        .enumerate()
        .map(|(i, f)| {
            let enc = column_encoding(f);
            FieldInfo::new(f.name().clone(), None, None, pg_type(enc.oid), format(i))
                .with_type_modifier(enc.typmod)
        })
        .collect()
}

/// Session-dependent output settings.
#[derive(Debug, Clone)]
pub struct OutputContext {
    pub tz: Option<Tz>,
}

impl OutputContext {
    pub fn new(timezone: &str) -> OutputContext {
        const UTC: [&str; 7] = ["utc", "etc/utc", "gmt", "z", "zulu", "+00", "+00:00"];
        let tz = if UTC.iter().any(|u| timezone.eq_ignore_ascii_case(u)) {
            None
        } else {
            timezone.parse::<Tz>().ok()
        };
        OutputContext { tz }
    }
}

/// Encodes record batches into DataRows.
pub struct RowEncoder {
    encodings: Vec<ColumnEncoding>,
    formats: Vec<FieldFormat>,
    ctx: OutputContext,
}

impl RowEncoder {
    pub fn new(
        fields: &[FieldInfo],
        schema: &arrow::datatypes::Schema,
        ctx: OutputContext,
    ) -> RowEncoder {
        RowEncoder {
            encodings: schema.fields().iter().map(|f| column_encoding(f)).collect(),
            formats: fields.iter().map(|f| f.format()).collect(),
            ctx,
        }
    }

    pub fn encode_batch(&self, batch: &RecordBatch) -> Result<Vec<DataRow>, String> {
        let n = batch.num_rows();
        let ncols = batch.num_columns();
        let fallback: Vec<Option<ArrayFormatter>> = batch
            .columns()
            .iter()
            .zip(&self.encodings)
            .map(|(c, e)| {
                if e.ty.is_none() {
                    ArrayFormatter::try_new(c.as_ref(), &FormatOptions::default()).ok()
                } else {
                    None
                }
            })
            .collect();
        let mut rows = Vec::with_capacity(n);
        let mut buf = BytesMut::with_capacity(64 * ncols);
        for r in 0..n {
            for (c, formatter) in fallback.iter().enumerate() {
                let col = batch.column(c);
                if col.is_null(r) || col.data_type().is_null() {
                    buf.put_i32(-1);
                    continue;
                }
                let len_pos = buf.len();
                buf.put_i32(0);
                let binary = self.formats.get(c).copied() == Some(FieldFormat::Binary);
                match (&self.encodings[c].ty, formatter) {
                    (Some(ty), _) => {
                        if binary {
                            encode_binary(
                                col.as_ref(),
                                r,
                                ty,
                                self.encodings[c].trim_numeric,
                                &mut buf,
                            )?
                        } else {
                            encode_text(
                                col.as_ref(),
                                r,
                                ty,
                                self.encodings[c].trim_numeric,
                                &self.ctx,
                                &mut buf,
                            )?
                        }
                    }
                    (None, _) if binary && self.encodings[c].array_of.is_some() => {
                        let elem = self.encodings[c].array_of.unwrap_or(ColumnType::Text);
                        encode_array_binary(col.as_ref(), r, &elem, &mut buf)?
                    }
                    (None, _) if self.encodings[c].vector => {
                        let text = pg_array_text(col.as_ref(), r).unwrap_or_default();
                        let items = text.trim_start_matches('{').trim_end_matches('}');
                        buf.put_slice(items.replace(',', " ").as_bytes())
                    }
                    (None, Some(f)) => match pg_array_text(col.as_ref(), r) {
                        Some(text) => buf.put_slice(text.as_bytes()),
                        None => {
                            use std::fmt::Write;
                            let mut s = String::new();
                            write!(s, "{}", f.value(r)).map_err(|e| e.to_string())?;
                            buf.put_slice(s.as_bytes());
                        }
                    },
                    (None, None) => buf.put_slice(b"?"),
                }
                let len = (buf.len() - len_pos - 4) as i32;
                buf[len_pos..len_pos + 4].copy_from_slice(&len.to_be_bytes());
            }
            rows.push(DataRow::new(buf.split(), ncols as i16));
        }
        Ok(rows)
    }
}

fn int_value(col: &dyn Array, r: usize) -> Option<i128> {
    use arrow::datatypes::*;
    Some(match col.data_type() {
        DataType::Int8 => col.as_primitive::<Int8Type>().value(r) as i128,
        DataType::Int16 => col.as_primitive::<Int16Type>().value(r) as i128,
        DataType::Int32 => col.as_primitive::<Int32Type>().value(r) as i128,
        DataType::Int64 => col.as_primitive::<Int64Type>().value(r) as i128,
        DataType::UInt8 => col.as_primitive::<UInt8Type>().value(r) as i128,
        DataType::UInt16 => col.as_primitive::<UInt16Type>().value(r) as i128,
        DataType::UInt32 => col.as_primitive::<UInt32Type>().value(r) as i128,
        DataType::UInt64 => col.as_primitive::<UInt64Type>().value(r) as i128,
        _ => return None,
    })
}

fn float_value(col: &dyn Array, r: usize) -> Option<f64> {
    use arrow::datatypes::*;
    Some(match col.data_type() {
        DataType::Float16 => col.as_primitive::<Float16Type>().value(r).to_f64(),
        DataType::Float32 => col.as_primitive::<Float32Type>().value(r) as f64,
        DataType::Float64 => col.as_primitive::<Float64Type>().value(r),
        _ => return None,
    })
}

/// A text-like value that is its own text form (text, varchar, json,
/// uuid kept as a string): the caller may copy it straight from the array.
pub fn plain_text<'a>(col: &'a dyn Array, r: usize, ty: &ColumnType) -> Option<&'a str> {
    match ty {
        ColumnType::Text
        | ColumnType::Varchar(_)
        | ColumnType::Json
        | ColumnType::Jsonb
        | ColumnType::Uuid => string_value(col, r),
        _ => None,
    }
}

fn string_value(col: &dyn Array, r: usize) -> Option<&str> {
    match col.data_type() {
        DataType::Utf8 => Some(col.as_string::<i32>().value(r)),
        DataType::LargeUtf8 => Some(col.as_string::<i64>().value(r)),
        DataType::Utf8View => Some(col.as_string_view().value(r)),
        _ => None,
    }
}

fn binary_value(col: &dyn Array, r: usize) -> Option<&[u8]> {
    match col.data_type() {
        DataType::Binary => Some(col.as_binary::<i32>().value(r)),
        DataType::LargeBinary => Some(col.as_binary::<i64>().value(r)),
        DataType::BinaryView => Some(col.as_binary_view().value(r)),
        DataType::FixedSizeBinary(_) => Some(col.as_fixed_size_binary().value(r)),
        _ => None,
    }
}

/// (unscaled value, scale) of a decimal or integer cell.
fn decimal_value(col: &dyn Array, r: usize) -> Option<(i128, i8)> {
    match col.data_type() {
        DataType::Decimal128(_, s) => Some((
            col.as_primitive::<arrow::datatypes::Decimal128Type>()
                .value(r),
            *s,
        )),
        DataType::Decimal256(_, s) => {
            let v = col
                .as_primitive::<arrow::datatypes::Decimal256Type>()
                .value(r);
            v.to_i128().map(|x| (x, *s))
        }
        _ => int_value(col, r).map(|v| (v, 0)),
    }
}

fn micros_value(col: &dyn Array, r: usize) -> Option<i64> {
    use arrow::datatypes::*;
    Some(match col.data_type() {
        DataType::Timestamp(TimeUnit::Second, _) => {
            col.as_primitive::<TimestampSecondType>().value(r) * 1_000_000
        }
        DataType::Timestamp(TimeUnit::Millisecond, _) => {
            col.as_primitive::<TimestampMillisecondType>().value(r) * 1_000
        }
        DataType::Timestamp(TimeUnit::Microsecond, _) => {
            col.as_primitive::<TimestampMicrosecondType>().value(r)
        }
        DataType::Timestamp(TimeUnit::Nanosecond, _) => col
            .as_primitive::<TimestampNanosecondType>()
            .value(r)
            .div_euclid(1_000),
        DataType::Date32 => col.as_primitive::<Date32Type>().value(r) as i64 * 86_400_000_000,
        DataType::Date64 => col.as_primitive::<Date64Type>().value(r) * 1_000,
        _ => return None,
    })
}

fn days_value(col: &dyn Array, r: usize) -> Option<i32> {
    use arrow::datatypes::*;
    match col.data_type() {
        DataType::Date32 => Some(col.as_primitive::<Date32Type>().value(r)),
        _ => micros_value(col, r).map(|m| m.div_euclid(86_400_000_000) as i32),
    }
}

fn bool_value(col: &dyn Array, r: usize) -> Option<bool> {
    match col.data_type() {
        DataType::Boolean => Some(col.as_boolean().value(r)),
        _ => None,
    }
}

fn mismatch(ty: &ColumnType, col: &dyn Array) -> String {
    format!("cannot encode {} as {}", col.data_type(), ty.sql_name())
}

/// A list value as a PostgreSQL array literal (`{1,2}`, `{a,"b c",NULL}`),
/// or `None` if `col` is not a list.
pub fn pg_array_text(col: &dyn Array, r: usize) -> Option<String> {
    let list = col.as_any().downcast_ref::<arrow::array::ListArray>()?;
    let values = list.value(r);
    let f = ArrayFormatter::try_new(values.as_ref(), &FormatOptions::default()).ok()?;
    let quote_strings = matches!(
        values.data_type(),
        arrow::datatypes::DataType::Utf8
            | arrow::datatypes::DataType::LargeUtf8
            | arrow::datatypes::DataType::Utf8View
    );
    let booleans = values.data_type() == &arrow::datatypes::DataType::Boolean;
    let mut out = String::from("{");
    for i in 0..values.len() {
        if i > 0 {
            out.push(',');
        }
        if values.is_null(i) {
            out.push_str("NULL");
            continue;
        }
        let v = match bool_value(values.as_ref(), i) {
            Some(b) if booleans => (if b { "t" } else { "f" }).to_string(),
            _ => f.value(i).to_string(),
        };
        let needs_quotes = quote_strings
            && (v.is_empty()
                || v.eq_ignore_ascii_case("null")
                || v.chars()
                    .any(|c| matches!(c, ',' | '{' | '}' | '"' | '\\') || c.is_whitespace()));
        if needs_quotes {
            out.push('"');
            for c in v.chars() {
                if c == '"' || c == '\\' {
                    out.push('\\');
                }
                out.push(c);
            }
            out.push('"');
        } else {
            out.push_str(&v);
        }
    }
    out.push('}');
    Some(out)
}

pub fn encode_text(
    col: &dyn Array,
    r: usize,
    ty: &ColumnType,
    trim_numeric: bool,
    ctx: &OutputContext,
    out: &mut BytesMut,
) -> Result<(), String> {
    use std::fmt::Write;
    let mut s = String::new();
    match ty {
        ColumnType::Bool => {
            out.put_slice(if bool_value(col, r).ok_or_else(|| mismatch(ty, col))? {
                b"t"
            } else {
                b"f"
            })
        }
        ColumnType::Int2 | ColumnType::Int4 | ColumnType::Int8 => {
            let mut digits = itoa::Buffer::new();
            // bigint, the common case, without widening
            let text = match col.as_primitive_opt::<arrow::datatypes::Int64Type>() {
                Some(a) => digits.format(a.value(r)),
                None => digits.format(int_value(col, r).ok_or_else(|| mismatch(ty, col))?),
            };
            out.put_slice(text.as_bytes());
        }
        ColumnType::Float4 | ColumnType::Float8 => {
            let v = float_value(col, r).ok_or_else(|| mismatch(ty, col))?;
            let single = matches!(ty, ColumnType::Float4);
            let v = if single { v as f32 as f64 } else { v };
            write_float(v, single, out).map_err(|e| e.to_string())?;
        }
        ColumnType::Numeric(_) => {
            let (v, scale) = decimal_value(col, r).ok_or_else(|| mismatch(ty, col))?;
            out.put_slice(format_decimal(v, scale, trim_numeric).as_bytes());
        }
        ColumnType::Text
        | ColumnType::Varchar(_)
        | ColumnType::Json
        | ColumnType::Jsonb
        | ColumnType::Uuid => out.put_slice(
            plain_text(col, r, ty)
                .ok_or_else(|| mismatch(ty, col))?
                .as_bytes(),
        ),
        ColumnType::Array(e) => encode_array_text(col, r, &e.column(), ctx, out)?,
        ColumnType::Bytea => {
            let b = binary_value(col, r).ok_or_else(|| mismatch(ty, col))?;
            out.put_slice(b"\\x");
            for byte in b {
                write!(s, "{byte:02x}").map_err(|e| e.to_string())?;
            }
            out.put_slice(s.as_bytes());
        }
        ColumnType::Timestamptz => {
            let m = micros_value(col, r).ok_or_else(|| mismatch(ty, col))?;
            match ctx.tz {
                // the common case, without intermediate strings
                None if put_timestamp_utc(m, out) => out.put_slice(b"+00"),
                _ => out.put_slice(format_timestamptz(m, ctx).as_bytes()),
            }
        }
        ColumnType::Timestamp => {
            let m = micros_value(col, r).ok_or_else(|| mismatch(ty, col))?;
            let dt = DateTime::from_timestamp_micros(m)
                .ok_or("timestamp out of range")?
                .naive_utc();
            out.put_slice(format_naive(dt).as_bytes());
        }
        ColumnType::Date => {
            let d = days_value(col, r).ok_or_else(|| mismatch(ty, col))?;
            let date =
                NaiveDate::from_num_days_from_ce_opt(d + 719_163).ok_or("date out of range")?;
            out.put_slice(date.format("%Y-%m-%d").to_string().as_bytes());
        }
    }
    Ok(())
}

/// `YYYY-MM-DD HH:MM:SS[.ffffff]` (trailing zeros of the fraction trimmed)
/// for years 1..=9999; false (nothing written) outside them.
fn put_timestamp_utc(micros: i64, out: &mut BytesMut) -> bool {
    use chrono::{Datelike, Timelike};
    let Some(dt) = DateTime::from_timestamp_micros(micros) else {
        return false;
    };
    let (date, time) = (dt.date_naive(), dt.time());
    if !(1..=9999).contains(&date.year()) {
        return false;
    }
    fn two(out: &mut BytesMut, v: u32) {
        out.put_slice(&[b'0' + (v / 10) as u8, b'0' + (v % 10) as u8]);
    }
    let y = date.year() as u32;
    two(out, y / 100);
    two(out, y % 100);
    out.put_u8(b'-');
    two(out, date.month());
    out.put_u8(b'-');
    two(out, date.day());
    out.put_u8(b' ');
    two(out, time.hour());
    out.put_u8(b':');
    two(out, time.minute());
    out.put_u8(b':');
    two(out, time.second());
    let mut frac = micros.rem_euclid(1_000_000) as u32;
    if frac != 0 {
        let mut digits = 6;
        while frac.is_multiple_of(10) {
            frac /= 10;
            digits -= 1;
        }
        let mut buf = [0u8; 7];
        buf[0] = b'.';
        for d in (1..=digits).rev() {
            buf[d] = b'0' + (frac % 10) as u8;
            frac /= 10;
        }
        out.put_slice(&buf[..=digits]);
    }
    true
}

fn format_naive(dt: chrono::NaiveDateTime) -> String {
    let mut s = dt.format("%Y-%m-%d %H:%M:%S").to_string();
    let micros = dt.and_utc().timestamp_subsec_micros();
    if micros != 0 {
        let frac = format!("{micros:06}");
        s.push('.');
        s.push_str(frac.trim_end_matches('0'));
    }
    s
}

fn format_timestamptz(micros: i64, ctx: &OutputContext) -> String {
    let Some(utc) = DateTime::from_timestamp_micros(micros) else {
        return if micros > 0 {
            "infinity".into()
        } else {
            "-infinity".into()
        };
    };
    let (naive, offset_secs) = match &ctx.tz {
        None => (utc.naive_utc(), 0),
        Some(tz) => {
            let local = tz.from_utc_datetime(&utc.naive_utc());
            (local.naive_local(), local.offset().fix().local_minus_utc())
        }
    };
    let mut s = format_naive(naive);
    let sign = if offset_secs < 0 { '-' } else { '+' };
    let a = offset_secs.abs();
    s.push(sign);
    s.push_str(&format!("{:02}", a / 3600));
    if a % 3600 != 0 {
        s.push_str(&format!(":{:02}", (a % 3600) / 60));
    }
    s
}

/// PostgreSQL's float output (shortest round-trip digits, exponent past
/// 1e15 or below 1e-4).
pub fn format_float(v: f64, single: bool) -> String {
    let mut s = String::new();
    // writing to a String cannot fail
    let _ = write_float(v, single, &mut s);
    s
}

/// [`format_float`] into `out`, without an intermediate string for the
/// plain (non-exponent) form.
pub fn write_float(v: f64, single: bool, out: &mut impl std::fmt::Write) -> std::fmt::Result {
    if v.is_nan() {
        return out.write_str("NaN");
    }
    if v.is_infinite() {
        return out.write_str(if v > 0.0 { "Infinity" } else { "-Infinity" });
    }
    let abs = v.abs();
    let threshold = if single { 1e6 } else { 1e15 };
    if abs != 0.0 && (abs >= threshold * 10.0 || abs < 1e-4) {
        let e = if single {
            format!("{:e}", v as f32)
        } else {
            format!("{v:e}")
        };
        // Rust: 1.5e-5 / 1e21 ; PostgreSQL: 1.5e-05 / 1e+21
        match e.split_once('e') {
            Some((m, exp)) => {
                let (sign, digits) = match exp.strip_prefix('-') {
                    Some(d) => ('-', d),
                    None => ('+', exp),
                };
                write!(out, "{m}e{sign}{digits:0>2}")
            }
            None => out.write_str(&e),
        }
    } else if single {
        write!(out, "{}", v as f32)
    } else {
        write!(out, "{v}")
    }
}

pub fn format_decimal(v: i128, scale: i8, trim: bool) -> String {
    let neg = v < 0;
    let digits = v.unsigned_abs().to_string();
    let mut s = if scale <= 0 {
        let mut d = digits;
        d.extend(std::iter::repeat_n('0', (-scale) as usize));
        d
    } else {
        let scale = scale as usize;
        let padded = format!("{digits:0>width$}", width = scale + 1);
        let (int, frac) = padded.split_at(padded.len() - scale);
        let frac = if trim {
            frac.trim_end_matches('0')
        } else {
            frac
        };
        if frac.is_empty() {
            int.to_string()
        } else {
            format!("{int}.{frac}")
        }
    };
    if neg && s.chars().any(|c| c != '0' && c != '.') {
        s.insert(0, '-');
    }
    s
}

/// `trim_numeric`: as in text, an unconstrained `numeric` is sent with the
/// scale the value needs (no trailing zeros).
pub fn encode_binary(
    col: &dyn Array,
    r: usize,
    ty: &ColumnType,
    trim_numeric: bool,
    out: &mut BytesMut,
) -> Result<(), String> {
    match ty {
        ColumnType::Bool => out.put_u8(bool_value(col, r).ok_or_else(|| mismatch(ty, col))? as u8),
        ColumnType::Int2 => out.put_i16(int_value(col, r).ok_or_else(|| mismatch(ty, col))? as i16),
        ColumnType::Int4 => out.put_i32(int_value(col, r).ok_or_else(|| mismatch(ty, col))? as i32),
        ColumnType::Int8 => out.put_i64(int_value(col, r).ok_or_else(|| mismatch(ty, col))? as i64),
        ColumnType::Float4 => {
            out.put_f32(float_value(col, r).ok_or_else(|| mismatch(ty, col))? as f32)
        }
        ColumnType::Float8 => out.put_f64(float_value(col, r).ok_or_else(|| mismatch(ty, col))?),
        ColumnType::Numeric(_) => {
            let (mut v, mut scale) = decimal_value(col, r).ok_or_else(|| mismatch(ty, col))?;
            while trim_numeric && scale > 0 && v % 10 == 0 {
                v /= 10;
                scale -= 1;
            }
            encode_numeric_binary(v, scale, out);
        }
        ColumnType::Text | ColumnType::Varchar(_) | ColumnType::Json => out.put_slice(
            string_value(col, r)
                .ok_or_else(|| mismatch(ty, col))?
                .as_bytes(),
        ),
        ColumnType::Jsonb => {
            out.put_u8(1);
            out.put_slice(
                string_value(col, r)
                    .ok_or_else(|| mismatch(ty, col))?
                    .as_bytes(),
            )
        }
        ColumnType::Uuid => {
            let s = string_value(col, r).ok_or_else(|| mismatch(ty, col))?;
            let u = uuid::Uuid::parse_str(s).map_err(|e| e.to_string())?;
            out.put_slice(u.as_bytes());
        }
        ColumnType::Bytea => out.put_slice(binary_value(col, r).ok_or_else(|| mismatch(ty, col))?),
        ColumnType::Array(e) => encode_array_binary(col, r, &e.column(), out)?,
        ColumnType::Timestamptz | ColumnType::Timestamp => {
            out.put_i64(micros_value(col, r).ok_or_else(|| mismatch(ty, col))? - PG_EPOCH_MICROS)
        }
        ColumnType::Date => {
            out.put_i32(days_value(col, r).ok_or_else(|| mismatch(ty, col))? - PG_EPOCH_DAYS)
        }
    }
    Ok(())
}

/// PostgreSQL's binary numeric: ndigits, weight, sign, dscale, base-10000 digits.
pub fn encode_numeric_binary(v: i128, scale: i8, out: &mut BytesMut) {
    let dscale = scale.max(0) as usize;
    let digits = v.unsigned_abs().to_string();
    let digits = if scale < 0 {
        format!("{digits}{}", "0".repeat((-scale) as usize))
    } else {
        digits
    };
    let padded = format!("{digits:0>width$}", width = dscale + 1);
    let (int, frac) = padded.split_at(padded.len() - dscale);
    let int_pad = (4 - int.len() % 4) % 4;
    let int = format!("{}{int}", "0".repeat(int_pad));
    let frac_pad = (4 - frac.len() % 4) % 4;
    let frac = format!("{frac}{}", "0".repeat(frac_pad));
    let mut groups: Vec<i16> = int
        .as_bytes()
        .chunks(4)
        .chain(frac.as_bytes().chunks(4))
        .map(|c| {
            std::str::from_utf8(c)
                .ok()
                .and_then(|s| s.parse().ok())
                .unwrap_or(0)
        })
        .collect();
    let mut weight = (int.len() / 4) as i16 - 1;
    while groups.first() == Some(&0) {
        groups.remove(0);
        weight -= 1;
    }
    while groups.last() == Some(&0) {
        groups.pop();
    }
    if groups.is_empty() {
        weight = 0;
    }
    out.put_i16(groups.len() as i16);
    out.put_i16(weight);
    out.put_u16(if v < 0 && !groups.is_empty() {
        0x4000
    } else {
        0
    });
    out.put_u16(dscale as u16);
    for g in groups {
        out.put_i16(g);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numeric_binary_round_trips() {
        for (v, s, text) in [
            (1050i128, 2i8, "10.50"),
            (-3, 0, "-3"),
            (123456789, 4, "12345.6789"),
            (5, 3, "0.005"),
            (0, 2, "0.00"),
            (100000000, 0, "100000000"),
        ] {
            let mut b = BytesMut::new();
            encode_numeric_binary(v, s, &mut b);
            assert_eq!(
                sluice_sql::binary::decode_numeric(&b).unwrap(),
                text,
                "value {v} scale {s}"
            );
            assert_eq!(format_decimal(v, s, false), text);
        }
    }

    #[test]
    fn floats_like_postgres() {
        assert_eq!(format_float(1.5, false), "1.5");
        assert_eq!(format_float(1e21, false), "1e+21");
        assert_eq!(format_float(0.000015, false), "1.5e-05");
        assert_eq!(format_float(f64::NAN, false), "NaN");
    }

    #[test]
    fn utc_fast_path_matches_the_formatter() {
        let ctx = OutputContext::new("UTC");
        for m in [
            0,
            1,
            -1,
            1_704_164_645_500_000,
            1_704_164_645_000_010,
            -62_135_596_800_000_000, // 0001-01-01
            253_402_300_799_999_999, // 9999-12-31 23:59:59.999999
            -2_208_988_800_123_456,
        ] {
            let mut out = BytesMut::new();
            assert!(put_timestamp_utc(m, &mut out), "{m}");
            out.put_slice(b"+00");
            assert_eq!(
                std::str::from_utf8(&out).unwrap(),
                format_timestamptz(m, &ctx)
            );
        }
        assert!(!put_timestamp_utc(
            253_402_300_800_000_000,
            &mut BytesMut::new()
        ));
    }

    #[test]
    fn timestamptz_offsets() {
        let ctx = OutputContext::new("UTC");
        assert_eq!(
            format_timestamptz(1_704_164_645_500_000, &ctx),
            "2024-01-02 03:04:05.5+00"
        );
        let ny = OutputContext::new("America/New_York");
        assert_eq!(
            format_timestamptz(1_704_164_645_000_000, &ny),
            "2024-01-01 22:04:05-05"
        );
    }
}
