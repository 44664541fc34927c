//! What stops a statement before it ends by itself: the client's cancel request and
//! `statement_timeout`.
//!
//! A statement runs in two phases: [`crate::Session::execute`] plans it (for a write, also
//! builds and proposes its command) and returns its output, then the wire layer streams the
//! output's rows. One [`Interrupt`] covers both: `execute` races the statement against
//! [`Interrupt::fired`], and [`Interrupt::guard`] wraps the stream it returns, so a cancel or
//! a timeout while rows stream ends the stream with `57014` and drops the plan — the query
//! runtime's task is aborted and its memory released (see [`crate::executor`]).
//!
//! A plan's task can only be stopped where it yields to the runtime. DataFusion yields where
//! an operator waits and where a leaf's batches use up the task's cooperative budget; a join
//! emits many batches per input batch without touching it, so `count(*)` over a cross join
//! would never yield, and aborting its task would do nothing. [`YieldPoints`], a physical
//! optimizer rule, makes the output of every operator that multiplies batches (joins,
//! recursive queries, unnest) use the budget too.
//!
//! Invariants: the timeout counts from the start of the statement, through planning and
//! streaming alike, tails included (a COPY tail or a waiting FETCH is a statement too); only
//! a cancel that arrives after the statement started stops it; a statement whose write has
//! been proposed is not interrupted ([`Session::execute`](crate::Session::execute) waits for
//! the outcome, which Raft's own waits bound).
//!
//! [`CancelWatch`] is a session's cancel signal as one statement sees it; tails and cursors
//! wait on it too, and a cancel is always [`cancelled_error`] (`57014`).

use std::sync::Arc;
use std::time::Duration;

use datafusion::common::config::ConfigOptions;
use datafusion::common::tree_node::{Transformed, TreeNode};
use datafusion::error::DataFusionError;
use datafusion::execution::SendableRecordBatchStream;
use datafusion::physical_optimizer::PhysicalOptimizerRule;
use datafusion::physical_plan::coop::CooperativeExec;
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::ExecutionPlan;
use futures::StreamExt;
use tokio::sync::watch;
use tokio::time::Instant;

use crate::error::{sqlstate, Error, Result};

/// The name of the setting.
pub const STATEMENT_TIMEOUT: &str = "statement_timeout";

/// The stop conditions of one running statement.
#[derive(Debug, Clone)]
pub struct Interrupt {
    cancel: CancelWatch,
    deadline: Option<Instant>,
}

impl Interrupt {
    /// Starts the clock: `timeout` from now, if any.
    pub fn new(cancel: CancelWatch, timeout: Option<Duration>) -> Interrupt {
        Interrupt {
            cancel,
            deadline: timeout.map(|t| Instant::now() + t),
        }
    }

    /// An error if the statement must stop now.
    pub fn check(&self) -> Result<()> {
        if self.cancel.cancelled() {
            return Err(cancelled_error());
        }
        match self.deadline {
            Some(d) if Instant::now() >= d => Err(timeout_error()),
            _ => Ok(()),
        }
    }

    /// Resolves, with the error to report, when the statement must stop.
    pub async fn fired(&mut self) -> Error {
        match self.deadline {
            Some(deadline) => tokio::select! {
                biased;
                _ = self.cancel.wait() => cancelled_error(),
                _ = tokio::time::sleep_until(deadline) => timeout_error(),
            },
            None => {
                self.cancel.wait().await;
                cancelled_error()
            }
        }
    }

    /// `stream`, ended by an error (`57014`) as soon as the statement must stop; the inner
    /// stream is dropped then, which stops the plan behind it.
    pub fn guard(self, stream: SendableRecordBatchStream) -> SendableRecordBatchStream {
        let schema = stream.schema();
        let guarded = futures::stream::unfold(Some((stream, self)), |state| async move {
            let (mut stream, mut interrupt) = state?;
            tokio::select! {
                biased;
                item = stream.next() => item.map(|item| (item, Some((stream, interrupt)))),
                e = interrupt.fired() => Some((Err(DataFusionError::External(Box::new(e))), None)),
            }
        });
        Box::pin(RecordBatchStreamAdapter::new(schema, guarded))
    }
}

/// Wraps each operator that can emit many batches per input batch in DataFusion's
/// [`CooperativeExec`], so its consumer yields every so many batches (see the module doc).
#[derive(Debug, Default)]
pub struct YieldPoints;

impl PhysicalOptimizerRule for YieldPoints {
    fn optimize(
        &self,
        plan: Arc<dyn ExecutionPlan>,
        _: &ConfigOptions,
    ) -> datafusion::error::Result<Arc<dyn ExecutionPlan>> {
        plan.transform_up(|p| {
            let multiplies =
                p.children().len() >= 2 || matches!(p.name(), "RecursiveQueryExec" | "UnnestExec");
            Ok(if multiplies {
                Transformed::yes(Arc::new(CooperativeExec::new(p)) as Arc<dyn ExecutionPlan>)
            } else {
                Transformed::no(p)
            })
        })
        .map(|t| t.data)
    }

    fn name(&self) -> &str {
        "sluice_yield_points"
    }

    fn schema_check(&self) -> bool {
        true
    }
}

