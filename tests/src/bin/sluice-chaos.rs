//! Runs the chaos suite (see `sluice_tests::chaos`) against real `sluice` processes and
//! writes a markdown report; exits 1 if anything was found.
//!
//! ```text
//! cargo build -p sluice-server --bin sluice
//! cargo run -p sluice-tests --bin sluice-chaos -- --rounds 100 --seed 7 \
//!     --out bench/results/chaos-$(date +%Y%m%d-%H%M).md
//! ```

use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;
use sluice_tests::chaos::{self, report, Nemesis};

#[derive(Parser, Debug)]
#[command(about = "Fault injection against a local Sluice cluster, with a history checker")]
struct Args {
    /// Rounds to run (one nemesis each)
    #[arg(long, default_value_t = 13)]
    rounds: usize,
    /// Seed for the order of nemeses and their targets
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Comma-separated nemeses (default: all)
    #[arg(long, value_delimiter = ',')]
    nemeses: Vec<String>,
    /// Cluster size
    #[arg(long, default_value_t = 3)]
    nodes: u64,
    /// Seconds each timed fault lasts
    #[arg(long, default_value_t = 4)]
    fault_secs: u64,
    /// Markdown report to write
    #[arg(long)]
    out: Option<PathBuf>,
    /// Keep the nodes' data and logs even if nothing was found
    #[arg(long)]
    keep: bool,
}

fn main() {
    let args = Args::parse();
    let nemeses = if args.nemeses.is_empty() {
        Nemesis::ALL.to_vec()
    } else {
        let mut out = Vec::new();
        for name in &args.nemeses {
            match Nemesis::parse(name.trim()) {
                Some(n) => out.push(n),
                None => {
                    let all: Vec<&str> = Nemesis::ALL.iter().map(|n| n.name()).collect();
                    eprintln!("unknown nemesis {name:?}; choose from {}", all.join(","));
                    std::process::exit(2);
                }
            }
        }
        out
    };
    if args.nodes < 3 {
        eprintln!("--nodes must be at least 3");
        std::process::exit(2);
    }
    let config = chaos::Config {
        nodes: args.nodes,
        rounds: args.rounds,
        seed: args.seed,
        nemeses,
        fault: Duration::from_secs(args.fault_secs),
        keep: args.keep,
        binary: Some(sluice_tests::binary_path()),
        ..chaos::Config::default()
    };
    sluice_tests::suite::run_to_report(
        chaos::run(config),
        args.out.as_deref(),
        report::summary,
        report::markdown,
        |r| !r.anomalies.is_empty(),
    )
}
