//! Rufio's documents (`bmc.tinkerbell.org/v1alpha1` Machine, Job, Task) and
//! the `v1` Secret that holds BMC credentials, parsed and checked with
//! errors that name the field. The documents are kept whole (like Hardware);
//! these types are the checked view.

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

/// One step of a Job (exactly one of the three set).
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
        match (&self.power_action, self.boot()) {
            (Some(p), _) => format!(
                "power {}",
                serde_json::to_value(p)
                    .ok()
                    .and_then(|v| v.as_str().map(str::to_string))
                    .unwrap_or_default()
            ),
            (None, Some((d, persistent, efi))) => format!(
                "boot device {}{}{}",
                serde_json::to_value(d)
                    .ok()
                    .and_then(|v| v.as_str().map(str::to_string))
                    .unwrap_or_default(),
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

fn key_of(doc: &mut Value) -> Result<Key, FieldError> {
    let meta = doc
        .get_mut("metadata")
        .and_then(Value::as_object_mut)
        .ok_or_else(|| FieldError::new("metadata", "required"))?;
    let name = meta
        .get("name")
        .and_then(Value::as_str)
        .filter(|n| !n.is_empty())
        .ok_or_else(|| FieldError::new("metadata.name", "required"))?
        .to_string();
    let ns = meta
        .get("namespace")
        .and_then(Value::as_str)
        .unwrap_or(crate::hardware::DEFAULT_NAMESPACE)
        .to_string();
    meta.insert("namespace".into(), Value::String(ns.clone()));
    Ok(Key::new(ns, name))
}

fn typed<T: serde::de::DeserializeOwned>(v: &Value, prefix: &str) -> Result<T, FieldError> {
    serde_path_to_error::deserialize(v).map_err(|e| {
        let path = e.path().to_string();
        let field = if path == "." {
            prefix.to_string()
        } else {
            format!("{prefix}.{path}")
        };
        FieldError::new(field, e.into_inner().to_string())
    })
}

fn b64(v: &Value, field: &str) -> Result<String, FieldError> {
    let s = v
        .as_str()
        .ok_or_else(|| FieldError::new(field, "must be a string"))?;
    let raw = base64::engine::general_purpose::STANDARD
        .decode(s.trim())
        .map_err(|e| FieldError::new(field, format!("not base64: {e}")))?;
    String::from_utf8(raw).map_err(|_| FieldError::new(field, "not UTF-8 after base64 decoding"))
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
            let key = key_of(&mut doc)?;
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
            let key = key_of(&mut doc)?;
            let spec: MachineSpec = typed(doc.get("spec").unwrap_or(&Value::Null), "spec")?;
            if spec.connection.host.trim().is_empty() {
                return Err(FieldError::new("spec.connection.host", "required"));
            }
            Ok(Doc::Machine { key, doc, spec })
        }
        (API_VERSION, "Job") => {
            let key = key_of(&mut doc)?;
            let spec: JobSpec = typed(doc.get("spec").unwrap_or(&Value::Null), "spec")?;
            check_tasks(&spec.tasks, "spec.tasks")?;
            Ok(Doc::Job { key, doc, spec })
        }
        (API_VERSION, "Task") => {
            let key = key_of(&mut doc)?;
            let connection: Connection = typed(
                doc.pointer("/spec/connection").unwrap_or(&Value::Null),
                "spec.connection",
            )?;
            let action: Action = typed(
                doc.pointer("/spec/task").unwrap_or(&Value::Null),
                "spec.task",
            )?;
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
        let n = t.power_action.is_some() as u8
            + t.boot_device.is_some() as u8
            + t.one_time_boot_device_action.is_some() as u8;
        let f = if tasks.len() == 1 && !field.ends_with("tasks") {
            field.to_string()
        } else {
            format!("{field}[{i}]")
        };
        if n != 1 {
            return Err(FieldError::new(
                f,
                "exactly one of powerAction, bootDevice, oneTimeBootDeviceAction",
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
    }
    Ok(())
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
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/compat");
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
}
