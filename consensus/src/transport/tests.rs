//! The transport with a cluster secret, with mutual TLS, and with both, over real loopback
//! connections: peers with the credential talk; anything else that connects is closed and
//! delivers nothing.

use super::*;
use crate::peer_auth::{self, ClusterSecret};

const SECRET: &[u8] = b"correct horse battery staple";
const MAX_FRAME: usize = 1 << 20;

fn auth(secret: &[u8], me: u64) -> PeerAuth {
    let mut auth = PeerAuth::new(ClusterSecret::new(secret).unwrap(), me);
    auth.handshake_timeout = Duration::from_millis(300);
    auth
}

fn envelope(from: u64, tag: u64) -> Envelope {
    Envelope {
        from,
        body: Some(Body::ForwardReply(ForwardReply {
            tag,
            ..Default::default()
        })),
    }
}

/// A transport for node `id` with `auth`, listening on a free loopback port.
fn node(
    id: u64,
    peers: &BTreeMap<u64, String>,
    auth: Option<PeerAuth>,
) -> (TcpTransport, mpsc::Receiver<Inbound>, SocketAddr) {
    secured(
        id,
        peers,
        PeerSecurity {
            secret: auth,
            tls: None,
        },
    )
}

/// A transport for node `id` with `security`, listening on a free loopback port.
fn secured(
    id: u64,
    peers: &BTreeMap<u64, String>,
    security: PeerSecurity,
) -> (TcpTransport, mpsc::Receiver<Inbound>, SocketAddr) {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let (tx, rx) = mpsc::channel(64);
    let t = TcpTransport::start(
        id,
        listener,
        peers,
        tx,
        MAX_FRAME,
        security,
        tokio::runtime::Handle::current(),
    )
    .unwrap();
    (t, rx, addr)
}

/// The envelopes that arrive within `wait`.
async fn received(rx: &mut mpsc::Receiver<Inbound>, wait: Duration) -> Vec<Envelope> {
    let mut got = Vec::new();
    let deadline = tokio::time::Instant::now() + wait;
    while let Ok(Some(msg)) = tokio::time::timeout_at(deadline, rx.recv()).await {
        if let Inbound::Envelope(env) = msg {
            got.push(env);
        }
    }
    got
}

/// Waits (bounded) for the listener to close `socket`; returns what it sent before.
async fn closed_by_listener(socket: &mut TcpStream) -> Vec<u8> {
    let mut sent = Vec::new();
    match tokio::time::timeout(Duration::from_secs(5), socket.read_to_end(&mut sent)).await {
        Ok(Ok(_)) => {}
        Ok(Err(e)) => assert_eq!(e.kind(), std::io::ErrorKind::ConnectionReset, "{e}"),
        Err(_) => panic!("the listener kept the connection open"),
    }
    sent
}

