use std::collections::BTreeSet;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;

use super::*;

type Applied = Vec<(u64, Vec<u8>)>;

/// Index of the last entry without a command (`StateMachine::skip`) seen in memory.
type Skipped = Arc<AtomicU64>;

/// What survives a restart: the last checkpoint.
#[derive(Default)]
pub(super) struct Disk {
    applied: Applied,
    index: u64,
    snapshot_point: Option<(u64, u64)>,
}

/// A state machine that records every command it applies and echoes `(index, command)`.
/// `checkpoint` persists the applied list to the shared `Disk` only while `allow_checkpoint`
/// is set (otherwise it reports the old, still-durable index, as a lazy state machine may).
#[derive(Clone)]
pub(super) struct Recorder {
    disk: Arc<Mutex<Disk>>,
    memory: Arc<Mutex<Applied>>,
    skipped: Skipped,
    apply_calls: Arc<AtomicU64>,
    allow_checkpoint: Arc<AtomicBool>,
    /// What `StateMachine::applied` has shown: the last index applied before its last call,
    /// and the longest run of applies it ended.
    shown: Arc<Mutex<Shown>>,
}

#[derive(Default)]
pub(super) struct Shown {
    run: u64,
    last: u64,
    shown: u64,
    longest_run: u64,
}

impl Recorder {
    pub(super) fn new() -> Self {
        Recorder {
            disk: Arc::default(),
            memory: Arc::default(),
            skipped: Skipped::default(),
            apply_calls: Arc::default(),
            allow_checkpoint: Arc::new(AtomicBool::new(true)),
            shown: Arc::default(),
        }
    }

    /// The state machine after a restart: memory is reloaded from the last checkpoint.
    pub(super) fn recover(&self) -> Self {
        let memory = self.disk.lock().unwrap().applied.clone();
        Recorder {
            disk: self.disk.clone(),
            memory: Arc::new(Mutex::new(memory)),
            skipped: Skipped::default(),
            apply_calls: Arc::default(),
            allow_checkpoint: self.allow_checkpoint.clone(),
            shown: Arc::default(),
        }
    }

    pub(super) fn memory(&self) -> Applied {
        self.memory.lock().unwrap().clone()
    }
}

impl StateMachine for Recorder {
    type Response = (u64, Vec<u8>);

    fn apply(
        &mut self,
        index: u64,
        command: &Bytes,
    ) -> std::result::Result<Self::Response, String> {
        self.apply_calls.fetch_add(1, Ordering::SeqCst);
        if command[..] == b"boom"[..] {
            return Err("simulated disk failure".into());
        }
        let mut memory = self.memory.lock().unwrap();
        if let Some((last, _)) = memory.last() {
            assert!(index > *last, "applied {index} after {last}");
        }
        memory.push((index, command.to_vec()));
        let mut shown = self.shown.lock().unwrap();
        shown.run += 1;
        shown.last = index;
        Ok((index, command.to_vec()))
    }

    fn applied(&mut self) -> std::result::Result<(), String> {
        let mut shown = self.shown.lock().unwrap();
        shown.longest_run = shown.longest_run.max(shown.run);
        shown.run = 0;
        shown.shown = shown.last;
        Ok(())
    }

    fn skip(&mut self, index: u64) {
        self.skipped.store(index, Ordering::SeqCst);
    }

    fn applied_index(&self) -> u64 {
        self.disk.lock().unwrap().index
    }

    fn checkpoint(&mut self) -> std::result::Result<u64, String> {
        let mut disk = self.disk.lock().unwrap();
        if self.allow_checkpoint.load(Ordering::SeqCst) {
            disk.applied = self.memory.lock().unwrap().clone();
            let last = disk.applied.last().map_or(0, |(i, _)| *i);
            let last = last.max(self.skipped.load(Ordering::SeqCst));
            if last > disk.index {
                disk.index = last;
                disk.snapshot_point = None;
            }
        }
        Ok(disk.index)
    }

    fn snapshot(&mut self) -> std::result::Result<(u64, Vec<u8>), String> {
        let index = self.checkpoint()?;
        let disk = self.disk.lock().unwrap();
        let mut data = Vec::new();
        for (i, c) in &disk.applied {
            data.extend(i.to_be_bytes());
            data.extend((c.len() as u32).to_be_bytes());
            data.extend(c);
        }
        Ok((index, data))
    }

