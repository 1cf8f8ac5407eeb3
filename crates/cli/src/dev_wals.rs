//! WAL directories of dev clusters in /dev/shm (`cairn-<fsid>/`), and finding those whose
//! cluster is gone: a cluster directory deleted by hand (not `dev down --purge`) leaves its
//! WALs in memory for good.
//!
//! Each WAL directory holds an `owner` file naming the cluster directory (absolute path) that
//! uses it. It is an orphan when that directory no longer holds a `dev.toml` of the same fsid.
//! WAL directories without an owner file (made by an older `cairn`) are never called orphans.

use anyhow::{Context, Result};
use std::path::{Path, PathBuf};

/// Where dev clusters put their WALs.
const SHM: &str = "/dev/shm";
/// Name prefix of a dev cluster's WAL directory.
const PREFIX: &str = "cairn-";
/// The file naming a WAL directory's cluster directory.
const OWNER: &str = "owner";

/// Records that the cluster in `cluster_dir` uses `wal_dir`.
pub fn claim(wal_dir: &Path, cluster_dir: &Path) -> Result<()> {
    let abs = std::fs::canonicalize(cluster_dir)
        .with_context(|| format!("cannot resolve {}", cluster_dir.display()))?;
    let owner = wal_dir.join(OWNER);
    std::fs::write(&owner, abs.display().to_string())
        .with_context(|| format!("cannot write {}", owner.display()))
}

/// A WAL directory whose cluster is gone, with the bytes it holds.
pub struct Orphan {
    pub path: PathBuf,
    pub owner: PathBuf,
    pub bytes: u64,
}

/// The WAL directories in /dev/shm whose cluster directory is gone.
pub fn orphans() -> Vec<Orphan> {
    let Ok(rd) = std::fs::read_dir(SHM) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for e in rd.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some(fsid) = name.strip_prefix(PREFIX) else {
            continue;
        };
        let Ok(owner) = std::fs::read_to_string(e.path().join(OWNER)) else {
            continue;
        };
        let owner = PathBuf::from(owner.trim());
        if !owns(&owner, fsid) {
            out.push(Orphan {
                bytes: dir_bytes(&e.path()),
                path: e.path(),
                owner,
            });
        }
    }
    out.sort_by(|a, b| a.path.cmp(&b.path));
    out
}

/// Whether `cluster_dir` holds the dev cluster `fsid`.
fn owns(cluster_dir: &Path, fsid: &str) -> bool {
    let Ok(t) = std::fs::read_to_string(cluster_dir.join("dev.toml")) else {
        return false;
    };
    let Ok(v) = toml::from_str::<toml::Value>(&t) else {
        // Unreadable: not ours to judge; keep the WALs.
        return true;
    };
    v.get("fsid").and_then(|f| f.as_str()) == Some(fsid)
}

fn dir_bytes(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .map(|rd| {
            rd.flatten()
                .filter_map(|e| e.metadata().ok())
                .map(|m| m.len())
                .sum()
        })
        .unwrap_or(0)
}

/// Tells (on stderr) about orphaned WAL directories, if any.
pub fn report() {
    let o = orphans();
    if o.is_empty() {
        return;
    }
    let bytes: u64 = o.iter().map(|x| x.bytes).sum();
    eprintln!(
        "note: {} WAL director{} in {SHM} belong{} to dev clusters whose directory is gone \
         ({} of memory); `cairn dev down --purge-orphan-wals` removes them",
        o.len(),
        if o.len() == 1 { "y" } else { "ies" },
        if o.len() == 1 { "s" } else { "" },
        crate::size::human(bytes)
    );
}

/// Removes every orphaned WAL directory; prints each.
pub fn remove_orphans() -> Result<()> {
    let o = orphans();
    for x in &o {
        std::fs::remove_dir_all(&x.path)
            .with_context(|| format!("cannot remove {}", x.path.display()))?;
        println!(
            "removed {} ({}, WALs of the gone cluster {})",
            x.path.display(),
            crate::size::human(x.bytes),
            x.owner.display()
        );
    }
    if o.is_empty() {
        println!("no orphaned WAL directories in {SHM}");
    }
    Ok(())
}
