//! Three-node clusters of real processes: writes and reads on any node, leader failover
//! under load (SIGKILL), a partitioned leader, snapshot catch-up and membership changes.
//! Every test checks the same end state: each acknowledged row is present exactly once on
//! every node, offsets are gapless, and all nodes hold the same stream.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sluice_tests::cluster::{connect, Cluster};
use sluice_tests::{exec, sqlstate};
use tokio_postgres::Client;

/// The tests in this file run one at a time: each starts three or four processes, and
/// failover timing should not depend on another cluster competing for the same cores.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Ports of the nodes that are up, shared with the load tasks.
type Ports = Arc<Mutex<BTreeMap<u64, u16>>>;

fn ports_of(cluster: &Cluster) -> BTreeMap<u64, u16> {
    cluster
        .nodes
        .keys()
        .filter_map(|id| Some((*id, cluster.pg_port(*id)?)))
        .collect()
}

/// Clients inserting unique ids into `load` through the nodes in turn, until stopped or
/// bounded (count and time). Each id is tried once; an error moves on to the next id.
struct Load {
    stop: Arc<AtomicBool>,
    acked: Arc<Mutex<Vec<i64>>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Load {
    fn start(clients: usize, ports: Ports, nodes: Vec<u64>) -> Load {
        let stop = Arc::new(AtomicBool::new(false));
        let acked = Arc::new(Mutex::new(Vec::new()));
        let mut tasks = Vec::new();
        for c in 0..clients {
            let (stop, acked, ports, nodes) =
                (stop.clone(), acked.clone(), ports.clone(), nodes.clone());
            tasks.push(tokio::spawn(async move {
                let deadline = Instant::now() + Duration::from_secs(300);
                let mut client: Option<Client> = None;
                let mut turn = c;
                for seq in 0..100_000i64 {
                    if stop.load(Ordering::SeqCst) || Instant::now() > deadline {
                        break;
                    }
                    if client.is_none() {
                        turn += 1;
                        let node = nodes[turn % nodes.len()];
                        let port = ports.lock().expect("lock").get(&node).copied();
                        let Some(port) = port else {
                            tokio::time::sleep(Duration::from_millis(50)).await;
                            continue;
                        };
                        match connect(port).await {
                            Ok(cl) => client = Some(cl),
                            Err(_) => {
                                tokio::time::sleep(Duration::from_millis(50)).await;
                                continue;
                            }
                        }
                    }
                    let id = c as i64 * 1_000_000 + seq;
                    let cl = client.as_ref().expect("connected");
                    let r = tokio::time::timeout(
                        Duration::from_secs(20),
                        cl.execute("INSERT INTO load VALUES ($1)", &[&id]),
                    )
                    .await;
                    match r {
                        Ok(Ok(1)) => acked.lock().expect("lock").push(id),
                        Ok(Ok(n)) => panic!("INSERT of one row reported {n}"),
                        Ok(Err(e)) => {
                            let code = sqlstate(&e).map(str::to_string);
                            assert!(
                                e.is_closed()
                                    || matches!(
                                        code.as_deref(),
                                        // 57P03: a node removed from the cluster
                                        Some("40001" | "40003" | "57P01" | "57P03" | "58030")
                                    ),
                                "unexpected error from a write: {e:?}"
                            );
                            client = None;
                            tokio::time::sleep(Duration::from_millis(20)).await;
                        }
                        Err(_) => client = None,
                    }
                }
            }));
        }
        Load { stop, acked, tasks }
    }

    fn acked(&self) -> usize {
        self.acked.lock().expect("lock").len()
    }

    async fn finish(self) -> Vec<i64> {
        self.stop.store(true, Ordering::SeqCst);
        for t in self.tasks {
            t.await.expect("load task");
        }
        let acked = self.acked.lock().expect("lock").clone();
        acked
    }
}

/// Waits (bounded) until `acked` more rows than `from` are acknowledged.
async fn wait_acked(load: &Load, from: usize, more: usize) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while load.acked() < from + more {
        assert!(
            Instant::now() < deadline,
            "writes stalled at {} acknowledged",
            load.acked()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Tries an INSERT on fresh connections to `nodes` until one is acknowledged; returns when.
async fn first_write_after(cluster: &Cluster, nodes: &[u64], limit: Duration) -> Instant {
    let deadline = Instant::now() + limit;
    loop {
        for id in nodes {
            let Some(port) = cluster.pg_port(*id) else {
                continue;
            };
            if let Ok(client) = connect(port).await {
                let r = tokio::time::timeout(
                    Duration::from_millis(1500),
                    client.execute("INSERT INTO probe VALUES (1)", &[]),
                )
                .await;
                if matches!(r, Ok(Ok(1))) {
                    return Instant::now();
                }
            }
        }
        assert!(
            Instant::now() < deadline,
            "no write succeeded within {limit:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The `load` stream on node `id` read linearizably: (offset, id) in offset order.
async fn rows(cluster: &Cluster, id: u64) -> Vec<(i64, i64)> {
    let client = cluster.client(id).await;
    exec(&client, "SET read_consistency = 'linearizable'").await;
    let rows = tokio::time::timeout(
        Duration::from_secs(30),
        client.query("SELECT \"offset\", id FROM load ORDER BY \"offset\"", &[]),
    )
    .await
    .expect("read within 30s")
    .expect("read");
    rows.iter().map(|r| (r.get(0), r.get(1))).collect()
}

/// The end-state checks, on `nodes`: identical streams, gapless offsets, no duplicate, every
/// acknowledged id present.
async fn check_converged(cluster: &Cluster, nodes: &[u64], acked: &[i64]) -> usize {
    let deadline = Instant::now() + Duration::from_secs(60);
    let first = loop {
        let first = rows(cluster, nodes[0]).await;
        let mut same = true;
        for id in &nodes[1..] {
            if rows(cluster, *id).await != first {
                same = false;
            }
        }
        if same {
            break first;
        }
        assert!(
            Instant::now() < deadline,
            "nodes {nodes:?} did not converge"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    for (i, (offset, _)) in first.iter().enumerate() {
        assert_eq!(*offset, i as i64, "offsets are gapless");
    }
    let ids: Vec<i64> = first.iter().map(|(_, id)| *id).collect();
    let set: BTreeSet<i64> = ids.iter().copied().collect();
    assert_eq!(set.len(), ids.len(), "a row is present twice");
    for a in acked {
        assert!(set.contains(a), "acknowledged id {a} is missing");
    }
    ids.len()
}

/// Segment files of every stream, by relative path, must be byte-identical across nodes.
fn assert_identical_segments(cluster: &Cluster, nodes: &[u64]) {
    let files = |id: u64| -> BTreeMap<String, Vec<u8>> {
        let streams = cluster.data_dir(id).join("streams");
        let mut out = BTreeMap::new();
        for d in std::fs::read_dir(&streams).expect("streams dir").flatten() {
            for f in std::fs::read_dir(d.path()).expect("stream dir").flatten() {
                let rel = format!(
                    "{}/{}",
                    d.file_name().to_string_lossy(),
                    f.file_name().to_string_lossy()
                );
                out.insert(rel, std::fs::read(f.path()).expect("read segment"));
            }
        }
        out
    };
    let first = files(nodes[0]);
    assert!(!first.is_empty());
    for id in &nodes[1..] {
        let other = files(*id);
        assert_eq!(
            first.keys().collect::<Vec<_>>(),
            other.keys().collect::<Vec<_>>(),
            "node {id} has other segment files than node {}",
            nodes[0]
        );
        for (name, bytes) in &first {
            assert!(
                other[name] == *bytes,
                "segment {name} differs between node {} and node {id}",
                nodes[0]
            );
        }
    }
}

async fn setup(cluster: &Cluster, on: u64) {
    let client = cluster.client(on).await;
    exec(&client, "CREATE STREAM load (id bigint NOT NULL)").await;
    exec(&client, "CREATE STREAM probe (x integer)").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_nodes_take_writes_and_serve_reads_on_every_node() {
    let _serial = SERIAL.lock().await;
    let cluster = Cluster::start(3, false, &[]).await;
    let leader = cluster
        .wait_leader(&[1, 2, 3], None, Duration::from_secs(30))
        .await;
    let follower = if leader == 1 { 2 } else { 1 };
    // DDL and writes on a follower are forwarded to the leader.
    let f = cluster.client(follower).await;
    exec(
        &f,
        "CREATE STREAM orders (customer text NOT NULL, amount numeric(12,2))",
    )
    .await;
    for id in 1..=3u64 {
        let c = cluster.client(id).await;
        let row = c
            .query_one(
                "INSERT INTO orders VALUES ($1, 10.5) RETURNING \"offset\"",
                &[&format!("c{id}")],
            )
            .await
            .unwrap_or_else(|e| panic!("insert on node {id}: {e:?}"));
        let _: i64 = row.get(0);
    }
    // Linearizable reads see every acknowledged write on every node at once.
    for id in 1..=3u64 {
        let c = cluster.client(id).await;
        exec(&c, "SET read_consistency = 'linearizable'").await;
        let rows = c
            .query(
                "SELECT \"offset\", customer FROM orders ORDER BY \"offset\"",
                &[],
            )
            .await
            .expect("statement on a live node");
        let got: Vec<(i64, String)> = rows.iter().map(|r| (r.get(0), r.get(1))).collect();
        assert_eq!(
            got,
            vec![(0, "c1".into()), (1, "c2".into()), (2, "c3".into())],
            "node {id}"
        );
    }
    // ALTER STREAM on a follower is forwarded and applied on every node: the new name
    // serves the same rows (linearizable reads), with the new options and the added
    // column's default.
    exec(&f, "ALTER STREAM orders SET (retention = '30 days')").await;
    exec(&f, "ALTER STREAM orders RENAME TO sales").await;
    exec(&f, "ALTER STREAM sales ADD COLUMN region text DEFAULT 'eu'").await;
    for id in 1..=3u64 {
        let c = cluster.client(id).await;
        exec(&c, "SET read_consistency = 'linearizable'").await;
        let rows = c
            .query(
                "SELECT count(*), (SELECT retention FROM sluice_streams WHERE name = 'sales'), \
                 min(region) FROM sales",
                &[],
            )
            .await
            .unwrap_or_else(|e| panic!("node {id} after the rename: {e:?}"));
        let (n, retention, region): (i64, Option<String>, Option<String>) =
            (rows[0].get(0), rows[0].get(1), rows[0].get(2));
        assert_eq!(
            (n, retention.as_deref(), region.as_deref()),
            (3, Some("2592000000 ms"), Some("eu")),
            "node {id}"
        );
    }
    exec(&f, "ALTER STREAM sales RENAME TO orders").await;
    // Prefix reads (the default) catch up on their own.
    let c = cluster.client(3).await;
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let n: i64 = c
            .query_one("SELECT count(*) FROM orders", &[])
            .await
            .expect("statement on a live node")
            .get(0);
        if n == 3 {
            break;
        }
        assert!(Instant::now() < deadline, "node 3 never applied the writes");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // sluice_cluster: every member, exactly one leader, this node's own indexes.
    let rows = c
        .query(
            "SELECT node_id, role, is_self, applied_index, address FROM sluice_cluster ORDER BY node_id",
            &[],
        )
        .await
        .expect("statement on a live node");
    assert_eq!(rows.len(), 3);
    let leaders = rows
        .iter()
        .filter(|r| r.get::<_, String>(1) == "leader")
        .count();
    assert_eq!(leaders, 1);
    let me = rows.iter().find(|r| r.get::<_, bool>(2)).expect("own row");
    assert_eq!(me.get::<_, i64>(0), 3);
    assert!(
        me.get::<_, Option<i64>>(3)
            .expect("statement on a live node")
            > 0
    );
    assert!(rows.iter().all(|r| r.get::<_, Option<String>>(4).is_some()));
    // Bad membership statements are refused with clear errors; the session goes on.
    for (sql, code) in [
        ("ALTER CLUSTER ADD NODE 0 '127.0.0.1:1'", "22023"),
        ("ALTER CLUSTER ADD NODE 4 'nowhere'", "22023"),
        ("ALTER CLUSTER FROB NODE 4", "42601"),
    ] {
        let e = c.batch_execute(sql).await.expect_err("must be refused");
        assert_eq!(sqlstate(&e), Some(code), "{sql}: {e:?}");
    }
    exec(&c, "BEGIN").await;
    let e = c
        .batch_execute("ALTER CLUSTER REMOVE NODE 3")
        .await
        .expect_err("must be refused");
    assert_eq!(sqlstate(&e), Some("25001"));
    exec(&c, "ROLLBACK").await;
    let bad = c
        .batch_execute("SET read_consistency = 'eventually'")
        .await
        .expect_err("must be refused");
    assert_eq!(sqlstate(&bad), Some("22023"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn leader_failover_under_load_loses_no_acknowledged_row() {
    let _serial = SERIAL.lock().await;
    let mut cluster = Cluster::start(3, false, &["--checkpoint-entries", "500"]).await;
    setup(&cluster, 1).await;
    let ports: Ports = Arc::new(Mutex::new(ports_of(&cluster)));
    let load = Load::start(8, ports.clone(), vec![1, 2, 3]);
    wait_acked(&load, 0, 50).await;
    let mut resume = Vec::new();
    for round in 0..6 {
        let leader = cluster
            .wait_leader(&[1, 2, 3], None, Duration::from_secs(30))
            .await;
        let before = load.acked();
        let others: Vec<u64> = (1..=3).filter(|i| *i != leader).collect();
        ports.lock().expect("lock").remove(&leader);
        let killed_at = Instant::now();
        if round == 5 {
            // Once the old leader is stopped cleanly (SIGTERM: it hands leadership over, then
            // waits up to 5 s for its clients to leave) and restarted.
            cluster.terminate(leader);
        } else {
            cluster.kill(leader);
        }
        let resumed = first_write_after(&cluster, &others, Duration::from_secs(30)).await;
        if round == 5 {
            cluster.stop(leader).await;
        }
        resume.push(resumed - killed_at);
        wait_acked(&load, before, 20).await;
        cluster.restart(leader).await;
        *ports.lock().expect("lock") = ports_of(&cluster);
        wait_acked(&load, load.acked(), 20).await;
    }
    let acked = load.finish().await;
    eprintln!("write resumption after each leader loss: {resume:?}");
    for (i, r) in resume.iter().enumerate() {
        assert!(
            *r < Duration::from_secs(5),
            "round {i}: writes resumed {r:?} after the leader was lost"
        );
    }
    let n = check_converged(&cluster, &[1, 2, 3], &acked).await;
    assert!(n >= acked.len());
    for id in 1..=3 {
        cluster.stop(id).await;
    }
    assert_identical_segments(&cluster, &[1, 2, 3]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_partitioned_leader_acknowledges_nothing_and_converges_after_healing() {
    let _serial = SERIAL.lock().await;
    let cluster = Cluster::start(3, true, &[]).await;
    setup(&cluster, 1).await;
    let ports: Ports = Arc::new(Mutex::new(ports_of(&cluster)));
    let old = cluster
        .wait_leader(&[1, 2, 3], None, Duration::from_secs(30))
        .await;
    let majority: Vec<u64> = (1..=3).filter(|i| *i != old).collect();
    let load = Load::start(4, ports.clone(), majority.clone());
    wait_acked(&load, 0, 20).await;
    // Writes sent to the old leader while it is cut off.
    let old_client = cluster.client(old).await;
    cluster.isolate(old, true).await;
    let mut on_old = Vec::new();
    for i in 0..3i64 {
        let r = tokio::time::timeout(
            Duration::from_secs(30),
            old_client.execute("INSERT INTO load VALUES ($1)", &[&(-1 - i)]),
        )
        .await
        .expect("the old leader answers within 30s");
        on_old.push(r);
    }
    for r in &on_old {
        let e = r
            .as_ref()
            .expect_err("a cut-off leader acknowledged a write");
        assert!(
            matches!(sqlstate(e), Some("40001" | "40003")),
            "retryable error expected, got {e:?}"
        );
    }
    // The majority elected a leader and takes writes.
    let new = cluster
        .wait_leader(&majority, Some(old), Duration::from_secs(30))
        .await;
    assert!(majority.contains(&new));
    let before = load.acked();
    wait_acked(&load, before, 50).await;
    cluster.isolate(old, false).await;
    wait_acked(&load, load.acked(), 20).await;
    let acked = load.finish().await;
    check_converged(&cluster, &[1, 2, 3], &acked).await;
    // Nothing the old leader was sent during the partition is in the log.
    let all = rows(&cluster, old).await;
    assert!(
        all.iter().all(|(_, id)| *id >= 0),
        "an unacknowledged write resurfaced? {all:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_lagging_node_catches_up_by_snapshot_and_members_change_under_load() {
    let _serial = SERIAL.lock().await;
    let mut cluster = Cluster::start(3, false, &["--checkpoint-entries", "100"]).await;
    setup(&cluster, 1).await;
    cluster.stop(3).await;
    let ports: Ports = Arc::new(Mutex::new(ports_of(&cluster)));
    let load = Load::start(8, ports.clone(), vec![1, 2]);
    // Thousands of entries while node 3 is down: the others compact far past it.
    wait_acked(&load, 0, 2500).await;
    cluster.restart(3).await;
    *ports.lock().expect("lock") = ports_of(&cluster);
    let c3 = cluster.client(3).await;
    let installed: i64 = c3
        .query_one(
            "SELECT value FROM sluice_stats WHERE metric = 'snapshots_installed'",
            &[],
        )
        .await
        .expect("statement on a live node")
        .get(0);
    assert!(installed >= 1, "node 3 caught up without a snapshot?");
    // Add node 4 while writes go on, then remove node 1.
    let addr = cluster.spawn_joining(4);
    let c1 = cluster.client(1).await;
    exec(&c1, &format!("ALTER CLUSTER ADD NODE 4 '{addr}'")).await;
    cluster.wait_ready(4).await;
    *ports.lock().expect("lock") = ports_of(&cluster);
    wait_acked(&load, load.acked(), 100).await;
    let c2 = cluster.client(2).await;
    match c2.batch_execute("ALTER CLUSTER REMOVE NODE 1").await {
        Ok(()) => {}
        // node 2 learned the change's entry through a snapshot: its outcome is unknown to
        // node 2, which says so; the membership checked below decides
        Err(e) if e.code().map(|c| c.code()) == Some("40003") => {}
        Err(e) => panic!("ALTER CLUSTER REMOVE NODE 1: {e}"),
    }
    ports.lock().expect("lock").remove(&1);
    let before = load.acked();
    wait_acked(&load, before, 100).await;
    let acked = load.finish().await;
    check_converged(&cluster, &[2, 3, 4], &acked).await;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let members: Vec<i64> = c2
            .query("SELECT node_id FROM sluice_cluster ORDER BY node_id", &[])
            .await
            .expect("statement on a live node")
            .iter()
            .map(|r| r.get(0))
            .collect();
        if members == [2, 3, 4] {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "members after removing node 1: {members:?}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
}

/// Stops the example cluster however the test ends.
struct ExampleCluster {
    script: std::path::PathBuf,
    env: Vec<(String, String)>,
}

impl ExampleCluster {
    fn run(&self, arg: &str) -> std::process::Output {
        std::process::Command::new("bash")
            .arg(&self.script)
            .arg(arg)
            .envs(self.env.iter().cloned())
            .output()
            .expect("run examples/cluster.sh")
    }
}

impl Drop for ExampleCluster {
    fn drop(&mut self) {
        let _ = self.run("stop");
    }
}

fn psql(port: u16, commands: &[&str]) -> String {
    let mut cmd = std::process::Command::new("psql");
    cmd.args([
        "-X",
        "-w",
        "-At",
        "-v",
        "ON_ERROR_STOP=1",
        "-h",
        "127.0.0.1",
    ])
    .args(["-p", &port.to_string(), "-U", "sluice", "-d", "sluice"]);
    for c in commands {
        cmd.args(["-c", c]);
    }
    let out = cmd.output().expect("run psql");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "psql {commands:?} failed: {}{stdout}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// A base port whose client ports (base+1..3) and Raft ports (base+101..103) are all free.
fn free_base_port() -> u16 {
    for _ in 0..200 {
        let base = 20_000 + rand::random::<u16>() % 30_000;
        let ports = [1, 2, 3, 101, 102, 103].map(|d| base + d);
        if ports
            .iter()
            .all(|p| std::net::TcpListener::bind(("127.0.0.1", *p)).is_ok())
        {
            return base;
        }
    }
    panic!("no free block of ports");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_example_script_starts_a_cluster_psql_uses_on_every_node() {
    let _serial = SERIAL.lock().await;
    if !sluice_tests::psql::psql_on_path() {
        println!("SKIPPED the_example_script_starts_a_cluster: `psql` is not on PATH");
        return;
    }
    let dir = tempfile::tempdir().expect("temp dir");
    let base = free_base_port();
    let cluster = ExampleCluster {
        script: std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/cluster.sh"),
        env: vec![
            (
                "SLUICE_BIN".into(),
                sluice_tests::binary_path().display().to_string(),
            ),
            ("CLUSTER_DIR".into(), dir.path().display().to_string()),
            ("BASE_PORT".into(), base.to_string()),
        ],
    };
    let started = cluster.run("start");
    let printed = String::from_utf8_lossy(&started.stdout).into_owned();
    assert!(
        started.status.success(),
        "cluster.sh start failed: {}{printed}",
        String::from_utf8_lossy(&started.stderr)
    );
    for id in 1..=3 {
        assert!(
            printed.contains(&format!("port={}", base + id)),
            "{printed}"
        );
    }
    let port = |id: u16| base + id;
    psql(
        port(2),
        &["CREATE STREAM orders (customer text NOT NULL, amount numeric(12,2))"],
    );
    psql(port(1), &["INSERT INTO orders VALUES ('ann', 10.50)"]);
    psql(
        port(3),
        &["INSERT INTO orders VALUES ('bob', 3), ('cid', 7.25)"],
    );
    for id in 1..=3 {
        let out = psql(
            port(id),
            &[
                "SET read_consistency = 'linearizable'",
                "SELECT \"offset\", customer, amount FROM orders ORDER BY \"offset\"",
            ],
        );
        assert_eq!(
            out.lines().filter(|l| l.contains('|')).collect::<Vec<_>>(),
            vec!["0|ann|10.50", "1|bob|3.00", "2|cid|7.25"],
            "node {id}"
        );
        let members = psql(port(id), &["SELECT count(*) FROM sluice_cluster"]);
        assert_eq!(members.trim(), "3");
    }
    let stopped = cluster.run("stop");
    assert!(stopped.status.success());
}
