//! RETURNING, for streams and tables alike: the statement's list is
//! planned as `SELECT <items> FROM <relation>` over the rows it wrote (or
//! deleted), registered as an in-memory table in a context of its own, so
//! it sees those rows and nothing else.

use std::sync::Arc;

use arrow::array::RecordBatch;
use arrow::datatypes::SchemaRef;
use datafusion::datasource::MemTable;
use datafusion::execution::context::SessionContext;
use datafusion::logical_expr::LogicalPlan;
use datafusion::scalar::ScalarValue;
use datafusion::sql::parser::Statement as DFStatement;
use sqlparser::ast::SelectItem;

use super::naming::quote;
use super::{batches_stream, Output};
use crate::error::{Error, Result};
use crate::statement::{self, sqlparser, Parsed};

/// The RETURNING rows of `rows` (of `schema`), answered with `tag`.
pub(super) async fn rows(
    schema: SchemaRef,
    relation: &str,
    rows: Vec<RecordBatch>,
    items: &[SelectItem],
    params: &[ScalarValue],
    tag: &str,
) -> Result<Output> {
    let (ctx, plan) = plan(schema, relation, rows, items, params).await?;
    let df = ctx.execute_logical_plan(plan).await?;
    let schema: SchemaRef = Arc::new(df.schema().as_arrow().clone());
    let batches = df.collect().await?;
    Ok(Output::Rows {
        schema: schema.clone(),
        stream: batches_stream(schema, batches),
        tag: tag.into(),
    })
}

/// The result columns of RETURNING (Describe).
pub(super) async fn schema(
    schema: SchemaRef,
    relation: &str,
    items: &[SelectItem],
) -> Result<SchemaRef> {
    let (_, plan) = plan(schema, relation, vec![], items, &[]).await?;
    Ok(Arc::new(plan.schema().as_arrow().clone()))
}

/// `SELECT <items> FROM <relation>` planned over `rows`, with the
/// statement's parameters.
async fn plan(
    schema: SchemaRef,
    relation: &str,
    rows: Vec<RecordBatch>,
    items: &[SelectItem],
    params: &[ScalarValue],
) -> Result<(SessionContext, LogicalPlan)> {
    let ctx = SessionContext::new();
    ctx.register_table(relation, Arc::new(MemTable::try_new(schema, vec![rows])?))?;
    let list = items
        .iter()
        .map(|i| i.to_string())
        .collect::<Vec<_>>()
        .join(", ");
    let sql = format!("SELECT {list} FROM {}", quote(relation));
    let Some(Parsed::Query(q)) = statement::parse(&sql)?.into_iter().next() else {
        return Err(Error::internal("RETURNING did not parse as a query"));
    };
    let mut plan = ctx
        .state()
        .statement_to_plan(DFStatement::Statement(q))
        .await?;
    if !params.is_empty() {
        plan = plan.with_param_values(params.to_vec())?;
    }
    Ok((ctx, plan))
}
