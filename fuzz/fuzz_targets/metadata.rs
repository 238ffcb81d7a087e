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
use tinkerbox::hardware::spec::{
    Dhcp, Facility, HardwareMetadata, Instance, InstanceIp, Interface, Ip, OperatingSystem,
};
use tinkerbox::hardware::{Key, Machine};
use tinkerbox::metadata::{self, http::client_ip, token::Tokens};
use tinkerbox_fuzz::{Input, metadata_machine};

static FIXED: LazyLock<Machine> = LazyLock::new(metadata_machine);
static TOKENS: LazyLock<Option<Tokens>> = LazyLock::new(|| Tokens::new().ok());
static TRUSTED: LazyLock<Vec<IpNet>> = LazyLock::new(|| {
    ["10.0.0.0/8", "127.0.0.1/32", "::1/128", "fd00::/8"]
        .iter()
        .filter_map(|n| n.parse().ok())
        .collect()
});

/// A machine whose every string the renderers read comes from the input.
fn machine_from(inp: &mut Input) -> Machine {
    let mut interfaces = Vec::new();
    for _ in 0..inp.u8() % 4 {
        let ip = inp.bool().then(|| Ip {
            address: inp.opt_string(),
            family: None,
            gateway: inp.opt_string(),
            netmask: inp.opt_string(),
        });
        interfaces.push(Interface {
            dhcp: Some(Dhcp {
                arch: inp.opt_string(),
                domain_name: inp.opt_string(),
                hostname: inp.opt_string(),
                iface_name: inp.opt_string(),
                ip,
                // A MAC that parses half the time, so interfaces are listed.
                mac: if inp.bool() {
                    Some(format!("52:54:00:00:00:{:02x}", inp.u8()))
                } else {
                    inp.opt_string()
                },
                name_servers: inp.strings(3),
                vlan_id: inp.opt_string(),
                ..Dhcp::default()
            }),
            ..Interface::default()
        });
    }
    let mut ips = Vec::new();
    for _ in 0..inp.u8() % 4 {
        let flags = inp.u8();
        ips.push(InstanceIp {
            address: inp.opt_string(),
            family: Some(if flags & 1 == 1 { 6 } else { 4 }),
            gateway: inp.opt_string(),
            management: Some(flags & 2 == 2),
            netmask: inp.opt_string(),
            public: Some(flags & 4 == 4),
        });
    }
    let instance = Instance {
        hostname: inp.opt_string(),
        id: inp.opt_string(),
        ips,
        operating_system: Some(OperatingSystem {
            distro: inp.opt_string(),
            image_tag: inp.opt_string(),
            os_slug: inp.opt_string(),
            slug: inp.opt_string(),
            version: inp.opt_string(),
        }),
        ssh_keys: inp.strings(4),
        state: inp.opt_string(),
        tags: inp.strings(3),
        ..Instance::default()
    };
    let mut m = FIXED.clone();
    m.key = Key::new("fuzz", "m1");
    m.spec.interfaces = interfaces;
    m.spec.metadata = Some(HardwareMetadata {
        facility: Some(Facility {
            facility_code: inp.opt_string(),
            plan_slug: inp.opt_string(),
            plan_version_slug: None,
        }),
        instance: Some(instance),
        state: inp.opt_string(),
        ..HardwareMetadata::default()
    });
    m
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
    let _ = metadata::ec2_get(m, ip, path);
    let _ = metadata::ec2_get(m, ip, "");
    let _ = metadata::ec2_get(m, ip, "public-keys");
    let _ = metadata::dynamic(m, ip)
        .get("instance-identity/document")
        .map(|n| n.render());
    let _ = metadata::metadata_json(m, ip).to_string();
    if let Some(listing) = metadata::public_keys_listing(m) {
        let keys = metadata::ssh_keys(m);
        assert_eq!(listing.lines().count(), keys.len(), "{listing:?}");
    }

    // NoCloud meta-data: the local hostname is the EC2 tree's.
    let nocloud = metadata::nocloud_meta_data(m, ip);
    let want = json!({
        "instance-id": metadata::instance_id(m),
        "local-hostname": metadata::ec2_get(m, ip, "local-hostname"),
        "public-keys": metadata::ssh_keys(m),
    });
    yaml_round_trip(&nocloud, &want);

    let net = metadata::nocloud_network_config(m);
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
    let _ = metadata::ec2_get(&FIXED, ip, &path);

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
    let m = machine_from(&mut inp);
    render_all(&m, ip, &path);
});
