//! Instance metadata, Hegel-compatible and complete enough for cloud-init:
//! an EC2-style tree (`/<version>/meta-data/...`, `user-data`,
//! `vendor-data`), Equinix-style `/metadata` JSON, and NoCloud under
//! `/cloud-init/`. Everything here is pure: a machine in, documents out.
//! [`http`] finds the machine by source IP and serves them.

pub mod cache;
pub mod http;
pub mod token;

use crate::hardware::spec::{Instance, Interface};
use crate::hardware::{Mac, Machine};
use serde_json::{Value, json};
use std::net::{IpAddr, Ipv4Addr};

/// Versions listed at `/`: the first EC2 API version and the ones
/// cloud-init asks for (DataSourceEc2 `extended_metadata_versions`).
pub const VERSIONS: &[&str] = &[
    "1.0",
    "2009-04-04",
    "2016-09-02",
    "2018-09-24",
    "2021-03-23",
    "latest",
];

/// A node of the EC2 tree.
#[derive(Debug, Clone, PartialEq)]
pub enum Node {
    /// Children in listing order; a listing shows sub-directories with `/`.
    Dir(Vec<(String, Node)>),
    Leaf(String),
}

impl Node {
    fn dir() -> Node {
        Node::Dir(vec![])
    }

    fn push(&mut self, name: &str, child: Node) {
        if let Node::Dir(c) = self {
            c.push((name.to_string(), child));
        }
    }

    /// Add a leaf unless the value is empty (EC2 omits absent keys).
    fn leaf(&mut self, name: &str, value: Option<String>) {
        if let Some(v) = value.filter(|v| !v.is_empty()) {
            self.push(name, Node::Leaf(v));
        }
    }

    /// Follow `a/b/c` (empty segments ignored).
    pub fn get(&self, path: &str) -> Option<&Node> {
        let mut cur = self;
        for seg in path.split('/').filter(|s| !s.is_empty()) {
            match cur {
                Node::Dir(children) => cur = &children.iter().find(|(n, _)| n == seg)?.1,
                Node::Leaf(_) => return None,
            }
        }
        Some(cur)
    }

    /// EC2's answer: a directory lists its children one per line, sorted
    /// as Hegel sorts them, sub-directories with a trailing `/`; a leaf is
    /// its value.
    pub fn render(&self) -> String {
        match self {
            Node::Leaf(v) => v.clone(),
            Node::Dir(children) => {
                let mut names: Vec<String> = children
                    .iter()
                    .map(|(n, c)| match c {
                        Node::Dir(_) => format!("{n}/"),
                        Node::Leaf(_) => n.clone(),
                    })
                    .collect();
                names.sort();
                names.join("\n")
            }
        }
    }
}

/// The interface a request came from: the one whose DHCP address is the
/// caller's IP, else the first with a MAC.
fn requesting_iface(m: &Machine, ip: IpAddr) -> Option<&Interface> {
    let ip_of = |i: &&Interface| {
        i.dhcp
            .as_ref()
            .and_then(|d| d.ip.as_ref())
            .and_then(|a| a.address.as_deref())
            .and_then(|a| a.trim().parse::<IpAddr>().ok())
    };
    m.spec
        .interfaces
        .iter()
        .find(|i| ip_of(i) == Some(ip))
        .or_else(|| {
            m.spec
                .interfaces
                .iter()
                .find(|i| i.dhcp.as_ref().is_some_and(|d| d.mac.is_some()))
        })
}

fn iface_mac(i: &Interface) -> Option<Mac> {
    i.dhcp.as_ref()?.mac.as_deref()?.parse().ok()
}

fn instance(m: &Machine) -> Option<&Instance> {
    m.spec.metadata.as_ref()?.instance.as_ref()
}

/// `instance.id`, else the Hardware's name: cloud-init needs one.
pub fn instance_id(m: &Machine) -> String {
    instance(m)
        .and_then(|i| i.id.clone())
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| m.key.name.clone())
}

/// `instance.hostname`, else the DHCP hostname, else the Hardware's name.
pub fn hostname(m: &Machine, iface: Option<&Interface>) -> String {
    instance(m)
        .and_then(|i| i.hostname.clone())
        .filter(|s| !s.is_empty())
        .or_else(|| {
            iface
                .and_then(|i| i.dhcp.as_ref()?.hostname.clone())
                .filter(|s| !s.is_empty())
        })
        .unwrap_or_else(|| m.key.name.clone())
}

