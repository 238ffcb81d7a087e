//! Rufio's documents (`bmc.tinkerbell.org/v1alpha1` Machine, Job, Task) and
//! the `v1` Secret that holds BMC credentials, parsed and checked with
//! errors that name the field. The documents are kept whole (like Hardware);
//! these types are the checked view.

use super::{BootDevice, PowerAction};
use crate::hardware::{FieldError, Key};
use base64::Engine;
use serde::{Deserialize, Serialize};
use serde_json::Value;

pub const API_VERSION: &str = "bmc.tinkerbell.org/v1alpha1";

#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct MachineSpec {
    pub connection: Connection,
}

#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Connection {
    pub host: String,
    /// Rufio's default is 623 (IPMI); Redfish uses providerOptions.redfish.port.
    #[serde(default)]
    pub port: Option<u16>,
    #[serde(default)]
    pub auth_secret_ref: Option<SecretRef>,
    #[serde(rename = "insecureTLS", default)]
    pub insecure_tls: bool,
    #[serde(default)]
    pub provider_options: Option<ProviderOptions>,
}

/// Where a BMC answers, from `spec.connection.host`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Address {
    /// A name or an address; IPv6 without brackets.
    pub host: String,
    pub port: Option<u16>,
    /// Given as `http://...`: Redfish over plain HTTP (emulators, labs).
    pub plain_http: bool,
    /// Given as a URL (`http://` or `https://`): a Redfish endpoint.
    pub url: bool,
}

impl Connection {
    /// The host, parsed: a name or an address (IPv6 with or without
    /// brackets), optionally with a port (`bmc-1:6230`, `[fd00::5]:6230`),
    /// or a URL (`http://host:port`, `https://[fd00::5]`). The `url` crate
    /// parses the authority: hand-splitting at the last `:` broke on IPv6.
    pub fn address(&self) -> Result<Address, String> {
        let h = self.host.trim();
        if h.is_empty() {
            return Err("required".into());
        }
        if let Ok(ip) = h.parse::<std::net::IpAddr>() {
            return Ok(Address {
                host: ip.to_string(),
                port: None,
                plain_http: false,
                url: false,
            });
        }
        let (url, scheme) = if h.contains("://") {
            let u = url::Url::parse(h).map_err(|e| format!("{h:?} is not a valid URL: {e}"))?;
            let scheme = u.scheme().to_string();
            if scheme != "http" && scheme != "https" {
                return Err(format!("{h:?}: want http:// or https://, or a bare host"));
            }
            (u, Some(scheme))
        } else {
            let u = url::Url::parse(&format!("bmc://{h}"))
                .map_err(|e| format!("{h:?} is not a host or host:port: {e}"))?;
            (u, None)
        };
        if !matches!(url.path(), "" | "/") || url.query().is_some() || !url.username().is_empty() {
            return Err(format!(
                "{h:?}: want a host, host:port or scheme://host:port, with no path or credentials (those go in the Secret)"
            ));
        }
        let host = match url.host() {
            Some(url::Host::Domain(d)) => d.to_string(),
            Some(url::Host::Ipv4(a)) => a.to_string(),
            Some(url::Host::Ipv6(a)) => a.to_string(),
            None => return Err(format!("{h:?} names no host")),
        };
        Ok(Address {
            host,
            port: url.port(),
            plain_http: scheme.as_deref() == Some("http"),
            url: scheme.is_some(),
        })
    }
}

