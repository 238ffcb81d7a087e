//! The client side of the CLI: `hardware apply|get|delete` and `events` talk
//! to the admin API. The server and token are found from, in order: the
//! `--server`/`--token` flags, `TINKERBOX_SERVER`/`TINKERBOX_TOKEN`, then the
//! config file (`api.listen`, `state_dir/api-token`).

pub mod bmc;
pub mod metal3;
pub mod objects;

use crate::config::{Config, Sources};
use crate::events::EventRow;
use crate::hardware::{self, Mac};
use crate::kinds::{self, Kind};
use anyhow::{Context, anyhow, bail};
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};
use std::io::Read;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

#[derive(Debug, Clone, Default)]
pub struct Target {
    pub server: Option<String>,
    pub token: Option<String>,
    pub cacert: Option<PathBuf>,
    pub config: Sources,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Output {
    Table,
    /// A table with more columns, where the kind has them (workflows).
    Wide,
    Json,
    Yaml,
}

pub struct Client {
    base: String,
    token: String,
    http: reqwest::Client,
    /// `-l`: lists keep what this label selector selects.
    selector: Option<String>,
}

/// `0.0.0.0:7081` is where the daemon listens, not where to connect.
fn connect_addr(listen: SocketAddr) -> SocketAddr {
    match listen.ip() {
        IpAddr::V4(ip) if ip.is_unspecified() => {
            SocketAddr::new(Ipv4Addr::LOCALHOST.into(), listen.port())
        }
        IpAddr::V6(ip) if ip.is_unspecified() => {
            SocketAddr::new(Ipv6Addr::LOCALHOST.into(), listen.port())
        }
        _ => listen,
    }
}

impl Client {
    pub fn new(t: &Target) -> anyhow::Result<Client> {
        let mut config: Option<Config> = None;
        let mut load_config = || -> anyhow::Result<Config> {
            if let Some(c) = &config {
                return Ok(c.clone());
            }
            let c = Config::load(&t.config)?;
            config = Some(c.clone());
            Ok(c)
        };
        let mut cacert = t.cacert.clone();
        let base = match &t.server {
            Some(s) => s.trim_end_matches('/').to_string(),
            None => {
                let c = load_config()?;
                let scheme = if c.api.tls_cert.is_some() {
                    "https"
                } else {
                    "http"
                };
                if cacert.is_none() {
                    cacert = c.api.tls_cert.clone();
                }
                format!("{scheme}://{}", connect_addr(c.api.listen))
            }
        };
        let token = match &t.token {
            Some(t) => t.trim().to_string(),
            None => {
                let path = load_config()?.token_path();
                std::fs::read_to_string(&path)
                    .map(|s| s.trim().to_string())
                    .map_err(|e| {
                        anyhow!(
                            "no API token: cannot read {} ({e}); pass --token or set TINKERBOX_TOKEN",
                            path.display()
                        )
                    })?
            }
        };
        let mut builder = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(5))
            .timeout(Duration::from_secs(60))
            .user_agent(concat!("tinkerbox-cli/", env!("CARGO_PKG_VERSION")));
        if let Some(path) = &cacert {
            let pem = std::fs::read(path)
                .with_context(|| format!("CA certificate {}", path.display()))?;
            let cert = reqwest::Certificate::from_pem(&pem)
                .with_context(|| format!("CA certificate {}", path.display()))?;
            builder = builder.tls_certs_only([cert]);
        }
        let http = builder.build().context("HTTP client")?;
        Ok(Client {
            base,
            token,
            http,
            selector: None,
        })
    }

    /// Lists from this client keep what `selector` selects (`-l`).
    pub fn selecting(mut self, selector: Option<&str>) -> Client {
        self.selector = selector.map(String::from);
        self
    }