/// An address from `instance.ips` by family and public flag (`None`: any),
/// as Hegel picks them.
fn instance_ip(m: &Machine, family: i64, public: Option<bool>) -> Option<String> {
    instance(m)?
        .ips
        .iter()
        .find(|a| {
            a.family.unwrap_or(4) == family && public.is_none_or(|p| a.public.unwrap_or(false) == p)
        })
        .and_then(|a| a.address.clone())
}

fn dhcp_ipv4(i: Option<&Interface>) -> Option<(Ipv4Addr, Option<Ipv4Addr>)> {
    let ip = i?.dhcp.as_ref()?.ip.as_ref()?;
    let addr: Ipv4Addr = ip.address.as_deref()?.trim().parse().ok()?;
    let mask = ip.netmask.as_deref().and_then(|m| m.trim().parse().ok());
    Some((addr, mask))
}

fn cidr(addr: Ipv4Addr, mask: Ipv4Addr) -> String {
    let bits = u32::from(mask);
    let net = Ipv4Addr::from(u32::from(addr) & bits);
    format!("{net}/{}", bits.count_ones())
}

pub fn ssh_keys(m: &Machine) -> Vec<String> {
    instance(m)
        .map(|i| {
            i.ssh_keys
                .iter()
                .map(|k| k.trim().to_string())
                .filter(|k| !k.is_empty())
                .collect()
        })
        .unwrap_or_default()
}

/// The EC2 `meta-data/` tree for the machine, as seen from `ip`.
pub fn meta_data(m: &Machine, ip: IpAddr) -> Node {
    let iface = requesting_iface(m, ip);
    let inst = instance(m);
    let facility = m.spec.metadata.as_ref().and_then(|md| md.facility.as_ref());
    let host = hostname(m, iface);
    let local_ipv4 =
        instance_ip(m, 4, Some(false)).or_else(|| dhcp_ipv4(iface).map(|(a, _)| a.to_string()));
    let mac = iface.and_then(iface_mac);

    let mut md = Node::dir();
    md.leaf("hostname", Some(host.clone()));
    md.leaf("instance-id", Some(instance_id(m)));
    md.leaf("instance-type", facility.and_then(|f| f.plan_slug.clone()));
    md.leaf("local-hostname", Some(host));
    md.leaf("local-ipv4", local_ipv4.clone());
    md.leaf("mac", mac.map(|m| m.to_string()));

    // network/interfaces/macs/<mac>/ for every interface with a MAC.
    let mut macs = Node::dir();
    for (n, i) in m.spec.interfaces.iter().enumerate() {
        let Some(imac) = iface_mac(i) else { continue };
        let mut e = Node::dir();
        e.leaf("device-number", Some(n.to_string()));
        e.leaf(
            "interface-id",
            Some(format!("eni-{}", imac.to_string().replace(':', ""))),
        );
        if let Some((a, mask)) = dhcp_ipv4(Some(i)) {
            e.leaf("local-ipv4s", Some(a.to_string()));
            if let Some(mask) = mask {
                e.leaf("subnet-ipv4-cidr-block", Some(cidr(a, mask)));
            }
        }
        e.leaf(
            "local-hostname",
            i.dhcp.as_ref().and_then(|d| d.hostname.clone()),
        );
        e.leaf("mac", Some(imac.to_string()));
        e.leaf("vlan-id", i.dhcp.as_ref().and_then(|d| d.vlan_id.clone()));
        macs.push(&imac.to_string(), e);
    }
    let mut interfaces = Node::dir();
    interfaces.push("macs", macs);
    let mut network = Node::dir();
    network.push("interfaces", interfaces);
    md.push("network", network);

    // Hegel's Equinix-flavoured keys.
    let os = inst.and_then(|i| i.operating_system.as_ref());
    let mut osn = Node::dir();
    osn.leaf("distro", os.and_then(|o| o.distro.clone()));
    osn.leaf("image_tag", os.and_then(|o| o.image_tag.clone()));
    osn.leaf(
        "slug",
        os.and_then(|o| o.slug.clone().or_else(|| o.os_slug.clone())),
    );
    osn.leaf("version", os.and_then(|o| o.version.clone()));
    if matches!(&osn, Node::Dir(c) if !c.is_empty()) {
        md.push("operating-system", osn);
    }
    let mut placement = Node::dir();
    placement.leaf(
        "availability-zone",
        facility.and_then(|f| f.facility_code.clone()),
    );
    if matches!(&placement, Node::Dir(c) if !c.is_empty()) {
        md.push("placement", placement);
    }
    md.leaf("plan", facility.and_then(|f| f.plan_slug.clone()));
    md.leaf("facility", facility.and_then(|f| f.facility_code.clone()));
    md.leaf("public-ipv4", instance_ip(m, 4, Some(true)));
    md.leaf("public-ipv6", instance_ip(m, 6, None));

    // public-keys/: "0=key-0", then 0/openssh-key, as EC2 lists them.
    let keys = ssh_keys(m);
    if !keys.is_empty() {
        let mut pk = Node::dir();
        for (n, k) in keys.iter().enumerate() {
            let mut one = Node::dir();
            one.leaf("openssh-key", Some(k.clone()));
            pk.push(&n.to_string(), one);
        }
        md.push("public-keys", pk);
    }
    let tags = inst.map(|i| i.tags.clone()).unwrap_or_default();
    if !tags.is_empty() {
        md.push("tags", Node::Leaf(tags.join("\n")));
    }
    md
}

