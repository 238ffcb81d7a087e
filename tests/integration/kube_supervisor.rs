//! The supervisor against an API server (a real one where
//! `KUBEBUILDER_ASSETS` has one, else kmock, said on stderr), driven with
//! kubectl as a user would: apply a `Tinkerbell`, and see the objects made,
//! drift put back, a version change migrate real v0.12-shaped Workflows,
//! bad specs refused, and the removal. No kubelet runs there, so no pod
//! ever starts: the status must say so.

use crate::common::*;
use crate::kube::{Cluster, kube_daemon_with, until};
use serde_json::Value;
use std::time::{Duration, Instant};

const EXTERNAL: &str = "tink = \"external\"\nrufio = \"external\"\n";
const NS: &str = "tink";
const OWNED: &str =
    "deployments,services,serviceaccounts,roles,rolebindings,clusterroles,clusterrolebindings";

fn json(c: &Cluster, args: &[&str]) -> Value {
    let out = c.kubectl(&[args, &["-o", "json"]].concat(), None);
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("kubectl {args:?}: {e}: {out}"))
}

/// What the supervisor made for `owner`: `Kind/name`, sorted.
fn owned(c: &Cluster, owner: &str) -> Vec<String> {
    let sel = format!("tinkerbox.io/owner-name={owner}");
    let v = json(c, &["get", OWNED, "-A", "-l", &sel]);
    let mut out: Vec<String> = v["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| {
            format!(
                "{}/{}",
                o["kind"].as_str().unwrap(),
                o["metadata"]["name"].as_str().unwrap()
            )
        })
        .collect();
    out.sort();
    out
}

fn tinkerbell(c: &Cluster, name: &str) -> Value {
    json(c, &["get", "tinkerbells.tinkerbox.io", name, "-n", NS])
}

