//! Sending frames: from any thread, batched, with backpressure, and on connections that are
//! still being opened.

use crate::frames::{frame_header, seal_encoded};
use crate::load::{ConnLoad, RequestTicket};
use crate::queue::{HeldBytes, SendQueue, HOLD_MIN};
use cairn_auth::{Sealer, COPY_ALIGN, FRAME_TAGS_LEN};
use cairn_failstop::LockOrDie;
use cairn_proto::{clear_body_crc, HEADER_LEN};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, Weak};
use tokio::net::tcp::OwnedWriteHalf;
use tokio::sync::Notify;

/// Sends frames on a connection from any thread, without a hop through a writer task when
/// the socket can take the bytes at once (the common case on an idle connection): the
/// caller writes directly with a non-blocking write; what does not fit is queued and written
/// by a task when the socket becomes writable. Frames are never interleaved.
///
/// A sender can be made before its connection is open ([`FrameSender::unconnected`]): frames
/// queue until [`FrameSender::attach`] gives it the socket, so a thread that must not block
/// (an OSD shard) hands the connecting to a task and goes on.
#[derive(Clone)]
pub struct FrameSender {
    inner: Arc<SenderInner>,
    /// The request this handle answers, counted against its connection's load until every
    /// handle holding it is dropped ([`FrameSender::for_request`]).
    _ticket: Option<Arc<RequestTicket>>,
}

struct SenderInner {
    stream: OnceLock<OwnedWriteHalf>,
    /// Whether frames are protected (a sealer was attached): their headers then carry a body
    /// crc of 0, which saves computing it.
    protected: AtomicBool,
    state: Mutex<SendState>,
    /// Wakes the drain task: bytes queued, socket attached, or closed.
    wake: Arc<Notify>,
    /// Wakes [`FrameSender::wait_below`]: bytes written, or closed.
    drained: Notify,
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
    queue: SendQueue,
    closed: bool,
    /// Protects every frame of a protected connection (set when the socket is attached;
    /// frames queued before are sealed then, in order).
    sealer: Option<Sealer>,
}

