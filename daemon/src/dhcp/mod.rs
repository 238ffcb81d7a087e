//! DHCPv4 for network boot, sans-IO: [`respond`] is a pure function of the
//! request, the inventory snapshot and the settings, and hands back the
//! reply already encoded when it had to encode it to fit the client's size
//! limit. The socket threads in [`server`] decode, call it, send, and
//! record the event and the metrics.
//!
//! Modes: `reservation` (a DHCP server for known MACs only), `proxy` (PXE
//! boot information beside another DHCP server, RFC 4578 / PXE 2.1, known
//! MACs), `auto-proxy` (proxy for every netboot client), `off`.

pub mod discovery;
pub mod pool;
pub mod server;

use crate::events::Kind;
use crate::hardware::{Interface, Key, Mac, Machine};
use crate::inventory::Snapshot;
use dhcproto::v4::relay::{RelayCode, RelayInfo};
use dhcproto::v4::{
    DhcpOption, DhcpOptions, Flags, HType, Message, MessageType, Opcode, OptionCode, UnknownOption,
};
use dhcproto::{Encodable, Encoder};
use serde::{Deserialize, Serialize};
use std::net::{IpAddr, Ipv4Addr};
use std::str::FromStr;

pub const SERVER_PORT: u16 = 67;
pub const CLIENT_PORT: u16 = 68;
pub const PROXY_PORT: u16 = 4011;
/// RFC 2131: every client accepts 576-byte messages.
const MIN_MESSAGE: usize = 576;
/// RFC 1542: BOOTP relays and old clients expect at least 300 bytes.
const MIN_BOOTP: usize = 300;
/// Lease when the Hardware gives none (Smee's default too).
const DEFAULT_LEASE: u32 = 86400;
/// iPXE's encapsulated options (option 175) and its "no-pxedhcp" setting.
const OPT_IPXE: u8 = 175;
const IPXE_NO_PXEDHCP: u8 = 176;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum Mode {
    Reservation,
    Proxy,
    AutoProxy,
    Off,
}

impl Mode {
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Reservation => "reservation",
            Mode::Proxy => "proxy",
            Mode::AutoProxy => "auto-proxy",
            Mode::Off => "off",
        }
    }

    pub fn is_proxy(self) -> bool {
        matches!(self, Mode::Proxy | Mode::AutoProxy)
    }
}

/// Where the request arrived: the DHCP port, or the PXE proxy port 4011.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Port {
    Dhcp,
    Proxy,
}

/// Why a request got no answer: a metric label (`as_str`) and the
/// `no_boot` field of a lease given without boot information.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Ignore {
    Off,
    NotRequest,
    NotEthernet,
    NoMessageType,
    ProxyPortInReservationMode,
    UnknownMac,
    DhcpDisabled,
    NoIpv4Reservation,
    OtherServer,
    UnexpectedMessageType,
    NotNetboot,
    NotForProxy,
    PxeNotAllowed,
    UnsupportedArch,
    // Set by the socket shell, not by [`respond`].
    Malformed,
    EncodeFailed,
    SendFailed,
    // The discovery pool's ([`discovery`]).
    /// Its thread's queue was full: the request was dropped.
    PoolBusy,
    /// No free address for a new client.
    PoolExhausted,
    /// The lease could not be committed, so it was not given.
    StoreFailed,
}

impl Ignore {
    pub fn as_str(self) -> &'static str {
        match self {
            Ignore::Off => "off",
            Ignore::NotRequest => "not_request",
            Ignore::NotEthernet => "not_ethernet",
            Ignore::NoMessageType => "no_message_type",
            Ignore::ProxyPortInReservationMode => "proxy_port_in_reservation_mode",
            Ignore::UnknownMac => "unknown_mac",
            Ignore::DhcpDisabled => "dhcp_disabled",
            Ignore::NoIpv4Reservation => "no_ipv4_reservation",
            Ignore::OtherServer => "other_server",
            Ignore::UnexpectedMessageType => "unexpected_message_type",
            Ignore::NotNetboot => "not_netboot",
            Ignore::NotForProxy => "not_for_proxy",
            Ignore::PxeNotAllowed => "pxe_not_allowed",
            Ignore::UnsupportedArch => "unsupported_arch",
            Ignore::Malformed => "malformed",
            Ignore::EncodeFailed => "encode_failed",
            Ignore::SendFailed => "send_failed",
            Ignore::PoolBusy => "pool_busy",
            Ignore::PoolExhausted => "pool_exhausted",
            Ignore::StoreFailed => "store_failed",
        }
    }
}

