//! The pgwire handlers: startup and authentication, simple and extended
//! query, COPY, cancel.
//!
//! Each connection owns one [`Session`] (in its pgwire session extensions),
//! created when authentication succeeds; every handler locks it for the
//! duration of one statement. Results stream: a query's record batches are
//! encoded to DataRows as the client reads them, never collected whole.
//!
//! A running statement stops on cancel and `statement_timeout` (the session
//! watches both, see `sluice_sql::interrupt`) and, when the connection loop
//! gives access to the socket ([`RawAccess`]), when the client closes the
//! connection: while a statement plans or its rows are awaited, the socket is
//! read too (`closed`), what a client pipelines meanwhile is kept in the
//! read buffer for later (up to `READ_AHEAD` bytes), and end of stream ends
//! the statement — its plan is dropped and its tasks aborted.

use std::collections::HashMap;
use std::fmt::Debug;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::Poll;

use async_trait::async_trait;
use bytes::BytesMut;
use futures::{Sink, SinkExt, StreamExt};
use pgwire::api::auth::{
    finish_authentication, protocol_negotiation, save_startup_parameters_to_metadata,
};
use pgwire::api::auth::{ServerParameterProvider, StartupHandler};
use pgwire::api::cancel::CancelHandler;
use pgwire::api::copy::CopyHandler;
use pgwire::api::portal::{Format, Portal};
use pgwire::api::query::{ExtendedQueryHandler, SimpleQueryHandler};
use pgwire::api::results::{CopyResponse, FieldFormat, FieldInfo, QueryResponse, Response, Tag};
use pgwire::api::stmt::{QueryParser, StoredStatement};
use pgwire::api::store::{Entry, PortalStore};
use pgwire::api::{
    ClientInfo, ClientPortalStore, ConnectionHandle, ConnectionManager, PgWireConnectionState,
    PidSecretKeyGenerator, RandomPidSecretKeyGenerator, Type, METADATA_USER,
};
use pgwire::error::{ErrorInfo, PgWireError, PgWireResult};
use pgwire::messages::cancel::CancelRequest;
use pgwire::messages::copy::{CopyData, CopyDone, CopyFail};
use pgwire::messages::extendedquery::{
    BindComplete, CloseComplete, Execute, ParseComplete, PortalSuspended, TARGET_TYPE_BYTE_PORTAL,
    TARGET_TYPE_BYTE_STATEMENT,
};
use pgwire::messages::response::CommandComplete;
use pgwire::messages::startup::{Authentication, PasswordMessageFamily};
use pgwire::messages::{PgWireBackendMessage, PgWireFrontendMessage};
use sluice_sql::error::sqlstate;
use sluice_sql::session::Description;
use sluice_sql::statement::{self, Parsed};
use sluice_sql::{CopyIn, Engine, Output, Session};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite};
use tokio::sync::{watch, Mutex};
use tokio_util::codec::Framed;

use crate::auth::{self, Auth, ConnectionTls, ScramSlot};
use crate::copy_out::CopyOut;
use crate::encode::{field_infos, pg_type, OutputContext, RowEncoder};
use crate::errors::{error_info, fatal, user_error};
use crate::params;

/// pid -> (secret key, the session's cancel signal).
type CancelMap = Arc<std::sync::Mutex<HashMap<i32, (bytes::Bytes, watch::Sender<u64>)>>>;

/// Server-wide state shared by every connection's handlers.
pub struct Backend {
    pub engine: Arc<Engine>,
    pub connections: Arc<ConnectionManager>,
    pub auth: Auth,
    pub max_connections: usize,
    active: Arc<AtomicUsize>,
    pids: RandomPidSecretKeyGenerator,
    /// pid -> (secret key, cancel signal of the session).
    cancels: CancelMap,
}

impl Backend {
    pub fn new(engine: Arc<Engine>, auth: Auth, max_connections: usize) -> Arc<Backend> {
        Arc::new(Backend {
            engine,
            connections: Arc::new(ConnectionManager::new()),
            auth,
            max_connections,
            active: Arc::new(AtomicUsize::new(0)),
            pids: RandomPidSecretKeyGenerator::default(),
            cancels: Arc::new(std::sync::Mutex::new(HashMap::new())),
        })
    }
}

/// The connection's session, in the pgwire session extensions.
pub struct SessionSlot(pub Arc<Mutex<Session>>);

/// Unregisters the connection's cancel signal when the connection ends.
struct CancelRegistration {
    pid: i32,
    map: CancelMap,
}

impl Drop for CancelRegistration {
    fn drop(&mut self) {
        if let Ok(mut m) = self.map.lock() {
            m.remove(&self.pid);
        }
    }
}

/// A COPY FROM in progress: the target and the data received so far.
#[derive(Default)]
struct CopySlot(std::sync::Mutex<Option<CopyIn>>);

/// How to send each deferred RETURNING of the pipeline, in order (see
/// `pipeline.rs`, which reads it at the pipeline's end).
#[derive(Default)]
pub struct PipelineSlot(pub std::sync::Mutex<Vec<DeferredRows>>);

/// How a deferred RETURNING's rows go out.
pub struct DeferredRows {
    pub format: Format,
    pub ctx: OutputContext,
    /// With a RowDescription first (the simple protocol).
    pub describe: bool,
}

/// Record how the rows of a deferred RETURNING go out.
fn record_deferred<C: ClientInfo>(client: &C, rows: DeferredRows) {
    if let Some(slot) = client.session_extensions().get::<PipelineSlot>() {
        slot.0.lock().unwrap_or_else(|e| e.into_inner()).push(rows);
    }
}

/// Decrements the active-connection count when the connection ends.
struct ConnectionCount(Arc<AtomicUsize>);

