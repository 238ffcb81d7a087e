//! The job runner: executes BMC jobs one task at a time, persisting every
//! step before and after it is sent, with a per-task timeout and retries
//! with backoff. Jobs run concurrently, so an unreachable BMC only holds up
//! its own job. After a restart, a task that was in flight is failed rather
//! than sent again: a job never runs a task twice.

use super::model::{Action, Connection, MachineSpec, SecretRef};
use super::{BmcError, PowerAction, PowerState, Protocol, Target};
use crate::clock::now_ms;
use crate::events::{Event, EventSink, Kind};
use crate::hardware::Key;
use crate::inventory::Inventory;
use crate::services::Services;
use crate::store::Store;
use crate::store::bmc::{JobRow, State};
use serde_json::{Value, json};
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use std::time::SystemTime;

/// How often the power state is read again until it shows a power action.
const SETTLE_EVERY: Duration = Duration::from_secs(1);

/// One protocol and how to reach the BMC with it.
pub type Way = (&'static dyn Protocol, Target);

/// How to reach a BMC: one target per protocol, in the order to try them,
/// each protocol once.
pub fn targets(
    c: &Connection,
    username: &str,
    password: &str,
    timeout: Duration,
) -> Result<Vec<Way>, String> {
    let opts = c.provider_options.clone().unwrap_or_default();
    let addr = c.address()?;
    let base = |port: Option<u16>| Target {
        host: addr.host.clone(),
        port,
        username: username.to_string(),
        password: password.to_string(),
        insecure_tls: c.insecure_tls,
        plain_http: addr.plain_http,
        basic_auth: false,
        system: None,
        cipher_suite: super::ipmi::CIPHER_SUITE,
        timeout,
    };
    // A port in a bare host is IPMI's (Rufio's `port`); in a URL, Redfish's.
    let bare_port = addr.port.filter(|_| !addr.url);
    let url_port = addr.port.filter(|_| addr.url);
    let ipmi = {
        let mut t = base(
            opts.ipmitool
                .as_ref()
                .and_then(|i| i.port)
                .or(c.port)
                .or(bare_port)
                .or(Some(super::ipmi::DEFAULT_PORT)),
        );
        t.cipher_suite = opts
            .ipmitool
            .as_ref()
            .and_then(|i| i.cipher_suite.as_deref())
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(super::ipmi::CIPHER_SUITE);
        t
    };
    let redfish = {
        let r = opts.redfish.clone().unwrap_or_default();
        let mut t = base(r.port.or(url_port));
        t.basic_auth = r.use_basic_auth;
        t.system = r.system_name;
        t
    };
    let mut order: Vec<&'static dyn Protocol> = Vec::new();
    for p in &opts.preferred_order {
        let proto: &'static dyn Protocol = match p.to_ascii_lowercase().as_str() {
            "ipmitool" | "ipmi" => &super::ipmi::Ipmi,
            "gofish" | "redfish" => &super::redfish::Redfish,
            _ => continue,
        };
        // Each protocol once, at its first place: `[ipmitool, redfish,
        // ipmi]` must not try IPMI twice per attempt.
        if !order.iter().any(|o| o.name() == proto.name()) {
            order.push(proto);
        }
    }
    if order.is_empty() {
        order = if opts.redfish.is_some() || addr.url {
            vec![&super::redfish::Redfish, &super::ipmi::Ipmi]
        } else {
            vec![&super::ipmi::Ipmi, &super::redfish::Redfish]
        };
    }
    Ok(order
        .into_iter()
        .map(|p| {
            let t = match p.name() {
                "ipmi" => ipmi.clone(),
                _ => redfish.clone(),
            };
            (p, t)
        })
        .collect())
}

/// How often the inventory collector looks for work, and the longest one
/// BMC's inventory may take to read.
const INSPECT_PASS: Duration = Duration::from_secs(15);
const INSPECT_LIMIT: Duration = Duration::from_secs(120);
/// How soon a Hardware not yet due (or opted out) is looked at again.
const INSPECT_RECHECK: Duration = Duration::from_secs(300);
/// Rufio's annotations: on a Machine, read its inventory now; on a
/// Hardware, never read it.
pub const REFRESH_INVENTORY: &str = "tinkerbell.org/refresh-inventory";
pub const DISABLE_INVENTORY: &str = "tinkerbell.org/disable-outofband-inventory";

fn annotation<'a>(doc: &'a Value, name: &str) -> Option<&'a str> {
    doc.pointer("/metadata/annotations")?.get(name)?.as_str()
}