pub fn timeout_error() -> Error {
    Error::new(
        sqlstate::QUERY_CANCELED,
        "canceling statement due to statement timeout",
    )
}

/// `statement_timeout` as PostgreSQL takes it: milliseconds, or a number with a unit
/// (`'2s'`, `'500ms'`, `'1min'`); 0 turns it off.
pub fn parse_timeout(value: &str) -> Result<Option<Duration>> {
    let ms = crate::units::parse_duration_ms(value).map_err(|_| {
        Error::new(
            sqlstate::INVALID_PARAMETER_VALUE,
            format!("invalid value for parameter \"{STATEMENT_TIMEOUT}\": \"{value}\""),
        )
    })?;
    if ms > i32::MAX as u64 {
        return Err(Error::new(
            sqlstate::INVALID_PARAMETER_VALUE,
            format!(
                "{ms} ms is outside the valid range for parameter \"{STATEMENT_TIMEOUT}\" (0 .. {})",
                i32::MAX
            ),
        ));
    }
    Ok((ms > 0).then(|| Duration::from_millis(ms)))
}

/// How SHOW displays a timeout: `0`, `250ms`, `2s`, `5min`, `1h`, `1d`, as PostgreSQL does.
pub fn format_timeout(timeout: Option<Duration>) -> String {
    let Some(t) = timeout else {
        return "0".into();
    };
    let ms = t.as_millis();
    for (unit, size) in [
        ("d", 86_400_000),
        ("h", 3_600_000),
        ("min", 60_000),
        ("s", 1000),
    ] {
        if ms % size == 0 {
            return format!("{}{unit}", ms / size);
        }
    }
    format!("{ms}ms")
}

/// Signals a running statement that the client asked to cancel it.
#[derive(Debug, Clone)]
pub struct CancelWatch {
    rx: watch::Receiver<u64>,
    seen: u64,
}

impl CancelWatch {
    pub fn new(rx: watch::Receiver<u64>) -> CancelWatch {
        let seen = *rx.borrow();
        CancelWatch { rx, seen }
    }

    pub fn cancelled(&self) -> bool {
        *self.rx.borrow() != self.seen
    }

    /// Resolves when a cancel arrives (never, if the sender is gone).
    pub async fn wait(&mut self) {
        loop {
            if self.cancelled() {
                return;
            }
            if self.rx.changed().await.is_err() {
                futures::future::pending::<()>().await;
            }
        }
    }
}

pub fn cancelled_error() -> Error {
    Error::new(
        sqlstate::QUERY_CANCELED,
        "canceling statement due to user request",
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::datatypes::Schema;

    #[test]
    fn timeouts_parse_and_print_like_postgres() {
        assert_eq!(parse_timeout("0").unwrap(), None);
        assert_eq!(
            parse_timeout("1500").unwrap(),
            Some(Duration::from_millis(1500))
        );
        assert_eq!(parse_timeout("2s").unwrap(), Some(Duration::from_secs(2)));
        assert_eq!(
            parse_timeout("1min").unwrap(),
            Some(Duration::from_secs(60))
        );
        assert!(parse_timeout("-1").is_err());
        assert!(parse_timeout("soon").is_err());
        assert!(parse_timeout("30d").is_err());
        assert_eq!(format_timeout(None), "0");
        assert_eq!(format_timeout(Some(Duration::from_millis(2000))), "2s");
        assert_eq!(format_timeout(Some(Duration::from_millis(1500))), "1500ms");
        assert_eq!(format_timeout(Some(Duration::from_secs(120))), "2min");
    }

    /// A stream that never yields, standing in for a plan that computes for a long time.
    fn endless() -> (SendableRecordBatchStream, Arc<()>) {
        let alive = Arc::new(());
        let held = alive.clone();
        let s = futures::stream::pending().map(move |b| {
            let _ = &held;
            b
        });
        let stream = Box::pin(RecordBatchStreamAdapter::new(Arc::new(Schema::empty()), s));
        (stream, alive)
    }

    #[tokio::test]
    async fn a_timeout_ends_the_stream_and_drops_the_plan() {
        let (_tx, rx) = watch::channel(0);
        let (stream, alive) = endless();
        let interrupt = Interrupt::new(CancelWatch::new(rx), Some(Duration::from_millis(50)));
        let mut guarded = interrupt.guard(stream);
        let err = guarded.next().await.unwrap().unwrap_err();
        assert_eq!(Error::from(err), timeout_error());
        assert!(guarded.next().await.is_none());
        assert_eq!(Arc::strong_count(&alive), 1, "the inner stream was dropped");
    }

    #[tokio::test]
    async fn a_cancel_after_the_start_ends_the_stream_one_before_does_not() {
        let (tx, rx) = watch::channel(0);
        tx.send_modify(|v| *v += 1); // before the statement: ignored
        let (stream, _alive) = endless();
        let interrupt = Interrupt::new(CancelWatch::new(rx), None);
        assert!(interrupt.check().is_ok());
        let mut guarded = interrupt.guard(stream);
        let next = tokio::time::timeout(Duration::from_millis(50), guarded.next()).await;
        assert!(next.is_err(), "nothing to report yet");
        tx.send_modify(|v| *v += 1);
        let err = guarded.next().await.unwrap().unwrap_err();
        assert_eq!(Error::from(err), cancelled_error());
    }
}
