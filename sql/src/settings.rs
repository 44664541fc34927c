//! Session settings: the values every session starts with (what SHOW
//! answers), the spellings clients use for their names, and what each
//! setting accepts.
//!
//! Values are stored as SHOW reports them: a setting Sluice acts on is
//! normalized when it is set (`statement_timeout = 2000` shows `2s`, a boolean
//! `on`/`off`), and checked ([`validate_setting`]) wherever it is set — by
//! `SET` in a session and by `set_config` in the catalog functions, which
//! both read a session's [`SessionVars`]. This module sits below both the
//! session and the system catalogs, and knows neither.
//! `transaction_read_only` is not stored by SET: it is the current
//! transaction's mode, which `Session::sync_settings` reports.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use crate::error::{sqlstate, Error, Result};

/// What catalog queries and session functions read about their session.
#[derive(Debug, Default)]
pub struct SessionVars {
    pub user: String,
    /// The role the session acts as (named like `user`); `None`: a superuser outside the
    /// roles.
    pub role: Option<String>,
    pub database: String,
    /// Current values of the session's settings (what SHOW answers).
    pub settings: Settings,
    /// The backend's process id as clients see it (`pg_backend_pid()`).
    pub pid: i32,
    /// The connection's TLS, `None` for a plain connection (`pg_stat_ssl`).
    pub ssl: Option<SslInfo>,
}

/// A session's settings by name, and a count of the changes made to them: what a session
/// derives from its settings on every statement (its memory limit, its default transaction
/// mode, what it logs) it keeps until the count moves, instead of looking each one up and
/// parsing it again (`Session::sync_settings`). Reads go through `Deref` to the map; every
/// change goes through [`Settings::insert`] or [`Settings::remove`], which count it.
#[derive(Debug, Default, Clone)]
pub struct Settings {
    map: BTreeMap<String, String>,
    changes: u64,
}

impl Settings {
    pub fn insert(&mut self, name: String, value: String) -> Option<String> {
        self.changes += 1;
        self.map.insert(name, value)
    }

    pub fn remove(&mut self, name: &str) -> Option<String> {
        self.changes += 1;
        self.map.remove(name)
    }

    /// Every setting replaced by `map`'s (RESET ALL).
    pub fn replace(&mut self, map: BTreeMap<String, String>) {
        self.changes += 1;
        self.map = map;
    }

    /// How many changes were made so far: equal counts, equal settings.
    pub fn changes(&self) -> u64 {
        self.changes
    }
}

impl From<BTreeMap<String, String>> for Settings {
    fn from(map: BTreeMap<String, String>) -> Settings {
        Settings { map, changes: 0 }
    }
}

impl std::ops::Deref for Settings {
    type Target = BTreeMap<String, String>;

    fn deref(&self) -> &Self::Target {
        &self.map
    }
}

/// What `pg_stat_ssl` shows of a TLS connection.
#[derive(Debug, Clone, Default)]
pub struct SslInfo {
    /// `TLSv1.2` or `TLSv1.3`.
    pub version: String,
    pub cipher: String,
    pub bits: i32,
    /// The client certificate's subject, issuer and serial (hex), when one was sent.
    pub client_dn: Option<String>,
    /// The client certificate's Common Name (what a `cert` connection rule matches the user
    /// name against).
    pub client_cn: Option<String>,
    pub issuer_dn: Option<String>,
    pub client_serial: Option<String>,
}

pub type SharedVars = Arc<parking_lot::RwLock<SessionVars>>;

/// PostgreSQL's `log_min_duration_statement`: a statement that runs at least
/// this long is logged with its duration (`-1`, the default, logs none; `0`
/// logs every one). Only a superuser may change it, as in PostgreSQL: it
/// decides what the operator's log shows.
pub const LOG_MIN_DURATION: &str = "log_min_duration_statement";

/// Settings only a superuser may change (PostgreSQL's `superuser` context).
const SUPERUSER_SETTINGS: &[&str] = &[LOG_MIN_DURATION];

/// The values of the server's flags that are also session settings.
#[derive(Debug, Clone, Copy, Default)]
pub struct SettingDefaults {
    pub max_statement_memory: usize,
    pub statement_timeout: Option<Duration>,
    pub log_min_duration: Option<Duration>,
}

