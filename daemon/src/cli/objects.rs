//! `tinkerbox get|delete|describe KIND`: every kind tinkerbox stores, as
//! kubectl shows them. Hardware and the BMC kinds reuse their own tables.

use super::{Client, Output, Target, encode, render_table, show};
use crate::hardware;
use crate::kinds::Kind;
use anyhow::bail;
use reqwest::Method;
use serde_json::Value;

pub struct GetArgs<'a> {
    pub kind: Kind,
    pub name: Option<&'a str>,
    pub namespace: Option<&'a str>,
    pub all_namespaces: bool,
    /// `-l`: a label selector for lists.
    pub selector: Option<&'a str>,
    pub output: Output,
}

pub async fn get(t: &Target, a: GetArgs<'_>) -> anyhow::Result<()> {
    let path = match a.kind {
        Kind::Hardware => {
            return super::get(
                t,
                a.name,
                a.namespace,
                a.all_namespaces,
                a.selector,
                a.output,
            )
            .await;
        }
        Kind::Machine => {
            return super::bmc::get(t, a.name, a.namespace, a.selector, a.output).await;
        }
        Kind::Job | Kind::Task if a.selector.is_some() => {
            bail!("jobs and tasks are listed by state, not by label (-l)")
        }
        Kind::Job | Kind::Task => {
            return super::bmc::jobs(t, a.name, a.namespace, a.output).await;
        }
        Kind::Secret => bail!("Secrets are write-only: tinkerbox never shows BMC credentials"),
        Kind::Template => "/api/v1/templates",
        Kind::Workflow => "/api/v1/workflows",
        Kind::WorkflowRuleSet => "/api/v1/workflowrulesets",
        Kind::BareMetalHost => "/api/v1/baremetalhosts",
        Kind::HardwareData => "/api/v1/hardwaredata",
    };
    let ns = a
        .namespace
        .unwrap_or(hardware::DEFAULT_NAMESPACE)
        .to_string();
    let ns = (a.name.is_some() || !a.all_namespaces).then_some(ns);
    let v = Client::new(t)?
        .selecting(a.selector)
        .get_one_or_list(path, a.name, ns)
        .await?;
    let wide = a.output == Output::Wide;
    let with_ns = a.all_namespaces;
    match a.kind {
        Kind::Workflow => show(&v, a.name.is_some(), a.output, |i| {
            workflow_table(i, with_ns, wide)
        }),
        Kind::WorkflowRuleSet => show(&v, a.name.is_some(), a.output, |i| {
            ruleset_table(i, with_ns)
        }),
        Kind::BareMetalHost => show(&v, a.name.is_some(), a.output, |i| {
            host_table(i, with_ns, wide, crate::clock::now_ms())
        }),
        _ => show(&v, a.name.is_some(), a.output, |i| {
            template_table(i, with_ns)
        }),
    }
}

pub async fn delete(
    t: &Target,
    kind: Kind,
    name: &str,
    namespace: Option<&str>,
) -> anyhow::Result<()> {
    let path = match kind {
        Kind::Hardware => return super::delete(t, name, namespace).await,
        Kind::Template => "/api/v1/templates",
        Kind::Workflow => "/api/v1/workflows",
        Kind::WorkflowRuleSet => "/api/v1/workflowrulesets",
        Kind::BareMetalHost => {
            let ns = namespace.unwrap_or(hardware::DEFAULT_NAMESPACE).to_string();
            Client::new(t)?
                .call_ok(
                    Method::DELETE,
                    &format!("/api/v1/baremetalhosts/{}", encode(name)),
                    &[("namespace", ns)],
                    None,
                )
                .await?;
            // As kubectl says it of an object with a finalizer: asked;
            // the host is powered off and its parts removed before it goes.
            println!("{}/{name} deleted", kind.resource());
            return Ok(());
        }
        other => bail!(
            "deleting a {} is not supported yet (apply a changed document instead)",
            other.resource()
        ),
    };
    let ns = namespace.unwrap_or(hardware::DEFAULT_NAMESPACE).to_string();
    Client::new(t)?
        .call_ok(
            Method::DELETE,
            &format!("{path}/{}", encode(name)),
            &[("namespace", ns)],
            None,
        )
        .await?;
    println!("{}/{name} deleted", kind.resource());
    Ok(())
}

fn s<'a>(v: &'a Value, p: &str) -> &'a str {
    v.pointer(p).and_then(Value::as_str).unwrap_or("")
}

fn or_dash(x: &str) -> String {
    if x.is_empty() {
        "-".into()
    } else {
        x.to_string()
    }
}

