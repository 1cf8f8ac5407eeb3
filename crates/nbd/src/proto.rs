//! NBD wire constants, request parsing and reply encoding: pure functions over bytes, no I/O
//! (the fuzz targets and the async server share them). All integers are big-endian (network
//! byte order). Values are those of the NBD protocol (NetworkBlockDevice/nbd, doc/proto.md).

/// "NBDMAGIC": first 8 bytes the server sends.
pub const NBDMAGIC: u64 = 0x4e42_444d_4147_4943;
/// "IHAVEOPT": second 8 bytes of the greeting, and the start of every option request.
pub const IHAVEOPT: u64 = 0x4948_4156_454f_5054;
/// Magic of every option reply (fixed newstyle).
pub const OPTION_REPLY_MAGIC: u64 = 0x0003_e889_0455_65a9;
/// Magic of a (compact) transmission request.
pub const REQUEST_MAGIC: u32 = 0x2560_9513;
/// Magic of an extended-header request; never valid here (extended headers are refused), only
/// recognised to log a clearer reason.
pub const EXTENDED_REQUEST_MAGIC: u32 = 0x21e4_1c71;
/// Magic of a simple reply.
pub const SIMPLE_REPLY_MAGIC: u32 = 0x6744_6698;
/// Magic of a structured reply chunk.
pub const STRUCTURED_REPLY_MAGIC: u32 = 0x668e_33ef;

/// Handshake flag: the server speaks fixed newstyle.
pub const FLAG_FIXED_NEWSTYLE: u16 = 1 << 0;
/// Handshake flag: the server can omit the 124 zero bytes after NBD_OPT_EXPORT_NAME.
pub const FLAG_NO_ZEROES: u16 = 1 << 1;
/// Client flag: the client speaks fixed newstyle.
pub const FLAG_C_FIXED_NEWSTYLE: u32 = 1 << 0;
/// Client flag: omit the 124 zero bytes after NBD_OPT_EXPORT_NAME.
pub const FLAG_C_NO_ZEROES: u32 = 1 << 1;

/// Transmission flag: always set.
pub const FLAG_HAS_FLAGS: u16 = 1 << 0;
/// Transmission flag: the export is read-only (never set by this server).
pub const FLAG_READ_ONLY: u16 = 1 << 1;
/// Transmission flag: NBD_CMD_FLUSH is supported.
pub const FLAG_SEND_FLUSH: u16 = 1 << 2;
/// Transmission flag: NBD_CMD_FLAG_FUA is supported.
pub const FLAG_SEND_FUA: u16 = 1 << 3;
/// Transmission flag: rotational medium (never set by this server).
pub const FLAG_ROTATIONAL: u16 = 1 << 4;
/// Transmission flag: NBD_CMD_TRIM is supported.
pub const FLAG_SEND_TRIM: u16 = 1 << 5;
/// Transmission flag: NBD_CMD_WRITE_ZEROES (and NBD_CMD_FLAG_NO_HOLE) are supported.
pub const FLAG_SEND_WRITE_ZEROES: u16 = 1 << 6;
/// Transmission flag: NBD_CMD_FLAG_DF is supported (only with structured replies).
pub const FLAG_SEND_DF: u16 = 1 << 7;
/// Transmission flag: several connections to this export see one consistent device.
pub const FLAG_CAN_MULTI_CONN: u16 = 1 << 8;
/// Transmission flag: NBD_CMD_CACHE is supported.
pub const FLAG_SEND_CACHE: u16 = 1 << 10;
/// Transmission flag: NBD_CMD_FLAG_FAST_ZERO is supported.
pub const FLAG_SEND_FAST_ZERO: u16 = 1 << 11;

