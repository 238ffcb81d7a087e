//! The lists and details of the other kinds: Workflows, Templates (and a
//! Template rendered for a chosen machine, to check it before running
//! it), WorkflowRuleSets, BMC jobs and BareMetalHosts. One list template
//! and one detail template for all of them: a kind is its columns.

use super::{Current, Shared, failed, html, refused};
use crate::hardware::Key;
use askama::Template;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::Value;

/// The kinds with a list page, by their path under `/ui/`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Workflows,
    Templates,
    RuleSets,
    Jobs,
    Hosts,
}

impl Kind {
    pub const ALL: [Kind; 5] = [
        Kind::Workflows,
        Kind::Templates,
        Kind::RuleSets,
        Kind::Jobs,
        Kind::Hosts,
    ];

    pub fn path(self) -> &'static str {
        match self {
            Kind::Workflows => "workflows",
            Kind::Templates => "templates",
            Kind::RuleSets => "rulesets",
            Kind::Jobs => "jobs",
            Kind::Hosts => "baremetalhosts",
        }
    }

    pub fn title(self) -> &'static str {
        match self {
            Kind::Workflows => "Workflows",
            Kind::Templates => "Templates",
            Kind::RuleSets => "Rule sets",
            Kind::Jobs => "BMC jobs",
            Kind::Hosts => "BareMetalHosts",
        }
    }

    fn parse(s: &str) -> Option<Kind> {
        Kind::ALL.into_iter().find(|k| k.path() == s)
    }

    fn columns(self) -> &'static [&'static str] {
        match self {
            Kind::Workflows => &["Workflow", "Hardware", "Template", "State", "Progress"],
            Kind::Templates => &["Template", "Lines"],
            Kind::RuleSets => &["Rule set", "Rules", "Template", "Namespace for Workflows"],
            Kind::Jobs => &["Job", "BMC Machine", "Tasks", "State", "Message"],
            Kind::Hosts => &["Host", "State", "Consumer", "Online", "Powered on", "Error"],
        }
    }
}

/// One cell: its text, a link, a CSS class.
pub struct Cell {
    pub text: String,
    pub href: Option<String>,
    pub class: &'static str,
}

fn cell(text: impl Into<String>) -> Cell {
    Cell {
        text: text.into(),
        href: None,
        class: "",
    }
}

fn link(text: impl Into<String>, href: String) -> Cell {
    Cell {
        text: text.into(),
        href: Some(href),
        class: "",
    }
}

fn badge(text: impl Into<String>) -> Cell {
    Cell {
        text: text.into(),
        href: None,
        class: "badge",
    }
}

fn s<'a>(doc: &'a Value, p: &str) -> &'a str {
    doc.pointer(p).and_then(Value::as_str).unwrap_or("")
}

fn detail(kind: Kind, k: &Key) -> String {
    format!("/ui/{}/{}/{}", kind.path(), k.namespace, k.name)
}

fn machine(k: &Key, name: &str) -> Cell {
    if name.is_empty() {
        return cell("");
    }
    link(name, format!("/ui/machines/{}/{name}", k.namespace))
}

#[derive(Template)]
#[template(path = "ui/objects.html")]
struct ListPage {
    csrf: String,
    title: &'static str,
    columns: &'static [&'static str],
    rows: Vec<(String, Vec<Cell>)>,
    total: usize,
    matched: usize,
    text: String,
    page: usize,
    pages: usize,
    prev: Option<String>,
    next: Option<String>,
}

#[derive(Deserialize, Default)]
pub(super) struct ListQuery {
    #[serde(default)]
    q: String,
    page: Option<usize>,
}

/// The rows whose namespace or any cell has `text` (case-insensitive).
fn matching(rows: Vec<(String, Vec<Cell>)>, text: &str) -> Vec<(String, Vec<Cell>)> {
    let t = text.trim().to_lowercase();
    if t.is_empty() {
        return rows;
    }
    rows.into_iter()
        .filter(|(ns, cells)| {
            ns.to_lowercase().contains(&t)
                || cells.iter().any(|c| c.text.to_lowercase().contains(&t))
        })
        .collect()
}

