//! The node: its configuration, the [`StateMachine`] it drives, and the [`NodeHandle`]
//! through which the rest of Sluice proposes commands, changes membership and asks for
//! linearizable read barriers.
//!
//! [`start`] recovers the log, starts the peer transport (for a cluster; authenticated with
//! the cluster secret, which a cluster with any non-loopback address must have) and runs the
//! node task (module `driver`) on a dedicated OS thread with a current-thread tokio runtime: it
//! selects over the request queue, the network inbox, the tick interval and the stop signal,
//! and does its blocking log writes and fsyncs inline. Because the thread is busy while it fsyncs,
//! proposals arriving meanwhile wait in the queue and are all drained into the next write: that
//! is group commit, with no timers.
//!
//! Any node takes proposals: a follower forwards them to the leader and answers when it has
//! applied the entry itself. Guarantees to a proposer: `Ok` only after the command is in an
//! fsynced log write on a quorum, committed and applied on this node; `Dropped` only when it
//! certainly was not and will not be committed (no leader accepted it in time, or its log
//! index went to another entry); `Unknown` when that cannot be known (shutdown, no answer in
//! time); `Failed` once the node is poisoned or stopped. No waiter is left hanging: every path
//! out of the node task answers it, and every wait is bounded in ticks.

mod driver;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use parking_lot::RwLock;
use tokio::sync::{mpsc, oneshot, watch};

use crate::error::{Error, Result};
use crate::log_store::LogStore;
use crate::metrics::Metrics;
use crate::peer_auth::{is_loopback_address, ClusterSecret, PeerAuth};
use crate::peer_tls::PeerTls;
use crate::transport::{NoTransport, PeerSecurity, TcpTransport, Transport, INBOUND_QUEUE};
use driver::{Driver, Request};

/// The replicated state machine. It is called only from the node thread, in log order.
pub trait StateMachine: Send + 'static {
    /// What a command's proposer receives.
    type Response: Send + 'static;
    /// Apply one committed command (never called for empty/no-op entries). A deterministic
    /// failure is part of `Response`; `Err(msg)` means a non-deterministic failure (disk): the
    /// node stops (poisons) rather than diverge. `command` is the Raft entry's own buffer
    /// (shared, reference-counted): what the state machine keeps of it needs no copy.
    fn apply(&mut self, index: u64, command: &Bytes)
        -> std::result::Result<Self::Response, String>;
    /// A committed entry at `index` that carries no command (Raft's own empty entry or a
    /// membership change): nothing changes, but the applied index moves, so the next
    /// checkpoint covers it and the log can be compacted past it.
    fn skip(&mut self, index: u64);
    /// A run of `apply` and `skip` calls is over, and their proposers are about to be
    /// answered: whatever the state machine deferred (a batch of writes it gathered) must
    /// be done and visible to readers now. `Err` is a disk failure, as in `apply`.
    fn applied(&mut self) -> std::result::Result<(), String> {
        Ok(())
    }
    /// Index covered by the state machine's last durable checkpoint (after restart: what it
    /// recovered to).
    fn applied_index(&self) -> u64;
    /// Make everything applied so far durable; return the index it now covers. The node may
    /// then compact its log up to it.
    fn checkpoint(&mut self) -> std::result::Result<u64, String>;
    /// Begin a checkpoint of everything applied so far whose slow part (fsyncs, the durable
    /// write) may run on another thread while applies go on. `Ok(Some(index))`: done
    /// already, as `checkpoint`; `Ok(None)`: [`StateMachine::finished_checkpoint`] will
    /// say. The node starts one only when none is in flight.
    fn start_checkpoint(&mut self) -> std::result::Result<Option<u64>, String> {
        self.checkpoint().map(Some)
    }
    /// The index of the newest checkpoint made durable since the last call (or since
    /// `checkpoint` returned), if any; with `wait`, after the one in flight is done. `Err`:
    /// a checkpoint failed (the node poisons).
    fn finished_checkpoint(&mut self, wait: bool) -> std::result::Result<Option<u64>, String> {
        let _ = wait;
        Ok(None)
    }
    /// The state machine has work only a checkpoint finishes (files of dropped streams to
    /// delete once a checkpoint without them is durable): the node starts one as soon as
    /// none is in flight, before the interval is reached.
    fn checkpoint_wanted(&self) -> bool {
        false
    }
    /// Checkpoint, then serialize the whole state as of the index returned, for a follower
    /// that is behind the log's compaction point.
    fn snapshot(&mut self) -> std::result::Result<(u64, Vec<u8>), String>;
    /// Replace the whole state with `data`, a leader's snapshot at (`index`, `term`). Durable
    /// on return: afterwards `applied_index()` is `index` and `snapshot_point()` is
    /// `Some((index, term))` until the next checkpoint moves past it.
    fn restore(&mut self, index: u64, term: u64, data: &[u8]) -> std::result::Result<(), String>;
    /// (index, term) of the last restored snapshot, while the checkpoint is exactly at it; the
    /// log uses it to recover from a crash in the middle of installing a snapshot.
    fn snapshot_point(&self) -> Option<(u64, u64)>;
}

