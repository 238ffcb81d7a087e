//! Zero-touch's writes. An agent with no Hardware becomes Hardware
//! `discovery-<id>` (discovery); an agent with no Workflow is enrolled by
//! the WorkflowRuleSet that matches it best (enrollment). Both happen
//! because a packet asked, so both are bounded: creations per minute, the
//! discovered Hardware kept, remembered refusals in bytes. In kube mode
//! the objects are made in the cluster (the leader answers every worker
//! call, so only it makes them) and mirrored back at once.

use super::{Error, Mirrored, Refusals, Services, WorkerError};
use crate::config::DiscoveryConfig;
use crate::discovery::hardware::{self as found, DISCOVERED_LABEL, Found, Reservation};
use crate::discovery::rules::{self, Enrolling};
use crate::events::{Event, Kind as EventKind};
use crate::hardware::{Hardware, Key, Mac};
use crate::kinds::{Checked, Kind};
use crate::metrics::ResultLabels;
use crate::store::mirror::MirrorItem;
use crate::workflow::agent::{Refusal, Served};
use serde_json::Value;
use std::time::Duration;

/// How long a GetAction that enrolled its agent waits for the engine to
/// render the new Workflow (upstream retries for up to 30 s).
const RENDER_WAIT: Duration = Duration::from_secs(4);
const RENDER_POLL: Duration = Duration::from_millis(100);

/// Discovery's and enrollment's state.
pub struct Discovery {
    cfg: DiscoveryConfig,
    /// tinkerbox's address (the pool's default netmask holds it).
    server: std::net::Ipv4Addr,
    /// Creations in the current window of a minute, which starts at its
    /// first: (start, count).
    window: std::sync::Mutex<(i64, u32)>,
    /// One creation at a time, each checked against what exists just
    /// before it: two polls of one new agent make one Hardware.
    write: tokio::sync::Mutex<()>,
    /// Enrollment's refusals by agent, at the workflow generation they
    /// were derived at (a WorkflowRuleSet change bumps it).
    refusals: std::sync::Mutex<Refusals>,
    /// The discovered Hardware counted in the store (a scan of every
    /// document), and when: counted again after [`COUNT_FOR`], and one
    /// more for each Hardware made meanwhile. Held under `write`.
    counted: std::sync::Mutex<Option<(tokio::time::Instant, usize)>>,
}

/// How long a count of the discovered Hardware is used.
const COUNT_FOR: Duration = Duration::from_secs(5);

impl Discovery {
    pub fn new(cfg: DiscoveryConfig, server: std::net::Ipv4Addr) -> Self {
        Discovery {
            cfg,
            server,
            window: Default::default(),
            write: Default::default(),
            refusals: Default::default(),
            counted: Default::default(),
        }
    }

    /// Whether a creation (a Hardware or an enrollment Workflow) fits in
    /// this minute's budget (and take it).
    fn take_slot(&self, now_ms: i64) -> bool {
        let mut w = self.window.lock().unwrap_or_else(|e| e.into_inner());
        if w.1 == 0 || now_ms.saturating_sub(w.0) >= 60_000 {
            *w = (now_ms, 0);
        }
        if w.1 >= self.cfg.max_per_minute {
            return false;
        }
        w.1 += 1;
        true
    }

    fn remembered(&self, agent: &str, generation: u64) -> Option<Refusal> {
        let r = self.refusals.lock().unwrap_or_else(|e| e.into_inner());
        r.get(agent, generation)
    }

    fn remember(&self, agent: &str, generation: u64, why: Refusal) -> Refusal {
        let mut r = self.refusals.lock().unwrap_or_else(|e| e.into_inner());
        r.put(agent, generation, why.clone());
        why
    }
}

/// What discovery did for an agent with no Hardware (a metric label).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Discovered {
    Created,
    RateLimited,
    AtCap,
    Failed,
}

impl Discovered {
    fn as_str(self) -> &'static str {
        match self {
            Discovered::Created => "created",
            Discovered::RateLimited => "rate_limited",
            Discovered::AtCap => "at_cap",
            Discovered::Failed => "failed",
        }
    }
}