/// What the reply function needs besides the request and the inventory.
#[derive(Debug, Clone)]
pub struct Settings {
    pub mode: Mode,
    /// Our address: server identifier, next server, boot URLs.
    pub server_ip: Ipv4Addr,
    /// `http://<public_ip>:<port>` for scripts and HTTP-boot binaries.
    pub http_base: String,
    /// x86-64 UEFI binary: `ipxe.efi` or `snponly.efi`.
    pub efi_binary: String,
    /// Whether `snp-arm64.efi` can be served (ARM64 clients get nothing otherwise).
    pub arm64_binary: bool,
}

/// Where a reply goes (RFC 2131 4.1, PXE 2.1 for port 4011).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dest {
    /// 255.255.255.255:68.
    Broadcast,
    /// A relay agent: giaddr, port 67.
    Relay(Ipv4Addr),
    /// A client that has an address: ciaddr, port 68.
    Client(Ipv4Addr),
    /// Back to where the request came from (port 4011 requests).
    Source,
}

#[derive(Debug)]
pub struct Reply {
    pub msg: Message,
    pub dest: Dest,
    pub kind: Kind,
    pub machine: Option<Key>,
    pub mac: Mac,
    pub fields: Fields,
    /// `msg` encoded as [`encode`] would, when it already was (sizing it).
    pub wire: Option<Vec<u8>>,
}

/// The event's fields, typed: serialised straight to the event's JSON text
/// (building a `serde_json::Value` per packet cost more than the reply).
#[derive(Debug, Serialize)]
#[serde(untagged)]
pub enum Fields {
    Lease {
        ip: Ipv4Addr,
        boot_file: Option<String>,
        no_boot: Option<Ignore>,
        arch: Option<u16>,
        ipxe: bool,
        relay: Option<RelayFields>,
        xid: Xid,
    },
    Nak {
        reason: String,
        relay: Option<RelayFields>,
        xid: Xid,
    },
    Proxy {
        boot_file: String,
        arch: Option<u16>,
        ipxe: bool,
        mode: &'static str,
        relay: Option<RelayFields>,
        xid: Xid,
    },
}

impl Fields {
    pub fn boot_file(&self) -> Option<&str> {
        match self {
            Fields::Lease { boot_file, .. } => boot_file.as_deref(),
            Fields::Proxy { boot_file, .. } => Some(boot_file),
            Fields::Nak { .. } => None,
        }
    }
}

/// Option 82 as the event shows it.
#[derive(Debug, Serialize)]
pub struct RelayFields {
    pub giaddr: Ipv4Addr,
    pub circuit_id: Option<String>,
    pub remote_id: Option<String>,
}

/// A transaction id, shown as `0x0000abcd`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Xid(pub u32);

impl Serialize for Xid {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let text = crate::text::hex32(self.0);
        s.serialize_str(std::str::from_utf8(&text).map_err(serde::ser::Error::custom)?)
    }
}

#[derive(Debug)]
pub enum Outcome {
    Reply(Box<Reply>),
    /// Not answered; the reason is a metric label.
    Ignore(Ignore),
    /// RELEASE/DECLINE: nothing to send, but the machine's log hears of it.
    Note {
        kind: Kind,
        machine: Key,
        mac: Mac,
        message: String,
    },
}

/// What kind of boot client is asking (from options 60, 77, 93, 175).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Client {
    pub mac: Mac,
    pub msg_type: MessageType,
    /// Option 60 starts with `PXEClient`.
    pub pxe: bool,
    /// Option 60 starts with `HTTPClient` (UEFI HTTP boot).
    pub http: bool,
    /// Already running iPXE (user class `iPXE` or option 175).
    pub ipxe: bool,
    /// Option 93, first entry.
    pub arch: Option<u16>,
}

impl Client {
    pub fn netboot(&self) -> bool {
        self.pxe || self.http || self.ipxe
    }
}

