//! An in-memory [`Exports`] for the protocol tests: a byte vector per export plus a 4 KiB
//! allocation map, so trims, zeroes and block status are observable, and counters of what the
//! server asked for, so tests can check that a refused request touched nothing.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use cairn_nbd::{ClientId, Export, ExportError, Exports, Extent, Opened};

/// Allocation granularity of the in-memory export.
pub const BLOCK: u64 = 4096;

#[derive(Default)]
struct State {
    data: Vec<u8>,
    allocated: Vec<bool>,
}

/// Counters of the calls an export received.
#[derive(Default, Debug)]
pub struct Calls {
    pub writes: AtomicU64,
    pub fua_writes: AtomicU64,
    pub flushes: AtomicU64,
    pub trims: AtomicU64,
    pub zeroes: AtomicU64,
    pub reads: AtomicU64,
}

/// One export.
pub struct MemExport {
    state: Mutex<State>,
    multi_conn: bool,
    /// Reads starting below this offset are delayed by `slow_delay` (out-of-order replies).
    slow_below: u64,
    slow_delay: Duration,
    /// A read at this offset panics (after a wait), as a buggy export might.
    panic_at: Option<u64>,
    pub calls: Calls,
}

impl MemExport {
    pub fn new(size: u64) -> MemExport {
        MemExport {
            state: Mutex::new(State {
                data: vec![0; size as usize],
                allocated: vec![false; size.div_ceil(BLOCK) as usize],
            }),
            multi_conn: true,
            slow_below: 0,
            slow_delay: Duration::ZERO,
            panic_at: None,
            calls: Calls::default(),
        }
    }

    /// Reads starting below `offset` take `delay`.
    pub fn with_slow_reads(mut self, below: u64, delay: Duration) -> MemExport {
        self.slow_below = below;
        self.slow_delay = delay;
        self
    }

    /// A read starting at `offset` panics.
    pub fn with_panicking_reads_at(mut self, offset: u64) -> MemExport {
        self.panic_at = Some(offset);
        self
    }

    pub fn without_multi_conn(mut self) -> MemExport {
        self.multi_conn = false;
        self
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A copy of the contents.
    pub fn contents(&self) -> Vec<u8> {
        self.state().data.clone()
    }

    /// Writes directly (not through NBD), marking the blocks allocated.
    pub fn fill(&self, offset: u64, bytes: &[u8]) {
        let mut s = self.state();
        put(&mut s, offset, bytes);
    }

    pub fn is_allocated(&self, block: usize) -> bool {
        self.state().allocated[block]
    }
}

fn put(s: &mut State, offset: u64, bytes: &[u8]) {
    let start = offset as usize;
    s.data[start..start + bytes.len()].copy_from_slice(bytes);
    mark(s, offset, bytes.len() as u64, true);
}

/// Marks the blocks touched by a range.
fn mark(s: &mut State, offset: u64, len: u64, allocated: bool) {
    if len == 0 {
        return;
    }
    for b in offset / BLOCK..(offset + len).div_ceil(BLOCK) {
        s.allocated[b as usize] = allocated;
    }
}

/// Zeroes the blocks entirely inside a range and marks them unallocated.
fn punch(s: &mut State, offset: u64, len: u64) {
    let first = offset.div_ceil(BLOCK);
    let end = (offset + len) / BLOCK;
    for b in first..end {
        let at = (b * BLOCK) as usize;
        s.data[at..at + BLOCK as usize].fill(0);
        s.allocated[b as usize] = false;
    }
}

impl Export for MemExport {
    fn size(&self) -> u64 {
        self.state().data.len() as u64
    }

    fn multi_conn(&self) -> bool {
        self.multi_conn
    }

    async fn read(&self, offset: u64, len: u32) -> Result<Vec<u8>, ExportError> {
        self.calls.reads.fetch_add(1, Ordering::SeqCst);
        if offset < self.slow_below {
            tokio::time::sleep(self.slow_delay).await;
        }
        if self.panic_at == Some(offset) {
            tokio::task::yield_now().await;
            panic!("the test export panics on a read at {offset}");
        }
        let s = self.state();
        Ok(s.data[offset as usize..offset as usize + len as usize].to_vec())
    }

    async fn write(&self, offset: u64, data: Vec<u8>, fua: bool) -> Result<(), ExportError> {
        self.calls.writes.fetch_add(1, Ordering::SeqCst);
        if fua {
            self.calls.fua_writes.fetch_add(1, Ordering::SeqCst);
        }
        put(&mut self.state(), offset, &data);
        Ok(())
    }

