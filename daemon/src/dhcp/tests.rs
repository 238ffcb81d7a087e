//! The reply function over a table of real client fingerprints: the option
//! 60/77/93/94/97/175 values that SeaBIOS+iPXE, OVMF, undionly, UEFI HTTP
//! boot, ARM64 firmware, relays and plain OS clients send.

use super::*;
use crate::hardware;
use crate::inventory::Snapshot;
use dhcproto::v4::relay::RelayAgentInformation;
use dhcproto::v4::{Architecture, DhcpOption as O, OptionCode as C};

const KNOWN: &str = "52:54:00:99:00:01";
const HW: &str = r#"
apiVersion: tinkerbell.org/v1alpha1
kind: Hardware
metadata: {name: lab-1}
spec:
  interfaces:
  - dhcp:
      mac: "52:54:00:99:00:01"
      hostname: lab-1
      domain_name: lab.example
      lease_time: 7200
      name_servers: [10.99.0.1, 1.1.1.1]
      time_servers: [10.99.0.1]
      ip: {address: 10.99.0.11, netmask: 255.255.255.0, gateway: 10.99.0.1}
      classless_static_routes:
      - {destination_descriptor: 192.168.0.0/16, router: 10.99.0.254}
    netboot: {allowPXE: true}
  - dhcp:
      mac: "52:54:00:99:00:02"
      ip: {address: 10.99.0.12, netmask: 255.255.255.0}
    netboot: {allowPXE: false}
  - dhcp:
      mac: "52:54:00:99:00:03"
      ip: {address: 10.99.0.13}
    disableDhcp: true
  - dhcp:
      mac: "52:54:00:99:00:04"
      ip: {address: 10.99.0.14, netmask: 255.255.255.0}
    netboot:
      allowPXE: true
      ipxe: {binary: snponly.efi, url: "http://boot.example/custom.ipxe"}
"#;

fn snapshot() -> Snapshot {
    let docs = hardware::parse_documents(HW).unwrap();
    Snapshot::build(
        docs.into_iter()
            .map(|d| hardware::validate(d).unwrap().machine),
    )
}

fn settings(mode: Mode) -> Settings {
    Settings {
        mode,
        server_ip: "10.99.0.1".parse().unwrap(),
        http_base: "http://10.99.0.1:7080".into(),
        efi_binary: "ipxe.efi".into(),
        arm64_binary: true,
    }
}

fn mac_bytes(mac: &str) -> Vec<u8> {
    mac.parse::<Mac>().unwrap().octets().to_vec()
}

/// A client packet with the given options.
fn packet(mac: &str, t: MessageType, opts: Vec<O>) -> Message {
    let mut m = Message::default();
    m.set_opcode(Opcode::BootRequest)
        .set_htype(HType::Eth)
        .set_xid(0x1234_5678)
        .set_chaddr(&mac_bytes(mac));
    m.opts_mut().insert(O::MessageType(t));
    for o in opts {
        m.opts_mut().insert(o);
    }
    // Through the wire format and back, as the server sees it.
    decode(&encode(&m).unwrap()).unwrap()
}

fn prl(codes: &[u8]) -> O {
    O::ParameterRequestList(codes.iter().map(|c| C::from(*c)).collect())
}

/// SeaBIOS with QEMU's iPXE ROM (ipxe-qemu 1.21): what iPXE sends.
fn ipxe_bios(mac: &str, t: MessageType) -> Message {
    packet(
        mac,
        t,
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
        ],
    )
}

/// OVMF's own PXE client (EDK2): x64 UEFI, UNDI 3.16, with a UUID.
fn ovmf(mac: &str) -> Message {
    packet(
        mac,
        MessageType::Discover,
        vec![
            O::MaxMessageSize(1472),
            O::ClassIdentifier(b"PXEClient:Arch:00007:UNDI:003016".to_vec()),
            O::ClientSystemArchitecture(Architecture(7)),
            O::Unknown(UnknownOption::new(C::Unknown(94), vec![1, 3, 16])),
            O::ClientMachineIdentifier(vec![0; 17]),
            prl(&[
                1, 2, 3, 4, 5, 6, 12, 13, 15, 17, 18, 22, 23, 28, 40, 41, 42, 43, 50, 51, 54, 58,
                59, 60, 66, 67, 97, 128, 129, 130, 131, 132, 133, 134, 135,
            ]),
        ],
    )
}

