//! The chaos suite in short mode: a three-node cluster of real processes, one round per
//! nemesis with a fixed seed, under appends, tails and bank transfers. It must find no
//! anomaly: no lost or moved acknowledged append, no applied failure, identical gapless
//! logs and tails, a constant bank total, one leader per term; leader kills fail over
//! within 5 s and each membership change is followed by an acknowledged append within 5 s.
//! The long mode is the `sluice-chaos` binary (see `sluice_tests::chaos`).

use std::time::{Duration, Instant};

use sluice_tests::chaos::{self, report, run::ACK_BOUND, Nemesis};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_round_of_each_nemesis_finds_no_anomaly() {
    let started = Instant::now();
    let config = chaos::Config {
        seed: 7,
        fault: Duration::from_secs(3),
        ..chaos::Config::default()
    };
    let result = tokio::time::timeout(Duration::from_secs(600), chaos::run(config))
        .await
        .expect("the chaos run is bounded");
    println!("{}", report::summary(&result));
    assert_eq!(result.rounds.len(), Nemesis::ALL.len());
    assert!(result.ops.ok > 0, "no append was acknowledged");
    for r in &result.rounds {
        if r.fault.nemesis.kills_leader() {
            let f = r.failover.expect("writes resumed after the leader went");
            assert!(f <= ACK_BOUND, "round {}: failover took {f:?}", r.index);
        }
        if r.fault.nemesis.changes_membership() {
            assert!(
                !r.step_acks.is_empty(),
                "round {}: no membership step completed",
                r.index
            );
            for (step, next) in &r.step_acks {
                assert!(
                    next.is_some_and(|d| d <= ACK_BOUND),
                    "round {}: after `{step}` the next ack came {next:?}",
                    r.index
                );
            }
        }
    }
    assert!(
        result.anomalies.is_empty(),
        "{} anomalies (reproduce: {}):\n{}",
        result.anomalies.len(),
        report::reproduce(&result),
        result
            .anomalies
            .iter()
            .map(|a| format!("round {} ({}): {}", a.round, a.nemesis, a.what))
            .collect::<Vec<_>>()
            .join("\n")
    );
    println!("chaos short mode took {:?}", started.elapsed());
}
