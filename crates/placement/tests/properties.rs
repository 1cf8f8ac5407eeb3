//! Property tests of placement: weight distribution, stability under change, failure domains,
//! determinism, and robustness on arbitrary input.
//!
//! The statistical tests (distribution, stability) use a fixed proptest seed: their bounds
//! are several standard deviations wide, but a random seed would still make a (very rare)
//! unlucky run fail with no code change. Run with `--nocapture` to see the measured values.

mod common;

use cairn_placement::*;
use common::shuffle;
use proptest::prelude::*;
use proptest::test_runner::RngSeed;

const W: u32 = WEIGHT_ONE;

/// Config for the statistical tests: fixed seed, modest case count (debug builds).
fn stat_config(cases: u32) -> ProptestConfig {
    ProptestConfig {
        cases,
        rng_seed: RngSeed::Fixed(0x00C0_FFEE_CA1E),
        ..ProptestConfig::default()
    }
}

/// Hosts "host-<i>" with the given OSD weights; OSD ids are assigned in order from 0.
fn build(weights: &[Vec<u32>]) -> Hierarchy {
    let mut next_id = 0;
    let hosts = weights
        .iter()
        .enumerate()
        .map(|(hi, ws)| HostNode {
            name: format!("host-{hi}"),
            osds: ws
                .iter()
                .map(|&weight| {
                    next_id += 1;
                    OsdNode {
                        id: next_id - 1,
                        weight,
                    }
                })
                .collect(),
            ..Default::default()
        })
        .collect();
    Hierarchy { hosts }
}

/// `pg_osds` of pool `pool`, PGs `0..pgs` (through a [`Placer`], which gives the same results).
fn place_all(h: &Hierarchy, pool: u32, pgs: u32, size: usize, d: FailureDomain) -> Vec<Vec<u32>> {
    let placer = Placer::new(h);
    (0..pgs)
        .map(|pg| placer.pg_osds(pool, pg, size, d))
        .collect()
}

/// Slots whose OSD changed: per PG, the OSDs of `new` not in `old` (position-insensitive).
fn moved_slots(old: &[Vec<u32>], new: &[Vec<u32>]) -> usize {
    old.iter()
        .zip(new)
        .map(|(o, n)| n.iter().filter(|id| !o.contains(id)).count())
        .sum()
}

fn total_slots(sets: &[Vec<u32>]) -> usize {
    sets.iter().map(Vec::len).sum()
}

/// Slots held by each OSD id (index = id).
fn slots_per_osd(sets: &[Vec<u32>], osd_count: usize) -> Vec<usize> {
    let mut counts = vec![0; osd_count];
    for id in sets.iter().flatten() {
        counts[*id as usize] += 1;
    }
    counts
}

/// Binomial standard deviation of an observed proportion with probability `p` over `n` trials.
fn sigma(p: f64, n: usize) -> f64 {
    (p * (1.0 - p) / n as f64).sqrt()
}

/// Host of each OSD id in a hierarchy built by [`build`].
fn host_of(h: &Hierarchy) -> Vec<usize> {
    let mut out = Vec::new();
    for (hi, host) in h.hosts.iter().enumerate() {
        out.extend(host.osds.iter().map(|_| hi));
    }
    out
}

// ---------------------------------------------------------------------------------------
// 1. Distribution
// ---------------------------------------------------------------------------------------

const DIST_PGS: u32 = 8192;

/// Tolerance of an observed share against expected share `p` over `n` draws: 5% relative,
/// plus 4 binomial standard deviations. Why: each PG's primary is an independent draw
/// (different hash inputs), so an OSD's count is Binomial(n, p). With n = 8192 and p = 1/8,
/// sigma is 0.0037 (2.9% relative), so a bare 5% relative bound would be only 1.7 sigma
/// and fail by chance; 4 sigma more makes a chance failure ~1e-5 per check at worst, while
/// a systematic error (weights ignored, squared, or a biased log) of more than ~5% + 4 sigma
/// still fails. The chi-square check below catches smaller errors spread over all OSDs.
fn share_tolerance(p: f64, n: usize) -> f64 {
    0.05 * p + 4.0 * sigma(p, n)
}

