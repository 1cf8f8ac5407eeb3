//! The working set, the operations of the workloads and of their raw baselines, and the files
//! the benchmark creates.

use super::measure::{check_interrupt, Kind, Worker};
use super::{BLK, BLOCKS_PER_OBJ, COLL, TAG_MAGIC};
use anyhow::{bail, Context, Result};
use cairn_store::{AlignedBuf, Store, Transaction};
use rand::Rng;
use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};

/// Objects of 4 MiB in one collection; block `b` of the working set is block `b % 1024` of
/// object `b / 1024`.
pub struct WorkingSet {
    pub blocks: u64,
    pub names: Vec<Vec<u8>>,
}

impl WorkingSet {
    pub fn new(bytes: u64) -> Self {
        let blocks = bytes / BLK;
        let nobj = blocks.div_ceil(BLOCKS_PER_OBJ);
        let names = (0..nobj)
            .map(|i| format!("bench-obj-{i:06}").into_bytes())
            .collect();
        WorkingSet { blocks, names }
    }

    /// Object index and byte offset of working-set block `b`.
    pub fn locate(&self, b: u64) -> (usize, u64) {
        ((b / BLOCKS_PER_OBJ) as usize, (b % BLOCKS_PER_OBJ) * BLK)
    }
}

/// Marks a block with the working-set address it is written to.
pub fn tag(block: &mut [u8], b: u64) {
    block[..8].copy_from_slice(&b.to_le_bytes());
    block[8..16].copy_from_slice(TAG_MAGIC);
}

/// Checks that a block read from working-set address `b` is one written there.
pub fn check_tag(block: &[u8], b: u64, what: &str) -> Result<()> {
    if block.len() < 16 || block[..8] != b.to_le_bytes() || &block[8..16] != TAG_MAGIC {
        bail!(
            "{what}: a read of working-set block {b} returned other bytes than were written there (first 16: {:02x?})",
            &block[..block.len().min(16)]
        );
    }
    Ok(())
}

pub fn store_write(store: &Store, ws: &WorkingSet, w: &mut Worker) -> Result<Kind> {
    let b = w.rng.gen_range(0..ws.blocks);
    let (o, off) = ws.locate(b);
    let mut t = Transaction::new();
    t.write(COLL, &ws.names[o], off, w.block_for(b));
    store
        .commit(&t)
        .with_context(|| format!("commit of a 4 KiB write at {off} of object {o}"))?;
    Ok(Kind::Write)
}

/// A write of `len` bytes (whole blocks, within one object) at a random `len`-aligned offset.
pub fn store_write_large(store: &Store, ws: &WorkingSet, w: &mut Worker, len: u64) -> Result<Kind> {
    let chunks = ws.blocks * BLK / len;
    let b = w.rng.gen_range(0..chunks) * (len / BLK);
    let (o, off) = ws.locate(b);
    let mut t = Transaction::new();
    t.write(COLL, &ws.names[o], off, w.chunk_for(b, len as usize));
    store
        .commit(&t)
        .with_context(|| format!("commit of a {len}-byte write at {off} of object {o}"))?;
    Ok(Kind::Write)
}

pub fn store_read(store: &Store, ws: &WorkingSet, w: &mut Worker) -> Result<Kind> {
    let b = w.rng.gen_range(0..ws.blocks);
    let (o, off) = ws.locate(b);
    let v = store
        .read(COLL, &ws.names[o], off, BLK)
        .with_context(|| format!("read of 4 KiB at {off} of object {o}"))?;
    if v.len() as u64 != BLK {
        bail!(
            "store read of 4 KiB at {off} of object {o} returned {} bytes",
            v.len()
        );
    }
    check_tag(&v, b, "store")?;
    Ok(Kind::Read)
}

/// The files of the raw baselines.
pub struct RawFiles {
    /// In the WAL dir: pwrite + fdatasync.
    pub write: Option<File>,
    /// In the data dir, prefilled with tagged blocks: pread (O_DIRECT where supported).
    pub read: Option<File>,
    /// In the data dir: large pwrite (O_DIRECT where supported) + fdatasync.
    pub large: Option<File>,
    pub blocks: u64,
}

pub fn raw_write(f: &RawFiles, w: &mut Worker) -> Result<Kind> {
    let file = f.write.as_ref().context("no write baseline file")?;
    let b = w.rng.gen_range(0..f.blocks);
    file.write_all_at(w.block_for(b), b * BLK)
        .context("baseline pwrite")?;
    file.sync_data().context("baseline fdatasync")?;
    Ok(Kind::Write)
}

