//! Admin API for BMCs: apply Rufio documents and Secrets, read machines and
//! jobs (credentials never leave), and start the common jobs.
//!
//! ```text
//! POST /api/v1/bmc                               apply Machine, Secret, Job, Task documents
//! GET  /api/v1/bmc/machines[/{name}]             Machines with status (powerState, Contactable)
//! POST /api/v1/bmc/machines/{name}/power         {"action": "on|off|soft|cycle|reset|status"} -> Job
//! POST /api/v1/bmc/machines/{name}/bootdev       {"device": "pxe|disk|bios|cdrom", "persistent", "efi"} -> Job
//! POST /api/v1/bmc/machines/{name}/media         {"kind": "CD", "url": "http://..." | ""} -> Job (Redfish virtual media)
//! GET  /api/v1/bmc/jobs[/{name}]                 Jobs with per-task state
//! POST /api/v1/hardware/{name}/netboot           allowPXE on, power off, PXE once, power on -> Job
//! ```

use super::{ApiError, NsQuery, key};
use crate::app::App;
use crate::bmc::model::{self, Action, BootDeviceAction};
use crate::bmc::{BootDevice, PowerAction};
use crate::hardware::{FieldError, Key};
use crate::store::Outcome;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::routing::{get, post};
use axum::{Json, Router};
use bytes::Bytes;
use serde::Deserialize;
use serde_json::{Value, json};
use std::sync::Arc;

pub fn routes() -> Router<Arc<App>> {
    Router::new()
        .route("/api/v1/bmc", post(apply))
        .route("/api/v1/bmc/machines", get(machines))
        .route("/api/v1/bmc/machines/{name}", get(machine))
        .route("/api/v1/bmc/machines/{name}/power", post(power))
        .route("/api/v1/bmc/machines/{name}/bootdev", post(bootdev))
        .route("/api/v1/bmc/machines/{name}/media", post(media))
        .route("/api/v1/bmc/jobs", get(jobs))
        .route("/api/v1/bmc/jobs/{name}", get(job))
        .route("/api/v1/hardware/{name}/netboot", post(netboot))
}

