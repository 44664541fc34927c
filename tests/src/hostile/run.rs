//! One hostile run: start the server, create stream `w`, run the writers alone (baseline),
//! then the same writers beside the hostile clients (disturbed), each phase measured by a
//! [`Monitor`]; stop everything, check the stream, restart the server on the same directory
//! and check again. Nothing here panics on what the server does: findings become anomalies
//! in the [`RunReport`].

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::task::JoinHandle;

use super::clients::{self, Target, BACKSTOP};
use super::fuzz;
use super::idle;
use super::monitor::{Monitor, Usage};
use super::process::Sluice;
use super::tally::{Class, ClassTally, Tally};
use super::timeline::{Episode, Timeline};
use super::verify::{self, Check};
use super::writers::{self, Writes, CREATE};

/// What to run.
#[derive(Clone, Debug)]
pub struct Config {
    pub seed: u64,
    /// The writers alone.
    pub baseline: Duration,
    /// The writers beside the hostile clients.
    pub disturbed: Duration,
    pub writers: usize,
    /// Hostile clients of each class.
    pub fuzzers: usize,
    pub deep: usize,
    pub hungry: usize,
    pub cancels: usize,
    pub idle: usize,
    /// Every hostile session's `statement_timeout`.
    pub hostile_timeout: Duration,
    /// Arguments for `sluice serve`.
    pub server_args: Vec<String>,
    /// An anomaly if the server's RSS goes above it (bytes).
    pub rss_bound: Option<u64>,
    /// An anomaly if disturbed / baseline throughput is below it.
    pub min_ratio: f64,
    /// Keep the data directory and server log even without anomalies.
    pub keep: bool,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            seed: 7,
            baseline: Duration::from_secs(120),
            disturbed: Duration::from_secs(600),
            writers: 8,
            fuzzers: 4,
            deep: 2,
            hungry: 2,
            cancels: 2,
            idle: 20,
            hostile_timeout: Duration::from_secs(5),
            server_args: Vec::new(),
            rss_bound: None,
            min_ratio: 0.5,
            keep: false,
        }
    }
}

/// One phase's measurements.
#[derive(Clone, Debug)]
pub struct Phase {
    pub writes: Writes,
    pub usage: Usage,
}

/// A check of the stream: when, and what it found (or why it could not be made).
#[derive(Clone, Debug)]
pub struct Verification {
    pub when: &'static str,
    pub result: Result<Check, String>,
}

#[derive(Debug)]
pub struct RunReport {
    pub config: Config,
    pub baseline: Option<Phase>,
    pub disturbed: Option<Phase>,
    pub tally: std::collections::BTreeMap<Class, ClassTally>,
    pub checks: Vec<Verification>,
    pub panics: Vec<String>,
    /// The worst writer stall episodes with the slow hostile statements during each.
    pub stalls: Vec<Episode>,
    /// Writer INSERTs that took [`super::timeline::SLOW`] or more.
    pub stall_count: usize,
    /// When the disturbed phase began, on the stalls' clock.
    pub disturbed_at: Option<Duration>,
    pub anomalies: Vec<String>,
    pub elapsed: Duration,
    /// Where the data directory and server log were kept.
    pub kept: Option<PathBuf>,
}

impl RunReport {
    /// Disturbed / baseline writer throughput (whole-phase means).
    pub fn ratio(&self) -> Option<f64> {
        let (b, d) = (self.baseline.as_ref()?, self.disturbed.as_ref()?);
        let base = b.writes.rate();
        (base > 0.0).then(|| d.writes.rate() / base)
    }

    /// The server's highest RSS seen (samples and `VmHWM`) over both phases.
    pub fn rss_peak(&self) -> Option<u64> {
        [&self.baseline, &self.disturbed]
            .into_iter()
            .flatten()
            .flat_map(|p| p.usage.rss.iter().copied().chain(p.usage.peak_since_start))
            .max()
    }
}

pub async fn run(config: Config) -> RunReport {
    let started = Instant::now();
    let mut report = RunReport {
        config: config.clone(),
        baseline: None,
        disturbed: None,
        tally: Default::default(),
        checks: Vec::new(),
        panics: Vec::new(),
        stalls: Vec::new(),
        stall_count: 0,
        disturbed_at: None,
        anomalies: Vec::new(),
        elapsed: Duration::ZERO,
        kept: None,
    };
    let mut sluice = match Sluice::start(&config.server_args).await {
        Ok(s) => s,
        Err(e) => {
            report
                .anomalies
                .push(format!("the server did not start: {e}"));
            return report;
        }
    };
    let tally = Arc::new(Tally::default());
    let timeline = Arc::new(Timeline::default());
    match setup(sluice.port()).await {
        Ok(()) => {
            let (baseline, disturbed) =
                phases(&config, &mut sluice, &tally, &timeline, &mut report).await;
            report.baseline = Some(baseline);
            report.disturbed = disturbed;
        }
        Err(e) => report.anomalies.push(format!("setup: {e}")),
    }
    report.tally = tally.snapshot();
    report.stalls = timeline.worst_stalls(8);
    report.stall_count = timeline.stall_count();
    if report.disturbed.is_some() {
        finish(&mut sluice, &mut report).await;
    }
    report.panics = sluice.panic_lines();
    judge(&mut report);
    report.elapsed = started.elapsed();
    if !report.anomalies.is_empty() || config.keep {
        report.kept = Some(sluice.keep());
    }
    report
}