impl Drop for ConnectionCount {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A client connection as the statement functions drive it: pgwire's client
/// state and portal store, a sink of backend messages. (Bounds on other types —
/// `PgWireError: From<C::Error>` — are not implied by a trait, so each function
/// still states that one.)
pub trait Client:
    ClientInfo
    + ClientPortalStore<PortalStore: PortalStore>
    + Sink<PgWireBackendMessage, Error: Debug>
    + Unpin
    + Send
    + Sync
{
}

impl<C> Client for C where
    C: ClientInfo
        + ClientPortalStore<PortalStore: PortalStore>
        + Sink<PgWireBackendMessage, Error: Debug>
        + Unpin
        + Send
        + Sync
{
}

pub(crate) fn session_of<C: ClientInfo>(client: &C) -> PgWireResult<Arc<Mutex<Session>>> {
    client
        .session_extensions()
        .get::<SessionSlot>()
        .map(|s| s.0.clone())
        .ok_or_else(|| {
            fatal(
                sqlstate::PROTOCOL_VIOLATION,
                "no session: startup did not complete",
            )
        })
}

struct Parameters {
    application_name: String,
    user: String,
    timezone: String,
    /// `default_transaction_read_only` (libpq's `target_session_attrs` reads it).
    read_only: String,
    is_superuser: String,
}

impl ServerParameterProvider for Parameters {
    fn server_parameters<C: ClientInfo>(&self, _client: &C) -> Option<HashMap<String, String>> {
        let mut p = HashMap::new();
        for (k, v) in [
            ("server_version", sluice_sql::SERVER_VERSION),
            ("server_encoding", "UTF8"),
            ("client_encoding", "UTF8"),
            ("DateStyle", "ISO, MDY"),
            ("IntervalStyle", "postgres"),
            ("integer_datetimes", "on"),
            ("standard_conforming_strings", "on"),
            ("in_hot_standby", "off"),
            ("search_path", "\"$user\", public"),
        ] {
            p.insert(k.to_string(), v.to_string());
        }
        p.insert("is_superuser".into(), self.is_superuser.clone());
        p.insert("TimeZone".into(), self.timezone.clone());
        p.insert("application_name".into(), self.application_name.clone());
        p.insert("session_authorization".into(), self.user.clone());
        p.insert(
            "default_transaction_read_only".into(),
            self.read_only.clone(),
        );
        Some(p)
    }
}

impl Backend {
    async fn complete_startup<C>(&self, client: &mut C) -> PgWireResult<()>
    where
        C: ClientInfo + Sink<PgWireBackendMessage> + Unpin + Send,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        let n = self.active.fetch_add(1, Ordering::AcqRel) + 1;
        let count = ConnectionCount(self.active.clone());
        if n > self.max_connections {
            return Err(fatal(
                sqlstate::TOO_MANY_CONNECTIONS,
                "sorry, too many clients already",
            ));
        }
        let (pid, key) = self.pids.generate(client);
        client.set_pid_and_secret_key(pid, key.clone());
        let (cancel_tx, cancel_rx) = watch::channel(0u64);
        if let Ok(mut m) = self.cancels.lock() {
            m.insert(pid, (key.to_bytes(), cancel_tx));
        }
        let cancel_registration = CancelRegistration {
            pid,
            map: self.cancels.clone(),
        };
        let (handle, guard) = self.connections.register(pid, key);
        let ext = client.session_extensions();
        ext.insert::<Arc<ConnectionHandle>>(handle);
        ext.insert(guard);
        ext.insert(count);
        ext.insert(cancel_registration);
        let md = client.metadata();
        let application_name = md.get("application_name").cloned().unwrap_or_default();
        let user = md
            .get(METADATA_USER)
            .cloned()
            .unwrap_or_else(|| "sluice".into());
        let database = md
            .get(pgwire::api::METADATA_DATABASE)
            .cloned()
            .unwrap_or_else(|| user.clone());
        auth::check_login(&user, &self.engine.catalog.roles())?;
        let startup_error = |e: sluice_sql::Error| {
            let mut info = ErrorInfo::new("FATAL".into(), e.code.into(), e.message);
            info.detail = e.detail;
            PgWireError::UserError(Box::new(info))
        };
        let mut session = Session::new(self.engine.clone()).map_err(startup_error)?;
        session.set_identity(&user, &database);
        session.set_backend_pid(pid);
        session.set_cancel_signal(cancel_rx);
        session.set_ssl(
            client
                .session_extensions()
                .get::<ConnectionTls>()
                .and_then(|t| t.0.clone()),
        );
        session
            .set_setting("application_name", &application_name)
            .map_err(startup_error)?;
        let timezone = match md.get("TimeZone").or_else(|| md.get("timezone")) {
            Some(tz) if OutputContext::new(tz).tz.is_some() || tz.eq_ignore_ascii_case("utc") => {
                tz.clone()
            }
            _ => "UTC".to_string(),
        };
        session
            .set_setting("timezone", &timezone)
            .map_err(startup_error)?;
        // settings Sluice acts on may come as startup parameters of their own
        // (asyncpg's server_settings, libpq's PGOPTIONS alike) or in `options`
        for name in STARTUP_SETTINGS {
            if let Some(value) = md.get(name) {
                session.set_setting(name, value).map_err(startup_error)?;
            }
        }
        if let Some(opts) = md.get("options") {
            apply_startup_options(&mut session, opts).map_err(startup_error)?;
        }
        let read_only = session
            .setting("default_transaction_read_only")
            .unwrap_or_else(|| "off".into());
        let is_superuser = if session.is_superuser() { "on" } else { "off" }.to_string();
        client
            .session_extensions()
            .insert(SessionSlot(Arc::new(Mutex::new(session))));
        client.session_extensions().insert(CopySlot::default());
        client.session_extensions().insert(PipelineSlot::default());
        finish_authentication(
            client,
            &Parameters {
                application_name,
                user,
                timezone,
                read_only,
                is_superuser,
            },
        )
        .await
    }
}

/// Settings a startup packet may carry as parameters of their own.
const STARTUP_SETTINGS: [&str; 5] = [
    "statement_timeout",
    "default_transaction_read_only",
    "max_statement_memory",
    "tail_wait",
    "read_consistency",
];

/// `options=-c name=value` (or `--name=value`) from the startup packet; a
/// value a setting cannot take refuses the connection, as in PostgreSQL.
fn apply_startup_options(session: &mut Session, opts: &str) -> sluice_sql::Result<()> {
    let mut it = opts.split_whitespace();
    while let Some(tok) = it.next() {
        let kv = if tok == "-c" {
            it.next()
        } else {
            tok.strip_prefix("-c").or_else(|| tok.strip_prefix("--"))
        };
        if let Some((k, v)) = kv.and_then(|kv| kv.split_once('=')) {
            session.set_setting(&k.replace('-', "_"), v)?;
        }
    }
    Ok(())
}

#[async_trait]
impl CancelHandler for Backend {
    async fn on_cancel_request(&self, req: CancelRequest) {
        // Every statement watches the session's signal, from planning to its
        // last row (pgwire's own cancel would drop a statement's future even
        // after it proposed a write).
        if let Ok(m) = self.cancels.lock() {
            if let Some((key, tx)) = m.get(&req.pid) {
                if *key == req.secret_key.to_bytes() {
                    tx.send_modify(|v| *v += 1);
                }
            }
        }
    }
}

#[async_trait]
impl StartupHandler for Backend {
    async fn on_startup<C>(
        &self,
        client: &mut C,
        message: PgWireFrontendMessage,
    ) -> PgWireResult<()>
    where
        C: ClientInfo + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        match message {
            PgWireFrontendMessage::Startup(ref startup) => {
                protocol_negotiation(client, startup).await?;
                save_startup_parameters_to_metadata(client, startup);
                let user = client
                    .metadata()
                    .get(METADATA_USER)
                    .cloned()
                    .unwrap_or_default();
                let tls = client
                    .session_extensions()
                    .get::<ConnectionTls>()
                    .and_then(|t| t.0.clone());
                let roles = self.engine.catalog.roles();
                let proof = self
                    .auth
                    .admit(client.socket_addr(), tls.as_ref(), &user, &roles)?;
                if proof == auth::Proof::Trust {
                    return self.complete_startup(client).await;
                }
                client.set_state(PgWireConnectionState::AuthenticationInProgress);
                client.session_extensions().insert(ScramSlot::default());
                let mechanisms = self.auth.mechanisms(client.is_secure());
                client
                    .send(PgWireBackendMessage::Authentication(Authentication::SASL(
                        mechanisms,
                    )))
                    .await?;
                Ok(())
            }
            PgWireFrontendMessage::PasswordMessageFamily(msg) => {
                let user = client
                    .metadata()
                    .get(METADATA_USER)
                    .cloned()
                    .unwrap_or_default();
                let Some(slot) = client.session_extensions().get::<ScramSlot>() else {
                    return Err(fatal(
                        sqlstate::PROTOCOL_VIOLATION,
                        "unexpected password message: no authentication was requested",
                    ));
                };
                let started = slot.0.lock().ok().and_then(|mut s| s.take());
                match started {
                    None => {
                        let (mechanism, data) = sasl_initial_response(msg)?;
                        let roles = self.engine.catalog.roles();
                        let mut exchange = self.auth.exchange(&user, client.is_secure(), &roles);
                        let first = exchange
                            .client_first(&mechanism, &data)
                            .map_err(|f| auth::failure(&user, f))?;
                        if let Ok(mut s) = slot.0.lock() {
                            *s = Some(exchange);
                        }
                        client
                            .send(PgWireBackendMessage::Authentication(
                                Authentication::SASLContinue(first.into()),
                            ))
                            .await?;
                        Ok(())
                    }
                    Some(mut exchange) => {
                        let response = msg
                            .into_sasl_response()
                            .map_err(|e| malformed_sasl(&e.to_string()))?;
                        let last = exchange
                            .client_final(&response.data)
                            .map_err(|f| auth::failure(&user, f))?;
                        client
                            .send(PgWireBackendMessage::Authentication(
                                Authentication::SASLFinal(last.into()),
                            ))
                            .await?;
                        self.complete_startup(client).await
                    }
                }
            }
            _ => Ok(()),
        }
    }
}

