//! The generator's packets, written and read by hand: a request is a fixed
//! template with the transaction id, MAC and two addresses patched in, and a
//! reply is read for five fields. dhcproto would decode every option of
//! every reply into allocations, which is the cost this generator exists
//! to avoid; the tests check both directions against dhcproto.

use std::net::Ipv4Addr;

pub const OFFER: u8 = 2;
pub const ACK: u8 = 5;
pub const NAK: u8 = 6;
const DISCOVER: u8 = 1;
const REQUEST: u8 = 3;
const MAGIC: [u8; 4] = [99, 130, 83, 99];
/// An x86-64 UEFI PXE client: option 93 = 7, option 60 = its class id.
const PXE: &[u8] = b"\x5d\x02\x00\x07\x3c\x20PXEClient:Arch:00007:UNDI:003016";
/// The fixed BOOTP header and the magic cookie.
const HEAD: usize = 240;
const MAX: usize = HEAD + 3 + 6 + 6 + PXE.len() + 1;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Discover,
    Request,
}

/// One BOOTREQUEST, ready to send.
#[derive(Clone)]
pub struct Packet {
    buf: [u8; MAX],
    len: usize,
    kind: Kind,
}

impl Packet {
    pub fn bytes(&self) -> &[u8] {
        &self.buf[..self.len]
    }

    pub fn kind(&self) -> Kind {
        self.kind
    }

    pub fn discover(xid: u32, mac: [u8; 6], giaddr: Option<Ipv4Addr>, pxe: bool) -> Packet {
        Self::build(DISCOVER, xid, mac, giaddr, pxe, None, None)
    }

    /// The REQUEST for an OFFER of `yiaddr` from `server_id` (selecting
    /// state, RFC 2131 4.3.2: both options set, ciaddr 0).
    pub fn request(
        xid: u32,
        mac: [u8; 6],
        giaddr: Option<Ipv4Addr>,
        pxe: bool,
        yiaddr: [u8; 4],
        server_id: Option<[u8; 4]>,
    ) -> Packet {
        Self::build(REQUEST, xid, mac, giaddr, pxe, Some(yiaddr), server_id)
    }

    /// From a relay (giaddr set): hops 1, no broadcast flag. Without one: a
    /// client with no address yet, so the broadcast flag.
    fn build(
        kind: u8,
        xid: u32,
        mac: [u8; 6],
        giaddr: Option<Ipv4Addr>,
        pxe: bool,
        requested: Option<[u8; 4]>,
        server_id: Option<[u8; 4]>,
    ) -> Packet {
        let mut buf = [0u8; MAX];
        buf[0] = 1; // BOOTREQUEST
        buf[1] = 1; // Ethernet
        buf[2] = 6;
        buf[4..8].copy_from_slice(&xid.to_be_bytes());
        match giaddr {
            Some(g) => {
                buf[3] = 1;
                buf[24..28].copy_from_slice(&g.octets());
            }
            None => buf[10] = 0x80,
        }
        buf[28..34].copy_from_slice(&mac);
        buf[236..240].copy_from_slice(&MAGIC);
        let mut n = HEAD;
        let mut put = |b: &[u8]| {
            buf[n..n + b.len()].copy_from_slice(b);
            n += b.len();
        };
        put(&[53, 1, kind]);
        if let Some(r) = requested {
            put(&[50, 4]);
            put(&r);
        }
        if let Some(s) = server_id {
            put(&[54, 4]);
            put(&s);
        }
        if pxe {
            put(PXE);
        }
        put(&[255]);
        Packet {
            buf,
            len: n,
            kind: if kind == DISCOVER {
                Kind::Discover
            } else {
                Kind::Request
            },
        }
    }
}

/// What the generator reads of a BOOTREPLY.
#[derive(Debug, PartialEq, Eq)]
pub struct Reply {
    pub xid: u32,
    pub kind: u8,
    pub yiaddr: [u8; 4],
    pub chaddr: [u8; 6],
    pub server_id: Option<[u8; 4]>,
}

/// None for anything but a BOOTREPLY with a message type. Options are read
/// up to the end option or the end of the data; option overload is not
/// followed (no server here uses it for these fields).
pub fn parse_reply(data: &[u8]) -> Option<Reply> {
    if data.len() < HEAD || data[0] != 2 || data[236..240] != MAGIC {
        return None;
    }
    let (mut kind, mut server_id) = (None, None);
    let mut i = HEAD;
    while let Some(&code) = data.get(i) {
        match code {
            255 => break,
            0 => i += 1,
            _ => {
                let n = usize::from(*data.get(i + 1)?);
                let v = data.get(i + 2..i + 2 + n)?;
                match (code, v) {
                    (53, [t]) => kind = Some(*t),
                    (54, [a, b, c, d]) => server_id = Some([*a, *b, *c, *d]),
                    _ => {}
                }
                i += 2 + n;
            }
        }
    }
    Some(Reply {
        xid: u32::from_be_bytes(data[4..8].try_into().ok()?),
        kind: kind?,
        yiaddr: data[16..20].try_into().ok()?,
        chaddr: data[28..34].try_into().ok()?,
        server_id,
    })
}

/// `aa:bb:cc:dd:ee:ff` (or without colons).
pub fn parse_mac(s: &str) -> Option<[u8; 6]> {
    let hex: String = s.chars().filter(|c| *c != ':' && *c != '-').collect();
    if hex.len() != 12 {
        return None;
    }
    let mut mac = [0u8; 6];
    for (k, b) in mac.iter_mut().enumerate() {
        *b = u8::from_str_radix(hex.get(2 * k..2 * k + 2)?, 16).ok()?;
    }
    Some(mac)
}