#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
pub struct SecretRef {
    pub name: String,
    #[serde(default)]
    pub namespace: Option<String>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ProviderOptions {
    #[serde(default)]
    pub ipmitool: Option<IpmitoolOptions>,
    #[serde(default)]
    pub redfish: Option<RedfishOptions>,
    /// Protocols to try, in order: "ipmitool", "gofish"/"redfish".
    #[serde(default)]
    pub preferred_order: Vec<String>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct IpmitoolOptions {
    #[serde(default)]
    pub port: Option<u16>,
    /// A string in Rufio ("3", "17").
    #[serde(default)]
    pub cipher_suite: Option<String>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct RedfishOptions {
    #[serde(default)]
    pub port: Option<u16>,
    #[serde(default)]
    pub use_basic_auth: bool,
    #[serde(default)]
    pub system_name: Option<String>,
}

/// One step of a Job (exactly one of the four set).
#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Action {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub power_action: Option<super::PowerAction>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub boot_device: Option<BootDeviceAction>,
    /// Deprecated in Rufio, still accepted: a one-time boot device.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub one_time_boot_device_action: Option<OneTimeBootDeviceAction>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub virtual_media_action: Option<VirtualMediaAction>,
}

/// Insert (a URL) or eject (no URL) the virtual media of one kind:
/// Redfish `VirtualMedia.InsertMedia`/`EjectMedia`; IPMI has no such thing.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct VirtualMediaAction {
    pub kind: MediaKind,
    #[serde(rename = "mediaURL", default, skip_serializing_if = "String::is_empty")]
    pub media_url: String,
}

/// An image URL for virtual media: the BMC fetches it itself, so http or
/// https with a host.
pub fn media_url(u: &str) -> Result<(), String> {
    match url::Url::parse(u) {
        Ok(p) if matches!(p.scheme(), "http" | "https") && p.host().is_some() => Ok(()),
        Ok(_) => Err(format!(
            "{u:?}: want an http:// or https:// URL the BMC can fetch"
        )),
        Err(e) => Err(format!("{u:?} is not a URL: {e}")),
    }
}

/// Redfish `MediaTypes` values Rufio accepts as a `kind`.
#[derive(Debug, Clone, Copy, Deserialize, Serialize, PartialEq, Eq, clap::ValueEnum)]
pub enum MediaKind {
    #[serde(rename = "CD")]
    Cd,
    #[serde(rename = "DVD")]
    Dvd,
    Floppy,
    #[serde(rename = "USBStick")]
    UsbStick,
}

impl MediaKind {
    /// As Redfish spells it in `MediaTypes`.
    pub fn as_str(self) -> &'static str {
        match self {
            MediaKind::Cd => "CD",
            MediaKind::Dvd => "DVD",
            MediaKind::Floppy => "Floppy",
            MediaKind::UsbStick => "USBStick",
        }
    }
}

#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct BootDeviceAction {
    pub device: super::BootDevice,
    #[serde(default)]
    pub persistent: bool,
    #[serde(default)]
    pub efi_boot: bool,
}

#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct OneTimeBootDeviceAction {
    pub device: Vec<super::BootDevice>,
    #[serde(default)]
    pub efi_boot: bool,
}

impl Action {
    /// As a boot-device step, if it is one: (device, persistent, efi).
    pub fn boot(&self) -> Option<(super::BootDevice, bool, bool)> {
        if let Some(b) = &self.boot_device {
            return Some((b.device, b.persistent, b.efi_boot));
        }
        let o = self.one_time_boot_device_action.as_ref()?;
        Some((*o.device.first()?, false, o.efi_boot))
    }

    pub fn describe(&self) -> String {
        if let Some(v) = &self.virtual_media_action {
            return if v.media_url.is_empty() {
                format!("virtual media {}: eject", v.kind.as_str())
            } else {
                format!("virtual media {}: insert {}", v.kind.as_str(), v.media_url)
            };
        }
        match (&self.power_action, self.boot()) {
            (Some(p), _) => format!("power {}", p.as_str()),
            (None, Some((d, persistent, efi))) => format!(
                "boot device {}{}{}",
                d.as_str(),
                if persistent {
                    " (persistent)"
                } else {
                    " (once)"
                },
                if efi { " EFI" } else { "" }
            ),
            (None, None) => "nothing".into(),
        }
    }
}

