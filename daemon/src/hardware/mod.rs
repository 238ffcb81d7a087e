//! Tinkerbell `Hardware` documents: parsing (YAML or JSON, one or many),
//! validation with errors that name the field, and MAC normalisation.
//!
//! The document a user applies is kept whole (as JSON) so that it reads back
//! unchanged, fields tinkerbox does not model included; the typed
//! [`HardwareSpec`] is a checked view of it.

pub mod documents;
pub mod mac;
pub mod spec;
pub mod view;

pub use documents::{Located, expand_lists, parse_documents, parse_located};
pub use mac::Mac;
pub use spec::HardwareSpec;
pub use view::{Firmware, Interface, Machine};

use serde_json::{Map, Value};
use std::fmt;

pub const API_VERSION: &str = "tinkerbell.org/v1alpha1";
pub const KIND: &str = "Hardware";
pub const DEFAULT_NAMESPACE: &str = "default";

/// A Hardware's identity: Kubernetes' namespace/name.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
pub struct Key {
    pub namespace: String,
    pub name: String,
}

impl Key {
    pub fn new(namespace: impl Into<String>, name: impl Into<String>) -> Self {
        Key {
            namespace: namespace.into(),
            name: name.into(),
        }
    }

    /// A document's namespace/name (`default` when it has no namespace).
    pub fn of(doc: &Value) -> Key {
        let meta = &doc["metadata"];
        Key::new(
            meta["namespace"]
                .as_str()
                .filter(|ns| !ns.is_empty())
                .unwrap_or("default"),
            meta["name"].as_str().unwrap_or(""),
        )
    }
}

impl fmt::Display for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// An input problem, with the path of the offending field
/// (`spec.interfaces[0].dhcp.mac`) so API clients can point at it, and
/// for a document of a stream, where it is (`document 3 (line 41)`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct FieldError {
    pub field: String,
    pub message: String,
    pub place: Option<String>,
}

impl std::fmt::Display for FieldError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if let Some(p) = &self.place {
            write!(f, "{p}: ")?;
        }
        if self.field.is_empty() {
            f.write_str(&self.message)
        } else {
            write!(f, "{}: {}", self.field, self.message)
        }
    }
}

impl FieldError {
    pub fn new(field: impl Into<String>, message: impl Into<String>) -> Self {
        FieldError {
            field: field.into(),
            message: message.into(),
            place: None,
        }
    }

    /// Document `index` of a stream, starting at `line` (0: unknown).
    pub fn at_document(mut self, index: usize, line: u64) -> Self {
        self.place = Some(documents::place(index, (line > 0).then_some(line)));
        self.within(&format!("[{index}]"))
    }

    /// Prefix the path, e.g. with the document's index in a multi-document file.
    pub fn within(mut self, prefix: &str) -> Self {
        self.field = if self.field.is_empty() {
            prefix.to_string()
        } else if self.field.starts_with('[') {
            format!("{prefix}{}", self.field)
        } else {
            format!("{prefix}.{}", self.field)
        };
        self
    }
}

/// A validated Hardware: the document as it will be stored (MACs
/// normalised, namespace filled in) and its typed view.
#[derive(Debug, Clone, PartialEq)]
pub struct Hardware {
    pub doc: Value,
    pub machine: Machine,
}

/// A document's identity, checked as the Kubernetes API server checks it
/// (name: an RFC 1123 subdomain; namespace: an RFC 1123 label, `default`
/// when unset), for every kind tinkerbox stores. The namespace is written
/// into the document: an object always reads back with its namespace.
pub fn object_key(doc: &mut Value) -> Result<Key, FieldError> {
    let obj = doc
        .as_object_mut()
        .ok_or_else(|| FieldError::new("", "a document must be a mapping"))?;
    let meta = match obj
        .entry("metadata")
        .or_insert_with(|| Value::Object(Map::new()))
    {
        Value::Object(m) => m,
        _ => return Err(FieldError::new("metadata", "must be a mapping")),
    };
    let name = match meta.get("name") {
        Some(Value::String(n)) => n.clone(),
        Some(_) => return Err(FieldError::new("metadata.name", "must be a string")),
        None => return Err(FieldError::new("metadata.name", "required")),
    };
    check_dns_subdomain(&name).map_err(|m| FieldError::new("metadata.name", m))?;
    let namespace = match meta.get("namespace") {
        Some(Value::String(n)) => n.clone(),
        Some(Value::Null) | None => DEFAULT_NAMESPACE.to_string(),
        Some(_) => return Err(FieldError::new("metadata.namespace", "must be a string")),
    };
    check_dns_label(&namespace).map_err(|m| FieldError::new("metadata.namespace", m))?;
    meta.insert("namespace".into(), Value::String(namespace.clone()));
    Ok(Key { namespace, name })
}

