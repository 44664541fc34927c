//! The cluster transport with a cluster secret and with peer TLS, attacked from outside: a
//! process without the credential that reaches a node's Raft port — with well-formed frames
//! and no handshake (a high-term heartbeat and append that would depose the leader, a
//! forwarded membership change and command), with a handshake made with the wrong secret,
//! over TLS with a certificate from another CA or with none — is disconnected, and the
//! cluster's leader, term, members and rows are unchanged. The same frames sent to a cluster
//! without peer authentication do move its term: the attack is real, so the checks above can
//! fail.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use prost::Message as _;
use raft::eraftpb::{ConfChangeSingle, ConfChangeType, ConfChangeV2, MessageType};
use sluice_consensus::peer_auth::{self, PeerAuth};
use sluice_consensus::transport::{Body, Envelope, Forward};
use sluice_consensus::{ClusterSecret, PeerTls};
use sluice_tests::cluster::{Cluster, PeerCredentials};
use sluice_tests::exec;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Each test starts three processes; they run one at a time.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// How far above the cluster's term the intruder claims to be.
const TERM_JUMP: u64 = 1000;

/// Each node's view: (leader it reports, its term).
async fn views(cluster: &Cluster) -> BTreeMap<u64, (i64, i64)> {
    let mut out = BTreeMap::new();
    for id in 1..=3 {
        let c = cluster.client(id).await;
        let row = c
            .query_one(
                "SELECT (SELECT node_id FROM sluice_cluster WHERE role = 'leader'), \
                 (SELECT term FROM sluice_cluster WHERE is_self)",
                &[],
            )
            .await
            .expect("sluice_cluster");
        let leader: Option<i64> = row.get(0);
        out.insert(id, (leader.unwrap_or(0), row.get(1)));
    }
    out
}

/// The rows of `events` on every node, read linearizably.
async fn rows(cluster: &Cluster) -> BTreeMap<u64, Vec<(i64, i64)>> {
    let mut out = BTreeMap::new();
    for id in 1..=3 {
        let c = cluster.client(id).await;
        exec(&c, "SET read_consistency = 'linearizable'").await;
        let rows = c
            .query("SELECT \"offset\", id FROM events ORDER BY \"offset\"", &[])
            .await
            .expect("read");
        out.insert(id, rows.iter().map(|r| (r.get(0), r.get(1))).collect());
    }
    out
}

fn frame(env: Envelope) -> Vec<u8> {
    let bytes = env.encode_to_vec();
    [(bytes.len() as u32).to_be_bytes().to_vec(), bytes].concat()
}

/// Well-formed frames to node `to`, claiming to come from member `from`: a forwarded removal
/// of `from` and a forwarded command (in the current `term`), then [`raft_frames`].
fn hostile_frames(from: u64, to: u64, term: u64) -> Vec<u8> {
    let mut removal = ConfChangeV2::default();
    let mut single = ConfChangeSingle::default();
    single.set_change_type(ConfChangeType::RemoveNode);
    single.node_id = from;
    removal.mut_changes().push(single);
    let forward = |command: Vec<u8>, conf_change: bool| {
        frame(Envelope {
            from,
            body: Some(Body::Forward(Forward {
                tag: 1,
                command,
                conf_change,
                term,
                attempt: 0,
            })),
        })
    };
    [
        forward(
            protobuf::Message::write_to_bytes(&removal).expect("encode"),
            true,
        ),
        forward(b"not a command".to_vec(), false),
        raft_frames(from, to, term),
    ]
    .concat()
}

/// A heartbeat and an append to node `to` from a "leader" `from` `TERM_JUMP` terms ahead of
/// `term`: a node that takes them steps down and adopts that term.
fn raft_frames(from: u64, to: u64, term: u64) -> Vec<u8> {
    let raft = |kind: MessageType| {
        let mut m = raft::eraftpb::Message::default();
        m.set_msg_type(kind);
        (m.from, m.to, m.term) = (from, to, term + TERM_JUMP);
        let bytes = protobuf::Message::write_to_bytes(&m).expect("encode");
        frame(Envelope {
            from,
            body: Some(Body::Raft(bytes)),
        })
    };
    [
        raft(MessageType::MsgHeartbeat),
        raft(MessageType::MsgAppend),
    ]
    .concat()
}