#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct JobSpec {
    pub machine_ref: MachineRef,
    pub tasks: Vec<Action>,
}

#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
pub struct MachineRef {
    pub name: String,
    #[serde(default)]
    pub namespace: Option<String>,
}

impl JobSpec {
    /// The BMC Machine the job runs against; `namespace` is the job's.
    pub fn machine_key(&self, namespace: &str) -> Key {
        Key::new(
            self.machine_ref
                .namespace
                .clone()
                .unwrap_or_else(|| namespace.to_string()),
            self.machine_ref.name.clone(),
        )
    }
}

/// BMC credentials from a Secret (never printed, logged or returned).
#[derive(Clone, PartialEq)]
pub struct Credentials {
    pub username: String,
    pub password: String,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Credentials(<redacted>)")
    }
}

/// A parsed document of the BMC family.
#[derive(Debug, Clone)]
pub enum Doc {
    Machine {
        key: Key,
        doc: Value,
        spec: MachineSpec,
    },
    Job {
        key: Key,
        doc: Value,
        spec: JobSpec,
    },
    /// A Rufio `Task` is one action against a connection; tinkerbox runs
    /// it as a one-task Job against that connection.
    Task {
        key: Key,
        doc: Value,
        connection: Connection,
        action: Action,
    },
    Secret {
        key: Key,
        credentials: Credentials,
    },
}

use crate::hardware::typed;

pub(crate) fn b64(v: &Value, field: &str) -> Result<String, FieldError> {
    let s = v
        .as_str()
        .ok_or_else(|| FieldError::new(field, "must be a string"))?;
    let raw = base64::engine::general_purpose::STANDARD
        .decode(s.trim())
        .map_err(|e| FieldError::new(field, format!("not base64: {e}")))?;
    String::from_utf8(raw).map_err(|_| FieldError::new(field, "not UTF-8 after base64 decoding"))
}

impl Doc {
    pub fn key(&self) -> &Key {
        match self {
            Doc::Machine { key, .. }
            | Doc::Job { key, .. }
            | Doc::Task { key, .. }
            | Doc::Secret { key, .. } => key,
        }
    }

    pub fn kind(&self) -> &'static str {
        match self {
            Doc::Machine { .. } => "Machine",
            Doc::Job { .. } => "Job",
            Doc::Task { .. } => "Task",
            Doc::Secret { .. } => "Secret",
        }
    }
}

