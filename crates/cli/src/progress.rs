//! Progress of long operations, on stderr.

/// Progress of a long operation on stderr, at most a few lines per second.
pub struct Progress {
    what: &'static str,
    last: Option<std::time::Instant>,
    shown: bool,
}

impl Progress {
    pub fn new(what: &'static str) -> Progress {
        Progress {
            what,
            last: None,
            shown: false,
        }
    }

    pub fn show(&mut self, done: u64, total: u64) {
        let now = std::time::Instant::now();
        let due = self
            .last
            .is_none_or(|t| now.duration_since(t).as_millis() >= 250);
        if total == 0 || !(due || done == total) {
            return;
        }
        self.last = Some(now);
        self.shown = true;
        eprint!("\r{}: {done}/{total} ({}%)", self.what, done * 100 / total);
    }

    pub fn finish(&self) {
        if self.shown {
            eprintln!();
        }
    }
}
