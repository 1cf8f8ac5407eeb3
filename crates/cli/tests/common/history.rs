//! A history checker for a set of registers (objects): every read must return a value that
//! some write could have produced at that point, never one overwritten by a write that was
//! acknowledged entirely before the read began.

#![allow(dead_code)]

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// Size of a register's value on disk: one block.
pub const BLOCK: usize = 4096;

/// A register value as stored: the u64 repeated over a block, so a torn write shows.
pub fn encode(v: u64) -> Vec<u8> {
    v.to_le_bytes().repeat(BLOCK / 8)
}

/// The value of a stored register (panics on a short or torn block).
pub fn decode(b: &[u8]) -> u64 {
    assert_eq!(b.len(), BLOCK, "short read");
    let v = u64::from_le_bytes(b[..8].try_into().expect("8 bytes"));
    assert!(
        b.chunks(8).all(|c| c == v.to_le_bytes()),
        "torn block for value {v}"
    );
    v
}

/// A write of `value` to `key`, invoked at `start`, acknowledged at `end` (None: no ack).
#[derive(Debug, Clone)]
pub struct Write {
    pub key: u32,
    pub value: u64,
    pub start: Instant,
    pub end: Option<Instant>,
}

/// A read of `key` that returned `value` (0 = the object did not exist yet).
#[derive(Debug, Clone)]
pub struct Read {
    pub key: u32,
    pub value: u64,
    pub start: Instant,
    pub end: Instant,
}

/// Checks reads against writes; returns one line per violation.
pub fn check(writes: &[Write], reads: &[Read]) -> Vec<String> {
    let mut by_key: HashMap<u32, Vec<&Write>> = HashMap::new();
    for w in writes {
        by_key.entry(w.key).or_default().push(w);
    }
    let mut bad = Vec::new();
    for r in reads {
        let ws = by_key.get(&r.key).map(|v| v.as_slice()).unwrap_or(&[]);
        // The read's value must come from a write invoked before the read returned.
        let source = if r.value == 0 {
            None
        } else {
            match ws.iter().find(|w| w.value == r.value) {
                Some(w) if w.start <= r.end => Some(*w),
                Some(_) => {
                    bad.push(format!(
                        "read of {} returned {} before it was written",
                        r.key, r.value
                    ));
                    continue;
                }
                None => {
                    bad.push(format!(
                        "read of {} returned {}, never written",
                        r.key, r.value
                    ));
                    continue;
                }
            }
        };
        // No write acknowledged before the read started may have replaced the value for good:
        // one that started after the source was acknowledged (or any, for the initial value).
        let superseded = ws.iter().find(|w| {
            let acked_before_read = w.end.is_some_and(|e| e < r.start);
            let after_source = match source {
                None => true,
                Some(s) => s.end.is_some_and(|se| w.start > se),
            };
            acked_before_read && after_source && w.value != r.value
        });
        if let Some(w) = superseded {
            bad.push(format!(
                "read of {} returned {} but {} was acknowledged before the read began",
                r.key, r.value, w.value
            ));
        }
    }
    bad
}

/// Registers: `keys` objects, the first half led by osd.`victim` in `map`.
pub fn registers(map: &cairn_map::ClusterMap, pool: u32, keys: u32, victim: u32) -> Vec<String> {
    let (mut mine, mut others) = (Vec::new(), Vec::new());
    for i in 0.. {
        let name = format!("reg-{i}");
        let pg = map.object_pg(pool, name.as_bytes()).expect("pg");
        let list = if map.pg_placement(pg).primary() == Some(victim) {
            &mut mine
        } else {
            &mut others
        };
        if list.len() < keys as usize / 2 {
            list.push(name);
        }
        if mine.len() + others.len() == keys as usize {
            break;
        }
    }
    mine.extend(others);
    mine
}

