//! Mutual TLS for the cluster transport: every member holds a certificate and key signed by
//! the cluster's CA (`--peer-cert`, `--peer-key`, `--peer-ca`), presents it in both
//! directions, and accepts only peers whose certificate chains to that CA.
//!
//! A connector verifies the acceptor's certificate against the peer address it dialled (an IP
//! address must be in the certificate's subject alternative names, a host name must match
//! one), so a member's certificate needs both the `serverAuth` and the `clientAuth` extended
//! key usage. After the TLS handshake, without a cluster secret, the connector names itself
//! and the node it means to reach in a fixed-size hello:
//!
//! ```text
//! connector -> acceptor   MAGIC "SLUICET1" (8) || from u64 BE || to u64 BE
//! ```
//!
//! The acceptor refuses a hello meant for another node and pins the connection to `from`:
//! a frame naming another sender closes it. (With a cluster secret as well, the secret's own
//! handshake runs inside TLS instead and establishes the same.)
//!
//! Invariants: only TLS 1.3 is spoken between nodes (both ends are Sluice); a peer that
//! presents no certificate, or one that does not chain to the cluster CA, never gets past the
//! handshake, so nothing it sends reaches the node; the ALPN protocol is `sluice-raft`, so a
//! member's certificate cannot be used to open a session a client port would take for its own;
//! the key is read once at startup and never printed (`Debug` names only the files).

use std::fmt;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_rustls::rustls::{
    self, client::WebPkiServerVerifier, server::WebPkiClientVerifier, RootCertStore,
};
use tokio_rustls::{TlsAcceptor, TlsConnector};

use crate::error::{Error, Result};

const ALPN: &[u8] = b"sluice-raft";
const MAGIC: &[u8; 8] = b"SLUICET1";
/// Bytes of the hello a connector sends after the TLS handshake.
pub const HELLO_LEN: usize = MAGIC.len() + 8 + 8;

/// A member's TLS identity and the CA its peers must chain to.
#[derive(Clone)]
pub struct PeerTls {
    connector: TlsConnector,
    acceptor: TlsAcceptor,
    cert: PathBuf,
}

impl fmt::Debug for PeerTls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PeerTls({})", self.cert.display())
    }
}

impl PeerTls {
    /// Loads `cert` (PEM chain, the member's own certificate first), `key` (its PEM private
    /// key) and `ca` (the PEM roots every member's certificate chains to).
    pub fn load(cert: &Path, key: &Path, ca: &Path) -> Result<PeerTls> {
        let config = |what: &str, path: &Path, e: &dyn fmt::Display| {
            Error::Config(format!("{what} {}: {e}", path.display()))
        };
        let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert)
            .and_then(|certs| certs.collect())
            .map_err(|e| config("--peer-cert", cert, &e))?;
        if chain.is_empty() {
            return Err(config("--peer-cert", cert, &"no certificate in the file"));
        }
        let private =
            PrivateKeyDer::from_pem_file(key).map_err(|e| config("--peer-key", key, &e))?;
        let mut roots = RootCertStore::empty();
        let cas: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(ca)
            .and_then(|certs| certs.collect())
            .map_err(|e| config("--peer-ca", ca, &e))?;
        for c in cas {
            roots.add(c).map_err(|e| config("--peer-ca", ca, &e))?;
        }
        if roots.is_empty() {
            return Err(config("--peer-ca", ca, &"no certificate in the file"));
        }
        let roots = Arc::new(roots);
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let tls = |e: rustls::Error| Error::Config(format!("peer TLS: {e}"));

        let client_verifier =
            WebPkiClientVerifier::builder_with_provider(roots.clone(), provider.clone())
                .build()
                .map_err(|e| config("--peer-ca", ca, &e))?;
        let mut server = rustls::ServerConfig::builder_with_provider(provider.clone())
            .with_protocol_versions(&[&rustls::version::TLS13])
            .map_err(tls)?
            .with_client_cert_verifier(client_verifier)
            .with_single_cert(chain.clone(), private.clone_key())
            .map_err(|e| config("--peer-cert/--peer-key", cert, &e))?;
        server.alpn_protocols = vec![ALPN.to_vec()];
        // connectors only write and never resume a session: tickets would sit unread
        server.send_tls13_tickets = 0;

        let server_verifier = WebPkiServerVerifier::builder_with_provider(roots, provider.clone())
            .build()
            .map_err(|e| config("--peer-ca", ca, &e))?;
        let mut client = rustls::ClientConfig::builder_with_provider(provider)
            .with_protocol_versions(&[&rustls::version::TLS13])
            .map_err(tls)?
            .with_webpki_verifier(server_verifier)
            .with_client_auth_cert(chain, private)
            .map_err(|e| config("--peer-cert/--peer-key", cert, &e))?;
        client.alpn_protocols = vec![ALPN.to_vec()];

