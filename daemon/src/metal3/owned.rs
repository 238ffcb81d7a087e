//! The tinkerbox objects a host is carried out with, as documents: its
//! Hardware (the boot path), its BMC Machine, and one Template and
//! Workflow per operation (inspect, provision, deprovision), each
//! labelled with the host's name. They are ordinary objects: a user sees
//! them with `tinkerbox get`, and the host deletes them when it goes.

use super::model::{BootMode, ChecksumType, Host, Image, ImageFormat};
use super::{OWNER_LABEL, bmc_url::BmcTarget};
use crate::hardware::Key;
use serde_json::{Value, json};

/// The annotation on a Workflow naming the host's run it was made for.
pub const RUN_ANNOTATION: &str = "tinkerbox.io/metal3-run";

/// The three operations a host has Workflows for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Operation {
    Inspect,
    Provision,
    Deprovision,
}

impl Operation {
    pub fn suffix(self) -> &'static str {
        match self {
            Operation::Inspect => "inspect",
            Operation::Provision => "provision",
            Operation::Deprovision => "deprovision",
        }
    }
    /// The Template and the Workflow of the operation for `host`.
    pub fn key(self, host: &Key) -> Key {
        Key::new(
            host.namespace.clone(),
            format!("{}-{}", host.name, self.suffix()),
        )
    }
}

/// An owned object's metadata: the owner label (how tinkerbox tells its
/// own from a user's object of the name) and, for a host with a uid (in
/// the cluster, always), the owner reference that has the cluster's
/// garbage collector remove it with the host.
fn metadata(host: &Host, name: &str) -> Value {
    let mut m = json!({
        "name": name,
        "namespace": host.key.namespace,
        "labels": {OWNER_LABEL: host.key.name},
    });
    if let Some(uid) = host.uid() {
        m["ownerReferences"] = json!([{
            "apiVersion": super::API_VERSION, "kind": super::KIND, "name": host.key.name,
            "uid": uid, "controller": true, "blockOwnerDeletion": true,
        }]);
    }
    m
}

/// The host's Hardware: its boot interface by `bootMACAddress` (the
/// address comes from the discovery pool), no netboot until an operation
/// asks for it, its BMC, and what its installed OS reads from the
/// metadata service.
///
/// `live_iso`: the host boots this ISO from the network (iPXE's `sanboot`)
/// each time it starts, a live-iso image provisioned.
pub fn hardware(host: &Host, id: &str, user_data: Option<&str>, live_iso: Option<&str>) -> Value {
    let mac = host.boot_mac.map(|m| m.to_string()).unwrap_or_default();
    let uefi = host.spec.boot_mode.unwrap_or_default() != BootMode::Legacy;
    let netboot = match live_iso {
        Some(url) => json!({"allowPXE": true, "allowWorkflow": true,
                            "ipxe": {"contents": format!("#!ipxe\nsanboot --no-describe {url}\n")}}),
        None => json!({"allowPXE": false, "allowWorkflow": true}),
    };
    let mut spec = json!({
        "interfaces": [{
            "dhcp": {"mac": mac, "hostname": host.key.name, "uefi": uefi},
            "netboot": netboot,
        }],
        "metadata": {"instance": {"id": id, "hostname": host.key.name}},
    });
    if host.bmc.is_some() {
        spec["bmcRef"] =
            json!({"apiGroup": "bmc.tinkerbell.org", "kind": "Machine", "name": host.key.name});
    }
    if let Some(u) = user_data {
        spec["userData"] = json!(u);
    }
    json!({
        "apiVersion": crate::hardware::API_VERSION,
        "kind": crate::hardware::KIND,
        "metadata": metadata(host, &host.key.name),
        "spec": spec,
    })
}

/// The host's BMC Machine, credentials from the host's Secret.
pub fn machine(host: &Host, bmc: &BmcTarget) -> Value {
    let b = host.spec.bmc.clone().unwrap_or_default();
    json!({
        "apiVersion": crate::bmc::model::API_VERSION,
        "kind": "Machine",
        "metadata": metadata(host, &host.key.name),
        "spec": {"connection": bmc.connection(
            &b.credentials_name,
            &host.key.namespace,
            b.disable_certificate_verification,
        )},
    })
}

