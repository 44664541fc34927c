//! Nemeses: one fault per round, injected while the load runs, then healed. Each returns a
//! [`Fault`] saying what it did and when (the checker measures failover and availability
//! over `[start, heal)`), the membership steps it completed (each must be followed by an
//! acknowledged append within 5 s), and problems it met (a node that would not restart, a
//! membership change that never went through) — anomalies, not panics.
//!
//! Targets are drawn from the run's seeded RNG over sorted node lists, so a seed repeats
//! the same choices given the same leaders.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::Rng;
use tokio::task::JoinHandle;

use super::control::{Control, CONTROL_TIMEOUT};
use super::history::{lock, Clock, History};
use super::workload::start_tail;

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Nemesis {
    KillLeader,
    KillRandom,
    PauseLeader,
    PartitionLeader,
    PartitionFollower,
    Bridge,
    OneWay,
    TerminateLeader,
    JoinKill,
    JoinPause,
    Readd,
    Replace,
    SnapshotTail,
}

impl Nemesis {
    pub const ALL: [Nemesis; 13] = [
        Nemesis::KillLeader,
        Nemesis::KillRandom,
        Nemesis::PauseLeader,
        Nemesis::PartitionLeader,
        Nemesis::PartitionFollower,
        Nemesis::Bridge,
        Nemesis::OneWay,
        Nemesis::TerminateLeader,
        Nemesis::JoinKill,
        Nemesis::JoinPause,
        Nemesis::Readd,
        Nemesis::Replace,
        Nemesis::SnapshotTail,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Nemesis::KillLeader => "kill-leader",
            Nemesis::KillRandom => "kill-random",
            Nemesis::PauseLeader => "pause-leader",
            Nemesis::PartitionLeader => "partition-leader",
            Nemesis::PartitionFollower => "partition-follower",
            Nemesis::Bridge => "bridge",
            Nemesis::OneWay => "one-way",
            Nemesis::TerminateLeader => "terminate-leader",
            Nemesis::JoinKill => "join-kill",
            Nemesis::JoinPause => "join-pause",
            Nemesis::Readd => "readd",
            Nemesis::Replace => "replace",
            Nemesis::SnapshotTail => "snapshot-tail",
        }
    }

    pub fn parse(name: &str) -> Option<Nemesis> {
        Nemesis::ALL.into_iter().find(|n| n.name() == name)
    }

    /// The leader's process goes away (the failover bound applies).
    pub fn kills_leader(self) -> bool {
        matches!(self, Nemesis::KillLeader | Nemesis::TerminateLeader)
    }

    pub fn changes_membership(self) -> bool {
        matches!(
            self,
            Nemesis::JoinKill | Nemesis::JoinPause | Nemesis::Readd | Nemesis::Replace
        )
    }
}

/// What one nemesis did.
#[derive(Clone, Debug)]
pub struct Fault {
    pub nemesis: Nemesis,
    pub target: String,
    pub start: Duration,
    pub heal: Duration,
    /// Membership changes completed, and when.
    pub steps: Vec<(String, Duration)>,
    pub notes: Vec<String>,
    pub problems: Vec<String>,
}

/// What a nemesis acts on.
pub struct Stage<'a> {
    pub control: &'a mut Control,
    pub history: &'a Arc<History>,
    pub tails: &'a mut BTreeMap<u64, JoinHandle<()>>,
    pub clock: Clock,
    pub rng: &'a mut StdRng,
    /// How long a timed fault lasts.
    pub fault: Duration,
}

/// Appends acknowledged during the isolation that must force a snapshot (the servers
/// checkpoint every 200 entries).
const SNAPSHOT_ACKS: usize = 450;
const RESTART_LIMIT: Duration = Duration::from_secs(60);
const MEMBERSHIP_LIMIT: Duration = Duration::from_secs(90);

