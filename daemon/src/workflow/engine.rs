//! tink-controller's job: move Workflows through their states. The
//! decisions are pure functions of (status, documents, time), tested
//! without a store; [`Engine::run`] is the loop that reads the store,
//! applies them, and writes each status back with the version it read.
//!
//! - `""`: render (PENDING, or PREPARING when boot options ask for it); a
//!   failure is `templateRendering: failed` with the reason in the
//!   `TemplateRenderedSuccess` condition, retried on every pass, as
//!   tink-controller requeues.
//! - PREPARING: `toggleAllowNetboot` sets allowPXE on every interface of
//!   the Hardware; a `bootMode` runs its BMC job on the Hardware's bmcRef
//!   and waits for it: `netboot-<wf>` (power off, PXE once, power on),
//!   `iso-mount-<wf>` (off, eject, insert isoURL, CD once, on) or
//!   `customboot-preparing-<wf>` (the user's actions); then PENDING.
//! - RUNNING: the global timeout (`globalExecutionStop`, set when the
//!   engine first sees it running) ends it in TIMEOUT.
//! - POST: allowPXE back off if it was toggled; `iso-eject-<wf>` or
//!   `customboot-post-<wf>`; then SUCCESS.

use super::model::{
    BootMode, BootOptionsStatus, Condition, JobStatus, State, Status, TemplateRendering,
    WorkflowSpec,
};
use super::render;
pub use crate::bmc::model::netboot_tasks;
use crate::bmc::model::{Action, MediaKind, VirtualMediaAction, boot_once, power_action as power};
use crate::bmc::{BootDevice, PowerAction};
use crate::hardware::Key;
use crate::services::Services;
use crate::store::bmc::State as JobState;
use crate::store::workflow::WorkflowRow;
use crate::store::{Store, StoreError};
use serde_json::Value;
use std::sync::Arc;
use std::time::{Duration, SystemTime};
use tokio::sync::Notify;

pub const TEMPLATE_RENDERED: &str = "TemplateRenderedSuccess";

/// How often the engine visits RUNNING Workflows (the global timeout) and
/// retries what could not render.
const FULL_PASS_EVERY: Duration = Duration::from_secs(5);

/// What rendering needs besides the Workflow: its Template (`spec.data`)
/// and Hardware document, as found (None: not found).
pub struct Found<'a> {
    pub template: Option<&'a str>,
    pub hardware: Option<&'a Value>,
}

/// The status a new Workflow (state `""`) moves to, or None when nothing
/// changes (the same failure as last time).
pub fn render_step(
    spec: &WorkflowSpec,
    status: &Status,
    found: Found,
    now: &str,
) -> Option<Status> {
    let failed = |message: String| {
        let mut s = status.clone();
        s.template_rendering = Some(TemplateRendering::Failed);
        let changed = set_condition(&mut s, condition(false, "Error", message, now));
        changed.then_some(s)
    };
    let Some(data) = found.template else {
        return failed(format!("template not found: {}", spec.template_ref));
    };
    if !spec.hardware_ref.is_empty() && found.hardware.is_none() {
        return failed(format!("hardware not found: {}", spec.hardware_ref));
    }
    let doc = match render::render(data, found.hardware, &spec.hardware_map) {
        Ok(d) => d,
        Err(e) => return failed(format!("error rendering template: {e}")),
    };
    let mut s = Status::rendered(&doc);
    s.conditions = status.conditions.clone();
    set_condition(
        &mut s,
        condition(
            true,
            "Complete",
            "template rendered successfully".into(),
            now,
        ),
    );
    // A disabled Workflow is rendered but does not start (upstream keeps
    // its state "").
    s.state = if spec.disabled {
        State::New
    } else if spec.boot_options.toggle_allow_netboot || spec.boot_options.boot_mode.is_some() {
        State::Preparing
    } else {
        State::Pending
    };
    Some(s)
}

/// What a step asks of the world besides the status.
#[derive(Debug, Clone, PartialEq)]
pub enum Effect {
    /// Set `netboot.allowPXE` on every interface of the Workflow's Hardware.
    AllowPxe(bool),
    /// (Re)create the BMC job `name` with `tasks`, on BMC Machine `bmc`
    /// (the Hardware's bmcRef).
    BmcJob {
        name: String,
        bmc: String,
        tasks: Vec<Action>,
    },
}