/// Node settings. [`NodeConfig::single`] gives sensible defaults for a one-node cluster.
#[derive(Clone, Debug)]
pub struct NodeConfig {
    /// This node's Raft id (non-zero).
    pub id: u64,
    /// Voters used to bootstrap a brand-new log; afterwards the persisted ConfState wins.
    /// Empty for a node joining a running cluster (the leader adds it).
    pub voters: Vec<u64>,
    /// Raft address (`host:port`) of each node, this one included (it listens there). Empty
    /// for a single node without a transport. Members added later are remembered in the WAL
    /// directory.
    pub peers: BTreeMap<u64, String>,
    /// WAL directory.
    pub dir: PathBuf,
    /// Length of one Raft tick.
    pub tick_interval: Duration,
    /// Ticks without a leader before a follower campaigns.
    pub election_tick: usize,
    /// Ticks between a leader's heartbeats.
    pub heartbeat_tick: usize,
    /// Most proposals drained into one log write.
    pub max_batch: usize,
    /// Capacity of the proposal queue; `propose` waits when it is full (backpressure).
    pub queue_depth: usize,
    /// Checkpoint the state machine and compact the log after this many applied entries.
    pub checkpoint_entries: u64,
    /// ... or after this many bytes of applied entries, whichever comes first: the log keeps
    /// entries in memory until a checkpoint compacts it, so this bounds that memory.
    pub checkpoint_bytes: u64,
    /// Roll to a new WAL segment once the current one reaches this size.
    pub wal_segment_bytes: u64,
    /// TEST ONLY: sleep this long after every log fsync (simulates a slow disk).
    pub fsync_delay: Option<Duration>,
    /// Bytes of entries in one append message to a follower. Large enough that a whole
    /// group-commit batch of ordinary commands replicates in one message; small enough that
    /// catching up a lagging follower does not build huge messages.
    pub max_size_per_msg: u64,
    /// Append messages in flight to one follower before waiting for acks. Together with
    /// `max_size_per_msg` this bounds the replication bytes buffered per follower
    /// (4 MiB × 64 = 256 MiB by default).
    pub max_inflight_msgs: usize,
    /// Bytes of proposed-but-uncommitted entries the leader accepts; beyond it proposals are
    /// `Dropped` (retryable). Bounds leader memory when a quorum is unreachable; it must exceed
    /// one group-commit batch or healthy batches would be split by drops.
    pub max_uncommitted_size: u64,
    /// Ticks a request waits for a leader before it is `Dropped`.
    pub leader_wait_ticks: u64,
    /// Ticks a request that reached a leader waits to be applied before it is `Unknown`.
    pub commit_wait_ticks: u64,
    /// Requests waiting on this node (parked, forwarded or in the log) before more are
    /// `Dropped`.
    pub max_pending: usize,
    /// Largest node-to-node frame; it bounds snapshot size too.
    pub max_frame_bytes: usize,
    /// The secret every member shares; with it, every peer connection is authenticated (see
    /// [`crate::peer_auth`]). Required when any peer address is not loopback.
    pub cluster_secret: Option<ClusterSecret>,
    /// Mutual TLS between members (see [`crate::peer_tls`]). Either this or a cluster secret
    /// (or both) is required when any peer address is not loopback.
    pub peer_tls: Option<PeerTls>,
}