fn reply(o: Outcome) -> Reply {
    match o {
        Outcome::Reply(r) => {
            same_wire(&r);
            *r
        }
        other => panic!("expected a reply, got {other:?}"),
    }
}

/// The bytes sized while building a reply are the ones the server would
/// encode from its message.
fn same_wire(r: &Reply) {
    if let Some(w) = &r.wire {
        assert_eq!(Some(w), encode(&r.msg).ok().as_ref(), "{:?}", r.kind);
    }
}

fn ignored(o: Outcome) -> &'static str {
    match o {
        Outcome::Ignore(why) => why.as_str(),
        other => panic!("expected no reply, got {other:?}"),
    }
}

fn opt(m: &Message, c: C) -> Option<&O> {
    m.opts().get(c)
}

fn msg_type(m: &Message) -> MessageType {
    match opt(m, C::MessageType) {
        Some(O::MessageType(t)) => *t,
        other => panic!("no type: {other:?}"),
    }
}

#[test]
fn ovmf_pxe_gets_address_and_ipxe_efi_over_tftp() {
    let r = reply(respond(
        &ovmf(KNOWN),
        Port::Dhcp,
        &snapshot(),
        &settings(Mode::Reservation),
    ));
    let m = &r.msg;
    assert_eq!(msg_type(m), MessageType::Offer);
    assert_eq!(r.kind.as_str(), "dhcp.offer");
    assert_eq!(m.opcode(), Opcode::BootReply);
    assert_eq!(m.xid(), 0x1234_5678);
    assert_eq!(m.yiaddr().to_string(), "10.99.0.11");
    assert_eq!(m.siaddr().to_string(), "10.99.0.1");
    assert_eq!(m.fname_str().unwrap().unwrap(), "ipxe.efi");
    assert_eq!(
        opt(m, C::ClassIdentifier),
        Some(&O::ClassIdentifier(b"PXEClient".to_vec()))
    );
    assert_eq!(
        opt(m, C::VendorExtensions),
        Some(&O::VendorExtensions(vec![6, 1, 8, 255]))
    );
    assert_eq!(
        opt(m, C::ServerIdentifier),
        Some(&O::ServerIdentifier("10.99.0.1".parse().unwrap()))
    );
    assert_eq!(
        opt(m, C::AddressLeaseTime),
        Some(&O::AddressLeaseTime(7200))
    );
    assert_eq!(opt(m, C::Renewal), Some(&O::Renewal(3600)));
    assert_eq!(opt(m, C::Rebinding), Some(&O::Rebinding(6300)));
    assert_eq!(
        opt(m, C::SubnetMask),
        Some(&O::SubnetMask("255.255.255.0".parse().unwrap()))
    );
    assert_eq!(
        opt(m, C::Router),
        Some(&O::Router(vec!["10.99.0.1".parse().unwrap()]))
    );
    assert_eq!(
        opt(m, C::DomainNameServer),
        Some(&O::DomainNameServer(vec![
            "10.99.0.1".parse().unwrap(),
            "1.1.1.1".parse().unwrap()
        ]))
    );
    assert_eq!(opt(m, C::Hostname), Some(&O::Hostname("lab-1".into())));
    assert_eq!(
        opt(m, C::DomainName),
        Some(&O::DomainName("lab.example".into()))
    );
    assert_eq!(
        opt(m, C::BroadcastAddr),
        Some(&O::BroadcastAddr("10.99.0.255".parse().unwrap()))
    );
    assert_eq!(
        opt(m, C::NtpServers),
        Some(&O::NtpServers(vec!["10.99.0.1".parse().unwrap()]))
    );
    assert_eq!(
        opt(m, C::ClientMachineIdentifier),
        Some(&O::ClientMachineIdentifier(vec![0; 17]))
    );
    assert!(opt(m, C::BootfileName).is_some(), "OVMF asked for 67");
    // Not requested by OVMF: 121 and 119 stay out.
    assert!(opt(m, C::ClasslessStaticRoute).is_none());
    assert!(opt(m, C::DomainSearch).is_none());
    assert!(opt(m, C::Unknown(175)).is_none(), "not iPXE");
    assert_eq!(r.dest, Dest::Broadcast);
    assert!(m.flags().broadcast());
    // The flag was set before the reply was encoded: its bytes come with
    // it (`same_wire` compares them), not a second encoding at the socket.
    let wire = r.wire.as_deref().expect("the reply's bytes");
    assert_eq!(wire[10] & 0x80, 0x80, "the broadcast flag on the wire");
    assert_eq!(r.machine, Some(Key::new("default", "lab-1")));
}

