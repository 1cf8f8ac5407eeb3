//! The Reed-Solomon codec of one profile. The code is systematic (data chunks are stored as
//! they are) and linear over GF(2^8), byte by byte: parity byte j of a stripe depends only on
//! byte j of each data chunk. So a write that changes bytes a..b of one data chunk changes
//! bytes a..b of each parity chunk, by the code's column for that chunk times (old ^ new):
//! [`Codec::parity_delta`].

use crate::profile::Profile;
use reed_solomon_erasure::galois_8::ReedSolomon;

/// Why a coding step failed. Each says what was wrong with the shards given.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EcError {
    #[error("{profile}: {got} shards given, {want} expected")]
    ShardCount {
        profile: Profile,
        got: usize,
        want: usize,
    },
    #[error("{profile}: the shards given are not all {len} bytes long")]
    ShardSizes { profile: Profile, len: usize },
    #[error("{profile}: only {have} of the {need} shards a rebuild needs are present")]
    TooFewShards {
        profile: Profile,
        have: usize,
        need: usize,
    },
    #[error("{profile}: data chunk {chunk} does not exist")]
    NoSuchChunk { profile: Profile, chunk: u32 },
    #[error("{profile}: old and new bytes of a parity delta differ in length ({old} and {new})")]
    DeltaLengths {
        profile: Profile,
        old: usize,
        new: usize,
    },
    /// A failure of the coding library not covered above.
    #[error("{profile}: erasure code: {why}")]
    Codec { profile: Profile, why: String },
}

/// Encodes, rebuilds and updates the parity of one profile's stripes.
pub struct Codec {
    profile: Profile,
    rs: ReedSolomon,
}

impl Codec {
    /// The codec of `profile` (any profile [`Profile::new`] accepts: 1 <= k, 1 <= m,
    /// k + m <= 32, which the library takes).
    pub fn new(profile: Profile) -> Result<Codec, EcError> {
        let (k, m) = (profile.k() as usize, profile.m() as usize);
        let rs = ReedSolomon::new(k, m).map_err(|e| EcError::Codec {
            profile,
            why: format!("{e:?}"),
        })?;
        Ok(Codec { profile, rs })
    }

    pub fn profile(&self) -> Profile {
        self.profile
    }

    /// The m parity chunks of the k data chunks `data` (all of one length).
    pub fn encode(&self, data: &[&[u8]]) -> Result<Vec<Vec<u8>>, EcError> {
        let len = self.common_len(data, self.profile.k())?;
        let mut parity = vec![vec![0u8; len]; self.profile.m() as usize];
        if len > 0 {
            self.rs
                .encode_sep(data, &mut parity)
                .map_err(|e| self.codec(e))?;
        }
        Ok(parity)
    }

    /// Fills in the missing (`None`) shards of a stripe, data and parity, from the others:
    /// `shards` is every shard in order (k data, then m parity), at least k present, all of
    /// one length.
    pub fn reconstruct(&self, shards: &mut [Option<Vec<u8>>]) -> Result<(), EcError> {
        self.check_present(shards)?;
        self.rs.reconstruct(shards).map_err(|e| self.codec(e))
    }

    /// [`Codec::reconstruct`] of the data shards only (what a degraded read needs).
    pub fn reconstruct_data(&self, shards: &mut [Option<Vec<u8>>]) -> Result<(), EcError> {
        self.check_present(shards)?;
        self.rs.reconstruct_data(shards).map_err(|e| self.codec(e))
    }

    /// Whether the parity of a whole stripe (`shards`: k data, then m parity) is right.
    pub fn verify(&self, shards: &[&[u8]]) -> Result<bool, EcError> {
        if self.common_len(shards, self.profile.shards())? == 0 {
            return Ok(true);
        }
        self.rs.verify(shards).map_err(|e| self.codec(e))
    }

    /// What each parity chunk changes by (to be XORed into the same byte range of it) when
    /// bytes of data chunk `chunk` change from `old` to `new`.
    pub fn parity_delta(
        &self,
        chunk: u32,
        old: &[u8],
        new: &[u8],
    ) -> Result<Vec<Vec<u8>>, EcError> {
        if chunk >= self.profile.k() {
            return Err(EcError::NoSuchChunk {
                profile: self.profile,
                chunk,
            });
        }
        if old.len() != new.len() {
            return Err(EcError::DeltaLengths {
                profile: self.profile,
                old: old.len(),
                new: new.len(),
            });
        }
        let mut change = old.to_vec();
        xor_into(&mut change, new);
        // The library writes chunk 0's contribution and adds the others' to what is there:
        // starting from zero, either way the result is this chunk's contribution alone.
        let mut delta = vec![vec![0u8; old.len()]; self.profile.m() as usize];
        if !old.is_empty() {
            self.rs
                .encode_single_sep(chunk as usize, &change, &mut delta)
                .map_err(|e| self.codec(e))?;
        }
        Ok(delta)
    }

    /// The length every one of `chunks` has, which must be `want` chunks.
    fn common_len(&self, chunks: &[&[u8]], want: u32) -> Result<usize, EcError> {
        if chunks.len() != want as usize {
            return Err(self.count(chunks.len(), want as usize));
        }
        // `want` is at least 1 (k and m are), so there is a first chunk.
        let len = chunks.first().map_or(0, |c| c.len());
        if chunks.iter().any(|c| c.len() != len) {
            return Err(self.sizes(len));
        }
        Ok(len)
    }

    fn check_present(&self, shards: &[Option<Vec<u8>>]) -> Result<(), EcError> {
        let (want, need) = (self.profile.shards() as usize, self.profile.k() as usize);
        if shards.len() != want {
            return Err(self.count(shards.len(), want));
        }
        let have: Vec<usize> = shards.iter().flatten().map(Vec::len).collect();
        if have.len() < need {
            return Err(EcError::TooFewShards {
                profile: self.profile,
                have: have.len(),
                need,
            });
        }
        if have.iter().any(|&l| l != have[0]) || have[0] == 0 {
            return Err(self.sizes(have[0]));
        }
        Ok(())
    }

    fn count(&self, got: usize, want: usize) -> EcError {
        EcError::ShardCount {
            profile: self.profile,
            got,
            want,
        }
    }

    fn sizes(&self, len: usize) -> EcError {
        EcError::ShardSizes {
            profile: self.profile,
            len,
        }
    }

    fn codec(&self, e: reed_solomon_erasure::Error) -> EcError {
        EcError::Codec {
            profile: self.profile,
            why: format!("{e:?}"),
        }
    }
}

/// `dst ^= src` over their common length.
pub fn xor_into(dst: &mut [u8], src: &[u8]) {
    for (d, s) in dst.iter_mut().zip(src) {
        *d ^= s;
    }
}

#[cfg(test)]
mod tests;
