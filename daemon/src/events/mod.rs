//! The per-machine event log. Hot paths hand events to an [`EventSink`]
//! without waiting (a bounded channel, `try_send`); one writer task batches
//! them into transactions of the log's own database ([`log`]). When the
//! queue is full an event is dropped and counted, never waited for.

pub mod log;

pub use log::{EventLog, EventQuery, EventRow};

use crate::clock::now_ms;
use crate::hardware::{Key, Mac};
use crate::metrics::Metrics;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;

/// Events written per transaction at most: a second of events at 6,000
/// DORA/s (an OFFER and an ACK each) fits, so that under such a load the
/// writer commits about once a [`LINGER_BUSY`].
const BATCH: usize = 16384;

/// How long the writer keeps gathering after an event arrives before it
/// commits. Most of an event's cost is the B-tree pages it dirties (the
/// per-machine index puts each machine's events on its own leaf page), and
/// a page is written once per transaction however many events touch it: a
/// machine's DHCP OFFER and ACK, its TFTP and HTTP events, and neighbours
/// in the index share their pages when they share a transaction. Events
/// show up this much later; the queue (`events.queue`, 65536 by default)
/// holds what arrives meanwhile.
const LINGER: Duration = Duration::from_millis(100);

/// How long the writer gathers after a busy batch (at least [`BUSY`]
/// rows: ~2,500 events a second; it goes back to [`LINGER`] when a batch
/// has fewer, under ~256 events a second). A commit has costs that do not
/// grow with its rows: the WAL frames of the index pages every batch
/// touches, and SQLite's walk of its whole page cache at the end of any
/// transaction in which a B-tree balance renumbered pages
/// (`balance_nonroot` parks a page at the lock-byte page number, and the
/// next truncate then scans every cached page). That walk reads ~8,000
/// pages that have mostly gone cold, and on the nested VMs of
/// BENCHMARKS.md touching a cold 4 KiB page costs microseconds
/// (`tests/bench/pagecost`): 13-30 ms a walk, ~50 ms a second at 6,000
/// DORA/s with 250 ms here. Under load, fewer and larger commits share
/// these costs. Events still reach the web page's feed within its 250 ms
/// windows plus this.
const LINGER_BUSY: Duration = Duration::from_millis(1000);

/// Rows in a batch that make the writer linger for [`LINGER_BUSY`].
const BUSY: usize = 256;

/// The writer's next linger, after a batch of `rows` rows.
fn linger_after(rows: usize) -> Duration {
    if rows >= BUSY { LINGER_BUSY } else { LINGER }
}

/// What an event is about: stored as its dotted name (`dhcp.offer`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum Kind {
    #[serde(rename = "hardware.created")]
    HardwareCreated,
    #[serde(rename = "hardware.updated")]
    HardwareUpdated,
    #[serde(rename = "hardware.deleted")]
    HardwareDeleted,
    /// A MAC or IP claimed by two mirrored Hardware: neither is answered.
    #[serde(rename = "hardware.conflict")]
    HardwareConflict,
    /// A mirrored object tinkerbox cannot take (it stays out of the store).
    #[serde(rename = "kube.invalid")]
    KubeInvalid,
    /// The mirror is current again (a full list of a kind was swapped in).
    #[serde(rename = "kube.synced")]
    KubeSynced,
    /// The API server cannot be read: serving from the last mirror.
    #[serde(rename = "kube.disconnected")]
    KubeDisconnected,
    /// This instance took or lost the leader Lease (its engines started
    /// or stopped).
    #[serde(rename = "kube.leader")]
    KubeLeader,
    /// The supervisor acted on a `Tinkerbell` resource (created, repaired,
    /// migrated, refused, removed).
    #[serde(rename = "kube.supervisor")]
    KubeSupervisor,
    #[serde(rename = "dhcp.offer")]
    DhcpOffer,
    #[serde(rename = "dhcp.ack")]
    DhcpAck,
    #[serde(rename = "dhcp.nak")]
    DhcpNak,
    #[serde(rename = "dhcp.inform")]
    DhcpInform,
    #[serde(rename = "dhcp.release")]
    DhcpRelease,
    #[serde(rename = "dhcp.decline")]
    DhcpDecline,
    #[serde(rename = "dhcp.proxy_offer")]
    DhcpProxyOffer,
    #[serde(rename = "dhcp.proxy_ack")]
    DhcpProxyAck,
    /// A machine no Hardware names took (or moved to) an address of the
    /// discovery pool.
    #[serde(rename = "discovery.lease")]
    DiscoveryLease,
    /// The discovery pool had no address for a new client (recorded at
    /// most once a minute).
    #[serde(rename = "discovery.exhausted")]
    DiscoveryExhausted,
    #[serde(rename = "tftp.sent")]
    TftpSent,
    #[serde(rename = "tftp.aborted")]
    TftpAborted,
    #[serde(rename = "tftp.refused")]
    TftpRefused,
    #[serde(rename = "ipxe.script")]
    IpxeScript,
    #[serde(rename = "ipxe.refused")]
    IpxeRefused,
    #[serde(rename = "http.artifact")]
    HttpArtifact,
    #[serde(rename = "metadata.read")]
    MetadataRead,
    #[serde(rename = "syslog")]
    Syslog,
    #[serde(rename = "bmc.netboot")]
    BmcNetboot,
    #[serde(rename = "bmc.power")]
    BmcPower,
    #[serde(rename = "bmc.bootdev")]
    BmcBootdev,
    #[serde(rename = "bmc.media")]
    BmcMedia,
    #[serde(rename = "bmc.failed")]
    BmcFailed,
    #[serde(rename = "bmc.power_changed")]
    BmcPowerChanged,
    /// A BMC's inventory was read into its Hardware's status.
    #[serde(rename = "bmc.inventory")]
    BmcInventory,
    #[serde(rename = "workflow.state")]
    WorkflowState,
    #[serde(rename = "workflow.action_started")]
    WorkflowActionStarted,
    #[serde(rename = "workflow.action_succeeded")]
    WorkflowActionSucceeded,
    #[serde(rename = "workflow.action_failed")]
    WorkflowActionFailed,
    /// An agent with no Hardware became Hardware `discovery-<id>`, or was
    /// refused (bounds).
    #[serde(rename = "discovery.hardware")]
    DiscoveryHardware,
    /// A WorkflowRuleSet enrolled an agent (or enrollment failed).
    #[serde(rename = "discovery.enrolled")]
    DiscoveryEnrolled,
    /// A Hardware CAPT released was held for cleaning, cleaned and given
    /// back, failed to clean, or given back uncleaned.
    #[serde(rename = "hardware.cleaning")]
    HardwareCleaning,
    /// A BareMetalHost's provisioning state changed.
    #[serde(rename = "metal3.state")]
    Metal3State,
    /// A BareMetalHost's operation failed (BMO's errorType and message).
    #[serde(rename = "metal3.error")]
    Metal3Error,
    #[cfg(test)]
    #[serde(rename = "test")]
    Test,
}

