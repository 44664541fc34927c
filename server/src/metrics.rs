//! The Prometheus endpoint: `GET /metrics` on `--metrics-listen` answers the server's
//! counters (`sluice_stats`), every stream's shape (`sluice_streams`), the cluster's view of
//! itself (`sluice_cluster`), each consumer's committed offset and lag (`consumer_offsets`
//! against the stream's next offset), the Raft node's histograms (fsync time, entries
//! per fsync, checkpoint time, proposal-to-answer time) and the connections' request time
//! ([`REQUESTS`]), in Prometheus' text format 0.0.4.
//!
//! It owns a deliberately small HTTP/1.1 responder — one request per connection, answered
//! with `Connection: close` — rather than an HTTP stack: a scrape is the only request it
//! serves.
//!
//! Invariants: a request head is read with a cap of [`MAX_REQUEST_BYTES`] and the whole
//! exchange with a deadline of [`DEADLINE`]; at most [`MAX_SCRAPES`] run at once (more are
//! closed at once); the views are read through an ordinary session, as a SQL client reads
//! them, so the endpoint shows nothing a client could not see and cannot change anything.
//! It has no authentication: keep it on loopback or behind a firewall (README).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::{Arc, LazyLock};
use std::time::Duration;

use arrow::array::RecordBatch;
use arrow::util::display::array_value_to_string;
use futures::StreamExt;
use sluice_consensus::metrics::{Histogram, LATENCY_MICROS};
use sluice_sql::{Engine, Output, Session};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

/// The time of every client request in this process, in microseconds: from its first message
/// read to its ReadyForQuery written (crate::connection); a tailing query counts until it
/// ends. One per process, as its connections are.
pub static REQUESTS: LazyLock<Histogram> = LazyLock::new(|| Histogram::new(LATENCY_MICROS));

/// The largest request head read; a scrape's is a few hundred bytes.
pub const MAX_REQUEST_BYTES: usize = 8 << 10;
/// Time for one exchange, from accept to the last byte of the answer.
pub const DEADLINE: Duration = Duration::from_secs(10);
/// Scrapes answered at once.
pub const MAX_SCRAPES: usize = 8;
/// Prometheus' text exposition format.
const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Serves `/metrics` on `listener` until `shutdown`.
pub async fn serve(listener: TcpListener, engine: Arc<Engine>, shutdown: CancellationToken) {
    let permits = Arc::new(Semaphore::new(MAX_SCRAPES));
    loop {
        let accepted = tokio::select! {
            _ = shutdown.cancelled() => return,
            accepted = listener.accept() => accepted,
        };
        let (socket, peer) = match accepted {
            Ok(a) => a,
            Err(e) => {
                tracing::warn!("metrics endpoint: accept failed: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let Ok(permit) = permits.clone().try_acquire_owned() else {
            continue; // busy: dropping the socket closes it
        };
        let engine = engine.clone();
        tokio::spawn(async move {
            let _permit = permit;
            match tokio::time::timeout(DEADLINE, answer(socket, &engine)).await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => tracing::debug!(%peer, "metrics request failed: {e}"),
                Err(_) => tracing::debug!(%peer, "metrics request took over {DEADLINE:?}"),
            }
        });
    }
}

/// Reads one request and answers it.
async fn answer(mut socket: TcpStream, engine: &Arc<Engine>) -> std::io::Result<()> {
    let head = read_head(&mut socket).await?;
    let complete = head.windows(4).any(|w| w == b"\r\n\r\n");
    let (status, content_type, body) = match request_line(&head) {
        _ if !complete && head.len() >= MAX_REQUEST_BYTES => (
            "431 Request Header Fields Too Large",
            "text/plain",
            format!("a request head is at most {MAX_REQUEST_BYTES} bytes\n"),
        ),
        Some((method @ ("GET" | "HEAD"), "/metrics")) => match render(engine).await {
            Ok(text) => (
                "200 OK",
                CONTENT_TYPE,
                if method == "HEAD" {
                    String::new()
                } else {
                    text
                },
            ),
            Err(e) => (
                "500 Internal Server Error",
                "text/plain",
                format!("{}\n", e.message),
            ),
        },
        Some((_, "/metrics")) => (
            "405 Method Not Allowed",
            "text/plain",
            "only GET /metrics\n".into(),
        ),
        Some(_) => ("404 Not Found", "text/plain", "only GET /metrics\n".into()),
        None => (
            "400 Bad Request",
            "text/plain",
            "a request line is: GET /metrics HTTP/1.1\n".into(),
        ),
    };
    let response = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\n\
         Connection: close\r\n\r\n{body}",
        body.len()
    );
    socket.write_all(response.as_bytes()).await?;
    socket.shutdown().await
}

/// The request head, up to the blank line (or [`MAX_REQUEST_BYTES`], or the end of input).
async fn read_head(socket: &mut TcpStream) -> std::io::Result<Vec<u8>> {
    let mut head = Vec::with_capacity(512);
    let mut buf = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < MAX_REQUEST_BYTES {
        let n = socket.read(&mut buf).await?;
        if n == 0 {
            break;
        }
        head.extend_from_slice(&buf[..n.min(MAX_REQUEST_BYTES - head.len())]);
    }
    Ok(head)
}