#[test]
fn ipxe_gets_its_script_url_and_no_proxy_wait() {
    let r = reply(respond(
        &ipxe_bios(KNOWN, MessageType::Discover),
        Port::Dhcp,
        &snapshot(),
        &settings(Mode::Reservation),
    ));
    let m = &r.msg;
    assert_eq!(
        m.fname_str().unwrap().unwrap(),
        "http://10.99.0.1:7080/ipxe/script/52:54:00:99:00:01/auto.ipxe"
    );
    assert_eq!(
        opt(m, C::Unknown(175)),
        Some(&O::Unknown(UnknownOption::new(
            C::Unknown(175),
            vec![176, 1, 1]
        )))
    );
    assert!(
        opt(m, C::VendorExtensions).is_none(),
        "no PXE menu for iPXE"
    );
    assert_eq!(
        opt(m, C::DomainSearch),
        Some(&O::DomainSearch(vec!["lab.example".parse().unwrap()]))
    );
    // iPXE's REQUEST for the offered address is acknowledged the same way.
    let mut req = ipxe_bios(KNOWN, MessageType::Request);
    req.opts_mut()
        .insert(O::RequestedIpAddress("10.99.0.11".parse().unwrap()));
    req.opts_mut()
        .insert(O::ServerIdentifier("10.99.0.1".parse().unwrap()));
    let r = reply(respond(
        &req,
        Port::Dhcp,
        &snapshot(),
        &settings(Mode::Reservation),
    ));
    assert_eq!(msg_type(&r.msg), MessageType::Ack);
    assert_eq!(r.kind.as_str(), "dhcp.ack");
    assert_eq!(r.msg.yiaddr().to_string(), "10.99.0.11");
}

#[test]
fn binary_by_architecture() {
    let cases: &[(&[u8], u16, Option<&str>)] = &[
        (
            b"PXEClient:Arch:00000:UNDI:002001",
            0,
            Some("undionly.kpxe"),
        ),
        (b"PXEClient:Arch:00006:UNDI:003016", 6, Some("ipxe.efi")),
        (b"PXEClient:Arch:00007:UNDI:003016", 7, Some("ipxe.efi")),
        (b"PXEClient:Arch:00009:UNDI:003016", 9, Some("ipxe.efi")),
        (
            b"PXEClient:Arch:00011:UNDI:003016",
            11,
            Some("snp-arm64.efi"),
        ),
        (
            b"HTTPClient:Arch:00016:UNDI:003001",
            16,
            Some("http://10.99.0.1:7080/ipxe/binary/ipxe.efi"),
        ),
        (
            b"HTTPClient:Arch:00019:UNDI:003001",
            19,
            Some("http://10.99.0.1:7080/ipxe/binary/snp-arm64.efi"),
        ),
        (b"PXEClient:Arch:00002:UNDI:003016", 2, None), // Itanium
    ];
    for (class, arch, want) in cases {
        let p = packet(
            KNOWN,
            MessageType::Discover,
            vec![
                O::ClassIdentifier(class.to_vec()),
                O::ClientSystemArchitecture(Architecture(*arch)),
            ],
        );
        let r = reply(respond(
            &p,
            Port::Dhcp,
            &snapshot(),
            &settings(Mode::Reservation),
        ));
        let file = r.msg.fname_str().and_then(|f| f.ok()).map(str::to_string);
        assert_eq!(file.as_deref(), *want, "arch {arch}");
        assert_eq!(
            r.msg.yiaddr().to_string(),
            "10.99.0.11",
            "an address whatever the arch"
        );
        if class.starts_with(b"HTTPClient") {
            assert_eq!(
                opt(&r.msg, C::ClassIdentifier),
                Some(&O::ClassIdentifier(b"HTTPClient".to_vec()))
            );
        }
    }
    // Without an ARM64 binary, ARM64 gets an address but no boot file.
    let mut s = settings(Mode::Reservation);
    s.arm64_binary = false;
    let p = packet(
        KNOWN,
        MessageType::Discover,
        vec![
            O::ClassIdentifier(b"PXEClient:Arch:00011".to_vec()),
            O::ClientSystemArchitecture(Architecture(11)),
        ],
    );
    let r = reply(respond(&p, Port::Dhcp, &snapshot(), &s));
    assert!(r.msg.fname().is_none());
    assert_eq!(
        serde_json::to_value(&r.fields).unwrap()["no_boot"],
        "unsupported_arch"
    );
    // snponly.efi by config.
    s.efi_binary = "snponly.efi".into();
    let r = reply(respond(&ovmf(KNOWN), Port::Dhcp, &snapshot(), &s));
    assert_eq!(r.msg.fname_str().unwrap().unwrap(), "snponly.efi");
}