/// Waits (bounded) for the node to close `socket`; returns how many bytes it sent first.
async fn closed_by_node(socket: &mut TcpStream, what: &str) -> usize {
    let mut sent = Vec::new();
    match tokio::time::timeout(Duration::from_secs(10), socket.read_to_end(&mut sent)).await {
        Ok(Ok(_)) => {}
        Ok(Err(e)) => assert_eq!(e.kind(), std::io::ErrorKind::ConnectionReset, "{what}: {e}"),
        Err(_) => panic!("{what}: the node kept the connection open"),
    }
    sent.len()
}

async fn raft_socket(cluster: &Cluster, id: u64) -> TcpStream {
    TcpStream::connect(("127.0.0.1", cluster.nodes[&id].raft_port))
        .await
        .expect("connect to a Raft port")
}

/// A cluster with five rows and a leader, and what every node sees before an attack.
struct Before {
    cluster: Cluster,
    client: tokio_postgres::Client,
    rows: BTreeMap<u64, Vec<(i64, i64)>>,
    views: BTreeMap<u64, (i64, i64)>,
    term: u64,
}

async fn cluster_with_rows(credentials: PeerCredentials) -> Before {
    let cluster = Cluster::start_with(3, false, &[], credentials).await;
    let leader = cluster
        .wait_leader(&[1, 2, 3], None, Duration::from_secs(30))
        .await;
    let client = cluster.client(leader).await;
    exec(&client, "CREATE STREAM events (id bigint NOT NULL)").await;
    for i in 0..5i64 {
        client
            .execute("INSERT INTO events VALUES ($1)", &[&i])
            .await
            .expect("insert");
    }
    let before = rows(&cluster).await;
    let expected: Vec<(i64, i64)> = (0..5).map(|i| (i, i)).collect();
    assert!(before.values().all(|r| *r == expected), "{before:?}");
    let views_before = views(&cluster).await;
    let term = views_before[&leader].1 as u64;
    assert!(
        views_before
            .values()
            .all(|v| *v == (leader as i64, term as i64)),
        "{views_before:?}"
    );
    Before {
        cluster,
        client,
        rows: before,
        views: views_before,
        term,
    }
}

/// After the attacks: nothing moved, and writes keep working and reach every node.
async fn unchanged(before: Before) {
    // A few heartbeat rounds for any effect to show.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let Before {
        cluster, client, ..
    } = &before;
    assert_eq!(views(cluster).await, before.views);
    assert_eq!(rows(cluster).await, before.rows);
    let members: i64 = client
        .query_one("SELECT count(*) FROM sluice_cluster", &[])
        .await
        .expect("members")
        .get(0);
    assert_eq!(members, 3);
    client
        .execute("INSERT INTO events VALUES (5)", &[])
        .await
        .expect("insert after the intrusion");
    let expected: Vec<(i64, i64)> = (0..6).map(|i| (i, i)).collect();
    let after = rows(cluster).await;
    assert!(after.values().all(|r| *r == expected), "{after:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_intruder_without_the_secret_is_dropped_and_changes_nothing() {
    let _serial = SERIAL.lock().await;
    let secret = PeerCredentials {
        tls: false,
        secret: true,
    };
    let before = cluster_with_rows(secret).await;
    let (cluster, term) = (&before.cluster, before.term);
    for id in 1..=3 {
        let member = if id == 1 { 2 } else { 1 };
        // (a) Frames with no handshake.
        let mut socket = raft_socket(cluster, id).await;
        let _ = socket.write_all(&hostile_frames(member, id, term)).await;
        let sent = closed_by_node(&mut socket, "frames without a handshake").await;
        assert!(
            sent <= 40,
            "node {id} sent {sent} bytes beyond its challenge"
        );
        // (b) A handshake with the wrong secret, then the same frames.
        let wrong = ClusterSecret::new(*b"not this cluster's secret").expect("secret");
        let mut socket = raft_socket(cluster, id).await;
        let refused = peer_auth::connect(&mut socket, &PeerAuth::new(wrong, member), id).await;
        assert!(refused.is_err(), "node {id} accepted a wrong secret");
        let _ = socket.write_all(&hostile_frames(member, id, term)).await;
        closed_by_node(&mut socket, "a wrong secret").await;
    }
    unchanged(before).await;
}

