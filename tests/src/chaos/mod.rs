//! A small Jepsen: fault injection against a cluster of real `sluice` processes on
//! loopback, with a checker for what Sluice promises.
//!
//! Each round heals and settles the cluster, runs the load (six closed-loop appenders, a
//! COPY tail on every node, bank transfers and a reader of the bank's total), injects one
//! nemesis for a few seconds — kill-leader, kill-random, pause-leader, partition-leader,
//! partition-follower, bridge, one-way, terminate-leader, join-kill, join-pause, readd,
//! replace, snapshot-tail — heals, and checks:
//!
//! - every node's `chaos_log` is identical, gapless from offset 0, `ts` never decreasing;
//! - every acknowledged append is there exactly once at its acknowledged offset; no append
//!   refused with a "certainly not applied" SQLSTATE (40001, 57P03, classes 42, 22, 23, 25,
//!   0A, 55) is there; unknown outcomes (timeouts, lost connections, 40003) are counted;
//! - every COPY tail is gapless, a prefix of the log, and catches up once the load stops;
//! - the bank's total never changes on any node;
//! - no two nodes lead in the same term (each node is asked every 200 ms);
//! - leader kills fail over within 5 s, and every membership change is followed by an
//!   acknowledged append within 5 s; failover time and write availability are measured.
//!
//! Findings are collected as anomalies, never panics. The network is [`net`]'s
//! per-destination proxies, so directed cuts work for joined nodes too.
//!
//! Short mode (CI, one round per nemesis): `cargo test -p sluice-tests --test chaos`.
//! Long mode (build the server first: `cargo build -p sluice-server --bin sluice`):
//!
//! ```text
//! cargo run -p sluice-tests --bin sluice-chaos -- --rounds 100 --seed 7 \
//!     --out bench/results/chaos-$(date +%Y%m%d-%H%M).md
//! ```
//!
//! `--nemeses a,b,c` picks nemeses, `--nodes N` the cluster size; the seed fixes the order
//! of nemeses and their targets. The binary exits non-zero on any anomaly and keeps the
//! nodes' data and logs for inspection.

pub mod checker;
pub mod control;
pub mod history;
pub mod nemesis;
pub mod net;
pub mod report;
pub mod run;
pub mod workload;

pub use nemesis::Nemesis;
pub use run::{run, Anomaly, Config, RunReport};