/// Option: choose an export and enter transmission (no error reply possible).
pub const OPT_EXPORT_NAME: u32 = 1;
/// Option: end the session.
pub const OPT_ABORT: u32 = 2;
/// Option: list exports.
pub const OPT_LIST: u32 = 3;
/// Option: upgrade to TLS.
pub const OPT_STARTTLS: u32 = 5;
/// Option: describe an export.
pub const OPT_INFO: u32 = 6;
/// Option: describe an export and enter transmission.
pub const OPT_GO: u32 = 7;
/// Option: use structured replies in transmission.
pub const OPT_STRUCTURED_REPLY: u32 = 8;
/// Option: list metadata contexts.
pub const OPT_LIST_META_CONTEXT: u32 = 9;
/// Option: select metadata contexts.
pub const OPT_SET_META_CONTEXT: u32 = 10;
/// Option: 64-bit extended headers (not implemented: answered NBD_REP_ERR_UNSUP).
pub const OPT_EXTENDED_HEADERS: u32 = 11;

/// Option reply: success / end of a list.
pub const REP_ACK: u32 = 1;
/// Option reply: one export of NBD_OPT_LIST.
pub const REP_SERVER: u32 = 2;
/// Option reply: one NBD_INFO_* item of NBD_OPT_INFO/GO.
pub const REP_INFO: u32 = 3;
/// Option reply: one metadata context.
pub const REP_META_CONTEXT: u32 = 4;
const REP_ERR: u32 = 1 << 31;
/// Option error: unknown option.
pub const REP_ERR_UNSUP: u32 = REP_ERR | 1;
/// Option error: forbidden by policy.
pub const REP_ERR_POLICY: u32 = REP_ERR | 2;
/// Option error: malformed option.
pub const REP_ERR_INVALID: u32 = REP_ERR | 3;
/// Option error: not supported on this platform.
pub const REP_ERR_PLATFORM: u32 = REP_ERR | 4;
/// Option error: TLS must be negotiated (NBD_OPT_STARTTLS) before this option.
pub const REP_ERR_TLS_REQD: u32 = REP_ERR | 5;
/// Option error: no such export.
pub const REP_ERR_UNKNOWN: u32 = REP_ERR | 6;
/// Option error: request too large.
pub const REP_ERR_TOO_BIG: u32 = REP_ERR | 9;

/// NBD_INFO type: size and transmission flags.
pub const INFO_EXPORT: u16 = 0;
/// NBD_INFO type: canonical export name.
pub const INFO_NAME: u16 = 1;
/// NBD_INFO type: export description.
pub const INFO_DESCRIPTION: u16 = 2;
/// NBD_INFO type: block size constraints.
pub const INFO_BLOCK_SIZE: u16 = 3;

/// Command: read.
pub const CMD_READ: u16 = 0;
/// Command: write (payload follows the request).
pub const CMD_WRITE: u16 = 1;
/// Command: disconnect (no reply).
pub const CMD_DISC: u16 = 2;
/// Command: flush.
pub const CMD_FLUSH: u16 = 3;
/// Command: trim (discard).
pub const CMD_TRIM: u16 = 4;
/// Command: cache (prefetch hint).
pub const CMD_CACHE: u16 = 5;
/// Command: write zeroes.
pub const CMD_WRITE_ZEROES: u16 = 6;
/// Command: block status.
pub const CMD_BLOCK_STATUS: u16 = 7;

/// Command flag: force unit access.
pub const CMD_FLAG_FUA: u16 = 1 << 0;
/// Command flag (WRITE_ZEROES): do not punch a hole.
pub const CMD_FLAG_NO_HOLE: u16 = 1 << 1;
/// Command flag (READ): at most one content chunk.
pub const CMD_FLAG_DF: u16 = 1 << 2;
/// Command flag (BLOCK_STATUS): one extent only.
pub const CMD_FLAG_REQ_ONE: u16 = 1 << 3;
/// Command flag (WRITE_ZEROES): fail with ENOTSUP unless zeroing is fast.
pub const CMD_FLAG_FAST_ZERO: u16 = 1 << 4;

/// Structured reply flag: last chunk of the reply.
pub const REPLY_FLAG_DONE: u16 = 1 << 0;
/// Structured chunk: no payload (final chunk only).
pub const REPLY_TYPE_NONE: u16 = 0;
/// Structured chunk: data at an offset.
pub const REPLY_TYPE_OFFSET_DATA: u16 = 1;
/// Structured chunk: block status descriptors of one context.
pub const REPLY_TYPE_BLOCK_STATUS: u16 = 5;
/// Structured chunk: error with a message.
pub const REPLY_TYPE_ERROR: u16 = (1 << 15) | 1;

