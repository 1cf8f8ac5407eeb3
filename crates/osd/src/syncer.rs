//! Makes a shard's submitted writes durable off the shard's thread when that would wait for
//! a device: a batch that carries large writes written once writes and flushes their data
//! before its WAL records (`cairn_store`'s `direct.rs`), and a WAL on a device rather than in
//! memory takes tens of microseconds or more per batch (`wal_pace.rs`): time during which the
//! shard's event loop would serve nobody. The syncer thread waits instead and hands the
//! completions back to the shard, in order ([`ShardMsg::Synced`]).

use crate::context::Osd;
use crate::mailbox::{ShardMsg, SyncJob};
use std::sync::mpsc::Receiver;
use std::sync::{Arc, Weak};

/// Starts the syncer thread on the jobs of `rx`; it ends when the OSD is gone.
pub fn start(osd: Weak<Osd>, rx: Receiver<SyncJob>) -> std::io::Result<()> {
    std::thread::Builder::new()
        .name("osd-syncer".into())
        .spawn(move || run(osd, rx))
        .map(|_| ())
}

fn run(osd: Weak<Osd>, rx: Receiver<SyncJob>) {
    while let Ok(job) = rx.recv() {
        let Some(osd) = osd.upgrade() else { return };
        let t0 = std::time::Instant::now();
        let sync = || {
            if job.flush {
                osd.store.sync_through(job.seq).map(|_| ())
            } else {
                osd.store.write_through(job.seq)
            }
        };
        let result = if job.paced {
            osd.wal_pace.timed(&osd.store, sync)
        } else {
            sync()
        };
        osd.note_commit(t0);
        osd.queue_shard(
            job.shard,
            ShardMsg::Synced {
                done: job.done,
                result: result.map_err(Arc::new),
            },
        );
    }
}
