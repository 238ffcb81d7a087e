//! Typed view of Tinkerbell's `Hardware` (`tinkerbell.org/v1alpha1`), field for
//! field as in the CRD (`shared/compat/crd-tinkerbell.org_hardware.yaml`).
//!
//! It is used to type-check what a user applies (a wrong type is refused with
//! the field's path, as the Kubernetes API server would refuse it) and as the
//! in-memory form the hot paths read. Unknown fields are accepted here and kept
//! in the stored document, which is the source of truth for read-back.

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

#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct HardwareSpec {
    #[serde(default, rename = "agentID", skip_serializing_if = "Option::is_none")]
    pub agent_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auto: Option<AutoCapabilities>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bmc_ref: Option<BmcRef>,
    #[serde(default, deserialize_with = "nullable")]
    pub disks: Vec<Disk>,
    #[serde(default, deserialize_with = "nullable")]
    pub interfaces: Vec<Interface>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<HardwareMetadata>,
    #[serde(default, deserialize_with = "nullable")]
    pub references: BTreeMap<String, Reference>,
    /// Quantities (`cpu: "4"`, `memory: 16Gi`); Kubernetes also allows bare numbers.
    #[serde(default, deserialize_with = "nullable")]
    pub resources: BTreeMap<String, serde_json::Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tink_version: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user_data: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vendor_data: Option<String>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct AutoCapabilities {
    #[serde(default)]
    pub enrollment_enabled: Option<bool>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct BmcRef {
    #[serde(default)]
    pub api_group: Option<String>,
    pub kind: String,
    pub name: String,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq)]
pub struct Disk {
    #[serde(default)]
    pub device: Option<String>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq)]
pub struct Reference {
    #[serde(default)]
    pub group: Option<String>,
    #[serde(default)]
    pub name: Option<String>,
    #[serde(default)]
    pub namespace: Option<String>,
    #[serde(default)]
    pub resource: Option<String>,
    #[serde(default)]
    pub version: Option<String>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Interface {
    #[serde(default)]
    pub dhcp: Option<Dhcp>,
    #[serde(default)]
    pub disable_dhcp: bool,
    #[serde(default)]
    pub isoboot: Option<IsoBoot>,
    #[serde(default)]
    pub netboot: Option<Netboot>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq)]
pub struct Dhcp {
    #[serde(default)]
    pub arch: Option<String>,
    #[serde(default)]
    pub boot_file_name: Option<String>,
    #[serde(default, deserialize_with = "nullable")]
    pub classless_static_routes: Vec<ClasslessStaticRoute>,
    #[serde(default)]
    pub domain_name: Option<String>,
    #[serde(default)]
    pub hostname: Option<String>,
    #[serde(default)]
    pub iface_name: Option<String>,
    #[serde(default)]
    pub ip: Option<Ip>,
    #[serde(default)]
    pub lease_time: Option<i64>,
    #[serde(default)]
    pub mac: Option<String>,
    #[serde(default, deserialize_with = "nullable")]
    pub name_servers: Vec<String>,
    #[serde(default)]
    pub tftp_server_name: Option<String>,
    #[serde(default, deserialize_with = "nullable")]
    pub time_servers: Vec<String>,
    #[serde(default)]
    pub uefi: Option<bool>,
    #[serde(default)]
    pub vlan_id: Option<String>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq)]
pub struct ClasslessStaticRoute {
    pub destination_descriptor: String,
    pub router: String,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq)]
pub struct Ip {
    #[serde(default)]
    pub address: Option<String>,
    #[serde(default)]
    pub family: Option<i64>,
    #[serde(default)]
    pub gateway: Option<String>,
    #[serde(default)]
    pub netmask: Option<String>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct IsoBoot {
    #[serde(default, rename = "sourceISO")]
    pub source_iso: Option<String>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq)]
