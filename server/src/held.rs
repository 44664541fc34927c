//! A connection's byte stream that can hold what is written instead of sending it: the
//! socket under pgwire's codec, so a pipeline's output after a deferred RETURNING waits,
//! in order, for the pipeline's commit (see [`crate::pipeline`]).
//!
//! Invariants: bytes are held only between [`HeldBytes::mark`] and
//! [`HeldBytes::release`], in the order written, at most `limit` of them (a write beyond
//! fails, and the connection with it); marks are positions in the held bytes.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// A connection's byte stream that can hold what is written instead of
/// sending it.
pub struct Held<T> {
    inner: T,
    state: HeldBytes,
}

/// What [`Held`] holds.
#[derive(Debug, Default)]
pub struct HeldBytes {
    hold: bool,
    held: Vec<u8>,
    /// Where each deferred RETURNING's rows go in `held`.
    marks: Vec<usize>,
    limit: usize,
}

impl<T> Held<T> {
    pub fn new(inner: T, limit: usize) -> Held<T> {
        Held {
            inner,
            state: HeldBytes {
                limit,
                ..HeldBytes::default()
            },
        }
    }

    pub fn get_ref(&self) -> &T {
        &self.inner
    }

    pub fn held(&mut self) -> &mut HeldBytes {
        &mut self.state
    }
}

impl HeldBytes {
    /// Hold from here on, with a mark at the current end.
    pub fn mark(&mut self) {
        self.hold = true;
        self.marks.push(self.held.len());
    }

    /// Stop holding: the held bytes and the marks in them.
    pub fn release(&mut self) -> (Vec<u8>, Vec<usize>) {
        self.hold = false;
        (
            std::mem::take(&mut self.held),
            std::mem::take(&mut self.marks),
        )
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for Held<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Held<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let state = &mut self.state;
        if !state.hold {
            return Pin::new(&mut self.inner).poll_write(cx, buf);
        }
        if state.held.len() + buf.len() > state.limit {
            return Poll::Ready(Err(io::Error::other(format!(
                "a pipeline's results held for its commit exceed {} bytes (max_statement_bytes)",
                state.limit
            ))));
        }
        state.held.extend_from_slice(buf);
        Poll::Ready(Ok(buf.len()))
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if self.state.hold {
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

impl HeldBytes {
    /// How many marks are set (deferred RETURNINGs waiting).
    pub fn marks(&self) -> usize {
        self.marks.len()
    }
}
