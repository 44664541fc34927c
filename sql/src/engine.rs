//! The engine: everything sessions share — the catalog, the Raft node that
//! orders writes, limits, counters, and the DataFusion catalog wiring.
//!
//! Writes reach storage only through [`Engine::propose`]: a command is
//! proposed to the Raft group and the call returns once it is committed
//! (fsynced in the log) and applied, with the apply result. Commit times are
//! assigned here, on the proposing node, and never decrease.

use std::path::PathBuf;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;

use arrow::array::{Int64Array, RecordBatch, StringArray};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use async_trait::async_trait;
use datafusion::catalog::{CatalogProvider, MemoryCatalogProvider, SchemaProvider};
use datafusion::datasource::{MemTable, TableProvider};
use datafusion::error::Result as DFResult;
use datafusion::execution::context::SessionContext;
use datafusion::prelude::SessionConfig;
use sluice_consensus::{Membership, NodeConfig, NodeHandle, ProposeError};

use crate::apply::{ApplyStats, Database};
use crate::block_catalog::BlockCatalog;
use crate::catalog::Catalog;
use crate::command::{Command, CommandResult, Op, OpOutcome, TableRead};
use crate::error::{sqlstate, Error, Result};
use crate::stream_provider::StreamTable;
use crate::table::provider::TableScan;
use crate::table::store::TableStore;
use crate::table::TxnTables;

/// DataFusion catalog and schema names Sluice uses.
pub const CATALOG_NAME: &str = "sluice";
pub const SCHEMA_NAME: &str = "public";

/// Explicit limits; every one is reported with a clear error when exceeded.
#[derive(Debug, Clone)]
pub struct Limits {
    /// Largest row accepted (bytes of its values).
    pub max_row_bytes: usize,
    /// Largest statement text, and largest write command (bytes).
    pub max_statement_bytes: usize,
    /// Largest COPY FROM payload held in memory and committed as one command (into a
    /// table, in a transaction block, binary, or into a stream with a `dedup_key`), and the
    /// most a staged COPY buffers while looking for a row's end.
    pub max_copy_bytes: usize,
    /// A staged COPY (see `session/copy_from.rs`) is cut into chunks of about this much data.
    pub copy_chunk_bytes: usize,
    /// Largest COPY FROM staged in chunks.
    pub max_staged_copy_bytes: u64,
    /// A staged COPY with no chunk for this long is aborted (its client or node is gone).
    pub copy_idle_timeout: std::time::Duration,
    /// Memory a running statement may reserve (see [`crate::memory`]); a session may
    /// lower it for itself (`SET max_statement_memory`).
    pub max_statement_memory: usize,
    /// Memory all running statements together may reserve (`max_query_memory`).
    pub max_query_memory: usize,
    /// Spill space of all running statements together, in `<data dir>/spill`.
    pub max_spill_bytes: u64,
    /// Every session's `statement_timeout` until it sets its own; `None` is off.
    pub statement_timeout: Option<std::time::Duration>,
    /// Every session's `log_min_duration_statement` (a superuser may set
    /// another); `None` logs no statement.
    pub log_min_duration: Option<std::time::Duration>,
}

impl Limits {
    /// The limits that are also every session's first settings.
    pub fn setting_defaults(&self) -> crate::settings::SettingDefaults {
        crate::settings::SettingDefaults {
            max_statement_memory: self.max_statement_memory,
            statement_timeout: self.statement_timeout,
            log_min_duration: self.log_min_duration,
        }
    }
}

impl Default for Limits {
    fn default() -> Self {
        let memory = crate::memory::default_statement_memory();
        Limits {
            max_row_bytes: 1 << 20,
            max_statement_bytes: 64 << 20,
            max_copy_bytes: 256 << 20,
            copy_chunk_bytes: 8 << 20,
            max_staged_copy_bytes: 64 << 30,
            copy_idle_timeout: std::time::Duration::from_secs(600),
            max_statement_memory: memory,
            max_query_memory: crate::memory::default_query_memory(),
            max_spill_bytes: 2 * memory as u64,
            statement_timeout: None,
            log_min_duration: None,
        }
    }
}

