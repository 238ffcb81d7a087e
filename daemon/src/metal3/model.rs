//! The `BareMetalHost` document: its spec checked as BMO's validating
//! webhook checks it, and its status with BMO's exact strings. The
//! document is kept whole as applied (fields tinkerbox does not act on
//! read back unchanged); [`Spec`] is the checked view.

use super::bmc_url::{self, BmcTarget};
use crate::hardware::{self, FieldError, Key, Mac};
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// `status.provisioning.state`, BMO's strings.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
pub enum ProvisioningState {
    #[default]
    #[serde(rename = "")]
    None,
    #[serde(rename = "unmanaged")]
    Unmanaged,
    #[serde(rename = "registering")]
    Registering,
    /// Legacy: goes on to preparing.
    #[serde(rename = "match profile")]
    MatchProfile,
    #[serde(rename = "inspecting")]
    Inspecting,
    #[serde(rename = "preparing")]
    Preparing,
    /// Deprecated alias of available.
    #[serde(rename = "ready")]
    Ready,
    #[serde(rename = "available")]
    Available,
    #[serde(rename = "provisioning")]
    Provisioning,
    #[serde(rename = "provisioned")]
    Provisioned,
    #[serde(rename = "externally provisioned")]
    ExternallyProvisioned,
    #[serde(rename = "deprovisioning")]
    Deprovisioning,
    #[serde(rename = "powering off before delete")]
    PoweringOffBeforeDelete,
    #[serde(rename = "deleting")]
    Deleting,
}

impl ProvisioningState {
    pub fn as_str(self) -> &'static str {
        match self {
            ProvisioningState::None => "",
            ProvisioningState::Unmanaged => "unmanaged",
            ProvisioningState::Registering => "registering",
            ProvisioningState::MatchProfile => "match profile",
            ProvisioningState::Inspecting => "inspecting",
            ProvisioningState::Preparing => "preparing",
            ProvisioningState::Ready => "ready",
            ProvisioningState::Available => "available",
            ProvisioningState::Provisioning => "provisioning",
            ProvisioningState::Provisioned => "provisioned",
            ProvisioningState::ExternallyProvisioned => "externally provisioned",
            ProvisioningState::Deprovisioning => "deprovisioning",
            ProvisioningState::PoweringOffBeforeDelete => "powering off before delete",
            ProvisioningState::Deleting => "deleting",
        }
    }
}

/// `status.operationalStatus`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub enum OperationalStatus {
    #[default]
    #[serde(rename = "")]
    None,
    #[serde(rename = "OK")]
    Ok,
    #[serde(rename = "discovered")]
    Discovered,
    #[serde(rename = "error")]
    Error,
    #[serde(rename = "delayed")]
    Delayed,
    #[serde(rename = "detached")]
    Detached,
    #[serde(rename = "servicing")]
    Servicing,
}

/// `status.errorType`: the CRD's enum.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum ErrorType {
    #[serde(rename = "provisioned registration error")]
    ProvisionedRegistration,
    #[serde(rename = "registration error")]
    Registration,
    #[serde(rename = "inspection error")]
    Inspection,
    #[serde(rename = "preparation error")]
    Preparation,
    #[serde(rename = "provisioning error")]
    Provisioning,
    #[serde(rename = "power management error")]
    PowerManagement,
    #[serde(rename = "servicing error")]
    Servicing,
}

