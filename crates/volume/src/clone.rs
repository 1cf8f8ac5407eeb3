//! Clones (`vol clone VOL@SNAP NEW`): a new volume whose data objects, until written, are
//! read from a protected snapshot of another volume, and `vol flatten`, which copies them so
//! the clone stands alone (docs/format/volume.md, "Clones").
//!
//! A clone's data object is copied up whole from the parent before its first change (created
//! with the OSDs' create-if-absent op: of a writer and a flatten racing, one copy lands), so
//! an object that exists in the clone always holds all of it. A punched object stays, empty.

use crate::error::VolumeError;
use crate::header::{self, check_name, data_object, Header, FEATURE_PARENT};
use crate::holder::read_snaps;
use crate::join::join_all;
use crate::layout::Piece;
use crate::snaps::{snaps_object, ParentLink, SnapTable, SNAPS_PREFIX};
use crate::volume::{read_header, Volume};
use cairn_client::{Client, ClientError};

/// Data objects flattened at once.
const FLATTEN_PARALLEL: usize = 8;

impl Volume {
    /// The parent link as this process adopted it last (gone once flattened).
    fn link(&self) -> Option<ParentLink> {
        self.lease.snaps().table.parent.clone()
    }

    /// Whether data object `objno` of this clone is read from the parent while missing.
    pub(crate) fn parent_covers(&self, objno: u64) -> bool {
        self.parent.is_some()
            && self
                .link()
                .is_some_and(|l| objno.saturating_mul(self.object_size()) < l.overlap)
    }

    /// A piece of a data object missing from this clone, from the parent (`None`: no parent,
    /// or beyond what it covers: zeros).
    pub(crate) async fn read_parent(&self, p: Piece) -> Result<Option<Vec<u8>>, VolumeError> {
        let (Some(parent), Some(link)) = (&self.parent, self.link()) else {
            return Ok(None);
        };
        let start = p.objno * self.object_size() + p.offset;
        if start >= link.overlap {
            return Ok(None);
        }
        let len = p.len.min(link.overlap - start);
        Box::pin(parent.read(start, len)).await.map(Some)
    }

    /// The whole of data object `objno` as reads see it now (empty: absent).
    pub(crate) async fn current_object(&self, objno: u64) -> Result<Vec<u8>, VolumeError> {
        let head = data_object(self.header.id, objno);
        let os = self.object_size();
        match self.client.read(self.data_pool, &head, 0, os).await {
            Ok(b) => Ok(b),
            Err(ClientError::NoSuchObject { .. }) => {
                let whole = Piece {
                    objno,
                    offset: 0,
                    len: os,
                    at: 0,
                };
                let mut b = self.read_parent(whole).await?.unwrap_or_default();
                // Zeros past the parent's data are the object's; trailing zeros need no bytes.
                let end = b.iter().rposition(|&x| x != 0).map_or(0, |i| i + 1);
                b.truncate(end);
                Ok(b)
            }
            Err(e) => Err(self.object_error("read", objno, e)),
        }
    }

    /// Before the first change of data object `objno` of a clone: copies it whole from the
    /// parent, unless it exists already.
    pub(crate) async fn copy_up(&self, objno: u64) -> Result<(), VolumeError> {
        if !self.parent_covers(objno) || self.map.may_exist(objno) {
            return Ok(());
        }
        let head = data_object(self.header.id, objno);
        match self.client.stat(self.data_pool, &head).await {
            Ok(_) => {
                self.map.writing(objno);
                return Ok(());
            }
            Err(ClientError::NoSuchObject { .. }) => {}
            Err(e) => return Err(self.object_error("look for", objno, e)),
        }
        let bytes = self.current_object(objno).await?;
        match self.client.create(self.data_pool, &head, &bytes).await {
            Ok(()) | Err(ClientError::Exists { .. }) => {
                self.map.writing(objno);
                Ok(())
            }
            Err(e) => Err(self.object_error("copy up from the parent", objno, e)),
        }
    }
}

