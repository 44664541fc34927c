//! Secondary indexes never change an answer: a differential test against a twin table.
//!
//! Two tables get the same random inserts, updates and deletes (fixed seed, bounded): one
//! with a two-column index and a UNIQUE index, one with none. After every few writes the
//! same random lookups (equality on leading columns, ranges, NULLs) must return the same
//! rows from both. Each write runs first on the plain twin inside a transaction: when it
//! would leave two rows with the same non-NULL `c`, the twin rolls back and the indexed
//! table must refuse it (23505); otherwise the twin commits and the indexed table must
//! accept it. So UNIQUE is shown neither too strict nor too lax. The server checkpoints
//! every few commands, so lookups read entries both from the table file and from memory.
//! Longer: `SLUICE_INDEX_OPS=20000 cargo test -p sluice-tests --test indexes`.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use sluice_tests::{exec, simple_rows, sqlstate, text_rows, Server};
use tokio_postgres::Client;

const TABLES: [&str; 2] = ["twin_indexed", "twin_plain"];

fn value(rng: &mut StdRng, max: i32) -> String {
    if rng.gen_range(0..6) == 0 {
        "NULL".into()
    } else {
        rng.gen_range(0..max).to_string()
    }
}

fn text(rng: &mut StdRng) -> String {
    ["'x'", "'y'", "'z'", "'xy'", "NULL"][rng.gen_range(0..5)].to_string()
}

/// A random write, with `{t}` for the table.
fn write(rng: &mut StdRng) -> String {
    let id = rng.gen_range(0..40);
    match rng.gen_range(0..5) {
        0 | 1 => format!(
            "INSERT INTO {{t}} VALUES ({id}, {}, {}, {})",
            value(rng, 6),
            text(rng),
            value(rng, 60)
        ),
        2 => format!(
            "UPDATE {{t}} SET a = {}, b = {} WHERE id = {id}",
            value(rng, 6),
            text(rng)
        ),
        3 => format!(
            "UPDATE {{t}} SET c = {} WHERE id >= {id} AND id < {}",
            value(rng, 60),
            id + 2
        ),
        _ => format!("DELETE FROM {{t}} WHERE id = {id}"),
    }
}

/// A random lookup's WHERE clause.
fn lookup(rng: &mut StdRng) -> String {
    let a = rng.gen_range(-1..7);
    let c = rng.gen_range(-1..61);
    let b = text(rng);
    match rng.gen_range(0..11) {
        0 => format!("a = {a}"),
        1 => format!("a = {a} AND b = {b}"),
        2 => format!("a = {a} AND b > {b}"),
        3 => format!("a = {a} AND b <= {b}"),
        4 => format!("a > {a}"),
        5 => format!("a <= {a}"),
        6 => format!("a >= {a} AND a < {}", a + 2),
        7 => format!("c = {c}"),
        8 => format!("c > {c} AND c <= {}", c + 10),
        9 => "a IS NULL".into(),
        _ => format!("b = {b}"),
    }
}

async fn rows(client: &Client, table: &str, cond: &str) -> Vec<Vec<Option<String>>> {
    simple_rows(
        client,
        &format!("SELECT id, a, b, c FROM {table} WHERE {cond} ORDER BY id"),
    )
    .await
}

async fn duplicate_c(client: &Client) -> bool {
    let n = text_rows(
        client,
        "SELECT count(*) FROM (SELECT c FROM twin_plain WHERE c IS NOT NULL GROUP BY c HAVING count(*) > 1) d",
    )
    .await;
    n[0][0] != "0"
}

