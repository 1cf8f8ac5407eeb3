//! `cairn vol import` and `cairn vol export`: a local file (a raw disk image) into a new
//! volume, and a volume or snapshot out to a local file, with progress on stderr. Both keep
//! the copy thin: chunks of zeros are neither written to the volume nor to the file.

use crate::size::human;
use anyhow::{bail, Context, Result};
use cairn_client::Client;
use cairn_volume::Volume;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::Arc;
use tokio::task::JoinSet;

/// Chunks copied at once: enough to keep every OSD of a small cluster busy.
const IN_FLIGHT: usize = 8;

/// How this process names itself in the volume's open lease (shown by `vol rm`).
fn holder(what: &str) -> String {
    format!("cairn vol {what} (pid {})", std::process::id())
}

/// Creates volume `name` as large as `file` (rounded up to 512 bytes) and copies the file
/// into it. The volume must not exist: an import never overwrites data.
pub async fn import(
    client: &Client,
    pool: &str,
    file: &Path,
    name: &str,
    object_size: u32,
) -> Result<()> {
    let f = std::fs::File::open(file).with_context(|| format!("cannot open {}", file.display()))?;
    let meta = f
        .metadata()
        .with_context(|| format!("cannot read the size of {}", file.display()))?;
    if !meta.is_file() {
        bail!("{} is not a regular file", file.display());
    }
    let len = meta.len();
    if len == 0 {
        bail!("{} is empty: nothing to import", file.display());
    }
    let size = len.div_ceil(512) * 512;
    cairn_volume::create(client, pool, name, size, object_size).await?;
    let vol = Arc::new(Volume::open(client.clone(), pool, name, &holder("import")).await?);
    let copied = copy_in(&vol, Arc::new(f), len).await;
    let flushed = match copied {
        Ok(written) => vol.flush().await.map(|()| written).map_err(Into::into),
        Err(e) => Err(e),
    };
    vol.close().await;
    let written = flushed.with_context(|| {
        format!(
            "the import into volume {name} stopped part way: the volume holds part of {}; \
             `cairn vol rm {name} --pool {pool}` removes it",
            file.display()
        )
    })?;
    eprintln!(
        "imported {} ({}) into volume {name} of pool {pool}: {} written, the rest was zeros \
         and uses no space",
        file.display(),
        human(len),
        human(written)
    );
    Ok(())
}

/// Copies `len` bytes of `f` into `vol`, skipping chunks of zeros; returns the bytes written.
async fn copy_in(vol: &Arc<Volume>, f: Arc<std::fs::File>, len: u64) -> Result<u64> {
    let chunk = u64::from(vol.header().object_size);
    in_chunks(len, chunk, "importing", |off, n| {
        let (vol, f) = (vol.clone(), f.clone());
        async move { write_chunk(&vol, &f, off, n).await }
    })
    .await
}

