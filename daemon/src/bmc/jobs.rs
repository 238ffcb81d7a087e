//! The job runner: executes BMC jobs one task at a time, persisting every
//! step before and after it is sent, with a per-task timeout and retries
//! with backoff. Jobs run concurrently, so an unreachable BMC only holds up
//! its own job. After a restart, a task that was in flight is failed rather
//! than sent again: a job never runs a task twice.

use super::model::{Action, Connection, MachineSpec};
use super::{BmcError, PowerAction, PowerState, Target};
use crate::events::{Event, EventSink};
use crate::hardware::Key;
use crate::inventory::Inventory;
use crate::store::bmc::JobRow;
use crate::store::{Store, now_ms};
use serde_json::json;
use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::Notify;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    Ipmi,
    Redfish,
}

impl Protocol {
    fn name(self) -> &'static str {
        match self {
            Protocol::Ipmi => "ipmi",
            Protocol::Redfish => "redfish",
        }
    }
}

/// How to reach a BMC: one target per protocol, in the order to try them.
pub fn targets(
    c: &Connection,
    username: &str,
    password: &str,
    timeout: Duration,
) -> Vec<(Protocol, Target)> {
    let opts = c.provider_options.clone().unwrap_or_default();
    // `host` may be a URL (http://host:port) for Redfish emulators and labs.
    let (host, url_port, plain) = match c.host.split_once("://") {
        Some((scheme, rest)) => {
            let rest = rest.trim_end_matches('/');
            let (h, p) = match rest.rsplit_once(':') {
                Some((h, p)) if p.parse::<u16>().is_ok() => (h.to_string(), p.parse().ok()),
                _ => (rest.to_string(), None),
            };
            (h, p, scheme == "http")
        }
        None => (c.host.clone(), None, false),
    };
    let base = |port: Option<u16>| Target {
        host: host.clone(),
        port,
        username: username.to_string(),
        password: password.to_string(),
        insecure_tls: c.insecure_tls,
        plain_http: plain,
        basic_auth: false,
        system: None,
        cipher_suite: 3,
        timeout,
    };
    let ipmi = {
        let mut t = base(
            opts.ipmitool
                .as_ref()
                .and_then(|i| i.port)
                .or(c.port)
                .or(Some(623)),
        );
        t.cipher_suite = opts
            .ipmitool
            .as_ref()
            .and_then(|i| i.cipher_suite.as_deref())
            .and_then(|s| s.parse().ok())
            .unwrap_or(3);
        t
    };
    let redfish = {
        let r = opts.redfish.clone().unwrap_or_default();
        let mut t = base(r.port.or(url_port));
        t.basic_auth = r.use_basic_auth;
        t.system = r.system_name;
        t
    };
    let mut order: Vec<Protocol> = opts
        .preferred_order
        .iter()
        .filter_map(|p| match p.to_ascii_lowercase().as_str() {
            "ipmitool" | "ipmi" => Some(Protocol::Ipmi),
            "gofish" | "redfish" => Some(Protocol::Redfish),
            _ => None,
        })
        .collect();
    if order.is_empty() {
        order = if opts.redfish.is_some() || url_port.is_some() || plain {
            vec![Protocol::Redfish, Protocol::Ipmi]
        } else {
            vec![Protocol::Ipmi, Protocol::Redfish]
        };
    }
    order.dedup();
    order
        .into_iter()
        .map(|p| {
            let t = match p {
                Protocol::Ipmi => ipmi.clone(),
                Protocol::Redfish => redfish.clone(),
            };
            (p, t)
        })
        .collect()
}

/// One action against one protocol.
async fn act(p: Protocol, t: &Target, a: &Action) -> Result<Option<PowerState>, BmcError> {
    if let Some(pa) = a.power_action {
        return match p {
            Protocol::Ipmi => super::ipmi::power(t, pa).await.map(Some),
            Protocol::Redfish => super::redfish::power(t, pa).await.map(Some),
        };
    }
    if let Some((dev, persistent, efi)) = a.boot() {
        return match p {
            Protocol::Ipmi => super::ipmi::set_boot_device(t, dev, persistent, efi)
                .await
                .map(|_| None),
            Protocol::Redfish => super::redfish::set_boot_device(t, dev, persistent, efi)
                .await
                .map(|_| None),
        };
    }
    Err(BmcError::Protocol("a task with no action".into()))
}

