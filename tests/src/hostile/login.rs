//! Logging in while the server is under attack: tokio-postgres sessions (with startup
//! options) and raw [`Wire`] logins. Both are bounded by [`LOGIN_TIMEOUT`], a hang guard —
//! a slow login is the server's latency to report, not a failure — and neither panics: a
//! refused or broken login is an `Err` saying what happened.

use std::time::Duration;

use tokio::io::AsyncWriteExt;
use tokio_postgres::{Client, NoTls};

use super::tally::error_key;
use crate::wire::{error_code, startup, Read, Wire};

/// The longest a login may take before it counts as failed.
pub const LOGIN_TIMEOUT: Duration = Duration::from_secs(60);

/// A session as user `sluice`, with `options` (e.g. `-c statement_timeout=5000ms`) if any;
/// its connection task runs on the current runtime.
pub async fn session(port: u16, options: Option<&str>) -> Result<Client, String> {
    let mut conn = format!(
        "host=127.0.0.1 port={port} user=sluice dbname=sluice connect_timeout={}",
        LOGIN_TIMEOUT.as_secs()
    );
    if let Some(o) = options {
        conn.push_str(&format!(" options='{o}'"));
    }
    let (client, connection) =
        tokio::time::timeout(LOGIN_TIMEOUT, tokio_postgres::connect(&conn, NoTls))
            .await
            .map_err(|_| format!("login: no answer within {LOGIN_TIMEOUT:?}"))?
            .map_err(|e| format!("login: {}", error_key(&e)))?;
    tokio::spawn(async move {
        let _ = connection.await;
    });
    Ok(client)
}

/// A socket, not logged in.
pub async fn open(port: u16) -> Result<Wire, String> {
    // Wire::open panics when the connect fails: its own task contains that.
    let mut task = tokio::spawn(Wire::open(port));
    match tokio::time::timeout(LOGIN_TIMEOUT, &mut task).await {
        Ok(Ok(wire)) => Ok(wire),
        Ok(Err(_)) => Err("connect failed".into()),
        Err(_) => {
            task.abort();
            Err(format!("connect: no answer within {LOGIN_TIMEOUT:?}"))
        }
    }
}

/// A raw connection that has completed startup (ReadyForQuery received).
pub async fn raw(port: u16) -> Result<Wire, String> {
    let mut wire = open(port).await?;
    wire.socket
        .write_all(&startup())
        .await
        .map_err(|e| format!("login: send: {}", e.kind()))?;
    loop {
        match wire.read_message(LOGIN_TIMEOUT).await {
            Read::Message(b'Z', _) => return Ok(wire),
            Read::Message(b'E', body) => {
                return Err(format!("login refused: {}", error_code(&body)))
            }
            Read::Message(..) => {}
            Read::Quiet => return Err(format!("login: no answer within {LOGIN_TIMEOUT:?}")),
            Read::Closed => return Err("login: connection closed".into()),
        }
    }
}
