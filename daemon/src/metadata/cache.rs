//! Rendered metadata answers, per caller IP, and the `metadata.read` event
//! window.
//!
//! Every answer is a pure function of the machine and the caller's IP, so
//! it is rendered once and kept until the machine changes: the inventory
//! publishes a new `Arc<Machine>` for every applied change, and an entry is
//! only used while it holds the very `Arc` the current snapshot has
//! (`Arc::ptr_eq`; the entry keeps its `Arc` alive, so the address cannot
//! be reused by another machine). An applied change therefore shows on the
//! next request.
//!
//! Bounded: entries are made only for IPs that are Hardware (the caller
//! checks), at most `max_entries` of them (the map is cleared when full),
//! and at most [`MAX_PATHS`] EC2 paths of at most [`MAX_PATH_LEN`] bytes
//! each per entry (further paths are rendered on every request).
//!
//! Events: cloud-init reads each document once per boot, so one
//! `metadata.read` event per IP and document within `window` is as
//! informative as one per request, and costs the event writer (SQLite) far
//! less under load. The window restarts when the record changes.

use super::Source;
use crate::hardware::view::Details;
use crate::hardware::{Interface, Machine};
use bytes::Bytes;
use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock, RwLock};
use std::time::{Duration, Instant};

/// EC2 paths cached per entry.
pub const MAX_PATHS: usize = 64;
/// Longer EC2 paths are not cached.
pub const MAX_PATH_LEN: usize = 256;
/// Default bound on cached IPs.
pub const MAX_ENTRIES: usize = 8192;
/// Default event window.
pub const WINDOW: Duration = Duration::from_secs(60);

/// The documents whose reads are events.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Read {
    InstanceId = 0,
    UserData,
    VendorData,
    Metadata,
    NocloudMeta,
    NocloudNetwork,
}
const READS: usize = 6;

pub struct Cache {
    map: RwLock<HashMap<IpAddr, Arc<Entry>>>,
    max_entries: usize,
    window: Duration,
    epoch: Instant,
}

/// A rendered document, or why it could not be rendered.
pub type Rendered = Result<Bytes, String>;

/// One caller IP's answers, valid while `machine` is the current one.
pub struct Entry {
    machine: Arc<Machine>,
    /// The caller's interface, by index into `machine.interfaces`.
    iface: usize,
    details: OnceLock<Details>,
    pub metadata: OnceLock<Bytes>,
    pub nocloud_meta: OnceLock<Rendered>,
    pub nocloud_network: OnceLock<Rendered>,
    pub user_data: OnceLock<Option<Bytes>>,
    pub vendor_data: OnceLock<Option<Bytes>>,
    ec2: RwLock<HashMap<Box<str>, Option<Bytes>>>,
    /// Per [`Read`]: when its last event was recorded, in ms since the
    /// cache's epoch, plus one (0: never).
    events: [AtomicU64; READS],
}

impl Default for Cache {
    fn default() -> Self {
        Cache::new(MAX_ENTRIES, WINDOW)
    }
}

impl Cache {
    pub fn new(max_entries: usize, window: Duration) -> Self {
        Cache {
            map: RwLock::new(HashMap::new()),
            max_entries: max_entries.max(1),
            window,
            epoch: Instant::now(),
        }
    }

    /// The entry for `ip`, which the current snapshot found as `iface` of
    /// `machine`.
    pub fn entry(&self, ip: IpAddr, machine: &Arc<Machine>, iface: &Interface) -> Arc<Entry> {
        {
            let map = self.map.read().unwrap_or_else(|e| e.into_inner());
            if let Some(e) = map.get(&ip)
                && Arc::ptr_eq(&e.machine, machine)
            {
                return e.clone();
            }
        }
        let mut map = self.map.write().unwrap_or_else(|e| e.into_inner());
        if let Some(e) = map.get(&ip)
            && Arc::ptr_eq(&e.machine, machine)
        {
            return e.clone();
        }
        if map.len() >= self.max_entries && !map.contains_key(&ip) {
            map.clear();
        }
        let index = machine
            .interfaces
            .iter()
            .position(|i| std::ptr::eq(i, iface))
            .unwrap_or(0);
        let e = Arc::new(Entry::new(machine.clone(), index));
        map.insert(ip, e.clone());
        e
    }

    pub fn len(&self) -> usize {
        self.map.read().unwrap_or_else(|e| e.into_inner()).len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether a read of `what` by this entry's IP is to be an event now:
    /// true for the first read in each window.
    pub fn should_record(&self, e: &Entry, what: Read) -> bool {
        self.should_record_at(e, what, Instant::now())
    }

    fn should_record_at(&self, e: &Entry, what: Read, now: Instant) -> bool {
        let now = u64::try_from(now.saturating_duration_since(self.epoch).as_millis())
            .unwrap_or(u64::MAX - 1)
            + 1;
        let window = u64::try_from(self.window.as_millis()).unwrap_or(u64::MAX);
        let slot = &e.events[what as usize];
        let last = slot.load(Ordering::Relaxed);
        if last != 0 && now.saturating_sub(last) < window {
            return false;
        }
        // Of several readers at once, one records.
        slot.compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
    }
}

impl Entry {
    fn new(machine: Arc<Machine>, iface: usize) -> Self {
        Entry {
            machine,
            iface,
            details: OnceLock::new(),
            metadata: OnceLock::new(),
            nocloud_meta: OnceLock::new(),
            nocloud_network: OnceLock::new(),
            user_data: OnceLock::new(),
            vendor_data: OnceLock::new(),
            ec2: RwLock::new(HashMap::new()),
            events: Default::default(),
        }
    }

