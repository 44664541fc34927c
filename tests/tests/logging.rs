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

/// A server started with `args`, its log, and a client (NoTls) connected to it.
struct Logged {
    child: std::process::Child,
    log: Arc<Mutex<Vec<String>>>,
    port: u16,
    _dir: tempfile::TempDir,
}

impl Logged {
    fn start(args: &[&str]) -> Logged {
        let dir = tempfile::tempdir().expect("temp dir");
        let log = Arc::new(Mutex::new(Vec::new()));
        let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        let launch = Launch {
            log: Some(log.clone()),
            ..Launch::default()
        };
        let (child, port) = spawn_sluice_with(dir.path(), &args, "log".into(), &launch);
        let port = port
            .recv_timeout(STARTUP_TIMEOUT)
            .expect("the server listens");
        Logged {
            child,
            log,
            port,
            _dir: dir,
        }
    }

    async fn client(&self) -> tokio_postgres::Client {
        let url = format!(
            "host=127.0.0.1 port={} user=sluice dbname=sluice",
            self.port
        );
        let (client, conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
            .await
            .expect("connect");
        tokio::spawn(conn);
        client
    }

    /// The duration lines logged so far (after a moment for stderr's reader).
    async fn durations(&self) -> Vec<String> {
        tokio::time::sleep(Duration::from_millis(300)).await;
        self.log
            .lock()
            .expect("log")
            .iter()
            .filter(|l| l.contains("duration: "))
            .cloned()
            .collect()
    }
}

impl Drop for Logged {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `--log-min-duration-statement 0` logs every statement with its duration, in both
/// protocols; the default (-1) logs none; a superuser may change it per session with SET
/// (that anyone else gets 42501 is in `sql/tests/roles.rs`), and a bad value is 22023.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_statements_are_logged_with_their_duration() {
    let all = Logged::start(&["--log-min-duration-statement", "0"]);
    let c = all.client().await;
    c.simple_query("CREATE STREAM slow_log (n bigint)")
        .await
        .expect("create");
    c.execute("INSERT INTO slow_log (n) VALUES ($1)", &[&7i64])
        .await
        .expect("extended insert");
    c.simple_query("SELECT 4242 AS marker")
        .await
        .expect("select");
    let lines = all.durations().await;
    for wanted in [
        "statement: CREATE STREAM slow_log (n bigint)",
        "statement: INSERT INTO slow_log (n) VALUES ($1)",
        "statement: SELECT 4242 AS marker",
    ] {
        assert!(
            lines.iter().any(|l| l.contains(wanted)),
            "no duration line with {wanted:?} in {lines:#?}"
        );
    }
    drop(all);

    let none = Logged::start(&[]);
    let c = none.client().await;
    c.simple_query("SELECT 1").await.expect("select");
    let shown = c
        .simple_query("SHOW log_min_duration_statement")
        .await
        .expect("show");
    let value = shown.iter().find_map(|m| match m {
        tokio_postgres::SimpleQueryMessage::Row(r) => r.get(0).map(String::from),
        _ => None,
    });
    assert_eq!(value.as_deref(), Some("-1"));
    assert!(
        none.durations().await.is_empty(),
        "logged without a threshold"
    );
    // a superuser turns it on for the session
    c.simple_query("SET log_min_duration_statement = 0")
        .await
        .expect("set");
    c.simple_query("SELECT 5151 AS after_set")
        .await
        .expect("select");
    let lines = none.durations().await;
    assert!(
        lines
            .iter()
            .any(|l| l.contains("statement: SELECT 5151 AS after_set")),
        "{lines:#?}"
    );
    let e = c
        .simple_query("SET log_min_duration_statement = 'soon'")
        .await
        .expect_err("bad value");
    assert_eq!(e.code().map(|c| c.code()), Some("22023"), "{e}");
}