impl Kind {
    /// The stored name, also a metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::HardwareCreated => "hardware.created",
            Kind::HardwareUpdated => "hardware.updated",
            Kind::HardwareDeleted => "hardware.deleted",
            Kind::HardwareConflict => "hardware.conflict",
            Kind::HardwareCleaning => "hardware.cleaning",
            Kind::KubeInvalid => "kube.invalid",
            Kind::KubeSynced => "kube.synced",
            Kind::KubeDisconnected => "kube.disconnected",
            Kind::KubeLeader => "kube.leader",
            Kind::KubeSupervisor => "kube.supervisor",
            Kind::DhcpOffer => "dhcp.offer",
            Kind::DhcpAck => "dhcp.ack",
            Kind::DhcpNak => "dhcp.nak",
            Kind::DhcpInform => "dhcp.inform",
            Kind::DhcpRelease => "dhcp.release",
            Kind::DhcpDecline => "dhcp.decline",
            Kind::DhcpProxyOffer => "dhcp.proxy_offer",
            Kind::DhcpProxyAck => "dhcp.proxy_ack",
            Kind::DiscoveryLease => "discovery.lease",
            Kind::DiscoveryExhausted => "discovery.exhausted",
            Kind::TftpSent => "tftp.sent",
            Kind::TftpAborted => "tftp.aborted",
            Kind::TftpRefused => "tftp.refused",
            Kind::IpxeScript => "ipxe.script",
            Kind::IpxeRefused => "ipxe.refused",
            Kind::HttpArtifact => "http.artifact",
            Kind::MetadataRead => "metadata.read",
            Kind::Syslog => "syslog",
            Kind::BmcNetboot => "bmc.netboot",
            Kind::BmcPower => "bmc.power",
            Kind::BmcBootdev => "bmc.bootdev",
            Kind::BmcMedia => "bmc.media",
            Kind::BmcFailed => "bmc.failed",
            Kind::BmcPowerChanged => "bmc.power_changed",
            Kind::BmcInventory => "bmc.inventory",
            Kind::Metal3State => "metal3.state",
            Kind::Metal3Error => "metal3.error",
            Kind::WorkflowState => "workflow.state",
            Kind::WorkflowActionStarted => "workflow.action_started",
            Kind::WorkflowActionSucceeded => "workflow.action_succeeded",
            Kind::WorkflowActionFailed => "workflow.action_failed",
            Kind::DiscoveryHardware => "discovery.hardware",
            Kind::DiscoveryEnrolled => "discovery.enrolled",
            #[cfg(test)]
            Kind::Test => "test",
        }
    }
}

impl std::fmt::Display for Kind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An event's text made by the writer rather than where the event
/// happened: the DHCP thread hands over its reply's parts (one allocation)
/// and the writer, at the lowest CPU priority, formats them; an OFFER
/// folded into its ACK ([`fold_offers`]) is never formatted at all.
pub trait Text: Send + Sync + std::fmt::Debug {
    /// The message, and the fields as a JSON object (see [`fields_json`]).
    fn render(&self) -> (String, Option<String>);
}

/// `fields` as the event's JSON text. Should they not serialise, the
/// reason is kept in their place and the log says so: an event is never
/// silently stripped.
pub fn fields_json<T: serde::Serialize>(kind: Kind, fields: &T) -> String {
    serde_json::to_string(fields).unwrap_or_else(|e| {
        tracing::warn!(%kind, error = %e, "event fields do not serialise");
        serde_json::json!({ "fields_error": e.to_string() }).to_string()
    })
}

#[derive(Debug, Clone)]
pub struct Event {
    pub ts_ms: i64,
    pub machine: Option<Key>,
    pub mac: Option<Mac>,
    pub ip: Option<IpAddr>,
    pub kind: Kind,
    pub message: String,
    /// A JSON object, as text: hot paths serialise typed fields straight
    /// into it, and the writer stores it as it is.
    pub fields: Option<String>,
    /// The DHCP transaction id a reply answered: an OFFER and the ACK of
    /// the same client's REQUEST share it ([`fold_offers`]). Not stored.
    pub xid: Option<u32>,
    /// The message and fields still to be made ([`Event::render`]).
    pub text: Option<Arc<dyn Text>>,
}