/// A password message that is not the SASL message expected (a cleartext password sent
/// anyway, say): refused like PostgreSQL's "malformed SASL message".
fn malformed_sasl(why: &str) -> PgWireError {
    fatal(
        sqlstate::PROTOCOL_VIOLATION,
        &format!("malformed SASL message: {why}"),
    )
}

/// A SASLInitialResponse's mechanism and data, read here because pgwire's decoder panics on
/// a body too short for its length field (`String` NUL, `Int32` length or -1, bytes).
fn sasl_initial_response(msg: PasswordMessageFamily) -> PgWireResult<(String, Vec<u8>)> {
    let PasswordMessageFamily::Raw(body) = msg else {
        return Err(malformed_sasl("not a SASLInitialResponse"));
    };
    let nul = body
        .iter()
        .position(|b| *b == 0)
        .ok_or_else(|| malformed_sasl("no mechanism name"))?;
    let mechanism = std::str::from_utf8(&body[..nul])
        .map_err(|_| malformed_sasl("the mechanism name is not UTF-8"))?;
    let rest = &body[nul + 1..];
    let Some((len, data)) = rest.split_first_chunk::<4>() else {
        return Err(malformed_sasl("no data length"));
    };
    let len = i32::from_be_bytes(*len);
    if len == -1 && data.is_empty() {
        return Ok((mechanism.to_string(), Vec::new()));
    }
    if usize::try_from(len).ok() != Some(data.len()) {
        return Err(malformed_sasl("the data length does not match the message"));
    }
    Ok((mechanism.to_string(), data.to_vec()))
}

/// Turn one statement's output into a pgwire response.
fn to_response<C: ClientInfo>(
    client: &C,
    out: Output,
    format: &Format,
    ctx: OutputContext,
) -> Response {
    match out {
        Output::Rows {
            schema,
            stream,
            tag,
        } => {
            let fields = Arc::new(field_infos(&schema, |i| format.format_for(i)));
            Response::Query(query_response(fields, &schema, stream, &tag, ctx))
        }
        Output::Tag(t) => {
            let tag = Tag::new(&t);
            match t.as_str() {
                "BEGIN" => Response::TransactionStart(tag),
                "COMMIT" | "ROLLBACK" => Response::TransactionEnd(tag),
                _ => Response::Execution(tag),
            }
        }
        out @ Output::CopyOut { .. } => {
            let copy = match copy_out_of(out, ctx, None) {
                Ok(copy) => copy,
                Err(_) => return Response::Error(Box::new(error_info(internal_copy()))),
            };
            let data = copy.frames.flat_map(|frames| {
                let messages: Vec<PgWireResult<CopyData>> = match frames {
                    Ok(f) => f.messages().map(|m| Ok(CopyData::new(m))).collect(),
                    Err(e) => vec![Err(e)],
                };
                futures::stream::iter(messages)
            });
            Response::CopyOut(CopyResponse::new(copy.format, copy.columns, data))
        }
        Output::CopyIn(pending) => {
            let columns = pending.columns();
            let code = matches!(pending.format, sluice_sql::statement::CopyFormat::Binary) as i8;
            if let Some(slot) = client.session_extensions().get::<CopySlot>() {
                if let Ok(mut g) = slot.0.lock() {
                    *g = Some(CopyIn::new(pending));
                }
            }
            Response::CopyIn(CopyResponse::new(code, columns, futures::stream::empty()))
        }
        // only the connection loop's Execute defers (see `pipeline`)
        Output::Deferred => Response::Error(Box::new(error_info(sluice_sql::Error::internal(
            "a RETURNING was deferred outside a pipeline",
        )))),
    }
}

fn query_response(
    fields: Arc<Vec<FieldInfo>>,
    schema: &arrow::datatypes::Schema,
    stream: datafusion::execution::SendableRecordBatchStream,
    tag: &str,
    ctx: OutputContext,
) -> QueryResponse {
    let encoder = RowEncoder::new(&fields, schema, ctx);
    let rows = stream
        .map(move |batch| {
            let rows: Vec<PgWireResult<_>> = match batch {
                Ok(b) => match encoder.encode_batch(&b) {
                    Ok(rows) => rows.into_iter().map(Ok).collect(),
                    Err(e) => vec![Err(user_error(sluice_sql::Error::internal(e)))],
                },
                Err(e) => vec![Err(user_error(sluice_sql::Error::from(e)))],
            };
            futures::stream::iter(rows)
        })
        .flatten();
    let mut resp = QueryResponse::new(fields, rows);
    resp.set_command_tag(tag);
    resp
}

pub(crate) fn output_context(session: &Session) -> OutputContext {
    session.with_setting("timezone", |tz| OutputContext::new(tz.unwrap_or("UTC")))
}

/// A statement's COPY TO data, ready to send (encoded on `runtime` unless
/// a tail), or the output back if it is something else.
fn copy_out_of(
    out: Output,
    ctx: OutputContext,
    runtime: Option<&tokio::runtime::Handle>,
) -> Result<CopyOut, Output> {
    match out {
        Output::CopyOut {
            schema,
            format,
            stream,
            live,
        } => Ok(CopyOut::new(&schema, format, stream, live, ctx, runtime)),
        other => Err(other),
    }
}

/// COPY TO data where the statement was not a COPY TO, or the reverse.
fn internal_copy() -> sluice_sql::Error {
    sluice_sql::Error::internal("COPY TO data and statement do not match")
}

/// Direct access to a connection's bytes: COPY data framed in advance goes
/// out whole instead of through pgwire's encoder a row at a time (one copy
/// of every row and a 8 KiB write at a time), and a running statement reads
/// the socket to notice the client leaving (`closed`).
pub trait RawOut: Send {
    /// Bytes queued for the socket (pgwire's write buffer).
    fn write_buffer(&mut self) -> &mut BytesMut;
    /// Bytes read from the socket, not yet decoded (pgwire's read buffer).
    fn read_buffer(&mut self) -> &mut BytesMut;
    /// The socket, for bytes written once the write buffer is flushed and
    /// bytes read into the read buffer.
    fn socket(&mut self) -> &mut dyn Socket;
    /// What the connection holds for a pipeline's commit ([`crate::held`]).
    fn held(&mut self) -> &mut crate::held::HeldBytes;
}

/// A connection's socket.
pub trait Socket: AsyncRead + AsyncWrite + Unpin + Send {}

impl<T: AsyncRead + AsyncWrite + Unpin + Send> Socket for T {}

impl<T, U> RawOut for Framed<crate::held::Held<T>, U>
where
    T: AsyncRead + AsyncWrite + Unpin + Send,
    U: Send,
{
    fn write_buffer(&mut self) -> &mut BytesMut {
        self.write_buffer_mut()
    }

    fn read_buffer(&mut self) -> &mut BytesMut {
        self.read_buffer_mut()
    }

    fn socket(&mut self) -> &mut dyn Socket {
        self.get_mut()
    }

    fn held(&mut self) -> &mut crate::held::HeldBytes {
        self.get_mut().held()
    }
}

/// Bytes a client may send ahead while its statement runs (pipelined
/// messages) that [`closed`] reads into the read buffer; beyond them it
/// stops reading, and only a failed write notices the client leaving.
const READ_AHEAD: usize = 64 << 10;

