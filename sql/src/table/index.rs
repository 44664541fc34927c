//! Secondary indexes of tables: their entries, how a scan picks one, and what a UNIQUE one
//! refuses.
//!
//! An index is a sorted set of entries in the table store, under the index's own id, like
//! a table's rows: one entry per row, its key the indexed values then the row's key, its
//! value the row's key. So the store's snapshots, checkpoints, Raft snapshots and replay
//! carry indexes exactly as they carry rows, and only the state machine writes them
//! (`apply::indexes`).
//!
//! Invariants:
//! - Entries are order-preserving (memcomparable): each value is a tag (1 present, 2 NULL,
//!   so NULLs sort last as in PostgreSQL) then its key encoding, which delimits itself; so
//!   all entries with the same leading values share a byte prefix and a range of values is
//!   a range of bytes. Floats compare as numbers (`-0` is `0`).
//! - A UNIQUE index holds at most one entry per non-NULL prefix (NULLs are distinct, as in
//!   PostgreSQL); the state machine checks it on the rows the command leaves.
//! - A lookup may return more rows than match (the filters run again above it), never
//!   fewer: only bounds whose literal has exactly the column's type narrow a range, and a
//!   snapshot reads through an index only if it holds the index whole (not older than
//!   the command that built it, not after its drop); else the table is scanned.

use datafusion::logical_expr::{BinaryExpr, Expr, Operator};
use datafusion::scalar::ScalarValue;

use super::codec;
use super::Table;
use crate::definition::IndexDef;
use crate::error::{sqlstate, Error, Result};
use crate::pushdown::column_cmp;

const PRESENT: u8 = 1;
const NULL: u8 = 2;

/// The Raft index of the command that created an index (its id is `index * 1024 + op + 1`):
/// a snapshot older than it has none of its entries.
pub fn created_at(index: &IndexDef) -> u64 {
    index.id.saturating_sub(1) / 1024
}

/// The encoded leading values of an entry.
pub fn prefix(values: &[&ScalarValue]) -> Result<Vec<u8>> {
    let mut out = Vec::with_capacity(16);
    for v in values {
        if v.is_null() {
            out.push(NULL);
            continue;
        }
        out.push(PRESENT);
        let v = match v {
            ScalarValue::Float32(Some(f)) if *f == 0.0 => &ScalarValue::Float32(Some(0.0)),
            ScalarValue::Float64(Some(f)) if *f == 0.0 => &ScalarValue::Float64(Some(0.0)),
            v => v,
        };
        out.extend(codec::encode_key(&[v])?);
    }
    Ok(out)
}

/// The indexed values of a row (in index order).
pub fn values<'r>(index: &IndexDef, row: &'r [ScalarValue]) -> Vec<&'r ScalarValue> {
    index.columns.iter().map(|&c| &row[c]).collect()
}

/// The entry of a row with key `key`: its values' prefix, then the key.
pub fn entry(index: &IndexDef, row: &[ScalarValue], key: &[u8]) -> Result<(Vec<u8>, usize)> {
    let mut e = prefix(&values(index, row))?;
    let at = e.len();
    e.extend_from_slice(key);
    Ok((e, at))
}

/// The smallest byte string greater than every string starting with `bytes` (`None`: no
/// such string, the range is unbounded).
pub fn successor(bytes: &[u8]) -> Option<Vec<u8>> {
    let mut out = bytes.to_vec();
    while let Some(last) = out.pop() {
        if last < 0xFF {
            out.push(last + 1);
            return Some(out);
        }
    }
    None
}

/// 23505 for a row whose indexed values another row has.
pub fn duplicate(table: &Table, index: &IndexDef, row: &[ScalarValue], building: bool) -> Error {
    let cols: Vec<&str> = index
        .columns
        .iter()
        .map(|&c| table.def.columns[c].name.as_str())
        .collect();
    let vals: Vec<String> = values(index, row).iter().map(|v| v.to_string()).collect();
    let (message, detail) = if building {
        (
            format!("could not create unique index \"{}\"", index.name),
            format!(
                "Key ({})=({}) is duplicated.",
                cols.join(", "),
                vals.join(", ")
            ),
        )
    } else {
        (
            format!(
                "duplicate key value violates unique constraint \"{}\"",
                index.name
            ),
            format!(
                "Key ({})=({}) already exists.",
                cols.join(", "),
                vals.join(", ")
            ),
        )
    };
    let mut e = Error::new(sqlstate::UNIQUE_VIOLATION, message);
    e.detail = Some(detail);
    e
}

/// A range of one index's entries that holds every row the filters can match.
#[derive(Debug, Clone)]
pub struct Lookup {
    pub index: IndexDef,
    /// Inclusive start and exclusive end (`None`: to the end) of the entries.
    pub from: Vec<u8>,
    pub to: Option<Vec<u8>>,
    /// What it looks up, for EXPLAIN (`email = 'a'`, `n >= 5 AND n < 9`).
    pub condition: String,
}

/// Bounds the filters put on one column.
#[derive(Default)]
struct Bounds {
    eq: Option<ScalarValue>,
    lower: Option<(ScalarValue, bool)>,
    upper: Option<(ScalarValue, bool)>,
}

impl Bounds {
    fn is_empty(&self) -> bool {
        self.eq.is_none() && self.lower.is_none() && self.upper.is_none()
    }
}