async fn setup(port: u16) -> Result<(), String> {
    let client = super::login::session(port, None).await?;
    tokio::time::timeout(BACKSTOP, client.batch_execute(CREATE))
        .await
        .map_err(|_| format!("{CREATE}: no answer"))?
        .map_err(|e| format!("{CREATE}: {e}"))
}

/// The baseline, then (if the server still runs) the disturbed phase.
async fn phases(
    config: &Config,
    sluice: &mut Sluice,
    tally: &Arc<Tally>,
    timeline: &Arc<Timeline>,
    report: &mut RunReport,
) -> (Phase, Option<Phase>) {
    let port = sluice.port();
    let pid = sluice.pid().unwrap_or_default();
    let t = Instant::now();
    let at = || format!("{:.1}s", t.elapsed().as_secs_f64());
    let slack = Duration::from_secs(120);
    eprintln!(
        "hostile: baseline, {} writers for {:?}",
        config.writers, config.baseline
    );
    let monitor = Monitor::start(pid, port, tally.clone(), config.baseline + slack);
    let writes = writers::run_phase(port, config.writers, 0, config.baseline, timeline).await;
    let baseline = Phase {
        writes,
        usage: monitor.finish().await,
    };
    eprintln!(
        "hostile: {} baseline done: {:.0} rows/s",
        at(),
        baseline.writes.rate()
    );
    if let Some(status) = sluice.exited() {
        report
            .anomalies
            .push(format!("the server died during the baseline ({status})"));
        return (baseline, None);
    }
    eprintln!(
        "hostile: {} disturbed, {} writers beside {} fuzzers, {} deep, {} hungry, {} cancel and {} \
         idle clients for {:?}",
        at(),
        config.writers,
        config.fuzzers,
        config.deep,
        config.hungry,
        config.cancels,
        config.idle,
        config.disturbed
    );
    let monitor = Monitor::start(pid, port, tally.clone(), config.disturbed + slack);
    let end = Instant::now() + config.disturbed;
    report.disturbed_at = Some(timeline.now());
    let hostile = Hostile::start(config, port, end, tally, timeline);
    let writes = writers::run_phase(port, config.writers, 1, config.disturbed, timeline).await;
    let usage = monitor.finish().await;
    eprintln!(
        "hostile: {} writers done: {:.0} rows/s",
        at(),
        writes.rate()
    );
    hostile.finish().await;
    eprintln!("hostile: {} hostile clients stopped", at());
    if let Some(status) = sluice.exited() {
        report.anomalies.push(format!(
            "the server died during the disturbed phase ({status})"
        ));
    }
    (baseline, Some(Phase { writes, usage }))
}

/// The hostile clients of the disturbed phase.
struct Hostile {
    stop: Arc<AtomicBool>,
    tasks: Vec<JoinHandle<()>>,
}

impl Hostile {
    fn start(
        config: &Config,
        port: u16,
        end: Instant,
        tally: &Arc<Tally>,
        timeline: &Arc<Timeline>,
    ) -> Hostile {
        let stop = Arc::new(AtomicBool::new(false));
        let mut tasks = Vec::new();
        let timeout = config.hostile_timeout;
        let seed = |class: u64, i: usize| {
            config
                .seed
                .wrapping_mul(0x9e37_79b9_7f4a_7c15)
                .wrapping_add(class << 32 | i as u64)
        };
        let sql_clients = [
            (Class::Deep, config.deep),
            (Class::Hungry, config.hungry),
            (Class::Cancel, config.cancels),
        ];
        for (class, n) in sql_clients {
            for i in 0..n {
                let (stop, tally, timeline) = (stop.clone(), tally.clone(), timeline.clone());
                let seed = seed(class as u64, i);
                tasks.push(tokio::spawn(async move {
                    let target = Target {
                        port,
                        end,
                        stop: &stop,
                        tally: &tally,
                        timeline: &timeline,
                        timeout,
                    };
                    match class {
                        Class::Cancel => clients::cancel_loop(seed, &target).await,
                        _ => clients::statement_loop(class, seed, &target).await,
                    }
                }));
            }
        }
        for i in 0..config.fuzzers {
            let (stop, tally, timeline) = (stop.clone(), tally.clone(), timeline.clone());
            let seed = seed(Class::Fuzz as u64, i);
            tasks.push(tokio::spawn(async move {
                fuzz::fuzz_loop(port, seed, end, &stop, &tally, &timeline).await
            }));
        }
        for i in 0..config.idle {
            let (stop, tally) = (stop.clone(), tally.clone());
            let seed = seed(Class::Idle as u64, i);
            tasks.push(tokio::spawn(async move {
                idle::idle_loop(port, seed, end, &stop, &tally).await
            }));
        }
        Hostile { stop, tasks }
    }

