//! Where queries run: a query's DataFusion plan executes on the query
//! runtime, apart from the runtime that serves connections.
//!
//! Connections do short, latency-bound work (decode a message, build an
//! append, wait for its commit, answer); a few worker threads serve them
//! best, because every extra worker steals and wakes its peers for each
//! request. Queries want every core (an aggregate splits into partitions
//! that run in parallel). So the server gives the engine a separate
//! runtime for queries ([`crate::EngineConfig::query_runtime`]) and a
//! query's stream is produced there and handed over through a bounded
//! channel of [`HANDOFF_BATCHES`] batches. [`spawn_stream`] does the same
//! for any stream (the server encodes COPY data there), and [`run_on`] runs
//! one piece of work there (a statement's SQL becomes a logical plan on the
//! query runtime: deep statements take seconds of CPU to plan).
//!
//! Invariants: the consumer's stream owns the producing task, so dropping
//! the stream (a client that disconnects or cancels) aborts the query;
//! planning errors come back from [`execute_stream`] itself, before any
//! row, as they do when the plan runs in place. Without a query runtime
//! (tests, embedded use) the plan runs on the caller's runtime.

use datafusion::dataframe::DataFrame;
use datafusion::execution::SendableRecordBatchStream;
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use futures::{Stream, StreamExt};
use tokio::runtime::Handle;
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;

use crate::error::{Error, Result};
use crate::statement::sqlparser;

/// Batches produced ahead of the consumer: enough to overlap producing
/// and sending, small enough that a slow client holds back the scan.
pub const HANDOFF_BATCHES: usize = 2;

/// Starts `df` on `runtime` (or here, without one) and returns its stream.
pub async fn execute_stream(
    runtime: Option<&Handle>,
    df: DataFrame,
) -> Result<SendableRecordBatchStream> {
    let Some(runtime) = runtime else {
        return Ok(df.execute_stream().await?);
    };
    let (started_tx, started_rx) = oneshot::channel();
    let batches = futures::stream::once(async move {
        match df.execute_stream().await {
            Ok(s) => {
                let _ = started_tx.send(Ok(s.schema()));
                s.left_stream()
            }
            Err(e) => {
                let _ = started_tx.send(Err(e));
                futures::stream::empty().right_stream()
            }
        }
    })
    .flatten();
    let batches = spawn_stream(runtime, batches, HANDOFF_BATCHES);
    let schema = started_rx
        .await
        .map_err(|_| Error::internal("the query task ended before it started"))??;
    Ok(Box::pin(RecordBatchStreamAdapter::new(schema, batches)))
}

/// Expressions and subqueries a statement may have to be planned where it is, on the
/// connection thread (well under a millisecond); a bigger one is planned on the query
/// runtime ([`run_on`]), where a thousand-term one may take seconds without holding up
/// other clients, and a small one does not wait behind it.
pub const PLAN_IN_PLACE_NODES: usize = 64;

/// Memory DataFusion takes, at most, to plan one expression or subquery of a big statement
/// (its logical plan, the optimizer's copies, the physical plan): measured at ~3.3 KiB for a
/// 4 MB `VALUES` list (1.4 GB for 420,000 rows) and ~1.1 KiB for a 4 MB `IN` list. A
/// statement over [`PLAN_IN_PLACE_NODES`] reserves this much per node from its memory
/// limits while it is planned ([`planning_bytes`]), so that a long `VALUES` list is refused
/// with `53200` rather than taking the server's memory.
pub const PLANNING_BYTES_PER_NODE: usize = 4 << 10;

