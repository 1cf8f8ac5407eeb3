//! NBD option haggling: the `Negotiation` state machine driven by an arbitrary sequence of
//! options (and arbitrary lookup outcomes) against a small fixed export list. Every reply must
//! be a well-formed option reply for the option asked; an entered transmission phase must
//! describe the export that was looked up. Half the runs require TLS (the TLS handshake
//! itself is OpenSSL's; here it always succeeds).
#![no_main]

use cairn_nbd::handshake::{
    Admit, ExportInfo, Lookup, Negotiation, Outcome, MAX_DISCARD_LEN,
};
use cairn_nbd::proto::*;
use libfuzzer_sys::fuzz_target;

const EXPORTS: [(&str, &str, u64); 3] = [
    ("disk", "main disk", 1 << 20),
    ("tiny", "", 512),
    ("é", "ünïcode", 0),
];

/// The lookup the server would do: "" is the default export, "boom" fails, "secret" is
/// denied, "tiny" is read-only.
fn lookup(name: &str) -> Lookup {
    match name {
        "boom" => return Lookup::Failed("backend failure".into()),
        "secret" => return Lookup::Denied("permission denied".into()),
        _ => {}
    }
    let name = if name.is_empty() { "disk" } else { name };
    match EXPORTS.iter().find(|e| e.0 == name) {
        Some(e) => Lookup::Found(ExportInfo {
            size: e.2,
            multi_conn: e.1.is_empty(),
            description: Some(e.1.to_string()),
            read_only: e.0 == "tiny",
        }),
        None => Lookup::Missing,
    }
}

/// Bytes consumed front to back; runs out as zeros.
struct Input<'a>(&'a [u8]);

impl Input<'_> {
    fn byte(&mut self) -> u8 {
        let Some((&b, rest)) = self.0.split_first() else {
            return 0;
        };
        self.0 = rest;
        b
    }
    fn u16(&mut self) -> u16 {
        u16::from_be_bytes([self.byte(), self.byte()])
    }
    fn u32(&mut self) -> u32 {
        u32::from_be_bytes([self.byte(), self.byte(), self.byte(), self.byte()])
    }
    fn take(&mut self, n: usize) -> &[u8] {
        let (a, b) = self.0.split_at(n.min(self.0.len()));
        self.0 = b;
        a
    }
}

/// Checks that `bytes` is a sequence of option replies to `opt`.
fn check_replies(opt: u32, mut bytes: &[u8]) {
    while !bytes.is_empty() {
        assert!(bytes.len() >= 20);
        assert_eq!(&bytes[0..8], &OPTION_REPLY_MAGIC.to_be_bytes());
        assert_eq!(
            u32::from_be_bytes([bytes[8], bytes[9], bytes[10], bytes[11]]),
            opt
        );
        let len = u32::from_be_bytes([bytes[16], bytes[17], bytes[18], bytes[19]]) as usize;
        assert!(len <= 4 + 4096 + 4096, "reply of {len} bytes");
        bytes = &bytes[20 + len..];
    }
}

fuzz_target!(|data: &[u8]| {
    let mut input = Input(data);
    let first = input.byte();
    let flags = u32::from(first & 7);
    let made = match first & 8 {
        0 => Negotiation::new(flags),
        _ => Negotiation::requiring_tls(flags),
    };
    let Ok(mut n) = made else {
        return;
    };
    while !input.0.is_empty() {
        let b = input.byte();
        // Mostly the defined options (0..=15), sometimes any 32-bit value.
        let opt = if b >= 0xf0 {
            input.u32()
        } else {
            u32::from(b % 16)
        };
        // Mostly short data; sometimes a claimed length past the limits.
        let claimed = match input.byte() {
            0xff => input.u32(),
            0xfe => MAX_DISCARD_LEN,
            _ => u32::from(input.u16() % 512),
        };
        let step = match n.admit(opt, claimed) {
            Admit::Read => {
                let body = input.take(claimed as usize).to_vec();
                n.on_option(opt, &body)
            }
            Admit::Discard => n.on_discarded(opt),
            Admit::Close(_) => return,
        };
        let mut step = step;
        let mut looked_up: Option<Lookup> = None;
        loop {
            step = match step.outcome {
                Outcome::NeedList => {
                    check_replies(opt, &step.replies);
                    let list = EXPORTS
                        .iter()
                        .map(|e| (e.0.to_string(), e.1.to_string()))
                        .collect();
                    n.on_list(if input.byte() == 0xff {
                        Err(cairn_nbd::ExportError::Io("down".into()))
                    } else {
                        Ok(list)
                    })
                }
                Outcome::NeedExport { name, .. } => {
                    assert!(step.replies.is_empty());
                    let found = lookup(&name);
                    looked_up = Some(found.clone());
                    n.on_export(found)
                }
                Outcome::NeedContexts { .. } => {
                    assert!(step.replies.is_empty());
                    let available = (0..input.byte() % 4)
                        .map(|i| format!("qemu:dirty-bitmap:s{i}"))
                        .collect();
                    n.on_contexts(available)
                }
                _ => break,
            };
        }
        match step.outcome {
            Outcome::Go(session) => {
                let Some(Lookup::Found(info)) = looked_up else {
                    panic!("Go without an export")
                };
                assert_eq!(session.size, info.size);
                assert!(session.contexts.is_empty() || session.structured);
                assert_eq!(session.flags & FLAG_SEND_DF != 0, session.structured);
                assert_eq!(session.flags & FLAG_READ_ONLY != 0, info.read_only);
                if opt == OPT_EXPORT_NAME {
                    assert!(step.replies.len() == 10 || step.replies.len() == 134);
                } else {
                    check_replies(opt, &step.replies);
                }
                return;
            }
            Outcome::Continue => check_replies(opt, &step.replies),
            Outcome::StartTls => {
                assert_eq!(opt, OPT_STARTTLS);
                check_replies(opt, &step.replies);
                n.tls_started();
            }
            Outcome::Abort | Outcome::Close(_) => return,
            Outcome::NeedList | Outcome::NeedExport { .. } | Outcome::NeedContexts { .. } => {
                unreachable!()
            }
        }
    }
});