/// Reads every register once more (after the workload stopped: every write acknowledged or
/// failed), adds those reads to `h`, and checks the whole history; panics with the
/// violations and `logs` on any. Returns (acknowledged writes, reads checked).
pub async fn final_check(
    client: &cairn_client::Client,
    pool: u32,
    names: &[String],
    mut h: History,
    logs: impl Fn() -> String,
) -> (usize, usize) {
    for (key, name) in names.iter().enumerate() {
        let start = Instant::now();
        let b = client
            .read(pool, name.as_bytes(), 0, BLOCK as u64)
            .await
            .unwrap_or_else(|e| panic!("final read of {name}: {e}\n{}", logs()));
        h.reads.push(Read {
            key: key as u32,
            value: decode(&b),
            start,
            end: Instant::now(),
        });
    }
    let acked = h.writes.iter().filter(|w| w.end.is_some()).count();
    let bad = check(&h.writes, &h.reads);
    assert!(bad.is_empty(), "{}\n{}", bad.join("\n"), logs());
    (acked, h.reads.len())
}

/// What a workload did.
#[derive(Default)]
pub struct History {
    pub writes: Vec<Write>,
    pub reads: Vec<Read>,
}

/// `writers` writers of unique values (never 0) and `readers` readers on `names` until
/// `stop`; task ids from `first` (they make the values unique).
pub struct Roles {
    pub first: u64,
    pub writers: u64,
    pub readers: u64,
}

pub fn workload(
    client: &cairn_client::Client,
    pool: u32,
    names: &Arc<Vec<String>>,
    hist: &Arc<Mutex<History>>,
    stop: &Arc<std::sync::atomic::AtomicBool>,
    roles: Roles,
) -> Vec<tokio::task::JoinHandle<()>> {
    let writers_end = roles.first + roles.writers;
    (roles.first..writers_end + roles.readers)
        .map(|t| {
            let (client, names, hist, stop) =
                (client.clone(), names.clone(), hist.clone(), stop.clone());
            tokio::spawn(async move {
                let mut rng = 0x9e37_79b9_7f4a_7c15u64 ^ (t << 32);
                let mut seq = 0u64;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    rng ^= rng << 13;
                    rng ^= rng >> 7;
                    rng ^= rng << 17;
                    let key = (rng % names.len() as u64) as u32;
                    let name = names[key as usize].as_bytes();
                    let start = Instant::now();
                    if t < writers_end {
                        seq += 1;
                        let value = ((t + 1) << 32) | seq;
                        let r = client.write_full(pool, name, &encode(value)).await;
                        let end = r.is_ok().then(Instant::now);
                        hist.lock().expect("lock").writes.push(Write {
                            key,
                            value,
                            start,
                            end,
                        });
                    } else {
                        let value = match client.read(pool, name, 0, BLOCK as u64).await {
                            Ok(b) => decode(&b),
                            Err(cairn_client::ClientError::NoSuchObject { .. }) => 0,
                            Err(_) => continue,
                        };
                        hist.lock().expect("lock").reads.push(Read {
                            key,
                            value,
                            start,
                            end: Instant::now(),
                        });
                    }
                }
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn at(base: Instant, ms: u64) -> Instant {
        base + Duration::from_millis(ms)
    }

    fn w(base: Instant, value: u64, s: u64, e: u64) -> Write {
        Write {
            key: 1,
            value,
            start: at(base, s),
            end: Some(at(base, e)),
        }
    }

    fn r(base: Instant, value: u64, s: u64, e: u64) -> Read {
        Read {
            key: 1,
            value,
            start: at(base, s),
            end: at(base, e),
        }
    }

    #[test]
    fn the_checker_accepts_linearizable_and_flags_stale_histories() {
        let b = Instant::now();
        let writes = [w(b, 1, 0, 10), w(b, 2, 20, 30)];
        // Concurrent with write 2: either value is fine.
        assert!(check(&writes, &[r(b, 1, 25, 26), r(b, 2, 25, 26)]).is_empty());
        // After write 2 was acknowledged, value 1 is stale.
        assert_eq!(check(&writes, &[r(b, 1, 40, 41)]).len(), 1);
        // Nothing before write 1 completed... then "never existed" after it is stale.
        assert_eq!(check(&writes, &[r(b, 0, 15, 16)]).len(), 1);
        // A value never written, or read before it was written.
        assert_eq!(check(&writes, &[r(b, 9, 40, 41)]).len(), 1);
        assert_eq!(check(&[w(b, 3, 50, 60)], &[r(b, 3, 40, 45)]).len(), 1);
    }
}
