//! Zero touch over gRPC, host mode: an agent nobody entered asks for work
//! (the independent peer, tests/tink/peer.py, with modules generated from
//! the upstream .proto files), becomes Hardware `discovery-<mac>`, is
//! enrolled by the WorkflowRuleSet matching it best, and runs the Workflow
//! made for it; and what a hostile network can make discovery store is
//! bounded.

use crate::common::{Daemon, NO_BOOT, Setup, write_file};
use crate::tink::peer;
use serde_json::Value;

const AGENT: &str = "52:54:00:12:34:56";

fn start(discovery: &str) -> Daemon {
    let boot = format!("{NO_BOOT}[discovery]\n{discovery}\n");
    Daemon::start_setup(Setup {
        boot: &boot,
        ..Setup::default()
    })
}

fn apply(d: &Daemon, text: &str) {
    let f = write_file(&d.dir, "docs.yaml", text);
    d.cli_ok(&["apply", "-f", f.to_str().unwrap()]);
}

fn get(d: &Daemon, args: &[&str]) -> Value {
    let mut a = vec!["get"];
    a.extend_from_slice(args);
    a.extend_from_slice(&["-o", "json"]);
    serde_json::from_str(&d.cli_ok(&a)).unwrap()
}

/// The lab's kind of Template: the worker is the enrolled agent
/// (`device_1`), the disk the discovered Hardware's, the server a kv of
/// the ruleset.
const DOCS: &str = r#"
apiVersion: tinkerbell.org/v1alpha1
kind: Template
metadata: {name: install}
spec:
  data: |
    version: '0.1'
    name: install
    global_timeout: 600
    tasks:
    - name: install
      worker: '{{.device_1}}'
      actions:
      - {name: stream, image: image2disk, timeout: 60, environment: {DEST_DISK: '{{ index .Hardware.Disks 0 }}', URL: 'http://{{.server}}/img'}}
      - {name: reboot, image: bash, timeout: 5}
---
apiVersion: tinkerbell.org/v1alpha1
kind: WorkflowRuleSet
metadata: {name: big-intel}
spec:
  rules:
  - '{"cpu": {"totalCores": [{"numeric": [">=", 4]}]}}'
  - '{"cpu": {"processors": {"vendor": ["GenuineIntel"]}}}'
  workflow:
    addAttributes: true
    template: {ref: install, agentValue: device_1, kvs: {server: "10.0.0.1:7080"}}
---
apiVersion: tinkerbell.org/v1alpha1
kind: WorkflowRuleSet
metadata: {name: any-nic}
spec:
  rules: ['{"networkInterfaces": {"mac": [{"wildcard": "*"}]}}']
  workflow:
    disabled: true
    template: {ref: install}
"#;

