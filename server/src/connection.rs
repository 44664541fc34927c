//! One client connection: pgwire's message handling, plus asynchronous
//! notifications.
//!
//! pgwire's own `process_socket` only ever waits on the socket, so a
//! notification could reach an idle client only after its next query.
//! This loop waits on both the socket and the session's notification queue
//! and sends a NotificationResponse as soon as the connection is idle
//! (ready for a query, outside a transaction block — as PostgreSQL
//! delivers them). The queue is bounded (see `sluice_sql::notify`).
//! Messages are read through [`crate::wire::Reader`], which bounds and
//! checks them before pgwire decodes them.
//!
//! Admission (see [`crate::admission`]) is enforced here: the connection holds its
//! [`Ticket`] until it ends; one over the limit answers a cancel request and refuses a login
//! with `53300`; startup and authentication must finish by the ticket's deadline; the answer to
//! a wrong password waits out the client address's [`crate::auth_delay`].
//!
//! Each request's time in the server — from its first message read (a Query, or the Parse
//! or Bind that starts an extended-protocol exchange) to the ReadyForQuery that ends it
//! written — goes to [`crate::metrics::REQUESTS`].

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;

use futures::SinkExt;
use pgwire::api::{ClientInfo, PgWireConnectionState};
use pgwire::error::{ErrorInfo, PgWireError};
use pgwire::messages::response::{NotificationResponse, TransactionStatus};
use pgwire::messages::{PgWireBackendMessage, PgWireFrontendMessage};
use pgwire::tokio::server::{
    negotiate_tls, process_error, process_message, MaybeTls, PgWireMessageServerCodec,
};
use sluice_sql::error::sqlstate;
use sluice_sql::notify::Notification;
use tokio::net::TcpStream;
use tokio::sync::mpsc;
use tokio_util::codec::{Framed, FramedParts};

use crate::admission::{self, Ticket};
use crate::auth::ConnectionTls;
use crate::handler::{Backend, EndImplicit, Prepared, RawAccess, RawOut, SessionSlot};
use crate::held::Held;
use crate::panics;
use crate::pipeline::{self, Ahead};
use crate::tls;
use crate::wire::{Reader, Refused};

/// A client's socket with pgwire's codec, able to hold a pipeline's output (see
/// [`crate::pipeline`]).
type Socket = pipeline::Socket<MaybeTls>;

/// What a message may hold beyond `max_statement_bytes` (Bind's and Parse's other fields).
const MESSAGE_HEADROOM: usize = 1 << 20;