/// A Go template's text with no action in it: `{{` written so that the
/// engine's rendering prints it as it is (a raw string: the Template's
/// text is JSON, where a quote would be escaped).
fn literal(s: &str) -> String {
    s.replace("{{", "{{`{{`}}")
}

fn action(name: &str, image: &str, timeout: u64, env: Value) -> Value {
    let env = match env {
        Value::Object(m) => Value::Object(
            m.into_iter()
                .map(|(k, v)| {
                    let text = match v {
                        Value::String(s) => s,
                        other => other.to_string(),
                    };
                    (k, Value::String(literal(&text)))
                })
                .collect(),
        ),
        other => other,
    };
    json!({"name": name, "image": image, "timeout": timeout, "environment": env})
}

fn power(name: &str, command: &str) -> Value {
    json!({"name": name, "image": "alpine", "timeout": 90, "pid": "host", "command": [command]})
}

/// The Template of `op` for `host` (JSON is YAML: the engine reads it as
/// any Template's data) and its Workflow, netbooted, made for run `run`.
pub fn operation(host: &Host, op: Operation, run: u64, actions: Vec<Value>) -> (Value, Value) {
    let key = op.key(&host.key);
    let data = json!({
        "version": "0.1",
        "name": key.name,
        "global_timeout": 3600,
        "tasks": [{"name": op.suffix(), "worker": "{{.device_1}}", "volumes": ["/dev:/dev"], "actions": actions}],
    });
    let template = json!({
        "apiVersion": crate::workflow::model::API_VERSION,
        "kind": "Template",
        "metadata": metadata(host, &key.name),
        "spec": {"data": serde_json::to_string_pretty(&data).unwrap_or_default()},
    });
    let mut meta = metadata(host, &key.name);
    meta["annotations"] = json!({RUN_ANNOTATION: run.to_string()});
    let mac = host.boot_mac.map(|m| m.to_string()).unwrap_or_default();
    let workflow = json!({
        "apiVersion": crate::workflow::model::API_VERSION,
        "kind": "Workflow",
        "metadata": meta,
        "spec": {
            "templateRef": key.name,
            "hardwareRef": host.key.name,
            "hardwareMap": {"device_1": mac},
            "bootOptions": {"bootMode": "netboot", "toggleAllowNetboot": true},
        },
    });
    (template, workflow)
}

/// Inspection: the agent's `inspect` sends the report to `callback`, then
/// the host powers off.
pub fn inspect_actions(host: &Host, callback: &str) -> Vec<Value> {
    let mac = host.boot_mac.map(|m| m.to_string()).unwrap_or_default();
    vec![
        action(
            "inspect",
            "quay.io/tinkerbox/inspect:latest",
            300,
            json!({"CALLBACK_URL": callback, "BOOT_MAC": mac}),
        ),
        power("power off", "poweroff"),
    ]
}

/// Provisioning `image` onto `disk`: streamed (qcow2 converted in the same
/// pass), checked against its checksum, the config drive (at
/// `config_drive`) written to a partition at the disk's end, then the host
/// boots it (online) or powers off.
pub fn provision_actions(host: &Host, image: &Image, disk: &str, config_drive: &str) -> Vec<Value> {
    let qcow2 = image.format == Some(ImageFormat::Qcow2);
    let mut env = json!({"IMG_URL": image.url, "DEST_DISK": disk});
    if let Some(c) = image.checksum.as_deref().filter(|c| !c.is_empty()) {
        env["CHECKSUM"] = json!(c);
        let t = match image.checksum_type.unwrap_or(ChecksumType::Auto) {
            ChecksumType::Md5 => "md5",
            ChecksumType::Sha256 => "sha256",
            ChecksumType::Sha512 => "sha512",
            ChecksumType::Auto => "auto",
        };
        env["CHECKSUM_TYPE"] = json!(t);
    }
    let writer = if qcow2 {
        "quay.io/tinkerbell/actions/qemuimg2disk:latest"
    } else {
        // A raw image may be compressed: image2disk tells by its bytes.
        env["COMPRESSED"] = json!("true");
        "quay.io/tinkerbell/actions/image2disk:latest"
    };
    let end = if host.spec.online {
        power("boot the installed system", "reboot")
    } else {
        power("power off", "poweroff")
    };
    // The user's data, as Ironic gives it: a config drive partition.
    let drive = action(
        "config drive",
        "quay.io/tinkerbox/configdrive:latest",
        300,
        json!({"CONFIG_DRIVE_URL": config_drive, "DEST_DISK": disk}),
    );
    vec![action("stream image", writer, 3600, env), drive, end]
}

