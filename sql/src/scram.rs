//! SCRAM-SHA-256 password authentication (RFC 5802, RFC 7677), as PostgreSQL speaks it,
//! with `tls-server-end-point` channel binding (`SCRAM-SHA-256-PLUS`) over TLS.
//!
//! Owns the stored form of a password — a [`Verifier`], PostgreSQL's
//! `SCRAM-SHA-256$<iterations>:<salt>$<StoredKey>:<ServerKey>` — and one login's
//! [`Exchange`]. Invariants: the password itself is never kept (only the salted, iterated
//! keys, from which it cannot be recovered and with which a client cannot be impersonated);
//! a user without a verifier goes through the same exchange with a salt derived from its name
//! and fails only at the end, so the answers do not tell which users exist; proofs are
//! compared in constant time; a client that announces channel binding support while the
//! server offers it (`y` over TLS) is refused, as a downgrade; over TLS the client may bind to
//! the server's certificate, and then must send exactly that binding.

use std::sync::Arc;

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine as _;
use hmac::{Hmac, KeyInit, Mac};
use rand::RngCore;
use sha2::{Digest, Sha256};

/// PostgreSQL's default `scram_iterations`.
pub const ITERATIONS: u32 = 4096;
const SALT_BYTES: usize = 16;
const NONCE_BYTES: usize = 18;
/// The most iterations a stored verifier may ask for (a verifier is data that came from a
/// client's `PASSWORD '...'`; a huge count would make every login spin).
const MAX_ITERATIONS: u32 = 1 << 20;

pub const MECHANISM: &str = "SCRAM-SHA-256";
pub const MECHANISM_PLUS: &str = "SCRAM-SHA-256-PLUS";
const CHANNEL_BINDING_TYPE: &str = "tls-server-end-point";

/// The mechanisms offered: with channel binding first when the connection is TLS.
pub fn mechanisms(tls: bool) -> Vec<String> {
    let mut m = Vec::new();
    if tls {
        m.push(MECHANISM_PLUS.to_string());
    }
    m.push(MECHANISM.to_string());
    m
}

/// A password's stored form.
#[derive(Clone, PartialEq, Eq)]
pub struct Verifier {
    iterations: u32,
    salt: Vec<u8>,
    stored_key: [u8; 32],
    server_key: [u8; 32],
}

impl std::fmt::Debug for Verifier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Verifier(..)")
    }
}

impl Verifier {
    /// A verifier for `password` under a fresh random salt.
    pub fn new(password: &str) -> Verifier {
        let mut salt = vec![0u8; SALT_BYTES];
        rand::rngs::OsRng.fill_bytes(&mut salt);
        Verifier::with_salt(password, &salt, ITERATIONS)
    }

    pub fn with_salt(password: &str, salt: &[u8], iterations: u32) -> Verifier {
        let salted = hi(&normalize(password), salt, iterations);
        let client_key = hmac(&salted, b"Client Key");
        Verifier {
            iterations,
            salt: salt.to_vec(),
            stored_key: Sha256::digest(client_key).into(),
            server_key: hmac(&salted, b"Server Key"),
        }
    }

    /// Reads PostgreSQL's text form; `None` when `text` is not one.
    pub fn parse(text: &str) -> Option<Verifier> {
        let rest = text.strip_prefix("SCRAM-SHA-256$")?;
        let (params, keys) = rest.split_once('$')?;
        let (iterations, salt) = params.split_once(':')?;
        let (stored, server) = keys.split_once(':')?;
        let iterations: u32 = iterations.parse().ok()?;
        if iterations == 0 || iterations > MAX_ITERATIONS {
            return None;
        }
        Some(Verifier {
            iterations,
            salt: B64.decode(salt).ok()?,
            stored_key: B64.decode(stored).ok()?.try_into().ok()?,
            server_key: B64.decode(server).ok()?.try_into().ok()?,
        })
    }

    /// PostgreSQL's text form (what `pg_authid.rolpassword` shows).
    pub fn to_text(&self) -> String {
        format!(
            "SCRAM-SHA-256${}:{}${}:{}",
            self.iterations,
            B64.encode(&self.salt),
            B64.encode(self.stored_key),
            B64.encode(self.server_key)
        )
    }

    /// Whether `password` is the one this verifier was made from (what a login proves
    /// without sending it).
    pub fn matches(&self, password: &str) -> bool {
        let other = Verifier::with_salt(password, &self.salt, self.iterations);
        constant_time_eq(&other.stored_key, &self.stored_key)
    }

