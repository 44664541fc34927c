//! Peer authentication for the cluster transport: the [`ClusterSecret`] every member shares,
//! the mutual handshake that opens each peer connection, and the per-frame MACs after it.
//!
//! The handshake has fixed sizes, so nothing read is sized by the peer (the transport bounds
//! its duration with [`PeerAuth::handshake_timeout`]):
//!
//! ```text
//! acceptor  -> connector  MAGIC (8) || nonce_a (32)
//! connector -> acceptor   from u64 BE || to u64 BE || nonce_c (32) || proof_c (32)
//! acceptor  -> connector  proof_a (32)
//! proof_x = HMAC-SHA256(secret, "sluice-peer-v1" || label_x || nonce_a || nonce_c || from || to)
//! ```
//!
//! `from` is the connector's node id and `to` the node it means to reach; labels are
//! `connector` and `acceptor`, so neither proof can be reflected as the other. The acceptor
//! checks the proof before it believes either id, and refuses a connection meant for another
//! node; the connector checks the acceptor's proof in turn. Both then derive a session key
//! (the same HMAC with label `session`, fresh because both nonces are) and from it one key per
//! direction. Every frame afterwards carries `HMAC(direction key, seq u64 BE || len u64 BE ||
//! payload)`, where `seq` counts that direction's frames from 0 and is never sent.
//!
//! Invariants: the secret is never printed (`Debug` redacts it); proofs and frame MACs are
//! compared in constant time (`hmac`'s `verify_slice`); a frame that is forged, altered,
//! replayed, reordered or dropped, or that comes from another connection, fails verification,
//! and the caller closes the connection. Without a secret the transport skips all of this and
//! the wire format is unchanged.

use std::fmt;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use hmac::{Hmac, KeyInit, Mac};
use rand::RngCore;
use sha2::Sha256;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use crate::error::{Error, Result};

type HmacSha256 = Hmac<Sha256>;

/// Fewest bytes a cluster secret may have.
pub const MIN_SECRET_LEN: usize = 16;
/// How long a peer has to complete the handshake before it is dropped.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);
/// Bytes of a frame's MAC, sent after its payload.
pub const TAG_LEN: usize = 32;

const MAGIC: &[u8; 8] = b"SLUICEP1";
const DOMAIN: &[u8] = b"sluice-peer-v1";
const NONCE_LEN: usize = 32;
const HELLO_LEN: usize = MAGIC.len() + NONCE_LEN;
const ANSWER_LEN: usize = 8 + 8 + NONCE_LEN + TAG_LEN;

/// The secret shared by every member of a cluster: at least [`MIN_SECRET_LEN`] bytes.
#[derive(Clone)]
pub struct ClusterSecret(Arc<[u8]>);

impl ClusterSecret {
    /// Refuses an empty secret and one shorter than [`MIN_SECRET_LEN`] bytes.
    pub fn new(bytes: impl Into<Vec<u8>>) -> Result<ClusterSecret> {
        let bytes = bytes.into();
        if bytes.is_empty() {
            return Err(Error::Config(
                "the cluster secret is empty: an empty secret authenticates nobody".into(),
            ));
        }
        if bytes.len() < MIN_SECRET_LEN {
            return Err(Error::Config(format!(
                "the cluster secret has {} bytes; it needs at least {MIN_SECRET_LEN} (e.g. `openssl rand -hex 32`)",
                bytes.len()
            )));
        }
        Ok(ClusterSecret(bytes.into()))
    }
}

impl fmt::Debug for ClusterSecret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ClusterSecret(<redacted>)")
    }
}

/// What the transport needs to authenticate its connections.
#[derive(Clone, Debug)]
pub struct PeerAuth {
    pub secret: ClusterSecret,
    /// This node's id: what it claims when connecting, and what acceptors check it is.
    pub me: u64,
    pub handshake_timeout: Duration,
}

impl PeerAuth {
    pub fn new(secret: ClusterSecret, me: u64) -> PeerAuth {
        PeerAuth {
            secret,
            me,
            handshake_timeout: HANDSHAKE_TIMEOUT,
        }
    }
}

