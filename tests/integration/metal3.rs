//! Metal3 BareMetalHosts in host mode, through the daemon and its CLI,
//! against real peers: sushy-emulator --fake as the host's Redfish BMC,
//! the gRPC peer built from the upstream .proto files (tests/tink/peer.py)
//! as the agent that runs each Workflow, and curl posting the inspection
//! report the way the agent's `inspect` action does. (The agent's actions
//! themselves, on real disks, are the namespace lab's: tests/lab.)

use crate::bmc_jobs::Sushy;
use crate::common::*;
use crate::tink::peer;
use serde_json::{Value, json};
use std::time::{Duration, Instant};

const MAC: &str = "52:54:00:77:00:01";

fn docs(sushy_port: u16, extra_spec: &str) -> String {
    format!(
        r#"apiVersion: v1
kind: Secret
metadata: {{name: node-0-bmc, namespace: default}}
type: Opaque
stringData: {{username: admin, password: "pw-Metal3"}}
---
apiVersion: metal3.io/v1alpha1
kind: BareMetalHost
metadata: {{name: node-0, namespace: default, labels: {{rack: r1}}}}
spec:
  online: false
  bootMACAddress: "{MAC}"
  bmc:
    address: redfish+http://127.0.0.1:{sushy_port}
    credentialsName: node-0-bmc
{extra_spec}"#
    )
}

fn apply(d: &Daemon, text: &str) -> String {
    let f = write_file(&d.dir, "bmh.yaml", text);
    d.cli_ok(&["apply", "-f", f.to_str().unwrap()])
}

fn host(d: &Daemon) -> Value {
    serde_json::from_str(&d.cli_ok(&["get", "bmh", "node-0", "-o", "json"])).unwrap()
}

/// Wait (bounded) for the host's provisioning state; the host as it was.
fn wait_state(d: &Daemon, want: &str, within: Duration) -> Value {
    wait_host(d, want, within, || host(d))
}

