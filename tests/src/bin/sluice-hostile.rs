//! Runs the hostile load (see `sluice_tests::hostile`) against a real `sluice` process and
//! writes a markdown report; exits 1 if anything was found.
//!
//! ```text
//! cargo build -p sluice-server --bin sluice
//! cargo run -p sluice-tests --bin sluice-hostile -- --secs 600 --baseline-secs 120 \
//!     --server-arg=--max-statement-memory=256MB --out bench/results/hostile-$(date +%Y%m%d-%H%M).md
//! ```

use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;
use sluice_tests::hostile::{self, report};

#[derive(Parser, Debug)]
#[command(
    about = "Eight writers beside fuzzed messages, deep statements, memory-hungry \
                   queries and cancels, against one local Sluice server"
)]
struct Args {
    /// Seed of the hostile clients' choices
    #[arg(long, default_value_t = 7)]
    seed: u64,
    /// Seconds of the disturbed phase (writers beside the hostile clients)
    #[arg(long, default_value_t = 600)]
    secs: u64,
    /// Seconds of the baseline phase (writers alone)
    #[arg(long, default_value_t = 120)]
    baseline_secs: u64,
    /// Writer connections
    #[arg(long, default_value_t = 8)]
    writers: usize,
    /// Fuzzed-message clients
    #[arg(long, default_value_t = 4)]
    fuzzers: usize,
    /// Deep-statement clients
    #[arg(long, default_value_t = 2)]
    deep: usize,
    /// Memory-hungry query clients
    #[arg(long, default_value_t = 2)]
    hungry: usize,
    /// Cancel and disconnect clients
    #[arg(long, default_value_t = 2)]
    cancels: usize,
    /// Sockets that never finish startup
    #[arg(long, default_value_t = 20)]
    idle: usize,
    /// statement_timeout of every hostile session, in milliseconds
    #[arg(long, default_value_t = 5000)]
    hostile_timeout_ms: u64,
    /// An anomaly if the server's RSS goes above this many bytes
    #[arg(long)]
    rss_bound: Option<u64>,
    /// An argument for `sluice serve` (repeatable), e.g. --server-arg=--max-statement-memory=256MB
    #[arg(long = "server-arg", allow_hyphen_values = true)]
    server_args: Vec<String>,
    /// Markdown report to write
    #[arg(long)]
    out: Option<PathBuf>,
    /// Keep the data directory and server log even if nothing was found
    #[arg(long)]
    keep: bool,
}

fn main() {
    let args = Args::parse();
    eprintln!(
        "sluice-hostile: server binary {}",
        sluice_tests::binary_path().display()
    );
    let config = hostile::Config {
        seed: args.seed,
        baseline: Duration::from_secs(args.baseline_secs),
        disturbed: Duration::from_secs(args.secs),
        writers: args.writers,
        fuzzers: args.fuzzers,
        deep: args.deep,
        hungry: args.hungry,
        cancels: args.cancels,
        idle: args.idle,
        hostile_timeout: Duration::from_millis(args.hostile_timeout_ms),
        server_args: args.server_args,
        rss_bound: args.rss_bound,
        keep: args.keep,
        ..hostile::Config::default()
    };
    sluice_tests::suite::run_to_report(
        hostile::run(config),
        args.out.as_deref(),
        report::summary,
        report::markdown,
        |r| !r.anomalies.is_empty(),
    )
}
