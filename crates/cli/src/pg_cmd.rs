//! `cairn pg`: operations on placement groups (scrub, query).

use crate::admin::{block_on, mon_client};
use anyhow::{bail, Context, Result};
use cairn_map::{ClusterMap, PgId};
use cairn_proto::msg::scrub::{ScrubPg, ScrubReport};
use clap::{Args, Subcommand};
use std::path::Path;
use std::process::ExitCode;
use std::time::Duration;

#[derive(Subcommand)]
pub enum PgCmd {
    /// Compare every object's copies across each PG's OSDs and repair the wrong ones.
    ///
    /// Each PG's primary asks its members for a digest (size, CRC-32C of the bytes read from
    /// the device, attributes) of every object, compares them, and copies the authoritative
    /// copy (the primary's, or the majority of the undamaged ones when the primary's is
    /// damaged) over the wrong ones. Client I/O goes on meanwhile. OSDs also scrub by
    /// themselves (`cairn osd run --scrub-interval`).
    ///
    /// Exit status: 0 when every copy agreed or was repaired, 3 when wrong copies remain,
    /// 1 when a PG could not be scrubbed.
    Scrub(ScrubArgs),
    /// Show a PG's state, past intervals and, when it is down, what it waits for.
    ///
    /// Asked of the PG's primary: its state, its past intervals (the acting sets since it last
    /// went active, and which of them may have acknowledged writes), the OSDs that answered
    /// its last peering, and the OSDs a down PG waits for (`cairn osd lost` gives up on one
    /// that will not return).
    Query(QueryArgs),
    /// List the objects a PG cannot find: its newest history lacks them and no OSD that could
    /// hold them has them (every one answered without them, or was declared lost).
    ListUnfound(QueryArgs),
    /// Give up a PG's unfound objects so that it can go active: `revert` each to the best
    /// older copy an OSD holds (deleting those none holds), or `delete` them. Writes only
    /// the lost OSDs held are gone for good; needs `w` on the pool.
    MarkUnfoundLost(MarkLostArgs),
}

#[derive(Args)]
pub struct MarkLostArgs {
    /// The PG, as POOL_ID.PG (PG in hexadecimal), e.g. 1.1f.
    pub pg: String,
    /// `revert` (to older copies where any OSD holds one) or `delete`.
    #[arg(value_parser = ["revert", "delete"])]
    pub how: String,
    /// Confirms that the unfound objects' newest writes are given up.
    #[arg(long)]
    pub yes_i_really_mean_it: bool,
}

#[derive(Args)]
pub struct QueryArgs {
    /// The PG, as POOL_ID.PG (PG in hexadecimal, as `cairn` prints them), e.g. 1.1f.
    pub pg: String,
    /// Print JSON instead of text.
    #[arg(long)]
    pub json: bool,
}

#[derive(Args)]
pub struct ScrubArgs {
    /// PGs to scrub, as POOL_ID.PG (PG in hexadecimal, as `cairn` prints them), e.g. 1.1f.
    /// Default: every PG of --pool, or of every pool.
    pub pgs: Vec<String>,
    /// Scrub every PG of this pool.
    #[arg(long, short = 'p')]
    pub pool: Option<String>,
    /// Only report what is wrong; do not repair.
    #[arg(long)]
    pub no_repair: bool,
    /// Seconds to wait for one PG's scrub.
    #[arg(long, default_value_t = 600)]
    pub timeout: u64,
    /// Print one JSON object (the report of every PG) instead of text.
    #[arg(long)]
    pub json: bool,
}

pub fn run(cmd: PgCmd, conf: Option<&Path>) -> Result<ExitCode> {
    match cmd {
        PgCmd::Scrub(a) => scrub(a, conf),
        PgCmd::Query(a) => query(a, conf).map(|()| ExitCode::SUCCESS),
        PgCmd::ListUnfound(a) => list_unfound(a, conf).map(|()| ExitCode::SUCCESS),
        PgCmd::MarkUnfoundLost(a) => mark_lost(a, conf).map(|()| ExitCode::SUCCESS),
    }
}

