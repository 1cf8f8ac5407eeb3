//! Capabilities: what an entity may do, checked by whoever serves the request.
//!
//! An entity's caps are three strings, one per service:
//!
//! - `mon`: letters from `r` (read the map and status, get tickets), `w` (change the cluster
//!   map: pools, OSDs), `x` (manage keys: `cairn auth`); `*` is all three.
//! - `osd`: grants separated by `,`, each `PERMS` or `PERMS pool=NAME`: `r` (read objects), `w`
//!   (write, remove), `x` (class and admin ops: scrub). A grant without `pool=` covers every pool.
//! - `nbd`: grants, each `PERMS` or `PERMS volume=NAME`: `r` (open read-only), `w` (open for
//!   writing). An NBD gateway checks them for the NBD users it serves (who prove who they
//!   are with a TLS pre-shared key derived from their entity key). `x` in a grant without
//!   `volume=` makes the entity a gateway: it may fetch every NBD user's pre-shared key and
//!   caps from the monitors.
//!
//! Daemons (`mon.N`, `osd.N`) are not described by caps: their role comes from their entity
//! kind and the map (an OSD may act only as the OSD id its key is bound to).

use serde::{Deserialize, Serialize};
use std::fmt;

/// Longest caps string, in bytes.
pub const MAX_CAPS_LEN: usize = 1024;

/// A set of permission letters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Perms(u8);

impl Perms {
    pub const NONE: Perms = Perms(0);
    pub const R: Perms = Perms(1);
    pub const W: Perms = Perms(2);
    pub const X: Perms = Perms(4);
    pub const ALL: Perms = Perms(7);

    /// Every permission of `need` is here.
    pub fn covers(self, need: Perms) -> bool {
        self.0 & need.0 == need.0
    }

    fn union(self, o: Perms) -> Perms {
        Perms(self.0 | o.0)
    }

    /// Parses letters from `r`, `w`, `x`, or `*`.
    pub fn parse(s: &str) -> Result<Perms, BadCaps> {
        if s == "*" {
            return Ok(Perms::ALL);
        }
        if s.is_empty() {
            return Err(BadCaps(format!("empty permissions in {s:?}")));
        }
        let mut p = Perms::NONE;
        for c in s.chars() {
            p = p.union(match c {
                'r' => Perms::R,
                'w' => Perms::W,
                'x' => Perms::X,
                _ => {
                    return Err(BadCaps(format!(
                        "{s:?}: permissions are letters from r, w, x (or *)"
                    )))
                }
            });
        }
        Ok(p)
    }
}

impl fmt::Display for Perms {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (bit, c) in [(Perms::R, 'r'), (Perms::W, 'w'), (Perms::X, 'x')] {
            if self.covers(bit) {
                write!(f, "{c}")?;
            }
        }
        if *self == Perms::NONE {
            f.write_str("-")?;
        }
        Ok(())
    }
}

/// Why a caps string was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("bad caps: {0}")]
pub struct BadCaps(pub String);

/// One grant: permissions, on every resource or on the one named.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Grant {
    pub perms: Perms,
    pub on: Option<String>,
}

/// An entity's capabilities, as stored (the strings) and parsed.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Caps {
    pub mon: String,
    pub osd: String,
    pub nbd: String,
}

fn parse_grants(s: &str, scope: &str) -> Result<Vec<Grant>, BadCaps> {
    if s.len() > MAX_CAPS_LEN {
        return Err(BadCaps(format!("over {MAX_CAPS_LEN} bytes")));
    }
    let mut out = Vec::new();
    for g in s.split(',').map(str::trim).filter(|g| !g.is_empty()) {
        let mut words = g.split_whitespace();
        let perms = Perms::parse(words.next().unwrap_or_default())?;
        let on = match words.next() {
            None => None,
            Some(w) => {
                let name = w
                    .strip_prefix(scope)
                    .and_then(|r| r.strip_prefix('='))
                    .filter(|n| !n.is_empty())
                    .ok_or_else(|| BadCaps(format!("{g:?}: expected `PERMS {scope}=NAME`")))?;
                Some(name.to_string())
            }
        };
        if words.next().is_some() {
            return Err(BadCaps(format!("{g:?}: expected `PERMS {scope}=NAME`")));
        }
        out.push(Grant { perms, on });
    }
    Ok(out)
}

