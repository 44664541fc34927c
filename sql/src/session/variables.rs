//! SET, SHOW, RESET and DISCARD ALL in a session: the statements over the
//! session's [`SessionVars`](crate::settings::SessionVars), with the checks
//! only a session can make (its transaction's mode, the server's memory
//! limit). What a setting accepts is [`crate::settings`]'s. RESET returns a
//! setting to its value at startup (the startup packet's), else the
//! default.

use std::sync::Arc;

use arrow::array::{RecordBatch, StringArray};
use arrow::datatypes::{DataType, Field, Schema};

use super::transaction::Txn;
use super::{batches_stream, Output, Session};
use crate::error::{sqlstate, Error, Result};
use crate::settings::{
    canonical_setting, check_may_set, default_settings, normalize_setting, parse_bool,
    parse_log_min_duration, Settings, LOG_MIN_DURATION,
};
use crate::statement::{self, Parsed};

/// What `SHOW STREAMS` runs.
pub(super) const SHOW_STREAMS: &str =
    "SELECT name, first_offset, next_offset, bytes, segments FROM sluice_streams ORDER BY name";

/// What a session reads of its settings on every statement, derived from them once per
/// change ([`Settings::changes`]).
#[derive(Debug, Clone, Copy)]
pub(super) struct Derived {
    /// The settings' change count this was derived at.
    changes: u64,
    /// The statement memory limit: `max_statement_memory`, at most the server's.
    memory: usize,
    pub(super) default_read_only: bool,
    /// What `transaction_read_only` shows (`None`: not set).
    reported_read_only: Option<bool>,
    log_min_duration: Option<std::time::Duration>,
    /// `statement_timeout` (`None`: no limit).
    pub(super) statement_timeout: Option<std::time::Duration>,
}

impl Derived {
    fn of(settings: &Settings, max_memory: usize) -> Derived {
        let memory = settings
            .get(crate::memory::SETTING)
            .and_then(|v| crate::units::parse_bytes(v).ok())
            .map_or(usize::MAX, |b| usize::try_from(b).unwrap_or(usize::MAX))
            .min(max_memory);
        Derived {
            changes: settings.changes(),
            memory,
            default_read_only: settings
                .get("default_transaction_read_only")
                .is_some_and(|v| parse_bool(v) == Some(true)),
            reported_read_only: settings.get("transaction_read_only").map(|v| v == "on"),
            log_min_duration: settings
                .get(LOG_MIN_DURATION)
                .and_then(|v| parse_log_min_duration(v).ok().flatten()),
            statement_timeout: settings
                .get(crate::interrupt::STATEMENT_TIMEOUT)
                .and_then(|v| crate::interrupt::parse_timeout(v).ok().flatten()),
        }
    }
}

impl Session {
    /// The session's `log_min_duration_statement`: statements that take at
    /// least this long are logged; `None` logs none.
    pub fn log_min_duration(&self) -> Option<std::time::Duration> {
        self.derived().log_min_duration
    }

    pub fn setting(&self, name: &str) -> Option<String> {
        self.with_setting(name, |v| v.map(str::to_string))
    }

    /// `f` of the setting's current value, borrowed (what runs on every statement: no copy).
    pub fn with_setting<R>(&self, name: &str, f: impl FnOnce(Option<&str>) -> R) -> R {
        let vars = self.vars.read();
        if name.chars().any(char::is_uppercase) {
            f(vars.settings.get(&name.to_lowercase()).map(String::as_str))
        } else {
            f(vars.settings.get(name).map(String::as_str))
        }
    }

    /// A setting from the startup packet: also what RESET returns to. An
    /// error if the setting cannot take the value (the connection is refused).
    pub fn set_setting(&mut self, name: &str, value: &str) -> Result<()> {
        let name = canonical_setting(name);
        let value = normalize_setting(&name, value)?;
        check_may_set(&name, &self.vars.read())?;
        if name == crate::memory::SETTING {
            self.check_memory_setting(&value)?;
        }
        self.startup_settings.insert(name.clone(), value.clone());
        self.vars.write().settings.insert(name, value);
        Ok(())
    }

    /// Brings what settings control up to date before a statement: the
    /// memory limit of its plans, and `transaction_read_only` (what SHOW
    /// and `current_setting` report). What it reads of the settings is
    /// derived again only when they changed (see [`Settings`]).
    pub(super) fn sync_settings(&mut self) {
        let derived = self.derived();
        self.derived = Some(derived);
        if derived.memory != self.memory.limit() {
            self.memory.set_limit(derived.memory);
        }
        let read_only = self.read_only();
        if derived.reported_read_only != Some(read_only) {
            let value = if read_only { "on" } else { "off" };
            self.vars
                .write()
                .settings
                .insert("transaction_read_only".into(), value.into());
        }
    }

    /// What statements read of the settings: kept from the last statement while the
    /// settings have not changed since, else read again.
    pub(super) fn derived(&self) -> Derived {
        let vars = self.vars.read();
        match self.derived {
            Some(d) if d.changes == vars.settings.changes() => d,
            _ => Derived::of(&vars.settings, self.engine.limits.max_statement_memory),
        }
    }

