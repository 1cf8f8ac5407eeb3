//! Frames over tokio streams: one frame per call, header checked before the body is read.

use crate::{
    body_crc, Decoder, Frame, FrameError, FrameHeader, Limits, HEADER_LEN, PROTOCOL_VERSION,
};
use std::future::Future;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// Read buffer size for connections: large enough that one receive call brings in many
/// small frames (fewer system calls at high queue depth); large data parts bypass it.
pub const READ_BUFFER: usize = 128 << 10;

/// Whether `buf` (bytes received and not yet consumed) starts with a whole frame, so reading
/// it will not wait. A loop uses this to know that more requests are ready before it sends
/// replies or syncs (batching).
pub fn frame_buffered(buf: &[u8]) -> bool {
    let Some(h) = buf.first_chunk::<HEADER_LEN>() else {
        return false;
    };
    let c = u32::from_le_bytes([h[16], h[17], h[18], h[19]]) as u64;
    let d = u32::from_le_bytes([h[20], h[21], h[22], h[23]]) as u64;
    buf.len() as u64 >= HEADER_LEN as u64 + c + d
}

/// Why a frame could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error("connection closed")]
    Closed,
    #[error("reading a frame: {0}")]
    Io(#[from] std::io::Error),
    #[error(transparent)]
    Frame(#[from] FrameError),
}

/// Reads one frame. `Closed` when the peer closed cleanly between frames.
pub async fn read_frame<R: AsyncRead + Unpin>(
    r: &mut R,
    limits: &Limits,
) -> Result<Frame, ReadError> {
    let mut h = [0u8; HEADER_LEN];
    match r.read_exact(&mut h).await {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Err(ReadError::Closed),
        Err(e) => return Err(e.into()),
    }
    let hdr = FrameHeader::decode(&h, limits)?;
    let control = read_exactly(r, hdr.control_len).await?;
    let data = read_exactly(r, hdr.data_len).await?;
    Ok(hdr.frame(control, data)?)
}

/// Reads exactly `len` bytes into a new buffer, without zero-filling it first (the length
/// was checked against the limits before).
async fn read_exactly<R: AsyncRead + Unpin>(r: &mut R, len: u32) -> std::io::Result<Vec<u8>> {
    let len = len as usize;
    let mut buf = Vec::with_capacity(len);
    while buf.len() < len {
        // `read_buf` fills the spare capacity; limited so it never reads past this part.
        let mut part = (&mut *r).take((len - buf.len()) as u64);
        if part.read_buf(&mut buf).await? == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
    }
    Ok(buf)
}

/// Checks that [`read_frame`] (what connections run) and [`Decoder`] (sans I/O) read `bytes`
/// alike: the same frames, then the same error, or the end of the bytes for both (a cut frame
/// is `Closed`/an I/O error to one, "more bytes needed" to the other). The fuzz target
/// `proto_frame` and a property test run it, so the fuzzed reader is the one that runs.
/// Panics on a difference.
pub fn check_readers_agree(bytes: &[u8], limits: &Limits) {
    let mut dec = Decoder::new(*limits);
    dec.push(bytes);
    let mut r = bytes;
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    loop {
        let mut read = std::pin::pin!(read_frame(&mut r, limits));
        // A byte slice never makes a read wait, so one poll completes it.
        let std::task::Poll::Ready(got) = read.as_mut().poll(&mut cx) else {
            panic!("read_frame over a byte slice did not complete");
        };
        match (got, dec.next_frame()) {
            (Ok(a), Ok(Some(b))) => assert_eq!(a, b, "the readers disagree on a frame"),
            (Err(ReadError::Frame(a)), Err(b)) => {
                assert_eq!(a, b, "the readers fail differently");
                return;
            }
            (Err(ReadError::Closed | ReadError::Io(_)), Ok(None)) => return,
            (a, b) => panic!("the readers disagree: read_frame {a:?}, Decoder {b:?}"),
        }
    }
}

/// The sealed header of a frame made of these parts.
fn frame_header(msg_type: u16, request_id: u64, control: &[u8], data: &[u8]) -> [u8; HEADER_LEN] {
    FrameHeader {
        version: PROTOCOL_VERSION,
        flags: 0,
        msg_type,
        request_id,
        control_len: control.len() as u32,
        data_len: data.len() as u32,
        body_crc: body_crc(control, data),
    }
    .encode()
}

/// Appends a frame made of its parts to `out` (for writers that batch several frames into
/// one write).
pub fn encode_parts(
    out: &mut Vec<u8>,
    msg_type: u16,
    request_id: u64,
    control: &[u8],
    data: &[u8],
) {
    out.extend_from_slice(&frame_header(msg_type, request_id, control, data));
    out.extend_from_slice(control);
    out.extend_from_slice(data);
}

/// Writes one frame made of its parts (one write call for small frames).
pub async fn write_frame<W: AsyncWrite + Unpin>(
    w: &mut W,
    msg_type: u16,
    request_id: u64,
    control: &[u8],
    data: &[u8],
) -> std::io::Result<()> {
    let mut buf = Vec::with_capacity(HEADER_LEN + control.len() + data.len());
    encode_parts(&mut buf, msg_type, request_id, control, data);
    w.write_all(&buf).await
}

/// Sends frames on a connection from any thread, without a hop through a writer task when
/// the socket can take the bytes at once (the common case on an idle connection): the
/// caller writes directly with a non-blocking write; what does not fit is queued and written
/// by a task when the socket becomes writable. Frames are never interleaved.
#[derive(Clone)]
pub struct FrameSender {
    inner: std::sync::Arc<SenderInner>,
}

struct SenderInner {
    stream: tokio::net::tcp::OwnedWriteHalf,
    state: std::sync::Mutex<SendState>,
    wake: std::sync::Arc<tokio::sync::Notify>,
}

impl Drop for SenderInner {
    fn drop(&mut self) {
        // Lets the drain task see that the connection is gone.
        self.wake.notify_one();
    }
}

#[derive(Default)]
struct SendState {
    /// Bytes accepted but not yet written, in order.
    queue: Vec<u8>,
    closed: bool,
}

/// The connection is closed (or failed); nothing more can be sent on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("connection closed")]
pub struct SendClosed;

impl FrameSender {
    /// Wraps the write half of a connection; spawns the task that drains the queue (needs a
    /// tokio runtime context).
    pub fn new(stream: tokio::net::tcp::OwnedWriteHalf) -> FrameSender {
        let inner = std::sync::Arc::new(SenderInner {
            stream,
            state: std::sync::Mutex::new(SendState::default()),
            wake: std::sync::Arc::new(tokio::sync::Notify::new()),
        });
        let weak = std::sync::Arc::downgrade(&inner);
        tokio::spawn(drain_queue(weak, inner.wake.clone()));
        FrameSender { inner }
    }

    /// Sends one frame made of its parts.
    pub fn send(
        &self,
        msg_type: u16,
        request_id: u64,
        control: &[u8],
        data: &[u8],
    ) -> Result<(), SendClosed> {
        let hdr = frame_header(msg_type, request_id, control, data);
        let parts = [&hdr[..], control, data];
        let mut st = self.inner.state.lock().unwrap_or_else(|p| p.into_inner());
        if st.closed {
            return Err(SendClosed);
        }
        if !st.queue.is_empty() || defer(self) {
            queue_rest(&mut st.queue, &parts, 0);
            return Ok(());
        }
        let total = HEADER_LEN + control.len() + data.len();
        let written = match self.write_now(&parts) {
            Ok(n) => n,
            Err(()) => {
                st.closed = true;
                return Err(SendClosed);
            }
        };
        if written < total {
            queue_rest(&mut st.queue, &parts, written);
            self.inner.wake.notify_one();
        }
        Ok(())
    }

    /// Queues a frame for the drain task instead of writing it now. A sender with other
    /// requests in flight uses this: every frame queued before the drain task next runs (on
    /// the same event loop, after the tasks that are ready) goes out in one system call.
    pub fn send_deferred(
        &self,
        msg_type: u16,
        request_id: u64,
        control: &[u8],
        data: &[u8],
    ) -> Result<(), SendClosed> {
        let hdr = frame_header(msg_type, request_id, control, data);
        let mut st = self.inner.state.lock().unwrap_or_else(|p| p.into_inner());
        if st.closed {
            return Err(SendClosed);
        }
        let was_empty = st.queue.is_empty();
        queue_rest(&mut st.queue, &[&hdr[..], control, data], 0);
        if was_empty {
            self.inner.wake.notify_one();
        }
        Ok(())
    }

    /// Writes what is queued, as far as the socket takes it now; the drain task writes the
    /// rest.
    fn flush(&self) {
        let mut st = self.inner.state.lock().unwrap_or_else(|p| p.into_inner());
        while !st.closed && !st.queue.is_empty() {
            match self.inner.stream.try_write(&st.queue) {
                Ok(0) => st.closed = true,
                Ok(n) => {
                    st.queue.drain(..n);
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                Err(_) => st.closed = true,
            }
        }
        if !st.queue.is_empty() || st.closed {
            self.inner.wake.notify_one();
        }
    }

    /// Writes as much as the socket takes now; Err on a failed connection.
    fn write_now(&self, parts: &[&[u8]; 3]) -> Result<usize, ()> {
        let total: usize = parts.iter().map(|p| p.len()).sum();
        let mut done = 0;
        while done < total {
            let slices = remaining_slices(parts, done);
            match self.inner.stream.try_write_vectored(&slices) {
                Ok(0) => return Err(()),
                Ok(n) => done += n,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(_) => return Err(()),
            }
        }
        Ok(done)
    }

    /// Whether the connection has failed or was closed.
    pub fn is_closed(&self) -> bool {
        self.inner
            .state
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .closed
    }

    /// Marks the sender closed: later sends fail at once.
    pub fn close(&self) {
        self.inner
            .state
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .closed = true;
        self.inner.wake.notify_one();
    }
}

thread_local! {
    /// Senders with frames held back by the current batch on this thread (None: no batch).
    static BATCH: std::cell::RefCell<Option<Vec<FrameSender>>> = const { std::cell::RefCell::new(None) };
}

/// Starts (or continues) a batch on this thread: frames sent until [`end_batch`] are queued
/// and written together, one system call per connection instead of one per frame. Used by a
/// loop that has more received frames waiting to be handled.
pub fn begin_batch() {
    BATCH.with(|b| {
        let mut b = b.borrow_mut();
        if b.is_none() {
            *b = Some(Vec::new());
        }
    });
}

/// Ends the batch on this thread and writes what it held back.
pub fn end_batch() {
    let held = BATCH.with(|b| b.borrow_mut().take());
    for s in held.into_iter().flatten() {
        s.flush();
    }
}

/// Registers `s` with the current batch; false when there is none.
fn defer(s: &FrameSender) -> bool {
    BATCH.with(|b| match b.borrow_mut().as_mut() {
        Some(list) => {
            if !list
                .iter()
                .any(|x| std::sync::Arc::ptr_eq(&x.inner, &s.inner))
            {
                list.push(s.clone());
            }
            true
        }
        None => false,
    })
}

fn remaining_slices<'a>(parts: &[&'a [u8]; 3], mut skip: usize) -> Vec<std::io::IoSlice<'a>> {
    let mut out = Vec::with_capacity(3);
    for p in parts {
        if skip >= p.len() {
            skip -= p.len();
            continue;
        }
        out.push(std::io::IoSlice::new(&p[skip..]));
        skip = 0;
    }
    out
}