fn allowed(grants: &[Grant], name: &str) -> Perms {
    grants
        .iter()
        .filter(|g| g.on.as_deref().is_none_or(|n| n == name))
        .fold(Perms::NONE, |p, g| p.union(g.perms))
}

impl Caps {
    /// Every permission on everything (`client.admin`).
    pub fn admin() -> Caps {
        Caps {
            mon: "*".into(),
            osd: "*".into(),
            nbd: "*".into(),
        }
    }

    /// Checks the three strings; caps are checked when set, so a stored set always parses.
    pub fn validate(&self) -> Result<(), BadCaps> {
        if !self.mon.is_empty() {
            if self.mon.len() > MAX_CAPS_LEN {
                return Err(BadCaps(format!("mon caps over {MAX_CAPS_LEN} bytes")));
            }
            Perms::parse(self.mon.trim())?;
        }
        parse_grants(&self.osd, "pool")?;
        parse_grants(&self.nbd, "volume")?;
        Ok(())
    }

    /// What the monitor caps allow.
    pub fn mon_perms(&self) -> Perms {
        match self.mon.trim() {
            "" => Perms::NONE,
            s => Perms::parse(s).unwrap_or(Perms::NONE),
        }
    }

    /// What the OSD caps allow on pool `pool`.
    pub fn pool_perms(&self, pool: &str) -> Perms {
        allowed(&parse_grants(&self.osd, "pool").unwrap_or_default(), pool)
    }

    /// Whether this entity may serve NBD users (an unscoped `x` in its NBD caps).
    pub fn serves_nbd(&self) -> bool {
        parse_grants(&self.nbd, "volume")
            .unwrap_or_default()
            .iter()
            .any(|g| g.on.is_none() && g.perms.covers(Perms::X))
    }

    /// What the NBD caps allow on volume `volume`.
    pub fn volume_perms(&self, volume: &str) -> Perms {
        allowed(
            &parse_grants(&self.nbd, "volume").unwrap_or_default(),
            volume,
        )
    }
}

impl fmt::Display for Caps {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "mon '{}' osd '{}' nbd '{}'",
            self.mon, self.osd, self.nbd
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn caps(mon: &str, osd: &str, nbd: &str) -> Caps {
        Caps {
            mon: mon.into(),
            osd: osd.into(),
            nbd: nbd.into(),
        }
    }

    #[test]
    fn grants_add_up_per_resource() {
        let c = caps("r", "r, rw pool=vms, x pool=vms", "r volume=a");
        c.validate().unwrap();
        assert_eq!(c.mon_perms(), Perms::R);
        assert_eq!(c.pool_perms("vms"), Perms::ALL);
        assert_eq!(c.pool_perms("other"), Perms::R);
        assert!(c.volume_perms("a").covers(Perms::R));
        assert!(!c.volume_perms("a").covers(Perms::W));
        assert_eq!(c.volume_perms("b"), Perms::NONE);
        assert_eq!(Caps::admin().pool_perms("x"), Perms::ALL);
        assert_eq!(Caps::default().mon_perms(), Perms::NONE);
        assert!(!c.serves_nbd());
        assert!(!caps("", "", "x volume=a").serves_nbd());
        assert!(caps("", "", "rx").serves_nbd());
        assert!(Caps::admin().serves_nbd());
        assert_eq!(Perms::parse("rx").unwrap().to_string(), "rx");
    }

    #[test]
    fn bad_caps_are_refused_with_the_reason() {
        for c in [
            caps("rq", "", ""),
            caps("", "rw pol=a", ""),
            caps("", "rw pool=", ""),
            caps("", "rw pool=a b", ""),
            caps("", "", "z"),
            caps("", &"r,".repeat(600), ""),
        ] {
            let e = c.validate().unwrap_err();
            assert!(e.to_string().starts_with("bad caps"), "{e}");
        }
    }
}
