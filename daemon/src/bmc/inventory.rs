//! Out-of-band inventory, pure: what a Redfish BMC says of its system, in
//! the shape Rufio writes to a Hardware's `status.attributes.outOfBand`
//! (tinkerbell's `api/v1alpha1/tinkerbell/hardware.go`, collected there by
//! bmclib's gofish provider). Only what the BMC reports is written; a BMC
//! that answers 404 or 501 for a collection simply has less.

use serde_json::{Map, Value, json};

/// What was read from the BMC, each part as it answered (None: it did not).
#[derive(Debug, Default)]
pub struct Read {
    pub system: Value,
    pub processors: Vec<Value>,
    pub memory: Vec<Value>,
    /// Storage drives, or SimpleStorage devices.
    pub drives: Vec<Value>,
    pub nics: Vec<Value>,
    pub bios: Option<Value>,
}

/// The most members read from one collection (a hostile or broken BMC may
/// list thousands).
pub const MAX_MEMBERS: usize = 64;

fn s(v: &Value, k: &str) -> Option<Value> {
    v.get(k)
        .and_then(Value::as_str)
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| Value::String(s.chars().take(256).collect()))
}

fn n(v: &Value, k: &str) -> Option<Value> {
    v.get(k).and_then(Value::as_u64).map(Value::from)
}

fn obj(pairs: Vec<(&str, Option<Value>)>) -> Value {
    let m: Map<String, Value> = pairs
        .into_iter()
        .filter_map(|(k, v)| Some((k.to_string(), v?)))
        .collect();
    Value::Object(m)
}

fn status(v: &Value) -> Option<Value> {
    let st = v.get("Status")?;
    let o = obj(vec![("health", s(st, "Health")), ("state", s(st, "State"))]);
    (o.as_object().is_some_and(|m| !m.is_empty())).then_some(o)
}