/// Expressions and subqueries in `stmt`, counting no further than `stop`.
fn nodes(stmt: &sqlparser::ast::Statement, stop: usize) -> usize {
    use sqlparser::ast::{Expr, Query, Visit, Visitor};
    use std::ops::ControlFlow;
    struct Count(usize, usize);
    impl Count {
        fn one(&mut self) -> ControlFlow<()> {
            self.0 += 1;
            if self.0 > self.1 {
                ControlFlow::Break(())
            } else {
                ControlFlow::Continue(())
            }
        }
    }
    impl Visitor for Count {
        type Break = ();
        fn pre_visit_expr(&mut self, _: &Expr) -> ControlFlow<()> {
            self.one()
        }
        fn pre_visit_query(&mut self, _: &Query) -> ControlFlow<()> {
            self.one()
        }
    }
    let mut count = Count(0, stop);
    let _ = stmt.visit(&mut count);
    count.0
}

/// Whether `stmt` is small enough to plan in place (see [`PLAN_IN_PLACE_NODES`]); stops
/// counting at the limit.
pub fn plans_in_place(stmt: &sqlparser::ast::Statement) -> bool {
    nodes(stmt, PLAN_IN_PLACE_NODES) <= PLAN_IN_PLACE_NODES
}

/// Memory to reserve while `stmt` is planned: nothing for a small statement,
/// [`PLANNING_BYTES_PER_NODE`] for each expression and subquery of a big one. Zero exactly
/// when [`plans_in_place`] (`Session::plan_reserved` walks the statement once, relying on it).
pub fn planning_bytes(stmt: &sqlparser::ast::Statement) -> usize {
    if plans_in_place(stmt) {
        return 0;
    }
    nodes(stmt, usize::MAX).saturating_mul(PLANNING_BYTES_PER_NODE)
}

/// Runs `work` to its end as a task on `runtime` (or here, without one) and returns its
/// output: planning a deep statement takes DataFusion seconds of CPU, which must not hold up
/// the connection thread's other clients. Dropping the returned future (a cancel, a statement
/// timeout, a client gone) aborts the task at its next await point; a panic in it comes back
/// here, where the server's last resort catches it as it would in place.
pub async fn run_on<F>(runtime: Option<&Handle>, work: F) -> Result<F::Output>
where
    F: std::future::Future + Send + 'static,
    F::Output: Send + 'static,
{
    let Some(runtime) = runtime else {
        return Ok(work.await);
    };
    let mut task = AbortOnDrop(runtime.spawn(work));
    match (&mut task.0).await {
        Ok(out) => Ok(out),
        Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
        Err(e) => Err(Error::internal(format!(
            "the planning task was stopped: {e}"
        ))),
    }
}

/// Polls `stream` in a task on `runtime` and hands its items over through a
/// channel of `capacity`: the producer runs at most that far ahead, and
/// dropping the returned stream aborts the task.
pub fn spawn_stream<S>(
    runtime: &Handle,
    stream: S,
    capacity: usize,
) -> impl Stream<Item = S::Item> + Send + 'static
where
    S: Stream + Send + 'static,
    S::Item: Send + 'static,
{
    let (tx, mut rx) = mpsc::channel(capacity.max(1));
    let task = runtime.spawn(async move {
        let mut stream = std::pin::pin!(stream);
        while let Some(item) = stream.next().await {
            if tx.send(item).await.is_err() {
                return; // the consumer is gone
            }
        }
    });
    let abort = AbortOnDrop(task);
    futures::stream::poll_fn(move |cx| {
        let _owned = &abort;
        rx.poll_recv(cx)
    })
}

/// Aborts the task when the consumer (of its stream or output) is dropped.
struct AbortOnDrop<T>(JoinHandle<T>);

