//! The in-memory inventory every hot path reads: machines by MAC, by IP and
//! by name, in an immutable snapshot swapped atomically (arc-swap) after each
//! committed write. Readers never lock and never touch SQLite.
//!
//! Each machine is one typed [`Machine`] view, shared by the three indexes.
//! A lookup by MAC or IP answers with the machine and the interface that
//! owns the key: the one rule for "which interface is the caller".

use crate::hardware::{Interface, Key, Mac, Machine};
use arc_swap::ArcSwap;
use std::borrow::Borrow;
use std::collections::{HashMap, HashSet};
use std::hash::{Hash, Hasher};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::Arc;

/// A machine in the by-name index, hashed and compared by its key, so that
/// the key is stored once (in the machine) instead of again as a map key.
#[derive(Clone)]
struct ByKey(Arc<Machine>);

impl PartialEq for ByKey {
    fn eq(&self, other: &Self) -> bool {
        self.0.key == other.0.key
    }
}

impl Eq for ByKey {}

impl Hash for ByKey {
    fn hash<H: Hasher>(&self, h: &mut H) {
        self.0.key.hash(h)
    }
}

impl Borrow<Key> for ByKey {
    fn borrow(&self) -> &Key {
        &self.0.key
    }
}

/// A machine and which of its interfaces a key belongs to.
#[derive(Clone)]
struct Slot {
    machine: Arc<Machine>,
    iface: u16,
}

impl Slot {
    fn get(&self) -> Option<(&Arc<Machine>, &Interface)> {
        Some((
            &self.machine,
            self.machine.interfaces.get(usize::from(self.iface))?,
        ))
    }
}

#[derive(Default, Clone)]
pub struct Snapshot {
    by_key: HashSet<ByKey>,
    by_mac: HashMap<Mac, Slot>,
    /// IPv4 and IPv6 apart: an `IpAddr` key takes 17 bytes (24 with the
    /// padding next to a pointer), an `Ipv4Addr` 4.
    by_v4: HashMap<Ipv4Addr, Slot>,
    by_v6: HashMap<Ipv6Addr, Slot>,
}

impl Snapshot {
    pub fn build(machines: impl IntoIterator<Item = Machine>) -> Snapshot {
        let machines = machines.into_iter();
        let n = machines.size_hint().0;
        let mut s = Snapshot {
            by_key: HashSet::with_capacity(n),
            by_mac: HashMap::with_capacity(n),
            by_v4: HashMap::with_capacity(n),
            by_v6: HashMap::default(),
        };
        for m in machines {
            s.insert(Arc::new(m));
        }
        s
    }

    /// The machine with this MAC, and the interface that has it.
    pub fn by_mac(&self, mac: &Mac) -> Option<(&Arc<Machine>, &Interface)> {
        self.by_mac.get(mac)?.get()
    }

    /// The machine with this address, and the interface reserved it.
    /// IPv4-mapped IPv6 addresses (`::ffff:a.b.c.d`, what a dual-stack
    /// `[::]` listener sees for IPv4 peers) find the IPv4 machine.
    pub fn by_ip(&self, ip: &IpAddr) -> Option<(&Arc<Machine>, &Interface)> {
        match ip.to_canonical() {
            IpAddr::V4(a) => self.by_v4.get(&a)?.get(),
            IpAddr::V6(a) => self.by_v6.get(&a)?.get(),
        }
    }

    pub fn by_key(&self, key: &Key) -> Option<&Arc<Machine>> {
        self.by_key.get(key).map(|b| &b.0)
    }

    pub fn len(&self) -> usize {
        self.by_key.len()
    }

    pub fn machines(&self) -> impl Iterator<Item = &Arc<Machine>> {
        self.by_key.iter().map(|b| &b.0)
    }

    pub fn is_empty(&self) -> bool {
        self.by_key.is_empty()
    }

    fn insert(&mut self, m: Arc<Machine>) {
        // One hash of the key, not two (a lookup, then an insert): at
        // start-up this runs 100,000 times.
        if let Some(ByKey(old)) = self.by_key.replace(ByKey(m.clone())) {
            self.unindex(&old);
        }
        for (n, i) in m.interfaces.iter().enumerate() {
            let Ok(iface) = u16::try_from(n) else { break };
            let slot = || Slot {
                machine: m.clone(),
                iface,
            };
            if let Some(mac) = i.mac {
                self.by_mac.insert(mac, slot());
            }
            // The first interface with an address owns it.
            let mine = |s: &Slot| Arc::ptr_eq(&s.machine, &m);
            match i.address {
                Some(IpAddr::V4(a)) if !self.by_v4.get(&a).is_some_and(mine) => {
                    self.by_v4.insert(a, slot());
                }
                Some(IpAddr::V6(a)) if !self.by_v6.get(&a).is_some_and(mine) => {
                    self.by_v6.insert(a, slot());
                }
                _ => {}
            }
        }
    }

    fn remove(&mut self, key: &Key) {
        if let Some(ByKey(old)) = self.by_key.take(key) {
            self.unindex(&old);
        }
    }

