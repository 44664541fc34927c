//! A cluster of real `sluice` processes on one machine, for failover, partition and
//! membership tests.
//!
//! Every node listens for Postgres clients on a port it picks (printed as `listening on`) and
//! for Raft peers on a port chosen here at run time. With `proxied`, node *j* reaches node *i*
//! through a TCP proxy owned by the test (one per direction), so a test can cut any link —
//! an in-process fault-injecting network, used where network namespaces are unavailable.
//! Every cluster test runs over authenticated peer connections: by default mutual TLS (member
//! certificates made by `tests/fixtures/tls/make-certs.sh` in the cluster's temp dir);
//! `SLUICE_TEST_PEER_AUTH=secret` (a shared cluster secret) or `=both` runs the same tests
//! with the other credentials. [`Cluster::start_with`] picks explicitly;
//! [`Cluster::start_open`] starts a cluster with no peer authentication.
//! Dropping the [`Cluster`] SIGKILLs every node and removes the data directories.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use tempfile::TempDir;
use tokio::net::{TcpListener, TcpStream};
use tokio_postgres::{Client, NoTls};

use crate::server::{spawn_sluice, CONNECT_TIMEOUT, STARTUP_TIMEOUT};

/// A free loopback port for a node to bind a moment later (bound here, then released).
///
/// The gap between the release and the node's bind is a race, so the port is one nothing else
/// will pick meanwhile: never one this process handed out before (a port released here is
/// what the kernel's `bind(0)` likes to give again: two nodes of one cluster once got the
/// same one), and taken below the kernel's ephemeral range, where no `bind(0)` (a node's
/// client listener, a proxy) and no outgoing connection's source port lands.
pub fn free_port() -> u16 {
    use rand::Rng;
    static ISSUED: std::sync::Mutex<std::collections::BTreeSet<u16>> =
        std::sync::Mutex::new(std::collections::BTreeSet::new());
    let mut issued = ISSUED.lock().unwrap_or_else(|e| e.into_inner());
    let below_ephemeral = below_ephemeral();
    let mut rng = rand::thread_rng();
    for _ in 0..1_000 {
        let port = match &below_ephemeral {
            Some(range) => rng.gen_range(range.clone()),
            None => bind_any(),
        };
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() && issued.insert(port) {
            return port;
        }
    }
    panic!("no free loopback port after 1000 tries")
}

/// Ports from 10000 up to the kernel's ephemeral range, where it has one to read and that
/// leaves room.
fn below_ephemeral() -> Option<std::ops::Range<u16>> {
    let range = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range").ok()?;
    let low: u16 = range.split_whitespace().next()?.parse().ok()?;
    (low > 12_000).then_some(10_000..low)
}

fn bind_any() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("pick a free port")
}

/// One direction of one link: forwards connections to `target` unless cut.
struct Link {
    cut: Arc<AtomicBool>,
    /// Bumped on every cut, so open connections notice and close.
    epoch: Arc<AtomicU64>,
    task: tokio::task::JoinHandle<()>,
}

impl Link {
    async fn start(target: u16) -> (Link, u16) {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind proxy");
        let port = listener.local_addr().expect("proxy addr").port();
        let cut = Arc::new(AtomicBool::new(false));
        let epoch = Arc::new(AtomicU64::new(0));
        let (c, e) = (cut.clone(), epoch.clone());
        let task = tokio::spawn(async move {
            loop {
                let Ok((inbound, _)) = listener.accept().await else {
                    continue;
                };
                if c.load(Ordering::SeqCst) {
                    drop(inbound);
                    continue;
                }
                let (c, e) = (c.clone(), e.clone());
                tokio::spawn(async move {
                    let Ok(outbound) = TcpStream::connect(("127.0.0.1", target)).await else {
                        return;
                    };
                    let start = e.load(Ordering::SeqCst);
                    let (mut ri, mut wi) = inbound.into_split();
                    let (mut ro, mut wo) = outbound.into_split();
                    let copy = async {
                        tokio::select! {
                            _ = tokio::io::copy(&mut ri, &mut wo) => {}
                            _ = tokio::io::copy(&mut ro, &mut wi) => {}
                        }
                    };
                    let watch = async {
                        while !c.load(Ordering::SeqCst) && e.load(Ordering::SeqCst) == start {
                            tokio::time::sleep(Duration::from_millis(10)).await;
                        }
                    };
                    tokio::select! {
                        _ = copy => {}
                        _ = watch => {}
                    }
                });
            }
        });
        (Link { cut, epoch, task }, port)
    }

