//! One watch per mirrored kind, into the services. kube's watcher relists
//! after every gap it cannot resume (410 Gone, a restart): each list is
//! buffered from `Init` to `InitDone` and handed over whole, so objects
//! deleted while the watch was down disappear too. Errors arrive as stream
//! items and are retried with kube's default backoff; the mirror keeps
//! serving what it has meanwhile.

use super::{Sync, clean};
use crate::config::{KubeConfig, Role};
use crate::events::{Event, EventSink, Kind as EventKind};
use crate::hardware::{FieldError, Key};
use crate::kinds::Kind;
use crate::metrics::{Metrics, WatchLabels};
use crate::services::{Copy, Mirrored, Services};
use futures::StreamExt;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind};
use kube::runtime::{WatchStreamExt, watcher};
use serde_json::Value;
use std::sync::Arc;
use std::time::Duration;
use tokio::task::JoinHandle;

/// The kinds mirrored from the cluster, for the roles of `[kube]`:
/// Secrets only when tinkerbox's BMC engine needs their credentials,
/// WorkflowRuleSets only when it enrolls (`discovery.enroll`: a cluster
/// without their CRD is not kept from being current).
pub fn kinds(cfg: &KubeConfig, enroll: bool) -> Vec<Kind> {
    let mut k = vec![
        Kind::Hardware,
        Kind::Template,
        Kind::Workflow,
        Kind::Machine,
        Kind::Job,
        Kind::Task,
    ];
    if cfg.rufio == Role::Native {
        k.push(Kind::Secret);
    }
    if enroll {
        k.push(Kind::WorkflowRuleSet);
    }
    if cfg.metal3 {
        k.push(Kind::BareMetalHost);
    }
    k
}

/// A kind's objects in `namespace`, or in every namespace when it is empty.
fn watched(client: &kube::Client, namespace: &str, ar: &ApiResource) -> Api<DynamicObject> {
    if namespace.is_empty() {
        Api::all_with(client.clone(), ar)
    } else {
        Api::namespaced_with(client.clone(), namespace, ar)
    }
}

/// The API resource of a mirrored kind.
pub fn resource(kind: Kind) -> ApiResource {
    let (group, version, plural) = match kind {
        Kind::Hardware => ("tinkerbell.org", "v1alpha1", "hardware"),
        Kind::Template => ("tinkerbell.org", "v1alpha1", "templates"),
        Kind::Workflow => ("tinkerbell.org", "v1alpha1", "workflows"),
        Kind::WorkflowRuleSet => ("tinkerbell.org", "v1alpha1", "workflowrulesets"),
        Kind::Machine => ("bmc.tinkerbell.org", "v1alpha1", "machines"),
        Kind::Job => ("bmc.tinkerbell.org", "v1alpha1", "jobs"),
        Kind::Task => ("bmc.tinkerbell.org", "v1alpha1", "tasks"),
        Kind::Secret => ("", "v1", "secrets"),
        Kind::BareMetalHost => ("metal3.io", "v1alpha1", "baremetalhosts"),
        Kind::HardwareData => ("metal3.io", "v1alpha1", "hardwaredata"),
    };
    let name = kind_name(kind);
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(group, version, name), plural)
}

/// The `kind:` of a mirrored kind's objects.
pub fn kind_name(kind: Kind) -> &'static str {
    match kind {
        Kind::Hardware => "Hardware",
        Kind::Template => "Template",
        Kind::Workflow => "Workflow",
        Kind::WorkflowRuleSet => "WorkflowRuleSet",
        Kind::Machine => "Machine",
        Kind::Job => "Job",
        Kind::Task => "Task",
        Kind::Secret => "Secret",
        Kind::BareMetalHost => "BareMetalHost",
        Kind::HardwareData => "HardwareData",
    }
}

/// Rufio's Secrets hold `username` and `password`; any other Secret in the
/// namespace (tokens, certificates) is none of tinkerbox's business and is
/// never stored.
/// With Rufio native: a Task a Job owns is one of that Job's steps, this
/// instance's record of its own work (the Job runs the action), not a Task
/// to run again; a Job or Task marked `tinkerbell.org/disabled` is left
/// alone (not run, no status written) until the mark goes.
fn wanted(kind: Kind, doc: &Value, rufio_external: bool) -> bool {
    let left_alone = || !rufio_external && crate::kinds::disabled(doc).is_some();
    match kind {
        Kind::Secret => {
            doc.pointer("/data/username").is_some() && doc.pointer("/data/password").is_some()
        }
        Kind::Task => rufio_external || !(super::convert::owned_by_job(doc) || left_alone()),
        Kind::Job => !left_alone(),
        _ => true,
    }
}

