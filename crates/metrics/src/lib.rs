//! Metrics of a Cairn daemon in the Prometheus (OpenMetrics) text format, served over HTTP
//! on a configured address (`--metrics-addr`; loopback unless configured otherwise).
//!
//! Each daemon builds its metric families into an [`Exporter`] (a `prometheus-client`
//! registry) and updates them where the work happens: counters and histograms on the hot path
//! cost an atomic add or an uncontended lock. Values that are state rather than events
//! (space used, PGs peering) are read when scraped, by the exporter's refresh callbacks.
//! Names, labels and meanings: `docs/operator/metrics.md`.

pub mod access;
mod endpoint;
pub mod http;
pub mod text;

pub use access::{AccessError, Listen, Token};
use cairn_failstop::LockOrDie;
pub use endpoint::{serve, Endpoint};
pub use prometheus_client::encoding::EncodeLabelSet;
pub use prometheus_client::metrics::counter::Counter;
pub use prometheus_client::metrics::family::Family;
pub use prometheus_client::metrics::gauge::Gauge;
pub use prometheus_client::metrics::histogram::Histogram;
pub use prometheus_client::registry::{Registry, Unit};

use std::sync::Mutex;

/// A gauge of floating-point values (ratios, seconds).
pub type FloatGauge = Gauge<f64, std::sync::atomic::AtomicU64>;

/// A counter of floating-point values (seconds spent).
pub type FloatCounter = Counter<f64, std::sync::atomic::AtomicU64>;

/// A family of histograms built with [`latency_histogram`].
pub type LatencyFamily<L> = Family<L, Histogram, fn() -> Histogram>;

/// Buckets for latencies in seconds: 10 µs to about 10 s, doubling (21 buckets), fine
/// enough for both an NVM write (tens of µs) and a stalled op (seconds).
pub fn latency_histogram() -> Histogram {
    Histogram::new(prometheus_client::metrics::histogram::exponential_buckets(
        10e-6, 2.0, 21,
    ))
}

/// A latency family (see [`latency_histogram`]).
pub fn latency_family<L>() -> LatencyFamily<L>
where
    L: Clone + std::hash::Hash + Eq,
{
    Family::new_with_constructor(latency_histogram as fn() -> Histogram)
}

type Refresh = Box<dyn Fn() + Send + Sync>;

/// A daemon's metrics: the registry, and what to read into its gauges before each scrape.
pub struct Exporter {
    registry: Registry,
    refresh: Mutex<Vec<Refresh>>,
}

impl Exporter {
    /// An exporter whose metric names all start with `prefix` (e.g. `cairn_osd`).
    pub fn new(prefix: &str) -> Exporter {
        Exporter {
            registry: Registry::with_prefix(prefix),
            refresh: Mutex::new(Vec::new()),
        }
    }

    /// The registry, to register metric families in (at start, before serving).
    pub fn registry(&mut self) -> &mut Registry {
        &mut self.registry
    }

    /// Adds a callback run before every scrape (reads state into gauges).
    pub fn on_scrape(&self, f: impl Fn() + Send + Sync + 'static) {
        self.lock_refresh().push(Box::new(f));
    }

    fn lock_refresh(&self) -> std::sync::MutexGuard<'_, Vec<Refresh>> {
        self.refresh.lock_or_die()
    }

    /// Every metric, refreshed, in the OpenMetrics text format.
    pub fn render(&self) -> String {
        for f in self.lock_refresh().iter() {
            f();
        }
        let mut out = String::with_capacity(16 << 10);
        // Writing to a String cannot fail; a metric that fails to encode is a bug, logged.
        if let Err(e) = prometheus_client::encoding::text::encode(&mut out, &self.registry) {
            tracing::error!(error = %e, "encoding metrics failed");
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
    struct Op {
        pool: u32,
        op: &'static str,
    }

    #[test]
    fn an_exporter_renders_counters_histograms_and_refreshed_gauges() {
        let mut e = Exporter::new("cairn_test");
        let ops = Family::<Op, Counter>::default();
        let lat = latency_family::<Op>();
        let used = Gauge::<i64>::default();
        e.registry().register("ops", "Ops served", ops.clone());
        e.registry()
            .register_with_unit("op_latency", "Op latency", Unit::Seconds, lat.clone());
        e.registry()
            .register("used_bytes", "Bytes used", used.clone());
        let u = used.clone();
        e.on_scrape(move || {
            u.set(4096);
        });
        let w = Op {
            pool: 1,
            op: "write",
        };
        ops.get_or_create(&w).inc_by(3);
        lat.get_or_create(&w).observe(0.000_25);
        let text = e.render();
        assert!(
            text.contains("cairn_test_ops_total{pool=\"1\",op=\"write\"} 3"),
            "{text}"
        );
        assert!(
            text.contains("cairn_test_op_latency_seconds_count{pool=\"1\",op=\"write\"} 1"),
            "{text}"
        );
        assert!(text.contains("cairn_test_used_bytes 4096"), "{text}");
        assert!(text.ends_with("# EOF\n"), "{text}");
    }
}
