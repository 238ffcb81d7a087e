//! The Hardware a discovered agent becomes, pure: upstream's fields
//! (tink-server's `discovery.go`: name `discovery-<id>`, label
//! `tinkerbell.org/auto-discovered`, annotation
//! `tinkerbell.org/agent-attributes`, `spec.agentID`, `spec.auto`, disks,
//! interfaces), and what upstream leaves out and a user needs at once: the
//! pool address as the booting interface's reservation, netboot allowed,
//! `metadata.instance`, and labels from the attributes that selectors (and
//! CAPT's `hardwareAffinity`) can use.

use crate::hardware::{self, Hardware, Mac};
use serde_json::{Map, Value, json};
use std::net::Ipv4Addr;

/// Upstream's marker label on discovered Hardware.
pub const DISCOVERED_LABEL: &str = "tinkerbell.org/auto-discovered";
/// Where upstream keeps the agent's attributes (JSON), on Hardware and on
/// enrollment Workflows.
pub const ATTRIBUTES_ANNOTATION: &str = "tinkerbell.org/agent-attributes";
/// Upstream's limit on that annotation: larger attributes are not kept.
pub const ATTRIBUTES_MAX: usize = 64 * 1024;
/// Prefix of the labels tinkerbox derives from the attributes.
pub const LABEL_PREFIX: &str = "tinkerbox.io/";
/// The most interfaces and disks taken from one agent's attributes.
const MAX_INTERFACES: usize = 32;
const MAX_DISKS: usize = 64;

/// The pool address a machine holds, made its reservation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reservation {
    pub mac: Mac,
    pub ip: Ipv4Addr,
    pub netmask: Ipv4Addr,
    pub gateway: Option<Ipv4Addr>,
    pub dns: Vec<Ipv4Addr>,
    pub lease_seconds: u32,
}

/// What the discovered Hardware is made from.
pub struct Found<'a> {
    pub agent_id: &'a str,
    /// The attributes in upstream's JSON shape (`grpc::attributes_json`).
    pub attributes: &'a Value,
    pub namespace: &'a str,
    /// `spec.auto.enrollmentEnabled`.
    pub enroll: bool,
    pub reservation: Option<Reservation>,
    /// MACs other Hardware has: their interfaces are left out.
    pub taken: &'a dyn Fn(&Mac) -> bool,
}

/// Upstream's `makeValidName`: `prefix` + the id made a DNS label
/// (lowercase alphanumerics and '-', alphanumeric at both ends, at most
/// 63 characters). `de:ad:be:ef:00:00` → `discovery-de-ad-be-ef-00-00`.
pub fn valid_name(id: &str, prefix: &str) -> String {
    let mut s = String::with_capacity(prefix.len() + id.len());
    s.push_str(prefix);
    for c in id.trim().chars() {
        let c = if c.is_ascii_alphanumeric() {
            c.to_ascii_lowercase()
        } else {
            '-'
        };
        if !(c == '-' && s.ends_with('-')) {
            s.push(c);
        }
    }
    let mut s = s.trim_matches('-').to_string();
    s.truncate(63);
    let s = s.trim_end_matches('-').to_string();
    if s.is_empty() { "e".into() } else { s }
}

/// A label value: Kubernetes' rule (at most 63 of `[A-Za-z0-9-_.]`,
/// alphanumeric at both ends); runs of anything else become one '-'.
/// Empty when nothing is left.
pub fn label_value(v: &str) -> String {
    let mut s = String::with_capacity(v.len().min(63));
    for c in v.trim().chars() {
        let ok = c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.');
        let c = if ok { c } else { '-' };
        if !(c == '-' && s.ends_with('-')) {
            s.push(c);
        }
    }
    let trim = |s: &str| {
        s.trim_matches(|c: char| !c.is_ascii_alphanumeric())
            .to_string()
    };
    let mut s = trim(&s);
    s.truncate(63);
    trim(&s)
}

/// `"16GB"` (tink-agent's sizes: 1024-based units, rounded up) in GiB,
/// rounded up.
pub fn gib(human: &str) -> Option<u64> {
    let h = human.trim();
    let digits = h.find(|c: char| !c.is_ascii_digit()).unwrap_or(h.len());
    let n: u64 = h.get(..digits)?.parse().ok()?;
    let shift = match h.get(digits..)?.trim() {
        "B" => 0,
        "KB" => 10,
        "MB" => 20,
        "GB" => 30,
        "TB" => 40,
        "PB" => 50,
        _ => return None,
    };
    let bytes = n.checked_mul(1u64 << shift)?;
    Some(bytes.div_ceil(1 << 30))
}

