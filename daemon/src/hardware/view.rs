//! The typed read view of a Hardware: what every hot path (DHCP, TFTP,
//! iPXE, metadata, syslog, the BMC runner) reads, parsed once when the
//! Hardware enters the inventory, in the manner of Tinkerbell's `pkg/data`.
//!
//! Addresses, masks, MACs and the netboot policy are typed here and nowhere
//! else: [`Interface::from_spec`] is the one place an interface's strings
//! become addresses, and validation ([`super::validate`]) calls it too, so
//! what is accepted is exactly what the hot paths can use.
//!
//! What only the metadata service and the iPXE script read (instance data,
//! user data) stays as compact JSON ([`Machine::details`]), parsed when an
//! answer is rendered: kept typed, 100,000 machines' worth of mostly empty
//! `Option<String>`s would not fit the memory budget.

use super::spec::{self, BmcRef, HardwareMetadata};
use super::{FieldError, Key, Mac};
use ipnet::Ipv4Net;
use serde::Deserialize;
use serde::de::{MapAccess, Visitor};
use serde_json::value::RawValue;
use std::net::{IpAddr, Ipv4Addr};
use std::sync::LazyLock;

/// The firmware a Hardware says an interface boots with (`dhcp.uefi`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Firmware {
    #[default]
    Unspecified,
    Bios,
    Uefi,
}

/// One interface, typed.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Interface {
    pub mac: Option<Mac>,
    /// The reserved address (`dhcp.ip.address`).
    pub address: Option<IpAddr>,
    pub netmask: Option<Ipv4Addr>,
    pub gateway: Option<IpAddr>,
    pub name_servers: Box<[IpAddr]>,
    pub hostname: Option<Box<str>>,
    /// Seconds, at least 60.
    pub lease_time: Option<u32>,
    pub disable_dhcp: bool,
    /// `netboot.allowPXE: true`.
    pub allow_pxe: bool,
    /// `netboot.allowWorkflow: true`.
    pub allow_workflow: bool,
    pub firmware: Firmware,
    /// The fields few Hardware set, boxed so that an interface without
    /// them stays small (a pointer instead of ~200 bytes).
    extra: Option<Box<Extra>>,
}

/// Rarely set interface fields.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Extra {
    pub domain_name: Option<Box<str>>,
    pub time_servers: Box<[IpAddr]>,
    pub routes: Box<[(Ipv4Net, Ipv4Addr)]>,
    pub vlan_id: Option<Box<str>>,
    pub arch: Option<Box<str>>,
    pub iface_name: Option<Box<str>>,
    pub ipxe_binary: Option<Box<str>>,
    pub ipxe_url: Option<Box<str>>,
    pub ipxe_contents: Option<Box<str>>,
    pub osie_base_url: Option<Box<str>>,
    pub osie_kernel: Option<Box<str>>,
    pub osie_initrd: Option<Box<str>>,
    pub osie_kernel_params: Box<[Box<str>]>,
}

static NO_EXTRA: LazyLock<Extra> = LazyLock::new(Extra::default);

impl Interface {
    /// The rarely set fields (all empty when none is set).
    pub fn extra(&self) -> &Extra {
        self.extra.as_deref().unwrap_or(&NO_EXTRA)
    }

    /// An interface with nothing set.
    pub fn none() -> &'static Interface {
        static NONE: LazyLock<Interface> = LazyLock::new(Interface::default);
        &NONE
    }

    pub fn ipv4(&self) -> Option<Ipv4Addr> {
        match self.address {
            Some(IpAddr::V4(a)) => Some(a),
            _ => None,
        }
    }

    /// Type the interface `i` of a spec; errors name the field
    /// (`spec.interfaces[i].dhcp.ip.address`).
    pub fn from_spec(i: usize, s: &spec::Interface) -> Result<Interface, FieldError> {
        let netboot = s.netboot.as_ref();
        let mut out = Interface {
            disable_dhcp: s.disable_dhcp,
            allow_pxe: netboot.and_then(|n| n.allow_pxe) == Some(true),
            allow_workflow: netboot.and_then(|n| n.allow_workflow) == Some(true),
            ..Interface::default()
        };
        let mut extra = Extra::default();
        if let Some(n) = netboot {
            extra.netboot(n);
        }
        if let Some(d) = &s.dhcp {
            out.dhcp(i, d, &mut extra)?;
        }
        if extra != Extra::default() {
            out.extra = Some(Box::new(extra));
        }
        Ok(out)
    }
}