    async fn call(
        &self,
        method: Method,
        path: &str,
        query: &[(&str, String)],
        body: Option<Value>,
    ) -> anyhow::Result<(StatusCode, Value)> {
        let url = format!("{}{path}", self.base);
        let mut req = self
            .http
            .request(method, &url)
            .bearer_auth(&self.token)
            .query(query);
        if let Some(b) = body {
            req = req.json(&b);
        }
        let resp = req.send().await.map_err(|e| {
            let why = if e.is_connect() {
                "cannot connect (is `tinkerbox serve` running, and is this the right --server?)"
                    .to_string()
            } else if e.is_timeout() {
                "timed out".to_string()
            } else {
                error_chain(&e)
            };
            anyhow!("{url}: {why}")
        })?;
        let status = resp.status();
        let bytes = resp
            .bytes()
            .await
            .map_err(|e| anyhow!("{url}: reading response: {e}"))?;
        let value: Value = serde_json::from_slice(&bytes)
            .unwrap_or_else(|_| json!({"error": String::from_utf8_lossy(&bytes)}));
        Ok((status, value))
    }

    /// `GET base/NAME` (one object) or `GET base` (a list), in a namespace
    /// (`None`: every namespace).
    async fn get_one_or_list(
        &self,
        base: &str,
        name: Option<&str>,
        namespace: Option<String>,
    ) -> anyhow::Result<Value> {
        let mut query: Vec<(&str, String)> =
            namespace.map(|ns| ("namespace", ns)).into_iter().collect();
        if let (None, Some(s)) = (name, &self.selector) {
            query.push(("labelSelector", s.clone()));
        }
        match name {
            Some(n) => {
                self.call_ok(Method::GET, &format!("{base}/{}", encode(n)), &query, None)
                    .await
            }
            None => self.call_ok(Method::GET, base, &query, None).await,
        }
    }

    async fn call_ok(
        &self,
        method: Method,
        path: &str,
        query: &[(&str, String)],
        body: Option<Value>,
    ) -> anyhow::Result<Value> {
        let (status, value) = self.call(method, path, query, body).await?;
        if status.is_success() {
            Ok(value)
        } else {
            Err(anyhow!(api_error(status, &value)))
        }
    }
}

fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}

pub(crate) fn api_error(status: StatusCode, v: &Value) -> String {
    let msg = v
        .get("error")
        .and_then(Value::as_str)
        .unwrap_or("no error message");
    format!(
        "{} {}: {msg}",
        status.as_u16(),
        status.canonical_reason().unwrap_or("")
    )
}

/// The file's text; `-` is standard input.
pub(crate) fn read_input(file: &str) -> anyhow::Result<String> {
    if file == "-" {
        let mut s = String::new();
        std::io::stdin()
            .read_to_string(&mut s)
            .context("reading standard input")?;
        Ok(s)
    } else {
        std::fs::read_to_string(file).with_context(|| format!("reading {file}"))
    }
}

/// The text of each input: a file, `-` (standard input), or a directory
/// (its `.yaml`, `.yml` and `.json` files, sorted by name, not recursive,
/// as `kubectl apply -f DIR` reads it).
fn inputs(args: &[String]) -> anyhow::Result<Vec<(String, String)>> {
    let mut out = Vec::new();
    for a in args {
        let path = std::path::Path::new(a);
        if a != "-" && path.is_dir() {
            let mut files: Vec<PathBuf> = std::fs::read_dir(path)
                .with_context(|| format!("reading directory {a}"))?
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| {
                    p.is_file()
                        && p.extension()
                            .and_then(|e| e.to_str())
                            .is_some_and(|e| matches!(e, "yaml" | "yml" | "json"))
                })
                .collect();
            files.sort();
            if files.is_empty() {
                bail!("{a}: no .yaml, .yml or .json files in this directory");
            }
            for f in files {
                let name = f.display().to_string();
                let text = read_input(&name)?;
                out.push((name, text));
            }
        } else {
            out.push((a.clone(), read_input(a)?));
        }
    }
    Ok(out)
}

/// Documents sent per request in a non-atomic apply: few requests (and
/// store transactions) for an inventory of thousands of machines.
const BATCH: usize = 500;