/// Settings every session starts with (SHOW answers these); `statement_timeout`,
/// `max_statement_memory` and `log_min_duration_statement` from the server's flags.
pub fn default_settings(defaults: SettingDefaults) -> BTreeMap<String, String> {
    let memory = crate::memory::format_bytes(defaults.max_statement_memory);
    let timeout = crate::interrupt::format_timeout(defaults.statement_timeout);
    let log_min_duration = format_log_min_duration(defaults.log_min_duration);
    [
        ("server_version", crate::SERVER_VERSION),
        ("server_version_num", crate::SERVER_VERSION_NUM),
        ("server_encoding", "UTF8"),
        ("client_encoding", "UTF8"),
        ("datestyle", "ISO, MDY"),
        ("timezone", "UTC"),
        ("intervalstyle", "postgres"),
        ("integer_datetimes", "on"),
        ("standard_conforming_strings", "on"),
        ("search_path", "\"$user\", public"),
        ("transaction_isolation", "serializable"),
        ("default_transaction_isolation", "serializable"),
        ("transaction_read_only", "off"),
        ("application_name", ""),
        ("extra_float_digits", "1"),
        ("max_identifier_length", "63"),
        ("is_superuser", "on"),
        ("lc_collate", "C"),
        ("lc_ctype", "C"),
        ("tail_wait", "10s"),
        ("read_consistency", "prefix"),
        ("default_table_access_method", "heap"),
        ("default_transaction_read_only", "off"),
        (crate::interrupt::STATEMENT_TIMEOUT, &timeout),
        (crate::memory::SETTING, &memory),
        (LOG_MIN_DURATION, &log_min_duration),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect()
}

/// A boolean setting as PostgreSQL reads one.
pub fn parse_bool(value: &str) -> Option<bool> {
    match value.trim().to_ascii_lowercase().as_str() {
        "on" | "true" | "yes" | "1" | "t" | "y" => Some(true),
        "off" | "false" | "no" | "0" | "f" | "n" => Some(false),
        _ => None,
    }
}

/// Map spellings clients use to the setting's canonical name.
pub fn canonical_setting(name: &str) -> String {
    let n = name.trim().to_lowercase();
    match n.as_str() {
        "time zone" | "time_zone" => "timezone".into(),
        "transaction isolation level" => "transaction_isolation".into(),
        "session characteristics as transaction isolation level" => {
            "default_transaction_isolation".into()
        }
        "names" => "client_encoding".into(),
        other => other
            .trim_start_matches("session ")
            .trim_start_matches("local ")
            .to_string(),
    }
}

/// Check a value for a (canonical) setting name before it is stored.
pub fn validate_setting(name: &str, value: &str) -> Result<()> {
    normalize_setting(name, value).map(|_| ())
}

/// A value for a (canonical) setting name as it is stored and shown; an
/// error if the setting cannot take it.
pub fn normalize_setting(name: &str, value: &str) -> Result<String> {
    let invalid = || {
        Error::new(
            sqlstate::INVALID_PARAMETER_VALUE,
            format!("invalid value for parameter \"{name}\": \"{value}\""),
        )
    };
    match name {
        crate::interrupt::STATEMENT_TIMEOUT => {
            let t = crate::interrupt::parse_timeout(value)?;
            return Ok(crate::interrupt::format_timeout(t));
        }
        "default_transaction_read_only" | "transaction_read_only" => {
            let on = parse_bool(value).ok_or_else(invalid)?;
            return Ok(if on { "on" } else { "off" }.into());
        }
        LOG_MIN_DURATION => {
            return Ok(format_log_min_duration(parse_log_min_duration(value)?));
        }
        crate::memory::SETTING => {
            let bytes = crate::units::parse_bytes(value).map_err(|_| invalid())?;
            let bytes = usize::try_from(bytes).map_err(|_| invalid())?;
            if bytes < crate::memory::MIN_STATEMENT_MEMORY {
                return Err(Error::new(
                    sqlstate::INVALID_PARAMETER_VALUE,
                    format!(
                        "{bytes} bytes is below the minimum of {} for parameter \"{name}\"",
                        crate::memory::format_bytes(crate::memory::MIN_STATEMENT_MEMORY)
                    ),
                ));
            }
            return Ok(crate::memory::format_bytes(bytes));
        }
        _ => {}
    }
    match name {
        "tail_wait" => {
            crate::units::parse_duration_ms(value)?;
        }
        "read_consistency" if !matches!(value, "prefix" | "linearizable") => {
            return Err(Error::new(
                    sqlstate::INVALID_PARAMETER_VALUE,
                    format!("invalid value for parameter \"read_consistency\": \"{value}\" (prefix or linearizable)"),
                ));
        }
        "client_encoding" => {
            let v = value.to_uppercase().replace(['-', '_'], "");
            if v != "UTF8" && v != "UNICODE" {
                return Err(Error::unsupported(format!(
                    "client_encoding \"{value}\" is not supported; only UTF8"
                )));
            }
        }
        "server_version" | "server_version_num" | "server_encoding" | "integer_datetimes"
        | "lc_collate" | "lc_ctype" => {
            return Err(Error::new(
                sqlstate::CANT_CHANGE_RUNTIME_PARAM,
                format!("parameter \"{name}\" cannot be changed"),
            ))
        }
        _ if !is_known_setting(name) => {
            return Err(Error::new(
                sqlstate::UNDEFINED_OBJECT,
                format!("unrecognized configuration parameter \"{name}\""),
            ))
        }
        _ => {}
    }
    Ok(value.to_string())
}

/// `42501` unless the session may change setting `name`: some are a
/// superuser's only (see [`LOG_MIN_DURATION`]).
pub fn check_may_set(name: &str, vars: &SessionVars) -> Result<()> {
    let superuser = vars.settings.get("is_superuser").map(String::as_str) == Some("on");
    if SUPERUSER_SETTINGS.contains(&name) && !superuser {
        return Err(Error::new(
            sqlstate::INSUFFICIENT_PRIVILEGE,
            format!("permission denied to set parameter \"{name}\""),
        ));
    }
    Ok(())
}

/// A `log_min_duration_statement` value: `-1` is off (`None`); otherwise a
/// duration in milliseconds (a bare number) or with a unit, up to `i32::MAX` ms.
pub fn parse_log_min_duration(value: &str) -> Result<Option<Duration>> {
    if value.trim() == "-1" {
        return Ok(None);
    }
    let invalid = || {
        Error::new(
            sqlstate::INVALID_PARAMETER_VALUE,
            format!("invalid value for parameter \"{LOG_MIN_DURATION}\": \"{value}\""),
        )
    };
    let ms = crate::units::parse_duration_ms(value).map_err(|_| invalid())?;
    if ms > i32::MAX as u64 {
        return Err(invalid());
    }
    Ok(Some(Duration::from_millis(ms)))
}

/// As SHOW shows `log_min_duration_statement`: `-1`, `0`, `250ms`, `2s`.
pub fn format_log_min_duration(d: Option<Duration>) -> String {
    match d {
        None => "-1".into(),
        Some(d) if d.is_zero() => "0".into(),
        Some(d) => crate::interrupt::format_timeout(Some(d)),
    }
}

/// PostgreSQL 15's configuration parameters (`SELECT name FROM pg_settings`), which clients
/// set whether or not Sluice acts on them.
const PG_SETTINGS: &str = include_str!("pg_setting_names.txt");

/// Settings only Sluice has.
const OWN_SETTINGS: &[&str] = &[
    crate::memory::SETTING,
    "tail_wait",
    "read_consistency",
    // set by SET ROLE / SET SESSION AUTHORIZATION / reported at startup
    "role",
    "session_authorization",
    "is_superuser",
];

/// Whether a (canonical) name is a setting: PostgreSQL's, Sluice's own, or a custom
/// `prefix.name` (which PostgreSQL accepts for extensions and applications).
pub fn is_known_setting(name: &str) -> bool {
    name.contains('.')
        || OWN_SETTINGS.contains(&name)
        || PG_SETTINGS
            .lines()
            .any(|known| known.eq_ignore_ascii_case(name))
}
