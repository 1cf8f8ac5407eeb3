//! Golden files: the pinned bytes of every persistent and wire format version
//! (`docs/format/golden.md`). Shared by the crates' golden tests, each of which includes this
//! file with `#[path]` (no crate, no dependency), and compiled only into tests.
//!
//! A test builds a value of every structure (every variant of a record type) with every field
//! set, encodes it, and hands the bytes here with a check that decodes bytes back and compares
//! the result with the value. [`Golden::finish`] then compares the bytes with the golden file
//! `testdata/<file>` of the crate (byte for byte: a reordered field or variant fails) and runs
//! each check on the golden bytes. With `CAIRN_BLESS_GOLDEN=1` it writes the file instead.
//!
//! A golden file holds one structure as its bytes ([`Golden::raw`]), or several
//! ([`Golden::new`]) as entries back to back: a u16 little-endian name length, the name
//! (UTF-8), a u32 little-endian length, the bytes.

// Not every crate uses every helper.
#![allow(dead_code)]

use std::fmt::Debug;
use std::path::PathBuf;

/// The environment variable that makes [`Golden::finish`] write the golden files.
pub const BLESS_VAR: &str = "CAIRN_BLESS_GOLDEN";

/// Decodes golden bytes and compares the result with the value they were made from.
pub type Check = Box<dyn Fn(&[u8]) -> Result<(), String>>;

/// The entries of one golden file.
pub struct Golden {
    file: String,
    raw: bool,
    entries: Vec<(String, Vec<u8>, Check)>,
    /// Entries whose encoding is not repeatable (a random nonce): the golden bytes are only
    /// decoded, and blessing keeps them while they still decode.
    pinned: Vec<String>,
}

impl Golden {
    /// A golden file of several structures (`testdata/<file>`).
    pub fn new(file: &str) -> Golden {
        Golden {
            file: file.to_string(),
            raw: false,
            entries: Vec::new(),
            pinned: Vec::new(),
        }
    }

    /// A golden file of one structure, its bytes as they are (`testdata/<file>`).
    pub fn raw(
        file: &str,
        bytes: Vec<u8>,
        check: impl Fn(&[u8]) -> Result<(), String> + 'static,
    ) -> Golden {
        let mut g = Golden::new(file);
        g.raw = true;
        g.entries.push((file.to_string(), bytes, Box::new(check)));
        g
    }

    /// Adds the structure `name` (its bytes as this build encodes them).
    pub fn add(
        &mut self,
        name: impl Into<String>,
        bytes: Vec<u8>,
        check: impl Fn(&[u8]) -> Result<(), String> + 'static,
    ) {
        assert!(!self.raw, "a raw golden file holds one structure");
        let name = name.into();
        assert!(
            self.entries.iter().all(|e| e.0 != name),
            "{}: entry {name:?} added twice",
            self.file
        );
        self.entries.push((name, bytes, Box::new(check)));
    }

    /// Adds the structure `name` whose encoding changes every time (sealed with a random
    /// nonce): `bytes` are one encoding, written when blessing a file that lacks the entry or
    /// whose entry no longer decodes; otherwise the golden bytes are only decoded.
    pub fn add_pinned(
        &mut self,
        name: impl Into<String>,
        bytes: Vec<u8>,
        check: impl Fn(&[u8]) -> Result<(), String> + 'static,
    ) {
        let name = name.into();
        self.pinned.push(name.clone());
        self.add(name, bytes, check);
    }

    /// Compares the entries with the golden file (or writes it, when blessing) and decodes
    /// the golden bytes of each; panics with every difference found.
    pub fn finish(mut self) {
        let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("testdata")
            .join(&self.file);
        let shown = format!(
            "{}/testdata/{}",
            env!("CARGO_MANIFEST_DIR")
                .rsplit_once("/crates/")
                .map(|(_, c)| format!("crates/{c}"))
                .unwrap_or_else(|| env!("CARGO_MANIFEST_DIR").to_string()),
            self.file
        );
        if let Some(old) = std::fs::read(&path).ok().and_then(|b| parse(&b).ok()) {
            // A pinned entry is its golden bytes, while they decode.
            for (name, bytes, check) in &mut self.entries {
                let kept = old.iter().find(|(n, _)| n == name);
                if let Some((_, b)) =
                    kept.filter(|(_, b)| self.pinned.contains(name) && check(b).is_ok())
                {
                    *bytes = b.clone();
                }
            }
        }
        let ours = self.encode();
        let bless = std::env::var(BLESS_VAR).is_ok_and(|v| v == "1");
        let golden = if bless {
            std::fs::create_dir_all(path.parent().expect("testdata has a parent")).unwrap();
            std::fs::write(&path, &ours).unwrap();
            ours.clone()
        } else {
            match std::fs::read(&path) {
                Ok(b) => b,
                Err(e) => panic!(
                    "{shown}: cannot read the golden file ({e}); if the format is new, bless it \
                     with {BLESS_VAR}=1"
                ),
            }
        };
        let mut problems = Vec::new();
        let golden_entries = if self.raw {
            vec![(self.file.clone(), golden.clone())]
        } else {
            match parse(&golden) {
                Ok(e) => e,
                Err(why) => {
                    problems.push(format!("the golden file is not a list of entries: {why}"));
                    Vec::new()
                }
            }
        };
        for (name, bytes, _) in &self.entries {
            match golden_entries.iter().find(|(n, _)| n == name) {
                None => problems.push(format!("{name}: not in the golden file")),
                Some((_, g)) if g != bytes => problems.push(format!("{name}: {}", diff(g, bytes))),
                Some(_) => {}
            }
        }
        for (name, _) in &golden_entries {
            if !self.entries.iter().any(|e| &e.0 == name) {
                problems.push(format!("{name}: in the golden file, no longer written"));
            }
        }
        // The same entries in another order still make another file.
        if problems.is_empty() && golden != ours {
            problems.push("entries in another order than the golden file's".into());
        }
        for (name, _, check) in &self.entries {
            if let Some((_, g)) = golden_entries.iter().find(|(n, _)| n == name) {
                if let Err(why) = check(g) {
                    problems.push(format!("{name}: decoding the golden bytes: {why}"));
                }
            }
        }
        if !problems.is_empty() {
            panic!(
                "{shown} does not match this build's encoding:\n  {}\nif the format change is \
                 intended, bump the version and bless with {BLESS_VAR}=1 (a new golden file \
                 for the new version; keep the old one while old bytes are still read)",
                problems.join("\n  ")
            );
        }
    }

