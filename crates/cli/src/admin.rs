//! Operator commands that talk to the monitors: status, pools, OSD listing and marking.

use anyhow::{bail, Context, Result};
use cairn_map::{
    ChangeOutcome, ClusterMap, Domain, Durability, MapChange, PgId, PlacementRule, PoolSetting,
};
use cairn_monclient::MonClient;
use clap::{Args, Subcommand};
use std::future::Future;
use std::path::Path;
use std::time::Duration;

/// `--json` for listing commands.
#[derive(Args)]
pub struct JsonFlag {
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}

#[derive(Args)]
pub struct StatusArgs {
    /// Print JSON instead of text.
    #[arg(long)]
    pub json: bool,
    /// Fraction of an OSD's capacity from which it is reported near full (HEALTH_WARN).
    #[arg(long, default_value_t = crate::capacity::NEARFULL_RATIO, value_parser = parse_ratio)]
    pub nearfull_ratio: f64,
    /// Fraction from which it is reported full (HEALTH_ERR: writes to it soon fail).
    #[arg(long, default_value_t = crate::capacity::FULL_RATIO, value_parser = parse_ratio)]
    pub full_ratio: f64,
    /// Thin overcommit from which a pool is reported (HEALTH_WARN): the sum of its volumes'
    /// sizes over what it can hold. Above 1.0, writing every volume full would fail.
    #[arg(long, default_value_t = crate::capacity::OVERCOMMIT_RATIO, value_parser = parse_overcommit)]
    pub overcommit_ratio: f64,
}

fn parse_overcommit(s: &str) -> std::result::Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if v > 0.0 && v.is_finite() => Ok(v),
        _ => Err(format!("`{s}` is not a positive ratio (e.g. 1.0 or 2.5)")),
    }
}

fn parse_ratio(s: &str) -> std::result::Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if v > 0.0 && v <= 1.0 => Ok(v),
        _ => Err(format!("`{s}` is not a fraction in (0, 1]")),
    }
}

/// Runs a future on a small runtime (commands are short-lived).
pub fn block_on<T>(f: impl Future<Output = T>) -> Result<T> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    Ok(rt.block_on(f))
}

/// How long a command waits for the monitors in silence before it says it is waiting.
const MON_PATIENCE: Duration = Duration::from_secs(2);

/// Runs a call to the monitors at `addrs`; if it has not answered within a moment, says on
/// stderr that it is still trying (the call itself gives up at its own deadline).
pub fn block_on_mon<T>(addrs: &[String], f: impl Future<Output = T>) -> Result<T> {
    block_on(async {
        let mut f = std::pin::pin!(f);
        match tokio::time::timeout(MON_PATIENCE, &mut f).await {
            Ok(v) => v,
            Err(_) => {
                eprintln!(
                    "cairn: no answer yet from the monitors at {}; still trying...",
                    addrs.join(", ")
                );
                f.await
            }
        }
    })
}

/// A monitor client for the configured cluster.
pub fn mon_client(conf: Option<&Path>) -> Result<MonClient> {
    Ok(crate::conf::mon_client(
        crate::conf::load(conf)?.cluster.mons,
    ))
}

/// A frame protection mode by its number on the wire.
fn frames_name(b: u8) -> String {
    cairn_transport::FrameMode::from_u8(b)
        .map_or_else(|| format!("unknown ({b})"), |m| m.to_string())
}

/// Sends a map change and reports the outcome.
pub fn change(conf: Option<&Path>, c: MapChange, what: &str) -> Result<()> {
    let mon = mon_client(conf)?;
    match block_on_mon(&mon.addrs(), mon.command(c))?? {
        ChangeOutcome::Changed { epoch, .. } => println!("{what}: done (map epoch {epoch})"),
        ChangeOutcome::Unchanged => println!("{what}: already so (nothing changed)"),
    }
    Ok(())
}

#[derive(Subcommand)]
pub enum PoolCmd {
    /// Create a pool.
    Create(PoolCreate),
    /// List pools with their settings.
    Ls(JsonFlag),
    /// Remove a pool and all its objects. Refused while volumes of it are served.
    Rm {
        name: String,
        /// Required: removing a pool destroys its data.
        #[arg(long)]
        yes_i_really_mean_it: bool,
        /// Remove even while volumes of it are served: the servers close them first.
        #[arg(long)]
        force: bool,
    },
    /// Change a pool setting: size N, min_size N, durability wal|memory, domain
    /// osd|host|rack|zone (where copies must not share; moves data, and moves a pool made
    /// before placement v2 onto it), or pgs N (more PGs: each splits online, its objects
    /// staying readable and writable; then the new PGs move like any rebalance; never fewer;
    /// use a power of two).
    Set {
        name: String,
        key: String,
        value: String,
        /// Set a size larger than the cluster's failure domains anyway (its PGs then stay
        /// degraded, or inactive, until there are enough).
        #[arg(long)]
        force: bool,
    },
}

