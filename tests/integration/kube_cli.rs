//! `tinkerbox kube install-crds` and `tinkerbox kube rbac` against an API
//! server, with kubectl as the independent reader.
//!
//! The peer is always kmock (`Cluster::kmock`, `tests/kube/kmock-server`): it stores
//! CRDs and RBAC objects but never sets a CRD's conditions, validates no
//! schema and enforces no RBAC. So these tests show what is sent and that
//! kubectl reads it as meant; not that a real API server accepts every
//! schema (it accepts upstream's, the same files), nor the permissions'
//! effect.

use crate::common::*;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

/// The CRD files shipped in the repository, in the order they are applied.
const FILES: [(&str, &str); 10] = [
    ("hardware.tinkerbell.org", "tinkerbell.org_hardware.yaml"),
    ("templates.tinkerbell.org", "tinkerbell.org_templates.yaml"),
    ("workflows.tinkerbell.org", "tinkerbell.org_workflows.yaml"),
    (
        "workflowrulesets.tinkerbell.org",
        "tinkerbell.org_workflowrulesets.yaml",
    ),
    (
        "machines.bmc.tinkerbell.org",
        "bmc.tinkerbell.org_machines.yaml",
    ),
    ("jobs.bmc.tinkerbell.org", "bmc.tinkerbell.org_jobs.yaml"),
    ("tasks.bmc.tinkerbell.org", "bmc.tinkerbell.org_tasks.yaml"),
    ("tinkerbells.tinkerbox.io", "tinkerbox.io_tinkerbells.yaml"),
    ("baremetalhosts.metal3.io", "metal3.io_baremetalhosts.yaml"),
    ("hardwaredata.metal3.io", "metal3.io_hardwaredata.yaml"),
];

fn crd_file(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("crds")
        .join(name)
}

/// kmock, as `kube.rs` starts it (stopped by PID when dropped).
use crate::kube::Cluster as Kmock;

impl Kmock {
    fn kubectl_json(&self, args: &[&str], stdin: Option<&str>) -> Value {
        serde_json::from_str(&self.kubectl(args, stdin)).unwrap()
    }

    /// `tinkerbox kube install-crds` against this server.
    fn install_crds(&self, extra: &[&str]) -> (Output, String, String) {
        let kc = self.kubeconfig.to_str().unwrap();
        tinkerbox(&[&["kube", "install-crds", "--kubeconfig", kc], extra].concat())
    }

    /// name -> resourceVersion of every CRD stored.
    fn crd_versions(&self) -> Vec<(String, String)> {
        let list = self.kubectl_json(&["get", "crd", "-o", "json"], None);
        let mut v: Vec<(String, String)> = list["items"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| {
                let m = &c["metadata"];
                (
                    m["name"].as_str().unwrap().to_string(),
                    m["resourceVersion"].as_str().unwrap().to_string(),
                )
            })
            .collect();
        v.sort();
        v
    }
}

