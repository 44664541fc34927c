//! The physical limits of the data directory's disk, measured in the same
//! run as the workloads: the latency of a 4 KiB append followed by
//! `fdatasync` (what one group commit costs at least), and the bandwidth of
//! a large sequential write made durable by one `fdatasync` at the end.

use std::fs::OpenOptions;
use std::io::Write;
use std::path::Path;
use std::time::Instant;

use serde::Serialize;

use crate::err;

#[derive(Serialize)]
pub struct DiskRun {
    workload: &'static str,
    dir: String,
    fdatasync_count: u64,
    percentiles_us: Vec<(String, u64)>,
    max_us: u64,
    seq_write_bytes: u64,
    seq_write_mib_per_sec: f64,
}

/// Probe `dir`: `count` appends of 4 KiB each followed by `fdatasync`, then
/// `seq_bytes` written in 1 MiB writes and one `fdatasync`. The probe files
/// are removed afterwards.
pub fn probe(dir: &Path, count: u64, seq_bytes: u64) -> Result<DiskRun, String> {
    let create = |path: &Path| {
        OpenOptions::new()
            .create(true)
            .write(true)
            .truncate(true)
            .open(path)
            .map_err(err)
    };
    std::fs::create_dir_all(dir).map_err(err)?;
    let path = dir.join("sluice-bench-disk-probe");
    let mut hist = crate::histogram()?;
    {
        let mut f = create(&path)?;
        let block = vec![0x5au8; 4096];
        for _ in 0..count {
            let start = Instant::now();
            f.write_all(&block).map_err(err)?;
            f.sync_data().map_err(err)?;
            hist.saturating_record(start.elapsed().as_micros().max(1) as u64);
        }
    }
    let start = Instant::now();
    {
        let mut f = create(&path)?;
        let block = vec![0xa5u8; 1 << 20];
        let mut written = 0u64;
        while written < seq_bytes {
            f.write_all(&block).map_err(err)?;
            written += block.len() as u64;
        }
        f.sync_data().map_err(err)?;
    }
    let secs = start.elapsed().as_secs_f64();
    std::fs::remove_file(&path).map_err(err)?;
    Ok(DiskRun {
        workload: "disk",
        dir: dir.display().to_string(),
        fdatasync_count: hist.len(),
        percentiles_us: crate::percentiles(&hist),
        max_us: hist.max(),
        seq_write_bytes: seq_bytes,
        seq_write_mib_per_sec: seq_bytes as f64 / (1024.0 * 1024.0) / secs,
    })
}

#[derive(Serialize)]
pub struct FloorRun {
    workload: &'static str,
    label: &'static str,
    target: &'static str,
    dir: String,
    size: usize,
    rate: f64,
    seconds: f64,
    acknowledged: u64,
    fdatasyncs: u64,
    percentiles_us: Vec<(String, u64)>,
    max_us: u64,
}

/// The latency floor of an append-only log on `dir`'s disk at a fixed rate:
/// the ideal group-commit log, with no server, no protocol and no CPU work.
/// Requests of `size` bytes are scheduled `rate` per second (open loop, as
/// `latency` schedules its INSERTs); one thread writes every request due
/// into a preallocated, already durable file with one `pwrite`, makes it
/// durable with one `fdatasync`, and records each request's latency from its
/// scheduled instant. Whatever a log that acknowledges only durable writes
/// adds to this is its own cost; what this shows is the disk's.
pub fn floor(dir: &Path, size: usize, rate: f64, seconds: f64) -> Result<FloorRun, String> {
    use std::os::unix::fs::FileExt;

    std::fs::create_dir_all(dir).map_err(err)?;
    let path = dir.join("sluice-bench-floor");
    let total = (rate * seconds) as u64;
    let bytes = total * size as u64;
    let file = OpenOptions::new()
        .create(true)
        .read(true)
        .write(true)
        .truncate(true)
        .open(&path)
        .map_err(err)?;
    // zeros written and made durable first, as a log's preallocated segment
    // (PostgreSQL's WAL files, Sluice's WAL): an fdatasync then flushes data
    // blocks only, no size change
    let zeros = vec![0u8; 1 << 20];
    let mut at = 0u64;
    while at < bytes {
        let n = zeros.len().min((bytes - at) as usize);
        file.write_all_at(&zeros[..n], at).map_err(err)?;
        at += n as u64;
    }
    file.sync_all().map_err(err)?;
    let data = vec![0x5au8; size * 4096];
    let mut hist = crate::histogram()?;
    let start = Instant::now() + std::time::Duration::from_millis(200);
    let scheduled = |i: u64| start + std::time::Duration::from_secs_f64(i as f64 / rate);
    let (mut next, mut fdatasyncs) = (0u64, 0u64);
    while next < total {
        let now = Instant::now();
        if scheduled(next) > now {
            std::thread::sleep(scheduled(next) - now);
            continue;
        }
        // every request due by now, at most 4,096 per write
        let due = ((now.saturating_duration_since(start).as_secs_f64() * rate) as u64 + 1)
            .min(total)
            .min(next + 4096);
        let n = (due - next) as usize;
        file.write_all_at(&data[..n * size], next * size as u64)
            .map_err(err)?;
        file.sync_data().map_err(err)?;
        fdatasyncs += 1;
        let done = Instant::now();
        for i in next..due {
            hist.saturating_record((done - scheduled(i)).as_micros().max(1) as u64);
        }
        next = due;
    }
    drop(file);
    std::fs::remove_file(&path).map_err(err)?;
    Ok(FloorRun {
        workload: "latency",
        label: "floor",
        target: "disk",
        dir: dir.display().to_string(),
        size,
        rate,
        seconds,
        acknowledged: hist.len(),
        fdatasyncs,
        percentiles_us: crate::percentiles(&hist),
        max_us: hist.max(),
    })
}