#[test]
fn hardware_overrides_binary_and_script_url() {
    let mac = "52:54:00:99:00:04";
    let r = reply(respond(
        &ovmf(mac),
        Port::Dhcp,
        &snapshot(),
        &settings(Mode::Reservation),
    ));
    assert_eq!(r.msg.fname_str().unwrap().unwrap(), "snponly.efi");
    let r = reply(respond(
        &ipxe_bios(mac, MessageType::Discover),
        Port::Dhcp,
        &snapshot(),
        &settings(Mode::Reservation),
    ));
    assert_eq!(
        r.msg.fname_str().unwrap().unwrap(),
        "http://boot.example/custom.ipxe"
    );
}

#[test]
fn who_gets_nothing() {
    let snap = snapshot();
    let s = settings(Mode::Reservation);
    assert_eq!(
        ignored(respond(&ovmf("52:54:00:ff:ff:ff"), Port::Dhcp, &snap, &s)),
        "unknown_mac"
    );
    assert_eq!(
        ignored(respond(&ovmf("52:54:00:99:00:03"), Port::Dhcp, &snap, &s)),
        "dhcp_disabled"
    );
    assert_eq!(
        ignored(respond(
            &ovmf(KNOWN),
            Port::Dhcp,
            &snap,
            &settings(Mode::Off)
        )),
        "off"
    );
    assert_eq!(
        ignored(respond(&ovmf(KNOWN), Port::Proxy, &snap, &s)),
        "proxy_port_in_reservation_mode"
    );
    // A server's own reply looped back is not a request.
    let mut m = ovmf(KNOWN);
    m.set_opcode(Opcode::BootReply);
    assert_eq!(ignored(respond(&m, Port::Dhcp, &snap, &s)), "not_request");
    // No message type: plain BOOTP is not served.
    let mut m = ovmf(KNOWN);
    m.opts_mut().remove(C::MessageType);
    assert_eq!(
        ignored(respond(&m, Port::Dhcp, &snap, &s)),
        "no_message_type"
    );
    // allowPXE false: an address and Smee's boot file that cannot load
    // (no next server, no PXE options), so the firmware moves on at once.
    let r = reply(respond(&ovmf("52:54:00:99:00:02"), Port::Dhcp, &snap, &s));
    assert_eq!(r.msg.yiaddr().to_string(), "10.99.0.12");
    assert_eq!(r.msg.fname_str().unwrap().unwrap(), "/netboot-not-allowed");
    assert!(r.msg.siaddr().is_unspecified());
    assert!(opt(&r.msg, C::ClassIdentifier).is_none());
    assert!(opt(&r.msg, C::VendorExtensions).is_none());
    let f = serde_json::to_value(&r.fields).unwrap();
    assert_eq!(f["no_boot"], "pxe_not_allowed");
    assert_eq!(f["boot_file"], serde_json::Value::Null);
    // UEFI HTTP boot takes only offers that say HTTPClient.
    let mut http = ovmf("52:54:00:99:00:02");
    http.opts_mut().insert(O::ClassIdentifier(
        b"HTTPClient:Arch:00016:UNDI:003001".to_vec(),
    ));
    let r = reply(respond(&http, Port::Dhcp, &snap, &s));
    assert_eq!(r.msg.fname_str().unwrap().unwrap(), "/netboot-not-allowed");
    assert_eq!(
        opt(&r.msg, C::ClassIdentifier),
        Some(&O::ClassIdentifier(b"HTTPClient".to_vec()))
    );
    // A plain OS client of the same machine gets no boot file at all.
    let plain = packet(
        "52:54:00:99:00:02",
        MessageType::Discover,
        vec![O::ClassIdentifier(b"udhcp 1.35.0".to_vec())],
    );
    let r = reply(respond(&plain, Port::Dhcp, &snap, &s));
    assert!(r.msg.fname().is_none());
    assert_eq!(
        serde_json::to_value(&r.fields).unwrap()["no_boot"],
        "not_netboot"
    );
}

