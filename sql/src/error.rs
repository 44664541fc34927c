//! The one error type of the SQL layer.
//!
//! Every error carries the PostgreSQL SQLSTATE a client should see; the
//! server turns it into an ErrorResponse without further interpretation.
//! Errors are classified as deterministic (bad input: report it and carry
//! on) or not (disk, consensus: the write path may be unusable).

use std::fmt;

/// SQLSTATE codes used by Sluice (PostgreSQL's own codes).
pub mod sqlstate {
    pub const SYNTAX_ERROR: &str = "42601";
    pub const UNDEFINED_TABLE: &str = "42P01";
    pub const UNDEFINED_COLUMN: &str = "42703";
    pub const DUPLICATE_TABLE: &str = "42P07";
    pub const DUPLICATE_COLUMN: &str = "42701";
    pub const TOO_MANY_COLUMNS: &str = "54011";
    pub const UNDEFINED_OBJECT: &str = "42704";
    pub const UNDEFINED_FUNCTION: &str = "42883";
    pub const INVALID_SCHEMA_NAME: &str = "3F000";
    pub const DATATYPE_MISMATCH: &str = "42804";
    pub const INVALID_TEXT_REPRESENTATION: &str = "22P02";
    pub const NUMERIC_VALUE_OUT_OF_RANGE: &str = "22003";
    pub const STRING_DATA_RIGHT_TRUNCATION: &str = "22001";
    pub const DATETIME_FIELD_OVERFLOW: &str = "22008";
    pub const DIVISION_BY_ZERO: &str = "22012";
    pub const DATA_EXCEPTION: &str = "22000";
    pub const NOT_NULL_VIOLATION: &str = "23502";
    pub const UNIQUE_VIOLATION: &str = "23505";
    pub const CARDINALITY_VIOLATION: &str = "21000";
    pub const INVALID_COLUMN_REFERENCE: &str = "42P10";
    pub const RESERVED_NAME: &str = "42939";
    pub const WRONG_OBJECT_TYPE: &str = "42809";
    pub const INSUFFICIENT_PRIVILEGE: &str = "42501";
    pub const FEATURE_NOT_SUPPORTED: &str = "0A000";
    pub const IN_FAILED_TRANSACTION: &str = "25P02";
    pub const ACTIVE_SQL_TRANSACTION: &str = "25001";
    pub const NO_ACTIVE_SQL_TRANSACTION: &str = "25P01";
    pub const READ_ONLY_SQL_TRANSACTION: &str = "25006";
    pub const INVALID_SAVEPOINT: &str = "3B001";
    pub const INVALID_CURSOR_NAME: &str = "34000";
    pub const INVALID_PARAMETER_VALUE: &str = "22023";
    pub const PROTOCOL_VIOLATION: &str = "08P01";
    pub const SERIALIZATION_FAILURE: &str = "40001";
    pub const STATEMENT_COMPLETION_UNKNOWN: &str = "40003";
    pub const PROGRAM_LIMIT_EXCEEDED: &str = "54000";
    pub const STATEMENT_TOO_COMPLEX: &str = "54001";
    pub const QUERY_CANCELED: &str = "57014";
    pub const ADMIN_SHUTDOWN: &str = "57P01";
    pub const CANNOT_CONNECT_NOW: &str = "57P03";
    pub const OBJECT_NOT_IN_PREREQUISITE_STATE: &str = "55000";
    pub const DUPLICATE_OBJECT: &str = "42710";
    pub const DEPENDENT_OBJECTS_STILL_EXIST: &str = "2BP01";
    pub const INVALID_GRANT_OPERATION: &str = "0LP01";
    pub const IO_ERROR: &str = "58030";
    pub const INTERNAL_ERROR: &str = "XX000";
    pub const INSUFFICIENT_RESOURCES: &str = "53000";
    pub const DISK_FULL: &str = "53100";
    pub const OUT_OF_MEMORY: &str = "53200";
    pub const INVALID_ARGUMENT_FOR_LOG: &str = "2201E";
    pub const INVALID_ARGUMENT_FOR_POWER: &str = "2201F";
    pub const INVALID_SQL_STATEMENT_NAME: &str = "26000";
    pub const DUPLICATE_PREPARED_STATEMENT: &str = "42P05";
    pub const UNDEFINED_PARAMETER: &str = "42704";
    pub const UNDEFINED_PARAMETER_REFERENCE: &str = "42P02";
    pub const CANT_CHANGE_RUNTIME_PARAM: &str = "55P02";
    pub const INVALID_TABLE_DEFINITION: &str = "42P16";
    pub const INVALID_OBJECT_DEFINITION: &str = "42P17";
    pub const DUPLICATE_CURSOR: &str = "42P03";
    pub const GENERATED_ALWAYS: &str = "428C9";
    pub const CHARACTER_NOT_IN_REPERTOIRE: &str = "22021";
    pub const TOO_MANY_CONNECTIONS: &str = "53300";
    pub const INVALID_PASSWORD: &str = "28P01";
    pub const INVALID_AUTHORIZATION_SPECIFICATION: &str = "28000";
}

