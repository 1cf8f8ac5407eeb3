//! The one I/O seam of the store: [`BlockDevice`], with the real file/block device and an
//! in-memory device behind it (the fault-injecting device is in [`crate::fault`]).
//!
//! Contract for every implementation:
//! - I/O is in whole [`BLOCK_SIZE`] blocks at block-aligned offsets; buffers are
//!   [`AlignedBuf`]s so that `O_DIRECT` works. A byte-addressable device (NVM, or a tmpfs
//!   file standing in for it) also takes writes of any multiple of [`NVM_WRITE_ALIGN`] bytes
//!   at such offsets ([`BlockDevice::write_align`]): the WAL packs its batches that tight.
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

/// The write alignment of a byte-addressable device (a cache line): see
/// [`BlockDevice::write_align`].
pub const NVM_WRITE_ALIGN: usize = 64;

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
    /// The alignment of the offset and length of a write: [`BLOCK_SIZE`], or
    /// [`NVM_WRITE_ALIGN`] for a byte-addressable device.
    fn write_align(&self) -> usize {
        BLOCK_SIZE
    }
    /// The alignment a write's buffer needs in memory (`O_DIRECT`'s). An [`AlignedBuf`] always
    /// has it; a buffer that has it too is written without a copy into one.
    fn mem_align(&self) -> usize {
        BLOCK_SIZE
    }
}

/// Rounds `v` up to a multiple of [`BLOCK_SIZE`].
pub fn align_up(v: u64) -> u64 {
    v.div_ceil(BLOCK) * BLOCK
}

fn check_io(buf_len: usize, off: u64, size: u64) -> io::Result<()> {
    check_aligned(buf_len, off, size, BLOCK_SIZE)
}

/// Checks an I/O of `buf_len` bytes at `off` against alignment `align` and the device end.
pub fn check_aligned(buf_len: usize, off: u64, size: u64, align: usize) -> io::Result<()> {
    let aligned = buf_len.is_multiple_of(align) && off.is_multiple_of(align as u64);
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

/// Fails a write from a buffer not at a multiple of `align` in memory, as `O_DIRECT` does.
pub fn check_mem_aligned(name: &str, buf: &[u8], align: usize) -> io::Result<()> {
    if (buf.as_ptr() as usize).is_multiple_of(align) {
        return Ok(());
    }
    Err(io::Error::new(
        io::ErrorKind::InvalidInput,
        format!("{name}: a write's buffer is not {align}-byte aligned in memory"),
    ))
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
        let b = Self::recycle(slot.take(), want);
        slot.insert(b)
    }

    /// A buffer of exactly `len` bytes, `old`'s allocation when that is large enough (its
    /// bytes then whatever `old` held: the caller overwrites all of them), else a new zeroed
    /// one.
    pub fn recycle(old: Option<AlignedBuf>, len: usize) -> AlignedBuf {
        let mut b = match old {
            Some(b) if b.cap >= len => b,
            _ => Self::zeroed(len),
        };
        // The allocation's bytes are all initialised (zeroed, then written).
        b.len = len;
        b
    }

    /// Bytes allocated (a whole number of blocks, at least `len`).
    pub fn capacity(&self) -> usize {
        self.cap
    }

    /// A buffer holding exactly `data` (its allocation aligned and rounded up to whole
    /// blocks, zeroed past `data`).
    pub fn copy_of(data: &[u8]) -> Self {
        let mut b = Self::from_slice(data);
        b.len = data.len();
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
    /// On tmpfs: memory, like the NVM it stands in for (it takes `O_DIRECT` since Linux 6.6,
    /// but any write lands in the page cache).
    in_memory: bool,
    /// See [`BlockDevice::mem_align`].
    mem_align: usize,
}

/// The memory alignment `O_DIRECT` needs for `file` (`statx`'s `STATX_DIOALIGN`, Linux 6.1+;
/// often 512 or 4 bytes, not a whole block), when the kernel says.
fn dio_mem_align(file: &File) -> Option<usize> {
    use std::os::fd::AsRawFd;
    let mut st = std::mem::MaybeUninit::<libc::statx>::zeroed();
    // SAFETY: statx with AT_EMPTY_PATH describes the open descriptor into the buffer it is
    // given; the path is a valid empty C string.
    let r = unsafe {
        libc::statx(
            file.as_raw_fd(),
            c"".as_ptr(),
            libc::AT_EMPTY_PATH,
            libc::STATX_DIOALIGN,
            st.as_mut_ptr(),
        )
    };
    if r != 0 {
        return None;
    }
    // SAFETY: initialised by the successful call (and zeroed before).
    let st = unsafe { st.assume_init() };
    let align = st.stx_dio_mem_align as usize;
    (st.stx_mask & libc::STATX_DIOALIGN != 0 && align.is_power_of_two()).then_some(align)
}

/// Allocates every page of a tmpfs file of `len` bytes (those it has keep their bytes). A
/// sparse file would take its memory page by page as the WAL ring first goes round: a full
/// tmpfs would then fail a WAL write long after start, and every first write to a page pays
/// for allocating and clearing it (measured on the 2-core VM: 8-10 % of the machine in the
/// first laps of `bench nbd` randwrite-4k-qd32, 1 % once allocated). Failing here says so
/// at once.
fn reserve_memory(file: &File, len: u64, name: &str) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    let Ok(len) = libc::off_t::try_from(len) else {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{name}: {len} bytes is too large a file"),
        ));
    };
    // SAFETY: fallocate on an open descriptor; mode 0 only allocates (never discards data).
    if unsafe { libc::fallocate(file.as_raw_fd(), 0, 0, len) } != 0 {
        let e = io::Error::last_os_error();
        return Err(io::Error::new(
            e.kind(),
            format!(
                "{name}: cannot reserve its {len} bytes of memory on tmpfs ({e}): free memory \
                 there or give a smaller WAL"
            ),
        ));
    }
    Ok(())
}

