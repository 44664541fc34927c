//! Bridges raft-rs's `slog` records into `tracing` (target `raft`), so the node logs through
//! the same subscriber as the rest of Sluice. Key-value pairs are appended as ` key=value`.

use std::fmt::Write as _;

use slog::{Drain, Level, OwnedKVList, Record, KV};

/// A `slog` root logger for raft-rs that forwards to `tracing`.
pub(crate) fn raft_logger(id: u64) -> slog::Logger {
    slog::Logger::root(TracingDrain, slog::o!("raft_id" => id))
}

struct TracingDrain;

impl Drain for TracingDrain {
    type Ok = ();
    type Err = slog::Never;

    fn log(&self, record: &Record<'_>, values: &OwnedKVList) -> Result<(), slog::Never> {
        let mut kv = KvText(String::new());
        // Formatting into a String cannot fail in a way worth reporting from a log call.
        let _ = record.kv().serialize(record, &mut kv);
        let _ = values.serialize(record, &mut kv);
        let (msg, kv) = (record.msg(), kv.0);
        match record.level() {
            Level::Critical | Level::Error => tracing::error!(target: "raft", "{msg}{kv}"),
            Level::Warning => tracing::warn!(target: "raft", "{msg}{kv}"),
            Level::Info => tracing::info!(target: "raft", "{msg}{kv}"),
            Level::Debug => tracing::debug!(target: "raft", "{msg}{kv}"),
            Level::Trace => tracing::trace!(target: "raft", "{msg}{kv}"),
        }
        Ok(())
    }
}

struct KvText(String);

impl slog::Serializer for KvText {
    fn emit_arguments(&mut self, key: slog::Key, val: &std::fmt::Arguments<'_>) -> slog::Result {
        let _ = write!(self.0, " {key}={val}");
        Ok(())
    }
}
