//! Tink's documents (`tinkerbell.org/v1alpha1` Template and Workflow) and
//! the Workflow's `status`, in the field names of the current CRDs
//! (`crd-tinkerbell.org_workflows.yaml`). Documents are kept whole as
//! applied, like Hardware; these types are the checked view, and the
//! status is what the engine writes.

use crate::hardware::{self, FieldError, Key};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use serde_with::skip_serializing_none;
use std::collections::BTreeMap;

pub const API_VERSION: &str = hardware::API_VERSION;

/// A Template: `spec.data` is the Go template text.
#[derive(Debug, Clone, PartialEq)]
pub struct Template {
    pub key: Key,
    pub data: String,
    /// The document as applied.
    pub doc: Value,
}

/// A Workflow's `spec`.
#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct WorkflowSpec {
    #[serde(default)]
    pub template_ref: String,
    #[serde(default)]
    pub hardware_ref: String,
    #[serde(default)]
    pub hardware_map: BTreeMap<String, String>,
    #[serde(default)]
    pub disabled: bool,
    #[serde(default)]
    pub boot_options: BootOptions,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct BootOptions {
    #[serde(default)]
    pub toggle_allow_netboot: bool,
    #[serde(default)]
    pub boot_mode: Option<BootMode>,
    #[serde(default, rename = "isoURL")]
    pub iso_url: Option<String>,
    #[serde(default)]
    pub customboot_config: CustombootConfig,
}

/// `bootMode: customboot`: BMC actions of the user's own, run as the jobs
/// `customboot-preparing-<workflow>` and `customboot-post-<workflow>`.
/// A `virtualMediaAction.mediaURL` is a Go template over the Hardware's
/// spec (`{{ .Hardware.Metadata.Instance.ID }}`), as upstream renders it.
#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct CustombootConfig {
    #[serde(default)]
    pub preparing_actions: Vec<crate::bmc::model::Action>,
    #[serde(default)]
    pub post_actions: Vec<crate::bmc::model::Action>,
}

#[derive(Debug, Clone, Copy, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum BootMode {
    Netboot,
    Iso,
    Isoboot,
    Customboot,
}

impl BootMode {
    pub fn as_str(self) -> &'static str {
        match self {
            BootMode::Netboot => "netboot",
            BootMode::Iso => "iso",
            BootMode::Isoboot => "isoboot",
            BootMode::Customboot => "customboot",
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct Workflow {
    pub key: Key,
    pub spec: WorkflowSpec,
    /// The document as applied (without `status`).
    pub doc: Value,
}

/// The states of the current CRD.
#[derive(Debug, Clone, Copy, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "UPPERCASE")]
pub enum State {
    /// Not yet rendered (the CRD's `""`).
    #[default]
    #[serde(rename = "")]
    New,
    Preparing,
    Pending,
    Running,
    Post,
    Success,
    Failed,
    Timeout,
}

impl State {
    pub fn as_str(self) -> &'static str {
        match self {
            State::New => "",
            State::Preparing => "PREPARING",
            State::Pending => "PENDING",
            State::Running => "RUNNING",
            State::Post => "POST",
            State::Success => "SUCCESS",
            State::Failed => "FAILED",
            State::Timeout => "TIMEOUT",
        }
    }

    pub fn is_final(self) -> bool {
        matches!(self, State::Success | State::Failed | State::Timeout)
    }
}

#[derive(Debug, Clone, Copy, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum TemplateRendering {
    Successful,
    Failed,
}

/// `status` of a Workflow, field for field as the CRD names them.
#[skip_serializing_none]
#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Status {
    #[serde(default)]
    pub state: State,
    #[serde(rename = "agentID")]
    pub agent_id: Option<String>,
    pub template_rendering: Option<TemplateRendering>,
    pub global_timeout: Option<i64>,
    pub global_execution_stop: Option<String>,
    pub current_state: Option<CurrentState>,
    pub boot_options: Option<BootOptionsStatus>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tasks: Vec<Task>,
}

#[skip_serializing_none]
#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct CurrentState {
    #[serde(rename = "agentID")]
    pub agent_id: Option<String>,
    #[serde(rename = "taskID")]
    pub task_id: Option<String>,
    #[serde(rename = "actionID")]
    pub action_id: Option<String>,
    pub state: Option<State>,
    pub action_name: Option<String>,
    pub task_name: Option<String>,
}