/// Whether a `host:port` peer address is on loopback. A host name other than `localhost` is
/// not, whatever it resolves to: the check must not depend on DNS.
pub fn is_loopback_address(addr: &str) -> bool {
    let host = address_host(addr);
    host.eq_ignore_ascii_case("localhost")
        || host.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

/// The host of a `host:port` peer address (`[::1]:7000` → `::1`).
pub(crate) fn address_host(addr: &str) -> &str {
    let host = addr.rsplit_once(':').map_or(addr, |(host, _)| host);
    host.trim_start_matches('[').trim_end_matches(']')
}

/// An authenticated connection: who the other end is, and the keys for its frames.
pub struct Session {
    /// The peer's node id, as its proof established.
    pub peer: u64,
    /// MACs for the frames this side sends.
    pub sealer: FrameSealer,
    /// Checks the frames this side receives.
    pub opener: FrameOpener,
}

/// Computes the MAC of each outgoing frame, in order.
pub struct FrameSealer {
    key: HmacSha256,
    seq: u64,
}

/// Verifies the MAC of each incoming frame, in order.
pub struct FrameOpener {
    key: HmacSha256,
    seq: u64,
}

impl FrameSealer {
    /// The MAC to send after `payload`, the next frame in this direction.
    pub fn seal(&mut self, payload: &[u8]) -> [u8; TAG_LEN] {
        let tag = frame_mac(&self.key, self.seq, payload)
            .finalize()
            .into_bytes();
        self.seq += 1;
        let mut out = [0u8; TAG_LEN];
        out.copy_from_slice(&tag);
        out
    }
}

impl FrameOpener {
    /// Checks that `tag` is the MAC of `payload` as the next frame in this direction.
    pub fn open(&mut self, payload: &[u8], tag: &[u8]) -> std::io::Result<()> {
        frame_mac(&self.key, self.seq, payload)
            .verify_slice(tag)
            .map_err(|_| {
                refused(format!(
                    "frame {} failed authentication (forged, altered, replayed or out of order)",
                    self.seq
                ))
            })?;
        self.seq += 1;
        Ok(())
    }
}

fn frame_mac(key: &HmacSha256, seq: u64, payload: &[u8]) -> HmacSha256 {
    let mut mac = key.clone();
    mac.update(&seq.to_be_bytes());
    mac.update(&(payload.len() as u64).to_be_bytes());
    mac.update(payload);
    mac
}

/// Opens a connection to node `to` as node `auth.me`: answers the acceptor's challenge and
/// checks its proof. Fails with `PermissionDenied` when the peer does not prove the secret
/// (or hangs up instead of proving it), `InvalidData` when it does not speak this handshake.
pub async fn connect<S>(stream: &mut S, auth: &PeerAuth, to: u64) -> std::io::Result<Session>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let mut hello = [0u8; HELLO_LEN];
    stream.read_exact(&mut hello).await?;
    if &hello[..MAGIC.len()] != MAGIC {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            "the peer did not open a sluice peer handshake (is it running without a cluster secret?)",
        ));
    }
    let transcript = Transcript {
        nonce_a: nonce_at(&hello, MAGIC.len()),
        nonce_c: fresh_nonce()?,
        from: auth.me,
        to,
    };
    let mut answer = [0u8; ANSWER_LEN];
    answer[..8].copy_from_slice(&auth.me.to_be_bytes());
    answer[8..16].copy_from_slice(&to.to_be_bytes());
    answer[16..16 + NONCE_LEN].copy_from_slice(&transcript.nonce_c);
    let proof = transcript
        .mac(&auth.secret, b"connector")
        .finalize()
        .into_bytes();
    answer[16 + NONCE_LEN..].copy_from_slice(&proof);
    stream.write_all(&answer).await?;
    stream.flush().await?;
    let mut proof = [0u8; TAG_LEN];
    if let Err(e) = stream.read_exact(&mut proof).await {
        return Err(if e.kind() == std::io::ErrorKind::UnexpectedEof {
            refused(format!(
                "the peer hung up instead of proving the cluster secret: it refused ours (a different secret?) or is not node {to}"
            ))
        } else {
            e
        });
    }
    transcript
        .mac(&auth.secret, b"acceptor")
        .verify_slice(&proof)
        .map_err(|_| refused("the peer's proof is wrong: it does not hold the cluster secret"))?;
    Ok(transcript.session(&auth.secret, to, Side::Connector))
}