fn template_table(items: &[Value], with_ns: bool) -> String {
    let mut rows = vec![vec!["NAMESPACE".to_string(), "NAME".into()]];
    for t in items {
        rows.push(vec![
            s(t, "/metadata/namespace").into(),
            s(t, "/metadata/name").into(),
        ]);
    }
    strip_ns(&mut rows, with_ns);
    render_table(&rows)
}

/// NAME RULES TEMPLATE NAMESPACE (of the Workflows it makes) ENABLED.
fn ruleset_table(items: &[Value], with_ns: bool) -> String {
    let mut rows = vec![
        [
            "NAMESPACE",
            "NAME",
            "RULES",
            "TEMPLATE",
            "WORKFLOW-NAMESPACE",
            "DISABLED",
        ]
        .map(String::from)
        .to_vec(),
    ];
    for r in items {
        let rules = r
            .pointer("/spec/rules")
            .and_then(Value::as_array)
            .map_or(0, Vec::len);
        rows.push(vec![
            s(r, "/metadata/namespace").into(),
            s(r, "/metadata/name").into(),
            rules.to_string(),
            s(r, "/spec/workflow/template/ref").into(),
            or_dash(s(r, "/spec/workflow/namespace")),
            r.pointer("/spec/workflow/disabled")
                .and_then(Value::as_bool)
                .unwrap_or(false)
                .to_string(),
        ]);
    }
    strip_ns(&mut rows, with_ns);
    render_table(&rows)
}

/// The CRD's printer columns: NAME TEMPLATE STATE ACTION AGENT HARDWARE,
/// and with `-o wide` TASK and TEMPLATE-RENDERING.
fn workflow_table(items: &[Value], with_ns: bool, wide: bool) -> String {
    let mut head = vec!["NAMESPACE", "NAME", "TEMPLATE", "STATE"];
    if wide {
        head.push("TASK");
    }
    head.extend(["ACTION", "AGENT", "HARDWARE"]);
    if wide {
        head.push("TEMPLATE-RENDERING");
    }
    let mut rows = vec![head.into_iter().map(String::from).collect::<Vec<_>>()];
    for w in items {
        let mut r = vec![
            s(w, "/metadata/namespace").to_string(),
            s(w, "/metadata/name").into(),
            or_dash(s(w, "/spec/templateRef")),
            or_dash(s(w, "/status/state")),
        ];
        if wide {
            r.push(or_dash(s(w, "/status/currentState/taskName")));
        }
        r.push(or_dash(s(w, "/status/currentState/actionName")));
        r.push(or_dash(s(w, "/status/currentState/agentID")));
        r.push(or_dash(s(w, "/spec/hardwareRef")));
        if wide {
            r.push(or_dash(s(w, "/status/templateRendering")));
        }
        rows.push(r);
    }
    strip_ns(&mut rows, with_ns);
    render_table(&rows)
}

/// kubectl's AGE: the largest unit or two (`45s`, `5m10s`, `3h`, `2d`).
pub fn age(created: &str, now_ms: i64) -> String {
    let Ok(t) = humantime::parse_rfc3339_weak(created) else {
        return "<unknown>".into();
    };
    let created_ms = t
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0);
    let s = (now_ms - created_ms).max(0) / 1000;
    match s {
        0..120 => format!("{s}s"),
        120..600 => format!("{}m{}s", s / 60, s % 60),
        600..10800 => format!("{}m", s / 60),
        10800..172800 => format!("{}h", s / 3600),
        _ => format!("{}d", s / 86400),
    }
}

/// BMO's printer columns: NAME STATE CONSUMER ONLINE ERROR AGE, and with
/// `-o wide` STATUS and BMC (where the CRD puts them).
fn host_table(items: &[Value], with_ns: bool, wide: bool, now_ms: i64) -> String {
    let mut head = vec!["NAMESPACE", "NAME"];
    if wide {
        head.push("STATUS");
    }
    head.extend(["STATE", "CONSUMER"]);
    if wide {
        head.push("BMC");
    }
    head.extend(["ONLINE", "ERROR", "AGE"]);
    let mut rows = vec![head.into_iter().map(String::from).collect::<Vec<_>>()];
    for h in items {
        let c = crate::metal3::model::row(h);
        let mut r = vec![
            s(h, "/metadata/namespace").to_string(),
            s(h, "/metadata/name").into(),
        ];
        if wide {
            r.push(c.status);
        }
        r.extend([c.state, c.consumer]);
        if wide {
            r.push(c.bmc);
        }
        r.extend([
            c.online,
            c.error,
            age(s(h, "/metadata/creationTimestamp"), now_ms),
        ]);
        rows.push(r);
    }
    strip_ns(&mut rows, with_ns);
    render_table(&rows)
}

fn strip_ns(rows: &mut [Vec<String>], with_ns: bool) {
    if !with_ns {
        for r in rows.iter_mut() {
            r.remove(0);
        }
    }
}

