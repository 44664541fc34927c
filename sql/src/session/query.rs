//! Queries: planning a statement with DataFusion in the session's context
//! (small ones in place, big ones on the query runtime, memory reserved
//! while planning) and starting its rows.
//!
//! A plain scan (no aggregation, join or window) returns rows in offset
//! order, as a log reader expects even without ORDER BY.

use datafusion::execution::memory_pool::{MemoryConsumer, MemoryReservation};
use datafusion::logical_expr::LogicalPlan;
use datafusion::scalar::ScalarValue;
use datafusion::sql::parser::Statement as DFStatement;
use sqlparser::ast::Statement;

use super::naming::{pg_column_names, with_unique_names};
use super::{append, Output, Session};
use crate::error::Result;
use crate::statement::sqlparser;

impl Session {
    /// Plan a statement with DataFusion in this session's context: a small one here, a big
    /// one on the query runtime ([`crate::executor::plans_in_place`]): a statement thousands
    /// of terms long or hundreds of set operations deep takes seconds to plan, which must
    /// not hold up the connection thread's other clients.
    pub(super) async fn plan(&self, stmt: &Statement) -> Result<LogicalPlan> {
        Ok(self.plan_reserved(stmt).await?.0)
    }

    /// [`Session::plan`], with the memory the plan's making may take reserved from the
    /// statement's and the server's limits ([`crate::executor::planning_bytes`]; `53200`
    /// when they have no room); the reservation is the caller's to hold until the plan has
    /// also been optimized and started.
    async fn plan_reserved(&self, stmt: &Statement) -> Result<(LogicalPlan, MemoryReservation)> {
        let reservation = MemoryConsumer::new("planning a statement")
            .register(&self.ctx.runtime_env().memory_pool);
        // nothing to reserve is exactly a statement small enough to plan in place
        let bytes = crate::executor::planning_bytes(stmt);
        reservation.try_grow(bytes)?;
        let state = self.ctx.state();
        let in_place = bytes == 0;
        let mut stmt = self.explained_insert_columns(with_unique_names(stmt));
        self.expand_views(&mut stmt)?;
        let stmt = DFStatement::Statement(Box::new(stmt));
        if in_place {
            return Ok((state.statement_to_plan(stmt).await?, reservation));
        }
        let planning = async move { state.statement_to_plan(stmt).await };
        let plan = crate::executor::run_on(self.engine.query_runtime.as_ref(), planning).await??;
        Ok((plan, reservation))
    }

    /// `EXPLAIN INSERT INTO s VALUES (...)` names the stream's columns, as the INSERT itself
    /// does when it runs (DataFusion would count the system columns `offset` and `ts` too).
    fn explained_insert_columns(&self, mut stmt: Statement) -> Statement {
        if let Statement::Explain { statement, .. } = &mut stmt {
            if let Statement::Insert(ins) = statement.as_mut() {
                let stream = append::insert_target(ins)
                    .ok()
                    .and_then(|t| self.stream(&t).ok());
                if let (Some(stream), true) = (stream, ins.columns.is_empty()) {
                    ins.columns = append::user_column_names(&stream);
                }
            }
        }
        stmt
    }

    pub(super) async fn query(
        &mut self,
        stmt: &Statement,
        params: &[ScalarValue],
    ) -> Result<Output> {
        if let Some(dir) = super::backup::backup_call(stmt)? {
            return self.backup(dir).await;
        }
        // held until the plan is optimized and started (`execute_stream` below)
        let (mut plan, _planning) = self.plan_reserved(stmt).await?;
        if !params.is_empty() {
            plan = plan.with_param_values(params.to_vec())?;
        }
        // A plain scan (no aggregation, join or window) returns rows in
        // offset order, as a log reader expects even without ORDER BY:
        // don't split it round-robin across partitions.
        use datafusion::common::tree_node::TreeNode;
        let spread = plan.exists(|p| {
            Ok(matches!(
                p,
                LogicalPlan::Aggregate(_) | LogicalPlan::Join(_) | LogicalPlan::Window(_)
            ))
        })?;
        self.ctx
            .state_ref()
            .write()
            .config_mut()
            .options_mut()
            .optimizer
            .enable_round_robin_repartition = spread;
        let df = self.ctx.execute_logical_plan(plan).await?;
        let schema = pg_column_names(stmt, df.schema().as_arrow());
        let stream =
            crate::executor::execute_stream(self.engine.query_runtime.as_ref(), df).await?;
        Ok(Output::Rows {
            schema,
            stream,
            tag: "SELECT".into(),
        })
    }
}