/// Cleaning (`automatedCleaningMode: metadata`): every disk's partition
/// tables and signatures wiped, then the host powers off.
pub fn deprovision_actions() -> Vec<Value> {
    vec![
        action(
            "wipe disks",
            "quay.io/tinkerbox/wipe-disks:latest",
            600,
            json!({"MODE": "metadata"}),
        ),
        power("power off", "poweroff"),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metal3::model;

    fn host() -> Host {
        model::host(json!({"apiVersion": "metal3.io/v1alpha1", "kind": "BareMetalHost",
            "metadata": {"name": "node-0", "namespace": "lab"},
            "spec": {"online": true, "bootMACAddress": "52:54:00:00:00:01",
                     "bmc": {"address": "redfish+http://10.0.0.1:8000/redfish/v1/Systems/vm-1", "credentialsName": "bmc"}}}))
        .unwrap()
    }

    #[test]
    fn the_parts_are_documents_their_checkers_take() {
        let h = host();
        let hw =
            crate::hardware::validate(hardware(&h, "id-1", Some("#cloud-config\n"), None)).unwrap();
        let iso = crate::hardware::validate(hardware(&h, "id-1", None, Some("http://x/live.iso")))
            .unwrap();
        let i = &iso.machine.interfaces[0];
        assert!(i.allow_pxe);
        assert_eq!(
            i.extra().ipxe_contents.as_deref(),
            Some("#!ipxe\nsanboot --no-describe http://x/live.iso\n")
        );
        assert_eq!(hw.machine.key, Key::new("lab", "node-0"));
        assert_eq!(hw.doc["metadata"]["labels"][OWNER_LABEL], json!("node-0"));
        let m = machine(&h, h.bmc.as_ref().unwrap());
        crate::bmc::model::parse(m).unwrap();
        let image = Image {
            url: "http://10.0.0.1/{{bad}}.qcow2".into(),
            checksum: Some("http://10.0.0.1/SHA256SUMS".into()),
            checksum_type: Some(ChecksumType::Sha256),
            format: Some(ImageFormat::Qcow2),
            oci_auth_secret_name: None,
        };
        for (op, actions) in [
            (
                Operation::Inspect,
                inspect_actions(&h, "http://10.0.0.1:8080/x"),
            ),
            (
                Operation::Provision,
                provision_actions(&h, &image, "/dev/vda", "http://10.0.0.1:8080/cd"),
            ),
            (Operation::Deprovision, deprovision_actions()),
        ] {
            let (t, w) = operation(&h, op, 3, actions);
            let t = crate::workflow::model::template(t).unwrap();
            let w = crate::workflow::model::workflow(w).unwrap();
            // It renders as the engine renders it, `{{` in a value kept.
            let map = std::collections::BTreeMap::from([(
                "device_1".to_string(),
                "52:54:00:00:00:01".to_string(),
            )]);
            let text = crate::workflow::render::execute(
                t.doc["spec"]["data"].as_str().unwrap(),
                Some(&hw.doc),
                &map,
            )
            .unwrap();
            let rendered: Value = serde_json::from_str(&text).unwrap();
            assert_eq!(rendered["tasks"][0]["worker"], json!("52:54:00:00:00:01"));
            if op == Operation::Provision {
                assert_eq!(
                    rendered["tasks"][0]["actions"][0]["environment"]["IMG_URL"],
                    json!("http://10.0.0.1/{{bad}}.qcow2")
                );
            }
            crate::workflow::render::render(
                t.doc["spec"]["data"].as_str().unwrap(),
                Some(&hw.doc),
                &map,
            )
            .unwrap();
            assert_eq!(t.key, op.key(&h.key));
            assert_eq!(w.doc["metadata"]["annotations"][RUN_ANNOTATION], json!("3"));
        }
        let env =
            &provision_actions(&h, &image, "/dev/vda", "http://10.0.0.1:8080/cd")[0]["environment"];
        assert_eq!(env["IMG_URL"], json!("http://10.0.0.1/{{`{{`}}bad}}.qcow2"));
        assert_eq!(env["CHECKSUM_TYPE"], json!("sha256"));
    }
}
