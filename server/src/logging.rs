//! The server's log: lines on stderr, as text or JSON (`--log-format`), filtered by
//! `--log-level` (or `SLUICE_LOG`; a `tracing` filter such as `info,sluice_sql=debug`).
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