impl NodeConfig {
    /// Defaults for a single-node cluster with id `id` and its WAL in `dir`.
    pub fn single(id: u64, dir: PathBuf) -> Self {
        NodeConfig {
            id,
            voters: vec![id],
            dir,
            tick_interval: Duration::from_millis(100),
            election_tick: 10,
            heartbeat_tick: 3,
            max_batch: 4096,
            queue_depth: 8192,
            checkpoint_entries: 20_000,
            checkpoint_bytes: 128 << 20,
            wal_segment_bytes: 64 << 20,
            fsync_delay: None,
            max_size_per_msg: 4 << 20,
            max_inflight_msgs: 64,
            max_uncommitted_size: 512 << 20,
            peers: BTreeMap::new(),
            leader_wait_ticks: 50,
            commit_wait_ticks: 50,
            max_pending: 65_536,
            max_frame_bytes: 1 << 30,
            cluster_secret: None,
            peer_tls: None,
        }
    }

    fn validate(&self) -> Result<()> {
        let fail = |what: &str| Err(Error::Config(what.to_string()));
        if self.id == 0 {
            return fail("id must be non-zero");
        }
        if self.voters.contains(&0) || self.peers.contains_key(&0) {
            return fail("node ids must be non-zero");
        }
        if self.voters.is_empty() && self.peers.is_empty() {
            return fail("a node without voters must have peers to join");
        }
        if !self.peers.is_empty() && !self.peers.contains_key(&self.id) {
            return fail("peers must include this node's own address");
        }
        if self.cluster_secret.is_none() && self.peer_tls.is_none() {
            if let Some((id, addr)) = self.peers.iter().find(|(_, a)| !is_loopback_address(a)) {
                return Err(Error::Config(format!(
                    "node {id}'s Raft address {addr} is not loopback: a cluster beyond loopback needs peer authentication (peer TLS or a cluster secret)"
                )));
            }
        }
        if self.leader_wait_ticks == 0 || self.commit_wait_ticks == 0 || self.max_pending == 0 {
            return fail("leader_wait_ticks, commit_wait_ticks and max_pending must be positive");
        }
        if self.tick_interval.is_zero() {
            return fail("tick_interval must be positive");
        }
        if self.max_batch == 0 || self.queue_depth == 0 {
            return fail("max_batch and queue_depth must be positive");
        }
        if self.checkpoint_entries == 0 || self.checkpoint_bytes == 0 || self.wal_segment_bytes == 0
        {
            return fail(
                "checkpoint_entries, checkpoint_bytes and wal_segment_bytes must be positive",
            );
        }
        Ok(())
    }

    fn raft_config(&self, applied: u64) -> raft::Config {
        raft::Config {
            id: self.id,
            election_tick: self.election_tick,
            heartbeat_tick: self.heartbeat_tick,
            applied,
            max_size_per_msg: self.max_size_per_msg,
            max_inflight_msgs: self.max_inflight_msgs,
            max_uncommitted_size: self.max_uncommitted_size,
            // A leader cut off from a quorum steps down (so its waiters fail promptly instead
            // of waiting forever), and a rejoining partitioned node cannot force a term bump.
            check_quorum: true,
            pre_vote: true,
            ..Default::default()
        }
    }
}

/// Why a proposal did not succeed.
#[derive(Debug, thiserror::Error)]
pub enum ProposeError {
    /// Certainly not committed (not the leader, dropped by Raft, overwritten by another
    /// term): safe to retry.
    #[error("proposal dropped: {0}")]
    Dropped(String),
    /// Outcome unknown (the node shut down or lost leadership while the proposal was pending).
    #[error("proposal outcome unknown: {0}")]
    Unknown(String),
    /// The node is poisoned (e.g. an fsync failed) or stopped: it accepts no writes.
    #[error("node unavailable: {0}")]
    Failed(String),
}

