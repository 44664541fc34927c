//! Scripted cluster tests: several node drivers in one thread, a simulated network that the
//! script delivers, drops and partitions, and logical time (ticks). Each scenario checks the
//! safety properties every outcome must keep: a proposer hears `Ok` only for a command that is
//! in every node's applied history, each command is applied at most once, and all nodes apply
//! the same commands at the same indexes.

use std::collections::{BTreeMap, BTreeSet, HashSet, VecDeque};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use tokio::sync::oneshot;

use super::driver::{Driver, Request};
use super::tests::Recorder;
use super::*;
use crate::transport::{Envelope, Inbound, Transport};

type Frame = (u64, u64, Envelope);
type Wire = Arc<Mutex<VecDeque<Frame>>>;
/// Picks frames by sender, receiver and content.
type FrameFilter = Box<dyn Fn(u64, u64, &Envelope) -> bool>;

/// A transport that puts frames on the shared simulated wire.
struct SimTransport {
    from: u64,
    wire: Wire,
}

impl Transport for SimTransport {
    fn send(&mut self, to: u64, env: Envelope, _is_snapshot: bool) {
        self.wire.lock().unwrap().push_back((self.from, to, env));
    }
    fn set_peers(&mut self, _peers: &BTreeMap<u64, String>) {}
}

struct SimNode {
    driver: Option<Driver<Recorder>>,
    sm: Recorder,
    dir: PathBuf,
    metrics: Arc<Metrics>,
}

type Pending = oneshot::Receiver<std::result::Result<(u64, Vec<u8>), ProposeError>>;

struct Sim {
    _root: tempfile::TempDir,
    nodes: BTreeMap<u64, SimNode>,
    wire: Wire,
    /// Directed links that drop everything.
    cut: HashSet<(u64, u64)>,
    /// Nodes whose Raft messages are dropped (their forwarding replies still go through).
    mute_raft: HashSet<u64>,
    /// Frames this filter picks are delayed: kept in `held` instead of being delivered.
    hold: Option<FrameFilter>,
    held: Vec<Frame>,
    /// When a frame this filter picks is about to be delivered, the held frames arrive first
    /// (late, whatever links have been cut since they were sent).
    release_before: Option<FrameFilter>,
    /// Nodes whose Raft messages are dropped from the moment the held frames are released.
    mute_after_release: Option<u64>,
    /// Proposals made so far: (command, reply).
    pending: Vec<(Vec<u8>, Pending)>,
    /// Outcomes heard so far.
    ok: Vec<Vec<u8>>,
    failed: usize,
    /// Commands answered as certainly not applied (`Dropped` or `Failed`).
    refused: Vec<Vec<u8>>,
    checkpoint_entries: u64,
}

fn node_config(id: u64, dir: PathBuf, voters: &[u64], checkpoint_entries: u64) -> NodeConfig {
    let mut c = NodeConfig::single(id, dir);
    c.voters = voters.to_vec();
    c.peers = (1..=5).map(|i| (i, format!("node{i}"))).collect();
    c.checkpoint_entries = checkpoint_entries;
    c.leader_wait_ticks = 30;
    c.commit_wait_ticks = 60;
    c
}

impl Sim {
    fn new(n: u64, checkpoint_entries: u64) -> Sim {
        let root = tempfile::tempdir().unwrap();
        let mut sim = Sim {
            nodes: BTreeMap::new(),
            wire: Wire::default(),
            cut: HashSet::new(),
            mute_raft: HashSet::new(),
            hold: None,
            held: Vec::new(),
            release_before: None,
            mute_after_release: None,
            pending: Vec::new(),
            ok: Vec::new(),
            failed: 0,
            refused: Vec::new(),
            checkpoint_entries,
            _root: root,
        };
        let voters: Vec<u64> = (1..=n).collect();
        for id in 1..=n {
            sim.add(id, &voters);
        }
        sim
    }

    fn add(&mut self, id: u64, voters: &[u64]) {
        let dir = self._root.path().join(format!("n{id}"));
        let sm = Recorder::new();
        let mut node = SimNode {
            driver: None,
            sm,
            dir,
            metrics: Arc::default(),
        };
        self.boot(&mut node, id, voters);
        self.nodes.insert(id, node);
    }

