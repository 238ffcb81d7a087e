//! `tinkerbox bmc ...` and `tinkerbox machine netboot`: BMC documents, power,
//! boot device and jobs through the admin API.

use super::{Client, Output, Target, api_error, encode, read_input, render_table, show};
use crate::hardware;
use anyhow::{anyhow, bail};
use reqwest::Method;
use serde_json::{Value, json};
use std::time::{Duration, Instant};

pub async fn apply(t: &Target, files: &[String]) -> anyhow::Result<()> {
    let client = Client::new(t)?;
    let mut failed = 0;
    for f in files {
        let text = read_input(f)?;
        let docs = hardware::parse_located(&text).map_err(|e| anyhow!("{f}: {e}"))?;
        for (i, d) in docs.into_iter().enumerate() {
            let line = d.line;
            match client
                .call(Method::POST, "/api/v1/bmc", &[], Some(d.doc))
                .await?
            {
                (s, v) if s.is_success() => {
                    for item in v["items"].as_array().into_iter().flatten() {
                        let kind = item["kind"].as_str().unwrap_or("?").to_lowercase();
                        let group = if kind == "secret" {
                            ""
                        } else {
                            ".bmc.tinkerbell.org"
                        };
                        println!(
                            "{kind}{group}/{} {}",
                            item["name"].as_str().unwrap_or("?"),
                            item["result"].as_str().unwrap_or("?")
                        );
                    }
                }
                (s, v) => {
                    failed += 1;
                    eprintln!(
                        "error: {f}: document {} (line {line}): {}",
                        i + 1,
                        api_error(s, &v)
                    );
                }
            }
        }
    }
    if failed > 0 {
        bail!("{failed} document(s) not applied");
    }
    Ok(())
}

pub async fn get(
    t: &Target,
    name: Option<&str>,
    namespace: Option<&str>,
    selector: Option<&str>,
    out: Output,
) -> anyhow::Result<()> {
    let ns = namespace.unwrap_or(hardware::DEFAULT_NAMESPACE).to_string();
    let v = Client::new(t)?
        .selecting(selector)
        .get_one_or_list("/api/v1/bmc/machines", name, Some(ns))
        .await?;
    show(&v, name.is_some(), out, machines_table)?;
    Ok(())
}

/// Wait (bounded) for a job to finish and print its outcome; error if it failed.
async fn wait_job(client: &Client, ns: &str, name: &str, limit: Duration) -> anyhow::Result<Value> {
    let start = Instant::now();
    loop {
        let j = client
            .call_ok(
                Method::GET,
                &format!("/api/v1/bmc/jobs/{}", encode(name)),
                &[("namespace", ns.to_string())],
                None,
            )
            .await?;
        match j["state"].as_str() {
            Some("completed") => return Ok(j),
            Some("failed") => bail!(
                "job {name} failed: {}",
                j["message"].as_str().unwrap_or("no message")
            ),
            _ if start.elapsed() > limit => bail!(
                "job {name} still {} after {limit:?} (see: tinkerbox bmc job get {name})",
                j["state"].as_str().unwrap_or("?")
            ),
            _ => tokio::time::sleep(Duration::from_millis(250)).await,
        }
    }
}

async fn run_job(
    t: &Target,
    path: String,
    namespace: Option<&str>,
    body: Value,
    wait: bool,
) -> anyhow::Result<()> {
    let client = Client::new(t)?;
    let ns = namespace.unwrap_or(hardware::DEFAULT_NAMESPACE).to_string();
    let v = client
        .call_ok(
            Method::POST,
            &path,
            &[("namespace", ns.clone())],
            Some(body),
        )
        .await?;
    let name = v["name"]
        .as_str()
        .ok_or_else(|| anyhow!("no job name in the answer"))?
        .to_string();
    if !wait {
        println!("job.bmc.tinkerbell.org/{name} created");
        return Ok(());
    }
    let j = wait_job(&client, &ns, &name, Duration::from_secs(300)).await?;
    for (task, state) in j["tasks"]
        .as_array()
        .into_iter()
        .flatten()
        .zip(j["task_states"].as_array().into_iter().flatten())
    {
        let what = crate::bmc::model::Action::describe(
            &serde_json::from_value(task.clone()).unwrap_or_default(),
        );
        let via = state["protocol"]
            .as_str()
            .map(|p| format!(" via {p}"))
            .unwrap_or_default();
        let msg = state["message"]
            .as_str()
            .map(|m| format!(": {m}"))
            .unwrap_or_default();
        println!("{what}{via}{msg}");
    }
    Ok(())
}

