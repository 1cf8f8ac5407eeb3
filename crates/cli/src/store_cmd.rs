//! `cairn store mkfs|info|scrub`: format, inspect and verify a local store.

use crate::size::{human, parse_size};
use anyhow::{bail, Context, Result};
use cairn_store::format::{Superblock, SUPERBLOCK_MAGIC};
use cairn_store::{AlignedBuf, BlockDevice, Devices, FileDevice, Store, StoreConfig, BLOCK_SIZE};
use clap::{Args, Subcommand};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

#[derive(Subcommand)]
pub enum StoreCmd {
    /// Format devices as a new, empty store (destroys what they hold).
    ///
    /// Regular files are created (or extended) to --size; block devices use their whole size.
    /// Refuses to overwrite a device that already holds a Cairn store unless --force is given.
    Mkfs(MkfsArgs),
    /// Open a store and print its identity, contents and space usage.
    ///
    /// Opening replays the WAL as an OSD would; closing writes a final checkpoint.
    Info(OpenArgs),
    /// Open a store and verify the checksum of every data block on every device, the WAL
    /// header and every copy of the current checkpoint.
    ///
    /// Prints a report; exits with status 3 when it found damaged data, 1 when it could not
    /// run, 0 when everything verified.
    Scrub(OpenArgs),
    /// Developer: run a verifiable mixed workload until killed (for the kill -9 test).
    #[command(hide = true)]
    Torture(crate::torture::TortureArgs),
}

/// The devices of a store, as every subcommand takes them.
#[derive(Args)]
pub struct DeviceArgs {
    /// Data device (file or block device). Give it twice for a two-device mirror; the order
    /// matters and must be the same on every later command.
    #[arg(long = "data", value_name = "PATH", required = true, num_args = 1)]
    data: Vec<PathBuf>,
    /// Separate WAL device (a file on tmpfs or persistent memory, or a fast NVMe/Optane
    /// device). Without it the WAL lives at the start of the first data device.
    #[arg(long, value_name = "PATH")]
    wal: Option<PathBuf>,
}

#[derive(Args)]
pub struct MkfsArgs {
    #[command(flatten)]
    devs: DeviceArgs,
    /// Size of each data file, e.g. 10G (K, M, G, T are powers of 1024). Files are created or
    /// extended to it. Default: the current size of the file or block device.
    #[arg(long, value_name = "BYTES", value_parser = parse_size, allow_hyphen_values = true)]
    size: Option<u64>,
    /// Size of the WAL: of the --wal file (created or extended to it), or, without --wal, of the
    /// WAL region at the start of the first data device.
    #[arg(long, value_name = "BYTES", value_parser = parse_size, allow_hyphen_values = true, default_value = "256M")]
    wal_size: u64,
    /// Segment size: the unit of data-device writes and of cleaning. A multiple of 4 KiB, at
    /// least 64 KiB.
    #[arg(long, value_name = "BYTES", value_parser = parse_size, allow_hyphen_values = true, default_value = "4M")]
    segment_size: u64,
    /// Format even if a device already holds a Cairn store (its data is lost).
    #[arg(long)]
    force: bool,
}

#[derive(Args)]
pub struct OpenArgs {
    #[command(flatten)]
    devs: DeviceArgs,
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
}

pub fn run(cmd: StoreCmd) -> Result<ExitCode> {
    match cmd {
        StoreCmd::Mkfs(a) => mkfs(a).map(|()| ExitCode::SUCCESS),
        StoreCmd::Info(a) => info(a).map(|()| ExitCode::SUCCESS),
        StoreCmd::Scrub(a) => scrub(a),
        StoreCmd::Torture(a) => crate::torture::run(a),
    }
}

fn check_count(d: &DeviceArgs) -> Result<()> {
    if d.data.len() > 2 {
        bail!(
            "{} data devices given; give one --data, or two for a mirror",
            d.data.len()
        );
    }
    Ok(())
}