/// base:allocation: the range is not allocated.
pub const STATE_HOLE: u32 = 1 << 0;
/// base:allocation: the range reads as zeros.
pub const STATE_ZERO: u32 = 1 << 1;

/// The only metadata context this server offers.
pub const BASE_ALLOCATION: &str = "base:allocation";
/// qemu:dirty-bitmap:NAME: the range changed (since the bitmap's point).
pub const STATE_DIRTY: u32 = 1;
/// The context namespace and leaf prefix of dirty bitmaps.
pub const DIRTY_BITMAP_PREFIX: &str = "qemu:dirty-bitmap:";

/// Length of a transmission request header.
pub const REQUEST_LEN: usize = 28;
/// Length of an option request header (magic, option, length).
pub const OPTION_HEADER_LEN: usize = 16;
/// Length of the server greeting.
pub const GREETING_LEN: usize = 18;
/// Longest error message the server puts in a reply (the protocol's string limit).
pub const MAX_MESSAGE_LEN: usize = 4096;

/// NBD error values (the `error` field of replies).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub enum Errno {
    /// Operation not permitted.
    Perm = 1,
    /// Input/output error.
    Io = 5,
    /// Cannot allocate memory.
    NoMem = 12,
    /// Invalid argument.
    Inval = 22,
    /// No space left on device.
    NoSpc = 28,
    /// Value too large.
    Overflow = 75,
    /// Operation not supported.
    NotSup = 95,
    /// Server is shutting down.
    Shutdown = 108,
}

impl Errno {
    /// The value on the wire.
    pub fn code(self) -> u32 {
        self as u32
    }
}

/// Bytes that cannot be parsed as the protocol element they should be. After any of these the
/// stream position cannot be trusted, so the connection is closed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProtoError {
    /// A request did not start with NBD_REQUEST_MAGIC.
    #[error("bad request magic {0:#010x}")]
    BadRequestMagic(u32),
    /// An extended-header request, which was never negotiated.
    #[error("extended-header request (magic {0:#010x}) but extended headers were not negotiated")]
    ExtendedRequest(u32),
    /// An option did not start with IHAVEOPT.
    #[error("bad option magic {0:#018x}")]
    BadOptionMagic(u64),
}

/// One transmission request header (the payload of a write follows it on the wire).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Request {
    /// Command flags (NBD_CMD_FLAG_*).
    pub flags: u16,
    /// Command type (NBD_CMD_*).
    pub kind: u16,
    /// Opaque handle the reply must carry back.
    pub cookie: u64,
    /// Byte offset into the export.
    pub offset: u64,
    /// Byte length (of the payload, for a write).
    pub len: u32,
}

fn array<const N: usize>(b: &[u8], at: usize) -> [u8; N] {
    let mut out = [0u8; N];
    out.copy_from_slice(&b[at..at + N]);
    out
}

/// Parses a request header; only the magic can make it fail (every other field is checked
/// against the session by [`crate::command::check_request`]).
pub fn parse_request(b: &[u8; REQUEST_LEN]) -> Result<Request, ProtoError> {
    let magic = u32::from_be_bytes(array(b, 0));
    match magic {
        REQUEST_MAGIC => Ok(Request {
            flags: u16::from_be_bytes(array(b, 4)),
            kind: u16::from_be_bytes(array(b, 6)),
            cookie: u64::from_be_bytes(array(b, 8)),
            offset: u64::from_be_bytes(array(b, 16)),
            len: u32::from_be_bytes(array(b, 24)),
        }),
        EXTENDED_REQUEST_MAGIC => Err(ProtoError::ExtendedRequest(magic)),
        _ => Err(ProtoError::BadRequestMagic(magic)),
    }
}

