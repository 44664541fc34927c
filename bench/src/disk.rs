//! The physical limits of the data directory's disk, measured in the same
//! run as the workloads: the latency of a 4 KiB append followed by
//! `fdatasync` (what one group commit costs at least), and the bandwidth of
//! a large sequential write made durable by one `fdatasync` at the end.

use std::fs::OpenOptions;
use std::io::Write;
use std::path::Path;
use std::time::Instant;

use hdrhistogram::Histogram;
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
    let mut hist = Histogram::<u64>::new_with_bounds(1, 3_600_000_000, 3).map_err(err)?;
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
    let qs = [50.0, 90.0, 99.0, 99.9, 99.99, 99.999, 99.9999];
    Ok(DiskRun {
        workload: "disk",
        dir: dir.display().to_string(),
        fdatasync_count: hist.len(),
        percentiles_us: qs
            .iter()
            .map(|q| (format!("p{q}"), hist.value_at_quantile(q / 100.0)))
            .collect(),
        max_us: hist.max(),
        seq_write_bytes: seq_bytes,
        seq_write_mib_per_sec: seq_bytes as f64 / (1024.0 * 1024.0) / secs,
    })
}
