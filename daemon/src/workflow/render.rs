//! Rendering a Template for one Workflow, as tink-controller does:
//! Go `text/template` (gotmpl, a port of it) with `missingkey=error`, the
//! functions of [`super::funcs`], output capped at 256 KiB while it is
//! written, then parsed and checked ([`super::template::parse`]).
//!
//! The data: every `hardwareMap` entry at the top level (`{{.device_1}}`),
//! `hardware` (the Hardware document as stored, so fields go by their JSON
//! names: `{{.hardware.spec.metadata.instance.id}}`), `references` (empty:
//! there is no cluster to read references from), and the legacy
//! `Hardware` (`Disks`, `Interfaces`, `UserData`, `Metadata`, `VendorData`,
//! fields by their Go names: `{{index .Hardware.Disks 0}}`).

use super::template::{self, Document, MAX_RENDERED};
use gotmpl::{MissingKey, Template, Value};
use serde_json::Value as Json;
use std::collections::BTreeMap;
use std::sync::Arc;

/// Why a Template did not render; the text goes into the Workflow's
/// `TemplateRenderedSuccess` condition.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum RenderError {
    #[error("template does not parse: {0}")]
    Parse(String),
    #[error("template does not render: {0}")]
    Execute(String),
    #[error("rendered template exceeds {MAX_RENDERED} bytes")]
    TooLarge,
    #[error("{0}")]
    Invalid(String),
}

/// Render `data` (a Template's `spec.data`) for `hardware` (the Hardware
/// document as stored, if the Workflow names one) and the Workflow's
/// `hardwareMap`.
pub fn render(
    data: &str,
    hardware: Option<&Json>,
    hardware_map: &BTreeMap<String, String>,
) -> Result<Document, RenderError> {
    let text = execute(data, hardware, hardware_map)?;
    template::parse(&text).map_err(RenderError::Invalid)
}

/// The rendered text, before it is parsed.
pub fn execute(
    data: &str,
    hardware: Option<&Json>,
    hardware_map: &BTreeMap<String, String>,
) -> Result<String, RenderError> {
    run("workflow-template", data, &input(hardware, hardware_map))
}

/// A customboot `virtualMediaAction.mediaURL`, rendered as tink-controller
/// does: the data is `{Hardware: <the Hardware's spec>}` with Go field
/// names (`{{ .Hardware.Metadata.Instance.ID }}`).
pub fn action_text(text: &str, hardware: &Json) -> Result<String, RenderError> {
    let spec = hardware
        .get("spec")
        .map_or_else(|| Value::from(BTreeMap::<String, Value>::new()), go_names);
    let data = Value::from(BTreeMap::from([("Hardware".to_string(), spec)]));
    run("action", text, &data)
}

fn run(name: &str, data: &str, input: &Value) -> Result<String, RenderError> {
    let t = Template::new(name)
        .missing_key(MissingKey::Error)
        // A bound on loops besides the output cap: `range` over a huge
        // list that writes nothing would otherwise spin.
        .max_range_iters(100_000)
        .funcs(super::funcs::map())
        .parse(data)
        .map_err(|e| RenderError::Parse(e.to_string()))?;
    let mut out = Capped::default();
    if let Err(e) = t.execute_fmt(&mut out, input) {
        return Err(if out.over {
            RenderError::TooLarge
        } else {
            RenderError::Execute(e.to_string())
        });
    }
    Ok(out.out)
}

/// A writer that fails once the output would pass the cap.
#[derive(Default)]
struct Capped {
    out: String,
    over: bool,
}

impl std::fmt::Write for Capped {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        if self.out.len() + s.len() > MAX_RENDERED {
            self.over = true;
            return Err(std::fmt::Error);
        }
        self.out.push_str(s);
        Ok(())
    }
}

fn input(hardware: Option<&Json>, hardware_map: &BTreeMap<String, String>) -> Value {
    let mut top: BTreeMap<String, Value> = hardware_map
        .iter()
        .map(|(k, v)| (k.clone(), Value::String(Arc::from(v.as_str()))))
        .collect();
    let empty = Json::Object(Default::default());
    let hw = hardware.unwrap_or(&empty);
    // The Hardware as tink-controller's structToMap makes it: a JSON
    // round trip, so numbers are float64.
    top.insert("hardware".into(), super::funcs::from_json(hw));
    top.insert(
        "references".into(),
        Value::from(BTreeMap::<String, Value>::new()),
    );
    top.insert("Hardware".into(), legacy(hw));
    Value::from(top)
}