#[derive(Debug, Clone)]
pub struct EngineConfig {
    pub data_dir: PathBuf,
    pub node: NodeConfig,
    pub limits: Limits,
    pub segment_bytes: u64,
    /// Where query plans run (see [`crate::executor`]); `None` runs them
    /// on the caller's runtime.
    pub query_runtime: Option<tokio::runtime::Handle>,
    /// The bootstrap superuser's name (`--superuser`): the owner of what no role owns, as
    /// the catalogs show it.
    pub superuser: String,
}

impl EngineConfig {
    pub fn single_node(data_dir: PathBuf) -> EngineConfig {
        EngineConfig {
            node: NodeConfig::single(1, data_dir.join("raft")),
            data_dir,
            limits: Limits::default(),
            segment_bytes: 64 << 20,
            query_runtime: None,
            superuser: "sluice".into(),
        }
    }
}

pub struct Engine {
    pub catalog: Arc<Catalog>,
    /// LISTEN/NOTIFY routing between sessions.
    pub hub: Arc<crate::notify::Hub>,
    sessions: std::sync::atomic::AtomicU64,
    /// Sessions open now (each connection's, and the metrics endpoint's own).
    pub(crate) open_sessions: AtomicI64,
    /// Prefix truncations retention made on this node (as leader).
    pub(crate) retention_cuts: std::sync::atomic::AtomicU64,
    pub limits: Limits,
    node: NodeHandle<CommandResult>,
    apply_stats: Arc<ApplyStats>,
    last_ts: AtomicI64,
    system: crate::system::SystemCatalog,
    /// Table rows, read through each session's transaction view.
    pub tables: Arc<TableStore>,
    /// Hidden row ids of tables without a primary key: node id in the high
    /// bits, so ids from different nodes never meet.
    row_ids: std::sync::atomic::AtomicU64,
    /// Held by a statement outside a block while it retries after losing
    /// a serialization race, so this node's retriers go one at a time and
    /// each meets only first attempts (the way a row lock queues writers).
    pub(crate) retry_lane: tokio::sync::Mutex<()>,
    pub(crate) query_runtime: Option<tokio::runtime::Handle>,
    /// The bootstrap superuser's name (see [`EngineConfig::superuser`]).
    superuser: String,
    /// Started with `--peers`: a Raft listener exists, so members can be added.
    clustered: bool,
    /// The data directory (backups read it, see [`crate::backup`]).
    pub(crate) data_dir: std::path::PathBuf,
    /// Where statements spill what does not fit in their memory (see [`crate::memory`]).
    spill: Arc<datafusion::execution::disk_manager::DiskManager>,
    /// What every session's statements hold together (see [`crate::memory`]).
    pub(crate) query_memory: Arc<crate::memory::QueryMemory>,
}

/// How long `ALTER CLUSTER ADD NODE` waits for the new node to catch up and become a voter.
const PROMOTION_WAIT: std::time::Duration = std::time::Duration::from_secs(30);

