//! The baseline of `bench objects`: a bare request/response echo of the same payload over
//! loopback TCP at the same queue depth (one blocking connection per outstanding request,
//! a server thread per connection). It is the floor any networked op can reach here.

use super::measure::new_hist;
use anyhow::{Context, Result};
use hdrhistogram::Histogram;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::{Duration, Instant};

/// Outcome of an echo run.
pub struct EchoResult {
    pub ops: u64,
    pub elapsed: Duration,
    pub lat: Histogram<u64>,
}

fn serve(mut s: TcpStream) {
    let mut len = [0u8; 4];
    let mut buf = Vec::new();
    while s.read_exact(&mut len).is_ok() {
        let n = u32::from_le_bytes(len) as usize;
        buf.resize(n, 0);
        if s.read_exact(&mut buf).is_err()
            || s.write_all(&len).is_err()
            || s.write_all(&buf).is_err()
        {
            return;
        }
    }
}

/// Echoes `payload`-byte messages with `qd` connections for `dur`.
pub fn run(payload: usize, qd: usize, dur: Duration) -> Result<EchoResult> {
    let listener = TcpListener::bind("127.0.0.1:0").context("echo baseline: cannot listen")?;
    let addr = listener.local_addr()?;
    let server = std::thread::spawn(move || {
        for s in listener.incoming().take(qd) {
            match s {
                Ok(s) => {
                    let _ = s.set_nodelay(true);
                    std::thread::spawn(move || serve(s));
                }
                Err(_) => return,
            }
        }
    });
    let start = Instant::now();
    let end = start + dur;
    let mut clients = Vec::new();
    for _ in 0..qd {
        let mut s = TcpStream::connect(addr).context("echo baseline: cannot connect")?;
        s.set_nodelay(true)?;
        clients.push(std::thread::spawn(
            move || -> Result<(u64, Histogram<u64>)> {
                let mut h = new_hist();
                let msg = vec![0x5au8; payload];
                let mut back = vec![0u8; payload];
                let mut len = [0u8; 4];
                let mut ops = 0;
                while Instant::now() < end {
                    let t = Instant::now();
                    s.write_all(&(payload as u32).to_le_bytes())?;
                    s.write_all(&msg)?;
                    s.read_exact(&mut len)?;
                    s.read_exact(&mut back)?;
                    h.record(t.elapsed().as_nanos() as u64)?;
                    ops += 1;
                }
                Ok((ops, h))
            },
        ));
    }
    let mut lat = new_hist();
    let mut ops = 0;
    for c in clients {
        let (n, h) = c
            .join()
            .map_err(|_| anyhow::anyhow!("echo client thread panicked"))??;
        ops += n;
        lat.add(h)?;
    }
    let elapsed = start.elapsed();
    let _ = server.join();
    Ok(EchoResult { ops, elapsed, lat })
}