/// A snapshot of the node's state, refreshed by the node task on every loop turn.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NodeStatus {
    pub id: u64,
    pub leader_id: u64,
    pub term: u64,
    pub commit_index: u64,
    pub applied_index: u64,
    /// "leader", "follower", "candidate" or "pre-candidate".
    pub role: String,
    /// Why the node stopped accepting writes, if it did.
    pub poisoned: Option<String>,
    /// The cluster's configuration no longer includes this node: it was removed.
    pub removed: bool,
    /// Every member as this node sees it (itself included).
    pub peers: Vec<PeerStatus>,
}

/// One member of the cluster as seen from this node.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PeerStatus {
    pub id: u64,
    pub address: String,
    pub voter: bool,
    /// "leader", "follower", "candidate", "pre-candidate" or "learner".
    pub role: String,
    /// Last log index known to be on that node (its own last index for this node; known for
    /// others only on the leader).
    pub match_index: Option<u64>,
    /// Entries the node is behind this node's last index (same availability).
    pub lag: Option<u64>,
    /// Milliseconds since a message from that node arrived (0 for this node).
    pub last_contact_ms: Option<u64>,
}

/// Why a node cannot serve clients.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Unavailable {
    /// It stopped applying the log (a disk or apply failure); the reason.
    Poisoned(String),
    /// The cluster removed this node (its id).
    Removed(u64),
}

/// A membership change.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Membership {
    /// Add a node listening for Raft traffic at the address: a learner first, promoted to
    /// voter by the leader once it has caught up.
    Add(u64, String),
    /// Remove a node (if it leads, leadership moves first).
    Remove(u64),
}

struct Shared {
    status: Arc<RwLock<NodeStatus>>,
    metrics: Arc<Metrics>,
    stop: watch::Sender<bool>,
    stopped: watch::Receiver<bool>,
}

/// A cheap, cloneable handle to a running node.
pub struct NodeHandle<R> {
    proposals: mpsc::Sender<Request<R>>,
    shared: Arc<Shared>,
}

impl<R> Clone for NodeHandle<R> {
    fn clone(&self) -> Self {
        NodeHandle {
            proposals: self.proposals.clone(),
            shared: self.shared.clone(),
        }
    }
}

impl<R: Send + 'static> NodeHandle<R> {
    /// Proposes a command; resolves after it is committed (persisted and fsynced to the log)
    /// and applied, with the state machine's response. Waits for room in the bounded queue.
    /// Empty commands are rejected (`Dropped`): an empty entry is Raft's own no-op.
    pub async fn propose(&self, command: Vec<u8>) -> std::result::Result<R, ProposeError> {
        let gone = || ProposeError::Unknown("node stopped while waiting".into());
        let _in_flight = crate::spin::in_flight();
        let sent = std::time::Instant::now();
        self.ask(
            |reply| Request::Propose {
                command,
                reply,
                sent,
            },
            gone,
        )
        .await
    }

    /// Adds or removes a member; resolves once the change is applied on this node.
    pub async fn change_membership(
        &self,
        change: Membership,
    ) -> std::result::Result<(), ProposeError> {
        let change = membership_change(change);
        let gone = || ProposeError::Unknown("node stopped while waiting".into());
        self.ask(|reply| Request::ChangeMembership { change, reply }, gone)
            .await
    }

    /// A linearizable read barrier: resolves once this node has applied everything the
    /// leader had committed when it confirmed (with a quorum) that it still leads.
    pub async fn read_index(&self) -> std::result::Result<(), ProposeError> {
        let gone = || ProposeError::Dropped("node stopped while waiting".into());
        self.ask(|reply| Request::ReadIndex { reply }, gone).await
    }

    /// If this node leads, starts handing leadership to the most up-to-date other voter, so
    /// that a clean shutdown does not make the cluster wait out an election timeout.
    pub async fn step_down(&self) -> std::result::Result<(), ProposeError> {
        let gone = || ProposeError::Failed("node stopped".into());
        self.ask(|reply| Request::StepDown { reply }, gone).await
    }

    /// Checkpoints this node's state machine now and compacts its log; resolves with the
    /// applied index the checkpoint covers (everything this node had applied).
    pub async fn checkpoint(&self) -> std::result::Result<u64, ProposeError> {
        let gone = || ProposeError::Failed("node stopped".into());
        self.ask(|reply| Request::Checkpoint { reply }, gone).await
    }

    /// Sends the request `make` builds around a reply channel and waits for the answer;
    /// `gone` is the answer if the node drops the request unanswered (it stopped).
    async fn ask<T>(
        &self,
        make: impl FnOnce(oneshot::Sender<std::result::Result<T, ProposeError>>) -> Request<R>,
        gone: impl FnOnce() -> ProposeError,
    ) -> std::result::Result<T, ProposeError> {
        if let Some(reason) = self.shared.status.read().poisoned.clone() {
            return Err(ProposeError::Failed(reason));
        }
        let (reply, response) = oneshot::channel();
        self.proposals
            .send(make(reply))
            .await
            .map_err(|_| ProposeError::Failed("node stopped".into()))?;
        response.await.unwrap_or_else(|_| Err(gone()))
    }

    /// Why this node cannot serve clients, if it cannot: it is poisoned, or it was removed.
    pub fn unavailable(&self) -> Option<Unavailable> {
        let status = self.shared.status.read();
        if let Some(reason) = &status.poisoned {
            return Some(Unavailable::Poisoned(reason.clone()));
        }
        status.removed.then_some(Unavailable::Removed(status.id))
    }

    /// The node's counters.
    pub fn metrics(&self) -> Arc<Metrics> {
        self.shared.metrics.clone()
    }

    /// The node's state as of its last loop turn.
    pub fn status(&self) -> NodeStatus {
        self.shared.status.read().clone()
    }

    /// Stops the node task — it finishes the current write, checkpoints, fails pending waiters
    /// with `Unknown` and queued proposals with `Failed` — and waits for it to exit.
    pub async fn shutdown(&self) {
        self.shared.stop.send_replace(true);
        let mut stopped = self.shared.stopped.clone();
        // An error means the node thread is gone, which is what we are waiting for.
        let _ = stopped.wait_for(|s| *s).await;
    }
}

