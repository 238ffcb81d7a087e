//! BMO's host state machine, pure: from a host, its status and what
//! tinkerbox observed of the parts carrying it out (the BMC, the host's
//! Workflows, the inspection report), the next status and what to do.
//! The transitions and the status fields follow
//! `BMO:internal/controller/metal3.io/host_state_machine.go` and
//! `baremetalhost_controller.go` (see the README's state table); the work
//! Ironic does there is a Workflow or a BMC job here.

use super::details;
use super::model::{
    CleaningMode, Condition, ConditionStatus, ConditionType, ErrorType, Host, Image, ImageFormat,
    OperationalStatus, ProvisioningState as S, Status,
};
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// How one of the host's Workflows (or its power job) stands.
pub use crate::workflow::model::Run;

/// What tinkerbox knows of the parts, at one pass.
#[derive(Debug, Clone)]
pub struct Observed {
    pub now_ms: u64,
    /// RFC 3339 of `now_ms`, for the status's times.
    pub now: String,
    /// The credentials Secret: its version, or why it is unusable.
    pub credentials: Result<String, String>,
    /// The current run's BMC check (a power-status job through the
    /// host's BMC Machine, with its credentials).
    pub register: Run,
    /// The BMC's last power reading.
    pub power: Option<bool>,
    pub inspection: Run,
    pub provision: Run,
    pub deprovision: Run,
    pub power_job: Run,
    /// The id the host gets at registration (`status.provisioning.ID`):
    /// its uid, or a fresh UUID.
    pub node_id: String,
    /// The host's user, network and meta data Secrets: readable and
    /// well-formed, or why not (read when it may provision).
    pub host_data: Result<(), String>,
}

impl Default for Observed {
    fn default() -> Self {
        Observed {
            now_ms: 0,
            now: String::new(),
            credentials: Err("not read yet".into()),
            register: Run::None,
            power: None,
            inspection: Run::None,
            provision: Run::None,
            deprovision: Run::None,
            power_job: Run::None,
            node_id: String::new(),
            host_data: Ok(()),
        }
    }
}

/// tinkerbox's own bookkeeping of a host, kept beside its status (the
/// CRD's schema has no place for it).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Private {
    /// Counts the Workflow runs made for the host: each new run (a retry,
    /// a new request) gets the next number, and only the current one is
    /// observed.
    #[serde(default)]
    pub run: u64,
    /// The secret of the current inspection's report URL.
    #[serde(default)]
    pub token: String,
    /// The current inspection's report (BMO's `HardwareDetails`).
    #[serde(default)]
    pub report: Option<Value>,
    /// After a failure: no new attempt before this.
    #[serde(default)]
    pub retry_at_ms: u64,
    /// The power the last power job asked for.
    #[serde(default)]
    pub power_target: Option<bool>,
    /// Counts the power jobs made for the host: only the newest is
    /// observed.
    #[serde(default)]
    pub power_seq: u64,
    /// `reboot.metal3.io` being carried out: off asked (1), on asked
    /// (2), done (3, until the annotation is gone).
    #[serde(default)]
    pub reboot_phase: u8,
}

/// One thing to do, in order.
#[derive(Debug, Clone, PartialEq)]
pub enum Do {
    /// Make or bring up to date the Hardware and BMC Machine the host
    /// owns.
    EnsureParts,
    /// Check the BMC with the credentials: a power-status job of the
    /// current run.
    CheckBmc,
    /// Start a new inspection run (the inspection Workflow, netbooted).
    Inspect,
    /// Start provisioning onto this disk (by its name in the report;
    /// empty for a live ISO, which is booted, not written).
    Provision { disk: String },
    /// Start a new cleaning run (the wipe Workflow, netbooted).
    Deprovision,
    /// A power job to this state (the next of `power_seq`).
    Power(bool),
    /// Write the HardwareData object of the host from this report.
    SaveHardwareData(Value),
    /// Remove an annotation from the host.
    RemoveAnnotation(&'static str),
    /// Delete every object the host owns, then the host.
    Finalize,
}

/// What one pass decided.
#[derive(Debug, Clone, PartialEq)]
pub struct Step {
    pub status: Status,
    pub private: Private,
    pub todo: Vec<Do>,
}

/// BMO's `--max-provisioning-retries` default: attempts before a host
/// stays available with the error.
pub const MAX_PROVISIONING_RETRIES: u32 = 5;

/// BMO's `computeConditions`: the conditions of a status, each keeping
/// its `lastTransitionTime` from `before` while its status is unchanged;
/// Ready first, then by type.
fn conditions(s: &Status, before: &[Condition], now: &str) -> Vec<Condition> {
    use ConditionStatus::{False, True, Unknown};
    use ConditionType::*;
    let st = s.provisioning.state;
    let manageable = match st {
        S::None | S::Unmanaged => (False, "NotManaged"),
        S::Registering if s.operational_status == OperationalStatus::Error => {
            (False, "RegistrationFailed")
        }
        S::Registering => (False, "Registering"),
        _ => (True, "Manageable"),
    };
    let progressing = match st {
        S::Registering => (True, "Registering"),
        S::Inspecting | S::MatchProfile => (True, "Inspecting"),
        S::Preparing => (True, "Preparing"),
        S::Provisioning => (True, "Provisioning"),
        S::Deprovisioning => (True, "Deprovisioning"),
        S::PoweringOffBeforeDelete => (True, "PoweringOffBeforeDelete"),
        S::Deleting => (True, "Deleting"),
        _ => (False, "NotProgressing"),
    };
    let available = match st {
        S::Available | S::Ready => (True, "Available"),
        _ => (False, "NotAvailable"),
    };
    let provisioned = match st {
        S::Provisioned | S::ExternallyProvisioned => (True, "Provisioned"),
        _ => (False, "NotProvisioned"),
    };
    let mut ready = provisioned;
    let mut progressing = progressing;
    match s.operational_status {
        OperationalStatus::Error => ready = (False, "Error"),
        OperationalStatus::Servicing => ready = (False, "Servicing"),
        OperationalStatus::Detached => {
            ready = (False, "Detached");
            progressing = (False, "Detached");
        }
        _ => {}
    }
    [
        (Ready, ready),
        (AvailableForProvisioning, available),
        (Healthy, (Unknown, "Unknown")),
        (Manageable, manageable),
        (Progressing, progressing),
        (Provisioned, provisioned),
    ]
    .into_iter()
    .map(|(kind, (status, reason))| {
        let since = before
            .iter()
            .find(|c| c.kind == kind && c.status == status)
            .map(|c| c.last_transition_time.clone())
            .unwrap_or_else(|| now.to_string());
        Condition {
            kind,
            status,
            reason: reason.into(),
            message: String::new(),
            last_transition_time: since,
        }
    })
    .collect()
}

/// BMO's back-off after `errors` failures: 2^n minutes, less up to half
/// of it at random (`jitter` in 0..1), n at most 9 (`calculateBackoff`).
pub fn backoff_ms(errors: u32, jitter: f64) -> u64 {
    let base = 2f64.powi(errors.min(9) as i32);
    let minutes = base - jitter.clamp(0.0, 1.0) * base * 0.5;
    (minutes * 60_000.0) as u64
}

struct Pass<'a> {
    host: &'a Host,
    obs: &'a Observed,
    before: &'a Status,
    s: Status,
    p: Private,
    todo: Vec<Do>,
    jitter: f64,
}

