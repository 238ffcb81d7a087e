//! One watch per mirrored kind, into the services. kube's watcher relists
//! after every gap it cannot resume (410 Gone, a restart): each list is
//! buffered from `Init` to `InitDone` and handed over whole, so objects
//! deleted while the watch was down disappear too. Errors arrive as stream
//! items and are retried with kube's default backoff; the mirror keeps
//! serving what it has meanwhile.

use super::{Sync, clean};
use crate::events::{Event, EventSink, Kind};
use crate::metrics::{Metrics, WatchLabels};
use crate::services::{Mirrored, Services};
use futures::StreamExt;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind};
use kube::runtime::{WatchStreamExt, watcher};
use serde_json::Value;
use std::sync::Arc;
use std::time::Duration;
use tokio::task::JoinHandle;

/// The kinds mirrored from the cluster.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mirrors {
    Hardware,
}

impl Mirrors {
    pub const ALL: &[Mirrors] = &[Mirrors::Hardware];

    pub fn name(self) -> &'static str {
        match self {
            Mirrors::Hardware => "Hardware",
        }
    }

    pub fn resource(self) -> ApiResource {
        let (group, version, kind, plural) = match self {
            Mirrors::Hardware => ("tinkerbell.org", "v1alpha1", "Hardware", "hardware"),
        };
        ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(group, version, kind), plural)
    }
}

/// What the watches share.
#[derive(Clone)]
pub struct Mirror {
    pub services: Arc<Services>,
    pub sync: Arc<Sync>,
    pub metrics: Arc<Metrics>,
    pub events: EventSink,
}

impl Mirror {
    /// Watch every mirrored kind (in `namespace`, or all when empty) until
    /// the tasks are aborted; also keeps `kube_sync_age_seconds` up to date.
    /// The tasks hold event senders: abort them before the event writer is
    /// waited for.
    pub fn spawn(&self, client: kube::Client, namespace: &str) -> Vec<JoinHandle<()>> {
        let mut tasks = vec![];
        for &kind in Mirrors::ALL {
            let ar = kind.resource();
            let api: Api<DynamicObject> = if namespace.is_empty() {
                Api::all_with(client.clone(), &ar)
            } else {
                Api::namespaced_with(client.clone(), namespace, &ar)
            };
            let this = self.clone();
            tasks.push(tokio::spawn(async move { this.watch(kind, api).await }));
        }
        let this = self.clone();
        tasks.push(tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_secs(1));
            loop {
                tick.tick().await;
                this.gauges();
            }
        }));
        tasks
    }

    /// The metrics of [`Sync`]: every second, and at every change.
    fn gauges(&self) {
        let r = self.sync.report();
        self.metrics.kube_connected.set(i64::from(r.current));
        self.metrics
            .kube_sync_age_seconds
            .set(r.age_seconds.unwrap_or(-1.0));
    }

    async fn watch(&self, kind: Mirrors, api: Api<DynamicObject>) {
        let ar = kind.resource();
        let mut stream = watcher(api, watcher::Config::default())
            .default_backoff()
            .boxed();
        let mut listed: Vec<Value> = vec![];
        while let Some(item) = stream.next().await {
            let (event, change) = match item {
                Ok(watcher::Event::Init) => {
                    listed.clear();
                    continue;
                }
                Ok(watcher::Event::InitApply(o)) => {
                    listed.push(document(o, &ar));
                    continue;
                }
                Ok(watcher::Event::InitDone) => {
                    ("relist", Mirrored::All(std::mem::take(&mut listed)))
                }
                Ok(watcher::Event::Apply(o)) => ("apply", Mirrored::One(document(o, &ar))),
                Ok(watcher::Event::Delete(o)) => {
                    let key = super::doc_key(&document(o, &ar));
                    ("delete", Mirrored::Gone(key))
                }
                Err(e) => {
                    self.count(kind, "error");
                    let msg = e.to_string();
                    tracing::warn!(kind = kind.name(), error = %msg, "kube: watch failed; serving the last mirror, retrying");
                    let ended = self.sync.failed(kind.name(), msg.clone());
                    self.gauges();
                    if ended {
                        self.events.record(Event::new(
                            Kind::KubeDisconnected,
                            format!("the cluster cannot be read ({} watch: {msg}): serving the last mirror", kind.name()),
                        ));
                    }
                    continue;
                }
            };
            self.count(kind, event);
            if let Err(e) = self.apply(kind, change).await {
                // The store refused (disk, corruption): the next relist tries again.
                tracing::error!(kind = kind.name(), error = %e, "kube: mirror write failed");
                self.sync.failed(kind.name(), format!("store: {e}"));
                continue;
            }
            let now_current = self.sync.ok(kind.name());
            self.gauges();
            if now_current {
                tracing::info!("kube: the mirror is current");
                self.events.record(Event::new(
                    Kind::KubeSynced,
                    "the mirror of the cluster is current".to_string(),
                ));
            }
        }
    }

    async fn apply(&self, kind: Mirrors, change: Mirrored) -> Result<(), crate::store::StoreError> {
        match kind {
            Mirrors::Hardware => self.services.hardware.mirror(change).await,
        }
    }

    fn count(&self, kind: Mirrors, event: &'static str) {
        self.metrics
            .kube_watch_events
            .get_or_create(&WatchLabels {
                kind: kind.name(),
                event,
            })
            .inc();
    }
}

/// The stored document of a watched object: with its apiVersion and kind
/// (list items may lack them), without the fields [`clean`] drops.
fn document(o: DynamicObject, ar: &ApiResource) -> Value {
    let mut v = serde_json::to_value(&o).unwrap_or(Value::Null);
    if let Some(m) = v.as_object_mut() {
        m.entry("apiVersion")
            .or_insert_with(|| Value::String(ar.api_version.clone()));
        m.entry("kind")
            .or_insert_with(|| Value::String(ar.kind.clone()));
    }
    clean(v)
}
