//! Answers from the discovery pool, pure: the request, the pool, the time
//! and which addresses Hardware reserves in; the reply and the one write
//! the pool thread must commit before sending it out. Built with the same
//! option and boot helpers as a known machine's answer (a pool client boots
//! as a Hardware with `allowPXE` and no overrides would).

use super::{
    Client, Ignore, Opts, Port, Reply, Settings, boot_for, boot_options, client_of, finish,
    lease_fields, nak, reply_base,
};
use crate::config::DiscoveryConfig;
use crate::discovery::MacPattern;
use crate::discovery::pool::{Lease, Pool, Refusal};
use crate::events::Kind;
use crate::hardware::{Interface, Mac};
use dhcproto::v4::{DhcpOption, Message, MessageType, OptionCode};
use std::net::Ipv4Addr;

/// `[discovery]` as the replies use it.
#[derive(Debug, Clone)]
pub struct PoolSettings {
    pub netmask: Option<Ipv4Addr>,
    pub gateway: Option<Ipv4Addr>,
    pub dns: Vec<Ipv4Addr>,
    /// Seconds.
    pub lease_time: u32,
    /// Empty: every netboot client may take an address.
    pub patterns: Vec<MacPattern>,
}

impl PoolSettings {
    /// `server`: tinkerbox's address, which the default netmask holds.
    pub fn from_config(d: &DiscoveryConfig, server: Ipv4Addr) -> PoolSettings {
        PoolSettings {
            netmask: d.pool_netmask(Some(server)),
            gateway: d.gateway,
            dns: d.dns.clone(),
            lease_time: u32::try_from(d.lease_time.as_secs()).unwrap_or(u32::MAX),
            // Checked when the configuration was read.
            patterns: d
                .mac_patterns
                .iter()
                .filter_map(|p| p.parse().ok())
                .collect(),
        }
    }

    fn matches(&self, mac: &Mac) -> bool {
        self.patterns.is_empty() || self.patterns.iter().any(|p| p.matches(mac))
    }
}

/// What must be committed before the answer goes out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Write {
    /// A REQUEST granted; `new` when not a renewal of the same address.
    Bind {
        lease: Lease,
        new: bool,
    },
    Release(Lease),
    Decline {
        ip: Ipv4Addr,
        mac: Mac,
        until_ms: i64,
    },
}

#[derive(Debug)]
pub enum Answer {
    Reply(Box<Reply>),
    Ignore(Ignore),
    /// RELEASE/DECLINE: nothing to send; the event log hears of it.
    Note {
        kind: Kind,
        mac: Mac,
        ip: Ipv4Addr,
        message: String,
    },
}

#[derive(Debug)]
pub struct Plan {
    pub answer: Answer,
    pub write: Option<Write>,
}

impl From<Answer> for Plan {
    fn from(answer: Answer) -> Plan {
        Plan {
            answer,
            write: None,
        }
    }
}

fn reply(o: super::Outcome) -> Answer {
    match o {
        super::Outcome::Reply(r) => Answer::Reply(r),
        super::Outcome::Ignore(i) => Answer::Ignore(i),
        // `finish` and `nak` only reply.
        super::Outcome::Note { .. } => Answer::Ignore(Ignore::UnexpectedMessageType),
    }
}

/// May this client use the pool: a Hardware interface with no address
/// names its MAC (a BareMetalHost's), it holds a lease (whatever it is
/// now, e.g. the OSIE's own DHCP client), or it is a netboot client whose
/// MAC matches `discovery.mac_patterns`.
pub fn eligible(c: &Client, pool: &Pool, now: i64, ps: &PoolSettings, known: bool) -> bool {
    known || pool.lease_of(&c.mac, now).is_some() || (c.netboot() && ps.matches(&c.mac))
}

