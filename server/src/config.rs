//! Server configuration: command-line flags, each with a config-file twin.
//!
//! Precedence: a flag given on the command line wins over the config file,
//! which wins over the default. Defaults are safe: loopback only, fsync on,
//! and a server listening beyond loopback refuses to start without a
//! password, and without TLS unless `--allow-unencrypted` says so. An empty password is
//! refused wherever it comes from (flag, `SLUICE_PASSWORD`, file): it would be no password
//! at all. Likewise a cluster whose Raft addresses (`--peers`) are not all loopback refuses
//! to start without a cluster secret, and a secret shorter than 16 bytes is refused.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::Args;
use serde::Deserialize;
use sluice_consensus::peer_auth::is_loopback_address;
use sluice_consensus::{ClusterSecret, PeerTls};

#[derive(Debug, Clone, Args, Default)]
pub struct ServeArgs {
    /// Directory holding the Raft log, segments and checkpoints [default: ./sluice-data]
    #[arg(long)]
    pub data_dir: Option<PathBuf>,
    /// Address for Postgres clients; port 0 picks a free port [default: 127.0.0.1:5499]
    #[arg(long)]
    pub listen: Option<String>,
    /// TOML file with any of these settings (keys as the flags, with underscores)
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Address of the Prometheus endpoint (`GET /metrics`), e.g. 127.0.0.1:9187; port 0
    /// picks a free port. It has no authentication: keep it on loopback or behind a firewall
    /// [default: off]
    #[arg(long, value_name = "HOST:PORT")]
    pub metrics_listen: Option<String>,
    /// This node's id in the Raft group [default: 1]
    #[arg(long)]
    pub node_id: Option<u64>,
    /// Cluster members' Raft addresses as id=host:port,... including this node (which
    /// listens for peers on its own entry). Without it the node runs alone.
    #[arg(long)]
    pub peers: Option<String>,
    /// Join a running cluster: start with no voters and wait for the leader to add this node
    /// (`ALTER CLUSTER ADD NODE id 'host:port'` on any member)
    #[arg(long)]
    pub join: bool,
    /// File holding the secret every cluster member shares (at least 16 bytes; one trailing
    /// newline is ignored), or set SLUICE_CLUSTER_SECRET. Every Raft connection proves it;
    /// required when any --peers address is not loopback
    #[arg(long, value_name = "PATH")]
    pub cluster_secret_file: Option<PathBuf>,
    /// The cluster secret itself. Hidden: a flag's value shows in the process list; set
    /// SLUICE_CLUSTER_SECRET or use --cluster-secret-file
    #[arg(
        long,
        env = "SLUICE_CLUSTER_SECRET",
        hide = true,
        hide_env_values = true
    )]
    pub cluster_secret: Option<String>,
    /// PEM certificate chain of this member (its certificate first, with the serverAuth and
    /// clientAuth extended key usages and its --peers address as a subject alternative
    /// name): mutual TLS on every Raft connection. Needs --peer-key and --peer-ca
    #[arg(long, value_name = "PATH")]
    pub peer_cert: Option<PathBuf>,
    /// PEM private key of `--peer-cert`
    #[arg(long, value_name = "PATH")]
    pub peer_key: Option<PathBuf>,
    /// PEM CA that every member's `--peer-cert` chains to (use a CA of its own: any
    /// certificate it signed can join the Raft port)
    #[arg(long, value_name = "PATH")]
    pub peer_ca: Option<PathBuf>,
    /// How log lines on stderr look: `text`, or `json` (one object per line). Colour codes
    /// are written only when stderr is a terminal
    #[arg(long, value_enum, default_value_t, env = "SLUICE_LOG_FORMAT")]
    pub log_format: crate::logging::LogFormat,
    /// What to log: a level (`debug`) or a filter (`info,sluice_sql=debug`); overrides
    /// SLUICE_LOG [default: info,datafusion=warn]
    #[arg(long, value_name = "FILTER")]
    pub log_level: Option<String>,
    /// The superuser's initial password: with it every login authenticates with
    /// SCRAM-SHA-256 (the password never crosses the connection); without it, loopback
    /// clients are trusted
    #[arg(long, env = "SLUICE_PASSWORD")]
    pub password: Option<String>,
    /// Name of the bootstrap superuser whose initial password `--password` sets
    /// [default: sluice]
    #[arg(long, value_name = "NAME")]
    pub superuser: Option<String>,
    /// PEM certificate chain (the server's certificate first): TLS on the client port
    #[arg(long, value_name = "PATH")]
    pub tls_cert: Option<PathBuf>,
    /// PEM private key of `--tls-cert`
    #[arg(long, value_name = "PATH")]
    pub tls_key: Option<PathBuf>,
    /// PEM CA certificates that client certificates must chain to (then shown in
    /// `pg_stat_ssl`); without it no client certificate is asked for
    #[arg(long, value_name = "PATH")]
    pub tls_client_ca: Option<PathBuf>,
    /// Let clients beyond loopback connect without TLS (refused by default)
    #[arg(long)]
    pub allow_unencrypted: bool,
    /// Maximum concurrent client connections, counted from accept (logged in or not)
    /// [default: 1000]
    #[arg(long)]
    pub max_connections: Option<usize>,
    /// Seconds a client has to complete startup and authentication, 1 to 600 [default: 60]
    #[arg(long, value_name = "SECONDS")]
    pub authentication_timeout: Option<u64>,
    /// Maximum row size in bytes [default: 1048576]
    #[arg(long)]
    pub max_row_bytes: Option<usize>,
    /// Maximum statement / write-command size in bytes [default: 67108864]
    #[arg(long)]
    pub max_statement_bytes: Option<usize>,
    /// A large COPY FROM into a stream is staged in chunks of about this many bytes of
    /// data, 4096 up to half of max-statement-bytes [default: 8388608]
    #[arg(long, value_name = "BYTES")]
    pub copy_chunk_bytes: Option<usize>,
    /// A COPY FROM held whole (in a transaction block, in binary, into a table or a dedup
    /// stream) takes at most this many bytes of data, and four times that once typed
    /// [default: 268435456]
    #[arg(long, value_name = "BYTES")]
    pub max_copy_bytes: Option<usize>,
    /// A staged COPY that receives no data for this long is aborted, e.g. `10min`
    /// [default: 10min]
    #[arg(long, value_name = "DURATION")]
    pub copy_idle_timeout: Option<String>,
    /// Memory one statement may hold for joins, aggregates and sorts before it spills or
    /// fails with 53200, e.g. `512MB`; a session may set less [default: a quarter of memory]
    #[arg(long, value_name = "SIZE")]
    pub max_statement_memory: Option<String>,
    /// Memory all running statements together may hold, e.g. `4GB` [default: half of memory]
    #[arg(long, value_name = "SIZE")]
    pub max_query_memory: Option<String>,
    /// Every session's statement_timeout until it sets its own, e.g. `30s`; 0 is off [default: 0]
    #[arg(long, value_name = "DURATION")]
    pub statement_timeout: Option<String>,
    /// Log every statement that runs at least this long, with its duration, as
    /// PostgreSQL's log_min_duration_statement: e.g. `250ms`; 0 logs all, -1 none
    /// [default: -1]
    #[arg(long, value_name = "DURATION", allow_hyphen_values = true)]
    pub log_min_duration_statement: Option<String>,
    /// Segment file size at which a stream rolls over [default: 67108864]
    #[arg(long)]
    pub segment_bytes: Option<u64>,
    /// Applied log entries between checkpoints of the state machine [default: 20000]
    #[arg(long)]
    pub checkpoint_entries: Option<u64>,
    /// Microseconds a single node's threads may spin for a commit instead of sleeping while
    /// one client at a time writes (a wake-up costs tens of microseconds on a VM); 0 turns it
    /// off, e.g. on a machine shared with CPU-bound work [default: 500]
    #[arg(long, value_name = "MICROSECONDS")]
    pub commit_spin_us: Option<u64>,
    /// TEST ONLY: make every Raft-log fsync take this many extra milliseconds
    #[arg(long, hide = true)]
    pub test_fsync_delay_ms: Option<u64>,
    /// TEST ONLY: a login with this application_name panics its connection's task
    #[arg(long, hide = true)]
    pub test_panic_application_name: Option<String>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileConfig {
    data_dir: Option<PathBuf>,
    listen: Option<String>,
    metrics_listen: Option<String>,
    node_id: Option<u64>,
    peers: Option<String>,
    join: Option<bool>,
    cluster_secret_file: Option<PathBuf>,
    cluster_secret: Option<String>,
    peer_cert: Option<PathBuf>,
    peer_key: Option<PathBuf>,
    peer_ca: Option<PathBuf>,
    password: Option<String>,
    superuser: Option<String>,
    tls_cert: Option<PathBuf>,
    tls_key: Option<PathBuf>,
    tls_client_ca: Option<PathBuf>,
    allow_unencrypted: Option<bool>,
    max_connections: Option<usize>,
    authentication_timeout: Option<u64>,
    max_row_bytes: Option<usize>,
    max_statement_bytes: Option<usize>,
    copy_chunk_bytes: Option<usize>,
    max_copy_bytes: Option<usize>,
    copy_idle_timeout: Option<String>,
    max_statement_memory: Option<String>,
    max_query_memory: Option<String>,
    statement_timeout: Option<String>,
    log_min_duration_statement: Option<String>,
    segment_bytes: Option<u64>,
    checkpoint_entries: Option<u64>,
    commit_spin_us: Option<u64>,
    /// File only: see [`crate::rules`].
    connection_rules: Option<Vec<crate::rules::RuleText>>,
}