/// An error with the SQLSTATE the client will see.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Error {
    pub code: &'static str,
    pub message: String,
    /// Optional DETAIL line.
    pub detail: Option<String>,
}

pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    pub fn new(code: &'static str, message: impl Into<String>) -> Self {
        Error {
            code,
            message: message.into(),
            detail: None,
        }
    }

    pub fn with_detail(mut self, detail: impl Into<String>) -> Self {
        self.detail = Some(detail.into());
        self
    }

    pub fn syntax(message: impl Into<String>) -> Self {
        Self::new(sqlstate::SYNTAX_ERROR, message)
    }

    pub fn unsupported(message: impl Into<String>) -> Self {
        Self::new(sqlstate::FEATURE_NOT_SUPPORTED, message)
    }

    pub fn undefined_table(name: &str) -> Self {
        Self::new(
            sqlstate::UNDEFINED_TABLE,
            format!("relation \"{name}\" does not exist"),
        )
    }

    pub fn invalid_text(type_name: &str, value: &str) -> Self {
        Self::new(
            sqlstate::INVALID_TEXT_REPRESENTATION,
            format!("invalid input syntax for type {type_name}: \"{value}\""),
        )
    }

    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(sqlstate::INTERNAL_ERROR, message)
    }

    pub fn io(message: impl Into<String>) -> Self {
        Self::new(sqlstate::IO_ERROR, message)
    }

    /// Bad input that will fail the same way every time; everything else
    /// (I/O, consensus, internal) is not.
    pub fn is_deterministic(&self) -> bool {
        !matches!(
            self.code,
            sqlstate::IO_ERROR
                | sqlstate::INTERNAL_ERROR
                | sqlstate::STATEMENT_COMPLETION_UNKNOWN
                | sqlstate::ADMIN_SHUTDOWN
                | sqlstate::SERIALIZATION_FAILURE
        )
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.message)
    }
}

impl std::error::Error for Error {}

impl From<sluice_storage::Error> for Error {
    fn from(e: sluice_storage::Error) -> Self {
        match e {
            sluice_storage::Error::OffsetTruncated { .. } => {
                Error::new(sqlstate::INVALID_PARAMETER_VALUE, e.to_string())
            }
            other => Error::io(other.to_string()),
        }
    }
}

impl From<arrow::error::ArrowError> for Error {
    fn from(e: arrow::error::ArrowError) -> Self {
        classify_message(&e.to_string())
    }
}

