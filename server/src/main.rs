//! The `sluice` binary: a replicated log database that speaks the
//! PostgreSQL wire protocol.
//!
//! `sluice serve` recovers the data directory, starts the Raft node and
//! accepts Postgres clients until SIGTERM or Ctrl-C, then stops accepting,
//! lets open connections finish (bounded), and checkpoints on the way out.
//! `sluice backup` asks a running server for an online backup and `sluice
//! restore` builds a data directory from one (see `sluice_sql::backup`).
//! Each accepted socket is admitted (or refused) from accept on, see
//! `sluice_server::admission`; panics are logged once per location, see
//! `sluice_server::panics`.

#![cfg_attr(test, allow(clippy::unwrap_used))]

use std::io::Write;
use std::time::Duration;

use clap::{Parser, Subcommand};
use sluice_sql::{Engine, EngineConfig, Limits};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use sluice_server::admission::{self, Admission, Admit, REFUSALS};
use sluice_server::auth::Auth;
use sluice_server::config::{Config, ServeArgs};
use sluice_server::handler::Backend;
use sluice_server::{accept, connection, logging, metrics, panics};

/// mimalloc: the hot paths (one INSERT, one COPY batch) allocate and free many small
/// buffers across tokio worker threads, where glibc malloc spends a tenth of the CPU.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser)]
#[command(
    name = "sluice",
    version,
    about = "A replicated log database that speaks the PostgreSQL protocol"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run a Sluice server
    Serve(Box<ServeArgs>),
    /// Ask a running server for an online backup of its node, written by the server into a
    /// directory on its machine (superuser only)
    Backup(BackupArgs),
    /// Build a new data directory from a backup (offline); `sluice serve --data-dir` it
    Restore(RestoreArgs),
}

#[derive(clap::Args)]
struct BackupArgs {
    /// The directory the server writes the backup into (absent or empty; made absolute
    /// from this command's working directory)
    #[arg(long)]
    to: std::path::PathBuf,
    #[arg(long, default_value = "127.0.0.1")]
    host: String,
    #[arg(long, default_value_t = 5499)]
    port: u16,
    #[arg(long, default_value = "sluice")]
    user: String,
    #[arg(long, default_value = "sluice")]
    dbname: String,
}

#[derive(clap::Args)]
struct RestoreArgs {
    /// A backup directory written by `sluice backup`
    #[arg(long)]
    from: std::path::PathBuf,
    /// The new data directory (absent or empty)
    #[arg(long)]
    data_dir: std::path::PathBuf,
}

fn main() {
    let cli = Cli::parse();
    let args = match cli.command {
        Command::Serve(args) => *args,
        Command::Backup(args) => exit_with(backup(&args)),
        Command::Restore(args) => exit_with(restore(&args)),
    };
    if let Err(e) = logging::init(args.log_format, args.log_level.as_deref()) {
        eprintln!("sluice: {e}");
        std::process::exit(2);
    }
    panics::install();
    let config = match Config::resolve(args) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("sluice: {e}");
            std::process::exit(2);
        }
    };
    // Two runtimes (see sluice_sql::executor): a few threads serve
    // connections, whose requests are short and latency-bound (more
    // workers only steal from and wake each other); query plans run on a
    // runtime with a thread per core, at a lower scheduling priority, so that
    // queries use idle cores but never starve connections, the Raft node or
    // its fsyncs (their threads keep the normal priority).
    let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
    sluice_consensus::spin::set_budget(config.commit_spin);
    without_transparent_huge_pages();
    let queries = match runtime("sluice-query", cores, QUERY_NICE, false) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("sluice: cannot start the query runtime: {e}");
            std::process::exit(1);
        }
    };
    let connections = match runtime("sluice-conn", (cores / 2).max(1), 0, true) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("sluice: cannot start the runtime: {e}");
            std::process::exit(1);
        }
    };
    let served = connections.block_on(serve(config, queries.handle().clone()));
    drop(connections);
    queries.shutdown_background();
    if let Err(e) = served {
        eprintln!("sluice: {e}");
        std::process::exit(1);
    }
}

/// Prints a one-line outcome and exits: 0, or 1 with the error on stderr.
fn exit_with(outcome: Result<String, String>) -> ! {
    match outcome {
        Ok(line) => {
            println!("{line}");
            std::process::exit(0)
        }
        Err(e) => {
            eprintln!("sluice: {e}");
            std::process::exit(1)
        }
    }
}