pub async fn power(
    t: &Target,
    name: &str,
    namespace: Option<&str>,
    action: crate::bmc::PowerAction,
    wait: bool,
) -> anyhow::Result<()> {
    let path = format!("/api/v1/bmc/machines/{}/power", encode(name));
    run_job(t, path, namespace, json!({ "action": action }), wait).await
}

pub async fn bootdev(
    t: &Target,
    name: &str,
    namespace: Option<&str>,
    device: crate::bmc::BootDevice,
    persistent: bool,
    efi: bool,
    wait: bool,
) -> anyhow::Result<()> {
    let path = format!("/api/v1/bmc/machines/{}/bootdev", encode(name));
    run_job(
        t,
        path,
        namespace,
        json!({ "device": device, "persistent": persistent, "efi": efi }),
        wait,
    )
    .await
}

/// Insert `url` into the BMC's virtual media of `kind`, or eject (`None`).
pub async fn media(
    t: &Target,
    name: &str,
    namespace: Option<&str>,
    kind: crate::bmc::model::MediaKind,
    url: Option<&str>,
    wait: bool,
) -> anyhow::Result<()> {
    let path = format!("/api/v1/bmc/machines/{}/media", encode(name));
    let body = json!({ "kind": kind, "url": url.unwrap_or("") });
    run_job(t, path, namespace, body, wait).await
}

pub async fn netboot(
    t: &Target,
    name: &str,
    namespace: Option<&str>,
    wait: bool,
) -> anyhow::Result<()> {
    let path = format!("/api/v1/hardware/{}/netboot", encode(name));
    run_job(t, path, namespace, json!({}), wait).await
}

pub async fn jobs(
    t: &Target,
    name: Option<&str>,
    namespace: Option<&str>,
    out: Output,
) -> anyhow::Result<()> {
    let ns = namespace.unwrap_or(hardware::DEFAULT_NAMESPACE).to_string();
    // Jobs are listed across namespaces.
    let v = Client::new(t)?
        .get_one_or_list("/api/v1/bmc/jobs", name, (name.is_some()).then_some(ns))
        .await?;
    show(&v, name.is_some(), out, jobs_table)?;
    Ok(())
}

fn machines_table(items: &[Value]) -> String {
    let mut rows = vec![vec![
        "NAME".to_string(),
        "HOST".into(),
        "POWER".into(),
        "CONTACTABLE".into(),
        "MESSAGE".into(),
    ]];
    for m in items {
        let cond = m.pointer("/status/conditions/0");
        rows.push(vec![
            m.pointer("/metadata/name")
                .and_then(Value::as_str)
                .unwrap_or("")
                .into(),
            m.pointer("/spec/connection/host")
                .and_then(Value::as_str)
                .unwrap_or("")
                .into(),
            m.pointer("/status/powerState")
                .and_then(Value::as_str)
                .unwrap_or("unknown")
                .into(),
            cond.and_then(|c| c["status"].as_str())
                .unwrap_or("-")
                .into(),
            cond.and_then(|c| c["message"].as_str())
                .unwrap_or("")
                .into(),
        ]);
    }
    render_table(&rows)
}

fn jobs_table(items: &[Value]) -> String {
    let mut rows = vec![vec![
        "NAME".to_string(),
        "MACHINE".into(),
        "STATE".into(),
        "TASKS".into(),
        "MESSAGE".into(),
    ]];
    for j in items {
        let states: Vec<&str> = j["task_states"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|s| s["state"].as_str())
            .collect();
        let done = states.iter().filter(|s| **s == "completed").count();
        rows.push(vec![
            j["name"].as_str().unwrap_or("").into(),
            j.pointer("/machine/name")
                .and_then(Value::as_str)
                .unwrap_or("-")
                .into(),
            j["state"].as_str().unwrap_or("").into(),
            format!("{done}/{}", states.len()),
            j["message"].as_str().unwrap_or("").into(),
        ]);
    }
    render_table(&rows)
}
