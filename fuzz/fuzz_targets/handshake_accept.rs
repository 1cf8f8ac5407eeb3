//! The acceptor's side of the async handshake (`cairn_transport::accept`, what every server
//! runs on a new connection) fed arbitrary bytes as the initiator's: whatever arrives, it
//! ends with an error or an admitted peer, never a panic, within its deadline. The verifier
//! knows one key (for `client.admin`) and, for the ticket method, one service key, so key and
//! ticket paths are reached; the first byte picks whether unauthenticated peers are allowed.
#![no_main]

use cairn_auth::{Caps, Entity, KeyRefusal, Secret, ServiceKey, ServiceKeys};
use cairn_proto::auth::{AuthInit, AUTH_TICKET};
use cairn_transport::{accept, node_kind, Known, TicketVerifier, Verifier, VerifyError};
use libfuzzer_sys::fuzz_target;
use std::sync::Arc;
use tokio::io::AsyncWriteExt;

struct OneKey {
    allow_none: bool,
    tickets: TicketVerifier,
}

impl Verifier for OneKey {
    fn allow_none(&self) -> bool {
        self.allow_none
    }
    fn key_for(&self, method: u8, init: &AuthInit, entity: &Entity) -> Result<Known, VerifyError> {
        if method == AUTH_TICKET {
            return self.tickets.key_for(method, init, entity);
        }
        if *entity != Entity::admin() {
            return Err(KeyRefusal::UnknownEntity(entity.clone()).into());
        }
        Ok(Known {
            entity: entity.clone(),
            caps: Caps::admin(),
            key: Secret([7; 32]),
        })
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&flags, bytes)) = data.split_first() else {
        return;
    };
    let keys = Arc::new(ServiceKeys::default());
    keys.set(vec![ServiceKey {
        id: 1,
        secret: Secret([9; 32]),
    }]);
    let verifier = OneKey {
        allow_none: flags & 1 == 1,
        tickets: TicketVerifier {
            keys,
            frames: cairn_auth::FrameMode::Plain,
        },
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .expect("runtime");
    rt.block_on(async {
        let (mut ours, mut theirs) = tokio::io::duplex(64 << 10);
        let bytes = bytes.to_vec();
        let feed = tokio::spawn(async move {
            let _ = theirs.write_all(&bytes).await;
            // Keep the peer's end open half the time: the deadline must end the wait.
            if flags & 2 == 0 {
                let _ = theirs.shutdown().await;
            }
            theirs
        });
        let _ = accept(&mut ours, node_kind::OSD, &verifier).await;
        drop(feed);
    });
});
