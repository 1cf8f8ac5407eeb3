//! Crashes: which commands are daemons that fail stop (a panic aborts them after a crash
//! report, `cairn_failstop`), and where their reports go.

use crate::{mon_cmd::MonCmd, nbd_cmd::NbdCmd, osd_cmd::OsdCmd, store_cmd::StoreCmd, Cmd};
use cairn_failstop::CRASH_DIR_ENV;
use std::path::PathBuf;

/// The daemon `cmd` runs, if it is one: the name its crash reports carry until it knows its
/// entity, and its crash directory (`CAIRN_CRASH_DIR`, else `DIR/crash` for OSDs and
/// monitors; the NBD server and the dashboard have no directory of their own and then only
/// log their panic).
pub(crate) fn daemon_of(cmd: &Cmd) -> Option<(String, Option<PathBuf>)> {
    let env_dir = std::env::var_os(CRASH_DIR_ENV).map(PathBuf::from);
    Some(match cmd {
        Cmd::Osd(OsdCmd::Run(a)) => (
            format!("osd ({})", a.dir.display()),
            env_dir.or_else(|| Some(a.dir.join("crash"))),
        ),
        Cmd::Mon(MonCmd::Run(a)) => (
            a.id.map_or_else(
                || format!("mon ({})", a.dir.display()),
                |id| format!("mon.{id}"),
            ),
            env_dir.or_else(|| Some(a.dir.join("crash"))),
        ),
        Cmd::Nbd(NbdCmd::Serve(a)) => (format!("nbd-server@{}", a.listen), env_dir),
        Cmd::Dashboard(_) => ("dashboard".to_string(), env_dir),
        // The store under an OSD's load, for the crash tests: it fails stop like an OSD.
        Cmd::Store(StoreCmd::Torture(_)) => ("store-torture".to_string(), env_dir),
        _ => return None,
    })
}
