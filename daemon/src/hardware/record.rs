//! What the in-memory inventory keeps of one Hardware: its key and one
//! compact byte string holding the MACs, the IPs and the spec.
//!
//! With 100,000 machines the typed [`HardwareSpec`] (about 1 KB of mostly
//! empty `Option<String>`s per machine, plus a few KB of small allocations)
//! cannot stay resident, so a record keeps the spec as its JSON with the
//! known field names and `true`/`false`/`null` packed into one byte each
//! (about half the size of the JSON), and parses it when a hot path asks.
//! That costs a few microseconds per lookup, next to a DHCP reply or an
//! HTTP response that costs far more. The packing is lossless for any JSON
//! text: names not in the table are kept as they are.

use super::{Key, Mac, Machine, spec::HardwareSpec};
use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::LazyLock;

/// JSON fragments that stand for one byte, `0x80 + index`, outside strings.
/// Outside a string, JSON text is ASCII, so bytes from 0x80 up are free.
/// The field names of [`HardwareSpec`] (a test checks that a fully set spec
/// uses no other), then the literals. Append only: the order is the format
/// (it only lives in memory, but tests pin it).
const TOKENS: &[&str] = &[
    // HardwareSpec
    "\"agentID\"",
    "\"auto\"",
    "\"bmcRef\"",
    "\"disks\"",
    "\"interfaces\"",
    "\"metadata\"",
    "\"references\"",
    "\"resources\"",
    "\"tinkVersion\"",
    "\"userData\"",
    "\"vendorData\"",
    "\"enrollmentEnabled\"",
    "\"apiGroup\"",
    "\"kind\"",
    "\"name\"",
    "\"device\"",
    "\"group\"",
    "\"namespace\"",
    "\"resource\"",
    "\"version\"",
    // Interface, DHCP, IP
    "\"dhcp\"",
    "\"disableDhcp\"",
    "\"isoboot\"",
    "\"netboot\"",
    "\"arch\"",
    "\"boot_file_name\"",
    "\"classless_static_routes\"",
    "\"destination_descriptor\"",
    "\"router\"",
    "\"domain_name\"",
    "\"hostname\"",
    "\"iface_name\"",
    "\"ip\"",
    "\"lease_time\"",
    "\"mac\"",
    "\"name_servers\"",
    "\"tftp_server_name\"",
    "\"time_servers\"",
    "\"uefi\"",
    "\"vlan_id\"",
    "\"address\"",
    "\"family\"",
    "\"gateway\"",
    "\"netmask\"",
    // Netboot
    "\"sourceISO\"",
    "\"allowPXE\"",
    "\"allowWorkflow\"",
    "\"ipxe\"",
    "\"osie\"",
    "\"pxelinux\"",
    "\"rpi\"",
    "\"binary\"",
    "\"contents\"",
    "\"url\"",
    "\"baseURL\"",
    "\"initrd\"",
    "\"kernel\"",
    "\"kernelParams\"",
    "\"config\"",
    "\"configTxt\"",
    "\"firmwarePath\"",
    "\"serialNum\"",
    // Metadata
    "\"bonding_mode\"",
    "\"custom\"",
    "\"facility\"",
    "\"instance\"",
    "\"manufacturer\"",
    "\"state\"",
    "\"preinstalled_operating_system_version\"",
    "\"private_subnets\"",
    "\"facility_code\"",
    "\"plan_slug\"",
    "\"plan_version_slug\"",
    "\"id\"",
    "\"slug\"",
    "\"distro\"",
    "\"image_tag\"",
    "\"os_slug\"",
    "\"allow_pxe\"",
    "\"always_pxe\"",
    "\"crypted_root_password\"",
    "\"ips\"",
    "\"ipxe_script_url\"",
    "\"network_ready\"",
    "\"operating_system\"",
    "\"rescue\"",
    "\"ssh_keys\"",
    "\"storage\"",
    "\"tags\"",
    "\"userdata\"",
    "\"management\"",
    "\"public\"",
    // Literals
    "true",
    "false",
    "null",
];

static CODES: LazyLock<HashMap<&'static [u8], u8>> = LazyLock::new(|| {
    TOKENS
        .iter()
        .enumerate()
        .map(|(i, t)| (t.as_bytes(), 0x80 + i as u8))
        .collect()
});

