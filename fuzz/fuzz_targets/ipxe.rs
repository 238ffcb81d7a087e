//! `ipxe::script` for a Hardware whose netboot (ipxe url, osie baseURL,
//! kernel, initrd, kernelParams), vlan_id, facility code and agentID
//! strings come from the input.
//!
//! Checked besides "no panic": a value from the Hardware cannot change
//! what iPXE runs. The script is read the way iPXE reads it (lines split
//! at `\n`, a trailing `\r` dropped, a trailing `\` joining the next line;
//! tokens split at ASCII whitespace; `&&`, `||` and `;` tokens separate
//! commands; a token starting with `#` comments out the rest) and its
//! shape (per line: the label, each command's name, the separators) must
//! be the shape of the same script rendered with every such value
//! replaced by `x` (lines that run nothing left out). In particular the
//! `kernel` line stays one line and one command. A Hardware's own `ipxe.contents` is its script by design and
//! is not checked.
#![no_main]

use libfuzzer_sys::fuzz_target;
use std::sync::LazyLock;
use tinkerbox::hardware::spec::{Dhcp, Facility, HardwareMetadata, Interface, Ipxe, Netboot, Osie};
use tinkerbox::hardware::{Key, Mac, Machine};
use tinkerbox::ipxe::{self, ScriptSettings};
use tinkerbox_fuzz::Input;

const MAC: Mac = Mac([0x52, 0x54, 0x00, 0x00, 0x00, 0x01]);

static SETTINGS: LazyLock<ScriptSettings> = LazyLock::new(|| ScriptSettings {
    http_base: "http://10.99.0.1:7080".into(),
    syslog_host: "10.99.0.1".into(),
    tink_server: "10.99.0.1:42113".into(),
    tink_tls: false,
    extra_kernel_args: vec!["console=ttyS0,115200".into()],
});

/// The Hardware's strings, as the input gives them.
#[derive(Clone, Debug)]
struct Strings {
    allow_pxe: Option<bool>,
    url: Option<String>,
    contents: Option<String>,
    base_url: Option<String>,
    kernel: Option<String>,
    initrd: Option<String>,
    kernel_params: Vec<String>,
    vlan_id: Option<String>,
    facility: Option<String>,
    agent_id: Option<String>,
}

impl Strings {
    fn read(inp: &mut Input) -> Strings {
        let flags = inp.u8();
        let mut opt = |on: bool| {
            let s = inp.string();
            on.then_some(s)
        };
        Strings {
            allow_pxe: [Some(true), Some(true), Some(false), None][usize::from(flags & 3)],
            url: opt(flags & 0x04 != 0),
            contents: opt(flags & 0x08 != 0),
            base_url: opt(flags & 0x10 != 0),
            kernel: opt(flags & 0x20 != 0),
            initrd: opt(flags & 0x40 != 0),
            vlan_id: opt(flags & 0x80 != 0),
            facility: opt(true),
            agent_id: opt(true),
            kernel_params: inp.strings(6),
        }
    }

    /// The same Hardware with every value replaced by `x`, keeping blank
    /// ones blank (the script's choices depend on emptiness only).
    fn benign(&self) -> Strings {
        let x = |s: &Option<String>| {
            s.as_ref().map(|s| {
                if s.trim().is_empty() {
                    s.clone()
                } else {
                    "x".into()
                }
            })
        };
        Strings {
            allow_pxe: self.allow_pxe,
            url: x(&self.url),
            contents: x(&self.contents),
            base_url: x(&self.base_url),
            kernel: x(&self.kernel),
            initrd: x(&self.initrd),
            kernel_params: self.kernel_params.iter().map(|_| "x".into()).collect(),
            vlan_id: x(&self.vlan_id),
            facility: x(&self.facility),
            agent_id: x(&self.agent_id),
        }
    }

