//! Instance metadata, Hegel-compatible and complete enough for cloud-init:
//! an EC2-style tree (`/<version>/meta-data/...`, `user-data`,
//! `vendor-data`), Equinix-style `/metadata` JSON, and NoCloud under
//! `/cloud-init/`. Everything here is pure: a machine in, documents out.
//! [`http`] finds the machine by source IP and serves them.

pub mod cache;
pub mod http;
pub mod token;

use crate::hardware::spec::{Facility, Instance};
use crate::hardware::view::Details;
use crate::hardware::{Interface, Machine};
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

/// What a metadata answer is rendered from: the machine, the interface the
/// caller is (the one whose address it came from), and the machine's
/// instance details.
#[derive(Clone, Copy)]
pub struct Source<'a> {
    pub machine: &'a Machine,
    pub iface: &'a Interface,
    pub details: &'a Details,
}

impl Source<'_> {
    fn instance(&self) -> Option<&Instance> {
        self.details.metadata.as_ref()?.instance.as_ref()
    }

    fn facility(&self) -> Option<&Facility> {
        self.details.metadata.as_ref()?.facility.as_ref()
    }

    /// `instance.id`, else the Hardware's name: cloud-init needs one.
    pub fn instance_id(&self) -> String {
        self.instance()
            .and_then(|i| i.id.clone())
            .filter(|s| !s.is_empty())
            .unwrap_or_else(|| self.machine.key.name.clone())
    }

    /// `instance.hostname`, else the interface's DHCP hostname, else the
    /// Hardware's name.
    pub fn hostname(&self) -> String {
        self.instance()
            .and_then(|i| i.hostname.clone())
            .filter(|s| !s.is_empty())
            .or_else(|| self.iface.hostname.as_deref().map(str::to_string))
            .unwrap_or_else(|| self.machine.key.name.clone())
    }

    /// An address from `instance.ips` by family and public flag (`None`:
    /// any), as Hegel picks them.
    fn instance_ip(&self, family: i64, public: Option<bool>) -> Option<String> {
        self.instance()?
            .ips
            .iter()
            .find(|a| {
                a.family.unwrap_or(4) == family
                    && public.is_none_or(|p| a.public.unwrap_or(false) == p)
            })
            .and_then(|a| a.address.clone())
    }

    /// The private IPv4 address: `instance.ips`, else the interface's.
    fn local_ipv4(&self) -> Option<String> {
        self.instance_ip(4, Some(false))
            .or_else(|| self.iface.ipv4().map(|a| a.to_string()))
    }

    pub fn ssh_keys(&self) -> Vec<String> {
        self.instance()
            .map(|i| {
                i.ssh_keys
                    .iter()
                    .map(|k| k.trim().to_string())
                    .filter(|k| !k.is_empty())
                    .collect()
            })
            .unwrap_or_default()
    }
}

fn cidr(addr: Ipv4Addr, mask: Ipv4Addr) -> String {
    let bits = u32::from(mask);
    let net = Ipv4Addr::from(u32::from(addr) & bits);
    format!("{net}/{}", bits.count_ones())
}

fn text(s: &Option<Box<str>>) -> Option<String> {
    s.as_deref().map(str::to_string)
}