impl Extra {
    fn netboot(&mut self, n: &spec::Netboot) {
        let ipxe = n.ipxe.as_ref();
        self.ipxe_binary = text(ipxe.and_then(|x| x.binary.as_deref()));
        self.ipxe_url = text(ipxe.and_then(|x| x.url.as_deref()));
        self.ipxe_contents = text(ipxe.and_then(|x| x.contents.as_deref()));
        let osie = n.osie.as_ref();
        self.osie_base_url = text(osie.and_then(|o| o.base_url.as_deref()));
        self.osie_kernel = text(osie.and_then(|o| o.kernel.as_deref()));
        self.osie_initrd = text(osie.and_then(|o| o.initrd.as_deref()));
        self.osie_kernel_params = osie
            .map(|o| o.kernel_params.iter().map(|p| p.as_str().into()).collect())
            .unwrap_or_default();
    }
}

impl Interface {
    /// The `dhcp` part of interface `i`.
    fn dhcp(&mut self, i: usize, d: &spec::Dhcp, extra: &mut Extra) -> Result<(), FieldError> {
        let at = |f: &str| format!("spec.interfaces[{i}].dhcp.{f}");
        if let Some(m) = d.mac.as_deref() {
            self.mac =
                Some(m.parse().map_err(|e: super::mac::MacError| {
                    FieldError::new(at("mac"), e.to_string())
                })?);
        }
        if let Some(ip) = &d.ip {
            self.address = addr(&ip.address, || at("ip.address"))?;
            self.gateway = addr(&ip.gateway, || at("ip.gateway"))?;
            if let Some(n) = trimmed(&ip.netmask) {
                self.netmask = Some(netmask(n).map_err(|m| FieldError::new(at("ip.netmask"), m))?);
            }
            if let Some(f) = ip.family
                && f != 4
                && f != 6
            {
                return Err(FieldError::new(
                    at("ip.family"),
                    format!("must be 4 or 6, got {f}"),
                ));
            }
        }
        self.name_servers = addrs(&d.name_servers, || at("name_servers"))?;
        extra.time_servers = addrs(&d.time_servers, || at("time_servers"))?;
        extra.routes = d
            .classless_static_routes
            .iter()
            .enumerate()
            .map(|(j, r)| {
                let f = at(&format!("classless_static_routes[{j}]"));
                let dest = r
                    .destination_descriptor
                    .trim()
                    .parse::<Ipv4Net>()
                    .map_err(|_| {
                        FieldError::new(
                            format!("{f}.destination_descriptor"),
                            format!(
                                "invalid IPv4 CIDR {:?} (want a.b.c.d/n)",
                                r.destination_descriptor
                            ),
                        )
                    })?;
                let router = r.router.trim().parse::<Ipv4Addr>().map_err(|_| {
                    FieldError::new(
                        format!("{f}.router"),
                        format!("invalid IPv4 address {:?}", r.router),
                    )
                })?;
                Ok((dest, router))
            })
            .collect::<Result<_, FieldError>>()?;
        if let Some(v) = trimmed(&d.vlan_id) {
            vlan_ids(v).map_err(|m| FieldError::new(at("vlan_id"), m))?;
            extra.vlan_id = Some(v.into());
        }
        if let Some(t) = d.lease_time {
            if t < 0 {
                return Err(FieldError::new(
                    at("lease_time"),
                    format!("must not be negative, got {t}"),
                ));
            }
            self.lease_time = Some(t.clamp(60, i64::from(u32::MAX)) as u32);
        }
        self.hostname = text(d.hostname.as_deref());
        self.firmware = match d.uefi {
            Some(true) => Firmware::Uefi,
            Some(false) => Firmware::Bios,
            None => Firmware::Unspecified,
        };
        extra.domain_name = text(d.domain_name.as_deref());
        extra.arch = text(d.arch.as_deref());
        extra.iface_name = text(d.iface_name.as_deref());
        Ok(())
    }
}

fn text(s: Option<&str>) -> Option<Box<str>> {
    s.filter(|s| !s.trim().is_empty()).map(Box::from)
}

fn trimmed(s: &Option<String>) -> Option<&str> {
    s.as_deref().map(str::trim).filter(|s| !s.is_empty())
}

/// `field` names the field only on error: formatting it for every
/// address was 3% of start-up at 100,000 Hardware.
fn addr(s: &Option<String>, field: impl Fn() -> String) -> Result<Option<IpAddr>, FieldError> {
    trimmed(s)
        .map(|a| {
            a.parse()
                .map_err(|_| FieldError::new(field(), format!("invalid IP address {a:?}")))
        })
        .transpose()
}

