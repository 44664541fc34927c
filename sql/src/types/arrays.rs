//! One-dimensional PostgreSQL arrays as input: the text form (`{1,2,NULL}`, `{"a b","c"}`)
//! into Arrow lists, and values converted to an array type. Used by array columns
//! ([`ColumnType::Array`]), array parameters (Bind) and casts of string literals to array
//! types (`'{1,2,7}'::int[]`, rewritten before planning into `ARRAY[...]` by
//! `system/rewrite.rs`). The binary `array_recv` form is `crate::binary`'s.
//!
//! Invariants: an element goes through its type's own input function (so `'{x}'::int[]` is
//! `22P02` as `'x'::int` is); an array of more than one dimension, or whose binary header
//! contradicts its length, is refused, never guessed; nothing is allocated for an element
//! count a client announced before the bytes that back it arrived.

use arrow::array::{Array, ArrayRef};
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
                if c == '{' && elem.is_empty() {
                    return Err(Error::unsupported(format!(
                        "multidimensional arrays are not supported: \"{s}\" (array columns and parameters have one dimension)"
                    )));
                }
                if c == '{' || c == '}' || c == '"' {
                    // a quote or brace inside an unquoted element
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

/// The first list of `lists` as array text (`{a,"b c",NULL}`), each element as Arrow
/// displays it, quoted where needed. What a stream column's default stores; the caller
/// checks that it reads back as the same value.
pub fn format_text(lists: &ArrayRef) -> Result<String> {
    let list = lists
        .as_any()
        .downcast_ref::<arrow::array::ListArray>()
        .ok_or_else(|| Error::internal(format!("{} is not a list", lists.data_type())))?;
    let items = list.value(0);
    let mut out = String::from("{");
    for i in 0..items.len() {
        if i > 0 {
            out.push(',');
        }
        if items.is_null(i) {
            out.push_str("NULL");
            continue;
        }
        let v = arrow::util::display::array_value_to_string(&items, i)?;
        out.push('"');
        out.push_str(&v.replace('\\', "\\\\").replace('"', "\\\""));
        out.push('"');
    }
    out.push('}');
    Ok(out)
}

/// A list value as an array of `elem`: each element converted and checked by `elem`'s own
/// rules (as a column of that type would), so `ARRAY[1,2]` fits an `int8[]` column and
/// `ARRAY['x']` does not fit an `int4[]` one.
pub fn coerce(elem: ColumnType, v: &ScalarValue) -> Result<ScalarValue> {
    let items = match v {
        ScalarValue::List(l) if l.len() == 1 => l.value(0),
        ScalarValue::LargeList(l) if l.len() == 1 => l.value(0),
        ScalarValue::FixedSizeList(l) if l.len() == 1 => l.value(0),
        other => return Err(ColumnType::array_of(elem).mismatch(other)),
    };
    let values = (0..items.len())
        .map(|i| match ScalarValue::try_from_array(&items, i)? {
            x if x.is_null() => null_of(elem),
            x => elem.coerce(x),
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(list_of(elem, &values))
}

/// A whole column of lists (from DataFusion) as arrays of `elem`, row by row.
pub fn coerce_column(elem: ColumnType, column: &ArrayRef) -> Result<ArrayRef> {
    let target = ColumnType::array_of(elem).arrow_type();
    if *column.data_type() == target && elem.arrow_type_suffices() {
        return Ok(column.clone());
    }
    let rows = (0..column.len())
        .map(|r| match ScalarValue::try_from_array(column, r)? {
            x if x.is_null() => Ok(ScalarValue::try_from(&target)?),
            x => ColumnType::array_of(elem).coerce(x),
        })
        .collect::<Result<Vec<_>>>()?;
    if rows.is_empty() {
        return Ok(arrow::array::new_empty_array(&target));
    }
    Ok(ScalarValue::iter_to_array(rows)?)
}

pub(crate) fn null_of(elem: ColumnType) -> Result<ScalarValue> {
    Ok(ScalarValue::try_from(elem.arrow_type())?)
}

/// A list scalar of `elem`'s Arrow type holding `values`.
pub(crate) fn list_of(elem: ColumnType, values: &[ScalarValue]) -> ScalarValue {
    ScalarValue::List(ScalarValue::new_list_nullable(values, &elem.arrow_type()))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// The elements of an `int4[]` value.
    pub(crate) fn ints(v: &ScalarValue) -> Vec<Option<i32>> {
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
}
