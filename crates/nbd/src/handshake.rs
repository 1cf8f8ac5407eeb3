//! Option haggling (fixed newstyle) as a pure state machine. The async driver reads each
//! option, asks [`Negotiation::admit`] whether to read or skip its data, feeds it to
//! [`Negotiation::on_option`], writes [`Step::replies`] and acts on [`Step::outcome`]. Looking
//! exports up is the driver's job (it is async): the machine asks for it with
//! [`Outcome::NeedList`] / [`Outcome::NeedExport`] and is given the answer through
//! [`Negotiation::on_list`] / [`Negotiation::on_export`]. The fuzzer drives the same machine
//! with a fixed export list.

use crate::command::{Session, MAX_PAYLOAD};
use crate::option_data::{parse_info_request, parse_meta_request, parse_string, MAX_NAME_LEN};
use crate::proto::*;

/// Option data up to this size is read and parsed.
pub const MAX_OPTION_LEN: u32 = 64 << 10;
/// Option data above [`MAX_OPTION_LEN`] and up to this size is skipped and answered with
/// NBD_REP_ERR_TOO_BIG; anything larger closes the connection (not worth reading).
pub const MAX_DISCARD_LEN: u32 = 16 << 20;
/// Options per connection before the server gives up on the client.
pub const MAX_OPTIONS: u32 = 1000;
/// Id of base:allocation in NBD_OPT_SET_META_CONTEXT replies and block status chunks.
pub const BASE_ALLOCATION_ID: u32 = 1;
/// The namespace of the contexts other than base:allocation (QEMU's `qemu:dirty-bitmap:`).
pub const QEMU_NAMESPACE: &str = "qemu:";
/// Most contexts besides base:allocation one export may offer.
pub const MAX_CONTEXTS: usize = 256;

/// A metadata context selected for a connection: its id in block status replies and name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MetaContext {
    /// The id block status chunks carry (base:allocation is 1).
    pub id: u32,
    /// Its full name (`base:allocation`, `qemu:dirty-bitmap:NAME`).
    pub name: String,
}
/// Advertised block size constraints: any alignment works, 4 KiB is efficient, and READ/WRITE
/// payloads are capped at [`MAX_PAYLOAD`].
pub const BLOCK_SIZE_MIN: u32 = 1;
/// See [`BLOCK_SIZE_MIN`].
pub const BLOCK_SIZE_PREFERRED: u32 = 4096;

/// Why the handshake ended without transmission.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HandshakeError {
    /// The client flags have bits this server does not know.
    #[error("unknown client flags {0:#x}")]
    BadClientFlags(u32),
    /// More than [`MAX_OPTIONS`] options.
    #[error("more than {MAX_OPTIONS} options")]
    TooManyOptions,
    /// Option data larger than [`MAX_DISCARD_LEN`].
    #[error("option {opt} with {len} bytes of data")]
    OptionTooLong {
        /// The option.
        opt: u32,
        /// Its announced data length.
        len: u32,
    },
    /// NBD_OPT_EXPORT_NAME with a name that is too long or not a valid string.
    #[error("NBD_OPT_EXPORT_NAME with an invalid name")]
    BadExportName,
    /// NBD_OPT_EXPORT_NAME for an export that does not exist or may not be opened (no error
    /// reply is possible).
    #[error("NBD_OPT_EXPORT_NAME for export {0:?}, which cannot be opened")]
    UnknownExport(String),
    /// NBD_OPT_EXPORT_NAME before TLS on a server that requires it (no error reply is
    /// possible).
    #[error("NBD_OPT_EXPORT_NAME without TLS, which this server requires")]
    TlsRequired,
    /// The driver called the machine out of turn (a bug, not the client's doing).
    #[error("negotiation driven out of order: {0}")]
    OutOfOrder(&'static str),
}