/// Resolves when the client has closed the connection (or the socket
/// failed): the statement running for it should stop. Bytes the client
/// sends meanwhile go to the read buffer, where the connection loop decodes
/// them next. Cancel-safe: a read moves bytes only once it completes.
async fn closed<C>(client: &mut C, raw: RawAccess<C>) -> PgWireError {
    let mut chunk = [0u8; 1024];
    loop {
        if raw(client).read_buffer().len() >= READ_AHEAD {
            return futures::future::pending().await;
        }
        match raw(client).socket().read(&mut chunk).await {
            Ok(0) => {
                return PgWireError::IoError(std::io::Error::new(
                    std::io::ErrorKind::UnexpectedEof,
                    "the client closed the connection while its statement ran",
                ))
            }
            Ok(n) => raw(client).read_buffer().extend_from_slice(&chunk[..n]),
            Err(e) => return PgWireError::IoError(e),
        }
    }
}

/// A Describe's answer, into the write buffer: ParameterDescription (for a
/// statement), then NoData or the RowDescription.
async fn feed_describe<C>(
    client: &mut C,
    parameters: Option<&[Type]>,
    no_rows: bool,
    fields: &[FieldInfo],
) -> PgWireResult<()>
where
    C: Sink<PgWireBackendMessage> + Unpin,
    PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
{
    use pgwire::messages::data::{NoData, ParameterDescription, RowDescription};
    if let Some(types) = parameters {
        let oids = types.iter().map(|t| t.oid()).collect();
        client
            .feed(PgWireBackendMessage::ParameterDescription(
                ParameterDescription::new(oids),
            ))
            .await?;
    }
    let answer = if no_rows {
        PgWireBackendMessage::NoData(NoData::new())
    } else {
        PgWireBackendMessage::RowDescription(RowDescription::new(
            fields.iter().map(Into::into).collect(),
        ))
    };
    client.feed(answer).await?;
    Ok(())
}

/// `fut`, or the client leaving first (with `raw`, see [`closed`]).
async fn unless_closed<C, F: std::future::Future>(
    client: &mut C,
    raw: Option<RawAccess<C>>,
    fut: F,
) -> PgWireResult<F::Output> {
    let Some(raw) = raw else {
        return Ok(fut.await);
    };
    tokio::select! {
        biased;
        out = fut => Ok(out),
        e = closed(client, raw) => Err(e),
    }
}

/// The next item of `stream`; without one ready, also watches for the
/// client leaving (with `raw`).
async fn next_unless_closed<C, S>(
    client: &mut C,
    raw: Option<RawAccess<C>>,
    stream: &mut S,
) -> PgWireResult<Option<S::Item>>
where
    S: futures::Stream + Unpin,
{
    if let Poll::Ready(next) = futures::poll!(stream.next()) {
        return Ok(next);
    }
    unless_closed(client, raw, stream.next()).await
}

/// How handlers generic over their client reach [`RawOut`] when the caller
/// knows the client is one (the connection loop does; pgwire's trait
/// methods cannot say so and pass `None`).
pub type RawAccess<C> = fn(&mut C) -> &mut dyn RawOut;

/// How the connection loop ends a simple Query's implicit transaction and sends what it
/// held for the commit (`pipeline.rs`).
pub type EndImplicit<C> =
    for<'a> fn(&'a mut C, RawAccess<C>) -> futures::future::BoxFuture<'a, PgWireResult<()>>;

/// Framed COPY data at least this large is written to the socket directly;
/// smaller pieces (a tail's rows) gather in the write buffer.
const DIRECT_WRITE: usize = 64 << 10;

/// Send a COPY TO stream: CopyOutResponse, one CopyData per row, CopyDone
/// and CommandComplete. An error mid-stream (cancel, dropped stream) is
/// returned for the caller to report as an ErrorResponse: the COPY simply
/// ends, as it does in PostgreSQL.
async fn send_copy_out<C>(
    client: &mut C,
    copy: CopyOut,
    raw: Option<RawAccess<C>>,
) -> PgWireResult<()>
where
    C: Sink<PgWireBackendMessage> + Unpin + Send,
    C::Error: Debug,
    PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
{
    use pgwire::messages::copy::{CopyDone as Done, CopyOutResponse};
    use tokio::io::AsyncWriteExt;
    let CopyOut {
        format,
        columns,
        mut frames,
    } = copy;
    client
        .feed(PgWireBackendMessage::CopyOutResponse(CopyOutResponse::new(
            format,
            columns as i16,
            vec![format as i16; columns],
        )))
        .await?;
    let mut rows = 0usize;
    // Rows go out as soon as nothing more is ready: a history scan goes out in large
    // writes, a tail's row at once.
    // The first poll runs with this task's own waker (`poll!`), never a no-op one: a tail waits
    // on channels and timers that must be able to wake us while the flush is in progress.
    loop {
        let next = match futures::poll!(frames.next()) {
            Poll::Ready(next) => next,
            Poll::Pending => {
                client.flush().await?;
                unless_closed(client, raw, frames.next()).await?
            }
        };
        let Some(chunk) = next else { break };
        let chunk = chunk?;
        rows += chunk.rows;
        match raw {
            Some(raw) if chunk.bytes.len() >= DIRECT_WRITE => {
                client.flush().await?;
                raw(client).socket().write_all(&chunk.bytes).await?;
            }
            Some(raw) => {
                let buffer = raw(client).write_buffer();
                buffer.extend_from_slice(&chunk.bytes);
                if buffer.len() >= DIRECT_WRITE {
                    client.flush().await?;
                }
            }
            None => {
                for message in chunk.messages() {
                    client
                        .feed(PgWireBackendMessage::CopyData(CopyData::new(message)))
                        .await?;
                }
            }
        }
    }
    client
        .feed(PgWireBackendMessage::CopyDone(Done::new()))
        .await?;
    client
        .send(PgWireBackendMessage::CommandComplete(
            Tag::new("COPY").with_rows(rows).into(),
        ))
        .await?;
    Ok(())
}

/// One statement's response in the simple query protocol (COPY TO data
/// goes through [`send_copy_out`] instead).
async fn send_simple_response<C>(client: &mut C, resp: Response) -> PgWireResult<()>
where
    C: ClientInfo + Sink<PgWireBackendMessage> + Unpin + Send,
    C::Error: Debug,
    PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
{
    use pgwire::api::query::{send_execution_response, send_query_response};
    use pgwire::messages::response::EmptyQueryResponse;
    match resp {
        Response::Query(r) => send_query_response(client, r, true).await,
        Response::Execution(t) | Response::TransactionStart(t) | Response::TransactionEnd(t) => {
            send_execution_response(client, t).await
        }
        Response::CopyOut(_) => Err(user_error(internal_copy())),
        Response::CopyIn(r) => pgwire::api::copy::send_copy_in_response(client, r).await,
        Response::EmptyQuery => client
            .feed(PgWireBackendMessage::EmptyQueryResponse(
                EmptyQueryResponse::new(),
            ))
            .await
            .map_err(Into::into),
        Response::Error(e) => Err(PgWireError::UserError(e)),
        Response::CopyBoth(_) => Err(user_error(sluice_sql::Error::unsupported("COPY BOTH"))),
    }
}

fn wire_status(s: sluice_sql::TxnStatus) -> pgwire::messages::response::TransactionStatus {
    use pgwire::messages::response::TransactionStatus as T;
    match s {
        sluice_sql::TxnStatus::Idle => T::Idle,
        sluice_sql::TxnStatus::InBlock => T::Transaction,
        sluice_sql::TxnStatus::Failed => T::Error,
    }
}