/// `status.bootOptions`: what the engine did to the Hardware for the
/// Workflow, so that each step is done once.
#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct BootOptionsStatus {
    #[serde(default)]
    pub allow_netboot: AllowNetboot,
    /// The BMC jobs of the boot options, by name (`netboot-<workflow>`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub jobs: BTreeMap<String, JobStatus>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct JobStatus {
    #[serde(default)]
    pub complete: bool,
    /// The job was (re)created: an older one of its name is gone.
    #[serde(default)]
    pub existing_job_deleted: bool,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct AllowNetboot {
    #[serde(default)]
    pub toggled_true: bool,
    #[serde(default)]
    pub toggled_false: bool,
}

#[skip_serializing_none]
#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq)]
pub struct Condition {
    #[serde(rename = "type")]
    pub kind: String,
    /// "True" or "False".
    pub status: String,
    pub reason: Option<String>,
    pub message: Option<String>,
    pub time: Option<String>,
}

#[skip_serializing_none]
#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Task {
    pub id: String,
    pub name: String,
    #[serde(rename = "agentID")]
    pub agent_id: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub volumes: Vec<String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub environment: BTreeMap<String, String>,
    #[serde(default)]
    pub actions: Vec<Action>,
}

#[skip_serializing_none]
#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Action {
    pub id: String,
    pub name: String,
    pub image: String,
    #[serde(default)]
    pub timeout: i64,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub command: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub volumes: Vec<String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub environment: BTreeMap<String, String>,
    pub pid: Option<String>,
    pub namespaces: Option<super::template::Namespaces>,
    #[serde(default)]
    pub state: State,
    pub execution_start: Option<String>,
    pub execution_stop: Option<String>,
    pub execution_duration: Option<String>,
    pub message: Option<String>,
}

/// What of a status must never be lost once a worker was told it was
/// taken: the states of the Workflow, of its current action and of every
/// action; not messages or times (a progress report's).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Milestones {
    state: State,
    current: Option<(Option<String>, Option<State>)>,
    actions: Vec<State>,
}

/// How the current run of an operation stands (a Workflow, or a BMC job
/// its maker follows): a run from before a retry or a new request is
/// None.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Run {
    #[default]
    None,
    Running,
    Succeeded,
    Failed(String),
}

impl Status {
    /// Why a Workflow failed, for a caller that reports it: its first
    /// failed action, else a False condition's message, else its state.
    pub fn failure(&self) -> String {
        self.tasks
            .iter()
            .flat_map(|t| &t.actions)
            .find(|a| matches!(a.state, State::Failed | State::Timeout))
            .map(|a| {
                format!(
                    "action {:?} {}: {}",
                    a.name,
                    a.state.as_str(),
                    a.message.as_deref().unwrap_or("")
                )
            })
            .or_else(|| {
                self.conditions
                    .iter()
                    .find(|c| c.status == "False")
                    .and_then(|c| c.message.clone())
            })
            .unwrap_or_else(|| format!("the Workflow ended {}", self.state.as_str()))
    }

    pub fn milestones(&self) -> Milestones {
        Milestones {
            state: self.state,
            current: self
                .current_state
                .as_ref()
                .map(|c| (c.action_id.clone(), c.state)),
            actions: self
                .tasks
                .iter()
                .flat_map(|t| t.actions.iter().map(|a| a.state))
                .collect(),
        }
    }

    /// The status of a freshly rendered document (tink-controller's
    /// `YAMLToStatus`): task and action ids are ULIDs, every action is
    /// PENDING, the agent is the first task's worker.
    pub fn rendered(doc: &super::template::Document) -> Status {
        let tasks: Vec<Task> = doc
            .tasks
            .iter()
            .map(|t| Task {
                id: ulid::Ulid::new().to_string(),
                name: t.name.clone(),
                agent_id: t.worker.clone(),
                volumes: t.volumes.clone(),
                environment: t.environment.clone(),
                actions: t
                    .actions
                    .iter()
                    .map(|a| Action {
                        id: ulid::Ulid::new().to_string(),
                        name: a.name.clone(),
                        image: a.image.clone(),
                        timeout: a.timeout,
                        command: a.command.clone(),
                        volumes: a.volumes.clone(),
                        environment: a.environment.clone(),
                        pid: (!a.pid.is_empty()).then(|| a.pid.clone()),
                        namespaces: a
                            .namespaces
                            .clone()
                            .filter(|n| !n.network.is_empty() || !n.pid.is_empty()),
                        state: State::Pending,
                        ..Action::default()
                    })
                    .collect(),
            })
            .collect();
        Status {
            agent_id: tasks.first().map(|t| t.agent_id.clone()),
            global_timeout: Some(doc.global_timeout),
            template_rendering: Some(TemplateRendering::Successful),
            tasks,
            ..Status::default()
        }
    }
}

