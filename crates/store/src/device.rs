//! The one I/O seam of the store: [`BlockDevice`], with the real file/block device and an
//! in-memory device behind it (the fault-injecting device is in [`crate::fault`]).
//!
//! Contract for every implementation:
//! - I/O is in whole [`BLOCK_SIZE`] blocks at block-aligned offsets; buffers are
//!   [`AlignedBuf`]s so that `O_DIRECT` works.
//! - A completed `write_at` may still be volatile (in a device cache); it is durable only once a
//!   later `flush` has returned `Ok`. A write not followed by a successful flush may be lost or
//!   torn (at 512-byte sector granularity) by a crash.
//! - `read_at` returns the latest written bytes, durable or not.
//! - Methods may be called concurrently from several threads.

use std::alloc::{self, Layout};
use std::fs::{File, OpenOptions};
use std::io;
use std::ops::{Deref, DerefMut};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;
use std::sync::RwLock;

/// The unit of device I/O and of data checksums.
pub const BLOCK_SIZE: usize = 4096;
const BLOCK: u64 = BLOCK_SIZE as u64;

/// A block device: see the module documentation for the contract.
pub trait BlockDevice: Send + Sync + 'static {
    /// A name for error messages: role and path.
    fn name(&self) -> &str;
    /// Usable size in bytes (a multiple of [`BLOCK_SIZE`]).
    fn size(&self) -> u64;
    /// Reads `buf.len()` bytes at `off`.
    fn read_at(&self, buf: &mut [u8], off: u64) -> io::Result<()>;
    /// Writes `buf` at `off`; volatile until the next successful `flush`.
    fn write_at(&self, buf: &[u8], off: u64) -> io::Result<()>;
    /// Makes every completed write durable.
    fn flush(&self) -> io::Result<()>;
}

/// Rounds `v` up to a multiple of [`BLOCK_SIZE`].
pub fn align_up(v: u64) -> u64 {
    v.div_ceil(BLOCK) * BLOCK
}

fn check_io(buf_len: usize, off: u64, size: u64) -> io::Result<()> {
    let aligned = buf_len.is_multiple_of(BLOCK_SIZE) && off.is_multiple_of(BLOCK);
    if !aligned {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("unaligned I/O: {buf_len} bytes at offset {off}"),
        ));
    }
    if off.checked_add(buf_len as u64).is_none_or(|end| end > size) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("I/O of {buf_len} bytes at offset {off} beyond the device end {size}"),
        ));
    }
    Ok(())
}

/// A heap buffer aligned to [`BLOCK_SIZE`], as `O_DIRECT` requires.
pub struct AlignedBuf {
    ptr: *mut u8,
    len: usize,
    cap: usize,
}

// SAFETY: AlignedBuf owns its allocation exclusively, like Vec<u8>.
unsafe impl Send for AlignedBuf {}
// SAFETY: shared access only hands out &[u8].
unsafe impl Sync for AlignedBuf {}

impl AlignedBuf {
    /// A zeroed buffer of `len` bytes (rounded up to whole blocks).
    pub fn zeroed(len: usize) -> Self {
        let cap = len.div_ceil(BLOCK_SIZE).max(1) * BLOCK_SIZE;
        let layout = Self::layout(cap);
        // SAFETY: layout has non-zero size.
        let ptr = unsafe { alloc::alloc_zeroed(layout) };
        if ptr.is_null() {
            alloc::handle_alloc_error(layout);
        }
        AlignedBuf { ptr, len: cap, cap }
    }

    fn layout(cap: usize) -> Layout {
        match Layout::from_size_align(cap, BLOCK_SIZE) {
            Ok(l) => l,
            Err(_) => alloc::handle_alloc_error(Layout::new::<u8>()),
        }
    }

    /// A buffer of `len` bytes (rounded up to whole blocks) kept in `slot` for the next call:
    /// allocated only when the one there is too small. Its bytes are whatever the last user
    /// left, so the caller must overwrite all of them (a fresh large zeroed allocation per
    /// call costs page faults and page clearing on every flush).
    pub fn reuse(slot: &mut Option<AlignedBuf>, len: usize) -> &mut AlignedBuf {
        let want = len.div_ceil(BLOCK_SIZE).max(1) * BLOCK_SIZE;
        if slot.as_ref().is_none_or(|b| b.cap < want) {
            *slot = Some(Self::zeroed(want));
        }
        let b = slot.get_or_insert_with(|| Self::zeroed(want));
        // The allocation holds at least `want` initialised bytes (zeroed, then written).
        b.len = want;
        b
    }

    /// A buffer holding `data`, zero-padded to whole blocks.
    pub fn from_slice(data: &[u8]) -> Self {
        let mut b = Self::zeroed(data.len());
        b[..data.len()].copy_from_slice(data);
        b
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        // SAFETY: ptr was allocated with this exact layout.
        unsafe { alloc::dealloc(self.ptr, Self::layout(self.cap)) }
    }
}

