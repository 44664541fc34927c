//! The load a round runs under, all bounded in count and time:
//!
//! - **appenders**: closed-loop clients, each on a node of its own (round-robin over the
//!   serving nodes, moving on after any error), inserting unique `(client, seq)` rows and
//!   recording each attempt as ok(offset) / failed / unknown with its times;
//! - **tails**: one `COPY (SELECT ... WHERE offset > n) TO STDOUT` per node for the whole
//!   run, resuming at last+1 after any error, recording every row received;
//! - **bank**: transfer transactions between accounts with a fixed total, and a reader that
//!   sums the balances on every serving node;
//! - **monitor**: every 200 ms each serving node is asked who it is and whether it leads.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use rand::{Rng, SeedableRng};
use tokio::task::JoinHandle;
use tokio::time::timeout;
use tokio_postgres::{Client, SimpleQueryMessage};

use super::control::Ports;
use super::history::{lock, BankRead, Clock, History, LeaderSeen, LogRow, Op, Outcome, TailLog};
use crate::cluster::connect;

/// A client gives up waiting for one statement after this long (the server answers 40003
/// after 5 s without a commit).
pub const OP_TIMEOUT: Duration = Duration::from_secs(8);
/// Bound on the attempts of one appender in one round.
pub const MAX_OPS_PER_CLIENT: u64 = 20_000;
/// Accounts of the bank and the balance each starts with.
pub const ACCOUNTS: i64 = 8;
pub const START_BALANCE: i64 = 1_000;

/// Pause between an appender's acknowledged append and its next one (bounds the log's
/// growth, so long runs still dump it quickly).
pub const THINK: Duration = Duration::from_millis(10);

pub const INSERT: &str = "INSERT INTO chaos_log (client, seq) VALUES ($1, $2) RETURNING offset";

/// The statements that create the workloads' tables.
pub fn schema() -> Vec<String> {
    let accounts: Vec<String> = (0..ACCOUNTS)
        .map(|i| format!("({i}, {START_BALANCE})"))
        .collect();
    vec![
        "CREATE STREAM chaos_log (client bigint NOT NULL, seq bigint NOT NULL)".into(),
        "CREATE TABLE chaos_bank (id bigint PRIMARY KEY, balance bigint NOT NULL)".into(),
        format!("INSERT INTO chaos_bank VALUES {}", accounts.join(", ")),
    ]
}

/// Sorts an error into "certainly not applied" or "outcome unknown".
pub fn classify(e: &tokio_postgres::Error) -> Outcome {
    match e.code().map(|c| c.code().to_string()) {
        Some(code)
            if code == "40001"
                || code == "57P03"
                || ["42", "22", "23", "25", "0A", "55"].contains(&&code[..2]) =>
        {
            Outcome::Failed(code)
        }
        Some(code) => Outcome::Unknown(code),
        None if e.is_closed() => Outcome::Unknown("connection closed".into()),
        None => Outcome::Unknown(short(&e.to_string())),
    }
}

fn short(s: &str) -> String {
    s.chars().take(120).collect()
}

/// The serving nodes, in id order.
fn serving(ports: &Ports) -> Vec<(u64, u16)> {
    lock(ports).iter().map(|(id, p)| (*id, *p)).collect()
}

/// Connects to the `turn`-th serving node (bounded); `None` when none serves.
async fn connect_turn(ports: &Ports, turn: usize) -> Option<(u64, Client)> {
    let live = serving(ports);
    if live.is_empty() {
        return None;
    }
    let (node, port) = live[turn % live.len()];
    match timeout(Duration::from_secs(5), connect(port)).await {
        Ok(Ok(client)) => Some((node, client)),
        _ => None,
    }
}

/// Tasks of one round's load; [`Load::finish`] stops them (bounded).
pub struct Load {
    stop: Arc<AtomicBool>,
    tasks: Vec<JoinHandle<()>>,
}

