//! Leader election: the writers (workflow engine, BMC runner and poll,
//! status pusher, supervisor) run on one instance at a time, the holder of
//! a `coordination.k8s.io` Lease. Every instance mirrors and serves the
//! boot path; a follower forwards the worker API to the leader, whose
//! address the Lease carries.
//!
//! Hand-written, as client-go's `leaderelection` is, because the crate
//! (kube-lease-manager) renews with an unconditional patch, takes a free
//! Lease by server-side apply (two instances under one field manager both
//! win), and never steps down on its own; and because the Lease must also
//! say where the leader's gRPC API is. The algorithm is client-go's:
//! - every write is a PUT with the resourceVersion read, so of two
//!   instances racing for the Lease exactly one wins (409 for the other);
//! - a follower takes the Lease only when its record has not changed for
//!   [`LEASE_SECONDS`] by the follower's own clock (no clock agreement
//!   needed, only clocks that tick at the same rate);
//! - the leader renews every [`RETRY_PERIOD`] and steps down (stops every
//!   engine) when no renewal has succeeded for [`RENEW_DEADLINE`], counted
//!   from when that renewal was sent: [`LEASE_SECONDS`] minus
//!   [`RENEW_DEADLINE`] (5 s) before any follower may take it.
//!
//! On winning, the engines start only once the status the previous leader
//! wrote is read back (`resync`): they go on from the cluster's copy.

use crate::events::{Event, EventSink, Kind as EventKind};
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::api::{Api, PostParams};
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use tokio::task::JoinHandle;
use tokio::time::Instant;

/// Seconds a Lease lasts without renewal: how long a crashed leader's
/// engines stay unreplaced (a clean stop releases it at once).
pub const LEASE_SECONDS: u64 = 15;
/// The leader steps down when no renewal succeeded for this long.
pub const RENEW_DEADLINE: Duration = Duration::from_secs(10);
/// How often the leader renews and a follower looks at the Lease.
pub const RETRY_PERIOD: Duration = Duration::from_secs(2);
/// One Lease call, at most.
const CALL_TIMEOUT: Duration = Duration::from_secs(4);
// The step-down comes well before any follower may take the Lease, and
// several renewals fit in the deadline.
const _: () = assert!(RENEW_DEADLINE.as_secs() + 3 <= LEASE_SECONDS);
const _: () = assert!(RETRY_PERIOD.as_secs() * 3 <= RENEW_DEADLINE.as_secs());

/// Where the holder's Tink gRPC API is (`host:port`), on the Lease.
pub const ADDRESS_ANNOTATION: &str = "tinkerbox.io/grpc-address";

/// Who leads, as this instance last saw it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Leader {
    /// Not known yet (no Lease read), or nobody holds it.
    #[default]
    Unknown,
    /// This instance, with its engines running.
    This,
    /// Another instance, and the gRPC address it published.
    Other {
        identity: String,
        address: Option<String>,
    },
}

/// Whether this instance leads, for the mirror (a follower takes the
/// status its leader writes), the worker API (a follower forwards it) and
/// `/healthz`.
#[derive(Default)]
pub struct Leading {
    on: AtomicBool,
    view: std::sync::Mutex<Leader>,
}

impl Leading {
    /// True only while this instance's engines run.
    pub fn get(&self) -> bool {
        self.on.load(Ordering::Acquire)
    }