/// What a step reads besides the Workflow: its Hardware (for the bmcRef,
/// the firmware and customboot's templates) and the state of the BMC job
/// of this phase ([`phase_job`]), if it exists.
#[derive(Debug, Clone, Default)]
pub struct Context {
    pub hardware: Option<Value>,
    pub job: Option<JobState>,
}

/// `netboot-<workflow>`, as tink-controller names it.
pub fn job_name(kind: &str, workflow: &str) -> String {
    format!("{kind}-{workflow}")
}

/// The BMC job the Workflow's bootMode runs in its current state, named
/// as tink-controller names it: `netboot-`, `iso-mount-` or
/// `customboot-preparing-` in PREPARING; `iso-eject-` or `customboot-post-`
/// in POST.
pub fn phase_job(workflow: &str, spec: &WorkflowSpec, state: State) -> Option<String> {
    let kind = match (state, spec.boot_options.boot_mode?) {
        (State::Preparing, BootMode::Netboot) => "netboot",
        (State::Preparing, BootMode::Iso | BootMode::Isoboot) => "iso-mount",
        (State::Preparing, BootMode::Customboot) => "customboot-preparing",
        (State::Post, BootMode::Iso | BootMode::Isoboot) => "iso-eject",
        (State::Post, BootMode::Customboot) => "customboot-post",
        _ => return None,
    };
    Some(job_name(kind, workflow))
}

fn media(url: &str) -> Action {
    Action {
        virtual_media_action: Some(VirtualMediaAction {
            kind: MediaKind::Cd,
            media_url: url.into(),
        }),
        ..Action::default()
    }
}

/// The tasks of the phase's job, as tink-controller builds them; an error
/// is the reason the Workflow fails.
fn phase_tasks(spec: &WorkflowSpec, state: State, hw: &Value) -> Result<Vec<Action>, String> {
    let efi = hw
        .pointer("/spec/interfaces")
        .and_then(Value::as_array)
        .is_some_and(|i| {
            i.iter()
                .any(|i| i.pointer("/dhcp/uefi") == Some(&Value::Bool(true)))
        });
    let b = &spec.boot_options;
    let custom = |actions: &[Action]| {
        actions
            .iter()
            .map(|a| {
                let mut a = a.clone();
                if let Some(v) = a.virtual_media_action.as_mut() {
                    v.media_url = render::action_text(&v.media_url, hw)
                        .map_err(|e| format!("failed to template actions: {e}"))?;
                }
                Ok(a)
            })
            .collect::<Result<Vec<_>, String>>()
    };
    match (state, b.boot_mode) {
        (State::Preparing, Some(BootMode::Netboot)) => Ok(netboot_tasks(efi)),
        (State::Preparing, Some(BootMode::Iso | BootMode::Isoboot)) => {
            let url = b
                .iso_url
                .as_deref()
                .filter(|u| !u.is_empty())
                .ok_or("iso url must be a valid url")?;
            Ok(vec![
                power(PowerAction::Off),
                media(""),
                media(url),
                boot_once(BootDevice::Cdrom, efi),
                power(PowerAction::On),
            ])
        }
        (State::Post, Some(BootMode::Iso | BootMode::Isoboot)) => Ok(vec![media("")]),
        (State::Preparing, Some(BootMode::Customboot)) => {
            custom(&b.customboot_config.preparing_actions)
        }
        (State::Post, Some(BootMode::Customboot)) => custom(&b.customboot_config.post_actions),
        _ => Ok(vec![]),
    }
}

