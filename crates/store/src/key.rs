//! Keys of the index's key/value maps (collection entries and object attributes).
//!
//! A PG's log is thousands of entries in its collection's map, under 12-byte keys, and every
//! write inserts one and removes one. With the key behind a pointer (`Arc<[u8]>`), each
//! comparison of the tree search followed it to the heap and missed the CPU caches: 3 % of
//! the machine under 4 KiB random writes went to those comparisons. A short key is held in
//! the tree node itself; a long one (up to the store's key limits) stays shared.

use std::borrow::Borrow;
use std::cmp::Ordering;
use std::fmt;
use std::ops::Deref;
use std::sync::Arc;

/// Longest key held inline: what fits beside the length in the size of a shared key's
/// pointer and tag (24 bytes).
const INLINE: usize = 22;

/// A key, compared and borrowed as its bytes.
#[derive(Clone)]
pub struct Key(Repr);

#[derive(Clone)]
enum Repr {
    Inline { len: u8, bytes: [u8; INLINE] },
    Shared(Arc<[u8]>),
}

impl Key {
    pub fn as_bytes(&self) -> &[u8] {
        match &self.0 {
            Repr::Inline { len, bytes } => &bytes[..*len as usize],
            Repr::Shared(b) => b,
        }
    }
}

impl From<&[u8]> for Key {
    fn from(b: &[u8]) -> Key {
        if b.len() <= INLINE {
            let mut bytes = [0u8; INLINE];
            bytes[..b.len()].copy_from_slice(b);
            Key(Repr::Inline {
                len: b.len() as u8,
                bytes,
            })
        } else {
            Key(Repr::Shared(Arc::from(b)))
        }
    }
}

impl Deref for Key {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        self.as_bytes()
    }
}

impl AsRef<[u8]> for Key {
    fn as_ref(&self) -> &[u8] {
        self.as_bytes()
    }
}

impl Borrow<[u8]> for Key {
    fn borrow(&self) -> &[u8] {
        self.as_bytes()
    }
}

impl PartialEq for Key {
    fn eq(&self, other: &Key) -> bool {
        self.as_bytes() == other.as_bytes()
    }
}

impl Eq for Key {}

impl PartialOrd for Key {
    fn partial_cmp(&self, other: &Key) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

/// The order of the bytes, as `Borrow<[u8]>` requires (range scans use it).
impl Ord for Key {
    fn cmp(&self, other: &Key) -> Ordering {
        self.as_bytes().cmp(other.as_bytes())
    }
}

impl fmt::Debug for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self.as_bytes(), f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_is_no_larger_than_a_shared_one_and_short_keys_are_inline() {
        assert_eq!(std::mem::size_of::<Key>(), 24);
        assert!(matches!(
            Key::from(&[7u8; INLINE][..]).0,
            Repr::Inline { .. }
        ));
        assert!(matches!(
            Key::from(&[7u8; INLINE + 1][..]).0,
            Repr::Shared(_)
        ));
    }

    proptest::proptest! {
        /// Keys inline, shared or one of each compare, and read back, as their bytes.
        #[test]
        fn keys_order_and_read_back_as_their_bytes(
            a in proptest::collection::vec(0u8..4, 0..40),
            b in proptest::collection::vec(0u8..4, 0..40),
        ) {
            let (ka, kb) = (Key::from(&a[..]), Key::from(&b[..]));
            proptest::prop_assert_eq!(ka.as_bytes(), &a[..]);
            proptest::prop_assert_eq!(ka.cmp(&kb), a.cmp(&b));
            proptest::prop_assert_eq!(ka == kb, a == b);
            let map: std::collections::BTreeMap<Key, ()> = [(ka, ()), (kb, ())].into();
            proptest::prop_assert!(map.contains_key(&a[..]) && map.contains_key(&b[..]));
        }
    }
}
