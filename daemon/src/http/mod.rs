//! The public, unauthenticated HTTP listener: iPXE scripts, iPXE binaries
//! for UEFI HTTP boot, artifacts (kernels, initrds), health and metrics.
//! A machine is identified by the MAC in the URL or by its source IP.

use crate::app::App;
use crate::events::{Event, Kind};
use crate::hardware::{Interface, Mac, Machine};
use crate::ipxe::{self, NoScript};
use crate::metrics::{Listener, Metrics, RequestLabels};
use axum::Router;
use axum::body::Body;
use axum::extract::{ConnectInfo, Path, Request, State};
use axum::http::{StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use serde_json::json;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;
use tower_http::services::ServeDir;

pub mod sendfile;

/// Read size for artifacts (kernels, initrds: large files).
const ARTIFACT_CHUNK: usize = 512 * 1024;

pub fn router(app: Arc<App>) -> Router {
    let metrics = app.metrics.clone();
    let artifacts = ServeDir::new(app.config.artifacts_dir())
        .append_index_html_on_directories(false)
        .precompressed_gzip()
        // Fewer, larger reads and writes than the 64 KiB default.
        .with_buf_chunk_size(ARTIFACT_CHUNK);
    let router = Router::new()
        .route("/healthz", get(healthz))
        .route("/metrics", get(metrics_text))
        .route("/auto.ipxe", get(script_by_ip))
        .route("/ipxe/script/{mac}/auto.ipxe", get(script_by_mac))
        .route("/ipxe/binary/{file}", get(binary))
        .route(
            "/metal3/v1/inspection/{namespace}/{name}/{token}",
            axum::routing::post(inspection_report).layer(axum::extract::DefaultBodyLimit::max(
                crate::metal3::details::REPORT_MAX_BYTES,
            )),
        )
        .route(
            "/metal3/v1/configdrive/{namespace}/{name}/{token}",
            get(config_drive),
        )
        .nest_service("/artifacts", artifacts)
        .merge(crate::metadata::http::router(app.clone()))
        .layer(middleware::from_fn_with_state(
            app.clone(),
            record_artifacts,
        ))
        .fallback(|| async { (StatusCode::NOT_FOUND, "not found\n") });
    counted(router, metrics, "public").with_state(app)
}

/// A BareMetalHost's inspection report, from the agent's `inspect`
/// action: taken when the URL's secret is the host's current inspection's
/// (Ironic's inspector takes its callback unauthenticated too; this one
/// needs the secret the Workflow carried).
async fn inspection_report(
    State(app): State<Arc<App>>,
    axum::extract::Path((namespace, name, token)): axum::extract::Path<(String, String, String)>,
    body: Result<bytes::Bytes, axum::extract::rejection::BytesRejection>,
) -> (StatusCode, String) {
    use crate::services::metal3::ReportError;
    let body = match body {
        Ok(b) => b,
        Err(e) => return (e.status(), format!("{}\n", e.body_text())),
    };
    let key = crate::hardware::Key::new(namespace, name);
    match app.services.metal3.report(&key, &token, &body).await {
        Ok(()) => (StatusCode::NO_CONTENT, String::new()),
        Err(e @ ReportError::Unknown) => (StatusCode::NOT_FOUND, format!("{e}\n")),
        Err(e @ ReportError::Invalid(_)) => (StatusCode::BAD_REQUEST, format!("{e}\n")),
        Err(e @ ReportError::Store(_)) => {
            tracing::warn!(host = %key, error = %e, "metal3: cannot keep an inspection report");
            (StatusCode::SERVICE_UNAVAILABLE, "try again\n".into())
        }
    }
}

/// A BareMetalHost's config drive (its user, network and meta data), for
/// the agent's `configdrive` action of the host's current provisioning.
async fn config_drive(
    State(app): State<Arc<App>>,
    axum::extract::Path((namespace, name, token)): axum::extract::Path<(String, String, String)>,
) -> axum::response::Response {
    use crate::services::metal3::ReportError;
    use axum::response::IntoResponse;
    let key = crate::hardware::Key::new(namespace, name);
    match app.services.metal3.config_drive(&key, &token).await {
        Ok(img) => (
            [(axum::http::header::CONTENT_TYPE, "application/octet-stream")],
            img,
        )
            .into_response(),
        Err(e @ ReportError::Unknown) => (StatusCode::NOT_FOUND, format!("{e}\n")).into_response(),
        Err(e @ ReportError::Invalid(_)) => {
            (StatusCode::UNPROCESSABLE_ENTITY, format!("{e}\n")).into_response()
        }
        Err(e @ ReportError::Store(_)) => {
            tracing::warn!(host = %key, error = %e, "metal3: cannot build a config drive");
            (StatusCode::SERVICE_UNAVAILABLE, "try again\n").into_response()
        }
    }
}

/// `router` with every answer counted in
/// `tinkerbox_http_requests_total{listener}`.
pub fn counted<S: Clone + Send + Sync + 'static>(
    router: Router<S>,
    metrics: Arc<Metrics>,
    listener: Listener,
) -> Router<S> {
    router.layer(middleware::from_fn(move |req: Request, next: Next| {
        let metrics = metrics.clone();
        async move {
            let resp = next.run(req).await;
            count(&metrics, listener, resp.status());
            resp
        }
    }))
}

