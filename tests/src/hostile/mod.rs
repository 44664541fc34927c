//! A mixed hostile load beside honest writers (issue 20, acceptance 3): one `sluice serve`,
//! eight writers appending to stream `w` alone (the baseline), then the same writers beside
//! hostile clients (the disturbed phase):
//!
//! - **fuzz**: raw sockets sending random and mutated frontend messages, before and after
//!   startup, reconnecting after every close;
//! - **deep**: statements nested thousands deep and statements of 1–4 MB;
//! - **hungry**: queries asking for more memory or time than a statement may have;
//! - **cancel**: long queries cancelled after 10–500 ms, ended by a short
//!   `statement_timeout`, or abandoned by a client that disconnects;
//! - **idle**: sockets that never finish startup.
//!
//! It measures the writers' throughput and latency in both phases, the server's memory and
//! CPU, and every hostile attempt's outcome (expected SQLSTATEs, or unexpected: a lost
//! connection, `XX000`, a forbidden success, no answer). Afterwards every acknowledged
//! `(k, offset)` must be in `w` at that offset, offsets gapless — on the running server and
//! again after a SIGTERM and restart. Findings are anomalies, never panics: lost or moved
//! rows, writer throughput below half the baseline's, RSS above `--rss-bound`, unexpected
//! outcomes, panic lines in the server's log, a server that died.
//!
//! Short mode (CI, ~30 s): `cargo test -p sluice-tests --test hostile_load`. Long mode
//! (build the server first: `cargo build -p sluice-server --bin sluice`):
//!
//! ```text
//! cargo run -p sluice-tests --bin sluice-hostile -- --secs 600 --baseline-secs 120 \
//!     --server-arg=--max-statement-memory=256MB --out bench/results/hostile-$(date +%Y%m%d-%H%M).md
//! ```

pub mod clients;
pub mod fuzz;
pub mod idle;
pub mod login;
pub mod monitor;
pub mod process;
pub mod report;
pub mod run;
pub mod statements;
pub mod tally;
pub mod timeline;
pub mod verify;
pub mod writers;

pub use run::{run, Config, RunReport};