fn client_of(req: &Message) -> Result<Client, Ignore> {
    if req.opcode() != Opcode::BootRequest {
        return Err(Ignore::NotRequest);
    }
    if req.htype() != HType::Eth || req.hlen() != 6 {
        return Err(Ignore::NotEthernet);
    }
    let mac = Mac(req
        .chaddr()
        .get(..6)
        .and_then(|c| c.try_into().ok())
        .ok_or(Ignore::NotEthernet)?);
    let msg_type = match req.opts().get(OptionCode::MessageType) {
        Some(DhcpOption::MessageType(t)) => *t,
        _ => return Err(Ignore::NoMessageType),
    };
    let class = match req.opts().get(OptionCode::ClassIdentifier) {
        Some(DhcpOption::ClassIdentifier(c)) => c.as_slice(),
        _ => &[],
    };
    let user_class_ipxe = match req.opts().get(OptionCode::UserClass) {
        // RFC 3004 says length-prefixed; iPXE sends the bare string "iPXE".
        Some(DhcpOption::UserClass(u)) => u == b"iPXE" || u.get(1..) == Some(b"iPXE".as_slice()),
        _ => false,
    };
    let arch = match req.opts().get(OptionCode::ClientSystemArchitecture) {
        Some(DhcpOption::ClientSystemArchitecture(a)) => Some(a.0),
        _ => None,
    };
    Ok(Client {
        mac,
        msg_type,
        pxe: class.starts_with(b"PXEClient"),
        http: class.starts_with(b"HTTPClient"),
        ipxe: user_class_ipxe || req.opts().get(OptionCode::Unknown(OPT_IPXE)).is_some(),
        arch,
    })
}

/// The firmware a client runs, from option 93 (RFC 4578 and IANA's
/// processor architecture types): what picks the iPXE binary.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClientFirmware {
    /// 0: x86 BIOS.
    Bios,
    /// 6, 7, 9 (IA32, EFI BC, x86-64 UEFI) and 15, 16 (their HTTP boot).
    EfiX86,
    /// 11 and 19 (ARM 64-bit UEFI, and its HTTP boot).
    EfiArm64,
    Other(u16),
}

impl From<u16> for ClientFirmware {
    fn from(arch: u16) -> Self {
        match arch {
            0 => ClientFirmware::Bios,
            6 | 7 | 9 | 15 | 16 => ClientFirmware::EfiX86,
            11 | 19 => ClientFirmware::EfiArm64,
            other => ClientFirmware::Other(other),
        }
    }
}

/// The boot file for a client, and whether it is an HTTP-boot answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Boot {
    pub file: String,
    pub http_client: bool,
}

/// The iPXE binary for a client's firmware.
pub fn binary_for(fw: ClientFirmware, s: &Settings) -> Option<&str> {
    match fw {
        ClientFirmware::Bios => Some("undionly.kpxe"),
        ClientFirmware::EfiX86 => Some(&s.efi_binary),
        ClientFirmware::EfiArm64 if s.arm64_binary => Some("snp-arm64.efi"),
        _ => None,
    }
}

pub fn script_url(s: &Settings, mac: Mac) -> String {
    format!("{}/ipxe/script/{mac}/auto.ipxe", s.http_base)
}

/// Smee's decision table: iPXE gets its script URL, HTTP-boot firmware an
/// http:// binary, PXE firmware a TFTP file name.
pub fn boot_for(c: &Client, iface: Option<&Interface>, s: &Settings) -> Result<Boot, Ignore> {
    if iface.is_some_and(|i| !i.allow_pxe) {
        return Err(Ignore::PxeNotAllowed);
    }
    let extra = iface.map(Interface::extra);
    if c.ipxe {
        let url = match extra.and_then(|e| e.ipxe_url.as_deref()) {
            Some(u) => u.to_string(),
            None => script_url(s, c.mac),
        };
        return Ok(Boot {
            file: url,
            http_client: false,
        });
    }
    let binary = match extra.and_then(|e| e.ipxe_binary.as_deref()) {
        Some(b) => b,
        None => binary_for(c.arch.unwrap_or(0).into(), s).ok_or(Ignore::UnsupportedArch)?,
    };
    if c.http {
        Ok(Boot {
            file: format!("{}/ipxe/binary/{binary}", s.http_base),
            http_client: true,
        })
    } else {
        Ok(Boot {
            file: binary.to_string(),
            http_client: false,
        })
    }
}

