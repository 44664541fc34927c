//! Hostile connections (issue 20): sockets that never log in, floods past the descriptor
//! limit, empty and guessed passwords, messages that panic the protocol library. Each test
//! says what the server did before the fix; each failed on that code.
//!
//! These tests read the server's log and some change its environment, so they start
//! `sluice` through [`sluice_tests::spawn_sluice_with`] ([`Sluice`]) rather than
//! [`sluice_tests::Server`]: the same binary and flags, with the output kept.

use std::process::{Child, ExitStatus};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sluice_tests::wire::{cstr, error_code, message, startup, Read, Wire};
use sluice_tests::{spawn_sluice_with, within, Launch, STATEMENT_TIMEOUT};
use tempfile::TempDir;
use tokio::net::TcpStream;
use tokio_postgres::{Client, NoTls};

/// How long a server may take to start, or to exit after refusing its configuration.
const START: Duration = Duration::from_secs(60);
/// How long an expected answer or close may take.
const ANSWER: Duration = Duration::from_secs(10);

/// A `sluice serve` process whose output is kept (and echoed to the test's stderr).
struct Sluice {
    child: Child,
    port: u16,
    log: Arc<Mutex<Vec<String>>>,
    _data: TempDir,
}

/// How to start one.
#[derive(Default)]
struct Start<'a> {
    args: &'a [&'a str],
    /// `--listen`, if not 127.0.0.1:0.
    listen: Option<&'a str>,
    env: &'a [(&'a str, &'a str)],
    unset_env: &'a [&'a str],
    /// `ulimit -n` for the process.
    open_files: Option<u32>,
}

