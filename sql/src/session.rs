//! One client session: statement execution, the transaction block, and
//! session settings.
//!
//! Outside a block every write statement is one proposed command. Inside
//! `BEGIN ... COMMIT` appends are buffered (bounded by the command size
//! limit) and proposed together at COMMIT, so they commit all or nothing;
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

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use arrow::array::{RecordBatch, StringArray};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion::execution::context::SessionContext;
use datafusion::execution::memory_pool::{MemoryConsumer, MemoryReservation};
use datafusion::execution::SendableRecordBatchStream;
use datafusion::logical_expr::LogicalPlan;
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::scalar::ScalarValue;
use datafusion::sql::parser::Statement as DFStatement;
use sqlparser::ast::{BinaryOperator, Expr, SelectItem, SetExpr, Statement, TableObject, Value};

use crate::catalog::Stream;
use crate::command::{
    op, Append, CreateStream, CreateTable, DropRelation, Op, OpOutcome, Truncate,
};
use crate::copy;
use crate::definition::{OFFSET_COLUMN, TS_COLUMN};
use crate::engine::Engine;
use crate::error::{sqlstate, Error, Result};
use crate::insert;
use crate::interrupt::{CancelWatch, Interrupt};
use crate::memory::StatementMemory;
use crate::notify::{self, Notification};
use crate::settings::{
    canonical_setting, default_settings, normalize_setting, parse_bool, SessionVars, SharedVars,
};
use crate::statement::{self, sqlparser, CopyFormat, Parsed};
use crate::stream_provider::{with_system_columns, InsertCollector};
use crate::table::TxnTables;
use crate::tail::{self, Tail};
use crate::types::ColumnType;
use futures::StreamExt;
use tokio::sync::{mpsc, watch};

mod cursor;
mod dml;
mod naming;
mod udfs;
mod variables;

use cursor::{no_cursor, CursorEntry};
use naming::{pg_column_names, with_unique_names};
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
}

impl std::fmt::Debug for Output {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Output::Rows { tag, .. } => write!(f, "Rows({tag})"),
            Output::Tag(t) => write!(f, "Tag({t})"),
            Output::CopyIn(c) => write!(f, "CopyIn({})", c.stream.name()),
            Output::CopyOut { .. } => write!(f, "CopyOut"),
        }
    }
}

/// A COPY FROM STDIN waiting for its data.
#[derive(Debug, Clone)]
pub struct PendingCopy {
    pub stream: Arc<Stream>,
    pub targets: Vec<usize>,
    pub format: CopyFormat,
}

