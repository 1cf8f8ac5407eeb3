//! Comparing the copies of one object: which one is authoritative, which are wrong.

use cairn_proto::msg::scrub::ScrubEntry;

/// A copy as a member reported it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CopyState {
    Absent,
    Damaged(String),
    Good {
        size: u64,
        data_crc: u32,
        attrs_crc: u32,
    },
}

impl CopyState {
    pub fn of(e: Option<&ScrubEntry>) -> CopyState {
        match e {
            None => CopyState::Absent,
            Some(e) if !e.exists => CopyState::Absent,
            Some(e) => match &e.damage {
                Some(d) => CopyState::Damaged(d.clone()),
                None => CopyState::Good {
                    size: e.size,
                    data_crc: e.data_crc,
                    attrs_crc: e.attrs_crc,
                },
            },
        }
    }
}

/// What the copies of one object say.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    Consistent,
    /// `source` (an index into the copies) holds the authoritative state; `wrong` lists the
    /// copies that differ from it, with what is wrong.
    Inconsistent {
        source: usize,
        wrong: Vec<(usize, String)>,
    },
    /// Every copy is damaged: nothing to repair from.
    Lost {
        wrong: Vec<(usize, String)>,
    },
}

/// Judges the copies of one object; `copies[0]` is the primary's. The primary's copy is
/// authoritative unless it is damaged (peering made its history the PG's); then the state
/// most undamaged members hold is (ties: the first in acting order).
pub fn judge(copies: &[CopyState]) -> Verdict {
    let Some(first) = copies.first() else {
        return Verdict::Consistent;
    };
    if copies.iter().all(|c| c == first) && !matches!(first, CopyState::Damaged(_)) {
        return Verdict::Consistent;
    }
    let source = if matches!(first, CopyState::Damaged(_)) {
        majority(copies)
    } else {
        Some(0)
    };
    let wrong_against = |auth: Option<&CopyState>| -> Vec<(usize, String)> {
        copies
            .iter()
            .enumerate()
            .filter(|(_, c)| auth != Some(*c) || matches!(c, CopyState::Damaged(_)))
            .map(|(i, c)| (i, describe(c, auth)))
            .collect()
    };
    match source {
        Some(s) => Verdict::Inconsistent {
            source: s,
            wrong: wrong_against(copies.get(s)),
        },
        None => Verdict::Lost {
            wrong: wrong_against(None),
        },
    }
}

/// The undamaged state held by the most copies, as the index of its first holder. Only
/// present copies count: the damaged primary proves the object exists.
fn majority(copies: &[CopyState]) -> Option<usize> {
    let mut best: Option<(usize, usize)> = None;
    for (i, c) in copies.iter().enumerate() {
        if !matches!(c, CopyState::Good { .. }) {
            continue;
        }
        let n = copies.iter().filter(|o| *o == c).count();
        if best.is_none_or(|(_, bn)| n > bn) {
            best = Some((i, n));
        }
    }
    best.map(|(i, _)| i)
}

/// What is wrong with copy `c` compared with the authority `auth`.
fn describe(c: &CopyState, auth: Option<&CopyState>) -> String {
    match (c, auth) {
        (CopyState::Damaged(d), _) => format!("damaged: {d}"),
        (_, None) => "no undamaged copy to compare with".into(),
        (CopyState::Absent, Some(_)) => "missing".into(),
        (CopyState::Good { .. }, Some(CopyState::Absent)) => {
            "present, but the object does not exist".into()
        }
        (CopyState::Good { size, .. }, Some(CopyState::Good { size: want, .. }))
            if size != want =>
        {
            format!("size {size} bytes, expected {want}")
        }
        (CopyState::Good { data_crc, .. }, Some(CopyState::Good { data_crc: want, .. }))
            if data_crc != want =>
        {
            format!("content differs (crc32c {data_crc:08x}, expected {want:08x})")
        }
        (CopyState::Good { .. }, Some(_)) => "attributes differ".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn good(size: u64, crc: u32) -> CopyState {
        CopyState::Good {
            size,
            data_crc: crc,
            attrs_crc: 0,
        }
    }

    #[test]
    fn identical_copies_are_consistent() {
        assert_eq!(
            judge(&[good(4, 1), good(4, 1), good(4, 1)]),
            Verdict::Consistent
        );
        assert_eq!(
            judge(&[CopyState::Absent, CopyState::Absent]),
            Verdict::Consistent
        );
    }

    #[test]
    fn a_damaged_replica_is_repaired_from_the_primary() {
        let v = judge(&[
            good(4, 1),
            CopyState::Damaged("bad block".into()),
            good(4, 1),
        ]);
        let Verdict::Inconsistent { source, wrong } = v else {
            panic!("{v:?}")
        };
        assert_eq!(source, 0);
        assert_eq!(wrong.len(), 1);
        assert_eq!(wrong[0].0, 1);
        assert!(wrong[0].1.contains("bad block"), "{}", wrong[0].1);
    }

    #[test]
    fn the_primary_wins_over_a_majority_when_undamaged() {
        let v = judge(&[good(4, 1), good(4, 2), good(4, 2)]);
        assert_eq!(
            v,
            Verdict::Inconsistent {
                source: 0,
                wrong: vec![
                    (
                        1,
                        "content differs (crc32c 00000002, expected 00000001)".into()
                    ),
                    (
                        2,
                        "content differs (crc32c 00000002, expected 00000001)".into()
                    )
                ]
            }
        );
        let v = judge(&[CopyState::Absent, good(4, 2)]);
        let Verdict::Inconsistent { source: 0, wrong } = v else {
            panic!("{v:?}")
        };
        assert_eq!(
            wrong,
            vec![(1, "present, but the object does not exist".into())]
        );
    }

    #[test]
    fn a_damaged_primary_takes_the_majority_of_the_others() {
        let v = judge(&[
            CopyState::Damaged("io".into()),
            good(8, 3),
            good(4, 1),
            good(4, 1),
        ]);
        let Verdict::Inconsistent { source, wrong } = v else {
            panic!("{v:?}")
        };
        assert_eq!(source, 2);
        let idx: Vec<usize> = wrong.iter().map(|w| w.0).collect();
        assert_eq!(idx, vec![0, 1]);
        assert_eq!(wrong[1].1, "size 8 bytes, expected 4");
    }

    #[test]
    fn a_damaged_primary_never_makes_the_object_absent() {
        let v = judge(&[
            CopyState::Damaged("io".into()),
            CopyState::Absent,
            CopyState::Absent,
            good(4, 1),
        ]);
        let Verdict::Inconsistent { source, .. } = v else {
            panic!("{v:?}")
        };
        assert_eq!(source, 3);
    }

    #[test]
    fn all_damaged_is_lost() {
        let d = CopyState::Damaged("x".into());
        let v = judge(&[d.clone(), d]);
        let Verdict::Lost { wrong } = v else {
            panic!("{v:?}")
        };
        assert_eq!(wrong.len(), 2);
    }
}