/// kubectl-style: each document on its own, so one bad document does not
/// stop the others. Documents are checked here first (the daemon's own
/// rules: a bad one is reported with its file, index and line, and not
/// sent), then the good ones go in batches of [`BATCH`], each one atomic;
/// a batch the daemon refuses (a MAC or IP owned by another Hardware) is
/// sent again document by document, so that only the culprit fails.
/// `atomic` sends every document as one all-or-nothing request, and sends
/// nothing if any document is bad. `only` narrows the kinds accepted
/// (`hardware apply`); `None` takes every kind (`tinkerbox apply`).
pub async fn apply(
    t: &Target,
    files: &[String],
    atomic: bool,
    only: Option<Kind>,
) -> anyhow::Result<()> {
    let endpoint = match only {
        Some(Kind::Hardware) => "/api/v1/hardware",
        _ => "/api/v1/apply",
    };
    let mut docs = Vec::new();
    let mut failed = 0;
    for (f, text) in inputs(files)? {
        let parsed = hardware::parse_located(&text).map_err(|e| anyhow!("{f}: {e}"))?;
        for (i, d) in parsed.into_iter().enumerate() {
            let label = d
                .doc
                .pointer("/metadata/name")
                .and_then(Value::as_str)
                .map(|n| format!("{f}: document {} ({n}, line {})", i + 1, d.line))
                .unwrap_or_else(|| format!("{f}: document {} (line {})", i + 1, d.line));
            let checked = match only {
                Some(Kind::Hardware) => hardware::validate(d.doc.clone()).map(|_| ()),
                _ => kinds::check(d.doc.clone()).map(|_| ()),
            };
            match checked {
                Ok(()) => docs.push((label, d.doc)),
                Err(e) => {
                    failed += 1;
                    eprintln!("error: {label}: {e}");
                }
            }
        }
    }
    if docs.is_empty() && failed == 0 {
        bail!("no documents in {}", files.join(", "));
    }
    if atomic && failed > 0 {
        bail!("{failed} document(s) invalid: nothing applied (--atomic)");
    }
    let client = Client::new(t)?;
    if atomic {
        let batch = Value::Array(docs.into_iter().map(|(_, d)| d).collect());
        let v = client
            .call_ok(Method::POST, endpoint, &[], Some(batch))
            .await?;
        print_applied(&v);
        return Ok(());
    }
    for chunk in docs.chunks(BATCH) {
        let batch = Value::Array(chunk.iter().map(|(_, d)| d.clone()).collect());
        match client
            .call(Method::POST, endpoint, &[], Some(batch))
            .await?
        {
            (s, v) if s.is_success() => print_applied(&v),
            (s, v) if chunk.len() == 1 => {
                failed += 1;
                eprintln!("error: {}: {}", chunk[0].0, api_error(s, &v));
            }
            _ => {
                for (label, d) in chunk {
                    match client
                        .call(Method::POST, endpoint, &[], Some(d.clone()))
                        .await?
                    {
                        (s, v) if s.is_success() => print_applied(&v),
                        (s, v) => {
                            failed += 1;
                            eprintln!("error: {label}: {}", api_error(s, &v));
                        }
                    }
                }
            }
        }
    }
    if failed > 0 {
        bail!("{failed} document(s) not applied");
    }
    Ok(())
}

fn print_applied(v: &Value) {
    for item in v
        .get("items")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let ns = item.get("namespace").and_then(Value::as_str).unwrap_or("?");
        let name = item.get("name").and_then(Value::as_str).unwrap_or("?");
        let result = item.get("result").and_then(Value::as_str).unwrap_or("?");
        let kind = item
            .get("kind")
            .and_then(Value::as_str)
            .map_or(Some(Kind::Hardware), Kind::from_document_kind);
        let shown = if ns == hardware::DEFAULT_NAMESPACE {
            name.to_string()
        } else {
            format!("{ns}/{name}")
        };
        println!("{}/{shown} {result}", kind.map_or("?", Kind::resource));
    }
}

