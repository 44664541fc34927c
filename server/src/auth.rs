//! Who may log in, over what, and how they prove it.
//!
//! Owns the client port's TLS ([`crate::tls`]), the bootstrap superuser's [`Verifier`] (made
//! from `--password` at startup) and each login's SCRAM exchange ([`crate::scram`]) against
//! the role's verifier in the replicated catalog ([`sluice_sql::roles`]); a role without
//! LOGIN is refused (`28000`) once its password is proven, or at once in trust mode.
//! Invariants: without `--password` the server trusts its clients, and then it listens only
//! on loopback (the configuration refuses anything else); with it, every login proves its
//! password with SCRAM-SHA-256 and no password ever crosses the connection — cleartext and
//! MD5 password requests are never sent, on TLS or off it; a client beyond loopback must
//! use TLS unless `--allow-unencrypted` says otherwise; a failed login is `28P01` whether the
//! user exists or not. Connection rules in the config file ([`crate::rules`]), when there
//! are any, replace the first two defaults: the first matching rule says whether a login
//! needs TLS, its password (SCRAM, even without `--password`: then only roles with a
//! password can log in), a client certificate naming the user, or nothing; no match is
//! `28000`.

use std::net::SocketAddr;

use pgwire::error::PgWireError;
use pgwire::tokio::TlsAcceptor;
use rand::RngCore;
use sluice_sql::error::sqlstate;
use sluice_sql::roles::Roles;
use sluice_sql::settings::SslInfo;

use crate::config::Config;
use crate::errors::fatal;
use crate::rules::{self, Decision, Rule};
use crate::scram::{self, Exchange, Failure, Verifier};
use crate::tls::{self, Tls};

/// The server's authentication settings.
pub struct Auth {
    superuser: String,
    /// The superuser's verifier; `None`: clients are trusted.
    bootstrap: Option<Verifier>,
    tls: Option<Tls>,
    allow_unencrypted: bool,
    /// The config file's connection rules ([`crate::rules`]).
    rules: Vec<Rule>,
    /// Salts the mock exchange of users without a password.
    mock_secret: [u8; 32],
}

impl Auth {
    /// From the configuration: loads the TLS files (an error names the file).
    pub fn new(config: &Config) -> Result<Auth, String> {
        let tls = match &config.tls {
            Some(files) => Some(tls::load(
                &files.cert,
                &files.key,
                files.client_ca.as_deref(),
            )?),
            None => None,
        };
        let mut auth = Auth::with(
            config.superuser.clone(),
            config.password.as_deref(),
            tls,
            config.allow_unencrypted,
        );
        auth.rules = config.rules.clone();
        Ok(auth)
    }

    pub fn with(
        superuser: String,
        password: Option<&str>,
        tls: Option<Tls>,
        allow_unencrypted: bool,
    ) -> Auth {
        let mut mock_secret = [0u8; 32];
        rand::rngs::OsRng.fill_bytes(&mut mock_secret);
        Auth {
            superuser,
            bootstrap: password.map(Verifier::new),
            tls,
            allow_unencrypted,
            rules: Vec::new(),
            mock_secret,
        }
    }

