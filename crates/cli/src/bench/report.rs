//! The results: one JSON object per workload (keys in a readable order) and a text table.

use super::measure::Measured;
use cairn_store::{IoStats, StoreStats};
use hdrhistogram::Histogram;
use serde_json::Value;

/// A JSON object that keeps its keys in insertion order (serde_json's map sorts them).
#[derive(Default)]
pub struct Obj(Vec<(String, String)>);

impl Obj {
    pub fn new() -> Self {
        Obj::default()
    }

    /// Adds a plain value.
    pub fn put(mut self, k: &str, v: impl Into<Value>) -> Self {
        self.0.push((k.to_string(), v.into().to_string()));
        self
    }

    /// Adds a nested object.
    pub fn put_obj(mut self, k: &str, o: Obj) -> Self {
        self.0.push((k.to_string(), o.render()));
        self
    }

    /// Adds an array of objects.
    pub fn put_arr(mut self, k: &str, items: &[Obj]) -> Self {
        let a: Vec<String> = items.iter().map(Obj::render).collect();
        self.0.push((k.to_string(), format!("[{}]", a.join(","))));
        self
    }

    pub fn render(&self) -> String {
        let fields: Vec<String> = self
            .0
            .iter()
            .map(|(k, v)| format!("{}:{v}", Value::from(k.as_str())))
            .collect();
        format!("{{{}}}", fields.join(","))
    }
}

fn us(ns: u64) -> f64 {
    (ns as f64 / 100.0).round() / 10.0
}

pub fn round(v: f64, digits: i32) -> f64 {
    let m = 10f64.powi(digits);
    (v * m).round() / m
}

/// `a / b` rounded to `digits` (0 when `b` is not positive).
pub fn ratio(a: f64, b: f64, digits: i32) -> f64 {
    round(if b > 0.0 { a / b } else { 0.0 }, digits)
}

/// A quantile in microseconds (0 for an empty histogram).
pub fn q(h: &Histogram<u64>, quantile: f64) -> f64 {
    if h.is_empty() {
        0.0
    } else {
        us(h.value_at_quantile(quantile))
    }
}

pub fn lat(h: &Histogram<u64>) -> Obj {
    Obj::new()
        .put("p50", q(h, 0.5))
        .put("p99", q(h, 0.99))
        .put("p999", q(h, 0.999))
        .put("max", if h.is_empty() { 0.0 } else { us(h.max()) })
}

fn io_delta(a: &IoStats, b: &IoStats) -> IoStats {
    IoStats {
        writes: b.writes.saturating_sub(a.writes),
        write_bytes: b.write_bytes.saturating_sub(a.write_bytes),
        reads: b.reads.saturating_sub(a.reads),
        read_bytes: b.read_bytes.saturating_sub(a.read_bytes),
        flushes: b.flushes.saturating_sub(a.flushes),
    }
}

/// A line of the text table.
pub struct Row {
    name: String,
    iops: f64,
    p50: f64,
    p99: f64,
    read_p99: Option<f64>,
    dev_write_mean: u64,
    dev_read_bytes: u64,
    baseline_iops: f64,
    ratio: f64,
}