#[derive(Args)]
pub struct PoolCreate {
    pub name: String,
    /// Replicas per object (replicated pools; an EC pool's size is k + m).
    #[arg(long, default_value_t = 3, conflicts_with = "ec")]
    pub size: u8,
    /// Erasure-coded instead of replicated: K+M (e.g. 4+2), k data and m parity chunks per
    /// stripe on k + m distinct failure domains; survives the loss of any m; stores
    /// (k + m) / k bytes per byte (1.5 for 4+2, against 3 for size 3). Fixed for the pool's
    /// life. Reads, writes and degraded reads are served; a shard that falls behind is not
    /// rebuilt yet (docs/format/ec.md).
    #[arg(long, value_name = "K+M")]
    pub ec: Option<String>,
    /// With --ec: bytes per chunk, a multiple of 4 KiB up to 1 MiB (default 16K). A write of
    /// k chunks' worth of whole stripes is encoded without reading anything.
    #[arg(long, requires = "ec", value_parser = parse_unit)]
    pub stripe_unit: Option<u32>,
    /// Fewest replicas a write needs (default: size - 1, at least 1); for an EC pool, fewest
    /// shards, k..=k+m (default k + 1).
    #[arg(long)]
    pub min_size: Option<u8>,
    /// Placement groups (fixed for the pool's life; ~100 per OSD in total is typical).
    #[arg(long, default_value_t = 64)]
    pub pgs: u32,
    /// `wal`: a write is acknowledged once durable in every replica's WAL (default).
    /// `memory`: once written to every replica's WAL device, flushed a few ms later (faster
    /// where a flush is slow; survives any process crash, but a power loss of all replicas
    /// within those ms can lose acknowledged writes; NBD FLUSH waits for the flush).
    #[arg(long, default_value = "wal")]
    pub durability: String,
    /// Failure domain: no two copies of a PG in one osd, host, rack or zone (racks and
    /// zones are host labels: `cairn host set`). Default: host when the in OSDs span at
    /// least `size` hosts, else osd.
    #[arg(long, value_parser = parse_domain)]
    pub domain: Option<Domain>,
    /// Create it even if its size is larger than the number of its failure domains holding
    /// in OSDs: its PGs then stay degraded, or inactive, until there are enough.
    #[arg(long)]
    pub force: bool,
}

fn parse_unit(s: &str) -> Result<u32, String> {
    let b = crate::size::parse_size(s)?;
    u32::try_from(b).map_err(|_| format!("stripe unit {s:?} is too large (at most 1M)"))
}

/// The EC profile `--ec K+M [--stripe-unit N]` names, checked.
fn ec_profile(km: &str, unit: Option<u32>) -> Result<cairn_map::EcProfile> {
    let unit = unit.unwrap_or(cairn_ec::profile::DEFAULT_UNIT);
    let p = cairn_ec::Profile::parse(km, unit).with_context(|| format!("--ec {km}"))?;
    Ok(cairn_map::EcProfile {
        k: u8::try_from(p.k())?,
        m: u8::try_from(p.m())?,
        stripe_unit: p.unit(),
    })
}

/// `pool create --ec`: k + m shards, min_size k + 1 unless given.
fn create_ec_pool(conf: Option<&Path>, a: &PoolCreate, km: &str) -> Result<()> {
    let profile = ec_profile(km, a.stripe_unit)?;
    let size = profile.shards();
    let min_size = a.min_size.unwrap_or((profile.k + 1).min(size));
    let map = get_map(conf)?;
    let domain = a.domain.unwrap_or_else(|| map.default_domain(size));
    let rule = PlacementRule::Erasure { domain, profile };
    check_placeable(&map, &a.name, size, rule, a.force)?;
    let c = MapChange::PoolCreateEc {
        name: a.name.clone(),
        profile,
        min_size,
        pg_count: a.pgs,
        durability: durability(&a.durability)?,
        domain: Some(domain),
    };
    let what = format!(
        "pool {} create, erasure-coded {}, shards on distinct {}s, min_size {min_size}",
        a.name,
        profile.describe(),
        domain.name()
    );
    change(conf, c, &what)
}

fn parse_domain(s: &str) -> Result<Domain, String> {
    Domain::parse(s)
        .ok_or_else(|| format!("unknown failure domain {s:?}: use osd, host, rack or zone"))
}

/// Refuses a pool the cluster cannot place (unless forced): with fewer failure domains than
/// copies a PG is never clean, and below min_size it takes no writes at all.
fn check_placeable(
    map: &ClusterMap,
    pool: &str,
    size: u8,
    rule: PlacementRule,
    force: bool,
) -> Result<()> {
    if force {
        return Ok(());
    }
    let (domains, unit) = ClusterMap::failure_domains(&map.placer(), rule);
    if size as usize > domains {
        let units = plural(unit);
        bail!(
            "pool {pool}: size {size} needs {size} failure domains, the cluster has {domains} \
             ({units} holding in OSDs; copies go to distinct {units}): its PGs could never \
             hold {size} copies. Add {units} (racks and zones: `cairn host set`), use a \
             smaller size or --domain, or add --force"
        );
    }
    Ok(())
}

