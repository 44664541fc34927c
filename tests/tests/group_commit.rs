//! Group commit: with a slow disk (`--test-fsync-delay-ms 2`), 64 connections
//! inserting single rows concurrently must share log fsyncs: at least 10
//! committed rows per fsync (one fsync per append would be 1; a loaded 2-core
//! machine once gave 19.2 against an earlier bar of 20; 24-29 on a quiet one).
//! Counted with `sluice_stats`, never timed.
//!
//! And the commit path's memory: the server runs with transparent huge pages off (the first
//! touch of a fresh 2 MiB page stalled the Raft thread for milliseconds, see
//! `without_transparent_huge_pages` in server/src/main.rs), read from `/proc/<pid>/status`.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use sluice_tests::{assert_gapless, exec, stats, within, Server};
use tokio::sync::Barrier;

const CONNECTIONS: i32 = 64;
const INSERTS_PER_CONNECTION: i32 = 40;
const MIN_ROWS_PER_FSYNC: f64 = 10.0;

fn counter(stats: &std::collections::HashMap<String, i64>, metric: &str) -> i64 {
    *stats
        .get(metric)
        .unwrap_or_else(|| panic!("sluice_stats has no {metric:?} row: {stats:?}"))
}

#[tokio::test(flavor = "multi_thread")]
async fn concurrent_inserts_share_fsyncs() {
    let server = Server::start_with(&["--test-fsync-delay-ms", "2"]).await;
    let admin = server.client().await;
    exec(
        &admin,
        "CREATE STREAM gc (conn integer NOT NULL, n integer NOT NULL)",
    )
    .await;

    let mut clients = Vec::new();
    for _ in 0..CONNECTIONS {
        clients.push(server.client().await);
    }
    let before = stats(&admin).await;

    let start = Arc::new(Barrier::new(clients.len()));
    let tasks: Vec<_> = clients
        .into_iter()
        .zip(0..)
        .map(|(client, conn)| {
            let start = Arc::clone(&start);
            tokio::spawn(async move {
                let insert = client
                    .prepare("INSERT INTO gc VALUES ($1, $2)")
                    .await
                    .expect("prepare INSERT");
                start.wait().await;
                for n in 0..INSERTS_PER_CONNECTION {
                    let inserted = client.execute(&insert, &[&conn, &n]).await.expect("INSERT");
                    assert_eq!(inserted, 1);
                }
            })
        })
        .collect();
    within(Duration::from_secs(300), "64 writers", async {
        for task in tasks {
            task.await.expect("writer task");
        }
    })
    .await;

    let after = stats(&admin).await;
    let delta = |metric: &str| counter(&after, metric) - counter(&before, metric);
    let (rows, proposals, fsyncs) = (
        delta("appended_rows"),
        delta("committed_proposals"),
        delta("log_fsyncs"),
    );
    let expected_rows = i64::from(CONNECTIONS * INSERTS_PER_CONNECTION);
    println!("group commit: {rows} rows, {proposals} committed proposals, {fsyncs} log fsyncs");
    assert_eq!(rows, expected_rows, "appended_rows delta");
    assert!(
        fsyncs >= 1,
        "{rows} rows were acknowledged without a single log fsync"
    );
    let ratio = rows as f64 / fsyncs as f64;
    println!("group commit: {ratio:.1} rows per fsync (need >= {MIN_ROWS_PER_FSYNC})");
    assert!(
        ratio >= MIN_ROWS_PER_FSYNC,
        "only {ratio:.1} rows per fsync: inserts are not group-committed"
    );

    // Every row landed once, gaplessly, and each connection's rows in order.
    assert_eq!(assert_gapless(&admin, "gc").await, expected_rows);
    let rows = admin
        .query("SELECT conn, n FROM gc ORDER BY offset", &[])
        .await
        .expect("read gc");
    let mut seen: BTreeMap<i32, Vec<i32>> = BTreeMap::new();
    for row in &rows {
        seen.entry(row.get(0)).or_default().push(row.get(1));
    }
    assert_eq!(seen.len() as i32, CONNECTIONS);
    for (conn, ns) in seen {
        assert_eq!(
            ns,
            (0..INSERTS_PER_CONNECTION).collect::<Vec<_>>(),
            "rows of connection {conn}"
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn the_server_runs_without_transparent_huge_pages() {
    let server = Server::start().await;
    let client = server.client().await;
    exec(&client, "CREATE STREAM thp (n integer)").await;
    exec(&client, "INSERT INTO thp VALUES (1)").await;
    let pid = server.pid().expect("the server runs");
    // Linux 5.0 and later report the PR_SET_THP_DISABLE flag here
    let Some(thp) = sluice_tests::hostile::monitor::status_field(pid, "THP_enabled:") else {
        println!("skipped: this kernel's /proc/<pid>/status has no THP_enabled line");
        return;
    };
    assert_eq!(
        thp, "0",
        "transparent huge pages are on for the server: THP_enabled {thp}"
    );
}