impl Engine {
    /// Recover the database in `config.data_dir` and start its Raft node.
    pub fn open(config: EngineConfig) -> Result<Arc<Engine>> {
        std::fs::create_dir_all(&config.data_dir)
            .map_err(|e| Error::io(format!("{}: {e}", config.data_dir.display())))?;
        crate::format::check_or_init(&config.data_dir)?;
        let catalog = Arc::new(Catalog::new());
        let apply_stats = Arc::new(ApplyStats::default());
        let db = Database::open(
            &config.data_dir,
            catalog.clone(),
            apply_stats.clone(),
            config.segment_bytes,
        )?;
        let tables = db.table_store();
        let spill = crate::memory::spill_manager(&config.data_dir, config.limits.max_spill_bytes)?;
        let query_memory = crate::memory::QueryMemory::new(config.limits.max_query_memory);
        let node_id = config.node.id;
        let clustered = !config.node.peers.is_empty();
        start_write_back(Arc::downgrade(&catalog));
        let node =
            sluice_consensus::start(config.node, db).map_err(|e| Error::io(e.to_string()))?;
        Ok(Arc::new(Engine {
            catalog,
            hub: Arc::new(crate::notify::Hub::default()),
            sessions: std::sync::atomic::AtomicU64::new(1),
            open_sessions: AtomicI64::new(0),
            retention_cuts: std::sync::atomic::AtomicU64::new(0),
            limits: config.limits,
            node,
            apply_stats,
            last_ts: AtomicI64::new(i64::MIN),
            system: crate::system::SystemCatalog::new()?,
            tables,
            row_ids: std::sync::atomic::AtomicU64::new(node_id << 48),
            retry_lane: tokio::sync::Mutex::new(()),
            query_runtime: config.query_runtime,
            superuser: config.superuser,
            query_memory,
            clustered,
            data_dir: config.data_dir.clone(),
            spill,
        }))
    }

    /// The runtime queries run on (see [`crate::executor`]), if the server gave one.
    pub fn query_runtime(&self) -> Option<&tokio::runtime::Handle> {
        self.query_runtime.as_ref()
    }

