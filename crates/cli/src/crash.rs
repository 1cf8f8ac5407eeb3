//! Crashes: which commands are daemons that fail stop (a panic aborts them after a crash
//! report, `cairn_failstop`), and where their reports go.

use crate::{mon_cmd::MonCmd, nbd_cmd::NbdCmd, osd_cmd::OsdCmd, store_cmd::StoreCmd, Cmd};
use anyhow::Result;
use cairn_failstop::CRASH_DIR_ENV;
use cairn_proto::msg::osd::CrashSummary;
use std::path::{Path, PathBuf};

/// The daemon `cmd` runs, if it is one: the name its crash reports carry until it knows its
/// entity, and its crash directory (`CAIRN_CRASH_DIR`, else `DIR/crash` for OSDs and
/// monitors; the NBD server and the dashboard have no directory of their own and then only
/// log their panic).
pub(crate) fn daemon_of(cmd: &Cmd) -> Option<(String, Option<PathBuf>)> {
    let env_dir = std::env::var_os(CRASH_DIR_ENV).map(PathBuf::from);
    Some(match cmd {
        Cmd::Osd(OsdCmd::Run(a)) => (format!("osd ({})", a.dir.display()), Some(dir_of(&a.dir))),
        Cmd::Mon(MonCmd::Run(a)) => (
            a.id.map_or_else(
                || format!("mon ({})", a.dir.display()),
                |id| format!("mon.{id}"),
            ),
            env_dir.or_else(|| Some(a.dir.join("crash"))),
        ),
        Cmd::Nbd(NbdCmd::Serve(a)) => (format!("nbd-server@{}", a.listen), env_dir),
        Cmd::Dashboard(_) => ("dashboard".to_string(), env_dir),
        // The store under an OSD's load, for the crash tests: it fails stop like an OSD.
        Cmd::Store(StoreCmd::Torture(_)) => ("store-torture".to_string(), env_dir),
        _ => return None,
    })
}

/// The crash directory of a daemon whose data directory is `dir`.
pub(crate) fn dir_of(dir: &Path) -> PathBuf {
    std::env::var_os(CRASH_DIR_ENV).map_or_else(|| dir.join("crash"), PathBuf::from)
}

fn now_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// "5 min ago", "3 h ago", "2 days ago".
fn ago(secs: u64) -> String {
    let d = now_secs().saturating_sub(secs);
    match d {
        0..120 => format!("{d} s ago"),
        120..7200 => format!("{} min ago", d / 60),
        7200..172_800 => format!("{} h ago", d / 3600),
        _ => format!("{} days ago", d / 86_400),
    }
}

/// `cairn status`'s line for an OSD's recent crashes (newest first).
pub(crate) fn status_line(osd: u32, c: &[CrashSummary]) -> String {
    let Some(last) = c.first() else {
        return String::new();
    };
    format!(
        "osd.{osd} crashed {} time(s) in the last 14 days, last {} at {}: {} (`cairn crash ls`;          the report with its backtrace is in the OSD's crash directory)",
        c.len(),
        ago(last.time_secs),
        last.location,
        last.message
    )
}

pub(crate) fn json(osd: u32, c: &CrashSummary) -> serde_json::Value {
    serde_json::json!({"osd": osd, "id": c.id, "time_secs": c.time_secs,
                       "location": c.location, "message": c.message})
}

#[derive(clap::Args)]
pub struct CrashLsArgs {
    /// Print JSON (one object per crash: osd, id, time_secs, location, message).
    #[arg(long)]
    json: bool,
}

#[derive(clap::Subcommand)]
pub enum CrashCmd {
    /// List the recent crashes (panics) of the up OSDs, newest first.
    Ls(CrashLsArgs),
}

pub fn run(cmd: CrashCmd, conf: Option<&Path>) -> Result<()> {
    let CrashCmd::Ls(a) = cmd;
    let mon = crate::admin::mon_client(conf)?;
    let map = crate::admin::block_on_mon(&mon.addrs(), mon.get_map())??;
    let usage = crate::admin::block_on(crate::capacity::up_osd_stats(&map))?;
    let mut all: Vec<(u32, CrashSummary)> = Vec::new();
    let mut unreachable = Vec::new();
    for (id, r) in &usage {
        match r {
            Ok(s) => all.extend(s.crashes.iter().map(|c| (*id, c.clone()))),
            Err(_) => unreachable.push(format!("osd.{id}")),
        }
    }
    all.sort_by_key(|(_, c)| std::cmp::Reverse(c.time_secs));
    if a.json {
        let v: Vec<_> = all.iter().map(|(o, c)| json(*o, c)).collect();
        println!("{}", serde_json::Value::Array(v));
    } else if all.is_empty() {
        println!("no recent crashes");
    } else {
        println!(
            "{:<7} {:<14} {:<40} {:<40} MESSAGE",
            "OSD", "WHEN", "ID", "WHERE"
        );
        for (o, c) in &all {
            println!(
                "{:<7} {:<14} {:<40} {:<40} {}",
                format!("osd.{o}"),
                ago(c.time_secs),
                c.id,
                c.location,
                c.message
            );
        }
    }
    if !unreachable.is_empty() {
        eprintln!(
            "not answering (their crashes are not listed): {}",
            unreachable.join(", ")
        );
    }
    Ok(())
}
