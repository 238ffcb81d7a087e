//! The supervisor's controller (the leader runs it) and the address watch
//! (every instance runs it). kube-runtime's `Controller` does the queueing:
//! a change to a `Tinkerbell`, or to any object it made (found by its
//! owner labels), reconciles that `Tinkerbell` once, debounced.
//!
//! A reconcile: the finalizer; refusals (a duplicate, a bad spec, a
//! downgrade the Workflows cannot follow) as a condition, changing
//! nothing; a migration when the installed Workflow CRD's shape differs
//! from the release's; the release's CRDs; every desired object
//! server-side applied where it is missing or no longer holds what
//! tinkerbox set (drift), with `force` (tinkerbox owns these fields);
//! the objects no longer wanted deleted; the status from the Deployments.

use super::desired::{self, ComponentStatus, ManagedKind, Object};
use super::migrate::{self, Step};
use super::spec::{self, CrdPolicy, Plan, Refusal};
use super::{
    Component, FINALIZER, GROUP, KIND, MANAGED_BY, OWNER_NAME, OWNER_NAMESPACE, Owner, PLURAL,
    VERSION, release,
};
use crate::events::{Event as TbEvent, EventSink, Kind as EventKind};
use crate::kube::convert::WorkflowSchema;
use crate::kube::crds::{self, FIELD_MANAGER};
use crate::kube::rbac::Roles;
use futures::StreamExt;
use k8s_openapi::api::core::v1::ObjectReference;
use kube::ResourceExt;
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, GroupVersionKind, ListParams, Patch, PatchParams,
};
use kube::runtime::controller::{Action, Config as ControllerConfig, Controller};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;
use serde_json::{Value, json};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Every call to the API server answers within this, or the reconcile
/// fails and is retried.
const CALL: Duration = Duration::from_secs(20);
/// Look again this often while a component is not yet available, and this
/// often when all is well (drift that no watch reports, a Deployment's
/// health).
const SOON: Duration = Duration::from_secs(15);
const LATER: Duration = Duration::from_secs(300);

pub fn resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(GROUP, VERSION, KIND), PLURAL)
}

fn managed(kind: ManagedKind) -> ApiResource {
    let (group, version) = kind
        .api_version()
        .split_once('/')
        .unwrap_or(("", kind.api_version()));
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk(group, version, kind.kind()),
        kind.plural(),
    )
}

fn workflows() -> ApiResource {
    crate::kube::mirror::resource(crate::kinds::Kind::Workflow)
}

fn crd_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("apiextensions.k8s.io", "v1", "CustomResourceDefinition"),
        "customresourcedefinitions",
    )
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{0}")]
    Kube(#[from] kube::Error),
    #[error("{0}: no answer from the API server within {CALL:?}")]
    Timeout(String),
    #[error("{0}")]
    Failed(String),
}

/// `f` within [`CALL`].
async fn call<T>(
    what: &str,
    f: impl std::future::Future<Output = Result<T, kube::Error>>,
) -> Result<T, Error> {
    match tokio::time::timeout(CALL, f).await {
        Ok(r) => r.map_err(|e| Error::Failed(format!("{what}: {e}"))),
        Err(_) => Err(Error::Timeout(what.to_string())),
    }
}

/// A 404 as `None`.
async fn get_opt(api: &Api<DynamicObject>, name: &str) -> Result<Option<DynamicObject>, Error> {
    match tokio::time::timeout(CALL, api.get_opt(name)).await {
        Ok(r) => Ok(r?),
        Err(_) => Err(Error::Timeout(format!("get {name}"))),
    }
}

/// The gRPC address agents are given, from the supervised tink-server;
/// read by every instance (`AppState::script_settings`).
#[derive(Debug, Default)]
pub struct Address(Mutex<Option<(String, bool)>>);

