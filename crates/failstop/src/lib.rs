//! Failing stop. A bug must stop the process, not leave half-changed state in use:
//!
//! - [`install`] replaces the panic hook of a daemon: the panic is logged (where, what, which
//!   thread, a backtrace) to stderr and written as a [`CrashReport`] to the daemon's crash
//!   directory, then the process aborts. No task or thread goes on beside what the panicking
//!   one tore; a restart replays the WAL, and a restarted OSD reports its recent crashes in its
//!   stats (`cairn status`, `cairn crash ls`).
//! - [`LockOrDie`], [`RwLockOrDie`] and [`CondvarOrDie`] take a lock or wait on a condition
//!   variable and panic if an earlier panic poisoned it, instead of using the state that panic
//!   may have half-changed. In a daemon the earlier panic has already aborted; in a process
//!   without the hook (a test, an embedding program) the panic spreads instead of the damage.

mod crash;
mod locks;

pub use crash::{cut_text, install, name_daemon, pending_reports, CrashReport, CRASH_DIR_ENV};
pub use locks::{CondvarOrDie, LockOrDie, RwLockOrDie};
