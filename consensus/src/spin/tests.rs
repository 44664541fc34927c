use super::*;
use std::sync::mpsc;
use std::sync::Arc;

/// Runs `before_park` on a thread of its own; true when it returned within `wait` (a bound
/// on a hang, far above any budget a test that expects a return uses).
fn returns(spinner: &Arc<Spinner>, wait: Duration) -> bool {
    let (tx, rx) = mpsc::channel();
    let s = Arc::clone(spinner);
    std::thread::spawn(move || {
        s.before_park();
        let _ = tx.send(());
    });
    rx.recv_timeout(wait).is_ok()
}

const HOUR: u64 = 3_600_000_000_000;

#[test]
fn no_spin_unless_one_local_proposal_is_in_flight() {
    // an hour's budget: a spin that started would not return within the test's wait
    let s = Arc::new(Spinner::new(HOUR));
    assert!(returns(&s, Duration::from_secs(10)), "nothing in flight");
    let _one = s.start();
    assert!(returns(&s, Duration::from_secs(10)), "not local yet");
    s.round_done(true);
    let two = s.start();
    assert!(returns(&s, Duration::from_secs(10)), "two in flight");
    drop(two);
    s.set_budget(Duration::ZERO);
    assert!(returns(&s, Duration::from_secs(10)), "budget zero: off");
    s.set_budget(Duration::from_nanos(HOUR));
    s.round_done(false);
    assert!(returns(&s, Duration::from_secs(10)), "a node with peers");
}

#[test]
fn a_spin_ends_when_the_node_finishes_a_round() {
    let s = Arc::new(Spinner::new(HOUR));
    s.round_done(true);
    let _one = s.start();
    let (tx, rx) = mpsc::channel();
    let spinner = Arc::clone(&s);
    std::thread::spawn(move || {
        spinner.before_park();
        let _ = tx.send(());
    });
    // the spin is under way (an hour's budget): it is still there after a moment
    assert!(rx.recv_timeout(Duration::from_millis(50)).is_err(), "spins");
    assert!(s.spinning.load(Ordering::Relaxed));
    // a second worker does not spin alongside
    assert!(
        returns(&s, Duration::from_secs(10)),
        "one spinner at a time"
    );
    s.round_done(true);
    assert!(
        rx.recv_timeout(Duration::from_secs(10)).is_ok(),
        "the round ended it"
    );
    assert!(!s.spinning.load(Ordering::Relaxed));
}

#[test]
fn a_spin_ends_at_the_budget() {
    let s = Arc::new(Spinner::new(Duration::from_millis(2).as_nanos() as u64));
    s.round_done(true);
    let _one = s.start();
    assert!(returns(&s, Duration::from_secs(10)));
}

#[test]
fn proposals_in_flight_are_counted_while_their_guards_live() {
    let s = Spinner::new(0);
    let a = s.start();
    let b = s.start();
    assert_eq!(s.in_flight.load(Ordering::Relaxed), 2);
    drop(a);
    assert_eq!(s.in_flight.load(Ordering::Relaxed), 1);
    drop(b);
    assert_eq!(s.in_flight.load(Ordering::Relaxed), 0);
}

#[test]
fn the_node_spins_only_while_batches_are_single_proposals() {
    let mut avg = BatchAverage::new();
    assert!(avg.single());
    for _ in 0..8 {
        avg.record(1);
    }
    assert!(avg.single());
    // a few batches of several proposals (more clients): no spinning
    avg.record(3);
    avg.record(3);
    assert!(!avg.single());
    // back to one client: single again after a while
    for _ in 0..32 {
        avg.record(1);
    }
    assert!(avg.single());
    // huge batches do not overflow
    for _ in 0..100 {
        avg.record(usize::MAX);
    }
    assert!(!avg.single());
}
