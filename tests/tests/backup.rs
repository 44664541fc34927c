//! Online backup and offline restore: `SELECT * FROM sluice_backup('/abs/dir')` (or
//! `sluice backup --to DIR ...`) writes a consistent copy of the whole node — every stream,
//! every table, the catalog and the roles — as of one applied Raft index while writes keep
//! running, and `sluice restore --from DIR --data-dir NEW` turns it into a data directory
//! that `sluice serve` opens as a single node holding exactly that content.
//!
//! The load test runs four writers, each a sequence of operations on one connection
//! (appends of one or several rows to `events`, and transactions writing one key to the
//! `ledger` stream and the `kv` table together), and takes a backup in the middle of it.
//! Because a writer sends its next operation only after the last one was acknowledged,
//! its operations take increasing Raft indexes: a backup as of one index holds, for every
//! writer, a prefix of its operations, each whole — and every operation acknowledged
//! before the backup began. The restored streams must be exactly a prefix of the source's
//! (same offsets, timestamps and values), the restored table a subset of the source's.
//! The other tests check who may take a backup and where, and that a restore refuses a
//! backup that was interrupted (no manifest) or damaged (a file that does not match it).

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use sluice_tests::{
    assert_gapless, binary_path, exec, expect_sqlstate, simple_rows, spawn_sluice, sqlstate,
    try_simple_rows, within, Server, STARTUP_TIMEOUT, STATEMENT_TIMEOUT,
};
use tokio_postgres::error::SqlState;
use tokio_postgres::{Client, NoTls};

/// Concurrent writers of the load test, one connection each.
const WRITERS: usize = 4;
/// Operations each writer attempts at most.
const MAX_OPS_PER_WRITER: u64 = 3_000;
/// Writers stop by themselves after this long even if the test never tells them to.
const LOAD_LIMIT: Duration = Duration::from_secs(30);
/// Operations every writer has finished before the backup starts.
const OPS_BEFORE_BACKUP: u64 = 30;
/// How long one `sluice backup` or `sluice restore` run may take.
const CLI_TIMEOUT: Duration = Duration::from_secs(60);
/// How long establishing one client connection may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// The file a complete backup holds at its top: every file's length and crc32c.
const MANIFEST: &str = "MANIFEST";

/// One finished operation of a load writer; its position in the writer's list is its `seq`.
#[derive(Debug)]
enum Op {
    /// An append to `events`, acknowledged with the offset of each of its rows (`part`s).
    Append { offsets: Vec<i64> },
    /// A committed transaction that wrote key `k` to `ledger` and to `kv`.
    Committed { k: i64 },
    /// A transaction refused with 40001: nothing of it may exist anywhere.
    Refused { k: i64 },
}

/// The key a writer's transaction `seq` writes to `ledger` and `kv`.
fn key(writer: usize, seq: u64) -> i64 {
    (writer as i64) * 1_000_000 + seq as i64
}

/// A literal for `note` that does not compress, with a quote to escape.
fn note_literal(rng: &mut StdRng, writer: usize, seq: u64) -> String {
    let noise: String = (0..3)
        .map(|_| format!("{:016x}", rng.gen::<u64>()))
        .collect();
    format!("'w{writer} s{seq} it''s {noise}'")
}

/// Appends `parts` rows of `(writer, seq, part)` to `events` in one statement.
async fn append(client: &Client, rng: &mut StdRng, writer: usize, seq: u64, parts: u64) -> Op {
    let values: Vec<String> = (0..parts)
        .map(|part| {
            let note = if rng.gen_ratio(1, 8) {
                "NULL".to_string()
            } else {
                note_literal(rng, writer, seq)
            };
            let amount = rng.gen_range(-1_000_000_000_000i64..1_000_000_000_000);
            let flag = rng.gen_bool(0.5);
            format!("({writer}, {seq}, {part}, {note}, {amount}, {flag})")
        })
        .collect();
    let sql = format!(
        "INSERT INTO events (writer, seq, part, note, amount, flag) VALUES {} RETURNING offset",
        values.join(", ")
    );
    let rows = within(STATEMENT_TIMEOUT, &sql, client.query(sql.as_str(), &[]))
        .await
        .unwrap_or_else(|e| panic!("writer {writer}: {sql}: {e:?}"));
    let offsets: Vec<i64> = rows.iter().map(|r| r.get(0)).collect();
    assert_eq!(offsets.len() as u64, parts, "RETURNING of {sql}");
    Op::Append { offsets }
}

/// One transaction writing the same key to the `ledger` stream and the `kv` table.
async fn transaction(client: &Client, rng: &mut StdRng, writer: usize, seq: u64) -> Op {
    let k = key(writer, seq);
    let note = note_literal(rng, writer, seq);
    let amount = rng.gen_range(-1_000_000_000i64..1_000_000_000);
    let sql = format!(
        "BEGIN; \
         INSERT INTO ledger (k, writer, seq) VALUES ({k}, {writer}, {seq}); \
         INSERT INTO kv (k, writer, seq, note, amount) \
           VALUES ({k}, {writer}, {seq}, {note}, {amount}); \
         COMMIT"
    );
    match within(STATEMENT_TIMEOUT, &sql, client.batch_execute(&sql)).await {
        Ok(()) => Op::Committed { k },
        Err(e) if sqlstate(&e) == Some(SqlState::T_R_SERIALIZATION_FAILURE.code()) => {
            // the block may still be open (failed) if a statement before COMMIT refused
            let _ = client.batch_execute("ROLLBACK").await;
            Op::Refused { k }
        }
        Err(e) => panic!("writer {writer}: transaction {seq} failed: {e:?}"),
    }
}

/// The load: [`WRITERS`] tasks, each running operations on its own connection until told
/// to stop, [`MAX_OPS_PER_WRITER`] or [`LOAD_LIMIT`]. A writer's operations cycle through
/// a single-row append, a multi-row append and a transaction.
struct Load {
    stop: Arc<AtomicBool>,
    /// Per writer, how many of its operations have finished (acknowledged or refused).
    done: Arc<Vec<AtomicU64>>,
    writers: Vec<tokio::task::JoinHandle<Vec<Op>>>,
}