        Ok(PeerTls {
            connector: TlsConnector::from(Arc::new(client)),
            acceptor: TlsAcceptor::from(Arc::new(server)),
            cert: cert.to_path_buf(),
        })
    }

    /// Opens TLS to the peer at `addr` (as dialled: its host must be in the peer's
    /// certificate) and, unless `hello` is `None`, sends the hello naming `from` and `to`.
    pub async fn connect(
        &self,
        tcp: TcpStream,
        addr: &str,
        hello: Option<(u64, u64)>,
    ) -> std::io::Result<tokio_rustls::client::TlsStream<TcpStream>> {
        let mut stream = self.connector.connect(server_name(addr)?, tcp).await?;
        if let Some((from, to)) = hello {
            let mut bytes = [0u8; HELLO_LEN];
            bytes[..MAGIC.len()].copy_from_slice(MAGIC);
            bytes[MAGIC.len()..MAGIC.len() + 8].copy_from_slice(&from.to_be_bytes());
            bytes[MAGIC.len() + 8..].copy_from_slice(&to.to_be_bytes());
            stream.write_all(&bytes).await?;
            stream.flush().await?;
        }
        Ok(stream)
    }

    /// Accepts TLS from a peer, which must present a certificate chaining to the cluster CA.
    pub async fn accept(
        &self,
        tcp: TcpStream,
    ) -> std::io::Result<tokio_rustls::server::TlsStream<TcpStream>> {
        self.acceptor.accept(tcp).await.map_err(|e| {
            std::io::Error::new(
                std::io::ErrorKind::PermissionDenied,
                format!("TLS handshake failed: {e}"),
            )
        })
    }
}

/// Reads a connector's hello and returns the node it says it is; refuses a hello that is not
/// one or that is meant for another node than `me`.
pub async fn read_hello<S>(stream: &mut S, me: u64) -> std::io::Result<u64>
where
    S: AsyncRead + Unpin,
{
    let mut hello = [0u8; HELLO_LEN];
    stream.read_exact(&mut hello).await?;
    let refused = |why: String| std::io::Error::new(std::io::ErrorKind::PermissionDenied, why);
    if &hello[..MAGIC.len()] != MAGIC {
        return Err(refused(
            "the peer did not send a sluice TLS hello (does it use a cluster secret?)".into(),
        ));
    }
    let id_at = |at: usize| {
        let mut b = [0u8; 8];
        b.copy_from_slice(&hello[at..at + 8]);
        u64::from_be_bytes(b)
    };
    let (from, to) = (id_at(MAGIC.len()), id_at(MAGIC.len() + 8));
    if to != me {
        return Err(refused(format!(
            "node {from} meant to reach node {to}, not this node ({me})"
        )));
    }
    Ok(from)
}

/// The name a peer's certificate must carry: the IP address or host name of `addr`.
fn server_name(addr: &str) -> std::io::Result<ServerName<'static>> {
    let host = crate::peer_auth::address_host(addr);
    if let Ok(ip) = host.parse::<IpAddr>() {
        return Ok(ServerName::IpAddress(ip.into()));
    }
    ServerName::try_from(host.to_string()).map_err(|e| {
        std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("peer address {addr}: {e}"),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_name_checked_is_the_dialled_host() {
        let ip = |s: &str| match server_name(s).unwrap() {
            ServerName::IpAddress(ip) => IpAddr::from(ip).to_string(),
            other => panic!("{other:?}"),
        };
        assert_eq!(ip("127.0.0.1:7000"), "127.0.0.1");
        assert_eq!(ip("[::1]:7000"), "::1");
        match server_name("node-2.cluster.internal:7000").unwrap() {
            ServerName::DnsName(d) => assert_eq!(d.as_ref(), "node-2.cluster.internal"),
            other => panic!("{other:?}"),
        }
        assert!(server_name("not a host:7000").is_err());
    }

    #[tokio::test]
    async fn a_hello_for_another_node_is_refused() {
        let hello = |from: u64, to: u64| {
            let mut b = MAGIC.to_vec();
            b.extend(from.to_be_bytes());
            b.extend(to.to_be_bytes());
            b
        };
        assert_eq!(read_hello(&mut &hello(2, 1)[..], 1).await.unwrap(), 2);
        let other = read_hello(&mut &hello(2, 3)[..], 1).await.unwrap_err();
        assert_eq!(other.kind(), std::io::ErrorKind::PermissionDenied);
        let mut secret_hello = b"SLUICEP1".to_vec();
        secret_hello.extend([0u8; 16]);
        assert!(read_hello(&mut &secret_hello[..], 1).await.is_err());
        assert!(read_hello(&mut &hello(2, 1)[..10], 1).await.is_err());
    }
}
