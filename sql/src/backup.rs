//! Online backups of a node (`SELECT * FROM sluice_backup('/dir')`, `sluice backup`), and
//! restoring one into a new data directory (`sluice restore`).
//!
//! A backup is a directory:
//! - `FORMAT`: the data format of everything in it ([`crate::format`]);
//! - `state.pb`: the checkpoint record and every table, raw (a Raft snapshot's message
//!   without its stream files);
//! - `streams/<id>/…`: every stream's segment files, cut at the checkpointed position, and
//!   its `first_offset` file;
//! - `MANIFEST`, written last: the format, the applied index, and every other file's
//!   length and crc32c.
//!
//! Invariants:
//! - One applied index: the node checkpoints (on the Raft thread — the only pause writes
//!   see), then the checkpoint record and the tables are read in one redb read transaction,
//!   and each stream's files are copied up to the position that record names, with the
//!   record's first offset. Below that position segments never change. No stream file is
//!   deleted (a drop, a truncation) from the record's read until every file it names is
//!   open, and a file once opened stays readable; a segment the record needs that a
//!   truncation (retention) deleted before the record was read makes the attempt start
//!   over from a new checkpoint (a truncation checkpoints the state before it). A
//!   cancelled backup stops copying and leaves no `MANIFEST`.
//! - Without its `MANIFEST` a backup is incomplete: restore refuses it, and refuses a file
//!   whose length or checksum differs from the manifest's, and a manifest that lacks a
//!   stream's checkpointed segment. Restore checks all that before it writes anything, and
//!   marks the new directory `RESTORING` until it is complete (a server refuses it).
//! - Bounded memory: tables are held in memory (as for a Raft snapshot); stream files go
//!   through a fixed buffer.
//! - A restored directory is a single node's (or a new cluster's seed): its Raft log starts
//!   empty at the backup's index, as after a snapshot install.

use std::fs;
use std::io::{Read, Write};
use std::path::{Component, Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use sluice_storage::durable::{list_segments, sync_dir, write_synced};

use crate::apply::{self, RecordedState};
use crate::catalog::Catalog;
use crate::engine::Engine;
use crate::error::{sqlstate, Error, Result};
use crate::format::{self, RESTORING};
use crate::table::store::TableStore;

/// What [`backup`] wrote.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BackupSummary {
    /// The applied Raft index the backup holds everything up to.
    pub applied_index: u64,
    pub streams: u64,
    /// Tables of the store (user tables, their indexes, `consumer_offsets`, dedup indexes).
    pub tables: u64,
    /// Bytes written.
    pub bytes: u64,
}

const MANIFEST: &str = "MANIFEST";
const STATE: &str = "state.pb";
const STREAMS: &str = "streams";
const MANIFEST_HEADER: &str = "sluice backup";
/// A stream's first retained offset, as `sluice_storage::StreamLog` keeps it.
const FIRST_OFFSET_FILE: &str = "first_offset";

/// Attempts before a backup gives up on streams truncated under it.
const ATTEMPTS: usize = 5;

/// Why one attempt stopped.
enum Stop {
    /// A segment the record names was deleted before it was opened: try again.
    Vanished(String),
    Failed(Error),
}

impl From<Error> for Stop {
    fn from(e: Error) -> Stop {
        Stop::Failed(e)
    }
}

impl From<sluice_storage::Error> for Stop {
    fn from(e: sluice_storage::Error) -> Stop {
        Stop::Failed(e.into())
    }
}

impl Stop {
    fn into_error(self) -> Error {
        match self {
            Stop::Failed(e) => e,
            Stop::Vanished(why) => Error::internal(why),
        }
    }
}

