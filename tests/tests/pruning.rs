//! Range predicates on `offset` and `ts` prune frames instead of scanning
//! the whole stream: counted with the `frames_read` metric, never timed.

use sluice_tests::{exec, stats, text_rows, Server};

fn frames_read(s: &std::collections::HashMap<String, i64>) -> i64 {
    *s.get("frames_read").expect("sluice_stats has frames_read")
}

#[tokio::test(flavor = "multi_thread")]
async fn offset_and_ts_predicates_skip_frames() {
    // small segments, so the stream also spans several segment files
    let server = Server::start_with(&["--segment-bytes", "4096"]).await;
    let client = server.client().await;
    exec(&client, "CREATE STREAM p (n integer NOT NULL)").await;
    // one statement = one frame
    for i in 0..100 {
        exec(&client, &format!("INSERT INTO p VALUES ({i})")).await;
    }
    let segments = text_rows(
        &client,
        "SELECT segments FROM sluice_streams WHERE name = 'p'",
    )
    .await;
    assert!(
        segments[0][0].parse::<i64>().expect("segments is a number") > 1,
        "expected rollover, got {segments:?}"
    );

    let before = frames_read(&stats(&client).await);
    let rows = text_rows(&client, "SELECT count(*), min(n) FROM p WHERE offset > 95").await;
    assert_eq!(rows, vec![vec!["4".to_string(), "96".to_string()]]);
    let after = frames_read(&stats(&client).await);
    assert!(
        after - before <= 4,
        "offset > 95 read {} frames of 100",
        after - before
    );

    let before = after;
    let rows = text_rows(
        &client,
        "SELECT count(*) FROM p WHERE offset BETWEEN 10 AND 19",
    )
    .await;
    assert_eq!(rows, vec![vec!["10".to_string()]]);
    let after = frames_read(&stats(&client).await);
    assert!(
        after - before <= 10,
        "BETWEEN 10 AND 19 read {} frames",
        after - before
    );

    // a ts bound after every commit reads nothing; a full scan reads all 100
    let before = after;
    let rows = text_rows(
        &client,
        "SELECT count(*) FROM p WHERE ts > now() + interval '1 hour'",
    )
    .await;
    assert_eq!(rows, vec![vec!["0".to_string()]]);
    let after = frames_read(&stats(&client).await);
    assert_eq!(
        after - before,
        0,
        "a ts bound past every frame still read frames"
    );
    let before = after;
    let rows = text_rows(&client, "SELECT count(*) FROM p").await;
    assert_eq!(rows, vec![vec!["100".to_string()]]);
    assert_eq!(frames_read(&stats(&client).await) - before, 100);
}

/// A view over a stream prunes as the stream does: its query is expanded into the statement,
/// so `offset` and `ts` bounds on the view reach the stream's scan (issue 22).
#[tokio::test(flavor = "multi_thread")]
async fn predicates_through_a_view_skip_frames() {
    let server = Server::start().await;
    let client = server.client().await;
    exec(&client, "CREATE STREAM pv (n integer NOT NULL, note text)").await;
    for i in 0..50 {
        exec(&client, &format!("INSERT INTO pv VALUES ({i}, 'x')")).await;
    }
    exec(
        &client,
        "CREATE VIEW evens AS SELECT offset, ts, n FROM pv WHERE n % 2 = 0",
    )
    .await;
    exec(
        &client,
        "CREATE VIEW late (o, n) AS SELECT offset, n FROM evens",
    )
    .await;

    let before = frames_read(&stats(&client).await);
    let rows = text_rows(
        &client,
        "SELECT count(*), min(n) FROM evens WHERE offset >= 40",
    )
    .await;
    assert_eq!(rows, vec![vec!["5".to_string(), "40".to_string()]]);
    let read = frames_read(&stats(&client).await) - before;
    assert!(
        read <= 10,
        "offset >= 40 through a view read {read} frames of 50"
    );

    // through a view over the view, under a renamed column
    let before = frames_read(&stats(&client).await);
    let rows = text_rows(&client, "SELECT n FROM late WHERE o > 46 ORDER BY n").await;
    assert_eq!(rows, vec![vec!["48".to_string()]]);
    let read = frames_read(&stats(&client).await) - before;
    assert!(
        read <= 3,
        "o > 46 through two views read {read} frames of 50"
    );

    let before = frames_read(&stats(&client).await);
    let rows = text_rows(
        &client,
        "SELECT count(*) FROM evens WHERE ts > now() + interval '1 hour'",
    )
    .await;
    assert_eq!(rows, vec![vec!["0".to_string()]]);
    assert_eq!(frames_read(&stats(&client).await) - before, 0);
}
