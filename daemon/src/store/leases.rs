//! The discovery pool's leases in the store (`discovery_leases`): what the
//! pool thread ([`crate::dhcp::discovery`]) commits before it answers, and
//! what it loads at start. Addresses and MACs are stored as text, in the
//! forms `hardware_ip` and `hardware_mac` use.

use super::{Store, StoreError};
use crate::clock::now_ms;
use crate::discovery::pool::{Lease, Stored};
use crate::hardware::Mac;
use std::net::Ipv4Addr;

/// One row: a lease, or an address kept out after a DECLINE.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseRow {
    pub ip: Ipv4Addr,
    pub mac: Mac,
    /// `leased` or `declined`.
    pub state: &'static str,
    /// The lease's end, or the end of a declined address's hold.
    pub expires_ms: i64,
    pub updated_ms: i64,
}

/// A row whose text no longer parses (a database edited by hand) is
/// skipped, with a log line: the pool must still start.
fn row_of(ip: &str, mac: &str, state: &str, expires_ms: i64, updated_ms: i64) -> Option<LeaseRow> {
    let parsed = (ip.parse::<Ipv4Addr>(), mac.parse::<Mac>());
    let state = match state {
        "leased" => "leased",
        "declined" => "declined",
        _ => "",
    };
    match parsed {
        (Ok(ip), Ok(mac)) if !state.is_empty() => Some(LeaseRow {
            ip,
            mac,
            state,
            expires_ms,
            updated_ms,
        }),
        _ => {
            tracing::error!(
                ip,
                mac,
                state,
                "store: unreadable discovery_leases row skipped"
            );
            None
        }
    }
}

type RawRow = (String, String, String, i64, i64);

impl Store {
    /// `mac`'s pool lease (its address and when the lease ends, which may
    /// have passed), if it has one: the address a discovered machine's
    /// Hardware can reserve.
    pub async fn discovery_lease(&self, mac: Mac) -> Result<Option<Lease>, StoreError> {
        let row: Option<(String, i64)> = sqlx::query_as(
            "SELECT ip, expires_ms FROM discovery_leases WHERE mac = ? AND state = 'leased'
             ORDER BY expires_ms DESC LIMIT 1",
        )
        .bind(mac.to_string())
        .fetch_optional(self.pool())
        .await?;
        Ok(row.and_then(|(ip, expires_ms)| {
            Some(Lease {
                mac,
                ip: ip.parse().ok()?,
                expires_ms,
            })
        }))
    }

    /// The unexpired lease of `ip`, if any (`/auto.ipxe` of a machine
    /// that has only a pool address).
    pub async fn discovery_lease_by_ip(
        &self,
        ip: Ipv4Addr,
        now: i64,
    ) -> Result<Option<Lease>, StoreError> {
        let row: Option<(String, i64)> = sqlx::query_as(
            "SELECT mac, expires_ms FROM discovery_leases
             WHERE ip = ? AND state = 'leased' AND expires_ms > ?",
        )
        .bind(ip.to_string())
        .bind(now)
        .fetch_optional(self.pool())
        .await?;
        Ok(row.and_then(|(mac, expires_ms)| {
            Some(Lease {
                mac: mac.parse().ok()?,
                ip,
                expires_ms,
            })
        }))
    }

    /// Every row, by address (those that ended included, until the next
    /// start drops them).
    pub async fn discovery_leases(&self) -> Result<Vec<LeaseRow>, StoreError> {
        let rows: Vec<RawRow> =
            sqlx::query_as("SELECT ip, mac, state, expires_ms, updated_ms FROM discovery_leases")
                .fetch_all(self.pool())
                .await?;
        let mut out: Vec<LeaseRow> = rows
            .iter()
            .filter_map(|(ip, mac, st, e, u)| row_of(ip, mac, st, *e, *u))
            .collect();
        out.sort_by_key(|r| r.ip);
        Ok(out)
    }

    /// The pool's state at start: rows that ended are deleted, the rest
    /// returned for [`crate::discovery::pool::Pool::load`].
    pub async fn load_discovery_pool(&self, now: i64) -> Result<Vec<Stored>, StoreError> {
        sqlx::query("DELETE FROM discovery_leases WHERE expires_ms <= ?")
            .bind(now)
            .execute(self.pool())
            .await?;
        Ok(self
            .discovery_leases()
            .await?
            .into_iter()
            .map(|r| match r.state {
                "declined" => Stored::Declined {
                    ip: r.ip,
                    until_ms: r.expires_ms,
                },
                _ => Stored::Leased(Lease {
                    mac: r.mac,
                    ip: r.ip,
                    expires_ms: r.expires_ms,
                }),
            })
            .collect())
    }