impl Address {
    pub fn get(&self) -> Option<(String, bool)> {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    fn set(&self, v: Option<(String, bool)>) {
        *self.0.lock().unwrap_or_else(|p| p.into_inner()) = v;
    }
}

/// What the controller's reconciles share.
struct Ctx {
    client: kube::Client,
    roles: Roles,
    recorder: Recorder,
    events: EventSink,
    /// Per object applied: the resourceVersion the apply left and the body
    /// sent. The server writes some values its own way ("0.5" CPU as
    /// "500m"), so `holds` stays false; an object still at that version
    /// is still what was applied, and needs no apply every reconcile.
    applied: Mutex<std::collections::HashMap<String, (String, Value)>>,
}

#[derive(Clone)]
pub struct Supervisor {
    pub client: kube::Client,
    pub roles: Roles,
    pub events: EventSink,
}

impl Supervisor {
    /// The leader's task, until aborted (leadership lost) or the streams
    /// end.
    pub async fn run(self) {
        let main: Api<DynamicObject> = Api::all_with(self.client.clone(), &resource());
        let mut controller = Controller::new_with(main, watcher::Config::default(), resource())
            .with_config(ControllerConfig::default().debounce(Duration::from_millis(200)));
        for kind in ManagedKind::OWNED {
            let ar = managed(kind);
            controller = controller.watches_with(
                Api::<DynamicObject>::all_with(self.client.clone(), &ar),
                ar,
                watcher::Config::default().labels(&format!("{MANAGED_BY}=tinkerbox")),
                |o: DynamicObject| {
                    let l = o.metadata.labels.unwrap_or_default();
                    match (l.get(OWNER_NAMESPACE), l.get(OWNER_NAME)) {
                        (Some(ns), Some(name)) => {
                            Some(ObjectRef::new_with(name, resource()).within(ns))
                        }
                        _ => None,
                    }
                },
            );
        }
        let ctx = Arc::new(Ctx {
            recorder: Recorder::new(
                self.client.clone(),
                Reporter {
                    controller: "tinkerbox".into(),
                    instance: Some(crate::kube::lead::identity()),
                },
            ),
            client: self.client,
            roles: self.roles,
            events: self.events,
            applied: Mutex::default(),
        });
        tracing::info!("kube supervisor: watching Tinkerbell resources");
        controller
            .run(reconcile, error_policy, ctx)
            .for_each(|r| async move {
                match r {
                    Ok(_) => {}
                    // The watches' errors (a CRD not installed yet, the API
                    // server away) repeat with backoff: not worth a warning
                    // each time.
                    Err(kube::runtime::controller::Error::QueueError(e)) => {
                        tracing::debug!(error = %e, "kube supervisor: watch")
                    }
                    Err(e) => tracing::warn!(error = %e, "kube supervisor"),
                }
            })
            .await;
    }
}

fn error_policy(obj: Arc<DynamicObject>, e: &Error, _: Arc<Ctx>) -> Action {
    tracing::warn!(tinkerbell = %format!("{}/{}", obj.metadata.namespace.as_deref().unwrap_or(""), obj.metadata.name.as_deref().unwrap_or("")),
        error = %e, "kube supervisor: reconcile failed; retrying");
    Action::requeue(Duration::from_secs(10))
}

fn owner_of(obj: &DynamicObject) -> Owner {
    Owner {
        namespace: obj.metadata.namespace.clone().unwrap_or_default(),
        name: obj.metadata.name.clone().unwrap_or_default(),
        uid: obj.metadata.uid.clone().unwrap_or_default(),
    }
}

impl Ctx {
    fn tinkerbells(&self, ns: &str) -> Api<DynamicObject> {
        Api::namespaced_with(self.client.clone(), ns, &resource())
    }

    /// The Workflows of `w`'s namespace.
    fn workflows_of(&self, w: &DynamicObject) -> Api<DynamicObject> {
        Api::namespaced_with(
            self.client.clone(),
            w.metadata.namespace.as_deref().unwrap_or("default"),
            &workflows(),
        )
    }

    fn api(&self, kind: ManagedKind, ns: Option<&str>) -> Api<DynamicObject> {
        match ns {
            Some(ns) => Api::namespaced_with(self.client.clone(), ns, &managed(kind)),
            None => Api::all_with(self.client.clone(), &managed(kind)),
        }
    }

