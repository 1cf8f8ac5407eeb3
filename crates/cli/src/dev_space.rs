//! Whether the file system of a dev cluster has room for what its sparse OSD data files may
//! grow to. A data file takes space as the OSD writes it; when the file system fills first,
//! the OSD's next write fails with "No space left on device" and the OSD stops (its
//! acknowledged writes are safe, but the cluster degrades), which looks like a Cairn failure
//! long after `dev up` said nothing.

use std::os::unix::fs::MetadataExt;
use std::path::Path;

use crate::size::human;

/// A warning when the data files of `osds` OSDs of `osd_size` bytes in `dir` may grow past
/// the space free there; `None` when they fit (or the free space cannot be read).
pub fn shortfall(dir: &Path, osds: u32, osd_size: u64) -> Option<String> {
    let free = free_bytes(dir)?;
    let held: u64 = (0..osds)
        .filter_map(|i| std::fs::metadata(dir.join(format!("osd.{i}")).join("data.img")).ok())
        .map(|m| m.blocks() * 512)
        .sum();
    let may_grow = u64::from(osds)
        .saturating_mul(osd_size)
        .saturating_sub(held);
    (may_grow > free).then(|| {
        format!(
            "warning: the OSDs' data files in {} are sparse and may still grow by {}, but that \
             file system has {} free: when it fills, OSD writes fail with \"No space left on \
             device\" and those OSDs stop. Free space there, or use a smaller --osd-size for a \
             new cluster",
            dir.display(),
            human(may_grow),
            human(free)
        )
    })
}

/// Bytes an unprivileged writer may still use on the file system holding `dir`.
fn free_bytes(dir: &Path) -> Option<u64> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(dir.as_os_str().as_bytes()).ok()?;
    let mut st = std::mem::MaybeUninit::<libc::statvfs>::zeroed();
    // SAFETY: statvfs fills the buffer it is given for a valid C path; read only on success.
    if unsafe { libc::statvfs(c.as_ptr(), st.as_mut_ptr()) } != 0 {
        return None;
    }
    // SAFETY: initialised by the successful call (and zeroed before).
    let st = unsafe { st.assume_init() };
    Some(st.f_bavail.saturating_mul(st.f_frsize))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn warns_only_when_the_files_may_outgrow_the_free_space() {
        let dir = std::env::temp_dir();
        let free = free_bytes(&dir).expect("statvfs of the temp dir");
        assert!(shortfall(&dir, 3, 1 << 20).is_none() || free < 3 << 20);
        let w = shortfall(&dir, 3, free).expect("3 files as large as the free space");
        assert!(w.contains("No space left") && w.contains("GiB free"), "{w}");
        // Any size an operator types is a warning, not an overflow.
        assert!(shortfall(&dir, 3, u64::MAX).is_some());
    }
}
