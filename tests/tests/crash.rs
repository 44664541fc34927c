//! Crash safety: acknowledged writes survive SIGKILL, offsets stay gapless,
//! statements are atomic, and a torn tail of a log file is ignored.
//!
//! The kill test runs 16 concurrent writers whose rows carry (round, writer,
//! seq, stmt). Every statement either came back with its offsets
//! (acknowledged: its rows must be present, at exactly those offsets, after
//! recovery) or did not (unknown: all of its rows present or none). Each
//! outcome observed after a recovery must hold after every later one too.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime};

use rand::{Rng, SeedableRng};
use sluice_tests::{exec, within, Server, STATEMENT_TIMEOUT};
use tokio_postgres::Client;

const WRITERS: i32 = 16;
const ROUNDS: i32 = 5;
/// Writers stop by themselves after this long even if the kill never comes.
const WRITE_LIMIT: Duration = Duration::from_secs(20);
const MAX_STATEMENTS_PER_WRITER: i32 = 20_000;
/// Rows of the probe insert after each recovery use this writer id.
const PROBE_WRITER: i32 = WRITERS;

/// (round, writer, seq): identifies one row.
type RowKey = (i32, i32, i32);

#[derive(Debug, Clone)]
struct Statement {
    id: i64,
    rows: Vec<RowKey>,
}

/// What one writer saw: statements acknowledged with their offsets, and the
/// statement in flight when the connection broke, if any.
#[derive(Default)]
struct WriterLog {
    acked: Vec<(Statement, Vec<i64>)>,
    unknown: Option<Statement>,
}

/// Everything known about the stream's contents across rounds.
#[derive(Default)]
struct Ledger {
    /// Row → offset, for rows known to be committed.
    present: HashMap<RowKey, (i64, i64)>,
    /// Rows of unacknowledged statements found absent after a recovery.
    absent: HashSet<RowKey>,
    /// Unacknowledged statements of the latest round, not yet resolved.
    unknown: Vec<Statement>,
}

impl Ledger {
    fn record(&mut self, log: WriterLog) {
        for (stmt, offsets) in log.acked {
            assert_eq!(
                offsets.len(),
                stmt.rows.len(),
                "RETURNING row count of statement {}",
                stmt.id
            );
            for (key, offset) in stmt.rows.iter().zip(offsets) {
                self.present.insert(*key, (offset, stmt.id));
            }
        }
        self.unknown.extend(log.unknown);
    }

    /// Checks the recovered stream (`offset, round, writer, seq, stmt` rows
    /// in offset order) against everything known, then resolves the
    /// unknown statements by what recovery kept.
    fn verify(&mut self, rows: &[(i64, i32, i32, i32, i64)]) {
        let mut found: HashMap<RowKey, (i64, i64)> = HashMap::new();
        for (i, &(offset, round, writer, seq, stmt)) in rows.iter().enumerate() {
            assert_eq!(offset, i as i64, "offsets are not gapless from 0");
            let previous = found.insert((round, writer, seq), (offset, stmt));
            assert!(
                previous.is_none(),
                "row {:?} appears twice",
                (round, writer, seq)
            );
        }
        for (key, expected) in &self.present {
            assert_eq!(
                found.get(key),
                Some(expected),
                "acknowledged row {key:?} lost or moved"
            );
        }
        for key in &self.absent {
            assert!(
                !found.contains_key(key),
                "row {key:?} absent after an earlier recovery came back"
            );
        }
        for stmt in std::mem::take(&mut self.unknown) {
            let kept: Vec<_> = stmt
                .rows
                .iter()
                .filter_map(|k| found.get(k).map(|v| (*k, *v)))
                .collect();
            assert!(
                kept.is_empty() || kept.len() == stmt.rows.len(),
                "statement {} was torn: {} of {} rows survived",
                stmt.id,
                kept.len(),
                stmt.rows.len()
            );
            for (key, (_, stmt_id)) in &kept {
                assert_eq!(
                    *stmt_id, stmt.id,
                    "row {key:?} carries the wrong statement id"
                );
            }
            if kept.is_empty() {
                self.absent.extend(stmt.rows);
            } else {
                self.present.extend(kept);
            }
        }
        assert_eq!(
            found.len(),
            self.present.len(),
            "the stream holds rows nobody wrote"
        );
        // Rows from one connection keep their order.
        let mut by_writer: BTreeMap<(i32, i32), Vec<(i32, i64)>> = BTreeMap::new();
        for (&(round, writer, seq), &(offset, _)) in &found {
            by_writer
                .entry((round, writer))
                .or_default()
                .push((seq, offset));
        }
        for (writer, mut rows) in by_writer {
            rows.sort();
            assert!(
                rows.windows(2).all(|w| w[0].1 < w[1].1),
                "rows of writer {writer:?} out of order"
            );
        }
    }
}

