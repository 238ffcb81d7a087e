//! Every metadata path against the Hardware values it comes from.

use super::http::client_ip;
use super::*;
use crate::hardware;
use crate::inventory::Snapshot;
use axum::http::HeaderMap;

const HW: &str = r##"
apiVersion: tinkerbell.org/v1alpha1
kind: Hardware
metadata: {name: worker-01, namespace: lab}
spec:
  interfaces:
  - dhcp:
      mac: "52:54:00:10:00:01"
      hostname: worker-01-eno1
      arch: x86_64
      iface_name: eno1
      ip: {address: 10.99.0.21, netmask: 255.255.255.0, gateway: 10.99.0.1}
      name_servers: [10.99.0.1]
      domain_name: lab.example
    netboot: {allowPXE: true}
  - dhcp:
      mac: "52:54:00:10:00:02"
      vlan_id: "12"
  metadata:
    facility: {facility_code: lab1, plan_slug: c3.small.x86}
    bonding_mode: 4
    instance:
      id: 0f0b6c2e-3f0a-4a7e-9c61-1d2b3c4d5e6f
      hostname: worker-01
      tags: [k8s, worker]
      ips:
      - {address: 10.99.0.21, netmask: 255.255.255.0, gateway: 10.99.0.1, family: 4, public: false, management: true}
      - {address: 203.0.113.21, family: 4, public: true}
      - {address: "2001:db8::21", family: 6, public: false}
      ssh_keys:
      - ssh-ed25519 AAAAC3Nza ops@lab
      - ssh-rsa AAAAB3Nza backup@lab
      operating_system: {distro: ubuntu, version: "22.04", os_slug: ubuntu_22_04, image_tag: v1}
      storage:
        disks: [{device: /dev/sda, wipe_table: true}]
  userData: "#cloud-config\nhostname: worker-01\n"
"##;

fn machine() -> Machine {
    hardware::validate(hardware::parse_documents(HW).unwrap().remove(0))
        .unwrap()
        .machine
}

fn ip() -> IpAddr {
    "10.99.0.21".parse().unwrap()
}

/// Render with the machine found as the inventory finds a caller at `ip`.
fn at<R>(m: &Machine, ip: IpAddr, f: impl FnOnce(&Source) -> R) -> R {
    let snap = Snapshot::build([m.clone()]);
    let (m, iface) = snap.by_ip(&ip).expect("a Hardware IP");
    let details = m.details();
    f(&Source {
        machine: m,
        iface,
        details: &details,
    })
}

#[test]
fn every_meta_data_path() {
    let m = machine();
    let get = |p: &str| at(&m, ip(), |s| ec2_get(s, p));
    let cases: &[(&str, Option<&str>)] = &[
        (
            "",
            Some(
                "facility\nhostname\ninstance-id\ninstance-type\nlocal-hostname\nlocal-ipv4\nmac\nnetwork/\noperating-system/\nplacement/\nplan\npublic-ipv4\npublic-ipv6\npublic-keys/\ntags",
            ),
        ),
        ("instance-id", Some("0f0b6c2e-3f0a-4a7e-9c61-1d2b3c4d5e6f")),
        ("instance-id/", Some("0f0b6c2e-3f0a-4a7e-9c61-1d2b3c4d5e6f")),
        ("hostname", Some("worker-01")),
        ("local-hostname", Some("worker-01")),
        ("local-ipv4", Some("10.99.0.21")),
        ("public-ipv4", Some("203.0.113.21")),
        // Hegel: the first IPv6, public or not.
        ("public-ipv6", Some("2001:db8::21")),
        ("mac", Some("52:54:00:10:00:01")),
        ("instance-type", Some("c3.small.x86")),
        ("plan", Some("c3.small.x86")),
        ("facility", Some("lab1")),
        ("placement", Some("availability-zone")),
        ("placement/availability-zone", Some("lab1")),
        ("tags", Some("k8s\nworker")),
        ("public-keys", Some("0=ops@lab\n1=backup@lab")),
        ("public-keys/0", Some("openssh-key")),
        (
            "public-keys/0/openssh-key",
            Some("ssh-ed25519 AAAAC3Nza ops@lab"),
        ),
        (
            "public-keys/1/openssh-key",
            Some("ssh-rsa AAAAB3Nza backup@lab"),
        ),
        ("operating-system", Some("distro\nimage_tag\nslug\nversion")),
        ("operating-system/slug", Some("ubuntu_22_04")),
        ("operating-system/distro", Some("ubuntu")),
        ("operating-system/version", Some("22.04")),
        ("operating-system/image_tag", Some("v1")),
        (
            "network/interfaces/macs",
            Some("52:54:00:10:00:01/\n52:54:00:10:00:02/"),
        ),
        (
            "network/interfaces/macs/52:54:00:10:00:01",
            Some(
                "device-number\ninterface-id\nlocal-hostname\nlocal-ipv4s\nmac\nsubnet-ipv4-cidr-block",
            ),
        ),
        (
            "network/interfaces/macs/52:54:00:10:00:01/local-ipv4s",
            Some("10.99.0.21"),
        ),
        (
            "network/interfaces/macs/52:54:00:10:00:01/subnet-ipv4-cidr-block",
            Some("10.99.0.0/24"),
        ),
        (
            "network/interfaces/macs/52:54:00:10:00:01/device-number",
            Some("0"),
        ),
        (
            "network/interfaces/macs/52:54:00:10:00:02/vlan-id",
            Some("12"),
        ),
        ("nope", None),
        ("instance-id/more", None),
        ("public-keys/9/openssh-key", None),
    ];
    for (path, want) in cases {
        assert_eq!(get(path).as_deref(), *want, "meta-data/{path}");
    }
}