/// "OSDs", "hosts", "racks", "zones" for a failure domain's name.
pub fn plural(unit: &str) -> &'static str {
    match unit {
        "osd" => "OSDs",
        "host" => "hosts",
        "rack" => "racks",
        _ => "zones",
    }
}

fn durability(s: &str) -> Result<Durability> {
    Durability::parse(s).with_context(|| format!("durability {s:?}: use wal or memory"))
}

pub fn pool(cmd: PoolCmd, conf: Option<&Path>) -> Result<()> {
    match cmd {
        PoolCmd::Create(a) if a.ec.is_some() => {
            let km = a.ec.clone().unwrap_or_default();
            create_ec_pool(conf, &a, &km)
        }
        PoolCmd::Create(a) => {
            let min_size = a.min_size.unwrap_or(a.size.saturating_sub(1).max(1));
            let map = get_map(conf)?;
            let domain = a.domain.unwrap_or_else(|| map.default_domain(a.size));
            check_placeable(
                &map,
                &a.name,
                a.size,
                PlacementRule::Tree { domain },
                a.force,
            )?;
            let c = MapChange::PoolCreateRule {
                name: a.name.clone(),
                size: a.size,
                min_size,
                pg_count: a.pgs,
                durability: durability(&a.durability)?,
                domain: Some(domain),
            };
            let how = if a.domain.is_some() {
                ""
            } else {
                " (default for this cluster)"
            };
            change(
                conf,
                c,
                &format!(
                    "pool {} create, copies on distinct {}s{how}",
                    a.name,
                    domain.name()
                ),
            )
        }
        PoolCmd::Ls(j) => {
            let map = get_map(conf)?;
            if j.json {
                let v: Vec<_> = map.pools.values().map(pool_json).collect();
                println!("{}", serde_json::to_string_pretty(&v)?);
            } else {
                println!(
                    "{:<5} {:<20} {:>4} {:>8} {:>5} {:<10} {:<8} type",
                    "id", "name", "size", "min_size", "pgs", "durability", "domain"
                );
                for p in map.pools.values() {
                    println!(
                        "{:<5} {:<20} {:>4} {:>8} {:>5} {:<10} {:<8} {}",
                        p.id,
                        p.name,
                        p.size,
                        p.min_size,
                        p.pg_count,
                        p.durability.name(),
                        p.rule.describe(),
                        p.kind()
                    );
                }
            }
            Ok(())
        }
        PoolCmd::Rm {
            name,
            yes_i_really_mean_it,
            force,
        } => {
            if !yes_i_really_mean_it {
                bail!("removing pool {name:?} destroys its objects; add --yes-i-really-mean-it");
            }
            crate::vol_cmd::close_pool_volumes(conf, &name, force)?;
            change(
                conf,
                MapChange::PoolRemove { name: name.clone() },
                &format!("pool {name} rm"),
            )
        }
        PoolCmd::Set {
            name,
            key,
            value,
            force,
        } => {
            let num = || {
                value
                    .parse::<u8>()
                    .with_context(|| format!("{key} {value:?}: not a number"))
            };
            let current = || -> Result<(ClusterMap, cairn_map::Pool)> {
                let map = get_map(conf)?;
                let pool = map.pool_by_name(&name).cloned().with_context(|| {
                    format!("no pool named {name:?}: `cairn pool ls` lists the pools")
                })?;
                Ok((map, pool))
            };
            let setting = match key.as_str() {
                "size" => {
                    let n = num()?;
                    let (map, pool) = current()?;
                    check_placeable(&map, &name, n, pool.rule, force)?;
                    PoolSetting::Size(n)
                }
                "min_size" => PoolSetting::MinSize(num()?),
                "durability" => PoolSetting::Durability(durability(&value)?),
                "pgs" | "pg_count" => {
                    let n: u32 = value
                        .parse()
                        .with_context(|| format!("{key} {value:?}: not a number"))?;
                    if !n.is_power_of_two() {
                        eprintln!(
                            "note: {n} is not a power of two: some PGs will hold twice the \
                             objects of others"
                        );
                    }
                    PoolSetting::PgCount(n)
                }
                "domain" => {
                    let d = parse_domain(&value).map_err(anyhow::Error::msg)?;
                    let (map, pool) = current()?;
                    check_placeable(
                        &map,
                        &name,
                        pool.size,
                        PlacementRule::Tree { domain: d },
                        force,
                    )?;
                    PoolSetting::Domain(d)
                }
                other => bail!(
                    "unknown pool setting {other:?}: use size, min_size, durability, domain or pgs"
                ),
            };
            change(
                conf,
                MapChange::PoolSet {
                    name: name.clone(),
                    setting,
                },
                &format!("pool {name} {key}={value}"),
            )
        }
    }
}

fn pool_json(p: &cairn_map::Pool) -> serde_json::Value {
    serde_json::json!({
        "id": p.id, "name": p.name, "size": p.size, "min_size": p.min_size,
        "pg_count": p.pg_count, "durability": p.durability.name(),
        "domain": p.rule.domain().map(|d| d.name()),
        "placement_version": if p.rule == PlacementRule::FlatV1 { 1 } else { 2 },
        "type": p.type_name(),
        "ec": p.ec().map(|e| serde_json::json!({"k": e.k, "m": e.m, "stripe_unit": e.stripe_unit})),
        "raw_per_byte": p.raw_per_byte(),
    })
}