/// Runs `step(offset, length)` over `0..total` in chunks of `chunk` bytes, [`IN_FLIGHT`] at
/// a time, showing progress as `what`; returns the sum of what the steps return (bytes
/// written). The first failure ends it.
async fn in_chunks<F, Fut>(total: u64, chunk: u64, what: &'static str, step: F) -> Result<u64>
where
    F: Fn(u64, u64) -> Fut,
    Fut: std::future::Future<Output = Result<u64>> + Send + 'static,
{
    let mut progress = crate::progress::Progress::new(what);
    let mut tasks = JoinSet::new();
    let (mut done, mut written, mut off) = (0u64, 0u64, 0u64);
    while off < total || !tasks.is_empty() {
        if off < total && tasks.len() < IN_FLIGHT {
            let n = chunk.min(total - off);
            let work = step(off, n);
            tasks.spawn(async move { work.await.map(|w| (n, w)) });
            off += n;
            continue;
        }
        if let Some(r) = tasks.join_next().await {
            let (n, w) = r.with_context(|| format!("{what}: a copy task failed"))??;
            done += n;
            written += w;
            progress.show(done, total);
        }
    }
    progress.finish();
    Ok(written)
}

/// Writes bytes `off..off + n` of `f` at the same offset of `vol` unless they are all zeros
/// (a new volume reads zeros there already); returns the bytes written. The last chunk of a
/// file whose size is not a multiple of 512 is padded with zeros.
async fn write_chunk(vol: &Volume, f: &std::fs::File, off: u64, n: u64) -> Result<u64> {
    let mut buf = vec![0u8; n.div_ceil(512) as usize * 512];
    f.read_exact_at(&mut buf[..n as usize], off)
        .with_context(|| format!("cannot read {n} bytes at offset {off} of the file"))?;
    if buf.iter().all(|&b| b == 0) {
        return Ok(0);
    }
    vol.write(off, &buf)
        .await
        .with_context(|| format!("cannot write {n} bytes at offset {off} of the volume"))?;
    Ok(buf.len() as u64)
}

/// Copies volume `spec` (`VOL`, or `VOL@SNAP` for a snapshot) into a new file `file` of the
/// volume's size (sparse: unallocated and zero chunks are holes). `force` replaces an
/// existing file.
pub async fn export(
    client: &Client,
    pool: &str,
    spec: &str,
    file: &Path,
    force: bool,
) -> Result<()> {
    let (name, snap) = match spec.split_once('@') {
        Some((v, s)) => (v, Some(s)),
        None => (spec, None),
    };
    let who = holder("export");
    let vol = Arc::new(match snap {
        Some(s) => Volume::open_snapshot(client.clone(), pool, name, s, &who).await?,
        None => Volume::open_shared(client.clone(), pool, name, &who).await?,
    });
    let r = export_to(&vol, file, force).await;
    vol.close().await;
    let written = r?;
    eprintln!(
        "exported {spec} ({}) of pool {pool} to {}: {} of data, the rest left as holes",
        human(vol.size()),
        file.display(),
        human(written)
    );
    Ok(())
}

async fn export_to(vol: &Arc<Volume>, file: &Path, force: bool) -> Result<u64> {
    let mut o = std::fs::OpenOptions::new();
    o.write(true);
    match force {
        true => o.create(true).truncate(true),
        false => o.create_new(true),
    };
    let f = o.open(file).map_err(|e| match e.kind() {
        std::io::ErrorKind::AlreadyExists => {
            anyhow::anyhow!("{} exists; --force replaces it", file.display())
        }
        _ => anyhow::Error::new(e).context(format!("cannot create {}", file.display())),
    })?;
    let size = vol.size();
    f.set_len(size)
        .with_context(|| format!("cannot size {} to {size} bytes", file.display()))?;
    let f = Arc::new(f);
    let chunk = u64::from(vol.header().object_size);
    let copied = in_chunks(size, chunk, "exporting", |off, n| {
        let (vol, f) = (vol.clone(), f.clone());
        async move { read_chunk(&vol, &f, off, n).await }
    })
    .await
    .and_then(|written| {
        f.sync_all()
            .with_context(|| format!("cannot flush {} to its device", file.display()))?;
        Ok(written)
    });
    if copied.is_err() {
        // Already full size, a partial copy would pass for a whole image: removed.
        let _ = std::fs::remove_file(file);
    }
    copied
}

/// Copies bytes `off..off + n` of `vol` to the same offset of `f`, unless the volume holds no
/// data there or only zeros (the file has a hole there); returns the bytes written.
async fn read_chunk(vol: &Volume, f: &std::fs::File, off: u64, n: u64) -> Result<u64> {
    if vol.allocation(off, n).iter().all(|a| !a.allocated) {
        return Ok(0);
    }
    let data = vol
        .read(off, n)
        .await
        .with_context(|| format!("cannot read {n} bytes at offset {off} of the volume"))?;
    if data.iter().all(|&b| b == 0) {
        return Ok(0);
    }
    f.write_all_at(&data, off)
        .with_context(|| format!("cannot write {n} bytes at offset {off} of the file"))?;
    Ok(data.len() as u64)
}
