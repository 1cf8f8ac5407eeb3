//! Running one validated command against the export, and encoding its reply.

use crate::command::{block_descriptors, dirty_descriptors, Op};
use crate::export::{Export, ExportError};
use crate::handshake::MetaContext;
use crate::proto::*;

/// One reply, ready for the writer: a header (and small payload) then optional bulk data.
/// Kept as two buffers so read data is never copied into the header buffer.
#[derive(Debug)]
pub(crate) struct Reply {
    pub head: Vec<u8>,
    pub data: Vec<u8>,
}

/// A successful command's result, before encoding.
#[derive(Debug)]
pub(crate) enum Done {
    /// No payload.
    Empty,
    /// A READ of zero bytes.
    EmptyRead,
    /// Read data starting at `offset` (at least one byte).
    Data { offset: u64, data: Vec<u8> },
    /// Block status descriptors, per selected context (context id, descriptors).
    Status(Vec<(u32, Vec<(u32, u32)>)>),
}

/// A failed command: the error to send and a message for the log and structured replies.
pub(crate) type Failure = (Errno, String);

impl Reply {
    /// Encodes a result; `structured` picks the reply format negotiated for the connection.
    pub fn done(cookie: u64, structured: bool, done: Done) -> Reply {
        match done {
            // A simple reply is allowed for payload-less successes even with structured
            // replies, except that a READ must always get a structured one.
            Done::Empty => Reply::head(simple_reply(cookie, 0).to_vec()),
            // OFFSET_DATA cannot be empty, so an empty structured read is a lone NONE chunk.
            Done::EmptyRead if structured => Reply::head(none_chunk(cookie).to_vec()),
            Done::EmptyRead => Reply::head(simple_reply(cookie, 0).to_vec()),
            Done::Data { offset, data } if structured => Reply {
                head: offset_data_head(cookie, offset, len32(&data)),
                data,
            },
            Done::Data { data, .. } => Reply {
                head: simple_reply(cookie, 0).to_vec(),
                data,
            },
            Done::Status(chunks) => {
                let last = chunks.len().saturating_sub(1);
                let head = chunks
                    .iter()
                    .enumerate()
                    .flat_map(|(i, (context, d))| {
                        block_status_chunk(cookie, *context, d, i == last)
                    })
                    .collect();
                Reply::head(head)
            }
        }
    }

    /// An error reply: a structured ERROR chunk with the message when negotiated (required for
    /// READ, preferred for the rest), else a simple reply with the errno.
    pub fn error(cookie: u64, structured: bool, errno: Errno, message: &str) -> Reply {
        if structured {
            Reply::head(error_chunk(cookie, errno.code(), message))
        } else {
            Reply::head(simple_reply(cookie, errno.code()).to_vec())
        }
    }

    fn head(head: Vec<u8>) -> Reply {
        Reply {
            head,
            data: Vec::new(),
        }
    }
}

fn len32(data: &[u8]) -> u32 {
    u32::try_from(data.len()).unwrap_or(u32::MAX)
}

/// Runs `op` on the export. `payload` is the data of a WRITE (empty otherwise). Zero-length
/// requests succeed without calling the export.
pub(crate) async fn execute<X: Export>(
    export: &X,
    op: Op,
    payload: Vec<u8>,
    contexts: &[MetaContext],
) -> Result<Done, Failure> {
    let fail = |e: ExportError| (errno(&e, &op), e.to_string());
    match op {
        Op::Read { len: 0, .. } => Ok(Done::EmptyRead),
        Op::Read { offset, len } => {
            let data = export.read(offset, len).await.map_err(fail)?;
            if data.len() != len as usize {
                return Err((
                    Errno::Io,
                    format!("export returned {} bytes for a read of {len}", data.len()),
                ));
            }
            Ok(Done::Data { offset, data })
        }
        Op::Write { len: 0, .. } => Ok(Done::Empty),
        Op::Write { offset, fua, .. } => {
            export.write(offset, payload, fua).await.map_err(fail)?;
            Ok(Done::Empty)
        }
        Op::Flush => {
            export.flush().await.map_err(fail)?;
            Ok(Done::Empty)
        }
        Op::Trim { len: 0, .. } => Ok(Done::Empty),
        Op::Trim { offset, len, fua } => match export.trim(offset, len).await {
            // A trim is a hint: an export that cannot discard has honoured it by doing nothing.
            Err(ExportError::NotSupported(_)) => Ok(Done::Empty),
            Err(e) => Err(fail(e)),
            // The export's trim has no FUA; a flush afterwards gives the same guarantee.
            Ok(()) if fua => export.flush().await.map(|()| Done::Empty).map_err(fail),
            Ok(()) => Ok(Done::Empty),
        },
        Op::Cache { .. } => Ok(Done::Empty),
        Op::WriteZeroes { len: 0, .. } => Ok(Done::Empty),
        Op::WriteZeroes {
            offset,
            len,
            may_punch,
            fast,
            fua,
        } => {
            let r = export.write_zeroes(offset, len, may_punch, fast, fua).await;
            r.map(|()| Done::Empty).map_err(fail)
        }
        Op::BlockStatus {
            offset,
            len,
            req_one,
        } => {
            let mut chunks = Vec::with_capacity(contexts.len());
            for c in contexts {
                let descriptors = match c.name.strip_prefix(DIRTY_BITMAP_PREFIX) {
                    Some(bitmap) => {
                        let runs = export
                            .dirty_status(bitmap, offset, len)
                            .await
                            .map_err(fail)?;
                        dirty_descriptors(&runs, len, req_one)
                    }
                    None => {
                        let extents = export.block_status(offset, len).await.map_err(fail)?;
                        block_descriptors(&extents, len, req_one)
                    }
                };
                chunks.push((c.id, descriptors));
            }
            Ok(Done::Status(chunks))
        }
        // Handled by the reader, which stops reading; never spawned.
        Op::Disconnect => Ok(Done::Empty),
    }
}

/// The NBD error for an export error. ENOTSUP is only meaningful (and only allowed by the
/// protocol) as the answer to a FAST_ZERO request; elsewhere "cannot do this" is EINVAL.
fn errno(e: &ExportError, op: &Op) -> Errno {
    match e {
        ExportError::Io(_) => Errno::Io,
        ExportError::NoSpace(_) => Errno::NoSpc,
        ExportError::Invalid(_) => Errno::Inval,
        ExportError::Denied(_) => Errno::Perm,
        ExportError::NotSupported(_) if matches!(op, Op::WriteZeroes { fast: true, .. }) => {
            Errno::NotSup
        }
        ExportError::NotSupported(_) => Errno::Inval,
    }
}
