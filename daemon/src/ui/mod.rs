//! The web UI, on the admin listener under `/ui/`: server-rendered HTML
//! (askama templates, compiled into the binary and checked at build
//! time) and one small script for the live parts, fed by Server-Sent
//! Events from the event log's feed. Why not a built front end: nothing
//! to install beside cargo, no bundle to keep in step with the API, and
//! a page is one request that needs no script to be read.
//!
//! Login is with the admin token, into a session cookie (HttpOnly,
//! SameSite=Strict, Secure under TLS); every action posts the session's
//! CSRF token; the pages send a strict Content-Security-Policy. Reads
//! come from the store and the event log; actions go through the
//! services, as the CLI's do.

mod objects;
pub mod rates;
pub mod session;
pub mod view;

use crate::app::App;
use crate::clock::now_ms;
use crate::events::log::{EventQuery, EventRow};
use crate::hardware::Key;
use askama::Template;
use axum::Router;
use axum::extract::{Form, Path, Query, Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{Html, IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use axum_extra::extract::cookie::{Cookie, CookieJar, SameSite};
use serde::Deserialize;
use session::{Session, Sessions};
use std::collections::HashMap;
use std::sync::Arc;
use view::{Filter, Lifecycle, Row};

/// The session cookie's name.
const COOKIE: &str = "tinkerbox_session";
/// Rows on a page of the machines list.
const PER_PAGE: usize = 100;
/// Events a machine page shows at first (then live).
const TIMELINE: u32 = 200;

struct Ui {
    app: Arc<App>,
    token: Arc<str>,
    sessions: Sessions,
    /// Cookies marked Secure: the admin listener speaks TLS.
    secure: bool,
    /// The dashboard's counters, sampled.
    samples: rates::Samples,
    /// Every Hardware document, parsed, as of an inventory generation:
    /// the list reads SQLite again only after a Hardware changed.
    docs: tokio::sync::Mutex<Option<(u64, Docs)>>,
}

type Shared = Arc<Ui>;

/// Every Hardware document, parsed.
type Docs = Arc<Vec<Arc<serde_json::Value>>>;

pub fn router(app: Arc<App>, token: Arc<str>, secure: bool) -> Router {
    let ui = Arc::new(Ui {
        app,
        token,
        sessions: Sessions::default(),
        secure,
        samples: rates::Samples::default(),
        docs: Default::default(),
    });
    tokio::spawn(sample(Arc::downgrade(&ui)));
    let private = Router::new()
        .route("/ui/", get(machines))
        .route("/ui/dashboard", get(dashboard))
        .route("/ui/{kind}", get(objects::list))
        .route("/ui/{kind}/{namespace}/{name}", get(objects::one))
        .route("/ui/templates/{namespace}/{name}/run", post(objects::run))
        .route(
            "/ui/baremetalhosts/{namespace}/{name}/panel",
            get(objects::host_panel),
        )
        .route(
            "/ui/baremetalhosts/{namespace}/{name}/claim",
            post(objects::claim),
        )
        .route(
            "/ui/baremetalhosts/{namespace}/{name}/release",
            post(objects::release),
        )
        .route("/ui/machines/{namespace}/{name}", get(machine))
        .route("/ui/machines/{namespace}/{name}/row", get(machine_row))
        .route(
            "/ui/machines/{namespace}/{name}/panels",
            get(machine_panels),
        )
        .route(
            "/ui/machines/{namespace}/{name}/action",
            post(machine_action),
        )
        .route("/ui/stream", get(stream))
        .route("/ui/logout", post(logout))
        .layer(middleware::from_fn_with_state(ui.clone(), authenticated));
    Router::new()
        .route("/ui", get(|| async { Redirect::to("/ui/") }))
        .route("/ui/login", get(login_page).post(login))
        .route("/ui/assets/{file}", get(asset))
        .merge(private)
        .layer(middleware::from_fn(security_headers))
        .with_state(ui)
}

/// Headers every UI response carries: scripts, styles and connections
/// from this origin only, no framing, no sniffing, no referrer.
async fn security_headers(req: Request, next: Next) -> Response {
    let mut r = next.run(req).await;
    let h = r.headers_mut();
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(
            "default-src 'self'; img-src 'self' data:; frame-ancestors 'none'; form-action 'self'; base-uri 'none'",
        ),
    );
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    // Pages are never kept (they show a session's data); the assets say
    // for themselves how long they are kept.
    if !h.contains_key(header::CACHE_CONTROL) {
        h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    }
    r
}

/// The session the cookie names, into the request; without one, a page
/// goes to the login and anything else is refused.
async fn authenticated(
    State(ui): State<Shared>,
    jar: CookieJar,
    mut req: Request,
    next: Next,
) -> Response {
    let session = jar.get(COOKIE).and_then(|c| {
        ui.sessions
            .get(c.value(), now_ms())
            .map(|s| (c.value().to_string(), s))
    });
    match session {
        Some((id, s)) => {
            req.extensions_mut().insert(Current { id, session: s });
            next.run(req).await
        }
        None if req.method() == axum::http::Method::GET
            && !req.uri().path().ends_with("/row")
            && !req.uri().path().ends_with("/panels")
            && req.uri().path() != "/ui/stream" =>
        {
            Redirect::to("/ui/login").into_response()
        }
        None => (StatusCode::UNAUTHORIZED, "log in at /ui/login").into_response(),
    }
}

/// The request's session.
#[derive(Clone)]
struct Current {
    id: String,
    session: Session,
}

impl Current {
    /// A form's CSRF token checked against this session's: the 403 to
    /// answer when it is wrong.
    fn refuse_csrf(&self, presented: &str) -> Option<Response> {
        if constant_time_eq::constant_time_eq(presented.as_bytes(), self.session.csrf.as_bytes()) {
            return None;
        }
        Some(
            (
                StatusCode::FORBIDDEN,
                "the form's CSRF token is wrong: reload the page",
            )
                .into_response(),
        )
    }
}

fn html<T: Template>(t: &T) -> Response {
    match t.render() {
        Ok(s) => Html(s).into_response(),
        Err(e) => {
            tracing::warn!(error = %e, "ui: a template failed to render");
            (
                StatusCode::INTERNAL_SERVER_ERROR,
                "the page failed to render",
            )
                .into_response()
        }
    }
}

/// An action the services refused, with its reason.
fn refused(e: crate::services::Error) -> Response {
    use crate::services::Error;
    let status = match &e {
        Error::Invalid(_) => StatusCode::UNPROCESSABLE_ENTITY,
        Error::NotFound(_) => StatusCode::NOT_FOUND,
        _ => StatusCode::CONFLICT,
    };
    (status, e.to_string()).into_response()
}

fn failed(e: impl std::fmt::Display) -> Response {
    (
        StatusCode::SERVICE_UNAVAILABLE,
        format!("cannot read the store: {e}"),
    )
        .into_response()
}

// ---- login ----

#[derive(Template)]
#[template(path = "ui/login.html")]
struct LoginPage {
    error: Option<&'static str>,
}

async fn login_page() -> Response {
    html(&LoginPage { error: None })
}

#[derive(Deserialize)]
struct LoginForm {
    token: String,
}

async fn login(State(ui): State<Shared>, jar: CookieJar, Form(f): Form<LoginForm>) -> Response {
    let ok = constant_time_eq::constant_time_eq(f.token.trim().as_bytes(), ui.token.as_bytes());
    if !ok {
        let mut r = html(&LoginPage {
            error: Some("That is not the admin token (state_dir/api-token)."),
        });
        *r.status_mut() = StatusCode::UNAUTHORIZED;
        return r;
    }
    let Some((id, _)) = ui.sessions.create(now_ms()) else {
        return (
            StatusCode::INTERNAL_SERVER_ERROR,
            "no randomness for a session",
        )
            .into_response();
    };
    let cookie = Cookie::build((COOKIE, id))
        .path("/ui")
        .http_only(true)
        .same_site(SameSite::Strict)
        .secure(ui.secure)
        .build();
    (jar.add(cookie), Redirect::to("/ui/")).into_response()
}

#[derive(Deserialize)]
struct CsrfForm {
    csrf: String,
}

async fn logout(
    State(ui): State<Shared>,
    axum::Extension(cur): axum::Extension<Current>,
    jar: CookieJar,
    Form(f): Form<CsrfForm>,
) -> Response {
    if let Some(r) = cur.refuse_csrf(&f.csrf) {
        return r;
    }
    ui.sessions.remove(&cur.id);
    let gone = Cookie::build((COOKIE, "")).path("/ui").build();
    (jar.remove(gone), Redirect::to("/ui/login")).into_response()
}

// ---- assets ----

/// The page's style and script, in the binary.
const CSS: &str = include_str!("../../assets/ui/ui.css");
const JS: &str = include_str!("../../assets/ui/ui.js");

/// FNV-1a of the assets: the pages name them with it (`?v=`), so a
/// browser keeps them for good and a new build's are fetched at once.
const ASSETS_HASH: u64 = {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let (a, b) = (CSS.as_bytes(), JS.as_bytes());
    let mut i = 0;
    while i < a.len() + b.len() {
        let byte = if i < a.len() { a[i] } else { b[i - a.len()] };
        h = (h ^ byte as u64).wrapping_mul(0x0100_0000_01b3);
        i += 1;
    }
    h
};

/// The assets' version, as the templates put it in their URLs.
pub fn assets() -> String {
    format!("{ASSETS_HASH:016x}")
}

async fn asset(Path(file): Path<String>) -> Response {
    let (body, kind) = match file.as_str() {
        "ui.css" => (CSS, "text/css; charset=utf-8"),
        "ui.js" => (JS, "text/javascript; charset=utf-8"),
        _ => return StatusCode::NOT_FOUND.into_response(),
    };
    (
        [
            (header::CONTENT_TYPE, kind),
            (header::CACHE_CONTROL, "public, max-age=31536000, immutable"),
        ],
        body,
    )
        .into_response()
}

// ---- the dashboard ----

/// Sample the metrics every [`rates::EVERY`] while the UI is served.
async fn sample(ui: std::sync::Weak<Ui>) {
    let mut tick = tokio::time::interval(rates::EVERY);
    loop {
        tick.tick().await;
        let Some(ui) = ui.upgrade() else { return };
        ui.samples
            .push(now_ms(), rates::read(&ui.app.metrics.render()));
    }
}

#[derive(Template)]
#[template(path = "ui/dashboard.html")]
struct DashboardPage {
    csrf: String,
    total: usize,
    counts: Vec<(&'static str, usize)>,
    rates: Vec<(&'static str, String)>,
    hour: Vec<(&'static str, String)>,
    minutes: i64,
    healthy: bool,
    health: Vec<String>,
    events: Vec<EventView>,
    last_id: i64,
}

async fn dashboard(
    State(ui): State<Shared>,
    axum::Extension(cur): axum::Extension<Current>,
) -> Response {
    let app = &ui.app;
    let all = match rows(&ui).await {
        Ok(r) => r,
        Err(e) => return failed(e),
    };
    let counts = view::counts(&all);
    // The current counters too, so that a fresh start shows something.
    ui.samples
        .push(now_ms(), rates::read(&app.metrics.render()));
    let m = ui.samples.summary();
    let (code, health) = crate::http::health(app).await;
    let events = app
        .event_log
        .query(&EventQuery {
            machine: None,
            after: None,
            limit: 30,
        })
        .await
        .unwrap_or_default();
    html(&DashboardPage {
        csrf: cur.session.csrf.clone(),
        total: all.len(),
        counts,
        rates: vec![
            ("DHCP replies/s", format!("{:.1}", m.dhcp_per_s)),
            ("TFTP transfers/s", format!("{:.1}", m.tftp_per_s)),
            ("HTTP requests/s", format!("{:.1}", m.http_per_s)),
        ],
        hour: vec![
            ("boots", format!("{:.0}", m.boots)),
            ("installs", format!("{:.0}", m.installs)),
            ("failed Workflows", format!("{:.0}", m.failures)),
        ],
        minutes: m.minutes,
        healthy: code.is_success(),
        health: health.lines().map(String::from).collect(),
        last_id: events.last().map_or(0, |e| e.id),
        events: events.into_iter().rev().map(event_view).collect(),
    })
}

fn event_view(e: EventRow) -> EventView {
    let who = match (&e.namespace, &e.name) {
        (Some(ns), Some(n)) => format!("{ns}/{n}"),
        _ => String::new(),
    };
    EventView {
        id: e.id,
        time: e.time,
        kind: e.kind,
        message: if who.is_empty() {
            e.message
        } else {
            format!("{who}: {}", e.message)
        },
    }
}

// ---- the machines list ----

/// A row as the template prints it.
struct RowView {
    namespace: String,
    name: String,
    href: String,
    state: &'static str,
    power: &'static str,
    mac: String,
    ip: String,
    workflow: String,
    percent: usize,
    activity: String,
    last_heard: String,
}

fn row_view(r: &Row, now: i64) -> RowView {
    let (workflow, percent, activity) = match &r.workflow {
        Some(p) => (
            format!("{} ({}/{})", p.name, p.done, p.total),
            p.percent(),
            match &p.current {
                Some((a, m)) if m.is_empty() => a.clone(),
                Some((a, m)) => format!("{a}: {m}"),
                None => p.state.as_str().to_string(),
            },
        ),
        None => (String::new(), 0, String::new()),
    };
    RowView {
        href: format!("/ui/machines/{}/{}", r.key.namespace, r.key.name),
        namespace: r.key.namespace.clone(),
        name: r.key.name.clone(),
        state: r.state.as_str(),
        power: r.power.map_or("", |p| p.as_str()),
        mac: r.macs.first().cloned().unwrap_or_default(),
        ip: r.ips.first().cloned().unwrap_or_default(),
        workflow,
        percent,
        activity,
        last_heard: r
            .last_heard_ms
            .map(|t| view::ago(t, now))
            .unwrap_or_default(),
    }
}

#[derive(Template)]
#[template(path = "ui/machines.html")]
struct MachinesPage {
    csrf: String,
    rows: Vec<RowView>,
    total: usize,
    matched: usize,
    counts: Vec<(&'static str, usize)>,
    text: String,
    state: String,
    labels: String,
    error: Option<String>,
    page: usize,
    pages: usize,
    prev: Option<String>,
    next: Option<String>,
}

#[derive(Template)]
#[template(path = "ui/row.html")]
struct RowFragment {
    r: RowView,
}

#[derive(Deserialize, Default)]
struct ListQuery {
    #[serde(default)]
    q: String,
    #[serde(default)]
    state: String,
    #[serde(default)]
    l: String,
    page: Option<usize>,
}

/// Every Hardware's row (its Workflow and power read in three queries).
/// Every Hardware document, from the cache while no Hardware changed.
async fn docs(ui: &Ui) -> Result<Docs, crate::store::StoreError> {
    // One reader refills it; the others wait for that rather than all
    // reading SQLite at once.
    let mut cache = ui.docs.lock().await;
    let generation = ui.app.inventory.generation();
    if let Some((g, docs)) = cache.as_ref()
        && *g == generation
    {
        return Ok(docs.clone());
    }
    let docs: Docs = Arc::new(
        ui.app
            .store
            .list(None)
            .await?
            .into_iter()
            .map(Arc::new)
            .collect(),
    );
    *cache = Some((generation, docs.clone()));
    Ok(docs)
}

async fn rows(ui: &Ui) -> Result<Vec<Row>, crate::store::StoreError> {
    let app = &ui.app;
    let docs = docs(ui).await?;
    let workflows = app.store.workflows(None, &[]).await?;
    let mut by_hw: HashMap<Key, Vec<&crate::store::workflow::WorkflowRow>> = HashMap::new();
    for w in &workflows {
        if let Some(hw) = w.doc.pointer("/spec/hardwareRef").and_then(|v| v.as_str()) {
            by_hw
                .entry(Key::new(w.key.namespace.clone(), hw))
                .or_default()
                .push(w);
        }
    }
    let power: HashMap<Key, crate::bmc::PowerState> = app
        .store
        .bmc_machines(None)
        .await?
        .into_iter()
        .map(|m| (m.key, m.power_state))
        .collect();
    Ok(docs
        .iter()
        .map(|d| {
            let key = Key::of(d);
            let wf = by_hw
                .get(&key)
                .and_then(|ws| view::current_workflow(ws.iter().copied()));
            let p = bmc_of(d, &key).and_then(|b| power.get(&b).copied());
            view::row(d.clone(), wf, p)
        })
        .collect())
}

/// When `key` was last heard from: its newest event.
async fn last_heard(app: &App, key: &Key) -> Option<i64> {
    let q = EventQuery {
        machine: Some(key.clone()),
        after: None,
        limit: 1,
    };
    event_ms(&app.event_log.query(&q).await.ok()?.pop()?)
}

/// When an event happened, in ms since the epoch (the log's rows carry
/// it as RFC 3339).
fn event_ms(e: &EventRow) -> Option<i64> {
    humantime::parse_rfc3339(&e.time)
        .ok()
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .and_then(|d| i64::try_from(d.as_millis()).ok())
}

async fn machines(
    State(ui): State<Shared>,
    axum::Extension(cur): axum::Extension<Current>,
    Query(q): Query<ListQuery>,
) -> Response {
    let all = match rows(&ui).await {
        Ok(r) => r,
        Err(e) => return failed(e),
    };
    let mut error = None;
    let selector = match q.l.trim() {
        "" => None,
        s => match crate::labels::parse(s) {
            Ok(sel) => Some(sel),
            Err(e) => {
                error = Some(format!("label selector: {e}"));
                None
            }
        },
    };
    let filter = Filter {
        text: q.q.clone(),
        state: Lifecycle::parse(&q.state),
        selector,
    };
    let counts = view::counts(&all);
    let total = all.len();
    let kept: Vec<Row> = all.into_iter().filter(|r| filter.keeps(r)).collect();
    let (range, pages) = view::page_range(kept.len(), PER_PAGE, q.page.unwrap_or(1));
    let page = range.start / PER_PAGE + 1;
    let now = now_ms();
    let mut shown = Vec::with_capacity(range.len());
    for r in &kept[range] {
        let mut r = r.clone();
        r.last_heard_ms = last_heard(&ui.app, &r.key).await;
        shown.push(row_view(&r, now));
    }
    let (prev, next) = pager(
        "/ui/",
        &[("q", &q.q), ("state", &q.state), ("l", &q.l)],
        page,
        pages,
    );
    html(&MachinesPage {
        csrf: cur.session.csrf.clone(),
        rows: shown,
        total,
        matched: kept.len(),
        counts,
        text: q.q.clone(),
        state: q.state.clone(),
        labels: q.l.clone(),
        error,
        page,
        pages,
        prev,
        next,
    })
}

/// The links to the pages before and after `page` of a list at `path`,
/// with its filters (`pairs`, the empty ones left out).
fn pager(
    path: &str,
    pairs: &[(&str, &str)],
    page: usize,
    pages: usize,
) -> (Option<String>, Option<String>) {
    let link = |p: usize| {
        let mut s = url::form_urlencoded::Serializer::new(String::new());
        for (k, v) in pairs.iter().filter(|(_, v)| !v.is_empty()) {
            s.append_pair(k, v);
        }
        s.append_pair("page", &p.to_string());
        format!("{path}?{}", s.finish())
    };
    (
        (page > 1).then(|| link(page - 1)),
        (page < pages).then(|| link(page + 1)),
    )
}

/// One machine's row, for the list's live updates.
async fn machine_row(
    State(ui): State<Shared>,
    Path((ns, name)): Path<(String, String)>,
) -> Response {
    let key = Key::new(ns, name);
    match one_row(&ui.app, &key).await {
        Ok(Some(mut r)) => {
            r.last_heard_ms = last_heard(&ui.app, &key).await;
            html(&RowFragment {
                r: row_view(&r, now_ms()),
            })
        }
        Ok(None) => StatusCode::NOT_FOUND.into_response(),
        Err(e) => failed(e),
    }
}

/// `key`'s row alone: its document, Workflows and BMC Machine.
async fn one_row(app: &App, key: &Key) -> Result<Option<Row>, crate::store::StoreError> {
    let Some(doc) = app.store.get(key).await? else {
        return Ok(None);
    };
    let workflows = app.store.workflows_of_hardware(key).await?;
    let wf = view::current_workflow(&workflows);
    let power = match bmc_of(&doc, key) {
        Some(b) => app.store.bmc_machine(&b).await?.map(|m| m.power_state),
        None => None,
    };
    Ok(Some(view::row(doc, wf, power)))
}

// ---- one machine ----

/// An action of the machine's Workflow, as the page shows it.
struct ActionView {
    name: String,
    state: String,
    class: &'static str,
    duration: String,
    message: String,
}

struct WorkflowView {
    name: String,
    state: String,
    percent: usize,
    actions: Vec<ActionView>,
}

fn workflow_view(w: &crate::store::workflow::WorkflowRow) -> WorkflowView {
    use crate::workflow::model::State as S;
    let p = view::Progress::of(w);
    let actions = w
        .status
        .tasks
        .iter()
        .flat_map(|t| &t.actions)
        .map(|a| ActionView {
            name: a.name.clone(),
            state: a.state.as_str().to_string(),
            class: match a.state {
                S::Success => "ok",
                S::Failed | S::Timeout => "bad",
                S::Running => "run",
                _ => "",
            },
            duration: a.execution_duration.clone().unwrap_or_default(),
            message: a.message.clone().unwrap_or_default(),
        })
        .collect();
    WorkflowView {
        name: w.key.name.clone(),
        state: w.status.state.as_str().to_string(),
        percent: p.percent(),
        actions,
    }
}

struct EventView {
    id: i64,
    time: String,
    kind: String,
    message: String,
}

#[derive(Template)]
#[template(path = "ui/machine.html")]
struct MachinePage {
    csrf: String,
    r: RowView,
    key: String,
    labels: Vec<(String, String)>,
    interfaces: Vec<(String, String, String)>,
    bmc: String,
    facts: Vec<(String, String)>,
    workflow: Option<WorkflowView>,
    jobs: Vec<JobView>,
    notice: Option<String>,
    events: Vec<EventView>,
    last_id: i64,
    document: String,
    /// The BareMetalHost this Hardware is made for (host mode's Metal3).
    host: Option<objects::HostView>,
    stages: Vec<StageView>,
}

#[derive(Template)]
#[template(path = "ui/panels.html")]
struct PanelsFragment {
    csrf: String,
    host: Option<objects::HostView>,
    stages: Vec<StageView>,
    workflow: Option<WorkflowView>,
    jobs: Vec<JobView>,
}

/// A stage of the newest boot, as the machine's page shows it.
struct StageView {
    name: &'static str,
    /// Since the first stage, `+12.3 s`.
    at: String,
    /// Until the next stage; empty for the last.
    took: String,
}

/// The newest boot's stages from a machine's events (any order).
fn stage_views(events: &[EventRow]) -> Vec<StageView> {
    let mut boot: Vec<view::BootEvent> = events
        .iter()
        .filter_map(|e| {
            Some(view::BootEvent {
                kind: serde_json::from_value(serde_json::Value::String(e.kind.clone())).ok()?,
                ms: event_ms(e)?,
                to: e
                    .fields
                    .as_ref()
                    .and_then(|f| f.get("to"))
                    .and_then(|v| v.as_str())
                    .map(String::from),
            })
        })
        .collect();
    boot.sort_by_key(|e| e.ms);
    let stages = view::stages(&boot);
    let first = stages.first().map_or(0, |s| s.at_ms);
    let secs = |ms: i64| format!("{:.1} s", ms as f64 / 1000.0);
    stages
        .iter()
        .map(|s| StageView {
            name: s.stage.as_str(),
            at: format!("+{}", secs(s.at_ms - first)),
            took: s.took_ms.map(secs).unwrap_or_default(),
        })
        .collect()
}

/// A BMC job, as the machine's page lists it.
struct JobView {
    name: String,
    what: String,
    state: String,
    class: &'static str,
    message: String,
    when: String,
}

/// The newest jobs of BMC Machine `bmc`.
async fn jobs(app: &App, bmc: Option<Key>) -> Result<Vec<JobView>, crate::store::StoreError> {
    use crate::store::bmc::State as J;
    let Some(bmc) = bmc else { return Ok(vec![]) };
    let now = now_ms();
    Ok(app
        .store
        .jobs_of_machine(&bmc, 8)
        .await?
        .into_iter()
        .map(|j| JobView {
            what: j
                .tasks
                .iter()
                .map(|t| t.describe())
                .collect::<Vec<_>>()
                .join(", "),
            name: j.name,
            state: format!("{:?}", j.state),
            class: match j.state {
                J::Completed => "ok",
                J::Failed => "bad",
                J::Running | J::Pending => "run",
            },
            message: j.message.unwrap_or_default(),
            when: view::ago(j.created_ms, now),
        })
        .collect())
}

/// The machine's BMC Machine, from its Hardware's `bmcRef`.
fn bmc_of(doc: &serde_json::Value, key: &Key) -> Option<Key> {
    doc.pointer("/spec/bmcRef/name")
        .and_then(|v| v.as_str())
        .filter(|n| !n.is_empty())
        .map(|n| Key::new(key.namespace.clone(), n))
}

#[derive(Deserialize, Default)]
struct MachineQuery {
    /// A BMC job the last action started, to say so.
    job: Option<String>,
}

async fn machine(
    State(ui): State<Shared>,
    axum::Extension(cur): axum::Extension<Current>,
    Path((ns, name)): Path<(String, String)>,
    Query(mq): Query<MachineQuery>,
) -> Response {
    let key = Key::new(ns, name);
    let app = &ui.app;
    let mut r = match one_row(app, &key).await {
        Ok(Some(r)) => r,
        Ok(None) => return (StatusCode::NOT_FOUND, format!("no Hardware {key}")).into_response(),
        Err(e) => return failed(e),
    };
    let events = timeline(app, &key).await;
    r.last_heard_ms = events.last().and_then(event_ms);
    let workflow = match current_workflow(app, &key).await {
        Ok(w) => w.as_ref().map(workflow_view),
        Err(e) => return failed(e),
    };
    let jobs = match jobs(app, bmc_of(&r.doc, &key)).await {
        Ok(j) => j,
        Err(e) => return failed(e),
    };
    let host = match app.store.host(&key).await {
        Ok(h) => h.as_ref().map(objects::HostView::of),
        Err(e) => return failed(e),
    };
    let mut facts = view::facts(&r.doc);
    for (k, v) in host.iter().flat_map(|h| h.facts.iter()) {
        if !facts.iter().any(|(have, _)| have == k) {
            facts.push((k.clone(), v.clone()));
        }
    }
    let interfaces = r.doc["spec"]["interfaces"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|i| {
                    let s = |p: &str| {
                        i.pointer(p)
                            .and_then(|v| v.as_str())
                            .unwrap_or("")
                            .to_string()
                    };
                    let pxe = match i.pointer("/netboot/allowPXE").and_then(|v| v.as_bool()) {
                        Some(true) => "PXE allowed",
                        _ => "no PXE",
                    };
                    (s("/dhcp/mac"), s("/dhcp/ip/address"), pxe.to_string())
                })
                .collect()
        })
        .unwrap_or_default();
    let page = MachinePage {
        stages: stage_views(&events),
        csrf: cur.session.csrf.clone(),
        key: format!("{}/{}", key.namespace, key.name),
        labels: r.labels.clone(),
        interfaces,
        bmc: r
            .doc
            .pointer("/spec/bmcRef/name")
            .and_then(|v| v.as_str())
            .unwrap_or("")
            .to_string(),
        facts,
        host,
        workflow,
        jobs,
        notice: mq
            .job
            .map(|j| format!("BMC job {j} started: its progress shows below and on the timeline.")),
        last_id: events.last().map_or(0, |e| e.id),
        events: events
            .into_iter()
            .rev()
            .map(|e| EventView {
                id: e.id,
                time: e.time,
                kind: e.kind,
                message: e.message,
            })
            .collect(),
        document: serde_json::to_string_pretty(&r.doc).unwrap_or_default(),
        r: row_view(&r, now_ms()),
    };
    html(&page)
}

/// A machine's newest [`TIMELINE`] events, oldest first (none when the
/// log cannot be read: the page still shows the rest).
async fn timeline(app: &App, key: &Key) -> Vec<EventRow> {
    app.event_log
        .query(&EventQuery {
            machine: Some(key.clone()),
            after: None,
            limit: TIMELINE,
        })
        .await
        .unwrap_or_default()
}

async fn current_workflow(
    app: &App,
    key: &Key,
) -> Result<Option<crate::store::workflow::WorkflowRow>, crate::store::StoreError> {
    let workflows = app.store.workflows_of_hardware(key).await?;
    Ok(view::current_workflow(&workflows).cloned())
}

/// The BareMetalHost, Workflow and BMC jobs panels, for the page's live
/// updates.
async fn machine_panels(
    State(ui): State<Shared>,
    axum::Extension(cur): axum::Extension<Current>,
    Path((ns, name)): Path<(String, String)>,
) -> Response {
    let key = Key::new(ns, name);
    let app = &ui.app;
    let doc = match app.store.get(&key).await {
        Ok(Some(d)) => d,
        Ok(None) => return StatusCode::NOT_FOUND.into_response(),
        Err(e) => return failed(e),
    };
    let (workflow, jobs, host) = match (
        current_workflow(app, &key).await,
        jobs(app, bmc_of(&doc, &key)).await,
        app.store.host(&key).await,
    ) {
        (Ok(w), Ok(j), Ok(h)) => (w, j, h),
        (Err(e), _, _) | (_, Err(e), _) | (_, _, Err(e)) => return failed(e),
    };
    let events = timeline(app, &key).await;
    html(&PanelsFragment {
        csrf: cur.session.csrf.clone(),
        host: host.as_ref().map(objects::HostView::of),
        stages: stage_views(&events),
        workflow: workflow.as_ref().map(workflow_view),
        jobs,
    })
}

/// What the machine page's buttons ask for.
#[derive(Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
enum MachineAction {
    PowerOn,
    PowerOff,
    PowerCycle,
    Netboot,
}

#[derive(Deserialize)]
struct ActionForm {
    csrf: String,
    action: MachineAction,
}

/// A button on a machine's page: its BMC job started through the
/// services (as `tinkerbox bmc power` and `hardware netboot` start
/// theirs), then back to the page, which follows it.
async fn machine_action(
    State(ui): State<Shared>,
    axum::Extension(cur): axum::Extension<Current>,
    Path((ns, name)): Path<(String, String)>,
    Form(f): Form<ActionForm>,
) -> Response {
    use crate::bmc::PowerAction;
    if let Some(r) = cur.refuse_csrf(&f.csrf) {
        return r;
    }
    let key = Key::new(ns, name);
    let s = &ui.app.services;
    let doc = match ui.app.store.get(&key).await {
        Ok(Some(d)) => d,
        Ok(None) => return (StatusCode::NOT_FOUND, format!("no Hardware {key}")).into_response(),
        Err(e) => return failed(e),
    };
    let Some(bmc) = bmc_of(&doc, &key) else {
        return (
            StatusCode::CONFLICT,
            format!("Hardware {key} has no bmcRef: tinkerbox cannot power it"),
        )
            .into_response();
    };
    let power = |a: PowerAction| crate::bmc::model::Action {
        power_action: Some(a),
        ..Default::default()
    };
    let started = match f.action {
        MachineAction::PowerOn => {
            s.bmc
                .start_job(&bmc, "power-on", vec![power(PowerAction::On)])
                .await
        }
        MachineAction::PowerOff => {
            s.bmc
                .start_job(&bmc, "power-off", vec![power(PowerAction::Off)])
                .await
        }
        MachineAction::PowerCycle => {
            s.bmc
                .start_job(&bmc, "power-cycle", vec![power(PowerAction::Cycle)])
                .await
        }
        MachineAction::Netboot => s.bmc.netboot(&s.hardware, &key).await,
    };
    match started {
        Ok(job) => {
            let q = url::form_urlencoded::Serializer::new(String::new())
                .append_pair("job", &job.name)
                .finish();
            Redirect::to(&format!("/ui/machines/{}/{}?{q}", key.namespace, key.name))
                .into_response()
        }
        Err(e) => refused(e),
    }
}

// ---- the live feed ----

#[derive(Deserialize)]
struct StreamQuery {
    /// `namespace/name`: that machine's events only.
    machine: Option<String>,
    /// `ns/a,ns/b,...`: these machines' only (the machines list's rows).
    machines: Option<String>,
    /// Events after this id first, from the log (a reconnect's resume).
    after: Option<i64>,
}

/// Machines one stream may follow by name (a list page shows 100).
const STREAM_MACHINES: usize = 500;
/// The most events of one window a page that follows some machines is
/// sent (the newest); one that follows every machine gets the feed's
/// newest [`crate::events::FEED_NEWEST`]. A burst (a DHCP storm's
/// thousands of events a second) costs each open page four small
/// messages a second, and the hot paths nothing (tests/bench/run --only ui).
const WINDOW_ROWS: usize = 100;

/// Which machines' events a stream sends.
#[derive(Debug, PartialEq)]
enum Follow {
    All,
    One(Key),
    Some(std::collections::HashSet<Key>),
}

impl Follow {
    fn parse(q: &StreamQuery) -> Result<Follow, &'static str> {
        let key = |m: &str| match m.split_once('/') {
            Some((ns, n)) if !ns.is_empty() && !n.is_empty() && !n.contains('/') => {
                Ok(Key::new(ns, n))
            }
            _ => Err("machine: NAMESPACE/NAME"),
        };
        match (&q.machine, &q.machines) {
            (Some(m), None) => Ok(Follow::One(key(m)?)),
            (None, Some(ms)) => {
                let set = ms
                    .split(',')
                    .filter(|m| !m.is_empty())
                    .map(key)
                    .collect::<Result<std::collections::HashSet<Key>, _>>()?;
                if set.len() > STREAM_MACHINES {
                    return Err("machines: at most 500");
                }
                Ok(Follow::Some(set))
            }
            (None, None) => Ok(Follow::All),
            (Some(_), Some(_)) => Err("machine or machines, not both"),
        }
    }

    fn keeps(&self, e: &EventRow) -> bool {
        let (Some(ns), Some(name)) = (e.namespace.as_deref(), e.name.as_deref()) else {
            return *self == Follow::All;
        };
        match self {
            Follow::All => true,
            Follow::One(k) => k.namespace == ns && k.name == name,
            Follow::Some(set) => set.contains(&Key::new(ns, name)),
        }
    }

    /// The log query of a resume (a set is filtered after).
    fn machine(&self) -> Option<Key> {
        match self {
            Follow::One(k) => Some(k.clone()),
            _ => None,
        }
    }

    /// What of `rows` (ids above `after` only) this stream sends: the
    /// newest it follows (as many as a window's message has), oldest first.
    fn sent<'a>(&self, rows: &'a [EventRow], after: Option<i64>) -> Vec<&'a EventRow> {
        let cap = match self {
            Follow::All => crate::events::FEED_NEWEST,
            _ => WINDOW_ROWS,
        };
        let mut mine: Vec<&EventRow> = rows
            .iter()
            .rev()
            .filter(|e| after.is_none_or(|a| e.id > a) && self.keeps(e))
            .take(cap)
            .collect();
        mine.reverse();
        mine
    }

    /// The message of [`Follow::sent`]; `None` when it is nothing.
    fn message(&self, rows: &[EventRow], after: Option<i64>) -> Option<SseEvent> {
        let mine = self.sent(rows, after);
        let last = mine.last()?.id;
        Some(message(
            last,
            serde_json::to_string(&mine).unwrap_or_else(|_| "[]".into()),
        ))
    }
}

