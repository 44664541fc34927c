//! Reading frontend messages: each one's length is checked before any of it is buffered, and
//! its structure before pgwire decodes it.
//!
//! pgwire's codec buffers a message as it arrives up to 1 GiB whatever the server's limits,
//! decodes strings lossily (invalid UTF-8 becomes U+FFFD, a NUL inside a query cuts it short
//! silently) and reads some fields of Bind with unchecked accessors that panic on a truncated
//! message. [`Reader::next`] reads the socket itself into the codec's buffer: a message header
//! announcing more than [`Reader::max_message`] ends the connection with `54000` before its
//! body is read; a Query, Parse, Bind, Execute, Describe or Close whose fields do not add up
//! to its length, or whose text is not UTF-8 or holds a NUL, ends it with `08P01`/`22021`, as
//! PostgreSQL does; anything pgwire still panics on is caught and ends the connection the same
//! way.
//!
//! Invariants: the buffer never holds more than one message of at most `max_message` bytes
//! plus one read chunk; [`Reader::next`] is cancel-safe (bytes are moved into the buffer only
//! after a read completes), so it can sit in a `select!`.

use std::panic::AssertUnwindSafe;

use bytes::Buf;
use pgwire::api::{ClientInfo, PgWireConnectionState};
use pgwire::error::{ErrorInfo, PgWireError};
use pgwire::messages::PgWireFrontendMessage;
use pgwire::tokio::server::PgWireMessageServerCodec;
use sluice_sql::error::sqlstate;
use tokio::io::{AsyncRead, AsyncReadExt};
use tokio_util::codec::{Decoder, Framed};

/// Bytes read from the socket at a time.
const CHUNK: usize = 64 << 10;

/// Largest startup packet, as PostgreSQL's `MAX_STARTUP_PACKET_LENGTH`.
const MAX_STARTUP: usize = 10_000;

/// Why a connection ends while reading: the error to send (FATAL) before closing.
#[derive(Debug)]
pub struct Refused(pub Box<ErrorInfo>);

/// The connection's message reader.
pub struct Reader {
    chunk: Vec<u8>,
    /// Largest message accepted, header included.
    pub max_message: usize,
}

impl Reader {
    pub fn new(max_message: usize) -> Reader {
        Reader {
            chunk: vec![0; CHUNK],
            max_message,
        }
    }

    /// The next message; `Ok(None)` at end of stream.
    pub async fn next<T, S>(
        &mut self,
        socket: &mut Framed<T, PgWireMessageServerCodec<S>>,
    ) -> Result<Option<PgWireFrontendMessage>, Refused>
    where
        T: AsyncRead + Unpin + 'static,
    {
        loop {
            let typed = !matches!(socket.state(), PgWireConnectionState::AwaitingStartup);
            if let Some(len) = framed(socket.read_buffer(), typed, self.max_message)? {
                debug_assert!(len <= socket.read_buffer().len());
                return decode(socket).map(Some);
            }
            let n = match socket.get_mut().read(&mut self.chunk).await {
                Ok(0) | Err(_) => return Ok(None),
                Ok(n) => n,
            };
            socket.read_buffer_mut().extend_from_slice(&self.chunk[..n]);
        }
    }
}

/// The length of the first message in `buf` once it is all there and its structure checked
/// (`typed`: after the startup phase, when every message starts with a type byte); `None`
/// while more bytes are needed; an error as soon as the header announces an impossible or too
/// large length, or the structure is wrong. A message this accepts is safe to hand to pgwire's
/// decoder (`server/tests/fuzz.rs` checks that property).
pub fn framed(buf: &[u8], typed: bool, max: usize) -> Result<Option<usize>, Refused> {
    let Some(len) = complete(buf, typed, max)? else {
        return Ok(None);
    };
    check(&buf[..len], typed)?;
    Ok(Some(len))
}

/// The whole first message's length once it is all buffered; an error as soon as its header
/// announces an impossible or too large length.
fn complete(buf: &[u8], typed: bool, max: usize) -> Result<Option<usize>, Refused> {
    let (head, max) = if typed { (1, max) } else { (0, MAX_STARTUP) };
    if buf.len() < head + 4 {
        return Ok(None);
    }
    let len = u32::from_be_bytes([buf[head], buf[head + 1], buf[head + 2], buf[head + 3]]);
    let total = head + len as usize;
    if len < 4 {
        return Err(protocol(format!("invalid message length {len}")));
    }
    if total > max {
        return Err(Refused(Box::new(ErrorInfo::new(
            "FATAL".into(),
            sqlstate::PROGRAM_LIMIT_EXCEEDED.into(),
            format!(
                "message of {total} bytes exceeds the maximum of {max} bytes \
                 (max_statement_bytes and its headroom)"
            ),
        ))));
    }
    Ok((buf.len() >= total).then_some(total))
}