    /// Wait until everything already in the Raft log is applied (recovery
    /// replays it in the background): a command with no ops goes through
    /// the log, and when it is applied so is everything before it. Serve
    /// no client before this returns.
    /// In a cluster this also waits for a leader (retrying while there is
    /// none); the caller bounds the wait.
    pub async fn wait_ready(&self) -> Result<()> {
        loop {
            match self.propose(vec![]).await {
                Ok(_) => return Ok(()),
                Err(e)
                    if e.code == sqlstate::SERIALIZATION_FAILURE
                        || e.code == sqlstate::STATEMENT_COMPLETION_UNKNOWN =>
                {
                    tracing::info!("waiting for the cluster: {}", e.message);
                    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// A linearizable read barrier (`read_consistency = 'linearizable'`):
    /// returns once this node has applied everything the leader had
    /// committed when the read was made.
    pub async fn read_barrier(&self) -> Result<()> {
        self.node
            .read_index()
            .await
            .map_err(|e| propose_error(e, "the read"))
    }

    /// Checkpoints this node now (not the other members); returns the applied index the
    /// checkpoint covers.
    pub async fn checkpoint(&self) -> Result<u64> {
        self.node
            .checkpoint()
            .await
            .map_err(|e| propose_error(e, "the checkpoint"))
    }

    /// Whether this node may serve clients: not once it stopped applying the log (poisoned:
    /// its data would be a frozen prefix) or was removed from the cluster.
    pub fn check_serving(&self) -> Result<()> {
        match self.node.unavailable() {
            None => Ok(()),
            Some(sluice_consensus::Unavailable::Poisoned(reason)) => Err(Error::io(format!(
                "this node stopped applying the log and serves nothing: {reason}"
            ))),
            Some(sluice_consensus::Unavailable::Removed(id)) => Err(Error::new(
                sqlstate::CANNOT_CONNECT_NOW,
                format!(
                    "node {id} was removed from the cluster and serves nothing; connect to a member"
                ),
            )),
        }
    }

    /// `ALTER CLUSTER ADD NODE` / `REMOVE NODE`. A node is added as a learner and the
    /// statement returns once the leader has promoted it to voter (it caught up); one that
    /// does not catch up within `PROMOTION_WAIT` (30 s) stays a learner, which costs the quorum
    /// nothing, and the statement says so. Adding a member again at the same address is a
    /// no-op.
    pub async fn change_membership(&self, change: Membership) -> Result<()> {
        if !self.clustered {
            return Err(Error::new(
                sqlstate::OBJECT_NOT_IN_PREREQUISITE_STATE,
                "this node was started without --peers, so it has no Raft listener and cannot \
                 form a cluster; start every node with --peers (its own Raft address included)",
            ));
        }
        let member = |id: u64| self.node.status().peers.into_iter().find(|p| p.id == id);
        match &change {
            Membership::Add(id, addr) => match member(*id) {
                Some(p) if p.address != *addr && !p.address.is_empty() => {
                    return Err(Error::new(
                        sqlstate::DUPLICATE_OBJECT,
                        format!("node {id} is already a member, at '{}'", p.address),
                    ))
                }
                Some(p) if p.voter => return Ok(()),
                Some(_) => {} // a learner: proposing it again is harmless
                None => {}
            },
            Membership::Remove(id) if member(*id).is_none() => {
                return Err(Error::new(
                    sqlstate::UNDEFINED_OBJECT,
                    format!("node {id} is not a member of the cluster"),
                ))
            }
            Membership::Remove(_) => {}
        }
        self.node
            .change_membership(change.clone())
            .await
            .map_err(|e| propose_error(e, "the membership change"))?;
        let Membership::Add(id, _) = change else {
            return Ok(());
        };
        let deadline = tokio::time::Instant::now() + PROMOTION_WAIT;
        while tokio::time::Instant::now() < deadline {
            if member(id).is_some_and(|p| p.voter) {
                return Ok(());
            }
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
        Err(Error::new(
            sqlstate::OBJECT_NOT_IN_PREREQUISITE_STATE,
            format!(
                "node {id} was added as a learner but did not catch up within {}s; it becomes a \
                 voter once it does (is it running, started with --join, at that address?); \
                 ALTER CLUSTER REMOVE NODE {id} undoes the change",
                PROMOTION_WAIT.as_secs()
            ),
        ))
    }

    /// Propose `ops` as one atomic command and wait until it is applied.
    pub async fn propose(&self, ops: Vec<Op>) -> Result<Vec<OpOutcome>> {
        self.propose_txn(ops, 0, Vec::new()).await
    }

    /// Propose a transaction's writes with what it read from tables at
    /// snapshot index `snapshot`; the state machine refuses (40001) if any
    /// of those reads changed since.
    pub async fn propose_txn(
        &self,
        ops: Vec<Op>,
        snapshot: u64,
        reads: Vec<TableRead>,
    ) -> Result<Vec<OpOutcome>> {
        let cmd = Command {
            ts_micros: self.next_ts(),
            ops,
            snapshot,
            reads,
        };
        let bytes = cmd.encode_bytes();
        if bytes.len() > self.limits.max_statement_bytes {
            return Err(Error::new(
                sqlstate::PROGRAM_LIMIT_EXCEEDED,
                format!(
                    "write of {} bytes exceeds the maximum of {} bytes per command (max_statement_bytes)",
                    bytes.len(),
                    self.limits.max_statement_bytes
                ),
            ));
        }
        match self.node.propose(bytes).await {
            Ok(result) => result,
            Err(e) => Err(propose_error(e, "the write")),
        }
    }

    /// A new hidden row id: time first, so rows of a table without a key
    /// list in insertion order.
    pub fn next_row_id(&self) -> Vec<u8> {
        let mut key = Vec::with_capacity(16);
        key.extend((self.next_ts() as u64).to_be_bytes());
        key.extend(self.row_ids.fetch_add(1, Ordering::Relaxed).to_be_bytes());
        key
    }

    pub fn next_session_id(&self) -> u64 {
        self.sessions.fetch_add(1, Ordering::Relaxed)
    }

    fn next_ts(&self) -> i64 {
        let now = chrono::Utc::now().timestamp_micros();
        let prev = self.last_ts.fetch_max(now, Ordering::AcqRel);
        now.max(prev)
    }

    /// Before a clean shutdown: if this node leads a cluster, hand leadership
    /// over and wait (at most 3 s) until another node has it.
    pub async fn step_down(&self) {
        let me = self.node.status();
        if me.role != "leader" || me.peers.len() < 2 {
            return;
        }
        if self.node.step_down().await.is_err() {
            return;
        }
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(3);
        while self.node.status().leader_id == me.id && std::time::Instant::now() < deadline {
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    }

    pub async fn shutdown(&self) {
        self.node.shutdown().await;
    }

    /// Counters for `sluice_stats`.
    pub fn stats(&self) -> Vec<(&'static str, i64)> {
        let m = self.node.metrics();
        let get = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed) as i64;
        vec![
            ("appended_rows", get(&self.apply_stats.appended_rows)),
            ("applied_commands", get(&self.apply_stats.applied_commands)),
            ("committed_proposals", get(&m.committed_entries)),
            ("proposals", get(&m.proposals)),
            ("log_writes", get(&m.log_writes)),
            ("log_fsyncs", get(&m.log_fsyncs)),
            ("log_bytes", get(&m.log_bytes)),
            ("checkpoints", get(&m.checkpoints)),
            ("snapshots_built", get(&m.snapshots_built)),
            ("snapshots_installed", get(&m.snapshots_installed)),
            ("retention_cuts", get(&self.retention_cuts)),
            ("sessions", self.open_sessions.load(Ordering::Relaxed)),
            ("streams", self.catalog.list().len() as i64),
            (
                "frames_read",
                self.catalog
                    .list()
                    .iter()
                    .map(|s| s.frames_read.load(Ordering::Relaxed) as i64)
                    .sum(),
            ),
            (
                "segment_bytes_read",
                self.catalog
                    .list()
                    .iter()
                    .map(|s| s.log.bytes_read() as i64)
                    .sum(),
            ),
        ]
    }

    /// The Raft node's counters and histograms (fsync time, entries per fsync, commit time).
    pub fn raft_metrics(&self) -> Arc<sluice_consensus::Metrics> {
        self.node.metrics()
    }

    pub fn node_status(&self) -> sluice_consensus::NodeStatus {
        self.node.status()
    }

    /// A DataFusion context whose default schema shows the live catalog,
    /// with `pg_catalog` and `information_schema` for the session `vars`.
    /// A session's DataFusion context; its plans reserve memory from `memory` and spill
    /// to the engine's spill space.
    pub fn new_context(
        self: &Arc<Self>,
        vars: crate::settings::SharedVars,
        txn: Arc<TxnTables>,
        block: Arc<BlockCatalog>,
        memory: Arc<crate::memory::StatementMemory>,
    ) -> Result<SessionContext> {
        let config = SessionConfig::new()
            .with_default_catalog_and_schema(CATALOG_NAME, SCHEMA_NAME)
            .with_create_default_catalog_and_schema(false)
            .with_information_schema(false)
            .set_str("datafusion.sql_parser.dialect", "PostgreSQL")
            .set_bool("datafusion.execution.parquet.pushdown_filters", false);
        let mut runtime =
            datafusion::execution::runtime_env::RuntimeEnvBuilder::new().with_memory_pool(memory);
        runtime.disk_manager = Some(self.spill.clone());
        let state = datafusion::execution::session_state::SessionStateBuilder::new()
            .with_config(config)
            .with_runtime_env(runtime.build_arc()?)
            .with_default_features()
            .with_physical_optimizer_rule(Arc::new(crate::interrupt::YieldPoints))
            .build();
        let ctx = SessionContext::new_with_state(state);
        let catalog = MemoryCatalogProvider::new();
        let schema: Arc<dyn SchemaProvider> = Arc::new(LiveSchema {
            engine: Arc::downgrade(self),
            txn,
            block,
        });
        // registering into a fresh in-memory catalog cannot fail
        let _ = catalog.register_schema(SCHEMA_NAME, schema);
        ctx.register_catalog(CATALOG_NAME, Arc::new(catalog));
        let source: std::sync::Weak<Engine> = Arc::downgrade(self);
        self.system.install(&ctx, CATALOG_NAME, source, vars);
        Ok(ctx)
    }
}

/// What a client hears when the cluster could not take a request: 40001
/// (retry) when it certainly did not happen — no leader in time, or its log
/// position went to another entry — and 40003 when nobody can tell.
fn propose_error(e: ProposeError, what: &str) -> Error {
    match e {
        ProposeError::Dropped(msg) => Error::new(
            sqlstate::SERIALIZATION_FAILURE,
            format!("{what} was not committed ({msg}); retry it"),
        ),
        ProposeError::Unknown(msg) => Error::new(
            sqlstate::STATEMENT_COMPLETION_UNKNOWN,
            format!("the outcome of {what} is unknown: {msg}"),
        ),
        ProposeError::Failed(msg) => Error::io(format!("writes are disabled: {msg}")),
    }
}

/// How often segment files are written back in the background.
const WRITE_BACK_INTERVAL: std::time::Duration = std::time::Duration::from_millis(100);

/// A thread that fdatasyncs every stream's recent appends every
/// [`WRITE_BACK_INTERVAL`]: the checkpoint's own fsync (on the checkpoint
/// thread; a synchronous checkpoint's holds up every commit while it runs)
/// then finds almost nothing left to write. Stops with the catalog.
fn start_write_back(catalog: std::sync::Weak<Catalog>) {
    let spawned = std::thread::Builder::new()
        .name("sluice-writeback".into())
        .spawn(move || loop {
            std::thread::sleep(WRITE_BACK_INTERVAL);
            let Some(catalog) = catalog.upgrade() else {
                return;
            };
            for stream in catalog.list() {
                if let Err(e) = stream.log.write_back() {
                    // the log is poisoned: the next append fails and the
                    // node stops accepting writes
                    tracing::error!(stream = stream.name(), "write-back failed: {e}");
                }
            }
        });
    if let Err(e) = spawned {
        tracing::warn!("no write-back thread ({e}); checkpoints flush everything");
    }
}

/// The `public` schema: every stream and table, plus Sluice's system
/// views. Tables are read through the session's transaction view.
#[derive(Debug)]
struct LiveSchema {
    engine: std::sync::Weak<Engine>,
    txn: Arc<TxnTables>,
    /// What the session's open block created, altered or dropped (checked first).
    block: Arc<BlockCatalog>,
}

/// Name under which a table's keyed view (rows plus their stored key)
/// resolves; only Sluice's own UPDATE/DELETE planning uses it.
pub(crate) fn keyed_name(table: &str) -> String {
    format!("{KEYED_PREFIX}{table}")
}

const KEYED_PREFIX: &str = "sluice$keyed$";

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine").finish_non_exhaustive()
    }
}

const STATS_VIEW: &str = "sluice_stats";
const STREAMS_VIEW: &str = "sluice_streams";
const CLUSTER_VIEW: &str = "sluice_cluster";

#[async_trait]
impl SchemaProvider for LiveSchema {
    fn table_names(&self) -> Vec<String> {
        let Some(engine) = self.engine.upgrade() else {
            return vec![];
        };
        let mut names: Vec<String> = engine
            .catalog
            .list()
            .iter()
            .map(|s| s.def.name.clone())
            .collect();
        names.extend(engine.catalog.tables().iter().map(|t| t.def.name.clone()));
        for (name, present) in self.block.changes() {
            names.retain(|n| *n != name);
            if present {
                names.push(name);
            }
        }
        names.push(STATS_VIEW.into());
        names.push(STREAMS_VIEW.into());
        names.push(CLUSTER_VIEW.into());
        names
    }

    async fn table(&self, name: &str) -> DFResult<Option<Arc<dyn TableProvider>>> {
        let Some(engine) = self.engine.upgrade() else {
            return Ok(None);
        };
        if let Some(stream) = self.block.stream(name, &engine.catalog) {
            let pending = self.txn.pending_appends(stream.def.id);
            return Ok(Some(Arc::new(
                StreamTable::new(stream).with_pending(pending),
            )));
        }
        let (keyed, table_name) = match name.strip_prefix(KEYED_PREFIX) {
            Some(t) => (true, t),
            None => (false, name),
        };
        if let Some(table) = self.block.table(table_name, &engine.catalog) {
            return Ok(Some(Arc::new(TableScan::new(
                table,
                engine.tables.clone(),
                self.txn.clone(),
                keyed,
            ))));
        }
        match name {
            STATS_VIEW => Ok(Some(stats_table(&engine)?)),
            STREAMS_VIEW => Ok(Some(streams_table(&engine)?)),
            CLUSTER_VIEW => Ok(Some(cluster_table(&engine)?)),
            _ => Ok(None),
        }
    }

    fn table_exist(&self, name: &str) -> bool {
        self.engine
            .upgrade()
            .map(|e| {
                self.block.exists(name, &e.catalog)
                    || name == STATS_VIEW
                    || name == STREAMS_VIEW
                    || name == CLUSTER_VIEW
            })
            .unwrap_or(false)
    }
}

impl crate::system::CatalogSource for Engine {
    fn catalog(&self) -> &Catalog {
        &self.catalog
    }

    fn superuser(&self) -> &str {
        &self.superuser
    }

    fn system_views(&self) -> Vec<(&'static str, SchemaRef)> {
        vec![
            (STATS_VIEW, stats_schema()),
            (STREAMS_VIEW, streams_schema()),
            (CLUSTER_VIEW, cluster_schema()),
        ]
    }
}

fn cluster_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("node_id", DataType::Int64, false),
        Field::new("address", DataType::Utf8, true),
        Field::new("role", DataType::Utf8, false),
        Field::new("voter", DataType::Boolean, false),
        Field::new("is_self", DataType::Boolean, false),
        Field::new("term", DataType::Int64, false),
        Field::new("commit_index", DataType::Int64, true),
        Field::new("applied_index", DataType::Int64, true),
        Field::new("match_index", DataType::Int64, true),
        Field::new("lag", DataType::Int64, true),
        Field::new("last_contact_ms", DataType::Int64, true),
    ]))
}

