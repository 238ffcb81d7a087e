//! The public, unauthenticated HTTP listener: `/healthz` and `/metrics` now;
//! iPXE scripts, artifacts and metadata join it later.

use crate::app::App;
use crate::metrics::{Listener, Metrics, RequestLabels};
use axum::Router;
use axum::extract::{Request, State};
use axum::http::{StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::IntoResponse;
use axum::routing::get;
use std::sync::Arc;
use std::time::Duration;

pub fn router(app: Arc<App>) -> Router {
    let metrics = app.metrics.clone();
    Router::new()
        .route("/healthz", get(healthz))
        .route("/metrics", get(metrics_text))
        .fallback(|| async { (StatusCode::NOT_FOUND, "not found\n") })
        .layer(middleware::from_fn(move |req: Request, next: Next| {
            let metrics = metrics.clone();
            async move {
                let resp = next.run(req).await;
                count(&metrics, "public", resp.status());
                resp
            }
        }))
        .with_state(app)
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

/// Healthy when the store answers within a second.
async fn healthz(State(app): State<Arc<App>>) -> impl IntoResponse {
    match tokio::time::timeout(Duration::from_secs(1), app.store.ping()).await {
        Ok(Ok(())) => (StatusCode::OK, "ok\n".to_string()),
        Ok(Err(e)) => (StatusCode::SERVICE_UNAVAILABLE, format!("store: {e}\n")),
        Err(_) => (
            StatusCode::SERVICE_UNAVAILABLE,
            "store: no answer within 1s\n".into(),
        ),
    }
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