/// The result of one workload: `m` measured on the store between the stats `s0` and `s1`,
/// `base` its raw baseline. Also prints the progress line.
pub fn entry(
    name: &str,
    m: &Measured,
    base: &Measured,
    s0: &StoreStats,
    s1: &StoreStats,
) -> (Obj, Row) {
    let d = io_delta(&s0.data_io, &s1.data_io);
    let wal = io_delta(&s0.wal_io, &s1.wal_io);
    let commits = s1.commits.saturating_sub(s0.commits);
    let (iops, biops) = (m.iops(), base.iops());
    let (p50, bp50) = (q(&m.all, 0.5), q(&base.all, 0.5));
    let ratio = if biops > 0.0 { iops / biops } else { 0.0 };
    let mixed = !m.reads.is_empty() && !m.writes.is_empty();
    let mut o = Obj::new()
        .put("name", name)
        .put("threads", m.threads)
        .put("seconds", round(m.elapsed.as_secs_f64(), 3))
        .put("ops", m.ops)
        .put("iops", round(iops, 1))
        .put_obj("lat_us", lat(&m.all));
    if mixed {
        o = o
            .put_obj("read_lat_us", lat(&m.reads))
            .put_obj("write_lat_us", lat(&m.writes));
    }
    let dev_write_mean = d.write_bytes.checked_div(d.writes).unwrap_or(0);
    o = o
        .put("dev_writes", d.writes)
        .put("dev_write_bytes", d.write_bytes)
        .put("dev_write_mean_bytes", dev_write_mean)
        .put("dev_reads", d.reads)
        .put("dev_read_bytes", d.read_bytes)
        .put("dev_flushes", d.flushes)
        .put("baseline_ops", base.ops)
        .put("baseline_iops", round(biops, 1))
        .put_obj("baseline_lat_us", lat(&base.all));
    if mixed {
        o = o
            .put_obj("baseline_read_lat_us", lat(&base.reads))
            .put_obj("baseline_write_lat_us", lat(&base.writes));
    }
    o = o
        .put("ratio_to_baseline", round(ratio, 4))
        .put(
            "lat_p50_ratio_to_baseline",
            if bp50 > 0.0 {
                round(p50 / bp50, 4)
            } else {
                0.0
            },
        )
        .put("commits", commits)
        .put("wal_writes", wal.writes)
        .put("wal_write_bytes", wal.write_bytes)
        .put("wal_flushes", wal.flushes)
        .put(
            "commits_per_wal_flush",
            if wal.flushes == 0 {
                0.0
            } else {
                round(commits as f64 / wal.flushes as f64, 2)
            },
        )
        .put("checkpoints", s1.checkpoints.saturating_sub(s0.checkpoints))
        .put(
            "segments_cleaned",
            s1.segments_cleaned.saturating_sub(s0.segments_cleaned),
        )
        .put(
            "commit_waits",
            serde_json::json!({
                "flusher": s1.waits_for_flusher.saturating_sub(s0.waits_for_flusher),
                "wal_space": s1.waits_for_wal_space.saturating_sub(s0.waits_for_wal_space),
            }),
        )
        .put(
            "lock_waits",
            lock_waits(&s1.lock_waits.since(&s0.lock_waits), m.elapsed),
        )
        .put(
            "wal_lock_waits",
            lock_waits(&s1.wal_lock_waits.since(&s0.wal_lock_waits), m.elapsed),
        )
        .put(
            "collection_lock_waits",
            lock_waits(&s1.coll_lock_waits.since(&s0.coll_lock_waits), m.elapsed),
        )
        .put(
            "collection_lock_waits_background",
            lock_waits(
                &s1.coll_lock_waits_background
                    .since(&s0.coll_lock_waits_background),
                m.elapsed,
            ),
        );
    let read_p99 = mixed.then(|| q(&m.reads, 0.99));
    eprintln!(
        "cairn bench: {name}: {iops:.0} IOPS, p50 {p50} us, p99 {} us{} | baseline {biops:.0} IOPS, p50 {bp50} us | ratio {ratio:.3}",
        q(&m.all, 0.99),
        read_p99.map_or(String::new(), |r| format!(", read p99 {r} us")),
    );
    let row = Row {
        name: name.to_string(),
        iops,
        p50,
        p99: q(&m.all, 0.99),
        read_p99,
        dev_write_mean,
        dev_read_bytes: d.read_bytes,
        baseline_iops: biops,
        ratio,
    };
    (o, row)
}

pub fn print_table(rows: &[Row]) {
    println!(
        "{:<27} {:>9} {:>8} {:>9} {:>11} {:>10} {:>10} {:>8} {:>7}",
        "workload",
        "iops",
        "p50 us",
        "p99 us",
        "read p99",
        "dev wr B",
        "dev rd B",
        "base iops",
        "ratio"
    );
    for r in rows {
        println!(
            "{:<27} {:>9.0} {:>8} {:>9} {:>11} {:>10} {:>10} {:>8.0} {:>7.3}",
            r.name,
            r.iops,
            r.p50,
            r.p99,
            r.read_p99.map_or("-".to_string(), |v| v.to_string()),
            r.dev_write_mean,
            r.dev_read_bytes,
            r.baseline_iops,
            r.ratio
        );
    }
}

/// Waits for the store's state lock over a timed part: count, total, p99, and those over
/// 1 ms, also per second (the measure of issue 48).
fn lock_waits(w: &cairn_store::LockWaitStats, span: std::time::Duration) -> serde_json::Value {
    let secs = span.as_secs_f64().max(1e-9);
    let over = w.over_nanos(1_000_000);
    serde_json::json!({
        "waits": w.waits,
        "total_ms": round(w.wait_nanos as f64 / 1e6, 1),
        "p99_us": round(w.quantile_nanos(0.99) as f64 / 1e3, 1),
        "over_1ms": over,
        "over_1ms_per_s": round(over as f64 / secs, 1),
    })
}
