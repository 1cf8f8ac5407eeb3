//! `PG_MARK_LOST` on the PG's primary: an operator gives up the unfound objects its last
//! peering found (`cairn pg mark-unfound-lost`); the next peering does it (`unfound.rs`).

use crate::failure::FailClass;
use crate::shard::Shard;
use cairn_map::PgId;
use cairn_proto::msg::peering::PgDone;
use cairn_proto::msg::ErrorCode;

/// An operator's `mark-unfound-lost` on this OSD's shard: taken when this OSD leads `pg`
/// and its last peering found unfound objects; the PG peers again at once.
pub fn order(shard: &mut Shard, pg: PgId, delete: bool) -> PgDone {
    let map = shard.osd.map();
    let me = shard.osd.id();
    let st = shard.pg(&map, pg);
    if st.placement.primary() != Some(me) {
        return PgDone::Failed {
            code: ErrorCode::NotFound,
            why: format!("osd.{me} is not pg {pg}'s primary"),
        };
    }
    let unfound = st
        .failure
        .as_ref()
        .is_some_and(|f| f.class == FailClass::Unfound);
    if !unfound || st.unfound.is_empty() {
        return PgDone::Failed {
            code: ErrorCode::Invalid,
            why: format!("pg {pg} has no unfound objects (`cairn pg query {pg}`)"),
        };
    }
    tracing::warn!(pg = %pg, objects = st.unfound.len(), delete, "an operator gives up the PG's unfound objects");
    st.give_up_unfound = Some(delete);
    st.failure = None;
    super::ready(shard, &map, pg);
    PgDone::Done
}
