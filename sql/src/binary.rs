//! PostgreSQL binary formats (the types' `recv` functions) into values:
//! used for binary Bind parameters and `COPY ... FROM STDIN (FORMAT binary)`.
//!
//! Every decoder checks lengths and reports 08P01 for malformed input; a
//! decoded value then goes through the column type's own validation
//! (varchar length, numeric precision, json syntax).

use datafusion::scalar::ScalarValue;

use crate::error::{sqlstate, Error, Result};
use crate::types::{arrays, ColumnType};

/// Microseconds between 1970-01-01 and 2000-01-01 (PostgreSQL's epoch).
pub const PG_EPOCH_MICROS: i64 = 946_684_800_000_000;
pub const PG_EPOCH_DAYS: i32 = 10_957;

fn bad_binary(ty: &str) -> Error {
    Error::new(
        sqlstate::PROTOCOL_VIOLATION,
        format!("incorrect binary data format for type {ty}"),
    )
}

fn out_of_range(ty: &str) -> Error {
    Error::new(
        sqlstate::DATETIME_FIELD_OVERFLOW,
        format!("{ty} out of range"),
    )
}

/// Decode one value of `ty` from its binary form.
pub fn decode(ty: ColumnType, b: &[u8]) -> Result<ScalarValue> {
    let fixed = |n: usize| -> Result<&[u8]> {
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
            let text = decode_numeric(b).ok_or_else(|| bad_binary("numeric"))?;
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
            let m = m
                .checked_add(PG_EPOCH_MICROS)
                .ok_or_else(|| out_of_range("timestamptz"))?;
            ScalarValue::TimestampMicrosecond(Some(m), Some("UTC".into()))
        }
        ColumnType::Timestamp => {
            let v = fixed(8)?;
            let m = i64::from_be_bytes(v.try_into().map_err(|_| bad_binary("timestamp"))?);
            let m = m
                .checked_add(PG_EPOCH_MICROS)
                .ok_or_else(|| out_of_range("timestamp"))?;
            ScalarValue::TimestampMicrosecond(Some(m), None)
        }
        ColumnType::Date => {
            let v = fixed(4)?;
            let days = i32::from_be_bytes([v[0], v[1], v[2], v[3]])
                .checked_add(PG_EPOCH_DAYS)
                .ok_or_else(|| out_of_range("date"))?;
            ScalarValue::Date32(Some(days))
        }
        ColumnType::Array(e) => decode_array(e.column(), b)?,
    })
}

/// An array of `elem` from PostgreSQL's binary form: `ndim i32, has_nulls i32, elemtype u32`,
/// per dimension `length i32, lower_bound i32`, then each element as `len i32` (`-1` null)
/// and its bytes.
pub fn decode_array(elem: ColumnType, b: &[u8]) -> Result<ScalarValue> {
    let bad = |why: &str| {
        Error::new(
            sqlstate::PROTOCOL_VIOLATION,
            format!(
                "incorrect binary data format for type {}[]: {why}",
                elem.sql_name()
            ),
        )
    };
    let mut r = Reader(b);
    let int = |r: &mut Reader, what: &str| {
        r.take(4)
            .map(|x| i32::from_be_bytes([x[0], x[1], x[2], x[3]]))
            .ok_or_else(|| bad(&format!("ends inside its {what}")))
    };
    let ndim = int(&mut r, "dimensions")?;
    let _has_nulls = int(&mut r, "null flag")?;
    let _elem_oid = int(&mut r, "element type")?;
    let len = match ndim {
        0 => 0,
        1 => {
            let len = int(&mut r, "length")?;
            let _lower = int(&mut r, "lower bound")?;
            usize::try_from(len).map_err(|_| bad("negative length"))?
        }
        n if n > 1 => {
            return Err(Error::unsupported(format!(
                "arrays of {n} dimensions are not supported (one dimension only)"
            )))
        }
        _ => return Err(bad("negative number of dimensions")),
    };
    // grows as elements arrive: an announced length is not trusted
    let mut values = Vec::new();
    for _ in 0..len {
        let n = int(&mut r, "element length")?;
        if n == -1 {
            values.push(arrays::null_of(elem)?);
            continue;
        }
        let n = usize::try_from(n).map_err(|_| bad("negative element length"))?;
        let bytes = r.take(n).ok_or_else(|| bad("ends inside an element"))?;
        values.push(decode(elem, bytes)?);
    }
    if !r.0.is_empty() {
        return Err(bad("bytes after the last element"));
    }
    Ok(arrays::list_of(elem, &values))
}