impl Load {
    /// Starts `clients` appenders (client ids `0..clients`, seqs continuing in `next_seq`)
    /// and `transfers` bank clients.
    pub fn start(
        clients: usize,
        transfers: usize,
        next_seq: &Arc<Vec<AtomicI64>>,
        ports: &Ports,
        history: &Arc<History>,
        clock: Clock,
        seed: u64,
    ) -> Load {
        let stop = Arc::new(AtomicBool::new(false));
        let mut tasks = Vec::new();
        for c in 0..clients {
            let (stop, next_seq, ports, history) = (
                stop.clone(),
                next_seq.clone(),
                ports.clone(),
                history.clone(),
            );
            tasks.push(tokio::spawn(async move {
                append_loop(c, &stop, &next_seq[c], &ports, &history, clock).await
            }));
        }
        for t in 0..transfers {
            let (stop, ports, history) = (stop.clone(), ports.clone(), history.clone());
            let seed = seed.wrapping_mul(31).wrapping_add(t as u64);
            tasks.push(tokio::spawn(async move {
                transfer_loop(t, seed, &stop, &ports, &history).await
            }));
        }
        Load { stop, tasks }
    }

    /// Stops the load: in-flight statements end (they are bounded), stragglers are aborted.
    pub async fn finish(self) {
        self.stop.store(true, Ordering::SeqCst);
        for mut t in self.tasks {
            if timeout(OP_TIMEOUT + Duration::from_secs(10), &mut t)
                .await
                .is_err()
            {
                t.abort();
            }
        }
    }
}

