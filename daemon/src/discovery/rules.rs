//! Enrollment by rules: Tinkerbell's `WorkflowRuleSet` (the upstream CRD,
//! unchanged), pure. Its rules are Quamina patterns over the agent's
//! attributes JSON (the `quamina` crate, a port of the Go library upstream
//! uses); the ruleset matching the most patterns wins, and it makes the
//! Workflow `enrollment-<agent>` as tink-server's `enrollment.go` does.

use super::hardware::{ATTRIBUTES_ANNOTATION, valid_name};
use crate::hardware::{self, FieldError, Key};
use crate::workflow::model::{self, Workflow};
use serde::Deserialize;
use serde_json::{Value, json};
use std::collections::BTreeMap;

pub const API_VERSION: &str = "tinkerbell.org/v1alpha1";
pub const KIND: &str = "WorkflowRuleSet";
/// Upstream's label on the Workflows enrollment creates.
pub const ENROLLMENT_LABEL: &str = "tinkerbell.org/auto-enrollment";
/// The hardwareMap key the agent's id goes under when the ruleset names
/// none (Tinkerbell's example Templates use `device_1`).
pub const DEFAULT_AGENT_VALUE: &str = "device_1";
/// The most rules in one ruleset, and bytes in one rule.
const MAX_RULES: usize = 256;
const MAX_RULE_BYTES: usize = 16 * 1024;

#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Spec {
    #[serde(default)]
    pub rules: Vec<String>,
    #[serde(default)]
    pub workflow: WorkflowPart,
}

#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct WorkflowPart {
    #[serde(default)]
    pub add_attributes: bool,
    #[serde(default)]
    pub disabled: Option<bool>,
    #[serde(default)]
    pub namespace: String,
    #[serde(default)]
    pub template: TemplatePart,
}

#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct TemplatePart {
    #[serde(default)]
    pub agent_value: String,
    #[serde(default)]
    pub kvs: BTreeMap<String, String>,
    #[serde(default, rename = "ref")]
    pub reference: String,
}

#[derive(Debug, Clone, PartialEq)]
pub struct RuleSet {
    pub key: Key,
    pub spec: Spec,
    /// The document as applied (without `status`).
    pub doc: Value,
}

/// A WorkflowRuleSet document, checked: the CRD's types, a Template
/// named, and every rule a Quamina pattern (upstream skips a ruleset
/// whose pattern does not compile when it matches; refusing it here says
/// so at apply time).
pub fn ruleset(mut doc: Value) -> Result<RuleSet, FieldError> {
    match doc.get("kind").and_then(Value::as_str) {
        Some(KIND) => {}
        other => {
            return Err(FieldError::new(
                "kind",
                format!("must be {KIND:?}, got {other:?}"),
            ));
        }
    }
    let key = hardware::object_key(&mut doc)?;
    if let Some(o) = doc.as_object_mut() {
        o.remove("status");
    }
    let spec: Spec = hardware::typed(doc.get("spec").unwrap_or(&Value::Null), "spec")?;
    if spec.workflow.template.reference.trim().is_empty() {
        return Err(FieldError::new("spec.workflow.template.ref", "required"));
    }
    if !spec.workflow.namespace.is_empty() {
        hardware::check_dns_label(&spec.workflow.namespace)
            .map_err(|m| FieldError::new("spec.workflow.namespace", m))?;
    }
    if spec.rules.len() > MAX_RULES {
        return Err(FieldError::new(
            "spec.rules",
            format!("at most {MAX_RULES} rules, got {}", spec.rules.len()),
        ));
    }
    for (i, r) in spec.rules.iter().enumerate() {
        let field = || format!("spec.rules[{i}]");
        if r.len() > MAX_RULE_BYTES {
            return Err(FieldError::new(
                field(),
                format!("at most {MAX_RULE_BYTES} bytes"),
            ));
        }
        quamina::Quamina::<usize>::new()
            .add_pattern(i, r)
            .map_err(|e| FieldError::new(field(), format!("not a Quamina pattern: {e}")))?;
    }
    Ok(RuleSet { key, spec, doc })
}

