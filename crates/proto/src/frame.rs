//! Frame header encoding, decoding and the incremental decoder.

use crate::{MIN_PROTOCOL_VERSION, PROTOCOL_VERSION};

/// Magic at the start of every frame.
pub const MAGIC: [u8; 4] = *b"CRNP";
/// Size of the frame header.
pub const HEADER_LEN: usize = 32;

/// Size limits a receiver enforces; a frame over them is refused before its body is read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Largest control part. Default 1 MiB.
    pub max_control: u32,
    /// Largest data part. Default 64 MiB.
    pub max_data: u32,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_control: 1 << 20,
            max_data: 64 << 20,
        }
    }
}

/// Why bytes are not a valid frame. A connection that sees one should be closed: the stream
/// position can no longer be trusted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum FrameError {
    #[error("not a Cairn frame (bad magic {0:02x?}): the peer speaks another protocol")]
    BadMagic([u8; 4]),
    #[error("frame layout version {got}, this build reads {min}..={max}: upgrade the older side")]
    UnsupportedVersion { got: u8, min: u8, max: u8 },
    #[error("frame header checksum mismatch: the connection corrupts data")]
    HeaderChecksum,
    #[error("frame body checksum mismatch (request {request_id}): the connection corrupts data")]
    BodyChecksum { request_id: u64 },
    #[error("frame {what} of {size} bytes is over the limit of {limit}")]
    TooLarge {
        what: &'static str,
        size: u64,
        limit: u64,
    },
}

/// The fixed header of a frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameHeader {
    pub version: u8,
    pub flags: u8,
    pub msg_type: u16,
    pub request_id: u64,
    pub control_len: u32,
    pub data_len: u32,
    pub body_crc: u32,
}

/// crc32c of a frame body: the control part, then the data part.
pub fn body_crc(control: &[u8], data: &[u8]) -> u32 {
    cairn_crc::crc32c_append(cairn_crc::crc32c(control), data)
}

/// Sets an encoded header's body crc to 0 and seals the header again: a protected frame's
/// header (its tag covers the body, and a crc of the plaintext would tell an observer of a
/// secure frame whether the body is one it guesses).
/// A header whose body crc is 0 already is left as it is.
pub fn clear_body_crc(h: &mut [u8; HEADER_LEN]) {
    if h[24..28] == [0; 4] {
        return;
    }
    h[24..28].fill(0);
    let crc = cairn_crc::crc32c(&h[..28]);
    h[28..32].copy_from_slice(&crc.to_le_bytes());
}

fn u32_at(b: &[u8], o: usize) -> u32 {
    u32::from_le_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]])
}

impl FrameHeader {
    /// The frame of this (checked) header and its body, once the body's checksum matches.
    /// Every reader of frames ends here: [`Decoder`] and `cairn_transport::read_frame` alike.
    pub fn frame(&self, control: Vec<u8>, data: Vec<u8>) -> Result<Frame, FrameError> {
        if body_crc(&control, &data) != self.body_crc {
            return Err(FrameError::BodyChecksum {
                request_id: self.request_id,
            });
        }
        Ok(self.frame_unchecked(control, data))
    }

    /// The frame of this (checked) header and its body, whose bytes something stronger than
    /// the body crc has checked: the tag of a protected connection (whose frames carry a
    /// body crc of 0, `docs/format/wire.md`).
    pub fn frame_unchecked(&self, control: Vec<u8>, data: Vec<u8>) -> Frame {
        Frame {
            msg_type: self.msg_type,
            request_id: self.request_id,
            control,
            data,
        }
    }

    /// Encodes the header, sealing it with its crc.
    pub fn encode(&self) -> [u8; HEADER_LEN] {
        let mut h = [0u8; HEADER_LEN];
        h[0..4].copy_from_slice(&MAGIC);
        h[4] = self.version;
        h[5] = self.flags;
        h[6..8].copy_from_slice(&self.msg_type.to_le_bytes());
        h[8..16].copy_from_slice(&self.request_id.to_le_bytes());
        h[16..20].copy_from_slice(&self.control_len.to_le_bytes());
        h[20..24].copy_from_slice(&self.data_len.to_le_bytes());
        h[24..28].copy_from_slice(&self.body_crc.to_le_bytes());
        let crc = cairn_crc::crc32c(&h[..28]);
        h[28..32].copy_from_slice(&crc.to_le_bytes());
        h
    }

    /// Decodes and checks a header: magic, version, checksum, then the limits.
    pub fn decode(h: &[u8; HEADER_LEN], limits: &Limits) -> Result<FrameHeader, FrameError> {
        let mut magic = [0u8; 4];
        magic.copy_from_slice(&h[0..4]);
        if magic != MAGIC {
            return Err(FrameError::BadMagic(magic));
        }
        if cairn_crc::crc32c(&h[..28]) != u32_at(h, 28) {
            return Err(FrameError::HeaderChecksum);
        }
        let version = h[4];
        if !(MIN_PROTOCOL_VERSION..=PROTOCOL_VERSION).contains(&version) {
            return Err(FrameError::UnsupportedVersion {
                got: version,
                min: MIN_PROTOCOL_VERSION,
                max: PROTOCOL_VERSION,
            });
        }
        let mut id = [0u8; 8];
        id.copy_from_slice(&h[8..16]);
        let hdr = FrameHeader {
            version,
            flags: h[5],
            msg_type: u16::from_le_bytes([h[6], h[7]]),
            request_id: u64::from_le_bytes(id),
            control_len: u32_at(h, 16),
            data_len: u32_at(h, 20),
            body_crc: u32_at(h, 24),
        };
        let over = |what, size: u32, limit: u32| FrameError::TooLarge {
            what,
            size: size as u64,
            limit: limit as u64,
        };
        if hdr.control_len > limits.max_control {
            return Err(over("control part", hdr.control_len, limits.max_control));
        }
        if hdr.data_len > limits.max_data {
            return Err(over("data part", hdr.data_len, limits.max_data));
        }
        Ok(hdr)
    }
}

