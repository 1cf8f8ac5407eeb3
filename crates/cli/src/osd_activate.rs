//! `cairn osd activate`: starts the OSDs `cairn osd create` prepared on this host (each a
//! directory holding `osd.toml`), in the background, unless they run already: what a host
//! runs at boot when its OSDs are not systemd units.

use crate::osd_create::{OsdToml, OSD_TOML};
use anyhow::{bail, Context, Result};
use clap::Args;
use std::path::{Path, PathBuf};

#[derive(Args)]
pub struct ActivateArgs {
    /// OSD directories to start (each prepared by `cairn osd create`).
    pub dirs: Vec<PathBuf>,
    /// Start every prepared OSD under --root (each subdirectory holding osd.toml).
    #[arg(long)]
    pub all: bool,
    /// Where --all looks.
    #[arg(long, default_value = "/var/lib/cairn")]
    pub root: PathBuf,
}

/// The pid file beside an OSD's data.
const PID_FILE: &str = "osd.pid";
/// Its log.
const LOG_FILE: &str = "osd.log";

pub fn run(a: ActivateArgs, conf: Option<&Path>) -> Result<()> {
    let mut dirs = a.dirs.clone();
    if a.all {
        dirs.extend(prepared_under(&a.root)?);
    }
    if dirs.is_empty() {
        bail!(
            "no OSD to activate: name OSD directories, or --all to start every one prepared \
             under {} (`cairn osd create --dir DIR` prepares one)",
            a.root.display()
        );
    }
    for dir in dirs {
        activate(&dir, conf)?;
    }
    Ok(())
}

/// Subdirectories of `root` holding `osd.toml`, sorted.
fn prepared_under(root: &Path) -> Result<Vec<PathBuf>> {
    let rd = std::fs::read_dir(root).with_context(|| format!("reading {}", root.display()))?;
    let mut out: Vec<PathBuf> = rd
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.join(OSD_TOML).is_file())
        .collect();
    out.sort();
    Ok(out)
}

/// Starts the OSD of `dir` unless its pid file names a running `cairn osd run`.
fn activate(dir: &Path, conf: Option<&Path>) -> Result<()> {
    let Some(t) = OsdToml::load(dir)? else {
        bail!(
            "{} holds no prepared OSD (no {OSD_TOML}): `cairn osd create --dir {}` prepares one",
            dir.display(),
            dir.display()
        );
    };
    let pid_file = dir.join(PID_FILE);
    if let Some(pid) = running(&pid_file) {
        println!(
            "osd.{} ({}): already running, pid {pid}",
            t.id,
            dir.display()
        );
        return Ok(());
    }
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join(LOG_FILE))
        .with_context(|| format!("opening {}", dir.join(LOG_FILE).display()))?;
    let exe = std::env::current_exe().context("finding the cairn binary")?;
    let mut cmd = std::process::Command::new(exe);
    if let Some(c) = conf {
        cmd.arg("-c").arg(c);
    }
    cmd.args(["osd", "run", "--dir"]).arg(dir);
    cmd.stdin(std::process::Stdio::null())
        .stdout(log.try_clone().context("log file")?)
        .stderr(log);
    // Its own session: it outlives this command and the terminal that ran it.
    use std::os::unix::process::CommandExt;
    cmd.process_group(0);
    let child = cmd
        .spawn()
        .with_context(|| format!("starting osd.{} from {}", t.id, dir.display()))?;
    std::fs::write(&pid_file, format!("{}\n", child.id()))
        .with_context(|| format!("writing {}", pid_file.display()))?;
    println!(
        "osd.{} ({}): started, pid {}, log {}",
        t.id,
        dir.display(),
        child.id(),
        dir.join(LOG_FILE).display()
    );
    Ok(())
}

/// The pid in `pid_file` when it is a live `cairn osd run` process.
fn running(pid_file: &Path) -> Option<u32> {
    let pid: u32 = std::fs::read_to_string(pid_file)
        .ok()?
        .trim()
        .parse()
        .ok()?;
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    let is_osd = cmdline.windows(8).any(|w| w == b"osd\0run\0");
    is_osd.then_some(pid)
}