    /// An event on the resource (`kubectl describe tinkerbell`) and in
    /// tinkerbox's own log. A failure to record is not the reconcile's.
    async fn event(&self, obj: &DynamicObject, warning: bool, reason: &str, note: String) {
        if warning {
            tracing::warn!(tinkerbell = %owner_of(obj), reason, "{note}");
        } else {
            tracing::info!(tinkerbell = %owner_of(obj), reason, "{note}");
        }
        self.events.record(TbEvent::new(
            EventKind::KubeSupervisor,
            format!("Tinkerbell {}: {reason}: {note}", owner_of(obj)),
        ));
        let reference = ObjectReference {
            api_version: Some(format!("{GROUP}/{VERSION}")),
            kind: Some(KIND.into()),
            name: obj.metadata.name.clone(),
            namespace: obj.metadata.namespace.clone(),
            uid: obj.metadata.uid.clone(),
            resource_version: obj.metadata.resource_version.clone(),
            ..ObjectReference::default()
        };
        let ev = Event {
            type_: if warning {
                EventType::Warning
            } else {
                EventType::Normal
            },
            reason: reason.into(),
            // events.k8s.io caps a note at 1 kB.
            note: Some(note.chars().take(1000).collect()),
            action: "Reconcile".into(),
            secondary: None,
        };
        if let Err(e) = tokio::time::timeout(CALL, self.recorder.publish(&ev, &reference))
            .await
            .unwrap_or_else(|_| Err(kube::Error::Service("timed out".into())))
        {
            tracing::debug!(error = %e, "kube supervisor: cannot record an event");
        }
    }
}

async fn reconcile(cached: Arc<DynamicObject>, ctx: Arc<Ctx>) -> Result<Action, Error> {
    let owner = owner_of(&cached);
    let api = ctx.tinkerbells(&owner.namespace);
    // The controller's copy may predate the status this instance wrote a
    // moment ago: read it fresh (its generation against its observed one
    // tells a spec change from drift).
    let Some(obj) = get_opt(&api, &owner.name).await? else {
        return Ok(Action::await_change());
    };
    let finalizers = obj.metadata.finalizers.clone().unwrap_or_default();
    let ours = finalizers.iter().any(|f| f == FINALIZER);
    // The finalizers as they were plus or minus ours, on the version read.
    let set_finalizer = async |on: bool| -> Result<(), Error> {
        let mut list: Vec<&str> = finalizers
            .iter()
            .map(String::as_str)
            .filter(|f| *f != FINALIZER)
            .collect();
        if on {
            list.push(FINALIZER);
        }
        call(
            if on {
                "adding the finalizer"
            } else {
                "removing the finalizer"
            },
            api.patch(
                &owner.name,
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"finalizers": list,
                    "resourceVersion": obj.metadata.resource_version}})),
            ),
        )
        .await?;
        Ok(())
    };
    if obj.metadata.deletion_timestamp.is_some() {
        if ours {
            cleanup(&ctx, &obj).await?;
            set_finalizer(false).await?;
        }
        return Ok(Action::await_change());
    }
    if !ours {
        set_finalizer(true).await?;
        // The change brings the next reconcile.
        return Ok(Action::await_change());
    }
    let status = obj.data.get("status").cloned().unwrap_or(json!({}));
    if let Some(r) = duplicate(&ctx, &obj).await? {
        return refuse(&ctx, &obj, &status, r).await;
    }
    let plan = match spec::plan(&owner, obj.data.get("spec"), ctx.roles) {
        Ok(p) => p,
        Err(r) => return refuse(&ctx, &obj, &status, r).await,
    };
    let generation = obj.metadata.generation.unwrap_or(0);
    let observed = status["observedGeneration"].as_i64();
    let running = status["version"].as_str().unwrap_or("").to_string();
    let mut migrated = None;
    // The shape the cluster's Workflows are in: the installed CRD's.
    let crds = Api::<DynamicObject>::all_with(ctx.client.clone(), &crd_resource());
    let installed = get_opt(&crds, "workflows.tinkerbell.org")
        .await?
        .map(|c| WorkflowSchema::of_crd(&serde_json::to_value(&c).unwrap_or_default()));
    if let Some(from) = installed {
        match migrate::step(from, plan.release.workflows) {
            Step::Nothing => {}
            Step::Downgrade => {
                let n = list(&ctx, &workflows(), None, "").await?.len();
                if n > 0 {
                    let r = Refusal::DowngradeRefused(format!(
                        "{} expects tink v0.12's Workflow shape, and the {n} Workflows on the cluster are in the \
                         current one (their newer fields have nowhere to go): set spec.version back to {}, \
                         or delete the Workflows first",
                        plan.release.version,
                        if running.is_empty() {
                            "a current release"
                        } else {
                            &running
                        }
                    ));
                    return refuse(&ctx, &obj, &status, r).await;
                }
            }
            Step::Migrate => migrated = Some(migrate(&ctx, &obj, &status, &plan).await?),
        }
    }
    if migrated.is_none() && migrate::unfinished(&status, plan.release.workflows) {
        migrated = Some(migrate(&ctx, &obj, &status, &plan).await?);
    }
    if !running.is_empty() && running != plan.release.version {
        ctx.event(
            &obj,
            false,
            "Upgrading",
            format!(
                "{running} -> {}: the Deployments roll",
                plan.release.version
            ),
        )
        .await;
    }
    apply_crds(&ctx, &plan).await?;
    let spec_changed = observed != Some(generation);
    let objects = desired::objects(&plan);
    let mut created = vec![];
    let mut repaired = vec![];
    for o in &objects {
        match apply(&ctx, o).await? {
            Applied::Unchanged => {}
            Applied::Created => created.push(o.id()),
            Applied::Changed => repaired.push(o.id()),
        }
    }
    if !created.is_empty() {
        let what = if spec_changed { "Created" } else { "Recreated" };
        ctx.event(&obj, !spec_changed, what, created.join(", "))
            .await;
    }
    if !repaired.is_empty() {
        // A spec change updates them; otherwise someone else changed
        // what tinkerbox set: drift, put back.
        let (what, warn) = if spec_changed {
            ("Updated", false)
        } else {
            ("Repaired", true)
        };
        ctx.event(&obj, warn, what, repaired.join(", ")).await;
    }
    let pruned = prune(&ctx, &owner, &objects).await?;
    if !pruned.is_empty() {
        ctx.event(&obj, false, "Pruned", pruned.join(", ")).await;
    }
    let components = health(&ctx, &plan).await?;
    let address = grpc_address(&ctx, &plan).await?;
    let all_available = components.iter().all(ComponentStatus::available);
    let mut conditions = vec![
        condition(
            &status,
            "Reconciled",
            true,
            "Applied",
            format!(
                "{} objects of {} applied",
                objects.len(),
                plan.release.version
            ),
        ),
        if plan.components.is_empty() {
            condition(
                &status,
                "Available",
                true,
                "NothingToRun",
                "every component is disabled, or run by tinkerbox itself".into(),
            )
        } else if all_available {
            condition(
                &status,
                "Available",
                true,
                "AllAvailable",
                "every component is available".into(),
            )
        } else {
            let down: Vec<String> = components
                .iter()
                .filter(|c| !c.available())
                .map(|c| {
                    format!(
                        "{}: {}",
                        c.name,
                        c.conditions
                            .first()
                            .map(|c| c.message.as_str())
                            .unwrap_or("")
                    )
                })
                .collect();
            condition(
                &status,
                "Available",
                false,
                "ComponentsUnavailable",
                down.join("; "),
            )
        },
    ];
    if let Some(n) = migrated {
        conditions.push(condition(&status, "Migrated", true, "WorkflowsMigrated", format!(
            "{n} Workflows migrated from tink v0.12's shape to {}'s (their old status was kept until every one was converted)",
            plan.release.version)));
    } else if let Some(c) = status["conditions"]
        .as_array()
        .and_then(|a| a.iter().find(|c| c["type"] == "Migrated"))
    {
        conditions.push(c.clone());
    }
    let mut new = json!({
        "observedGeneration": generation,
        "version": plan.release.version,
        "namespace": plan.namespace,
        "components": components,
        "conditions": conditions,
    });
    if let Some(a) = &address {
        new["grpcAddress"] = json!(a);
        new["grpcTLS"] = json!(plan.tls());
    }
    write_status(&ctx, &obj, &status, new).await?;
    Ok(Action::requeue(if all_available { LATER } else { SOON }))
}

