//! tinkerbox's writes to the cluster, for the roles it plays natively:
//! - [`Cluster`]: one object at a time, every call bounded. A spec change
//!   is read and written with its resourceVersion as precondition and
//!   retried on a conflict (another writer came between); a status write
//!   is one server-side apply.
//! - [`Port`]: the services' port to the cluster
//!   ([`crate::services::cluster::Cluster`]), implemented here: a
//!   Hardware's `allowPXE` flip, a BMC Job a Workflow or a user starts, and
//!   what must be in the cluster before a worker is answered or a BMC
//!   command sent.
//! - [`Outbox`] + [`Pusher`]: status, which tinkerbox keeps in its store
//!   (the engines write it there, fast and crash-safe) and copies to the
//!   cluster behind them, while this instance leads. Changes are coalesced
//!   per object, so a burst of progress reports is one write.

use super::convert::{self, WorkflowSchema, merge_patch};
use super::mirror::{kind_name, resource};
use crate::hardware::Hardware;
use crate::hardware::{FieldError, Key};
use crate::kinds::Kind;
use crate::services::cluster::{ClusterError, Copy, Edit, Owed};
use crate::store::Store;
use crate::store::bmc::{JobKind, JobRow, State as JobState};
use crate::store::mirror::MirrorItem;
use crate::workflow::model::Milestones;
use kube::api::{Api, DeleteParams, DynamicObject, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use tokio::sync::Notify;

/// Read-modify-writes lost to another writer are retried this often.
const ATTEMPTS: usize = 5;

/// Every call to the API server is answered within this or fails (the
/// client bounds connecting and sending, not waiting for the answer).
const CALL_TIMEOUT: Duration = Duration::from_secs(20);

async fn bounded<T>(
    f: impl std::future::Future<Output = Result<T, kube::Error>>,
) -> Result<T, WriteError> {
    match tokio::time::timeout(CALL_TIMEOUT, f).await {
        Ok(r) => r.map_err(WriteError::Kube),
        Err(_) => Err(WriteError::Timeout),
    }
}

#[derive(Debug, thiserror::Error)]
pub enum WriteError {
    #[error("the Kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    #[error("{0}")]
    Invalid(#[from] FieldError),
    #[error("{kind} {key} kept changing under this write ({ATTEMPTS} conflicts); try again")]
    Conflict { kind: &'static str, key: Key },
    #[error("{kind} {key} not found in the cluster")]
    NotFound { kind: &'static str, key: Key },
    #[error("the Kubernetes API did not answer within {CALL_TIMEOUT:?}")]
    Timeout,
    /// Reading what to write failed: passing (retried), not the cluster's.
    #[error("store: {0}")]
    Store(#[from] crate::store::StoreError),
}

impl WriteError {
    /// Will not succeed by trying again (refused by RBAC, by the schema...):
    /// not retried forever.
    fn permanent(&self) -> bool {
        matches!(self, WriteError::Invalid(_))
            || matches!(self, WriteError::Kube(kube::Error::Api(s))
                if (400..500).contains(&s.code) && s.code != 409 && s.code != 429)
    }

    fn is(&self, code: u16) -> bool {
        matches!(self, WriteError::Kube(kube::Error::Api(s)) if s.code == code)
    }
}

/// The cluster, for writes.
pub struct Cluster {
    client: kube::Client,
    metrics: Option<std::sync::Arc<crate::metrics::Metrics>>,
    /// The installed Workflow CRD's status schema, and when it was read.
    schema: Mutex<Option<(WorkflowSchema, std::time::Instant)>>,
}

/// The field manager of every status tinkerbox writes.
const STATUS_MANAGER: &str = "tinkerbox-status";

/// The field manager of the objects tinkerbox makes and keeps as it wants
/// them (a BareMetalHost's parts).
const OWNER_MANAGER: &str = "tinkerbox";

/// The Workflow CRD is read again after this (a supervised upgrade may
/// replace tink v0.12's with the current one).
const SCHEMA_AGE: Duration = Duration::from_secs(60);

impl Cluster {
    pub fn new(client: kube::Client) -> Cluster {
        Cluster {
            client,
            metrics: None,
            schema: Mutex::new(None),
        }
    }

    /// Status writes are counted (`tinkerbox_kube_status_writes`).
    pub fn with_metrics(mut self, m: std::sync::Arc<crate::metrics::Metrics>) -> Cluster {
        self.metrics = Some(m);
        self
    }

    fn api(&self, kind: Kind, namespace: &str) -> Api<DynamicObject> {
        Api::namespaced_with(self.client.clone(), namespace, &resource(kind))
    }

    /// The object, as the API server has it (None: not there).
    pub async fn get(&self, kind: Kind, key: &Key) -> Result<Option<Value>, WriteError> {
        match bounded(self.api(kind, &key.namespace).get(&key.name)).await {
            Ok(o) => Ok(Some(serde_json::to_value(o).unwrap_or(Value::Null))),
            Err(e) if e.is(404) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Change an object's spec or metadata with `edit` (which may refuse):
    /// a merge patch of what it changed, with the resourceVersion it read
    /// as precondition. Returns the object as the API server has it now.
    pub async fn update(
        &self,
        kind: Kind,
        key: &Key,
        mut edit: impl FnMut(&mut Value) -> Result<(), FieldError>,
    ) -> Result<Value, WriteError> {
        let name = kind_name(kind);
        for _ in 0..ATTEMPTS {
            let Some(current) = self.get(kind, key).await? else {
                return Err(WriteError::NotFound {
                    kind: name,
                    key: key.clone(),
                });
            };
            let rv = current.pointer("/metadata/resourceVersion").cloned();
            let mut next = current.clone();
            edit(&mut next)?;
            let Some(mut patch) = merge_patch(&strip(&current), &strip(&next)) else {
                return Ok(current);
            };
            patch["metadata"]["resourceVersion"] = rv.unwrap_or(Value::Null);
            let api = self.api(kind, &key.namespace);
            match bounded(api.patch(&key.name, &PatchParams::default(), &Patch::Merge(&patch)))
                .await
            {
                Ok(o) => return Ok(serde_json::to_value(o).unwrap_or(Value::Null)),
                Err(e) if e.is(409) => continue,
                Err(e) => return Err(e),
            }
        }
        Err(WriteError::Conflict {
            kind: name,
            key: key.clone(),
        })
    }

    /// Make the object's status `status`: one server-side apply on the
    /// status subresource, forced, under one field manager for every
    /// instance (a new leader's apply replaces what its predecessor set,
    /// fields it no longer sets included). No read first and no
    /// resourceVersion precondition: only the leader writes status, and a
    /// worker's answer waits for the write, so there is nothing newer in
    /// the cluster to lose. False when the object is gone.
    pub async fn apply_status(
        &self,
        kind: Kind,
        key: &Key,
        status: &Value,
    ) -> Result<bool, WriteError> {
        let ar = resource(kind);
        let body = json!({
            "apiVersion": ar.api_version, "kind": ar.kind,
            "metadata": {"name": key.name, "namespace": key.namespace},
            "status": status,
        });
        let params = PatchParams::apply(STATUS_MANAGER).force();
        if let Some(m) = &self.metrics {
            m.kube_status_writes
                .get_or_create(&crate::metrics::KindLabels {
                    kind: kind_name(kind),
                })
                .inc();
        }
        match bounded(self.api(kind, &key.namespace).patch_status(
            &key.name,
            &params,
            &Patch::Apply(&body),
        ))
        .await
        {
            Ok(_) => Ok(true),
            Err(e) if e.is(404) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Create `doc`: the object as made, or None when one of its name exists.
    pub async fn create(
        &self,
        kind: Kind,
        key: &Key,
        doc: &Value,
    ) -> Result<Option<Value>, WriteError> {
        let obj: DynamicObject = serde_json::from_value(doc.clone())
            .map_err(|e| FieldError::new("", format!("not an object: {e}")))?;
        match bounded(
            self.api(kind, &key.namespace)
                .create(&PostParams::default(), &obj),
        )
        .await
        {
            Ok(o) => Ok(Some(serde_json::to_value(o).unwrap_or(Value::Null))),
            Err(e) if e.is(409) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Make the object `doc` says, or bring the one there to it: a
    /// server-side apply of everything but its status, forced, under
    /// [`OWNER_MANAGER`] (fields it set before and no longer does go).
    pub async fn apply(&self, kind: Kind, key: &Key, doc: &Value) -> Result<Value, WriteError> {
        let ar = resource(kind);
        let mut body = strip(doc);
        body["apiVersion"] = json!(ar.api_version);
        body["kind"] = json!(ar.kind);
        body["metadata"]["name"] = json!(key.name);
        body["metadata"]["namespace"] = json!(key.namespace);
        let params = PatchParams::apply(OWNER_MANAGER).force();
        let o = bounded(self.api(kind, &key.namespace).patch(
            &key.name,
            &params,
            &Patch::Apply(&body),
        ))
        .await?;
        Ok(serde_json::to_value(o).unwrap_or(Value::Null))
    }

    /// True when it existed.
    pub async fn delete(&self, kind: Kind, key: &Key) -> Result<bool, WriteError> {
        match bounded(
            self.api(kind, &key.namespace)
                .delete(&key.name, &DeleteParams::default()),
        )
        .await
        {
            Ok(_) => Ok(true),
            Err(e) if e.is(404) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// The installed Workflow CRD's schema, read at most every
    /// [`SCHEMA_AGE`] (Current when it cannot be read: no RBAC for CRDs,
    /// or a server without them); forgotten after a status write the
    /// schema refused.
    async fn workflow_schema(&self) -> WorkflowSchema {
        if let Some((s, at)) = *self.schema.lock().unwrap_or_else(|p| p.into_inner())
            && at.elapsed() < SCHEMA_AGE
        {
            return s;
        }
        let ar = kube::api::ApiResource::from_gvk_with_plural(
            &kube::api::GroupVersionKind::gvk(
                "apiextensions.k8s.io",
                "v1",
                "CustomResourceDefinition",
            ),
            "customresourcedefinitions",
        );
        let api: Api<DynamicObject> = Api::all_with(self.client.clone(), &ar);
        let s = match bounded(api.get("workflows.tinkerbell.org")).await {
            Ok(crd) => WorkflowSchema::of_crd(&serde_json::to_value(crd).unwrap_or(Value::Null)),
            Err(e) => {
                tracing::info!(error = %e, "kube: the Workflow CRD cannot be read: writing the current status schema");
                WorkflowSchema::Current
            }
        };
        tracing::debug!(schema = ?s, "kube: Workflow status schema");
        *self.schema.lock().unwrap_or_else(|p| p.into_inner()) =
            Some((s, std::time::Instant::now()));
        s
    }
}

/// What the API server owns in an object: a diff of two copies ignores it.
fn strip(v: &Value) -> Value {
    let mut v = v.clone();
    if let Some(m) = v.get_mut("metadata").and_then(Value::as_object_mut) {
        for k in [
            "resourceVersion",
            "managedFields",
            "generation",
            "creationTimestamp",
            "uid",
        ] {
            m.remove(k);
        }
    }
    if let Some(o) = v.as_object_mut() {
        o.remove("status");
    }
    v
}

/// Kube's side of the services' port ([`crate::services::cluster`]): the
/// cluster's writer, the outbox of status owed to it, and what makes a
/// worker's answer or a BMC command wait for the cluster.
pub struct Port {
    cluster: Arc<Cluster>,
    store: Store,
    pub outbox: Arc<Outbox>,
    /// Workflow status pushes, one at a time (each reads the newest row,
    /// so none is overtaken by an older one), and what the last push of
    /// each Workflow carried: its store version and milestones.
    pushed: Mutex<HashMap<Key, Pushed>>,
    /// Each Workflow's pushes, one at a time: each reads the newest row,
    /// so none is overtaken by an older one (different Workflows' pushes
    /// go side by side). Never held to read `pushed`.
    pushing: Mutex<HashMap<Key, Arc<tokio::sync::Mutex<()>>>>,
    /// The status schema each Workflow's own status is in, as the mirror
    /// last saw it (a Workflow without status gets the CRD's).
    schemas: Mutex<HashMap<Key, WorkflowSchema>>,
    /// Job status pushes, one at a time (each reads the newest row).
    jobs: tokio::sync::Mutex<()>,
}

impl Port {
    pub fn new(cluster: Arc<Cluster>, store: Store) -> Port {
        Port {
            cluster,
            store,
            outbox: Arc::default(),
            pushed: Default::default(),
            pushing: Default::default(),
            schemas: Default::default(),
            jobs: Default::default(),
        }
    }

    /// The mirror saw Workflow `key` with this status (None: gone).
    pub fn saw_workflow(&self, key: &Key, status: Option<&Value>) {
        let mut m = self.schemas.lock().unwrap_or_else(|p| p.into_inner());
        match status {
            Some(s) if convert::is_v012(s) => {
                m.insert(key.clone(), WorkflowSchema::V012);
            }
            Some(s) if s.get("state").is_some() => {
                m.insert(key.clone(), WorkflowSchema::Current);
            }
            Some(_) => {}
            None => {
                m.remove(key);
            }
        }
    }

    fn schema_of(&self, key: &Key) -> Option<WorkflowSchema> {
        self.schemas
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(key)
            .copied()
    }

    fn pushed(&self) -> std::sync::MutexGuard<'_, HashMap<Key, Pushed>> {
        self.pushed.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Copy Workflow `key`'s stored status to the cluster (the newest row,
    /// read under the push lock) and remember what it carried. One call:
    /// the schema is the object's own as the mirror saw it, else the CRD's
    /// (cached). `progress_every`: a push that carries no new milestone
    /// waits until this long after the last one (Deferred).
    async fn push_workflow(
        &self,
        key: &Key,
        progress_every: Option<Duration>,
    ) -> Result<Push, WriteError> {
        let turn = self
            .pushing
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(key.clone())
            .or_default()
            .clone();
        let _one = turn.lock().await;
        let Some(row) = self.store.workflow(key).await? else {
            self.pushed().remove(key);
            self.pushing
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .remove(key);
            return Ok(Push::Done);
        };
        if crate::kinds::disabled(&row.doc).is_some() {
            return Ok(Push::Done);
        }
        let milestones = row.status.milestones();
        if let Some(p) = self.pushed().get(key) {
            if p.version >= row.version {
                return Ok(Push::Done); // this row (or a newer one) is there
            }
            if let Some(every) = progress_every
                && p.milestones == milestones
                && p.at.elapsed() < every
            {
                return Ok(Push::Deferred(p.at + every));
            }
        }
        let schema = match self.schema_of(key) {
            Some(s) => s,
            None => self.cluster.workflow_schema().await,
        };
        let status = convert::status_to_cluster(&row.status, schema);
        let r = self
            .cluster
            .apply_status(Kind::Workflow, key, &status)
            .await;
        if r.as_ref().is_err_and(|e| e.is(422)) {
            *self
                .cluster
                .schema
                .lock()
                .unwrap_or_else(|p| p.into_inner()) = None;
        }
        if r? {
            self.pushed().insert(
                key.clone(),
                Pushed {
                    version: row.version,
                    milestones,
                    at: tokio::time::Instant::now(),
                },
            );
        } else {
            self.pushed().remove(key);
        }
        Ok(Push::Done)
    }
}

/// What the last status push of a Workflow carried, and when.
struct Pushed {
    version: i64,
    milestones: Milestones,
    at: tokio::time::Instant,
}

/// A push done (or not needed), or put off until then.
enum Push {
    Done,
    Deferred(tokio::time::Instant),
}

/// Progress (a message, a time) is written at most this often per
/// Workflow; milestones at once. An agent reports progress every 5 s.
const PROGRESS_EVERY: Duration = Duration::from_secs(5);

impl From<WriteError> for ClusterError {
    fn from(e: WriteError) -> ClusterError {
        match e {
            WriteError::Invalid(f) => ClusterError::Invalid(f),
            WriteError::NotFound { kind, key } => ClusterError::NotFound(format!("{kind} {key}")),
            e => ClusterError::Failed(e.to_string()),
        }
    }
}

#[async_trait::async_trait]
impl crate::services::cluster::Cluster for Port {
    async fn update_hardware(
        &self,
        key: &Key,
        edit: &mut Edit<'_>,
    ) -> Result<Copy<Hardware>, ClusterError> {
        let doc = self
            .cluster
            .update(Kind::Hardware, key, |d| edit(d))
            .await?;
        let version = doc
            .pointer("/metadata/resourceVersion")
            .and_then(Value::as_str)
            .map(String::from);
        let item = crate::hardware::validate(crate::kinds::clean(doc))?;
        Ok(Copy {
            key: key.clone(),
            item,
            version,
        })
    }

    async fn put_job(
        &self,
        key: &Key,
        doc: &Value,
        run: Option<&str>,
    ) -> Result<Option<Copy<MirrorItem>>, ClusterError> {
        if let Some(run) = run
            && let Some(old) = self.cluster.get(Kind::Job, key).await?
        {
            let status = old.get("status").cloned().unwrap_or_default();
            let ours = old
                .pointer("/metadata/annotations")
                .and_then(|a| a.get(crate::store::bmc::RUN_ANNOTATION))
                .and_then(Value::as_str)
                == Some(run);
            if convert::job_running(&status) || ours {
                return Ok(None);
            }
            self.cluster.delete(Kind::Job, key).await?;
        }
        let Some(made) = self.cluster.create(Kind::Job, key, doc).await? else {
            return Ok(None);
        };
        let version = made
            .pointer("/metadata/resourceVersion")
            .and_then(Value::as_str)
            .map(String::from);
        let item = convert::item(Kind::Job, crate::kinds::clean(made))?;
        Ok(Some(Copy {
            key: key.clone(),
            item,
            version,
        }))
    }

    async fn hardware_status(&self, key: &Key, status: &Value) -> Result<(), ClusterError> {
        self.cluster
            .apply_status(Kind::Hardware, key, status)
            .await?;
        Ok(())
    }

    async fn remove_annotation(
        &self,
        kind: Kind,
        key: &Key,
        name: &str,
    ) -> Result<(), ClusterError> {
        self.cluster
            .update(kind, key, |d| {
                if let Some(a) = d
                    .pointer_mut("/metadata/annotations")
                    .and_then(Value::as_object_mut)
                {
                    a.remove(name);
                }
                Ok(())
            })
            .await?;
        Ok(())
    }

    async fn create(
        &self,
        kind: Kind,
        key: &Key,
        doc: &Value,
    ) -> Result<Option<Copy<Value>>, ClusterError> {
        Ok(self
            .cluster
            .create(kind, key, doc)
            .await?
            .map(|made| copy(key, made)))
    }

    async fn apply(&self, kind: Kind, key: &Key, doc: &Value) -> Result<Copy<Value>, ClusterError> {
        Ok(copy(key, self.cluster.apply(kind, key, doc).await?))
    }

    async fn delete(&self, kind: Kind, key: &Key) -> Result<bool, ClusterError> {
        Ok(self.cluster.delete(kind, key).await?)
    }

    async fn get(&self, kind: Kind, key: &Key) -> Result<Option<Value>, ClusterError> {
        Ok(self.cluster.get(kind, key).await?)
    }

    async fn edit(
        &self,
        kind: Kind,
        key: &Key,
        edit: &mut Edit<'_>,
    ) -> Result<Copy<Value>, ClusterError> {
        Ok(copy(
            key,
            self.cluster.update(kind, key, |d| edit(d)).await?,
        ))
    }

    fn owe(&self, o: Owed) {
        self.outbox.mark(o);
    }

    /// In kube mode, while this instance leads with Tink native, the
    /// cluster has every milestone before the worker is answered, so that
    /// no leader after this one serves an action again or loses a result.
    /// A progress report (no milestone moved since the last push) only
    /// waits in the outbox.
    async fn workflow_durable(
        &self,
        key: &Key,
        version: i64,
        next: &crate::workflow::model::Status,
    ) -> Result<(), ClusterError> {
        if !self.outbox.pushing_workflows() {
            return Ok(());
        }
        // A milestone already in the cluster (this version or a newer one,
        // or the same milestones as the last push): nothing to wait for.
        if let Some(p) = self.pushed().get(key)
            && (p.version >= version || p.milestones == next.milestones())
        {
            return Ok(());
        }
        self.push_workflow(key, None).await?;
        Ok(())
    }

    /// While this instance leads with Rufio native: Running before the
    /// job's first BMC command is sent, so no later leader sends it again.
    async fn job_durable(&self, key: &Key) -> Result<(), ClusterError> {
        if !self.outbox.pushing_bmc() {
            return Ok(());
        }
        let _one = self.jobs.lock().await;
        let Some(row) = self.store.job(key).await.map_err(WriteError::from)? else {
            return Ok(());
        };
        let kind = match row.kind {
            JobKind::Job => Kind::Job,
            JobKind::Task => Kind::Task,
        };
        self.cluster
            .apply_status(kind, key, &convert::job_status(&row))
            .await?;
        Ok(())
    }
}

/// An object as the cluster answered a write, cleaned, with its
/// resourceVersion.
fn copy(key: &Key, doc: Value) -> Copy<Value> {
    let version = doc
        .pointer("/metadata/resourceVersion")
        .and_then(Value::as_str)
        .map(String::from);
    Copy {
        key: key.clone(),
        item: crate::kinds::clean(doc),
        version,
    }
}

/// Status changes not yet copied to the cluster, one entry per object.
/// Marking does nothing until a [`Pusher`] drains it (host mode never).
#[derive(Default)]
pub struct Outbox {
    enabled: AtomicBool,
    /// A running Pusher writes Workflow status (Tink native).
    workflows: AtomicBool,
    /// A running Pusher writes Job, Task and Machine status (Rufio native).
    bmc: AtomicBool,
    dirty: Mutex<HashSet<Owed>>,
    notify: Notify,
}

/// The outbox is on while its Pusher runs, and off (and empty) once the
/// Pusher is stopped: a former leader keeps nothing to write later.
struct OnWhilePushing<'a>(&'a Outbox);

impl<'a> OnWhilePushing<'a> {
    fn new(o: &'a Outbox, workflows: bool, bmc: bool) -> Self {
        o.workflows.store(workflows, Ordering::Release);
        o.bmc.store(bmc, Ordering::Release);
        o.enabled.store(true, Ordering::Release);
        OnWhilePushing(o)
    }
}

impl Drop for OnWhilePushing<'_> {
    fn drop(&mut self) {
        self.0.enabled.store(false, Ordering::Release);
        self.0.workflows.store(false, Ordering::Release);
        self.0.bmc.store(false, Ordering::Release);
        self.0.take();
    }
}

impl Outbox {
    /// A Pusher of Workflow status runs (this instance leads, Tink native).
    fn pushing_workflows(&self) -> bool {
        self.enabled.load(Ordering::Acquire) && self.workflows.load(Ordering::Acquire)
    }

    /// A Pusher of BMC status runs (this instance leads, Rufio native).
    fn pushing_bmc(&self) -> bool {
        self.enabled.load(Ordering::Acquire) && self.bmc.load(Ordering::Acquire)
    }

    pub fn mark(&self, d: Owed) {
        if !self.enabled.load(Ordering::Acquire) {
            return;
        }
        self.dirty
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(d);
        self.notify.notify_one();
    }

    fn take(&self) -> Vec<Owed> {
        self.dirty
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .drain()
            .collect()
    }

    fn put_back(&self, d: Vec<Owed>) {
        self.dirty
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .extend(d);
    }
}

/// Copies status from the store to the cluster.
pub struct Pusher {
    port: Arc<Port>,
    /// Workflow status is tinkerbox's to write (tink native).
    workflows: bool,
    /// Job, Task and Machine status is tinkerbox's to write (rufio native).
    bmc: bool,
    /// The Job, Machine and BareMetalHost status last written (not written
    /// again unchanged, nor a Machine's when only a poll's time changed).
    last: HashMap<Owed, Value>,
}

impl Pusher {
    pub fn new(port: Arc<Port>, workflows: bool, bmc: bool) -> Pusher {
        Pusher {
            port,
            workflows,
            bmc,
            last: HashMap::new(),
        }
    }

    /// Until aborted: every object marked. Started when this instance
    /// leads, after the cluster's status was read back into the store, so
    /// nothing older is owed; aborted when it stops leading.
    pub async fn run(mut self) {
        let outbox = self.port.outbox.clone();
        // What an earlier leadership pushed says nothing of the cluster now.
        self.port.pushed().clear();
        self.port
            .pushing
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clear();
        let _on = OnWhilePushing::new(&outbox, self.workflows, self.bmc);
        if self.bmc {
            // A Job the cluster had Running under the previous leader is
            // stored Failed (never sent again): the cluster is told why.
            match self.port.store.jobs(Some(JobState::Failed)).await {
                Ok(failed) => failed
                    .into_iter()
                    .for_each(|j| outbox.mark(Owed::Job(j.key()))),
                Err(e) => tracing::warn!(error = %e, "kube: cannot list failed jobs"),
            }
        }
        let mut backoff = Duration::from_millis(500);
        // Progress put off, and until when.
        let mut later: HashMap<Owed, tokio::time::Instant> = HashMap::new();
        loop {
            let now = tokio::time::Instant::now();
            let due: Vec<Owed> = later
                .iter()
                .filter(|(_, at)| **at <= now)
                .map(|(d, _)| d.clone())
                .collect();
            for d in &due {
                later.remove(d);
            }
            outbox.put_back(due);
            let batch = outbox.take();
            if batch.is_empty() {
                let next = later.values().min().copied();
                tokio::select! {
                    _ = outbox.notify.notified() => {}
                    _ = tokio::time::sleep_until(next.unwrap_or(now + Duration::from_secs(3600))), if next.is_some() => {}
                }
                continue;
            }
            let mut failed = vec![];
            for d in batch {
                match self.push(&d).await {
                    Ok(Push::Done) => {}
                    Ok(Push::Deferred(at)) => {
                        later.insert(d, at);
                    }
                    Err(e) if e.permanent() => {
                        // Retrying cannot help; the next change tries again.
                        tracing::error!(object = ?d, error = %e, "kube: the cluster refused a status write");
                    }
                    Err(e) => {
                        tracing::warn!(object = ?d, error = %e, "kube: status not written to the cluster; retrying");
                        failed.push(d);
                    }
                }
            }
            if failed.is_empty() {
                backoff = Duration::from_millis(500);
            } else {
                outbox.put_back(failed);
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(30));
            }
        }
    }

    async fn push(&mut self, d: &Owed) -> Result<Push, WriteError> {
        match d {
            Owed::Workflow(_) if !self.workflows => {}
            Owed::Job(_) | Owed::Machine(_) if !self.bmc => {}
            // The BareMetalHost controller runs only with both engines.
            Owed::BareMetalHost(_) if !(self.bmc && self.workflows) => {}
            Owed::Workflow(key) => return self.port.push_workflow(key, Some(PROGRESS_EVERY)).await,
            Owed::Job(key) => {
                // In turn with the runner's own pushes: never an older row
                // over a newer one.
                let port = self.port.clone();
                let _one = port.jobs.lock().await;
                let Some(row) = self.port.store.job(key).await? else {
                    self.last.remove(d);
                    return Ok(Push::Done);
                };
                let kind = match row.kind {
                    JobKind::Job => Kind::Job,
                    JobKind::Task => Kind::Task,
                };
                let status = convert::job_status(&row);
                if self.last.get(d) != Some(&status) {
                    self.port.cluster.apply_status(kind, key, &status).await?;
                    self.last.insert(d.clone(), status);
                }
                if row.kind == JobKind::Job {
                    self.push_tasks(key, &row).await?;
                }
            }
            Owed::BareMetalHost(key) => {
                // BMO's status, as the controller saved it last.
                let Some(row) = self.port.store.host(key).await? else {
                    self.last.remove(d);
                    return Ok(Push::Done);
                };
                let status = serde_json::to_value(&row.status).unwrap_or(Value::Null);
                if self.last.get(d) != Some(&status) {
                    self.port
                        .cluster
                        .apply_status(Kind::BareMetalHost, key, &status)
                        .await?;
                    self.last.insert(d.clone(), status);
                }
            }
            Owed::Machine(key) => {
                let Some(row) = self.port.store.bmc_machine(key).await? else {
                    return Ok(Push::Done);
                };
                let status = convert::machine_status(&row);
                if !self.last.get(d).is_some_and(|l| same_but_time(l, &status)) {
                    self.port
                        .cluster
                        .apply_status(Kind::Machine, key, &status)
                        .await?;
                    self.last.insert(d.clone(), status);
                }
            }
        }
        Ok(Push::Done)
    }
}

impl Pusher {
    /// A Job's steps as Rufio's job controller shows them: the Task
    /// `<job>-task-<n>` of each action begun, created when first owed
    /// (owned by the Job, so deleted with it), and its status.
    async fn push_tasks(&mut self, key: &Key, row: &JobRow) -> Result<(), WriteError> {
        let mut job: Option<Value> = None;
        for (n, ts) in row.task_states.iter().enumerate() {
            if ts.state == JobState::Pending {
                continue;
            }
            let tkey = Key::new(key.namespace.clone(), convert::task_name(&key.name, n));
            let status = convert::task_status(ts);
            let mine = Owed::Job(tkey.clone());
            if self.last.get(&mine) == Some(&status) {
                continue;
            }
            let cluster = self.port.cluster.clone();
            // A Task not made yet (404) is made, then written once more.
            if !cluster.apply_status(Kind::Task, &tkey, &status).await? {
                if job.is_none() {
                    job = cluster.get(Kind::Job, key).await?;
                }
                let Some(job) = &job else {
                    return Ok(()); // the Job is gone, and its Tasks with it
                };
                let connection = match &row.machine {
                    Some(m) => self
                        .port
                        .store
                        .bmc_machine(m)
                        .await?
                        .and_then(|m| m.doc.pointer("/spec/connection").cloned())
                        .unwrap_or(Value::Null),
                    None => Value::Null,
                };
                let action = serde_json::to_value(row.tasks.get(n)).unwrap_or(Value::Null);
                let Some(task) = convert::task_object(job, n, &action, &connection) else {
                    return Ok(());
                };
                cluster.create(Kind::Task, &tkey, &task).await?;
                if !cluster.apply_status(Kind::Task, &tkey, &status).await? {
                    continue;
                }
            }
            self.last.insert(mine, status);
        }
        Ok(())
    }
}

/// Two Machine statuses that differ only in when they were last checked:
/// the poll is not a change worth a write every interval.
fn same_but_time(a: &Value, b: &Value) -> bool {
    let untimed = |v: &Value| {
        let mut v = v.clone();
        if let Some(cs) = v.get_mut("conditions").and_then(Value::as_array_mut) {
            for c in cs {
                if let Some(o) = c.as_object_mut() {
                    o.remove("lastUpdateTime");
                }
            }
        }
        v
    };
    untimed(a) == untimed(b)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kube::mock::{self, Step};
    use ::http::Method;

    const HW: &str = "/apis/tinkerbell.org/v1alpha1/namespaces/default/hardware/m1";

    /// Another writer came between the read and the patch: the object is
    /// read again and the edit applied to the newer copy, with its
    /// resourceVersion as the precondition.
    #[tokio::test]
    async fn a_conflict_is_read_again_and_the_edit_made_on_the_newer_copy() {
        let (client, server) = mock::client(vec![
            Step::json(
                Method::GET,
                HW,
                200,
                &mock::hardware("m1", "1", "02:00:00:00:00:01"),
            ),
            Step::json(Method::PATCH, HW, 409, &mock::status(409, "Conflict")),
            Step::json(
                Method::GET,
                HW,
                200,
                &mock::hardware("m1", "2", "02:00:00:00:00:01"),
            ),
            Step::json(
                Method::PATCH,
                HW,
                200,
                &mock::hardware("m1", "3", "02:00:00:00:00:01"),
            ),
        ]);
        let c = Cluster::new(client);
        let key = Key::new("default", "m1");
        let got = c
            .update(Kind::Hardware, &key, |v| {
                v["spec"]["interfaces"][0]["netboot"]["allowPXE"] = json!(true);
                Ok(())
            })
            .await
            .unwrap();
        assert_eq!(got["metadata"]["resourceVersion"], "3");
        let seen = server.seen();
        assert_eq!(seen.len(), 4);
        let want = |rv: &str| {
            json!({"metadata": {"resourceVersion": rv},
                "spec": {"interfaces": [{"dhcp": {"mac": "02:00:00:00:00:01"}, "netboot": {"allowPXE": true}}]}})
        };
        assert_eq!(seen[1].2, want("1"));
        assert_eq!(
            seen[3].2,
            want("2"),
            "the retry carries the newer resourceVersion"
        );
    }

    /// A status write is one call: a forced server-side apply on the
    /// status subresource, under the shared status manager, with no read
    /// before it; a missing object is reported, not created.
    #[tokio::test]
    async fn a_status_write_is_one_server_side_apply() {
        let (client, server) = mock::client(vec![
            Step::json(
                Method::PATCH,
                "/workflows/w1/status?&force=true&fieldManager=tinkerbox-status",
                200,
                &json!({"apiVersion": "tinkerbell.org/v1alpha1", "kind": "Workflow", "metadata": {"name": "w1"}}),
            ),
            Step::json(
                Method::PATCH,
                "/workflows/gone/status",
                404,
                &mock::status(404, "NotFound"),
            ),
        ]);
        let c = Cluster::new(client);
        let w1 = Key::new("ns", "w1");
        assert!(
            c.apply_status(Kind::Workflow, &w1, &json!({"state": "RUNNING"}))
                .await
                .unwrap()
        );
        let gone = Key::new("ns", "gone");
        assert!(
            !c.apply_status(Kind::Workflow, &gone, &json!({}))
                .await
                .unwrap()
        );
        let seen = server.seen();
        assert_eq!(seen.len(), 2);
        assert_eq!(
            seen[0].2,
            json!({"apiVersion": "tinkerbell.org/v1alpha1", "kind": "Workflow",
                "metadata": {"name": "w1", "namespace": "ns"}, "status": {"state": "RUNNING"}})
        );
    }

    /// RBAC or schema refusals are permanent (logged, not retried forever);
    /// conflicts, throttling, server errors and silence are retried.
    #[tokio::test]
    async fn which_refusals_are_retried() {
        let (client, server) = mock::client(vec![
            Step::json(Method::GET, HW, 403, &mock::status(403, "Forbidden")),
            Step::json(Method::GET, HW, 429, &mock::status(429, "TooManyRequests")),
            Step::json(Method::GET, HW, 500, &mock::status(500, "InternalError")),
            Step::json(Method::GET, HW, 404, &mock::status(404, "NotFound")),
        ]);
        let c = Cluster::new(client);
        let key = Key::new("default", "m1");
        let e = c.get(Kind::Hardware, &key).await.unwrap_err();
        assert!(e.permanent(), "403: {e}");
        let e = c.get(Kind::Hardware, &key).await.unwrap_err();
        assert!(!e.permanent(), "429: {e}");
        let e = c.get(Kind::Hardware, &key).await.unwrap_err();
        assert!(!e.permanent(), "500: {e}");
        assert_eq!(
            c.get(Kind::Hardware, &key).await.unwrap(),
            None,
            "404 is absence"
        );
        assert!(!WriteError::Timeout.permanent());
        assert_eq!(server.seen().len(), 4);
    }

    #[test]
    fn a_poll_that_changes_only_the_time_is_not_written() {
        let a = json!({"powerState": "on", "conditions": [{"type": "Contactable", "status": "True", "lastUpdateTime": "2026-11-24T10:00:00Z"}]});
        let mut b = a.clone();
        b["conditions"][0]["lastUpdateTime"] = json!("2026-11-24T10:00:30Z");
        assert!(same_but_time(&a, &b));
        b["powerState"] = json!("off");
        assert!(!same_but_time(&a, &b));
    }

    #[test]
    fn server_fields_are_not_part_of_a_diff() {
        let a = json!({"metadata": {"name": "x", "resourceVersion": "1", "uid": "u"}, "spec": {"a": 1}, "status": {"s": 1}});
        let b = json!({"metadata": {"name": "x", "resourceVersion": "2"}, "spec": {"a": 2}, "status": {"s": 2}});
        assert_eq!(
            merge_patch(&strip(&a), &strip(&b)),
            Some(json!({"spec": {"a": 2}}))
        );
    }

    #[test]
    fn the_outbox_coalesces_and_is_off_until_a_pusher_runs() {
        let o = Outbox::default();
        let k = Key::new("ns", "w");
        o.mark(Owed::Workflow(k.clone()));
        assert!(o.take().is_empty(), "off: nothing kept");
        let on = OnWhilePushing::new(&o, true, true);
        assert!(o.pushing_workflows());
        o.mark(Owed::Workflow(k.clone()));
        o.mark(Owed::Workflow(k.clone()));
        o.mark(Owed::Job(k.clone()));
        let mut t = o.take();
        t.sort_by_key(|d| format!("{d:?}"));
        assert_eq!(t, [Owed::Job(k.clone()), Owed::Workflow(k.clone())]);
        assert!(o.take().is_empty());
        o.mark(Owed::Workflow(k.clone()));
        drop(on);
        assert!(!o.pushing_workflows());
        assert!(o.take().is_empty(), "a stopped pusher leaves nothing owed");
        o.mark(Owed::Workflow(k));
        assert!(o.take().is_empty(), "and takes nothing more");
    }
}