/// PREPARING, POST and RUNNING: the next status and what to do first.
/// The effect is done before the status is written; if it fails, the
/// status is not written and the step is tried again.
pub fn step(
    workflow: &str,
    spec: &WorkflowSpec,
    status: &Status,
    ctx: &Context,
    now: SystemTime,
) -> Option<(Status, Vec<Effect>)> {
    let stamp = rfc3339(now);
    let mut s = status.clone();
    let toggled = s
        .boot_options
        .get_or_insert_with(BootOptionsStatus::default)
        .allow_netboot
        .clone();
    match status.state {
        State::Preparing | State::Post => {
            let preparing = status.state == State::Preparing;
            let mut effects = vec![];
            let (want, done_flag) = if preparing {
                (true, toggled.toggled_true)
            } else {
                (false, toggled.toggled_false)
            };
            if spec.boot_options.toggle_allow_netboot && !done_flag {
                effects.push(Effect::AllowPxe(want));
                if let Some(b) = s.boot_options.as_mut() {
                    if want {
                        b.allow_netboot.toggled_true = true;
                    } else {
                        b.allow_netboot.toggled_false = true;
                    }
                }
                let (kind, message) = if want {
                    ("AllowNetbootTrue", "allowPXE set on every interface")
                } else {
                    ("AllowNetbootFalse", "allowPXE cleared on every interface")
                };
                set_condition(
                    &mut s,
                    named(kind, true, "Complete", message.into(), &stamp),
                );
            }
            let next = if preparing {
                State::Pending
            } else {
                State::Success
            };
            let Some(name) = phase_job(workflow, spec, status.state) else {
                s.state = next;
                return Some((s, effects));
            };
            let changed = boot_job(&mut s, &mut effects, &name, spec, ctx, next, &stamp);
            (changed || !effects.is_empty()).then_some((s, effects))
        }
        State::Running => {
            let timeout = status.global_timeout.unwrap_or(0);
            if timeout <= 0 {
                return None;
            }
            match status
                .global_execution_stop
                .as_deref()
                .map(humantime::parse_rfc3339)
            {
                None => {
                    let stop = now.checked_add(Duration::from_secs(timeout.unsigned_abs()))?;
                    s.global_execution_stop = Some(rfc3339(stop));
                    Some((s, vec![]))
                }
                Some(Ok(stop)) if now > stop => {
                    s.state = State::Timeout;
                    Some((s, vec![]))
                }
                _ => None,
            }
        }
        _ => None,
    }
}

/// The boot job of PREPARING or POST: create it once, then follow it to
/// `next` (completed) or FAILED. A phase with no tasks (customboot without
/// actions) goes straight to `next`. True when the status changed.
fn boot_job(
    s: &mut Status,
    effects: &mut Vec<Effect>,
    name: &str,
    spec: &WorkflowSpec,
    ctx: &Context,
    next: State,
    stamp: &str,
) -> bool {
    let fail = |s: &mut Status, kind: &str, message: String| {
        s.state = State::Failed;
        set_condition(s, named(kind, true, "Error", message, stamp));
        true
    };
    let Some(hw) = &ctx.hardware else {
        return fail(
            s,
            "BootJobSetupFailed",
            format!("failed to get hardware: {} not found", spec.hardware_ref),
        );
    };
    let Some(bmc) = hw
        .pointer("/spec/bmcRef/name")
        .and_then(Value::as_str)
        .filter(|n| !n.is_empty())
        .map(String::from)
    else {
        return fail(
            s,
            "BootJobSetupFailed",
            format!(
                "bootMode {} needs the Hardware's spec.bmcRef",
                spec.boot_options
                    .boot_mode
                    .map(BootMode::as_str)
                    .unwrap_or_default()
            ),
        );
    };
    let jobs = &mut s
        .boot_options
        .get_or_insert_with(BootOptionsStatus::default)
        .jobs;
    let created = jobs.get(name).is_some_and(|j| j.existing_job_deleted);
    match (created, ctx.job) {
        // Not made yet, or made and since deleted by someone: (re)create.
        (false, _) | (true, None) => {
            let tasks = match phase_tasks(spec, s.state, hw) {
                Ok(t) => t,
                Err(e) => return fail(s, "BootJobSetupFailed", e),
            };
            if tasks.is_empty() {
                s.state = next;
                return true;
            }
            jobs.insert(
                name.into(),
                JobStatus {
                    complete: false,
                    existing_job_deleted: true,
                },
            );
            effects.push(Effect::BmcJob {
                name: name.into(),
                bmc,
                tasks,
            });
            set_condition(
                s,
                named(
                    "BootJobSetupComplete",
                    true,
                    "Created",
                    format!("job {name} created"),
                    stamp,
                ),
            );
            true
        }
        (true, Some(JobState::Completed)) => {
            if let Some(j) = jobs.get_mut(name) {
                j.complete = true;
            }
            s.state = next;
            set_condition(
                s,
                named(
                    "BootJobComplete",
                    true,
                    "Complete",
                    format!("job {name} completed"),
                    stamp,
                ),
            );
            true
        }
        (true, Some(JobState::Failed)) => fail(
            s,
            "BootJobFailed",
            format!("job {name} failed (see: tinkerbox bmc job get {name})"),
        ),
        (true, Some(JobState::Pending | JobState::Running)) => set_condition(
            s,
            named(
                "BootJobRunning",
                true,
                "Running",
                format!("job {name} is running"),
                stamp,
            ),
        ),
    }
}

