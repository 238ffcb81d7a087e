//! Kube mode with Tink native: only the leader answers the worker API,
//! because only its answers are made durable in the cluster before they
//! are given. A machine talks to whichever instance it booted from, so a
//! follower passes each call through to the leader (its address is on the
//! Lease) as it came, HTTP/2 frames and trailers unchanged, and the leader
//! answers. With no leader known, or the leader not answering, the worker
//! gets `Unavailable` and asks again with its backoff; nothing is ever
//! answered from a follower's own copy.

use crate::kube::Sync;
use crate::kube::lead::Leader;
use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::Response;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tonic::transport::{Channel, Endpoint};
use tower::ServiceExt;

/// Set on a forwarded call: an instance that gets one and does not lead
/// answers `Unavailable` instead of forwarding again (no loops).
const FORWARDED: &str = "x-tinkerbox-forwarded";

/// A forwarded call's deadline; the worker's own is 30 s.
const CALL_TIMEOUT: Duration = Duration::from_secs(25);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);

pub struct Forwarder {
    sync: Arc<Sync>,
    /// The leader's channel, for the address it was made for.
    channel: Mutex<Option<(String, Channel)>>,
    /// The worker API is TLS here, and a follower cannot check another
    /// instance's certificate: it answers `Unavailable` instead.
    tls: bool,
}

impl Forwarder {
    pub fn new(sync: Arc<Sync>, tls: bool) -> Arc<Self> {
        Arc::new(Forwarder {
            sync,
            channel: Mutex::new(None),
            tls,
        })
    }

    fn channel(&self, address: &str) -> Result<Channel, String> {
        let mut c = self.channel.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((a, ch)) = c.as_ref()
            && a == address
        {
            return Ok(ch.clone());
        }
        let ch = Endpoint::from_shared(format!("http://{address}"))
            .map_err(|e| format!("the leader's address {address:?}: {e}"))?
            .connect_timeout(CONNECT_TIMEOUT)
            .timeout(CALL_TIMEOUT)
            .tcp_nodelay(true)
            .connect_lazy();
        *c = Some((address.to_string(), ch.clone()));
        Ok(ch)
    }
}

fn unavailable(why: String) -> Response {
    tonic::Status::unavailable(why).into_http::<axum::body::Body>()
}

/// The middleware in front of the worker API.
pub async fn forward(State(f): State<Arc<Forwarder>>, req: Request, next: Next) -> Response {
    if f.sync.leading.get() {
        return next.run(req).await;
    }
    if req.headers().contains_key(FORWARDED) {
        return unavailable(
            "this instance does not lead the workflows (any more); try again".into(),
        );
    }
    let address = match f.sync.leading.leader() {
        Leader::Other {
            address: Some(a), ..
        } => a,
        Leader::Other { identity, .. } => {
            return unavailable(format!(
                "the leader ({identity}) publishes no worker API address; try again"
            ));
        }
        Leader::Unknown | Leader::This => {
            return unavailable("no instance leads the workflows yet; try again".into());
        }
    };
    if f.tls {
        return unavailable(format!(
            "this instance does not lead; the leader's worker API is at {address}"
        ));
    }
    let channel = match f.channel(&address) {
        Ok(c) => c,
        Err(e) => return unavailable(e),
    };
    let (mut parts, body) = req.into_parts();
    parts
        .headers
        .insert(FORWARDED, axum::http::HeaderValue::from_static("1"));
    let req = axum::http::Request::from_parts(parts, tonic::body::Body::new(body));
    match channel.oneshot(req).await {
        Ok(resp) => resp.map(axum::body::Body::new),
        Err(e) => {
            tracing::warn!(leader = %address, error = %e, "tink gRPC: the leader did not answer a forwarded call");
            unavailable(format!(
                "the leader at {address} did not answer ({e}); try again"
            ))
        }
    }
}