/// The map, the PG named `pg`, its primary and that primary's address.
fn primary_of(conf: Option<&Path>, pg: &str) -> Result<(ClusterMap, PgId, u32, String)> {
    let mon = mon_client(conf)?;
    let map = block_on(mon.get_map())??;
    let pg = parse_pg(&map, pg)?;
    let placement = map.pg_placement(pg);
    let Some(primary) = placement.primary() else {
        bail!(
            "pg {pg} has no OSD up (its OSDs: {}): nothing can answer for it; `cairn osd ls` \
             shows which are down",
            up_list(&placement.up_set)
        );
    };
    let addr = map
        .osds
        .get(&primary)
        .map(|o| o.addr.clone())
        .with_context(|| format!("osd.{primary} is not in the map"))?;
    Ok((map, pg, primary, addr))
}

fn list_unfound(a: QueryArgs, conf: Option<&Path>) -> Result<()> {
    let (map, pg, primary, addr) = primary_of(conf, &a.pg)?;
    let st = block_on(cairn_client::pg_status(
        &addr,
        &crate::conf::auth(),
        pg,
        map.epoch,
        Duration::from_secs(5),
    ))?
    .with_context(|| format!("asking osd.{primary}, primary of pg {pg}"))?;
    let names: Vec<String> = st
        .unfound
        .iter()
        .map(|n| String::from_utf8_lossy(n).into_owned())
        .collect();
    if a.json {
        let v = serde_json::json!({"pg": pg.to_string(), "primary": primary, "unfound": names});
        println!("{}", serde_json::to_string_pretty(&v)?);
    } else if names.is_empty() {
        println!("pg {pg}: no unfound objects");
    } else {
        println!(
            "pg {pg}: {} unfound objects (primary osd.{primary}):",
            names.len()
        );
        for n in &names {
            println!("  {n}");
        }
    }
    Ok(())
}

fn mark_lost(a: MarkLostArgs, conf: Option<&Path>) -> Result<()> {
    if !a.yes_i_really_mean_it {
        bail!(
            "marking unfound objects lost gives up their newest writes for good; add \
             --yes-i-really-mean-it (see `cairn pg list-unfound {}` first)",
            a.pg
        );
    }
    let (map, pg, primary, addr) = primary_of(conf, &a.pg)?;
    let delete = a.how == "delete";
    block_on(cairn_client::pg_mark_unfound_lost(
        &addr,
        &crate::conf::auth(),
        pg,
        map.epoch,
        delete,
        Duration::from_secs(5),
    ))?
    .with_context(|| format!("asking osd.{primary}, primary of pg {pg}"))?;
    println!(
        "pg {pg}: its unfound objects are given up ({}); it peers again (`cairn pg query {pg}`)",
        a.how
    );
    Ok(())
}

fn query(a: QueryArgs, conf: Option<&Path>) -> Result<()> {
    let (map, pg, primary, addr) = primary_of(conf, &a.pg)?;
    let timeout = Duration::from_secs(5);
    let st = block_on(cairn_client::pg_status(
        &addr,
        &crate::conf::auth(),
        pg,
        map.epoch,
        timeout,
    ))?
    .with_context(|| format!("asking osd.{primary}, primary of pg {pg}"))?;
    if a.json {
        let mut v = serde_json::to_value(&st)?;
        v["pg"] = serde_json::Value::String(pg.to_string());
        v["primary"] = serde_json::json!(primary);
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(());
    }
    print_status(pg, primary, &st);
    Ok(())
}

fn osds(ids: &[u32]) -> String {
    let v: Vec<String> = ids.iter().map(|o| format!("osd.{o}")).collect();
    if v.is_empty() {
        "none".into()
    } else {
        v.join(", ")
    }
}

/// "[0, 4, -, 2]": an EC PG's shard without an OSD (`NO_OSD`) shows as `-`.
fn up_list(up: &[u32]) -> String {
    let ids: Vec<String> = up
        .iter()
        .map(|o| match *o {
            cairn_map::NO_OSD => "-".to_string(),
            o => o.to_string(),
        })
        .collect();
    format!("[{}]", ids.join(", "))
}