/// `/ui/{kind}`: every object of the kind, by namespace and name.
pub(super) async fn list(
    State(ui): State<Shared>,
    axum::Extension(cur): axum::Extension<Current>,
    Path(kind): Path<String>,
    Query(q): Query<ListQuery>,
) -> Response {
    let Some(kind) = Kind::parse(&kind) else {
        return StatusCode::NOT_FOUND.into_response();
    };
    let store = &ui.app.store;
    let rows: Result<Vec<(String, Vec<Cell>)>, crate::store::StoreError> = async {
        Ok(match kind {
            Kind::Workflows => store
                .workflows(None, &[])
                .await?
                .iter()
                .map(|w| {
                    let p = super::view::Progress::of(w);
                    let k = &w.key;
                    (
                        k.namespace.clone(),
                        vec![
                            link(&k.name, detail(kind, k)),
                            machine(k, s(&w.doc, "/spec/hardwareRef")),
                            link(
                                s(&w.doc, "/spec/templateRef"),
                                format!(
                                    "/ui/templates/{}/{}",
                                    k.namespace,
                                    s(&w.doc, "/spec/templateRef")
                                ),
                            ),
                            badge(p.state.as_str()),
                            cell(format!("{}/{} actions", p.done, p.total)),
                        ],
                    )
                })
                .collect(),
            Kind::Templates => store
                .templates(None)
                .await?
                .iter()
                .map(|t| {
                    let k = Key::of(t);
                    (
                        k.namespace.clone(),
                        vec![
                            link(&k.name, detail(kind, &k)),
                            cell(s(t, "/spec/data").lines().count().to_string()),
                        ],
                    )
                })
                .collect(),
            Kind::RuleSets => store
                .rulesets(None)
                .await?
                .iter()
                .map(|r| {
                    let k = Key::of(r);
                    let rules = r
                        .pointer("/spec/rules")
                        .and_then(Value::as_array)
                        .map_or(0, Vec::len);
                    (
                        k.namespace.clone(),
                        vec![
                            link(&k.name, detail(kind, &k)),
                            cell(rules.to_string()),
                            cell(s(r, "/spec/workflow/template/ref")),
                            cell(s(r, "/spec/workflow/namespace")),
                        ],
                    )
                })
                .collect(),
            Kind::Jobs => {
                let mut jobs = store.jobs(None).await?;
                jobs.reverse();
                jobs.iter()
                    .map(|j| {
                        let k = Key::new(j.namespace.clone(), j.name.clone());
                        (
                            k.namespace.clone(),
                            vec![
                                link(&k.name, detail(kind, &k)),
                                cell(
                                    j.machine
                                        .as_ref()
                                        .map(|m| m.name.clone())
                                        .unwrap_or_default(),
                                ),
                                cell(
                                    j.tasks
                                        .iter()
                                        .map(|t| t.describe())
                                        .collect::<Vec<_>>()
                                        .join(", "),
                                ),
                                badge(format!("{:?}", j.state)),
                                cell(j.message.clone().unwrap_or_default()),
                            ],
                        )
                    })
                    .collect()
            }
            Kind::Hosts => store
                .hosts(None)
                .await?
                .iter()
                .map(|h| {
                    let doc = h.with_status();
                    let r = crate::metal3::model::row(&doc);
                    let k = &h.key;
                    (
                        k.namespace.clone(),
                        vec![
                            link(&k.name, detail(kind, k)),
                            badge(r.state),
                            cell(r.consumer),
                            cell(r.online),
                            cell(
                                doc.pointer("/status/poweredOn")
                                    .map(Value::to_string)
                                    .unwrap_or_default(),
                            ),
                            cell(r.error),
                        ],
                    )
                })
                .collect(),
        })
    }
    .await;
    let rows = match rows {
        Ok(rows) => rows,
        Err(e) => return failed(e),
    };
    let total = rows.len();
    let mut rows = matching(rows, &q.q);
    let matched = rows.len();
    let (range, pages) = super::view::page_range(matched, super::PER_PAGE, q.page.unwrap_or(1));
    let page = range.start / super::PER_PAGE + 1;
    rows.truncate(range.end);
    let rows = rows.split_off(range.start);
    let (prev, next) = super::pager(&format!("/ui/{}", kind.path()), &[("q", &q.q)], page, pages);
    html(&ListPage {
        prev,
        next,
        csrf: cur.session.csrf.clone(),
        title: kind.title(),
        columns: kind.columns(),
        rows,
        total,
        matched,
        text: q.q,
        page,
        pages,
    })
}

#[derive(Template)]
#[template(path = "ui/object.html")]
struct DetailPage {
    csrf: String,
    kind: &'static str,
    title: &'static str,
    key: String,
    document: String,
    /// Templates: the machines it can be rendered for, and the result.
    render: Option<Rendered>,
    /// BareMetalHosts: the summary, claim and release.
    host: Option<HostView>,
}