/// A Template document, checked: `spec.data` must be a string (the Go
/// template is rendered per Workflow, so only its syntax is checked here).
pub fn template(mut doc: Value) -> Result<Template, FieldError> {
    expect_kind(&doc, "Template")?;
    let key = hardware::object_key(&mut doc)?;
    let data = match doc.pointer("/spec/data") {
        Some(Value::String(s)) => s.clone(),
        Some(other) => {
            return Err(FieldError::new(
                "spec.data",
                format!(
                    "must be a string (the template text), got {}",
                    kind_of(other)
                ),
            ));
        }
        None => return Err(FieldError::new("spec.data", "required")),
    };
    gotmpl::Template::new("t")
        .funcs(super::funcs::map())
        .parse(&data)
        .map_err(|e| FieldError::new("spec.data", format!("template does not parse: {e}")))?;
    Ok(Template { key, data, doc })
}

/// A Workflow document, checked. Its `status`, if any, is dropped: the
/// engine owns it (as the API server's status subresource does).
pub fn workflow(mut doc: Value) -> Result<Workflow, FieldError> {
    expect_kind(&doc, "Workflow")?;
    let key = hardware::object_key(&mut doc)?;
    if let Some(o) = doc.as_object_mut() {
        o.remove("status");
    }
    let spec: WorkflowSpec = hardware::typed(doc.get("spec").unwrap_or(&Value::Null), "spec")?;
    if spec.template_ref.trim().is_empty() {
        return Err(FieldError::new("spec.templateRef", "required"));
    }
    if matches!(
        spec.boot_options.boot_mode,
        Some(BootMode::Iso | BootMode::Isoboot)
    ) && spec
        .boot_options
        .iso_url
        .as_deref()
        .is_none_or(|u| u.trim().is_empty())
    {
        return Err(FieldError::new(
            "spec.bootOptions.isoURL",
            "required when bootMode is iso or isoboot",
        ));
    }
    if let Some(u) = spec
        .boot_options
        .iso_url
        .as_deref()
        .filter(|u| !u.trim().is_empty())
    {
        crate::bmc::model::media_url(u)
            .map_err(|m| FieldError::new("spec.bootOptions.isoURL", m))?;
    }
    let c = &spec.boot_options.customboot_config;
    for (list, name) in [
        (&c.preparing_actions, "preparingActions"),
        (&c.post_actions, "postActions"),
    ] {
        for (i, a) in list.iter().enumerate() {
            crate::bmc::model::check_action(
                a,
                &format!("spec.bootOptions.custombootConfig.{name}[{i}]"),
            )?;
        }
    }
    if spec.boot_options.boot_mode.is_some() && spec.hardware_ref.trim().is_empty() {
        return Err(FieldError::new(
            "spec.hardwareRef",
            "required when bootOptions.bootMode is set (the BMC is the Hardware's bmcRef)",
        ));
    }
    Ok(Workflow { key, spec, doc })
}

fn expect_kind(doc: &Value, kind: &str) -> Result<(), FieldError> {
    match doc.get("apiVersion").and_then(Value::as_str) {
        Some(API_VERSION) => {}
        other => {
            return Err(FieldError::new(
                "apiVersion",
                format!("want {API_VERSION}, got {other:?}"),
            ));
        }
    }
    match doc.get("kind").and_then(Value::as_str) {
        Some(k) if k == kind => Ok(()),
        other => Err(FieldError::new(
            "kind",
            format!("want {kind}, got {other:?}"),
        )),
    }
}