impl PendingCopy {
    pub fn columns(&self) -> usize {
        self.targets.len()
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TxnStatus {
    Idle,
    InBlock,
    Failed,
}

#[derive(Debug)]
enum Txn {
    Idle,
    /// Inside BEGIN: writes are buffered until COMMIT.
    Block(Block),
    /// An error aborted the block; only ROLLBACK [TO SAVEPOINT] or COMMIT.
    Failed(Block),
}

#[derive(Debug, Default)]
struct Block {
    ops: Vec<Op>,
    bytes: usize,
    savepoints: Vec<SavepointMark>,
    /// `BEGIN READ ONLY` (or `default_transaction_read_only` at BEGIN, or
    /// `SET TRANSACTION READ ONLY`): writes fail with 25006.
    read_only: bool,
    /// A statement other than transaction control or a setting ran in the
    /// block: it can no longer become read-write.
    used: bool,
}

/// How much of the block (writes, pending notifications) a savepoint keeps.
#[derive(Debug)]
struct SavepointMark {
    name: String,
    ops: usize,
    bytes: usize,
    notifications: usize,
}

/// Position of the newest savepoint called `name` (3B001 if none).
fn savepoint_index(b: &Block, name: &str) -> Result<usize> {
    b.savepoints
        .iter()
        .rposition(|s| s.name == name)
        .ok_or_else(|| {
            Error::new(
                sqlstate::INVALID_SAVEPOINT,
                format!("savepoint \"{name}\" does not exist"),
            )
        })
}

/// Parameter and result description of a prepared statement.
#[derive(Debug, Clone)]
pub struct Description {
    pub params: Vec<Option<ColumnType>>,
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
    listeners: std::collections::HashSet<String>,
    /// Started at the first LISTEN.
    dispatcher: Option<notify::Dispatcher>,
    cursors: HashMap<String, CursorEntry>,
    /// Tails behind row-limited portals of the extended protocol.
    portal_tails: HashMap<usize, Tail>,
    cancel: watch::Receiver<u64>,
    _cancel_tx: watch::Sender<u64>,
    /// The transaction's view of tables (snapshot, own writes, reads).
    tables: Arc<TxnTables>,
    /// The memory pool of this session's plans (see [`crate::memory`]).
    memory: Arc<StatementMemory>,
    /// Set once the running statement has proposed a write that may commit:
    /// from then on it is not interrupted (see [`crate::interrupt`]).
    committing: Arc<AtomicBool>,
}

impl Session {
    pub fn new(engine: Arc<Engine>) -> Result<Session> {
        let vars = Arc::new(parking_lot::RwLock::new(SessionVars {
            user: "sluice".into(),
            database: "sluice".into(),
            settings: default_settings(
                engine.limits.max_statement_memory,
                engine.limits.statement_timeout,
            ),
        }));
        let tables = Arc::new(TxnTables::default());
        let memory = StatementMemory::new(
            engine.limits.max_statement_memory,
            engine.query_memory.clone(),
        );
        let ctx = engine.new_context(vars.clone(), tables.clone(), memory.clone())?;
        crate::value_size::install(&ctx, memory.clone());
        let notify = Arc::new(NotifyState {
            hub: engine.hub.clone(),
            catalog: engine.catalog.clone(),
            pid: AtomicI32::new(0),
            in_block: AtomicBool::new(false),
            pending: parking_lot::Mutex::new(Vec::new()),
        });
        ctx.register_udf(pg_notify_udf(notify.clone()));
        for udf in session_udfs(notify.clone()) {
            ctx.register_udf(udf);
        }
        let (notify_tx, notify_rx) = mpsc::channel(notify::QUEUE_CAPACITY);
        let (cancel_tx, cancel) = watch::channel(0);
        Ok(Session {
            id: engine.next_session_id(),
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
            portal_tails: HashMap::new(),
            cancel,
            _cancel_tx: cancel_tx,
            tables,
            memory,
            committing: Arc::new(AtomicBool::new(false)),
        })
    }

    /// The backend pid clients see in notifications from this session.
    pub fn set_backend_pid(&mut self, pid: i32) {
        self.notify.pid.store(pid, Ordering::Relaxed);
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

    fn tail_wait(&self) -> Duration {
        let text = self.setting("tail_wait").unwrap_or_else(|| "10s".into());
        Duration::from_millis(crate::units::parse_duration_ms(&text).unwrap_or(10_000))
    }

    fn end_block(&mut self, committed: bool) {
        self.notify.in_block.store(false, Ordering::Release);
        let pending = std::mem::take(&mut *self.notify.pending.lock());
        if committed && !pending.is_empty() {
            let watermark = notify::watermark(&self.engine.catalog);
            for n in pending {
                self.engine.hub.publish(&Notification {
                    watermark: Some(watermark.clone()),
                    ..n
                });
            }
        }
        self.cursors.retain(|_, c| c.hold);
        self.portal_tails.clear();
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

    pub fn setting(&self, name: &str) -> Option<String> {
        let vars = self.vars.read();
        if name.chars().any(char::is_uppercase) {
            vars.settings.get(&name.to_lowercase()).cloned()
        } else {
            vars.settings.get(name).cloned()
        }
    }

    /// A setting from the startup packet: also what RESET returns to. An
    /// error if the setting cannot take the value (the connection is refused).
    pub fn set_setting(&mut self, name: &str, value: &str) -> Result<()> {
        let name = canonical_setting(name);
        let value = normalize_setting(&name, value)?;
        if name == crate::memory::SETTING {
            self.check_memory_setting(&value)?;
        }
        self.startup_settings.insert(name.clone(), value.clone());
        self.vars.write().settings.insert(name, value);
        Ok(())
    }

    /// The user and database named at startup (`current_user`,
    /// `current_database()`, the catalogs).
    pub fn set_identity(&mut self, user: &str, database: &str) {
        let mut vars = self.vars.write();
        vars.user = user.to_string();
        vars.database = database.to_string();
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
        for p in &parsed {
            let r = self.execute(p, &[]).await;
            let stop = r.is_err();
            out.push(r);
            if stop {
                break;
            }
        }
        out
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
        let timeout = self
            .setting(crate::interrupt::STATEMENT_TIMEOUT)
            .and_then(|v| crate::interrupt::parse_timeout(&v).ok().flatten());
        Interrupt::new(self.cancel_watch(), timeout)
    }

    /// Brings what settings control up to date before a statement: the
    /// memory limit of its plans, and `transaction_read_only` (what SHOW
    /// and `current_setting` report).
    fn sync_settings(&mut self) {
        let memory = self
            .setting(crate::memory::SETTING)
            .and_then(|v| crate::units::parse_bytes(&v).ok())
            .map_or(usize::MAX, |b| usize::try_from(b).unwrap_or(usize::MAX))
            .min(self.engine.limits.max_statement_memory);
        if memory != self.memory.limit() {
            self.memory.set_limit(memory);
        }
        let read_only = if self.read_only() { "on" } else { "off" };
        if self.setting("transaction_read_only").as_deref() != Some(read_only) {
            self.vars
                .write()
                .settings
                .insert("transaction_read_only".into(), read_only.into());
        }
    }

    /// Whether the current transaction refuses writes: the block's mode, or
    /// outside a block `default_transaction_read_only`.
    fn read_only(&self) -> bool {
        match &self.txn {
            Txn::Block(b) | Txn::Failed(b) => b.read_only,
            Txn::Idle => self.default_read_only(),
        }
    }

    fn default_read_only(&self) -> bool {
        self.setting("default_transaction_read_only")
            .is_some_and(|v| parse_bool(&v) == Some(true))
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

    /// Record a failure (in `execute`, or outside it such as at Parse):
    /// inside a block the block is now aborted.
    pub fn fail_block(&mut self, e: Error) -> Error {
        self.abort_block();
        e
    }

    /// A statement failed after `execute` returned (while its rows were
    /// sent: a cancel, a timeout, an error in the plan): inside a block the
    /// block is now aborted, as in PostgreSQL.
    pub fn abort_block(&mut self) {
        self.txn = match std::mem::replace(&mut self.txn, Txn::Idle) {
            Txn::Block(b) => Txn::Failed(b),
            other => other,
        };
    }

    async fn execute_inner(&mut self, p: &Parsed, params: &[ScalarValue]) -> Result<Output> {
        if let Some(verb) = write_verb(p) {
            if self.read_only() {
                return Err(Error::new(
                    sqlstate::READ_ONLY_SQL_TRANSACTION,
                    format!("cannot execute {verb} in a read-only transaction"),
                ));
            }
        }
        if let Txn::Block(b) = &mut self.txn {
            b.used |= !matches!(
                p,
                Parsed::Begin { .. }
                    | Parsed::Set { .. }
                    | Parsed::Show(_)
                    | Parsed::Reset(_)
                    | Parsed::NoOp(_)
                    | Parsed::Savepoint(_)
            );
        }
        if matches!(
            p,
            Parsed::Query(_) | Parsed::CopyTo { .. } | Parsed::Declare { .. }
        ) && self
            .vars
            .read()
            .settings
            .get("read_consistency")
            .map(String::as_str)
            == Some("linearizable")
        {
            Box::pin(self.engine.read_barrier()).await?;
        }
        match p {
            Parsed::Query(stmt) => Box::pin(self.query(stmt, params)).await,
            Parsed::AlterCluster(change) => {
                if matches!(self.txn, Txn::Block(_)) {
                    return Err(Error::new(
                        sqlstate::ACTIVE_SQL_TRANSACTION,
                        "ALTER CLUSTER cannot run inside a transaction block",
                    ));
                }
                self.committing.store(true, Ordering::Release);
                Box::pin(self.engine.change_membership(change.clone())).await?;
                Ok(Output::Tag("ALTER CLUSTER".into()))
            }
            Parsed::Insert(ins) if self.table(&insert_target(ins)?).is_some() => {
                Box::pin(self.table_dml(p, params)).await
            }
            Parsed::Insert(ins) => self.insert(ins, params).await,
            Parsed::Update(u) => {
                let name = match &u.table.relation {
                    sqlparser::ast::TableFactor::Table { name, .. } => statement::table_name(name),
                    other => other.to_string(),
                };
                if self.table(&name).is_some() {
                    Box::pin(self.table_dml(p, params)).await
                } else if self.engine.catalog.get(&name).is_some() {
                    Err(statement::append_only(&name))
                } else {
                    Err(Error::undefined_table(&name))
                }
            }
            Parsed::CreateTable { def, if_not_exists } => {
                let definition_json =
                    serde_json::to_string(def).map_err(|e| Error::internal(e.to_string()))?;
                let op = Op {
                    kind: Some(op::Kind::CreateTable(CreateTable {
                        name: def.name.clone(),
                        definition_json,
                        if_not_exists: *if_not_exists,
                    })),
                };
                self.propose(vec![op], 0, vec![]).await?;
                Ok(Output::Tag("CREATE TABLE".into()))
            }
            Parsed::CreateStream { def, if_not_exists } => {
                let definition_json =
                    serde_json::to_string(def).map_err(|e| Error::internal(e.to_string()))?;
                let op = Op {
                    kind: Some(op::Kind::CreateStream(CreateStream {
                        name: def.name.clone(),
                        definition_json,
                        if_not_exists: *if_not_exists,
                    })),
                };
                self.propose(vec![op], 0, vec![]).await?;
                Ok(Output::Tag("CREATE STREAM".into()))
            }
            Parsed::DropRelation {
                names,
                if_exists,
                stream,
            } => {
                let ops = names
                    .iter()
                    .map(|n| Op {
                        kind: Some(op::Kind::DropRelation(DropRelation {
                            name: n.clone(),
                            if_exists: *if_exists,
                        })),
                    })
                    .collect();
                self.propose(ops, 0, vec![]).await?;
                Ok(Output::Tag(
                    if *stream { "DROP STREAM" } else { "DROP TABLE" }.into(),
                ))
            }
            Parsed::Delete(d) if self.table(&dml::delete_target(d)?.0).is_some() => {
                Box::pin(self.table_dml(p, params)).await
            }
            Parsed::Delete(d) => Box::pin(self.delete(d)).await,
            Parsed::Begin { read_only } => {
                match self.txn {
                    Txn::Idle => {
                        self.tables.reset();
                        self.txn = Txn::Block(Block {
                            read_only: read_only.unwrap_or_else(|| self.default_read_only()),
                            ..Block::default()
                        });
                        self.notify.in_block.store(true, Ordering::Release);
                    }
                    _ => tracing::debug!("BEGIN inside a transaction block ignored"),
                }
                Ok(Output::Tag("BEGIN".into()))
            }
            Parsed::Commit => match std::mem::replace(&mut self.txn, Txn::Idle) {
                Txn::Block(Block { ops, .. }) => {
                    // a block that only read needs no validation: it saw
                    // one snapshot
                    let result = if ops.is_empty() {
                        Ok(vec![])
                    } else {
                        let snapshot = self.tables.snapshot_index();
                        let reads = self.tables.reads();
                        self.propose(ops, snapshot, reads).await
                    };
                    self.tables.reset();
                    self.end_block(result.is_ok());
                    result.map(|_| Output::Tag("COMMIT".into()))
                }
                Txn::Failed(_) => {
                    self.tables.reset();
                    self.end_block(false);
                    Ok(Output::Tag("ROLLBACK".into()))
                }
                Txn::Idle => Ok(Output::Tag("COMMIT".into())),
            },
            Parsed::Savepoint(name) => {
                let notifications = self.notify.pending.lock().len();
                match &mut self.txn {
                    Txn::Block(b) => {
                        b.savepoints.push(SavepointMark {
                            name: name.clone(),
                            ops: b.ops.len(),
                            bytes: b.bytes,
                            notifications,
                        });
                        Ok(Output::Tag("SAVEPOINT".into()))
                    }
                    _ => Err(Error::new(
                        sqlstate::NO_ACTIVE_SQL_TRANSACTION,
                        "SAVEPOINT can only be used in transaction blocks",
                    )),
                }
            }
            Parsed::ReleaseSavepoint(name) => match &mut self.txn {
                Txn::Block(b) => {
                    let at = savepoint_index(b, name)?;
                    b.savepoints.truncate(at);
                    Ok(Output::Tag("RELEASE".into()))
                }
                _ => Err(Error::new(
                    sqlstate::NO_ACTIVE_SQL_TRANSACTION,
                    "RELEASE SAVEPOINT can only be used in transaction blocks",
                )),
            },
            Parsed::RollbackTo(name) => {
                let mut b = match std::mem::replace(&mut self.txn, Txn::Idle) {
                    Txn::Block(b) | Txn::Failed(b) => b,
                    Txn::Idle => {
                        return Err(Error::new(
                            sqlstate::NO_ACTIVE_SQL_TRANSACTION,
                            "ROLLBACK TO SAVEPOINT can only be used in transaction blocks",
                        ))
                    }
                };
                let at = match savepoint_index(&b, name) {
                    Ok(at) => at,
                    Err(e) => {
                        self.txn = Txn::Failed(b);
                        return Err(e);
                    }
                };
                let mark = &b.savepoints[at];
                let (ops, bytes, notifications) = (mark.ops, mark.bytes, mark.notifications);
                b.ops.truncate(ops);
                b.bytes = bytes;
                b.savepoints.truncate(at + 1);
                if let Err(e) = self.tables.rebuild_overlay(&b.ops) {
                    self.txn = Txn::Failed(b);
                    return Err(e);
                }
                self.notify.pending.lock().truncate(notifications);
                self.txn = Txn::Block(b);
                Ok(Output::Tag("ROLLBACK".into()))
            }
            Parsed::Rollback => {
                self.txn = Txn::Idle;
                self.tables.reset();
                self.end_block(false);
                Ok(Output::Tag("ROLLBACK".into()))
            }
            Parsed::CopyTo { query, format } => {
                Box::pin(self.copy_to(query, format.clone(), params)).await
            }
            Parsed::Declare { name, query, hold } => {
                if !hold && matches!(self.txn, Txn::Idle) {
                    return Err(Error::new(
                        sqlstate::NO_ACTIVE_SQL_TRANSACTION,
                        "DECLARE CURSOR can only be used in transaction blocks",
                    ));
                }
                if self.cursors.contains_key(name) {
                    return Err(Error::new(
                        sqlstate::DUPLICATE_CURSOR,
                        format!("cursor \"{name}\" already exists"),
                    ));
                }
                let cursor = Box::pin(self.open_cursor(query, params)).await?;
                self.cursors.insert(
                    name.clone(),
                    CursorEntry {
                        cursor,
                        hold: *hold,
                    },
                );
                Ok(Output::Tag("DECLARE CURSOR".into()))
            }
            Parsed::Fetch { name, count } => Box::pin(self.fetch(name, *count)).await,
            Parsed::Close(name) => match name {
                None => {
                    self.cursors.clear();
                    Ok(Output::Tag("CLOSE CURSOR ALL".into()))
                }
                Some(n) => match self.cursors.remove(n) {
                    Some(_) => Ok(Output::Tag("CLOSE CURSOR".into())),
                    None => Err(no_cursor(n)),
                },
            },
            Parsed::Listen(channel) => {
                if !self.listeners.contains(channel) {
                    let dispatcher = self.dispatcher.get_or_insert_with(|| {
                        notify::Dispatcher::start(
                            self.engine.catalog.clone(),
                            self.notify_tx.clone(),
                        )
                    });
                    self.engine
                        .hub
                        .subscribe(channel, self.id, dispatcher.inbox.clone());
                    if let Some(stream) = self.engine.catalog.get(channel) {
                        dispatcher.control(notify::Control::Follow(stream));
                    }
                    self.listeners.insert(channel.clone());
                }
                Ok(Output::Tag("LISTEN".into()))
            }
            Parsed::Unlisten(channel) => {
                match channel {
                    Some(c) => {
                        self.engine.hub.unsubscribe(c, self.id);
                        if self.listeners.remove(c) {
                            if let Some(d) = &self.dispatcher {
                                d.control(notify::Control::Unfollow(c.clone()));
                            }
                        }
                    }
                    None => self.unlisten_all(),
                }
                Ok(Output::Tag("UNLISTEN".into()))
            }
            Parsed::Notify { channel, payload } => {
                if payload.len() >= notify::MAX_PAYLOAD {
                    return Err(Error::new(
                        sqlstate::INVALID_PARAMETER_VALUE,
                        "payload string too long",
                    ));
                }
                self.notify.send(channel.clone(), payload.clone());
                Ok(Output::Tag("NOTIFY".into()))
            }
            Parsed::Set { name, value } => {
                self.set(name, value)?;
                Ok(Output::Tag("SET".into()))
            }
            Parsed::Show(name) => self.show(name),
            Parsed::ShowStreams => {
                let stmt = statement::parse(
                    "SELECT name, first_offset, next_offset, bytes, segments FROM sluice_streams ORDER BY name",
                )?;
                match &stmt[0] {
                    Parsed::Query(q) => Box::pin(self.query(q, &[])).await.map(|o| match o {
                        Output::Rows { schema, stream, .. } => Output::Rows {
                            schema,
                            stream,
                            tag: "SHOW".into(),
                        },
                        other => other,
                    }),
                    _ => Err(Error::internal(
                        "SHOW STREAMS query did not parse as a query",
                    )),
                }
            }
            Parsed::Reset(name) => {
                // back to the value the session started with (startup
                // parameters), else the default
                let mut reset = default_settings(
                    self.engine.limits.max_statement_memory,
                    self.engine.limits.statement_timeout,
                );
                reset.extend(self.startup_settings.clone());
                let mut vars = self.vars.write();
                match name {
                    None => vars.settings = reset,
                    Some(n) => {
                        let n = canonical_setting(n);
                        match reset.get(&n) {
                            Some(v) => {
                                vars.settings.insert(n, v.clone());
                            }
                            None => {
                                vars.settings.remove(&n);
                            }
                        }
                    }
                }
                Ok(Output::Tag("RESET".into()))
            }
            Parsed::NoOp(tag) => Ok(Output::Tag((*tag).into())),
            Parsed::Discard => {
                if !matches!(self.txn, Txn::Idle) {
                    return Err(Error::new(
                        sqlstate::ACTIVE_SQL_TRANSACTION,
                        "DISCARD ALL cannot run inside a transaction block",
                    ));
                }
                for p in [
                    Parsed::Close(None),
                    Parsed::Unlisten(None),
                    Parsed::Reset(None),
                ] {
                    Box::pin(self.execute_inner(&p, &[])).await?;
                }
                Ok(Output::Tag("DISCARD ALL".into()))
            }
            Parsed::CopyFrom(c) => {
                let stream = self.stream(&c.stream)?;
                let targets = target_columns(&stream, &c.columns)?;
                let pending = PendingCopy {
                    stream,
                    targets,
                    format: c.format.clone(),
                };
                match &c.inline {
                    Some(data) => self.finish_copy(pending, data.as_bytes()).await,
                    None => Ok(Output::CopyIn(pending)),
                }
            }
            Parsed::Refused(e) => Err(e.clone()),
        }
    }

    fn stream(&self, name: &str) -> Result<Arc<Stream>> {
        self.engine
            .catalog
            .get(name)
            .ok_or_else(|| Error::undefined_table(name))
    }

    /// Plan a statement with DataFusion in this session's context: a small one here, a big
    /// one on the query runtime ([`crate::executor::plans_in_place`]): a statement thousands
    /// of terms long or hundreds of set operations deep takes seconds to plan, which must
    /// not hold up the connection thread's other clients.
    async fn plan(&self, stmt: &Statement) -> Result<LogicalPlan> {
        Ok(self.plan_reserved(stmt).await?.0)
    }

    /// [`Session::plan`], with the memory the plan's making may take reserved from the
    /// statement's and the server's limits ([`crate::executor::planning_bytes`]; `53200`
    /// when they have no room); the reservation is the caller's to hold until the plan has
    /// also been optimized and started.
    async fn plan_reserved(&self, stmt: &Statement) -> Result<(LogicalPlan, MemoryReservation)> {
        let reservation = MemoryConsumer::new("planning a statement")
            .register(&self.ctx.runtime_env().memory_pool);
        reservation.try_grow(crate::executor::planning_bytes(stmt))?;
        let state = self.ctx.state();
        let in_place = crate::executor::plans_in_place(stmt);
        let stmt = DFStatement::Statement(Box::new(with_unique_names(stmt)));
        if in_place {
            return Ok((state.statement_to_plan(stmt).await?, reservation));
        }
        let planning = async move { state.statement_to_plan(stmt).await };
        let plan = crate::executor::run_on(self.engine.query_runtime.as_ref(), planning).await??;
        Ok((plan, reservation))
    }

    async fn query(&mut self, stmt: &Statement, params: &[ScalarValue]) -> Result<Output> {
        // held until the plan is optimized and started (`execute_stream` below)
        let (mut plan, _planning) = self.plan_reserved(stmt).await?;
        if !params.is_empty() {
            plan = plan.with_param_values(params.to_vec())?;
        }
        // A plain scan (no aggregation, join or window) returns rows in
        // offset order, as a log reader expects even without ORDER BY:
        // don't split it round-robin across partitions.
        use datafusion::common::tree_node::TreeNode;
        let spread = plan.exists(|p| {
            Ok(matches!(
                p,
                LogicalPlan::Aggregate(_) | LogicalPlan::Join(_) | LogicalPlan::Window(_)
            ))
        })?;
        self.ctx
            .state_ref()
            .write()
            .config_mut()
            .options_mut()
            .optimizer
            .enable_round_robin_repartition = spread;
        let df = self.ctx.execute_logical_plan(plan).await?;
        let schema = pg_column_names(stmt, df.schema().as_arrow());
        let stream =
            crate::executor::execute_stream(self.engine.query_runtime.as_ref(), df).await?;
        Ok(Output::Rows {
            schema,
            stream,
            tag: "SELECT".into(),
        })
    }

    /// Describe a statement for the extended protocol: parameter types
    /// (inferred where the client left them open) and result columns.
    pub async fn describe(&self, p: &Parsed) -> Result<Description> {
        match p {
            Parsed::Refused(e) => Err(e.clone()),
            Parsed::Insert(ins) if self.table(&insert_target(ins)?).is_some() => {
                let name = insert_target(ins)?;
                let table = self
                    .table(&name)
                    .ok_or_else(|| Error::undefined_table(&name))?;
                let targets = dml::table_targets(&table, ins)?;
                let types: Vec<ColumnType> = targets.iter().map(|&t| table.types[t]).collect();
                let mut params = Vec::new();
                if let Some(rows) = values_rows(ins) {
                    insert::infer_param_types(&rows, &types, &mut params);
                }
                let schema = match &ins.returning {
                    Some(items) => Some(self.table_returning_schema(&table, &name, items).await?),
                    None => None,
                };
                Ok(Description { params, schema })
            }
            Parsed::Update(u) => {
                let name = match &u.table.relation {
                    sqlparser::ast::TableFactor::Table { name, .. } => statement::table_name(name),
                    other => other.to_string(),
                };
                if self.table(&name).is_none() {
                    return Err(if self.engine.catalog.get(&name).is_some() {
                        statement::append_only(&name)
                    } else {
                        Error::undefined_table(&name)
                    });
                }
                self.describe_table_change(p).await
            }
            Parsed::Delete(d) if self.table(&dml::delete_target(d)?.0).is_some() => {
                self.describe_table_change(p).await
            }
            Parsed::Delete(d) => {
                let (name, _) = truncation_target(d)?;
                self.stream(&name)?;
                Ok(Description {
                    params: vec![],
                    schema: None,
                })
            }
            Parsed::Query(stmt) => {
                let plan = self.plan(stmt).await?;
                // fields, not just types: a parameter compared with a column
                // carries its `pg_type` (json, uuid, varchar(n), ...)
                let mut params = Vec::new();
                planned_param_types(&plan, stmt, &mut params)?;
                let schema = pg_column_names(stmt, plan.schema().as_arrow());
                Ok(Description {
                    params,
                    schema: Some(schema),
                })
            }
            Parsed::Insert(ins) => {
                let stream = self.stream(&insert_target(ins)?)?;
                let targets = insert_targets(&stream, ins)?;
                let types: Vec<ColumnType> =
                    targets.iter().map(|&t| stream.def.columns[t].ty).collect();
                let mut params = Vec::new();
                if let Some(rows) = values_rows(ins) {
                    insert::infer_param_types(&rows, &types, &mut params);
                }
                let schema = match &ins.returning {
                    Some(items) => Some(self.returning_schema(&stream, items).await?),
                    None => None,
                };
                Ok(Description { params, schema })
            }
            Parsed::Show(name) => Ok(Description {
                params: vec![],
                schema: Some(Arc::new(Schema::new(vec![Field::new(
                    canonical_setting(name),
                    DataType::Utf8,
                    true,
                )]))),
            }),
            Parsed::Fetch { name, .. } => Ok(Description {
                params: vec![],
                schema: self.cursor_schema(name),
            }),
            Parsed::ShowStreams => {
                let stmt = statement::parse(
                    "SELECT name, first_offset, next_offset, bytes, segments FROM sluice_streams",
                )?;
                Box::pin(self.describe(&stmt[0])).await
            }
            _ => Ok(Description {
                params: vec![],
                schema: None,
            }),
        }
    }

    async fn insert(
        &mut self,
        ins: &sqlparser::ast::Insert,
        params: &[ScalarValue],
    ) -> Result<Output> {
        if ins.on.is_some() {
            return Err(Error::unsupported(
                "ON CONFLICT is not supported on a stream (streams have no keys)",
            ));
        }
        let stream = self.stream(&insert_target(ins)?)?;
        let targets = insert_targets(&stream, ins)?;
        let max_row = self.engine.limits.max_row_bytes;
        let batch = match self.fast_values(&stream, &targets, ins, params)? {
            Some(b) => b,
            None => Box::pin(self.planned_insert(&stream, ins, params)).await?,
        };
        let rows = batch.num_rows();
        if rows == 0 {
            return Ok(Output::Tag("INSERT 0 0".into()));
        }
        let _ = max_row;
        let outcome = self.append(&stream, &batch).await?;
        // duplicates of a dedup stream are not appended (nor counted)
        let appended = outcome.as_ref().map(|o| o.rows as usize).unwrap_or(rows);
        match &ins.returning {
            None => Ok(Output::Tag(format!("INSERT 0 {appended}"))),
            Some(items) => {
                let Some(o) = outcome else {
                    return Err(Error::unsupported(
                        "RETURNING inside a transaction block is not supported yet: offsets are assigned at COMMIT",
                    ));
                };
                let full = if o.row_offsets.is_empty() {
                    with_system_columns(&stream, &batch, o.base_offset, o.ts_micros)?
                } else {
                    with_row_offsets(&stream, &batch, &o.row_offsets)?
                };
                Box::pin(self.returning(&stream, full, items)).await
            }
        }
    }

    /// VALUES of literals and parameters, evaluated without a planner.
    fn fast_values(
        &self,
        stream: &Stream,
        targets: &[usize],
        ins: &sqlparser::ast::Insert,
        params: &[ScalarValue],
    ) -> Result<Option<RecordBatch>> {
        let Some(rows) = values_rows(ins) else {
            return Ok(None);
        };
        let mut out = Vec::with_capacity(rows.len());
        for row in rows {
            if row.len() != targets.len() {
                return Err(Error::syntax(if row.len() > targets.len() {
                    "INSERT has more expressions than target columns"
                } else {
                    "INSERT has more target columns than expressions"
                }));
            }
            let mut vals = Vec::with_capacity(row.len());
            for (e, &t) in row.iter().zip(targets) {
                let ty = stream.def.columns[t].ty;
                match insert::eval_simple(e, ty, params) {
                    Some(v) => vals.push(ty.coerce(v?)?),
                    None => return Ok(None),
                }
            }
            out.push(vals);
        }
        Ok(Some(insert::build_batch(
            stream,
            targets,
            out,
            self.engine.limits.max_row_bytes,
        )?))
    }

    /// INSERT whose rows need planning (INSERT ... SELECT, expressions).
    async fn planned_insert(
        &self,
        stream: &Arc<Stream>,
        ins: &sqlparser::ast::Insert,
        params: &[ScalarValue],
    ) -> Result<RecordBatch> {
        let mut ins = ins.clone();
        ins.returning = None;
        if ins.columns.is_empty() {
            ins.columns = stream
                .def
                .columns
                .iter()
                .map(|c| {
                    sqlparser::ast::ObjectName::from(vec![sqlparser::ast::Ident::with_quote(
                        '"',
                        c.name.clone(),
                    )])
                })
                .collect();
        }
        let mut state = self.ctx.state();
        let collector = Arc::new(InsertCollector::default());
        state.config_mut().set_extension(collector.clone());
        let mut plan = state
            .statement_to_plan(DFStatement::Statement(Box::new(Statement::Insert(ins))))
            .await?;
        if !params.is_empty() {
            plan = plan.with_param_values(params.to_vec())?;
        }
        let physical = state.create_physical_plan(&plan).await?;
        datafusion::physical_plan::collect(physical, state.task_ctx()).await?;
        let mut batches = Vec::new();
        for (s, b) in collector.take() {
            if s.def.id != stream.def.id {
                return Err(Error::internal("INSERT produced rows for another stream"));
            }
            batches.push(insert::from_planned(
                stream,
                &b,
                self.engine.limits.max_row_bytes,
            )?);
        }
        insert::concat(stream, &batches)
    }

    /// Propose an append now, or buffer it in the open block. Returns
    /// where the rows went when it committed now.
    async fn append(
        &mut self,
        stream: &Arc<Stream>,
        batch: &RecordBatch,
    ) -> Result<Option<Appended>> {
        let ipc = if *batch.schema() == *stream.user_schema {
            crate::ipc::encode_ipc_with(stream.ipc_schema()?, batch)?
        } else {
            crate::ipc::encode_ipc(batch)?
        };
        let op = Op {
            kind: Some(op::Kind::Append(Append {
                stream: stream.name().to_string(),
                stream_id: stream.def.id,
                rows: batch.num_rows() as u32,
                ipc,
            })),
        };
        match &mut self.txn {
            Txn::Block(Block { ops, bytes, .. }) => {
                let size = match &op.kind {
                    Some(op::Kind::Append(a)) => a.ipc.len(),
                    _ => 0,
                };
                if *bytes + size > self.engine.limits.max_statement_bytes {
                    return Err(Error::new(
                        sqlstate::PROGRAM_LIMIT_EXCEEDED,
                        format!(
                            "transaction block exceeds the maximum of {} bytes of writes (max_statement_bytes)",
                            self.engine.limits.max_statement_bytes
                        ),
                    ));
                }
                *bytes += size;
                ops.push(op);
                self.tables.record_append(stream.def.id, batch.clone());
                Ok(None)
            }
            _ => {
                let outcomes = self.propose(vec![op], 0, vec![]).await?;
                match outcomes.into_iter().next() {
                    Some(OpOutcome::Appended {
                        base_offset,
                        ts_micros,
                        rows,
                        row_offsets,
                        ..
                    }) => Ok(Some(Appended {
                        base_offset,
                        ts_micros,
                        rows,
                        row_offsets,
                    })),
                    _ => Err(Error::internal("append produced no outcome")),
                }
            }
        }
    }

    async fn returning(
        &self,
        stream: &Stream,
        full: RecordBatch,
        items: &[SelectItem],
    ) -> Result<Output> {
        let ctx = SessionContext::new();
        let table = datafusion::datasource::MemTable::try_new(
            stream.full_schema.clone(),
            vec![vec![full]],
        )?;
        ctx.register_table("returning_rows", Arc::new(table))?;
        let sql = format!("SELECT {} FROM returning_rows", returning_list(items));
        let parsed = statement::parse(&sql)?;
        let Some(Parsed::Query(q)) = parsed.first() else {
            return Err(Error::internal("RETURNING did not parse"));
        };
        let plan = ctx
            .state()
            .statement_to_plan(DFStatement::Statement(q.clone()))
            .await?;
        let df = ctx.execute_logical_plan(plan).await?;
        let schema: SchemaRef = Arc::new(df.schema().as_arrow().clone());
        let batches = df.collect().await?;
        Ok(Output::Rows {
            schema: schema.clone(),
            stream: batches_stream(schema, batches),
            tag: "INSERT 0".into(),
        })
    }

    async fn returning_schema(&self, stream: &Stream, items: &[SelectItem]) -> Result<SchemaRef> {
        let ctx = SessionContext::new();
        let table =
            datafusion::datasource::MemTable::try_new(stream.full_schema.clone(), vec![vec![]])?;
        ctx.register_table("returning_rows", Arc::new(table))?;
        let sql = format!("SELECT {} FROM returning_rows", returning_list(items));
        let parsed = statement::parse(&sql)?;
        let Some(Parsed::Query(q)) = parsed.first() else {
            return Err(Error::internal("RETURNING did not parse"));
        };
        let plan = ctx
            .state()
            .statement_to_plan(DFStatement::Statement(q.clone()))
            .await?;
        Ok(Arc::new(plan.schema().as_arrow().clone()))
    }

    /// `DELETE FROM s WHERE offset < n` drops a prefix; any other DELETE is refused.
    async fn delete(&mut self, d: &sqlparser::ast::Delete) -> Result<Output> {
        let (name, before) = truncation_target(d)?;
        let stream = self.stream(&name)?;

        if !matches!(self.txn, Txn::Idle) {
            return Err(Error::new(
                sqlstate::ACTIVE_SQL_TRANSACTION,
                "prefix truncation cannot run inside a transaction block",
            ));
        }
        let first_before = stream.log.first_offset();
        let op = Op {
            kind: Some(op::Kind::Truncate(Truncate {
                stream: name,
                stream_id: stream.def.id,
                before,
            })),
        };
        let outcomes = self.propose(vec![op], 0, vec![]).await?;
        let removed = match outcomes.first() {
            Some(OpOutcome::Truncated { first_offset }) => {
                first_offset.saturating_sub(first_before)
            }
            _ => 0,
        };
        Ok(Output::Tag(format!("DELETE {removed}")))
    }

    /// Parse COPY data and append it as one command (or into the block).
    pub async fn finish_copy(&mut self, copy: PendingCopy, data: &[u8]) -> Result<Output> {
        let r = self.finish_copy_inner(copy, data).await;
        r.map_err(|e| self.fail_block(e))
    }

    async fn finish_copy_inner(&mut self, copy: PendingCopy, data: &[u8]) -> Result<Output> {
        if data.len() > self.engine.limits.max_copy_bytes {
            return Err(Error::new(
                sqlstate::PROGRAM_LIMIT_EXCEEDED,
                format!(
                    "COPY data exceeds the maximum of {} bytes (max_copy_bytes)",
                    self.engine.limits.max_copy_bytes
                ),
            ));
        }
        if matches!(copy.format, CopyFormat::Binary) {
            let rows = crate::binary::copy_rows(data)?;
            let values = copy_values(&copy, rows, crate::binary::decode)?;
            return self.append_copied(&copy, values).await;
        }
        let text = std::str::from_utf8(data).map_err(|_| {
            Error::new(
                sqlstate::CHARACTER_NOT_IN_REPERTOIRE,
                "invalid byte sequence for encoding \"UTF8\"",
            )
        })?;
        let rows = copy::parse_rows(text, &copy.format)?;
        let values = copy_values(&copy, rows, |ty, text: String| ty.parse_text(&text))?;
        self.append_copied(&copy, values).await
    }

    async fn append_copied(
        &mut self,
        copy: &PendingCopy,
        values: Vec<Vec<ScalarValue>>,
    ) -> Result<Output> {
        let n = values.len();
        if n == 0 {
            return Ok(Output::Tag("COPY 0".into()));
        }
        let batch = insert::build_batch(
            &copy.stream,
            &copy.targets,
            values,
            self.engine.limits.max_row_bytes,
        )?;
        self.append(&copy.stream, &batch).await?;
        Ok(Output::Tag(format!("COPY {n}")))
    }

    fn unlisten_all(&mut self) {
        self.engine.hub.unsubscribe_all(self.id);
        self.listeners.clear();
        // dropping the dispatcher stops it and its stream followers
        self.dispatcher = None;
    }
}

/// Fill the still-unknown parameter types from a plan (a parameter
/// compared with a column carries its `pg_type`: json, uuid, varchar(n),
/// ...) and from `$n::type` casts in the statement.
fn planned_param_types(
    plan: &LogicalPlan,
    stmt: &Statement,
    params: &mut Vec<Option<ColumnType>>,
) -> Result<()> {
    for (name, field) in plan.get_parameter_fields()? {
        if let Ok(i @ 1..) = name.trim_start_matches('$').parse::<usize>() {
            if params.len() < i {
                params.resize(i, None);
            }
            if params[i - 1].is_none() {
                params[i - 1] = field.as_deref().and_then(ColumnType::of_field);
            }
        }
    }
    for (i, t) in statement::cast_param_types(stmt) {
        if let Some(slot @ None) = params.get_mut(i.wrapping_sub(1)) {
            *slot = Some(t);
        }
    }
    Ok(())
}

/// Where a committed append put its rows.
struct Appended {
    base_offset: u64,
    ts_micros: i64,
    /// Rows appended (duplicates of a dedup stream are not).
    rows: u32,
    /// Per input row (offset, ts), for dedup streams.
    row_offsets: Vec<(u64, i64)>,
}

/// The input rows with the `offset` and `ts` each got (its own, or the
/// original's for a duplicate).
fn with_row_offsets(
    stream: &Stream,
    user: &RecordBatch,
    row_offsets: &[(u64, i64)],
) -> Result<RecordBatch> {
    use arrow::array::{ArrayRef, Int64Array, TimestampMicrosecondArray};
    let offsets: ArrayRef = Arc::new(Int64Array::from_iter_values(
        row_offsets.iter().map(|(o, _)| *o as i64),
    ));
    let tss: ArrayRef = Arc::new(
        TimestampMicrosecondArray::from_iter_values(row_offsets.iter().map(|(_, t)| *t))
            .with_timezone("UTC"),
    );
    let mut cols = vec![offsets, tss];
    cols.extend(user.columns().iter().cloned());
    Ok(RecordBatch::try_new(stream.full_schema.clone(), cols)?)
}

/// What a read-only transaction refuses, by the name its error gives.
fn write_verb(p: &Parsed) -> Option<&'static str> {
    Some(match p {
        Parsed::Insert(_) => "INSERT",
        Parsed::Update(_) => "UPDATE",
        Parsed::Delete(_) => "DELETE",
        Parsed::CopyFrom(_) => "COPY FROM",
        Parsed::CreateStream { .. } => "CREATE STREAM",
        Parsed::CreateTable { .. } => "CREATE TABLE",
        Parsed::DropRelation { stream: true, .. } => "DROP STREAM",
        Parsed::DropRelation { .. } => "DROP TABLE",
        Parsed::AlterCluster(_) => "ALTER CLUSTER",
        _ => return None,
    })
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

fn insert_target(ins: &sqlparser::ast::Insert) -> Result<String> {
    match &ins.table {
        TableObject::TableName(n) => Ok(statement::table_name(n)),
        other => Err(Error::unsupported(format!(
            "INSERT INTO {other} is not supported"
        ))),
    }
}

/// Indices (into the user columns) the INSERT's column list names, in order.
fn insert_targets(stream: &Stream, ins: &sqlparser::ast::Insert) -> Result<Vec<usize>> {
    let names: Vec<String> = ins
        .columns
        .iter()
        .map(|c| {
            c.0.last()
                .and_then(|p| p.as_ident())
                .map(statement::normalize_ident)
                .unwrap_or_default()
        })
        .collect();
    target_columns(stream, &names)
}

fn target_columns(stream: &Stream, names: &[String]) -> Result<Vec<usize>> {
    column_positions(&stream.def.columns, stream.name(), names, |n| {
        if n == OFFSET_COLUMN || n == TS_COLUMN {
            return Err(Error::new(
                sqlstate::GENERATED_ALWAYS,
                format!("cannot insert a non-DEFAULT value into column \"{n}\""),
            )
            .with_detail(format!(
                "Column \"{n}\" is a system column assigned at commit."
            )));
        }
        Ok(())
    })
}

/// Positions of the named columns of a relation (all of them if `names` is
/// empty), each at most once; `check` vets each name first.
fn column_positions(
    columns: &[crate::definition::ColumnDef],
    relation: &str,
    names: &[String],
    check: impl Fn(&str) -> Result<()>,
) -> Result<Vec<usize>> {
    if names.is_empty() {
        return Ok((0..columns.len()).collect());
    }
    let mut out = Vec::with_capacity(names.len());
    for n in names {
        check(n)?;
        let i = columns.iter().position(|c| &c.name == n).ok_or_else(|| {
            Error::new(
                sqlstate::UNDEFINED_COLUMN,
                format!("column \"{n}\" of relation \"{relation}\" does not exist"),
            )
        })?;
        if out.contains(&i) {
            return Err(Error::new(
                sqlstate::DUPLICATE_COLUMN,
                format!("column \"{n}\" specified more than once"),
            ));
        }
        out.push(i);
    }
    Ok(out)
}

fn values_rows(ins: &sqlparser::ast::Insert) -> Option<Vec<&Vec<Expr>>> {
    let q = ins.source.as_ref()?;
    if q.with.is_some() || q.order_by.is_some() || q.limit_clause.is_some() {
        return None;
    }
    match q.body.as_ref() {
        SetExpr::Values(v) => Some(v.rows.iter().map(|r| &r.content).collect()),
        _ => None,
    }
}

fn returning_list(items: &[SelectItem]) -> String {
    items
        .iter()
        .map(|i| i.to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

fn literal_u64(e: &Expr) -> Option<u64> {
    match e {
        Expr::Value(v) => match &v.value {
            Value::Number(n, _) => n.parse().ok(),
            _ => None,
        },
        Expr::Nested(inner) => literal_u64(inner),
        _ => None,
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        self.unlisten_all();
    }
}

/// Typed rows from COPY fields (`None` = NULL), decoded per format; an
/// error names the COPY line.
fn copy_values<F>(
    copy: &PendingCopy,
    rows: Vec<Vec<Option<F>>>,
    decode: impl Fn(ColumnType, F) -> Result<ScalarValue>,
) -> Result<Vec<Vec<ScalarValue>>> {
    let line = |i: usize| format!("COPY {}, line {}", copy.stream.name(), i + 1);
    rows.into_iter()
        .enumerate()
        .map(|(i, row)| {
            if row.len() != copy.targets.len() {
                let msg = if row.len() < copy.targets.len() {
                    "missing data for column"
                } else {
                    "extra data after last expected column"
                };
                return Err(
                    Error::new(sqlstate::INVALID_TEXT_REPRESENTATION, msg).with_detail(line(i))
                );
            }
            row.into_iter()
                .zip(&copy.targets)
                .map(|(f, &t)| {
                    let ty = copy.stream.def.columns[t].ty;
                    match f {
                        None => ty.coerce(ScalarValue::Null),
                        Some(v) => decode(ty, v).and_then(|v| ty.coerce(v)),
                    }
                    .map_err(|e| e.with_detail(line(i)))
                })
                .collect()
        })
        .collect()
}

/// `DELETE FROM s WHERE offset < n` (or `<= n`): the stream and the first
/// offset to keep. Any other DELETE is refused: streams are append-only.
fn truncation_target(d: &sqlparser::ast::Delete) -> Result<(String, u64)> {
    let tables = match &d.from {
        sqlparser::ast::FromTable::WithFromKeyword(t)
        | sqlparser::ast::FromTable::WithoutKeyword(t) => t,
    };
    let name = match tables.first().map(|t| &t.relation) {
        Some(sqlparser::ast::TableFactor::Table { name, .. }) => statement::table_name(name),
        _ => return Err(Error::syntax("DELETE needs a stream name")),
    };
    let before = match &d.selection {
        Some(Expr::BinaryOp { left, op, right }) => match (left.as_ref(), op, right.as_ref()) {
            (Expr::Identifier(id), BinaryOperator::Lt, v)
                if statement::normalize_ident(id) == OFFSET_COLUMN =>
            {
                literal_u64(v)
            }
            (Expr::Identifier(id), BinaryOperator::LtEq, v)
                if statement::normalize_ident(id) == OFFSET_COLUMN =>
            {
                literal_u64(v).map(|n| n + 1)
            }
            _ => None,
        },
        _ => None,
    };
    match before {
        Some(before) => Ok((name, before)),
        None => Err(statement::append_only(&name)),
    }
}
