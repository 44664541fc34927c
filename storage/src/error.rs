//! The crate's one error type. Every variant keeps enough context (a path, a
//! byte position, the source error) to say what went wrong where.
//! `is_deterministic` tells a caller whether the error comes from its input
//! (report it; a replica would hit the same error) or from the environment
//! (disk, corruption: stop rather than let replicas diverge).

use std::path::{Path, PathBuf};

/// Everything that can go wrong in `sluice-storage`.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("I/O error on {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("corrupt segment {path} at byte {position}: {detail}")]
    Corrupt {
        path: PathBuf,
        position: u64,
        detail: String,
    },
    #[error("arrow error: {0}")]
    Arrow(#[from] arrow::error::ArrowError),
    #[error("offset {requested} is before the first retained offset {first} of the stream")]
    OffsetTruncated { requested: u64, first: u64 },
    #[error("storage failed earlier and accepts no more writes: {0}")]
    Poisoned(String),
}

/// Result with the crate's [`Error`].
pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    /// True when the error is caused by the request itself, so every replica
    /// applying the same request gets the same error. False for failures of
    /// the environment (I/O, corruption, poisoning), which must stop the node.
    pub fn is_deterministic(&self) -> bool {
        match self {
            Error::OffsetTruncated { .. } => true,
            Error::Io { .. } | Error::Corrupt { .. } | Error::Arrow(_) | Error::Poisoned(_) => {
                false
            }
        }
    }

    /// Builds a `map_err` closure that wraps an `io::Error` with `path`.
    pub(crate) fn io(path: &Path) -> impl FnOnce(std::io::Error) -> Error + '_ {
        move |source| Error::Io {
            path: path.to_path_buf(),
            source,
        }
    }

    pub(crate) fn corrupt(path: &Path, position: u64, detail: impl Into<String>) -> Error {
        Error::Corrupt {
            path: path.to_path_buf(),
            position,
            detail: detail.into(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_truncated_offsets_are_deterministic() {
        let truncated = Error::OffsetTruncated {
            requested: 1,
            first: 5,
        };
        assert!(truncated.is_deterministic());
        let io = Error::io(Path::new("/x"))(std::io::Error::other("boom"));
        assert!(!io.is_deterministic());
        assert!(!Error::corrupt(Path::new("/x"), 3, "bad").is_deterministic());
        assert!(!Error::Poisoned("earlier".into()).is_deterministic());
    }

    #[test]
    fn corrupt_message_names_path_and_position() {
        let err = Error::corrupt(Path::new("/data/s/00000000000000000007.seg"), 96, "bad crc");
        assert_eq!(
            err.to_string(),
            "corrupt segment /data/s/00000000000000000007.seg at byte 96: bad crc"
        );
    }
}