impl Services {
    /// GetAction with zero touch: an agent that has nothing to run is
    /// discovered (`discovery.enabled`) and enrolled (`discovery.enroll`)
    /// first, then asked for again once its Workflow is rendered.
    /// `attributes` (the agent's, as JSON) is called only then: an agent
    /// polling for work it has costs no conversion.
    pub async fn get_action(
        &self,
        agent: &str,
        attributes: impl FnOnce() -> Option<Value>,
    ) -> Result<Served, WorkerError> {
        let first = self.workflow.get_action(agent).await;
        let d = &self.discovery;
        if !(d.cfg.enabled || d.cfg.enroll)
            || !matches!(first, Err(WorkerError::Refused(Refusal::NotFound(_))))
        {
            return first;
        }
        let attributes = attributes();
        let attributes = attributes.as_ref();
        let hardware = if d.cfg.enabled {
            self.discover(agent, attributes).await
        } else {
            self.hardware_of(agent)
        };
        // Enrolled once discovered (a Workflow made before would name no
        // Hardware), and only with no Workflow at all, as upstream.
        if !d.cfg.enroll
            || (d.cfg.enabled && hardware.is_none())
            || self.workflow.store.agent_has_workflows(agent).await?
        {
            return first;
        }
        let (workflow, disabled) = self.enroll(agent, attributes, hardware).await?;
        if disabled {
            // Upstream's "discover, then decide" recipe: nothing to run
            // until someone enables it.
            return Err(
                Refusal::FailedPrecondition(format!("Workflow {workflow} is disabled")).into(),
            );
        }
        let deadline = tokio::time::Instant::now() + RENDER_WAIT;
        loop {
            match self.workflow.get_action(agent).await {
                Err(WorkerError::Refused(Refusal::NotFound(_)))
                    if tokio::time::Instant::now() < deadline =>
                {
                    tokio::time::sleep(RENDER_POLL).await;
                }
                Err(WorkerError::Refused(Refusal::NotFound(_))) => {
                    return Err(WorkerError::Unavailable(format!(
                        "Workflow {workflow} was made for this agent and is not rendered yet"
                    )));
                }
                other => return other,
            }
        }
    }

    /// The agent's Hardware: by `spec.agentID`, else by its id as a MAC.
    fn hardware_of(&self, agent: &str) -> Option<Key> {
        let snap = self.hardware.inventory.snapshot();
        let m = match snap.by_agent(agent) {
            Some(m) => m,
            None => snap.by_mac(&agent.parse::<Mac>().ok()?)?.0,
        };
        Some(m.key.clone())
    }

    /// Discovery: the agent's Hardware, made now when it has none (and the
    /// bounds allow). Failures are events and metrics, never the agent's
    /// error: as upstream, a machine is not kept from its work by them.
    async fn discover(&self, agent: &str, attributes: Option<&Value>) -> Option<Key> {
        if let Some(k) = self.hardware_of(agent) {
            return Some(k);
        }
        let d = &self.discovery;
        let outcome = |o: Discovered| {
            self.hardware
                .metrics
                .discovered
                .get_or_create(&ResultLabels { result: o.as_str() })
                .inc();
        };
        let _w = d.write.lock().await;
        if let Some(k) = self.hardware_of(agent) {
            return Some(k);
        }
        if !d.take_slot(crate::clock::now_ms()) {
            outcome(Discovered::RateLimited);
            tracing::warn!(
                agent,
                per_minute = d.cfg.max_per_minute,
                "discovery: rate limit reached, agent not discovered now"
            );
            return None;
        }
        match self.discovered_count().await {
            Ok(n) if n >= d.cfg.max_hardware => {
                outcome(Discovered::AtCap);
                self.hardware.events.record(Event::new(
                    EventKind::DiscoveryHardware,
                    format!(
                        "agent {agent} not discovered: {n} discovered Hardware is discovery.max_hardware"
                    ),
                ));
                return None;
            }
            Ok(_) => {}
            Err(e) => {
                outcome(Discovered::Failed);
                tracing::error!(agent, error = %e, "discovery: cannot count discovered Hardware");
                return None;
            }
        }
        let empty = Value::Object(Default::default());
        let attrs = attributes.unwrap_or(&empty);
        let snap = self.hardware.inventory.snapshot();
        // An address someone gave a Hardware since the lease is theirs.
        let reservation = self
            .pool_reservation(agent, attrs)
            .await
            .filter(|r| snap.by_ip(&std::net::IpAddr::V4(r.ip)).is_none());
        let taken = |m: &Mac| snap.by_mac(m).is_some();
        let hw = match found::document(&Found {
            agent_id: agent,
            attributes: attrs,
            namespace: &d.cfg.namespace,
            enroll: d.cfg.enroll,
            reservation,
            taken: &taken,
        }) {
            Ok(hw) => hw,
            Err(e) => {
                outcome(Discovered::Failed);
                tracing::warn!(agent, error = %e, "discovery: no valid Hardware from this agent");
                return None;
            }
        };
        let key = hw.machine.key.clone();
        match self.create_hardware(hw).await {
            Ok(()) => {
                if let Some((_, n)) = d.counted.lock().unwrap_or_else(|e| e.into_inner()).as_mut() {
                    *n += 1;
                }
                outcome(Discovered::Created);
                self.hardware.events.record(
                    Event::new(
                        EventKind::DiscoveryHardware,
                        format!("agent {agent} discovered: Hardware {key}"),
                    )
                    .machine(key.clone()),
                );
                Some(key)
            }
            Err(e) => {
                outcome(Discovered::Failed);
                tracing::warn!(agent, hardware = %key, error = %e, "discovery: Hardware not made");
                self.hardware.events.record(
                    Event::new(
                        EventKind::DiscoveryHardware,
                        format!("agent {agent}: Hardware {key} not made: {e}"),
                    )
                    .machine(key.clone()),
                );
                None
            }
        }
    }

