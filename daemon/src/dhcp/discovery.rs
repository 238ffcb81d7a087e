//! The discovery pool's thread: one OS thread owns the in-memory
//! [`Pool`], so its state needs no lock, and the `dhcp` threads only hand
//! it requests of unknown MACs over a bounded channel (`try_send`: when it
//! is full the request is dropped and counted, `pool_busy`; the client
//! retries). For each request it asks [`super::pool::plan`], commits the
//! plan's write to the store (waiting on the runtime with a time limit: it
//! is not a runtime thread), applies it to the pool, and only then sends
//! the reply through its clone of the DHCP socket, so an ACK never promises
//! what a restart would forget.

use super::pool::{Answer, Plan, PoolSettings, Write};
use super::{Ignore, Settings};
use crate::discovery::pool::{Counts, Pool};
use crate::events::{Event, EventSink, Kind};
use crate::inventory::{Inventory, Snapshot};
use crate::metrics::Metrics;
use crate::store::Store;
use dhcproto::v4::Message;
use std::net::{IpAddr, Ipv4Addr, SocketAddr, UdpSocket};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, SyncSender, TrySendError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Requests waiting for the pool thread at most: a burst of a rack's
/// DISCOVERs fits; a flood beyond it is dropped, not queued.
const QUEUE: usize = 1024;

/// The longest a store write may take before the request goes unanswered
/// (the client retries).
const STORE_TIMEOUT: Duration = Duration::from_secs(3);

/// How often the thread wakes without requests: expiry, the gauges, the
/// stop flag.
const TICK: Duration = Duration::from_millis(500);

/// At most one `discovery.exhausted` event per this long.
const EXHAUSTED_EVENT_EVERY: Duration = Duration::from_secs(60);

/// One request handed over by a `dhcp` thread.
struct Job {
    req: Message,
    src: SocketAddr,
    ifindex: Option<u32>,
    received: Instant,
}

/// The `dhcp` threads' end of the channel.
pub struct Handoff {
    tx: SyncSender<Job>,
}

impl Handoff {
    /// False when the pool thread's queue is full (or it has stopped).
    pub fn submit(&self, req: Message, src: SocketAddr, ifindex: Option<u32>) -> bool {
        let job = Job {
            req,
            src,
            ifindex,
            received: Instant::now(),
        };
        match self.tx.try_send(job) {
            Ok(()) => true,
            Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) => false,
        }
    }
}

/// What the pool thread needs.
pub struct PoolThread {
    pub pool: Pool,
    /// A clone of the port-67 socket.
    pub sock: UdpSocket,
    pub inventory: Arc<Inventory>,
    pub settings: Settings,
    pub pool_settings: PoolSettings,
    pub store: Store,
    pub runtime: tokio::runtime::Handle,
    pub events: EventSink,
    pub metrics: Arc<Metrics>,
}

/// The gauges' bookkeeping: recount when the pool, the snapshot or the
/// clock (a lease or hold ending) can have changed them.
struct Gauges {
    dirty: bool,
    snapshot: Option<Arc<Snapshot>>,
    next_change_ms: Option<i64>,
    last: Counts,
}

impl PoolThread {
    /// Start the thread; it stops when `stop` is set or every [`Handoff`]
    /// is gone.
    pub fn spawn(self, stop: Arc<AtomicBool>) -> std::io::Result<(Handoff, JoinHandle<()>)> {
        let (tx, rx) = std::sync::mpsc::sync_channel(QUEUE);
        let handle = std::thread::Builder::new()
            .name("dhcp-pool".into())
            .spawn(move || self.run(&rx, &stop))?;
        Ok((Handoff { tx }, handle))
    }

    fn run(mut self, rx: &Receiver<Job>, stop: &AtomicBool) {
        // Unknown machines wait behind the known ones for the CPU.
        crate::priority::nicer_this_thread();
        let mut gauges = Gauges {
            dirty: true,
            snapshot: None,
            next_change_ms: None,
            last: Counts::default(),
        };
        let mut exhausted_event: Option<Instant> = None;
        let mut tally = super::server::Tally::new(self.settings.mode);
        self.refresh(&mut gauges);
        while !stop.load(Ordering::Relaxed) {
            match rx.recv_timeout(TICK) {
                Ok(job) => {
                    if self.handle(job, &mut exhausted_event, &gauges.last, &mut tally) {
                        gauges.dirty = true;
                    }
                }
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => break,
            }
            self.refresh(&mut gauges);
        }
    }

