//! `tinkerbox kube status`: what the supervisor runs, which versions, how
//! healthy, from the `Tinkerbell` resources' status (what the leader last
//! saw of the Deployments), read straight from the cluster.

use super::run::resource;
use crate::config::KubeConfig;
use anyhow::{Context, anyhow};
use kube::api::{Api, DynamicObject, ListParams};
use serde_json::Value;
use std::fmt::Write;
use std::time::Duration;

const CALL: Duration = Duration::from_secs(20);

/// Every `Tinkerbell` on the cluster, as the API server has it.
pub async fn fetch(cfg: &KubeConfig) -> anyhow::Result<Vec<Value>> {
    let client = tokio::time::timeout(CALL, crate::kube::client::client(cfg))
        .await
        .map_err(|_| anyhow!("building the kube client: not done within {CALL:?}"))?
        .context("connecting to the cluster")?;
    let api: Api<DynamicObject> = Api::all_with(client, &resource());
    let list = tokio::time::timeout(CALL, api.list(&ListParams::default()))
        .await
        .map_err(|_| anyhow!("listing tinkerbells.tinkerbox.io: no answer within {CALL:?}"))?
        .map_err(|e| match e {
            kube::Error::Api(s) if s.code == 404 => anyhow!(
                "the cluster does not serve tinkerbells.tinkerbox.io: run `tinkerbox kube install-crds`"
            ),
            e => anyhow!("listing tinkerbells.tinkerbox.io: {e}"),
        })?;
    let mut items: Vec<Value> = list
        .items
        .iter()
        .map(|o| serde_json::to_value(o).unwrap_or_default())
        .collect();
    items.sort_by_key(|o| {
        (
            o.pointer("/metadata/namespace")
                .and_then(Value::as_str)
                .map(String::from),
            o.pointer("/metadata/name")
                .and_then(Value::as_str)
                .map(String::from),
        )
    });
    Ok(items)
}

fn cond<'a>(conds: &'a Value, t: &str) -> Option<&'a Value> {
    conds.as_array()?.iter().find(|c| c["type"] == t)
}

fn s(v: &Value) -> &str {
    v.as_str().unwrap_or("")
}

/// The human view: one block per resource, a line per component.
pub fn table(items: &[Value]) -> String {
    if items.is_empty() {
        return "No Tinkerbell resources: nothing is supervised.\n".into();
    }
    let mut out = String::new();
    for o in items {
        let st = &o["status"];
        let conds = &st["conditions"];
        let name = format!(
            "{}/{}",
            s(&o["metadata"]["namespace"]),
            s(&o["metadata"]["name"])
        );
        let wanted = match s(&o["spec"]["version"]) {
            "" => "newest",
            v => v,
        };
        let running = match s(&st["version"]) {
            "" => "-",
            v => v,
        };
        let _ = writeln!(out, "Tinkerbell {name}: wanted {wanted}, running {running}");
        for t in ["Reconciled", "Available", "Migrated"] {
            if let Some(c) = cond(conds, t) {
                let _ = writeln!(
                    out,
                    "  {t}={} {}: {}",
                    s(&c["status"]),
                    s(&c["reason"]),
                    s(&c["message"])
                );
            }
        }
        if cond(conds, "Reconciled").is_none() {
            let _ = writeln!(
                out,
                "  not reconciled yet (is a tinkerbox in kube mode leading?)"
            );
        }
        if o.pointer("/metadata/deletionTimestamp").is_some() {
            let _ = writeln!(out, "  being deleted");
        }
        let _ = writeln!(
            out,
            "  gRPC for agents: {}",
            match s(&st["grpcAddress"]) {
                "" => "none yet (no spec.publicIP, no LoadBalancer address)".to_string(),
                a if st["grpcTLS"] == true => format!("{a} (TLS)"),
                a => a.to_string(),
            }
        );
        let comps = st["components"].as_array().cloned().unwrap_or_default();
        if !comps.is_empty() {
            let _ = writeln!(
                out,
                "  {:<16} {:<8} {:<11} {:<11} {:<9} IMAGE",
                "COMPONENT", "READY", "AVAILABLE", "PROGRESSING", "DEGRADED"
            );
        }
        for c in comps {
            let cs = &c["conditions"];
            let flag = |t: &str| {
                cond(cs, t)
                    .map(|c| s(&c["status"]).to_string())
                    .unwrap_or("?".into())
            };
            let _ = writeln!(
                out,
                "  {:<16} {:<8} {:<11} {:<11} {:<9} {}",
                s(&c["name"]),
                format!(
                    "{}/{}",
                    c["readyReplicas"].as_i64().unwrap_or(0),
                    c["replicas"].as_i64().unwrap_or(0)
                ),
                flag("Available"),
                flag("Progressing"),
                flag("Degraded"),
                s(&c["image"])
            );
            for t in ["Available", "Degraded"] {
                if let Some(d) = cond(cs, t).filter(|d| {
                    (t == "Available" && d["status"] == "False")
                        || (t == "Degraded" && d["status"] == "True")
                }) {
                    let _ = writeln!(out, "      {t}: {} {}", s(&d["reason"]), s(&d["message"]));
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_view_says_what_runs_and_why_not() {
        assert!(table(&[]).contains("nothing is supervised"));
        let o = json!({"metadata": {"namespace": "tink", "name": "stack"}, "spec": {},
            "status": {"version": "v0.25.0", "grpcAddress": "10.0.0.5:42113",
                "conditions": [{"type": "Reconciled", "status": "True", "reason": "Applied", "message": "17 objects"},
                    {"type": "Available", "status": "False", "reason": "ComponentsUnavailable", "message": "rufio: 0 of 1"}],
                "components": [{"name": "rufio", "image": "ghcr.io/tinkerbell/tinkerbell:v0.25.0",
                    "replicas": 1, "readyReplicas": 0,
                    "conditions": [{"type": "Available", "status": "False", "reason": "NoReplicasAvailable", "message": "0 of 1 replicas available"},
                        {"type": "Progressing", "status": "True", "reason": "RollingOut"},
                        {"type": "Degraded", "status": "False", "reason": "AsExpected"}]}]}});
        let t = table(&[o]);
        assert!(
            t.contains("Tinkerbell tink/stack: wanted newest, running v0.25.0"),
            "{t}"
        );
        assert!(
            t.contains("Available=False ComponentsUnavailable: rufio: 0 of 1"),
            "{t}"
        );
        assert!(t.contains("gRPC for agents: 10.0.0.5:42113"), "{t}");
        assert!(t.contains("rufio            0/1      False       True        False     ghcr.io/tinkerbell/tinkerbell:v0.25.0"), "{t}");
        assert!(
            t.contains("Available: NoReplicasAvailable 0 of 1 replicas available"),
            "{t}"
        );
        let fresh =
            json!({"metadata": {"namespace": "a", "name": "b"}, "spec": {"version": "v0.12.2"}});
        assert!(table(&[fresh]).contains("not reconciled yet"));
    }
}
