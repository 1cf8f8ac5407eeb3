//! Moving object bytes between a PG's primary and its members (recovery, backfill, scrub
//! repair): reads (pulls) from a source, pushes to a destination, either side this OSD's
//! store or a member over its connection.

use super::copy;
use super::dirty::Dirty;
use super::member;
use super::rpc::Rpc;
use crate::context::Osd;
use crate::failure::Failure;
use cairn_map::PgId;
use cairn_proto::msg::peering::{
    PgDone, PgList, PgNames, PgObject, PgPull, PgPush, PushKind, LIST_CALL, PULL_CALL, PUSH_CALL,
    RECOVERY_CHUNK,
};
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// Copying a byte range costs about this much more than its bytes (two loopback round trips,
/// ~0.3 ms, against ~80 MB/s of recovery): an object with many small changed ranges is
/// copied whole instead.
const RANGE_COST: u64 = 32 << 10;

/// Where object bytes come from or go to: this OSD's store or a member over its connection.
pub(crate) enum End<'a> {
    Local,
    Remote(&'a mut Rpc),
}

/// Moves object bytes between this OSD (a PG's primary) and the PG's members.
pub(crate) struct Ctx {
    pub osd: Arc<Osd>,
    pub pg: PgId,
    pub epoch: u64,
}

impl Ctx {
    pub async fn read(
        &self,
        src: &mut End<'_>,
        object: &[u8],
        offset: u64,
    ) -> Result<(PgObject, Vec<u8>), Failure> {
        self.read_len(src, object, offset, RECOVERY_CHUNK).await
    }

    /// Up to `len` bytes (at most [`RECOVERY_CHUNK`]) of an object at `offset`.
    pub async fn read_len(
        &self,
        src: &mut End<'_>,
        object: &[u8],
        offset: u64,
        len: u64,
    ) -> Result<(PgObject, Vec<u8>), Failure> {
        match src {
            // Off the shard's thread: up to 4 MiB from the device.
            End::Local => {
                let (osd, pg, object) = (self.osd.clone(), self.pg, object.to_vec());
                tokio::task::spawn_blocking(move || {
                    copy::pull(&osd.store, pg, &object, offset, len).map_err(Failure::from)
                })
                .await
                .map_err(|e| Failure::transient(format!("reading for recovery: {e}")))?
            }
            End::Remote(rpc) => {
                let p = PgPull {
                    epoch: self.epoch,
                    pool: self.pg.pool,
                    pg: self.pg.pg,
                    object: object.to_vec(),
                    offset,
                    len: len.min(RECOVERY_CHUNK),
                };
                Ok(rpc.ask(PULL_CALL, &p, &[]).await?)
            }
        }
    }

    pub async fn push(
        &self,
        dst: &mut End<'_>,
        kind: PushKind,
        data: &[u8],
    ) -> Result<(), Failure> {
        match self.push_reply(dst, kind, data).await? {
            PgDone::Done => Ok(()),
            other => Err(crate::failure::refused("the member", &other)),
        }
    }

    /// Applies one push to `dst` and returns its answer.
    pub async fn push_reply(
        &self,
        dst: &mut End<'_>,
        kind: PushKind,
        data: &[u8],
    ) -> Result<PgDone, Failure> {
        if matches!(
            kind,
            PushKind::Recover { .. } | PushKind::RecoverRemove { .. }
        ) {
            // A recovery or backfill about to push one piece of an object (after the members
            // got the new log and their missing marks).
            fail::fail_point!("osd_recovery_push");
        }
        if !matches!(kind, PushKind::Log { .. }) {
            let rec = &self.osd.recovery;
            rec.bytes.fetch_add(data.len() as u64, Ordering::Relaxed);
        }
        match dst {
            End::Local => {
                let pg = self.pg;
                crate::shard::with_pg(&self.osd, pg, |shard| member::apply(shard, pg, &kind, data))
                    .ok_or_else(|| Failure::transient("the OSD is shutting down (no shard)"))
            }
            End::Remote(rpc) => {
                let p = PgPush {
                    epoch: self.epoch,
                    pool: self.pg.pool,
                    pg: self.pg.pg,
                    primary: self.osd.id(),
                    kind,
                };
                Ok(rpc.ask(PUSH_CALL, &p, data).await?.0)
            }
        }
    }

