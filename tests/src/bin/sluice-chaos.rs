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

/// `$SLUICE_BIN`, else the `sluice` built beside this binary, else the test harness's
/// search.
fn server_binary() -> PathBuf {
    if let Some(bin) = std::env::var_os(sluice_tests::BIN_ENV) {
        return PathBuf::from(bin);
    }
    let beside = std::env::current_exe()
        .ok()
        .and_then(|exe| Some(exe.parent()?.join("sluice")));
    match beside {
        Some(b) if b.is_file() => b,
        _ => sluice_tests::binary_path(),
    }
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
        binary: Some(server_binary()),
        ..chaos::Config::default()
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_all()
        .build()
        .expect("tokio runtime");
    // Ctrl-C drops the run, which kills the nodes and removes their directories.
    let result = runtime.block_on(async {
        tokio::select! {
            r = chaos::run(config) => Some(r),
            _ = tokio::signal::ctrl_c() => None,
        }
    });
    let Some(result) = result else {
        eprintln!("interrupted");
        std::process::exit(130);
    };
    print!("{}", report::summary(&result));
    if let Some(out) = &args.out {
        if let Some(dir) = out.parent().filter(|d| !d.as_os_str().is_empty()) {
            let _ = std::fs::create_dir_all(dir);
        }
        match std::fs::write(out, report::markdown(&result)) {
            Ok(()) => println!("report written to {}", out.display()),
            Err(e) => {
                eprintln!("write {}: {e}", out.display());
                std::process::exit(2);
            }
        }
    }
    std::process::exit(i32::from(!result.anomalies.is_empty()));
}