    fn set_cut(&self, cut: bool) {
        self.cut.store(cut, Ordering::SeqCst);
        self.epoch.fetch_add(1, Ordering::SeqCst);
    }
}

impl Drop for Link {
    fn drop(&mut self) {
        self.task.abort();
    }
}

pub struct Node {
    pub id: u64,
    child: Option<Child>,
    pg_port: Option<u16>,
    port_rx: Option<mpsc::Receiver<u16>>,
    pub raft_port: u16,
    data_dir: PathBuf,
    args: Vec<String>,
    generation: u32,
}

pub struct Cluster {
    pub nodes: BTreeMap<u64, Node>,
    links: BTreeMap<(u64, u64), Link>,
    link_ports: BTreeMap<(u64, u64), u16>,
    extra: Vec<String>,
    /// Declared last: fields drop in order, so the nodes are killed before their data
    /// directories go.
    _root: TempDir,
}

/// What the members of a test cluster authenticate each other with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PeerCredentials {
    pub tls: bool,
    pub secret: bool,
}

impl PeerCredentials {
    /// Mutual TLS unless `SLUICE_TEST_PEER_AUTH` says `secret` or `both`.
    pub fn from_env() -> PeerCredentials {
        match std::env::var("SLUICE_TEST_PEER_AUTH").as_deref() {
            Ok("secret") => PeerCredentials {
                tls: false,
                secret: true,
            },
            Ok("both") => PeerCredentials {
                tls: true,
                secret: true,
            },
            Ok("tls") | Err(_) => PeerCredentials {
                tls: true,
                secret: false,
            },
            Ok(other) => panic!("SLUICE_TEST_PEER_AUTH={other}: expected tls, secret or both"),
        }
    }
}

/// Makes the test certificates (see `tests/fixtures/tls/make-certs.sh`) in `dir`.
pub fn make_certs(dir: &Path) {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/tls/make-certs.sh");
    let status = Command::new("bash")
        .arg(script)
        .arg(dir)
        .status()
        .expect("run make-certs.sh");
    assert!(status.success(), "make-certs.sh failed");
}

impl Cluster {
    /// Starts `n` nodes (ids 1..=n) authenticating each other as [`PeerCredentials::from_env`]
    /// says, and waits until each serves clients.
    pub async fn start(n: u64, proxied: bool, extra: &[&str]) -> Cluster {
        Cluster::start_with(n, proxied, extra, PeerCredentials::from_env()).await
    }

    /// [`Cluster::start`] without peer authentication (what a loopback-only cluster may
    /// still do).
    pub async fn start_open(n: u64, proxied: bool, extra: &[&str]) -> Cluster {
        let none = PeerCredentials {
            tls: false,
            secret: false,
        };
        Cluster::start_with(n, proxied, extra, none).await
    }

    /// [`Cluster::start`] with the given peer credentials; the member certificates (when
    /// `tls`) are in [`Cluster::certs`].
    pub async fn start_with(
        n: u64,
        proxied: bool,
        extra: &[&str],
        credentials: PeerCredentials,
    ) -> Cluster {
        let root = tempfile::Builder::new()
            .prefix("sluice-cluster-")
            .tempdir()
            .expect("temp dir");
        let mut extra: Vec<String> = extra.iter().map(|s| s.to_string()).collect();
        if credentials.tls {
            let certs = root.path().join("certs");
            make_certs(&certs);
            for (flag, file) in [
                ("--peer-cert", "peer.pem"),
                ("--peer-key", "peer.key"),
                ("--peer-ca", "peer-ca.pem"),
            ] {
                extra.extend([flag.into(), certs.join(file).display().to_string()]);
            }
        }
        if credentials.secret {
            let path = root.path().join("cluster-secret");
            let secret: String = (0..32)
                .map(|_| char::from(b"0123456789abcdef"[rand::random::<usize>() % 16]))
                .collect();
            std::fs::write(&path, format!("{secret}\n")).expect("write the cluster secret");
            extra.extend(["--cluster-secret-file".into(), path.display().to_string()]);
        }
        let mut cluster = Cluster {
            _root: root,
            nodes: BTreeMap::new(),
            links: BTreeMap::new(),
            link_ports: BTreeMap::new(),
            extra,
        };
        for id in 1..=n {
            cluster.nodes.insert(id, cluster.new_node(id));
        }
        if proxied {
            for i in 1..=n {
                for j in 1..=n {
                    if i != j {
                        let target = cluster.nodes[&j].raft_port;
                        let (link, port) = Link::start(target).await;
                        cluster.links.insert((i, j), link);
                        cluster.link_ports.insert((i, j), port);
                    }
                }
            }
        }
        let ids: Vec<u64> = cluster.nodes.keys().copied().collect();
        let extra = cluster.extra.clone();
        for id in &ids {
            let peers = cluster.peers_for(*id, &ids);
            let node = cluster.nodes.get_mut(id).expect("known node");
            node.args = vec!["--node-id".into(), id.to_string(), "--peers".into(), peers];
            node.spawn_with(&extra);
        }
        for id in ids {
            cluster.wait_ready(id).await;
        }
        cluster
    }