/// Fetches the map.
pub fn get_map(conf: Option<&Path>) -> Result<ClusterMap> {
    let mon = mon_client(conf)?;
    Ok(block_on_mon(&mon.addrs(), mon.get_map())??)
}

pub fn osd_ls(conf: Option<&Path>, json: bool) -> Result<()> {
    let map = get_map(conf)?;
    if json {
        let v: Vec<_> = map
            .osds
            .values()
            .map(|o| {
                serde_json::json!({"id": o.id, "addr": o.addr, "host": o.host, "up": o.up,
                    "in": o.in_, "weight": o.weight as f64 / 65536.0, "up_from": o.up_from,
                    "lost_at": (o.lost_at > 0).then_some(o.lost_at)})
            })
            .collect();
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(());
    }
    println!(
        "{:<6} {:<22} {:<16} {:<5} {:<4} weight",
        "id", "addr", "host", "up", "in"
    );
    for o in map.osds.values() {
        println!(
            "osd.{:<2} {:<22} {:<16} {:<5} {:<4} {:.2}",
            o.id,
            o.addr,
            o.host,
            match (o.up, o.lost_at) {
                (true, _) => "up",
                (false, 0) => "down",
                (false, _) => "lost",
            },
            if o.in_ { "in" } else { "out" },
            o.weight as f64 / 65536.0
        );
    }
    Ok(())
}

/// Fewest PG copies per OSD a pool should give each of its OSDs: below this, placement
/// cannot spread its data evenly (some OSDs get several times the share of others).
pub const MIN_PG_COPIES_PER_OSD: u64 = 10;

/// A warning for each pool with too few PGs for the OSDs that are in.
fn too_few_pgs(map: &cairn_map::ClusterMap) -> Vec<String> {
    let osds = map
        .osds
        .values()
        .filter(|o| o.placement_weight() > 0)
        .count() as u64;
    if osds < 2 {
        return Vec::new();
    }
    map.pools
        .values()
        .filter_map(|p| {
            let copies = u64::from(p.pg_count) * u64::from(p.size);
            (copies < MIN_PG_COPIES_PER_OSD * osds).then(|| {
                let want = (50 * osds)
                    .div_ceil(u64::from(p.size.max(1)))
                    .next_power_of_two();
                format!(
                    "pool {} has {} PGs for {osds} OSDs: about {:.1} copies per OSD, too few to \
                     spread its data evenly (want at least {MIN_PG_COPIES_PER_OSD}): `cairn pool \
                     set {} pgs {want}` splits its PGs online",
                    p.name,
                    p.pg_count,
                    copies as f64 / osds as f64,
                    p.name
                )
            })
        })
        .collect()
}

/// PG counts by state for a map (down PGs are in `total` only).
pub struct PgCounts {
    pub total: u64,
    pub clean: u64,
    pub degraded: u64,
    pub inactive: u64,
}

/// PG counts by state for a map; the PGs in `down` (their primaries say so) count as
/// neither active state.
pub fn pg_counts(map: &ClusterMap, down: &[cairn_proto::msg::osd::DownPg]) -> PgCounts {
    let h = map.placer();
    let mut c = PgCounts {
        total: 0,
        clean: 0,
        degraded: 0,
        inactive: 0,
    };
    for p in map.pools.values() {
        for pg in 0..p.pg_count {
            let pl = map.pg_placement_in(&h, PgId { pool: p.id, pg });
            c.total += 1;
            let acting = pl.acting.len();
            if down.iter().any(|d| d.pool == p.id && d.pg == pg) {
                continue;
            }
            if acting < p.min_size as usize {
                c.inactive += 1;
            } else if acting < p.size as usize {
                c.degraded += 1;
            } else {
                c.clean += 1;
            }
        }
    }
    c
}

/// "6 PGs with every shard, 2 missing 1 (read by decoding; rebuilt when their OSDs return
/// or are replaced)" for a pool of `k` data shards; with `k` None the short form the
/// dashboard shows, "6 with every shard, 2 missing 1".
pub(crate) fn ec_shards_line(by_missing: &[u32], k: Option<usize>) -> String {
    let all = by_missing.first().copied().unwrap_or(0);
    let pgs = if k.is_some() { " PGs" } else { "" };
    let mut parts = vec![format!("{all}{pgs} with every shard")];
    for (missing, n) in by_missing
        .iter()
        .enumerate()
        .skip(1)
        .filter(|(_, n)| **n > 0)
    {
        let what = match k {
            None => "",
            Some(k) if by_missing.len() - 1 - missing < k => " (fewer than k left: down)",
            Some(_) => " (read by decoding; rebuilt when their OSDs return or are replaced)",
        };
        parts.push(format!("{n} missing {missing}{what}"));
    }
    parts.join(", ")
}