/// Answer one request. Pure: no I/O, no clock.
pub fn respond(req: &Message, port: Port, snap: &Snapshot, s: &Settings) -> Outcome {
    if s.mode == Mode::Off {
        return Outcome::Ignore(Ignore::Off);
    }
    let c = match client_of(req) {
        Ok(c) => c,
        Err(why) => return Outcome::Ignore(why),
    };
    let found = snap.by_mac(&c.mac).map(|(m, i)| (&**m, i));
    if s.mode.is_proxy() {
        return proxy(req, port, &c, found, s);
    }
    if port == Port::Proxy {
        return Outcome::Ignore(Ignore::ProxyPortInReservationMode);
    }
    let Some((m, iface)) = found else {
        return Outcome::Ignore(Ignore::UnknownMac);
    };
    if iface.disable_dhcp {
        return Outcome::Ignore(Ignore::DhcpDisabled);
    }
    let Some(ip) = iface.ipv4() else {
        return Outcome::Ignore(Ignore::NoIpv4Reservation);
    };
    let key = m.key.clone();
    let server_id = match req.opts().get(OptionCode::ServerIdentifier) {
        Some(DhcpOption::ServerIdentifier(a)) => Some(*a),
        _ => None,
    };
    let requested = match req.opts().get(OptionCode::RequestedIpAddress) {
        Some(DhcpOption::RequestedIpAddress(a)) => Some(*a),
        _ => None,
    };
    let (reply_type, kind) = match c.msg_type {
        MessageType::Discover => (MessageType::Offer, Kind::DhcpOffer),
        MessageType::Request => {
            if server_id.is_some_and(|id| id != s.server_ip) {
                // RFC 2131 4.3.2: the client chose another server's offer.
                return Outcome::Ignore(Ignore::OtherServer);
            }
            let asked = requested.or_else(|| Some(req.ciaddr()).filter(|a| !a.is_unspecified()));
            match asked {
                Some(a) if a == ip => (MessageType::Ack, Kind::DhcpAck),
                Some(a) => {
                    return nak(
                        req,
                        &c,
                        Some(key),
                        format!("requested {a}, reserved {ip}"),
                        s,
                    );
                }
                None => return nak(req, &c, Some(key), "request names no address".into(), s),
            }
        }
        MessageType::Inform => (MessageType::Ack, Kind::DhcpInform),
        MessageType::Release => {
            return Outcome::Note {
                kind: Kind::DhcpRelease,
                machine: key,
                mac: c.mac,
                message: format!("DHCPRELEASE of {}", req.ciaddr()),
            };
        }
        MessageType::Decline => {
            return Outcome::Note {
                kind: Kind::DhcpDecline,
                machine: key,
                mac: c.mac,
                message: format!(
                    "DHCPDECLINE of {}: the address is in use on the network",
                    requested.unwrap_or(ip)
                ),
            };
        }
        _ => return Outcome::Ignore(Ignore::UnexpectedMessageType),
    };

    let mut msg = reply_base(req, reply_type, s);
    let inform = c.msg_type == MessageType::Inform;
    if !inform {
        msg.set_yiaddr(ip);
    }
    let mut opts = Opts::new(req);
    if !inform {
        let lease = iface.lease_time.unwrap_or(DEFAULT_LEASE);
        opts.core(DhcpOption::AddressLeaseTime(lease));
        opts.core(DhcpOption::Renewal(lease / 2));
        opts.core(DhcpOption::Rebinding(lease / 8 * 7));
    }
    address_options(&mut opts, iface, ip);
    let boot = if c.netboot() {
        boot_for(&c, Some(iface), s)
    } else {
        Err(Ignore::NotNetboot)
    };
    match &boot {
        Ok(b) => boot_options(&mut msg, &mut opts, &c, b, req, s),
        Err(Ignore::PxeNotAllowed) => netboot_not_allowed(&mut msg, &mut opts, &c),
        Err(_) => {}
    }
    let fields = lease_fields(req, &c, ip, boot);
    finish(msg, opts, req, &c, kind, Some(key), fields, Port::Dhcp)
}

/// The event fields of a lease given (with its boot file, or why none).
fn lease_fields(req: &Message, c: &Client, ip: Ipv4Addr, boot: Result<Boot, Ignore>) -> Fields {
    Fields::Lease {
        ip,
        no_boot: boot.as_ref().err().copied(),
        boot_file: boot.ok().map(|b| b.file),
        arch: c.arch,
        ipxe: c.ipxe,
        relay: relay_fields(req),
        xid: Xid(req.xid()),
    }
}

