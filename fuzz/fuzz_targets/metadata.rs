//! The metadata service's pure parts, fed from the fuzzer's bytes:
//! - `metadata::ec2_get` with a path and caller address from the input, on
//!   the unit tests' machine (built once);
//! - every renderer (`ec2_get`, `dynamic`, `metadata_json`,
//!   `nocloud_meta_data`, `nocloud_network_config`,
//!   `public_keys_listing`) on a machine whose strings come from the input;
//! - `metadata::http::client_ip` with an X-Forwarded-For from the input;
//! - `metadata::token::Tokens::check` of a token from the input.
//!
//! Checked besides "no panic": the NoCloud documents are YAML that reads
//! back as the values they were made from (a value from a Hardware cannot
//! add keys or change types in cloud-init's input), and a listing's names
//! are one per line; `client_ip` of an untrusted peer is the peer; a
//! token issued for an address is accepted for it.
#![no_main]

use http::{HeaderMap, HeaderValue};
use ipnet::IpNet;
use libfuzzer_sys::fuzz_target;
use serde_json::{Value, json};
use std::net::IpAddr;
use std::sync::LazyLock;
use tinkerbox::hardware::{self, Machine};
use tinkerbox::inventory::Snapshot;
use tinkerbox::metadata::{self, Source, http::client_ip, token::Tokens};
use tinkerbox_fuzz::{Input, metadata_machine};

static FIXED: LazyLock<Machine> = LazyLock::new(metadata_machine);
static TOKENS: LazyLock<Option<Tokens>> = LazyLock::new(|| Tokens::new().ok());
static TRUSTED: LazyLock<Vec<IpNet>> = LazyLock::new(|| {
    ["10.0.0.0/8", "127.0.0.1/32", "::1/128", "fd00::/8"]
        .iter()
        .filter_map(|n| n.parse().ok())
        .collect()
});

/// A machine whose every string the renderers read comes from the input
/// (addresses and MACs valid, as validation leaves only those).
fn machine_from(inp: &mut Input) -> Option<Machine> {
    let mut interfaces = Vec::new();
    for _ in 0..inp.u8() % 4 {
        let ip = inp.bool().then(|| {
            json!({"address": inp.ip().to_string(), "gateway": inp.ip().to_string(),
                   "netmask": format!("255.255.{}.0", [0u8, 128, 192, 255][usize::from(inp.u8() % 4)])})
        });
        interfaces.push(json!({"dhcp": {
            "arch": inp.opt_string(), "domain_name": inp.opt_string(),
            "hostname": inp.opt_string(), "iface_name": inp.opt_string(), "ip": ip,
            "mac": format!("52:54:00:00:{:02x}:{:02x}", interfaces.len(), inp.u8()),
            "name_servers": [inp.ip().to_string()], "vlan_id": inp.bool().then(|| inp.u16() % 4096).map(|v| v.to_string()),
        }}));
    }
    let mut ips = Vec::new();
    for _ in 0..inp.u8() % 4 {
        let flags = inp.u8();
        ips.push(
            json!({"address": inp.opt_string(), "family": if flags & 1 == 1 { 6 } else { 4 },
            "gateway": inp.opt_string(), "management": flags & 2 == 2, "netmask": inp.opt_string(),
            "public": flags & 4 == 4}),
        );
    }
    let instance = json!({"hostname": inp.opt_string(), "id": inp.opt_string(), "ips": ips,
        "operating_system": {"distro": inp.opt_string(), "image_tag": inp.opt_string(),
            "os_slug": inp.opt_string(), "slug": inp.opt_string(), "version": inp.opt_string()},
        "ssh_keys": inp.strings(4), "state": inp.opt_string(), "tags": inp.strings(3)});
    let doc = json!({"apiVersion": "tinkerbell.org/v1alpha1", "kind": "Hardware",
        "metadata": {"name": "m1", "namespace": "fuzz"},
        "spec": {"interfaces": interfaces, "metadata": {
            "facility": {"facility_code": inp.opt_string(), "plan_slug": inp.opt_string()},
            "instance": instance, "state": inp.opt_string()}}});
    hardware::validate(doc).ok().map(|h| h.machine)
}