/// Whether Hardware `key` (`hw`), whose BMC Machine is `machine`, is to
/// have its inventory read now, and whether because of the Machine's
/// refresh annotation.
fn wants_inventory(
    machine: &Value,
    hw: &Value,
    key: &Key,
    every: Duration,
    now: SystemTime,
) -> Option<bool> {
    if annotation(hw, DISABLE_INVENTORY) == Some("true") {
        return None;
    }
    let refresh = annotation(machine, REFRESH_INVENTORY) == Some("true");
    (refresh || inventory_due(hw, key, every, now)).then_some(refresh)
}

/// Whether Hardware `key` (document `doc`) is due for an inventory read:
/// never read, or last read more than `every` ago, give or take 10%
/// chosen by its name.
fn inventory_due(doc: &Value, key: &Key, every: Duration, now: SystemTime) -> bool {
    let Some(last) = doc
        .pointer("/status/attributes/outOfBand/lastUpdated")
        .and_then(Value::as_str)
        .and_then(|t| humantime::parse_rfc3339_weak(t).ok())
    else {
        return true;
    };
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    key.hash(&mut h);
    // -10% .. +10% of `every`.
    let permille = (h.finish() % 201) as f64 - 100.0;
    let wait = every.mul_f64(1.0 + permille / 1000.0);
    now.duration_since(last).is_ok_and(|age| age >= wait)
}

/// One action against one protocol.
async fn act(p: &dyn Protocol, t: &Target, a: &Action) -> Result<Option<PowerState>, BmcError> {
    if let Some(pa) = a.power_action {
        return p.power(t, pa).await.map(Some);
    }
    if let Some((dev, persistent, efi)) = a.boot() {
        return p
            .set_boot_device(t, dev, persistent, efi)
            .await
            .map(|_| None);
    }
    if let Some(v) = &a.virtual_media_action {
        return p.virtual_media(t, v.kind, &v.media_url).await.map(|_| None);
    }
    Err(BmcError::Protocol("a task with no action".into()))
}

/// Why no protocol carried out an action.
struct Failure {
    /// The last protocol's error, named (`redfish: ...`).
    message: String,
    /// Retrying will not help: a protocol refused the credentials, or the
    /// BMC accepted the action and did not carry it out.
    give_up: bool,
}

/// Try `a` on each way in turn, each under a hard deadline around the
/// protocol's own timeouts; the first that succeeds answers (with the
/// power state it reported, and its name).
async fn try_each(
    ways: &[Way],
    a: &Action,
    timeout: Duration,
) -> Result<(Option<PowerState>, &'static str), Failure> {
    let mut fail = Failure {
        message: "no protocol to try".into(),
        give_up: false,
    };
    let mut tried = false;
    for (p, t) in ways {
        match tokio::time::timeout(timeout + Duration::from_secs(1), act(*p, t, a)).await {
            Ok(Ok(power)) => return Ok((power, p.name())),
            Ok(Err(e)) => {
                fail.give_up |= matches!(e, BmcError::Auth(_));
                // A protocol without the operation says less than one
                // that tried it and failed.
                if !matches!(e, BmcError::Unsupported(_)) || !tried {
                    fail.message = format!("{}: {e}", p.name());
                }
                tried |= !matches!(e, BmcError::Unsupported(_));
            }
            Err(_) => {
                fail.message = format!("{}: no answer within {timeout:?}", p.name());
                tried = true;
            }
        }
    }
    Err(fail)
}

pub struct Runner {
    pub store: Store,
    pub inventory: Arc<Inventory>,
    pub events: EventSink,
    /// Per attempt of a task.
    pub task_timeout: Duration,
    /// Attempts per task (backoff 1 s, 2 s, 4 s, ... between them).
    pub attempts: u32,
    running: Mutex<HashSet<i64>>,
    /// Every write (a job's progress, a Machine's status) goes through
    /// the BMC service, which owes it to the cluster in kube mode.
    services: Arc<Services>,
}

impl Runner {
    pub fn new(
        services: Arc<Services>,
        store: Store,
        inventory: Arc<Inventory>,
        events: EventSink,
        task_timeout: Duration,
        attempts: u32,
    ) -> Self {
        Runner {
            store,
            inventory,
            events,
            task_timeout,
            attempts: attempts.max(1),
            running: Mutex::new(HashSet::new()),
            services,
        }
    }

