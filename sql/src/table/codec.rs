//! Byte encodings of table keys and rows.
//!
//! Keys are order-preserving (memcomparable): comparing two encoded keys
//! byte-wise orders them as their values, column by column, so the store
//! iterates a table in primary-key order. Rows are a compact positional
//! encoding of every column: one presence byte, then the value. Both are
//! defined here, independent of any library's in-memory format, because
//! they are stored on disk and carried in replicated commands.

use std::sync::Arc;

use arrow::array::{new_null_array, Array, ArrayRef};
use arrow::datatypes::DataType;
use datafusion::scalar::ScalarValue;

use crate::error::{Error, Result};
use crate::types::ColumnType;

/// Encode primary-key values (never NULL: checked by the caller).
pub fn encode_key(values: &[&ScalarValue]) -> Result<Vec<u8>> {
    let mut out = Vec::with_capacity(16);
    for v in values {
        match v {
            ScalarValue::Boolean(Some(b)) => out.push(*b as u8),
            ScalarValue::Int16(Some(n)) => out.extend(((*n as u16) ^ 0x8000).to_be_bytes()),
            ScalarValue::Int32(Some(n)) | ScalarValue::Date32(Some(n)) => {
                out.extend(((*n as u32) ^ 0x8000_0000).to_be_bytes())
            }
            ScalarValue::Int64(Some(n)) | ScalarValue::TimestampMicrosecond(Some(n), _) => {
                out.extend(((*n as u64) ^ (1 << 63)).to_be_bytes())
            }
            ScalarValue::Float32(Some(f)) => {
                let bits = f.to_bits();
                let ordered = if bits >> 31 == 1 {
                    !bits
                } else {
                    bits | 1 << 31
                };
                out.extend(ordered.to_be_bytes())
            }
            ScalarValue::Float64(Some(f)) => {
                let bits = f.to_bits();
                let ordered = if bits >> 63 == 1 {
                    !bits
                } else {
                    bits | 1 << 63
                };
                out.extend(ordered.to_be_bytes())
            }
            ScalarValue::Decimal128(Some(n), _, _) => {
                out.extend(((*n as u128) ^ (1 << 127)).to_be_bytes())
            }
            ScalarValue::Utf8(Some(s)) => escaped(&mut out, s.as_bytes()),
            ScalarValue::Binary(Some(b)) => escaped(&mut out, b),
            other => return Err(Error::internal(format!("cannot encode {other:?} as a key"))),
        }
    }
    Ok(out)
}

/// Variable-length bytes keeping order: 0x00 becomes 0x00 0xFF, and 0x00
/// 0x00 ends the value (so "a" sorts before "a\0" and "ab").
fn escaped(out: &mut Vec<u8>, bytes: &[u8]) {
    for &b in bytes {
        out.push(b);
        if b == 0 {
            out.push(0xFF);
        }
    }
    out.extend([0, 0]);
}

/// Encode one row: every column in table order.
pub fn encode_row(values: &[ScalarValue]) -> Result<Vec<u8>> {
    let mut out = Vec::with_capacity(values.len() * 9);
    for v in values {
        encode_value(&mut out, v)?;
    }
    Ok(out)
}

/// One value: a presence byte, then the value; a list is its element count and each
/// element the same way.
fn encode_value(out: &mut Vec<u8>, v: &ScalarValue) -> Result<()> {
    if v.is_null() {
        out.push(0);
        return Ok(());
    }
    out.push(1);
    match v {
        ScalarValue::Boolean(Some(b)) => out.push(*b as u8),
        ScalarValue::Int16(Some(n)) => out.extend(n.to_le_bytes()),
        ScalarValue::Int32(Some(n)) | ScalarValue::Date32(Some(n)) => out.extend(n.to_le_bytes()),
        ScalarValue::Int64(Some(n)) | ScalarValue::TimestampMicrosecond(Some(n), _) => {
            out.extend(n.to_le_bytes())
        }
        ScalarValue::Float32(Some(f)) => out.extend(f.to_le_bytes()),
        ScalarValue::Float64(Some(f)) => out.extend(f.to_le_bytes()),
        ScalarValue::Decimal128(Some(n), _, _) => out.extend(n.to_le_bytes()),
        ScalarValue::Utf8(Some(s)) => {
            out.extend((s.len() as u32).to_le_bytes());
            out.extend(s.as_bytes());
        }
        ScalarValue::Binary(Some(b)) => {
            out.extend((b.len() as u32).to_le_bytes());
            out.extend(b);
        }
        ScalarValue::List(l) if l.len() == 1 => {
            let items = l.value(0);
            out.extend((items.len() as u32).to_le_bytes());
            for i in 0..items.len() {
                encode_value(out, &ScalarValue::try_from_array(&items, i)?)?;
            }
        }
        other => return Err(Error::internal(format!("cannot encode {other:?} in a row"))),
    }
    Ok(())
}

struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8]> {
        let end = self
            .at
            .checked_add(n)
            .filter(|&e| e <= self.bytes.len())
            .ok_or_else(|| Error::internal("truncated row in table storage"))?;
        let out = &self.bytes[self.at..end];
        self.at = end;
        Ok(out)
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N]> {
        let mut a = [0u8; N];
        a.copy_from_slice(self.take(N)?);
        Ok(a)
    }
}

/// Decode a row written by [`encode_row`] for columns of `types`.
pub fn decode_row(bytes: &[u8], types: &[ColumnType]) -> Result<Vec<ScalarValue>> {
    let mut r = Reader { bytes, at: 0 };
    types
        .iter()
        .map(|ty| decode_value(&mut r, &ty.arrow_type()))
        .collect()
}

/// One value written by [`encode_value`], of Arrow type `dt`.
fn decode_value(r: &mut Reader, dt: &DataType) -> Result<ScalarValue> {
    if r.take(1)?[0] == 0 {
        return Ok(ScalarValue::try_from(dt)?);
    }
    Ok(match dt {
        DataType::Boolean => ScalarValue::Boolean(Some(r.take(1)?[0] != 0)),
        DataType::Int16 => ScalarValue::Int16(Some(i16::from_le_bytes(r.array()?))),
        DataType::Int32 => ScalarValue::Int32(Some(i32::from_le_bytes(r.array()?))),
        DataType::Date32 => ScalarValue::Date32(Some(i32::from_le_bytes(r.array()?))),
        DataType::Int64 => ScalarValue::Int64(Some(i64::from_le_bytes(r.array()?))),
        DataType::Timestamp(_, tz) => {
            ScalarValue::TimestampMicrosecond(Some(i64::from_le_bytes(r.array()?)), tz.clone())
        }
        DataType::Float32 => ScalarValue::Float32(Some(f32::from_le_bytes(r.array()?))),
        DataType::Float64 => ScalarValue::Float64(Some(f64::from_le_bytes(r.array()?))),
        DataType::Decimal128(p, s) => {
            ScalarValue::Decimal128(Some(i128::from_le_bytes(r.array()?)), *p, *s)
        }
        DataType::Utf8 => {
            let n = u32::from_le_bytes(r.array()?) as usize;
            let s = std::str::from_utf8(r.take(n)?)
                .map_err(|_| Error::internal("invalid UTF-8 in table storage"))?;
            ScalarValue::Utf8(Some(s.to_string()))
        }
        DataType::Binary => {
            let n = u32::from_le_bytes(r.array()?) as usize;
            ScalarValue::Binary(Some(r.take(n)?.to_vec()))
        }
        DataType::List(item) => {
            let n = u32::from_le_bytes(r.array()?) as usize;
            // grows as elements decode: a corrupt count cannot allocate
            let mut items = Vec::new();
            for _ in 0..n {
                items.push(decode_value(r, item.data_type())?);
            }
            ScalarValue::List(ScalarValue::new_list_nullable(&items, item.data_type()))
        }
        other => return Err(Error::internal(format!("no row decoding for {other}"))),
    })
}

/// Columns (one array per type) from decoded rows.
pub fn rows_to_arrays(rows: Vec<Vec<ScalarValue>>, types: &[ColumnType]) -> Result<Vec<ArrayRef>> {
    let mut cols: Vec<Vec<ScalarValue>> = vec![Vec::with_capacity(rows.len()); types.len()];
    for row in rows {
        for (c, v) in cols.iter_mut().zip(row) {
            c.push(v);
        }
    }
    cols.into_iter()
        .zip(types)
        .map(|(values, ty)| {
            if values.is_empty() {
                Ok(new_null_array(&ty.arrow_type(), 0))
            } else {
                Ok(ScalarValue::iter_to_array(values)?)
            }
        })
        .collect()
}