pub fn count(metrics: &Metrics, listener: Listener, status: StatusCode) {
    metrics
        .http_requests
        .get_or_create(&RequestLabels {
            listener,
            code: status.as_u16(),
        })
        .inc();
}

/// Healthy when the store answers within a second. In Kubernetes mode a
/// second line says whether the mirror is current; a stale mirror is still
/// healthy (the boot path serves from it), so the line only reports it.
async fn healthz(State(app): State<Arc<App>>) -> impl IntoResponse {
    health(&app).await
}

/// `/healthz`'s answer (also the web UI dashboard's health lines).
pub async fn health(app: &App) -> (StatusCode, String) {
    match tokio::time::timeout(Duration::from_secs(1), app.store.ping()).await {
        Ok(Ok(())) => {
            let kube = app.kube.as_ref().map(|s| {
                let r = s.report();
                let role = if s.leading.get() {
                    "leader: the engines run here"
                } else {
                    "follower: serving only"
                };
                let mirror = match (r.current, r.age_seconds) {
                    (true, _) => "kube: current\n".to_string(),
                    (false, Some(age)) => format!(
                        "kube: stale for {age:.0}s, serving the last mirror ({})\n",
                        r.error.as_deref().unwrap_or("reconnecting")
                    ),
                    (false, None) => format!(
                        "kube: not yet listed ({}), serving the stored mirror\n",
                        r.error.as_deref().unwrap_or("connecting")
                    ),
                };
                format!("{mirror}kube: {role}\n")
            });
            (
                StatusCode::OK,
                format!(
                    "ok\n{}{}",
                    kube.unwrap_or_default(),
                    discovery_health(app).unwrap_or_default()
                ),
            )
        }
        Ok(Err(e)) => (StatusCode::SERVICE_UNAVAILABLE, format!("store: {e}\n")),
        Err(_) => (
            StatusCode::SERVICE_UNAVAILABLE,
            "store: no answer within 1s\n".into(),
        ),
    }
}

/// The discovery pool's line (and a warning when it has no free address)
/// when DHCP leases from it. An exhausted pool is reported, not unhealthy:
/// every known machine is still served.
fn discovery_health(app: &App) -> Option<String> {
    let (c, d) = (&app.config, &app.config.discovery);
    let range = d
        .pool
        .filter(|_| d.enabled && c.dhcp.mode == crate::dhcp::Mode::Reservation)?;
    let m = &app.metrics;
    let leased = m.discovery_pool("leased");
    let mut out = format!("discovery pool: {leased} of {} leased\n", range.size());
    if m.discovery_pool("free") == 0 {
        out.push_str(&format!(
            "warning: discovery pool exhausted: no free address for a new machine ({} declined, {} reserved by Hardware)\n",
            m.discovery_pool("declined"),
            m.discovery_pool("reserved"),
        ));
    }
    Some(out)
}

async fn metrics_text(State(app): State<Arc<App>>) -> impl IntoResponse {
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        app.metrics.render(),
    )
}

fn not_found(app: &App, what: &'static str, why: String) -> Response {
    tracing::info!(what, reason = %why, "http: not served");
    app.metrics.boot(what, 404);
    (StatusCode::NOT_FOUND, format!("{why}\n")).into_response()
}

async fn script_by_mac(
    State(app): State<Arc<App>>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    Path(mac): Path<String>,
) -> Response {
    let Ok(mac) = mac.parse::<Mac>() else {
        return not_found(&app, "script", format!("{mac:?} is not a MAC address"));
    };
    let snap = app.inventory.snapshot();
    match snap.by_mac(&mac) {
        Some((m, iface)) => serve_script(&app, peer, m, iface),
        None if serves_unknown(&app) => serve_discovery_script(&app, peer, mac),
        None => not_found(&app, "script", format!("no Hardware has MAC {mac}")),
    }
}

/// Whether a MAC no Hardware has gets the default OSIE script: with
/// discovery on (any DHCP mode), or in auto-proxy mode, which boots every
/// netboot client.
fn serves_unknown(app: &App) -> bool {
    app.config.discovery.enabled || app.config.dhcp.mode == crate::dhcp::Mode::AutoProxy
}