/// Writes a backup of this node into `target` (absolute; absent or an empty directory,
/// outside the data directory) while writes go on. Dropping the future (a cancel, a
/// `statement_timeout`) stops the copy; the directory is then left without its `MANIFEST`.
pub async fn backup(engine: &Engine, target: &Path) -> Result<BackupSummary> {
    let stop = StopOnDrop(Arc::new(AtomicBool::new(false)));
    let blocking = |f: Box<dyn FnOnce() -> std::result::Result<BackupSummary, Stop> + Send>| async {
        tokio::task::spawn_blocking(f)
            .await
            .map_err(|e| Error::internal(format!("backup task: {e}")))
    };
    let (data_dir, to) = (engine.data_dir.clone(), target.to_path_buf());
    let prepared = blocking(Box::new(move || {
        prepare_backup_dir(&to, &data_dir)?;
        Ok(BackupSummary::default())
    }))
    .await?;
    prepared.map_err(Stop::into_error)?;
    let mut last = String::new();
    for _ in 0..ATTEMPTS {
        engine.checkpoint().await?;
        let (data_dir, catalog, tables, to, stop) = (
            engine.data_dir.clone(),
            engine.catalog.clone(),
            engine.tables.clone(),
            target.to_path_buf(),
            stop.0.clone(),
        );
        let attempt = blocking(Box::new(move || {
            let attempt = write_backup(&data_dir, &catalog, &tables, &to, &stop);
            if matches!(attempt, Err(Stop::Vanished(_))) {
                empty_dir(&to)?;
            }
            attempt
        }))
        .await?;
        match attempt {
            Ok(summary) => return Ok(summary),
            Err(Stop::Failed(e)) => return Err(e),
            Err(Stop::Vanished(why)) => {
                tracing::info!("backup starts over: {why}");
                last = why;
            }
        }
    }
    Err(Error::new(
        sqlstate::OBJECT_NOT_IN_PREREQUISITE_STATE,
        format!(
            "streams were truncated or dropped under the backup {ATTEMPTS} times (last: {last})"
        ),
    ))
}

/// Sets the flag when the backup's future is dropped, so its blocking copy stops.
struct StopOnDrop(Arc<AtomicBool>);

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

/// The backup directory: absolute, absent or empty, and not inside the data directory
/// (whose own files it would become, or be deleted with).
fn prepare_backup_dir(target: &Path, data_dir: &Path) -> Result<()> {
    let code = sqlstate::INVALID_PARAMETER_VALUE;
    prepare_target(target, "the backup directory", code)?;
    let inside = match (fs::canonicalize(target), fs::canonicalize(data_dir)) {
        (Ok(t), Ok(d)) => t.starts_with(&d) || d.starts_with(&t),
        _ => false,
    };
    if inside {
        let _ = fs::remove_dir(target);
        return Err(Error::new(
            code,
            format!(
                "the backup directory {} overlaps the data directory {}",
                target.display(),
                data_dir.display()
            ),
        ));
    }
    Ok(())
}

