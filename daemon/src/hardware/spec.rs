//! Typed view of Tinkerbell's `Hardware` (`tinkerbell.org/v1alpha1`), field for
//! field as in Tinkerbell's Hardware CRD (`tinkerbell.org_hardwares.yaml` of
//! tinkerbell/tinkerbell; a copy is in the team's shared compat files).
//!
//! It is used to type-check what a user applies (a wrong type is refused with
//! the field's path, as the Kubernetes API server would refuse it) and as the
//! in-memory form the hot paths read. Unknown fields are accepted here and kept
//! in the stored document, which is the source of truth for read-back.
//!
//! The typed read view ([`super::view`]) is built from it; only the
//! instance metadata is serialised again (for `/metadata`), leaving out
//! unset fields.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// `field: null` (or `field:` with nothing after it in YAML) means "unset" for
/// lists and maps, as the Kubernetes API server treats it.
fn nullable<'de, D, T>(d: D) -> Result<T, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Default + Deserialize<'de>,
{
    Ok(Option::<T>::deserialize(d)?.unwrap_or_default())
}

#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(default, rename_all = "camelCase")]
pub struct HardwareSpec {
    #[serde(rename = "agentID")]
    pub agent_id: Option<String>,
    pub auto: Option<AutoCapabilities>,
    pub bmc_ref: Option<BmcRef>,
    #[serde(deserialize_with = "nullable")]
    pub disks: Vec<Disk>,
    #[serde(deserialize_with = "nullable")]
    pub interfaces: Vec<Interface>,
    pub metadata: Option<HardwareMetadata>,
    #[serde(deserialize_with = "nullable")]
    pub references: BTreeMap<String, Reference>,
    /// Quantities (`cpu: "4"`, `memory: 16Gi`); Kubernetes also allows bare numbers.
    #[serde(deserialize_with = "nullable")]
    pub resources: BTreeMap<String, serde_json::Value>,
    pub tink_version: Option<i64>,
    pub user_data: Option<String>,
    pub vendor_data: Option<String>,
}

#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(default, rename_all = "camelCase")]
pub struct AutoCapabilities {
    pub enrollment_enabled: Option<bool>,
}

#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct BmcRef {
    pub api_group: Option<String>,
    pub kind: String,
    pub name: String,
}

#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(default)]
pub struct Disk {
    pub device: Option<String>,
}

#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(default)]
pub struct Reference {
    pub group: Option<String>,
    pub name: Option<String>,
    pub namespace: Option<String>,
    pub resource: Option<String>,
    pub version: Option<String>,
}

#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(default, rename_all = "camelCase")]
pub struct Interface {
    pub dhcp: Option<Dhcp>,
    pub disable_dhcp: bool,
    pub isoboot: Option<IsoBoot>,
    pub netboot: Option<Netboot>,
}

#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(default)]
pub struct Dhcp {
    pub arch: Option<String>,
    pub boot_file_name: Option<String>,
    #[serde(deserialize_with = "nullable")]
    pub classless_static_routes: Vec<ClasslessStaticRoute>,
    pub domain_name: Option<String>,
    pub hostname: Option<String>,
    pub iface_name: Option<String>,
    pub ip: Option<Ip>,
    pub lease_time: Option<i64>,
    pub mac: Option<String>,
    #[serde(deserialize_with = "nullable")]
    pub name_servers: Vec<String>,
    pub tftp_server_name: Option<String>,
    #[serde(deserialize_with = "nullable")]
    pub time_servers: Vec<String>,
    pub uefi: Option<bool>,
    pub vlan_id: Option<String>,
}

#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
pub struct ClasslessStaticRoute {
    pub destination_descriptor: String,
    pub router: String,
}

#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(default)]
pub struct Ip {
    pub address: Option<String>,
    pub family: Option<i64>,
    pub gateway: Option<String>,
    pub netmask: Option<String>,
}

#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(default, rename_all = "camelCase")]
pub struct IsoBoot {
    #[serde(rename = "sourceISO")]
    pub source_iso: Option<String>,
}

#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(default)]
pub struct Netboot {
    #[serde(rename = "allowPXE")]
    pub allow_pxe: Option<bool>,
    #[serde(rename = "allowWorkflow")]
    pub allow_workflow: Option<bool>,
    pub ipxe: Option<Ipxe>,
    pub osie: Option<Osie>,
    pub pxelinux: Option<Pxelinux>,
    pub rpi: Option<Rpi>,
}

#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(default)]
pub struct Ipxe {
    pub binary: Option<String>,
    pub contents: Option<String>,
    pub url: Option<String>,
}

#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(default, rename_all = "camelCase")]
pub struct Osie {
    #[serde(rename = "baseURL")]
    pub base_url: Option<String>,
    pub initrd: Option<String>,
    pub kernel: Option<String>,
    #[serde(deserialize_with = "nullable")]
    pub kernel_params: Vec<String>,
}

#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(default)]
pub struct Pxelinux {
    pub config: Option<String>,
}

#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Rpi {
    pub config_txt: Option<String>,
    pub firmware_path: Option<String>,
    pub serial_num: String,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq)]
#[serde(default)]
pub struct HardwareMetadata {
    pub bonding_mode: Option<i64>,
    pub custom: Option<MetadataCustom>,
    pub facility: Option<Facility>,
    pub instance: Option<Instance>,
    pub manufacturer: Option<Manufacturer>,
    pub state: Option<String>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq)]
#[serde(default)]
pub struct MetadataCustom {
    pub preinstalled_operating_system_version: Option<OperatingSystem>,
    #[serde(deserialize_with = "nullable", skip_serializing_if = "Vec::is_empty")]
    pub private_subnets: Vec<String>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq)]
#[serde(default)]
pub struct Facility {
    pub facility_code: Option<String>,
    pub plan_slug: Option<String>,
    pub plan_version_slug: Option<String>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq)]
#[serde(default)]
pub struct Manufacturer {
    pub id: Option<String>,
    pub slug: Option<String>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq)]
#[serde(default)]
pub struct OperatingSystem {
    pub distro: Option<String>,
    pub image_tag: Option<String>,
    pub os_slug: Option<String>,
    pub slug: Option<String>,
    pub version: Option<String>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq)]
#[serde(default)]
pub struct Instance {
    pub allow_pxe: Option<bool>,
    pub always_pxe: Option<bool>,
    pub crypted_root_password: Option<String>,
    pub hostname: Option<String>,
    pub id: Option<String>,
    #[serde(deserialize_with = "nullable", skip_serializing_if = "Vec::is_empty")]
    pub ips: Vec<InstanceIp>,
    pub ipxe_script_url: Option<String>,
    pub network_ready: Option<bool>,
    pub operating_system: Option<OperatingSystem>,
    pub rescue: Option<bool>,
    #[serde(deserialize_with = "nullable", skip_serializing_if = "Vec::is_empty")]
    pub ssh_keys: Vec<String>,
    pub state: Option<String>,
    pub storage: Option<serde_json::Value>,
    #[serde(deserialize_with = "nullable", skip_serializing_if = "Vec::is_empty")]
    pub tags: Vec<String>,
    pub userdata: Option<String>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq)]
#[serde(default)]
pub struct InstanceIp {
    pub address: Option<String>,
    pub family: Option<i64>,
    pub gateway: Option<String>,
    pub management: Option<bool>,
    pub netmask: Option<String>,
    pub public: Option<bool>,
}
