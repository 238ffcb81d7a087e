//! Prometheus metrics (prometheus-client). Every metric registered here is
//! updated somewhere; `tests/integration` reads `/metrics` to check it.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

/// `api` or `public`.
pub type Listener = &'static str;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLabels {
    pub listener: Listener,
    pub code: u16,
}

/// `created`, `configured`, `unchanged`, `rejected` (invalid) or `conflict`.
pub type ApplyOutcome = &'static str;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ApplyLabels {
    pub outcome: ApplyOutcome,
}

pub struct Metrics {
    registry: Registry,
    pub http_requests: Family<RequestLabels, Counter>,
    pub hardware_applies: Family<ApplyLabels, Counter>,
    pub hardware_deletes: Counter,
    pub hardware: Gauge,
    pub inventory_swaps: Counter,
    pub events_written: Counter,
    pub events_dropped: Counter,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("tinkerbox");
        let m = Metrics {
            http_requests: Family::default(),
            hardware_applies: Family::default(),
            hardware_deletes: Counter::default(),
            hardware: Gauge::default(),
            inventory_swaps: Counter::default(),
            events_written: Counter::default(),
            events_dropped: Counter::default(),
            registry: Registry::default(),
        };
        registry.register(
            "http_requests",
            "HTTP requests answered, by listener and status code",
            m.http_requests.clone(),
        );
        registry.register(
            "hardware_applies",
            "Hardware documents applied, by outcome",
            m.hardware_applies.clone(),
        );
        registry.register(
            "hardware_deletes",
            "Hardware objects deleted",
            m.hardware_deletes.clone(),
        );
        registry.register(
            "hardware",
            "Hardware objects in the inventory",
            m.hardware.clone(),
        );
        registry.register(
            "inventory_swaps",
            "Inventory snapshots published after a committed write",
            m.inventory_swaps.clone(),
        );
        registry.register(
            "events_written",
            "Events written to the store",
            m.events_written.clone(),
        );
        registry.register(
            "events_dropped",
            "Events lost because the queue was full or the write failed",
            m.events_dropped.clone(),
        );
        let info = Family::<Vec<(String, String)>, Gauge>::default();
        info.get_or_create(&vec![("version".into(), env!("CARGO_PKG_VERSION").into())])
            .set(1);
        registry.register("build_info", "The running build", info);
        Metrics { registry, ..m }
    }

    /// The text exposition format.
    pub fn render(&self) -> String {
        let mut out = String::new();
        if prometheus_client::encoding::text::encode(&mut out, &self.registry).is_err() {
            out.clear();
        }
        out
    }

    pub fn applied(&self, outcome: ApplyOutcome) {
        self.hardware_applies
            .get_or_create(&ApplyLabels { outcome })
            .inc();
    }
}
