//! Prometheus metrics (prometheus-client), served at `/metrics`: registered
//! once here, and counted by the paths they describe, mostly through the
//! helpers below.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
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

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DhcpLabels {
    /// Request: discover/request/...; reply: dhcp.offer/dhcp.ack/...
    pub kind: &'static str,
    pub mode: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabels {
    pub reason: &'static str,
}

/// One thread's handles on series of a counter family, each looked up in
/// the family once. `Family::get_or_create` hashes the labels and takes the
/// family's lock every time: in the DHCP thread a DORA's four counts cost
/// ~1,800 instructions that way (callgrind, issue 34). The handles count
/// into the series `/metrics` shows. Label sets come from fixed enums, so
/// the list stays short; past [`RESOLVED_MAX`] it counts through the family.
pub struct Resolved<L> {
    seen: Vec<(L, Counter)>,
}

/// Label sets a [`Resolved`] keeps handles for.
const RESOLVED_MAX: usize = 16;

impl<L> Default for Resolved<L> {
    fn default() -> Self {
        Resolved { seen: Vec::new() }
    }
}

impl<L: Clone + std::hash::Hash + Eq> Resolved<L> {
    pub fn inc(&mut self, family: &Family<L, Counter>, labels: L) {
        if let Some((_, c)) = self.seen.iter().find(|(l, _)| *l == labels) {
            c.inc();
            return;
        }
        let c = family.get_or_create(&labels).clone();
        c.inc();
        if self.seen.len() < RESOLVED_MAX {
            self.seen.push((labels, c));
        }
    }
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
    pub dhcp_requests: Family<DhcpLabels, Counter>,
    pub dhcp_replies: Family<DhcpLabels, Counter>,
    pub dhcp_ignored: Family<ReasonLabels, Counter>,
    pub dhcp_seconds: Histogram,
    pub tftp_transfers: Family<ResultLabels, Counter>,
    pub tftp_bytes: Counter,
    pub boot_requests: Family<BootLabels, Counter>,
    pub syslog_lines: Family<ResultLabels, Counter>,
    pub metadata_requests: Family<CodeLabels, Counter>,
    /// Actions that ended, by result: success, failed, timeout.
    pub workflow_actions: Family<ResultLabels, Counter>,
    /// Discovery's outcomes for agents with no Hardware.
    pub discovered: Family<ResultLabels, Counter>,
    /// Enrollment's outcomes for agents with no Workflow.
    pub enrollments: Family<ResultLabels, Counter>,
    /// Cleaning on release (`[cleaning]`): started, cleaned, failed, skipped.
    pub release_cleanings: Family<ResultLabels, Counter>,
    /// Workflows that reached a state, by state.
    pub workflow_states: Family<StateLabels, Counter>,
    /// Kubernetes mode: 1 while every watch is current.
    pub kube_connected: Gauge,
    /// Kubernetes mode: seconds since the mirror was last known current.
    pub kube_sync_age_seconds: Gauge<f64, std::sync::atomic::AtomicU64>,
    /// Kubernetes mode: what the watches delivered, by kind and event.
    pub kube_watch_events: Family<WatchLabels, Counter>,
    /// Kubernetes mode: requests sent (watches excepted), by client and
    /// method: what the status pushes and the Lease cost the API server.
    pub kube_requests: Family<KubeRequestLabels, Counter>,
    /// Kubernetes mode: status writes (one request each), by kind.
    pub kube_status_writes: Family<KindLabels, Counter>,
    /// Kubernetes mode: Lease renewals by this leader, by result.
    pub kube_lease_renewals: Family<ResultLabels, Counter>,
    /// Kubernetes mode: the longest time between two successful renewals
    /// of one leadership (the Lease lasts 15 s; the leader steps down at 10).
    pub kube_lease_longest_gap_seconds: Gauge<f64, std::sync::atomic::AtomicU64>,
    /// The discovery pool's addresses by state: leased, free, declined,
    /// reserved (by a Hardware); they add up to the pool's size.
    pub discovery_pool_addresses: Family<StateLabels, Gauge>,
    /// DISCOVERs of new clients that found no free address.
    pub discovery_pool_exhausted: Counter,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KubeRequestLabels {
    /// `requests` (reads and writes) or `lease`.
    pub client: &'static str,
    pub method: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KindLabels {
    pub kind: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct WatchLabels {
    /// Hardware, Template, ...
    pub kind: &'static str,
    /// apply, delete, relist (a whole list swapped in), error.
    pub event: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StateLabels {
    pub state: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CodeLabels {
    pub code: u16,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabels {
    pub result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct BootLabels {
    /// script, binary, artifact
    pub what: &'static str,
    pub code: u16,
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
            dhcp_requests: Family::default(),
            dhcp_replies: Family::default(),
            dhcp_ignored: Family::default(),
            // 10 us .. ~80 ms: a reply is computed in microseconds.
            dhcp_seconds: Histogram::new(exponential_buckets(1e-5, 2.0, 14)),
            tftp_transfers: Family::default(),
            tftp_bytes: Counter::default(),
            boot_requests: Family::default(),
            syslog_lines: Family::default(),
            metadata_requests: Family::default(),
            workflow_actions: Family::default(),
            discovered: Family::default(),
            enrollments: Family::default(),
            release_cleanings: Family::default(),
            workflow_states: Family::default(),
            kube_connected: Gauge::default(),
            kube_sync_age_seconds: Gauge::default(),
            kube_watch_events: Family::default(),
            kube_requests: Family::default(),
            kube_status_writes: Family::default(),
            kube_lease_renewals: Family::default(),
            kube_lease_longest_gap_seconds: Gauge::default(),
            discovery_pool_addresses: Family::default(),
            discovery_pool_exhausted: Counter::default(),
            registry: Registry::default(),
        };
        registry.register(
            "kube_connected",
            "Kubernetes mode: 1 while every watch of the cluster is current, else 0",
            m.kube_connected.clone(),
        );
        registry.register(
            "kube_sync_age_seconds",
            "Kubernetes mode: seconds since the mirror was last known current (0 while connected)",
            m.kube_sync_age_seconds.clone(),
        );
        registry.register(
            "kube_watch_events",
            "Kubernetes mode: watch events by kind and event (apply, delete, relist, error)",
            m.kube_watch_events.clone(),
        );
        registry.register(
            "kube_requests",
            "Kubernetes mode: requests sent to the API server (watches excepted), by client and method",
            m.kube_requests.clone(),
        );
        registry.register(
            "kube_status_writes",
            "Kubernetes mode: status writes (one server-side apply each), by kind",
            m.kube_status_writes.clone(),
        );
        registry.register(
            "kube_lease_renewals",
            "Kubernetes mode: Lease renewals by this instance while leading, by result",
            m.kube_lease_renewals.clone(),
        );
        registry.register(
            "kube_lease_longest_gap_seconds",
            "Kubernetes mode: the longest time between two successful Lease renewals of one leadership",
            m.kube_lease_longest_gap_seconds.clone(),
        );
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
        registry.register(
            "dhcp_requests",
            "DHCP requests received, by message type and mode",
            m.dhcp_requests.clone(),
        );
        registry.register(
            "dhcp_replies",
            "DHCP replies sent, by kind and mode",
            m.dhcp_replies.clone(),
        );
        registry.register(
            "dhcp_ignored",
            "DHCP packets not answered, by reason",
            m.dhcp_ignored.clone(),
        );
        registry.register(
            "dhcp_reply_seconds",
            "Time from receiving a DHCP packet to sending the reply",
            m.dhcp_seconds.clone(),
        );
        registry.register(
            "tftp_transfers",
            "TFTP requests by result: started, sent, aborted, not_found, forbidden, write_refused",
            m.tftp_transfers.clone(),
        );
        registry.register(
            "tftp_sent_bytes",
            "Bytes of files TFTP finished sending",
            m.tftp_bytes.clone(),
        );
        registry.register(
            "boot_http_requests",
            "Boot requests on the public listener (iPXE scripts, binaries, artifacts) by status code",
            m.boot_requests.clone(),
        );
        registry.register(
            "syslog_lines",
            "Syslog datagrams by result: stored, unknown_source, malformed",
            m.syslog_lines.clone(),
        );
        registry.register(
            "metadata_requests",
            "Metadata requests by status code",
            m.metadata_requests.clone(),
        );
        registry.register(
            "workflow_actions",
            "Workflow actions that ended, by result: success, failed, timeout",
            m.workflow_actions.clone(),
        );
        registry.register(
            "discovery_hardware",
            "Agents with no Hardware, by what discovery did: created, rate_limited, at_cap, failed",
            m.discovered.clone(),
        );
        registry.register(
            "enrollments",
            "Agents with no Workflow, by what enrollment did: created, no_match, disabled, refused, failed",
            m.enrollments.clone(),
        );
        registry.register(
            "release_cleanings",
            "Cleanings of Hardware CAPT released, by outcome: started, cleaned, failed, skipped",
            m.release_cleanings.clone(),
        );
        registry.register(
            "workflow_states",
            "Workflows that entered a state (PENDING, RUNNING, SUCCESS, ...)",
            m.workflow_states.clone(),
        );
        registry.register(
            "discovery_pool_addresses",
            "Addresses of the discovery pool by state: leased, free, declined, reserved (by a Hardware)",
            m.discovery_pool_addresses.clone(),
        );
        registry.register(
            "discovery_pool_exhausted",
            "DISCOVERs of new clients the discovery pool had no free address for",
            m.discovery_pool_exhausted.clone(),
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

    pub fn dhcp_ignored(&self, reason: &'static str) {
        self.dhcp_ignored
            .get_or_create(&ReasonLabels { reason })
            .inc();
    }

    pub fn tftp(&self, result: &'static str) {
        self.tftp_transfers
            .get_or_create(&ResultLabels { result })
            .inc();
    }

    pub fn metadata(&self, code: u16) {
        self.metadata_requests
            .get_or_create(&CodeLabels { code })
            .inc();
    }

    pub fn syslog(&self, result: &'static str) {
        self.syslog_lines
            .get_or_create(&ResultLabels { result })
            .inc();
    }

    pub fn boot(&self, what: &'static str, code: u16) {
        self.boot_requests
            .get_or_create(&BootLabels { what, code })
            .inc();
    }

    pub fn set_discovery_pool(&self, state: &'static str, n: usize) {
        self.discovery_pool_addresses
            .get_or_create(&StateLabels { state })
            .set(i64::try_from(n).unwrap_or(i64::MAX));
    }

    pub fn discovery_pool(&self, state: &'static str) -> i64 {
        self.discovery_pool_addresses
            .get_or_create(&StateLabels { state })
            .get()
    }

    pub fn applied(&self, outcome: ApplyOutcome) {
        self.hardware_applies
            .get_or_create(&ApplyLabels { outcome })
            .inc();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A resolved handle counts into the series `/metrics` shows, and a
    /// label set is looked up once however often it is counted.
    #[test]
    fn resolved_counts_into_the_family() {
        let m = Metrics::new();
        let mut r = Resolved::default();
        let offer = DhcpLabels {
            kind: "dhcp.offer",
            mode: "reservation",
        };
        for _ in 0..3 {
            r.inc(&m.dhcp_replies, offer.clone());
        }
        r.inc(
            &m.dhcp_replies,
            DhcpLabels {
                kind: "dhcp.ack",
                mode: "reservation",
            },
        );
        assert_eq!(r.seen.len(), 2);
        let text = m.render();
        assert!(
            text.contains(r#"dhcp_replies_total{kind="dhcp.offer",mode="reservation"} 3"#),
            "{text}"
        );
        assert!(
            text.contains(r#"dhcp_replies_total{kind="dhcp.ack",mode="reservation"} 1"#),
            "{text}"
        );
    }
}