impl Pass<'_> {
    fn goto(&mut self, to: S) {
        let now = Some(self.obs.now.clone());
        let h = &mut self.s.operation_history;
        // operationHistory: an operation starts when its state is entered
        // and ends when it is left.
        match self.s.provisioning.state {
            S::Registering => h.register.end = now.clone(),
            S::Inspecting => h.inspect.end = now.clone(),
            S::Provisioning => h.provision.end = now.clone(),
            S::Deprovisioning => h.deprovision.end = now.clone(),
            _ => {}
        }
        let started = match to {
            S::Registering => Some(&mut h.register),
            S::Inspecting => Some(&mut h.inspect),
            S::Provisioning => Some(&mut h.provision),
            S::Deprovisioning => Some(&mut h.deprovision),
            _ => None,
        };
        if let Some(m) = started {
            m.start = now;
            m.end = None;
        }
        if matches!(to, S::Registering | S::Inspecting | S::Provisioning) {
            self.s.provisioning.boot_mode = Some(self.host.spec.boot_mode.unwrap_or_default());
        }
        self.s.provisioning.state = to;
        self.p.retry_at_ms = 0;
    }

    fn clear_error(&mut self) {
        self.s.operational_status = OperationalStatus::Ok;
        self.s.error_type = None;
        self.s.error_message.clear();
    }

    /// BMO's `setErrorMessage`: the error, counted, and the next attempt
    /// after the back-off.
    fn fail(&mut self, kind: ErrorType, message: impl Into<String>) {
        self.s.operational_status = OperationalStatus::Error;
        self.s.error_type = Some(kind);
        self.s.error_message = message.into();
        self.s.error_count += 1;
        self.p.retry_at_ms = self.obs.now_ms + backoff_ms(self.s.error_count, self.jitter);
    }

    fn may_retry(&self) -> bool {
        self.obs.now_ms >= self.p.retry_at_ms
    }

    /// A new run of a Workflow: the earlier one is never read again.
    /// Its netboot changes the power behind the host's own power jobs, so
    /// the last one's target no longer says anything: without this, a
    /// host back to available after cleaning (the agent powered it off)
    /// took the power-off job of before provisioning for done and kept
    /// `poweredOn: true` until the BMC's next poll.
    fn new_run(&mut self) {
        self.p.run += 1;
        self.p.power_target = None;
    }

    /// A new power job to `on`.
    fn power(&mut self, on: bool) {
        self.p.power_target = Some(on);
        self.p.power_seq += 1;
        self.todo.push(Do::Power(on));
    }

    /// `online` enforced through the BMC (BMO's `manageHostPower`).
    fn manage_power(&mut self) {
        let want = self.host.spec.online || self.host.spec.disable_power_off;
        if let Some(on) = self.obs.power {
            self.s.powered_on = on;
        }
        match (&self.obs.power_job, self.p.power_target) {
            (Run::Running, _) => return,
            (Run::Failed(m), Some(t)) if t == want => {
                if self.s.error_type != Some(ErrorType::PowerManagement) || self.may_retry() {
                    let m = m.clone();
                    self.fail(ErrorType::PowerManagement, m);
                    self.p.power_target = None;
                }
                return;
            }
            _ => {}
        }
        if self.obs.power == Some(want) {
            if self.s.error_type == Some(ErrorType::PowerManagement) {
                self.clear_error();
                self.s.error_count = 0;
            }
            return;
        }
        // A job that did it already: the reading catches up.
        let done = self.obs.power_job == Run::Succeeded && self.p.power_target == Some(want);
        if self.obs.power.is_some() && !done && self.may_retry() {
            self.power(want);
        }
    }

    /// BMO's `provisioningCancelled`: the image gone or changed since it
    /// was provisioned (or since provisioning began).
    fn cancelled(&self, against: Option<&Image>) -> bool {
        match (self.host.spec.image(), against) {
            (None, _) => true,
            (Some(want), Some(had)) => want.url != had.url,
            (Some(_), None) => false,
        }
    }
}