/// A condition, keeping its transition time when its status is unchanged.
fn condition(old: &Value, t: &str, on: bool, reason: &str, message: String) -> Value {
    let status = if on { "True" } else { "False" };
    let prev = old["conditions"]
        .as_array()
        .and_then(|a| a.iter().find(|c| c["type"] == t));
    let since = prev
        .filter(|c| c["status"] == status)
        .and_then(|c| c["lastTransitionTime"].as_str().map(String::from))
        .unwrap_or_else(|| {
            humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string()
        });
    json!({"type": t, "status": status, "reason": reason, "message": message, "lastTransitionTime": since})
}

/// `status` with condition `c` in place of the one of its type (the rest as
/// it was).
fn with_condition(status: &Value, c: Value) -> Value {
    let mut new = if status.is_object() {
        status.clone()
    } else {
        json!({})
    };
    let mut conditions = status["conditions"].as_array().cloned().unwrap_or_default();
    match conditions.iter_mut().find(|o| o["type"] == c["type"]) {
        Some(o) => *o = c,
        None => conditions.push(c),
    }
    new["conditions"] = json!(conditions);
    new
}

/// Merge-patch `/status` to `new` when it differs from `old`.
async fn write_status(
    ctx: &Ctx,
    obj: &DynamicObject,
    old: &Value,
    new: Value,
) -> Result<(), Error> {
    let Some(patch) = crate::kube::convert::merge_patch(old, &new) else {
        return Ok(());
    };
    let owner = owner_of(obj);
    call(
        "writing the status",
        ctx.tinkerbells(&owner.namespace).patch_status(
            &owner.name,
            &PatchParams::default(),
            &Patch::Merge(json!({"status": patch})),
        ),
    )
    .await?;
    Ok(())
}