    /// Persist a job's progress (through the BMC service).
    async fn save(&self, j: &JobRow) -> Result<(), crate::store::StoreError> {
        self.services.bmc.save_job(j).await
    }

    /// Recover from the last run, then start pending jobs as they come.
    pub async fn run(self: Arc<Self>) {
        // The jobs' tasks belong to this run: aborting it (the leadership
        // lost) aborts them all, none outlives the leadership that began it.
        let mut tasks = tokio::task::JoinSet::new();
        if let Ok(mut r) = self.running.lock() {
            r.clear(); // none from an earlier run is still going
        }
        if let Err(e) = self.recover().await {
            tracing::error!(error = %e, "bmc: recovering jobs failed");
        }
        loop {
            while tasks.try_join_next().is_some() {}
            match self.store.jobs(Some(State::Pending)).await {
                Ok(jobs) => {
                    for j in jobs {
                        let fresh = self
                            .running
                            .lock()
                            .map(|mut r| r.insert(j.id))
                            .unwrap_or(false);
                        if fresh {
                            tasks.spawn(self.clone().execute(j));
                        }
                    }
                }
                Err(e) => tracing::error!(error = %e, "bmc: reading pending jobs failed"),
            }
            tokio::select! {
                _ = self.services.bmc.wake.notified() => {}
                _ = tokio::time::sleep(Duration::from_secs(2)) => {}
            }
        }
    }

    /// Jobs left `running` by a crash: a task that was in flight may or may
    /// not have reached the BMC, so it is failed, never sent again; a job
    /// stopped between tasks goes on from the next one.
    async fn recover(&self) -> Result<(), crate::store::StoreError> {
        for mut j in self.store.jobs(Some(State::Running)).await? {
            if let Some((i, t)) = j
                .task_states
                .iter_mut()
                .enumerate()
                .find(|(_, t)| t.state == State::Running)
            {
                t.state = State::Failed;
                t.message = Some("interrupted by a restart while in flight; not sent again".into());
                t.completed_ms = Some(now_ms());
                j.state = State::Failed;
                j.message = Some(format!("task {i} was interrupted by a restart"));
                j.completed_ms = Some(now_ms());
                tracing::warn!(job = %j.key(), task = i, "bmc: job interrupted by a restart marked failed");
            } else {
                j.state = State::Pending;
                tracing::info!(job = %j.key(), "bmc: resuming job after a restart");
            }
            self.save(&j).await?;
        }
        Ok(())
    }

    /// The Hardware whose `bmcRef` is this BMC, if any.
    fn referencing(&self, bmc: &Key) -> Option<Key> {
        let snap = self.inventory.snapshot();
        snap.machines()
            .find(|m| {
                m.key.namespace == bmc.namespace && m.bmc.as_deref() == Some(bmc.name.as_str())
            })
            .map(|m| m.key.clone())
    }

    /// Whose log a BMC's event goes to: its Hardware's, else its own.
    fn hardware_of(&self, bmc: &Key) -> Key {
        self.referencing(bmc).unwrap_or_else(|| bmc.clone())
    }

    /// The ways to reach the BMC of a job: a BMC Machine by name (`bmc`),
    /// or a Task's own connection; credentials from the Secret it names,
    /// in the BMC's namespace unless it says otherwise (`namespace`: the
    /// job's, for a Task).
    async fn resolve(
        &self,
        bmc: Option<&Key>,
        connection: Option<&Connection>,
        namespace: &str,
    ) -> Result<Vec<Way>, String> {
        let conn = match (bmc, connection) {
            (Some(k), _) => {
                let row = self
                    .store
                    .bmc_machine(k)
                    .await
                    .map_err(|e| e.to_string())?
                    .ok_or_else(|| format!("no BMC Machine {k}"))?;
                if let Some(why) = crate::kinds::disabled(&row.doc) {
                    return Err(format!(
                        "BMC Machine {k} is disabled ({}: {why})",
                        crate::kinds::DISABLED
                    ));
                }
                let spec: MachineSpec =
                    serde_json::from_value(row.doc.get("spec").cloned().unwrap_or_default())
                        .map_err(|e| format!("Machine {k}: {e}"))?;
                spec.connection
            }
            (None, Some(c)) => c.clone(),
            (None, None) => return Err("job names no machine and no connection".into()),
        };
        let ns = bmc.map_or(namespace, |b| b.namespace.as_str());
        let (user, pass) = match &conn.auth_secret_ref {
            Some(SecretRef { name, namespace }) => {
                let key = Key::new(namespace.as_deref().unwrap_or(ns), name.clone());
                let c = self
                    .store
                    .secret(&key)
                    .await
                    .map_err(|e| e.to_string())?
                    .ok_or_else(|| format!("no Secret {key} with the BMC credentials"))?;
                (c.username, c.password)
            }
            None => (String::new(), String::new()),
        };
        targets(&conn, &user, &pass, self.task_timeout)
    }

