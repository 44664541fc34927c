//! The cluster under test: real `sluice` processes on loopback, each reached by its peers
//! through the [`Net`] proxies, with the operations nemeses need — SIGKILL, SIGTERM,
//! SIGSTOP/SIGCONT, restart, wipe, start with `--join` — and SQL helpers that never panic
//! (a failure is the caller's to classify).
//!
//! Node *i* lists its own real Raft address in `--peers` and every other node's proxy; a
//! joining node is added with its proxy address. Each node's output goes to
//! `<root>/node<i>.log` (all its incarnations, appended). [`Ports`] holds the client port
//! of every node that serves clients now (not paused, not down): the workloads pick from it.

use std::collections::{BTreeMap, BTreeSet};
use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

use tokio_postgres::Client;

use super::history::lock;
use super::net::Net;
use crate::cluster::{connect, free_port};
use crate::parse_listening_port;

/// Client ports of the nodes serving clients now.
pub type Ports = Arc<Mutex<BTreeMap<u64, u16>>>;

/// How long one control statement (membership, leader query) may take.
pub const CONTROL_TIMEOUT: Duration = Duration::from_secs(10);

struct NodeProc {
    raft_port: u16,
    proxy_port: u16,
    data_dir: PathBuf,
    log: PathBuf,
    child: Option<Child>,
    pg_port: Option<u16>,
    paused: bool,
    port_rx: Option<mpsc::Receiver<u16>>,
    /// The `--peers` value it starts with.
    peers: String,
}

pub struct Control {
    pub root: PathBuf,
    binary: PathBuf,
    nodes: BTreeMap<u64, NodeProc>,
    /// Who we believe the voting members are (what our ALTER CLUSTERs made them).
    pub members: BTreeSet<u64>,
    pub net: Net,
    extra: Vec<String>,
    ports: Ports,
    next_id: u64,
}

impl Control {
    /// Starts `n` nodes (ids 1..=n) under `root` and waits (bounded) until each serves.
    pub async fn start(
        binary: &Path,
        root: &Path,
        n: u64,
        extra: &[String],
    ) -> Result<Control, String> {
        let mut control = Control {
            root: root.to_path_buf(),
            binary: binary.to_path_buf(),
            nodes: BTreeMap::new(),
            members: (1..=n).collect(),
            net: Net::new(),
            extra: extra.to_vec(),
            ports: Ports::default(),
            next_id: n + 1,
        };
        for id in 1..=n {
            control.create(id).await;
        }
        let ids: Vec<u64> = (1..=n).collect();
        for &id in &ids {
            let peers = control.peers_for(id, &ids);
            control.node_mut(id)?.peers = peers;
            control.spawn(id, false)?;
        }
        for &id in &ids {
            control.wait_ready(id, Duration::from_secs(60)).await?;
        }
        Ok(control)
    }

    pub fn ports(&self) -> Ports {
        self.ports.clone()
    }

