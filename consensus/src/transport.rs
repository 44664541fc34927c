//! How nodes talk: the [`Envelope`] every node-to-node frame carries, the [`Transport`] the node
//! task sends through, and [`TcpTransport`], the real one.
//!
//! Frames are `[len u32 big-endian][prost-encoded Envelope]`. An envelope carries a raft-rs
//! message (its own protobuf encoding, as bytes), a proposal forwarded to the leader, or the
//! leader's answer to one. The node task never blocks on the network: [`Transport::send`] only
//! queues, and what happens later (a peer unreachable, a snapshot delivered or not) comes back
//! as an [`Inbound`] report on the same bounded channel as received frames.
//!
//! Peers authenticate each other ([`PeerSecurity`]) with a cluster secret, mutual TLS, or
//! both. With mutual TLS ([`crate::peer_tls`]) every connection is TLS 1.3, both ends present a
//! certificate signed by the cluster CA, and the connector names itself in a hello after the
//! handshake. With a cluster secret ([`PeerAuth`]), every connection opens with the mutual
//! handshake of [`crate::peer_auth`] (inside TLS when both are configured) and every frame is
//! followed by its MAC: `[len u32][Envelope][MAC 32]`. Handshakes are bounded by a timeout,
//! with at most `MAX_HANDSHAKES` in progress. A connection whose handshake fails, whose frame
//! fails its MAC, or whose envelope names another sender than the node it authenticated as is
//! closed, with a warning naming the peer's address. With neither there is no handshake and
//! no MAC (loopback-only clusters; the server refuses anything else).
//!
//! Invariants: every queue is bounded — per peer `PEER_QUEUE` frames out, `INBOUND_QUEUE`
//! frames in — and a full outgoing queue drops the frame and reports the peer unreachable
//! (Raft resends what matters); a frame larger than the configured maximum is refused on both
//! sides, and a received frame's buffer grows only as its bytes arrive, never to a length a
//! peer merely announced; connections are re-established with capped exponential backoff;
//! with a secret or TLS, nothing from a connection reaches the node task before its handshake
//! succeeded (and, with a secret, the frame's MAC verified).

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use prost::Message as _;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, Semaphore};

pub use crate::peer_auth::PeerAuth;
use crate::peer_auth::{FrameOpener, FrameSealer, HANDSHAKE_TIMEOUT, TAG_LEN};
pub use crate::peer_tls::PeerTls;

/// How a node's peer connections are authenticated: a cluster secret, mutual TLS, both, or
/// (loopback-only clusters) neither.
#[derive(Clone, Debug, Default)]
pub struct PeerSecurity {
    pub secret: Option<PeerAuth>,
    pub tls: Option<PeerTls>,
}

impl PeerSecurity {
    fn is_open(&self) -> bool {
        self.secret.is_none() && self.tls.is_none()
    }

    fn handshake_timeout(&self) -> Duration {
        self.secret
            .as_ref()
            .map_or(HANDSHAKE_TIMEOUT, |a| a.handshake_timeout)
    }
}

/// A peer connection, plain TCP or TLS.
trait PeerStream: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> PeerStream for T {}
type Stream = Box<dyn PeerStream>;

/// One node-to-node frame.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Envelope {
    /// Sender's node id.
    #[prost(uint64, tag = "1")]
    pub from: u64,
    #[prost(oneof = "Body", tags = "2, 3, 4")]
    pub body: Option<Body>,
}

/// What an [`Envelope`] carries.
#[derive(Clone, PartialEq, prost::Oneof)]
pub enum Body {
    /// A raft-rs `eraftpb::Message`, protobuf-encoded.
    #[prost(bytes, tag = "2")]
    Raft(Vec<u8>),
    /// A proposal made on a follower, for the leader to put in the log.
    #[prost(message, tag = "3")]
    Forward(Forward),
    /// The leader's answer to a [`Forward`].
    #[prost(message, tag = "4")]
    ForwardReply(ForwardReply),
}