/// Structure checks of the messages whose fields pgwire trusts. `msg` is one whole message.
fn check(msg: &[u8], typed: bool) -> Result<(), Refused> {
    if !typed {
        return check_startup(msg);
    }
    let mut body = Fields(&msg[5..]);
    match msg[0] {
        b'Q' => {
            body.text("query")?;
        }
        b'P' => {
            body.text("statement name")?;
            body.text("query")?;
            let n = body.count()?;
            body.skip(4 * n)?;
        }
        b'B' => {
            body.text("portal name")?;
            body.text("statement name")?;
            let formats = body.count()?;
            body.skip(2 * formats)?;
            for _ in 0..body.count()? {
                let len = body.i32()?;
                if len < -1 {
                    return Err(protocol(format!("invalid parameter length {len}")));
                }
                body.skip(len.max(0) as usize)?;
            }
            let results = body.count()?;
            body.skip(2 * results)?;
        }
        b'E' => {
            body.text("portal name")?;
            body.i32()?;
        }
        b'D' | b'C' => {
            body.skip(1)?;
            body.text("name")?;
        }
        b'f' => {
            body.text("error message")?;
        }
        // Sync, Flush, Terminate, CopyDone: no body (pgwire would leave one in the buffer,
        // to be read as the start of the next message).
        b'S' | b'H' | b'X' | b'c' => {}
        _ => return Ok(()),
    }
    if body.0.is_empty() {
        Ok(())
    } else {
        Err(protocol(
            "invalid message format: bytes after the last field",
        ))
    }
}

/// Request codes of the packets that share the startup packet's layout.
const CANCEL_REQUEST: i32 = 80877102;
const SSL_REQUEST: i32 = 80877103;
const GSS_REQUEST: i32 = 80877104;

/// A startup packet is a version and `name\0value\0` pairs ending with one more NUL, which
/// must be its last byte (pgwire stops at the terminator and would leave the rest in the
/// buffer, to be read as the next message); a cancel request is exactly a process id and a
/// secret key; an SSL or GSS request is the code alone.
fn check_startup(msg: &[u8]) -> Result<(), Refused> {
    let mut body = Fields(&msg[4..]);
    let exact = |len: usize| {
        if msg.len() == len {
            Ok(())
        } else {
            Err(protocol(format!(
                "invalid length of startup packet: {}",
                msg.len()
            )))
        }
    };
    match body.i32()? {
        CANCEL_REQUEST => exact(16),
        SSL_REQUEST | GSS_REQUEST => exact(8),
        _ => loop {
            match body.0 {
                [0] => return Ok(()),
                // An empty name is the terminator, so it must be the last byte.
                [] | [0, ..] => {
                    return Err(protocol(
                        "invalid startup packet layout: expected terminator as last byte",
                    ))
                }
                _ => {
                    body.text("startup parameter name")?;
                    body.text("startup parameter value")?;
                }
            }
        },
    }
}

/// A message body read field by field, every read bounds-checked.
struct Fields<'a>(&'a [u8]);

impl Fields<'_> {
    fn skip(&mut self, n: usize) -> Result<(), Refused> {
        if self.0.len() < n {
            return Err(protocol(
                "invalid message format: a field runs past the message",
            ));
        }
        self.0.advance(n);
        Ok(())
    }

    fn i32(&mut self) -> Result<i32, Refused> {
        if self.0.len() < 4 {
            return Err(protocol(
                "invalid message format: a field runs past the message",
            ));
        }
        Ok(self.0.get_i32())
    }

    /// A non-negative Int16 count.
    fn count(&mut self) -> Result<usize, Refused> {
        if self.0.len() < 2 {
            return Err(protocol(
                "invalid message format: a field runs past the message",
            ));
        }
        let n = self.0.get_i16();
        usize::try_from(n).map_err(|_| protocol(format!("invalid count {n}")))
    }

    /// A NUL-terminated UTF-8 string.
    fn text(&mut self, what: &str) -> Result<(), Refused> {
        let Some(end) = self.0.iter().position(|b| *b == 0) else {
            return Err(protocol(format!(
                "invalid message format: the {what} is not NUL-terminated"
            )));
        };
        if let Err(e) = std::str::from_utf8(&self.0[..end]) {
            let at = e.valid_up_to();
            return Err(Refused(Box::new(ErrorInfo::new(
                "FATAL".into(),
                sqlstate::CHARACTER_NOT_IN_REPERTOIRE.into(),
                format!(
                    "invalid byte sequence for encoding \"UTF8\": 0x{:02x} (in the {what})",
                    self.0[at]
                ),
            ))));
        }
        self.0.advance(end + 1);
        Ok(())
    }
}

fn protocol(message: impl Into<String>) -> Refused {
    Refused(Box::new(ErrorInfo::new(
        "FATAL".into(),
        sqlstate::PROTOCOL_VIOLATION.into(),
        message.into(),
    )))
}