impl Event {
    pub fn new(kind: Kind, message: impl Into<String>) -> Self {
        Event {
            ts_ms: now_ms(),
            machine: None,
            mac: None,
            ip: None,
            kind,
            message: message.into(),
            fields: None,
            xid: None,
            text: None,
        }
    }

    /// An event whose message and fields `text` makes when it is written.
    pub fn later(kind: Kind, text: Arc<dyn Text>) -> Self {
        let mut e = Event::new(kind, String::new());
        e.text = Some(text);
        e
    }

    /// Make the message and fields of an event created with [`Event::later`].
    pub fn render(&mut self) {
        if let Some(t) = self.text.take() {
            (self.message, self.fields) = t.render();
        }
    }

    pub fn xid(mut self, xid: u32) -> Self {
        self.xid = Some(xid);
        self
    }

    pub fn machine(mut self, key: Key) -> Self {
        self.machine = Some(key);
        self
    }

    pub fn mac(mut self, mac: Mac) -> Self {
        self.mac = Some(mac);
        self
    }

    pub fn ip(mut self, ip: IpAddr) -> Self {
        self.ip = Some(ip);
        self
    }

    /// Fields: anything that serialises as a JSON object (a `json!` map or
    /// a typed struct, which skips building a `Value` first). Should they
    /// not serialise, the event keeps the reason in their place and the log
    /// says so: an event is never silently stripped.
    pub fn fields<T: serde::Serialize>(mut self, fields: T) -> Self {
        self.fields = Some(fields_json(self.kind, &fields));
        self
    }
}

/// Events as they are stored, to whoever listens (the web UI's live
/// pages): the writer publishes what it committed, with the ids, in
/// windows of [`FEED_WINDOW`], and only while someone subscribes, so no
/// listener costs the writer a row. A window is one message to each
/// listener whatever the event rate (a DHCP storm's thousands a second
/// cost 100 open pages four wake-ups a second each, and the newest rows
/// are serialized once for all of them). A listener that falls
/// [`FEED_WINDOWS`] windows behind is told so (`Lagged`) and reads the
/// rest from the log.
#[derive(Clone)]
pub struct Feed(tokio::sync::broadcast::Sender<Arc<Window>>);

/// Windows a listener may fall behind by.
pub const FEED_WINDOWS: usize = 64;
/// How long the writer gathers rows before it publishes them.
pub const FEED_WINDOW: Duration = Duration::from_millis(250);
/// The rows of a window kept as [`Window::newest`].
pub const FEED_NEWEST: usize = 25;
/// A window with this many rows is published at once (bounds the memory).
const WINDOW_MAX: usize = 16384;

/// One window of stored events.
pub struct Window {
    pub rows: Vec<log::EventRow>,
    /// The newest [`FEED_NEWEST`] rows as JSON: what a page that follows
    /// every machine (the dashboard) is sent, serialized once for all.
    pub newest: String,
}

impl Default for Feed {
    fn default() -> Self {
        Feed(tokio::sync::broadcast::Sender::new(FEED_WINDOWS))
    }
}

impl Feed {
    pub fn subscribe(&self) -> tokio::sync::broadcast::Receiver<Arc<Window>> {
        self.0.subscribe()
    }
}

/// The writer's side of the feed: the rows of the window under way.
#[derive(Default)]
struct Gather {
    rows: Vec<log::EventRow>,
    since: Option<tokio::time::Instant>,
}

impl Gather {
    /// The batch `buf`, stored with ids up to `last`.
    fn add(&mut self, feed: &Feed, last: i64, buf: &[Event]) {
        if feed.0.receiver_count() == 0 || buf.is_empty() {
            self.rows.clear();
            self.since = None;
            return;
        }
        let first = last - buf.len() as i64 + 1;
        self.rows.extend(
            buf.iter()
                .enumerate()
                .map(|(i, e)| log::EventRow::stored(first + i as i64, e)),
        );
        let now = tokio::time::Instant::now();
        let since = *self.since.get_or_insert(now);
        if self.rows.len() >= WINDOW_MAX || now >= since + FEED_WINDOW {
            self.publish(feed);
        }
    }

    /// When the window under way closes (now when there is none).
    fn due(&self) -> tokio::time::Instant {
        self.since
            .map_or_else(tokio::time::Instant::now, |s| s + FEED_WINDOW)
    }

    fn publish(&mut self, feed: &Feed) {
        self.since = None;
        if self.rows.is_empty() {
            return;
        }
        let rows = std::mem::take(&mut self.rows);
        let newest = serde_json::to_string(&rows[rows.len().saturating_sub(FEED_NEWEST)..])
            .unwrap_or_else(|_| "[]".into());
        let _ = feed.0.send(Arc::new(Window { rows, newest }));
    }
}

#[derive(Clone)]
pub struct EventSink {
    tx: mpsc::Sender<Event>,
    metrics: Arc<Metrics>,
}

impl EventSink {
    /// Never blocks: a full queue drops the event and counts it.
    pub fn record(&self, e: Event) {
        if self.tx.try_send(e).is_err() {
            self.metrics.events_dropped.inc();
        }
    }
}

/// The sink and its receiving end; run [`writer`] on the receiver.
pub fn channel(queue: usize, metrics: Arc<Metrics>) -> (EventSink, mpsc::Receiver<Event>) {
    let (tx, rx) = mpsc::channel(queue);
    (EventSink { tx, metrics }, rx)
}