/// A proposal forwarded to the leader. The leader proposes it with `(from, tag)` as the entry's
/// context, so the forwarding node recognises the entry when it applies it itself.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Forward {
    #[prost(uint64, tag = "1")]
    pub tag: u64,
    #[prost(bytes, tag = "2")]
    pub command: Vec<u8>,
    /// A protobuf `ConfChangeV2` rather than a state-machine command.
    #[prost(bool, tag = "3")]
    pub conf_change: bool,
    /// The term of the leader it was sent to; a leader in another term refuses it.
    #[prost(uint64, tag = "4")]
    pub term: u64,
    /// Which sending of the request this is (a request is sent again after its leader
    /// certainly lost it); echoed in the reply, so an answer to an earlier sending that
    /// arrives late is recognised and ignored.
    #[prost(uint32, tag = "5")]
    pub attempt: u32,
}

/// The leader's answer to a [`Forward`]: where it put the entry, or why it did not.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ForwardReply {
    #[prost(uint64, tag = "1")]
    pub tag: u64,
    /// Empty when accepted.
    #[prost(string, tag = "2")]
    pub error: String,
    #[prost(uint64, tag = "3")]
    pub index: u64,
    #[prost(uint64, tag = "4")]
    pub term: u64,
    /// The `attempt` of the forward this answers.
    #[prost(uint32, tag = "5")]
    pub attempt: u32,
}

/// What reaches the node task from the network.
#[derive(Debug)]
pub enum Inbound {
    Envelope(Envelope),
    /// A frame to this peer could not be queued or written.
    Unreachable(u64),
    /// A snapshot message to this peer was written to its socket (`true`) or was lost.
    SnapshotSent(u64, bool),
}

/// The node task's way out. Implementations must not block.
pub trait Transport: Send + 'static {
    /// Queues `env` for node `to`; failures are reported later as [`Inbound`] reports.
    fn send(&mut self, to: u64, env: Envelope, is_snapshot: bool);
    /// The address book changed (a node was added or removed).
    fn set_peers(&mut self, peers: &BTreeMap<u64, String>);
}

/// A transport that drops everything: a single node has nobody to talk to.
pub struct NoTransport;

impl Transport for NoTransport {
    fn send(&mut self, to: u64, _env: Envelope, _is_snapshot: bool) {
        tracing::trace!(to, "no transport: message dropped");
    }
    fn set_peers(&mut self, _peers: &BTreeMap<u64, String>) {}
}

/// Frames queued to one peer before new ones are dropped.
const PEER_QUEUE: usize = 4096;
/// Received frames queued for the node task before readers stop reading (TCP backpressure).
pub const INBOUND_QUEUE: usize = 8192;
const BACKOFF_MIN: Duration = Duration::from_millis(20);
const BACKOFF_MAX: Duration = Duration::from_secs(1);
/// Accepted connections still in their handshake; more are closed at once.
const MAX_HANDSHAKES: usize = 256;

struct Outgoing {
    frame: Vec<u8>,
    is_snapshot: bool,
}

struct Peer {
    addr: String,
    queue: mpsc::Sender<Outgoing>,
    task: tokio::task::JoinHandle<()>,
}

/// Raft over TCP: a listener for frames from any peer, and one writer task per peer.
pub struct TcpTransport {
    id: u64,
    runtime: tokio::runtime::Handle,
    inbound: mpsc::Sender<Inbound>,
    peers: HashMap<u64, Peer>,
    max_frame: usize,
    security: Arc<PeerSecurity>,
    listener: tokio::task::JoinHandle<()>,
}