/// tink-controller's `templateHardwareData`: a Go struct, so its fields
/// are always there (zero when unset) and go by their Go names.
fn legacy(hw: &Json) -> Value {
    let spec = hw.get("spec");
    let field = |k: &str| spec.and_then(|s| s.get(k));
    let disks: Vec<Value> = field("disks")
        .and_then(Json::as_array)
        .map(|d| {
            d.iter()
                .map(|d| {
                    Value::String(Arc::from(
                        d.get("device").and_then(Json::as_str).unwrap_or(""),
                    ))
                })
                .collect()
        })
        .unwrap_or_default();
    let text = |k: &str| Value::String(Arc::from(field(k).and_then(Json::as_str).unwrap_or("")));
    let mut m = BTreeMap::<String, Value>::new();
    m.insert("Disks".into(), Value::List(disks.into()));
    let zeroed = |k: &str| {
        let mut v = field(k).cloned()?;
        zero_fill(&mut v, k);
        Some(v)
    };
    m.insert(
        "Interfaces".into(),
        zeroed("interfaces").map_or(Value::Nil, |v| go_names(&v)),
    );
    m.insert("UserData".into(), text("userData"));
    let mut metadata = zeroed("metadata").unwrap_or_else(|| Json::Object(Default::default()));
    zero_fill(&mut metadata, "metadata");
    m.insert("Metadata".into(), go_names(&metadata));
    m.insert("VendorData".into(), text("vendorData"));
    Value::from(m)
}

/// Go's zero values for the fields of the legacy structs a document may
/// leave out (Go always has them: `{{ .Hardware.Metadata.Instance.Hostname }}`
/// is "" when unset, not an error), by JSON name; null is a nil pointer.
const ZEROS: &[(&str, &[(&str, ZeroKind)])] = &[
    (
        "metadata",
        &[
            ("state", ZeroKind::Str),
            ("bonding_mode", ZeroKind::Int),
            ("manufacturer", ZeroKind::Nil),
            ("instance", ZeroKind::Nil),
            ("custom", ZeroKind::Nil),
            ("facility", ZeroKind::Nil),
        ],
    ),
    (
        "instance",
        &[
            ("id", ZeroKind::Str),
            ("state", ZeroKind::Str),
            ("hostname", ZeroKind::Str),
            ("allow_pxe", ZeroKind::Bool),
            ("rescue", ZeroKind::Bool),
            ("operating_system", ZeroKind::Nil),
            ("always_pxe", ZeroKind::Bool),
            ("ipxe_script_url", ZeroKind::Str),
            ("ips", ZeroKind::Nil),
            ("userdata", ZeroKind::Str),
            ("crypted_root_password", ZeroKind::Str),
            ("tags", ZeroKind::Nil),
            ("storage", ZeroKind::Nil),
            ("ssh_keys", ZeroKind::Nil),
            ("network_ready", ZeroKind::Bool),
        ],
    ),
    (
        "interface",
        &[
            ("netboot", ZeroKind::Nil),
            ("isoboot", ZeroKind::Nil),
            ("dhcp", ZeroKind::Nil),
            ("disableDhcp", ZeroKind::Bool),
        ],
    ),
    (
        "dhcp",
        &[
            ("mac", ZeroKind::Str),
            ("hostname", ZeroKind::Str),
            ("domain_name", ZeroKind::Str),
            ("lease_time", ZeroKind::Int),
            ("name_servers", ZeroKind::Nil),
            ("time_servers", ZeroKind::Nil),
            ("arch", ZeroKind::Str),
            ("uefi", ZeroKind::Bool),
            ("iface_name", ZeroKind::Str),
            ("ip", ZeroKind::Nil),
            ("vlan_id", ZeroKind::Str),
            ("classless_static_routes", ZeroKind::Nil),
            ("tftp_server_name", ZeroKind::Str),
            ("boot_file_name", ZeroKind::Str),
        ],
    ),
    (
        "ip",
        &[
            ("address", ZeroKind::Str),
            ("netmask", ZeroKind::Str),
            ("gateway", ZeroKind::Str),
            ("family", ZeroKind::Int),
        ],
    ),
    (
        "netboot",
        &[
            ("allowPXE", ZeroKind::Nil),
            ("allowWorkflow", ZeroKind::Nil),
            ("ipxe", ZeroKind::Nil),
            ("osie", ZeroKind::Nil),
            ("pxelinux", ZeroKind::Nil),
            ("rpi", ZeroKind::Nil),
        ],
    ),
];

