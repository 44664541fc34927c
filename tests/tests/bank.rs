//! Concurrent transactions that read and write the same rows: clients move
//! money between accounts in transactions (read both balances by primary
//! key, refuse to overdraw, update both), retrying on 40001. The total
//! never changes, no balance goes negative, every transfer that committed
//! is accounted for, and the retries are counted (and printed).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use rand::{Rng, SeedableRng};
use sluice_tests::{exec, within, Server};
use tokio_postgres::Client;

const ACCOUNTS: i64 = 10;
const START: i64 = 1_000;
const CLIENTS: u64 = 8;
const TRANSFERS_PER_CLIENT: usize = 40;
const MAX_RETRIES: usize = 200;

async fn balance(client: &Client, id: i64) -> Result<i64, tokio_postgres::Error> {
    let row = client
        .query_one("SELECT balance FROM accounts WHERE id = $1", &[&id])
        .await?;
    Ok(row.get(0))
}

/// One transfer attempt: Ok(true) moved, Ok(false) refused (would overdraw).
async fn transfer(
    client: &Client,
    from: i64,
    to: i64,
    amount: i64,
) -> Result<bool, tokio_postgres::Error> {
    client.batch_execute("BEGIN").await?;
    let a = balance(client, from).await?;
    let _ = balance(client, to).await?;
    if a < amount {
        client.batch_execute("COMMIT").await?;
        return Ok(false);
    }
    client
        .execute(
            "UPDATE accounts SET balance = balance - $1 WHERE id = $2",
            &[&amount, &from],
        )
        .await?;
    client
        .execute(
            "UPDATE accounts SET balance = balance + $1 WHERE id = $2",
            &[&amount, &to],
        )
        .await?;
    client.batch_execute("COMMIT").await?;
    Ok(true)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn bank_transfers_keep_the_total() {
    let server = Server::start().await;
    let setup = server.client().await;
    exec(
        &setup,
        "CREATE TABLE accounts (id bigint PRIMARY KEY, balance bigint NOT NULL)",
    )
    .await;
    exec(
        &setup,
        "CREATE TABLE transfers (client bigint, n bigint, amount bigint, PRIMARY KEY (client, n))",
    )
    .await;
    let values: Vec<String> = (0..ACCOUNTS).map(|i| format!("({i}, {START})")).collect();
    exec(
        &setup,
        &format!("INSERT INTO accounts VALUES {}", values.join(", ")),
    )
    .await;

    let retries = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for c in 0..CLIENTS {
        let client = server.client().await;
        let retries = retries.clone();
        tasks.push(tokio::spawn(async move {
            let mut rng = rand::rngs::StdRng::seed_from_u64(c);
            let mut moved = 0u64;
            for n in 0..TRANSFERS_PER_CLIENT {
                let from = rng.gen_range(0..ACCOUNTS);
                let to = (from + rng.gen_range(1..ACCOUNTS)) % ACCOUNTS;
                let amount = rng.gen_range(1..400);
                let mut attempt = 0;
                loop {
                    match transfer(&client, from, to, amount).await {
                        Ok(done) => {
                            if done {
                                moved += 1;
                                client
                                    .execute(
                                        "INSERT INTO transfers VALUES ($1, $2, $3)",
                                        &[&(c as i64), &(n as i64), &amount],
                                    )
                                    .await
                                    .expect("record the transfer");
                            }
                            break;
                        }
                        Err(e) if e.code().map(|c| c.code()) == Some("40001") => {
                            retries.fetch_add(1, Ordering::Relaxed);
                            attempt += 1;
                            assert!(attempt < MAX_RETRIES, "transfer retried {attempt} times");
                        }
                        Err(e) => panic!("client {c}: transfer failed: {e:?}"),
                    }
                }
            }
            moved
        }));
    }
    let mut moved = 0;
    for t in tasks {
        moved += within(Duration::from_secs(120), "bank client", t)
            .await
            .expect("client task");
    }
    let rows = setup
        .query("SELECT id, balance FROM accounts ORDER BY id", &[])
        .await
        .expect("read balances");
    let balances: Vec<i64> = rows.iter().map(|r| r.get(1)).collect();
    assert_eq!(balances.len() as i64, ACCOUNTS);
    assert_eq!(
        balances.iter().sum::<i64>(),
        ACCOUNTS * START,
        "the total changed: {balances:?}"
    );
    assert!(
        balances.iter().all(|b| *b >= 0),
        "a balance went negative: {balances:?}"
    );
    let recorded: i64 = setup
        .query_one("SELECT count(*) FROM transfers", &[])
        .await
        .expect("count transfers")
        .get(0);
    assert_eq!(recorded as u64, moved);
    assert!(moved > 0, "no transfer went through");
    let retries = retries.load(Ordering::Relaxed);
    println!(
        "bank transfer: {CLIENTS} clients, {} attempts, {moved} moved, {retries} retries of 40001",
        CLIENTS as usize * TRANSFERS_PER_CLIENT
    );
}
