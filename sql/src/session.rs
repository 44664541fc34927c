//! One client session: it runs each statement under the session's stop
//! conditions and hands it to the code of its family, one file each:
//! `transaction` (BEGIN, COMMIT, ROLLBACK, savepoints, read-only mode),
//! `pipeline` (implicit transactions), `append` and `copy_from` (writes to
//! streams), `dml` and `returning` (writes to tables, RETURNING), `ddl`,
//! `cursor` (COPY TO, cursors, tails), `listen` (LISTEN/NOTIFY),
//! `variables` (SET, SHOW, RESET), `query` (planning and starting a query)
//! and `describe` (the extended protocol's Describe).
//!
//! Outside a block every write statement is one proposed command. Inside
//! `BEGIN ... COMMIT` — or the implicit block of statements sent together
//! (`pipeline`) — appends are buffered (bounded by the command size limit)
//! and proposed together at COMMIT, so they commit all or nothing;
//! ROLLBACK drops them. After an error inside a block, everything but
//! COMMIT/ROLLBACK fails with 25P02, as in PostgreSQL. DDL runs at once even
//! inside a block (see docs/architecture.md). Reads are snapshots taken when
//! the statement is planned.
//!
//! Every statement runs under an [`Interrupt`] (cancel, `statement_timeout`)
//! until it proposes a write, and its rows stream under the same one; its
//! plans reserve memory from the session's [`StatementMemory`]. A read-only
//! transaction (`BEGIN READ ONLY`, `SET TRANSACTION READ ONLY`, or any
//! transaction while `default_transaction_read_only` is on) refuses every
//! write with 25006.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::sync::Arc;

use arrow::array::RecordBatch;
use arrow::datatypes::SchemaRef;
use datafusion::execution::context::SessionContext;
use datafusion::execution::memory_pool::MemoryConsumer;
use datafusion::execution::SendableRecordBatchStream;
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::scalar::ScalarValue;
use tokio::sync::{mpsc, watch};

use crate::block_catalog::BlockCatalog;
use crate::command::{Op, OpOutcome};
use crate::compiled_values::ValuesCache;
use crate::engine::Engine;
use crate::error::{sqlstate, Error, Result};
use crate::interrupt::{CancelWatch, Interrupt};
use crate::memory::StatementMemory;
use crate::notify::{self, Notification};
use crate::settings::{default_settings, SessionVars, SharedVars};
use crate::statement::{self, CopyFormat, Parsed};
use crate::table::TxnTables;
use crate::tail::Tail;

mod append;
mod backup;
mod block_ddl;
mod copy_from;
pub use copy_from::{CopyIn, CopyTarget, PendingCopy};
mod cursor;
mod ddl;
mod describe;
mod dml;
mod indexes;
mod last_appends;
mod listen;
mod naming;
mod pipeline;
mod prepared;
mod privileges;
mod query;
mod returning;
mod transaction;
mod udfs;
mod upsert;
mod variables;
mod views;

use append::insert_target;
use cursor::CursorEntry;
pub use cursor::PortalKey;
use transaction::Txn;
use udfs::{pg_notify_udf, session_udfs, NotifyState};

/// What a statement produced, for the wire layer to send.
pub enum Output {
    /// Rows; `tag` is the command tag without the row count ("SELECT",
    /// "INSERT 0").
    Rows {
        schema: SchemaRef,
        stream: SendableRecordBatchStream,
        tag: String,
    },
    /// A complete command tag ("CREATE STREAM", "INSERT 0 2").
    Tag(String),
    /// The client must now send COPY data; finish with [`Session::finish_copy`].
    CopyIn(PendingCopy),
    /// Rows to send as COPY data.
    CopyOut {
        schema: SchemaRef,
        format: CopyFormat,
        stream: SendableRecordBatchStream,
        /// A tail: rows come as they commit and it never ends by itself;
        /// each should reach the client at once. Otherwise a snapshot,
        /// best sent in bulk.
        live: bool,
    },
    /// A stream INSERT's RETURNING in a pipeline's implicit block: its rows
    /// come from [`Session::take_returning`] once the block has ended.
    Deferred,
}