/// Server-Sent Events: each message the events of one window of the feed
/// (JSON, as `tinkerbox events` prints them), its id the newest one's, so
/// a reconnecting EventSource resumes where it was (`Last-Event-ID`).
async fn stream(
    State(ui): State<Shared>,
    headers: axum::http::HeaderMap,
    Query(q): Query<StreamQuery>,
) -> Response {
    let follow = match Follow::parse(&q) {
        Ok(f) => f,
        Err(m) => return (StatusCode::BAD_REQUEST, m).into_response(),
    };
    let resume = headers
        .get("last-event-id")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<i64>().ok())
        .or(q.after);
    let mut rx = ui.app.feed.subscribe();
    let log = ui.app.event_log.clone();
    let s = async_stream(move |tx| async move {
        // The newest id seen (sent, or skipped as another machine's).
        let mut last: Option<i64> = resume;
        // Resume from the log first (what happened while away), then the
        // feed; a listener that lagged reads the gap from the log again.
        let mut catch_up = resume.is_some();
        loop {
            if let Some(after) = last.filter(|_| catch_up) {
                let rows = log
                    .query(&EventQuery {
                        machine: follow.machine(),
                        after: Some(after),
                        limit: 1000,
                    })
                    .await
                    .unwrap_or_default();
                if let Some(m) = follow.message(&rows, last)
                    && tx.send(Ok(m)).await.is_err()
                {
                    return;
                }
                if let Some(l) = rows.last() {
                    last = Some(l.id);
                }
                catch_up = false;
            }
            // A page that went away ends its task at once, not at the next
            // event (which, for one quiet machine, may never come).
            let got = tokio::select! {
                r = rx.recv() => r,
                _ = tx.closed() => return,
            };
            match got {
                Ok(w) => {
                    let (Some(first), Some(newest)) = (w.rows.first(), w.rows.last()) else {
                        continue;
                    };
                    let m = if follow == Follow::All && last.is_none_or(|l| l < first.id) {
                        // The common case: the feed's own serialization.
                        Some(message(newest.id, w.newest.clone()))
                    } else {
                        follow.message(&w.rows, last)
                    };
                    last = Some(last.map_or(newest.id, |x| x.max(newest.id)));
                    if let Some(m) = m
                        && tx.send(Ok(m)).await.is_err()
                    {
                        return;
                    }
                }
                Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => catch_up = true,
                Err(tokio::sync::broadcast::error::RecvError::Closed) => return,
            }
        }
    });
    Sse::new(s)
        .keep_alive(KeepAlive::new().interval(std::time::Duration::from_secs(15)))
        .into_response()
}