/// Index just past the string starting with the quote at `start`, or the
/// end of the input if it is unterminated.
fn string_end(s: &[u8], start: usize) -> usize {
    let mut j = start + 1;
    while j < s.len() {
        match s[j] {
            b'\\' => j += 2,
            b'"' => return j + 1,
            _ => j += 1,
        }
    }
    s.len()
}

/// Pack JSON text (see [`TOKENS`]), appending to `out`.
fn pack(json: &[u8], out: &mut Vec<u8>) {
    let mut i = 0;
    while i < json.len() {
        let b = json[i];
        let end = match b {
            b'"' => string_end(json, i),
            b't' | b'n' => (i + 4).min(json.len()),
            b'f' => (i + 5).min(json.len()),
            _ => {
                out.push(b);
                i += 1;
                continue;
            }
        };
        match CODES.get(&json[i..end]) {
            Some(&c) => {
                out.push(c);
                i = end;
            }
            // A string as it is; a letter on its own, so that a quote
            // right after it still starts a string.
            None if b == b'"' => {
                out.extend_from_slice(&json[i..end]);
                i = end;
            }
            None => {
                out.push(b);
                i += 1;
            }
        }
    }
}

/// The JSON text back from [`pack`].
fn unpack(packed: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(packed.len() * 2);
    let mut i = 0;
    while i < packed.len() {
        let b = packed[i];
        if b == b'"' {
            let end = string_end(packed, i);
            out.extend_from_slice(&packed[i..end]);
            i = end;
            continue;
        }
        match TOKENS.get(usize::from(b.wrapping_sub(0x80))) {
            Some(t) if b >= 0x80 => out.extend_from_slice(t.as_bytes()),
            _ => out.push(b),
        }
        i += 1;
    }
    out
}

/// One machine in the inventory. `data` is
/// `[macs: u16 LE][6 bytes each][ips: u16 LE][4 or 6, then 4 or 16 bytes each][packed spec]`:
/// one allocation, where separate `Vec`s of MACs and IPs and a `String`
/// would be three (each at least 32 bytes with malloc's overhead).
/// Not `PartialEq`: the same spec may be packed from different texts (a
/// stored document keeps the user's field order); compare [`Record::machine`].
#[derive(Clone)]
pub struct Record {
    pub key: Key,
    data: Box<[u8]>,
}

impl std::fmt::Debug for Record {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Record")
            .field("key", &self.key)
            .field("bytes", &self.data.len())
            .finish()
    }
}

impl Record {
    /// `spec_json` is the JSON text of a [`HardwareSpec`]; MACs and IPs as
    /// [`Machine`] holds them.
    fn from_parts(key: Key, macs: &[Mac], ips: &[IpAddr], spec_json: &[u8]) -> Record {
        thread_local! {
            static SCRATCH: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
        }
        SCRATCH.with_borrow_mut(|d| {
            d.clear();
            Record::encode(d, macs, ips, spec_json);
            // Allocated at its final size: shrinking a larger buffer would
            // leave a hole after every record.
            let r = Record {
                key,
                data: Box::from(&d[..]),
            };
            if d.capacity() > 1 << 16 {
                *d = Vec::new();
            }
            r
        })
    }

    fn encode(d: &mut Vec<u8>, macs: &[Mac], ips: &[IpAddr], spec_json: &[u8]) {
        d.extend_from_slice(&(macs.len().min(u16::MAX.into()) as u16).to_le_bytes());
        for m in macs.iter().take(u16::MAX.into()) {
            d.extend_from_slice(&m.0);
        }
        d.extend_from_slice(&(ips.len().min(u16::MAX.into()) as u16).to_le_bytes());
        for ip in ips.iter().take(u16::MAX.into()) {
            match ip {
                IpAddr::V4(a) => {
                    d.push(4);
                    d.extend_from_slice(&a.octets());
                }
                IpAddr::V6(a) => {
                    d.push(6);
                    d.extend_from_slice(&a.octets());
                }
            }
        }
        pack(spec_json, d);
    }

    fn count_at(&self, at: usize) -> usize {
        match self.data.get(at..at + 2) {
            Some(&[a, b]) => usize::from(u16::from_le_bytes([a, b])),
            _ => 0,
        }
    }

    fn ips_at(&self) -> usize {
        2 + self.count_at(0) * 6
    }

    fn spec_at(&self) -> usize {
        let mut at = self.ips_at() + 2;
        for _ in 0..self.count_at(self.ips_at()) {
            at += if self.data.get(at) == Some(&6) { 17 } else { 5 };
        }
        at
    }