#[test]
fn request_ack_nak_and_other_servers() {
    let snap = snapshot();
    let s = settings(Mode::Reservation);
    // A plain OS client (udhcpc) selecting our offer.
    let sel = |ip: &str, server: &str| {
        packet(
            KNOWN,
            MessageType::Request,
            vec![
                O::RequestedIpAddress(ip.parse().unwrap()),
                O::ServerIdentifier(server.parse().unwrap()),
                O::ClassIdentifier(b"udhcp 1.35.0".to_vec()),
                prl(&[1, 3, 6, 12, 15, 28, 42, 51, 54, 119, 121]),
            ],
        )
    };
    let r = reply(respond(
        &sel("10.99.0.11", "10.99.0.1"),
        Port::Dhcp,
        &snap,
        &s,
    ));
    assert_eq!(msg_type(&r.msg), MessageType::Ack);
    assert!(r.msg.fname().is_none(), "not a netboot client");
    assert!(
        opt(&r.msg, C::ClasslessStaticRoute).is_some(),
        "121 was requested"
    );
    let r = reply(respond(
        &sel("10.99.0.50", "10.99.0.1"),
        Port::Dhcp,
        &snap,
        &s,
    ));
    assert_eq!(msg_type(&r.msg), MessageType::Nak);
    assert_eq!(r.kind.as_str(), "dhcp.nak");
    assert_eq!(r.msg.yiaddr(), Ipv4Addr::UNSPECIFIED);
    assert_eq!(r.dest, Dest::Broadcast);
    assert_eq!(
        opt(&r.msg, C::ServerIdentifier),
        Some(&O::ServerIdentifier(s.server_ip))
    );
    assert!(opt(&r.msg, C::AddressLeaseTime).is_none());
    // The client chose another server's offer: stay silent (RFC 2131 4.3.2).
    assert_eq!(
        ignored(respond(
            &sel("10.99.0.11", "10.99.0.7"),
            Port::Dhcp,
            &snap,
            &s
        )),
        "other_server"
    );
    // INIT-REBOOT with a stale address from another network: NAK.
    let p = packet(
        KNOWN,
        MessageType::Request,
        vec![O::RequestedIpAddress("192.168.1.9".parse().unwrap())],
    );
    assert_eq!(
        msg_type(&reply(respond(&p, Port::Dhcp, &snap, &s)).msg),
        MessageType::Nak
    );
    // RENEWING: ciaddr set, unicast back to it.
    let mut p = packet(KNOWN, MessageType::Request, vec![]);
    p.set_ciaddr("10.99.0.11".parse::<Ipv4Addr>().unwrap());
    let r = reply(respond(&p, Port::Dhcp, &snap, &s));
    assert_eq!(msg_type(&r.msg), MessageType::Ack);
    assert_eq!(r.dest, Dest::Client("10.99.0.11".parse().unwrap()));
    // ...with a wrong ciaddr: NAK.
    p.set_ciaddr("10.99.0.99".parse::<Ipv4Addr>().unwrap());
    assert_eq!(
        msg_type(&reply(respond(&p, Port::Dhcp, &snap, &s)).msg),
        MessageType::Nak
    );
}

#[test]
fn inform_release_decline() {
    let snap = snapshot();
    let s = settings(Mode::Reservation);
    let mut p = packet(KNOWN, MessageType::Inform, vec![prl(&[1, 3, 6, 15])]);
    p.set_ciaddr("10.99.0.11".parse::<Ipv4Addr>().unwrap());
    let r = reply(respond(&p, Port::Dhcp, &snap, &s));
    assert_eq!(msg_type(&r.msg), MessageType::Ack);
    assert_eq!(r.kind.as_str(), "dhcp.inform");
    assert_eq!(
        r.msg.yiaddr(),
        Ipv4Addr::UNSPECIFIED,
        "RFC 2131 4.3.5: no yiaddr"
    );
    assert!(
        opt(&r.msg, C::AddressLeaseTime).is_none(),
        "no lease for INFORM"
    );
    assert_eq!(r.dest, Dest::Client("10.99.0.11".parse().unwrap()));
    for (t, kind) in [
        (MessageType::Release, "dhcp.release"),
        (MessageType::Decline, "dhcp.decline"),
    ] {
        match respond(&packet(KNOWN, t, vec![]), Port::Dhcp, &snap, &s) {
            Outcome::Note {
                kind: k, machine, ..
            } => {
                assert_eq!(k.as_str(), kind);
                assert_eq!(machine.name, "lab-1");
            }
            other => panic!("{other:?}"),
        }
    }
}

