//! The admin API: JSON under `/api/v1/`, bearer token on every request.
//!
//! ```text
//! GET    /api/v1/hardware[?namespace=NS]          HardwareList (all namespaces by default)
//! POST   /api/v1/hardware                          apply one or many documents (JSON or YAML), atomically
//! GET    /api/v1/hardware/{name}[?namespace=NS]    one Hardware, as applied
//! DELETE /api/v1/hardware/{name}[?namespace=NS]
//! GET    /api/v1/events[?namespace=NS&name=N&after=ID&limit=N]
//! ```
//! Errors are `{"error": "...", "field": "spec.interfaces[0].dhcp.mac"}` with
//! 400 (bad input), 401 (token), 404, 409 (MAC/IP owned by another
//! Hardware, with `"conflict": "ns/name"`), 413 (body too large).

pub mod bmc;

use crate::app::App;
use crate::hardware::{self, DEFAULT_NAMESPACE, FieldError, Key};
use crate::store::{EventQuery, Outcome, StoreError};
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, Path, Query, Request, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use bytes::Bytes;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use std::sync::Arc;

/// Largest request body accepted; a Hardware document is a few KiB.
pub const BODY_LIMIT: usize = 4 << 20;

#[derive(Debug)]
pub struct ApiError {
    status: StatusCode,
    body: Value,
}

impl ApiError {
    pub fn new(status: StatusCode, msg: impl Into<String>) -> Self {
        ApiError {
            status,
            body: json!({"error": msg.into()}),
        }
    }

    pub fn bad_request(e: FieldError) -> Self {
        let msg = e.to_string();
        let mut body = json!({"error": msg});
        if !e.field.is_empty() {
            body["field"] = json!(e.field);
        }
        ApiError {
            status: StatusCode::BAD_REQUEST,
            body,
        }
    }
}

impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::Conflict {
                field,
                message,
                owner,
            } => ApiError {
                status: StatusCode::CONFLICT,
                body: json!({"error": format!("{field}: {message}"), "field": field,
                             "conflict": owner.to_string()}),
            },
            other => {
                tracing::error!(error = %other, "store error");
                ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, other.to_string())
            }
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.status, Json(self.body)).into_response()
    }
}

pub fn router(app: Arc<App>, token: Arc<str>) -> Router {
    let metrics = app.metrics.clone();
    Router::new()
        .route("/api/v1/hardware", get(list_hardware).post(apply_hardware))
        .route(
            "/api/v1/hardware/{name}",
            get(get_hardware).delete(delete_hardware),
        )
        .route("/api/v1/events", get(events))
        .merge(bmc::routes())
        .fallback(|| async { ApiError::new(StatusCode::NOT_FOUND, "no such endpoint") })
        .layer(DefaultBodyLimit::max(BODY_LIMIT))
        .layer(middleware::from_fn_with_state(token, auth))
        .layer(middleware::from_fn(move |req: Request, next: Next| {
            let metrics = metrics.clone();
            async move {
                let resp = next.run(req).await;
                crate::http::count(&metrics, "api", resp.status());
                resp
            }
        }))
        .with_state(app)
}

async fn auth(State(token): State<Arc<str>>, req: Request, next: Next) -> Response {
    let presented = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim);
    match presented {
        Some(t) if constant_time_eq::constant_time_eq(t.as_bytes(), token.as_bytes()) => {
            next.run(req).await
        }
        _ => {
            let mut r = ApiError::new(
                StatusCode::UNAUTHORIZED,
                "missing or wrong bearer token (Authorization: Bearer <state_dir/api-token>)",
            )
            .into_response();
            r.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                header::HeaderValue::from_static("Bearer"),
            );
            r
        }
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct NsQuery {
    pub(crate) namespace: Option<String>,
}

