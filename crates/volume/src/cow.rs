//! Copy-on-write for snapshots, at data object granularity (docs/format/volume.md,
//! "Snapshots").
//!
//! Before a data object is first changed after a snapshot, its bytes are kept in a clone
//! object named after the newest active snapshot: the clone is created exclusively, so of two
//! writers racing (or one writer retrying) exactly one copy lands, and always before the head
//! object changes. A snapshot's read of an object uses its oldest clone not older than the
//! snapshot; without one, the head still holds what the snapshot saw.

use crate::error::VolumeError;
use crate::header::data_object;
use crate::layout::Piece;
use crate::snaps::clone_object;
use crate::volume::Volume;
use cairn_client::ClientError;
use cairn_failstop::LockOrDie;

impl Volume {
    /// Makes sure data object `objno` may change: its bytes are kept for the newest active
    /// snapshot first, if they are not yet.
    pub(crate) async fn preserve(&self, objno: u64) -> Result<(), VolumeError> {
        let view = self.lease.snaps();
        let Some(latest) = view.table.latest_active() else {
            return Ok(());
        };
        if view.is_preserved(objno) {
            return Ok(());
        }
        let id = self.header.id;
        for c in view.table.clone_ids().into_iter().filter(|&c| c >= latest) {
            match self
                .client
                .stat(self.data_pool, &clone_object(id, objno, c))
                .await
            {
                Ok(_) => {
                    view.mark_preserved(objno);
                    return Ok(());
                }
                Err(ClientError::NoSuchObject { .. }) => {}
                Err(e) => return Err(self.object_error("look for the clone of", objno, e)),
            }
        }
        // Absent objects are cloned too (empty): the snapshot must read zeros there later (or,
        // in a clone, what its parent held).
        let bytes = self.current_object(objno).await?;
        let clone = clone_object(id, objno, latest);
        match self.client.create(self.data_pool, &clone, &bytes).await {
            // Exists: another writer (or an earlier attempt) kept the same bytes first.
            Ok(()) | Err(ClientError::Exists { .. }) => {
                view.mark_preserved(objno);
                Ok(())
            }
            Err(e) => Err(self.object_error("clone for a snapshot", objno, e)),
        }
    }

    /// A snapshot's read of one piece.
    pub(crate) async fn read_snap_piece(
        &self,
        snap: u64,
        p: Piece,
    ) -> Result<Option<Vec<u8>>, VolumeError> {
        let known = self.lock_resolved().get(&p.objno).copied();
        if let Some(c) = known {
            if let Some(d) = self.read_clone(p, c).await? {
                return Ok(Some(d));
            }
            self.lock_resolved().remove(&p.objno);
        }
        let view = self.lease.snaps();
        let candidates: Vec<u64> = view
            .table
            .clone_ids()
            .into_iter()
            .filter(|&c| c >= snap)
            .collect();
        if let Some(d) = self.probe_clones(p, &candidates).await? {
            return Ok(Some(d));
        }
        let head = self.read_head(p).await?;
        // A writer clones before it changes the head: if the head changed before this read,
        // the clone is there now.
        if let Some(d) = self.probe_clones(p, &candidates).await? {
            return Ok(Some(d));
        }
        Ok(head)
    }

    /// The piece from the first of `candidates` clones that exists (remembered for next time).
    async fn probe_clones(
        &self,
        p: Piece,
        candidates: &[u64],
    ) -> Result<Option<Vec<u8>>, VolumeError> {
        for &c in candidates {
            if let Some(d) = self.read_clone(p, c).await? {
                self.lock_resolved().insert(p.objno, c);
                return Ok(Some(d));
            }
        }
        Ok(None)
    }

    async fn read_clone(&self, p: Piece, c: u64) -> Result<Option<Vec<u8>>, VolumeError> {
        let name = clone_object(self.header.id, p.objno, c);
        match self
            .client
            .read(self.data_pool, &name, p.offset, p.len)
            .await
        {
            Ok(mut d) => {
                d.truncate(p.len as usize);
                Ok(Some(d))
            }
            Err(ClientError::NoSuchObject { .. }) => Ok(None),
            Err(e) => Err(self.object_error("read the clone of", p.objno, e)),
        }
    }

    fn lock_resolved(&self) -> std::sync::MutexGuard<'_, std::collections::HashMap<u64, u64>> {
        self.resolved.lock_or_die()
    }

    /// Sets data object `objno` back to what snapshot `snap` saw, given the ids of its clones
    /// (ascending); the object is preserved for newer snapshots first, like any write.
    pub(crate) async fn roll_back_object(
        &self,
        objno: u64,
        clones: &[u64],
        snap: u64,
    ) -> Result<(), VolumeError> {
        let Some(c) = crate::snaps::clone_for(clones, snap) else {
            return Ok(()); // unchanged since the snapshot
        };
        let name = clone_object(self.header.id, objno, c);
        let bytes = match self
            .client
            .read(self.data_pool, &name, 0, self.object_size())
            .await
        {
            Ok(b) => b,
            Err(e) => return Err(self.object_error("read the clone of", objno, e)),
        };
        self.preserve(objno).await?;
        let head = data_object(self.header.id, objno);
        let r = if bytes.is_empty() {
            match self.client.remove(self.data_pool, &head).await {
                Err(ClientError::NoSuchObject { .. }) => Ok(()),
                r => r,
            }
        } else {
            self.note_writing(objno).await?;
            self.client
                .write_full(self.data_pool, &head, &bytes)
                .await
                .map(|_| ())
        };
        r.map_err(|e| self.object_error("roll back", objno, e))
    }
}
