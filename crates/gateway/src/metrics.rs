//! An NBD server's Prometheus metrics (`cairn nbd serve --metrics-addr`): requests, bytes,
//! errors and latency per export and request kind, connections, and QoS throttling per open
//! volume. Names and meanings: `docs/operator/metrics.md`.

use cairn_failstop::LockOrDie;
use cairn_metrics::{
    latency_family, Counter, EncodeLabelSet, Exporter, Family, Gauge, LatencyFamily, Unit,
};
use std::sync::Arc;
use std::time::Instant;

/// An export (a volume, or `VOL@SNAP`) and a request kind.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReqLabels {
    pub export: String,
    pub op: &'static str,
}

/// An export and a direction (`in`: written by clients, `out`: read by them).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct BytesLabels {
    pub export: String,
    pub direction: &'static str,
}

/// An export.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ExportLabels {
    pub export: String,
}

/// The NBD server's metrics.
pub struct NbdMetrics {
    requests: Family<ReqLabels, Counter>,
    errors: Family<ReqLabels, Counter>,
    latency: LatencyFamily<ReqLabels>,
    bytes: Family<BytesLabels, Counter>,
    connections: Family<ExportLabels, Gauge>,
    throttled: Family<ExportLabels, Counter>,
    throttled_seconds: Family<ExportLabels, Counter<f64, std::sync::atomic::AtomicU64>>,
    /// The totals last read of each export's open volume (which volume, waits, seconds): a
    /// volume closed and opened again starts its totals from zero.
    last_throttled: std::sync::Mutex<std::collections::HashMap<String, (usize, u64, f64)>>,
}

impl NbdMetrics {
    /// The metrics, and the exporter that serves them.
    pub fn new() -> (Arc<NbdMetrics>, Exporter) {
        let m = Arc::new(NbdMetrics {
            requests: Family::default(),
            errors: Family::default(),
            latency: latency_family(),
            bytes: Family::default(),
            connections: Family::default(),
            throttled: Family::default(),
            throttled_seconds: Family::default(),
            last_throttled: Default::default(),
        });
        let mut e = Exporter::new("cairn_nbd");
        let r = e.registry();
        r.register(
            "requests",
            "NBD requests served, by export and kind",
            m.requests.clone(),
        );
        r.register(
            "errors",
            "NBD requests that failed, by export and kind",
            m.errors.clone(),
        );
        r.register_with_unit(
            "request_latency",
            "Latency of NBD requests: from read off the connection to answered by the cluster",
            Unit::Seconds,
            m.latency.clone(),
        );
        r.register_with_unit(
            "export",
            "Bytes written to (in) and read from (out) each export",
            Unit::Bytes,
            m.bytes.clone(),
        );
        r.register(
            "connections",
            "Open connections per export",
            m.connections.clone(),
        );
        r.register(
            "qos_throttled_requests",
            "Requests the volume's QoS limits delayed",
            m.throttled.clone(),
        );
        r.register_with_unit(
            "qos_throttled",
            "Time requests waited for the QoS limits",
            Unit::Seconds,
            m.throttled_seconds.clone(),
        );
        (m, e)
    }

    /// Counts request `op` on `export`, started at `t0`, that wrote `bytes_in` and ended
    /// with `r` (`bytes_out` tells the bytes it read). A record after the fact, not a wrapper
    /// of the request's future: wrapping moves that future into a second and a third one
    /// (the command future of a 4 KiB read grew from ~3 KiB to ~10 KiB, all of it copied per
    /// request).
    pub fn record<T, E>(
        &self,
        export: &str,
        op: &'static str,
        bytes_in: u64,
        t0: Instant,
        r: &Result<T, E>,
        bytes_out: impl Fn(&T) -> u64,
    ) {
        let labels = ReqLabels {
            export: export.to_string(),
            op,
        };
        self.requests.get_or_create(&labels).inc();
        match r {
            Ok(v) => {
                self.latency
                    .get_or_create(&labels)
                    .observe(t0.elapsed().as_secs_f64());
                for (direction, n) in [("in", bytes_in), ("out", bytes_out(v))] {
                    if n > 0 {
                        let l = BytesLabels {
                            export: labels.export.clone(),
                            direction,
                        };
                        self.bytes.get_or_create(&l).inc_by(n);
                    }
                }
            }
            Err(_) => {
                self.errors.get_or_create(&labels).inc();
            }
        }
    }

    /// A connection to `export` opened (`+1`) or closed (`-1`).
    pub fn connection(&self, export: &str, delta: i64) {
        let l = ExportLabels {
            export: export.to_string(),
        };
        self.connections.get_or_create(&l).inc_by(delta);
    }

    /// Adds to the QoS counters of `export` what its open volume (`volume`, an identity)
    /// counted since they were last read.
    pub fn throttled(&self, export: &str, volume: usize, waits: u64, waited: std::time::Duration) {
        let secs = waited.as_secs_f64();
        let mut last = self.last_throttled.lock_or_die();
        let seen = last.entry(export.to_string()).or_insert((volume, 0, 0.0));
        if seen.0 != volume {
            *seen = (volume, 0, 0.0);
        }
        let l = ExportLabels {
            export: export.to_string(),
        };
        self.throttled
            .get_or_create(&l)
            .inc_by(waits.saturating_sub(seen.1));
        self.throttled_seconds
            .get_or_create(&l)
            .inc_by((secs - seen.2).max(0.0));
        *seen = (volume, waits.max(seen.1), secs.max(seen.2));
    }
}
