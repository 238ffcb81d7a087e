//! Admin API for BMCs: apply Rufio documents and Secrets, read machines and
//! jobs (credentials never leave), and start the common jobs.
//!
//! ```text
//! POST /api/v1/bmc                               apply Machine, Secret, Job, Task documents
//! GET  /api/v1/bmc/machines[/{name}]             Machines with status (powerState, Contactable)
//! POST /api/v1/bmc/machines/{name}/power         {"action": "on|off|soft|cycle|reset|status"} -> Job
//! POST /api/v1/bmc/machines/{name}/bootdev       {"device": "pxe|disk|bios|cdrom", "persistent", "efi"} -> Job
//! GET  /api/v1/bmc/jobs[/{name}]                 Jobs with per-task state
//! POST /api/v1/hardware/{name}/netboot           allowPXE on, power off, PXE once, power on -> Job
//! ```

use super::{ApiError, NsQuery, key};
use crate::app::App;
use crate::bmc::model::{self, Action, BootDeviceAction, Doc};
use crate::bmc::{BootDevice, PowerAction};
use crate::hardware::{self, FieldError, Key};
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
        .route("/api/v1/bmc/jobs", get(jobs))
        .route("/api/v1/bmc/jobs/{name}", get(job))
        .route("/api/v1/hardware/{name}/netboot", post(netboot))
}

fn word<T: serde::Serialize>(v: &T) -> String {
    serde_json::to_value(v)
        .ok()
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_default()
}

async fn apply(
    State(app): State<Arc<App>>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<Value>, ApiError> {
    let body = body.map_err(|e| ApiError::new(e.status(), e.body_text()))?;
    let text = std::str::from_utf8(&body)
        .map_err(|_| ApiError::bad_request(FieldError::new("", "body is not UTF-8")))?;
    let docs = hardware::parse_documents(text).map_err(ApiError::bad_request)?;
    if docs.is_empty() {
        return Err(ApiError::bad_request(FieldError::new(
            "",
            "no documents in the request body",
        )));
    }
    let many = docs.len() > 1;
    // Check everything first: a bad document changes nothing.
    let mut parsed = Vec::with_capacity(docs.len());
    for (i, d) in docs.into_iter().enumerate() {
        parsed.push(model::parse(d).map_err(|e| {
            ApiError::bad_request(if many { e.within(&format!("[{i}]")) } else { e })
        })?);
    }
    let mut items = Vec::new();
    for d in parsed {
        let (kind, key, outcome) = match d {
            Doc::Secret { key, credentials } => (
                "Secret",
                key.clone(),
                app.store.upsert_secret(&key, &credentials).await?,
            ),
            Doc::Machine { key, doc, .. } => (
                "Machine",
                key.clone(),
                app.store.upsert_bmc_machine(&key, &doc).await?,
            ),
            Doc::Job { key, doc, spec } => {
                let m = Key::new(
                    spec.machine_ref
                        .namespace
                        .clone()
                        .unwrap_or_else(|| key.namespace.clone()),
                    spec.machine_ref.name.clone(),
                );
                let o = app
                    .store
                    .insert_job(&key, "Job", &doc, Some(&m), None, &spec.tasks)
                    .await?;
                ("Job", key, o)
            }
            Doc::Task {
                key,
                doc,
                connection,
                action,
            } => {
                let o = app
                    .store
                    .insert_job(&key, "Task", &doc, None, Some(&connection), &[action])
                    .await?;
                ("Task", key, o)
            }
        };
        items.push(
            json!({"kind": kind, "namespace": key.namespace, "name": key.name, "result": outcome}),
        );
    }
    app.bmc.wake.notify_one();
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
    if app.store.bmc_machine(machine).await?.is_none() {
        return Err(ApiError::new(
            StatusCode::NOT_FOUND,
            format!("BMC Machine {machine} not found"),
        ));
    }
    let name = format!("{}-{what}-{}", machine.name, crate::store::now_ms());
    let jkey = Key::new(machine.namespace.clone(), name.clone());
    let doc = json!({
        "apiVersion": model::API_VERSION, "kind": "Job",
        "metadata": {"name": name, "namespace": machine.namespace},
        "spec": {"machineRef": {"name": machine.name, "namespace": machine.namespace}, "tasks": tasks},
    });
    app.store
        .insert_job(&jkey, "Job", &doc, Some(machine), None, &tasks)
        .await?;
    app.bmc.wake.notify_one();
    Ok(Json(
        json!({"namespace": jkey.namespace, "name": jkey.name, "result": Outcome::Created}),
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
        &format!("power-{}", word(&b.action)),
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
        &format!("bootdev-{}", word(&b.device)),
        vec![task],
    )
    .await
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct JobsQuery {
    state: Option<String>,
}

async fn jobs(
    State(app): State<Arc<App>>,
    Query(q): Query<JobsQuery>,
) -> Result<Json<Value>, ApiError> {
    let items = app.store.jobs(q.state.as_deref()).await?;
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

/// Rufio's common job for a Hardware: allow PXE, power off, boot from the
/// network once (EFI when the Hardware says UEFI), power on.
async fn netboot(
    State(app): State<Arc<App>>,
    Path(name): Path<String>,
    Query(q): Query<NsQuery>,
) -> Result<Json<Value>, ApiError> {
    let k = key(name, q);
    let mut doc =
        app.store.get(&k).await?.ok_or_else(|| {
            ApiError::new(StatusCode::NOT_FOUND, format!("Hardware {k} not found"))
        })?;
    let hw = hardware::validate(doc.clone()).map_err(ApiError::bad_request)?;
    let bmc = hw
        .machine
        .spec
        .bmc_ref
        .as_ref()
        .map(|r| Key::new(k.namespace.clone(), r.name.clone()))
        .ok_or_else(|| {
            ApiError::bad_request(FieldError::new(
                "spec.bmcRef",
                format!("Hardware {k} has no bmcRef"),
            ))
        })?;
    let efi = hw
        .machine
        .spec
        .interfaces
        .iter()
        .any(|i| i.dhcp.as_ref().and_then(|d| d.uefi) == Some(true));
    // allowPXE on every interface that netboots.
    if let Some(Value::Array(ifaces)) = doc.pointer_mut("/spec/interfaces") {
        for i in ifaces.iter_mut().filter(|i| i.get("dhcp").is_some()) {
            i["netboot"]["allowPXE"] = Value::Bool(true);
        }
    }
    let hw = hardware::validate(doc).map_err(ApiError::bad_request)?;
    app.apply(vec![hw]).await?;
    let tasks = vec![
        Action {
            power_action: Some(PowerAction::Off),
            ..Action::default()
        },
        Action {
            boot_device: Some(BootDeviceAction {
                device: BootDevice::Pxe,
                persistent: false,
                efi_boot: efi,
            }),
            ..Action::default()
        },
        Action {
            power_action: Some(PowerAction::On),
            ..Action::default()
        },
    ];
    app.events.record(
        crate::events::Event::new(
            "bmc.netboot",
            format!("netboot requested through BMC {bmc}"),
        )
        .machine(k.clone()),
    );
    start_job(&app, &bmc, "netboot", tasks).await
}
