//! A real `sluice` process on a temporary data directory.
//!
//! The server announces readiness by printing `listening on HOST:PORT` on
//! stdout; we parse the port from that line and keep draining its stdout and
//! stderr into the test's captured output (prefixed with `[sluice#N]`, where
//! N counts restarts). The data directory outlives restarts and is removed
//! when the [`Server`] is dropped; dropping also SIGKILLs a running process.

use std::io::{BufRead, BufReader, Read};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

use tempfile::TempDir;
use tokio_postgres::{Client, NoTls};

/// How long a starting server may take to print its `listening on` line.
pub const STARTUP_TIMEOUT: Duration = Duration::from_secs(60);
/// How long a server may take to exit after SIGTERM.
pub const SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(30);
/// How long establishing one client connection may take.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Environment variable naming the `sluice` binary to test.
pub const BIN_ENV: &str = "SLUICE_BIN";

pub struct Server {
    child: Option<Child>,
    port: u16,
    args: Vec<String>,
    data_dir: TempDir,
    generation: u32,
}

impl Server {
    /// Starts `sluice serve` on a fresh data directory and a random port.
    pub async fn start() -> Server {
        Server::start_with(&[]).await
    }

    /// Like [`Server::start`], with extra arguments after `serve`'s own.
    /// The same arguments are used again by [`Server::restart`].
    pub async fn start_with(args: &[&str]) -> Server {
        let data_dir = tempfile::Builder::new()
            .prefix("sluice-test-")
            .tempdir()
            .expect("create temporary data directory");
        Server::start_in(data_dir, args).await
    }

    /// Like [`Server::start_with`], on a data directory the test prepared (a copy of a
    /// fixture); the server owns it from now on.
    pub async fn start_in(data_dir: TempDir, args: &[&str]) -> Server {
        let mut server = Server {
            child: None,
            port: 0,
            args: args.iter().map(|a| a.to_string()).collect(),
            data_dir,
            generation: 0,
        };
        server.spawn().await;
        server
    }

    /// Stops a running server gracefully (SIGTERM) and starts it again on
    /// the same data directory. The new process listens on a new port.
    pub async fn restart(&mut self) {
        if self.child.is_some() {
            self.stop().await;
        }
        self.generation += 1;
        self.spawn().await;
    }

