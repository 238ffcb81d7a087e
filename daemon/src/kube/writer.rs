//! tinkerbox's writes to the cluster, for the roles it plays natively:
//! - [`Cluster`]: one object at a time, read and written with its
//!   resourceVersion as precondition and retried on a conflict (another
//!   writer came between), every call bounded by the client's timeouts.
//!   The services use it where the cluster is the truth: a Hardware's
//!   `allowPXE` flip, a BMC Job a Workflow or a user starts.
//! - [`Outbox`] + [`Pusher`]: status, which tinkerbox keeps in its store
//!   (the engines write it there, fast and crash-safe) and copies to the
//!   cluster behind them. Changes are coalesced per object, so a burst of
//!   action reports is one patch, and kept while the API server is away.

use super::convert::{self, WorkflowSchema, merge_patch};
use super::mirror::{kind_name, resource};
use crate::hardware::{FieldError, Key};
use crate::kinds::Kind;
use crate::store::Store;
use crate::store::bmc::{JobKind, JobRow, State as JobState};
use crate::workflow::model::Milestones;
use kube::api::{Api, DeleteParams, DynamicObject, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use std::collections::{HashMap, HashSet};
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
    schema: Mutex<Option<WorkflowSchema>>,
}

impl Cluster {
    pub fn new(client: kube::Client) -> Cluster {
        Cluster {
            client,
            schema: Mutex::new(None),
        }
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

    /// Make the object's status `desired` (a merge patch of the
    /// difference, with the resourceVersion read as precondition). False
    /// when the object is gone; `same` decides which differences matter.
    pub async fn patch_status(
        &self,
        kind: Kind,
        key: &Key,
        desired: &Value,
        same: fn(&Value, &Value) -> bool,
    ) -> Result<bool, WriteError> {
        for _ in 0..ATTEMPTS {
            let Some(current) = self.get(kind, key).await? else {
                return Ok(false);
            };
            let now = current.get("status").cloned().unwrap_or(json!({}));
            if same(&now, desired) {
                return Ok(true);
            }
            let Some(diff) = merge_patch(&now, desired) else {
                return Ok(true);
            };
            let patch = json!({
                "metadata": {"resourceVersion": current.pointer("/metadata/resourceVersion")},
                "status": diff,
            });
            let api = self.api(kind, &key.namespace);
            match bounded(api.patch_status(
                &key.name,
                &PatchParams::default(),
                &Patch::Merge(&patch),
            ))
            .await
            {
                Ok(_) => return Ok(true),
                Err(e) if e.is(409) => continue,
                Err(e) if e.is(404) => return Ok(false),
                Err(e) => return Err(e),
            }
        }
        Err(WriteError::Conflict {
            kind: kind_name(kind),
            key: key.clone(),
        })
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

    /// The installed Workflow CRD's schema, read until it could be read
    /// once (Current meanwhile: no RBAC for CRDs, or a server without
    /// them); forgotten after a status patch the schema refused.
    async fn workflow_schema(&self) -> WorkflowSchema {
        if let Some(s) = *self.schema.lock().unwrap_or_else(|p| p.into_inner()) {
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
        let s = match api.get("workflows.tinkerbell.org").await {
            Ok(crd) => WorkflowSchema::of_crd(&serde_json::to_value(crd).unwrap_or(Value::Null)),
            Err(e) => {
                tracing::info!(error = %e, "kube: the Workflow CRD cannot be read: writing the current status schema");
                WorkflowSchema::Current
            }
        };
        tracing::info!(schema = ?s, "kube: Workflow status schema");
        *self.schema.lock().unwrap_or_else(|p| p.into_inner()) = Some(s);
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

/// What the services and engines share of the cluster: the writer (kube
/// mode, once connected) and the outbox of status owed to it.
#[derive(Default)]
pub struct Link {
    cluster: std::sync::OnceLock<std::sync::Arc<Cluster>>,
    pub outbox: std::sync::Arc<Outbox>,
    /// Workflow status pushes, one at a time (each reads the newest row,
    /// so none is overtaken by an older one), and what the last push of
    /// each Workflow carried: its store version and milestones.
    pushed: tokio::sync::Mutex<HashMap<Key, (i64, Milestones)>>,
}

impl Link {
    /// Kube mode: the cluster is where mirrored objects are written.
    pub fn connect(&self, c: std::sync::Arc<Cluster>) {
        let _ = self.cluster.set(c);
    }

    pub fn cluster(&self) -> Option<&std::sync::Arc<Cluster>> {
        self.cluster.get()
    }

    /// A worker was given or reported `next` (stored as `version`): in
    /// kube mode, while this instance leads with Tink native, the cluster
    /// has every milestone before the worker is answered, so that no
    /// leader after this one serves an action again or loses a result.
    /// A progress report (no milestone moved since the last push) only
    /// waits in the outbox.
    pub async fn make_durable(
        &self,
        store: &Store,
        key: &Key,
        version: i64,
        next: &crate::workflow::model::Status,
    ) -> Result<(), WriteError> {
        let Some(cluster) = self.cluster.get() else {
            return Ok(());
        };
        if !self.outbox.pushing_workflows() {
            return Ok(());
        }
        let mut pushed = self.pushed.lock().await;
        if let Some((v, m)) = pushed.get(key)
            && (*v >= version || *m == next.milestones())
        {
            return Ok(());
        }
        push_workflow(cluster, store, key, &mut pushed).await
    }

    /// The Pusher's Workflow push, in turn with the workers' own.
    async fn push_workflow(&self, store: &Store, key: &Key) -> Result<(), WriteError> {
        let Some(cluster) = self.cluster.get() else {
            return Ok(());
        };
        let mut pushed = self.pushed.lock().await;
        push_workflow(cluster, store, key, &mut pushed).await
    }
}

/// Copy `key`'s stored status to the cluster (the newest row, read under
/// the push lock) and remember what it carried.
async fn push_workflow(
    cluster: &Cluster,
    store: &Store,
    key: &Key,
    pushed: &mut HashMap<Key, (i64, Milestones)>,
) -> Result<(), WriteError> {
    let Some(row) = store.workflow(key).await? else {
        pushed.remove(key);
        return Ok(());
    };
    if crate::kinds::disabled(&row.doc).is_some() {
        return Ok(());
    }
    // The object's own status says which schema it is in; a
    // Workflow without one gets the installed CRD's.
    let theirs = cluster.get(Kind::Workflow, key).await?;
    let schema = match theirs.as_ref().and_then(|o| o.get("status")) {
        Some(s) if convert::is_v012(s) => WorkflowSchema::V012,
        Some(s) if s.get("state").is_some() => WorkflowSchema::Current,
        _ => cluster.workflow_schema().await,
    };
    let status = convert::status_to_cluster(&row.status, schema);
    let r = cluster
        .patch_status(Kind::Workflow, key, &status, |a, b| a == b)
        .await;
    if r.as_ref().is_err_and(|e| e.is(422)) {
        *cluster.schema.lock().unwrap_or_else(|p| p.into_inner()) = None;
    }
    if r? {
        pushed.insert(key.clone(), (row.version, row.status.milestones()));
    } else {
        pushed.remove(key);
    }
    Ok(())
}

/// An object whose status tinkerbox owes the cluster.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Dirty {
    Workflow(Key),
    /// A Job or a Task (a Rufio Task run as a one-task job).
    Job(Key),
    Machine(Key),
}

/// Status changes not yet copied to the cluster, one entry per object.
/// Marking does nothing until a [`Pusher`] drains it (host mode never).
#[derive(Default)]
pub struct Outbox {
    enabled: AtomicBool,
    /// A running Pusher writes Workflow status (Tink native).
    workflows: AtomicBool,
    dirty: Mutex<HashSet<Dirty>>,
    notify: Notify,
}

/// The outbox is on while its Pusher runs, and off (and empty) once the
/// Pusher is stopped: a former leader keeps nothing to write later.
struct OnWhilePushing<'a>(&'a Outbox);

impl<'a> OnWhilePushing<'a> {
    fn new(o: &'a Outbox, workflows: bool) -> Self {
        o.workflows.store(workflows, Ordering::Release);
        o.enabled.store(true, Ordering::Release);
        OnWhilePushing(o)
    }
}

impl Drop for OnWhilePushing<'_> {
    fn drop(&mut self) {
        self.0.enabled.store(false, Ordering::Release);
        self.0.workflows.store(false, Ordering::Release);
        self.0.take();
    }
}

impl Outbox {
    /// A Pusher of Workflow status runs (this instance leads, Tink native).
    fn pushing_workflows(&self) -> bool {
        self.enabled.load(Ordering::Acquire) && self.workflows.load(Ordering::Acquire)
    }

    pub fn mark(&self, d: Dirty) {
        if !self.enabled.load(Ordering::Acquire) {
            return;
        }
        self.dirty
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(d);
        self.notify.notify_one();
    }

    fn take(&self) -> Vec<Dirty> {
        self.dirty
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .drain()
            .collect()
    }

    fn put_back(&self, d: Vec<Dirty>) {
        self.dirty
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .extend(d);
    }
}

/// Copies status from the store to the cluster.
pub struct Pusher {
    pub store: Store,
    pub cluster: std::sync::Arc<Cluster>,
    pub link: std::sync::Arc<Link>,
    /// Workflow status is tinkerbox's to write (tink native).
    pub workflows: bool,
    /// Job, Task and Machine status is tinkerbox's to write (rufio native).
    pub bmc: bool,
}

impl Pusher {
    /// Until aborted: every object marked, then everything the store holds
    /// once at the start (what changed while no pusher ran). Started when
    /// this instance leads, aborted when it stops leading.
    pub async fn run(self) {
        let outbox = self.link.outbox.clone();
        // What an earlier leadership pushed says nothing of the cluster now.
        self.link.pushed.lock().await.clear();
        let _on = OnWhilePushing::new(&outbox, self.workflows);
        match self.everything().await {
            Ok(all) => outbox.put_back(all),
            Err(e) => tracing::warn!(error = %e, "kube: cannot list what to push"),
        }
        let mut backoff = Duration::from_millis(500);
        loop {
            let batch = outbox.take();
            if batch.is_empty() {
                outbox.notify.notified().await;
                continue;
            }
            let mut failed = vec![];
            for d in batch {
                match self.push(&d).await {
                    Ok(()) => {}
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

    async fn everything(&self) -> Result<Vec<Dirty>, crate::store::StoreError> {
        let mut all: Vec<Dirty> = vec![];
        if self.workflows {
            all.extend(
                self.store
                    .workflows(None, &[])
                    .await?
                    .into_iter()
                    .filter(|w| w.status != Default::default())
                    .map(|w| Dirty::Workflow(w.key)),
            );
        }
        if self.bmc {
            all.extend(
                self.store
                    .jobs(None)
                    .await?
                    .into_iter()
                    .map(|j| Dirty::Job(j.key())),
            );
            all.extend(
                self.store
                    .bmc_machines(None)
                    .await?
                    .into_iter()
                    .map(|m| Dirty::Machine(m.key)),
            );
        }
        Ok(all)
    }

    async fn push(&self, d: &Dirty) -> Result<(), WriteError> {
        match d {
            Dirty::Workflow(_) if !self.workflows => {}
            Dirty::Job(_) | Dirty::Machine(_) if !self.bmc => {}
            Dirty::Workflow(key) => self.link.push_workflow(&self.store, key).await?,
            Dirty::Job(key) => {
                let Some(row) = self.store.job(key).await? else {
                    return Ok(());
                };
                let kind = match row.kind {
                    JobKind::Job => Kind::Job,
                    JobKind::Task => Kind::Task,
                };
                let status = convert::job_status(&row);
                self.cluster
                    .patch_status(kind, key, &status, |a, b| a == b)
                    .await?;
                if row.kind == JobKind::Job {
                    self.push_tasks(key, &row).await?;
                }
            }
            Dirty::Machine(key) => {
                let Some(row) = self.store.bmc_machine(key).await? else {
                    return Ok(());
                };
                let status = convert::machine_status(&row);
                self.cluster
                    .patch_status(Kind::Machine, key, &status, same_but_time)
                    .await?;
            }
        }
        Ok(())
    }
}

impl Pusher {
    /// A Job's steps as Rufio's job controller shows them: the Task
    /// `<job>-task-<n>` of each action begun, created when first owed
    /// (owned by the Job, so deleted with it), and its status.
    async fn push_tasks(&self, key: &Key, row: &JobRow) -> Result<(), WriteError> {
        let mut job: Option<Value> = None;
        for (n, ts) in row.task_states.iter().enumerate() {
            if ts.state == JobState::Pending {
                continue;
            }
            let tkey = Key::new(key.namespace.clone(), convert::task_name(&key.name, n));
            let status = convert::task_status(ts);
            if self
                .cluster
                .patch_status(Kind::Task, &tkey, &status, |a, b| a == b)
                .await?
            {
                continue;
            }
            if job.is_none() {
                job = self.cluster.get(Kind::Job, key).await?;
            }
            let Some(job) = &job else {
                return Ok(()); // the Job is gone, and its Tasks with it
            };
            let connection = match &row.machine {
                Some(m) => self
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
            self.cluster.create(Kind::Task, &tkey, &task).await?;
            self.cluster
                .patch_status(Kind::Task, &tkey, &status, |a, b| a == b)
                .await?;
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

    /// A status that keeps losing: bounded, then a Conflict error (the
    /// pusher keeps it and tries later), not a loop.
    #[tokio::test]
    async fn status_lost_to_conflicts_every_time_gives_up_after_the_attempts() {
        let mut steps = vec![];
        for rv in 0..ATTEMPTS {
            steps.push(Step::json(
                Method::GET,
                HW,
                200,
                &mock::hardware("m1", &rv.to_string(), "02:00:00:00:00:01"),
            ));
            steps.push(Step::json(
                Method::PATCH,
                "/hardware/m1/status",
                409,
                &mock::status(409, "Conflict"),
            ));
        }
        let (client, server) = mock::client(steps);
        let c = Cluster::new(client);
        let e = c
            .patch_status(
                Kind::Hardware,
                &Key::new("default", "m1"),
                &json!({"x": 1}),
                |a, b| a == b,
            )
            .await
            .unwrap_err();
        assert!(matches!(e, WriteError::Conflict { .. }), "{e}");
        assert!(!e.permanent(), "a conflict is tried again later");
        assert_eq!(server.seen().len(), 2 * ATTEMPTS);
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
        o.mark(Dirty::Workflow(k.clone()));
        assert!(o.take().is_empty(), "off: nothing kept");
        let on = OnWhilePushing::new(&o, true);
        assert!(o.pushing_workflows());
        o.mark(Dirty::Workflow(k.clone()));
        o.mark(Dirty::Workflow(k.clone()));
        o.mark(Dirty::Job(k.clone()));
        let mut t = o.take();
        t.sort_by_key(|d| format!("{d:?}"));
        assert_eq!(t, [Dirty::Job(k.clone()), Dirty::Workflow(k.clone())]);
        assert!(o.take().is_empty());
        o.mark(Dirty::Workflow(k.clone()));
        drop(on);
        assert!(!o.pushing_workflows());
        assert!(o.take().is_empty(), "a stopped pusher leaves nothing owed");
        o.mark(Dirty::Workflow(k));
        assert!(o.take().is_empty(), "and takes nothing more");
    }
}