/// A frame ready for the socket: its parts, borrowed where they need no change.
enum Wire<'a> {
    Plain([&'a [u8]; 3]),
    Signed([&'a [u8]; 3], [u8; FRAME_TAGS_LEN]),
    /// The header, the encrypted body and its tag.
    Sealed(&'a [u8], Arc<SealedBody>, [u8; FRAME_TAGS_LEN]),
}

impl<'a> Wire<'a> {
    /// Its slices in order (unused ones empty): no allocation on the plain path.
    fn parts(&self) -> [&[u8]; 4] {
        match self {
            Wire::Plain(p) => [p[0], p[1], p[2], &[]],
            Wire::Signed(p, tags) => [p[0], p[1], p[2], tags.as_slice()],
            Wire::Sealed(h, body, tag) => [h, body.bytes(), tag.as_slice(), &[]],
        }
    }

    /// Which part is the one to hold rather than copy if the frame is queued, and the handle
    /// to hold it by: the payload given by reference, or an encrypted body (already a copy
    /// of its own).
    fn held(&self, payload: Option<&HeldBytes>) -> (usize, Option<HeldBytes>) {
        match self {
            Wire::Sealed(_, body, _) => (1, Some(body.clone() as HeldBytes)),
            _ => (2, payload.cloned()),
        }
    }
}

/// An encrypted frame body: its buffer and where the body starts in it (see `protect`).
struct SealedBody(Vec<u8>, usize);

impl SealedBody {
    fn bytes(&self) -> &[u8] {
        &self.0[self.1..]
    }
}

impl AsRef<[u8]> for SealedBody {
    fn as_ref(&self) -> &[u8] {
        self.bytes()
    }
}

/// The connection is closed (or failed); nothing more can be sent on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("connection closed")]
pub struct SendClosed;

impl FrameSender {
    /// Wraps the write half of a connection; spawns the task that drains the queue (needs a
    /// tokio runtime context).
    pub fn new(stream: OwnedWriteHalf) -> FrameSender {
        FrameSender::new_guarded(stream, None)
    }

    /// [`FrameSender::new`] for a connection whose frames `sealer` protects.
    pub fn new_guarded(stream: OwnedWriteHalf, sealer: Option<Sealer>) -> FrameSender {
        let s = FrameSender::unconnected();
        // A fresh sender has no socket yet, so attaching cannot fail.
        let _ = s.attach_guarded(stream, sealer);
        s
    }

    /// A sender whose connection is not open yet: frames queue until [`attach`](Self::attach)
    /// (or fail once [`close`](Self::close) is called). Needs a tokio runtime context.
    pub fn unconnected() -> FrameSender {
        let inner = Arc::new(SenderInner {
            stream: OnceLock::new(),
            protected: AtomicBool::new(false),
            state: Mutex::new(SendState::default()),
            wake: Arc::new(Notify::new()),
            drained: Notify::new(),
        });
        tokio::spawn(drain_queue(Arc::downgrade(&inner), inner.wake.clone()));
        FrameSender {
            inner,
            _ticket: None,
        }
    }

    /// A handle to answer one request read from this connection, counted in `load` (with
    /// `bytes`: what it carries and what it asks to read) until this handle and every clone
    /// of it are dropped.
    pub fn for_request(&self, load: &Arc<ConnLoad>, bytes: usize) -> FrameSender {
        FrameSender {
            inner: self.inner.clone(),
            _ticket: Some(load.ticket(bytes)),
        }
    }

    /// Gives an [`unconnected`](Self::unconnected) sender its socket; what was queued is
    /// written first. Gives the socket back if the sender already has one.
    pub fn attach(&self, stream: OwnedWriteHalf) -> Result<(), OwnedWriteHalf> {
        self.attach_guarded(stream, None)
    }

    /// [`FrameSender::attach`] for a protected connection: `sealer` protects what was queued
    /// (in order) and every later frame.
    pub fn attach_guarded(
        &self,
        stream: OwnedWriteHalf,
        sealer: Option<Sealer>,
    ) -> Result<(), OwnedWriteHalf> {
        let mut st = self.state();
        if self.inner.stream.get().is_some() {
            return Err(stream);
        }
        if let Some(mut sealer) = sealer {
            let queued = st.queue.take_all();
            match seal_queue(&queued, &mut sealer) {
                Some(q) => st.queue.copy(&q),
                None => st.closed = true,
            }
            st.sealer = Some(sealer);
            self.inner.protected.store(true, Ordering::Relaxed);
        }
        self.inner.stream.set(stream)?;
        drop(st);
        self.inner.wake.notify_one();
        Ok(())
    }

    fn state(&self) -> MutexGuard<'_, SendState> {
        self.inner.state.lock_or_die()
    }

    /// The send state, unless the connection is closed.
    fn open_state(&self) -> Result<MutexGuard<'_, SendState>, SendClosed> {
        let st = self.state();
        if st.closed {
            return Err(SendClosed);
        }
        Ok(st)
    }

    /// Sends one frame made of its parts. If the frame cannot be written at once (the socket
    /// is full, or a batch holds it back), its data part is copied into the queue:
    /// [`send_held`](Self::send_held) avoids that copy.
    pub fn send(
        &self,
        msg_type: u16,
        request_id: u64,
        control: &[u8],
        data: &[u8],
    ) -> Result<(), SendClosed> {
        self.send_frame(msg_type, request_id, control, data, None, false)
    }

    /// [`send`](Self::send) for a payload the sender may keep a handle on instead of copying
    /// it when the frame waits in the queue (a shared buffer: the handle is cheap to clone).
    pub fn send_held<P: AsRef<[u8]> + Send + Sync + 'static>(
        &self,
        msg_type: u16,
        request_id: u64,
        control: &[u8],
        data: P,
    ) -> Result<(), SendClosed> {
        hold_then(data, |d, held| {
            self.send_frame(msg_type, request_id, control, d, held, false)
        })
    }

    /// Writes a frame now if it can (`deferred`: queues it for the drain task instead); what
    /// is queued holds `held` rather than a copy of the data part.
    fn send_frame(
        &self,
        msg_type: u16,
        request_id: u64,
        control: &[u8],
        data: &[u8],
        held: Option<&HeldBytes>,
        deferred: bool,
    ) -> Result<(), SendClosed> {
        let mut hdr = self.header(msg_type, request_id, control, data);
        let mut st = self.open_state()?;
        let was_empty = st.queue.is_empty();
        let wire = protect(&mut st, &mut hdr, control, data)?;
        let parts = wire.parts();
        let (data_part, held) = wire.held(held);
        if deferred {
            st.queue.rest_of(&parts, 0, data_part, held);
            if was_empty {
                self.inner.wake.notify_one();
            }
            return Ok(());
        }
        let Some(stream) = self.inner.stream.get() else {
            st.queue.rest_of(&parts, 0, data_part, held);
            return Ok(());
        };
        if !st.queue.is_empty() || defer(self) {
            st.queue.rest_of(&parts, 0, data_part, held);
            return Ok(());
        }
        let total: usize = parts.iter().map(|p| p.len()).sum();
        let Ok(written) = write_now(stream, &parts) else {
            st.closed = true;
            drop(st);
            self.inner.drained.notify_waiters();
            return Err(SendClosed);
        };
        if written < total {
            st.queue.rest_of(&parts, written, data_part, held);
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
        self.send_frame(msg_type, request_id, control, data, None, true)
    }

    /// [`send_deferred`](Self::send_deferred) of a payload the queue holds instead of copying
    /// (as [`send_held`](Self::send_held)).
    pub fn send_deferred_held<P: AsRef<[u8]> + Send + Sync + 'static>(
        &self,
        msg_type: u16,
        request_id: u64,
        control: &[u8],
        data: P,
    ) -> Result<(), SendClosed> {
        hold_then(data, |d, held| {
            self.send_frame(msg_type, request_id, control, d, held, true)
        })
    }

    /// The header of a frame of these parts, made before taking the lock (its body crc is the
    /// costly part, and protected frames carry none).
    fn header(&self, msg_type: u16, id: u64, control: &[u8], data: &[u8]) -> [u8; HEADER_LEN] {
        let protected = self.inner.protected.load(Ordering::Relaxed);
        frame_header(msg_type, id, control, data, protected)
    }

    /// Bytes accepted and not yet written to the socket.
    pub fn queued_bytes(&self) -> usize {
        self.state().queue.len()
    }

    /// Waits until at most `limit` bytes are queued (or the connection is closed). A server
    /// calls this before reading its next request, so a peer that sends requests and never
    /// reads the replies stops being read instead of growing the queue without bound.
    pub async fn wait_below(&self, limit: usize) {
        loop {
            let drained = self.inner.drained.notified();
            tokio::pin!(drained);
            // Registered before the check, so a wake between the check and the wait counts.
            drained.as_mut().enable();
            {
                let st = self.state();
                if st.closed || st.queue.len() <= limit {
                    return;
                }
            }
            drained.await;
        }
    }

    /// Writes what is queued, as far as the socket takes it now; the drain task writes the
    /// rest.
    fn flush(&self) {
        let Some(stream) = self.inner.stream.get() else {
            return;
        };
        let mut st = self.state();
        while !st.closed && !st.queue.is_empty() {
            match stream.try_write_vectored(&st.queue.slices()) {
                Ok(0) => st.closed = true,
                Ok(n) => st.queue.consume(n),
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                Err(_) => st.closed = true,
            }
        }
        if !st.queue.is_empty() || st.closed {
            self.inner.wake.notify_one();
        }
        drop(st);
        self.inner.drained.notify_waiters();
    }

    /// Whether the sender has its socket (an [`unconnected`](Self::unconnected) one has not
    /// until [`attach`](Self::attach)).
    pub fn is_attached(&self) -> bool {
        self.inner.stream.get().is_some()
    }

    /// Whether both are the same sender (clones of one).
    pub fn ptr_eq(&self, other: &FrameSender) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }

    /// Whether the connection has failed or was closed.
    pub fn is_closed(&self) -> bool {
        self.state().closed
    }

    /// Marks the sender closed: later sends fail at once, queued bytes are dropped.
    pub fn close(&self) {
        self.state().closed = true;
        self.inner.wake.notify_one();
        self.inner.drained.notify_waiters();
    }
}