/// Nothing changes: the refusal is the `Reconciled` condition (and an
/// event when it is new); the rest of the status stays as it was.
async fn refuse(ctx: &Ctx, obj: &DynamicObject, old: &Value, r: Refusal) -> Result<Action, Error> {
    let same = old["conditions"].as_array().is_some_and(|a| {
        a.iter().any(|c| {
            c["type"] == "Reconciled" && c["reason"] == r.reason() && c["message"] == r.message()
        })
    });
    if !same {
        ctx.event(obj, true, r.reason(), r.message().to_string())
            .await;
    }
    let mut new = with_condition(
        old,
        condition(old, "Reconciled", false, r.reason(), r.message().into()),
    );
    new["observedGeneration"] = json!(obj.metadata.generation.unwrap_or(0));
    write_status(ctx, obj, old, new).await?;
    Ok(Action::requeue(LATER))
}

/// Another `Tinkerbell` older than this one in the same namespace, or
/// deploying into the same one, wins.
async fn duplicate(ctx: &Ctx, obj: &DynamicObject) -> Result<Option<Refusal>, Error> {
    let all = list(ctx, &resource(), None, "").await?;
    let target = |o: &DynamicObject| {
        o.data
            .pointer("/spec/namespace")
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty())
            .map(String::from)
            .unwrap_or_else(|| o.metadata.namespace.clone().unwrap_or_default())
    };
    let key = |o: &DynamicObject| {
        (
            o.metadata.creation_timestamp.as_ref().map(|t| t.0),
            o.metadata.namespace.clone(),
            o.metadata.name.clone(),
        )
    };
    let me = owner_of(obj);
    let first = all
        .iter()
        .filter(|o| o.metadata.uid != obj.metadata.uid && o.metadata.deletion_timestamp.is_none())
        // Cluster-wide: the CRDs (and a Cluster-scoped stack's watches) are
        // one per cluster, so two would undo each other's release.
        .filter(|o| key(o) < key(obj))
        .min_by_key(|o| key(o));
    Ok(first.map(|o| {
        let other = owner_of(o);
        Refusal::Duplicate(format!(
            "Tinkerbell {other} already runs the stack (into namespace {}): one Tinkerbell per cluster, \
             as the CRDs it installs are; delete {me} or {other}",
            target(o)
        ))
    }))
}

async fn list(
    ctx: &Ctx,
    ar: &ApiResource,
    ns: Option<&str>,
    labels: &str,
) -> Result<Vec<DynamicObject>, Error> {
    let api: Api<DynamicObject> = match ns {
        Some(ns) => Api::namespaced_with(ctx.client.clone(), ns, ar),
        None => Api::all_with(ctx.client.clone(), ar),
    };
    let mut lp = ListParams::default();
    if !labels.is_empty() {
        lp = lp.labels(labels);
    }
    Ok(call(&format!("listing {}", ar.plural), api.list(&lp))
        .await?
        .items)
}

enum Applied {
    Unchanged,
    Created,
    Changed,
}

/// Server-side apply `o` unless it exists and still holds everything
/// tinkerbox sets.
async fn apply(ctx: &Ctx, o: &Object) -> Result<Applied, Error> {
    let api = ctx.api(o.kind, o.namespace.as_deref());
    let live = get_opt(&api, &o.name).await?;
    let id = o.id();
    let before = match &live {
        Some(l) => {
            let v = serde_json::to_value(l).unwrap_or_default();
            if desired::holds(&v, &o.body) {
                return Ok(Applied::Unchanged);
            }
            let as_left = ctx
                .applied
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .get(&id)
                .is_some_and(|(rv, body)| {
                    Some(rv) == l.metadata.resource_version.as_ref() && *body == o.body
                });
            if as_left {
                return Ok(Applied::Unchanged);
            }
            l.metadata.resource_version.clone()
        }
        None => None,
    };
    let done = call(
        &format!("applying {}", o.id()),
        api.patch(
            &o.name,
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(&o.body),
        ),
    )
    .await?;
    if let Some(rv) = done.metadata.resource_version.clone() {
        ctx.applied
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(id, (rv, o.body.clone()));
    }
    Ok(match before {
        None => Applied::Created,
        // The server's own spelling of a value tinkerbox set is no change.
        Some(rv) if done.metadata.resource_version.as_deref() == Some(rv.as_str()) => {
            Applied::Unchanged
        }
        Some(_) => Applied::Changed,
    })
}

