//! Metadata over HTTP: the caller's identity is its source IP (or, behind a
//! trusted proxy, the first untrusted address of X-Forwarded-For, walked
//! from the right); a machine can only ever read its own data.

use super::cache::{Cache, Entry, Read, Rendered};
use super::{VERSIONS, ec2_get, metadata_json, nocloud_meta_data, nocloud_network_config};
use crate::app::App;
use crate::events::{Event, Kind};
use crate::hardware::Key;
use crate::metrics::Metrics;
use axum::Router;
use axum::extract::{ConnectInfo, Path, Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, put};
use bytes::Bytes;
use ipnet::IpNet;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

const TOKEN: &str = "x-aws-ec2-metadata-token";
const TOKEN_TTL: &str = "x-aws-ec2-metadata-token-ttl-seconds";

/// The metadata routes' state: the app and its rendered answers.
pub struct Meta {
    pub app: Arc<App>,
    pub cache: Cache,
}

type St = State<Arc<Meta>>;

pub fn router<S: Clone + Send + Sync + 'static>(app: Arc<App>) -> Router<S> {
    router_with(app, Cache::default())
}

/// As [`router`], with a given cache (tests: a short event window).
pub fn router_with<S: Clone + Send + Sync + 'static>(app: Arc<App>, cache: Cache) -> Router<S> {
    Router::new()
        .route("/", get(versions))
        .route("/latest/api/token", put(new_token))
        .route("/{version}", get(ec2_index))
        .route("/{version}/", get(ec2_index))
        .route("/{version}/{*path}", get(ec2))
        .route("/metadata", get(metadata))
        .route("/cloud-init/meta-data", get(nocloud_meta))
        .route("/cloud-init/user-data", get(nocloud_user))
        .route("/cloud-init/vendor-data", get(nocloud_vendor))
        .route("/cloud-init/network-config", get(nocloud_network))
        .with_state(Arc::new(Meta { app, cache }))
}

/// The caller's address: the peer, unless the peer is a trusted proxy, in
/// which case X-Forwarded-For is walked from the right to the first address
/// that is not a trusted proxy.
pub fn client_ip(peer: IpAddr, headers: &HeaderMap, trusted: &[IpNet]) -> IpAddr {
    // A dual-stack listener sees IPv4 peers as ::ffff:a.b.c.d.
    let peer = peer.to_canonical();
    let is_trusted = |ip: &IpAddr| trusted.iter().any(|n| n.contains(ip));
    if !is_trusted(&peer) {
        return peer;
    }
    let hops: Vec<&str> = headers
        .get_all("x-forwarded-for")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(str::trim)
        .collect();
    let mut last = peer;
    for hop in hops.iter().rev() {
        match hop.parse::<IpAddr>().map(|ip| ip.to_canonical()) {
            Ok(ip) if is_trusted(&ip) => last = ip,
            Ok(ip) => return ip,
            // Garbage in the chain: stop at the last address we can vouch for.
            Err(_) => return last,
        }
    }
    last
}

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

const TEXT: HeaderValue = HeaderValue::from_static("text/plain; charset=utf-8");
const JSON: HeaderValue = HeaderValue::from_static("application/json");

fn reply(content_type: HeaderValue, body: Bytes) -> Response {
    let mut r = Response::new(axum::body::Body::from(body));
    r.headers_mut().insert(header::CONTENT_TYPE, content_type);
    r
}

fn reject(app: &App, code: StatusCode, why: String) -> Response {
    app.metrics.metadata(code.as_u16());
    tracing::debug!(%why, "metadata: refused");
    (code, format!("{why}\n")).into_response()
}

fn refuse(app: &App, code: StatusCode, why: String) -> Box<Response> {
    Box::new(reject(app, code, why))
}

