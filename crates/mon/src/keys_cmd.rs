//! `AUTH_COMMAND`: managing the key database (`cairn auth`), on the leader.
//!
//! Every request needs `mon x`, except the list of NBD users, which NBD gateways (`x` in NBD
//! caps without `volume=`) may fetch too. Reads (list, get) are answered from the leader's applied
//! state; changes go through Raft, and the key database checks them (caps, rules) as it
//! applies them. New secrets come from the leader's random source and are
//! put into the change before it is proposed (applying must be deterministic). A secret
//! travels only sealed with the key the requester proved on this connection.

use crate::ctx::{Ctx, Proposed};
use crate::types::{ApplyResult, Proposal};
use cairn_auth::{
    nbd_psk, open_secret, seal, unix_now, Caps, Entity, EntityKind, KeyChange, KeyDbError, Perms,
    Secret, MIN_MON_KEEP_OLD_SECS,
};
use cairn_proto::msg::mon::{
    auth_import_aad, auth_key_aad, nbd_psk_aad, AuthListing, AuthReply, AuthRequest, NbdUser,
    Unavailable,
};
use cairn_transport::Peer;

/// Longest grace a rotation may keep the old key for (30 days).
pub const MAX_KEEP_OLD_SECS: u64 = 30 * 86_400;
/// Most NBD users one answer lists (bounds the reply to about 1 MiB); a gateway serves the
/// first ones by name and the leader logs that the others were left out.
pub const MAX_NBD_USERS: usize = 4096;

/// Why `peer` may not make this request, if it may not.
fn refusal(ctx: &Ctx, peer: &Peer, req: &AuthRequest) -> Option<String> {
    if ctx.keys.is_none() {
        return Some(
            "this cluster runs without authentication (--auth none): there are no keys to \
             manage"
                .into(),
        );
    }
    let Some(entity) = peer.entity.as_ref() else {
        return Some("permission denied: an unauthenticated peer manages no keys".into());
    };
    let client = matches!(entity.kind(), EntityKind::Client | EntityKind::Nbd);
    if client && peer.caps.mon_perms().covers(Perms::X) {
        return None;
    }
    if matches!(req, AuthRequest::NbdUsers) {
        if client && peer.caps.serves_nbd() {
            return None;
        }
        return Some(format!(
            "permission denied: {} is not an NBD gateway (fetching NBD users' keys needs `x` \
             in its NBD caps, without volume=)",
            peer.name()
        ));
    }
    Some(format!(
        "permission denied: {} lacks x on the monitors (managing keys needs `mon x`)",
        peer.name()
    ))
}

/// Answers one request from `peer`.
pub(crate) async fn serve(ctx: &Ctx, peer: &Peer, req: AuthRequest) -> AuthReply {
    if let Some(why) = refusal(ctx, peer, &req) {
        tracing::warn!(peer = %peer.name(), "refused: {why}");
        return AuthReply::Refused(why);
    }
    if ctx.leading_term().is_none() {
        return AuthReply::NotLeader {
            leader: ctx.leader().1,
        };
    }
    if !ctx.view.with_keys(|k| k.seeded) {
        return AuthReply::Unavailable(Unavailable::NotSeeded);
    }
    match handle(ctx, peer, req).await {
        Ok(r) | Err(r) => r,
    }
}

/// The key of `entity` sealed for the requester.
fn key_reply(peer: &Peer, entity: &Entity, secret: &Secret, c: &Caps) -> AuthReply {
    let Some(key) = &peer.key else {
        return AuthReply::Refused("this connection is not authenticated".into());
    };
    AuthReply::Key {
        sealed: seal(key, &auth_key_aad(entity), &secret.0),
        entity: entity.clone(),
        caps: c.clone(),
    }
}

/// `cairn auth rotate mon`: a new monitors' key, the old one accepted `keep_old_secs` more
/// (`cairn_auth::mon_key`). The key never leaves the monitors: each writes it into its
/// keyring file, and the answer only says it is done.
async fn rotate_mon(ctx: &Ctx, keep_old_secs: u64) -> Result<AuthReply, AuthReply> {
    let refused = |why: String| AuthReply::Refused(why);
    if !(MIN_MON_KEEP_OLD_SECS..=MAX_KEEP_OLD_SECS).contains(&keep_old_secs) {
        return Err(refused(format!(
            "the monitors' old key must be kept {MIN_MON_KEEP_OLD_SECS} s to {MAX_KEEP_OLD_SECS} \
             s (--keep-old {keep_old_secs}): OSDs fetch the new service keys within 30 s, \
             and monitors that are behind need the old key to catch up"
        )));
    }
    let Some(keys) = &ctx.keys else {
        return Err(refused("this cluster runs without authentication".into()));
    };
    let now_keys = keys.mon_keys();
    if now_keys.previous.is_some() {
        let until = ctx
            .view
            .with_keys(|k| {
                k.mon
                    .as_ref()
                    .and_then(|m| m.previous.as_ref().map(|p| p.1))
            })
            .unwrap_or_default();
        return Err(refused(format!(
            "the last rotation of the monitors' key keeps its old key until {until} (unix \
             time): rotate again after that, or monitors and OSDs holding that key would be \
             refused"
        )));
    }
    let rotate = KeyChange::RotateMon {
        secret: Secret::generate(),
        previous: now_keys.current,
        keep_old_until: unix_now().saturating_add(keep_old_secs),
    };
    change(ctx, rotate).await?;
    Ok(AuthReply::Done)
}