pub async fn run(nemesis: Nemesis, stage: &mut Stage<'_>) -> Fault {
    let mut f = Fault {
        nemesis,
        target: String::new(),
        start: stage.clock.now(),
        heal: stage.clock.now(),
        steps: Vec::new(),
        notes: Vec::new(),
        problems: Vec::new(),
    };
    match nemesis {
        Nemesis::KillLeader => kill(stage, &mut f, true).await,
        Nemesis::KillRandom => kill(stage, &mut f, false).await,
        Nemesis::PauseLeader => pause_leader(stage, &mut f).await,
        Nemesis::PartitionLeader => partition(stage, &mut f, true).await,
        Nemesis::PartitionFollower => partition(stage, &mut f, false).await,
        Nemesis::Bridge => bridge(stage, &mut f).await,
        Nemesis::OneWay => one_way(stage, &mut f).await,
        Nemesis::TerminateLeader => terminate_leader(stage, &mut f).await,
        Nemesis::JoinKill => join(stage, &mut f, false).await,
        Nemesis::JoinPause => join(stage, &mut f, true).await,
        Nemesis::Readd => readd(stage, &mut f).await,
        Nemesis::Replace => replace(stage, &mut f).await,
        Nemesis::SnapshotTail => snapshot_tail(stage, &mut f).await,
    }
    stage.control.net.heal();
    f
}

impl Stage<'_> {
    fn now(&self) -> Duration {
        self.clock.now()
    }

    async fn leader(&mut self, f: &mut Fault) -> Option<u64> {
        match self.control.wait_leader(Duration::from_secs(20)).await {
            Ok(l) => Some(l),
            Err(e) => {
                f.problems.push(format!("before the fault: {e}"));
                None
            }
        }
    }

    fn pick(&mut self, from: &[u64]) -> Option<u64> {
        if from.is_empty() {
            return None;
        }
        Some(from[self.rng.gen_range(0..from.len())])
    }

    fn members(&self) -> Vec<u64> {
        self.control.members.iter().copied().collect()
    }

    async fn restart(&mut self, id: u64, f: &mut Fault) {
        if let Err(e) = self.control.restart(id, RESTART_LIMIT).await {
            f.problems.push(format!("restart of node {id}: {e}"));
        }
    }

    fn start_tail(&mut self, id: u64) {
        let ports = self.control.ports();
        if let Some(old) = self.tails.insert(id, start_tail(id, &ports, self.history)) {
            old.abort();
        }
    }

    fn stop_tail(&mut self, id: u64) {
        if let Some(t) = self.tails.remove(&id) {
            t.abort();
        }
        for t in lock(&self.history.tails).iter() {
            let mut t = lock(t);
            if t.node == id {
                t.stopped = true;
            }
        }
    }

    /// Runs `ALTER CLUSTER ...` on serving members other than `avoid` until one accepts it
    /// (bounded); `done_if` names an SQLSTATE meaning an earlier attempt already did it.
    async fn alter(&mut self, sql: &str, avoid: Option<u64>, done_if: &str, f: &mut Fault) -> bool {
        let deadline = Instant::now() + MEMBERSHIP_LIMIT;
        let mut attempt = 0;
        while Instant::now() < deadline {
            let candidates: Vec<u64> = self
                .control
                .serving_members()
                .into_iter()
                .filter(|id| Some(*id) != avoid)
                .collect();
            let Some(on) = self.pick(&candidates) else {
                tokio::time::sleep(Duration::from_millis(200)).await;
                continue;
            };
            attempt += 1;
            match self.control.execute(on, sql, Duration::from_secs(45)).await {
                Ok(()) => {
                    f.steps.push((format!("{sql} (on node {on})"), self.now()));
                    return true;
                }
                Err(e) if attempt > 1 && e.starts_with(done_if) => {
                    f.notes
                        .push(format!("{sql}: retry on node {on} found it done: {e}"));
                    f.steps.push((format!("{sql} (on node {on})"), self.now()));
                    return true;
                }
                Err(e) => {
                    f.notes
                        .push(format!("{sql} on node {on} (attempt {attempt}): {e}"));
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
            }
        }
        f.problems.push(format!(
            "`{sql}` did not succeed within {MEMBERSHIP_LIMIT:?} ({attempt} attempts)"
        ));
        false
    }

    /// Removes member `id` (through another member) and stops its process.
    async fn remove(&mut self, id: u64, f: &mut Fault) -> bool {
        let ok = self
            .alter(
                &format!("ALTER CLUSTER REMOVE NODE {id}"),
                Some(id),
                "42704",
                f,
            )
            .await;
        if ok {
            self.control.members.remove(&id);
        }
        match self.control.terminate(id, Duration::from_secs(30)).await {
            Ok(s) if !s.success() => f
                .notes
                .push(format!("removed node {id} exited with {s} on SIGTERM")),
            Ok(_) => {}
            Err(e) => f.problems.push(format!("stopping removed node {id}: {e}")),
        }
        ok
    }

    /// Starts `id` with `--join`, adds it (through a member chosen at random) and waits
    /// until it serves; starts a tail on it if `tail`.
    async fn add(&mut self, id: u64, tail: bool, f: &mut Fault) -> bool {
        let addr = match self.control.spawn_joining(id).await {
            Ok(a) => a,
            Err(e) => {
                f.problems.push(format!("start joining node {id}: {e}"));
                return false;
            }
        };
        if tail {
            self.start_tail(id);
        }
        let ok = self
            .alter(
                &format!("ALTER CLUSTER ADD NODE {id} '{addr}'"),
                Some(id),
                "42710",
                f,
            )
            .await;
        if !ok {
            return false;
        }
        self.control.members.insert(id);
        match self.control.wait_ready(id, RESTART_LIMIT).await {
            Ok(_) => true,
            Err(e) => {
                f.problems.push(format!("added node {id}: {e}"));
                false
            }
        }
    }
}