/// One pass of the state machine over `host`.
pub fn step(host: &Host, status: &Status, private: &Private, obs: &Observed, jitter: f64) -> Step {
    let mut p = Pass {
        host,
        obs,
        before: status,
        s: status.clone(),
        p: private.clone(),
        todo: Vec::new(),
        jitter,
    };
    if let Some(on) = obs.power {
        p.s.powered_on = on;
    }
    let state = p.s.provisioning.state;
    if host.paused() {
        return p.done();
    }
    if host.deleting() {
        deleting(&mut p);
        return p.done();
    }
    // BMO's updateHardwareDetails: a host not inspected takes its
    // hardware from the annotation (checked at apply), once.
    if p.s.hardware.is_none()
        && host.inspection_disabled()
        && let Some(v) = host.annotation(super::HARDWARE_DETAILS)
        && let Ok(hw) = details::check_report(v.as_bytes())
    {
        p.s.hardware = Some(hw);
        p.todo.push(Do::RemoveAnnotation(super::HARDWARE_DETAILS));
    }
    if host.detached() {
        p.s.operational_status = OperationalStatus::Detached;
        return p.done();
    } else if p.s.operational_status == OperationalStatus::Detached {
        // The annotation removed: registered again.
        p.s.operational_status = OperationalStatus::Ok;
    }
    match state {
        S::None | S::Unmanaged => {
            if host.spec.has_bmc_details() {
                p.goto(S::Registering);
            } else if state == S::None {
                p.s.operational_status = OperationalStatus::Discovered;
                p.goto(S::Unmanaged);
            }
        }
        S::Registering => registering(&mut p),
        S::Inspecting => inspecting(&mut p),
        S::MatchProfile => p.goto(S::Preparing),
        S::Preparing => preparing(&mut p),
        S::Available | S::Ready => available(&mut p),
        S::Provisioning => provisioning(&mut p),
        S::Provisioned => {
            if p.cancelled(p.s.provisioning.image.clone().as_ref()) {
                start_deprovisioning(&mut p);
            } else if host.annotation(super::REBOOT).is_some() || p.p.reboot_phase != 0 {
                reboot_annotation(&mut p);
            } else {
                p.manage_power();
            }
        }
        S::ExternallyProvisioned => {
            if !host.spec.externally_provisioned {
                if let Some(i) = host.spec.image() {
                    p.s.provisioning.image = Some(i.clone());
                    p.goto(S::Provisioned);
                } else {
                    start_deprovisioning(&mut p);
                }
            } else {
                p.manage_power();
            }
        }
        S::Deprovisioning => deprovisioning(&mut p),
        // Only a host being deleted is in these; one whose deletion was
        // lifted (host mode cannot, kube cannot) registers again.
        S::PoweringOffBeforeDelete | S::Deleting => p.goto(S::Registering),
    }
    p.done()
}

impl Pass<'_> {
    fn done(self) -> Step {
        let mut status = self.s;
        status.conditions = conditions(&status, &self.before.conditions, &self.obs.now);
        // lastUpdated moves only when something else in the status did.
        if &status != self.before {
            status.last_updated = Some(self.obs.now.clone());
        }
        Step {
            status,
            private: self.p,
            todo: self.todo,
        }
    }
}

fn registering(p: &mut Pass) {
    let cred = p
        .host
        .spec
        .bmc
        .as_ref()
        .map(|b| b.credentials_name.clone())
        .unwrap_or_default();
    let version = match &p.obs.credentials {
        Ok(v) => v.clone(),
        Err(m) => {
            if p.s.error_type != Some(ErrorType::Registration) || p.may_retry() {
                let m = m.clone();
                p.fail(ErrorType::Registration, m);
            }
            return;
        }
    };
    if p.host.boot_mac.is_none() {
        if p.s.error_type != Some(ErrorType::Registration) || p.may_retry() {
            p.fail(
                ErrorType::Registration,
                "bootMACAddress is required: tinkerbox boots a host from the network by the MAC it boots from",
            );
        }
        return;
    }
    let tried = super::model::CredentialsStatus {
        credentials: Some(super::model::SecretRef {
            name: cred,
            namespace: Some(p.host.key.namespace.clone()),
        }),
        credentials_version: version,
    };
    p.s.tried_credentials = Some(tried.clone());
    // BMO's matchProfile: the profile, and the spec's hints recorded.
    let libvirt = p.host.bmc.as_ref().is_some_and(|b| b.scheme == "libvirt");
    p.s.hardware_profile = Some(if libvirt { "libvirt" } else { "unknown" }.into());
    p.s.provisioning.root_device_hints = p.host.spec.root_device_hints.clone();
    if p.s.provisioning.id.is_empty() {
        p.s.provisioning.id = p.obs.node_id.clone();
    }
    p.todo.push(Do::EnsureParts);
    match &p.obs.register {
        Run::Running => {}
        Run::None => {
            if p.may_retry() {
                p.todo.push(Do::CheckBmc);
            }
        }
        Run::Failed(m) => {
            let m = m.clone();
            p.fail(ErrorType::Registration, m);
            // The next check is a new run, after the back-off.
            p.new_run();
        }
        Run::Succeeded => {
            p.clear_error();
            p.s.error_count = 0;
            p.s.good_credentials = Some(tried);
            if p.host.spec.externally_provisioned {
                p.goto(S::ExternallyProvisioned);
            } else if p.host.inspection_disabled() {
                p.goto(S::Preparing);
            } else {
                start_inspecting(p);
            }
        }
    }
}