impl From<datafusion::error::DataFusionError> for Error {
    fn from(e: datafusion::error::DataFusionError) -> Self {
        use datafusion::error::DataFusionError as D;
        match e {
            D::SQL(err, _) => Error::syntax(err.to_string()),
            D::Context(_, inner) => Error::from(*inner),
            D::Shared(inner) => {
                ours(&inner).unwrap_or_else(|| classify_message(&inner.to_string()))
            }
            D::External(inner) => match inner.downcast::<Error>() {
                Ok(ours) => *ours,
                Err(other) => classify_message(&other.to_string()),
            },
            D::ArrowError(inner, _) => Error::from(*inner),
            D::NotImplemented(msg) => Error::unsupported(msg),
            D::Plan(msg) => classify_message(&msg),
            D::SchemaError(inner, _) => classify_message(&inner.to_string()),
            D::Execution(msg) => classify_message(&msg),
            D::ResourcesExhausted(msg) => resources_exhausted(&msg),
            other => classify_message(&other.to_string()),
        }
    }
}

/// Our own error inside a DataFusion error shared between partitions (or given context).
fn ours(e: &datafusion::error::DataFusionError) -> Option<Error> {
    use datafusion::error::DataFusionError as D;
    match e {
        D::External(inner) => inner.downcast_ref::<Error>().cloned(),
        D::Shared(inner) => ours(inner),
        D::Context(_, inner) => ours(inner),
        D::ResourcesExhausted(msg) => Some(resources_exhausted(msg)),
        _ => None,
    }
}

/// How a statement memory pool's refusals start ([`crate::memory`] and
/// [`crate::value_size`] write them; `resources_exhausted` recognizes them by it).
pub const OUT_OF_MEMORY_MESSAGE: &str = "out of memory";

/// A memory pool's refusal (`53200`, see `crate::memory`) or the spill space's (`53100`).
fn resources_exhausted(msg: &str) -> Error {
    let msg = msg.trim_start_matches("Resources exhausted: ");
    if msg.starts_with(OUT_OF_MEMORY_MESSAGE) {
        Error::new(sqlstate::OUT_OF_MEMORY, msg)
    } else if msg.contains("disk space") {
        Error::new(sqlstate::DISK_FULL, msg)
    } else {
        Error::new(sqlstate::OUT_OF_MEMORY, format!("out of memory: {msg}"))
    }
}

/// Arrow's refusal to cast a number into a too-small integer type ("Can't cast value
/// 2147483648 to type Int32"), as PostgreSQL's type name for `22003 integer out of range`.
fn integer_cast_overflow(lower: &str) -> Option<&'static str> {
    let rest = lower.split("can't cast value ").nth(1)?;
    let (value, ty) = rest.split_once(" to type ")?;
    value.trim().parse::<f64>().ok()?;
    match ty.trim().trim_end_matches('.') {
        "int16" => Some("smallint"),
        "int32" => Some("integer"),
        "int64" => Some("bigint"),
        _ => None,
    }
}