pub async fn serve(
    tcp: TcpStream,
    peer: SocketAddr,
    backend: Arc<Backend>,
    ticket: Ticket,
) -> io::Result<()> {
    let deadline = ticket.deadline();
    let negotiated = tokio::time::timeout_at(
        deadline,
        negotiate_tls::<Arc<Prepared>>(tcp, backend.auth.tls_acceptor()),
    )
    .await;
    let socket = match negotiated {
        Ok(Ok(Some(socket))) => socket,
        Ok(Err(e)) => {
            tracing::debug!(%peer, "TLS negotiation failed: {e}");
            return Ok(());
        }
        Ok(Ok(None)) => return Ok(()),
        Err(_) => {
            ticket.log_timeout(peer);
            return Ok(());
        }
    };

    let ssl = tls::info(socket.get_ref());
    socket.session_extensions().insert(ConnectionTls(ssl));
    let mut socket = held(socket, backend.engine.limits.max_statement_bytes);

    let mut notifications: Option<mpsc::Receiver<Notification>> = None;
    let mut started = false;
    let mut reader = Reader::new(backend.engine.limits.max_statement_bytes + MESSAGE_HEADROOM);
    // a message read ahead of an Execute (see `pipeline::before_execute`)
    let mut ahead: Option<PgWireFrontendMessage> = None;
    // when the request under way had its first message read
    let mut request_started: Option<std::time::Instant> = None;

    loop {
        let in_startup = matches!(
            socket.state(),
            PgWireConnectionState::AwaitingStartup
                | PgWireConnectionState::AuthenticationInProgress
        );
        if !started && !in_startup {
            started = true;
            if let Some(slot) = socket.session_extensions().get::<SessionSlot>() {
                notifications = slot.0.lock().await.take_notifications();
            }
        }
        let idle = matches!(socket.state(), PgWireConnectionState::ReadyForQuery)
            && matches!(socket.transaction_status(), TransactionStatus::Idle);
        let msg = if let Some(m) = ahead.take() {
            Ok(Some(m))
        } else {
            tokio::select! {
            m = reader.next(&mut socket) => m,
            n = next_notification(&mut notifications), if idle && notifications.is_some() => {
                match n {
                    Some(n) => {
                        socket
                            .send(PgWireBackendMessage::NotificationResponse(NotificationResponse::new(n.pid, n.channel, n.payload)))
                            .await?;
                    }
                    None => notifications = None,
                }
                continue;
            }
            _ = tokio::time::sleep_until(deadline), if in_startup => {
                ticket.log_timeout(peer);
                return Ok(());
            }
            }
        };
        let msg = match msg {
            Ok(Some(msg)) => msg,
            Ok(None) => break,
            Err(Refused(info)) => {
                tracing::debug!(code = %info.code, "refusing a client message: {}", info.message);
                socket
                    .send(PgWireBackendMessage::ErrorResponse((*info).into()))
                    .await?;
                break;
            }
        };
        if matches!(msg, PgWireFrontendMessage::Terminate(_)) {
            break;
        }
        if !in_startup && request_started.is_none() {
            request_started = Some(std::time::Instant::now());
        }
        // what ends a request with a ReadyForQuery (COPY FROM's Query ends at its CopyDone)
        let ends_request = matches!(
            msg,
            PgWireFrontendMessage::Query(_)
                | PgWireFrontendMessage::Sync(_)
                | PgWireFrontendMessage::CopyDone(_)
                | PgWireFrontendMessage::CopyFail(_)
        );
        if ticket.over_limit() && !matches!(msg, PgWireFrontendMessage::CancelRequest(_)) {
            socket
                .send(PgWireBackendMessage::ErrorResponse(
                    admission::too_many().into(),
                ))
                .await?;
            break;
        }
        if let PgWireFrontendMessage::Startup(startup) = &msg {
            panics::test_trigger(
                startup
                    .parameters
                    .get("application_name")
                    .map(String::as_str),
            );
        }
        let password = matches!(msg, PgWireFrontendMessage::PasswordMessageFamily(_));
        let is_extended = match socket.state() {
            PgWireConnectionState::CopyInProgress(extended) => extended,
            _ => msg.is_extended_query(),
        };
        // Query and Execute (in the states where pgwire would hand them to the query
        // handlers) are served here, where the socket's type is known, so COPY TO data
        // can go to it whole; every other message goes through pgwire.
        let serving = matches!(
            socket.state(),
            PgWireConnectionState::ReadyForQuery | PgWireConnectionState::QueryInProgress
        );
        let result = match msg {
            PgWireFrontendMessage::Query(q) if serving => {
                let end = Some(end_implicit as EndImplicit<Socket>);
                backend
                    .simple_query(&mut socket, q, Some(raw_out), end)
                    .await
            }
            PgWireFrontendMessage::Execute(e) if serving => {
                match pipeline::before_execute(&mut socket, &mut reader, &e).await {
                    Ok(Ahead::Next(next)) => ahead = Some(next),
                    Ok(Ahead::Nothing) => {}
                    Ok(Ahead::Gone(None)) => break,
                    Ok(Ahead::Gone(Some(Refused(info)))) => {
                        socket
                            .send(PgWireBackendMessage::ErrorResponse((*info).into()))
                            .await?;
                        break;
                    }
                    Err(e) => return Err(io::Error::other(e.to_string())),
                }
                let r = backend.execute(&mut socket, e, Some(raw_out)).await;
                match pipeline::after_execute(&mut socket, raw_out).await {
                    Ok(()) => r,
                    Err(e) => Err(e),
                }
            }
            msg @ (PgWireFrontendMessage::Sync(_) | PgWireFrontendMessage::Flush(_)) => {
                let ended = match &msg {
                    PgWireFrontendMessage::Sync(_) => pipeline::at_sync(&mut socket, raw_out).await,
                    _ => pipeline::at_flush(&mut socket, raw_out).await,
                };
                match ended {
                    Ok(()) => process(msg, &mut socket, &backend).await,
                    Err(e) => Err(e),
                }
            }
            msg => process(msg, &mut socket, &backend).await,
        };
        if password {
            match &result {
                Err(PgWireError::UserError(info)) if info.code == sqlstate::INVALID_PASSWORD => {
                    let delay = ticket.auth_delay().failed(peer.ip());
                    let until = deadline.min(tokio::time::Instant::now() + delay);
                    tokio::time::sleep_until(until).await;
                }
                // a SCRAM exchange's first message succeeds too: only a finished login counts
                Ok(()) if matches!(socket.state(), PgWireConnectionState::ReadyForQuery) => {
                    ticket.auth_delay().succeeded(peer.ip())
                }
                Ok(()) => {}
                Err(_) => {}
            }
        }
        if let Err(e) = result {
            // an error anywhere in a pipeline (Parse, Bind, the wire layer) aborts its
            // implicit transaction, as one in a statement does
            if let Some(slot) = socket.session_extensions().get::<SessionSlot>() {
                let mut s = slot.0.lock().await;
                if s.in_implicit() {
                    s.abort_block();
                }
            }
            let info: ErrorInfo = e.into();
            if info.is_fatal() {
                // as PostgreSQL: the error, then the connection ends (pgwire's process_error
                // would also send ReadyForQuery and leave this loop reading)
                socket
                    .send(PgWireBackendMessage::ErrorResponse(info.into()))
                    .await?;
                break;
            }
            process_error(
                &mut socket,
                PgWireError::UserError(Box::new(info)),
                is_extended,
            )
            .await?;
        }
        if ends_request && matches!(socket.state(), PgWireConnectionState::ReadyForQuery) {
            if let Some(started) = request_started.take() {
                crate::metrics::REQUESTS.observe(started.elapsed().as_micros() as u64);
            }
        }
    }
    Ok(())
}