    fn boot(&self, node: &mut SimNode, id: u64, voters: &[u64]) {
        let config = node_config(id, node.dir.clone(), voters, self.checkpoint_entries);
        let sm = node.sm.clone();
        let store = LogStore::open(
            &config.dir,
            config.wal_segment_bytes,
            &config.voters,
            sm.applied_index(),
            sm.snapshot_point(),
        )
        .unwrap();
        let transport = Box::new(SimTransport {
            from: id,
            wire: self.wire.clone(),
        });
        let status = Arc::new(parking_lot::RwLock::new(NodeStatus::default()));
        let driver =
            Driver::new(config, store, sm, transport, node.metrics.clone(), status).unwrap();
        node.driver = Some(driver);
    }

    /// Stops a node abruptly (no checkpoint): what it fsynced survives.
    fn crash(&mut self, id: u64) {
        let node = self.nodes.get_mut(&id).unwrap();
        node.driver = None;
        node.sm = node.sm.recover();
    }

    /// Replaces node `id` by a fresh process with an empty data directory that joins (no
    /// voters of its own), as an operator does after wiping a node.
    fn wipe(&mut self, id: u64) {
        let mut node = self.nodes.remove(&id).unwrap();
        node.driver = None;
        std::fs::remove_dir_all(&node.dir).unwrap();
        node.sm = Recorder::new();
        node.metrics = Arc::default();
        self.boot(&mut node, id, &[]);
        self.nodes.insert(id, node);
    }

    fn restart(&mut self, id: u64) {
        let mut node = self.nodes.remove(&id).unwrap();
        self.boot(&mut node, id, &[]);
        self.nodes.insert(id, node);
    }

    fn driver(&mut self, id: u64) -> &mut Driver<Recorder> {
        self.nodes.get_mut(&id).unwrap().driver.as_mut().unwrap()
    }

    fn isolate(&mut self, id: u64) {
        for other in self.nodes.keys().copied().collect::<Vec<_>>() {
            if other != id {
                self.cut.insert((id, other));
                self.cut.insert((other, id));
            }
        }
    }

    fn heal(&mut self) {
        self.cut.clear();
    }

    /// Delivers frames until the wire is quiet (bounded).
    fn deliver(&mut self) {
        for _ in 0..100_000 {
            let Some((from, to, env)) = self.wire.lock().unwrap().pop_front() else {
                return;
            };
            if self.hold.as_ref().is_some_and(|f| f(from, to, &env)) {
                self.held.push((from, to, env));
                continue;
            }
            if !self.held.is_empty()
                && self
                    .release_before
                    .as_ref()
                    .is_some_and(|f| f(from, to, &env))
            {
                self.release_before = None;
                self.mute_raft.extend(self.mute_after_release.take());
                for (_, late_to, late) in std::mem::take(&mut self.held) {
                    if let Some(Some(d)) = self.nodes.get_mut(&late_to).map(|n| n.driver.as_mut()) {
                        d.receive(Inbound::Envelope(late));
                        d.step();
                    }
                }
            }
            if self.cut.contains(&(from, to)) {
                continue;
            }
            if self.mute_raft.contains(&from)
                && matches!(env.body, Some(crate::transport::Body::Raft(_)))
            {
                continue;
            }
            let Some(Some(d)) = self.nodes.get_mut(&to).map(|n| n.driver.as_mut()) else {
                continue;
            };
            d.receive(Inbound::Envelope(env));
            d.step();
        }
        panic!("the simulated network never went quiet");
    }

    /// One tick on every running node, then delivery; collects answers.
    fn round(&mut self) {
        for node in self.nodes.values_mut() {
            if let Some(d) = node.driver.as_mut() {
                d.tick();
                d.step();
            }
        }
        self.deliver();
        self.collect();
    }

    fn rounds(&mut self, n: usize) {
        for _ in 0..n {
            self.round();
        }
    }

