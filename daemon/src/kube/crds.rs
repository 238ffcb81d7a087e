//! `tinkerbox kube install-crds`: the CustomResourceDefinitions of the
//! objects tinkerbox serves, server-side applied.
//!
//! The CRDs are upstream Tinkerbell's own files (`daemon/crds/`, see its
//! README), embedded unchanged: a cluster then enforces exactly the schemas
//! Tinkerbell's controllers and CAPT expect, and a cluster that already has
//! them from Tinkerbell's chart sees no change.
//!
//! What is pure (the list, its parsing, reading a CRD's conditions) is kept
//! apart from the calls so that it is tested without a cluster.

use super::client;
use crate::config::{Config, KubeConfig, Sources};
use anyhow::{Context, anyhow, bail};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, Patch, PatchParams};
use serde_json::Value;
use std::future::Future;
use std::io::Write;
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// The field manager of tinkerbox's server-side applies.
pub const FIELD_MANAGER: &str = "tinkerbox";

/// Every call to the API server answers within this or fails (the client
/// bounds connect and write, not the wait for the answer).
const CALL_TIMEOUT: Duration = Duration::from_secs(20);

/// How often the CRDs' conditions are read while waiting for Established.
const POLL: Duration = Duration::from_millis(500);

/// The default bound on the wait for Established: a real API server sets it
/// within a second or two of the create.
pub const DEFAULT_WAIT: Duration = Duration::from_secs(30);

/// kubectl's name for the resource, the prefix of every line printed.
const RESOURCE: &str = "customresourcedefinition.apiextensions.k8s.io";

/// The embedded files, in the order they are applied: file name, contents.
pub const FILES: [(&str, &str); 10] = [
    (
        "tinkerbell.org_hardware.yaml",
        include_str!("../../crds/tinkerbell.org_hardware.yaml"),
    ),
    (
        "tinkerbell.org_templates.yaml",
        include_str!("../../crds/tinkerbell.org_templates.yaml"),
    ),
    (
        "tinkerbell.org_workflows.yaml",
        include_str!("../../crds/tinkerbell.org_workflows.yaml"),
    ),
    (
        "tinkerbell.org_workflowrulesets.yaml",
        include_str!("../../crds/tinkerbell.org_workflowrulesets.yaml"),
    ),
    (
        "bmc.tinkerbell.org_machines.yaml",
        include_str!("../../crds/bmc.tinkerbell.org_machines.yaml"),
    ),
    (
        "bmc.tinkerbell.org_jobs.yaml",
        include_str!("../../crds/bmc.tinkerbell.org_jobs.yaml"),
    ),
    (
        "bmc.tinkerbell.org_tasks.yaml",
        include_str!("../../crds/bmc.tinkerbell.org_tasks.yaml"),
    ),
    // tinkerbox's own: the supervisor's `Tinkerbell` resource.
    (
        "tinkerbox.io_tinkerbells.yaml",
        include_str!("../../crds/tinkerbox.io_tinkerbells.yaml"),
    ),
    // Metal3's, for the BareMetalHost API tinkerbox serves.
    (
        "metal3.io_baremetalhosts.yaml",
        crate::metal3::CRD_BAREMETALHOSTS,
    ),
    (
        "metal3.io_hardwaredata.yaml",
        crate::metal3::CRD_HARDWAREDATA,
    ),
];

/// One embedded CRD.
#[derive(Debug, Clone)]
pub struct Crd {
    /// `daemon/crds/<file>`.
    pub file: &'static str,
    /// `metadata.name`, e.g. `hardware.tinkerbell.org`.
    pub name: String,
    /// The file as shipped (what `--dry-run` prints).
    pub yaml: &'static str,
    /// The file parsed: the body of the apply.
    pub doc: Value,
}

/// The embedded CRDs, parsed and checked to be CRDs named `plural.group`
/// (the API server refuses any other name).
pub fn embedded() -> anyhow::Result<Vec<Crd>> {
    FILES.iter().map(|(file, yaml)| parse(file, yaml)).collect()
}

/// One embedded file, checked to be a CRD named `plural.group`.
pub fn parse(file: &'static str, yaml: &'static str) -> anyhow::Result<Crd> {
    let doc: Value = serde_saphyr::from_str(yaml).with_context(|| format!("crds/{file}"))?;
    let s = |v: &Value| v.as_str().map(str::to_owned);
    if s(&doc["apiVersion"]).as_deref() != Some("apiextensions.k8s.io/v1")
        || s(&doc["kind"]).as_deref() != Some("CustomResourceDefinition")
    {
        bail!("crds/{file}: not an apiextensions.k8s.io/v1 CustomResourceDefinition");
    }
    let name = s(&doc["metadata"]["name"]).ok_or_else(|| anyhow!("crds/{file}: no name"))?;
    let plural = s(&doc["spec"]["names"]["plural"]).unwrap_or_default();
    let group = s(&doc["spec"]["group"]).unwrap_or_default();
    if name != format!("{plural}.{group}") {
        bail!("crds/{file}: name {name} is not spec.names.plural.spec.group");
    }
    Ok(Crd {
        file,
        name,
        yaml,
        doc,
    })
}