/// Render with the caller being `ip`'s interface, as the service finds it
/// (else the first interface, else none).
fn with_source<R>(m: &Machine, ip: IpAddr, f: impl FnOnce(&Source) -> R) -> R {
    let snap = Snapshot::build([m.clone()]);
    let details = m.details();
    let found = snap.by_ip(&ip).map(|(_, i)| i.clone());
    let iface = found
        .or_else(|| m.interfaces.first().cloned())
        .unwrap_or_default();
    f(&Source {
        machine: m,
        iface: &iface,
        details: &details,
    })
}

/// A NoCloud document reads back as what it was rendered from.
fn yaml_round_trip(yaml: &str, want: &Value) {
    let got: Value = match serde_saphyr::from_str(yaml) {
        Ok(v) => v,
        Err(e) => panic!("rendered YAML does not parse: {e}\n{yaml}"),
    };
    assert_eq!(&got, want, "YAML reads back differently:\n{yaml}");
}

fn render_all(m: &Machine, ip: IpAddr, path: &str) {
    with_source(m, ip, |src| {
        let _ = metadata::ec2_get(src, path);
        let _ = metadata::ec2_get(src, "");
        let _ = metadata::ec2_get(src, "public-keys");
        let _ = metadata::dynamic(src)
            .get("instance-identity/document")
            .map(|n| n.render());
        let _ = metadata::metadata_json(src).to_string();
        if let Some(listing) = metadata::public_keys_listing(src) {
            assert_eq!(listing.lines().count(), src.ssh_keys().len(), "{listing:?}");
        }
        // NoCloud meta-data: the local hostname is the EC2 tree's.
        let nocloud = metadata::nocloud_meta_data(src).expect("meta-data renders");
        let want = json!({
            "instance-id": src.instance_id(),
            "local-hostname": metadata::ec2_get(src, "local-hostname"),
            "public-keys": src.ssh_keys(),
        });
        yaml_round_trip(&nocloud, &want);
    });
    let net = metadata::nocloud_network_config(m).expect("network-config renders");
    let v: Value = serde_saphyr::from_str(&net).unwrap_or(Value::Null);
    assert_eq!(v["network"]["version"], json!(2), "network-config:\n{net}");
    // Every rendered interface is a mapping with its MAC as a string.
    if let Some(eth) = v["network"]["ethernets"].as_object() {
        for (name, e) in eth {
            assert!(e["match"]["macaddress"].is_string(), "{name}: {net}");
            assert_eq!(e["set-name"].as_str(), Some(name.as_str()), "{net}");
        }
    } else {
        panic!("network-config has no ethernets mapping:\n{net}");
    }
}

fuzz_target!(|data: &[u8]| {
    let mut inp = Input::new(data);
    let ip = inp.ip();
    let path = inp.string();

    // The fixed machine, any path.
    with_source(&FIXED, ip, |src| metadata::ec2_get(src, &path));

    // X-Forwarded-For and the peer.
    let peer = inp.ip();
    let mut headers = HeaderMap::new();
    for _ in 0..inp.u8() % 3 {
        if let Ok(v) = HeaderValue::from_bytes(inp.field()) {
            headers.append("x-forwarded-for", v);
        }
    }
    let got = client_ip(peer, &headers, &TRUSTED);
    let canon = peer.to_canonical();
    if !TRUSTED.iter().any(|n| n.contains(&canon)) {
        assert_eq!(got, canon, "an untrusted peer's header was believed");
    }

    // IMDSv2 tokens.
    if let Some(t) = TOKENS.as_ref() {
        let token = inp.string();
        let now = u64::from(inp.u32());
        let _ = t.check(&token, ip, now);
        let issued = t.issue(ip, now, u64::from(inp.u16()) + 1);
        assert_eq!(t.check(&issued, ip, now), Ok(()), "own token refused");
    }

    // A machine made of the input, every renderer.
    if let Some(m) = machine_from(&mut inp) {
        render_all(&m, ip, &path);
    }
});