/// Restores the backup in `from` into the new data directory `data_dir` (absent or empty):
/// checks the manifest first, then copies the stream files and builds the table store.
/// Returns the applied index the restored node starts at.
pub fn restore(from: &Path, data_dir: &Path) -> Result<u64> {
    let bad = |m: String| Error::io(m);
    if let Some(v) = format::read(from)? {
        format::check_version(v, &format!("backup {}", from.display()))?;
    }
    let manifest = read_manifest(from)?;
    for f in &manifest.files {
        verify(from, f)?;
    }
    if !manifest.files.iter().any(|f| f.path == Path::new(STATE)) {
        return Err(bad(format!(
            "{MANIFEST} in {} lists no {STATE}",
            from.display()
        )));
    }
    // everything checked before anything is written: the index, and each stream's
    // checkpointed segment at its recorded length (a manifest that lost a line)
    let state_path = from.join(STATE);
    let state = fs::read(&state_path).map_err(|e| io(&state_path, e))?;
    let recorded = apply::backup_state_streams(&state)?;
    if recorded.applied_index != manifest.applied_index {
        return Err(bad(format!(
            "{STATE} holds index {} but {MANIFEST} says {}",
            recorded.applied_index, manifest.applied_index
        )));
    }
    for (dir, position) in &recorded.streams {
        if position.segment_len == 0 {
            continue;
        }
        let path = dir.join(sluice_storage::segment::file_name(position.segment_base));
        if !manifest
            .files
            .iter()
            .any(|f| f.path == path && f.len == position.segment_len)
        {
            return Err(bad(format!(
                "{MANIFEST} in {} does not list {} with its {} checkpointed bytes: the backup is damaged",
                from.display(),
                path.display(),
                position.segment_len
            )));
        }
    }
    prepare_target(data_dir, "the data directory", sqlstate::IO_ERROR)?;
    // until it is removed, `Engine::open` refuses the directory (see `format::check_or_init`)
    write_file(
        data_dir,
        Path::new(RESTORING),
        b"sluice restore in progress\n",
    )?;
    sync_dir(data_dir)?;
    let streams = apply::streams_dir(data_dir);
    fs::create_dir_all(&streams).map_err(|e| io(&streams, e))?;
    let mut dirs = std::collections::BTreeSet::from([streams.clone()]);
    for f in &manifest.files {
        let Ok(rel) = f.path.strip_prefix(STREAMS) else {
            continue;
        };
        let to = streams.join(rel);
        if let Some(parent) = to.parent() {
            fs::create_dir_all(parent).map_err(|e| io(parent, e))?;
            dirs.insert(parent.to_path_buf());
        }
        let mut src = fs::File::open(from.join(&f.path)).map_err(|e| io(&from.join(&f.path), e))?;
        copy_synced(&mut src, f.len, &to, None)?;
    }
    for d in dirs {
        sync_dir(&d)?;
    }
    let index = apply::restore_backup_state(data_dir, &state)?;
    format::write(data_dir, manifest.format)?;
    let marker = data_dir.join(RESTORING);
    fs::remove_file(&marker).map_err(|e| io(&marker, e))?;
    sync_dir(data_dir)?;
    Ok(index)
}