/// `sluice backup`: `SELECT * FROM sluice_backup(dir)` on the server (password from
/// `PGPASSWORD`; no TLS).
fn backup(args: &BackupArgs) -> Result<String, String> {
    let dir = std::path::absolute(&args.to).map_err(|e| format!("{}: {e}", args.to.display()))?;
    let dir_text = dir
        .to_str()
        .ok_or_else(|| format!("{} is not valid UTF-8", dir.display()))?;
    let mut config = tokio_postgres::Config::new();
    config
        .host(&args.host)
        .port(args.port)
        .user(&args.user)
        .dbname(&args.dbname)
        .application_name("sluice backup");
    if let Ok(password) = std::env::var("PGPASSWORD") {
        config.password(password);
    }
    let sql = format!(
        "SELECT * FROM sluice_backup('{}')",
        dir_text.replace('\'', "''")
    );
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    let row = runtime.block_on(async {
        let (client, connection) = config
            .connect(tokio_postgres::NoTls)
            .await
            .map_err(|e| format!("cannot connect to {}:{}: {e}", args.host, args.port))?;
        tokio::spawn(connection);
        let messages = client
            // a server-wide statement_timeout would cut a large backup short
            .simple_query(&format!("SET statement_timeout = 0; {sql}"))
            .await
            .map_err(|e| match e.as_db_error() {
                Some(db) => format!("{} ({})", db.message(), db.code().code()),
                None => e.to_string(),
            })?;
        messages
            .into_iter()
            .find_map(|m| match m {
                tokio_postgres::SimpleQueryMessage::Row(r) => Some(r),
                _ => None,
            })
            .ok_or_else(|| "the server answered no row".to_string())
    })?;
    let field = |i: usize| row.get(i).unwrap_or("?").to_string();
    Ok(format!(
        "backup at index {}: {} streams, {} tables, {} bytes in {}",
        field(0),
        field(1),
        field(2),
        field(3),
        args.to.display()
    ))
}

/// `sluice restore`.
fn restore(args: &RestoreArgs) -> Result<String, String> {
    let absolute =
        |p: &std::path::Path| std::path::absolute(p).map_err(|e| format!("{}: {e}", p.display()));
    let index = sluice_sql::backup::restore(&absolute(&args.from)?, &absolute(&args.data_dir)?)
        .map_err(|e| e.message)?;
    Ok(format!(
        "restored index {index} into {}",
        args.data_dir.display()
    ))
}

/// The niceness of the query runtime's threads: under contention the normal-priority
/// threads (connections, Raft, fsync) get most of the CPU; idle cores still run queries.
const QUERY_NICE: i32 = 10;

/// A runtime of `threads` workers at niceness `nice`; with `spin_for_commits` a worker about
/// to sleep while a commit is moments away spins for it first (see sluice_consensus::spin).
fn runtime(
    name: &str,
    threads: usize,
    nice: i32,
    spin_for_commits: bool,
) -> std::io::Result<tokio::runtime::Runtime> {
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    builder
        .worker_threads(threads)
        .thread_name(name)
        // statements are parsed, planned and run on these threads (see sluice_sql::complexity)
        .thread_stack_size(sluice_sql::complexity::STACK_BYTES)
        .enable_all();
    if nice != 0 {
        builder.on_thread_start(move || lower_priority(nice));
    }
    if spin_for_commits {
        builder.on_thread_park(sluice_consensus::spin::before_park);
    }
    builder.build()
}

/// Turns transparent huge pages off for the whole process (`prctl(PR_SET_THP_DISABLE)`,
/// which the kernel honours even where the allocator asks for them with `madvise`), as
/// latency-bound servers such as Redis and MongoDB advise: mimalloc asks for huge pages for
/// its arenas, and the first touch of each fresh 2 MiB page is a page fault that zeroes all
/// of it — on a VM, milliseconds during which the thread that touched it (often the Raft
/// thread between its log write and its fsync) does nothing else (measurements in
/// docs/architecture.md, server/). Logs once if the kernel refuses.
fn without_transparent_huge_pages() {
    if let Err(e) = rustix::thread::disable_transparent_huge_pages(true) {
        tracing::warn!(
            "cannot turn transparent huge pages off ({e}): first touches of allocator memory \
             may stall commits for milliseconds"
        );
    }
}

/// Gives the calling thread niceness `nice` (Linux applies setpriority to a thread id);
/// logs once if it cannot, and the thread runs at the normal priority.
fn lower_priority(nice: i32) {
    static WARNED: std::sync::Once = std::sync::Once::new();
    let tid = rustix::thread::gettid();
    if let Err(e) = rustix::process::setpriority_process(Some(tid), nice) {
        WARNED.call_once(|| {
            tracing::warn!(
                "cannot lower the query threads' priority ({e}): they compete with writes"
            );
        });
    }
}