#[test]
fn an_unknown_agent_is_discovered_enrolled_and_runs_its_workflow() {
    let d = start("enabled = true\nenroll = true");
    apply(&d, DOCS);
    let lines = peer(&d, &["agent", AGENT, "--polls", "60"]);
    let served: Vec<&str> = lines
        .iter()
        .filter(|l| l["event"] == "served")
        .filter_map(|l| l["action"].as_str())
        .collect();
    assert_eq!(served, ["stream", "reboot"], "{lines:#?}");
    let env = &lines.iter().find(|l| l["event"] == "served").unwrap()["environment"];
    let env: Vec<&str> = env
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert!(env.contains(&"DEST_DISK=/dev/vda"), "{env:?}");
    assert!(env.contains(&"URL=http://10.0.0.1:7080/img"), "{env:?}");

    // The Hardware discovery made: upstream's fields and tinkerbox's.
    let hw = get(&d, &["hardware", "discovery-52-54-00-12-34-56"]);
    let labels = &hw["metadata"]["labels"];
    assert_eq!(labels["tinkerbell.org/auto-discovered"], "true", "{hw:#}");
    assert_eq!(labels["tinkerbox.io/cpu-cores"], "4");
    assert_eq!(labels["tinkerbox.io/memory-gib"], "16");
    assert_eq!(labels["tinkerbox.io/disk-gib"], "20");
    assert_eq!(hw["spec"]["agentID"], AGENT);
    assert_eq!(hw["spec"]["auto"]["enrollmentEnabled"], true);
    assert_eq!(hw["spec"]["interfaces"][0]["dhcp"]["mac"], AGENT);
    let attrs: Value = serde_json::from_str(
        hw["metadata"]["annotations"]["tinkerbell.org/agent-attributes"]
            .as_str()
            .unwrap(),
    )
    .unwrap();
    assert_eq!(attrs["cpu"]["totalCores"], 4);
    assert_eq!(attrs["bios"]["vendor"], "SeaBIOS");
    // The Workflow turned netboot off at its end: the machine boots what
    // it installed.
    assert_eq!(hw["spec"]["interfaces"][0]["netboot"]["allowPXE"], false);

    // The Workflow the best ruleset (two rules matched, not one) made.
    let wf = get(&d, &["workflow", "enrollment-52-54-00-12-34-56"]);
    assert_eq!(wf["status"]["state"], "SUCCESS", "{wf:#}");
    assert_eq!(
        wf["metadata"]["labels"]["tinkerbell.org/auto-enrollment"],
        "true"
    );
    assert_eq!(wf["metadata"]["ownerReferences"][0]["name"], "big-intel");
    assert_eq!(wf["spec"]["hardwareRef"], "discovery-52-54-00-12-34-56");
    assert_eq!(wf["spec"]["hardwareMap"]["device_1"], AGENT);
    assert!(
        wf["metadata"]["annotations"]["tinkerbell.org/agent-attributes"].is_string(),
        "addAttributes"
    );

    // Label selectors.
    let found = get(
        &d,
        &["hardware", "-l", "tinkerbell.org/auto-discovered=true"],
    );
    assert_eq!(found["items"].as_array().unwrap().len(), 1);
    let none = get(&d, &["hardware", "-l", "tinkerbox.io/cpu-cores in (8,16)"]);
    assert_eq!(none["items"].as_array().unwrap().len(), 0);
    let bad = d.cli(&["get", "hardware", "-l", "a in b"]);
    assert!(!bad.status.success());
    assert!(
        String::from_utf8_lossy(&bad.stderr).contains("label selector"),
        "{bad:?}"
    );
    let wrs = d.cli_ok(&["get", "wrs"]);
    assert!(
        wrs.contains("big-intel") && wrs.contains("any-nic"),
        "{wrs}"
    );

    // Events on the machine's log; metrics counted.
    let events = d.cli_ok(&["events", "discovery-52-54-00-12-34-56"]);
    assert!(
        events.contains("discovered: Hardware default/discovery-52-54-00-12-34-56"),
        "{events}"
    );
    assert!(
        events.contains("enrolled by WorkflowRuleSet default/big-intel"),
        "{events}"
    );
    let m = String::from_utf8(d.curl(&["-sf", &d.url("/metrics")]).stdout).unwrap();
    assert!(
        m.contains("tinkerbox_discovery_hardware_total{result=\"created\"} 1"),
        "{m}"
    );
    assert!(
        m.contains("tinkerbox_enrollments_total{result=\"created\"} 1"),
        "{m}"
    );

    // Asked again after its Workflow ended: nothing more is made.
    let again = peer(&d, &["agent", AGENT, "--polls", "2"]);
    assert!(again.iter().all(|l| l["event"] != "served"), "{again:#?}");
    let wfs = get(&d, &["workflow", "-A"]);
    assert_eq!(wfs["items"].as_array().unwrap().len(), 1);
}

