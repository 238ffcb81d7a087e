//! tinkerbox: a bare-metal provisioning appliance compatible with the
//! Tinkerbell stack, as one daemon. The README has the user-facing
//! contract; docs/ARCHITECTURE.md the modules and how a request flows.
#![deny(unsafe_code)]

pub mod api;
pub mod app;
pub mod bmc;
pub mod cleaning;
pub mod cli;
pub mod clock;
pub mod config;
pub mod dhcp;
pub mod discovery;
pub mod events;
pub mod grpc;
pub mod hardware;
pub mod http;
pub mod inventory;
pub mod ipxe;
pub mod kinds;
pub mod kube;
pub mod labels;
pub mod metadata;
pub mod metal3;
pub mod metrics;
pub mod priority;
pub mod serve;
pub mod services;
pub mod store;
pub mod syslog;
pub mod text;
pub mod tftp;
pub mod token;
pub mod udp;
pub mod ui;
pub mod workflow;

/// The upstream fixtures (CRDs, Templates, examples) the unit tests read:
/// `tests/compat/` of this repository.
#[cfg(test)]
pub(crate) fn compat_dir() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/compat")
}
