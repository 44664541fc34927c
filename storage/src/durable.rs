//! Small durable-file helpers shared by everything that writes files beside
//! the logs (segment directories, the data format marker, backups, installed
//! snapshots). Invariant: when one of these returns `Ok`, what it wrote
//! survives a crash — file contents are fsynced, and a directory is fsynced
//! after an entry in it was created, renamed or removed.

use std::fs;
use std::io::Write as _;
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};
use crate::segment;

/// Creates (or replaces) `path` with `data` and fsyncs the file. The caller
/// syncs the directory once it has written every file it needs there.
pub fn write_synced(path: &Path, data: &[u8]) -> Result<()> {
    let mut file = fs::File::create(path).map_err(Error::io(path))?;
    file.write_all(data).map_err(Error::io(path))?;
    file.sync_all().map_err(Error::io(path))
}

/// Fsyncs directory `dir`, making the entries created in it durable.
pub fn sync_dir(dir: &Path) -> Result<()> {
    fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(Error::io(dir))
}

/// Segment files in `dir` with their base offsets, sorted by base offset.
/// Other files are ignored. A missing `dir` is an [`Error::Io`] whose source
/// is `NotFound`.
pub fn list_segments(dir: &Path) -> Result<Vec<(u64, PathBuf)>> {
    let mut found = Vec::new();
    for entry in fs::read_dir(dir).map_err(Error::io(dir))? {
        let entry = entry.map_err(Error::io(dir))?;
        if let Some(base) = entry
            .file_name()
            .to_str()
            .and_then(segment::parse_file_name)
        {
            found.push((base, entry.path()));
        }
    }
    found.sort_unstable_by_key(|(base, _)| *base);
    Ok(found)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_only_segments_in_offset_order() {
        let dir = tempfile::tempdir().expect("tempdir");
        for base in [42u64, 0, 7] {
            write_synced(&dir.path().join(segment::file_name(base)), b"x").expect("write");
        }
        write_synced(&dir.path().join("first_offset"), b"7\n").expect("write");
        sync_dir(dir.path()).expect("sync");
        let bases: Vec<u64> = list_segments(dir.path())
            .expect("list")
            .into_iter()
            .map(|(b, _)| b)
            .collect();
        assert_eq!(bases, vec![0, 7, 42]);
        let missing = list_segments(&dir.path().join("gone")).expect_err("missing dir");
        assert!(
            matches!(&missing, Error::Io { source, .. } if source.kind() == std::io::ErrorKind::NotFound),
            "{missing}"
        );
    }
}
