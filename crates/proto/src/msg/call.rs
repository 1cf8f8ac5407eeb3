//! Typed request -> reply: a [`Call`] names a request's message type, the message type it is
//! answered with, and the Rust types of both, so a caller never pairs a request with the
//! wrong reply or decodes a reply by hand.

use super::{decode, encode, MsgError};
use serde::{de::DeserializeOwned, Serialize};
use std::marker::PhantomData;

/// A request message type that is answered by one reply message type.
pub struct Call<Req, Rep> {
    /// The request's message type.
    pub request: u16,
    /// The reply's message type.
    pub reply: u16,
    /// The reply's name in a decoding error ("pg info").
    pub reply_name: &'static str,
    types: PhantomData<fn(&Req) -> Rep>,
}

impl<Req, Rep> Call<Req, Rep> {
    pub const fn new(request: u16, reply: u16, reply_name: &'static str) -> Self {
        Call {
            request,
            reply,
            reply_name,
            types: PhantomData,
        }
    }
}

impl<Req: Serialize, Rep: DeserializeOwned> Call<Req, Rep> {
    /// The request's control part.
    pub fn encode(&self, req: &Req) -> Vec<u8> {
        encode(req)
    }

    /// Decodes the control part of a reply of type [`Call::reply`].
    pub fn decode_reply(&self, control: &[u8]) -> Result<Rep, MsgError> {
        decode(self.reply_name, control)
    }
}

impl<Req, Rep> Clone for Call<Req, Rep> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<Req, Rep> Copy for Call<Req, Rep> {}

impl<Req, Rep> std::fmt::Debug for Call<Req, Rep> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Call({} -> {} {})",
            self.request, self.reply, self.reply_name
        )
    }
}

/// An empty control part (`OSD_STATS`, `OSD_SYNC`, `OSD_PING`): encodes to no bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
pub struct Empty;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_call_decodes_its_reply_type_and_names_it_when_it_cannot() {
        let call: Call<Empty, u32> = Call::new(1, 2, "number");
        assert!(call.encode(&Empty).is_empty(), "a unit struct is no bytes");
        assert_eq!(call.decode_reply(&encode(&7u32)), Ok(7));
        let err = call
            .decode_reply(&[0xff, 0xff, 0xff, 0xff, 0xff, 0xff])
            .unwrap_err();
        assert_eq!(err.what, "number");
    }
}
