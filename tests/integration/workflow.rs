//! Templates and Workflows through the CLI of the real binary: `apply -f
//! DIR` with every kind mixed, `get -o json` in the CRD's field names,
//! `describe`, rendering failures as conditions, `delete`.

use crate::common::{Daemon, compat_dir, write_file};
use serde_json::Value;
use std::time::{Duration, Instant};

/// The Workflow as `get workflow NAME -o json` shows it, once `done` says
/// so (bounded: 20 s).
fn wait_workflow(d: &Daemon, name: &str, done: impl Fn(&Value) -> bool) -> Value {
    let start = Instant::now();
    loop {
        let out = d.cli_ok(&["get", "workflow", name, "-o", "json"]);
        let w: Value = serde_json::from_str(&out).unwrap();
        if done(&w) {
            return w;
        }
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "workflow {name} stuck: {w:#}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn apply_a_directory_of_mixed_kinds_then_watch_the_workflow_render() {
    let d = Daemon::start();
    let dir = d.dir.join("docs");
    std::fs::create_dir(&dir).unwrap();
    // Upstream's own example trio: Hardware sm01, Template debian, Workflow wf1.
    for f in [
        "hardware-sm01.yaml",
        "template-example.yaml",
        "workflow-example.yaml",
    ] {
        std::fs::copy(compat_dir().join(f), dir.join(f)).unwrap();
    }
    std::fs::write(dir.join("notes.txt"), "not a document").unwrap();
    let out = d.cli_ok(&["apply", "-f", dir.to_str().unwrap()]);
    for want in [
        "hardware.tinkerbell.org/sm01 created",
        "template.tinkerbell.org/debian created",
        "workflow.tinkerbell.org/wf1 created",
    ] {
        assert!(out.contains(want), "{want} not in {out}");
    }
    let w = wait_workflow(&d, "wf1", |w| w["status"]["state"] == "PENDING");
    let s = &w["status"];
    assert_eq!(s["templateRendering"], "successful");
    assert_eq!(s["agentID"], "3c:ec:ef:4c:4f:54");
    assert_eq!(s["globalTimeout"], 1800);
    assert_eq!(s["conditions"][0]["type"], "TemplateRenderedSuccess");
    assert_eq!(s["conditions"][0]["status"], "True");
    let actions = s["tasks"][0]["actions"].as_array().unwrap();
    assert_eq!(actions.len(), 4);
    assert_eq!(actions[0]["name"], "stream-debian-image");
    assert_eq!(actions[0]["state"], "PENDING");
    assert_eq!(actions[0]["environment"]["COMPRESSED"], "true");
    assert_eq!(actions[1]["environment"]["MODE"], "0600");
    // The document itself reads back as applied.
    let applied: Value = serde_saphyr::from_str(
        &std::fs::read_to_string(dir.join("workflow-example.yaml")).unwrap(),
    )
    .unwrap();
    assert_eq!(w["spec"], applied["spec"]);
    // Applying it again changes nothing, status included.
    let out = d.cli_ok(&[
        "apply",
        "-f",
        dir.join("workflow-example.yaml").to_str().unwrap(),
    ]);
    assert!(
        out.contains("workflow.tinkerbell.org/wf1 unchanged"),
        "{out}"
    );
    let table = d.cli_ok(&["get", "workflows"]);
    assert!(
        table.starts_with("NAME") && table.contains("wf1") && table.contains("PENDING"),
        "{table}"
    );
    let wide = d.cli_ok(&["get", "wf", "-o", "wide"]);
    assert!(
        wide.contains("TEMPLATE-RENDERING") && wide.contains("successful"),
        "{wide}"
    );
    let desc = d.cli_ok(&["describe", "workflow", "wf1"]);
    for want in [
        "Template:",
        "debian",
        "os-installation",
        "stream-debian-image",
        "PENDING",
        "TemplateRenderedSuccess",
    ] {
        assert!(desc.contains(want), "{want} not in {desc}");
    }
    assert!(d.cli_ok(&["get", "templates"]).contains("debian"));
    // Deleting the Workflow and the Template.
    assert!(
        d.cli_ok(&["delete", "workflow", "wf1"])
            .contains("workflow.tinkerbell.org/wf1 deleted")
    );
    assert!(
        d.cli_ok(&["delete", "template", "debian"])
            .contains("deleted")
    );
    let o = d.cli(&["get", "workflow", "wf1"]);
    assert!(String::from_utf8_lossy(&o.stderr).contains("404"), "{o:?}");
}

/// A Template that names a key the Workflow does not give, and one that
/// does not exist: `templateRendering: failed`, the reason in the
/// condition and in `describe`; other Workflows are not affected.
#[test]
fn rendering_failures_are_conditions() {
    let d = Daemon::start();
    let docs = r#"
apiVersion: tinkerbell.org/v1alpha1
kind: Template
metadata: {name: needs-disk}
spec:
  data: |
    name: t
    tasks:
    - name: a
      worker: "{{.device_1}}"
      actions:
      - {name: x, image: bash, environment: {D: "{{.disk}}"}}
---
apiVersion: tinkerbell.org/v1alpha1
kind: Workflow
metadata: {name: missing-key}
spec: {templateRef: needs-disk, hardwareMap: {device_1: "02:00:00:00:00:01"}}
---
apiVersion: tinkerbell.org/v1alpha1
kind: Workflow
metadata: {name: no-template}
spec: {templateRef: nope}
---
apiVersion: tinkerbell.org/v1alpha1
kind: Workflow
metadata: {name: fine}
spec: {templateRef: needs-disk, hardwareMap: {device_1: "02:00:00:00:00:02", disk: /dev/sda}}
"#;
    let f = write_file(&d.dir, "docs.yaml", docs);
    d.cli_ok(&["apply", "-f", f.to_str().unwrap()]);
    let w = wait_workflow(&d, "missing-key", |w| {
        w["status"]["templateRendering"] == "failed"
    });
    let msg = w["status"]["conditions"][0]["message"].as_str().unwrap();
    assert!(
        msg.contains("error rendering template") && msg.contains("disk"),
        "{msg}"
    );
    assert_eq!(w["status"]["state"], "");
    let w = wait_workflow(&d, "no-template", |w| {
        w["status"]["templateRendering"] == "failed"
    });
    assert_eq!(
        w["status"]["conditions"][0]["message"],
        "template not found: nope"
    );
    assert!(
        d.cli_ok(&["describe", "workflow", "no-template"])
            .contains("template not found: nope")
    );
    let w = wait_workflow(&d, "fine", |w| w["status"]["state"] == "PENDING");
    assert_eq!(
        w["status"]["tasks"][0]["actions"][0]["environment"]["D"],
        "/dev/sda"
    );
    // A bad document is refused before anything is sent, with its place.
    let f = write_file(
        &d.dir,
        "bad.yaml",
        "apiVersion: tinkerbell.org/v1alpha1\nkind: Workflow\nmetadata: {name: w}\nspec: {hardwareRef: x}\n",
    );
    let o = d.cli(&["apply", "-f", f.to_str().unwrap()]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success() && err.contains("spec.templateRef: required"),
        "{err}"
    );
    let f = write_file(
        &d.dir,
        "alien.yaml",
        "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: x}\n",
    );
    let err =
        String::from_utf8_lossy(&d.cli(&["apply", "-f", f.to_str().unwrap()]).stderr).to_string();
    assert!(
        err.contains("apps/v1/Deployment is not a kind tinkerbox stores"),
        "{err}"
    );
}