    /// The MACs the machine is found by.
    pub fn macs(&self) -> impl Iterator<Item = Mac> + '_ {
        self.data[2..self.ips_at()]
            .chunks_exact(6)
            .filter_map(|c| <[u8; 6]>::try_from(c).ok().map(Mac))
    }

    /// The IPs the machine is found by.
    pub fn ips(&self) -> impl Iterator<Item = IpAddr> + '_ {
        let mut at = self.ips_at() + 2;
        let end = self.spec_at();
        std::iter::from_fn(move || {
            if at >= end {
                return None;
            }
            let ip = if self.data[at] == 6 {
                let o: [u8; 16] = self.data.get(at + 1..at + 17)?.try_into().ok()?;
                at += 17;
                IpAddr::V6(Ipv6Addr::from(o))
            } else {
                let o: [u8; 4] = self.data.get(at + 1..at + 5)?.try_into().ok()?;
                at += 5;
                IpAddr::V4(Ipv4Addr::from(o))
            };
            Some(ip)
        })
    }

    /// The spec, parsed from the packed JSON. That is a typed spec
    /// serialised, or a stored spec that was checked when it was applied,
    /// so it parses; should it not (a database edited by hand, a schema
    /// made stricter since), that machine answers as if its spec were
    /// empty and the log says why, rather than the whole start-up failing.
    pub fn spec(&self) -> HardwareSpec {
        self.parse_spec()
    }

    /// The packed spec parsed as `T` (all of it, or the part `T` names).
    fn parse_spec<T: serde::de::DeserializeOwned + Default>(&self) -> T {
        let json = unpack(&self.data[self.spec_at()..]);
        serde_json::from_slice(&json).unwrap_or_else(|e| {
            tracing::error!(hardware = %self.key, error = %e, "inventory: packed spec does not parse");
            T::default()
        })
    }

    /// `spec.bmcRef`, parsing the spec only when the record has one: the
    /// BMC runner looks through every machine for the one naming a BMC.
    pub fn bmc_ref(&self) -> Option<super::spec::BmcRef> {
        let code = CODES.get("\"bmcRef\"".as_bytes()).copied();
        let packed = &self.data[self.spec_at()..];
        let mut i = 0;
        let mut found = false;
        while i < packed.len() {
            match packed[i] {
                b'"' => i = string_end(packed, i),
                b if Some(b) == code => {
                    found = true;
                    break;
                }
                _ => i += 1,
            }
        }
        if found { self.spec().bmc_ref } else { None }
    }

    /// A typed view holding only the interfaces (the rest of the spec is
    /// left at its default): all that DHCP reads, at a fraction of the
    /// cost of [`Record::machine`]. Parse failures as in [`Record::spec`].
    pub fn dhcp_machine(&self) -> Machine {
        let only: super::spec::InterfacesOnly = self.parse_spec();
        self.machine_with(HardwareSpec {
            interfaces: only.interfaces,
            ..HardwareSpec::default()
        })
    }

    /// The full typed view, for the paths that read more than keys.
    pub fn machine(&self) -> Machine {
        self.machine_with(self.spec())
    }

    fn machine_with(&self, spec: HardwareSpec) -> Machine {
        Machine {
            key: self.key.clone(),
            spec,
            macs: self.macs().collect(),
            ips: self.ips().collect(),
        }
    }

    /// Bytes held besides the key: for sizing.
    pub fn packed_len(&self) -> usize {
        self.data.len()
    }
}

/// Skip JSON whitespace from `i`.
fn skip_ws(s: &[u8], mut i: usize) -> usize {
    while i < s.len() && matches!(s[i], b' ' | b'\t' | b'\n' | b'\r') {
        i += 1;
    }
    i
}

/// Index just past the JSON value starting at `i` (no syntax check: the
/// caller parses what it takes).
fn value_end(s: &[u8], i: usize) -> usize {
    match s.get(i) {
        Some(b'"') => string_end(s, i),
        Some(b'{' | b'[') => {
            let mut depth = 0usize;
            let mut j = i;
            while j < s.len() {
                match s[j] {
                    b'"' => {
                        j = string_end(s, j);
                        continue;
                    }
                    b'{' | b'[' => depth += 1,
                    b'}' | b']' => {
                        depth -= 1;
                        if depth == 0 {
                            return j + 1;
                        }
                    }
                    _ => {}
                }
                j += 1;
            }
            s.len()
        }
        _ => {
            let mut j = i;
            while j < s.len() && !matches!(s[j], b',' | b'}' | b']' | b' ' | b'\t' | b'\n' | b'\r')
            {
                j += 1;
            }
            j
        }
    }
}