    async fn execute(self: Arc<Self>, mut j: JobRow) {
        let key = j.key();
        j.state = State::Running;
        j.started_ms.get_or_insert(now_ms());
        if let Err(e) = self.save(&j).await {
            tracing::error!(job = %key, error = %e, "bmc: cannot save job");
            self.done(j.id);
            return;
        }
        // Kube mode: the cluster knows the job runs before any command is
        // sent, so a leader after this one never sends it again (it finds
        // the job Running and fails it instead). Not recorded: not run,
        // tried again by the next pass.
        if let Err(e) = self.services.bmc.job_durable(&key).await {
            tracing::warn!(job = %key, error = %e, "bmc: the cluster did not take the job's start; not sending anything yet");
            j.state = State::Pending;
            if let Err(e) = self.save(&j).await {
                tracing::error!(job = %key, error = %e, "bmc: cannot save job");
            }
            self.done(j.id);
            return;
        }
        let bmc = j.machine.clone();
        let ways = match self
            .resolve(bmc.as_ref(), j.connection.as_ref(), &j.namespace)
            .await
        {
            Ok(w) => w,
            Err(why) => {
                self.finish(&mut j, State::Failed, Some(why)).await;
                return;
            }
        };
        let subject = bmc.as_ref().map(|b| self.hardware_of(b));
        for i in 0..j.tasks.len() {
            if j.task_states
                .get(i)
                .is_some_and(|t| t.state == State::Completed)
            {
                continue;
            }
            let action = j.tasks[i].clone();
            let mut last_err = String::new();
            let mut done = false;
            for attempt in 0..self.attempts {
                if attempt > 0 {
                    tokio::time::sleep(Duration::from_secs(1 << (attempt - 1).min(4))).await;
                }
                if let Some(t) = j.task_states.get_mut(i) {
                    t.state = State::Running;
                    t.attempts += 1;
                    t.started_ms.get_or_insert(now_ms());
                }
                if self.save(&j).await.is_err() {
                    last_err = "cannot persist the task before sending it".into();
                    break;
                }
                let outcome = match try_each(&ways, &action, self.task_timeout).await {
                    Ok((power, protocol)) => self
                        .settle(&ways, protocol, action.power_action, power)
                        .await
                        .map(|power| (power, protocol))
                        .map_err(|message| Failure {
                            message: format!("{protocol}: {message}"),
                            // Accepted: Rufio does not send it again either.
                            give_up: true,
                        }),
                    Err(f) => Err(f),
                };
                match outcome {
                    Ok((power, protocol)) => {
                        if let Some(ts) = j.task_states.get_mut(i) {
                            ts.state = State::Completed;
                            ts.completed_ms = Some(now_ms());
                            ts.protocol = Some(protocol.into());
                            ts.message = power.map(|s| format!("power is {}", s.as_str()));
                        }
                        self.contact(bmc.as_ref(), power, None).await;
                        self.note(subject.as_ref(), &action, power, protocol);
                        done = true;
                        break;
                    }
                    Err(f) => {
                        last_err = f.message;
                        if f.give_up {
                            break;
                        }
                    }
                }
            }
            if !done {
                if let Some(t) = j.task_states.get_mut(i) {
                    t.state = State::Failed;
                    t.message = Some(last_err.clone());
                    t.completed_ms = Some(now_ms());
                }
                self.contact(bmc.as_ref(), None, Some(&last_err)).await;
                if let Some(s) = &subject {
                    self.events.record(
                        Event::new(
                            Kind::BmcFailed,
                            format!("{} failed: {last_err}", action.describe()),
                        )
                        .machine(s.clone()),
                    );
                }
                self.finish(
                    &mut j,
                    State::Failed,
                    Some(format!("task {i} ({}): {last_err}", action.describe())),
                )
                .await;
                return;
            }
            if self.save(&j).await.is_err() {
                tracing::error!(job = %key, "bmc: cannot save task completion");
            }
        }
        self.finish(&mut j, State::Completed, None).await;
    }

