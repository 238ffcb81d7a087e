//! Kubernetes mode: the cluster's Tinkerbell objects are mirrored into the
//! store, and every hot path keeps serving from the inventory as in host
//! mode, also while the API server is away and after a restart without it
//! (the store is the last mirror). The mirror is one more writer through
//! the services (`HardwareService::mirror`); nothing here touches SQLite.
//!
//! - `client`: a `kube::Client` from `[kube]` (kubeconfig, in-cluster, ...).
//! - `mirror`: one watch per kind, a full list swapped in at each
//!   `InitDone` (objects deleted while disconnected go), changes after it.
//! - `convert`: cluster objects to store rows and back (Workflow status in
//!   either CRD schema, Rufio's conditions), without a socket.
//! - `writer`: the native roles' writes to the cluster (Hardware flips,
//!   Jobs, status), the services' port, and the outbox.
//! - `lead`: the leader election; the engines run on its winner.
//! - [`Sync`]: whether the mirror is current and who leads, for
//!   `/healthz`, the metrics, the event log and the gRPC forwarder.
//! - `crds`: `tinkerbox kube install-crds`, upstream's CRDs server-side
//!   applied; `rbac`: `tinkerbox kube rbac`, the ServiceAccount and
//!   (Cluster)Role tinkerbox needs, from a typed table.

pub mod client;
pub mod convert;
pub mod crds;
pub mod lead;
pub mod mirror;
#[cfg(test)]
mod mock;
pub mod rbac;
pub mod supervisor;
pub mod writer;

use crate::hardware::Key;
use serde_json::Value;
use std::sync::Mutex;
use std::time::Instant;

/// The namespace/name of a document (`default` when it has no namespace).
pub fn doc_key(doc: &Value) -> Key {
    Key::of(doc)
}

pub use crate::kinds::clean;

/// Whether the mirror is current: every watched kind has been listed and
/// its watch has not failed since.
pub struct Sync {
    state: Mutex<SyncState>,
    /// Whether this instance holds the leader Lease.
    pub leading: lead::Leading,
    /// The supervised tink-server's address, for the iPXE scripts.
    pub tink_address: std::sync::Arc<supervisor::run::Address>,
}

struct SyncState {
    /// Kinds listed (InitDone) and healthy since.
    current: Vec<&'static str>,
    /// Kinds watched.
    kinds: Vec<&'static str>,
    /// When the mirror was last known current.
    last_current: Option<Instant>,
    /// The last watch error, while not current.
    error: Option<String>,
}

/// What `/healthz` and the CLI say about the mirror.
#[derive(Debug, Clone, serde::Serialize)]
pub struct SyncReport {
    pub current: bool,
    /// Seconds since the mirror was last known current; `None`: never
    /// (serving what the store had at start-up).
    pub age_seconds: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Kinds not (yet, or no longer) current.
    pub stale: Vec<&'static str>,
}

impl Sync {
    pub fn new(kinds: &[&'static str]) -> Self {
        Sync {
            state: Mutex::new(SyncState {
                current: vec![],
                kinds: kinds.to_vec(),
                last_current: None,
                error: None,
            }),
            leading: lead::Leading::default(),
            tink_address: Default::default(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, SyncState> {
        // A panic while holding it cannot leave it half-written (plain
        // assignments), so a poisoned lock is still good.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// `kind` was listed in full, or delivered an event: it is current.
    /// True when this made the whole mirror current.
    pub fn ok(&self, kind: &'static str) -> bool {
        let mut s = self.lock();
        let was = s.all_current();
        if !s.current.contains(&kind) {
            s.current.push(kind);
        }
        let now = s.all_current();
        if now {
            s.last_current = Some(Instant::now());
            s.error = None;
        }
        now && !was
    }

    /// `kind`'s watch failed. True when this ended a current mirror.
    pub fn failed(&self, kind: &'static str, error: String) -> bool {
        let mut s = self.lock();
        let was = s.all_current();
        if was {
            s.last_current = Some(Instant::now());
        }
        s.current.retain(|k| *k != kind);
        s.error = Some(format!("{kind}: {error}"));
        was
    }

    pub fn report(&self) -> SyncReport {
        let s = self.lock();
        let current = s.all_current();
        let age = if current {
            Some(0.0)
        } else {
            s.last_current.map(|t| t.elapsed().as_secs_f64())
        };
        SyncReport {
            current,
            age_seconds: age,
            error: s.error.clone(),
            stale: s
                .kinds
                .iter()
                .filter(|k| !s.current.contains(k))
                .copied()
                .collect(),
        }
    }
}

impl SyncState {
    fn all_current(&self) -> bool {
        self.kinds.iter().all(|k| self.current.contains(k))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn clean_drops_what_changes_on_every_write() {
        let doc = json!({"apiVersion": "tinkerbell.org/v1alpha1", "kind": "Hardware",
            "metadata": {"name": "a", "namespace": "ns", "uid": "u", "resourceVersion": "7",
                "generation": 3, "managedFields": [{"manager": "kubectl"}],
                "annotations": {"kubectl.kubernetes.io/last-applied-configuration": "{}"}},
            "spec": {}});
        assert_eq!(
            clean(doc),
            json!({"apiVersion": "tinkerbell.org/v1alpha1", "kind": "Hardware",
                "metadata": {"name": "a", "namespace": "ns", "uid": "u"}, "spec": {}})
        );
        assert_eq!(
            doc_key(&json!({"metadata": {"name": "x"}})),
            Key::new("default", "x")
        );
    }

    #[test]
    fn sync_is_current_when_every_kind_is() {
        let s = Sync::new(&["Hardware", "Secret"]);
        let r = s.report();
        assert!(!r.current);
        assert_eq!(r.age_seconds, None);
        assert_eq!(r.stale, ["Hardware", "Secret"]);
        assert!(!s.ok("Hardware"));
        assert!(s.ok("Secret"), "the last kind makes it current");
        assert!(!s.ok("Secret"), "only once");
        assert_eq!(s.report().age_seconds, Some(0.0));
        assert!(s.failed("Hardware", "connection refused".into()));
        assert!(!s.failed("Hardware", "again".into()), "ended once");
        let r = s.report();
        assert!(!r.current);
        assert!(r.age_seconds.is_some());
        assert_eq!(r.error.as_deref(), Some("Hardware: again"));
        assert_eq!(r.stale, ["Hardware"]);
    }
}