#[test]
fn sparse_hardware_falls_back_and_omits() {
    // Nothing but a MAC and an address: cloud-init still gets an id and a name.
    let doc = "apiVersion: tinkerbell.org/v1alpha1\nkind: Hardware\nmetadata: {name: bare}\nspec:\n  interfaces:\n  - dhcp: {mac: \"52:54:00:00:00:01\", ip: {address: 10.0.0.5, netmask: 255.255.0.0}}\n";
    let m = hardware::validate(hardware::parse_documents(doc).unwrap().remove(0))
        .unwrap()
        .machine;
    let ip: IpAddr = "10.0.0.5".parse().unwrap();
    let get = |p: &str| at(&m, ip, |s| ec2_get(s, p));
    assert_eq!(get("instance-id").as_deref(), Some("bare"));
    assert_eq!(get("local-hostname").as_deref(), Some("bare"));
    assert_eq!(get("local-ipv4").as_deref(), Some("10.0.0.5"));
    assert_eq!(
        get("").as_deref(),
        Some("hostname\ninstance-id\nlocal-hostname\nlocal-ipv4\nmac\nnetwork/"),
        "absent values are not listed (cloud-init drops all meta-data on a listed 404)"
    );
    assert_eq!(get("public-keys"), None);
    assert_eq!(
        at(&m, ip, nocloud_meta_data).unwrap(),
        "instance-id: bare\nlocal-hostname: bare\npublic-keys: []\n"
    );
    assert!(nocloud_network_config(&m).unwrap().contains("10.0.0.5/16"));
}

#[test]
fn metadata_json_is_a_superset_of_hegels() {
    let v = at(&machine(), ip(), metadata_json);
    assert_eq!(v["id"], "0f0b6c2e-3f0a-4a7e-9c61-1d2b3c4d5e6f");
    assert_eq!(v["hostname"], "worker-01");
    assert_eq!(v["facility"], "lab1");
    assert_eq!(v["plan"], "c3.small.x86");
    assert_eq!(v["operating_system"]["slug"], "ubuntu_22_04");
    assert_eq!(v["ssh_keys"].as_array().unwrap().len(), 2);
    assert_eq!(v["tags"], serde_json::json!(["k8s", "worker"]));
    assert_eq!(v["network"]["addresses"].as_array().unwrap().len(), 3);
    assert_eq!(
        v["network"]["interfaces"][0],
        serde_json::json!({"name": "eno1", "mac": "52:54:00:10:00:01"})
    );
    assert_eq!(v["network"]["bonding"]["mode"], 4);
    // Hegel's /metadata (v0.10+) is {"metadata":{"instance":{"storage":...}}} for rootio.
    assert_eq!(
        v["metadata"]["instance"]["storage"]["disks"][0]["device"],
        "/dev/sda"
    );
}

#[test]
fn nocloud_documents() {
    let m = machine();
    let md = at(&m, ip(), nocloud_meta_data).unwrap();
    assert_eq!(
        md,
        "instance-id: 0f0b6c2e-3f0a-4a7e-9c61-1d2b3c4d5e6f\nlocal-hostname: worker-01\npublic-keys:\n- ssh-ed25519 AAAAC3Nza ops@lab\n- ssh-rsa AAAAB3Nza backup@lab\n"
    );
    let nc = nocloud_network_config(&m).unwrap();
    let v: serde_json::Value = serde_saphyr::from_str(&nc).unwrap();
    let e = &v["network"]["ethernets"]["eno1"];
    assert_eq!(v["network"]["version"], 2);
    assert_eq!(e["match"]["macaddress"], "52:54:00:10:00:01");
    assert_eq!(e["addresses"], serde_json::json!(["10.99.0.21/24"]));
    assert_eq!(
        e["routes"],
        serde_json::json!([{"to": "0.0.0.0/0", "via": "10.99.0.1"}])
    );
    assert_eq!(
        e["nameservers"]["addresses"],
        serde_json::json!(["10.99.0.1"])
    );
    assert_eq!(
        e["nameservers"]["search"],
        serde_json::json!(["lab.example"])
    );
    assert_eq!(
        v["network"]["ethernets"]["eth1"]["dhcp4"], true,
        "no address: DHCP"
    );
}

