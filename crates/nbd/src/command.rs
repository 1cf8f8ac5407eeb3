//! Checking transmission requests against what the handshake agreed: pure functions, so the
//! same rules run in the server, the unit tests and the fuzzers.

use crate::export::Extent;
use crate::proto::*;

/// Largest READ or WRITE payload (the maximum block size advertised in NBD_INFO_BLOCK_SIZE).
/// A WRITE announcing more is closed at once: its payload cannot be skipped cheaply.
pub const MAX_PAYLOAD: u32 = 32 << 20;
/// Most block status descriptors in one reply (the protocol lets a server return fewer than
/// the whole range; this bounds the reply to 512 KiB).
pub const MAX_DESCRIPTORS: usize = 1 << 16;

/// What the handshake agreed for one connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Session {
    /// The export's name as the client gave it.
    pub export: String,
    /// Export size in bytes.
    pub size: u64,
    /// Transmission flags sent to the client.
    pub flags: u16,
    /// Structured replies were negotiated.
    pub structured: bool,
    /// The metadata contexts the client selected for this export (base:allocation, dirty
    /// bitmaps), in id order.
    pub contexts: Vec<crate::handshake::MetaContext>,
}

/// A validated command, ready to run against the export.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// Read `len` bytes (0 succeeds with no data).
    Read {
        /// Byte offset.
        offset: u64,
        /// Byte count, at most [`MAX_PAYLOAD`].
        len: u32,
    },
    /// Write the `len` payload bytes that follow the request.
    Write {
        /// Byte offset.
        offset: u64,
        /// Payload length, at most [`MAX_PAYLOAD`].
        len: u32,
        /// NBD_CMD_FLAG_FUA.
        fua: bool,
    },
    /// NBD_CMD_DISC: finish in-flight requests, then close.
    Disconnect,
    /// Make every acknowledged write durable.
    Flush,
    /// Discard a range.
    Trim {
        /// Byte offset.
        offset: u64,
        /// Byte count.
        len: u32,
        /// NBD_CMD_FLAG_FUA: flush after trimming.
        fua: bool,
    },
    /// Prefetch hint: checked, then acknowledged without touching the export.
    Cache {
        /// Byte offset.
        offset: u64,
        /// Byte count.
        len: u32,
    },
    /// Make a range read as zeros.
    WriteZeroes {
        /// Byte offset.
        offset: u64,
        /// Byte count.
        len: u32,
        /// No NBD_CMD_FLAG_NO_HOLE: the export may free the space.
        may_punch: bool,
        /// NBD_CMD_FLAG_FAST_ZERO.
        fast: bool,
        /// NBD_CMD_FLAG_FUA.
        fua: bool,
    },
    /// Report the base:allocation map of a range.
    BlockStatus {
        /// Byte offset.
        offset: u64,
        /// Byte count (> 0).
        len: u32,
        /// NBD_CMD_FLAG_REQ_ONE: a single descriptor (per context).
        req_one: bool,
    },
}

/// Why a request is not run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rejection {
    /// Reply with `errno` after reading and discarding `discard` payload bytes (a refused
    /// WRITE's payload is still on the wire and must be skipped to find the next request).
    Fail {
        /// The error to reply with.
        errno: Errno,
        /// Payload bytes to skip first.
        discard: u32,
        /// For the log and the structured error message.
        reason: &'static str,
    },
    /// The stream cannot be followed any more: close the connection.
    Close {
        /// For the log.
        reason: &'static str,
    },
}

/// The flags each command accepts. FUA is accepted on every command because the server
/// advertises NBD_FLAG_SEND_FUA, and the protocol then requires it to be accepted everywhere.
fn allowed_flags(kind: u16, structured: bool) -> u16 {
    match kind {
        CMD_READ if structured => CMD_FLAG_FUA | CMD_FLAG_DF,
        CMD_WRITE_ZEROES => CMD_FLAG_FUA | CMD_FLAG_NO_HOLE | CMD_FLAG_FAST_ZERO,
        CMD_BLOCK_STATUS => CMD_FLAG_FUA | CMD_FLAG_REQ_ONE,
        _ => CMD_FLAG_FUA,
    }
}

