//! Admin API for discovery: the pool's leases, as stored.
//!
//! ```text
//! GET /api/v1/discovery/leases    every lease and declined address of the discovery pool
//! ```

use super::ApiError;
use crate::app::App;
use axum::extract::State;
use axum::routing::get;
use axum::{Json, Router};
use serde_json::{Value, json};
use std::sync::Arc;
use std::time::{Duration, UNIX_EPOCH};

pub fn routes() -> Router<Arc<App>> {
    Router::new().route("/api/v1/discovery/leases", get(leases))
}

/// `{"items": [{"ip", "mac", "state", "expires", "expiresMs", "expired", "updatedMs"}]}`
/// by address; `state` is `leased` or `declined` (kept out of the pool
/// until `expires`); rows that ended stay until the next start.
async fn leases(State(app): State<Arc<App>>) -> Result<Json<Value>, ApiError> {
    let now = crate::clock::now_ms();
    let rows = app.store.discovery_leases().await?;
    let items: Vec<Value> = rows
        .iter()
        .map(|r| {
            let at = UNIX_EPOCH + Duration::from_millis(u64::try_from(r.expires_ms).unwrap_or(0));
            json!({
                "ip": r.ip.to_string(),
                "mac": r.mac.to_string(),
                "state": r.state,
                "expires": humantime::format_rfc3339_seconds(at).to_string(),
                "expiresMs": r.expires_ms,
                "expired": r.expires_ms <= now,
                "updatedMs": r.updated_ms,
            })
        })
        .collect();
    Ok(Json(json!({
        "pool": app.config.discovery.pool.map(String::from),
        "items": items,
    })))
}