    /// How many discovered Hardware there are: the store counted at most
    /// every [`COUNT_FOR`] (a flood of new agents does not scan every
    /// document each), plus what was made since.
    async fn discovered_count(&self) -> Result<usize, crate::store::StoreError> {
        let now = tokio::time::Instant::now();
        let cached = *self
            .discovery
            .counted
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if let Some((_, n)) = cached.filter(|(at, _)| now.duration_since(*at) < COUNT_FOR) {
            return Ok(n);
        }
        let n = self.hardware.store.count_discovered().await?;
        *self
            .discovery
            .counted
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = Some((now, n));
        Ok(n)
    }

    /// The pool address the agent's machine holds (under its id as a MAC,
    /// or any of its NICs' MACs), to become its Hardware's reservation.
    async fn pool_reservation(&self, agent: &str, attrs: &Value) -> Option<Reservation> {
        let cfg = &self.discovery.cfg;
        let netmask = cfg.pool_netmask(Some(self.discovery.server))?;
        let nics = attrs
            .get("networkInterfaces")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(|n| n.get("mac")?.as_str()?.parse::<Mac>().ok());
        let mut macs: Vec<Mac> = agent.parse().ok().into_iter().chain(nics).collect();
        macs.dedup();
        let now = crate::clock::now_ms();
        for mac in macs.into_iter().take(32) {
            match self.hardware.store.discovery_lease(mac).await {
                Ok(Some(l)) if l.expires_ms > now => {
                    return Some(Reservation {
                        mac,
                        ip: l.ip,
                        netmask,
                        gateway: cfg.gateway,
                        dns: cfg.dns.clone(),
                        lease_seconds: u32::try_from(cfg.lease_time.as_secs()).unwrap_or(u32::MAX),
                    });
                }
                Ok(_) => {}
                Err(e) => {
                    tracing::warn!(agent, error = %e, "discovery: cannot read the pool's leases")
                }
            }
        }
        None
    }

    /// Make a discovered Hardware where Hardware lives: the cluster, or the
    /// store. A Hardware of that name is another agent's (ids that differ
    /// only in case or punctuation make one name): refused.
    async fn create_hardware(&self, hw: Hardware) -> Result<(), Error> {
        let key = hw.machine.key.clone();
        let taken = || {
            Error::Invalid(crate::hardware::FieldError::new(
                "metadata.name",
                format!("Hardware {key} exists and is another agent's"),
            ))
        };
        if let Some(cluster) = self.link.cluster() {
            let made = cluster
                .create(Kind::Hardware, &key, &hw.doc)
                .await?
                .ok_or_else(taken)?;
            let item = crate::hardware::validate(made.item)?;
            self.hardware
                .mirror(Mirrored::One(super::Copy {
                    key,
                    item,
                    version: made.version,
                }))
                .await?;
            return Ok(());
        }
        if self.hardware.inventory.snapshot().by_key(&key).is_some() {
            return Err(taken());
        }
        self.hardware.apply(vec![hw]).await?;
        Ok(())
    }