/// Encodes a request header (used by tests and fuzzers to build inputs).
pub fn encode_request(r: &Request) -> [u8; REQUEST_LEN] {
    let mut b = [0u8; REQUEST_LEN];
    b[0..4].copy_from_slice(&REQUEST_MAGIC.to_be_bytes());
    b[4..6].copy_from_slice(&r.flags.to_be_bytes());
    b[6..8].copy_from_slice(&r.kind.to_be_bytes());
    b[8..16].copy_from_slice(&r.cookie.to_be_bytes());
    b[16..24].copy_from_slice(&r.offset.to_be_bytes());
    b[24..28].copy_from_slice(&r.len.to_be_bytes());
    b
}

/// Parses an option request header into (option, data length).
pub fn parse_option_header(b: &[u8; OPTION_HEADER_LEN]) -> Result<(u32, u32), ProtoError> {
    let magic = u64::from_be_bytes(array(b, 0));
    if magic != IHAVEOPT {
        return Err(ProtoError::BadOptionMagic(magic));
    }
    Ok((
        u32::from_be_bytes(array(b, 8)),
        u32::from_be_bytes(array(b, 12)),
    ))
}

/// The server's first bytes: NBDMAGIC, IHAVEOPT, handshake flags.
pub fn greeting() -> [u8; GREETING_LEN] {
    let mut b = [0u8; GREETING_LEN];
    b[0..8].copy_from_slice(&NBDMAGIC.to_be_bytes());
    b[8..16].copy_from_slice(&IHAVEOPT.to_be_bytes());
    b[16..18].copy_from_slice(&(FLAG_FIXED_NEWSTYLE | FLAG_NO_ZEROES).to_be_bytes());
    b
}

/// Appends one option reply. `data` is at most a few KiB (names, messages, info items).
pub fn put_option_reply(out: &mut Vec<u8>, opt: u32, kind: u32, data: &[u8]) {
    out.extend_from_slice(&OPTION_REPLY_MAGIC.to_be_bytes());
    out.extend_from_slice(&opt.to_be_bytes());
    out.extend_from_slice(&kind.to_be_bytes());
    out.extend_from_slice(&len_u32(data.len()).to_be_bytes());
    out.extend_from_slice(data);
}

/// Appends an option error reply carrying a human-readable message.
pub fn put_option_error(out: &mut Vec<u8>, opt: u32, kind: u32, message: &str) {
    put_option_reply(out, opt, kind, clip_message(message).as_bytes());
}

/// The reply to NBD_OPT_EXPORT_NAME: size, transmission flags, and 124 zeros unless the client
/// set NBD_FLAG_C_NO_ZEROES.
pub fn export_name_reply(size: u64, flags: u16, no_zeroes: bool) -> Vec<u8> {
    let mut b = Vec::with_capacity(134);
    b.extend_from_slice(&size.to_be_bytes());
    b.extend_from_slice(&flags.to_be_bytes());
    if !no_zeroes {
        b.resize(b.len() + 124, 0);
    }
    b
}

/// A simple reply header (followed by the data of a successful simple read).
pub fn simple_reply(cookie: u64, error: u32) -> [u8; 16] {
    let mut b = [0u8; 16];
    b[0..4].copy_from_slice(&SIMPLE_REPLY_MAGIC.to_be_bytes());
    b[4..8].copy_from_slice(&error.to_be_bytes());
    b[8..16].copy_from_slice(&cookie.to_be_bytes());
    b
}

/// A structured reply chunk header; `len` is the payload length that follows.
pub fn chunk_header(flags: u16, kind: u16, cookie: u64, len: u32) -> [u8; 20] {
    let mut b = [0u8; 20];
    b[0..4].copy_from_slice(&STRUCTURED_REPLY_MAGIC.to_be_bytes());
    b[4..6].copy_from_slice(&flags.to_be_bytes());
    b[6..8].copy_from_slice(&kind.to_be_bytes());
    b[8..16].copy_from_slice(&cookie.to_be_bytes());
    b[16..20].copy_from_slice(&len.to_be_bytes());
    b
}

