//! The in-memory inventory every hot path reads: machines by MAC, by IP and
//! by name, in an immutable snapshot swapped atomically (arc-swap) after each
//! committed write. Readers never lock and never touch SQLite.
//!
//! Each machine is one typed [`Machine`] view, shared by the three indexes.
//! A lookup by MAC or IP answers with the machine and the interface that
//! owns the key: the one rule for "which interface is the caller".
//!
//! A MAC or IP claimed by two machines (only the Kubernetes mirror can
//! store that; the store refuses it otherwise) answers nothing, as in
//! Tinkerbell, until one of them lets go.

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
    /// `spec.agentID`s, each with the machines that name it (discovery
    /// asks whether an agent has Hardware on each of its polls).
    by_agent: HashMap<Box<str>, Vec<Key>>,
    /// The other machines claiming a key the index above has: such a key
    /// answers nothing. Empty unless the cluster has conflicting Hardware.
    dups: Dups,
}

#[derive(Default, Clone)]
struct Dups {
    mac: HashMap<Mac, Vec<Slot>>,
    v4: HashMap<Ipv4Addr, Vec<Slot>>,
    v6: HashMap<Ipv6Addr, Vec<Slot>>,
}

/// A key two or more machines claim.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Conflict {
    /// "MAC 52:54:00:..." or "IP 10.0.0.5".
    pub what: String,
    /// The claimants, sorted.
    pub machines: Vec<Key>,
}

/// Index `slot` under `k`, or, when another machine holds it, as a duplicate.
fn claim<K: Hash + Eq + Copy>(
    index: &mut HashMap<K, Slot>,
    dups: &mut HashMap<K, Vec<Slot>>,
    k: K,
    slot: Slot,
) {
    match index.get(&k) {
        Some(s) if s.machine.key != slot.machine.key => dups.entry(k).or_default().push(slot),
        _ => {
            index.insert(k, slot);
        }
    }
}

/// Drop `key`'s claim on `k`; a duplicate claimant takes the index over.
fn release<K: Hash + Eq + Copy>(
    index: &mut HashMap<K, Slot>,
    dups: &mut HashMap<K, Vec<Slot>>,
    k: K,
    key: &Key,
) {
    if index.get(&k).is_some_and(|s| s.machine.key == *key) {
        index.remove(&k);
        if let Some(d) = dups.get_mut(&k) {
            if let Some(next) = d.pop() {
                index.insert(k, next);
            }
            if d.is_empty() {
                dups.remove(&k);
            }
        }
    } else if let Some(d) = dups.get_mut(&k) {
        d.retain(|s| s.machine.key != *key);
        if d.is_empty() {
            dups.remove(&k);
        }
    }
}