/// Identify the caller and check its IMDSv2 token, if any (required when
/// `metadata.require_token`); its cached answers.
async fn caller(
    meta: &Meta,
    peer: SocketAddr,
    headers: &HeaderMap,
) -> Result<(IpAddr, Arc<Entry>), Box<Response>> {
    let app = &*meta.app;
    let ip = client_ip(peer.ip(), headers, &app.config.metadata.trusted_proxies);
    match headers.get(TOKEN).map(|t| t.to_str().unwrap_or("")) {
        Some(t) => {
            if let Err(e) = app.tokens.check(t, ip, now()) {
                return Err(refuse(
                    app,
                    StatusCode::UNAUTHORIZED,
                    format!("IMDSv2 token refused: {e:?}"),
                ));
            }
        }
        None if app.config.metadata.require_token => {
            return Err(refuse(
                app,
                StatusCode::UNAUTHORIZED,
                "a token is required: PUT /latest/api/token first".into(),
            ));
        }
        None => {}
    }
    // Only Hardware IPs make cache entries.
    let snap = app.inventory.snapshot();
    if let Some((m, iface)) = who(app, &snap, ip).await {
        return Ok((ip, meta.cache.entry(ip, m, iface)));
    }
    Err(refuse(
        app,
        StatusCode::NOT_FOUND,
        format!("no Hardware has IP {ip}"),
    ))
}

/// The Hardware interface the caller at `ip` is: the one with that
/// address, else (with the discovery pool on) one with no address of its
/// own (a BareMetalHost's) whose MAC the unexpired pool lease of `ip`
/// names.
async fn who<'s>(
    app: &App,
    snap: &'s crate::inventory::Snapshot,
    ip: IpAddr,
) -> Option<(
    &'s Arc<crate::hardware::Machine>,
    &'s crate::hardware::Interface,
)> {
    if let Some(found) = snap.by_ip(&ip) {
        return Some(found);
    }
    let mac = pool_mac(app, ip).await?;
    snap.by_mac(&mac).filter(|(_, i)| i.address.is_none())
}

/// The MAC whose discovery-pool lease holds `ip` now, if the pool is on:
/// a Hardware interface with no address of its own (a BareMetalHost's)
/// is the machine that DHCP gave it to. Only a miss of the snapshot gets
/// here (one indexed read).
async fn pool_mac(app: &App, ip: IpAddr) -> Option<crate::hardware::Mac> {
    let IpAddr::V4(v4) = ip.to_canonical() else {
        return None;
    };
    if !app.config.discovery.enabled {
        return None;
    }
    match app
        .store
        .discovery_lease_by_ip(v4, crate::clock::now_ms())
        .await
    {
        Ok(lease) => lease.map(|l| l.mac),
        Err(e) => {
            tracing::error!(error = %e, %ip, "metadata: discovery lease lookup failed");
            None
        }
    }
}

fn is_version(v: &str) -> bool {
    VERSIONS.contains(&v)
        || (v.len() == 10
            && v.bytes().enumerate().all(|(i, b)| {
                if i == 4 || i == 7 {
                    b == b'-'
                } else {
                    b.is_ascii_digit()
                }
            }))
}

/// A `metadata.read` event, at most one per IP and document per window
/// (the request counters stay exact).
fn record(meta: &Meta, e: &Entry, ip: IpAddr, what: Read, message: impl FnOnce() -> String) {
    if meta.cache.should_record(e, what) {
        meta.app.events.record(
            Event::new(Kind::MetadataRead, format!("metadata read: {}", message()))
                .machine(e.machine().key.clone())
                .ip(ip),
        );
    }
}

fn ok(app: &App, body: Bytes) -> Response {
    app.metrics.metadata(200);
    reply(TEXT, body)
}

async fn versions(State(meta): St) -> Response {
    ok(&meta.app, Bytes::from(VERSIONS.join("\n")))
}

