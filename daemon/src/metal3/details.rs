//! The inspection's report (BMO's `HardwareDetails`, as tinkerbox-agent's
//! `inspect` action sends it): checked and bounded before it is kept, and
//! the root device chosen from it by `rootDeviceHints`.

use super::model::RootDeviceHints;
use serde::Deserialize;
use serde_json::Value;

/// A report larger than this is refused (a real one is a few KiB).
pub const REPORT_MAX_BYTES: usize = 256 << 10;

/// One disk of the report: what the hints look at.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Disk {
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub alternate_names: Vec<String>,
    #[serde(default)]
    pub rotational: bool,
    #[serde(default)]
    pub size_bytes: u64,
    #[serde(default)]
    pub vendor: String,
    #[serde(default)]
    pub model: String,
    #[serde(default)]
    pub serial_number: String,
    #[serde(default)]
    pub wwn: String,
    #[serde(default)]
    pub wwn_with_extension: String,
    #[serde(default)]
    pub wwn_vendor_extension: String,
    #[serde(default)]
    pub hctl: String,
}

/// The disks of a report (`status.hardware`), those that read.
pub fn storage(hardware: &Value) -> Vec<Disk> {
    hardware
        .get("storage")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|d| serde_json::from_value(d.clone()).ok())
                .collect()
        })
        .unwrap_or_default()
}

/// A report as it arrived: a JSON object in BMO's shape. What the CRD's
/// schema would prune (unknown fields) is dropped here so that the status
/// tinkerbox serves is the one the cluster keeps; wrong types are refused.
pub fn check_report(body: &[u8]) -> Result<Value, String> {
    if body.len() > REPORT_MAX_BYTES {
        return Err(format!(
            "the report is {} bytes, more than {REPORT_MAX_BYTES}",
            body.len()
        ));
    }
    let v: Value =
        serde_json::from_slice(body).map_err(|e| format!("the report is not JSON: {e}"))?;
    let mut out = v;
    prune(&mut out, &HARDWARE_SCHEMA, "hardware")?;
    if !out.is_object() {
        return Err("the report must be a JSON object".into());
    }
    Ok(out)
}

/// `status.hardware`'s schema in the embedded BareMetalHost CRD (a unit
/// test checks it is found).
static HARDWARE_SCHEMA: std::sync::LazyLock<Value> = std::sync::LazyLock::new(|| {
    let crd: Value = serde_saphyr::from_str(super::CRD_BAREMETALHOSTS).unwrap_or_default();
    crd.pointer("/spec/versions/0/schema/openAPIV3Schema/properties/status/properties/hardware")
        .cloned()
        .unwrap_or_default()
});

/// Keep what `schema` (an OpenAPI v3 schema) allows, refuse what has the
/// wrong type, as the API server would.
fn prune(v: &mut Value, schema: &Value, at: &str) -> Result<(), String> {
    let ty = schema.get("type").and_then(Value::as_str).unwrap_or("");
    match (ty, &mut *v) {
        ("object", Value::Object(m)) => {
            let props = schema.get("properties").and_then(Value::as_object);
            m.retain(|k, _| props.is_some_and(|p| p.contains_key(k)));
            for (k, child) in m.iter_mut() {
                if let Some(s) = props.and_then(|p| p.get(k)) {
                    prune(child, s, &format!("{at}.{k}"))?;
                }
            }
            Ok(())
        }
        ("array", Value::Array(a)) => {
            if a.len() > 1024 {
                return Err(format!("{at}: more than 1024 items"));
            }
            let items = schema.get("items").cloned().unwrap_or_default();
            for (i, child) in a.iter_mut().enumerate() {
                prune(child, &items, &format!("{at}[{i}]"))?;
            }
            Ok(())
        }
        ("string", Value::String(s)) => {
            if s.len() > 4096 {
                return Err(format!("{at}: a string of more than 4096 bytes"));
            }
            if let Some(e) = schema.get("enum").and_then(Value::as_array)
                && !e.iter().any(|x| x.as_str() == Some(s.as_str()))
            {
                return Err(format!(
                    "{at}: {s:?} is not one of {}",
                    Value::Array(e.clone())
                ));
            }
            Ok(())
        }
        ("integer", Value::Number(n)) if n.is_i64() || n.is_u64() => Ok(()),
        ("number", Value::Number(_)) | ("boolean", Value::Bool(_)) => Ok(()),
        ("", _) => Ok(()),
        (t, other) => Err(format!("{at}: want {t}, got {other}")),
    }
}

/// The disk to install onto, by name: among the disks matching every hint
/// given, the first; with no hints, the smallest of at least 4 GiB (what
/// Ironic's agent does).
pub fn root_device(disks: &[Disk], hints: &RootDeviceHints) -> Result<String, String> {
    if disks.is_empty() {
        return Err("the inspection found no disk to install onto".into());
    }
    if *hints == RootDeviceHints::default() {
        return disks
            .iter()
            .filter(|d| d.size_bytes >= 4 << 30)
            .min_by_key(|d| d.size_bytes)
            .map(|d| d.name.clone())
            .ok_or_else(|| "no disk of 4 GiB or more was found".into());
    }
    disks
        .iter()
        .find(|d| matches(d, hints))
        .map(|d| d.name.clone())
        .ok_or_else(|| {
            format!(
                "No suitable device was found for deployment using these hints {}",
                serde_json::to_string(hints).unwrap_or_default()
            )
        })
}