/// Send a statement's rows: RowDescription (simple protocol only), one
/// DataRow per row, CommandComplete. An error mid-stream (cancel, timeout,
/// a failing plan) is returned for the caller to report; the client leaving
/// while rows are awaited ends it too (with `raw`).
#[allow(clippy::too_many_arguments)]
pub(crate) async fn send_rows<C>(
    client: &mut C,
    schema: &arrow::datatypes::Schema,
    mut stream: datafusion::execution::SendableRecordBatchStream,
    tag: &str,
    format: &Format,
    ctx: OutputContext,
    raw: Option<RawAccess<C>>,
    describe: bool,
) -> PgWireResult<()>
where
    C: Sink<PgWireBackendMessage> + Unpin + Send,
    C::Error: Debug,
    PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
{
    use pgwire::messages::data::RowDescription;
    let fields = field_infos(schema, |i| format.format_for(i));
    if describe {
        client
            .feed(PgWireBackendMessage::RowDescription(RowDescription::new(
                fields.iter().map(Into::into).collect(),
            )))
            .await?;
    }
    let encoder = RowEncoder::new(&fields, schema, ctx);
    let mut rows = 0usize;
    while let Some(batch) = next_unless_closed(client, raw, &mut stream).await? {
        let batch = batch.map_err(|e| user_error(sluice_sql::Error::from(e)))?;
        let encoded = encoder
            .encode_batch(&batch)
            .map_err(|e| user_error(sluice_sql::Error::internal(e)))?;
        for row in encoded {
            client.feed(PgWireBackendMessage::DataRow(row)).await?;
            rows += 1;
        }
    }
    client
        .feed(PgWireBackendMessage::CommandComplete(
            Tag::new(tag).with_rows(rows).into(),
        ))
        .await?;
    Ok(())
}