fn selector(owner: &Owner) -> String {
    format!(
        "{MANAGED_BY}=tinkerbox,{OWNER_NAMESPACE}={},{OWNER_NAME}={}",
        owner.namespace, owner.name
    )
}

/// Delete what this resource made that the plan no longer has.
async fn prune(ctx: &Ctx, owner: &Owner, want: &[Object]) -> Result<Vec<String>, Error> {
    let mut gone = vec![];
    for kind in ManagedKind::OWNED {
        for o in list(ctx, &managed(kind), None, &selector(owner)).await? {
            let (ns, name) = (
                o.metadata.namespace.clone(),
                o.metadata.name.clone().unwrap_or_default(),
            );
            if want
                .iter()
                .any(|w| w.kind == kind && w.name == name && w.namespace == ns)
            {
                continue;
            }
            call(
                &format!("deleting {} {name}", kind.kind()),
                ctx.api(kind, ns.as_deref())
                    .delete(&name, &DeleteParams::background()),
            )
            .await?;
            gone.push(match ns {
                Some(ns) => format!("{}/{ns}/{name}", kind.kind()),
                None => format!("{}/{name}", kind.kind()),
            });
        }
    }
    Ok(gone)
}

/// The resource is being deleted: everything it made goes (its Namespace
/// and the user's objects stay), and the CRDs if `spec.crds: Delete`.
async fn cleanup(ctx: &Ctx, obj: &DynamicObject) -> Result<(), Error> {
    let owner = owner_of(obj);
    let gone = prune(ctx, &owner, &[]).await?;
    let policy = obj
        .data
        .pointer("/spec/crds")
        .cloned()
        .and_then(|v| serde_json::from_value::<CrdPolicy>(v).ok())
        .unwrap_or_default();
    let mut crds_gone = vec![];
    if policy == CrdPolicy::Delete {
        let rel = obj
            .data
            .pointer("/status/version")
            .and_then(Value::as_str)
            .and_then(release::find)
            .or_else(|| release::find(""));
        let api = Api::<DynamicObject>::all_with(ctx.client.clone(), &crd_resource());
        for (file, yaml) in rel.map(|r| r.crds).unwrap_or_default() {
            let crd = crds::parse(file, yaml).map_err(|e| Error::Failed(format!("{e:#}")))?;
            let name = crd.name.as_str();
            match tokio::time::timeout(CALL, api.delete(name, &DeleteParams::background())).await {
                Ok(Ok(_)) => crds_gone.push(name.to_string()),
                Ok(Err(kube::Error::Api(s))) if s.code == 404 => {}
                Ok(Err(e)) => {
                    return Err(Error::Failed(format!("deleting CRD {name} ({file}): {e}")));
                }
                Err(_) => return Err(Error::Timeout(format!("deleting CRD {name}"))),
            }
        }
    }
    ctx.event(
        obj,
        false,
        "Removed",
        format!(
            "deleted {}{}",
            if gone.is_empty() {
                "nothing left".into()
            } else {
                gone.join(", ")
            },
            if crds_gone.is_empty() {
                "; the CRDs and the objects of Tinkerbell are kept".to_string()
            } else {
                format!("; the CRDs {} (spec.crds: Delete)", crds_gone.join(", "))
            }
        ),
    )
    .await;
    Ok(())
}

