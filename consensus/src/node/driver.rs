//! The node task: owns the `RawNode`, the [`LogStore`] inside it and the state machine, and
//! runs raft-rs's Ready loop in exactly this order (see `docs/architecture.md`):
//! send `messages` → apply snapshot → apply `committed_entries` → append `entries` + HardState
//! (one fsync if `must_sync`) → send `persisted_messages` → `advance` → LightReady (persist the
//! commit index, send messages, apply committed entries) → `advance_apply` → maybe checkpoint.
//!
//! Waiters are keyed by log index and remember the term they were proposed in: (index, term)
//! identifies an entry, so an entry applied at a waiter's index with another term means the
//! proposal was overwritten (`Dropped`). Once anything non-deterministic fails (WAL write or
//! fsync, state machine apply or checkpoint) the node is poisoned for good: it fails every
//! waiter and every later proposal with `Failed` and never acknowledges anything again, because
//! after a failed fsync nobody knows what is on disk (fsyncgate).

use std::collections::BTreeMap;
use std::mem;
use std::sync::Arc;

use parking_lot::RwLock;
use protobuf::Message as _;
use raft::eraftpb::{ConfChange, ConfChangeV2, Entry, EntryType, Message};
use raft::{RawNode, StateRole};
use tokio::sync::{mpsc, oneshot, watch};
use tokio::time::MissedTickBehavior;

use super::{NodeConfig, NodeStatus, ProposeError, StateMachine};
use crate::error::{Error, Result};
use crate::log_store::LogStore;
use crate::logging;
use crate::metrics::Metrics;

type Outcome<R> = std::result::Result<R, ProposeError>;
type Reply<R> = oneshot::Sender<Outcome<R>>;
/// An answer ready to send once the status is published.
type Answer<R> = (Reply<R>, Outcome<R>);

/// A command waiting in the proposal queue.
pub(crate) struct Proposal<R> {
    pub(crate) command: Vec<u8>,
    pub(crate) reply: Reply<R>,
}

/// A proposal in the log, waiting for its entry to be applied.
struct Waiter<R> {
    term: u64,
    reply: Reply<R>,
}

pub(crate) struct Driver<SM: StateMachine> {
    raw: RawNode<LogStore>,
    sm: SM,
    config: NodeConfig,
    waiters: BTreeMap<u64, Waiter<SM::Response>>,
    metrics: Arc<Metrics>,
    status: Arc<RwLock<NodeStatus>>,
    applied: u64,
    since_checkpoint: u64,
    poisoned: Option<String>,
}

impl<SM: StateMachine> Driver<SM> {
    pub(crate) fn new(
        config: NodeConfig,
        store: LogStore,
        sm: SM,
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
        let driver = Driver {
            raw,
            sm,
            config,
            waiters: BTreeMap::new(),
            metrics,
            status,
            applied,
            since_checkpoint: 0,
            poisoned: None,
        };
        driver.publish_status();
        Ok(driver)
    }

    /// The node loop. Returns after a stop request, or when every handle is gone.
    pub(crate) async fn run(
        mut self,
        mut queue: mpsc::Receiver<Proposal<SM::Response>>,
        mut stop: watch::Receiver<bool>,
    ) {
        let mut ticker = tokio::time::interval(self.config.tick_interval);
        ticker.set_missed_tick_behavior(MissedTickBehavior::Delay);
        self.step();
        loop {
            // Biased: a stop request wins, and ticks (at most one per interval) cannot be
            // starved by a constant stream of proposals.
            tokio::select! {
                biased;
                _ = stop.changed() => break,
                _ = ticker.tick() => {
                    if self.poisoned.is_none() {
                        self.raw.tick();
                    }
                }
                first = queue.recv() => {
                    let Some(first) = first else { break };
                    self.propose(first);
                    for _ in 1..self.config.max_batch {
                        match queue.try_recv() {
                            Ok(next) => self.propose(next),
                            Err(_) => break,
                        }
                    }
                }
            }
            self.step();
        }
        self.finish(queue);
    }

