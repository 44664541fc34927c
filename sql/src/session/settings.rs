//! Session settings: defaults (what SHOW answers), SET and SHOW.

use super::*;

/// Settings every session starts with (SHOW answers these).
pub(super) fn default_settings() -> BTreeMap<String, String> {
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
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect()
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
    Ok(())
}

impl Session {
    pub(super) fn set(&mut self, name: &str, value: &str) -> Result<()> {
        let name = canonical_setting(name);
        validate_setting(&name, value)?;
        self.vars.write().settings.insert(name, value.to_string());
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