    fn collect(&mut self) {
        let mut still = Vec::new();
        for (cmd, mut rx) in std::mem::take(&mut self.pending) {
            match rx.try_recv() {
                Ok(Ok((_, echoed))) => {
                    assert_eq!(echoed, cmd, "a proposer got another command's response");
                    self.ok.push(cmd);
                }
                Ok(Err(e)) => {
                    self.failed += 1;
                    if !matches!(e, ProposeError::Unknown(_)) {
                        self.refused.push(cmd);
                    }
                }
                Err(oneshot::error::TryRecvError::Empty) => still.push((cmd, rx)),
                Err(e) => panic!("a reply was dropped unanswered: {e}"),
            }
        }
        self.pending = still;
    }

    fn propose(&mut self, on: u64, cmd: &str) {
        let (reply, rx) = oneshot::channel();
        let d = self.driver(on);
        d.request(Request::Propose {
            command: cmd.as_bytes().to_vec(),
            reply,
            sent: std::time::Instant::now(),
        });
        d.step();
        self.pending.push((cmd.as_bytes().to_vec(), rx));
    }

    fn leader(&self) -> Option<u64> {
        let leaders: Vec<u64> = self
            .nodes
            .iter()
            .filter_map(|(id, n)| {
                let d = n.driver.as_ref()?;
                (d.status_role() == "leader" && !self.isolated(*id)).then_some(*id)
            })
            .collect();
        (leaders.len() == 1).then(|| leaders[0])
    }

    fn isolated(&self, id: u64) -> bool {
        self.nodes
            .keys()
            .filter(|o| **o != id)
            .all(|o| self.cut.contains(&(id, *o)))
    }

    fn elect(&mut self) -> u64 {
        for _ in 0..500 {
            self.round();
            if let Some(l) = self.leader() {
                return l;
            }
        }
        let states: Vec<_> = self
            .nodes
            .values()
            .filter_map(|n| n.driver.as_ref().map(|d| d.status_snapshot()))
            .collect();
        panic!("no leader elected in 500 ticks: {states:#?}");
    }

    /// Runs until every pending proposal is answered (bounded).
    fn settle(&mut self) {
        for _ in 0..500 {
            if self.pending.is_empty() {
                break;
            }
            self.round();
        }
        assert!(self.pending.is_empty(), "proposals still unanswered");
        // let followers catch up with the last commit
        self.rounds(20);
    }

    /// The safety checks: identical histories, no duplicates, every `Ok` present.
    fn check(&self, ids: &[u64]) -> Vec<(u64, Vec<u8>)> {
        let first = self.nodes[&ids[0]].sm.memory();
        for id in ids {
            assert_eq!(
                self.nodes[id].sm.memory(),
                first,
                "node {id} applied a different history than node {}",
                ids[0]
            );
        }
        let set: BTreeSet<&Vec<u8>> = first.iter().map(|(_, c)| c).collect();
        assert_eq!(set.len(), first.len(), "a command was applied twice");
        for cmd in &self.ok {
            assert!(
                set.contains(cmd),
                "acknowledged {:?} is missing",
                String::from_utf8_lossy(cmd)
            );
        }
        for cmd in &self.refused {
            assert!(
                !set.contains(cmd),
                "{:?} was answered as certainly not applied, yet it is in the log",
                String::from_utf8_lossy(cmd)
            );
        }
        first
    }
}

impl<SM: StateMachine> Driver<SM> {
    fn status_role(&self) -> String {
        self.status_snapshot().role
    }
}

#[test]
fn election_then_writes_on_any_node_reach_every_node() {
    let mut sim = Sim::new(3, 1000);
    let leader = sim.elect();
    for i in 0..30 {
        sim.propose(1 + i % 3, &format!("w{i}"));
    }
    sim.settle();
    assert_eq!(
        sim.ok.len(),
        30,
        "every write on a healthy cluster succeeds"
    );
    let history = sim.check(&[1, 2, 3]);
    assert_eq!(history.len(), 30);
    assert!(leader >= 1);
}