fn named(kind: &str, ok: bool, reason: &str, message: String, now: &str) -> Condition {
    Condition {
        kind: kind.into(),
        ..condition(ok, reason, message, now)
    }
}

fn condition(ok: bool, reason: &str, message: String, now: &str) -> Condition {
    Condition {
        kind: TEMPLATE_RENDERED.into(),
        status: if ok { "True" } else { "False" }.into(),
        reason: Some(reason.into()),
        message: Some(message),
        time: Some(now.into()),
    }
}

/// Set a condition of its type; false when only its time would change
/// (upstream's SetConditionIfDifferent).
fn set_condition(s: &mut Status, c: Condition) -> bool {
    match s.conditions.iter_mut().find(|o| o.kind == c.kind) {
        Some(o) if o.status == c.status && o.reason == c.reason && o.message == c.message => false,
        Some(o) => {
            *o = c;
            true
        }
        None => {
            s.conditions.push(c);
            true
        }
    }
}

pub fn rfc3339(t: SystemTime) -> String {
    humantime::format_rfc3339_seconds(t).to_string()
}

/// The loop: woken by every Template or Workflow change, and every few
/// seconds to retry what could not render (a Template or Hardware that
/// was missing may have come).
pub struct Engine {
    store: Store,
    services: Arc<Services>,
    wake: Arc<Notify>,
}

impl Engine {
    pub fn new(store: Store, services: Arc<Services>) -> Engine {
        let wake = services.workflow.wake.clone();
        Engine {
            store,
            services,
            wake,
        }
    }

    pub async fn run(self) {
        let mut last_full: Option<tokio::time::Instant> = None;
        loop {
            // RUNNING Workflows only need the timeout check, which is to the
            // second: every few seconds, not on every wake (a rack of agents
            // reporting wakes the engine hundreds of times a second, and a
            // pass reads every Workflow it visits).
            let full = last_full.is_none_or(|t| t.elapsed() >= FULL_PASS_EVERY);
            if full {
                last_full = Some(tokio::time::Instant::now());
            }
            if let Err(e) = self.pass(full).await {
                tracing::error!(error = %e, "workflow engine: pass failed");
            }
            tokio::select! {
                _ = self.wake.notified() => {}
                _ = tokio::time::sleep(FULL_PASS_EVERY) => {}
            }
        }
    }