fn message(id: i64, json: String) -> SseEvent {
    SseEvent::default().id(id.to_string()).data(json)
}

/// A stream of what `f` sends on its channel (a bounded one: a slow page
/// holds its own task back, not the feed).
fn async_stream<F, Fut>(
    f: F,
) -> impl futures::Stream<Item = Result<SseEvent, std::convert::Infallible>>
where
    F: FnOnce(tokio::sync::mpsc::Sender<Result<SseEvent, std::convert::Infallible>>) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let (tx, rx) = tokio::sync::mpsc::channel(16);
    tokio::spawn(f(tx));
    tokio_stream::wrappers::ReceiverStream::new(rx)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q(machine: Option<&str>, machines: Option<&str>) -> StreamQuery {
        StreamQuery {
            machine: machine.map(String::from),
            machines: machines.map(String::from),
            after: None,
        }
    }

    fn ev(id: i64, machine: Option<(&str, &str)>) -> EventRow {
        EventRow {
            id,
            time: String::new(),
            namespace: machine.map(|m| m.0.to_string()),
            name: machine.map(|m| m.1.to_string()),
            mac: None,
            ip: None,
            kind: "dhcp.ack".into(),
            message: String::new(),
            fields: None,
        }
    }

    #[test]
    fn a_stream_follows_all_one_or_a_set_of_machines() {
        let all = Follow::parse(&q(None, None)).unwrap();
        let one = Follow::parse(&q(Some("lab/web-01"), None)).unwrap();
        let set = Follow::parse(&q(None, Some("lab/web-01,lab/web-02,"))).unwrap();
        let (a, b, c, none) = (
            ev(1, Some(("lab", "web-01"))),
            ev(2, Some(("lab", "web-02"))),
            ev(3, Some(("other", "web-01"))),
            ev(4, None),
        );
        assert!([&a, &b, &c, &none].iter().all(|e| all.keeps(e)));
        assert!(one.keeps(&a) && !one.keeps(&b) && !one.keeps(&c) && !one.keeps(&none));
        assert!(set.keeps(&a) && set.keeps(&b) && !set.keeps(&c) && !set.keeps(&none));
        assert_eq!(one.machine(), Some(Key::new("lab", "web-01")));
        assert_eq!(set.machine(), None);
        for bad in [
            q(Some("web-01"), None),
            q(Some("/x"), None),
            q(Some("a/b/c"), None),
            q(Some("a/b"), Some("a/b")),
            q(None, Some("a/b,nope")),
        ] {
            assert!(
                Follow::parse(&bad).is_err(),
                "{:?} {:?}",
                bad.machine,
                bad.machines
            );
        }
        let many = (0..=STREAM_MACHINES)
            .map(|i| format!("ns/m{i}"))
            .collect::<Vec<_>>()
            .join(",");
        assert!(Follow::parse(&q(None, Some(&many))).is_err());
    }

    #[test]
    fn a_message_has_the_newest_rows_it_follows_after_the_last_sent() {
        let rows: Vec<EventRow> = (1..=(WINDOW_ROWS as i64 + 30))
            .map(|id| ev(id, Some(("lab", if id % 2 == 0 { "even" } else { "odd" }))))
            .collect();
        let ids =
            |f: &Follow, after| -> Vec<i64> { f.sent(&rows, after).iter().map(|e| e.id).collect() };
        let all = Follow::All;
        assert!(ids(&all, Some(rows.len() as i64)).is_empty(), "nothing new");
        assert!(all.message(&rows, Some(rows.len() as i64)).is_none());
        assert!(all.message(&[], None).is_none());
        let newest = ids(&all, None);
        let n = crate::events::FEED_NEWEST;
        assert_eq!(newest.len(), n, "as many as the feed's own newest");
        assert_eq!(
            (newest[0], newest[n - 1]),
            (131 - n as i64, 130),
            "the newest, oldest first"
        );
        let set = Follow::Some([Key::new("lab", "odd"), Key::new("lab", "even")].into());
        assert_eq!(ids(&set, None).len(), WINDOW_ROWS);
        let odd = Follow::One(Key::new("lab", "odd"));
        assert_eq!(
            ids(&odd, Some(110)),
            vec![111, 113, 115, 117, 119, 121, 123, 125, 127, 129]
        );
    }
}