#[test]
fn leader_change_with_pending_proposals_never_acknowledges_a_lost_write() {
    let mut sim = Sim::new(3, 1000);
    for round in 0..3 {
        let old = sim.elect();
        // Proposals reach the old leader's log, then it is cut off before replicating them.
        for i in 0..5 {
            sim.propose(old, &format!("r{round}-old{i}"));
        }
        sim.isolate(old);
        // Followers also take writes while the election runs; they wait for the new leader.
        let others: Vec<u64> = (1..=3).filter(|i| *i != old).collect();
        for i in 0..5 {
            sim.propose(others[i % 2], &format!("r{round}-new{i}"));
        }
        let new = sim.elect();
        assert_ne!(new, old);
        sim.rounds(80); // beyond the old leader's commit wait
        sim.heal();
        sim.settle();
    }
    let history = sim.check(&[1, 2, 3]);
    assert!(
        sim.failed > 0,
        "the cut-off leader's writes must not be acknowledged"
    );
    assert!(
        sim.ok
            .iter()
            .all(|c| !String::from_utf8_lossy(c).contains("old")),
        "no write placed only on a cut-off leader is acknowledged"
    );
    assert!(history.len() >= sim.ok.len());
}

#[test]
fn a_diverged_log_is_overwritten_and_its_proposers_told() {
    let mut sim = Sim::new(3, 1000);
    let old = sim.elect();
    sim.propose(old, "committed");
    sim.settle();
    // The old leader appends entries nobody else gets.
    sim.isolate(old);
    for i in 0..10 {
        sim.propose(old, &format!("diverged{i}"));
    }
    let new = sim.elect();
    for i in 0..10 {
        sim.propose(new, &format!("winner{i}"));
    }
    sim.rounds(30);
    sim.heal();
    sim.settle();
    let history = sim.check(&[1, 2, 3]);
    let cmds: Vec<String> = history
        .iter()
        .map(|(_, c)| String::from_utf8_lossy(c).into_owned())
        .collect();
    assert!(cmds.iter().all(|c| !c.starts_with("diverged")), "{cmds:?}");
    assert_eq!(cmds.iter().filter(|c| c.starts_with("winner")).count(), 10);
    assert_eq!(sim.failed, 10, "each diverged proposer hears a failure");
}

#[test]
fn a_follower_behind_the_compaction_point_catches_up_with_a_snapshot() {
    let mut sim = Sim::new(3, 20);
    let leader = sim.elect();
    let lagging = if leader == 3 { 2 } else { 3 };
    sim.isolate(lagging);
    for i in 0..200 {
        sim.propose(leader, &format!("s{i}"));
        if i % 10 == 0 {
            sim.round();
        }
    }
    sim.settle();
    assert_eq!(sim.ok.len(), 200);
    sim.heal();
    sim.rounds(50);
    sim.check(&[1, 2, 3]);
    let installed = Metrics::get(&sim.nodes[&lagging].metrics.snapshots_installed);
    assert!(installed >= 1, "the lagging node installed a snapshot");
    // And it keeps up with new writes afterwards.
    sim.propose(lagging, "after");
    sim.settle();
    assert_eq!(sim.check(&[1, 2, 3]).last().unwrap().1, b"after".to_vec());
}

#[test]
fn restarted_nodes_recover_and_catch_up() {
    let mut sim = Sim::new(3, 25);
    let leader = sim.elect();
    let follower = if leader == 1 { 2 } else { 1 };
    for i in 0..40 {
        sim.propose(leader, &format!("a{i}"));
    }
    sim.settle();
    sim.crash(follower);
    for i in 0..40 {
        sim.propose(leader, &format!("b{i}"));
    }
    sim.settle();
    sim.restart(follower);
    sim.rounds(50);
    // the leader itself restarts too; the cluster elects again and goes on
    sim.crash(leader);
    sim.restart(leader);
    sim.elect();
    sim.propose(follower, "c");
    sim.settle();
    let h = sim.check(&[1, 2, 3]);
    assert_eq!(h.len(), 81);
}