    pub(super) fn set(&mut self, name: &str, value: &str) -> Result<Output> {
        self.values.clear();
        let name = canonical_setting(name);
        let value = normalize_setting(&name, value)?;
        check_may_set(&name, &self.vars.read())?;
        match name.as_str() {
            "transaction_read_only" => {
                self.set_transaction_read_only(value == "on")?;
                return Ok(Output::Tag("SET".into()));
            }
            crate::memory::SETTING => self.check_memory_setting(&value)?,
            _ => {}
        }
        self.vars.write().settings.insert(name, value);
        Ok(Output::Tag("SET".into()))
    }

    /// `RESET name`, or `RESET ALL` (`None`): back to the value the
    /// session started with (startup parameters), else the default.
    pub(super) fn reset(&mut self, name: Option<&str>) -> Result<Output> {
        self.values.clear();
        let mut reset = default_settings(self.engine.limits.setting_defaults());
        reset.extend(self.startup_settings.clone());
        let mut vars = self.vars.write();
        match name {
            None => vars.settings.replace(reset),
            Some(n) => {
                let n = canonical_setting(n);
                match reset.get(&n) {
                    Some(v) => {
                        vars.settings.insert(n, v.clone());
                    }
                    None => {
                        vars.settings.remove(&n);
                    }
                }
            }
        }
        Ok(Output::Tag("RESET".into()))
    }

    /// `DISCARD ALL`: cursors closed, channels unlistened, settings reset, prepared
    /// statements freed.
    pub(super) fn discard_all(&mut self) -> Result<Output> {
        self.outside_block("DISCARD ALL")?;
        self.close(None)?;
        self.unlisten(None)?;
        self.reset(None)?;
        self.deallocate(None);
        Ok(Output::Tag("DISCARD ALL".into()))
    }

    /// A session may lower its statement memory, not raise it past the server's.
    pub(super) fn check_memory_setting(&self, value: &str) -> Result<()> {
        let max = self.engine.limits.max_statement_memory;
        if crate::units::parse_bytes(value)? > max as u64 {
            return Err(Error::new(
                sqlstate::INVALID_PARAMETER_VALUE,
                format!(
                    "{value} exceeds the server's limit of {} for parameter \"{}\"",
                    crate::memory::format_bytes(max),
                    crate::memory::SETTING
                ),
            ));
        }
        Ok(())
    }

    /// `SET TRANSACTION READ ONLY / READ WRITE`: the current block's mode.
    /// Outside a block it has no effect (PostgreSQL only warns).
    fn set_transaction_read_only(&mut self, read_only: bool) -> Result<()> {
        if let Txn::Block(b) = &mut self.txn {
            if b.read_only && !read_only && b.used {
                return Err(Error::new(
                    sqlstate::ACTIVE_SQL_TRANSACTION,
                    "transaction read-write mode must be set before any query",
                ));
            }
            b.read_only = read_only;
        }
        Ok(())
    }

    pub(super) fn show(&self, name: &str) -> Result<Output> {
        let key = canonical_setting(name);
        let vars = self.vars.read();
        if key == "all" {
            let schema = Arc::new(Schema::new(vec![
                Field::new("name", DataType::Utf8, false),
                Field::new("setting", DataType::Utf8, false),
                Field::new("description", DataType::Utf8, false),
            ]));
            let batch = RecordBatch::try_new(
                schema.clone(),
                vec![
                    Arc::new(StringArray::from_iter_values(vars.settings.keys())),
                    Arc::new(StringArray::from_iter_values(vars.settings.values())),
                    Arc::new(StringArray::from_iter_values(
                        vars.settings.keys().map(|_| ""),
                    )),
                ],
            )?;
            return Ok(Output::Rows {
                schema: schema.clone(),
                stream: batches_stream(schema, vec![batch]),
                tag: "SHOW".into(),
            });
        }
        // `SHOW a.b` comes as the words `a b` (as `SHOW TIME ZONE` does)
        let dotted = key.replace(' ', ".");
        let (key, value) = match vars.settings.get(&key) {
            Some(v) => (key, v.clone()),
            None => match vars.settings.get(&dotted) {
                Some(v) => (dotted, v.clone()),
                None => {
                    return Err(Error::new(
                        sqlstate::UNDEFINED_OBJECT,
                        format!("unrecognized configuration parameter \"{dotted}\""),
                    ))
                }
            },
        };
        let schema = Arc::new(Schema::new(vec![Field::new(key, DataType::Utf8, true)]));
        let batch = RecordBatch::try_new(
            schema.clone(),
            vec![Arc::new(StringArray::from(vec![value]))],
        )?;
        Ok(Output::Rows {
            schema: schema.clone(),
            stream: batches_stream(schema, vec![batch]),
            tag: "SHOW".into(),
        })
    }

    /// `SHOW STREAMS`: a query over `sluice_streams`, tagged SHOW.
    pub(super) async fn show_streams(&mut self) -> Result<Output> {
        let stmt = statement::parse(SHOW_STREAMS)?;
        let Some(Parsed::Query(q)) = stmt.first() else {
            return Err(Error::internal(
                "SHOW STREAMS query did not parse as a query",
            ));
        };
        Ok(match Box::pin(self.query(q, &[])).await? {
            Output::Rows { schema, stream, .. } => Output::Rows {
                schema,
                stream,
                tag: "SHOW".into(),
            },
            other => other,
        })
    }
}