async fn new_token(
    State(meta): St,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    headers: HeaderMap,
) -> Response {
    let app = &*meta.app;
    let trusted = &app.config.metadata.trusted_proxies;
    // As AWS: a token request relayed by an unknown proxy is refused.
    if headers.contains_key("x-forwarded-for")
        && !trusted
            .iter()
            .any(|n| n.contains(&peer.ip().to_canonical()))
    {
        return reject(
            app,
            StatusCode::FORBIDDEN,
            "X-Forwarded-For from an untrusted peer".into(),
        );
    }
    let ttl = headers
        .get(TOKEN_TTL)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    let ttl = match ttl {
        Some(t) if (1..=super::token::MAX_TTL).contains(&t) => t,
        _ => {
            return reject(
                app,
                StatusCode::BAD_REQUEST,
                format!("{TOKEN_TTL} must be 1-{}", super::token::MAX_TTL),
            );
        }
    };
    let ip = client_ip(peer.ip(), &headers, trusted);
    if who(app, &app.inventory.snapshot(), ip).await.is_none() {
        return reject(
            app,
            StatusCode::NOT_FOUND,
            format!("no Hardware has IP {ip}"),
        );
    }
    app.metrics.metadata(200);
    (
        [(TOKEN_TTL, ttl.to_string())],
        app.tokens.issue(ip, now(), ttl),
    )
        .into_response()
}

async fn ec2_index(
    State(meta): St,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    Path(version): Path<String>,
    req: Request,
) -> Response {
    serve_ec2(&meta, peer, req.headers(), &version, "").await
}

async fn ec2(
    State(meta): St,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    Path((version, path)): Path<(String, String)>,
    req: Request,
) -> Response {
    serve_ec2(&meta, peer, req.headers(), &version, &path).await
}

/// Everything under `/<version>/`: the index, `meta-data/...`,
/// `dynamic/...`, `user-data`, `vendor-data`.
async fn serve_ec2(
    meta: &Meta,
    peer: SocketAddr,
    headers: &HeaderMap,
    version: &str,
    path: &str,
) -> Response {
    let app = &*meta.app;
    if !is_version(version) {
        return reject(
            app,
            StatusCode::NOT_FOUND,
            format!("no API version {version:?}"),
        );
    }
    let (section, rest) = path.split_once('/').unwrap_or((path, ""));
    if matches!(section, "user-data" | "vendor-data") && rest.is_empty() {
        return data(meta, peer, headers, section, false).await;
    }
    let (ip, e) = match caller(meta, peer, headers).await {
        Ok(x) => x,
        Err(r) => return *r,
    };
    if section == "meta-data" && rest.trim_matches('/') == "instance-id" {
        record(meta, &e, ip, Read::InstanceId, || "instance-id".into());
    }
    let body = e.ec2(path, |src| match section {
        "" => {
            let mut items = vec!["dynamic/", "meta-data/"];
            if src.details.user_data.is_some() {
                items.push("user-data");
            }
            if src.details.vendor_data.is_some() {
                items.push("vendor-data");
            }
            Some(items.join("\n"))
        }
        "meta-data" => ec2_get(src, rest),
        "dynamic" => super::dynamic(src).get(rest).map(super::Node::render),
        _ => None,
    });
    match body {
        Some(b) => ok(app, b),
        None => reject(app, StatusCode::NOT_FOUND, format!("no {path}")),
    }
}

/// EC2 answers 404 when there is no user data; NoCloud wants every file
/// (a missing one costs cloud-init ~10 s of retries), so it gets an empty one.
async fn data(
    meta: &Meta,
    peer: SocketAddr,
    headers: &HeaderMap,
    which: &str,
    nocloud: bool,
) -> Response {
    let app = &*meta.app;
    let (ip, e) = match caller(meta, peer, headers).await {
        Ok(x) => x,
        Err(r) => return *r,
    };
    let (value, what) = match which {
        "user-data" => (
            e.user_data
                .get_or_init(|| e.source().details.user_data.clone().map(Bytes::from)),
            Read::UserData,
        ),
        _ => (
            e.vendor_data
                .get_or_init(|| e.source().details.vendor_data.clone().map(Bytes::from)),
            Read::VendorData,
        ),
    };
    match value {
        Some(v) => {
            record(meta, &e, ip, what, || which.to_string());
            ok(app, v.clone())
        }
        None if nocloud => ok(app, Bytes::new()),
        None => reject(
            app,
            StatusCode::NOT_FOUND,
            format!("Hardware {} has no {which}", e.machine().key),
        ),
    }
}