fn addrs(list: &[String], field: impl Fn() -> String) -> Result<Box<[IpAddr]>, FieldError> {
    list.iter()
        .enumerate()
        .map(|(j, s)| {
            s.trim().parse().map_err(|_| {
                FieldError::new(
                    format!("{}[{j}]", field()),
                    format!("invalid IP address {s:?}"),
                )
            })
        })
        .collect()
}

fn netmask(s: &str) -> Result<Ipv4Addr, String> {
    let m: Ipv4Addr = s.parse().map_err(|_| format!("invalid netmask {s:?}"))?;
    let bits = u32::from(m);
    if bits.leading_ones() + bits.trailing_zeros() != 32 {
        return Err(format!("netmask {s:?} is not contiguous"));
    }
    Ok(m)
}

fn vlan_ids(s: &str) -> Result<(), String> {
    for part in s.split(',') {
        let v: u16 = part
            .trim()
            .parse()
            .map_err(|_| format!("invalid VLAN id {part:?} in {s:?}"))?;
        if v > 4096 {
            return Err(format!("VLAN id {v} out of range 0-4096"));
        }
    }
    Ok(())
}

/// A Hardware as the inventory holds it.
#[derive(Debug, Clone, PartialEq)]
pub struct Machine {
    pub key: Key,
    pub interfaces: Box<[Interface]>,
    /// `spec.agentID`: the worker id the OSIE reports as.
    pub agent_id: Option<Box<str>>,
    /// `spec.bmcRef.name`: the BMC Machine (same namespace) that powers it.
    pub bmc: Option<Box<str>>,
    /// `spec.auto.enrollmentEnabled`: WorkflowRuleSets may enroll it.
    pub auto_enroll: bool,
    /// `{"metadata": ..., "userData": ..., "vendorData": ...}` as stored
    /// (only the members present), for [`Machine::details`].
    details: Box<str>,
}

/// What the metadata service reads besides the interfaces.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Details {
    #[serde(default)]
    pub metadata: Option<HardwareMetadata>,
    #[serde(default)]
    pub user_data: Option<String>,
    #[serde(default)]
    pub vendor_data: Option<String>,
}

/// The members of a stored spec the view takes: interfaces typed, the
/// detail members kept as their JSON text.
struct SpecParts {
    interfaces: Vec<spec::Interface>,
    agent_id: Option<String>,
    bmc_ref: Option<BmcRef>,
    auto: Option<Auto>,
    details: String,
}

/// `spec.auto`.
#[derive(Deserialize)]
struct Auto {
    #[serde(rename = "enrollmentEnabled", default)]
    enrollment_enabled: Option<bool>,
}

impl<'de> Deserialize<'de> for SpecParts {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = SpecParts;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a Hardware spec (a mapping)")
            }
            fn visit_unit<E>(self) -> Result<SpecParts, E> {
                Ok(SpecParts {
                    interfaces: vec![],
                    agent_id: None,
                    bmc_ref: None,
                    auto: None,
                    details: String::new(),
                })
            }
            fn visit_map<A: MapAccess<'de>>(self, mut m: A) -> Result<SpecParts, A::Error> {
                let mut p = self.visit_unit()?;
                while let Some(k) = m.next_key::<std::borrow::Cow<'de, str>>()? {
                    match k.as_ref() {
                        "interfaces" => {
                            p.interfaces = m
                                .next_value::<Option<Vec<spec::Interface>>>()?
                                .unwrap_or_default();
                        }
                        "agentID" => p.agent_id = m.next_value()?,
                        "bmcRef" => p.bmc_ref = m.next_value()?,
                        "auto" => p.auto = m.next_value()?,
                        "metadata" | "userData" | "vendorData" => {
                            let raw: &'de RawValue = m.next_value()?;
                            p.details.push(if p.details.is_empty() { '{' } else { ',' });
                            p.details.push('"');
                            p.details.push_str(&k);
                            p.details.push_str("\":");
                            p.details.push_str(raw.get());
                        }
                        _ => {
                            m.next_value::<serde::de::IgnoredAny>()?;
                        }
                    }
                }
                if !p.details.is_empty() {
                    p.details.push('}');
                }
                Ok(p)
            }
        }
        d.deserialize_any(V)
    }
}

#[derive(Deserialize)]
struct Stored {
    #[serde(default)]
    spec: Option<SpecParts>,
}

