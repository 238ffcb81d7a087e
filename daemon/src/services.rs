//! The one write path. Every change to the inventory, the BMC state and
//! the Workflows goes through a service here, whoever asks: the admin API,
//! the CLI (through the API), the gRPC workers, the workflow engine, the
//! BMC runner and the Kubernetes mirror. A write is: the store first (one
//! transaction), then the snapshot, then the events, under one lock, so
//! snapshots are published in commit order and a read-modify-write cannot
//! lose another writer's change. In kube mode the services reach the
//! cluster through their own port ([`cluster`]), which `kube` implements.

use crate::bmc::model::{Action, Doc};
use crate::clock::now_ms;
use crate::events::{Event, EventSink, Kind};
use crate::hardware::{self, FieldError, Firmware, Hardware, Key};
use crate::inventory::{Inventory, Patch};
use crate::metrics::Metrics;
use crate::metrics::{ResultLabels, StateLabels};
use crate::store::bmc::{JobKind, JobRow, NewJob};
use crate::store::mirror::MirrorItem;
use crate::store::workflow::WorkflowRow;
use crate::store::{Outcome, Store, StoreError};
use crate::workflow::agent::{self, Refusal, Served};
use crate::workflow::model::{Action as WfAction, State as WfState, Status};
use serde_json::{Value, json};
use std::sync::Arc;
use tokio::sync::{Mutex, Notify};

pub mod cluster;
pub mod discovery;
pub mod metal3;
pub use cluster::{Copy, Link, Owed};
pub use discovery::Discovery;