/// "pg 3.0 (osd.0), pg 3.1 (osd.0, osd.2)", at most 10 PGs then a count.
fn pg_osd_list(pgs: &[cairn_proto::msg::osd::DownPg]) -> String {
    let mut parts: Vec<String> = pgs
        .iter()
        .take(10)
        .map(|d| {
            let osds: Vec<String> = d.osds.iter().map(|o| format!("osd.{o}")).collect();
            let pg = cairn_map::PgId {
                pool: d.pool,
                pg: d.pg,
            };
            format!("pg {pg}: {}", osds.join(", "))
        })
        .collect();
    if pgs.len() > 10 {
        parts.push(format!("{} more", pgs.len() - 10));
    }
    parts.join("; ")
}

fn pg_osds_json(d: &cairn_proto::msg::osd::DownPg) -> serde_json::Value {
    let pg = cairn_map::PgId {
        pool: d.pool,
        pg: d.pg,
    };
    serde_json::json!({"pg": pg.to_string(), "osds": d.osds})
}

/// What the OSDs that answered report, summed. Saturating: the figures come off the network.
#[derive(Default, Clone, Copy)]
struct OsdTotals {
    used: u64,
    capacity: u64,
    peering: u64,
    recovered: u64,
    scrub_bad: u64,
    scrub_repaired: u64,
    degraded: u64,
    rec_bps: u64,
    rec_ops: u64,
    misplaced: u64,
    reclaiming: u64,
    cache_hits: u64,
    cache_misses: u64,
    cache_bytes: u64,
    cache_capacity: u64,
    memory_used: u64,
    memory_target: u64,
}

impl OsdTotals {
    fn add(&mut self, s: &cairn_client::OsdStats) {
        let sum = |a: &mut u64, b: u64| *a = a.saturating_add(b);
        sum(&mut self.used, s.used_bytes);
        sum(&mut self.capacity, s.capacity_bytes);
        sum(&mut self.peering, s.peering_pgs);
        sum(&mut self.recovered, s.recovered_objects);
        sum(&mut self.scrub_bad, s.scrub_unrepaired);
        sum(&mut self.scrub_repaired, s.scrub_repaired);
        sum(&mut self.degraded, s.recovery_pending_objects);
        sum(&mut self.rec_bps, s.recovery_bytes_per_sec);
        sum(&mut self.rec_ops, s.recovery_objects_per_sec);
        sum(&mut self.misplaced, s.pgs_misplaced);
        sum(&mut self.reclaiming, s.pgs_reclaiming);
        sum(&mut self.cache_hits, s.cache_hits);
        sum(&mut self.cache_misses, s.cache_misses);
        sum(&mut self.cache_bytes, s.cache_bytes);
        sum(&mut self.cache_capacity, s.cache_capacity_bytes);
        sum(&mut self.memory_used, s.memory_used_bytes);
        sum(&mut self.memory_target, s.memory_target_bytes);
    }

    /// Fraction of data reads answered from memory; `None` before any read.
    fn hit_ratio(&self) -> Option<f64> {
        let all = self.cache_hits.saturating_add(self.cache_misses);
        (all > 0).then(|| self.cache_hits as f64 / all as f64)
    }

    fn cache_line(&self) -> String {
        let h = crate::size::human;
        let reads = self.hit_ratio().map_or("no data reads yet".into(), |r| {
            format!("{:.0}% of data reads from memory", r * 100.0)
        });
        format!(
            "{reads}; {} cached of {}; OSD memory {} used of a {} target",
            h(self.cache_bytes),
            h(self.cache_capacity),
            h(self.memory_used),
            h(self.memory_target)
        )
    }
}

/// Problems of OSDs past the near-full or full ratio; whether any is full.
fn fullness(uses: &[crate::capacity::OsdUse], a: &StatusArgs) -> (Vec<String>, bool, bool) {
    let (mut lines, mut near, mut full) = (Vec::new(), false, false);
    for u in uses {
        let pct = (u.ratio() * 100.0).floor();
        let of = crate::size::human(u.capacity);
        if u.ratio() >= a.full_ratio {
            full = true;
            lines.push(format!(
                "osd.{} is full ({pct}% of {of}): writes to its PGs will soon fail; add OSDs or \
                 remove data",
                u.osd
            ));
        } else if u.ratio() >= a.nearfull_ratio {
            near = true;
            lines.push(format!("osd.{} is near full ({pct}% of {of})", u.osd));
        }
    }
    (lines, near, full)
}

