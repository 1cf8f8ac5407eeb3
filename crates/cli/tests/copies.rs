//! How many times a write's bytes are copied in memory on the OSDs, counted by the OSDs
//! themselves (`OsdStats.copies`) under real writes from the client library at queue depth:
//! the figures docs/operator/cluster.md "Copy by copy" gives.

mod common;

use cairn_proto::msg::osd::PayloadCopies;
use common::cluster::{runtime, Cluster};
use std::time::Duration;

const KIB: u64 = 1024;

/// The copy counters of every OSD, summed.
async fn copies(client: &cairn_client::Client) -> PayloadCopies {
    let mut sum = PayloadCopies::default();
    for o in client.map().osds.values() {
        let s = cairn_client::osd_stats(&o.addr, client.auth(), Duration::from_secs(5))
            .await
            .expect("osd stats");
        // For the record (how long its WAL syncs take decides where they run: `wal_pace.rs`).
        println!(
            "osd.{}: quickest of the last 64 WAL syncs {} us, {} syncs handed to the syncer",
            s.osd, s.wal_sync_floor_us, s.wal_syncs_handed_off
        );
        let c = s.copies;
        sum.received_bytes += c.received_bytes;
        sum.receive_copied_bytes += c.receive_copied_bytes;
        sum.send_queue_copied_bytes += c.send_queue_copied_bytes;
        sum.send_queue_held_bytes += c.send_queue_held_bytes;
        sum.wal_batch_bytes += c.wal_batch_bytes;
        sum.partial_block_bytes += c.partial_block_bytes;
        sum.flush_staged_bytes += c.flush_staged_bytes;
        sum.direct_staged_bytes += c.direct_staged_bytes;
    }
    sum
}

fn delta(a: &PayloadCopies, b: &PayloadCopies) -> PayloadCopies {
    PayloadCopies {
        received_bytes: b.received_bytes - a.received_bytes,
        receive_copied_bytes: b.receive_copied_bytes - a.receive_copied_bytes,
        send_queue_copied_bytes: b.send_queue_copied_bytes - a.send_queue_copied_bytes,
        send_queue_held_bytes: b.send_queue_held_bytes - a.send_queue_held_bytes,
        wal_batch_bytes: b.wal_batch_bytes - a.wal_batch_bytes,
        partial_block_bytes: b.partial_block_bytes - a.partial_block_bytes,
        flush_staged_bytes: b.flush_staged_bytes - a.flush_staged_bytes,
        direct_staged_bytes: b.direct_staged_bytes - a.direct_staged_bytes,
    }
}

/// `count` writes of `len` bytes at block-aligned offsets of 16 objects, `depth` at a time.
async fn write_at_depth(
    client: &cairn_client::Client,
    pool: u32,
    len: u64,
    count: u64,
    depth: u64,
) {
    let mut tasks = tokio::task::JoinSet::new();
    for lane in 0..depth {
        let client = client.clone();
        tasks.spawn(async move {
            let data = vec![lane as u8 + 1; len as usize];
            let mut i = lane;
            while i < count {
                let name = format!("copies-{}", i % 16);
                let offset = (i / 16) * len;
                client
                    .write(pool, name.as_bytes(), offset, &data)
                    .await
                    .unwrap_or_else(|e| panic!("write {i}: {e}"));
                i += depth;
            }
        });
    }
    while let Some(r) = tasks.join_next().await {
        r.expect("writer");
    }
}

