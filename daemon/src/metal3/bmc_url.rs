//! `spec.bmc.address`: BMO's URL schemes, mapped to the two protocols
//! tinkerbox's BMC runner speaks (IPMI and Redfish), and the Rufio
//! `Machine` connection that says the same.

use serde_json::{Value, json};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Driver {
    Ipmi,
    Redfish,
}

/// A BMC address, understood.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BmcTarget {
    /// The scheme as written (`redfish-virtualmedia+https`), or `ipmi` for
    /// a bare `host[:port]`.
    pub scheme: String,
    pub driver: Driver,
    /// A name or an address (IPv6 without brackets).
    pub host: String,
    pub port: Option<u16>,
    /// Redfish: plain HTTP (`+http`); the default carrier is HTTPS.
    pub plain_http: bool,
    /// Redfish: the system's id, from `/redfish/v1/Systems/<id>`.
    pub system: Option<String>,
    /// BMO needs `bootMACAddress` with this scheme (libvirt's VirtualBMC).
    pub needs_boot_mac: bool,
    /// A virtual-media scheme: tinkerbox still boots the host from the
    /// network (its OSIE is served by iPXE), see the README.
    pub virtual_media: bool,
}

/// The schemes BMO registers at the commit read (`pkg/hardwareutils/bmc`),
/// with their driver; `+http`/`+https` are accepted on the Redfish ones.
const REDFISH_SCHEMES: [(&str, bool); 7] = [
    ("redfish", false),
    ("redfish-virtualmedia", true),
    ("redfish-uefihttp", false),
    ("ilo5-redfish", false),
    ("ilo5-virtualmedia", true),
    ("idrac-redfish", false),
    ("idrac-virtualmedia", true),
];

pub fn parse(address: &str) -> Result<BmcTarget, String> {
    let a = address.trim();
    if a.is_empty() {
        return Err("required".into());
    }
    let (scheme, rest) = match a.split_once("://") {
        Some((s, r)) => (s.to_ascii_lowercase(), r),
        None => ("ipmi".to_string(), a),
    };
    let (base, carrier) = match scheme.split_once('+') {
        Some((b, c)) => (b.to_string(), Some(c.to_string())),
        None => (scheme.clone(), None),
    };
    let url = url::Url::parse(&format!("bmc://{rest}"))
        .map_err(|e| format!("{a:?} is not a valid BMC address: {e}"))?;
    let host = match url.host() {
        Some(url::Host::Domain(d)) => d.to_string(),
        Some(url::Host::Ipv4(h)) => h.to_string(),
        Some(url::Host::Ipv6(h)) => h.to_string(),
        None => return Err(format!("{a:?} names no host")),
    };
    if !url.username().is_empty() || url.password().is_some() {
        return Err(format!(
            "{a:?}: credentials go in the Secret credentialsName names, not in the address"
        ));
    }
    let port = url.port();
    match base.as_str() {
        "ipmi" | "libvirt" => {
            if carrier.is_some() {
                return Err(format!("{scheme}://: {base} takes no +http/+https"));
            }
            Ok(BmcTarget {
                needs_boot_mac: base == "libvirt",
                scheme,
                driver: Driver::Ipmi,
                host,
                port,
                plain_http: false,
                system: None,
                virtual_media: false,
            })
        }
        b => {
            let Some((_, vm)) = REDFISH_SCHEMES.iter().find(|(s, _)| *s == b) else {
                return Err(format!(
                    "scheme {scheme}:// is not one BMO supports (ipmi, libvirt, redfish, redfish-virtualmedia, \
                     redfish-uefihttp, ilo5-redfish, ilo5-virtualmedia, idrac-redfish, idrac-virtualmedia, \
                     each Redfish one with +http or +https)"
                ));
            };
            let plain_http = match carrier.as_deref() {
                None | Some("https") => false,
                Some("http") => true,
                Some(c) => return Err(format!("{scheme}://: +{c} is neither +http nor +https")),
            };
            let path = url.path().trim_end_matches('/');
            let system = match path {
                "" | "/redfish/v1" => None,
                p => match p.strip_prefix("/redfish/v1/Systems/") {
                    Some(id) if !id.is_empty() && !id.contains('/') => Some(id.to_string()),
                    _ => {
                        return Err(format!(
                            "{a:?}: the path must be a system, /redfish/v1/Systems/<id>"
                        ));
                    }
                },
            };
            Ok(BmcTarget {
                scheme,
                driver: Driver::Redfish,
                host,
                port,
                plain_http,
                system,
                needs_boot_mac: false,
                virtual_media: *vm,
            })
        }
    }
}