#[test]
fn members_are_added_and_removed_while_writes_go_on() {
    let mut sim = Sim::new(3, 30);
    let leader = sim.elect();
    for i in 0..50 {
        sim.propose(leader, &format!("m{i}"));
    }
    sim.settle();
    sim.add(4, &[]);
    let (reply, mut added) = oneshot::channel();
    sim.driver(2).request(Request::ChangeMembership {
        change: membership(Membership::Add(4, "node4".into())),
        reply,
    });
    for i in 0..20 {
        sim.propose(1 + i % 3, &format!("n{i}"));
    }
    sim.settle();
    sim.rounds(30);
    assert!(matches!(added.try_recv(), Ok(Ok(()))));
    sim.check(&[1, 2, 3, 4]);
    // Remove node 1 — whether or not it leads.
    let (reply, mut removed) = oneshot::channel();
    sim.driver(4).request(Request::ChangeMembership {
        change: membership(Membership::Remove(1)),
        reply,
    });
    for _ in 0..300 {
        sim.round();
        if !matches!(removed.try_recv(), Err(oneshot::error::TryRecvError::Empty)) {
            break;
        }
    }
    sim.isolate(1);
    let new = sim.elect();
    assert_ne!(new, 1);
    for i in 0..10 {
        sim.propose(4, &format!("o{i}"));
    }
    sim.settle();
    let h = sim.check(&[2, 3, 4]);
    assert_eq!(h.iter().filter(|(_, c)| c.starts_with(b"o")).count(), 10);
}

#[test]
fn read_index_on_a_follower_waits_for_the_leaders_commit() {
    let mut sim = Sim::new(3, 1000);
    let leader = sim.elect();
    let follower = if leader == 1 { 2 } else { 1 };
    for i in 0..5 {
        sim.propose(leader, &format!("x{i}"));
    }
    sim.settle();
    let (reply, mut read) = oneshot::channel();
    sim.driver(follower).request(Request::ReadIndex { reply });
    sim.rounds(10);
    assert!(matches!(read.try_recv(), Ok(Ok(()))));
    assert_eq!(sim.nodes[&follower].sm.memory().len(), 5);
    // Without a quorum the barrier cannot be confirmed: it fails instead of reading stale.
    sim.isolate(follower);
    let (reply, mut read) = oneshot::channel();
    sim.driver(follower).request(Request::ReadIndex { reply });
    sim.rounds(200);
    assert!(matches!(read.try_recv(), Ok(Err(_))));
}

fn membership(m: Membership) -> raft::eraftpb::ConfChangeV2 {
    super::membership_change(m)
}

#[test]
fn back_to_back_membership_changes_both_apply() {
    let mut sim = Sim::new(3, 1000);
    let leader = sim.elect();
    sim.add(4, &[]);
    sim.add(5, &[]);
    // The second change arrives while the first is still unapplied: it waits its turn
    // instead of being replaced by an empty entry.
    let (reply, mut first) = oneshot::channel();
    sim.driver(leader).request(Request::ChangeMembership {
        change: membership(Membership::Add(4, "node4".into())),
        reply,
    });
    let (reply, mut second) = oneshot::channel();
    sim.driver(leader).request(Request::ChangeMembership {
        change: membership(Membership::Add(5, "node5".into())),
        reply,
    });
    sim.driver(leader).step();
    sim.rounds(40);
    assert!(matches!(first.try_recv(), Ok(Ok(()))));
    assert!(
        matches!(second.try_recv(), Ok(Ok(()))),
        "the second change was lost"
    );
    sim.propose(5, "after");
    sim.settle();
    sim.check(&[1, 2, 3, 4, 5]);
}

impl Sim {
    /// Asks node `on` for a membership change and runs until it is answered (bounded).
    fn change(&mut self, on: u64, m: Membership) -> std::result::Result<(), ProposeError> {
        let (reply, mut rx) = oneshot::channel();
        self.driver(on).request(Request::ChangeMembership {
            change: membership(m),
            reply,
        });
        for _ in 0..300 {
            self.round();
            match rx.try_recv() {
                Ok(r) => return r,
                Err(oneshot::error::TryRecvError::Empty) => {}
                Err(e) => panic!("membership change dropped unanswered: {e}"),
            }
        }
        panic!("membership change not answered in 300 ticks");
    }

    fn status(&self, id: u64) -> NodeStatus {
        self.nodes[&id].driver.as_ref().unwrap().status_snapshot()
    }

    /// Runs until every node of `ids` lists exactly `voters` as voters (bounded).
    fn wait_voters(&mut self, ids: &[u64], voters: &[u64]) {
        for _ in 0..300 {
            let all = ids.iter().all(|id| {
                let mut v: Vec<u64> = self
                    .status(*id)
                    .peers
                    .iter()
                    .filter(|p| p.voter)
                    .map(|p| p.id)
                    .collect();
                v.sort();
                v == voters
            });
            if all {
                return;
            }
            self.round();
        }
        let seen: Vec<_> = ids.iter().map(|id| (id, self.status(*id).peers)).collect();
        panic!("voters never became {voters:?}: {seen:#?}");
    }
}