fn nak(req: &Message, c: &Client, key: Option<Key>, why: String, s: &Settings) -> Outcome {
    let mut msg = Message::default();
    msg.set_opcode(Opcode::BootReply)
        .set_htype(req.htype())
        .set_xid(req.xid())
        .set_flags(req.flags())
        .set_giaddr(req.giaddr())
        .set_chaddr(req.chaddr());
    // RFC 2131 4.3.2: a NAK goes to the relay, else broadcast.
    let dest = if req.giaddr().is_unspecified() {
        Dest::Broadcast
    } else {
        Dest::Relay(req.giaddr())
    };
    if !req.giaddr().is_unspecified() {
        msg.set_flags(req.flags().set_broadcast());
    }
    let mut opts = DhcpOptions::new();
    opts.insert(DhcpOption::MessageType(MessageType::Nak));
    opts.insert(DhcpOption::ServerIdentifier(s.server_ip));
    if let Some(o) = req.opts().get(OptionCode::RelayAgentInformation) {
        opts.insert(o.clone());
    }
    opts.insert(DhcpOption::Message(why.clone()));
    msg.set_opts(opts);
    Outcome::Reply(Box::new(Reply {
        msg,
        dest,
        kind: Kind::DhcpNak,
        machine: key,
        mac: c.mac,
        fields: Fields::Nak {
            reason: why,
            relay: relay_fields(req),
            xid: Xid(req.xid()),
        },
        wire: None,
    }))
}

/// Proxy modes: boot information only, never an address (PXE 2.1 2.2.1).
fn proxy(
    req: &Message,
    port: Port,
    c: &Client,
    found: Option<(&Machine, &Interface)>,
    s: &Settings,
) -> Outcome {
    if !c.netboot() {
        return Outcome::Ignore(Ignore::NotNetboot);
    }
    if s.mode == Mode::Proxy && found.is_none() {
        return Outcome::Ignore(Ignore::UnknownMac);
    }
    let iface = found.map(|(_, i)| i);
    let kind = match (port, c.msg_type) {
        (Port::Dhcp, MessageType::Discover) => Kind::DhcpProxyOffer,
        (Port::Proxy, MessageType::Request) => Kind::DhcpProxyAck,
        // A REQUEST on port 67 is for the real DHCP server.
        _ => return Outcome::Ignore(Ignore::NotForProxy),
    };
    let boot = match boot_for(c, iface, s) {
        Ok(b) => b,
        // Smee's answer: a boot file that cannot load, so the firmware
        // moves on at once instead of waiting out its PXE timeouts.
        Err(Ignore::PxeNotAllowed) => Boot {
            file: format!("/{}/{NETBOOT_NOT_ALLOWED}", c.mac),
            http_client: c.http,
        },
        Err(why) => return Outcome::Ignore(why),
    };
    let reply_type = if kind == Kind::DhcpProxyOffer {
        MessageType::Offer
    } else {
        MessageType::Ack
    };
    let mut msg = reply_base(req, reply_type, s);
    msg.set_yiaddr(Ipv4Addr::UNSPECIFIED);
    let mut opts = Opts::new(req);
    boot_options(&mut msg, &mut opts, c, &boot, req, s);
    let fields = Fields::Proxy {
        boot_file: boot.file,
        arch: c.arch,
        ipxe: c.ipxe,
        mode: s.mode.as_str(),
        relay: relay_fields(req),
        xid: Xid(req.xid()),
    };
    finish(
        msg,
        opts,
        req,
        c,
        kind,
        found.map(|(m, _)| m.key.clone()),
        fields,
        port,
    )
}

fn reply_base(req: &Message, t: MessageType, s: &Settings) -> Message {
    let mut msg = Message::default();
    msg.set_opcode(Opcode::BootReply)
        .set_htype(req.htype())
        .set_xid(req.xid())
        .set_flags(req.flags())
        .set_ciaddr(req.ciaddr())
        .set_giaddr(req.giaddr())
        .set_chaddr(req.chaddr());
    msg.opts_mut().insert(DhcpOption::MessageType(t));
    msg.opts_mut()
        .insert(DhcpOption::ServerIdentifier(s.server_ip));
    msg
}