pub struct Runner {
    pub store: Store,
    pub inventory: Arc<Inventory>,
    pub events: EventSink,
    pub wake: Arc<Notify>,
    /// Per attempt of a task.
    pub task_timeout: Duration,
    /// Attempts per task (backoff 1 s, 2 s, 4 s, ... between them).
    pub attempts: u32,
    running: Mutex<HashSet<i64>>,
}

impl Runner {
    pub fn new(
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
            wake: Arc::new(Notify::new()),
            task_timeout,
            attempts: attempts.max(1),
            running: Mutex::new(HashSet::new()),
        }
    }

    /// Recover from the last run, then start pending jobs as they come.
    pub async fn run(self: Arc<Self>) {
        if let Err(e) = self.recover().await {
            tracing::error!(error = %e, "bmc: recovering jobs failed");
        }
        loop {
            match self.store.jobs(Some("pending")).await {
                Ok(jobs) => {
                    for j in jobs {
                        let fresh = self
                            .running
                            .lock()
                            .map(|mut r| r.insert(j.id))
                            .unwrap_or(false);
                        if fresh {
                            tokio::spawn(self.clone().execute(j));
                        }
                    }
                }
                Err(e) => tracing::error!(error = %e, "bmc: reading pending jobs failed"),
            }
            tokio::select! {
                _ = self.wake.notified() => {}
                _ = tokio::time::sleep(Duration::from_secs(2)) => {}
            }
        }
    }

    /// Jobs left `running` by a crash: a task that was in flight may or may
    /// not have reached the BMC, so it is failed, never sent again; a job
    /// stopped between tasks goes on from the next one.
    async fn recover(&self) -> Result<(), crate::store::StoreError> {
        for mut j in self.store.jobs(Some("running")).await? {
            if let Some((i, t)) = j
                .task_states
                .iter_mut()
                .enumerate()
                .find(|(_, t)| t.state == "running")
            {
                t.state = "failed".into();
                t.message = Some("interrupted by a restart while in flight; not sent again".into());
                j.state = "failed".into();
                j.message = Some(format!("task {i} was interrupted by a restart"));
                j.completed_ms = Some(now_ms());
                tracing::warn!(job = %j.key(), task = i, "bmc: job interrupted by a restart marked failed");
            } else {
                j.state = "pending".into();
                tracing::info!(job = %j.key(), "bmc: resuming job after a restart");
            }
            self.store.save_job(&j).await?;
        }
        Ok(())
    }

    /// The Hardware whose bmcRef names this BMC, for the event log.
    fn hardware_of(&self, bmc: &Key) -> Key {
        let snap = self.inventory.snapshot();
        snap.machines()
            .find(|m| {
                m.key.namespace == bmc.namespace && m.bmc_ref().is_some_and(|r| r.name == bmc.name)
            })
            .map(|m| m.key.clone())
            .unwrap_or_else(|| bmc.clone())
    }

    async fn resolve(&self, j: &JobRow) -> Result<(Option<Key>, Vec<(Protocol, Target)>), String> {
        let (bmc, conn) = match (&j.machine, &j.connection) {
            (Some(k), _) => {
                let row = self
                    .store
                    .bmc_machine(k)
                    .await
                    .map_err(|e| e.to_string())?
                    .ok_or_else(|| format!("no BMC Machine {k}"))?;
                let spec: MachineSpec =
                    serde_json::from_value(row.doc.get("spec").cloned().unwrap_or_default())
                        .map_err(|e| format!("Machine {k}: {e}"))?;
                (Some(k.clone()), spec.connection)
            }
            (None, Some(c)) => (None, c.clone()),
            (None, None) => return Err("job names no machine and no connection".into()),
        };
        let secret_ns = |r: &super::model::SecretRef| {
            r.namespace.clone().unwrap_or_else(|| {
                bmc.as_ref()
                    .map(|b| b.namespace.clone())
                    .unwrap_or_else(|| j.namespace.clone())
            })
        };
        let (user, pass) = match &conn.auth_secret_ref {
            Some(r) => {
                let key = Key::new(secret_ns(r), r.name.clone());
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
        Ok((bmc, targets(&conn, &user, &pass, self.task_timeout)))
    }

    async fn execute(self: Arc<Self>, mut j: JobRow) {
        let key = j.key();
        j.state = "running".into();
        j.started_ms.get_or_insert(now_ms());
        if let Err(e) = self.store.save_job(&j).await {
            tracing::error!(job = %key, error = %e, "bmc: cannot save job");
            self.done(j.id);
            return;
        }
        let resolved = self.resolve(&j).await;
        let (bmc, targets) = match resolved {
            Ok(x) => x,
            Err(why) => {
                self.finish(&mut j, "failed", Some(why)).await;
                return;
            }
        };
        let subject = bmc.as_ref().map(|b| self.hardware_of(b));
        for i in 0..j.tasks.len() {
            if j.task_states.get(i).is_some_and(|t| t.state == "completed") {
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
                    t.state = "running".into();
                    t.attempts += 1;
                }
                if self.store.save_job(&j).await.is_err() {
                    last_err = "cannot persist the task before sending it".into();
                    break;
                }
                let mut auth_failed = false;
                for (p, t) in &targets {
                    // Hard deadline around the protocol's own timeouts.
                    let r = tokio::time::timeout(
                        self.task_timeout + Duration::from_secs(1),
                        act(*p, t, &action),
                    )
                    .await;
                    match r {
                        Ok(Ok(power)) => {
                            if let Some(ts) = j.task_states.get_mut(i) {
                                ts.state = "completed".into();
                                ts.protocol = Some(p.name().into());
                                ts.message = power.map(|s| format!("power is {}", state_word(s)));
                            }
                            self.contact(bmc.as_ref(), power, None).await;
                            self.note(subject.as_ref(), &action, power, p.name());
                            done = true;
                            break;
                        }
                        Ok(Err(e)) => {
                            auth_failed |= matches!(e, BmcError::Auth(_));
                            last_err = format!("{}: {e}", p.name());
                        }
                        Err(_) => {
                            last_err =
                                format!("{}: no answer within {:?}", p.name(), self.task_timeout)
                        }
                    }
                }
                if done || auth_failed {
                    break;
                }
            }
            if !done {
                if let Some(t) = j.task_states.get_mut(i) {
                    t.state = "failed".into();
                    t.message = Some(last_err.clone());
                }
                self.contact(bmc.as_ref(), None, Some(&last_err)).await;
                if let Some(s) = &subject {
                    self.events.record(
                        Event::new(
                            "bmc.failed",
                            format!("{} failed: {last_err}", action.describe()),
                        )
                        .machine(s.clone()),
                    );
                }
                self.finish(
                    &mut j,
                    "failed",
                    Some(format!("task {i} ({}): {last_err}", action.describe())),
                )
                .await;
                return;
            }
            if self.store.save_job(&j).await.is_err() {
                tracing::error!(job = %key, "bmc: cannot save task completion");
            }
        }
        self.finish(&mut j, "completed", None).await;
    }

    /// Read every BMC's power state every `every`; a change is an event of
    /// the Hardware that references the BMC. Unreachable BMCs become
    /// not Contactable. One BMC at a time: polling is background work.
    pub async fn poll(self: Arc<Self>, every: Duration) {
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tick.tick().await;
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
                let ns = row
                    .doc
                    .pointer("/metadata/namespace")
                    .and_then(|v| v.as_str())
                    .unwrap_or("default");
                let name = row
                    .doc
                    .pointer("/metadata/name")
                    .and_then(|v| v.as_str())
                    .unwrap_or("");
                let key = Key::new(ns, name);
                let probe = JobRow {
                    id: 0,
                    namespace: key.namespace.clone(),
                    name: String::new(),
                    kind: "poll".into(),
                    machine: Some(key.clone()),
                    connection: None,
                    tasks: vec![],
                    state: String::new(),
                    task_states: vec![],
                    message: None,
                    created_ms: 0,
                    started_ms: None,
                    completed_ms: None,
                };
                let Ok((bmc, targets)) = self.resolve(&probe).await else {
                    continue;
                };
                let status = Action {
                    power_action: Some(PowerAction::Status),
                    ..Action::default()
                };
                let mut last_err = None;
                let mut state = None;
                for (p, t) in &targets {
                    match tokio::time::timeout(
                        self.task_timeout + Duration::from_secs(1),
                        act(*p, t, &status),
                    )
                    .await
                    {
                        Ok(Ok(s)) => {
                            state = s;
                            break;
                        }
                        Ok(Err(e)) => last_err = Some(format!("{}: {e}", p.name())),
                        Err(_) => {
                            last_err = Some(format!(
                                "{}: no answer within {:?}",
                                p.name(),
                                self.task_timeout
                            ))
                        }
                    }
                }
                match state {
                    Some(s) => {
                        // Store the new state first: whoever sees the event
                        // must also see it in the Machine's status.
                        self.contact(bmc.as_ref(), Some(s), None).await;
                        if row.power_state != state_word(s) && row.power_state != "unknown" {
                            let subject = self.hardware_of(&key);
                            self.events.record(
                                Event::new(
                                    "bmc.power_changed",
                                    format!(
                                        "power changed from {} to {}",
                                        row.power_state,
                                        state_word(s)
                                    ),
                                )
                                .machine(subject),
                            );
                        }
                    }
                    None => self.contact(bmc.as_ref(), None, last_err.as_deref()).await,
                }
            }
        }
    }

    fn note(&self, subject: Option<&Key>, a: &Action, power: Option<PowerState>, protocol: &str) {
        let Some(s) = subject else { return };
        let kind = if a.power_action.is_some() {
            "bmc.power"
        } else {
            "bmc.bootdev"
        };
        let msg = match (a.power_action, power) {
            (Some(PowerAction::Status), Some(p)) => {
                format!("power status: {} ({protocol})", state_word(p))
            }
            (Some(_), Some(p)) => format!(
                "{} done, power is {} ({protocol})",
                a.describe(),
                state_word(p)
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
        if let Err(e) = self
            .store
            .set_bmc_status(b, power.map(state_word), &cond)
            .await
        {
            tracing::warn!(error = %e, "bmc: cannot save status");
        }
    }

    async fn finish(&self, j: &mut JobRow, state: &str, message: Option<String>) {
        j.state = state.into();
        j.message = message;
        j.completed_ms = Some(now_ms());
        if let Err(e) = self.store.save_job(j).await {
            tracing::error!(job = %j.key(), error = %e, "bmc: cannot save job");
        }
        tracing::info!(job = %j.key(), state, message = j.message.as_deref().unwrap_or(""), "bmc: job finished");
        self.done(j.id);
    }

    fn done(&self, id: i64) {
        if let Ok(mut r) = self.running.lock() {
            r.remove(&id);
        }
    }
}

pub fn state_word(s: PowerState) -> &'static str {
    match s {
        PowerState::On => "on",
        PowerState::Off => "off",
        PowerState::Unknown => "unknown",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
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

    #[test]
    fn protocol_order_and_ports() {
        let t = targets(&conn("10.0.0.5", None), "u", "p", Duration::from_secs(5));
        assert_eq!(
            t.iter().map(|x| x.0).collect::<Vec<_>>(),
            [Protocol::Ipmi, Protocol::Redfish]
        );
        assert_eq!(t[0].1.port, Some(623));
        assert_eq!(t[1].1.port, None, "Redfish picks 443 itself");
        let t = targets(
            &conn("http://127.0.0.1:8000", None),
            "u",
            "p",
            Duration::from_secs(5),
        );
        assert_eq!(t[0].0, Protocol::Redfish);
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
        let t = targets(&conn("bmc", Some(opts)), "u", "p", Duration::from_secs(5));
        assert_eq!(t[0].0, Protocol::Ipmi);
        assert_eq!((t[0].1.port, t[0].1.cipher_suite), (Some(6230), 17));
        assert_eq!(
            (t[1].1.port, t[1].1.basic_auth, t[1].1.system.as_deref()),
            (Some(8443), true, Some("sys1"))
        );
    }
}