impl Backend {
    /// The simple query protocol, driven here rather than by pgwire so that
    /// each statement's results go out before the next statement runs, COPY
    /// TO streams end with a proper ErrorResponse, a statement stops when the
    /// client leaves (with `raw`), and the transaction status comes from the
    /// session itself. With `raw`, COPY TO data goes straight to the socket.
    /// A COPY FROM STDIN ends the query string: what follows it is not run.
    pub async fn simple_query<C>(
        &self,
        client: &mut C,
        query: pgwire::messages::simplequery::Query,
        raw: Option<RawAccess<C>>,
        end: Option<EndImplicit<C>>,
    ) -> PgWireResult<()>
    where
        C: Client,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        use pgwire::api::query::send_ready_for_query;
        use pgwire::messages::response::EmptyQueryResponse;
        if !matches!(client.state(), PgWireConnectionState::ReadyForQuery) {
            return Err(PgWireError::NotReadyForQuery);
        }
        client.set_state(PgWireConnectionState::QueryInProgress);
        let started = std::time::Instant::now();
        let session = session_of(client)?;
        let parsed = session.lock().await.parse_query(&query.query).await;
        let mut copy_in = false;
        match parsed {
            Ok(parsed) if parsed.is_empty() => {
                client
                    .feed(PgWireBackendMessage::EmptyQueryResponse(
                        EmptyQueryResponse::new(),
                    ))
                    .await?;
            }
            Ok(parsed) => {
                let mut implicit = false;
                for (i, p) in parsed.iter().enumerate() {
                    let mut s = session.lock().await;
                    // several statements are one implicit transaction (see `pipeline`)
                    if i + 1 < parsed.len() && end.is_some() && s.opens_implicit(p) {
                        s.begin_implicit();
                        implicit = true;
                    }
                    let out = off_the_connection_thread(
                        query.query.len(),
                        unless_closed(client, raw, s.execute(p, &[])),
                    )
                    .await?;
                    let ctx = match &out {
                        Ok(Output::Tag(_)) | Err(_) => OutputContext { tz: None },
                        _ => output_context(&s),
                    };
                    drop(s);
                    let result = match out {
                        Err(e) => Err(user_error(e)),
                        Ok(out) => {
                            let r = self.send_output(client, out, ctx, raw, &mut copy_in).await;
                            if matches!(&r, Err(e) if !matches!(e, PgWireError::IoError(_))) {
                                // an error while rows streamed ends the block too
                                session.lock().await.abort_block();
                            }
                            r
                        }
                    };
                    if let Err(e) = result {
                        if matches!(e, PgWireError::IoError(_)) {
                            return Err(e);
                        }
                        let info: ErrorInfo = e.into();
                        client
                            .feed(PgWireBackendMessage::ErrorResponse(info.into()))
                            .await?;
                        copy_in = false;
                        break;
                    }
                    if copy_in {
                        break;
                    }
                }
                if let (true, Some(raw), Some(end)) = (implicit, raw, end) {
                    end(client, raw).await?;
                }
            }
            Err(e) => {
                let info = error_info(e);
                client
                    .feed(PgWireBackendMessage::ErrorResponse(info.into()))
                    .await?;
            }
        }
        if copy_in {
            client.set_state(PgWireConnectionState::CopyInProgress(false));
            return Ok(());
        }
        let (status, threshold) = {
            let s = session.lock().await;
            (wire_status(s.status()), s.log_min_duration())
        };
        crate::logging::statement_duration(threshold, started.elapsed(), &query.query);
        client.set_state(PgWireConnectionState::ReadyForQuery);
        client.set_transaction_status(status);
        send_ready_for_query(client, status).await
    }

    /// One statement's output in the simple protocol; `copy_in` is set when
    /// the client must now send COPY data.
    async fn send_output<C>(
        &self,
        client: &mut C,
        out: Output,
        ctx: OutputContext,
        raw: Option<RawAccess<C>>,
        copy_in: &mut bool,
    ) -> PgWireResult<()>
    where
        C: Client,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        match out {
            Output::Deferred => {
                let Some(raw) = raw else {
                    return Err(user_error(sluice_sql::Error::internal(
                        "a RETURNING was deferred without the connection's socket",
                    )));
                };
                let rows = DeferredRows {
                    format: Format::UnifiedText,
                    ctx,
                    describe: true,
                };
                record_deferred(client, rows);
                // what follows waits for the commit, from here
                client.flush().await?;
                raw(client).held().mark();
                Ok(())
            }
            Output::Rows {
                schema,
                stream,
                tag,
            } => {
                let format = Format::UnifiedText;
                Box::pin(send_rows(
                    client, &schema, stream, &tag, &format, ctx, raw, true,
                ))
                .await
            }
            out => match copy_out_of(out, ctx.clone(), self.engine.query_runtime()) {
                Ok(copy) => Box::pin(send_copy_out(client, copy, raw)).await,
                Err(out) => {
                    let resp = to_response(client, out, &Format::UnifiedText, ctx);
                    *copy_in |= matches!(resp, Response::CopyIn(_));
                    send_simple_response(client, resp).await
                }
            },
        }
    }

    /// Execute: COPY TO, row-limited fetches of tails and (with `raw`) every
    /// statement of a portal that has not run yet are served here, the rest
    /// by pgwire's default (which calls `do_query`). With `raw`, COPY TO
    /// data goes straight to the socket and a statement stops when the
    /// client leaves.
    pub async fn execute<C>(
        &self,
        client: &mut C,
        message: Execute,
        raw: Option<RawAccess<C>>,
    ) -> PgWireResult<()>
    where
        C: ClientInfo + ClientPortalStore + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::PortalStore: PortalStore<Statement = Arc<Prepared>>,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        let started = std::time::Instant::now();
        let name = message.name.as_deref().unwrap_or(pgwire::api::DEFAULT_NAME);
        let text = match client.portal_store().get_portal(name) {
            Some(pgwire::api::store::Entry::Value(p)) => {
                Some(p.statement.statement.log_text.clone())
            }
            _ => None,
        };
        let r = self.execute_message(client, message, raw).await;
        if let (Some(text), Ok(session)) = (text, session_of(client)) {
            let threshold = session.lock().await.log_min_duration();
            crate::logging::statement_duration(threshold, started.elapsed(), &text);
        }
        r
    }

    /// [`Backend::execute`], untimed.
    async fn execute_message<C>(
        &self,
        client: &mut C,
        message: Execute,
        raw: Option<RawAccess<C>>,
    ) -> PgWireResult<()>
    where
        C: ClientInfo + ClientPortalStore + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::PortalStore: PortalStore<Statement = Arc<Prepared>>,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        let name = message.name.as_deref().unwrap_or(pgwire::api::DEFAULT_NAME);
        let portal = match client.portal_store().get_portal(name) {
            Some(pgwire::api::store::Entry::Value(p)) => p,
            _ => return self._on_execute(client, message).await,
        };
        if matches!(portal.statement.statement.parsed, Parsed::CopyTo { .. }) {
            let values = bind_params(&portal)?;
            let session = session_of(client)?;
            let mut s = session.lock().await;
            let parsed = &portal.statement.statement.parsed;
            let out = unless_closed(client, raw, s.execute(parsed, &values)).await?;
            let ctx = output_context(&s);
            drop(s);
            let out = out.map_err(user_error)?;
            let sent = match copy_out_of(out, ctx, self.engine.query_runtime()) {
                Ok(copy) => Box::pin(send_copy_out(client, copy, raw)).await,
                Err(_) => Err(user_error(internal_copy())),
            };
            if matches!(&sent, Err(e) if !matches!(e, PgWireError::IoError(_))) {
                session.lock().await.abort_block();
            }
            return sent;
        }
        let max_rows = message.max_rows.max(0) as usize;
        let parsed = &portal.statement.statement.parsed;
        if max_rows > 0 && matches!(parsed, Parsed::Insert(i) if i.returning.is_some()) {
            // its rows wait for the pipeline's commit, and come whole (see `pipeline`)
            if session_of(client)?.lock().await.in_implicit() {
                return Err(user_error(sluice_sql::Error::unsupported(
                    "a row-limited Execute of INSERT ... RETURNING inside a pipeline is not supported: its rows wait for the pipeline's commit",
                )));
            }
        }
        if max_rows == 0 || !matches!(parsed, Parsed::Query(_)) {
            return match raw {
                Some(raw) if max_rows == 0 => self.execute_portal(client, &portal, raw).await,
                _ => self._on_execute(client, message).await,
            };
        }
        let values = bind_params(&portal)?;
        let key = sluice_sql::session::PortalKey::of(&portal.state);
        let session = session_of(client)?;
        let mut s = session.lock().await;
        let parsed = &portal.statement.statement.parsed;
        let fetched = unless_closed(
            client,
            raw,
            Box::pin(s.portal_fetch(&key, parsed, &values, max_rows)),
        )
        .await?;
        let ctx = output_context(&s);
        drop(s);
        let Some((schema, batches, more)) = fetched.map_err(user_error)? else {
            return self._on_execute(client, message).await;
        };
        same_shape(&portal.statement.statement, &schema)?;
        let fields: Vec<FieldInfo> =
            field_infos(&schema, |i| portal.result_column_format.format_for(i));
        let encoder = RowEncoder::new(&fields, &schema, ctx);
        let mut n = 0;
        for b in &batches {
            for row in encoder
                .encode_batch(b)
                .map_err(|e| user_error(sluice_sql::Error::internal(e)))?
            {
                client.feed(PgWireBackendMessage::DataRow(row)).await?;
                n += 1;
            }
        }
        if more {
            client
                .send(PgWireBackendMessage::PortalSuspended(PortalSuspended::new()))
                .await?;
        } else {
            client
                .send(PgWireBackendMessage::CommandComplete(
                    Tag::new("SELECT").with_rows(n).into(),
                ))
                .await?;
        }
        Ok(())
    }

    /// Execute without a row limit, as pgwire's default does it, but with
    /// the rows streamed here (so the client leaving stops the statement). A
    /// portal that already ran goes to pgwire (its rows are done).
    async fn execute_portal<C>(
        &self,
        client: &mut C,
        portal: &Portal<Arc<Prepared>>,
        raw: RawAccess<C>,
    ) -> PgWireResult<()>
    where
        C: ClientInfo + ClientPortalStore + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::PortalStore: PortalStore<Statement = Arc<Prepared>>,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        use pgwire::api::portal::PortalExecutionState;
        use pgwire::api::query::send_execution_response;
        if !matches!(client.state(), PgWireConnectionState::ReadyForQuery) {
            return Err(PgWireError::NotReadyForQuery);
        }
        if !matches!(*portal.state.lock().await, PortalExecutionState::Initial) {
            let message = Execute::new(Some(portal.name.clone()), 0);
            return self._on_execute(client, message).await;
        }
        client.set_state(PgWireConnectionState::QueryInProgress);
        let values = bind_params(portal)?;
        let session = session_of(client)?;
        let mut s = session.lock().await;
        let parsed = &portal.statement.statement.parsed;
        let out = unless_closed(client, Some(raw), s.execute(parsed, &values)).await?;
        let ctx = match &out {
            Ok(Output::Tag(_)) | Err(_) => OutputContext { tz: None },
            _ => output_context(&s),
        };
        drop(s);
        let out = out.map_err(user_error)?;
        if let Output::Rows { schema, .. } = &out {
            same_shape(&portal.statement.statement, schema)?;
        }
        let format = &portal.result_column_format;
        match out {
            Output::Rows {
                schema,
                stream,
                tag,
            } => {
                let sent = Box::pin(send_rows(
                    client,
                    &schema,
                    stream,
                    &tag,
                    format,
                    ctx,
                    Some(raw),
                    false,
                ))
                .await;
                if let Err(e) = sent {
                    if !matches!(e, PgWireError::IoError(_)) {
                        session.lock().await.abort_block();
                    }
                    return Err(e);
                }
                *portal.state.lock().await = PortalExecutionState::Finished;
            }
            out @ Output::CopyOut { .. } => {
                match copy_out_of(out, ctx, self.engine.query_runtime()) {
                    Ok(copy) => Box::pin(send_copy_out(client, copy, Some(raw))).await?,
                    Err(_) => return Err(user_error(internal_copy())),
                }
            }
            // its rows go out after the pipeline's commit, in this place
            Output::Deferred => {
                let format = format.clone();
                record_deferred(
                    client,
                    DeferredRows {
                        format,
                        ctx,
                        describe: false,
                    },
                );
                *portal.state.lock().await = PortalExecutionState::Finished;
            }
            out => match to_response(client, out, format, ctx) {
                Response::Execution(tag) => send_execution_response(client, tag).await?,
                Response::TransactionStart(tag) => send_execution_response(client, tag).await?,
                Response::TransactionEnd(tag) => {
                    send_execution_response(client, tag).await?;
                    client.portal_store().rm_portal(pgwire::api::DEFAULT_NAME);
                }
                Response::CopyIn(r) => {
                    client.set_state(PgWireConnectionState::CopyInProgress(true));
                    pgwire::api::copy::send_copy_in_response(client, r).await?;
                    return Ok(());
                }
                Response::Error(e) => return Err(PgWireError::UserError(e)),
                _ => return Err(user_error(internal_copy())),
            },
        }
        client.set_state(PgWireConnectionState::ReadyForQuery);
        Ok(())
    }
}

#[async_trait]
impl SimpleQueryHandler for Backend {
    async fn on_query<C>(
        &self,
        client: &mut C,
        query: pgwire::messages::simplequery::Query,
    ) -> PgWireResult<()>
    where
        C: Client,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        self.simple_query(client, query, None, None).await
    }

    async fn do_query<C>(&self, client: &mut C, query: &str) -> PgWireResult<Vec<Response>>
    where
        C: Client,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        let session = session_of(client)?;
        let mut s = session.lock().await;
        let outputs = s.simple_query(query).await;
        let ctx = output_context(&s);
        drop(s);
        let mut responses = Vec::with_capacity(outputs.len());
        for o in outputs {
            responses.push(match o {
                Ok(out) => to_response(client, out, &Format::UnifiedText, ctx.clone()),
                Err(e) => Response::Error(Box::new(error_info(e))),
            });
        }
        if responses.is_empty() {
            responses.push(Response::EmptyQuery);
        }
        Ok(responses)
    }
}