/// The best index lookup for `filters` (a conjunction), if any index can narrow the scan:
/// the one with the most leading columns fixed by equality, then a range on the next.
pub fn choose(table: &Table, filters: &[Expr]) -> Option<Lookup> {
    if table.def.indexes.is_empty() {
        return None;
    }
    let mut bounds: Vec<Bounds> = table
        .def
        .columns
        .iter()
        .map(|_| Bounds::default())
        .collect();
    for f in filters {
        for c in datafusion::logical_expr::utils::split_conjunction(f) {
            narrow(table, &mut bounds, c);
        }
    }
    let mut best: Option<(usize, bool, &IndexDef)> = None;
    for index in &table.def.indexes {
        let eq = index
            .columns
            .iter()
            .take_while(|&&c| bounds[c].eq.is_some())
            .count();
        let ranged = index
            .columns
            .get(eq)
            .is_some_and(|&c| !bounds[c].is_empty());
        if eq == 0 && !ranged {
            continue;
        }
        if best.is_none_or(|(e, r, _)| (eq, ranged) > (e, r)) {
            best = Some((eq, ranged, index));
        }
    }
    let (eq, ranged, index) = best?;
    lookup(table, index, &bounds, eq, ranged).ok()
}

/// Record what a conjunct says about a column, when it compares the column with a literal.
fn narrow(table: &Table, bounds: &mut [Bounds], e: &Expr) {
    let Expr::BinaryExpr(BinaryExpr { left, op, right }) = e else {
        return;
    };
    let Some((col, op, lit)) = column_cmp(left, *op, right) else {
        return;
    };
    let Some(i) = table.def.columns.iter().position(|c| c.name == col) else {
        return;
    };
    if lit.is_null() {
        return;
    }
    let b = &mut bounds[i];
    if op == Operator::Eq {
        if let Ok(v) = table.types[i].coerce(lit) {
            b.eq = Some(v);
        }
        return;
    }
    // a range needs the literal in the column's own type: a coercion could round it
    if lit.data_type() != table.types[i].arrow_type() {
        return;
    }
    match op {
        Operator::Gt => b.lower = Some((lit, false)),
        Operator::GtEq => b.lower = Some((lit, true)),
        Operator::Lt => b.upper = Some((lit, false)),
        Operator::LtEq => b.upper = Some((lit, true)),
        _ => {}
    }
}

fn lookup(
    table: &Table,
    index: &IndexDef,
    bounds: &[Bounds],
    eq: usize,
    ranged: bool,
) -> Result<Lookup> {
    let name = |c: usize| table.def.columns[c].name.clone();
    let fixed: Vec<&ScalarValue> = index.columns[..eq]
        .iter()
        .filter_map(|&c| bounds[c].eq.as_ref())
        .collect();
    let mut condition: Vec<String> = index.columns[..eq]
        .iter()
        .zip(&fixed)
        .map(|(&c, v)| format!("{} = {v}", name(c)))
        .collect();
    let base = prefix(&fixed)?;
    if !ranged {
        return Ok(Lookup {
            index: index.clone(),
            to: successor(&base),
            from: base,
            condition: condition.join(" AND "),
        });
    }
    let c = index.columns[eq];
    let b = &bounds[c];
    let at = |v: &ScalarValue| -> Result<Vec<u8>> {
        let mut out = base.clone();
        out.extend(prefix(&[v])?);
        Ok(out)
    };
    let (low, high) = match &b.eq {
        Some(v) => (Some((v.clone(), true)), Some((v.clone(), true))),
        None => (b.lower.clone(), b.upper.clone()),
    };
    let from = match &low {
        Some((v, true)) => at(v)?,
        Some((v, false)) => successor(&at(v)?).unwrap_or_else(|| vec![0xFF; 1]),
        None => [base.as_slice(), &[PRESENT]].concat(),
    };
    let to = match &high {
        Some((v, true)) => successor(&at(v)?),
        Some((v, false)) => Some(at(v)?),
        None => Some([base.as_slice(), &[NULL]].concat()),
    };
    if let Some((v, inclusive)) = &low {
        condition.push(format!(
            "{} {} {v}",
            name(c),
            if *inclusive { ">=" } else { ">" }
        ));
    }
    if let Some((v, inclusive)) = &high {
        condition.push(format!(
            "{} {} {v}",
            name(c),
            if *inclusive { "<=" } else { "<" }
        ));
    }
    Ok(Lookup {
        index: index.clone(),
        from,
        to,
        condition: condition.join(" AND "),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_sort_by_values_then_key_with_nulls_last() {
        let p = |v: Option<i32>| prefix(&[&ScalarValue::Int32(v)]).unwrap_or_default();
        assert!(p(Some(-3)) < p(Some(0)));
        assert!(p(Some(7)) < p(None));
        // an entry is its prefix then the row key: every entry of one value is in the
        // prefix's range, no other value's is
        let e = [p(Some(5)), b"key".to_vec()].concat();
        let to = successor(&p(Some(5))).unwrap_or_default();
        assert!(p(Some(5)) <= e && e < to);
        assert!(p(Some(6)) >= to);
        let z = |f: f64| prefix(&[&ScalarValue::Float64(Some(f))]).unwrap_or_default();
        assert_eq!(z(-0.0), z(0.0));
        assert_eq!(successor(&[1, 0xFF]), Some(vec![2]));
        assert_eq!(successor(&[0xFF]), None);
    }
}