/// The YAML `--dry-run` prints: the files as they are, one document each.
pub fn dry_run_yaml(crds: &[Crd]) -> String {
    let mut out = String::new();
    for c in crds {
        if !c.yaml.starts_with("---") {
            out.push_str("---\n");
        }
        out.push_str(c.yaml);
        if !c.yaml.ends_with('\n') {
            out.push('\n');
        }
    }
    out
}

/// Where a CRD is, by its conditions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Readiness {
    /// Established=True: its resources are served.
    Established,
    /// NamesAccepted=False: its names clash with another CRD's; it will not
    /// be served as applied. The server's message.
    NamesRejected(String),
    /// Neither yet; the Established condition's message if there is one.
    Pending(Option<String>),
}

pub fn readiness(crd: &CustomResourceDefinition) -> Readiness {
    let conditions = crd
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_deref())
        .unwrap_or_default();
    let find = |t: &str| conditions.iter().find(|c| c.type_ == t);
    if let Some(c) = find("NamesAccepted").filter(|c| c.status == "False") {
        return Readiness::NamesRejected(c.message.clone().unwrap_or_default());
    }
    match find("Established") {
        Some(c) if c.status == "True" => Readiness::Established,
        Some(c) => Readiness::Pending(c.message.clone().filter(|m| !m.is_empty())),
        None => Readiness::Pending(None),
    }
}

/// `install-crds`'s options.
#[derive(Debug, Clone)]
pub struct Install {
    pub kube: KubeConfig,
    /// Take over fields another manager owns (kubectl's
    /// `--force-conflicts`); without it a conflict fails that CRD.
    pub force_conflicts: bool,
    /// How long to wait for Established; zero: do not wait.
    pub wait: Duration,
}

/// The cluster to talk to: `--kubeconfig`, else the config file's `[kube]`
/// section (its kubeconfig, else kube's inference). Only `[kube]` is used,
/// so a host without a config file works too.
pub fn kube_config(kubeconfig: Option<PathBuf>, sources: &Sources) -> anyhow::Result<KubeConfig> {
    match kubeconfig {
        Some(path) => Ok(KubeConfig {
            kubeconfig: Some(path),
            ..KubeConfig::default()
        }),
        None => Ok(Config::load(sources)?.kube),
    }
}

/// Why a call failed: the API server's answer, or none (unreachable,
/// timed out, TLS...), when the next call would most likely fail alike.
#[derive(Debug)]
enum CallError {
    Answered(String),
    Unreachable(String),
}

impl std::fmt::Display for CallError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CallError::Answered(m) | CallError::Unreachable(m) => f.write_str(m),
        }
    }
}

/// `f` within `limit`.
async fn bounded<T>(
    limit: Duration,
    f: impl Future<Output = Result<T, kube::Error>>,
) -> Result<T, CallError> {
    match tokio::time::timeout(limit, f).await {
        Ok(Ok(v)) => Ok(v),
        // A 2xx body that is not the object is an answer too: the write
        // may well have happened.
        Ok(Err(e @ (kube::Error::Api(_) | kube::Error::SerdeError(_)))) => {
            Err(CallError::Answered(explain(&e)))
        }
        Ok(Err(e)) => Err(CallError::Unreachable(explain(&e))),
        Err(_) => Err(CallError::Unreachable(format!(
            "no answer from the API server within {}",
            humantime::format_duration(limit)
        ))),
    }
}

/// A kube error as a person can act on it.
fn explain(e: &kube::Error) -> String {
    match e {
        kube::Error::Api(s) => {
            let hint = match s.code {
                401 => " (the credentials were not accepted)",
                403 => " (creating CRDs needs cluster-admin or equivalent rights)",
                404 => " (does the server serve apiextensions.k8s.io/v1? Kubernetes >= 1.16)",
                409 => {
                    " (fields owned by another manager: rerun with --force-conflicts to take them over)"
                }
                _ => "",
            };
            format!("{} {}: {}{hint}", s.code, s.reason, s.message)
        }
        // The causes too: "client error (Connect)" alone does not say
        // "connection refused" or which certificate was refused.
        other => {
            let mut parts = vec![other.to_string()];
            let mut source = std::error::Error::source(other);
            while let Some(e) = source {
                let s = e.to_string();
                if !parts.iter().any(|p| p.contains(&s)) {
                    parts.push(s);
                }
                source = e.source();
            }
            parts.join(": ")
        }
    }
}