    /// Where the test certificates are (made only for a cluster with peer TLS).
    pub fn certs(&self) -> PathBuf {
        self._root.path().join("certs")
    }

    fn new_node(&self, id: u64) -> Node {
        let data_dir = self._root.path().join(format!("node{id}"));
        Node {
            id,
            child: None,
            pg_port: None,
            port_rx: None,
            raft_port: free_port(),
            data_dir,
            args: Vec::new(),
            generation: 0,
        }
    }

    /// The `--peers` value for node `me`: its own Raft address, and every other node's
    /// address as `me` reaches it (through the proxy when proxied).
    fn peers_for(&self, me: u64, ids: &[u64]) -> String {
        ids.iter()
            .map(|&id| {
                let port = match self.link_ports.get(&(me, id)) {
                    Some(p) if id != me => *p,
                    _ => self.nodes[&id].raft_port,
                };
                format!("{id}=127.0.0.1:{port}")
            })
            .collect::<Vec<_>>()
            .join(",")
    }

    /// Adds node `id` as a process started with `--join` (not yet a member; add it with
    /// `ALTER CLUSTER ADD NODE`). Not proxied. Returns its Raft address.
    pub fn spawn_joining(&mut self, id: u64) -> String {
        let mut node = self.new_node(id);
        let addr = format!("127.0.0.1:{}", node.raft_port);
        let mut peers: Vec<String> = self
            .nodes
            .iter()
            .map(|(i, n)| format!("{i}=127.0.0.1:{}", n.raft_port))
            .collect();
        peers.push(format!("{id}={addr}"));
        node.args = vec![
            "--node-id".into(),
            id.to_string(),
            "--peers".into(),
            peers.join(","),
            "--join".into(),
        ];
        node.spawn_with(&self.extra);
        self.nodes.insert(id, node);
        addr
    }