/// The unread rest of a binary value.
struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if self.0.len() < n {
            return None;
        }
        let (head, tail) = self.0.split_at(n);
        self.0 = tail;
        Some(head)
    }
}

/// Decode PostgreSQL binary numeric into its text form.
pub fn decode_numeric(b: &[u8]) -> Option<String> {
    if b.len() < 8 {
        return None;
    }
    let n = usize::try_from(i16::from_be_bytes([b[0], b[1]])).ok()?;
    let weight = i16::from_be_bytes([b[2], b[3]]) as i32;
    let sign = u16::from_be_bytes([b[4], b[5]]);
    let dscale = u16::from_be_bytes([b[6], b[7]]) as usize;
    if sign == 0xC000 {
        return Some("NaN".into());
    }
    if b.len() < 8 + 2 * n {
        return None;
    }
    let groups: Vec<i16> = (0..n)
        .map(|i| i16::from_be_bytes([b[8 + 2 * i], b[9 + 2 * i]]))
        .collect();
    let mut int = String::new();
    let mut frac = String::new();
    for (i, g) in groups.iter().enumerate() {
        let pos = weight - i as i32;
        if pos >= 0 {
            if int.is_empty() {
                int.push_str(&g.to_string());
            } else {
                int.push_str(&format!("{g:04}"));
            }
        } else {
            frac.push_str(&format!("{g:04}"));
        }
    }
    // groups between the last digit and the decimal point are zeros
    let last_pos = weight - n as i32 + 1;
    if n > 0 && last_pos > 0 {
        for _ in 0..last_pos {
            int.push_str("0000");
        }
    }
    if weight < -1 {
        frac = format!("{}{frac}", "0000".repeat((-weight - 1) as usize));
    }
    if int.is_empty() {
        int.push('0');
    }
    while frac.len() < dscale {
        frac.push('0');
    }
    frac.truncate(dscale);
    let mut s = if frac.is_empty() {
        int
    } else {
        format!("{int}.{frac}")
    };
    if sign == 0x4000 {
        s.insert(0, '-');
    }
    Some(s)
}

