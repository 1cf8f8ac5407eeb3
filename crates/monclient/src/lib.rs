//! cairn-monclient: talks to the Cairn monitors for OSDs, clients and the CLI.
//!
//! A [`MonClient`] knows the monitors' addresses and keeps one connection, to the leader
//! once it has been found, shared by all calls (many may be in flight). Every call has a
//! deadline ([`MonClient::with_timeout`], 10 s by default) within which it follows the
//! monitors' "ask the leader" hints, tries the other monitors when one is unreachable, and
//! backs off while the monitors elect a leader. [`MonClient::follow`] keeps a map current in
//! the background.
//!
//! Retries can repeat a command: a command whose reply was lost (connection failure, or an
//! `Unavailable` reply after which the change still commits) may be applied and then refused
//! on retry (e.g. `PoolExists`). Commands that may be retried should be checked against the
//! map by the caller when the result matters.

#![warn(missing_docs)]

pub mod auth;
mod conn;
mod error;
mod follow;

use cairn_failstop::{LockOrDie, RwLockOrDie};
pub use error::{MonClientError, Unavailability};

use cairn_map::{ChangeOutcome, ClusterMap, MapChange};
use cairn_proto::msg::mon::{
    CommandReply, FailureReport, GetMap, Heartbeat, MapUpdate, MembersReply, MembersRequest,
    MonStatus, PastIntervalsQuery, COMMAND, COMMAND_REPLY, FAILURE_REPORT, GET_MAP, HEARTBEAT, MAP,
    MEMBERS_COMMAND, MEMBERS_REPLY, MON_STATUS, MON_STATUS_REPLY, PAST_INTERVALS,
    PAST_INTERVALS_REPLY,
};
pub use cairn_proto::msg::mon::{PastIntervalsReply, PgStarted};
use cairn_proto::msg::{decode, encode};
use cairn_proto::Frame;
use cairn_transport::{CallError, Session};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::watch;
use tokio::time::Instant;

/// Default deadline of one call.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);
/// Longest wait for one connection attempt (then the next monitor is tried).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
const FIRST_BACKOFF: Duration = Duration::from_millis(20);
/// How long one heartbeat waits for the monitors: a fraction of their grace (4 s by default),
/// so that a heartbeat sent to a monitor whose host vanished is retried on another in time.
const HEARTBEAT_TIMEOUT: Duration = Duration::from_millis(1500);
const MAX_BACKOFF: Duration = Duration::from_millis(500);

/// A client of the monitor cluster. Cheap to clone; clones share the connection.
#[derive(Clone)]
pub struct MonClient {
    inner: Arc<Inner>,
}

/// The monitor addresses a client knows: those it was given, and those it learned from the
/// monitors since (`MonClient::learn_monitors`), shared with its map follower.
#[derive(Clone, Default)]
pub(crate) struct Addrs(Arc<std::sync::RwLock<Vec<String>>>);

/// How often long-lived clients and OSDs ask the monitors who they are
/// ([`MonClient::keep_learning_monitors`]).
pub const LEARN_MONITORS_EVERY: Duration = Duration::from_secs(30);

/// Most monitor addresses a client keeps (given and learned).
pub const MAX_KNOWN_MONITORS: usize = 16;

impl Addrs {
    fn new(v: Vec<String>) -> Addrs {
        Addrs(Arc::new(std::sync::RwLock::new(v)))
    }

    pub(crate) fn get(&self) -> Vec<String> {
        self.0.read_or_die().clone()
    }

    /// Adds the addresses not known yet (up to [`MAX_KNOWN_MONITORS`]); true if any was new.
    fn learn<'a>(&self, addrs: impl Iterator<Item = &'a str>) -> bool {
        let mut known = self.0.write_or_die();
        let mut added = false;
        for a in addrs {
            if known.len() < MAX_KNOWN_MONITORS && !known.iter().any(|k| k == a) {
                known.push(a.to_string());
                added = true;
            }
        }
        added
    }
}

