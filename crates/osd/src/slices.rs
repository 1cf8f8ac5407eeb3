//! Two elements of one slice borrowed mutably at once (a copy's source and destination).

/// `(&mut v[a], &mut v[b])`; `a` and `b` must differ.
pub fn pair<T>(v: &mut [T], a: usize, b: usize) -> (&mut T, &mut T) {
    if a < b {
        let (l, r) = v.split_at_mut(b);
        (&mut l[a], &mut r[0])
    } else {
        let (l, r) = v.split_at_mut(a);
        (&mut r[0], &mut l[b])
    }
}
