//! Per-machine iPXE scripts, pure: a machine and the boot settings in, the
//! script text out. The default script boots the OSIE (HookOS) with the
//! kernel parameters Smee gives it, with bounded retries at every step.

use crate::hardware::{Interface, Mac, Machine};

/// What every script needs besides the machine.
#[derive(Debug, Clone)]
pub struct ScriptSettings {
    /// `http://<public_ip>:<port>`.
    pub http_base: String,
    /// Goes into `syslog_host=`.
    pub syslog_host: String,
    /// `grpc_authority=` (Tink server).
    pub tink_server: String,
    pub tink_tls: bool,
    /// After Smee's parameters, before the Hardware's own.
    pub extra_kernel_args: Vec<String>,
}

#[derive(Debug, PartialEq, Eq)]
pub enum NoScript {
    /// `netboot.allowPXE` is not true for this interface.
    NotAllowed,
    /// The interface has no MAC (found by an address of an interface
    /// without one).
    NoMac,
}

/// Retries per step, and seconds between them (as Smee's defaults).
const RETRIES: u32 = 10;
const RETRY_DELAY: u32 = 2;

/// A value from a Hardware as one iPXE token: it must not smuggle in more
/// kernel parameters or iPXE syntax. Gone: whitespace and control
/// characters (new tokens, new lines), `$` (setting expansion), quotes,
/// `\` (iPXE's escape: a trailing one would join the next token or line)
/// and `#` (a token starting with it comments out the rest of the line,
/// the `&& goto` that retries a failed download included); and a value
/// that is a separator (`&&`, `||`, `;`) as a whole.
fn param_safe(s: &str) -> String {
    let t: String = s
        .chars()
        .filter(|c| {
            !c.is_whitespace() && !c.is_control() && !matches!(c, '$' | '"' | '\'' | '\\' | '#')
        })
        .collect();
    // A token that is one of iPXE's command separators would end the
    // command there and start another.
    if matches!(t.as_str(), "&&" | "||" | ";") {
        String::new()
    } else {
        t
    }
}

/// The script for interface `iface` of machine `m`.
pub fn script(m: &Machine, iface: &Interface, s: &ScriptSettings) -> Result<String, NoScript> {
    let mac = iface.mac.ok_or(NoScript::NoMac)?;
    if !iface.allow_pxe {
        return Err(NoScript::NotAllowed);
    }
    let extra = iface.extra();
    if let Some(contents) = extra.ipxe_contents.as_deref() {
        // The Hardware's own script, as is (with the header iPXE needs:
        // first in the file, so whitespace before it goes).
        let trimmed = contents.trim_start();
        return Ok(if trimmed.starts_with("#!ipxe") {
            trimmed.to_string()
        } else {
            format!("#!ipxe\n{contents}")
        });
    }
    if let Some(url) = extra.ipxe_url.as_deref() {
        // The URL goes through `param_safe` on the echo line too: raw, a
        // newline or ` && shell` in it was a command of its own.
        let url = param_safe(url);
        return Ok(format!(
            "#!ipxe\necho tinkerbox: chaining {url}\nchain --autofree {url} || goto failed\n:failed\necho tinkerbox: chain failed\nexit 1\n"
        ));
    }
    Ok(osie_script(m, mac, iface, s))
}

fn osie_script(m: &Machine, mac: Mac, iface: &Interface, s: &ScriptSettings) -> String {
    let extra = iface.extra();
    let facility = m
        .details()
        .metadata
        .and_then(|md| md.facility)
        .and_then(|f| f.facility_code)
        .map(|f| param_safe(&f))
        .unwrap_or_default();
    let key = m.key.to_string();
    osie(
        &Osie {
            label: &key,
            mac,
            base_url: extra.osie_base_url.as_deref(),
            kernel: extra.osie_kernel.as_deref(),
            initrd: extra.osie_initrd.as_deref(),
            facility: &facility,
            worker_id: m.agent_id.as_deref(),
            vlan_id: extra.vlan_id.as_deref(),
            kernel_params: &extra.osie_kernel_params,
        },
        s,
    )
}