    /// A verifier no password matches, whose salt depends only on `user` and `secret`, for
    /// users that do not exist or have no password.
    fn mock(user: &str, secret: &[u8; 32]) -> Verifier {
        let mut salt = hmac(secret, user.as_bytes()).to_vec();
        salt.truncate(SALT_BYTES);
        let mut keys = [0u8; 64];
        rand::rngs::OsRng.fill_bytes(&mut keys);
        Verifier {
            iterations: ITERATIONS,
            salt,
            stored_key: keys[..32].try_into().unwrap_or_default(),
            server_key: keys[32..].try_into().unwrap_or_default(),
        }
    }
}

/// Why an exchange failed: the client broke the protocol (`08P01`), or the password (or user)
/// is wrong (`28P01`).
#[derive(Debug, PartialEq, Eq)]
pub enum Failure {
    Protocol(String),
    Password,
}

fn protocol(message: impl Into<String>) -> Failure {
    Failure::Protocol(message.into())
}

/// One login's SCRAM exchange, from the client's first message to the server's last.
pub struct Exchange {
    verifier: Verifier,
    /// False for a mock verifier: the exchange runs to its end and fails.
    real: bool,
    /// The connection's channel binding data, `None` on a plain connection.
    end_point: Option<Arc<Vec<u8>>>,
    state: State,
}

enum State {
    First,
    Final {
        client_first_bare: String,
        server_first: String,
        nonce: String,
        /// What the client's `c=` must decode to.
        binding: Vec<u8>,
    },
    Done,
}

impl Exchange {
    /// `verifier` is the user's, `None` when the user does not exist or has no password
    /// (`mock_secret` then salts the mock); `end_point` is the TLS channel binding data.
    pub fn new(
        user: &str,
        verifier: Option<Verifier>,
        mock_secret: &[u8; 32],
        end_point: Option<Arc<Vec<u8>>>,
    ) -> Exchange {
        let real = verifier.is_some();
        Exchange {
            verifier: verifier.unwrap_or_else(|| Verifier::mock(user, mock_secret)),
            real,
            end_point,
            state: State::First,
        }
    }

    /// The client's SASLInitialResponse: returns the server-first-message.
    pub fn client_first(&mut self, mechanism: &str, data: &[u8]) -> Result<Vec<u8>, Failure> {
        if !matches!(self.state, State::First) {
            return Err(protocol("unexpected SASL initial response"));
        }
        let plus = match mechanism {
            MECHANISM => false,
            MECHANISM_PLUS if self.end_point.is_some() => true,
            _ => {
                return Err(protocol(
                    "client selected an invalid SASL authentication mechanism",
                ))
            }
        };
        let text = std::str::from_utf8(data)
            .map_err(|_| protocol("malformed SCRAM message (not UTF-8)"))?;
        // gs2-header: cbind-flag "," [authzid] ","
        let (flag, rest) = text
            .split_once(',')
            .ok_or_else(|| protocol("malformed SCRAM message (no GS2 header)"))?;
        match (flag, plus) {
            ("n", false) => {}
            ("y", false) if self.end_point.is_none() => {}
            ("y", false) => return Err(protocol("SCRAM channel binding negotiation error")),
            (f, true) if f == format!("p={CHANNEL_BINDING_TYPE}") => {}
            (f, true) if f.starts_with("p=") => {
                return Err(protocol(format!(
                    "unsupported SCRAM channel-binding type \"{}\"",
                    &f[2..]
                )))
            }
            (_, true) => {
                return Err(protocol(
                    "channel binding is required by SCRAM-SHA-256-PLUS, but the client message does not use it",
                ))
            }
            (f, false) if f.starts_with("p=") => {
                return Err(protocol(
                    "the client selected SCRAM-SHA-256 without channel binding, but the SCRAM message includes channel binding data",
                ))
            }
            _ => return Err(protocol("malformed SCRAM message (bad GS2 flag)")),
        }
        let (authzid, bare) = rest
            .split_once(',')
            .ok_or_else(|| protocol("malformed SCRAM message (no GS2 header)"))?;
        if !authzid.is_empty() {
            return Err(protocol(
                "client uses authorization identity, but it is not supported",
            ));
        }
        let mut attrs = bare.split(',');
        // The user name is the startup packet's (PostgreSQL ignores `n=`).
        if !attrs.next().is_some_and(|a| a.starts_with("n=")) {
            return Err(protocol("malformed SCRAM message (no user name)"));
        }
        let client_nonce = attrs
            .next()
            .and_then(|a| a.strip_prefix("r="))
            .filter(|n| !n.is_empty() && n.bytes().all(|b| (0x21..=0x7e).contains(&b)))
            .ok_or_else(|| protocol("malformed SCRAM message (bad nonce)"))?;
        if attrs.any(|a| a.starts_with("m=")) {
            return Err(protocol("unsupported SCRAM extension"));
        }
        let mut server_nonce = [0u8; NONCE_BYTES];
        rand::rngs::OsRng.fill_bytes(&mut server_nonce);
        let nonce = format!("{client_nonce}{}", B64.encode(server_nonce));
        let server_first = format!(
            "r={nonce},s={},i={}",
            B64.encode(&self.verifier.salt),
            self.verifier.iterations
        );
        let mut binding = format!("{flag},,").into_bytes();
        if plus {
            binding.extend_from_slice(self.end_point.as_deref().map_or(&[][..], |v| v));
        }
        self.state = State::Final {
            client_first_bare: bare.to_string(),
            server_first: server_first.clone(),
            nonce,
            binding,
        };
        Ok(server_first.into_bytes())
    }

