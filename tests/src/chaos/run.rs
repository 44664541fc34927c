//! One chaos run: start the cluster, create the tables, start the tails and observers, then
//! for each round settle (heal, resume, restart, wait for a leader), run the load, inject
//! the round's nemesis, let writes go on after the heal, stop the load and check. A last
//! check follows the last round. Nothing here panics on what the cluster does: findings
//! become [`Anomaly`]s in the [`RunReport`].

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::path::PathBuf;
use std::sync::atomic::AtomicI64;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rand::seq::SliceRandom;
use rand::SeedableRng;
use tokio::task::JoinHandle;

use super::checker;
use super::control::Control;
use super::history::{lock, Clock, History, LogRow, Outcome};
use super::nemesis::{self, Fault, Nemesis, Stage};
use super::workload::{self, start_tail, text_query, Load, Observers};

/// What to run.
#[derive(Clone, Debug)]
pub struct Config {
    pub nodes: u64,
    pub rounds: usize,
    pub seed: u64,
    pub nemeses: Vec<Nemesis>,
    /// How long a timed fault lasts.
    pub fault: Duration,
    /// Load before the fault, and after the heal before the check.
    pub warmup: Duration,
    pub recovery: Duration,
    pub appenders: usize,
    pub transfers: usize,
    /// Keep the nodes' data and logs even without anomalies.
    pub keep: bool,
    /// The `sluice` binary; default [`crate::binary_path`].
    pub binary: Option<PathBuf>,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            nodes: 3,
            rounds: Nemesis::ALL.len(),
            seed: 1,
            nemeses: Nemesis::ALL.to_vec(),
            fault: Duration::from_secs(4),
            warmup: Duration::from_secs(1),
            recovery: Duration::from_secs(2),
            appenders: 6,
            transfers: 2,
            keep: false,
            binary: None,
        }
    }
}

/// Bound for failover after the leader's process goes, and for the next acknowledged
/// append after a membership step.
pub const ACK_BOUND: Duration = Duration::from_secs(5);

/// A finding: what broke, in which round (0 = setup, rounds+1 = final check).
#[derive(Clone, Debug)]
pub struct Anomaly {
    pub round: usize,
    pub nemesis: String,
    pub what: String,
}

#[derive(Clone, Copy, Debug, Default)]
pub struct OpCounts {
    pub ok: usize,
    pub failed: usize,
    pub unknown: usize,
}

#[derive(Clone, Debug)]
pub struct RoundReport {
    pub index: usize,
    pub fault: Fault,
    pub failover: Option<Duration>,
    pub availability: Option<f64>,
    /// Each membership step and the time to the next acknowledged append.
    pub step_acks: Vec<(String, Option<Duration>)>,
    pub ops: OpCounts,
    pub rows: usize,
    pub anomalies: usize,
    pub elapsed: Duration,
}

#[derive(Debug)]
pub struct RunReport {
    pub config: Config,
    pub rounds: Vec<RoundReport>,
    pub anomalies: Vec<Anomaly>,
    pub ops: OpCounts,
    pub unknown: checker::UnknownCounts,
    pub rows: usize,
    /// Transfers committed / attempted.
    pub bank: (u64, u64),
    pub bank_reads: usize,
    pub terms: usize,
    pub tail_copies: u64,
    pub elapsed: Duration,
    /// Where the nodes' data and logs were kept (on anomalies or when asked).
    pub kept: Option<PathBuf>,
}

/// The nemesis of each round: the chosen ones, shuffled by the seed, cycle after cycle.
pub fn schedule(config: &Config) -> Vec<Nemesis> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(config.seed);
    let mut out = Vec::new();
    while out.len() < config.rounds && !config.nemeses.is_empty() {
        let mut cycle = config.nemeses.clone();
        cycle.shuffle(&mut rng);
        out.extend(cycle);
    }
    out.truncate(config.rounds);
    out
}

struct Run {
    control: Control,
    history: Arc<History>,
    tails: BTreeMap<u64, JoinHandle<()>>,
    anomalies: Vec<Anomaly>,
    reported: HashSet<String>,
    bank_checked: usize,
    leader_terms_reported: BTreeSet<i64>,
    unknown: checker::UnknownCounts,
    rows: usize,
}