fn text<'a>(v: &'a Value, path: &str) -> Option<&'a str> {
    v.pointer(path)
        .and_then(Value::as_str)
        .map(str::trim)
        .filter(|s| !s.is_empty() && *s != "unknown")
}

/// The labels tinkerbox derives from an agent's attributes.
pub fn labels(attrs: &Value) -> Map<String, Value> {
    let mut out = Map::new();
    let mut put = |k: &str, v: Option<String>| {
        if let Some(v) = v.map(|v| label_value(&v)).filter(|v| !v.is_empty()) {
            out.insert(format!("{LABEL_PREFIX}{k}"), Value::String(v));
        }
    };
    let vendor = text(attrs, "/product/vendor")
        .or_else(|| text(attrs, "/baseboard/vendor"))
        .or_else(|| text(attrs, "/chassis/vendor"));
    put("vendor", vendor.map(str::to_string));
    let product = text(attrs, "/product/name").or_else(|| text(attrs, "/baseboard/product"));
    put("product", product.map(str::to_string));
    put(
        "cpu-cores",
        attrs
            .pointer("/cpu/totalCores")
            .and_then(Value::as_u64)
            .map(|n| n.to_string()),
    );
    put(
        "cpu-threads",
        attrs
            .pointer("/cpu/totalThreads")
            .and_then(Value::as_u64)
            .map(|n| n.to_string()),
    );
    let memory = text(attrs, "/memory/total").or_else(|| text(attrs, "/memory/usable"));
    put("memory-gib", memory.and_then(gib).map(|n| n.to_string()));
    let disks: Vec<u64> = attrs
        .get("blockDevices")
        .and_then(Value::as_array)
        .map(|b| {
            b.iter()
                .filter_map(|d| d.get("size").and_then(Value::as_str).and_then(gib))
                .collect()
        })
        .unwrap_or_default();
    if !disks.is_empty() {
        put("disks", Some(disks.len().to_string()));
        put("disk-gib", disks.iter().max().map(|n| n.to_string()));
    }
    let nics = attrs
        .get("networkInterfaces")
        .and_then(Value::as_array)
        .map(|n| n.iter().filter(|n| nic_mac(n).is_some()).count())
        .unwrap_or(0);
    if nics > 0 {
        put("nics", Some(nics.to_string()));
    }
    out
}

fn nic_mac(n: &Value) -> Option<Mac> {
    n.get("mac")?.as_str()?.parse().ok()
}

