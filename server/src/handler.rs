//! The pgwire handlers: startup and authentication, simple and extended
//! query, COPY, cancel.
//!
//! Each connection owns one [`Session`] (in its pgwire session extensions),
//! created when authentication succeeds; every handler locks it for the
//! duration of one statement. Results stream: a query's record batches are
//! encoded to DataRows as the client reads them, never collected whole.

use std::collections::HashMap;
use std::fmt::Debug;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use async_trait::async_trait;
use futures::{Sink, SinkExt, StreamExt};
use pgwire::api::auth::{finish_authentication, protocol_negotiation, save_startup_parameters_to_metadata};
use pgwire::api::auth::{ServerParameterProvider, StartupHandler};
use pgwire::api::cancel::DefaultCancelHandler;
use pgwire::api::copy::CopyHandler;
use pgwire::api::portal::{Format, Portal};
use pgwire::api::query::{ExtendedQueryHandler, SimpleQueryHandler};
use pgwire::api::results::{CopyResponse, FieldFormat, FieldInfo, QueryResponse, Response, Tag};
use pgwire::api::stmt::QueryParser;
use pgwire::api::store::PortalStore;
use pgwire::api::{
    ClientInfo, ClientPortalStore, ConnectionHandle, ConnectionManager, PgWireConnectionState, PgWireServerHandlers,
    PidSecretKeyGenerator, RandomPidSecretKeyGenerator, Type, METADATA_USER,
};
use pgwire::error::{ErrorInfo, PgWireError, PgWireResult};
use pgwire::messages::copy::{CopyData, CopyDone, CopyFail};
use pgwire::messages::response::CommandComplete;
use pgwire::messages::startup::Authentication;
use pgwire::messages::{PgWireBackendMessage, PgWireFrontendMessage};
use sluice_sql::error::sqlstate;
use sluice_sql::session::Description;
use sluice_sql::statement::{self, Parsed};
use sluice_sql::{Engine, Output, PendingCopy, Session};
use tokio::sync::Mutex;

use crate::encode::{field_infos, pg_type, OutputContext, RowEncoder};
use crate::params;

/// Server-wide state shared by every connection's handlers.
pub struct Backend {
    pub engine: Arc<Engine>,
    pub connections: Arc<ConnectionManager>,
    pub password: Option<String>,
    pub max_connections: usize,
    active: Arc<AtomicUsize>,
    pids: RandomPidSecretKeyGenerator,
}

impl Backend {
    pub fn new(engine: Arc<Engine>, password: Option<String>, max_connections: usize) -> Arc<Backend> {
        Arc::new(Backend {
            engine,
            connections: Arc::new(ConnectionManager::new()),
            password,
            max_connections,
            active: Arc::new(AtomicUsize::new(0)),
            pids: RandomPidSecretKeyGenerator::default(),
        })
    }
}

/// The handler set handed to pgwire for each connection.
#[derive(Clone)]
pub struct Handlers(pub Arc<Backend>);

impl PgWireServerHandlers for Handlers {
    fn simple_query_handler(&self) -> Arc<impl SimpleQueryHandler> {
        self.0.clone()
    }

    fn extended_query_handler(&self) -> Arc<impl ExtendedQueryHandler> {
        self.0.clone()
    }

    fn startup_handler(&self) -> Arc<impl StartupHandler> {
        self.0.clone()
    }

    fn copy_handler(&self) -> Arc<impl CopyHandler> {
        self.0.clone()
    }

    fn cancel_handler(&self) -> Arc<impl pgwire::api::cancel::CancelHandler> {
        Arc::new(DefaultCancelHandler::new(self.0.connections.clone()))
    }
}

/// The connection's session, in the pgwire session extensions.
struct SessionSlot(Arc<Mutex<Session>>);

/// A COPY FROM in progress: the target and the data received so far.
#[derive(Default)]
struct CopySlot(std::sync::Mutex<Option<(PendingCopy, Vec<u8>, bool)>>);

/// Decrements the active-connection count when the connection ends.
struct ConnectionCount(Arc<AtomicUsize>);

