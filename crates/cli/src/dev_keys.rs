//! A dev cluster's keys: `cairn dev up` authenticates like any cluster.
//!
//! - `DIR/keyring`: `client.admin` (every cap), what `cairn.toml` points commands at;
//! - `DIR/mon.I/keyring`: the monitors' shared key as `mon.I`, and the bootstrap keys
//!   (`client.admin` and each OSD's, with caps) the first leader seeds the monitors' key
//!   database with;
//! - `DIR/osd.I/keyring`: `osd.I`, the key OSD I boots with.
//!
//! Existing keys are kept; new OSDs get new keys, which `dev up` registers with the monitors
//! (`cairn auth import`) once they run.

use anyhow::{Context, Result};
use cairn_auth::{Caps, Entity, EntityKind, KeyEntry, Keyring, Secret};
use std::path::{Path, PathBuf};

fn load_or_new(path: &Path) -> Result<Keyring> {
    if path.exists() {
        return Ok(Keyring::load(path)?);
    }
    Ok(Keyring::default())
}

fn key_in(path: &Path, entity: &Entity, caps: Option<Caps>) -> Result<KeyEntry> {
    let mut ring = load_or_new(path)?;
    if let Some(k) = ring.get(entity) {
        return Ok(k.clone());
    }
    let k = KeyEntry {
        entity: entity.clone(),
        secret: Secret::generate(),
        caps,
    };
    ring.put(k.clone());
    if let Some(d) = path.parent() {
        std::fs::create_dir_all(d).with_context(|| format!("cannot create {}", d.display()))?;
    }
    ring.save(path)?;
    Ok(k)
}

/// Creates what is missing; returns the administrator's keyring.
pub fn ensure(dir: &Path, mons: usize, osds: u32) -> Result<PathBuf> {
    let admin_path = dir.join("keyring");
    let admin = key_in(&admin_path, &Entity::admin(), Some(Caps::admin()))?;
    let mon_secret = load_or_new(&dir.join("mon.0").join("keyring"))?
        .keys
        .into_iter()
        .find(|k| k.entity.kind() == EntityKind::Mon)
        .map(|k| k.secret)
        .unwrap_or_else(Secret::generate);
    let mut admitted = vec![admin];
    for i in 0..osds {
        let path = dir.join(format!("osd.{i}")).join("keyring");
        admitted.push(key_in(&path, &Entity::osd(i), None)?);
    }
    for i in 0..mons {
        let mut ring = Keyring::default();
        ring.put(KeyEntry {
            entity: Entity::mon(i as u64),
            secret: mon_secret.clone(),
            caps: None,
        });
        for k in &admitted {
            ring.put(k.clone());
        }
        let path = dir.join(format!("mon.{i}")).join("keyring");
        if load_or_new(&path).ok().as_ref() != Some(&ring) {
            std::fs::create_dir_all(dir.join(format!("mon.{i}")))?;
            ring.save(&path)?;
        }
    }
    Ok(admin_path)
}