/// The header and offset of a final NBD_REPLY_TYPE_OFFSET_DATA chunk; the `data_len` bytes of
/// data follow. `data_len` must be at least 1 and at most `u32::MAX - 8` (reads are capped far
/// below that).
pub fn offset_data_head(cookie: u64, offset: u64, data_len: u32) -> Vec<u8> {
    let mut b = Vec::with_capacity(28);
    let len = data_len.saturating_add(8);
    b.extend_from_slice(&chunk_header(
        REPLY_FLAG_DONE,
        REPLY_TYPE_OFFSET_DATA,
        cookie,
        len,
    ));
    b.extend_from_slice(&offset.to_be_bytes());
    b
}

/// A final NBD_REPLY_TYPE_NONE chunk: success with no payload.
pub fn none_chunk(cookie: u64) -> [u8; 20] {
    chunk_header(REPLY_FLAG_DONE, REPLY_TYPE_NONE, cookie, 0)
}

/// A final NBD_REPLY_TYPE_ERROR chunk with a message.
pub fn error_chunk(cookie: u64, error: u32, message: &str) -> Vec<u8> {
    let msg = clip_message(message).as_bytes();
    let mut b = Vec::with_capacity(26 + msg.len());
    b.extend_from_slice(&chunk_header(
        REPLY_FLAG_DONE,
        REPLY_TYPE_ERROR,
        cookie,
        len_u32(6 + msg.len()),
    ));
    b.extend_from_slice(&error.to_be_bytes());
    b.extend_from_slice(&len_u16(msg.len()).to_be_bytes());
    b.extend_from_slice(msg);
    b
}

/// An NBD_REPLY_TYPE_BLOCK_STATUS chunk for one context: (length, flags) descriptors; `done`
/// on the last chunk of the reply (one per selected context).
pub fn block_status_chunk(
    cookie: u64,
    context: u32,
    descriptors: &[(u32, u32)],
    done: bool,
) -> Vec<u8> {
    let payload = 4 + 8 * descriptors.len();
    let mut b = Vec::with_capacity(20 + payload);
    b.extend_from_slice(&chunk_header(
        if done { REPLY_FLAG_DONE } else { 0 },
        REPLY_TYPE_BLOCK_STATUS,
        cookie,
        len_u32(payload),
    ));
    b.extend_from_slice(&context.to_be_bytes());
    for &(len, flags) in descriptors {
        b.extend_from_slice(&len.to_be_bytes());
        b.extend_from_slice(&flags.to_be_bytes());
    }
    b
}

/// Cuts a message to the protocol's string limit, on a character boundary.
fn clip_message(message: &str) -> &str {
    if message.len() <= MAX_MESSAGE_LEN {
        return message;
    }
    let mut end = MAX_MESSAGE_LEN;
    while !message.is_char_boundary(end) {
        end -= 1;
    }
    &message[..end]
}