fn kubeconfig(port: u16) -> String {
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: lab\n  cluster: {{server: \"http://127.0.0.1:{port}\"}}\n\
         users:\n- name: lab\n  user: {{}}\ncontexts:\n- name: lab\n  context: {{cluster: lab, user: lab, namespace: default}}\n\
         current-context: lab\n"
    )
}

/// The tinkerbox CLI with no config file or kubeconfig of the host's.
fn tinkerbox(args: &[&str]) -> (Output, String, String) {
    let o = Command::new(BIN)
        .args(["--config", "/dev/null"])
        .args(args)
        .env_remove("TINKERBOX_CONFIG")
        .env("KUBECONFIG", "/nonexistent/kubeconfig")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    assert!(!err.contains("panicked"), "{err}");
    (o, out, err)
}

fn lines(prefix_suffix: &str) -> Vec<String> {
    FILES
        .iter()
        .map(|(name, _)| prefix_suffix.replace("{}", name))
        .collect()
}

#[test]
fn kube_cli_install_crds_applies_upstreams_schemas_and_is_idempotent() {
    let k = Kmock::kmock();

    // kmock never sets Established: applied, a warning each, exit 0.
    let (o, out, err) = k.install_crds(&["--wait-timeout", "1s"]);
    assert!(o.status.success(), "{out}{err}");
    assert_eq!(
        out.lines().collect::<Vec<_>>(),
        lines("customresourcedefinition.apiextensions.k8s.io/{} serverside-applied"),
        "{err}"
    );
    for (name, _) in FILES {
        assert!(
            err.contains(&format!(
                "warning: customresourcedefinition.apiextensions.k8s.io/{name}: applied, but not confirmed Established within 1s"
            )),
            "{err}"
        );
    }

    // What the server stores is upstream's file as kubectl reads it.
    for (name, file) in FILES {
        let stored = k.kubectl_json(&["get", "crd", name, "-o", "json"], None);
        let path = crd_file(file);
        let local = k.kubectl_json(
            &[
                "create",
                "--dry-run=client",
                "-o",
                "json",
                "-f",
                path.to_str().unwrap(),
            ],
            None,
        );
        assert_eq!(stored["spec"], local["spec"], "{name}");
        assert_eq!(
            stored["metadata"]["annotations"], local["metadata"]["annotations"],
            "{name}"
        );
        assert_eq!(stored["metadata"]["labels"], local["metadata"]["labels"]);
    }
    let hw = k.kubectl_json(
        &["get", "crd", "hardware.tinkerbell.org", "-o", "json"],
        None,
    );
    assert!(
        hw["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
            ["interfaces"]
            .is_object()
    );

    // The server sets Established (as a real one would): the next run
    // waits for it and says so; applying the same again changes nothing.
    let before = k.crd_versions();
    assert_eq!(before.len(), FILES.len());
    for (name, _) in FILES {
        k.kubectl(
            &[
                "patch",
                "crd",
                name,
                "--subresource=status",
                "--type=merge",
                "-p",
                r#"{"status":{"conditions":[{"type":"NamesAccepted","status":"True","reason":"NoConflicts","message":"no conflicts found"},{"type":"Established","status":"True","reason":"InitialNamesAccepted","message":"the initial names have been accepted"}]}}"#,
            ],
            None,
        );
    }
    let established = k.crd_versions();
    let t = Instant::now();
    let (o, out, err) = k.install_crds(&[]);
    assert!(o.status.success(), "{out}{err}");
    assert!(t.elapsed() < Duration::from_secs(10), "no wait needed");
    let mut want = lines("customresourcedefinition.apiextensions.k8s.io/{} serverside-applied");
    want.extend(lines(
        "customresourcedefinition.apiextensions.k8s.io/{} condition met",
    ));
    assert_eq!(out.lines().collect::<Vec<_>>(), want, "{err}");
    assert_eq!(err, "");
    assert_eq!(
        k.crd_versions(),
        established,
        "a no-op apply writes nothing"
    );
    assert_ne!(before, established);

    // A CRD whose names the server rejected: an error naming it.
    k.kubectl(
        &[
            "patch",
            "crd",
            "templates.tinkerbell.org",
            "--subresource=status",
            "--type=merge",
            "-p",
            r#"{"status":{"conditions":[{"type":"NamesAccepted","status":"False","reason":"ShortNamesConflict","message":"\"tpl\" is already in use"},{"type":"Established","status":"False"}]}}"#,
        ],
        None,
    );
    let (o, out, err) = k.install_crds(&[]);
    assert!(!o.status.success(), "{out}{err}");
    assert!(
        err.contains("templates.tinkerbell.org: names not accepted: \"tpl\" is already in use"),
        "{err}"
    );
    assert!(
        err.contains("error: names not accepted: templates.tinkerbell.org"),
        "{err}"
    );
    assert_eq!(out.matches("serverside-applied").count(), FILES.len());
    assert_eq!(out.matches("condition met").count(), FILES.len() - 1);
}

#[test]
fn kube_cli_install_crds_dry_run_prints_the_files_without_a_cluster() {
    let (o, out, err) = tinkerbox(&["kube", "install-crds", "--dry-run"]);
    assert!(o.status.success(), "{err}");
    let want: String = FILES
        .iter()
        .map(|(_, f)| std::fs::read_to_string(crd_file(f)).unwrap())
        .collect();
    assert_eq!(out, want);
    // The same files as the compatibility corpus's upstream copies (all
    // but tinkerbox's own).
    for (_, f) in FILES.iter().filter(|(n, _)| !n.ends_with(".tinkerbox.io")) {
        assert_eq!(
            std::fs::read_to_string(crd_file(f)).unwrap(),
            std::fs::read_to_string(compat_dir().join(format!("crd-{f}"))).unwrap(),
            "{f}"
        );
    }
}

#[test]
fn kube_cli_install_crds_fails_cleanly_without_a_server() {
    let dir = tempfile::tempdir().unwrap();

    // Nothing listens: refused at once, nothing applied, exit 1.
    let port = free_port();
    let kc = write_file(dir.path(), "refused", &kubeconfig(port));
    let (o, out, err) = tinkerbox(&["kube", "install-crds", "--kubeconfig", kc.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(1), "{out}{err}");
    assert_eq!(out, "");
    assert!(
        err.starts_with(
            "error: customresourcedefinition.apiextensions.k8s.io/hardware.tinkerbell.org: "
        ),
        "{err}"
    );
    assert!(err.contains("(nothing applied)"), "{err}");

    // A server that takes the connection and never answers: bounded.
    let port = free_port();
    let _silent = std::net::TcpListener::bind(("127.0.0.1", port)).unwrap();
    let kc = write_file(dir.path(), "silent", &kubeconfig(port));
    let t = Instant::now();
    let (o, _, err) = tinkerbox(&["kube", "install-crds", "--kubeconfig", kc.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(
        err.contains("no answer from the API server within 20s"),
        "{err}"
    );
    assert!(t.elapsed() < Duration::from_secs(40), "{:?}", t.elapsed());

    // A kubeconfig that is not there.
    let (o, _, err) = tinkerbox(&["kube", "install-crds", "--kubeconfig", "/nonexistent/kc"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(err.contains("/nonexistent/kc"), "{err}");
}

/// `tinkerbox kube rbac ARGS`, checked by kubectl, then created: the rules
/// kubectl reads are the ones printed.
fn rbac_through_kubectl(k: &Kmock, args: &[&str], kinds: [&str; 3]) -> Vec<Value> {
    let (o, yaml, err) = tinkerbox(&[&["kube", "rbac"], args].concat());
    assert!(o.status.success(), "{err}");
    let printed = yaml_values(&yaml);

    // kubectl prints one JSON object per document.
    let dry = k.kubectl(
        &["create", "--dry-run=client", "-o", "json", "-f", "-"],
        Some(&yaml),
    );
    let items: Vec<Value> = serde_json::Deserializer::from_str(&dry)
        .into_iter()
        .collect::<Result<_, _>>()
        .unwrap();
    let got: Vec<&str> = items.iter().map(|i| i["kind"].as_str().unwrap()).collect();
    assert_eq!(got, kinds);
    for (kubectl, ours) in items.iter().zip(&printed) {
        assert_eq!(kubectl["metadata"], ours["metadata"]);
        for field in ["rules", "roleRef", "subjects"] {
            assert_eq!(kubectl.get(field), ours.get(field), "{field}");
        }
    }
    let created = k.kubectl(&["create", "-f", "-"], Some(&yaml));
    assert_eq!(created.lines().count(), 3, "{created}");
    printed
}

/// Our YAML documents, read by tinkerbox's YAML library (kubectl read the
/// same text above); the comment-only head is no document.
fn yaml_values(y: &str) -> Vec<Value> {
    let docs: Vec<Value> = serde_saphyr::from_multiple(y).unwrap();
    let docs: Vec<Value> = docs.into_iter().filter(|d| !d.is_null()).collect();
    assert_eq!(docs.len(), 3, "{y}");
    docs
}

#[test]
fn kube_cli_rbac_output_is_what_kubectl_takes() {
    let k = Kmock::kmock();

    // Cluster-wide, both controllers native (the defaults).
    let d = rbac_through_kubectl(
        &k,
        &[],
        ["ServiceAccount", "ClusterRole", "ClusterRoleBinding"],
    );
    let rules =
        k.kubectl_json(&["get", "clusterrole", "tinkerbox", "-o", "json"], None)["rules"].clone();
    assert_eq!(rules, d[1]["rules"]);
    let sa = k.kubectl_json(
        &["get", "sa", "tinkerbox", "-n", "tinkerbell", "-o", "json"],
        None,
    );
    assert_eq!(sa["metadata"]["name"], "tinkerbox");

    // One namespace, both external: reads, leases and events, and what
    // the supervisor deploys Tink and Rufio with.
    let d = rbac_through_kubectl(
        &k,
        &[
            "-n",
            "lab",
            "--rufio",
            "external",
            "--tink",
            "external",
            "--service-account",
            "tb",
            "--sa-namespace",
            "infra",
        ],
        ["ServiceAccount", "Role", "RoleBinding"],
    );
    let role = k.kubectl_json(&["get", "role", "tb", "-n", "lab", "-o", "json"], None);
    assert_eq!(role["rules"], d[1]["rules"]);
    for rule in role["rules"].as_array().unwrap() {
        let writes = rule["verbs"]
            .as_array()
            .unwrap()
            .iter()
            .any(|v| !["get", "list", "watch"].contains(&v.as_str().unwrap()));
        let res = &rule["resources"];
        let supervisor = [
            "tinkerbox.io",
            "apps",
            "rbac.authorization.k8s.io",
            "apiextensions.k8s.io",
            "events.k8s.io",
        ]
        .iter()
        .any(|g| rule["apiGroups"][0] == *g)
            || res.as_array().unwrap().iter().all(|r| {
                [
                    "services",
                    "serviceaccounts",
                    "namespaces",
                    "workflows",
                    "workflows/status",
                ]
                .contains(&r.as_str().unwrap())
            });
        assert!(
            !writes
                || supervisor
                || res == &serde_json::json!(["leases"])
                || res == &serde_json::json!(["events"]),
            "{rule}"
        );
    }
    let binding = k.kubectl_json(
        &["get", "rolebinding", "tb", "-n", "lab", "-o", "json"],
        None,
    );
    assert_eq!(binding["subjects"][0]["namespace"], "infra");
    assert_eq!(binding["roleRef"]["kind"], "Role");

    // A bad name: refused, nothing printed.
    let (o, out, err) = tinkerbox(&["kube", "rbac", "--service-account", "Tinker_Box"]);
    assert_eq!(o.status.code(), Some(1));
    assert_eq!(out, "");
    assert!(err.contains("--service-account"), "{err}");
}