/// A BareMetalHost as its page and its Hardware's page show it, with the
/// claim or release it can be given there.
pub(super) struct HostView {
    pub namespace: String,
    pub name: String,
    pub state: String,
    pub consumer: String,
    pub online: String,
    pub powered_on: String,
    pub image: String,
    pub error: String,
    /// Its inspection (`status.hardware`).
    pub facts: Vec<(String, String)>,
    /// CAPM3's candidate filter passes it: the Claim form shows.
    pub claimable: bool,
    /// It has a consumer or an image: the Release button shows.
    pub releasable: bool,
    /// The time, for the claim form's default consumer name.
    pub now_ms: i64,
}

impl HostView {
    pub(super) fn of(h: &crate::store::metal3::HostRow) -> HostView {
        let doc = h.with_status();
        let r = crate::metal3::model::row(&doc);
        let set = |p: &str| doc.pointer(p).is_some_and(|v| !v.is_null());
        HostView {
            namespace: h.key.namespace.clone(),
            name: h.key.name.clone(),
            powered_on: doc
                .pointer("/status/poweredOn")
                .map(Value::to_string)
                .unwrap_or_default(),
            image: s(&doc, "/spec/image/url").to_string(),
            facts: h
                .status
                .hardware
                .as_ref()
                .map(super::view::host_facts)
                .unwrap_or_default(),
            claimable: crate::services::metal3::claimable(h),
            releasable: set("/spec/consumerRef") || set("/spec/image"),
            state: r.state,
            consumer: r.consumer,
            online: r.online,
            error: r.error,
            now_ms: crate::clock::now_ms(),
        }
    }
}

struct Rendered {
    machines: Vec<String>,
    chosen: String,
    output: Option<Result<String, String>>,
}

#[derive(Deserialize, Default)]
pub(super) struct DetailQuery {
    /// A Template: render it for this Hardware (same namespace).
    #[serde(rename = "for")]
    for_machine: Option<String>,
}

/// `/ui/{kind}/{namespace}/{name}`: the object as stored (with its
/// status); a Template also rendered for a chosen machine.
pub(super) async fn one(
    State(ui): State<Shared>,
    axum::Extension(cur): axum::Extension<Current>,
    Path((kind, ns, name)): Path<(String, String, String)>,
    Query(q): Query<DetailQuery>,
) -> Response {
    let Some(kind) = Kind::parse(&kind) else {
        return StatusCode::NOT_FOUND.into_response();
    };
    let key = Key::new(ns, name);
    let store = &ui.app.store;
    let mut host = None;
    let doc: Result<Option<Value>, crate::store::StoreError> = async {
        Ok(match kind {
            Kind::Workflows => store.workflow(&key).await?.map(|w| w.with_status()),
            Kind::Templates => store.template(&key).await?,
            Kind::RuleSets => store.ruleset(&key).await?,
            Kind::Jobs => store
                .job(&key)
                .await?
                .and_then(|j| serde_json::to_value(j).ok()),
            Kind::Hosts => store.host(&key).await?.map(|h| {
                host = Some(HostView::of(&h));
                h.with_status()
            }),
        })
    }
    .await;
    let doc = match doc {
        Ok(Some(d)) => d,
        Ok(None) => {
            return (StatusCode::NOT_FOUND, format!("no {} {key}", kind.title())).into_response();
        }
        Err(e) => return failed(e),
    };
    let render = if kind == Kind::Templates {
        let machines: Vec<String> = match store.list(Some(&key.namespace)).await {
            Ok(docs) => docs
                .iter()
                .map(|d| s(d, "/metadata/name").to_string())
                .collect(),
            Err(e) => return failed(e),
        };
        let chosen = q.for_machine.unwrap_or_default();
        let output = if chosen.is_empty() {
            None
        } else {
            Some(render_for(&ui, &doc, &Key::new(key.namespace.clone(), chosen.clone())).await)
        };
        Some(Rendered {
            machines,
            chosen,
            output,
        })
    } else {
        None
    };
    html(&DetailPage {
        csrf: cur.session.csrf.clone(),
        kind: kind.path(),
        title: kind.title(),
        key: format!("{}/{}", key.namespace, key.name),
        document: serde_saphyr::to_string(&doc).unwrap_or_else(|_| doc.to_string()),
        render,
        host,
    })
}

#[derive(Template)]
#[template(path = "ui/host_panel.html")]
struct HostPanel {
    csrf: String,
    h: HostView,
}

/// A host's panels, for its page's live updates.
pub(super) async fn host_panel(
    State(ui): State<Shared>,
    axum::Extension(cur): axum::Extension<Current>,
    Path((ns, name)): Path<(String, String)>,
) -> Response {
    match ui.app.store.host(&Key::new(ns, name)).await {
        Ok(Some(h)) => html(&HostPanel {
            csrf: cur.session.csrf.clone(),
            h: HostView::of(&h),
        }),
        Ok(None) => StatusCode::NOT_FOUND.into_response(),
        Err(e) => failed(e),
    }
}

