//! The hostile load in short mode: one `sluice` process, eight writers alone for 10 s, then
//! beside fuzzed messages, deep statements, memory-hungry queries, cancels and idle sockets
//! for 20 s, with the fixed seed. No acknowledged row may be lost or moved (on the running
//! server and after a restart), no hostile attempt may end unexpectedly, no panic may be
//! logged, and the server must live. Throughput and memory are reported, not asserted
//! (tests do not assert on speed); the long mode is the `sluice-hostile` binary (see
//! `sluice_tests::hostile`).

use std::time::{Duration, Instant};

use sluice_tests::hostile::{self, report};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn writers_lose_nothing_beside_a_hostile_load() {
    let started = Instant::now();
    let config = hostile::Config {
        seed: 7,
        baseline: Duration::from_secs(10),
        disturbed: Duration::from_secs(20),
        hostile_timeout: Duration::from_secs(3),
        // keep memory-hungry queries from taking a quarter of the machine each
        server_args: vec!["--max-statement-memory=128MB".into()],
        // measured, not asserted
        min_ratio: 0.0,
        ..hostile::Config::default()
    };
    let result = tokio::time::timeout(Duration::from_secs(300), hostile::run(config))
        .await
        .expect("the hostile run is bounded");
    println!("{}", report::summary(&result));
    let disturbed = result.disturbed.as_ref().expect("the disturbed phase ran");
    assert!(
        !disturbed.writes.acks.is_empty(),
        "no row was acknowledged beside the hostile load"
    );
    assert_eq!(result.checks.len(), 2, "checked live and after a restart");
    for v in &result.checks {
        let check = v.result.as_ref().expect("the stream was read back");
        assert_eq!((check.lost, check.moved), (0, 0), "{}", v.when);
        assert!(
            check.problems().is_empty(),
            "{}: {:?}",
            v.when,
            check.problems()
        );
    }
    for (class, t) in &result.tally {
        assert_eq!(
            t.unexpected_total(),
            0,
            "{}: {:?}\n{}",
            class.name(),
            t.unexpected,
            t.examples.join("\n")
        );
    }
    assert!(
        result.tally.len() >= 5,
        "every class ran: {:?}",
        result.tally.keys()
    );
    assert!(result.panics.is_empty(), "panics: {:?}", result.panics);
    assert!(
        result.anomalies.is_empty(),
        "anomalies (reproduce: {}):\n{}",
        report::reproduce(&result),
        result.anomalies.join("\n")
    );
    println!("hostile short mode took {:?}", started.elapsed());
}