impl<T> Drop for AbortOnDrop<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::prelude::SessionContext;

    fn statement(sql: &str) -> sqlparser::ast::Statement {
        match crate::statement::parse(sql).unwrap().remove(0) {
            crate::statement::Parsed::Query(q) => *q,
            other => panic!("not a query: {other:?}"),
        }
    }

    #[test]
    fn small_statements_plan_in_place_and_big_ones_do_not() {
        assert!(plans_in_place(&statement("SELECT 1")));
        assert!(plans_in_place(&statement(
            "SELECT a, count(*) FROM t WHERE b > $1 AND c = 'x' GROUP BY a ORDER BY 2 LIMIT 10"
        )));
        let unions = vec!["SELECT 1"; 100].join(" UNION ALL ");
        assert!(!plans_in_place(&statement(&unions)));
        let ands = format!("SELECT {}", vec!["true"; 100].join(" AND "));
        assert!(!plans_in_place(&statement(&ands)));
        assert_eq!(planning_bytes(&statement("SELECT 1")), 0);
        for sql in ["SELECT 1", unions.as_str(), ands.as_str()] {
            let stmt = statement(sql);
            assert_eq!(planning_bytes(&stmt) == 0, plans_in_place(&stmt), "{sql}");
        }
        let rows: Vec<String> = (0..1000).map(|i| format!("({i})")).collect();
        let values = format!("SELECT count(*) FROM (VALUES {}) AS t(a)", rows.join(","));
        let bytes = planning_bytes(&statement(&values));
        assert!(
            (1000 * PLANNING_BYTES_PER_NODE..1100 * PLANNING_BYTES_PER_NODE).contains(&bytes),
            "{bytes}"
        );
    }

    #[tokio::test]
    async fn run_on_returns_the_output_and_brings_a_panic_back() {
        let rt = query_runtime();
        let here = std::thread::current().id();
        let there = run_on(Some(rt.handle()), async { std::thread::current().id() })
            .await
            .unwrap();
        assert_ne!(here, there, "the work ran on the other runtime");
        assert_eq!(run_on(None, async { 7 }).await.unwrap(), 7);
        let handle = rt.handle().clone();
        let panicked =
            tokio::spawn(
                async move { run_on(Some(&handle), async { panic!("planner bug") }).await },
            )
            .await;
        assert!(panicked.unwrap_err().is_panic());
        rt.shutdown_background();
    }

    fn query_runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("test-query")
            .build()
            .unwrap()
    }

    /// `sql` started on `rt` through [`execute_stream`].
    async fn started_on(rt: &tokio::runtime::Runtime, sql: &str) -> SendableRecordBatchStream {
        let df = SessionContext::new().sql(sql).await.unwrap();
        execute_stream(Some(rt.handle()), df).await.unwrap()
    }

    #[tokio::test]
    async fn a_query_streams_from_the_query_runtime() {
        let rt = query_runtime();
        let stream = started_on(
            &rt,
            "SELECT count(*) AS n, sum(v) AS s FROM generate_series(1, 100000) AS t(v)",
        )
        .await;
        assert_eq!(stream.schema().field(0).name(), "n");
        let batches: Vec<_> = stream.collect().await;
        let batch = batches.into_iter().next().unwrap().unwrap();
        let sum = batch
            .column(1)
            .as_any()
            .downcast_ref::<arrow::array::Int64Array>()
            .unwrap()
            .value(0);
        assert_eq!(sum, 5_000_050_000);
        rt.shutdown_background();
    }

    #[tokio::test]
    async fn an_error_while_running_reaches_the_consumer() {
        let rt = query_runtime();
        let stream = started_on(&rt, "SELECT v / (v - v) FROM generate_series(1, 3) AS t(v)").await;
        let items: Vec<_> = stream.collect().await;
        let err = items.into_iter().find_map(|b| b.err()).unwrap();
        assert!(err.to_string().contains("Divide by zero"), "{err}");
        rt.shutdown_background();
    }

    #[tokio::test]
    async fn dropping_the_stream_stops_the_query() {
        let rt = query_runtime();
        let mut stream =
            started_on(&rt, "SELECT v FROM generate_series(1, 1000000000) AS t(v)").await;
        assert!(stream.next().await.unwrap().is_ok());
        drop(stream);
        // the producer was aborted: the runtime has no task left
        let metrics = rt.metrics();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while metrics.num_alive_tasks() > 0 {
            assert!(
                std::time::Instant::now() < deadline,
                "the query kept running"
            );
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        rt.shutdown_background();
    }
}
