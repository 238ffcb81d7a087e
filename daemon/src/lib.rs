//! tinkerbox: a bare-metal provisioning appliance compatible with the
//! Tinkerbell stack, as one daemon. See DESIGN.md in the shared docs and the
//! README for the user-facing contract.
#![deny(unsafe_code)]

pub mod api;
pub mod app;
pub mod bmc;
pub mod cli;
pub mod config;
pub mod dhcp;
pub mod events;
pub mod hardware;
pub mod http;
pub mod inventory;
pub mod ipxe;
pub mod metadata;
pub mod metrics;
pub mod serve;
pub mod store;
pub mod syslog;
pub mod tftp;
pub mod token;
pub mod udp;
