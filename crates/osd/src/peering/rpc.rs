//! Request/response with one member during peering and recovery: a connection of its own
//! (peering is rare; client writes keep their connections), one request at a time.

use cairn_proto::stream::{handshake, node_kind, read_frame, write_frame};
use cairn_proto::{Frame, Limits};
use std::time::Duration;
use tokio::net::TcpStream;

/// How long one request may take before the member is treated as unreachable.
const CALL_TIMEOUT: Duration = Duration::from_secs(5);

pub struct Rpc {
    addr: String,
    stream: TcpStream,
    next_id: u64,
}

impl Rpc {
    /// Connects to a member and shakes hands.
    pub async fn connect(addr: &str, from: Option<std::net::IpAddr>) -> Result<Rpc, String> {
        let connect = async {
            let mut s = cairn_proto::net::connect(addr, from)
                .await
                .map_err(|e| format!("cannot connect to {addr}: {e}"))?;
            let _ = s.set_nodelay(true);
            handshake(&mut s, node_kind::OSD)
                .await
                .map_err(|e| format!("{addr}: handshake: {e}"))?;
            Ok::<_, String>(s)
        };
        let stream = tokio::time::timeout(CALL_TIMEOUT, connect)
            .await
            .map_err(|_| format!("connecting to {addr} timed out"))??;
        Ok(Rpc {
            addr: addr.to_string(),
            stream,
            next_id: 1,
        })
    }

    /// Connects to OSD `id` at the address `map` gives, from `source`.
    pub async fn connect_osd(
        map: &cairn_map::ClusterMap,
        id: u32,
        source: Option<std::net::IpAddr>,
    ) -> Result<Rpc, String> {
        let addr = map
            .osds
            .get(&id)
            .map(|o| o.addr.clone())
            .ok_or_else(|| format!("osd.{id} is not in the map"))?;
        Rpc::connect(&addr, source).await
    }

    /// Sends a request and waits for its reply, which must be of type `want`.
    pub async fn call(
        &mut self,
        msg_type: u16,
        want: u16,
        control: &[u8],
        data: &[u8],
    ) -> Result<Frame, String> {
        let id = self.next_id;
        self.next_id += 1;
        let addr = self.addr.clone();
        let exchange = async {
            write_frame(&mut self.stream, msg_type, id, control, data)
                .await
                .map_err(|e| format!("{addr}: send: {e}"))?;
            let f = read_frame(&mut self.stream, &Limits::default())
                .await
                .map_err(|e| format!("{addr}: {e}"))?;
            if f.request_id == id && f.msg_type != want {
                if let Some(why) = refusal(&f) {
                    return Err(format!("{addr} refused: {why}"));
                }
            }
            if f.msg_type != want || f.request_id != id {
                return Err(format!(
                    "{addr}: unexpected reply type {} (id {}) to request type {msg_type}",
                    f.msg_type, f.request_id
                ));
            }
            Ok(f)
        };
        tokio::time::timeout(CALL_TIMEOUT, exchange)
            .await
            .map_err(|_| format!("{}: no reply within {CALL_TIMEOUT:?}", self.addr))?
    }
}

/// The reason carried by a reply that refuses a request (`ERROR`, or `PG_DONE` with
/// `Failed`), if it is one.
fn refusal(f: &Frame) -> Option<String> {
    use cairn_proto::msg::peering::{PgDone, PG_DONE};
    match f.msg_type {
        cairn_proto::msg::osd::ERROR => {
            cairn_proto::msg::decode::<cairn_proto::msg::mon::ErrorReply>("error", &f.control)
                .ok()
                .map(|e| e.message)
        }
        PG_DONE => match cairn_proto::msg::decode::<PgDone>("pg done", &f.control) {
            Ok(PgDone::Failed(why)) => Some(why),
            _ => None,
        },
        _ => None,
    }
}