impl TcpTransport {
    /// Listens on `listener` (already bound: the caller learns bind errors at startup) and
    /// prepares writers for every peer but `id`, on `runtime`. Unless `security` is empty,
    /// every connection in either direction is authenticated (a secret's `me` must be `id`).
    pub fn start(
        id: u64,
        listener: std::net::TcpListener,
        peers: &BTreeMap<u64, String>,
        inbound: mpsc::Sender<Inbound>,
        max_frame: usize,
        security: PeerSecurity,
        runtime: tokio::runtime::Handle,
    ) -> std::io::Result<TcpTransport> {
        if security.secret.as_ref().is_some_and(|a| a.me != id) {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                "peer authentication is for another node id",
            ));
        }
        let security = Arc::new(security);
        listener.set_nonblocking(true)?;
        let tx = inbound.clone();
        let listener = {
            let _guard = runtime.enter();
            let listener = TcpListener::from_std(listener)?;
            runtime.spawn(accept_loop(id, listener, tx, max_frame, security.clone()))
        };
        let mut t = TcpTransport {
            id,
            runtime,
            inbound,
            peers: HashMap::new(),
            max_frame,
            security,
            listener,
        };
        t.set_peers(peers);
        Ok(t)
    }
}

impl Drop for TcpTransport {
    fn drop(&mut self) {
        self.listener.abort();
        for (_, p) in self.peers.drain() {
            p.task.abort();
        }
    }
}

impl Transport for TcpTransport {
    fn send(&mut self, to: u64, env: Envelope, is_snapshot: bool) {
        let Some(peer) = self.peers.get(&to) else {
            let _ = self.inbound.try_send(Inbound::Unreachable(to));
            return;
        };
        let frame = env.encode_to_vec();
        if frame.len() > self.max_frame {
            tracing::error!(
                to,
                bytes = frame.len(),
                max = self.max_frame,
                "frame too large for the transport; dropped"
            );
            let report = if is_snapshot {
                Inbound::SnapshotSent(to, false)
            } else {
                Inbound::Unreachable(to)
            };
            let _ = self.inbound.try_send(report);
            return;
        }
        if peer
            .queue
            .try_send(Outgoing { frame, is_snapshot })
            .is_err()
        {
            let _ = self.inbound.try_send(Inbound::Unreachable(to));
            if is_snapshot {
                let _ = self.inbound.try_send(Inbound::SnapshotSent(to, false));
            }
        }
    }

    fn set_peers(&mut self, peers: &BTreeMap<u64, String>) {
        self.peers.retain(|id, p| {
            let keep = peers.get(id) == Some(&p.addr);
            if !keep {
                p.task.abort();
            }
            keep
        });
        for (&id, addr) in peers {
            if id == self.id || self.peers.contains_key(&id) {
                continue;
            }
            let (queue, rx) = mpsc::channel(PEER_QUEUE);
            let task = self.runtime.spawn(write_loop(
                (self.id, id),
                addr.clone(),
                rx,
                self.inbound.clone(),
                self.security.clone(),
            ));
            self.peers.insert(
                id,
                Peer {
                    addr: addr.clone(),
                    queue,
                    task,
                },
            );
        }
    }
}

/// Keeps a connection to one peer and writes its queued frames, reconnecting with backoff.
/// Frames queued while the peer is down are dropped (and the peer reported unreachable):
/// stale Raft messages are worthless, and Raft resends what it still needs.
async fn write_loop(
    (me, to): (u64, u64),
    addr: String,
    mut rx: mpsc::Receiver<Outgoing>,
    inbound: mpsc::Sender<Inbound>,
    security: Arc<PeerSecurity>,
) {
    let mut backoff = BACKOFF_MIN;
    loop {
        let connected = match TcpStream::connect(&addr).await {
            Ok(s) => {
                let _ = s.set_nodelay(true);
                open(s, &security, (me, to), &addr).await
            }
            Err(e) => {
                tracing::debug!(to, %addr, "cannot connect to peer: {e}");
                None
            }
        };
        let Some((mut stream, mut sealer)) = connected else {
            let _ = inbound.try_send(Inbound::Unreachable(to));
            // Drop what queued up meanwhile, reporting lost snapshots.
            while let Ok(out) = rx.try_recv() {
                if out.is_snapshot {
                    let _ = inbound.try_send(Inbound::SnapshotSent(to, false));
                }
            }
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(BACKOFF_MAX);
            continue;
        };
        backoff = BACKOFF_MIN;
        loop {
            let Some(out) = rx.recv().await else { return };
            let written = write_frame(&mut stream, &out.frame, sealer.as_mut()).await;
            if out.is_snapshot {
                let _ = inbound.try_send(Inbound::SnapshotSent(to, written.is_ok()));
            }
            if let Err(e) = written {
                tracing::debug!(to, %addr, "connection to peer lost: {e}");
                let _ = inbound.try_send(Inbound::Unreachable(to));
                break;
            }
        }
    }
}

