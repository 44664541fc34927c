//! Sluice's storage: per stream, a log of Arrow IPC record batches in
//! segment files. Knows nothing of SQL, Postgres or Raft.
//!
//! Data flows top-down through the modules: [`stream_log`] assigns offsets
//! and keeps the index of a stream, [`segment`] owns one file of frames, and
//! [`frame`] is the byte format of one batch on disk. Durability is explicit:
//! appends are not fsynced; [`StreamLog::sync`] returns a
//! [`StreamCheckpoint`] that the caller stores, and [`StreamLog::open`]
//! restores exactly that position, so the caller replays the rest from its
//! own log. [`durable`] holds the write-fsync-and-sync-the-directory helpers
//! the other crates use for files beside the logs. [`Error`] is the crate's
//! one error type.

pub mod durable;
pub mod error;
pub mod frame;
pub mod segment;
pub mod stream_log;

pub use error::{Error, Result};
pub use stream_log::{
    BatchMeta, PendingSync, SegmentInfo, StreamCheckpoint, StreamLog, StreamLogOptions,
};