/// Wait (bounded) until the host as `read` gives it is in state `want`.
fn wait_host(d: &Daemon, want: &str, within: Duration, mut read: impl FnMut() -> Value) -> Value {
    let deadline = Instant::now() + within;
    let mut last = Value::Null;
    while Instant::now() < deadline {
        last = read();
        if last["status"]["provisioning"]["state"] == want {
            return last;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    panic!(
        "host never reached {want:?} within {within:?}: {last:#}\ndaemon log:\n{}",
        d.log()
    );
}

/// Wait (bounded) until host node-0 is gone (`exists` says it is not).
fn wait_gone(d: &Daemon, secs: u64, mut exists: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(secs);
    while exists() {
        assert!(
            Instant::now() < deadline,
            "node-0 was never deleted within {secs}s:\n{}",
            d.log()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// The environment of the rendered Workflow's first action.
/// The Workflow `name`, once the controller has made it: the host's state
/// can be written a moment before (seen under load).
fn workflow(d: &Daemon, name: &str) -> Value {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let o = d.cli(&["get", "workflow", name, "-o", "json"]);
        if o.status.success() {
            return serde_json::from_slice(&o.stdout).unwrap();
        }
        assert!(
            Instant::now() < deadline,
            "no Workflow {name}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn first_action_env(d: &Daemon, workflow_name: &str) -> Value {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let w = workflow(d, workflow_name);
        let env = &w["status"]["tasks"][0]["actions"][0]["environment"];
        if env.is_object() {
            return env.clone();
        }
        assert!(
            Instant::now() < deadline,
            "{workflow_name} never rendered: {w:#}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// The agent runs every action of its Workflow (through the netboot the
/// engine asks the BMC for first: sushy applies it after a few seconds).
fn run_agent(d: &Daemon) -> Vec<Value> {
    let out = peer(d, &["agent", MAC, "--polls", "800"]);
    let ran = out
        .iter()
        .find(|e| e["event"] == "done")
        .map(|e| e["ran"].clone());
    assert!(
        ran.as_ref().and_then(Value::as_u64).unwrap_or(0) >= 2,
        "{out:#?}"
    );
    out
}

fn post(d: &Daemon, url: &str, body: &str) -> String {
    let o = d.curl(&[
        "-s",
        "-o",
        "/dev/null",
        "-w",
        "%{http_code}",
        "-X",
        "POST",
        "-H",
        "content-type: application/json",
        "--data-binary",
        body,
        url,
    ]);
    String::from_utf8_lossy(&o.stdout).into_owned()
}

const REPORT: &str = r#"{
  "systemVendor": {"manufacturer": "QEMU", "productName": "Standard PC (Q35 + ICH9, 2009)", "serialNumber": "S-1"},
  "firmware": {"bios": {"vendor": "EDK II", "version": "stable202302", "date": "02/06/2015"}},
  "ramMebibytes": 2048,
  "cpu": {"arch": "x86_64", "model": "QEMU Virtual CPU", "clockMegahertz": 2400.0, "count": 2, "flags": ["sse2"]},
  "nics": [{"name": "eth0", "mac": "52:54:00:77:00:01", "ip": "10.99.0.120", "speedGbps": 0, "pxe": true, "model": "0x1af4 0x1000"}],
  "storage": [
    {"name": "/dev/vda", "sizeBytes": 2147483648, "type": "HDD", "rotational": true, "model": "small"},
    {"name": "/dev/vdb", "sizeBytes": 21474836480, "type": "SSD", "rotational": false, "serialNumber": "D-2"}
  ],
  "hostname": "node-0",
  "notInTheSchema": true
}"#;

#[test]
fn a_host_is_registered_inspected_provisioned_deprovisioned_and_deleted() {
    let sushy = Sushy::start();
    let d = Daemon::start();
    let out = apply(&d, &docs(sushy.port, ""));
    assert!(
        out.contains("baremetalhost.metal3.io/node-0 created"),
        "{out}"
    );

    // Registered (the BMC reached with the Secret), then inspecting: the
    // host's parts are ordinary objects, labelled with its name.
    let h = wait_state(&d, "inspecting", Duration::from_secs(30));
    assert_eq!(h["status"]["operationalStatus"], "OK", "{h:#}");
    assert!(h["status"]["operationHistory"]["register"]["end"].is_string());
    assert!(h["status"]["goodCredentials"]["credentials"]["name"] == "node-0-bmc");
    let hw: Value =
        serde_json::from_str(&d.cli_ok(&["get", "hardware", "node-0", "-o", "json"])).unwrap();
    assert_eq!(
        hw["metadata"]["labels"]["metal3.io/baremetalhost"],
        "node-0"
    );
    assert_eq!(hw["spec"]["interfaces"][0]["dhcp"]["mac"], MAC);
    let env = first_action_env(&d, "node-0-inspect");
    let callback = env["CALLBACK_URL"].as_str().unwrap().to_string();
    assert!(callback.starts_with("http://"), "{callback}");
    assert_eq!(env["BOOT_MAC"], MAC);

    // A report with the wrong secret, or a bad one, is refused; the real
    // one taken.
    // The secret with its last digit changed (never the same digit).
    let last = if callback.ends_with('0') { "1" } else { "0" };
    let wrong = format!("{}{last}", &callback[..callback.len() - 1]);
    assert_eq!(post(&d, &wrong, REPORT), "404");
    assert_eq!(post(&d, &callback, r#"{"ramMebibytes": "lots"}"#), "400");
    assert_eq!(post(&d, &callback, REPORT), "204");
    run_agent(&d);

    // Available: the report is the status's hardware (pruned to the
    // CRD's schema) and the HardwareData; online false is enforced.
    let h = wait_state(&d, "available", Duration::from_secs(60));
    let hwd = &h["status"]["hardware"];
    assert_eq!(hwd["ramMebibytes"], 2048);
    assert_eq!(hwd["nics"][0]["ip"], "10.99.0.120");
    assert!(hwd.get("notInTheSchema").is_none(), "{hwd:#}");
    assert_eq!(
        h["status"]["provisioning"]["ID"].as_str().unwrap().len(),
        36,
        "{h:#}"
    );
    assert_eq!(h["status"]["hardwareProfile"], "unknown");
    let cond = |h: &Value, t: &str| {
        h["status"]["conditions"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["type"] == t)
            .map(|c| {
                (
                    c["status"].as_str().unwrap().to_string(),
                    c["reason"].as_str().unwrap().to_string(),
                )
            })
            .unwrap()
    };
    assert_eq!(
        cond(&h, "AvailableForProvisioning"),
        ("True".into(), "Available".into())
    );
    assert_eq!(cond(&h, "Manageable"), ("True".into(), "Manageable".into()));
    let data: Value =
        serde_json::from_str(&d.cli_ok(&["get", "hardwaredata", "node-0", "-o", "json"])).unwrap();
    assert_eq!(data["spec"]["hardware"], *hwd);
    assert_eq!(data["kind"], "HardwareData");
    sushy.wait_power("Off");

    // The printer columns, as kubectl get bmh shows them.
    let table = d.cli_ok(&["get", "bmh"]);
    let head: Vec<&str> = table.lines().next().unwrap().split_whitespace().collect();
    assert_eq!(
        head,
        ["NAME", "STATE", "CONSUMER", "ONLINE", "ERROR", "AGE"]
    );
    assert!(
        table.contains("node-0") && table.contains("available"),
        "{table}"
    );

    // Claimed: an image and online. The root device by the hints: the
    // SSD, not the smaller disk.
    let spec = r#"  image: {url: "http://10.99.0.1/img.qcow2", checksum: "http://10.99.0.1/img.qcow2.sha256sum", checksumType: sha256, format: qcow2}
  rootDeviceHints: {rotational: false}
  consumerRef: {name: m-0, kind: Metal3Machine, apiVersion: infrastructure.cluster.x-k8s.io/v1beta1}
  userData: {name: node-0-user-data}
  metaData: {name: node-0-meta-data}
"#;
    // The data Secrets first, as CAPM3 makes them before it claims.
    let secrets = r##"apiVersion: v1
kind: Secret
metadata: {name: node-0-user-data}
stringData: {userData: "#cloud-config\nhostname: node-0\n"}
---
apiVersion: v1
kind: Secret
metadata: {name: node-0-meta-data}
stringData: {metaData: "role: worker\n"}
"##;
    let out = apply(&d, secrets);
    assert!(out.contains("secret/node-0-user-data created"), "{out}");
    apply(
        &d,
        &docs(sushy.port, spec).replace("online: false", "online: true"),
    );
    let h = wait_state(&d, "provisioning", Duration::from_secs(30));
    assert_eq!(
        h["status"]["lastAttemptedImage"]["url"],
        "http://10.99.0.1/img.qcow2"
    );
    let env = first_action_env(&d, "node-0-provision");
    assert_eq!(env["DEST_DISK"], "/dev/vdb");
    assert_eq!(env["IMG_URL"], "http://10.99.0.1/img.qcow2");
    assert_eq!(env["CHECKSUM_TYPE"], "sha256");
    let w: Value = workflow(&d, "node-0-provision");
    assert!(
        w["status"]["tasks"][0]["actions"][0]["image"]
            .as_str()
            .unwrap()
            .contains("qemuimg2disk")
    );
    // The config drive the agent writes: Ironic's files in a CONFIG-2
    // VFAT, the user's data in it (mtools reads it, as blkid finds it).
    let cd = &w["status"]["tasks"][0]["actions"][1]["environment"];
    assert_eq!(cd["DEST_DISK"], "/dev/vdb");
    let url = cd["CONFIG_DRIVE_URL"].as_str().unwrap();
    let img = d.dir.join("cd.img");
    let o = d.curl(&["-sf", "-o", img.to_str().unwrap(), url]);
    assert!(o.status.success(), "config drive: {o:?}");
    assert!(
        !d.curl(&["-sf", "-o", "/dev/null", &format!("{url}x")])
            .status
            .success()
    );
    let mtype = |path: &str| {
        std::process::Command::new("mtype")
            .args(["-i", img.to_str().unwrap(), path])
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
    };
    match mtype("::openstack/latest/user_data") {
        Ok(u) => {
            assert_eq!(u, "#cloud-config\nhostname: node-0\n");
            let meta: Value =
                serde_json::from_str(&mtype("::openstack/latest/meta_data.json").unwrap()).unwrap();
            assert_eq!(meta["role"], "worker");
            assert_eq!(meta["metal3-name"], "node-0");
            assert_eq!(meta["uuid"], h["status"]["provisioning"]["ID"]);
        }
        Err(e) => eprintln!(
            "DID NOT RUN: mtools' mtype is not installed ({e}): the config drive's files were not read"
        ),
    }
    // The installed OS may read the same user data from the metadata
    // service: the Hardware has it.
    let hw: Value =
        serde_json::from_str(&d.cli_ok(&["get", "hardware", "node-0", "-o", "json"])).unwrap();
    assert_eq!(hw["spec"]["userData"], "#cloud-config\nhostname: node-0\n");
    run_agent(&d);
    let h = wait_state(&d, "provisioned", Duration::from_secs(60));
    assert_eq!(
        h["status"]["provisioning"]["image"]["url"],
        "http://10.99.0.1/img.qcow2"
    );
    assert_eq!(h["status"]["errorMessage"], "");
    assert!(h["status"]["operationHistory"]["provision"]["end"].is_string());
    assert_eq!(
        cond(&h, "Provisioned"),
        ("True".into(), "Provisioned".into())
    );
    assert_eq!(cond(&h, "Ready"), ("True".into(), "Provisioned".into()));

    // Released: the image cleared. Cleaning wipes the disks, then the host
    // is available again, its image gone from the status.
    apply(
        &d,
        &docs(
            sushy.port,
            "  consumerRef: {name: m-0, kind: Metal3Machine}\n",
        ),
    );
    wait_state(&d, "deprovisioning", Duration::from_secs(30));
    let w: Value = workflow(&d, "node-0-deprovision");
    let _ = first_action_env(&d, "node-0-deprovision");
    run_agent(&d);
    let h = wait_state(&d, "available", Duration::from_secs(60));
    assert!(h["status"]["provisioning"].get("image").is_none(), "{h:#}");
    assert!(h["status"]["operationHistory"]["deprovision"]["end"].is_string());
    assert!(w["spec"]["templateRef"] == "node-0-deprovision", "{w:#}");

    // Deleted: powered off, its parts removed, then gone.
    d.cli_ok(&["delete", "bmh", "node-0"]);
    wait_gone(&d, 60, || d.cli(&["get", "bmh", "node-0"]).status.success());
    assert!(!d.cli(&["get", "hardware", "node-0"]).status.success());
    assert!(
        !d.cli(&["get", "workflow", "node-0-inspect"])
            .status
            .success()
    );
    assert!(!d.cli(&["get", "hardwaredata", "node-0"]).status.success());
    let bmc = d.cli_ok(&["get", "machine", "-o", "json"]);
    assert!(!bmc.contains("\"node-0\""), "{bmc}");

    // Each state change was an event of the host.
    let ev = d.cli_ok(&["events", "node-0"]);
    for s in [
        "registering",
        "inspecting",
        "available",
        "provisioned",
        "deprovisioning",
    ] {
        assert!(ev.contains(&format!("-> \"{s}\"")), "{s}: {ev}");
    }
}

#[test]
fn a_host_the_webhook_would_refuse_is_refused_and_a_bad_bmc_is_a_registration_error() {
    let d = Daemon::start();
    // BMO's webhook rules: a clear error naming the field, nothing stored.
    let bad = docs(1, "").replace("redfish+http://127.0.0.1:1", "irmc://10.0.0.1");
    let f = write_file(&d.dir, "bad.yaml", &bad);
    let o = d.cli(&["apply", "-f", f.to_str().unwrap()]);
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("spec.bmc.address"), "{err}");
    assert!(!d.cli(&["get", "bmh", "node-0"]).status.success());

    // A BMC that does not answer: registering, with BMO's error fields.
    let port = free_port();
    apply(&d, &docs(port, ""));
    let deadline = Instant::now() + Duration::from_secs(90);
    let h = loop {
        let h = host(&d);
        if h["status"]["errorType"] == "registration error" {
            break h;
        }
        assert!(
            Instant::now() < deadline,
            "no registration error: {h:#}\n{}",
            d.log()
        );
        std::thread::sleep(Duration::from_millis(300));
    };
    assert_eq!(h["status"]["provisioning"]["state"], "registering");
    assert_eq!(h["status"]["operationalStatus"], "error");
    assert_eq!(h["status"]["errorCount"], 1);
    assert!(!h["status"]["errorMessage"].as_str().unwrap().is_empty());
    // Deleted while registering: gone without a power-off.
    d.cli_ok(&["delete", "bmh", "node-0"]);
    wait_gone(&d, 30, || d.cli(&["get", "bmh", "node-0"]).status.success());
}

/// `tinkerbox claim` of a host matching `selector` for consumer web-1,
/// with a raw image and user data, not followed.
fn claim_web_1(d: &Daemon, selector: &str) -> String {
    let ud = write_file(&d.dir, "user-data", "#cloud-config\nhostname: claimed\n");
    d.cli_ok(&[
        "claim",
        "-l",
        selector,
        "--image",
        "http://10.99.0.1/img.raw.gz",
        "--checksum",
        "0123456789abcdef0123456789abcdef",
        "--user-data",
        ud.to_str().unwrap(),
        "--consumer",
        "web-1",
        "--no-wait",
    ])
}

/// A host not inspected: its hardware from BMO's annotation.
pub(crate) fn bare_host(name: &str, mac: &str, rack: &str, sushy_port: u16) -> String {
    format!(
        r#"---
apiVersion: v1
kind: Secret
metadata: {{name: {name}-bmc}}
stringData: {{username: admin, password: "pw-Metal3"}}
---
apiVersion: metal3.io/v1alpha1
kind: BareMetalHost
metadata:
  name: {name}
  labels: {{rack: {rack}}}
  annotations:
    inspect.metal3.io/hardwaredetails: '{{"storage": [{{"name": "/dev/vda", "sizeBytes": 21474836480}}], "nics": [{{"name": "eth0", "mac": "{mac}", "ip": "", "pxe": true}}]}}'
spec:
  online: false
  inspectionMode: disabled
  bootMACAddress: "{mac}"
  bmc: {{address: "redfish+http://127.0.0.1:{sushy_port}", credentialsName: {name}-bmc}}
"#
    )
}

pub(crate) fn wait_named(d: &Daemon, name: &str, want: &str) -> Value {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let h: Value =
            serde_json::from_str(&d.cli_ok(&["get", "bmh", name, "-o", "json"])).unwrap();
        if h["status"]["provisioning"]["state"] == want {
            return h;
        }
        assert!(
            Instant::now() < deadline,
            "{name} never {want}: {h:#}\n{}",
            d.log()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn claim_picks_an_available_matching_host_and_release_cleans_it_and_gives_it_back() {
    let (s1, s2) = (Sushy::start(), Sushy::start());
    let d = Daemon::start();
    const MAC_B: &str = "52:54:00:77:00:0b";
    apply(
        &d,
        &format!(
            "{}{}",
            bare_host("node-a", "52:54:00:77:00:0a", "r1", s1.port),
            bare_host("node-b", MAC_B, "r2", s2.port)
        ),
    );
    // Not inspected: straight to available, the hardware from the
    // annotation (which is then removed, as BMO does).
    let b = wait_named(&d, "node-b", "available");
    assert_eq!(b["status"]["hardware"]["storage"][0]["name"], "/dev/vda");
    assert!(
        b["metadata"]["annotations"]
            .get("inspect.metal3.io/hardwaredetails")
            .is_none()
    );
    assert!(b["status"]["operationHistory"]["inspect"]["start"].is_null());
    wait_named(&d, "node-a", "available");

    // Claimed by label: the one host in rack r2.
    let out = claim_web_1(&d, "rack=r2");
    assert!(
        out.contains("baremetalhost.metal3.io/node-b claimed by web-1"),
        "{out}"
    );
    let b = wait_named(&d, "node-b", "provisioning");
    assert_eq!(b["spec"]["consumerRef"]["name"], "web-1");
    assert_eq!(b["spec"]["online"], true);
    assert_eq!(b["spec"]["userData"]["name"], "node-b-web-1-user-data");
    let env = first_action_env(&d, "node-b-provision");
    assert_eq!(env["CHECKSUM_TYPE"], "auto");
    // Nothing else in r2 is available: a clear refusal.
    let o = d.cli(&[
        "claim",
        "-l",
        "rack=r2",
        "--image",
        "http://x/i",
        "--checksum",
        "ab",
        "--no-wait",
    ]);
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("available BareMetalHost"), "{err}");

    let out = peer(&d, &["agent", MAC_B, "--polls", "800"]);
    assert!(
        out.iter()
            .any(|e| e["event"] == "done" && e["ran"].as_u64() >= Some(3)),
        "{out:#?}"
    );
    wait_named(&d, "node-b", "provisioned");

    // Released: cleaned, then its consumer cleared.
    let out = d.cli_ok(&["release", "node-b", "--no-wait"]);
    assert!(out.contains("releasing"), "{out}");
    wait_named(&d, "node-b", "deprovisioning");
    let out = peer(&d, &["agent", MAC_B, "--polls", "800"]);
    assert!(
        out.iter()
            .any(|e| e["event"] == "done" && e["ran"].as_u64() >= Some(2)),
        "{out:#?}"
    );
    wait_named(&d, "node-b", "available");
    let out = d.cli_ok(&["release", "node-b"]);
    assert!(out.contains("node-b released"), "{out}");
    let b = wait_named(&d, "node-b", "available");
    assert!(b["spec"].get("consumerRef").is_none(), "{b:#}");
    assert!(b["spec"].get("image").is_none());
    assert_eq!(b["spec"]["online"], false);
    // A live ISO: booted through the BMC from the network, not written.
    let out = d.cli_ok(&[
        "claim",
        "-l",
        "rack=r1",
        "--image",
        "http://10.99.0.1/live.iso",
        "--format",
        "live-iso",
        "--no-wait",
    ]);
    assert!(out.contains("node-a claimed"), "{out}");
    let a = wait_named(&d, "node-a", "provisioned");
    assert_eq!(a["status"]["provisioning"]["image"]["format"], "live-iso");
    s1.wait_power("On");
    let hw: Value =
        serde_json::from_str(&d.cli_ok(&["get", "hardware", "node-a", "-o", "json"])).unwrap();
    let nb = &hw["spec"]["interfaces"][0]["netboot"];
    assert_eq!(nb["allowPXE"], true);
    assert_eq!(
        nb["ipxe"]["contents"],
        "#!ipxe\nsanboot --no-describe http://10.99.0.1/live.iso\n"
    );
    assert!(
        !d.cli(&["get", "workflow", "node-a-provision"])
            .status
            .success()
    );
    // Released: the ISO's boot gone, cleaned, available.
    d.cli_ok(&["release", "node-a", "--no-wait"]);
    wait_named(&d, "node-a", "deprovisioning");
    let out = peer(&d, &["agent", "52:54:00:77:00:0a", "--polls", "800"]);
    assert!(
        out.iter()
            .any(|e| e["event"] == "done" && e["ran"].as_u64() >= Some(2)),
        "{out:#?}"
    );
    wait_named(&d, "node-a", "available");
    let hw: Value =
        serde_json::from_str(&d.cli_ok(&["get", "hardware", "node-a", "-o", "json"])).unwrap();
    assert!(
        hw["spec"]["interfaces"][0]["netboot"].get("ipxe").is_none(),
        "{hw:#}"
    );

    // Claimable again.
    let out = d.cli_ok(&[
        "claim",
        "-l",
        "rack in (r2)",
        "--image",
        "http://x/i",
        "--checksum",
        "ab",
        "--no-wait",
    ]);
    assert!(out.contains("node-b claimed"), "{out}");
}

/// The host as the cluster has it.
fn cluster_host(c: &crate::kube::Cluster) -> Value {
    crate::kube::cluster_get(c, "baremetalhost", "node-0")
}

/// Wait (bounded) for the cluster's copy of the host to be in `want`
/// (its status as tinkerbox wrote it through the status subresource).
fn wait_cluster_state(c: &crate::kube::Cluster, d: &Daemon, want: &str, secs: u64) -> Value {
    wait_host(d, want, Duration::from_secs(secs), || cluster_host(c))
}

/// Kube mode (`kube.metal3`): tinkerbox is the cluster's BareMetalHost
/// operator. kubectl plays the user and CAPM3 (its exact patches: the
/// claim, the release, the consumer cleared once available), against a
/// real kube-apiserver where there is one; sushy-emulator is the BMC and
/// the upstream-proto gRPC peer the agent. Everything is read back from
/// the cluster: status through the status subresource, BMO's finalizer,
/// the parts the host owns (owner references), HardwareData; a delete
/// waits for the host to be taken down, and the parts go with it.
#[test]
fn in_kube_mode_kubectl_and_capm3s_patches_take_a_host_through_its_lifecycle() {
    let cluster = crate::kube::Cluster::start();
    let sushy = Sushy::start();
    // `data`, not `stringData`: kmock (the fallback) does not convert it.
    let host_docs = docs(sushy.port, "").replace(
        r#"stringData: {username: admin, password: "pw-Metal3"}"#,
        "data: {username: YWRtaW4=, password: cHctTWV0YWwz}",
    );
    cluster.kubectl(&["apply", "-f", "-"], Some(&host_docs));
    let d = crate::kube::kube_daemon_with(&cluster, "metal3 = true\n");

    let h = wait_cluster_state(&cluster, &d, "inspecting", 60);
    assert_eq!(h["status"]["operationalStatus"], "OK", "{h:#}");
    assert!(
        h["metadata"]["finalizers"]
            .as_array()
            .is_some_and(|f| f.iter().any(|x| x == "baremetalhost.metal3.io")),
        "BMO's finalizer: {h:#}"
    );
    let uid = h["metadata"]["uid"].as_str().unwrap().to_string();
    // The parts: in the cluster, owned by the host.
    for (kind, name) in [
        ("hardware", "node-0"),
        ("machines.bmc.tinkerbell.org", "node-0"),
        ("workflows.tinkerbell.org", "node-0-inspect"),
        ("templates.tinkerbell.org", "node-0-inspect"),
    ] {
        let o = crate::kube::cluster_get(&cluster, kind, name);
        let owner = &o["metadata"]["ownerReferences"][0];
        assert_eq!(owner["kind"], "BareMetalHost", "{kind}: {o:#}");
        assert_eq!(owner["uid"], uid.as_str(), "{kind}: {o:#}");
        assert_eq!(o["metadata"]["labels"]["metal3.io/baremetalhost"], "node-0");
    }
    let env = first_action_env(&d, "node-0-inspect");
    let callback = env["CALLBACK_URL"].as_str().unwrap().to_string();
    assert_eq!(post(&d, &callback, REPORT), "204");
    run_agent(&d);

    let h = wait_cluster_state(&cluster, &d, "available", 90);
    assert_eq!(h["status"]["hardware"]["ramMebibytes"], 2048, "{h:#}");
    assert_eq!(h["status"]["hardware"]["nics"][0]["ip"], "10.99.0.120");
    let data = crate::kube::cluster_get(&cluster, "hardwaredata", "node-0");
    assert_eq!(data["spec"]["hardware"], h["status"]["hardware"]);
    sushy.wait_power("Off");
    let until_off = Instant::now() + Duration::from_secs(30);
    while cluster_host(&cluster)["status"]["poweredOn"] != false {
        assert!(Instant::now() < until_off, "poweredOn never false");
        std::thread::sleep(Duration::from_millis(250));
    }
    // kubectl's printer columns are the CRD's: the state tinkerbox wrote
    // (kmock has no Table output).
    if cluster.is_real() {
        let table = cluster.kubectl(&["get", "bmh"], None);
        assert!(
            table.contains("node-0") && table.contains("available"),
            "{table}"
        );
    }
    // Writes to the cluster's hosts are the cluster's, not tinkerbox's API.
    let o = d.cli(&["delete", "bmh", "node-0"]);
    assert!(!o.status.success());
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("kubectl"),
        "{o:?}"
    );

    // CAPM3's Associate: the user data Secret, then one patch: the cluster
    // label, consumerRef, image, userData, online.
    cluster.kubectl(
        &["apply", "-f", "-"],
        Some(
            "apiVersion: v1\nkind: Secret\nmetadata: {name: node-0-user-data, namespace: default}\n\
             data: {userData: I2Nsb3VkLWNvbmZpZwpob3N0bmFtZTogbm9kZS0wCg==}\n",
        ),
    );
    let claim = json!({
        "metadata": {"labels": {"cluster.x-k8s.io/cluster-name": "c1"}},
        "spec": {
            "consumerRef": {"kind": "Metal3Machine", "name": "m-0", "namespace": "default",
                            "apiVersion": "infrastructure.cluster.x-k8s.io/v1beta1"},
            "image": {"url": "http://10.99.0.1/img.qcow2", "checksum": "http://10.99.0.1/img.qcow2.sha256sum",
                      "checksumType": "sha256", "format": "qcow2"},
            "userData": {"name": "node-0-user-data", "namespace": "default"},
            "online": true,
        }
    });
    cluster.kubectl(
        &[
            "patch",
            "bmh",
            "node-0",
            "--type",
            "merge",
            "-p",
            &claim.to_string(),
        ],
        None,
    );
    wait_cluster_state(&cluster, &d, "provisioning", 60);
    let hw = crate::kube::cluster_get(&cluster, "hardware", "node-0");
    assert_eq!(hw["spec"]["userData"], "#cloud-config\nhostname: node-0\n");
    let env = first_action_env(&d, "node-0-provision");
    assert_eq!(env["IMG_URL"], "http://10.99.0.1/img.qcow2");
    run_agent(&d);
    let h = wait_cluster_state(&cluster, &d, "provisioned", 90);
    assert_eq!(h["status"]["errorMessage"], "", "{h:#}");
    assert_eq!(
        h["status"]["provisioning"]["image"]["url"],
        "http://10.99.0.1/img.qcow2"
    );
    assert_eq!(h["status"]["hardware"]["hostname"], "node-0");

    // CAPM3's Delete: image and data cleared, online false; it waits for
    // available, then clears the consumer and its label.
    cluster.kubectl(
        &[
            "patch",
            "bmh",
            "node-0",
            "--type",
            "json",
            "-p",
            r#"[{"op": "remove", "path": "/spec/image"}, {"op": "remove", "path": "/spec/userData"},
                {"op": "replace", "path": "/spec/online", "value": false}]"#,
        ],
        None,
    );
    wait_cluster_state(&cluster, &d, "deprovisioning", 60);
    let _ = first_action_env(&d, "node-0-deprovision");
    run_agent(&d);
    let h = wait_cluster_state(&cluster, &d, "available", 90);
    // A field the status no longer has goes (server-side apply; kmock
    // removes what the same manager applied before and no longer does).
    assert!(h["status"]["provisioning"].get("image").is_none(), "{h:#}");
    cluster.kubectl(
        &[
            "patch",
            "bmh",
            "node-0",
            "--type",
            "json",
            "-p",
            r#"[{"op": "remove", "path": "/spec/consumerRef"},
                {"op": "remove", "path": "/metadata/labels/cluster.x-k8s.io~1cluster-name"}]"#,
        ],
        None,
    );

    // `tinkerbox claim` and `release` in kube mode: the same changes, made
    // in the cluster (the spec checked unchanged since read; the user data
    // Secret applied there, and removed with the consumer).
    let out = claim_web_1(&d, "rack=r1");
    assert!(out.contains("node-0 claimed by web-1"), "{out}");
    let h = wait_cluster_state(&cluster, &d, "provisioning", 60);
    assert_eq!(h["spec"]["consumerRef"]["name"], "web-1", "{h:#}");
    let secret = crate::kube::cluster_get(&cluster, "secret", "node-0-web-1-user-data");
    assert_eq!(
        secret["data"]["userData"],
        "I2Nsb3VkLWNvbmZpZwpob3N0bmFtZTogY2xhaW1lZAo="
    );
    run_agent(&d);
    wait_cluster_state(&cluster, &d, "provisioned", 90);
    d.cli_ok(&["release", "node-0", "--no-wait"]);
    wait_cluster_state(&cluster, &d, "deprovisioning", 60);
    run_agent(&d);
    wait_cluster_state(&cluster, &d, "available", 90);
    let out = d.cli_ok(&["release", "node-0", "--no-wait"]);
    assert!(out.contains("released"), "{out}");
    let until_gone = Instant::now() + Duration::from_secs(20);
    while cluster_host(&cluster)["spec"].get("consumerRef").is_some() {
        assert!(Instant::now() < until_gone, "the consumer never cleared");
        std::thread::sleep(Duration::from_millis(250));
    }
    let o = cluster.kubectl(
        &[
            "get",
            "secret",
            "node-0-web-1-user-data",
            "--ignore-not-found",
            "-o",
            "name",
        ],
        None,
    );
    assert!(o.trim().is_empty(), "the claim's Secret is left: {o}");

    // kubectl delete: held by the finalizer while tinkerbox takes the host
    // down, then gone, and every part with it.
    cluster.kubectl(&["delete", "bmh", "node-0", "--wait=false"], None);
    wait_gone(&d, 90, || {
        cluster
            .kubectl_output(&["get", "bmh", "node-0", "-o", "name"], None)
            .status
            .success()
    });
    for (kind, name) in [
        ("hardware", "node-0"),
        ("machines.bmc.tinkerbell.org", "node-0"),
        ("workflows.tinkerbell.org", "node-0-inspect"),
        ("workflows.tinkerbell.org", "node-0-provision"),
        ("templates.tinkerbell.org", "node-0-deprovision"),
        ("hardwaredata", "node-0"),
        ("jobs.bmc.tinkerbell.org", "node-0-power"),
    ] {
        let o = cluster.kubectl(
            &["get", kind, name, "--ignore-not-found", "-o", "name"],
            None,
        );
        assert!(o.trim().is_empty(), "{kind} {name} is left: {o}");
    }
    let ev = d.cli_ok(&["events", "node-0"]);
    for s in ["inspecting", "available", "provisioned", "deleting"] {
        assert!(ev.contains(&format!("-> \"{s}\"")), "{s}: {ev}");
    }
}
