//! SQL-level prepared statements: `PREPARE name [(types)] AS statement`, `EXECUTE name
//! [(arguments)]`, `DEALLOCATE [PREPARE] name | ALL`.
//!
//! A prepared statement is the classified statement, kept per session under its name; EXECUTE
//! evaluates its arguments (constants: no column, no subquery), casts each to its declared
//! type, and runs the statement with them as its parameters `$1, $2, ...` — the same path a
//! statement prepared with the extended protocol takes, privileges included. As in
//! PostgreSQL, PREPARE and DEALLOCATE are not undone by ROLLBACK, DISCARD ALL frees every
//! prepared statement, and EXECUTE's result is its statement's.
//!
//! Invariants: a session holds at most [`MAX_PREPARED`] statements (`54000` beyond: every
//! buffer is bounded); a prepared statement is never another EXECUTE or PREPARE, so running
//! one recurses once at most.

use std::sync::Arc;

use datafusion::scalar::ScalarValue;
use sqlparser::ast::{CastKind, Expr};

use super::{Output, Session};
use crate::error::{sqlstate, Error, Result};
use crate::insert;
use crate::statement::{sqlparser, Prepare};

/// Prepared statements one session may hold.
pub const MAX_PREPARED: usize = 1000;

impl Session {
    /// `PREPARE`: keeps the statement under its name; a name in use is `42P05`. The
    /// statement is described first, so an unknown relation or column fails here, as in
    /// PostgreSQL, not at the first EXECUTE.
    pub(super) async fn prepare(&mut self, p: &Prepare) -> Result<Output> {
        if self.prepared.contains_key(&p.name) {
            return Err(Error::new(
                sqlstate::DUPLICATE_PREPARED_STATEMENT,
                format!("prepared statement \"{}\" already exists", p.name),
            ));
        }
        if self.prepared.len() >= MAX_PREPARED {
            return Err(Error::new(
                sqlstate::PROGRAM_LIMIT_EXCEEDED,
                format!(
                    "too many prepared statements: a session may hold {MAX_PREPARED} (DEALLOCATE some)"
                ),
            ));
        }
        Box::pin(self.describe(&p.statement)).await?;
        self.prepared.insert(p.name.clone(), Arc::new(p.clone()));
        Ok(Output::Tag("PREPARE".into()))
    }

    /// The statement prepared as `name`; `26000` when there is none.
    pub(super) fn prepared(&self, name: &str) -> Result<Arc<Prepare>> {
        self.prepared.get(name).cloned().ok_or_else(|| {
            Error::new(
                sqlstate::INVALID_SQL_STATEMENT_NAME,
                format!("prepared statement \"{name}\" does not exist"),
            )
        })
    }

    /// `EXECUTE`: the prepared statement, run with `args` as its parameters.
    pub(super) async fn execute_prepared(&mut self, name: &str, args: &[Expr]) -> Result<Output> {
        let prepared = self.prepared(name)?;
        let params = self.arguments(&prepared, args)?;
        Box::pin(self.execute_inner(&prepared.statement, &params)).await
    }

    /// EXECUTE's arguments, evaluated and cast to the declared types.
    fn arguments(&self, prepared: &Prepare, args: &[Expr]) -> Result<Vec<ScalarValue>> {
        if !prepared.types.is_empty() && args.len() != prepared.types.len() {
            return Err(Error::new(
                sqlstate::SYNTAX_ERROR,
                format!(
                    "wrong number of parameters for prepared statement \"{}\": expected {}, got {}",
                    prepared.name,
                    prepared.types.len(),
                    args.len()
                ),
            ));
        }
        let start = chrono::Utc::now();
        let state = self.ctx.state_ref();
        let state = state.read();
        args.iter()
            .enumerate()
            .map(|(i, arg)| {
                let arg = match prepared.types.get(i) {
                    Some(ty) => Expr::Cast {
                        kind: CastKind::DoubleColon,
                        expr: Box::new(arg.clone()),
                        data_type: ty.clone(),
                        array: false,
                        format: None,
                    },
                    None => arg.clone(),
                };
                insert::eval_constant(&state, &arg, None, start, &[])
                    .unwrap_or_else(|| Err(not_constant(&arg)))
            })
            .collect()
    }

    /// `DEALLOCATE name` frees it (a name the session does not know may be the extended
    /// protocol's, whose store frees its own); `DEALLOCATE ALL` frees every one.
    pub(super) fn deallocate(&mut self, name: Option<&str>) -> Output {
        match name {
            Some(name) => {
                self.prepared.remove(name);
                Output::Tag("DEALLOCATE".into())
            }
            None => {
                self.prepared.clear();
                Output::Tag("DEALLOCATE ALL".into())
            }
        }
    }
}

/// Why an EXECUTE argument that the constant evaluator would not take is refused: a subquery
/// (`0A000`, as PostgreSQL), a column (`42703`: there is no row to take it from), or an
/// expression it cannot type.
fn not_constant(arg: &Expr) -> Error {
    if insert::has_subquery(arg) {
        return Error::unsupported("cannot use subquery in EXECUTE parameter");
    }
    let mut column = None;
    let _ = sqlparser::ast::visit_expressions(arg, |e| {
        let name = match e {
            Expr::Identifier(id) => Some(id.value.clone()),
            Expr::CompoundIdentifier(ids) => Some(
                ids.iter()
                    .map(|i| i.value.as_str())
                    .collect::<Vec<_>>()
                    .join("."),
            ),
            _ => None,
        };
        if let Some(name) = name {
            column.get_or_insert(name);
        }
        std::ops::ControlFlow::<()>::Continue(())
    });
    match column {
        Some(c) => Error::new(
            sqlstate::UNDEFINED_COLUMN,
            format!("column \"{c}\" does not exist"),
        ),
        None => Error::new(
            sqlstate::DATATYPE_MISMATCH,
            format!("EXECUTE parameter {arg} cannot be evaluated"),
        ),
    }
}
