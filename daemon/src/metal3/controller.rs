//! The lifecycle controller: the tokio shell around [`super::state`]. Each
//! pass reads every host, observes its parts (its Secret, BMC Machine and
//! jobs, Workflows), steps the state machine, saves the status (checked
//! against the version read) and then does what the step asked, through
//! the services. Woken by every write to a host, else every few seconds
//! (the Workflows and BMC jobs it watches change under it).

use super::model::{self, Host, ProvisioningState};
use super::owned::{self, Operation};
use super::state::{self, Do, Observed, Run};
use crate::bmc::PowerAction;
use crate::bmc::model::Action;
use crate::clock::now_ms;
use crate::hardware::Key;
use crate::kinds::Kind;
use crate::services::Services;
use crate::services::metal3::{HostData, Metal3Service};
use crate::store::metal3::{HostRow, rfc3339};
use crate::store::{Store, StoreError};
use serde_json::Value;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

/// A host with something under way (a Workflow, a BMC job) is looked at
/// this often, woken or not: those change under it unannounced.
const PASS_EVERY: Duration = Duration::from_secs(2);

/// A host at rest (available, provisioned, waiting out a back-off) this
/// often (BMO polls its power every minute): a rack of them costs little.
const STEADY_EVERY: Duration = Duration::from_secs(20);

/// States in which the host's parts change under it.
fn transient(s: ProvisioningState) -> bool {
    use ProvisioningState as S;
    matches!(
        s,
        S::None
            | S::Registering
            | S::Inspecting
            | S::MatchProfile
            | S::Preparing
            | S::Provisioning
            | S::Deprovisioning
            | S::PoweringOffBeforeDelete
            | S::Deleting
    )
}

pub struct Controller {
    store: Store,
    services: Arc<Services>,
    /// `http://<public_ip>:<port>`: where the agents send inspection
    /// reports.
    http_base: String,
}

#[derive(Debug, thiserror::Error)]
enum PassError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Service(#[from] crate::services::Error),
}

impl Controller {
    pub fn new(store: Store, services: Arc<Services>, http_base: String) -> Self {
        Controller {
            store,
            services,
            http_base,
        }
    }

    pub async fn run(self) {
        let wake = self.services.metal3.wake.clone();
        // When each host is next looked at, and at which version: a host
        // written since (a version changed) is looked at once.
        let mut due: HashMap<Key, (i64, tokio::time::Instant)> = HashMap::new();
        loop {
            match self.store.hosts(None).await {
                Ok(hosts) => {
                    let now = tokio::time::Instant::now();
                    let mut next = HashMap::with_capacity(hosts.len());
                    for row in hosts {
                        let key = row.key.clone();
                        let version = row.version;
                        if let Some((v, at)) = due.get(&key)
                            && *v == version
                            && now < *at
                        {
                            next.insert(key, (*v, *at));
                            continue;
                        }
                        // Keyed on the version after the pass's own write.
                        let (wait, v) = match self.one(row).await {
                            Ok(done) => done,
                            Err(e) => {
                                tracing::warn!(host = %key, error = %e, "metal3: pass failed; next pass retries");
                                (PASS_EVERY, version)
                            }
                        };
                        next.insert(key, (v, now + wait));
                    }
                    due = next;
                }
                Err(e) => tracing::warn!(error = %e, "metal3: cannot list BareMetalHosts"),
            }
            tokio::select! {
                _ = wake.notified() => {}
                _ = tokio::time::sleep(PASS_EVERY) => {}
            }
        }
    }