    fn encode(&self) -> Vec<u8> {
        if self.raw {
            return self.entries[0].1.clone();
        }
        let mut v = Vec::new();
        for (name, bytes, _) in &self.entries {
            v.extend_from_slice(&(name.len() as u16).to_le_bytes());
            v.extend_from_slice(name.as_bytes());
            v.extend_from_slice(&(bytes.len() as u32).to_le_bytes());
            v.extend_from_slice(bytes);
        }
        v
    }
}

/// Entry `name` of the golden file `testdata/<file>` (for a check that needs a structure
/// written beside the one it decodes).
pub fn entry(file: &str, name: &str) -> Result<Vec<u8>, String> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("testdata")
        .join(file);
    let b = std::fs::read(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    parse(&b)?
        .into_iter()
        .find(|(n, _)| n == name)
        .map(|(_, b)| b)
        .ok_or_else(|| format!("{file} has no entry {name}"))
}

/// The entries of a golden file of several structures.
pub fn parse(mut b: &[u8]) -> Result<Vec<(String, Vec<u8>)>, String> {
    let mut out = Vec::new();
    let take = |b: &mut &[u8], n: usize| -> Result<Vec<u8>, String> {
        if b.len() < n {
            return Err(format!("ends {} bytes early", n - b.len()));
        }
        let (head, rest) = b.split_at(n);
        *b = rest;
        Ok(head.to_vec())
    };
    while !b.is_empty() {
        let n = take(&mut b, 2)?;
        let name = take(&mut b, u16::from_le_bytes([n[0], n[1]]) as usize)?;
        let name = String::from_utf8(name).map_err(|e| e.to_string())?;
        let n = take(&mut b, 4)?;
        let len = u32::from_le_bytes([n[0], n[1], n[2], n[3]]) as usize;
        out.push((name, take(&mut b, len)?));
    }
    Ok(out)
}

/// Where two encodings first differ.
fn diff(golden: &[u8], ours: &[u8]) -> String {
    let at = golden
        .iter()
        .zip(ours)
        .position(|(a, b)| a != b)
        .unwrap_or(golden.len().min(ours.len()));
    let byte = |b: &[u8]| b.get(at).map_or("end".to_string(), |x| format!("{x:#04x}"));
    format!(
        "first difference at byte {at} (golden {}, this build {}; golden {} bytes, this build {})",
        byte(golden),
        byte(ours),
        golden.len(),
        ours.len()
    )
}

/// `Ok` when `got` equals `want`; otherwise the first field (line of their pretty `Debug`)
/// that differs.
pub fn same<T: PartialEq + Debug>(got: &T, want: &T) -> Result<(), String> {
    if got == want {
        return Ok(());
    }
    Err(debug_diff(&format!("{got:#?}"), &format!("{want:#?}")))
}

/// `Ok` when the pretty `Debug` of `got` and `want` agree (for types without `PartialEq`:
/// every field is printed); otherwise the first line that differs.
pub fn same_debug<T: Debug>(got: &T, want: &T) -> Result<(), String> {
    let (g, w) = (format!("{got:#?}"), format!("{want:#?}"));
    if g == w {
        return Ok(());
    }
    Err(debug_diff(&g, &w))
}

fn debug_diff(got: &str, want: &str) -> String {
    let (g, w): (Vec<&str>, Vec<&str>) = (got.lines().collect(), want.lines().collect());
    let at = g
        .iter()
        .zip(&w)
        .position(|(a, b)| a != b)
        .unwrap_or(g.len().min(w.len()));
    format!(
        "the decoded value differs from the expected one at line {} of its Debug: got `{}`, \
         expected `{}`",
        at + 1,
        g.get(at).map_or("(end)", |l| l.trim()),
        w.get(at).map_or("(end)", |l| l.trim())
    )
}