async fn kill(stage: &mut Stage<'_>, f: &mut Fault, leader: bool) {
    let Some(l) = stage.leader(f).await else {
        return;
    };
    let members = stage.members();
    let target = if leader {
        l
    } else {
        stage.pick(&members).unwrap_or(l)
    };
    f.target = format!(
        "node {target}{}",
        if target == l { " (leader)" } else { "" }
    );
    stage.control.kill(target);
    f.start = stage.now();
    tokio::time::sleep(stage.fault).await;
    f.heal = stage.now();
    stage.restart(target, f).await;
}

async fn pause_leader(stage: &mut Stage<'_>, f: &mut Fault) {
    let Some(l) = stage.leader(f).await else {
        return;
    };
    f.target = format!("node {l} (leader)");
    stage.control.pause(l);
    f.start = stage.now();
    // Longer than the election timeout (1-2 s).
    tokio::time::sleep(stage.fault.max(Duration::from_secs(3))).await;
    stage.control.resume(l);
    f.heal = stage.now();
}

async fn partition(stage: &mut Stage<'_>, f: &mut Fault, leader: bool) {
    let Some(l) = stage.leader(f).await else {
        return;
    };
    let members = stage.members();
    let followers: Vec<u64> = members.iter().copied().filter(|m| *m != l).collect();
    let target = if leader {
        l
    } else {
        stage.pick(&followers).unwrap_or(l)
    };
    f.target = format!(
        "node {target}{} isolated",
        if target == l { " (leader)" } else { "" }
    );
    let all = stage.control.running();
    stage.control.net.isolate(target, &all);
    f.start = stage.now();
    tokio::time::sleep(stage.fault).await;
    stage.control.net.heal();
    f.heal = stage.now();
}

async fn bridge(stage: &mut Stage<'_>, f: &mut Fault) {
    let Some(l) = stage.leader(f).await else {
        return;
    };
    let members = stage.members();
    let followers: Vec<u64> = members.iter().copied().filter(|m| *m != l).collect();
    let Some(b) = stage.pick(&followers) else {
        return;
    };
    let mut rest: Vec<u64> = vec![l];
    rest.extend(followers.iter().copied().filter(|m| *m != b));
    let (h1, h2) = rest.split_at(rest.len() / 2);
    f.target = format!("{h1:?} | {h2:?} cut, node {b} bridges (leader {l})");
    stage.control.net.split(h1, h2);
    f.start = stage.now();
    tokio::time::sleep(stage.fault).await;
    stage.control.net.heal();
    f.heal = stage.now();
}