    /// Drop the MAC and IP entries of a machine that left the by-name index.
    /// Only those still pointing at it: within one patch another machine
    /// may already have taken the MAC or IP.
    fn unindex(&mut self, old: &Machine) {
        let key = &old.key;
        for mac in old.macs() {
            if self.by_mac.get(&mac).is_some_and(|s| s.machine.key == *key) {
                self.by_mac.remove(&mac);
            }
        }
        for ip in old.ips() {
            match ip {
                IpAddr::V4(a) if self.by_v4.get(&a).is_some_and(|s| s.machine.key == *key) => {
                    self.by_v4.remove(&a);
                }
                IpAddr::V6(a) if self.by_v6.get(&a).is_some_and(|s| s.machine.key == *key) => {
                    self.by_v6.remove(&a);
                }
                _ => {}
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
    use crate::hardware;

    fn machine(ns: &str, name: &str, ifaces: &[(&str, &str)]) -> Machine {
        let interfaces: Vec<serde_json::Value> = ifaces
            .iter()
            .map(|(mac, ip)| serde_json::json!({"dhcp": {"mac": mac, "ip": {"address": ip}}}))
            .collect();
        hardware::validate(serde_json::json!({
            "apiVersion": hardware::API_VERSION, "kind": "Hardware",
            "metadata": {"name": name, "namespace": ns},
            "spec": {"interfaces": interfaces, "userData": "#cloud-config\n"}}))
        .unwrap()
        .machine
    }

    #[test]
    fn lookups_follow_patches() {
        let inv = Inventory::new(Snapshot::build([machine(
            "default",
            "a",
            &[("52:54:00:00:00:01", "10.0.0.1")],
        )]));
        let before = inv.snapshot();
        let mac1: Mac = "52:54:00:00:00:01".parse().unwrap();
        let mac2: Mac = "52:54:00:00:00:02".parse().unwrap();
        assert_eq!(before.by_mac(&mac1).unwrap().0.key.name, "a");

        // "b" arrives with a's old MAC, then "a" moves to a new MAC and IP:
        // the order within a patch must not matter.
        inv.apply(Patch {
            upsert: vec![
                machine("default", "b", &[("52:54:00:00:00:01", "10.0.0.3")]),
                machine("default", "a", &[("52:54:00:00:00:02", "10.0.0.2")]),
            ],
            delete: vec![],
        });
        let now = inv.snapshot();
        assert_eq!(now.by_mac(&mac2).unwrap().0.key.name, "a");
        assert_eq!(now.by_mac(&mac1).unwrap().0.key.name, "b");
        assert!(now.by_ip(&"10.0.0.1".parse().unwrap()).is_none());
        let (m, i) = now.by_ip(&"::ffff:10.0.0.2".parse().unwrap()).unwrap();
        assert_eq!((m.key.name.as_str(), i.mac), ("a", Some(mac2)));
        assert_eq!(now.len(), 2);
        // The old snapshot is untouched for readers still holding it.
        assert_eq!(before.by_mac(&mac1).unwrap().0.key.name, "a");
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

    #[test]
    fn lookups_answer_with_the_owning_interface() {
        let two = machine(
            "lab",
            "x",
            &[
                ("52:54:00:00:00:0a", "10.0.0.10"),
                ("52:54:00:00:00:0b", "fd00::10"),
            ],
        );
        let snap = Snapshot::build([two.clone()]);
        let v6: IpAddr = "fd00::10".parse().unwrap();
        let (got, iface) = snap.by_ip(&v6).unwrap();
        assert_eq!(**got, two);
        assert_eq!(iface.mac, Some("52:54:00:00:00:0b".parse().unwrap()));
        let (_, iface) = snap.by_mac(&"52:54:00:00:00:0a".parse().unwrap()).unwrap();
        assert_eq!(iface.ipv4(), Some(Ipv4Addr::new(10, 0, 0, 10)));
        assert!(Arc::ptr_eq(got, snap.by_key(&two.key).unwrap()));

        let inv = Inventory::new(snap);
        let one = machine("lab", "x", &[("52:54:00:00:00:0b", "fd00::11")]);
        inv.apply(Patch {
            upsert: vec![one.clone()],
            delete: vec![],
        });
        let now = inv.snapshot();
        assert_eq!(now.len(), 1);
        assert!(now.by_ip(&v6).is_none());
        assert!(now.by_ip(&"10.0.0.10".parse().unwrap()).is_none());
        assert!(now.by_mac(&"52:54:00:00:00:0a".parse().unwrap()).is_none());
        let (m, _) = now.by_mac(&"52:54:00:00:00:0b".parse().unwrap()).unwrap();
        assert_eq!(**m, one);
        assert_eq!(now.machines().count(), 1);
    }

    #[test]
    fn a_shared_address_belongs_to_the_first_interface() {
        let m = machine(
            "default",
            "s",
            &[
                ("52:54:00:00:00:01", "10.0.0.9"),
                ("52:54:00:00:00:02", "10.0.0.9"),
            ],
        );
        let snap = Snapshot::build([m]);
        let (_, i) = snap.by_ip(&"10.0.0.9".parse().unwrap()).unwrap();
        assert_eq!(i.mac, Some("52:54:00:00:00:01".parse().unwrap()));
    }
}