impl Load {
    async fn start(server: &Server) -> Load {
        let stop = Arc::new(AtomicBool::new(false));
        let done: Arc<Vec<AtomicU64>> = Arc::new((0..WRITERS).map(|_| AtomicU64::new(0)).collect());
        let mut writers = Vec::new();
        for writer in 0..WRITERS {
            let client = server.client().await;
            let (stop, done) = (stop.clone(), done.clone());
            writers.push(tokio::spawn(async move {
                let mut rng = StdRng::seed_from_u64(writer as u64);
                let deadline = Instant::now() + LOAD_LIMIT;
                let mut ops = Vec::new();
                for seq in 0..MAX_OPS_PER_WRITER {
                    if stop.load(Ordering::SeqCst) || Instant::now() >= deadline {
                        break;
                    }
                    let op = if seq % 3 == 2 {
                        transaction(&client, &mut rng, writer, seq).await
                    } else {
                        let parts = if seq % 3 == 0 {
                            1
                        } else {
                            rng.gen_range(2..=4)
                        };
                        append(&client, &mut rng, writer, seq, parts).await
                    };
                    ops.push(op);
                    done[writer].fetch_add(1, Ordering::SeqCst);
                }
                ops
            }));
        }
        Load {
            stop,
            done,
            writers,
        }
    }

    /// Per writer, how many operations have finished so far.
    fn progress(&self) -> Vec<u64> {
        self.done.iter().map(|d| d.load(Ordering::SeqCst)).collect()
    }