    fn restore(&mut self, index: u64, term: u64, data: &[u8]) -> std::result::Result<(), String> {
        let mut applied = Vec::new();
        let mut rest = data;
        while !rest.is_empty() {
            let i = u64::from_be_bytes(rest[..8].try_into().unwrap());
            let n = u32::from_be_bytes(rest[8..12].try_into().unwrap()) as usize;
            applied.push((i, rest[12..12 + n].to_vec()));
            rest = &rest[12 + n..];
        }
        *self.memory.lock().unwrap() = applied.clone();
        let mut disk = self.disk.lock().unwrap();
        disk.applied = applied;
        disk.index = index;
        disk.snapshot_point = Some((index, term));
        Ok(())
    }

    fn snapshot_point(&self) -> Option<(u64, u64)> {
        self.disk.lock().unwrap().snapshot_point
    }
}

fn config(dir: &Path) -> NodeConfig {
    let mut config = NodeConfig::single(1, dir.to_path_buf());
    config.tick_interval = Duration::from_millis(20);
    config
}

/// Proposes `per_task` commands from each of `tasks` concurrent tasks; checks every response.
async fn propose_concurrently(node: &NodeHandle<(u64, Vec<u8>)>, tasks: usize, per_task: usize) {
    let mut joins = Vec::new();
    for t in 0..tasks {
        let node = node.clone();
        joins.push(tokio::spawn(async move {
            for i in 0..per_task {
                let command = format!("t{t}-c{i}").into_bytes();
                let (_, echoed) = node.propose(command.clone()).await.unwrap();
                assert_eq!(echoed, command);
            }
        }));
    }
    for j in joins {
        j.await.unwrap();
    }
}