/// `--max-statement-memory` and `--max-query-memory` in bytes: each at least the smallest
/// statement limit, and one statement's never above all statements'.
fn memory_limits(
    statement: Option<String>,
    query: Option<String>,
) -> Result<(usize, usize), String> {
    let parse = |flag: &str, text: Option<String>, default: usize| -> Result<usize, String> {
        let Some(text) = text else {
            return Ok(default);
        };
        let bytes = sluice_sql::units::parse_bytes(&text)
            .ok()
            .and_then(|b| usize::try_from(b).ok())
            .ok_or_else(|| format!("--{flag} {text}: expected a size such as 512MB or 4GB"))?;
        if bytes < sluice_sql::memory::MIN_STATEMENT_MEMORY {
            return Err(format!("--{flag} {text}: must be at least 1MB"));
        }
        Ok(bytes)
    };
    let query = parse(
        "max-query-memory",
        query,
        sluice_sql::memory::default_query_memory(),
    )?;
    let statement = parse(
        "max-statement-memory",
        statement,
        sluice_sql::memory::default_statement_memory().min(query),
    )?;
    if statement > query {
        return Err(format!(
            "--max-statement-memory ({}) is above --max-query-memory ({}): one statement may not \
             hold more than all of them together",
            sluice_sql::memory::format_bytes(statement),
            sluice_sql::memory::format_bytes(query)
        ));
    }
    Ok((statement, query))
}

