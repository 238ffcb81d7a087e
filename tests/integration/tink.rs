//! Tink's gRPC server against an independent peer: a Python client that
//! grpcio-tools generated from the upstream .proto files
//! (tests/tink/peer.py) plays tink-agent and tink-worker v0.12 through
//! whole workflows.

use crate::common::{Daemon, Setup, self_signed_leaf, write_file};
use serde_json::Value;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

/// Run the peer; its JSON lines.
pub(crate) fn peer(d: &Daemon, args: &[&str]) -> Vec<Value> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let venv = Command::new(root.join("tests/tink/grpc-venv"))
        .output()
        .unwrap();
    assert!(
        venv.status.success(),
        "grpc-venv: {}",
        String::from_utf8_lossy(&venv.stderr)
    );
    let venv = String::from_utf8(venv.stdout).unwrap();
    let (python, stubs) = venv.trim().split_once(' ').unwrap();
    let addr = d.tink.to_string();
    let mut cmd = Command::new(python);
    cmd.arg(root.join("tests/tink/peer.py"))
        .arg(stubs)
        .arg(args[0])
        .arg(&addr)
        .args(&args[1..]);
    let o = cmd.output().unwrap();
    assert!(
        o.status.success(),
        "peer {args:?}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

fn workflow(d: &Daemon, name: &str) -> Value {
    serde_json::from_str(&d.cli_ok(&["get", "workflow", name, "-o", "json"])).unwrap()
}

/// Bounded wait for the Workflow's state.
fn wait_state(d: &Daemon, name: &str, want: &str) -> Value {
    wait_state_within(d, name, want, Duration::from_secs(20))
}

/// The same, with its bound (BMC jobs retry with backoff).
pub(crate) fn wait_state_within(d: &Daemon, name: &str, want: &str, bound: Duration) -> Value {
    let start = Instant::now();
    loop {
        let w = workflow(d, name);
        if w["status"]["state"] == want {
            return w;
        }
        assert!(start.elapsed() < bound, "{name} not {want}: {w:#}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

const HW: &str = r#"
apiVersion: tinkerbell.org/v1alpha1
kind: Hardware
metadata: {name: m1}
spec:
  disks: [{device: /dev/vda}]
  interfaces:
  - dhcp: {mac: "02:00:00:00:00:01", ip: {address: 10.0.0.11, netmask: 255.255.255.0}}
    netboot: {allowPXE: false, allowWorkflow: true}
"#;

fn template(name: &str, tasks: &str) -> String {
    format!(
        "---\napiVersion: tinkerbell.org/v1alpha1\nkind: Template\nmetadata: {{name: {name}}}\nspec:\n  data: |\n    version: '0.1'\n    name: {name}\n    global_timeout: 600\n    tasks:\n{tasks}"
    )
}

const ONE_TASK: &str = "    - name: install\n      worker: '{{.device_1}}'\n      volumes: [/dev:/dev]\n      environment: {A: task}\n      actions:\n      - {name: stream, image: quay.io/tinkerbell/actions/image2disk, timeout: 60, environment: {DEST_DISK: '{{ index .Hardware.Disks 0 }}', A: action}}\n      - {name: write, image: quay.io/tinkerbell/actions/writefile, timeout: 30}\n      - {name: reboot, image: bash, timeout: 5, pid: host}\n";

fn workflow_doc(name: &str, template: &str, extra: &str) -> String {
    format!(
        "---\napiVersion: tinkerbell.org/v1alpha1\nkind: Workflow\nmetadata: {{name: {name}}}\nspec:\n  templateRef: {template}\n  hardwareRef: m1\n  hardwareMap: {{device_1: '02:00:00:00:00:01'}}\n{extra}"
    )
}

fn apply(d: &Daemon, text: &str) {
    let f = write_file(&d.dir, "docs.yaml", text);
    d.cli_ok(&["apply", "-f", f.to_str().unwrap()]);
}

/// Hardware m1, Template t1 (three actions) and Workflow wf1, rendered
/// and PENDING.
fn pending_wf1(d: &Daemon) {
    apply(
        d,
        &format!(
            "{HW}{}{}",
            template("t1", ONE_TASK),
            workflow_doc("wf1", "t1", "")
        ),
    );
    wait_state(d, "wf1", "PENDING");
}

fn allow_pxe(d: &Daemon) -> Value {
    let hw: Value =
        serde_json::from_str(&d.cli_ok(&["get", "hardware", "m1", "-o", "json"])).unwrap();
    hw["spec"]["interfaces"][0]["netboot"]["allowPXE"].clone()
}

/// tink-agent runs every action; netboot is allowed while the Workflow
/// runs and not after; the status has each action's times and message.
#[test]
fn tink_agent_runs_a_workflow_to_success() {
    let d = Daemon::start();
    let docs = format!(
        "{HW}{}{}",
        template("t1", ONE_TASK),
        workflow_doc("wf1", "t1", "  bootOptions: {toggleAllowNetboot: true}\n")
    );
    apply(&d, &docs);
    wait_state(&d, "wf1", "PENDING");
    assert_eq!(allow_pxe(&d), true, "allowPXE set in PREPARING");
    let lines = peer(&d, &["agent", "02:00:00:00:00:01"]);
    let served: Vec<&Value> = lines.iter().filter(|l| l["event"] == "served").collect();
    let names: Vec<&str> = served
        .iter()
        .map(|l| l["action"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["stream", "write", "reboot"], "{lines:#?}");
    assert_eq!(served[0]["workflow"], "default/wf1");
    assert_eq!(
        served[0]["environment"],
        serde_json::json!(["A=action", "DEST_DISK=/dev/vda"])
    );
    assert_eq!(served[0]["volumes"], serde_json::json!(["/dev:/dev"]));
    assert_eq!(served[2]["pid"], "host");
    // After the last action: nothing more to run.
    let done = lines.last().unwrap();
    assert_eq!(done["codes"][0], "FAILED_PRECONDITION", "{done}");
    let w = wait_state(&d, "wf1", "SUCCESS");
    assert_eq!(allow_pxe(&d), false, "allowPXE cleared in POST");
    let a = &w["status"]["tasks"][0]["actions"][0];
    assert_eq!(a["state"], "SUCCESS");
    assert_eq!(a["message"], "action completed");
    assert!(a["executionStart"].as_str().unwrap().ends_with('Z'), "{a}");
    let desc = d.cli_ok(&["describe", "workflow", "wf1"]);
    assert!(
        desc.contains("SUCCESS") && desc.contains("AllowNetbootFalse"),
        "{desc}"
    );
}

/// A failed action ends the Workflow FAILED with the agent's message; the
/// actions after it never run.
#[test]
fn a_failed_action_fails_the_workflow() {
    let d = Daemon::start();
    pending_wf1(&d);
    let lines = peer(&d, &["agent", "02:00:00:00:00:01", "--fail", "write"]);
    assert!(
        lines
            .iter()
            .any(|l| l["event"] == "reported" && l["state"] == "FAILED"),
        "{lines:#?}"
    );
    let w = wait_state(&d, "wf1", "FAILED");
    let actions = &w["status"]["tasks"][0]["actions"];
    assert_eq!(actions[1]["state"], "FAILED");
    assert_eq!(actions[1]["message"], "exit status 1");
    assert_eq!(actions[2]["state"], "PENDING");
    // The agent asks again: the Workflow is over for it.
    let again = peer(&d, &["agent", "02:00:00:00:00:01", "--polls", "1"]);
    assert_eq!(again[0]["code"], "FAILED_PRECONDITION", "{again:#?}");
}

/// An action reported TIMEOUT by the agent, and the server's own global
/// timeout for a Workflow whose agent went quiet.
#[test]
fn timeouts_end_the_workflow() {
    let d = Daemon::start();
    pending_wf1(&d);
    peer(&d, &["agent", "02:00:00:00:00:01", "--timeout", "stream"]);
    let w = wait_state(&d, "wf1", "TIMEOUT");
    assert_eq!(w["status"]["tasks"][0]["actions"][0]["state"], "TIMEOUT");
    // Global timeout: 1 s, and the agent stops after reporting RUNNING.
    let quick = template("t2", ONE_TASK).replace("global_timeout: 600", "global_timeout: 1");
    apply(&d, &format!("{quick}{}", workflow_doc("wf2", "t2", "")));
    wait_state(&d, "wf2", "PENDING");
    let lines = peer(&d, &["agent", "02:00:00:00:00:01", "--hang", "stream"]);
    assert!(lines.iter().any(|l| l["event"] == "hung"), "{lines:#?}");
    let w = wait_state(&d, "wf2", "TIMEOUT");
    assert!(
        w["status"]["globalExecutionStop"].as_str().is_some(),
        "{w:#}"
    );
}

/// Two tasks for two agents: the second agent is told there is nothing
/// for it (NotFound) until the first task is done, then runs its own.
#[test]
fn two_tasks_for_two_agents() {
    let d = Daemon::start();
    let tasks = "    - name: first\n      worker: w1\n      actions: [{name: a, image: bash}]\n    - name: second\n      worker: w2\n      actions: [{name: b, image: bash}, {name: c, image: bash}]\n";
    apply(
        &d,
        &format!(
            "{HW}{}{}",
            template("t2", tasks),
            workflow_doc("wf", "t2", "")
        ),
    );
    wait_state(&d, "wf", "PENDING");
    // w2's task comes second: nothing for it yet (NotFound: poll again).
    let early = peer(&d, &["agent", "w2", "--polls", "1"]);
    assert_eq!(early[0]["code"], "NOT_FOUND", "{early:#?}");
    let one = peer(&d, &["agent", "w1", "--polls", "5"]);
    assert_eq!(
        one.iter().filter(|l| l["event"] == "served").count(),
        1,
        "{one:#?}"
    );
    assert_eq!(one.last().unwrap()["codes"][0], "NOT_FOUND");
    let two = peer(&d, &["agent", "w2"]);
    let names: Vec<&str> = two
        .iter()
        .filter(|l| l["event"] == "served")
        .map(|l| l["action"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["b", "c"], "{two:#?}");
    wait_state(&d, "wf", "SUCCESS");
}

/// tink-worker v0.12: contexts, the action list, reports by name; and its
/// ReportActionStatus shares the path with tink-agent's.
#[test]
fn tink_worker_v0_12_runs_a_workflow_to_success() {
    let d = Daemon::start();
    pending_wf1(&d);
    let lines = peer(&d, &["worker", "02:00:00:00:00:01"]);
    let served: Vec<&Value> = lines.iter().filter(|l| l["event"] == "served").collect();
    assert_eq!(served.len(), 3, "{lines:#?}");
    assert_eq!(served[1]["index"], 1);
    assert_eq!(served[1]["total"], 3);
    assert!(
        lines
            .iter()
            .filter(|l| l["event"] == "stale_report")
            .all(|l| l["code"] == "INVALID_ARGUMENT"),
        "{lines:#?}"
    );
    let w = wait_state(&d, "wf1", "SUCCESS");
    assert_eq!(w["status"]["tasks"][0]["actions"][2]["state"], "SUCCESS");
    // A message with fields of both shapes (4 as a varint, 5 as a string)
    // is refused, and the daemon goes on serving.
    let raw = peer(&d, &["raw", "2001" /* field 4 varint 1 */]);
    assert_eq!(raw[0]["code"], "INVALID_ARGUMENT", "{raw:#?}");
    let raw = peer(&d, &["raw", "20012a0178"]);
    assert_ne!(raw[0]["code"], "OK", "{raw:#?}");
}

/// With `[tink] tls_cert`/`tls_key` the workers speak TLS (the peer trusts
/// the certificate), and the iPXE script tells the OSIE so.
#[test]
fn grpc_over_tls() {
    let dir = tempfile::tempdir().unwrap();
    let (cert, key) = (dir.path().join("tink.crt"), dir.path().join("tink.key"));
    self_signed_leaf(&cert, &key, "tinkerbox");
    let tink = format!(
        "tls_cert = {:?}\ntls_key = {:?}\n",
        cert.to_str().unwrap(),
        key.to_str().unwrap()
    );
    let d = Daemon::start_setup(Setup {
        tink: &tink,
        ..Setup::default()
    });
    // allowPXE: the iPXE script is served only to a machine that may boot.
    let hw = HW.replace("allowPXE: false", "allowPXE: true");
    apply(
        &d,
        &format!(
            "{hw}{}{}",
            template("t1", ONE_TASK),
            workflow_doc("wf1", "t1", "")
        ),
    );
    wait_state(&d, "wf1", "PENDING");
    let lines = peer(
        &d,
        &[
            "agent",
            "02:00:00:00:00:01",
            "--tls",
            cert.to_str().unwrap(),
        ],
    );
    assert_eq!(
        lines.iter().filter(|l| l["event"] == "served").count(),
        3,
        "{lines:#?}"
    );
    wait_state(&d, "wf1", "SUCCESS");
    let o = d.curl(&["-sf", &d.url("/ipxe/script/02:00:00:00:00:01/auto.ipxe")]);
    let script = String::from_utf8_lossy(&o.stdout);
    assert!(script.contains("tinkerbell_tls=true"), "{script}");
    assert!(
        script.contains(&format!("grpc_authority=127.0.0.1:{}", d.tink.port())),
        "{script}"
    );
}

/// The daemon's resident memory, from /proc.
fn rss_kib(d: &Daemon) -> u64 {
    let pid = d.child.as_ref().expect("running").id();
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

/// GetAction with agent ids a hostile network chooses: 300 distinct ids
/// of ~1 MB (the gRPC limit) are each refused with InvalidArgument and
/// none is remembered, so the daemon's memory stays where it was (a
/// cache keyed by them once took it from 33 to 337 MB).
#[test]
fn oversized_agent_ids_are_refused_and_never_remembered() {
    let d = Daemon::start();
    pending_wf1(&d);
    let before = rss_kib(&d);
    let lines = peer(&d, &["flood", "1000000", "--polls", "300"]);
    let codes = &lines.last().unwrap()["codes"];
    assert_eq!(codes["INVALID_ARGUMENT"], 300, "{codes}");
    let after = rss_kib(&d);
    assert!(
        after < before + 40 * 1024,
        "RSS {before} KiB -> {after} KiB after 300 MB of agent ids"
    );
    // A real agent is still served.
    let lines = peer(&d, &["agent", "02:00:00:00:00:01"]);
    assert!(lines.iter().any(|l| l["event"] == "served"), "{lines:#?}");
}