fn address_options(opts: &mut Opts, i: &Interface, ip: Ipv4Addr) {
    if let Some(mask) = i.netmask {
        opts.core(DhcpOption::SubnetMask(mask));
        let bcast = Ipv4Addr::from(u32::from(ip) | !u32::from(mask));
        opts.requested(DhcpOption::BroadcastAddr(bcast));
    }
    if let Some(IpAddr::V4(gw)) = i.gateway {
        opts.core(DhcpOption::Router(vec![gw]));
    }
    let dns = v4_only(&i.name_servers);
    if !dns.is_empty() {
        opts.core(DhcpOption::DomainNameServer(dns));
    }
    if let Some(h) = i.hostname.as_deref() {
        opts.requested(DhcpOption::Hostname(h.to_string()));
    }
    let extra = i.extra();
    if let Some(dn) = extra.domain_name.as_deref() {
        opts.requested(DhcpOption::DomainName(dn.to_string()));
        if let Ok(name) = dhcproto::Name::from_str(dn) {
            opts.requested(DhcpOption::DomainSearch(vec![name]));
        }
    }
    let ntp = v4_only(&extra.time_servers);
    if !ntp.is_empty() {
        opts.requested(DhcpOption::NtpServers(ntp));
    }
    if !extra.routes.is_empty() {
        opts.requested(DhcpOption::ClasslessStaticRoute(extra.routes.to_vec()));
    }
}

fn v4_only(list: &[IpAddr]) -> Vec<Ipv4Addr> {
    list.iter()
        .filter_map(|a| match a {
            IpAddr::V4(a) => Some(*a),
            IpAddr::V6(_) => None,
        })
        .collect()
}

/// The boot file of a netboot client whose `allowPXE` is false (Smee's).
pub const NETBOOT_NOT_ALLOWED: &str = "netboot-not-allowed";

/// A netboot client that may not boot gets an address and a boot file that
/// cannot load (no next server), as Smee answers it. With no boot file at
/// all, UEFI PXE and HTTP boot wait out their DHCP timeouts for a better
/// offer (~60 s for each boot option, measured with OVMF) before the
/// firmware tries the disk; with this one each fails in ~3 s.
fn netboot_not_allowed(msg: &mut Message, opts: &mut Opts, c: &Client) {
    msg.set_siaddr(Ipv4Addr::UNSPECIFIED);
    msg.set_fname_str(format!("/{NETBOOT_NOT_ALLOWED}"));
    if c.http {
        // HTTP boot firmware takes only offers that say HTTPClient.
        opts.core(DhcpOption::ClassIdentifier(b"HTTPClient".to_vec()));
    }
}

fn boot_options(
    msg: &mut Message,
    opts: &mut Opts,
    c: &Client,
    b: &Boot,
    req: &Message,
    s: &Settings,
) {
    msg.set_siaddr(s.server_ip);
    // The `file` field holds 128 bytes; option 67 carries longer names.
    if b.file.len() < 128 {
        msg.set_fname_str(&b.file);
    }
    if b.file.len() >= 128 || opts.was_requested(OptionCode::BootfileName) {
        opts.core(DhcpOption::BootfileName(b.file.as_bytes().to_vec()));
    }
    opts.requested(DhcpOption::TFTPServerName(
        s.server_ip.to_string().into_bytes(),
    ));
    // PXE firmware ignores offers without option 60 = PXEClient (and UEFI
    // HTTP boot without HTTPClient).
    if b.http_client {
        opts.core(DhcpOption::ClassIdentifier(b"HTTPClient".to_vec()));
    } else if c.pxe {
        opts.core(DhcpOption::ClassIdentifier(b"PXEClient".to_vec()));
    }
    if c.pxe && !c.ipxe {
        // PXE 2.1 option 43, sub-option 6 (discovery control) = 8: boot
        // the file in this reply, skip boot-server discovery.
        opts.core(DhcpOption::VendorExtensions(vec![6, 1, 8, 255]));
    }
    if c.ipxe {
        // iPXE: do not wait for ProxyDHCP offers (saves ~3 s per boot).
        opts.core(DhcpOption::Unknown(UnknownOption::new(
            OptionCode::Unknown(OPT_IPXE),
            vec![IPXE_NO_PXEDHCP, 1, 1],
        )));
    }
    if let Some(DhcpOption::ClientMachineIdentifier(id)) =
        req.opts().get(OptionCode::ClientMachineIdentifier)
    {
        // PXE: echo the client's UUID.
        opts.core(DhcpOption::ClientMachineIdentifier(id.clone()));
    }
}