/// The text of member `name` of the top-level JSON object `doc`.
fn member<'a>(doc: &'a str, name: &str) -> Result<Option<&'a str>, String> {
    let s = doc.as_bytes();
    let bad = || "not a JSON object".to_string();
    let mut i = skip_ws(s, 0);
    if s.get(i) != Some(&b'{') {
        return Err(bad());
    }
    i = skip_ws(s, i + 1);
    if s.get(i) == Some(&b'}') {
        return Ok(None);
    }
    loop {
        if s.get(i) != Some(&b'"') {
            return Err(bad());
        }
        let k_end = string_end(s, i);
        // Member names of a stored document are plain: compare unescaped.
        let key = &s[i + 1..k_end.saturating_sub(1).max(i + 1)];
        i = skip_ws(s, k_end);
        if s.get(i) != Some(&b':') {
            return Err(bad());
        }
        let v = skip_ws(s, i + 1);
        let v_end = value_end(s, v);
        if key == name.as_bytes() {
            return Ok(doc.get(v..v_end));
        }
        i = skip_ws(s, v_end);
        match s.get(i) {
            Some(b',') => i = skip_ws(s, i + 1),
            Some(b'}') => return Ok(None),
            _ => return Err(bad()),
        }
    }
}

/// The part of a spec that the indexes need, borrowed from the text.
#[derive(serde::Deserialize)]
struct Keys<'a> {
    #[serde(default, borrow)]
    interfaces: Option<Vec<IfaceKeys<'a>>>,
}

#[derive(serde::Deserialize)]
struct IfaceKeys<'a> {
    #[serde(default, borrow)]
    dhcp: Option<DhcpKeys<'a>>,
}

#[derive(serde::Deserialize)]
struct DhcpKeys<'a> {
    #[serde(default, borrow)]
    mac: Option<std::borrow::Cow<'a, str>>,
    #[serde(default, borrow)]
    ip: Option<IpKeys<'a>>,
}

#[derive(serde::Deserialize)]
struct IpKeys<'a> {
    #[serde(default, borrow)]
    address: Option<std::borrow::Cow<'a, str>>,
}

impl Record {
    /// A stored document (validated when it was applied) straight to its
    /// record: the start-up path, where 100,000 documents must load in well
    /// under a second. The spec's text is packed as it is, and only the MACs
    /// and IPs are parsed out of it: a full typed parse, then serialising
    /// again, took two thirds of the start-up. The spec is parsed in full
    /// when a hot path asks for it ([`Record::spec`]).
    pub fn from_stored(key: Key, doc: &str) -> Result<Record, String> {
        let spec = match member(doc, "spec")? {
            Some(t) if t != "null" => t,
            _ => "{}",
        };
        let keys: Keys = serde_json::from_str(spec).map_err(|e| format!("spec: {e}"))?;
        let mut macs = Vec::new();
        let mut ips = Vec::new();
        for d in keys
            .interfaces
            .iter()
            .flatten()
            .filter_map(|i| i.dhcp.as_ref())
        {
            if let Some(mac) = d.mac.as_deref().and_then(|m| m.parse::<Mac>().ok())
                && !macs.contains(&mac)
            {
                macs.push(mac);
            }
            let ip =
                d.ip.as_ref()
                    .and_then(|ip| ip.address.as_deref())
                    .map(str::trim)
                    .filter(|a| !a.is_empty())
                    .and_then(|a| a.parse::<IpAddr>().ok());
            if let Some(ip) = ip
                && !ips.contains(&ip)
            {
                ips.push(ip);
            }
        }
        Ok(Record::from_parts(key, &macs, &ips, spec.as_bytes()))
    }
}

impl From<&Machine> for Record {
    fn from(m: &Machine) -> Record {
        // Serialising a struct of strings, numbers and JSON values cannot
        // fail; an empty spec is the fallback all the same.
        let json = serde_json::to_vec(&m.spec).unwrap_or_else(|_| b"{}".to_vec());
        Record::from_parts(m.key.clone(), &m.macs, &m.ips, &json)
    }
}