/// Accepts a connection as node `auth.me`: challenges the connector, checks its proof and its
/// claim to be reaching this node, and proves the secret back. Fails with `PermissionDenied`
/// when the connector does not prove the secret or means another node.
pub async fn accept<S>(stream: &mut S, auth: &PeerAuth) -> std::io::Result<Session>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let nonce_a = fresh_nonce()?;
    let mut hello = [0u8; HELLO_LEN];
    hello[..MAGIC.len()].copy_from_slice(MAGIC);
    hello[MAGIC.len()..].copy_from_slice(&nonce_a);
    stream.write_all(&hello).await?;
    stream.flush().await?;
    let mut answer = [0u8; ANSWER_LEN];
    stream.read_exact(&mut answer).await?;
    let id_at = |at: usize| {
        let mut id = [0u8; 8];
        id.copy_from_slice(&answer[at..at + 8]);
        u64::from_be_bytes(id)
    };
    let transcript = Transcript {
        nonce_a,
        nonce_c: nonce_at(&answer, 16),
        from: id_at(0),
        to: id_at(8),
    };
    transcript
        .mac(&auth.secret, b"connector")
        .verify_slice(&answer[16 + NONCE_LEN..])
        .map_err(|_| refused("wrong proof: the connector does not hold the cluster secret"))?;
    if transcript.to != auth.me {
        return Err(refused(format!(
            "the connection is meant for node {}, this is node {}",
            transcript.to, auth.me
        )));
    }
    if transcript.from == 0 || transcript.from == auth.me {
        return Err(refused(format!(
            "the connector claims to be node {}",
            transcript.from
        )));
    }
    let proof = transcript
        .mac(&auth.secret, b"acceptor")
        .finalize()
        .into_bytes();
    stream.write_all(&proof).await?;
    stream.flush().await?;
    Ok(transcript.session(&auth.secret, transcript.from, Side::Acceptor))
}

#[derive(Clone, Copy)]
enum Side {
    Connector,
    Acceptor,
}

/// Everything both proofs and the session key are computed over.
struct Transcript {
    nonce_a: [u8; NONCE_LEN],
    nonce_c: [u8; NONCE_LEN],
    from: u64,
    to: u64,
}

impl Transcript {
    fn mac(&self, secret: &ClusterSecret, label: &[u8]) -> HmacSha256 {
        let mut mac = keyed(&secret.0);
        mac.update(DOMAIN);
        mac.update(label);
        mac.update(&self.nonce_a);
        mac.update(&self.nonce_c);
        mac.update(&self.from.to_be_bytes());
        mac.update(&self.to.to_be_bytes());
        mac
    }

    fn session(&self, secret: &ClusterSecret, peer: u64, side: Side) -> Session {
        let session = self.mac(secret, b"session").finalize().into_bytes();
        let direction = |label: &[u8]| {
            let key = keyed(&session).chain_update(label).finalize().into_bytes();
            keyed(&key)
        };
        let (to_acceptor, to_connector) = (
            direction(b"connector->acceptor"),
            direction(b"acceptor->connector"),
        );
        let (send, receive) = match side {
            Side::Connector => (to_acceptor, to_connector),
            Side::Acceptor => (to_connector, to_acceptor),
        };
        Session {
            peer,
            sealer: FrameSealer { key: send, seq: 0 },
            opener: FrameOpener {
                key: receive,
                seq: 0,
            },
        }
    }
}

fn keyed(key: &[u8]) -> HmacSha256 {
    // HMAC takes keys of any length; `new_from_slice` cannot fail for it.
    <HmacSha256 as KeyInit>::new_from_slice(key).expect("HMAC accepts keys of any length")
}

fn nonce_at(bytes: &[u8], at: usize) -> [u8; NONCE_LEN] {
    let mut nonce = [0u8; NONCE_LEN];
    nonce.copy_from_slice(&bytes[at..at + NONCE_LEN]);
    nonce
}

fn fresh_nonce() -> std::io::Result<[u8; NONCE_LEN]> {
    let mut nonce = [0u8; NONCE_LEN];
    rand::rngs::OsRng
        .try_fill_bytes(&mut nonce)
        .map_err(std::io::Error::other)?;
    Ok(nonce)
}

fn refused(why: impl Into<String>) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::PermissionDenied, why.into())
}

#[cfg(test)]
mod tests;