/// Options for a reply: "core" ones always go, the others only when the
/// client's parameter request list (55) names them (or it sent none).
struct Opts<'r> {
    prl: Option<&'r [OptionCode]>,
    core: Vec<DhcpOption>,
    extra: Vec<DhcpOption>,
    max: usize,
}

impl<'r> Opts<'r> {
    fn new(req: &'r Message) -> Self {
        let prl = match req.opts().get(OptionCode::ParameterRequestList) {
            Some(DhcpOption::ParameterRequestList(p)) => Some(p.as_slice()),
            _ => None,
        };
        // Option 57 counts the whole DHCP message (RFC 2132 9.10).
        let max = match req.opts().get(OptionCode::MaxMessageSize) {
            Some(DhcpOption::MaxMessageSize(m)) => (*m as usize).clamp(MIN_MESSAGE, 1472),
            _ => MIN_MESSAGE,
        };
        // Sized for a PXE reply's options: no reallocation on the way.
        Opts {
            prl,
            core: Vec::with_capacity(8),
            extra: Vec::with_capacity(8),
            max,
        }
    }

    fn was_requested(&self, code: OptionCode) -> bool {
        self.prl.is_some_and(|p| p.contains(&code))
    }

    fn core(&mut self, o: DhcpOption) {
        self.core.push(o);
    }

    fn requested(&mut self, o: DhcpOption) {
        let code = OptionCode::from(&o);
        if self.prl.is_none() || self.was_requested(code) {
            self.extra.push(o);
        }
    }
}

#[allow(clippy::too_many_arguments)]
fn finish(
    mut msg: Message,
    o: Opts,
    req: &Message,
    c: &Client,
    kind: Kind,
    machine: Option<Key>,
    fields: Fields,
    port: Port,
) -> Outcome {
    for opt in o.core {
        msg.opts_mut().insert(opt);
    }
    // RFC 3046 2.2: option 82 is echoed back unchanged.
    if let Some(relay) = req.opts().get(OptionCode::RelayAgentInformation) {
        msg.opts_mut().insert(relay.clone());
    }
    // Requested options in the client's order of preference; drop from the
    // end while the message does not fit its size limit (RFC 2131 4.1).
    let mut extra = o.extra;
    if let Some(prl) = &o.prl {
        extra.sort_by_key(|opt| {
            prl.iter()
                .position(|c| *c == OptionCode::from(opt))
                .unwrap_or(usize::MAX)
        });
    }
    // Extra codes differ from the core ones and from each other, so
    // removing one by code takes back exactly what was inserted.
    let codes: Vec<OptionCode> = extra.iter().map(OptionCode::from).collect();
    let mut wire = None;
    for opt in extra {
        msg.opts_mut().insert(opt);
    }
    let dest = match port {
        Port::Proxy => Dest::Source,
        Port::Dhcp if !req.giaddr().is_unspecified() => Dest::Relay(req.giaddr()),
        Port::Dhcp if !req.ciaddr().is_unspecified() => Dest::Client(req.ciaddr()),
        // Without ARP injection a unicast to yiaddr cannot reach a client
        // that has no address yet; RFC 2131 4.1 allows the broadcast.
        Port::Dhcp => Dest::Broadcast,
    };
    // Before encoding: set after it, the flag made every broadcast reply
    // to a client that had not asked for one be encoded twice.
    if dest == Dest::Broadcast && !msg.flags().broadcast() {
        msg.set_flags(Flags::default().set_broadcast());
    }
    let mut kept = codes.len();
    let mut buf = Vec::with_capacity(600);
    loop {
        let ok = encode_into(&msg, &mut buf).is_ok();
        if ok && buf.len() <= o.max {
            wire = Some(buf);
            break;
        }
        if kept == 0 {
            break;
        }
        kept -= 1;
        if let Some(code) = codes.get(kept) {
            msg.opts_mut().remove(*code);
        }
    }
    if let Some(w) = wire.as_mut()
        && w.len() < MIN_BOOTP
    {
        w.resize(MIN_BOOTP, 0);
    }
    Outcome::Reply(Box::new(Reply {
        msg,
        dest,
        kind,
        machine,
        mac: c.mac,
        fields,
        wire,
    }))
}

/// Decode a packet from the wire. dhcproto is a third-party parser fed
/// hostile input: a panic in it (there were debug assertions on option
/// lengths) must cost one packet, not the DHCP service, hence the unwind
/// guard.
pub fn decode(data: &[u8]) -> Option<Message> {
    use dhcproto::{Decodable, Decoder};
    std::panic::catch_unwind(|| Message::decode(&mut Decoder::new(data)).ok())
        .ok()
        .flatten()
}