fn start_inspecting(p: &mut Pass) {
    p.goto(S::Inspecting);
    p.new_run();
    p.p.report = None;
    p.todo.push(Do::Inspect);
    // BMO removes the request when the inspection starts.
    if p.host.inspection_requested() {
        p.todo.push(Do::RemoveAnnotation(super::INSPECT));
    }
}

fn inspecting(p: &mut Pass) {
    match &p.obs.inspection {
        Run::Running => {}
        Run::None => {
            if p.may_retry() {
                p.new_run();
                p.p.report = None;
                p.todo.push(Do::Inspect);
            }
        }
        Run::Succeeded => match p.p.report.take() {
            Some(report) => {
                p.clear_error();
                p.s.error_count = 0;
                p.s.hardware = Some(report.clone());
                p.todo.push(Do::SaveHardwareData(report));
                p.goto(S::Preparing);
            }
            None => {
                p.fail(
                    ErrorType::Inspection,
                    "the inspection Workflow succeeded but no inspection report arrived",
                );
                p.p.run += 1;
            }
        },
        Run::Failed(m) => {
            let m = format!("inspection failed: {m}");
            p.fail(ErrorType::Inspection, m);
            // The next attempt is a new run, after the back-off.
            p.p.run += 1;
        }
    }
}

fn preparing(p: &mut Pass) {
    if p.host.spec.wants_raid() {
        let m = "RAID configuration is not supported: tinkerbox has no RAID interface (remove spec.raid, \
                 or configure RAID out of band)";
        if p.s.error_message != m {
            p.fail(ErrorType::Preparation, m);
        }
        return;
    }
    p.clear_error();
    p.s.error_count = 0;
    p.goto(S::Available);
}

fn available(p: &mut Pass) {
    let spec = &p.host.spec;
    if spec.externally_provisioned {
        p.goto(S::ExternallyProvisioned);
        return;
    }
    if p.host.inspection_requested() {
        start_inspecting(p);
        return;
    }
    if spec.wants_raid() {
        p.goto(S::Preparing);
        return;
    }
    if spec.image().is_none() && p.s.provisioning_fail_count > 0 {
        p.s.provisioning_fail_count = 0;
        p.s.last_attempted_image = None;
    }
    if spec.online
        && p.s.provisioning.image.is_none()
        && let Some(image) = spec.image()
    {
        if p.s.last_attempted_image.as_ref() != Some(image) {
            p.s.provisioning_fail_count = 0;
        }
        if p.s.provisioning_fail_count >= MAX_PROVISIONING_RETRIES {
            let m = format!(
                "provisioning failed {} times, retry limit ({MAX_PROVISIONING_RETRIES}) reached; change image or \
                 reset provisioningFailCount to retry",
                p.s.provisioning_fail_count
            );
            if p.s.error_message != m {
                p.fail(ErrorType::Provisioning, m);
            }
            return;
        }
        p.clear_error();
        p.s.last_attempted_image = Some(image.clone());
        p.goto(S::Provisioning);
        p.new_run();
        provisioning(p);
        return;
    }
    p.manage_power();
}

fn provisioning(p: &mut Pass) {
    if p.cancelled(p.s.last_attempted_image.clone().as_ref()) {
        start_deprovisioning(p);
        return;
    }
    // BMO: a provisioning error is cleaned up (deprovisioned) on the
    // first pass after its back-off, and counted then.
    if p.s.error_type.is_some() {
        if p.may_retry() {
            p.s.provisioning_fail_count += 1;
            start_deprovisioning(p);
        }
        return;
    }
    p.s.last_attempted_image = p.host.spec.image().cloned();
    match &p.obs.provision {
        Run::Running => {}
        Run::None => {
            if !p.may_retry() {
                return;
            }
            if let Err(m) = &p.obs.host_data {
                let m = m.clone();
                p.fail(ErrorType::Provisioning, m);
                return;
            }
            // A live ISO is booted, not written: no disk to choose.
            if p.host.spec.image().and_then(|i| i.format) == Some(ImageFormat::LiveIso) {
                p.todo.push(Do::Provision {
                    disk: String::new(),
                });
                return;
            }
            let hints = p.host.spec.root_device_hints.clone().unwrap_or_default();
            let disks =
                p.s.hardware
                    .as_ref()
                    .map(details::storage)
                    .unwrap_or_default();
            match details::root_device(&disks, &hints) {
                Ok(disk) => p.todo.push(Do::Provision { disk }),
                Err(m) => p.fail(ErrorType::Provisioning, m),
            }
        }
        Run::Succeeded => {
            p.clear_error();
            p.s.error_count = 0;
            p.s.provisioning_fail_count = 0;
            p.s.provisioning.image = p.host.spec.image().cloned();
            p.s.provisioning.root_device_hints = p.host.spec.root_device_hints.clone();
            p.s.provisioning.boot_mode = Some(p.host.spec.boot_mode.unwrap_or_default());
            p.goto(S::Provisioned);
        }
        Run::Failed(m) => {
            let m = format!("provisioning failed: {m}");
            p.fail(ErrorType::Provisioning, m);
        }
    }
}

fn start_deprovisioning(p: &mut Pass) {
    p.goto(S::Deprovisioning);
    p.new_run();
    // The Hardware as a host not provisioned has it (a live ISO's boot
    // gone).
    p.todo.push(Do::EnsureParts);
    deprovisioning(p);
}

