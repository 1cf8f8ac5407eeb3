//! Bounds on what connections may hold on a server: how many (in all and per peer host), and
//! how long one may stay idle, with its read buffer released while it waits.

use crate::frames::{frame_buffered_with, read_guarded, ReadError, READ_BUFFER};
use crate::recv::RecvBuf;
use cairn_failstop::LockOrDie;
use cairn_proto::{Frame, Limits};
use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::net::tcp::OwnedReadHalf;

/// A server's connection limits (`cairn osd run` / `cairn mon run` flags).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnLimits {
    /// Most connections held at once (`--max-connections`, default 4096); more are closed
    /// as they are accepted.
    pub max_total: usize,
    /// Most connections from one peer address (`--max-connections-per-host`, default 1024),
    /// so one host cannot take every slot.
    pub max_per_host: usize,
    /// A connection that sends nothing this long is closed (`--idle-timeout`, default 900 s,
    /// as Ceph's `ms_connection_idle_timeout`); clients reconnect when they need to.
    pub idle: Duration,
}

impl Default for ConnLimits {
    fn default() -> Self {
        ConnLimits {
            max_total: 4096,
            max_per_host: 1024,
            idle: Duration::from_secs(900),
        }
    }
}

/// Counts connections against [`ConnLimits`].
#[derive(Debug)]
pub struct Admission {
    limits: ConnLimits,
    state: Mutex<Counts>,
}

#[derive(Debug, Default)]
struct Counts {
    total: usize,
    per_host: HashMap<IpAddr, usize>,
    refused_since_log: u64,
    last_log: Option<Instant>,
}

/// A connection counted by an [`Admission`]; dropping it frees its slot.
#[derive(Debug)]
pub struct Admitted {
    adm: Arc<Admission>,
    host: IpAddr,
}

impl Drop for Admitted {
    fn drop(&mut self) {
        let mut c = self.adm.lock();
        c.total = c.total.saturating_sub(1);
        if let Some(n) = c.per_host.get_mut(&self.host) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                c.per_host.remove(&self.host);
            }
        }
    }
}

/// How often refusals are logged at most (each log line counts those since the last).
const LOG_EVERY: Duration = Duration::from_secs(10);

impl Admission {
    pub fn new(limits: ConnLimits) -> Arc<Admission> {
        Arc::new(Admission {
            limits,
            state: Mutex::default(),
        })
    }

    /// The limits counted against.
    pub fn limits(&self) -> ConnLimits {
        self.limits
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Counts> {
        self.state.lock_or_die()
    }

    /// Connections held now.
    pub fn count(&self) -> usize {
        self.lock().total
    }

    /// Takes a slot for a connection from `host`, or says why there is none (the caller
    /// closes the connection; refusals are logged, at most once per 10 s).
    pub fn admit(self: &Arc<Self>, host: IpAddr) -> Option<Admitted> {
        let mut c = self.lock();
        let from_host = c.per_host.get(&host).copied().unwrap_or(0);
        let why = if c.total >= self.limits.max_total {
            Some(format!("{} connections held (--max-connections)", c.total))
        } else if from_host >= self.limits.max_per_host {
            Some(format!(
                "{from_host} connections from {host} held (--max-connections-per-host)"
            ))
        } else {
            None
        };
        if let Some(why) = why {
            c.refused_since_log += 1;
            if c.last_log.is_none_or(|t| t.elapsed() >= LOG_EVERY) {
                tracing::warn!(refused = c.refused_since_log, %host, "closing new connections: {why}");
                c.refused_since_log = 0;
                c.last_log = Some(Instant::now());
            }
            return None;
        }
        c.total += 1;
        *c.per_host.entry(host).or_default() += 1;
        Some(Admitted {
            adm: self.clone(),
            host,
        })
    }
}

/// How long a connection may be quiet before its read buffer is released (it is taken
/// again when the next request arrives).
const PARK_AFTER: Duration = Duration::from_secs(1);

/// Reads a server connection's frames through a large buffer (many small requests per
/// receive call), releasing the buffer while the peer is quiet and ending the connection
/// after [`ConnLimits::idle`] without a frame: an idle connection costs its socket only.
pub struct ConnReader {
    state: State,
    idle: Duration,
    /// Checks the frames of a protected connection.
    opener: Option<cairn_auth::Opener>,
}

enum State {
    /// Quiet: no buffer held.
    Parked(OwnedReadHalf),
    Active(RecvBuf<OwnedReadHalf>),
    /// Between states (only if a read was cancelled mid-switch).
    Gone,
}

impl ConnReader {
    /// A reader of `r` that gives up after `idle` without a frame.
    pub fn new(r: OwnedReadHalf, idle: Duration) -> ConnReader {
        ConnReader {
            state: State::Parked(r),
            idle,
            opener: None,
        }
    }

    /// The same reader, checking every frame with `opener` (a protected connection).
    pub fn guarded(self, opener: Option<cairn_auth::Opener>) -> ConnReader {
        ConnReader { opener, ..self }
    }

    /// Whether a whole frame is already buffered (reading it will not wait).
    pub fn frame_buffered(&self) -> bool {
        match &self.state {
            State::Active(b) => frame_buffered_with(b.buffer(), self.opener.is_some()),
            _ => false,
        }
    }

    /// The next frame; [`ReadError::Idle`] after the idle limit without one.
    pub async fn next(&mut self, limits: &Limits) -> Result<Frame, ReadError> {
        let quiet = match &self.state {
            State::Active(b) => b.buffer().is_empty(),
            _ => true,
        };
        if quiet {
            self.wait_readable().await?;
        }
        let whole = self.frame_buffered();
        let State::Active(b) = &mut self.state else {
            return Err(ReadError::Closed);
        };
        let opener = self.opener.as_mut();
        if whole {
            return read_guarded(b, limits, opener).await;
        }
        // A peer that starts a frame and trickles the rest gets no longer than idle for it.
        tokio::time::timeout(self.idle, read_guarded(b, limits, opener))
            .await
            .map_err(|_| ReadError::Idle(self.idle))?
    }

    /// Waits until the socket has bytes: a while with the buffer held, then without it.
    async fn wait_readable(&mut self) -> Result<(), ReadError> {
        if let State::Active(b) = &self.state {
            match tokio::time::timeout(PARK_AFTER, b.get_ref().readable()).await {
                Ok(r) => return r.map_err(ReadError::Io),
                Err(_) => {
                    // Quiet for a while: release the buffer (it is empty) while waiting.
                    if let State::Active(b) = std::mem::replace(&mut self.state, State::Gone) {
                        self.state = State::Parked(b.into_inner());
                    }
                }
            }
        }
        let State::Parked(r) = &self.state else {
            return Err(ReadError::Closed);
        };
        let wait = self
            .idle
            .saturating_sub(PARK_AFTER)
            .max(Duration::from_millis(1));
        match tokio::time::timeout(wait, r.readable()).await {
            Ok(res) => res.map_err(ReadError::Io)?,
            Err(_) => return Err(ReadError::Idle(self.idle)),
        }
        if let State::Parked(r) = std::mem::replace(&mut self.state, State::Gone) {
            self.state = State::Active(RecvBuf::with_capacity(READ_BUFFER, r));
        }
        Ok(())
    }
}