impl ErrorType {
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorType::ProvisionedRegistration => "provisioned registration error",
            ErrorType::Registration => "registration error",
            ErrorType::Inspection => "inspection error",
            ErrorType::Preparation => "preparation error",
            ErrorType::Provisioning => "provisioning error",
            ErrorType::PowerManagement => "power management error",
            ErrorType::Servicing => "servicing error",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub enum BootMode {
    #[default]
    #[serde(rename = "UEFI")]
    Uefi,
    #[serde(rename = "UEFISecureBoot")]
    UefiSecureBoot,
    #[serde(rename = "legacy")]
    Legacy,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CleaningMode {
    #[default]
    Metadata,
    Disabled,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum InspectionMode {
    #[default]
    Agent,
    Disabled,
    Fast,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ChecksumType {
    Md5,
    Sha256,
    Sha512,
    Auto,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum ImageFormat {
    #[serde(rename = "raw")]
    Raw,
    #[serde(rename = "qcow2")]
    Qcow2,
    #[serde(rename = "vdi")]
    Vdi,
    #[serde(rename = "vmdk")]
    Vmdk,
    #[serde(rename = "live-iso")]
    LiveIso,
}

/// `spec.image` (and `status.provisioning.image`, `lastAttemptedImage`).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Image {
    pub url: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checksum: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checksum_type: Option<ChecksumType>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub format: Option<ImageFormat>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub oci_auth_secret_name: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Bmc {
    #[serde(default)]
    pub address: String,
    #[serde(default)]
    pub credentials_name: String,
    #[serde(default)]
    pub disable_certificate_verification: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct SecretRef {
    #[serde(default)]
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
}

/// `spec.rootDeviceHints`: every field given must match.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RootDeviceHints {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device_name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hctl: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vendor: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub serial_number: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_size_gigabytes: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wwn: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wwn_with_extension: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wwn_vendor_extension: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rotational: Option<bool>,
}

/// The checked view of `spec`.
#[derive(Debug, Clone, PartialEq, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Spec {
    #[serde(default)]
    pub bmc: Option<Bmc>,
    #[serde(rename = "bootMACAddress", default)]
    pub boot_mac_address: Option<String>,
    #[serde(default)]
    pub boot_mode: Option<BootMode>,
    pub online: bool,
    #[serde(default)]
    pub consumer_ref: Option<Value>,
    #[serde(default)]
    pub image: Option<Image>,
    #[serde(default)]
    pub user_data: Option<SecretRef>,
    #[serde(default)]
    pub network_data: Option<SecretRef>,
    #[serde(default)]
    pub meta_data: Option<SecretRef>,
    #[serde(default)]
    pub externally_provisioned: bool,
    #[serde(default)]
    pub automated_cleaning_mode: Option<CleaningMode>,
    #[serde(default)]
    pub custom_deploy: Option<Value>,
    #[serde(default)]
    pub root_device_hints: Option<RootDeviceHints>,
    #[serde(default)]
    pub raid: Option<Value>,
    #[serde(default)]
    pub firmware: Option<Value>,
    #[serde(default)]
    pub inspection_mode: Option<InspectionMode>,
    #[serde(default)]
    pub disable_power_off: bool,
}

impl Spec {
    pub fn has_bmc_details(&self) -> bool {
        self.bmc
            .as_ref()
            .is_some_and(|b| !b.address.is_empty() || !b.credentials_name.is_empty())
    }

    /// An image to provision: one with a URL.
    pub fn image(&self) -> Option<&Image> {
        self.image.as_ref().filter(|i| !i.url.is_empty())
    }

    pub fn cleaning(&self) -> CleaningMode {
        self.automated_cleaning_mode.unwrap_or_default()
    }

    /// RAID asked for: a non-empty volume list of either kind.
    pub fn wants_raid(&self) -> bool {
        let non_empty = |k: &str| {
            self.raid
                .as_ref()
                .and_then(|r| r.get(k))
                .and_then(Value::as_array)
                .is_some_and(|a| !a.is_empty())
        };
        non_empty("hardwareRAIDVolumes") || non_empty("softwareRAIDVolumes")
    }
}

/// `status.operationHistory.<op>`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct OperationMetric {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub end: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct OperationHistory {
    #[serde(default)]
    pub register: OperationMetric,
    #[serde(default)]
    pub inspect: OperationMetric,
    #[serde(default)]
    pub provision: OperationMetric,
    #[serde(default)]
    pub deprovision: OperationMetric,
}

/// `status.provisioning`.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Provisioning {
    #[serde(default)]
    pub state: ProvisioningState,
    /// Ironic's node UUID in BMO; here the id tinkerbox gave the host.
    #[serde(rename = "ID", default)]
    pub id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<Image>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub root_device_hints: Option<RootDeviceHints>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub boot_mode: Option<BootMode>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub raid: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub custom_deploy: Option<Value>,
}

/// `status.goodCredentials` / `triedCredentials`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CredentialsStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub credentials: Option<SecretRef>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub credentials_version: String,
}

/// `status`, as BMO writes it: the required fields always present.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Status {
    #[serde(default)]
    pub operational_status: OperationalStatus,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error_type: Option<ErrorType>,
    #[serde(default)]
    pub error_message: String,
    #[serde(default)]
    pub error_count: u32,
    #[serde(default)]
    pub provisioning_fail_count: u32,
    #[serde(default)]
    pub powered_on: bool,
    #[serde(default)]
    pub provisioning: Provisioning,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_updated: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_attempted_image: Option<Image>,
    /// BMO's `HardwareDetails`, as the inspection reported it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hardware: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub good_credentials: Option<CredentialsStatus>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tried_credentials: Option<CredentialsStatus>,
    #[serde(default)]
    pub operation_history: OperationHistory,
    /// BMO's profile: `unknown`, or `libvirt` for a libvirt:// BMC.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hardware_profile: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
}