struct Inner {
    addrs: Addrs,
    timeout: Duration,
    /// Local address to connect from.
    from: conn::Source,
    /// The connection calls use (to the leader once known). Locked while connecting so that
    /// concurrent calls share one new connection.
    cur: tokio::sync::Mutex<Option<Arc<Session>>>,
    /// Where the monitors said the leader is.
    hint: Mutex<Option<String>>,
    /// Index in `addrs` to try first.
    next: AtomicUsize,
}

/// What a reply means for the retry loop.
enum Step<T> {
    Done(T),
    /// Ask the leader instead (`None`: the monitor knows no leader).
    Redirect(Option<String>),
    /// Answered but could not do it now.
    Retry(Unavailability),
    Fail(MonClientError),
}

fn protocol(e: impl std::fmt::Display) -> MonClientError {
    MonClientError::Protocol(e.to_string())
}

fn expect(f: &Frame, msg_type: u16, what: &str) -> Result<(), MonClientError> {
    if f.msg_type == msg_type {
        return Ok(());
    }
    Err(MonClientError::Protocol(format!(
        "expected a {what} reply, got message type {}",
        f.msg_type
    )))
}

/// Turns a heartbeat reply into a step: the leader's grace when accepted.
fn heartbeat_step(f: Frame) -> Step<Duration> {
    if let Err(e) = expect(&f, COMMAND_REPLY, "heartbeat") {
        return Step::Fail(e);
    }
    match decode::<CommandReply>("heartbeat reply", &f.control) {
        Err(e) => Step::Fail(protocol(e)),
        Ok(CommandReply::Alive { grace_ms }) => Step::Done(Duration::from_millis(grace_ms)),
        Ok(CommandReply::Done(_)) => Step::Fail(protocol("a command answer to a heartbeat")),
        Ok(CommandReply::Refused(e)) => Step::Fail(MonClientError::Refused(e)),
        Ok(CommandReply::NotLeader { leader }) => Step::Redirect(leader),
        Ok(CommandReply::Unavailable(why)) => Step::Retry(why.into()),
    }
}

/// Turns a command reply into a step.
fn command_step(f: Frame) -> Step<ChangeOutcome> {
    if let Err(e) = expect(&f, COMMAND_REPLY, "command") {
        return Step::Fail(e);
    }
    match decode::<CommandReply>("command reply", &f.control) {
        Err(e) => Step::Fail(protocol(e)),
        Ok(CommandReply::Done(o)) => Step::Done(o),
        Ok(CommandReply::Refused(e)) => Step::Fail(MonClientError::Refused(e)),
        Ok(CommandReply::NotLeader { leader }) => Step::Redirect(leader),
        Ok(CommandReply::Unavailable(why)) => Step::Retry(why.into()),
        Ok(CommandReply::Alive { .. }) => Step::Fail(protocol("a heartbeat answer to a command")),
    }
}

impl MonClient {
    /// A client of the monitors at `addrs` (`ip:port`). No I/O happens until the first call.
    pub fn new(addrs: Vec<String>) -> MonClient {
        let from = conn::Source {
            from: None,
            auth: Arc::new(cairn_transport::NoAuth),
            frames: cairn_transport::FrameMode::Plain,
        };
        MonClient::build(Addrs::new(addrs), DEFAULT_TIMEOUT, from)
    }

    fn build(addrs: Addrs, timeout: Duration, from: conn::Source) -> MonClient {
        MonClient {
            inner: Arc::new(Inner {
                addrs,
                timeout,
                from,
                cur: tokio::sync::Mutex::new(None),
                hint: Mutex::new(None),
                next: AtomicUsize::new(0),
            }),
        }
    }

    /// The same client with another deadline per call (the connection is not shared with
    /// `self`).
    pub fn with_timeout(self, d: Duration) -> MonClient {
        MonClient::build(self.inner.addrs.clone(), d, self.inner.from.clone())
    }