/// A whole frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    pub msg_type: u16,
    pub request_id: u64,
    pub control: Vec<u8>,
    pub data: Vec<u8>,
}

impl Frame {
    /// The header for this frame (computes the body crc).
    pub fn header(&self) -> FrameHeader {
        FrameHeader {
            version: crate::PROTOCOL_VERSION,
            flags: 0,
            msg_type: self.msg_type,
            request_id: self.request_id,
            control_len: self.control.len() as u32,
            data_len: self.data.len() as u32,
            body_crc: body_crc(&self.control, &self.data),
        }
    }

    /// Appends the encoded frame to `out`. Writers that want to send the data part without
    /// copying it send `header().encode()`, `control` and `data` as three slices instead.
    pub fn encode_into(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.header().encode());
        out.extend_from_slice(&self.control);
        out.extend_from_slice(&self.data);
    }
}

/// Turns a byte stream into frames, whatever the pieces it arrives in.
#[derive(Debug, Default)]
pub struct Decoder {
    limits: Limits,
    buf: Vec<u8>,
    header: Option<FrameHeader>,
}

impl Decoder {
    /// A decoder enforcing `limits`.
    pub fn new(limits: Limits) -> Self {
        Decoder {
            limits,
            buf: Vec::new(),
            header: None,
        }
    }

    /// Adds received bytes.
    pub fn push(&mut self, bytes: &[u8]) {
        self.buf.extend_from_slice(bytes);
    }

    /// Bytes buffered and not yet returned as frames.
    pub fn buffered(&self) -> usize {
        self.buf.len()
    }

    /// The next complete frame, `None` if more bytes are needed. After an error the stream is
    /// unusable.
    pub fn next_frame(&mut self) -> Result<Option<Frame>, FrameError> {
        let hdr = match self.header {
            Some(h) => h,
            None => {
                let Some(h) = self.buf.first_chunk::<HEADER_LEN>() else {
                    return Ok(None);
                };
                let h = FrameHeader::decode(h, &self.limits)?;
                self.buf.drain(..HEADER_LEN);
                self.header = Some(h);
                h
            }
        };
        let (c, d) = (hdr.control_len as usize, hdr.data_len as usize);
        if self.buf.len() < c + d {
            return Ok(None);
        }
        let rest = self.buf.split_off(c + d);
        let mut control = std::mem::replace(&mut self.buf, rest);
        let data = control.split_off(c);
        self.header = None;
        hdr.frame(control, data).map(Some)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(i: u64) -> Frame {
        Frame {
            msg_type: 7,
            request_id: i,
            control: vec![i as u8; (i % 5) as usize],
            data: vec![!(i as u8); (i * 97 % 5000) as usize],
        }
    }

    #[test]
    fn frames_round_trip_in_any_pieces() {
        let frames: Vec<Frame> = (0..20).map(frame).collect();
        let mut bytes = Vec::new();
        frames.iter().for_each(|f| f.encode_into(&mut bytes));
        for piece in [1, 3, 31, 32, 33, 1000, bytes.len()] {
            let mut d = Decoder::new(Limits::default());
            let mut got = Vec::new();
            for chunk in bytes.chunks(piece) {
                d.push(chunk);
                while let Some(f) = d.next_frame().unwrap() {
                    got.push(f);
                }
            }
            assert_eq!(got, frames, "pieces of {piece}");
            assert_eq!(d.buffered(), 0);
        }
    }

    #[test]
    fn every_corrupted_byte_is_an_error_not_a_frame() {
        let mut bytes = Vec::new();
        frame(3).encode_into(&mut bytes);
        for i in 0..bytes.len() {
            let mut bad = bytes.clone();
            bad[i] ^= 0x10;
            let mut d = Decoder::new(Limits::default());
            d.push(&bad);
            assert!(d.next_frame().is_err(), "byte {i} flipped went unnoticed");
        }
    }

    #[test]
    fn oversized_frames_are_refused_from_the_header() {
        let f = Frame {
            msg_type: 1,
            request_id: 9,
            control: vec![0; 10],
            data: vec![0; 100],
        };
        let limits = Limits {
            max_control: 16,
            max_data: 64,
        };
        let mut d = Decoder::new(limits);
        d.push(&f.header().encode());
        let e = d.next_frame().unwrap_err();
        assert_eq!(
            e,
            FrameError::TooLarge {
                what: "data part",
                size: 100,
                limit: 64
            }
        );
        let mut wrong = f.header();
        wrong.version = PROTOCOL_VERSION + 1;
        let e = FrameHeader::decode(&wrong.encode(), &Limits::default()).unwrap_err();
        let want = format!("version {}", PROTOCOL_VERSION + 1);
        assert!(e.to_string().contains(&want), "{e}");
    }
}
