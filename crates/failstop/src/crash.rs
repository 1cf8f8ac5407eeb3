//! The panic hook of a daemon and the crash reports it leaves behind.

use serde::{Deserialize, Serialize};
use std::panic::PanicHookInfo;
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

/// The environment variable that names a daemon's crash directory (`cairn dev up` and the
/// systemd units set it); without it a daemon uses its default (`<data dir>/crash` for OSDs
/// and monitors) or writes no report file.
pub const CRASH_DIR_ENV: &str = "CAIRN_CRASH_DIR";

/// Largest backtrace kept in a report (a deep async stack prints hundreds of frames).
const MAX_BACKTRACE: usize = 16 << 10;
/// Largest report file read back (a report is a few KiB; anything larger is not ours).
const MAX_REPORT_FILE: u64 = 64 << 10;
/// Reports read back at one start, newest first: a crash loop leaves many, the newest say
/// enough.
const MAX_PENDING: usize = 32;
/// Reports kept in a crash directory: saving one more removes the oldest (a daemon that
/// crashes in a loop under a supervisor without a limit must not fill the disk).
const KEEP_REPORTS: usize = 64;

/// One crash: which daemon panicked, when, where and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CrashReport {
    /// `<UTC time>_<entity>_<pid>`, unique per crash.
    pub id: String,
    /// The daemon (`osd.3`, `mon.1`, `client.nbd`).
    pub entity: String,
    /// Seconds since the Unix epoch.
    pub time_secs: u64,
    /// The cairn version that crashed.
    pub version: String,
    /// The panicking thread's name.
    pub thread: String,
    /// `file:line:column` of the panic.
    pub location: String,
    /// The panic's message.
    pub message: String,
    /// The backtrace, cut at 16 KiB.
    pub backtrace: String,
}

impl CrashReport {
    fn of_panic(entity: &str, info: &PanicHookInfo<'_>) -> CrashReport {
        let time_secs = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let message = info
            .payload()
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| info.payload().downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "(a panic without a message)".into());
        let location = info
            .location()
            .map_or_else(|| "(unknown)".into(), |l| l.to_string());
        let thread = std::thread::current()
            .name()
            .unwrap_or("(unnamed)")
            .to_string();
        let mut backtrace = std::backtrace::Backtrace::force_capture().to_string();
        cut_text(&mut backtrace, MAX_BACKTRACE, "\n(cut)");
        CrashReport {
            id: format!(
                "{}_{}_{}",
                utc_compact(time_secs),
                entity,
                std::process::id()
            ),
            entity: entity.to_string(),
            time_secs,
            version: env!("CARGO_PKG_VERSION").to_string(),
            thread,
            location,
            message,
            backtrace,
        }
    }

    /// Writes the report as `<dir>/<id>.json`, durably (written, synced, then renamed).
    fn save(&self, dir: &Path) -> std::io::Result<PathBuf> {
        std::fs::create_dir_all(dir)?;
        let path = dir.join(format!("{}.json", self.id));
        let tmp = dir.join(format!("{}.json.tmp", self.id));
        let body = serde_json::to_vec_pretty(self).map_err(std::io::Error::other)?;
        {
            use std::io::Write;
            let mut f = std::fs::File::create(&tmp)?;
            f.write_all(&body)?;
            f.sync_all()?;
        }
        std::fs::rename(&tmp, &path)?;
        prune(dir);
        Ok(path)
    }
}

/// Removes the oldest reports of `dir` beyond [`KEEP_REPORTS`] (ids start with the UTC time,
/// so names sort by age).
fn prune(dir: &Path) {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return;
    };
    let mut reports: Vec<PathBuf> = rd
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    if reports.len() > KEEP_REPORTS {
        reports.sort();
        for p in &reports[..reports.len() - KEEP_REPORTS] {
            let _ = std::fs::remove_file(p);
        }
    }
}

/// Makes every panic of this process fatal: logs it to stderr (where the daemon's log goes),
/// writes a [`CrashReport`] into `crash_dir` when there is one, and aborts. A daemon calls
/// this first thing; its supervisor (systemd, `cairn dev up`) restarts it, the restart
/// replays the WAL, and an OSD reports it in its stats from then on (`cairn crash ls`).
pub fn install(entity: &str, crash_dir: Option<PathBuf>) {
    let hint = entity.to_string();
    std::panic::set_hook(Box::new(move |info| {
        // One panic at a time: a second thread panicking meanwhile waits here until the first
        // aborts the process. Two at once would write the same report file (same id), the
        // second truncating what the first had just renamed into place.
        let _only = ONE_PANIC
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let entity = NAME.get().unwrap_or(&hint);
        let r = CrashReport::of_panic(entity, info);
        // stderr, unbuffered and synchronous: the daemon's non-blocking log writer would
        // lose lines still queued when the process aborts.
        eprintln!(
            "{} ERROR cairn: {} panicked in thread '{}' at {}: {}; aborting, so that no \
             other thread goes on beside state the panic may have torn (a restart replays \
             the WAL)\n{}",
            utc_compact(r.time_secs),
            r.entity,
            r.thread,
            r.location,
            r.message,
            r.backtrace
        );
        if let Some(dir) = &crash_dir {
            match r.save(dir) {
                Ok(p) => eprintln!("crash report written to {}", p.display()),
                Err(e) => eprintln!(
                    "cannot write the crash report into {}: {e} (the log above is all there is)",
                    dir.display()
                ),
            }
        }
        std::process::abort();
    }));
}