    /// After a power action, the state the BMC reports once it has acted:
    /// a task is Completed only when power reads back as asked (on, or off
    /// after a hard or soft off), as Rufio's task controller checks before
    /// it completes a Task. What the action answered is not enough (Redfish
    /// answers the state it asked for; IPMI BMCs report the old state for a
    /// moment after accepting a change; a soft off waits on the host's
    /// ACPI), so the state is read through the protocol that took the
    /// action, at once and then every second, all within the task timeout.
    /// Other actions answer with what they reported.
    async fn settle(
        &self,
        ways: &[Way],
        protocol: &str,
        action: Option<PowerAction>,
        reported: Option<PowerState>,
    ) -> Result<Option<PowerState>, String> {
        let want = match action {
            Some(PowerAction::On) => PowerState::On,
            Some(PowerAction::Off | PowerAction::Soft) => PowerState::Off,
            _ => return Ok(reported),
        };
        let way: Vec<Way> = ways
            .iter()
            .filter(|(p, _)| p.name() == protocol)
            .cloned()
            .collect();
        let status = Action {
            power_action: Some(PowerAction::Status),
            ..Action::default()
        };
        let deadline = tokio::time::Instant::now() + self.task_timeout;
        let mut seen = None;
        loop {
            let read =
                tokio::time::timeout_at(deadline, try_each(&way, &status, self.task_timeout));
            if let Ok(Ok((Some(p), _))) = read.await {
                seen = Some(p);
            }
            if seen == Some(want) {
                return Ok(seen);
            }
            if tokio::time::Instant::now() + SETTLE_EVERY >= deadline {
                return Err(format!(
                    "the BMC accepted power {} but still reports power {} after {:?}",
                    action.map_or("?", PowerAction::as_str),
                    seen.map_or("unknown", PowerState::as_str),
                    self.task_timeout
                ));
            }
            tokio::time::sleep(SETTLE_EVERY).await;
        }
    }

    /// Read every BMC's power state every `every`; a change is an event of
    /// the Hardware that references the BMC. Unreachable BMCs become
    /// not Contactable. One BMC at a time: polling is background work.
    pub async fn poll(self: Arc<Self>, every: Duration) {
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tick.tick().await;
        let status = Action {
            power_action: Some(PowerAction::Status),
            ..Action::default()
        };
        loop {
            tick.tick().await;
            let machines = match self.store.bmc_machines(None).await {
                Ok(m) => m,
                Err(e) => {
                    tracing::warn!(error = %e, "bmc: cannot list machines to poll");
                    continue;
                }
            };
            for row in machines {
                if crate::kinds::disabled(&row.doc).is_some() {
                    continue;
                }
                let key = row.key.clone();
                let Ok(ways) = self.resolve(Some(&key), None, &key.namespace).await else {
                    continue;
                };
                match try_each(&ways, &status, self.task_timeout).await {
                    Ok((Some(s), _)) => {
                        // Store the new state first: whoever sees the event
                        // must also see it in the Machine's status.
                        self.contact(Some(&key), Some(s), None).await;
                        if row.power_state != s && row.power_state != PowerState::Unknown {
                            let subject = self.hardware_of(&key);
                            self.events.record(
                                Event::new(
                                    Kind::BmcPowerChanged,
                                    format!(
                                        "power changed from {} to {}",
                                        row.power_state.as_str(),
                                        s.as_str()
                                    ),
                                )
                                .machine(subject),
                            );
                        }
                    }
                    Ok((None, _)) => self.contact(Some(&key), None, None).await,
                    Err(f) => self.contact(Some(&key), None, Some(&f.message)).await,
                }
            }
        }
    }