/// The method and path (without a query string) of `head`'s request line.
fn request_line(head: &[u8]) -> Option<(&str, &str)> {
    let line = head.split(|&b| b == b'\n').next()?;
    let line = std::str::from_utf8(line).ok()?.trim_end_matches('\r');
    let mut parts = line.split(' ');
    let (method, target, version) = (parts.next()?, parts.next()?, parts.next()?);
    if parts.next().is_some() || !version.starts_with("HTTP/1.") {
        return None;
    }
    Some((method, target.split('?').next().unwrap_or(target)))
}

/// The metrics as Prometheus text.
pub async fn render(engine: &Arc<Engine>) -> sluice_sql::Result<String> {
    let mut session = Session::new(engine.clone())?;
    let mut text = Text::default();
    for (name, value) in engine.stats() {
        let (metric, kind) = match name {
            "streams" => ("sluice_streams".to_string(), "gauge"),
            "sessions" => ("sluice_sessions".to_string(), "gauge"),
            _ => (format!("sluice_{name}_total"), "counter"),
        };
        text.family(&metric, kind, &format!("sluice_stats.{name}"));
        text.sample(&metric, &[], value);
    }
    let streams = rows(
        &mut session,
        "SELECT name, first_offset, next_offset, bytes, segments, \
         date_part('epoch', oldest_ts) FROM sluice_streams ORDER BY name",
    )
    .await?;
    for (i, (metric, help)) in [
        ("sluice_stream_first_offset", "first retained offset"),
        ("sluice_stream_next_offset", "offset the next append gets"),
        ("sluice_stream_bytes", "bytes of segment files"),
        ("sluice_stream_segments", "segment files"),
        (
            "sluice_stream_oldest_timestamp_seconds",
            "ts of the oldest retained row, Unix seconds",
        ),
    ]
    .into_iter()
    .enumerate()
    {
        text.family(metric, "gauge", help);
        for row in &streams {
            if !row[i + 1].is_empty() {
                text.sample(metric, &[("stream", &row[0])], &row[i + 1]);
            }
        }
    }
    let consumers = rows(
        &mut session,
        "SELECT c.consumer, c.stream, c.\"offset\", s.next_offset FROM consumer_offsets c \
         JOIN sluice_streams s ON s.name = c.stream ORDER BY c.consumer, c.stream",
    )
    .await?;
    text.family(
        "sluice_consumer_offset",
        "gauge",
        "offset a consumer committed (consumer_offsets)",
    );
    for row in &consumers {
        let labels = [("consumer", row[0].as_str()), ("stream", row[1].as_str())];
        text.sample("sluice_consumer_offset", &labels, &row[2]);
    }
    text.family(
        "sluice_consumer_lag",
        "gauge",
        "rows appended after a consumer's committed offset",
    );
    for row in &consumers {
        let labels = [("consumer", row[0].as_str()), ("stream", row[1].as_str())];
        let (offset, next) = (row[2].parse::<i64>(), row[3].parse::<i64>());
        if let (Ok(offset), Ok(next)) = (offset, next) {
            text.sample("sluice_consumer_lag", &labels, (next - 1 - offset).max(0));
        }
    }
    let cluster = rows(
        &mut session,
        "SELECT node_id, role, is_self, term, commit_index, applied_index, lag \
         FROM sluice_cluster ORDER BY node_id",
    )
    .await?;
    text.family(
        "sluice_raft_leader",
        "gauge",
        "1 when this node is the leader",
    );
    let this = cluster.iter().find(|r| r[2] == "true");
    let leader = this.is_some_and(|r| r[1] == "leader");
    text.sample("sluice_raft_leader", &[], u8::from(leader));
    for (i, metric, help) in [
        (3, "sluice_raft_term", "this node's Raft term"),
        (4, "sluice_raft_commit_index", "this node's commit index"),
        (5, "sluice_raft_applied_index", "this node's applied index"),
    ] {
        text.family(metric, "gauge", help);
        if let Some(row) = this.filter(|r| !r[i].is_empty()) {
            text.sample(metric, &[], &row[i]);
        }
    }
    text.family(
        "sluice_raft_peer_lag",
        "gauge",
        "entries a peer is behind the leader (on the leader)",
    );
    for row in cluster
        .iter()
        .filter(|r| r[2] != "true" && !r[6].is_empty())
    {
        text.sample("sluice_raft_peer_lag", &[("node_id", &row[0])], &row[6]);
    }
    let raft = engine.raft_metrics();
    for (name, help, h, per_unit) in [
        (
            "sluice_log_fsync_seconds",
            "time of each fsync of the Raft log",
            &raft.fsync_micros,
            1e6,
        ),
        (
            "sluice_log_entries_per_fsync",
            "Raft log entries made durable by one fsync (group commit)",
            &raft.entries_per_fsync,
            1.0,
        ),
        (
            "sluice_checkpoint_seconds",
            "time the Raft node's thread spends on each state-machine checkpoint and log \
             compaction (commits wait for it; a periodic checkpoint's fsyncs run on another \
             thread and are not counted)",
            &raft.checkpoint_micros,
            1e6,
        ),
        (
            "sluice_commit_seconds",
            "from a proposal being sent to the Raft node (its queue wait included) to its answer, applied on this node",
            &raft.commit_micros,
            1e6,
        ),
    ] {
        text.histogram(name, help, &h.snapshot(), per_unit);
    }
    text.histogram(
        "sluice_request_seconds",
        "a client request's time in the server: its first message read to its ReadyForQuery \
         written",
        &REQUESTS.snapshot(),
        1e6,
    );
    if let Some(rss) = resident_bytes() {
        text.family(
            "process_resident_memory_bytes",
            "gauge",
            "resident set size",
        );
        text.sample("process_resident_memory_bytes", &[], rss);
    }
    Ok(text.out)
}