/// What the driver should do after writing [`Step::replies`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Read the next option.
    Continue,
    /// The client aborted (NBD_OPT_ABORT, acknowledged): close.
    Abort,
    /// Close the connection now (hard disconnect).
    Close(HandshakeError),
    /// Call [`Exports::list`](crate::Exports::list), then [`Negotiation::on_list`].
    NeedList,
    /// Call [`Exports::meta_contexts`](crate::Exports::meta_contexts) for `export`, then
    /// [`Negotiation::on_contexts`].
    NeedContexts {
        /// Export name.
        export: String,
    },
    /// Open the export, then call [`Negotiation::on_export`]; `description` says whether its
    /// description (from the export list) is wanted.
    NeedExport {
        /// Export name.
        name: String,
        /// NBD_INFO_DESCRIPTION was requested.
        description: bool,
    },
    /// Enter transmission with the opened export.
    Go(Session),
    /// NBD_OPT_STARTTLS was acknowledged: run the TLS handshake as server, then call
    /// [`Negotiation::tls_started`] and read the next option over TLS.
    StartTls,
}

/// Bytes to send, then what to do next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Step {
    /// Option replies (or the NBD_OPT_EXPORT_NAME reply) to write, in order.
    pub replies: Vec<u8>,
    /// What the driver does once they are written.
    pub outcome: Outcome,
}

/// What the driver learned about an export it opened.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExportInfo {
    /// Size in bytes.
    pub size: u64,
    /// [`Export::multi_conn`](crate::Export::multi_conn).
    pub multi_conn: bool,
    /// Description from the export list, if asked for and found.
    pub description: Option<String>,
    /// This client may only read it (NBD_FLAG_READ_ONLY; writes fail with EPERM).
    pub read_only: bool,
}

/// The answer to an [`Outcome::NeedExport`] lookup.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Lookup {
    /// The export, opened.
    Found(ExportInfo),
    /// No export has this name.
    Missing,
    /// This client may not open it (NBD_REP_ERR_POLICY, with the reason).
    Denied(String),
    /// The lookup failed (NBD_REP_ERR_UNKNOWN, with the reason).
    Failed(String),
}

/// Where this connection stands with TLS.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Tls {
    /// The server offers no TLS: NBD_OPT_STARTTLS is refused by policy.
    Off,
    /// Every option but NBD_OPT_STARTTLS and NBD_OPT_ABORT waits for TLS.
    Required,
    /// The connection runs over TLS.
    Started,
}

/// Whether the client admitted an option's data.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Admit {
    /// Read the data and call [`Negotiation::on_option`].
    Read,
    /// Skip the data and call [`Negotiation::on_discarded`].
    Discard,
    /// Close the connection.
    Close(HandshakeError),
}

/// A lookup the machine is waiting for.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Pending {
    List,
    Meta {
        opt: u32,
        req: crate::option_data::MetaRequest,
    },
    Export {
        opt: u32,
        name: String,
        want_name: bool,
        want_description: bool,
    },
}

/// The option-haggling state of one connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Negotiation {
    no_zeroes: bool,
    structured: bool,
    /// Export for which the last NBD_OPT_SET_META_CONTEXT selected contexts, and those.
    meta_export: Option<String>,
    selected: Vec<MetaContext>,
    options: u32,
    pending: Option<Pending>,
    tls: Tls,
}

impl Step {
    fn new(replies: Vec<u8>, outcome: Outcome) -> Step {
        Step { replies, outcome }
    }

    fn reply(opt: u32, kind: u32, data: &[u8]) -> Step {
        let mut replies = Vec::new();
        put_option_reply(&mut replies, opt, kind, data);
        Step::new(replies, Outcome::Continue)
    }

    fn ack(opt: u32, outcome: Outcome) -> Step {
        let mut replies = Vec::new();
        put_option_reply(&mut replies, opt, REP_ACK, &[]);
        Step::new(replies, outcome)
    }