/// One row per member as this node sees it: its own row has its commit and
/// applied index; match index and lag of other members are known on the
/// leader only.
fn cluster_table(engine: &Engine) -> DFResult<Arc<dyn TableProvider>> {
    use arrow::array::BooleanArray;
    let st = engine.node_status();
    let mut peers = st.peers.clone();
    if peers.is_empty() {
        peers.push(sluice_consensus::PeerStatus {
            id: st.id,
            role: st.role.clone(),
            voter: true,
            ..Default::default()
        });
    }
    let me = |p: &sluice_consensus::PeerStatus| p.id == st.id;
    let int = |f: &dyn Fn(&sluice_consensus::PeerStatus) -> Option<u64>| -> Arc<Int64Array> {
        Arc::new(Int64Array::from_iter(
            peers.iter().map(|p| f(p).map(|v| v as i64)),
        ))
    };
    let schema = cluster_schema();
    let batch = RecordBatch::try_new(
        schema.clone(),
        vec![
            Arc::new(Int64Array::from_iter_values(
                peers.iter().map(|p| p.id as i64),
            )),
            Arc::new(StringArray::from_iter(
                peers
                    .iter()
                    .map(|p| (!p.address.is_empty()).then(|| p.address.clone())),
            )),
            Arc::new(StringArray::from_iter_values(
                peers.iter().map(|p| p.role.clone()),
            )),
            Arc::new(BooleanArray::from_iter(peers.iter().map(|p| Some(p.voter)))),
            Arc::new(BooleanArray::from_iter(peers.iter().map(|p| Some(me(p))))),
            Arc::new(Int64Array::from_iter_values(
                peers.iter().map(|_| st.term as i64),
            )),
            int(&|p| me(p).then_some(st.commit_index)),
            int(&|p| me(p).then_some(st.applied_index)),
            int(&|p| p.match_index),
            int(&|p| p.lag),
            int(&|p| p.last_contact_ms),
        ],
    )?;
    Ok(Arc::new(MemTable::try_new(schema, vec![vec![batch]])?))
}