/// How many of `set`'s rules match `event` (the attributes JSON). A rule
/// that does not compile (a stored ruleset from an older build) counts
/// nothing rather than failing the rest.
pub fn matching(set: &RuleSet, event: &[u8]) -> usize {
    let mut q = quamina::Quamina::<usize>::new();
    for (i, r) in set.spec.rules.iter().enumerate() {
        if let Err(e) = q.add_pattern(i, r) {
            tracing::warn!(ruleset = %set.key, rule = i, error = %e, "WorkflowRuleSet rule skipped");
        }
    }
    match q.matches_for_event(event) {
        Ok(m) => m.len(),
        Err(e) => {
            tracing::warn!(ruleset = %set.key, error = %e, "agent attributes not matched");
            0
        }
    }
}

/// The ruleset with the most matching rules (ties: the first, in the order
/// given), as upstream's `findMatch`; none when nothing matches.
pub fn best<'a>(sets: &'a [RuleSet], event: &[u8]) -> Option<&'a RuleSet> {
    let mut best: Option<(&RuleSet, usize)> = None;
    for s in sets {
        let n = matching(s, event);
        if n > 0 && best.is_none_or(|(_, b)| n > b) {
            best = Some((s, n));
        }
    }
    best.map(|(s, _)| s)
}

/// What the enrollment Workflow is made for.
pub struct Enrolling<'a> {
    pub agent_id: &'a str,
    /// The attributes JSON, for `addAttributes`.
    pub attributes: &'a str,
    /// The agent's Hardware, if it has one.
    pub hardware: Option<&'a Key>,
    /// The Hardware was discovered: the Workflow turns netboot off at its
    /// end, so that the machine boots what it installed.
    pub discovered: bool,
}