impl std::fmt::Debug for Output {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Output::Rows { tag, .. } => write!(f, "Rows({tag})"),
            Output::Tag(t) => write!(f, "Tag({t})"),
            Output::CopyIn(c) => write!(f, "CopyIn({})", c.target.name()),
            Output::CopyOut { .. } => write!(f, "CopyOut"),
            Output::Deferred => write!(f, "Deferred"),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TxnStatus {
    Idle,
    InBlock,
    Failed,
}

/// Parameter and result description of a prepared statement.
#[derive(Debug, Clone)]
pub struct Description {
    pub params: Vec<Option<crate::param_type::ParamType>>,
    /// `None` for statements that return no rows.
    pub schema: Option<SchemaRef>,
}

pub struct Session {
    engine: Arc<Engine>,
    ctx: SessionContext,
    txn: Txn,
    /// Settings, user and database, shared with catalog functions.
    vars: SharedVars,
    /// Settings given at startup, which RESET restores.
    startup_settings: BTreeMap<String, String>,
    id: u64,
    notify: Arc<NotifyState>,
    notify_tx: mpsc::Sender<Notification>,
    notify_rx: Option<mpsc::Receiver<Notification>>,
    /// Channels listened to.
    listeners: HashSet<String>,
    /// Started at the first LISTEN.
    dispatcher: Option<notify::Dispatcher>,
    cursors: HashMap<String, CursorEntry>,
    /// Tails behind row-limited portals of the extended protocol.
    portal_tails: HashMap<usize, (std::sync::Weak<dyn std::any::Any + Send + Sync>, Tail)>,
    cancel: watch::Receiver<u64>,
    _cancel_tx: watch::Sender<u64>,
    /// The transaction's view of tables (snapshot, own writes, reads).
    tables: Arc<TxnTables>,
    /// What the open block's DDL created, altered or dropped (see [`BlockCatalog`]).
    block: Arc<BlockCatalog>,
    /// Where the last block's appends went (`sluice_last_offsets()`, see `last_appends`).
    last_appends: Arc<last_appends::LastAppends>,
    /// The memory pool of this session's plans (see [`crate::memory`]).
    memory: Arc<StatementMemory>,
    /// Set once the running statement has proposed a write that may commit:
    /// from then on it is not interrupted (see [`crate::interrupt`]).
    committing: Arc<AtomicBool>,
    /// The role the session acts as; `None`: a superuser outside the roles (see
    /// `privileges`).
    role: Option<String>,
    /// Statements prepared with SQL's PREPARE, by name (see `prepared`).
    prepared: HashMap<String, Arc<statement::Prepare>>,
    /// INSERT's VALUES expressions, compiled once (emptied when a setting changes).
    values: ValuesCache,
    /// RETURNING rows waiting for an implicit block's commit (see `pipeline`).
    pending_returning: Vec<pipeline::PendingReturning>,
    /// What statements read of the settings, as of the last statement (see `variables`).
    derived: Option<variables::Derived>,
}

impl Session {
    pub fn new(engine: Arc<Engine>) -> Result<Session> {
        let vars = Arc::new(parking_lot::RwLock::new(SessionVars {
            user: "sluice".into(),
            database: "sluice".into(),
            settings: default_settings(engine.limits.setting_defaults()).into(),
            ..SessionVars::default()
        }));
        let tables = Arc::new(TxnTables::default());
        let block = Arc::new(BlockCatalog::default());
        let memory = StatementMemory::new(
            engine.limits.max_statement_memory,
            engine.query_memory.clone(),
        );
        let ctx =
            engine.new_context(vars.clone(), tables.clone(), block.clone(), memory.clone())?;
        crate::value_size::install(&ctx, memory.clone());
        let notify = Arc::new(NotifyState {
            hub: engine.hub.clone(),
            catalog: engine.catalog.clone(),
            pid: AtomicI32::new(0),
            in_block: AtomicBool::new(false),
            pending: parking_lot::Mutex::new(Vec::new()),
        });
        ctx.register_udf(pg_notify_udf(notify.clone()));
        let last_appends = Arc::new(last_appends::LastAppends::default());
        ctx.register_udtf(
            last_appends::FUNCTION,
            Arc::new(last_appends::LastOffsetsFunction(last_appends.clone())),
        );
        for udf in session_udfs(notify.clone()) {
            ctx.register_udf(udf);
        }
        let (notify_tx, notify_rx) = mpsc::channel(notify::QUEUE_CAPACITY);
        let (cancel_tx, cancel) = watch::channel(0);
        Ok(Session {
            id: {
                engine.open_sessions.fetch_add(1, Ordering::Relaxed);
                engine.next_session_id()
            },
            engine,
            ctx,
            txn: Txn::Idle,
            vars,
            startup_settings: BTreeMap::new(),
            notify,
            notify_tx,
            notify_rx: Some(notify_rx),
            listeners: Default::default(),
            dispatcher: None,
            cursors: HashMap::new(),
            prepared: HashMap::new(),
            portal_tails: HashMap::new(),
            cancel,
            _cancel_tx: cancel_tx,
            tables,
            block,
            last_appends,
            memory,
            committing: Arc::new(AtomicBool::new(false)),
            role: None,
            values: ValuesCache::default(),
            pending_returning: Vec::new(),
            derived: None,
        })
    }

