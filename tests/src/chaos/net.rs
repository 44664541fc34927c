//! The fault-injecting network: one TCP proxy per destination node, shared by every sender.
//!
//! Sluice's Raft transport opens one connection per (sender, receiver) pair and only the
//! sender writes; each frame is `[u32 big-endian length][prost Envelope]` and the envelope's
//! field 1 is the sender's id, so a connection's first bytes are `len, 0x08, varint(from)`.
//! The proxy for node *d* reads that prefix, learns the sender, and forwards the connection
//! unless the directed link `from → d` is cut. One address per node is what `ALTER CLUSTER
//! ADD NODE` records, so joined nodes are reachable (and cuttable) like the founders.
//!
//! Cutting a link closes its open connections at once and refuses new ones until healed.

use std::collections::{BTreeMap, BTreeSet};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::time::{timeout, Duration};

/// Directed links `(from, to)` currently cut.
pub type Cuts = BTreeSet<(u64, u64)>;

/// How long a new connection may take to send its first frame header.
const HEADER_WAIT: Duration = Duration::from_secs(5);

pub struct Net {
    cuts: watch::Sender<Cuts>,
    proxies: BTreeMap<u64, Proxy>,
}

struct Proxy {
    port: u16,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Default for Net {
    fn default() -> Self {
        Net::new()
    }
}

impl Net {
    pub fn new() -> Net {
        Net {
            cuts: watch::Sender::new(Cuts::new()),
            proxies: BTreeMap::new(),
        }
    }

    /// The proxy port for node `to`, started on first use, forwarding to its Raft port.
    pub async fn proxy_for(&mut self, to: u64, raft_port: u16) -> u16 {
        if let Some(p) = self.proxies.get(&to) {
            return p.port;
        }
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind a proxy port");
        let port = listener.local_addr().expect("proxy address").port();
        let cuts = self.cuts.subscribe();
        let task = tokio::spawn(accept_loop(listener, to, raft_port, cuts));
        self.proxies.insert(to, Proxy { port, task });
        port
    }

    /// Replaces the set of cut links.
    pub fn set_cuts(&self, cuts: Cuts) {
        self.cuts.send_replace(cuts);
    }

    pub fn cuts(&self) -> Cuts {
        self.cuts.borrow().clone()
    }

    pub fn heal(&self) {
        self.set_cuts(Cuts::new());
    }

    /// Cuts every link between `id` and `others`, both directions.
    pub fn isolate(&self, id: u64, others: &[u64]) {
        let mut cuts = self.cuts();
        for &o in others.iter().filter(|o| **o != id) {
            cuts.insert((id, o));
            cuts.insert((o, id));
        }
        self.set_cuts(cuts);
    }

    /// Cuts every link between a node of `a` and a node of `b`, both directions.
    pub fn split(&self, a: &[u64], b: &[u64]) {
        let mut cuts = self.cuts();
        for &x in a {
            for &y in b.iter().filter(|y| **y != x) {
                cuts.insert((x, y));
                cuts.insert((y, x));
            }
        }
        self.set_cuts(cuts);
    }

    /// Cuts the directed links `from → to` for every `from` in `froms`.
    pub fn cut_directed(&self, froms: &[u64], tos: &[u64]) {
        let mut cuts = self.cuts();
        for &f in froms {
            for &t in tos.iter().filter(|t| **t != f) {
                cuts.insert((f, t));
            }
        }
        self.set_cuts(cuts);
    }
}

async fn accept_loop(listener: TcpListener, to: u64, raft_port: u16, cuts: watch::Receiver<Cuts>) {
    loop {
        let Ok((inbound, _)) = listener.accept().await else {
            tokio::time::sleep(Duration::from_millis(10)).await;
            continue;
        };
        let _ = inbound.set_nodelay(true);
        tokio::spawn(forward(inbound, to, raft_port, cuts.clone()));
    }
}

/// Reads the sender's id from the first frame, then relays the connection until it ends or
/// its link is cut.
async fn forward(mut inbound: TcpStream, to: u64, raft_port: u16, mut cuts: watch::Receiver<Cuts>) {
    let Ok(Ok((from, header))) = timeout(HEADER_WAIT, read_sender(&mut inbound)).await else {
        return;
    };
    if cuts.borrow_and_update().contains(&(from, to)) {
        return;
    }
    let Ok(mut outbound) = TcpStream::connect(("127.0.0.1", raft_port)).await else {
        return;
    };
    let _ = outbound.set_nodelay(true);
    if outbound.write_all(&header).await.is_err() {
        return;
    }
    let relay = tokio::io::copy_bidirectional(&mut inbound, &mut outbound);
    let watch_cut = async {
        loop {
            if cuts.changed().await.is_err() {
                std::future::pending::<()>().await;
            }
            if cuts.borrow_and_update().contains(&(from, to)) {
                return;
            }
        }
    };
    tokio::select! {
        _ = relay => {}
        _ = watch_cut => {}
    }
}

/// Reads `[len u32][0x08][varint from]` and returns the sender and the bytes read. A frame
/// that does not start with field 1 is attributed to node 0 (no cut names it).
async fn read_sender(stream: &mut TcpStream) -> std::io::Result<(u64, Vec<u8>)> {
    let mut header = vec![0u8; 5];
    stream.read_exact(&mut header).await?;
    if header[4] != 0x08 {
        return Ok((0, header));
    }
    let mut from = 0u64;
    for shift in (0..64).step_by(7) {
        let b = stream.read_u8().await?;
        header.push(b);
        from |= u64::from(b & 0x7f) << shift;
        if b & 0x80 == 0 {
            return Ok((from, header));
        }
    }
    Ok((0, header))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn directed_cuts_follow_the_sender_in_the_first_frame() {
        let target = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let target_port = target.local_addr().expect("addr").port();
        let mut net = Net::new();
        let proxy = net.proxy_for(2, target_port).await;
        let frame = |from: u8| vec![0, 0, 0, 3, 0x08, from, 0x10];
        // 1 → 2 passes.
        let mut c = TcpStream::connect(("127.0.0.1", proxy))
            .await
            .expect("connect");
        c.write_all(&frame(1)).await.expect("write");
        let (mut s, _) = target.accept().await.expect("accept");
        let mut got = [0u8; 7];
        s.read_exact(&mut got).await.expect("read");
        assert_eq!(got.to_vec(), frame(1));
        // Cutting 1 → 2 closes the open connection...
        net.cut_directed(&[1], &[2]);
        let n = timeout(Duration::from_secs(2), s.read(&mut got))
            .await
            .expect("closed in time")
            .expect("read");
        assert_eq!(n, 0);
        // ...and refuses a new one, while 3 → 2 still passes.
        let mut c1 = TcpStream::connect(("127.0.0.1", proxy))
            .await
            .expect("connect");
        c1.write_all(&frame(1)).await.expect("write");
        let mut c3 = TcpStream::connect(("127.0.0.1", proxy))
            .await
            .expect("connect");
        c3.write_all(&frame(3)).await.expect("write");
        let (mut s3, _) = timeout(Duration::from_secs(2), target.accept())
            .await
            .expect("accepted in time")
            .expect("accept");
        s3.read_exact(&mut got).await.expect("read");
        assert_eq!(got.to_vec(), frame(3));
        let n = timeout(Duration::from_secs(2), c1.read(&mut got))
            .await
            .expect("closed in time")
            .unwrap_or(0);
        assert_eq!(n, 0);
        drop(c);
    }
}
