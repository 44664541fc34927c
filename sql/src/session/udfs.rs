//! Functions that need the session: `pg_notify()`, `version()`,
//! `pg_backend_pid()`, registered in each session's DataFusion context.

use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::sync::Arc;

use arrow::datatypes::DataType;
use datafusion::scalar::ScalarValue;

use crate::notify::{self, Notification};

/// What `pg_notify` (a DataFusion function) needs from its session.
#[derive(Debug)]
pub(super) struct NotifyState {
    pub(super) hub: Arc<notify::Hub>,
    pub(super) catalog: Arc<crate::catalog::Catalog>,
    pub(super) pid: AtomicI32,
    pub(super) in_block: AtomicBool,
    pub(super) pending: parking_lot::Mutex<Vec<Notification>>,
}

impl NotifyState {
    pub(super) fn send(&self, channel: String, payload: String) {
        let n = Notification {
            pid: self.pid.load(Ordering::Relaxed),
            channel,
            payload,
            watermark: None,
        };
        if self.in_block.load(Ordering::Acquire) {
            // stamped with the watermark at COMMIT
            self.pending.lock().push(n);
        } else {
            self.hub.publish(&Notification {
                watermark: Some(notify::watermark(&self.catalog)),
                ..n
            });
        }
    }
}

/// `pg_notify(channel, payload)`: notify on commit of the calling session.
pub(super) fn pg_notify_udf(state: Arc<NotifyState>) -> datafusion::logical_expr::ScalarUDF {
    use arrow::array::Array;
    use datafusion::logical_expr::{create_udf, ColumnarValue, Volatility};
    let f = move |args: &[ColumnarValue]| -> datafusion::error::Result<ColumnarValue> {
        let arrays = ColumnarValue::values_to_arrays(args)?;
        if let [channels, payloads] = arrays.as_slice() {
            let channels = arrow::compute::cast(channels, &DataType::Utf8)?;
            let payloads = arrow::compute::cast(payloads, &DataType::Utf8)?;
            let (c, p) = (
                arrow::array::AsArray::as_string::<i32>(&channels),
                arrow::array::AsArray::as_string::<i32>(&payloads),
            );
            for i in 0..c.len() {
                if let Some(ch) = c.is_valid(i).then(|| c.value(i)) {
                    let payload = if p.is_valid(i) {
                        p.value(i).to_string()
                    } else {
                        String::new()
                    };
                    state.send(ch.to_string(), payload);
                }
            }
        }
        Ok(ColumnarValue::Scalar(ScalarValue::Utf8(None)))
    };
    create_udf(
        "pg_notify",
        vec![DataType::Utf8, DataType::Utf8],
        DataType::Utf8,
        Volatility::Volatile,
        Arc::new(f),
    )
}

/// Session functions clients call while connecting: `version()` (clients
/// parse `PostgreSQL X.Y`), `pg_backend_pid()`.
pub(super) fn session_udfs(state: Arc<NotifyState>) -> Vec<datafusion::logical_expr::ScalarUDF> {
    use datafusion::logical_expr::{create_udf, ColumnarValue, Volatility};
    let version = format!(
        "PostgreSQL {} (Sluice {}) on {}-linux, 64-bit",
        crate::SERVER_VERSION,
        env!("CARGO_PKG_VERSION"),
        std::env::consts::ARCH
    );
    let version_fn = move |_: &[ColumnarValue]| -> datafusion::error::Result<ColumnarValue> {
        Ok(ColumnarValue::Scalar(ScalarValue::Utf8(Some(
            version.clone(),
        ))))
    };
    let pid_fn = move |_: &[ColumnarValue]| -> datafusion::error::Result<ColumnarValue> {
        Ok(ColumnarValue::Scalar(ScalarValue::Int32(Some(
            state.pid.load(Ordering::Relaxed),
        ))))
    };
    vec![
        create_udf(
            "version",
            vec![],
            DataType::Utf8,
            Volatility::Stable,
            Arc::new(version_fn),
        ),
        create_udf(
            "pg_backend_pid",
            vec![],
            DataType::Int32,
            Volatility::Stable,
            Arc::new(pid_fn),
        ),
    ]
}