    /// The backend pid clients see in notifications from this session.
    pub fn set_backend_pid(&mut self, pid: i32) {
        self.notify.pid.store(pid, Ordering::Relaxed);
        self.vars.write().pid = pid;
    }

    /// The connection's TLS as `pg_stat_ssl` shows it (`None`: a plain connection).
    pub fn set_ssl(&mut self, ssl: Option<crate::settings::SslInfo>) {
        self.vars.write().ssl = ssl;
    }

    /// The queue of notifications for this session's client (taken once).
    pub fn take_notifications(&mut self) -> Option<mpsc::Receiver<Notification>> {
        self.notify_rx.take()
    }

    /// Where cancel requests for this session arrive: any change of the
    /// value cancels the running statement.
    pub fn set_cancel_signal(&mut self, rx: watch::Receiver<u64>) {
        self.cancel = rx;
    }

    /// A watch that fires if the client cancels from now on.
    pub fn cancel_signal(&self) -> CancelWatch {
        self.cancel_watch()
    }

    fn cancel_watch(&self) -> CancelWatch {
        CancelWatch::new(self.cancel.clone())
    }

    pub fn engine(&self) -> &Arc<Engine> {
        &self.engine
    }

    pub fn status(&self) -> TxnStatus {
        match self.txn {
            Txn::Idle => TxnStatus::Idle,
            Txn::Block(_) => TxnStatus::InBlock,
            Txn::Failed(_) => TxnStatus::Failed,
        }
    }

    /// The user and database named at startup (`current_user`,
    /// `current_database()`, the catalogs).
    pub fn set_identity(&mut self, user: &str, database: &str) {
        self.role = self
            .engine
            .catalog
            .roles()
            .get(user)
            .map(|r| r.name.clone());
        let superuser = if self.is_superuser() { "on" } else { "off" };
        let mut vars = self.vars.write();
        vars.user = user.to_string();
        vars.role = self.role.clone();
        vars.database = database.to_string();
        vars.settings
            .insert("is_superuser".into(), superuser.into());
    }

    /// The statements of a simple-protocol query, for [`Session::execute`]
    /// one at a time (a statement's rows stream before the next one runs).
    pub async fn parse_query(&mut self, sql: &str) -> Result<Vec<Parsed>> {
        let max = self.engine.limits.max_statement_bytes;
        if sql.len() > max {
            return Err(self.fail_block(statement_too_long(sql.len(), max)));
        }
        let parsed = self.parse_text(sql).await;
        parsed.map_err(|e| self.fail_block(e))
    }

    /// [`statement::parse_off_thread`], with the memory parsing a long statement takes
    /// reserved from the statement's and the server's limits while it is parsed (`53200`
    /// when they have no room): [`statement::PARSING_BYTES_PER_BYTE`] for each byte of a
    /// statement over [`statement::PARSE_INLINE_BYTES`].
    pub async fn parse_text(&self, sql: &str) -> Result<Vec<Parsed>> {
        let reservation = MemoryConsumer::new("parsing a statement")
            .register(&self.ctx.runtime_env().memory_pool);
        if sql.len() > statement::PARSE_INLINE_BYTES {
            reservation.try_grow(sql.len().saturating_mul(statement::PARSING_BYTES_PER_BYTE))?;
        }
        statement::parse_off_thread(sql).await
    }

    /// Run every statement of a simple-protocol query, stopping at the
    /// first error (whose result is the last element). The rows of each are
    /// left unread: the wire layer streams statement by statement instead.
    pub async fn simple_query(&mut self, sql: &str) -> Vec<Result<Output>> {
        let parsed = match self.parse_query(sql).await {
            Ok(p) => p,
            Err(e) => return vec![Err(e)],
        };
        let mut out = Vec::with_capacity(parsed.len());
        let deferred = self.deferred_returning();
        let mut implicit = false;
        for (i, p) in parsed.iter().enumerate() {
            // several statements are one implicit transaction (see `pipeline`)
            if i + 1 < parsed.len() && self.opens_implicit(p) {
                self.begin_implicit();
                implicit = true;
            }
            let r = self.execute(p, &[]).await;
            let stop = r.is_err();
            out.push(r);
            if stop {
                break;
            }
        }
        if implicit {
            Box::pin(self.finish_implicit(&mut out, deferred)).await;
        }
        out
    }