/// Row bytes shared between the store, snapshots and commands.
pub type RowBytes = Arc<[u8]>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_sort_like_their_values() {
        let ints = [-5i64, -1, 0, 3, 1 << 40];
        let keys: Vec<Vec<u8>> = ints
            .iter()
            .map(|n| encode_key(&[&ScalarValue::Int64(Some(*n))]).unwrap())
            .collect();
        assert!(keys.windows(2).all(|w| w[0] < w[1]));
        let texts = ["", "a", "a\0", "ab", "b"];
        let keys: Vec<Vec<u8>> = texts
            .iter()
            .map(|s| encode_key(&[&ScalarValue::Utf8(Some(s.to_string()))]).unwrap())
            .collect();
        assert!(keys.windows(2).all(|w| w[0] < w[1]));
        // composite keys: the first column decides first
        let k = |a: &str, b: i32| {
            encode_key(&[
                &ScalarValue::Utf8(Some(a.into())),
                &ScalarValue::Int32(Some(b)),
            ])
            .unwrap()
        };
        assert!(k("a", 9) < k("ab", 0));
        assert!(k("a", -1) < k("a", 2));
    }

    #[test]
    fn rows_round_trip() {
        let types = [
            ColumnType::Int4,
            ColumnType::Text,
            ColumnType::Numeric(Some((12, 2))),
            ColumnType::Timestamptz,
            ColumnType::Bool,
            ColumnType::Bytea,
            ColumnType::Float8,
        ];
        let row = vec![
            ScalarValue::Int32(Some(-7)),
            ScalarValue::Utf8(Some("héllo".into())),
            ScalarValue::Decimal128(Some(1234), 12, 2),
            ScalarValue::TimestampMicrosecond(Some(1_700_000_000_000_000), Some("UTC".into())),
            ScalarValue::Boolean(None),
            ScalarValue::Binary(Some(vec![0, 1, 2])),
            ScalarValue::Float64(Some(2.5)),
        ];
        let bytes = encode_row(&row).unwrap();
        assert_eq!(decode_row(&bytes, &types).unwrap(), row);
        assert!(decode_row(&bytes[..bytes.len() - 1], &types).is_err());
    }

    #[test]
    fn array_rows_round_trip_and_truncations_are_refused() {
        use crate::types::ElementType;
        let types = [
            ColumnType::Array(ElementType::Text),
            ColumnType::Array(ElementType::Int8),
            ColumnType::Array(ElementType::Numeric(Some((6, 2)))),
            ColumnType::Array(ElementType::Bool),
        ];
        let text = |v: &[Option<&str>]| {
            let items: Vec<ScalarValue> = v
                .iter()
                .map(|s| ScalarValue::Utf8(s.map(str::to_string)))
                .collect();
            ScalarValue::List(ScalarValue::new_list_nullable(&items, &DataType::Utf8))
        };
        let ints = ScalarValue::List(ScalarValue::new_list_nullable(
            &[ScalarValue::Int64(Some(-1)), ScalarValue::Int64(None)],
            &DataType::Int64,
        ));
        let empty = ScalarValue::List(ScalarValue::new_list_nullable(
            &[],
            &DataType::Decimal128(6, 2),
        ));
        let row = vec![
            text(&[Some("a"), None, Some("")]),
            ints,
            empty,
            ScalarValue::try_from(&types[3].arrow_type()).unwrap(),
        ];
        let bytes = encode_row(&row).unwrap();
        assert_eq!(decode_row(&bytes, &types).unwrap(), row);
        for cut in 0..bytes.len() {
            assert!(decode_row(&bytes[..cut], &types).is_err(), "{cut}");
        }
        // a corrupt element count fails on the missing bytes, allocating nothing up front
        let mut huge = vec![1u8];
        huge.extend(u32::MAX.to_le_bytes());
        assert!(decode_row(&huge, &types[..1]).is_err());
    }
}