pub struct Netboot {
    #[serde(default, rename = "allowPXE")]
    pub allow_pxe: Option<bool>,
    #[serde(default, rename = "allowWorkflow")]
    pub allow_workflow: Option<bool>,
    #[serde(default)]
    pub ipxe: Option<Ipxe>,
    #[serde(default)]
    pub osie: Option<Osie>,
    #[serde(default)]
    pub pxelinux: Option<Pxelinux>,
    #[serde(default)]
    pub rpi: Option<Rpi>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq)]
pub struct Ipxe {
    #[serde(default)]
    pub binary: Option<String>,
    #[serde(default)]
    pub contents: Option<String>,
    #[serde(default)]
    pub url: Option<String>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Osie {
    #[serde(default, rename = "baseURL")]
    pub base_url: Option<String>,
    #[serde(default)]
    pub initrd: Option<String>,
    #[serde(default)]
    pub kernel: Option<String>,
    #[serde(default, deserialize_with = "nullable")]
    pub kernel_params: Vec<String>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq)]
pub struct Pxelinux {
    #[serde(default)]
    pub config: Option<String>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Rpi {
    #[serde(default)]
    pub config_txt: Option<String>,
    #[serde(default)]
    pub firmware_path: Option<String>,
    pub serial_num: String,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq)]
pub struct HardwareMetadata {
    #[serde(default)]
    pub bonding_mode: Option<i64>,
    #[serde(default)]
    pub custom: Option<MetadataCustom>,
    #[serde(default)]
    pub facility: Option<Facility>,
    #[serde(default)]
    pub instance: Option<Instance>,
    #[serde(default)]
    pub manufacturer: Option<Manufacturer>,
    #[serde(default)]
    pub state: Option<String>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq)]
pub struct MetadataCustom {
    #[serde(default)]
    pub preinstalled_operating_system_version: Option<OperatingSystem>,
    #[serde(default, deserialize_with = "nullable")]
    pub private_subnets: Vec<String>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq)]
pub struct Facility {
    #[serde(default)]
    pub facility_code: Option<String>,
    #[serde(default)]
    pub plan_slug: Option<String>,
    #[serde(default)]
    pub plan_version_slug: Option<String>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq)]
pub struct Manufacturer {
    #[serde(default)]
    pub id: Option<String>,
    #[serde(default)]
    pub slug: Option<String>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq)]
pub struct OperatingSystem {
    #[serde(default)]
    pub distro: Option<String>,
    #[serde(default)]
    pub image_tag: Option<String>,
    #[serde(default)]
    pub os_slug: Option<String>,
    #[serde(default)]
    pub slug: Option<String>,
    #[serde(default)]
    pub version: Option<String>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq)]
pub struct Instance {
    #[serde(default)]
    pub allow_pxe: Option<bool>,
    #[serde(default)]
    pub always_pxe: Option<bool>,
    #[serde(default)]
    pub crypted_root_password: Option<String>,
    #[serde(default)]
    pub hostname: Option<String>,
    #[serde(default)]
    pub id: Option<String>,
    #[serde(default, deserialize_with = "nullable")]
    pub ips: Vec<InstanceIp>,
    #[serde(default)]
    pub ipxe_script_url: Option<String>,
    #[serde(default)]
    pub network_ready: Option<bool>,
    #[serde(default)]
    pub operating_system: Option<OperatingSystem>,
    #[serde(default)]
    pub rescue: Option<bool>,
    #[serde(default, deserialize_with = "nullable")]
    pub ssh_keys: Vec<String>,
    #[serde(default)]
    pub state: Option<String>,
    #[serde(default)]
    pub storage: Option<serde_json::Value>,
    #[serde(default, deserialize_with = "nullable")]
    pub tags: Vec<String>,
    #[serde(default)]
    pub userdata: Option<String>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq)]
pub struct InstanceIp {
    #[serde(default)]
    pub address: Option<String>,
    #[serde(default)]
    pub family: Option<i64>,
    #[serde(default)]
    pub gateway: Option<String>,
    #[serde(default)]
    pub management: Option<bool>,
    #[serde(default)]
    pub netmask: Option<String>,
    #[serde(default)]
    pub public: Option<bool>,
}
