//! What a phase cost: once a second the server's resident memory (`VmRSS` of
//! `/proc/<pid>/status`), and over the phase its CPU time and ours (`/proc/<pid>/stat`; the
//! load generator shares the machine), its peak RSS since start (`VmHWM`), and a liveness
//! probe — a fresh login and `SELECT 1` every second, which must answer within
//! [`PROBE_TIMEOUT`] (a failure is an unexpected outcome of [`Class::Probe`]).

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use tokio::task::JoinHandle;

use super::login;
use super::tally::{error_key, Class, Tally};

/// How long the probe's login and `SELECT 1` may take together: a hang guard (slow answers
/// are reported as latencies, not failures).
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(60);
/// Linux's clock tick (`/proc/<pid>/stat` counts CPU time in them).
const TICK: Duration = Duration::from_millis(10);

/// The value of a field of `/proc/<pid>/status` (`field` with its colon, e.g. `"VmRSS:"`),
/// trimmed; `None` if the process or the field (older kernels lack some) is not there.
pub fn status_field(pid: u32, field: &str) -> Option<String> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with(field))?;
    Some(line[field.len()..].trim().to_string())
}

/// A `kB` field of `/proc/<pid>/status`, in bytes.
fn status_bytes(pid: u32, field: &str) -> Option<u64> {
    let kb: u64 = status_field(pid, field)?
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    Some(kb * 1024)
}

/// The process's resident memory, in bytes.
pub fn rss(pid: u32) -> Option<u64> {
    status_bytes(pid, "VmRSS:")
}

/// The process's peak resident memory since it started, in bytes.
pub fn peak_rss(pid: u32) -> Option<u64> {
    status_bytes(pid, "VmHWM:")
}

/// CPU time (user + system) the process has used.
pub fn cpu(pid: u32) -> Option<Duration> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // the fields after the command name, which is in parentheses
    let rest = stat.get(stat.rfind(')')? + 2..)?;
    let fields: Vec<&str> = rest.split(' ').collect();
    let utime: u32 = fields.get(11)?.parse().ok()?;
    let stime: u32 = fields.get(12)?.parse().ok()?;
    Some(TICK * (utime + stime))
}

/// What one phase cost.
#[derive(Clone, Debug, Default)]
pub struct Usage {
    /// The server's RSS, one sample a second.
    pub rss: Vec<u64>,
    /// The server's peak RSS since it started (`VmHWM`), read at the phase's end.
    pub peak_since_start: Option<u64>,
    pub wall: Duration,
    pub server_cpu: Duration,
    pub load_cpu: Duration,
    /// Latencies of the probes that answered.
    pub probes: Vec<Duration>,
    pub probe_failures: u64,
}

/// What the sampler and the probe have gathered so far.
#[derive(Default)]
struct Gathered {
    rss: Vec<u64>,
    probes: Vec<Duration>,
    probe_failures: u64,
}

/// The sampler and the probe of one phase; [`Monitor::finish`] stops them.
pub struct Monitor {
    gathered: Arc<Mutex<Gathered>>,
    tasks: [JoinHandle<()>; 2],
    started: Instant,
    pid: u32,
    server_cpu: Option<Duration>,
    load_cpu: Option<Duration>,
}

fn lock(g: &Mutex<Gathered>) -> MutexGuard<'_, Gathered> {
    g.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Monitor {
    /// Starts sampling server `pid` and probing `port` (bounded: `limit` at most).
    pub fn start(pid: u32, port: u16, tally: Arc<Tally>, limit: Duration) -> Monitor {
        let started = Instant::now();
        let deadline = started + limit;
        let gathered = Arc::new(Mutex::new(Gathered::default()));
        let g = gathered.clone();
        let sampler = tokio::spawn(async move {
            while Instant::now() < deadline {
                if let Some(bytes) = rss(pid) {
                    lock(&g).rss.push(bytes);
                }
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        });
        let g = gathered.clone();
        let prober = tokio::spawn(async move {
            while Instant::now() < deadline {
                let began = Instant::now();
                match tokio::time::timeout(PROBE_TIMEOUT, probe(port)).await {
                    Ok(Ok(())) => {
                        lock(&g).probes.push(began.elapsed());
                        tally.expected(Class::Probe, "ok");
                    }
                    Ok(Err(what)) => {
                        lock(&g).probe_failures += 1;
                        tally.unexpected(Class::Probe, &what, "login + SELECT 1".into());
                    }
                    Err(_) => {
                        lock(&g).probe_failures += 1;
                        tally.unexpected(
                            Class::Probe,
                            "no answer in time",
                            format!("login + SELECT 1 took over {PROBE_TIMEOUT:?}"),
                        );
                    }
                }
                tokio::time::sleep(Duration::from_secs(1).saturating_sub(began.elapsed())).await;
            }
        });
        Monitor {
            gathered,
            tasks: [sampler, prober],
            started,
            pid,
            server_cpu: cpu(pid),
            load_cpu: cpu(std::process::id()),
        }
    }

    /// Stops sampling and probing (a probe under way is abandoned); what the phase cost.
    pub async fn finish(self) -> Usage {
        let wall = self.started.elapsed();
        let delta = |before: Option<Duration>, after: Option<Duration>| match (before, after) {
            (Some(b), Some(a)) => a.saturating_sub(b),
            _ => Duration::ZERO,
        };
        let server_cpu = delta(self.server_cpu, cpu(self.pid));
        let load_cpu = delta(self.load_cpu, cpu(std::process::id()));
        let peak_since_start = peak_rss(self.pid);
        for t in self.tasks {
            t.abort();
            let _ = t.await;
        }
        let g = std::mem::take(&mut *lock(&self.gathered));
        Usage {
            rss: g.rss,
            peak_since_start,
            wall,
            server_cpu,
            load_cpu,
            probes: g.probes,
            probe_failures: g.probe_failures,
        }
    }
}

/// A fresh login and `SELECT 1`.
async fn probe(port: u16) -> Result<(), String> {
    let client = login::session(port, None).await?;
    client
        .simple_query("SELECT 1")
        .await
        .map(drop)
        .map_err(|e| error_key(&e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_our_own_memory_and_cpu() {
        let me = std::process::id();
        let now = rss(me).expect("VmRSS");
        assert!(now > 0);
        assert!(peak_rss(me).expect("VmHWM") >= now);
        assert!(cpu(me).is_some());
        assert_eq!(rss(u32::MAX), None);
    }
}