/// Check a document and bring it to its stored form.
pub fn validate(mut doc: Value) -> Result<Hardware, FieldError> {
    let obj = doc
        .as_object_mut()
        .ok_or_else(|| FieldError::new("", "a Hardware document must be a mapping"))?;
    match obj.get("apiVersion") {
        Some(Value::String(v)) if v == API_VERSION => {}
        Some(v) => {
            return Err(FieldError::new(
                "apiVersion",
                format!("must be {API_VERSION:?}, got {v}"),
            ));
        }
        None => {
            return Err(FieldError::new(
                "apiVersion",
                format!("required ({API_VERSION:?})"),
            ));
        }
    }
    match obj.get("kind") {
        Some(Value::String(k)) if k == KIND => {}
        Some(v) => {
            return Err(FieldError::new(
                "kind",
                format!("must be \"Hardware\", got {v}"),
            ));
        }
        None => return Err(FieldError::new("kind", "required (\"Hardware\")")),
    }
    let key = object_key(&mut doc)?;
    // Type-check the whole spec, as the API server checks it against the
    // CRD schema; the view reads only part of it.
    match doc.get("spec") {
        None | Some(Value::Null) => {}
        Some(v @ Value::Object(_)) => {
            typed::<HardwareSpec>(v, "spec")?;
        }
        Some(_) => return Err(FieldError::new("spec", "must be a mapping")),
    }
    // MACs normalised in the document too, so that what reads back is what
    // the indexes hold.
    if let Some(Value::Array(ifaces)) = doc.pointer_mut("/spec/interfaces") {
        for iface in ifaces {
            if let Some(Value::String(m)) = iface.pointer_mut("/dhcp/mac")
                && let Ok(mac) = m.parse::<Mac>()
            {
                *m = mac.to_string();
            }
        }
    }
    let machine = Machine::from_doc(key, &doc.to_string())?;
    Ok(Hardware { doc, machine })
}

fn check_dns_subdomain(s: &str) -> Result<(), String> {
    if s.is_empty() || s.len() > 253 {
        return Err(format!("must be 1-253 characters, got {}", s.len()));
    }
    for label in s.split('.') {
        check_label_chars(label).map_err(|m| format!("{m} in {s:?}"))?;
    }
    Ok(())
}

