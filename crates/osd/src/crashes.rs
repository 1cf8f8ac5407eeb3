//! The OSD's recent crashes: the reports its earlier lives' panics left in its crash
//! directory (`cairn_failstop`), read once at start and reported in its stats.

use cairn_proto::msg::osd::{CrashSummary, MAX_REPORTED_CRASHES, RECENT_CRASH_SECS};
use std::path::Path;

/// Longest panic message reported (a report's message can be long; stats stay small).
const MAX_MESSAGE: usize = 512;

/// The newest crashes in `dir` within [`RECENT_CRASH_SECS`], newest first.
pub fn recent(dir: Option<&Path>) -> Vec<CrashSummary> {
    let Some(dir) = dir else {
        return Vec::new();
    };
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let (reports, bad) = cairn_failstop::pending_reports(dir);
    for b in bad {
        tracing::warn!("skipping an unreadable crash report: {b}");
    }
    let recent: Vec<CrashSummary> = reports
        .into_iter()
        .map(|(_, r)| r)
        .filter(|r| now.saturating_sub(r.time_secs) < RECENT_CRASH_SECS)
        .take(MAX_REPORTED_CRASHES)
        .map(|r| CrashSummary {
            id: r.id,
            time_secs: r.time_secs,
            location: r.location,
            message: cut(r.message),
        })
        .collect();
    if let Some(last) = recent.first() {
        tracing::warn!(
            crashes = recent.len(),
            last = %last.id,
            at = %last.location,
            "this OSD crashed recently: {}",
            last.message
        );
    }
    recent
}

fn cut(mut s: String) -> String {
    cairn_failstop::cut_text(&mut s, MAX_MESSAGE, "...");
    s
}