    /// Gives up before running (the runtime could not be built).
    pub(crate) fn abandon(mut self, reason: String) {
        self.poison(Error::Config(reason));
    }

    fn propose(&mut self, p: Proposal<SM::Response>) {
        Metrics::add(&self.metrics.proposals, 1);
        let outcome = if let Some(reason) = &self.poisoned {
            Err(ProposeError::Failed(reason.clone()))
        } else if p.command.is_empty() {
            Err(ProposeError::Dropped(
                "empty commands are not allowed".into(),
            ))
        } else if self.raw.raft.state != StateRole::Leader {
            Err(ProposeError::Dropped(format!(
                "node {} is not the leader (leader: {})",
                self.config.id, self.raw.raft.leader_id
            )))
        } else {
            let before = self.raw.raft.raft_log.last_index();
            match self.raw.propose(vec![], p.command) {
                Err(e) => Err(ProposeError::Dropped(e.to_string())),
                Ok(()) if self.raw.raft.raft_log.last_index() == before => Err(
                    ProposeError::Dropped("raft did not append the proposal".into()),
                ),
                Ok(()) => {
                    let index = self.raw.raft.raft_log.last_index();
                    let waiter = Waiter {
                        term: self.raw.raft.term,
                        reply: p.reply,
                    };
                    if let Some(old) = self.waiters.insert(index, waiter) {
                        let _ = old.reply.send(Err(ProposeError::Dropped(
                            "log index reused by a newer proposal".into(),
                        )));
                    }
                    return;
                }
            }
        };
        // The proposer may have given up waiting; nothing to do then.
        let _ = p.reply.send(outcome);
    }

    /// Processes all pending Readies; poisons the node on failure.
    fn step(&mut self) {
        if self.poisoned.is_some() {
            return;
        }
        if let Err(e) = self.process_ready() {
            self.poison(e);
        }
        self.publish_status();
    }

    fn process_ready(&mut self) -> Result<()> {
        while self.raw.has_ready() {
            let mut ready = self.raw.ready();
            self.send_messages(ready.take_messages());
            if !ready.snapshot().is_empty() {
                return Err(Error::Unsupported(
                    "installing a Raft snapshot (the state machine cannot restore one yet)".into(),
                ));
            }
            self.apply(ready.take_committed_entries())?;

            let store = self.raw.mut_store();
            let written = store.append(ready.entries(), ready.hs())?;
            if written > 0 {
                Metrics::add(&self.metrics.log_writes, 1);
                Metrics::add(&self.metrics.log_bytes, written);
            }
            if ready.must_sync() {
                store.sync()?;
                Metrics::add(&self.metrics.log_fsyncs, 1);
                if let Some(delay) = self.config.fsync_delay {
                    std::thread::sleep(delay);
                }
            }
            self.send_messages(ready.take_persisted_messages());

            let mut light = self.raw.advance(ready);
            if let Some(commit) = light.commit_index() {
                // Persist (write) the commit index before applying what it covers.
                let written = self.raw.mut_store().set_commit(commit)?;
                Metrics::add(&self.metrics.log_writes, 1);
                Metrics::add(&self.metrics.log_bytes, written);
            }
            self.send_messages(light.take_messages());
            self.apply(light.take_committed_entries())?;
            self.raw.advance_apply();

            if self.raw.raft.state != StateRole::Leader && !self.waiters.is_empty() {
                self.fail_waiters(|| {
                    ProposeError::Unknown("leadership lost before the entry was applied".into())
                });
            }
            if self.since_checkpoint >= self.config.checkpoint_entries {
                self.checkpoint()?;
            }
        }
        Ok(())
    }

    /// Hands outgoing Raft messages to the peer transport. There is none yet (single node), so
    /// they are only traced; a transport plugs in here, and reports failures back through
    /// `report_unreachable` / `report_snapshot`.
    fn send_messages(&mut self, msgs: Vec<Message>) {
        for msg in msgs {
            tracing::trace!(to = msg.to, kind = ?msg.get_msg_type(), "raft message (no transport)");
        }
    }