/// Held by the panic hook from the first panic until the process aborts.
static ONE_PANIC: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// The daemon's entity once it is known (an OSD learns its id from its keyring after the
/// hook is installed): crash reports name it instead of the hint given to [`install`].
static NAME: std::sync::OnceLock<String> = std::sync::OnceLock::new();

/// Names the daemon in its crash reports from now on (the first name given stays).
pub fn name_daemon(entity: &str) {
    let _ = NAME.set(entity.to_string());
}

/// The reports in `dir` (`*.json`: an operator renames one to archive it), newest first (at most 32), with
/// their paths; files that do not parse are skipped and named in the second list.
pub fn pending_reports(dir: &Path) -> (Vec<(PathBuf, CrashReport)>, Vec<String>) {
    let mut found = Vec::new();
    let mut bad = Vec::new();
    let Ok(rd) = std::fs::read_dir(dir) else {
        return (found, bad);
    };
    let mut paths: Vec<PathBuf> = rd
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    // Ids start with the UTC time, so names sort by age.
    paths.sort();
    paths.reverse();
    for p in paths.into_iter().take(MAX_PENDING) {
        match read_report(&p) {
            Ok(r) => found.push((p, r)),
            Err(e) => bad.push(format!("{}: {e}", p.display())),
        }
    }
    (found, bad)
}

fn read_report(p: &Path) -> std::io::Result<CrashReport> {
    let len = std::fs::metadata(p)?.len();
    if len > MAX_REPORT_FILE {
        return Err(std::io::Error::other(format!(
            "{len} bytes, more than a crash report's {MAX_REPORT_FILE}"
        )));
    }
    let body = std::fs::read(p)?;
    serde_json::from_slice(&body).map_err(std::io::Error::other)
}

/// Cuts `s` to at most `max` bytes (at a character boundary) and appends `mark` if it was
/// longer: reports and stats carry text of bounded size.
pub fn cut_text(s: &mut String, max: usize, mark: &str) {
    if s.len() <= max {
        return;
    }
    let mut at = max;
    while !s.is_char_boundary(at) {
        at -= 1;
    }
    s.truncate(at);
    s.push_str(mark);
}

/// `YYYYmmddTHHMMSSZ` for seconds since the epoch (UTC, proleptic Gregorian).
fn utc_compact(secs: u64) -> String {
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    // Howard Hinnant's days-to-civil.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}{m:02}{d:02}T{:02}{:02}{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn utc_times_are_calendar_dates() {
        assert_eq!(utc_compact(0), "19700101T000000Z");
        // 2026-12-02 02:30:05 UTC.
        assert_eq!(utc_compact(1_796_178_605), "20261202T023005Z");
        // A leap day.
        assert_eq!(utc_compact(951_782_400), "20000229T000000Z");
    }

    fn report(id: &str) -> CrashReport {
        CrashReport {
            id: id.into(),
            entity: "osd.1".into(),
            time_secs: 1,
            version: "0.1.0".into(),
            thread: "shard-0".into(),
            location: "src/x.rs:1:2".into(),
            message: "boom".into(),
            backtrace: String::new(),
        }
    }

    #[test]
    fn saved_reports_are_pending_newest_first_until_archived_and_junk_is_named() {
        let dir = std::env::temp_dir().join(format!("failstop-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        report("20260101T000000Z_osd.1_7").save(&dir).unwrap();
        let newer = report("20260102T000000Z_osd.1_8");
        newer.save(&dir).unwrap();
        std::fs::write(dir.join("junk.json"), b"{not json").unwrap();
        let (found, bad) = pending_reports(&dir);
        let ids: Vec<&str> = found.iter().map(|(_, r)| r.id.as_str()).collect();
        assert_eq!(
            ids,
            ["20260102T000000Z_osd.1_8", "20260101T000000Z_osd.1_7"]
        );
        assert_eq!(found[0].1, newer);
        assert_eq!(bad.len(), 1, "{bad:?}");
        // Renamed (archived by an operator), a report is no longer pending.
        let mut archived = found[0].0.as_os_str().to_owned();
        archived.push(".archived");
        std::fs::rename(&found[0].0, &archived).unwrap();
        let (found, _) = pending_reports(&dir);
        assert_eq!(found.len(), 1);
        assert_eq!(found[0].1.id, "20260101T000000Z_osd.1_7");
        let _ = std::fs::remove_dir_all(&dir);
    }
}

#[cfg(test)]
mod prune_tests {
    use super::*;

    #[test]
    fn a_crash_directory_keeps_the_newest_reports_only() {
        let dir = std::env::temp_dir().join(format!("failstop-prune-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        for i in 0..KEEP_REPORTS + 3 {
            std::fs::write(dir.join(format!("2026{i:06}_osd.1_1.json")), b"{}").unwrap();
        }
        prune(&dir);
        let mut left: Vec<String> = std::fs::read_dir(&dir)
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        left.sort();
        assert_eq!(left.len(), KEEP_REPORTS);
        assert_eq!(left[0], "2026000003_osd.1_1.json", "the oldest went first");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