/// Answer a request of a MAC no Hardware has (reservation mode). Pure:
/// `pool` is only read; the caller commits `write`, applies it to the
/// pool, and then sends.
///
/// `known` finds the Hardware interface with a MAC and no IPv4 address: its
/// netboot settings are honoured (no boot file without `allowPXE`, its iPXE
/// overrides), as for a Hardware with an address.
pub fn plan<'a>(
    req: &Message,
    pool: &Pool,
    now: i64,
    reserved: &dyn Fn(Ipv4Addr) -> bool,
    known: &dyn Fn(&Mac) -> Option<&'a Interface>,
    s: &Settings,
    ps: &PoolSettings,
) -> Plan {
    let c = match client_of(req) {
        Ok(c) => c,
        Err(why) => return Answer::Ignore(why).into(),
    };
    let iface = known(&c.mac);
    if !eligible(&c, pool, now, ps, iface.is_some()) {
        return Answer::Ignore(Ignore::UnknownMac).into();
    }
    let requested = match req.opts().get(OptionCode::RequestedIpAddress) {
        Some(DhcpOption::RequestedIpAddress(a)) => Some(*a),
        _ => None,
    };
    let ciaddr = Some(req.ciaddr()).filter(|a| !a.is_unspecified());
    match c.msg_type {
        MessageType::Discover => match pool.offer(&c.mac, requested, now, reserved) {
            Some(ip) => reply(lease_reply(req, &c, iface, ip, MessageType::Offer, s, ps)).into(),
            None => Answer::Ignore(Ignore::PoolExhausted).into(),
        },
        MessageType::Request => {
            if let Some(DhcpOption::ServerIdentifier(id)) =
                req.opts().get(OptionCode::ServerIdentifier)
                && *id != s.server_ip
            {
                // RFC 2131 4.3.2: the client chose another server's offer.
                return Answer::Ignore(Ignore::OtherServer).into();
            }
            let Some(ip) = requested.or(ciaddr) else {
                return reply(nak(req, &c, None, "request names no address".into(), s)).into();
            };
            match pool.check_request(&c.mac, ip, now, reserved) {
                Ok(lease) => {
                    let new = pool.lease_of(&c.mac, now).is_none_or(|l| l.ip != ip);
                    Plan {
                        answer: reply(lease_reply(req, &c, iface, ip, MessageType::Ack, s, ps)),
                        write: Some(Write::Bind { lease, new }),
                    }
                }
                Err(why) => reply(nak(req, &c, None, nak_text(ip, &why), s)).into(),
            }
        }
        MessageType::Release => match ciaddr.and_then(|ip| pool.check_release(&c.mac, ip, now)) {
            Some(l) => Plan {
                answer: Answer::Note {
                    kind: Kind::DhcpRelease,
                    mac: c.mac,
                    ip: l.ip,
                    message: format!("DHCPRELEASE of {}: back in the discovery pool", l.ip),
                },
                write: Some(Write::Release(l)),
            },
            None => Answer::Ignore(Ignore::UnexpectedMessageType).into(),
        },
        MessageType::Decline => {
            let until = requested.and_then(|ip| Some((ip, pool.check_decline(&c.mac, ip, now)?)));
            match until {
                Some((ip, until_ms)) => Plan {
                    answer: Answer::Note {
                        kind: Kind::DhcpDecline,
                        mac: c.mac,
                        ip,
                        message: format!(
                            "DHCPDECLINE of {ip}: the address is in use on the network; kept out of the discovery pool for {}s",
                            (until_ms - now) / 1000
                        ),
                    },
                    write: Some(Write::Decline {
                        ip,
                        mac: c.mac,
                        until_ms,
                    }),
                },
                None => Answer::Ignore(Ignore::UnexpectedMessageType).into(),
            }
        }
        _ => Answer::Ignore(Ignore::UnexpectedMessageType).into(),
    }
}

fn nak_text(ip: Ipv4Addr, why: &Refusal) -> String {
    format!("requested {ip}: {why}")
}