/// pgwire's handling of one message.
async fn process(
    msg: PgWireFrontendMessage,
    socket: &mut Socket,
    backend: &Arc<Backend>,
) -> Result<(), PgWireError> {
    process_message(
        msg,
        socket,
        backend.clone(),
        backend.clone(),
        backend.clone(),
        backend.clone(),
        backend.clone(),
    )
    .await
}

/// The negotiated socket over a [`Held`] byte stream.
fn held(socket: Framed<MaybeTls, PgWireMessageServerCodec<Arc<Prepared>>>, limit: usize) -> Socket {
    let parts = socket.into_parts();
    let mut held = FramedParts::new(Held::new(parts.io, limit), parts.codec);
    held.read_buf = parts.read_buf;
    held.write_buf = parts.write_buf;
    Framed::from_parts(held)
}

fn end_implicit(
    socket: &mut Socket,
    raw: RawAccess<Socket>,
) -> futures::future::BoxFuture<'_, Result<(), PgWireError>> {
    Box::pin(pipeline::at_sync(socket, raw))
}

fn raw_out(socket: &mut Socket) -> &mut dyn RawOut {
    socket
}

async fn next_notification(rx: &mut Option<mpsc::Receiver<Notification>>) -> Option<Notification> {
    match rx.as_mut() {
        Some(r) => r.recv().await,
        None => futures::future::pending().await,
    }
}