/// The release's CRDs: created by server-side apply, or replaced where
/// they differ (the supervisor owns them from now on).
async fn apply_crds(ctx: &Ctx, plan: &Plan) -> Result<(), Error> {
    let api = Api::<DynamicObject>::all_with(ctx.client.clone(), &crd_resource());
    for (file, yaml) in plan.release.crds {
        let crd = crds::parse(file, yaml).map_err(|e| Error::Failed(format!("{e:#}")))?;
        let (name, doc) = (crd.name.as_str(), &crd.doc);
        match get_opt(&api, name).await? {
            Some(live) if desired::holds(&serde_json::to_value(&live).unwrap_or_default(), doc) => {
            }
            // Replaced whole, not applied: an apply keeps the fields other
            // managers own, and another release's schema (v0.12's
            // `worker`, say) must not survive in this one's.
            Some(live) => {
                let mut body = doc.clone();
                body["metadata"]["resourceVersion"] = json!(live.metadata.resource_version);
                let obj: DynamicObject = serde_json::from_value(body)
                    .map_err(|e| Error::Failed(format!("crds/{file}: {e}")))?;
                call(
                    &format!("replacing CRD {name}"),
                    api.replace(name, &kube::api::PostParams::default(), &obj),
                )
                .await?;
            }
            None => {
                call(
                    &format!("applying CRD {name}"),
                    api.patch(
                        name,
                        &PatchParams::apply(FIELD_MANAGER).force(),
                        &Patch::Apply(doc),
                    ),
                )
                .await?;
            }
        }
    }
    Ok(())
}

/// [`migrate_workflows`], its failure kept in the `Migrated` condition
/// (False until a later attempt succeeds: the next reconcile resumes).
async fn migrate(
    ctx: &Ctx,
    obj: &DynamicObject,
    status: &Value,
    plan: &Plan,
) -> Result<usize, Error> {
    match migrate_workflows(ctx, obj, plan).await {
        Ok(n) => Ok(n),
        Err(e) => {
            let new = with_condition(
                status,
                condition(status, "Migrated", false, "MigrationFailed", e.to_string()),
            );
            // The error is the reconcile's; a failed status write is only logged.
            if let Err(w) = write_status(ctx, obj, status, new).await {
                tracing::warn!(error = %w, "kube supervisor: cannot record the failed migration");
            }
            Err(e)
        }
    }
}

/// tink v0.12 Workflows to the current shape (see `migrate`): the old
/// tink's Deployments stopped first, the statuses kept, the new CRD
/// applied, each status converted, the copies dropped. The number
/// migrated.
async fn migrate_workflows(ctx: &Ctx, obj: &DynamicObject, plan: &Plan) -> Result<usize, Error> {
    let wf = workflows();
    // No v0.12 tink may write a Workflow meanwhile.
    for c in [Component::TinkController, Component::TinkServer] {
        let api = ctx.api(ManagedKind::Deployment, Some(&plan.namespace));
        if get_opt(&api, c.name()).await?.is_some() {
            call(
                "scaling the old tink down",
                api.patch(
                    c.name(),
                    &PatchParams::default(),
                    &Patch::Merge(json!({"spec": {"replicas": 0}})),
                ),
            )
            .await?;
        }
    }
    let before = list(ctx, &wf, None, "").await?;
    let mut kept = 0;
    for w in &before {
        let v = serde_json::to_value(w).unwrap_or_default();
        if let Some(p) = migrate::backup(&v) {
            let api = ctx.workflows_of(w);
            call(
                "keeping a v0.12 status",
                api.patch(&w.name_any(), &PatchParams::default(), &Patch::Merge(p)),
            )
            .await?;
            kept += 1;
        }
    }
    if kept > 0 {
        ctx.event(obj, false, "Migrating", format!(
            "{kept} Workflows in tink v0.12's shape: their status is kept in the annotation {} while they are converted",
            migrate::BACKUP)).await;
    }
    apply_crds(ctx, plan).await?;
    let mut converted = 0;
    let mut failed = vec![];
    let after = list(ctx, &wf, None, "").await?;
    for w in after.iter() {
        let v = serde_json::to_value(w).unwrap_or_default();
        if !migrate::kept(&v) {
            continue;
        }
        let name = w.name_any();
        let api = ctx.workflows_of(w);
        let target = match migrate::target(&v) {
            Ok(t) => t.unwrap_or_default(),
            Err(e) => {
                failed.push(format!("{name}: {e}"));
                continue;
            }
        };
        let stored = match migrate::convert(&v) {
            Ok(Some(p)) => match call(
                "converting a status",
                api.patch_status(&name, &PatchParams::default(), &Patch::Merge(p)),
            )
            .await
            {
                Ok(done) => done.data.get("status").cloned().unwrap_or_default(),
                Err(e) => {
                    failed.push(format!("{name}: {e}"));
                    continue;
                }
            },
            Ok(None) => v.get("status").cloned().unwrap_or_default(),
            Err(e) => {
                failed.push(format!("{name}: {e}"));
                continue;
            }
        };
        // An API server still on the old schema drops the new fields and
        // answers 200: the copy stays until the status really is current.
        if desired::holds(&stored, &target) {
            converted += 1;
        } else {
            failed.push(format!(
                "{name}: the API server did not keep the converted status (still the old CRD?)"
            ));
        }
    }
    if !failed.is_empty() {
        let msg = format!(
            "{} of {} Workflows not converted (their old status stays in {}; retrying): {}",
            failed.len(),
            failed.len() + converted,
            migrate::BACKUP,
            failed.join("; ")
        );
        ctx.event(obj, true, "MigrationFailed", msg.clone()).await;
        return Err(Error::Failed(msg));
    }
    for w in after.iter() {
        if !migrate::kept(&serde_json::to_value(w).unwrap_or_default()) {
            continue;
        }
        let api = ctx.workflows_of(w);
        call(
            "dropping a kept status",
            api.patch(
                &w.name_any(),
                &PatchParams::default(),
                &Patch::Merge(migrate::drop_backup()),
            ),
        )
        .await?;
    }
    if converted > 0 {
        ctx.event(
            obj,
            false,
            "Migrated",
            format!(
                "{converted} Workflows converted to {}'s shape",
                plan.release.version
            ),
        )
        .await;
    }
    Ok(converted)
}