    fn error(opt: u32, kind: u32, message: &str) -> Step {
        let mut replies = Vec::new();
        put_option_error(&mut replies, opt, kind, message);
        Step::new(replies, Outcome::Continue)
    }

    fn close(e: HandshakeError) -> Step {
        Step::new(Vec::new(), Outcome::Close(e))
    }
}

/// Transmission flags for an export: everything the server implements, DF only with structured
/// replies (the protocol requires that), multi-conn only if the export allows it, read-only
/// when the client may not write.
pub fn transmission_flags(structured: bool, multi_conn: bool, read_only: bool) -> u16 {
    let mut f = FLAG_HAS_FLAGS
        | FLAG_SEND_FLUSH
        | FLAG_SEND_FUA
        | FLAG_SEND_TRIM
        | FLAG_SEND_WRITE_ZEROES
        | FLAG_SEND_CACHE
        | FLAG_SEND_FAST_ZERO;
    if structured {
        f |= FLAG_SEND_DF;
    }
    if multi_conn {
        f |= FLAG_CAN_MULTI_CONN;
    }
    if read_only {
        f |= FLAG_READ_ONLY;
    }
    f
}

impl Negotiation {
    /// Starts haggling once the client flags are read; unknown flags close the connection.
    /// A client without NBD_FLAG_C_FIXED_NEWSTYLE is served anyway (the protocol allows it):
    /// such a client only ever sends NBD_OPT_EXPORT_NAME, which is answered the same way.
    pub fn new(client_flags: u32) -> Result<Negotiation, HandshakeError> {
        if client_flags & !(FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES) != 0 {
            return Err(HandshakeError::BadClientFlags(client_flags));
        }
        Ok(Negotiation {
            no_zeroes: client_flags & FLAG_C_NO_ZEROES != 0,
            structured: false,
            meta_export: None,
            selected: Vec::new(),
            options: 0,
            pending: None,
            tls: Tls::Off,
        })
    }

    /// Like [`new`](Negotiation::new) on a server that requires TLS: until the client has
    /// negotiated NBD_OPT_STARTTLS, every other option is answered NBD_REP_ERR_TLS_REQD (and
    /// NBD_OPT_EXPORT_NAME, which has no error reply, closes the connection).
    pub fn requiring_tls(client_flags: u32) -> Result<Negotiation, HandshakeError> {
        let mut n = Negotiation::new(client_flags)?;
        n.tls = Tls::Required;
        Ok(n)
    }

    /// The TLS handshake succeeded: option haggling starts over on the secure channel. What
    /// was negotiated in the clear (structured replies, a metadata context) is forgotten, as
    /// the protocol requires, and must be negotiated again.
    pub fn tls_started(&mut self) {
        self.structured = false;
        self.meta_export = None;
        self.selected.clear();
        self.pending = None;
        self.tls = Tls::Started;
    }

    /// Counts an option and decides, from its announced length, whether to read its data.
    pub fn admit(&mut self, opt: u32, len: u32) -> Admit {
        self.options = self.options.saturating_add(1);
        if self.options > MAX_OPTIONS {
            Admit::Close(HandshakeError::TooManyOptions)
        } else if len > MAX_DISCARD_LEN {
            Admit::Close(HandshakeError::OptionTooLong { opt, len })
        } else if len > MAX_OPTION_LEN {
            Admit::Discard
        } else {
            Admit::Read
        }
    }

    /// Answers an option whose data was too large to read.
    pub fn on_discarded(&mut self, opt: u32) -> Step {
        if opt == OPT_EXPORT_NAME {
            // No error reply exists for NBD_OPT_EXPORT_NAME.
            return Step::close(HandshakeError::BadExportName);
        }
        Step::error(opt, REP_ERR_TOO_BIG, "option data too large")
    }