/// Check one document of the BMC family.
pub fn parse(mut doc: Value) -> Result<Doc, FieldError> {
    let api = doc
        .get("apiVersion")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string();
    let kind = doc
        .get("kind")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string();
    match (api.as_str(), kind.as_str()) {
        ("v1", "Secret") => {
            let key = crate::hardware::object_key(&mut doc)?;
            let get = |k: &str| -> Result<Option<String>, FieldError> {
                if let Some(v) = doc.pointer(&format!("/stringData/{k}")) {
                    return v.as_str().map(|s| Some(s.to_string())).ok_or_else(|| {
                        FieldError::new(format!("stringData.{k}"), "must be a string")
                    });
                }
                doc.pointer(&format!("/data/{k}"))
                    .map(|v| b64(v, &format!("data.{k}")))
                    .transpose()
            };
            let username =
                get("username")?.ok_or_else(|| FieldError::new("data.username", "required"))?;
            let password =
                get("password")?.ok_or_else(|| FieldError::new("data.password", "required"))?;
            Ok(Doc::Secret {
                key,
                credentials: Credentials { username, password },
            })
        }
        (API_VERSION, "Machine") => {
            let key = crate::hardware::object_key(&mut doc)?;
            let spec: MachineSpec = typed(doc.get("spec").unwrap_or(&Value::Null), "spec")?;
            spec.connection
                .address()
                .map_err(|m| FieldError::new("spec.connection.host", m))?;
            Ok(Doc::Machine { key, doc, spec })
        }
        (API_VERSION, "Job") => {
            let key = crate::hardware::object_key(&mut doc)?;
            let spec: JobSpec = typed(doc.get("spec").unwrap_or(&Value::Null), "spec")?;
            check_tasks(&spec.tasks, "spec.tasks")?;
            Ok(Doc::Job { key, doc, spec })
        }
        (API_VERSION, "Task") => {
            let key = crate::hardware::object_key(&mut doc)?;
            let connection: Connection = typed(
                doc.pointer("/spec/connection").unwrap_or(&Value::Null),
                "spec.connection",
            )?;
            let action: Action = typed(
                doc.pointer("/spec/task").unwrap_or(&Value::Null),
                "spec.task",
            )?;
            connection
                .address()
                .map_err(|m| FieldError::new("spec.connection.host", m))?;
            check_tasks(std::slice::from_ref(&action), "spec.task")?;
            Ok(Doc::Task {
                key,
                doc,
                connection,
                action,
            })
        }
        (_, "Secret" | "Machine" | "Job" | "Task") => Err(FieldError::new(
            "apiVersion",
            format!(
                "{kind} needs apiVersion {}",
                if kind == "Secret" { "v1" } else { API_VERSION }
            ),
        )),
        _ => Err(FieldError::new(
            "kind",
            format!(
                "want a bmc.tinkerbell.org Machine, Job or Task, or a v1 Secret; got {api:?} {kind:?}"
            ),
        )),
    }
}

fn check_tasks(tasks: &[Action], field: &str) -> Result<(), FieldError> {
    if tasks.is_empty() {
        return Err(FieldError::new(field, "at least one task"));
    }
    for (i, t) in tasks.iter().enumerate() {
        let f = if tasks.len() == 1 && !field.ends_with("tasks") {
            field.to_string()
        } else {
            format!("{field}[{i}]")
        };
        check_action(t, &f)?;
    }
    Ok(())
}

/// One action: exactly one thing to do, and what it needs. Also checks a
/// Workflow's `custombootConfig` actions.
pub fn check_action(t: &Action, f: &str) -> Result<(), FieldError> {
    let n = t.power_action.is_some() as u8
        + t.boot_device.is_some() as u8
        + t.one_time_boot_device_action.is_some() as u8
        + t.virtual_media_action.is_some() as u8;
    if n != 1 {
        return Err(FieldError::new(
            f,
            "exactly one of powerAction, bootDevice, oneTimeBootDeviceAction, virtualMediaAction",
        ));
    }
    if t.one_time_boot_device_action
        .as_ref()
        .is_some_and(|o| o.device.is_empty())
    {
        return Err(FieldError::new(
            format!("{f}.oneTimeBootDeviceAction.device"),
            "at least one device",
        ));
    }
    Ok(())
}

/// A network boot: power off, PXE once (EFI if `efi`), power on.
pub fn netboot_tasks(efi: bool) -> Vec<Action> {
    vec![
        power_action(PowerAction::Off),
        boot_once(BootDevice::Pxe, efi),
        power_action(PowerAction::On),
    ]
}

/// Rufio's one-time boot device, as tink-controller asks for it.
pub fn boot_once(device: BootDevice, efi: bool) -> Action {
    Action {
        one_time_boot_device_action: Some(OneTimeBootDeviceAction {
            device: vec![device],
            efi_boot: efi,
        }),
        ..Action::default()
    }
}