fn deprovisioning(p: &mut Pass) {
    let skip = p.host.spec.cleaning() == CleaningMode::Disabled;
    let finished = if skip {
        // No cleaning: off, then done.
        if p.obs.power == Some(false) {
            true
        } else {
            let asked = p.p.power_target == Some(false)
                && matches!(p.obs.power_job, Run::Running | Run::Succeeded);
            if !asked && p.obs.power.is_some() {
                p.power(false);
            }
            false
        }
    } else {
        match &p.obs.deprovision {
            Run::Running => false,
            Run::None => {
                if p.may_retry() {
                    p.todo.push(Do::Deprovision);
                }
                false
            }
            Run::Succeeded => true,
            Run::Failed(m) => {
                let m = format!("cleaning failed: {m}");
                p.fail(ErrorType::Provisioning, m);
                p.new_run();
                if p.host.deleting() && p.s.error_count > 3 {
                    p.goto(S::PoweringOffBeforeDelete);
                }
                false
            }
        }
    };
    if finished {
        p.s.provisioning.image = None;
        p.s.provisioning.root_device_hints = None;
        p.clear_error();
        p.s.error_count = 0;
        if p.host.deleting() {
            p.goto(S::PoweringOffBeforeDelete);
        } else {
            p.goto(S::Available);
        }
    }
}

/// `reboot.metal3.io`: one power cycle (off, then on), the annotation
/// removed once the power is back.
fn reboot_annotation(p: &mut Pass) {
    if p.host.annotation(super::REBOOT).is_none() {
        p.p.reboot_phase = 0;
        return;
    }
    let job_done = !matches!(p.obs.power_job, Run::Running);
    match (p.p.reboot_phase, p.obs.power) {
        (0, _) => {
            p.p.reboot_phase = 1;
            p.power(false);
        }
        (1, Some(false)) if job_done => {
            p.p.reboot_phase = 2;
            p.power(true);
        }
        // Done; the annotation's removal may not be seen at once: never a
        // second cycle for it.
        (2, Some(true)) if job_done => {
            p.p.reboot_phase = 3;
            p.todo.push(Do::RemoveAnnotation(super::REBOOT));
        }
        (3, _) => p.todo.push(Do::RemoveAnnotation(super::REBOOT)),
        _ => {}
    }
}