    async fn flush(&self) -> Result<(), ExportError> {
        self.calls.flushes.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }

    async fn trim(&self, offset: u64, len: u32) -> Result<(), ExportError> {
        self.calls.trims.fetch_add(1, Ordering::SeqCst);
        punch(&mut self.state(), offset, u64::from(len));
        Ok(())
    }

    async fn write_zeroes(
        &self,
        offset: u64,
        len: u32,
        may_punch: bool,
        fast: bool,
        _fua: bool,
    ) -> Result<(), ExportError> {
        // Punching is fast; writing zeros is not, so a fast request that may not punch fails.
        if fast && !may_punch {
            return Err(ExportError::NotSupported(
                "zeroing without punching is slow".into(),
            ));
        }
        self.calls.zeroes.fetch_add(1, Ordering::SeqCst);
        let mut s = self.state();
        let (start, end) = (offset as usize, offset as usize + len as usize);
        s.data[start..end].fill(0);
        mark(&mut s, offset, u64::from(len), true);
        if may_punch {
            punch(&mut s, offset, u64::from(len));
        }
        Ok(())
    }

    async fn block_status(&self, offset: u64, len: u32) -> Result<Vec<Extent>, ExportError> {
        let s = self.state();
        let end = offset + u64::from(len);
        let mut out: Vec<Extent> = Vec::new();
        let mut at = offset;
        while at < end {
            let block_end = ((at / BLOCK + 1) * BLOCK).min(end);
            let hole = !s.allocated[(at / BLOCK) as usize];
            let n = (block_end - at) as u32;
            match out.last_mut() {
                Some(last) if last.hole == hole => last.len += n,
                _ => out.push(Extent {
                    len: n,
                    hole,
                    zero: hole,
                }),
            }
            at = block_end;
        }
        Ok(out)
    }
}

/// A fixed set of named exports; the first one is also the default ("") export.
#[derive(Default)]
pub struct MemExports {
    exports: BTreeMap<String, (String, Arc<MemExport>)>,
    default: Option<String>,
    /// When set, only these (identity, export) pairs may be opened; the bool says writable.
    grants: Option<BTreeMap<(String, String), bool>>,
}

impl MemExports {
    pub fn new() -> MemExports {
        MemExports::default()
    }

    /// Lets `identity` open `export` (read-only unless `writable`); once any grant is given,
    /// everything not granted is denied.
    pub fn grant(&mut self, identity: &str, export: &str, writable: bool) {
        self.grants
            .get_or_insert_with(BTreeMap::new)
            .insert((identity.into(), export.into()), writable);
    }

    /// May `client` open `export`, and write it?
    fn access(&self, export: &str, client: &ClientId) -> Option<bool> {
        let Some(grants) = &self.grants else {
            return Some(true);
        };
        let who = client.identity.clone().unwrap_or_default();
        grants.get(&(who, export.to_string())).copied()
    }

    /// Adds an export and returns a handle to its backend.
    pub fn add(&mut self, name: &str, description: &str, export: MemExport) -> Arc<MemExport> {
        let export = Arc::new(export);
        self.exports
            .insert(name.into(), (description.into(), Arc::clone(&export)));
        self.default.get_or_insert_with(|| name.into());
        export
    }
}

impl Exports for MemExports {
    type Export = MemExport;

    async fn list(&self, client: &ClientId) -> Result<Vec<(String, String)>, ExportError> {
        Ok(self
            .exports
            .iter()
            .filter(|(n, _)| self.access(n, client).is_some())
            .map(|(n, (d, _))| (n.clone(), d.clone()))
            .collect())
    }

    async fn open(
        &self,
        name: &str,
        client: &ClientId,
    ) -> Result<Option<Opened<MemExport>>, ExportError> {
        let name = match (name, &self.default) {
            ("", Some(d)) => d.as_str(),
            _ => name,
        };
        let Some((_, export)) = self.exports.get(name) else {
            return Ok(None);
        };
        let writable = self.access(name, client).ok_or_else(|| {
            ExportError::Denied(format!("permission denied: {client:?} may not open {name}"))
        })?;
        Ok(Some(Opened {
            export: Arc::clone(export),
            read_only: !writable,
        }))
    }
}
