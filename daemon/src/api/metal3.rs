//! Metal3's BareMetalHosts and HardwareData (host mode; applied through
//! `POST /api/v1/apply`).
//!
//! ```text
//! GET    /api/v1/baremetalhosts[?namespace=NS]          BareMetalHostList, each with its status
//! GET    /api/v1/baremetalhosts/{name}[?namespace=NS]
//! DELETE /api/v1/baremetalhosts/{name}[?namespace=NS]   202: the host is taken down, then goes
//! POST   /api/v1/baremetalhosts/claim                   {selector, image, userData, consumer, namespace}: one available host claimed
//! POST   /api/v1/baremetalhosts/{name}/release[?namespace=NS]   its image cleared (it deprovisions); once available, its consumer
//! GET    /api/v1/hardwaredata[?namespace=NS]            HardwareDataList
//! GET    /api/v1/hardwaredata/{name}[?namespace=NS]
//! ```

use super::{ApiError, NsQuery, found, key, query};
use crate::app::App;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::{Value, json};
use std::sync::Arc;

pub fn routes() -> Router<Arc<App>> {
    Router::new()
        .route("/api/v1/baremetalhosts", get(hosts))
        .route(
            "/api/v1/baremetalhosts/{name}",
            get(host).delete(delete_host),
        )
        .route("/api/v1/baremetalhosts/claim", post(claim))
        .route("/api/v1/baremetalhosts/{name}/release", post(release))
        .route("/api/v1/hardwaredata", get(datas))
        .route("/api/v1/hardwaredata/{name}", get(data))
}

/// In kube mode BareMetalHosts are the cluster's (mirrored when
/// `kube.metal3` is on): changed there, as CAPM3 and users of BMO do.
pub(crate) fn host_mode(app: &App) -> Result<(), ApiError> {
    if app.kube.is_some() {
        return Err(ApiError::new(
            StatusCode::FORBIDDEN,
            "BareMetalHosts are the Kubernetes cluster's ([kube] enabled; tinkerbox is their operator \
             with kube.metal3 = true): change them there, e.g. kubectl apply -f FILE, kubectl patch bmh NAME, \
             kubectl delete bmh NAME",
        ));
    }
    Ok(())
}

async fn hosts(
    State(app): State<Arc<App>>,
    q: Result<Query<NsQuery>, QueryRejection>,
) -> Result<Json<Value>, ApiError> {
    let q = query(q)?;
    let rows = app.store.hosts(q.namespace.as_deref()).await?;
    let items = q.selected(rows.iter().map(|r| r.with_status()).collect())?;
    Ok(Json(
        json!({"apiVersion": crate::metal3::API_VERSION, "kind": "BareMetalHostList", "items": items}),
    ))
}

async fn host(
    State(app): State<Arc<App>>,
    Path(name): Path<String>,
    q: Result<Query<NsQuery>, QueryRejection>,
) -> Result<Json<Value>, ApiError> {
    let k = key(name, query(q)?);
    found(app.store.host(&k).await?, crate::metal3::KIND, &k).map(|r| Json(r.with_status()))
}

async fn delete_host(
    State(app): State<Arc<App>>,
    Path(name): Path<String>,
    q: Result<Query<NsQuery>, QueryRejection>,
) -> Result<(StatusCode, Json<Value>), ApiError> {
    host_mode(&app)?;
    let k = key(name, query(q)?);
    let existed = app.services.metal3.delete(&k).await?;
    found(existed.then_some(()), crate::metal3::KIND, &k)?;
    Ok((
        StatusCode::ACCEPTED,
        Json(json!({"namespace": k.namespace, "name": k.name, "result": "deleting"})),
    ))
}

async fn claim(
    State(app): State<Arc<App>>,
    body: Result<Json<crate::services::metal3::Claim>, axum::extract::rejection::JsonRejection>,
) -> Result<Json<Value>, ApiError> {
    // Kube mode too: the service makes the change in the cluster.
    let Json(c) = body.map_err(|e| ApiError::new(StatusCode::BAD_REQUEST, e.body_text()))?;
    let done = app.services.metal3.claim(&c).await?;
    Ok(Json(serde_json::to_value(done).unwrap_or_default()))
}

async fn release(
    State(app): State<Arc<App>>,
    Path(name): Path<String>,
    q: Result<Query<NsQuery>, QueryRejection>,
) -> Result<Json<Value>, ApiError> {
    let k = key(name, query(q)?);
    let done = app.services.metal3.release(&k).await?;
    Ok(Json(serde_json::to_value(done).unwrap_or_default()))
}

async fn datas(
    State(app): State<Arc<App>>,
    q: Result<Query<NsQuery>, QueryRejection>,
) -> Result<Json<Value>, ApiError> {
    let q = query(q)?;
    let items = q.selected(app.store.hardware_datas(q.namespace.as_deref()).await?)?;
    Ok(Json(
        json!({"apiVersion": crate::metal3::API_VERSION, "kind": "HardwareDataList", "items": items}),
    ))
}

async fn data(
    State(app): State<Arc<App>>,
    Path(name): Path<String>,
    q: Result<Query<NsQuery>, QueryRejection>,
) -> Result<Json<Value>, ApiError> {
    let k = key(name, query(q)?);
    found(
        app.store.hardware_data(&k).await?,
        crate::metal3::HARDWARE_DATA_KIND,
        &k,
    )
    .map(Json)
}