/// Issue 19, case 1: a node added to a young cluster (whose log still starts at index 1) was
/// replayed the log from its first entry, applied `AddNode 4` to an empty configuration and
/// became the only voter of its own cluster: cut off from the others it elected itself and
/// acknowledged writes nobody else had.
#[test]
fn a_node_added_to_a_young_cluster_never_leads_alone() {
    let mut sim = Sim::new(3, 1000);
    let leader = sim.elect();
    for i in 0..5 {
        sim.propose(leader, &format!("a{i}"));
    }
    sim.settle();
    sim.add(4, &[]);
    sim.change(leader, Membership::Add(4, "node4".into()))
        .unwrap();
    sim.wait_voters(&[1, 2, 3, 4], &[1, 2, 3, 4]);
    sim.settle();
    sim.check(&[1, 2, 3, 4]);
    // Node 4 alone: it must not win an election, nor acknowledge a write.
    sim.isolate(4);
    sim.propose(4, "split-brain");
    for _ in 0..200 {
        sim.round();
        assert_ne!(sim.status(4).role, "leader", "node 4 elected itself alone");
    }
    sim.heal();
    sim.settle();
    sim.check(&[1, 2, 3, 4]);
}

/// Issue 19, case 2: remove a node, wipe it, add it back — ten times on one id, then with
/// fresh ids. The re-added node used to be replayed the log from index 1, reach "remove 3"
/// with an empty configuration and poison itself ("removed all voters"); a following removal
/// of another node then left no quorum.
#[test]
fn remove_wipe_and_re_add_converges_every_time() {
    let mut sim = Sim::new(3, 1000);
    let mut writes = 0;
    let mut write = |sim: &mut Sim, on: u64| {
        for _ in 0..3 {
            sim.propose(on, &format!("w{writes}"));
            writes += 1;
        }
    };
    sim.elect();
    for round in 0..10 {
        let leader = sim.elect();
        let victim = if leader == 3 { 2 } else { 3 };
        write(&mut sim, leader);
        sim.change(leader, Membership::Remove(victim)).unwrap();
        let rest: Vec<u64> = [1, 2, 3].into_iter().filter(|i| *i != victim).collect();
        sim.wait_voters(&rest, &rest);
        sim.wipe(victim);
        write(&mut sim, rest[0]);
        sim.change(rest[1], Membership::Add(victim, format!("node{victim}")))
            .unwrap();
        sim.wait_voters(&[1, 2, 3], &[1, 2, 3]);
        sim.settle();
        assert_eq!(
            sim.status(victim).poisoned,
            None,
            "round {round}: the re-added node poisoned itself"
        );
        sim.check(&[1, 2, 3]);
    }
    // Fresh ids: 4 joins, 1 leaves, 5 joins, 2 leaves.
    for (new, old) in [(4, 1), (5, 2)] {
        let leader = sim.elect();
        sim.add(new, &[]);
        sim.change(leader, Membership::Add(new, format!("node{new}")))
            .unwrap();
        let all: Vec<u64> = sim.nodes.keys().copied().collect();
        sim.wait_voters(&all, &all);
        let via = *all.iter().find(|i| **i != old).unwrap();
        sim.change(via, Membership::Remove(old)).unwrap();
        sim.crash(old);
        sim.nodes.remove(&old);
        let rest: Vec<u64> = sim.nodes.keys().copied().collect();
        sim.wait_voters(&rest, &rest);
        write(&mut sim, rest[0]);
        sim.settle();
        sim.check(&rest);
    }
    assert_eq!(sim.failed, 0, "every write on a healthy cluster succeeds");
    assert_eq!(sim.ok.len(), writes);
}

