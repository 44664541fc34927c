use super::*;

fn auth(secret: &str, me: u64) -> PeerAuth {
    PeerAuth::new(ClusterSecret::new(secret.as_bytes()).unwrap(), me)
}

const SECRET: &str = "correct horse battery staple";
const OTHER: &str = "another cluster's secret!";

/// Runs both ends of a handshake over an in-memory pipe; each end's stream is dropped (closed)
/// as soon as its side returns, as the transport does.
async fn handshake(
    acceptor: &PeerAuth,
    connector: &PeerAuth,
    to: u64,
) -> (std::io::Result<Session>, std::io::Result<Session>) {
    let (mut a, mut c) = tokio::io::duplex(1024);
    tokio::join!(
        async move {
            let r = accept(&mut a, acceptor).await;
            drop(a);
            r
        },
        async move {
            let r = connect(&mut c, connector, to).await;
            drop(c);
            r
        }
    )
}

async fn pair() -> (Session, Session) {
    let (a, c) = handshake(&auth(SECRET, 2), &auth(SECRET, 1), 2).await;
    (a.unwrap(), c.unwrap())
}

fn denied(r: std::io::Result<Session>) -> String {
    match r {
        Ok(s) => panic!("authenticated as node {}", s.peer),
        Err(e) => {
            assert_eq!(e.kind(), std::io::ErrorKind::PermissionDenied, "{e}");
            e.to_string()
        }
    }
}

#[tokio::test]
async fn the_same_secret_authenticates_both_ends_and_their_frames() {
    let (mut a, mut c) = pair().await;
    assert_eq!((a.peer, c.peer), (1, 2));
    for i in 0..3u8 {
        let frame = vec![i; 100 * i as usize];
        let tag = c.sealer.seal(&frame);
        a.opener.open(&frame, &tag).unwrap();
        let tag = a.sealer.seal(&frame);
        c.opener.open(&frame, &tag).unwrap();
    }
}

#[tokio::test]
async fn a_wrong_secret_is_refused_on_both_sides() {
    // The acceptor refuses the connector's proof; the connector learns it was refused.
    let (a, c) = handshake(&auth(SECRET, 2), &auth(OTHER, 1), 2).await;
    assert!(denied(a).contains("does not hold the cluster secret"));
    assert!(denied(c).contains("hung up"));
    // An acceptor that answers with anything but a proof made with the secret is refused by
    // the connector, including one that sends back the connector's own proof.
    for reflect in [false, true] {
        let (mut a, mut c) = tokio::io::duplex(1024);
        let impostor = async move {
            let mut hello = [0u8; HELLO_LEN];
            hello[..8].copy_from_slice(MAGIC);
            a.write_all(&hello).await.unwrap();
            let mut answer = [0u8; ANSWER_LEN];
            a.read_exact(&mut answer).await.unwrap();
            let proof = if reflect {
                answer[16 + NONCE_LEN..].to_vec()
            } else {
                vec![7u8; TAG_LEN]
            };
            a.write_all(&proof).await.unwrap();
            a
        };
        let one = auth(SECRET, 1);
        let (_a, c) = tokio::join!(impostor, connect(&mut c, &one, 2));
        assert!(denied(c).contains("proof is wrong"), "reflect={reflect}");
    }
}

#[tokio::test]
async fn a_connection_meant_for_another_node_or_from_itself_is_refused() {
    let (a, _) = handshake(&auth(SECRET, 2), &auth(SECRET, 1), 3).await;
    assert!(denied(a).contains("meant for node 3"));
    let (a, _) = handshake(&auth(SECRET, 2), &auth(SECRET, 2), 2).await;
    assert!(denied(a).contains("claims to be node 2"));
}