/// Opens the WAL in `config.dir` (creating it), recovers, starts the node on a dedicated OS
/// thread and returns its handle. A brand-new log is bootstrapped with `config.voters`; a node
/// that is the only voter campaigns at once, so it leads without waiting for an election
/// timeout.
pub fn start<SM: StateMachine>(config: NodeConfig, sm: SM) -> Result<NodeHandle<SM::Response>> {
    config.validate()?;
    let store = LogStore::open(
        &config.dir,
        config.wal_segment_bytes,
        &config.voters,
        sm.applied_index(),
        sm.snapshot_point(),
    )?;
    let (inbound_tx, inbound) = mpsc::channel(INBOUND_QUEUE);
    let transport: Box<dyn Transport> = if config.peers.is_empty() {
        Box::new(NoTransport)
    } else {
        let addr = &config.peers[&config.id];
        let listener = std::net::TcpListener::bind(addr)
            .map_err(|e| Error::io(format!("listen for Raft peers on {addr}"), e))?;
        let runtime = tokio::runtime::Handle::try_current().map_err(|_| {
            Error::Config("a cluster node must be started inside a tokio runtime".into())
        })?;
        Box::new(
            TcpTransport::start(
                config.id,
                listener,
                &config.peers,
                inbound_tx.clone(),
                config.max_frame_bytes,
                PeerSecurity {
                    secret: config
                        .cluster_secret
                        .clone()
                        .map(|secret| PeerAuth::new(secret, config.id)),
                    tls: config.peer_tls.clone(),
                },
                runtime,
            )
            .map_err(|e| Error::io("start the Raft transport", e))?,
        )
    };
    let status = Arc::new(RwLock::new(NodeStatus {
        id: config.id,
        ..Default::default()
    }));
    let metrics = Arc::new(Metrics::default());
    let (proposals, queue) = mpsc::channel(config.queue_depth);
    let (stop, stop_rx) = watch::channel(false);
    let (stopped_tx, stopped) = watch::channel(false);
    let id = config.id;
    let driver = Driver::new(
        config,
        store,
        sm,
        transport,
        metrics.clone(),
        status.clone(),
    )?;
    // The transport holds the other senders; this one would keep the inbox open forever.
    drop(inbound_tx);
    let done = DoneGuard {
        stopped: stopped_tx,
        status: status.clone(),
    };
    std::thread::Builder::new()
        .name(format!("sluice-raft-{id}"))
        .spawn(move || {
            let _done = done;
            match tokio::runtime::Builder::new_current_thread()
                .enable_time()
                .build()
            {
                Ok(rt) => rt.block_on(driver.run(queue, inbound, stop_rx)),
                Err(e) => driver.abandon(format!("cannot build the node runtime: {e}")),
            }
        })
        .map_err(|e| Error::io("spawn the node thread", e))?;
    Ok(NodeHandle {
        proposals,
        shared: Arc::new(Shared {
            status,
            metrics,
            stop,
            stopped,
        }),
    })
}

