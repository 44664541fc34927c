//! The wire protocol byte for byte, with a raw socket: what the server
//! sends, and when. Drivers hide both, so these are checked here.
//!
//! The extended protocol's ParseComplete, BindComplete and CloseComplete
//! wait in the server's buffer until the client sends Sync or Flush, as
//! in PostgreSQL; a server that flushed each one would cost every
//! statement an extra send and an extra client wake-up.

use std::time::Duration;

use sluice_tests::Server;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// How long the test waits to be sure nothing more arrives.
const QUIET: Duration = Duration::from_millis(300);
/// How long an expected message may take.
const ANSWER: Duration = Duration::from_secs(10);

fn message(tag: u8, body: &[u8]) -> Vec<u8> {
    let mut m = vec![tag];
    m.extend_from_slice(&((body.len() + 4) as i32).to_be_bytes());
    m.extend_from_slice(body);
    m
}

fn cstr(s: &str) -> Vec<u8> {
    let mut v = s.as_bytes().to_vec();
    v.push(0);
    v
}

/// Parse of an unnamed statement.
fn parse(sql: &str) -> Vec<u8> {
    let mut body = cstr("");
    body.extend(cstr(sql));
    body.extend_from_slice(&0i16.to_be_bytes());
    message(b'P', &body)
}

/// Bind of the unnamed statement to the unnamed portal, no parameters.
fn bind() -> Vec<u8> {
    let mut body = cstr("");
    body.extend(cstr(""));
    body.extend_from_slice(&0i16.to_be_bytes()); // parameter formats
    body.extend_from_slice(&0i16.to_be_bytes()); // parameters
    body.extend_from_slice(&0i16.to_be_bytes()); // result formats
    message(b'B', &body)
}

fn execute() -> Vec<u8> {
    let mut body = cstr("");
    body.extend_from_slice(&0i32.to_be_bytes());
    message(b'E', &body)
}

/// Close of the unnamed statement.
fn close() -> Vec<u8> {
    let mut body = vec![b'S'];
    body.extend(cstr(""));
    message(b'C', &body)
}

struct Wire {
    socket: TcpStream,
    buf: Vec<u8>,
}

impl Wire {
    async fn connect(server: &Server) -> Wire {
        let socket = TcpStream::connect(("127.0.0.1", server.port()))
            .await
            .expect("connect");
        socket.set_nodelay(true).expect("nodelay");
        let mut wire = Wire {
            socket,
            buf: Vec::new(),
        };
        let mut body = 196608i32.to_be_bytes().to_vec();
        for kv in ["user", "sluice", "database", "sluice"] {
            body.extend(cstr(kv));
        }
        body.push(0);
        let mut startup = ((body.len() + 4) as i32).to_be_bytes().to_vec();
        startup.extend(body);
        wire.send(&startup).await;
        while wire.next(ANSWER).await.expect("startup answers").0 != b'Z' {}
        wire
    }

    async fn send(&mut self, bytes: &[u8]) {
        self.socket.write_all(bytes).await.expect("send");
    }

    /// The next whole message, or None if none arrives within `wait`.
    async fn next(&mut self, wait: Duration) -> Option<(u8, Vec<u8>)> {
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            if self.buf.len() >= 5 {
                let len = i32::from_be_bytes([self.buf[1], self.buf[2], self.buf[3], self.buf[4]])
                    as usize;
                if self.buf.len() > len {
                    let m: Vec<u8> = self.buf.drain(..1 + len).collect();
                    return Some((m[0], m[5..].to_vec()));
                }
            }
            let mut chunk = [0u8; 8192];
            let read = tokio::time::timeout_at(deadline, self.socket.read(&mut chunk)).await;
            match read {
                Err(_) => return None,
                Ok(Ok(0)) => panic!("the server closed the connection"),
                Ok(Ok(n)) => self.buf.extend_from_slice(&chunk[..n]),
                Ok(Err(e)) => panic!("read: {e}"),
            }
        }
    }

    /// Tags of the messages up to and including ReadyForQuery.
    async fn until_ready(&mut self) -> Vec<u8> {
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

#[tokio::test]
async fn extended_protocol_answers_wait_for_sync_or_flush() {
    let server = Server::start().await;
    let mut wire = Wire::connect(&server).await;

    // Parse and Bind alone: nothing is sent yet
    let mut batch = parse("SELECT 1");
    batch.extend(bind());
    wire.send(&batch).await;
    assert_eq!(
        wire.next(QUIET).await,
        None,
        "answered before Sync or Flush"
    );

    // Flush sends what was held, in order
    wire.send(&message(b'H', &[])).await;
    assert_eq!(wire.next(ANSWER).await.map(|m| m.0), Some(b'1'));
    assert_eq!(wire.next(ANSWER).await.map(|m| m.0), Some(b'2'));

    // Execute, Close, Sync: the row, the tag, CloseComplete, ReadyForQuery
    let mut batch = execute();
    batch.extend(close());
    batch.extend(message(b'S', &[]));
    wire.send(&batch).await;
    assert_eq!(wire.until_ready().await, b"DC3Z".to_vec());

    // a pipeline of two statements and one Sync answers both in order
    let mut batch = Vec::new();
    for sql in ["SELECT 1", "SELECT 2"] {
        batch.extend(parse(sql));
        batch.extend(bind());
        batch.extend(execute());
    }
    batch.extend(message(b'S', &[]));
    wire.send(&batch).await;
    assert_eq!(wire.until_ready().await, b"12DC12DCZ".to_vec());

    // an error reaches the client at Sync, after the answers held before it
    let mut batch = parse("SELECT 1");
    batch.extend(bind());
    batch.extend(parse("SELEC 1"));
    batch.extend(bind()); // skipped: the pipeline failed
    batch.extend(message(b'S', &[]));
    wire.send(&batch).await;
    assert_eq!(wire.until_ready().await, b"12EZ".to_vec());
}