/// `dir` must be absolute and absent or an empty directory; it is created.
fn prepare_target(dir: &Path, what: &str, code: &'static str) -> Result<()> {
    if !dir.is_absolute() {
        return Err(Error::new(
            code,
            format!("{what} must be an absolute path: {}", dir.display()),
        ));
    }
    match fs::read_dir(dir) {
        Ok(mut entries) => {
            if entries.next().is_some() {
                return Err(Error::new(
                    code,
                    format!("{what} {} is not empty", dir.display()),
                ));
            }
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(Error::new(code, format!("{what} {}: {e}", dir.display()))),
    }
    fs::create_dir_all(dir).map_err(|e| Error::new(code, format!("{}: {e}", dir.display())))
}

/// Removes everything in `dir` (a failed attempt's files).
fn empty_dir(dir: &Path) -> Result<()> {
    for entry in fs::read_dir(dir).map_err(|e| io(dir, e))? {
        let path = entry.map_err(|e| io(dir, e))?.path();
        let removed = if path.is_dir() {
            fs::remove_dir_all(&path)
        } else {
            fs::remove_file(&path)
        };
        removed.map_err(|e| io(&path, e))?;
    }
    Ok(())
}

/// One attempt: the checkpoint record and tables from one read transaction, then the
/// stream files it names, then the manifest. No stream file is deleted from reading the
/// record until every file it names is open (a drop deletes its stream's directory right
/// after the checkpoint that no longer names it: without that, a stream dropped every few
/// milliseconds made every attempt start over).
fn write_backup(
    data_dir: &Path,
    catalog: &Catalog,
    tables: &TableStore,
    target: &Path,
    stop: &AtomicBool,
) -> std::result::Result<BackupSummary, Stop> {
    let (snapshot, record, state, streams) = {
        let _no_deletions = catalog.stream_file_deletions();
        let snapshot = tables.checkpointed()?;
        let record = snapshot
            .record()?
            .ok_or_else(|| Error::internal("no checkpoint record after a checkpoint"))?;
        let state = apply::recorded_state(data_dir, &record)?;
        let streams = opened_streams(data_dir, &state)?;
        (snapshot, record, state, streams)
    };
    let raw = snapshot.tables()?;
    // a read transaction held through the copy would keep the store from reusing pages
    drop(snapshot);
    let mut files = Vec::new();
    let table_count = raw.len() as u64;
    let stream_count = state.streams.len() as u64;
    let encoded = apply::encode_backup_state(record, raw);
    files.push(write_file(target, Path::new(STATE), &encoded)?);
    for (rel, source) in streams {
        let rel = Path::new(STREAMS).join(rel);
        let to = target.join(&rel);
        if let Some(parent) = to.parent() {
            fs::create_dir_all(parent).map_err(|e| io(parent, e))?;
        }
        files.push(match source {
            Source::File(mut file, len) => ManifestFile {
                crc: copy_synced(&mut file, len, &to, Some(stop))?,
                path: rel,
                len,
            },
            Source::Bytes(bytes) => write_file(target, &rel, &bytes)?,
        });
    }
    format::write(target, format::FORMAT_VERSION)?;
    let mut text = format!(
        "{MANIFEST_HEADER}\nformat {}\napplied_index {}\n",
        format::FORMAT_VERSION,
        state.applied_index
    );
    for f in &files {
        text.push_str(&format!(
            "file {:08x} {} {}\n",
            f.crc,
            f.len,
            f.path.display()
        ));
    }
    text.push_str("end\n");
    for d in dirs_under(target)? {
        sync_dir(&d)?;
    }
    write_file(target, Path::new(MANIFEST), text.as_bytes())?;
    sync_dir(target)?;
    Ok(BackupSummary {
        applied_index: state.applied_index,
        streams: stream_count,
        tables: table_count,
        bytes: files.iter().map(|f| f.len).sum::<u64>() + text.len() as u64,
    })
}

/// A stream file to copy: an open segment and the bytes of it to copy, or a small file read
/// whole.
enum Source {
    File(fs::File, u64),
    Bytes(Vec<u8>),
}

/// Every stream file the record needs, opened (so a later deletion cannot take it), with
/// its path under `streams/` and the bytes to copy: a segment before the checkpointed one
/// whole, the checkpointed one up to its durable length, nothing after it; and the
/// stream's first offset as the record has it. A stream dropped, or segments the record
/// needs truncated away, since the checkpoint is [`Stop::Vanished`]: the attempt starts
/// over from a new checkpoint.
fn opened_streams(
    data_dir: &Path,
    state: &RecordedState,
) -> std::result::Result<Vec<(PathBuf, Source)>, Stop> {
    let streams_dir = apply::streams_dir(data_dir);
    let vanished = |what: &Path, how: &str| Stop::Vanished(format!("{} {how}", what.display()));
    let mut out = Vec::new();
    for (dir, position) in &state.streams {
        let rel_dir = dir
            .strip_prefix(&streams_dir)
            .map_err(|_| Error::internal(format!("{} is outside the streams", dir.display())))?;
        let mut segments = match list_segments(dir) {
            Ok(segments) => segments,
            Err(sluice_storage::Error::Io { source, .. })
                if source.kind() == std::io::ErrorKind::NotFound =>
            {
                return Err(vanished(dir, "was dropped"))
            }
            Err(e) => return Err(e.into()),
        };
        segments.retain(|(base, _)| *base <= position.segment_base);
        // truncation deletes a prefix: the first segment kept must still hold the record's
        // first offset, and the checkpointed one must be there
        let first = segments.first().map(|(b, _)| *b);
        if first.is_some_and(|b| b > position.first_offset) {
            return Err(vanished(dir, "lost segments the checkpoint still holds"));
        }
        let has_active = segments
            .last()
            .is_some_and(|(b, _)| *b == position.segment_base);
        if !has_active && position.segment_len > 0 {
            return Err(vanished(dir, "lost its checkpointed segment"));
        }
        for (base, path) in &segments {
            let file = match fs::File::open(path) {
                Ok(f) => f,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                    return Err(vanished(path, "was deleted"))
                }
                Err(e) => return Err(io(path, e).into()),
            };
            let len = if *base == position.segment_base {
                position.segment_len
            } else {
                file.metadata().map_err(|e| io(path, e))?.len()
            };
            let name = path.file_name().map(PathBuf::from).unwrap_or_default();
            out.push((rel_dir.join(name), Source::File(file, len)));
        }
        if position.first_offset > 0 {
            // the record's, not the live file's (a later truncation may have raised it)
            out.push((
                rel_dir.join(FIRST_OFFSET_FILE),
                Source::Bytes(format!("{}\n", position.first_offset).into_bytes()),
            ));
        }
    }
    Ok(out)
}