/// Creates volume `name` as a clone of protected snapshot `snap` of volume `parent`: instant,
/// nothing is copied until written.
pub async fn clone_volume(
    client: &Client,
    pool_name: &str,
    parent: &str,
    snap: &str,
    name: &str,
) -> Result<Header, VolumeError> {
    check_name(name)?;
    let pool = client.pool_id(pool_name)?;
    let ph = read_header(client, pool, pool_name, parent).await?;
    let s = crate::snapshot::find_active(client, pool, parent, &ph, snap).await?;
    if !s.protected {
        return Err(VolumeError::Snap {
            name: parent.to_string(),
            snap: snap.to_string(),
            why: format!(
                "is not protected: `cairn vol snap protect {parent}@{snap}` first (a clone \
                 reads it, so it must not be removed)"
            ),
        });
    }
    let h = Header {
        id: rand::random(),
        size: s.size,
        object_size: ph.object_size,
        features: FEATURE_PARENT,
        created: crate::admin::now_secs(),
        removing: false,
        close: false,
        // Its own data objects go where the parent's are.
        data_pool: ph.data_pool,
    };
    // The link first: a clone's header never exists without it.
    let table = SnapTable {
        generation: 1,
        parent: Some(ParentLink {
            volume_id: ph.id,
            snap_id: s.id,
            overlap: s.size,
            volume: parent.to_string(),
            snap: snap.to_string(),
        }),
        ..SnapTable::default()
    };
    client
        .write_full(pool, &snaps_object(h.id), &table.encode())
        .await?;
    match client
        .create(pool, &header::header_object(name), &h.encode())
        .await
    {
        Ok(()) => Ok(h),
        Err(e) => {
            let _ = client.remove(pool, &snaps_object(h.id)).await;
            match e {
                ClientError::Exists { .. } => Err(VolumeError::Exists {
                    pool: pool_name.to_string(),
                    name: name.to_string(),
                }),
                e => Err(e.into()),
            }
        }
    }
}

/// Copies every data object clone `name` still reads from its parent (with progress), then
/// drops the link: the clone stands alone and the parent snapshot may be unprotected. Safe
/// while the clone is served and written.
pub async fn flatten(
    client: &Client,
    pool_name: &str,
    name: &str,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<(), VolumeError> {
    let desc = format!("cairn vol flatten (pid {})", std::process::id());
    let vol = Volume::open_shared(client.clone(), pool_name, name, &desc).await?;
    let Some(link) = vol.link() else {
        vol.close().await;
        return Err(VolumeError::BadArgument {
            what: "volume",
            why: format!("{name:?} is not a clone (or is flattened already)"),
        });
    };
    let total = link.overlap.div_ceil(vol.object_size());
    let mut done = 0;
    progress(done, total);
    let all: Vec<u64> = (0..total).collect();
    for chunk in all.chunks(FLATTEN_PARALLEL) {
        let copies = chunk.iter().map(|&n| {
            let vol = &vol;
            async move { vol.gated(|| vol.copy_up(n)).await }
        });
        join_all(copies.collect())
            .await
            .into_iter()
            .collect::<Result<(), _>>()?;
        done += chunk.len() as u64;
        progress(done, total);
    }
    let pool = vol.pool;
    vol.close().await;
    let h = read_header(client, pool, pool_name, name).await?;
    let (mut table, tag) = crate::holder::read_snaps_tag(client, pool, name, h.id).await?;
    table.parent = None;
    let pools = (pool, crate::header::data_pool(pool, &h));
    crate::snapshot::change_table(client, pools, name, (h.id, tag), &mut table).await?;
    let h = Header {
        features: h.features & !FEATURE_PARENT,
        ..h
    };
    client
        .write_full(pool, &header::header_object(name), &h.encode())
        .await?;
    Ok(())
}

/// The clones (volume names) of snapshot `snap_id` of volume `volume_id` in the pool.
pub(crate) async fn children(
    client: &Client,
    pool: u32,
    pool_name: &str,
    volume_id: u64,
    snap_id: u64,
) -> Result<Vec<String>, VolumeError> {
    let listing = client.list(pool).await?;
    let mut ids = Vec::new();
    for o in &listing {
        let Some(id) = std::str::from_utf8(o)
            .ok()
            .and_then(|s| s.strip_prefix(SNAPS_PREFIX))
            .and_then(|h| u64::from_str_radix(h, 16).ok())
        else {
            continue;
        };
        let t = read_snaps(client, pool, "?", id).await?;
        if t.parent
            .is_some_and(|l| l.volume_id == volume_id && l.snap_id == snap_id)
        {
            ids.push(id);
        }
    }
    if ids.is_empty() {
        return Ok(Vec::new());
    }
    let mut names = Vec::new();
    for name in listing.iter().filter_map(|o| header::volume_of_header(o)) {
        match read_header(client, pool, pool_name, name).await {
            Ok(h) if ids.contains(&h.id) => names.push(name.to_string()),
            Ok(_) | Err(VolumeError::NoSuchVolume { .. }) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(names)
}