fn seg_files(dir: &Path) -> Vec<u64> {
    let mut v: Vec<u64> = std::fs::read_dir(dir)
        .unwrap()
        .filter_map(|d| {
            let p = d.unwrap().path();
            (p.extension()? == "wal").then(|| p.file_stem()?.to_str()?.parse().ok())?
        })
        .collect();
    v.sort();
    v
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_proposals_are_applied_once_in_index_order() {
    let dir = tempfile::tempdir().unwrap();
    let sm = Recorder::new();
    let node = start(config(dir.path()), sm.clone()).unwrap();
    assert_eq!(node.status().role, "leader");

    propose_concurrently(&node, 50, 20).await;

    let applied = sm.memory();
    assert_eq!(applied.len(), 1000);
    assert!(applied.windows(2).all(|w| w[0].0 < w[1].0), "index order");
    let commands: BTreeSet<_> = applied.iter().map(|(_, c)| c.clone()).collect();
    assert_eq!(commands.len(), 1000, "each command applied exactly once");
    let status = node.status();
    assert!(status.applied_index >= applied[999].0);
    assert_eq!(status.commit_index, status.applied_index);
    assert_eq!(status.leader_id, 1);
    let m = node.metrics();
    assert_eq!(Metrics::get(&m.proposals), 1000);
    assert!(Metrics::get(&m.log_fsyncs) > 0 && Metrics::get(&m.log_bytes) > 0);

    node.shutdown().await;
    assert!(matches!(
        node.propose(b"late".to_vec()).await,
        Err(ProposeError::Failed(_))
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn proposals_arriving_during_an_fsync_share_the_next_one() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = config(dir.path());
    config.fsync_delay = Some(Duration::from_millis(20));
    let node = start(config, Recorder::new()).unwrap();

    propose_concurrently(&node, 64, 10).await;

    let m = node.metrics();
    let (entries, fsyncs) = (
        Metrics::get(&m.committed_entries),
        Metrics::get(&m.log_fsyncs),
    );
    assert!(entries >= 640);
    // Without group commit every entry would have an fsync (20 ms each) of its own.
    assert!(
        entries >= 10 * fsyncs,
        "group commit factor too low: {entries} entries / {fsyncs} fsyncs"
    );
    node.shutdown().await;
}

/// A proposal's commit time (`commit_micros`) counts its wait in the node's queue: one sent
/// while the node thread sleeps after another's fsync (the test delay) waits out that delay,
/// then its own round.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn commit_time_counts_the_wait_in_the_queue() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = config(dir.path());
    config.fsync_delay = Some(Duration::from_millis(200));
    let node = start(config, Recorder::new()).unwrap();
    // (its commit waits out the election's delayed fsyncs too)
    node.propose(b"warm-up".to_vec()).await.unwrap();
    let m = node.metrics();
    let fsyncs = Metrics::get(&m.log_fsyncs);
    let before = m.commit_micros.snapshot();
    let first = tokio::spawn({
        let node = node.clone();
        async move { node.propose(b"first".to_vec()).await }
    });
    // the first's fsync is done: the node thread now sleeps the delay
    while Metrics::get(&m.log_fsyncs) == fsyncs {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    node.propose(b"second".to_vec()).await.unwrap();
    first.await.unwrap().unwrap();

    let after = m.commit_micros.snapshot();
    assert_eq!(after.count - before.count, 2);
    // first: one delay (and its fsync); second: the rest of the first's delay in the queue,
    // then its own — together about three delays, where timing from the node's taking of
    // each request gives two (plus the fsyncs)
    let total = after.sum - before.sum;
    assert!(total >= 500_000, "{total} µs for two commits");
    node.shutdown().await;
}

/// A state machine defers work to the end of a batch (`StateMachine::applied`: Sluice writes
/// a batch's stream appends there): no proposer hears of its command before that call.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn proposers_are_answered_only_after_their_batch_is_applied() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = config(dir.path());
    config.fsync_delay = Some(Duration::from_millis(5));
    let sm = Recorder::new();
    let node = start(config, sm.clone()).unwrap();
    let mut joins = Vec::new();
    for t in 0..16 {
        let node = node.clone();
        let shown = sm.shown.clone();
        joins.push(tokio::spawn(async move {
            for i in 0..10 {
                let (index, _) = node.propose(format!("{t}-{i}").into_bytes()).await.unwrap();
                let shown = shown.lock().unwrap().shown;
                assert!(
                    index <= shown,
                    "answered {index} before it was shown ({shown})"
                );
            }
        }));
    }
    for j in joins {
        j.await.unwrap();
    }
    assert!(
        sm.shown.lock().unwrap().longest_run > 1,
        "batches of several commands ended with one call"
    );
    node.shutdown().await;
}

/// Large entries: the log is compacted by bytes long before the entry count is reached, so the
/// memory it holds stays bounded under any write load (fails without `checkpoint_bytes`).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn large_entries_checkpoint_by_bytes_before_the_entry_count() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = config(dir.path());
    config.checkpoint_entries = 1_000_000;
    config.checkpoint_bytes = 64 << 10;
    let node = start(config, Recorder::new()).unwrap();
    for i in 0..40u8 {
        let command = vec![i; 16 << 10];
        node.propose(command).await.unwrap();
    }
    let checkpoints = Metrics::get(&node.metrics().checkpoints);
    assert!(
        (8..=11).contains(&checkpoints),
        "640 KiB of entries with a 64 KiB bound: {checkpoints} checkpoints"
    );
    // each one's time is in the histogram
    assert_eq!(
        node.metrics().checkpoint_micros.snapshot().count,
        checkpoints
    );
    node.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn restart_replays_exactly_the_entries_after_the_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = config(dir.path());
    config.checkpoint_entries = 25;
    config.wal_segment_bytes = 1024;
    let sm = Recorder::new();
    let before = {
        let node = start(config.clone(), sm.clone()).unwrap();
        propose_concurrently(&node, 4, 25).await;
        // From here on the state machine's checkpoints stop advancing: the log must carry
        // everything after the last one across the restart.
        sm.allow_checkpoint.store(false, Ordering::SeqCst);
        propose_concurrently(&node, 1, 37).await;
        assert!(Metrics::get(&node.metrics().checkpoints) >= 4);
        node.shutdown().await;
        sm.memory()
    };
    assert_eq!(before.len(), 137);
    let durable = sm.disk.lock().unwrap().index;
    let checkpointed = sm.disk.lock().unwrap().applied.len();
    assert!(durable >= 50 && (50..137).contains(&checkpointed));
    let segments = seg_files(dir.path());
    assert!(
        segments[0] > 1,
        "log compacted: oldest segment is {segments:?}"
    );
    // The state machine also made 20 more entries durable on its own (as one that commits
    // every apply would), past the node's compaction point: replay must start after those.
    let durable_len = checkpointed + 20;
    {
        let mut disk = sm.disk.lock().unwrap();
        disk.applied = before[..durable_len].to_vec();
        disk.index = before[durable_len - 1].0;
    }

    let recovered = sm.recover();
    let node = start(config, recovered.clone()).unwrap();
    tokio::time::timeout(Duration::from_secs(5), async {
        while recovered.memory().len() < before.len() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .expect("replay finished");
    assert_eq!(
        recovered.memory(),
        before,
        "same commands at the same indexes"
    );
    assert_eq!(
        recovered.apply_calls.load(Ordering::SeqCst) as usize,
        before.len() - durable_len,
        "replayed exactly the entries after the checkpoint"
    );

    let (index, _) = node.propose(b"after restart".to_vec()).await.unwrap();
    assert!(index > before[before.len() - 1].0);
    node.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn apply_failure_poisons_the_node_and_nothing_hangs() {
    let dir = tempfile::tempdir().unwrap();
    let node = start(config(dir.path()), Recorder::new()).unwrap();
    node.propose(b"fine".to_vec()).await.unwrap();

    let queued: Vec<_> = (0..20)
        .map(|i| {
            let node = node.clone();
            let command = if i == 10 {
                b"boom".to_vec()
            } else {
                vec![b'x', i]
            };
            tokio::spawn(async move { node.propose(command).await })
        })
        .collect();
    let mut failed = 0;
    for q in queued {
        match tokio::time::timeout(Duration::from_secs(5), q)
            .await
            .expect("no hang")
            .unwrap()
        {
            Ok(_) => {}
            Err(ProposeError::Failed(_)) => failed += 1,
            Err(e) => panic!("unexpected {e}"),
        }
    }
    assert!(failed >= 1);
    assert!(node.status().poisoned.is_some());
    for _ in 0..3 {
        let r = tokio::time::timeout(Duration::from_secs(5), node.propose(b"after".to_vec()))
            .await
            .expect("no hang");
        assert!(matches!(r, Err(ProposeError::Failed(_))), "{r:?}");
    }
    tokio::time::timeout(Duration::from_secs(5), node.shutdown())
        .await
        .expect("shutdown completes");
}

#[tokio::test]
async fn corrupt_log_refuses_to_start() {
    let dir = tempfile::tempdir().unwrap();
    let sm = Recorder::new();
    sm.allow_checkpoint.store(false, Ordering::SeqCst);
    let node = start(config(dir.path()), sm.clone()).unwrap();
    for i in 0..10u8 {
        node.propose(vec![b'c', i]).await.unwrap();
    }
    node.shutdown().await;
    let seg = dir
        .path()
        .join(format!("{:020}.wal", seg_files(dir.path())[0]));
    let mut data = std::fs::read(&seg).unwrap();
    // A payload byte of the second record: complete records follow it, so this is damage, not
    // a torn write (a bad last record followed only by zeros would read as one).
    let first_len = u32::from_le_bytes(data[..4].try_into().unwrap()) as usize;
    data[2 * 9 + first_len] ^= 0x5a;
    std::fs::write(&seg, data).unwrap();
    assert!(matches!(
        start(config(dir.path()), sm.recover()),
        Err(Error::Corrupt { .. })
    ));
}

#[tokio::test]
async fn a_node_without_a_leader_drops_proposals_after_the_leader_wait() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = config(dir.path());
    config.voters = vec![1, 2, 3]; // no transport: it can never win an election
    config.leader_wait_ticks = 5;
    let node = start(config, Recorder::new()).unwrap();
    // Let it tick through a few election timeouts, sending (untransported) vote requests.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let status = node.status();
    assert_ne!(status.role, "leader");
    assert_eq!(status.leader_id, 0);
    let r = tokio::time::timeout(Duration::from_secs(5), node.propose(b"x".to_vec()))
        .await
        .expect("no hang");
    assert!(matches!(r, Err(ProposeError::Dropped(_))), "{r:?}");
    node.shutdown().await;
}

#[test]
fn handle_is_send_sync_and_cheap_to_clone() {
    fn assert_send_sync<T: Send + Sync + Clone>() {}
    assert_send_sync::<NodeHandle<Vec<u8>>>();
}

/// A gate a test opens: until then, whatever waits on it waits.
#[derive(Clone, Default)]
struct Gate(Arc<(Mutex<bool>, std::sync::Condvar)>);

impl Gate {
    fn wait(&self) {
        let (open, cv) = &*self.0;
        let mut open = open.lock().unwrap();
        while !*open {
            open = cv.wait(open).unwrap();
        }
    }

    fn open(&self) {
        let (open, cv) = &*self.0;
        *open.lock().unwrap() = true;
        cv.notify_all();
    }
}

/// What a failing [`Gated`] checkpoint reports.
const SIMULATED_FAILURE: &str = "simulated checkpoint failure";

/// A [`Recorder`] whose checkpoints' I/O waits for a [`Gate`]: a periodic one on a thread
/// of its own ([`StateMachine::start_checkpoint`]), a synchronous one inline.
struct Gated {
    inner: Recorder,
    gate: Gate,
    running: Option<std::thread::JoinHandle<Option<u64>>>,
    done: Option<u64>,
    /// Every periodic checkpoint's I/O fails (a disk error on the checkpoint thread).
    fail: bool,
    failed: bool,
}

impl Gated {
    fn new(inner: Recorder, gate: Gate) -> Self {
        Gated {
            inner,
            gate,
            running: None,
            done: None,
            fail: false,
            failed: false,
        }
    }

    /// The "I/O": what `memory` held at the start becomes the checkpoint, once the gate opens.
    fn job(&self) -> impl FnOnce() -> Option<u64> + Send + 'static {
        let (disk, gate, fail) = (self.inner.disk.clone(), self.gate.clone(), self.fail);
        let applied = self.inner.memory();
        let skipped = self.inner.skipped.load(Ordering::SeqCst);
        move || {
            gate.wait();
            if fail {
                return None;
            }
            let mut disk = disk.lock().unwrap();
            let last = applied.last().map_or(0, |(i, _)| *i).max(skipped);
            disk.applied = applied;
            disk.index = disk.index.max(last);
            Some(disk.index)
        }
    }

    fn join(&mut self) {
        if let Some(running) = self.running.take() {
            match running.join().unwrap() {
                Some(index) => self.done = Some(index),
                None => self.failed = true,
            }
        }
    }
}

impl StateMachine for Gated {
    type Response = (u64, Vec<u8>);

    fn apply(
        &mut self,
        index: u64,
        command: &Bytes,
    ) -> std::result::Result<Self::Response, String> {
        self.inner.apply(index, command)
    }

    fn skip(&mut self, index: u64) {
        self.inner.skip(index)
    }

    fn applied_index(&self) -> u64 {
        self.inner.applied_index()
    }

    fn checkpoint(&mut self) -> std::result::Result<u64, String> {
        self.join();
        self.done = None;
        self.job()().ok_or_else(|| SIMULATED_FAILURE.to_string())
    }

    fn start_checkpoint(&mut self) -> std::result::Result<Option<u64>, String> {
        self.join();
        self.running = Some(std::thread::spawn(self.job()));
        Ok(None)
    }

    fn finished_checkpoint(&mut self, wait: bool) -> std::result::Result<Option<u64>, String> {
        if wait || self.running.as_ref().is_some_and(|r| r.is_finished()) {
            self.join();
        }
        if self.failed {
            return Err(SIMULATED_FAILURE.into());
        }
        Ok(self.done.take())
    }

    fn snapshot(&mut self) -> std::result::Result<(u64, Vec<u8>), String> {
        self.join();
        self.gate.wait();
        self.inner.snapshot()
    }

    fn restore(&mut self, index: u64, term: u64, data: &[u8]) -> std::result::Result<(), String> {
        self.join();
        self.inner.restore(index, term, data)
    }

    fn snapshot_point(&self) -> Option<(u64, u64)> {
        self.inner.snapshot_point()
    }
}

/// Commits go on while a checkpoint's I/O is in flight, and the log is compacted only once
/// it is durable; a second checkpoint waits for the first (the bound on the entries held in
/// memory). Fails with the checkpoint run on the node's thread (as before `start_checkpoint`):
/// the first commit after the checkpoint began never comes.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn commits_go_on_while_a_checkpoint_is_written() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = config(dir.path());
    config.checkpoint_entries = 20;
    let recorder = Recorder::new();
    let gate = Gate::default();
    let sm = Gated::new(recorder.clone(), gate.clone());
    let node = start(config, sm).unwrap();
    // the first checkpoint starts at the 20th applied entry; 30 commits come while its
    // I/O waits at the gate
    for i in 0..30u32 {
        let proposed = node.propose(i.to_be_bytes().to_vec());
        let (index, _) = tokio::time::timeout(Duration::from_secs(10), proposed)
            .await
            .unwrap_or_else(|_| panic!("commit {i} waited for the checkpoint's I/O"))
            .unwrap();
        assert!(index > 0);
    }
    assert_eq!(
        Metrics::get(&node.metrics().checkpoints),
        0,
        "none durable yet"
    );
    assert_eq!(recorder.disk.lock().unwrap().index, 0);
    // the 40th entry makes the next checkpoint due: it waits for the first
    let more = {
        let node = node.clone();
        tokio::spawn(async move {
            for i in 30..45u32 {
                node.propose(i.to_be_bytes().to_vec()).await.unwrap();
            }
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !more.is_finished(),
        "a second checkpoint began before the first was durable"
    );
    gate.open();
    tokio::time::timeout(Duration::from_secs(10), more)
        .await
        .expect("commits resume once the checkpoint is durable")
        .unwrap();
    let covered = recorder.disk.lock().unwrap().index;
    assert!(
        covered >= 20,
        "the first checkpoint covers its 20 entries: {covered}"
    );
    assert!(Metrics::get(&node.metrics().checkpoints) >= 1);
    assert_eq!(
        node.metrics().checkpoint_micros.snapshot().count,
        Metrics::get(&node.metrics().checkpoints)
    );
    assert_eq!(recorder.memory().len(), 45);
    node.shutdown().await;
    // a clean shutdown leaves everything checkpointed
    assert_eq!(recorder.disk.lock().unwrap().applied.len(), 45);
}

/// A checkpoint failing on its own thread poisons the node as one failing on the node's
/// thread does: later writes fail, none hangs, the log is not compacted, shutdown completes.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_checkpoint_failing_off_the_node_thread_poisons_the_node() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = config(dir.path());
    config.checkpoint_entries = 10;
    let recorder = Recorder::new();
    let gate = Gate::default();
    gate.open();
    let mut sm = Gated::new(recorder.clone(), gate);
    sm.fail = true;
    let node = start(config, sm).unwrap();
    let mut failed = None;
    for i in 0..200u32 {
        let proposed = node.propose(i.to_be_bytes().to_vec());
        match tokio::time::timeout(Duration::from_secs(10), proposed)
            .await
            .expect("no hang")
        {
            Ok(_) => {}
            Err(ProposeError::Failed(why)) => {
                failed = Some((i, why));
                break;
            }
            Err(e) => panic!("unexpected {e}"),
        }
    }
    let (i, why) = failed.expect("writes fail once the checkpoint failed");
    // the first checkpoint begins at the 10th applied entry (Raft's empty one counts)
    assert!(i >= 9, "writes before any checkpoint commit: failed at {i}");
    assert!(why.contains(SIMULATED_FAILURE), "{why}");
    assert!(node.status().poisoned.is_some());
    assert_eq!(Metrics::get(&node.metrics().checkpoints), 0);
    assert_eq!(recorder.disk.lock().unwrap().index, 0);
    let after = tokio::time::timeout(Duration::from_secs(10), node.propose(b"after".to_vec()))
        .await
        .expect("no hang");
    assert!(matches!(after, Err(ProposeError::Failed(_))), "{after:?}");
    tokio::time::timeout(Duration::from_secs(10), node.shutdown())
        .await
        .expect("shutdown completes");
}