    /// Enrollment, upstream's rules: a Hardware with
    /// `spec.auto.enrollmentEnabled` false is not enrolled; otherwise the
    /// best matching WorkflowRuleSet makes Workflow `enrollment-<agent>`
    /// (once: an existing one is waited for), within the per-minute budget
    /// and `max_hardware` enrollment Workflows. What no ruleset matched is
    /// remembered until a WorkflowRuleSet changes.
    async fn enroll(
        &self,
        agent: &str,
        attributes: Option<&Value>,
        hardware: Option<Key>,
    ) -> Result<(Key, bool), WorkerError> {
        let d = &self.discovery;
        let store = &self.workflow.store;
        let outcome = |result: &'static str| {
            self.workflow
                .metrics
                .enrollments
                .get_or_create(&ResultLabels { result })
                .inc();
        };
        let mut discovered = false;
        if let Some(h) = &hardware {
            // From the snapshot: a change of the switch counts at once.
            let enabled = self
                .hardware
                .inventory
                .snapshot()
                .by_key(h)
                .is_some_and(|m| m.auto_enroll);
            if !enabled {
                outcome("disabled");
                return Err(Refusal::FailedPrecondition(
                    "auto enrollment is disabled for this hardware".into(),
                )
                .into());
            }
            let doc = self.hardware.store.get(h).await?;
            discovered = doc
                .as_ref()
                .and_then(|d| d.pointer("/metadata/labels"))
                .and_then(|l| l.get(DISCOVERED_LABEL))
                .and_then(Value::as_str)
                == Some("true");
        }
        let generation = store.ruleset_generation();
        if let Some(r) = d.remembered(agent, generation) {
            return Err(r.into());
        }
        let sets: Vec<rules::RuleSet> = store
            .rulesets(None)
            .await?
            .into_iter()
            .filter_map(|doc| rules::ruleset(doc).ok())
            .collect();
        let text = attributes.map_or_else(|| "{}".to_string(), Value::to_string);
        let Some(set) = rules::best(&sets, text.as_bytes()) else {
            outcome("no_match");
            return Err(d
                .remember(
                    agent,
                    generation,
                    Refusal::NotFound(format!(
                        "no Workflow Rule Sets found or matched for Agent {agent}"
                    )),
                )
                .into());
        };
        let wf = match rules::enrollment(
            set,
            &Enrolling {
                agent_id: agent,
                attributes: &text,
                hardware: hardware.as_ref(),
                discovered,
            },
        ) {
            Ok(w) => w,
            Err(e) => {
                outcome("refused");
                self.workflow.events.record(Event::new(
                    EventKind::DiscoveryEnrolled,
                    format!("agent {agent} not enrolled: {e}"),
                ));
                return Err(d
                    .remember(
                        agent,
                        generation,
                        Refusal::FailedPrecondition(e.to_string()),
                    )
                    .into());
            }
        };
        let key = wf.key.clone();
        let disabled = wf.spec.disabled;
        let _w = d.write.lock().await;
        if let Some(row) = store.workflow(&key).await? {
            // Made at an earlier poll: as it is now (someone may have
            // enabled it since).
            let disabled = row.doc.pointer("/spec/disabled").and_then(Value::as_bool);
            return Ok((key, disabled.unwrap_or(false)));
        }
        let limited = if !d.take_slot(crate::clock::now_ms()) {
            Some(("rate_limited", "discovery.max_per_minute"))
        } else if store.count_enrolled().await? >= d.cfg.max_hardware {
            Some(("at_cap", "discovery.max_hardware"))
        } else {
            None
        };
        if let Some((result, limit)) = limited {
            outcome(result);
            return Err(WorkerError::Unavailable(format!(
                "agent {agent} not enrolled now: {limit} reached"
            )));
        }
        let made = match self.link.cluster() {
            Some(cluster) => match cluster.create(Kind::Workflow, &key, &wf.doc).await {
                Ok(Some(made)) => {
                    let item = crate::workflow::model::workflow(made.item)
                        .map_err(|e| WorkerError::Unavailable(e.to_string()))?;
                    self.mirror(
                        Kind::Workflow,
                        Mirrored::One(super::Copy {
                            key: key.clone(),
                            item: MirrorItem::new(Checked::Workflow(item)),
                            version: made.version,
                        }),
                        false,
                    )
                    .await?;
                    Ok(())
                }
                Ok(None) => Ok(()),
                Err(e) => Err(e.to_string()),
            },
            None => self
                .workflow
                .apply(&[], std::slice::from_ref(&wf))
                .await
                .map(drop)
                .map_err(|e| e.to_string()),
        };
        let mut event = Event::new(
            EventKind::DiscoveryEnrolled,
            match &made {
                Ok(()) => format!(
                    "agent {agent} enrolled by WorkflowRuleSet {}: Workflow {key}",
                    set.key
                ),
                Err(e) => format!("agent {agent}: Workflow {key} not made: {e}"),
            },
        );
        if let Some(h) = &hardware {
            event = event.machine(h.clone());
        }
        self.workflow.events.record(event);
        match made {
            Ok(()) => {
                outcome("created");
                Ok((key, disabled))
            }
            Err(e) => {
                outcome("failed");
                Err(WorkerError::Unavailable(e))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn creations_per_minute_are_bounded() {
        let d = Discovery::new(
            DiscoveryConfig {
                max_per_minute: 3,
                ..Default::default()
            },
            std::net::Ipv4Addr::LOCALHOST,
        );
        let t = 10 * 60_000;
        assert!((0..3).all(|i| d.take_slot(t + i)));
        assert!(!d.take_slot(t + 59_000), "the fourth in the minute");
        assert!(d.take_slot(t + 60_000), "a new minute");
    }
}