    fn machine(&self) -> Machine {
        let mut m = Machine {
            key: Key::new("default", "m1"),
            spec: Default::default(),
            macs: vec![MAC],
            ips: vec![],
        };
        m.spec.agent_id = self.agent_id.clone();
        m.spec.metadata = Some(HardwareMetadata {
            facility: Some(Facility {
                facility_code: self.facility.clone(),
                ..Facility::default()
            }),
            ..HardwareMetadata::default()
        });
        m.spec.interfaces = vec![Interface {
            dhcp: Some(Dhcp {
                mac: Some(MAC.to_string()),
                vlan_id: self.vlan_id.clone(),
                ..Dhcp::default()
            }),
            netboot: Some(Netboot {
                allow_pxe: self.allow_pxe,
                ipxe: Some(Ipxe {
                    binary: None,
                    contents: self.contents.clone(),
                    url: self.url.clone(),
                }),
                osie: Some(Osie {
                    base_url: self.base_url.clone(),
                    initrd: self.initrd.clone(),
                    kernel: self.kernel.clone(),
                    kernel_params: self.kernel_params.clone(),
                }),
                ..Netboot::default()
            }),
            ..Interface::default()
        }];
        m
    }
}

/// iPXE's `isspace`.
fn ipxe_space(c: char) -> bool {
    matches!(c, ' ' | '\t' | '\n' | '\r' | '\x0b' | '\x0c')
}

/// The script's shape as iPXE executes it: per logical line, its label
/// (if any), then each command's name and the separator after it.
fn shape(script: &str) -> Vec<Vec<String>> {
    let mut lines = Vec::new();
    let mut pending = String::new();
    for physical in script.split('\n') {
        let l = physical.strip_suffix('\r').unwrap_or(physical);
        pending.push_str(l);
        if pending.ends_with('\\') {
            pending.pop();
            continue;
        }
        lines.push(std::mem::take(&mut pending));
    }
    if !pending.is_empty() {
        lines.push(pending);
    }
    lines
        .iter()
        .map(|line| {
            let mut out = Vec::new();
            let mut rest = line.trim_start_matches(ipxe_space);
            if let Some(l) = rest.strip_prefix(':') {
                let end = l.find(ipxe_space).unwrap_or(l.len());
                out.push(format!(":{}", &l[..end]));
                rest = &l[end..];
            }
            let mut at_command_start = true;
            for tok in rest.split(ipxe_space).filter(|t| !t.is_empty()) {
                if tok.starts_with('#') {
                    // A comment: what follows is not run (a comment that
                    // hides nothing leaves the shape as it was).
                    break;
                }
                if matches!(tok, "&&" | "||" | ";") {
                    out.push(tok.into());
                    at_command_start = true;
                } else if at_command_start {
                    out.push(tok.into());
                    at_command_start = false;
                }
            }
            // A separator with no command after it runs nothing more.
            if out
                .last()
                .is_some_and(|t| matches!(t.as_str(), "&&" | "||" | ";"))
            {
                out.pop();
            }
            out
        })
        // Blank and comment-only lines run nothing: a value ending in `\`
        // that joins a blank line to its own changes nothing either.
        .filter(|shape: &Vec<String>| !shape.is_empty())
        .collect()
}

fuzz_target!(|data: &[u8]| {
    let mut inp = Input::new(data);
    let strings = Strings::read(&mut inp);
    let Ok(script) = ipxe::script(&strings.machine(), MAC, &SETTINGS) else {
        return;
    };
    assert!(script.starts_with("#!ipxe"), "no #!ipxe header");
    if strings
        .contents
        .as_ref()
        .is_some_and(|c| !c.trim().is_empty())
    {
        // The Hardware's own script, as is.
        return;
    }
    let benign = ipxe::script(&strings.benign().machine(), MAC, &SETTINGS)
        .expect("the benign Hardware gets a script too");
    if strings.url.as_ref().is_none_or(|u| u.trim().is_empty()) {
        let kernel_lines = script
            .split('\n')
            .filter(|l| l.trim_start().starts_with("kernel "))
            .count();
        assert_eq!(
            kernel_lines, 1,
            "the kernel line is not one line:\n{script}"
        );
    }
    let (got, want) = (shape(&script), shape(&benign));
    if got != want {
        let first = got
            .iter()
            .zip(&want)
            .position(|(g, w)| g != w)
            .unwrap_or(got.len().min(want.len()));
        panic!(
            "a Hardware value changed the script's commands at logical line {first}: \
             {:?} instead of {:?}\ninput strings: {strings:?}\nscript:\n{script}",
            got.get(first),
            want.get(first)
        );
    }
});
