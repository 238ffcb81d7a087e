//! Leader election: the writers (workflow engine, BMC runner and poll,
//! status pusher) run on one instance at a time, the holder of a
//! `coordination.k8s.io` Lease (kube-lease-manager: server-side apply, so
//! two instances cannot both take it). Every instance mirrors and serves;
//! answers are the same from the same mirror.

use crate::events::{Event, EventSink, Kind as EventKind};
use kube_lease_manager::LeaseManagerBuilder;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use tokio::task::JoinHandle;

/// Seconds a lease lasts without renewal: how long a crashed leader's
/// writers stay unreplaced (a clean stop releases it at once).
pub const LEASE_SECONDS: u64 = 15;
/// Renewed this long before it would lapse.
const GRACE_SECONDS: u64 = 5;

/// Whether this instance leads, for the mirror (a follower takes the
/// status its leader writes) and `/healthz`.
#[derive(Default)]
pub struct Leading(AtomicBool);

impl Leading {
    pub fn get(&self) -> bool {
        self.0.load(Ordering::Acquire)
    }

    pub fn set(&self, on: bool) {
        self.0.store(on, Ordering::Release);
    }
}

/// This instance's name in the Lease: host and process, so two instances
/// on one host differ.
pub fn identity() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_else(|_| "tinkerbox".into());
    format!("{host}-{}", std::process::id())
}

/// Run for the life of the daemon: take part in the election for
/// `namespace/name` (retrying while the API server is away), start the
/// writers with `start` on winning, abort them on losing.
pub async fn run(
    client: kube::Client,
    namespace: String,
    name: String,
    sync: Arc<super::Sync>,
    events: EventSink,
    stop: Arc<tokio::sync::Notify>,
    start: impl Fn() -> Vec<JoinHandle<()>>,
) {
    let identity = identity();
    let mut backoff = Duration::from_millis(500);
    let manager = loop {
        let built = LeaseManagerBuilder::new(client.clone(), &name)
            .with_namespace(&namespace)
            .with_identity(&identity)
            .with_duration(LEASE_SECONDS)
            .with_grace(GRACE_SECONDS)
            .with_field_manager("tinkerbox")
            .build();
        let built = tokio::select! {
            b = tokio::time::timeout(Duration::from_secs(30), built) => b,
            _ = stop.notified() => return,
        };
        match built {
            Ok(Ok(m)) => break m,
            Ok(Err(e)) => {
                tracing::warn!(error = %e, lease = %format!("{namespace}/{name}"), "kube: cannot join the leader election; retrying")
            }
            Err(_) => tracing::warn!("kube: the Lease did not answer within 30s; retrying"),
        }
        tokio::select! {
            _ = tokio::time::sleep(backoff) => {}
            _ = stop.notified() => return,
        }
        backoff = (backoff * 2).min(Duration::from_secs(30));
    };
    let (mut rx, task) = manager.watch().await;
    let mut writers: Vec<JoinHandle<()>> = vec![];
    loop {
        let lead = *rx.borrow_and_update();
        if lead && writers.is_empty() {
            tracing::info!(identity = %identity, "kube: leading: the workflow and BMC engines run here");
            sync.leading.set(true);
            events.record(Event::new(
                EventKind::KubeLeader,
                format!("{identity} leads (Lease {namespace}/{name}): its engines run"),
            ));
            writers = start();
        } else if !lead && !writers.is_empty() {
            tracing::warn!(identity = %identity, "kube: lost the lease: the engines stop here");
            sync.leading.set(false);
            events.record(Event::new(
                EventKind::KubeLeader,
                format!(
                    "{identity} no longer leads (Lease {namespace}/{name}): its engines stopped"
                ),
            ));
            for w in writers.drain(..) {
                w.abort();
            }
        }
        tokio::select! {
            changed = rx.changed() => if changed.is_err() { break },
            _ = stop.notified() => break,
        }
    }
    for w in writers {
        w.abort();
    }
    sync.leading.set(false);
    // Without a receiver the manager releases the Lease: a follower takes
    // over at once instead of after LEASE_SECONDS.
    drop(rx);
    match tokio::time::timeout(Duration::from_secs(5), task).await {
        Ok(Ok(Ok(_))) => tracing::info!("kube: the Lease is released"),
        Ok(Ok(Err(e))) => tracing::warn!(error = %e, "kube: releasing the Lease failed"),
        _ => tracing::warn!("kube: the Lease was not released within 5s"),
    }
}