    /// Rufio's inventory collection: for each Hardware whose BMC Machine
    /// speaks Redfish (its first way), the BMC's inventory into the
    /// Hardware's `status.attributes.outOfBand`, every `every` (±10%, by
    /// the Hardware's name, so a rack is not read at once), at the next
    /// pass when the Machine has `tinkerbell.org/refresh-inventory: "true"`
    /// (removed once done), never for a Hardware with
    /// `tinkerbell.org/disable-outofband-inventory: "true"`. When it was
    /// last read is the status's `lastUpdated`: a restart does not read
    /// every BMC again.
    pub async fn inspect(self: Arc<Self>, every: Duration) {
        let mut tick = tokio::time::interval(INSPECT_PASS);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // When each Hardware is next worth reading from the store: a pass
        // over a rack reads only the documents that may be due (or whose
        // Machine asks for a refresh), not every one every 15 s.
        let mut not_before: HashMap<Key, SystemTime> = HashMap::new();
        let recheck = every.min(INSPECT_RECHECK);
        loop {
            tick.tick().await;
            let machines = match self.store.bmc_machines(None).await {
                Ok(m) => m,
                Err(e) => {
                    tracing::warn!(error = %e, "bmc: cannot list machines to inspect");
                    continue;
                }
            };
            // Each BMC's Hardware, from one pass over the snapshot.
            let snap = self.inventory.snapshot();
            let owners: HashMap<(&str, &str), &Key> = snap
                .machines()
                .filter_map(|m| Some(((m.key.namespace.as_str(), m.bmc.as_deref()?), &m.key)))
                .collect();
            not_before.retain(|k, _| snap.by_key(k).is_some());
            for row in machines {
                if crate::kinds::disabled(&row.doc).is_some() {
                    continue;
                }
                let Some(hw) = owners
                    .get(&(row.key.namespace.as_str(), row.key.name.as_str()))
                    .map(|k| (*k).clone())
                else {
                    continue;
                };
                let now = SystemTime::now();
                if annotation(&row.doc, REFRESH_INVENTORY) != Some("true")
                    && not_before.get(&hw).is_some_and(|t| now < *t)
                {
                    continue;
                }
                let doc = match self.store.get(&hw).await {
                    Ok(Some(d)) => d,
                    _ => continue,
                };
                let Some(refresh) = wants_inventory(&row.doc, &doc, &hw, every, now) else {
                    not_before.insert(hw, now + recheck);
                    continue;
                };
                let ways = match self.resolve(Some(&row.key), None, &row.key.namespace).await {
                    Ok(w) => w,
                    Err(_) => continue,
                };
                let Some((_, target)) = ways.first().filter(|(p, _)| p.name() == "redfish") else {
                    // Not a Redfish BMC: asked again after `every`.
                    not_before.insert(hw, now + every);
                    continue;
                };
                let read =
                    tokio::time::timeout(INSPECT_LIMIT, super::redfish::inventory(target)).await;
                let oob = match read {
                    Ok(Ok(r)) => super::inventory::out_of_band(
                        &r,
                        &humantime::format_rfc3339_seconds(SystemTime::now()).to_string(),
                    ),
                    Ok(Err(e)) => {
                        tracing::warn!(bmc = %row.key, error = %e, "bmc: inventory not read");
                        continue;
                    }
                    Err(_) => {
                        tracing::warn!(bmc = %row.key, "bmc: inventory not read within {INSPECT_LIMIT:?}");
                        continue;
                    }
                };
                if let Err(e) = self.services.hardware.set_out_of_band(&hw, oob).await {
                    tracing::warn!(hardware = %hw, error = %e, "bmc: inventory not saved");
                    continue;
                }
                // Never due again before 90% of `every` (the jitter's low end).
                not_before.insert(hw.clone(), now + every.mul_f64(0.9));
                self.events.record(
                    Event::new(
                        Kind::BmcInventory,
                        format!("out-of-band inventory read from BMC {} (redfish)", row.key),
                    )
                    .machine(hw.clone()),
                );
                if refresh
                    && let Err(e) = self
                        .services
                        .bmc
                        .remove_machine_annotation(&row.key, REFRESH_INVENTORY)
                        .await
                {
                    tracing::warn!(bmc = %row.key, error = %e, "bmc: refresh annotation not removed");
                }
            }
        }
    }

    fn note(&self, subject: Option<&Key>, a: &Action, power: Option<PowerState>, protocol: &str) {
        let Some(s) = subject else { return };
        let kind = if a.power_action.is_some() {
            Kind::BmcPower
        } else if a.virtual_media_action.is_some() {
            Kind::BmcMedia
        } else {
            Kind::BmcBootdev
        };
        let msg = match (a.power_action, power) {
            (Some(PowerAction::Status), Some(p)) => {
                format!("power status: {} ({protocol})", p.as_str())
            }
            (Some(_), Some(p)) => format!(
                "{} done, power is {} ({protocol})",
                a.describe(),
                p.as_str()
            ),
            _ => format!("{} done ({protocol})", a.describe()),
        };
        self.events.record(
            Event::new(kind, msg)
                .machine(s.clone())
                .fields(json!({"protocol": protocol})),
        );
    }