/// Rufio's `outOfBand` attributes from what the BMC answered.
pub fn out_of_band(r: &Read, at: &str) -> Value {
    let sys = &r.system;
    let cpus: Vec<&Value> = r
        .processors
        .iter()
        .filter(|p| {
            p.get("ProcessorType")
                .and_then(Value::as_str)
                .is_none_or(|t| t == "CPU")
        })
        .collect();
    let sockets: Vec<Value> = cpus
        .iter()
        .map(|p| {
            obj(vec![
                ("slot", s(p, "Socket").or_else(|| s(p, "Id"))),
                ("vendor", s(p, "Manufacturer")),
                ("model", s(p, "Model")),
                ("cores", n(p, "TotalCores")),
                ("threads", n(p, "TotalThreads")),
                ("clockSpeedMHz", n(p, "MaxSpeedMHz")),
                ("serialNumber", s(p, "SerialNumber")),
            ])
        })
        .collect();
    let sum = |k: &str| -> Option<Value> {
        let t: u64 = cpus
            .iter()
            .filter_map(|p| p.get(k).and_then(Value::as_u64))
            .fold(0u64, u64::saturating_add);
        (t > 0).then(|| Value::from(t))
    };
    let cores = sum("TotalCores").or_else(|| n(sys.get("ProcessorSummary")?, "CoreCount"));
    let threads =
        sum("TotalThreads").or_else(|| n(sys.get("ProcessorSummary")?, "LogicalProcessorCount"));
    let cpu = obj(vec![
        ("totalCores", cores),
        ("totalThreads", threads),
        (
            "sockets",
            (!sockets.is_empty()).then(|| Value::Array(sockets)),
        ),
    ]);
    let modules: Vec<Value> = r
        .memory
        .iter()
        .filter(|m| m.get("CapacityMiB").and_then(Value::as_u64).unwrap_or(0) > 0)
        .map(|m| {
            obj(vec![
                ("slot", s(m, "DeviceLocator").or_else(|| s(m, "Id"))),
                ("vendor", s(m, "Manufacturer")),
                ("serialNumber", s(m, "SerialNumber")),
                ("partNumber", s(m, "PartNumber")),
                (
                    "sizeBytes",
                    m.get("CapacityMiB")
                        .and_then(Value::as_u64)
                        .and_then(|c| c.checked_mul(1 << 20))
                        .map(Value::from),
                ),
                ("speedMHz", n(m, "OperatingSpeedMhz")),
                ("model", s(m, "MemoryDeviceType")),
            ])
        })
        .collect();
    let module_bytes: u64 = modules
        .iter()
        .filter_map(|m| m.get("sizeBytes").and_then(Value::as_u64))
        .fold(0u64, u64::saturating_add);
    let summary_bytes = sys
        .pointer("/MemorySummary/TotalSystemMemoryGiB")
        .and_then(Value::as_f64)
        .filter(|g| g.is_finite() && *g > 0.0)
        .map(|g| (g * (1u64 << 30) as f64) as u64);
    let total = if module_bytes > 0 {
        Some(module_bytes)
    } else {
        summary_bytes
    };
    let memory = obj(vec![
        ("totalBytes", total.map(Value::from)),
        (
            "modules",
            (!modules.is_empty()).then(|| Value::Array(modules)),
        ),
    ]);
    let drives: Vec<Value> = r
        .drives
        .iter()
        .map(|d| {
            obj(vec![
                ("name", s(d, "Name").or_else(|| s(d, "Id"))),
                ("vendor", s(d, "Manufacturer")),
                ("model", s(d, "Model")),
                ("serialNumber", s(d, "SerialNumber")),
                ("driveType", s(d, "MediaType")),
                ("controllerType", s(d, "Protocol")),
                ("sizeBytes", n(d, "CapacityBytes")),
                ("firmwareVersion", s(d, "Revision")),
                ("status", status(d)),
            ])
        })
        .collect();
    let nics: Vec<Value> = r
        .nics
        .iter()
        .map(|i| {
            let mac = s(i, "MACAddress").or_else(|| s(i, "PermanentMACAddress"));
            obj(vec![
                ("name", s(i, "Name").or_else(|| s(i, "Id"))),
                (
                    "ports",
                    Some(json!([obj(vec![
                        ("portID", s(i, "Id")),
                        (
                            "mac",
                            mac.map(|m| json!(m.as_str().unwrap_or("").to_lowercase()))
                        ),
                        ("speedMbps", n(i, "SpeedMbps")),
                        ("linkStatus", s(i, "LinkStatus")),
                    ])])),
                ),
            ])
        })
        .collect();
    let bios = obj(vec![
        ("firmwareVersion", s(sys, "BiosVersion")),
        (
            "vendor",
            r.bios.as_ref().and_then(|b| {
                s(
                    b.get("Attributes").unwrap_or(&Value::Null),
                    "SystemManufacturer",
                )
            }),
        ),
    ]);
    let product = obj(vec![
        ("name", s(sys, "Model").or_else(|| s(sys, "Name"))),
        ("vendor", s(sys, "Manufacturer")),
        ("model", s(sys, "SKU").or_else(|| s(sys, "PartNumber"))),
        ("serialNumber", s(sys, "SerialNumber")),
        ("status", status(sys)),
    ]);
    let non_empty = |v: Value| (v.as_object().is_some_and(|m| !m.is_empty())).then_some(v);
    obj(vec![
        ("lastUpdated", Some(json!(at))),
        ("collectionMethod", Some(json!("redfish"))),
        ("cpu", non_empty(cpu)),
        ("memory", non_empty(memory)),
        (
            "blockDevices",
            (!drives.is_empty()).then(|| Value::Array(drives)),
        ),
        (
            "networkInterfaces",
            (!nics.is_empty()).then(|| Value::Array(nics)),
        ),
        ("bios", non_empty(bios)),
        ("product", non_empty(product)),
    ])
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A server as DMTF's public mockups and sushy's libvirt driver
    /// describe one.
    #[test]
    fn a_redfish_system_in_rufios_shape() {
        let r = Read {
            system: json!({"Name": "node-1", "Manufacturer": "Contoso", "Model": "3500",
                "SKU": "8675309", "SerialNumber": "437XR1138R2", "BiosVersion": "P79 v1.45",
                "ProcessorSummary": {"Count": 2, "LogicalProcessorCount": 16},
                "MemorySummary": {"TotalSystemMemoryGiB": 96},
                "Status": {"State": "Enabled", "Health": "OK"}}),
            processors: vec![
                json!({"Id": "CPU1", "Socket": "CPU 1", "ProcessorType": "CPU", "Manufacturer": "Intel(R) Corporation",
                    "Model": "Multi-Core Intel(R) Xeon(R) processor 7xxx Series", "MaxSpeedMHz": 3700,
                    "TotalCores": 8, "TotalThreads": 16, "Status": {"State": "Enabled", "Health": "OK"}}),
                json!({"Id": "FPGA1", "ProcessorType": "GPU", "TotalCores": 1000}),
            ],
            memory: vec![
                json!({"Id": "DIMM1", "DeviceLocator": "PROC 1 DIMM 1", "CapacityMiB": 32768,
                    "Manufacturer": "Contoso", "PartNumber": "M393A2K43BB1-CRC", "OperatingSpeedMhz": 2400}),
                json!({"Id": "DIMM2", "CapacityMiB": 0}),
            ],
            drives: vec![
                json!({"Id": "1", "Name": "Drive 1", "Model": "3000GT8", "CapacityBytes": 899527000000u64,
                    "MediaType": "HDD", "Protocol": "SAS", "Revision": "100A", "SerialNumber": "72D0A037FRD26"}),
            ],
            nics: vec![
                json!({"Id": "1", "Name": "Ethernet interface 1", "MACAddress": "12:44:6A:3B:04:11",
                    "SpeedMbps": 1000, "LinkStatus": "LinkUp"}),
            ],
            bios: None,
        };
        let o = out_of_band(&r, "2026-11-26T16:00:00Z");
        assert_eq!(o["collectionMethod"], "redfish");
        assert_eq!(o["lastUpdated"], "2026-11-26T16:00:00Z");
        assert_eq!(o["cpu"]["totalCores"], 8, "the GPU is not a CPU");
        assert_eq!(o["cpu"]["totalThreads"], 16);
        assert_eq!(o["cpu"]["sockets"][0]["slot"], "CPU 1");
        assert_eq!(o["cpu"]["sockets"][0]["clockSpeedMHz"], 3700);
        assert_eq!(o["memory"]["totalBytes"], 32u64 << 30);
        assert_eq!(o["memory"]["modules"].as_array().unwrap().len(), 1);
        assert_eq!(o["memory"]["modules"][0]["slot"], "PROC 1 DIMM 1");
        assert_eq!(o["blockDevices"][0]["sizeBytes"], 899527000000u64);
        assert_eq!(o["blockDevices"][0]["driveType"], "HDD");
        assert_eq!(
            o["networkInterfaces"][0]["ports"][0]["mac"],
            "12:44:6a:3b:04:11"
        );
        assert_eq!(o["bios"]["firmwareVersion"], "P79 v1.45");
        assert_eq!(o["product"]["vendor"], "Contoso");
        assert_eq!(o["product"]["serialNumber"], "437XR1138R2");
        assert_eq!(o["product"]["status"]["health"], "OK");
    }

    /// Every field written is one the Hardware CRD's schema has (the API
    /// server would prune the others without a word).
    #[test]
    fn every_field_is_in_the_crds_schema() {
        let crd = crate::kube::crds::embedded()
            .unwrap()
            .into_iter()
            .find(|c| c.name == "hardware.tinkerbell.org")
            .unwrap();
        let schema = &crd.doc["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["status"]
            ["properties"]["attributes"]["properties"]["outOfBand"];
        fn walk(v: &Value, schema: &Value, path: &str) {
            match v {
                Value::Object(m) => {
                    for (k, x) in m {
                        let sub = &schema["properties"][k];
                        assert!(sub.is_object(), "{path}.{k} is not in the CRD's schema");
                        walk(x, sub, &format!("{path}.{k}"));
                    }
                }
                Value::Array(a) => a.iter().for_each(|x| walk(x, &schema["items"], path)),
                Value::String(_) => assert_eq!(schema["type"], "string", "{path}"),
                Value::Number(_) => assert_eq!(schema["type"], "integer", "{path}"),
                _ => {}
            }
        }
        let r = Read {
            system: json!({"Name": "n", "Manufacturer": "m", "Model": "x", "SKU": "s", "SerialNumber": "1",
                "BiosVersion": "b", "MemorySummary": {"TotalSystemMemoryGiB": 1}, "Status": {"State": "Enabled", "Health": "OK"}}),
            processors: vec![
                json!({"Socket": "CPU 1", "Manufacturer": "i", "Model": "m", "TotalCores": 2,
                "TotalThreads": 4, "MaxSpeedMHz": 1, "SerialNumber": "s", "Status": {"Health": "OK"}}),
            ],
            memory: vec![
                json!({"DeviceLocator": "A", "CapacityMiB": 1, "Manufacturer": "m", "SerialNumber": "s",
                "PartNumber": "p", "OperatingSpeedMhz": 1, "MemoryDeviceType": "DDR4", "Status": {"Health": "OK"}}),
            ],
            drives: vec![
                json!({"Name": "d", "Manufacturer": "m", "Model": "x", "SerialNumber": "s", "MediaType": "SSD",
                "Protocol": "NVMe", "CapacityBytes": 1, "Revision": "r", "Status": {"Health": "OK", "State": "Enabled"}}),
            ],
            nics: vec![
                json!({"Id": "1", "Name": "n", "MACAddress": "AA:BB:CC:DD:EE:FF", "SpeedMbps": 1, "LinkStatus": "LinkUp"}),
            ],
            bios: Some(json!({"Attributes": {"SystemManufacturer": "v"}})),
        };
        walk(&out_of_band(&r, "t"), schema, "outOfBand");
    }

    /// Numbers a broken or hostile BMC sends do not overflow.
    #[test]
    fn huge_numbers_saturate() {
        let r = Read {
            processors: vec![
                json!({"TotalCores": u64::MAX}),
                json!({"TotalCores": u64::MAX}),
            ],
            memory: vec![
                json!({"CapacityMiB": u64::MAX}),
                json!({"CapacityMiB": 1u64 << 40}),
            ],
            ..Read::default()
        };
        let o = out_of_band(&r, "t");
        assert_eq!(o["cpu"]["totalCores"], u64::MAX);
        assert_eq!(o["memory"]["totalBytes"], 1u64 << 60);
    }

    /// sushy's fake driver: a name, a manufacturer, NICs, nothing else.
    #[test]
    fn a_bmc_that_says_little_gives_little() {
        let r = Read {
            system: json!({"Name": "fake", "Manufacturer": "Sushy Emulator",
                "ProcessorSummary": {"Status": {"State": "Enabled"}}, "MemorySummary": {}}),
            ..Read::default()
        };
        let o = out_of_band(&r, "t");
        assert!(o.get("cpu").is_none() && o.get("memory").is_none(), "{o:#}");
        assert_eq!(
            o["product"],
            json!({"name": "fake", "vendor": "Sushy Emulator"})
        );
    }
}