    /// Waits until every writer has finished `ops` operations (or one has failed).
    async fn wait_for(&self, ops: u64) {
        let deadline = Instant::now() + LOAD_LIMIT;
        while !self.progress().iter().all(|&n| n >= ops) {
            if self.writers.iter().any(|w| w.is_finished()) {
                return; // a writer failed: [`Load::finish`] reports why
            }
            assert!(
                Instant::now() < deadline,
                "the load did not reach {ops} operations per writer in {LOAD_LIMIT:?}: {:?}",
                self.progress()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Stops the writers; per writer, its finished operations in order.
    async fn finish(self) -> Vec<Vec<Op>> {
        self.stop.store(true, Ordering::SeqCst);
        let mut logs = Vec::new();
        for (writer, task) in self.writers.into_iter().enumerate() {
            let ops = within(Duration::from_secs(60), "load writer", task)
                .await
                .unwrap_or_else(|e| panic!("writer {writer}: {e}"));
            logs.push(ops);
        }
        logs
    }
}

/// A row as text, SQL NULL as `None` (what [`simple_rows`] returns).
type TextRow = Vec<Option<String>>;

/// What a node holds of the load, as text rows.
struct Contents {
    /// `SELECT * FROM events ORDER BY offset`: offset, ts, writer, seq, part, note, amount, flag.
    events: Vec<TextRow>,
    /// `SELECT * FROM ledger ORDER BY offset`: offset, ts, k, writer, seq.
    ledger: Vec<TextRow>,
    /// `kv` by key: k, writer, seq, note, amount.
    kv: BTreeMap<i64, TextRow>,
}

impl Contents {
    async fn read(client: &Client) -> Contents {
        let kv = simple_rows(
            client,
            "SELECT k, writer, seq, note, amount FROM kv ORDER BY k",
        )
        .await;
        Contents {
            events: simple_rows(client, "SELECT * FROM events ORDER BY offset").await,
            ledger: simple_rows(client, "SELECT * FROM ledger ORDER BY offset").await,
            kv: kv.into_iter().map(|row| (int(&row, 0), row)).collect(),
        }
    }
}

/// Column `column` of a text row as an integer.
fn int(row: &[Option<String>], column: usize) -> i64 {
    row[column]
        .as_deref()
        .unwrap_or_else(|| panic!("column {column} of {row:?} is NULL"))
        .parse()
        .unwrap_or_else(|e| panic!("column {column} of {row:?}: {e}"))
}

/// Which of the load's operations a node's [`Contents`] hold, each checked to be whole.
struct Held<'a> {
    what: &'a str,
    /// (writer, seq) → (part, offset) of its `events` rows, in offset order.
    parts: HashMap<(i64, i64), Vec<(i64, i64)>>,
    /// `ledger` key → how many rows carry it.
    ledger: HashMap<i64, usize>,
    kv: &'a BTreeMap<i64, TextRow>,
}

impl<'a> Held<'a> {
    fn new(what: &'a str, contents: &'a Contents) -> Held<'a> {
        let mut parts: HashMap<(i64, i64), Vec<(i64, i64)>> = HashMap::new();
        for row in &contents.events {
            parts
                .entry((int(row, 2), int(row, 3)))
                .or_default()
                .push((int(row, 4), int(row, 0)));
        }
        let mut ledger = HashMap::new();
        for row in &contents.ledger {
            *ledger.entry(int(row, 2)).or_default() += 1;
        }
        Held {
            what,
            parts,
            ledger,
            kv: &contents.kv,
        }
    }

    /// Whether operation `seq` of `writer` is there: `Some(true)` wholly, `Some(false)` not
    /// at all, `None` for a refused transaction (checked absent). Panics if it is there in
    /// part, at other offsets or twice.
    fn op(&self, writer: usize, seq: usize, op: &Op) -> Option<bool> {
        let what = self.what;
        match op {
            Op::Append { offsets } => {
                let Some(found) = self.parts.get(&(writer as i64, seq as i64)) else {
                    return Some(false);
                };
                let expected: Vec<(i64, i64)> = (0..).zip(offsets.iter().copied()).collect();
                assert_eq!(
                    *found, expected,
                    "{what}: append {seq} of writer {writer} is torn, moved or doubled \
                     ((part, offset) found vs acknowledged)"
                );
                Some(true)
            }
            Op::Committed { k } => {
                let in_ledger = self.ledger.get(k).copied().unwrap_or(0);
                let in_kv = self.kv.contains_key(k);
                assert!(
                    in_ledger <= 1,
                    "{what}: key {k} is in ledger {in_ledger} times"
                );
                assert_eq!(
                    in_ledger == 1,
                    in_kv,
                    "{what}: transaction {seq} of writer {writer} (key {k}) is torn: \
                     in ledger {in_ledger} times, in kv: {in_kv}"
                );
                Some(in_kv)
            }
            Op::Refused { k } => {
                assert!(
                    !self.ledger.contains_key(k) && !self.kv.contains_key(k),
                    "{what}: transaction {seq} of writer {writer} (key {k}) was refused \
                     with 40001 but its writes are there"
                );
                None
            }
        }
    }

    /// Panics unless the node holds every acknowledged operation (none of the refused) and
    /// nothing else.
    fn all(&self, contents: &Contents, logs: &[Vec<Op>]) {
        for (writer, ops) in logs.iter().enumerate() {
            for (seq, op) in ops.iter().enumerate() {
                assert_ne!(
                    self.op(writer, seq, op),
                    Some(false),
                    "{}: acknowledged operation {seq} of writer {writer} is missing",
                    self.what
                );
            }
        }
        self.nothing_else(contents, logs, &|_, _| true);
    }

    /// Panics unless the node holds one point of the load: of each writer's operations a
    /// prefix, reaching at least `finished_before[writer]`, and nothing else.
    fn one_point(&self, contents: &Contents, logs: &[Vec<Op>], finished_before: &[u64]) {
        let mut there = vec![0usize; logs.len()];
        for (writer, ops) in logs.iter().enumerate() {
            let mut first_missing = None;
            for (seq, op) in ops.iter().enumerate() {
                match self.op(writer, seq, op) {
                    Some(true) => {
                        if let Some(missing) = first_missing {
                            panic!(
                                "{}: operation {seq} of writer {writer} is there but \
                                 operation {missing}, acknowledged before it was sent, is \
                                 not: this is not one point in time",
                                self.what
                            );
                        }
                        there[writer] = seq + 1;
                    }
                    Some(false) => first_missing = first_missing.or(Some(seq)),
                    None => {}
                }
            }
            let reached = first_missing.unwrap_or(ops.len()) as u64;
            assert!(
                reached >= finished_before[writer],
                "{}: operation {reached} of writer {writer} was acknowledged before the \
                 backup began ({} of its operations were) but is missing",
                self.what,
                finished_before[writer]
            );
        }
        self.nothing_else(contents, logs, &|writer, seq| seq < there[writer]);
    }

    /// Panics unless the node holds the rows of exactly the operations `is_there` names.
    fn nothing_else(
        &self,
        contents: &Contents,
        logs: &[Vec<Op>],
        is_there: &dyn Fn(usize, usize) -> bool,
    ) {
        let (mut rows, mut keys) = (0, 0);
        for (writer, ops) in logs.iter().enumerate() {
            for (seq, op) in ops.iter().enumerate() {
                match op {
                    Op::Append { offsets } if is_there(writer, seq) => rows += offsets.len(),
                    Op::Committed { .. } if is_there(writer, seq) => keys += 1,
                    _ => {}
                }
            }
        }
        let what = self.what;
        assert_eq!(
            contents.events.len(),
            rows,
            "{what}: events rows nobody wrote"
        );
        assert_eq!(
            contents.ledger.len(),
            keys,
            "{what}: ledger rows nobody wrote"
        );
        assert_eq!(contents.kv.len(), keys, "{what}: kv rows nobody wrote");
    }
}

/// Panics unless `restored` is the first `restored.len()` rows of `source`.
fn assert_prefix(stream: &str, restored: &[TextRow], source: &[TextRow]) {
    assert!(
        restored.len() <= source.len(),
        "{stream}: the restore holds {} rows, the source only {}",
        restored.len(),
        source.len()
    );
    if let Some(i) = restored.iter().zip(source).position(|(r, s)| r != s) {
        panic!(
            "{stream}: restored row {i} differs from the source's:\n restored {:?}\n source   {:?}",
            restored[i], source[i]
        );
    }
}

/// Catalog queries whose answers a restore must keep.
const CATALOG: [&str; 4] = [
    "SELECT name FROM sluice_streams ORDER BY name",
    "SELECT table_name, table_type FROM information_schema.tables \
     WHERE table_schema = 'public' ORDER BY table_name",
    "SELECT rolname, rolsuper, rolcanlogin FROM pg_roles ORDER BY rolname",
    "SELECT column_name, data_type FROM information_schema.columns \
     WHERE table_name IN ('events', 'ledger', 'kv') ORDER BY table_name, ordinal_position",
];

/// The one integer a query answers.
async fn count(client: &Client, sql: &str) -> i64 {
    let rows = simple_rows(client, sql).await;
    assert_eq!(rows.len(), 1, "{sql}: {rows:?}");
    int(&rows[0], 0)
}

/// The answers to [`CATALOG`], in order.
async fn catalog(client: &Client) -> Vec<Vec<TextRow>> {
    let mut answers = Vec::new();
    for sql in CATALOG {
        answers.push(simple_rows(client, sql).await);
    }
    answers
}

#[tokio::test(flavor = "multi_thread")]
async fn a_backup_under_load_restores_identical_content() {
    // small segments and frequent checkpoints, so the backup meets sealed segments, an
    // active one and a checkpoint with log entries after it
    let mut server =
        Server::start_with(&["--segment-bytes", "4096", "--checkpoint-entries", "64"]).await;
    let admin = server.client().await;
    exec(
        &admin,
        "CREATE STREAM events (writer integer NOT NULL, seq bigint NOT NULL, \
           part integer NOT NULL, note text, amount bigint, flag boolean); \
         CREATE STREAM ledger (k bigint NOT NULL, writer integer NOT NULL, seq bigint NOT NULL); \
         CREATE TABLE kv (k bigint PRIMARY KEY, writer integer NOT NULL, seq bigint NOT NULL, \
           note text, amount bigint); \
         CREATE ROLE reader LOGIN; \
         GRANT SELECT ON events TO reader",
    )
    .await;
    let streams = count(&admin, "SELECT count(*) FROM sluice_streams").await;

    // the backup, taken through the CLI while the load runs
    let load = Load::start(&server).await;
    load.wait_for(OPS_BEFORE_BACKUP).await;
    let finished_before = load.progress();
    let work = tempfile::tempdir().expect("create a temporary directory");
    let backup_dir = work.path().join("backup");
    let backup = cli_backup(server.port(), &backup_dir).await;
    let finished_during = load.progress();
    let logs = load.finish().await;
    assert!(backup.ok, "sluice backup failed: {}", backup.stderr);
    let summary = backup_summary(&backup.stdout, &backup_dir);
    println!(
        "{summary:?}; operations finished per writer before the backup {finished_before:?}, \
         when it ended {finished_during:?}, in all {:?}",
        logs.iter().map(Vec::len).collect::<Vec<_>>()
    );
    assert!(summary.applied_index > 0, "{summary:?}");
    assert_eq!(
        summary.streams, streams,
        "streams in the backup: {summary:?}"
    );
    assert!(summary.tables >= 1, "kv is not in the backup: {summary:?}");
    assert!(summary.bytes > 0, "{summary:?}");
    assert!(
        backup_dir.join(MANIFEST).is_file(),
        "the backup has no {MANIFEST}"
    );

    // the source, now quiet, holds every acknowledged operation, whole, and nothing else
    let source = Contents::read(&admin).await;
    Held::new("source", &source).all(&source, &logs);
    assert_eq!(
        assert_gapless(&admin, "events").await as usize,
        source.events.len()
    );
    assert_eq!(
        assert_gapless(&admin, "ledger").await as usize,
        source.ledger.len()
    );
    let segments = count(
        &admin,
        "SELECT segments FROM sluice_streams WHERE name = 'events'",
    )
    .await;
    assert!(
        segments >= 2,
        "events has {segments} segment(s): the test means to back up sealed ones too"
    );
    let source_catalog = catalog(&admin).await;
    drop(admin);
    let status = server.stop().await;
    assert!(
        status.success(),
        "the source exited with {status} after SIGTERM"
    );

    // restore, and serve what was restored
    let restored_dir = work.path().join("restored");
    let restore = cli_restore(&backup_dir, &restored_dir).await;
    assert!(restore.ok, "sluice restore failed: {}", restore.stderr);
    assert_eq!(
        restored_index(&restore.stdout, &restored_dir),
        summary.applied_index,
        "restore and backup disagree on the index"
    );
    let node = Node::start(&restored_dir, "restored").await;
    let client = node.client("sluice").await;
    let restored = Contents::read(&client).await;
    println!(
        "restored {} of {} events rows, {} of {} ledger rows, {} of {} kv rows",
        restored.events.len(),
        source.events.len(),
        restored.ledger.len(),
        source.ledger.len(),
        restored.kv.len(),
        source.kv.len()
    );

    // each stream a prefix of the source's (offsets, ts and values alike), the table a
    // subset, and together one point of the load that includes everything acknowledged
    // before the backup began
    assert_prefix("events", &restored.events, &source.events);
    assert_prefix("ledger", &restored.ledger, &source.ledger);
    for (k, row) in &restored.kv {
        assert_eq!(
            source.kv.get(k),
            Some(row),
            "restored kv row {k} is not the source's"
        );
    }
    Held::new("restored", &restored).one_point(&restored, &logs, &finished_before);

    // the catalog, the roles and their grants came along
    let restored_catalog = catalog(&client).await;
    for ((sql, got), want) in CATALOG.iter().zip(&restored_catalog).zip(&source_catalog) {
        assert_eq!(got, want, "the restored catalog differs: {sql}");
    }
    let reader = node.client("reader").await;
    assert_eq!(
        count(&reader, "SELECT count(*) FROM events").await as usize,
        restored.events.len()
    );
    expect_sqlstate(
        try_simple_rows(&reader, "SELECT count(*) FROM kv").await,
        &SqlState::INSUFFICIENT_PRIVILEGE,
        "reader was granted only events",
    );

    writes_continue(&client, &restored).await;
}

/// The restored node takes writes where the backup left off: each stream at its next offset
/// (with a `ts` not before the last restored one), the table with its primary key intact.
async fn writes_continue(client: &Client, restored: &Contents) {
    let last_ts: Option<DateTime<Utc>> =
        query_one(client, "SELECT max(ts) FROM events").await.get(0);
    let row = query_one(
        client,
        "INSERT INTO events (writer, seq, part, note, amount, flag) \
         VALUES (-1, 0, 0, 'after restore', 1, true) RETURNING offset, ts",
    )
    .await;
    assert_eq!(
        row.get::<_, i64>(0) as usize,
        restored.events.len(),
        "events continues at the next offset"
    );
    let ts: DateTime<Utc> = row.get(1);
    assert!(
        last_ts.is_none_or(|last| ts >= last),
        "ts went backwards across the restore: {ts} < {last_ts:?}"
    );
    let row = query_one(
        client,
        "INSERT INTO ledger (k, writer, seq) VALUES (-1, -1, 0) RETURNING offset",
    )
    .await;
    assert_eq!(
        row.get::<_, i64>(0) as usize,
        restored.ledger.len(),
        "ledger continues at the next offset"
    );
    exec(client, "INSERT INTO kv (k, writer, seq) VALUES (-1, -1, 0)").await;
    let taken = restored
        .kv
        .keys()
        .next()
        .expect("the restore holds kv rows");
    expect_sqlstate(
        try_simple_rows(
            client,
            &format!("INSERT INTO kv (k, writer, seq) VALUES ({taken}, -1, 1)"),
        )
        .await,
        &SqlState::UNIQUE_VIOLATION,
        "a restored key inserted again",
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_backup_refuses_bad_targets_and_non_superusers() {
    let server = Server::start().await;
    let admin = server.client().await;
    exec(
        &admin,
        "CREATE STREAM s (v text); INSERT INTO s VALUES ('a'), ('b'); \
         CREATE ROLE app LOGIN; GRANT SELECT ON s TO app",
    )
    .await;
    let work = tempfile::tempdir().expect("create a temporary directory");

    // a relative path, resolved nowhere (the server's working directory is this test's)
    let relative = format!("sluice-backup-relative-{}", std::process::id());
    expect_sqlstate(
        try_simple_rows(
            &admin,
            &format!("SELECT * FROM sluice_backup('{relative}')"),
        )
        .await,
        &SqlState::INVALID_PARAMETER_VALUE,
        "a relative backup path",
    );
    assert!(
        !Path::new(&relative).exists(),
        "a refused relative path was created"
    );

    // a directory that holds something, left as it was (also through the CLI)
    let full = work.path().join("full");
    std::fs::create_dir(&full).expect("create a directory");
    std::fs::write(full.join("keep.txt"), "precious").expect("write a file");
    expect_sqlstate(
        try_simple_rows(
            &admin,
            &format!("SELECT * FROM sluice_backup({})", literal(&full)),
        )
        .await,
        &SqlState::INVALID_PARAMETER_VALUE,
        "a non-empty target directory",
    );
    let cli = cli_backup(server.port(), &full).await;
    assert!(
        !cli.ok,
        "sluice backup into a non-empty directory succeeded"
    );
    assert!(
        cli.stderr.contains("sluice:"),
        "the CLI's refusal is not reported on stderr: {:?}",
        cli.stderr
    );
    assert_eq!(
        listing(&full),
        ["keep.txt"],
        "the non-empty directory was written to"
    );
    assert_eq!(
        std::fs::read_to_string(full.join("keep.txt")).expect("read keep.txt"),
        "precious"
    );

    // a role without superuser, in both forms, before anything is written
    let app = connect(&server.conn_string().replace("user=sluice", "user=app")).await;
    let target = work.path().join("by-app");
    for sql in [
        format!("SELECT * FROM sluice_backup({})", literal(&target)),
        format!("SELECT sluice_backup({})", literal(&target)),
    ] {
        expect_sqlstate(
            try_simple_rows(&app, &sql).await,
            &SqlState::INSUFFICIENT_PRIVILEGE,
            "a backup by a role without superuser",
        );
    }
    assert!(!target.exists(), "a refused backup created its directory");

    // no argument, or one that is not a literal (it would name `computed2`)
    let computed = work.path().join("computed");
    for sql in [
        "SELECT * FROM sluice_backup()".to_string(),
        "SELECT sluice_backup()".to_string(),
        format!("SELECT sluice_backup({} || '2')", literal(&computed)),
        // a clause around the call would be ignored: refused instead
        format!(
            "SELECT * FROM sluice_backup({}) WHERE false",
            literal(&computed)
        ),
        format!("SELECT sluice_backup({}) LIMIT 0", literal(&computed)),
    ] {
        let Err(err) = try_simple_rows(&admin, &sql).await else {
            panic!("{sql} succeeded");
        };
        assert!(
            matches!(sqlstate(&err), Some("42601" | "0A000")),
            "{sql}: expected 42601 or 0A000, got {err:?}"
        );
    }
    assert!(
        !work.path().join("computed2").exists() && !computed.exists(),
        "a refused backup created its directory"
    );
    // nor inside the data directory (its files would be taken for the server's own)
    let inside = server.data_dir().join("backup-here");
    let err = try_simple_rows(
        &admin,
        &format!("SELECT * FROM sluice_backup({})", literal(&inside)),
    )
    .await
    .expect_err("a backup inside the data directory");
    assert_eq!(sqlstate(&err), Some("22023"), "{err:?}");
    assert!(!inside.exists(), "a refused backup created its directory");

    // the control: the superuser's scalar form into an existing empty directory works
    let empty = work.path().join("empty");
    std::fs::create_dir(&empty).expect("create a directory");
    let rows = simple_rows(
        &admin,
        &format!("SELECT sluice_backup({})", literal(&empty)),
    )
    .await;
    assert_eq!(rows.len(), 1, "sluice_backup returns one row: {rows:?}");
    assert!(
        empty.join(MANIFEST).is_file(),
        "the backup into an empty directory has no {MANIFEST}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn restore_refuses_an_incomplete_or_damaged_backup() {
    let server = Server::start_with(&["--segment-bytes", "4096"]).await;
    let client = server.client().await;
    exec(
        &client,
        "CREATE STREAM notes (n bigint NOT NULL, body text); \
         CREATE TABLE kv (k bigint PRIMARY KEY, v text)",
    )
    .await;
    for batch in 0..4 {
        let values: Vec<String> = (batch * 25..(batch + 1) * 25)
            .map(|n| format!("({n}, 'note {n} {}')", "z".repeat(100)))
            .collect();
        exec(
            &client,
            &format!("INSERT INTO notes VALUES {}", values.join(", ")),
        )
        .await;
    }
    exec(&client, "INSERT INTO kv VALUES (1, 'one'), (2, 'two')").await;

    let work = tempfile::tempdir().expect("create a temporary directory");
    let backup = work.path().join("backup");
    let row = query_one(
        &client,
        &format!("SELECT * FROM sluice_backup({})", literal(&backup)),
    )
    .await;
    let summary = Summary {
        applied_index: row.get("applied_index"),
        streams: row.get("streams"),
        tables: row.get("tables"),
        bytes: row.get("bytes"),
    };
    println!("backup: {summary:?}");
    assert!(summary.applied_index > 0, "{summary:?}");
    assert_eq!(summary.streams, 1, "{summary:?}");
    assert!(summary.tables >= 1, "{summary:?}");
    assert!(summary.bytes > 0, "{summary:?}");

    // the control: the backup as written restores
    let good = work.path().join("good");
    let out = cli_restore(&backup, &good).await;
    assert!(out.ok, "restoring an intact backup failed: {}", out.stderr);
    assert_eq!(restored_index(&out.stdout, &good), summary.applied_index);
    // started with other members at once, the restored node refuses: empty members could
    // elect a leader without its history (it seeds a cluster alone, then ADD NODE)
    let free_port = sluice_tests::cluster::free_port;
    let peers = format!("1=127.0.0.1:{},2=127.0.0.1:{}", free_port(), free_port());
    let serve = std::process::Command::new(sluice_tests::binary_path())
        .args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--node-id",
            "1",
            "--peers",
            &peers,
        ])
        .arg("--data-dir")
        .arg(&good)
        .env("NO_COLOR", "1")
        .output()
        .expect("run sluice serve");
    let stderr = String::from_utf8_lossy(&serve.stderr);
    assert!(
        !serve.status.success(),
        "a restored node started with other members"
    );
    assert!(
        stderr.contains("restored from a backup") && stderr.contains("ALTER CLUSTER ADD NODE"),
        "{stderr}"
    );

    // (a) no manifest: the backup never finished
    let unfinished = work.path().join("unfinished");
    copy_dir(&backup, &unfinished);
    std::fs::remove_file(unfinished.join(MANIFEST)).expect("remove the manifest");
    let out = cli_restore(&unfinished, &work.path().join("from-unfinished")).await;
    assert!(!out.ok, "a backup without its manifest was restored");
    assert!(
        out.stderr.to_lowercase().contains("manifest"),
        "the refusal does not name the manifest: {:?}",
        out.stderr
    );

    // (b) one flipped byte in a stream segment
    let damaged = work.path().join("damaged");
    copy_dir(&backup, &damaged);
    let segment = walk(&damaged)
        .into_iter()
        .filter(|p| {
            p.extension().is_some_and(|e| e == "seg")
                && p.strip_prefix(&damaged)
                    .is_ok_and(|rel| rel.starts_with("streams"))
        })
        .max_by_key(|p| std::fs::metadata(p).map(|m| m.len()).unwrap_or(0))
        .unwrap_or_else(|| panic!("no streams/**/*.seg in the backup: {:?}", walk(&damaged)));
    let mut bytes = std::fs::read(&segment).expect("read the segment");
    assert!(!bytes.is_empty(), "{} is empty", segment.display());
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0xff;
    std::fs::write(&segment, &bytes).expect("write the damaged segment");
    let out = cli_restore(&damaged, &work.path().join("from-damaged")).await;
    assert!(!out.ok, "a backup with a damaged segment was restored");
    let name = segment
        .file_name()
        .and_then(|n| n.to_str())
        .expect("a UTF-8 file name");
    assert!(
        out.stderr.contains(name),
        "the refusal does not name the damaged file {name}: {:?}",
        out.stderr
    );

    // (c) a data directory that already holds something is left alone
    let occupied = work.path().join("occupied");
    std::fs::create_dir(&occupied).expect("create a directory");
    std::fs::write(occupied.join("keep.txt"), "precious").expect("write a file");
    let out = cli_restore(&backup, &occupied).await;
    assert!(!out.ok, "a restore into a non-empty directory succeeded");
    assert_eq!(
        listing(&occupied),
        ["keep.txt"],
        "the occupied directory was written to"
    );
}

/// What `sluice backup` printed, or `sluice_backup` returned.
#[derive(Debug)]
struct Summary {
    applied_index: i64,
    streams: i64,
    tables: i64,
    bytes: i64,
}

/// Parses `backup at index N: S streams, T tables, B bytes in DIR`.
fn backup_summary(stdout: &str, dir: &Path) -> Summary {
    let line = stdout
        .lines()
        .find(|l| l.starts_with("backup at index "))
        .unwrap_or_else(|| panic!("no `backup at index` line in {stdout:?}"));
    let (index, counts) = line["backup at index ".len()..]
        .split_once(": ")
        .unwrap_or_else(|| malformed(line));
    let words: Vec<&str> = counts.split_whitespace().collect();
    if words.len() < 7
        || words[1] != "streams,"
        || words[3] != "tables,"
        || words[5..7] != ["bytes", "in"]
    {
        malformed(line);
    }
    assert!(
        line.ends_with(&format!("in {}", path_str(dir))),
        "the backup line does not name {}: {line:?}",
        dir.display()
    );
    let number = |text: &str| text.parse::<i64>().unwrap_or_else(|_| malformed(line));
    Summary {
        applied_index: number(index),
        streams: number(words[0]),
        tables: number(words[2]),
        bytes: number(words[4]),
    }
}

/// Fails the test on a backup line not in the promised form.
fn malformed(line: &str) -> ! {
    panic!(
        "malformed backup line (expected `backup at index N: S streams, T tables, B bytes \
         in DIR`): {line:?}"
    )
}

/// Parses `restored index N into NEW`, returning N.
fn restored_index(stdout: &str, dir: &Path) -> i64 {
    let line = stdout
        .lines()
        .find(|l| l.starts_with("restored index "))
        .unwrap_or_else(|| panic!("no `restored index` line in {stdout:?}"));
    let words: Vec<&str> = line.split_whitespace().collect();
    assert!(
        words.len() >= 5 && words[3] == "into" && line.ends_with(path_str(dir)),
        "malformed restore line (expected `restored index N into {}`): {line:?}",
        dir.display()
    );
    words[2]
        .parse()
        .unwrap_or_else(|e| panic!("index in {line:?}: {e}"))
}

/// One finished run of the `sluice` command line.
struct Cli {
    ok: bool,
    stdout: String,
    stderr: String,
}

/// Runs `sluice ARGS` to its end (within [`CLI_TIMEOUT`]), its output echoed into the test's.
async fn sluice_cli(args: &[&str]) -> Cli {
    let what = format!("sluice {}", args.join(" "));
    let output = within(
        CLI_TIMEOUT,
        &what,
        tokio::process::Command::new(binary_path())
            .args(args)
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .kill_on_drop(true)
            .output(),
    )
    .await
    .unwrap_or_else(|e| panic!("{what}: {e}"));
    let cli = Cli {
        ok: output.status.success(),
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
    };
    eprintln!(
        "[{what}] {}\n  stdout: {}\n  stderr: {}",
        output.status,
        cli.stdout.trim_end(),
        cli.stderr.trim_end()
    );
    cli
}

/// `sluice backup --to DIR` against the server on `port` (trust authentication).
async fn cli_backup(port: u16, to: &Path) -> Cli {
    let port = port.to_string();
    sluice_cli(&[
        "backup",
        "--to",
        path_str(to),
        "--host",
        "127.0.0.1",
        "--port",
        &port,
        "--user",
        "sluice",
        "--dbname",
        "sluice",
    ])
    .await
}

/// `sluice restore --from DIR --data-dir NEW`.
async fn cli_restore(from: &Path, into: &Path) -> Cli {
    sluice_cli(&[
        "restore",
        "--from",
        path_str(from),
        "--data-dir",
        path_str(into),
    ])
    .await
}

/// A `sluice serve` on a data directory the test owns (a restored one), killed when dropped.
struct Node {
    child: Child,
    port: u16,
}

impl Node {
    async fn start(data_dir: &Path, tag: &str) -> Node {
        let (child, port_rx) = spawn_sluice(data_dir, &[], tag.to_string());
        let mut node = Node { child, port: 0 };
        let deadline = Instant::now() + STARTUP_TIMEOUT;
        loop {
            match port_rx.try_recv() {
                Ok(port) => {
                    node.port = port;
                    return node;
                }
                Err(mpsc::TryRecvError::Disconnected) => panic!(
                    "sluice on {} exited without listening; see its output above",
                    data_dir.display()
                ),
                Err(mpsc::TryRecvError::Empty) => {}
            }
            assert!(
                Instant::now() < deadline,
                "sluice on {} did not listen within {STARTUP_TIMEOUT:?}",
                data_dir.display()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    async fn client(&self, user: &str) -> Client {
        connect(&format!(
            "host=127.0.0.1 port={} user={user} dbname=sluice connect_timeout=10",
            self.port
        ))
        .await
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        // an error means it already exited
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A new connection; its connection task runs on the current runtime.
async fn connect(conn_string: &str) -> Client {
    let (client, connection) = within(
        CONNECT_TIMEOUT,
        conn_string,
        tokio_postgres::connect(conn_string, NoTls),
    )
    .await
    .unwrap_or_else(|e| panic!("connect with {conn_string}: {e}"));
    tokio::spawn(async move {
        if let Err(e) = connection.await {
            eprintln!("[client] connection ended: {e}");
        }
    });
    client
}

async fn query_one(client: &Client, sql: &str) -> tokio_postgres::Row {
    within(STATEMENT_TIMEOUT, sql, client.query_one(sql, &[]))
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e:?}"))
}

fn path_str(path: &Path) -> &str {
    path.to_str().expect("a UTF-8 path")
}

/// `path` as an SQL string literal.
fn literal(path: &Path) -> String {
    format!("'{}'", path_str(path).replace('\'', "''"))
}

/// The names in a directory, sorted.
fn listing(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("read {}: {e}", dir.display()))
        .map(|e| {
            e.expect("directory entry")
                .file_name()
                .to_string_lossy()
                .into_owned()
        })
        .collect();
    names.sort();
    names
}

/// Every file under `dir` (at most 8 levels deep).
fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    let mut pending = vec![(dir.to_path_buf(), 0)];
    while let Some((dir, depth)) = pending.pop() {
        let entries =
            std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("read {}: {e}", dir.display()));
        for entry in entries {
            let path = entry.expect("directory entry").path();
            if path.is_dir() {
                assert!(depth < 8, "{} is nested too deep", path.display());
                pending.push((path, depth + 1));
            } else {
                files.push(path);
            }
        }
    }
    files.sort();
    files
}

/// Copies the tree at `from` to `to`, which must not exist.
fn copy_dir(from: &Path, to: &Path) {
    for file in walk(from) {
        let rel = file.strip_prefix(from).expect("a file under the tree");
        let target = to.join(rel);
        if let Some(parent) = target.parent() {
            std::fs::create_dir_all(parent)
                .unwrap_or_else(|e| panic!("create {}: {e}", parent.display()));
        }
        std::fs::copy(&file, &target)
            .unwrap_or_else(|e| panic!("copy {} to {}: {e}", file.display(), target.display()));
    }
}

/// Backups taken while retention cuts a stream every second and other streams are created
/// and dropped: each attempt either copies the state of its checkpoint whole or starts over
/// (a segment the record needs was deleted, a stream it names was dropped), so every backup
/// restores and opens, and the stream's rows run without a gap from its first retained
/// offset, each with its own payload.
#[tokio::test(flavor = "multi_thread")]
async fn backups_taken_while_retention_cuts_and_streams_drop_restore_whole() {
    let server = Server::start_with(&["--segment-bytes", "4096"]).await;
    let admin = server.client().await;
    exec(
        &admin,
        "CREATE STREAM r (n bigint NOT NULL, v text) WITH (retention_bytes = '12kB')",
    )
    .await;
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let client = server.client().await;
        let stop = stop.clone();
        tokio::spawn(async move {
            let mut n = 0i64;
            while !stop.load(Ordering::Relaxed) && n < 20_000 {
                exec(
                    &client,
                    &format!("INSERT INTO r VALUES ({n}, 'row {n} {}')", "p".repeat(300)),
                )
                .await;
                n += 1;
            }
            n
        })
    };
    let churn = {
        let client = server.client().await;
        let stop = stop.clone();
        tokio::spawn(async move {
            let mut i = 0;
            while !stop.load(Ordering::Relaxed) && i < 2_000 {
                exec(&client, &format!("CREATE STREAM tmp_{i} (a int)")).await;
                exec(&client, &format!("INSERT INTO tmp_{i} VALUES (1), (2)")).await;
                exec(&client, &format!("DROP STREAM tmp_{i}")).await;
                i += 1;
            }
        })
    };
    let work = tempfile::tempdir().expect("create a temporary directory");
    let mut restored_firsts = Vec::new();
    for round in 0..4 {
        tokio::time::sleep(Duration::from_millis(700)).await;
        let dir = work.path().join(format!("backup-{round}"));
        let row = query_one(
            &admin,
            &format!("SELECT * FROM sluice_backup({})", literal(&dir)),
        )
        .await;
        let index: i64 = row.get("applied_index");
        let into = work.path().join(format!("restored-{round}"));
        let out = cli_restore(&dir, &into).await;
        assert!(out.ok, "backup {round} does not restore: {}", out.stderr);
        assert_eq!(restored_index(&out.stdout, &into), index);
        let node = Node::start(&into, &format!("restored-{round}")).await;
        let client = node.client("sluice").await;
        let rows = simple_rows(&client, "SELECT offset, n, v FROM r ORDER BY offset").await;
        let first = simple_rows(
            &client,
            "SELECT first_offset FROM sluice_streams WHERE name = 'r'",
        )
        .await[0][0]
            .clone()
            .expect("first_offset");
        let first: i64 = first.parse().expect("a number");
        for (i, row) in rows.iter().enumerate() {
            let offset = int(row, 0);
            assert_eq!(offset, first + i as i64, "backup {round}: a gap in r");
            let n = int(row, 1);
            assert_eq!(offset, n, "backup {round}: row {offset} holds {n}");
            assert_eq!(
                row[2].as_deref(),
                Some(format!("row {n} {}", "p".repeat(300)).as_str())
            );
        }
        restored_firsts.push(first);
    }
    stop.store(true, Ordering::Relaxed);
    let written = writer.await.expect("writer");
    churn.await.expect("churn");
    assert!(written > 50, "only {written} rows written");
    let rows = simple_rows(
        &admin,
        "SELECT first_offset FROM sluice_streams WHERE name = 'r'",
    )
    .await;
    let source_first: i64 = rows[0][0]
        .clone()
        .expect("first")
        .parse()
        .expect("a number");
    assert!(
        source_first > 0,
        "retention never cut r while the backups ran ({restored_firsts:?})"
    );
}

/// Backups taken while three connections create and drop streams as fast as they can: a
/// drop deletes its stream's directory right after the checkpoint that no longer names it,
/// so a backup that read the record before that checkpoint used to find the directory gone
/// before it opened the files, and started over — every attempt, under this churn (CI saw
/// five in a row: "streams were truncated or dropped under the backup 5 times"). Deletions
/// now wait while a backup reads its record and opens the files it names: every backup
/// succeeds, and each restores with the kept stream whole.
#[tokio::test(flavor = "multi_thread")]
async fn backups_succeed_while_streams_are_dropped_without_pause() {
    const CHURNERS: usize = 3;
    const BACKUPS: usize = 8;
    let server = Server::start_with(&["--segment-bytes", "4096"]).await;
    let admin = server.client().await;
    exec(&admin, "CREATE STREAM kept (n bigint NOT NULL, v text)").await;
    exec(&admin, "CREATE TABLE big (k bigint PRIMARY KEY, v text)").await;
    // ~200 segment files and a table of 8 MB: the old attempt read the record, then every
    // table, then opened the stream files — the window a drop landed in
    // INSERT of rows `i * per .. (i + 1) * per`, each (key, `fill` repeated `width` times)
    let insert = |into: &str, i: i64, per: i64, fill: &str, width: usize| {
        let values: Vec<String> = (i * per..(i + 1) * per)
            .map(|k| format!("({k}, '{}')", fill.repeat(width)))
            .collect();
        format!("INSERT INTO {into} VALUES {}", values.join(", "))
    };
    for i in 0..20 {
        exec(&admin, &insert("kept", i, 50, "k", 200)).await;
        exec(&admin, &insert("big", i, 1_000, "b", 400)).await;
    }
    let stop = Arc::new(AtomicBool::new(false));
    let mut churners = Vec::new();
    for c in 0..CHURNERS {
        let client = server.client().await;
        let stop = stop.clone();
        churners.push(tokio::spawn(async move {
            let mut i = 0;
            while !stop.load(Ordering::Relaxed) && i < 5_000 {
                exec(&client, &format!("CREATE STREAM churn_{c}_{i} (a int)")).await;
                exec(&client, &format!("DROP STREAM churn_{c}_{i}")).await;
                i += 1;
            }
            i
        }));
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let work = tempfile::tempdir().expect("create a temporary directory");
    for round in 0..BACKUPS {
        let dir = work.path().join(format!("backup-{round}"));
        let sql = format!("SELECT * FROM sluice_backup({})", literal(&dir));
        if let Err(e) = admin.query_one(sql.as_str(), &[]).await {
            stop.store(true, Ordering::Relaxed);
            panic!("backup {round} under churn: {e:?}");
        }
        if round + 1 == BACKUPS {
            let into = work.path().join("restored");
            let out = cli_restore(&dir, &into).await;
            assert!(out.ok, "the backup does not restore: {}", out.stderr);
            let node = Node::start(&into, "restored").await;
            let client = node.client("sluice").await;
            let rows = simple_rows(&client, "SELECT count(*), sum(n) FROM kept").await;
            assert_eq!(rows[0][0].as_deref(), Some("1000"));
            assert_eq!(rows[0][1].as_deref(), Some("499500"));
            let rows = simple_rows(&client, "SELECT count(*) FROM big").await;
            assert_eq!(rows[0][0].as_deref(), Some("20000"));
        }
    }
    stop.store(true, Ordering::Relaxed);
    let mut dropped = 0;
    for c in churners {
        dropped += c.await.expect("churner");
    }
    assert!(
        dropped > BACKUPS,
        "only {dropped} streams dropped during the backups"
    );
}
