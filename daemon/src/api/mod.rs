//! The admin API: JSON under `/api/v1/`, bearer token on every request.
//!
//! ```text
//! GET    /api/v1/hardware[?namespace=NS]          HardwareList (all namespaces by default)
//! POST   /api/v1/hardware                          apply one or many documents (JSON or YAML), atomically
//! GET    /api/v1/hardware/{name}[?namespace=NS]    one Hardware, as applied
//! DELETE /api/v1/hardware/{name}[?namespace=NS]
//! GET    /api/v1/events[?namespace=NS&name=N&after=ID&limit=N]
//! ```
//! BMC documents: [`bmc`]; Templates, Workflows and `POST /api/v1/apply`
//! (any kind): [`tink`]; the discovery pool's leases: [`discovery`];
//! BareMetalHosts and HardwareData: [`metal3`].
//! Errors are `{"error": "...", "field": "spec.interfaces[0].dhcp.mac"}` with
//! 400 (bad input), 401 (token), 404, 409 (MAC/IP owned by another
//! Hardware, with `"conflict": "ns/name"`), 413 (body too large).

pub mod bmc;
pub mod discovery;
pub mod metal3;
pub mod tink;

use crate::app::App;
use crate::events::EventQuery;
use crate::hardware::{self, DEFAULT_NAMESPACE, FieldError, Key};
use crate::store::{Outcome, StoreError};
use axum::extract::rejection::{BytesRejection, QueryRejection};
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

/// Largest request body accepted: an inventory of ~100,000 machines in
/// one atomic apply (a typical Hardware is ~0.5 KiB of YAML). The YAML
/// parser's limits scale with the body ([`hardware::documents`]).
pub const BODY_LIMIT: usize = 64 << 20;

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
            e @ StoreError::Stale { .. } => ApiError::new(StatusCode::CONFLICT, e.to_string()),
            other => {
                tracing::error!(error = %other, "store error");
                ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, other.to_string())
            }
        }
    }
}

impl From<crate::events::log::Error> for ApiError {
    fn from(e: crate::events::log::Error) -> Self {
        tracing::error!(error = %e, "event log error");
        ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, e.to_string())
    }
}

