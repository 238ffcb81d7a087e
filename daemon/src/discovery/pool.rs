//! The discovery pool, pure: addresses leased to machines nobody entered.
//! No I/O and no clock: the caller passes the time (ms since the epoch)
//! and a predicate saying which addresses a Hardware reserves (read from
//! the current snapshot), and persists what changed before it answers.
//!
//! Rules (RFC 2131 where it has one):
//! - An OFFER holds nothing: a flood of DISCOVERs cannot drain the pool.
//!   Only a REQUEST binds. Two clients offered the same address race for
//!   it; the second gets a NAK and starts again.
//! - A client keeps its address: its bound lease, else its expired one if
//!   nobody took it since (expired leases are remembered, not wiped).
//! - A new client's search starts at a hash of its MAC, so concurrent
//!   DISCOVERs rarely meet, and addresses never used come before expired
//!   leases of others.
//! - A DECLINEd address is out of the pool for `decline_hold`.
//! - An address a Hardware reserves is never offered nor bound.
//!
//! Memory is bounded by the pool's size (at most [`super::POOL_MAX`]):
//! one slot per address, one index entry per slot.

use crate::config::PoolRange;
use crate::hardware::Mac;
use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::net::Ipv4Addr;
use std::time::Duration;

/// A client's lease: its address and when it ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lease {
    pub mac: Mac,
    pub ip: Ipv4Addr,
    pub expires_ms: i64,
}

/// What one address of the pool is, when it is anything.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Slot {
    /// Bound to `mac` until `expires_ms`; after it the address is free,
    /// but remembered as `mac`'s until another client takes it.
    Leased { mac: Mac, expires_ms: i64 },
    /// A client said the address is in use on the wire.
    Declined { until_ms: i64 },
}

/// Why a REQUEST is refused (the NAK's message).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    NotInPool,
    Reserved,
    HeldByOther,
    Declined,
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Refusal::NotInPool => "not in the discovery pool",
            Refusal::Reserved => "reserved by a Hardware",
            Refusal::HeldByOther => "leased to another client",
            Refusal::Declined => "declined as in use on the network",
        })
    }
}

/// How the pool's addresses stand (the metrics and `/healthz`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Counts {
    pub size: usize,
    pub leased: usize,
    pub declined: usize,
    /// Reserved by a Hardware and not leased from the pool.
    pub reserved: usize,
    pub free: usize,
    /// When a lease or a decline hold next ends: the counts change then.
    pub next_change_ms: Option<i64>,
}

/// A row as persisted: a bound lease or a declined address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stored {
    Leased(Lease),
    Declined { ip: Ipv4Addr, until_ms: i64 },
}

pub struct Pool {
    first: u32,
    size: u32,
    lease_ms: i64,
    hold_ms: i64,
    /// By offset from `first`.
    slots: HashMap<u32, Slot>,
    /// Each MAC's one `Leased` slot (bound or expired).
    by_mac: HashMap<Mac, u32>,
    /// Bumped by every change of `slots`.
    changes: u64,
    /// The last scan for a free address found none: at which `changes`,
    /// and until when that stands (the first lease or hold to end, at most
    /// [`FULL_RECHECK_MS`] later, as a Hardware may let an address go). A
    /// flood of new clients at an exhausted pool then costs a lookup each,
    /// not a scan of the range each.
    full: std::cell::Cell<Option<(u64, i64)>>,
}

/// How long an exhausted pool is taken as such without a change.
const FULL_RECHECK_MS: i64 = 1000;

