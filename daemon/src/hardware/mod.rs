//! Tinkerbell `Hardware` documents: parsing (YAML or JSON, one or many),
//! validation with errors that name the field, and MAC normalisation.
//!
//! The document a user applies is kept whole (as JSON) so that it reads back
//! unchanged, fields tinkerbox does not model included; the typed
//! [`HardwareSpec`] is a checked view of it.

pub mod mac;
pub mod record;
pub mod spec;

pub use mac::Mac;
pub use record::Record;
pub use spec::HardwareSpec;

use serde_json::{Map, Value};
use std::fmt;
use std::net::{IpAddr, Ipv4Addr};

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
}

impl fmt::Display for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// An input problem, with the path of the offending field
/// (`spec.interfaces[0].dhcp.mac`) so API clients can point at it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {message}")]
pub struct FieldError {
    pub field: String,
    pub message: String,
}

impl FieldError {
    pub fn new(field: impl Into<String>, message: impl Into<String>) -> Self {
        FieldError {
            field: field.into(),
            message: message.into(),
        }
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
/// normalised, namespace filled in) and its typed machine view.
#[derive(Debug, Clone, PartialEq)]
pub struct Hardware {
    pub doc: Value,
    pub machine: Machine,
}

/// A Hardware's typed view: its identity, spec and the keys it is found
/// by. The inventory keeps each as a compact [`Record`] and gives this view
/// back on demand ([`Record::machine`]).
#[derive(Debug, Clone, PartialEq)]
pub struct Machine {
    pub key: Key,
    pub spec: HardwareSpec,
    pub macs: Vec<Mac>,
    pub ips: Vec<IpAddr>,
}

impl Machine {
    /// The interface with this MAC: what DHCP, TFTP and iPXE ask first.
    pub fn interface(&self, mac: Mac) -> Option<&spec::Interface> {
        self.spec.interfaces.iter().find(|i| {
            i.dhcp
                .as_ref()
                .and_then(|d| d.mac.as_deref())
                .and_then(|x| x.parse::<Mac>().ok())
                == Some(mac)
        })
    }
}

/// Split a YAML or JSON stream into documents, the way `kubectl apply -f`
/// reads a file: `---`-separated documents, a top-level YAML list (the format
/// of Tinkerbell's file backend), or a `kind: List`/`HardwareList` with `items`.
pub fn parse_documents(text: &str) -> Result<Vec<Value>, FieldError> {
    let docs: Vec<Value> = serde_saphyr::from_multiple(text).map_err(|e| {
        FieldError::new(
            "",
            format!("malformed YAML/JSON: {}", one_line(&e.to_string())),
        )
    })?;
    Ok(expand_lists(docs))
}

/// Flatten top-level arrays and `kind: *List` objects into their items.
pub fn expand_lists(docs: Vec<Value>) -> Vec<Value> {
    let mut out = Vec::new();
    for doc in docs {
        match doc {
            Value::Null => {}
            Value::Array(items) => out.extend(items),
            Value::Object(mut m)
                if m.get("kind")
                    .and_then(Value::as_str)
                    .is_some_and(|k| k.ends_with("List"))
                    && m.get("items").is_some_and(Value::is_array) =>
            {
                if let Some(Value::Array(items)) = m.remove("items") {
                    out.extend(items);
                }
            }
            other => out.push(other),
        }
    }
    out
}

fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
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
    // As the API server does: an object always reads back with its namespace.
    meta.insert("namespace".into(), Value::String(namespace.clone()));

    let spec_value = obj.get("spec").cloned().unwrap_or(Value::Null);
    let spec: HardwareSpec = match spec_value {
        Value::Null => HardwareSpec::default(),
        ref v @ Value::Object(_) => serde_path_to_error::deserialize(v).map_err(|e| {
            let path = e.path().to_string();
            let field = if path == "." {
                "spec".to_string()
            } else {
                format!("spec.{path}")
            };
            FieldError::new(field, e.into_inner().to_string())
        })?,
        _ => return Err(FieldError::new("spec", "must be a mapping")),
    };

    let mut macs = Vec::new();
    let mut ips = Vec::new();
    for (i, iface) in spec.interfaces.iter().enumerate() {
        let Some(dhcp) = &iface.dhcp else { continue };
        let at = |f: &str| format!("spec.interfaces[{i}].dhcp.{f}");
        if let Some(m) = dhcp.mac.as_deref() {
            let mac: Mac = m
                .parse()
                .map_err(|e: mac::MacError| FieldError::new(at("mac"), e.to_string()))?;
            if macs.contains(&mac) {
                return Err(FieldError::new(
                    at("mac"),
                    format!("{mac} is used by another interface of this Hardware"),
                ));
            }
            macs.push(mac);
        }
        if let Some(ip) = &dhcp.ip {
            if let Some(a) = non_empty(&ip.address) {
                let addr: IpAddr = a.parse().map_err(|_| {
                    FieldError::new(at("ip.address"), format!("invalid IP address {a:?}"))
                })?;
                if !ips.contains(&addr) {
                    ips.push(addr);
                }
            }
            if let Some(g) = non_empty(&ip.gateway) {
                g.parse::<IpAddr>().map_err(|_| {
                    FieldError::new(at("ip.gateway"), format!("invalid IP address {g:?}"))
                })?;
            }
            if let Some(n) = non_empty(&ip.netmask) {
                check_netmask(n).map_err(|m| FieldError::new(at("ip.netmask"), m))?;
            }
            if let Some(f) = ip.family
                && f != 4
                && f != 6
            {
                return Err(FieldError::new(
                    at("ip.family"),
                    format!("must be 4 or 6, got {f}"),
                ));
            }
        }
        for (j, s) in dhcp.name_servers.iter().enumerate() {
            s.parse::<IpAddr>().map_err(|_| {
                FieldError::new(
                    at(&format!("name_servers[{j}]")),
                    format!("invalid IP address {s:?}"),
                )
            })?;
        }
        for (j, s) in dhcp.time_servers.iter().enumerate() {
            s.parse::<IpAddr>().map_err(|_| {
                FieldError::new(
                    at(&format!("time_servers[{j}]")),
                    format!("invalid IP address {s:?}"),
                )
            })?;
        }
        for (j, r) in dhcp.classless_static_routes.iter().enumerate() {
            let f = at(&format!("classless_static_routes[{j}]"));
            check_cidr4(&r.destination_descriptor)
                .map_err(|m| FieldError::new(format!("{f}.destination_descriptor"), m))?;
            r.router.parse::<Ipv4Addr>().map_err(|_| {
                FieldError::new(
                    format!("{f}.router"),
                    format!("invalid IPv4 address {:?}", r.router),
                )
            })?;
        }
        if let Some(v) = non_empty(&dhcp.vlan_id) {
            check_vlan_ids(v).map_err(|m| FieldError::new(at("vlan_id"), m))?;
        }
        if let Some(t) = dhcp.lease_time
            && t < 0
        {
            return Err(FieldError::new(
                at("lease_time"),
                format!("must not be negative, got {t}"),
            ));
        }
    }

    // Store the normalised MACs in the typed view and the document too, so
    // that what reads back is what the indexes hold.
    let mut spec = spec;
    for d in spec.interfaces.iter_mut().filter_map(|i| i.dhcp.as_mut()) {
        if let Some(mac) = d.mac.as_deref().and_then(|m| m.parse::<Mac>().ok()) {
            d.mac = Some(mac.to_string());
        }
    }
    if let Some(Value::Array(ifaces)) = doc.pointer_mut("/spec/interfaces") {
        for iface in ifaces {
            if let Some(Value::String(m)) = iface.pointer_mut("/dhcp/mac")
                && let Ok(mac) = m.parse::<Mac>()
            {
                *m = mac.to_string();
            }
        }
    }

    Ok(Hardware {
        doc,
        machine: Machine {
            key: Key { namespace, name },
            spec,
            macs,
            ips,
        },
    })
}

fn non_empty(s: &Option<String>) -> Option<&str> {
    s.as_deref().map(str::trim).filter(|s| !s.is_empty())
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

fn check_dns_label(s: &str) -> Result<(), String> {
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

fn check_netmask(s: &str) -> Result<(), String> {
    let m: Ipv4Addr = s.parse().map_err(|_| format!("invalid netmask {s:?}"))?;
    let bits = u32::from(m);
    if bits.leading_ones() + bits.trailing_zeros() != 32 {
        return Err(format!("netmask {s:?} is not contiguous"));
    }
    Ok(())
}

fn check_cidr4(s: &str) -> Result<(), String> {
    let err = || format!("invalid IPv4 CIDR {s:?} (want a.b.c.d/n)");
    let (a, n) = s.split_once('/').ok_or_else(err)?;
    a.parse::<Ipv4Addr>().map_err(|_| err())?;
    let n: u8 = n.parse().map_err(|_| err())?;
    if n > 32 {
        return Err(err());
    }
    Ok(())
}

fn check_vlan_ids(s: &str) -> Result<(), String> {
    for part in s.split(',') {
        let v: u16 = part
            .trim()
            .parse()
            .map_err(|_| format!("invalid VLAN id {part:?} in {s:?}"))?;
        if v > 4096 {
            return Err(format!("VLAN id {v} out of range 0-4096"));
        }
    }
    Ok(())
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
        assert_eq!(h.machine.macs[0].to_string(), "52:54:00:aa:bb:cc");
        assert_eq!(
            h.doc["spec"]["interfaces"][0]["dhcp"]["mac"],
            "52:54:00:aa:bb:cc"
        );
        assert_eq!(h.doc["metadata"]["namespace"], "default");
        assert_eq!(h.machine.ips, vec!["10.0.0.5".parse::<IpAddr>().unwrap()]);
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
        assert!(
            h.machine.spec.interfaces[0]
                .dhcp
                .as_ref()
                .unwrap()
                .name_servers
                .is_empty()
        );
    }

    #[test]
    fn documents_lists_and_streams() {
        let text = "- apiVersion: a\n  kind: Hardware\n- kind: Hardware\n---\nkind: HardwareList\nitems:\n- {kind: Hardware}\n---\n";
        let docs = parse_documents(text).unwrap();
        assert_eq!(docs.len(), 3);
        assert!(
            parse_documents("a: [unclosed")
                .unwrap_err()
                .message
                .contains("malformed")
        );
        assert_eq!(
            parse_documents("{\"kind\": \"Hardware\"}").unwrap().len(),
            1
        );
    }
}