    /// The server process's id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(|c| c.id())
    }

    /// Crashes the server: SIGKILL, then reaps the process.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            // An error means it already exited, which is what we want.
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Sends SIGTERM and waits (bounded) for the process to exit. Panics if
    /// it does not exit within `SHUTDOWN_TIMEOUT` (it is SIGKILLed first).
    pub async fn stop(&mut self) -> ExitStatus {
        let mut child = self
            .child
            .take()
            .expect("stop() called on a server that is not running");
        let pid = child.id().to_string();
        let sent = Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .expect("run `kill -TERM`");
        assert!(sent.success(), "`kill -TERM {pid}` failed: {sent}");
        let deadline = Instant::now() + SHUTDOWN_TIMEOUT;
        loop {
            if let Some(status) = child.try_wait().expect("wait for sluice") {
                return status;
            }
            if Instant::now() >= deadline {
                let _ = child.kill();
                let _ = child.wait();
                panic!("sluice (pid {pid}) did not exit within {SHUTDOWN_TIMEOUT:?} of SIGTERM");
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    pub fn is_running(&mut self) -> bool {
        match self.child.as_mut() {
            Some(child) => child.try_wait().expect("poll sluice").is_none(),
            None => false,
        }
    }

    pub fn data_dir(&self) -> &Path {
        self.data_dir.path()
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    pub fn conn_string(&self) -> String {
        format!(
            "host=127.0.0.1 port={} user=sluice dbname=sluice connect_timeout=10",
            self.port
        )
    }

    /// A new connection; its connection task runs on the current runtime.
    pub async fn client(&self) -> Client {
        let conn_string = self.conn_string();
        let connect = tokio_postgres::connect(&conn_string, NoTls);
        let (client, connection) = tokio::time::timeout(CONNECT_TIMEOUT, connect)
            .await
            .unwrap_or_else(|_| panic!("connecting to sluice on port {} timed out", self.port))
            .unwrap_or_else(|e| panic!("connecting to sluice on port {}: {e}", self.port));
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                eprintln!("[client] connection ended: {e}");
            }
        });
        client
    }

    async fn spawn(&mut self) {
        let tag = format!("sluice#{}", self.generation);
        let (child, port_rx) = spawn_sluice(self.data_dir.path(), &self.args, tag);
        self.child = Some(child);

        let deadline = Instant::now() + STARTUP_TIMEOUT;
        self.port = loop {
            match port_rx.try_recv() {
                Ok(port) => break port,
                Err(mpsc::TryRecvError::Disconnected) => {
                    tokio::time::sleep(Duration::from_millis(500)).await;
                    let status = self
                        .child
                        .as_mut()
                        .and_then(|c| c.try_wait().ok().flatten());
                    self.kill();
                    panic!(
                        "sluice closed stdout without printing `listening on HOST:PORT` \
                         (exit status {status:?}); see its output above"
                    );
                }
                Err(mpsc::TryRecvError::Empty) => {}
            }
            if Instant::now() >= deadline {
                self.kill();
                panic!("sluice did not print `listening on HOST:PORT` within {STARTUP_TIMEOUT:?}");
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Starts `sluice serve` on `data_dir` and a random client port, with `args` after its own;
/// its output goes to the test's captured stderr tagged `[tag]`, and the port it prints in
/// `listening on` arrives on the returned channel.
pub fn spawn_sluice(data_dir: &Path, args: &[String], tag: String) -> (Child, mpsc::Receiver<u16>) {
    spawn_sluice_with(data_dir, args, tag, &Launch::default())
}

/// What a test may change about how [`spawn_sluice_with`] starts the process.
#[derive(Default)]
pub struct Launch<'a> {
    /// `--listen`, if not `127.0.0.1:0`.
    pub listen: Option<&'a str>,
    /// Variables set for the process.
    pub env: &'a [(&'a str, &'a str)],
    /// Variables removed from its environment.
    pub unset_env: &'a [&'a str],
    /// `ulimit -n` for the process (started through `bash -c`).
    pub open_files: Option<u32>,
    /// Where every output line is also kept, for tests that read the log.
    pub log: Option<Arc<Mutex<Vec<String>>>>,
}

/// [`spawn_sluice`] with the changes in `launch`.
pub fn spawn_sluice_with(
    data_dir: &Path,
    args: &[String],
    tag: String,
    launch: &Launch<'_>,
) -> (Child, mpsc::Receiver<u16>) {
    let bin = binary_path();
    let data_dir = data_dir.to_str().expect("utf-8 data directory path");
    let listen = launch.listen.unwrap_or("127.0.0.1:0");
    let mut command = match launch.open_files {
        Some(n) => {
            let mut c = Command::new("bash");
            c.arg("-c")
                .arg(format!("ulimit -n {n} && exec \"$0\" \"$@\""))
                .arg(&bin);
            c
        }
        None => Command::new(&bin),
    };
    command
        .args(["serve", "--data-dir", data_dir, "--listen", listen])
        .args(args)
        .env("NO_COLOR", "1")
        .env("RUST_BACKTRACE", "1")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (k, v) in launch.env {
        command.env(k, v);
    }
    for k in launch.unset_env {
        command.env_remove(k);
    }
    let mut child = command
        .spawn()
        .unwrap_or_else(|e| panic!("spawn {}: {e}", bin.display()));
    let (port_tx, port_rx) = mpsc::channel();
    let stdout = child.stdout.take().expect("piped stdout");
    let stderr = child.stderr.take().expect("piped stderr");
    forward_output(stdout, tag.clone(), launch.log.clone(), Some(port_tx));
    forward_output(stderr, tag, launch.log.clone(), None);
    (child, port_rx)
}

/// Copies a child's output line by line into the test's captured stderr (and `log`).
/// The first `listening on` line's port is sent on `port_tx`.
fn forward_output(
    stream: impl Read + Send + 'static,
    tag: String,
    log: Option<Arc<Mutex<Vec<String>>>>,
    mut port_tx: Option<mpsc::Sender<u16>>,
) {
    std::thread::spawn(move || {
        for line in BufReader::new(stream).lines() {
            let Ok(line) = line else { break };
            eprintln!("[{tag}] {line}");
            if let Some(port) = parse_listening_port(&line) {
                if let Some(tx) = port_tx.take() {
                    let _ = tx.send(port);
                }
            }
            if let Some(log) = &log {
                log.lock().expect("log").push(line);
            }
        }
    });
}

/// The port of a `... listening on 127.0.0.1:PORT ...` line, if it is one.
pub fn parse_listening_port(line: &str) -> Option<u16> {
    const MARKER: &str = "listening on ";
    let start = line.find(MARKER)? + MARKER.len();
    let addr: String = line[start..]
        .chars()
        .take_while(|c| c.is_ascii_hexdigit() || matches!(c, '.' | ':' | '[' | ']'))
        .collect();
    addr.trim_end_matches(['.', ':'])
        .parse::<SocketAddr>()
        .ok()
        .map(|a| a.port())
}

/// The `sluice` binary: `$SLUICE_BIN`, else `sluice` beside the directory
/// holding this test binary (`target/debug/deps/..` → `target/debug/sluice`) or beside
/// this binary,
/// else under `$CARGO_TARGET_DIR` or the workspace's `target/`.
pub fn binary_path() -> PathBuf {
    if let Some(bin) = std::env::var_os(BIN_ENV) {
        return PathBuf::from(bin);
    }
    let exe_name = format!("sluice{}", std::env::consts::EXE_SUFFIX);
    let mut candidates = Vec::new();
    if let Ok(exe) = std::env::current_exe() {
        // a test binary lives in target/<profile>/deps, a load binary (sluice-chaos,
        // sluice-hostile) in target/<profile> beside the server
        if let Some(dir) = exe.parent() {
            candidates.extend(dir.parent().map(|profile_dir| profile_dir.join(&exe_name)));
            candidates.push(dir.join(&exe_name));
        }
    }
    if let Some(target) = std::env::var_os("CARGO_TARGET_DIR") {
        candidates.push(PathBuf::from(target).join("debug").join(&exe_name));
    }
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    candidates.push(workspace.join("target").join("debug").join(&exe_name));
    match candidates.iter().find(|c| c.is_file()) {
        Some(found) => found.clone(),
        None => panic!(
            "no sluice binary found (looked at {candidates:?}); run `cargo build --bins` \
             first or set {BIN_ENV}"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::parse_listening_port;

    #[test]
    fn parses_port_from_plain_and_log_lines() {
        assert_eq!(
            parse_listening_port("listening on 127.0.0.1:5499"),
            Some(5499)
        );
        assert_eq!(
            parse_listening_port(
                "2024-01-01T00:00:00Z  INFO sluice: listening on 127.0.0.1:41234 node=1"
            ),
            Some(41234)
        );
        assert_eq!(parse_listening_port("listening on [::1]:7001"), Some(7001));
    }

    #[test]
    fn ignores_other_lines() {
        assert_eq!(parse_listening_port("starting up"), None);
        assert_eq!(parse_listening_port("listening on nowhere"), None);
        assert_eq!(parse_listening_port("listening on 127.0.0.1:99999"), None);
    }
}