#[derive(Clone, Copy)]
enum ZeroKind {
    Str,
    Int,
    Bool,
    Nil,
}

/// Add the zero value of every absent field of struct `kind` (and of the
/// structs below it), as Go's zero-valued struct fields.
fn zero_fill(v: &mut Json, kind: &str) {
    if kind == "interfaces" {
        if let Json::Array(a) = v {
            a.iter_mut().for_each(|i| zero_fill(i, "interface"));
        }
        return;
    }
    let Json::Object(o) = v else { return };
    if let Some((_, fields)) = ZEROS.iter().find(|(k, _)| *k == kind) {
        for (name, z) in *fields {
            o.entry(*name).or_insert(match z {
                ZeroKind::Str => Json::String(String::new()),
                ZeroKind::Int => Json::from(0),
                ZeroKind::Bool => Json::Bool(false),
                ZeroKind::Nil => Json::Null,
            });
        }
    }
    for (child, child_kind) in [
        ("instance", "instance"),
        ("dhcp", "dhcp"),
        ("ip", "ip"),
        ("netboot", "netboot"),
    ] {
        if let Some(c) = o.get_mut(child) {
            zero_fill(c, child_kind);
        }
    }
}

/// JSON member names of Tinkerbell's Hardware types -> their Go field
/// names (api/v1alpha1/tinkerbell/hardware.go), for the legacy data.
/// Names not listed get their first letter upper-cased.
const GO_NAMES: &[(&str, &str)] = &[
    ("netboot", "Netboot"),
    ("isoboot", "Isoboot"),
    ("dhcp", "DHCP"),
    ("disableDhcp", "DisableDHCP"),
    ("allowPXE", "AllowPXE"),
    ("allowWorkflow", "AllowWorkflow"),
    ("ipxe", "IPXE"),
    ("osie", "OSIE"),
    ("url", "URL"),
    ("baseURL", "BaseURL"),
    ("kernelParams", "KernelParams"),
    ("mac", "MAC"),
    ("domain_name", "DomainName"),
    ("lease_time", "LeaseTime"),
    ("name_servers", "NameServers"),
    ("time_servers", "TimeServers"),
    ("uefi", "UEFI"),
    ("iface_name", "IfaceName"),
    ("ip", "IP"),
    ("vlan_id", "VLANID"),
    ("classless_static_routes", "ClasslessStaticRoutes"),
    ("destination_descriptor", "DestinationDescriptor"),
    ("tftp_server_name", "TFTPServerName"),
    ("boot_file_name", "BootFileName"),
    ("bonding_mode", "BondingMode"),
    ("id", "ID"),
    ("allow_pxe", "AllowPxe"),
    ("operating_system", "OperatingSystem"),
    ("always_pxe", "AlwaysPxe"),
    ("ipxe_script_url", "IpxeScriptURL"),
    ("crypted_root_password", "CryptedRootPassword"),
    ("ssh_keys", "SSHKeys"),
    ("network_ready", "NetworkReady"),
    ("image_tag", "ImageTag"),
    ("os_slug", "OsSlug"),
    ("wipe_table", "WipeTable"),
    ("type_guid", "TypeGUID"),
    ("uid", "UID"),
    ("gid", "GID"),
    (
        "preinstalled_operating_system_version",
        "PreinstalledOperatingSystemVersion",
    ),
    ("private_subnets", "PrivateSubnets"),
    ("plan_slug", "PlanSlug"),
    ("plan_version_slug", "PlanVersionSlug"),
    ("facility_code", "FacilityCode"),
    ("sourceISO", "SourceISO"),
    ("pxelinux", "PXELINUX"),
    ("bmcRef", "BMCRef"),
    ("apiGroup", "APIGroup"),
    ("rpi", "RPI"),
];