/// `describe workflow NAME`: what `kubectl describe` shows, arranged for a
/// person: the spec, the state, each task with its actions (state,
/// start, duration, message) and the conditions.
pub async fn describe(t: &Target, name: &str, namespace: Option<&str>) -> anyhow::Result<()> {
    let ns = namespace.unwrap_or(hardware::DEFAULT_NAMESPACE).to_string();
    let v = Client::new(t)?
        .get_one_or_list("/api/v1/workflows", Some(name), Some(ns))
        .await?;
    print!("{}", describe_text(&v));
    Ok(())
}

/// `describe bmh NAME`: the host's spec in brief, its state and error,
/// its operations' times, what inspection found, and its parts.
pub async fn describe_host(t: &Target, name: &str, namespace: Option<&str>) -> anyhow::Result<()> {
    let ns = namespace.unwrap_or(hardware::DEFAULT_NAMESPACE).to_string();
    let v = Client::new(t)?
        .get_one_or_list("/api/v1/baremetalhosts", Some(name), Some(ns))
        .await?;
    print!("{}", describe_host_text(&v));
    Ok(())
}

pub fn describe_host_text(h: &Value) -> String {
    let mut out = String::new();
    let mut line = |k: &str, v: &str| out.push_str(&format!("{k:<24}{v}\n"));
    let j = |p: &str| {
        h.pointer(p)
            .map(|v| match v {
                Value::String(s) => s.clone(),
                other => other.to_string(),
            })
            .filter(|v| !v.is_empty() && v != "null")
            .unwrap_or_else(|| "-".into())
    };
    line("Name:", s(h, "/metadata/name"));
    line("Namespace:", s(h, "/metadata/namespace"));
    line("Online:", &j("/spec/online"));
    line("BMC:", &j("/spec/bmc/address"));
    line("Boot MAC:", &j("/spec/bootMACAddress"));
    line("Image:", &j("/spec/image/url"));
    line("Consumer:", &j("/spec/consumerRef/name"));
    line("State:", &j("/status/provisioning/state"));
    line("Operational Status:", &j("/status/operationalStatus"));
    line("Powered On:", &j("/status/poweredOn"));
    if !s(h, "/status/errorType").is_empty() {
        line(
            "Error:",
            &format!(
                "{}: {}",
                s(h, "/status/errorType"),
                s(h, "/status/errorMessage")
            ),
        );
    }
    line("Error Count:", &j("/status/errorCount"));
    line(
        "Provisioning Failures:",
        &j("/status/provisioningFailCount"),
    );
    line("Provisioned Image:", &j("/status/provisioning/image/url"));
    line("Last Updated:", &j("/status/lastUpdated"));
    if !s(h, "/metadata/deletionTimestamp").is_empty() {
        line("Deleting Since:", s(h, "/metadata/deletionTimestamp"));
    }
    let mut rows = vec![vec![
        "  OPERATION".to_string(),
        "START".into(),
        "END".into(),
    ]];
    for op in ["register", "inspect", "provision", "deprovision"] {
        let start = s(h, &format!("/status/operationHistory/{op}/start"));
        if start.is_empty() {
            continue;
        }
        rows.push(vec![
            format!("  {op}"),
            start.into(),
            or_dash(s(h, &format!("/status/operationHistory/{op}/end"))),
        ]);
    }
    if rows.len() > 1 {
        out.push_str("Operations:\n");
        out.push_str(&render_table(&rows));
    }
    if let Some(hw) = h.pointer("/status/hardware") {
        out.push_str("Hardware:\n");
        let f = |p: &str| {
            hw.pointer(p)
                .map(|v| {
                    v.as_str()
                        .map(String::from)
                        .unwrap_or_else(|| v.to_string())
                })
                .unwrap_or_default()
        };
        out.push_str(&format!(
            "  {} {} (serial {})\n  CPU: {} x {} {}\n  RAM: {} MiB\n",
            f("/systemVendor/manufacturer"),
            f("/systemVendor/productName"),
            f("/systemVendor/serialNumber"),
            f("/cpu/count"),
            f("/cpu/arch"),
            f("/cpu/model"),
            f("/ramMebibytes"),
        ));
        for d in hw
            .get("storage")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            out.push_str(&format!(
                "  disk {} {} bytes {} {}\n",
                s(d, "/name"),
                d.get("sizeBytes").map(Value::to_string).unwrap_or_default(),
                s(d, "/type"),
                s(d, "/model"),
            ));
        }
        for n in hw
            .get("nics")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            out.push_str(&format!(
                "  nic {} {} {}{}\n",
                s(n, "/name"),
                s(n, "/mac"),
                s(n, "/ip"),
                if n.get("pxe") == Some(&Value::Bool(true)) {
                    " (boot)"
                } else {
                    ""
                },
            ));
        }
    }
    let name = s(h, "/metadata/name");
    out.push_str(&format!(
        "Parts:\n  Hardware {name}, BMC Machine {name}, Workflows {name}-inspect, {name}-provision, {name}-deprovision\n"
    ));
    out
}

