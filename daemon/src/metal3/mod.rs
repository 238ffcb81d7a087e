//! Metal3's `BareMetalHost` (`metal3.io/v1alpha1`), served by tinkerbox
//! without Ironic: the host's lifecycle (register, inspect, prepare,
//! provision, deprovision, delete) carried out with tinkerbox's own parts,
//! a Hardware for the boot path, a BMC Machine, and Workflows from built-in
//! Templates, all visible and owned by the host.
//!
//! What is pure lives here: the documents (`model.rs`), the BMC address
//! schemes (`bmc_url.rs`), the state machine (`state.rs`), the inspection
//! report and root-device hints (`details.rs`) and the objects a host owns
//! (`owned.rs`). The writer that carries a host out is
//! `services::metal3`.

pub mod bmc_url;
pub mod configdrive;
pub mod controller;
pub mod details;
pub mod model;
pub mod owned;
pub mod state;

pub const API_VERSION: &str = "metal3.io/v1alpha1";
pub const KIND: &str = "BareMetalHost";
pub const HARDWARE_DATA_KIND: &str = "HardwareData";

/// BMO's finalizer on a host.
pub const FINALIZER: &str = "baremetalhost.metal3.io";
/// BMO's annotations, by their exact keys.
pub const PAUSED: &str = "baremetalhost.metal3.io/paused";
pub const DETACHED: &str = "baremetalhost.metal3.io/detached";
pub const INSPECT: &str = "inspect.metal3.io";
pub const REBOOT: &str = "reboot.metal3.io";
/// A host's hardware given by hand, for a host not inspected.
pub const HARDWARE_DETAILS: &str = "inspect.metal3.io/hardwaredetails";

/// The label every object a host owns carries: the host's name.
pub const OWNER_LABEL: &str = "metal3.io/baremetalhost";

/// BMO's CRDs, embedded unchanged (`daemon/crds/README.md`): installed by
/// `kube install-crds`, and the schema an inspection report is pruned to.
pub const CRD_BAREMETALHOSTS: &str = include_str!("../../crds/metal3.io_baremetalhosts.yaml");
pub const CRD_HARDWAREDATA: &str = include_str!("../../crds/metal3.io_hardwaredata.yaml");
