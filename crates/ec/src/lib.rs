//! Erasure coding for Cairn's EC pools, pure (no I/O): a [`Profile`] (k data chunks, m parity
//! chunks, the stripe unit), the [`layout`] of an object's bytes over its k + m shards, and
//! the [`Codec`] that computes parity, rebuilds lost shards from any k, and updates parity
//! for a partial write from the changed bytes alone (parity delta).
//!
//! The codec is `reed-solomon-erasure` (GF(2^8), SIMD kernels): measured against
//! `reed-solomon-simd` in `bench/ec-codecs` (docs/format/ec.md has the figures and why).

pub mod codec;
pub mod layout;
pub mod profile;

pub use codec::{xor_into, Codec, EcError};
pub use profile::{Profile, ProfileError};