/// Authenticates a new connection from node `me` to node `to` unless the cluster is open;
/// `None` (logged) when the peer fails the handshake or does not finish it in time.
async fn open(
    tcp: TcpStream,
    security: &PeerSecurity,
    (me, to): (u64, u64),
    addr: &str,
) -> Option<(Stream, Option<FrameSealer>)> {
    if security.is_open() {
        return Some((Box::new(tcp), None));
    }
    let timeout = security.handshake_timeout();
    let failure = match tokio::time::timeout(timeout, connect(tcp, security, (me, to), addr)).await
    {
        Ok(Ok(opened)) => return Some(opened),
        Ok(Err(e)) => e.to_string(),
        Err(_) => format!("no handshake within {timeout:?}"),
    };
    tracing::warn!(to, %addr, "peer failed authentication; connection dropped: {failure}");
    None
}

/// The connector's side of the handshakes: TLS, then the secret's handshake or TLS's hello.
async fn connect(
    tcp: TcpStream,
    security: &PeerSecurity,
    (me, to): (u64, u64),
    addr: &str,
) -> std::io::Result<(Stream, Option<FrameSealer>)> {
    let mut stream: Stream = match &security.tls {
        None => Box::new(tcp),
        Some(tls) => {
            let hello = security.secret.is_none().then_some((me, to));
            Box::new(tls.connect(tcp, addr, hello).await?)
        }
    };
    let sealer = match &security.secret {
        None => None,
        Some(auth) => Some(
            crate::peer_auth::connect(&mut stream, auth, to)
                .await?
                .sealer,
        ),
    };
    Ok((stream, sealer))
}

/// What the acceptor's handshakes established: the peer's node id (none on an open cluster)
/// and, with a secret, the MAC check for its frames.
struct Accepted {
    stream: Stream,
    peer: Option<u64>,
    opener: Option<FrameOpener>,
}

/// The acceptor's side of the handshakes (see [`connect`]).
async fn accept(tcp: TcpStream, security: &PeerSecurity, me: u64) -> std::io::Result<Accepted> {
    let mut stream: Stream = match &security.tls {
        None => Box::new(tcp),
        Some(tls) => Box::new(tls.accept(tcp).await?),
    };
    if let Some(auth) = &security.secret {
        let session = crate::peer_auth::accept(&mut stream, auth).await?;
        return Ok(Accepted {
            stream,
            peer: Some(session.peer),
            opener: Some(session.opener),
        });
    }
    let peer = match security.tls {
        Some(_) => Some(crate::peer_tls::read_hello(&mut stream, me).await?),
        None => None,
    };
    Ok(Accepted {
        stream,
        peer,
        opener: None,
    })
}

