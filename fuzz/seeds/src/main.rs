//! Writes the seed inputs of every fuzz target into `corpus/<target>/`
//! (`seed-*` files; what the fuzzer found sits beside them).
//!
//!     cd fuzz && cargo run -p tinkerbox-fuzz-seeds
//!
//! A crate of its own, without the daemon: it builds in seconds, where the
//! fuzz crate's dependencies take minutes outside cargo-fuzz's build.
//!
//! DHCP seeds are the client fingerprints of the daemon's unit tests
//! (SeaBIOS+iPXE, OVMF, UEFI HTTP boot, ARM64, relays, plain clients),
//! built with dhcproto and encoded as the wire carries them.

use dhcproto::v4::relay::{RelayAgentInformation, RelayInfo};
use dhcproto::v4::{
    Architecture, DhcpOption as O, HType, Message, MessageType, Opcode, OptionCode as C,
    UnknownOption,
};
use dhcproto::{Encodable, Encoder};
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};

const DHCP_HW: &str = include_str!("../../fixtures/dhcp-inventory.yaml");
const METADATA_HW: &str = include_str!("../../fixtures/metadata-machine.yaml");
/// The MACs of fixtures/dhcp-inventory.yaml, in order (as `tinkerbox_fuzz::DHCP_MACS`).
const DHCP_MACS: [[u8; 6]; 6] = [
    [0x52, 0x54, 0x00, 0x99, 0x00, 0x01],
    [0x52, 0x54, 0x00, 0x99, 0x00, 0x02],
    [0x52, 0x54, 0x00, 0x99, 0x00, 0x03],
    [0x52, 0x54, 0x00, 0x99, 0x00, 0x04],
    [0x52, 0x54, 0x00, 0x99, 0x00, 0x05],
    [0x52, 0x54, 0x00, 0x99, 0x00, 0x06],
];

fn dir(target: &str) -> PathBuf {
    let d = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../corpus")
        .join(target);
    std::fs::create_dir_all(&d).expect("corpus directory");
    d
}

fn write(target: &str, name: &str, data: &[u8]) {
    std::fs::write(dir(target).join(format!("seed-{name}")), data).expect("write seed");
}

fn packet(mac: [u8; 6], t: MessageType, opts: Vec<O>) -> Message {
    let mut m = Message::default();
    m.set_opcode(Opcode::BootRequest)
        .set_htype(HType::Eth)
        .set_xid(0x1234_5678)
        .set_chaddr(&mac);
    m.opts_mut().insert(O::MessageType(t));
    for o in opts {
        m.opts_mut().insert(o);
    }
    m
}

fn wire(m: &Message) -> Vec<u8> {
    let mut buf = Vec::new();
    m.encode(&mut Encoder::new(&mut buf)).expect("encode seed");
    buf
}

fn prl(codes: &[u8]) -> O {
    O::ParameterRequestList(codes.iter().map(|c| C::from(*c)).collect())
}

fn ipxe_opts() -> Vec<O> {
    vec![
        O::MaxMessageSize(1472),
        O::ClassIdentifier(b"PXEClient:Arch:00000:UNDI:002001".to_vec()),
        O::ClientSystemArchitecture(Architecture(0)),
        O::UserClass(b"iPXE".to_vec()),
        O::Unknown(UnknownOption::new(
            C::Unknown(175),
            vec![177, 5, 1, 0x1a, 0xf4, 0x10, 0x00, 235, 3, 1, 0, 0],
        )),
        prl(&[
            1, 3, 6, 7, 12, 15, 17, 26, 43, 60, 66, 67, 119, 128, 129, 130, 131, 132, 133, 134,
            135, 175, 203,
        ]),
    ]
}

