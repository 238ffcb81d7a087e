//! The in-memory inventory every hot path reads: machines by MAC, by IP and
//! by name, in an immutable snapshot swapped atomically (arc-swap) after each
//! committed write. Readers never lock and never touch SQLite.

use crate::hardware::{Key, Mac, Machine};
use arc_swap::ArcSwap;
use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Arc;

#[derive(Default, Clone)]
pub struct Snapshot {
    by_key: HashMap<Key, Arc<Machine>>,
    by_mac: HashMap<Mac, Arc<Machine>>,
    by_ip: HashMap<IpAddr, Arc<Machine>>,
}

impl Snapshot {
    pub fn build(machines: impl IntoIterator<Item = Machine>) -> Snapshot {
        let mut s = Snapshot::default();
        for m in machines {
            s.insert(Arc::new(m));
        }
        s
    }

    pub fn by_mac(&self, mac: &Mac) -> Option<&Arc<Machine>> {
        self.by_mac.get(mac)
    }

    /// IPv4-mapped IPv6 addresses (`::ffff:a.b.c.d`, what a dual-stack
    /// `[::]` listener sees for IPv4 peers) find the IPv4 machine.
    pub fn by_ip(&self, ip: &IpAddr) -> Option<&Arc<Machine>> {
        self.by_ip.get(&ip.to_canonical())
    }

    pub fn by_key(&self, key: &Key) -> Option<&Arc<Machine>> {
        self.by_key.get(key)
    }

    pub fn len(&self) -> usize {
        self.by_key.len()
    }

    pub fn machines(&self) -> impl Iterator<Item = &Arc<Machine>> {
        self.by_key.values()
    }

    pub fn is_empty(&self) -> bool {
        self.by_key.is_empty()
    }

    fn insert(&mut self, m: Arc<Machine>) {
        self.remove(&m.key);
        for mac in &m.macs {
            self.by_mac.insert(*mac, m.clone());
        }
        for ip in &m.ips {
            self.by_ip.insert(*ip, m.clone());
        }
        self.by_key.insert(m.key.clone(), m);
    }

    fn remove(&mut self, key: &Key) {
        if let Some(old) = self.by_key.remove(key) {
            // Only drop entries still pointing at this machine: within one
            // patch another machine may already have taken the MAC or IP.
            for mac in &old.macs {
                if self.by_mac.get(mac).is_some_and(|m| m.key == *key) {
                    self.by_mac.remove(mac);
                }
            }
            for ip in &old.ips {
                if self.by_ip.get(ip).is_some_and(|m| m.key == *key) {
                    self.by_ip.remove(ip);
                }
            }
        }
    }
}

/// Changes to publish together, after the store committed them.
#[derive(Default)]
pub struct Patch {
    pub upsert: Vec<Machine>,
    pub delete: Vec<Key>,
}

#[derive(Default)]
pub struct Inventory {
    current: ArcSwap<Snapshot>,
}

impl Inventory {
    pub fn new(snapshot: Snapshot) -> Self {
        Inventory {
            current: ArcSwap::from_pointee(snapshot),
        }
    }

    /// The current snapshot; cheap, lock-free, consistent for as long as held.
    pub fn snapshot(&self) -> Arc<Snapshot> {
        self.current.load_full()
    }

    /// Publish a patched copy. Callers serialise writes (the store commit and
    /// this call happen under one lock), so no update is lost. Copying the
    /// maps costs O(n) per write batch; writes are rare next to lookups.
    pub fn apply(&self, patch: Patch) -> usize {
        let mut next = Snapshot::clone(&self.current.load());
        for k in &patch.delete {
            next.remove(k);
        }
        for m in patch.upsert {
            next.insert(Arc::new(m));
        }
        let n = next.len();
        self.current.store(Arc::new(next));
        n
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hardware::HardwareSpec;

    fn machine(name: &str, mac: &str, ip: &str) -> Machine {
        Machine {
            key: Key::new("default", name),
            spec: HardwareSpec::default(),
            macs: vec![mac.parse().unwrap()],
            ips: vec![ip.parse().unwrap()],
        }
    }

    #[test]
    fn lookups_follow_patches() {
        let inv = Inventory::new(Snapshot::build([machine(
            "a",
            "52:54:00:00:00:01",
            "10.0.0.1",
        )]));
        let before = inv.snapshot();
        let mac1: Mac = "52:54:00:00:00:01".parse().unwrap();
        let mac2: Mac = "52:54:00:00:00:02".parse().unwrap();
        assert_eq!(before.by_mac(&mac1).unwrap().key.name, "a");

        // "b" arrives with a's old MAC, then "a" moves to a new MAC and IP:
        // the order within a patch must not matter.
        inv.apply(Patch {
            upsert: vec![
                machine("b", "52:54:00:00:00:01", "10.0.0.3"),
                machine("a", "52:54:00:00:00:02", "10.0.0.2"),
            ],
            delete: vec![],
        });
        let now = inv.snapshot();
        assert_eq!(now.by_mac(&mac2).unwrap().key.name, "a");
        assert_eq!(now.by_mac(&mac1).unwrap().key.name, "b");
        assert!(now.by_ip(&"10.0.0.1".parse().unwrap()).is_none());
        assert_eq!(
            now.by_ip(&"::ffff:10.0.0.2".parse().unwrap())
                .unwrap()
                .key
                .name,
            "a"
        );
        assert_eq!(now.len(), 2);
        // The old snapshot is untouched for readers still holding it.
        assert_eq!(before.by_mac(&mac1).unwrap().key.name, "a");
        assert_eq!(before.len(), 1);

        inv.apply(Patch {
            upsert: vec![],
            delete: vec![Key::new("default", "a")],
        });
        let now = inv.snapshot();
        assert!(now.by_mac(&mac2).is_none());
        assert!(now.by_key(&Key::new("default", "a")).is_none());
        assert_eq!(now.len(), 1);
    }
}
