//! Entities: who holds a key. `mon.N` (a monitor; all monitors share the monitor key),
//! `osd.N` (an OSD daemon), `client.NAME` (a program using the native API, `cairn` itself as
//! `client.admin`), `nbd.NAME` (an NBD gateway).

use serde::{Deserialize, Serialize};
use std::fmt;

/// Longest entity name, in bytes.
pub const MAX_ENTITY_LEN: usize = 64;

/// What kind of entity a name is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum EntityKind {
    Mon,
    Osd,
    Client,
    Nbd,
}

impl EntityKind {
    /// The name's prefix.
    pub fn prefix(self) -> &'static str {
        match self {
            EntityKind::Mon => "mon",
            EntityKind::Osd => "osd",
            EntityKind::Client => "client",
            EntityKind::Nbd => "nbd",
        }
    }
}

/// An entity's name, checked: `KIND.ID` with a known kind, an id of letters, digits, `-` and
/// `_` (a number for `osd` and `mon`), at most [`MAX_ENTITY_LEN`] bytes in all.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct Entity {
    kind: EntityKind,
    id: String,
}

/// Why a string is not an entity name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{name:?} is not an entity name: {why} (expected mon.N, osd.N, client.NAME or nbd.NAME)")]
pub struct BadEntity {
    pub name: String,
    pub why: &'static str,
}

impl Entity {
    /// The OSD daemon `osd.{id}`.
    pub fn osd(id: u32) -> Entity {
        Entity {
            kind: EntityKind::Osd,
            id: id.to_string(),
        }
    }

    /// The monitor `mon.{id}`.
    pub fn mon(id: u64) -> Entity {
        Entity {
            kind: EntityKind::Mon,
            id: id.to_string(),
        }
    }

    /// The administrator's entity, `client.admin`.
    pub fn admin() -> Entity {
        Entity {
            kind: EntityKind::Client,
            id: "admin".into(),
        }
    }

    pub fn kind(&self) -> EntityKind {
        self.kind
    }

    pub fn id(&self) -> &str {
        &self.id
    }

    /// The OSD id of an `osd.N`.
    pub fn osd_id(&self) -> Option<u32> {
        (self.kind == EntityKind::Osd).then(|| self.id.parse().ok())?
    }

    /// Parses and checks a name.
    pub fn parse(s: &str) -> Result<Entity, BadEntity> {
        let bad = |why| BadEntity {
            name: s.chars().take(MAX_ENTITY_LEN + 8).collect(),
            why,
        };
        if s.len() > MAX_ENTITY_LEN {
            return Err(bad("too long"));
        }
        let (kind, id) = s.split_once('.').ok_or_else(|| bad("no '.'"))?;
        let kind = match kind {
            "mon" => EntityKind::Mon,
            "osd" => EntityKind::Osd,
            "client" => EntityKind::Client,
            "nbd" => EntityKind::Nbd,
            _ => return Err(bad("unknown kind")),
        };
        if id.is_empty() {
            return Err(bad("empty id"));
        }
        if !id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        {
            return Err(bad("the id may hold only letters, digits, '-' and '_'"));
        }
        let numeric = matches!(kind, EntityKind::Osd | EntityKind::Mon);
        if numeric && (id.parse::<u32>().is_err() || id.len() > 1 && id.starts_with('0')) {
            return Err(bad("an osd or mon id is a number"));
        }
        Ok(Entity {
            kind,
            id: id.to_string(),
        })
    }
}

impl fmt::Display for Entity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.kind.prefix(), self.id)
    }
}

impl std::str::FromStr for Entity {
    type Err = BadEntity;
    fn from_str(s: &str) -> Result<Entity, BadEntity> {
        Entity::parse(s)
    }
}

impl TryFrom<String> for Entity {
    type Error = BadEntity;
    fn try_from(s: String) -> Result<Entity, BadEntity> {
        Entity::parse(&s)
    }
}

impl From<Entity> for String {
    fn from(e: Entity) -> String {
        e.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_parse_and_print_back() {
        for s in ["mon.0", "osd.12", "client.admin", "nbd.gw-1", "client.a_b"] {
            assert_eq!(Entity::parse(s).unwrap().to_string(), s);
        }
        assert_eq!(Entity::parse("osd.7").unwrap().osd_id(), Some(7));
        assert_eq!(Entity::parse("client.7").unwrap().osd_id(), None);
        for s in [
            "",
            "osd",
            "osd.",
            "osd.x",
            "osd.01",
            "foo.1",
            "client.a.b",
            "client.a b",
            "client.é",
            &format!("client.{}", "a".repeat(60)),
        ] {
            assert!(Entity::parse(s).is_err(), "{s:?}");
        }
    }
}