/// `authentication_timeout`'s bounds in seconds, PostgreSQL's.
const AUTHENTICATION_TIMEOUT_SECS: std::ops::RangeInclusive<u64> = 1..=600;

/// The longest `--commit-spin-us`.
const MAX_COMMIT_SPIN_US: u64 = 10_000;

/// The files of the client port's TLS.
#[derive(Debug, Clone)]
pub struct TlsFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
    pub client_ca: Option<PathBuf>,
}

/// The resolved configuration.
#[derive(Debug, Clone)]
pub struct Config {
    pub data_dir: PathBuf,
    pub listen: SocketAddr,
    /// Where `GET /metrics` is served, if anywhere.
    pub metrics_listen: Option<SocketAddr>,
    pub node_id: u64,
    /// Raft address of every member, this node included; empty for a single node.
    pub peers: BTreeMap<u64, String>,
    /// Start with no voters, waiting to be added.
    pub join: bool,
    /// What every Raft connection must prove (printed redacted).
    pub cluster_secret: Option<ClusterSecret>,
    /// Mutual TLS between members, loaded from `--peer-cert/--peer-key/--peer-ca`.
    pub peer_tls: Option<PeerTls>,
    pub password: Option<String>,
    /// The bootstrap superuser, whose initial password is `password`.
    pub superuser: String,
    /// TLS on the client port.
    pub tls: Option<TlsFiles>,
    /// Clients beyond loopback may connect without TLS.
    pub allow_unencrypted: bool,
    /// The config file's connection rules (empty: the defaults).
    pub rules: Vec<crate::rules::Rule>,
    pub max_connections: usize,
    /// How long a connection may take from accept to the end of authentication.
    pub authentication_timeout: Duration,
    pub max_row_bytes: usize,
    pub max_statement_bytes: usize,
    pub copy_chunk_bytes: usize,
    pub max_copy_bytes: usize,
    pub copy_idle_timeout: Duration,
    pub max_statement_memory: usize,
    pub max_query_memory: usize,
    pub statement_timeout: Option<Duration>,
    /// Statements taking at least this long are logged; `None`: none.
    pub log_min_duration: Option<Duration>,
    pub segment_bytes: u64,
    pub checkpoint_entries: u64,
    /// How long a thread may spin for a commit instead of sleeping (zero: never).
    pub commit_spin: Duration,
    pub fsync_delay: Option<Duration>,
    pub test_panic_application_name: Option<String>,
}