pub async fn get(
    t: &Target,
    name: Option<&str>,
    namespace: Option<&str>,
    all: bool,
    selector: Option<&str>,
    out: Output,
) -> anyhow::Result<()> {
    let ns = namespace.unwrap_or(hardware::DEFAULT_NAMESPACE).to_string();
    // A list with -A spans every namespace.
    let ns = (name.is_some() || !all).then_some(ns);
    let v = Client::new(t)?
        .selecting(selector)
        .get_one_or_list("/api/v1/hardware", name, ns)
        .await?;
    show(&v, name.is_some(), out, |items| hardware_table(items, all))?;
    Ok(())
}

/// Print an API answer (one object, or a list with `items`) as JSON, YAML
/// or a table of its items.
pub(crate) fn show(
    v: &Value,
    single: bool,
    out: Output,
    table: impl Fn(&[Value]) -> String,
) -> anyhow::Result<()> {
    match out {
        Output::Json => println!("{}", serde_json::to_string_pretty(v)?),
        Output::Yaml => print!("{}", to_yaml(v)?),
        Output::Table | Output::Wide => {
            let items = if single {
                vec![v.clone()]
            } else {
                v.get("items")
                    .and_then(Value::as_array)
                    .cloned()
                    .unwrap_or_default()
            };
            print!("{}", table(&items));
        }
    }
    Ok(())
}

pub fn to_yaml(v: &Value) -> anyhow::Result<String> {
    serde_saphyr::to_string(v).map_err(|e| anyhow!("rendering YAML: {e}"))
}

/// Path segments from the user go into URLs percent-encoded.
pub(crate) fn encode(s: &str) -> String {
    s.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

pub fn hardware_table(items: &[Value], with_ns: bool) -> String {
    let mut rows = vec![vec![
        "NAMESPACE".to_string(),
        "NAME".into(),
        "MAC".into(),
        "IP".into(),
        "HOSTNAME".into(),
        "PXE".into(),
        "WORKFLOW".into(),
    ]];
    for doc in items {
        let ns = doc
            .pointer("/metadata/namespace")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string();
        let name = doc
            .pointer("/metadata/name")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string();
        let ifaces = doc
            .pointer("/spec/interfaces")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        let first = ifaces.first();
        let s = |p: &str| {
            first
                .and_then(|i| i.pointer(p))
                .map(|v| match v {
                    Value::String(s) => s.clone(),
                    other => other.to_string(),
                })
                .unwrap_or_else(|| "-".into())
        };
        let mut mac = s("/dhcp/mac");
        if ifaces.len() > 1 {
            mac.push_str(&format!(" (+{})", ifaces.len() - 1));
        }
        rows.push(vec![
            ns,
            name,
            mac,
            s("/dhcp/ip/address"),
            s("/dhcp/hostname"),
            s("/netboot/allowPXE"),
            s("/netboot/allowWorkflow"),
        ]);
    }
    if !with_ns {
        for r in &mut rows {
            r.remove(0);
        }
    }
    render_table(&rows)
}

pub(crate) fn render_table(rows: &[Vec<String>]) -> String {
    let cols = rows.first().map(Vec::len).unwrap_or(0);
    let widths: Vec<usize> = (0..cols)
        .map(|c| rows.iter().map(|r| r[c].chars().count()).max().unwrap_or(0))
        .collect();
    let mut out = String::new();
    for r in rows {
        let line: Vec<String> = r
            .iter()
            .enumerate()
            .map(|(c, cell)| {
                if c + 1 == cols {
                    cell.clone()
                } else {
                    format!("{cell:<w$}", w = widths[c])
                }
            })
            .collect();
        out.push_str(line.join("   ").trim_end());
        out.push('\n');
    }
    out
}

pub async fn delete(t: &Target, name: &str, namespace: Option<&str>) -> anyhow::Result<()> {
    let client = Client::new(t)?;
    let ns = namespace.unwrap_or(hardware::DEFAULT_NAMESPACE).to_string();
    client
        .call_ok(
            Method::DELETE,
            &format!("/api/v1/hardware/{}", encode(name)),
            &[("namespace", ns)],
            None,
        )
        .await?;
    println!("hardware.tinkerbell.org/{name} deleted");
    Ok(())
}

pub struct EventsArgs<'a> {
    pub name: Option<&'a str>,
    pub namespace: Option<&'a str>,
    pub limit: u32,
    pub output: Output,
    pub follow: bool,
}