/// DataFusion and Arrow report most failures as strings; pick the SQLSTATE a
/// PostgreSQL user would get for the same mistake.
fn classify_message(msg: &str) -> Error {
    let lower = msg.to_ascii_lowercase();
    if let Some(at) = lower.find("resources exhausted: ") {
        return resources_exhausted(&msg[at..]);
    }
    if let Some(ty) = integer_cast_overflow(&lower) {
        return Error::new(
            sqlstate::NUMERIC_VALUE_OUT_OF_RANGE,
            format!("{ty} out of range"),
        );
    }
    for pg in [
        "zero raised to a negative power is undefined",
        "cannot take square root of a negative number",
    ] {
        if lower.contains(pg) {
            return Error::new(sqlstate::INVALID_ARGUMENT_FOR_POWER, pg);
        }
    }
    let code = if lower.contains("table '") && lower.contains("not found")
        || lower.contains("table not found")
    {
        sqlstate::UNDEFINED_TABLE
    } else if lower.contains("no field named")
        || lower.contains("column") && lower.contains("not found")
        || lower.contains("field not found")
    {
        sqlstate::UNDEFINED_COLUMN
    } else if lower.contains("divide by zero") || lower.contains("division by zero") {
        sqlstate::DIVISION_BY_ZERO
    } else if lower.contains("cannot cast")
        || lower.contains("cast error")
        || lower.contains("can't parse")
        || lower.contains("cannot parse")
        || lower.contains("error parsing")
        || lower.contains("invalid digit")
        || lower.contains("parser error")
    {
        sqlstate::INVALID_TEXT_REPRESENTATION
    } else if lower.contains("overflow") || lower.contains("out of range") {
        sqlstate::NUMERIC_VALUE_OUT_OF_RANGE
    } else if lower.contains("unary operator") && lower.contains("only supports") {
        // `- 'abc'::text`: PostgreSQL has no such operator
        sqlstate::UNDEFINED_FUNCTION
    } else if lower.contains("invalid function")
        || lower.contains("function") && lower.contains("not found")
    {
        sqlstate::UNDEFINED_FUNCTION
    } else if lower.contains("sql error")
        || lower.contains("parsererror")
        || lower.contains("expected")
    {
        sqlstate::SYNTAX_ERROR
    } else if lower.contains("not supported")
        || lower.contains("unsupported")
        || lower.contains("not implemented")
    {
        sqlstate::FEATURE_NOT_SUPPORTED
    } else if lower.contains("cannot be cast")
        || lower.contains("type mismatch")
        || lower.contains("does not match")
        || lower.contains("cannot coerce")
        || lower.contains("no function matches")
        || lower.contains("failed to coerce")
    {
        sqlstate::DATATYPE_MISMATCH
    } else {
        sqlstate::DATA_EXCEPTION
    };
    let text = strip_df_prefix(msg);
    let pg_text = match code {
        sqlstate::UNDEFINED_COLUMN => {
            quoted_after(&text, "No field named ").map(|c| format!("column \"{c}\" does not exist"))
        }
        sqlstate::UNDEFINED_TABLE => quoted_after(&text, "table '").map(|t| {
            format!(
                "relation \"{}\" does not exist",
                t.rsplit('.').next().unwrap_or(&t)
            )
        }),
        _ => None,
    };
    Error::new(code, pg_text.unwrap_or(text))
}

/// The identifier that follows `marker` in a DataFusion message
/// (`No field named x.` / `table 'a.b.c' not found`).
fn quoted_after(text: &str, marker: &str) -> Option<String> {
    let rest = &text[text.find(marker)? + marker.len()..];
    let name = if let Some(q) = rest.strip_prefix('"') {
        &q[..q.find('"')?]
    } else {
        let end = rest
            .find(|c: char| c == '\'' || c == ',' || c.is_whitespace())
            .unwrap_or(rest.len());
        rest[..end].trim_end_matches('.')
    };
    let name = name.rsplit('.').next().unwrap_or(name).trim_matches('"');
    (!name.is_empty()).then(|| name.to_string())
}

fn strip_df_prefix(msg: &str) -> String {
    let mut m = msg;
    for prefix in [
        "Error during planning: ",
        "Execution error: ",
        "Arrow error: ",
        "Schema error: ",
        "Cast error: ",
        "Parser error: ",
        "Invalid argument error: ",
        "Compute error: ",
    ] {
        while let Some(rest) = m.strip_prefix(prefix) {
            m = rest;
        }
    }
    m.trim().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classifies_common_datafusion_failures() {
        let e = classify_message("Error during planning: table 'datafusion.public.nope' not found");
        assert_eq!(e.code, sqlstate::UNDEFINED_TABLE);
        let e = classify_message("Schema error: No field named zz. Valid fields are a.");
        assert_eq!(e.code, sqlstate::UNDEFINED_COLUMN);
        assert_eq!(e.message, "column \"zz\" does not exist");
        let e = classify_message("Schema error: No field named \"no_such\".\nValid fields are a.");
        assert_eq!(e.message, "column \"no_such\" does not exist");
        let e = classify_message("Error during planning: table 'sluice.public.nope' not found");
        assert_eq!(e.message, "relation \"nope\" does not exist");
        let e = classify_message(
            "Arrow error: Cast error: Cannot cast string 'x' to value of Int32 type",
        );
        assert_eq!(e.code, sqlstate::INVALID_TEXT_REPRESENTATION);
        assert_eq!(e.message, "Cannot cast string 'x' to value of Int32 type");
    }
}
