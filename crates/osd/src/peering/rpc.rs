//! Request/response with one member during peering and recovery: a session of its own
//! (peering is rare; client writes keep their connections), through the transport layer.

use cairn_proto::{Frame, Limits};
use cairn_transport::{node_kind, Dialer, Session};
use std::time::Duration;

/// How long one request may take before the member is treated as unreachable.
const CALL_TIMEOUT: Duration = Duration::from_secs(5);

pub struct Rpc {
    session: Session,
}

impl Rpc {
    /// Connects to a member with the OSD's `dialer` (it must answer as an OSD).
    pub async fn connect(addr: &str, dialer: &Dialer) -> Result<Rpc, String> {
        let dialer = dialer.clone().timeout(CALL_TIMEOUT);
        let session = Session::open(&dialer, addr, node_kind::OSD, Limits::default())
            .await
            .map_err(|e| e.to_string())?;
        Ok(Rpc { session })
    }

    /// Connects to OSD `id` at the address `map` gives, from `source`.
    pub async fn connect_osd(
        map: &cairn_map::ClusterMap,
        id: u32,
        dialer: &Dialer,
    ) -> Result<Rpc, String> {
        let addr = map
            .osds
            .get(&id)
            .map(|o| o.addr.clone())
            .ok_or_else(|| format!("osd.{id} is not in the map"))?;
        Rpc::connect(&addr, dialer).await
    }

    /// Sends a request and waits for its reply, which must be of type `want`.
    pub async fn call(
        &mut self,
        msg_type: u16,
        want: u16,
        control: &[u8],
        data: &[u8],
    ) -> Result<Frame, String> {
        let addr = self.session.addr();
        let f = self
            .session
            .call(msg_type, control, data, CALL_TIMEOUT)
            .await
            .map_err(|e| e.to_string())?;
        if f.msg_type != want {
            if let Some(why) = refusal(&f) {
                return Err(format!("{addr} refused: {why}"));
            }
            return Err(format!(
                "{addr}: unexpected reply type {} to request type {msg_type}",
                f.msg_type
            ));
        }
        Ok(f)
    }
}

/// The reason carried by a `PG_DONE` reply that refuses a request, if it is one.
fn refusal(f: &Frame) -> Option<String> {
    use cairn_proto::msg::peering::{PgDone, PG_DONE};
    match f.msg_type {
        PG_DONE => match cairn_proto::msg::decode::<PgDone>("pg done", &f.control) {
            Ok(PgDone::Failed { code, why }) => Some(format!("({code}) {why}")),
            _ => None,
        },
        _ => None,
    }
}