#[test]
fn parameter_request_list_is_honoured() {
    let snap = snapshot();
    let s = settings(Mode::Reservation);
    // Asks only for mask and router: no hostname, NTP, broadcast address.
    let p = packet(KNOWN, MessageType::Discover, vec![prl(&[1, 3])]);
    let m = reply(respond(&p, Port::Dhcp, &snap, &s)).msg;
    for c in [C::Hostname, C::NtpServers, C::BroadcastAddr, C::DomainName] {
        assert!(opt(&m, c).is_none(), "{c:?} was not requested");
    }
    assert!(opt(&m, C::SubnetMask).is_some() && opt(&m, C::Router).is_some());
    // No list at all: everything tinkerbox has.
    let p = packet(KNOWN, MessageType::Discover, vec![]);
    let m = reply(respond(&p, Port::Dhcp, &snap, &s)).msg;
    for c in [
        C::Hostname,
        C::NtpServers,
        C::BroadcastAddr,
        C::DomainName,
        C::ClasslessStaticRoute,
        C::DomainSearch,
    ] {
        assert!(opt(&m, c).is_some(), "{c:?} should be there");
    }
}

#[test]
fn replies_fit_the_clients_size_limit() {
    // A Hardware with enough name servers to overflow 576 bytes.
    let many: Vec<String> = (1..=60).map(|i| format!("10.1.0.{i}")).collect();
    let doc = format!(
        "apiVersion: tinkerbell.org/v1alpha1\nkind: Hardware\nmetadata: {{name: big}}\nspec:\n  interfaces:\n  - dhcp:\n      mac: \"52:54:00:00:00:bb\"\n      hostname: {}\n      domain_name: {}.example\n      time_servers: [{}]\n      ip: {{address: 10.1.0.200, netmask: 255.255.255.0}}\n",
        "h".repeat(60),
        "d".repeat(60),
        many.join(", ")
    );
    let hw = hardware::validate(hardware::parse_documents(&doc).unwrap().remove(0)).unwrap();
    let snap = Snapshot::build([hw.machine]);
    let p = packet(
        "52:54:00:00:00:bb",
        MessageType::Discover,
        vec![prl(&[1, 3, 6, 12, 15, 42, 119])],
    );
    let m = reply(respond(&p, Port::Dhcp, &snap, &settings(Mode::Reservation))).msg;
    assert!(encode(&m).unwrap().len() <= 576);
    assert!(
        opt(&m, C::Hostname).is_some(),
        "earlier requested options kept"
    );
    assert!(opt(&m, C::SubnetMask).is_some());
    // With a larger limit, everything fits.
    let p = packet(
        "52:54:00:00:00:bb",
        MessageType::Discover,
        vec![O::MaxMessageSize(1400), prl(&[1, 3, 6, 12, 15, 42, 119])],
    );
    let m = reply(respond(&p, Port::Dhcp, &snap, &settings(Mode::Reservation))).msg;
    assert!(opt(&m, C::NtpServers).is_some());
    let n = encode(&m).unwrap().len();
    assert!(n > 576 && n <= 1400, "{n}");
    // Short replies are padded to the BOOTP minimum.
    let p = packet(KNOWN, MessageType::Discover, vec![prl(&[1])]);
    assert_eq!(
        encode(
            &reply(respond(
                &p,
                Port::Dhcp,
                &snapshot(),
                &settings(Mode::Reservation)
            ))
            .msg
        )
        .unwrap()
        .len(),
        300
    );
}