fn conflicts_of<K: Hash + Eq + std::fmt::Display>(
    label: &str,
    index: &HashMap<K, Slot>,
    dups: &HashMap<K, Vec<Slot>>,
    out: &mut Vec<Conflict>,
) {
    for (k, d) in dups {
        let mut machines: Vec<Key> = d.iter().map(|s| s.machine.key.clone()).collect();
        if let Some(s) = index.get(k) {
            machines.push(s.machine.key.clone());
        }
        machines.sort();
        machines.dedup();
        out.push(Conflict {
            what: format!("{label} {k}"),
            machines,
        });
    }
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
            by_agent: HashMap::default(),
            dups: Dups::default(),
        };
        for m in machines {
            s.insert(Arc::new(m));
        }
        s
    }

    /// The machine with this MAC, and the interface that has it.
    pub fn by_mac(&self, mac: &Mac) -> Option<(&Arc<Machine>, &Interface)> {
        if self.dups.mac.contains_key(mac) {
            return None;
        }
        self.by_mac.get(mac)?.get()
    }

    /// The machine with this address, and the interface reserved it.
    /// IPv4-mapped IPv6 addresses (`::ffff:a.b.c.d`, what a dual-stack
    /// `[::]` listener sees for IPv4 peers) find the IPv4 machine.
    pub fn by_ip(&self, ip: &IpAddr) -> Option<(&Arc<Machine>, &Interface)> {
        match ip.to_canonical() {
            IpAddr::V4(a) if !self.dups.v4.contains_key(&a) => self.by_v4.get(&a)?.get(),
            IpAddr::V6(a) if !self.dups.v6.contains_key(&a) => self.by_v6.get(&a)?.get(),
            _ => None,
        }
    }

    /// Every MAC and IP that more than one machine claims, sorted.
    pub fn conflicts(&self) -> Vec<Conflict> {
        let mut out = vec![];
        conflicts_of("MAC", &self.by_mac, &self.dups.mac, &mut out);
        conflicts_of("IP", &self.by_v4, &self.dups.v4, &mut out);
        conflicts_of("IP", &self.by_v6, &self.dups.v6, &mut out);
        out.sort();
        out
    }

    /// The machine whose `spec.agentID` is `agent` (the first by name
    /// when several are).
    pub fn by_agent(&self, agent: &str) -> Option<&Arc<Machine>> {
        self.by_agent
            .get(agent)?
            .first()
            .and_then(|k| self.by_key(k))
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
        if let Some(a) = &m.agent_id {
            let keys = self.by_agent.entry(a.clone()).or_default();
            keys.push(m.key.clone());
            keys.sort();
        }
        for (n, i) in m.interfaces.iter().enumerate() {
            let Ok(iface) = u16::try_from(n) else { break };
            let slot = || Slot {
                machine: m.clone(),
                iface,
            };
            let d = &mut self.dups;
            if let Some(mac) = i.mac {
                claim(&mut self.by_mac, &mut d.mac, mac, slot());
            }
            // The first interface with an address owns it.
            let mine = |s: &Slot| Arc::ptr_eq(&s.machine, &m);
            match i.address {
                Some(IpAddr::V4(a)) if !self.by_v4.get(&a).is_some_and(mine) => {
                    claim(&mut self.by_v4, &mut d.v4, a, slot());
                }
                Some(IpAddr::V6(a)) if !self.by_v6.get(&a).is_some_and(mine) => {
                    claim(&mut self.by_v6, &mut d.v6, a, slot());
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
        if let Some(a) = &old.agent_id
            && let Some(keys) = self.by_agent.get_mut(a)
        {
            keys.retain(|k| k != key);
            if keys.is_empty() {
                self.by_agent.remove(a);
            }
        }
        let d = &mut self.dups;
        for mac in old.macs() {
            release(&mut self.by_mac, &mut d.mac, mac, key);
        }
        for ip in old.ips() {
            match ip {
                IpAddr::V4(a) => release(&mut self.by_v4, &mut d.v4, a, key),
                IpAddr::V6(a) => release(&mut self.by_v6, &mut d.v6, a, key),
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
    /// Snapshots published so far: a reader's cache of what it derived
    /// from the stored documents is good while this has not moved (every
    /// committed Hardware change publishes one).
    generation: std::sync::atomic::AtomicU64,
}

impl Inventory {
    pub fn new(snapshot: Snapshot) -> Self {
        Inventory {
            current: ArcSwap::from_pointee(snapshot),
            generation: Default::default(),
        }
    }

    /// See the field: read it before reading the documents, so that what
    /// is cached under it is at least as new.
    pub fn generation(&self) -> u64 {
        self.generation.load(std::sync::atomic::Ordering::Acquire)
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
        self.generation
            .fetch_add(1, std::sync::atomic::Ordering::Release);
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
    fn every_publication_moves_the_generation() {
        let inv = Inventory::default();
        let g = inv.generation();
        inv.apply(Patch {
            upsert: vec![machine(
                "default",
                "m1",
                &[("52:54:00:00:00:01", "10.0.0.1")],
            )],
            delete: vec![],
        });
        assert_eq!(inv.generation(), g + 1);
        inv.apply(Patch {
            upsert: vec![],
            delete: vec![Key::new("default", "m1")],
        });
        assert_eq!(inv.generation(), g + 2);
        assert!(inv.snapshot().is_empty());
    }

    #[test]
    fn machines_are_found_by_agent_id_until_it_changes() {
        let with_agent = |name: &str, agent: &str| {
            hardware::validate(serde_json::json!({
                "apiVersion": hardware::API_VERSION, "kind": "Hardware",
                "metadata": {"name": name}, "spec": {"agentID": agent}}))
            .unwrap()
            .machine
        };
        let inv = Inventory::new(Snapshot::build([
            with_agent("b", "a1"),
            with_agent("a", "a1"),
        ]));
        let s = inv.snapshot();
        assert_eq!(s.by_agent("a1").unwrap().key.name, "a", "the first by name");
        assert!(s.by_agent("a2").is_none());
        inv.apply(Patch {
            upsert: vec![with_agent("a", "a2")],
            delete: vec![Key::new("default", "b")],
        });
        let s = inv.snapshot();
        assert!(s.by_agent("a1").is_none(), "moved and deleted");
        assert_eq!(s.by_agent("a2").unwrap().key.name, "a");
    }

    #[test]
    fn a_key_two_machines_claim_answers_nothing_until_one_lets_go() {
        let mac: Mac = "52:54:00:00:00:09".parse().unwrap();
        let ip: IpAddr = "10.0.0.9".parse().unwrap();
        let inv = Inventory::new(Snapshot::build([
            machine("default", "a", &[("52:54:00:00:00:09", "10.0.0.9")]),
            machine("default", "b", &[("52:54:00:00:00:09", "10.0.0.10")]),
            machine("other", "c", &[("52:54:00:00:00:0c", "10.0.0.9")]),
        ]));
        let s = inv.snapshot();
        assert!(s.by_mac(&mac).is_none());
        assert!(s.by_ip(&ip).is_none());
        // b's own address still answers.
        assert_eq!(
            s.by_ip(&"10.0.0.10".parse().unwrap()).unwrap().0.key.name,
            "b"
        );
        let conflicts = s.conflicts();
        assert_eq!(
            conflicts,
            vec![
                Conflict {
                    what: "IP 10.0.0.9".into(),
                    machines: vec![Key::new("default", "a"), Key::new("other", "c")]
                },
                Conflict {
                    what: "MAC 52:54:00:00:00:09".into(),
                    machines: vec![Key::new("default", "a"), Key::new("default", "b")]
                },
            ]
        );
        // a goes: b has the MAC, c the IP, alone.
        inv.apply(Patch {
            upsert: vec![],
            delete: vec![Key::new("default", "a")],
        });
        let s = inv.snapshot();
        assert_eq!(s.by_mac(&mac).unwrap().0.key.name, "b");
        assert_eq!(s.by_ip(&ip).unwrap().0.key.name, "c");
        assert!(s.conflicts().is_empty());
        // b changes its MAC to c's: that one conflicts now, and the old
        // one is free.
        inv.apply(Patch {
            upsert: vec![machine(
                "default",
                "b",
                &[("52:54:00:00:00:0c", "10.0.0.10")],
            )],
            delete: vec![],
        });
        let s = inv.snapshot();
        assert!(s.by_mac(&mac).is_none());
        assert!(s.by_mac(&"52:54:00:00:00:0c".parse().unwrap()).is_none());
        assert_eq!(s.conflicts().len(), 1);
        // ... and back: no conflict left.
        inv.apply(Patch {
            upsert: vec![machine(
                "default",
                "b",
                &[("52:54:00:00:00:09", "10.0.0.10")],
            )],
            delete: vec![],
        });
        let s = inv.snapshot();
        assert!(s.conflicts().is_empty());
        assert_eq!(s.by_mac(&mac).unwrap().0.key.name, "b");
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
