//! `SELECT * FROM sluice_backup('/dir')` (or `SELECT sluice_backup('/dir')`): an online
//! backup of this node into a directory on the server's machine (see [`crate::backup`]).
//! Superuser only, like PostgreSQL's server-side file writes; the one statement form that
//! runs it is recognised before planning (the backup is not a DataFusion function: it
//! waits on the Raft thread and writes files).

use std::path::PathBuf;
use std::sync::Arc;

use arrow::array::{Int64Array, RecordBatch};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::sql::sqlparser::ast::{
    Expr, FunctionArg, FunctionArgExpr, FunctionArguments, GroupByExpr, ObjectName, SelectItem,
    SetExpr, Statement, TableFactor, Value,
};

use super::{Output, Session};
use crate::error::{sqlstate, Error, Result};

const FUNCTION: &str = "sluice_backup";

/// The columns `sluice_backup` answers with.
pub(super) fn backup_schema() -> SchemaRef {
    Arc::new(Schema::new(
        ["applied_index", "streams", "tables", "bytes"]
            .into_iter()
            .map(|n| Field::new(n, DataType::Int64, false))
            .collect::<Vec<_>>(),
    ))
}

/// The directory of a `sluice_backup` call, if `stmt` is one; a call with anything but one
/// string literal is refused.
pub(super) fn backup_call(stmt: &Statement) -> Result<Option<PathBuf>> {
    let Statement::Query(q) = stmt else {
        return Ok(None);
    };
    let SetExpr::Select(select) = q.body.as_ref() else {
        return Ok(None);
    };
    let args = match (select.projection.as_slice(), select.from.as_slice()) {
        ([SelectItem::UnnamedExpr(Expr::Function(f))], []) if is_backup(&f.name) => match &f.args {
            FunctionArguments::List(list) => list.args.as_slice(),
            _ => &[],
        },
        ([SelectItem::Wildcard(_)], [from]) if from.joins.is_empty() => match &from.relation {
            TableFactor::Table {
                name,
                args: Some(args),
                ..
            } if is_backup(name) => args.args.as_slice(),
            _ => return Ok(None),
        },
        _ => return Ok(None),
    };
    let bare = q.with.is_none()
        && q.order_by.is_none()
        && q.limit_clause.is_none()
        && q.fetch.is_none()
        && q.locks.is_empty()
        && select.selection.is_none()
        && select.having.is_none()
        && select.distinct.is_none()
        && matches!(&select.group_by, GroupByExpr::Expressions(e, m) if e.is_empty() && m.is_empty());
    if !bare {
        return Err(Error::new(
            sqlstate::FEATURE_NOT_SUPPORTED,
            format!("{FUNCTION}() is called alone: SELECT * FROM {FUNCTION}('/path/to/backup')"),
        ));
    }
    match args {
        [FunctionArg::Unnamed(FunctionArgExpr::Expr(Expr::Value(v)))] => match &v.value {
            Value::SingleQuotedString(dir) | Value::EscapedStringLiteral(dir) => {
                Ok(Some(PathBuf::from(dir)))
            }
            _ => Err(literal_needed()),
        },
        _ => Err(literal_needed()),
    }
}

fn is_backup(name: &ObjectName) -> bool {
    name.to_string().eq_ignore_ascii_case(FUNCTION)
}

fn literal_needed() -> Error {
    Error::new(
        sqlstate::FEATURE_NOT_SUPPORTED,
        format!("{FUNCTION}() takes one string literal, the directory: SELECT * FROM {FUNCTION}('/path/to/backup')"),
    )
}

impl Session {
    /// Runs the backup and answers its one row.
    pub(super) async fn backup(&mut self, dir: PathBuf) -> Result<Output> {
        if !self.is_superuser() {
            return Err(Error::new(
                sqlstate::INSUFFICIENT_PRIVILEGE,
                format!(
                    "permission denied for function {FUNCTION}: only a superuser may take a backup"
                ),
            ));
        }
        if self.status() != super::TxnStatus::Idle {
            return Err(Error::new(
                sqlstate::ACTIVE_SQL_TRANSACTION,
                format!("{FUNCTION}() cannot run inside a transaction block"),
            ));
        }
        let summary = crate::backup::backup(&self.engine, &dir).await?;
        tracing::info!(
            dir = %dir.display(),
            applied_index = summary.applied_index,
            bytes = summary.bytes,
            "backup written"
        );
        let schema = backup_schema();
        let column = |v: u64| Arc::new(Int64Array::from(vec![v as i64])) as _;
        let batch = RecordBatch::try_new(
            schema.clone(),
            vec![
                column(summary.applied_index),
                column(summary.streams),
                column(summary.tables),
                column(summary.bytes),
            ],
        )?;
        Ok(Output::Rows {
            schema: schema.clone(),
            stream: Box::pin(RecordBatchStreamAdapter::new(
                schema,
                futures::stream::iter([Ok(batch)]),
            )),
            tag: "SELECT".into(),
        })
    }
}
