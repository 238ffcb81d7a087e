//! Typed view of Tinkerbell's `Hardware` (`tinkerbell.org/v1alpha1`), field for
//! field as in the CRD (`shared/compat/crd-tinkerbell.org_hardware.yaml`).
//!
//! It is used to type-check what a user applies (a wrong type is refused with
//! the field's path, as the Kubernetes API server would refuse it) and as the
//! in-memory form the hot paths read. Unknown fields are accepted here and kept
//! in the stored document, which is the source of truth for read-back.
//!
//! Serialising leaves out every unset field (`None`, empty lists and maps,
//! `disableDhcp: false`): the inventory keeps each spec as compact JSON
//! (see [`super::record`]), and a parse of that JSON gives back the same
//! spec, since an absent field deserialises to its default.

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

fn is_false(b: &bool) -> bool {
    !*b
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct HardwareSpec {
    #[serde(default, rename = "agentID", skip_serializing_if = "Option::is_none")]
    pub agent_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auto: Option<AutoCapabilities>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bmc_ref: Option<BmcRef>,
    #[serde(
        default,
        deserialize_with = "nullable",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub disks: Vec<Disk>,
    #[serde(
        default,
        deserialize_with = "nullable",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub interfaces: Vec<Interface>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<HardwareMetadata>,
    #[serde(
        default,
        deserialize_with = "nullable",
        skip_serializing_if = "BTreeMap::is_empty"
    )]
    pub references: BTreeMap<String, Reference>,
    /// Quantities (`cpu: "4"`, `memory: 16Gi`); Kubernetes also allows bare numbers.
    #[serde(
        default,
        deserialize_with = "nullable",
        skip_serializing_if = "BTreeMap::is_empty"
    )]
    pub resources: BTreeMap<String, serde_json::Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tink_version: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user_data: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vendor_data: Option<String>,
}

/// Only `spec.interfaces`: what DHCP reads, parsed without building the
/// rest of the spec (metadata, user data), which serde skips over.
#[derive(Default, Deserialize)]
pub struct InterfacesOnly {
    #[serde(default, deserialize_with = "nullable")]
    pub interfaces: Vec<Interface>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct AutoCapabilities {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enrollment_enabled: Option<bool>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct BmcRef {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_group: Option<String>,
    pub kind: String,
    pub name: String,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq)]
pub struct Disk {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device: Option<String>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq)]
pub struct Reference {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resource: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Interface {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dhcp: Option<Dhcp>,
    #[serde(default, skip_serializing_if = "is_false")]
    pub disable_dhcp: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub isoboot: Option<IsoBoot>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub netboot: Option<Netboot>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq)]
pub struct Dhcp {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub arch: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub boot_file_name: Option<String>,
    #[serde(
        default,
        deserialize_with = "nullable",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub classless_static_routes: Vec<ClasslessStaticRoute>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub domain_name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hostname: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub iface_name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ip: Option<Ip>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease_time: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mac: Option<String>,
    #[serde(
        default,
        deserialize_with = "nullable",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub name_servers: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tftp_server_name: Option<String>,
    #[serde(
        default,
        deserialize_with = "nullable",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub time_servers: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uefi: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vlan_id: Option<String>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq)]
pub struct ClasslessStaticRoute {
    pub destination_descriptor: String,
    pub router: String,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq)]
pub struct Ip {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub address: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub family: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gateway: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub netmask: Option<String>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct IsoBoot {
    #[serde(default, rename = "sourceISO", skip_serializing_if = "Option::is_none")]
    pub source_iso: Option<String>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq)]
pub struct Netboot {
    #[serde(default, rename = "allowPXE", skip_serializing_if = "Option::is_none")]
    pub allow_pxe: Option<bool>,
    #[serde(
        default,
        rename = "allowWorkflow",
        skip_serializing_if = "Option::is_none"
    )]
    pub allow_workflow: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ipxe: Option<Ipxe>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub osie: Option<Osie>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pxelinux: Option<Pxelinux>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rpi: Option<Rpi>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq)]
pub struct Ipxe {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub binary: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub contents: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Osie {
    #[serde(default, rename = "baseURL", skip_serializing_if = "Option::is_none")]
    pub base_url: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub initrd: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kernel: Option<String>,
    #[serde(
        default,
        deserialize_with = "nullable",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub kernel_params: Vec<String>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq)]
pub struct Pxelinux {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config: Option<String>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Rpi {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config_txt: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub firmware_path: Option<String>,
    pub serial_num: String,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq)]
pub struct HardwareMetadata {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bonding_mode: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub custom: Option<MetadataCustom>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub facility: Option<Facility>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instance: Option<Instance>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub manufacturer: Option<Manufacturer>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<String>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq)]
pub struct MetadataCustom {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preinstalled_operating_system_version: Option<OperatingSystem>,
    #[serde(
        default,
        deserialize_with = "nullable",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub private_subnets: Vec<String>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq)]
pub struct Facility {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub facility_code: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plan_slug: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plan_version_slug: Option<String>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq)]
pub struct Manufacturer {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slug: Option<String>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq)]
pub struct OperatingSystem {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub distro: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_tag: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub os_slug: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slug: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq)]
pub struct Instance {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allow_pxe: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub always_pxe: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub crypted_root_password: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hostname: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    #[serde(
        default,
        deserialize_with = "nullable",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub ips: Vec<InstanceIp>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ipxe_script_url: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network_ready: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub operating_system: Option<OperatingSystem>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rescue: Option<bool>,
    #[serde(
        default,
        deserialize_with = "nullable",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub ssh_keys: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub storage: Option<serde_json::Value>,
    #[serde(
        default,
        deserialize_with = "nullable",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub tags: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub userdata: Option<String>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq)]
pub struct InstanceIp {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub address: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub family: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gateway: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub management: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub netmask: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub public: Option<bool>,
}