fn ovmf_opts(arch: u16, class: &[u8]) -> Vec<O> {
    vec![
        O::MaxMessageSize(1472),
        O::ClassIdentifier(class.to_vec()),
        O::ClientSystemArchitecture(Architecture(arch)),
        O::Unknown(UnknownOption::new(C::Unknown(94), vec![1, 3, 16])),
        O::ClientMachineIdentifier(vec![0; 17]),
        prl(&[
            1, 2, 3, 4, 5, 6, 12, 13, 15, 17, 18, 22, 23, 28, 40, 41, 42, 43, 50, 51, 54, 58, 59,
            60, 66, 67, 97, 121, 128, 129, 130, 131, 132, 133, 134, 135,
        ]),
    ]
}

fn dhcp_seeds() {
    let server = Ipv4Addr::new(10, 99, 0, 1);
    let [m1, m2, _m3, m4, m5, m6] = DHCP_MACS;
    let unknown = [0x52, 0x54, 0x00, 0xaa, 0xbb, 0xcc];
    let mut seeds: Vec<(&str, Message)> = vec![
        (
            "ipxe-discover",
            packet(m1, MessageType::Discover, ipxe_opts()),
        ),
        (
            "ovmf-discover",
            packet(
                m1,
                MessageType::Discover,
                ovmf_opts(7, b"PXEClient:Arch:00007:UNDI:003016"),
            ),
        ),
        (
            "http-arm64",
            packet(
                m4,
                MessageType::Discover,
                ovmf_opts(19, b"HTTPClient:Arch:00019:UNDI:003001"),
            ),
        ),
        (
            "arm64-pxe",
            packet(
                m5,
                MessageType::Discover,
                ovmf_opts(11, b"PXEClient:Arch:00011:UNDI:003016"),
            ),
        ),
        (
            "pxe-refused",
            packet(
                m2,
                MessageType::Discover,
                ovmf_opts(0, b"PXEClient:Arch:00000:UNDI:002001"),
            ),
        ),
        (
            "no-reservation",
            packet(m6, MessageType::Discover, ipxe_opts()),
        ),
        (
            "unknown-mac",
            packet(
                unknown,
                MessageType::Discover,
                ovmf_opts(7, b"PXEClient:Arch:00007:UNDI:003016"),
            ),
        ),
        (
            "plain-client",
            packet(
                m1,
                MessageType::Discover,
                vec![prl(&[1, 3, 6, 15, 28, 42, 121])],
            ),
        ),
        (
            "small-max-size",
            packet(
                m5,
                MessageType::Discover,
                vec![
                    O::MaxMessageSize(300),
                    prl(&[1, 3, 6, 12, 15, 42, 121, 119, 67, 66]),
                ],
            ),
        ),
    ];
    let mut req = packet(m1, MessageType::Request, ipxe_opts());
    req.opts_mut()
        .insert(O::RequestedIpAddress(Ipv4Addr::new(10, 99, 0, 11)));
    req.opts_mut().insert(O::ServerIdentifier(server));
    seeds.push(("ipxe-request", req));
    let mut wrong = packet(m1, MessageType::Request, vec![]);
    wrong
        .opts_mut()
        .insert(O::RequestedIpAddress(Ipv4Addr::new(10, 99, 0, 99)));
    seeds.push(("request-nak", wrong));
    let mut other = packet(m1, MessageType::Request, vec![]);
    other
        .opts_mut()
        .insert(O::ServerIdentifier(Ipv4Addr::new(10, 99, 0, 2)));
    seeds.push(("request-other-server", other));
    let mut renew = packet(m5, MessageType::Request, vec![]);
    renew.set_ciaddr(Ipv4Addr::new(10, 98, 0, 15));
    seeds.push(("renew-ciaddr", renew));
    let mut inform = packet(m1, MessageType::Inform, vec![prl(&[1, 3, 6, 15, 119, 121])]);
    inform.set_ciaddr(Ipv4Addr::new(10, 99, 0, 11));
    seeds.push(("inform", inform));
    let mut release = packet(m1, MessageType::Release, vec![]);
    release.set_ciaddr(Ipv4Addr::new(10, 99, 0, 11));
    seeds.push(("release", release));
    seeds.push((
        "decline",
        packet(
            m1,
            MessageType::Decline,
            vec![O::RequestedIpAddress(Ipv4Addr::new(10, 99, 0, 11))],
        ),
    ));
    let mut relayed = packet(
        m1,
        MessageType::Discover,
        ovmf_opts(7, b"PXEClient:Arch:00007:UNDI:003016"),
    );
    relayed.set_giaddr(Ipv4Addr::new(10, 50, 0, 1));
    let mut info = RelayAgentInformation::default();
    info.insert(RelayInfo::AgentCircuitId(b"eth1/0/7".to_vec()));
    info.insert(RelayInfo::AgentRemoteId(vec![
        0x00, 0x1b, 0x21, 0xaa, 0xbb, 0xcc,
    ]));
    relayed.opts_mut().insert(O::RelayAgentInformation(info));
    seeds.push(("relayed", relayed));
    let mut proxy_req = packet(
        m4,
        MessageType::Request,
        ovmf_opts(7, b"PXEClient:Arch:00007:UNDI:003016"),
    );
    proxy_req.opts_mut().insert(O::ServerIdentifier(server));
    seeds.push(("proxy-request", proxy_req));
    for (name, m) in &seeds {
        write("dhcp", name, &wire(m));
    }
}