impl Config {
    pub fn resolve(args: ServeArgs) -> Result<Config, String> {
        let file = match &args.config {
            Some(path) => {
                let text = std::fs::read_to_string(path)
                    .map_err(|e| format!("{}: {e}", path.display()))?;
                toml::from_str::<FileConfig>(&text)
                    .map_err(|e| format!("{}: {e}", path.display()))?
            }
            None => FileConfig::default(),
        };
        let listen_text = args
            .listen
            .or(file.listen)
            .unwrap_or_else(|| "127.0.0.1:5499".into());
        let listen: SocketAddr = listen_text.parse().map_err(|e| {
            format!("--listen {listen_text}: {e} (expected HOST:PORT, e.g. 127.0.0.1:5499)")
        })?;
        let metrics_listen = match args.metrics_listen.or(file.metrics_listen) {
            Some(text) => Some(text.parse::<SocketAddr>().map_err(|e| {
                format!("--metrics-listen {text}: {e} (expected HOST:PORT, e.g. 127.0.0.1:9187)")
            })?),
            None => None,
        };
        let password = args.password.or(file.password);
        if password.as_deref() == Some("") {
            return Err(
                "the password is empty (--password, SLUICE_PASSWORD or `password` in the config \
                 file): an empty password is no password; set a non-empty one, or unset it to \
                 run without authentication on loopback"
                    .into(),
            );
        }
        if !listen.ip().is_loopback() && password.is_none() {
            return Err(format!(
                "refusing to listen on {listen} without authentication: set --password (or SLUICE_PASSWORD), or listen on loopback"
            ));
        }
        let tls = match (
            args.tls_cert.or(file.tls_cert),
            args.tls_key.or(file.tls_key),
            args.tls_client_ca.or(file.tls_client_ca),
        ) {
            (Some(cert), Some(key), client_ca) => Some(TlsFiles {
                cert,
                key,
                client_ca,
            }),
            (None, None, None) => None,
            (None, None, Some(_)) => {
                return Err("--tls-client-ca needs --tls-cert and --tls-key".into())
            }
            _ => return Err("--tls-cert and --tls-key go together: set both or neither".into()),
        };
        let allow_unencrypted = args.allow_unencrypted || file.allow_unencrypted.unwrap_or(false);
        if !listen.ip().is_loopback() && tls.is_none() && !allow_unencrypted {
            return Err(format!(
                "refusing to listen on {listen} without TLS: set --tls-cert and --tls-key, or \
                 --allow-unencrypted to let clients beyond loopback connect in the clear"
            ));
        }
        let rules = crate::rules::parse(
            file.connection_rules.as_deref().unwrap_or_default(),
            &crate::rules::Offers {
                tls: tls.is_some(),
                client_ca: tls.as_ref().is_some_and(|t| t.client_ca.is_some()),
            },
        )?;
        let superuser = args
            .superuser
            .or(file.superuser)
            .unwrap_or_else(|| "sluice".into());
        if superuser.is_empty() {
            return Err("--superuser: the name is empty".into());
        }
        let node_id = args.node_id.or(file.node_id).unwrap_or(1);
        let peers = match args.peers.or(file.peers) {
            Some(text) => parse_peers(&text)?,
            None => BTreeMap::new(),
        };
        if node_id == 0 {
            return Err("--node-id must be positive".into());
        }
        if !peers.is_empty() && !peers.contains_key(&node_id) {
            return Err(format!(
                "--peers must include this node ({node_id}=HOST:PORT, where it listens for peers)"
            ));
        }
        let cluster_secret = cluster_secret(
            args.cluster_secret.or(file.cluster_secret),
            args.cluster_secret_file.or(file.cluster_secret_file),
        )?;
        let peer_tls = peer_tls(
            args.peer_cert.or(file.peer_cert),
            args.peer_key.or(file.peer_key),
            args.peer_ca.or(file.peer_ca),
        )?;
        if peer_tls.is_some() && peers.is_empty() {
            return Err(
                "--peer-cert/--peer-key/--peer-ca need --peers: a single node has no \
                        peers to authenticate"
                    .into(),
            );
        }
        if cluster_secret.is_none() && peer_tls.is_none() {
            if let Some((id, addr)) = peers.iter().find(|(_, a)| !is_loopback_address(a)) {
                return Err(format!(
                    "refusing to start a cluster beyond loopback without peer authentication \
                     (node {id} is at {addr}): give every node --peer-cert, --peer-key and \
                     --peer-ca (mutual TLS), or set --cluster-secret-file (or \
                     SLUICE_CLUSTER_SECRET) to the same secret on every node, or keep every \
                     --peers address on loopback"
                ));
            }
        }
        let join = args.join || file.join.unwrap_or(false);
        if join && peers.is_empty() {
            return Err("--join needs --peers (at least this node's own address)".into());
        }
        let auth_secs = args
            .authentication_timeout
            .or(file.authentication_timeout)
            .unwrap_or(60);
        if !AUTHENTICATION_TIMEOUT_SECS.contains(&auth_secs) {
            return Err(format!(
                "--authentication-timeout {auth_secs}: must be between {} and {} seconds",
                AUTHENTICATION_TIMEOUT_SECS.start(),
                AUTHENTICATION_TIMEOUT_SECS.end()
            ));
        }
        let commit_spin_us = args
            .commit_spin_us
            .or(file.commit_spin_us)
            .unwrap_or(sluice_consensus::spin::DEFAULT_BUDGET.as_micros() as u64);
        if commit_spin_us > MAX_COMMIT_SPIN_US {
            return Err(format!(
                "--commit-spin-us {commit_spin_us}: must be at most {MAX_COMMIT_SPIN_US} \
                 (a spin is meant to cover one fsync, not to replace sleeping)"
            ));
        }
        let (max_statement_memory, max_query_memory) = memory_limits(
            args.max_statement_memory.or(file.max_statement_memory),
            args.max_query_memory.or(file.max_query_memory),
        )?;
        let statement_timeout = match args.statement_timeout.or(file.statement_timeout) {
            Some(text) => sluice_sql::interrupt::parse_timeout(&text)
                .map_err(|e| format!("--statement-timeout {text}: {}", e.message))?,
            None => None,
        };
        let log_min_duration = match args
            .log_min_duration_statement
            .or(file.log_min_duration_statement)
        {
            Some(text) => sluice_sql::settings::parse_log_min_duration(&text)
                .map_err(|e| format!("--log-min-duration-statement {text}: {}", e.message))?,
            None => None,
        };
        let max_statement_bytes = args
            .max_statement_bytes
            .or(file.max_statement_bytes)
            .unwrap_or(64 << 20);
        let copy_chunk_bytes = args
            .copy_chunk_bytes
            .or(file.copy_chunk_bytes)
            .unwrap_or(8 << 20)
            .min(max_statement_bytes / 2);
        if copy_chunk_bytes < 4096 {
            return Err(format!(
                "--copy-chunk-bytes {copy_chunk_bytes}: at least 4096 (and half of \
                 --max-statement-bytes) is needed"
            ));
        }
        let max_copy_bytes = args
            .max_copy_bytes
            .or(file.max_copy_bytes)
            .unwrap_or(256 << 20);
        if max_copy_bytes < 4096 {
            return Err(format!(
                "--max-copy-bytes {max_copy_bytes}: at least 4096 is needed"
            ));
        }
        let copy_idle_timeout = match args.copy_idle_timeout.or(file.copy_idle_timeout) {
            Some(text) => sluice_sql::interrupt::parse_timeout(&text)
                .map_err(|e| format!("--copy-idle-timeout {text}: {}", e.message))?
                .ok_or_else(|| format!("--copy-idle-timeout {text}: must be above 0"))?,
            None => Duration::from_secs(600),
        };
        Ok(Config {
            copy_chunk_bytes,
            max_copy_bytes,
            copy_idle_timeout,
            max_statement_memory,
            max_query_memory,
            statement_timeout,
            log_min_duration,
            node_id,
            peers,
            join,
            cluster_secret,
            peer_tls,
            data_dir: args
                .data_dir
                .or(file.data_dir)
                .unwrap_or_else(|| PathBuf::from("./sluice-data")),
            listen,
            metrics_listen,
            password,
            superuser,
            tls,
            allow_unencrypted,
            rules,
            max_connections: args
                .max_connections
                .or(file.max_connections)
                .unwrap_or(1000),
            authentication_timeout: Duration::from_secs(auth_secs),
            max_row_bytes: args.max_row_bytes.or(file.max_row_bytes).unwrap_or(1 << 20),
            max_statement_bytes,
            segment_bytes: args
                .segment_bytes
                .or(file.segment_bytes)
                .unwrap_or(64 << 20)
                .max(4096),
            checkpoint_entries: args
                .checkpoint_entries
                .or(file.checkpoint_entries)
                .unwrap_or(20_000)
                .max(1),
            commit_spin: Duration::from_micros(commit_spin_us),
            fsync_delay: args.test_fsync_delay_ms.map(Duration::from_millis),
            test_panic_application_name: args.test_panic_application_name,
        })
    }
}