/// pwrite (O_DIRECT where supported) + fdatasync of `len` bytes at a random `len`-aligned
/// offset of the large-write baseline file, on the data device's file system.
pub fn raw_write_large(f: &RawFiles, w: &mut Worker, len: u64) -> Result<Kind> {
    let file = f.large.as_ref().context("no large-write baseline file")?;
    let chunks = f.blocks * BLK / len;
    let b = w.rng.gen_range(0..chunks) * (len / BLK);
    let mut buf = AlignedBuf::zeroed(len as usize);
    buf.copy_from_slice(w.chunk_for(b, len as usize));
    file.write_all_at(&buf, b * BLK)
        .context("baseline pwrite")?;
    file.sync_data().context("baseline fdatasync")?;
    Ok(Kind::Write)
}

pub fn raw_read(f: &RawFiles, w: &mut Worker) -> Result<Kind> {
    let file = f.read.as_ref().context("no read baseline file")?;
    let b = w.rng.gen_range(0..f.blocks);
    file.read_exact_at(&mut w.abuf, b * BLK)
        .context("baseline pread")?;
    check_tag(&w.abuf, b, "baseline")?;
    Ok(Kind::Read)
}

/// Writes the read baseline's file: every block of the working set, tagged, then fdatasync.
/// Returns whether it is open with O_DIRECT.
pub fn fill_read_file(path: &Path, blocks: u64) -> Result<(File, bool)> {
    let (f, direct) = open_maybe_direct(path)?;
    let mut buf = AlignedBuf::zeroed((BLOCKS_PER_OBJ * BLK) as usize);
    let mut rng = <rand::rngs::SmallRng as rand::SeedableRng>::seed_from_u64(7);
    rand::RngCore::fill_bytes(&mut rng, &mut buf);
    let mut b = 0;
    while b < blocks {
        check_interrupt()?;
        let n = BLOCKS_PER_OBJ.min(blocks - b);
        for i in 0..n {
            let s = (i * BLK) as usize;
            tag(&mut buf[s..s + BLK as usize], b + i);
        }
        f.write_all_at(&buf[..(n * BLK) as usize], b * BLK)
            .with_context(|| format!("cannot write {}", path.display()))?;
        b += n;
    }
    f.sync_data()
        .with_context(|| format!("cannot flush {}", path.display()))?;
    Ok((f, direct))
}

/// Creates `path` (truncated), opened with O_DIRECT where the file system supports it;
/// returns whether it is.
fn open_maybe_direct(path: &Path) -> Result<(File, bool)> {
    let open = |direct: bool| {
        let mut o = OpenOptions::new();
        o.read(true).write(true).create(true).truncate(true);
        if direct {
            std::os::unix::fs::OpenOptionsExt::custom_flags(&mut o, libc::O_DIRECT);
        }
        o.open(path)
    };
    match open(true) {
        Ok(f) => Ok((f, true)),
        // tmpfs has no O_DIRECT.
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => Ok((
            open(false).with_context(|| format!("cannot create {}", path.display()))?,
            false,
        )),
        Err(e) => Err(e).with_context(|| format!("cannot create {}", path.display())),
    }
}

/// Creates the large-write baseline's file of `blocks` blocks (O_DIRECT where supported).
pub fn large_write_file(path: &Path, blocks: u64) -> Result<File> {
    let (f, _) = open_maybe_direct(path)?;
    f.set_len(blocks * BLK)
        .with_context(|| format!("cannot size {}", path.display()))?;
    Ok(f)
}

/// Files the benchmark creates, removed when dropped (also after an error or Ctrl-C).
pub struct BenchFiles {
    prefix: String,
    pub paths: Vec<PathBuf>,
}

impl BenchFiles {
    pub fn new() -> Self {
        BenchFiles {
            prefix: format!("cairn-bench-{}", std::process::id()),
            paths: Vec::new(),
        }
    }

    /// A new file path in `dir`, registered for removal.
    pub fn path(&mut self, dir: &Path, what: &str) -> PathBuf {
        let p = dir.join(format!("{}-{what}", self.prefix));
        self.paths.push(p.clone());
        p
    }

    /// Removes the files registered since `mark` (a length of `paths`).
    pub fn remove_since(&mut self, mark: usize) {
        for p in self.paths.split_off(mark) {
            let _ = std::fs::remove_file(p);
        }
    }
}

impl Drop for BenchFiles {
    fn drop(&mut self) {
        self.remove_since(0);
    }
}

/// Creates `path` of `size` bytes, allocated up front where the file system can (so that the
/// first pass over a tmpfs WAL does not pay for page allocation).
pub fn preallocate(path: &Path, size: u64) -> Result<()> {
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(path)
        .with_context(|| format!("cannot create {}", path.display()))?;
    // SAFETY: a plain syscall on a descriptor that `f` keeps open.
    let r = unsafe { libc::posix_fallocate(f.as_raw_fd(), 0, size as libc::off_t) };
    if r != 0 {
        f.set_len(size)
            .with_context(|| format!("cannot size {}", path.display()))?;
    }
    Ok(())
}