pub async fn run(config: Config) -> RunReport {
    let started = Instant::now();
    let dir = tempfile::Builder::new()
        .prefix("sluice-chaos-")
        .tempdir()
        .expect("temporary directory");
    let extra = vec!["--checkpoint-entries".to_string(), "200".to_string()];
    let mut report = RunReport {
        config: config.clone(),
        rounds: Vec::new(),
        anomalies: Vec::new(),
        ops: OpCounts::default(),
        unknown: checker::UnknownCounts::default(),
        rows: 0,
        bank: (0, 0),
        bank_reads: 0,
        terms: 0,
        tail_copies: 0,
        elapsed: Duration::ZERO,
        kept: None,
    };
    let binary = config.binary.clone().unwrap_or_else(crate::binary_path);
    let control = match Control::start(&binary, dir.path(), config.nodes, &extra).await {
        Ok(c) => c,
        Err(e) => {
            report.anomalies.push(Anomaly {
                round: 0,
                nemesis: "setup".into(),
                what: format!("cluster did not start: {e}"),
            });
            report.kept = Some(dir.keep());
            return report;
        }
    };
    let clock = Clock::start();
    let mut run = Run {
        control,
        history: Arc::new(History::default()),
        tails: BTreeMap::new(),
        anomalies: Vec::new(),
        reported: HashSet::new(),
        bank_checked: 0,
        leader_terms_reported: BTreeSet::new(),
        unknown: checker::UnknownCounts::default(),
        rows: 0,
    };
    run.setup().await;
    let ports = run.control.ports();
    let observers = Observers::start(&ports, &run.history, clock);
    for id in run.control.members.clone() {
        run.tails.insert(id, start_tail(id, &ports, &run.history));
    }
    let mut rng = rand::rngs::StdRng::seed_from_u64(config.seed ^ 0x5eed);
    let next_seq: Arc<Vec<AtomicI64>> =
        Arc::new((0..config.appenders).map(|_| AtomicI64::new(0)).collect());
    for (i, n) in schedule(&config).into_iter().enumerate() {
        let round = i + 1;
        let began = Instant::now();
        let ops_before = lock(&run.history.ops).len();
        run.settle(round, n.name()).await;
        let load = Load::start(
            config.appenders,
            config.transfers,
            &next_seq,
            &ports,
            &run.history,
            clock,
            config.seed.wrapping_add(round as u64),
        );
        tokio::time::sleep(config.warmup).await;
        let fault = {
            let mut stage = Stage {
                control: &mut run.control,
                history: &run.history,
                tails: &mut run.tails,
                clock,
                rng: &mut rng,
                fault: config.fault,
            };
            nemesis::run(n, &mut stage).await
        };
        tokio::time::sleep(config.recovery).await;
        load.finish().await;
        let before = run.anomalies.len();
        for p in &fault.problems {
            run.anomaly(round, n.name(), p.clone());
        }
        run.check(round, n.name(), false).await;
        let rr = run.round_report(round, fault, ops_before, began);
        eprintln!(
            "chaos round {round}/{}: {} {} — ops ok {} failed {} unknown {}, failover {:?}, \
             availability {}, {} new anomalies, {:.1}s",
            config.rounds,
            n.name(),
            rr.fault.target,
            rr.ops.ok,
            rr.ops.failed,
            rr.ops.unknown,
            rr.failover,
            rr.availability
                .map_or("-".into(), |a| format!("{:.0}%", a * 100.0)),
            run.anomalies.len() - before,
            rr.elapsed.as_secs_f64()
        );
        report.rounds.push(RoundReport {
            anomalies: run.anomalies.len() - before,
            ..rr
        });
    }
    let last = config.rounds + 1;
    run.settle(last, "final").await;
    run.check(last, "final", true).await;
    drop(observers);
    for (_, t) in std::mem::take(&mut run.tails) {
        t.abort();
    }
    let ops = run.history.ops();
    report.ops = count(&ops);
    report.unknown = run.unknown;
    report.rows = run.rows;
    report.bank = *lock(&run.history.bank_committed);
    report.bank_reads = lock(&run.history.bank_reads).len();
    report.terms = checker::leader_terms(&lock(&run.history.leaders)).len();
    report.tail_copies = lock(&run.history.tails)
        .iter()
        .map(|t| lock(t).copies)
        .sum();
    report.anomalies = std::mem::take(&mut run.anomalies);
    report.elapsed = started.elapsed();
    drop(run);
    if !report.anomalies.is_empty() || config.keep {
        report.kept = Some(dir.keep());
    }
    report
}

fn count(ops: &[super::history::Op]) -> OpCounts {
    let mut c = OpCounts::default();
    for o in ops {
        match o.outcome {
            Outcome::Ok(_) => c.ok += 1,
            Outcome::Failed(_) => c.failed += 1,
            Outcome::Unknown(_) => c.unknown += 1,
        }
    }
    c
}

impl Run {
    fn anomaly(&mut self, round: usize, nemesis: &str, what: String) {
        self.anomaly_keyed(round, nemesis, what.clone(), what);
    }