/// A change the watch saw, as the cluster's documents.
enum Change {
    /// A whole list (`InitDone`).
    All(Vec<Value>),
    One(Value),
    Gone(Key, Option<String>),
}

/// What the watches share.
#[derive(Clone)]
pub struct Mirror {
    pub services: Arc<Services>,
    /// Kube's side of the services' port: told each Workflow's schema.
    pub port: Arc<super::writer::Port>,
    pub sync: Arc<Sync>,
    pub metrics: Arc<Metrics>,
    pub events: EventSink,
    /// tink-controller runs the Workflows: their status is the cluster's.
    pub tink_external: bool,
    /// Rufio runs the BMC Jobs and Tasks: their outcome is the cluster's.
    pub rufio_external: bool,
}

impl Mirror {
    /// Watch every mirrored kind (in `namespace`, or all when empty) until
    /// the tasks are aborted; also keeps `kube_sync_age_seconds` up to date.
    /// The tasks hold event senders: abort them before the event writer is
    /// waited for.
    pub fn spawn(
        &self,
        client: kube::Client,
        namespace: &str,
        kinds: &[Kind],
    ) -> Vec<JoinHandle<()>> {
        let mut tasks = vec![];
        for &kind in kinds {
            let ar = resource(kind);
            let api = watched(&client, namespace, &ar);
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

    async fn watch(&self, kind: Kind, api: Api<DynamicObject>) {
        let ar = resource(kind);
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
                    let doc = document(o, &ar);
                    if wanted(kind, &doc, self.rufio_external) {
                        listed.push(doc);
                    }
                    continue;
                }
                Ok(watcher::Event::InitDone) => {
                    ("relist", Change::All(std::mem::take(&mut listed)))
                }
                Ok(watcher::Event::Apply(o)) => {
                    let doc = document(o, &ar);
                    if wanted(kind, &doc, self.rufio_external) {
                        ("apply", Change::One(doc))
                    } else {
                        ("apply", Change::Gone(super::doc_key(&doc), None))
                    }
                }
                Ok(watcher::Event::Delete(o)) => {
                    let doc = document(o, &ar);
                    let uid = doc
                        .pointer("/metadata/uid")
                        .and_then(Value::as_str)
                        .map(String::from);
                    ("delete", Change::Gone(super::doc_key(&doc), uid))
                }
                Err(e) => {
                    self.count(kind, "error");
                    let msg = e.to_string();
                    tracing::warn!(kind = kind_name(kind), error = %msg, "kube: watch failed; serving the last mirror, retrying");
                    let ended = self.sync.failed(kind_name(kind), msg.clone());
                    self.gauges();
                    if ended {
                        self.events.record(Event::new(
                            EventKind::KubeDisconnected,
                            format!("the cluster cannot be read ({} watch: {msg}): serving the last mirror", kind_name(kind)),
                        ));
                    }
                    continue;
                }
            };
            self.count(kind, event);
            if let Err(e) = self.apply(kind, change).await {
                // The store refused (disk, corruption): the next relist tries again.
                tracing::error!(kind = kind_name(kind), error = %e, "kube: mirror write failed");
                self.sync.failed(kind_name(kind), format!("store: {e}"));
                continue;
            }
            let now_current = self.sync.ok(kind_name(kind));
            self.gauges();
            if now_current {
                tracing::info!("kube: the mirror is current");
                self.events.record(Event::new(
                    EventKind::KubeSynced,
                    "the mirror of the cluster is current".to_string(),
                ));
            }
        }
    }

    /// A new leader's first step: list every kind whose status the
    /// engines write and take the cluster's copy whole (this instance does
    /// not lead yet, so the status is the cluster's), so the engines go on
    /// from what the previous leader wrote, not from an older copy still on
    /// its way through the watch. A list is read from etcd's quorum: it
    /// holds every write the previous leader made before it stepped down.
    pub async fn resync(
        &self,
        client: kube::Client,
        namespace: &str,
        kinds: &[Kind],
    ) -> anyhow::Result<()> {
        for &kind in kinds {
            if !matches!(
                kind,
                Kind::Workflow | Kind::Job | Kind::Task | Kind::Machine | Kind::BareMetalHost
            ) {
                continue;
            }
            let ar = resource(kind);
            let api = watched(&client, namespace, &ar);
            let list = tokio::time::timeout(
                super::client::REQUEST_TIMEOUT,
                api.list(&Default::default()),
            )
            .await
            .map_err(|_| anyhow::anyhow!("listing {}: no answer in time", kind_name(kind)))?
            .map_err(|e| anyhow::anyhow!("listing {}: {e}", kind_name(kind)))?;
            let docs: Vec<Value> = list
                .items
                .into_iter()
                .map(|o| document(o, &ar))
                .filter(|d| wanted(kind, d, self.rufio_external))
                .collect();
            self.count(kind, "resync");
            // Not leading yet: the status taken is the cluster's.
            self.apply(kind, Change::All(docs))
                .await
                .map_err(|e| anyhow::anyhow!("storing {}: {e}", kind_name(kind)))?;
        }
        Ok(())
    }

    async fn apply(&self, kind: Kind, change: Change) -> Result<(), crate::store::StoreError> {
        let s = &self.services;
        if kind == Kind::Workflow {
            // Which schema each Workflow's status is in, for the pusher.
            match &change {
                Change::All(docs) => docs
                    .iter()
                    .for_each(|d| self.port.saw_workflow(&super::doc_key(d), d.get("status"))),
                Change::One(d) => self.port.saw_workflow(&super::doc_key(d), d.get("status")),
                Change::Gone(key, _) => self.port.saw_workflow(key, None),
            }
        }
        // The cluster's status is the truth unless this instance writes
        // it: a follower takes what its leader (or an upstream controller)
        // wrote, so that it goes on from there when it leads.
        let follower = !self.sync.leading.get();
        match kind {
            Kind::Hardware => match self.checked(kind, change, crate::hardware::validate) {
                Some(m) => s.hardware.mirror(m).await,
                None => Ok(()),
            },
            // The status BMO would have written, kept apart: the host's
            // document is stored without it.
            Kind::BareMetalHost => {
                let host = |d: Value| {
                    let status = d
                        .get("status")
                        .cloned()
                        .and_then(|v| serde_json::from_value(v).ok());
                    crate::metal3::model::host(d).map(|h| (h, status))
                };
                match self.checked(kind, change, host) {
                    Some(m) => s.metal3.mirror(m, follower).await,
                    None => Ok(()),
                }
            }
            _ => {
                let take = match kind {
                    Kind::Template | Kind::Workflow | Kind::WorkflowRuleSet => {
                        self.tink_external || follower
                    }
                    _ => self.rufio_external || follower,
                };
                match self.checked(kind, change, |d| super::convert::item(kind, d)) {
                    Some(m) => s.mirror(kind, m, take).await,
                    None => Ok(()),
                }
            }
        }
    }

    /// The cluster's documents checked by their kind's rules (`check`),
    /// each with its resourceVersion (taken out of the document: stored
    /// ones do not carry it). One that fails is reported (`kube.invalid`)
    /// and left out: a list names it so its last good copy stays; a single
    /// change of it changes nothing (None).
    fn checked<T>(
        &self,
        kind: Kind,
        change: Change,
        check: impl Fn(Value) -> Result<T, FieldError>,
    ) -> Option<Mirrored<T>> {
        let one = |doc: Value| -> Result<Copy<T>, Key> {
            let key = super::doc_key(&doc);
            let version = doc
                .pointer("/metadata/resourceVersion")
                .and_then(Value::as_str)
                .map(String::from);
            match check(clean(doc)) {
                Ok(item) => Ok(Copy { key, item, version }),
                Err(e) => {
                    tracing::warn!(kind = kind_name(kind), name = %key, error = %e, "kube: object not mirrored");
                    self.events.record(Event::new(
                        EventKind::KubeInvalid,
                        format!(
                            "{} {key} from the cluster is not {}: {e}",
                            kind_name(kind),
                            if kind == Kind::Hardware {
                                "served"
                            } else {
                                "used"
                            }
                        ),
                    ));
                    Err(key)
                }
            }
        };
        match change {
            Change::All(docs) => {
                let (mut items, mut invalid) = (vec![], vec![]);
                for d in docs {
                    match one(d) {
                        Ok(c) => items.push(c),
                        Err(k) => invalid.push(k),
                    }
                }
                Some(Mirrored::All { items, invalid })
            }
            Change::One(d) => one(d).ok().map(Mirrored::One),
            Change::Gone(key, uid) => Some(Mirrored::Gone(key, uid)),
        }
    }

    fn count(&self, kind: Kind, event: &'static str) {
        self.metrics
            .kube_watch_events
            .get_or_create(&WatchLabels {
                kind: kind_name(kind),
                event,
            })
            .inc();
    }
}