    pub fn machine(&self) -> &Arc<Machine> {
        &self.machine
    }

    /// What the answers are rendered from; the details parsed once.
    pub fn source(&self) -> Source<'_> {
        Source {
            machine: &self.machine,
            iface: self
                .machine
                .interfaces
                .get(self.iface)
                .unwrap_or(Interface::none()),
            details: self.details.get_or_init(|| self.machine.details()),
        }
    }

    /// The answer for an EC2 path (`None`: 404), rendered by `render` on
    /// the first request.
    pub fn ec2(&self, path: &str, render: impl FnOnce(&Source) -> Option<String>) -> Option<Bytes> {
        if let Some(b) = self.ec2.read().unwrap_or_else(|e| e.into_inner()).get(path) {
            return b.clone();
        }
        let b = render(&self.source()).map(Bytes::from);
        if path.len() <= MAX_PATH_LEN {
            let mut map = self.ec2.write().unwrap_or_else(|e| e.into_inner());
            if map.len() < MAX_PATHS {
                map.insert(path.into(), b.clone());
            }
        }
        b
    }

    pub fn ec2_len(&self) -> usize {
        self.ec2.read().unwrap_or_else(|e| e.into_inner()).len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hardware;

    fn record(name: &str, ip: &str) -> Arc<Machine> {
        Arc::new(
            hardware::validate(serde_json::json!({
                "apiVersion": hardware::API_VERSION, "kind": "Hardware",
                "metadata": {"name": name},
                "spec": {"interfaces": [{"dhcp": {"mac": "02:00:00:00:00:01", "ip": {"address": ip}}}]}}))
            .unwrap()
            .machine,
        )
    }

    fn entry(c: &Cache, ip: &str, m: &Arc<Machine>) -> Arc<Entry> {
        c.entry(ip.parse().unwrap(), m, &m.interfaces[0])
    }

    #[test]
    fn an_entry_is_reused_while_its_record_is_current() {
        let c = Cache::default();
        let r = record("a", "10.0.0.1");
        let e1 = entry(&c, "10.0.0.1", &r);
        e1.metadata.get_or_init(|| Bytes::from_static(b"old"));
        let e2 = entry(&c, "10.0.0.1", &r);
        assert!(Arc::ptr_eq(&e1, &e2));
        assert_eq!(e2.metadata.get().unwrap(), "old");
        // Same content, new record (an apply): a fresh entry.
        let r2 = record("a", "10.0.0.1");
        let e3 = entry(&c, "10.0.0.1", &r2);
        assert!(!Arc::ptr_eq(&e1, &e3));
        assert!(e3.metadata.get().is_none());
        assert_eq!(c.len(), 1);
    }

    #[test]
    fn entries_are_bounded() {
        let c = Cache::new(3, WINDOW);
        let r = record("a", "10.0.0.1");
        for n in 0..10u8 {
            c.entry(IpAddr::from([10, 0, 0, n]), &r, &r.interfaces[0]);
            assert!(c.len() <= 3);
        }
        assert!(!c.is_empty());
    }

    #[test]
    fn ec2_paths_are_bounded() {
        let c = Cache::default();
        let r = record("a", "10.0.0.1");
        let e = entry(&c, "10.0.0.1", &r);
        for n in 0..MAX_PATHS * 2 {
            let p = format!("meta-data/x{n}");
            assert_eq!(e.ec2(&p, |_| None), None);
        }
        assert_eq!(e.ec2_len(), MAX_PATHS);
        let long = "a".repeat(MAX_PATH_LEN + 1);
        let mut calls = 0;
        for _ in 0..2 {
            e.ec2(&long, |_| {
                calls += 1;
                Some("v".into())
            });
        }
        assert_eq!(calls, 2, "a long path is not cached");
    }

    #[test]
    fn ec2_answers_are_rendered_once() {
        let c = Cache::default();
        let r = record("a", "10.0.0.1");
        let e = entry(&c, "10.0.0.1", &r);
        let mut calls = 0;
        for _ in 0..3 {
            let b = e.ec2("meta-data/hostname", |s| {
                calls += 1;
                Some(s.machine.key.name.clone())
            });
            assert_eq!(b.unwrap(), "a");
        }
        assert_eq!(calls, 1);
    }

    #[test]
    fn reads_are_coalesced_per_window_and_document() {
        let c = Cache::new(10, Duration::from_secs(60));
        let r = record("a", "10.0.0.1");
        let e = entry(&c, "10.0.0.1", &r);
        let t0 = c.epoch;
        assert!(c.should_record_at(&e, Read::Metadata, t0));
        assert!(!c.should_record_at(&e, Read::Metadata, t0 + Duration::from_secs(1)));
        assert!(!c.should_record_at(&e, Read::Metadata, t0 + Duration::from_secs(59)));
        // Another document has its own window.
        assert!(c.should_record_at(&e, Read::InstanceId, t0 + Duration::from_secs(59)));
        assert!(c.should_record_at(&e, Read::Metadata, t0 + Duration::from_secs(60)));
        assert!(!c.should_record_at(&e, Read::Metadata, t0 + Duration::from_secs(61)));
        // A changed record starts afresh.
        let r2 = record("a", "10.0.0.1");
        let e2 = entry(&c, "10.0.0.1", &r2);
        assert!(c.should_record_at(&e2, Read::Metadata, t0 + Duration::from_secs(61)));
    }

    #[test]
    fn a_zero_window_records_every_read() {
        let c = Cache::new(10, Duration::ZERO);
        let r = record("a", "10.0.0.1");
        let e = entry(&c, "10.0.0.1", &r);
        assert!(c.should_record(&e, Read::UserData));
        assert!(c.should_record(&e, Read::UserData));
    }
}
