//! Cleaning on release (`[cleaning] on_release = "metadata"`), in kube
//! mode against a real kube-apiserver where there is one (else kmock):
//! kubectl plays CAPT with its exact changes to a Hardware (the owner
//! labels and the `provisioned` annotation set when a TinkerbellMachine
//! claims it, removed in one patch when it releases it) and its exact
//! selection of a free Hardware (`ownerName DoesNotExist`);
//! sushy-emulator is the BMC that netboots the machine, and the
//! upstream-proto gRPC peer the agent that runs the wipe (or fails it).

use crate::common::*;
use crate::kube::{Cluster, bmc_node_docs, cluster_get, kube_daemon_with, until};
use crate::tink::peer;
use serde_json::Value;

const MAC: &str = "52:54:00:6c:00:01";
const OWNER: &str = "v1alpha1.tinkerbell.org/ownerName";
const PHASE: &str = "tinkerbox.io/release-cleaning";

/// CAPT's claim: both owner labels and, once its Workflow succeeded, the
/// provisioned annotation.
fn capt_claims(c: &Cluster, machine: &str) {
    c.kubectl(
        &[
            "label",
            "hardware",
            "node-1",
            &format!("{OWNER}={machine}"),
            "v1alpha1.tinkerbell.org/ownerNamespace=default",
        ],
        None,
    );
    c.kubectl(
        &[
            "annotate",
            "hardware",
            "node-1",
            "v1alpha1.tinkerbell.org/provisioned=true",
        ],
        None,
    );
}

/// CAPT's `releaseHardware`: one patch removing the labels and the
/// annotation.
fn capt_releases(c: &Cluster) {
    c.kubectl(
        &[
            "patch",
            "hardware",
            "node-1",
            "--type",
            "json",
            "-p",
            r#"[{"op": "remove", "path": "/metadata/labels/v1alpha1.tinkerbell.org~1ownerName"},
                {"op": "remove", "path": "/metadata/labels/v1alpha1.tinkerbell.org~1ownerNamespace"},
                {"op": "remove", "path": "/metadata/annotations/v1alpha1.tinkerbell.org~1provisioned"}]"#,
        ],
        None,
    );
}

/// What CAPT's selection finds free: Hardware with no owner label.
fn capt_would_pick(c: &Cluster) -> bool {
    c.kubectl(
        &["get", "hardware", "-l", &format!("!{OWNER}"), "-o", "name"],
        None,
    )
    .lines()
    .any(|l| l.trim() == "hardware.tinkerbell.org/node-1")
}

fn hw(c: &Cluster) -> Value {
    cluster_get(c, "hardware", "node-1")
}

fn annotation(h: &Value, name: &str) -> Option<String> {
    h["metadata"]["annotations"][name]
        .as_str()
        .map(String::from)
}

fn label(h: &Value, name: &str) -> Option<String> {
    h["metadata"]["labels"][name].as_str().map(String::from)
}

fn exists(c: &Cluster, kind: &str, name: &str) -> bool {
    !c.kubectl(
        &["get", kind, name, "--ignore-not-found", "-o", "name"],
        None,
    )
    .trim()
    .is_empty()
}

/// The agent runs the cleaning (through the netboot the engine asks the
/// BMC for), failing `fail` if given.
fn run_agent(d: &Daemon, fail: Option<&str>) -> Vec<Value> {
    let mut args = vec!["agent", MAC, "--polls", "800"];
    if let Some(f) = fail {
        args.extend(["--fail", f]);
    }
    let out = peer(d, &args);
    assert!(
        out.iter()
            .any(|e| e["event"] == "served" && e["action"] == "wipe disks"),
        "{out:#?}"
    );
    out
}