#[test]
fn a_write_is_copied_once_into_memory_and_once_into_the_wal_on_each_osd() {
    let c = Cluster::up("copies", 1, 3);
    c.pool_create("p", 3, 2, 8);
    let rt = runtime();
    rt.block_on(async {
        let client = c.client().await;
        let pool = client.pool_id("p").expect("pool");
        // Every PG active and every connection open before counting.
        write_at_depth(&client, pool, 4 * KIB, 64, 8).await;

        // Small writes at queue depth 32: replies and replicated writes wait in send queues
        // (the shard holds them back while more requests are buffered).
        let (n, len) = (3000, 4 * KIB);
        let before = copies(&client).await;
        let (client_before, merge_before) = (cairn_transport::copies::tally(), client.merge_stats());
        write_at_depth(&client, pool, len, n, 32).await;
        let small = delta(&before, &copies(&client).await);
        // The client: ops merged into one message (temporal merge) are laid out in the batch's
        // buffer, which a send queue holds rather than copies; only ops sent on their own from
        // borrowed data are copied when they wait.
        let merged = client.merge_stats().ops - merge_before.ops;
        let client_copied =
            cairn_transport::copies::tally().queue_copied_bytes - client_before.queue_copied_bytes;
        println!("client, 4 KiB writes at QD32: {merged} of {n} merged, {client_copied} bytes copied into send queues");
        assert!(merged > 0, "no op was merged at QD32");
        assert!(
            client_copied <= (n - merged) * len,
            "{client_copied} bytes copied into the client's send queues for {} ops sent alone",
            n - merged
        );
        let payload = 3 * n * len; // on each of the 3 OSDs
        println!("4 KiB writes, QD32: {small:?} for {payload} payload bytes");
        assert_eq!(
            small.wal_batch_bytes, payload,
            "each OSD lays each payload into its WAL batch exactly once"
        );
        assert_eq!(
            small.partial_block_bytes, 0,
            "aligned writes build no block buffer"
        );
        assert_eq!(
            small.send_queue_copied_bytes, 0,
            "replicated writes and replies are queued by reference"
        );
        assert!(
            small.send_queue_held_bytes >= len * 100,
            "the test did not make frames wait in send queues: {small:?}"
        );
        // A small frame comes in with others through the receive buffer and is copied out.
        assert!(
            small.receive_copied_bytes >= payload
                && small.receive_copied_bytes <= small.received_bytes,
            "{small:?}"
        );
        let per_byte = (small.receive_copied_bytes
            + small.send_queue_copied_bytes
            + small.wal_batch_bytes
            + small.partial_block_bytes) as f64
            / payload as f64;
        println!("4 KiB writes: {per_byte:.3} copies per payload byte up to the WAL");
        assert!(per_byte < 2.2, "{per_byte:.3} copies per byte");

        // Large writes (above the direct-write threshold) skip the WAL and are read straight
        // into their buffers, apart from what the receive buffer already held.
        let (n, len) = (48, 1024 * KIB);
        let before = copies(&client).await;
        write_at_depth(&client, pool, len, n, 8).await;
        let large = delta(&before, &copies(&client).await);
        let payload = 3 * n * len;
        println!("1 MiB writes, QD8: {large:?} for {payload} payload bytes");
        assert_eq!(
            large.wal_batch_bytes, 0,
            "large writes are written once, not through the WAL"
        );
        assert_eq!(
            (large.partial_block_bytes, large.direct_staged_bytes),
            (0, 0)
        );
        assert_eq!(large.send_queue_copied_bytes, 0);
        // Per frame, at most what one fill of the 128 KiB receive buffer brought in before the
        // data part, and the last piece of it (less than the buffer) is copied.
        let bound = 3 * n * 2 * cairn_transport::READ_BUFFER as u64;
        assert!(
            large.receive_copied_bytes <= bound,
            "{} bytes copied out of receive buffers for {payload} payload bytes",
            large.receive_copied_bytes
        );
        println!(
            "1 MiB writes: {:.3} copies per payload byte",
            large.receive_copied_bytes as f64 / payload as f64
        );

        // The client side (this process's connections): at queue depth 8 most writes wait in
        // the send queue; borrowed data is copied there, a shared buffer is held.
        let (n, len) = (32u64, 1024 * KIB);
        for shared in [false, true] {
            let before = cairn_transport::copies::tally();
            let mut tasks = tokio::task::JoinSet::new();
            for lane in 0..8u64 {
                let client = client.clone();
                tasks.spawn(async move {
                    let data = cairn_client::Bytes::from(vec![lane as u8; len as usize]);
                    for i in (lane..n).step_by(8) {
                        let (name, at) = (format!("client-{}", i % 8), (i / 8) * len);
                        let r = if shared {
                            client.write_shared(pool, name.as_bytes(), at, &data).await
                        } else {
                            client.write(pool, name.as_bytes(), at, &data).await
                        };
                        r.unwrap_or_else(|e| panic!("write {i}: {e}"));
                    }
                });
            }
            while let Some(r) = tasks.join_next().await {
                r.expect("writer");
            }
            let after = cairn_transport::copies::tally();
            let copied = after.queue_copied_bytes - before.queue_copied_bytes;
            let held = after.queue_held_bytes - before.queue_held_bytes;
            println!("client, 1 MiB writes at QD8, shared {shared}: {copied} bytes copied into send queues, {held} held");
            if shared {
                assert_eq!(copied, 0, "a shared buffer was copied into the send queue");
                assert!(held >= 8 * len, "the writes did not wait in the queue ({held} held)");
            } else {
                assert!(copied >= 8 * len, "borrowed data waited in the queue without a copy?");
            }
        }
    });
}