    /// The end of a simple Query that opened an implicit block: commit it
    /// (or roll it back) and put the deferred RETURNING rows in place; if
    /// the commit fails, its error replaces the results from the first
    /// deferred one on (the client hears the failure there).
    async fn finish_implicit(&mut self, out: &mut Vec<Result<Output>>, deferred: usize) {
        let ended = self.end_implicit().await;
        let rows = match ended {
            Ok(()) => self.take_returning(deferred).await,
            Err(e) => {
                self.take_returning(deferred).await.ok();
                Err(e)
            }
        };
        let first = out.iter().position(|r| matches!(r, Ok(Output::Deferred)));
        match rows {
            Ok(rows) => {
                let mut rows = rows.into_iter();
                for r in out.iter_mut() {
                    if matches!(r, Ok(Output::Deferred)) {
                        *r = rows
                            .next()
                            .ok_or_else(|| Error::internal("a RETURNING was lost"));
                    }
                }
            }
            // every statement succeeded (a failed block rolls back)
            Err(e) => {
                out.truncate(first.unwrap_or(out.len()));
                out.push(Err(e));
            }
        }
    }

    /// Execute one classified statement with bound parameters.
    pub async fn execute(&mut self, p: &Parsed, params: &[ScalarValue]) -> Result<Output> {
        if !matches!(p, Parsed::Rollback | Parsed::RollbackTo(_)) {
            self.engine.check_serving()?;
        }
        if matches!(self.txn, Txn::Failed(_))
            && !matches!(p, Parsed::Commit | Parsed::Rollback | Parsed::RollbackTo(_))
        {
            return Err(Error::new(
                sqlstate::IN_FAILED_TRANSACTION,
                "current transaction is aborted, commands ignored until end of transaction block",
            ));
        }
        if matches!(self.txn, Txn::Idle) {
            // outside a block every statement reads a fresh snapshot
            self.tables.reset();
        }
        self.sync_settings();
        let interrupt = self.interrupt();
        self.committing.store(false, Ordering::Release);
        let committing = self.committing.clone();
        let mut watch = interrupt.clone();
        let r = tokio::select! {
            biased;
            r = self.execute_inner(p, params) => r,
            e = stop_unless_committing(&mut watch, &committing) => Err(e),
        };
        match r {
            Ok(out) => Ok(guard_output(out, interrupt)),
            Err(e) => Err(self.fail_block(e)),
        }
    }

    /// The stop conditions of a statement starting now.
    fn interrupt(&self) -> Interrupt {
        Interrupt::new(self.cancel_watch(), self.derived().statement_timeout)
    }

    /// Propose `ops` (with a transaction's snapshot and reads) and wait for
    /// the outcome; from here on the statement is not interrupted, unless the
    /// write certainly did not commit (40001).
    async fn propose(
        &self,
        ops: Vec<Op>,
        snapshot: u64,
        reads: Vec<crate::command::TableRead>,
    ) -> Result<Vec<OpOutcome>> {
        self.committing.store(true, Ordering::Release);
        let r = self.engine.propose_txn(ops, snapshot, reads).await;
        if matches!(&r, Err(e) if e.code == sqlstate::SERIALIZATION_FAILURE) {
            self.committing.store(false, Ordering::Release);
        }
        r
    }