/// The stored document of a watched object: with its apiVersion and kind
/// (list items may lack them), without the fields [`clean`] drops but its
/// resourceVersion (the services compare and drop it).
fn document(o: DynamicObject, ar: &ApiResource) -> Value {
    let mut v = serde_json::to_value(&o).unwrap_or(Value::Null);
    if let Some(m) = v.as_object_mut() {
        m.entry("apiVersion")
            .or_insert_with(|| Value::String(ar.api_version.clone()));
        m.entry("kind")
            .or_insert_with(|| Value::String(ar.kind.clone()));
    }
    let rv = v.pointer("/metadata/resourceVersion").cloned();
    let mut v = clean(v);
    if let (Some(rv), Some(m)) = (rv, v.get_mut("metadata").and_then(Value::as_object_mut)) {
        m.insert("resourceVersion".into(), rv);
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::events::Event;
    use crate::kube::mock::{self, Step};
    use crate::services::{BmcService, HardwareService, WorkflowService};
    use crate::store::Store;
    use ::http::Method;
    use serde_json::json;
    use tokio::sync::mpsc;

    const LIST: &str = "/apis/tinkerbell.org/v1alpha1/namespaces/default/hardware?";

    async fn mirror(dir: &tempfile::TempDir) -> (Mirror, Store, mpsc::Receiver<Event>) {
        let store = Store::open(&dir.path().join("t.db")).await.unwrap();
        let metrics = Arc::new(Metrics::new());
        let (sink, rx) = crate::events::channel(1 << 10, metrics.clone());
        let inv = Arc::new(crate::inventory::Inventory::default());
        let wake = Arc::new(tokio::sync::Notify::new());
        let services = Arc::new(Services {
            hardware: HardwareService::new(store.clone(), inv, sink.clone(), metrics.clone()),
            bmc: BmcService::new(store.clone(), sink.clone(), wake.clone()),
            workflow: WorkflowService::new(store.clone(), sink.clone(), metrics.clone(), wake),
            discovery: crate::services::Discovery::new(
                Default::default(),
                std::net::Ipv4Addr::LOCALHOST,
            ),
            metal3: crate::services::metal3::Metal3Service::new(store.clone(), sink.clone()),
            link: Arc::default(),
        });
        let (dummy, _) = mock::client(vec![]);
        let port = Arc::new(crate::kube::writer::Port::new(
            Arc::new(crate::kube::writer::Cluster::new(dummy)),
            store.clone(),
        ));
        let m = Mirror {
            services,
            port,
            sync: Arc::new(Sync::new(&["Hardware"])),
            metrics,
            events: sink,
            tink_external: false,
            rufio_external: false,
        };
        (m, store, rx)
    }

    fn list(rv: &str, items: &[Value]) -> Value {
        json!({"apiVersion": "tinkerbell.org/v1alpha1", "kind": "HardwareList",
            "metadata": {"resourceVersion": rv}, "items": items})
    }

    async fn names(store: &Store) -> Vec<String> {
        let mut v: Vec<String> = store
            .list(None)
            .await
            .unwrap()
            .iter()
            .map(|h| h["metadata"]["name"].as_str().unwrap_or("").to_string())
            .collect();
        v.sort();
        v
    }

    /// Polls `f` (bounded): the watch runs on its own task.
    async fn until(what: &str, mut f: impl AsyncFnMut() -> bool) {
        for _ in 0..200 {
            if f().await {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("not within 10 s: {what}");
    }

    /// 410 Gone on the watch (the server compacted past our
    /// resourceVersion): the watch relists, and what was deleted meanwhile
    /// is gone from the mirror.
    #[tokio::test]
    async fn gone_relists_and_drops_what_was_deleted_meanwhile() {
        let dir = tempfile::tempdir().unwrap();
        let (m, store, _rx) = mirror(&dir).await;
        let h1 = mock::hardware("m1", "5", "02:00:00:00:00:01");
        let h2 = mock::hardware("m2", "6", "02:00:00:00:00:02");
        let gone = json!({"type": "ERROR", "object": mock::status(410, "Expired")});
        let (client, server) = mock::client(vec![
            Step::json(Method::GET, LIST, 200, &list("10", &[h1.clone(), h2])),
            Step::watch("watch=true", &[gone]),
            Step::json(Method::GET, LIST, 200, &list("12", &[h1])),
        ]);
        let api = Api::namespaced_with(client, "default", &resource(Kind::Hardware));
        let w = m.clone();
        let task = tokio::spawn(async move { w.watch(Kind::Hardware, api).await });
        until("m2 gone after the relist", async || {
            names(&store).await == ["m1"]
        })
        .await;
        until("current again", async || m.sync.report().current).await;
        task.abort();
        let errors = m
            .metrics
            .kube_watch_events
            .get_or_create(&WatchLabels {
                kind: "Hardware",
                event: "error",
            })
            .get();
        assert_eq!(errors, 1, "the 410 counted once");
        let seen = server.seen();
        assert!(
            seen[2].1.contains("limit="),
            "a list, not a watch: {}",
            seen[2].1
        );
    }

    /// The API server fails the list (an error stream): the mirror keeps
    /// what it had, says why it is not current, and is current again at
    /// the next good list, with one event for each change of state.
    #[tokio::test]
    async fn a_failing_list_keeps_the_mirror_and_reports_it() {
        let dir = tempfile::tempdir().unwrap();
        let (m, store, mut rx) = mirror(&dir).await;
        let h1 = mock::hardware("m1", "5", "02:00:00:00:00:01");
        let (client, server) = mock::client(vec![
            Step::json(
                Method::GET,
                LIST,
                200,
                &list("10", std::slice::from_ref(&h1)),
            ),
            // The watch ends with a server error, its relist is refused.
            Step::watch(
                "watch=true",
                &[json!({"type": "ERROR", "object": mock::status(410, "Expired")})],
            ),
            Step::json(
                Method::GET,
                LIST,
                500,
                &mock::status(500, "etcdserver: leader changed"),
            ),
            Step::json(Method::GET, LIST, 200, &list("12", &[h1])),
        ]);
        let api = Api::namespaced_with(client, "default", &resource(Kind::Hardware));
        let w = m.clone();
        let task = tokio::spawn(async move { w.watch(Kind::Hardware, api).await });
        let mut kinds = vec![];
        until("synced, lost, synced", async || {
            while let Ok(e) = rx.try_recv() {
                if matches!(e.kind, EventKind::KubeSynced | EventKind::KubeDisconnected) {
                    kinds.push(e.kind);
                }
            }
            kinds.len() >= 3
        })
        .await;
        task.abort();
        assert_eq!(
            kinds,
            [
                EventKind::KubeSynced,
                EventKind::KubeDisconnected,
                EventKind::KubeSynced
            ]
        );
        assert_eq!(names(&store).await, ["m1"], "kept throughout");
        assert!(m.sync.report().current);
        assert_eq!(server.seen().len(), 4);
    }

    #[test]
    fn only_rufios_secrets_and_the_jobs_and_tasks_to_run_are_stored() {
        let creds = json!({"data": {"username": "YQ==", "password": "Yg=="}});
        assert!(wanted(Kind::Secret, &creds, false));
        assert!(!wanted(
            Kind::Secret,
            &json!({"data": {"token": "x"}}),
            false
        ));
        let step = json!({"metadata": {"ownerReferences": [
            {"apiVersion": "bmc.tinkerbell.org/v1alpha1", "kind": "Job", "name": "j", "uid": "u"}]}});
        // Native: the Job runs its steps; its Tasks are its record.
        assert!(!wanted(Kind::Task, &step, false));
        // External: Rufio's Tasks, shown as they are.
        assert!(wanted(Kind::Task, &step, true));
        assert!(wanted(
            Kind::Task,
            &json!({"metadata": {"name": "t"}}),
            false
        ));
        assert!(wanted(Kind::Hardware, &json!({}), false));
        // Marked disabled: left alone while Rufio is native.
        let off = json!({"metadata": {"name": "j", "annotations": {"tinkerbell.org/disabled": "by hand"}}});
        assert!(!wanted(Kind::Job, &off, false));
        assert!(!wanted(Kind::Task, &off, false));
        assert!(wanted(Kind::Job, &off, true));
        assert!(wanted(
            Kind::Job,
            &json!({"metadata": {"name": "j"}}),
            false
        ));
    }
}
