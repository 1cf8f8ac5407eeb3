//! Payload bytes that are shared, not copied: a range of a reference-counted buffer. A write's
//! payload arrives in one buffer (a network frame's data part) and travels through the OSD,
//! the transaction and the index as this handle, so a whole-block write is never copied on
//! its way to the WAL record (`docs/operator/cluster.md`, "How a write travels").

use std::ops::{Deref, Range};
use std::sync::Arc;

/// A range of a shared buffer.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct SharedBytes {
    buf: Arc<Vec<u8>>,
    off: usize,
    len: usize,
}

impl SharedBytes {
    /// The whole of `v`, without copying it.
    pub fn new(v: Vec<u8>) -> SharedBytes {
        let len = v.len();
        SharedBytes {
            buf: Arc::new(v),
            off: 0,
            len,
        }
    }

    /// A sub-range, sharing the same buffer. `None` when the range is outside.
    pub fn slice(&self, r: Range<usize>) -> Option<SharedBytes> {
        if r.start > r.end || r.end > self.len {
            return None;
        }
        Some(SharedBytes {
            buf: self.buf.clone(),
            off: self.off + r.start,
            len: r.end - r.start,
        })
    }

    /// The buffer and the offset of these bytes in it (for holders that keep the pair).
    pub fn parts(&self) -> (&Arc<Vec<u8>>, usize) {
        (&self.buf, self.off)
    }

    /// How many handles share the buffer (this one included): a holder that kept the bytes
    /// counts, one that copied them does not.
    pub fn holders(&self) -> usize {
        Arc::strong_count(&self.buf)
    }
}

impl Deref for SharedBytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // In range by construction: `new` and `slice` check it.
        &self.buf[self.off..self.off + self.len]
    }
}

impl AsRef<[u8]> for SharedBytes {
    fn as_ref(&self) -> &[u8] {
        self
    }
}

impl From<Vec<u8>> for SharedBytes {
    fn from(v: Vec<u8>) -> SharedBytes {
        SharedBytes::new(v)
    }
}

impl From<&[u8]> for SharedBytes {
    /// A copy of `b`.
    fn from(b: &[u8]) -> SharedBytes {
        SharedBytes::new(b.to_vec())
    }
}

impl std::fmt::Debug for SharedBytes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SharedBytes({} bytes at {})", self.len, self.off)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slices_share_the_buffer_and_stay_in_range() {
        let a = SharedBytes::new((0u8..100).collect());
        let b = a.slice(10..20).expect("in range");
        assert_eq!(&b[..], &(10u8..20).collect::<Vec<_>>()[..]);
        assert!(Arc::ptr_eq(a.parts().0, b.parts().0));
        assert_eq!(b.parts().1, 10);
        let c = b.slice(5..10).expect("in range");
        assert_eq!(&c[..], &[15, 16, 17, 18, 19]);
        assert!(b.slice(5..11).is_none());
        let (start, end) = (50, 40);
        assert!(a.slice(start..end).is_none());
        // A clone shares the buffer; a copy made from the bytes does not.
        assert!(Arc::ptr_eq(c.parts().0, c.clone().parts().0));
        assert!(!Arc::ptr_eq(
            c.parts().0,
            SharedBytes::from(&c[..]).parts().0
        ));
    }
}