/// Calls `each` with every row of a `COPY ... (FORMAT binary)` payload, in order, as raw
/// field bytes (`None` = NULL). One vector takes each row in turn (a row has at most
/// 32,767 fields): the rows are never all held at once, so a payload of many tiny rows
/// costs no more memory than what `each` keeps of them.
pub fn for_each_copy_row<'a>(
    data: &'a [u8],
    mut each: impl FnMut(&mut Vec<Option<&'a [u8]>>) -> Result<()>,
) -> Result<()> {
    const SIGNATURE: &[u8] = b"PGCOPY\n\xff\r\n\0";
    let bad = |what: &str| {
        Error::new(
            sqlstate::INVALID_TEXT_REPRESENTATION,
            format!("invalid COPY binary data: {what}"),
        )
    };
    if !data.starts_with(SIGNATURE) || data.len() < SIGNATURE.len() + 8 {
        return Err(bad("COPY file signature not recognized"));
    }
    let mut pos = SIGNATURE.len() + 4;
    let ext = i32::from_be_bytes([data[pos], data[pos + 1], data[pos + 2], data[pos + 3]]);
    pos += 4 + ext.max(0) as usize;
    let mut row = Vec::new();
    loop {
        // the -1 trailer is optional: data may also just end between rows
        if pos == data.len() {
            break;
        }
        let Some(head) = data.get(pos..pos + 2) else {
            return Err(bad("truncated row header"));
        };
        let n = i16::from_be_bytes([head[0], head[1]]);
        pos += 2;
        if n == -1 {
            break;
        }
        row.clear();
        for _ in 0..n {
            let Some(len) = data.get(pos..pos + 4) else {
                return Err(bad("truncated field length"));
            };
            let len = i32::from_be_bytes([len[0], len[1], len[2], len[3]]);
            pos += 4;
            if len < 0 {
                row.push(None);
            } else {
                let end = pos + len as usize;
                let Some(field) = data.get(pos..end) else {
                    return Err(bad("truncated field"));
                };
                row.push(Some(field));
                pos = end;
            }
        }
        each(&mut row)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::arrays::tests::ints;

    /// Reported by a client test: these overflowed (a panic in debug builds, a wrapped value
    /// in release) instead of being refused.
    #[test]
    fn extreme_binary_values_are_refused_not_overflowed() {
        for (ty, bytes) in [
            (ColumnType::Timestamptz, i64::MAX.to_be_bytes().to_vec()),
            (ColumnType::Timestamp, i64::MAX.to_be_bytes().to_vec()),
            (ColumnType::Date, i32::MAX.to_be_bytes().to_vec()),
        ] {
            let err = decode(ty, &bytes).unwrap_err();
            assert_eq!(err.code, sqlstate::DATETIME_FIELD_OVERFLOW, "{ty:?}");
        }
        assert_eq!(decode_numeric(&[0xff; 8]), None);
    }

    #[test]
    fn decodes_binary_values() {
        assert_eq!(
            decode(ColumnType::Int4, &7i32.to_be_bytes()).unwrap(),
            ScalarValue::Int32(Some(7))
        );
        assert!(decode(ColumnType::Int4, &[1, 2]).is_err());
        let ts = decode(ColumnType::Timestamptz, &0i64.to_be_bytes()).unwrap();
        assert_eq!(
            ts,
            ScalarValue::TimestampMicrosecond(Some(PG_EPOCH_MICROS), Some("UTC".into()))
        );
        // 12.5 as numeric: ndigits 2, weight 0, sign +, dscale 1, digits [12, 5000]
        let n = [0u8, 2, 0, 0, 0, 0, 0, 1, 0, 12, 0x13, 0x88];
        assert_eq!(decode_numeric(&n).unwrap(), "12.5");
    }

    /// Every row of a binary COPY payload.
    fn copy_rows(data: &[u8]) -> Result<Vec<Vec<Option<&[u8]>>>> {
        let mut rows = Vec::new();
        for_each_copy_row(data, |row| {
            rows.push(row.clone());
            Ok(())
        })?;
        Ok(rows)
    }

    #[test]
    fn splits_copy_binary_rows() {
        let mut d = b"PGCOPY\n\xff\r\n\0".to_vec();
        d.extend(0i32.to_be_bytes());
        d.extend(0i32.to_be_bytes());
        d.extend(2i16.to_be_bytes());
        d.extend(4i32.to_be_bytes());
        d.extend(9i32.to_be_bytes());
        d.extend((-1i32).to_be_bytes());
        d.extend((-1i16).to_be_bytes());
        let rows = copy_rows(&d).unwrap();
        assert_eq!(rows, vec![vec![Some(&9i32.to_be_bytes()[..]), None]]);
        // the trailer is optional (pgx omits it) ...
        assert_eq!(copy_rows(&d[..d.len() - 2]).unwrap(), rows);
        // ... but data cut inside a row is an error
        assert!(copy_rows(&d[..d.len() - 3]).is_err());
        assert!(copy_rows(&d[..d.len() - 6]).is_err());
    }

    #[test]
    fn binary_arrays_are_checked_against_their_length() {
        let mut b = Vec::new();
        for v in [1i32, 1, 23, 3, 1] {
            b.extend(v.to_be_bytes());
        }
        b.extend(4i32.to_be_bytes());
        b.extend(5i32.to_be_bytes());
        b.extend((-1i32).to_be_bytes());
        b.extend(4i32.to_be_bytes());
        b.extend(7i32.to_be_bytes());
        let v = decode_array(ColumnType::Int4, &b).unwrap();
        assert_eq!(ints(&v), vec![Some(5), None, Some(7)]);
        // every truncation is refused, as are trailing bytes and a huge announced length
        for cut in 0..b.len() {
            assert!(decode_array(ColumnType::Int4, &b[..cut]).is_err(), "{cut}");
        }
        let mut extra = b.clone();
        extra.push(0);
        assert!(decode_array(ColumnType::Int4, &extra).is_err());
        let mut huge = b[..12].to_vec();
        huge.extend(i32::MAX.to_be_bytes());
        huge.extend(1i32.to_be_bytes());
        assert!(decode_array(ColumnType::Int4, &huge).is_err());
        let mut empty = Vec::new();
        for v in [0i32, 0, 23] {
            empty.extend(v.to_be_bytes());
        }
        assert_eq!(
            ints(&decode_array(ColumnType::Int4, &empty).unwrap()),
            vec![]
        );
        let mut two_dims = Vec::new();
        for v in [2i32, 0, 23, 1, 1, 1, 1] {
            two_dims.extend(v.to_be_bytes());
        }
        let e = decode_array(ColumnType::Int4, &two_dims).unwrap_err();
        assert_eq!(e.code, sqlstate::FEATURE_NOT_SUPPORTED);
    }
}