/// Issue 19, case 3: a write a follower forwarded to a leader that then died waited out the
/// whole commit wait and failed `Unknown`, though it certainly never committed. Now it is sent
/// again to the new leader once an entry of the new term is applied.
#[test]
fn a_write_forwarded_to_a_dying_leader_is_sent_to_the_next_one() {
    let mut sim = Sim::new(3, 1000);
    let old = sim.elect();
    let follower = (1..=3).find(|i| *i != old).unwrap();
    // The forward never reaches the leader: it dies with the frame on the wire.
    sim.propose(follower, "lost-forward");
    sim.crash(old);
    let answered_within = |sim: &mut Sim| {
        for _ in 0..50 {
            sim.round();
            if sim.pending.is_empty() {
                return true;
            }
        }
        false
    };
    // Answered well within the commit wait (60 ticks), and not as a failure.
    assert!(
        answered_within(&mut sim),
        "the write still waits after 50 ticks"
    );
    assert_eq!(
        sim.failed, 0,
        "a write that certainly did not commit was failed"
    );
    // The forward reaches the leader, which places it but never replicates it, and dies.
    let new = sim.elect();
    let other = (1..=3).find(|i| *i != new && *i != old).unwrap();
    sim.propose(other, "placed-not-replicated");
    sim.mute_raft.insert(new);
    sim.round();
    sim.crash(new);
    sim.mute_raft.clear();
    sim.restart(old);
    assert!(
        answered_within(&mut sim),
        "the write still waits after 50 ticks"
    );
    assert_eq!(
        sim.failed, 0,
        "a write that certainly did not commit was failed"
    );
    sim.restart(new);
    sim.settle();
    let h = sim.check(&[1, 2, 3]);
    for cmd in [b"lost-forward".as_slice(), b"placed-not-replicated"] {
        assert_eq!(h.iter().filter(|(_, c)| c == cmd).count(), 1);
    }
}

fn is_forward(env: &Envelope) -> bool {
    matches!(env.body, Some(crate::transport::Body::Forward(_)))
}

fn is_forward_reply(env: &Envelope) -> bool {
    matches!(env.body, Some(crate::transport::Body::ForwardReply(_)))
}

/// Round 87 of the seed-7 chaos run: a forward refused by a leader that had just lost
/// leadership arrived after the write was sent again to the new leader; the stale refusal sent
/// the write back to parked, the new leader's acceptance was ignored, and the write was
/// placed a second time.
#[test]
fn a_late_refusal_of_an_earlier_sending_does_not_send_a_write_twice() {
    let mut sim = Sim::new(3, 1000);
    let old = sim.elect();
    let f = (1..=3).find(|i| *i != old).unwrap();
    let o = (1..=3).find(|i| *i != old && *i != f).unwrap();
    // The forward to the old leader is slow on the wire.
    sim.hold = Some(Box::new(move |from, to, env| {
        from == f && to == old && is_forward(env)
    }));
    sim.propose(f, "x");
    sim.deliver();
    assert_eq!(sim.held.len(), 1);
    sim.hold = None;
    // Another node takes over; the slow forward reaches the old leader (which refuses it:
    // wrong term) just as `f` sends the write again, to the new leader.
    sim.release_before = Some(Box::new(move |from, to, env| {
        from == f && to == o && is_forward(env)
    }));
    // The new leader's replication is slow from then on: `f` ticks before it applies `x`.
    sim.mute_after_release = Some(o);
    sim.driver(o).force_campaign();
    sim.driver(o).step();
    sim.deliver();
    assert!(sim.held.is_empty(), "the write was never sent again");
    sim.rounds(3);
    sim.mute_raft.clear();
    sim.settle();
    let h = sim.check(&[1, 2, 3]);
    assert_eq!(h.iter().filter(|(_, c)| c == b"x").count(), 1);
    assert_eq!(sim.ok, vec![b"x".to_vec()]);
}

