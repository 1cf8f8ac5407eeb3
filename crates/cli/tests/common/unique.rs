//! A unique-value write load over NBD and its check: every 4 KiB block written holds its
//! block and sequence numbers, so a read-back tells which write it holds, whether it is torn,
//! and whether it was ever written there (`recovery.rs`, `hosts.rs`).

#![allow(dead_code)]

use super::cluster::Cluster;
use std::time::Duration;

/// Writes random 4 KiB blocks of the first 16 MiB of `$URI`, each a unique value (block
/// number, sequence number, and a pattern of both), one at a time, until the file `$STOP`
/// exists (60 s at most). Prints `t B S` before writing sequence `S` to block `B` and `a B S`
/// once it is acknowledged; an error is printed as `e ...` and the writer goes on.
pub const UNIQUE_WRITER: &str = r#"
import nbd, os, random, struct, sys, time
h = nbd.NBD(); h.connect_uri(os.environ["URI"])
stop, end, seq = os.environ["STOP"], time.time() + 60, 0
def block(b, s):
    head = struct.pack("<QQ", b, s)
    return head + (struct.pack("<Q", b * 1000003 + s) * 510)
while time.time() < end and not os.path.exists(stop):
    seq += 1; b = random.randrange(4096)
    print("t", b, seq, flush=True)
    try:
        h.pwrite(block(b, seq), b * 4096)
        print("a", b, seq, flush=True)
    except nbd.Error as e:
        print("e", b, seq, e, flush=True); time.sleep(0.2)
print("done", seq, flush=True)
"#;

/// Reads the first 16 MiB of `$URI` and prints `B S` for each block a whole unique value of
/// [`UNIQUE_WRITER`]'s fills, `torn B` for any other nonzero block.
pub const UNIQUE_READER: &str = r#"
import nbd, os, struct
h = nbd.NBD(); h.connect_uri(os.environ["URI"])
for c in range(16):
    buf = h.pread(1 << 20, c << 20)
    for i in range(256):
        blk = buf[i * 4096:(i + 1) * 4096]
        if blk == bytes(4096): continue
        b, s = struct.unpack("<QQ", blk[:16])
        good = b == c * 256 + i and blk[16:] == struct.pack("<Q", b * 1000003 + s) * 510
        if good: print(f"{b} {s}"); continue
        want = struct.pack("<QQ", b, s) + struct.pack("<Q", b * 1000003 + s) * 510
        bad = [j for j in range(4096) if blk[j] != want[j]] or [0]
        print(f"torn {c * 256 + i} (it starts {b} {s}, {blk[:32].hex()}; bytes {bad[0]}..{bad[-1]} differ, {len(bad)} of them; zero there: {blk[bad[0]:bad[-1]+1] == bytes(bad[-1]+1-bad[0])})")
print("end", flush=True)
"#;

/// From a writer's output: per block, the last acknowledged sequence and the one tried after
/// it (not acknowledged: it may or may not have landed).
pub fn acked_blocks(out: &str) -> std::collections::BTreeMap<u64, (u64, Option<u64>)> {
    let mut m = std::collections::BTreeMap::new();
    for line in out.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        let (Some(kind), Some(b), Some(s)) = (f.first(), f.get(1), f.get(2)) else {
            continue;
        };
        let (Ok(b), Ok(s)) = (b.parse::<u64>(), s.parse::<u64>()) else {
            continue;
        };
        match *kind {
            "t" => m.entry(b).or_insert((0, None)).1 = Some(s),
            "a" => *m.entry(b).or_insert((0, None)) = (s, None),
            _ => {}
        }
    }
    m
}

/// Every acknowledged block of `acked` reads back as its last acknowledged value (or the one
/// tried after it), no block is torn, and no block holds a value never written to it.
pub fn verify_unique(
    c: &Cluster,
    uri: &str,
    acked: &std::collections::BTreeMap<u64, (u64, Option<u64>)>,
) {
    let o = super::tools::nbdsh_spawn(uri, 120, UNIQUE_READER)
        .wait_with_output()
        .expect("reader");
    let out = super::cluster::text(&o.stdout);
    assert!(
        out.ends_with("end\n"),
        "the reader failed: {out}\n{}\n{}",
        super::cluster::text(&o.stderr),
        c.logs()
    );
    let mut seen = std::collections::BTreeMap::new();
    for line in out.lines().filter(|l| *l != "end") {
        if let Some(rest) = line.strip_prefix("torn ") {
            let b: u64 = rest
                .split(' ')
                .next()
                .and_then(|x| x.parse().ok())
                .unwrap_or(0);
            panic!(
                "{line}: a block is torn (its writes: {:?})\n{}",
                acked.get(&b),
                c.logs()
            );
        }
        let mut f = line.split(' ').map(|x| x.parse::<u64>().expect("number"));
        let (b, s) = (f.next().expect("block"), f.next().expect("seq"));
        seen.insert(b, s);
    }
    for (b, (ack, tried)) in acked {
        let got = seen.get(b).copied().unwrap_or(0);
        assert!(
            got == *ack || Some(got) == *tried,
            "block {b} holds sequence {got}, not its acknowledged {ack} (nor the tried {tried:?})\n{}",
            c.logs()
        );
    }
    for b in seen.keys() {
        assert!(acked.contains_key(b), "block {b} was never written");
    }
}

/// Runs [`UNIQUE_WRITER`] on `uri`, calls `fail` after 2 s (it kills what the test wants
/// killed), and stops the writer `secs` later; returns its output.
pub fn unique_writes_with(
    c: &Cluster,
    uri: &str,
    stop: &std::path::Path,
    secs: u64,
    fail: impl FnOnce(),
) -> String {
    let _ = std::fs::remove_file(stop);
    let script = UNIQUE_WRITER.replace(
        "os.environ[\"STOP\"]",
        &format!("{:?}", stop.display().to_string()),
    );
    let w = super::tools::nbdsh_spawn(uri, 90, &script);
    std::thread::sleep(Duration::from_secs(2));
    fail();
    std::thread::sleep(Duration::from_secs(secs));
    std::fs::write(stop, b"").expect("stop the writer");
    let o = w.wait_with_output().expect("writer");
    let out = super::cluster::text(&o.stdout);
    assert!(
        out.contains("done"),
        "the writer failed: {out}\n{}\n{}",
        super::cluster::text(&o.stderr),
        c.logs()
    );
    out
}
