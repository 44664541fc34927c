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
//! for any stream (the server encodes COPY data there).
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

/// Aborts the producing task when the consumer's stream is dropped.
struct AbortOnDrop(JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::prelude::SessionContext;

    fn query_runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("test-query")
            .build()
            .unwrap()
    }

    /// `sql` started on `rt` through [`execute_stream`].
    async fn run_on(rt: &tokio::runtime::Runtime, sql: &str) -> SendableRecordBatchStream {
        let df = SessionContext::new().sql(sql).await.unwrap();
        execute_stream(Some(rt.handle()), df).await.unwrap()
    }

    #[tokio::test]
    async fn a_query_streams_from_the_query_runtime() {
        let rt = query_runtime();
        let stream = run_on(
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
        let stream = run_on(&rt, "SELECT v / (v - v) FROM generate_series(1, 3) AS t(v)").await;
        let items: Vec<_> = stream.collect().await;
        let err = items.into_iter().find_map(|b| b.err()).unwrap();
        assert!(err.to_string().contains("Divide by zero"), "{err}");
        rt.shutdown_background();
    }

    #[tokio::test]
    async fn dropping_the_stream_stops_the_query() {
        let rt = query_runtime();
        let mut stream = run_on(&rt, "SELECT v FROM generate_series(1, 1000000000) AS t(v)").await;
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