/// `v` read as `T`, as the API server checks a document against its CRD's
/// schema: a mismatch names its field (`spec.interfaces[0].dhcp.mac`),
/// under `prefix`.
pub fn typed<T: serde::de::DeserializeOwned>(v: &Value, prefix: &str) -> Result<T, FieldError> {
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

pub fn check_dns_label(s: &str) -> Result<(), String> {
    if s.len() > 63 {
        return Err(format!("must be at most 63 characters, got {}", s.len()));
    }
    check_label_chars(s).map_err(|m| format!("{m} in {s:?}"))
}

/// RFC 1123 label, as Kubernetes names require.
fn check_label_chars(l: &str) -> Result<(), String> {
    let ok = !l.is_empty()
        && l.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !l.starts_with('-')
        && !l.ends_with('-');
    if ok {
        Ok(())
    } else {
        Err("must be lowercase letters, digits and '-' (RFC 1123), starting and ending alphanumeric".into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn hw(spec: Value) -> Value {
        json!({"apiVersion": API_VERSION, "kind": "Hardware",
               "metadata": {"name": "m1"}, "spec": spec})
    }

    #[test]
    fn normalises_mac_and_fills_namespace() {
        let h = validate(hw(
            json!({"interfaces": [{"dhcp": {"mac": "52-54-00-AA-BB-CC",
            "ip": {"address": "10.0.0.5", "netmask": "255.255.255.0"}}}]}),
        ))
        .unwrap();
        assert_eq!(h.machine.key, Key::new("default", "m1"));
        assert_eq!(
            h.machine.interfaces[0].mac.unwrap().to_string(),
            "52:54:00:aa:bb:cc"
        );
        assert_eq!(
            h.doc["spec"]["interfaces"][0]["dhcp"]["mac"],
            "52:54:00:aa:bb:cc"
        );
        assert_eq!(h.doc["metadata"]["namespace"], "default");
        assert_eq!(
            h.machine.ips().collect::<Vec<_>>(),
            vec!["10.0.0.5".parse::<std::net::IpAddr>().unwrap()]
        );
    }

    #[test]
    fn errors_name_the_field() {
        let cases = [
            (
                json!({"interfaces": [{"dhcp": {"mac": "nope"}}]}),
                "spec.interfaces[0].dhcp.mac",
            ),
            (
                json!({"interfaces": [{}, {"dhcp": {"ip": {"address": "3"}}}]}),
                "spec.interfaces[1].dhcp.ip.address",
            ),
            (
                json!({"interfaces": [{"dhcp": {"lease_time": "long"}}]}),
                "spec.interfaces[0].dhcp.lease_time",
            ),
            (
                json!({"interfaces": [{"netboot": {"allowPXE": "yes"}}]}),
                "spec.interfaces[0].netboot.allowPXE",
            ),
            (
                json!({"interfaces": [{"dhcp": {"ip": {"netmask": "255.0.255.0"}}}]}),
                "spec.interfaces[0].dhcp.ip.netmask",
            ),
            (
                json!({"interfaces": [{"dhcp": {"name_servers": ["8.8.8.8", "dns"]}}]}),
                "spec.interfaces[0].dhcp.name_servers[1]",
            ),
            (
                json!({"interfaces": [{"dhcp": {"mac": "52:54:00:00:00:01"}},
                                      {"dhcp": {"mac": "52:54:00:00:00:01"}}]}),
                "spec.interfaces[1].dhcp.mac",
            ),
            (
                json!({"interfaces": [{"dhcp": {"classless_static_routes":
                    [{"destination_descriptor": "10.0.0.0/33", "router": "10.0.0.1"}]}}]}),
                "spec.interfaces[0].dhcp.classless_static_routes[0].destination_descriptor",
            ),
            (
                json!({"interfaces": [{"dhcp": {"vlan_id": "5000"}}]}),
                "spec.interfaces[0].dhcp.vlan_id",
            ),
            (json!({"userData": 5}), "spec.userData"),
            (json!({"interfaces": {"a": 1}}), "spec.interfaces"),
            (json!([1]), "spec"),
        ];
        for (spec, field) in cases {
            let err = validate(hw(spec.clone())).expect_err(&spec.to_string());
            assert_eq!(err.field, field, "{spec}: {err}");
        }
    }

    #[test]
    fn header_errors() {
        let mut d = hw(json!({}));
        d["apiVersion"] = json!("v1");
        assert_eq!(validate(d).unwrap_err().field, "apiVersion");
        let mut d = hw(json!({}));
        d["kind"] = json!("Pod");
        assert_eq!(validate(d).unwrap_err().field, "kind");
        let mut d = hw(json!({}));
        d["metadata"]["name"] = json!("Bad_Name");
        assert_eq!(validate(d).unwrap_err().field, "metadata.name");
        let mut d = hw(json!({}));
        d["metadata"] = json!({});
        assert_eq!(validate(d).unwrap_err().field, "metadata.name");
        assert_eq!(validate(json!("x")).unwrap_err().field, "");
    }

    #[test]
    fn nulls_are_unset() {
        let h = validate(hw(
            json!({"interfaces": [{"dhcp": {"name_servers": null, "ip": null}}],
            "userData": null}),
        ))
        .unwrap();
        assert!(h.machine.interfaces[0].name_servers.is_empty());
    }
}
