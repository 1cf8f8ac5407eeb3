//! Fixed-width little-endian encoding helpers shared by every on-disk structure.
//!
//! Decoding never panics: every read is bounds-checked and fails with [`DecodeError`].

/// A decoding failure: the bytes end early or hold an impossible value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DecodeError(pub String);

impl std::fmt::Display for DecodeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// Appends fixed-width little-endian values to a byte vector.
pub struct Writer<'a>(pub &'a mut Vec<u8>);

impl Writer<'_> {
    pub fn u8(&mut self, v: u8) {
        self.0.push(v);
    }
    pub fn u16(&mut self, v: u16) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    pub fn u32(&mut self, v: u32) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    pub fn u64(&mut self, v: u64) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    pub fn bytes(&mut self, v: &[u8]) {
        self.0.extend_from_slice(v);
    }
    /// A byte string prefixed by its u16 length (names).
    pub fn name(&mut self, v: &[u8]) {
        self.u16(v.len() as u16);
        self.bytes(v);
    }
    /// A byte string prefixed by its u32 length (values).
    pub fn blob(&mut self, v: &[u8]) {
        self.u32(v.len() as u32);
        self.bytes(v);
    }
}

/// Reads fixed-width little-endian values from a byte slice, bounds-checked.
pub struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    pub fn new(buf: &'a [u8]) -> Self {
        Reader { buf, pos: 0 }
    }
    pub fn pos(&self) -> usize {
        self.pos
    }
    pub fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }
    pub fn take(&mut self, n: usize) -> Result<&'a [u8], DecodeError> {
        if n > self.remaining() {
            return Err(DecodeError(format!(
                "need {n} bytes at offset {}, only {} left",
                self.pos,
                self.remaining()
            )));
        }
        let s = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }
    fn array<const N: usize>(&mut self) -> Result<[u8; N], DecodeError> {
        let mut a = [0u8; N];
        a.copy_from_slice(self.take(N)?);
        Ok(a)
    }
    pub fn u8(&mut self) -> Result<u8, DecodeError> {
        Ok(self.array::<1>()?[0])
    }
    pub fn u16(&mut self) -> Result<u16, DecodeError> {
        Ok(u16::from_le_bytes(self.array()?))
    }
    pub fn u32(&mut self) -> Result<u32, DecodeError> {
        Ok(u32::from_le_bytes(self.array()?))
    }
    pub fn u64(&mut self) -> Result<u64, DecodeError> {
        Ok(u64::from_le_bytes(self.array()?))
    }
    /// A u16-length-prefixed byte string no longer than `limit`.
    pub fn name(&mut self, limit: usize) -> Result<&'a [u8], DecodeError> {
        let n = self.u16()? as usize;
        if n > limit {
            return Err(DecodeError(format!(
                "name of {n} bytes over the limit of {limit}"
            )));
        }
        self.take(n)
    }
    /// A u32-length-prefixed byte string no longer than `limit`.
    pub fn blob(&mut self, limit: usize) -> Result<&'a [u8], DecodeError> {
        let n = self.u32()? as usize;
        if n > limit {
            return Err(DecodeError(format!(
                "value of {n} bytes over the limit of {limit}"
            )));
        }
        self.take(n)
    }
    /// A count that must not exceed `limit` (guards allocations sized from input).
    pub fn count(&mut self, limit: u64) -> Result<u64, DecodeError> {
        let n = self.u64()?;
        if n > limit {
            return Err(DecodeError(format!("count {n} over the limit of {limit}")));
        }
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_short_input() {
        let mut v = Vec::new();
        let mut w = Writer(&mut v);
        w.u8(1);
        w.u16(2);
        w.u32(3);
        w.u64(4);
        w.name(b"abc");
        w.blob(b"defg");
        let mut r = Reader::new(&v);
        assert_eq!(r.u8().unwrap(), 1);
        assert_eq!(r.u16().unwrap(), 2);
        assert_eq!(r.u32().unwrap(), 3);
        assert_eq!(r.u64().unwrap(), 4);
        assert_eq!(r.name(10).unwrap(), b"abc");
        assert!(Reader::new(&v[..v.len() - 1]).take(v.len()).is_err());
        assert_eq!(
            r.blob(3).unwrap_err().0,
            "value of 4 bytes over the limit of 3"
        );
    }
}