impl Machine {
    /// The view of a Hardware document (JSON text, as stored): the start-up
    /// path and the apply path both come here. Errors name the field.
    pub fn from_doc(key: Key, doc: &str) -> Result<Machine, FieldError> {
        let stored: Stored = serde_json::from_str(doc)
            .map_err(|e| FieldError::new("spec", format!("does not parse: {e}")))?;
        let parts = stored.spec.unwrap_or_else(|| SpecParts {
            interfaces: vec![],
            agent_id: None,
            bmc_ref: None,
            auto: None,
            details: String::new(),
        });
        let mut interfaces = Vec::with_capacity(parts.interfaces.len());
        for (i, s) in parts.interfaces.iter().enumerate() {
            let iface = Interface::from_spec(i, s)?;
            if let Some(mac) = iface.mac
                && interfaces.iter().any(|o: &Interface| o.mac == Some(mac))
            {
                return Err(FieldError::new(
                    format!("spec.interfaces[{i}].dhcp.mac"),
                    format!("{mac} is used by another interface of this Hardware"),
                ));
            }
            interfaces.push(iface);
        }
        Ok(Machine {
            key,
            interfaces: interfaces.into(),
            agent_id: text(parts.agent_id.as_deref()),
            bmc: parts.bmc_ref.map(|r| r.name.into()),
            auto_enroll: parts
                .auto
                .and_then(|a| a.enrollment_enabled)
                .unwrap_or(false),
            details: parts.details.into(),
        })
    }

    /// A machine with nothing but its name: what a stored document that no
    /// longer parses becomes (it is listed, but boots nothing).
    pub fn empty(key: Key) -> Machine {
        Machine {
            key,
            interfaces: Box::new([]),
            agent_id: None,
            bmc: None,
            auto_enroll: false,
            details: "".into(),
        }
    }