/// Rows whose columns are not the ones Describe announced (an ALTER added a column under a
/// prepared `SELECT *`) would not match the client's RowDescription: PostgreSQL's `0A000`
/// "cached plan must not change result type" instead, on which drivers prepare again.
fn same_shape(prepared: &Prepared, schema: &arrow::datatypes::SchemaRef) -> PgWireResult<()> {
    match &prepared.desc.schema {
        Some(described) if described.fields().len() != schema.fields().len() => Err(user_error(
            sluice_sql::Error::unsupported("cached plan must not change result type"),
        )),
        _ => Ok(()),
    }
}

/// A parsed and described statement of the extended protocol.
#[derive(Debug, Clone)]
pub struct Prepared {
    pub(crate) parsed: Parsed,
    desc: Description,
    /// Its text is long enough to plan off the connection thread ([`off_the_connection_thread`]).
    long: bool,
    /// Its text as a slow statement's log line shows it ([`crate::logging::shortened`]).
    log_text: Arc<str>,
}

/// Runs the work for a statement of `len` bytes. A long one (over
/// [`statement::PARSE_INLINE_BYTES`]: a big `IN` list or `VALUES`) takes DataFusion a second
/// or more per megabyte to plan, so on a multi-threaded runtime its task turns this worker
/// into a blocking thread for the time (`block_in_place`): the runtime starts another worker
/// and the connection thread's other clients are served meanwhile. Long statements take
/// turns ([`statement::long_statement_turn`]): each holds about a hundred times its size
/// while it is planned.
async fn off_the_connection_thread<F: std::future::Future>(len: usize, work: F) -> F::Output {
    use tokio::runtime::{Handle, RuntimeFlavor};
    let handle = Handle::current();
    if len <= statement::PARSE_INLINE_BYTES || handle.runtime_flavor() != RuntimeFlavor::MultiThread
    {
        return work.await;
    }
    let _turn = statement::long_statement_turn().await;
    tokio::task::block_in_place(|| handle.block_on(work))
}

#[derive(Debug, Default)]
pub struct SluiceParser;

#[async_trait]
impl QueryParser for SluiceParser {
    type Statement = Arc<Prepared>;

    async fn parse_sql<C>(
        &self,
        client: &C,
        sql: &str,
        _types: &[Option<Type>],
    ) -> PgWireResult<Option<Self::Statement>>
    where
        C: ClientInfo + Unpin + Send + Sync,
    {
        let session = session_of(client)?;
        let mut s = session.lock().await;
        let prepared = async {
            if sql.len() > s.engine().limits.max_statement_bytes {
                return Err(sluice_sql::Error::new(
                    sqlstate::PROGRAM_LIMIT_EXCEEDED,
                    "statement exceeds max_statement_bytes",
                ));
            }
            let mut parsed = s.parse_text(sql).await?;
            if parsed.len() > 1 {
                return Err(sluice_sql::Error::syntax(
                    "cannot insert multiple commands into a prepared statement",
                ));
            }
            let Some(parsed) = parsed.pop() else {
                return Ok(None);
            };
            let desc = off_the_connection_thread(sql.len(), s.describe(&parsed)).await?;
            Ok(Some(Arc::new(Prepared {
                parsed,
                desc,
                long: sql.len() > statement::PARSE_INLINE_BYTES,
                log_text: crate::logging::shortened(sql).into(),
            })))
        }
        .await;
        // as in PostgreSQL, an error at Parse aborts the transaction block
        prepared.map_err(|e| user_error(s.fail_block(e)))
    }

    fn get_parameter_types(&self, stmt: &Self::Statement) -> PgWireResult<Vec<Type>> {
        Ok(stmt
            .desc
            .params
            .iter()
            .map(|t| t.map(|t| pg_type(t.oid())).unwrap_or(Type::TEXT))
            .collect())
    }

    fn get_result_schema(
        &self,
        stmt: &Self::Statement,
        format: Option<&Format>,
    ) -> PgWireResult<Vec<FieldInfo>> {
        Ok(match &stmt.desc.schema {
            Some(schema) => field_infos(schema, |i| {
                format.map(|f| f.format_for(i)).unwrap_or(FieldFormat::Text)
            }),
            None => vec![],
        })
    }
}

#[async_trait]
impl ExtendedQueryHandler for Backend {
    type Statement = Arc<Prepared>;
    type QueryParser = SluiceParser;

    fn query_parser(&self) -> Arc<Self::QueryParser> {
        Arc::new(SluiceParser)
    }