/// Mutual TLS between members: all three files or none.
fn peer_tls(
    cert: Option<PathBuf>,
    key: Option<PathBuf>,
    ca: Option<PathBuf>,
) -> Result<Option<PeerTls>, String> {
    match (cert, key, ca) {
        (None, None, None) => Ok(None),
        (Some(cert), Some(key), Some(ca)) => PeerTls::load(&cert, &key, &ca)
            .map(Some)
            .map_err(|e| e.to_string()),
        _ => Err("peer TLS needs all of --peer-cert, --peer-key and --peer-ca".into()),
    }
}

/// The cluster secret, from `SLUICE_CLUSTER_SECRET` / `cluster_secret` or from a file (not
/// both): refused when empty or shorter than 16 bytes.
fn cluster_secret(
    inline: Option<String>,
    file: Option<PathBuf>,
) -> Result<Option<ClusterSecret>, String> {
    let (bytes, source) = match (inline, file) {
        (None, None) => return Ok(None),
        (Some(_), Some(path)) => {
            return Err(format!(
                "both SLUICE_CLUSTER_SECRET (or `cluster_secret`) and --cluster-secret-file {} \
                 are set: give the cluster secret once",
                path.display()
            ))
        }
        (Some(text), None) => (
            text.into_bytes(),
            "SLUICE_CLUSTER_SECRET (or `cluster_secret` in the config file)".to_string(),
        ),
        (None, Some(path)) => {
            let mut bytes = std::fs::read(&path)
                .map_err(|e| format!("--cluster-secret-file {}: {e}", path.display()))?;
            // What `echo secret > file` and editors add.
            if bytes.ends_with(b"\n") {
                bytes.pop();
                if bytes.ends_with(b"\r") {
                    bytes.pop();
                }
            }
            (bytes, format!("--cluster-secret-file {}", path.display()))
        }
    };
    match ClusterSecret::new(bytes) {
        Ok(secret) => Ok(Some(secret)),
        Err(sluice_consensus::Error::Config(why)) => Err(format!("{source}: {why}")),
        Err(e) => Err(format!("{source}: {e}")),
    }
}

