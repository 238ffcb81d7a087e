//! Kubernetes mode against an API server: the mirror of the cluster's
//! Hardware, served on the boot path, through changes, conflicts, a
//! disconnected API server and a restart without it.
//!
//! The peer: a real kube-apiserver is what counts, but where none can be
//! had (no binary in `KUBEBUILDER_ASSETS`) the suite runs against kmock
//! (`tests/kube/kmock-server`, PyPI kmock 0.8) and says so on stderr.
//! kubectl (the cluster's other client) makes every change.

use crate::common::*;
use serde_json::Value;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The API server the kube tests drive, stopped by PID when dropped: a
/// real kube-apiserver on etcd (envtest's convention) where
/// `KUBEBUILDER_ASSETS` has one, else kmock.
pub(crate) struct Cluster {
    /// Started in order (etcd, then the API server); stopped in reverse.
    procs: Vec<Child>,
    pub(crate) kubeconfig: PathBuf,
    _dir: tempfile::TempDir,
}

fn kmock_python() -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let o = Command::new(root.join("tests/kube/kmock-venv"))
        .output()
        .expect("run tests/kube/kmock-venv");
    assert!(
        o.status.success(),
        "tests/kube/kmock-venv failed: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    PathBuf::from(String::from_utf8_lossy(&o.stdout).trim())
}

fn assets() -> PathBuf {
    PathBuf::from(
        std::env::var("KUBEBUILDER_ASSETS").unwrap_or_else(|_| "/usr/local/kubebuilder/bin".into()),
    )
}

impl Cluster {
    /// A real API server if one can be had, else kmock, saying so.
    pub(crate) fn start() -> Cluster {
        let assets = assets();
        if assets.join("kube-apiserver").exists() {
            return Cluster::real(&assets);
        }
        eprintln!(
            "kube: NO kube-apiserver in {} (KUBEBUILDER_ASSETS): the kube tests run against kmock, \
             a fake API server; not run against a real one: schema validation, server-side apply, RBAC",
            assets.display()
        );
        Cluster::kmock()
    }

    /// kmock, whatever else the machine has (tests of kmock's answers).
    pub(crate) fn kmock() -> Cluster {
        let dir = tempfile::tempdir().unwrap();
        let port = free_port();
        let kubeconfig = dir.path().join("kubeconfig");
        std::fs::write(
            &kubeconfig,
            format!(
                "apiVersion: v1\nkind: Config\nclusters:\n- name: lab\n  cluster: {{server: \"http://127.0.0.1:{port}\"}}\n\
                 users:\n- name: lab\n  user: {{}}\ncontexts:\n- name: lab\n  context: {{cluster: lab, user: lab, namespace: default}}\n\
                 current-context: lab\n"
            ),
        )
        .unwrap();
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let mut child = Command::new(kmock_python())
            .arg(root.join("tests/kube/kmock-server"))
            .args(["--port", &port.to_string()])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("start kmock-server");
        let mut line = String::new();
        let out = child.stdout.take().unwrap();
        BufReader::new(out).read_line(&mut line).unwrap();
        assert!(line.starts_with("READY"), "kmock-server said {line:?}");
        Cluster {
            procs: vec![child],
            kubeconfig,
            _dir: dir,
        }
    }