#[tokio::test]
async fn a_peer_that_does_not_speak_the_handshake_is_refused() {
    // What a connector sees from an acceptor without a secret: nothing, then (here) EOF.
    let (a, mut c) = tokio::io::duplex(1024);
    drop(a);
    let e = connect(&mut c, &auth(SECRET, 1), 2).await.err().unwrap();
    assert_eq!(e.kind(), std::io::ErrorKind::UnexpectedEof);
    // An acceptor answering with something else than the magic.
    let (mut a, mut c) = tokio::io::duplex(1024);
    a.write_all(&[0u8; HELLO_LEN]).await.unwrap();
    let e = connect(&mut c, &auth(SECRET, 1), 2).await.err().unwrap();
    assert_eq!(e.kind(), std::io::ErrorKind::InvalidData);
    // A connector that sends a plain frame instead of an answer fails the proof.
    let (mut a, mut c) = tokio::io::duplex(1024);
    let frame = [vec![0, 0, 0, 76], vec![8u8; 76]].concat();
    c.write_all(&frame).await.unwrap();
    denied(accept(&mut a, &auth(SECRET, 2)).await);
}

#[tokio::test]
async fn tampered_replayed_reordered_and_foreign_frames_are_refused() {
    let (mut a, mut c) = pair().await;
    let frames: Vec<Vec<u8>> = (0..3u8).map(|i| vec![i; 40]).collect();
    let tags: Vec<[u8; TAG_LEN]> = frames.iter().map(|f| c.sealer.seal(f)).collect();
    // Reordered: frame 1 cannot come first.
    assert!(a.opener.open(&frames[1], &tags[1]).is_err());
    // Tampered payload, tampered tag, truncated tag.
    let mut bad = frames[0].clone();
    bad[5] ^= 1;
    assert!(a.opener.open(&bad, &tags[0]).is_err());
    let mut bad_tag = tags[0];
    bad_tag[0] ^= 0x80;
    assert!(a.opener.open(&frames[0], &bad_tag).is_err());
    assert!(a.opener.open(&frames[0], &tags[0][..16]).is_err());
    assert!(a.opener.open(&frames[0][..39], &tags[0]).is_err());
    a.opener.open(&frames[0], &tags[0]).unwrap();
    // Replayed.
    assert!(a.opener.open(&frames[0], &tags[0]).is_err());
    // Dropped: frame 2 cannot follow frame 0.
    assert!(a.opener.open(&frames[2], &tags[2]).is_err());
    a.opener.open(&frames[1], &tags[1]).unwrap();
    // Reflected: the acceptor's own frame is not valid in the other direction.
    let mine = a.sealer.seal(&frames[2]);
    assert!(a.opener.open(&frames[2], &mine).is_err());
    // Foreign: a frame from another connection (same secret, same nodes) is refused.
    let (_, mut other) = pair().await;
    let foreign = other.sealer.seal(&frames[2]);
    assert!(a.opener.open(&frames[2], &foreign).is_err());
    a.opener.open(&frames[2], &tags[2]).unwrap();
}

#[test]
fn secrets_are_checked_and_never_printed() {
    let e = ClusterSecret::new(Vec::new()).unwrap_err().to_string();
    assert!(e.contains("empty"), "{e}");
    let e = ClusterSecret::new(vec![b'x'; MIN_SECRET_LEN - 1])
        .unwrap_err()
        .to_string();
    assert!(e.contains("at least 16"), "{e}");
    let secret = ClusterSecret::new(SECRET.as_bytes()).unwrap();
    let printed = format!("{:?}", PeerAuth::new(secret, 1));
    assert!(!printed.contains("horse"), "{printed}");
}

#[test]
fn loopback_addresses_are_recognised() {
    for a in [
        "127.0.0.1:7001",
        "127.3.2.1:1",
        "[::1]:7001",
        "localhost:7001",
        "LOCALHOST:1",
    ] {
        assert!(is_loopback_address(a), "{a}");
    }
    for a in [
        "0.0.0.0:7001",
        "10.0.0.5:7001",
        "[::]:7001",
        "db1.internal:7001",
        "localhost.evil.com:7001",
    ] {
        assert!(!is_loopback_address(a), "{a}");
    }
}
