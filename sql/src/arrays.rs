//! One-dimensional PostgreSQL arrays as input: the text form (`{1,2,NULL}`, `{"a b","c"}`)
//! and the binary `array_recv` form, into Arrow lists. Used for array parameters (Bind) and
//! for casts of string literals to array types (`'{1,2,7}'::int[]`, rewritten before
//! planning into `ARRAY[...]` by `system/rewrite.rs`).
//!
//! Invariants: an element goes through its type's own input function (so `'{x}'::int[]` is
//! `22P02` as `'x'::int` is); an array of more than one dimension, or whose binary header
//! contradicts its length, is refused, never guessed; nothing is allocated for an element
//! count a client announced before the bytes that back it arrived.

use datafusion::scalar::ScalarValue;

use crate::error::{sqlstate, Error, Result};
use crate::types::ColumnType;

/// PostgreSQL array text (`{a,"b c",NULL}`) → its elements; `NULL` unquoted is a null.
pub fn parse_text_elements(s: &str) -> Result<Vec<Option<String>>> {
    let bad = || {
        Error::new(
            sqlstate::INVALID_TEXT_REPRESENTATION,
            format!("malformed array literal: \"{s}\""),
        )
    };
    let inner = s
        .trim()
        .strip_prefix('{')
        .and_then(|r| r.strip_suffix('}'))
        .ok_or_else(bad)?;
    let mut out = Vec::new();
    if inner.trim().is_empty() {
        return Ok(out);
    }
    let mut chars = inner.chars().peekable();
    loop {
        while chars.peek().is_some_and(|c| c.is_whitespace()) {
            chars.next();
        }
        let mut elem = String::new();
        let quoted = chars.peek() == Some(&'"');
        if quoted {
            chars.next();
            loop {
                match chars.next().ok_or_else(bad)? {
                    '"' => break,
                    '\\' => elem.push(chars.next().ok_or_else(bad)?),
                    c => elem.push(c),
                }
            }
            while chars.peek().is_some_and(|c| c.is_whitespace()) {
                chars.next();
            }
        } else {
            while let Some(&c) = chars.peek() {
                if c == ',' {
                    break;
                }
                if c == '{' || c == '}' || c == '"' {
                    // a nested array, or a quote inside an unquoted element
                    return Err(bad());
                }
                chars.next();
                if c == '\\' {
                    elem.push(chars.next().ok_or_else(bad)?);
                } else {
                    elem.push(c);
                }
            }
            elem = elem.trim_end().to_string();
            if elem.is_empty() {
                return Err(bad());
            }
        }
        out.push(if !quoted && elem.eq_ignore_ascii_case("null") {
            None
        } else {
            Some(elem)
        });
        match chars.next() {
            None => break,
            Some(',') => continue,
            Some(_) => return Err(bad()),
        }
    }
    Ok(out)
}

/// An array of `elem` from its text form.
pub fn parse_text(elem: ColumnType, s: &str) -> Result<ScalarValue> {
    let values = parse_text_elements(s)?
        .into_iter()
        .map(|e| match e {
            Some(e) => elem.parse_text(&e),
            None => null_of(elem),
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(list_of(elem, &values))
}

/// An array of `elem` from PostgreSQL's binary form: `ndim i32, has_nulls i32, elemtype u32`,
/// per dimension `length i32, lower_bound i32`, then each element as `len i32` (`-1` null)
/// and its bytes.
pub fn decode_binary(elem: ColumnType, b: &[u8]) -> Result<ScalarValue> {
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
            values.push(null_of(elem)?);
            continue;
        }
        let n = usize::try_from(n).map_err(|_| bad("negative element length"))?;
        let bytes = r.take(n).ok_or_else(|| bad("ends inside an element"))?;
        values.push(crate::binary::decode(elem, bytes)?);
    }
    if !r.0.is_empty() {
        return Err(bad("bytes after the last element"));
    }
    Ok(list_of(elem, &values))
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

fn null_of(elem: ColumnType) -> Result<ScalarValue> {
    Ok(ScalarValue::try_from(elem.arrow_type())?)
}

/// A list scalar of `elem`'s Arrow type holding `values`.
fn list_of(elem: ColumnType, values: &[ScalarValue]) -> ScalarValue {
    ScalarValue::List(ScalarValue::new_list_nullable(values, &elem.arrow_type()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ints(v: &ScalarValue) -> Vec<Option<i32>> {
        let ScalarValue::List(l) = v else {
            panic!("{v:?}")
        };
        let values = l.value(0);
        let a = values
            .as_any()
            .downcast_ref::<arrow::array::Int32Array>()
            .unwrap();
        a.iter().collect()
    }

    #[test]
    fn text_arrays_take_their_elements_input_functions() {
        let v = parse_text(ColumnType::Int4, "{1, 2 ,NULL,\"7\"}").unwrap();
        assert_eq!(ints(&v), vec![Some(1), Some(2), None, Some(7)]);
        assert_eq!(ints(&parse_text(ColumnType::Int4, "{}").unwrap()), vec![]);
        let e = parse_text(ColumnType::Int4, "{1,x}").unwrap_err();
        assert_eq!(e.code, sqlstate::INVALID_TEXT_REPRESENTATION);
        for bad in ["1,2", "{1,2", "{{1,2},{3,4}}", "{1,,2}", "{a\"b}"] {
            assert!(parse_text(ColumnType::Text, bad).is_err(), "{bad}");
        }
        let texts = parse_text_elements(r#"{"a b","c\"d",NULL,"NULL"}"#).unwrap();
        assert_eq!(
            texts,
            vec![
                Some("a b".into()),
                Some("c\"d".into()),
                None,
                Some("NULL".into())
            ]
        );
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
        let v = decode_binary(ColumnType::Int4, &b).unwrap();
        assert_eq!(ints(&v), vec![Some(5), None, Some(7)]);
        // every truncation is refused, as are trailing bytes and a huge announced length
        for cut in 0..b.len() {
            assert!(decode_binary(ColumnType::Int4, &b[..cut]).is_err(), "{cut}");
        }
        let mut extra = b.clone();
        extra.push(0);
        assert!(decode_binary(ColumnType::Int4, &extra).is_err());
        let mut huge = b[..12].to_vec();
        huge.extend(i32::MAX.to_be_bytes());
        huge.extend(1i32.to_be_bytes());
        assert!(decode_binary(ColumnType::Int4, &huge).is_err());
        let mut empty = Vec::new();
        for v in [0i32, 0, 23] {
            empty.extend(v.to_be_bytes());
        }
        assert_eq!(
            ints(&decode_binary(ColumnType::Int4, &empty).unwrap()),
            vec![]
        );
        let mut two_dims = Vec::new();
        for v in [2i32, 0, 23, 1, 1, 1, 1] {
            two_dims.extend(v.to_be_bytes());
        }
        let e = decode_binary(ColumnType::Int4, &two_dims).unwrap_err();
        assert_eq!(e.code, sqlstate::FEATURE_NOT_SUPPORTED);
    }
}