#[test]
fn relayed_requests_go_back_to_the_relay_with_option_82() {
    let mut info = RelayAgentInformation::default();
    info.insert(RelayInfo::AgentCircuitId(b"eth1/0/7".to_vec()));
    info.insert(RelayInfo::AgentRemoteId(vec![
        0x00, 0x1b, 0x21, 0xaa, 0xbb, 0xcc,
    ]));
    let mut p = ovmf(KNOWN);
    p.set_giaddr("10.50.0.1".parse::<Ipv4Addr>().unwrap());
    p.opts_mut().insert(O::RelayAgentInformation(info.clone()));
    let r = reply(respond(
        &p,
        Port::Dhcp,
        &snapshot(),
        &settings(Mode::Reservation),
    ));
    assert_eq!(r.dest, Dest::Relay("10.50.0.1".parse().unwrap()));
    assert!(r.wire.is_some(), "encoded once, while sizing");
    assert_eq!(r.msg.giaddr().to_string(), "10.50.0.1");
    assert_eq!(
        opt(&r.msg, C::RelayAgentInformation),
        Some(&O::RelayAgentInformation(info))
    );
    assert_eq!(
        serde_json::to_value(&r.fields).unwrap()["relay"]["circuit_id"],
        "eth1/0/7"
    );
    assert_eq!(
        serde_json::to_value(&r.fields).unwrap()["relay"]["remote_id"],
        "00:1b:21:aa:bb:cc"
    );
    assert_eq!(
        serde_json::to_value(&r.fields).unwrap()["relay"]["giaddr"],
        "10.50.0.1"
    );
}

#[test]
fn proxy_modes_give_boot_information_only() {
    let snap = snapshot();
    let proxy = settings(Mode::Proxy);
    let r = reply(respond(&ovmf(KNOWN), Port::Dhcp, &snap, &proxy));
    assert_eq!(r.kind.as_str(), "dhcp.proxy_offer");
    assert_eq!(msg_type(&r.msg), MessageType::Offer);
    assert_eq!(r.msg.yiaddr(), Ipv4Addr::UNSPECIFIED, "never an address");
    assert!(opt(&r.msg, C::AddressLeaseTime).is_none() && opt(&r.msg, C::SubnetMask).is_none());
    assert_eq!(r.msg.fname_str().unwrap().unwrap(), "ipxe.efi");
    assert_eq!(
        opt(&r.msg, C::ClassIdentifier),
        Some(&O::ClassIdentifier(b"PXEClient".to_vec()))
    );
    assert_eq!(
        opt(&r.msg, C::VendorExtensions),
        Some(&O::VendorExtensions(vec![6, 1, 8, 255]))
    );
    assert_eq!(r.dest, Dest::Broadcast);
    // Unknown MACs: proxy stays silent, auto-proxy answers.
    assert_eq!(
        ignored(respond(
            &ovmf("52:54:00:ff:ff:ff"),
            Port::Dhcp,
            &snap,
            &proxy
        )),
        "unknown_mac"
    );
    let r = reply(respond(
        &ovmf("52:54:00:ff:ff:ff"),
        Port::Dhcp,
        &snap,
        &settings(Mode::AutoProxy),
    ));
    assert_eq!(r.msg.fname_str().unwrap().unwrap(), "ipxe.efi");
    assert_eq!(r.machine, None);
    // Not a netboot client: the real DHCP server's business.
    let p = packet(
        KNOWN,
        MessageType::Discover,
        vec![O::ClassIdentifier(b"udhcp 1.35.0".to_vec())],
    );
    assert_eq!(
        ignored(respond(&p, Port::Dhcp, &snap, &proxy)),
        "not_netboot"
    );
    // The PXE REQUEST to port 4011 is answered back to its source.
    let mut p = ovmf(KNOWN);
    p.opts_mut().insert(O::MessageType(MessageType::Request));
    p.set_ciaddr("10.99.0.77".parse::<Ipv4Addr>().unwrap());
    let r = reply(respond(&p, Port::Proxy, &snap, &proxy));
    assert_eq!(r.kind.as_str(), "dhcp.proxy_ack");
    assert_eq!(msg_type(&r.msg), MessageType::Ack);
    assert_eq!(r.dest, Dest::Source);
    // A REQUEST on port 67 is for the real server.
    assert_eq!(
        ignored(respond(&p, Port::Dhcp, &snap, &proxy)),
        "not_for_proxy"
    );
    // allowPXE false in proxy mode: a PXE offer whose file names the
    // machine and cannot load (Smee's), so the firmware moves on at once.
    let r = reply(respond(
        &ovmf("52:54:00:99:00:02"),
        Port::Dhcp,
        &snap,
        &proxy,
    ));
    assert_eq!(
        r.msg.fname_str().unwrap().unwrap(),
        "/52:54:00:99:00:02/netboot-not-allowed"
    );
    assert_eq!(r.msg.yiaddr(), Ipv4Addr::UNSPECIFIED);
    assert_eq!(
        opt(&r.msg, C::ClassIdentifier),
        Some(&O::ClassIdentifier(b"PXEClient".to_vec()))
    );
    // iPXE behind a proxy gets its script.
    let r = reply(respond(
        &ipxe_bios(KNOWN, MessageType::Discover),
        Port::Dhcp,
        &snap,
        &proxy,
    ));
    assert!(
        r.msg
            .fname_str()
            .unwrap()
            .unwrap()
            .ends_with("/ipxe/script/52:54:00:99:00:01/auto.ipxe")
    );
}