/// The default OSIE script for a MAC no Hardware has (Smee's static one).
fn serve_discovery_script(app: &App, peer: SocketAddr, mac: Mac) -> Response {
    let ip = peer.ip().to_canonical();
    let text = ipxe::discovery_script(mac, &app.script_settings());
    app.metrics.boot("script", 200);
    app.events.record(
        Event::new(
            Kind::IpxeScript,
            format!("iPXE script sent to {ip} (no Hardware: the default OSIE)"),
        )
        .mac(mac)
        .ip(ip),
    );
    ([(header::CONTENT_TYPE, "text/plain; charset=utf-8")], text).into_response()
}

/// `/auto.ipxe`: the interface whose Hardware has the caller's IP.
async fn script_by_ip(
    State(app): State<Arc<App>>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
) -> Response {
    let ip = peer.ip().to_canonical();
    let snap = app.inventory.snapshot();
    if let Some((m, iface)) = snap.by_ip(&ip) {
        return serve_script(&app, peer, m, iface);
    }
    // A machine with a pool address: its lease names its MAC.
    if app.config.discovery.enabled
        && let IpAddr::V4(v4) = ip
    {
        match app
            .store
            .discovery_lease_by_ip(v4, crate::clock::now_ms())
            .await
        {
            Ok(Some(lease)) => return serve_discovery_script(&app, peer, lease.mac),
            Ok(None) => {}
            Err(e) => tracing::error!(error = %e, %ip, "http: discovery lease lookup failed"),
        }
    }
    not_found(&app, "script", format!("no Hardware has IP {ip}"))
}

fn serve_script(app: &App, peer: SocketAddr, m: &Machine, iface: &Interface) -> Response {
    let ip = peer.ip().to_canonical();
    let event = |kind, msg: String| {
        let mut e = Event::new(kind, msg).machine(m.key.clone()).ip(ip);
        if let Some(mac) = iface.mac {
            e = e.mac(mac);
        }
        app.events.record(e);
    };
    match ipxe::script(m, iface, &app.script_settings()) {
        Ok(text) => {
            app.metrics.boot("script", 200);
            event(Kind::IpxeScript, format!("iPXE script sent to {ip}"));
            ([(header::CONTENT_TYPE, "text/plain; charset=utf-8")], text).into_response()
        }
        Err(NoScript::NotAllowed) => {
            event(
                Kind::IpxeRefused,
                "iPXE script refused: netboot.allowPXE is not true".into(),
            );
            not_found(
                app,
                "script",
                format!(
                    "Hardware {} does not allow PXE for {}",
                    m.key,
                    iface.mac.map(|m| m.to_string()).unwrap_or_default()
                ),
            )
        }
        Err(NoScript::NoMac) => not_found(
            app,
            "script",
            format!("Hardware {} has no MAC for IP {ip}", m.key),
        ),
    }
}

/// iPXE binaries over HTTP, for UEFI HTTP-boot clients.
async fn binary(State(app): State<Arc<App>>, Path(file): Path<String>) -> Response {
    match app.files.get(&file) {
        Some(bytes) => {
            app.metrics.boot("binary", 200);
            (
                [(header::CONTENT_TYPE, "application/efi")],
                Body::from(bytes.clone()),
            )
                .into_response()
        }
        None => not_found(&app, "binary", format!("no iPXE binary {file:?}")),
    }
}

/// Artifact downloads of known machines go to their event log.
async fn record_artifacts(State(app): State<Arc<App>>, req: Request, next: Next) -> Response {
    if !req.uri().path().starts_with("/artifacts/") {
        return next.run(req).await;
    }
    let path = req.uri().path().to_string();
    let peer = req
        .extensions()
        .get::<ConnectInfo<SocketAddr>>()
        .map(|c| c.0);
    let range = req.headers().contains_key(header::RANGE);
    let resp = next.run(req).await;
    record_artifact(&app, peer, &path, range, resp.status());
    resp
}

/// What every artifact answer leaves behind, whichever path served it
/// (ServeDir through [`record_artifacts`], or [`sendfile`]): the boot
/// counter and, for a known machine (by source IP), an `http.artifact`
/// event. `path` is the request's path as sent (percent-encoded).
fn record_artifact(
    app: &App,
    peer: Option<SocketAddr>,
    path: &str,
    range: bool,
    status: StatusCode,
) {
    let code = status.as_u16();
    app.metrics.boot("artifact", code);
    if let Some(peer) = peer
        && let Some((m, _)) = app.inventory.snapshot().by_ip(&peer.ip().to_canonical())
    {
        let what = if status.is_success() {
            "sent"
        } else {
            "not sent"
        };
        app.events.record(
            Event::new(Kind::HttpArtifact, format!("{path} {what} ({code})"))
                .machine(m.key.clone())
                .ip(peer.ip().to_canonical())
                .fields(json!({"path": path, "status": code, "range": range})),
        );
    }
}