impl Sluice {
    /// Starts the server; `Err` with its exit status and output if it exits instead of
    /// listening.
    async fn start(how: Start<'_>) -> Result<Sluice, (ExitStatus, String)> {
        let data = tempfile::Builder::new()
            .prefix("sluice-hostile-conn-")
            .tempdir()
            .expect("create a data directory");
        let args: Vec<String> = how.args.iter().map(|s| s.to_string()).collect();
        let log = Arc::new(Mutex::new(Vec::new()));
        let launch = Launch {
            listen: how.listen,
            env: how.env,
            unset_env: how.unset_env,
            open_files: how.open_files,
            log: Some(log.clone()),
        };
        let (mut child, port_rx) =
            spawn_sluice_with(data.path(), &args, "sluice".to_string(), &launch);
        let deadline = Instant::now() + START;
        loop {
            if let Ok(port) = port_rx.try_recv() {
                return Ok(Sluice {
                    child,
                    port,
                    log,
                    _data: data,
                });
            }
            if let Some(status) = child.try_wait().expect("wait for sluice") {
                // let the output threads catch up
                tokio::time::sleep(Duration::from_millis(300)).await;
                let output = log.lock().expect("log").join("\n");
                return Err((status, output));
            }
            if Instant::now() >= deadline {
                let _ = child.kill();
                let _ = child.wait();
                panic!("sluice neither listened nor exited within {START:?}");
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    async fn running(how: Start<'_>) -> Sluice {
        match Sluice::start(how).await {
            Ok(s) => s,
            Err((status, output)) => panic!("sluice exited ({status}):\n{output}"),
        }
    }

    /// Log lines containing `text`.
    fn lines_with(&self, text: &str) -> Vec<String> {
        let log = self.log.lock().expect("log");
        log.iter().filter(|l| l.contains(text)).cloned().collect()
    }

    /// Waits (up to `wait`) for a log line containing `text`; whether one came.
    async fn wait_for_line(&self, text: &str, wait: Duration) -> bool {
        let deadline = Instant::now() + wait;
        loop {
            if !self.lines_with(text).is_empty() {
                return true;
            }
            if Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    fn is_running(&mut self) -> bool {
        self.child.try_wait().expect("poll sluice").is_none()
    }

    fn conn_string(&self, password: Option<&str>) -> String {
        let mut s = format!(
            "host=127.0.0.1 port={} user=sluice dbname=sluice connect_timeout=10",
            self.port
        );
        if let Some(p) = password {
            s.push_str(&format!(" password={p}"));
        }
        s
    }

    /// A login with `password`: the client, or the error.
    async fn login(&self, password: Option<&str>) -> Result<Client, tokio_postgres::Error> {
        let conn_string = self.conn_string(password);
        let connect = tokio_postgres::connect(&conn_string, NoTls);
        let (client, connection) = within(ANSWER, "login", connect).await?;
        tokio::spawn(async move {
            let _ = connection.await;
        });
        Ok(client)
    }

    /// A login that must work, retried for a while (the server may still be catching up on
    /// closed sockets).
    async fn login_eventually(&self, password: Option<&str>) -> Client {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            match self.login(password).await {
                Ok(client) => return client,
                Err(e) if Instant::now() < deadline => {
                    eprintln!("login not yet possible: {e}");
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                Err(e) => panic!("no login within 30 s: {e}"),
            }
        }
    }

    /// A raw socket that sends nothing.
    async fn idle_socket(&self) -> TcpStream {
        within(
            ANSWER,
            "connect",
            TcpStream::connect(("127.0.0.1", self.port)),
        )
        .await
        .expect("connect")
    }
}

impl Drop for Sluice {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

async fn select_one(client: &Client) {
    let rows = within(
        STATEMENT_TIMEOUT,
        "SELECT 1",
        client.simple_query("SELECT 1"),
    )
    .await
    .expect("SELECT 1");
    assert!(!rows.is_empty());
}

/// Whether a raw login with `password` gets AuthenticationOk (drivers refuse to send an
/// empty password).
async fn raw_login(port: u16, password: &str) -> bool {
    let mut raw = Wire::open(port).await;
    raw.send(&startup()).await;
    if !matches!(raw.read_message(ANSWER).await, Read::Message(b'R', _)) {
        return false;
    }
    raw.send(&message(b'p', &cstr(password))).await;
    matches!(raw.read_message(ANSWER).await, Read::Message(b'R', body) if body == [0, 0, 0, 0])
}

/// Reads from a raw socket until it closes or `wait` passes; the bytes read, and whether it
/// closed.
async fn read_until_closed(socket: &mut TcpStream, wait: Duration) -> (Vec<u8>, bool) {
    use tokio::io::AsyncReadExt;
    let deadline = tokio::time::Instant::now() + wait;
    let mut bytes = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        match tokio::time::timeout_at(deadline, socket.read(&mut chunk)).await {
            Err(_) => return (bytes, false),
            Ok(Ok(0)) | Ok(Err(_)) => return (bytes, true),
            Ok(Ok(n)) => bytes.extend_from_slice(&chunk[..n]),
        }
    }
}

/// Before: only logged-in sessions counted toward `--max-connections`, so any number of
/// sockets that never logged in were kept (1,100 of them exhausted the file descriptors) and
/// a login past the limit of idle sockets still succeeded.
#[tokio::test]
async fn sockets_count_toward_max_connections_from_accept() {
    let server = Sluice::running(Start {
        args: &["--max-connections", "3", "--password", "secret"],
        ..Default::default()
    })
    .await;
    let mut idle = Vec::new();
    for _ in 0..3 {
        idle.push(server.idle_socket().await);
    }
    // Let the server accept them (accept and connect race).
    tokio::time::sleep(Duration::from_millis(300)).await;
    let Err(refused) = server.login(Some("secret")).await else {
        panic!("a login past --max-connections idle sockets succeeded");
    };
    let db = refused.as_db_error().expect("a server error");
    assert_eq!(db.code().code(), "53300");
    assert_eq!(db.message(), "sorry, too many clients already");

    // Past the limit and the sockets kept to refuse logins politely, a socket gets the
    // 53300 at once and is closed.
    let mut over = Vec::new();
    for _ in 0..80 {
        over.push(server.idle_socket().await);
    }
    let mut answered_at_once = 0;
    for socket in &mut over {
        let (bytes, closed) = read_until_closed(socket, Duration::from_millis(100)).await;
        if closed && bytes.first() == Some(&b'E') {
            assert_eq!(error_code(&bytes[5..]), "53300");
            answered_at_once += 1;
        }
    }
    assert!(answered_at_once > 0, "no socket was refused at once");
    drop(over);

    drop(idle);
    let client = server.login_eventually(Some("secret")).await;
    select_one(&client).await;
}

/// Before: there was no `--authentication-timeout` (the server refused the flag) and a socket
/// that never logged in was kept 60 s, silently.
#[tokio::test]
async fn connections_that_do_not_log_in_in_time_are_closed() {
    let server = Sluice::running(Start {
        args: &["--authentication-timeout", "1", "--password", "secret"],
        ..Default::default()
    })
    .await;
    let started = Instant::now();
    // one says nothing, one sends its startup packet and never answers the password request
    let mut silent = server.idle_socket().await;
    let mut wire = Wire::open(server.port).await;
    wire.send(&startup()).await;
    match wire.read_message(ANSWER).await {
        Read::Message(b'R', _) => {}
        other => panic!("expected a password request, got {other:?}"),
    }
    assert_eq!(wire.read_message(ANSWER).await, Read::Closed);
    let (_, closed) = read_until_closed(&mut silent, ANSWER).await;
    assert!(closed, "the silent socket is still open");
    assert!(started.elapsed() >= Duration::from_secs(1));
    assert!(
        server
            .wait_for_line(
                "did not log in within 1s (--authentication-timeout)",
                ANSWER
            )
            .await,
        "no log line for the timeout"
    );
    // a login is unaffected
    let client = server.login(Some("secret")).await.expect("login");
    select_one(&client).await;

    for bad in ["0", "601"] {
        let (status, output) = Sluice::start(Start {
            args: &["--authentication-timeout", bad],
            ..Default::default()
        })
        .await
        .err()
        .unwrap_or_else(|| panic!("started with --authentication-timeout {bad}"));
        assert_eq!(status.code(), Some(2), "{output}");
        assert!(output.contains("between 1 and 600 seconds"), "{output}");
    }
}

/// Before: `--password ''` (or an empty `SLUICE_PASSWORD`, or `password = ""` in the config
/// file) passed the "no public listener without a password" check, and the empty password
/// logged in.
#[tokio::test]
async fn an_empty_password_is_refused_at_startup() {
    let dir = tempfile::tempdir().expect("temporary directory");
    let config = dir.path().join("sluice.toml");
    std::fs::write(&config, "password = \"\"\n").expect("write the config file");
    let config = config.to_str().expect("utf-8 path");
    let cases: [(&str, Start<'_>); 4] = [
        (
            "--password ''",
            Start {
                args: &["--password", ""],
                ..Default::default()
            },
        ),
        (
            "--password '' on a public address",
            Start {
                args: &["--password", ""],
                listen: Some("0.0.0.0:0"),
                ..Default::default()
            },
        ),
        (
            "SLUICE_PASSWORD=''",
            Start {
                env: &[("SLUICE_PASSWORD", "")],
                ..Default::default()
            },
        ),
        (
            "password = \"\" in the config file",
            Start {
                args: &["--config", config],
                unset_env: &["SLUICE_PASSWORD"],
                ..Default::default()
            },
        ),
    ];
    for (what, how) in cases {
        match Sluice::start(how).await {
            Ok(server) => {
                let logged_in = raw_login(server.port, "").await;
                panic!("started with {what} (the empty password logged in: {logged_in})");
            }
            Err((status, output)) => {
                assert_eq!(status.code(), Some(2), "{what}: {output}");
                assert!(
                    output.contains("an empty password is no password"),
                    "{what}: {output}"
                );
            }
        }
    }
}

/// Before: wrong passwords were answered at once (1,000 in 0.14 s). Now the answer to each
/// waits 100 ms, doubling with each failure in a row from the address, up to 2 s: four take
/// at least 100 + 200 + 400 + 800 ms. The right password still logs in afterwards.
#[tokio::test]
async fn wrong_passwords_are_answered_slower_and_slower() {
    let server = Sluice::running(Start {
        args: &["--password", "secret"],
        ..Default::default()
    })
    .await;
    let started = Instant::now();
    for guess in ["a", "b", "c", "d"] {
        let err = server
            .login(Some(guess))
            .await
            .err()
            .unwrap_or_else(|| panic!("{guess} logged in"));
        let db = err.as_db_error().expect("a server error");
        assert_eq!(db.code().code(), "28P01", "{guess}");
    }
    let took = started.elapsed();
    assert!(
        took >= Duration::from_millis(1500),
        "four wrong passwords took only {took:?}"
    );
    let client = server
        .login(Some("secret"))
        .await
        .expect("the right password");
    select_one(&client).await;
}

/// Before: out of file descriptors, the server logged `accept failed: Too many open files`
/// every 50 ms for as long as it lasted (and with 1,100 idle sockets, logins timed out). Now
/// it logs the burst once, backs off, serves the connections it has, and accepts again once
/// descriptors are free.
#[tokio::test]
async fn running_out_of_file_descriptors_is_ridden_out() {
    let mut server = Sluice::running(Start {
        open_files: Some(OPEN_FILES),
        ..Default::default()
    })
    .await;
    let before = server.login(None).await.expect("login before the flood");
    let mut flood = Vec::new();
    for _ in 0..FLOOD {
        flood.push(server.idle_socket().await);
    }
    assert!(
        server.wait_for_line("accept failed", ANSWER).await,
        "{FLOOD} sockets did not exhaust {OPEN_FILES} descriptors"
    );
    // a while out of descriptors: the old server logged ~40 lines in this time
    tokio::time::sleep(Duration::from_secs(2)).await;
    select_one(&before).await;
    let mut lines = server.lines_with("accept failed");
    lines.extend(server.lines_with("accept still failing"));
    assert!(
        lines.len() <= 2,
        "accept failures flooded the log: {lines:#?}"
    );
    drop(flood);
    let after = server.login_eventually(None).await;
    select_one(&after).await;
    select_one(&before).await;
    assert!(server.is_running());
    // the end of the burst: 5 s without a failed accept
    assert!(
        server
            .wait_for_line("accepting connections again", Duration::from_secs(20))
            .await,
        "no line for the end of the burst"
    );
    let mut lines = server.lines_with("accept failed");
    lines.extend(server.lines_with("accept still failing"));
    assert_eq!(lines.len(), 1, "one burst, one line: {lines:#?}");
}

/// `ulimit -n` for [`running_out_of_file_descriptors_is_ridden_out`], and the sockets opened
/// against it.
const OPEN_FILES: u32 = 64;
const FLOOD: usize = 120;

/// Before: the default panic hook wrote every panic: with `RUST_BACKTRACE=1` a backtrace of
/// ~17 KB each time, so a client repeating a message that panics the protocol library flooded
/// the log. Now each location is logged once (one line; the backtrace once, and only with
/// `RUST_BACKTRACE`), and repeats are counted (a line at the 10th, 100th...). The panics are
/// provoked with a test-only flag, so the test does not depend on any bug.
#[tokio::test]
async fn a_repeated_panic_is_logged_once() {
    const TIMES: usize = 30;
    for backtrace in [false, true] {
        let unset: &[&str] = if backtrace { &[] } else { &["RUST_BACKTRACE"] };
        let server = Sluice::running(Start {
            args: &["--test-panic-application-name", "boom"],
            unset_env: unset,
            ..Default::default()
        })
        .await;
        let boom = format!("{} application_name=boom", server.conn_string(None));
        for _ in 0..TIMES {
            let login = within(ANSWER, "login", tokio_postgres::connect(&boom, NoTls)).await;
            assert!(login.is_err(), "the panicking login succeeded");
        }
        let client = server.login(None).await.expect("login after the panics");
        select_one(&client).await;
        let panics = server.lines_with("test panic requested");
        assert!(
            !panics.is_empty() && panics.len() <= 2,
            "{TIMES} panics logged as {} lines: {panics:#?}",
            panics.len()
        );
        assert!(
            panics[0].contains("server/src/panics.rs"),
            "no location in {:?}",
            panics[0]
        );
        let backtraces = server.lines_with("backtrace of the panic").len()
            + server.lines_with("stack backtrace:").len();
        assert_eq!(
            backtraces,
            usize::from(backtrace),
            "RUST_BACKTRACE set: {backtrace}"
        );
    }
}
