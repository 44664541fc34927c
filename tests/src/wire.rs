//! The wire protocol with a raw socket, for tests that check bytes and timing drivers hide,
//! or send what no driver would.

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// How long an expected message may take.
pub const ANSWER: Duration = Duration::from_secs(10);

pub fn message(tag: u8, body: &[u8]) -> Vec<u8> {
    let mut m = vec![tag];
    m.extend_from_slice(&((body.len() + 4) as i32).to_be_bytes());
    m.extend_from_slice(body);
    m
}

pub fn cstr(s: &str) -> Vec<u8> {
    let mut v = s.as_bytes().to_vec();
    v.push(0);
    v
}

/// Parse of an unnamed statement.
pub fn parse(sql: &str) -> Vec<u8> {
    let mut body = cstr("");
    body.extend(cstr(sql));
    body.extend_from_slice(&0i16.to_be_bytes());
    message(b'P', &body)
}

/// Bind of the unnamed statement to the unnamed portal, no parameters.
pub fn bind() -> Vec<u8> {
    let mut body = cstr("");
    body.extend(cstr(""));
    body.extend_from_slice(&0i16.to_be_bytes()); // parameter formats
    body.extend_from_slice(&0i16.to_be_bytes()); // parameters
    body.extend_from_slice(&0i16.to_be_bytes()); // result formats
    message(b'B', &body)
}

pub fn execute() -> Vec<u8> {
    let mut body = cstr("");
    body.extend_from_slice(&0i32.to_be_bytes());
    message(b'E', &body)
}

/// Close of the unnamed statement.
pub fn close() -> Vec<u8> {
    let mut body = vec![b'S'];
    body.extend(cstr(""));
    message(b'C', &body)
}

/// The startup packet of a login as user `sluice` to database `sluice`, protocol 3.0.
pub fn startup() -> Vec<u8> {
    let mut body = 196608i32.to_be_bytes().to_vec();
    for kv in ["user", "sluice", "database", "sluice"] {
        body.extend(cstr(kv));
    }
    body.push(0);
    let mut packet = ((body.len() + 4) as i32).to_be_bytes().to_vec();
    packet.extend(body);
    packet
}

/// A raw connection: logged in by [`Wire::connect`], bare by [`Wire::open`].
pub struct Wire {
    pub socket: TcpStream,
    buf: Vec<u8>,
}

impl Wire {
    /// Connects to `port` and completes startup.
    pub async fn connect(port: u16) -> Wire {
        let mut wire = Wire::open(port).await;
        wire.send(&startup()).await;
        while wire.next(ANSWER).await.expect("startup answers").0 != b'Z' {}
        wire
    }

    /// Connects to `port` without sending anything (not logged in).
    pub async fn open(port: u16) -> Wire {
        let socket = TcpStream::connect(("127.0.0.1", port))
            .await
            .expect("connect");
        socket.set_nodelay(true).expect("nodelay");
        Wire {
            socket,
            buf: Vec::new(),
        }
    }

    pub async fn send(&mut self, bytes: &[u8]) {
        self.socket.write_all(bytes).await.expect("send");
    }

    /// The next whole message, or None if none arrives within `wait`; panics if the server
    /// closes the connection.
    pub async fn next(&mut self, wait: Duration) -> Option<(u8, Vec<u8>)> {
        match self.read_message(wait).await {
            Read::Message(tag, body) => Some((tag, body)),
            Read::Quiet => None,
            Read::Closed => panic!("the server closed the connection"),
        }
    }

    /// The next whole message, quiet for `wait`, or the connection closed.
    pub async fn read_message(&mut self, wait: Duration) -> Read {
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            if self.buf.len() >= 5 {
                let len = i32::from_be_bytes([self.buf[1], self.buf[2], self.buf[3], self.buf[4]])
                    as usize;
                if self.buf.len() > len {
                    let m: Vec<u8> = self.buf.drain(..1 + len).collect();
                    return Read::Message(m[0], m[5..].to_vec());
                }
            }
            let mut chunk = [0u8; 8192];
            let read = tokio::time::timeout_at(deadline, self.socket.read(&mut chunk)).await;
            match read {
                Err(_) => return Read::Quiet,
                Ok(Ok(0)) | Ok(Err(_)) => return Read::Closed,
                Ok(Ok(n)) => self.buf.extend_from_slice(&chunk[..n]),
            }
        }
    }

    /// Tags of the messages up to and including ReadyForQuery.
    pub async fn until_ready(&mut self) -> Vec<u8> {
        let mut tags = Vec::new();
        loop {
            let (tag, _) = self
                .next(ANSWER)
                .await
                .expect("an answer before ReadyForQuery");
            tags.push(tag);
            if tag == b'Z' {
                return tags;
            }
        }
    }
}

/// What [`Wire::read_message`] saw.
#[derive(Debug, PartialEq, Eq)]
pub enum Read {
    Message(u8, Vec<u8>),
    Quiet,
    Closed,
}

/// The SQLSTATE of an ErrorResponse body.
pub fn error_code(body: &[u8]) -> String {
    let mut fields = body.split(|b| *b == 0);
    fields
        .find(|f| f.first() == Some(&b'C'))
        .map(|f| String::from_utf8_lossy(&f[1..]).into_owned())
        .unwrap_or_default()
}