    async fn pass(&self, full: bool) -> Result<(), StoreError> {
        for row in self.store.workflows(None, &[State::New]).await? {
            if crate::kinds::disabled(&row.doc).is_some() {
                continue;
            }
            if let Err(e) = self.render(&row).await {
                tracing::warn!(workflow = %row.key, error = %e, "workflow engine: rendering");
            }
        }
        let active: &[State] = if full {
            &[State::Preparing, State::Running, State::Post]
        } else {
            &[State::Preparing, State::Post]
        };
        for row in self.store.workflows(None, active).await? {
            if crate::kinds::disabled(&row.doc).is_some() {
                continue;
            }
            let spec = spec_of(&row);
            let ctx = self.context(&row, &spec).await?;
            let Some((next, effects)) =
                step(&row.key.name, &spec, &row.status, &ctx, SystemTime::now())
            else {
                continue;
            };
            if let Err(e) = self.apply(&row, &spec, &effects).await {
                tracing::warn!(workflow = %row.key, error = %e, "workflow engine: step");
                continue;
            }
            // Through the service: every state change is an event and a metric.
            match self.services.workflow.save_status(&row, &next).await {
                Ok(_) | Err(StoreError::Stale { .. }) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// What [`step`] reads: only for a Workflow whose bootMode runs a job
    /// in its state.
    async fn context(&self, row: &WorkflowRow, spec: &WorkflowSpec) -> Result<Context, StoreError> {
        let Some(name) = phase_job(&row.key.name, spec, row.status.state) else {
            return Ok(Context::default());
        };
        let ns = &row.key.namespace;
        let hardware = self
            .store
            .get(&Key::new(ns.clone(), spec.hardware_ref.clone()))
            .await?;
        let job = self
            .store
            .job(&Key::new(ns.clone(), name))
            .await?
            .map(|j| j.state);
        Ok(Context { hardware, job })
    }

    async fn apply(
        &self,
        row: &WorkflowRow,
        spec: &WorkflowSpec,
        effects: &[Effect],
    ) -> Result<(), crate::services::Error> {
        let ns = &row.key.namespace;
        for e in effects {
            match e {
                Effect::AllowPxe(on) => {
                    let key = Key::new(ns.clone(), spec.hardware_ref.clone());
                    self.services
                        .hardware
                        .update(&key, |doc| {
                            set_allow_pxe(doc, *on);
                            Ok(())
                        })
                        .await?;
                }
                Effect::BmcJob { name, bmc, tasks } => {
                    let key = Key::new(ns.clone(), name.clone());
                    let machine = Key::new(ns.clone(), bmc.clone());
                    // This rendering's id: its first task's, a fresh ULID.
                    let run = row
                        .status
                        .tasks
                        .first()
                        .map(|t| t.id.as_str())
                        .unwrap_or(row.key.name.as_str());
                    self.services
                        .bmc
                        .start_named_job(&key, &machine, tasks.clone(), run)
                        .await?;
                }
            }
        }
        Ok(())
    }

    async fn render(&self, row: &WorkflowRow) -> Result<(), StoreError> {
        let spec = spec_of(row);
        if spec.disabled && row.status.template_rendering.is_some() {
            return Ok(());
        }
        let ns = &row.key.namespace;
        let template = self
            .store
            .template(&crate::hardware::Key::new(
                ns.clone(),
                spec.template_ref.clone(),
            ))
            .await?;
        let hardware = if spec.hardware_ref.is_empty() {
            None
        } else {
            self.store
                .get(&crate::hardware::Key::new(
                    ns.clone(),
                    spec.hardware_ref.clone(),
                ))
                .await?
        };
        let data = template
            .as_ref()
            .and_then(|t| t.pointer("/spec/data"))
            .and_then(Value::as_str);
        let found = Found {
            template: data,
            hardware: hardware.as_ref(),
        };
        let Some(next) = render_step(&spec, &row.status, found, &rfc3339(SystemTime::now())) else {
            return Ok(());
        };
        match self.services.workflow.save_status(row, &next).await {
            // Someone else wrote it since it was read: the next pass sees it.
            Ok(_) | Err(StoreError::Stale { .. }) => Ok(()),
            Err(e) => Err(e),
        }
    }
}

fn spec_of(row: &WorkflowRow) -> WorkflowSpec {
    match row.doc.get("spec").cloned().map(serde_json::from_value) {
        Some(Ok(s)) => s,
        _ => WorkflowSpec::default(),
    }
}

/// `netboot.allowPXE` on every interface, as tink-controller sets it.
pub fn set_allow_pxe(doc: &mut Value, on: bool) {
    if let Some(Value::Array(ifaces)) = doc.pointer_mut("/spec/interfaces") {
        for i in ifaces.iter_mut() {
            match i.get_mut("netboot") {
                Some(Value::Object(n)) => {
                    n.insert("allowPXE".into(), Value::Bool(on));
                }
                _ => i["netboot"] = serde_json::json!({ "allowPXE": on }),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workflow::model::BootMode;
    use serde_json::json;

    const T: &str = "version: '0.1'\nname: t\nglobal_timeout: 60\ntasks:\n- name: a\n  worker: '{{.device_1}}'\n  actions:\n  - name: x\n    image: bash\n";

    fn spec() -> WorkflowSpec {
        WorkflowSpec {
            template_ref: "t".into(),
            hardware_ref: "h".into(),
            hardware_map: [("device_1".to_string(), "02:00:00:00:00:01".to_string())].into(),
            ..WorkflowSpec::default()
        }
    }

    #[test]
    fn a_rendered_workflow_is_pending_or_preparing() {
        let hw = json!({"spec": {}});
        let found = || Found {
            template: Some(T),
            hardware: Some(&hw),
        };
        let s = render_step(&spec(), &Status::default(), found(), "t0").unwrap();
        assert_eq!(s.state, State::Pending);
        assert_eq!(s.agent_id.as_deref(), Some("02:00:00:00:00:01"));
        assert_eq!(s.template_rendering, Some(TemplateRendering::Successful));
        assert_eq!(s.conditions[0].status, "True");
        let mut sp = spec();
        sp.boot_options.boot_mode = Some(BootMode::Netboot);
        assert_eq!(
            render_step(&sp, &Status::default(), found(), "t0")
                .unwrap()
                .state,
            State::Preparing
        );
        sp.disabled = true;
        assert_eq!(
            render_step(&sp, &Status::default(), found(), "t0")
                .unwrap()
                .state,
            State::New
        );
    }

    #[test]
    fn netboot_is_toggled_around_the_workflow() {
        let mut sp = spec();
        sp.boot_options.toggle_allow_netboot = true;
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        let s = Status {
            state: State::Preparing,
            ..Status::default()
        };
        let (s, fx) = step("wf", &sp, &s, &Context::default(), now).unwrap();
        assert_eq!(
            (s.state, fx),
            (State::Pending, vec![Effect::AllowPxe(true)])
        );
        assert!(s.boot_options.as_ref().unwrap().allow_netboot.toggled_true);
        let post = Status {
            state: State::Post,
            ..s
        };
        let (s, fx) = step("wf", &sp, &post, &Context::default(), now).unwrap();
        assert_eq!(
            (s.state, fx),
            (State::Success, vec![Effect::AllowPxe(false)])
        );
        let kinds: Vec<_> = s.conditions.iter().map(|c| c.kind.as_str()).collect();
        assert_eq!(kinds, ["AllowNetbootTrue", "AllowNetbootFalse"]);
        // Without the toggle: straight through, nothing done to the Hardware.
        let post = Status {
            state: State::Post,
            ..Status::default()
        };
        let (s, fx) = step("wf", &spec(), &post, &Context::default(), now).unwrap();
        assert_eq!((s.state, fx.len()), (State::Success, 0));
        let mut doc =
            json!({"spec": {"interfaces": [{"dhcp": {}}, {"netboot": {"allowWorkflow": true}}]}});
        set_allow_pxe(&mut doc, true);
        assert_eq!(doc["spec"]["interfaces"][0]["netboot"]["allowPXE"], true);
        assert_eq!(
            doc["spec"]["interfaces"][1]["netboot"],
            json!({"allowWorkflow": true, "allowPXE": true})
        );
    }

    fn hw(bmc: bool) -> Value {
        let mut h = json!({"spec": {"interfaces": [{"dhcp": {"mac": "02:00:00:00:00:01", "uefi": true}}],
            "metadata": {"instance": {"id": "i-1"}}}});
        if bmc {
            h["spec"]["bmcRef"] = json!({"kind": "Machine", "name": "bmc-1"});
        }
        h
    }

    fn ctx(job: Option<JobState>) -> Context {
        Context {
            hardware: Some(hw(true)),
            job,
        }
    }

    fn at(state: State) -> Status {
        Status {
            state,
            ..Status::default()
        }
    }

    fn now() -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000)
    }

    /// bootMode netboot: the job is created once, followed, and decides.
    #[test]
    fn netboot_runs_a_bmc_job_and_waits_for_it() {
        let mut sp = spec();
        sp.boot_options.boot_mode = Some(BootMode::Netboot);
        let prep = at(State::Preparing);
        let (s, fx) = step("wf", &sp, &prep, &ctx(None), now()).unwrap();
        assert_eq!(
            fx,
            [Effect::BmcJob {
                name: "netboot-wf".into(),
                bmc: "bmc-1".into(),
                tasks: netboot_tasks(true),
            }]
        );
        assert_eq!(s.state, State::Preparing);
        assert!(s.boot_options.as_ref().unwrap().jobs["netboot-wf"].existing_job_deleted);
        // Running: said once, then nothing to write.
        let (s, fx) = step("wf", &sp, &s, &ctx(Some(JobState::Running)), now()).unwrap();
        assert!(fx.is_empty() && s.conditions.iter().any(|c| c.kind == "BootJobRunning"));
        assert!(step("wf", &sp, &s, &ctx(Some(JobState::Running)), now()).is_none());
        let (done, _) = step("wf", &sp, &s, &ctx(Some(JobState::Completed)), now()).unwrap();
        assert_eq!(done.state, State::Pending);
        assert!(done.boot_options.as_ref().unwrap().jobs["netboot-wf"].complete);
        let (failed, _) = step("wf", &sp, &s, &ctx(Some(JobState::Failed)), now()).unwrap();
        assert_eq!(failed.state, State::Failed);
        // Deleted by someone while it ran: made again.
        let (_, fx) = step("wf", &sp, &s, &ctx(None), now()).unwrap();
        assert_eq!(fx.len(), 1);
        // No bmcRef on the Hardware, or no Hardware: FAILED, saying why.
        let no_bmc = Context {
            hardware: Some(hw(false)),
            job: None,
        };
        let (s, fx) = step("wf", &sp, &prep, &no_bmc, now()).unwrap();
        assert_eq!((s.state, fx.len()), (State::Failed, 0));
        let said = |s: &Status, what: &str| {
            s.conditions
                .iter()
                .any(|c| c.message.as_deref().unwrap_or("").contains(what))
        };
        assert!(said(
            &s,
            "bootMode netboot needs the Hardware's spec.bmcRef"
        ));
        let (s, _) = step("wf", &sp, &prep, &Context::default(), now()).unwrap();
        assert!(s.state == State::Failed && said(&s, "failed to get hardware: h not found"));
    }

    /// bootMode iso/isoboot: mount in PREPARING, eject in POST, both as
    /// tink-controller builds them.
    #[test]
    fn isoboot_mounts_the_iso_and_ejects_it_after() {
        let mut sp = spec();
        sp.boot_options.boot_mode = Some(BootMode::Isoboot);
        sp.boot_options.iso_url = Some("http://10.0.0.1:7080/hook.iso".into());
        sp.boot_options.toggle_allow_netboot = true;
        let (s, fx) = step("wf", &sp, &at(State::Preparing), &ctx(None), now()).unwrap();
        let Effect::BmcJob { name, bmc, tasks } = &fx[1] else {
            panic!("{fx:?}")
        };
        assert_eq!(fx[0], Effect::AllowPxe(true));
        assert_eq!((name.as_str(), bmc.as_str()), ("iso-mount-wf", "bmc-1"));
        let described: Vec<String> = tasks.iter().map(Action::describe).collect();
        assert_eq!(
            described,
            [
                "power off",
                "virtual media CD: eject",
                "virtual media CD: insert http://10.0.0.1:7080/hook.iso",
                "boot device cdrom (once) EFI",
                "power on"
            ]
        );
        let (s, _) = step("wf", &sp, &s, &ctx(Some(JobState::Completed)), now()).unwrap();
        assert_eq!(s.state, State::Pending);
        // POST: allowPXE off and the eject job, then SUCCESS when it is done.
        let mut post = s.clone();
        post.state = State::Post;
        let (s, fx) = step("wf", &sp, &post, &ctx(None), now()).unwrap();
        assert_eq!(s.state, State::Post);
        assert_eq!(fx[0], Effect::AllowPxe(false));
        let Effect::BmcJob { name, tasks, .. } = &fx[1] else {
            panic!("{fx:?}")
        };
        assert_eq!(name, "iso-eject-wf");
        assert_eq!(tasks[..], [media("")]);
        let (s, fx) = step("wf", &sp, &s, &ctx(Some(JobState::Completed)), now()).unwrap();
        assert_eq!((s.state, fx.len()), (State::Success, 0));
        let jobs = &s.boot_options.as_ref().unwrap().jobs;
        assert!(jobs["iso-mount-wf"].complete && jobs["iso-eject-wf"].complete);
        // A failed eject fails the Workflow.
        let (s, _) = step("wf", &sp, &post, &ctx(None), now()).unwrap();
        let (s, _) = step("wf", &sp, &s, &ctx(Some(JobState::Failed)), now()).unwrap();
        assert_eq!(s.state, State::Failed);
    }

    /// bootMode customboot: the user's actions, mediaURL templated over the
    /// Hardware; none at all goes straight on.
    #[test]
    fn customboot_runs_the_users_actions() {
        let mut sp = spec();
        sp.boot_options.boot_mode = Some(BootMode::Customboot);
        sp.boot_options.customboot_config.preparing_actions = vec![
            media("http://10.0.0.1/{{ .Hardware.Metadata.Instance.ID }}.iso"),
            power(PowerAction::Cycle),
        ];
        let (_, fx) = step("wf", &sp, &at(State::Preparing), &ctx(None), now()).unwrap();
        let Effect::BmcJob { name, tasks, .. } = &fx[0] else {
            panic!("{fx:?}")
        };
        assert_eq!(name, "customboot-preparing-wf");
        assert_eq!(
            tasks[..],
            [media("http://10.0.0.1/i-1.iso"), power(PowerAction::Cycle)]
        );
        // No post actions: POST goes to SUCCESS without a job.
        let (s, fx) = step("wf", &sp, &at(State::Post), &ctx(None), now()).unwrap();
        assert_eq!((s.state, fx.len()), (State::Success, 0));
        // A template that fails to render fails the Workflow, saying why.
        sp.boot_options.customboot_config.preparing_actions = vec![media("{{ .Hardware.Nope }}")];
        let (s, fx) = step("wf", &sp, &at(State::Preparing), &ctx(None), now()).unwrap();
        assert_eq!((s.state, fx.len()), (State::Failed, 0));
        assert!(
            s.conditions.iter().any(|c| c.kind == "BootJobSetupFailed"
                && c.message
                    .as_deref()
                    .unwrap_or("")
                    .contains("failed to template actions")),
            "{s:?}"
        );
    }

    #[test]
    fn the_global_timeout_ends_a_running_workflow() {
        let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        let s = Status {
            state: State::Running,
            global_timeout: Some(60),
            ..Status::default()
        };
        let (s, _) = step("wf", &spec(), &s, &Context::default(), t0).unwrap();
        assert_eq!(
            s.global_execution_stop.as_deref(),
            Some("2027-01-15T08:01:00Z")
        );
        assert!(
            step(
                "wf",
                &spec(),
                &s,
                &Context::default(),
                t0 + Duration::from_secs(60)
            )
            .is_none()
        );
        let (s, _) = step(
            "wf",
            &spec(),
            &s,
            &Context::default(),
            t0 + Duration::from_secs(61),
        )
        .unwrap();
        assert_eq!(s.state, State::Timeout);
        let none = Status {
            state: State::Running,
            global_timeout: Some(0),
            ..Status::default()
        };
        assert!(step("wf", &spec(), &none, &Context::default(), t0).is_none());
    }

    #[test]
    fn failures_are_conditions_and_not_rewritten_when_the_same() {
        let hw = json!({"spec": {}});
        let s = render_step(
            &spec(),
            &Status::default(),
            Found {
                template: None,
                hardware: Some(&hw),
            },
            "t0",
        )
        .unwrap();
        assert_eq!(s.state, State::New);
        assert_eq!(s.template_rendering, Some(TemplateRendering::Failed));
        assert_eq!(
            s.conditions[0].message.as_deref(),
            Some("template not found: t")
        );
        // The same failure again, later: nothing to write.
        assert!(
            render_step(
                &spec(),
                &s,
                Found {
                    template: None,
                    hardware: Some(&hw)
                },
                "t1"
            )
            .is_none()
        );
        let s2 = render_step(
            &spec(),
            &s,
            Found {
                template: Some(T),
                hardware: None,
            },
            "t1",
        )
        .unwrap();
        assert_eq!(s2.conditions.len(), 1);
        assert_eq!(
            s2.conditions[0].message.as_deref(),
            Some("hardware not found: h")
        );
        let mut sp = spec();
        sp.hardware_map.clear();
        let s3 = render_step(
            &sp,
            &s2,
            Found {
                template: Some(T),
                hardware: Some(&hw),
            },
            "t2",
        )
        .unwrap();
        assert!(
            s3.conditions[0]
                .message
                .as_deref()
                .unwrap()
                .contains("device_1"),
            "{s3:?}"
        );
        // And once it renders, the condition turns True.
        let ok = render_step(
            &spec(),
            &s3,
            Found {
                template: Some(T),
                hardware: Some(&hw),
            },
            "t3",
        )
        .unwrap();
        assert_eq!(ok.conditions.len(), 1);
        assert_eq!(ok.conditions[0].status, "True");
    }
}