/// Signals "stopped" when the node thread ends, however it ends; a panic poisons the status.
struct DoneGuard {
    stopped: watch::Sender<bool>,
    status: Arc<RwLock<NodeStatus>>,
}

impl Drop for DoneGuard {
    fn drop(&mut self) {
        if std::thread::panicking() {
            let mut status = self.status.write();
            status
                .poisoned
                .get_or_insert_with(|| "node thread panicked".into());
        }
        self.stopped.send_replace(true);
    }
}

/// The raft-rs configuration change for `change` (the address rides in its context). A node
/// is added as a learner: it gets the log (from a snapshot, which carries the configuration)
/// without counting toward the quorum, and the leader promotes it to voter once it has caught
/// up — so a node that never catches up cannot cost the cluster its quorum.
pub(crate) fn membership_change(change: Membership) -> raft::eraftpb::ConfChangeV2 {
    use raft::eraftpb::ConfChangeType;
    match change {
        Membership::Add(id, addr) => conf_change(ConfChangeType::AddLearnerNode, id, addr),
        Membership::Remove(id) => conf_change(ConfChangeType::RemoveNode, id, String::new()),
    }
}

/// A configuration change of one node.
pub(crate) fn conf_change(
    kind: raft::eraftpb::ConfChangeType,
    id: u64,
    addr: String,
) -> raft::eraftpb::ConfChangeV2 {
    use raft::eraftpb::{ConfChangeSingle, ConfChangeV2};
    let mut cc = ConfChangeV2::default();
    let mut single = ConfChangeSingle::default();
    single.set_change_type(kind);
    single.node_id = id;
    cc.set_context(addr.into_bytes().into());
    cc.mut_changes().push(single);
    cc
}

/// The file in the WAL directory remembering members' addresses (one `id=host:port` a line).
const PEERS_FILE: &str = "peers";

pub(crate) fn load_peers(dir: &Path) -> Result<BTreeMap<u64, String>> {
    let path = dir.join(PEERS_FILE);
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(BTreeMap::new()),
        Err(e) => return Err(Error::io(format!("read {}", path.display()), e)),
    };
    let mut peers = BTreeMap::new();
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let parsed = line
            .split_once('=')
            .and_then(|(id, addr)| Some((id.trim().parse::<u64>().ok()?, addr.trim().to_string())));
        match parsed {
            Some((id, addr)) => {
                peers.insert(id, addr);
            }
            None => {
                return Err(Error::Config(format!(
                    "bad line in {}: {line}",
                    path.display()
                )))
            }
        }
    }
    Ok(peers)
}

pub(crate) fn save_peers(dir: &Path, peers: &BTreeMap<u64, String>) -> Result<()> {
    use std::io::Write as _;
    let path = dir.join(PEERS_FILE);
    let tmp = dir.join("peers.tmp");
    let text: String = peers.iter().map(|(id, a)| format!("{id}={a}\n")).collect();
    let mut f = std::fs::File::create(&tmp)
        .map_err(|e| Error::io(format!("create {}", tmp.display()), e))?;
    f.write_all(text.as_bytes())
        .and_then(|()| f.sync_all())
        .map_err(|e| Error::io(format!("write {}", tmp.display()), e))?;
    std::fs::rename(&tmp, &path).map_err(|e| Error::io(format!("rename {}", tmp.display()), e))?;
    Ok(())
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod sim;