#[test]
fn a_hardware_capt_releases_is_held_wiped_and_given_back() {
    let cluster = Cluster::start();
    let sushy = crate::bmc_jobs::Sushy::start();
    cluster.kubectl(
        &["create", "-f", "-"],
        Some(&bmc_node_docs(
            "bmc-1",
            "node-1",
            &format!("http://127.0.0.1:{}", sushy.port),
            MAC,
            "10.9.0.21",
        )),
    );
    let d = kube_daemon_with(&cluster, "[cleaning]\non_release = \"metadata\"\n");
    assert!(capt_would_pick(&cluster));

    // Claimed: marked, so that its release is seen whenever it comes
    // (the mark is on the Hardware: a restart or a new leader keeps it).
    capt_claims(&cluster, "tm-0");
    until(30, "the claim marked", &d, || {
        annotation(&hw(&cluster), PHASE).as_deref() == Some("claimed")
    });
    assert!(!capt_would_pick(&cluster));

    // Released: held at once (CAPT's selection skips it), and netbooted
    // into the wipe.
    capt_releases(&cluster);
    until(30, "the hold", &d, || {
        let h = hw(&cluster);
        label(&h, OWNER).as_deref() == Some("tinkerbox_cleaning")
            && annotation(&h, PHASE).as_deref() == Some("cleaning")
    });
    assert!(!capt_would_pick(&cluster));
    until(30, "the cleaning Workflow", &d, || {
        exists(
            &cluster,
            "workflows.tinkerbell.org",
            "node-1-release-cleaning",
        )
    });
    let w = cluster_get(
        &cluster,
        "workflows.tinkerbell.org",
        "node-1-release-cleaning",
    );
    let owner = &w["metadata"]["ownerReferences"][0];
    assert_eq!(owner["kind"], "Hardware", "{w:#}");
    assert_eq!(owner["uid"], hw(&cluster)["metadata"]["uid"], "{w:#}");
    assert_eq!(w["spec"]["hardwareMap"]["device_1"], MAC);
    let out = run_agent(&d, None);
    let served = out
        .iter()
        .find(|e| e["action"] == "wipe disks")
        .map(|e| e["environment"].to_string())
        .unwrap_or_default();
    assert!(served.contains("MODE=metadata"), "{out:#?}");
    sushy.wait_power("On");

    // Cleaned: given back, its Workflow and Template gone, PXE off again.
    until(60, "given back", &d, || {
        let h = hw(&cluster);
        label(&h, OWNER).is_none() && annotation(&h, PHASE).is_none()
    });
    assert!(capt_would_pick(&cluster));
    let h = hw(&cluster);
    assert_eq!(
        h["spec"]["interfaces"][0]["netboot"]["allowPXE"], false,
        "{h:#}"
    );
    until(20, "the cleaning's objects removed", &d, || {
        !exists(
            &cluster,
            "workflows.tinkerbell.org",
            "node-1-release-cleaning",
        ) && !exists(
            &cluster,
            "templates.tinkerbell.org",
            "node-1-release-cleaning",
        )
    });
    let ev = d.cli_ok(&["events", "node-1"]);
    assert!(ev.contains("held and netbooted to wipe its disks"), "{ev}");
    assert!(ev.contains("its disks wiped: given back"), "{ev}");

    // A failed wipe keeps it held, saying why; `retry` runs it again; a
    // user who removes the hold gets it back uncleaned.
    capt_claims(&cluster, "tm-1");
    until(30, "the second claim marked", &d, || {
        annotation(&hw(&cluster), PHASE).as_deref() == Some("claimed")
    });
    capt_releases(&cluster);
    until(30, "the second hold", &d, || {
        exists(
            &cluster,
            "workflows.tinkerbell.org",
            "node-1-release-cleaning",
        )
    });
    run_agent(&d, Some("wipe disks"));
    until(60, "the failure", &d, || {
        annotation(&hw(&cluster), PHASE).as_deref() == Some("failed")
    });
    let h = hw(&cluster);
    assert_eq!(label(&h, OWNER).as_deref(), Some("tinkerbox_cleaning"));
    let why = annotation(&h, "tinkerbox.io/release-cleaning-error").unwrap_or_default();
    assert!(why.contains("wipe disks"), "{h:#}");
    assert!(!capt_would_pick(&cluster));
    let run = annotation(&h, "tinkerbox.io/release-cleaning-run");
    cluster.kubectl(
        &[
            "annotate",
            "--overwrite",
            "hardware",
            "node-1",
            &format!("{PHASE}=retry"),
        ],
        None,
    );
    until(30, "a new run", &d, || {
        let h = hw(&cluster);
        annotation(&h, PHASE).as_deref() == Some("cleaning")
            && annotation(&h, "tinkerbox.io/release-cleaning-run") != run
    });
    cluster.kubectl(&["label", "hardware", "node-1", &format!("{OWNER}-")], None);
    until(30, "given back uncleaned", &d, || {
        let h = hw(&cluster);
        annotation(&h, PHASE).is_none() && label(&h, OWNER).is_none()
    });
    until(20, "the dropped run's Workflow removed", &d, || {
        !exists(
            &cluster,
            "workflows.tinkerbell.org",
            "node-1-release-cleaning",
        )
    });
    assert!(capt_would_pick(&cluster));
    let ev = d.cli_ok(&["events", "node-1"]);
    assert!(ev.contains("cleaning failed, still held"), "{ev}");
    assert!(ev.contains("given back uncleaned"), "{ev}");
}