/// A power task.
pub fn power_action(p: PowerAction) -> Action {
    Action {
        power_action: Some(p),
        ..Action::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hardware::parse_documents;

    fn one(text: &str) -> Result<Doc, FieldError> {
        parse(parse_documents(text).unwrap().remove(0))
    }

    #[test]
    fn rufio_samples_parse() {
        let dir = crate::compat_dir();
        for f in [
            "rufio-machine_v1alpha1.yaml",
            "rufio-job_v1alpha1.yaml",
            "rufio-task_v1alpha1.yaml",
            "rufio-auth-secret.yaml",
        ] {
            let text = std::fs::read_to_string(dir.join(f)).unwrap();
            let d = one(&text).unwrap_or_else(|e| panic!("{f}: {e}"));
            match d {
                Doc::Secret { credentials, .. } => {
                    assert_eq!(credentials.username, "admin");
                    assert_eq!(credentials.password, "t0p-Secret");
                    assert_eq!(format!("{credentials:?}"), "Credentials(<redacted>)");
                }
                Doc::Job { spec, .. } => {
                    assert_eq!(spec.tasks.len(), 3);
                    assert_eq!(
                        spec.tasks[1].boot(),
                        Some((super::super::BootDevice::Pxe, false, false))
                    );
                    assert_eq!(spec.tasks[0].describe(), "power off");
                }
                Doc::Machine { spec, key, .. } => {
                    assert_eq!(spec.connection.host, "127.0.0.1");
                    assert_eq!(key.namespace, "default");
                }
                Doc::Task { action, .. } => assert_eq!(action.describe(), "power off"),
            }
        }
    }

    #[test]
    fn errors_name_the_field() {
        let m = "apiVersion: bmc.tinkerbell.org/v1alpha1\nkind: Machine\nmetadata: {name: m}\nspec:\n  connection: {host: h, insecureTLS: true, port: 99999}\n";
        assert_eq!(one(m).unwrap_err().field, "spec.connection.port");
        let j = "apiVersion: bmc.tinkerbell.org/v1alpha1\nkind: Job\nmetadata: {name: j}\nspec:\n  machineRef: {name: m}\n  tasks:\n  - powerAction: sideways\n";
        assert_eq!(one(j).unwrap_err().field, "spec.tasks[0].powerAction");
        let j = "apiVersion: bmc.tinkerbell.org/v1alpha1\nkind: Job\nmetadata: {name: j}\nspec:\n  machineRef: {name: m}\n  tasks:\n  - {powerAction: \"on\", bootDevice: {device: pxe}}\n";
        assert_eq!(one(j).unwrap_err().field, "spec.tasks[0]");
        let s = "apiVersion: v1\nkind: Secret\nmetadata: {name: s}\ndata: {username: \"!!\", password: eA==}\n";
        assert_eq!(one(s).unwrap_err().field, "data.username");
        let s = "apiVersion: v1\nkind: Secret\nmetadata: {name: s}\nstringData: {username: u}\n";
        assert_eq!(one(s).unwrap_err().field, "data.password");
        assert_eq!(
            one("apiVersion: v1\nkind: Pod\nmetadata: {name: p}\n")
                .unwrap_err()
                .field,
            "kind"
        );
        assert_eq!(
            one("apiVersion: v2\nkind: Machine\nmetadata: {name: p}\n")
                .unwrap_err()
                .field,
            "apiVersion"
        );
    }

    #[test]
    fn virtual_media_actions() {
        let j = "apiVersion: bmc.tinkerbell.org/v1alpha1\nkind: Job\nmetadata: {name: j}\nspec:\n  machineRef: {name: m}\n  tasks:\n  - virtualMediaAction: {kind: CD, mediaURL: \"http://10.0.0.1/a.iso\"}\n  - virtualMediaAction: {kind: CD}\n";
        let Ok(Doc::Job { spec, .. }) = one(j) else {
            panic!("{:?}", one(j))
        };
        assert_eq!(
            spec.tasks[0].describe(),
            "virtual media CD: insert http://10.0.0.1/a.iso"
        );
        assert_eq!(spec.tasks[1].describe(), "virtual media CD: eject");
        // Read back as Rufio writes it: no mediaURL when ejecting.
        assert_eq!(
            serde_json::to_value(&spec.tasks[1]).unwrap(),
            serde_json::json!({"virtualMediaAction": {"kind": "CD"}})
        );
        let bad = j.replace("kind: CD, ", "kind: Tape, ");
        assert_eq!(
            one(&bad).unwrap_err().field,
            "spec.tasks[0].virtualMediaAction.kind"
        );
        let two = j.replace(
            "- virtualMediaAction: {kind: CD}",
            "- {virtualMediaAction: {kind: CD}, powerAction: \"on\"}",
        );
        assert_eq!(one(&two).unwrap_err().field, "spec.tasks[1]");
    }

    #[test]
    fn bmc_addresses() {
        let addr = |h: &str| {
            let c = Connection {
                host: h.into(),
                port: None,
                auth_secret_ref: None,
                insecure_tls: false,
                provider_options: None,
            };
            c.address().map(|a| (a.host, a.port, a.plain_http, a.url))
        };
        let s = |h: &str| h.to_string();
        assert_eq!(addr("10.0.0.5"), Ok((s("10.0.0.5"), None, false, false)));
        assert_eq!(addr("fd00::5"), Ok((s("fd00::5"), None, false, false)));
        assert_eq!(addr("[fd00::5]"), Ok((s("fd00::5"), None, false, false)));
        assert_eq!(
            addr("[fd00::5]:6230"),
            Ok((s("fd00::5"), Some(6230), false, false))
        );
        assert_eq!(
            addr("10.0.0.5:6230"),
            Ok((s("10.0.0.5"), Some(6230), false, false))
        );
        assert_eq!(addr("bmc-1.lab"), Ok((s("bmc-1.lab"), None, false, false)));
        assert_eq!(
            addr("http://[fd00::5]:8000"),
            Ok((s("fd00::5"), Some(8000), true, true))
        );
        assert_eq!(
            addr("https://[fd00::5]/"),
            Ok((s("fd00::5"), None, false, true))
        );
        assert_eq!(
            addr("http://127.0.0.1:8000"),
            Ok((s("127.0.0.1"), Some(8000), true, true))
        );
        for bad in [
            "",
            "ftp://x",
            "http://h:8000/redfish",
            "http://u:p@h",
            "h:99999",
            "[fd00::5",
        ] {
            assert!(addr(bad).is_err(), "{bad:?}");
        }
    }

    /// Every kind's name and namespace follow the Kubernetes rules that
    /// Hardware enforces.
    #[test]
    fn names_and_namespaces_are_checked_for_every_kind() {
        let docs = [
            "apiVersion: bmc.tinkerbell.org/v1alpha1\nkind: Machine\nmetadata: {META}\nspec:\n  connection: {host: h}\n",
            "apiVersion: bmc.tinkerbell.org/v1alpha1\nkind: Job\nmetadata: {META}\nspec:\n  machineRef: {name: m}\n  tasks:\n  - powerAction: \"on\"\n",
            "apiVersion: bmc.tinkerbell.org/v1alpha1\nkind: Task\nmetadata: {META}\nspec:\n  connection: {host: h}\n  task: {powerAction: \"on\"}\n",
            "apiVersion: v1\nkind: Secret\nmetadata: {META}\nstringData: {username: u, password: p}\n",
        ];
        for d in docs {
            let with = |meta: &str| one(&d.replace("META", meta));
            assert!(with("name: good-1").is_ok(), "{d}");
            assert_eq!(
                with("name: Bad_Name..").unwrap_err().field,
                "metadata.name",
                "{d}"
            );
            assert_eq!(
                with("name: x, namespace: \"NOT VALID/ns\"")
                    .unwrap_err()
                    .field,
                "metadata.namespace",
                "{d}"
            );
            assert_eq!(
                with("name: \"\"").unwrap_err().field,
                "metadata.name",
                "{d}"
            );
            assert_eq!(
                with("namespace: a").unwrap_err().field,
                "metadata.name",
                "{d}"
            );
        }
    }
}