/// Why a use case refused or failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Bad input, with the field it is about.
    #[error("{0}")]
    Invalid(#[from] FieldError),
    #[error("{0} not found")]
    NotFound(String),
    #[error(transparent)]
    Store(#[from] StoreError),
    /// Kube mode: the write to the cluster failed.
    #[error(transparent)]
    Cluster(#[from] cluster::ClusterError),
}

/// Hardware: apply, delete, and the changes other use cases make to it.
pub struct HardwareService {
    store: Store,
    inventory: Arc<Inventory>,
    events: EventSink,
    metrics: Arc<Metrics>,
    /// Held from the read of a read-modify-write (or the start of a plain
    /// write) to the publication of the snapshot.
    write: Mutex<()>,
    /// Kube mode: changes go to the cluster.
    link: Arc<Link>,
}

impl HardwareService {
    pub fn new(
        store: Store,
        inventory: Arc<Inventory>,
        events: EventSink,
        metrics: Arc<Metrics>,
    ) -> Self {
        metrics.hardware.set(inventory.snapshot().len() as i64);
        HardwareService {
            store,
            inventory,
            events,
            metrics,
            write: Mutex::new(()),
            link: Arc::default(),
        }
    }

    /// Kube mode: the cluster the changes go to.
    pub fn with_link(mut self, link: Arc<Link>) -> Self {
        self.link = link;
        self
    }

    /// Apply a batch atomically. Unchanged documents are not rewritten.
    pub async fn apply(&self, items: Vec<Hardware>) -> Result<Vec<(Key, Outcome)>, StoreError> {
        let _w = self.write.lock().await;
        self.commit(items, &[]).await
    }

    /// Change one Hardware with `edit`, which gets the stored document and
    /// may refuse. The read and the write happen under the write lock, and
    /// the write is checked against the generation that was read: another
    /// writer's change in between is never overwritten.
    ///
    /// In kube mode the change is made in the cluster (the truth), checked
    /// against the resourceVersion read there, then mirrored at once (the
    /// watch brings the same copy again).
    pub async fn update(
        &self,
        key: &Key,
        mut edit: impl FnMut(&mut Value) -> Result<(), FieldError> + Send,
    ) -> Result<Hardware, Error> {
        if let Some(cluster) = self.link.cluster() {
            let mut checked = |d: &mut Value| {
                edit(d)?;
                hardware::validate(crate::kinds::clean(d.clone())).map(|_| ())
            };
            let copy = cluster.update_hardware(key, &mut checked).await?;
            let hw = copy.item.clone();
            // With its resourceVersion: the watch's older copies of it,
            // still on their way, are not mirrored over it.
            self.mirror(Mirrored::One(copy)).await?;
            return Ok(hw);
        }
        let _w = self.write.lock().await;
        let (mut doc, generation) = self
            .store
            .get_versioned(key)
            .await?
            .ok_or_else(|| Error::NotFound(format!("Hardware {key}")))?;
        edit(&mut doc)?;
        let hw = hardware::validate(doc)?;
        self.commit(vec![hw.clone()], &[Some(generation)]).await?;
        Ok(hw)
    }

    async fn commit(
        &self,
        items: Vec<Hardware>,
        expect: &[Option<i64>],
    ) -> Result<Vec<(Key, Outcome)>, StoreError> {
        let outcomes = match self.store.apply_expecting(&items, expect).await {
            Ok(o) => o,
            Err(e) => {
                if matches!(e, StoreError::Conflict { .. } | StoreError::Stale { .. }) {
                    self.metrics.applied("conflict");
                }
                return Err(e);
            }
        };
        Ok(self.published(items, outcomes, vec![], ""))
    }

    /// After a commit: count, record and publish what it wrote and deleted
    /// (`origin` ends the events' messages, e.g. " (mirrored)").
    fn published(
        &self,
        items: Vec<Hardware>,
        outcomes: Vec<Outcome>,
        deleted: Vec<Key>,
        origin: &str,
    ) -> Vec<(Key, Outcome)> {
        let mut patch = Patch::default();
        let mut result = Vec::with_capacity(items.len());
        for (hw, outcome) in items.into_iter().zip(outcomes) {
            let key = hw.machine.key.clone();
            self.metrics.applied(outcome.as_str());
            if outcome != Outcome::Unchanged {
                let kind = match outcome {
                    Outcome::Created => Kind::HardwareCreated,
                    _ => Kind::HardwareUpdated,
                };
                self.events.record(
                    Event::new(kind, format!("Hardware {key} {}{origin}", outcome.as_str()))
                        .machine(key.clone()),
                );
                patch.upsert.push(hw.machine);
            }
            result.push((key, outcome));
        }
        for key in deleted {
            self.metrics.hardware_deletes.inc();
            self.events.record(
                Event::new(
                    Kind::HardwareDeleted,
                    format!("Hardware {key} deleted{origin}"),
                )
                .machine(key.clone()),
            );
            patch.delete.push(key);
        }
        if !patch.upsert.is_empty() || !patch.delete.is_empty() {
            self.publish(patch);
        }
        result
    }

    /// Set annotation `name` to `value` unless the Hardware has it already
    /// (upstream never overwrites the agent's attributes). True if set.
    pub async fn annotate_once(&self, key: &Key, name: &str, value: &str) -> Result<bool, Error> {
        let mut set = false;
        self.update(key, |doc| {
            let meta = &mut doc["metadata"];
            if meta.get("annotations").is_none_or(Value::is_null) {
                meta["annotations"] = json!({});
            }
            let a = &mut meta["annotations"];
            if a.get(name)
                .and_then(Value::as_str)
                .is_some_and(|v| !v.is_empty())
            {
                return Ok(());
            }
            a[name] = Value::String(value.into());
            set = true;
            Ok(())
        })
        .await?;
        Ok(set)
    }

    /// One step of a Hardware's cleaning on release (`cleaning`): the
    /// change to its labels and annotations, checked against what the
    /// step was decided on (a change in between refuses, and the caller
    /// decides again), then its event and count.
    pub async fn cleaning_step(
        &self,
        key: &Key,
        expected: &crate::cleaning::Seen,
        step: &crate::cleaning::Step,
        run: &str,
    ) -> Result<(), Error> {
        use crate::cleaning::{Skip, Step};
        self.update(key, |d| crate::cleaning::edit(d, expected, step, run))
            .await?;
        let (result, message) = match step {
            Step::Hold => (
                "started",
                "released by its owner: held and netbooted to wipe its disks".to_string(),
            ),
            Step::Finish => ("cleaned", "its disks wiped: given back".to_string()),
            Step::Fail(m) => ("failed", format!("cleaning failed, still held: {m}")),
            Step::Unmark(Skip::Unbootable(why)) => {
                ("skipped", format!("released uncleaned: {why}"))
            }
            Step::Unmark(Skip::GivenBack) => (
                "skipped",
                "given back uncleaned (the hold was removed)".to_string(),
            ),
            Step::Mark | Step::Start | Step::Nothing => return Ok(()),
        };
        self.metrics
            .release_cleanings
            .get_or_create(&crate::metrics::ResultLabels { result })
            .inc();
        self.events.record(
            Event::new(Kind::HardwareCleaning, format!("Hardware {key} {message}"))
                .machine(key.clone()),
        );
        Ok(())
    }

    /// Rufio's out-of-band inventory of Hardware `key`, into
    /// `status.attributes.outOfBand` (in kube mode: the cluster's status,
    /// which the watch brings back).
    pub async fn set_out_of_band(&self, key: &Key, out_of_band: Value) -> Result<(), Error> {
        if let Some(cluster) = self.link.cluster() {
            let status = json!({"attributes": {"outOfBand": out_of_band}});
            cluster.hardware_status(key, &status).await?;
            return Ok(());
        }
        self.update(key, |doc| {
            doc["status"]["attributes"]["outOfBand"] = out_of_band.clone();
            Ok(())
        })
        .await?;
        Ok(())
    }

    /// True when the Hardware existed.
    pub async fn delete(&self, key: &Key) -> Result<bool, StoreError> {
        let _w = self.write.lock().await;
        self.delete_locked(key, "").await
    }

    /// [`Self::delete`], the write lock held by the caller.
    async fn delete_locked(&self, key: &Key, origin: &str) -> Result<bool, StoreError> {
        let existed = self.store.delete(key).await?;
        if existed {
            self.published(vec![], vec![], vec![key.clone()], origin);
        }
        Ok(existed)
    }

    /// The Kubernetes mirror's write (`kube::mirror`): the cluster is the
    /// truth. The stored copy of a document the cluster has but tinkerbox
    /// cannot take (the mirror reported it) is kept, as is one newer than
    /// the change's; a MAC or IP two Hardware claim is stored and answers
    /// nothing (`hardware.conflict`, once per conflict).
    pub async fn mirror(&self, change: Mirrored<Hardware>) -> Result<(), StoreError> {
        let _w = self.write.lock().await;
        let (copies, invalid, replace) = match change {
            Mirrored::All { items, invalid } => (items, invalid, true),
            Mirrored::One(c) => (vec![c], vec![], false),
            Mirrored::Gone(key, _) => {
                self.link.forget(crate::kinds::Kind::Hardware, &key);
                self.delete_locked(&key, " (mirrored)").await?;
                return Ok(());
            }
        };
        let (mut items, mut kept) = newest(&self.link, crate::kinds::Kind::Hardware, copies);
        kept.extend(invalid);
        if !replace && items.is_empty() {
            return Ok(());
        }
        if replace && !kept.is_empty() {
            // The last good copy of an object that turned invalid stays.
            for key in &kept {
                if let Some(doc) = self.store.get(key).await?
                    && let Ok(hw) = hardware::validate(doc)
                {
                    items.push(hw);
                }
            }
        }
        let before = self.inventory.snapshot().conflicts();
        let (outcomes, deleted) = self.store.mirror_hardware(&items, replace).await?;
        self.published(items, outcomes, deleted, " (mirrored)");
        for c in self.inventory.snapshot().conflicts() {
            if before.contains(&c) {
                continue;
            }
            let names: Vec<String> = c.machines.iter().map(Key::to_string).collect();
            tracing::warn!(what = %c.what, machines = ?names, "kube: a key is claimed twice");
            for m in &c.machines {
                self.events.record(
                    Event::new(
                        Kind::HardwareConflict,
                        format!(
                            "{} is claimed by {}: no answer for it until one lets go",
                            c.what,
                            names.join(" and ")
                        ),
                    )
                    .machine(m.clone()),
                );
            }
        }
        Ok(())
    }

    fn publish(&self, patch: Patch) {
        let n = self.inventory.apply(patch);
        self.metrics.inventory_swaps.inc();
        self.metrics.hardware.set(n as i64);
    }
}

/// A change the Kubernetes mirror hands a service: checked copies.
pub enum Mirrored<T> {
    /// The whole set (a list's `InitDone`): everything else goes, but the
    /// objects the cluster has that tinkerbox could not take (`invalid`:
    /// their last good copy stays).
    All {
        items: Vec<Copy<T>>,
        invalid: Vec<Key>,
    },
    /// One object created or changed.
    One(Copy<T>),
    /// One object deleted; with its uid, only that object (not one made
    /// again under its name since).
    Gone(Key, Option<String>),
}

/// The copies newer than every copy of their object mirrored so far, and
/// the keys of the older ones (a watch event overtaken by a write already
/// mirrored: the stored copy stays).
fn newest<T>(link: &Link, kind: crate::kinds::Kind, copies: Vec<Copy<T>>) -> (Vec<T>, Vec<Key>) {
    let mut fresh = Vec::with_capacity(copies.len());
    let mut stale = vec![];
    for c in copies {
        if link.newer(kind, &c.key, c.version.as_deref()) {
            fresh.push(c.item);
        } else {
            stale.push(c.key);
        }
    }
    (fresh, stale)
}

/// The Kubernetes mirror's write of a kind other than Hardware; the
/// stored copy of an object the cluster has but tinkerbox could not take,
/// or of one the change has an older copy of, stays.
async fn mirror_objects(
    store: &Store,
    link: &Link,
    kind: crate::kinds::Kind,
    change: Mirrored<MirrorItem>,
    take_status: bool,
) -> Result<(), StoreError> {
    let (copies, invalid, replace) = match change {
        Mirrored::All { items, invalid } => (items, invalid, true),
        Mirrored::One(c) => (vec![c], vec![], false),
        Mirrored::Gone(key, uid) => {
            link.forget(kind, &key);
            store.mirror_delete(kind, &key, uid.as_deref()).await?;
            return Ok(());
        }
    };
    let (items, mut kept) = newest(link, kind, copies);
    kept.extend(invalid);
    if !replace && items.is_empty() {
        return Ok(());
    }
    store
        .mirror_objects(kind, &items, replace, &kept, take_status)
        .await?;
    Ok(())
}

/// BMCs: apply Rufio's documents and Secrets, and start jobs.
pub struct BmcService {
    store: Store,
    events: EventSink,
    /// Wakes the job runner.
    pub wake: Arc<Notify>,
    /// Kube mode: jobs are created in the cluster.
    link: Arc<Link>,
}

impl BmcService {
    pub fn new(store: Store, events: EventSink, wake: Arc<Notify>) -> Self {
        BmcService {
            store,
            events,
            wake,
            link: Arc::default(),
        }
    }

    /// Kube mode: the cluster jobs are created in.
    pub fn with_link(mut self, link: Arc<Link>) -> Self {
        self.link = link;
        self
    }

    /// Apply checked documents in one transaction; the runner is woken
    /// for the jobs among them.
    pub async fn apply(&self, docs: &[Doc]) -> Result<Vec<Outcome>, StoreError> {
        let out = self.store.apply_bmc(docs).await?;
        if docs
            .iter()
            .any(|d| matches!(d, Doc::Job { .. } | Doc::Task { .. }))
        {
            self.wake.notify_one();
        }
        Ok(out)
    }

    /// Store a job of `tasks` for BMC Machine `machine` (named
    /// `<machine>-<what>-<ms>`) and wake the runner; returns its key.
    pub async fn start_job(
        &self,
        machine: &Key,
        what: &str,
        tasks: Vec<Action>,
    ) -> Result<Key, Error> {
        let name = format!("{}-{what}-{}", machine.name, now_ms());
        let key = Key::new(machine.namespace.clone(), name);
        self.put_job(&key, machine, tasks, None).await?;
        Ok(key)
    }

    /// A job under a fixed name, as a Workflow's boot options start them
    /// (`netboot-<workflow>`), made for one run of the Workflow (`run`, the
    /// id of its rendering): a finished job of the name from an earlier run
    /// is replaced, but one this run made already is kept whatever its
    /// state, so a step whose record was lost after the job was made never
    /// makes (and runs) it twice.
    pub async fn start_named_job(
        &self,
        key: &Key,
        machine: &Key,
        tasks: Vec<Action>,
        run: &str,
    ) -> Result<(), Error> {
        self.put_job(key, machine, tasks, Some(run)).await
    }

    /// `run`: replace a job of the name unless it runs or was made for
    /// this run (see [`Self::start_named_job`]); None: a new name.
    async fn put_job(
        &self,
        key: &Key,
        machine: &Key,
        tasks: Vec<Action>,
        run: Option<&str>,
    ) -> Result<(), Error> {
        if self.store.bmc_machine(machine).await?.is_none() {
            return Err(Error::NotFound(format!("BMC Machine {machine}")));
        }
        let mut doc = json!({
            "apiVersion": crate::bmc::model::API_VERSION, "kind": "Job",
            "metadata": {"name": key.name, "namespace": key.namespace},
            "spec": {"machineRef": {"name": machine.name, "namespace": machine.namespace}, "tasks": tasks},
        });
        if let Some(run) = run {
            doc["metadata"]["annotations"] = json!({crate::store::bmc::RUN_ANNOTATION: run});
        }
        if let Some(cluster) = self.link.cluster() {
            // The Job is made where Rufio's callers make it, and stored at
            // once, not when the watch brings it: the engine's next pass
            // must see this Job, not none (it would make another) nor an
            // older one of the name (told apart by uid).
            if let Some(made) = cluster.put_job(key, &doc, run).await? {
                let change = Mirrored::One(made);
                mirror_objects(
                    &self.store,
                    &self.link,
                    crate::kinds::Kind::Job,
                    change,
                    false,
                )
                .await?;
                self.wake.notify_one();
            }
            return Ok(());
        }
        let job = NewJob {
            key,
            kind: JobKind::Job,
            doc: &doc,
            machine: Some(machine),
            connection: None,
            tasks: &tasks,
        };
        match run {
            Some(run) => {
                self.store.replace_job(&job, run).await?;
            }
            None => {
                self.store.insert_job(&job).await?;
            }
        }
        self.wake.notify_one();
        Ok(())
    }

    /// The BMC runner's record of a job's progress, owed to the cluster.
    pub async fn save_job(&self, j: &JobRow) -> Result<(), StoreError> {
        self.store.save_job(j).await?;
        self.link.owe(Owed::Job(j.key()));
        Ok(())
    }

    /// Kube mode: the cluster has job `key`'s status as stored now.
    pub async fn job_durable(&self, key: &Key) -> Result<(), cluster::ClusterError> {
        match self.link.cluster() {
            Some(c) => c.job_durable(key).await,
            None => Ok(()),
        }
    }

    /// A BMC Machine's power state and Contactable condition, as the
    /// runner or its poll found them; owed to the cluster when more than
    /// the time changed.
    pub async fn record_contact(
        &self,
        bmc: &Key,
        power: Option<crate::bmc::PowerState>,
        condition: &Value,
    ) -> Result<(), StoreError> {
        if self.store.set_bmc_status(bmc, power, condition).await? {
            self.link.owe(Owed::Machine(bmc.clone()));
        }
        Ok(())
    }

    /// Remove annotation `name` from BMC Machine `key` (Rufio's
    /// `tinkerbell.org/refresh-inventory`, once done).
    pub async fn remove_machine_annotation(&self, key: &Key, name: &str) -> Result<(), Error> {
        if let Some(cluster) = self.link.cluster() {
            cluster
                .remove_annotation(crate::kinds::Kind::Machine, key, name)
                .await?;
            return Ok(());
        }
        let Some(row) = self.store.bmc_machine(key).await? else {
            return Err(Error::NotFound(format!("BMC Machine {key}")));
        };
        let mut doc = row.doc;
        let Some(a) = doc
            .pointer_mut("/metadata/annotations")
            .and_then(Value::as_object_mut)
        else {
            return Ok(());
        };
        if a.remove(name).is_none() {
            return Ok(());
        }
        let parsed = crate::bmc::model::parse(doc)?;
        self.apply(&[parsed]).await?;
        Ok(())
    }

    /// Rufio's common job for a Hardware: allow PXE on every interface that
    /// netboots, power off, boot from the network once (EFI when the
    /// Hardware says UEFI), power on. The Hardware change goes through
    /// [`HardwareService::update`].
    pub async fn netboot(&self, hw: &HardwareService, key: &Key) -> Result<Key, Error> {
        let changed = hw
            .update(key, |doc| {
                if doc.pointer("/spec/bmcRef/name").is_none() {
                    return Err(FieldError::new(
                        "spec.bmcRef",
                        format!("Hardware {key} has no bmcRef"),
                    ));
                }
                if let Some(Value::Array(ifaces)) = doc.pointer_mut("/spec/interfaces") {
                    for i in ifaces.iter_mut().filter(|i| i.get("dhcp").is_some()) {
                        match i.get_mut("netboot") {
                            Some(Value::Object(n)) => {
                                n.insert("allowPXE".into(), Value::Bool(true));
                            }
                            _ => i["netboot"] = json!({"allowPXE": true}),
                        }
                    }
                }
                Ok(())
            })
            .await?;
        let m = &changed.machine;
        let bmc_name = m.bmc.as_deref().unwrap_or_default();
        let bmc = Key::new(key.namespace.clone(), bmc_name);
        let efi = m.interfaces.iter().any(|i| i.firmware == Firmware::Uefi);
        let tasks = crate::bmc::model::netboot_tasks(efi);
        self.events.record(
            Event::new(
                Kind::BmcNetboot,
                format!("netboot requested through BMC {bmc}"),
            )
            .machine(key.clone()),
        );
        self.start_job(&bmc, "netboot", tasks).await
    }
}

/// Seconds an action took, from its start and stop times.
fn seconds(a: &WfAction) -> Option<u64> {
    let t = |s: &Option<String>| humantime::parse_rfc3339(s.as_deref()?).ok();
    t(&a.execution_stop)?
        .duration_since(t(&a.execution_start)?)
        .ok()
        .map(|d| d.as_secs())
}

/// Read-modify-writes of a Workflow's status lost to another writer are
/// retried this many times before the caller is told to come back.
const WRITE_ATTEMPTS: usize = 8;

/// Why a worker's request was not served.
#[derive(Debug, thiserror::Error)]
pub enum WorkerError {
    #[error(transparent)]
    Refused(#[from] Refusal),
    #[error("the workflow kept changing while this request was applied; try again")]
    Busy,
    /// Kube mode: the cluster did not take the change; the worker tries
    /// again (its answer waits until the change is safe).
    #[error("the cluster did not take this change ({0}); try again")]
    Unavailable(String),
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Templates and Workflows: apply and delete, and every write of a
/// Workflow's status (the engine's steps, the workers' requests), each
/// change of state or of an action's state an event of the Workflow's
/// machine and a metric.
pub struct WorkflowService {
    store: Store,
    events: EventSink,
    metrics: Arc<Metrics>,
    /// Wakes the engine.
    pub wake: Arc<Notify>,
    /// GetAction's refusals by agent, with the store's workflow generation
    /// they were derived at: a rack of finished agents polling every
    /// second is answered from here until a Workflow changes.
    refusals: std::sync::Mutex<Refusals>,
    /// Kube mode: every status written is owed to the cluster.
    link: Arc<Link>,
}

/// Bytes of remembered refusals (ids and messages), at most: then all are
/// forgotten at once. Ids are at most [`agent::AGENT_ID_MAX`] bytes, so
/// this is some 10,000 agents at the worst and far more in practice.
const REFUSALS_MAX_BYTES: usize = 4 << 20;

/// GetAction's remembered refusals, bounded in bytes (a packet chooses
/// the ids).
#[derive(Default)]
struct Refusals {
    by_agent: std::collections::HashMap<String, (u64, Refusal)>,
    bytes: usize,
}

impl Refusals {
    fn get(&self, agent: &str, generation: u64) -> Option<Refusal> {
        self.by_agent
            .get(agent)
            .filter(|(g, _)| *g == generation)
            .map(|(_, r)| r.clone())
    }

    fn put(&mut self, agent: &str, generation: u64, r: Refusal) {
        let cost = |a: &str, r: &Refusal| a.len() + r.to_string().len() + 64;
        let add = cost(agent, &r);
        if self.bytes + add > REFUSALS_MAX_BYTES {
            self.by_agent.clear();
            self.bytes = 0;
        }
        if let Some((_, old)) = self.by_agent.insert(agent.to_string(), (generation, r)) {
            self.bytes = self.bytes.saturating_sub(cost(agent, &old));
        }
        self.bytes += add;
    }
}

impl WorkflowService {
    pub fn new(store: Store, events: EventSink, metrics: Arc<Metrics>, wake: Arc<Notify>) -> Self {
        WorkflowService {
            store,
            events,
            metrics,
            wake,
            refusals: Default::default(),
            link: Arc::default(),
        }
    }

    /// Kube mode: the outbox status goes to.
    pub fn with_link(mut self, link: Arc<Link>) -> Self {
        self.link = link;
        self
    }

    /// Write `next` over the status `row` was read with (StoreError::Stale
    /// if it changed since), then record what changed.
    pub async fn save_status(&self, row: &WorkflowRow, next: &Status) -> Result<i64, StoreError> {
        let v = self
            .store
            .save_workflow_status(&row.key, row.version, next)
            .await?;
        self.link.owe(Owed::Workflow(row.key.clone()));
        self.record(row, next);
        Ok(v)
    }

    fn record(&self, row: &WorkflowRow, next: &Status) {
        let machine = row
            .doc
            .pointer("/spec/hardwareRef")
            .and_then(Value::as_str)
            .filter(|h| !h.is_empty())
            .map(|h| Key::new(row.key.namespace.clone(), h));
        let emit = |e: Event| {
            self.events.record(match &machine {
                Some(m) => e.machine(m.clone()),
                None => e,
            })
        };
        let old = &row.status;
        if old.state != next.state {
            self.metrics
                .workflow_states
                .get_or_create(&StateLabels {
                    state: next.state.as_str(),
                })
                .inc();
            emit(
                Event::new(
                    Kind::WorkflowState,
                    format!("workflow {} is {}", row.key, next.state.as_str()),
                )
                .fields(json!({"workflow": row.key.to_string(), "from": old.state.as_str(), "to": next.state.as_str()})),
            );
        }
        for t in &next.tasks {
            for a in &t.actions {
                let before = old
                    .tasks
                    .iter()
                    .flat_map(|t| &t.actions)
                    .find(|o| o.id == a.id)
                    .map(|o| o.state);
                if before == Some(a.state) {
                    continue;
                }
                let seconds = seconds(a);
                let fields = json!({"workflow": row.key.to_string(), "task": t.name, "action": a.name,
                    "image": a.image, "seconds": seconds, "message": a.message});
                let (kind, what, result) = match a.state {
                    WfState::Running => (Kind::WorkflowActionStarted, "started", None),
                    WfState::Success => {
                        (Kind::WorkflowActionSucceeded, "succeeded", Some("success"))
                    }
                    WfState::Failed => (Kind::WorkflowActionFailed, "failed", Some("failed")),
                    WfState::Timeout => (Kind::WorkflowActionFailed, "timed out", Some("timeout")),
                    _ => continue,
                };
                if let Some(result) = result {
                    self.metrics
                        .workflow_actions
                        .get_or_create(&ResultLabels { result })
                        .inc();
                }
                let took = seconds.map(|s| format!(" after {s}s")).unwrap_or_default();
                emit(Event::new(kind, format!("action {} {what}{took}", a.name)).fields(fields));
            }
        }
    }

    /// Apply checked documents in one transaction.
    pub async fn apply(
        &self,
        templates: &[crate::workflow::model::Template],
        workflows: &[crate::workflow::model::Workflow],
    ) -> Result<(Vec<Outcome>, Vec<Outcome>), StoreError> {
        let out = self.store.apply_tink(templates, workflows).await?;
        self.wake.notify_one();
        Ok(out)
    }

    /// Apply checked WorkflowRuleSets in one transaction.
    pub async fn apply_rulesets(
        &self,
        sets: &[crate::discovery::rules::RuleSet],
    ) -> Result<Vec<Outcome>, StoreError> {
        self.store.apply_rulesets(sets).await
    }

    /// GetAction for `agent`: the action to run, with `currentState`
    /// written first (retried when another writer came between).
    pub async fn get_action(&self, agent: &str) -> Result<Served, WorkerError> {
        agent::check_agent_id(agent)?;
        let remembered = |generation: u64| {
            let m = self.refusals.lock().unwrap_or_else(|e| e.into_inner());
            m.get(agent, generation)
        };
        if let Some(r) = remembered(self.store.workflow_generation()) {
            return Err(r.into());
        }
        for _ in 0..WRITE_ATTEMPTS {
            let generation = self.store.workflow_generation();
            let rows = self.store.workflows_of_agent(agent).await?;
            let served = match agent::next_action(agent, &rows) {
                Ok(s) => s,
                Err(r) => {
                    let mut m = self.refusals.lock().unwrap_or_else(|e| e.into_inner());
                    m.put(agent, generation, r.clone());
                    return Err(r.into());
                }
            };
            let Some(row) = rows.iter().find(|r| r.key == served.workflow) else {
                continue;
            };
            // An agent asking again for the action it runs: nothing to
            // write (no fsync per poll).
            if row.status == served.status {
                return Ok(served);
            }
            match self.save_status(row, &served.status).await {
                Ok(v) => {
                    self.durable(&row.key, v, &served.status).await?;
                    return Ok(served);
                }
                Err(StoreError::Stale { .. }) => continue,
                Err(e) => return Err(e.into()),
            }
        }
        Err(WorkerError::Busy)
    }

    /// Kube mode: a worker's answer waits until the cluster has every
    /// milestone it carries ([`cluster::Cluster::workflow_durable`]).
    async fn durable(&self, key: &Key, version: i64, next: &Status) -> Result<(), WorkerError> {
        let Some(cluster) = self.link.cluster() else {
            return Ok(());
        };
        cluster
            .workflow_durable(key, version, next)
            .await
            .map_err(|e| {
                tracing::warn!(workflow = %key, error = %e, "kube: a worker's change is not in the cluster yet; the worker will retry");
                WorkerError::Unavailable(e.to_string())
            })
    }

    /// A worker's report, applied to the Workflow it names by `apply`
    /// (read, change, write with the version read; retried on a race).
    pub async fn report(
        &self,
        key: &Key,
        apply: impl Fn(&Status) -> Result<Status, Refusal>,
    ) -> Result<Status, WorkerError> {
        for _ in 0..WRITE_ATTEMPTS {
            let Some(row) = self.store.workflow(key).await? else {
                return Err(Refusal::NotFound(format!("workflow {key} not found")).into());
            };
            let next = apply(&row.status)?;
            match self.save_status(&row, &next).await {
                Ok(v) => {
                    self.durable(key, v, &next).await?;
                    // The engine acts on states (POST, ...), not on
                    // action reports: wake it only when the state moved.
                    if next.state != row.status.state {
                        self.wake.notify_one();
                    }
                    return Ok(next);
                }
                Err(StoreError::Stale { .. }) => continue,
                Err(e) => return Err(e.into()),
            }
        }
        Err(WorkerError::Busy)
    }

    pub async fn delete(
        &self,
        kind: crate::store::workflow::TinkKind,
        key: &Key,
    ) -> Result<bool, StoreError> {
        let gone = self.store.delete_tink(kind, key).await?;
        self.wake.notify_one();
        Ok(gone)
    }
}

impl Services {
    /// An object another one owns (a BareMetalHost's Hardware, BMC
    /// Machine, Templates and Workflows), made or brought to `doc` where
    /// objects of its kind live: the cluster (one server-side apply, then
    /// mirrored at once, as the watch would), or the store.
    pub async fn put_owned(&self, doc: Value) -> Result<(), Error> {
        use crate::kinds::Checked;
        let checked = crate::kinds::check(doc.clone())?;
        let kind = checked.kind();
        if let Some(cluster) = self.link.cluster() {
            let meta = &doc["metadata"];
            let key = Key::new(
                meta["namespace"].as_str().unwrap_or("default"),
                meta["name"].as_str().unwrap_or(""),
            );
            let copy = cluster.apply(kind, &key, &doc).await?;
            match crate::kinds::check(copy.item)? {
                Checked::Hardware(hw) => {
                    self.hardware
                        .mirror(Mirrored::One(Copy {
                            key,
                            item: hw,
                            version: copy.version,
                        }))
                        .await?
                }
                c => {
                    let item = Copy {
                        key,
                        item: MirrorItem::new(c),
                        version: copy.version,
                    };
                    // This instance writes their status (it leads).
                    self.mirror(kind, Mirrored::One(item), false).await?
                }
            }
            return Ok(());
        }
        match checked {
            Checked::Hardware(hw) => {
                self.hardware.apply(vec![hw]).await?;
            }
            Checked::Bmc(d) => {
                self.bmc.apply(&[d]).await?;
            }
            Checked::Template(t) => {
                self.workflow.apply(&[t], &[]).await?;
            }
            Checked::Workflow(w) => {
                self.workflow.apply(&[], &[w]).await?;
            }
            _ => {
                return Err(Error::Invalid(FieldError::new(
                    "kind",
                    format!("{} is not a kind one object owns", kind.resource()),
                )));
            }
        }
        Ok(())
    }

    /// An owned object gone, from where objects of its kind live (the
    /// cluster, then the mirror at once; or the store). True when it was
    /// there.
    pub async fn delete_owned(&self, kind: crate::kinds::Kind, key: &Key) -> Result<bool, Error> {
        use crate::kinds::Kind as K;
        use crate::store::workflow::TinkKind;
        let mut gone = false;
        if let Some(cluster) = self.link.cluster() {
            gone = cluster.delete(kind, key).await?;
            if kind == K::Hardware {
                self.hardware
                    .mirror(Mirrored::Gone(key.clone(), None))
                    .await?;
            } else {
                self.mirror(kind, Mirrored::Gone(key.clone(), None), false)
                    .await?;
            }
            return Ok(gone);
        }
        gone |= match kind {
            K::Hardware => self.hardware.delete(key).await?,
            K::Template => self.workflow.delete(TinkKind::Template, key).await?,
            K::Workflow => self.workflow.delete(TinkKind::Workflow, key).await?,
            K::Machine => self.bmc.store.remove_bmc_machine(key).await?,
            // Host mode: a Machine's jobs go with it (the arm before).
            K::Job => false,
            _ => {
                return Err(Error::Invalid(FieldError::new(
                    "kind",
                    format!("{} is not a kind one object owns", kind.resource()),
                )));
            }
        };
        Ok(gone)
    }

    /// The Kubernetes mirror's write of a kind other than Hardware, then
    /// the engine that runs it is woken. `take_status`: the status (a
    /// Workflow's, a Job's outcome) is the cluster's, since another
    /// instance or an upstream controller writes it.
    pub async fn mirror(
        &self,
        kind: crate::kinds::Kind,
        change: Mirrored<MirrorItem>,
        take_status: bool,
    ) -> Result<(), StoreError> {
        use crate::kinds::Kind as K;
        let (store, wake) = match kind {
            K::Template | K::Workflow => (&self.workflow.store, &self.workflow.wake),
            _ => (&self.bmc.store, &self.bmc.wake),
        };
        mirror_objects(store, &self.link, kind, change, take_status).await?;
        wake.notify_one();
        Ok(())
    }
}

/// Every write path, for whoever changes something.
pub struct Services {
    pub hardware: HardwareService,
    pub bmc: BmcService,
    pub workflow: WorkflowService,
    /// Zero touch: agents with no Hardware or no Workflow
    /// (`services/discovery.rs`).
    pub discovery: Discovery,
    /// BareMetalHosts (`services/metal3.rs`).
    pub metal3: metal3::Metal3Service,
    /// Kube mode: the cluster they write to, and the status owed to it.
    pub link: Arc<Link>,
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn service(dir: &tempfile::TempDir) -> (Arc<HardwareService>, Store) {
        let store = Store::open(&dir.path().join("t.db")).await.unwrap();
        let metrics = Arc::new(Metrics::new());
        let (sink, _rx) = crate::events::channel(1 << 16, metrics.clone());
        let inv = Arc::new(Inventory::default());
        (
            Arc::new(HardwareService::new(store.clone(), inv, sink, metrics)),
            store,
        )
    }

    fn doc(labels: Value) -> Hardware {
        hardware::validate(json!({
            "apiVersion": hardware::API_VERSION, "kind": "Hardware",
            "metadata": {"name": "m1", "labels": labels},
            "spec": {"interfaces": [{"dhcp": {"mac": "02:00:00:00:00:01"}}]}}))
        .unwrap()
    }

    /// GetAction writes `currentState` once; an agent polling again for
    /// the action it runs costs no write.
    #[tokio::test]
    async fn asking_again_for_the_same_action_writes_nothing() {
        use crate::workflow::{model, template};
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("t.db")).await.unwrap();
        let metrics = Arc::new(Metrics::new());
        let (sink, _rx) = crate::events::channel(1 << 10, metrics.clone());
        let wf = WorkflowService::new(store.clone(), sink, metrics, Arc::new(Notify::new()));
        let w = model::workflow(json!({"apiVersion": model::API_VERSION, "kind": "Workflow",
            "metadata": {"name": "wf"}, "spec": {"templateRef": "t"}}))
        .unwrap();
        wf.apply(&[], std::slice::from_ref(&w)).await.unwrap();
        let doc = template::parse(
            "name: t\ntasks: [{name: a, worker: w1, actions: [{name: x, image: bash}]}]",
        )
        .unwrap();
        let mut status = model::Status::rendered(&doc);
        status.state = model::State::Pending;
        let row = store.workflow(&w.key).await.unwrap().unwrap();
        wf.save_status(&row, &status).await.unwrap();
        let v0 = store.workflow(&w.key).await.unwrap().unwrap().version;
        let first = wf.get_action("w1").await.unwrap();
        let v1 = store.workflow(&w.key).await.unwrap().unwrap().version;
        assert_eq!(v1, v0 + 1, "currentState written");
        let again = wf.get_action("w1").await.unwrap();
        assert_eq!(again.action.id, first.action.id);
        assert_eq!(
            store.workflow(&w.key).await.unwrap().unwrap().version,
            v1,
            "no second write"
        );
    }

    /// Remembered refusals stay under their byte bound whatever ids come.
    #[test]
    fn remembered_refusals_are_bounded_in_bytes() {
        let mut r = Refusals::default();
        let no = Refusal::NotFound("no Workflows found".into());
        for i in 0..200_000 {
            let id = format!("{i:0>240}");
            r.put(&id, 1, no.clone());
            assert!(r.bytes <= REFUSALS_MAX_BYTES);
        }
        assert!(!r.by_agent.is_empty());
        let last = format!("{:0>240}", 199_999);
        assert_eq!(r.get(&last, 1), Some(no.clone()));
        assert_eq!(r.get(&last, 2), None, "another generation");
        let before = r.bytes;
        r.put(&last, 2, no);
        assert_eq!(r.bytes, before, "replacing an entry costs nothing more");
    }

    /// A watch event older than a copy already mirrored (the answer to
    /// tinkerbox's own write) does not undo it, alone or in a relist; a
    /// newer one is taken.
    #[tokio::test]
    async fn an_older_copy_from_the_cluster_never_replaces_a_newer_one() {
        let dir = tempfile::tempdir().unwrap();
        let (svc, store) = service(&dir).await;
        let copy = |rv: &str, pxe: bool| {
            Copy {
            key: Key::new("default", "m1"),
            item: hardware::validate(json!({"apiVersion": hardware::API_VERSION, "kind": "Hardware",
                "metadata": {"name": "m1", "namespace": "default"},
                "spec": {"interfaces": [{"dhcp": {"mac": "02:00:00:00:00:01"}, "netboot": {"allowPXE": pxe}}]}}))
            .unwrap(),
            version: Some(rv.to_string()),
        }
        };
        let pxe = |d: Value| d["spec"]["interfaces"][0]["netboot"]["allowPXE"].clone();
        let key = Key::new("default", "m1");
        svc.mirror(Mirrored::One(copy("10", true))).await.unwrap();
        svc.mirror(Mirrored::One(copy("9", false))).await.unwrap();
        let d = store.get(&key).await.unwrap().unwrap();
        assert_eq!(pxe(d), true, "the stale event is dropped");
        svc.mirror(Mirrored::All {
            items: vec![copy("8", false)],
            invalid: vec![],
        })
        .await
        .unwrap();
        assert_eq!(
            pxe(store.get(&key).await.unwrap().unwrap()),
            true,
            "a stale relist"
        );
        svc.mirror(Mirrored::One(copy("11", false))).await.unwrap();
        assert_eq!(pxe(store.get(&key).await.unwrap().unwrap()), false);
    }

    #[tokio::test]
    async fn an_annotation_set_once_is_never_overwritten() {
        let dir = tempfile::tempdir().unwrap();
        let (svc, store) = service(&dir).await;
        svc.apply(vec![doc(json!({}))]).await.unwrap();
        let key = Key::new("default", "m1");
        assert!(svc.annotate_once(&key, "a/b", "{\"x\":1}").await.unwrap());
        assert!(!svc.annotate_once(&key, "a/b", "{\"x\":2}").await.unwrap());
        let d = store.get(&key).await.unwrap().unwrap();
        assert_eq!(d["metadata"]["annotations"]["a/b"], "{\"x\":1}");
        assert!(matches!(
            svc.annotate_once(&Key::new("default", "nope"), "a/b", "x")
                .await,
            Err(Error::NotFound(_))
        ));
    }

    /// Concurrent read-modify-writes of one Hardware (what `machine
    /// netboot` does beside a `hardware apply`) all land: none is
    /// overwritten by another that read the document before it.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn concurrent_updates_lose_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let (svc, store) = service(&dir).await;
        svc.apply(vec![doc(json!({}))]).await.unwrap();
        let key = Key::new("default", "m1");
        let tasks: Vec<_> = (0..24)
            .map(|i| {
                let svc = svc.clone();
                let key = key.clone();
                tokio::spawn(async move {
                    svc.update(&key, |d| {
                        d["metadata"]["labels"][format!("l{i}")] = json!("x");
                        Ok(())
                    })
                    .await
                    .unwrap();
                })
            })
            .collect();
        for t in tasks {
            t.await.unwrap();
        }
        let (d, generation) = store.get_versioned(&key).await.unwrap().unwrap();
        let labels = d["metadata"]["labels"].as_object().unwrap();
        assert_eq!(labels.len(), 24, "{labels:?}");
        assert_eq!(generation, 25);
        let snap = svc.inventory.snapshot();
        assert_eq!(snap.len(), 1);
    }

    #[tokio::test]
    async fn an_edit_that_refuses_changes_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let (svc, store) = service(&dir).await;
        svc.apply(vec![doc(json!({}))]).await.unwrap();
        let key = Key::new("default", "m1");
        let r = svc
            .update(&key, |d| {
                d["spec"]["interfaces"][0]["dhcp"]["mac"] = json!("nope");
                Ok(())
            })
            .await;
        assert!(matches!(r, Err(Error::Invalid(e)) if e.field == "spec.interfaces[0].dhcp.mac"));
        assert_eq!(store.get_versioned(&key).await.unwrap().unwrap().1, 1);
        let r = svc.update(&Key::new("default", "nope"), |_| Ok(())).await;
        assert!(matches!(r, Err(Error::NotFound(_))));
    }
}