async fn change(ctx: &Ctx, k: KeyChange) -> Result<(), AuthReply> {
    match ctx.propose(Proposal::Keys(k)).await {
        Proposed::Applied(ApplyResult::Keys(Ok(()))) => Ok(()),
        Proposed::Applied(ApplyResult::Keys(Err(KeyDbError::NotSeeded))) => {
            Err(AuthReply::Unavailable(Unavailable::NotSeeded))
        }
        Proposed::Applied(ApplyResult::Keys(Err(e))) => Err(AuthReply::Refused(e.to_string())),
        Proposed::Applied(ApplyResult::Map(_)) => {
            Err(AuthReply::Unavailable(Unavailable::KeysAppliedAsMap))
        }
        Proposed::NotLeader(leader) => Err(AuthReply::NotLeader { leader }),
        Proposed::Unavailable(why) => Err(AuthReply::Unavailable(why)),
    }
}

async fn handle(ctx: &Ctx, peer: &Peer, req: AuthRequest) -> Result<AuthReply, AuthReply> {
    let refused = |s: String| AuthReply::Refused(s);
    match req {
        AuthRequest::List => Ok(AuthReply::List(ctx.view.with_keys(|db| {
            db.keys
                .iter()
                .map(|(e, k)| AuthListing {
                    entity: e.clone(),
                    caps: k.caps.clone(),
                    previous_until: k.previous.as_ref().map(|p| p.1),
                })
                .collect()
        }))),
        AuthRequest::Get { entity } => {
            let found = ctx.view.with_keys(|db| {
                db.keys
                    .get(&entity)
                    .map(|k| (k.secret.clone(), k.caps.clone()))
            });
            let (secret, c) = found
                .ok_or_else(|| refused(KeyDbError::NoSuchEntity(entity.clone()).to_string()))?;
            Ok(key_reply(peer, &entity, &secret, &c))
        }
        AuthRequest::Add { entity, caps } => {
            let secret = Secret::generate();
            let add = KeyChange::Add {
                entity: entity.clone(),
                secret: secret.clone(),
                caps: caps.clone(),
            };
            change(ctx, add).await?;
            Ok(key_reply(peer, &entity, &secret, &caps))
        }
        AuthRequest::Import {
            entity,
            sealed,
            caps,
        } => {
            let key = peer.key.as_ref().ok_or_else(|| refused("no key".into()))?;
            let secret = open_secret(key, &auth_import_aad(&entity), &sealed)
                .map_err(|_| refused("the imported key does not open with your key".into()))?;
            let add = KeyChange::Add {
                entity,
                secret,
                caps,
            };
            change(ctx, add).await?;
            Ok(AuthReply::Done)
        }
        AuthRequest::SetCaps { entity, caps } => {
            change(ctx, KeyChange::SetCaps { entity, caps }).await?;
            Ok(AuthReply::Done)
        }
        AuthRequest::Rotate {
            entity,
            keep_old_secs,
        } => {
            if entity.kind() == EntityKind::Mon {
                return rotate_mon(ctx, keep_old_secs).await;
            }
            if keep_old_secs > MAX_KEEP_OLD_SECS {
                return Err(refused(format!(
                    "keeping the old key {keep_old_secs} s is over the limit of \
                     {MAX_KEEP_OLD_SECS} s (30 days)"
                )));
            }
            let secret = Secret::generate();
            let keep_old_until = match keep_old_secs {
                0 => 0,
                s => unix_now().saturating_add(s),
            };
            let rotate = KeyChange::Rotate {
                entity: entity.clone(),
                secret: secret.clone(),
                keep_old_until,
            };
            change(ctx, rotate).await?;
            let c = ctx
                .view
                .with_keys(|db| db.keys.get(&entity).map(|k| k.caps.clone()))
                .unwrap_or_default();
            Ok(key_reply(peer, &entity, &secret, &c))
        }
        AuthRequest::Remove { entity } => {
            change(ctx, KeyChange::Remove { entity }).await?;
            Ok(AuthReply::Done)
        }
        AuthRequest::NbdUsers => Ok(nbd_users(ctx, peer)),
        AuthRequest::MonKey => {
            let now = unix_now();
            let (rotated, previous_until) = ctx.view.with_keys(|db| match &db.mon {
                None => (false, None),
                Some(m) => (true, m.previous.as_ref().map(|p| p.1).filter(|&t| t > now)),
            });
            Ok(AuthReply::MonKey {
                rotated,
                previous_until,
            })
        }
    }
}

/// Every entity with NBD caps (client or NBD kind), with its pre-shared key sealed for `peer`.
fn nbd_users(ctx: &Ctx, peer: &Peer) -> AuthReply {
    let Some(key) = peer.key.as_ref() else {
        return AuthReply::Refused("this connection is not authenticated".into());
    };
    let (users, total) = ctx.view.with_keys(|db| {
        let all = db.keys.iter().filter(|(e, k)| {
            matches!(e.kind(), EntityKind::Client | EntityKind::Nbd)
                && !k.caps.nbd.trim().is_empty()
        });
        let total = all.clone().count();
        let users: Vec<NbdUser> = all
            .take(MAX_NBD_USERS)
            .map(|(e, k)| NbdUser {
                entity: e.clone(),
                caps: k.caps.clone(),
                sealed_psk: seal(key, &nbd_psk_aad(e), &nbd_psk(&k.secret).0),
            })
            .collect();
        (users, total)
    });
    if total > users.len() {
        tracing::warn!(
            total,
            sent = users.len(),
            "more NBD users than one answer holds: the others cannot connect over TLS"
        );
    }
    AuthReply::NbdUsers(users)
}