pub fn status(conf: Option<&Path>, a: &StatusArgs) -> Result<()> {
    let json = a.json;
    let mon = mon_client(conf)?;
    // Monitor status only once the map came: when no monitor answers, one wait is enough.
    let map = block_on_mon(&mon.addrs(), mon.get_map())??;
    let mons = block_on(mon.status())?;
    let usage = block_on(crate::capacity::up_osd_stats(&map))?;
    let mut totals = OsdTotals::default();
    let (mut down_pgs, mut lost_pgs) = (Vec::new(), Vec::new());
    let mut unreachable = Vec::new();
    // (reporting OSD, its slow writes of the last minute by the member they waited for)
    let mut slow = Vec::new();
    // (OSD, its recent crashes)
    let mut crashes = Vec::new();
    let mut failed_pgs = Vec::new();
    for (id, r) in &usage {
        match r {
            Ok(s) => {
                totals.add(s);
                failed_pgs.extend(s.failed_pgs.iter().cloned());
                if !s.crashes.is_empty() {
                    crashes.push((*id, s.crashes.clone()));
                }
                slow.extend(s.slow_ops.iter().map(|o| (*id, o.clone())));
                down_pgs.extend(s.down_pgs.iter().cloned());
                lost_pgs.extend(s.lost_write_pgs.iter().cloned());
            }
            Err(_) => unreachable.push(*id),
        }
    }
    let OsdTotals {
        used,
        capacity,
        peering,
        recovered,
        scrub_bad,
        scrub_repaired,
        degraded,
        rec_bps,
        rec_ops,
        misplaced,
        reclaiming,
        ..
    } = totals;
    let uses = crate::capacity::uses_of(&usage);
    let (mut full_lines, nearfull, full) = fullness(&uses, a);
    let usable = |p: &cairn_map::Pool| crate::capacity::usable(&map, &uses, p.raw_per_byte());
    if nearfull || full {
        // Every pool spreads over every OSD in, so the fullest OSD limits them all.
        for p in map.pools.values() {
            let room = usable(p).map_or("unknown".into(), crate::size::human);
            let state = if full { "full" } else { "near full" };
            full_lines.push(format!(
                "pool {} is {state}: room for about {room} more",
                p.name
            ));
        }
    }
    let pool_capacity =
        |p: &cairn_map::Pool| crate::capacity::pool_capacity(&map, &uses, p.raw_per_byte());
    let (osds, up, inn) = map.osd_counts();
    let pgs = pg_counts(&map, &down_pgs);
    // Listing volumes needs every PG: skipped while some cannot answer.
    let provisioned = if pgs.inactive == 0 && down_pgs.is_empty() {
        block_on(crate::capacity::provisioned(&mon.addrs(), &map))?
    } else {
        Default::default()
    };
    let overcommit = |p: &cairn_map::Pool| -> Option<(u64, u64, f64)> {
        let prov = *provisioned.get(&p.name)?.as_ref().ok()?;
        let cap = pool_capacity(p)?;
        (prov > 0 && cap > 0).then(|| (prov, cap, prov as f64 / cap as f64))
    };
    let overcommitted: Vec<String> = map
        .pools
        .values()
        .filter_map(|p| {
            let (prov, cap, ratio) = overcommit(p)?;
            (ratio > a.overcommit_ratio).then(|| {
                format!(
                    "pool {} is overcommitted: its volumes total {} (thin), {ratio:.1}x the about \
                     {} it can hold with {} copies; writing them full would fail (no space). Add \
                     OSDs, or shrink or remove volumes",
                    p.name,
                    crate::size::human(prov),
                    crate::size::human(cap),
                    p.size
                )
            })
        })
        .collect();
    let few_pgs = too_few_pgs(&map);
    let health = if pgs.inactive > 0
        || scrub_bad > 0
        || !down_pgs.is_empty()
        || !failed_pgs.is_empty()
        || full
    {
        "HEALTH_ERR"
    } else if pgs.degraded > 0
        || up < osds
        || !unreachable.is_empty()
        || peering > 0
        || degraded > 0
        || misplaced > 0
        || !lost_pgs.is_empty()
        || nearfull
        || !overcommitted.is_empty()
        || !few_pgs.is_empty()
        || !slow.is_empty()
        || !crashes.is_empty()
    {
        "HEALTH_WARN"
    } else {
        "HEALTH_OK"
    };
    let seconds_left = (degraded > 0 && rec_ops > 0).then(|| degraded.div_ceil(rec_ops));
    let mut problems = full_lines;
    problems.extend(overcommitted);
    problems.extend(few_pgs);
    for o in map.osds.values().filter(|o| !o.up) {
        let lost = if o.lost_at > 0 {
            " (declared lost)"
        } else {
            ""
        };
        problems.push(format!("osd.{} is down{lost}", o.id));
    }
    for id in &unreachable {
        problems.push(format!("osd.{id} is up in the map but does not answer"));
    }
    if pgs.inactive > 0 {
        problems.push(format!(
            "{} pgs inactive (fewer than min_size OSDs up): writes to them wait",
            pgs.inactive
        ));
    }
    if !down_pgs.is_empty() {
        problems.push(format!(
            "{} pgs down (no I/O): they wait for an OSD that may hold newer writes to come \
             back ({}); `cairn osd lost N --yes-i-really-mean-it` gives one up",
            down_pgs.len(),
            pg_osd_list(&down_pgs)
        ));
    }
    if !lost_pgs.is_empty() {
        problems.push(format!(
            "{} pgs went active giving up OSDs declared lost: writes only those OSDs held may \
             be lost ({})",
            lost_pgs.len(),
            pg_osd_list(&lost_pgs)
        ));
    }
    if scrub_bad > 0 {
        problems.push(format!(
            "{scrub_bad} object copies found inconsistent by scrub and not repaired \
             (see the OSD logs; `cairn pg scrub` repairs what has a good copy)"
        ));
    }
    for f in &failed_pgs {
        let pg = cairn_map::PgId {
            pool: f.pool,
            pg: f.pg,
        };
        if f.unfound > 0 {
            problems.push(format!(
                "pg {pg} has {} unfound objects: no OSD that answered has their newest \
                 writes; it waits for one that has them, or `cairn pg list-unfound {pg}` and \
                 `cairn pg mark-unfound-lost {pg} revert|delete --yes-i-really-mean-it`",
                f.unfound
            ));
            continue;
        }
        problems.push(format!(
            "pg {pg} cannot go active: {} ({}; not retried until the map changes; `cairn pg \
             query {pg}`)",
            f.why, f.class
        ));
    }
    problems.extend(
        crashes
            .iter()
            .map(|(osd, c)| crate::crash::status_line(*osd, c)),
    );
    if peering > 0 {
        problems.push(format!(
            "{peering} pgs peering or recovering: I/O to them waits until they are active"
        ));
    }
    if misplaced > 0 {
        problems.push(format!(
            "{misplaced} PG copies misplaced: OSDs that are no longer members of those PGs keep \
             them until the PGs are clean on their members, then delete them"
        ));
    }
    for (osd, s) in &slow {
        let whom = if s.waiting_for == *osd {
            "its own store commit".to_string()
        } else {
            format!("osd.{}", s.waiting_for)
        };
        problems.push(format!(
            "{} slow writes in the last minute on osd.{osd} waiting for {whom} (longest {:.1} s): \
             see osd.{osd}'s log for each one's stages; a slow or stuck OSD, device or network",
            s.count,
            s.longest_ms as f64 / 1000.0
        ));
    }
    if pgs.degraded > 0 {
        problems.push(format!(
            "{} pgs degraded (fewer replicas than size)",
            pgs.degraded
        ));
    }
    let placer = map.placer();
    for p in map.pools.values() {
        let (domains, unit) = ClusterMap::failure_domains(&placer, p.rule);
        if p.size as usize <= domains {
            continue;
        }
        let effect = if p.min_size as usize > domains {
            format!("below its min_size {} its PGs take no writes", p.min_size)
        } else {
            "its PGs stay degraded".to_string()
        };
        let units = plural(unit);
        problems.push(format!(
            "pool {} has size {} but the cluster has {domains} failure domains for it \
             ({units} holding in OSDs; its copies go to distinct {units}): {effect} until \
             there are enough",
            p.name, p.size
        ));
    }
    for p in map.pools.values().filter(|p| p.ec().is_some()) {
        problems.push(format!(
            "pool {} is erasure-coded ({}): its PGs do not read a moved shard from its \
             previous OSD, so mark out at most one of its OSDs at a time and let its shards \
             be backfilled first; a PG down waiting for an OSD that is out comes back once \
             that OSD is marked in (docs/format/ec.md, \"Moving shards\")",
            p.name,
            p.kind()
        ));
    }
    for p in map
        .pools
        .values()
        .filter(|p| p.durability == Durability::Memory)
    {
        problems.push(format!(
            "pool {} uses durability memory: acknowledged writes are flushed a few ms after their ack; a power loss of every member in that window can lose them (not a process crash)",
            p.name
        ));
    }
    let mon_line = match &mons {
        Ok(s) => format!(
            "{} monitors, leader mon.{}",
            s.members.len(),
            s.leader
                .map(|l| l.to_string())
                .unwrap_or_else(|| "none".into())
        ),
        Err(e) => format!("monitor status unavailable: {e}"),
    };
    if json {
        let v = serde_json::json!({
            "health": health,
            "problems": problems,
            "epoch": map.epoch,
            "fenced_clients": map.blocklist.len(),
            "fsid": crate::conf::hex16(&map.fsid),
            "mons": mons.as_ref().ok().map(|s| serde_json::json!({
                "members": s.members.len(), "leader": s.leader, "term": s.term,
                "history_oldest_epoch": s.history_oldest,
                "authentication": if s.authenticated { "key" } else { "none" },
                "frames": frames_name(s.frames)})),
            "osds": {"total": osds, "up": up, "in": inn},
            "capacity": {"used_bytes": used, "total_bytes": capacity,
                         "osds_reporting": usage.len() - unreachable.len()},
            "pgs": {"total": pgs.total, "active_clean": pgs.clean,
                    "active_degraded": pgs.degraded, "inactive": pgs.inactive,
                    "peering": peering, "misplaced_copies": misplaced,
                    "removed_pool_copies": reclaiming,
                    "down": down_pgs.len(), "lost_writes": lost_pgs.len()},
            "down_pgs": down_pgs.iter().map(pg_osds_json).collect::<Vec<_>>(),
            "lost_write_pgs": lost_pgs.iter().map(pg_osds_json).collect::<Vec<_>>(),
            "recovery": {"objects_recovered": recovered, "objects_degraded": degraded,
                         "bytes_per_sec": rec_bps, "objects_per_sec": rec_ops,
                         "seconds_left": seconds_left},
            "scrub": {"unrepaired": scrub_bad, "repaired": scrub_repaired},
            "failed_pgs": failed_pgs.iter().map(|f| serde_json::json!({
                "pg": cairn_map::PgId { pool: f.pool, pg: f.pg }.to_string(),
                "class": f.class, "why": f.why, "unfound": f.unfound})).collect::<Vec<_>>(),
            "crashes": crashes.iter().flat_map(|(osd, c)| c.iter().map(move |c|
                crate::crash::json(*osd, c))).collect::<Vec<_>>(),
            "slow_ops": slow.iter().map(|(osd, s)| serde_json::json!({
                "osd": osd, "waiting_for": s.waiting_for, "count": s.count,
                "longest_ms": s.longest_ms})).collect::<Vec<_>>(),
            "cache": {"hits": totals.cache_hits, "misses": totals.cache_misses,
                      "hit_ratio": totals.hit_ratio(), "bytes": totals.cache_bytes,
                      "capacity_bytes": totals.cache_capacity},
            "memory": {"used_bytes": totals.memory_used, "target_bytes": totals.memory_target},
            "pools": map.pools.values().map(|p| {
                let mut v = pool_json(p);
                v["usable_bytes"] = serde_json::json!(usable(p));
                v["capacity_bytes"] = serde_json::json!(pool_capacity(p));
                v["provisioned_bytes"] = match provisioned.get(&p.name) {
                    Some(Ok(b)) => serde_json::json!(b),
                    _ => serde_json::Value::Null,
                };
                v["overcommit"] = serde_json::json!(overcommit(p).map(|o| o.2));
                if let Some(by_missing) = map.ec_pgs_by_missing_shards(&placer, p.id) {
                    v["pgs_by_missing_shards"] = serde_json::json!(by_missing);
                }
                v
            }).collect::<Vec<_>>(),
        });
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(());
    }
    println!("cluster {}", crate::conf::hex16(&map.fsid));
    println!("  health: {health}");
    for p in &problems {
        println!("    {p}");
    }
    match &mons {
        Ok(s) => println!(
            "  map:    epoch {} (history kept from epoch {})",
            map.epoch, s.history_oldest
        ),
        Err(_) => println!("  map:    epoch {}", map.epoch),
    }
    if !map.blocklist.is_empty() {
        println!(
            "  fenced: {} client instances (`cairn osd blocklist ls`)",
            map.blocklist.len()
        );
    }
    println!("  mon:    {mon_line}");
    if let Ok(s) = &mons {
        let auth = if s.authenticated {
            "every connection authenticated (keys, tickets)"
        } else {
            "none (--auth none: anyone who can connect may do anything)"
        };
        println!("  auth:   {auth}; frames {}", frames_name(s.frames));
    }
    println!("  osd:    {osds} osds: {up} up, {inn} in");
    println!(
        "  usage:  {} used of {} (object data, all replicas; {} of {up} up OSDs reporting)",
        crate::size::human(used),
        crate::size::human(capacity),
        usage.len() - unreachable.len()
    );
    println!(
        "  pgs:    {} total: {} active+clean, {} active+degraded, {} inactive, {} down; {peering} peering; {misplaced} misplaced copies",
        pgs.total, pgs.clean, pgs.degraded, pgs.inactive, down_pgs.len()
    );
    if reclaiming > 0 {
        println!(
            "  reclaim: {reclaiming} PG copies of removed pools being deleted (their space comes back as they go)"
        );
    }
    if degraded > 0 {
        println!(
            "  recovery: {degraded} objects degraded (being recovered), {}/s, {rec_ops} objects/s, {}",
            crate::size::human(rec_bps),
            seconds_left.map_or("time left unknown yet".to_string(), |s| format!(
                "about {s} s left"
            ))
        );
    }
    println!("  recovered: {recovered} objects since the OSDs started");
    println!("  cache:  {}", totals.cache_line());
    println!(
        "  scrub:  {scrub_repaired} object copies repaired since the OSDs started, {scrub_bad} left inconsistent"
    );
    for p in map.pools.values() {
        let mut room = usable(p).map_or("usable space unknown".to_string(), |b| {
            format!("room for about {} more", crate::size::human(b))
        });
        if let Some((prov, _, ratio)) = overcommit(p) {
            room.push_str(&format!(
                "; volumes {} provisioned ({ratio:.1}x its capacity)",
                crate::size::human(prov)
            ));
        }
        println!(
            "  pool {}: {}, size {} min_size {} pgs {} durability {}; {room}",
            p.name,
            p.kind(),
            p.size,
            p.min_size,
            p.pg_count,
            p.durability.name()
        );
        if let Some(by_missing) = map.ec_pgs_by_missing_shards(&placer, p.id) {
            let k = p.ec().map(|e| usize::from(e.k));
            println!("    shards: {}", ec_shards_line(&by_missing, k));
        }
    }
    Ok(())
}
