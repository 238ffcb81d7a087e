//! Per-machine iPXE scripts, pure: a machine and the boot settings in, the
//! script text out. The default script boots the OSIE (HookOS) with the
//! kernel parameters Smee gives it, with bounded retries at every step.

use crate::hardware::spec::Interface;
use crate::hardware::{Mac, Machine};

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
    /// No interface of the machine has this MAC.
    UnknownMac,
}

/// Retries per step, and seconds between them (as Smee's defaults).
const RETRIES: u32 = 10;
const RETRY_DELAY: u32 = 2;

/// Kernel parameters are space-separated: a value from a Hardware must not
/// smuggle in more parameters or iPXE syntax.
fn param_safe(s: &str) -> String {
    s.chars()
        .filter(|c| !c.is_whitespace() && !c.is_control() && *c != '$' && *c != '"' && *c != '\'')
        .collect()
}

/// The script for `mac` of machine `m`.
pub fn script(m: &Machine, mac: Mac, s: &ScriptSettings) -> Result<String, NoScript> {
    let iface = m.interface(mac).ok_or(NoScript::UnknownMac)?;
    let netboot = iface.netboot.as_ref();
    if netboot.and_then(|n| n.allow_pxe) != Some(true) {
        return Err(NoScript::NotAllowed);
    }
    let ipxe = netboot.and_then(|n| n.ipxe.as_ref());
    if let Some(contents) = ipxe
        .and_then(|i| i.contents.as_deref())
        .filter(|c| !c.trim().is_empty())
    {
        // The Hardware's own script, as is (with the header iPXE needs).
        return Ok(if contents.trim_start().starts_with("#!ipxe") {
            contents.to_string()
        } else {
            format!("#!ipxe\n{contents}")
        });
    }
    if let Some(url) = ipxe
        .and_then(|i| i.url.as_deref())
        .filter(|u| !u.trim().is_empty())
    {
        return Ok(format!(
            "#!ipxe\necho tinkerbox: chaining {url}\nchain --autofree {} || goto failed\n:failed\necho tinkerbox: chain failed\nexit 1\n",
            param_safe(url)
        ));
    }
    Ok(osie_script(m, mac, iface, s))
}

fn osie_script(m: &Machine, mac: Mac, iface: &Interface, s: &ScriptSettings) -> String {
    let osie = iface.netboot.as_ref().and_then(|n| n.osie.as_ref());
    let base = osie
        .and_then(|o| o.base_url.as_deref())
        .filter(|b| !b.trim().is_empty())
        .map(|b| param_safe(b.trim_end_matches('/')))
        .unwrap_or_else(|| format!("{}/artifacts", s.http_base));
    let kernel = osie
        .and_then(|o| o.kernel.as_deref())
        .filter(|k| !k.is_empty())
        .map(param_safe)
        .unwrap_or_else(|| "vmlinuz-${arch}".into());
    let initrd = osie
        .and_then(|o| o.initrd.as_deref())
        .filter(|k| !k.is_empty())
        .map(param_safe)
        .unwrap_or_else(|| "initramfs-${arch}".into());
    let facility = m
        .spec
        .metadata
        .as_ref()
        .and_then(|md| md.facility.as_ref())
        .and_then(|f| f.facility_code.as_deref())
        .map(param_safe)
        .unwrap_or_default();
    let worker_id = m
        .spec
        .agent_id
        .as_deref()
        .filter(|a| !a.is_empty())
        .map(param_safe)
        .unwrap_or_else(|| mac.to_string());
    let vlan = iface
        .dhcp
        .as_ref()
        .and_then(|d| d.vlan_id.as_deref())
        .filter(|v| !v.is_empty())
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
        .chain(osie.map(|o| o.kernel_params.iter()).into_iter().flatten())
    {
        let p = param_safe(p);
        if !p.is_empty() {
            params.push(' ');
            params.push_str(&p);
        }
    }
    let key = m.key.to_string();
    let mac = mac.to_string();
    let retries = RETRIES.to_string();
    let delay = RETRY_DELAY.to_string();
    render(
        OSIE_TEMPLATE,
        &[
            ("machine", &key),
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

/// Fill `{{name}}` placeholders. Hand-written: a template engine for eight
/// plain substitutions would be the larger risk.
fn render(template: &str, values: &[(&str, &str)]) -> String {
    let mut out = template.to_string();
    for (k, v) in values {
        out = out.replace(&format!("{{{{{k}}}}}"), v);
    }
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
        let s = script(&m, MAC.parse().unwrap(), &settings()).unwrap();
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
        let s = script(&m, MAC.parse().unwrap(), &settings()).unwrap();
        assert!(s.contains("set base-url http://cdn.example/hook\n"));
        assert!(s.contains("kernel ${base-url}/vmlinuz-custom "));
        assert!(s.contains("initrd=initrd-custom"));
        let m = machine("{allowPXE: true, ipxe: {contents: \"echo hi\\nshell\"}}");
        assert_eq!(
            script(&m, MAC.parse().unwrap(), &settings()).unwrap(),
            "#!ipxe\necho hi\nshell"
        );
        let m = machine("{allowPXE: true, ipxe: {url: \"https://boot.netboot.xyz\"}}");
        assert!(
            script(&m, MAC.parse().unwrap(), &settings())
                .unwrap()
                .contains("chain --autofree https://boot.netboot.xyz ||")
        );
    }

    #[test]
    fn template_has_no_unfilled_placeholders() {
        let m = machine("{allowPXE: true}");
        let s = script(&m, MAC.parse().unwrap(), &settings()).unwrap();
        assert!(!s.contains("{{"), "{s}");
        assert!(s.contains("# tinkerbox: OSIE for default/m1 (52:54:00:00:00:01)"));
    }

    #[test]
    fn refusals() {
        let m = machine("{allowPXE: false}");
        assert_eq!(
            script(&m, MAC.parse().unwrap(), &settings()),
            Err(NoScript::NotAllowed)
        );
        let m = machine("{}");
        assert_eq!(
            script(&m, MAC.parse().unwrap(), &settings()),
            Err(NoScript::NotAllowed)
        );
        assert_eq!(
            script(&m, "52:54:00:00:00:09".parse().unwrap(), &settings()),
            Err(NoScript::UnknownMac)
        );
    }
}