fn deleting(p: &mut Pass) {
    match p.s.provisioning.state {
        S::None | S::Unmanaged | S::Registering => p.goto(S::Deleting),
        S::Provisioning | S::Provisioned => start_deprovisioning(p),
        S::Deprovisioning => deprovisioning(p),
        S::PoweringOffBeforeDelete => {
            let off = p.obs.power == Some(false);
            if off || p.host.spec.disable_power_off || p.s.error_count > 3 {
                p.s.error_count = 0;
                p.s.powered_on = false;
                p.goto(S::Deleting);
                p.todo.push(Do::Finalize);
                return;
            }
            match &p.obs.power_job {
                Run::Running => {}
                Run::Failed(m) if p.p.power_target == Some(false) => {
                    let m = m.clone();
                    p.fail(ErrorType::PowerManagement, m);
                    p.p.power_target = None;
                }
                _ if p.may_retry() => {
                    p.power(false);
                }
                _ => {}
            }
        }
        S::Deleting => p.todo.push(Do::Finalize),
        _ => p.goto(S::PoweringOffBeforeDelete),
    }
    if p.s.provisioning.state == S::Deleting && !p.todo.contains(&Do::Finalize) {
        p.todo.push(Do::Finalize);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metal3::model;
    use serde_json::json;

    fn host(spec: Value, annotations: Value) -> Host {
        model::host(
            json!({"apiVersion": "metal3.io/v1alpha1", "kind": "BareMetalHost",
            "metadata": {"name": "node-0", "namespace": "lab", "annotations": annotations},
            "spec": spec}),
        )
        .unwrap()
    }

    fn spec() -> Value {
        json!({"online": false, "bootMACAddress": "52:54:00:00:00:01",
               "bmc": {"address": "ipmi://10.0.0.1:6230", "credentialsName": "bmc"}})
    }

    fn obs(now_ms: u64) -> Observed {
        Observed {
            now_ms,
            now: format!("t{now_ms}"),
            credentials: Ok("7".into()),
            power: Some(false),
            ..Default::default()
        }
    }

    fn report() -> Value {
        json!({"storage": [{"name": "/dev/vda", "sizeBytes": 21474836480u64, "rotational": true}],
               "nics": [{"name": "eth0", "mac": "52:54:00:00:00:01", "ip": "10.0.0.20"}]})
    }

    /// Steps `h` from `s` with `o`, returning the step.
    fn go(h: &Host, s: &Status, p: &Private, o: &Observed) -> Step {
        step(h, s, p, o, 0.0)
    }

    #[test]
    fn a_host_walks_the_whole_lifecycle() {
        let mut h = host(spec(), json!({}));
        let mut s = Status::default();
        let mut p = Private::default();
        let mut o = obs(1);

        let st = go(&h, &s, &p, &o);
        assert_eq!(st.status.provisioning.state, S::Registering);
        assert_eq!(
            st.status.operation_history.register.start.as_deref(),
            Some("t1")
        );
        (s, p) = (st.status, st.private);

        // Registering: the parts are made and the BMC checked.
        let st = go(&h, &s, &p, &o);
        assert_eq!(st.todo, vec![Do::EnsureParts, Do::CheckBmc]);
        assert_eq!(st.status.provisioning.state, S::Registering);
        o.register = Run::Running;
        assert_eq!(go(&h, &s, &p, &o).todo, vec![Do::EnsureParts]);
        // Reached: inspection starts with a new run.
        o.register = Run::Succeeded;
        o.now_ms = 2;
        o.now = "t2".into();
        let st = go(&h, &s, &p, &o);
        assert_eq!(st.status.provisioning.state, S::Inspecting);
        assert_eq!(st.todo, vec![Do::EnsureParts, Do::Inspect]);
        assert_eq!(st.private.run, 1);
        assert_eq!(
            st.status.operation_history.register.end.as_deref(),
            Some("t2")
        );
        assert_eq!(
            st.status
                .good_credentials
                .as_ref()
                .unwrap()
                .credentials_version,
            "7"
        );
        (s, p) = (st.status, st.private);

        // The Workflow runs; the report arrives; it ends.
        o.register = Run::None;
        o.inspection = Run::Running;
        assert!(go(&h, &s, &p, &o).todo.is_empty());
        p.report = Some(report());
        o.inspection = Run::Succeeded;
        let st = go(&h, &s, &p, &o);
        assert_eq!(st.status.provisioning.state, S::Preparing);
        assert_eq!(st.status.hardware, Some(report()));
        assert_eq!(st.todo, vec![Do::SaveHardwareData(report())]);
        (s, p) = (st.status, st.private);
        let st = go(&h, &s, &p, &o);
        assert_eq!(st.status.provisioning.state, S::Available);
        (s, p) = (st.status, st.private);

        // Claimed: image, online.
        h.spec.online = true;
        h.spec.image = Some(Image {
            url: "http://x/img.raw".into(),
            checksum: Some("ab".into()),
            ..Default::default()
        });
        o.inspection = Run::None;
        let st = go(&h, &s, &p, &o);
        assert_eq!(st.status.provisioning.state, S::Provisioning);
        assert_eq!(
            st.todo,
            vec![Do::Provision {
                disk: "/dev/vda".into()
            }]
        );
        assert_eq!(
            st.status.last_attempted_image.as_ref().unwrap().url,
            "http://x/img.raw"
        );
        assert_eq!(st.private.run, 2);
        (s, p) = (st.status, st.private);
        o.provision = Run::Running;
        assert!(go(&h, &s, &p, &o).todo.is_empty());
        o.provision = Run::Succeeded;
        o.power = Some(true);
        let st = go(&h, &s, &p, &o);
        assert_eq!(st.status.provisioning.state, S::Provisioned);
        assert!(st.status.powered_on);
        assert_eq!(
            st.status.provisioning.image.as_ref().unwrap().url,
            "http://x/img.raw"
        );
        (s, p) = (st.status, st.private);
        // Online and on: nothing to do.
        assert!(go(&h, &s, &p, &o).todo.is_empty());

        // Released: the image cleared.
        h.spec.image = None;
        h.spec.online = false;
        o.provision = Run::None;
        let st = go(&h, &s, &p, &o);
        assert_eq!(st.status.provisioning.state, S::Deprovisioning);
        assert_eq!(st.todo, vec![Do::EnsureParts, Do::Deprovision]);
        (s, p) = (st.status, st.private);
        o.deprovision = Run::Succeeded;
        o.power = Some(false);
        let st = go(&h, &s, &p, &o);
        assert_eq!(st.status.provisioning.state, S::Available);
        assert_eq!(st.status.provisioning.image, None);
        (s, p) = (st.status, st.private);

        // Deleted: off already, so straight to deleting and finalized.
        h.doc["metadata"]["deletionTimestamp"] = json!("now");
        o.deprovision = Run::None;
        let st = go(&h, &s, &p, &o);
        assert_eq!(st.status.provisioning.state, S::PoweringOffBeforeDelete);
        (s, p) = (st.status, st.private);
        let st = go(&h, &s, &p, &o);
        assert_eq!(st.status.provisioning.state, S::Deleting);
        assert_eq!(st.todo, vec![Do::Finalize]);
    }

    #[test]
    fn a_host_without_a_bmc_is_unmanaged_and_discovered() {
        let h = host(json!({"online": false}), json!({}));
        let st = go(&h, &Status::default(), &Private::default(), &obs(1));
        assert_eq!(st.status.provisioning.state, S::Unmanaged);
        assert_eq!(st.status.operational_status, OperationalStatus::Discovered);
    }

    #[test]
    fn registration_errors_are_counted_and_backed_off() {
        let h = host(spec(), json!({}));
        let mut s = Status::default();
        s.provisioning.state = S::Registering;
        let mut o = obs(1000);
        o.register = Run::Failed("BMC refused the credentials".into());
        let st = go(&h, &s, &Private::default(), &o);
        assert_eq!(st.status.error_type, Some(ErrorType::Registration));
        assert_eq!(st.status.operational_status, OperationalStatus::Error);
        assert_eq!(st.status.error_count, 1);
        assert_eq!(st.private.retry_at_ms, 1000 + 120_000);
        assert_eq!(st.private.run, 1);
        // The failed run is not read again; no new check before the
        // back-off.
        o.register = Run::None;
        let st2 = go(&h, &st.status, &st.private, &o);
        assert_eq!(st2.status.error_count, 1);
        assert_eq!(st2.todo, vec![Do::EnsureParts]);
        o.now_ms = 1000 + 120_000;
        let st2 = go(&h, &st2.status, &st2.private, &o);
        assert_eq!(st2.todo, vec![Do::EnsureParts, Do::CheckBmc]);
        o.register = Run::Failed("BMC refused the credentials".into());
        let st3 = go(&h, &st2.status, &st2.private, &o);
        assert_eq!(st3.status.error_count, 2);
        // Missing credentials say so.
        let mut o = obs(1);
        o.credentials = Err("Secret lab/bmc not found".into());
        let st = go(&h, &s, &Private::default(), &o);
        assert_eq!(st.status.error_message, "Secret lab/bmc not found");
        // Reached at last: the error is gone and the count reset.
        let mut o = obs(10_000_000);
        o.register = Run::Succeeded;
        let st = go(&h, &st3.status, &st3.private, &o);
        assert_eq!(st.status.error_count, 0);
        assert_eq!(st.status.error_message, "");
        assert_eq!(st.status.provisioning.state, S::Inspecting);
    }

    #[test]
    fn inspection_disabled_skips_to_preparing_and_raid_is_a_preparation_error() {
        let mut sp = spec();
        sp["inspectionMode"] = json!("disabled");
        sp["raid"] = json!({"hardwareRAIDVolumes": [{"level": "1"}]});
        let h = host(sp, json!({}));
        let mut s = Status::default();
        s.provisioning.state = S::Registering;
        let mut o = obs(1);
        o.register = Run::Succeeded;
        let st = go(&h, &s, &Private::default(), &o);
        assert_eq!(st.status.provisioning.state, S::Preparing);
        let st = go(&h, &st.status, &st.private, &o);
        assert_eq!(st.status.error_type, Some(ErrorType::Preparation));
        assert!(st.status.error_message.contains("RAID"));
    }

    #[test]
    fn no_disk_matching_the_hints_is_a_provisioning_error() {
        let mut sp = spec();
        sp["online"] = json!(true);
        sp["image"] = json!({"url": "http://x/i", "checksum": "a"});
        sp["rootDeviceHints"] = json!({"minSizeGigabytes": 100});
        let h = host(sp, json!({}));
        let mut s = Status::default();
        s.provisioning.state = S::Available;
        s.hardware = Some(report());
        let st = go(&h, &s, &Private::default(), &obs(1));
        assert_eq!(st.status.provisioning.state, S::Provisioning);
        assert_eq!(st.status.error_type, Some(ErrorType::Provisioning));
        assert!(st.status.error_message.starts_with("No suitable device"));
        // Counted when it is cleaned up, after the back-off.
        assert_eq!(st.status.provisioning_fail_count, 0);
        assert!(st.todo.is_empty());
    }

    #[test]
    fn a_failed_provisioning_is_cleaned_after_the_back_off_and_retried_up_to_the_limit() {
        let mut sp = spec();
        sp["online"] = json!(true);
        sp["image"] = json!({"url": "http://x/i", "checksum": "a"});
        let h = host(sp, json!({}));
        let mut s = Status::default();
        s.provisioning.state = S::Provisioning;
        s.last_attempted_image = h.spec.image.clone();
        s.hardware = Some(report());
        let mut o = obs(5);
        o.provision = Run::Failed("checksum mismatch".into());
        let st = go(&h, &s, &Private::default(), &o);
        // BMO: the error recorded, the state kept until the back-off.
        assert_eq!(st.status.provisioning.state, S::Provisioning);
        assert_eq!(st.status.error_type, Some(ErrorType::Provisioning));
        assert_eq!(st.status.error_count, 1);
        assert!(st.status.error_message.contains("checksum mismatch"));
        let st = go(&h, &st.status, &st.private, &o);
        assert_eq!(st.status.provisioning.state, S::Provisioning);
        // After it: counted, and cleaned.
        let mut o = obs(5 + 120_000);
        o.provision = Run::Failed("checksum mismatch".into());
        let st = go(&h, &st.status, &st.private, &o);
        assert_eq!(st.status.provisioning.state, S::Deprovisioning);
        assert_eq!(st.status.provisioning_fail_count, 1);
        assert_eq!(st.todo, vec![Do::EnsureParts, Do::Deprovision]);
        // Cleaned: the error gone, available, and provisioning again.
        o.provision = Run::None;
        o.deprovision = Run::Succeeded;
        let st = go(&h, &st.status, &st.private, &o);
        assert_eq!(st.status.provisioning.state, S::Available);
        assert_eq!(st.status.error_count, 0);
        assert_eq!(st.status.error_type, None);
        o.deprovision = Run::None;
        let st = go(&h, &st.status, &st.private, &o);
        assert_eq!(st.status.provisioning.state, S::Provisioning);
        assert_eq!(st.status.provisioning_fail_count, 1);
        // At the limit, the host stays available with BMO's error.
        let mut s = st.status;
        s.provisioning.state = S::Available;
        s.provisioning_fail_count = MAX_PROVISIONING_RETRIES;
        let st = go(&h, &s, &st.private, &o);
        assert_eq!(st.status.provisioning.state, S::Available);
        assert!(
            st.status.error_message.contains("retry limit (5) reached"),
            "{}",
            st.status.error_message
        );
        // A new image resets the count.
        let mut h2 = h.clone();
        h2.spec.image.as_mut().unwrap().url = "http://x/other".into();
        let st = go(&h2, &st.status, &st.private, &obs(10_000_000));
        assert_eq!(st.status.provisioning.state, S::Provisioning);
        assert_eq!(st.status.provisioning_fail_count, 0);
    }

    #[test]
    fn conditions_follow_the_state_and_keep_their_transition_times() {
        let h = host(spec(), json!({}));
        let mut s = Status::default();
        s.provisioning.state = S::Available;
        s.operational_status = OperationalStatus::Ok;
        let st = go(&h, &s, &Private::default(), &obs(1));
        let c = |st: &Step, t: ConditionType| {
            st.status
                .conditions
                .iter()
                .find(|c| c.kind == t)
                .map(|c| (c.status, c.reason.clone(), c.last_transition_time.clone()))
                .unwrap()
        };
        assert_eq!(st.status.conditions[0].kind, ConditionType::Ready);
        assert_eq!(
            c(&st, ConditionType::AvailableForProvisioning),
            (ConditionStatus::True, "Available".into(), "t1".into())
        );
        assert_eq!(c(&st, ConditionType::Ready).0, ConditionStatus::False);
        let v = serde_json::to_value(&st.status.conditions).unwrap();
        assert_eq!(v[0]["type"], "Ready");
        assert_eq!(v[0]["lastTransitionTime"], "t1");
        // Unchanged on a later pass: the time stays.
        let st2 = go(&h, &st.status, &st.private, &obs(9));
        assert_eq!(c(&st2, ConditionType::AvailableForProvisioning).2, "t1");
    }

    #[test]
    fn online_is_enforced_when_available() {
        let mut sp = spec();
        sp["online"] = json!(true);
        let h = host(sp, json!({}));
        let mut s = Status::default();
        s.provisioning.state = S::Available;
        let st = go(&h, &s, &Private::default(), &obs(1));
        assert_eq!(st.todo, vec![Do::Power(true)]);
        assert_eq!(st.private.power_target, Some(true));
        let mut o = obs(2);
        o.power_job = Run::Running;
        assert!(go(&h, &s, &st.private, &o).todo.is_empty());
        o.power_job = Run::Failed("BMC timed out".into());
        let st = go(&h, &s, &st.private, &o);
        assert_eq!(st.status.error_type, Some(ErrorType::PowerManagement));
        let mut o = obs(3);
        o.power = Some(true);
        let st = go(&h, &st.status, &st.private, &o);
        assert_eq!(st.status.error_type, None);
        assert!(st.status.powered_on);
    }

    #[test]
    fn paused_and_detached_hosts_are_left_alone() {
        let h = host(
            spec(),
            json!({"baremetalhost.metal3.io/paused": "metal3.io/capm3"}),
        );
        let st = go(&h, &Status::default(), &Private::default(), &obs(1));
        assert_eq!(st.status.provisioning.state, S::None);
        assert!(st.todo.is_empty());
        let h = host(spec(), json!({"baremetalhost.metal3.io/detached": ""}));
        let mut s = Status::default();
        s.provisioning.state = S::Provisioned;
        let st = go(&h, &s, &Private::default(), &obs(1));
        assert_eq!(st.status.operational_status, OperationalStatus::Detached);
        assert!(st.todo.is_empty());
    }

    #[test]
    fn the_reboot_annotation_cycles_the_power_once() {
        let mut sp = spec();
        sp["online"] = json!(true);
        let h = host(sp, json!({"reboot.metal3.io": ""}));
        let mut s = Status::default();
        s.provisioning.state = S::Provisioned;
        s.provisioning.image = Some(Image::default());
        let mut o = obs(1);
        o.power = Some(true);
        // The image in status is empty, so set one the spec agrees with.
        let mut h = h;
        h.spec.image = Some(Image {
            url: "u".into(),
            ..Default::default()
        });
        s.provisioning.image = h.spec.image.clone();
        let st = go(&h, &s, &Private::default(), &o);
        assert_eq!(st.todo, vec![Do::Power(false)]);
        o.power = Some(false);
        let st = go(&h, &st.status, &st.private, &o);
        assert_eq!(st.todo, vec![Do::Power(true)]);
        o.power = Some(true);
        let st = go(&h, &st.status, &st.private, &o);
        assert_eq!(st.todo, vec![Do::RemoveAnnotation(crate::metal3::REBOOT)]);
    }

    #[test]
    fn after_cleaning_a_stale_power_job_is_not_taken_for_done() {
        // Provisioned, then released. The host's last power job was the
        // power-off after inspection; the provisioning and cleaning
        // netboots powered it on since, and the agent powered it off at
        // the end of cleaning: the BMC's reading still says on.
        let h = host(spec(), json!({}));
        let mut s = Status::default();
        s.provisioning.state = S::Provisioned;
        s.provisioning.image = Some(Image {
            url: "http://x/i".into(),
            ..Default::default()
        });
        let p = Private {
            power_target: Some(false),
            power_seq: 1,
            ..Default::default()
        };
        let mut o = obs(1);
        o.power = Some(true);
        o.power_job = Run::Succeeded;
        let st = go(&h, &s, &p, &o);
        assert_eq!(st.status.provisioning.state, S::Deprovisioning);
        o.deprovision = Run::Succeeded;
        let st = go(&h, &st.status, &st.private, &o);
        assert_eq!(st.status.provisioning.state, S::Available);
        o.deprovision = Run::None;
        let st = go(&h, &st.status, &st.private, &o);
        assert_eq!(
            st.todo,
            vec![Do::Power(false)],
            "the power-off of before provisioning was taken for done"
        );
    }

    #[test]
    fn backoff_is_bmos() {
        assert_eq!(backoff_ms(1, 0.0), 120_000);
        assert_eq!(backoff_ms(1, 1.0), 60_000);
        assert_eq!(backoff_ms(3, 0.0), 8 * 60_000);
        assert_eq!(backoff_ms(40, 0.0), 512 * 60_000);
    }
}