/// The default OSIE script for a MAC no Hardware has (discovery, or
/// auto-proxy): Smee's static script, `worker_id` and `hw_addr` the MAC.
pub fn discovery_script(mac: Mac, s: &ScriptSettings) -> String {
    osie(
        &Osie {
            label: "an unknown machine",
            mac,
            base_url: None,
            kernel: None,
            initrd: None,
            facility: "",
            worker_id: None,
            vlan_id: None,
            kernel_params: &[],
        },
        s,
    )
}

/// What the OSIE script takes from a Hardware; every value is made
/// [`param_safe`] here.
struct Osie<'a> {
    /// Who the script is for, in its comment and echo line.
    label: &'a str,
    mac: Mac,
    base_url: Option<&'a str>,
    kernel: Option<&'a str>,
    initrd: Option<&'a str>,
    /// Already `param_safe`.
    facility: &'a str,
    /// Unset: the MAC.
    worker_id: Option<&'a str>,
    vlan_id: Option<&'a str>,
    kernel_params: &'a [Box<str>],
}

fn osie(o: &Osie, s: &ScriptSettings) -> String {
    let mac = o.mac;
    let base = o
        .base_url
        .map(|b| param_safe(b.trim_end_matches('/')))
        .unwrap_or_else(|| format!("{}/artifacts", s.http_base));
    let kernel = o
        .kernel
        .map(param_safe)
        .unwrap_or_else(|| "vmlinuz-${arch}".into());
    let initrd = o
        .initrd
        .map(param_safe)
        .unwrap_or_else(|| "initramfs-${arch}".into());
    let facility = o.facility;
    let worker_id = o
        .worker_id
        .map(param_safe)
        .unwrap_or_else(|| mac.to_string());
    let vlan = o
        .vlan_id
        .map(|v| format!(" vlan_id={}", param_safe(v)))
        .unwrap_or_default();
    let mut params = format!(
        "facility={facility} syslog_host={} grpc_authority={} tinkerbell_tls={} worker_id={worker_id} hw_addr={mac}{vlan} modules=loop,squashfs,sd-mod,usb-storage initrd={initrd}",
        param_safe(&s.syslog_host),
        param_safe(&s.tink_server),
        s.tink_tls,
    );
    for p in s
        .extra_kernel_args
        .iter()
        .map(String::as_str)
        .chain(o.kernel_params.iter().map(|p| &**p))
    {
        let p = param_safe(p);
        if !p.is_empty() {
            params.push(' ');
            params.push_str(&p);
        }
    }
    let mac = mac.to_string();
    let retries = RETRIES.to_string();
    let delay = RETRY_DELAY.to_string();
    render(
        OSIE_TEMPLATE,
        &[
            ("machine", o.label),
            ("mac", &mac),
            ("base_url", &base),
            ("kernel", &kernel),
            ("initrd", &initrd),
            ("params", &params),
            ("retries", &retries),
            ("retry_delay", &delay),
        ],
    )
}

/// The default script: `ipxe/osie.ipxe` at the top of the repository.
const OSIE_TEMPLATE: &str = include_str!("../../../ipxe/osie.ipxe");