    /// etcd (the assets' own, else Debian's etcd-server) and the assets'
    /// kube-apiserver on loopback, with a token for an admin
    /// (system:masters), as envtest starts them; then upstream's CRDs.
    fn real(assets: &Path) -> Cluster {
        let dir = tempfile::tempdir().unwrap();
        let d = &dir.path().to_path_buf();
        let etcd = [assets.join("etcd"), PathBuf::from("/usr/bin/etcd")]
            .into_iter()
            .find(|p| p.exists())
            .expect("kube-apiserver needs etcd: none in KUBEBUILDER_ASSETS or /usr/bin (apt-get install etcd-server)");
        let (client, peer, secure) = (free_port(), free_port(), free_port());
        // One file for a process's stdout and stderr: (stdout, stderr).
        let log = |name: &str| {
            let f = std::fs::File::create(d.join(name)).unwrap();
            (f.try_clone().unwrap(), f)
        };
        let (out, err) = log("etcd.log");
        let mut procs = vec![];
        procs.push(
            Command::new(&etcd)
                .args(["--name", "default", "--data-dir"])
                .arg(d.join("etcd"))
                .arg(format!("--listen-client-urls=http://127.0.0.1:{client}"))
                .arg(format!("--advertise-client-urls=http://127.0.0.1:{client}"))
                .arg(format!("--listen-peer-urls=http://127.0.0.1:{peer}"))
                .arg(format!(
                    "--initial-advertise-peer-urls=http://127.0.0.1:{peer}"
                ))
                .arg(format!("--initial-cluster=default=http://127.0.0.1:{peer}"))
                .stdin(Stdio::null())
                .stdout(out)
                .stderr(err)
                .spawn()
                .expect("start etcd"),
        );
        let key = d.join("sa.key");
        let o = Command::new("openssl")
            .args(["genrsa", "-out"])
            .arg(&key)
            .arg("2048")
            .output()
            .expect("openssl");
        assert!(
            o.status.success(),
            "openssl genrsa: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        let token = format!("tb-{}", rand_u32());
        std::fs::write(
            d.join("tokens.csv"),
            format!("{token},admin,admin,system:masters\n"),
        )
        .unwrap();
        let (out, err) = log("kube-apiserver.log");
        procs.push(
            Command::new(assets.join("kube-apiserver"))
                .arg(format!("--etcd-servers=http://127.0.0.1:{client}"))
                .arg(format!("--cert-dir={}", d.join("certs").display()))
                .arg(format!("--secure-port={secure}"))
                .args(["--bind-address=127.0.0.1", "--advertise-address=127.0.0.1"])
                .args([
                    "--service-cluster-ip-range=10.0.0.0/24",
                    "--allow-privileged=true",
                ])
                .arg("--service-account-issuer=https://kubernetes.default.svc")
                .arg(format!("--service-account-key-file={}", key.display()))
                .arg(format!(
                    "--service-account-signing-key-file={}",
                    key.display()
                ))
                .arg(format!(
                    "--token-auth-file={}",
                    d.join("tokens.csv").display()
                ))
                .args([
                    "--authorization-mode=RBAC",
                    "--disable-admission-plugins=ServiceAccount",
                ])
                .stdin(Stdio::null())
                .stdout(out)
                .stderr(err)
                .spawn()
                .expect("start kube-apiserver"),
        );
        let kubeconfig = d.join("kubeconfig");
        // Loopback and a certificate the API server made for itself.
        std::fs::write(
            &kubeconfig,
            format!(
                "apiVersion: v1\nkind: Config\nclusters:\n- name: envtest\n  cluster: {{server: \"https://127.0.0.1:{secure}\", insecure-skip-tls-verify: true}}\n\
                 users:\n- name: admin\n  user: {{token: {token}}}\ncontexts:\n- name: envtest\n  context: {{cluster: envtest, user: admin, namespace: default}}\n\
                 current-context: envtest\n"
            ),
        )
        .unwrap();
        let mut c = Cluster {
            procs,
            kubeconfig,
            _dir: dir,
        };
        let deadline = Instant::now() + Duration::from_secs(90);
        loop {
            let o = c.kubectl_output(&["get", "--raw", "/readyz"], None);
            if o.status.success() {
                break;
            }
            let log = std::fs::read_to_string(d.join("kube-apiserver.log")).unwrap_or_default();
            if Instant::now() > deadline
                || c.procs
                    .iter_mut()
                    .any(|p| !matches!(p.try_wait(), Ok(None)))
            {
                let tail: Vec<&str> = log.lines().rev().take(20).collect();
                panic!(
                    "kube-apiserver exited or not ready within 90 s; its log, last lines first:\n{}",
                    tail.join("\n")
                );
            }
            std::thread::sleep(Duration::from_millis(250));
        }
        let crds = Path::new(env!("CARGO_MANIFEST_DIR")).join("crds");
        c.kubectl(
            &["apply", "--server-side", "-f", crds.to_str().unwrap()],
            None,
        );
        c.kubectl(
            &[
                "wait",
                "--for=condition=Established",
                "crd",
                "--all",
                "--timeout=60s",
            ],
            None,
        );
        let version = c.kubectl(&["version", "-o", "json"], None);
        let v: Value = serde_json::from_str(&version).unwrap_or(Value::Null);
        eprintln!(
            "kube: running against kube-apiserver {} from {} on {}",
            v["serverVersion"]["gitVersion"].as_str().unwrap_or("?"),
            assets.display(),
            etcd.display()
        );
        c
    }

    /// A real kube-apiserver (on etcd), not kmock.
    pub(crate) fn is_real(&self) -> bool {
        self.procs.len() > 1
    }

    /// tink v0.12's Workflow CRD in place of the current one, as a cluster
    /// that still runs tink v0.12 (its `STATE_*` status, `worker`).
    pub(crate) fn install_v012_workflow_crd(&self) {
        let crd =
            Path::new(env!("CARGO_MANIFEST_DIR")).join("crds/v0.12/tinkerbell.org_workflows.yaml");
        let crd = crd.to_str().unwrap();
        self.kubectl(
            &["apply", "--server-side", "--force-conflicts", "-f", crd],
            None,
        );
    }

    /// A merge patch of `kind/name`'s status, as a controller writes it.
    pub(crate) fn patch_status(&self, kind: &str, name: &str, patch: &str) -> std::process::Output {
        let args = [
            "patch",
            kind,
            name,
            "--subresource",
            "status",
            "--type",
            "merge",
            "-p",
            patch,
        ];
        self.kubectl_output(&args, None)
    }

    pub(crate) fn kubectl(&self, args: &[&str], stdin: Option<&str>) -> String {
        let o = self.kubectl_output(args, stdin);
        assert!(
            o.status.success(),
            "kubectl {args:?}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        String::from_utf8_lossy(&o.stdout).into_owned()
    }

    pub(crate) fn kubectl_output(
        &self,
        args: &[&str],
        stdin: Option<&str>,
    ) -> std::process::Output {
        let mut c = Command::new("kubectl");
        c.arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .args(["--request-timeout", "10s"])
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        c.stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        });
        let mut child = c.spawn().expect("kubectl");
        if let Some(s) = stdin {
            use std::io::Write;
            child.stdin.take().unwrap().write_all(s.as_bytes()).unwrap();
        }
        child.wait_with_output().unwrap()
    }

