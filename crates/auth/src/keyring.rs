//! Keyring files: the secret keys a process holds, as TOML, readable by its owner only.
//!
//! ```toml
//! # Cairn keyring: secret keys. Keep it private (mode 0600).
//! [[key]]
//! entity = "client.admin"
//! secret = "5f1c...64 hex digits...9a"
//! caps = { mon = "*", osd = "*", nbd = "*" }   # optional: what `cairn dev up` registers
//! ```

use crate::{Caps, Entity, Secret};
use serde::{Deserialize, Serialize};
use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::Path;

/// Largest keyring file read.
pub const MAX_KEYRING_BYTES: u64 = 1 << 20;

/// One key of a keyring.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeyEntry {
    pub entity: Entity,
    #[serde(with = "secret_hex")]
    pub secret: Secret,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub caps: Option<Caps>,
}

/// A keyring: the keys of one file.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Keyring {
    #[serde(default, rename = "key")]
    pub keys: Vec<KeyEntry>,
}

/// Why a keyring could not be read or written. Each names the file.
#[derive(Debug, thiserror::Error)]
pub enum KeyringError {
    #[error("cannot read keyring {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("cannot write keyring {path}: {source}")]
    Write {
        path: String,
        source: std::io::Error,
    },
    #[error("keyring {path} is readable by others (mode {mode:o}); it holds secret keys: chmod 600 {path}")]
    Exposed { path: String, mode: u32 },
    #[error("keyring {path} is over {MAX_KEYRING_BYTES} bytes")]
    TooLarge { path: String },
    #[error("keyring {path} is not valid: {why}")]
    Invalid { path: String, why: String },
    #[error("keyring {path} has no key for {entity}")]
    NoKey { path: String, entity: Entity },
}

mod secret_hex {
    use crate::Secret;
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(s: &Secret, ser: S) -> Result<S::Ok, S::Error> {
        ser.serialize_str(&s.to_hex())
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Secret, D::Error> {
        let s = String::deserialize(d)?;
        Secret::from_hex(&s).map_err(serde::de::Error::custom)
    }
}

/// What tells a keyring file changed since it was read: its modification time alone misses a
/// rewrite within the file system's timestamp tick (a few ms on ext4), so the inode (every
/// [`write_private`] renames a new file into place) and the length count too.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FileStamp {
    modified: Option<std::time::SystemTime>,
    inode: u64,
    len: u64,
}

impl FileStamp {
    /// The stamp of the file at `path` now; `None` when it cannot be read.
    pub fn of(path: &Path) -> Option<FileStamp> {
        use std::os::unix::fs::MetadataExt;
        let m = std::fs::metadata(path).ok()?;
        Some(FileStamp {
            modified: m.modified().ok(),
            inode: m.ino(),
            len: m.len(),
        })
    }
}

impl Keyring {
    /// The key of `entity`.
    pub fn get(&self, entity: &Entity) -> Option<&KeyEntry> {
        self.keys.iter().find(|k| &k.entity == entity)
    }

    /// The first key of the keyring (a process's own key when the file holds one).
    pub fn first(&self) -> Option<&KeyEntry> {
        self.keys.first()
    }

    /// Adds `entry`, replacing a key of the same entity.
    pub fn put(&mut self, entry: KeyEntry) {
        self.keys.retain(|k| k.entity != entry.entity);
        self.keys.push(entry);
    }

    /// Parses keyring text (`path` names it in errors).
    pub fn parse(path: &str, text: &str) -> Result<Keyring, KeyringError> {
        let k: Keyring = toml::from_str(text).map_err(|e| KeyringError::Invalid {
            path: path.into(),
            why: e.to_string(),
        })?;
        for key in &k.keys {
            if let Some(c) = &key.caps {
                c.validate().map_err(|e| KeyringError::Invalid {
                    path: path.into(),
                    why: format!("{}: {e}", key.entity),
                })?;
            }
        }
        Ok(k)
    }

    /// Reads a keyring file; one that others can read is refused.
    pub fn load(path: &Path) -> Result<Keyring, KeyringError> {
        let p = path.display().to_string();
        let read = |source| KeyringError::Read {
            path: p.clone(),
            source,
        };
        let meta = std::fs::metadata(path).map_err(read)?;
        let mode = meta.permissions().mode() & 0o777;
        if mode & 0o077 != 0 {
            return Err(KeyringError::Exposed { path: p, mode });
        }
        if meta.len() > MAX_KEYRING_BYTES {
            return Err(KeyringError::TooLarge { path: p });
        }
        let text = std::fs::read_to_string(path).map_err(read)?;
        Keyring::parse(&p, &text)
    }

    /// Reads a keyring file and returns the key of `entity`.
    pub fn load_key(path: &Path, entity: &Entity) -> Result<KeyEntry, KeyringError> {
        let k = Keyring::load(path)?;
        k.get(entity).cloned().ok_or_else(|| KeyringError::NoKey {
            path: path.display().to_string(),
            entity: entity.clone(),
        })
    }

    /// Writes the keyring to `path`, mode 0600, replacing the file atomically.
    pub fn save(&self, path: &Path) -> Result<(), KeyringError> {
        let p = path.display().to_string();
        let write = |source| KeyringError::Write {
            path: p.clone(),
            source,
        };
        let text = toml::to_string(self).map_err(|e| KeyringError::Invalid {
            path: p.clone(),
            why: e.to_string(),
        })?;
        let header = "# Cairn keyring: secret keys. Keep it private (mode 0600).\n";
        write_private(path, format!("{header}{text}").as_bytes()).map_err(write)
    }
}

/// Writes a file of secrets: mode 0600 from its creation, synced, replacing `path`
/// atomically (a crash leaves the old file or the new one).
pub fn write_private(path: &Path, contents: &[u8]) -> std::io::Result<()> {
    let tmp = path.with_extension("tmp");
    let _ = std::fs::remove_file(&tmp);
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&tmp)?;
    f.write_all(contents).and_then(|_| f.sync_all())?;
    std::fs::rename(&tmp, path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_keyring_round_trips_private_and_refuses_exposure() {
        let dir = std::env::temp_dir().join(format!("cairn-keyring-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("k");
        let mut k = Keyring::default();
        k.put(KeyEntry {
            entity: Entity::admin(),
            secret: Secret::generate(),
            caps: Some(Caps::admin()),
        });
        k.put(KeyEntry {
            entity: Entity::osd(3),
            secret: Secret::generate(),
            caps: None,
        });
        k.save(&path).unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        assert_eq!(Keyring::load(&path).unwrap(), k);
        assert_eq!(
            Keyring::load_key(&path, &Entity::osd(3)).unwrap().secret,
            k.keys[1].secret
        );
        let e = Keyring::load_key(&path, &Entity::osd(4)).unwrap_err();
        assert!(e.to_string().contains("no key for osd.4"), "{e}");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let e = Keyring::load(&path).unwrap_err();
        assert!(e.to_string().contains("chmod 600"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
        for bad in [
            "[[key]]\nentity = \"osd.x\"\nsecret = \"00\"\n",
            &format!("[[key]]\nentity = \"osd.1\"\nsecret = \"{}\"\n", "0".repeat(63)),
            &format!(
                "[[key]]\nentity = \"osd.1\"\nsecret = \"{}\"\ncaps = {{ mon = \"q\", osd = \"\", nbd = \"\" }}\n",
                "0".repeat(64)
            ),
        ] {
            let e = Keyring::parse("t", bad).unwrap_err();
            assert!(e.to_string().starts_with("keyring t is not valid"), "{e}");
        }
    }
}
