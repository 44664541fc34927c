//! How errors reach the client. A statement's error ([`sluice_sql::Error`])
//! becomes an ErrorResponse of severity `ERROR` carrying its SQLSTATE,
//! message and detail unchanged: the sql layer chose them, this layer does
//! not reinterpret them. An error that ends the connection (startup,
//! authentication, a broken protocol) is `FATAL`.

use pgwire::error::{ErrorInfo, PgWireError};

/// An error of one statement: an ErrorResponse with the SQLSTATE the sql layer chose.
pub fn user_error(e: sluice_sql::Error) -> PgWireError {
    PgWireError::UserError(Box::new(error_info(e)))
}

pub(crate) fn error_info(e: sluice_sql::Error) -> ErrorInfo {
    let mut info = ErrorInfo::new("ERROR".to_string(), e.code.to_string(), e.message);
    info.detail = e.detail;
    info
}

/// An error that ends the connection (`FATAL`).
pub(crate) fn fatal(code: &str, message: &str) -> PgWireError {
    PgWireError::UserError(Box::new(ErrorInfo::new(
        "FATAL".into(),
        code.into(),
        message.into(),
    )))
}
