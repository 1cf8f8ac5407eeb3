//! Logging: tracing with a non-blocking writer, so nothing on an op path waits for a log
//! write (a slow terminal or disk drops lines instead of stalling I/O).

use tracing_subscriber::EnvFilter;

/// Installs the subscriber; keep the guard alive until exit (it flushes buffered lines).
/// Daemons log at `info`, commands at `warn`; `CAIRN_LOG` overrides (e.g. `debug`,
/// `cairn_osd=debug`). One line per event; `CAIRN_LOG_FORMAT=json` makes each line a JSON
/// object (`timestamp`, `level`, `target`, `fields` with `message` and the event's fields),
/// for log collectors.
pub fn init(daemon: bool) -> tracing_appender::non_blocking::WorkerGuard {
    let (writer, guard) = tracing_appender::non_blocking::NonBlockingBuilder::default()
        .lossy(true)
        .finish(std::io::stderr());
    let default = if daemon { "info,openraft=warn" } else { "warn" };
    let filter = EnvFilter::try_from_env("CAIRN_LOG").unwrap_or_else(|_| EnvFilter::new(default));
    let json = std::env::var("CAIRN_LOG_FORMAT").is_ok_and(|f| f == "json");
    let fmt = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(writer)
        .with_ansi(false);
    let _ = if json {
        fmt.json().try_init()
    } else {
        fmt.try_init()
    };
    guard
}