    /// One pass over one host: how long until it needs another, and its
    /// version after the pass.
    async fn one(&self, row: HostRow) -> Result<(Duration, i64), PassError> {
        let mut version = row.version;
        // The stored document was checked at apply; one that no longer
        // reads (an older build's) is left alone, with the reason logged.
        let host = match model::host(row.doc.clone()) {
            Ok(h) => h,
            Err(e) => {
                tracing::warn!(host = %row.key, error = %e, "metal3: stored host does not read; skipped");
                return Ok((STEADY_EVERY, version));
            }
        };
        // Kube mode: BMO's finalizer first, so that a delete waits for
        // the host to be taken down.
        self.services.metal3.hold(&host).await?;
        let (obs, data) = self.observe(&host, &row).await?;
        let step = state::step(&host, &row.status, &row.private, &obs, jitter());
        let mut private = step.private.clone();
        let mut doc = None;
        for d in &step.todo {
            match d {
                Do::Inspect | Do::Provision { .. } => private.token = token(),
                Do::RemoveAnnotation(a) => {
                    let base = doc.as_ref().unwrap_or(&row.doc);
                    if let Some(d) = Metal3Service::without_annotation(base, a) {
                        doc = Some(d);
                    }
                }
                _ => {}
            }
        }
        // Saved before a finalize too: "deleting" is then a state a user
        // sees (and an event), as with BMO, not skipped.
        if step.status != row.status || private != row.private || doc.is_some() {
            match self
                .services
                .metal3
                .save(&row, doc.as_ref(), &step.status, &private)
                .await
            {
                Ok(v) => version = v,
                // Changed under this pass: the next one reads it again.
                Err(StoreError::Stale { .. }) => return Ok((PASS_EVERY, version)),
                Err(e) => return Err(e.into()),
            }
        }
        let row_status = row.status.clone();
        let saved = HostRow {
            status: step.status.clone(),
            private: private.clone(),
            ..row
        };
        // Something under way: a job or Workflow running, a power change
        // not seen yet.
        let running = [
            &obs.register,
            &obs.inspection,
            &obs.provision,
            &obs.deprovision,
            &obs.power_job,
        ]
        .iter()
        .any(|r| matches!(r, Run::Running));
        let power_pending = private.power_target.is_some_and(|t| obs.power != Some(t));
        let busy = !step.todo.is_empty() || step.status != row_status || running || power_pending;
        for d in step.todo {
            self.carry_out(&host, &saved, data.as_ref(), d).await?;
        }
        let wait = if busy || transient(saved.status.provisioning.state) {
            PASS_EVERY
        } else {
            STEADY_EVERY
        };
        Ok((wait, version))
    }

    async fn observe(
        &self,
        host: &Host,
        row: &HostRow,
    ) -> Result<(Observed, Option<HostData>), PassError> {
        let now_ms = u64::try_from(now_ms()).unwrap_or(0);
        let ns = &host.key.namespace;
        let credentials = match host.spec.bmc.as_ref().map(|b| b.credentials_name.as_str()) {
            None | Some("") => Err("spec.bmc.credentialsName is not set".to_string()),
            Some(name) => {
                let k = Key::new(ns.clone(), name);
                match self.store.secret_version(&k).await? {
                    Some(v) => Ok(v.to_string()),
                    None => Err(format!(
                        "the BMC credentials Secret {k} was not found (it needs keys username and password)"
                    )),
                }
            }
        };
        let machine = self.store.bmc_machine(&host.key).await?;
        let power = machine.and_then(|m| match m.power_state {
            crate::bmc::PowerState::On => Some(true),
            crate::bmc::PowerState::Off => Some(false),
            crate::bmc::PowerState::Unknown => None,
        });
        let p = &row.private;
        let run = p.run.to_string();
        let uid = host
            .uid()
            .map(String::from)
            .unwrap_or_else(|| row.status.provisioning.id.clone());
        // The data Secrets, read when the host provisions or is about to:
        // a missing one is the provisioning error BMO reports; one that
        // cannot be read now (the cluster not answering) fails the pass,
        // which the next one tries again.
        let data = match row.status.provisioning.state {
            ProvisioningState::Available | ProvisioningState::Ready
                if host.spec.image().is_none() =>
            {
                None
            }
            ProvisioningState::Available
            | ProvisioningState::Ready
            | ProvisioningState::Provisioning
            | ProvisioningState::Provisioned => {
                Some(self.services.metal3.host_data(host, &uid).await?)
            }
            _ => None,
        };
        let host_data = match &data {
            Some(Err(m)) => Err(m.clone()),
            _ => Ok(()),
        };
        let obs = Observed {
            now_ms,
            now: rfc3339(i64::try_from(now_ms).unwrap_or(0)),
            credentials,
            register: self.job(&job_key(host, "register"), &run).await?,
            power,
            inspection: self.workflow(host, Operation::Inspect, &run).await?,
            // A live ISO's provisioning is its netboot job.
            provision: if live_iso(host).is_some() {
                self.job(&job_key(host, "provision"), &run).await?
            } else {
                self.workflow(host, Operation::Provision, &run).await?
            },
            deprovision: self.workflow(host, Operation::Deprovision, &run).await?,
            power_job: self
                .job(&job_key(host, "power"), &p.power_seq.to_string())
                .await?,
            // Only a host with none yet gets one (a fresh UUID per pass
            // would cost a syscall for nothing).
            node_id: if row.status.provisioning.id.is_empty() {
                host.uid().map_or_else(uuid_v4, String::from)
            } else {
                String::new()
            },
            host_data,
        };
        Ok((obs, data.and_then(Result::ok)))
    }

    async fn job(&self, key: &Key, run: &str) -> Result<Run, PassError> {
        use crate::store::bmc::State;
        Ok(match self.store.job_run(key).await? {
            Some(j) if j.run.as_deref() == Some(run) => match j.state {
                State::Pending | State::Running => Run::Running,
                State::Completed => Run::Succeeded,
                State::Failed => {
                    Run::Failed(j.message.unwrap_or_else(|| "the BMC job failed".into()))
                }
            },
            _ => Run::None,
        })
    }

