//! What the listeners share: config, store, inventory, event sink, metrics,
//! and the write path that keeps the store and the inventory in step.

use crate::config::Config;
use crate::events::{Event, EventSink};
use crate::hardware::{Hardware, Key};
use crate::inventory::{Inventory, Patch};
use crate::metrics::Metrics;
use crate::store::{Outcome, Store, StoreError};
use std::sync::Arc;
use tokio::sync::Mutex;

pub struct App {
    pub config: Config,
    /// Resolved `public_ip`: in DHCP replies, boot URLs, syslog_host=.
    pub public_ip: std::net::Ipv4Addr,
    /// The iPXE binaries, for TFTP and `/ipxe/binary/`.
    pub files: crate::tftp::Files,
    /// IMDSv2 token signer.
    pub tokens: crate::metadata::token::Tokens,
    pub store: Store,
    pub inventory: Arc<Inventory>,
    pub events: EventSink,
    pub metrics: Arc<Metrics>,
    /// Runs BMC jobs.
    pub bmc: Arc<crate::bmc::jobs::Runner>,
    /// Held across "commit to SQLite, then publish the snapshot" so that
    /// snapshots are published in commit order.
    write: Mutex<()>,
}

impl App {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        config: Config,
        public_ip: std::net::Ipv4Addr,
        files: crate::tftp::Files,
        store: Store,
        inventory: Arc<Inventory>,
        events: EventSink,
        metrics: Arc<Metrics>,
        bmc: Arc<crate::bmc::jobs::Runner>,
    ) -> Self {
        metrics.hardware.set(inventory.snapshot().len() as i64);
        App {
            config,
            public_ip,
            files,
            tokens: crate::metadata::token::Tokens::new().expect("system RNG"), // ok: no RNG means no safe tokens at all
            store,
            inventory,
            events,
            metrics,
            bmc,
            write: Mutex::new(()),
        }
    }

    /// Apply a batch atomically: store first, then the inventory, then the
    /// events. Unchanged documents are not rewritten.
    pub async fn apply(&self, items: Vec<Hardware>) -> Result<Vec<(Key, Outcome)>, StoreError> {
        let _w = self.write.lock().await;
        let outcomes = match self.store.apply(&items).await {
            Ok(o) => o,
            Err(e) => {
                if matches!(e, StoreError::Conflict { .. }) {
                    self.metrics.applied("conflict");
                }
                return Err(e);
            }
        };
        let mut patch = Patch::default();
        let mut result = Vec::with_capacity(items.len());
        for (hw, outcome) in items.into_iter().zip(outcomes) {
            let key = hw.machine.key.clone();
            self.metrics.applied(outcome_word(outcome));
            let kind = match outcome {
                Outcome::Created => "hardware.created",
                _ => "hardware.updated",
            };
            if outcome != Outcome::Unchanged {
                self.events.record(
                    Event::new(kind, format!("Hardware {key} {}", outcome_word(outcome)))
                        .machine(key.clone()),
                );
                patch.upsert.push(hw.machine);
            }
            result.push((key, outcome));
        }
        if !patch.upsert.is_empty() {
            self.publish(patch);
        }
        Ok(result)
    }

    /// True when the Hardware existed.
    pub async fn delete(&self, key: &Key) -> Result<bool, StoreError> {
        let _w = self.write.lock().await;
        let existed = self.store.delete(key).await?;
        if existed {
            self.metrics.hardware_deletes.inc();
            self.publish(Patch {
                upsert: vec![],
                delete: vec![key.clone()],
            });
            self.events.record(
                Event::new("hardware.deleted", format!("Hardware {key} deleted"))
                    .machine(key.clone()),
            );
        }
        Ok(existed)
    }

    /// `http://<public_ip>:<port>`, the base of every boot URL.
    pub fn http_base(&self) -> String {
        format!(
            "http://{}:{}",
            self.public_ip,
            self.config.http.listen.port()
        )
    }

    pub fn dhcp_settings(&self) -> crate::dhcp::Settings {
        crate::dhcp::Settings {
            mode: self.config.dhcp.mode,
            server_ip: self.public_ip,
            http_base: self.http_base(),
            efi_binary: self.config.dhcp.efi_binary.clone(),
            arm64_binary: self.files.has("snp-arm64.efi"),
        }
    }

    pub fn script_settings(&self) -> crate::ipxe::ScriptSettings {
        let h = &self.config.http;
        crate::ipxe::ScriptSettings {
            http_base: self.http_base(),
            syslog_host: self.public_ip.to_string(),
            tink_server: h
                .tink_server
                .clone()
                .unwrap_or_else(|| format!("{}:42113", self.public_ip)),
            tink_tls: h.tink_server_tls,
            extra_kernel_args: h.extra_kernel_args.clone(),
        }
    }

    fn publish(&self, patch: Patch) {
        let n = self.inventory.apply(patch);
        self.metrics.inventory_swaps.inc();
        self.metrics.hardware.set(n as i64);
    }
}

pub fn outcome_word(o: Outcome) -> &'static str {
    match o {
        Outcome::Created => "created",
        Outcome::Configured => "configured",
        Outcome::Unchanged => "unchanged",
    }
}
