//! The server's log: lines on stderr, as text or JSON (`--log-format`), filtered by
//! `--log-level` (or `SLUICE_LOG`; a `tracing` filter such as `info,sluice_sql=debug`).
//!
//! Statements that run at least the session's `log_min_duration_statement` are logged
//! with their duration ([`statement_duration`]): a simple query string from its arrival to
//! ReadyForQuery, an Execute from its arrival until its rows have been sent.
//!
//! Invariants: terminal colour codes are written only when stderr is a terminal (and
//! `NO_COLOR` is unset), so a log file or a collector never gets escape sequences; a filter
//! that does not parse stops the server at startup rather than logging less than asked.

use std::io::IsTerminal;

use clap::ValueEnum;

/// How log lines look.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    /// One human-readable line per event.
    #[default]
    Text,
    /// One JSON object per line (timestamp, level, target, fields).
    Json,
}

/// What runs when no level is given.
pub const DEFAULT_FILTER: &str = "info,datafusion=warn";

/// Installs the global subscriber; `level` (a filter) wins over `SLUICE_LOG`.
pub fn init(format: LogFormat, level: Option<&str>) -> Result<(), String> {
    let filter = match level {
        Some(l) => tracing_subscriber::EnvFilter::try_new(l)
            .map_err(|e| format!("--log-level {l}: {e}"))?,
        None => match std::env::var("SLUICE_LOG") {
            Ok(l) => tracing_subscriber::EnvFilter::try_new(&l)
                .map_err(|e| format!("SLUICE_LOG={l}: {e}"))?,
            Err(_) => tracing_subscriber::EnvFilter::new(DEFAULT_FILTER),
        },
    };
    let ansi = std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none();
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(ansi);
    match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().try_init(),
    }
    .map_err(|e| format!("logging: {e}"))
}

/// Longest statement text a duration line carries; a longer one is cut at a
/// character boundary and says how long it was.
pub const STATEMENT_TEXT_BYTES: usize = 1024;

/// Logs a statement that ran for `elapsed`, if that is at least the session's
/// `log_min_duration_statement` (`threshold`; `None` logs nothing), as
/// PostgreSQL's `duration: 12.345 ms  statement: ...` line, under the target
/// `sluice::statement`. Its parameters are not logged.
pub fn statement_duration(
    threshold: Option<std::time::Duration>,
    elapsed: std::time::Duration,
    text: &str,
) {
    match threshold {
        Some(t) if elapsed >= t => {
            let ms = elapsed.as_secs_f64() * 1000.0;
            tracing::info!(
                target: "sluice::statement",
                duration_ms = ms,
                "duration: {ms:.3} ms  statement: {}",
                shortened(text)
            );
        }
        _ => {}
    }
}

/// The statement text a log line carries (see [`STATEMENT_TEXT_BYTES`]).
pub fn shortened(text: &str) -> std::borrow::Cow<'_, str> {
    if text.len() <= STATEMENT_TEXT_BYTES {
        return text.into();
    }
    let mut end = STATEMENT_TEXT_BYTES;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}... ({} bytes)", &text[..end], text.len()).into()
}
