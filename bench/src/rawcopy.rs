//! A minimal Postgres client for the history scan: it reads `COPY ... TO
//! STDOUT` the way libpq (and so psql) does — large socket reads, the
//! message frames walked in place — instead of through tokio-postgres,
//! which hands every row across a channel as its own message. On a
//! 2-core machine the client shares the cores with the server, so a heavy
//! client would set the scan's speed for both systems alike.
//!
//! Trust authentication only (the bench starts both servers that way);
//! anything else is a clear error, not a hang.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::str::FromStr;

/// Socket reads of this size, like libpq's growing input buffer.
const READ_BYTES: usize = 1 << 20;
/// A backend message larger than this is a protocol error here.
const MAX_MESSAGE: usize = 1 << 30;

/// What one COPY TO returned: rows (CopyData messages) and their bytes.
pub struct Copied {
    pub rows: u64,
    pub bytes: u64,
}

/// Runs `query` (a `COPY ... TO STDOUT`) on the server `url` names.
pub fn copy_out(url: &str, query: &str) -> Result<Copied, String> {
    let config = tokio_postgres::Config::from_str(url).map_err(|e| format!("{url}: {e}"))?;
    let host = match config.get_hosts().first() {
        Some(tokio_postgres::config::Host::Tcp(h)) => h.clone(),
        _ => return Err(format!("{url}: the scan client needs a TCP host")),
    };
    let port = config.get_ports().first().copied().unwrap_or(5432);
    let user = config.get_user().unwrap_or("postgres");
    let dbname = config.get_dbname().unwrap_or(user);
    let mut socket =
        TcpStream::connect((host.as_str(), port)).map_err(|e| format!("{host}:{port}: {e}"))?;
    socket.set_nodelay(true).map_err(|e| e.to_string())?;

    let mut startup = Vec::new();
    startup.extend_from_slice(&196608i32.to_be_bytes());
    for (k, v) in [("user", user), ("database", dbname)] {
        startup.extend_from_slice(k.as_bytes());
        startup.push(0);
        startup.extend_from_slice(v.as_bytes());
        startup.push(0);
    }
    startup.push(0);
    let mut msg = ((startup.len() + 4) as i32).to_be_bytes().to_vec();
    msg.extend_from_slice(&startup);
    socket.write_all(&msg).map_err(|e| e.to_string())?;

    let mut reader = Frames::new(socket);
    // startup: AuthenticationOk, parameters, BackendKeyData, ReadyForQuery
    loop {
        let (tag, body) = reader.next()?;
        match tag {
            b'R' if body.get(..4) == Some(&[0, 0, 0, 0]) => {}
            b'R' => return Err("the scan client supports trust authentication only".into()),
            b'E' => return Err(format!("startup failed: {}", error_text(body))),
            b'Z' => break,
            _ => {}
        }
    }

    let mut q = vec![b'Q'];
    q.extend_from_slice(&((query.len() + 5) as i32).to_be_bytes());
    q.extend_from_slice(query.as_bytes());
    q.push(0);
    reader.socket.write_all(&q).map_err(|e| e.to_string())?;

    let mut copied = Copied { rows: 0, bytes: 0 };
    let mut failed = None;
    loop {
        let (tag, body) = reader.next()?;
        match tag {
            b'd' => {
                copied.rows += 1;
                copied.bytes += body.len() as u64;
            }
            b'E' => failed = Some(error_text(body)),
            b'Z' => break,
            _ => {}
        }
    }
    let _ = reader.socket.write_all(&[b'X', 0, 0, 0, 4]);
    match failed {
        Some(e) => Err(format!("{query}: {e}")),
        None => Ok(copied),
    }
}

/// Backend messages read from one large buffer.
struct Frames {
    socket: TcpStream,
    buf: Vec<u8>,
    start: usize,
    end: usize,
}

impl Frames {
    fn new(socket: TcpStream) -> Frames {
        Frames {
            socket,
            buf: vec![0; READ_BYTES],
            start: 0,
            end: 0,
        }
    }

    /// The next message: its tag and body (valid until the next call).
    fn next(&mut self) -> Result<(u8, &[u8]), String> {
        loop {
            let have = self.end - self.start;
            if have >= 5 {
                let head = &self.buf[self.start..self.start + 5];
                let len = i32::from_be_bytes([head[1], head[2], head[3], head[4]]);
                let len = usize::try_from(len).map_err(|_| "negative message length")?;
                if !(4..=MAX_MESSAGE).contains(&len) {
                    return Err(format!("bad message length {len}"));
                }
                if have > len {
                    let tag = head[0];
                    let body = self.start + 5..self.start + 1 + len;
                    self.start += 1 + len;
                    return Ok((tag, &self.buf[body]));
                }
                if 1 + len > self.buf.len() {
                    self.buf.resize(1 + len, 0);
                }
            }
            // keep the partial message, then read more behind it
            self.buf.copy_within(self.start..self.end, 0);
            self.end -= self.start;
            self.start = 0;
            let n = self
                .socket
                .read(&mut self.buf[self.end..])
                .map_err(|e| e.to_string())?;
            if n == 0 {
                return Err("the server closed the connection".into());
            }
            self.end += n;
        }
    }
}

/// The message text of an ErrorResponse body.
fn error_text(body: &[u8]) -> String {
    body.split(|b| *b == 0)
        .find(|f| f.first() == Some(&b'M'))
        .map(|f| String::from_utf8_lossy(&f[1..]).into_owned())
        .unwrap_or_else(|| "error".into())
}