fn rrq(op: u16, fields: &[&str]) -> Vec<u8> {
    let mut p = op.to_be_bytes().to_vec();
    for f in fields {
        p.extend_from_slice(f.as_bytes());
        p.push(0);
    }
    p
}

fn tftp_request_seeds() {
    let seeds: &[(&str, Vec<u8>)] = &[
        ("plain", rrq(1, &["undionly.kpxe", "octet"])),
        (
            "options",
            rrq(
                1,
                &[
                    "ipxe.efi",
                    "OCTET",
                    "blksize",
                    "1468",
                    "tsize",
                    "0",
                    "windowsize",
                    "16",
                    "timeout",
                    "3",
                ],
            ),
        ),
        (
            "mac-prefix",
            rrq(
                1,
                &["52:54:00:aa:bb:cc/snp-arm64.efi", "octet", "tsize", "0"],
            ),
        ),
        (
            "mac-dashes",
            rrq(1, &["52-54-00-AA-BB-CC/ipxe.efi", "netascii"]),
        ),
        ("escape", rrq(1, &["../etc/passwd", "octet"])),
        ("absolute", rrq(1, &["/ipxe.efi", "octet"])),
        ("write", rrq(2, &["ipxe.efi", "octet"])),
        ("mail", rrq(1, &["ipxe.efi", "mail"])),
        (
            "out-of-range",
            rrq(
                1,
                &[
                    "empty",
                    "octet",
                    "blksize",
                    "7",
                    "timeout",
                    "0",
                    "windowsize",
                    "0",
                    "tsize",
                    "-1",
                ],
            ),
        ),
        (
            "huge",
            rrq(
                1,
                &[
                    "ipxe.efi",
                    "octet",
                    "blksize",
                    "65535",
                    "windowsize",
                    "65535",
                    "timeout",
                    "255",
                    "multicast",
                    "",
                ],
            ),
        ),
        ("dangling", b"\x00\x01f\x00octet\x00blksize\x00".to_vec()),
    ];
    for (name, p) in seeds {
        write("tftp_request", name, p);
    }
}

/// A tftp_session input: size, blksize, windowsize, timeout (ms), flags,
/// then events (see the target).
fn session(
    size: u32,
    blksize: u16,
    window: u16,
    timeout_ms: u16,
    flags: u8,
    events: &[u8],
) -> Vec<u8> {
    let mut v = size.to_be_bytes().to_vec();
    v.extend_from_slice(&blksize.to_be_bytes());
    v.extend_from_slice(&window.to_be_bytes());
    v.extend_from_slice(&timeout_ms.to_be_bytes());
    v.push(flags);
    v.extend_from_slice(events);
    v
}