    pub fn leader(&self) -> Leader {
        self.view.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    fn set(&self, view: Leader) {
        self.on.store(view == Leader::This, Ordering::Release);
        *self.view.lock().unwrap_or_else(|p| p.into_inner()) = view;
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

/// The Lease as last read: its record, and when the record last changed
/// by this instance's clock (never the record's own times: clocks differ).
#[derive(Debug, Clone)]
struct Observed {
    lease: Lease,
    changed_at: Instant,
}

fn holder(l: &Lease) -> Option<&str> {
    l.spec
        .as_ref()
        .and_then(|s| s.holder_identity.as_deref())
        .filter(|h| !h.is_empty())
}

fn rv(l: &Lease) -> Option<&str> {
    l.metadata.resource_version.as_deref()
}

/// Whether `identity` may write itself into the Lease now: it is free,
/// already ours, or unchanged for its duration since it was seen to change.
fn may_take(o: &Observed, identity: &str, now: Instant) -> bool {
    match holder(&o.lease) {
        None => true,
        Some(h) if h == identity => true,
        Some(_) => {
            let secs = o
                .lease
                .spec
                .as_ref()
                .and_then(|s| s.lease_duration_seconds)
                .and_then(|d| u64::try_from(d).ok())
                .unwrap_or(LEASE_SECONDS);
            now >= o.changed_at + Duration::from_secs(secs)
        }
    }
}

/// The Lease with `identity` holding it from now: `old`'s record carried
/// on (transitions counted when the holder changes), renewed now.
fn claimed(old: &Lease, identity: &str, address: Option<&str>, name: &str, ns: &str) -> Lease {
    let now = MicroTime(k8s_openapi::jiff::Timestamp::now());
    let spec = old.spec.clone().unwrap_or_default();
    let ours = holder(old) == Some(identity);
    let mut meta = ObjectMeta {
        name: Some(name.into()),
        namespace: Some(ns.into()),
        resource_version: old.metadata.resource_version.clone(),
        annotations: old.metadata.annotations.clone(),
        labels: old.metadata.labels.clone(),
        ..Default::default()
    };
    let annotations = meta.annotations.get_or_insert_with(Default::default);
    match address {
        Some(a) => {
            annotations.insert(ADDRESS_ANNOTATION.into(), a.into());
        }
        None => {
            annotations.remove(ADDRESS_ANNOTATION);
        }
    }
    Lease {
        metadata: meta,
        spec: Some(LeaseSpec {
            holder_identity: Some(identity.into()),
            lease_duration_seconds: Some(LEASE_SECONDS as i32),
            acquire_time: if ours {
                spec.acquire_time.clone()
            } else {
                Some(now.clone())
            },
            renew_time: Some(now),
            lease_transitions: Some(
                spec.lease_transitions.unwrap_or(0) + i32::from(!ours && holder(old).is_some()),
            ),
            ..spec
        }),
    }
}

/// What another instance's Lease says, for the forwarder.
fn view_of(l: &Lease) -> Leader {
    match holder(l) {
        None => Leader::Unknown,
        Some(h) => Leader::Other {
            identity: h.into(),
            address: l
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(ADDRESS_ANNOTATION))
                .cloned(),
        },
    }
}

/// A Lease call that failed, or did not answer in time.
#[derive(Debug, thiserror::Error)]
enum CallError {
    #[error(transparent)]
    Kube(#[from] kube::Error),
    #[error("the API server did not answer in time")]
    Timeout,
}

impl CallError {
    fn conflict(&self) -> bool {
        matches!(self, CallError::Kube(kube::Error::Api(s)) if s.code == 409)
    }
}

/// `f` within [`CALL_TIMEOUT`] and before `until`.
async fn bounded<T>(
    f: impl Future<Output = Result<T, kube::Error>>,
    until: Instant,
) -> Result<T, CallError> {
    let until = until.min(Instant::now() + CALL_TIMEOUT);
    match tokio::time::timeout_at(until, f).await {
        Ok(r) => Ok(r?),
        Err(_) => Err(CallError::Timeout),
    }
}

/// The election for one Lease.
pub struct Election {
    pub api: Api<Lease>,
    pub name: String,
    pub namespace: String,
    pub identity: String,
    /// This instance's Tink gRPC address, published while it leads.
    pub address: Option<String>,
}

/// Outcome of one try for the Lease.
enum Try {
    Won(Box<Lease>),
    Lost,
    Failed(String),
}

impl Election {
    /// Read the Lease (creating it, held by us, when there is none) and
    /// take it when [`may_take`] says so.
    async fn attempt(&self, seen: &mut Option<Observed>) -> Try {
        let deadline = Instant::now() + CALL_TIMEOUT;
        let current = match bounded(self.api.get_opt(&self.name), deadline).await {
            Ok(c) => c,
            Err(e) => return Try::Failed(e.to_string()),
        };
        let Some(current) = current else {
            let fresh = claimed(
                &Lease::default(),
                &self.identity,
                self.address.as_deref(),
                &self.name,
                &self.namespace,
            );
            return match bounded(self.api.create(&PostParams::default(), &fresh), deadline).await {
                Ok(l) => Try::Won(Box::new(l)),
                Err(e) if e.conflict() => Try::Lost,
                Err(e) => Try::Failed(e.to_string()),
            };
        };
        let now = Instant::now();
        let changed = seen.as_ref().is_none_or(|o| rv(&o.lease) != rv(&current));
        if changed {
            *seen = Some(Observed {
                lease: current.clone(),
                changed_at: now,
            });
        }
        let Some(o) = seen.as_ref() else {
            return Try::Lost;
        };
        if !may_take(o, &self.identity, now) {
            return Try::Lost;
        }
        self.put(&current).await
    }

    /// Write ourselves into `over` before `until`: a PUT with its
    /// resourceVersion as the precondition (a 409: another instance wrote
    /// it first).
    async fn write(&self, over: &Lease, until: Instant) -> Result<Lease, CallError> {
        let next = claimed(
            over,
            &self.identity,
            self.address.as_deref(),
            &self.name,
            &self.namespace,
        );
        bounded(
            self.api.replace(&self.name, &PostParams::default(), &next),
            until,
        )
        .await
    }

    async fn put(&self, over: &Lease) -> Try {
        match self.write(over, Instant::now() + CALL_TIMEOUT).await {
            Ok(l) => Try::Won(Box::new(l)),
            Err(e) if e.conflict() => Try::Lost,
            Err(e) => Try::Failed(e.to_string()),
        }
    }

    /// Renew `ours` before `deadline`. A 409 is read again: still ours (a
    /// user touched its labels) is renewed once more, another holder is
    /// a loss.
    async fn renew(&self, ours: &Lease, deadline: Instant) -> Result<Lease, Option<CallError>> {
        let e = match self.write(ours, deadline).await {
            Ok(l) => return Ok(l),
            Err(e) => e,
        };
        if !e.conflict() {
            return Err(Some(e));
        }
        let current = bounded(self.api.get_opt(&self.name), deadline)
            .await
            .map_err(Some)?;
        match current {
            Some(c) if holder(&c) == Some(self.identity.as_str()) => {
                self.write(&c, deadline).await.map_err(Some)
            }
            _ => Err(None),
        }
    }

    /// Let go at a clean stop, so a follower takes over at once.
    async fn release(&self, ours: &Lease) {
        let mut l = ours.clone();
        if let Some(s) = l.spec.as_mut() {
            s.holder_identity = None;
            s.lease_duration_seconds = Some(1);
            s.renew_time = Some(MicroTime(k8s_openapi::jiff::Timestamp::now()));
        }
        if let Some(a) = l.metadata.annotations.as_mut() {
            a.remove(ADDRESS_ANNOTATION);
        }
        l.metadata.managed_fields = None;
        let until = Instant::now() + CALL_TIMEOUT;
        match bounded(
            self.api.replace(&self.name, &PostParams::default(), &l),
            until,
        )
        .await
        {
            Ok(_) => tracing::info!("kube: the Lease is released"),
            Err(e) => tracing::warn!(error = %e, "kube: releasing the Lease failed"),
        }
    }
}

/// What the election drives.
pub struct Hooks<S, R> {
    pub sync: Arc<super::Sync>,
    pub metrics: Arc<crate::metrics::Metrics>,
    pub events: EventSink,
    pub stop: Arc<tokio::sync::Notify>,
    /// Start the engines; their handles are aborted on stepping down.
    pub start: S,
    /// Read back what the cluster holds before the engines start.
    pub resync: R,
}

/// Run for the life of the daemon: follow the Lease, take it when free,
/// lead while renewals succeed, step down when they do not.
pub async fn run<S, R, F>(e: Election, mut h: Hooks<S, R>)
where
    S: FnMut() -> Vec<JoinHandle<()>>,
    R: FnMut() -> F,
    F: Future<Output = anyhow::Result<()>>,
{
    let who = format!("{}/{}", e.namespace, e.name);
    let mut seen: Option<Observed> = None;
    let mut logged_failure = false;
    loop {
        // Following.
        let won = match e.attempt(&mut seen).await {
            Try::Won(l) => Some(l),
            Try::Lost => {
                logged_failure = false;
                if let Some(o) = &seen {
                    h.sync.leading.set(view_of(&o.lease));
                }
                None
            }
            Try::Failed(err) => {
                if !logged_failure {
                    tracing::warn!(error = %err, lease = %who, "kube: cannot read the Lease; retrying");
                    logged_failure = true;
                }
                None
            }
        };
        let Some(mut ours) = won.map(|l| *l) else {
            tokio::select! {
                _ = tokio::time::sleep(RETRY_PERIOD) => continue,
                _ = h.stop.notified() => return,
            }
        };
        // Leading: every renewal is measured from when it was sent; the
        // cluster is read back (beside the renewals) before the engines
        // start.
        let mut renewed = Instant::now();
        seen = None;
        // Nobody to forward to while the cluster is read back: the workers
        // are told to come again.
        h.sync.leading.set(Leader::Unknown);
        tracing::info!(identity = %e.identity, lease = %who, "kube: took the Lease; reading the cluster back before the engines start");
        let mut writers: Vec<JoinHandle<()>> = vec![];
        let mut resync = Some(Box::pin((h.resync)()));
        let mut resync_again: Option<Instant> = None;
        let mut next_renewal = renewed + RETRY_PERIOD;
        let stopping = loop {
            tokio::select! {
                Some(r) = futures::future::OptionFuture::from(resync.as_mut()), if resync.is_some() => {
                    resync = None;
                    match r {
                        Ok(()) => {
                            h.sync.leading.set(Leader::This);
                            h.events.record(Event::new(
                                EventKind::KubeLeader,
                                format!("{} leads (Lease {who}): its engines run", e.identity),
                            ));
                            tracing::info!(identity = %e.identity, "kube: leading: the workflow and BMC engines run here");
                            writers = (h.start)();
                        }
                        Err(err) => {
                            tracing::warn!(error = %err, "kube: reading the cluster back failed; retrying");
                            resync_again = Some(Instant::now() + Duration::from_secs(1));
                        }
                    }
                    continue;
                }
                _ = tokio::time::sleep_until(resync_again.unwrap_or(next_renewal)), if resync_again.is_some() => {
                    resync_again = None;
                    resync = Some(Box::pin((h.resync)()));
                    continue;
                }
                _ = tokio::time::sleep_until(next_renewal) => {}
                _ = h.stop.notified() => break true,
            }
            let sent = Instant::now();
            next_renewal = sent + RETRY_PERIOD;
            let result = e.renew(&ours, renewed + RENEW_DEADLINE).await;
            h.metrics
                .kube_lease_renewals
                .get_or_create(&crate::metrics::ResultLabels {
                    result: if result.is_ok() { "ok" } else { "failed" },
                })
                .inc();
            match result {
                Ok(l) => {
                    let gap = sent.duration_since(renewed).as_secs_f64();
                    if gap > h.metrics.kube_lease_longest_gap_seconds.get() {
                        h.metrics.kube_lease_longest_gap_seconds.set(gap);
                    }
                    ours = l;
                    renewed = sent;
                    continue;
                }
                Err(None) => {
                    tracing::warn!(identity = %e.identity, "kube: another instance holds the Lease");
                    break false;
                }
                Err(Some(err)) => tracing::warn!(error = %err, "kube: renewing the Lease failed"),
            }
            if Instant::now() >= renewed + RENEW_DEADLINE {
                tracing::warn!(identity = %e.identity, "kube: no renewal for {RENEW_DEADLINE:?}: stepping down");
                break false;
            }
        };
        drop(resync);
        for w in writers.drain(..) {
            w.abort();
        }
        let was = h.sync.leading.get();
        h.sync.leading.set(Leader::Unknown);
        if was {
            h.events.record(Event::new(
                EventKind::KubeLeader,
                format!(
                    "{} no longer leads (Lease {who}): its engines stopped",
                    e.identity
                ),
            ));
        }
        if stopping {
            e.release(&ours).await;
            return;
        }
        tokio::select! {
            _ = tokio::time::sleep(RETRY_PERIOD) => {}
            _ = h.stop.notified() => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lease(holder: Option<&str>, rv: &str) -> Lease {
        Lease {
            metadata: ObjectMeta {
                resource_version: Some(rv.into()),
                ..Default::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: holder.map(String::from),
                lease_duration_seconds: Some(15),
                lease_transitions: Some(3),
                ..Default::default()
            }),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_held_lease_is_taken_only_after_it_stood_still_for_its_duration() {
        let t0 = Instant::now();
        let o = Observed {
            lease: lease(Some("a"), "7"),
            changed_at: t0,
        };
        assert!(!may_take(&o, "b", t0));
        assert!(!may_take(&o, "b", t0 + Duration::from_secs(14)));
        assert!(may_take(&o, "b", t0 + Duration::from_secs(15)));
        assert!(may_take(&o, "a", t0), "the holder renews at any time");
        let free = Observed {
            lease: lease(None, "8"),
            changed_at: t0,
        };
        assert!(may_take(&free, "b", t0));
    }

    #[test]
    fn claiming_carries_the_record_on_and_names_the_address() {
        let old = lease(Some("a"), "7");
        let l = claimed(&old, "b", Some("10.0.0.2:42113"), "tinkerbox", "ns");
        let s = l.spec.as_ref().unwrap();
        assert_eq!(s.holder_identity.as_deref(), Some("b"));
        assert_eq!(s.lease_transitions, Some(4), "a new holder");
        assert_eq!(
            l.metadata.resource_version.as_deref(),
            Some("7"),
            "the precondition"
        );
        assert_eq!(
            view_of(&l),
            Leader::Other {
                identity: "b".into(),
                address: Some("10.0.0.2:42113".into())
            }
        );
        let again = claimed(&l, "b", Some("10.0.0.2:42113"), "tinkerbox", "ns");
        let s2 = again.spec.as_ref().unwrap();
        assert_eq!(s2.lease_transitions, Some(4), "a renewal is no transition");
        assert_eq!(s2.acquire_time, s.acquire_time);
        assert_eq!(view_of(&lease(None, "1")), Leader::Unknown);
    }
}