/// Encode a reply, padded to the BOOTP minimum.
pub fn encode(m: &Message) -> Result<Vec<u8>, dhcproto::error::EncodeError> {
    let mut buf = Vec::with_capacity(600);
    encode_into(m, &mut buf)?;
    if buf.len() < MIN_BOOTP {
        buf.resize(MIN_BOOTP, 0);
    }
    Ok(buf)
}

/// A BOOTP message's fixed part, `op` to the magic cookie (RFC 2131 2).
const BOOTP_HEAD: usize = 240;

/// Encode `m` into `buf` (replacing what it held) as dhcproto's own
/// `Encodable` does (a test compares the two): the fixed header written
/// here, the options by dhcproto. Hand-written because dhcproto 0.15 pads
/// `sname` and `file` (192 bytes) one byte at a time, each a `Vec` push:
/// 3,300 instructions a reply in callgrind, a sixth of the DHCP thread's
/// user space. The options, the part with rules, stay dhcproto's.
fn encode_into(m: &Message, buf: &mut Vec<u8>) -> Result<(), dhcproto::error::EncodeError> {
    use dhcproto::error::EncodeError;
    let (sname, file) = (m.sname().unwrap_or_default(), m.fname().unwrap_or_default());
    if sname.len() > 64 || file.len() > 128 {
        return Err(EncodeError::StringSizeTooBig {
            len: sname.len().max(file.len()),
        });
    }
    // chaddr() slices 16 bytes by hlen: only dhcproto's encoder takes a
    // longer hlen (no reply has one: client_of refuses it).
    if m.hlen() > 16 {
        buf.clear();
        return m.encode(&mut Encoder::new(buf));
    }
    let mut head = [0u8; BOOTP_HEAD];
    head[0] = m.opcode().into();
    head[1] = m.htype().into();
    head[2] = m.hlen();
    head[3] = m.hops();
    head[4..8].copy_from_slice(&m.xid().to_be_bytes());
    head[8..10].copy_from_slice(&m.secs().to_be_bytes());
    head[10..12].copy_from_slice(&u16::from(m.flags()).to_be_bytes());
    for (i, a) in [m.ciaddr(), m.yiaddr(), m.siaddr(), m.giaddr()]
        .iter()
        .enumerate()
    {
        head[12 + 4 * i..16 + 4 * i].copy_from_slice(&a.octets());
    }
    let chaddr = m.chaddr();
    head[28..28 + chaddr.len()].copy_from_slice(chaddr);
    head[44..44 + sname.len()].copy_from_slice(sname);
    head[108..108 + file.len()].copy_from_slice(file);
    head[236..].copy_from_slice(&dhcproto::v4::MAGIC);
    // The options first (dhcproto's encoder writes from the buffer's
    // start), then moved up behind the header: no second buffer.
    buf.clear();
    m.opts().encode(&mut Encoder::new(buf))?;
    let n = buf.len();
    buf.resize(n + BOOTP_HEAD, 0);
    buf.copy_within(0..n, BOOTP_HEAD);
    buf[..BOOTP_HEAD].copy_from_slice(&head);
    Ok(())
}

fn relay_fields(req: &Message) -> Option<RelayFields> {
    let Some(DhcpOption::RelayAgentInformation(info)) =
        req.opts().get(OptionCode::RelayAgentInformation)
    else {
        return None;
    };
    let text = |code| match info.get(code) {
        Some(RelayInfo::AgentCircuitId(v)) | Some(RelayInfo::AgentRemoteId(v)) => {
            Some(printable(v))
        }
        _ => None,
    };
    Some(RelayFields {
        giaddr: req.giaddr(),
        circuit_id: text(RelayCode::AgentCircuitId),
        remote_id: text(RelayCode::AgentRemoteId),
    })
}

/// Relay ids are bytes: text when printable, else hex octets separated by
/// colons (a remote-id is often a switch's MAC, and reads best like one;
/// the `hex` crate has no separators).
fn printable(v: &[u8]) -> String {
    match std::str::from_utf8(v) {
        Ok(s) if s.chars().all(|c| !c.is_control()) => s.to_string(),
        _ => v
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect::<Vec<_>>()
            .join(":"),
    }
}

#[cfg(test)]
mod tests;
