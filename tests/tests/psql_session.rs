//! The README's session, typed into the real `psql` binary.

use std::process::Stdio;
use std::time::Duration;

use sluice_tests::{within, Server};

const SESSION: &str = "\
CREATE STREAM orders (customer text NOT NULL, amount numeric(12,2));
INSERT INTO orders VALUES ('ann', 10.50), ('bob', 3) RETURNING offset;
SELECT offset, customer, amount FROM orders WHERE offset > 0;
SELECT customer, sum(amount) FROM orders GROUP BY customer ORDER BY 1;
UPDATE orders SET amount = 0;
SELECT count(*) AS total FROM orders;
";

fn psql_on_path() -> bool {
    std::process::Command::new("psql")
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// psql's aligned output with runs of spaces squeezed and cells trimmed, so
/// ` 1 | bob      |   3.00` becomes `1 | bob | 3.00`.
fn squeeze(output: &str) -> Vec<String> {
    output
        .lines()
        .map(|line| {
            line.split('|')
                .map(|cell| cell.split_whitespace().collect::<Vec<_>>().join(" "))
                .collect::<Vec<_>>()
                .join(" | ")
        })
        .collect()
}

/// The rows of the first result table whose header line starts with
/// `header`: the lines between its `---+---` rule and the `(N rows)` footer.
fn table_after(lines: &[String], header: &str) -> Vec<String> {
    let Some(start) = lines.iter().position(|l| l.starts_with(header)) else {
        panic!(
            "no result table with header {header:?} in psql output:\n{}",
            lines.join("\n")
        );
    };
    lines[start + 2..]
        .iter()
        .take_while(|l| !(l.starts_with('(') && l.ends_with(')')))
        .cloned()
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn readme_session_through_psql() {
    if !psql_on_path() {
        println!("SKIPPED readme_session_through_psql: `psql` is not on PATH");
        return;
    }
    let server = Server::start().await;
    let dir = tempfile::tempdir().expect("temp dir for the script");
    let script = dir.path().join("session.sql");
    std::fs::write(&script, SESSION).expect("write session.sql");

    let port = server.port().to_string();
    let script_arg = script.to_str().expect("utf-8 path");
    let mut command = tokio::process::Command::new("psql");
    command
        .args([
            "-X",
            "-w",
            "-h",
            "127.0.0.1",
            "-p",
            &port,
            "-U",
            "sluice",
            "-d",
            "sluice",
        ])
        .args(["-v", "ON_ERROR_STOP=0", "-f", script_arg])
        .env("PGCONNECT_TIMEOUT", "10")
        .env("PGTZ", "UTC")
        .stdin(Stdio::null())
        .kill_on_drop(true);
    let output = within(Duration::from_secs(60), "psql", command.output())
        .await
        .expect("run psql");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    println!(
        "psql exit: {}\n--- stdout\n{stdout}--- stderr\n{stderr}",
        output.status
    );

    // psql exits 0 with ON_ERROR_STOP=0 even though UPDATE failed; 2 means
    // the connection was lost.
    assert!(output.status.success(), "psql failed: {}", output.status);
    let lines = squeeze(&stdout);
    assert_eq!(
        table_after(&lines, "offset"),
        ["0", "1"],
        "INSERT ... RETURNING offset"
    );
    assert!(
        lines.iter().any(|l| l == "INSERT 0 2"),
        "no `INSERT 0 2` command tag"
    );
    assert_eq!(
        table_after(&lines, "offset | customer | amount"),
        ["1 | bob | 3.00"],
        "SELECT ... WHERE offset > 0"
    );
    assert_eq!(
        // The aggregate's column name is not checked (PostgreSQL calls it `sum`).
        table_after(&lines, "customer | "),
        ["ann | 10.50", "bob | 3.00"],
        "SELECT customer, sum(amount) ... GROUP BY"
    );
    assert_eq!(
        table_after(&lines, "total"),
        ["2"],
        "rows after the failed UPDATE"
    );

    let errors: Vec<&str> = stderr.lines().filter(|l| l.contains("ERROR:")).collect();
    assert_eq!(
        errors.len(),
        1,
        "exactly one ERROR (for UPDATE), got {errors:?}"
    );
    assert!(
        errors[0].contains("append-only"),
        "UPDATE error should say append-only: {}",
        errors[0]
    );
}