    /// Commit a lease (new or renewed): the MAC's lease of another address
    /// goes in the same transaction, since a client holds one address.
    pub async fn put_discovery_lease(&self, l: &Lease) -> Result<(), StoreError> {
        let mut tx = self.pool().begin_with("BEGIN IMMEDIATE").await?;
        let (ip, mac) = (l.ip.to_string(), l.mac.to_string());
        sqlx::query("DELETE FROM discovery_leases WHERE mac = ? AND state = 'leased' AND ip != ?")
            .bind(&mac)
            .bind(&ip)
            .execute(&mut *tx)
            .await?;
        sqlx::query(
            "INSERT INTO discovery_leases (ip, mac, state, expires_ms, updated_ms)
             VALUES (?, ?, 'leased', ?, ?)
             ON CONFLICT (ip) DO UPDATE SET mac = excluded.mac, state = 'leased',
                 expires_ms = excluded.expires_ms, updated_ms = excluded.updated_ms",
        )
        .bind(&ip)
        .bind(&mac)
        .bind(l.expires_ms)
        .bind(now_ms())
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(())
    }

    /// A RELEASE: the lease's row goes (the address is free).
    pub async fn release_discovery_lease(&self, l: &Lease) -> Result<(), StoreError> {
        sqlx::query("DELETE FROM discovery_leases WHERE ip = ? AND mac = ? AND state = 'leased'")
            .bind(l.ip.to_string())
            .bind(l.mac.to_string())
            .execute(self.pool())
            .await?;
        Ok(())
    }

    /// A DECLINE: `ip` is kept out until `until_ms` (its lease ends).
    pub async fn decline_discovery_address(
        &self,
        ip: Ipv4Addr,
        mac: Mac,
        until_ms: i64,
    ) -> Result<(), StoreError> {
        sqlx::query(
            "INSERT INTO discovery_leases (ip, mac, state, expires_ms, updated_ms)
             VALUES (?, ?, 'declined', ?, ?)
             ON CONFLICT (ip) DO UPDATE SET mac = excluded.mac, state = 'declined',
                 expires_ms = excluded.expires_ms, updated_ms = excluded.updated_ms",
        )
        .bind(ip.to_string())
        .bind(mac.to_string())
        .bind(until_ms)
        .bind(now_ms())
        .execute(self.pool())
        .await?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mac(s: &str) -> Mac {
        s.parse().unwrap()
    }

    #[tokio::test]
    async fn leases_round_trip_and_ended_rows_are_dropped_at_load() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("t.db")).await.unwrap();
        let a = mac("02:00:00:00:00:01");
        assert_eq!(store.discovery_lease(a).await.unwrap(), None);
        let l = Lease {
            mac: a,
            ip: "10.0.0.10".parse().unwrap(),
            expires_ms: 5_000,
        };
        store.put_discovery_lease(&l).await.unwrap();
        assert_eq!(store.discovery_lease(a).await.unwrap(), Some(l));
        assert_eq!(
            store.discovery_lease_by_ip(l.ip, 1_000).await.unwrap(),
            Some(l)
        );
        assert_eq!(
            store.discovery_lease_by_ip(l.ip, 5_000).await.unwrap(),
            None
        );
        // The client moves: one lease per MAC.
        let moved = Lease {
            ip: "10.0.0.11".parse().unwrap(),
            expires_ms: 9_000,
            ..l
        };
        store.put_discovery_lease(&moved).await.unwrap();
        assert_eq!(store.discovery_lease(a).await.unwrap(), Some(moved));
        assert_eq!(store.discovery_leases().await.unwrap().len(), 1);
        // Renewed in place.
        let renewed = Lease {
            expires_ms: 20_000,
            ..moved
        };
        store.put_discovery_lease(&renewed).await.unwrap();
        assert_eq!(store.discovery_lease(a).await.unwrap(), Some(renewed));

        let b = mac("02:00:00:00:00:02");
        store
            .decline_discovery_address("10.0.0.12".parse().unwrap(), b, 7_000)
            .await
            .unwrap();
        let rows = store.discovery_leases().await.unwrap();
        assert_eq!(
            rows.iter().map(|r| r.state).collect::<Vec<_>>(),
            ["leased", "declined"]
        );
        assert_eq!(store.discovery_lease(b).await.unwrap(), None);

        // At 8 s the hold has ended: its row goes, the lease stays.
        let loaded = store.load_discovery_pool(8_000).await.unwrap();
        assert_eq!(loaded, [Stored::Leased(renewed)]);
        assert_eq!(store.discovery_leases().await.unwrap().len(), 1);

        store.release_discovery_lease(&renewed).await.unwrap();
        assert_eq!(store.discovery_lease(a).await.unwrap(), None);
        assert!(store.discovery_leases().await.unwrap().is_empty());
    }
}