pub async fn events(t: &Target, a: EventsArgs<'_>) -> anyhow::Result<()> {
    let client = Client::new(t)?;
    let mut query: Vec<(&str, String)> = vec![("limit", a.limit.to_string())];
    if let Some(n) = a.name {
        query.push(("name", n.to_string()));
        query.push((
            "namespace",
            a.namespace
                .unwrap_or(hardware::DEFAULT_NAMESPACE)
                .to_string(),
        ));
    }
    let mut after: Option<i64> = None;
    let mut header = matches!(a.output, Output::Table | Output::Wide);
    loop {
        let mut q = query.clone();
        if let Some(id) = after {
            q.push(("after", id.to_string()));
        }
        let v = client
            .call_ok(Method::GET, "/api/v1/events", &q, None)
            .await?;
        let rows: Vec<EventRow> =
            serde_json::from_value(v.get("items").cloned().unwrap_or(Value::Null))
                .unwrap_or_default();
        if let Some(last) = rows.last() {
            after = Some(last.id);
        }
        match a.output {
            Output::Json if !a.follow => println!("{}", serde_json::to_string_pretty(&rows)?),
            Output::Json => {
                for r in &rows {
                    println!("{}", serde_json::to_string(r)?);
                }
            }
            Output::Yaml => print!("{}", to_yaml(&serde_json::to_value(&rows)?)?),
            Output::Table | Output::Wide => {
                print!("{}", events_table(&rows, header, a.name.is_none()));
                header = false;
            }
        }
        if !a.follow {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

fn events_table(rows: &[EventRow], header: bool, with_machine: bool) -> String {
    let mut table = Vec::new();
    if header {
        table.push(vec![
            "TIME".to_string(),
            "MACHINE".into(),
            "KIND".into(),
            "MESSAGE".into(),
        ]);
    }
    for r in rows {
        let machine = match (&r.namespace, &r.name, &r.mac) {
            (Some(ns), Some(n), _) if ns == hardware::DEFAULT_NAMESPACE => n.clone(),
            (Some(ns), Some(n), _) => format!("{ns}/{n}"),
            (_, _, Some(m)) => m
                .parse::<Mac>()
                .map(|m| m.to_string())
                .unwrap_or_else(|_| m.clone()),
            _ => "-".into(),
        };
        table.push(vec![
            r.time.clone(),
            machine,
            r.kind.clone(),
            r.message.clone(),
        ]);
    }
    if !with_machine {
        for r in &mut table {
            r.remove(1);
        }
    }
    if table.is_empty() {
        String::new()
    } else {
        render_table(&table)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_lines_up() {
        let items = vec![
            json!({"metadata": {"name": "a", "namespace": "default"},
                   "spec": {"interfaces": [{"dhcp": {"mac": "52:54:00:00:00:01", "ip": {"address": "10.0.0.1"}},
                                            "netboot": {"allowPXE": true}}, {}]}}),
            json!({"metadata": {"name": "longer-name", "namespace": "lab"}, "spec": {}}),
        ];
        let t = hardware_table(&items, false);
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(
            lines[0],
            "NAME          MAC                      IP         HOSTNAME   PXE    WORKFLOW"
        );
        assert_eq!(
            lines[1],
            "a             52:54:00:00:00:01 (+1)   10.0.0.1   -          true   -"
        );
        assert!(lines[2].starts_with("longer-name   -"));
        assert!(hardware_table(&items, true).starts_with("NAMESPACE   NAME"));
    }

    #[test]
    fn connect_addr_maps_unspecified() {
        assert_eq!(
            connect_addr("0.0.0.0:7081".parse().unwrap()).to_string(),
            "127.0.0.1:7081"
        );
        assert_eq!(
            connect_addr("[::]:7081".parse().unwrap()).to_string(),
            "[::1]:7081"
        );
        assert_eq!(
            connect_addr("10.0.0.1:1".parse().unwrap()).to_string(),
            "10.0.0.1:1"
        );
        assert_eq!(encode("a b/c"), "a%20b%2Fc");
    }
}