fn go_names(j: &Json) -> Value {
    match j {
        Json::Object(o) => Value::from(
            o.iter()
                .map(|(k, v)| {
                    let name = GO_NAMES
                        .iter()
                        .find(|(json, _)| json == k)
                        .map(|(_, go)| (*go).to_string())
                        .unwrap_or_else(|| {
                            let mut c = k.chars();
                            c.next()
                                .map(|f| f.to_uppercase().chain(c).collect())
                                .unwrap_or_default()
                        });
                    (name, go_names(v))
                })
                .collect::<BTreeMap<String, Value>>(),
        ),
        Json::Array(a) => Value::List(a.iter().map(go_names).collect::<Vec<_>>().into()),
        other => gotmpl::to_value(other).unwrap_or(Value::Nil),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn hw() -> Json {
        json!({"apiVersion": "tinkerbell.org/v1alpha1", "kind": "Hardware",
            "metadata": {"name": "sm01", "namespace": "default"},
            "spec": {"disks": [{"device": "/dev/nvme0n1"}],
                "userData": "#cloud-config",
                "metadata": {"instance": {"id": "3c:ec:ef:4c:4f:54", "hostname": "sm01"}},
                "interfaces": [{"dhcp": {"mac": "3c:ec:ef:4c:4f:54", "ip": {"address": "10.0.0.5", "netmask": "255.255.255.0"}},
                    "netboot": {"allowPXE": true}}]}})
    }

    fn map(kv: &[(&str, &str)]) -> BTreeMap<String, String> {
        kv.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    const T: &str = "version: '0.1'\nname: t\nglobal_timeout: 60\ntasks:\n- name: a\n  worker: '{{.device_1}}'\n  actions:\n  - name: x\n    image: bash\n";

    #[test]
    fn every_source_of_data() {
        let src = format!(
            "{T}    environment:\n      D: {{{{ index .Hardware.Disks 0 }}}}\n      P: {{{{ formatPartition (index .Hardware.Disks 0) 3 }}}}\n      I: '{{{{ .hardware.spec.metadata.instance.id }}}}'\n      M: '{{{{ (index .Hardware.Interfaces 0).DHCP.MAC }}}}'\n      N: '{{{{ netmaskToPrefixLength (index .Hardware.Interfaces 0).DHCP.IP.Netmask }}}}'\n      U: '{{{{ .Hardware.UserData }}}}'\n      V: '{{{{ .Hardware.VendorData }}}}'\n      H: '{{{{ .Hardware.Metadata.Instance.Hostname }}}}'\n      R: '{{{{ len .references }}}}'\n"
        );
        let d = render(
            &src,
            Some(&hw()),
            &map(&[("device_1", "3c:ec:ef:4c:4f:54")]),
        )
        .unwrap();
        assert_eq!(d.tasks[0].worker, "3c:ec:ef:4c:4f:54");
        let env = &d.tasks[0].actions[0].environment;
        assert_eq!(env["D"], "/dev/nvme0n1");
        assert_eq!(env["P"], "/dev/nvme0n1p3");
        assert_eq!(env["I"], "3c:ec:ef:4c:4f:54");
        assert_eq!(env["M"], "3c:ec:ef:4c:4f:54");
        assert_eq!(env["N"], "24");
        assert_eq!(env["U"], "#cloud-config");
        assert_eq!(env["V"], "");
        assert_eq!(env["H"], "sm01");
        assert_eq!(env["R"], "0");
    }

    #[test]
    fn customboot_media_urls_see_the_hardware_spec() {
        let h = hw();
        assert_eq!(
            action_text(
                "http://10.0.0.1/{{ .Hardware.Metadata.Instance.ID }}/{{ (index .Hardware.Disks 0).Device }}.iso",
                &h
            )
            .unwrap(),
            "http://10.0.0.1/3c:ec:ef:4c:4f:54//dev/nvme0n1.iso"
        );
        assert_eq!(action_text("http://x/a.iso", &h).unwrap(), "http://x/a.iso");
        let e = action_text("{{ .Hardware.Nope }}", &h).unwrap_err();
        assert!(e.to_string().contains("Nope"), "{e}");
    }

    /// `.hardware` has Go's JSON numbers (float64), `.Hardware` Go's int64
    /// fields. Known gap: gotmpl 0.6 prints floats with Rust's Display (also
    /// for `printf "%v"`), so 1000000 prints `1000000` where Go prints
    /// `1e+06`; below 1e6 (ports, lease times, VLANs) both agree.
    #[test]
    fn numbers_are_go_typed() {
        let h = json!({"spec": {"metadata": {"bonding_mode": 5, "instance": {"id": "x"}},
            "interfaces": [{"dhcp": {"lease_time": 1000000, "mac": "m"}}]}});
        let out = execute(
            "{{ .hardware.spec.metadata.bonding_mode }} {{ (index .hardware.spec.interfaces 0).dhcp.lease_time }} \
             {{ toJson (index .hardware.spec.interfaces 0).dhcp }} {{ .Hardware.Metadata.BondingMode }} \
             {{ (fromYaml \"n: 2500.5\").n }}",
            Some(&h),
            &BTreeMap::new(),
        )
        .unwrap();
        assert_eq!(
            out,
            r#"5 1000000 {"lease_time":1000000,"mac":"m"} 5 2500.5"#
        );
    }

    /// The legacy data is Go structs: unset fields are zero, not missing.
    #[test]
    fn legacy_fields_left_out_are_go_zero_values() {
        let h = json!({"spec": {"metadata": {"instance": {"id": "i-1"}},
            "interfaces": [{"dhcp": {"mac": "m", "ip": {"address": "10.0.0.5"}}}]}});
        let out = execute(
            "[{{ .Hardware.Metadata.Instance.Hostname }}][{{ .Hardware.Metadata.State }}][{{ .Hardware.Metadata.BondingMode }}]\
             [{{ (index .Hardware.Interfaces 0).DHCP.Hostname }}][{{ (index .Hardware.Interfaces 0).DHCP.IP.Gateway }}]\
             [{{ (index .Hardware.Interfaces 0).DisableDHCP }}][{{ (index .Hardware.Interfaces 0).DHCP.LeaseTime }}]\
             [{{ if .Hardware.Metadata.Instance.AlwaysPxe }}x{{ end }}]",
            Some(&h),
            &BTreeMap::new(),
        )
        .unwrap();
        assert_eq!(out, "[][][0][][][false][0][]");
        // `.hardware` stays the document as stored: no field invented.
        assert!(
            execute(
                "{{ .hardware.spec.metadata.state }}",
                Some(&h),
                &BTreeMap::new()
            )
            .is_err()
        );
    }

    #[test]
    fn failures_say_which_and_why() {
        let none = BTreeMap::new();
        // A key the hardwareMap does not have: missingkey=error.
        let e = render(T, Some(&hw()), &none).unwrap_err();
        assert!(
            matches!(&e, RenderError::Execute(m) if m.contains("device_1")),
            "{e}"
        );
        let e = render("{{ .x ", None, &none).unwrap_err();
        assert!(matches!(e, RenderError::Parse(_)), "{e}");
        let e = render("{{ nosuchfunc 1 }}", None, &none).unwrap_err();
        assert!(e.to_string().contains("nosuchfunc"), "{e}");
        let e = render("name: [", None, &none).unwrap_err();
        assert!(
            matches!(&e, RenderError::Invalid(m) if m.contains("not valid YAML")),
            "{e}"
        );
        // Output past the cap stops while it is written: 101 x 3000 bytes.
        let big = "{{ range splitList \",\" (repeat 100 \"a,\") }}{{ repeat 3000 \"x\" }}{{ end }}";
        let e = render(big, None, &none).unwrap_err();
        assert_eq!(e, RenderError::TooLarge);
    }

    /// Every Template of the compatibility corpus renders, with the data a
    /// CAPT Workflow gives it.
    #[test]
    fn the_compat_templates_render() {
        let dir = crate::compat_dir();
        let Ok(entries) = std::fs::read_dir(&dir) else {
            panic!("the compat corpus is missing: {}", dir.display());
        };
        let hw = hw();
        let hm = map(&[("device_1", "3c:ec:ef:4c:4f:54")]);
        let mut n = 0;
        for e in entries {
            let path = e.unwrap().path();
            let name = path.file_name().unwrap().to_string_lossy().to_string();
            if !name.starts_with("template-") {
                continue;
            }
            let doc: Json =
                serde_saphyr::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
            let data = doc["spec"]["data"].as_str().unwrap();
            let d = render(data, Some(&hw), &hm).unwrap_or_else(|e| panic!("{name}: {e}"));
            assert_eq!(d.tasks[0].worker, "3c:ec:ef:4c:4f:54", "{name}");
            // Byte for byte what Go's text/template writes: the text as
            // it is, each action replaced by its value.
            let want = data
                .replace("{{.device_1}}", "3c:ec:ef:4c:4f:54")
                .replace("{{ index .Hardware.Disks 0 }}", "/dev/nvme0n1")
                .replace(
                    "{{ formatPartition ( index .Hardware.Disks 0 ) 3 }}",
                    "/dev/nvme0n1p3",
                )
                .replace(
                    "{{ formatPartition ( index .Hardware.Disks 0 ) 1 }}",
                    "/dev/nvme0n1p1",
                );
            assert!(
                !want.contains("{{"),
                "{name}: an action the test does not know"
            );
            assert_eq!(execute(data, Some(&hw), &hm).unwrap(), want, "{name}");
            n += 1;
        }
        assert_eq!(n, 4, "the corpus has four Templates");
    }
}
