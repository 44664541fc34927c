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

/// `$SLUICE_BIN`, else the `sluice` built beside this binary, else the test harness's
/// search.
fn server_binary() -> Option<PathBuf> {
    if std::env::var_os(sluice_tests::BIN_ENV).is_some() {
        return None;
    }
    let beside = std::env::current_exe()
        .ok()
        .and_then(|exe| Some(exe.parent()?.join("sluice")))?;
    beside.is_file().then_some(beside)
}

fn main() {
    let args = Args::parse();
    // The hostile module starts the server through the harness, which reads SLUICE_BIN.
    if let Some(bin) = server_binary() {
        std::env::set_var(sluice_tests::BIN_ENV, bin);
    }
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
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_all()
        .build()
        .expect("tokio runtime");
    // Ctrl-C drops the run, which kills the server and removes its directory.
    let result = runtime.block_on(async {
        tokio::select! {
            r = hostile::run(config) => Some(r),
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