/// Copies `len` bytes of `src` into a new file `to`, fsynced; returns their crc32c. Stops
/// when `stop` is set.
fn copy_synced(src: &mut fs::File, len: u64, to: &Path, stop: Option<&AtomicBool>) -> Result<u32> {
    let mut out = fs::File::create(to).map_err(|e| io(to, e))?;
    let mut buf = vec![0u8; 1 << 20];
    let (mut left, mut crc) = (len, 0u32);
    while left > 0 {
        if stop.is_some_and(|s| s.load(Ordering::Relaxed)) {
            return Err(Error::new(
                sqlstate::QUERY_CANCELED,
                "the backup was cancelled; its directory has no MANIFEST",
            ));
        }
        let n = buf.len().min(usize::try_from(left).unwrap_or(usize::MAX));
        src.read_exact(&mut buf[..n])
            .map_err(|e| Error::io(format!("reading {len} bytes for {}: {e}", to.display())))?;
        crc = crc32c::crc32c_append(crc, &buf[..n]);
        out.write_all(&buf[..n]).map_err(|e| io(to, e))?;
        left -= n as u64;
    }
    out.sync_all().map_err(|e| io(to, e))?;
    Ok(crc)
}

fn write_file(dir: &Path, rel: &Path, data: &[u8]) -> Result<ManifestFile> {
    write_synced(&dir.join(rel), data)?;
    Ok(ManifestFile {
        path: rel.to_path_buf(),
        len: data.len() as u64,
        crc: crc32c::crc32c(data),
    })
}

/// `dir` and every directory below it.
fn dirs_under(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut out = vec![dir.to_path_buf()];
    let mut i = 0;
    while i < out.len() {
        let d = out[i].clone();
        for entry in fs::read_dir(&d).map_err(|e| io(&d, e))? {
            let path = entry.map_err(|e| io(&d, e))?.path();
            if path.is_dir() {
                out.push(path);
            }
        }
        i += 1;
    }
    Ok(out)
}

fn io(path: &Path, e: std::io::Error) -> Error {
    Error::io(format!("{}: {e}", path.display()))
}

/// One file a manifest lists.
#[derive(Debug, PartialEq)]
struct ManifestFile {
    /// Relative to the backup directory.
    path: PathBuf,
    len: u64,
    crc: u32,
}

struct Manifest {
    format: u32,
    applied_index: u64,
    files: Vec<ManifestFile>,
}