    /// Brings `dst`'s copy of `object` to `src`'s: the bytes in `dirty` (or all of it) and
    /// its size, or its absence; the last push drops `dst`'s missing mark. With `guarded`,
    /// each push is refused ([`PgDone::Busy`]) if the object changed after `src` read it.
    pub async fn copy_object(
        &self,
        src: &mut End<'_>,
        dst: &mut End<'_>,
        object: &[u8],
        dirty: &Dirty,
        guarded: bool,
    ) -> Result<PgDone, Failure> {
        let (o, _) = self.read_len(src, object, 0, 0).await?;
        let since = guarded.then_some(o.version);
        if !o.exists {
            let kind = PushKind::RecoverRemove {
                object: object.to_vec(),
                since,
            };
            return self.push_reply(dst, kind, &[]).await;
        }
        let (whole, pieces) = pieces(dirty, o.size);
        let push = |offset, reset, last| PushKind::Recover {
            object: object.to_vec(),
            offset,
            size: o.size,
            reset,
            last,
            since,
        };
        if pieces.is_empty() {
            return self.push_reply(dst, push(0, whole, true), &[]).await;
        }
        let n = pieces.len();
        for (i, (offset, len)) in pieces.into_iter().enumerate() {
            let (_, bytes) = self.read_len(src, object, offset, len).await?;
            let done = self
                .push_reply(dst, push(offset, whole && i == 0, i + 1 == n), &bytes)
                .await?;
            if done != PgDone::Done {
                return Ok(done);
            }
        }
        Ok(PgDone::Done)
    }

    pub async fn names(&self, src: &mut End<'_>) -> Result<Vec<Vec<u8>>, Failure> {
        let mut out = Vec::new();
        let mut after: Option<Vec<u8>> = None;
        loop {
            let page: PgNames = match src {
                End::Local => copy::list(&self.osd.store, self.pg, after.as_deref())?,
                End::Remote(rpc) => {
                    let l = PgList {
                        epoch: self.epoch,
                        pool: self.pg.pool,
                        pg: self.pg.pg,
                        after: after.clone(),
                    };
                    rpc.ask(LIST_CALL, &l, &[]).await?.0
                }
            };
            after = page.names.last().cloned();
            out.extend(page.names);
            if !page.more || after.is_none() {
                return Ok(out);
            }
        }
    }
}

/// What to copy of an object of `size` bytes: whether it is a whole copy, and the pieces
/// (offset, length), each at most [`RECOVERY_CHUNK`].
fn pieces(dirty: &Dirty, size: u64) -> (bool, Vec<(u64, u64)>) {
    let ranges: Vec<(u64, u64)> = match dirty {
        Dirty::Whole => Vec::new(),
        Dirty::Ranges(r) => r
            .iter()
            .map(|&(s, e)| (s, e.min(size)))
            .filter(|(s, e)| s < e)
            .collect(),
    };
    let cost: u64 = ranges.iter().map(|(s, e)| e - s + RANGE_COST).sum();
    let whole = matches!(dirty, Dirty::Whole) || cost >= size;
    let ranges = if whole { vec![(0, size)] } else { ranges };
    let mut out = Vec::new();
    for (mut at, end) in ranges {
        while at < end {
            let len = (end - at).min(RECOVERY_CHUNK);
            out.push((at, len));
            at += len;
        }
    }
    (whole, out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_changes_copy_ranges_and_large_ones_the_whole_object() {
        let d = Dirty::Ranges(vec![(4096, 8192), (1 << 20, u64::MAX)]);
        assert_eq!(
            pieces(&d, 4 << 20),
            (false, vec![(4096, 4096), (1 << 20, 3 << 20)])
        );
        // Cut off at the end: nothing to copy, only the size.
        assert_eq!(
            pieces(&Dirty::Ranges(vec![(100, u64::MAX)]), 100),
            (false, vec![])
        );
        // Ranges costing more than the object: a whole copy, in chunks.
        let many = Dirty::Ranges((0..40).map(|i| (i * 8192, i * 8192 + 10)).collect());
        assert_eq!(pieces(&many, 1 << 20), (true, vec![(0, 1 << 20)]));
        let big = 9 << 20;
        assert_eq!(
            pieces(&Dirty::Whole, big),
            (
                true,
                vec![(0, 4 << 20), (4 << 20, 4 << 20), (8 << 20, 1 << 20)]
            )
        );
        assert_eq!(pieces(&Dirty::Whole, 0), (true, vec![]));
    }
}