/// The EC2 `meta-data/` tree.
pub fn meta_data(src: &Source) -> Node {
    let m = src.machine;
    let inst = src.instance();
    let facility = src.facility();
    let host = src.hostname();

    let mut md = Node::dir();
    md.leaf("hostname", Some(host.clone()));
    md.leaf("instance-id", Some(src.instance_id()));
    md.leaf("instance-type", facility.and_then(|f| f.plan_slug.clone()));
    md.leaf("local-hostname", Some(host));
    md.leaf("local-ipv4", src.local_ipv4());
    md.leaf("mac", src.iface.mac.map(|m| m.to_string()));

    // network/interfaces/macs/<mac>/ for every interface with a MAC.
    let mut macs = Node::dir();
    for (n, i) in m.interfaces.iter().enumerate() {
        let Some(imac) = i.mac else { continue };
        let mut e = Node::dir();
        e.leaf("device-number", Some(n.to_string()));
        e.leaf(
            "interface-id",
            Some(format!("eni-{}", imac.to_string().replace(':', ""))),
        );
        if let Some(a) = i.ipv4() {
            e.leaf("local-ipv4s", Some(a.to_string()));
            if let Some(mask) = i.netmask {
                e.leaf("subnet-ipv4-cidr-block", Some(cidr(a, mask)));
            }
        }
        e.leaf("local-hostname", text(&i.hostname));
        e.leaf("mac", Some(imac.to_string()));
        e.leaf("vlan-id", text(&i.extra().vlan_id));
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
    md.leaf("public-ipv4", src.instance_ip(4, Some(true)));
    md.leaf("public-ipv6", src.instance_ip(6, None));

    // public-keys/: "0=key-0", then 0/openssh-key, as EC2 lists them.
    let keys = src.ssh_keys();
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
pub fn public_keys_listing(src: &Source) -> Option<String> {
    let keys = src.ssh_keys();
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
pub fn ec2_get(src: &Source, path: &str) -> Option<String> {
    if path.trim_matches('/') == "public-keys" {
        return public_keys_listing(src);
    }
    meta_data(src).get(path).map(Node::render)
}

/// `dynamic/instance-identity/document`, which cloud-init reads on AWS:
/// without it, it retries for ~10 s.
pub fn dynamic(src: &Source) -> Node {
    let facility = src.facility();
    let arch = src
        .iface
        .extra()
        .arch
        .as_deref()
        .unwrap_or("x86_64")
        .to_string();
    let doc = json!({
        "instanceId": src.instance_id(),
        "instanceType": facility.and_then(|f| f.plan_slug.clone()),
        "availabilityZone": facility.and_then(|f| f.facility_code.clone()),
        "region": facility.and_then(|f| f.facility_code.clone()),
        "privateIp": src.local_ipv4(),
        "architecture": arch,
    });
    let mut ii = Node::dir();
    // A map of strings and options of strings always serialises.
    ii.leaf("document", serde_json::to_string_pretty(&doc).ok());
    let mut d = Node::dir();
    d.push("instance-identity", ii);
    d
}

/// `/metadata`: the whole instance as JSON, Equinix Metal style (a superset
/// of Hegel's): id, hostname, facility, plan, operating_system, ssh_keys,
/// tags, network (addresses, interfaces), and the raw Hardware metadata.
pub fn metadata_json(src: &Source) -> Value {
    let m = src.machine;
    let inst = src.instance();
    let md = src.details.metadata.as_ref();
    let facility = src.facility();
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
        for i in m.interfaces.iter().filter(|i| i.address.is_some()) {
            let family = if matches!(i.address, Some(IpAddr::V6(_))) {
                6
            } else {
                4
            };
            addresses.push(json!({
                "address": i.address, "netmask": i.netmask, "gateway": i.gateway,
                "address_family": family, "public": false, "management": true,
            }));
        }
    }
    let interfaces: Vec<Value> = m
        .interfaces
        .iter()
        .enumerate()
        .filter_map(|(n, i)| {
            let mac = i.mac?;
            Some(json!({"name": iface_name(n, i), "mac": mac.to_string()}))
        })
        .collect();
    json!({
        "id": src.instance_id(),
        "hostname": src.hostname(),
        "facility": facility.and_then(|f| f.facility_code.clone()),
        "plan": facility.and_then(|f| f.plan_slug.clone()),
        "class": facility.and_then(|f| f.plan_slug.clone()),
        "operating_system": {
            "slug": os.and_then(|o| o.slug.clone().or_else(|| o.os_slug.clone())),
            "distro": os.and_then(|o| o.distro.clone()),
            "version": os.and_then(|o| o.version.clone()),
            "image_tag": os.and_then(|o| o.image_tag.clone()),
        },
        "ssh_keys": src.ssh_keys(),
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

/// `iface_name`, else `eth<n>`.
fn iface_name(n: usize, i: &Interface) -> String {
    i.extra()
        .iface_name
        .as_deref()
        .map_or_else(|| format!("eth{n}"), str::to_string)
}

/// A YAML document, or why it could not be made.
fn yaml(v: &Value) -> Result<String, String> {
    serde_saphyr::to_string(v).map_err(|e| e.to_string())
}

/// NoCloud `meta-data` (YAML).
pub fn nocloud_meta_data(src: &Source) -> Result<String, String> {
    yaml(&json!({
        "instance-id": src.instance_id(),
        "local-hostname": src.hostname(),
        "public-keys": src.ssh_keys(),
    }))
}

/// NoCloud `network-config`: cloud-init network config v2, one ethernet per
/// interface with a MAC, matched by MAC: static when the Hardware has an
/// address, else DHCP.
pub fn nocloud_network_config(m: &Machine) -> Result<String, String> {
    let mut ethernets = serde_json::Map::new();
    for (n, i) in m.interfaces.iter().enumerate() {
        let Some(mac) = i.mac else { continue };
        let name = iface_name(n, i);
        let mut e = json!({"match": {"macaddress": mac.to_string()}, "set-name": name});
        match i.ipv4() {
            Some(addr) => {
                let prefix = i.netmask.map(|m| u32::from(m).count_ones()).unwrap_or(32);
                e["addresses"] = json!([format!("{addr}/{prefix}")]);
                if let Some(gw) = i.gateway {
                    // "0.0.0.0/0", not "default": cloud-init 22.4 rejects the latter.
                    e["routes"] = json!([{"to": "0.0.0.0/0", "via": gw.to_string()}]);
                }
                let dns: Vec<String> = i.name_servers.iter().map(|a| a.to_string()).collect();
                let search: Vec<String> = text(&i.extra().domain_name).into_iter().collect();
                if !dns.is_empty() || !search.is_empty() {
                    e["nameservers"] = json!({"addresses": dns, "search": search});
                }
            }
            None => e["dhcp4"] = json!(true),
        }
        ethernets.insert(name, e);
    }
    yaml(&json!({"network": {"version": 2, "ethernets": ethernets}}))
}

#[cfg(test)]
mod tests;
