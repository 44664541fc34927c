//! Connection rules: a small `pg_hba.conf`, written in the config file as
//!
//! ```toml
//! [[connection_rules]]
//! address = "10.0.0.0/8"        # CIDR, one address, "loopback" or "all"
//! user = "app"                  # optional: one user name (default: every user)
//! require = ["tls", "scram"]    # any of "tls", "scram", "cert"; [] trusts
//! # reject = true               # refuse what matches instead
//! ```
//!
//! Owns parsing the rules and deciding, for a connection's address and user, what it must
//! prove. Invariants: the first rule whose address range and user match decides, as in
//! `pg_hba.conf`; when rules are configured a connection no rule matches is refused (`28000`);
//! without rules the server's defaults hold ([`crate::auth`]: trust on loopback without
//! `--password`, SCRAM with it). Rules only choose how a login proves itself: the transport
//! policy (`--allow-unencrypted`) still applies beyond loopback. A rule is checked at start
//! against what the server can do (`tls` needs `--tls-cert`, `cert` needs `--tls-client-ca`),
//! so it never silently fails open.

use std::net::IpAddr;

use serde::Deserialize;

/// A rule as written in the config file.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RuleText {
    address: String,
    #[serde(default)]
    user: Option<String>,
    #[serde(default)]
    require: Vec<String>,
    #[serde(default)]
    reject: bool,
}

/// What a rule makes a login prove.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Requirements {
    /// The connection is encrypted.
    pub tls: bool,
    /// The password, by SCRAM-SHA-256.
    pub scram: bool,
    /// A client certificate (verified against `--tls-client-ca`) whose Common Name is the
    /// user name.
    pub cert: bool,
}

/// One rule, parsed.
#[derive(Debug, Clone)]
pub struct Rule {
    /// 1-based position in the file, for messages.
    pub number: usize,
    range: Range,
    user: Option<String>,
    /// `None`: the rule rejects.
    requires: Option<Requirements>,
}

#[derive(Debug, Clone, PartialEq)]
enum Range {
    All,
    Loopback,
    Net { base: IpAddr, prefix: u8 },
}

impl Range {
    fn parse(text: &str) -> Result<Range, String> {
        match text {
            "all" => return Ok(Range::All),
            "loopback" => return Ok(Range::Loopback),
            _ => {}
        }
        let (addr, prefix) = match text.split_once('/') {
            Some((a, p)) => (a, Some(p)),
            None => (text, None),
        };
        let base: IpAddr = addr.parse().map_err(|_| {
            format!(
                "address \"{text}\": expected a CIDR range, an address, \"loopback\" or \"all\""
            )
        })?;
        let bits = if base.is_ipv4() { 32 } else { 128 };
        let prefix = match prefix {
            None => bits,
            Some(p) => p
                .parse::<u8>()
                .ok()
                .filter(|p| *p <= bits)
                .ok_or_else(|| format!("address \"{text}\": the prefix must be 0 to {bits}"))?,
        };
        Ok(Range::Net { base, prefix })
    }

    fn contains(&self, ip: IpAddr) -> bool {
        let ip = match ip {
            IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
            v4 => v4,
        };
        match self {
            Range::All => true,
            Range::Loopback => ip.is_loopback(),
            Range::Net { base, prefix } => match (base, ip) {
                (IpAddr::V4(b), IpAddr::V4(a)) => {
                    let mask = u32::MAX.checked_shl(32 - *prefix as u32).unwrap_or(0);
                    u32::from(*b) & mask == u32::from(a) & mask
                }
                (IpAddr::V6(b), IpAddr::V6(a)) => {
                    let mask = u128::MAX.checked_shl(128 - *prefix as u32).unwrap_or(0);
                    u128::from(*b) & mask == u128::from(a) & mask
                }
                _ => false,
            },
        }
    }
}

/// What the server offers, against which rules are checked at start.
pub struct Offers {
    pub tls: bool,
    pub client_ca: bool,
}

/// Parses the rules, refusing one the server could not enforce.
pub fn parse(texts: &[RuleText], offers: &Offers) -> Result<Vec<Rule>, String> {
    texts
        .iter()
        .enumerate()
        .map(|(i, t)| {
            let number = i + 1;
            let err = |m: String| format!("connection rule {number}: {m}");
            let range = Range::parse(&t.address).map_err(err)?;
            let requires = if t.reject {
                if !t.require.is_empty() {
                    return Err(err("a rule that rejects requires nothing".into()));
                }
                None
            } else {
                let mut r = Requirements::default();
                for word in &t.require {
                    match word.as_str() {
                        "tls" => r.tls = true,
                        "scram" => r.scram = true,
                        "cert" => r.cert = true,
                        other => {
                            return Err(err(format!(
                                "unknown requirement \"{other}\" (expected tls, scram or cert)"
                            )))
                        }
                    }
                }
                if (r.tls || r.cert) && !offers.tls {
                    return Err(err(
                        "requires TLS, but no --tls-cert/--tls-key is set".into()
                    ));
                }
                if r.cert && !offers.client_ca {
                    return Err(err(
                        "requires a client certificate, but no --tls-client-ca is set".into(),
                    ));
                }
                Some(r)
            };
            if t.user.as_deref() == Some("") {
                return Err(err(
                    "the user is empty (leave it out to match every user)".into()
                ));
            }
            Ok(Rule {
                number,
                range,
                user: t.user.clone().filter(|u| u != "all"),
                requires,
            })
        })
        .collect()
}