/// xorshift64*: a MAC pick per exchange needs speed, not quality, and no
/// crate for three lines.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed.max(1))
    }

    /// Uniform enough in 0..n (n > 0) for picking MACs.
    pub fn below(&mut self, n: usize) -> usize {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        let r = self.0.wrapping_mul(0x2545_F491_4F6C_DD1D);
        ((u128::from(r) * n as u128) >> 64) as usize
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use dhcproto::v4::{self, DhcpOption, Flags, Message, MessageType, OptionCode};
    use dhcproto::{Decodable, Decoder, Encodable, Encoder};

    const MAC: [u8; 6] = [2, 0, 0, 0, 1, 2];

    fn decode(p: &Packet) -> Message {
        Message::decode(&mut Decoder::new(p.bytes())).unwrap()
    }

    #[test]
    fn relayed_discover_as_dhcproto_reads_it() {
        let g = Ipv4Addr::new(10, 64, 0, 9);
        let m = decode(&Packet::discover(0x0102_0304, MAC, Some(g), true));
        assert_eq!(m.opcode(), v4::Opcode::BootRequest);
        assert_eq!(m.xid(), 0x0102_0304);
        assert_eq!((m.giaddr(), m.hops()), (g, 1));
        assert!(!m.flags().broadcast());
        assert_eq!(&m.chaddr()[..6], &MAC);
        assert_eq!(m.opts().msg_type(), Some(MessageType::Discover));
        assert_eq!(
            m.opts().get(OptionCode::ClientSystemArchitecture),
            Some(&DhcpOption::ClientSystemArchitecture(v4::Architecture(7)))
        );
        assert_eq!(
            m.opts().get(OptionCode::ClassIdentifier),
            Some(&DhcpOption::ClassIdentifier(
                b"PXEClient:Arch:00007:UNDI:003016".to_vec()
            ))
        );
    }

    #[test]
    fn direct_request_as_dhcproto_reads_it() {
        let p = Packet::request(7, MAC, None, false, [10, 64, 0, 5], Some([10, 64, 0, 1]));
        assert_eq!(p.kind(), Kind::Request);
        let m = decode(&p);
        assert_eq!((m.giaddr(), m.hops()), (Ipv4Addr::UNSPECIFIED, 0));
        assert!(m.flags().broadcast());
        assert_eq!(m.opts().msg_type(), Some(MessageType::Request));
        assert_eq!(
            m.opts().get(OptionCode::RequestedIpAddress),
            Some(&DhcpOption::RequestedIpAddress(Ipv4Addr::new(10, 64, 0, 5)))
        );
        assert_eq!(
            m.opts().get(OptionCode::ServerIdentifier),
            Some(&DhcpOption::ServerIdentifier(Ipv4Addr::new(10, 64, 0, 1)))
        );
        assert!(m.opts().get(OptionCode::ClassIdentifier).is_none());
    }

    fn offer() -> Vec<u8> {
        let mut m = Message::new(
            Ipv4Addr::UNSPECIFIED,
            Ipv4Addr::new(10, 64, 0, 5),
            Ipv4Addr::new(10, 64, 0, 1),
            Ipv4Addr::UNSPECIFIED,
            &MAC,
        );
        m.set_opcode(v4::Opcode::BootReply)
            .set_xid(0xAABB_CCDD)
            .set_flags(Flags::default());
        m.opts_mut().insert(DhcpOption::Pad);
        m.opts_mut()
            .insert(DhcpOption::MessageType(MessageType::Offer));
        m.opts_mut()
            .insert(DhcpOption::ServerIdentifier(Ipv4Addr::new(10, 64, 0, 1)));
        m.opts_mut().insert(DhcpOption::Hostname("m-5".into()));
        let mut out = Vec::new();
        m.encode(&mut Encoder::new(&mut out)).unwrap();
        out
    }

    #[test]
    fn reads_a_dhcproto_offer() {
        assert_eq!(
            parse_reply(&offer()),
            Some(Reply {
                xid: 0xAABB_CCDD,
                kind: OFFER,
                yiaddr: [10, 64, 0, 5],
                chaddr: MAC,
                server_id: Some([10, 64, 0, 1]),
            })
        );
    }

    /// Every truncation of a reply, and requests, are refused or read
    /// without a panic.
    #[test]
    fn short_and_wrong_packets() {
        let o = offer();
        for n in 0..o.len() {
            let _ = parse_reply(&o[..n]);
        }
        assert_eq!(parse_reply(&o[..HEAD]), None, "no message type");
        let d = Packet::discover(1, MAC, None, false);
        assert_eq!(parse_reply(d.bytes()), None, "a request is not a reply");
        let mut bad = o.clone();
        bad[HEAD + 1] = 200; // an option running past the end
        assert_eq!(parse_reply(&bad), None);
    }

    #[test]
    fn macs_and_picks() {
        assert_eq!(parse_mac("02:00:00:00:01:02"), Some(MAC));
        assert_eq!(parse_mac("020000000102"), Some(MAC));
        assert_eq!(parse_mac("02:00:00:00:01"), None);
        assert_eq!(parse_mac("zz:00:00:00:01:02"), None);
        let mut r = Rng::new(42);
        let mut seen = [0u32; 10];
        for _ in 0..10_000 {
            seen[r.below(10)] += 1;
        }
        assert!(seen.iter().all(|&c| (800..1200).contains(&c)), "{seen:?}");
    }
}