async fn list_hardware(
    State(app): State<Arc<App>>,
    q: Result<Query<NsQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<Value>, ApiError> {
    let Query(q) = q.map_err(|e| ApiError::new(StatusCode::BAD_REQUEST, e.body_text()))?;
    let items = app.store.list(q.namespace.as_deref()).await?;
    Ok(Json(json!({
        "apiVersion": hardware::API_VERSION,
        "kind": "HardwareList",
        "items": items,
    })))
}

pub(crate) fn key(name: String, q: NsQuery) -> Key {
    Key::new(
        q.namespace.unwrap_or_else(|| DEFAULT_NAMESPACE.into()),
        name,
    )
}

async fn get_hardware(
    State(app): State<Arc<App>>,
    Path(name): Path<String>,
    q: Result<Query<NsQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<Value>, ApiError> {
    let Query(q) = q.map_err(|e| ApiError::new(StatusCode::BAD_REQUEST, e.body_text()))?;
    let k = key(name, q);
    match app.store.get(&k).await? {
        Some(doc) => Ok(Json(doc)),
        None => Err(ApiError::new(
            StatusCode::NOT_FOUND,
            format!("Hardware {k} not found"),
        )),
    }
}

async fn delete_hardware(
    State(app): State<Arc<App>>,
    Path(name): Path<String>,
    q: Result<Query<NsQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<Value>, ApiError> {
    let Query(q) = q.map_err(|e| ApiError::new(StatusCode::BAD_REQUEST, e.body_text()))?;
    let k = key(name, q);
    if app.delete(&k).await? {
        Ok(Json(
            json!({"namespace": k.namespace, "name": k.name, "result": "deleted"}),
        ))
    } else {
        Err(ApiError::new(
            StatusCode::NOT_FOUND,
            format!("Hardware {k} not found"),
        ))
    }
}

#[derive(Serialize)]
struct Applied {
    namespace: String,
    name: String,
    result: Outcome,
}

async fn apply_hardware(
    State(app): State<Arc<App>>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let body = body.map_err(|e| {
        let status = e.status();
        let msg = if status == StatusCode::PAYLOAD_TOO_LARGE {
            format!("request body larger than {} MiB", BODY_LIMIT >> 20)
        } else {
            e.body_text()
        };
        ApiError::new(status, msg)
    })?;
    let reject = |e: FieldError| {
        app.metrics.applied("rejected");
        ApiError::bad_request(e)
    };
    let text =
        std::str::from_utf8(&body).map_err(|_| reject(FieldError::new("", "body is not UTF-8")))?;
    let is_json = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/json"));
    let docs = if is_json {
        let v: Value = serde_json::from_str(text)
            .map_err(|e| reject(FieldError::new("", format!("malformed JSON: {e}"))))?;
        hardware::expand_lists(vec![v])
    } else {
        hardware::parse_documents(text).map_err(reject)?
    };
    if docs.is_empty() {
        return Err(reject(FieldError::new(
            "",
            "no documents in the request body",
        )));
    }
    let many = docs.len() > 1;
    let mut items = Vec::with_capacity(docs.len());
    for (i, d) in docs.into_iter().enumerate() {
        let hw = hardware::validate(d)
            .map_err(|e| reject(if many { e.within(&format!("[{i}]")) } else { e }))?;
        items.push(hw);
    }
    let applied = app.apply(items).await?;
    let created = applied.iter().any(|(_, o)| *o == Outcome::Created);
    let items: Vec<Applied> = applied
        .into_iter()
        .map(|(k, result)| Applied {
            namespace: k.namespace,
            name: k.name,
            result,
        })
        .collect();
    let status = if created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    Ok((status, Json(json!({ "items": items }))).into_response())
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct EventsQuery {
    namespace: Option<String>,
    name: Option<String>,
    after: Option<i64>,
    limit: Option<u32>,
}

async fn events(
    State(app): State<Arc<App>>,
    q: Result<Query<EventsQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<Value>, ApiError> {
    let Query(q) = q.map_err(|e| ApiError::new(StatusCode::BAD_REQUEST, e.body_text()))?;
    let machine = match (q.name, q.namespace) {
        (Some(n), ns) => Some(Key::new(ns.unwrap_or_else(|| DEFAULT_NAMESPACE.into()), n)),
        (None, Some(_)) => {
            return Err(ApiError::bad_request(FieldError::new(
                "namespace",
                "needs name as well",
            )));
        }
        (None, None) => None,
    };
    let limit = q.limit.unwrap_or(100);
    if limit == 0 || limit > 10_000 {
        return Err(ApiError::bad_request(FieldError::new(
            "limit",
            "must be 1-10000",
        )));
    }
    let rows = app
        .store
        .events(&EventQuery {
            machine,
            after: q.after,
            limit,
        })
        .await?;
    Ok(Json(json!({ "items": rows })))
}