fn matches(d: &Disk, h: &RootDeviceHints) -> bool {
    let exact = |want: &Option<String>, have: &str| want.as_ref().is_none_or(|w| w == have);
    let within = |want: &Option<String>, have: &str| {
        want.as_ref()
            .is_none_or(|w| have.to_lowercase().contains(&w.to_lowercase()))
    };
    h.device_name
        .as_ref()
        .is_none_or(|n| *n == d.name || d.alternate_names.iter().any(|a| a == n))
        && exact(&h.hctl, &d.hctl)
        && within(&h.model, &d.model)
        && within(&h.vendor, &d.vendor)
        && exact(&h.serial_number, &d.serial_number)
        && exact(&h.wwn, &d.wwn)
        && exact(&h.wwn_with_extension, &d.wwn_with_extension)
        && exact(&h.wwn_vendor_extension, &d.wwn_vendor_extension)
        && h.rotational.is_none_or(|r| r == d.rotational)
        && h.min_size_gigabytes
            .is_none_or(|g| d.size_bytes >= g.saturating_mul(1 << 30))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn disks() -> Vec<Disk> {
        storage(&json!({"storage": [
            {"name": "/dev/disk/by-path/pci-0000:00:05.0", "alternateNames": ["/dev/vda"], "sizeBytes": 8u64 << 30,
             "model": "QEMU HARDDISK", "vendor": "0x1af4", "serialNumber": "S-A", "rotational": true},
            {"name": "/dev/vdb", "sizeBytes": 2u64 << 30, "serialNumber": "S-B", "rotational": false},
            {"name": "/dev/vdc", "sizeBytes": 50u64 << 30, "serialNumber": "S-C", "rotational": false, "hctl": "0:0:0:1"},
        ]}))
    }

    #[test]
    fn without_hints_the_smallest_disk_of_4_gib() {
        assert_eq!(
            root_device(&disks(), &RootDeviceHints::default()).unwrap(),
            "/dev/disk/by-path/pci-0000:00:05.0"
        );
    }

    #[test]
    fn every_hint_must_match() {
        let h = |v: Value| serde_json::from_value::<RootDeviceHints>(v).unwrap();
        let d = disks();
        assert_eq!(
            root_device(&d, &h(json!({"deviceName": "/dev/vda"}))).unwrap(),
            d[0].name
        );
        assert_eq!(
            root_device(&d, &h(json!({"serialNumber": "S-C"}))).unwrap(),
            "/dev/vdc"
        );
        assert_eq!(
            root_device(&d, &h(json!({"rotational": false}))).unwrap(),
            "/dev/vdb"
        );
        assert_eq!(
            root_device(&d, &h(json!({"rotational": false, "minSizeGigabytes": 10}))).unwrap(),
            "/dev/vdc"
        );
        assert_eq!(
            root_device(&d, &h(json!({"model": "harddisk"}))).unwrap(),
            d[0].name
        );
        assert_eq!(
            root_device(&d, &h(json!({"hctl": "0:0:0:1"}))).unwrap(),
            "/dev/vdc"
        );
        let e = root_device(&d, &h(json!({"serialNumber": "nope"}))).unwrap_err();
        assert!(e.starts_with("No suitable device was found"), "{e}");
        assert!(root_device(&[], &RootDeviceHints::default()).is_err());
    }

    #[test]
    fn a_report_is_pruned_to_the_crds_schema() {
        assert_eq!(HARDWARE_SCHEMA["type"], json!("object"));
        let r = check_report(
            br#"{"cpu": {"arch": "x86_64", "count": 2, "clockMegahertz": 2400.5, "extra": 1},
                 "ramMebibytes": 2048, "hostname": "h", "junk": true,
                 "storage": [{"name": "/dev/vda", "sizeBytes": 1024, "type": "HDD", "rotational": true}],
                 "nics": [{"name": "eth0", "mac": "52:54:00:00:00:01", "ip": "10.0.0.2", "speedGbps": 1, "pxe": true}]}"#,
        )
        .unwrap();
        assert!(r.get("junk").is_none());
        assert!(r["cpu"].get("extra").is_none());
        assert_eq!(r["cpu"]["count"], json!(2));
        assert_eq!(r["storage"][0]["type"], json!("HDD"));
        for bad in [
            &br#"{"ramMebibytes": "lots"}"#[..],
            br#"{"storage": [{"type": "TAPE"}]}"#,
            br#"[1, 2]"#,
            br#"not json"#,
        ] {
            assert!(
                check_report(bad).is_err(),
                "{}",
                String::from_utf8_lossy(bad)
            );
        }
        assert!(check_report(&vec![b' '; REPORT_MAX_BYTES + 1]).is_err());
    }
}