#[test]
fn malformed_and_mutated_packets_never_panic() {
    let snap = snapshot();
    let s = settings(Mode::Reservation);
    let base = encode(&ipxe_bios(KNOWN, MessageType::Discover)).unwrap();
    // Truncations and single-byte corruptions of a real packet, all bounded.
    let mut answered = 0;
    for cut in 0..base.len() {
        if let Some(m) = decode(&base[..cut]) {
            let _ = respond(&m, Port::Dhcp, &snap, &s);
        }
    }
    let mut x: u32 = 0x9e37_79b9;
    for _ in 0..20_000 {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        let mut b = base.clone();
        let i = (x as usize) % b.len();
        b[i] = (x >> 8) as u8;
        if let Some(m) = decode(&b)
            && let Outcome::Reply(r) = respond(&m, Port::Dhcp, &snap, &s)
        {
            let _ = encode(&r.msg);
            same_wire(&r);
            answered += 1;
        }
    }
    assert!(
        answered > 1000,
        "most mutations still decode and get answered: {answered}"
    );
    // Non-Ethernet hardware types are not served.
    let mut m = ovmf(KNOWN);
    m.set_htype(HType::from(6u8));
    assert_eq!(ignored(respond(&m, Port::Dhcp, &snap, &s)), "not_ethernet");
}

/// The hand-written header gives dhcproto's own bytes: every mix of empty,
/// short and full `sname`/`file`, no options and options past any usual
/// size, odd header fields, into a buffer that held something before.
#[test]
fn encode_into_is_dhcprotos_encoding() {
    use dhcproto::Encodable;
    // (Longer names cannot be set: dhcproto's setters assert.)
    let names = [None, Some(b"x".to_vec()), Some(vec![b'a'; 64])];
    let files = [None, Some(b"ipxe.efi".to_vec()), Some(vec![b'c'; 128])];
    let chaddrs: [&[u8]; 3] = [&[2, 0, 0, 0, 0, 1], &[], &[0xee; 16]];
    let mut buf = vec![0xff; 2000];
    let mut checked = 0;
    for (i, sname) in names.iter().enumerate() {
        for (j, file) in files.iter().enumerate() {
            for opts in 0..3usize {
                let mut m = Message::default();
                m.set_opcode(dhcproto::v4::Opcode::BootReply)
                    .set_htype(dhcproto::v4::HType::Eth)
                    .set_hops(i as u8 + 1)
                    .set_xid(0x0102_0304 + (i * 16 + j) as u32)
                    .set_secs(0xfffe - opts as u16)
                    .set_flags(Flags::default().set_broadcast())
                    .set_chaddr(chaddrs[(i + j) % 3])
                    .set_ciaddr(Ipv4Addr::new(10, 1, i as u8, 1))
                    .set_yiaddr(Ipv4Addr::new(10, 0, i as u8, j as u8))
                    .set_siaddr(Ipv4Addr::new(10, 2, 0, opts as u8))
                    .set_giaddr(Ipv4Addr::new(10, 3, j as u8, 9));
                if let Some(n) = sname {
                    m.set_sname(n);
                }
                if let Some(f) = file {
                    m.set_fname(f);
                }
                for k in 0..opts * 4 {
                    m.opts_mut().insert(O::Hostname("h".repeat(200 + k)));
                    m.opts_mut()
                        .insert(O::Router(vec![Ipv4Addr::new(10, 0, 0, k as u8)]));
                    m.opts_mut().insert(O::BootfileName(vec![b'f'; 250]));
                    m.opts_mut().insert(O::DomainName(format!("d{k}.example")));
                }
                let want = m.to_vec().unwrap();
                encode_into(&m, &mut buf).unwrap();
                assert_eq!(want, buf, "sname {i}, file {j}, opts {opts}");
                checked += 1;
            }
        }
    }
    assert_eq!(checked, 3 * 3 * 3);
}
