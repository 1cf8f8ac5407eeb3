//! A connection's receive buffer, counting what it copies.

use crate::copies;
use std::pin::Pin;
use std::task::{Context, Poll};
use tokio::io::{AsyncRead, BufReader, ReadBuf};

/// A buffered reader of a socket (one receive call brings in many small frames) that counts
/// the frame bytes it hands out and how many of them it copied out of its buffer
/// ([`copies::tally`]). tokio's `BufReader` copies every read out of its buffer except one
/// that finds the buffer empty and asks for at least its capacity: that one is read straight
/// into the caller's buffer (a large data part).
pub struct RecvBuf<R> {
    inner: BufReader<R>,
    capacity: usize,
    /// This reader's own share of the counters: (bytes handed out, bytes copied).
    counted: (u64, u64),
}

impl<R: AsyncRead> RecvBuf<R> {
    /// A reader of `r` with a buffer of `capacity` bytes.
    pub fn with_capacity(capacity: usize, r: R) -> RecvBuf<R> {
        RecvBuf {
            inner: BufReader::with_capacity(capacity, r),
            capacity,
            counted: (0, 0),
        }
    }

    /// Bytes received and not yet read.
    pub fn buffer(&self) -> &[u8] {
        self.inner.buffer()
    }

    pub fn get_ref(&self) -> &R {
        self.inner.get_ref()
    }

    /// The socket back; what was buffered is dropped (call it with an empty buffer).
    pub fn into_inner(self) -> R {
        self.inner.into_inner()
    }

    /// Bytes this reader handed out, and of those the bytes it copied out of its buffer.
    pub fn counted(&self) -> (u64, u64) {
        self.counted
    }
}

impl<R: AsyncRead + Unpin> AsyncRead for RecvBuf<R> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        let bypass = this.inner.buffer().is_empty() && buf.remaining() >= this.capacity;
        let before = buf.filled().len();
        let r = Pin::new(&mut this.inner).poll_read(cx, buf);
        if let Poll::Ready(Ok(())) = &r {
            let n = buf.filled().len() - before;
            let copied = if bypass { 0 } else { n };
            this.counted.0 += n as u64;
            this.counted.1 += copied as u64;
            copies::received(n, copied);
        }
        r
    }
}