/// A `metav1.Condition`, as BMO sets them (`computeConditions`).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Condition {
    #[serde(rename = "type")]
    pub kind: ConditionType,
    pub status: ConditionStatus,
    pub reason: String,
    #[serde(default)]
    pub message: String,
    #[serde(default)]
    pub last_transition_time: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, PartialOrd, Ord)]
pub enum ConditionType {
    #[default]
    Ready,
    AvailableForProvisioning,
    Healthy,
    Manageable,
    Progressing,
    Provisioned,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub enum ConditionStatus {
    True,
    False,
    #[default]
    Unknown,
}

impl Status {
    /// The status of a stored document; an unreadable one is a fresh one
    /// (the host registers again), never a failure to serve it.
    pub fn of(doc: &Value) -> Status {
        doc.get("status")
            .and_then(|s| serde_json::from_value(s.clone()).ok())
            .unwrap_or_default()
    }
}

/// A checked BareMetalHost.
#[derive(Debug, Clone)]
pub struct Host {
    pub key: Key,
    /// The document as applied, without `status`.
    pub doc: Value,
    pub spec: Spec,
    /// The BMC, when the address is set.
    pub bmc: Option<BmcTarget>,
    pub boot_mac: Option<Mac>,
}

impl Host {
    pub fn annotation(&self, name: &str) -> Option<&str> {
        self.doc
            .pointer("/metadata/annotations")
            .and_then(|a| a.get(name))
            .and_then(Value::as_str)
    }
    pub fn deleting(&self) -> bool {
        self.doc.pointer("/metadata/deletionTimestamp").is_some()
    }
    pub fn paused(&self) -> bool {
        self.annotation(super::PAUSED).is_some()
    }
    pub fn detached(&self) -> bool {
        self.annotation(super::DETACHED).is_some()
    }
    /// Inspection is off: by spec, or by the `inspect.metal3.io: disabled`
    /// annotation.
    pub fn inspection_disabled(&self) -> bool {
        self.spec.inspection_mode == Some(InspectionMode::Disabled)
            || self.annotation(super::INSPECT) == Some("disabled")
    }
    /// A re-inspection asked for (the annotation, with a value other than
    /// `disabled`).
    pub fn inspection_requested(&self) -> bool {
        self.annotation(super::INSPECT)
            .is_some_and(|v| v != "disabled")
    }
    pub fn uid(&self) -> Option<&str> {
        self.doc.pointer("/metadata/uid").and_then(Value::as_str)
    }
}

fn typed<T: serde::de::DeserializeOwned>(v: &Value, field: &str) -> Result<T, FieldError> {
    hardware::typed(v, field)
}

/// A UUID's text form: BMO refuses a host named like one.
fn looks_like_uuid(s: &str) -> bool {
    let parts: Vec<&str> = s.split('-').collect();
    parts.len() == 5
        && parts
            .iter()
            .zip([8, 4, 4, 4, 12])
            .all(|(p, n)| p.len() == n && p.chars().all(|c| c.is_ascii_hexdigit()))
}

/// Check a document as BMO's webhook does and bring it to its stored form
/// (namespace filled in, `status` dropped: the status is tinkerbox's).
pub fn host(mut doc: Value) -> Result<Host, FieldError> {
    match doc.get("kind").and_then(Value::as_str) {
        Some(super::KIND) => {}
        other => {
            return Err(FieldError::new(
                "kind",
                format!("must be {:?}, got {other:?}", super::KIND),
            ));
        }
    }
    let key = hardware::object_key(&mut doc)?;
    if !key
        .name
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
    {
        return Err(FieldError::new(
            "metadata.name",
            "a BareMetalHost name may only hold letters, digits, '.', '_' and '-'",
        ));
    }
    if looks_like_uuid(&key.name) {
        return Err(FieldError::new(
            "metadata.name",
            "a BareMetalHost name must not be a UUID",
        ));
    }
    if let Some(o) = doc.as_object_mut() {
        o.remove("status");
    }
    let spec_v = doc.get("spec").cloned().unwrap_or(Value::Null);
    if spec_v.get("online").is_none() {
        return Err(FieldError::new("spec.online", "required"));
    }
    let spec: Spec = typed(&spec_v, "spec")?;
    let bmc = match spec.bmc.as_ref().filter(|b| !b.address.is_empty()) {
        Some(b) => {
            Some(bmc_url::parse(&b.address).map_err(|m| FieldError::new("spec.bmc.address", m))?)
        }
        None => None,
    };
    if let Some(b) = &spec.bmc
        && !b.address.is_empty()
        && b.credentials_name.is_empty()
    {
        return Err(FieldError::new(
            "spec.bmc.credentialsName",
            "required with a BMC address (a Secret in the host's namespace with `username` and `password`)",
        ));
    }
    let boot_mac = match spec.boot_mac_address.as_deref().filter(|m| !m.is_empty()) {
        Some(m) => Some(
            m.parse::<Mac>()
                .map_err(|e| FieldError::new("spec.bootMACAddress", e.to_string()))?,
        ),
        None => None,
    };
    if let Some(t) = &bmc
        && t.needs_boot_mac
        && boot_mac.is_none()
    {
        return Err(FieldError::new(
            "spec.bootMACAddress",
            format!(
                "required with BMC address scheme {}:// (the host boots by it)",
                t.scheme
            ),
        ));
    }
    if let Some(i) = &spec.image {
        if i.url.is_empty() {
            return Err(FieldError::new("spec.image.url", "required"));
        }
        let oci = i.url.starts_with("oci://");
        if i.format != Some(ImageFormat::LiveIso)
            && !oci
            && i.checksum.as_deref().unwrap_or("").is_empty()
        {
            return Err(FieldError::new(
                "spec.image.checksum",
                "required (except for format live-iso and oci:// images)",
            ));
        }
    }
    if spec.firmware.is_some() {
        return Err(FieldError::new(
            "spec.firmware",
            "firmware settings are deprecated, use HostFirmwareSettings",
        ));
    }
    if spec.disable_power_off && !spec.online {
        return Err(FieldError::new(
            "spec.online",
            "a host with disablePowerOff cannot be online: false",
        ));
    }
    if let Some(r) = &spec.raid
        && r.get("hardwareRAIDVolumes").is_some_and(|v| !v.is_null())
        && r.get("softwareRAIDVolumes")
            .and_then(Value::as_array)
            .is_some_and(|a| !a.is_empty())
    {
        return Err(FieldError::new(
            "spec.raid",
            "hardwareRAIDVolumes and softwareRAIDVolumes cannot both be set",
        ));
    }
    for (field, r) in [
        ("spec.userData", &spec.user_data),
        ("spec.networkData", &spec.network_data),
        ("spec.metaData", &spec.meta_data),
    ] {
        if let Some(r) = r
            && let Some(ns) = r.namespace.as_deref()
            && !ns.is_empty()
            && ns != key.namespace
        {
            return Err(FieldError::new(
                field,
                format!(
                    "the Secret must be in the host's namespace {:?}, not {ns:?}",
                    key.namespace
                ),
            ));
        }
    }
    let ann = |k: &str| {
        doc.pointer("/metadata/annotations")
            .and_then(|a| a.get(k))
            .and_then(Value::as_str)
    };
    if let Some(v) = ann(super::INSPECT)
        && !matches!(v, "" | "disabled")
    {
        return Err(FieldError::new(
            format!("metadata.annotations.{}", super::INSPECT),
            format!("{v:?}: only \"disabled\" or \"\""),
        ));
    }
    if let Some(v) = ann(super::HARDWARE_DETAILS) {
        if !(spec.inspection_mode == Some(InspectionMode::Disabled)
            || ann(super::INSPECT) == Some("disabled"))
        {
            return Err(FieldError::new(
                format!("metadata.annotations.{}", super::HARDWARE_DETAILS),
                "only for a host whose inspection is disabled",
            ));
        }
        super::details::check_report(v.as_bytes()).map_err(|m| {
            FieldError::new(
                format!("metadata.annotations.{}", super::HARDWARE_DETAILS),
                m,
            )
        })?;
    }
    if let Some(v) = ann(super::REBOOT)
        && !v.is_empty()
    {
        reboot_mode(v)
            .map_err(|m| FieldError::new(format!("metadata.annotations.{}", super::REBOOT), m))?;
    }
    Ok(Host {
        key,
        doc,
        spec,
        bmc,
        boot_mac,
    })
}

/// The keys BMO reads a host's data Secrets by (`userData`,
/// `networkData`, `metaData`, each falling back to `value`).
pub const DATA_KEYS: [&str; 4] = ["userData", "networkData", "metaData", "value"];

/// A Secret's values are at most this big (cloud-init's user data is
/// rarely more than a few KiB).
pub const DATA_MAX_BYTES: usize = 512 << 10;

/// A `v1` Secret holding a host's user data, network data or meta data.
#[derive(Debug, Clone, PartialEq)]
pub struct DataSecret {
    pub key: Key,
    pub data: std::collections::BTreeMap<String, String>,
}

/// A Secret with one of [`DATA_KEYS`] and no BMC `username`: a host's
/// data. None for any other Secret (the BMC's, checked by `bmc::model`).
pub fn data_secret(doc: &mut Value) -> Result<Option<DataSecret>, FieldError> {
    let has = |k: &str| {
        doc.pointer(&format!("/data/{k}")).is_some()
            || doc.pointer(&format!("/stringData/{k}")).is_some()
    };
    if has("username") || !DATA_KEYS.iter().any(|k| has(k)) {
        return Ok(None);
    }
    let key = hardware::object_key(doc)?;
    let mut data = std::collections::BTreeMap::new();
    for k in DATA_KEYS {
        let v = if let Some(v) = doc.pointer(&format!("/stringData/{k}")) {
            v.as_str()
                .map(String::from)
                .ok_or_else(|| FieldError::new(format!("stringData.{k}"), "must be a string"))?
        } else if let Some(v) = doc.pointer(&format!("/data/{k}")) {
            crate::bmc::model::b64(v, &format!("data.{k}"))?
        } else {
            continue;
        };
        if v.len() > DATA_MAX_BYTES {
            return Err(FieldError::new(
                format!("data.{k}"),
                format!("{} bytes, more than {DATA_MAX_BYTES}", v.len()),
            ));
        }
        data.insert(k.to_string(), v);
    }
    Ok(Some(DataSecret { key, data }))
}

/// `reboot.metal3.io`'s value: `""` (soft, then hard) or
/// `{"mode":"hard"|"soft"}`; true for hard.
pub fn reboot_mode(v: &str) -> Result<bool, String> {
    if v.is_empty() {
        return Ok(false);
    }
    #[derive(Deserialize)]
    struct Mode {
        #[serde(default)]
        mode: String,
    }
    let m: Mode = serde_json::from_str(v)
        .map_err(|e| format!("{v:?} is not {{\"mode\":\"hard\"|\"soft\"}}: {e}"))?;
    match m.mode.as_str() {
        "hard" => Ok(true),
        "soft" | "" => Ok(false),
        other => Err(format!("mode {other:?}: want hard or soft")),
    }
}

/// The printer columns of `kubectl get bmh`, from the CRD: name, then
/// `(column, value)` for State, Consumer, Online, Error, and the wide
/// ones (Status, BMC).
pub struct Row {
    pub status: String,
    pub state: String,
    pub consumer: String,
    pub bmc: String,
    pub online: String,
    pub error: String,
}

pub fn row(doc: &Value) -> Row {
    let s = |p: &str| {
        doc.pointer(p)
            .map(|v| match v {
                Value::String(s) => s.clone(),
                Value::Null => String::new(),
                other => other.to_string(),
            })
            .unwrap_or_default()
    };
    Row {
        status: s("/status/operationalStatus"),
        state: s("/status/provisioning/state"),
        consumer: s("/spec/consumerRef/name"),
        bmc: s("/spec/bmc/address"),
        online: s("/spec/online"),
        error: s("/status/errorType"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn bmh(spec: Value) -> Value {
        json!({"apiVersion": "metal3.io/v1alpha1", "kind": "BareMetalHost",
               "metadata": {"name": "node-0"}, "spec": spec})
    }

    #[test]
    fn the_state_strings_are_bmos() {
        for (s, text) in [
            (ProvisioningState::None, ""),
            (
                ProvisioningState::ExternallyProvisioned,
                "externally provisioned",
            ),
            (
                ProvisioningState::PoweringOffBeforeDelete,
                "powering off before delete",
            ),
            (ProvisioningState::MatchProfile, "match profile"),
        ] {
            assert_eq!(serde_json::to_value(s).unwrap(), json!(text));
            assert_eq!(s.as_str(), text);
            let back: ProvisioningState = serde_json::from_value(json!(text)).unwrap();
            assert_eq!(back, s);
        }
        assert_eq!(
            serde_json::to_value(ErrorType::ProvisionedRegistration).unwrap(),
            json!("provisioned registration error")
        );
    }

    #[test]
    fn a_fresh_status_has_every_required_field() {
        let v = serde_json::to_value(Status::default()).unwrap();
        for k in [
            "errorCount",
            "errorMessage",
            "operationalStatus",
            "poweredOn",
            "provisioningFailCount",
        ] {
            assert!(v.get(k).is_some(), "{k} missing from {v}");
        }
        assert_eq!(v["provisioning"], json!({"state": "", "ID": ""}));
    }

    #[test]
    fn a_good_host_is_taken() {
        let h = host(bmh(json!({
            "online": true,
            "bootMACAddress": "52:54:00:AA:00:01",
            "bmc": {"address": "redfish+http://10.0.0.1:8000/redfish/v1/Systems/vm-1", "credentialsName": "bmc-secret"},
            "image": {"url": "http://x/img.qcow2", "checksum": "abc", "checksumType": "sha256", "format": "qcow2"},
            "rootDeviceHints": {"minSizeGigabytes": 10},
        })))
        .unwrap();
        assert_eq!(h.key, Key::new("default", "node-0"));
        assert_eq!(h.boot_mac.unwrap().to_string(), "52:54:00:aa:00:01");
        assert_eq!(h.spec.image().unwrap().format, Some(ImageFormat::Qcow2));
        assert_eq!(h.spec.cleaning(), CleaningMode::Metadata);
    }

    #[test]
    fn the_webhooks_refusals() {
        let cases = [
            (json!({}), "spec.online"),
            (
                json!({"online": true, "bmc": {"address": "ipmi://1.2.3.4"}}),
                "spec.bmc.credentialsName",
            ),
            (
                json!({"online": true, "bmc": {"address": "libvirt://1.2.3.4", "credentialsName": "s"}}),
                "spec.bootMACAddress",
            ),
            (
                json!({"online": true, "bmc": {"address": "irmc://1.2.3.4", "credentialsName": "s"}}),
                "spec.bmc.address",
            ),
            (
                json!({"online": true, "image": {"url": "http://x/a.img"}}),
                "spec.image.checksum",
            ),
            (
                json!({"online": true, "firmware": {"sriovEnabled": true}}),
                "spec.firmware",
            ),
            (
                json!({"online": false, "disablePowerOff": true}),
                "spec.online",
            ),
            (
                json!({"online": true, "userData": {"name": "u", "namespace": "other"}}),
                "spec.userData",
            ),
            (
                json!({"online": true, "bootMACAddress": "nope"}),
                "spec.bootMACAddress",
            ),
        ];
        for (spec, field) in cases {
            let e = host(bmh(spec.clone())).unwrap_err();
            assert_eq!(e.field, field, "{spec}: {e}");
        }
        // A live ISO needs no checksum.
        host(bmh(
            json!({"online": true, "image": {"url": "http://x/a.iso", "format": "live-iso"}}),
        ))
        .unwrap();
        let mut d = bmh(json!({"online": true}));
        d["metadata"]["name"] = json!("0b0e8d1c-1d2f-4a1c-9c0e-1f2a3b4c5d6e");
        assert_eq!(host(d).unwrap_err().field, "metadata.name");
        let mut d = bmh(json!({"online": true}));
        d["metadata"]["annotations"] = json!({"inspect.metal3.io": "now"});
        assert!(host(d).is_err());
        let mut d = bmh(json!({"online": true}));
        d["metadata"]["annotations"] = json!({"reboot.metal3.io": "{\"mode\":\"hard\"}"});
        host(d).unwrap();
    }

    #[test]
    fn the_printer_columns() {
        let mut d = bmh(
            json!({"online": true, "consumerRef": {"name": "m-1"}, "bmc": {"address": "ipmi://1.2.3.4"}}),
        );
        d["status"] = json!({"operationalStatus": "OK", "provisioning": {"state": "available"}});
        let r = row(&d);
        assert_eq!(
            (
                r.state.as_str(),
                r.consumer.as_str(),
                r.online.as_str(),
                r.error.as_str(),
                r.status.as_str(),
                r.bmc.as_str()
            ),
            ("available", "m-1", "true", "", "OK", "ipmi://1.2.3.4")
        );
    }
}