fn kind_of(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "a mapping",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn compat(prefix: &str) -> Vec<(String, Value)> {
        let dir = crate::compat_dir();
        let mut out = vec![];
        for e in std::fs::read_dir(&dir).unwrap() {
            let p = e.unwrap().path();
            let name = p.file_name().unwrap().to_string_lossy().to_string();
            if name.starts_with(prefix) {
                let text = std::fs::read_to_string(&p).unwrap();
                for d in crate::hardware::documents::parse_documents(&text).unwrap() {
                    out.push((name.clone(), d));
                }
            }
        }
        out
    }

    #[test]
    fn every_compat_template_and_workflow_is_accepted_and_kept_whole() {
        let templates = compat("template-");
        assert_eq!(templates.len(), 4);
        for (name, d) in templates {
            let t = template(d.clone()).unwrap_or_else(|e| panic!("{name}: {e}"));
            assert_eq!(t.doc["spec"], d["spec"], "{name}");
        }
        let workflows = compat("workflow-");
        assert_eq!(workflows.len(), 2);
        for (name, d) in workflows {
            let w = workflow(d.clone()).unwrap_or_else(|e| panic!("{name}: {e}"));
            assert_eq!(w.doc, d, "{name}");
            assert!(w.spec.hardware_map.contains_key("device_1"));
        }
    }

    #[test]
    fn bad_documents_name_the_field() {
        let wf = |spec: Value| {
            workflow(json!({"apiVersion": API_VERSION, "kind": "Workflow", "metadata": {"name": "w"}, "spec": spec}))
                .unwrap_err()
                .to_string()
        };
        assert!(wf(json!({})).contains("spec.templateRef: required"));
        assert!(
            wf(json!({"templateRef": "t", "hardwareMap": {"a": [1]}}))
                .contains("spec.hardwareMap.a")
        );
        assert!(
            wf(json!({"templateRef": "t", "bootOptions": {"bootMode": "floppy"}}))
                .contains("spec.bootOptions.bootMode")
        );
        assert!(
            wf(json!({"templateRef": "t", "hardwareRef": "h", "bootOptions": {"bootMode": "iso"}}))
                .contains("isoURL")
        );
        assert!(
            wf(json!({"templateRef": "t", "bootOptions": {"bootMode": "netboot"}}))
                .contains("spec.hardwareRef")
        );
        assert!(
            wf(json!({"templateRef": "t", "hardwareRef": "h", "bootOptions": {"bootMode": "isoboot", "isoURL": "file:///a.iso"}}))
                .contains("spec.bootOptions.isoURL")
        );
        assert!(
            wf(json!({"templateRef": "t", "hardwareRef": "h", "bootOptions": {"bootMode": "customboot",
                "custombootConfig": {"postActions": [{"powerAction": "on"}, {}]}}}))
                .contains("spec.bootOptions.custombootConfig.postActions[1]: exactly one of")
        );
        assert!(
            wf(json!({"templateRef": "t", "hardwareRef": "h", "bootOptions": {"bootMode": "customboot",
                "custombootConfig": {"preparingActions": [{"virtualMediaAction": {"kind": "LP"}}]}}}))
                .contains("spec.bootOptions.custombootConfig.preparingActions[0].virtualMediaAction.kind")
        );
        let t = |spec: Value| {
            template(json!({"apiVersion": API_VERSION, "kind": "Template", "metadata": {"name": "t"}, "spec": spec}))
                .unwrap_err()
                .to_string()
        };
        assert!(t(json!({})).contains("spec.data: required"));
        assert!(t(json!({"data": 3})).contains("must be a string"));
        assert!(t(json!({"data": "{{ .x "})).contains("does not parse"));
    }

    #[test]
    fn status_uses_the_crd_field_names() {
        let doc = super::super::template::parse(
            "name: t\nglobal_timeout: 60\ntasks: [{name: a, worker: w1, actions: [{name: x, image: bash, pid: host}]}]",
        )
        .unwrap();
        let s = Status::rendered(&doc);
        let j = serde_json::to_value(&s).unwrap();
        assert_eq!(j["state"], "");
        assert_eq!(j["agentID"], "w1");
        assert_eq!(j["templateRendering"], "successful");
        assert_eq!(j["globalTimeout"], 60);
        assert_eq!(j["tasks"][0]["agentID"], "w1");
        assert_eq!(j["tasks"][0]["actions"][0]["state"], "PENDING");
        assert_eq!(j["tasks"][0]["actions"][0]["pid"], "host");
        assert_eq!(
            j["tasks"][0]["actions"][0]["id"].as_str().unwrap().len(),
            26
        );
        assert!(j["tasks"][0]["actions"][0].get("namespaces").is_none());
        let back: Status = serde_json::from_value(j).unwrap();
        assert_eq!(back, s);
    }
}