/// EC2's `public-keys/` listing is `<n>=<name>`, not `<n>/`.
pub fn public_keys_listing(m: &Machine) -> Option<String> {
    let keys = ssh_keys(m);
    if keys.is_empty() {
        return None;
    }
    // cloud-init keys its dict by these names: they must be unique, so a
    // key without a comment, or with one already used, is `key-<n>`.
    let comments: Vec<Option<&str>> = keys.iter().map(|k| k.split_whitespace().nth(2)).collect();
    let mut names: Vec<String> = Vec::with_capacity(keys.len());
    for (n, c) in comments.iter().enumerate() {
        let name = match c {
            Some(c) if !names.iter().any(|x| x == c) => c.to_string(),
            _ => {
                // Also clear of every comment, so a later `key-5` comment
                // cannot collide with a generated name.
                let mut name = format!("key-{n}");
                while names.contains(&name) || comments.contains(&Some(name.as_str())) {
                    name.push('_');
                }
                name
            }
        };
        names.push(name);
    }
    Some(
        names
            .iter()
            .enumerate()
            .map(|(n, name)| format!("{n}={name}"))
            .collect::<Vec<_>>()
            .join("\n"),
    )
}

/// `GET /<version>/meta-data/<path>`: a listing or a value, `None` for 404.
pub fn ec2_get(m: &Machine, ip: IpAddr, path: &str) -> Option<String> {
    if path.trim_matches('/') == "public-keys" {
        return public_keys_listing(m);
    }
    meta_data(m, ip).get(path).map(Node::render)
}

/// `dynamic/instance-identity/document`, which cloud-init reads on AWS:
/// without it, it retries for ~10 s.
pub fn dynamic(m: &Machine, ip: IpAddr) -> Node {
    let iface = requesting_iface(m, ip);
    let facility = m.spec.metadata.as_ref().and_then(|md| md.facility.as_ref());
    let arch = iface
        .and_then(|i| i.dhcp.as_ref()?.arch.clone())
        .unwrap_or_else(|| "x86_64".into());
    let doc = json!({
        "instanceId": instance_id(m),
        "instanceType": facility.and_then(|f| f.plan_slug.clone()),
        "availabilityZone": facility.and_then(|f| f.facility_code.clone()),
        "region": facility.and_then(|f| f.facility_code.clone()),
        "privateIp": instance_ip(m, 4, Some(false)).or_else(|| dhcp_ipv4(iface).map(|(a, _)| a.to_string())),
        "architecture": arch,
    });
    let mut ii = Node::dir();
    ii.leaf(
        "document",
        Some(serde_json::to_string_pretty(&doc).unwrap_or_default()),
    );
    let mut d = Node::dir();
    d.push("instance-identity", ii);
    d
}