#[tokio::test(flavor = "multi_thread")]
async fn lookups_through_indexes_match_a_table_without_them() {
    let ops: usize = std::env::var("SLUICE_INDEX_OPS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(600);
    // frequent checkpoints: lookups merge the checkpointed entries with the newer ones
    let server = Server::start_with(&["--checkpoint-entries", "7"]).await;
    let client = server.client().await;
    for t in TABLES {
        exec(
            &client,
            &format!("CREATE TABLE {t} (id int PRIMARY KEY, a int, b text, c int)"),
        )
        .await;
    }
    exec(&client, "CREATE INDEX twin_ab ON twin_indexed (a, b)").await;
    exec(&client, "CREATE UNIQUE INDEX twin_c ON twin_indexed (c)").await;
    let plan = text_rows(&client, "EXPLAIN SELECT * FROM twin_indexed WHERE a = 1").await;
    assert!(
        plan.concat().concat().contains("IndexScan: index=twin_ab"),
        "{plan:?}"
    );
    let mut rng = StdRng::seed_from_u64(0x5eed_1dec);
    let (mut refused, mut compared) = (0, 0);
    for i in 0..ops {
        let sql = write(&mut rng);
        exec(&client, "BEGIN").await;
        let plain = client.simple_query(&sql.replace("{t}", "twin_plain")).await;
        let twin_dup = plain.is_ok() && duplicate_c(&client).await;
        if plain.is_err() || twin_dup {
            exec(&client, "ROLLBACK").await;
        } else {
            exec(&client, "COMMIT").await;
        }
        let indexed = client
            .simple_query(&sql.replace("{t}", "twin_indexed"))
            .await;
        match (&plain, &indexed) {
            (Ok(_), Ok(_)) => assert!(
                !twin_dup,
                "op {i}: `{sql}` broke UNIQUE (c) and was accepted"
            ),
            (Ok(_), Err(e)) => {
                assert!(twin_dup, "op {i}: `{sql}` refused without a duplicate: {e}");
                assert_eq!(sqlstate(e), Some("23505"), "op {i}: `{sql}`: {e}");
                refused += 1;
            }
            // the primary key refuses it on both
            (Err(p), Err(e)) => assert_eq!(sqlstate(p), sqlstate(e), "op {i}: `{sql}`"),
            (Err(p), Ok(_)) => panic!("op {i}: `{sql}` accepted, the plain twin refused: {p}"),
        }
        if i % 5 == 4 {
            for _ in 0..4 {
                let cond = lookup(&mut rng);
                assert_eq!(
                    rows(&client, "twin_indexed", &cond).await,
                    rows(&client, "twin_plain", &cond).await,
                    "after op {i}: WHERE {cond}"
                );
                compared += 1;
            }
        }
    }
    assert_eq!(
        rows(&client, "twin_indexed", "true").await,
        rows(&client, "twin_plain", "true").await
    );
    // the run exercised both sides of UNIQUE
    assert!(
        refused > 0 && compared > 0,
        "refused {refused}, compared {compared}"
    );
}

/// Concurrent upserts arbitrated by a UNIQUE column (not the key): four sessions each
/// propose 25 rows with fresh ids and the same email. Exactly one row may result, and
/// every proposal must count once: a proposal that missed another session's new row
/// would either be refused at commit (23505) or insert a second row.
#[tokio::test(flavor = "multi_thread")]
async fn concurrent_upserts_on_a_unique_column_count_every_proposal_once() {
    let server = Server::start().await;
    let setup = server.client().await;
    exec(
        &setup,
        "CREATE TABLE hits (id int PRIMARY KEY, email text UNIQUE, n int NOT NULL)",
    )
    .await;
    let mut tasks = Vec::new();
    for s in 0..4 {
        let client = server.client().await;
        tasks.push(tokio::spawn(async move {
            for i in 0..25 {
                let sql = format!(
                    "INSERT INTO hits VALUES ({}, 'same', 1) \
                     ON CONFLICT (email) DO UPDATE SET n = hits.n + 1",
                    s * 100 + i
                );
                client
                    .batch_execute(&sql)
                    .await
                    .map_err(|e| format!("{sql}: {e:?}"))?;
            }
            Ok::<(), String>(())
        }));
    }
    for t in tasks {
        if let Err(e) = t.await.expect("task panicked") {
            panic!("an upsert failed: {e}");
        }
    }
    assert_eq!(
        text_rows(&setup, "SELECT email, n FROM hits").await,
        vec![vec!["same".to_string(), "100".into()]]
    );
}
