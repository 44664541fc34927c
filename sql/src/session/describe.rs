//! Describe for the extended protocol: a statement's parameter types (the
//! ones the client left open, inferred from the columns they meet) and its
//! result columns, without running it. Reads are planned as they would run;
//! writes are described from their target's columns and RETURNING list.

use std::sync::Arc;

use arrow::datatypes::{DataType, Field, Schema};
use datafusion::logical_expr::LogicalPlan;
use sqlparser::ast::Statement;

use super::append::{insert_target, insert_targets, truncation_target, values_rows};
use super::naming::pg_column_names;
use super::variables::SHOW_STREAMS;
use super::{dml, returning, Description, Session};
use crate::error::Result;
use crate::insert;
use crate::param_type::ParamType;
use crate::settings::canonical_setting;
use crate::statement::{self, sqlparser, Parsed};
use crate::types::ColumnType;

impl Session {
    /// Describe a statement for the extended protocol: parameter types
    /// (inferred where the client left them open) and result columns.
    pub async fn describe(&self, p: &Parsed) -> Result<Description> {
        match p {
            Parsed::Refused(e) => Err(e.clone()),
            Parsed::Insert(ins) => self.describe_insert(ins).await,
            Parsed::Update(u) => {
                self.updated_table(u)?;
                self.describe_table_change(p).await
            }
            Parsed::Delete(d) if self.table(&dml::delete_target(d)?.0).is_some() => {
                self.describe_table_change(p).await
            }
            Parsed::Delete(d) => {
                let (name, _) = truncation_target(d)?;
                self.stream(&name)?;
                Ok(no_rows())
            }
            Parsed::Query(stmt) if super::backup::backup_call(stmt)?.is_some() => Ok(Description {
                params: vec![],
                schema: Some(super::backup::backup_schema()),
            }),
            Parsed::Query(stmt) => {
                let plan = self.plan(stmt).await?;
                // fields, not just types: a parameter compared with a column
                // carries its `pg_type` (json, uuid, varchar(n), ...)
                let mut params = Vec::new();
                planned_param_types(&plan, stmt, &mut params)?;
                let schema = pg_column_names(stmt, plan.schema().as_arrow());
                Ok(Description {
                    params,
                    schema: Some(schema),
                })
            }
            Parsed::Show(name) => Ok(Description {
                params: vec![],
                schema: Some(Arc::new(Schema::new(vec![Field::new(
                    canonical_setting(name),
                    DataType::Utf8,
                    true,
                )]))),
            }),
            Parsed::Fetch { name, .. } => Ok(Description {
                params: vec![],
                schema: self.cursor_schema(name),
            }),
            // what the prepared statement returns; EXECUTE's own arguments are constants
            Parsed::Execute { name, .. } => {
                let prepared = self.prepared(name)?;
                let described = Box::pin(self.describe(&prepared.statement)).await?;
                Ok(Description {
                    params: vec![],
                    schema: described.schema,
                })
            }
            Parsed::ShowStreams => {
                let stmt = statement::parse(SHOW_STREAMS)?;
                Box::pin(self.describe(&stmt[0])).await
            }
            _ => Ok(no_rows()),
        }
    }

    /// INSERT into a table or a stream: the target columns type the VALUES
    /// parameters; RETURNING gives the result columns.
    async fn describe_insert(&self, ins: &sqlparser::ast::Insert) -> Result<Description> {
        let name = insert_target(ins)?;
        let mut params = Vec::new();
        if let Some(table) = self.table(&name) {
            let targets = dml::table_targets(&table, ins)?;
            let types: Vec<ColumnType> = targets.iter().map(|&t| table.types[t]).collect();
            if let Some(rows) = values_rows(ins) {
                insert::infer_param_types(&rows, &types, &mut params);
            }
            let schema = match &ins.returning {
                Some(items) => Some(self.table_returning_schema(&table, &name, items).await?),
                None => None,
            };
            return Ok(Description { params, schema });
        }
        let stream = self.stream(&name)?;
        let targets = insert_targets(&stream, ins)?;
        let types: Vec<ColumnType> = targets.iter().map(|&t| stream.def.columns[t].ty).collect();
        if let Some(rows) = values_rows(ins) {
            insert::infer_param_types(&rows, &types, &mut params);
        }
        let schema = match &ins.returning {
            Some(items) => {
                let full = stream.full_schema.clone();
                Some(returning::schema(full, "returning_rows", items).await?)
            }
            None => None,
        };
        Ok(Description { params, schema })
    }
}

/// A statement without parameters or rows.
fn no_rows() -> Description {
    Description {
        params: vec![],
        schema: None,
    }
}

/// Fill the still-unknown parameter types from a plan (a parameter
/// compared with a column carries its `pg_type`: json, uuid, varchar(n),
/// ...) and from `$n::type` casts in the statement.
pub(super) fn planned_param_types(
    plan: &LogicalPlan,
    stmt: &Statement,
    params: &mut Vec<Option<ParamType>>,
) -> Result<()> {
    for (name, field) in plan.get_parameter_fields()? {
        if let Ok(i @ 1..) = name.trim_start_matches('$').parse::<usize>() {
            if params.len() < i {
                params.resize(i, None);
            }
            if params[i - 1].is_none() {
                params[i - 1] = field.as_deref().and_then(ParamType::of_field);
            }
        }
    }
    for (i, t) in statement::cast_param_types(stmt) {
        if let Some(slot @ None) = params.get_mut(i.wrapping_sub(1)) {
            *slot = Some(t);
        }
    }
    Ok(())
}