async fn write_until_broken(client: Client, round: i32, writer: i32) -> WriterLog {
    let mut log = WriterLog::default();
    let mut rng = rand::rngs::StdRng::from_entropy();
    let deadline = Instant::now() + WRITE_LIMIT;
    let mut seq = 0;
    for stmt_no in 0..MAX_STATEMENTS_PER_WRITER {
        if Instant::now() >= deadline {
            break;
        }
        let n = if rng.gen_bool(0.5) {
            1
        } else {
            rng.gen_range(2..=4)
        };
        let id = i64::from(round * 100 + writer) * 1_000_000 + i64::from(stmt_no);
        let rows: Vec<RowKey> = (seq..seq + n).map(|s| (round, writer, s)).collect();
        seq += n;
        let values: Vec<String> = rows
            .iter()
            .map(|(r, w, s)| format!("({r}, {w}, {s}, {id})"))
            .collect();
        let sql = format!(
            "INSERT INTO crash VALUES {} RETURNING offset",
            values.join(", ")
        );
        let stmt = Statement { id, rows };
        match tokio::time::timeout(Duration::from_secs(10), client.query(sql.as_str(), &[])).await {
            Ok(Ok(returned)) => log
                .acked
                .push((stmt, returned.iter().map(|r| r.get(0)).collect())),
            // The server sends no error when it is killed: an error it did
            // send is a bug, not the crash.
            Ok(Err(e)) if e.as_db_error().is_some() => {
                panic!("writer {writer}: INSERT failed with a server error: {e:?}")
            }
            Ok(Err(_)) | Err(_) => {
                log.unknown = Some(stmt);
                break;
            }
        }
    }
    log
}

async fn read_all(client: &Client) -> Vec<(i64, i32, i32, i32, i64)> {
    let sql = "SELECT offset, round, writer, seq, stmt FROM crash ORDER BY offset";
    within(STATEMENT_TIMEOUT, sql, client.query(sql, &[]))
        .await
        .expect("read back the crash stream")
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3), r.get(4)))
        .collect()
}

/// After a recovery: verify, then check the stream accepts a new row at
/// the next offset (recorded as acknowledged).
async fn verify_and_probe(server: &Server, ledger: &mut Ledger, round: i32) {
    let client = server.client().await;
    let rows = read_all(&client).await;
    ledger.verify(&rows);
    let sql = format!("INSERT INTO crash VALUES ({round}, {PROBE_WRITER}, 0, -1) RETURNING offset");
    let probe = within(STATEMENT_TIMEOUT, &sql, client.query_one(sql.as_str(), &[]))
        .await
        .expect("insert after recovery");
    let offset: i64 = probe.get(0);
    assert_eq!(
        offset,
        rows.len() as i64,
        "the first insert after recovery must take the next offset"
    );
    ledger
        .present
        .insert((round, PROBE_WRITER, 0), (offset, -1));
}

#[tokio::test(flavor = "multi_thread")]
async fn acknowledged_writes_survive_sigkill() {
    let mut server = Server::start().await;
    exec(&server.client().await, "CREATE STREAM crash (round integer NOT NULL, writer integer NOT NULL, seq integer NOT NULL, stmt bigint NOT NULL)").await;
    let mut ledger = Ledger::default();
    let mut total_acked = 0;
    for round in 0..ROUNDS {
        let mut clients = Vec::new();
        for _ in 0..WRITERS {
            clients.push(server.client().await);
        }
        let tasks: Vec<_> = clients
            .into_iter()
            .zip(0..)
            .map(|(client, writer)| tokio::spawn(write_until_broken(client, round, writer)))
            .collect();
        let delay = rand::thread_rng().gen_range(200..=1500);
        tokio::time::sleep(Duration::from_millis(delay)).await;
        server.kill();
        let mut acked = 0;
        for task in tasks {
            let log = within(Duration::from_secs(60), "writer after kill", task)
                .await
                .expect("writer task");
            acked += log.acked.len();
            ledger.record(log);
        }
        println!(
            "round {round}: killed after {delay} ms; {acked} statements acknowledged, {} unknown",
            ledger.unknown.len()
        );
        total_acked += acked;
        server.restart().await;
        verify_and_probe(&server, &mut ledger, round).await;
    }
    assert!(
        total_acked > 0,
        "no statement was acknowledged in {ROUNDS} rounds: the test proved nothing"
    );
}

