//! Streams as SQL tables.
//!
//! This crate turns SQL into reads and replicated writes: it parses and
//! classifies statements ([`statement`]), runs queries through DataFusion
//! over the stream segments ([`stream_provider`]), builds appends ([`insert`],
//! [`copy`]; rows travel as Arrow IPC bytes, [`ipc`]) and proposes them as [`command`]s through the Raft node; the
//! state machine ([`apply`]) applies committed commands to the [`catalog`]
//! and storage. Mutable tables and transactions over them live in
//! [`table`]. [`session`] is one client's view; [`engine`] is what all
//! sessions share. What bounds a running statement — cancel and
//! `statement_timeout` ([`interrupt`]), its memory ([`memory`]), the size of
//! one value ([`value_size`]) — is checked here too. It knows nothing of the
//! Postgres wire protocol.

#![cfg_attr(test, allow(clippy::unwrap_used))]

mod alter;
pub mod apply;
pub mod arithmetic;
pub mod ast;
pub mod backup;
pub mod binary;
pub mod block_catalog;
pub mod catalog;
pub mod checked_fn;
pub mod command;
mod compiled_values;
pub mod complexity;
pub mod copy;
pub mod copy_columns;
pub mod definition;
pub mod engine;
pub mod error;
pub mod executor;
pub mod format;
pub mod insert;
pub mod interrupt;
pub mod ipc;
pub mod memory;
pub mod notify;
pub mod param_type;
mod pushdown;
pub mod retention;
pub mod roles;
pub mod scram;
pub mod session;
pub mod settings;
pub mod statement;
pub mod stream_provider;
pub mod system;
pub mod table;
pub mod tail;
pub mod types;
pub mod units;
pub mod value_size;
pub mod views;

pub use engine::{Engine, EngineConfig, Limits};
pub use error::{Error, Result};
pub use session::{CopyIn, Output, PendingCopy, Session, TxnStatus};

/// The PostgreSQL version Sluice reports to clients.
pub const SERVER_VERSION: &str = "16.6";
pub const SERVER_VERSION_NUM: &str = "160006";
