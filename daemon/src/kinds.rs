//! Every kind of document tinkerbox stores, by name: what `tinkerbox
//! apply|get|delete KIND` and `POST /api/v1/apply` dispatch on. One place
//! decides which checker takes a document, so the CLI (checking before it
//! sends) and the daemon agree.

use crate::bmc::model as bmc;
use crate::discovery::rules::{self, RuleSet};
use crate::hardware::{self, FieldError};
use crate::workflow::model::{self, Template, Workflow};
use serde_json::Value;

/// A kind, as `get`/`delete` name it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, clap::ValueEnum)]
pub enum Kind {
    #[value(alias = "hw", alias = "hardwares")]
    Hardware,
    #[value(alias = "templates", alias = "tpl")]
    Template,
    #[value(alias = "workflows", alias = "wf")]
    Workflow,
    /// Rufio's BMC Machine.
    #[value(alias = "machines", alias = "bmc")]
    Machine,
    #[value(alias = "jobs")]
    Job,
    #[value(alias = "tasks")]
    Task,
    #[value(alias = "secrets")]
    Secret,
    /// Tinkerbell's enrollment rules.
    #[value(name = "workflowruleset", alias = "wrs", alias = "workflowrulesets")]
    WorkflowRuleSet,
    /// Metal3's host.
    #[value(
        name = "baremetalhost",
        alias = "bmh",
        alias = "bmhost",
        alias = "baremetalhosts"
    )]
    BareMetalHost,
    /// Metal3's inspection report of a host.
    #[value(name = "hardwaredata", alias = "hd")]
    HardwareData,
}

impl Kind {
    /// kubectl's `kind.group` prefix in `apply` output.
    pub fn resource(self) -> &'static str {
        match self {
            Kind::Hardware => "hardware.tinkerbell.org",
            Kind::Template => "template.tinkerbell.org",
            Kind::Workflow => "workflow.tinkerbell.org",
            Kind::Machine => "machine.bmc.tinkerbell.org",
            Kind::Job => "job.bmc.tinkerbell.org",
            Kind::Task => "task.bmc.tinkerbell.org",
            Kind::Secret => "secret",
            Kind::WorkflowRuleSet => "workflowruleset.tinkerbell.org",
            Kind::BareMetalHost => "baremetalhost.metal3.io",
            Kind::HardwareData => "hardwaredata.metal3.io",
        }
    }

    /// The `kind:` of its documents.
    pub fn from_document_kind(kind: &str) -> Option<Kind> {
        Some(match kind {
            "Hardware" => Kind::Hardware,
            "Template" => Kind::Template,
            "Workflow" => Kind::Workflow,
            "Machine" => Kind::Machine,
            "Job" => Kind::Job,
            "Task" => Kind::Task,
            "Secret" => Kind::Secret,
            "WorkflowRuleSet" => Kind::WorkflowRuleSet,
            "BareMetalHost" => Kind::BareMetalHost,
            "HardwareData" => Kind::HardwareData,
            _ => return None,
        })
    }
}

/// `tinkerbell.org/disabled: <reason>`, Tinkerbell's master switch on
/// Hardware, Workflow and BMC objects: no engine acts on the object (it is
/// still stored, served and shown).
pub const DISABLED: &str = "tinkerbell.org/disabled";

/// The reason an object is disabled, if it is.
pub fn disabled(doc: &Value) -> Option<&str> {
    doc.pointer("/metadata/annotations")
        .and_then(|a| a.get(DISABLED))
        .and_then(Value::as_str)
}

/// One checked document, by what takes it.
pub enum Checked {
    Hardware(hardware::Hardware),
    Bmc(bmc::Doc),
    Template(Template),
    Workflow(Workflow),
    RuleSet(RuleSet),
    Host(Box<crate::metal3::model::Host>),
    /// A Secret with a host's user, network or meta data.
    HostData(crate::metal3::model::DataSecret),
}

impl Checked {
    pub fn kind(&self) -> Kind {
        match self {
            Checked::Hardware(_) => Kind::Hardware,
            Checked::Template(_) => Kind::Template,
            Checked::Workflow(_) => Kind::Workflow,
            Checked::RuleSet(_) => Kind::WorkflowRuleSet,
            Checked::Host(_) => Kind::BareMetalHost,
            Checked::HostData(_) => Kind::Secret,
            Checked::Bmc(bmc::Doc::Machine { .. }) => Kind::Machine,
            Checked::Bmc(bmc::Doc::Job { .. }) => Kind::Job,
            Checked::Bmc(bmc::Doc::Task { .. }) => Kind::Task,
            Checked::Bmc(bmc::Doc::Secret { .. }) => Kind::Secret,
        }
    }
}