    /// The MACs the machine is found by.
    pub fn macs(&self) -> impl Iterator<Item = Mac> + '_ {
        self.interfaces.iter().filter_map(|i| i.mac)
    }

    /// The addresses the machine is found by (each once).
    pub fn ips(&self) -> impl Iterator<Item = IpAddr> + '_ {
        self.interfaces.iter().enumerate().filter_map(|(n, i)| {
            let a = i.address?;
            // The first interface with this address owns it.
            (!self.interfaces[..n].iter().any(|o| o.address == Some(a))).then_some(a)
        })
    }

    pub fn interface(&self, mac: Mac) -> Option<&Interface> {
        self.interfaces.iter().find(|i| i.mac == Some(mac))
    }

    /// Instance metadata and user data, parsed from the stored JSON. That
    /// was checked when it was applied, so it parses; should it not (a
    /// database edited by hand, a schema made stricter since), the machine
    /// answers as if it had none, and the log says why.
    pub fn details(&self) -> Details {
        if self.details.is_empty() {
            return Details::default();
        }
        serde_json::from_str(&self.details).unwrap_or_else(|e| {
            tracing::error!(hardware = %self.key, error = %e, "inventory: stored metadata does not parse");
            Details::default()
        })
    }

    /// Bytes held on the heap besides the key, roughly: for sizing.
    pub fn heap_len(&self) -> usize {
        self.details.len()
            + self.interfaces.len() * std::mem::size_of::<Interface>()
            + self
                .interfaces
                .iter()
                .map(|i| {
                    i.name_servers.len() * std::mem::size_of::<IpAddr>()
                        + i.hostname.as_ref().map_or(0, |h| h.len())
                        + i.extra.as_ref().map_or(0, |_| std::mem::size_of::<Extra>())
                })
                .sum::<usize>()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hardware::{self, validate};
    use serde_json::json;

    fn hw(spec: serde_json::Value) -> hardware::Hardware {
        validate(
            json!({"apiVersion": hardware::API_VERSION, "kind": "Hardware",
                        "metadata": {"name": "m1"}, "spec": spec}),
        )
        .unwrap()
    }

    #[test]
    fn interfaces_are_typed_once() {
        let h = hw(json!({
            "agentID": "agent-7",
            "bmcRef": {"kind": "Machine", "name": "bmc-1"},
            "interfaces": [
                {"dhcp": {"mac": "52-54-00-AA-BB-CC", "hostname": "h1", "lease_time": 5,
                    "ip": {"address": " 10.0.0.5 ", "netmask": "255.255.255.0", "gateway": "10.0.0.1"},
                    "name_servers": ["10.0.0.1", "2001:db8::53"], "uefi": true,
                    "classless_static_routes": [{"destination_descriptor": "10.1.0.0/16", "router": "10.0.0.254"}]},
                 "netboot": {"allowPXE": true, "ipxe": {"url": "http://x/y.ipxe"},
                    "osie": {"kernelParams": ["a=1"]}}},
                {"dhcp": {"mac": "52:54:00:aa:bb:cd", "ip": {"address": "fd00::5"}}, "disableDhcp": true},
                {"netboot": {"allowPXE": false}}
            ],
            "metadata": {"instance": {"id": "i-1"}},
            "userData": "#cloud-config\n",
            "disks": [{"device": "/dev/sda"}]
        }));
        let m = &h.machine;
        assert_eq!(m.key, Key::new("default", "m1"));
        assert_eq!(m.agent_id.as_deref(), Some("agent-7"));
        assert_eq!(m.bmc.as_deref(), Some("bmc-1"));
        let i = &m.interfaces[0];
        assert_eq!(i.mac, Some("52:54:00:aa:bb:cc".parse().unwrap()));
        assert_eq!(i.ipv4(), Some(Ipv4Addr::new(10, 0, 0, 5)));
        assert_eq!(i.netmask, Some(Ipv4Addr::new(255, 255, 255, 0)));
        assert_eq!(i.gateway, Some("10.0.0.1".parse().unwrap()));
        assert_eq!(i.name_servers.len(), 2);
        assert_eq!(i.lease_time, Some(60), "clamped to a minute");
        assert_eq!(i.firmware, Firmware::Uefi);
        assert!(i.allow_pxe && !i.allow_workflow && !i.disable_dhcp);
        assert_eq!(i.extra().ipxe_url.as_deref(), Some("http://x/y.ipxe"));
        assert_eq!(&*i.extra().osie_kernel_params, &["a=1".into()]);
        assert_eq!(i.extra().routes[0].0.to_string(), "10.1.0.0/16");
        let v6 = &m.interfaces[1];
        assert_eq!(v6.ipv4(), None);
        assert!(v6.disable_dhcp && v6.extra.is_none());
        assert_eq!(m.interfaces[2], Interface::default());
        assert_eq!(m.macs().count(), 2);
        assert_eq!(
            m.ips().map(|a| a.to_string()).collect::<Vec<_>>(),
            ["10.0.0.5", "fd00::5"]
        );
        let d = m.details();
        assert_eq!(d.user_data.as_deref(), Some("#cloud-config\n"));
        assert_eq!(
            d.metadata.unwrap().instance.unwrap().id.as_deref(),
            Some("i-1")
        );
    }

    #[test]
    fn stored_and_applied_give_one_view() {
        let h = hw(
            json!({"interfaces": [{"dhcp": {"mac": "52:54:00:00:00:01"}}],
            "userData": "x", "unknown": {"interfaces": 5}}),
        );
        // Spaced out, the spec not first, members in another order.
        let text = serde_json::to_string_pretty(&json!({"spec": {
            "userData": "x", "unknown": [1, {"}": "]"}],
            "interfaces": [{"dhcp": {"mac": "52:54:00:00:00:01"}}]}, "kind": "Hardware"}))
        .unwrap();
        let again = Machine::from_doc(h.machine.key.clone(), &text).unwrap();
        assert_eq!(again.interfaces, h.machine.interfaces);
        assert_eq!(again.details(), h.machine.details());
        for empty in ["{}", "{\"spec\": null}", "{\"spec\": {}}"] {
            let m = Machine::from_doc(Key::new("a", "b"), empty).unwrap();
            assert!(m.interfaces.is_empty() && m.details() == Details::default());
        }
        for bad in ["", "{\"spec\": {\"interfaces\": 5}}", "{\"spec\": 3}"] {
            assert!(Machine::from_doc(Key::new("a", "b"), bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn typical_machine_is_small() {
        let h = hw(
            json!({"interfaces": [{"dhcp": {"mac": "02:00:00:01:86:9f", "hostname": "m99999",
            "lease_time": 86400, "name_servers": ["10.0.0.1"],
            "ip": {"address": "10.1.134.159", "netmask": "255.0.0.0", "gateway": "10.0.0.1"}},
            "netboot": {"allowPXE": true, "allowWorkflow": true}}],
            "metadata": {"instance": {"id": "m99999", "hostname": "m99999"}}}),
        );
        assert!(h.machine.interfaces[0].extra.is_none());
        assert!(
            std::mem::size_of::<Interface>() <= 128,
            "{}",
            std::mem::size_of::<Interface>()
        );
        assert!(h.machine.heap_len() < 250, "{}", h.machine.heap_len());
    }
}