/// Stores each DHCP OFFER that its client took within the same batch as
/// part of the ACK's row: the ACK (same MAC, transaction and address) gains
/// `offered_ms_before` in its fields and "(offered N ms before)" in its
/// message, and the OFFER's own row is not written. A DORA is then one row,
/// not two: the rows are most of what the event log costs (SQLite's insert
/// and its index entry, ~2-4 us each), and DHCP at fixed rates was half
/// event log (issue 34). An OFFER not taken, or whose ACK falls in the next
/// batch, keeps its row; of a retried DISCOVER's OFFERs the last is folded.
pub fn fold_offers(buf: &mut Vec<Event>) {
    let mut offers: std::collections::HashMap<(Mac, u32), usize> = Default::default();
    let mut gone = Vec::new();
    for i in 0..buf.len() {
        let (Some(mac), Some(xid)) = (buf[i].mac, buf[i].xid) else {
            continue;
        };
        match buf[i].kind {
            Kind::DhcpOffer => {
                offers.insert((mac, xid), i);
            }
            Kind::DhcpAck => {
                let Some(j) = offers.remove(&(mac, xid)) else {
                    continue;
                };
                if buf[j].ip != buf[i].ip {
                    continue;
                }
                let before = (buf[i].ts_ms - buf[j].ts_ms).max(0);
                let ack = &mut buf[i];
                ack.render();
                ack.message.push_str(" (offered ");
                crate::text::push_dec(&mut ack.message, before as u64);
                ack.message.push_str(" ms before)");
                if let Some(f) = &mut ack.fields
                    && f.ends_with('}')
                {
                    f.pop();
                    if f.len() > 1 {
                        f.push(',');
                    }
                    f.push_str("\"offered_ms_before\":");
                    crate::text::push_dec(f, before as u64);
                    f.push('}');
                }
                gone.push(j);
            }
            _ => {}
        }
    }
    if gone.is_empty() {
        return;
    }
    gone.sort_unstable();
    let mut i = 0;
    let mut next = gone.iter().peekable();
    buf.retain(|_| {
        let drop = next.next_if_eq(&&i).is_some();
        i += 1;
        !drop
    });
}

/// Events a machine may gain beyond `per_machine` before it is trimmed:
/// trimming is a DELETE per machine (an index probe per bucket of 8192
/// events, see the store), so it is done once per this many of its events
/// rather than once per batch. At most `per_machine + SLACK - 1` events of
/// a machine are kept, and exactly `per_machine` after the next start.
pub const SLACK: u32 = 64;

/// Machines (distinct keys) counted between trims at most; when more have
/// pending events, the counts are dropped and the whole table is trimmed in
/// one pass instead. Bounds the writer's memory (a key and a counter each).
const MAX_PENDING: usize = 1 << 17;

/// Which machines need trimming: events written per machine since it was
/// last trimmed. `None` stands for the events that name no machine.
#[derive(Default)]
pub struct Trimmer {
    pending: std::collections::HashMap<Option<Key>, u32>,
    /// Too many machines were pending: trim them all (one pass).
    overflowed: bool,
}

impl Trimmer {
    /// Count a batch; returns the machines to trim with it.
    pub fn count(&mut self, batch: &[Event]) -> Vec<Option<Key>> {
        let mut due = Vec::new();
        for e in batch {
            let n = match self.pending.get_mut(&e.machine) {
                Some(n) => n,
                None => self.pending.entry(e.machine.clone()).or_insert(0),
            };
            *n += 1;
            if *n == SLACK {
                due.push(e.machine.clone());
            }
        }
        for k in &due {
            self.pending.remove(k);
        }
        if self.pending.len() > MAX_PENDING {
            self.pending.clear();
            self.overflowed = true;
        }
        due
    }

    /// Whether every machine needs trimming (too many were pending), once.
    pub fn take_overflow(&mut self) -> bool {
        std::mem::take(&mut self.overflowed)
    }

    /// A transaction that was to trim `due` failed: trim them with their
    /// next event.
    pub fn retry(&mut self, due: Vec<Option<Key>>) {
        for k in due {
            *self.pending.entry(k).or_insert(0) = SLACK - 1;
        }
    }
}

/// Runs [`writer`] on a thread of its own, at the lowest CPU priority
/// ([`crate::priority::lower_this_thread`]), with a runtime of its own;
/// the receiver yields when it has finished. The log's SQLite work runs on
/// this thread too ([`EventLog::insert`] is a blocking call).
/// On the shared runtime its batches (the SQL built and bound for a
/// transaction every 100 ms under load) took time slices on equal terms
/// with the DHCP thread, and a reply then waited behind them. Measured
/// with the server pinned to one core, 100k machines (BENCHMARKS.md):
/// median reply p99 at 12000-16000 DORA/s 0.75-0.79 ms before, 0.45-0.51
/// after, at nice 10 (at 20000-24000 no clear change, 1-2 ms: the
/// DHCP thread still waited in the run queue, which `SCHED_IDLE` ended).
pub fn spawn_writer(
    rx: mpsc::Receiver<Event>,
    log: EventLog,
    feed: Feed,
    metrics: Arc<Metrics>,
    per_machine: u32,
    max_age: Duration,
) -> std::io::Result<tokio::sync::oneshot::Receiver<()>> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let (done, finished) = tokio::sync::oneshot::channel();
    std::thread::Builder::new()
        .name("events".into())
        .spawn(move || {
            crate::priority::lower_this_thread();
            rt.block_on(writer(rx, log, feed, metrics, per_machine, max_age));
            let _ = done.send(());
        })?;
    Ok(finished)
}