/// Chi-square limit for 7 degrees of freedom at p ~ 1e-6 (8 OSDs).
const CHI2_LIMIT_7DOF: f64 = 40.0;

/// Checks each OSD's share; returns (max relative error, max error in sigmas).
fn check_shares(counts: &[usize], weights: &[u32], n: usize) -> Result<(f64, f64), TestCaseError> {
    let total_w: f64 = weights.iter().map(|&w| f64::from(w)).sum();
    let mut chi2 = 0.0;
    let mut max_rel = 0.0f64;
    let mut max_z = 0.0f64;
    for (i, (&c, &w)) in counts.iter().zip(weights).enumerate() {
        let p = f64::from(w) / total_w;
        let obs = c as f64 / n as f64;
        let tol = share_tolerance(p, n);
        prop_assert!(
            (obs - p).abs() <= tol,
            "osd {i}: share {obs:.4} expected {p:.4} +- {tol:.4}"
        );
        chi2 += (obs - p).powi(2) * n as f64 / p;
        max_rel = max_rel.max((obs - p).abs() / p);
        max_z = max_z.max((obs - p).abs() / sigma(p, n));
    }
    prop_assert!(chi2 <= CHI2_LIMIT_7DOF, "chi-square {chi2:.1}");
    Ok((max_rel, max_z))
}

proptest! {
    #![proptest_config(stat_config(12))]

    /// Size 1: each OSD's share of primaries follows its weight share (8 OSDs, 4 hosts).
    #[test]
    fn primaries_follow_weights(
        weights in prop::collection::vec(W / 4..=4 * W, 8),
        pool in 0u32..1000,
        domain in prop_oneof![Just(FailureDomain::Host), Just(FailureDomain::Osd)],
    ) {
        let h = build(&weights.chunks(2).map(<[u32]>::to_vec).collect::<Vec<_>>());
        let sets = place_all(&h, pool, DIST_PGS, 1, domain);
        let counts = slots_per_osd(&sets, 8);
        let (max_rel, max_z) = check_shares(&counts, &weights, DIST_PGS as usize)?;
        eprintln!(
            "distribution size 1: max relative error {:.2}%, max {max_z:.2} sigma",
            max_rel * 100.0
        );
    }

    /// Size 3 over 4 hosts: host domain constrains host shares (a host holds at most one
    /// replica per PG), so only sanity is checked against weights: full sets on distinct
    /// hosts, and inside a host, OSDs split that host's slots by their weights (exact for
    /// straw2: given the winner is on a host, each OSD of it wins in proportion to weight).
    #[test]
    fn size3_sets_are_full_and_split_hosts_by_weight(
        weights in prop::collection::vec(W / 4..=4 * W, 8),
        pool in 0u32..1000,
    ) {
        const PGS: u32 = 2048;
        let h = build(&weights.chunks(2).map(<[u32]>::to_vec).collect::<Vec<_>>());
        let sets = place_all(&h, pool, PGS, 3, FailureDomain::Host);
        for set in &sets {
            prop_assert_eq!(set.len(), 3);
            let mut hosts: Vec<u32> = set.iter().map(|id| id / 2).collect();
            hosts.sort_unstable();
            hosts.dedup();
            prop_assert_eq!(hosts.len(), 3, "{:?}", set);
        }
        let counts = slots_per_osd(&sets, 8);
        for host in 0..4 {
            let (a, b) = (counts[2 * host], counts[2 * host + 1]);
            let n = a + b;
            prop_assert!(n <= PGS as usize);
            let q = f64::from(weights[2 * host])
                / (f64::from(weights[2 * host]) + f64::from(weights[2 * host + 1]));
            let obs = a as f64 / n as f64;
            let tol = share_tolerance(q, n);
            prop_assert!((obs - q).abs() <= tol, "host {host}: {obs:.4} vs {q:.4} +- {tol:.4}");
        }
    }
}