/// Apply every CRD, then wait (bounded) for each to be Established.
///
/// Exit status: an error when an apply failed or the server rejected a
/// CRD's names. A CRD not confirmed Established within the wait (a server
/// that never sets the condition, such as a fake one, or a slow one) is a
/// warning on `err` only: the apply itself worked.
pub async fn install(
    opts: &Install,
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> anyhow::Result<()> {
    let crds = embedded()?;
    let client = tokio::time::timeout(CALL_TIMEOUT, client::client(&opts.kube))
        .await
        .map_err(|_| anyhow!("building the kube client: not done within {CALL_TIMEOUT:?}"))?
        .context("connecting to the cluster")?;
    let api: Api<CustomResourceDefinition> = Api::all(client);
    let mut params = PatchParams::apply(FIELD_MANAGER);
    if opts.force_conflicts {
        params = params.force();
    }

    let mut applied = vec![];
    let mut failed = vec![];
    let mut lost = false;
    for (i, crd) in crds.iter().enumerate() {
        let what = format!("{RESOURCE}/{}", crd.name);
        match bounded(
            CALL_TIMEOUT,
            api.patch(&crd.name, &params, &Patch::Apply(&crd.doc)),
        )
        .await
        {
            Ok(_) => {
                writeln!(out, "{what} serverside-applied")?;
                applied.push(crd);
            }
            Err(CallError::Answered(e)) => {
                writeln!(err, "error: {what}: {e}")?;
                failed.push(crd.name.as_str());
            }
            // No server to talk to: the others would wait and fail alike.
            Err(CallError::Unreachable(e)) if applied.is_empty() => {
                bail!("{what}: {e} (nothing applied)");
            }
            Err(CallError::Unreachable(e)) => {
                writeln!(err, "error: {what}: {e}")?;
                failed.extend(crds[i..].iter().map(|c| c.name.as_str()));
                lost = true;
                break;
            }
        }
    }

    let mut rejected = vec![];
    // The server gone mid-way: no point polling it for the wait.
    if !opts.wait.is_zero() && !applied.is_empty() && !lost {
        let deadline = Instant::now() + opts.wait;
        // The CRDs not Established yet, with why (for the warning).
        let mut pending: Vec<(&Crd, Option<String>)> =
            applied.into_iter().map(|c| (c, None)).collect();
        loop {
            let mut still = vec![];
            for (crd, _) in pending {
                let left = deadline.saturating_duration_since(Instant::now());
                let limit = CALL_TIMEOUT.min(left.max(Duration::from_secs(1)));
                let what = format!("{RESOURCE}/{}", crd.name);
                match bounded(limit, api.get(&crd.name)).await {
                    Ok(c) => match readiness(&c) {
                        Readiness::Established => writeln!(out, "{what} condition met")?,
                        Readiness::NamesRejected(m) => {
                            writeln!(err, "error: {what}: names not accepted: {m}")?;
                            rejected.push(crd.name.as_str());
                        }
                        Readiness::Pending(m) => still.push((crd, m)),
                    },
                    Err(e) => still.push((crd, Some(format!("reading it back: {e}")))),
                }
            }
            pending = still;
            let left = deadline.saturating_duration_since(Instant::now());
            if pending.is_empty() || left.is_zero() {
                break;
            }
            tokio::time::sleep(POLL.min(left)).await;
        }
        for (crd, why) in pending {
            let why = why.unwrap_or_else(|| {
                "the server set no Established condition (a real API server does within \
                 seconds; a fake one never does)"
                    .into()
            });
            writeln!(
                err,
                "warning: {RESOURCE}/{}: applied, but not confirmed Established within {}: {why}",
                crd.name,
                humantime::format_duration(opts.wait)
            )?;
        }
    }

    if !failed.is_empty() || !rejected.is_empty() {
        let mut parts = vec![];
        if !failed.is_empty() {
            parts.push(format!(
                "{} of {} CRDs not applied ({})",
                failed.len(),
                crds.len(),
                failed.join(", ")
            ));
        }
        if !rejected.is_empty() {
            parts.push(format!("names not accepted: {}", rejected.join(", ")));
        }
        bail!("{}", parts.join("; "));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_embedded_crds_are_tinkerbells_seven_the_supervisors_and_metal3s() {
        let crds = embedded().unwrap();
        let names: Vec<&str> = crds.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "hardware.tinkerbell.org",
                "templates.tinkerbell.org",
                "workflows.tinkerbell.org",
                "workflowrulesets.tinkerbell.org",
                "machines.bmc.tinkerbell.org",
                "jobs.bmc.tinkerbell.org",
                "tasks.bmc.tinkerbell.org",
                "tinkerbells.tinkerbox.io",
                "baremetalhosts.metal3.io",
                "hardwaredata.metal3.io",
            ]
        );
        for c in &crds {
            // k8s-openapi reads each as a CRD: the body is a CRD as the API
            // server would take it, with a v1alpha1 that is served and stored.
            let typed: CustomResourceDefinition =
                serde_json::from_value(c.doc.clone()).unwrap_or_else(|e| panic!("{}: {e}", c.file));
            let v = &typed.spec.versions;
            assert!(
                v.iter()
                    .any(|v| v.name == "v1alpha1" && v.served && v.storage),
                "{}",
                c.file
            );
            assert!(c.doc["spec"]["versions"][0]["schema"]["openAPIV3Schema"].is_object());
        }
        // What the mirror watches is among them.
        assert_eq!(crds[0].doc["spec"]["names"]["kind"], "Hardware");
        assert_eq!(crds[0].doc["spec"]["scope"], "Namespaced");
    }

    #[test]
    fn dry_run_prints_the_files_unchanged() {
        let crds = embedded().unwrap();
        let y = dry_run_yaml(&crds);
        for c in &crds {
            assert!(y.contains(c.yaml), "{}", c.file);
        }
        assert_eq!(y.matches("kind: CustomResourceDefinition").count(), 10);
        // Ten YAML documents, each the file's.
        let docs: Vec<Value> = serde_saphyr::from_multiple(&y).unwrap();
        assert_eq!(docs.len(), 10);
        assert_eq!(docs[7], crds[7].doc);
        // The anchors in tinkerbox's own are resolved: one schema for all
        // three components.
        let spec = &docs[7]["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
            ["properties"];
        assert_eq!(spec["rufio"], spec["tinkServer"]);
        assert!(spec["rufio"]["properties"]["replicas"].is_object());
    }

    #[test]
    fn a_file_that_is_not_a_crd_is_refused() {
        let e = parse(
            "x.yaml",
            "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\n",
        );
        assert!(e.unwrap_err().to_string().contains("not an apiextensions"));
        let e = parse(
            "x.yaml",
            "apiVersion: apiextensions.k8s.io/v1\nkind: CustomResourceDefinition\n\
             metadata: {name: x.example.org}\nspec: {group: example.org, names: {plural: y}}\n",
        );
        assert!(e.unwrap_err().to_string().contains("plural"));
        assert!(parse("x.yaml", "{{{").is_err());
    }

    fn crd_with(conditions: Value) -> CustomResourceDefinition {
        let mut doc = embedded().unwrap().remove(1).doc;
        doc["status"] = json!({"conditions": conditions});
        serde_json::from_value(doc).unwrap()
    }

    #[test]
    fn readiness_reads_the_conditions() {
        let mut none = crd_with(json!([]));
        assert_eq!(readiness(&none), Readiness::Pending(None));
        none.status = None;
        assert_eq!(readiness(&none), Readiness::Pending(None));
        let c = crd_with(json!([
            {"type": "NamesAccepted", "status": "True", "reason": "NoConflicts"},
            {"type": "Established", "status": "True", "reason": "InitialNamesAccepted"},
        ]));
        assert_eq!(readiness(&c), Readiness::Established);
        let c = crd_with(json!([
            {"type": "Established", "status": "False", "reason": "Installing",
             "message": "the initial names have not been accepted"},
        ]));
        assert_eq!(
            readiness(&c),
            Readiness::Pending(Some("the initial names have not been accepted".into()))
        );
        let c = crd_with(json!([
            {"type": "NamesAccepted", "status": "False", "reason": "ShortNamesConflict",
             "message": "\"tpl\" is already in use"},
            {"type": "Established", "status": "True"},
        ]));
        assert_eq!(
            readiness(&c),
            Readiness::NamesRejected("\"tpl\" is already in use".into())
        );
    }

    #[test]
    fn kubeconfig_flag_wins_over_the_config_file() {
        let src = Sources {
            path: Some("/nonexistent/tinkerbox.toml".into()),
            overrides: vec![],
        };
        let k = kube_config(Some("/tmp/kc".into()), &src).unwrap();
        assert_eq!(
            k.kubeconfig.as_deref(),
            Some(std::path::Path::new("/tmp/kc"))
        );
        // Without the flag the config file is read, and a missing one named
        // with --config is an error, not a silent fallback.
        assert!(kube_config(None, &src).is_err());
    }

    #[test]
    fn api_errors_say_what_to_do() {
        let status = |code: u16, reason: &str| {
            kube::Error::Api(Box::new(kube::core::Status {
                code,
                reason: reason.into(),
                message: "m".into(),
                ..Default::default()
            }))
        };
        assert!(explain(&status(409, "Conflict")).contains("--force-conflicts"));
        assert!(explain(&status(403, "Forbidden")).contains("cluster-admin"));
        assert_eq!(
            explain(&status(500, "InternalError")),
            "500 InternalError: m"
        );
    }
}
