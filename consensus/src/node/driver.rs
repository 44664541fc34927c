//! The node task: owns the `RawNode`, the [`LogStore`] inside it, the state machine and the
//! transport, and runs raft-rs's Ready loop in exactly this order (see `docs/architecture.md`):
//! send `messages` → install snapshot → apply `committed_entries` → append `entries` +
//! HardState (one fsync if `must_sync`) → send `persisted_messages` → `advance` → LightReady
//! (send messages, apply committed entries, then write the commit index) → `advance_apply` →
//! maybe checkpoint → maybe build a snapshot a follower asked for.
//!
//! Every request (proposal, membership change, read barrier) gets a *tag*, unique on this node,
//! and a waiter keyed by it. A proposal is put in the log with `(node id, tag)` as the entry
//! context — by this node if it leads, otherwise by the leader it is forwarded to — and its
//! waiter is answered when *this* node applies the entry carrying that context, with this
//! node's own state-machine response (every replica computes the same one). Once the leader
//! reports the entry's (index, term), an entry applied at that index with another context means
//! the proposal was overwritten (`Dropped`). Requests made while no leader is known wait,
//! *parked*, for at most `leader_wait_ticks`; a sent request that is never applied is answered
//! `Unknown` after `commit_wait_ticks`. Time is counted in ticks, so scripted tests drive it.
//! (One exception that decides nothing: a single voter serving one client at a time polls its
//! queue for a moment before it parks, see [`crate::spin`].)
//!
//! Once anything non-deterministic fails (WAL write or fsync, state machine apply, checkpoint or
//! snapshot) the node is poisoned for good: it fails every waiter and every later request with
//! `Failed` and never acknowledges anything again, because after a failed fsync nobody knows
//! what is on disk (fsyncgate).

use std::collections::{BTreeMap, HashMap};
use std::mem;
use std::sync::Arc;
use std::time::Instant;

use parking_lot::RwLock;
use prost::Message as _;
use protobuf::Message as _;
use raft::eraftpb::{
    ConfChange, ConfChangeType, ConfChangeV2, Entry, EntryType, Message, MessageType, Snapshot,
};
use raft::{RawNode, SnapshotStatus, StateRole};
use tokio::sync::{mpsc, oneshot, watch};
use tokio::time::MissedTickBehavior;

use super::{NodeConfig, NodeStatus, PeerStatus, ProposeError, StateMachine};
use crate::error::{Error, Result};
use crate::log_store::LogStore;
use crate::logging;
use crate::metrics::Metrics;
use crate::spin;
use crate::transport::{Body, Envelope, Forward, ForwardReply, Inbound, Transport};

type Outcome<R> = std::result::Result<R, ProposeError>;

/// What a request asks of the node.
pub(crate) enum Request<R> {
    /// Put a state-machine command in the log; answered with its response once applied here.
    Propose {
        command: Vec<u8>,
        reply: oneshot::Sender<Outcome<R>>,
        /// When the requester sent it: its commit time counts its wait in the queue too.
        sent: std::time::Instant,
    },
    /// Change membership (a protobuf `ConfChangeV2`); answered once applied here.
    ChangeMembership {
        change: ConfChangeV2,
        reply: oneshot::Sender<Outcome<()>>,
    },
    /// A linearizable read barrier: answered once this node has applied everything committed
    /// when the leader confirmed the request.
    ReadIndex { reply: oneshot::Sender<Outcome<()>> },
    /// If this node leads, hand leadership to the most up-to-date other voter (before a
    /// clean shutdown). Answered at once.
    StepDown { reply: oneshot::Sender<Outcome<()>> },
    /// Checkpoint the state machine now (and compact the log); answered at once with the
    /// index the checkpoint covers. Local: other members are not asked.
    Checkpoint {
        reply: oneshot::Sender<Outcome<u64>>,
    },
}

/// The payload a waiter still has to place in the log (kept until a leader accepts it).
enum Payload {
    Command(Vec<u8>),
    Conf(ConfChangeV2),
    Read,
}

enum WaitReply<R> {
    Command(oneshot::Sender<Outcome<R>>),
    Unit(oneshot::Sender<Outcome<()>>),
}