/// Whether `file` is on tmpfs.
fn on_tmpfs(file: &File) -> bool {
    use std::os::fd::AsRawFd;
    let mut s = std::mem::MaybeUninit::<libc::statfs>::zeroed();
    // SAFETY: fstatfs writes a `statfs` into the buffer it is given; we read it only when the
    // call succeeded, and the descriptor is open for the call's duration.
    let ok = unsafe { libc::fstatfs(file.as_raw_fd(), s.as_mut_ptr()) } == 0;
    // SAFETY: initialised by the successful call (and zeroed before).
    ok && unsafe { s.assume_init() }.f_type == libc::TMPFS_MAGIC
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
        let in_memory = on_tmpfs(&file);
        if meta.is_file() && size > cur {
            file.set_len(size)?;
            cur = size;
        }
        if meta.is_file() && in_memory {
            reserve_memory(&file, cur, &name)?;
        }
        let size = if size == 0 { cur } else { size.min(cur) };
        let mem_align = if direct && !in_memory {
            dio_mem_align(&file).unwrap_or(BLOCK_SIZE).min(BLOCK_SIZE)
        } else {
            1
        };
        Ok(FileDevice {
            name,
            in_memory,
            mem_align,
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
        check_aligned(buf.len(), off, self.size, self.write_align())?;
        self.file.write_all_at(buf, off)
    }
    fn flush(&self) -> io::Result<()> {
        self.file.sync_data()
    }
    /// Writes to tmpfs (what stands in for NVM) or without `O_DIRECT` go to the page cache,
    /// which takes any length at any offset.
    fn write_align(&self) -> usize {
        if self.direct && !self.in_memory {
            BLOCK_SIZE
        } else {
            NVM_WRITE_ALIGN
        }
    }
    fn mem_align(&self) -> usize {
        self.mem_align
    }
}

/// A device in memory; flush is a no-op. The fault-injecting device builds on it in tests.
/// A block device's writes need block-aligned buffers, as a file opened with `O_DIRECT` on a
/// disk may, so that tests find a write from a buffer that would fail there.
pub struct MemDevice {
    name: String,
    data: RwLock<Vec<u8>>,
    write_align: usize,
    mem_align: usize,
}

impl MemDevice {
    /// A zeroed device of `size` bytes.
    pub fn new(name: &str, size: u64) -> Self {
        MemDevice {
            name: name.to_string(),
            data: RwLock::new(vec![0; (size / BLOCK * BLOCK) as usize]),
            write_align: BLOCK_SIZE,
            mem_align: BLOCK_SIZE,
        }
    }

    /// A zeroed byte-addressable device (like NVM): writes need [`NVM_WRITE_ALIGN`] only.
    pub fn nvm(name: &str, size: u64) -> Self {
        MemDevice {
            write_align: NVM_WRITE_ALIGN,
            mem_align: 1,
            ..MemDevice::new(name, size)
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
        check_mem_aligned(&self.name, buf, self.mem_align)?;
        let mut d = self.data.write().map_err(|_| poisoned())?;
        check_aligned(buf.len(), off, d.len() as u64, self.write_align)?;
        d[off as usize..off as usize + buf.len()].copy_from_slice(buf);
        Ok(())
    }
    fn flush(&self) -> io::Result<()> {
        Ok(())
    }
    fn write_align(&self) -> usize {
        self.write_align
    }
    fn mem_align(&self) -> usize {
        self.mem_align
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

    #[test]
    fn a_file_on_tmpfs_takes_writes_of_64_bytes_like_nvm() {
        let shm = std::path::Path::new("/dev/shm");
        if !shm.is_dir() {
            return; // no tmpfs to try
        }
        let path = shm.join(format!("cairn-dev-nvm-{}", std::process::id()));
        let d = FileDevice::open(&path, 1 << 20, "wal").unwrap();
        assert_eq!((d.write_align(), d.mem_align()), (NVM_WRITE_ALIGN, 1));
        // Its memory is taken at once, not page by page as it is first written.
        use std::os::unix::fs::MetadataExt;
        assert!(std::fs::metadata(&path).unwrap().blocks() * 512 >= 1 << 20);
        let mut b = AlignedBuf::zeroed(4096);
        b[..5].copy_from_slice(b"first");
        d.write_at(&b[..64], 64).unwrap();
        b[..5].copy_from_slice(b"again");
        d.write_at(&b[..128], 128).unwrap();
        let mut r = AlignedBuf::zeroed(4096);
        d.read_at(&mut r, 0).unwrap();
        assert_eq!((&r[64..69], &r[128..133]), (&b"first"[..], &b"again"[..]));
        assert!(d.write_at(&b[..100], 0).is_err(), "not a multiple of 64");
        assert!(d.write_at(&b[..64], 32).is_err(), "not at a multiple of 64");
        std::fs::remove_file(&path).unwrap();
        // Off tmpfs (a disk file system), whole blocks only.
        let dir = std::env::temp_dir();
        if super::on_tmpfs(&File::open(&dir).unwrap()) {
            return;
        }
        let path = dir.join(format!("cairn-dev-disk-{}", std::process::id()));
        let d = FileDevice::open(&path, 1 << 20, "data0").unwrap();
        assert_eq!(d.write_align(), BLOCK_SIZE);
        assert!(d.write_at(&b[..64], 64).is_err());
        // O_DIRECT's memory alignment, as the kernel gives it; writes from buffers there work.
        let align = d.mem_align();
        assert!(align.is_power_of_two() && align <= BLOCK_SIZE, "{align}");
        if d.is_direct() && align < BLOCK_SIZE {
            let mut big = AlignedBuf::zeroed(3 * 4096);
            big[align..align + 5].copy_from_slice(b"moved");
            d.write_at(&big[align..align + 8192], 8192).unwrap();
            let mut r = AlignedBuf::zeroed(4096);
            d.read_at(&mut r, 8192).unwrap();
            assert_eq!(&r[..5], b"moved");
        }
        std::fs::remove_file(&path).unwrap();
    }
}