    /// The client's final message: returns the server-final-message (its proof that it knew
    /// the verifier) when the client proved it knows the password.
    pub fn client_final(&mut self, data: &[u8]) -> Result<Vec<u8>, Failure> {
        let State::Final {
            client_first_bare,
            server_first,
            nonce,
            binding,
        } = std::mem::replace(&mut self.state, State::Done)
        else {
            return Err(protocol("unexpected SASL response"));
        };
        let text = std::str::from_utf8(data)
            .map_err(|_| protocol("malformed SCRAM message (not UTF-8)"))?;
        let (without_proof, proof) = text
            .rsplit_once(",p=")
            .ok_or_else(|| protocol("malformed SCRAM message (no proof)"))?;
        let mut attrs = without_proof.split(',');
        let channel = attrs
            .next()
            .and_then(|a| a.strip_prefix("c="))
            .and_then(|c| B64.decode(c).ok())
            .ok_or_else(|| protocol("malformed SCRAM message (bad channel binding)"))?;
        if !constant_time_eq(&channel, &binding) {
            return Err(protocol("SCRAM channel binding check failed"));
        }
        if attrs.next().and_then(|a| a.strip_prefix("r=")) != Some(nonce.as_str()) {
            return Err(protocol("SCRAM nonce mismatch"));
        }
        let proof: [u8; 32] = B64
            .decode(proof)
            .ok()
            .and_then(|p| p.try_into().ok())
            .ok_or_else(|| protocol("malformed SCRAM message (bad proof)"))?;
        let auth_message = format!("{client_first_bare},{server_first},{without_proof}");
        let signature = hmac(&self.verifier.stored_key, auth_message.as_bytes());
        let mut client_key = [0u8; 32];
        for (k, (p, s)) in client_key.iter_mut().zip(proof.iter().zip(signature)) {
            *k = p ^ s;
        }
        let stored: [u8; 32] = Sha256::digest(client_key).into();
        if !constant_time_eq(&stored, &self.verifier.stored_key) || !self.real {
            return Err(Failure::Password);
        }
        let server_signature = hmac(&self.verifier.server_key, auth_message.as_bytes());
        Ok(format!("v={}", B64.encode(server_signature)).into_bytes())
    }
}

/// SASLprep (RFC 4013) of a password; one that cannot be prepared is used as its bytes, as
/// PostgreSQL does.
fn normalize(password: &str) -> Vec<u8> {
    match stringprep::saslprep(password) {
        Ok(p) => p.into_owned().into_bytes(),
        Err(_) => password.as_bytes().to_vec(),
    }
}

fn hmac(key: &[u8], data: &[u8]) -> [u8; 32] {
    let mut mac = Hmac::<Sha256>::new_from_slice(key)
        .unwrap_or_else(|_| unreachable!("HMAC takes keys of any length"));
    mac.update(data);
    mac.finalize().into_bytes().into()
}