    /// How a login must prove itself: the transport policy first, then the first matching
    /// connection rule, or without rules the defaults (trust without `--password`, SCRAM
    /// with it).
    pub fn admit(
        &self,
        peer: SocketAddr,
        tls: Option<&SslInfo>,
        user: &str,
        roles: &Roles,
    ) -> Result<Proof, PgWireError> {
        self.check_transport(peer, tls.is_some())?;
        let refused = |why: String| {
            Err(fatal(
                sqlstate::INVALID_AUTHORIZATION_SPECIFICATION,
                &format!(
                    "connection for host \"{}\", user \"{user}\" refused: {why}",
                    peer.ip()
                ),
            ))
        };
        let needs = match rules::decide(&self.rules, peer.ip(), user) {
            Decision::Defaults if self.bootstrap.is_none() => return Ok(Proof::Trust),
            Decision::Defaults => return Ok(Proof::Scram),
            Decision::Refuse(Some(n)) => return refused(format!("connection rule {n} rejects it")),
            Decision::Refuse(None) => return refused("no connection rule matches it".into()),
            Decision::Allow(needs) => needs,
        };
        if needs.tls && tls.is_none() {
            return refused("its connection rule requires an encrypted connection".into());
        }
        if needs.cert && tls.and_then(|t| t.client_cn.as_deref()) != Some(user) {
            return Err(fatal(
                sqlstate::INVALID_AUTHORIZATION_SPECIFICATION,
                &format!(
                    "certificate authentication failed for user \"{user}\": its connection rule \
                     requires a client certificate whose common name is the user name"
                ),
            ));
        }
        if needs.scram {
            return Ok(Proof::Scram);
        }
        // admitted without a password: a name that is no role must be the bootstrap
        // superuser's (only zero-config trust lets any name in as a superuser)
        if roles.get(user).is_none() && user != self.superuser {
            return Err(fatal(
                sqlstate::INVALID_AUTHORIZATION_SPECIFICATION,
                &format!("role \"{user}\" does not exist"),
            ));
        }
        Ok(Proof::Trust)
    }

    pub fn tls_acceptor(&self) -> Option<TlsAcceptor> {
        self.tls.as_ref().map(|t| t.acceptor.clone())
    }

    /// Refuses a plain connection from beyond loopback unless unencrypted ones are allowed
    /// (`28000`, as PostgreSQL's "no pg_hba.conf entry ... no encryption").
    pub fn check_transport(&self, peer: SocketAddr, secure: bool) -> Result<(), PgWireError> {
        if secure || peer.ip().is_loopback() || self.allow_unencrypted {
            return Ok(());
        }
        Err(fatal(
            sqlstate::INVALID_AUTHORIZATION_SPECIFICATION,
            &format!(
                "connection from {} refused: no encryption (connect with sslmode=require; \
                 the server accepts unencrypted connections only from loopback)",
                peer.ip()
            ),
        ))
    }

    /// The SASL mechanisms offered on a connection.
    pub fn mechanisms(&self, secure: bool) -> Vec<String> {
        scram::mechanisms(secure && self.tls.is_some())
    }

    /// A SCRAM exchange for `user` on a connection (`secure`: over TLS, so it may bind to it).
    /// A role's own verifier wins; the bootstrap superuser's password holds until the
    /// catalog gives that role one.
    pub fn exchange(&self, user: &str, secure: bool, roles: &Roles) -> Exchange {
        let own = roles
            .get(user)
            .and_then(|r| r.verifier.as_deref())
            .and_then(Verifier::parse);
        let verifier = match (own, &self.bootstrap) {
            (Some(v), _) => Some(v),
            (None, Some(v)) if user == self.superuser => Some(v.clone()),
            _ => None,
        };
        let end_point = match &self.tls {
            Some(tls) if secure => Some(tls.end_point.clone()),
            _ => None,
        };
        Exchange::new(user, verifier, &self.mock_secret, end_point)
    }
}

/// What a login must still prove once admitted.
#[derive(Debug, PartialEq, Eq)]
pub enum Proof {
    /// Nothing more: trusted (or proven by its certificate).
    Trust,
    /// Its password, by SCRAM-SHA-256.
    Scram,
}

/// Refuses a role that may not log in (`28000`, after its password was proven).
pub fn check_login(user: &str, roles: &Roles) -> Result<(), PgWireError> {
    match roles.get(user) {
        Some(r) if !r.login => Err(fatal(
            sqlstate::INVALID_AUTHORIZATION_SPECIFICATION,
            &format!("role \"{user}\" is not permitted to log in"),
        )),
        _ => Ok(()),
    }
}

/// A failed exchange as the client sees it.
pub fn failure(user: &str, f: Failure) -> PgWireError {
    match f {
        Failure::Protocol(message) => fatal(sqlstate::PROTOCOL_VIOLATION, &message),
        Failure::Password => fatal(
            sqlstate::INVALID_PASSWORD,
            &format!("password authentication failed for user \"{user}\""),
        ),
    }
}