// Every encoded length here is bounded by the callers (messages clipped to 4 KiB, descriptor
// lists capped, reads capped at 32 MiB); saturating keeps a bug from becoming a panic.
fn len_u32(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

fn len_u16(n: usize) -> u16 {
    u16::try_from(n).unwrap_or(u16::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_round_trip() {
        let r = Request {
            flags: CMD_FLAG_FUA,
            kind: CMD_WRITE,
            cookie: 0x0102_0304_0506_0708,
            offset: 1 << 40,
            len: 4096,
        };
        let b = encode_request(&r);
        assert_eq!(&b[0..4], &[0x25, 0x60, 0x95, 0x13]);
        assert_eq!(parse_request(&b), Ok(r));
    }

    #[test]
    fn request_bad_magic() {
        let mut b = encode_request(&Request {
            flags: 0,
            kind: 0,
            cookie: 0,
            offset: 0,
            len: 0,
        });
        b[0] = 0;
        assert_eq!(
            parse_request(&b),
            Err(ProtoError::BadRequestMagic(0x0060_9513))
        );
        b[0..4].copy_from_slice(&EXTENDED_REQUEST_MAGIC.to_be_bytes());
        assert!(matches!(
            parse_request(&b),
            Err(ProtoError::ExtendedRequest(_))
        ));
    }

    #[test]
    fn greeting_bytes() {
        let g = greeting();
        assert_eq!(&g[0..8], b"NBDMAGIC");
        assert_eq!(&g[8..16], b"IHAVEOPT");
        assert_eq!(&g[16..18], &[0, 3]);
    }

    #[test]
    fn option_header() {
        let mut b = [0u8; OPTION_HEADER_LEN];
        b[0..8].copy_from_slice(b"IHAVEOPT");
        b[8..12].copy_from_slice(&OPT_GO.to_be_bytes());
        b[12..16].copy_from_slice(&7u32.to_be_bytes());
        assert_eq!(parse_option_header(&b), Ok((OPT_GO, 7)));
        b[0] = b'X';
        assert!(parse_option_header(&b).is_err());
    }

    #[test]
    fn option_reply_layout() {
        let mut out = Vec::new();
        put_option_reply(&mut out, OPT_LIST, REP_ACK, &[]);
        assert_eq!(out.len(), 20);
        assert_eq!(&out[0..8], &OPTION_REPLY_MAGIC.to_be_bytes());
        assert_eq!(&out[8..12], &OPT_LIST.to_be_bytes());
        assert_eq!(&out[12..16], &REP_ACK.to_be_bytes());
        assert_eq!(&out[16..20], &[0, 0, 0, 0]);
    }

    #[test]
    fn export_name_reply_zeroes() {
        assert_eq!(export_name_reply(1, FLAG_HAS_FLAGS, false).len(), 134);
        let r = export_name_reply(512, FLAG_HAS_FLAGS, true);
        assert_eq!(r, [0, 0, 0, 0, 0, 0, 2, 0, 0, 1]);
    }

    #[test]
    fn simple_and_structured_replies() {
        let s = simple_reply(9, Errno::Inval.code());
        assert_eq!(&s[0..4], &SIMPLE_REPLY_MAGIC.to_be_bytes());
        assert_eq!(&s[4..8], &22u32.to_be_bytes());
        assert_eq!(&s[8..16], &9u64.to_be_bytes());

        let d = offset_data_head(7, 4096, 512);
        assert_eq!(d.len(), 28);
        assert_eq!(&d[4..6], &REPLY_FLAG_DONE.to_be_bytes());
        assert_eq!(&d[6..8], &REPLY_TYPE_OFFSET_DATA.to_be_bytes());
        assert_eq!(&d[16..20], &520u32.to_be_bytes());
        assert_eq!(&d[20..28], &4096u64.to_be_bytes());

        let e = error_chunk(7, Errno::Io.code(), "boom");
        assert_eq!(e.len(), 20 + 6 + 4);
        assert_eq!(&e[6..8], &REPLY_TYPE_ERROR.to_be_bytes());
        assert_eq!(&e[16..20], &10u32.to_be_bytes());
        assert_eq!(&e[20..24], &5u32.to_be_bytes());
        assert_eq!(&e[24..26], &4u16.to_be_bytes());
        assert_eq!(&e[26..], b"boom");

        let b = block_status_chunk(7, 1, &[(4096, 0), (8192, STATE_HOLE | STATE_ZERO)], true);
        assert_eq!(b.len(), 20 + 4 + 16);
        assert_eq!(&b[16..20], &20u32.to_be_bytes());
        assert_eq!(&b[28..32], &0u32.to_be_bytes());
        assert_eq!(&b[36..40], &3u32.to_be_bytes());

        assert_eq!(&none_chunk(3)[4..8], &[0, 1, 0, 0]);
    }

    #[test]
    fn long_messages_are_clipped_on_char_boundaries() {
        let long = "é".repeat(3000); // 6000 bytes
        let e = error_chunk(1, 5, &long);
        let msg_len = u16::from_be_bytes([e[24], e[25]]) as usize;
        assert!(msg_len <= MAX_MESSAGE_LEN);
        assert!(std::str::from_utf8(&e[26..]).is_ok());
        assert_eq!(e.len(), 26 + msg_len);
    }
}
