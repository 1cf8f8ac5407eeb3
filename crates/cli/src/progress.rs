//! Progress of long operations, on stderr: a bar redrawn in place on a terminal, plain lines
//! otherwise (a log or a pipe gets one line every few seconds, not carriage returns).

use std::io::IsTerminal;
use std::time::{Duration, Instant};

/// How often a terminal's bar is redrawn, and how often a plain line is written.
const TERMINAL_EVERY: Duration = Duration::from_millis(250);
const LINE_EVERY: Duration = Duration::from_secs(5);
/// Width of the bar, in characters.
const BAR: usize = 30;

/// Progress of one operation.
pub struct Progress {
    what: &'static str,
    started: Instant,
    last: Option<Instant>,
    shown: bool,
    terminal: bool,
}

impl Progress {
    pub fn new(what: &'static str) -> Progress {
        Progress {
            what,
            started: Instant::now(),
            last: None,
            shown: false,
            terminal: std::io::stderr().is_terminal(),
        }
    }

    /// Shows `done` of `total` (at most a few times a second; always the end).
    pub fn show(&mut self, done: u64, total: u64) {
        let now = Instant::now();
        let every = if self.terminal {
            TERMINAL_EVERY
        } else {
            LINE_EVERY
        };
        let due = self.last.is_none_or(|t| now.duration_since(t) >= every);
        if total == 0 || !(due || done == total) {
            return;
        }
        self.last = Some(now);
        self.shown = true;
        let line = render(self.what, done, total, self.started.elapsed());
        if self.terminal {
            eprint!("\r{line}\x1b[K");
        } else {
            eprintln!("{line}");
        }
    }

    pub fn finish(&self) {
        if self.shown && self.terminal {
            eprintln!();
        }
    }
}

/// `what [#####.....] 45% 123/456, 12 s left`.
fn render(what: &str, done: u64, total: u64, elapsed: Duration) -> String {
    let done = done.min(total);
    let filled = (done as usize * BAR) / total.max(1) as usize;
    let bar: String = "#".repeat(filled) + &".".repeat(BAR - filled);
    let pct = done * 100 / total.max(1);
    let left = if done > 0 && done < total {
        let secs = elapsed.as_secs_f64() * (total - done) as f64 / done as f64;
        format!(", about {} s left", secs.ceil() as u64)
    } else {
        String::new()
    };
    format!("{what} [{bar}] {pct}% {done}/{total}{left}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bar_shows_the_share_done_and_the_time_left() {
        let half = render("copying", 50, 100, Duration::from_secs(10));
        assert_eq!(
            half,
            "copying [###############...............] 50% 50/100, about 10 s left"
        );
        let all = render("copying", 100, 100, Duration::from_secs(10));
        assert!(all.ends_with("100% 100/100"), "{all}");
        assert!(render("x", 0, 0, Duration::ZERO).contains("0/0"));
    }
}