/// Reads and checks `from/MANIFEST`: its header, format, index, files (relative paths that
/// stay inside the backup) and its end line (a cut manifest is refused).
fn read_manifest(from: &Path) -> Result<Manifest> {
    let path = from.join(MANIFEST);
    let text = match fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(Error::io(format!(
                "{} has no {MANIFEST}: not a backup, or an incomplete one (a backup writes its \
                 manifest last)",
                from.display()
            )))
        }
        Err(e) => return Err(io(&path, e)),
    };
    let bad = |line: &str| Error::io(format!("{}: unexpected line {line:?}", path.display()));
    let mut lines = text.lines();
    if lines.next() != Some(MANIFEST_HEADER) {
        return Err(Error::io(format!(
            "{} is not a Sluice backup manifest",
            path.display()
        )));
    }
    let mut number = |key: &str| -> Result<u64> {
        let line = lines.next().unwrap_or("");
        line.strip_prefix(key)
            .and_then(|v| v.strip_prefix(' '))
            .and_then(|v| v.parse().ok())
            .ok_or_else(|| bad(line))
    };
    let format = u32::try_from(number("format")?).map_err(|_| bad("format"))?;
    format::check_version(format, &format!("backup {}", from.display()))?;
    let applied_index = number("applied_index")?;
    let mut files = Vec::new();
    for line in lines.by_ref() {
        if line == "end" {
            return Ok(Manifest {
                format,
                applied_index,
                files,
            });
        }
        let mut parts = line.splitn(4, ' ');
        let (Some("file"), Some(crc), Some(len), Some(rel)) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err(bad(line));
        };
        let rel = PathBuf::from(rel);
        if files.iter().any(|f: &ManifestFile| f.path == rel) {
            return Err(Error::io(format!(
                "{}: {} is listed twice",
                path.display(),
                rel.display()
            )));
        }
        if rel.as_os_str().is_empty()
            || rel.components().any(|c| !matches!(c, Component::Normal(_)))
        {
            return Err(Error::io(format!(
                "{}: the path {} leaves the backup",
                path.display(),
                rel.display()
            )));
        }
        files.push(ManifestFile {
            path: rel,
            len: len.parse().map_err(|_| bad(line))?,
            crc: u32::from_str_radix(crc, 16).map_err(|_| bad(line))?,
        });
    }
    Err(Error::io(format!(
        "{} is cut short (no end line)",
        path.display()
    )))
}