    /// ParseComplete waits in the write buffer for the Sync or Flush that
    /// ends the pipeline, as PostgreSQL does: pgwire's default flushes it
    /// at once, one more send and one more client wake-up per statement.
    async fn on_parse<C>(
        &self,
        client: &mut C,
        message: pgwire::messages::extendedquery::Parse,
    ) -> PgWireResult<()>
    where
        C: ClientInfo + ClientPortalStore + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::PortalStore: PortalStore<Statement = Self::Statement>,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        let name = message.name.as_deref().unwrap_or(pgwire::api::DEFAULT_NAME);
        match StoredStatement::parse(client, &message, self.query_parser()).await? {
            Some(stmt) => client.portal_store().put_statement(Arc::new(stmt)),
            None => client.portal_store().put_empty_statement(name),
        }
        client
            .feed(PgWireBackendMessage::ParseComplete(ParseComplete::new()))
            .await?;
        Ok(())
    }

    /// BindComplete is buffered like ParseComplete (see `on_parse`).
    async fn on_bind<C>(
        &self,
        client: &mut C,
        message: pgwire::messages::extendedquery::Bind,
    ) -> PgWireResult<()>
    where
        C: ClientInfo + ClientPortalStore + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::PortalStore: PortalStore<Statement = Self::Statement>,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        let statement = message
            .statement_name
            .as_deref()
            .unwrap_or(pgwire::api::DEFAULT_NAME);
        let portal = message
            .portal_name
            .as_deref()
            .unwrap_or(pgwire::api::DEFAULT_NAME);
        match client.portal_store().get_statement(statement) {
            Some(Entry::Value(stored)) => {
                let p = Portal::try_new(&message, stored)?;
                client.portal_store().put_portal(Arc::new(p));
            }
            Some(Entry::Empty) => {
                if !message.parameters.is_empty() {
                    return Err(PgWireError::UserError(Box::new(ErrorInfo::new(
                        "ERROR".to_owned(),
                        sqlstate::PROTOCOL_VIOLATION.to_owned(),
                        format!(
                            "bind message supplies {} parameters, but prepared statement \"{}\" requires 0",
                            message.parameters.len(),
                            message.statement_name.as_deref().unwrap_or("")
                        ),
                    ))));
                }
                client.portal_store().put_empty_portal(portal);
            }
            None => return Err(PgWireError::StatementNotFound(statement.to_owned())),
        }
        client
            .feed(PgWireBackendMessage::BindComplete(BindComplete::new()))
            .await?;
        Ok(())
    }

    /// CloseComplete is buffered like ParseComplete (see `on_parse`).
    async fn on_close<C>(
        &self,
        client: &mut C,
        message: pgwire::messages::extendedquery::Close,
    ) -> PgWireResult<()>
    where
        C: ClientInfo + ClientPortalStore + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::PortalStore: PortalStore<Statement = Self::Statement>,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        let name = message.name.as_deref().unwrap_or(pgwire::api::DEFAULT_NAME);
        match message.target_type {
            TARGET_TYPE_BYTE_STATEMENT => client.portal_store().rm_statement(name),
            TARGET_TYPE_BYTE_PORTAL => client.portal_store().rm_portal(name),
            _ => {}
        }
        client
            .feed(PgWireBackendMessage::CloseComplete(CloseComplete::new()))
            .await?;
        Ok(())
    }

    /// Describe of a portal pgwire does not know may name a cursor made
    /// with SQL `DECLARE` (psycopg's server-side cursors do this): answer
    /// with the cursor's columns. The answer waits in the write buffer for
    /// the Sync or Flush, like ParseComplete (see `on_parse`): pgwire's
    /// default flushes it at once, and a prepared INSERT (Bind, Describe,
    /// Execute, Sync) then costs two sends and two client wake-ups.
    async fn on_describe<C>(
        &self,
        client: &mut C,
        message: pgwire::messages::extendedquery::Describe,
    ) -> PgWireResult<()>
    where
        C: ClientInfo + ClientPortalStore + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::PortalStore: PortalStore<Statement = Self::Statement>,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        use pgwire::api::results::{DescribePortalResponse, DescribeResponse};
        let name = message.name.as_deref().unwrap_or(pgwire::api::DEFAULT_NAME);
        match message.target_type {
            TARGET_TYPE_BYTE_STATEMENT => match client.portal_store().get_statement(name) {
                Some(Entry::Value(stored)) => {
                    let resp = self.do_describe_statement(client, &stored).await?;
                    // A statement that returns no rows is described with NoData
                    // even when it has parameters (pgwire would send an empty
                    // RowDescription, which pgjdbc rejects for INSERT).
                    let no_rows = stored.statement.desc.schema.is_none() || resp.is_no_data();
                    feed_describe(client, resp.parameters(), no_rows, resp.fields()).await
                }
                // an empty query: no parameters, no rows
                Some(Entry::Empty) => feed_describe(client, Some(&[]), true, &[]).await,
                None => Err(PgWireError::StatementNotFound(name.to_owned())),
            },
            TARGET_TYPE_BYTE_PORTAL => match client.portal_store().get_portal(name) {
                Some(Entry::Value(portal)) => {
                    let resp = self.do_describe_portal(client, &portal).await?;
                    feed_describe(client, None, resp.is_no_data(), resp.fields()).await
                }
                Some(Entry::Empty) => feed_describe(client, None, true, &[]).await,
                None => {
                    let session = session_of(client)?;
                    let schema = session.lock().await.cursor_schema(name);
                    let Some(schema) = schema else {
                        return Err(PgWireError::PortalNotFound(name.to_owned()));
                    };
                    let resp =
                        DescribePortalResponse::new(field_infos(&schema, |_| FieldFormat::Text));
                    feed_describe(client, None, resp.is_no_data(), resp.fields()).await
                }
            },
            other => Err(PgWireError::InvalidTargetType(other)),
        }
    }

    /// A row-limited Execute on a tailable query behaves like FETCH: the
    /// rows available now (waiting up to `tail_wait` for one), then
    /// PortalSuspended. Everything else runs the usual way.
    /// ReadyForQuery reports the session's own transaction state: pgwire's
    /// default marks the connection failed after any error, but an error
    /// outside a block leaves it idle, and so does a COMMIT that failed
    /// (the block ended, as in PostgreSQL).
    async fn on_sync<C>(
        &self,
        client: &mut C,
        _message: pgwire::messages::extendedquery::Sync,
    ) -> PgWireResult<()>
    where
        C: ClientInfo + ClientPortalStore + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::PortalStore: PortalStore<Statement = Self::Statement>,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        client.portal_store().rm_portal(pgwire::api::DEFAULT_NAME);
        let status = wire_status(session_of(client)?.lock().await.status());
        client.set_transaction_status(status);
        pgwire::api::query::send_ready_for_query(client, status).await
    }

    async fn on_execute<C>(&self, client: &mut C, message: Execute) -> PgWireResult<()>
    where
        C: ClientInfo + ClientPortalStore + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::PortalStore: PortalStore<Statement = Self::Statement>,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        self.execute(client, message, None).await
    }

    async fn do_query<C>(
        &self,
        client: &mut C,
        portal: &Portal<Self::Statement>,
        _max_rows: usize,
    ) -> PgWireResult<Response>
    where
        C: ClientInfo + ClientPortalStore + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::PortalStore: PortalStore<Statement = Self::Statement>,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        let prepared = &portal.statement.statement;
        let values = bind_params(portal)?;
        let session = session_of(client)?;
        let mut s = session.lock().await;
        let len = if prepared.long { usize::MAX } else { 0 };
        let out = off_the_connection_thread(len, s.execute(&prepared.parsed, &values)).await;
        // a command tag needs no output settings (the common INSERT)
        let ctx = match &out {
            Ok(Output::Tag(_)) | Err(_) => OutputContext { tz: None },
            _ => output_context(&s),
        };
        drop(s);
        match out {
            Ok(out) => {
                if let Output::Rows { schema, .. } = &out {
                    same_shape(prepared, schema)?;
                }
                Ok(to_response(client, out, &portal.result_column_format, ctx))
            }
            Err(e) => Err(user_error(e)),
        }
    }
}

#[async_trait]
impl CopyHandler for Backend {
    async fn on_copy_data<C>(&self, client: &mut C, copy_data: CopyData) -> PgWireResult<()>
    where
        C: ClientInfo + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        // errors wait for CopyDone (see `Session::copy_data`): the client keeps sending
        let Some(mut copy) = take_copy(client) else {
            return Ok(());
        };
        let session = session_of(client)?;
        session
            .lock()
            .await
            .copy_data(&mut copy, &copy_data.data)
            .await;
        if let Some(slot) = client.session_extensions().get::<CopySlot>() {
            if let Ok(mut g) = slot.0.lock() {
                *g = Some(copy);
            }
        }
        Ok(())
    }

    async fn on_copy_done<C>(&self, client: &mut C, _done: CopyDone) -> PgWireResult<()>
    where
        C: ClientInfo + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        let Some(copy) = take_copy(client) else {
            return Err(user_error(sluice_sql::Error::new(
                sqlstate::PROTOCOL_VIOLATION,
                "no COPY in progress",
            )));
        };
        let session = session_of(client)?;
        let result = session.lock().await.copy_done(copy).await;
        match result {
            Ok(Output::Tag(t)) => {
                client
                    .send(PgWireBackendMessage::CommandComplete(CommandComplete::new(
                        t,
                    )))
                    .await?;
                Ok(())
            }
            Ok(_) => Ok(()),
            Err(e) => Err(user_error(e)),
        }
    }

    async fn on_copy_fail<C>(&self, client: &mut C, fail: CopyFail) -> PgWireError
    where
        C: ClientInfo + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        if let Some(copy) = take_copy(client) {
            if let Ok(session) = session_of(client) {
                session.lock().await.copy_fail(copy).await;
            }
        }
        user_error(sluice_sql::Error::new(
            sqlstate::QUERY_CANCELED,
            format!("COPY from stdin failed: {}", fail.message),
        ))
    }
}

/// The connection's COPY in progress, taken out of its slot.
fn take_copy<C: ClientInfo>(client: &C) -> Option<CopyIn> {
    client
        .session_extensions()
        .get::<CopySlot>()
        .and_then(|slot| slot.0.lock().ok().and_then(|mut g| g.take()))
}

/// Decode a portal's bound parameters with declared or inferred types.
fn bind_params(
    portal: &Portal<Arc<Prepared>>,
) -> PgWireResult<Vec<datafusion::scalar::ScalarValue>> {
    let prepared = &portal.statement.statement;
    let declared = &portal.statement.parameter_types;
    let mut values = Vec::with_capacity(portal.parameters.len());
    for (i, raw) in portal.parameters.iter().enumerate() {
        let inferred = prepared.desc.params.get(i).copied().flatten();
        let oid = declared
            .get(i)
            .cloned()
            .flatten()
            .map(|t| t.oid())
            .filter(|o| *o != 0)
            .or_else(|| inferred.map(|t| t.oid()))
            .unwrap_or(0);
        values.push(
            params::decode(
                raw.as_ref(),
                oid,
                inferred,
                portal.parameter_format.format_for(i),
            )
            .map_err(user_error)?,
        );
    }
    Ok(values)
}