    /// The same client connecting from local address `from` (a daemon listening on one
    /// address of its host sends from it too).
    pub fn with_source(self, from: Option<std::net::IpAddr>) -> MonClient {
        let from = conn::Source {
            from,
            ..self.inner.from.clone()
        };
        MonClient::build(self.inner.addrs.clone(), self.inner.timeout, from)
    }

    /// The same client authenticating with `auth` (its own key, for monitors).
    pub fn with_auth(self, auth: cairn_transport::Auth) -> MonClient {
        let from = conn::Source {
            auth,
            ..self.inner.from.clone()
        };
        MonClient::build(self.inner.addrs.clone(), self.inner.timeout, from)
    }

    /// The same client asking for frame protection `frames` at least on its connections.
    pub fn with_frames(self, frames: cairn_transport::FrameMode) -> MonClient {
        let from = conn::Source {
            frames,
            ..self.inner.from.clone()
        };
        MonClient::build(self.inner.addrs.clone(), self.inner.timeout, from)
    }

    /// The monitor addresses this client uses.
    /// The monitor addresses this client knows (given, then learned).
    pub fn addrs(&self) -> Vec<String> {
        self.inner.addrs.get()
    }

    /// Asks the monitors who they are and adds the members this client did not know, so that
    /// it reaches the cluster after monitors were added and the ones it was given removed.
    /// Returns how many monitors it knows.
    pub async fn learn_monitors(&self) -> Result<usize, MonClientError> {
        let st = self.status().await?;
        if self
            .inner
            .addrs
            .learn(st.members.iter().map(|(_, a)| a.as_str()))
        {
            tracing::info!(monitors = ?self.addrs(), "learned monitors from the cluster");
        }
        Ok(self.inner.addrs.get().len())
    }

    /// Calls [`MonClient::learn_monitors`] every `every` until the returned task is aborted
    /// (errors are logged at debug level: the next round tries again).
    pub fn keep_learning_monitors(&self, every: Duration) -> tokio::task::JoinHandle<()> {
        let mon = self.clone();
        tokio::spawn(async move {
            loop {
                if let Err(e) = mon.learn_monitors().await {
                    tracing::debug!(error = %e, "cannot learn the monitors now");
                }
                tokio::time::sleep(every).await;
            }
        })
    }

    /// The current map, from any monitor (it may lag the leader by a moment).
    pub async fn get_map(&self) -> Result<ClusterMap, MonClientError> {
        let req = encode(&GetMap { have: 0 });
        self.call(GET_MAP, req, self.deadline(), |f| {
            if let Err(e) = expect(&f, MAP, "map") {
                return Step::Fail(e);
            }
            match decode::<MapUpdate>("map", &f.control) {
                Ok(MapUpdate::Full(m)) => Step::Done(m),
                Ok(MapUpdate::Incrementals(_)) => {
                    Step::Fail(protocol("incrementals sent to a client that has no map"))
                }
                Err(e) => Step::Fail(protocol(e)),
            }
        })
        .await
    }

    /// Applies a change through the leader, once it is committed. A refused change is
    /// [`MonClientError::Refused`].
    pub async fn command(&self, change: MapChange) -> Result<ChangeOutcome, MonClientError> {
        self.call(COMMAND, encode(&change), self.deadline(), command_step)
            .await
    }

    /// Tells the leader OSD `osd` (in its life that began at epoch `up_from`) is alive;
    /// returns the leader's grace (how long it waits for the next heartbeat).
    /// `pgs` are the PGs it leads with the epoch each last went active.
    pub async fn heartbeat(
        &self,
        osd: u32,
        up_from: u64,
        pgs: Vec<PgStarted>,
    ) -> Result<Duration, MonClientError> {
        let req = encode(&Heartbeat { osd, up_from, pgs });
        // Short: a heartbeat stuck on a silent monitor must fail over well within the grace.
        let deadline = Instant::now() + self.inner.timeout.min(HEARTBEAT_TIMEOUT);
        self.call(HEARTBEAT, req, deadline, heartbeat_step).await
    }