async fn one_way(stage: &mut Stage<'_>, f: &mut Fault) {
    let Some(l) = stage.leader(f).await else {
        return;
    };
    let others: Vec<u64> = stage
        .control
        .running()
        .into_iter()
        .filter(|m| *m != l)
        .collect();
    let deaf = stage.rng.gen_bool(0.5);
    if deaf {
        f.target = format!("leader {l} sends but receives nothing");
        stage.control.net.cut_directed(&others, &[l]);
    } else {
        f.target = format!("leader {l} receives but cannot send");
        stage.control.net.cut_directed(&[l], &others);
    }
    f.start = stage.now();
    tokio::time::sleep(stage.fault).await;
    stage.control.net.heal();
    f.heal = stage.now();
}

async fn terminate_leader(stage: &mut Stage<'_>, f: &mut Fault) {
    let Some(l) = stage.leader(f).await else {
        return;
    };
    f.target = format!("node {l} (leader), SIGTERM");
    f.start = stage.now();
    let began = Instant::now();
    match stage.control.terminate(l, Duration::from_secs(30)).await {
        Ok(s) if s.success() => f.notes.push(format!(
            "node {l} exited cleanly after {:?}",
            began.elapsed()
        )),
        Ok(s) => f
            .problems
            .push(format!("node {l} exited with {s} after SIGTERM")),
        Err(e) => f.problems.push(e),
    }
    tokio::time::sleep(stage.fault.saturating_sub(began.elapsed())).await;
    f.heal = stage.now();
    stage.restart(l, f).await;
}

/// Node j joins; meanwhile the leader is killed (or an old member paused); then j leaves.
async fn join(stage: &mut Stage<'_>, f: &mut Fault, pause: bool) {
    let Some(l) = stage.leader(f).await else {
        return;
    };
    let old = stage.members();
    let victim = if pause && stage.rng.gen_bool(0.5) {
        let followers: Vec<u64> = old.iter().copied().filter(|m| *m != l).collect();
        stage.pick(&followers).unwrap_or(l)
    } else {
        l
    };
    let delay = Duration::from_millis(stage.rng.gen_range(0..1500));
    let j = stage.control.fresh_id();
    f.target = format!(
        "node {j} joins; node {victim}{} {} {delay:?} after the ADD is sent",
        if victim == l { " (leader)" } else { "" },
        if pause { "paused" } else { "killed" }
    );
    let addr = match stage.control.spawn_joining(j).await {
        Ok(a) => a,
        Err(e) => {
            f.problems.push(format!("start joining node {j}: {e}"));
            return;
        }
    };
    stage.start_tail(j);
    // The first ADD goes to a member in the background while the victim goes down (a
    // paused member would just hold the statement until it times out).
    let candidates: Vec<u64> = stage
        .control
        .serving_members()
        .into_iter()
        .filter(|m| !pause || *m != victim)
        .collect();
    let on = stage.pick(&candidates).unwrap_or(l);
    let sql = format!("ALTER CLUSTER ADD NODE {j} '{addr}'");
    let first_add = match stage.control.client(on).await {
        Ok(client) => {
            let sql = sql.clone();
            Some(tokio::spawn(async move {
                match tokio::time::timeout(Duration::from_secs(45), client.batch_execute(&sql))
                    .await
                {
                    Ok(Ok(())) => Ok(()),
                    Ok(Err(e)) => Err(super::control::describe(&e)),
                    Err(_) => Err("timed out".to_string()),
                }
            }))
        }
        Err(e) => {
            f.notes
                .push(format!("connect to node {on} for the ADD: {e}"));
            None
        }
    };
    tokio::time::sleep(delay).await;
    if pause {
        stage.control.pause(victim);
    } else {
        stage.control.kill(victim);
    }
    f.start = stage.now();
    let mut added = false;
    if let Some(task) = first_add {
        match task.await {
            Ok(Ok(())) => {
                added = true;
                f.steps.push((format!("{sql} (on node {on})"), stage.now()));
            }
            Ok(Err(e)) => f.notes.push(format!("{sql} on node {on}: {e}")),
            Err(e) => f.notes.push(format!("{sql} task: {e}")),
        }
    }
    if !added {
        added = stage.alter(&sql, Some(j), "42710", f).await;
    }
    if added {
        stage.control.members.insert(j);
        if let Err(e) = stage.control.wait_ready(j, RESTART_LIMIT).await {
            f.problems.push(format!("added node {j}: {e}"));
        }
    }
    let left = stage
        .fault
        .saturating_sub(stage.now().saturating_sub(f.start));
    tokio::time::sleep(left).await;
    if pause {
        stage.control.resume(victim);
    } else {
        stage.restart(victim, f).await;
    }
    f.heal = stage.now();
    stage.control.net.heal();
    if added {
        stage.remove(j, f).await;
    } else {
        // Not a member (as far as we know): try to undo a half-done ADD anyway.
        let _ = stage
            .control
            .execute(
                victim,
                &format!("ALTER CLUSTER REMOVE NODE {j}"),
                CONTROL_TIMEOUT,
            )
            .await;
    }
    stage.stop_tail(j);
    stage.control.discard(j);
}