#[derive(Deserialize)]
pub(super) struct ClaimForm {
    csrf: String,
    image: String,
    #[serde(default)]
    checksum: String,
    #[serde(default)]
    format: String,
    #[serde(default)]
    consumer: String,
    #[serde(default)]
    user_data: String,
}

/// A BareMetalHost's Claim: `tinkerbox claim --host` (CAPM3's Associate,
/// for this host only) through the services, then its page, which
/// follows it through provisioning.
pub(super) async fn claim(
    State(ui): State<Shared>,
    axum::Extension(cur): axum::Extension<Current>,
    Path((ns, name)): Path<(String, String)>,
    axum::extract::Form(f): axum::extract::Form<ClaimForm>,
) -> Response {
    if let Some(r) = cur.refuse_csrf(&f.csrf) {
        return r;
    }
    let format = match f.format.as_str() {
        "" => None,
        other => match serde_json::from_value(Value::String(other.into())) {
            Ok(v) => Some(v),
            Err(_) => {
                return (
                    StatusCode::UNPROCESSABLE_ENTITY,
                    format!("format: {other:?} is not raw, qcow2, vdi, vmdk or live-iso"),
                )
                    .into_response();
            }
        },
    };
    let given = |v: &str| Some(v.trim().to_string()).filter(|v| !v.is_empty());
    let c = crate::services::metal3::Claim {
        namespace: Some(ns.clone()),
        selector: String::new(),
        host: Some(name.clone()),
        image: crate::metal3::model::Image {
            url: f.image.trim().to_string(),
            checksum: given(&f.checksum),
            checksum_type: None,
            format,
            oci_auth_secret_name: None,
        },
        user_data: Some(f.user_data).filter(|u| !u.trim().is_empty()),
        consumer: given(&f.consumer).unwrap_or_else(|| format!("ui-{}", crate::clock::now_ms())),
    };
    match ui.app.services.metal3.claim(&c).await {
        Ok(_) => {
            axum::response::Redirect::to(&detail(Kind::Hosts, &Key::new(ns, name))).into_response()
        }
        Err(e) => refused(e),
    }
}

#[derive(Deserialize)]
pub(super) struct CsrfForm {
    csrf: String,
}

/// A BareMetalHost's Release: CAPM3's Delete (image and data cleared,
/// deprovisioned, then the consumer cleared by the controller's next
/// calls) through the services.
pub(super) async fn release(
    State(ui): State<Shared>,
    axum::Extension(cur): axum::Extension<Current>,
    Path((ns, name)): Path<(String, String)>,
    axum::extract::Form(f): axum::extract::Form<CsrfForm>,
) -> Response {
    if let Some(r) = cur.refuse_csrf(&f.csrf) {
        return r;
    }
    let key = Key::new(ns, name);
    match ui.app.services.metal3.release(&key).await {
        Ok(_) => axum::response::Redirect::to(&detail(Kind::Hosts, &key)).into_response(),
        Err(e) => refused(e),
    }
}

/// Template `t` rendered as the engine would for Hardware `hw` (its
/// first MAC as `device_1`, as a Workflow's hardwareMap usually has it).
async fn render_for(ui: &Shared, t: &Value, hw: &Key) -> Result<String, String> {
    let doc = ui
        .app
        .store
        .get(hw)
        .await
        .map_err(|e| e.to_string())?
        .ok_or_else(|| format!("no Hardware {hw}"))?;
    let mac = s(&doc, "/spec/interfaces/0/dhcp/mac").to_string();
    let map = std::collections::BTreeMap::from([("device_1".to_string(), mac)]);
    let data = s(t, "/spec/data");
    crate::workflow::render::render(data, Some(&doc), &map)
        .map_err(|e| e.to_string())
        .and_then(|_| {
            crate::workflow::render::execute(data, Some(&doc), &map).map_err(|e| e.to_string())
        })
}

#[derive(Deserialize)]
pub(super) struct RunForm {
    csrf: String,
    #[serde(rename = "for")]
    for_machine: String,
}