async fn metadata(
    State(meta): St,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    req: Request,
) -> Response {
    let (ip, e) = match caller(&meta, peer, req.headers()).await {
        Ok(x) => x,
        Err(r) => return *r,
    };
    record(&meta, &e, ip, Read::Metadata, || "/metadata".into());
    meta.app.metrics.metadata(200);
    // A `Value` always serialises.
    let body = e.metadata.get_or_init(|| {
        Bytes::from(serde_json::to_vec(&metadata_json(&e.source())).unwrap_or_default())
    });
    reply(JSON, body.clone())
}

async fn nocloud_meta(
    State(meta): St,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    req: Request,
) -> Response {
    let (ip, e) = match caller(&meta, peer, req.headers()).await {
        Ok(x) => x,
        Err(r) => return *r,
    };
    record(&meta, &e, ip, Read::NocloudMeta, || {
        format!(
            "NoCloud meta-data (instance-id {})",
            e.source().instance_id()
        )
    });
    let body = e
        .nocloud_meta
        .get_or_init(|| nocloud_meta_data(&e.source()).map(Bytes::from));
    rendered(&meta.app, &e, "meta-data", body)
}

async fn nocloud_user(
    State(meta): St,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    req: Request,
) -> Response {
    data(&meta, peer, req.headers(), "user-data", true).await
}

async fn nocloud_vendor(
    State(meta): St,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    req: Request,
) -> Response {
    data(&meta, peer, req.headers(), "vendor-data", true).await
}

async fn nocloud_network(
    State(meta): St,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    req: Request,
) -> Response {
    let (ip, e) = match caller(&meta, peer, req.headers()).await {
        Ok(x) => x,
        Err(r) => return *r,
    };
    record(&meta, &e, ip, Read::NocloudNetwork, || {
        "NoCloud network-config".into()
    });
    let body = e
        .nocloud_network
        .get_or_init(|| nocloud_network_config(e.machine()).map(Bytes::from));
    rendered(&meta.app, &e, "network-config", body)
}

/// A rendered NoCloud document, or a 500 that the log and the metrics show:
/// an empty document would look to cloud-init like a machine without one.
fn rendered(app: &App, e: &Entry, what: &str, body: &Rendered) -> Response {
    rendered_with(&app.metrics, &e.machine().key, what, body)
}

fn rendered_with(metrics: &Metrics, key: &Key, what: &str, body: &Rendered) -> Response {
    match body {
        Ok(b) => {
            metrics.metadata(200);
            reply(TEXT, b.clone())
        }
        Err(why) => {
            tracing::error!(hardware = %key, document = what, error = %why, "metadata: cannot render");
            metrics.metadata(500);
            (
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("cannot render {what}: {why}\n"),
            )
                .into_response()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A document that cannot be rendered is a 500 that the metrics count,
    /// not an empty body that cloud-init would take for the document.
    #[test]
    fn a_render_failure_is_an_error_not_an_empty_document() {
        let m = Metrics::new();
        let key = Key::new("default", "m1");
        let r = rendered_with(&m, &key, "meta-data", &Err("no YAML".into()));
        assert_eq!(r.status(), StatusCode::INTERNAL_SERVER_ERROR);
        let r = rendered_with(&m, &key, "meta-data", &Ok(Bytes::from_static(b"a: 1\n")));
        assert_eq!(r.status(), StatusCode::OK);
        let text = m.render();
        assert!(
            text.contains("tinkerbox_metadata_requests_total{code=\"500\"} 1"),
            "{text}"
        );
    }
}