    /// Reports `what` unless an anomaly with the same `key` was reported before.
    fn anomaly_keyed(&mut self, round: usize, nemesis: &str, key: String, what: String) {
        if self.reported.insert(key) {
            eprintln!("chaos ANOMALY (round {round}, {nemesis}): {what}");
            self.anomalies.push(Anomaly {
                round,
                nemesis: nemesis.into(),
                what,
            });
        }
    }

    /// Creates the tables (retrying while the cluster settles).
    async fn setup(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(60);
        for sql in workload::schema() {
            loop {
                let on = self.control.wait_leader(Duration::from_secs(30)).await;
                let r = match on {
                    Ok(l) => self.control.execute(l, &sql, Duration::from_secs(20)).await,
                    Err(e) => Err(e),
                };
                match r {
                    Ok(()) => break,
                    Err(e) if Instant::now() > deadline => {
                        self.anomaly(0, "setup", format!("{sql}: {e}"));
                        break;
                    }
                    Err(_) => tokio::time::sleep(Duration::from_millis(300)).await,
                }
            }
        }
    }

    /// Heals the network, resumes paused and restarts stopped members, waits for a leader.
    async fn settle(&mut self, round: usize, nemesis: &str) {
        self.control.net.heal();
        for id in self.control.running() {
            if self.control.is_paused(id) {
                self.control.resume(id);
            }
        }
        for (id, status) in self.control.reap_unexpected() {
            self.anomaly(
                round,
                nemesis,
                format!(
                    "node {id} exited on its own ({status}); see {}",
                    self.log(id)
                ),
            );
        }
        let running = self.control.running();
        for id in self.control.members.clone() {
            let r = if running.contains(&id) {
                self.control.wait_ready(id, Duration::from_secs(60)).await
            } else {
                self.control.restart(id, Duration::from_secs(60)).await
            };
            if let Err(e) = r {
                self.anomaly(
                    round,
                    nemesis,
                    format!("settling: {e}; see {}", self.log(id)),
                );
            }
        }
        if let Err(e) = self.control.wait_leader(Duration::from_secs(30)).await {
            self.anomaly(round, nemesis, format!("settling: {e}"));
        }
    }

    fn log(&self, id: u64) -> String {
        self.control
            .log_path(id)
            .map_or("(no log)".into(), |p| p.display().to_string())
    }

    /// Every serving member's full `chaos_log`, read linearizably.
    async fn dumps(&self) -> (BTreeMap<u64, Vec<LogRow>>, Vec<String>) {
        let mut dumps = BTreeMap::new();
        let mut errors = Vec::new();
        for id in self.control.serving_members() {
            match dump(&self.control, id).await {
                Ok(d) => {
                    dumps.insert(id, d);
                }
                Err(e) => errors.push(format!("dump of node {id}: {e}")),
            }
        }
        (dumps, errors)
    }