    /// Handle one request; true when the pool changed.
    fn handle(
        &mut self,
        job: Job,
        exhausted_event: &mut Option<Instant>,
        counts: &Counts,
        tally: &mut super::server::Tally,
    ) -> bool {
        let snap = self.inventory.snapshot();
        let reserved = |ip: Ipv4Addr| snap.by_ip(&IpAddr::V4(ip)).is_some();
        // Handed here for a Hardware interface with no address, or no
        // Hardware at all.
        let known = |mac: &crate::hardware::Mac| snap.by_mac(mac).map(|(_, i)| i);
        let now = crate::clock::now_ms();
        let Plan { answer, write } = super::pool::plan(
            &job.req,
            &self.pool,
            now,
            &reserved,
            &known,
            &self.settings,
            &self.pool_settings,
        );
        let changed = write.is_some();
        if let Some(w) = write {
            if let Err(e) = self.commit(&w) {
                self.metrics.dhcp_ignored(Ignore::StoreFailed.as_str());
                tracing::error!(error = %e, "dhcp: discovery lease not committed; not answered");
                return false;
            }
            self.apply(w, now);
        }
        match answer {
            Answer::Ignore(Ignore::PoolExhausted) => {
                self.metrics.dhcp_ignored(Ignore::PoolExhausted.as_str());
                self.metrics.discovery_pool_exhausted.inc();
                let due = exhausted_event.is_none_or(|t| t.elapsed() >= EXHAUSTED_EVENT_EVERY);
                if due {
                    *exhausted_event = Some(Instant::now());
                    let mac = super::client_of(&job.req).ok().map(|c| c.mac);
                    let message = format!(
                        "discovery pool exhausted: no address for {} ({} of {} leased, {} declined, {} reserved by Hardware); \
                         this event is recorded at most once a minute",
                        mac.map(|m| m.to_string()).unwrap_or_default(),
                        counts.leased,
                        counts.size,
                        counts.declined,
                        counts.reserved,
                    );
                    tracing::warn!("{message}");
                    let mut e = Event::new(Kind::DiscoveryExhausted, message);
                    if let Some(m) = mac {
                        e = e.mac(m);
                    }
                    self.events.record(e);
                }
            }
            Answer::Ignore(why) => {
                self.metrics.dhcp_ignored(why.as_str());
                tracing::debug!(src = %job.src, reason = why.as_str(), "dhcp: pool: not answered");
            }
            Answer::Note {
                kind,
                mac,
                ip,
                message,
            } => {
                self.events
                    .record(Event::new(kind, message).mac(mac).ip(IpAddr::V4(ip)));
            }
            Answer::Reply(r) => {
                let sent = super::server::deliver(
                    &self.sock,
                    r,
                    job.src,
                    job.ifindex,
                    &self.metrics,
                    &self.events,
                    tally,
                );
                if sent {
                    self.metrics
                        .dhcp_seconds
                        .observe(job.received.elapsed().as_secs_f64());
                }
            }
        }
        changed
    }

    /// The write, in the store, within [`STORE_TIMEOUT`].
    fn commit(&self, w: &Write) -> Result<(), String> {
        let store = &self.store;
        let fut = async {
            match *w {
                Write::Bind { ref lease, .. } => store.put_discovery_lease(lease).await,
                Write::Release(ref l) => store.release_discovery_lease(l).await,
                Write::Decline { ip, mac, until_ms } => {
                    store.decline_discovery_address(ip, mac, until_ms).await
                }
            }
        };
        match self
            .runtime
            .block_on(async { tokio::time::timeout(STORE_TIMEOUT, fut).await })
        {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(e.to_string()),
            Err(_) => Err(format!("the store did not answer within {STORE_TIMEOUT:?}")),
        }
    }

    /// The committed write, in the pool (and the event of a new lease).
    fn apply(&mut self, w: Write, now: i64) {
        match w {
            Write::Bind { lease, new } => {
                self.pool.bind(lease, now);
                if new {
                    self.events.record(
                        Event::new(
                            Kind::DiscoveryLease,
                            format!("{} leased {} from the discovery pool", lease.mac, lease.ip),
                        )
                        .mac(lease.mac)
                        .ip(IpAddr::V4(lease.ip))
                        .fields(serde_json::json!({"expires_ms": lease.expires_ms})),
                    );
                }
            }
            Write::Release(l) => self.pool.release(&l),
            Write::Decline { ip, until_ms, .. } => self.pool.decline(ip, until_ms),
        }
    }

    /// Forget ended holds and bring the gauges (which `/healthz` reads) up
    /// to date,
    /// counting only when something can have changed.
    fn refresh(&mut self, g: &mut Gauges) {
        let now = crate::clock::now_ms();
        if self.pool.expire(now) {
            g.dirty = true;
        }
        let snap = self.inventory.snapshot();
        let same_snapshot = g.snapshot.as_ref().is_some_and(|s| Arc::ptr_eq(s, &snap));
        let due = g.next_change_ms.is_some_and(|t| now >= t);
        if !(g.dirty || due || !same_snapshot) {
            return;
        }
        let reserved = |ip: Ipv4Addr| snap.by_ip(&IpAddr::V4(ip)).is_some();
        let c = self.pool.counts(now, &reserved);
        for (state, n) in [
            ("leased", c.leased),
            ("free", c.free),
            ("declined", c.declined),
            ("reserved", c.reserved),
        ] {
            self.metrics.set_discovery_pool(state, n);
        }
        g.last = c;
        g.next_change_ms = c.next_change_ms;
        g.dirty = false;
        g.snapshot = Some(snap);
    }
}