    /// Tells the leader that OSD `reporter` (life `reporter_life`) cannot reach OSD `target`
    /// (life `target_life`).
    pub async fn report_failure(
        &self,
        reporter: (u32, u64),
        target: (u32, u64),
    ) -> Result<(), MonClientError> {
        let req = encode(&FailureReport {
            reporter: reporter.0,
            reporter_life: reporter.1,
            target: target.0,
            target_life: target.1,
        });
        self.call(FAILURE_REPORT, req, self.deadline(), command_step)
            .await
            .map(|_| ())
    }

    /// The past intervals of `pg` from epoch `since` to `until`, from any monitor whose map
    /// has reached `until`: `(from, intervals)`, `from` being `since` or the oldest epoch the
    /// monitors still keep.
    pub async fn past_intervals(
        &self,
        pg: cairn_map::PgId,
        since: u64,
        until: u64,
    ) -> Result<(u64, Vec<cairn_map::PastInterval>), MonClientError> {
        let req = encode(&PastIntervalsQuery {
            pool: pg.pool,
            pg: pg.pg,
            since,
            until,
        });
        self.call(PAST_INTERVALS, req, self.deadline(), |f| {
            if let Err(e) = expect(&f, PAST_INTERVALS_REPLY, "past intervals") {
                return Step::Fail(e);
            }
            match decode::<PastIntervalsReply>("past intervals", &f.control) {
                Ok(PastIntervalsReply::Intervals { from, intervals }) => {
                    Step::Done((from, intervals))
                }
                Ok(PastIntervalsReply::Behind { epoch }) => {
                    Step::Retry(Unavailability::MapBehind { epoch, until })
                }
                Ok(PastIntervalsReply::Failed(e)) => Step::Fail(MonClientError::Protocol(format!(
                    "the map history does not replay: {e}"
                ))),
                Err(e) => Step::Fail(protocol(e)),
            }
        })
        .await
    }

    /// The monitor cluster's status, from the leader when it can be reached, else from the
    /// monitor that answered.
    pub async fn status(&self) -> Result<MonStatus, MonClientError> {
        let deadline = self.deadline();
        let first = self.status_until(deadline).await?;
        let Some(leader_addr) = first.leader_addr.clone() else {
            return Ok(first);
        };
        if first.leader == Some(first.id) {
            return Ok(first);
        }
        self.set_hint(leader_addr);
        self.forget_current(false).await;
        // Half the time left: a leader that cannot be reached should not cost the whole call.
        let left = deadline.saturating_duration_since(Instant::now());
        let second = self.status_until(Instant::now() + left / 2).await;
        Ok(second.unwrap_or(first))
    }

    /// Adds or removes a monitor (needs `mon x`); returns the members afterwards. An add
    /// waits for the new monitor to catch up (a minute at most).
    pub async fn change_members(
        &self,
        req: MembersRequest,
    ) -> Result<Vec<(u64, String)>, MonClientError> {
        let deadline = Instant::now() + self.inner.timeout + Duration::from_secs(90);
        self.call(MEMBERS_COMMAND, encode(&req), deadline, |f| {
            if let Err(e) = expect(&f, MEMBERS_REPLY, "members") {
                return Step::Fail(e);
            }
            match decode::<MembersReply>("members reply", &f.control) {
                Err(e) => Step::Fail(protocol(e)),
                Ok(MembersReply::Done { members }) => Step::Done(members),
                Ok(MembersReply::NotLeader { leader }) => Step::Redirect(leader),
                Ok(MembersReply::Refused(why)) => Step::Fail(MonClientError::MembersRefused(why)),
                Ok(MembersReply::Unavailable(why)) => {
                    Step::Fail(MonClientError::MembersUnavailable(why))
                }
            }
        })
        .await
    }