fn condition(tb: &Value, t: &str) -> Option<(String, String, String)> {
    tb["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == t)
        .map(|c| {
            let s = |k: &str| c[k].as_str().unwrap_or("").to_string();
            (s("status"), s("reason"), s("message"))
        })
}

fn image(c: &Cluster, deploy: &str) -> String {
    let d = json(c, &["get", "deployment", deploy, "-n", NS]);
    d["spec"]["template"]["spec"]["containers"][0]["image"]
        .as_str()
        .unwrap_or("")
        .to_string()
}

/// The reasons of the events recorded on the resource.
fn event_reasons(c: &Cluster) -> Vec<String> {
    let v = json(c, &["get", "events.events.k8s.io", "-n", NS]);
    v["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["regarding"]["kind"] == "Tinkerbell")
        .map(|e| e["reason"].as_str().unwrap_or("").to_string())
        .collect()
}

/// A merge patch of the `Tinkerbell` `stack`'s spec, as a user's kubectl.
fn patch_spec(c: &Cluster, spec: &str) {
    c.kubectl(
        &[
            "patch",
            "tinkerbells.tinkerbox.io",
            "stack",
            "-n",
            NS,
            "--type",
            "merge",
            "-p",
            &format!(r#"{{"spec":{spec}}}"#),
        ],
        None,
    );
}

fn apply(c: &Cluster, yaml: &str) {
    c.kubectl(&["apply", "-f", "-"], Some(yaml));
}

const STACK: &str = "apiVersion: tinkerbox.io/v1alpha1\nkind: Tinkerbell\nmetadata:\n  name: stack\n  namespace: tink\nspec:\n  publicIP: 10.99.0.7\n";

const EXPECTED: [&str; 17] = [
    "ClusterRole/rufio-tink",
    "ClusterRole/tink-controller-tink",
    "ClusterRole/tink-server-tink",
    "ClusterRoleBinding/rufio-tink",
    "ClusterRoleBinding/tink-controller-tink",
    "ClusterRoleBinding/tink-server-tink",
    "Deployment/rufio",
    "Deployment/tink-controller",
    "Deployment/tink-server",
    "Role/rufio-leader-election",
    "Role/tink-controller-leader-election",
    "RoleBinding/rufio-leader-election",
    "RoleBinding/tink-controller-leader-election",
    "Service/tink-server",
    "ServiceAccount/rufio",
    "ServiceAccount/tink-controller",
    "ServiceAccount/tink-server",
];

#[test]
fn supervisor_deploys_repairs_reports_and_removes_tink_and_rufio() {
    let c = Cluster::start();
    apply(
        &c,
        "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: tink\n",
    );
    let d = kube_daemon_with(&c, EXTERNAL);
    // A machine, so that its iPXE script shows where agents are sent.
    let hw = hw_doc("m1", "52:54:00:7c:00:01", "10.7.0.1")
        .replace("namespace: default", "namespace: tink");
    apply(&c, &hw);
    until(20, "the mirror", &d, || d.all_hardware().len() == 1);
    until(30, "leading", &d, || {
        String::from_utf8_lossy(&d.curl(&["-s", &d.url("/healthz")]).stdout)
            .contains("kube: leader")
    });
    // A second instance: it mirrors and serves, but only the leader acts.
    let follower = kube_daemon_with(&c, EXTERNAL);
    until(20, "the follower's mirror", &follower, || {
        follower.all_hardware().len() == 1
    });

    // Applied: everything a chart would make, timed from the apply.
    let t0 = Instant::now();
    apply(&c, STACK);
    let deadline = t0 + Duration::from_secs(60);
    while owned(&c, "stack") != EXPECTED {
        assert!(
            Instant::now() < deadline,
            "objects: {:?}\n{}",
            owned(&c, "stack"),
            d.log()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    eprintln!(
        "supervisor: {} objects made {} ms after kubectl apply",
        EXPECTED.len(),
        t0.elapsed().as_millis()
    );
    assert_eq!(image(&c, "rufio"), "ghcr.io/tinkerbell/tinkerbell:v0.25.0");
    let rufio = json(&c, &["get", "deployment", "rufio", "-n", NS]);
    let env = rufio["spec"]["template"]["spec"]["containers"][0]["env"].to_string();
    assert!(
        env.contains("TINKERBELL_ENABLE_RUFIO_CONTROLLER")
            && env.contains("TINKERBELL_ENABLE_SMEE"),
        "{env}"
    );
    let tb = tinkerbell(&c, "stack");
    assert_eq!(
        rufio["metadata"]["ownerReferences"][0]["uid"],
        tb["metadata"]["uid"]
    );
    assert_eq!(tb["metadata"]["finalizers"][0], "tinkerbox.io/supervisor");
    // The names the README gives work in kubectl as typed. (The bare
    // singular is upstream's category of every Tinkerbell kind: a real API
    // server's discovery makes `kubectl get tinkerbell` list them all, the
    // stack among them; kmock's has no categories.)
    for kind in ["tb", "tinkerbells", "tinkerbell.tinkerbox.io"] {
        let out = c.kubectl(&["get", kind, "stack", "-n", NS, "-o", "name"], None);
        assert_eq!(
            out.trim(),
            "tinkerbell.tinkerbox.io/stack",
            "kubectl get {kind} stack"
        );
    }
    let all = c.kubectl(&["get", "tinkerbell", "-n", NS, "-o", "name"], None);
    assert!(
        all.lines().any(|l| l == "tinkerbell.tinkerbox.io/stack"),
        "kubectl get tinkerbell: {all}"
    );

    // The status: what runs, honestly not available (no pod ever starts).
    until(30, "the status", &d, || {
        tinkerbell(&c, "stack")["status"]["version"] == "v0.25.0"
    });
    let tb = tinkerbell(&c, "stack");
    let st = &tb["status"];
    assert_eq!(st["observedGeneration"], tb["metadata"]["generation"]);
    assert_eq!(st["grpcAddress"], "10.99.0.7:42113");
    assert_eq!(condition(&tb, "Reconciled").unwrap().0, "True");
    let (avail, reason, msg) = condition(&tb, "Available").unwrap();
    assert_eq!(
        (avail.as_str(), reason.as_str()),
        ("False", "ComponentsUnavailable"),
        "{msg}"
    );
    assert!(msg.contains("0 of 1 replicas available"), "{msg}");
    let comps = st["components"].as_array().unwrap();
    assert_eq!(comps.len(), 3);
    assert!(
        comps
            .iter()
            .all(|c| c["conditions"][0]["status"] == "False"),
        "{comps:?}"
    );

    // Every instance sends agents to the supervised tink-server.
    for x in [&d, &follower] {
        until(20, "the iPXE script follows", x, || {
            let o = x.curl(&["-s", &x.url("/ipxe/script/52:54:00:7c:00:01/auto.ipxe")]);
            String::from_utf8_lossy(&o.stdout).contains("grpc_authority=10.99.0.7:42113")
        });
    }

    // The CLI view.
    let view = d.cli_ok(&["kube", "status"]);
    assert!(
        view.contains("Tinkerbell tink/stack: wanted newest, running v0.25.0"),
        "{view}"
    );
    assert!(
        view.contains("Available=False ComponentsUnavailable"),
        "{view}"
    );
    assert!(view.contains("rufio") && view.contains("0/1"), "{view}");
    let j: Value = serde_json::from_str(&d.cli_ok(&["kube", "status", "-o", "json"])).unwrap();
    assert_eq!(j[0]["status"]["version"], "v0.25.0");

    // Drift: a deleted Deployment comes back; an edited image is put back;
    // what someone else added stays.
    c.kubectl(&["delete", "deployment", "tink-server", "-n", NS], None);
    c.kubectl(
        &[
            "annotate",
            "deployment",
            "rufio",
            "-n",
            NS,
            "example.com/note=kept",
        ],
        None,
    );
    c.kubectl(
        &[
            "patch",
            "deployment",
            "rufio",
            "-n",
            NS,
            "--type",
            "merge",
            "-p",
            r#"{"spec":{"replicas":5}}"#,
        ],
        None,
    );
    until(30, "the drift repaired", &d, || {
        let r = json(&c, &["get", "deployment", "rufio", "-n", NS]);
        owned(&c, "stack") == EXPECTED && r["spec"]["replicas"] == 1
    });
    let r = json(&c, &["get", "deployment", "rufio", "-n", NS]);
    assert_eq!(r["metadata"]["annotations"]["example.com/note"], "kept");
    until(20, "the events", &d, || {
        let e = event_reasons(&c);
        ["Created", "Recreated", "Repaired"]
            .iter()
            .all(|r| e.iter().any(|x| x == r))
    });
    // All of them by the leader (its identity is host-pid).
    let v = json(&c, &["get", "events.events.k8s.io", "-n", NS]);
    let mut by: Vec<&str> = v["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["regarding"]["kind"] == "Tinkerbell")
        .map(|e| e["reportingInstance"].as_str().unwrap_or(""))
        .collect();
    by.dedup();
    assert_eq!(by.len(), 1, "{by:?}");
    assert!(
        by[0].ends_with(&format!("-{}", d.pid())),
        "{by:?} (leader pid {})",
        d.pid()
    );
    assert!(
        !follower
            .log()
            .contains("kube supervisor: watching Tinkerbell")
    );

    // A spec change: one namespace only -> Roles instead of ClusterRoles
    // (the ClusterRoles pruned), a component disabled -> gone.
    patch_spec(
        &c,
        r#"{"scope":"Namespace","tinkServer":{"args":["--log-level=1"]}}"#,
    );
    until(30, "roles instead of cluster roles", &d, || {
        let o = owned(&c, "stack");
        o.contains(&"Role/rufio".to_string()) && !o.iter().any(|x| x.starts_with("ClusterRole"))
    });
    let ts = json(&c, &["get", "deployment", "tink-server", "-n", NS]);
    let env = ts["spec"]["template"]["spec"]["containers"][0].to_string();
    assert!(
        env.contains("TINKERBELL_BACKEND_KUBE_NAMESPACE") && env.contains("--log-level=1"),
        "{env}"
    );

    // Removal: everything made goes (the cluster-scoped ones by the
    // finalizer); the namespace, the CRDs and the user's objects stay.
    c.kubectl(
        &[
            "delete",
            "tinkerbells.tinkerbox.io",
            "stack",
            "-n",
            NS,
            "--wait=false",
        ],
        None,
    );
    until(30, "removed", &d, || {
        owned(&c, "stack").is_empty()
            && !c
                .kubectl(
                    &["get", "tinkerbells.tinkerbox.io", "-n", NS, "-o", "name"],
                    None,
                )
                .contains("stack")
    });
    assert!(
        c.kubectl(&["get", "crd", "-o", "name"], None)
            .contains("workflows.tinkerbell.org")
    );
    assert!(
        c.kubectl(&["get", "hardware", "-n", NS, "-o", "name"], None)
            .contains("m1")
    );
    assert!(
        c.kubectl(&["get", "namespace", "-o", "name"], None)
            .contains("namespace/tink")
    );
}

/// A v0.12 Workflow with the status tink v0.12.2's controller writes.
fn v012_workflow(name: &str, state: &str) -> (String, String) {
    let obj = format!(
        "apiVersion: tinkerbell.org/v1alpha1\nkind: Workflow\nmetadata:\n  name: {name}\n  namespace: tink\nspec:\n  templateRef: t1\n  hardwareRef: m1\n  hardwareMap:\n    device_1: \"52:54:00:7c:00:01\"\n"
    );
    let status = format!(
        r#"{{"status":{{"state":"{state}","templateRending":"successful","globalTimeout":900,"currentAction":"stream","tasks":[{{"name":"os","worker":"52:54:00:7c:00:01","actions":[{{"name":"wipe","image":"quay.io/tinkerbell/actions/wipe","timeout":60,"status":"STATE_SUCCESS","startedAt":"2026-11-20T10:00:00Z","seconds":7}},{{"name":"stream","image":"quay.io/tinkerbell/actions/image2disk","timeout":600,"status":"{state}","startedAt":"2026-11-20T10:00:07Z"}}]}}]}}}}"#
    );
    (obj, status)
}

#[test]
fn supervisor_migrates_v012_workflows_on_upgrade_and_refuses_what_it_cannot() {
    let c = Cluster::start();
    apply(
        &c,
        "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: tink\n",
    );
    // A cluster as tink v0.12.2 left it: its Workflow CRD, and Workflows
    // with its status shape.
    c.install_v012_workflow_crd();
    let _ = c.kubectl_output(
        &[
            "wait",
            "--for=condition=Established",
            "crd/workflows.tinkerbell.org",
            "--timeout=5s",
        ],
        None,
    );
    for (name, state) in [
        ("wf-running", "STATE_RUNNING"),
        ("wf-done", "STATE_SUCCESS"),
    ] {
        let (obj, status) = v012_workflow(name, state);
        apply(&c, &obj);
        c.kubectl(
            &[
                "patch",
                "workflow",
                name,
                "-n",
                NS,
                "--subresource=status",
                "--type",
                "merge",
                "-p",
                &status,
            ],
            None,
        );
    }
    let d = kube_daemon_with(&c, EXTERNAL);

    // v0.12.2 first: three images, Workflows untouched.
    apply(&c, &STACK.replace("spec:\n", "spec:\n  version: v0.12.2\n"));
    until(60, "v0.12.2 running", &d, || {
        tinkerbell(&c, "stack")["status"]["version"] == "v0.12.2"
    });
    assert_eq!(image(&c, "tink-server"), "quay.io/tinkerbell/tink:v0.12.2");
    assert_eq!(image(&c, "rufio"), "quay.io/tinkerbell/rufio:v0.6.3");
    let wf = json(&c, &["get", "workflow", "wf-running", "-n", NS]);
    assert_eq!(wf["status"]["state"], "STATE_RUNNING");

    // Upgrade: the Workflows are migrated first, then the Deployments roll.
    let t0 = Instant::now();
    patch_spec(&c, r#"{"version":"v0.25.0"}"#);
    until(60, "upgraded", &d, || {
        tinkerbell(&c, "stack")["status"]["version"] == "v0.25.0"
    });
    eprintln!(
        "supervisor: v0.12.2 -> v0.25.0 with 2 Workflows migrated in {} ms",
        t0.elapsed().as_millis()
    );
    let tb = tinkerbell(&c, "stack");
    let (on, reason, msg) = condition(&tb, "Migrated").expect("a Migrated condition");
    assert_eq!(
        (on.as_str(), reason.as_str()),
        ("True", "WorkflowsMigrated")
    );
    assert!(msg.starts_with("2 Workflows migrated"), "{msg}");
    assert_eq!(
        image(&c, "tink-controller"),
        "ghcr.io/tinkerbell/tinkerbell:v0.25.0"
    );
    let wf = json(&c, &["get", "workflow", "wf-running", "-n", NS]);
    let s = &wf["status"];
    assert_eq!(s["state"], "RUNNING", "{s}");
    assert_eq!(s["templateRendering"], "successful");
    assert_eq!(s["tasks"][0]["agentID"], "52:54:00:7c:00:01");
    assert_eq!(s["tasks"][0]["actions"][0]["state"], "SUCCESS");
    assert_eq!(s["tasks"][0]["actions"][0]["executionDuration"], "7s");
    assert!(
        s.get("templateRending").is_none() && s["tasks"][0].get("worker").is_none(),
        "{s}"
    );
    assert!(
        wf["metadata"]["annotations"]
            .get("tinkerbox.io/v0.12-status")
            .is_none(),
        "the kept copy is dropped once all are converted: {}",
        wf["metadata"]
    );
    assert_eq!(
        json(&c, &["get", "workflow", "wf-done", "-n", NS])["status"]["state"],
        "SUCCESS"
    );
    // The installed CRD is the current one now.
    let crd = c.kubectl(
        &["get", "crd", "workflows.tinkerbell.org", "-o", "json"],
        None,
    );
    assert!(crd.contains("templateRendering") && !crd.contains("templateRending"));

    // Downgrade with Workflows on the cluster: refused, nothing changes.
    patch_spec(&c, r#"{"version":"v0.12.2"}"#);
    until(30, "the downgrade refused", &d, || {
        condition(&tinkerbell(&c, "stack"), "Reconciled").is_some_and(|c| c.1 == "DowngradeRefused")
    });
    let (_, _, msg) = condition(&tinkerbell(&c, "stack"), "Reconciled").unwrap();
    assert!(msg.contains("2 Workflows"), "{msg}");
    assert_eq!(
        image(&c, "tink-controller"),
        "ghcr.io/tinkerbell/tinkerbell:v0.25.0"
    );
    assert_eq!(tinkerbell(&c, "stack")["status"]["version"], "v0.25.0");

    // An unknown version: refused, saying which are known.
    patch_spec(&c, r#"{"version":"v9.9.9"}"#);
    until(30, "an unknown version refused", &d, || {
        condition(&tinkerbell(&c, "stack"), "Reconciled")
            .is_some_and(|c| c.1 == "UnknownVersion" && c.2.contains("v0.12.2, v0.25.0"))
    });
    assert_eq!(image(&c, "rufio"), "ghcr.io/tinkerbell/tinkerbell:v0.25.0");

    // A second Tinkerbell in the namespace: refused, makes nothing.
    apply(&c, &STACK.replace("name: stack", "name: second"));
    until(30, "the second refused", &d, || {
        condition(&tinkerbell(&c, "second"), "Reconciled").is_some_and(|c| c.1 == "Duplicate")
    });
    assert!(owned(&c, "second").is_empty());
    assert!(event_reasons(&c).iter().any(|r| r == "Duplicate"));
}