/// Drain the queue into the store until every sender is gone, batching what
/// has accumulated while the previous transaction ran. Machines are trimmed
/// to `per_machine` events at start-up, then lazily (see [`SLACK`]). Old
/// events are expired once an hour.
pub async fn writer(
    mut rx: mpsc::Receiver<Event>,
    log: EventLog,
    feed: Feed,
    metrics: Arc<Metrics>,
    per_machine: u32,
    max_age: Duration,
) {
    // Whatever an earlier run left untrimmed (up to SLACK - 1 a machine).
    trim_all(&log, per_machine);
    let mut buf = Vec::with_capacity(BATCH);
    let mut trimmer = Trimmer::default();
    let mut expire = tokio::time::interval(Duration::from_secs(3600));
    expire.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut gather = Gather::default();
    let mut linger = LINGER;
    // Queued events that end a linger (or skip it): a quarter of a batch,
    // or of the queue, so that a storm never fills the queue meanwhile.
    let full = (BATCH / 4).min(rx.max_capacity() / 4).max(1);
    loop {
        tokio::select! {
            n = rx.recv_many(&mut buf, BATCH) => {
                if n == 0 {
                    break;
                }
                // Sleep rather than wait on the queue: a waiting receiver
                // would be woken (another thread unparked) by every event.
                // A batch that is already large (events piled up during
                // the last transaction) goes at once: no rate limit here.
                if buf.len() < full {
                    // In slices, so that a storm starting meanwhile ends it.
                    let until = tokio::time::Instant::now() + linger;
                    loop {
                        let left = until.saturating_duration_since(tokio::time::Instant::now());
                        if left.is_zero() || rx.len() >= full {
                            break;
                        }
                        tokio::time::sleep(left.min(LINGER)).await;
                    }
                    while buf.len() < BATCH {
                        match rx.try_recv() {
                            Ok(e) => buf.push(e),
                            // Empty, or closed: the next recv ends the loop.
                            Err(_) => break,
                        }
                    }
                }
                fold_offers(&mut buf);
                buf.iter_mut().for_each(Event::render);
                let n = buf.len();
                linger = linger_after(n);
                let due = trimmer.count(&buf);
                match log.insert(&buf, &due, per_machine) {
                    Ok(last) => {
                        metrics.events_written.inc_by(n as u64);
                        gather.add(&feed, last, &buf);
                    }
                    Err(e) => {
                        metrics.events_dropped.inc_by(n as u64);
                        tracing::warn!(error = %e, lost = n, "writing events failed");
                        trimmer.retry(due);
                    }
                }
                if trimmer.take_overflow() {
                    trim_all(&log, per_machine);
                }
                buf.clear();
            }
            _ = tokio::time::sleep_until(gather.due()), if gather.since.is_some() => {
                gather.publish(&feed);
            }
            _ = expire.tick() => {
                match log.expire(max_age) {
                    Ok(n) if n > 0 => tracing::info!(deleted = n, "expired old events"),
                    Ok(_) => {}
                    Err(e) => tracing::warn!(error = %e, "expiring events failed"),
                }
            }
        }
    }
    gather.publish(&feed);
    // Machines with pending counts are left for the next start's one pass:
    // trimming 100k of them one by one here would hold up the shutdown.
}