/// One fixed hierarchy with many PGs, for a tighter check (and the number to report):
/// weights 0.5..4.0 in steps of 0.5 over 4 hosts, 65536 PGs, size 1. Tolerance as above but
/// 3 sigma (the input is fixed, so this cannot fail by chance on a later run).
#[test]
fn primaries_follow_weights_many_pgs() {
    const PGS: u32 = 65536;
    let weights: Vec<u32> = (1..=8).map(|i| i * W / 2).collect();
    let h = build(&weights.chunks(2).map(<[u32]>::to_vec).collect::<Vec<_>>());
    let counts = slots_per_osd(&place_all(&h, 1, PGS, 1, FailureDomain::Host), 8);
    let total_w: f64 = weights.iter().map(|&w| f64::from(w)).sum();
    let mut max_rel = 0.0f64;
    let mut max_z = 0.0f64;
    for (i, (&c, &w)) in counts.iter().zip(&weights).enumerate() {
        let p = f64::from(w) / total_w;
        let obs = f64::from(c as u32) / f64::from(PGS);
        let s = sigma(p, PGS as usize);
        assert!(
            (obs - p).abs() <= 0.05 * p + 3.0 * s,
            "osd {i}: {obs:.4} vs {p:.4}"
        );
        max_rel = max_rel.max((obs - p).abs() / p);
        max_z = max_z.max((obs - p).abs() / s);
    }
    eprintln!(
        "distribution 65536 PGs: max relative error {:.2}%, max {max_z:.2} sigma",
        max_rel * 100.0
    );
}

// ---------------------------------------------------------------------------------------
// 2. Stability
// ---------------------------------------------------------------------------------------

const STAB_PGS: u32 = 2048;

/// Movement bound: 1.5x the unavoidable movement plus 4 sigma of it (counts are sums of
/// per-PG events, roughly binomial over the slots).
fn move_bound(ideal: f64, slots: usize) -> f64 {
    1.5 * ideal + 4.0 * sigma(ideal, slots)
}

/// Hierarchy of 3..=6 hosts with 1..=4 OSDs each, weights in [0.5, 2.0].
fn varied_hosts() -> impl Strategy<Value = Vec<Vec<u32>>> {
    prop::collection::vec(prop::collection::vec(W / 2..=2 * W, 1..=4), 3..=6)
}

/// Hierarchy of 3..=6 hosts with 2..=4 OSDs each, all weight 1.0.
fn equal_hosts() -> impl Strategy<Value = Vec<Vec<u32>>> {
    prop::collection::vec(prop::collection::vec(Just(W), 2..=4), 3..=6)
}

/// Adds an OSD and returns (moved fraction, new OSD's slot fraction).
fn add_one(weights: &[Vec<u32>], target: usize, weight: u32, size: usize) -> (f64, f64) {
    let before = build(weights);
    // The new OSD takes the next free id, whichever host it joins: rebuilding with build()
    // would renumber the OSDs of later hosts and so move data for the wrong reason.
    let n: u32 = weights.iter().map(|ws| ws.len() as u32).sum();
    let mut after = before.clone();
    let new_osd = OsdNode { id: n, weight };
    match after.hosts.get_mut(target) {
        Some(host) => host.osds.push(new_osd),
        None => after.hosts.push(HostNode {
            name: "host-new".to_string(),
            osds: vec![new_osd],
            ..Default::default()
        }),
    }
    let d = default_domain(&before);
    let old = place_all(&before, 3, STAB_PGS, size, d);
    let new = place_all(&after, 3, STAB_PGS, size, d);
    let slots = total_slots(&old);
    let on_new = new.iter().flatten().filter(|&&id| id == n).count();
    (
        moved_slots(&old, &new) as f64 / slots as f64,
        on_new as f64 / slots as f64,
    )
}

