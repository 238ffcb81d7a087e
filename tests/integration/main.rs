//! Integration tests: the real `tinkerbox` binary, driven by its own CLI and
//! by curl/openssl, on loopback ports. One test binary (one link) for all.

mod agent;
mod bmc_ipmi;
mod bmc_jobs;
mod bmc_redfish;
mod boot;
mod cleaning;
mod common;
mod daemon;
mod dhcp;
mod discovery;
mod discovery_dhcp;
mod hardware;
mod kube;
mod kube_cli;
mod kube_ha;
mod kube_supervisor;
mod metadata;
mod metal3;
mod netns;
mod tink;
mod ui;
mod ui_browser;
mod workflow;
