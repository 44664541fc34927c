//! `CREATE [UNIQUE] INDEX`, `DROP INDEX` and `CREATE TABLE`'s `UNIQUE` constraints as
//! [`Parsed`] statements.
//!
//! Indexes are B-trees over columns of a table (see `table::index`). What PostgreSQL's
//! indexes have beyond that — expressions, partial indexes (`WHERE`), `INCLUDE`, other
//! access methods, operator classes, `NULLS NOT DISTINCT`, storage parameters,
//! `CONCURRENTLY` — is refused with `0A000` naming it, never accepted and ignored. A
//! column's `DESC` / `NULLS FIRST` is kept as PostgreSQL's `indoption` (see
//! [`IndexDef::options`]): the entries' order serves lookups either way.

use sqlparser::ast::{
    CreateIndex, Expr, Ident, IndexType, NullsDistinctOption, ObjectName, UniqueConstraint,
};

use super::{normalize_ident, object_name, sqlparser, Parsed};
use crate::definition::{ColumnDef, IndexDef, INDOPTION_DESC, INDOPTION_NULLS_FIRST};
use crate::error::{sqlstate, Error, Result};

pub(super) fn classify_create(ci: CreateIndex) -> Result<Parsed> {
    let refused = [
        (
            ci.concurrently,
            "CREATE INDEX CONCURRENTLY is not supported (CREATE INDEX builds the index in one replicated command)",
        ),
        (
            !matches!(ci.using, None | Some(IndexType::BTree)),
            "index access methods other than btree are not supported",
        ),
        (
            ci.predicate.is_some(),
            "partial indexes (CREATE INDEX ... WHERE) are not supported",
        ),
        (!ci.include.is_empty(), "INCLUDE columns are not supported"),
        (
            ci.nulls_distinct == Some(false),
            "NULLS NOT DISTINCT is not supported",
        ),
        (
            !ci.with.is_empty() || !ci.index_options.is_empty() || !ci.alter_options.is_empty(),
            "index storage parameters and options are not supported",
        ),
    ];
    if let Some((_, what)) = refused.iter().find(|(r, _)| *r) {
        return Err(Error::unsupported(*what));
    }
    let mut columns = Vec::with_capacity(ci.columns.len());
    let mut options = Vec::with_capacity(ci.columns.len());
    for c in &ci.columns {
        if c.operator_class.is_some() {
            return Err(Error::unsupported(
                "index operator classes are not supported",
            ));
        }
        let desc = c.column.options.asc == Some(false);
        // as PostgreSQL: DESC puts NULLs first unless told otherwise
        let nulls_first = c.column.options.nulls_first.unwrap_or(desc);
        options.push(
            if desc { INDOPTION_DESC } else { 0 }
                | if nulls_first {
                    INDOPTION_NULLS_FIRST
                } else {
                    0
                },
        );
        match &c.column.expr {
            Expr::Identifier(id) => columns.push(normalize_ident(id)),
            other => {
                return Err(Error::unsupported(format!(
                    "indexes on expressions are not supported: {other}"
                )))
            }
        }
    }
    Ok(Parsed::CreateIndex {
        name: ci.name.as_ref().map(object_name),
        table: object_name(&ci.table_name),
        columns,
        options,
        unique: ci.unique,
        if_not_exists: ci.if_not_exists,
    })
}

pub(super) fn classify_drop(names: &[ObjectName], if_exists: bool) -> Parsed {
    Parsed::DropIndex {
        names: names.iter().map(object_name).collect(),
        if_exists,
    }
}

/// A `UNIQUE` constraint of `CREATE TABLE` (of the column `column`, or of the columns it
/// lists): its name (empty: the session picks `<table>_<columns>_key`) and columns.
pub(super) fn unique_constraint(
    u: &UniqueConstraint,
    name: Option<&Ident>,
    column: Option<&str>,
) -> Result<(String, Vec<String>)> {
    let refused = [
        (
            u.characteristics.is_some(),
            "DEFERRABLE and INITIALLY constraints are not supported",
        ),
        (
            matches!(u.nulls_distinct, NullsDistinctOption::NotDistinct),
            "NULLS NOT DISTINCT is not supported",
        ),
        (
            !matches!(u.index_type, None | Some(IndexType::BTree))
                || !u.index_options.is_empty()
                || u.index_name.is_some(),
            "this form of UNIQUE constraint is not supported",
        ),
    ];
    if let Some((_, what)) = refused.iter().find(|(r, _)| *r) {
        return Err(Error::unsupported(*what));
    }
    let mut columns: Vec<String> = column.map(str::to_string).into_iter().collect();
    for c in &u.columns {
        match &c.column.expr {
            Expr::Identifier(id) => columns.push(normalize_ident(id)),
            other => {
                return Err(Error::unsupported(format!(
                    "a UNIQUE constraint on an expression is not supported: {other}"
                )))
            }
        }
    }
    Ok((name.map(normalize_ident).unwrap_or_default(), columns))
}

/// The unique indexes of `CREATE TABLE`'s UNIQUE constraints, their columns by position.
pub(super) fn unique_indexes(
    unique: Vec<(String, Vec<String>)>,
    columns: &[ColumnDef],
) -> Result<Vec<IndexDef>> {
    unique
        .into_iter()
        .map(|(name, cols)| {
            let positions = cols
                .iter()
                .map(|k| {
                    columns.iter().position(|c| &c.name == k).ok_or_else(|| {
                        Error::new(
                            sqlstate::UNDEFINED_COLUMN,
                            format!("column \"{k}\" named in key does not exist"),
                        )
                    })
                })
                .collect::<Result<Vec<usize>>>()?;
            Ok(IndexDef {
                id: 0,
                oid: 0,
                name,
                columns: positions,
                options: Vec::new(),
                unique: true,
                constraint: true,
            })
        })
        .collect()
}