impl<R> WaitReply<R> {
    fn fail(self, err: ProposeError) {
        // The requester may have given up waiting; nothing to do then.
        match self {
            WaitReply::Command(r) => drop(r.send(Err(err))),
            WaitReply::Unit(r) => drop(r.send(Err(err))),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    /// No leader known (or the leader refused it): waiting to be sent.
    Parked,
    /// Sent to the leader of `term`, no answer yet (it may or may not be in the log). A
    /// leader places a forwarded request only in the term it was sent for.
    Sent { term: u64 },
    /// In the log at this (index, term).
    Placed { index: u64, term: u64 },
    /// A read barrier the leader confirmed at this commit index.
    ReadAt(u64),
}

struct Waiter<R> {
    /// What still has to be placed; a forwarded request keeps it until it is applied, so it
    /// can be sent again if its leader certainly did not commit it.
    payload: Option<Payload>,
    reply: WaitReply<R>,
    state: State,
    /// Tick after which the waiter is answered (`Dropped` if parked, `Unknown` otherwise).
    deadline: u64,
    /// Times the request went back to parked after a leader certainly lost it.
    resent: u32,
    /// Times it was forwarded to a leader: a reply counts only if it answers the latest.
    attempt: u32,
    /// When the request was sent (a proposal) or taken by the node task (the rest).
    since: std::time::Instant,
}

/// Most times a request is sent again after its leader certainly lost it.
const MAX_RESENDS: u32 = 5;

/// A learner is promoted to voter once it is at most this many entries behind the leader.
const PROMOTE_LAG: u64 = 64;

/// An answer ready to send once the status is published.
type Answer<R> = (WaitReply<R>, Option<R>);

/// Encodes the entry context that identifies a request: `(node id, tag)`.
fn context(node: u64, tag: u64) -> Vec<u8> {
    let mut c = Vec::with_capacity(16);
    c.extend(node.to_be_bytes());
    c.extend(tag.to_be_bytes());
    c
}

fn parse_context(c: &[u8]) -> Option<(u64, u64)> {
    let node = u64::from_be_bytes(c.get(..8)?.try_into().ok()?);
    let tag = u64::from_be_bytes(c.get(8..16)?.try_into().ok()?);
    Some((node, tag))
}

/// What travels in a Raft snapshot: the address book and the state machine's snapshot.
#[derive(Clone, PartialEq, prost::Message)]
struct SnapshotData {
    #[prost(btree_map = "uint64, string", tag = "1")]
    peers: BTreeMap<u64, String>,
    #[prost(bytes = "vec", tag = "2")]
    state: Vec<u8>,
}

pub(crate) struct Driver<SM: StateMachine> {
    raw: RawNode<LogStore>,
    sm: SM,
    config: NodeConfig,
    transport: Box<dyn Transport>,
    /// Raft address of every member (and of members being added).
    peers: BTreeMap<u64, String>,
    waiters: BTreeMap<u64, Waiter<SM::Response>>,
    /// Tags of placed proposals by log index, to detect overwritten entries.
    by_index: BTreeMap<u64, u64>,
    next_tag: u64,
    ticks: u64,
    /// Tick at which each peer was last heard from.
    last_contact: HashMap<u64, u64>,
    metrics: Arc<Metrics>,
    status: Arc<RwLock<NodeStatus>>,
    applied: u64,
    /// Term of the last entry applied: once an entry of a newer term is applied, a request
    /// placed (or sent) in an older term and not yet applied was certainly not committed.
    applied_term: u64,
    since_checkpoint: u64,
    /// Bytes of entries applied since the last checkpoint (the log holds them in memory
    /// until it is compacted).
    since_checkpoint_bytes: u64,
    /// Checkpoint (and compact the log) at the end of this Ready: a node was added, and it
    /// must be caught up from a snapshot, which carries the configuration, never from the
    /// log's first entry (the bootstrap configuration is not in the log).
    checkpoint_due: bool,
    /// A checkpoint whose I/O runs off this thread ([`StateMachine::start_checkpoint`]): the
    /// applied index it covers and the time this thread spent starting it.
    checkpoint_running: Option<(u64, std::time::Duration)>,
    /// Requests went back to parked while a Ready was being processed; they are sent once
    /// it is done.
    requeued: bool,
    poisoned: Option<String>,
    leader_seen: u64,
}

impl<SM: StateMachine> Driver<SM> {
    pub(crate) fn new(
        config: NodeConfig,
        store: LogStore,
        sm: SM,
        transport: Box<dyn Transport>,
        metrics: Arc<Metrics>,
        status: Arc<RwLock<NodeStatus>>,
    ) -> Result<Self> {
        let applied = sm.applied_index();
        let raft_config = config.raft_config(applied);
        raft_config.validate()?;
        let mut raw = RawNode::new(&raft_config, store, &logging::raft_logger(config.id))?;
        let conf = raw.raft.prs().conf().to_conf_state();
        if conf.voters == [config.id] && conf.learners.is_empty() {
            raw.campaign()?;
        }
        let mut peers = super::load_peers(&config.dir)?;
        peers.extend(config.peers.clone());
        let mut driver = Driver {
            raw,
            sm,
            transport,
            peers,
            config,
            waiters: BTreeMap::new(),
            by_index: BTreeMap::new(),
            next_tag: 1,
            ticks: 0,
            last_contact: HashMap::new(),
            metrics,
            status,
            applied,
            applied_term: 0,
            since_checkpoint: 0,
            since_checkpoint_bytes: 0,
            checkpoint_due: false,
            checkpoint_running: None,
            requeued: false,
            poisoned: None,
            leader_seen: 0,
        };
        driver.transport.set_peers(&driver.peers);
        driver.publish_status();
        Ok(driver)
    }

    /// The status as last published.
    #[cfg(test)]
    pub(crate) fn status_snapshot(&self) -> NodeStatus {
        self.status.read().clone()
    }

    /// Starts an election at once, as a leadership transfer does (no pre-vote, no lease).
    #[cfg(test)]
    pub(crate) fn force_campaign(&mut self) {
        self.raw.raft.campaign(raft::CAMPAIGN_TRANSFER);
    }

    /// The node loop. Returns after a stop request, or when every handle is gone.
    pub(crate) async fn run(
        mut self,
        mut queue: mpsc::Receiver<Request<SM::Response>>,
        mut inbound: mpsc::Receiver<Inbound>,
        mut stop: watch::Receiver<bool>,
    ) {
        let mut ticker = tokio::time::interval(self.config.tick_interval);
        ticker.set_missed_tick_behavior(MissedTickBehavior::Delay);
        self.step();
        // A single node has no transport: its inbox closes at once and is not polled again.
        let mut inbox_open = true;
        let mut batches = spin::BatchAverage::new();
        loop {
            let mut proposals = false;
            // Biased: a stop request wins, and ticks (at most one per interval) cannot be
            // starved by a constant stream of proposals or messages.
            tokio::select! {
                biased;
                _ = stop.changed() => break,
                _ = ticker.tick() => self.tick(),
                msg = inbound.recv(), if inbox_open => {
                    let Some(msg) = msg else {
                        inbox_open = false;
                        continue;
                    };
                    self.receive(msg);
                    for _ in 1..self.config.max_batch {
                        match inbound.try_recv() {
                            Ok(next) => self.receive(next),
                            Err(_) => break,
                        }
                    }
                }
                first = queue.recv() => {
                    let Some(first) = first else { break };
                    self.request_batch(first, &mut queue, &mut batches);
                    proposals = true;
                }
            }
            self.step();
            spin::round_done(!inbox_open);
            if proposals && !inbox_open {
                self.spin_for_proposals(&mut queue, &mut batches);
            }
        }
        self.finish(queue);
    }

    /// Takes `first` and every request queued behind it (up to `max_batch`) into this round.
    fn request_batch(
        &mut self,
        first: Request<SM::Response>,
        queue: &mut mpsc::Receiver<Request<SM::Response>>,
        batches: &mut spin::BatchAverage,
    ) {
        self.request(first);
        let mut n = 1;
        while n < self.config.max_batch {
            match queue.try_recv() {
                Ok(next) => self.request(next),
                Err(_) => break,
            }
            n += 1;
        }
        batches.record(n);
    }

    /// A single voter whose batches are single proposals (one client at a time) polls its
    /// queue for up to the spin budget before it parks, and takes what arrives as the next
    /// round (see [`crate::spin`]). A streak of such rounds ends after half a tick, so ticks
    /// and a stop request are never held back by more than that.
    fn spin_for_proposals(
        &mut self,
        queue: &mut mpsc::Receiver<Request<SM::Response>>,
        batches: &mut spin::BatchAverage,
    ) {
        let budget = spin::budget();
        if budget.is_zero() {
            return;
        }
        let streak = Instant::now();
        let mut since = streak;
        while batches.single()
            && since.elapsed() < budget
            && streak.elapsed() < self.config.tick_interval / 2
        {
            match queue.try_recv() {
                Ok(first) => {
                    self.request_batch(first, queue, batches);
                    self.step();
                    spin::round_done(true);
                    since = Instant::now();
                }
                Err(mpsc::error::TryRecvError::Empty) => std::hint::spin_loop(),
                // the select sees a closed queue and stops
                Err(mpsc::error::TryRecvError::Disconnected) => return,
            }
        }
    }

    /// Gives up before running (the runtime could not be built).
    pub(crate) fn abandon(mut self, reason: String) {
        self.poison(Error::Config(reason));
    }

    /// One tick of logical time: Raft's clock, request deadlines, retries of parked requests.
    pub(crate) fn tick(&mut self) {
        if self.poisoned.is_some() {
            return;
        }
        self.raw.tick();
        self.ticks += 1;
        let now = self.ticks;
        let expired: Vec<u64> = self
            .waiters
            .iter()
            .filter(|(_, w)| w.deadline <= now)
            .map(|(t, _)| *t)
            .collect();
        for tag in expired {
            if let Some(w) = self.waiters.remove(&tag) {
                let err = match w.state {
                    State::Parked => ProposeError::Dropped(format!(
                        "no leader accepted the request within {} ticks (node {}, leader {})",
                        self.config.leader_wait_ticks, self.config.id, self.raw.raft.leader_id
                    )),
                    State::Sent { .. } | State::Placed { .. } | State::ReadAt(_) => {
                        ProposeError::Unknown(format!(
                            "not applied within {} ticks of reaching the leader",
                            self.config.commit_wait_ticks
                        ))
                    }
                };
                if let State::Placed { index, .. } = w.state {
                    self.by_index.remove(&index);
                }
                w.reply.fail(err);
            }
        }
        self.dispatch_parked();
        self.promote_caught_up_learner();
    }

    /// On the leader: a learner (every added node starts as one) that has caught up becomes
    /// a voter, one change at a time. A node that never catches up (a dead address, a wrong
    /// id) stays a learner and costs the quorum nothing.
    fn promote_caught_up_learner(&mut self) {
        let raft = &self.raw.raft;
        if raft.state != StateRole::Leader || raft.has_pending_conf() {
            return;
        }
        let last = raft.raft_log.last_index();
        let ready = raft.prs().conf().learners().iter().copied().find(|id| {
            raft.prs()
                .get(*id)
                .is_some_and(|p| p.recent_active && p.matched + PROMOTE_LAG >= last)
                && self.peers.contains_key(id)
        });
        let Some(id) = ready else { return };
        let change = super::conf_change(ConfChangeType::AddNode, id, self.peers[&id].clone());
        tracing::info!(
            id = self.config.id,
            learner = id,
            "promoting a caught-up learner"
        );
        if let Err(e) = self
            .raw
            .propose_conf_change(context(self.config.id, 0), change)
        {
            tracing::warn!(learner = id, "cannot propose the promotion: {e}");
        }
    }

    /// Takes one request from a local client.
    pub(crate) fn request(&mut self, req: Request<SM::Response>) {
        Metrics::add(&self.metrics.proposals, 1);
        let now = std::time::Instant::now();
        let (payload, reply, since) = match req {
            Request::Propose {
                command,
                reply,
                sent,
            } => (Payload::Command(command), WaitReply::Command(reply), sent),
            Request::ChangeMembership { change, reply } => {
                (Payload::Conf(change), WaitReply::Unit(reply), now)
            }
            Request::ReadIndex { reply } => (Payload::Read, WaitReply::Unit(reply), now),
            Request::StepDown { reply } => {
                if self.raw.raft.state == StateRole::Leader {
                    if let Some(to) = self.best_transferee(self.config.id) {
                        tracing::info!(id = self.config.id, to, "handing leadership over");
                        self.raw.transfer_leader(to);
                    }
                }
                let _ = reply.send(Ok(()));
                return;
            }
            Request::Checkpoint { reply } => {
                let _ = reply.send(self.checkpoint_now());
                return;
            }
        };
        if let Some(reason) = &self.poisoned {
            return reply.fail(ProposeError::Failed(reason.clone()));
        }
        if matches!(&payload, Payload::Command(c) if c.is_empty()) {
            return reply.fail(ProposeError::Dropped(
                "empty commands are not allowed".into(),
            ));
        }
        if self.waiters.len() >= self.config.max_pending {
            return reply.fail(ProposeError::Dropped(format!(
                "{} requests are already waiting on node {}",
                self.waiters.len(),
                self.config.id
            )));
        }
        let tag = self.next_tag;
        self.next_tag += 1;
        self.waiters.insert(
            tag,
            Waiter {
                payload: Some(payload),
                reply,
                state: State::Parked,
                deadline: self.ticks + self.config.leader_wait_ticks,
                resent: 0,
                attempt: 0,
                since,
            },
        );
        self.dispatch(tag);
    }

    /// Sends a parked request to the leader (or places it, if this node leads).
    fn dispatch(&mut self, tag: u64) {
        let leader = self.raw.raft.leader_id;
        if leader == 0 {
            return;
        }
        let Some(w) = self.waiters.get_mut(&tag) else {
            return;
        };
        if w.state != State::Parked {
            return;
        }
        if leader == self.config.id {
            let Some(payload) = w.payload.take() else {
                return;
            };
            match self.place(self.config.id, tag, payload) {
                Ok(Some((index, term))) => self.placed(tag, index, term),
                Ok(None) => {} // a read: placed when raft reports its read state
                Err((payload, why)) => {
                    tracing::debug!(tag, "request not placed, will retry: {why}");
                    if let Some(w) = self.waiters.get_mut(&tag) {
                        w.payload = Some(payload);
                    }
                }
            }
            return;
        }
        // What goes to the leader: a command or a membership change (encoded); a read is
        // forwarded by raft-rs itself.
        let forward = match w.payload.as_ref() {
            None => return,
            Some(Payload::Read) => {
                self.raw.read_index(tag.to_be_bytes().to_vec());
                None
            }
            Some(Payload::Command(c)) => Some((c.clone(), false)),
            Some(Payload::Conf(cc)) => match cc.write_to_bytes() {
                Ok(b) => Some((b, true)),
                Err(e) => {
                    if let Some(w) = self.waiters.remove(&tag) {
                        w.reply.fail(ProposeError::Dropped(e.to_string()));
                    }
                    return;
                }
            },
        };
        let term = self.raw.raft.term;
        w.state = State::Sent { term };
        w.deadline = self.ticks + self.config.commit_wait_ticks;
        if let Some((command, conf_change)) = forward {
            w.attempt += 1;
            let fwd = Forward {
                tag,
                command,
                conf_change,
                term,
                attempt: w.attempt,
            };
            self.send_envelope(leader, Body::Forward(fwd), false);
        }
    }

    fn dispatch_parked(&mut self) {
        if self.raw.raft.leader_id == 0 {
            return;
        }
        let parked: Vec<u64> = self
            .waiters
            .iter()
            .filter(|(_, w)| w.state == State::Parked)
            .map(|(t, _)| *t)
            .collect();
        for tag in parked {
            self.dispatch(tag);
        }
    }

    /// Puts a request in the log on the leader. `Ok(Some((index, term)))` for an entry,
    /// `Ok(None)` for a read (answered through raft's read states); on refusal the payload
    /// comes back with the reason.
    #[allow(clippy::type_complexity)]
    fn place(
        &mut self,
        origin: u64,
        tag: u64,
        payload: Payload,
    ) -> std::result::Result<Option<(u64, u64)>, (Payload, String)> {
        if self.raw.raft.state != StateRole::Leader {
            return Err((
                payload,
                format!(
                    "node {} is not the leader (leader: {})",
                    self.config.id, self.raw.raft.leader_id
                ),
            ));
        }
        let payload = match payload {
            Payload::Conf(cc) => Payload::Conf(self.without_demotion(cc)),
            other => other,
        };
        let before = self.raw.raft.raft_log.last_index();
        let ctx = context(origin, tag);
        let result = match &payload {
            Payload::Read => {
                self.raw.read_index(tag.to_be_bytes().to_vec());
                let term = self.raw.raft.term;
                if let Some(w) = self.waiters.get_mut(&tag) {
                    w.state = State::Sent { term };
                    w.deadline = self.ticks + self.config.commit_wait_ticks;
                }
                return Ok(None);
            }
            Payload::Command(c) => self.raw.propose(ctx, c.clone()),
            Payload::Conf(cc) => {
                if self.raw.raft.has_pending_conf() {
                    // raft-rs would turn a second change into an empty entry: wait (parked,
                    // retried on the next tick) until the previous one is applied.
                    return Err((payload, "a membership change is still being applied".into()));
                }
                if let Some(target) = self.removes_self(cc) {
                    // A leader does not remove itself: hand leadership to the most
                    // up-to-date other voter first; the request is retried at the new leader.
                    if let Some(to) = self.best_transferee(target) {
                        self.raw.transfer_leader(to);
                    }
                    return Err((payload, "transferring leadership before removal".into()));
                }
                self.raw.propose_conf_change(ctx, cc.clone())
            }
        };
        match result {
            Err(e) => Err((payload, e.to_string())),
            Ok(()) if self.raw.raft.raft_log.last_index() == before => {
                Err((payload, "raft did not append the proposal".into()))
            }
            Ok(()) => Ok(Some((
                self.raw.raft.raft_log.last_index(),
                self.raw.raft.term,
            ))),
        }
    }

    /// Adding a node that already votes must not demote it to learner (what raft-rs does
    /// with `AddLearnerNode` of a voter): it becomes `AddNode`, which leaves a voter as it is.
    fn without_demotion(&self, mut cc: ConfChangeV2) -> ConfChangeV2 {
        let voters = self.raw.raft.prs().conf().voters().ids();
        for c in cc.mut_changes().iter_mut() {
            if c.get_change_type() == ConfChangeType::AddLearnerNode && voters.contains(c.node_id) {
                c.set_change_type(ConfChangeType::AddNode);
            }
        }
        cc
    }

    fn removes_self(&self, cc: &ConfChangeV2) -> Option<u64> {
        cc.get_changes()
            .iter()
            .find(|c| {
                c.get_change_type() == ConfChangeType::RemoveNode && c.node_id == self.config.id
            })
            .map(|c| c.node_id)
    }

    fn best_transferee(&self, not: u64) -> Option<u64> {
        let prs = self.raw.raft.prs();
        prs.conf()
            .voters()
            .ids()
            .iter()
            .filter(|id| *id != not)
            .max_by_key(|id| prs.get(*id).map_or(0, |p| p.matched))
    }

    /// Records where a request was put in the log. Another request recorded at the same
    /// index by a leader of an older term was overwritten — the newer leader's log holds
    /// another entry there, so the older one never committed — and is sent again; one of the
    /// same or a newer term means the records disagree, and its outcome is unknown.
    fn placed(&mut self, tag: u64, index: u64, term: u64) {
        let Some(w) = self.waiters.get_mut(&tag) else {
            return;
        };
        w.state = State::Placed { index, term };
        w.deadline = self.ticks + self.config.commit_wait_ticks;
        let Some(old) = self.by_index.insert(index, tag).filter(|old| *old != tag) else {
            return;
        };
        match self.waiters.get(&old).map(|w| w.state) {
            Some(State::Placed { term: t, .. }) if t < term => self.lost(
                old,
                format!("log index {index} was taken by a leader of term {term}"),
            ),
            Some(_) => {
                if let Some(w) = self.waiters.remove(&old) {
                    w.reply.fail(ProposeError::Unknown(format!(
                        "log index {index} was reported for two requests"
                    )));
                }
            }
            None => {}
        }
    }

    /// Takes one frame or report from the network.
    pub(crate) fn receive(&mut self, msg: Inbound) {
        if self.poisoned.is_some() {
            return;
        }
        match msg {
            Inbound::Unreachable(id) => self.raw.report_unreachable(id),
            Inbound::SnapshotSent(id, ok) => {
                let status = if ok {
                    SnapshotStatus::Finish
                } else {
                    SnapshotStatus::Failure
                };
                self.raw.report_snapshot(id, status);
            }
            Inbound::Envelope(env) => {
                self.last_contact.insert(env.from, self.ticks);
                match env.body {
                    Some(Body::Raft(bytes)) => match Message::parse_from_bytes(&bytes) {
                        Ok(m) if m.from != env.from => tracing::warn!(
                            from = env.from,
                            claimed = m.from,
                            "a raft message claims another sender than its envelope; dropped"
                        ),
                        Ok(m) if self.refuses_entries(&m) => self.ask_for_snapshot(&m),
                        Ok(m) => {
                            if let Err(e) = self.raw.step(m) {
                                tracing::debug!(from = env.from, "raft refused a message: {e}");
                            }
                        }
                        Err(e) => tracing::warn!(from = env.from, "undecodable raft message: {e}"),
                    },
                    Some(Body::Forward(f)) => self.forwarded(env.from, f),
                    Some(Body::ForwardReply(r)) => self.forward_answered(r),
                    None => {}
                }
            }
        }
    }

    /// Answers an append this node refuses (see [`Self::refuses_entries`]) with a rejection
    /// that says its log is empty: the leader then sends from index 1, which its log no longer
    /// has (adding a node compacts every member's log, see `checkpoint_due`), so it sends a
    /// snapshot. (raft-rs's `request_snapshot` is not used: the leader would keep sending
    /// snapshots until its next election.)
    fn ask_for_snapshot(&mut self, m: &Message) {
        tracing::debug!(
            from = m.from,
            "a node without a configuration asks for a snapshot"
        );
        let mut reply = Message::default();
        reply.set_msg_type(MessageType::MsgAppendResponse);
        reply.to = m.from;
        reply.from = self.config.id;
        reply.term = m.term;
        reply.index = m.index;
        reply.reject = true;
        reply.reject_hint = 0;
        self.send_messages(vec![reply]);
    }

    /// A joining node has no configuration until it installs a snapshot (which carries one);
    /// entries from the start of the log would make it apply membership changes to an empty
    /// configuration — the bootstrap members are not in the log — and, e.g., count itself as
    /// the only voter. Such a node takes no entries: the leader then sends a snapshot.
    fn refuses_entries(&self, m: &Message) -> bool {
        let conf = self.raw.raft.prs().conf();
        m.get_msg_type() == MessageType::MsgAppend
            && !m.entries.is_empty()
            && conf.voters().ids().is_empty()
            && conf.learners().is_empty()
    }

    /// The leader side of forwarding: place the request, answer where it went.
    fn forwarded(&mut self, from: u64, f: Forward) {
        let payload = if f.conf_change {
            match ConfChangeV2::parse_from_bytes(&f.command) {
                Ok(cc) => Payload::Conf(cc),
                Err(e) => {
                    let reply = ForwardReply {
                        tag: f.tag,
                        attempt: f.attempt,
                        error: format!("undecodable membership change: {e}"),
                        ..Default::default()
                    };
                    return self.send_envelope(from, Body::ForwardReply(reply), false);
                }
            }
        } else {
            Payload::Command(f.command)
        };
        if f.term != self.raw.raft.term {
            // Placed in another term than the sender saw, the request could commit after the
            // sender concluded (from an applied entry of a newer term) that it never will.
            let reply = ForwardReply {
                tag: f.tag,
                attempt: f.attempt,
                error: format!(
                    "forwarded for term {}, but node {} is in term {}",
                    f.term, self.config.id, self.raw.raft.term
                ),
                ..Default::default()
            };
            return self.send_envelope(from, Body::ForwardReply(reply), false);
        }
        let reply = match self.place(from, f.tag, payload) {
            Ok(Some((index, term))) => ForwardReply {
                tag: f.tag,
                attempt: f.attempt,
                error: String::new(),
                index,
                term,
            },
            Ok(None) => return,
            Err((_, why)) => ForwardReply {
                tag: f.tag,
                attempt: f.attempt,
                error: why,
                ..Default::default()
            },
        };
        self.send_envelope(from, Body::ForwardReply(reply), false);
    }

    /// The follower side: the leader placed our request, or refused it (then it is parked
    /// again — nothing was placed — and retried on the next tick). Only the answer to the
    /// latest sending counts: one to an earlier sending (to a leader since lost) arrives late
    /// and says nothing about where the request is now.
    fn forward_answered(&mut self, r: ForwardReply) {
        let Some(w) = self.waiters.get_mut(&r.tag) else {
            return;
        };
        if !matches!(w.state, State::Sent { .. }) || r.attempt != w.attempt {
            tracing::debug!(
                tag = r.tag,
                attempt = r.attempt,
                latest = w.attempt,
                "ignoring an answer to an earlier sending"
            );
            return;
        }
        if r.error.is_empty() {
            if self.applied >= r.index {
                // Already applied here without our context being seen: overwritten.
                if let Some(w) = self.waiters.remove(&r.tag) {
                    w.reply.fail(ProposeError::Unknown(
                        "the entry was applied before the leader's answer arrived".into(),
                    ));
                }
                return;
            }
            self.placed(r.tag, r.index, r.term);
        } else {
            tracing::debug!(
                tag = r.tag,
                "leader refused a forwarded request: {}",
                r.error
            );
            w.state = State::Parked;
        }
    }

    fn send_envelope(&mut self, to: u64, body: Body, is_snapshot: bool) {
        let env = Envelope {
            from: self.config.id,
            body: Some(body),
        };
        self.transport.send(to, env, is_snapshot);
    }

    /// Processes all pending Readies; poisons the node on failure.
    pub(crate) fn step(&mut self) {
        if self.poisoned.is_some() {
            return;
        }
        if let Err(e) = self
            .process_ready()
            .and_then(|()| self.poll_checkpoint(false))
            .and_then(|()| self.wanted_checkpoint())
        {
            self.poison(e);
        }
        let leader = self.raw.raft.leader_id;
        if leader != self.leader_seen || mem::take(&mut self.requeued) {
            self.leader_seen = leader;
            self.dispatch_parked();
            if let Err(e) = self.process_ready() {
                self.poison(e);
            }
        }
        self.publish_status();
    }

    fn process_ready(&mut self) -> Result<()> {
        while self.raw.has_ready() {
            let mut ready = self.raw.ready();
            self.send_messages(ready.take_messages());
            if !ready.snapshot().is_empty() {
                self.install_snapshot(ready.snapshot().clone())?;
            }
            self.apply(ready.take_committed_entries())?;
            for rs in ready.take_read_states() {
                self.read_confirmed(&rs.request_ctx, rs.index);
            }

            let store = self.raw.mut_store();
            let written = store.append(ready.entries(), ready.hs())?;
            if written > 0 {
                Metrics::add(&self.metrics.log_writes, 1);
                Metrics::add(&self.metrics.log_bytes, written);
            }
            if ready.must_sync() {
                let started = std::time::Instant::now();
                store.sync()?;
                self.metrics
                    .fsync_micros
                    .observe(started.elapsed().as_micros() as u64);
                self.metrics
                    .entries_per_fsync
                    .observe(ready.entries().len() as u64);
                Metrics::add(&self.metrics.log_fsyncs, 1);
                if let Some(delay) = self.config.fsync_delay {
                    std::thread::sleep(delay);
                }
            }
            self.send_messages(ready.take_persisted_messages());

            let mut light = self.raw.advance(ready);
            self.send_messages(light.take_messages());
            self.apply(light.take_committed_entries())?;
            if let Some(commit) = light.commit_index() {
                // Written with the next append, not on its own: a crash before that
                // leaves it behind the applied index, and `LogStore::open` raises it
                // to that on restart.
                self.raw.mut_store().set_commit(commit);
            }
            self.raw.advance_apply();
            self.finish_reads();

            if mem::take(&mut self.checkpoint_due) {
                self.checkpoint()?;
            } else if self.since_checkpoint >= self.config.checkpoint_entries
                || self.since_checkpoint_bytes >= self.config.checkpoint_bytes
            {
                self.start_checkpoint()?;
            }
        }
        if self.raw.store().take_snapshot_wanted() {
            self.build_snapshot()?;
        }
        Ok(())
    }

    /// Hands outgoing Raft messages to the transport.
    fn send_messages(&mut self, msgs: Vec<Message>) {
        for msg in msgs {
            let is_snapshot = msg.get_msg_type() == MessageType::MsgSnapshot;
            match msg.write_to_bytes() {
                Ok(bytes) => self.send_envelope(msg.to, Body::Raft(bytes), is_snapshot),
                Err(e) => tracing::error!("cannot encode a raft message: {e}"),
            }
        }
    }

    fn read_confirmed(&mut self, ctx: &[u8], index: u64) {
        let Ok(tag) = <[u8; 8]>::try_from(ctx).map(u64::from_be_bytes) else {
            return;
        };
        if let Some(w) = self.waiters.get_mut(&tag) {
            w.state = State::ReadAt(index);
        }
        self.finish_reads();
    }

    /// Answers read barriers whose confirmed index is applied.
    fn finish_reads(&mut self) {
        let applied = self.applied;
        let done: Vec<u64> = self
            .waiters
            .iter()
            .filter(|(_, w)| matches!(w.state, State::ReadAt(index) if index <= applied))
            .map(|(t, _)| *t)
            .collect();
        for tag in done {
            if let Some(Waiter {
                reply: WaitReply::Unit(r),
                ..
            }) = self.waiters.remove(&tag)
            {
                let _ = r.send(Ok(()));
            }
        }
    }

    /// Applies committed entries, then publishes the status and only then answers their
    /// waiters, so a proposer that hears back sees a status covering its entry.
    fn apply(&mut self, entries: Vec<Entry>) -> Result<()> {
        let mut replies = Vec::new();
        let result = self
            .apply_entries(entries, &mut replies)
            .and(self.sm.applied().map_err(Error::StateMachine));
        if !replies.is_empty() {
            self.publish_status();
        }
        for (reply, response) in replies {
            match (reply, response) {
                (WaitReply::Command(r), Some(resp)) => drop(r.send(Ok(resp))),
                (WaitReply::Unit(r), None) => drop(r.send(Ok(()))),
                (reply, _) => reply.fail(ProposeError::Dropped(
                    "the entry applied was not the kind proposed".into(),
                )),
            }
        }
        result
    }

    fn apply_entries(
        &mut self,
        entries: Vec<Entry>,
        replies: &mut Vec<Answer<SM::Response>>,
    ) -> Result<()> {
        for entry in entries {
            let index = entry.index;
            Metrics::add(&self.metrics.committed_entries, 1);
            if index <= self.applied {
                continue; // covered by an installed snapshot
            }
            let response = match entry.get_entry_type() {
                EntryType::EntryNormal if entry.data.is_empty() => {
                    self.sm.skip(index);
                    None
                }
                EntryType::EntryNormal => Some(
                    self.sm
                        .apply(index, &entry.data)
                        .map_err(Error::StateMachine)?,
                ),
                EntryType::EntryConfChange => {
                    let v1 = ConfChange::parse_from_bytes(&entry.data)?;
                    let mut cc = ConfChangeV2::default();
                    let mut single = raft::eraftpb::ConfChangeSingle::default();
                    single.set_change_type(v1.get_change_type());
                    single.node_id = v1.node_id;
                    cc.mut_changes().push(single);
                    cc.set_context(v1.context);
                    self.apply_conf_change(cc)?;
                    self.sm.skip(index);
                    None
                }
                EntryType::EntryConfChangeV2 => {
                    let cc = ConfChangeV2::parse_from_bytes(&entry.data)?;
                    self.apply_conf_change(cc)?;
                    self.sm.skip(index);
                    None
                }
            };
            self.applied = index;
            self.since_checkpoint += 1;
            self.since_checkpoint_bytes += entry.data.len() as u64;
            let mine = parse_context(&entry.context)
                .filter(|(node, _)| *node == self.config.id)
                .map(|(_, tag)| tag);
            let placed_here = self.by_index.remove(&index);
            if let Some(w) = mine.and_then(|tag| self.waiters.remove(&tag)) {
                self.metrics
                    .commit_micros
                    .observe(w.since.elapsed().as_micros() as u64);
                replies.push((w.reply, response));
            }
            if let Some(tag) = placed_here.filter(|t| Some(*t) != mine) {
                let why = format!(
                    "log index {index} was taken by another entry (term {})",
                    entry.term
                );
                self.lost(tag, why);
            }
            if entry.term > self.applied_term {
                self.applied_term = entry.term;
                self.requeue_older_than(entry.term);
            }
        }
        Ok(())
    }

    /// Requests sent or placed in a term older than `term` and not applied by now were
    /// certainly not committed: the committed log is one sequence of non-decreasing terms, and
    /// this node applies it in order, so an entry of an older term can no longer follow.
    fn requeue_older_than(&mut self, term: u64) {
        let stale: Vec<(u64, u64)> = self
            .waiters
            .iter()
            .filter_map(|(tag, w)| match w.state {
                State::Sent { term: t } | State::Placed { term: t, .. } if t < term => {
                    Some((*tag, t))
                }
                _ => None,
            })
            .collect();
        for (tag, t) in stale {
            self.lost(tag, format!("its leader lost leadership in term {t}"));
        }
    }

    /// A request that certainly did not commit: parked to be sent to the current leader
    /// again while it still has its payload (a forwarded one), otherwise `Dropped`.
    fn lost(&mut self, tag: u64, why: String) {
        let Some(mut w) = self.waiters.remove(&tag) else {
            return;
        };
        if let State::Placed { index, .. } = w.state {
            if self.by_index.get(&index) == Some(&tag) {
                self.by_index.remove(&index);
            }
        }
        if w.payload.is_none() || w.resent >= MAX_RESENDS {
            return w.reply.fail(ProposeError::Dropped(why));
        }
        tracing::debug!(tag, "sending a request again: {why}");
        w.state = State::Parked;
        w.resent += 1;
        w.deadline = self.ticks + self.config.leader_wait_ticks;
        self.waiters.insert(tag, w);
        self.requeued = true;
    }

    fn apply_conf_change(&mut self, cc: ConfChangeV2) -> Result<()> {
        let before = self.raw.raft.prs().conf().to_conf_state();
        let member = |id: u64| before.voters.contains(&id) || before.learners.contains(&id);
        self.checkpoint_due |= cc
            .get_changes()
            .iter()
            .any(|c| c.get_change_type() != ConfChangeType::RemoveNode && !member(c.node_id));
        let cs = self.raw.apply_conf_change(&cc)?;
        self.raw.mut_store().set_conf_state(cs)?;
        let mut changed = false;
        for c in cc.get_changes() {
            match c.get_change_type() {
                ConfChangeType::AddNode | ConfChangeType::AddLearnerNode => {
                    if let Ok(addr) = std::str::from_utf8(cc.get_context()) {
                        if !addr.is_empty() {
                            self.peers.insert(c.node_id, addr.to_string());
                            changed = true;
                        }
                    }
                }
                ConfChangeType::RemoveNode => {
                    changed |= self.peers.remove(&c.node_id).is_some();
                }
            }
        }
        if changed {
            super::save_peers(&self.config.dir, &self.peers)?;
            self.transport.set_peers(&self.peers);
        }
        tracing::info!(id = self.config.id, conf = ?self.raw.raft.prs().conf().to_conf_state(), "membership changed");
        Ok(())
    }

    /// Replaces the state machine with a leader's snapshot, then the log with its point.
    fn install_snapshot(&mut self, snap: Snapshot) -> Result<()> {
        let meta = snap.get_metadata().clone();
        let data = SnapshotData::decode(snap.get_data())
            .map_err(|e| Error::Config(format!("undecodable snapshot: {e}")))?;
        tracing::info!(
            id = self.config.id,
            index = meta.index,
            term = meta.term,
            bytes = data.state.len(),
            "installing a snapshot"
        );
        self.sm
            .restore(meta.index, meta.term, &data.state)
            .map_err(Error::StateMachine)?;
        self.raw.mut_store().install_snapshot(&meta)?;
        self.checkpoint_running = None;
        self.applied = meta.index;
        self.since_checkpoint = 0;
        self.since_checkpoint_bytes = 0;
        // Proposals of ours inside the snapshot were applied without us seeing them; so may
        // have been those sent to a leader that never said where it put them. A read barrier
        // sent to the leader is no entry: no snapshot holds it, and the leader's answer still
        // comes (or its deadline passes) as before.
        let mut covered: Vec<u64> = self
            .by_index
            .range(..=meta.index)
            .map(|(_, t)| *t)
            .collect();
        covered.extend(
            self.waiters
                .iter()
                .filter(|(_, w)| {
                    matches!(w.state, State::Sent { .. })
                        && !matches!(w.payload, Some(Payload::Read))
                })
                .map(|(t, _)| *t),
        );
        for tag in covered {
            if let Some(w) = self.waiters.remove(&tag) {
                w.reply.fail(ProposeError::Unknown(
                    "applied through a snapshot; its response is not known here".into(),
                ));
            }
        }
        self.by_index = self.by_index.split_off(&(meta.index + 1));
        self.applied_term = meta.term;
        self.requeue_older_than(meta.term);
        if !data.peers.is_empty() {
            // Addresses this node was configured with win: they are how *it* reaches them.
            self.peers = data.peers;
            self.peers.extend(self.config.peers.clone());
            super::save_peers(&self.config.dir, &self.peers)?;
            self.transport.set_peers(&self.peers);
        }
        Metrics::add(&self.metrics.snapshots_installed, 1);
        Ok(())
    }

    /// A follower needs entries the log no longer has: checkpoint, compact, and keep a
    /// snapshot of the state for raft to send.
    fn build_snapshot(&mut self) -> Result<()> {
        let (index, state) = self.sm.snapshot().map_err(Error::StateMachine)?;
        self.checkpoint_running = None;
        Metrics::add(&self.metrics.checkpoints, 1);
        self.since_checkpoint = 0;
        self.since_checkpoint_bytes = 0;
        let index = index.min(self.applied);
        let term = raft::Storage::term(self.raw.store(), index)?;
        let data = SnapshotData {
            peers: self.peers.clone(),
            state,
        }
        .encode_to_vec();
        let mut snap = Snapshot::default();
        snap.set_data(data.into());
        let meta = snap.mut_metadata();
        meta.index = index;
        meta.term = term;
        meta.set_conf_state(self.raw.raft.prs().conf().to_conf_state());
        tracing::info!(
            id = self.config.id,
            index,
            term,
            "built a snapshot for a lagging follower"
        );
        let store = self.raw.mut_store();
        store.set_snapshot(snap);
        store.compact(index)?;
        Metrics::add(&self.metrics.snapshots_built, 1);
        Ok(())
    }

    /// Checkpoints the state machine and compacts the log up to what the checkpoint covers,
    /// before returning (after the checkpoint in flight, if any).
    fn checkpoint(&mut self) -> Result<()> {
        let started = std::time::Instant::now();
        let covered = self.sm.checkpoint().map_err(Error::StateMachine)?;
        // the state machine finished the one in flight first
        self.checkpoint_running = None;
        Metrics::add(&self.metrics.checkpoints, 1);
        self.since_checkpoint = 0;
        self.since_checkpoint_bytes = 0;
        self.compact(covered)?;
        self.metrics
            .checkpoint_micros
            .observe(started.elapsed().as_micros() as u64);
        Ok(())
    }

    /// The periodic checkpoint: its I/O runs off this thread while entries go on being
    /// written and applied; [`Driver::poll_checkpoint`] compacts the log once it is durable.
    /// One at a time: if the last one is still running, this waits for it first, which
    /// bounds the entries held in memory to twice the checkpoint interval.
    fn start_checkpoint(&mut self) -> Result<()> {
        if self.checkpoint_running.is_some() {
            self.poll_checkpoint(true)?;
        }
        let started = std::time::Instant::now();
        let at = self.applied;
        let done = self.sm.start_checkpoint().map_err(Error::StateMachine)?;
        self.since_checkpoint = 0;
        self.since_checkpoint_bytes = 0;
        match done {
            Some(covered) => {
                Metrics::add(&self.metrics.checkpoints, 1);
                self.compact(covered)?;
                self.metrics
                    .checkpoint_micros
                    .observe(started.elapsed().as_micros() as u64);
            }
            None => self.checkpoint_running = Some((at, started.elapsed())),
        }
        Ok(())
    }

    /// Compacts the log up to a checkpoint the state machine made durable since the last
    /// call (`wait`: after the one in flight is done). The checkpoint time observed is
    /// what this thread spent on it: starting it and compacting, not the I/O in between.
    fn poll_checkpoint(&mut self, wait: bool) -> Result<()> {
        let started = std::time::Instant::now();
        let Some(covered) = self
            .sm
            .finished_checkpoint(wait)
            .map_err(Error::StateMachine)?
        else {
            return Ok(());
        };
        self.compact(covered)?;
        if let Some((at, spent)) = self.checkpoint_running {
            if covered >= at {
                self.checkpoint_running = None;
                Metrics::add(&self.metrics.checkpoints, 1);
                self.metrics
                    .checkpoint_micros
                    .observe((spent + started.elapsed()).as_micros() as u64);
            }
        }
        Ok(())
    }

    /// Starts a checkpoint the state machine asked for, unless one is in flight (it asks
    /// again after).
    fn wanted_checkpoint(&mut self) -> Result<()> {
        if self.checkpoint_running.is_none() && self.sm.checkpoint_wanted() {
            self.start_checkpoint()?;
        }
        Ok(())
    }

    /// Compacts the log up to `covered`, a durable checkpoint's index.
    fn compact(&mut self, covered: u64) -> Result<()> {
        let deleted = self.raw.mut_store().compact(covered.min(self.applied))?;
        tracing::debug!(covered, deleted, "checkpointed and compacted the Raft log");
        Ok(())
    }

    /// A checkpoint a client asked for (a backup): between Readies, so everything applied is
    /// covered. A failure poisons the node, as a periodic checkpoint's does.
    fn checkpoint_now(&mut self) -> Outcome<u64> {
        if let Some(reason) = &self.poisoned {
            return Err(ProposeError::Failed(reason.clone()));
        }
        match self.checkpoint() {
            Ok(()) => Ok(self.applied),
            Err(e) => {
                let message = e.to_string();
                self.poison(e);
                Err(ProposeError::Failed(message))
            }
        }
    }

    /// Clean shutdown: refuse what is still queued, checkpoint, answer every waiter.
    fn finish(mut self, mut queue: mpsc::Receiver<Request<SM::Response>>) {
        queue.close();
        while let Ok(req) = queue.try_recv() {
            let err = ProposeError::Failed("node shut down".into());
            match req {
                Request::Propose { reply, .. } => drop(reply.send(Err(err))),
                Request::ChangeMembership { reply, .. }
                | Request::ReadIndex { reply }
                | Request::StepDown { reply } => drop(reply.send(Err(err))),
                Request::Checkpoint { reply } => drop(reply.send(Err(err))),
            }
        }
        if self.poisoned.is_none() {
            let result = self.raw.mut_store().sync().and_then(|()| {
                if self.since_checkpoint > 0 {
                    self.checkpoint()
                } else {
                    self.poll_checkpoint(true)
                }
            });
            if let Err(e) = result {
                self.poison(e);
            }
        }
        self.fail_waiters(|state| match state {
            State::Parked => ProposeError::Failed("node shut down".into()),
            _ => ProposeError::Unknown("node shut down".into()),
        });
        self.publish_status();
        tracing::info!(
            id = self.config.id,
            applied = self.applied,
            "raft node stopped"
        );
    }

    fn poison(&mut self, err: Error) {
        let reason = err.to_string();
        tracing::error!(id = self.config.id, error = %reason, "raft node poisoned; refusing writes");
        self.poisoned = Some(reason.clone());
        self.publish_status();
        self.fail_waiters(|_| ProposeError::Failed(reason.clone()));
    }

    fn fail_waiters(&mut self, err: impl Fn(State) -> ProposeError) {
        self.by_index.clear();
        for (_, w) in mem::take(&mut self.waiters) {
            w.reply.fail(err(w.state));
        }
    }

    fn publish_status(&self) {
        let raft = &self.raw.raft;
        let role = |state: StateRole| match state {
            StateRole::Leader => "leader",
            StateRole::Follower => "follower",
            StateRole::Candidate => "candidate",
            StateRole::PreCandidate => "pre-candidate",
        };
        let conf = raft.prs().conf().to_conf_state();
        let leader = raft.state == StateRole::Leader;
        let last = raft.raft_log.last_index();
        let mut members: Vec<(u64, bool)> = conf.voters.iter().map(|v| (*v, true)).collect();
        members.extend(conf.learners.iter().map(|l| (*l, false)));
        let peers = members
            .into_iter()
            .map(|(id, voter)| {
                let matched = if id == self.config.id {
                    Some(last)
                } else if leader {
                    raft.prs().get(id).map(|p| p.matched)
                } else {
                    None
                };
                PeerStatus {
                    id,
                    address: self.peers.get(&id).cloned().unwrap_or_default(),
                    voter,
                    role: if id == raft.leader_id {
                        "leader".into()
                    } else if id == self.config.id {
                        role(raft.state).into()
                    } else if voter {
                        "follower".into()
                    } else {
                        "learner".into()
                    },
                    match_index: matched,
                    lag: matched.map(|m| last.saturating_sub(m)),
                    last_contact_ms: if id == self.config.id {
                        Some(0)
                    } else {
                        self.last_contact.get(&id).map(|t| {
                            (self.ticks - t) * self.config.tick_interval.as_millis() as u64
                        })
                    },
                }
            })
            .collect();
        *self.status.write() = NodeStatus {
            id: self.config.id,
            leader_id: raft.leader_id,
            term: raft.term,
            commit_index: raft.raft_log.committed,
            applied_index: self.applied,
            role: role(raft.state).to_string(),
            poisoned: self.poisoned.clone(),
            removed: removed(&conf, self.config.id),
            peers,
        };
    }
}

/// Whether the configuration leaves `id` out. An empty one (a node that joins and has not
/// installed its first snapshot) is not a removal.
fn removed(conf: &raft::eraftpb::ConfState, id: u64) -> bool {
    let empty = conf.voters.is_empty() && conf.learners.is_empty();
    let member = conf.voters.contains(&id) || conf.learners.contains(&id);
    !empty && !member
}