    async fn status_until(&self, deadline: Instant) -> Result<MonStatus, MonClientError> {
        self.call(MON_STATUS, Vec::new(), deadline, |f| {
            if let Err(e) = expect(&f, MON_STATUS_REPLY, "status") {
                return Step::Fail(e);
            }
            match decode::<MonStatus>("status", &f.control) {
                Ok(s) => Step::Done(s),
                Err(e) => Step::Fail(protocol(e)),
            }
        })
        .await
    }

    /// Follows the map: spawns a task (on the current tokio runtime) that subscribes to a
    /// monitor, applies every update and publishes each new map on the returned channel,
    /// moving to another monitor whenever the subscription fails, until every receiver is
    /// dropped. After an update that does not apply (a gap) it fetches the full map again.
    ///
    /// The channel starts with `initial`, or when that is `None`, with an empty placeholder
    /// map at epoch 0 (no real map has epoch 0): wait for the first real map with
    /// `rx.wait_for(|m| m.epoch > 0)`, or use [`MonClient::follow_ready`].
    pub fn follow(&self, initial: Option<ClusterMap>) -> watch::Receiver<Arc<ClusterMap>> {
        let (tx, rx) = watch::channel(Arc::new(initial.unwrap_or_else(follow::placeholder)));
        tokio::spawn(follow::follow(
            self.inner.addrs.clone(),
            self.inner.from.clone(),
            tx,
        ));
        rx
    }

    /// [`MonClient::follow`], returning once the first map is known (within the deadline).
    pub async fn follow_ready(
        &self,
        initial: Option<ClusterMap>,
    ) -> Result<watch::Receiver<Arc<ClusterMap>>, MonClientError> {
        let mut rx = self.follow(initial);
        let ready = tokio::time::timeout(self.inner.timeout, rx.wait_for(|m| m.epoch > 0))
            .await
            .map(|r| r.is_ok());
        match ready {
            Ok(true) => Ok(rx),
            Ok(false) => Err(MonClientError::Protocol("map follower stopped".into())),
            Err(_) => Err(MonClientError::Unreachable {
                addrs: self.inner.addrs.get(),
                last_error: "no map received".into(),
            }),
        }
    }

    fn deadline(&self) -> Instant {
        Instant::now() + self.inner.timeout
    }

    fn set_hint(&self, addr: String) {
        *self.inner.hint.lock_or_die() = Some(addr);
    }

    /// The live connection, or a new one: to the hinted leader first, then to each monitor
    /// in turn starting after the last one that failed.
    /// `Err((why, refused))`: `refused` when a monitor refused our credentials, which no
    /// retry with the same ones can change.
    async fn conn(&self, deadline: Instant) -> Result<Arc<Session>, (String, bool)> {
        let mut cur = self.inner.cur.lock().await;
        if let Some(c) = cur.as_ref().filter(|c| c.is_open()) {
            return Ok(c.clone());
        }
        *cur = None;
        let hint = self.inner.hint.lock_or_die().take();
        let addrs = self.inner.addrs.get();
        let start = self.inner.next.load(Ordering::Relaxed);
        let order = (0..addrs.len()).map(|i| &addrs[(start + i) % addrs.len()]);
        let mut last = "no monitor addresses given".to_string();
        for addr in hint.iter().chain(order) {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            match conn::open(addr, left.min(CONNECT_TIMEOUT), &self.inner.from).await {
                Ok(c) => {
                    let c = Arc::new(c);
                    *cur = Some(c.clone());
                    return Ok(c);
                }
                Err(e) if e.is_refusal() => return Err((e.to_string(), true)),
                Err(e) => last = e.to_string(),
            }
        }
        Err((last, false))
    }