proptest! {
    #![proptest_config(stat_config(16))]

    /// Equal weights: adding one OSD to N moves <= 1.5/N of the slots (straw2's ideal is
    /// 1/(N+1), exactly the new OSD's share; size 1 achieves it). One exception, checked
    /// against a different bound: size 3 with the OSD as a *new host*. A new host changes the
    /// host-domain constraint itself: with few hosts (3 -> 4 at size 3) it must hold a
    /// replica of a large fraction of all PGs whatever its weight (measured: 1 of 9 OSDs
    /// taking 17% of the slots), so even the unavoidable movement, its own slots, exceeds
    /// 1.5/N. There the bound is 1.5x that unavoidable movement.
    #[test]
    fn adding_an_equal_osd_moves_about_one_nth(
        weights in equal_hosts(),
        target in 0usize..7,
        size in prop_oneof![Just(1usize), Just(3usize)],
    ) {
        let n = weights.iter().map(Vec::len).sum::<usize>();
        let new_host = target >= weights.len();
        let (moved, on_new) = add_one(&weights, target, W, size);
        eprintln!(
            "add equal: N {n} size {size} new host {new_host} moved {moved:.4} = {:.2}/N, new OSD holds {on_new:.4}",
            moved * n as f64
        );
        if size == 3 && new_host {
            let slots = STAB_PGS as usize * size;
            prop_assert!(moved <= move_bound(on_new, slots), "moved {moved:.4}, new OSD {on_new:.4}");
        } else {
            prop_assert!(moved <= 1.5 / n as f64, "moved {moved:.4} > 1.5/{n}");
        }
        prop_assert!(moved >= on_new, "moved less than the new OSD received");
    }

    /// Unequal weights: adding one OSD moves at most 1.5x what it must (the slots the new
    /// OSD ends up holding, about its weight share), plus statistical slack.
    #[test]
    fn adding_an_osd_moves_about_its_share(
        weights in varied_hosts(),
        target in 0usize..7,
        weight in W / 2..=2 * W,
        size in prop_oneof![Just(1usize), Just(3usize)],
    ) {
        let total: u64 = weights.iter().flatten().map(|&w| u64::from(w)).sum();
        let share = f64::from(weight) / (total + u64::from(weight)) as f64;
        let (moved, on_new) = add_one(&weights, target, weight, size);
        let ideal = if size == 1 { share } else { on_new };
        let slots = STAB_PGS as usize * size;
        eprintln!(
            "add varied: size {size} weight share {share:.4} new OSD holds {on_new:.4} moved {moved:.4} ({:.2}x)",
            moved / ideal
        );
        prop_assert!(moved <= move_bound(ideal, slots), "moved {moved:.4}, ideal {ideal:.4}");
        prop_assert!(moved >= on_new);
    }

    /// Removing an OSD (weight 0) moves its slots and not much more.
    #[test]
    fn removing_an_osd_moves_about_its_share(
        weights in varied_hosts(),
        victim_seed in any::<usize>(),
        size in prop_oneof![Just(1usize), Just(3usize)],
    ) {
        let before = build(&weights);
        let n = weights.iter().map(Vec::len).sum::<usize>();
        let victim = victim_seed % n;
        let mut after = before.clone();
        for osd in after.hosts.iter_mut().flat_map(|h| h.osds.iter_mut()) {
            if osd.id as usize == victim {
                osd.weight = 0;
            }
        }
        let d = default_domain(&before);
        let old = place_all(&before, 5, STAB_PGS, size, d);
        let new = place_all(&after, 5, STAB_PGS, size, d);
        let slots = total_slots(&old);
        let held = slots_per_osd(&old, n)[victim];
        let moved = moved_slots(&old, &new);
        let held_frac = held as f64 / slots as f64;
        eprintln!(
            "remove: size {size} victim held {held_frac:.4} moved {:.4} ({:.2}x)",
            moved as f64 / slots as f64,
            moved as f64 / held.max(1) as f64
        );
        prop_assert!(new.iter().flatten().all(|&id| id as usize != victim));
        prop_assert!(moved >= held, "its slots must move");
        prop_assert!(
            moved as f64 / slots as f64 <= move_bound(held_frac, slots),
            "moved {moved} slots, victim held {held}"
        );
    }
}

// ---------------------------------------------------------------------------------------
// 3. Failure domains, 4. determinism, 5. robustness
// ---------------------------------------------------------------------------------------

/// Hierarchies with 0..=6 hosts of 0..=5 OSDs, about a quarter of them out (weight 0).
fn sparse_hosts() -> impl Strategy<Value = Vec<Vec<u32>>> {
    let weight = prop_oneof![1 => Just(0u32), 3 => 1u32..=8 * W];
    prop::collection::vec(prop::collection::vec(weight, 0..=5), 0..=6)
}

