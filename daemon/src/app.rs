//! What the listeners share: the settings they answer with, the read side
//! (the inventory snapshot, stored documents, the event log) and the
//! services that every change goes through ([`crate::services`]).

use crate::config::Config;
use crate::events::{EventLog, EventSink};
use crate::inventory::Inventory;
use crate::metrics::Metrics;
use crate::services::Services;
use crate::store::Store;
use std::sync::Arc;

pub struct App {
    pub config: Config,
    /// Resolved `public_ip`: in DHCP replies, boot URLs, syslog_host=.
    pub public_ip: std::net::Ipv4Addr,
    /// The iPXE binaries, for TFTP and `/ipxe/binary/`.
    pub files: crate::tftp::Files,
    /// IMDSv2 token signer.
    pub tokens: crate::metadata::token::Tokens,
    /// Stored documents, for reading; writes go through `services`.
    pub store: Store,
    pub inventory: Arc<Inventory>,
    pub events: EventSink,
    pub event_log: EventLog,
    /// Events as they are stored, for the web UI's live pages.
    pub feed: crate::events::Feed,
    pub metrics: Arc<Metrics>,
    pub services: Arc<Services>,
    /// Kubernetes mode: whether the mirror is current. `None` in host mode.
    pub kube: Option<Arc<crate::kube::Sync>>,
}

impl App {
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
        let supervised = self.kube.as_ref().and_then(|k| k.tink_address.get());
        crate::ipxe::ScriptSettings {
            http_base: self.http_base(),
            syslog_host: self.public_ip.to_string(),
            // An external Tink server when one is configured, else the one
            // the supervisor runs (kube mode), else ours.
            tink_server: h
                .tink_server
                .clone()
                .or_else(|| supervised.as_ref().map(|(a, _)| a.clone()))
                .unwrap_or_else(|| {
                    format!("{}:{}", self.public_ip, self.config.tink.listen.port())
                }),
            tink_tls: match (&h.tink_server, &supervised) {
                (Some(_), _) => h.tink_server_tls,
                (None, Some((_, tls))) => *tls,
                (None, None) => self.config.tink.tls(),
            },
            extra_kernel_args: h.extra_kernel_args.clone(),
        }
    }
}