/// Checks a request against the session and turns it into an [`Op`].
///
/// Never fails on the export's behalf: the errors here are the client's (unknown command or
/// flag, range outside the export, oversized payload, block status without a context).
pub fn check_request(req: &Request, s: &Session) -> Result<Op, Rejection> {
    let fail = |errno, reason| {
        // Only a WRITE carries a payload (extended headers, where others could, are refused).
        let discard = if req.kind == CMD_WRITE { req.len } else { 0 };
        Err(Rejection::Fail {
            errno,
            discard,
            reason,
        })
    };
    if req.kind > CMD_BLOCK_STATUS {
        return fail(Errno::Inval, "unknown command");
    }
    if req.kind == CMD_WRITE && req.len > MAX_PAYLOAD {
        return Err(Rejection::Close {
            reason: "write payload larger than the maximum block size",
        });
    }
    if req.flags & !allowed_flags(req.kind, s.structured) != 0 {
        return fail(Errno::Inval, "command flag not valid for this command");
    }
    let writes = matches!(req.kind, CMD_WRITE | CMD_TRIM | CMD_WRITE_ZEROES);
    if writes && s.flags & FLAG_READ_ONLY != 0 {
        return fail(Errno::Perm, "the export is read-only for this client");
    }
    if req.kind == CMD_DISC {
        // No reply is possible; offset and length "MUST be zero" but carry no meaning.
        return Ok(Op::Disconnect);
    }
    if req.kind == CMD_FLUSH {
        if req.offset != 0 || req.len != 0 {
            return fail(Errno::Inval, "flush with nonzero offset or length");
        }
        return Ok(Op::Flush);
    }
    let in_range = req
        .offset
        .checked_add(u64::from(req.len))
        .is_some_and(|end| end <= s.size);
    if !in_range {
        // The protocol asks for ENOSPC on writes past the end, EINVAL on the rest.
        let errno = match req.kind {
            CMD_WRITE | CMD_WRITE_ZEROES => Errno::NoSpc,
            _ => Errno::Inval,
        };
        return fail(errno, "range beyond the end of the export");
    }
    let (offset, len, flags) = (req.offset, req.len, req.flags);
    let fua = flags & CMD_FLAG_FUA != 0;
    match req.kind {
        CMD_READ if len > MAX_PAYLOAD => {
            fail(Errno::Inval, "read larger than the maximum block size")
        }
        CMD_READ => Ok(Op::Read { offset, len }),
        CMD_WRITE => Ok(Op::Write { offset, len, fua }),
        CMD_TRIM => Ok(Op::Trim { offset, len, fua }),
        CMD_CACHE => Ok(Op::Cache { offset, len }),
        CMD_WRITE_ZEROES => Ok(Op::WriteZeroes {
            offset,
            len,
            may_punch: flags & CMD_FLAG_NO_HOLE == 0,
            fast: flags & CMD_FLAG_FAST_ZERO != 0,
            fua,
        }),
        _ => check_block_status(req, s),
    }
}

fn check_block_status(req: &Request, s: &Session) -> Result<Op, Rejection> {
    let fail = |reason| {
        Err(Rejection::Fail {
            errno: Errno::Inval,
            discard: 0,
            reason,
        })
    };
    if s.contexts.is_empty() || !s.structured {
        return fail("block status without a negotiated metadata context");
    }
    if req.len == 0 {
        return fail("block status of zero bytes");
    }
    Ok(Op::BlockStatus {
        offset: req.offset,
        len: req.len,
        req_one: req.flags & CMD_FLAG_REQ_ONE != 0,
    })
}

/// Turns an export's extents into base:allocation descriptors for a request of `len` bytes:
/// drops empty extents, clips the list to `len`, merges neighbours with equal flags (the
/// protocol prefers distinct neighbours), keeps one with `req_one`, and caps the count at
/// [`MAX_DESCRIPTORS`]. An export that returns nothing usable gets one descriptor of status 0
/// ("allocated, contents unknown") over the whole range, which is always a truthful answer.
pub fn block_descriptors(extents: &[Extent], len: u32, req_one: bool) -> Vec<(u32, u32)> {
    let runs = extents.iter().map(|e| {
        let mut flags = 0;
        if e.hole {
            flags |= STATE_HOLE;
        }
        if e.zero {
            flags |= STATE_ZERO;
        }
        (e.len, flags)
    });
    clip_descriptors(runs, len, req_one)
}