fn queue_rest(queue: &mut Vec<u8>, parts: &[&[u8]; 3], mut skip: usize) {
    for p in parts {
        if skip >= p.len() {
            skip -= p.len();
            continue;
        }
        queue.extend_from_slice(&p[skip..]);
        skip = 0;
    }
}

/// Writes queued bytes whenever there are some; ends when the sender is dropped or closed.
async fn drain_queue(
    weak: std::sync::Weak<SenderInner>,
    wake: std::sync::Arc<tokio::sync::Notify>,
) {
    loop {
        let Some(inner) = weak.upgrade() else { return };
        let empty = {
            let st = inner.state.lock().unwrap_or_else(|p| p.into_inner());
            if st.closed {
                return;
            }
            st.queue.is_empty()
        };
        if empty {
            // Holding only a weak reference while idle lets the connection drop.
            drop(inner);
            wake.notified().await;
            continue;
        }
        if inner.stream.writable().await.is_err() {
            inner.state.lock().unwrap_or_else(|p| p.into_inner()).closed = true;
            return;
        }
        let mut st = inner.state.lock().unwrap_or_else(|p| p.into_inner());
        match inner.stream.try_write(&st.queue) {
            Ok(0) => st.closed = true,
            Ok(n) => {
                st.queue.drain(..n);
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => st.closed = true,
        }
    }
}

/// Why a connection's handshake failed. Messages carry no "handshake" prefix: callers say
/// where it failed ("{addr}: handshake: {e}").
#[derive(Debug, thiserror::Error)]
pub enum HandshakeError {
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error(transparent)]
    Hello(#[from] crate::HelloError),
    #[error("timed out")]
    Timeout,
}

/// Node kinds in the handshake.
pub mod node_kind {
    pub const CLIENT: u8 = 1;
    pub const OSD: u8 = 2;
    pub const MON: u8 = 3;
}

/// Exchanges handshakes on a new connection (both sides send first, so neither waits for
/// the other) and returns the peer's handshake and the negotiated frame layout version.
pub async fn handshake<S: AsyncRead + AsyncWrite + Unpin>(
    s: &mut S,
    kind: u8,
) -> Result<(crate::Hello, u8), HandshakeError> {
    let fut = async {
        let ours = crate::Hello::ours(kind);
        s.write_all(&ours.encode()?).await?;
        let mut head = [0u8; crate::hello::HELLO_LEN];
        s.read_exact(&mut head).await?;
        // The auth length is checked by decode before the bytes are kept.
        let auth_len = (u16::from_le_bytes([head[8], head[9]]) as usize).min(crate::AUTH_MAX + 1);
        let mut all = head.to_vec();
        if auth_len <= crate::AUTH_MAX {
            all.resize(crate::hello::HELLO_LEN + auth_len, 0);
            s.read_exact(&mut all[crate::hello::HELLO_LEN..]).await?;
        }
        let (theirs, _) = crate::Hello::decode(&all)?;
        let v = crate::negotiate(&ours, &theirs)?;
        Ok::<_, HandshakeError>((theirs, v))
    };
    tokio::time::timeout(std::time::Duration::from_secs(5), fut)
        .await
        .map_err(|_| HandshakeError::Timeout)?
}

/// [`handshake`] on a blocking socket (its read timeout bounds the wait).
pub fn handshake_blocking(
    s: &mut std::net::TcpStream,
    kind: u8,
) -> Result<(crate::Hello, u8), HandshakeError> {
    use std::io::{Read, Write};
    let ours = crate::Hello::ours(kind);
    s.write_all(&ours.encode()?)?;
    let mut head = [0u8; crate::hello::HELLO_LEN];
    s.read_exact(&mut head)?;
    let auth_len = u16::from_le_bytes([head[8], head[9]]) as usize;
    let mut all = head.to_vec();
    if auth_len <= crate::AUTH_MAX {
        all.resize(crate::hello::HELLO_LEN + auth_len, 0);
        s.read_exact(&mut all[crate::hello::HELLO_LEN..])?;
    }
    let (theirs, _) = crate::Hello::decode(&all)?;
    let v = crate::negotiate(&ours, &theirs)?;
    Ok((theirs, v))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const LIMITS: Limits = Limits {
        max_control: 1 << 12,
        max_data: 1 << 16,
    };

    /// Frames encoded back to back.
    fn stream(frames: &[(u16, Vec<u8>, Vec<u8>)]) -> Vec<u8> {
        let mut out = Vec::new();
        for (i, (t, c, d)) in frames.iter().enumerate() {
            encode_parts(&mut out, *t, i as u64, c, d);
        }
        out
    }

    proptest! {
        #[test]
        fn read_frame_and_the_decoder_agree(
            frames in proptest::collection::vec(
                (any::<u16>(), proptest::collection::vec(any::<u8>(), 0..64),
                 proptest::collection::vec(any::<u8>(), 0..300)),
                0..6),
            flip in proptest::option::of((any::<proptest::sample::Index>(), 1u8..=255)),
            cut in any::<proptest::sample::Index>(),
        ) {
            let mut bytes = stream(&frames);
            check_readers_agree(&bytes, &LIMITS);
            if let Some((at, x)) = flip {
                if !bytes.is_empty() {
                    let i = at.index(bytes.len());
                    bytes[i] ^= x;
                }
            }
            check_readers_agree(&bytes, &LIMITS);
            let end = cut.index(bytes.len() + 1);
            check_readers_agree(&bytes[..end], &LIMITS);
        }
    }
}
