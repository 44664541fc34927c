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
//!   and each stream's files are copied up to the position that record names. Below that
//!   position segments never change; one that a later truncation (retention) deleted before
//!   it was opened makes the attempt start over (a file once opened stays readable).
//! - Without its `MANIFEST` a backup is incomplete: restore refuses it, and refuses a file
//!   whose length or checksum differs from the manifest's.
//! - Bounded memory: tables are held in memory (as for a Raft snapshot); stream files go
//!   through a fixed buffer.
//! - A restored directory is a single node's (or a new cluster's seed): its Raft log starts
//!   empty at the backup's index, as after a snapshot install.

use std::fs;
use std::io::{Read, Write};
use std::path::{Component, Path, PathBuf};

use crate::apply::{self, RecordedState};
use crate::engine::Engine;
use crate::error::{sqlstate, Error, Result};
use crate::format;
use crate::table::store::TableStore;

/// What [`backup`] wrote.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
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

/// Writes a backup of this node into `target` (absolute; absent or an empty directory)
/// while writes go on.
pub async fn backup(engine: &Engine, target: &Path) -> Result<BackupSummary> {
    prepare_target(
        target,
        "the backup directory",
        sqlstate::INVALID_PARAMETER_VALUE,
    )?;
    let mut last = String::new();
    for _ in 0..ATTEMPTS {
        engine.checkpoint().await?;
        let (data_dir, tables, to) = (
            engine.data_dir.clone(),
            engine.tables.clone(),
            target.to_path_buf(),
        );
        let attempt = tokio::task::spawn_blocking(move || write_backup(&data_dir, &tables, &to))
            .await
            .map_err(|e| Error::internal(format!("backup task: {e}")))?;
        match attempt {
            Ok(summary) => return Ok(summary),
            Err(Stop::Failed(e)) => return Err(e),
            Err(Stop::Vanished(why)) => {
                tracing::info!("backup starts over: {why}");
                empty_dir(target)?;
                last = why;
            }
        }
    }
    Err(Error::new(
        sqlstate::OBJECT_NOT_IN_PREREQUISITE_STATE,
        format!("streams were truncated under the backup {ATTEMPTS} times (last: {last})"),
    ))
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
    prepare_target(data_dir, "the data directory", sqlstate::IO_ERROR)?;
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
        copy_synced(&mut src, f.len, &to)?;
    }
    for d in dirs {
        sync_dir(&d)?;
    }
    let state_path = from.join(STATE);
    let state = fs::read(&state_path).map_err(|e| io(&state_path, e))?;
    let index = apply::restore_backup_state(data_dir, &state)?;
    if index != manifest.applied_index {
        return Err(bad(format!(
            "{STATE} holds index {index} but {MANIFEST} says {}",
            manifest.applied_index
        )));
    }
    format::write(data_dir, manifest.format)?;
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
/// stream files it names, then the manifest.
fn write_backup(
    data_dir: &Path,
    tables: &TableStore,
    target: &Path,
) -> std::result::Result<BackupSummary, Stop> {
    let (record, raw) = tables.dump_with_record()?;
    let record =
        record.ok_or_else(|| Error::internal("no checkpoint record after a checkpoint"))?;
    let state = apply::recorded_state(data_dir, &record)?;
    let mut files = Vec::new();
    let streams = opened_streams(data_dir, &state)?;
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
                crc: copy_synced(&mut file, len, &to)?,
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
/// whole, the checkpointed one up to its durable length, nothing after it.
fn opened_streams(
    data_dir: &Path,
    state: &RecordedState,
) -> std::result::Result<Vec<(PathBuf, Source)>, Stop> {
    let streams_dir = apply::streams_dir(data_dir);
    let mut out = Vec::new();
    for (dir, position) in &state.streams {
        let mut segments = Vec::new();
        let mut first_offset_file = None;
        for entry in fs::read_dir(dir).map_err(|e| io(dir, e))? {
            let path = entry.map_err(|e| io(dir, e))?.path();
            let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
            if let Some(base) = sluice_storage::segment::parse_file_name(name) {
                if base <= position.segment_base {
                    segments.push((base, path));
                }
            } else if name == "first_offset" {
                first_offset_file = Some(path);
            }
        }
        segments.sort();
        let rel = |p: &Path| -> std::result::Result<PathBuf, Stop> {
            Ok(p.strip_prefix(&streams_dir)
                .map_err(|_| Error::internal(format!("{} is outside the streams", p.display())))?
                .to_path_buf())
        };
        let mut required = position.first_offset;
        if let Some(path) = first_offset_file {
            match fs::read(&path) {
                Ok(bytes) => {
                    let text = String::from_utf8_lossy(&bytes);
                    if let Ok(v) = text.trim_end().parse::<u64>() {
                        required = required.max(v);
                    }
                    out.push((rel(&path)?, Source::Bytes(bytes)));
                }
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                    return Err(Stop::Vanished(format!("{} was replaced", path.display())))
                }
                Err(e) => return Err(io(&path, e).into()),
            }
        }
        for (i, (base, path)) in segments.iter().enumerate() {
            if i == 0 && *base > required {
                return Err(Stop::Vanished(format!(
                    "the segments of {} below offset {base} were deleted",
                    dir.display()
                )));
            }
            let file = match fs::File::open(path) {
                Ok(f) => f,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                    return Err(Stop::Vanished(format!("{} was deleted", path.display())))
                }
                Err(e) => return Err(io(path, e).into()),
            };
            let len = if *base == position.segment_base {
                position.segment_len
            } else {
                file.metadata().map_err(|e| io(path, e))?.len()
            };
            out.push((rel(path)?, Source::File(file, len)));
        }
    }
    Ok(out)
}

/// Copies `len` bytes of `src` into a new file `to`, fsynced; returns their crc32c.
fn copy_synced(src: &mut fs::File, len: u64, to: &Path) -> Result<u32> {
    let mut out = fs::File::create(to).map_err(|e| io(to, e))?;
    let mut buf = vec![0u8; 1 << 20];
    let (mut left, mut crc) = (len, 0u32);
    while left > 0 {
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
    let path = dir.join(rel);
    let mut f = fs::File::create(&path).map_err(|e| io(&path, e))?;
    f.write_all(data).map_err(|e| io(&path, e))?;
    f.sync_all().map_err(|e| io(&path, e))?;
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

fn sync_dir(dir: &Path) -> Result<()> {
    fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| io(dir, e))
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
        if rel.components().any(|c| !matches!(c, Component::Normal(_))) {
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
