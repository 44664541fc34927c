//! What an `ALTER STREAM` command makes of a stream's definition: new
//! options, a new name, an added column, a renamed column.
//!
//! [`new_definition`] is a pure function of the stream's replicated
//! definition and the command, so every replica reaches the same definition
//! or the same error; the state machine calls it when it validates a command
//! and again when it applies it.
//!
//! Invariants: columns are only ever added at the end and renamed in place,
//! so a column's position is its identity: a frame written before an ALTER
//! decodes with its own (narrower, or differently named) schema and reads as
//! the current definition by position ([`crate::catalog::Stream::user_columns`]).
//! An added NOT NULL column always has a default, so no row — written before
//! the ALTER, or buffered in a block that commits after it — ever reads NULL
//! there. The dedup key column and the system columns are never renamed.

use crate::catalog::Stream;
use crate::command::AlterStream;
use crate::definition::{ColumnDef, StreamDef, OFFSET_COLUMN, TS_COLUMN};
use crate::error::{sqlstate, Error, Result};

/// PostgreSQL's limit on the columns of a relation.
pub const MAX_COLUMNS: usize = 1600;

/// The definition `stream` has after `a`, or why `a` cannot apply.
pub fn new_definition(stream: &Stream, a: &AlterStream) -> Result<StreamDef> {
    let mut def = stream.def.clone();
    if !a.options_json.is_empty() {
        def.options = serde_json::from_str(&a.options_json)
            .map_err(|e| Error::internal(format!("bad stream options: {e}")))?;
    }
    if !a.new_name.is_empty() && a.new_name != a.name {
        def.name = a.new_name.clone();
    }
    if !a.add_column_json.is_empty() {
        let column: ColumnDef = serde_json::from_str(&a.add_column_json)
            .map_err(|e| Error::internal(format!("bad column: {e}")))?;
        add_column(&mut def, column, a.if_not_exists)?;
    }
    if !a.rename_column.is_empty() {
        rename_column(&mut def, &a.rename_column, &a.rename_column_to)?;
    }
    Ok(def)
}

fn add_column(def: &mut StreamDef, column: ColumnDef, if_not_exists: bool) -> Result<()> {
    if column.name == OFFSET_COLUMN || column.name == TS_COLUMN {
        return Err(system_column_clash(&column.name));
    }
    if def.column(&column.name).is_some() {
        if if_not_exists {
            return Ok(());
        }
        return Err(column_exists(&column.name, &def.name));
    }
    if def.columns.len() >= MAX_COLUMNS {
        return Err(Error::new(
            sqlstate::TOO_MANY_COLUMNS,
            format!("tables can have at most {MAX_COLUMNS} columns"),
        ));
    }
    if let Some(text) = &column.default {
        column.ty.parse_text(text)?;
    } else if column.not_null {
        return Err(Error::new(
            sqlstate::NOT_NULL_VIOLATION,
            format!(
                "column \"{}\" of relation \"{}\" would contain null values",
                column.name, def.name
            ),
        )
        .with_detail(
            "A NOT NULL column added to a stream needs a DEFAULT: rows appended before it, \
             and appends in flight, have no value for it.",
        ));
    }
    def.columns.push(column);
    Ok(())
}

fn rename_column(def: &mut StreamDef, from: &str, to: &str) -> Result<()> {
    if from == OFFSET_COLUMN || from == TS_COLUMN {
        return Err(Error::unsupported(format!(
            "cannot rename system column \"{from}\""
        )));
    }
    if to == OFFSET_COLUMN || to == TS_COLUMN {
        return Err(system_column_clash(to));
    }
    if def.options.dedup_key.as_deref() == Some(from) {
        return Err(Error::unsupported(format!(
            "column \"{from}\" is the stream's dedup_key and cannot be renamed"
        )));
    }
    let Some(i) = def.columns.iter().position(|c| c.name == from) else {
        return Err(Error::new(
            sqlstate::UNDEFINED_COLUMN,
            format!("column \"{from}\" does not exist"),
        ));
    };
    if from != to && def.column(to).is_some() {
        return Err(column_exists(to, &def.name));
    }
    def.columns[i].name = to.to_string();
    Ok(())
}

fn system_column_clash(name: &str) -> Error {
    Error::new(
        sqlstate::DUPLICATE_COLUMN,
        format!("column name \"{name}\" conflicts with a system column name"),
    )
}

fn column_exists(name: &str, relation: &str) -> Error {
    Error::new(
        sqlstate::DUPLICATE_COLUMN,
        format!("column \"{name}\" of relation \"{relation}\" already exists"),
    )
}
