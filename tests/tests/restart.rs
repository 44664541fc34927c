//! Streams, rows and offsets survive a restart, whether the server was
//! stopped with SIGTERM or killed with SIGKILL.

use chrono::{DateTime, Utc};
use sluice_tests::{exec, text_rows, within, Server, STATEMENT_TIMEOUT};
use tokio_postgres::Client;

#[derive(Clone, Copy, Debug)]
enum Stop {
    Graceful,
    Crash,
}

async fn stop(server: &mut Server, how: Stop) {
    match how {
        Stop::Graceful => {
            let status = server.stop().await;
            assert!(
                status.success(),
                "sluice exited with {status} after SIGTERM"
            );
        }
        Stop::Crash => server.kill(),
    }
}

async fn streams(client: &Client) -> Vec<String> {
    let mut names: Vec<String> = text_rows(client, "SHOW STREAMS")
        .await
        .into_iter()
        .map(|r| r[0].clone())
        .collect();
    names.sort();
    names
}

/// Inserts one row and returns its offset and ts.
async fn append(client: &Client, sql: &str) -> (i64, DateTime<Utc>) {
    let row = within(STATEMENT_TIMEOUT, sql, client.query_one(sql, &[]))
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e:?}"));
    (row.get(0), row.get(1))
}

async fn max_ts(client: &Client, stream: &str) -> DateTime<Utc> {
    let sql = format!("SELECT max(ts) FROM {stream}");
    let row = within(STATEMENT_TIMEOUT, &sql, client.query_one(sql.as_str(), &[]))
        .await
        .expect("max(ts)");
    row.get(0)
}

async fn survives_restart(how: Stop) {
    let mut server = Server::start().await;
    let (accounts, events) = {
        let client = server.client().await;
        exec(
            &client,
            "CREATE STREAM accounts (name text NOT NULL, balance numeric(12,2))",
        )
        .await;
        exec(
            &client,
            "CREATE STREAM events (payload jsonb, at timestamptz)",
        )
        .await;
        exec(&client, "CREATE STREAM scratch (x integer)").await;
        exec(
            &client,
            "INSERT INTO accounts VALUES ('ann', 10.50), ('bob', 3), ('cid', NULL)",
        )
        .await;
        exec(
            &client,
            "INSERT INTO events VALUES ('{\"k\": 1}', '2024-01-02 03:04:05+00')",
        )
        .await;
        exec(&client, "INSERT INTO events VALUES ('{\"k\": 2}', NULL)").await;
        exec(&client, "DROP STREAM scratch").await;
        (
            text_rows(&client, "SELECT * FROM accounts ORDER BY offset").await,
            text_rows(&client, "SELECT * FROM events ORDER BY offset").await,
        )
    };
    assert_eq!(accounts.len(), 3);

    stop(&mut server, how).await;
    server.restart().await;
    let client = server.client().await;
    assert_eq!(
        streams(&client).await,
        ["accounts", "events"],
        "streams after {how:?} restart"
    );
    assert_eq!(
        text_rows(&client, "SELECT * FROM accounts ORDER BY offset").await,
        accounts,
        "accounts rows (offset, ts and values) after {how:?} restart"
    );
    assert_eq!(
        text_rows(&client, "SELECT * FROM events ORDER BY offset").await,
        events
    );

    let before = max_ts(&client, "accounts").await;
    let (offset, ts) = append(
        &client,
        "INSERT INTO accounts VALUES ('dee', 1) RETURNING offset, ts",
    )
    .await;
    assert_eq!(offset, 3, "accounts continues at the next offset");
    assert!(
        ts >= before,
        "ts went backwards across the restart: {ts} < {before}"
    );
    let (offset, _) = append(
        &client,
        "INSERT INTO events VALUES (NULL, NULL) RETURNING offset, ts",
    )
    .await;
    assert_eq!(offset, 2, "events continues at the next offset");
    drop(client);

    // What was written after the restart survives the next one as well.
    stop(&mut server, how).await;
    server.restart().await;
    let client = server.client().await;
    let names = text_rows(&client, "SELECT name FROM accounts ORDER BY offset").await;
    assert_eq!(names, [["ann"], ["bob"], ["cid"], ["dee"]]);
    assert_eq!(sluice_tests::assert_gapless(&client, "events").await, 3);
    let (offset, _) = append(
        &client,
        "INSERT INTO accounts VALUES ('eve', 2) RETURNING offset, ts",
    )
    .await;
    assert_eq!(offset, 4);
}