/// A Template's "Run on this machine": a Workflow of it for the chosen
/// Hardware (`device_1` its first MAC; netbooted through its BMC when it
/// has one, as CAPT's Workflows are), made through the services, then
/// the machine's page, which follows it.
pub(super) async fn run(
    State(ui): State<Shared>,
    axum::Extension(cur): axum::Extension<Current>,
    Path((ns, name)): Path<(String, String)>,
    axum::extract::Form(f): axum::extract::Form<RunForm>,
) -> Response {
    if let Some(r) = cur.refuse_csrf(&f.csrf) {
        return r;
    }
    let store = &ui.app.store;
    let hw_key = Key::new(ns.clone(), f.for_machine.clone());
    let (template, hw) = match (
        store.template(&Key::new(ns.clone(), name.clone())).await,
        store.get(&hw_key).await,
    ) {
        (Ok(Some(t)), Ok(Some(h))) => (t, h),
        (Ok(None), _) => {
            return (StatusCode::NOT_FOUND, format!("no Template {ns}/{name}")).into_response();
        }
        (_, Ok(None)) => {
            return (StatusCode::NOT_FOUND, format!("no Hardware {hw_key}")).into_response();
        }
        (Err(e), _) | (_, Err(e)) => return failed(e),
    };
    if let Err(e) = render_for(&ui, &template, &hw_key).await {
        return (
            StatusCode::UNPROCESSABLE_ENTITY,
            format!("the Template does not render for {hw_key}: {e}"),
        )
            .into_response();
    }
    let doc = workflow_doc(&name, &hw_key, &hw, crate::clock::now_ms());
    match ui.app.services.put_owned(doc).await {
        Ok(()) => axum::response::Redirect::to(&format!(
            "/ui/machines/{}/{}",
            hw_key.namespace, hw_key.name
        ))
        .into_response(),
        Err(e) => refused(e),
    }
}

/// The Workflow of Template `template` for Hardware `hw` (document `doc`),
/// named for both and the time.
fn workflow_doc(template: &str, hw: &Key, doc: &Value, now_ms: i64) -> Value {
    let mut spec = serde_json::json!({
        "templateRef": template,
        "hardwareRef": hw.name,
        "hardwareMap": {"device_1": s(doc, "/spec/interfaces/0/dhcp/mac")},
    });
    if !s(doc, "/spec/bmcRef/name").is_empty() {
        spec["bootOptions"] =
            serde_json::json!({"bootMode": "netboot", "toggleAllowNetboot": true});
    }
    let mut name = format!("{template}-{}", hw.name);
    name.truncate(200);
    serde_json::json!({
        "apiVersion": crate::workflow::model::API_VERSION,
        "kind": "Workflow",
        "metadata": {"name": format!("{}-{}", name.trim_end_matches('-'), now_ms), "namespace": hw.namespace},
        "spec": spec,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_has_a_path_a_title_and_columns() {
        for k in Kind::ALL {
            assert_eq!(Kind::parse(k.path()), Some(k));
            assert!(!k.title().is_empty() && !k.columns().is_empty());
        }
        assert_eq!(Kind::parse("machines"), None);
    }

    #[test]
    fn a_list_is_searched_in_its_namespace_and_cells() {
        let rows = || {
            vec![
                (
                    "lab".to_string(),
                    vec![cell("web-01-install"), badge("SUCCESS")],
                ),
                (
                    "prod".to_string(),
                    vec![cell("db-01-install"), badge("RUNNING")],
                ),
            ]
        };
        let names = |r: Vec<(String, Vec<Cell>)>| -> Vec<String> {
            r.into_iter().map(|(_, c)| c[0].text.clone()).collect()
        };
        assert_eq!(names(matching(rows(), "")).len(), 2);
        assert_eq!(names(matching(rows(), " Running ")), vec!["db-01-install"]);
        assert_eq!(names(matching(rows(), "lab")), vec!["web-01-install"]);
        assert!(matching(rows(), "nope").is_empty());
    }

    #[test]
    fn a_run_is_a_workflow_the_engine_takes() {
        let hw = serde_json::json!({"spec": {"interfaces": [{"dhcp": {"mac": "52:54:00:aa:00:01"}}],
                                             "bmcRef": {"name": "bmc-1"}}});
        let w = workflow_doc("install", &Key::new("lab", "web-01"), &hw, 1700);
        let w = crate::workflow::model::workflow(w).unwrap();
        assert_eq!(w.key, Key::new("lab", "install-web-01-1700"));
        assert_eq!(
            w.doc["spec"]["hardwareMap"]["device_1"],
            "52:54:00:aa:00:01"
        );
        assert_eq!(w.doc["spec"]["bootOptions"]["bootMode"], "netboot");
        let bare = serde_json::json!({"spec": {"interfaces": []}});
        let w = workflow_doc("install", &Key::new("lab", "web-01"), &bare, 1);
        assert!(w["spec"].get("bootOptions").is_none());
    }
}