impl Drop for ConnectionCount {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

pub fn user_error(e: sluice_sql::Error) -> PgWireError {
    PgWireError::UserError(Box::new(error_info(e)))
}

fn error_info(e: sluice_sql::Error) -> ErrorInfo {
    let mut info = ErrorInfo::new("ERROR".to_string(), e.code.to_string(), e.message);
    info.detail = e.detail;
    info
}

fn fatal(code: &str, message: &str) -> PgWireError {
    PgWireError::UserError(Box::new(ErrorInfo::new("FATAL".into(), code.into(), message.into())))
}

fn session_of<C: ClientInfo>(client: &C) -> PgWireResult<Arc<Mutex<Session>>> {
    client
        .session_extensions()
        .get::<SessionSlot>()
        .map(|s| s.0.clone())
        .ok_or_else(|| fatal(sqlstate::PROTOCOL_VIOLATION, "no session: startup did not complete"))
}

struct Parameters {
    application_name: String,
    user: String,
    timezone: String,
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
            ("is_superuser", "on"),
            ("default_transaction_read_only", "off"),
            ("in_hot_standby", "off"),
            ("search_path", "\"$user\", public"),
        ] {
            p.insert(k.to_string(), v.to_string());
        }
        p.insert("TimeZone".into(), self.timezone.clone());
        p.insert("application_name".into(), self.application_name.clone());
        p.insert("session_authorization".into(), self.user.clone());
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
            return Err(fatal("53300", "sorry, too many clients already"));
        }
        let (pid, key) = self.pids.generate(client);
        client.set_pid_and_secret_key(pid, key.clone());
        let (handle, guard) = self.connections.register(pid, key);
        let ext = client.session_extensions();
        ext.insert::<Arc<ConnectionHandle>>(handle);
        ext.insert(guard);
        ext.insert(count);
        let md = client.metadata();
        let application_name = md.get("application_name").cloned().unwrap_or_default();
        let user = md.get(METADATA_USER).cloned().unwrap_or_else(|| "sluice".into());
        let mut session = Session::new(self.engine.clone());
        session.set_setting("application_name", &application_name);
        let timezone = match md.get("TimeZone").or_else(|| md.get("timezone")) {
            Some(tz) if OutputContext::new(tz).tz.is_some() || tz.eq_ignore_ascii_case("utc") => tz.clone(),
            _ => "UTC".to_string(),
        };
        session.set_setting("timezone", &timezone);
        if let Some(opts) = md.get("options") {
            apply_startup_options(&mut session, opts);
        }
        client.session_extensions().insert(SessionSlot(Arc::new(Mutex::new(session))));
        client.session_extensions().insert(CopySlot::default());
        finish_authentication(client, &Parameters { application_name, user, timezone }).await
    }
}

/// `options=-c name=value` from the startup packet.
fn apply_startup_options(session: &mut Session, opts: &str) {
    let mut it = opts.split_whitespace();
    while let Some(tok) = it.next() {
        let kv = if tok == "-c" { it.next() } else { tok.strip_prefix("-c") };
        if let Some((k, v)) = kv.and_then(|kv| kv.split_once('=')) {
            session.set_setting(k, v);
        }
    }
}

#[async_trait]
impl StartupHandler for Backend {
    async fn on_startup<C>(&self, client: &mut C, message: PgWireFrontendMessage) -> PgWireResult<()>
    where
        C: ClientInfo + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        match message {
            PgWireFrontendMessage::Startup(ref startup) => {
                protocol_negotiation(client, startup).await?;
                save_startup_parameters_to_metadata(client, startup);
                if self.password.is_some() {
                    client.set_state(PgWireConnectionState::AuthenticationInProgress);
                    client
                        .send(PgWireBackendMessage::Authentication(Authentication::CleartextPassword))
                        .await?;
                    Ok(())
                } else {
                    self.complete_startup(client).await
                }
            }
            PgWireFrontendMessage::PasswordMessageFamily(pwd) => {
                let given = pwd.into_password()?.password;
                match &self.password {
                    Some(expected) if *expected == given => self.complete_startup(client).await,
                    _ => {
                        let user = client.metadata().get(METADATA_USER).cloned().unwrap_or_default();
                        Err(fatal("28P01", &format!("password authentication failed for user \"{user}\"")))
                    }
                }
            }
            _ => Ok(()),
        }
    }
}

