//! `psql -c "COPY (SELECT ... WHERE offset > 1) TO STDOUT"` shows rows as they
//! commit, and Ctrl-C (SIGINT) cancels the tail.
//!
//! psql writes COPY data with stdio and flushes only at the end, so into a
//! pipe its output would sit in a 4 KiB buffer (on a terminal it is line
//! buffered). We run it under `stdbuf -oL` to get the terminal's behaviour.

use std::process::Stdio;
use std::time::Duration;

use sluice_tests::{exec, within, Server};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, BufReader};

/// How long one row may take to show up in psql's output.
const ARRIVAL: Duration = Duration::from_secs(10);

fn on_path(program: &str) -> bool {
    std::process::Command::new(program)
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

#[tokio::test(flavor = "multi_thread")]
async fn psql_shows_tailed_rows_as_they_commit_and_ctrl_c_cancels() {
    if !on_path("psql") {
        println!("SKIPPED psql_shows_tailed_rows_as_they_commit_and_ctrl_c_cancels: `psql` is not on PATH");
        return;
    }
    if !on_path("stdbuf") {
        println!(
            "SKIPPED psql_shows_tailed_rows_as_they_commit_and_ctrl_c_cancels: `stdbuf` is not on PATH"
        );
        return;
    }
    let server = Server::start().await;
    let client = server.client().await;
    exec(
        &client,
        "CREATE STREAM orders (customer text NOT NULL, amount numeric(12,2))",
    )
    .await;
    exec(
        &client,
        "INSERT INTO orders VALUES ('ann', 1), ('bob', 2), ('cy', 3)",
    )
    .await;
    exec(&client, "INSERT INTO orders VALUES ('dee', 4)").await;

    let port = server.port().to_string();
    let mut child = tokio::process::Command::new("stdbuf")
        .args(["-oL", "psql", "-X", "-w", "-h", "127.0.0.1", "-p", &port])
        .args(["-U", "sluice", "-d", "sluice", "-c"])
        .arg("COPY (SELECT offset, customer FROM orders WHERE offset > 1) TO STDOUT")
        .env("PGCONNECT_TIMEOUT", "10")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn psql");
    let pid = child.id().expect("psql pid").to_string();
    let mut stdout = BufReader::new(child.stdout.take().expect("psql stdout")).lines();
    let mut stderr = child.stderr.take().expect("psql stderr");
    let stderr_text = tokio::spawn(async move {
        let mut text = String::new();
        let _ = stderr.read_to_string(&mut text).await;
        text
    });

    let mut next_line = async |what: &str| -> String {
        match within(ARRIVAL, what, stdout.next_line()).await {
            Ok(Some(line)) => line,
            Ok(None) => panic!("{what}: psql closed its output"),
            Err(e) => panic!("{what}: reading psql output: {e}"),
        }
    };
    assert_eq!(next_line("existing row 2").await, "2\tcy");
    assert_eq!(next_line("existing row 3").await, "3\tdee");

    for (offset, customer) in [(4, "eve"), (5, "fay"), (6, "gus")] {
        exec(
            &client,
            &format!("INSERT INTO orders VALUES ('{customer}', {offset})"),
        )
        .await;
        assert_eq!(
            next_line(&format!("row {offset} after its INSERT")).await,
            format!("{offset}\t{customer}")
        );
    }

    let sent = std::process::Command::new("kill")
        .args(["-INT", &pid])
        .status()
        .expect("run kill -INT");
    assert!(sent.success(), "kill -INT {pid}: {sent}");
    let status = within(
        Duration::from_secs(15),
        "psql exiting after SIGINT",
        child.wait(),
    )
    .await
    .expect("wait for psql");
    let stderr = within(Duration::from_secs(5), "psql stderr", stderr_text)
        .await
        .expect("stderr reader");
    println!("psql exit: {status}\n--- stderr\n{stderr}");
    assert!(
        stderr.contains("canceling statement due to user request"),
        "psql stderr after SIGINT: {stderr:?}"
    );
    // The query failed (cancelled), so psql reports failure, but it was not
    // killed by the signal.
    assert_eq!(
        status.code(),
        Some(1),
        "psql exit status after a cancelled COPY"
    );
}