fn stats_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("metric", DataType::Utf8, false),
        Field::new("value", DataType::Int64, false),
    ]))
}

fn streams_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("name", DataType::Utf8, false),
        Field::new("first_offset", DataType::Int64, false),
        Field::new("next_offset", DataType::Int64, false),
        Field::new("bytes", DataType::Int64, false),
        Field::new("segments", DataType::Int64, false),
        Field::new("retention", DataType::Utf8, true),
        Field::new("retention_bytes", DataType::Int64, true),
        Field::new("oldest_ts", crate::definition::ts_type(), true),
        Field::new("compression", DataType::Utf8, false),
        Field::new("logical_bytes", DataType::Int64, false),
        Field::new("compression_ratio", DataType::Float64, true),
    ]))
}

fn stats_table(engine: &Engine) -> DFResult<Arc<dyn TableProvider>> {
    let stats = engine.stats();
    let schema = stats_schema();
    let batch = RecordBatch::try_new(
        schema.clone(),
        vec![
            Arc::new(StringArray::from_iter_values(stats.iter().map(|(k, _)| *k))),
            Arc::new(Int64Array::from_iter_values(stats.iter().map(|(_, v)| *v))),
        ],
    )?;
    Ok(Arc::new(MemTable::try_new(schema, vec![vec![batch]])?))
}

