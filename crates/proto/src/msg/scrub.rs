//! Scrub: the primary of a PG asks every member for a digest of each object in a range of
//! names and compares them; an operator (or the OSD's own timer) asks a primary to scrub a PG.

use super::call::Call;
use serde::{Deserialize, Serialize};

/// Primary -> member: [`PgScrub`]; reply [`PG_SCRUB_MAP`].
pub const PG_SCRUB: u16 = 228;
/// Reply: [`PgScrubMap`].
pub const PG_SCRUB_MAP: u16 = 229;
/// Operator -> the PG's primary: [`ScrubPg`]; reply [`SCRUB_REPORT`] once the scrub is done.
pub const SCRUB_PG: u16 = 230;
/// Reply: [`ScrubReport`].
pub const SCRUB_REPORT: u16 = 231;

/// [`PG_SCRUB`] answered by [`PG_SCRUB_MAP`].
pub const SCRUB_MAP_CALL: Call<PgScrub, PgScrubMap> =
    Call::new(PG_SCRUB, PG_SCRUB_MAP, "pg scrub map");
/// [`SCRUB_PG`] answered by [`SCRUB_REPORT`].
pub const SCRUB_PG_CALL: Call<ScrubPg, ScrubReport> =
    Call::new(SCRUB_PG, SCRUB_REPORT, "scrub report");

/// Most objects one scrub map describes.
pub const MAX_SCRUB_OBJECTS: u32 = 256;
/// A member stops a scrub map once it has read this many bytes of object data.
pub const SCRUB_CHUNK_BYTES: u64 = 4 << 20;
/// Most findings one report lists (the counts stay exact).
pub const MAX_FINDINGS: usize = 100;

/// What a member is asked to digest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PgScrub {
    pub epoch: u64,
    pub pool: u32,
    pub pg: u32,
    /// Digest the objects whose names sort after this one (`None`: from the first).
    pub after: Option<Vec<u8>>,
    /// When not empty: digest exactly these objects instead (at most
    /// [`MAX_SCRUB_OBJECTS`]), `after` ignored.
    pub names: Vec<Vec<u8>>,
}

/// One object as a member holds it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ScrubEntry {
    pub name: Vec<u8>,
    /// `false`: the member has no such object (only for objects asked by name).
    pub exists: bool,
    pub size: u64,
    /// CRC-32C of the object's bytes, read from the device (not a cache) and verified block
    /// by block against the store's own checksums.
    pub data_crc: u32,
    /// CRC-32C over the object's attributes (name, value pairs in name order).
    pub attrs_crc: u32,
    /// Why the object could not be read (a damaged block, an I/O error).
    pub damage: Option<String>,
}

/// A member's digests of a range of objects, all taken at PG version `version`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PgScrubMap {
    pub version: u64,
    pub objects: Vec<ScrubEntry>,
    /// The range was cut short (object or byte limit): objects after the last one listed
    /// were not looked at.
    pub more: bool,
}

/// Scrub one PG (sent to its primary).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ScrubPg {
    pub pool: u32,
    pub pg: u32,
    /// Repair what is found from the authoritative copy (else only report).
    pub repair: bool,
}

/// One object whose copies disagree.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ScrubFinding {
    pub object: Vec<u8>,
    /// The OSD whose copy is wrong.
    pub osd: u32,
    /// What is wrong with it (damaged block, different size or content, missing, extra).
    pub detail: String,
    /// Whether it was repaired.
    pub repaired: bool,
}

/// The outcome of scrubbing one PG.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ScrubReport {
    pub pool: u32,
    pub pg: u32,
    /// The acting set compared (primary first).
    pub acting: Vec<u32>,
    /// Objects compared.
    pub objects: u64,
    /// Object bytes read on the primary.
    pub bytes: u64,
    /// Copies found wrong (the first [`MAX_FINDINGS`] are listed in `findings`).
    pub inconsistent: u64,
    pub repaired: u64,
    /// Objects written by clients during every attempt to compare them (not compared).
    pub busy: u64,
    pub findings: Vec<ScrubFinding>,
    /// Why the scrub stopped before its end (not primary, a member unreachable, ...).
    pub error: Option<String>,
}