/// Dirty-bitmap descriptors (`qemu:dirty-bitmap:NAME`: flag 1 = changed) for a request of
/// `len` bytes, clipped and merged like [`block_descriptors`].
pub fn dirty_descriptors(
    runs: &[crate::export::Dirty],
    len: u32,
    req_one: bool,
) -> Vec<(u32, u32)> {
    let runs = runs
        .iter()
        .map(|d| (d.len, u32::from(d.dirty) * STATE_DIRTY));
    clip_descriptors(runs, len, req_one)
}

fn clip_descriptors(
    runs: impl Iterator<Item = (u32, u32)>,
    len: u32,
    req_one: bool,
) -> Vec<(u32, u32)> {
    let mut out: Vec<(u32, u32)> = Vec::new();
    let mut left = len;
    for (run, flags) in runs {
        if left == 0 {
            break;
        }
        let n = run.min(left);
        if n == 0 {
            continue;
        }
        left -= n;
        let full = out.len() >= MAX_DESCRIPTORS;
        match out.last_mut() {
            // Cannot overflow: the descriptors sum to at most `len`.
            Some(last) if last.1 == flags => last.0 += n,
            _ if full => break,
            _ => out.push((n, flags)),
        }
    }
    if out.is_empty() {
        out.push((len, 0));
    }
    if req_one {
        out.truncate(1);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn session() -> Session {
        Session {
            export: "d".into(),
            size: 1 << 20,
            flags: FLAG_HAS_FLAGS,
            structured: true,
            contexts: vec![crate::handshake::MetaContext {
                id: 1,
                name: BASE_ALLOCATION.into(),
            }],
        }
    }

    fn req(kind: u16, flags: u16, offset: u64, len: u32) -> Request {
        Request {
            flags,
            kind,
            cookie: 1,
            offset,
            len,
        }
    }

    fn errno(r: Result<Op, Rejection>) -> (Errno, u32) {
        match r {
            Err(Rejection::Fail { errno, discard, .. }) => (errno, discard),
            other => panic!("expected a failure, got {other:?}"),
        }
    }

    #[test]
    fn read_only_sessions_refuse_every_write_kind() {
        let mut s = session();
        s.flags |= FLAG_READ_ONLY;
        assert_eq!(
            errno(check_request(&req(CMD_WRITE, 0, 0, 512), &s)),
            (Errno::Perm, 512)
        );
        assert_eq!(
            errno(check_request(&req(CMD_TRIM, 0, 0, 512), &s)),
            (Errno::Perm, 0)
        );
        let zero = req(CMD_WRITE_ZEROES, 0, 0, 512);
        assert_eq!(errno(check_request(&zero, &s)), (Errno::Perm, 0));
        assert!(check_request(&req(CMD_READ, 0, 0, 512), &s).is_ok());
        assert!(check_request(&req(CMD_FLUSH, 0, 0, 0), &s).is_ok());
    }

    #[test]
    fn valid_commands() {
        let s = session();
        assert_eq!(
            check_request(&req(CMD_READ, CMD_FLAG_DF, 0, 4096), &s),
            Ok(Op::Read {
                offset: 0,
                len: 4096
            })
        );
        assert_eq!(
            check_request(&req(CMD_WRITE, CMD_FLAG_FUA, 4096, 512), &s),
            Ok(Op::Write {
                offset: 4096,
                len: 512,
                fua: true
            })
        );
        assert_eq!(
            check_request(
                &req(
                    CMD_WRITE_ZEROES,
                    CMD_FLAG_NO_HOLE | CMD_FLAG_FAST_ZERO,
                    0,
                    1
                ),
                &s
            ),
            Ok(Op::WriteZeroes {
                offset: 0,
                len: 1,
                may_punch: false,
                fast: true,
                fua: false
            })
        );
        assert_eq!(
            check_request(&req(CMD_BLOCK_STATUS, CMD_FLAG_REQ_ONE, 0, 1 << 20), &s),
            Ok(Op::BlockStatus {
                offset: 0,
                len: 1 << 20,
                req_one: true,
            })
        );
        assert_eq!(
            check_request(&req(CMD_DISC, 0, 5, 5), &s),
            Ok(Op::Disconnect)
        );
        assert_eq!(
            check_request(&req(CMD_FLUSH, CMD_FLAG_FUA, 0, 0), &s),
            Ok(Op::Flush)
        );
        // The whole export, and zero-length requests at its end, are in range.
        assert!(check_request(&req(CMD_TRIM, 0, 0, 1 << 20), &s).is_ok());
        assert!(check_request(&req(CMD_CACHE, 0, 1 << 20, 0), &s).is_ok());
    }

    #[test]
    fn out_of_range() {
        let s = session();
        assert_eq!(
            errno(check_request(&req(CMD_READ, 0, 1 << 20, 1), &s)),
            (Errno::Inval, 0)
        );
        assert_eq!(
            errno(check_request(&req(CMD_WRITE, 0, (1 << 20) - 1, 2), &s)),
            (Errno::NoSpc, 2)
        );
        assert_eq!(
            errno(check_request(&req(CMD_WRITE_ZEROES, 0, u64::MAX, 1), &s)).0,
            Errno::NoSpc
        );
        assert_eq!(
            errno(check_request(&req(CMD_TRIM, 0, u64::MAX, u32::MAX), &s)).0,
            Errno::Inval
        );
    }

    #[test]
    fn bad_flags_and_commands() {
        let s = session();
        assert_eq!(
            errno(check_request(&req(CMD_WRITE, CMD_FLAG_DF, 0, 8), &s)),
            (Errno::Inval, 8)
        );
        assert_eq!(
            errno(check_request(&req(CMD_READ, 1 << 15, 0, 8), &s)).0,
            Errno::Inval
        );
        assert_eq!(
            errno(check_request(&req(99, 0, 0, 8), &s)),
            (Errno::Inval, 0)
        );
        assert_eq!(
            errno(check_request(&req(CMD_FLUSH, 0, 1, 0), &s)).0,
            Errno::Inval
        );
        let simple = Session {
            structured: false,
            ..session()
        };
        // DF is only advertised with structured replies.
        assert_eq!(
            errno(check_request(&req(CMD_READ, CMD_FLAG_DF, 0, 8), &simple)).0,
            Errno::Inval
        );
        assert_eq!(
            errno(check_request(&req(CMD_BLOCK_STATUS, 0, 0, 8), &simple)).0,
            Errno::Inval
        );
    }

    #[test]
    fn oversized_payloads() {
        let s = Session {
            size: u64::MAX,
            ..session()
        };
        assert!(matches!(
            check_request(&req(CMD_WRITE, 0, 0, MAX_PAYLOAD + 1), &s),
            Err(Rejection::Close { .. })
        ));
        assert_eq!(
            errno(check_request(&req(CMD_READ, 0, 0, MAX_PAYLOAD + 1), &s)).0,
            Errno::Inval
        );
        assert!(check_request(&req(CMD_WRITE_ZEROES, 0, 0, u32::MAX), &s).is_ok());
    }

    #[test]
    fn block_status_needs_context_and_length() {
        let none = Session {
            contexts: Vec::new(),
            ..session()
        };
        assert_eq!(
            errno(check_request(&req(CMD_BLOCK_STATUS, 0, 0, 8), &none)).0,
            Errno::Inval
        );
        assert_eq!(
            errno(check_request(&req(CMD_BLOCK_STATUS, 0, 0, 0), &session())).0,
            Errno::Inval
        );
    }

    fn ext(len: u32, hole: bool) -> Extent {
        Extent {
            len,
            hole,
            zero: hole,
        }
    }

    #[test]
    fn descriptors_clip_merge_and_fallback() {
        let h = STATE_HOLE | STATE_ZERO;
        assert_eq!(
            block_descriptors(
                &[ext(10, false), ext(0, true), ext(5, false), ext(100, true)],
                20,
                false
            ),
            vec![(15, 0), (5, h)]
        );
        assert_eq!(
            block_descriptors(&[ext(10, true), ext(10, false)], 20, true),
            vec![(10, h)]
        );
        assert_eq!(block_descriptors(&[], 7, false), vec![(7, 0)]);
        assert_eq!(block_descriptors(&[ext(0, true)], 7, true), vec![(7, 0)]);
        let many: Vec<Extent> = (0..MAX_DESCRIPTORS + 10)
            .map(|i| ext(1, i % 2 == 0))
            .collect();
        let d = block_descriptors(&many, u32::MAX, false);
        assert_eq!(d.len(), MAX_DESCRIPTORS);
    }
}