async fn apply(
    State(app): State<Arc<App>>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<Value>, ApiError> {
    super::not_mirrored(&app, crate::kinds::Kind::Machine)?;
    let body = body.map_err(|e| ApiError::new(e.status(), e.body_text()))?;
    let text = std::str::from_utf8(&body)
        .map_err(|_| ApiError::bad_request(FieldError::new("", "body is not UTF-8")))?;
    let docs = super::documents(text, false).map_err(ApiError::bad_request)?;
    let many = docs.len() > 1;
    // Check everything first: a bad document changes nothing.
    let mut parsed = Vec::with_capacity(docs.len());
    for (i, d) in docs.into_iter().enumerate() {
        parsed.push(
            model::parse(d.doc)
                .map_err(|e| ApiError::bad_request(super::locate(e, i, d.line, many)))?,
        );
    }
    let outcomes = app.services.bmc.apply(&parsed).await?;
    let items: Vec<Value> = parsed
        .iter()
        .zip(outcomes)
        .map(|(d, outcome)| {
            let key = d.key();
            json!({"kind": d.kind(), "namespace": key.namespace, "name": key.name, "result": outcome})
        })
        .collect();
    Ok(Json(json!({ "items": items })))
}

fn with_status(row: crate::store::bmc::BmcMachineRow) -> Value {
    let mut doc = row.doc;
    doc["status"] = json!({
        "powerState": row.power_state,
        "conditions": row.contactable.into_iter().collect::<Vec<_>>(),
    });
    doc
}

async fn machines(
    State(app): State<Arc<App>>,
    Query(q): Query<NsQuery>,
) -> Result<Json<Value>, ApiError> {
    let items: Vec<Value> = app
        .store
        .bmc_machines(q.namespace.as_deref())
        .await?
        .into_iter()
        .map(with_status)
        .collect();
    let items = q.selected(items)?;
    Ok(Json(
        json!({"apiVersion": model::API_VERSION, "kind": "MachineList", "items": items}),
    ))
}

async fn machine(
    State(app): State<Arc<App>>,
    Path(name): Path<String>,
    Query(q): Query<NsQuery>,
) -> Result<Json<Value>, ApiError> {
    let k = key(name, q);
    match app.store.bmc_machine(&k).await? {
        Some(row) => Ok(Json(with_status(row))),
        None => Err(ApiError::new(
            StatusCode::NOT_FOUND,
            format!("BMC Machine {k} not found"),
        )),
    }
}

/// Store a job for a machine and wake the runner.
async fn start_job(
    app: &App,
    machine: &Key,
    what: &str,
    tasks: Vec<Action>,
) -> Result<Json<Value>, ApiError> {
    let key = app.services.bmc.start_job(machine, what, tasks).await?;
    Ok(Json(
        json!({"namespace": key.namespace, "name": key.name, "result": Outcome::Created}),
    ))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PowerBody {
    action: PowerAction,
}

async fn power(
    State(app): State<Arc<App>>,
    Path(name): Path<String>,
    Query(q): Query<NsQuery>,
    body: Result<Json<PowerBody>, axum::extract::rejection::JsonRejection>,
) -> Result<Json<Value>, ApiError> {
    let Json(b) =
        body.map_err(|e| ApiError::bad_request(FieldError::new("action", e.body_text())))?;
    let task = Action {
        power_action: Some(b.action),
        ..Action::default()
    };
    start_job(
        &app,
        &key(name, q),
        &format!("power-{}", b.action.as_str()),
        vec![task],
    )
    .await
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct BootBody {
    device: BootDevice,
    #[serde(default)]
    persistent: bool,
    #[serde(default)]
    efi: bool,
}

async fn bootdev(
    State(app): State<Arc<App>>,
    Path(name): Path<String>,
    Query(q): Query<NsQuery>,
    body: Result<Json<BootBody>, axum::extract::rejection::JsonRejection>,
) -> Result<Json<Value>, ApiError> {
    let Json(b) =
        body.map_err(|e| ApiError::bad_request(FieldError::new("device", e.body_text())))?;
    let task = Action {
        boot_device: Some(BootDeviceAction {
            device: b.device,
            persistent: b.persistent,
            efi_boot: b.efi,
        }),
        ..Action::default()
    };
    start_job(
        &app,
        &key(name, q),
        &format!("bootdev-{}", b.device.as_str()),
        vec![task],
    )
    .await
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct MediaBody {
    #[serde(default = "cd")]
    kind: model::MediaKind,
    /// Empty: eject.
    #[serde(default)]
    url: String,
}

fn cd() -> model::MediaKind {
    model::MediaKind::Cd
}

/// Insert an image into the BMC's virtual media, or eject it.
async fn media(
    State(app): State<Arc<App>>,
    Path(name): Path<String>,
    Query(q): Query<NsQuery>,
    body: Result<Json<MediaBody>, axum::extract::rejection::JsonRejection>,
) -> Result<Json<Value>, ApiError> {
    let Json(b) = body.map_err(|e| ApiError::bad_request(FieldError::new("url", e.body_text())))?;
    if !b.url.is_empty() {
        model::media_url(&b.url).map_err(|m| ApiError::bad_request(FieldError::new("url", m)))?;
    }
    let job = if b.url.is_empty() {
        "media-eject"
    } else {
        "media-insert"
    };
    let task = Action {
        virtual_media_action: Some(model::VirtualMediaAction {
            kind: b.kind,
            media_url: b.url,
        }),
        ..Action::default()
    };
    start_job(&app, &key(name, q), job, vec![task]).await
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct JobsQuery {
    state: Option<crate::store::bmc::State>,
}

async fn jobs(
    State(app): State<Arc<App>>,
    Query(q): Query<JobsQuery>,
) -> Result<Json<Value>, ApiError> {
    let items = app.store.jobs(q.state).await?;
    Ok(Json(json!({ "items": items })))
}

async fn job(
    State(app): State<Arc<App>>,
    Path(name): Path<String>,
    Query(q): Query<NsQuery>,
) -> Result<Json<Value>, ApiError> {
    let k = key(name, q);
    match app.store.job(&k).await? {
        Some(j) => Ok(Json(json!(j))),
        None => Err(ApiError::new(
            StatusCode::NOT_FOUND,
            format!("Job {k} not found"),
        )),
    }
}

/// Rufio's common job for a Hardware ([`crate::services::BmcService::netboot`]).
async fn netboot(
    State(app): State<Arc<App>>,
    Path(name): Path<String>,
    Query(q): Query<NsQuery>,
) -> Result<Json<Value>, ApiError> {
    let k = key(name, q);
    let s = &app.services;
    let job = s.bmc.netboot(&s.hardware, &k).await?;
    Ok(Json(
        json!({"namespace": job.namespace, "name": job.name, "result": Outcome::Created}),
    ))
}