fn streams_table(engine: &Engine) -> DFResult<Arc<dyn TableProvider>> {
    let streams = engine.catalog.list();
    let schema = streams_schema();
    let retention = |ms: Option<u64>| ms.map(|m| format!("{} ms", m));
    // (stored, uncompressed) bytes, read once so the ratio agrees with `bytes`
    let sizes: Vec<(u64, u64)> = streams
        .iter()
        .map(|s| (s.log.size_bytes(), s.log.logical_bytes()))
        .collect();
    let batch = RecordBatch::try_new(
        schema.clone(),
        vec![
            Arc::new(StringArray::from_iter_values(
                streams.iter().map(|s| s.def.name.clone()),
            )),
            Arc::new(Int64Array::from_iter_values(
                streams.iter().map(|s| s.log.first_offset() as i64),
            )),
            Arc::new(Int64Array::from_iter_values(
                streams.iter().map(|s| s.log.next_offset() as i64),
            )),
            Arc::new(Int64Array::from_iter_values(
                sizes.iter().map(|(bytes, _)| *bytes as i64),
            )),
            Arc::new(Int64Array::from_iter_values(
                streams.iter().map(|s| s.log.segments().len() as i64),
            )),
            Arc::new(StringArray::from_iter(
                streams
                    .iter()
                    .map(|s| retention(s.def.options.retention_ms)),
            )),
            Arc::new(Int64Array::from_iter(streams.iter().map(|s| {
                s.def
                    .options
                    .retention_bytes
                    .map(|b| i64::try_from(b).unwrap_or(i64::MAX))
            }))),
            Arc::new(
                arrow::array::TimestampMicrosecondArray::from_iter(
                    streams
                        .iter()
                        .map(|s| s.log.segments().iter().find_map(|seg| seg.min_ts_micros)),
                )
                .with_timezone("UTC"),
            ),
            Arc::new(StringArray::from_iter_values(
                streams.iter().map(|s| s.def.options.compression.name()),
            )),
            Arc::new(Int64Array::from_iter_values(
                sizes.iter().map(|(_, logical)| *logical as i64),
            )),
            Arc::new(arrow::array::Float64Array::from_iter(sizes.iter().map(
                |(bytes, logical)| (*bytes > 0).then(|| *logical as f64 / *bytes as f64),
            ))),
        ],
    )?;
    Ok(Arc::new(MemTable::try_new(schema, vec![vec![batch]])?))
}