/// An OFFER or ACK of `ip` with the pool's options, and the boot file a
/// netboot client gets.
fn lease_reply(
    req: &Message,
    c: &Client,
    iface: Option<&Interface>,
    ip: Ipv4Addr,
    t: MessageType,
    s: &Settings,
    ps: &PoolSettings,
) -> super::Outcome {
    let kind = if t == MessageType::Offer {
        Kind::DhcpOffer
    } else {
        Kind::DhcpAck
    };
    let mut msg = reply_base(req, t, s);
    msg.set_yiaddr(ip);
    let mut opts = Opts::new(req);
    opts.core(DhcpOption::AddressLeaseTime(ps.lease_time));
    opts.core(DhcpOption::Renewal(ps.lease_time / 2));
    opts.core(DhcpOption::Rebinding(ps.lease_time / 8 * 7));
    if let Some(mask) = ps.netmask {
        opts.core(DhcpOption::SubnetMask(mask));
        let bcast = Ipv4Addr::from(u32::from(ip) | !u32::from(mask));
        opts.requested(DhcpOption::BroadcastAddr(bcast));
    }
    if let Some(gw) = ps.gateway {
        opts.core(DhcpOption::Router(vec![gw]));
    }
    if !ps.dns.is_empty() {
        opts.core(DhcpOption::DomainNameServer(ps.dns.clone()));
    }
    // A known interface's netboot settings; else as a Hardware with
    // allowPXE and no overrides.
    let boot = if c.netboot() {
        boot_for(c, iface, s)
    } else {
        Err(Ignore::NotNetboot)
    };
    if let Ok(b) = &boot {
        boot_options(&mut msg, &mut opts, c, b, req, s);
    }
    let fields = lease_fields(req, c, ip, boot);
    finish(msg, opts, req, c, kind, None, fields, Port::Dhcp)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::PoolRange;
    use crate::dhcp::{Dest, Mode, decode, encode};
    use dhcproto::v4::{DhcpOption as O, HType, Opcode};
    use std::time::Duration;

    const T0: i64 = 1_000_000_000;
    const NONE: &dyn Fn(Ipv4Addr) -> bool = &|_| false;
    const UNKNOWN: &dyn Fn(&Mac) -> Option<&'static Interface> = &|_| None;
    const PXE: &[u8] = b"PXEClient:Arch:00000:UNDI:002001";

    fn settings() -> Settings {
        Settings {
            mode: Mode::Reservation,
            server_ip: "10.99.0.1".parse().unwrap(),
            http_base: "http://10.99.0.1:7080".into(),
            efi_binary: "ipxe.efi".into(),
            arm64_binary: true,
        }
    }

    fn pool_settings(patterns: &[&str]) -> PoolSettings {
        PoolSettings {
            netmask: Some("255.255.255.0".parse().unwrap()),
            gateway: Some("10.99.0.1".parse().unwrap()),
            dns: vec!["10.99.0.53".parse().unwrap()],
            lease_time: 600,
            patterns: patterns.iter().map(|p| p.parse().unwrap()).collect(),
        }
    }

    fn pool() -> Pool {
        Pool::new(
            PoolRange {
                first: "10.99.0.100".parse().unwrap(),
                last: "10.99.0.109".parse().unwrap(),
            },
            Duration::from_secs(600),
            Duration::from_secs(60),
        )
    }

    fn packet(mac: &str, t: MessageType, opts: Vec<O>) -> Message {
        let mut m = Message::default();
        m.set_opcode(Opcode::BootRequest)
            .set_htype(HType::Eth)
            .set_xid(0x42)
            .set_chaddr(&mac.parse::<Mac>().unwrap().octets());
        m.opts_mut().insert(O::MessageType(t));
        for o in opts {
            m.opts_mut().insert(o);
        }
        decode(&encode(&m).unwrap()).unwrap()
    }

    fn offered(p: &Plan) -> &Reply {
        match &p.answer {
            Answer::Reply(r) => r,
            other => panic!("{other:?}"),
        }
    }

    fn opt(r: &Reply, code: OptionCode) -> Option<&O> {
        r.msg.opts().get(code)
    }

    const MAC: &str = "52:54:00:aa:00:01";

    /// A BareMetalHost's kind of Hardware: a MAC, no address.
    fn no_address(allow_pxe: bool) -> crate::hardware::Machine {
        let doc = serde_json::json!({"apiVersion": "tinkerbell.org/v1alpha1", "kind": "Hardware",
            "metadata": {"name": "node-0"},
            "spec": {"interfaces": [{"dhcp": {"mac": "52:54:00:bb:00:01"},
                                     "netboot": {"allowPXE": allow_pxe}}]}});
        crate::hardware::validate(doc).unwrap().machine
    }

    #[test]
    fn a_hardware_interface_with_no_address_is_leased_one_with_its_netboot_settings() {
        let p = pool();
        // Its MAC matches no pattern: known, so it may use the pool.
        let ps = pool_settings(&["aa:bb:cc:*"]);
        let req = packet(
            "52:54:00:bb:00:01",
            MessageType::Discover,
            vec![O::ClassIdentifier(PXE.to_vec())],
        );
        let on = no_address(true);
        let known = |_: &Mac| on.interfaces.first();
        let r = plan(&req, &p, T0, NONE, &known, &settings(), &ps);
        assert_eq!(offered(&r).fields.boot_file(), Some("undionly.kpxe"));
        // allowPXE off (after its install): an address, no boot file, so
        // the firmware boots its disk.
        let off = no_address(false);
        let known = |_: &Mac| off.interfaces.first();
        let r = plan(&req, &p, T0, NONE, &known, &settings(), &ps);
        let o = offered(&r);
        assert!(p.contains(o.msg.yiaddr()));
        assert_eq!(o.fields.boot_file(), None);
        // Unknown and not matching: nothing.
        assert!(matches!(
            plan(&req, &p, T0, NONE, UNKNOWN, &settings(), &ps).answer,
            Answer::Ignore(Ignore::UnknownMac)
        ));
    }

    #[test]
    fn a_pxe_client_is_offered_an_address_with_the_pool_options_and_boot_file() {
        let p = pool();
        let req = packet(
            MAC,
            MessageType::Discover,
            vec![O::ClassIdentifier(PXE.to_vec())],
        );
        let first = plan(
            &req,
            &p,
            T0,
            NONE,
            UNKNOWN,
            &settings(),
            &pool_settings(&[]),
        );
        assert_eq!(first.write, None, "an offer holds nothing");
        let r = offered(&first);
        assert_eq!(r.kind, Kind::DhcpOffer);
        assert!(p.contains(r.msg.yiaddr()));
        assert_eq!(r.machine, None);
        assert_eq!(r.dest, Dest::Broadcast);
        assert_eq!(
            opt(r, OptionCode::AddressLeaseTime),
            Some(&O::AddressLeaseTime(600))
        );
        assert_eq!(
            opt(r, OptionCode::SubnetMask),
            Some(&O::SubnetMask("255.255.255.0".parse().unwrap()))
        );
        assert_eq!(
            opt(r, OptionCode::Router),
            Some(&O::Router(vec!["10.99.0.1".parse().unwrap()]))
        );
        assert_eq!(
            opt(r, OptionCode::DomainNameServer),
            Some(&O::DomainNameServer(vec!["10.99.0.53".parse().unwrap()]))
        );
        assert_eq!(r.fields.boot_file(), Some("undionly.kpxe"));
        assert_eq!(
            opt(r, OptionCode::ClassIdentifier),
            Some(&O::ClassIdentifier(b"PXEClient".to_vec()))
        );
        // iPXE gets its script, by MAC.
        let req = packet(
            MAC,
            MessageType::Discover,
            vec![O::UserClass(b"iPXE".to_vec())],
        );
        let ipxe = plan(
            &req,
            &p,
            T0,
            NONE,
            UNKNOWN,
            &settings(),
            &pool_settings(&[]),
        );
        assert_eq!(
            offered(&ipxe).fields.boot_file(),
            Some("http://10.99.0.1:7080/ipxe/script/52:54:00:aa:00:01/auto.ipxe")
        );
    }

    #[test]
    fn who_may_use_the_pool() {
        let mut p = pool();
        let s = settings();
        let qemu = pool_settings(&["52:54:00:*"]);
        let pxe = vec![O::ClassIdentifier(PXE.to_vec())];
        // Not netboot, no lease: nothing.
        let plain = packet(MAC, MessageType::Discover, vec![]);
        assert!(matches!(
            plan(&plain, &p, T0, NONE, UNKNOWN, &s, &qemu).answer,
            Answer::Ignore(Ignore::UnknownMac)
        ));
        // Netboot, MAC not matching: nothing.
        let other = packet("02:00:00:aa:00:01", MessageType::Discover, pxe.clone());
        assert!(matches!(
            plan(&other, &p, T0, NONE, UNKNOWN, &s, &qemu).answer,
            Answer::Ignore(Ignore::UnknownMac)
        ));
        // Netboot and matching: an offer; then the lease makes the plain
        // client (the OSIE's) eligible too, for the same address.
        let req = packet(MAC, MessageType::Discover, pxe);
        let ip = offered(&plan(&req, &p, T0, NONE, UNKNOWN, &s, &qemu))
            .msg
            .yiaddr();
        let ask = packet(
            MAC,
            MessageType::Request,
            vec![O::RequestedIpAddress(ip), O::ClassIdentifier(PXE.to_vec())],
        );
        let granted = plan(&ask, &p, T0, NONE, UNKNOWN, &s, &qemu);
        let Some(Write::Bind { lease, new: true }) = granted.write else {
            panic!("{granted:?}");
        };
        assert_eq!(offered(&granted).kind, Kind::DhcpAck);
        assert_eq!(offered(&granted).fields.boot_file(), Some("undionly.kpxe"));
        p.bind(lease, T0);
        let plan_plain = plan(&plain, &p, T0, NONE, UNKNOWN, &s, &qemu);
        let r = offered(&plan_plain);
        assert_eq!(r.msg.yiaddr(), ip);
        assert_eq!(r.fields.boot_file(), None, "not netboot: no boot file");
        // A renewal (RENEWING: ciaddr, no option 50) of the plain client.
        let mut renew = packet(MAC, MessageType::Request, vec![]);
        renew.set_ciaddr(ip);
        let plan_renew = plan(&renew, &p, T0 + 1000, NONE, UNKNOWN, &s, &qemu);
        assert_eq!(offered(&plan_renew).dest, Dest::Client(ip));
        assert!(matches!(
            plan_renew.write,
            Some(Write::Bind { new: false, .. })
        ));
    }

    #[test]
    fn naks_and_other_servers() {
        let mut p = pool();
        let s = settings();
        let ps = pool_settings(&[]);
        let pxe = O::ClassIdentifier(PXE.to_vec());
        p.request(
            &"02:00:00:00:00:09".parse().unwrap(),
            "10.99.0.105".parse().unwrap(),
            T0,
            NONE,
        )
        .unwrap();
        let ask = |ip: &str| {
            packet(
                MAC,
                MessageType::Request,
                vec![pxe.clone(), O::RequestedIpAddress(ip.parse().unwrap())],
            )
        };
        for (ip, why) in [
            ("10.99.0.105", "leased to another client"),
            ("10.99.0.5", "not in the discovery pool"),
        ] {
            let refused = plan(&ask(ip), &p, T0, NONE, UNKNOWN, &s, &ps);
            assert_eq!(refused.write, None);
            let r = offered(&refused);
            assert_eq!(r.kind, Kind::DhcpNak);
            assert_eq!(
                opt(r, OptionCode::Message),
                Some(&O::Message(format!("requested {ip}: {why}")))
            );
        }
        let reserved = |a: Ipv4Addr| a == "10.99.0.101".parse::<Ipv4Addr>().unwrap();
        assert_eq!(
            offered(&plan(
                &ask("10.99.0.101"),
                &p,
                T0,
                &reserved,
                UNKNOWN,
                &s,
                &ps
            ))
            .kind,
            Kind::DhcpNak
        );
        let mut elsewhere = ask("10.99.0.101");
        elsewhere
            .opts_mut()
            .insert(O::ServerIdentifier("10.99.0.2".parse().unwrap()));
        assert!(matches!(
            plan(&elsewhere, &p, T0, NONE, UNKNOWN, &s, &ps).answer,
            Answer::Ignore(Ignore::OtherServer)
        ));
    }

    #[test]
    fn release_decline_and_exhaustion() {
        let mut p = pool();
        let s = settings();
        let ps = pool_settings(&[]);
        let mac: Mac = MAC.parse().unwrap();
        let l = p
            .request(&mac, "10.99.0.103".parse().unwrap(), T0, NONE)
            .unwrap();
        let mut rel = packet(MAC, MessageType::Release, vec![]);
        rel.set_ciaddr(l.ip);
        let plan_rel = plan(&rel, &p, T0, NONE, UNKNOWN, &s, &ps);
        assert_eq!(plan_rel.write, Some(Write::Release(l)));
        assert!(matches!(
            plan_rel.answer,
            Answer::Note {
                kind: Kind::DhcpRelease,
                ..
            }
        ));
        let dec = packet(MAC, MessageType::Decline, vec![O::RequestedIpAddress(l.ip)]);
        assert_eq!(
            plan(&dec, &p, T0, NONE, UNKNOWN, &s, &ps).write,
            Some(Write::Decline {
                ip: l.ip,
                mac,
                until_ms: T0 + 60_000
            })
        );
        // A DECLINE of an address it does not hold changes nothing.
        let dec = packet(
            MAC,
            MessageType::Decline,
            vec![O::RequestedIpAddress("10.99.0.104".parse().unwrap())],
        );
        assert_eq!(plan(&dec, &p, T0, NONE, UNKNOWN, &s, &ps).write, None);
        let full = |_: Ipv4Addr| true;
        let req = packet(
            "52:54:00:aa:00:02",
            MessageType::Discover,
            vec![O::ClassIdentifier(PXE.to_vec())],
        );
        assert!(matches!(
            plan(&req, &p, T0, &full, UNKNOWN, &s, &ps).answer,
            Answer::Ignore(Ignore::PoolExhausted)
        ));
    }
}