/// Writes one frame, followed by its MAC on an authenticated connection.
pub async fn write_frame<W>(
    writer: &mut W,
    frame: &[u8],
    sealer: Option<&mut FrameSealer>,
) -> std::io::Result<()>
where
    W: tokio::io::AsyncWrite + Unpin,
{
    let len = u32::try_from(frame.len())
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::InvalidInput, "frame above 4 GiB"))?;
    let tag = sealer.map(|s| s.seal(frame));
    let tag = tag.as_ref().map_or(&[][..], |t| &t[..]);
    if frame.len() <= COALESCE_BYTES {
        // One write (one segment, with nodelay) for the small frames Raft sends most.
        let whole = [&len.to_be_bytes()[..], frame, tag].concat();
        writer.write_all(&whole).await?;
        return writer.flush().await;
    }
    writer.write_all(&len.to_be_bytes()).await?;
    writer.write_all(frame).await?;
    writer.write_all(tag).await?;
    // TLS holds written bytes in its records until flushed; plain TCP has nothing to flush.
    writer.flush().await
}

/// Frames up to this size are copied into one buffer with their length and MAC and written
/// at once; larger ones are written in place, in three writes.
const COALESCE_BYTES: usize = 64 << 10;

async fn accept_loop(
    me: u64,
    listener: TcpListener,
    inbound: mpsc::Sender<Inbound>,
    max_frame: usize,
    security: Arc<PeerSecurity>,
) {
    let handshakes = Arc::new(Semaphore::new(MAX_HANDSHAKES));
    let warnings = Arc::new(WarnGate::default());
    loop {
        match listener.accept().await {
            Ok((socket, peer)) => {
                let _ = socket.set_nodelay(true);
                let permit = if security.is_open() {
                    None
                } else {
                    match handshakes.clone().try_acquire_owned() {
                        Ok(permit) => Some(permit),
                        Err(_) => {
                            warnings.warn(peer, "too many peer handshakes in progress");
                            continue;
                        }
                    }
                };
                let (inbound, security, warnings) =
                    (inbound.clone(), security.clone(), warnings.clone());
                tokio::spawn(async move {
                    let timeout = security.handshake_timeout();
                    let accepted =
                        tokio::time::timeout(timeout, accept(socket, &security, me)).await;
                    drop(permit);
                    let accepted = match accepted {
                        Ok(Ok(accepted)) => accepted,
                        Ok(Err(e)) => return warnings.warn(peer, &e.to_string()),
                        Err(_) => {
                            return warnings.warn(peer, &format!("no handshake within {timeout:?}"))
                        }
                    };
                    match read_loop(accepted, inbound, max_frame).await {
                        Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => {
                            warnings.warn(peer, &e.to_string())
                        }
                        Err(e) => tracing::debug!(%peer, "peer connection ended: {e}"),
                        Ok(()) => {}
                    }
                });
            }
            Err(e) => {
                tracing::warn!("raft accept failed: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

/// Receives frames until the connection ends, the node stops, or (authenticated) a frame
/// fails its MAC or names another sender than the authenticated peer.
async fn read_loop(
    accepted: Accepted,
    inbound: mpsc::Sender<Inbound>,
    max_frame: usize,
) -> std::io::Result<()> {
    let Accepted {
        mut stream,
        peer,
        mut opener,
    } = accepted;
    let mut buf = Vec::new();
    loop {
        let env = match &mut opener {
            None => read_frame(&mut stream, &mut buf, max_frame).await?,
            Some(opener) => read_sealed_frame(&mut stream, &mut buf, max_frame, opener).await?,
        };
        if let Some(peer) = peer.filter(|&p| p != env.from) {
            return Err(std::io::Error::new(
                std::io::ErrorKind::PermissionDenied,
                format!(
                    "node {peer} sent a frame from node {}; connection dropped",
                    env.from
                ),
            ));
        }
        if inbound.send(Inbound::Envelope(env)).await.is_err() {
            return Ok(()); // the node stopped
        }
    }
}

/// Warnings about refused peer connections, at most one a second: whoever can reach the port
/// must not be able to flood the log. The ones held back are counted in the next.
#[derive(Default)]
struct WarnGate {
    /// Milliseconds after `epoch` of the last warning logged, plus one (0: none yet).
    last: AtomicU64,
    suppressed: AtomicU64,
    epoch: std::sync::OnceLock<Instant>,
}

impl WarnGate {
    fn warn(&self, peer: SocketAddr, why: &str) {
        let epoch = *self.epoch.get_or_init(Instant::now);
        let now = epoch.elapsed().as_millis() as u64 + 1;
        let last = self.last.load(Ordering::Relaxed);
        let due = last == 0 || now >= last + 1000;
        if !due
            || self
                .last
                .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_err()
        {
            self.suppressed.fetch_add(1, Ordering::Relaxed);
            return;
        }
        let suppressed = self.suppressed.swap(0, Ordering::Relaxed);
        tracing::warn!(
            %peer,
            suppressed,
            "peer connection refused: {why}"
        );
    }
}

/// Bytes reserved for a frame before any of its payload has arrived.
const FRAME_INITIAL_CAPACITY: usize = 64 << 10;

/// Reads one `[len u32 BE][Envelope]` frame from `reader`, using `buf` as scratch space.
///
/// A length above `max_frame` is refused before anything is allocated for it, and the buffer
/// grows only as payload bytes actually arrive: a peer (or garbage on the port) that announces a
/// huge frame and then stalls or disconnects costs at most `FRAME_INITIAL_CAPACITY` (64 KiB) bytes, not
/// the announced length. A connection that ends inside a frame is `UnexpectedEof`; a frame
/// that is not an `Envelope` is `InvalidData`.
pub async fn read_frame<R>(
    reader: &mut R,
    buf: &mut Vec<u8>,
    max_frame: usize,
) -> std::io::Result<Envelope>
where
    R: tokio::io::AsyncRead + Unpin,
{
    read_payload(reader, buf, max_frame).await?;
    decode(buf)
}

/// Reads one `[len u32 BE][Envelope][MAC]` frame of an authenticated connection, as
/// [`read_frame`] does, and checks its MAC with `opener` before decoding anything: a frame
/// that fails it is `PermissionDenied`.
pub async fn read_sealed_frame<R>(
    reader: &mut R,
    buf: &mut Vec<u8>,
    max_frame: usize,
    opener: &mut FrameOpener,
) -> std::io::Result<Envelope>
where
    R: tokio::io::AsyncRead + Unpin,
{
    read_payload(reader, buf, max_frame).await?;
    let mut tag = [0u8; TAG_LEN];
    reader.read_exact(&mut tag).await?;
    opener.open(buf, &tag)?;
    decode(buf)
}

/// Reads one frame's length and payload into `buf` (see [`read_frame`] for the bounds).
async fn read_payload<R>(reader: &mut R, buf: &mut Vec<u8>, max_frame: usize) -> std::io::Result<()>
where
    R: tokio::io::AsyncRead + Unpin,
{
    let mut len = [0u8; 4];
    reader.read_exact(&mut len).await?;
    let len = u32::from_be_bytes(len) as usize;
    if len > max_frame {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("frame of {len} bytes exceeds the maximum of {max_frame}"),
        ));
    }
    if buf.capacity() > FRAME_INITIAL_CAPACITY.max(len) {
        // Do not keep a large frame's buffer for the life of the connection.
        *buf = Vec::new();
    }
    buf.clear();
    buf.reserve(len.min(FRAME_INITIAL_CAPACITY));
    let got = reader.take(len as u64).read_to_end(buf).await?;
    if got < len {
        return Err(std::io::Error::new(
            std::io::ErrorKind::UnexpectedEof,
            format!("connection ended after {got} of a {len}-byte frame"),
        ));
    }
    Ok(())
}

fn decode(buf: &[u8]) -> std::io::Result<Envelope> {
    Envelope::decode(buf).map_err(|e| {
        std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("undecodable frame: {e}"),
        )
    })
}

#[cfg(test)]
mod tests;