    /// Rufio's status: powerState and the Contactable condition.
    async fn contact(&self, bmc: Option<&Key>, power: Option<PowerState>, err: Option<&str>) {
        let Some(b) = bmc else { return };
        let cond = json!({
            "type": "Contactable",
            "status": if err.is_none() { "True" } else { "False" },
            "message": err.unwrap_or(""),
            "lastUpdateTime": humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string(),
        });
        if let Err(e) = self.services.bmc.record_contact(b, power, &cond).await {
            tracing::warn!(error = %e, "bmc: cannot save status");
        }
    }

    async fn finish(&self, j: &mut JobRow, state: State, message: Option<String>) {
        j.state = state;
        j.message = message;
        j.completed_ms = Some(now_ms());
        if let Err(e) = self.save(j).await {
            tracing::error!(job = %j.key(), error = %e, "bmc: cannot save job");
        }
        // Kube mode: the outcome in the cluster at once, not behind the
        // outbox (a leader after this one would find the job Running).
        if let Err(e) = self.services.bmc.job_durable(&j.key()).await {
            tracing::warn!(job = %j.key(), error = %e, "bmc: the job's outcome is not in the cluster yet; the outbox keeps it");
        }
        tracing::info!(job = %j.key(), state = state.as_str(), message = j.message.as_deref().unwrap_or(""), "bmc: job finished");
        self.done(j.id);
    }