    /// Stops using the current connection; with `rotate`, the next connection goes to the
    /// monitor after it.
    async fn forget_current(&self, rotate: bool) {
        let mut cur = self.inner.cur.lock().await;
        if let (true, Some(c)) = (rotate, cur.as_ref()) {
            if let Some(i) = self.inner.addrs.get().iter().position(|a| a == c.addr()) {
                self.inner.next.store(i + 1, Ordering::Relaxed);
            }
        }
        *cur = None;
    }

    async fn forget(&self, conn: &Arc<Session>, rotate: bool) {
        let is_cur = {
            let cur = self.inner.cur.lock().await;
            cur.as_ref().is_some_and(|c| Arc::ptr_eq(c, conn))
        };
        if is_cur {
            self.forget_current(rotate).await;
        }
    }

    /// Sends a request until `handle` says it is done or failed, or the deadline passes.
    async fn call<T>(
        &self,
        msg_type: u16,
        control: Vec<u8>,
        deadline: Instant,
        mut handle: impl FnMut(Frame) -> Step<T>,
    ) -> Result<T, MonClientError> {
        let mut backoff = FIRST_BACKOFF;
        let mut connected = false;
        let mut last_error = String::new();
        let mut unavailable: Option<Unavailability> = None;
        let mut redirects = 0u32;
        loop {
            if Instant::now() >= deadline {
                break;
            }
            let conn = match self.conn(deadline).await {
                Ok(c) => c,
                Err((why, true)) => return Err(MonClientError::Denied(why)),
                Err((e, false)) => {
                    last_error = e;
                    sleep_until(backoff, deadline).await;
                    backoff = (backoff * 2).min(MAX_BACKOFF);
                    continue;
                }
            };
            connected = true;
            let left = deadline.saturating_duration_since(Instant::now());
            let f = match conn.call(msg_type, &control, &[], left).await {
                Ok(f) => f,
                Err(CallError::Timeout { .. }) => {
                    // A monitor whose host vanished (no RST) leaves the connection open but
                    // silent: the next call must not wait on it again.
                    self.forget(&conn, true).await;
                    break;
                }
                Err(CallError::Refused { code, message, .. }) => {
                    self.forget(&conn, false).await;
                    return Err(MonClientError::Protocol(format!(
                        "{} rejected the request ({code}): {message}",
                        conn.addr()
                    )));
                }
                Err(e) => {
                    last_error = e.to_string();
                    self.forget(&conn, true).await;
                    sleep_until(FIRST_BACKOFF, deadline).await;
                    continue;
                }
            };
            match handle(f) {
                Step::Done(v) => return Ok(v),
                Step::Fail(e) => return Err(e),
                Step::Redirect(Some(addr)) if addr != conn.addr() => {
                    tracing::debug!(from = %conn.addr(), to = %addr, "following the leader hint");
                    self.set_hint(addr);
                    self.forget(&conn, false).await;
                    redirects += 1;
                    // Monitors with stale views may point at each other: slow down.
                    if redirects > 2 {
                        sleep_until(backoff, deadline).await;
                        backoff = (backoff * 2).min(MAX_BACKOFF);
                    }
                }
                Step::Redirect(_) => {
                    unavailable = Some(Unavailability::NoLeader);
                    self.forget(&conn, true).await;
                    sleep_until(backoff, deadline).await;
                    backoff = (backoff * 2).min(MAX_BACKOFF);
                }
                Step::Retry(why) => {
                    unavailable = Some(why);
                    self.forget(&conn, true).await;
                    sleep_until(backoff, deadline).await;
                    backoff = (backoff * 2).min(MAX_BACKOFF);
                }
            }
        }
        if let Some(why) = unavailable {
            return Err(MonClientError::Unavailable(why));
        }
        if !connected && !last_error.is_empty() {
            return Err(MonClientError::Unreachable {
                addrs: self.inner.addrs.get(),
                last_error,
            });
        }
        Err(MonClientError::Timeout)
    }
}

async fn sleep_until(d: Duration, deadline: Instant) {
    tokio::time::sleep_until((Instant::now() + d).min(deadline)).await;
}

#[cfg(test)]
mod tests;