    async fn check(&mut self, round: usize, nemesis: &str, complete: bool) {
        for (id, status) in self.control.reap_unexpected() {
            self.anomaly(
                round,
                nemesis,
                format!(
                    "node {id} exited on its own ({status}); see {}",
                    self.log(id)
                ),
            );
        }
        // Converged dumps (bounded).
        let deadline = Instant::now() + Duration::from_secs(30);
        let (dumps, problems) = loop {
            let (dumps, errors) = self.dumps().await;
            let diff = checker::compare_dumps(&dumps);
            if errors.is_empty() && diff.is_empty() && !dumps.is_empty() {
                break (dumps, Vec::new());
            }
            if Instant::now() > deadline {
                let mut p = errors;
                p.extend(diff);
                if dumps.is_empty() {
                    p.push("no member could be dumped".into());
                }
                break (dumps, p);
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        };
        for p in problems {
            self.anomaly(round, nemesis, format!("after 30 s: {p}"));
        }
        // The longest dump is the reference (the others are checked against it above).
        let Some((&ref_node, reference)) = dumps.iter().max_by_key(|(_, d)| d.len()) else {
            return;
        };
        let reference = reference.clone();
        self.rows = reference.len();
        for a in checker::check_dump_shape(ref_node, &reference) {
            self.anomaly(round, nemesis, a);
        }
        let ops = self.history.ops();
        let (found, unknown) = checker::check_ops(&reference, &ops);
        self.unknown = unknown;
        for a in found {
            self.anomaly(round, nemesis, a);
        }
        self.check_tails(round, nemesis, &reference, complete).await;
        let reads: Vec<_> = lock(&self.history.bank_reads)[self.bank_checked..].to_vec();
        self.bank_checked += reads.len();
        let total = workload::ACCOUNTS * workload::START_BALANCE;
        for a in checker::check_bank(&reads, workload::ACCOUNTS, total) {
            self.anomaly(round, nemesis, a);
        }
        let conflicts = checker::check_leaders(&lock(&self.history.leaders));
        for (term, a) in conflicts {
            if self.leader_terms_reported.insert(term) {
                self.anomaly(round, nemesis, a);
            }
        }
    }

    /// Tails of serving members catch up with the log (bounded); every tail is a gapless
    /// prefix of it.
    async fn check_tails(
        &mut self,
        round: usize,
        nemesis: &str,
        reference: &[LogRow],
        complete: bool,
    ) {
        let serving = self.control.serving_members();
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            let behind: Vec<(u64, usize)> = lock(&self.history.tails)
                .iter()
                .filter_map(|t| {
                    let t = lock(t);
                    (!t.stopped && serving.contains(&t.node) && t.rows.len() < reference.len())
                        .then_some((t.node, t.rows.len()))
                })
                .collect();
            if behind.is_empty() {
                break;
            }
            if Instant::now() > deadline {
                for (node, got) in behind {
                    let errors = lock(&self.history.tails)
                        .iter()
                        .find(|t| lock(t).node == node && !lock(t).stopped)
                        .map(|t| {
                            let t = lock(t);
                            format!(
                                "{} COPYs, last errors {:?}",
                                t.copies,
                                t.errors.iter().rev().take(2).collect::<Vec<_>>()
                            )
                        })
                        .unwrap_or_default();
                    // A tail stuck at the same row is reported once, not every round.
                    self.anomaly_keyed(
                        round,
                        nemesis,
                        format!("stalled tail {node} {got}"),
                        format!(
                            "tail on node {node} stalled: {got} rows received, the log has {} \
                             (15 s after the load stopped; {errors})",
                            reference.len()
                        ),
                    );
                }
                break;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        let found: Vec<String> = lock(&self.history.tails)
            .iter()
            .flat_map(|t| checker::check_tail(&lock(t), reference, complete))
            .collect();
        for a in found {
            self.anomaly(round, nemesis, a);
        }
    }

    fn round_report(
        &mut self,
        round: usize,
        fault: Fault,
        ops_before: usize,
        began: Instant,
    ) -> RoundReport {
        let ops = self.history.ops();
        let round_ops = &ops[ops_before.min(ops.len())..];
        let name = fault.nemesis.name();
        let failover = checker::failover(&ops, fault.start);
        match failover {
            None => self.anomaly(
                round,
                name,
                format!(
                    "no append was acknowledged after the fault started at {:.3}s",
                    fault.start.as_secs_f64()
                ),
            ),
            Some(d) if fault.nemesis.kills_leader() && d > ACK_BOUND => self.anomaly(
                round,
                name,
                format!(
                    "failover took {d:?} (> {ACK_BOUND:?}) after {} at {:.3}s",
                    fault.target,
                    fault.start.as_secs_f64()
                ),
            ),
            Some(_) => {}
        }
        let availability = checker::availability(&ops, fault.start, fault.heal);
        let mut step_acks = Vec::new();
        for (step, at) in &fault.steps {
            let next = checker::next_ack(&ops, *at);
            if next.is_none_or(|d| d > ACK_BOUND) {
                self.anomaly(
                    round,
                    name,
                    format!(
                        "after `{step}` at {:.3}s the next acknowledged append came {}",
                        at.as_secs_f64(),
                        next.map_or("never (in this round)".into(), |d| format!("after {d:?}"))
                    ),
                );
            }
            step_acks.push((step.clone(), next));
        }
        RoundReport {
            index: round,
            fault,
            failover,
            availability,
            step_acks,
            ops: count(round_ops),
            rows: self.rows,
            anomalies: 0,
            elapsed: began.elapsed(),
        }
    }
}

/// `SELECT offset, client, seq, ts FROM chaos_log ORDER BY offset` on node `id`, read
/// linearizably.
async fn dump(control: &Control, id: u64) -> Result<Vec<LogRow>, String> {
    let client = control.client(id).await?;
    text_query(
        &client,
        "SET read_consistency = 'linearizable'",
        Duration::from_secs(5),
    )
    .await?;
    let sql = "SELECT offset, client, seq, ts FROM chaos_log ORDER BY offset";
    let rows = text_query(&client, sql, Duration::from_secs(60)).await?;
    rows.into_iter()
        .map(|r| {
            let field = |i: usize| r.get(i).cloned().flatten().unwrap_or_default();
            let num = |i: usize| {
                field(i)
                    .parse::<i64>()
                    .map_err(|e| format!("bad value {:?}: {e}", field(i)))
            };
            Ok(LogRow {
                offset: num(0)?,
                client: num(1)?,
                seq: num(2)?,
                ts: field(3),
            })
        })
        .collect()
}
