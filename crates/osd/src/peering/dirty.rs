//! What delta recovery must copy of one object: the byte ranges its log entries changed, or
//! the whole object when an entry does not say (write-full, remove, format 1 entries).

use crate::pglog::LogOp;

/// Ranges kept per object before recovery copies the whole object instead.
const MAX_RANGES: usize = 256;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Dirty {
    Whole,
    /// Half-open byte ranges `(start, end)`, sorted and disjoint after [`Dirty::add`].
    Ranges(Vec<(u64, u64)>),
}

impl Default for Dirty {
    fn default() -> Dirty {
        Dirty::Ranges(Vec::new())
    }
}

impl Dirty {
    /// Adds what one log entry changed.
    pub fn add(&mut self, op: &LogOp) {
        let Dirty::Ranges(r) = self else {
            return;
        };
        let range = match *op {
            LogOp::Modify | LogOp::Remove => {
                *self = Dirty::Whole;
                return;
            }
            LogOp::Range { offset, len } => (offset, offset.saturating_add(len)),
            // Everything from the new end on may differ (cut off, or zeros after a grow).
            LogOp::Resize { size } => (size, u64::MAX),
        };
        r.push(range);
        *r = merge(std::mem::take(r));
        if r.len() > MAX_RANGES {
            *self = Dirty::Whole;
        }
    }
}

/// Sorts ranges and joins the ones that overlap or touch.
fn merge(mut r: Vec<(u64, u64)>) -> Vec<(u64, u64)> {
    r.retain(|&(s, e)| e > s);
    r.sort_unstable();
    let mut out: Vec<(u64, u64)> = Vec::with_capacity(r.len());
    for (s, e) in r {
        match out.last_mut() {
            Some(last) if s <= last.1 => last.1 = last.1.max(e),
            _ => out.push((s, e)),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn range(offset: u64, len: u64) -> LogOp {
        LogOp::Range { offset, len }
    }

    #[test]
    fn ranges_merge_and_resizes_reach_the_end() {
        let mut d = Dirty::default();
        d.add(&range(8192, 4096));
        d.add(&range(0, 4096));
        d.add(&range(4096, 10));
        d.add(&range(100_000, 0));
        assert_eq!(d, Dirty::Ranges(vec![(0, 4106), (8192, 12288)]));
        d.add(&LogOp::Resize { size: 9000 });
        assert_eq!(d, Dirty::Ranges(vec![(0, 4106), (8192, u64::MAX)]));
    }

    #[test]
    fn write_full_remove_or_too_many_ranges_copy_everything() {
        for op in [LogOp::Modify, LogOp::Remove] {
            let mut d = Dirty::default();
            d.add(&range(0, 1));
            d.add(&op);
            d.add(&range(5, 1));
            assert_eq!(d, Dirty::Whole);
        }
        let mut d = Dirty::default();
        for i in 0..=MAX_RANGES as u64 {
            d.add(&range(i * 10, 1));
        }
        assert_eq!(d, Dirty::Whole);
        let mut d = Dirty::default();
        d.add(&range(u64::MAX - 1, 10));
        assert_eq!(d, Dirty::Ranges(vec![(u64::MAX - 1, u64::MAX)]));
    }
}