    /// Handles one option with its data.
    pub fn on_option(&mut self, opt: u32, data: &[u8]) -> Step {
        if self.pending.is_some() {
            return Step::close(HandshakeError::OutOfOrder(
                "option while a lookup is pending",
            ));
        }
        if self.tls == Tls::Required {
            return self.before_tls(opt, data);
        }
        match opt {
            OPT_EXPORT_NAME => self.export_name(data),
            OPT_ABORT => Step::ack(opt, Outcome::Abort),
            OPT_LIST if !data.is_empty() => {
                Step::error(opt, REP_ERR_INVALID, "NBD_OPT_LIST takes no data")
            }
            OPT_LIST => {
                self.pending = Some(Pending::List);
                Step::new(Vec::new(), Outcome::NeedList)
            }
            OPT_STARTTLS if self.tls == Tls::Started => {
                Step::error(opt, REP_ERR_INVALID, "TLS is already in use")
            }
            OPT_STARTTLS => Step::error(opt, REP_ERR_POLICY, "TLS is not enabled on this server"),
            OPT_INFO | OPT_GO => self.info(opt, data),
            OPT_STRUCTURED_REPLY if !data.is_empty() => Step::error(
                opt,
                REP_ERR_INVALID,
                "NBD_OPT_STRUCTURED_REPLY takes no data",
            ),
            OPT_STRUCTURED_REPLY => {
                self.structured = true;
                Step::reply(opt, REP_ACK, &[])
            }
            OPT_LIST_META_CONTEXT | OPT_SET_META_CONTEXT => self.meta_context(opt, data),
            OPT_EXTENDED_HEADERS => {
                Step::error(opt, REP_ERR_UNSUP, "extended headers are not implemented")
            }
            _ => Step::error(opt, REP_ERR_UNSUP, "unknown option"),
        }
    }

    /// Options on a server that requires TLS, before the client started it.
    fn before_tls(&mut self, opt: u32, data: &[u8]) -> Step {
        match opt {
            OPT_STARTTLS if !data.is_empty() => {
                Step::error(opt, REP_ERR_INVALID, "NBD_OPT_STARTTLS takes no data")
            }
            OPT_STARTTLS => Step::ack(opt, Outcome::StartTls),
            OPT_ABORT => Step::ack(opt, Outcome::Abort),
            OPT_EXPORT_NAME => Step::close(HandshakeError::TlsRequired),
            _ => Step::error(
                opt,
                REP_ERR_TLS_REQD,
                "this server requires TLS: negotiate NBD_OPT_STARTTLS first",
            ),
        }
    }

    fn export_name(&mut self, data: &[u8]) -> Step {
        match parse_string(data) {
            Ok(name) => self.need_export(OPT_EXPORT_NAME, name, false, false),
            Err(_) => Step::close(HandshakeError::BadExportName),
        }
    }

    fn info(&mut self, opt: u32, data: &[u8]) -> Step {
        let req = match parse_info_request(data) {
            Ok(r) => r,
            Err(e) => return Step::error(opt, REP_ERR_INVALID, &e.to_string()),
        };
        let want_name = req.items.contains(&INFO_NAME);
        let description = req.items.contains(&INFO_DESCRIPTION);
        self.need_export(opt, req.name, want_name, description)
    }

    fn need_export(&mut self, opt: u32, name: String, want_name: bool, description: bool) -> Step {
        self.pending = Some(Pending::Export {
            opt,
            name: name.clone(),
            want_name,
            want_description: description,
        });
        Step::new(Vec::new(), Outcome::NeedExport { name, description })
    }