fn frame(env: &Envelope) -> Vec<u8> {
    let bytes = env.encode_to_vec();
    [(bytes.len() as u32).to_be_bytes().to_vec(), bytes].concat()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn peers_with_the_secret_exchange_frames() {
    let (_two, mut rx2, addr2) = node(2, &BTreeMap::new(), Some(auth(SECRET, 2)));
    let peers = BTreeMap::from([(2, addr2.to_string())]);
    let (mut one, _rx1, _) = node(1, &peers, Some(auth(SECRET, 1)));
    for tag in 0..3 {
        one.send(2, envelope(1, tag), false);
    }
    let got = received(&mut rx2, Duration::from_millis(1500)).await;
    assert_eq!(got, (0..3).map(|t| envelope(1, t)).collect::<Vec<_>>());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_with_another_secret_or_none_delivers_nothing() {
    let (_two, mut rx2, addr2) = node(2, &BTreeMap::new(), Some(auth(SECRET, 2)));
    let peers = BTreeMap::from([(2, addr2.to_string())]);
    let (mut wrong, mut rx_wrong, _) = node(1, &peers, Some(auth(b"not this cluster's secret", 1)));
    let (mut open, _rx_open, _) = node(3, &peers, None);
    for tag in 0..20 {
        wrong.send(2, envelope(1, tag), false);
        open.send(2, envelope(3, tag), false);
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert_eq!(received(&mut rx2, Duration::from_millis(500)).await, vec![]);
    // The refused sender learns its peer is unreachable (it retries with backoff).
    let mut unreachable = false;
    while let Ok(msg) = rx_wrong.try_recv() {
        unreachable |= matches!(msg, Inbound::Unreachable(2));
    }
    assert!(unreachable);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unauthenticated_frames_are_dropped_with_the_connection() {
    let (_two, mut rx2, addr2) = node(2, &BTreeMap::new(), Some(auth(SECRET, 2)));
    let mut socket = TcpStream::connect(addr2).await.unwrap();
    let frames: Vec<u8> = (0..10).flat_map(|t| frame(&envelope(1, t))).collect();
    let _ = socket.write_all(&frames).await;
    let sent = closed_by_listener(&mut socket).await;
    assert!(sent.len() <= 40, "more than the challenge: {sent:?}");
    assert_eq!(received(&mut rx2, Duration::from_millis(200)).await, vec![]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_handshake_is_dropped_at_the_deadline() {
    let (_two, _rx2, addr2) = node(2, &BTreeMap::new(), Some(auth(SECRET, 2)));
    let mut socket = TcpStream::connect(addr2).await.unwrap();
    socket.write_all(&[1u8; 10]).await.unwrap(); // part of an answer, then nothing
    let started = Instant::now();
    closed_by_listener(&mut socket).await;
    let took = started.elapsed();
    assert!(took < Duration::from_secs(2), "closed after {took:?}");
}

/// A peer that authenticates as node 3, then misbehaves: frames naming another sender,
/// a forged MAC, a replayed frame. Each closes the connection; only what came before arrives.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_authenticated_peer_is_dropped_at_its_first_bad_frame() {
    let (_two, mut rx2, addr2) = node(2, &BTreeMap::new(), Some(auth(SECRET, 2)));
    let three = auth(SECRET, 3);
    type Attack = fn(&mut Vec<u8>, &mut FrameSealer);
    let attacks: [(&str, Attack); 4] = [
        ("another sender", |out, sealer| {
            let bytes = envelope(1, 99).encode_to_vec();
            out.extend(&(bytes.len() as u32).to_be_bytes());
            out.extend(&bytes);
            out.extend(&sealer.seal(&bytes));
        }),
        ("a forged MAC", |out, _| {
            let bytes = envelope(3, 99).encode_to_vec();
            out.extend(&(bytes.len() as u32).to_be_bytes());
            out.extend(&bytes);
            out.extend(&[0u8; TAG_LEN]);
        }),
        ("a replayed frame", |out, _| {
            // The first frame, byte for byte, again.
            let first = out[..out.len()].to_vec();
            out.extend(&first);
        }),
        ("a huge announced length", |out, _| {
            out.extend(&u32::MAX.to_be_bytes());
        }),
    ];
    for (what, attack) in attacks {
        let mut socket = TcpStream::connect(addr2).await.unwrap();
        let mut session = peer_auth::connect(&mut socket, &three, 2).await.unwrap();
        let mut out = Vec::new();
        write_frame(
            &mut out,
            &envelope(3, 1).encode_to_vec(),
            Some(&mut session.sealer),
        )
        .await
        .unwrap();
        attack(&mut out, &mut session.sealer);
        write_frame(
            &mut out,
            &envelope(3, 2).encode_to_vec(),
            Some(&mut session.sealer),
        )
        .await
        .unwrap();
        let _ = socket.write_all(&out).await;
        closed_by_listener(&mut socket).await;
        let got = received(&mut rx2, Duration::from_millis(200)).await;
        assert_eq!(got, vec![envelope(3, 1)], "{what}");
    }
}

#[tokio::test]
async fn a_sealed_frame_reader_refuses_a_huge_length_without_allocating() {
    let (_, mut session) = {
        let (mut a, mut c) = tokio::io::duplex(1024);
        let (two, one) = (auth(SECRET, 2), auth(SECRET, 1));
        let (a, c) = tokio::join!(
            peer_auth::accept(&mut a, &two),
            peer_auth::connect(&mut c, &one, 2)
        );
        (c.unwrap(), a.unwrap())
    };
    let mut buf = Vec::new();
    let huge = u32::MAX.to_be_bytes();
    let e = read_sealed_frame(&mut &huge[..], &mut buf, MAX_FRAME, &mut session.opener)
        .await
        .unwrap_err();
    assert_eq!(e.kind(), std::io::ErrorKind::InvalidData);
    // Announced within the maximum, then a stall: the buffer stays at its initial size.
    let (mut w, mut r) = tokio::io::duplex(64);
    w.write_all(&(1u32 << 30).to_be_bytes()).await.unwrap();
    let stalled = tokio::time::timeout(
        Duration::from_millis(100),
        read_sealed_frame(&mut r, &mut buf, 1 << 30, &mut session.opener),
    );
    assert!(stalled.await.is_err());
    assert!(
        buf.capacity() <= FRAME_INITIAL_CAPACITY,
        "{}",
        buf.capacity()
    );
}

/// Certificates made by `tests/fixtures/tls/make-certs.sh` in a temporary directory.
struct Certs(tempfile::TempDir);

impl Certs {
    fn make() -> Certs {
        let dir = tempfile::tempdir().unwrap();
        let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../tests/fixtures/tls/make-certs.sh");
        let status = std::process::Command::new("bash")
            .arg(script)
            .arg(dir.path())
            .status()
            .unwrap();
        assert!(status.success(), "make-certs.sh");
        Certs(dir)
    }

    /// Member `name`'s identity (`peer` or `intruder`), trusting the cluster's CA.
    fn tls(&self, name: &str) -> PeerTls {
        let at = |f: &str| self.0.path().join(f);
        PeerTls::load(
            &at(&format!("{name}.pem")),
            &at(&format!("{name}.key")),
            &at("peer-ca.pem"),
        )
        .unwrap()
    }
}

fn tls_only(tls: &PeerTls) -> PeerSecurity {
    PeerSecurity {
        secret: None,
        tls: Some(tls.clone()),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn members_with_the_cluster_ca_exchange_frames_over_tls_with_or_without_a_secret() {
    let certs = Certs::make();
    let member = certs.tls("peer");
    let both = |me| PeerSecurity {
        secret: Some(auth(SECRET, me)),
        tls: Some(member.clone()),
    };
    for (what, two, one) in [
        ("TLS", tls_only(&member), tls_only(&member)),
        ("TLS and a secret", both(2), both(1)),
    ] {
        let (_two, mut rx2, addr2) = secured(2, &BTreeMap::new(), two);
        let peers = BTreeMap::from([(2, addr2.to_string())]);
        let (mut one, _rx1, _) = secured(1, &peers, one);
        for tag in 0..3 {
            one.send(2, envelope(1, tag), false);
        }
        let got = received(&mut rx2, Duration::from_millis(1500)).await;
        assert_eq!(
            got,
            (0..3).map(|t| envelope(1, t)).collect::<Vec<_>>(),
            "{what}"
        );
        // A frame too large to coalesce goes out in three writes: the flush must send them.
        let big = Envelope {
            from: 1,
            body: Some(Body::Raft(vec![7u8; 200 << 10])),
        };
        one.send(2, big.clone(), false);
        let got = received(&mut rx2, Duration::from_millis(1500)).await;
        assert_eq!(got, vec![big], "{what}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_certificate_from_the_cluster_ca_nothing_is_delivered() {
    let certs = Certs::make();
    let (_two, mut rx2, addr2) = secured(2, &BTreeMap::new(), tls_only(&certs.tls("peer")));
    let peers = BTreeMap::from([(2, addr2.to_string())]);
    // A certificate from another CA (which trusts the cluster's CA itself), and no TLS at all.
    let (mut intruder, mut rx_intruder, _) = secured(1, &peers, tls_only(&certs.tls("intruder")));
    let (mut open, _rx_open, _) = node(3, &peers, None);
    for tag in 0..20 {
        intruder.send(2, envelope(1, tag), false);
        open.send(2, envelope(3, tag), false);
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert_eq!(received(&mut rx2, Duration::from_millis(500)).await, vec![]);
    let mut unreachable = false;
    while let Ok(msg) = rx_intruder.try_recv() {
        unreachable |= matches!(msg, Inbound::Unreachable(2));
    }
    assert!(unreachable, "the intruder's connection was not refused");
    // Plain frames written straight at the TLS port close the connection.
    let mut socket = TcpStream::connect(addr2).await.unwrap();
    let frames: Vec<u8> = (0..10).flat_map(|t| frame(&envelope(1, t))).collect();
    let _ = socket.write_all(&frames).await;
    closed_by_listener(&mut socket).await;
    assert_eq!(received(&mut rx2, Duration::from_millis(200)).await, vec![]);
}

/// A member that names itself node 3 in its hello is held to it, and a hello meant for
/// another node is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tls_member_is_held_to_the_node_it_named() {
    let certs = Certs::make();
    let member = certs.tls("peer");
    let (_two, mut rx2, addr2) = secured(2, &BTreeMap::new(), tls_only(&member));
    let connect = |hello| {
        let member = member.clone();
        async move {
            let tcp = TcpStream::connect(addr2).await.unwrap();
            member
                .connect(tcp, "127.0.0.1:1", Some(hello))
                .await
                .unwrap()
        }
    };
    let mut tls = connect((3, 2)).await;
    for env in [envelope(3, 1), envelope(1, 99), envelope(3, 2)] {
        let _ = write_frame(&mut tls, &env.encode_to_vec(), None).await;
    }
    let mut rest = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), tls.read_to_end(&mut rest)).await;
    assert_eq!(
        received(&mut rx2, Duration::from_millis(300)).await,
        vec![envelope(3, 1)]
    );
    let mut misdirected = connect((3, 4)).await;
    let _ = write_frame(&mut misdirected, &envelope(3, 5).encode_to_vec(), None).await;
    let _ = tokio::time::timeout(Duration::from_secs(5), misdirected.read_to_end(&mut rest)).await;
    assert_eq!(received(&mut rx2, Duration::from_millis(300)).await, vec![]);
}