async fn serve(config: Config, queries: tokio::runtime::Handle) -> Result<(), String> {
    let mut engine_config = EngineConfig::single_node(config.data_dir.clone());
    engine_config.query_runtime = Some(queries);
    engine_config.superuser = config.superuser.clone();
    engine_config.node.id = config.node_id;
    engine_config.node.voters = if config.join {
        Vec::new()
    } else if config.peers.is_empty() {
        vec![config.node_id]
    } else {
        config.peers.keys().copied().collect()
    };
    engine_config.node.peers = config.peers.clone();
    engine_config.node.cluster_secret = config.cluster_secret.clone();
    engine_config.node.peer_tls = config.peer_tls.clone();
    engine_config.node.fsync_delay = config.fsync_delay;
    engine_config.segment_bytes = config.segment_bytes;
    engine_config.node.checkpoint_entries = config.checkpoint_entries;
    engine_config.limits = Limits {
        max_row_bytes: config.max_row_bytes,
        max_statement_bytes: config.max_statement_bytes,
        copy_chunk_bytes: config.copy_chunk_bytes,
        max_copy_bytes: config.max_copy_bytes,
        copy_idle_timeout: config.copy_idle_timeout,
        max_statement_memory: config.max_statement_memory,
        max_query_memory: config.max_query_memory,
        max_spill_bytes: 2 * config.max_statement_memory as u64,
        statement_timeout: config.statement_timeout,
        log_min_duration: config.log_min_duration,
        ..Limits::default()
    };
    // the TLS files are read before anything is opened, so a bad one stops the start at once
    let auth = Auth::new(&config)?;
    let engine = Engine::open(engine_config)
        .map_err(|e| format!("cannot open {}: {e}", config.data_dir.display()))?;
    tokio::time::timeout(Duration::from_secs(600), engine.wait_ready())
        .await
        .map_err(|_| "recovery did not finish within 10 minutes".to_string())?
        .map_err(|e| format!("recovery failed: {e}"))?;
    sluice_sql::retention::start(&engine);
    let listener = TcpListener::bind(config.listen)
        .await
        .map_err(|e| format!("cannot listen on {}: {e}", config.listen))?;
    let addr = listener.local_addr().map_err(|e| e.to_string())?;
    let shutdown = CancellationToken::new();
    if let Some(metrics_addr) = config.metrics_listen {
        let metrics_listener = TcpListener::bind(metrics_addr)
            .await
            .map_err(|e| format!("cannot listen on {metrics_addr} for metrics: {e}"))?;
        let metrics_addr = metrics_listener.local_addr().map_err(|e| e.to_string())?;
        tracing::info!(%metrics_addr, "metrics endpoint ready");
        // before "listening on", which tests and scripts wait for
        println!("metrics on {metrics_addr}");
        tokio::spawn(metrics::serve(
            metrics_listener,
            engine.clone(),
            shutdown.clone(),
        ));
    }
    tracing::info!(%addr, data_dir = %config.data_dir.display(), "sluice ready");
    println!("listening on {addr}");
    let _ = std::io::stdout().flush();

    warn_if_short_of_descriptors(config.max_connections);
    if let Some(name) = config.test_panic_application_name.clone() {
        panics::set_test_trigger(name);
    }

    let backend = Backend::new(engine.clone(), auth, config.max_connections);
    let admission = Admission::new(config.max_connections, config.authentication_timeout);
    let tracker = TaskTracker::new();
    tokio::spawn(watch_signals(shutdown.clone()));

    accept::run(&listener, &shutdown, |socket, peer| {
        match admission.admit() {
            Admit::Ticket(ticket) => {
                let _ = socket.set_nodelay(true);
                let backend = backend.clone();
                tracker.spawn(async move {
                    if let Err(e) = connection::serve(socket, peer, backend, ticket).await {
                        tracing::debug!(%peer, "connection ended: {e}");
                    }
                });
            }
            Admit::Full => admission::refuse_now(socket),
        }
    })
    .await;
    tracing::info!("shutting down");
    engine.step_down().await;
    tracker.close();
    if tokio::time::timeout(Duration::from_secs(5), tracker.wait())
        .await
        .is_err()
    {
        tracing::warn!("connections still open after 5s; closing them");
    }
    engine.shutdown().await;
    tracing::info!("stopped");
    Ok(())
}

/// Warns when the open-file limit (`ulimit -n`) leaves too few descriptors for
/// `max_connections` sockets next to the ones the server holds already (Linux only: read from
/// `/proc/self`). Past the limit accept fails and is retried (see `sluice_server::accept`),
/// but the storage engine may fail to open a file too.
fn warn_if_short_of_descriptors(max_connections: usize) {
    /// Descriptors the engine may open beyond those open at startup.
    const HEADROOM: usize = 64;
    let Some(limit) = open_file_limit() else {
        return;
    };
    let in_use = std::fs::read_dir("/proc/self/fd").map_or(0, |d| d.count());
    let needed = in_use + max_connections + REFUSALS + HEADROOM;
    if needed > limit {
        tracing::warn!(
            "the open-file limit is {limit} but --max-connections {max_connections} may need \
             about {needed} descriptors ({in_use} in use now, {REFUSALS} for refusing clients \
             over the limit, {HEADROOM} for the engine): raise `ulimit -n` or lower \
             --max-connections"
        );
    }
}

/// The soft limit on open files, from `/proc/self/limits`.
fn open_file_limit() -> Option<usize> {
    let limits = std::fs::read_to_string("/proc/self/limits").ok()?;
    let line = limits.lines().find(|l| l.starts_with("Max open files"))?;
    line["Max open files".len()..]
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

async fn watch_signals(token: CancellationToken) {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = tokio::signal::ctrl_c() => {}
                    _ = term.recv() => {}
                }
            }
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
    token.cancel();
}