    /// Continues NBD_OPT_LIST with the export list (or the reason it could not be had).
    pub fn on_list(&mut self, list: Result<Vec<(String, String)>, crate::ExportError>) -> Step {
        if self.pending.take() != Some(Pending::List) {
            return Step::close(HandshakeError::OutOfOrder("export list not asked for"));
        }
        let list = match list {
            Ok(l) => l,
            Err(e) => {
                return Step::error(
                    OPT_LIST,
                    REP_ERR_PLATFORM,
                    &format!("cannot list exports: {e}"),
                )
            }
        };
        let mut replies = Vec::new();
        for (name, description) in &list {
            if name.len() > MAX_NAME_LEN {
                continue; // Not a name a client could ask for.
            }
            let description = clip(description);
            let mut data = Vec::with_capacity(4 + name.len() + description.len());
            data.extend_from_slice(&(name.len() as u32).to_be_bytes());
            data.extend_from_slice(name.as_bytes());
            data.extend_from_slice(description.as_bytes());
            put_option_reply(&mut replies, OPT_LIST, REP_SERVER, &data);
        }
        put_option_reply(&mut replies, OPT_LIST, REP_ACK, &[]);
        Step::new(replies, Outcome::Continue)
    }

    /// Continues NBD_OPT_EXPORT_NAME/INFO/GO with the looked-up export.
    pub fn on_export(&mut self, found: Lookup) -> Step {
        let Some(Pending::Export {
            opt,
            name,
            want_name,
            want_description,
        }) = self.pending.take()
        else {
            return Step::close(HandshakeError::OutOfOrder("export not asked for"));
        };
        let info = match (opt, found) {
            (_, Lookup::Found(info)) => info,
            (OPT_EXPORT_NAME, _) => return Step::close(HandshakeError::UnknownExport(name)),
            (_, Lookup::Missing) => {
                return Step::error(opt, REP_ERR_UNKNOWN, &format!("no export named {name:?}"))
            }
            (_, Lookup::Denied(why)) => return Step::error(opt, REP_ERR_POLICY, &why),
            (_, Lookup::Failed(e)) => {
                return Step::error(
                    opt,
                    REP_ERR_UNKNOWN,
                    &format!("cannot open export {name:?}: {e}"),
                )
            }
        };
        let session = self.session(name, &info);
        if opt == OPT_EXPORT_NAME {
            let replies = export_name_reply(session.size, session.flags, self.no_zeroes);
            return Step::new(replies, Outcome::Go(session));
        }
        let mut replies = Vec::new();
        put_info_replies(
            &mut replies,
            opt,
            &session,
            want_name,
            info.description.as_deref().filter(|_| want_description),
        );
        put_option_reply(&mut replies, opt, REP_ACK, &[]);
        let outcome = if opt == OPT_GO {
            Outcome::Go(session)
        } else {
            Outcome::Continue
        };
        Step::new(replies, outcome)
    }

    fn session(&self, export: String, info: &ExportInfo) -> Session {
        let contexts = if self.structured && self.meta_export.as_deref() == Some(export.as_str()) {
            self.selected.clone()
        } else {
            Vec::new()
        };
        Session {
            flags: transmission_flags(self.structured, info.multi_conn, info.read_only),
            size: info.size,
            structured: self.structured,
            contexts,
            export,
        }
    }

    /// NBD_OPT_LIST_META_CONTEXT and NBD_OPT_SET_META_CONTEXT. base:allocation exists for
    /// every export; other contexts (`qemu:dirty-bitmap:NAME`) come from the export set
    /// ([`Outcome::NeedContexts`]), asked only when a query names the `qemu:` namespace or a
    /// LIST asks for everything.
    fn meta_context(&mut self, opt: u32, data: &[u8]) -> Step {
        if opt == OPT_SET_META_CONTEXT {
            // A SET replaces the previous selection even when it fails.
            self.meta_export = None;
            self.selected.clear();
        }
        if !self.structured {
            return Step::error(opt, REP_ERR_INVALID, "negotiate structured replies first");
        }
        let req = match parse_meta_request(data) {
            Ok(r) => r,
            Err(e) => return Step::error(opt, REP_ERR_INVALID, &e.to_string()),
        };
        let list_all = opt == OPT_LIST_META_CONTEXT && req.queries.is_empty();
        if list_all || req.queries.iter().any(|q| q.starts_with(QEMU_NAMESPACE)) {
            let export = req.export.clone();
            self.pending = Some(Pending::Meta { opt, req });
            return Step::new(Vec::new(), Outcome::NeedContexts { export });
        }
        self.meta_reply(opt, req, &[])
    }