/// The connection's SCRAM exchange between the client's first and final messages.
#[derive(Default)]
pub struct ScramSlot(pub std::sync::Mutex<Option<Exchange>>);

/// What `pg_stat_ssl` will show of the connection, found when TLS was negotiated.
pub struct ConnectionTls(pub Option<sluice_sql::settings::SslInfo>);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_connections_from_beyond_loopback_are_refused_unless_allowed() {
        let strict = Auth::with("sluice".into(), Some("pw"), None, false);
        let remote: SocketAddr = "192.0.2.7:5000".parse().unwrap();
        let local: SocketAddr = "127.0.0.1:5000".parse().unwrap();
        let Err(PgWireError::UserError(info)) = strict.check_transport(remote, false) else {
            panic!("a plain remote connection was let in");
        };
        assert_eq!(info.code, "28000");
        assert!(info.message.contains("no encryption"), "{}", info.message);
        assert!(strict.check_transport(remote, true).is_ok());
        assert!(strict.check_transport(local, false).is_ok());
        let lax = Auth::with("sluice".into(), Some("pw"), None, true);
        assert!(lax.check_transport(remote, false).is_ok());
    }

    #[test]
    fn only_the_superuser_has_the_bootstrap_password() {
        let auth = Auth::with("admin".into(), Some("pw"), None, false);
        let local: SocketAddr = "127.0.0.1:5000".parse().unwrap();
        assert_eq!(
            auth.admit(local, None, "admin", &Roles::default()).ok(),
            Some(Proof::Scram)
        );
        assert_eq!(auth.mechanisms(true), vec!["SCRAM-SHA-256".to_string()]);
        // another user name runs the same exchange to a 28P01 (a mock verifier)
        let mut ex = auth.exchange("sluice", false, &Roles::default());
        let first = ex.client_first("SCRAM-SHA-256", b"n,,n=,r=abc").unwrap();
        assert!(first.starts_with(b"r=abc"));
        let nonce = String::from_utf8(first).unwrap()[2..]
            .split(',')
            .next()
            .unwrap()
            .to_string();
        let last = format!("c=biws,r={nonce},p=AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=");
        assert_eq!(ex.client_final(last.as_bytes()), Err(Failure::Password));
        let local: SocketAddr = "127.0.0.1:5000".parse().unwrap();
        let trusting = Auth::with("admin".into(), None, None, false);
        assert_eq!(
            trusting
                .admit(local, None, "anyone", &Roles::default())
                .ok(),
            Some(Proof::Trust)
        );
    }

    #[test]
    fn a_rule_that_asks_no_password_admits_only_roles_and_the_superuser() {
        let mut auth = Auth::with("sluice".into(), Some("pw"), None, false);
        let local: SocketAddr = "127.0.0.1:5000".parse().unwrap();
        let roles = Roles::default();
        assert_eq!(
            auth.admit(local, None, "anyone", &roles).ok(),
            Some(Proof::Scram)
        );
        let rule: rules::RuleText = toml::from_str("address = \"loopback\"").unwrap();
        auth.rules = rules::parse(
            &[rule],
            &rules::Offers {
                tls: false,
                client_ca: false,
            },
        )
        .unwrap();
        assert_eq!(
            auth.admit(local, None, "sluice", &roles).ok(),
            Some(Proof::Trust)
        );
        let Err(PgWireError::UserError(info)) = auth.admit(local, None, "mallory", &roles) else {
            panic!("a name that is no role got in without a password");
        };
        assert_eq!(info.code, "28000");
        assert_eq!(info.message, "role \"mallory\" does not exist");
        let remote: SocketAddr = "192.0.2.7:5000".parse().unwrap();
        let tls = SslInfo::default();
        let Err(PgWireError::UserError(info)) = auth.admit(remote, Some(&tls), "sluice", &roles)
        else {
            panic!("no rule matched, yet the connection got in");
        };
        assert_eq!(info.code, "28000");
        assert!(
            info.message.contains("no connection rule matches"),
            "{}",
            info.message
        );
    }
}