/// `1=host:port,2=host:port,...`
fn parse_peers(text: &str) -> Result<BTreeMap<u64, String>, String> {
    let mut peers = BTreeMap::new();
    for item in text.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let (id, addr) = item
            .split_once('=')
            .ok_or_else(|| format!("--peers: \"{item}\" is not ID=HOST:PORT"))?;
        let id: u64 = id
            .trim()
            .parse()
            .ok()
            .filter(|i| *i > 0)
            .ok_or_else(|| format!("--peers: \"{id}\" is not a positive node id"))?;
        let addr = addr.trim();
        if addr
            .rsplit_once(':')
            .and_then(|(_, p)| p.parse::<u16>().ok())
            .is_none()
        {
            return Err(format!("--peers: \"{addr}\" is not HOST:PORT"));
        }
        if peers.insert(id, addr.to_string()).is_some() {
            return Err(format!("--peers: node {id} is listed twice"));
        }
    }
    Ok(peers)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn non_loopback_requires_a_password() {
        let args = ServeArgs {
            listen: Some("0.0.0.0:5499".into()),
            ..Default::default()
        };
        assert!(Config::resolve(args)
            .unwrap_err()
            .contains("without authentication"));
        let args = ServeArgs {
            listen: Some("0.0.0.0:5499".into()),
            password: Some("x".into()),
            allow_unencrypted: true,
            ..Default::default()
        };
        assert!(Config::resolve(args).is_ok());
    }

    #[test]
    fn non_loopback_requires_tls_unless_unencrypted_is_allowed() {
        let public = |tls: bool, allow_unencrypted: bool| ServeArgs {
            listen: Some("0.0.0.0:5499".into()),
            password: Some("x".into()),
            tls_cert: tls.then(|| "cert.pem".into()),
            tls_key: tls.then(|| "key.pem".into()),
            allow_unencrypted,
            ..Default::default()
        };
        let err = Config::resolve(public(false, false)).unwrap_err();
        assert!(
            err.contains("without TLS") && err.contains("--tls-cert"),
            "{err}"
        );
        assert!(Config::resolve(public(true, false)).is_ok());
        assert!(Config::resolve(public(false, true)).is_ok());
        for (cert, key, ca) in [
            (true, false, false),
            (false, true, false),
            (false, false, true),
        ] {
            let err = Config::resolve(ServeArgs {
                tls_cert: cert.then(|| "cert.pem".into()),
                tls_key: key.then(|| "key.pem".into()),
                tls_client_ca: ca.then(|| "ca.pem".into()),
                ..Default::default()
            })
            .unwrap_err();
            assert!(err.contains("--tls-"), "{err}");
        }
    }

    #[test]
    fn statement_memory_and_timeout_flags_are_read_and_checked() {
        let resolve = |statement: Option<&str>, query: Option<&str>, timeout: Option<&str>| {
            Config::resolve(ServeArgs {
                max_statement_memory: statement.map(String::from),
                max_query_memory: query.map(String::from),
                statement_timeout: timeout.map(String::from),
                ..Default::default()
            })
        };
        let c = resolve(Some("256MB"), Some("1GB"), Some("30s")).unwrap();
        assert_eq!(
            (
                c.max_statement_memory,
                c.max_query_memory,
                c.statement_timeout
            ),
            (256 << 20, 1 << 30, Some(Duration::from_secs(30)))
        );
        // a statement's default never exceeds a lower total
        let c = resolve(None, Some("64MB"), Some("0")).unwrap();
        assert_eq!(
            (c.max_statement_memory, c.statement_timeout),
            (64 << 20, None)
        );
        for (statement, query, timeout, expected) in [
            (
                Some("2GB"),
                Some("1GB"),
                None,
                "is above --max-query-memory",
            ),
            (Some("lots"), None, None, "expected a size"),
            (Some("1kB"), None, None, "at least 1MB"),
            (None, None, Some("soon"), "--statement-timeout soon"),
        ] {
            let err = resolve(statement, query, timeout).unwrap_err();
            assert!(err.contains(expected), "{err}");
        }
    }

    #[test]
    fn an_empty_password_is_refused() {
        for listen in ["127.0.0.1:5499", "0.0.0.0:5499"] {
            let args = ServeArgs {
                listen: Some(listen.into()),
                password: Some(String::new()),
                ..Default::default()
            };
            assert!(
                Config::resolve(args).unwrap_err().contains("empty"),
                "{listen}"
            );
        }
    }

    #[test]
    fn authentication_timeout_is_bounded() {
        let resolve = |secs| {
            Config::resolve(ServeArgs {
                authentication_timeout: secs,
                ..Default::default()
            })
        };
        assert_eq!(
            resolve(None).unwrap().authentication_timeout,
            Duration::from_secs(60)
        );
        assert_eq!(
            resolve(Some(1)).unwrap().authentication_timeout,
            Duration::from_secs(1)
        );
        for bad in [0, 601, u64::MAX] {
            assert!(
                resolve(Some(bad))
                    .unwrap_err()
                    .contains("between 1 and 600 seconds"),
                "{bad}"
            );
        }
    }

    #[test]
    fn commit_spin_is_read_and_bounded() {
        let resolve = |us| {
            Config::resolve(ServeArgs {
                commit_spin_us: us,
                ..Default::default()
            })
        };
        assert_eq!(
            resolve(None).unwrap().commit_spin,
            sluice_consensus::spin::DEFAULT_BUDGET
        );
        assert_eq!(resolve(Some(0)).unwrap().commit_spin, Duration::ZERO);
        assert_eq!(
            resolve(Some(10_000)).unwrap().commit_spin,
            Duration::from_millis(10)
        );
        for bad in [10_001, u64::MAX] {
            assert!(
                resolve(Some(bad))
                    .unwrap_err()
                    .contains("must be at most 10000"),
                "{bad}"
            );
        }
    }

    #[test]
    fn peers_are_parsed_and_must_include_this_node() {
        let args = ServeArgs {
            node_id: Some(2),
            peers: Some("1=127.0.0.1:7001, 2=127.0.0.1:7002,3=localhost:7003".into()),
            ..Default::default()
        };
        let c = Config::resolve(args).unwrap();
        assert_eq!(c.peers.len(), 3);
        assert_eq!(c.peers[&3], "localhost:7003");
        for bad in ["1=127.0.0.1:7001", "2=nope", "x=1:2,2=a:1", "2=a:1,2=b:2"] {
            let args = ServeArgs {
                node_id: Some(2),
                peers: Some(bad.into()),
                ..Default::default()
            };
            assert!(Config::resolve(args).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_cluster_beyond_loopback_needs_a_cluster_secret() {
        let resolve = |peers: &str, secret: Option<&str>| {
            Config::resolve(ServeArgs {
                node_id: Some(1),
                peers: Some(peers.into()),
                cluster_secret: secret.map(String::from),
                ..Default::default()
            })
        };
        let secret = Some("0123456789abcdef");
        for peers in [
            "1=10.0.0.1:7001,2=10.0.0.2:7001",
            "1=127.0.0.1:7001,2=10.0.0.2:7001",
            "1=0.0.0.0:7001,2=127.0.0.1:7002",
            "1=127.0.0.1:7001,2=db2.internal:7001",
        ] {
            let err = resolve(peers, None).unwrap_err();
            assert!(err.contains("--peer-cert"), "{peers}: {err}");
            assert!(err.contains("--cluster-secret-file"), "{peers}: {err}");
            assert!(err.contains("SLUICE_CLUSTER_SECRET"), "{peers}: {err}");
            assert!(resolve(peers, secret).unwrap().cluster_secret.is_some());
        }
        // Loopback clusters and single nodes run without a secret, as before.
        for peers in [
            "1=127.0.0.1:7001,2=127.0.0.1:7002",
            "1=localhost:7001,2=[::1]:7002",
        ] {
            assert!(
                resolve(peers, None).unwrap().cluster_secret.is_none(),
                "{peers}"
            );
        }
        assert!(Config::resolve(ServeArgs::default()).is_ok());
    }

    #[test]
    fn peer_tls_needs_all_three_files_and_a_cluster() {
        let dir = tempfile::tempdir().unwrap();
        let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../tests/fixtures/tls/make-certs.sh");
        let made = std::process::Command::new("bash")
            .arg(script)
            .arg(dir.path())
            .status()
            .unwrap();
        assert!(made.success());
        let at = |f: &str| Some(dir.path().join(f));
        let resolve = |peers: Option<&str>, cert, key, ca| {
            Config::resolve(ServeArgs {
                node_id: Some(1),
                peers: peers.map(String::from),
                peer_cert: cert,
                peer_key: key,
                peer_ca: ca,
                ..Default::default()
            })
        };
        let beyond = Some("1=10.0.0.1:7001,2=10.0.0.2:7001");
        let c = resolve(beyond, at("peer.pem"), at("peer.key"), at("peer-ca.pem")).unwrap();
        assert!(c.peer_tls.is_some() && c.cluster_secret.is_none());
        let partial = resolve(beyond, at("peer.pem"), at("peer.key"), None).unwrap_err();
        assert!(partial.contains("all of --peer-cert"), "{partial}");
        let alone = resolve(None, at("peer.pem"), at("peer.key"), at("peer-ca.pem")).unwrap_err();
        assert!(alone.contains("need --peers"), "{alone}");
        let not_a_ca = resolve(beyond, at("peer.pem"), at("peer.key"), at("missing.pem"));
        assert!(not_a_ca.unwrap_err().contains("--peer-ca"));
        let wrong_key = resolve(
            beyond,
            at("peer.pem"),
            at("intruder.key"),
            at("peer-ca.pem"),
        );
        assert!(wrong_key.unwrap_err().contains("--peer-cert/--peer-key"));
    }

    #[test]
    fn an_empty_or_short_cluster_secret_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("secret");
        let resolve = |inline: Option<&str>, file: Option<&PathBuf>| {
            Config::resolve(ServeArgs {
                node_id: Some(1),
                peers: Some("1=10.0.0.1:7001,2=10.0.0.2:7001".into()),
                cluster_secret: inline.map(String::from),
                cluster_secret_file: file.cloned(),
                ..Default::default()
            })
        };
        for (inline, expected) in [("", "empty"), ("fifteen bytes!!", "at least 16")] {
            let err = resolve(Some(inline), None).unwrap_err();
            assert!(err.contains(expected), "{err}");
            assert!(err.contains("SLUICE_CLUSTER_SECRET"), "{err}");
        }
        // From a file: one trailing newline is not part of the secret.
        for (contents, expected) in [
            ("", "empty"),
            ("\n", "empty"),
            ("fifteen bytes!!\n", "at least 16"),
            ("fifteen bytes!!\r\n", "at least 16"),
        ] {
            std::fs::write(&file, contents).unwrap();
            let err = resolve(None, Some(&file)).unwrap_err();
            assert!(err.contains(expected), "{contents:?}: {err}");
            assert!(err.contains("--cluster-secret-file"), "{err}");
        }
        std::fs::write(&file, "sixteen bytes!!!\n").unwrap();
        let c = resolve(None, Some(&file)).unwrap();
        assert!(c.cluster_secret.is_some());
        // The secret never shows in the configuration's debug output.
        assert!(!format!("{c:?}").contains("sixteen"));
        let err = resolve(Some("sixteen bytes!!!"), Some(&file)).unwrap_err();
        assert!(err.contains("once"), "{err}");
        let err = resolve(None, Some(&dir.path().join("missing"))).unwrap_err();
        assert!(err.contains("--cluster-secret-file"), "{err}");
    }

    #[test]
    fn flags_override_the_file() {
        let dir = std::env::temp_dir().join(format!("sluice-config-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("sluice.toml");
        std::fs::write(&path, "listen = \"127.0.0.1:7000\"\nmax_connections = 5\n").unwrap();
        let args = ServeArgs {
            config: Some(path.clone()),
            max_connections: Some(9),
            ..Default::default()
        };
        let c = Config::resolve(args).unwrap();
        assert_eq!(c.listen.port(), 7000);
        assert_eq!(c.max_connections, 9);
        for bad in ["password = \"\"\n", "authentication_timeout = 0\n"] {
            std::fs::write(&path, bad).unwrap();
            assert!(
                Config::resolve(ServeArgs {
                    config: Some(path.clone()),
                    ..Default::default()
                })
                .is_err(),
                "{bad}"
            );
        }
        std::fs::write(&path, "bogus = 1\n").unwrap();
        assert!(Config::resolve(ServeArgs {
            config: Some(path),
            ..Default::default()
        })
        .is_err());
        let _ = std::fs::remove_dir_all(dir);
    }
}
