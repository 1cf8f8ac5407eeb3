//! How a byte range of a volume maps onto its data objects.

/// The part of a volume range that falls in one data object.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Piece {
    /// Data object number.
    pub objno: u64,
    /// Offset inside the object.
    pub offset: u64,
    /// Length of the piece.
    pub len: u64,
    /// Offset of the piece from the start of the whole range.
    pub at: u64,
}

impl Piece {
    /// Whether the piece covers its whole object (of a volume of `size` bytes).
    pub fn is_whole_object(&self, object_size: u64, size: u64) -> bool {
        let obj_len = object_size.min(size - self.objno * object_size);
        self.offset == 0 && self.len == obj_len
    }
}

/// Splits `offset..offset+len` into per-object pieces, in order.
pub fn pieces(object_size: u64, offset: u64, len: u64) -> Vec<Piece> {
    let mut out = Vec::new();
    let mut at = 0;
    while at < len {
        let pos = offset + at;
        let in_obj = pos % object_size;
        let n = (object_size - in_obj).min(len - at);
        out.push(Piece {
            objno: pos / object_size,
            offset: in_obj,
            len: n,
            at,
        });
        at += n;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn splits_at_object_boundaries() {
        let p = pieces(4096, 4000, 5000);
        assert_eq!(
            p,
            vec![
                Piece {
                    objno: 0,
                    offset: 4000,
                    len: 96,
                    at: 0
                },
                Piece {
                    objno: 1,
                    offset: 0,
                    len: 4096,
                    at: 96
                },
                Piece {
                    objno: 2,
                    offset: 0,
                    len: 808,
                    at: 4192
                },
            ]
        );
        assert!(p[1].is_whole_object(4096, 1 << 20));
        assert!(!p[0].is_whole_object(4096, 1 << 20));
        // The last, shorter object of a volume whose size is not a multiple.
        let last = pieces(4096, 8192, 1000);
        assert!(last[0].is_whole_object(4096, 9192));
    }

    proptest! {
        #[test]
        fn pieces_tile_the_range(shift in 12u32..24, offset in 0u64..1 << 30, len in 0u64..1 << 26) {
            let os = 1u64 << shift;
            let p = pieces(os, offset, len);
            let mut next = 0;
            for x in &p {
                prop_assert_eq!(x.at, next);
                prop_assert!(x.len > 0 && x.offset + x.len <= os);
                prop_assert_eq!(x.objno * os + x.offset, offset + x.at);
                next += x.len;
            }
            prop_assert_eq!(next, len);
        }
    }
}
