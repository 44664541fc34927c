//! The server's log as an operator collects it: stderr is a pipe here, so no line carries a
//! terminal colour code (even without NO_COLOR); `--log-format json` writes one JSON object
//! per line; a `--log-level` that is not a filter stops the server at startup (issue 23).

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sluice_tests::{binary_path, spawn_sluice_with, Launch, STARTUP_TIMEOUT};

/// The lines a server started with `args` logged by the time it listens and a moment after.
fn lines_of(args: &[&str], env: &[(&str, &str)]) -> Vec<String> {
    let dir = tempfile::tempdir().expect("temp dir");
    let log = Arc::new(Mutex::new(Vec::new()));
    let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
    let launch = Launch {
        unset_env: &["NO_COLOR"],
        env,
        log: Some(log.clone()),
        ..Launch::default()
    };
    let (mut child, port) = spawn_sluice_with(dir.path(), &args, "log".into(), &launch);
    port.recv_timeout(STARTUP_TIMEOUT)
        .expect("the server listens");
    // startup logs come before "listening on"; give stderr's reader a moment to catch up
    let deadline = Instant::now() + Duration::from_secs(5);
    while log.lock().expect("log").len() < 2 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = child.kill();
    let _ = child.wait();
    let lines = log.lock().expect("log").clone();
    lines
}

#[test]
fn no_colour_codes_when_stderr_is_not_a_terminal() {
    // (SLUICE_LOG, not --log-level: the old binary, which coloured its log, takes it too)
    let lines = lines_of(&[], &[("SLUICE_LOG", "debug")]);
    assert!(lines.len() >= 2, "too few lines to judge: {lines:?}");
    let coloured: Vec<&String> = lines.iter().filter(|l| l.contains('\x1b')).collect();
    assert!(coloured.is_empty(), "escape codes in the log: {coloured:?}");
}

#[test]
fn json_format_writes_one_object_per_line() {
    let lines = lines_of(&["--log-format", "json", "--log-level", "debug"], &[]);
    let logged: Vec<serde_json::Value> = lines
        .iter()
        .filter(|l| !l.starts_with("listening on"))
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect();
    assert!(!logged.is_empty(), "no log line: {lines:?}");
    for v in &logged {
        assert!(v.get("level").is_some() && v.get("fields").is_some(), "{v}");
    }
}

#[test]
fn a_bad_log_level_stops_the_server_at_startup() {
    let dir = tempfile::tempdir().expect("temp dir");
    let out = std::process::Command::new(binary_path())
        .args(["serve", "--data-dir"])
        .arg(dir.path())
        .args([
            "--listen",
            "127.0.0.1:0",
            "--log-level",
            "info,sluice=loudest",
        ])
        .output()
        .expect("run sluice");
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("--log-level"), "{stderr}");
}