    fn done(&self, id: i64) {
        if let Ok(mut r) = self.running.lock() {
            r.remove(&id);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inventory_is_read_when_due_refreshed_or_never_when_opted_out() {
        let key = Key::new("default", "node-1");
        let day = Duration::from_secs(86400);
        let now = humantime::parse_rfc3339("2026-11-26T12:00:00Z").unwrap();
        let read_at =
            |t: &str| json!({"status": {"attributes": {"outOfBand": {"lastUpdated": t}}}});
        let m = json!({});
        assert_eq!(
            wants_inventory(&m, &json!({}), &key, day, now),
            Some(false),
            "never read"
        );
        let fresh = read_at("2026-11-26T11:00:00Z");
        assert_eq!(wants_inventory(&m, &fresh, &key, day, now), None);
        let old = read_at("2026-11-24T11:00:00Z");
        assert_eq!(wants_inventory(&m, &old, &key, day, now), Some(false));
        // Within the +-10% band the answer depends on the name, not on luck.
        let edge = read_at("2026-11-25T12:00:00Z");
        let a = wants_inventory(&m, &edge, &key, day, now);
        assert_eq!(a, wants_inventory(&m, &edge, &key, day, now));
        let refresh = json!({"metadata": {"annotations": {REFRESH_INVENTORY: "true"}}});
        assert_eq!(
            wants_inventory(&refresh, &fresh, &key, day, now),
            Some(true)
        );
        let mut opted_out = old.clone();
        opted_out["metadata"] = json!({"annotations": {DISABLE_INVENTORY: "true"}});
        assert_eq!(wants_inventory(&refresh, &opted_out, &key, day, now), None);
    }
    use crate::bmc::model::{IpmitoolOptions, ProviderOptions, RedfishOptions};

    fn conn(host: &str, opts: Option<ProviderOptions>) -> Connection {
        Connection {
            host: host.into(),
            port: None,
            auth_secret_ref: None,
            insecure_tls: true,
            provider_options: opts,
        }
    }

    fn ways(c: &Connection) -> Vec<Way> {
        targets(c, "u", "p", Duration::from_secs(5)).unwrap()
    }

    fn names(w: &[Way]) -> Vec<&'static str> {
        w.iter().map(|(p, _)| p.name()).collect()
    }

    #[test]
    fn protocol_order_and_ports() {
        let t = ways(&conn("10.0.0.5", None));
        assert_eq!(names(&t), ["ipmi", "redfish"]);
        assert_eq!(t[0].1.port, Some(623));
        assert_eq!(t[1].1.port, None, "Redfish picks 443 itself");
        let t = ways(&conn("http://127.0.0.1:8000", None));
        assert_eq!(names(&t), ["redfish", "ipmi"]);
        assert!(t[0].1.plain_http);
        assert_eq!(
            (t[0].1.host.as_str(), t[0].1.port),
            ("127.0.0.1", Some(8000))
        );
        let opts = ProviderOptions {
            ipmitool: Some(IpmitoolOptions {
                port: Some(6230),
                cipher_suite: Some("17".into()),
            }),
            redfish: Some(RedfishOptions {
                port: Some(8443),
                use_basic_auth: true,
                system_name: Some("sys1".into()),
            }),
            preferred_order: vec!["ipmitool".into(), "gofish".into()],
        };
        let t = ways(&conn("bmc", Some(opts)));
        assert_eq!(names(&t), ["ipmi", "redfish"]);
        assert_eq!((t[0].1.port, t[0].1.cipher_suite), (Some(6230), 17));
        assert_eq!(
            (t[1].1.port, t[1].1.basic_auth, t[1].1.system.as_deref()),
            (Some(8443), true, Some("sys1"))
        );
    }

    /// `dedup()` removed only adjacent duplicates: IPMI was tried twice
    /// per attempt.
    #[test]
    fn each_protocol_is_tried_once() {
        let opts = |order: &[&str]| ProviderOptions {
            preferred_order: order.iter().map(|s| s.to_string()).collect(),
            ..ProviderOptions::default()
        };
        for (order, want) in [
            (
                &["ipmitool", "redfish", "ipmi"][..],
                &["ipmi", "redfish"][..],
            ),
            (
                &["gofish", "ipmitool", "redfish", "gofish"],
                &["redfish", "ipmi"],
            ),
            (&["redfish", "nonsense"], &["redfish"]),
        ] {
            let t = ways(&conn("10.0.0.5", Some(opts(order))));
            assert_eq!(names(&t), want, "{order:?}");
        }
    }

    #[test]
    fn ipv6_bmcs_get_their_ports() {
        let t = ways(&conn("[fd00::5]:6230", None));
        assert_eq!(names(&t), ["ipmi", "redfish"]);
        assert_eq!((t[0].1.host.as_str(), t[0].1.port), ("fd00::5", Some(6230)));
        assert_eq!(t[1].1.port, None);
        let t = ways(&conn("http://[fd00::5]:8000", None));
        assert_eq!((t[0].1.host.as_str(), t[0].1.port), ("fd00::5", Some(8000)));
        assert!(targets(&conn("http://h/x", None), "u", "p", Duration::from_secs(1)).is_err());
    }

    /// A protocol that answers every call with one error.
    struct Failing(&'static str, fn() -> BmcError);

    impl Protocol for Failing {
        fn name(&self) -> &'static str {
            self.0
        }
        fn power<'a>(&'a self, _: &'a Target, _: PowerAction) -> crate::bmc::Call<'a, PowerState> {
            let e = (self.1)();
            Box::pin(async move { Err(e) })
        }
        fn set_boot_device<'a>(
            &'a self,
            _: &'a Target,
            _: crate::bmc::BootDevice,
            _: bool,
            _: bool,
        ) -> crate::bmc::Call<'a, ()> {
            let e = (self.1)();
            Box::pin(async move { Err(e) })
        }
        fn virtual_media<'a>(
            &'a self,
            _: &'a Target,
            _: crate::bmc::model::MediaKind,
            _: &'a str,
        ) -> crate::bmc::Call<'a, ()> {
            let e = (self.1)();
            Box::pin(async move { Err(e) })
        }
    }

    static NO_MEDIA: Failing = Failing("ipmi", || BmcError::Unsupported("no virtual media".into()));
    static REFUSED: Failing = Failing("redfish", || {
        BmcError::Protocol("HTTP 400: bad image".into())
    });

    /// The error a job reports is the one of a protocol that tried, not of
    /// one that cannot do the operation, whatever their order.
    #[tokio::test]
    async fn an_unsupported_operation_does_not_hide_the_real_error() {
        let c = conn("10.0.0.9", None);
        let t = targets(&c, "u", "p", Duration::from_secs(1)).unwrap()[0]
            .1
            .clone();
        let a = Action {
            virtual_media_action: Some(crate::bmc::model::VirtualMediaAction {
                kind: crate::bmc::model::MediaKind::Cd,
                media_url: "http://x/a.iso".into(),
            }),
            ..Action::default()
        };
        for order in [[&NO_MEDIA, &REFUSED], [&REFUSED, &NO_MEDIA]] {
            let ways: Vec<Way> = order
                .iter()
                .map(|p| (*p as &'static dyn Protocol, t.clone()))
                .collect();
            let Err(f) = try_each(&ways, &a, Duration::from_secs(1)).await else {
                panic!("succeeded")
            };
            assert_eq!(f.message, "redfish: HTTP 400: bad image");
        }
        let only: Vec<Way> = vec![(&NO_MEDIA as &'static dyn Protocol, t)];
        let Err(f) = try_each(&only, &a, Duration::from_secs(1)).await else {
            panic!("succeeded")
        };
        assert_eq!(f.message, "ipmi: no virtual media");
    }
}
