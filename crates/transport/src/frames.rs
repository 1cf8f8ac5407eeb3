//! Frames over tokio streams: one frame per call, header checked before the body is read.

use cairn_auth::{Opener, Sealer, Tampered, COPY_ALIGN, FRAME_TAGS_LEN};
use cairn_proto::{
    body_crc, clear_body_crc, Decoder, Frame, FrameError, FrameHeader, Limits, HEADER_LEN,
    PROTOCOL_VERSION,
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
    frame_buffered_with(buf, false)
}

/// [`frame_buffered`] on a connection whose frames carry tags (`protected`).
pub fn frame_buffered_with(buf: &[u8], protected: bool) -> bool {
    let Some(h) = buf.first_chunk::<HEADER_LEN>() else {
        return false;
    };
    let c = u32::from_le_bytes([h[16], h[17], h[18], h[19]]) as u64;
    let d = u32::from_le_bytes([h[20], h[21], h[22], h[23]]) as u64;
    let tags = if protected { FRAME_TAGS_LEN as u64 } else { 0 };
    buf.len() as u64 >= HEADER_LEN as u64 + c + d + tags
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
    /// The peer sent nothing for this long (`ConnLimits::idle`).
    #[error("idle for {0:?}; closing")]
    Idle(std::time::Duration),
    /// A frame of a protected connection failed its check.
    #[error(transparent)]
    Tampered(#[from] Tampered),
}

/// Reads one frame. `Closed` when the peer closed cleanly between frames.
pub async fn read_frame<R: AsyncRead + Unpin>(
    r: &mut R,
    limits: &Limits,
) -> Result<Frame, ReadError> {
    read_guarded(r, limits, None).await
}

/// Reads one frame of a connection whose frames `opener` checks (and decrypts), when it is
/// protected: the header, the parts, then their tags.
pub async fn read_guarded<R: AsyncRead + Unpin>(
    r: &mut R,
    limits: &Limits,
    opener: Option<&mut Opener>,
) -> Result<Frame, ReadError> {
    let mut h = [0u8; HEADER_LEN];
    match r.read_exact(&mut h).await {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Err(ReadError::Closed),
        Err(e) => return Err(e.into()),
    }
    let hdr = FrameHeader::decode(&h, limits)?;
    let (control, data) = match opener {
        Some(o) if o.decrypts() => read_secure(r, &h, &hdr, o).await?,
        Some(o) => {
            let control = read_exactly(r, hdr.control_len).await?;
            let data = read_exactly(r, hdr.data_len).await?;
            let tag = read_tag(r).await?;
            o.check(&h, &control, &data, &tag)?;
            (control, data)
        }
        None => {
            let control = read_exactly(r, hdr.control_len).await?;
            let data = read_exactly(r, hdr.data_len).await?;
            return Ok(hdr.frame(control, data)?);
        }
    };
    // The tag checked the body; a protected frame's body crc is 0.
    Ok(hdr.frame_unchecked(control, data))
}

/// Reads the body of a secure frame (one AES-GCM message: control, then data) and its tag,
/// and decrypts it; its parts.
async fn read_secure<R: AsyncRead + Unpin>(
    r: &mut R,
    h: &[u8; HEADER_LEN],
    hdr: &FrameHeader,
    opener: &mut Opener,
) -> Result<(Vec<u8>, Vec<u8>), ReadError> {
    let c = hdr.control_len as usize;
    // The body is read after `pad` bytes that make the move of the data part below one by a
    // multiple of 64 bytes (`COPY_ALIGN` says why).
    let pad = (COPY_ALIGN - c % COPY_ALIGN) % COPY_ALIGN;
    let len = pad + c + hdr.data_len as usize;
    let mut buf = Vec::with_capacity(len);
    buf.resize(pad, 0);
    // Both lengths were checked against the limits, so this fits.
    read_into(r, &mut buf, len).await?;
    let tag = read_tag(r).await?;
    opener.open(h, &mut buf[pad..], &tag)?;
    // The control part is small (the data part is the payload): copy it out and move the
    // data down, rather than copy the data into a buffer of its own.
    let control = buf[pad..pad + c].to_vec();
    buf.drain(..pad + c);
    Ok((control, buf))
}

async fn read_tag<R: AsyncRead + Unpin>(r: &mut R) -> std::io::Result<[u8; FRAME_TAGS_LEN]> {
    let mut tag = [0u8; FRAME_TAGS_LEN];
    r.read_exact(&mut tag).await?;
    Ok(tag)
}

/// Protects an encoded frame (header, control, data) in place: its body crc cleared, its
/// body encrypted (secure mode) and its tag appended.
pub fn seal_encoded(frame: &mut Vec<u8>, sealer: &mut Sealer) -> Result<(), Tampered> {
    let Some(h) = frame.first_chunk_mut::<HEADER_LEN>() else {
        return Err(Tampered { seq: 0 });
    };
    clear_body_crc(h);
    let h = *h;
    let c = u32::from_le_bytes([h[16], h[17], h[18], h[19]]) as usize;
    let d = u32::from_le_bytes([h[20], h[21], h[22], h[23]]) as usize;
    if frame.len() != HEADER_LEN + c + d {
        return Err(Tampered { seq: 0 });
    }
    let tag = sealer.seal(&h, &mut frame[HEADER_LEN..])?;
    frame.extend_from_slice(&tag);
    Ok(())
}

/// Reads exactly `len` bytes into a new buffer, without zero-filling it first (the length
/// was checked against the limits before).
async fn read_exactly<R: AsyncRead + Unpin>(r: &mut R, len: u32) -> std::io::Result<Vec<u8>> {
    let len = len as usize;
    let mut buf = Vec::with_capacity(len);
    read_into(r, &mut buf, len).await?;
    Ok(buf)
}

/// Reads into `buf` until it holds `len` bytes (its capacity, reserved by the caller).
async fn read_into<R: AsyncRead + Unpin>(
    r: &mut R,
    buf: &mut Vec<u8>,
    len: usize,
) -> std::io::Result<()> {
    while buf.len() < len {
        // `read_buf` fills the spare capacity; limited so it never reads past this part.
        let mut part = (&mut *r).take((len - buf.len()) as u64);
        if part.read_buf(buf).await? == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
    }
    Ok(())
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

/// The sealed header of a frame made of these parts; `protected`: for a protected connection,
/// whose frames carry a body crc of 0 (their tag covers the body).
pub(crate) fn frame_header(
    msg_type: u16,
    request_id: u64,
    control: &[u8],
    data: &[u8],
    protected: bool,
) -> [u8; HEADER_LEN] {
    FrameHeader {
        version: PROTOCOL_VERSION,
        flags: 0,
        msg_type,
        request_id,
        control_len: control.len() as u32,
        data_len: data.len() as u32,
        body_crc: if protected {
            0
        } else {
            body_crc(control, data)
        },
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
    out.extend_from_slice(&frame_header(msg_type, request_id, control, data, false));
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
    write_guarded(w, (msg_type, request_id, control, data), None).await
}

/// Writes one frame made of its parts (type, request id, control, data), protected by
/// `sealer` when the connection is.
pub async fn write_guarded<W: AsyncWrite + Unpin>(
    w: &mut W,
    (msg_type, request_id, control, data): (u16, u64, &[u8], &[u8]),
    sealer: Option<&mut Sealer>,
) -> std::io::Result<()> {
    let mut buf = Vec::with_capacity(HEADER_LEN + control.len() + data.len() + FRAME_TAGS_LEN);
    let protected = sealer.is_some();
    buf.extend_from_slice(&frame_header(
        msg_type, request_id, control, data, protected,
    ));
    buf.extend_from_slice(control);
    buf.extend_from_slice(data);
    if let Some(s) = sealer {
        seal_encoded(&mut buf, s).map_err(std::io::Error::other)?;
    }
    w.write_all(&buf).await
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