/// The Workflow `enrollment-<agent>` a matching ruleset makes. Its
/// namespace is the ruleset's `spec.workflow.namespace`, else the
/// Hardware's, else the ruleset's own; a Hardware in another namespace
/// than the Workflow is refused (the Workflow could never render).
pub fn enrollment(set: &RuleSet, e: &Enrolling) -> Result<Workflow, FieldError> {
    let w = &set.spec.workflow;
    let namespace = [w.namespace.as_str()]
        .into_iter()
        .chain(e.hardware.map(|h| h.namespace.as_str()))
        .chain([set.key.namespace.as_str()])
        .find(|n| !n.is_empty())
        .unwrap_or(hardware::DEFAULT_NAMESPACE)
        .to_string();
    if let Some(h) = e.hardware.filter(|h| h.namespace != namespace) {
        return Err(FieldError::new(
            "spec.workflow.namespace",
            format!(
                "WorkflowRuleSet {} makes Workflows in namespace {namespace}, but the agent's Hardware {h} is in {}: a Workflow finds its Hardware in its own namespace",
                set.key, h.namespace
            ),
        ));
    }
    let agent_value = match w.template.agent_value.trim() {
        "" => DEFAULT_AGENT_VALUE,
        v => v,
    };
    let mut map = serde_json::Map::new();
    map.insert(agent_value.into(), json!(e.agent_id));
    for (k, v) in &w.template.kvs {
        map.insert(k.clone(), json!(v));
    }
    let mut owner = json!({"apiVersion": API_VERSION, "kind": KIND, "name": set.key.name});
    if let Some(uid) = set.doc.pointer("/metadata/uid").and_then(Value::as_str) {
        owner["uid"] = json!(uid);
    }
    let mut meta = json!({
        "name": valid_name(e.agent_id, "enrollment-"),
        "namespace": namespace,
        "labels": {ENROLLMENT_LABEL: "true"},
        "ownerReferences": [owner],
    });
    if w.add_attributes && e.attributes.len() <= super::hardware::ATTRIBUTES_MAX {
        meta["annotations"] = json!({ATTRIBUTES_ANNOTATION: e.attributes});
    }
    let mut spec = json!({"templateRef": w.template.reference, "hardwareMap": map});
    if let Some(d) = w.disabled {
        spec["disabled"] = json!(d);
    }
    if let Some(h) = e.hardware {
        spec["hardwareRef"] = json!(h.name);
    }
    if e.discovered {
        spec["bootOptions"] = json!({"toggleAllowNetboot": true});
    }
    model::workflow(json!({
        "apiVersion": model::API_VERSION,
        "kind": "Workflow",
        "metadata": meta,
        "spec": spec,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(name: &str, rules: &[&str]) -> RuleSet {
        ruleset(json!({
            "apiVersion": API_VERSION, "kind": KIND,
            "metadata": {"name": name, "namespace": "tink", "uid": format!("uid-{name}")},
            "spec": {"rules": rules, "workflow": {
                "template": {"ref": "install", "agentValue": "worker_id", "kvs": {"server": "10.0.0.1:7080", "worker_id": "overridden"}},
                "addAttributes": true, "disabled": false}}
        }))
        .unwrap()
    }

    fn attrs() -> Value {
        json!({
            "cpu": {"totalCores": 4, "totalThreads": 8},
            "memory": {"total": "16GB"},
            "networkInterfaces": [{"name": "eth0", "mac": "52:54:00:00:00:01"}, {"name": "docker0", "mac": ""}],
            "product": {"vendor": "Intel", "name": "NUC7i7BNH"},
            "gpuDevices": [{"vendor": "NVIDIA", "product": "T4"}]
        })
    }

    /// The examples of upstream's AUTO_ENROLLMENT.md and Quamina's
    /// PATTERNS.md operators, against an agent's attributes.
    #[test]
    fn quamina_patterns_over_agent_attributes() {
        let event = attrs().to_string();
        let hit = |rule: &str| matching(&set("s", &[rule]), event.as_bytes()) == 1;
        // AUTO_ENROLLMENT.md's example: any agent with a NIC that has a MAC.
        assert!(hit(
            r#"{"networkInterfaces": {"mac": [{"wildcard": "*"}]}}"#
        ));
        assert!(hit(r#"{"product": {"vendor": ["Intel"]}}"#));
        assert!(!hit(r#"{"product": {"vendor": ["Dell"]}}"#));
        assert!(hit(r#"{"product": {"name": [{"prefix": "NUC"}]}}"#));
        assert!(hit(r#"{"product": {"name": [{"suffix": "BNH"}]}}"#));
        assert!(hit(
            r#"{"product": {"vendor": [{"equals-ignore-case": "intel"}]}}"#
        ));
        assert!(hit(
            r#"{"product": {"vendor": [{"anything-but": ["Dell", "HPE"]}]}}"#
        ));
        assert!(hit(r#"{"cpu": {"totalCores": [{"numeric": [">=", 4]}]}}"#));
        assert!(!hit(r#"{"cpu": {"totalCores": [{"numeric": [">", 4]}]}}"#));
        assert!(hit(r#"{"gpuDevices": {"vendor": [{"exists": true}]}}"#));
        assert!(hit(r#"{"bios": {"vendor": [{"exists": false}]}}"#));
        assert!(hit(
            r#"{"networkInterfaces": {"mac": ["52:54:00:00:00:01"]}}"#
        ));
        // Fields in one pattern are ANDed.
        assert!(!hit(
            r#"{"product": {"vendor": ["Intel"]}, "memory": {"total": ["8GB"]}}"#
        ));
    }

    #[test]
    fn the_ruleset_matching_most_rules_wins() {
        let event = attrs().to_string();
        let any = r#"{"networkInterfaces": {"mac": [{"wildcard": "*"}]}}"#;
        let intel = r#"{"product": {"vendor": ["Intel"]}}"#;
        let dell = r#"{"product": {"vendor": ["Dell"]}}"#;
        let sets = vec![
            set("a-any", &[any]),
            set("b-intel", &[any, intel]),
            set("c-also-two", &[intel, any]),
        ];
        assert_eq!(
            best(&sets, event.as_bytes()).unwrap().key.name,
            "b-intel",
            "ties: the first"
        );
        assert!(best(&[set("d", &[dell])], event.as_bytes()).is_none());
        assert!(best(&[], event.as_bytes()).is_none());
    }

    #[test]
    fn bad_rulesets_are_refused_with_the_field() {
        let doc = |spec: Value| json!({"apiVersion": API_VERSION, "kind": KIND, "metadata": {"name": "x"}, "spec": spec});
        let e = ruleset(doc(
            json!({"rules": ["{\"a\": \"not an array\"}"], "workflow": {"template": {"ref": "t"}}}),
        ))
        .unwrap_err();
        assert_eq!(e.field, "spec.rules[0]");
        let e = ruleset(doc(json!({"rules": ["{}"], "workflow": {}}))).unwrap_err();
        assert_eq!(e.field, "spec.workflow.template.ref");
        let e = ruleset(doc(
            json!({"rules": "x", "workflow": {"template": {"ref": "t"}}}),
        ))
        .unwrap_err();
        assert_eq!(e.field, "spec.rules");
        let e = ruleset(doc(
            json!({"workflow": {"namespace": "Bad_NS", "template": {"ref": "t"}}}),
        ))
        .unwrap_err();
        assert_eq!(e.field, "spec.workflow.namespace");
    }

    /// The Workflow as upstream's enrollment.go makes it.
    #[test]
    fn the_enrollment_workflow() {
        let s = set("nucs", &["{}"]);
        let hw = Key::new("tink", "discovery-52-54-00-00-00-01");
        let a = attrs().to_string();
        let w = enrollment(
            &s,
            &Enrolling {
                agent_id: "52:54:00:00:00:01",
                attributes: &a,
                hardware: Some(&hw),
                discovered: true,
            },
        )
        .unwrap();
        let d = &w.doc;
        assert_eq!(d["metadata"]["name"], "enrollment-52-54-00-00-00-01");
        assert_eq!(d["metadata"]["namespace"], "tink");
        assert_eq!(d["metadata"]["labels"][ENROLLMENT_LABEL], "true");
        assert_eq!(
            d["metadata"]["ownerReferences"][0],
            json!({"apiVersion": API_VERSION, "kind": KIND, "name": "nucs", "uid": "uid-nucs"})
        );
        assert_eq!(d["metadata"]["annotations"][ATTRIBUTES_ANNOTATION], a);
        assert_eq!(w.spec.template_ref, "install");
        assert_eq!(w.spec.hardware_ref, "discovery-52-54-00-00-00-01");
        // kvs are copied after the agent's entry: a kv of the same key wins.
        assert_eq!(w.spec.hardware_map["worker_id"], "overridden");
        assert_eq!(w.spec.hardware_map["server"], "10.0.0.1:7080");
        assert!(w.spec.boot_options.toggle_allow_netboot);
        assert!(!w.spec.disabled);

        // No Hardware: no hardwareRef; the ruleset's namespace.
        let w = enrollment(
            &set("plain", &["{}"]),
            &Enrolling {
                agent_id: "agent-7",
                attributes: "{}",
                hardware: None,
                discovered: false,
            },
        )
        .unwrap();
        assert_eq!(w.spec.hardware_ref, "");
        assert_eq!(w.key, Key::new("tink", "enrollment-agent-7"));
        assert!(!w.spec.boot_options.toggle_allow_netboot);

        // A Hardware in another namespace than the Workflow's is refused.
        let mut other = set("o", &["{}"]);
        other.spec.workflow.namespace = "prod".into();
        let e = enrollment(
            &other,
            &Enrolling {
                agent_id: "x",
                attributes: "{}",
                hardware: Some(&hw),
                discovered: true,
            },
        )
        .unwrap_err();
        assert!(e.to_string().contains("namespace prod"), "{e}");
    }
}