#[tokio::test(flavor = "multi_thread")]
async fn survives_sigterm_restart() {
    survives_restart(Stop::Graceful).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn survives_sigkill_restart() {
    survives_restart(Stop::Crash).await;
}

/// Tables, consumer offsets and the dedup index of a stream survive
/// restarts, both from the Raft log alone (no checkpoint yet) and from a
/// checkpoint plus the log after it.
async fn tables_and_dedup_survive(how: Stop, checkpoint_entries: &str) {
    let mut server = Server::start_with(&["--checkpoint-entries", checkpoint_entries]).await;
    let client = server.client().await;
    exec(
        &client,
        "CREATE TABLE totals (k text PRIMARY KEY, n bigint NOT NULL)",
    )
    .await;
    exec(
        &client,
        "CREATE STREAM events (id text NOT NULL, v int) WITH (dedup_key = 'id', dedup_window = '1 hour')",
    )
    .await;
    for i in 0..30 {
        exec(
            &client,
            &format!(
                "BEGIN; INSERT INTO events VALUES ('e{i}', {i}); \
                 INSERT INTO totals VALUES ('k{}', {i}) ON CONFLICT (k) DO UPDATE SET n = totals.n + excluded.n; \
                 INSERT INTO consumer_offsets VALUES ('c', 'events', {i}) \
                   ON CONFLICT (consumer, stream) DO UPDATE SET \"offset\" = excluded.\"offset\"; \
                 COMMIT",
                i % 3
            ),
        )
        .await;
    }
    exec(&client, "DELETE FROM totals WHERE k = 'k2'").await;
    drop(client);
    stop(&mut server, how).await;
    server.restart().await;
    let client = server.client().await;
    assert_eq!(
        text_rows(&client, "SELECT k, n FROM totals ORDER BY k").await,
        vec![
            vec!["k0".to_string(), "135".into()],
            vec!["k1".into(), "145".into()]
        ],
        "{how:?}: table rows after restart"
    );
    assert_eq!(
        text_rows(&client, "SELECT \"offset\" FROM consumer_offsets").await,
        vec![vec!["29".to_string()]]
    );
    // a resend within the window returns the original offset, appends nothing
    assert_eq!(
        text_rows(
            &client,
            "INSERT INTO events VALUES ('e7', 7) RETURNING offset"
        )
        .await,
        vec![vec!["7".to_string()]],
        "{how:?}: the dedup index was lost"
    );
    assert_eq!(
        text_rows(&client, "SELECT count(*) FROM events").await,
        vec![vec!["30".to_string()]]
    );
    // keys still unique after recovery
    let err = client
        .batch_execute("INSERT INTO totals VALUES ('k0', 1)")
        .await
        .expect_err("duplicate key after restart");
    assert_eq!(err.code().map(|c| c.code()), Some("23505"));
    server.stop().await;
}

#[tokio::test]
async fn tables_survive_sigkill_from_the_log() {
    tables_and_dedup_survive(Stop::Crash, "100000").await;
}

#[tokio::test]
async fn tables_survive_sigkill_from_a_checkpoint() {
    tables_and_dedup_survive(Stop::Crash, "7").await;
}

#[tokio::test]
async fn tables_survive_sigterm() {
    tables_and_dedup_survive(Stop::Graceful, "7").await;
}

/// ALTER STREAM's new options, name and columns (ADD COLUMN with a default, RENAME COLUMN)
/// survive a restart, from the log (a large checkpoint interval) and from a checkpoint
/// (interval 1), and the renamed stream keeps its rows, its offsets and its dedup keys.
async fn an_altered_stream_survives(how: Stop, checkpoint_entries: &str) {
    let mut server = Server::start_with(&["--checkpoint-entries", checkpoint_entries]).await;
    let client = server.client().await;
    exec(
        &client,
        "CREATE STREAM orders (id text NOT NULL, v int) WITH (dedup_key = 'id', dedup_window = '1 hour')",
    )
    .await;
    for i in 0..5 {
        exec(&client, &format!("INSERT INTO orders VALUES ('o{i}', {i})")).await;
    }
    exec(
        &client,
        "ALTER STREAM orders SET (retention = '30 days', retention_bytes = '1GB')",
    )
    .await;
    exec(&client, "ALTER STREAM orders RENAME TO sales").await;
    exec(
        &client,
        "ALTER STREAM sales ADD COLUMN region text NOT NULL DEFAULT 'eu'",
    )
    .await;
    exec(&client, "ALTER STREAM sales RENAME COLUMN v TO amount").await;
    exec(&client, "INSERT INTO sales VALUES ('o5', 5, 'us')").await;
    // views (and a dropped one) come back from the log and from the checkpoint
    exec(
        &client,
        "CREATE VIEW big AS SELECT id, amount FROM sales WHERE amount >= 3",
    )
    .await;
    exec(&client, "CREATE VIEW big_ids (i) AS SELECT id FROM big").await;
    exec(&client, "CREATE VIEW gone AS SELECT 1 AS one").await;
    exec(&client, "DROP VIEW gone").await;
    drop(client);
    stop(&mut server, how).await;
    server.restart().await;
    let client = server.client().await;
    assert_eq!(streams(&client).await, vec!["sales".to_string()], "{how:?}");
    assert_eq!(
        text_rows(
            &client,
            "SELECT retention, retention_bytes FROM sluice_streams WHERE name = 'sales'"
        )
        .await,
        vec![vec!["2592000000 ms".to_string(), "1073741824".into()]],
        "{how:?}: options after restart"
    );
    // a resend of a key sent before the rename returns its original offset
    assert_eq!(
        text_rows(
            &client,
            "INSERT INTO sales VALUES ('o2', 2) RETURNING offset"
        )
        .await,
        vec![vec!["2".to_string()]],
        "{how:?}"
    );
    assert_eq!(
        text_rows(&client, "SELECT count(*), max(offset) FROM sales").await,
        vec![vec!["6".to_string(), "5".into()]],
        "{how:?}"
    );
    // rows written before ADD COLUMN read its default; the renamed column keeps its values
    assert_eq!(
        text_rows(
            &client,
            "SELECT id, amount, region FROM sales WHERE offset IN (0, 5) ORDER BY offset"
        )
        .await,
        vec![
            vec!["o0".to_string(), "0".into(), "eu".into()],
            vec!["o5".to_string(), "5".into(), "us".into()]
        ],
        "{how:?}: columns after restart"
    );
    assert_eq!(
        text_rows(&client, "SELECT i FROM big_ids ORDER BY i").await,
        vec![vec!["o3".to_string()], vec!["o4".into()], vec!["o5".into()]],
        "{how:?}: a view over a view after restart"
    );
    assert_eq!(
        text_rows(
            &client,
            "SELECT viewname FROM pg_views WHERE viewname NOT LIKE 'sluice%' ORDER BY 1"
        )
        .await,
        vec![vec!["big".to_string()], vec!["big_ids".into()]],
        "{how:?}: views after restart"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn an_altered_stream_survives_restarts_from_log_and_checkpoint() {
    for how in [Stop::Graceful, Stop::Crash] {
        for checkpoint_entries in ["100000", "1"] {
            an_altered_stream_survives(how, checkpoint_entries).await;
        }
    }
}

/// A transaction block's DDL commits in one command with its writes (issue 22): a table
/// created, written and read in the block, a stream dropped in it, a dropped table's writes —
/// after a crash or a clean stop, replayed from the log or read from the checkpoint the drop
/// takes after the whole command. (Before, the block's CREATE ran at once and the DROP could
/// not commit with table writes.)
async fn a_block_of_ddl_survives(how: Stop, checkpoint_entries: &str) {
    let mut server = Server::start_with(&["--checkpoint-entries", checkpoint_entries]).await;
    let client = server.client().await;
    exec(&client, "CREATE STREAM old_events (m text)").await;
    exec(&client, "INSERT INTO old_events VALUES ('x')").await;
    exec(&client, "CREATE TABLE scratch (k int PRIMARY KEY)").await;
    exec(&client, "BEGIN").await;
    exec(
        &client,
        "CREATE TABLE versions (v text PRIMARY KEY, at int NOT NULL)",
    )
    .await;
    exec(&client, "INSERT INTO versions VALUES ('a1', 1), ('b2', 2)").await;
    exec(&client, "UPDATE versions SET at = 20 WHERE v = 'b2'").await;
    exec(&client, "INSERT INTO scratch VALUES (1)").await;
    exec(&client, "DROP TABLE scratch").await;
    exec(&client, "DROP STREAM old_events").await;
    exec(&client, "CREATE STREAM new_events (m text, n int)").await;
    exec(
        &client,
        "CREATE VIEW late AS SELECT v FROM versions WHERE at > 10",
    )
    .await;
    exec(&client, "COMMIT").await;
    exec(&client, "INSERT INTO new_events VALUES ('y', 1)").await;
    drop(client);
    stop(&mut server, how).await;
    server.restart().await;
    let client = server.client().await;
    assert_eq!(
        text_rows(&client, "SELECT v, at FROM versions ORDER BY v").await,
        vec![
            vec!["a1".to_string(), "1".into()],
            vec!["b2".into(), "20".into()]
        ],
        "{how:?} {checkpoint_entries}"
    );
    assert_eq!(
        text_rows(&client, "SELECT v FROM late").await,
        vec![vec!["b2".to_string()]],
        "{how:?} {checkpoint_entries}"
    );
    assert_eq!(
        streams(&client).await,
        vec!["new_events".to_string()],
        "{how:?} {checkpoint_entries}"
    );
    assert_eq!(
        text_rows(&client, "SELECT offset, m FROM new_events").await,
        vec![vec!["0".to_string(), "y".into()]],
        "{how:?} {checkpoint_entries}"
    );
    // the dropped table is gone and its name free, with none of the block's rows
    exec(&client, "CREATE TABLE scratch (k int PRIMARY KEY)").await;
    assert_eq!(
        text_rows(&client, "SELECT count(*) FROM scratch").await,
        vec![vec!["0".to_string()]],
        "{how:?} {checkpoint_entries}"
    );
    drop(client);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_block_of_ddl_survives_restarts_from_log_and_checkpoint() {
    for how in [Stop::Graceful, Stop::Crash] {
        for checkpoint_entries in ["100000", "1"] {
            a_block_of_ddl_survives(how, checkpoint_entries).await;
        }
    }
}

/// Secondary indexes — their definitions and their entries — survive restarts from the Raft
/// log and from a checkpoint: lookups through them find the rows written before and after
/// the index was made, a dropped index stays dropped, and UNIQUE is still enforced.
async fn indexes_survive(how: Stop, checkpoint_entries: &str) {
    let mut server = Server::start_with(&["--checkpoint-entries", checkpoint_entries]).await;
    let client = server.client().await;
    exec(
        &client,
        "CREATE TABLE accounts (id int PRIMARY KEY, email text, region text)",
    )
    .await;
    exec(
        &client,
        "INSERT INTO accounts VALUES (1, 'a@x', 'eu'), (2, 'b@x', 'us')",
    )
    .await;
    exec(
        &client,
        "CREATE UNIQUE INDEX accounts_email ON accounts (email)",
    )
    .await;
    // a column's order options are part of the definition that must come back
    exec(
        &client,
        "CREATE INDEX accounts_region ON accounts (region DESC NULLS LAST)",
    )
    .await;
    exec(
        &client,
        "CREATE INDEX accounts_gone ON accounts (region, email)",
    )
    .await;
    exec(&client, "INSERT INTO accounts VALUES (3, 'c@x', 'eu')").await;
    exec(&client, "UPDATE accounts SET region = 'us' WHERE id = 1").await;
    exec(&client, "DROP INDEX accounts_gone").await;
    drop(client);
    stop(&mut server, how).await;
    server.restart().await;
    let client = server.client().await;
    let ctx = format!("{how:?} {checkpoint_entries}");
    assert_eq!(
        text_rows(
            &client,
            "SELECT id FROM accounts WHERE region = 'us' ORDER BY id"
        )
        .await,
        vec![vec!["1".to_string()], vec!["2".into()]],
        "{ctx}"
    );
    assert_eq!(
        text_rows(&client, "SELECT id FROM accounts WHERE email = 'c@x'").await,
        vec![vec!["3".to_string()]],
        "{ctx}"
    );
    let plan = text_rows(
        &client,
        "EXPLAIN SELECT id FROM accounts WHERE email = 'c@x'",
    )
    .await;
    assert!(
        plan.concat()
            .concat()
            .contains("IndexScan: index=accounts_email"),
        "{ctx}: {plan:?}"
    );
    assert_eq!(
        text_rows(
            &client,
            "SELECT indexname FROM pg_indexes WHERE tablename = 'accounts' ORDER BY 1"
        )
        .await,
        vec![
            vec!["accounts_email".to_string()],
            vec!["accounts_pkey".into()],
            vec!["accounts_region".into()]
        ],
        "{ctx}"
    );
    assert_eq!(
        text_rows(
            &client,
            "SELECT pg_get_indexdef('accounts_region'::regclass)"
        )
        .await,
        vec![vec![
            "CREATE INDEX accounts_region ON public.accounts USING btree (region DESC NULLS LAST)"
                .to_string()
        ]],
        "{ctx}"
    );
    let err = client
        .simple_query("INSERT INTO accounts VALUES (4, 'a@x', 'eu')")
        .await
        .err()
        .and_then(|e| e.code().map(|c| c.code().to_string()));
    assert_eq!(err.as_deref(), Some("23505"), "{ctx}");
    drop(client);
    server.stop().await;
}

#[tokio::test]
async fn indexes_survive_restarts_from_log_and_checkpoint() {
    for how in [Stop::Graceful, Stop::Crash] {
        for checkpoint_entries in ["100000", "1"] {
            indexes_survive(how, checkpoint_entries).await;
        }
    }
}

/// Array values in a table (the row codec) and a stream (Arrow segments) read back the
/// same after a restart, replayed from the log and from a checkpoint.
async fn arrays_survive(how: Stop, checkpoint_entries: &str) {
    let mut server = Server::start_with(&["--checkpoint-entries", checkpoint_entries]).await;
    let client = server.client().await;
    exec(
        &client,
        "CREATE TABLE at (id int PRIMARY KEY, tags text[], n int8[], d numeric(6,2)[]); \
         CREATE STREAM ast (tags text[], ts2 timestamptz[])",
    )
    .await;
    for i in 0..12 {
        exec(
            &client,
            &format!(
                "INSERT INTO at VALUES ({i}, '{{a{i},\"b c\",NULL,\"\"}}', ARRAY[{i}, NULL, -{i}], '{{{i}.5}}'); \
                 INSERT INTO ast VALUES (ARRAY['x{i}', NULL], '{{\"2026-01-0{} 10:00:00+00\"}}')",
                i % 9 + 1
            ),
        )
        .await;
    }
    exec(
        &client,
        "UPDATE at SET n = '{}' WHERE id = 3; UPDATE at SET tags = NULL WHERE id = 4",
    )
    .await;
    let table = "SELECT id, tags, n, d FROM at ORDER BY id";
    let stream = "SELECT \"offset\", tags, ts2 FROM ast ORDER BY \"offset\"";
    let (before_table, before_stream) = (
        text_rows(&client, table).await,
        text_rows(&client, stream).await,
    );
    assert_eq!(before_table[3][2], "{}");
    assert_eq!(before_table[5][1], "{a5,\"b c\",NULL,\"\"}");
    drop(client);
    stop(&mut server, how).await;
    server.restart().await;
    let client = server.client().await;
    assert_eq!(
        text_rows(&client, table).await,
        before_table,
        "{how:?} {checkpoint_entries}"
    );
    assert_eq!(
        text_rows(&client, stream).await,
        before_stream,
        "{how:?} {checkpoint_entries}"
    );
    server.stop().await;
}

#[tokio::test]
async fn arrays_survive_restarts_from_log_and_checkpoint() {
    for how in [Stop::Graceful, Stop::Crash] {
        for checkpoint_entries in ["100000", "1"] {
            arrays_survive(how, checkpoint_entries).await;
        }
    }
}
