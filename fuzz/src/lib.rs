//! What the fuzz targets share: the inventory they answer from, and a
//! reader that turns the fuzzer's bytes into numbers and strings.
//!
//! Nothing here may panic on any input: a panic must come from the daemon.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use tinkerbox::hardware::{self, Machine};
use tinkerbox::inventory::Snapshot;

/// MACs of the DHCP inventory, in the order of [`DHCP_HW`]'s interfaces.
pub const DHCP_MACS: [[u8; 6]; 6] = [
    [0x52, 0x54, 0x00, 0x99, 0x00, 0x01],
    [0x52, 0x54, 0x00, 0x99, 0x00, 0x02],
    [0x52, 0x54, 0x00, 0x99, 0x00, 0x03],
    [0x52, 0x54, 0x00, 0x99, 0x00, 0x04],
    [0x52, 0x54, 0x00, 0x99, 0x00, 0x05],
    [0x52, 0x54, 0x00, 0x99, 0x00, 0x06],
];

/// The DHCP inventory: every kind of interface `respond` tells apart
/// (reserved address with every option, PXE refused, DHCP disabled, a
/// custom binary and script URL, no reservation, a long lease, a second
/// machine).
pub const DHCP_HW: &str = include_str!("../fixtures/dhcp-inventory.yaml");

/// The snapshot the DHCP target answers from.
pub fn dhcp_snapshot() -> Snapshot {
    let docs = hardware::parse_documents(DHCP_HW).expect("fixture parses");
    Snapshot::build(
        docs.into_iter()
            .map(|d| hardware::validate(d).expect("fixture is valid").machine),
    )
}

/// The machine of the metadata unit tests (every metadata field set).
pub const METADATA_HW: &str = include_str!("../fixtures/metadata-machine.yaml");

pub fn metadata_machine() -> Machine {
    let mut docs = hardware::parse_documents(METADATA_HW).expect("fixture parses");
    hardware::validate(docs.remove(0))
        .expect("fixture is valid")
        .machine
}

/// Reads the fuzzer's bytes front to back; past the end everything is
/// zero or empty, so a target never has to check lengths.
pub struct Input<'a> {
    data: &'a [u8],
}

impl<'a> Input<'a> {
    pub fn new(data: &'a [u8]) -> Self {
        Input { data }
    }

    pub fn is_empty(&self) -> bool {
        self.data.is_empty()
    }

    pub fn u8(&mut self) -> u8 {
        match self.data.split_first() {
            Some((b, rest)) => {
                self.data = rest;
                *b
            }
            None => 0,
        }
    }

    pub fn bool(&mut self) -> bool {
        self.u8() & 1 == 1
    }

    pub fn u16(&mut self) -> u16 {
        u16::from_be_bytes([self.u8(), self.u8()])
    }

    pub fn u32(&mut self) -> u32 {
        u32::from_be_bytes([self.u8(), self.u8(), self.u8(), self.u8()])
    }

    /// Bytes up to the next NUL (not included), or the rest.
    pub fn field(&mut self) -> &'a [u8] {
        let end = self
            .data
            .iter()
            .position(|b| *b == 0)
            .unwrap_or(self.data.len());
        let (f, rest) = self.data.split_at(end);
        self.data = rest.get(1..).unwrap_or(&[]);
        f
    }

    /// The next field as text (invalid UTF-8 replaced).
    pub fn string(&mut self) -> String {
        String::from_utf8_lossy(self.field()).into_owned()
    }

    /// The next field, or `None` when it is empty.
    pub fn opt_string(&mut self) -> Option<String> {
        Some(self.string()).filter(|s| !s.is_empty())
    }

    /// Up to `max` strings, the count from one byte.
    pub fn strings(&mut self, max: u8) -> Vec<String> {
        let n = self.u8() % (max + 1);
        (0..n).map(|_| self.string()).collect()
    }

    /// An address: mostly from a few that the fixtures know, else any.
    pub fn ip(&mut self) -> IpAddr {
        match self.u8() % 8 {
            0 => IpAddr::V4(Ipv4Addr::new(10, 99, 0, 21)),
            1 => IpAddr::V4(Ipv4Addr::new(10, 99, 0, 22)),
            2 => "::ffff:10.99.0.21"
                .parse()
                .unwrap_or(IpAddr::V4(Ipv4Addr::LOCALHOST)),
            3 => IpAddr::V6(Ipv6Addr::from(std::array::from_fn::<u8, 16, _>(|_| {
                self.u8()
            }))),
            _ => IpAddr::V4(Ipv4Addr::from(self.u32())),
        }
    }

    /// Whatever is left.
    pub fn rest(&mut self) -> &'a [u8] {
        std::mem::take(&mut self.data)
    }
}