/// Runs `sql` and returns its rows as text (NULL as the empty string).
async fn rows(session: &mut Session, sql: &str) -> sluice_sql::Result<Vec<Vec<String>>> {
    let mut out = Vec::new();
    for result in session.simple_query(sql).await {
        if let Output::Rows { mut stream, .. } = result? {
            while let Some(batch) = stream.next().await {
                push_rows(&batch?, &mut out)?;
            }
        }
    }
    Ok(out)
}

fn push_rows(batch: &RecordBatch, out: &mut Vec<Vec<String>>) -> sluice_sql::Result<()> {
    for row in 0..batch.num_rows() {
        let mut cells = Vec::with_capacity(batch.num_columns());
        for column in batch.columns() {
            cells.push(if column.is_null(row) {
                String::new()
            } else {
                array_value_to_string(column, row)
                    .map_err(|e| sluice_sql::Error::internal(e.to_string()))?
            });
        }
        out.push(cells);
    }
    Ok(())
}

/// VmRSS of `/proc/self/status`, in bytes (Linux).
fn resident_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kb: u64 = line["VmRSS:".len()..]
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    Some(kb * 1024)
}

/// Prometheus text being written: families in order, each with its HELP and TYPE lines.
#[derive(Default)]
struct Text {
    out: String,
}

impl Text {
    fn family(&mut self, name: &str, kind: &str, help: &str) {
        let help = help.replace('\\', "\\\\").replace('\n', "\\n");
        let _ = writeln!(self.out, "# HELP {name} {help}\n# TYPE {name} {kind}");
    }

    /// A histogram family: cumulative `_bucket`s, `_sum`, `_count`, in the histogram's unit
    /// divided by `per_unit` (1e6: microseconds as seconds).
    fn histogram(
        &mut self,
        name: &str,
        help: &str,
        h: &sluice_consensus::metrics::HistogramSnapshot,
        per_unit: f64,
    ) {
        self.family(name, "histogram", help);
        let bucket = format!("{name}_bucket");
        for (bound, n) in &h.buckets {
            self.sample(
                &bucket,
                &[("le", &(*bound as f64 / per_unit).to_string())],
                n,
            );
        }
        self.sample(&bucket, &[("le", "+Inf")], h.count);
        self.sample(&format!("{name}_sum"), &[], h.sum as f64 / per_unit);
        self.sample(&format!("{name}_count"), &[], h.count);
    }

    fn sample(&mut self, name: &str, labels: &[(&str, &str)], value: impl std::fmt::Display) {
        self.out.push_str(name);
        if !labels.is_empty() {
            let labels: BTreeMap<&str, String> =
                labels.iter().map(|(k, v)| (*k, escape_label(v))).collect();
            let inner: Vec<String> = labels.iter().map(|(k, v)| format!("{k}=\"{v}\"")).collect();
            let _ = write!(self.out, "{{{}}}", inner.join(","));
        }
        let _ = writeln!(self.out, " {value}");
    }
}

/// A label value as the text format quotes it: backslash, double quote and newline escaped.
fn escape_label(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_lines_are_read_strictly() {
        assert_eq!(
            request_line(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"),
            Some(("GET", "/metrics"))
        );
        assert_eq!(
            request_line(b"GET /metrics?name=x HTTP/1.0\r\n\r\n"),
            Some(("GET", "/metrics"))
        );
        assert_eq!(request_line(b"GET /metrics\r\n\r\n"), None);
        assert_eq!(request_line(b"GET /metrics SPDY/3 extra\r\n"), None);
        assert_eq!(request_line(b"\xff\xfe /metrics HTTP/1.1\r\n"), None);
        assert_eq!(request_line(b""), None);
    }

    #[test]
    fn label_values_are_escaped() {
        let mut text = Text::default();
        text.family("m", "gauge", "a\nb");
        text.sample("m", &[("stream", "a\"b\\c\nd")], 1);
        assert_eq!(
            text.out,
            "# HELP m a\\nb\n# TYPE m gauge\nm{stream=\"a\\\"b\\\\c\\nd\"} 1\n"
        );
    }
}