/// What the rules decide for a connection.
#[derive(Debug, PartialEq, Eq)]
pub enum Decision {
    /// No rules are configured: the server's defaults hold.
    Defaults,
    Allow(Requirements),
    /// Refused by rule `n` (`Some`) or by no rule matching (`None`).
    Refuse(Option<usize>),
}

/// The first matching rule's decision.
pub fn decide(rules: &[Rule], ip: IpAddr, user: &str) -> Decision {
    if rules.is_empty() {
        return Decision::Defaults;
    }
    match rules
        .iter()
        .find(|r| r.range.contains(ip) && r.user.as_deref().is_none_or(|u| u == user))
    {
        None => Decision::Refuse(None),
        Some(Rule {
            requires: Some(r), ..
        }) => Decision::Allow(*r),
        Some(rule) => Decision::Refuse(Some(rule.number)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(address: &str, user: Option<&str>, require: &[&str], reject: bool) -> RuleText {
        RuleText {
            address: address.into(),
            user: user.map(Into::into),
            require: require.iter().map(|s| s.to_string()).collect(),
            reject,
        }
    }

    const ALL: Offers = Offers {
        tls: true,
        client_ca: true,
    };

    #[test]
    fn the_first_matching_rule_decides() {
        let rules = parse(
            &[
                rule("loopback", Some("ops"), &[], true),
                rule("10.1.0.0/16", Some("app"), &["cert"], false),
                rule("10.0.0.0/8", None, &["tls", "scram"], false),
                rule("::1", None, &[], false),
                rule("loopback", None, &["scram"], false),
            ],
            &ALL,
        )
        .unwrap();
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        assert_eq!(
            decide(&rules, ip("127.0.0.1"), "ops"),
            Decision::Refuse(Some(1))
        );
        let cert = Requirements {
            cert: true,
            ..Default::default()
        };
        assert_eq!(decide(&rules, ip("10.1.2.3"), "app"), Decision::Allow(cert));
        let tls_scram = Requirements {
            tls: true,
            scram: true,
            ..Default::default()
        };
        assert_eq!(
            decide(&rules, ip("10.1.2.3"), "bob"),
            Decision::Allow(tls_scram)
        );
        assert_eq!(
            decide(&rules, ip("10.200.0.1"), "app"),
            Decision::Allow(tls_scram)
        );
        // an IPv4-mapped IPv6 peer matches its IPv4 range
        assert_eq!(
            decide(&rules, ip("::ffff:10.9.9.9"), "bob"),
            Decision::Allow(tls_scram)
        );
        // loopback covers ::1 too
        assert_eq!(decide(&rules, ip("::1"), "ops"), Decision::Refuse(Some(1)));
        assert_eq!(
            decide(&rules, ip("::1"), "bob"),
            Decision::Allow(Requirements::default())
        );
        let scram = Requirements {
            scram: true,
            ..Default::default()
        };
        assert_eq!(
            decide(&rules, ip("127.0.0.2"), "bob"),
            Decision::Allow(scram)
        );
        assert_eq!(
            decide(&rules, ip("192.0.2.1"), "bob"),
            Decision::Refuse(None)
        );
        assert_eq!(decide(&[], ip("192.0.2.1"), "bob"), Decision::Defaults);
        let everyone = parse(&[rule("0.0.0.0/0", None, &[], false)], &ALL).unwrap();
        assert_eq!(
            decide(&everyone, ip("203.0.113.9"), "x"),
            Decision::Allow(Requirements::default())
        );
    }

    #[test]
    fn rules_the_server_cannot_enforce_are_refused_at_start() {
        let no_tls = Offers {
            tls: false,
            client_ca: false,
        };
        for (r, offers, says) in [
            (rule("all", None, &["tls"], false), &no_tls, "no --tls-cert"),
            (
                rule("all", None, &["cert"], false),
                &Offers {
                    tls: true,
                    client_ca: false,
                },
                "no --tls-client-ca",
            ),
            (
                rule("all", None, &["md5"], false),
                &ALL,
                "unknown requirement",
            ),
            (rule("10.0.0.0/33", None, &[], false), &ALL, "prefix"),
            (rule("10.0.0", None, &[], false), &ALL, "expected a CIDR"),
            (
                rule("all", None, &["scram"], true),
                &ALL,
                "rejects requires nothing",
            ),
            (rule("all", Some(""), &[], false), &ALL, "user is empty"),
        ] {
            let e = parse(&[r], offers).unwrap_err();
            assert!(
                e.starts_with("connection rule 1:") && e.contains(says),
                "{e}"
            );
        }
    }
}