/// The Hardware document for a discovered agent, checked as any applied
/// Hardware is.
pub fn document(f: &Found) -> Result<Hardware, hardware::FieldError> {
    let name = valid_name(f.agent_id, "discovery-");
    let mut labels = labels(f.attributes);
    labels.insert(DISCOVERED_LABEL.into(), json!("true"));
    let mut annotations = Map::new();
    let attrs = f.attributes.to_string();
    if attrs.len() <= ATTRIBUTES_MAX {
        annotations.insert(ATTRIBUTES_ANNOTATION.into(), Value::String(attrs));
    }
    // Interfaces: the one holding the pool address first (CAPT and the
    // metadata service read the first), then the agent's other NICs.
    let mut macs: Vec<Mac> = vec![];
    if let Some(r) = &f.reservation {
        macs.push(r.mac);
    }
    if let Ok(m) = f.agent_id.parse::<Mac>() {
        macs.push(m);
    }
    if let Some(nics) = f
        .attributes
        .get("networkInterfaces")
        .and_then(Value::as_array)
    {
        macs.extend(nics.iter().filter_map(nic_mac));
    }
    let mut seen = std::collections::HashSet::new();
    macs.retain(|m| seen.insert(*m) && !(f.taken)(m) && *m != Mac([0; 6]));
    macs.truncate(MAX_INTERFACES);
    let interfaces: Vec<Value> = macs
        .iter()
        .map(|mac| {
            let mut dhcp = json!({"mac": mac.to_string()});
            if let Some(r) = f.reservation.as_ref().filter(|r| r.mac == *mac) {
                let mut ip = json!({"address": r.ip.to_string(), "netmask": r.netmask.to_string()});
                if let Some(g) = r.gateway {
                    ip["gateway"] = json!(g.to_string());
                }
                dhcp["ip"] = ip;
                dhcp["hostname"] = json!(name);
                dhcp["lease_time"] = json!(r.lease_seconds);
                if !r.dns.is_empty() {
                    dhcp["name_servers"] =
                        json!(r.dns.iter().map(|d| d.to_string()).collect::<Vec<_>>());
                }
            }
            json!({"dhcp": dhcp, "netboot": {"allowPXE": true, "allowWorkflow": true}})
        })
        .collect();
    let disks: Vec<Value> = f
        .attributes
        .get("blockDevices")
        .and_then(Value::as_array)
        .map(|b| {
            b.iter()
                .filter(|d| text(d, "/size").is_some())
                .filter_map(|d| text(d, "/name"))
                // ghw names devices ("vda"); a path is taken as one too.
                .map(|n| n.strip_prefix("/dev/").unwrap_or(n))
                .filter(|n| {
                    n.bytes()
                        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_'))
                })
                .take(MAX_DISKS)
                .map(|n| json!({"device": format!("/dev/{n}")}))
                .collect()
        })
        .unwrap_or_default();
    let mut spec = json!({
        "agentID": f.agent_id,
        "auto": {"enrollmentEnabled": f.enroll},
        "interfaces": interfaces,
        "metadata": {"instance": {"id": name, "hostname": name}},
    });
    if !disks.is_empty() {
        spec["disks"] = Value::Array(disks);
    }
    let mut meta = json!({"name": name, "namespace": f.namespace, "labels": labels});
    if !annotations.is_empty() {
        meta["annotations"] = Value::Object(annotations);
    }
    hardware::validate(json!({
        "apiVersion": hardware::API_VERSION,
        "kind": "Hardware",
        "metadata": meta,
        "spec": spec,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What our agent sends from a small QEMU machine.
    fn qemu() -> Value {
        json!({
            "cpu": {"totalCores": 2, "totalThreads": 2},
            "memory": {"total": "2GB", "usable": "2GB"},
            "blockDevices": [
                {"name": "vda", "size": "8GB", "driveType": "HDD"},
                {"name": "sr0", "size": ""},
                {"name": "vdb", "size": "20GB"}],
            "networkInterfaces": [
                {"name": "eth0", "mac": "52:54:00:aa:bb:01"},
                {"name": "lo", "mac": ""},
                {"name": "eth1", "mac": "52:54:00:aa:bb:02"}],
            "product": {"name": "Standard PC (Q35 + ICH9, 2009)", "vendor": "QEMU"},
            "bios": {"vendor": "SeaBIOS"}
        })
    }

    #[test]
    fn names_as_upstream_makes_them() {
        assert_eq!(
            valid_name("de:ad:be:ef:00:00", "discovery-"),
            "discovery-de-ad-be-ef-00-00"
        );
        assert_eq!(
            valid_name(" Node_7.rack ", "enrollment-"),
            "enrollment-node-7-rack"
        );
        assert_eq!(valid_name(&"x".repeat(100), "discovery-").len(), 63);
        assert_eq!(valid_name("--", "-"), "e");
        hardware::check_dns_label(&valid_name("a:-:b--", "discovery-")).unwrap();
    }

    #[test]
    fn label_values_follow_kubernetes_rules() {
        assert_eq!(
            label_value("Standard PC (Q35 + ICH9, 2009)"),
            "Standard-PC-Q35-ICH9-2009"
        );
        assert_eq!(label_value("  Intel(R) Corp.  "), "Intel-R-Corp");
        assert_eq!(label_value("()"), "");
        let long = label_value(&format!("{}-x", "a".repeat(62)));
        assert_eq!(long, "a".repeat(62), "no trailing '-' after the cut");
    }

    #[test]
    fn sizes_in_gib() {
        assert_eq!(gib("16GB"), Some(16));
        assert_eq!(gib("512MB"), Some(1));
        assert_eq!(gib("2TB"), Some(2048));
        assert_eq!(gib("unknown"), None);
        assert_eq!(gib("99999999999999EB"), None);
    }

    #[test]
    fn a_discovered_machine_is_usable_at_once() {
        let reservation = Reservation {
            mac: "52:54:00:aa:bb:01".parse().unwrap(),
            ip: Ipv4Addr::new(10, 0, 0, 150),
            netmask: Ipv4Addr::new(255, 255, 255, 0),
            gateway: Some(Ipv4Addr::new(10, 0, 0, 1)),
            dns: vec![Ipv4Addr::new(10, 0, 0, 1)],
            lease_seconds: 3600,
        };
        let attrs = qemu();
        let hw = document(&Found {
            agent_id: "52:54:00:aa:bb:01",
            attributes: &attrs,
            namespace: "default",
            enroll: true,
            reservation: Some(reservation),
            taken: &|_| false,
        })
        .unwrap();
        let d = &hw.doc;
        assert_eq!(d["metadata"]["name"], "discovery-52-54-00-aa-bb-01");
        let l = &d["metadata"]["labels"];
        assert_eq!(l[DISCOVERED_LABEL], "true");
        assert_eq!(l["tinkerbox.io/vendor"], "QEMU");
        assert_eq!(l["tinkerbox.io/product"], "Standard-PC-Q35-ICH9-2009");
        assert_eq!(l["tinkerbox.io/cpu-cores"], "2");
        assert_eq!(l["tinkerbox.io/memory-gib"], "2");
        assert_eq!(l["tinkerbox.io/disks"], "2");
        assert_eq!(l["tinkerbox.io/disk-gib"], "20");
        assert_eq!(l["tinkerbox.io/nics"], "2");
        let kept: Value = serde_json::from_str(
            d["metadata"]["annotations"][ATTRIBUTES_ANNOTATION]
                .as_str()
                .unwrap(),
        )
        .unwrap();
        assert_eq!(kept, attrs);
        assert_eq!(d["spec"]["agentID"], "52:54:00:aa:bb:01");
        assert_eq!(d["spec"]["auto"]["enrollmentEnabled"], true);
        assert_eq!(
            d["spec"]["disks"],
            json!([{"device": "/dev/vda"}, {"device": "/dev/vdb"}])
        );
        let i0 = &d["spec"]["interfaces"][0];
        assert_eq!(i0["dhcp"]["mac"], "52:54:00:aa:bb:01");
        assert_eq!(i0["dhcp"]["ip"]["address"], "10.0.0.150");
        assert_eq!(i0["dhcp"]["ip"]["gateway"], "10.0.0.1");
        assert_eq!(i0["dhcp"]["name_servers"], json!(["10.0.0.1"]));
        assert_eq!(i0["netboot"]["allowPXE"], true);
        assert_eq!(
            d["spec"]["interfaces"][1]["dhcp"]["mac"],
            "52:54:00:aa:bb:02"
        );
        assert!(d["spec"]["interfaces"][1]["dhcp"].get("ip").is_none());
        assert_eq!(
            d["spec"]["metadata"]["instance"]["hostname"],
            "discovery-52-54-00-aa-bb-01"
        );
        // The typed view reads what DHCP and metadata need.
        let (i, m) = (&hw.machine.interfaces[0], &hw.machine);
        assert_eq!(i.ipv4(), Some(Ipv4Addr::new(10, 0, 0, 150)));
        assert_eq!(m.agent_id.as_deref(), Some("52:54:00:aa:bb:01"));
    }

    #[test]
    fn hostile_attributes_make_a_bounded_valid_document() {
        let nics: Vec<Value> = (0..500u32)
            .map(|i| json!({"mac": format!("02:00:00:00:{:02x}:{:02x}", i >> 8, i & 0xff)}))
            .collect();
        let attrs = json!({
            "networkInterfaces": nics,
            "blockDevices": [{"name": "../etc/passwd", "size": "1GB"}, {"name": "/dev/sda", "size": "1GB"}],
            "product": {"vendor": "\u{202e}evil\"vendor", "name": "x".repeat(10_000)},
            "pad": "y".repeat(70_000),
        });
        let taken_mac: Mac = "02:00:00:00:00:00".parse().unwrap();
        let hw = document(&Found {
            agent_id: "not a mac!",
            attributes: &attrs,
            namespace: "default",
            enroll: false,
            reservation: None,
            taken: &|m| *m == taken_mac,
        })
        .unwrap();
        let d = &hw.doc;
        assert_eq!(d["metadata"]["name"], "discovery-not-a-mac");
        let ifaces = d["spec"]["interfaces"].as_array().unwrap();
        assert_eq!(ifaces.len(), MAX_INTERFACES);
        assert_ne!(
            ifaces[0]["dhcp"]["mac"], "02:00:00:00:00:00",
            "taken MAC left out"
        );
        assert_eq!(d["spec"]["disks"], json!([{"device": "/dev/sda"}]));
        assert!(
            d["metadata"].get("annotations").is_none(),
            "attributes over 64 KiB are not kept"
        );
        assert_eq!(
            d["metadata"]["labels"]["tinkerbox.io/vendor"],
            "evil-vendor"
        );
        assert_eq!(
            d["metadata"]["labels"]["tinkerbox.io/product"]
                .as_str()
                .unwrap()
                .len(),
            63
        );
    }
}