    async fn workflow(&self, host: &Host, op: Operation, run: &str) -> Result<Run, PassError> {
        Ok(self
            .store
            .workflow(&op.key(&host.key))
            .await?
            .map_or(Run::None, |w| w.run(owned::RUN_ANNOTATION, run)))
    }

    async fn carry_out(
        &self,
        host: &Host,
        row: &HostRow,
        data: Option<&HostData>,
        d: Do,
    ) -> Result<(), PassError> {
        let s = &self.services;
        match d {
            Do::EnsureParts => self.ensure_parts(host, row, data).await?,
            Do::CheckBmc => {
                let status = Action {
                    power_action: Some(PowerAction::Status),
                    ..Action::default()
                };
                s.bmc
                    .start_named_job(
                        &job_key(host, "register"),
                        &host.key,
                        vec![status],
                        &row.private.run.to_string(),
                    )
                    .await?;
            }
            Do::Power(on) => {
                let a = Action {
                    power_action: Some(if on {
                        PowerAction::On
                    } else {
                        PowerAction::Off
                    }),
                    ..Action::default()
                };
                s.bmc
                    .start_named_job(
                        &job_key(host, "power"),
                        &host.key,
                        vec![a],
                        &row.private.power_seq.to_string(),
                    )
                    .await?;
            }
            Do::Inspect => {
                let callback = format!(
                    "{}/metal3/v1/inspection/{}/{}/{}",
                    self.http_base, host.key.namespace, host.key.name, row.private.token
                );
                let actions = owned::inspect_actions(host, &callback);
                self.operation(host, row, data, Operation::Inspect, actions)
                    .await?;
            }
            Do::Provision { .. } if live_iso(host).is_some() => {
                // The Hardware boots the ISO (ensure_parts), then one
                // netboot through the BMC, as a job of this run.
                self.ensure_parts(host, row, data).await?;
                let efi = host.spec.boot_mode.unwrap_or_default() != model::BootMode::Legacy;
                s.bmc
                    .start_named_job(
                        &job_key(host, "provision"),
                        &host.key,
                        crate::bmc::model::netboot_tasks(efi),
                        &row.private.run.to_string(),
                    )
                    .await?;
            }
            Do::Provision { disk } => {
                let Some(image) = host.spec.image() else {
                    return Ok(());
                };
                let drive = format!(
                    "{}/metal3/v1/configdrive/{}/{}/{}",
                    self.http_base, host.key.namespace, host.key.name, row.private.token
                );
                let actions = owned::provision_actions(host, image, &disk, &drive);
                self.operation(host, row, data, Operation::Provision, actions)
                    .await?;
            }
            Do::Deprovision => {
                self.operation(
                    host,
                    row,
                    data,
                    Operation::Deprovision,
                    owned::deprovision_actions(),
                )
                .await?;
            }
            Do::SaveHardwareData(report) => s.metal3.save_hardware_data(row, &report).await?,
            // Done in the status write (kube mode: in the cluster too).
            Do::RemoveAnnotation(name) => s.metal3.remove_annotation(&host.key, name).await?,
            Do::Finalize => self.finalize(host).await?,
        }
        Ok(())
    }

    /// The host's Hardware and BMC Machine, made or brought up to date
    /// (an apply of the same documents changes nothing).
    async fn ensure_parts(
        &self,
        host: &Host,
        row: &HostRow,
        data: Option<&HostData>,
    ) -> Result<(), PassError> {
        let s = &self.services;
        if let Some(bmc) = &host.bmc {
            // A BMC Machine of the name that is not this host's is the
            // user's, as a Hardware is (below).
            if let Some(m) = self.store.bmc_machine(&host.key).await?
                && !owned_by(&m.doc, host)
            {
                return Err(not_ours("BMC Machine", host));
            }
            s.put_owned(owned::machine(host, bmc)).await?;
        }
        let id = if row.status.provisioning.id.is_empty() {
            host.uid().unwrap_or(&host.key.name).to_string()
        } else {
            row.status.provisioning.id.clone()
        };
        let user_data = data.and_then(|d| d.user_data.as_deref());
        // A live ISO boots while the host is provisioned with it.
        let iso = live_iso(host).filter(|_| {
            matches!(
                row.status.provisioning.state,
                ProvisioningState::Provisioning | ProvisioningState::Provisioned
            )
        });
        let hw = owned::hardware(host, &id, user_data, iso);
        // A Hardware of the name that is not this host's is the user's:
        // never taken over.
        if let Some(existing) = self.store.get(&host.key).await?
            && !owned_by(&existing, host)
        {
            return Err(not_ours("Hardware", host));
        }
        s.put_owned(hw).await?;
        Ok(())
    }