async fn append_loop(
    c: usize,
    stop: &AtomicBool,
    next_seq: &AtomicI64,
    ports: &Ports,
    history: &History,
    clock: Clock,
) {
    let mut conn: Option<(u64, Client)> = None;
    let mut turn = c;
    let mut attempts = 0;
    while attempts < MAX_OPS_PER_CLIENT && !stop.load(Ordering::SeqCst) {
        let Some((node, client)) = conn.as_ref() else {
            conn = connect_turn(ports, turn).await;
            turn += 1;
            if conn.is_none() {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            continue;
        };
        attempts += 1;
        let seq = next_seq.fetch_add(1, Ordering::SeqCst);
        let start = clock.now();
        let result = timeout(OP_TIMEOUT, client.query_one(INSERT, &[&(c as i64), &seq])).await;
        let outcome = match result {
            Ok(Ok(row)) => match row.try_get::<_, i64>(0) {
                Ok(offset) => Outcome::Ok(offset),
                Err(e) => Outcome::Unknown(short(&format!("bad RETURNING row: {e}"))),
            },
            Ok(Err(e)) => classify(&e),
            Err(_) => Outcome::Unknown("client timeout".into()),
        };
        let ok = matches!(outcome, Outcome::Ok(_));
        history.push_op(Op {
            client: c as i64,
            seq,
            node: *node,
            start,
            end: clock.now(),
            outcome,
        });
        if ok {
            tokio::time::sleep(THINK).await;
        } else {
            conn = None;
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// One transfer transaction; `Ok(true)` if it moved money.
async fn transfer(client: &Client, from: i64, to: i64, amount: i64) -> Result<bool, String> {
    let e = |e: tokio_postgres::Error| e.to_string();
    let balance = "SELECT balance FROM chaos_bank WHERE id = $1";
    client.batch_execute("BEGIN").await.map_err(e)?;
    let a: i64 = client.query_one(balance, &[&from]).await.map_err(e)?.get(0);
    let _: i64 = client.query_one(balance, &[&to]).await.map_err(e)?.get(0);
    if a < amount {
        client.batch_execute("COMMIT").await.map_err(e)?;
        return Ok(false);
    }
    let update = "UPDATE chaos_bank SET balance = balance + $1 WHERE id = $2";
    client
        .execute(update, &[&-amount, &from])
        .await
        .map_err(e)?;
    client.execute(update, &[&amount, &to]).await.map_err(e)?;
    client.batch_execute("COMMIT").await.map_err(e)?;
    Ok(true)
}

async fn transfer_loop(t: usize, seed: u64, stop: &AtomicBool, ports: &Ports, history: &History) {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut conn: Option<(u64, Client)> = None;
    let mut turn = t + 1;
    let mut attempts = 0;
    while attempts < MAX_OPS_PER_CLIENT && !stop.load(Ordering::SeqCst) {
        let Some((_, client)) = conn.as_ref() else {
            conn = connect_turn(ports, turn).await;
            turn += 1;
            if conn.is_none() {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            continue;
        };
        attempts += 1;
        let from = rng.gen_range(0..ACCOUNTS);
        let to = (from + rng.gen_range(1..ACCOUNTS)) % ACCOUNTS;
        let amount = rng.gen_range(1..300);
        let r = timeout(OP_TIMEOUT, transfer(client, from, to, amount)).await;
        {
            let mut counts = lock(&history.bank_committed);
            counts.1 += 1;
            if matches!(r, Ok(Ok(true))) {
                counts.0 += 1;
            }
        }
        if !matches!(r, Ok(Ok(_))) {
            conn = None;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Runs `sql` with the simple protocol (bounded) and returns the last result's rows.
pub async fn text_query(
    client: &Client,
    sql: &str,
    limit: Duration,
) -> Result<Vec<Vec<Option<String>>>, String> {
    let messages = match timeout(limit, client.simple_query(sql)).await {
        Ok(Ok(m)) => m,
        Ok(Err(e)) => return Err(super::control::describe(&e)),
        Err(_) => return Err(format!("timed out after {limit:?}")),
    };
    let mut rows = Vec::new();
    for m in messages {
        match m {
            SimpleQueryMessage::RowDescription(_) => rows.clear(),
            SimpleQueryMessage::Row(r) => {
                rows.push((0..r.len()).map(|i| r.get(i).map(str::to_string)).collect())
            }
            _ => {}
        }
    }
    Ok(rows)
}

/// The bank's `(accounts, total, min balance)` on one node, summed here from the rows (one
/// snapshot; `sum(bigint)` on a table is not what is under test).
pub async fn bank_read(client: &Client) -> Result<(i64, i64, i64), String> {
    let sql = "SELECT id, balance FROM chaos_bank";
    let rows = text_query(client, sql, Duration::from_secs(5)).await?;
    let mut total = 0i64;
    let mut min = i64::MAX;
    for row in &rows {
        let b: i64 = row
            .get(1)
            .cloned()
            .flatten()
            .ok_or("NULL balance")?
            .parse()
            .map_err(|e| format!("bad balance: {e}"))?;
        total += b;
        min = min.min(b);
    }
    Ok((rows.len() as i64, total, min))
}

/// Background tasks that run for the whole run: bank reader and leader monitor.
pub struct Observers {
    tasks: Vec<JoinHandle<()>>,
}

impl Observers {
    pub fn start(ports: &Ports, history: &Arc<History>, clock: Clock) -> Observers {
        let (p, h) = (ports.clone(), history.clone());
        let reader = tokio::spawn(async move { observe_loop(&p, &h, clock, true).await });
        let (p, h) = (ports.clone(), history.clone());
        let monitor = tokio::spawn(async move { observe_loop(&p, &h, clock, false).await });
        Observers {
            tasks: vec![reader, monitor],
        }
    }
}

impl Drop for Observers {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

/// Polls every serving node (concurrently, each with its own kept connection): the bank
/// total every 300 ms when `bank`, else who leads every 200 ms.
async fn observe_loop(ports: &Ports, history: &History, clock: Clock, bank: bool) {
    let conns: Mutex<BTreeMap<u64, (u16, Arc<Client>)>> = Mutex::new(BTreeMap::new());
    let period = Duration::from_millis(if bank { 300 } else { 200 });
    loop {
        let live = serving(ports);
        let polls = live.iter().map(|&(node, port)| {
            let conns = &conns;
            async move {
                let kept = lock(conns)
                    .get(&node)
                    .filter(|(p, _)| *p == port)
                    .map(|(_, c)| c.clone());
                let client = match kept {
                    Some(c) => c,
                    None => match timeout(Duration::from_secs(2), connect(port)).await {
                        Ok(Ok(c)) => {
                            let c = Arc::new(c);
                            lock(conns).insert(node, (port, c.clone()));
                            c
                        }
                        _ => return,
                    },
                };
                let ok = if bank {
                    poll_bank(&client, node, history, clock).await
                } else {
                    poll_leader(&client, history, clock).await
                };
                if !ok {
                    lock(conns).remove(&node);
                }
            }
        });
        futures::future::join_all(polls).await;
        tokio::time::sleep(period).await;
    }
}

async fn poll_bank(client: &Client, node: u64, history: &History, clock: Clock) -> bool {
    match bank_read(client).await {
        Ok((accounts, total, min_balance)) => {
            if accounts > 0 {
                lock(&history.bank_reads).push(BankRead {
                    at: clock.now(),
                    node,
                    total,
                    accounts,
                    min_balance,
                });
            }
            true
        }
        Err(_) => false,
    }
}

async fn poll_leader(client: &Client, history: &History, clock: Clock) -> bool {
    let sql = "SELECT node_id, term FROM sluice_cluster WHERE is_self AND role = 'leader'";
    match timeout(Duration::from_secs(1), client.query(sql, &[])).await {
        Ok(Ok(rows)) => {
            for r in rows {
                lock(&history.leaders).push(LeaderSeen {
                    at: clock.now(),
                    term: r.get(1),
                    leader: r.get::<_, i64>(0) as u64,
                });
            }
            true
        }
        _ => false,
    }
}

/// A node's COPY tail for the whole run (abort the handle to stop it).
pub fn start_tail(node: u64, ports: &Ports, history: &Arc<History>) -> JoinHandle<()> {
    let log = Arc::new(Mutex::new(TailLog {
        node,
        ..TailLog::default()
    }));
    lock(&history.tails).push(log.clone());
    let ports = ports.clone();
    tokio::spawn(async move { tail_loop(node, &ports, &log).await })
}

async fn tail_loop(node: u64, ports: &Ports, log: &Mutex<TailLog>) {
    let mut first = true;
    loop {
        if !first {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        first = false;
        let Some(port) = lock(ports).get(&node).copied() else {
            continue;
        };
        let Ok(Ok(client)) = timeout(Duration::from_secs(5), connect(port)).await else {
            continue;
        };
        let last = lock(log).rows.last().map_or(-1, |r| r.offset);
        let sql = format!(
            "COPY (SELECT offset, client, seq, ts FROM chaos_log WHERE offset > {last}) TO STDOUT"
        );
        let stream = match timeout(Duration::from_secs(10), client.copy_out(sql.as_str())).await {
            Ok(Ok(s)) => s,
            Ok(Err(e)) => {
                note_error(log, &super::control::describe(&e));
                continue;
            }
            Err(_) => continue,
        };
        let mut stream = Box::pin(stream);
        lock(log).copies += 1;
        let mut buf: Vec<u8> = Vec::new();
        loop {
            match stream.next().await {
                Some(Ok(chunk)) => {
                    buf.extend_from_slice(&chunk);
                    while let Some(nl) = buf.iter().position(|&b| b == b'\n') {
                        let line: Vec<u8> = buf.drain(..=nl).collect();
                        let text = String::from_utf8_lossy(&line[..nl]).into_owned();
                        match parse_row(&text) {
                            Some(row) => lock(log).rows.push(row),
                            None => note_error(log, &format!("unparsable COPY line {text:?}")),
                        }
                    }
                }
                Some(Err(e)) => {
                    note_error(log, &super::control::describe(&e));
                    break;
                }
                None => {
                    note_error(log, "the COPY ended");
                    break;
                }
            }
        }
    }
}

fn note_error(log: &Mutex<TailLog>, e: &str) {
    let mut log = lock(log);
    if log.errors.len() < 50 {
        log.errors.push(short(e));
    }
}

/// A `offset \t client \t seq \t ts` line.
pub fn parse_row(line: &str) -> Option<LogRow> {
    let mut f = line.split('\t');
    let row = LogRow {
        offset: f.next()?.parse().ok()?,
        client: f.next()?.parse().ok()?,
        seq: f.next()?.parse().ok()?,
        ts: f.next()?.to_string(),
    };
    f.next().is_none().then_some(row)
}
