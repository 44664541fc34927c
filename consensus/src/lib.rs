//! `sluice-consensus`: the Raft node that orders Sluice's commands.
//!
//! One OS thread owns raft-rs's `RawNode` and the application's [`StateMachine`]
//! ([`node`]); everyone else talks to it through a bounded proposal queue via a cheap,
//! cloneable [`NodeHandle`]. Nodes of a cluster talk over [`transport`] (TCP, authenticated by
//! a shared cluster secret in [`peer_auth`], mutual TLS in [`peer_tls`], or both); a follower
//! forwards proposals to the leader, and a lagging one is caught up with a snapshot. Proposals that queue up while a log write is being fsynced go into
//! the next write together (group commit). The Raft log is durable in [`wal`] segment files and
//! compacted up to each state-machine checkpoint. Commands are opaque bytes to this crate: it
//! guarantees only that every replica applies the same commands in the same order, and that a
//! proposer hears success only for a command that is durably committed and applied.

// Tests may unwrap; the library build (also linted) may not.
#![cfg_attr(test, allow(clippy::unwrap_used))]

pub mod error;
mod log_store;
mod logging;
pub mod metrics;
pub mod node;
pub mod peer_auth;
pub mod peer_tls;
pub mod spin;
pub mod transport;
pub mod wal;

pub use error::{Error, Result};
pub use metrics::Metrics;
pub use node::{
    start, Membership, NodeConfig, NodeHandle, NodeStatus, PeerStatus, ProposeError, StateMachine,
    Unavailable,
};
pub use peer_auth::ClusterSecret;
pub use peer_tls::PeerTls;
