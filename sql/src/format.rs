//! The on-disk format version of a data directory, and of what leaves it
//! (Raft snapshots, backups).
//!
//! Every file a data directory holds — stream segments (frames with the
//! magic `FCLS`), the Raft WAL (length + crc32c records), the table store
//! (redb) with its checkpoint record, `raft/peers` — is written by one
//! format, named by a single number in `<data dir>/FORMAT`
//! (`sluice data format 1`). The checkpoint record carries the same number,
//! so a Raft snapshot or a backup (both carry the record) names the format
//! of the files it carries.
//!
//! Invariants:
//! - Nothing in a data directory is opened before [`check_or_init`] accepted
//!   it: a server never reads, truncates or "repairs" files of a newer
//!   format it does not know (a newer frame would look torn to it).
//! - A change to any file kind's bytes raises [`FORMAT_VERSION`] and keeps
//!   a reader of every older version (`tests/fixtures/format-v1` is a data
//!   directory written by version 1, opened by every test run; the format
//!   cannot change by accident).
//! - A data directory made before the `FORMAT` file existed holds format 1
//!   (the bytes did not change when the file was introduced); it gets the
//!   file when first opened.

use std::fs;
use std::path::Path;

use sluice_storage::durable;

use crate::error::{Error, Result};

/// The format this build writes, and the newest it reads.
pub const FORMAT_VERSION: u32 = 1;

/// The file naming a data directory's (or a backup's) format.
pub const FORMAT_FILE: &str = "FORMAT";

const PREFIX: &str = "sluice data format ";

/// In a data directory `sluice restore` is writing (see [`crate::backup`]); removed when
/// it is complete. A directory holding it is refused.
pub const RESTORING: &str = "RESTORING";

/// The text of a `FORMAT` file for `version`.
pub fn format_text(version: u32) -> String {
    format!("{PREFIX}{version}\n")
}

/// The version named by `dir/FORMAT`, or `None` if there is no such file.
pub fn read(dir: &Path) -> Result<Option<u32>> {
    let path = dir.join(FORMAT_FILE);
    let text = match fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(Error::io(format!("{}: {e}", path.display()))),
    };
    text.trim_end()
        .strip_prefix(PREFIX)
        .and_then(|v| v.parse::<u32>().ok())
        .map(Some)
        .ok_or_else(|| {
            Error::io(format!(
                "{} does not name a Sluice data format (expected \"{PREFIX}N\", found {:?})",
                path.display(),
                text.chars().take(64).collect::<String>()
            ))
        })
}

/// Refuses `version` if this build cannot read it. `what` names the place
/// (a data directory, a backup, a snapshot).
pub fn check_version(version: u32, what: &str) -> Result<()> {
    if version > FORMAT_VERSION {
        return Err(Error::io(format!(
            "{what} is in data format {version}, written by a newer Sluice; this server reads \
             formats up to {FORMAT_VERSION}: run a release that knows format {version}"
        )));
    }
    if version == 0 {
        return Err(Error::io(format!(
            "{what} names data format 0, which never existed"
        )));
    }
    Ok(())
}

/// Accepts a data directory this build can read, before anything in it is
/// opened, and writes its `FORMAT` file if it has none (a new directory, or
/// one made before the file existed: format 1).
pub fn check_or_init(dir: &Path) -> Result<()> {
    if dir.join(RESTORING).exists() {
        return Err(Error::io(format!(
            "{} is an interrupted `sluice restore` (it holds {RESTORING}): remove it and restore \
             again",
            dir.display()
        )));
    }
    match read(dir)? {
        Some(v) => check_version(v, &format!("data directory {}", dir.display())),
        None => write(dir, FORMAT_VERSION),
    }
}

/// Writes `dir/FORMAT` durably (the file, then the directory).
pub fn write(dir: &Path, version: u32) -> Result<()> {
    durable::write_synced(&dir.join(FORMAT_FILE), format_text(version).as_bytes())?;
    Ok(durable::sync_dir(dir)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_new_directory_gets_this_format_and_a_newer_one_is_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        check_or_init(dir.path()).expect("new dir");
        assert_eq!(read(dir.path()).expect("read"), Some(FORMAT_VERSION));
        check_or_init(dir.path()).expect("same format");
        fs::write(
            dir.path().join(FORMAT_FILE),
            format_text(FORMAT_VERSION + 1),
        )
        .expect("write");
        let e = check_or_init(dir.path()).expect_err("newer format");
        assert!(
            e.message.contains("written by a newer Sluice"),
            "{}",
            e.message
        );
        fs::write(dir.path().join(FORMAT_FILE), "something else").expect("write");
        let e = check_or_init(dir.path()).expect_err("garbage");
        assert!(e.message.contains("does not name"), "{}", e.message);
    }
}