/// A member is removed, wiped, and added back under the same id and address.
async fn readd(stage: &mut Stage<'_>, f: &mut Fault) {
    let Some(l) = stage.leader(f).await else {
        return;
    };
    let members = stage.members();
    let Some(x) = stage.pick(&members) else {
        return;
    };
    f.target = format!("node {x}{}", if x == l { " (leader)" } else { "" });
    f.start = stage.now();
    if !stage.remove(x, f).await {
        // Still a member as far as we know: bring it back as it was.
        stage.control.members.insert(x);
        stage.restart(x, f).await;
        return;
    }
    if let Err(e) = stage.control.wipe(x) {
        f.problems.push(e);
        return;
    }
    // x's tail keeps running: it resumes at last+1 once x serves again.
    stage.add(x, false, f).await;
    f.heal = stage.now();
}

/// A member is removed and a fresh node takes its place.
async fn replace(stage: &mut Stage<'_>, f: &mut Fault) {
    let Some(l) = stage.leader(f).await else {
        return;
    };
    let members = stage.members();
    let Some(x) = stage.pick(&members) else {
        return;
    };
    let y = stage.control.fresh_id();
    f.target = format!(
        "node {x}{} replaced by node {y}",
        if x == l { " (leader)" } else { "" }
    );
    f.start = stage.now();
    if !stage.remove(x, f).await {
        stage.control.members.insert(x);
        stage.restart(x, f).await;
        return;
    }
    stage.stop_tail(x);
    stage.control.discard(x);
    stage.add(y, true, f).await;
    f.heal = stage.now();
}

/// A follower is cut off while enough is written for the others to compact past it; its
/// COPY tail keeps running and must go on, gapless, after it installs a snapshot.
async fn snapshot_tail(stage: &mut Stage<'_>, f: &mut Fault) {
    let Some(l) = stage.leader(f).await else {
        return;
    };
    let members = stage.members();
    let followers: Vec<u64> = members.iter().copied().filter(|m| *m != l).collect();
    let Some(x) = stage.pick(&followers) else {
        return;
    };
    let before = stage.control.stat(x, "snapshots_installed").await;
    f.target = format!("node {x} cut off for {SNAPSHOT_ACKS} appends");
    let all = stage.control.running();
    stage.control.net.isolate(x, &all);
    f.start = stage.now();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let acked = stage.history.acks_between(f.start, stage.now()).len();
        if acked >= SNAPSHOT_ACKS {
            break;
        }
        if Instant::now() > deadline {
            f.notes.push(format!(
                "only {acked} appends acknowledged while node {x} was cut off"
            ));
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    stage.control.net.heal();
    f.heal = stage.now();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let now = stage.control.stat(x, "snapshots_installed").await;
        if let (Some(b), Some(n)) = (before, now) {
            if n > b {
                f.notes
                    .push(format!("node {x} installed {} snapshot(s)", n - b));
                break;
            }
        }
        if Instant::now() > deadline {
            f.notes.push(format!(
                "node {x} installed no snapshot (snapshots_installed {before:?} -> {now:?})"
            ));
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