impl From<Machine> for Record {
    fn from(m: Machine) -> Record {
        Record::from(&m)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hardware::{self, validate};
    use serde_json::json;

    fn full_spec() -> serde_json::Value {
        json!({
            "agentID": "a", "auto": {"enrollmentEnabled": true},
            "bmcRef": {"apiGroup": "bmc.tinkerbell.org", "kind": "Machine", "name": "b"},
            "disks": [{"device": "/dev/sda"}],
            "interfaces": [{
                "dhcp": {"arch": "x86_64", "boot_file_name": "f", "classless_static_routes":
                    [{"destination_descriptor": "10.1.0.0/16", "router": "10.0.0.1"}],
                    "domain_name": "d", "hostname": "h", "iface_name": "eth0",
                    "ip": {"address": "10.0.0.5", "family": 4, "gateway": "10.0.0.1", "netmask": "255.255.255.0"},
                    "lease_time": 86400, "mac": "52:54:00:00:00:01", "name_servers": ["1.1.1.1"],
                    "tftp_server_name": "t", "time_servers": ["10.0.0.1"], "uefi": true, "vlan_id": "12"},
                "disableDhcp": true, "isoboot": {"sourceISO": "http://x/y.iso"},
                "netboot": {"allowPXE": true, "allowWorkflow": false,
                    "ipxe": {"binary": "b", "contents": "c", "url": "u"},
                    "osie": {"baseURL": "b", "initrd": "i", "kernel": "k", "kernelParams": ["p"]},
                    "pxelinux": {"config": "c"},
                    "rpi": {"configTxt": "c", "firmwarePath": "f", "serialNum": "s"}}},
                {"dhcp": {"mac": "52:54:00:00:00:02", "ip": {"address": "fd00::5", "family": 6}}}],
            "metadata": {"bonding_mode": 5,
                "custom": {"preinstalled_operating_system_version": {"distro": "d", "image_tag": "i",
                    "os_slug": "o", "slug": "s", "version": "v"}, "private_subnets": ["10.0.0.0/8"]},
                "facility": {"facility_code": "f", "plan_slug": "p", "plan_version_slug": "v"},
                "instance": {"allow_pxe": true, "always_pxe": false, "crypted_root_password": "x",
                    "hostname": "h", "id": "i", "ips": [{"address": "1.2.3.4", "family": 4, "gateway": "g",
                    "management": true, "netmask": "n", "public": true}], "ipxe_script_url": "u",
                    "network_ready": true, "operating_system": {"slug": "s"}, "rescue": false,
                    "ssh_keys": ["ssh-ed25519 AAAA"], "state": "s", "storage": {"disks": [{"device": null}]},
                    "tags": ["t"], "userdata": "u"},
                "manufacturer": {"id": "i", "slug": "s"}, "state": "s"},
            // Map keys are the user's; these happen to have tokens.
            "references": {"name": {"group": "g", "name": "n", "namespace": "ns", "resource": "r", "version": "v"}},
            "resources": {"kind": "4", "version": 16, "id": null},
            "tinkVersion": 1, "userData": "#cloud-config\nü: \"x\"\n", "vendorData": "v",
        })
    }

    fn hw(spec: serde_json::Value) -> hardware::Hardware {
        validate(
            json!({"apiVersion": hardware::API_VERSION, "kind": "Hardware",
                        "metadata": {"name": "m1"}, "spec": spec}),
        )
        .unwrap()
    }

    #[test]
    fn stored_documents_load_to_the_same_machine() {
        for spec in [
            full_spec(),
            json!({}),
            json!(null),
            json!({"interfaces": null}),
            json!({"interfaces": [{"dhcp": {"mac": "52-54-00-AA-BB-CC", "ip": {"address": " 10.0.0.5 "}}},
                {"dhcp": {"mac": "52:54:00:aa:bb:cd", "ip": {"address": "10.0.0.5"}, "x": [{"}": "]"}]}},
                {"dhcp": null}, {"extra": 1}],
                "metadata": {"instance": {"id": "i-1", "storage": {"disks": [{"device": "/dev/sda"}]}}},
                "userData": "#cloud-config\n\"spec\": {", "unknown": {"x": [1, true, null, -2.5e3]}}),
        ] {
            let h = hw(spec.clone());
            let text = h.doc.to_string();
            let r = Record::from_stored(h.machine.key.clone(), &text).unwrap();
            assert_eq!(r.machine(), h.machine, "{text}");
            // The DHCP view: the same interfaces, keys and addresses.
            let d = r.dhcp_machine();
            assert_eq!(d.spec.interfaces, h.machine.spec.interfaces, "{text}");
            assert_eq!(
                (&d.key, &d.macs, &d.ips),
                (&h.machine.key, &h.machine.macs, &h.machine.ips)
            );
            assert!(d.spec.metadata.is_none() && d.spec.user_data.is_none());
            // Spaced out, with the spec not first.
            let pretty =
                serde_json::to_string_pretty(&json!({"spec": h.doc["spec"], "kind": "Hardware"}))
                    .unwrap();
            let r = Record::from_stored(h.machine.key.clone(), &pretty).unwrap();
            assert_eq!(r.machine(), h.machine, "{pretty}");
        }
        let k = || Key::new("default", "m1");
        assert!(Record::from_stored(k(), "{}").unwrap().spec() == HardwareSpec::default());
        for bad in [
            "",
            "[]",
            "{\"spec\": {\"interfaces\": [}",
            "{\"spec\": {\"interfaces\": 5}}",
            "{\"a\" 1}",
            "{\"spec\": ",
        ] {
            assert!(Record::from_stored(k(), bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn machine_round_trips() {
        for spec in [full_spec(), json!({}), json!({"interfaces": [{}]})] {
            let h = hw(spec.clone());
            let r = Record::from(&h.machine);
            assert_eq!(r.machine(), h.machine, "{spec}");
        }
        let r = Record::from(&hw(full_spec()).machine);
        assert_eq!(
            r.macs().map(|m| m.to_string()).collect::<Vec<_>>(),
            ["52:54:00:00:00:01", "52:54:00:00:00:02"]
        );
        assert_eq!(
            r.ips().map(|m| m.to_string()).collect::<Vec<_>>(),
            ["10.0.0.5", "fd00::5"]
        );
    }

    #[test]
    fn every_field_name_packs_to_one_byte() {
        // A fully set spec, serialised: no field name left as text, so a
        // field added to spec.rs without a token fails here.
        let json = serde_json::to_vec(&hw(full_spec()).machine.spec).unwrap();
        let mut packed = Vec::new();
        pack(&json, &mut packed);
        let mut i = 0;
        while i < packed.len() {
            if packed[i] == b'"' {
                let end = string_end(&packed, i);
                assert_ne!(
                    packed.get(end),
                    Some(&b':'),
                    "field name {} has no token",
                    String::from_utf8_lossy(&packed[i..end])
                );
                i = end;
            } else {
                i += 1;
            }
        }
        assert!(TOKENS.len() <= 128);
        assert_eq!(CODES.len(), TOKENS.len(), "tokens are unique");
        assert!(
            packed.len() * 10 < json.len() * 7,
            "{} vs {}",
            packed.len(),
            json.len()
        );
    }

    #[test]
    fn packing_is_lossless_for_any_json() {
        let cases = [
            r#"{"interfaces":[{"dhcp":{"mac":"x"}}],"userData":"\"mac\" true \\\" false","x":null}"#,
            r#"{"unknown":{"hostname":"hostname","trueish":[true,false,null]},"é":"ü\u0080"}"#,
            r#"["\"ip\"", "a\\", "b"]"#,
            r#"{"a": truex, "b": "unterminated"#,
            "",
        ];
        for c in cases {
            let mut p = Vec::new();
            pack(c.as_bytes(), &mut p);
            assert_eq!(String::from_utf8(unpack(&p)).unwrap(), c);
        }
        // Whole strings equal to a name become one byte, as keys or
        // values; strings that merely contain one stay text.
        let mut p = Vec::new();
        pack(br#"{"ip":"ip","mac":"a mac"}"#, &mut p);
        assert_eq!(p.len(), 5 + 1 + 1 + 7 + 1);
    }

    #[test]
    fn compact_for_a_typical_machine() {
        let h = hw(
            json!({"interfaces": [{"dhcp": {"mac": "02:00:00:01:86:9f", "hostname": "m99999",
            "lease_time": 86400, "name_servers": ["10.0.0.1"],
            "ip": {"address": "10.1.134.159", "netmask": "255.0.0.0", "gateway": "10.0.0.1"}},
            "netboot": {"allowPXE": true, "allowWorkflow": true}}],
            "metadata": {"instance": {"id": "m99999", "hostname": "m99999"}}}),
        );
        let r = Record::from(&h.machine);
        // 297 bytes of JSON, in 172.
        assert!(r.packed_len() <= 172, "{} bytes", r.packed_len());
        assert_eq!(r.spec(), h.machine.spec);
    }
}