/// Turn one statement's output into a pgwire response.
fn to_response<C: ClientInfo>(client: &C, out: Output, format: &Format, ctx: OutputContext) -> Response {
    match out {
        Output::Rows { schema, stream, tag } => {
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
        Output::CopyIn(pending) => {
            let columns = pending.columns();
            if let Some(slot) = client.session_extensions().get::<CopySlot>() {
                if let Ok(mut g) = slot.0.lock() {
                    *g = Some((pending, Vec::new(), false));
                }
            }
            Response::CopyIn(CopyResponse::new(0, columns, futures::stream::empty()))
        }
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

fn output_context(session: &Session) -> OutputContext {
    OutputContext::new(session.setting("timezone").unwrap_or("UTC"))
}

#[async_trait]
impl SimpleQueryHandler for Backend {
    async fn do_query<C>(&self, client: &mut C, query: &str) -> PgWireResult<Vec<Response>>
    where
        C: ClientInfo + ClientPortalStore + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::PortalStore: PortalStore,
        C::Error: Debug,
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

/// A parsed and described statement of the extended protocol.
#[derive(Debug, Clone)]
pub struct Prepared {
    parsed: Parsed,
    desc: Description,
}

#[derive(Debug, Default)]
pub struct SluiceParser;

#[async_trait]
impl QueryParser for SluiceParser {
    type Statement = Arc<Prepared>;

    async fn parse_sql<C>(&self, client: &C, sql: &str, _types: &[Option<Type>]) -> PgWireResult<Option<Self::Statement>>
    where
        C: ClientInfo + Unpin + Send + Sync,
    {
        let session = session_of(client)?;
        let s = session.lock().await;
        if sql.len() > s.engine().limits.max_statement_bytes {
            return Err(user_error(sluice_sql::Error::new(
                sqlstate::PROGRAM_LIMIT_EXCEEDED,
                "statement exceeds max_statement_bytes",
            )));
        }
        let mut parsed = statement::parse(sql).map_err(user_error)?;
        if parsed.len() > 1 {
            return Err(user_error(sluice_sql::Error::syntax(
                "cannot insert multiple commands into a prepared statement",
            )));
        }
        let Some(parsed) = parsed.pop() else { return Ok(None) };
        let desc = s.describe(&parsed).await.map_err(user_error)?;
        Ok(Some(Arc::new(Prepared { parsed, desc })))
    }

    fn get_parameter_types(&self, stmt: &Self::Statement) -> PgWireResult<Vec<Type>> {
        Ok(stmt
            .desc
            .params
            .iter()
            .map(|t| t.map(|t| pg_type(t.oid())).unwrap_or(Type::TEXT))
            .collect())
    }

    fn get_result_schema(&self, stmt: &Self::Statement, format: Option<&Format>) -> PgWireResult<Vec<FieldInfo>> {
        Ok(match &stmt.desc.schema {
            Some(schema) => field_infos(schema, |i| format.map(|f| f.format_for(i)).unwrap_or(FieldFormat::Text)),
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

    async fn do_query<C>(&self, client: &mut C, portal: &Portal<Self::Statement>, _max_rows: usize) -> PgWireResult<Response>
    where
        C: ClientInfo + ClientPortalStore + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::PortalStore: PortalStore<Statement = Self::Statement>,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
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
            values.push(params::decode(raw.as_ref(), oid, inferred, portal.parameter_format.format_for(i)).map_err(user_error)?);
        }
        let session = session_of(client)?;
        let mut s = session.lock().await;
        let out = s.execute(&prepared.parsed, &values).await;
        let ctx = output_context(&s);
        drop(s);
        match out {
            Ok(out) => Ok(to_response(client, out, &portal.result_column_format, ctx)),
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
        let max = self.engine.limits.max_copy_bytes;
        if let Some(slot) = client.session_extensions().get::<CopySlot>() {
            if let Ok(mut g) = slot.0.lock() {
                if let Some((_, buf, overflow)) = g.as_mut() {
                    if buf.len() + copy_data.data.len() > max {
                        // keep reading to the end of the COPY, then report
                        *overflow = true;
                        buf.clear();
                    } else if !*overflow {
                        buf.extend_from_slice(&copy_data.data);
                    }
                }
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
        let pending = client
            .session_extensions()
            .get::<CopySlot>()
            .and_then(|slot| slot.0.lock().ok().and_then(|mut g| g.take()));
        let Some((pending, data, overflow)) = pending else {
            return Err(user_error(sluice_sql::Error::new(sqlstate::PROTOCOL_VIOLATION, "no COPY in progress")));
        };
        if overflow {
            return Err(user_error(sluice_sql::Error::new(
                sqlstate::PROGRAM_LIMIT_EXCEEDED,
                format!("COPY data exceeds the maximum of {} bytes (max_copy_bytes)", self.engine.limits.max_copy_bytes),
            )));
        }
        let session = session_of(client)?;
        let result = session.lock().await.finish_copy(pending, &data).await;
        match result {
            Ok(Output::Tag(t)) => {
                client
                    .send(PgWireBackendMessage::CommandComplete(CommandComplete::new(t)))
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
        if let Some(slot) = client.session_extensions().get::<CopySlot>() {
            if let Ok(mut g) = slot.0.lock() {
                *g = None;
            }
        }
        user_error(sluice_sql::Error::new(
            sqlstate::QUERY_CANCELED,
            format!("COPY from stdin failed: {}", fail.message),
        ))
    }
}