/// Calls `send` with the payload's bytes and a handle the queue may hold them by (none for a
/// payload too small to be worth holding).
fn hold_then<P: AsRef<[u8]> + Send + Sync + 'static>(
    data: P,
    send: impl FnOnce(&[u8], Option<&HeldBytes>) -> Result<(), SendClosed>,
) -> Result<(), SendClosed> {
    if data.as_ref().len() < HOLD_MIN {
        return send(data.as_ref(), None);
    }
    let held: HeldBytes = Arc::new(data);
    send((*held).as_ref(), Some(&held))
}

/// The frame `hdr` + `control` + `data` as it goes on the wire: as is, with its tag
/// (signed), or its body encrypted in a buffer of its own (secure). A sealer that can seal
/// no more (2^64 frames) closes the connection.
fn protect<'a>(
    st: &mut SendState,
    hdr: &'a mut [u8; HEADER_LEN],
    control: &'a [u8],
    data: &'a [u8],
) -> Result<Wire<'a>, SendClosed> {
    let Some(sealer) = st.sealer.as_mut() else {
        return Ok(Wire::Plain([&hdr[..], control, data]));
    };
    // A header made before the sealer was attached carries a body crc: not on the wire.
    clear_body_crc(hdr);
    let hdr: &[u8; HEADER_LEN] = hdr;
    if !sealer.encrypts() {
        return match sealer.sign(hdr, control, data) {
            Ok(tags) => Ok(Wire::Signed([&hdr[..], control, data], tags)),
            Err(_) => {
                st.closed = true;
                Err(SendClosed)
            }
        };
    }
    // The body is copied after a pad that keeps the data part's offset modulo 64
    // (`COPY_ALIGN` says why); the header goes out from where it is.
    let mut buf = Vec::with_capacity(COPY_ALIGN + control.len() + data.len());
    let lands = buf.as_ptr() as usize + control.len();
    let pad = (data.as_ptr() as usize).wrapping_sub(lands) % COPY_ALIGN;
    buf.resize(pad, 0);
    buf.extend_from_slice(control);
    buf.extend_from_slice(data);
    match sealer.seal(hdr, &mut buf[pad..]) {
        Ok(tag) => Ok(Wire::Sealed(hdr, Arc::new(SealedBody(buf, pad)), tag)),
        Err(_) => {
            st.closed = true;
            Err(SendClosed)
        }
    }
}

