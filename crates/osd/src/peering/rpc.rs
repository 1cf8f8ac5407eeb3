//! Request/response with one member during peering and recovery: a session of its own
//! (peering is rare; client writes keep their connections), through the transport layer.

use cairn_proto::msg::call::Call;
use cairn_proto::msg::ErrorCode;
use cairn_proto::{Frame, Limits};
use cairn_transport::{node_kind, CallError, DialError, Dialer, Session};
use std::time::Duration;

/// Why a request to a member failed, typed so that callers can tell a refusal (and its code)
/// from a member that could not be reached.
#[derive(Debug, thiserror::Error)]
pub enum RpcError {
    #[error("osd.{0} is not in the map")]
    NotInMap(u32),
    #[error(transparent)]
    Connect(#[from] DialError),
    /// Closed, timed out, refused (`CallError::Refused` with its code, whether the member
    /// answered `ERROR` or a `PG_DONE` refusal), or answered with the wrong message.
    #[error(transparent)]
    Call(#[from] CallError),
}

impl RpcError {
    /// The member's code when it refused the request (it was reached and said no).
    pub fn refusal(&self) -> Option<ErrorCode> {
        match self {
            RpcError::Call(CallError::Refused { code, .. }) => Some(*code),
            _ => None,
        }
    }
}

/// How long one request may take before the member is treated as unreachable.
const CALL_TIMEOUT: Duration = Duration::from_secs(5);

pub struct Rpc {
    session: Session,
}

impl Rpc {
    /// Connects to a member with the OSD's `dialer` (it must answer as an OSD).
    pub async fn connect(addr: &str, dialer: &Dialer) -> Result<Rpc, RpcError> {
        let dialer = dialer.clone().timeout(CALL_TIMEOUT);
        let session = Session::open(&dialer, addr, node_kind::OSD, Limits::default()).await?;
        Ok(Rpc { session })
    }

    /// Connects to OSD `id` at the address `map` gives, from `source`.
    pub async fn connect_osd(
        map: &cairn_map::ClusterMap,
        id: u32,
        dialer: &Dialer,
    ) -> Result<Rpc, RpcError> {
        let addr = map
            .osds
            .get(&id)
            .map(|o| o.addr.clone())
            .ok_or(RpcError::NotInMap(id))?;
        Rpc::connect(&addr, dialer).await
    }

    /// Sends a request and waits for its reply, which must be of type `want`.
    pub async fn call(
        &mut self,
        msg_type: u16,
        want: u16,
        control: &[u8],
        data: &[u8],
    ) -> Result<Frame, RpcError> {
        let f = self
            .session
            .call(msg_type, control, data, CALL_TIMEOUT)
            .await?;
        if f.msg_type != want {
            let addr = self.session.addr().to_string();
            return Err(match refusal(&f) {
                Some((code, message)) => CallError::Refused {
                    addr,
                    code,
                    message,
                },
                None => CallError::Unexpected {
                    addr,
                    got: f.msg_type,
                    want,
                },
            }
            .into());
        }
        Ok(f)
    }

    /// Sends `req` as `call`'s request and waits for its reply, decoded (a `PG_DONE`
    /// refusal in place of another reply is [`CallError::Refused`], as in [`Rpc::call`]).
    pub async fn ask<Req: serde::Serialize, Rep: serde::de::DeserializeOwned>(
        &mut self,
        call: Call<Req, Rep>,
        req: &Req,
        data: &[u8],
    ) -> Result<(Rep, Vec<u8>), RpcError> {
        let f = self
            .call(call.request, call.reply, &call.encode(req), data)
            .await?;
        let rep = call
            .decode_reply(&f.control)
            .map_err(|error| CallError::Malformed {
                addr: self.session.addr().to_string(),
                error,
            })?;
        Ok((rep, f.data))
    }
}

/// The code and reason of a `PG_DONE` reply that refuses a request, if it is one.
fn refusal(f: &Frame) -> Option<(ErrorCode, String)> {
    use cairn_proto::msg::peering::{PgDone, PG_DONE};
    match f.msg_type {
        PG_DONE => match cairn_proto::msg::decode::<PgDone>("pg done", &f.control) {
            Ok(PgDone::Failed { code, why }) => Some((code, why)),
            _ => None,
        },
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cairn_proto::msg::peering::{PgDone, PG_DONE};

    fn frame(msg_type: u16, control: Vec<u8>) -> Frame {
        Frame {
            msg_type,
            request_id: 1,
            control,
            data: Vec::new(),
        }
    }

    #[test]
    fn a_pg_done_refusal_keeps_its_code() {
        let failed = PgDone::Failed {
            code: ErrorCode::NotFound,
            why: "pg 1.7 does not exist in map epoch 9".into(),
        };
        let f = frame(PG_DONE, cairn_proto::msg::encode(&failed));
        assert_eq!(
            refusal(&f),
            Some((
                ErrorCode::NotFound,
                "pg 1.7 does not exist in map epoch 9".into()
            ))
        );
        // Not refusals: a PG_DONE that succeeded, another message, bytes that do not decode.
        assert_eq!(
            refusal(&frame(PG_DONE, cairn_proto::msg::encode(&PgDone::Done))),
            None
        );
        assert_eq!(
            refusal(&frame(PG_DONE + 1, cairn_proto::msg::encode(&failed))),
            None
        );
        assert_eq!(refusal(&frame(PG_DONE, vec![0xff; 3])), None);
        let e = RpcError::from(CallError::Refused {
            addr: "127.0.0.1:1".into(),
            code: ErrorCode::NotFound,
            message: "no".into(),
        });
        assert_eq!(e.refusal(), Some(ErrorCode::NotFound));
        assert_eq!(RpcError::NotInMap(3).refusal(), None);
    }
}