fn tftp_session_seeds() {
    // Event bytes: 0 = ACK the last window, 2 n n = ACK n, 3 c c msg 0 =
    // ERROR, 4 bytes 0 = any datagram, 5 n n = DATA back, 6 t t = time
    // passes then timeout, 8 = timeout at the deadline, 9 = early timeout.
    let seeds: &[(&str, Vec<u8>)] = &[
        ("lockstep", session(1000, 512, 1, 1000, 0x50, &[0, 0, 0, 0])),
        (
            "oack-window",
            session(10_000, 100, 8, 1000, 0x51, &[0, 0, 2, 0, 4, 0, 0, 0, 0]),
        ),
        (
            "dup-acks",
            session(
                10_000,
                100,
                8,
                1000,
                0x50,
                &[0, 2, 0, 8, 2, 0, 8, 2, 0, 8, 0],
            ),
        ),
        (
            "error",
            session(3000, 1000, 1, 1000, 0x51, &[3, 0, 8, b'n', b'o', 0]),
        ),
        (
            "timeouts",
            session(5000, 512, 4, 1000, 0x50, &[9, 8, 8, 8, 8, 8, 8]),
        ),
        (
            "garbage",
            session(
                5000,
                512,
                1,
                1000,
                0x50,
                &[4, 0, 4, 0xff, 0, 5, 0, 1, 6, 0x03, 0xe8, 0],
            ),
        ),
        ("wrap", session(70_000 * 8, 8, 16, 1000, 0x50, &[0; 64])),
        ("silent", session(5000, 512, 4, 10, 0xd0, &[])),
        ("empty-file", session(0, 512, 1, 1000, 0x51, &[0, 0])),
    ];
    for (name, p) in seeds {
        write("tftp_session", name, p);
    }
}

fn syslog_seeds() {
    let seeds: &[(&str, &[u8])] = &[
        ("3164", b"<14>tb-lab: hello from 52:54:00:99:00:01\n"),
        ("5424", b"<165>1 2003-10-11T22:14:15.003Z host app - ID47 - msg"),
        ("5424-sd", b"<12>1 2026-11-22T01:58:01.859150+00:00 vm osie - - [timeQuality tzKnown=\"1\" isSynced=\"0\"] hello from the OSIE"),
        ("5424-bom", b"<12>1 - - - - - [a x=\"]] [\"][b] \xef\xbb\xbfbom"),
        ("busybox", b"<14>Nov 22 01:49:16 tb-lab: hello from 52:54:00:99:00:01 worker_id=x"),
        ("no-pri", b"no pri here"),
        ("bad-pri", b"<999>x"),
        ("control", b"<14>a\x1b[31mb\x00"),
        ("not-utf8", b"\xff\xfea"),
    ];
    for (name, p) in seeds {
        write("syslog", name, p);
    }
}

