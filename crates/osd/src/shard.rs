//! Shard threads: each owns the PGs that hash to it and runs their ops to completion, in
//! arrival order, without locks shared with other shards.

use crate::daemon::Osd;
use crate::op;
use crate::pgstate::PgState;
use cairn_map::{ClusterMap, PgId};
use cairn_proto::msg::osd::{OpRequest, RepOp};
use cairn_proto::stream::FrameSender;
use std::collections::HashMap;
use std::sync::mpsc::Receiver;
use std::sync::Arc;

/// Work for a shard.
pub enum ShardMsg {
    /// A client op on a PG of this shard.
    Op {
        reply: FrameSender,
        req_id: u64,
        req: OpRequest,
        data: Vec<u8>,
    },
    /// A write forwarded by a primary.
    Rep {
        reply: FrameSender,
        req_id: u64,
        op: RepOp,
        data: Vec<u8>,
    },
    /// A write with parked reads completed in this PG.
    WriteDone(PgId),
}

/// The shard index of a PG among `n` shards.
pub fn shard_of(pg: PgId, n: usize) -> usize {
    let h = (pg.pool as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ pg.pg as u64;
    (h % n.max(1) as u64) as usize
}

/// One shard's state.
pub struct Shard {
    pub osd: Arc<Osd>,
    pub pgs: HashMap<PgId, PgState>,
}

impl Shard {
    /// Runs until every sender is gone.
    pub fn run(mut self, rx: Receiver<ShardMsg>) {
        while let Ok(msg) = rx.recv() {
            match msg {
                ShardMsg::Op {
                    reply,
                    req_id,
                    req,
                    data,
                } => op::handle_client_op(&mut self, reply, req_id, req, data),
                ShardMsg::Rep {
                    reply,
                    req_id,
                    op,
                    data,
                } => op::write::handle_rep(&mut self, reply, req_id, op, data),
                ShardMsg::WriteDone(pg) => self.retry_parked(pg),
            }
        }
    }

    /// The state of `pg`, loaded on first use, with its placement current for `map`.
    pub fn pg(&mut self, map: &ClusterMap, pg: PgId) -> &mut PgState {
        let osd = &self.osd;
        let st = self
            .pgs
            .entry(pg)
            .or_insert_with(|| PgState::load(&osd.store, pg));
        if st.placement_epoch != map.epoch {
            st.placement = osd.placement(map, pg);
            st.placement_epoch = map.epoch;
        }
        st
    }

    fn retry_parked(&mut self, pg: PgId) {
        let Some(st) = self.pgs.get_mut(&pg) else {
            return;
        };
        for p in std::mem::take(&mut st.parked) {
            op::handle_client_op(self, p.reply, p.req_id, p.req, Vec::new());
        }
    }
}
