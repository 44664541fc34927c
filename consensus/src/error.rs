//! The crate's one error type. Everything here is non-deterministic (disk, corruption, a
//! misbehaving state machine): none of it is the outcome of a command, which the state machine
//! reports inside its own `Response`. Proposal outcomes have their own type, [`ProposeError`].
//!
//! [`ProposeError`]: crate::ProposeError

use std::io;
use std::path::PathBuf;

/// Result with the crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Errors from opening, recovering or running the consensus node.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// An I/O operation failed; `context` says which one and on what path.
    #[error("{context}: {source}")]
    Io {
        context: String,
        #[source]
        source: io::Error,
    },
    /// A complete record whose checksum or contents are wrong: the log cannot be trusted, so
    /// the node refuses to start rather than guess.
    #[error("corrupt log record in {file} at byte {offset}: {reason}")]
    Corrupt {
        file: PathBuf,
        offset: u64,
        reason: String,
    },
    /// Encoding or decoding a Raft protobuf message failed.
    #[error("protobuf: {0}")]
    Protobuf(#[from] protobuf::ProtobufError),
    /// raft-rs rejected an operation.
    #[error("raft: {0}")]
    Raft(#[from] raft::Error),
    /// The state machine reported a non-deterministic failure (apply or checkpoint).
    #[error("state machine: {0}")]
    StateMachine(String),
    /// The configuration or the recovered state is not usable.
    #[error("invalid configuration: {0}")]
    Config(String),
    /// Something this version of the node does not support yet (e.g. installing a snapshot).
    #[error("unsupported: {0}")]
    Unsupported(String),
}

impl Error {
    /// Wraps an I/O error with what was being done.
    pub fn io(context: impl Into<String>, source: io::Error) -> Self {
        Error::Io {
            context: context.into(),
            source,
        }
    }
}

/// Adds a context message to `io::Result`s.
pub(crate) trait IoContext<T> {
    fn ctx(self, context: impl FnOnce() -> String) -> Result<T>;
}

impl<T> IoContext<T> for io::Result<T> {
    fn ctx(self, context: impl FnOnce() -> String) -> Result<T> {
        self.map_err(|e| Error::io(context(), e))
    }
}