#[test]
fn enrollment_follows_upstream_rules() {
    let d = start("enroll = true");
    // No ruleset matches: NotFound, as upstream says it.
    apply(
        &d,
        &DOCS
            .replace(">=\", 4", ">=\", 64")
            .replace("GenuineIntel", "AuthenticAMD")
            .replace("mac\": [{\"wildcard\": \"*\"}]", "mac\": [\"nope\"]"),
    );
    let lines = peer(&d, &["agent", "agent-7", "--polls", "2"]);
    let last = lines
        .iter()
        .rev()
        .find(|l| l["event"] == "get_action")
        .unwrap();
    assert_eq!(last["code"], "NOT_FOUND", "{lines:#?}");
    assert!(
        last["details"]
            .as_str()
            .unwrap()
            .contains("no Workflow Rule Sets found or matched for Agent agent-7"),
        "{last}"
    );
    // Discovery off: nothing was made.
    let hw = get(&d, &["hardware"]);
    assert_eq!(hw["items"].as_array().unwrap().len(), 0);

    // A Hardware someone entered does not opt in: FailedPrecondition.
    apply(
        &d,
        "apiVersion: tinkerbell.org/v1alpha1\nkind: Hardware\nmetadata: {name: typed}\nspec:\n  agentID: agent-8\n",
    );
    let lines = peer(&d, &["agent", "agent-8", "--polls", "1"]);
    assert_eq!(lines[0]["code"], "FAILED_PRECONDITION", "{lines:#?}");
    assert!(
        lines[0]["details"]
            .as_str()
            .unwrap()
            .contains("auto enrollment is disabled")
    );
    // Turned on, it counts at the next poll (no remembered refusal): no
    // ruleset matches it yet.
    apply(
        &d,
        "apiVersion: tinkerbell.org/v1alpha1\nkind: Hardware\nmetadata: {name: typed}\nspec:\n  agentID: agent-8\n  auto: {enrollmentEnabled: true}\n",
    );
    let lines = peer(&d, &["agent", "agent-8", "--polls", "1"]);
    assert_eq!(lines[0]["code"], "NOT_FOUND", "{lines:#?}");
    assert!(
        lines[0]["details"]
            .as_str()
            .unwrap()
            .contains("no Workflow Rule Sets found or matched for Agent agent-8"),
        "{lines:#?}"
    );

    // A ruleset applied later is seen at the next poll (no stale refusal);
    // `disabled: true` makes the Workflow disabled, as upstream's recipe for
    // "discover, then decide".
    apply(
        &d,
        &DOCS
            .replace(">=\", 4", ">=\", 64")
            .replace("GenuineIntel", "AuthenticAMD"),
    );
    let lines = peer(&d, &["agent", "agent-7", "--polls", "3"]);
    assert!(lines.iter().all(|l| l["event"] != "served"), "{lines:#?}");
    let wf = get(&d, &["workflow", "enrollment-agent-7"]);
    assert_eq!(wf["spec"]["disabled"], true, "{wf:#}");
    assert_eq!(wf["metadata"]["ownerReferences"][0]["name"], "any-nic");
    assert!(wf["spec"].get("hardwareRef").is_none());
}

/// A flood of agent ids makes at most `max_per_minute` Hardware, and the
/// machines known before are not touched.
#[test]
fn discovery_is_bounded() {
    let d = start("enabled = true\nmax_per_minute = 3\nmax_hardware = 2");
    let lines = peer(&d, &["flood", "17", "--polls", "20"]);
    assert_eq!(lines[0]["codes"]["NOT_FOUND"], 20, "{lines:#?}");
    let hw = get(
        &d,
        &["hardware", "-l", "tinkerbell.org/auto-discovered=true"],
    );
    assert_eq!(hw["items"].as_array().unwrap().len(), 2, "max_hardware");
    let m = String::from_utf8(d.curl(&["-sf", &d.url("/metrics")]).stdout).unwrap();
    assert!(
        m.contains("tinkerbox_discovery_hardware_total{result=\"created\"} 2"),
        "{m}"
    );
    assert!(
        m.contains("tinkerbox_discovery_hardware_total{result=\"at_cap\"} 1"),
        "{m}"
    );
    assert!(
        m.contains("tinkerbox_discovery_hardware_total{result=\"rate_limited\"} 17"),
        "{m}"
    );
}