    /// Applies committed entries, then publishes the status and only then answers their
    /// waiters, so a proposer that hears back sees a status covering its entry.
    fn apply(&mut self, entries: Vec<Entry>) -> Result<()> {
        let mut replies = Vec::new();
        let result = self.apply_entries(entries, &mut replies);
        if !replies.is_empty() {
            self.publish_status();
        }
        for (reply, outcome) in replies {
            let _ = reply.send(outcome);
        }
        result
    }

    fn apply_entries(
        &mut self,
        entries: Vec<Entry>,
        replies: &mut Vec<Answer<SM::Response>>,
    ) -> Result<()> {
        for entry in entries {
            let (index, term) = (entry.index, entry.term);
            Metrics::add(&self.metrics.committed_entries, 1);
            let response = match entry.get_entry_type() {
                EntryType::EntryNormal if entry.data.is_empty() => None,
                EntryType::EntryNormal => Some(
                    self.sm
                        .apply(index, &entry.data)
                        .map_err(Error::StateMachine)?,
                ),
                EntryType::EntryConfChange => {
                    let cc = ConfChange::parse_from_bytes(&entry.data)?;
                    let cs = self.raw.apply_conf_change(&cc)?;
                    self.raw.mut_store().set_conf_state(cs)?;
                    None
                }
                EntryType::EntryConfChangeV2 => {
                    let cc = ConfChangeV2::parse_from_bytes(&entry.data)?;
                    let cs = self.raw.apply_conf_change(&cc)?;
                    self.raw.mut_store().set_conf_state(cs)?;
                    None
                }
            };
            self.applied = index;
            self.since_checkpoint += 1;
            if let Some(waiter) = self.waiters.remove(&index) {
                let outcome = match response {
                    Some(r) if waiter.term == term => Ok(r),
                    _ => Err(ProposeError::Dropped(format!(
                        "log index {index} was taken by another entry (term {term}, proposed in \
                         term {})",
                        waiter.term
                    ))),
                };
                replies.push((waiter.reply, outcome));
            }
        }
        Ok(())
    }

    /// Checkpoints the state machine and compacts the log up to what the checkpoint covers.
    fn checkpoint(&mut self) -> Result<()> {
        let covered = self.sm.checkpoint().map_err(Error::StateMachine)?;
        Metrics::add(&self.metrics.checkpoints, 1);
        self.since_checkpoint = 0;
        let deleted = self.raw.mut_store().compact(covered.min(self.applied))?;
        tracing::debug!(covered, deleted, "checkpointed and compacted the Raft log");
        Ok(())
    }

    /// Clean shutdown: refuse what is still queued, checkpoint, answer every waiter.
    fn finish(mut self, mut queue: mpsc::Receiver<Proposal<SM::Response>>) {
        queue.close();
        while let Ok(p) = queue.try_recv() {
            let _ = p
                .reply
                .send(Err(ProposeError::Failed("node shut down".into())));
        }
        if self.poisoned.is_none() {
            let result = self.raw.mut_store().sync().and_then(|()| {
                if self.since_checkpoint > 0 {
                    self.checkpoint()
                } else {
                    Ok(())
                }
            });
            if let Err(e) = result {
                self.poison(e);
            }
        }
        self.fail_waiters(|| ProposeError::Unknown("node shut down".into()));
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
        self.fail_waiters(|| ProposeError::Failed(reason.clone()));
    }

    fn fail_waiters(&mut self, err: impl Fn() -> ProposeError) {
        for (_, waiter) in mem::take(&mut self.waiters) {
            let _ = waiter.reply.send(Err(err()));
        }
    }

    fn publish_status(&self) {
        let raft = &self.raw.raft;
        let role = match raft.state {
            StateRole::Leader => "leader",
            StateRole::Follower => "follower",
            StateRole::Candidate => "candidate",
            StateRole::PreCandidate => "pre-candidate",
        };
        *self.status.write() = NodeStatus {
            id: self.config.id,
            leader_id: raft.leader_id,
            term: raft.term,
            commit_index: raft.raft_log.committed,
            applied_index: self.applied,
            role: role.to_string(),
            poisoned: self.poisoned.clone(),
        };
    }
}
