//! `cairn dev supervise` (hidden): runs one daemon of a dev cluster and starts it again when
//! it crashes, as systemd's `Restart=on-failure` does for the units in `deploy/systemd/`.
//!
//! A crash is an end by SIGABRT (a panic: daemons fail stop), SIGSEGV, SIGBUS, SIGILL or
//! SIGFPE. Any other end is left alone: an exit (clean, or an error at start that a restart
//! would only repeat), SIGTERM (`dev down`) and SIGKILL (an operator's or a test's kill -9:
//! the daemon is meant to stay down). After [`CRASH_LIMIT`] crashes within [`CRASH_WINDOW`]
//! the supervisor gives up, like systemd's start limit: a daemon that crashes at every start
//! would otherwise flood its log and crash directory.

use anyhow::{Context, Result};
use clap::Args;
use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Crashes within [`CRASH_WINDOW`] after which the daemon is not started again.
pub(crate) const CRASH_LIMIT: usize = 5;
/// The window of [`CRASH_LIMIT`].
pub(crate) const CRASH_WINDOW: Duration = Duration::from_secs(600);
/// Wait before a restart (systemd's `RestartSec` in the units): lets the peers notice.
const RESTART_DELAY: Duration = Duration::from_secs(1);

#[derive(Args)]
pub struct SuperviseArgs {
    /// The daemon's name (`osd.1`, `mon.0`, `nbd`): its pid goes to RUN_DIR/NAME.pid.
    #[arg(long)]
    name: String,
    /// The cluster's run directory (pid files).
    #[arg(long)]
    run_dir: PathBuf,
    /// The daemon's arguments (`osd run ...`).
    #[arg(last = true, required = true)]
    args: Vec<String>,
}

/// The signals whose end counts as a crash.
fn crashed(status: std::process::ExitStatus) -> Option<i32> {
    status.signal().filter(|s| {
        [
            libc::SIGABRT,
            libc::SIGSEGV,
            libc::SIGBUS,
            libc::SIGILL,
            libc::SIGFPE,
        ]
        .contains(s)
    })
}

pub fn run(a: SuperviseArgs) -> Result<()> {
    let exe = std::env::current_exe().context("cannot find the cairn executable")?;
    let pidfile = a.run_dir.join(format!("{}.pid", a.name));
    std::fs::write(
        a.run_dir.join(format!("{}.sup", a.name)),
        std::process::id().to_string(),
    )
    .context("cannot write the supervisor's pid file")?;
    let mut crashes: Vec<Instant> = Vec::new();
    loop {
        // stdout and stderr are the daemon's log, inherited from this process.
        let mut child = Command::new(&exe)
            .args(&a.args)
            .stdin(Stdio::null())
            .spawn()
            .with_context(|| format!("cannot start {}", a.name))?;
        std::fs::write(&pidfile, child.id().to_string())
            .with_context(|| format!("cannot write {}", pidfile.display()))?;
        let status = child.wait().context("cannot wait for the daemon")?;
        let Some(sig) = crashed(status) else {
            return Ok(());
        };
        crashes.retain(|t| t.elapsed() < CRASH_WINDOW);
        crashes.push(Instant::now());
        if crashes.len() >= CRASH_LIMIT {
            eprintln!(
                "cairn dev supervise: {} crashed (signal {sig}) {} times in {} minutes: not \
                 starting it again. Its crash reports: `cairn crash ls`; start it again with \
                 `cairn dev up`",
                a.name,
                crashes.len(),
                CRASH_WINDOW.as_secs() / 60
            );
            return Ok(());
        }
        eprintln!(
            "cairn dev supervise: {} crashed (signal {sig}, {} of {CRASH_LIMIT} allowed in {} \
             minutes); starting it again in {}s",
            a.name,
            crashes.len(),
            CRASH_WINDOW.as_secs() / 60,
            RESTART_DELAY.as_secs()
        );
        std::thread::sleep(RESTART_DELAY);
    }
}