    /// The statement's work, under `execute`'s interrupt: the transaction's
    /// checks, a read barrier where asked for, then one family's code per
    /// statement kind.
    async fn execute_inner(&mut self, p: &Parsed, params: &[ScalarValue]) -> Result<Output> {
        self.enter_statement(p)?;
        self.check_privileges(p)?;
        self.refuse_write_to_view(p)?;
        self.read_barrier(p).await?;
        match p {
            Parsed::Query(stmt) => Box::pin(self.query(stmt, params)).await,
            Parsed::Insert(ins) if self.table(&insert_target(ins)?).is_some() => {
                Box::pin(self.table_dml(p, params)).await
            }
            Parsed::Insert(ins) => self.insert(ins, params).await,
            Parsed::Update(u) => {
                self.updated_table(u)?;
                Box::pin(self.table_dml(p, params)).await
            }
            Parsed::Delete(d) if self.table(&dml::delete_target(d)?.0).is_some() => {
                Box::pin(self.table_dml(p, params)).await
            }
            Parsed::Delete(d) => Box::pin(self.truncate_prefix(d)).await,
            Parsed::CopyFrom(c) => Box::pin(self.copy_from(c)).await,
            Parsed::CreateTable { .. }
            | Parsed::CreateStream { .. }
            | Parsed::DropRelation { .. }
            | Parsed::CreateView { .. }
            | Parsed::CreateIndex { .. }
            | Parsed::DropIndex { .. }
            | Parsed::AlterCluster(_)
            | Parsed::AlterStream { .. } => Box::pin(self.ddl(p)).await,
            Parsed::Roles(change) => Box::pin(self.change_roles(change)).await,
            Parsed::Begin { read_only } => self.begin(*read_only),
            Parsed::Commit => Box::pin(self.commit()).await,
            Parsed::Rollback => self.rollback(),
            Parsed::Savepoint(name) => self.savepoint(name),
            Parsed::ReleaseSavepoint(name) => self.release_savepoint(name),
            Parsed::RollbackTo(name) => self.rollback_to(name),
            Parsed::CopyTo { query, format } => {
                Box::pin(self.copy_to(query, format.clone(), params)).await
            }
            Parsed::Declare { name, query, hold } => {
                Box::pin(self.declare(name, query, *hold, params)).await
            }
            Parsed::Fetch { name, count } => Box::pin(self.fetch(name, *count)).await,
            Parsed::Close(name) => self.close(name.as_deref()),
            Parsed::Listen(channel) => self.listen(channel),
            Parsed::Unlisten(channel) => self.unlisten(channel.as_deref()),
            Parsed::Notify { channel, payload } => self.notify_channel(channel, payload),
            Parsed::Set { name, value } => self.set(name, value),
            Parsed::Show(name) => self.show(name),
            Parsed::ShowStreams => Box::pin(self.show_streams()).await,
            Parsed::Reset(name) => self.reset(name.as_deref()),
            Parsed::Discard => self.discard_all(),
            Parsed::Prepare(p) => Box::pin(self.prepare(p)).await,
            Parsed::Execute { name, args } => Box::pin(self.execute_prepared(name, args)).await,
            Parsed::Deallocate(name) => Ok(self.deallocate(name.as_deref())),
            Parsed::NoOp(tag) => Ok(Output::Tag((*tag).into())),
            Parsed::Refused(e) => Err(e.clone()),
        }
    }

    /// Under `read_consistency = linearizable` a read (a query, COPY TO, a
    /// cursor) first waits for [`Engine::read_barrier`].
    async fn read_barrier(&self, p: &Parsed) -> Result<()> {
        let reads = matches!(
            p,
            Parsed::Query(_) | Parsed::CopyTo { .. } | Parsed::Declare { .. }
        );
        if reads && self.with_setting("read_consistency", |v| v == Some("linearizable")) {
            Box::pin(self.engine.read_barrier()).await?;
        }
        Ok(())
    }
}

/// Resolves when `interrupt` fires, unless the statement has proposed a
/// write by then: its outcome is what the client hears (Raft's own waits
/// bound it).
async fn stop_unless_committing(interrupt: &mut Interrupt, committing: &AtomicBool) -> Error {
    let e = interrupt.fired().await;
    if !committing.load(Ordering::Acquire) {
        return e;
    }
    std::future::pending().await
}

/// The output with its rows streaming under `interrupt`.
fn guard_output(out: Output, interrupt: Interrupt) -> Output {
    match out {
        Output::Rows {
            schema,
            stream,
            tag,
        } => Output::Rows {
            schema,
            stream: interrupt.guard(stream),
            tag,
        },
        Output::CopyOut {
            schema,
            format,
            stream,
            live,
        } => Output::CopyOut {
            schema,
            format,
            stream: interrupt.guard(stream),
            live,
        },
        other => other,
    }
}

fn statement_too_long(len: usize, max: usize) -> Error {
    Error::new(
        sqlstate::PROGRAM_LIMIT_EXCEEDED,
        format!(
            "statement of {len} bytes exceeds the maximum of {max} bytes (max_statement_bytes)"
        ),
    )
}

pub fn batches_stream(schema: SchemaRef, batches: Vec<RecordBatch>) -> SendableRecordBatchStream {
    Box::pin(RecordBatchStreamAdapter::new(
        schema,
        futures::stream::iter(batches.into_iter().map(Ok)),
    ))
}

impl Drop for Session {
    fn drop(&mut self) {
        self.unlisten_all();
        self.engine.open_sessions.fetch_sub(1, Ordering::Relaxed);
    }
}
