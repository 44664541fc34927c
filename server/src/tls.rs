//! TLS on the client port: the server's certificate and key, the optional CA that client
//! certificates must chain to, and what a session learns of its connection's TLS
//! (`pg_stat_ssl`, SCRAM channel binding).
//!
//! Invariants: only TLS 1.2 and 1.3 are offered (rustls has nothing older); the ALPN protocol
//! is `postgresql`, so PostgreSQL 17's direct TLS (`sslnegotiation=direct`) works beside the
//! `SSLRequest` handshake; a client certificate, when one is sent, must chain to
//! `--tls-client-ca` (without that flag none is asked for); the channel binding data
//! (`tls-server-end-point`, RFC 5929) is the hash of the server's own certificate under the
//! hash of its signature algorithm, computed once when the files are loaded.

use std::path::Path;
use std::sync::Arc;

use pgwire::tokio::server::MaybeTls;
use pgwire::tokio::tokio_rustls::rustls::{self, server::WebPkiClientVerifier, RootCertStore};
use pgwire::tokio::TlsAcceptor;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use sha2::Digest;
use sluice_sql::settings::SslInfo;
use x509_certificate::certificate::X509Certificate;
use x509_certificate::SignatureAlgorithm;

/// The client port's TLS: the acceptor pgwire's negotiation uses and the channel binding data.
#[derive(Clone)]
pub struct Tls {
    pub acceptor: TlsAcceptor,
    /// `tls-server-end-point` channel binding data: the hash of the server's certificate.
    pub end_point: Arc<Vec<u8>>,
}

/// Loads `cert` (PEM chain, the server's certificate first), `key` (PEM private key) and,
/// with `client_ca`, the PEM roots client certificates must chain to.
pub fn load(cert: &Path, key: &Path, client_ca: Option<&Path>) -> Result<Tls, String> {
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert)
        .and_then(|certs| certs.collect())
        .map_err(|e| format!("--tls-cert {}: {e}", cert.display()))?;
    let Some(first) = chain.first() else {
        return Err(format!(
            "--tls-cert {}: no certificate in the file",
            cert.display()
        ));
    };
    let end_point =
        end_point_hash(first).map_err(|e| format!("--tls-cert {}: {e}", cert.display()))?;
    let private = PrivateKeyDer::from_pem_file(key)
        .map_err(|e| format!("--tls-key {}: {e}", key.display()))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
        .map_err(|e| format!("TLS: {e}"))?;
    let builder = match client_ca {
        None => builder.with_no_client_auth(),
        Some(ca) => {
            let mut roots = RootCertStore::empty();
            let certs = CertificateDer::pem_file_iter(ca)
                .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
                .map_err(|e| format!("--tls-client-ca {}: {e}", ca.display()))?;
            for c in certs {
                roots
                    .add(c)
                    .map_err(|e| format!("--tls-client-ca {}: {e}", ca.display()))?;
            }
            if roots.is_empty() {
                return Err(format!(
                    "--tls-client-ca {}: no certificate in the file",
                    ca.display()
                ));
            }
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                .allow_unauthenticated()
                .build()
                .map_err(|e| format!("--tls-client-ca {}: {e}", ca.display()))?;
            builder.with_client_cert_verifier(verifier)
        }
    };
    let mut config = builder
        .with_single_cert(chain, private)
        .map_err(|e| format!("--tls-cert/--tls-key: {e}"))?;
    config.alpn_protocols = vec![b"postgresql".to_vec()];
    Ok(Tls {
        acceptor: TlsAcceptor::from(Arc::new(config)),
        end_point: Arc::new(end_point),
    })
}

/// RFC 5929's `tls-server-end-point`: the certificate hashed with its signature's hash
/// (SHA-256 for MD5 and SHA-1 signatures).
fn end_point_hash(cert: &CertificateDer<'_>) -> Result<Vec<u8>, String> {
    let parsed = X509Certificate::from_der(cert.as_ref()).map_err(|e| e.to_string())?;
    let der = cert.as_ref();
    Ok(match parsed.signature_algorithm() {
        Some(SignatureAlgorithm::RsaSha384) | Some(SignatureAlgorithm::EcdsaSha384) => {
            sha2::Sha384::digest(der).to_vec()
        }
        Some(SignatureAlgorithm::RsaSha512) => sha2::Sha512::digest(der).to_vec(),
        Some(SignatureAlgorithm::Ed25519) => {
            return Err(
                "Ed25519 certificates cannot be used for SCRAM channel binding \
                        (RFC 5929 names no hash for them); use an RSA or ECDSA certificate"
                    .into(),
            )
        }
        _ => sha2::Sha256::digest(der).to_vec(),
    })
}

/// What `pg_stat_ssl` shows of a connection, `None` for a plain one.
pub fn info(stream: &MaybeTls) -> Option<SslInfo> {
    let MaybeTls::Tls(tls) = stream else {
        return None;
    };
    let conn = tls.get_ref().1;
    let version = match conn.protocol_version() {
        Some(rustls::ProtocolVersion::TLSv1_3) => "TLSv1.3",
        Some(rustls::ProtocolVersion::TLSv1_2) => "TLSv1.2",
        _ => "unknown",
    };
    let suite = conn.negotiated_cipher_suite();
    let cipher = suite
        .map(|s| format!("{:?}", s.suite()))
        .unwrap_or_default();
    let bits = if cipher.contains("AES_128") { 128 } else { 256 };
    let client = conn
        .peer_certificates()
        .and_then(|certs| certs.first())
        .and_then(|c| X509Certificate::from_der(c.as_ref()).ok());
    let name = |n: &x509_certificate::rfc3280::Name| n.user_friendly_str().ok();
    Some(SslInfo {
        version: version.to_string(),
        cipher,
        bits,
        client_dn: client.as_ref().and_then(|c| name(c.subject_name())),
        client_cn: client.as_ref().and_then(|c| {
            c.subject_name()
                .iter_common_name()
                .next()
                .and_then(|cn| cn.to_string().ok())
        }),
        issuer_dn: client.as_ref().and_then(|c| name(c.issuer_name())),
        client_serial: client.as_ref().map(|c| {
            c.serial_number_asn1()
                .as_slice()
                .iter()
                .map(|b| format!("{b:02X}"))
                .collect()
        }),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_or_empty_files_are_named_in_the_error() {
        let dir = tempfile::tempdir().unwrap();
        let empty = dir.path().join("empty.pem");
        std::fs::write(&empty, "").unwrap();
        let Err(e) = load(&dir.path().join("nope.pem"), &empty, None) else {
            panic!("loaded a missing certificate");
        };
        assert!(e.contains("--tls-cert") && e.contains("nope.pem"), "{e}");
        let Err(e) = load(&empty, &empty, None) else {
            panic!("loaded an empty certificate file");
        };
        assert!(e.contains("no certificate"), "{e}");
    }
}