#[test]
fn identity_document() {
    let d = at(&machine(), ip(), dynamic);
    assert_eq!(d.get("").unwrap().render(), "instance-identity/");
    let doc: serde_json::Value =
        serde_json::from_str(&d.get("instance-identity/document").unwrap().render()).unwrap();
    assert_eq!(doc["instanceId"], "0f0b6c2e-3f0a-4a7e-9c61-1d2b3c4d5e6f");
    assert_eq!(doc["privateIp"], "10.99.0.21");
}

#[test]
fn forwarded_for_only_from_trusted_proxies() {
    let trusted: Vec<ipnet::IpNet> = vec![
        "10.0.0.0/24".parse().unwrap(),
        "192.168.1.1/32".parse().unwrap(),
    ];
    let h = |v: &str| {
        let mut h = HeaderMap::new();
        h.insert("x-forwarded-for", v.parse().unwrap());
        h
    };
    let ip = |s: &str| s.parse::<IpAddr>().unwrap();
    // Untrusted peer: the header is ignored.
    assert_eq!(
        client_ip(ip("10.9.9.9"), &h("10.99.0.21"), &trusted),
        ip("10.9.9.9")
    );
    // Trusted peer: the rightmost untrusted hop.
    assert_eq!(
        client_ip(ip("10.0.0.5"), &h("1.2.3.4, 10.99.0.21"), &trusted),
        ip("10.99.0.21")
    );
    // Through two proxies: skip the trusted ones from the right.
    assert_eq!(
        client_ip(
            ip("10.0.0.5"),
            &h("6.6.6.6, 10.99.0.21, 192.168.1.1"),
            &trusted
        ),
        ip("10.99.0.21")
    );
    // A spoofed left part cannot win.
    assert_eq!(
        client_ip(ip("10.0.0.5"), &h("10.99.0.22, 10.99.0.21"), &trusted),
        ip("10.99.0.21")
    );
    // Garbage stops the walk at the last trusted address.
    assert_eq!(
        client_ip(ip("10.0.0.5"), &h("10.99.0.22, junk"), &trusted),
        ip("10.0.0.5")
    );
    // No header from a trusted proxy: the proxy itself.
    assert_eq!(
        client_ip(ip("10.0.0.5"), &HeaderMap::new(), &trusted),
        ip("10.0.0.5")
    );
    // Everything trusted: the leftmost.
    assert_eq!(
        client_ip(ip("10.0.0.5"), &h("10.0.0.7"), &trusted),
        ip("10.0.0.7")
    );
}

/// The daemon serves from the inventory's view, loaded from the stored
/// document or built from an applied one: every answer must be the same
/// bytes either way.
#[test]
fn answers_from_stored_and_applied_views_are_identical() {
    let h = hardware::validate(hardware::parse_documents(HW).unwrap().remove(0)).unwrap();
    let stored = Machine::from_doc(h.machine.key.clone(), &h.doc.to_string()).unwrap();
    let answers = |m: &Machine| {
        at(m, ip(), |s| {
            (
                meta_data(s).render(),
                ec2_get(s, "public-keys/0/openssh-key"),
                dynamic(s).render(),
                metadata_json(s).to_string(),
                nocloud_meta_data(s),
                nocloud_network_config(m),
                s.details.user_data.clone(),
            )
        })
    };
    let want = answers(&h.machine);
    assert!(want.6.is_some());
    assert_eq!(answers(&stored), want);
}

/// The caller is the interface its address belongs to: its MAC and
/// hostname, not the first interface's.
#[test]
fn the_caller_is_the_interface_with_its_address() {
    let doc = "apiVersion: tinkerbell.org/v1alpha1\nkind: Hardware\nmetadata: {name: two}\nspec:\n  interfaces:\n  - dhcp: {mac: \"52:54:00:00:00:01\", hostname: first, ip: {address: 10.0.0.5}}\n  - dhcp: {mac: \"52:54:00:00:00:02\", hostname: second, ip: {address: 10.0.1.5}}\n";
    let m = hardware::validate(hardware::parse_documents(doc).unwrap().remove(0))
        .unwrap()
        .machine;
    let ip: IpAddr = "10.0.1.5".parse().unwrap();
    assert_eq!(
        at(&m, ip, |s| ec2_get(s, "mac")).as_deref(),
        Some("52:54:00:00:00:02")
    );
    assert_eq!(
        at(&m, ip, |s| ec2_get(s, "hostname")).as_deref(),
        Some("second")
    );
    assert_eq!(
        at(&m, ip, |s| ec2_get(s, "local-ipv4")).as_deref(),
        Some("10.0.1.5")
    );
}