    /// Continues a metadata-context option with the contexts the export offers besides
    /// base:allocation (none when it cannot be looked up: the client still gets those).
    pub fn on_contexts(&mut self, available: Vec<String>) -> Step {
        let Some(Pending::Meta { opt, req }) = self.pending.take() else {
            return Step::close(HandshakeError::OutOfOrder("contexts not asked for"));
        };
        self.meta_reply(opt, req, &available)
    }

    fn meta_reply(
        &mut self,
        opt: u32,
        req: crate::option_data::MetaRequest,
        available: &[String],
    ) -> Step {
        let set = opt == OPT_SET_META_CONTEXT;
        // Ids: base:allocation is 1, the export's other contexts follow in its order.
        let all: Vec<MetaContext> = std::iter::once(BASE_ALLOCATION.to_string())
            .chain(available.iter().take(MAX_CONTEXTS).cloned())
            .enumerate()
            .map(|(i, name)| MetaContext {
                id: BASE_ALLOCATION_ID + i as u32,
                name,
            })
            .collect();
        let wanted = |c: &MetaContext| {
            req.queries.iter().any(|q| {
                q == &c.name
                    // Namespace and leaf-prefix wildcards are for listing only.
                    || (!set && q.ends_with(':') && c.name.starts_with(q.as_str()))
            }) || (!set && req.queries.is_empty())
        };
        let chosen: Vec<MetaContext> = all.into_iter().filter(wanted).collect();
        let mut replies = Vec::new();
        for c in &chosen {
            // LIST replies carry a reserved id of 0.
            let id = if set { c.id } else { 0 };
            let mut d = id.to_be_bytes().to_vec();
            d.extend_from_slice(c.name.as_bytes());
            put_option_reply(&mut replies, opt, REP_META_CONTEXT, &d);
        }
        if set && !chosen.is_empty() {
            self.meta_export = Some(req.export);
            self.selected = chosen;
        }
        put_option_reply(&mut replies, opt, REP_ACK, &[]);
        Step::new(replies, Outcome::Continue)
    }
}

/// NBD_INFO_EXPORT (always), NBD_INFO_BLOCK_SIZE (always: the server has a maximum payload the
/// client should know even if it did not ask), NAME and DESCRIPTION when asked for.
fn put_info_replies(
    out: &mut Vec<u8>,
    opt: u32,
    s: &Session,
    want_name: bool,
    description: Option<&str>,
) {
    let mut export = INFO_EXPORT.to_be_bytes().to_vec();
    export.extend_from_slice(&s.size.to_be_bytes());
    export.extend_from_slice(&s.flags.to_be_bytes());
    put_option_reply(out, opt, REP_INFO, &export);

    let mut bs = INFO_BLOCK_SIZE.to_be_bytes().to_vec();
    for v in [BLOCK_SIZE_MIN, BLOCK_SIZE_PREFERRED, MAX_PAYLOAD] {
        bs.extend_from_slice(&v.to_be_bytes());
    }
    put_option_reply(out, opt, REP_INFO, &bs);

    if want_name {
        let mut n = INFO_NAME.to_be_bytes().to_vec();
        n.extend_from_slice(s.export.as_bytes());
        put_option_reply(out, opt, REP_INFO, &n);
    }
    if let Some(d) = description {
        let mut n = INFO_DESCRIPTION.to_be_bytes().to_vec();
        n.extend_from_slice(clip(d).as_bytes());
        put_option_reply(out, opt, REP_INFO, &n);
    }
}

/// Cuts a string to the protocol's 4096-byte limit on a character boundary.
fn clip(s: &str) -> &str {
    let mut end = s.len().min(MAX_NAME_LEN);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

#[cfg(test)]
mod tests;