fn ms(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

impl Pool {
    pub fn new(range: PoolRange, lease: Duration, decline_hold: Duration) -> Pool {
        // PoolRange holds at most POOL_MAX addresses (checked when parsed);
        // the min keeps a hand-built one within the bound too.
        let size = range.size().min(super::POOL_MAX) as u32;
        Pool {
            first: u32::from(range.first),
            size,
            lease_ms: ms(lease),
            hold_ms: ms(decline_hold),
            slots: HashMap::new(),
            by_mac: HashMap::new(),
            changes: 0,
            full: std::cell::Cell::new(None),
        }
    }

    /// The persisted state, as [`crate::store::Store::load_discovery_pool`]
    /// reads it: expired leases and holds, and rows outside the range (the
    /// pool was changed), are left out.
    pub fn load(&mut self, rows: impl IntoIterator<Item = Stored>, now: i64) {
        self.changes += 1;
        for row in rows {
            match row {
                Stored::Leased(l) if l.expires_ms > now => {
                    let Some(off) = self.offset(l.ip) else {
                        continue;
                    };
                    // One address per MAC: the later lease wins.
                    if let Some(old) = self.by_mac.get(&l.mac).copied() {
                        match self.slots.get(&old) {
                            Some(Slot::Leased { expires_ms, .. })
                                if *expires_ms >= l.expires_ms =>
                            {
                                continue;
                            }
                            _ => {
                                self.slots.remove(&old);
                            }
                        }
                    }
                    self.put_leased(off, l.mac, l.expires_ms);
                }
                Stored::Declined { ip, until_ms } if until_ms > now => {
                    if let Some(off) = self.offset(ip) {
                        self.clear(off);
                        self.slots.insert(off, Slot::Declined { until_ms });
                    }
                }
                _ => {}
            }
        }
    }

    pub fn size(&self) -> usize {
        self.size as usize
    }

    pub fn lease_ms(&self) -> i64 {
        self.lease_ms
    }

    pub fn contains(&self, ip: Ipv4Addr) -> bool {
        self.offset(ip).is_some()
    }

    fn offset(&self, ip: Ipv4Addr) -> Option<u32> {
        let off = u32::from(ip).checked_sub(self.first)?;
        (off < self.size).then_some(off)
    }

    fn ip(&self, off: u32) -> Ipv4Addr {
        Ipv4Addr::from(self.first.wrapping_add(off))
    }

    /// `mac`'s bound (unexpired) lease.
    pub fn lease_of(&self, mac: &Mac, now: i64) -> Option<Lease> {
        let off = *self.by_mac.get(mac)?;
        match self.slots.get(&off) {
            Some(Slot::Leased { mac: m, expires_ms }) if m == mac && *expires_ms > now => {
                Some(Lease {
                    mac: *mac,
                    ip: self.ip(off),
                    expires_ms: *expires_ms,
                })
            }
            _ => None,
        }
    }

    /// Who holds `ip` now (a bound lease).
    pub fn holder(&self, ip: Ipv4Addr, now: i64) -> Option<Mac> {
        match self.slots.get(&self.offset(ip)?) {
            Some(Slot::Leased { mac, expires_ms }) if *expires_ms > now => Some(*mac),
            _ => None,
        }
    }

    /// Whether `mac` may have the address at `off` now.
    fn available(
        &self,
        off: u32,
        mac: &Mac,
        now: i64,
        reserved: &dyn Fn(Ipv4Addr) -> bool,
    ) -> bool {
        let free = match self.slots.get(&off) {
            None => true,
            Some(Slot::Leased { mac: m, expires_ms }) => m == mac || *expires_ms <= now,
            Some(Slot::Declined { until_ms }) => *until_ms <= now,
        };
        free && !reserved(self.ip(off))
    }

    /// The address to OFFER `mac` (nothing is held): its lease, its last
    /// address, the one it asks for (option 50), else a free one from the
    /// hash of its MAC. `None`: the pool is exhausted.
    pub fn offer(
        &self,
        mac: &Mac,
        requested: Option<Ipv4Addr>,
        now: i64,
        reserved: &dyn Fn(Ipv4Addr) -> bool,
    ) -> Option<Ipv4Addr> {
        if let Some(off) = self.by_mac.get(mac).copied()
            && self.available(off, mac, now, reserved)
        {
            return Some(self.ip(off));
        }
        if let Some(off) = requested.and_then(|ip| self.offset(ip))
            && self.available(off, mac, now, reserved)
        {
            return Some(self.ip(off));
        }
        if let Some((changes, until)) = self.full.get()
            && changes == self.changes
            && now < until
        {
            return None;
        }
        let start = start_of(mac, self.size);
        // One pass at most: the first address never used (or whose hold
        // ended), else the first expired lease of another client.
        let mut expired = None;
        let mut next_end = now.saturating_add(FULL_RECHECK_MS);
        for i in 0..self.size {
            let off = (start + i) % self.size;
            match self.slots.get(&off) {
                None => {
                    if !reserved(self.ip(off)) {
                        return Some(self.ip(off));
                    }
                }
                Some(Slot::Declined { until_ms }) => {
                    if *until_ms <= now && !reserved(self.ip(off)) {
                        return Some(self.ip(off));
                    }
                    if *until_ms > now {
                        next_end = next_end.min(*until_ms);
                    }
                }
                Some(Slot::Leased { expires_ms, .. }) => {
                    if expired.is_none() && *expires_ms <= now && !reserved(self.ip(off)) {
                        expired = Some(off);
                    }
                    if *expires_ms > now {
                        next_end = next_end.min(*expires_ms);
                    }
                }
            }
        }
        if expired.is_none() {
            self.full.set(Some((self.changes, next_end)));
        }
        expired.map(|off| self.ip(off))
    }

    /// Whether `mac` may bind `ip` now (a REQUEST), and the lease it would
    /// get. Changes nothing: the caller persists, then [`Pool::bind`]s.
    pub fn check_request(
        &self,
        mac: &Mac,
        ip: Ipv4Addr,
        now: i64,
        reserved: &dyn Fn(Ipv4Addr) -> bool,
    ) -> Result<Lease, Refusal> {
        let off = self.offset(ip).ok_or(Refusal::NotInPool)?;
        if reserved(ip) {
            return Err(Refusal::Reserved);
        }
        match self.slots.get(&off) {
            Some(Slot::Leased { mac: m, expires_ms }) if m != mac && *expires_ms > now => {
                return Err(Refusal::HeldByOther);
            }
            Some(Slot::Declined { until_ms }) if *until_ms > now => {
                return Err(Refusal::Declined);
            }
            _ => {}
        }
        Ok(Lease {
            mac: *mac,
            ip,
            expires_ms: now.saturating_add(self.lease_ms),
        })
    }

    /// Bind a lease [`Pool::check_request`] gave: the MAC's other address,
    /// if any, is let go. True when the MAC had no bound lease on this
    /// address (a new lease, not a renewal).
    pub fn bind(&mut self, l: Lease, now: i64) -> bool {
        let Some(off) = self.offset(l.ip) else {
            return false;
        };
        let renewal = self.lease_of(&l.mac, now).is_some_and(|old| old.ip == l.ip);
        self.changes += 1;
        if let Some(old) = self.by_mac.get(&l.mac).copied()
            && old != off
        {
            self.slots.remove(&old);
        }
        self.clear(off);
        self.put_leased(off, l.mac, l.expires_ms);
        !renewal
    }

    /// `check_request` then `bind`, for callers with nothing to persist.
    pub fn request(
        &mut self,
        mac: &Mac,
        ip: Ipv4Addr,
        now: i64,
        reserved: &dyn Fn(Ipv4Addr) -> bool,
    ) -> Result<Lease, Refusal> {
        let l = self.check_request(mac, ip, now, reserved)?;
        self.bind(l, now);
        Ok(l)
    }

    /// A RELEASE of `ip` by `mac`: the lease it ends, if `mac` held it.
    /// The address becomes free at once, and is forgotten as `mac`'s.
    pub fn check_release(&self, mac: &Mac, ip: Ipv4Addr, now: i64) -> Option<Lease> {
        self.lease_of(mac, now).filter(|l| l.ip == ip)
    }

    pub fn release(&mut self, l: &Lease) {
        if let Some(off) = self.offset(l.ip)
            && self.by_mac.get(&l.mac) == Some(&off)
        {
            self.changes += 1;
            self.clear(off);
        }
    }

    /// A DECLINE of `ip` by `mac`: the hold's end when `mac` held it.
    pub fn check_decline(&self, mac: &Mac, ip: Ipv4Addr, now: i64) -> Option<i64> {
        self.lease_of(mac, now)
            .filter(|l| l.ip == ip)
            .map(|_| now.saturating_add(self.hold_ms))
    }

    /// Keep `ip` out of the pool until `until_ms` (its lease, if any, ends).
    pub fn decline(&mut self, ip: Ipv4Addr, until_ms: i64) {
        if let Some(off) = self.offset(ip) {
            self.changes += 1;
            self.clear(off);
            self.slots.insert(off, Slot::Declined { until_ms });
        }
    }

    /// Forget holds that ended (expired leases stay, as their MAC's last
    /// address). True when something changed.
    pub fn expire(&mut self, now: i64) -> bool {
        let before = self.slots.len();
        self.slots
            .retain(|_, s| !matches!(s, Slot::Declined { until_ms } if *until_ms <= now));
        let changed = self.slots.len() != before;
        if changed {
            self.changes += 1;
        }
        changed
    }

    /// How the addresses stand; one pass over the range.
    pub fn counts(&self, now: i64, reserved: &dyn Fn(Ipv4Addr) -> bool) -> Counts {
        let mut c = Counts {
            size: self.size(),
            ..Counts::default()
        };
        let mut next = |t: i64| {
            c.next_change_ms = Some(c.next_change_ms.map_or(t, |n: i64| n.min(t)));
        };
        let (mut leased, mut declined, mut reserved_n) = (0, 0, 0);
        for off in 0..self.size {
            match self.slots.get(&off) {
                Some(Slot::Leased { expires_ms, .. }) if *expires_ms > now => {
                    leased += 1;
                    next(*expires_ms);
                    continue;
                }
                Some(Slot::Declined { until_ms }) if *until_ms > now => {
                    declined += 1;
                    next(*until_ms);
                    continue;
                }
                _ => {}
            }
            if reserved(self.ip(off)) {
                reserved_n += 1;
            }
        }
        c.leased = leased;
        c.declined = declined;
        c.reserved = reserved_n;
        c.free = c.size - leased - declined - reserved_n;
        c
    }

    /// Bound leases and active holds, for a listing.
    pub fn entries(&self, now: i64) -> Vec<Stored> {
        let mut out: Vec<Stored> = self
            .slots
            .iter()
            .filter_map(|(off, s)| match *s {
                Slot::Leased { mac, expires_ms } if expires_ms > now => {
                    Some(Stored::Leased(Lease {
                        mac,
                        ip: self.ip(*off),
                        expires_ms,
                    }))
                }
                Slot::Declined { until_ms } if until_ms > now => Some(Stored::Declined {
                    ip: self.ip(*off),
                    until_ms,
                }),
                _ => None,
            })
            .collect();
        out.sort_by_key(|s| match s {
            Stored::Leased(l) => l.ip,
            Stored::Declined { ip, .. } => *ip,
        });
        out
    }

    /// Empty the slot at `off`, and its MAC's index entry.
    fn clear(&mut self, off: u32) {
        if let Some(Slot::Leased { mac, .. }) = self.slots.remove(&off)
            && self.by_mac.get(&mac) == Some(&off)
        {
            self.by_mac.remove(&mac);
        }
    }

    fn put_leased(&mut self, off: u32, mac: Mac, expires_ms: i64) {
        self.slots.insert(off, Slot::Leased { mac, expires_ms });
        self.by_mac.insert(mac, off);
    }
}

/// Where a MAC's search for a free address starts. std's SipHash with its
/// fixed keys: the same MAC starts at the same place after a restart.
fn start_of(mac: &Mac, size: u32) -> u32 {
    let mut h = std::hash::DefaultHasher::new();
    mac.hash(&mut h);
    (h.finish() % u64::from(size.max(1))) as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIN: i64 = 60_000;
    const T0: i64 = 1_000_000_000;

    fn range(first: &str, last: &str) -> PoolRange {
        PoolRange {
            first: first.parse().unwrap(),
            last: last.parse().unwrap(),
        }
    }

    /// 10.0.0.10-10.0.0.19, leases of 10 min, holds of 5 min.
    fn pool() -> Pool {
        Pool::new(
            range("10.0.0.10", "10.0.0.19"),
            Duration::from_secs(600),
            Duration::from_secs(300),
        )
    }

    fn mac(i: u32) -> Mac {
        let b = i.to_be_bytes();
        Mac([0x02, 0, b[0], b[1], b[2], b[3]])
    }

    fn ip(s: &str) -> Ipv4Addr {
        s.parse().unwrap()
    }

    const NONE: &dyn Fn(Ipv4Addr) -> bool = &|_| false;

    fn take(p: &mut Pool, m: Mac, now: i64) -> Lease {
        let a = p.offer(&m, None, now, NONE).expect("an address");
        p.request(&m, a, now, NONE).expect("bound")
    }

    #[test]
    fn offers_hold_nothing_so_a_flood_cannot_drain_the_pool() {
        let p = pool();
        for i in 0..100_000 {
            assert!(p.offer(&mac(i), None, T0, NONE).is_some());
        }
        let c = p.counts(T0, NONE);
        assert_eq!((c.leased, c.free), (0, 10));
    }

    #[test]
    fn a_client_keeps_its_address_across_discovers_and_after_expiry() {
        let mut p = pool();
        let a = take(&mut p, mac(1), T0);
        assert!(p.contains(a.ip));
        assert_eq!(a.expires_ms, T0 + 10 * MIN);
        for _ in 0..5 {
            assert_eq!(p.offer(&mac(1), None, T0 + MIN, NONE), Some(a.ip));
        }
        // Asking for another address does not move a bound client.
        let other = if a.ip == ip("10.0.0.10") {
            "10.0.0.11"
        } else {
            "10.0.0.10"
        };
        assert_eq!(p.offer(&mac(1), Some(ip(other)), T0, NONE), Some(a.ip));
        // Expired but not taken since: still its own.
        let later = T0 + 60 * MIN;
        assert_eq!(p.lease_of(&mac(1), later), None);
        assert_eq!(p.offer(&mac(1), None, later, NONE), Some(a.ip));
        // A renewal extends the lease and is not a new one.
        let r = p.check_request(&mac(1), a.ip, T0 + 5 * MIN, NONE).unwrap();
        assert!(!p.bind(r, T0 + 5 * MIN));
        assert_eq!(p.lease_of(&mac(1), T0).unwrap().expires_ms, T0 + 15 * MIN);
    }

    #[test]
    fn a_restart_keeps_leases_and_holds_and_drops_what_ended() {
        let mut p = pool();
        let a = take(&mut p, mac(1), T0);
        let b = take(&mut p, mac(2), T0);
        let held = p.offer(&mac(3), None, T0, NONE).unwrap();
        p.decline(held, T0 + 5 * MIN);
        let rows = p.entries(T0);
        assert_eq!(rows.len(), 3);
        let mut q = pool();
        q.load(rows.clone(), T0 + MIN);
        assert_eq!(q.lease_of(&mac(1), T0 + MIN), Some(a));
        assert_eq!(q.lease_of(&mac(2), T0 + MIN), Some(b));
        assert_eq!(q.holder(b.ip, T0 + MIN), Some(mac(2)));
        assert_eq!(q.counts(T0 + MIN, NONE).declined, 1);
        // Loaded after everything ended: nothing is kept.
        let mut r = pool();
        r.load(rows, T0 + 11 * MIN);
        assert_eq!(r.counts(T0 + 11 * MIN, NONE).free, 10);
        // Rows outside the (changed) range are left out.
        let mut s = Pool::new(
            range("10.0.0.100", "10.0.0.101"),
            Duration::from_secs(600),
            Duration::ZERO,
        );
        s.load([Stored::Leased(a)], T0);
        assert_eq!(s.lease_of(&mac(1), T0), None);
    }

    #[test]
    fn reserved_addresses_are_never_offered_nor_bound() {
        let mut p = pool();
        let reserved = |a: Ipv4Addr| a != ip("10.0.0.17");
        for i in 0..50 {
            assert_eq!(p.offer(&mac(i), None, T0, &reserved), Some(ip("10.0.0.17")));
        }
        assert_eq!(
            p.check_request(&mac(1), ip("10.0.0.12"), T0, &reserved),
            Err(Refusal::Reserved)
        );
        let l = p.request(&mac(1), ip("10.0.0.17"), T0, &reserved).unwrap();
        assert_eq!(p.offer(&mac(2), None, T0, &reserved), None, "exhausted");
        // A lease whose address a Hardware reserves since is not offered
        // again, nor renewed.
        let now_reserved = |_: Ipv4Addr| true;
        assert_eq!(p.offer(&mac(1), None, T0, &now_reserved), None);
        assert_eq!(
            p.check_request(&mac(1), l.ip, T0, &now_reserved),
            Err(Refusal::Reserved)
        );
        let c = p.counts(T0, &reserved);
        assert_eq!((c.leased, c.reserved, c.free), (1, 9, 0));
    }

    #[test]
    fn a_request_for_an_address_another_client_holds_gets_a_nak() {
        let mut p = pool();
        let a = take(&mut p, mac(1), T0);
        assert_eq!(
            p.check_request(&mac(2), a.ip, T0, NONE),
            Err(Refusal::HeldByOther)
        );
        assert_eq!(
            p.check_request(&mac(2), ip("10.0.0.9"), T0, NONE),
            Err(Refusal::NotInPool)
        );
        assert_eq!(
            p.check_request(&mac(2), ip("10.0.0.20"), T0, NONE),
            Err(Refusal::NotInPool)
        );
        // Two clients offered the same address: the first REQUEST wins.
        let mut q = pool();
        let x = ip("10.0.0.15");
        q.request(&mac(7), x, T0, NONE).unwrap();
        assert_eq!(q.request(&mac(8), x, T0, NONE), Err(Refusal::HeldByOther));
        // Once the lease expired, another client may have it; the first
        // then gets another address.
        let later = T0 + 11 * MIN;
        assert_eq!(q.request(&mac(8), x, later, NONE).unwrap().ip, x);
        assert_eq!(q.holder(x, later), Some(mac(8)));
        assert_ne!(q.offer(&mac(7), None, later, NONE), Some(x));
    }

    #[test]
    fn a_client_holds_one_address() {
        let mut p = pool();
        let a = take(&mut p, mac(1), T0);
        let other = if a.ip == ip("10.0.0.10") {
            ip("10.0.0.11")
        } else {
            ip("10.0.0.10")
        };
        assert!(p.request(&mac(1), other, T0, NONE).is_ok());
        assert_eq!(p.holder(a.ip, T0), None);
        assert_eq!(p.holder(other, T0), Some(mac(1)));
        assert_eq!(p.counts(T0, NONE).leased, 1);
    }

    #[test]
    fn new_clients_start_apart_and_prefer_unused_addresses() {
        let p = Pool::new(
            range("10.1.0.0", "10.1.255.255"),
            Duration::from_secs(600),
            Duration::ZERO,
        );
        let offers: std::collections::HashSet<Ipv4Addr> = (0..100)
            .filter_map(|i| p.offer(&mac(i), None, T0, NONE))
            .collect();
        assert!(offers.len() > 95, "{} distinct of 100", offers.len());
        // An expired lease of another client is taken only when no address
        // was never used.
        let mut q = Pool::new(
            range("10.0.0.10", "10.0.0.11"),
            Duration::from_secs(600),
            Duration::ZERO,
        );
        let a = take(&mut q, mac(1), T0);
        let later = T0 + 11 * MIN;
        let b = q.offer(&mac(2), None, later, NONE).unwrap();
        assert_ne!(a.ip, b, "the unused address first");
        q.request(&mac(2), b, later, NONE).unwrap();
        assert_eq!(q.offer(&mac(3), None, later, NONE), Some(a.ip));
    }

    #[test]
    fn declined_addresses_stay_out_for_the_hold() {
        let mut p = pool();
        let a = take(&mut p, mac(1), T0);
        assert_eq!(p.check_decline(&mac(2), a.ip, T0), None, "not its address");
        let until = p.check_decline(&mac(1), a.ip, T0).unwrap();
        assert_eq!(until, T0 + 5 * MIN);
        p.decline(a.ip, until);
        assert_eq!(p.lease_of(&mac(1), T0), None);
        for i in 0..200 {
            assert_ne!(p.offer(&mac(i), Some(a.ip), T0 + MIN, NONE), Some(a.ip));
        }
        assert_eq!(
            p.check_request(&mac(1), a.ip, T0 + MIN, NONE),
            Err(Refusal::Declined)
        );
        let c = p.counts(T0 + MIN, NONE);
        assert_eq!((c.declined, c.free, c.next_change_ms), (1, 9, Some(until)));
        assert!(p.expire(until));
        assert_eq!(p.counts(until, NONE).free, 10);
        assert!(p.request(&mac(1), a.ip, until, NONE).is_ok());
    }

    #[test]
    fn release_frees_the_address_at_once() {
        let mut p = pool();
        let a = take(&mut p, mac(1), T0);
        assert_eq!(p.check_release(&mac(2), a.ip, T0), None);
        assert_eq!(p.check_release(&mac(1), ip("10.0.0.9"), T0), None);
        let l = p.check_release(&mac(1), a.ip, T0).unwrap();
        p.release(&l);
        assert_eq!(p.holder(a.ip, T0), None);
        assert_eq!(p.counts(T0, NONE).free, 10);
        assert!(p.request(&mac(2), a.ip, T0, NONE).is_ok());
    }

    #[test]
    fn exhaustion_and_bounds() {
        let mut p = pool();
        for i in 0..10 {
            take(&mut p, mac(i), T0);
        }
        assert_eq!(p.offer(&mac(99), None, T0, NONE), None);
        // A release is seen at once, whatever was remembered.
        let mut q = pool();
        let held: Vec<Lease> = (0..10).map(|i| take(&mut q, mac(i), T0)).collect();
        assert_eq!(q.offer(&mac(99), None, T0, NONE), None);
        q.release(&held[3]);
        assert_eq!(q.offer(&mac(99), None, T0, NONE), Some(held[3].ip));
        let c = p.counts(T0, NONE);
        assert_eq!(
            (c.leased, c.free, c.next_change_ms),
            (10, 0, Some(T0 + 10 * MIN))
        );
        // Leases that expired make room again.
        assert!(p.offer(&mac(99), None, T0 + 10 * MIN, NONE).is_some());
        // More clients than addresses, and one client churning through
        // addresses, never grow the state past the pool's size.
        let mut small = Pool::new(
            range("10.3.0.0", "10.3.0.255"),
            Duration::from_secs(600),
            Duration::ZERO,
        );
        for i in 0..1000 {
            if let Some(a) = small.offer(&mac(i), None, T0, NONE) {
                small.request(&mac(i), a, T0, NONE).unwrap();
            }
            let churn = Ipv4Addr::from(u32::from(ip("10.3.0.0")) + i % 256);
            let _ = small.request(&mac(5000), churn, T0, NONE);
        }
        assert_eq!(small.slots.len(), 256);
        assert_eq!(small.by_mac.len(), 256);
        assert_eq!(small.offer(&mac(9999), None, T0, NONE), None);
        // The largest pool: POOL_MAX addresses, and a search over all of
        // them when none is free ends.
        let big = Pool::new(
            range("10.2.0.0", "10.2.255.255"),
            Duration::from_secs(60),
            Duration::ZERO,
        );
        assert_eq!(big.size(), crate::discovery::POOL_MAX);
        assert_eq!(big.offer(&mac(1), None, T0, &|_| true), None);
        // ... and is not searched again at once: another new client is
        // answered from the last search until something changes, or for
        // at most FULL_RECHECK_MS (a Hardware may let an address go).
        assert_eq!(big.offer(&mac(2), None, T0 + 1, NONE), None, "remembered");
        assert!(
            big.offer(&mac(2), None, T0 + FULL_RECHECK_MS, NONE)
                .is_some()
        );
        assert_eq!(
            big.counts(T0, &|_| true).reserved,
            crate::discovery::POOL_MAX
        );
    }
}