    /// Waits (bounded) until node `id` prints `listening on`.
    pub async fn wait_ready(&mut self, id: u64) {
        let extra = self.extra.clone();
        let node = self.node_mut(id);
        if node.child.is_none() {
            node.spawn_with(&extra);
        }
        let deadline = Instant::now() + STARTUP_TIMEOUT;
        let rx = node.port_rx.take().expect("node was spawned");
        loop {
            match rx.try_recv() {
                Ok(port) => {
                    node.pg_port = Some(port);
                    return;
                }
                Err(mpsc::TryRecvError::Disconnected) => {
                    panic!("node {id} exited before serving clients; see its output above")
                }
                Err(mpsc::TryRecvError::Empty) => {}
            }
            assert!(
                Instant::now() < deadline,
                "node {id} did not serve clients within {STARTUP_TIMEOUT:?}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    pub fn is_up(&self, id: u64) -> bool {
        self.nodes[&id].pg_port.is_some()
    }

    pub fn pg_port(&self, id: u64) -> Option<u16> {
        self.nodes.get(&id).and_then(|n| n.pg_port)
    }

    pub fn data_dir(&self, id: u64) -> &Path {
        &self.nodes[&id].data_dir
    }

    /// SIGKILL.
    pub fn kill(&mut self, id: u64) {
        self.node_mut(id).kill();
    }

    /// Sends SIGTERM without waiting for the exit (see [`Cluster::stop`]).
    pub fn terminate(&self, id: u64) {
        if let Some(child) = self.nodes.get(&id).and_then(|n| n.child.as_ref()) {
            let _ = Command::new("kill")
                .args(["-TERM", &child.id().to_string()])
                .status();
        }
    }

    /// SIGTERM and wait (bounded) for a clean exit; panics on a failed exit.
    pub async fn stop(&mut self, id: u64) {
        let node = self.node_mut(id);
        let Some(mut child) = node.child.take() else {
            return;
        };
        node.pg_port = None;
        let pid = child.id().to_string();
        let _ = Command::new("kill").args(["-TERM", &pid]).status();
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(status) = child.try_wait().expect("wait") {
                assert!(status.success(), "node {id} exited with {status}");
                return;
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                panic!("node {id} did not exit within 30s of SIGTERM");
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Starts a stopped node again (same data directory and arguments) and waits for it.
    pub async fn restart(&mut self, id: u64) {
        let extra = self.extra.clone();
        let node = self.node_mut(id);
        assert!(node.child.is_none(), "node {id} is still running");
        node.generation += 1;
        node.spawn_with(&extra);
        self.wait_ready(id).await;
    }

    /// Cuts (or restores) every link to and from `id`; returns once open connections over
    /// the cut links are closed (they are checked every 10 ms).
    pub async fn isolate(&self, id: u64, cut: bool) {
        for ((a, b), link) in &self.links {
            if *a == id || *b == id {
                link.set_cut(cut);
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    /// A client of node `id`.
    pub async fn client(&self, id: u64) -> Client {
        let port = self
            .pg_port(id)
            .unwrap_or_else(|| panic!("node {id} is not up"));
        connect(port)
            .await
            .unwrap_or_else(|e| panic!("connect to node {id}: {e}"))
    }

    /// The leader as reported by any running node that knows one.
    pub async fn leader(&self) -> Option<u64> {
        let ids: Vec<u64> = self.nodes.keys().copied().collect();
        self.leader_among(&ids).await
    }

    /// The leader as reported by the first of `ids` that is up and knows one.
    pub async fn leader_among(&self, ids: &[u64]) -> Option<u64> {
        for id in ids {
            let Some(port) = self.pg_port(*id) else {
                continue;
            };
            let Ok(client) = connect(port).await else {
                continue;
            };
            let sql = "SELECT node_id FROM sluice_cluster WHERE role = 'leader'";
            if let Ok(Ok(rows)) =
                tokio::time::timeout(Duration::from_secs(5), client.query(sql, &[])).await
            {
                if let Some(r) = rows.first() {
                    return Some(r.get::<_, i64>(0) as u64);
                }
            }
        }
        None
    }

    /// Waits (bounded) until one of `ids` reports a leader other than `not`.
    pub async fn wait_leader(&self, ids: &[u64], not: Option<u64>, limit: Duration) -> u64 {
        let deadline = Instant::now() + limit;
        loop {
            if let Some(l) = self.leader_among(ids).await {
                if Some(l) != not {
                    return l;
                }
            }
            assert!(Instant::now() < deadline, "no new leader within {limit:?}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

impl Cluster {
    fn node_mut(&mut self, id: u64) -> &mut Node {
        self.nodes
            .get_mut(&id)
            .unwrap_or_else(|| panic!("no node {id} in this cluster"))
    }
}

/// Connects to a Postgres port (bounded), running the connection on the current runtime.
pub async fn connect(port: u16) -> Result<Client, String> {
    let conn = format!("host=127.0.0.1 port={port} user=sluice dbname=sluice connect_timeout=5");
    let (client, connection) =
        tokio::time::timeout(CONNECT_TIMEOUT, tokio_postgres::connect(&conn, NoTls))
            .await
            .map_err(|_| "connect timed out".to_string())?
            .map_err(|e| e.to_string())?;
    tokio::spawn(async move {
        let _ = connection.await;
    });
    Ok(client)
}

impl Node {
    fn spawn_with(&mut self, extra: &[String]) {
        let mut args = self.args.clone();
        args.extend(extra.iter().cloned());
        let tag = format!("node{}#{}", self.id, self.generation);
        let (child, rx) = spawn_sluice(&self.data_dir, &args, tag);
        self.child = Some(child);
        self.port_rx = Some(rx);
        self.pg_port = None;
    }

    fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        self.pg_port = None;
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        self.kill();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Fails on the old `bind(0)`-then-release picker: within a few hundred calls the kernel
    /// hands the same port out twice (what let two nodes of one cluster share a Raft port).
    #[test]
    fn free_ports_are_never_handed_out_twice_and_avoid_the_ephemeral_range() {
        let below_ephemeral = below_ephemeral();
        let mut seen = std::collections::BTreeSet::new();
        for _ in 0..500 {
            let port = free_port();
            assert!(seen.insert(port), "port {port} handed out twice");
            if let Some(range) = &below_ephemeral {
                assert!(
                    range.contains(&port),
                    "port {port} is outside {range:?}, below the ephemeral range"
                );
            }
        }
    }
}