fn print_status(pg: PgId, primary: u32, st: &cairn_proto::msg::peering::PgStatus) {
    println!("pg {pg}: {} (map epoch {})", st.state, st.epoch);
    println!(
        "  up {}, acting {:?}, primary osd.{primary}",
        up_list(&st.up_set),
        st.acting
    );
    println!(
        "  last version {}, last went active at epoch {}",
        st.last_version, st.last_epoch_started
    );
    if let Some(r) = &st.reason {
        println!("  reason: {r}");
    }
    if let Some(c) = &st.failure_class {
        let retried = if matches!(c.as_str(), "transient" | "stale_map") {
            "retried with backoff"
        } else {
            "not retried until the map changes"
        };
        println!("  failure class: {c} ({retried})");
    }
    if st.degraded_objects > 0 {
        println!("  {} objects still to recover", st.degraded_objects);
    }
    println!("  answered its last peering: {}", osds(&st.answered));
    println!("  past intervals since epoch {}:", st.intervals_from);
    for i in &st.intervals {
        let iv = &i.interval;
        let verdict = if !iv.maybe_went_rw {
            "no writes (below min_size)".to_string()
        } else if i.given_up {
            "GIVEN UP: its OSDs were declared lost; writes may be lost".to_string()
        } else if !i.waiting_for.is_empty() {
            format!("WAITING for {}", osds(&i.waiting_for))
        } else {
            format!("covered by {}", osds(&i.answered))
        };
        println!(
            "    epochs {:>5}-{:<5} acting {:<14} {verdict}",
            iv.first,
            iv.last,
            format!("{:?}", iv.acting)
        );
    }
    for iv in &st.lost_intervals {
        println!(
            "  went active without epochs {}-{} (acting {:?}, declared lost): writes \
             acknowledged then may be lost",
            iv.first, iv.last, iv.acting
        );
    }
}

fn scrub(a: ScrubArgs, conf: Option<&Path>) -> Result<ExitCode> {
    let mon = mon_client(conf)?;
    let map = block_on(mon.get_map())??;
    let pgs = select(&map, &a)?;
    let timeout = Duration::from_secs(a.timeout.max(1));
    let mut progress = crate::progress::Progress::new("scrubbing pgs");
    let mut reports = Vec::with_capacity(pgs.len());
    for (i, pg) in pgs.iter().enumerate() {
        progress.show(i as u64, pgs.len() as u64);
        // A PG's primary can change while a scrub runs; one retry with a fresh map.
        let mut rep = scrub_one(&map, *pg, !a.no_repair, timeout);
        if rep.error.is_some() {
            let map = block_on(mon.get_map())??;
            std::thread::sleep(Duration::from_millis(500));
            rep = scrub_one(&map, *pg, !a.no_repair, timeout);
        }
        reports.push(rep);
    }
    progress.show(pgs.len() as u64, pgs.len() as u64);
    progress.finish();
    let t = Totals::of(&reports);
    if a.json {
        let v = serde_json::json!({
            "pgs": reports.iter().map(report_json).collect::<Vec<_>>(),
            "pgs_scrubbed": t.scrubbed, "pgs_failed": t.failed, "objects": t.objects,
            "bytes": t.bytes, "inconsistent": t.inconsistent, "repaired": t.repaired,
            "busy": t.busy,
        });
        println!("{}", serde_json::to_string_pretty(&v)?);
    } else {
        print_text(&reports, &t);
    }
    Ok(if t.failed > 0 {
        ExitCode::from(1)
    } else if t.inconsistent > t.repaired {
        ExitCode::from(3)
    } else {
        ExitCode::SUCCESS
    })
}

/// The PGs the arguments name, in order.
fn select(map: &ClusterMap, a: &ScrubArgs) -> Result<Vec<PgId>> {
    if !a.pgs.is_empty() {
        if a.pool.is_some() {
            bail!("give either PG ids or --pool, not both");
        }
        return a.pgs.iter().map(|s| parse_pg(map, s)).collect();
    }
    let pools: Vec<&cairn_map::Pool> = match &a.pool {
        Some(name) => vec![map
            .pool_by_name(name)
            .with_context(|| format!("no pool named `{name}` (see `cairn pool ls`)"))?],
        None => map.pools.values().collect(),
    };
    Ok(pools
        .into_iter()
        .flat_map(|p| (0..p.pg_count).map(move |pg| PgId { pool: p.id, pg }))
        .collect())
}