/// The newest file (by modification time, then name) with extension `ext`
/// anywhere under `dir`.
fn newest_file(dir: &Path, ext: &str) -> Option<PathBuf> {
    let mut best: Option<(SystemTime, PathBuf)> = None;
    let mut pending = vec![(dir.to_path_buf(), 0)];
    while let Some((dir, depth)) = pending.pop() {
        let entries =
            std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("read {}: {e}", dir.display()));
        for entry in entries.take(100_000) {
            let path = entry.expect("directory entry").path();
            let meta = std::fs::metadata(&path).expect("file metadata");
            if meta.is_dir() && depth < 8 {
                pending.push((path, depth + 1));
            } else if meta.is_file() && path.extension().is_some_and(|e| e == ext) {
                let key = (meta.modified().expect("mtime"), path);
                if best.as_ref().is_none_or(|b| key > *b) {
                    best = Some(key);
                }
            }
        }
    }
    best.map(|(_, path)| path)
}

fn append(path: &Path, bytes: &[u8]) {
    use std::io::Write;
    let mut file = std::fs::OpenOptions::new()
        .append(true)
        .open(path)
        .expect("open for append");
    file.write_all(bytes).expect("append garbage");
    file.sync_all().expect("sync");
}

async fn insert_batch(client: &Client, first: i64, n: i64) {
    let values: Vec<String> = (first..first + n)
        .map(|i| format!("({i}, 'row {i}')"))
        .collect();
    let sql = format!(
        "INSERT INTO torn VALUES {} RETURNING offset",
        values.join(", ")
    );
    let offsets: Vec<i64> = within(STATEMENT_TIMEOUT, "insert", client.query(sql.as_str(), &[]))
        .await
        .expect("insert into torn")
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(
        offsets,
        (first..first + n).collect::<Vec<_>>(),
        "offsets continue gaplessly"
    );
}

async fn assert_torn_rows(client: &Client, expected: i64) {
    let sql = "SELECT offset, id, body FROM torn ORDER BY offset";
    let rows = within(STATEMENT_TIMEOUT, sql, client.query(sql, &[]))
        .await
        .expect("read torn");
    assert_eq!(
        rows.len() as i64,
        expected,
        "rows after recovering from a torn tail"
    );
    for (i, row) in rows.iter().enumerate() {
        let (offset, id, body): (i64, i64, String) = (row.get(0), row.get(1), row.get(2));
        assert_eq!((offset, id, body), (i as i64, i as i64, format!("row {i}")));
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn torn_tail_of_log_files_is_ignored() {
    let mut server = Server::start().await;
    let mut rows = 0;
    {
        let client = server.client().await;
        exec(&client, "CREATE STREAM torn (id bigint, body text)").await;
        for _ in 0..3 {
            insert_batch(&client, rows, 10).await;
            rows += 10;
        }
    }
    let mut header_and_part = 4096_u32.to_le_bytes().to_vec();
    header_and_part.extend([0x5a, 0xa5, 0x00, 0x01, 0xff, 0x42, 0x42, 0x42]);
    let tails: [(&str, &[u8]); 4] = [
        ("wal", &[0x2a, 0x00, 0x00]),
        ("wal", &header_and_part),
        ("seg", &[0x01, 0x00]),
        ("seg", &header_and_part),
    ];
    for (ext, garbage) in tails {
        let status = server.stop().await;
        assert!(
            status.success(),
            "sluice exited with {status} after SIGTERM"
        );
        let file = newest_file(server.data_dir(), ext)
            .unwrap_or_else(|| panic!("no *.{ext} file under {}", server.data_dir().display()));
        println!(
            "appending {} garbage bytes to {}",
            garbage.len(),
            file.display()
        );
        append(&file, garbage);
        server.restart().await;
        let client = server.client().await;
        assert_torn_rows(&client, rows).await;
        insert_batch(&client, rows, 5).await;
        rows += 5;
        assert_torn_rows(&client, rows).await;
    }
}
