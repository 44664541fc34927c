//! The server under attack: one `sluice serve` on a temporary data directory, listening on
//! 127.0.0.1 port 0, started through [`crate::spawn_sluice_with`] with its output kept (and
//! echoed to stderr as `[sluice#N]`). It offers what the run needs of a process: its pid for
//! the monitor, whether it still runs, SIGTERM with a bounded wait, a restart on the same
//! directory, and the panic lines of its log.
//!
//! The temporary directory (data in `data/`, the log written to `server.log` on
//! [`Sluice::keep`]) is removed on drop unless kept; dropping also SIGKILLs the process.

use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use tempfile::TempDir;

use crate::{spawn_sluice_with, Launch};

/// How long a start may take to print `listening on`.
pub const START_TIMEOUT: Duration = Duration::from_secs(60);
/// How long the process may take to exit after SIGTERM.
pub const STOP_TIMEOUT: Duration = Duration::from_secs(30);

pub struct Sluice {
    child: Option<Child>,
    port: u16,
    args: Vec<String>,
    log: Arc<Mutex<Vec<String>>>,
    root: PathBuf,
    /// Removed on drop unless [`Sluice::keep`] took it.
    dir: Option<TempDir>,
    generation: u32,
}

impl Sluice {
    /// Starts the server with `args` after `serve`'s own (used again by [`Sluice::restart`]).
    pub async fn start(args: &[String]) -> Result<Sluice, String> {
        let dir = tempfile::Builder::new()
            .prefix("sluice-hostile-")
            .tempdir()
            .map_err(|e| format!("temporary directory: {e}"))?;
        std::fs::create_dir_all(dir.path().join("data")).map_err(|e| e.to_string())?;
        let mut sluice = Sluice {
            child: None,
            port: 0,
            args: args.to_vec(),
            log: Arc::default(),
            root: dir.path().to_path_buf(),
            dir: Some(dir),
            generation: 0,
        };
        sluice.spawn().await?;
        Ok(sluice)
    }

    async fn spawn(&mut self) -> Result<(), String> {
        let launch = Launch {
            log: Some(self.log.clone()),
            ..Launch::default()
        };
        let tag = format!("sluice#{}", self.generation);
        let (child, port_rx) = spawn_sluice_with(&self.root.join("data"), &self.args, tag, &launch);
        self.child = Some(child);
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            if let Ok(port) = port_rx.try_recv() {
                self.port = port;
                return Ok(());
            }
            if let Some(status) = self.exited() {
                return Err(format!("sluice exited before listening ({status})"));
            }
            if Instant::now() > deadline {
                self.kill();
                return Err(format!("sluice did not listen within {START_TIMEOUT:?}"));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// The running process's id.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// `Some(status)` once the process has exited (it is reaped then).
    pub fn exited(&mut self) -> Option<ExitStatus> {
        let status = self.child.as_mut()?.try_wait().ok().flatten()?;
        self.child = None;
        Some(status)
    }

    fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// SIGTERM, then waits for the exit; SIGKILL and `Err` after [`STOP_TIMEOUT`].
    pub async fn terminate(&mut self) -> Result<ExitStatus, String> {
        let pid = self.pid().ok_or("sluice is not running")?;
        let _ = Command::new("kill")
            .args(["-TERM", &pid.to_string()])
            .status();
        let deadline = Instant::now() + STOP_TIMEOUT;
        loop {
            if let Some(status) = self.exited() {
                return Ok(status);
            }
            if Instant::now() > deadline {
                self.kill();
                return Err(format!(
                    "sluice (pid {pid}) did not exit within {STOP_TIMEOUT:?} of SIGTERM"
                ));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Starts the server again on the same data directory (a new port).
    pub async fn restart(&mut self) -> Result<(), String> {
        if self.child.is_some() {
            self.terminate().await?;
        }
        self.generation += 1;
        self.spawn().await
    }

    /// Lines of the log that report a panic, a stack overflow or an abort.
    pub fn panic_lines(&self) -> Vec<String> {
        let log = self.log.lock().unwrap_or_else(PoisonError::into_inner);
        log.iter()
            .filter(|l| is_panic_line(l))
            .map(|l| crate::hostile::tally::short(l, 400))
            .collect()
    }

    /// Stops the process and keeps the directory (data and `server.log`); returns its path.
    pub fn keep(mut self) -> PathBuf {
        self.kill();
        let mut text = self
            .log
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .join("\n");
        text.push('\n');
        let _ = std::fs::write(self.root.join("server.log"), text);
        if let Some(dir) = self.dir.take() {
            let _ = dir.keep();
        }
        self.root.clone()
    }
}

impl Drop for Sluice {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Whether a log line reports a panic (the server's hook: `panic at`; the default hook:
/// `panicked at`), a stack overflow or an abort.
pub fn is_panic_line(line: &str) -> bool {
    [
        "panic at ",
        "panicked at",
        "has overflowed its stack",
        "fatal runtime error",
    ]
    .iter()
    .any(|m| line.contains(m))
}

#[cfg(test)]
mod tests {
    use super::is_panic_line;

    #[test]
    fn recognizes_panic_lines_of_both_hooks() {
        assert!(is_panic_line(
            "ERROR sluice: panic at src/x.rs:1:2: boom (logged once per location)"
        ));
        assert!(is_panic_line("thread 'main' panicked at src/x.rs:1:2:"));
        assert!(is_panic_line(
            "thread 'sluice-conn' has overflowed its stack"
        ));
        assert!(!is_panic_line("INFO sluice: sluice ready"));
    }
}