fn parse_pg(map: &ClusterMap, s: &str) -> Result<PgId> {
    let bad = || format!("`{s}` is not a PG id: expected POOL_ID.PG with PG in hex, e.g. 1.1f");
    let (pool, pg) = s.split_once('.').with_context(bad)?;
    let pool: u32 = pool.parse().ok().with_context(bad)?;
    let pg = u32::from_str_radix(pg, 16).ok().with_context(bad)?;
    let Some(p) = map.pools.get(&pool) else {
        bail!("pg {s}: no pool with id {pool} (see `cairn pool ls`)");
    };
    if pg >= p.pg_count {
        bail!(
            "pg {s}: pool {} has {} pgs (0..{:x})",
            p.name,
            p.pg_count,
            p.pg_count - 1
        );
    }
    Ok(PgId { pool, pg })
}

/// Scrubs one PG through its primary; a failure to reach it is reported in the result.
fn scrub_one(map: &ClusterMap, pg: PgId, repair: bool, timeout: Duration) -> ScrubReport {
    let mut rep = ScrubReport {
        pool: pg.pool,
        pg: pg.pg,
        ..ScrubReport::default()
    };
    let placement = map.pg_placement(pg);
    let Some(addr) = placement
        .primary()
        .and_then(|p| map.osds.get(&p))
        .map(|o| o.addr.clone())
    else {
        rep.error = Some("no OSD of the PG is up".into());
        return rep;
    };
    let req = ScrubPg {
        pool: pg.pool,
        pg: pg.pg,
        repair,
    };
    match block_on(cairn_client::scrub_pg(
        &addr,
        &crate::conf::auth(),
        &req,
        timeout,
    )) {
        Ok(Ok(r)) => r,
        Ok(Err(e)) => {
            rep.error = Some(e.to_string());
            rep
        }
        Err(e) => {
            rep.error = Some(e.to_string());
            rep
        }
    }
}

#[derive(Default)]
struct Totals {
    scrubbed: u64,
    failed: u64,
    objects: u64,
    bytes: u64,
    inconsistent: u64,
    repaired: u64,
    busy: u64,
}

impl Totals {
    fn of(reports: &[ScrubReport]) -> Totals {
        let mut t = Totals::default();
        for r in reports {
            if r.error.is_some() {
                t.failed += 1;
            } else {
                t.scrubbed += 1;
            }
            t.objects += r.objects;
            t.bytes += r.bytes;
            t.inconsistent += r.inconsistent;
            t.repaired += r.repaired;
            t.busy += r.busy;
        }
        t
    }
}

fn pg_name(r: &ScrubReport) -> String {
    PgId {
        pool: r.pool,
        pg: r.pg,
    }
    .to_string()
}

fn print_text(reports: &[ScrubReport], t: &Totals) {
    for r in reports {
        let pg = pg_name(r);
        for f in &r.findings {
            println!(
                "pg {pg}: object {} on osd.{}: {} ({})",
                String::from_utf8_lossy(&f.object),
                f.osd,
                f.detail,
                if f.repaired {
                    "repaired"
                } else {
                    "NOT repaired"
                }
            );
        }
        let unlisted = r.inconsistent.saturating_sub(r.findings.len() as u64);
        if unlisted > 0 {
            println!("pg {pg}: {unlisted} more inconsistent copies (see the primary's log)");
        }
        if let Some(e) = &r.error {
            println!("pg {pg}: scrub failed: {e}");
        }
    }
    println!(
        "scrubbed {} pgs ({} failed): {} objects, {}; {} inconsistent copies, {} repaired{}",
        t.scrubbed,
        t.failed,
        t.objects,
        crate::size::human(t.bytes),
        t.inconsistent,
        t.repaired,
        if t.busy > 0 {
            format!("; {} objects not compared (written throughout)", t.busy)
        } else {
            String::new()
        }
    );
}

fn report_json(r: &ScrubReport) -> serde_json::Value {
    serde_json::json!({
        "pg": pg_name(r),
        "acting": r.acting,
        "objects": r.objects,
        "bytes": r.bytes,
        "inconsistent": r.inconsistent,
        "repaired": r.repaired,
        "busy": r.busy,
        "error": r.error,
        "findings": r.findings.iter().map(|f| serde_json::json!({
            "object": String::from_utf8_lossy(&f.object),
            "osd": f.osd,
            "detail": f.detail,
            "repaired": f.repaired,
        })).collect::<Vec<_>>(),
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn an_ec_pgs_shard_without_an_osd_shows_as_a_dash() {
        assert_eq!(
            super::up_list(&[0, 4, cairn_map::NO_OSD, 2]),
            "[0, 4, -, 2]"
        );
        assert_eq!(super::up_list(&[]), "[]");
    }
}
