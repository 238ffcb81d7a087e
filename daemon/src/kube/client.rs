//! The Kubernetes client, from `[kube]`: an explicit kubeconfig file, else
//! kube's own inference (in-cluster service account, `$KUBECONFIG`,
//! `~/.kube/config`). rustls with ring, as the rest of tinkerbox.

use crate::config::KubeConfig;
use crate::metrics::{KubeRequestLabels, Metrics};
use anyhow::Context;
use kube::config::{KubeConfigOptions, Kubeconfig};
use std::sync::Arc;
use std::time::Duration;

/// Every request but a watch gets an answer within this, or fails and is
/// retried by the caller's backoff (a watch is bounded by kube's own idle
/// timeout, 290 s plus a margin, and must not be cut at 30 s of quiet).
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// The clients of one cluster, by what they carry.
#[derive(Clone)]
pub struct Clients {
    /// Reads and writes: each read bounded by [`REQUEST_TIMEOUT`], and
    /// rate limited by `[kube] qps`/`burst`.
    pub requests: kube::Client,
    /// Watches: no read timeout (kube's watcher bounds a quiet stream),
    /// not rate limited (a watch is one long request).
    pub watches: kube::Client,
    /// The Lease alone: never waits behind status traffic in the limiter.
    pub lease: kube::Client,
}

/// `metrics`: where the requests and the Lease's are counted
/// (`tinkerbox_kube_requests`).
pub async fn clients(cfg: &KubeConfig, metrics: Option<Arc<Metrics>>) -> anyhow::Result<Clients> {
    let config = config(cfg).await?;
    let mut bounded = config.clone();
    bounded.read_timeout = Some(REQUEST_TIMEOUT);
    let build = |c: kube::Config, limited: bool, name: &'static str| {
        let builder = kube::client::ClientBuilder::try_from(c).context("kube client")?;
        let m = metrics.clone();
        let builder = builder.with_layer(&tower::util::MapRequestLayer::new(
            move |req: axum::http::Request<kube::client::Body>| {
                if let Some(m) = &m {
                    m.kube_requests
                        .get_or_create(&KubeRequestLabels {
                            client: name,
                            method: method(req.method()),
                        })
                        .inc();
                }
                req
            },
        ));
        anyhow::Ok(match window(cfg.qps, cfg.burst).filter(|_| limited) {
            Some((n, per)) => builder
                .with_layer(&tower::limit::RateLimitLayer::new(n, per))
                .build(),
            None => builder.build(),
        })
    };
    Ok(Clients {
        requests: build(bounded.clone(), true, "requests")?,
        watches: kube::client::ClientBuilder::try_from(config)
            .context("kube client")?
            .build(),
        lease: build(bounded, false, "lease")?,
    })
}

fn method(m: &axum::http::Method) -> &'static str {
    match *m {
        axum::http::Method::GET => "GET",
        axum::http::Method::POST => "POST",
        axum::http::Method::PUT => "PUT",
        axum::http::Method::PATCH => "PATCH",
        axum::http::Method::DELETE => "DELETE",
        _ => "other",
    }
}

async fn config(cfg: &KubeConfig) -> anyhow::Result<kube::Config> {
    let mut config = match &cfg.kubeconfig {
        Some(path) => {
            let kc = Kubeconfig::read_from(path)
                .with_context(|| format!("kube.kubeconfig {}", path.display()))?;
            kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
                .await
                .with_context(|| format!("kube.kubeconfig {}", path.display()))?
        }
        None => kube::Config::infer().await.context(
            "no kube.kubeconfig set, and none found in-cluster, in $KUBECONFIG or ~/.kube/config",
        )?,
    };
    config.connect_timeout = Some(CONNECT_TIMEOUT);
    config.write_timeout = Some(REQUEST_TIMEOUT);
    Ok(config)
}

/// The request client alone (the CLI's `kube` commands).
pub async fn client(cfg: &KubeConfig) -> anyhow::Result<kube::Client> {
    Ok(clients(cfg, None).await?.requests)
}

/// `[kube] qps`/`burst` as tower's window: up to `burst` requests at once,
/// then `qps` on average (`burst` per `burst / qps` seconds; tower has no
/// token bucket, and a window of the burst's size is the same average with
/// the same largest burst). None: no limit (qps 0).
fn window(qps: f64, burst: u32) -> Option<(u64, Duration)> {
    if qps.is_nan() || qps <= 0.0 || qps.is_infinite() {
        return None;
    }
    let burst = burst.max(1);
    Some((
        u64::from(burst),
        Duration::from_secs_f64(f64::from(burst) / qps),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn qps_and_burst_make_the_window() {
        assert_eq!(window(20.0, 30), Some((30, Duration::from_millis(1500))));
        assert_eq!(window(5.0, 0), Some((1, Duration::from_millis(200))));
        assert_eq!(window(0.0, 30), None);
        assert_eq!(window(f64::NAN, 30), None);
    }
}