fn documents_seeds() {
    let seeds: &[(&str, &str)] = &[
        ("dhcp-inventory", DHCP_HW),
        ("metadata-machine", METADATA_HW),
        (
            "list",
            "- apiVersion: tinkerbell.org/v1alpha1\n  kind: Hardware\n  metadata: {name: a}\n- kind: Hardware\n---\nkind: HardwareList\nitems:\n- {apiVersion: tinkerbell.org/v1alpha1, kind: Hardware, metadata: {name: b, namespace: x}, spec: {interfaces: [{dhcp: {mac: 52-54-00-AA-BB-CC, ip: {address: 10.0.0.5, netmask: 255.255.255.0}}}]}}\n",
        ),
        (
            "json",
            "{\"apiVersion\": \"tinkerbell.org/v1alpha1\", \"kind\": \"Hardware\", \"metadata\": {\"name\": \"j1\"}, \"spec\": {\"interfaces\": [{\"dhcp\": {\"mac\": \"52:54:00:00:00:09\", \"vlan_id\": \"12,13\", \"lease_time\": 60}, \"netboot\": {\"allowPXE\": true, \"osie\": {\"kernelParams\": [\"a=b\"]}}}], \"resources\": {\"cpu\": \"4\", \"memory\": 1.5e3}, \"bmcRef\": {\"kind\": \"Machine\", \"name\": \"b1\"}, \"userData\": \"#cloud-config\"}}",
        ),
        (
            "bmc-machine",
            "apiVersion: bmc.tinkerbell.org/v1alpha1\nkind: Machine\nmetadata: {name: b1}\nspec:\n  connection:\n    host: 10.0.0.9\n    port: 623\n    authSecretRef: {name: s1, namespace: default}\n    insecureTLS: true\n    providerOptions:\n      preferredOrder: [gofish, ipmitool]\n      redfish: {port: 443, useBasicAuth: true, systemName: System.Embedded.1}\n      ipmitool: {port: 623, cipherSuite: \"17\"}\n",
        ),
        (
            "bmc-job",
            "apiVersion: bmc.tinkerbell.org/v1alpha1\nkind: Job\nmetadata: {name: j1}\nspec:\n  machineRef: {name: b1, namespace: default}\n  tasks:\n  - powerAction: \"off\"\n  - oneTimeBootDeviceAction: {device: [pxe], efiBoot: true}\n  - bootDevice: {device: disk, persistent: true}\n  - powerAction: \"on\"\n",
        ),
        (
            "bmc-task",
            "apiVersion: bmc.tinkerbell.org/v1alpha1\nkind: Task\nmetadata: {name: t1}\nspec:\n  connection: {host: bmc.example}\n  task: {powerAction: status}\n",
        ),
        (
            "secret",
            "apiVersion: v1\nkind: Secret\nmetadata: {name: s1}\ndata: {username: YWRtaW4=, password: c2VjcmV0}\n---\napiVersion: v1\nkind: Secret\nmetadata: {name: s2}\nstringData: {username: root, password: calvin}\n",
        ),
        ("anchors", "a: &x [1, 2, 3]\nb: *x\n---\nnull\n---\n[]\n"),
    ];
    for (name, p) in seeds {
        write("documents", name, p.as_bytes());
    }
}

/// Builds inputs the way `tinkerbox_fuzz::Input` reads them.
#[derive(Default)]
struct W(Vec<u8>);

impl W {
    fn u8(mut self, b: u8) -> Self {
        self.0.push(b);
        self
    }
    fn u16(mut self, v: u16) -> Self {
        self.0.extend_from_slice(&v.to_be_bytes());
        self
    }
    fn u32(mut self, v: u32) -> Self {
        self.0.extend_from_slice(&v.to_be_bytes());
        self
    }
    /// A NUL-terminated field.
    fn s(mut self, f: &str) -> Self {
        self.0.extend_from_slice(f.as_bytes());
        self.0.push(0);
        self
    }
    /// A count byte, then the strings.
    fn list(self, items: &[&str]) -> Self {
        items.iter().fold(self.u8(items.len() as u8), |w, i| w.s(i))
    }
}