/// The same race with an acceptance: a leader placed a forwarded write, lost leadership before
/// replicating it, and its acceptance arrived after the write was sent again. The stale
/// placement made the next write the new leader put at that index look like it overwrote
/// this one, so the write was answered `Dropped` (40001) while the new leader committed it.
#[test]
fn a_late_acceptance_of_an_earlier_sending_never_fails_a_committed_write() {
    let mut sim = Sim::new(3, 1000);
    let old = sim.elect();
    let f = (1..=3).find(|i| *i != old).unwrap();
    let o = (1..=3).find(|i| *i != old && *i != f).unwrap();
    // The old leader replicates nothing more: `a` (its own) and then `x` stay in its log only.
    sim.mute_raft.insert(old);
    sim.propose(old, "a");
    // `y`'s forward is lost on the way, `x`'s acceptance is slow.
    sim.hold = Some(Box::new(move |from, to, env| {
        from == f && to == old && is_forward(env)
    }));
    sim.propose(f, "y");
    sim.deliver();
    assert_eq!(sim.held.len(), 1);
    sim.held.clear();
    sim.hold = Some(Box::new(move |from, to, env| {
        from == old && to == f && is_forward_reply(env)
    }));
    sim.propose(f, "x");
    sim.deliver();
    assert_eq!(sim.held.len(), 1);
    sim.hold = None;
    // The old leader is cut off; `o` takes over, and `f` sends `y` and `x` to it again. The
    // old leader's acceptance of `x` arrives just then.
    sim.isolate(old);
    sim.mute_raft.clear();
    sim.release_before = Some(Box::new(move |from, to, env| {
        from == f && to == o && is_forward(env)
    }));
    sim.driver(o).force_campaign();
    sim.driver(o).step();
    sim.settle();
    assert!(sim.held.is_empty(), "the writes were never sent again");
    sim.heal();
    sim.settle();
    let h = sim.check(&[1, 2, 3]);
    for cmd in [b"x".as_slice(), b"y"] {
        assert_eq!(h.iter().filter(|(_, c)| c == cmd).count(), 1);
    }
}

fn raft_type(env: &Envelope) -> Option<raft::eraftpb::MessageType> {
    use protobuf::Message as _;
    match &env.body {
        Some(crate::transport::Body::Raft(bytes)) => {
            raft::eraftpb::Message::parse_from_bytes(bytes)
                .ok()
                .map(|m| m.get_msg_type())
        }
        _ => None,
    }
}

/// A linearizable read on a follower that catches up by snapshot: its barrier went to the
/// leader, and the snapshot arrived before the leader's answer. A barrier is no log entry
/// (no snapshot holds it), yet the install failed it as "applied through a snapshot; its
/// response is not known here" (40003), and the read failed (seen in the cluster suite's
/// lagging-node test).
#[test]
fn a_read_barrier_in_flight_survives_a_snapshot_install() {
    use raft::eraftpb::MessageType;
    let mut sim = Sim::new(3, 20);
    let leader = sim.elect();
    let lagging = if leader == 3 { 2 } else { 3 };
    sim.isolate(lagging);
    for i in 0..100 {
        sim.propose(leader, &format!("s{i}"));
        if i % 10 == 0 {
            sim.round();
        }
    }
    sim.settle();
    // back on the network, the snapshot and the read's answer are slow on the wire
    sim.hold = Some(Box::new(move |from, to, env| {
        from == leader
            && to == lagging
            && matches!(
                raft_type(env),
                Some(MessageType::MsgSnapshot | MessageType::MsgReadIndexResp)
            )
    }));
    sim.heal();
    sim.rounds(5);
    let (reply, mut read) = oneshot::channel();
    sim.driver(lagging).request(Request::ReadIndex { reply });
    sim.driver(lagging).step();
    sim.rounds(2);
    let held: Vec<_> = sim
        .held
        .iter()
        .filter_map(|(_, _, e)| raft_type(e))
        .collect();
    assert!(held.contains(&MessageType::MsgSnapshot), "{held:?}");
    assert!(held.contains(&MessageType::MsgReadIndexResp), "{held:?}");
    // the snapshot lands first, then the leader's answer to the read
    sim.hold = None;
    let mut held = std::mem::take(&mut sim.held);
    held.sort_by_key(|(_, _, e)| raft_type(e) != Some(MessageType::MsgSnapshot));
    for (_, _, env) in held {
        let d = sim.driver(lagging);
        d.receive(Inbound::Envelope(env));
        d.step();
    }
    sim.rounds(20);
    assert!(
        matches!(read.try_recv(), Ok(Ok(()))),
        "the read barrier is answered, not failed by the snapshot"
    );
    assert_eq!(sim.nodes[&lagging].sm.memory().len(), 100);
    assert!(Metrics::get(&sim.nodes[&lagging].metrics.snapshots_installed) >= 1);
}
