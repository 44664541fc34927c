//! SET and SHOW in a session: the statements over the session's
//! [`SessionVars`](crate::settings::SessionVars), with the checks only a
//! session can make (its transaction's mode, the server's memory limit).
//! What a setting accepts is [`crate::settings`]'s.

use super::*;

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