/// `/metadata`: the whole instance as JSON, Equinix Metal style (a superset
/// of Hegel's): id, hostname, facility, plan, operating_system, ssh_keys,
/// tags, network (addresses, interfaces), and the raw Hardware metadata.
pub fn metadata_json(m: &Machine, ip: IpAddr) -> Value {
    let iface = requesting_iface(m, ip);
    let inst = instance(m);
    let md = m.spec.metadata.as_ref();
    let facility = md.and_then(|md| md.facility.as_ref());
    let os = inst.and_then(|i| i.operating_system.as_ref());
    let mut addresses: Vec<Value> = inst
        .map(|i| {
            i.ips
                .iter()
                .map(|a| {
                    json!({
                        "address": a.address, "netmask": a.netmask, "gateway": a.gateway,
                        "address_family": a.family.unwrap_or(4), "public": a.public.unwrap_or(false),
                        "management": a.management.unwrap_or(false),
                    })
                })
                .collect()
        })
        .unwrap_or_default();
    if addresses.is_empty() {
        for i in &m.spec.interfaces {
            if let Some(ip) = i.dhcp.as_ref().and_then(|d| d.ip.as_ref()) {
                addresses.push(json!({
                    "address": ip.address, "netmask": ip.netmask, "gateway": ip.gateway,
                    "address_family": ip.family.unwrap_or(4), "public": false, "management": true,
                }));
            }
        }
    }
    let interfaces: Vec<Value> = m
        .spec
        .interfaces
        .iter()
        .enumerate()
        .filter_map(|(n, i)| {
            let mac = iface_mac(i)?;
            Some(json!({"name": i.dhcp.as_ref().and_then(|d| d.iface_name.clone()).unwrap_or_else(|| format!("eth{n}")), "mac": mac.to_string()}))
        })
        .collect();
    json!({
        "id": instance_id(m),
        "hostname": hostname(m, iface),
        "facility": facility.and_then(|f| f.facility_code.clone()),
        "plan": facility.and_then(|f| f.plan_slug.clone()),
        "class": facility.and_then(|f| f.plan_slug.clone()),
        "operating_system": {
            "slug": os.and_then(|o| o.slug.clone().or_else(|| o.os_slug.clone())),
            "distro": os.and_then(|o| o.distro.clone()),
            "version": os.and_then(|o| o.version.clone()),
            "image_tag": os.and_then(|o| o.image_tag.clone()),
        },
        "ssh_keys": ssh_keys(m),
        "tags": inst.map(|i| i.tags.clone()).unwrap_or_default(),
        "state": inst.and_then(|i| i.state.clone()),
        "network": {
            "addresses": addresses,
            "interfaces": interfaces,
            "bonding": {"mode": md.and_then(|md| md.bonding_mode)},
        },
        "storage": inst.and_then(|i| i.storage.clone()),
        "crypted_root_password": Value::Null,
        "metadata": md.map(|md| serde_json::to_value(md).unwrap_or(Value::Null)),
    })
}

/// NoCloud `meta-data` (YAML).
pub fn nocloud_meta_data(m: &Machine, ip: IpAddr) -> String {
    let v = json!({
        "instance-id": instance_id(m),
        "local-hostname": hostname(m, requesting_iface(m, ip)),
        "public-keys": ssh_keys(m),
    });
    serde_saphyr::to_string(&v).unwrap_or_default()
}

/// NoCloud `network-config`: cloud-init network config v2, one ethernet per
/// interface with a MAC, matched by MAC: static when the Hardware has an
/// address, else DHCP.
pub fn nocloud_network_config(m: &Machine) -> String {
    let mut ethernets = serde_json::Map::new();
    for (n, i) in m.spec.interfaces.iter().enumerate() {
        let Some(mac) = iface_mac(i) else { continue };
        let d = i.dhcp.as_ref();
        let name = d
            .and_then(|d| d.iface_name.clone())
            .unwrap_or_else(|| format!("eth{n}"));
        let mut e = json!({"match": {"macaddress": mac.to_string()}, "set-name": name});
        match dhcp_ipv4(Some(i)) {
            Some((addr, mask)) => {
                let prefix = mask.map(|m| u32::from(m).count_ones()).unwrap_or(32);
                e["addresses"] = json!([format!("{addr}/{prefix}")]);
                if let Some(gw) = d
                    .and_then(|d| d.ip.as_ref())
                    .and_then(|ip| ip.gateway.clone())
                    .filter(|g| !g.is_empty())
                {
                    // "0.0.0.0/0", not "default": cloud-init 22.4 rejects the latter.
                    e["routes"] = json!([{"to": "0.0.0.0/0", "via": gw}]);
                }
                let dns = d.map(|d| d.name_servers.clone()).unwrap_or_default();
                let search: Vec<String> =
                    d.and_then(|d| d.domain_name.clone()).into_iter().collect();
                if !dns.is_empty() || !search.is_empty() {
                    e["nameservers"] = json!({"addresses": dns, "search": search});
                }
            }
            None => e["dhcp4"] = json!(true),
        }
        ethernets.insert(name, e);
    }
    serde_saphyr::to_string(&json!({"network": {"version": 2, "ethernets": ethernets}}))
        .unwrap_or_default()
}

#[cfg(test)]
mod tests;