fn open_file(path: &Path, size: u64, role: &str) -> Result<Arc<dyn BlockDevice>> {
    let d = FileDevice::open(path, size, role)
        .with_context(|| format!("cannot open {role} device {}", path.display()))?;
    if d.size() < (BLOCK_SIZE as u64) {
        bail!(
            "{role} device {} holds less than one 4 KiB block; give a --size of at least a few MiB \
             to create or extend it",
            path.display()
        );
    }
    Ok(Arc::new(d))
}

/// Opens existing devices (never creating a file).
pub(crate) fn open_existing(d: &DeviceArgs) -> Result<Devices> {
    check_count(d)?;
    let mut data = Vec::new();
    for (i, p) in d.data.iter().enumerate() {
        let role = format!("data{i}");
        std::fs::metadata(p)
            .with_context(|| format!("cannot open {role} device {}", p.display()))?;
        data.push(open_file(p, 0, &role)?);
    }
    let wal = match &d.wal {
        Some(p) => {
            std::fs::metadata(p)
                .with_context(|| format!("cannot open WAL device {}", p.display()))?;
            Some(open_file(p, 0, "wal")?)
        }
        None => None,
    };
    Ok(Devices { data, wal })
}

fn read_first_block(dev: &dyn BlockDevice) -> Result<AlignedBuf> {
    let mut b = AlignedBuf::zeroed(BLOCK_SIZE);
    dev.read_at(&mut b, 0)
        .with_context(|| format!("cannot read the superblock of {}", dev.name()))?;
    Ok(b)
}