pub fn describe_text(w: &Value) -> String {
    let mut out = String::new();
    let mut line = |k: &str, v: &str| out.push_str(&format!("{k:<20}{v}\n"));
    line("Name:", s(w, "/metadata/name"));
    line("Namespace:", s(w, "/metadata/namespace"));
    line("Template:", &or_dash(s(w, "/spec/templateRef")));
    line("Hardware:", &or_dash(s(w, "/spec/hardwareRef")));
    if let Some(m) = w.pointer("/spec/hardwareMap").and_then(Value::as_object) {
        let pairs: Vec<String> = m
            .iter()
            .map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or("")))
            .collect();
        line("Hardware Map:", &pairs.join(", "));
    }
    if let Some(b) = w
        .pointer("/spec/bootOptions")
        .filter(|b| b.as_object().is_some_and(|o| !o.is_empty()))
    {
        line("Boot Options:", &b.to_string());
    }
    line("State:", &or_dash(s(w, "/status/state")));
    line("Agent:", &or_dash(s(w, "/status/agentID")));
    line(
        "Template Rendering:",
        &or_dash(s(w, "/status/templateRendering")),
    );
    if let Some(g) = w.pointer("/status/globalTimeout").and_then(Value::as_i64) {
        line("Global Timeout:", &format!("{g}s"));
    }
    if !s(w, "/status/globalExecutionStop").is_empty() {
        line("Must Finish By:", s(w, "/status/globalExecutionStop"));
    }
    let tasks = w
        .pointer("/status/tasks")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    if !tasks.is_empty() {
        out.push_str("Tasks:\n");
    }
    for t in &tasks {
        out.push_str(&format!(
            "  {} (agent {}):\n",
            s(t, "/name"),
            s(t, "/agentID")
        ));
        let mut rows = vec![vec![
            "    ACTION".to_string(),
            "STATE".into(),
            "STARTED".into(),
            "DURATION".into(),
            "MESSAGE".into(),
        ]];
        for a in t
            .get("actions")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            rows.push(vec![
                format!("    {}", s(a, "/name")),
                or_dash(s(a, "/state")),
                or_dash(s(a, "/executionStart")),
                or_dash(s(a, "/executionDuration")),
                or_dash(s(a, "/message")),
            ]);
        }
        out.push_str(&render_table(&rows));
    }
    let conditions = w
        .pointer("/status/conditions")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    if !conditions.is_empty() {
        out.push_str("Conditions:\n");
        let mut rows = vec![vec![
            "  TYPE".to_string(),
            "STATUS".into(),
            "REASON".into(),
            "TIME".into(),
            "MESSAGE".into(),
        ]];
        for c in &conditions {
            rows.push(vec![
                format!("  {}", s(c, "/type")),
                or_dash(s(c, "/status")),
                or_dash(s(c, "/reason")),
                or_dash(s(c, "/time")),
                or_dash(s(c, "/message")),
            ]);
        }
        out.push_str(&render_table(&rows));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn describe_shows_tasks_actions_and_conditions() {
        let w = json!({"metadata": {"name": "wf1", "namespace": "default"},
            "spec": {"templateRef": "debian", "hardwareRef": "sm01", "hardwareMap": {"device_1": "3c:ec"}},
            "status": {"state": "RUNNING", "agentID": "3c:ec", "templateRendering": "successful", "globalTimeout": 1800,
                "tasks": [{"name": "os-installation", "agentID": "3c:ec", "actions": [
                    {"name": "stream", "state": "SUCCESS", "executionStart": "2026-11-24T01:00:00Z", "executionDuration": "41s"},
                    {"name": "kexec", "state": "PENDING"}]}],
                "conditions": [{"type": "TemplateRenderedSuccess", "status": "True", "reason": "Complete", "message": "template rendered successfully"}]}});
        let d = describe_text(&w);
        for want in [
            "wf1",
            "debian",
            "device_1=3c:ec",
            "RUNNING",
            "1800s",
            "os-installation (agent 3c:ec)",
            "stream",
            "SUCCESS",
            "41s",
            "kexec",
            "TemplateRenderedSuccess",
            "template rendered successfully",
        ] {
            assert!(d.contains(want), "{want} missing in:\n{d}");
        }
        let table = workflow_table(std::slice::from_ref(&w), false, true);
        assert!(table.starts_with("NAME"), "{table}");
        assert!(
            table.contains("TEMPLATE-RENDERING") && table.contains("successful"),
            "{table}"
        );
    }
}