impl From<crate::services::Error> for ApiError {
    fn from(e: crate::services::Error) -> Self {
        use crate::services::Error;
        match e {
            Error::Invalid(f) => ApiError::bad_request(f),
            Error::NotFound(what) => {
                ApiError::new(StatusCode::NOT_FOUND, format!("{what} not found"))
            }
            Error::Store(s) => s.into(),
            Error::Cluster(crate::services::cluster::ClusterError::Invalid(f)) => {
                ApiError::bad_request(f)
            }
            Error::Cluster(e @ crate::services::cluster::ClusterError::NotFound(_)) => {
                ApiError::new(StatusCode::NOT_FOUND, e.to_string())
            }
            Error::Cluster(e) => ApiError::new(StatusCode::SERVICE_UNAVAILABLE, e.to_string()),
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
        .merge(tink::routes())
        .merge(discovery::routes())
        .merge(metal3::routes())
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
    /// kubectl's `-l`: lists keep only the objects whose labels it selects.
    #[serde(rename = "labelSelector")]
    pub(crate) label_selector: Option<String>,
}

impl NsQuery {
    /// `items` the label selector keeps (all, without one); 400 for a
    /// selector that does not parse.
    pub(crate) fn selected(&self, items: Vec<Value>) -> Result<Vec<Value>, ApiError> {
        let Some(s) = self
            .label_selector
            .as_deref()
            .filter(|s| !s.trim().is_empty())
        else {
            return Ok(items);
        };
        let sel = crate::labels::parse(s).map_err(|m| ApiError::new(StatusCode::BAD_REQUEST, m))?;
        Ok(items
            .into_iter()
            .filter(|d| crate::labels::selects(&sel, d))
            .collect())
    }
}

async fn list_hardware(
    State(app): State<Arc<App>>,
    q: Result<Query<NsQuery>, QueryRejection>,
) -> Result<Json<Value>, ApiError> {
    let q = query(q)?;
    let items = q.selected(app.store.list(q.namespace.as_deref()).await?)?;
    Ok(Json(json!({
        "apiVersion": hardware::API_VERSION,
        "kind": "HardwareList",
        "items": items,
    })))
}

/// The query string, or 400 saying what is wrong with it.
pub(crate) fn query<T>(q: Result<Query<T>, QueryRejection>) -> Result<T, ApiError> {
    q.map(|Query(q)| q)
        .map_err(|e| ApiError::new(StatusCode::BAD_REQUEST, e.body_text()))
}

/// A named object, or 404 naming it (`Hardware default/m1 not found`).
pub(crate) fn found<T>(v: Option<T>, kind: &str, k: &Key) -> Result<T, ApiError> {
    v.ok_or_else(|| crate::services::Error::NotFound(format!("{kind} {k}")).into())
}

/// What a DELETE answers: the name, or 404.
pub(crate) fn deleted(gone: bool, kind: &str, k: Key) -> Result<Json<Value>, ApiError> {
    found(gone.then_some(()), kind, &k)?;
    Ok(Json(
        json!({"namespace": k.namespace, "name": k.name, "result": "deleted"}),
    ))
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
    q: Result<Query<NsQuery>, QueryRejection>,
) -> Result<Json<Value>, ApiError> {
    let k = key(name, query(q)?);
    found(app.store.get(&k).await?, "Hardware", &k).map(Json)
}

async fn delete_hardware(
    State(app): State<Arc<App>>,
    Path(name): Path<String>,
    q: Result<Query<NsQuery>, QueryRejection>,
) -> Result<Json<Value>, ApiError> {
    let k = key(name, query(q)?);
    not_mirrored(&app, crate::kinds::Kind::Hardware)?;
    deleted(app.services.hardware.delete(&k).await?, "Hardware", k)
}

/// In Kubernetes mode the cluster is the truth for the kinds tinkerbox
/// mirrors from it: a change here would be undone by the next watch event.
pub(crate) fn not_mirrored(app: &App, kind: crate::kinds::Kind) -> Result<(), ApiError> {
    if app.kube.is_none() {
        return Ok(());
    }
    let name = crate::kube::mirror::kind_name(kind);
    let resource = crate::kube::mirror::resource(kind);
    let plural = if resource.group.is_empty() {
        resource.plural
    } else {
        format!("{}.{}", resource.plural, resource.group)
    };
    Err(ApiError::new(
        StatusCode::FORBIDDEN,
        format!(
            "{name} is mirrored from the Kubernetes cluster ([kube] enabled): change it there, \
             e.g. kubectl apply -f FILE, kubectl delete {plural} NAME -n NAMESPACE"
        ),
    ))
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
    not_mirrored(&app, crate::kinds::Kind::Hardware)?;
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
    let docs = documents(text, is_json).map_err(reject)?;
    let many = docs.len() > 1;
    let mut items = Vec::with_capacity(docs.len());
    for (i, d) in docs.into_iter().enumerate() {
        let hw = hardware::validate(d.doc).map_err(|e| reject(locate(e, i, d.line, many)))?;
        items.push(hw);
    }
    let applied = app.services.hardware.apply(items).await?;
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

/// The documents of a request body: JSON (one document, an array or a
/// `kind: *List`) or a YAML stream; each with its line when YAML.
pub(crate) fn documents(text: &str, is_json: bool) -> Result<Vec<hardware::Located>, FieldError> {
    let docs = if is_json {
        let v: Value = serde_json::from_str(text).map_err(|e| {
            FieldError::new(
                "",
                format!(
                    "malformed JSON at line {}, column {}: {e}",
                    e.line(),
                    e.column()
                ),
            )
        })?;
        hardware::expand_lists(v)
            .into_iter()
            .map(|doc| hardware::Located { line: 0, doc })
            .collect()
    } else {
        hardware::parse_located(text)?
    };
    if docs.is_empty() {
        return Err(FieldError::new("", "no documents in the request body"));
    }
    Ok(docs)
}

/// An error in document `i` of a body says which and where.
pub(crate) fn locate(e: FieldError, i: usize, line: u64, many: bool) -> FieldError {
    if many { e.at_document(i, line) } else { e }
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
    q: Result<Query<EventsQuery>, QueryRejection>,
) -> Result<Json<Value>, ApiError> {
    let q = query(q)?;
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
        .event_log
        .query(&EventQuery {
            machine,
            after: q.after,
            limit,
        })
        .await?;
    Ok(Json(json!({ "items": rows })))
}