/// The machine part of a metadata input (see `machine_from`).
fn metadata_machine(w: W) -> W {
    w.u8(2)
        // interface 0: with an address, a MAC that parses.
        .u8(1)
        .s("10.99.0.21")
        .s("10.99.0.1")
        .s("255.255.255.0")
        .s("x86_64")
        .s("lab.example")
        .s("host-a")
        .s("eno1")
        .u8(1)
        .u8(0x01)
        .list(&["10.99.0.1", "1.1.1.1"])
        .s("12")
        // interface 1: no address, a MAC given as text.
        .u8(0)
        .s("")
        .s("")
        .s("")
        .s("")
        .u8(0)
        .s("52-54-00-10-00-02")
        .list(&[])
        .s("")
        // instance ips
        .u8(2)
        .u8(0x04)
        .s("203.0.113.21")
        .s("")
        .s("")
        .u8(0x01)
        .s("2001:db8::21")
        .s("")
        .s("")
        // instance
        .s("worker-01")
        .s("0f0b6c2e-3f0a-4a7e-9c61-1d2b3c4d5e6f")
        .s("ubuntu")
        .s("v1")
        .s("ubuntu_22_04")
        .s("")
        .s("22.04")
        .list(&[
            "ssh-ed25519 AAAAC3Nza ops@lab",
            "ssh-rsa AAAAB3Nza backup@lab",
            "ssh-rsa CCCC key-1",
        ])
        .s("active")
        .list(&["k8s", "worker"])
        // facility, plan, state
        .s("lab1")
        .s("c3.small.x86")
        .s("provisioning")
}

fn metadata_seeds() {
    // caller ip, path, peer ip, X-Forwarded-For headers, token, now, ttl,
    // then the machine.
    let head = |ip: u8, path: &str, xff: &[&str], token: &str| {
        // The peer: selector 4 and 10.0.0.1, a trusted proxy.
        let w = W::default().u8(ip).s(path).u8(4).u32(0x0a00_0001);
        xff.iter()
            .fold(w.u8(xff.len() as u8), |w, h| w.s(h))
            .s(token)
            .u32(1_700_000_000)
            .u16(60)
    };
    let seeds: Vec<(&str, W)> = vec![
        ("root", head(0, "", &["198.51.100.7, 10.0.0.2"], "")),
        (
            "mac-path",
            head(
                0,
                "network/interfaces/macs/52:54:00:10:00:01/local-ipv4s",
                &[],
                "1700000000.00",
            ),
        ),
        (
            "public-keys",
            head(
                2,
                "public-keys/0/openssh-key",
                &["garbage", "10.1.1.1"],
                "1700000060.0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
            ),
        ),
        ("placement", head(1, "placement/availability-zone", &[], "")),
    ];
    for (name, w) in seeds {
        write("metadata", name, &metadata_machine(w).0);
    }
}

fn ipxe_seeds() {
    // flags (bits 0-1: allowPXE true/true/false/unset; 2 url, 3 contents,
    // 4 baseURL, 5 kernel, 6 initrd, 7 vlan_id switched on), then always
    // eight strings: url, contents, baseURL, kernel, initrd, vlan_id,
    // facility, agentID; then the kernel params.
    let seed = |flags: u8, s: [&str; 8], params: &[&str]| {
        s.iter()
            .fold(W::default().u8(flags), |w, f| w.s(f))
            .list(params)
            .0
    };
    let seeds: Vec<(&str, Vec<u8>)> = vec![
        (
            "osie",
            seed(
                0x00,
                ["", "", "", "", "", "", "lab1", ""],
                &["tink.debug=1", "evil $x"],
            ),
        ),
        (
            "osie-overrides",
            seed(
                0xf0,
                [
                    "",
                    "",
                    "http://cdn.example/hook/",
                    "vmlinuz-custom",
                    "initrd-custom",
                    "12",
                    "lab1",
                    "agent-7",
                ],
                &["console=tty0"],
            ),
        ),
        (
            "url",
            seed(
                0x04,
                ["https://boot.netboot.xyz", "", "", "", "", "", "lab1", ""],
                &[],
            ),
        ),
        (
            "contents",
            seed(0x08, ["", "echo hi\nshell", "", "", "", "", "", ""], &[]),
        ),
        ("refused", seed(0x02, ["", "", "", "", "", "", "", ""], &[])),
    ];
    for (name, v) in seeds {
        write("ipxe", name, &v);
    }
}

fn main() {
    dhcp_seeds();
    tftp_request_seeds();
    tftp_session_seeds();
    syslog_seeds();
    documents_seeds();
    metadata_seeds();
    ipxe_seeds();
    println!("seeds written under fuzz/corpus/");
}