impl Deref for AlignedBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: ptr is valid for len initialised bytes.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
}

impl DerefMut for AlignedBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: ptr is valid for len initialised bytes and uniquely borrowed.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

/// A regular file or block device, opened with `O_DIRECT` where the file system supports it
/// (tmpfs does not; there writes go to the page cache, which is what an NVDIMM stands in for).
pub struct FileDevice {
    name: String,
    file: File,
    size: u64,
    direct: bool,
}

impl FileDevice {
    /// Opens (creating it when missing) `path`; a regular file shorter than `size` is extended.
    /// `size` 0 means "use the current size" (block devices).
    pub fn open(path: &Path, size: u64, role: &str) -> io::Result<Self> {
        let name = format!("{role} ({})", path.display());
        let open = |direct: bool| {
            let mut o = OpenOptions::new();
            o.read(true).write(true).create(true).truncate(false);
            if direct {
                o.custom_flags(libc::O_DIRECT);
            }
            o.open(path)
        };
        let (file, direct) = match open(true) {
            Ok(f) => (f, true),
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => (open(false)?, false),
            Err(e) => return Err(e),
        };
        let meta = file.metadata()?;
        let mut cur = if meta.is_file() {
            meta.len()
        } else {
            use std::io::{Seek, SeekFrom};
            (&file).seek(SeekFrom::End(0))?
        };
        if meta.is_file() && size > cur {
            file.set_len(size)?;
            cur = size;
        }
        let size = if size == 0 { cur } else { size.min(cur) };
        Ok(FileDevice {
            name,
            file,
            size: size / BLOCK * BLOCK,
            direct,
        })
    }

    /// Whether the file was opened with `O_DIRECT`.
    pub fn is_direct(&self) -> bool {
        self.direct
    }
}

impl BlockDevice for FileDevice {
    fn name(&self) -> &str {
        &self.name
    }
    fn size(&self) -> u64 {
        self.size
    }
    fn read_at(&self, buf: &mut [u8], off: u64) -> io::Result<()> {
        check_io(buf.len(), off, self.size)?;
        self.file.read_exact_at(buf, off)
    }
    fn write_at(&self, buf: &[u8], off: u64) -> io::Result<()> {
        check_io(buf.len(), off, self.size)?;
        self.file.write_all_at(buf, off)
    }
    fn flush(&self) -> io::Result<()> {
        self.file.sync_data()
    }
}

/// A device in memory; flush is a no-op. The fault-injecting device builds on it in tests.
pub struct MemDevice {
    name: String,
    data: RwLock<Vec<u8>>,
}

impl MemDevice {
    /// A zeroed device of `size` bytes.
    pub fn new(name: &str, size: u64) -> Self {
        MemDevice {
            name: name.to_string(),
            data: RwLock::new(vec![0; (size / BLOCK * BLOCK) as usize]),
        }
    }
}

fn poisoned() -> io::Error {
    io::Error::other("device lock poisoned by a panicked thread")
}

impl BlockDevice for MemDevice {
    fn name(&self) -> &str {
        &self.name
    }
    fn size(&self) -> u64 {
        self.data.read().map(|d| d.len() as u64).unwrap_or(0)
    }
    fn read_at(&self, buf: &mut [u8], off: u64) -> io::Result<()> {
        let d = self.data.read().map_err(|_| poisoned())?;
        check_io(buf.len(), off, d.len() as u64)?;
        buf.copy_from_slice(&d[off as usize..off as usize + buf.len()]);
        Ok(())
    }
    fn write_at(&self, buf: &[u8], off: u64) -> io::Result<()> {
        let mut d = self.data.write().map_err(|_| poisoned())?;
        check_io(buf.len(), off, d.len() as u64)?;
        d[off as usize..off as usize + buf.len()].copy_from_slice(buf);
        Ok(())
    }
    fn flush(&self) -> io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_device_round_trip_and_bounds() {
        let dir = std::env::temp_dir().join(format!("cairn-dev-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("dev");
        let d = FileDevice::open(&path, 1 << 20, "data0").unwrap();
        assert_eq!(d.size(), 1 << 20);
        let mut b = AlignedBuf::zeroed(8192);
        b[..5].copy_from_slice(b"hello");
        d.write_at(&b, 4096).unwrap();
        d.flush().unwrap();
        let mut r = AlignedBuf::zeroed(8192);
        d.read_at(&mut r, 4096).unwrap();
        assert_eq!(&r[..5], b"hello");
        assert!(d.write_at(&b, (1 << 20) - 4096).is_err());
        assert!(d.read_at(&mut r[..100], 0).is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
