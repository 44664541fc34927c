//! Session settings: defaults (what SHOW answers), SET and SHOW.
//!
//! Values are stored as SHOW reports them: a setting Sluice acts on is
//! normalized when it is set (`statement_timeout = 2000` shows `2s`, a boolean
//! `on`/`off`), and checked ([`validate_setting`]) wherever it is set.
//! `transaction_read_only` is not stored by SET: it is the current
//! transaction's mode, which `Session::sync_settings` reports.

use super::*;

/// Settings every session starts with (SHOW answers these).
pub(super) fn default_settings(limits: &crate::engine::Limits) -> BTreeMap<String, String> {
    let memory = crate::memory::format_bytes(limits.max_statement_memory);
    let timeout = crate::interrupt::format_timeout(limits.statement_timeout);
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
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect()
}

/// A boolean setting as PostgreSQL reads one.
pub(super) fn parse_bool(value: &str) -> Option<bool> {
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
        crate::memory::SETTING => {
            let bytes = statement::parse_bytes(value).map_err(|_| invalid())?;
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
            statement::parse_duration_ms(value)?;
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
        _ => {}
    }
    Ok(value.to_string())
}

impl Session {
    pub(super) fn set(&mut self, name: &str, value: &str) -> Result<()> {
        let name = canonical_setting(name);
        let value = normalize_setting(&name, value)?;
        match name.as_str() {
            "transaction_read_only" => return self.set_transaction_read_only(value == "on"),
            crate::memory::SETTING => self.check_memory_setting(&value)?,
            _ => {}
        }
        self.vars.write().settings.insert(name, value);
        Ok(())
    }

    /// A session may lower its statement memory, not raise it past the server's.
    pub(super) fn check_memory_setting(&self, value: &str) -> Result<()> {
        let max = self.engine.limits.max_statement_memory;
        if statement::parse_bytes(value)? > max as u64 {
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
        let value = vars.settings.get(&key).cloned().ok_or_else(|| {
            Error::new(
                sqlstate::UNDEFINED_OBJECT,
                format!("unrecognized configuration parameter \"{name}\""),
            )
        })?;
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
}
