//! The Kubernetes client, from `[kube]`: an explicit kubeconfig file, else
//! kube's own inference (in-cluster service account, `$KUBECONFIG`,
//! `~/.kube/config`). rustls with ring, as the rest of tinkerbox.

use crate::config::KubeConfig;
use anyhow::Context;
use kube::config::{KubeConfigOptions, Kubeconfig};
use std::time::Duration;

/// Every request but a watch (which kube bounds itself) gets an answer
/// within this, or fails and is retried by the caller's backoff.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

pub async fn client(cfg: &KubeConfig) -> anyhow::Result<kube::Client> {
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
    kube::Client::try_from(config).context("kube client")
}