/// A copy of `h` with hosts and each host's OSDs in a shuffled order.
fn shuffled(h: &Hierarchy, mut seed: u64) -> Hierarchy {
    let mut out = h.clone();
    shuffle(&mut out.hosts, &mut seed);
    for host in &mut out.hosts {
        shuffle(&mut host.osds, &mut seed);
    }
    out
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Replicas never share a host (host domain) or an OSD (osd domain), only weighted
    /// OSDs are chosen, and sets are full whenever enough domains exist.
    #[test]
    fn failure_domains_are_respected(
        weights in sparse_hosts(),
        size in 0usize..7,
        pool in any::<u32>(),
        first_pg in any::<u32>(),
    ) {
        let h = build(&weights);
        let host = host_of(&h);
        let weight_of: Vec<u32> = weights.iter().flatten().copied().collect();
        let eligible_osds = weight_of.iter().filter(|&&w| w > 0).count();
        let eligible_hosts = weights.iter().filter(|ws| ws.iter().any(|&w| w > 0)).count();
        for pg in (0..32).map(|i| first_pg.wrapping_add(i)) {
            for (d, eligible) in [
                (FailureDomain::Host, eligible_hosts),
                (FailureDomain::Osd, eligible_osds),
            ] {
                let set = pg_osds(&h, pool, pg, size, d);
                prop_assert_eq!(set.len(), size.min(eligible), "{:?} {:?}", d, set);
                prop_assert!(set.iter().all(|&id| weight_of[id as usize] > 0));
                let mut keys: Vec<usize> = match d {
                    FailureDomain::Osd => set.iter().map(|&id| id as usize).collect(),
                    _ => set.iter().map(|&id| host[id as usize]).collect(),
                };
                keys.sort_unstable();
                keys.dedup();
                prop_assert_eq!(keys.len(), set.len(), "{:?} {:?}", d, set);
            }
        }
    }

    /// The order of hosts and of OSDs in the input does not change any result.
    #[test]
    fn input_order_does_not_matter(
        weights in sparse_hosts(),
        seed in any::<u64>(),
        pool in any::<u32>(),
    ) {
        let h = build(&weights);
        let s = shuffled(&h, seed);
        prop_assert_eq!(default_domain(&h), default_domain(&s));
        for pg in 0..64 {
            for d in [FailureDomain::Host, FailureDomain::Osd] {
                prop_assert_eq!(pg_osds(&h, pool, pg, 3, d), pg_osds(&s, pool, pg, 3, d));
            }
        }
    }

    /// Arbitrary input (duplicate ids and names, extreme weights and sizes) never panics,
    /// never returns a duplicate, and is still independent of input order.
    #[test]
    fn arbitrary_input_is_handled(
        hosts in prop::collection::vec(
            (0u8..4, prop::collection::vec((0u32..6, prop_oneof![Just(0u32), Just(1u32), Just(u32::MAX), any::<u32>()]), 0..5)),
            0..6,
        ),
        size in prop_oneof![0usize..8, Just(usize::MAX)],
        pool in any::<u32>(),
        pg in any::<u32>(),
        seed in any::<u64>(),
    ) {
        let h = Hierarchy {
            hosts: hosts
                .iter()
                .map(|(name, osds)| HostNode {
                    name: format!("h{name}"),
                    osds: osds.iter().map(|&(id, weight)| OsdNode { id, weight }).collect(),
                    ..Default::default()
                })
                .collect(),
        };
        for d in [FailureDomain::Host, FailureDomain::Osd, default_domain(&h)] {
            let set = pg_osds(&h, pool, pg, size, d);
            prop_assert!(set.len() <= size);
            let mut dedup = set.clone();
            dedup.sort_unstable();
            dedup.dedup();
            prop_assert_eq!(dedup.len(), set.len());
            prop_assert_eq!(&set, &pg_osds(&shuffled(&h, seed), pool, pg, size, d));
        }
    }
}