fn mkfs(a: MkfsArgs) -> Result<()> {
    check_count(&a.devs)?;
    let size = a.size.unwrap_or(0);
    if size == 0 {
        if let Some(p) = a.devs.data.iter().find(|p| !p.exists()) {
            bail!(
                "data device {} does not exist; give --size to create it as a file",
                p.display()
            );
        }
    }
    let mut data = Vec::new();
    for (i, p) in a.devs.data.iter().enumerate() {
        data.push(open_file(p, size, &format!("data{i}"))?);
    }
    let wal = match &a.devs.wal {
        Some(p) => Some(open_file(p, a.wal_size, "wal")?),
        None => None,
    };
    if !a.force {
        for d in data.iter().chain(wal.iter()) {
            let b = read_first_block(d.as_ref())?;
            if &b[4..12] == SUPERBLOCK_MAGIC {
                bail!(
                    "{} already holds a Cairn store; add --force to format it anyway (its data is lost)",
                    d.name()
                );
            }
        }
    }
    let cfg = StoreConfig {
        segment_size: a.segment_size,
        wal_size: a.wal_size,
        ..StoreConfig::default()
    };
    let devs = Devices { data, wal };
    let id = Store::mkfs(&devs, &cfg).context("mkfs failed")?;
    let sb = Superblock::decode(&read_first_block(devs.data[0].as_ref())?)
        .map_err(anyhow::Error::msg)
        .context("the superblock just written does not read back")?;
    println!(
        "formatted store {}: {} data device{} of {} ({} segments of {}), WAL {}",
        hex(&id),
        devs.data.len(),
        if devs.data.len() == 1 {
            ""
        } else {
            "s (mirror)"
        },
        human(sb.device_size),
        sb.segment_count,
        human(sb.segment_size),
        match &devs.wal {
            Some(w) => format!("on {} ({})", w.name(), human(w.size())),
            None => format!("on data0 ({})", human(sb.wal_size)),
        }
    );
    Ok(())
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn open_store(a: &OpenArgs) -> Result<(Store, Superblock, Vec<String>)> {
    let devs = open_existing(&a.devs)?;
    let names: Vec<String> = devs
        .data
        .iter()
        .chain(devs.wal.iter())
        .map(|d| d.name().to_string())
        .collect();
    let sb = Superblock::decode(&read_first_block(devs.data[0].as_ref())?)
        .map_err(anyhow::Error::msg)
        .with_context(|| format!("device {} is not usable", devs.data[0].name()))?;
    let store = Store::open(&devs, StoreConfig::default())
        .with_context(|| format!("cannot open the store on {}", names.join(", ")))?;
    Ok((store, sb, names))
}

struct Contents {
    collections: u64,
    objects: u64,
    object_bytes: u64,
    allocated_bytes: u64,
}

fn contents(s: &Store) -> Result<Contents> {
    let mut c = Contents {
        collections: 0,
        objects: 0,
        object_bytes: 0,
        allocated_bytes: 0,
    };
    for coll in s.list_collections() {
        c.collections += 1;
        let mut after: Option<Vec<u8>> = None;
        loop {
            let names = s.list_objects(coll, after.as_deref(), 1024)?;
            for n in &names {
                let st = s.stat(coll, n)?;
                c.objects += 1;
                c.object_bytes += st.size;
                c.allocated_bytes += st.allocated;
            }
            match names.last() {
                Some(l) => after = Some(l.clone()),
                None => break,
            }
        }
    }
    Ok(c)
}

fn info(a: OpenArgs) -> Result<()> {
    let (store, sb, names) = open_store(&a)?;
    let c = contents(&store)?;
    let s = store.stats();
    store.close().context("closing the store failed")?;
    let seg = sb.segment_size;
    if a.json {
        let v = serde_json::json!({
            "store_id": hex(&sb.store_id),
            "format_version": cairn_store::format::FORMAT_VERSION,
            "created_unix": sb.created_unix,
            "devices": names,
            "data_devices": sb.data_devices,
            "device_size": sb.device_size,
            "segment_size": seg,
            "collections": c.collections,
            "objects": c.objects,
            "object_bytes": c.object_bytes,
            "allocated_bytes": c.allocated_bytes,
            "segments_total": s.segments_total,
            "segments_free": s.segments_free,
            "live_bytes": s.live_bytes,
            "checkpoint_bytes": s.checkpoint_bytes,
            "free_bytes": s.segments_free as u64 * seg,
            "wal_size": s.wal_size,
            "wal_used_bytes": s.wal_used_bytes,
        });
        println!("{v}");
        return Ok(());
    }
    println!("store:        {}", hex(&sb.store_id));
    println!(
        "format:       version {}, created {} (Unix time)",
        cairn_store::format::FORMAT_VERSION,
        sb.created_unix
    );
    println!("devices:      {}", names.join(", "));
    println!(
        "layout:       {} data device{} of {}, {} segments of {}",
        sb.data_devices,
        if sb.data_devices == 1 {
            ""
        } else {
            "s (mirror)"
        },
        human(sb.device_size),
        s.segments_total,
        human(seg)
    );
    println!("collections:  {}", c.collections);
    println!(
        "objects:      {} ({} in object sizes, {} allocated)",
        c.objects,
        human(c.object_bytes),
        human(c.allocated_bytes)
    );
    println!(
        "space:        {} live data, {} checkpoint, {} free ({} of {} segments)",
        human(s.live_bytes),
        human(s.checkpoint_bytes),
        human(s.segments_free as u64 * seg),
        s.segments_free,
        s.segments_total
    );
    println!(
        "wal:          {} ring, {} in use",
        human(s.wal_size),
        human(s.wal_used_bytes)
    );
    Ok(())
}

fn scrub(a: OpenArgs) -> Result<ExitCode> {
    let (store, _sb, names) = open_store(&a)?;
    let r = store.scrub();
    store.close().context("closing the store failed")?;
    if a.json {
        let issues: Vec<_> = r
            .issues
            .iter()
            .map(|i| {
                serde_json::json!({
                    "collection": i.coll, "object": i.object, "block": i.block,
                    "device": i.device, "detail": i.detail,
                })
            })
            .collect();
        let v = serde_json::json!({
            "devices": names,
            "objects": r.objects,
            "blocks": r.blocks,
            "bytes_read": r.bytes_read,
            "issues": issues,
        });
        println!("{v}");
    } else {
        for i in &r.issues {
            println!(
                "damaged: collection {} object {:?} block {} on {}: {}",
                i.coll, i.object, i.block, i.device, i.detail
            );
        }
        println!(
            "scrub: {} objects, {} blocks, {} read: {}",
            r.objects,
            r.blocks,
            human(r.bytes_read),
            if r.issues.is_empty() {
                "no issues".to_string()
            } else {
                format!("{} ISSUES", r.issues.len())
            }
        );
    }
    Ok(if r.issues.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(3)
    })
}