/// Writes `frames` over an established TLS stream and waits (bounded) for the node to end it.
async fn refused_over_tls<S>(mut tls: S, frames: &[u8], what: &str)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    // In TLS 1.3 the client finishes its handshake before the server has judged the client's
    // certificate: the refusal arrives as an alert (an error) or a close on the next read.
    let _ = tls.write_all(frames).await;
    let _ = tls.flush().await;
    let mut sent = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(10), tls.read_to_end(&mut sent)).await;
    assert!(read.is_ok(), "{what}: the node kept the connection open");
    assert!(
        sent.is_empty(),
        "{what}: the node sent {} bytes",
        sent.len()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_intruder_without_a_member_certificate_is_dropped_and_changes_nothing() {
    let _serial = SERIAL.lock().await;
    let tls = PeerCredentials {
        tls: true,
        secret: false,
    };
    let before = cluster_with_rows(tls).await;
    let (cluster, term) = (&before.cluster, before.term);
    let certs = cluster.certs();
    let at = |f: &str| certs.join(f);
    // Another CA's member certificate, trusting the cluster CA (so only the node can refuse).
    let intruder = PeerTls::load(&at("intruder.pem"), &at("intruder.key"), &at("peer-ca.pem"))
        .expect("intruder identity");
    // A TLS client that trusts the cluster CA and presents no certificate.
    let anonymous = {
        use tokio_rustls::rustls;
        let mut roots = rustls::RootCertStore::empty();
        let ca = std::fs::read(at("peer-ca.pem")).expect("ca");
        use rustls_pki_types::pem::PemObject;
        for c in rustls_pki_types::CertificateDer::pem_slice_iter(&ca) {
            roots.add(c.expect("pem")).expect("root");
        }
        let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
        let config = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .expect("versions")
            .with_root_certificates(roots)
            .with_no_client_auth();
        tokio_rustls::TlsConnector::from(std::sync::Arc::new(config))
    };
    for id in 1..=3 {
        let member = if id == 1 { 2 } else { 1 };
        let addr = format!("127.0.0.1:{}", cluster.nodes[&id].raft_port);
        let frames = hostile_frames(member, id, term);
        // (a) Frames with no TLS at all.
        let mut socket = raft_socket(cluster, id).await;
        let _ = socket.write_all(&frames).await;
        let sent = closed_by_node(&mut socket, "frames without TLS").await;
        assert!(
            sent <= 64,
            "node {id} answered plain frames with {sent} bytes"
        );
        // (b) TLS with a certificate from another CA, a hello as a member, then the frames.
        let socket = raft_socket(cluster, id).await;
        if let Ok(stream) = intruder.connect(socket, &addr, Some((member, id))).await {
            refused_over_tls(stream, &frames, "another CA's certificate").await;
        }
        // (c) TLS with no client certificate, then a member's hello and the frames.
        let socket = raft_socket(cluster, id).await;
        let name = rustls_pki_types::ServerName::try_from("127.0.0.1").expect("name");
        let hello = [&b"SLUICET1"[..], &member.to_be_bytes(), &id.to_be_bytes()].concat();
        if let Ok(stream) = anonymous.connect(name, socket).await {
            let attack = [hello, frames.clone()].concat();
            refused_over_tls(stream, &attack, "no client certificate").await;
        }
    }
    unchanged(before).await;
}

/// The control: a cluster without peer authentication (loopback only, as allowed) obeys the
/// same Raft frames.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn without_a_secret_the_same_frames_move_the_term() {
    let _serial = SERIAL.lock().await;
    let cluster = Cluster::start_open(3, false, &[]).await;
    let leader = cluster
        .wait_leader(&[1, 2, 3], None, Duration::from_secs(30))
        .await;
    let c = cluster.client(leader).await;
    let term_sql = "SELECT term FROM sluice_cluster WHERE is_self";
    let term: i64 = c.query_one(term_sql, &[]).await.expect("term").get(0);
    let member = if leader == 1 { 2 } else { 1 };
    let mut socket = raft_socket(&cluster, leader).await;
    socket
        .write_all(&raft_frames(member, leader, term as u64))
        .await
        .expect("an open Raft port takes the frames");
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let now: i64 = c.query_one(term_sql, &[]).await.expect("term").get(0);
        if now as u64 >= term as u64 + TERM_JUMP {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the intruder's term never reached node {leader} (term {now}, was {term})"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