/// Seals every whole frame of `queue` in order (frames queued before the connection was
/// open); `None` if it holds a partial frame or the sealer is exhausted.
fn seal_queue(queue: &[u8], sealer: &mut Sealer) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(queue.len() + FRAME_TAGS_LEN * 4);
    let mut rest = queue;
    while !rest.is_empty() {
        let h = rest.first_chunk::<HEADER_LEN>()?;
        let c = u32::from_le_bytes([h[16], h[17], h[18], h[19]]) as usize;
        let d = u32::from_le_bytes([h[20], h[21], h[22], h[23]]) as usize;
        let len = HEADER_LEN + c + d;
        let mut frame = rest.get(..len)?.to_vec();
        seal_encoded(&mut frame, sealer).ok()?;
        out.extend_from_slice(&frame);
        rest = &rest[len..];
    }
    Some(out)
}

/// Writes as much as the socket takes now; Err on a failed connection.
fn write_now(stream: &OwnedWriteHalf, parts: &[&[u8]]) -> Result<usize, ()> {
    let total: usize = parts.iter().map(|p| p.len()).sum();
    let mut done = 0;
    while done < total {
        let slices = remaining_slices(parts, done);
        match stream.try_write_vectored(&slices) {
            Ok(0) => return Err(()),
            Ok(n) => done += n,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(_) => return Err(()),
        }
    }
    Ok(done)
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
            if !list.iter().any(|x| Arc::ptr_eq(&x.inner, &s.inner)) {
                list.push(s.clone());
            }
            true
        }
        None => false,
    })
}

fn remaining_slices<'a>(parts: &[&'a [u8]], mut skip: usize) -> Vec<std::io::IoSlice<'a>> {
    let mut out = Vec::with_capacity(parts.len());
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

/// Writes queued bytes whenever there are some and the socket is attached; ends when the
/// sender is dropped or closed.
async fn drain_queue(weak: Weak<SenderInner>, wake: Arc<Notify>) {
    loop {
        let Some(inner) = weak.upgrade() else { return };
        let idle = {
            let st = inner.state.lock_or_die();
            if st.closed {
                return;
            }
            st.queue.is_empty() || inner.stream.get().is_none()
        };
        if idle {
            // Holding only a weak reference while idle lets the connection drop.
            drop(inner);
            wake.notified().await;
            continue;
        }
        let Some(stream) = inner.stream.get() else {
            continue;
        };
        let closed = stream.writable().await.is_err();
        let mut st = inner.state.lock_or_die();
        if closed {
            st.closed = true;
        } else {
            match stream.try_write_vectored(&st.queue.slices()) {
                Ok(0) => st.closed = true,
                Ok(n) => st.queue.consume(n),
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(_) => st.closed = true,
            }
        }
        drop(st);
        inner.drained.notify_waiters();
    }
}