/// Each enabled component's health from its Deployment.
async fn health(ctx: &Ctx, plan: &Plan) -> Result<Vec<ComponentStatus>, Error> {
    let api = ctx.api(ManagedKind::Deployment, Some(&plan.namespace));
    let mut out = vec![];
    for (c, _) in &plan.components {
        let d = get_opt(&api, c.name()).await?;
        let v = d.map(|d| serde_json::to_value(d).unwrap_or_default());
        out.push(desired::component_status(*c, &plan.image(*c), v.as_ref()));
    }
    Ok(out)
}

/// Where agents reach tink-server: `spec.publicIP`, else the address its
/// LoadBalancer Service was given; `None` until there is one.
async fn grpc_address(ctx: &Ctx, plan: &Plan) -> Result<Option<String>, Error> {
    if plan.enabled(Component::TinkServer).is_none() {
        return Ok(None);
    }
    let port = release::GRPC_PORT;
    if let Some(ip) = plan.public_ip {
        return Ok(Some(std::net::SocketAddr::new(ip, port as u16).to_string()));
    }
    let api = ctx.api(ManagedKind::Service, Some(&plan.namespace));
    let svc = get_opt(&api, Component::TinkServer.name()).await?;
    Ok(svc.and_then(|s| {
        let ingress = s.data.pointer("/status/loadBalancer/ingress/0")?;
        let host = ingress["ip"].as_str().or(ingress["hostname"].as_str())?;
        Some(match host.parse::<std::net::IpAddr>() {
            Ok(ip) => std::net::SocketAddr::new(ip, port as u16).to_string(),
            Err(_) => format!("{host}:{port}"),
        })
    }))
}

/// Every instance: keep [`Address`] at the gRPC address the oldest
/// reconciled `Tinkerbell` reports, for the iPXE scripts.
pub async fn follow(client: kube::Client, address: Arc<Address>) {
    use kube::runtime::WatchStreamExt;
    let api: Api<DynamicObject> = Api::all_with(client, &resource());
    let store = kube::runtime::reflector::store::Writer::<DynamicObject>::new(resource());
    let reader = store.as_reader();
    let stream = kube::runtime::reflector(store, watcher(api, watcher::Config::default()))
        .default_backoff()
        .touched_objects();
    futures::pin_mut!(stream);
    while let Some(ev) = stream.next().await {
        if let Err(e) = ev {
            tracing::debug!(error = %e, "kube supervisor: watching Tinkerbell resources");
            continue;
        }
        let mut all = reader.state();
        all.sort_by_key(|o| o.metadata.creation_timestamp.as_ref().map(|t| t.0));
        let found = all.iter().find_map(|o| {
            let s = o.data.get("status")?;
            let a = s.get("grpcAddress")?.as_str()?.to_string();
            Some((
                a,
                s.get("grpcTLS").and_then(Value::as_bool).unwrap_or(false),
            ))
        });
        if found != address.get() {
            tracing::info!(address = ?found, "kube supervisor: the Tink server agents are sent to");
            address.set(found);
        }
    }
}
