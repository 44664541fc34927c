//! Running the real `psql` binary against a test server, and reading its
//! aligned output.

use std::process::{Output, Stdio};
use std::time::Duration;

use crate::{within, Server};

/// Whether a `psql` binary can be run (tests skip, loudly, if not).
pub fn psql_on_path() -> bool {
    std::process::Command::new("psql")
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// Runs `script` with `psql -X -f` against `server` (user and database
/// `sluice`, `PGTZ=UTC`), with `-v ON_ERROR_STOP=<on_error_stop>`; returns
/// its exit status and output and prints both for the test log.
pub async fn run_script(server: &Server, script: &str, on_error_stop: bool) -> Output {
    let dir = tempfile::tempdir().expect("temp dir for the script");
    let path = dir.path().join("script.sql");
    std::fs::write(&path, script).expect("write script.sql");
    let port = server.port().to_string();
    let stop = format!("ON_ERROR_STOP={}", u8::from(on_error_stop));
    let mut command = tokio::process::Command::new("psql");
    command
        .args(["-X", "-w", "-h", "127.0.0.1", "-p", &port])
        .args(["-U", "sluice", "-d", "sluice", "-v", &stop])
        .arg("-f")
        .arg(&path)
        .env("PGCONNECT_TIMEOUT", "10")
        .env("PGTZ", "UTC")
        .env("PAGER", "cat")
        .env("COLUMNS", "200");
    run_logged(command, "psql").await
}

/// Runs `command` (stdin closed, killed if the test drops it) within a minute; prints its
/// exit status and output, under `what`, for the test log.
pub async fn run_logged(mut command: tokio::process::Command, what: &str) -> Output {
    command.stdin(Stdio::null()).kill_on_drop(true);
    let output = within(Duration::from_secs(60), what, command.output())
        .await
        .unwrap_or_else(|e| panic!("run {what}: {e}"));
    println!(
        "{what} exit: {}\n--- stdout\n{}--- stderr\n{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    output
}

/// psql's aligned output with runs of spaces squeezed and cells trimmed, so
/// ` 1 | bob      |   3.00` becomes `1 | bob | 3.00`.
pub fn squeeze(output: &str) -> Vec<String> {
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
pub fn table_after(lines: &[String], header: &str) -> Vec<String> {
    let Some(start) = lines.iter().position(|l| l.starts_with(header)) else {
        panic!(
            "no result table with header {header:?} in psql output:\n{}",
            lines.join("\n")
        );
    };
    lines[start + 2..]
        .iter()
        .take_while(|l| !(l.is_empty() || l.starts_with('(') && l.ends_with(')')))
        .cloned()
        .collect()
}