    /// Stop the API server (etcd, if any, goes with it).
    fn stop(&mut self) {
        while let Some(mut p) = self.procs.pop() {
            let _ = p.kill();
            let _ = p.wait();
        }
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        self.stop();
    }
}

pub(crate) fn kube_daemon(c: &Cluster) -> Daemon {
    kube_daemon_with(c, "")
}

/// With more `[kube]` keys (`extra`: TOML lines).
pub(crate) fn kube_daemon_with(c: &Cluster, extra: &str) -> Daemon {
    kube_daemon_at(&c.kubeconfig, extra)
}

/// Through the kubeconfig `kubeconfig` (another way to the same cluster).
pub(crate) fn kube_daemon_at(kubeconfig: &Path, extra: &str) -> Daemon {
    let boot = format!(
        "{NO_BOOT}[kube]\nenabled = true\nkubeconfig = {:?}\n{extra}",
        kubeconfig
    );
    Daemon::start_setup(Setup {
        boot: &boot,
        ..Setup::default()
    })
}

/// Poll `f` every 20 ms until it is true, for at most `secs`.
pub(crate) fn until(secs: u64, what: &str, d: &Daemon, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(secs);
    while Instant::now() < deadline {
        if f() {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    panic!("{what}: not within {secs}s; daemon log:\n{}", d.log());
}

fn script_status(d: &Daemon, mac: &str) -> String {
    d.http_status(&d.url(&format!("/ipxe/script/{mac}/auto.ipxe")))
}

fn names(d: &Daemon) -> Vec<String> {
    let mut v: Vec<String> = d
        .all_hardware()
        .iter()
        .map(|h| h["metadata"]["name"].as_str().unwrap_or("").to_string())
        .collect();
    v.sort();
    v
}

fn events_of(d: &Daemon, name: &str) -> Vec<Value> {
    let (code, v) = d.api(
        "GET",
        &format!("/api/v1/events?namespace=default&name={name}&limit=200"),
        None,
    );
    assert_eq!(code, 200, "{v}");
    v["items"].as_array().cloned().unwrap_or_default()
}

pub(crate) const M1: &str = "52:54:00:6b:00:01";
const M2: &str = "52:54:00:6b:00:02";
const M3: &str = "52:54:00:6b:00:03";

#[test]
fn the_mirror_serves_the_clusters_hardware_and_survives_its_absence() {
    let mut cluster = Cluster::start();
    cluster.kubectl(&["create", "-f", "-"], Some(&hw_doc("m1", M1, "10.6.0.1")));
    cluster.kubectl(&["create", "-f", "-"], Some(&hw_doc("m2", M2, "10.6.0.2")));
    let mut d = kube_daemon(&cluster);

    // Listed, stored and served.
    until(10, "the first list", &d, || names(&d) == ["m1", "m2"]);
    assert_eq!(script_status(&d, M1), "200");
    // Current once every kind is listed (Hardware may come first).
    until(10, "the whole mirror current", &d, || {
        healthz(&d).contains("kube: current")
    });
    until(5, "the gauge", &d, || {
        d.metric("tinkerbox_kube_connected ") == 1.0
    });

    // tinkerbox's own writes of a mirrored kind are refused, naming kubectl.
    let (code, body) = d.api(
        "POST",
        "/api/v1/hardware",
        Some(("application/yaml", hw_doc("m9", M3, "10.6.0.9").as_bytes())),
    );
    assert_eq!(code, 403, "{body}");
    assert!(
        body["error"].as_str().unwrap().contains("kubectl"),
        "{body}"
    );
    let (code, _) = d.api("DELETE", "/api/v1/hardware/m1", None);
    assert_eq!(code, 403);

    // A change in the cluster is served: m1 moves to a new MAC.
    let patch = format!(
        r#"{{"spec":{{"interfaces":[{{"dhcp":{{"mac":"{M3}","ip":{{"address":"10.6.0.1","netmask":"255.255.255.0"}}}},"netboot":{{"allowPXE":true}}}}]}}}}"#
    );
    cluster.kubectl(
        &["patch", "hardware", "m1", "--type", "merge", "-p", &patch],
        None,
    );
    until(5, "m1's new MAC", &d, || script_status(&d, M3) == "200");
    assert_eq!(script_status(&d, M1), "404");

    // Two Hardware claiming one MAC: neither is answered, and both hear of it.
    cluster.kubectl(&["create", "-f", "-"], Some(&hw_doc("m3", M2, "10.6.0.3")));
    until(5, "the conflict", &d, || script_status(&d, M2) == "404");
    until(5, "the conflict event", &d, || {
        events_of(&d, "m3").iter().any(|e| {
            e["kind"] == "hardware.conflict"
                && e["message"].as_str().unwrap_or("").contains("default/m2")
        })
    });
    cluster.kubectl(&["delete", "hardware", "m3"], None);
    until(5, "the conflict's end", &d, || {
        script_status(&d, M2) == "200"
    });

    // The API server goes away: the mirror keeps serving, and says so.
    cluster.stop();
    until(15, "the stale report", &d, || {
        String::from_utf8_lossy(&d.curl(&["-s", &d.url("/healthz")]).stdout).contains("kube: stale")
    });
    assert_eq!(script_status(&d, M3), "200");
    assert_eq!(d.metric("tinkerbox_kube_connected "), 0.0);

    // Restarted without it: the last mirror is served at once.
    d.stop();
    d.spawn();
    assert_eq!(script_status(&d, M3), "200");
    let health = String::from_utf8_lossy(&d.curl(&["-s", &d.url("/healthz")]).stdout).into_owned();
    assert!(health.contains("kube: not yet listed"), "{health}");
}

#[test]
fn objects_deleted_while_disconnected_are_gone_after_the_relist() {
    let cluster = Cluster::start();
    cluster.kubectl(&["create", "-f", "-"], Some(&hw_doc("a", M1, "10.7.0.1")));
    cluster.kubectl(&["create", "-f", "-"], Some(&hw_doc("b", M2, "10.7.0.2")));
    let mut d = kube_daemon(&cluster);
    until(10, "the first list", &d, || names(&d) == ["a", "b"]);
    d.stop();
    // Changed while tinkerbox was away: no delete event will ever come.
    cluster.kubectl(&["delete", "hardware", "b"], None);
    cluster.kubectl(&["create", "-f", "-"], Some(&hw_doc("c", M3, "10.7.0.3")));
    d.spawn();
    until(10, "the relist", &d, || names(&d) == ["a", "c"]);
    assert_eq!(script_status(&d, M2), "404");
    assert_eq!(script_status(&d, M3), "200");
    until(5, "b's deletion in its events", &d, || {
        events_of(&d, "b")
            .iter()
            .any(|e| e["kind"] == "hardware.deleted")
    });
}

const TINK_AND_BMC: &str = r#"
apiVersion: tinkerbell.org/v1alpha1
kind: Template
metadata: {name: t1, namespace: default}
spec:
  data: |
    version: "0.1"
    name: t1
    global_timeout: 600
    tasks:
    - name: os
      worker: "{{.device_1}}"
      actions:
      - {name: a, image: bash, timeout: 60}
---
apiVersion: tinkerbell.org/v1alpha1
kind: Workflow
metadata: {name: w1, namespace: default}
spec:
  templateRef: t1
  hardwareRef: m1
  hardwareMap: {device_1: "52:54:00:6b:00:01"}
---
apiVersion: bmc.tinkerbell.org/v1alpha1
kind: Machine
metadata: {name: bmc1, namespace: default}
spec:
  connection: {host: 127.0.0.1, port: 623, insecureTLS: true, authSecretRef: {name: bmc1-auth, namespace: default}}
---
apiVersion: v1
kind: Secret
metadata: {name: bmc1-auth, namespace: default}
type: Opaque
data: {username: YWRtaW4=, password: cGFzcw==}
---
apiVersion: v1
kind: Secret
metadata: {name: unrelated, namespace: default}
type: Opaque
data: {token: c2VjcmV0}
---
apiVersion: bmc.tinkerbell.org/v1alpha1
kind: Job
metadata: {name: j1, namespace: default}
spec:
  machineRef: {name: bmc1, namespace: default}
  tasks:
  - powerAction: "on"
"#;

/// A cluster that still runs tink v0.12's Workflow CRD: its `STATE_*`
/// status, `worker` and `startedAt`/`seconds`, read in tinkerbox's schema.
/// The CRD is installed before anything is watched: a real API server holds
/// a status only in the installed schema (and prunes what it reads with the
/// schema it had when it read it).
#[test]
fn a_v012_workflow_status_reads_as_the_current_schema() {
    let cluster = Cluster::start();
    cluster.install_v012_workflow_crd();
    cluster.kubectl(&["create", "-f", "-"], Some(&hw_doc("m1", M1, "10.8.0.1")));
    cluster.kubectl(&["create", "-f", "-"], Some(TINK_AND_BMC));
    let old = r#"{"status":{"state":"STATE_SUCCESS","templateRending":"successful",
        "tasks":[{"name":"os","worker":"52:54:00:6b:00:01","actions":[{"name":"a","image":"bash","timeout":60,"status":"STATE_SUCCESS","startedAt":"2026-11-24T10:00:00Z","seconds":3}]}]}}"#;
    // A real server may take a moment to serve the schema just applied.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let o = cluster.patch_status("workflow", "w1", old);
        if o.status.success() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the v0.12 status was refused: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let d = kube_daemon_with(&cluster, "tink = \"external\"\nrufio = \"external\"\n");
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (_, w) = d.api("GET", "/api/v1/workflows/w1?namespace=default", None);
        let s = &w["status"];
        if s["state"] == "SUCCESS"
            && s["tasks"][0]["agentID"] == M1
            && s["tasks"][0]["actions"][0]["state"] == "SUCCESS"
            && s["tasks"][0]["actions"][0]["executionDuration"] == "3s"
        {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the v0.12 status, not within 10 s: tinkerbox has {s:#}\nthe cluster {}",
            cluster.kubectl(&["get", "workflow", "w1", "-o", "json"], None),
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Every Tinkerbell kind is mirrored, not only Hardware. With Tink and
/// Rufio external, the cluster's status is what tinkerbox shows (their
/// controllers write it), nothing runs here, and no Secret is read.
#[test]
fn templates_workflows_and_bmc_objects_are_mirrored_with_their_status() {
    let cluster = Cluster::start();
    cluster.kubectl(&["create", "-f", "-"], Some(&hw_doc("m1", M1, "10.8.0.1")));
    cluster.kubectl(&["create", "-f", "-"], Some(TINK_AND_BMC));
    let d = kube_daemon_with(&cluster, "tink = \"external\"\nrufio = \"external\"\n");
    let get = |path: &str| {
        let (code, v) = d.api("GET", path, None);
        (code, v)
    };
    // Each kind has its own watch: they arrive in any order.
    until(10, "the mirror of every kind", &d, || {
        get("/api/v1/workflows/w1?namespace=default").0 == 200
            && get("/api/v1/templates/t1?namespace=default").0 == 200
            && get("/api/v1/bmc/machines/bmc1?namespace=default").0 == 200
    });
    until(10, "the job's mirror", &d, || {
        get("/api/v1/bmc/jobs/j1?namespace=default").0 == 200
    });
    // External Rufio: the job is not run here.
    std::thread::sleep(Duration::from_millis(500));
    let (_, j) = get("/api/v1/bmc/jobs/j1?namespace=default");
    assert_eq!(j["state"], "pending", "{j}");
    // Rufio (external) finishes it: tinkerbox shows the outcome.
    cluster.kubectl(
        &[
            "patch", "jobs.bmc.tinkerbell.org", "j1", "--subresource", "status", "--type", "merge",
            "-p", r#"{"status":{"conditions":[{"type":"Running","status":"True"},{"type":"Completed","status":"True"}]}}"#,
        ],
        None,
    );
    until(5, "Rufio's outcome", &d, || {
        get("/api/v1/bmc/jobs/j1?namespace=default").1["state"] == "completed"
    });

    // tink-controller (external) writes the status: tinkerbox shows it.
    let status = r#"{"status":{"state":"RUNNING","agentID":"52:54:00:6b:00:01","templateRendering":"successful",
        "tasks":[{"id":"t-1","name":"os","agentID":"52:54:00:6b:00:01","actions":[{"id":"a-1","name":"a","image":"bash","timeout":60,"state":"RUNNING"}]}]}}"#;
    let o = cluster.patch_status("workflow", "w1", status);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    until(5, "the cluster's status", &d, || {
        get("/api/v1/workflows/w1?namespace=default").1["status"]["state"] == "RUNNING"
    });
    // Local writes of any mirrored kind are refused, naming the resource.
    let tpl = "apiVersion: tinkerbell.org/v1alpha1\nkind: Template\nmetadata: {name: t9}\nspec: {data: 'name: t9'}\n";
    let (code, body) = d.api(
        "POST",
        "/api/v1/apply",
        Some(("application/yaml", tpl.as_bytes())),
    );
    assert_eq!(code, 403, "{body}");
    assert!(
        body["error"]
            .as_str()
            .unwrap()
            .contains("templates.tinkerbell.org"),
        "{body}"
    );
    let (code, _) = d.api("DELETE", "/api/v1/workflows/w1", None);
    assert_eq!(code, 403);
    // A power request is a Job made in the cluster, for Rufio to run.
    let (code, body) = d.api(
        "POST",
        "/api/v1/bmc/machines/bmc1/power",
        Some(("application/json", br#"{"action":"off"}"#)),
    );
    assert_eq!(code, 200, "{body}");
    let job = cluster_get(
        &cluster,
        "jobs.bmc.tinkerbell.org",
        body["name"].as_str().unwrap(),
    );
    assert_eq!(job["spec"]["tasks"][0]["powerAction"], "off", "{job:#}");

    // Deleted in the cluster: gone here.
    cluster.kubectl(&["delete", "workflow", "w1"], None);
    cluster.kubectl(&["delete", "template", "t1"], None);
    until(5, "the deletions", &d, || {
        get("/api/v1/workflows/w1?namespace=default").0 == 404
            && get("/api/v1/templates/t1?namespace=default").0 == 404
    });
}

/// A Redfish BMC with sushy-emulator's credentials (Secret `bmc-creds`,
/// Machine `bmc`) and Hardware `node` it drives, with `mac` and `ip`.
pub(crate) fn bmc_node_docs(bmc: &str, node: &str, host: &str, mac: &str, ip: &str) -> String {
    format!(
        r#"apiVersion: v1
kind: Secret
metadata: {{name: bmc-creds, namespace: default}}
type: Opaque
data: {{username: YWRtaW4=, password: czNjcmV0LVBhNTU=}}
---
apiVersion: bmc.tinkerbell.org/v1alpha1
kind: Machine
metadata: {{name: {bmc}, namespace: default}}
spec:
  connection:
    host: "{host}"
    insecureTLS: true
    authSecretRef: {{name: bmc-creds, namespace: default}}
    providerOptions:
      redfish: {{useBasicAuth: true}}
---
apiVersion: tinkerbell.org/v1alpha1
kind: Hardware
metadata: {{name: {node}, namespace: default}}
spec:
  bmcRef: {{apiGroup: bmc.tinkerbell.org, kind: Machine, name: {bmc}}}
  interfaces:
  - dhcp: {{mac: "{mac}", ip: {{address: {ip}, netmask: 255.255.255.0}}}}
    netboot: {{allowPXE: false}}
"#
    )
}

/// Template `template` of one task for `{{.device_1}}` with `actions`
/// (each `bash`), and Workflow `workflow` of it for Hardware `hardware`
/// whose device_1 is `mac`; `spec` adds lines to the Workflow's spec.
pub(crate) fn workflow_docs(
    template: &str,
    actions: &[&str],
    workflow: &str,
    hardware: &str,
    mac: &str,
    spec: &str,
) -> String {
    let actions: Vec<String> = actions
        .iter()
        .map(|a| format!("{{name: {a}, image: bash}}"))
        .collect();
    format!(
        r#"apiVersion: tinkerbell.org/v1alpha1
kind: Template
metadata: {{name: {template}, namespace: default}}
spec:
  data: |
    name: {template}
    tasks:
    - {{name: a, worker: "{{{{.device_1}}}}", actions: [{}]}}
---
apiVersion: tinkerbell.org/v1alpha1
kind: Workflow
metadata: {{name: {workflow}, namespace: default}}
spec:
  templateRef: {template}
  hardwareRef: {hardware}
  hardwareMap: {{device_1: "{mac}"}}
{spec}"#,
        actions.join(", ")
    )
}

/// `kubectl get KIND NAME -o json`.
pub(crate) fn cluster_get(c: &Cluster, kind: &str, name: &str) -> Value {
    serde_json::from_str(&c.kubectl(&["get", kind, name, "-o", "json"], None)).unwrap()
}

const AGENT: &str = "52:54:00:6b:00:07";

/// Tink and Rufio native: tinkerbox runs the cluster's Workflow as
/// tink-controller and Rufio would, and everything it does is written to
/// the cluster: allowPXE flipped on the Hardware, the netboot Job created
/// and run against a Redfish BMC (sushy-emulator), the Job's and the
/// Machine's status, and the Workflow's status (through the status
/// subresource) up to SUCCESS, with a worker generated from upstream's
/// .proto files running the action.
#[test]
fn native_roles_run_the_clusters_workflow_and_write_everything_there() {
    let cluster = Cluster::start();
    let sushy = crate::bmc_jobs::Sushy::start();
    let docs = format!(
        "{node}---\n{}",
        workflow_docs(
            "t1",
            &["x"],
            "wf1",
            "node-1",
            AGENT,
            "  bootOptions: {toggleAllowNetboot: true, bootMode: netboot}\n"
        ),
        node = bmc_node_docs(
            "bmc-1",
            "node-1",
            &format!("http://127.0.0.1:{}", sushy.port),
            AGENT,
            "10.9.0.11"
        )
    );
    cluster.kubectl(&["create", "-f", "-"], Some(&docs));
    let d = kube_daemon(&cluster);
    let state = || {
        cluster_get(&cluster, "workflow", "wf1")["status"]["state"]
            .as_str()
            .unwrap_or("")
            .to_string()
    };
    let allow_pxe = || {
        cluster_get(&cluster, "hardware", "node-1")["spec"]["interfaces"][0]["netboot"]["allowPXE"]
            .clone()
    };
    // PREPARING: allowPXE set in the cluster, the netboot Job made there,
    // run through the BMC, and its status written back; then PENDING.
    until(60, "PENDING in the cluster", &d, || state() == "PENDING");
    assert_eq!(allow_pxe(), true);
    let job = cluster_get(&cluster, "jobs.bmc.tinkerbell.org", "netboot-wf1");
    let conditions = job["status"]["conditions"].to_string();
    assert!(conditions.contains("Completed"), "{job:#}");
    assert!(job["status"]["completionTime"].is_string(), "{job:#}");
    // Each step a Task `<job>-task-<n>` as Rufio's job controller makes
    // them: owned by the Job, the action and connection, Completed.
    let steps = job["spec"]["tasks"].as_array().map_or(0, Vec::len);
    assert!(steps >= 2, "{job:#}");
    for n in 0..steps {
        let name = format!("netboot-wf1-task-{n}");
        let mut task = Value::Null;
        until(10, &format!("Task {name} Completed"), &d, || {
            task = serde_json::from_str(&cluster.kubectl(
                &[
                    "get",
                    "tasks.bmc.tinkerbell.org",
                    &name,
                    "-o",
                    "json",
                    "--ignore-not-found",
                ],
                None,
            ))
            .unwrap_or(Value::Null);
            task["status"]["conditions"]
                .to_string()
                .contains("Completed")
        });
        assert_eq!(task["spec"]["task"], job["spec"]["tasks"][n], "{task:#}");
        assert_eq!(
            task["spec"]["connection"]["authSecretRef"]["name"],
            "bmc-creds"
        );
        let owner = &task["metadata"]["ownerReferences"][0];
        assert_eq!(owner["kind"], "Job", "{task:#}");
        assert_eq!(owner["uid"], job["metadata"]["uid"], "{task:#}");
        assert!(task["status"]["startTime"].is_string(), "{task:#}");
        assert!(task["status"]["completionTime"].is_string(), "{task:#}");
    }
    sushy.wait_power("On");
    until(30, "the Machine's status", &d, || {
        cluster_get(&cluster, "machines.bmc.tinkerbell.org", "bmc-1")["status"]["powerState"]
            == "on"
    });

    // The worker runs the action; POST clears allowPXE in the cluster.
    let lines = crate::tink::peer(&d, &["agent", AGENT]);
    assert!(
        lines
            .iter()
            .any(|l| l["event"] == "served" && l["action"] == "x"),
        "{lines:#?}"
    );
    until(30, "SUCCESS in the cluster", &d, || state() == "SUCCESS");
    until(10, "allowPXE false in the cluster", &d, || {
        allow_pxe() == false
    });
    let w = cluster_get(&cluster, "workflow", "wf1");
    let a = &w["status"]["tasks"][0]["actions"][0];
    assert_eq!(a["state"], "SUCCESS", "{w:#}");
    assert!(a["executionStart"].is_string(), "{w:#}");
    // The Tasks were the Job's record, not Tasks run again: each power
    // action of the Job was sent once.
    let powers = job["spec"]["tasks"].as_array().map_or(0, |t| {
        t.iter().filter(|t| t.get("powerAction").is_some()).count()
    });
    let sent = events_of(&d, "node-1")
        .iter()
        .filter(|e| e["kind"] == "bmc.power")
        .count();
    assert_eq!(
        sent, powers,
        "power actions in the Job: {powers}, sent: {sent}"
    );
    // Rufio's inventory collection: the Redfish BMC's system, written to
    // the Hardware's status in the cluster (its schema keeps it).
    until(40, "the out-of-band inventory in the cluster", &d, || {
        cluster_get(&cluster, "hardware", "node-1")["status"]["attributes"]["outOfBand"]["product"]
            ["vendor"]
            == "Sushy Emulator"
    });
}

pub(crate) fn healthz(d: &Daemon) -> String {
    String::from_utf8_lossy(&d.curl(&["-s", &d.url("/healthz")]).stdout).into_owned()
}

/// Two instances against one cluster: both mirror and serve, one leads
/// (the Lease), the other takes the status its leader writes; when the
/// leader stops, the other takes over from where it was, and an action
/// already run is not served again.
#[test]
fn two_instances_one_leader_and_failover_without_running_anything_twice() {
    let cluster = Cluster::start();
    let docs = format!(
        r#"{hw}---
apiVersion: tinkerbell.org/v1alpha1
kind: Template
metadata: {{name: t2, namespace: default}}
spec:
  data: |
    name: t2
    tasks:
    - {{name: a, worker: "{{{{.device_1}}}}", actions: [{{name: x, image: bash}}, {{name: y, image: bash}}]}}
---
apiVersion: tinkerbell.org/v1alpha1
kind: Workflow
metadata: {{name: wf2, namespace: default}}
spec:
  templateRef: t2
  hardwareRef: m1
  hardwareMap: {{device_1: "{M1}"}}
"#,
        hw = hw_doc("m1", M1, "10.10.0.1")
    );
    let mut a = kube_daemon(&cluster);
    until(15, "a leads", &a, || healthz(&a).contains("kube: leader"));
    let b = kube_daemon(&cluster);
    until(10, "b's mirror", &b, || {
        healthz(&b).contains("kube: current")
    });
    assert!(healthz(&b).contains("kube: follower"), "{}", healthz(&b));
    let lease = cluster_get(&cluster, "lease", "tinkerbox");
    let holder = lease["spec"]["holderIdentity"]
        .as_str()
        .unwrap_or("")
        .to_string();
    assert!(!holder.is_empty(), "{lease:#}");

    // The leader renders and runs; the follower shows the leader's status.
    cluster.kubectl(&["create", "-f", "-"], Some(&docs));
    let state = || {
        cluster_get(&cluster, "workflow", "wf2")["status"]["state"]
            .as_str()
            .unwrap_or("")
            .to_string()
    };
    until(15, "PENDING in the cluster", &a, || state() == "PENDING");
    // The worker runs x on the leader, then dies while running y.
    let first = crate::tink::peer(&a, &["agent", M1, "--hang", "y"]);
    let served = |lines: &[Value]| -> Vec<String> {
        lines
            .iter()
            .filter(|l| l["event"] == "served")
            .map(|l| l["action"].as_str().unwrap_or("").to_string())
            .collect()
    };
    assert_eq!(served(&first), ["x", "y"], "{first:#?}");
    until(10, "y RUNNING in the follower's copy", &b, || {
        let (_, w) = b.api("GET", "/api/v1/workflows/wf2?namespace=default", None);
        w["status"]["tasks"][0]["actions"][1]["state"] == "RUNNING"
    });

    // The leader stops: it releases the Lease and the follower leads.
    a.stop();
    until(15, "b leads", &b, || healthz(&b).contains("kube: leader"));
    let lease = cluster_get(&cluster, "lease", "tinkerbox");
    assert_ne!(lease["spec"]["holderIdentity"], holder, "{lease:#}");
    // The worker comes back to the new leader: y again, never x.
    let second = crate::tink::peer(&b, &["agent", M1]);
    assert_eq!(served(&second), ["y"], "{second:#?}");
    until(15, "SUCCESS in the cluster", &b, || state() == "SUCCESS");
}

/// Zero touch against the cluster: a WorkflowRuleSet there enrolls an
/// agent nobody entered; its Hardware and its Workflow are made in the
/// cluster (where `kubectl` sees them), the Workflow runs, and its status
/// and the Hardware's netboot switch are written there.
#[test]
fn an_unknown_agent_is_discovered_and_enrolled_in_the_cluster() {
    const NEW: &str = "52:54:00:77:00:01";
    let cluster = Cluster::start();
    let template = workflow_docs(
        "t-zero",
        &["x"],
        "unused",
        "unused",
        "02:00:00:00:00:99",
        "",
    )
    .split("---")
    .next()
    .unwrap()
    .to_string();
    cluster.kubectl(&["create", "-f", "-"], Some(&template));
    let d = kube_daemon_with(&cluster, "[discovery]\nenabled = true\nenroll = true\n");
    // No ruleset yet: discovered, not enrolled.
    let lines = crate::tink::peer(&d, &["agent", NEW, "--polls", "1"]);
    assert_eq!(lines[0]["code"], "NOT_FOUND", "{lines:#?}");
    // A ruleset made in the cluster counts at the next poll.
    let rules = "apiVersion: tinkerbell.org/v1alpha1\nkind: WorkflowRuleSet\nmetadata: {name: any-intel, namespace: default}\n\
         spec:\n  rules: ['{\"cpu\": {\"processors\": {\"vendor\": [\"GenuineIntel\"]}}}']\n  workflow:\n    template: {ref: t-zero, agentValue: device_1}\n";
    cluster.kubectl(&["create", "-f", "-"], Some(rules));
    until(30, "the ruleset mirrored", &d, || {
        d.cli_ok(&["get", "wrs"]).contains("any-intel")
    });
    let lines = crate::tink::peer(&d, &["agent", NEW, "--polls", "100"]);
    assert!(
        lines
            .iter()
            .any(|l| l["event"] == "served" && l["action"] == "x"),
        "{lines:#?}\n{}",
        d.log()
    );
    let hw = cluster_get(&cluster, "hardware", "discovery-52-54-00-77-00-01");
    assert_eq!(
        hw["metadata"]["labels"]["tinkerbell.org/auto-discovered"], "true",
        "{hw:#}"
    );
    assert_eq!(hw["spec"]["agentID"], NEW);
    let wf = || cluster_get(&cluster, "workflow", "enrollment-52-54-00-77-00-01");
    assert_eq!(wf()["metadata"]["ownerReferences"][0]["name"], "any-intel");
    assert!(wf()["metadata"]["ownerReferences"][0]["uid"].is_string());
    until(30, "SUCCESS in the cluster", &d, || {
        wf()["status"]["state"] == "SUCCESS"
    });
    until(10, "allowPXE false in the cluster", &d, || {
        cluster_get(&cluster, "hardware", "discovery-52-54-00-77-00-01")["spec"]["interfaces"][0]["netboot"]
            ["allowPXE"]
            == false
    });
}