/// Fill `{{name}}` placeholders in one pass over the template, so that a
/// value is never read as a template itself (a Hardware field holding
/// `{{params}}` stays that text). Unknown names are left as they are.
/// Hand-written: a template engine for eight plain substitutions would be
/// the larger risk.
pub fn render(template: &str, values: &[(&str, &str)]) -> String {
    let mut out = String::with_capacity(template.len() + 256);
    let mut rest = template;
    while let Some(open) = rest.find("{{") {
        out.push_str(&rest[..open]);
        let after = &rest[open + 2..];
        let value = after.find("}}").and_then(|close| {
            let name = &after[..close];
            values
                .iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| (*v, close))
        });
        match value {
            Some((v, close)) => {
                out.push_str(v);
                rest = &after[close + 2..];
            }
            None => {
                out.push_str("{{");
                rest = after;
            }
        }
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hardware;

    fn machine(netboot: &str) -> Machine {
        let doc = format!(
            "apiVersion: tinkerbell.org/v1alpha1\nkind: Hardware\nmetadata: {{name: m1}}\nspec:\n  metadata: {{facility: {{facility_code: lab1}}}}\n  interfaces:\n  - dhcp: {{mac: \"52:54:00:00:00:01\", vlan_id: \"12\"}}\n    netboot: {netboot}\n"
        );
        hardware::validate(hardware::parse_documents(&doc).unwrap().remove(0))
            .unwrap()
            .machine
    }

    fn script(m: &Machine, mac: &str, s: &ScriptSettings) -> Result<String, NoScript> {
        let mac: Mac = mac.parse().unwrap();
        let iface = m.interface(mac).ok_or(NoScript::NoMac)?;
        super::script(m, iface, s)
    }

    fn settings() -> ScriptSettings {
        ScriptSettings {
            http_base: "http://10.99.0.1:7080".into(),
            syslog_host: "10.99.0.1".into(),
            tink_server: "10.99.0.1:42113".into(),
            tink_tls: false,
            extra_kernel_args: vec!["console=ttyS0,115200".into()],
        }
    }

    const MAC: &str = "52:54:00:00:00:01";

    #[test]
    fn default_script_boots_the_osie_like_smee() {
        let m = machine("{allowPXE: true, osie: {kernelParams: [\"tink.debug=1\", \"evil $x\"]}}");
        let s = script(&m, MAC, &settings()).unwrap();
        assert!(s.starts_with("#!ipxe\n"));
        assert!(s.contains("set base-url http://10.99.0.1:7080/artifacts\n"));
        assert!(s.contains(
            "kernel ${base-url}/vmlinuz-${arch} facility=lab1 syslog_host=10.99.0.1 grpc_authority=10.99.0.1:42113 tinkerbell_tls=false worker_id=52:54:00:00:00:01 hw_addr=52:54:00:00:00:01 vlan_id=12 modules=loop,squashfs,sd-mod,usb-storage initrd=initramfs-${arch} console=ttyS0,115200 tink.debug=1 evilx && goto download_initrd"
        ), "{s}");
        assert!(s.contains("initrd ${base-url}/initramfs-${arch} && goto boot"));
        assert!(s.contains("iseq ${idx} 10 && goto kernel_error"));
    }

    #[test]
    fn osie_overrides_contents_and_url() {
        let m = machine(
            "{allowPXE: true, osie: {baseURL: \"http://cdn.example/hook/\", kernel: vmlinuz-custom, initrd: initrd-custom}}",
        );
        let s = script(&m, MAC, &settings()).unwrap();
        assert!(s.contains("set base-url http://cdn.example/hook\n"));
        assert!(s.contains("kernel ${base-url}/vmlinuz-custom "));
        assert!(s.contains("initrd=initrd-custom"));
        let m = machine("{allowPXE: true, ipxe: {contents: \"echo hi\\nshell\"}}");
        assert_eq!(
            script(&m, MAC, &settings()).unwrap(),
            "#!ipxe\necho hi\nshell"
        );
        // The header first in the file, or iPXE does not take it as a
        // script (the fuzzer's find: whitespace before it).
        let m = machine("{allowPXE: true, ipxe: {contents: \"\\n  #!ipxe\\nshell\"}}");
        assert_eq!(script(&m, MAC, &settings()).unwrap(), "#!ipxe\nshell");
        let m = machine("{allowPXE: true, ipxe: {url: \"https://boot.netboot.xyz\"}}");
        assert!(
            script(&m, MAC, &settings())
                .unwrap()
                .contains("chain --autofree https://boot.netboot.xyz ||")
        );
    }

    #[test]
    fn template_has_no_unfilled_placeholders() {
        let m = machine("{allowPXE: true}");
        let s = script(&m, MAC, &settings()).unwrap();
        assert!(!s.contains("{{"), "{s}");
        assert!(s.contains("# tinkerbox: OSIE for default/m1 (52:54:00:00:00:01)"));
    }

    #[test]
    fn refusals() {
        let m = machine("{allowPXE: false}");
        assert_eq!(script(&m, MAC, &settings()), Err(NoScript::NotAllowed));
        let m = machine("{}");
        assert_eq!(script(&m, MAC, &settings()), Err(NoScript::NotAllowed));
        assert_eq!(
            script(&m, "52:54:00:00:00:09", &settings()),
            Err(NoScript::NoMac)
        );
    }

    /// Found by the `ipxe` fuzz target: values that added commands to the
    /// script or cut its retry logic short.
    #[test]
    fn hardware_values_cannot_add_ipxe_commands() {
        for url in [
            "http://x/a.ipxe && shell",
            "http://x/a.ipxe\nshell",
            "http://x/a.ipxe\\",
            "#x",
        ] {
            let m = machine(&format!("{{allowPXE: true, ipxe: {{url: {url:?}}}}}"));
            let s = script(&m, MAC, &settings()).unwrap();
            assert_eq!(s.lines().count(), 6, "{url:?}: {s}");
            assert!(
                !s.contains("shell") || s.contains("a.ipxe&&shell") || s.contains("a.ipxeshell"),
                "{s}"
            );
            assert!(!s.contains('\\') && !s.contains(" #"), "{s}");
        }
        let separators = |s: &str| -> usize {
            let kernel = s.lines().find(|l| l.starts_with("kernel ")).unwrap();
            kernel
                .split_whitespace()
                .filter(|t| matches!(*t, "&&" | "||" | ";"))
                .count()
        };
        let plain = script(&machine("{allowPXE: true}"), MAC, &settings()).unwrap();
        for p in ["#x", "a\\", "x||shell", ";", "&&", "||", "y;shell"] {
            let m = machine(&format!(
                "{{allowPXE: true, osie: {{kernel: {p:?}, kernelParams: [{p:?}, shell]}}}}"
            ));
            let s = script(&m, MAC, &settings()).unwrap();
            let kernel = s.lines().find(|l| l.starts_with("kernel ")).unwrap();
            assert!(kernel.ends_with("goto retry_kernel"), "{p:?}: {kernel}");
            assert!(!kernel.contains('#') && !kernel.contains('\\'), "{kernel}");
            assert_eq!(separators(&s), separators(&plain), "{p:?}: {kernel}");
        }
    }

    #[test]
    fn an_unknown_machine_gets_the_default_osie_script_by_its_mac() {
        let s = discovery_script("52:54:00:00:00:09".parse().unwrap(), &settings());
        assert!(s.starts_with("#!ipxe\n"));
        assert!(!s.contains("{{"), "{s}");
        assert!(s.contains("# tinkerbox: OSIE for an unknown machine (52:54:00:00:00:09)"));
        assert!(s.contains(
            "kernel ${base-url}/vmlinuz-${arch} facility= syslog_host=10.99.0.1 grpc_authority=10.99.0.1:42113 tinkerbell_tls=false worker_id=52:54:00:00:00:09 hw_addr=52:54:00:00:00:09 modules=loop,squashfs,sd-mod,usb-storage initrd=initramfs-${arch} console=ttyS0,115200 && goto download_initrd"
        ), "{s}");
        assert!(s.contains("set base-url http://10.99.0.1:7080/artifacts\n"));
    }

    #[test]
    fn render_is_one_pass() {
        // A value that looks like a placeholder stays text; unknown and
        // unterminated placeholders are left alone.
        let out = render(
            "a={{a}} b={{b}} c={{c}} {{d",
            &[("a", "{{b}}"), ("b", "{{a}}")],
        );
        assert_eq!(out, "a={{b}} b={{a}} c={{c}} {{d");
        // Through a whole script: a kernel parameter from a Hardware that
        // names a placeholder is not expanded into the script.
        let m = machine(
            "{allowPXE: true, osie: {kernel: \"k{{params}}\", kernelParams: [\"x={{retries}}\"]}}",
        );
        let s = script(&m, MAC, &settings()).unwrap();
        assert!(s.contains("${base-url}/k{{params}} facility="), "{s}");
        assert!(s.contains(" x={{retries}} && goto"), "{s}");
        assert_eq!(s.matches("facility=lab1").count(), 1, "{s}");
    }
}