    /// A fresh node id (never used in this run).
    pub fn fresh_id(&mut self) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        id
    }

    /// Nodes with a process (running or paused).
    pub fn running(&self) -> Vec<u64> {
        self.nodes
            .iter()
            .filter(|(_, n)| n.child.is_some())
            .map(|(id, _)| *id)
            .collect()
    }

    /// Members serving clients now.
    pub fn serving_members(&self) -> Vec<u64> {
        self.members
            .iter()
            .copied()
            .filter(|id| self.pg_port(*id).is_some())
            .collect()
    }

    pub fn pg_port(&self, id: u64) -> Option<u16> {
        let n = self.nodes.get(&id)?;
        if n.paused {
            return None;
        }
        n.pg_port
    }

    pub fn is_paused(&self, id: u64) -> bool {
        self.nodes.get(&id).is_some_and(|n| n.paused)
    }

    pub fn log_path(&self, id: u64) -> Option<PathBuf> {
        self.nodes.get(&id).map(|n| n.log.clone())
    }

    /// The address a member records for node `id` (its proxy).
    pub fn raft_addr(&self, id: u64) -> Option<String> {
        self.nodes
            .get(&id)
            .map(|n| format!("127.0.0.1:{}", n.proxy_port))
    }

    /// Creates node `id`'s directory, ports and proxy (no process yet).
    async fn create(&mut self, id: u64) {
        let raft_port = free_port();
        let proxy_port = self.net.proxy_for(id, raft_port).await;
        let data_dir = self.root.join(format!("node{id}"));
        let log = self.root.join(format!("node{id}.log"));
        self.nodes.insert(
            id,
            NodeProc {
                raft_port,
                proxy_port,
                data_dir,
                log,
                child: None,
                pg_port: None,
                paused: false,
                port_rx: None,
                peers: String::new(),
            },
        );
    }

    /// `--peers` for node `me` with members `ids`: itself at its real address, the others at
    /// their proxies.
    fn peers_for(&self, me: u64, ids: &[u64]) -> String {
        ids.iter()
            .filter_map(|&id| {
                let n = self.nodes.get(&id)?;
                let port = if id == me { n.raft_port } else { n.proxy_port };
                Some(format!("{id}=127.0.0.1:{port}"))
            })
            .collect::<Vec<_>>()
            .join(",")
    }

    fn node_mut(&mut self, id: u64) -> Result<&mut NodeProc, String> {
        self.nodes
            .get_mut(&id)
            .ok_or_else(|| format!("no node {id} in this run"))
    }

    fn set_serving(&self, id: u64, port: Option<u16>) {
        let mut ports = lock(&self.ports);
        match port {
            Some(p) => ports.insert(id, p),
            None => ports.remove(&id),
        };
    }

    /// Starts node `id`'s process (with `--join` if asked); does not wait.
    fn spawn(&mut self, id: u64, join: bool) -> Result<(), String> {
        let extra = self.extra.clone();
        let binary = self.binary.clone();
        let n = self.node_mut(id)?;
        if n.child.is_some() {
            return Err(format!("node {id} is already running"));
        }
        std::fs::create_dir_all(&n.data_dir).map_err(|e| e.to_string())?;
        let mut args: Vec<String> = vec![
            "serve".into(),
            "--data-dir".into(),
            n.data_dir.display().to_string(),
            "--listen".into(),
            "127.0.0.1:0".into(),
            "--node-id".into(),
            id.to_string(),
            "--peers".into(),
            n.peers.clone(),
        ];
        if join {
            args.push("--join".into());
        }
        args.extend(extra);
        let mut log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&n.log)
            .map_err(|e| format!("open {}: {e}", n.log.display()))?;
        let _ = writeln!(log, "=== chaos: starting node {id}: {}", args.join(" "));
        let stderr = log.try_clone().map_err(|e| e.to_string())?;
        let mut child = Command::new(&binary)
            .args(&args)
            .env("NO_COLOR", "1")
            .env("RUST_BACKTRACE", "1")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::from(stderr))
            .spawn()
            .map_err(|e| format!("spawn node {id}: {e}"))?;
        let stdout = child.stdout.take().ok_or("no stdout pipe")?;
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || copy_output(stdout, log, tx));
        n.child = Some(child);
        n.port_rx = Some(rx);
        n.pg_port = None;
        n.paused = false;
        Ok(())
    }

    /// Waits (bounded) until node `id` prints `listening on`; then it serves clients.
    pub async fn wait_ready(&mut self, id: u64, limit: Duration) -> Result<u16, String> {
        let deadline = Instant::now() + limit;
        loop {
            let n = self.node_mut(id)?;
            if let Some(p) = n.pg_port {
                return Ok(p);
            }
            let Some(rx) = n.port_rx.as_ref() else {
                return Err(format!("node {id} is not running"));
            };
            match rx.try_recv() {
                Ok(port) => {
                    n.pg_port = Some(port);
                    n.port_rx = None;
                    let paused = n.paused;
                    if !paused {
                        self.set_serving(id, Some(port));
                    }
                    return Ok(port);
                }
                Err(mpsc::TryRecvError::Disconnected) => {
                    let status = n.child.as_mut().and_then(|c| c.try_wait().ok().flatten());
                    return Err(format!(
                        "node {id} exited before serving clients (status {status:?})"
                    ));
                }
                Err(mpsc::TryRecvError::Empty) => {}
            }
            if Instant::now() > deadline {
                return Err(format!("node {id} did not serve clients within {limit:?}"));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    fn signal(&self, id: u64, sig: &str) {
        if let Some(child) = self.nodes.get(&id).and_then(|n| n.child.as_ref()) {
            let _ = Command::new("kill")
                .args([sig, &child.id().to_string()])
                .status();
        }
    }

    /// SIGKILL (resuming a paused process first is not needed: SIGKILL ends it anyway).
    pub fn kill(&mut self, id: u64) {
        self.set_serving(id, None);
        if let Some(n) = self.nodes.get_mut(&id) {
            if let Some(mut child) = n.child.take() {
                let _ = child.kill();
                let _ = child.wait();
            }
            n.pg_port = None;
            n.port_rx = None;
            n.paused = false;
        }
    }

    /// SIGTERM, then waits (bounded) for the exit; SIGKILL after `limit`.
    pub async fn terminate(&mut self, id: u64, limit: Duration) -> Result<ExitStatus, String> {
        self.set_serving(id, None);
        self.signal(id, "-TERM");
        let deadline = Instant::now() + limit;
        loop {
            let n = self.node_mut(id)?;
            let Some(child) = n.child.as_mut() else {
                return Err(format!("node {id} was not running"));
            };
            if let Ok(Some(status)) = child.try_wait() {
                n.child = None;
                n.pg_port = None;
                n.port_rx = None;
                return Ok(status);
            }
            if Instant::now() > deadline {
                self.kill(id);
                return Err(format!(
                    "node {id} did not exit within {limit:?} of SIGTERM"
                ));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// SIGSTOP: the process freezes with its sockets open.
    pub fn pause(&mut self, id: u64) {
        self.signal(id, "-STOP");
        self.set_serving(id, None);
        if let Some(n) = self.nodes.get_mut(&id) {
            n.paused = true;
        }
    }

    /// SIGCONT.
    pub fn resume(&mut self, id: u64) {
        self.signal(id, "-CONT");
        let port = self.nodes.get_mut(&id).and_then(|n| {
            n.paused = false;
            n.pg_port
        });
        if port.is_some() {
            self.set_serving(id, port);
        }
    }

    /// Starts a stopped node on its data directory and waits until it serves.
    pub async fn restart(&mut self, id: u64, limit: Duration) -> Result<u16, String> {
        self.spawn(id, false)?;
        self.wait_ready(id, limit).await
    }

    /// Deletes a stopped node's data directory.
    pub fn wipe(&mut self, id: u64) -> Result<(), String> {
        let n = self.node_mut(id)?;
        if n.child.is_some() {
            return Err(format!("node {id} is running; stop it before wiping"));
        }
        match std::fs::remove_dir_all(&n.data_dir) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(format!("wipe node {id}: {e}")),
        }
    }

    /// Starts node `id` (new, or stopped and wiped) with `--join` and `--peers` naming the
    /// current members; returns the address to add it with. It serves clients only once a
    /// member runs `ALTER CLUSTER ADD NODE`.
    pub async fn spawn_joining(&mut self, id: u64) -> Result<String, String> {
        if !self.nodes.contains_key(&id) {
            self.create(id).await;
        }
        let mut ids: Vec<u64> = self.members.iter().copied().collect();
        ids.push(id);
        let peers = self.peers_for(id, &ids);
        self.node_mut(id)?.peers = peers;
        self.spawn(id, true)?;
        self.raft_addr(id)
            .ok_or_else(|| format!("node {id} has no address"))
    }

    /// Stops node `id` for good and forgets it (its data directory goes).
    pub fn discard(&mut self, id: u64) {
        self.kill(id);
        if let Some(n) = self.nodes.remove(&id) {
            let _ = std::fs::remove_dir_all(&n.data_dir);
        }
        self.members.remove(&id);
    }

    /// Nodes whose process ended without us stopping it, with the exit status; they are
    /// marked down (restart them with [`Control::restart`]).
    pub fn reap_unexpected(&mut self) -> Vec<(u64, String)> {
        let mut out = Vec::new();
        let ids: Vec<u64> = self.nodes.keys().copied().collect();
        for id in ids {
            let exited = self
                .nodes
                .get_mut(&id)
                .and_then(|n| n.child.as_mut())
                .and_then(|c| c.try_wait().ok().flatten());
            if let Some(status) = exited {
                self.set_serving(id, None);
                if let Some(n) = self.nodes.get_mut(&id) {
                    n.child = None;
                    n.pg_port = None;
                    n.port_rx = None;
                    n.paused = false;
                }
                out.push((id, status.to_string()));
            }
        }
        out
    }

    /// A new client of node `id` (if it serves).
    pub async fn client(&self, id: u64) -> Result<Client, String> {
        let port = self
            .pg_port(id)
            .ok_or_else(|| format!("node {id} does not serve clients now"))?;
        connect(port).await
    }

    /// Runs `sql` (simple protocol) on node `id`, bounded.
    pub async fn execute(&self, id: u64, sql: &str, limit: Duration) -> Result<(), String> {
        let client = self.client(id).await?;
        match tokio::time::timeout(limit, client.batch_execute(sql)).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(describe(&e)),
            Err(_) => Err(format!("timed out after {limit:?}")),
        }
    }

    /// The leader as a serving member reports itself (highest term wins).
    pub async fn leader(&self) -> Option<u64> {
        let mut best: Option<(i64, u64)> = None;
        for id in self.serving_members() {
            if let Some((term, role)) = self_role(self, id).await {
                if role == "leader" && best.is_none_or(|(t, _)| term > t) {
                    best = Some((term, id));
                }
            }
        }
        best.map(|(_, id)| id)
    }

    /// Waits (bounded) for a leader among the serving members.
    pub async fn wait_leader(&self, limit: Duration) -> Result<u64, String> {
        let deadline = Instant::now() + limit;
        loop {
            if let Some(l) = self.leader().await {
                return Ok(l);
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "no leader among serving members {:?} within {limit:?}",
                    self.serving_members()
                ));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// `(node_id, voter)` of every member as node `id` sees them.
    pub async fn membership(&self, id: u64) -> Result<Vec<(u64, bool)>, String> {
        let client = self.client(id).await?;
        let sql = "SELECT node_id, voter FROM sluice_cluster ORDER BY node_id";
        let rows = tokio::time::timeout(CONTROL_TIMEOUT, client.query(sql, &[]))
            .await
            .map_err(|_| "membership query timed out".to_string())?
            .map_err(|e| describe(&e))?;
        Ok(rows
            .iter()
            .map(|r| (r.get::<_, i64>(0) as u64, r.get::<_, bool>(1)))
            .collect())
    }

    /// A counter of `sluice_stats` on node `id`.
    pub async fn stat(&self, id: u64, metric: &str) -> Option<i64> {
        let client = self.client(id).await.ok()?;
        let sql = "SELECT value FROM sluice_stats WHERE metric = $1";
        let rows = tokio::time::timeout(CONTROL_TIMEOUT, client.query(sql, &[&metric]))
            .await
            .ok()?
            .ok()?;
        rows.first().map(|r| r.get::<_, i64>(0))
    }
}

impl Drop for Control {
    fn drop(&mut self) {
        for n in self.nodes.values_mut() {
            if let Some(mut child) = n.child.take() {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
    }
}

/// `(term, role)` node `id` reports for itself.
async fn self_role(control: &Control, id: u64) -> Option<(i64, String)> {
    let client = control.client(id).await.ok()?;
    let sql = "SELECT term, role FROM sluice_cluster WHERE is_self";
    let rows = tokio::time::timeout(Duration::from_secs(2), client.query(sql, &[]))
        .await
        .ok()?
        .ok()?;
    rows.first().map(|r| (r.get(0), r.get(1)))
}

/// An error as `SQLSTATE: message`, or the client's own text.
pub fn describe(e: &tokio_postgres::Error) -> String {
    match e.as_db_error() {
        Some(db) => format!("{}: {}", db.code().code(), db.message()),
        None => e.to_string(),
    }
}

/// Copies a node's stdout into its log, sending the port of its `listening on` line.
fn copy_output(stdout: impl std::io::Read, mut log: File, tx: mpsc::Sender<u16>) {
    let mut tx = Some(tx);
    for line in BufReader::new(stdout).lines() {
        let Ok(line) = line else { break };
        let _ = writeln!(log, "{line}");
        if let Some(port) = parse_listening_port(&line) {
            if let Some(tx) = tx.take() {
                let _ = tx.send(port);
            }
        }
    }
}