    /// A new run of `op`: its Template written, the Workflow of an earlier
    /// run deleted and this run's made (netbooted by the engine).
    async fn operation(
        &self,
        host: &Host,
        row: &HostRow,
        data: Option<&HostData>,
        op: Operation,
        actions: Vec<Value>,
    ) -> Result<(), PassError> {
        self.ensure_parts(host, row, data).await?;
        let (t, w) = owned::operation(host, op, row.private.run, actions);
        let s = &self.services;
        // A new Workflow, not the earlier run's changed: the engine runs
        // a Workflow once.
        s.delete_owned(Kind::Workflow, &op.key(&host.key)).await?;
        s.put_owned(t).await?;
        s.put_owned(w).await?;
        Ok(())
    }

    /// Everything the host owns, then the host.
    async fn finalize(&self, host: &Host) -> Result<(), PassError> {
        let s = &self.services;
        for op in [
            Operation::Inspect,
            Operation::Provision,
            Operation::Deprovision,
        ] {
            let k = op.key(&host.key);
            s.delete_owned(Kind::Workflow, &k).await?;
            s.delete_owned(Kind::Template, &k).await?;
        }
        if self
            .store
            .get(&host.key)
            .await?
            .is_some_and(|d| owned_by(&d, host))
        {
            s.delete_owned(Kind::Hardware, &host.key).await?;
        }
        for what in ["register", "power", "provision"] {
            s.delete_owned(Kind::Job, &job_key(host, what)).await?;
        }
        if self
            .store
            .bmc_machine(&host.key)
            .await?
            .is_some_and(|m| owned_by(&m.doc, host))
        {
            s.delete_owned(Kind::Machine, &host.key).await?;
        }
        s.metal3.finalize(&host.key).await?;
        Ok(())
    }
}

/// A part's name taken by an object that is not the host's.
fn not_ours(kind: &str, host: &Host) -> PassError {
    crate::services::Error::Invalid(crate::hardware::FieldError::new(
        "metadata.name",
        format!("{kind} {} exists and is not this host's", host.key),
    ))
    .into()
}

/// Whether a part's document is `host`'s (its owner label): one of the
/// name that is not is the user's, never taken over nor deleted.
fn owned_by(doc: &Value, host: &Host) -> bool {
    doc.pointer("/metadata/labels")
        .and_then(|l| l.get(super::OWNER_LABEL))
        .and_then(Value::as_str)
        == Some(host.key.name.as_str())
}

/// The ISO's URL when the host's image is a live ISO.
fn live_iso(host: &Host) -> Option<&str> {
    host.spec
        .image()
        .filter(|i| i.format == Some(model::ImageFormat::LiveIso))
        .map(|i| i.url.as_str())
}

fn job_key(host: &Host, what: &str) -> Key {
    Key::new(
        host.key.namespace.clone(),
        format!("{}-{what}", host.key.name),
    )
}

/// 128 random bits.
fn random16() -> [u8; 16] {
    let mut b = [0u8; 16];
    if getrandom::fill(&mut b).is_err() {
        // No OS randomness (it does not happen on Linux): std's hasher
        // keys, which it seeds as best it can.
        use std::hash::{BuildHasher, Hasher};
        for half in b.chunks_mut(8) {
            let mut h = std::hash::RandomState::new().build_hasher();
            h.write_i64(now_ms());
            half.copy_from_slice(&h.finish().to_le_bytes());
        }
    }
    b
}

/// A fresh secret for an inspection's report URL, hex.
fn token() -> String {
    hex::encode(random16())
}

/// A random (version 4) UUID, as Ironic names its nodes.
fn uuid_v4() -> String {
    let mut b = random16();
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    let h = hex::encode(b);
    format!(
        "{}-{}-{}-{}-{}",
        &h[..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..]
    )
}

/// BMO's back-off jitter, in 0..1.
fn jitter() -> f64 {
    let mut b = [0u8; 4];
    match getrandom::fill(&mut b) {
        Ok(()) => f64::from(u32::from_le_bytes(b)) / f64::from(u32::MAX),
        Err(_) => 0.5,
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn uuids_are_version_4() {
        let u = super::uuid_v4();
        assert_eq!(u.len(), 36);
        assert_eq!(&u[14..15], "4");
        assert!(matches!(&u[19..20], "8" | "9" | "a" | "b"), "{u}");
    }

    #[test]
    fn tokens_are_fresh_hex() {
        let (a, b) = (super::token(), super::token());
        assert_eq!(a.len(), 32);
        assert_ne!(a, b);
        assert!(a.chars().all(|c| c.is_ascii_hexdigit()));
    }
}
