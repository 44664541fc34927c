//! Pipelines on the wire: the connection loop's side of implicit
//! transactions (the session's side is `sluice_sql::session::pipeline`).
//!
//! When an Execute of a write arrives outside any block, the loop reads the
//! next message before running it ([`before_execute`]): a Sync means the
//! statement is alone and runs as before (it commits at once); anything
//! else means more of the pipeline follows, and the session opens an
//! implicit block that ends at the Sync ([`at_sync`]), so the pipeline
//! commits all or nothing.
//!
//! A stream INSERT's RETURNING in that block cannot be answered before the
//! commit. Its Execute sends nothing ([`crate::handler::PipelineSlot`]
//! records the result formats) and from then on everything the connection
//! writes is held in order by [`Held`], with a mark where the rows belong
//! ([`after_execute`]). At Sync the rows are built from what the commit
//! assigned (or with `offset` NULL if the block failed) and sent in their
//! places, then the held bytes; if the commit itself fails, its error
//! replaces everything held. A Flush while rows wait ends the block there
//! ([`at_flush`]): the client asked for the results it is owed.
//!
//! Invariants: bytes are held ([`Held`]) only between a deferred RETURNING
//! and the end of its block, in order, bounded by `max_statement_bytes`
//! (beyond it the write fails and the connection ends); one mark per
//! recorded format.

use futures::{Sink, SinkExt};
use pgwire::api::store::PortalStore;
use pgwire::api::{ClientInfo, ClientPortalStore};
use pgwire::error::{PgWireError, PgWireResult};
use pgwire::messages::extendedquery::Execute;
use pgwire::messages::{PgWireBackendMessage, PgWireFrontendMessage};
use pgwire::tokio::server::PgWireMessageServerCodec;
use sluice_sql::statement::Parsed;
use sluice_sql::Output;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio_util::codec::Framed;

use crate::errors::{error_info, user_error};
use crate::handler::{send_rows, session_of, Client, PipelineSlot, Prepared, RawAccess};
use crate::held::Held;
use crate::wire::{Reader, Refused};

/// The connection's framed socket, generic over the byte stream under it.
pub type Socket<T> = Framed<Held<T>, PgWireMessageServerCodec<std::sync::Arc<Prepared>>>;

/// What the loop learned before an Execute.
pub enum Ahead {
    /// Nothing was read.
    Nothing,
    /// The next message, to handle after the Execute.
    Next(PgWireFrontendMessage),
    /// The client left, or sent a message that ends the connection.
    Gone(Option<Refused>),
}

/// Before an Execute: if it runs a write outside any block, read the next
/// message; unless it is a Sync, open the session's implicit block.
pub async fn before_execute<T>(
    socket: &mut Socket<T>,
    reader: &mut Reader,
    execute: &Execute,
) -> PgWireResult<Ahead>
where
    T: AsyncRead + AsyncWrite + Unpin + Send + Sync + 'static,
{
    let name = execute.name.as_deref().unwrap_or(pgwire::api::DEFAULT_NAME);
    let Some(pgwire::api::store::Entry::Value(portal)) = socket.portal_store().get_portal(name)
    else {
        return Ok(Ahead::Nothing);
    };
    let parsed = &portal.statement.statement.parsed;
    // a row-limited RETURNING goes through pgwire's portal (see `handler`), which
    // cannot defer its rows: it commits alone, as before (and inside an implicit
    // block it is refused)
    if execute.max_rows > 0 && matches!(parsed, Parsed::Insert(i) if i.returning.is_some()) {
        return Ok(Ahead::Nothing);
    }
    let session = session_of(socket)?;
    if !session.lock().await.opens_implicit(parsed) {
        return Ok(Ahead::Nothing);
    }
    let next = match reader.next(socket).await {
        Ok(Some(m)) => m,
        Ok(None) => return Ok(Ahead::Gone(None)),
        Err(refused) => return Ok(Ahead::Gone(Some(refused))),
    };
    if !matches!(next, PgWireFrontendMessage::Sync(_)) {
        session.lock().await.begin_implicit();
    }
    Ok(Ahead::Next(next))
}

/// After an Execute: if it deferred its rows, hold what follows, from a
/// mark at this place.
pub async fn after_execute<C>(client: &mut C, raw: RawAccess<C>) -> PgWireResult<()>
where
    C: Client,
    PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
{
    let recorded = deferred(client);
    if recorded > raw(client).held().marks() {
        client.flush().await?;
        raw(client).held().mark();
    }
    Ok(())
}

/// At Sync (and at the end of a simple Query): end the implicit block and
/// send what it held.
pub async fn at_sync<C>(client: &mut C, raw: RawAccess<C>) -> PgWireResult<()>
where
    C: Client,
    PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
{
    // a Sync before startup finished has no session, and nothing to end
    let Ok(session) = session_of(client) else {
        return Ok(());
    };
    let mut s = session.lock().await;
    if !s.in_implicit() && raw(client).held().marks() == 0 {
        return Ok(());
    }
    let ended = s.end_implicit().await;
    let rows = s.take_returning(0).await;
    drop(s);
    // what waits in the write buffer (ParseComplete, an error) comes after the marks
    client.flush().await?;
    let formats = match client.session_extensions().get::<PipelineSlot>() {
        Some(slot) => std::mem::take(&mut *slot.0.lock().unwrap_or_else(|e| e.into_inner())),
        None => Vec::new(),
    };
    let (held, marks) = raw(client).held().release();
    let rows = match ended.and(rows) {
        Ok(rows) => rows,
        Err(e) => {
            // the block did not commit: its error in place of everything held
            client
                .send(PgWireBackendMessage::ErrorResponse(error_info(e).into()))
                .await?;
            return Ok(());
        }
    };
    let mut sent = 0;
    for ((out, to), mark) in rows.into_iter().zip(formats).zip(marks) {
        raw(client)
            .write_buffer()
            .extend_from_slice(&held[sent..mark]);
        sent = mark;
        let Output::Rows {
            schema,
            stream,
            tag,
        } = out
        else {
            return Err(user_error(sluice_sql::Error::internal(
                "a deferred RETURNING produced no rows",
            )));
        };
        Box::pin(send_rows(
            client,
            &schema,
            stream,
            &tag,
            &to.format,
            to.ctx,
            None,
            to.describe,
        ))
        .await?;
    }
    raw(client).write_buffer().extend_from_slice(&held[sent..]);
    client.flush().await?;
    Ok(())
}

/// At Flush: rows waiting for the commit are owed now, so the implicit
/// block ends here.
pub async fn at_flush<C>(client: &mut C, raw: RawAccess<C>) -> PgWireResult<()>
where
    C: Client,
    PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
{
    if raw(client).held().marks() == 0 {
        return Ok(());
    }
    at_sync(client, raw).await
}

/// How many RETURNINGs this pipeline has deferred.
fn deferred<C: ClientInfo>(client: &C) -> usize {
    client
        .session_extensions()
        .get::<PipelineSlot>()
        .map(|slot| slot.0.lock().map(|g| g.len()).unwrap_or(0))
        .unwrap_or(0)
}