/// RFC 5802's Hi: PBKDF2 with HMAC-SHA-256 and one block.
fn hi(password: &[u8], salt: &[u8], iterations: u32) -> [u8; 32] {
    let mut block = salt.to_vec();
    block.extend_from_slice(&1u32.to_be_bytes());
    let mut u = hmac(password, &block);
    let mut out = u;
    for _ in 1..iterations {
        u = hmac(password, &u);
        for (o, b) in out.iter_mut().zip(u) {
            *o ^= b;
        }
    }
    out
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    /// RFC 7677's example exchange, user `user`, password `pencil`.
    const SALT: &str = "W22ZaJ0SNY7soEsUEjb6gQ==";
    const CLIENT_FIRST: &str = "n,,n=user,r=rOprNGfwEbeRWgbNEkqO";

    fn rfc_exchange(verifier: Verifier, real: bool) -> Exchange {
        Exchange {
            verifier,
            real,
            end_point: None,
            state: State::First,
        }
    }

    /// Runs the RFC's client messages against an exchange whose server nonce is the RFC's.
    fn run_rfc(ex: &mut Exchange) -> Result<Vec<u8>, Failure> {
        let first = ex.client_first(MECHANISM, CLIENT_FIRST.as_bytes())?;
        let first = String::from_utf8(first).unwrap();
        assert!(first.starts_with("r=rOprNGfwEbeRWgbNEkqO"), "{first}");
        assert!(first.ends_with(&format!(",s={SALT},i=4096")), "{first}");
        // put the RFC's server nonce in place of the random one
        let nonce = "rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0";
        if let State::Final {
            server_first,
            nonce: n,
            ..
        } = &mut ex.state
        {
            *server_first = format!("r={nonce},s={SALT},i=4096");
            *n = nonce.to_string();
        }
        ex.client_final(
            format!("c=biws,r={nonce},p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ=").as_bytes(),
        )
    }

    fn rfc_verifier(password: &str) -> Verifier {
        Verifier::with_salt(password, &B64.decode(SALT).unwrap(), 4096)
    }

    #[test]
    fn the_rfc_7677_exchange_authenticates_and_proves_the_server() {
        let mut ex = rfc_exchange(rfc_verifier("pencil"), true);
        let last = run_rfc(&mut ex).expect("the RFC's proof");
        assert_eq!(
            String::from_utf8(last).unwrap(),
            "v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4="
        );
    }

    #[test]
    fn a_wrong_password_or_a_mock_verifier_fails_at_the_end() {
        let mut ex = rfc_exchange(rfc_verifier("pencil2"), true);
        assert_eq!(run_rfc(&mut ex), Err(Failure::Password));
        // the right keys, but no such user: still refused
        let mut ex = rfc_exchange(rfc_verifier("pencil"), false);
        assert_eq!(run_rfc(&mut ex), Err(Failure::Password));
        // a mock's salt is stable per user, so it does not give the user away
        let secret = [7u8; 32];
        assert_eq!(
            Verifier::mock("nobody", &secret).salt,
            Verifier::mock("nobody", &secret).salt
        );
        assert_ne!(
            Verifier::mock("nobody", &secret).salt,
            Verifier::mock("other", &secret).salt
        );
    }

    #[test]
    fn verifiers_round_trip_through_postgresql_text_and_hold_no_password() {
        let v = Verifier::new("s3cret pässword");
        let text = v.to_text();
        assert!(text.starts_with("SCRAM-SHA-256$4096:"), "{text}");
        assert!(!text.contains("s3cret"));
        assert_eq!(Verifier::parse(&text), Some(v.clone()));
        assert!(v.matches("s3cret pässword"));
        assert!(!v.matches("s3cret password"));
        for bad in [
            "",
            "md5abc",
            "SCRAM-SHA-256$0:AAAA$AAAA:AAAA",
            "SCRAM-SHA-256$99999999:AAAA$AAAA:AAAA",
            "SCRAM-SHA-256$4096:AAAA$AAAA:AAAA",
        ] {
            assert_eq!(Verifier::parse(bad), None, "{bad}");
        }
        // a verifier PostgreSQL 15 made for password 'pencil' (CREATE ROLE pencil LOGIN
        // PASSWORD 'pencil'; SELECT rolpassword FROM pg_authid ..)
        let pg = "SCRAM-SHA-256$4096:OaN+8kCIUuDcl4MQr0iJ8w==$Cscp1LOhhyzz2l7rG7G6RRxF1J14odY6H4lMLs7J5YI=:ioWJ5zHuZFXVSNzCjtn9OLZwQvUX/zA53j4LljGoWuk=";
        assert!(Verifier::parse(pg)
            .expect("PostgreSQL's verifier")
            .matches("pencil"));
    }

    #[test]
    fn channel_binding_is_checked_and_a_downgrade_refused() {
        let end_point = Arc::new(vec![1u8, 2, 3]);
        let secret = [0u8; 32];
        let tls = |ex: Option<Verifier>| Exchange::new("u", ex, &secret, Some(end_point.clone()));
        // over TLS, a client that says it could bind but thinks the server cannot: downgrade
        let mut ex = tls(Some(Verifier::new("pw")));
        assert!(matches!(
            ex.client_first(MECHANISM, b"y,,n=,r=abc"),
            Err(Failure::Protocol(m)) if m.contains("negotiation")
        ));
        // -PLUS without binding data, and binding data under the plain mechanism
        let mut ex = tls(Some(Verifier::new("pw")));
        assert!(ex.client_first(MECHANISM_PLUS, b"n,,n=,r=abc").is_err());
        let mut ex = tls(Some(Verifier::new("pw")));
        assert!(ex
            .client_first(MECHANISM, b"p=tls-server-end-point,,n=,r=abc")
            .is_err());
        // -PLUS on a plain connection is not offered, so not accepted
        let mut plain = Exchange::new("u", Some(Verifier::new("pw")), &secret, None);
        assert!(plain
            .client_first(MECHANISM_PLUS, b"p=tls-server-end-point,,n=,r=abc")
            .is_err());
        assert_eq!(mechanisms(false), vec![MECHANISM.to_string()]);
        assert_eq!(mechanisms(true)[0], MECHANISM_PLUS);
        // the client's c= must carry the certificate hash it was given
        let mut ex = tls(Some(Verifier::new("pw")));
        let first = ex
            .client_first(MECHANISM_PLUS, b"p=tls-server-end-point,,n=,r=abc")
            .unwrap();
        let nonce = String::from_utf8(first).unwrap()[2..]
            .split(',')
            .next()
            .unwrap()
            .to_string();
        let wrong = B64.encode(b"p=tls-server-end-point,,\x09\x09\x09");
        let msg = format!("c={wrong},r={nonce},p={}", B64.encode([0u8; 32]));
        assert!(matches!(
            ex.client_final(msg.as_bytes()),
            Err(Failure::Protocol(m)) if m.contains("channel binding")
        ));
    }

    #[test]
    fn a_full_exchange_with_a_client_built_from_the_rfc_formulas() {
        // the client side of RFC 5802, computed from the password, against a random salt and
        // nonce, with channel binding
        let end_point = Arc::new(b"certificate hash".to_vec());
        let verifier = Verifier::new("correct horse");
        for (password, ok) in [("correct horse", true), ("wrong horse", false)] {
            let mut ex = Exchange::new(
                "u",
                Some(verifier.clone()),
                &[0; 32],
                Some(end_point.clone()),
            );
            let first_bare = "n=,r=clientnonce";
            let gs2 = "p=tls-server-end-point,,";
            let server_first = String::from_utf8(
                ex.client_first(MECHANISM_PLUS, format!("{gs2}{first_bare}").as_bytes())
                    .unwrap(),
            )
            .unwrap();
            let mut parts = server_first.split(',');
            let nonce = parts.next().unwrap()[2..].to_string();
            let salt = B64.decode(&parts.next().unwrap()[2..]).unwrap();
            let iterations: u32 = parts.next().unwrap()[2..].parse().unwrap();
            let mut binding = gs2.as_bytes().to_vec();
            binding.extend_from_slice(&end_point);
            let without_proof = format!("c={},r={nonce}", B64.encode(&binding));
            let salted = hi(&normalize(password), &salt, iterations);
            let client_key = hmac(&salted, b"Client Key");
            let stored: [u8; 32] = Sha256::digest(client_key).into();
            let auth = format!("{first_bare},{server_first},{without_proof}");
            let signature = hmac(&stored, auth.as_bytes());
            let proof: Vec<u8> = client_key
                .iter()
                .zip(signature)
                .map(|(a, b)| a ^ b)
                .collect();
            let answer =
                ex.client_final(format!("{without_proof},p={}", B64.encode(proof)).as_bytes());
            assert_eq!(answer.is_ok(), ok, "{password}");
            if ok {
                let server_key = hmac(&salted, b"Server Key");
                let expected = format!("v={}", B64.encode(hmac(&server_key, auth.as_bytes())));
                assert_eq!(String::from_utf8(answer.unwrap()).unwrap(), expected);
            }
        }
    }
}
