//! tinkerbox-agent: the worker in the OSIE. It asks tinkerbox (or any Tink
//! server) for its Workflow's actions over the tink-agent gRPC API and runs
//! the well-known Tinkerbell action images natively, with no container
//! runtime: image2disk, oci2disk, writefile, cexec, kexec, archive2disk,
//! waitdaemon, reboot and poweroff; and tinkerbox's own inspect (the hardware,
//! in Metal3's shape), wipe-disks (metadata cleaning) and configdrive (a
//! config drive partition for cloud-init) for BareMetalHosts.
#![deny(unsafe_code)]

pub mod action;
pub mod actions;
pub mod attributes;
pub mod backoff;
pub mod config;
pub mod hardware;
pub mod run;
pub mod sys;
pub mod syslog;
#[cfg(test)]
pub(crate) mod testing;
pub mod transport;

/// Generated from the daemon's `proto/workflow.proto` (build.rs).
#[allow(clippy::all, clippy::pedantic)]
pub mod pb {
    tonic::include_proto!("proto");
}