/// The file `f` of the backup in `from` has the manifest's length and checksum.
fn verify(from: &Path, f: &ManifestFile) -> Result<()> {
    let path = from.join(&f.path);
    let mut file = fs::File::open(&path).map_err(|e| io(&path, e))?;
    let len = file.metadata().map_err(|e| io(&path, e))?.len();
    if len != f.len {
        return Err(Error::io(format!(
            "{} has {len} bytes, the manifest says {}: the backup is damaged",
            path.display(),
            f.len
        )));
    }
    let mut buf = vec![0u8; 1 << 20];
    let mut crc = 0u32;
    loop {
        let n = file.read(&mut buf).map_err(|e| io(&path, e))?;
        if n == 0 {
            break;
        }
        crc = crc32c::crc32c_append(crc, &buf[..n]);
    }
    if crc != f.crc {
        return Err(Error::io(format!(
            "{} does not match its checksum in the manifest: the backup is damaged",
            path.display()
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn manifest_in(text: &str) -> (tempfile::TempDir, Result<Manifest>) {
        let dir = tempfile::tempdir().expect("tempdir");
        fs::write(dir.path().join(MANIFEST), text).expect("write");
        let read = read_manifest(dir.path());
        (dir, read)
    }

    fn refused(text: &str, why: &str) {
        let (_dir, read) = manifest_in(text);
        let Err(e) = read else {
            panic!("accepted {text:?}");
        };
        assert!(e.message.contains(why), "{text:?}: {}", e.message);
    }

    /// What a truncation or a drop after the checkpoint leaves makes the attempt start
    /// over, never a backup without the rows its record names.
    #[test]
    fn streams_changed_since_the_checkpoint_start_the_attempt_over() {
        use sluice_storage::segment::file_name;
        use sluice_storage::StreamCheckpoint;

        let data = tempfile::tempdir().expect("tempdir");
        let dir = apply::streams_dir(data.path()).join("00000000000000000007");
        fs::create_dir_all(&dir).expect("mkdir");
        for base in [0u64, 10, 20] {
            fs::write(dir.join(file_name(base)), vec![1u8; 100]).expect("segment");
        }
        let state = |first_offset, segment_base, segment_len| RecordedState {
            applied_index: 9,
            streams: vec![(
                dir.clone(),
                StreamCheckpoint {
                    first_offset,
                    segment_base,
                    segment_len,
                },
            )],
        };
        let vanished =
            |s: &RecordedState| matches!(opened_streams(data.path(), s), Err(Stop::Vanished(_)));
        // whole: the earlier segments whole, the checkpointed one cut at its length, the
        // record's first offset (the live `first_offset` file is not read)
        fs::write(dir.join(FIRST_OFFSET_FILE), "15\n").expect("first_offset");
        let Ok(files) = opened_streams(data.path(), &state(5, 20, 60)) else {
            panic!("a whole stream refused");
        };
        let lens: Vec<(String, u64)> = files
            .iter()
            .map(|(p, s)| {
                let len = match s {
                    Source::File(_, len) => *len,
                    Source::Bytes(b) => {
                        assert_eq!(b, b"5\n");
                        b.len() as u64
                    }
                };
                (p.display().to_string(), len)
            })
            .collect();
        assert_eq!(lens.len(), 4, "{lens:?}");
        assert_eq!(
            lens[2],
            (format!("00000000000000000007/{}", file_name(20)), 60)
        );
        // segments after the checkpointed one are not the record's
        assert_eq!(
            opened_streams(data.path(), &state(5, 10, 60))
                .ok()
                .map(|f| f.len()),
            Some(3)
        );
        // a truncation deleted a segment the record still holds
        fs::remove_file(dir.join(file_name(0))).expect("rm");
        assert!(vanished(&state(5, 20, 60)));
        assert!(!vanished(&state(10, 20, 60)));
        // the checkpointed segment itself is gone
        assert!(vanished(&state(30, 30, 60)));
        // the stream was dropped
        fs::remove_dir_all(&dir).expect("rm -r");
        assert!(vanished(&state(0, 0, 0)));
    }

    #[test]
    fn manifests_are_read_whole_and_stay_inside_the_backup() {
        let good = "sluice backup\nformat 1\napplied_index 7\n\
                    file 0000002a 3 state.pb\nfile ffffffff 10 streams/0001/x.seg\nend\n";
        let (_dir, read) = manifest_in(good);
        let m = read.expect("a good manifest");
        assert_eq!((m.format, m.applied_index, m.files.len()), (1, 7, 2));
        assert_eq!(
            m.files[1],
            ManifestFile {
                path: PathBuf::from("streams/0001/x.seg"),
                len: 10,
                crc: 0xffff_ffff
            }
        );
        let head = "sluice backup\nformat 1\napplied_index 7\n";
        refused(
            &format!("{head}file 0 1 ../escape\nend\n"),
            "leaves the backup",
        );
        refused(
            &format!("{head}file 0 1 /etc/passwd\nend\n"),
            "leaves the backup",
        );
        refused(
            &format!("{head}file 0 1 a/../b\nend\n"),
            "leaves the backup",
        );
        refused(
            &format!("{head}file 0 1 state.pb\nfile 0 1 state.pb\nend\n"),
            "listed twice",
        );
        refused(&format!("{head}file 0 1 state.pb\n"), "cut short");
        refused(
            &format!("{head}file zz 1 state.pb\nend\n"),
            "unexpected line",
        );
        refused(
            &format!("{head}file 0 -1 state.pb\nend\n"),
            "unexpected line",
        );
        refused(&format!("{head}something\nend\n"), "unexpected line");
        refused(
            "sluice backup\nformat 2\napplied_index 7\nend\n",
            "newer Sluice",
        );
        refused("not a backup\n", "not a Sluice backup manifest");
        let dir = tempfile::tempdir().expect("tempdir");
        let Err(e) = read_manifest(dir.path()) else {
            panic!("no manifest accepted");
        };
        assert!(e.message.contains("incomplete"), "{}", e.message);
    }
}