impl BmcTarget {
    /// Rufio's `spec.connection` for this BMC, with credentials from
    /// Secret `secret` in `namespace`. Only this target's protocol is
    /// tried: a Redfish URL never falls back to IPMI.
    pub fn connection(&self, secret: &str, namespace: &str, insecure_tls: bool) -> Value {
        let host = if self.host.contains(':') {
            format!("[{}]", self.host)
        } else {
            self.host.clone()
        };
        let auth = json!({"name": secret, "namespace": namespace});
        match self.driver {
            Driver::Ipmi => {
                let mut c = json!({
                    "host": self.host,
                    "authSecretRef": auth,
                    "insecureTLS": insecure_tls,
                    "providerOptions": {"preferredOrder": ["ipmitool"]},
                });
                if let Some(p) = self.port {
                    c["port"] = json!(p);
                    c["providerOptions"]["ipmitool"] = json!({"port": p});
                }
                c
            }
            Driver::Redfish => {
                let scheme = if self.plain_http { "http" } else { "https" };
                let url = match self.port {
                    Some(p) => format!("{scheme}://{host}:{p}"),
                    None => format!("{scheme}://{host}"),
                };
                let mut redfish = json!({});
                if let Some(s) = &self.system {
                    redfish["systemName"] = json!(s);
                }
                json!({
                    "host": url,
                    "authSecretRef": auth,
                    "insecureTLS": insecure_tls,
                    // bmclib's name for its Redfish provider: the only one
                    // Rufio's CRD takes.
                    "providerOptions": {"preferredOrder": ["gofish"], "redfish": redfish},
                })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_scheme_bmo_registers() {
        let t = parse("ipmi://10.0.0.5:6230").unwrap();
        assert_eq!(
            (t.driver, t.host.as_str(), t.port),
            (Driver::Ipmi, "10.0.0.5", Some(6230))
        );
        let t = parse("10.0.0.5").unwrap();
        assert_eq!((t.driver, t.port), (Driver::Ipmi, None));
        assert!(parse("libvirt://10.0.0.5:6230/").unwrap().needs_boot_mac);
        let t = parse("redfish+http://[fd00::5]:8000/redfish/v1/Systems/vm-1").unwrap();
        assert_eq!(
            (
                t.driver,
                t.host.as_str(),
                t.port,
                t.plain_http,
                t.system.as_deref()
            ),
            (Driver::Redfish, "fd00::5", Some(8000), true, Some("vm-1"))
        );
        let t = parse("redfish-virtualmedia://bmc.example/redfish/v1/Systems/1").unwrap();
        assert!(t.virtual_media && !t.plain_http);
        for s in [
            "redfish-uefihttp+https://h/redfish/v1/Systems/1",
            "ilo5-redfish://h",
            "ilo5-virtualmedia://h/redfish/v1/Systems/1",
            "idrac-redfish://h/redfish/v1/Systems/System.Embedded.1",
            "idrac-virtualmedia+https://h/redfish/v1/Systems/System.Embedded.1",
        ] {
            assert_eq!(parse(s).unwrap().driver, Driver::Redfish, "{s}");
        }
    }

    #[test]
    fn what_bmo_refuses() {
        for s in [
            "",
            "idrac://h",
            "irmc://h",
            "ilo4://h",
            "ipmi+https://h",
            "redfish+ftp://h",
            "redfish://h/other/path",
            "redfish://user:pw@h",
        ] {
            assert!(parse(s).is_err(), "{s}");
        }
    }

    #[test]
    fn the_rufio_connection() {
        let c = parse("redfish+http://10.0.0.1:8000/redfish/v1/Systems/vm-1")
            .unwrap()
            .connection("creds", "lab", false);
        assert_eq!(
            c,
            json!({"host": "http://10.0.0.1:8000", "authSecretRef": {"name": "creds", "namespace": "lab"},
                   "insecureTLS": false,
                   "providerOptions": {"preferredOrder": ["gofish"], "redfish": {"systemName": "vm-1"}}})
        );
        let c = parse("ipmi://10.0.0.1:6230")
            .unwrap()
            .connection("creds", "lab", true);
        assert_eq!(c["port"], json!(6230));
        assert_eq!(c["providerOptions"]["ipmitool"]["port"], json!(6230));
        // The connection is one Rufio's checker takes.
        let doc = json!({"apiVersion": "bmc.tinkerbell.org/v1alpha1", "kind": "Machine",
                         "metadata": {"name": "m", "namespace": "lab"}, "spec": {"connection": c}});
        crate::bmc::model::parse(doc).unwrap();
    }
}