/// pgwire's decode of the complete message at the front of the buffer; a panic inside it is
/// a refused message, not a dead task.
fn decode<T, S>(
    socket: &mut Framed<T, PgWireMessageServerCodec<S>>,
) -> Result<PgWireFrontendMessage, Refused> {
    let mut buf = std::mem::take(socket.read_buffer_mut());
    let result = std::panic::catch_unwind(AssertUnwindSafe(|| socket.codec_mut().decode(&mut buf)));
    *socket.read_buffer_mut() = buf;
    match result {
        Ok(Ok(Some(msg))) => Ok(msg),
        Ok(Ok(None)) => Err(protocol("invalid message format: incomplete message")),
        Ok(Err(e)) => Err(refused(e)),
        Err(_) => Err(protocol(
            "invalid message format: the message could not be decoded",
        )),
    }
}

fn refused(e: PgWireError) -> Refused {
    match e {
        PgWireError::UserError(info) => Refused(info),
        e => protocol(format!("invalid message: {e}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn msg(kind: u8, body: &[u8]) -> Vec<u8> {
        let mut m = vec![kind];
        m.extend_from_slice(&(body.len() as u32 + 4).to_be_bytes());
        m.extend_from_slice(body);
        m
    }

    fn code(r: Result<(), Refused>) -> String {
        r.unwrap_err().0.code
    }

    #[test]
    fn a_length_beyond_the_limit_is_refused_from_the_header_alone() {
        let header = [b'Q', 0x40, 0, 0, 0];
        let err = complete(&header, true, 1 << 20).unwrap_err();
        assert_eq!(err.0.code, "54000");
        assert!(
            complete(&[0, 1, 0, 0], false, 1 << 30).is_err(),
            "startup is capped"
        );
        assert!(
            complete(&[b'Q', 0, 0, 0, 3], true, 100).is_err(),
            "length below 4"
        );
        assert_eq!(complete(&msg(b'Q', b"x\0"), true, 100).unwrap(), Some(7));
        assert_eq!(complete(&msg(b'Q', b"x\0")[..6], true, 100).unwrap(), None);
    }

    #[test]
    fn queries_must_be_utf8_without_inner_nul() {
        assert!(check(&msg(b'Q', b"SELECT 1\0"), true).is_ok());
        assert_eq!(code(check(&msg(b'Q', b"SELECT '\xff'\0"), true)), "22021");
        assert_eq!(
            code(check(&msg(b'Q', b"SELECT 1\0; DROP\0"), true)),
            "08P01"
        );
        assert_eq!(code(check(&msg(b'Q', b"SELECT 1"), true)), "08P01");
    }

    /// Found by `server/tests/fuzz.rs`: pgwire decodes these messages without reading the
    /// rest of their declared length, which was then read as the next message.
    #[test]
    fn messages_that_pgwire_reads_short_are_refused_whole() {
        for kind in [b'S', b'H', b'X', b'c'] {
            assert!(check(&msg(kind, b""), true).is_ok());
            assert_eq!(code(check(&msg(kind, b"Q"), true)), "08P01");
        }
        let startup = |body: &[u8]| {
            let mut m = (body.len() as u32 + 8).to_be_bytes().to_vec();
            m.extend_from_slice(&196608i32.to_be_bytes());
            m.extend_from_slice(body);
            m
        };
        assert!(check(&startup(b"user\0alice\0\0"), false).is_ok());
        assert!(check(&startup(b"\0"), false).is_ok());
        for bad in [
            &b"user\0alice\0"[..],
            b"user\0alice",
            b"\0\0user\0a\0\0",
            b"",
        ] {
            assert_eq!(code(check(&startup(bad), false)), "08P01", "{bad:?}");
        }
        let mut cancel = 16u32.to_be_bytes().to_vec();
        cancel.extend_from_slice(&80877102i32.to_be_bytes());
        cancel.extend_from_slice(&[0; 8]);
        assert!(check(&cancel, false).is_ok());
        cancel.push(0);
        cancel[3] = 17;
        assert_eq!(code(check(&cancel, false)), "08P01");
    }

    #[test]
    fn truncated_binds_are_refused_before_pgwire_reads_them() {
        let mut ok = b"\0\0".to_vec();
        ok.extend_from_slice(&[0, 1, 0, 1]); // one format: binary
        ok.extend_from_slice(&[0, 1, 0, 0, 0, 2, 7, 7]); // one parameter of 2 bytes
        ok.extend_from_slice(&[0, 0]); // no result formats
        assert!(check(&msg(b'B', &ok), true).is_ok());
        for cut in 2..ok.len() {
            assert_eq!(
                code(check(&msg(b'B', &ok[..cut]), true)),
                "08P01",
                "cut at {cut}"
            );
        }
        let mut huge = b"\0\0".to_vec();
        huge.extend_from_slice(&[0, 0, 0, 1, 0x7f, 0xff, 0xff, 0xff]);
        assert_eq!(code(check(&msg(b'B', &huge), true)), "08P01");
        let mut negative = b"\0\0".to_vec();
        negative.extend_from_slice(&[0xff, 0xff]);
        assert_eq!(code(check(&msg(b'B', &negative), true)), "08P01");
    }
}