    /// Stops the clients: each ends its attempt (a short grace), stragglers are aborted —
    /// which closes their connections mid-statement, one more disconnect for the server.
    async fn finish(self) {
        self.stop.store(true, Ordering::SeqCst);
        let grace = Instant::now() + Duration::from_secs(2);
        for mut t in self.tasks {
            if tokio::time::timeout_at(grace.into(), &mut t).await.is_err() {
                t.abort();
            }
        }
    }
}

/// Checks the stream on the running server, then after a SIGTERM and restart.
async fn finish(sluice: &mut Sluice, report: &mut RunReport) {
    let (acks, unknown, refused) = {
        let (mut a, mut u, mut r) = (Vec::new(), Vec::new(), Vec::new());
        for p in [&report.baseline, &report.disturbed].into_iter().flatten() {
            a.extend_from_slice(&p.writes.acks);
            u.extend_from_slice(&p.writes.unknown);
            r.extend_from_slice(&p.writes.refused);
        }
        (a, u, r)
    };
    if sluice.pid().is_some() && sluice.exited().is_none() {
        let result = verify::read_back(sluice.port())
            .await
            .map(|rows| verify::check(rows, &acks, &unknown, &refused));
        report.checks.push(Verification {
            when: "after the load",
            result,
        });
    }
    eprintln!("hostile: checked; SIGTERM and restart");
    if let Err(e) = sluice.restart().await {
        report.anomalies.push(format!("restart: {e}"));
        return;
    }
    eprintln!("hostile: restarted");
    let result = verify::read_back(sluice.port())
        .await
        .map(|rows| verify::check(rows, &acks, &unknown, &refused));
    report.checks.push(Verification {
        when: "after a restart",
        result,
    });
}

/// Turns what was measured into anomalies.
fn judge(report: &mut RunReport) {
    let mut found = Vec::new();
    for v in &report.checks {
        match &v.result {
            Ok(c) => found.extend(c.problems().into_iter().map(|p| format!("{}: {p}", v.when))),
            Err(e) => found.push(format!("{}: the stream could not be read: {e}", v.when)),
        }
    }
    if report.disturbed.is_some() && report.checks.len() < 2 {
        found.push("the stream was not checked both before and after a restart".into());
    }
    if let Some(r) = report.ratio() {
        if r < report.config.min_ratio {
            found.push(format!(
                "writer throughput under the hostile load is {:.0}% of the baseline (below {:.0}%)",
                r * 100.0,
                report.config.min_ratio * 100.0
            ));
        }
    } else if report.disturbed.is_some() {
        found.push("no writer throughput to compare (no row acknowledged in the baseline)".into());
    }
    if let (Some(bound), Some(peak)) = (report.config.rss_bound, report.rss_peak()) {
        if peak > bound {
            found.push(format!(
                "server RSS peaked at {} MiB, above the bound of {} MiB",
                peak >> 20,
                bound >> 20
            ));
        }
    }
    for (name, p) in [
        ("baseline", &report.baseline),
        ("disturbed", &report.disturbed),
    ] {
        if let Some(p) = p {
            let errors: u64 = p.writes.errors.values().sum();
            if errors > 0 {
                found.push(format!(
                    "{errors} writer errors in the {name} phase: {:?}",
                    p.writes.errors
                ));
            }
        }
    }
    for (class, t) in &report.tally {
        if t.unexpected_total() > 0 {
            found.push(format!(
                "{} unexpected outcomes of {}: {:?}",
                t.unexpected_total(),
                class.name(),
                t.unexpected
            ));
        }
    }
    if !report.panics.is_empty() {
        found.push(format!(
            "{} panic lines in the server log, first: {}",
            report.panics.len(),
            report.panics[0]
        ));
    }
    for f in &found {
        eprintln!("hostile ANOMALY: {f}");
    }
    report.anomalies.extend(found);
}