fn trim_all(log: &EventLog, per_machine: u32) {
    match log.trim_all(per_machine) {
        Ok(n) if n > 0 => tracing::info!(deleted = n, "trimmed events"),
        Ok(_) => {}
        Err(e) => tracing::warn!(error = %e, "trimming events failed"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Fields that do not serialise (a map with non-string keys) leave
    /// the reason in the event, not nothing.
    #[test]
    fn fields_that_fail_say_why() {
        let e = Event::new(Kind::Test, "x")
            .fields(std::collections::HashMap::from([((1u8, 2u8), 3u8)]));
        let f: serde_json::Value = serde_json::from_str(e.fields.as_deref().unwrap()).unwrap();
        assert!(
            f["fields_error"]
                .as_str()
                .unwrap()
                .contains("key must be a string"),
            "{f}"
        );
        let e = Event::new(Kind::Test, "x").fields(serde_json::json!({"a": 1}));
        assert_eq!(e.fields.as_deref(), Some(r#"{"a":1}"#));
    }

    #[test]
    fn full_queue_drops_and_counts() {
        let m = Arc::new(Metrics::new());
        let (sink, mut rx) = channel(2, m.clone());
        for i in 0..5 {
            sink.record(Event::new(Kind::Test, format!("e{i}")));
        }
        assert_eq!(m.events_dropped.get(), 3);
        assert_eq!(rx.try_recv().unwrap().message, "e0");
        assert_eq!(rx.try_recv().unwrap().message, "e1");
        assert!(rx.try_recv().is_err());
    }

    /// (nice, scheduling policy) of this process's thread named `name` (or
    /// of the calling thread), from /proc.
    fn priority_of(name: Option<&str>) -> Option<(i64, i64)> {
        let stat = |path: std::path::PathBuf| -> Option<(i64, i64)> {
            let s = std::fs::read_to_string(path).ok()?;
            let f: Vec<&str> = s.rsplit_once(')')?.1.split_whitespace().collect();
            Some((f.get(16)?.parse().ok()?, f.get(38)?.parse().ok()?))
        };
        let Some(name) = name else {
            return stat("/proc/thread-self/stat".into());
        };
        std::fs::read_dir("/proc/self/task")
            .ok()?
            .flatten()
            .find_map(|t| {
                let comm = std::fs::read_to_string(t.path().join("comm")).ok()?;
                (comm.trim() == name).then(|| stat(t.path().join("stat")))?
            })
    }

    /// The writer runs on a thread of its own, under SCHED_IDLE, writes
    /// what it is sent, and says so once the last sender is gone.
    #[tokio::test]
    async fn spawned_writer_runs_idle_and_finishes() {
        let dir = tempfile::tempdir().unwrap();
        let store = EventLog::open(&dir.path().join(log::FILE)).await.unwrap();
        let m = Arc::new(Metrics::new());
        let (sink, rx) = channel(100, m.clone());
        let done = spawn_writer(
            rx,
            store.clone(),
            Feed::default(),
            m.clone(),
            10,
            Duration::from_secs(3600),
        )
        .unwrap();
        sink.record(Event::new(Kind::Test, "one"));
        for _ in 0..200 {
            if m.events_written.get() == 1 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        assert_eq!(m.events_written.get(), 1);
        let (ours, policy) = priority_of(None).unwrap();
        assert_eq!(policy, 0, "the test runs under SCHED_OTHER");
        let want = (ours + i64::from(crate::priority::BACKGROUND_NICE)).min(19);
        assert_eq!(
            priority_of(Some("events")),
            Some((want, crate::priority::SCHED_IDLE))
        );
        drop(sink);
        tokio::time::timeout(Duration::from_secs(10), done)
            .await
            .expect("the writer finishes when the senders are gone")
            .unwrap();
        store.close().await;
    }

    /// A writer on a fresh log with a queue of `queue`, time paused (after
    /// the open: sqlx's pool has timeouts of its own), so lingers are exact.
    async fn paused_writer(
        queue: usize,
    ) -> (
        tempfile::TempDir,
        EventSink,
        Arc<Metrics>,
        tokio::task::JoinHandle<()>,
    ) {
        let dir = tempfile::tempdir().unwrap();
        let store = EventLog::open(&dir.path().join(log::FILE)).await.unwrap();
        tokio::time::pause();
        let m = Arc::new(Metrics::new());
        let (sink, rx) = channel(queue, m.clone());
        let writer = tokio::spawn(writer(
            rx,
            store,
            Feed::default(),
            m.clone(),
            1000,
            Duration::from_secs(3600),
        ));
        (dir, sink, m, writer)
    }

    /// `n` events over 50 machines.
    fn burst(sink: &EventSink, n: usize) {
        for i in 0..n {
            let k = Key::new("default", format!("m{}", i % 50));
            sink.record(Event::new(Kind::Test, "e").machine(k));
        }
    }

    /// Sleeps `ms` of (paused) time.
    async fn at(ms: u64) {
        tokio::time::sleep(Duration::from_millis(ms)).await;
    }

    /// A busy batch makes the writer gather longer before its next commit;
    /// a quiet one brings it back (time paused: exact).
    #[tokio::test]
    async fn a_busy_batch_makes_the_writer_linger_longer() {
        let (_dir, sink, m, writer) = paused_writer(10_000).await;
        burst(&sink, BUSY);
        at(LINGER.as_millis() as u64 + 10).await;
        assert_eq!(m.events_written.get(), BUSY as u64, "the first batch");
        // After a busy batch: not within LINGER, within LINGER_BUSY.
        burst(&sink, 1);
        at(LINGER.as_millis() as u64 + 10).await;
        assert_eq!(m.events_written.get(), BUSY as u64, "lingering longer");
        at((LINGER_BUSY - LINGER).as_millis() as u64).await;
        assert_eq!(m.events_written.get(), BUSY as u64 + 1);
        // After that quiet batch: LINGER again.
        burst(&sink, 1);
        at(LINGER.as_millis() as u64 + 10).await;
        assert_eq!(m.events_written.get(), BUSY as u64 + 2, "back to LINGER");
        drop(sink);
        writer.await.unwrap();
    }

    /// A storm that starts while the writer lingers ends the linger once a
    /// quarter of the queue waits, long before the queue could fill.
    #[tokio::test]
    async fn a_storm_ends_the_linger() {
        let (_dir, sink, m, writer) = paused_writer(10_000).await;
        burst(&sink, BUSY);
        at(LINGER.as_millis() as u64 + 10).await;
        assert_eq!(m.events_written.get(), BUSY as u64);
        // Busy: the next event waits for up to LINGER_BUSY...
        burst(&sink, 1);
        at(150).await;
        assert_eq!(m.events_written.get(), BUSY as u64);
        // ...unless a quarter of the queue (2,500) piles up behind it.
        burst(&sink, 2500);
        at(LINGER.as_millis() as u64 + 10).await;
        assert_eq!(m.events_written.get(), BUSY as u64 + 2501, "within a slice");
        const { assert!(150 + LINGER.as_millis() + 10 < LINGER_BUSY.as_millis()) };
        assert_eq!(m.events_dropped.get(), 0);
        drop(sink);
        writer.await.unwrap();
    }

    #[tokio::test]
    async fn writer_batches_trims_and_exits() {
        let dir = tempfile::tempdir().unwrap();
        let store = EventLog::open(&dir.path().join(log::FILE)).await.unwrap();
        let m = Arc::new(Metrics::new());
        let (sink, rx) = channel(1000, m.clone());
        let k = Key::new("default", "m1");
        for i in 0..50 {
            sink.record(Event::new(Kind::Test, format!("e{i}")).machine(k.clone()));
        }
        sink.record(Event::new(Kind::Test, "stray"));
        drop(sink);
        let feed = Feed::default();
        let mut listener = feed.subscribe();
        writer(
            rx,
            store.clone(),
            feed,
            m.clone(),
            10,
            Duration::from_secs(3600),
        )
        .await;
        assert_eq!(m.events_written.get(), 51);
        // The feed had every event, with the id it was stored under.
        let mut fed = vec![];
        while let Ok(w) = listener.try_recv() {
            // A window's newest rows, serialized once for every page.
            let newest: Vec<log::EventRow> = serde_json::from_str(&w.newest).unwrap();
            assert_eq!(newest, w.rows[w.rows.len().saturating_sub(FEED_NEWEST)..]);
            fed.extend(w.rows.iter().cloned());
        }
        let stored = store
            .query(&EventQuery {
                machine: None,
                after: None,
                limit: 100,
            })
            .await
            .unwrap();
        assert_eq!(fed.len(), 51);
        assert_eq!(fed, stored);
        let q = EventQuery {
            machine: Some(k),
            after: None,
            limit: 100,
        };
        // Fewer than SLACK events: not trimmed until the next start.
        assert_eq!(store.query(&q).await.unwrap().len(), 50);
        let (_sink, rx) = channel(1, m.clone());
        drop(_sink);
        writer(
            rx,
            store.clone(),
            Feed::default(),
            m.clone(),
            10,
            Duration::from_secs(3600),
        )
        .await;
        let rows = store.query(&q).await.unwrap();
        assert_eq!(rows.len(), 10, "trimmed to per_machine");
        assert_eq!(rows.first().unwrap().message, "e40");
        assert_eq!(rows.last().unwrap().message, "e49");
        let all = store
            .query(&EventQuery {
                limit: 100,
                ..Default::default()
            })
            .await
            .unwrap();
        assert_eq!(all.len(), 11);
        assert_eq!(all.last().unwrap().message, "stray");
    }

    fn ev(machine: Option<&Key>, i: usize) -> Event {
        let e = Event::new(Kind::Test, format!("e{i}"));
        match machine {
            Some(k) => e.machine(k.clone()),
            None => e,
        }
    }

    fn reply(kind: Kind, mac: u8, xid: u32, ip: u8, ts_ms: i64) -> Event {
        let mut e = Event::new(kind, format!("DHCP {kind}"))
            .mac(Mac([2, 0, 0, 0, 0, mac]))
            .ip(IpAddr::V4(std::net::Ipv4Addr::new(10, 0, 0, ip)))
            .xid(xid)
            .fields(serde_json::json!({"xid": xid}));
        e.ts_ms = ts_ms;
        e
    }

    #[test]
    fn an_offer_taken_in_the_same_batch_is_folded_into_its_ack() {
        use Kind::{DhcpAck as Ack, DhcpOffer as Offer};
        let mut buf = vec![
            reply(Offer, 1, 7, 1, 1000), // retried DISCOVER: kept
            reply(Offer, 2, 9, 2, 1001), // never taken: kept
            reply(Offer, 1, 7, 1, 1003), // taken: folded
            ev(None, 0),
            reply(Offer, 3, 5, 3, 1004), // ACK for another xid: kept
            reply(Offer, 4, 6, 4, 1004), // ACK for another address: kept
            reply(Ack, 1, 7, 1, 1005),
            reply(Ack, 3, 4, 3, 1006),
            reply(Ack, 4, 6, 9, 1006),
            reply(Ack, 1, 7, 1, 1007), // a second ACK: nothing left to fold
        ];
        let mut plain = Event::new(Ack, "no fields")
            .mac(Mac([2, 0, 0, 0, 0, 5]))
            .xid(1);
        plain.ts_ms = 1010;
        let mut empty = Event::new(Offer, "x").mac(Mac([2, 0, 0, 0, 0, 5])).xid(1);
        empty.ts_ms = 1008;
        empty.fields = Some("{}".into());
        let mut empty_ack = plain.clone();
        empty_ack.fields = Some("{}".into());
        buf.extend([empty, empty_ack, plain]);
        fold_offers(&mut buf);
        let got: Vec<(Kind, i64)> = buf.iter().map(|e| (e.kind, e.ts_ms)).collect();
        assert_eq!(
            got,
            [
                (Offer, 1000),
                (Offer, 1001),
                (Kind::Test, got[2].1),
                (Offer, 1004),
                (Offer, 1004),
                (Ack, 1005),
                (Ack, 1006),
                (Ack, 1006),
                (Ack, 1007),
                (Ack, 1010),
                (Ack, 1010),
            ]
        );
        let folded = &buf[5];
        assert_eq!(folded.message, "DHCP dhcp.ack (offered 2 ms before)");
        let f: serde_json::Value = serde_json::from_str(folded.fields.as_deref().unwrap()).unwrap();
        assert_eq!(f, serde_json::json!({"xid": 7, "offered_ms_before": 2}));
        for e in &buf[6..9] {
            assert!(!e.message.contains("offered"), "{e:?}");
        }
        // An object with no fields yet, and an ACK with none at all.
        assert_eq!(buf[9].fields.as_deref(), Some(r#"{"offered_ms_before":2}"#));
        assert_eq!(buf[9].message, "no fields (offered 2 ms before)");
        assert_eq!(buf[10].fields, None);
        assert_eq!(buf[10].message, "no fields");
    }

    /// Text that counts how often it was made.
    #[derive(Debug)]
    struct Counted(&'static str, std::sync::atomic::AtomicUsize);

    impl Text for Counted {
        fn render(&self) -> (String, Option<String>) {
            self.1.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            (self.0.to_string(), Some(format!(r#"{{"m":"{}"}}"#, self.0)))
        }
    }

    #[test]
    fn a_folded_offer_is_never_formatted_and_its_ack_once() {
        let offer = Arc::new(Counted("offer", 0.into()));
        let ack = Arc::new(Counted("ack", 0.into()));
        let mac = Mac([2, 0, 0, 0, 0, 1]);
        let mut buf = vec![
            Event::later(Kind::DhcpOffer, offer.clone()).mac(mac).xid(3),
            Event::later(Kind::DhcpAck, ack.clone()).mac(mac).xid(3),
        ];
        buf[1].ts_ms = buf[0].ts_ms + 4;
        fold_offers(&mut buf);
        buf.iter_mut().for_each(Event::render);
        assert_eq!(buf.len(), 1);
        assert_eq!(buf[0].message, "ack (offered 4 ms before)");
        assert_eq!(
            buf[0].fields.as_deref(),
            Some(r#"{"m":"ack","offered_ms_before":4}"#)
        );
        assert_eq!(offer.1.load(std::sync::atomic::Ordering::Relaxed), 0);
        assert_eq!(ack.1.load(std::sync::atomic::Ordering::Relaxed), 1);
        assert!(buf[0].text.is_none());
    }

    #[test]
    fn trimmer_asks_once_per_slack_events() {
        let k = Key::new("default", "m1");
        let other = Key::new("default", "m2");
        let mut t = Trimmer::default();
        for i in 0..(SLACK as usize - 1) {
            assert!(t.count(&[ev(Some(&k), i), ev(None, i)]).is_empty());
        }
        let due = t.count(&[ev(Some(&other), 0), ev(Some(&k), 99)]);
        assert_eq!(due, vec![Some(k.clone())]);
        // Counting starts over for m1; m2 and the keyless ones stay pending.
        assert!(t.count(&[ev(Some(&k), 100)]).is_empty());
        let mut pending: Vec<_> = t.pending.keys().cloned().collect();
        pending.sort();
        assert_eq!(pending, vec![None, Some(k.clone()), Some(other)]);
        assert!(!t.take_overflow());
        // A failed trim is retried with the machine's next event.
        t.retry(vec![Some(k.clone())]);
        assert_eq!(t.count(&[ev(Some(&k), 101)]), vec![Some(k)]);
    }

    #[test]
    fn trimmer_memory_is_bounded() {
        let mut t = Trimmer::default();
        let mut due = 0;
        for i in 0..=MAX_PENDING {
            due += t
                .count(&[ev(Some(&Key::new("ns", format!("m{i}"))), i)])
                .len();
        }
        assert_eq!(due, 0, "no machine reached SLACK");
        assert!(t.pending.is_empty(), "counts dropped");
        assert!(t.take_overflow(), "a full trim asked for");
        assert!(!t.take_overflow(), "once");
    }

    async fn count(store: &EventLog, k: &Key) -> usize {
        let q = EventQuery {
            machine: Some(k.clone()),
            after: None,
            limit: 100_000,
        };
        store.query(&q).await.unwrap().len()
    }

    #[tokio::test]
    async fn lazy_trim_keeps_at_most_per_machine_plus_slack() {
        let dir = tempfile::tempdir().unwrap();
        let store = EventLog::open(&dir.path().join(log::FILE)).await.unwrap();
        let k = Key::new("default", "m1");
        let per = 10u32;
        let mut t = Trimmer::default();
        let mut max = 0;
        for i in 0..(3 * SLACK as usize + 5) {
            let batch = [ev(Some(&k), i)];
            let due = t.count(&batch);
            store.insert(&batch, &due, per).unwrap();
            let n = count(&store, &k).await;
            if !due.is_empty() {
                assert_eq!(n, per as usize, "trimmed to per_machine");
            }
            max = max.max(n);
        }
        assert_eq!(max, (per + SLACK - 1) as usize);
        // What a stopped writer leaves untrimmed, start-up trims.
        assert!(count(&store, &k).await > per as usize);
        store.trim_all(per).unwrap();
        assert_eq!(count(&store, &k).await, per as usize);
    }

    #[tokio::test]
    async fn batch_insert_keeps_order_and_content() {
        let dir = tempfile::tempdir().unwrap();
        let store = EventLog::open(&dir.path().join(log::FILE)).await.unwrap();
        let k = Key::new("default", "m1");
        let batch: Vec<Event> = (0..(64 + 32 + 4 + 1))
            .map(|i| {
                ev(Some(&k), i)
                    .mac(Mac([0, 1, 2, 3, 4, i as u8]))
                    .ip(IpAddr::V4(std::net::Ipv4Addr::new(10, 0, 0, i as u8)))
                    .fields(serde_json::json!({"i": i}))
            })
            .collect();
        store.insert(&batch, &[], 1000).unwrap();
        let rows = store
            .query(&EventQuery {
                limit: 1000,
                ..Default::default()
            })
            .await
            .unwrap();
        assert_eq!(rows.len(), batch.len());
        for (i, (r, e)) in rows.iter().zip(&batch).enumerate() {
            assert_eq!(r.message, e.message);
            assert_eq!(r.kind, "test");
            assert_eq!(r.name.as_deref(), Some("m1"));
            assert_eq!(r.mac, Some(e.mac.unwrap().to_string()));
            assert_eq!(r.ip, Some(format!("10.0.0.{i}")));
            assert_eq!(r.fields, Some(serde_json::json!({"i": i})));
        }
    }

    #[tokio::test]
    async fn start_up_trims_every_machine_and_keyless_events() {
        let dir = tempfile::tempdir().unwrap();
        let store = EventLog::open(&dir.path().join(log::FILE)).await.unwrap();
        let a = Key::new("default", "a");
        let b = Key::new("other", "a");
        let batch: Vec<Event> = (0..30)
            .flat_map(|i| [ev(Some(&a), i), ev(Some(&b), i), ev(None, i)])
            .collect();
        store.insert(&batch, &[], 5).unwrap();
        assert_eq!(store.trim_all(5).unwrap(), 75);
        assert_eq!(count(&store, &a).await, 5);
        assert_eq!(count(&store, &b).await, 5);
        let all = store
            .query(&EventQuery {
                limit: 1000,
                ..Default::default()
            })
            .await
            .unwrap();
        assert_eq!(all.len(), 15);
        assert_eq!(all.first().unwrap().message, "e25");
    }
}