/// Check a document of any kind by the rules of its kind.
pub fn check(doc: Value) -> Result<Checked, FieldError> {
    let api = doc.get("apiVersion").and_then(Value::as_str).unwrap_or("");
    let kind = doc.get("kind").and_then(Value::as_str).unwrap_or("");
    match (api, kind) {
        (hardware::API_VERSION, "Hardware") => hardware::validate(doc).map(Checked::Hardware),
        (model::API_VERSION, "Template") => model::template(doc).map(Checked::Template),
        (model::API_VERSION, "Workflow") => model::workflow(doc).map(Checked::Workflow),
        (rules::API_VERSION, rules::KIND) => rules::ruleset(doc).map(Checked::RuleSet),
        (crate::metal3::API_VERSION, crate::metal3::KIND) => {
            crate::metal3::model::host(doc).map(|h| Checked::Host(Box::new(h)))
        }
        ("v1", "Secret") => {
            let mut doc = doc;
            match crate::metal3::model::data_secret(&mut doc)? {
                Some(d) => Ok(Checked::HostData(d)),
                None => bmc::parse(doc).map(Checked::Bmc),
            }
        }
        (bmc::API_VERSION, _) => bmc::parse(doc).map(Checked::Bmc),
        _ => Err(FieldError::new(
            "kind",
            format!(
                "{api}/{kind} is not a kind tinkerbox stores (tinkerbell.org/v1alpha1 Hardware, Template, \
                 Workflow, WorkflowRuleSet; bmc.tinkerbell.org/v1alpha1 Machine, Job, Task; v1 Secret; \
                 metal3.io/v1alpha1 BareMetalHost)"
            ),
        )),
    }
}

/// An object as the API server sends it, as tinkerbox stores it: without
/// what changes on every write and says nothing about the object
/// (`managedFields`, `resourceVersion`, `generation`, kubectl's
/// last-applied copy), so that a status-only change is not a new document.
pub fn clean(mut doc: Value) -> Value {
    if let Some(meta) = doc.get_mut("metadata").and_then(Value::as_object_mut) {
        for k in ["managedFields", "resourceVersion", "generation", "selfLink"] {
            meta.remove(k);
        }
        if let Some(a) = meta.get_mut("annotations").and_then(Value::as_object_mut) {
            a.remove("kubectl.kubernetes.io/last-applied-configuration");
            if a.is_empty() {
                meta.remove("annotations");
            }
        }
    }
    doc
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn each_kind_goes_to_its_checker() {
        let doc = |api: &str, kind: &str, spec: Value| json!({"apiVersion": api, "kind": kind, "metadata": {"name": "x"}, "spec": spec});
        let hw = doc(hardware::API_VERSION, "Hardware", json!({}));
        assert!(matches!(check(hw), Ok(Checked::Hardware(_))));
        let t = doc(model::API_VERSION, "Template", json!({"data": "name: x"}));
        assert!(matches!(check(t), Ok(Checked::Template(_))));
        let w = doc(model::API_VERSION, "Workflow", json!({"templateRef": "x"}));
        assert!(matches!(check(w), Ok(Checked::Workflow(_))));
        let m = doc(
            bmc::API_VERSION,
            "Machine",
            json!({"connection": {"host": "10.0.0.9"}}),
        );
        assert!(matches!(check(m), Ok(Checked::Bmc(_))));
        let e = check(doc("apps/v1", "Deployment", json!({})))
            .err()
            .unwrap();
        assert!(
            e.to_string()
                .contains("apps/v1/Deployment is not a kind tinkerbox stores"),
            "{e}"
        );
        // The kind's own rules apply.
        let e = check(doc(model::API_VERSION, "Workflow", json!({})))
            .err()
            .unwrap();
        assert_eq!(e.field, "spec.templateRef");
    }

    #[test]
    fn the_disabled_annotation() {
        assert_eq!(
            disabled(&json!({"metadata": {"annotations": {DISABLED: "maintenance"}}})),
            Some("maintenance")
        );
        assert_eq!(disabled(&json!({"metadata": {}})), None);
    }
}
