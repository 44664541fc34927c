//! Transactions are all-or-nothing across SIGKILL (ten kills per run): each transaction appends
//! one row to two streams, inserts a row into a table and bumps its
//! writer's counter in another; the server is killed at random moments
//! (checkpointing every few dozen entries, so recovery replays onto
//! checkpointed tables). After every recovery the two streams and the table
//! hold the same ids, every acknowledged id is there, nothing else is, and
//! every counter equals its writer's rows.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use rand::{Rng, SeedableRng};
use sluice_tests::{exec, within, Server, STATEMENT_TIMEOUT};
use tokio_postgres::Client;

const WRITERS: i64 = 6;
const ROUNDS: usize = 10;
const WRITE_LIMIT: Duration = Duration::from_secs(15);
const MAX_TXNS_PER_WRITER: i64 = 5_000;

#[derive(Default)]
struct WriterLog {
    acked: Vec<i64>,
    unknown: Option<i64>,
}

async fn write_until_broken(client: Client, round: i64, writer: i64) -> WriterLog {
    let mut log = WriterLog::default();
    let deadline = Instant::now() + WRITE_LIMIT;
    for n in 0..MAX_TXNS_PER_WRITER {
        if Instant::now() >= deadline {
            break;
        }
        let id = (round * 100 + writer) * 1_000_000 + n;
        let sql = format!(
            "BEGIN; \
             INSERT INTO ta VALUES ({id}, {writer}); \
             INSERT INTO tb VALUES ({id}, {writer}); \
             INSERT INTO ids VALUES ({id}, {writer}); \
             INSERT INTO counters VALUES ({writer}, 1) \
               ON CONFLICT (writer) DO UPDATE SET n = counters.n + 1; \
             COMMIT"
        );
        match tokio::time::timeout(Duration::from_secs(10), client.batch_execute(&sql)).await {
            Ok(Ok(())) => log.acked.push(id),
            Ok(Err(e)) if e.as_db_error().is_some() => {
                // concurrent counter updates conflict by design: retry
                // is the client's job, and the rolled-back id is simply
                // never acknowledged
                if e.code().map(|c| c.code()) == Some("40001") {
                    let _ = client.batch_execute("ROLLBACK").await;
                    continue;
                }
                panic!("writer {writer}: transaction failed with a server error: {e:?}")
            }
            Ok(Err(_)) | Err(_) => {
                log.unknown = Some(id);
                break;
            }
        }
    }
    log
}

async fn ids(client: &Client, sql: &str) -> Vec<i64> {
    within(STATEMENT_TIMEOUT, sql, client.query(sql, &[]))
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"))
        .iter()
        .map(|r| r.get(0))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn transactions_are_atomic_across_sigkill() {
    let mut server = Server::start_with(&["--checkpoint-entries", "40"]).await;
    let setup = server.client().await;
    exec(
        &setup,
        "CREATE STREAM ta (id bigint NOT NULL, writer bigint)",
    )
    .await;
    exec(
        &setup,
        "CREATE STREAM tb (id bigint NOT NULL, writer bigint)",
    )
    .await;
    exec(
        &setup,
        "CREATE TABLE ids (id bigint PRIMARY KEY, writer bigint)",
    )
    .await;
    exec(
        &setup,
        "CREATE TABLE counters (writer bigint PRIMARY KEY, n bigint NOT NULL)",
    )
    .await;
    drop(setup);

    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    let mut acked: BTreeSet<i64> = BTreeSet::new();
    let mut absent: BTreeSet<i64> = BTreeSet::new();
    let mut total_acked = 0usize;
    for round in 0..ROUNDS as i64 {
        let mut writers = Vec::new();
        for w in 0..WRITERS {
            let client = server.client().await;
            writers.push(tokio::spawn(write_until_broken(client, round, w)));
        }
        tokio::time::sleep(Duration::from_millis(rng.gen_range(300..1500))).await;
        server.kill();
        let mut unknown = Vec::new();
        for h in writers {
            let log = within(Duration::from_secs(30), "writer", h)
                .await
                .expect("writer task");
            total_acked += log.acked.len();
            acked.extend(log.acked);
            unknown.extend(log.unknown);
        }
        server.restart().await;
        let client = server.client().await;
        let a: BTreeSet<i64> = ids(&client, "SELECT id FROM ta")
            .await
            .into_iter()
            .collect();
        let b: BTreeSet<i64> = ids(&client, "SELECT id FROM tb")
            .await
            .into_iter()
            .collect();
        let t: BTreeSet<i64> = ids(&client, "SELECT id FROM ids")
            .await
            .into_iter()
            .collect();
        assert_eq!(a, b, "round {round}: the two streams differ");
        assert_eq!(a, t, "round {round}: stream and table differ");
        let missing: Vec<&i64> = acked.difference(&t).collect();
        assert!(
            missing.is_empty(),
            "round {round}: acknowledged ids lost: {missing:?}"
        );
        for id in &t {
            assert!(
                acked.contains(id) || unknown.contains(id),
                "round {round}: id {id} was never written (or came back after being absent)"
            );
            assert!(!absent.contains(id), "round {round}: id {id} came back");
        }
        for id in unknown {
            if t.contains(&id) {
                acked.insert(id);
            } else {
                absent.insert(id);
            }
        }
        // every counter equals its writer's committed transactions
        let rows = within(
            STATEMENT_TIMEOUT,
            "counters",
            client.query("SELECT writer, n FROM counters", &[]),
        )
        .await
        .expect("read counters");
        let counters: BTreeMap<i64, i64> = rows.iter().map(|r| (r.get(0), r.get(1))).collect();
        let mut per_writer: BTreeMap<i64, i64> = BTreeMap::new();
        for id in &t {
            *per_writer.entry((id / 1_000_000) % 100).or_default() += 1;
        }
        assert_eq!(
            counters, per_writer,
            "round {round}: counters disagree with rows"
        );
    }
    assert!(
        total_acked > 0,
        "no transaction was acknowledged in any round"
    );
    eprintln!(
        "{ROUNDS} kills: {total_acked} acknowledged transactions, {} ids present",
        acked.len()
    );
    server.stop().await;
}
