//! A datagram on port 67 or 4011: `dhcp::decode`, then `dhcp::respond` in
//! every mode on both ports against a small inventory, and `dhcp::encode`
//! of every reply.
//!
//! Each packet is answered twice: as it came, and with its client hardware
//! address replaced by one of the inventory's MACs (picked by the xid), so
//! that mutated packets reach the paths of known machines too.
//!
//! Checked besides "no panic": a reply's pre-encoded `wire` bytes are what
//! `encode` gives for its message (the server sends `wire` when it is set),
//! `encode` never fails on a reply built within the size limit, and an
//! encoded reply decodes again.
#![no_main]

use libfuzzer_sys::fuzz_target;
use std::net::Ipv4Addr;
use std::sync::LazyLock;
use tinkerbox::dhcp::{self, Mode, Outcome, Port, Settings};
use tinkerbox::inventory::Snapshot;
use tinkerbox_fuzz::{DHCP_MACS, dhcp_snapshot};

static SNAP: LazyLock<Snapshot> = LazyLock::new(dhcp_snapshot);

static SETTINGS: LazyLock<Vec<Settings>> = LazyLock::new(|| {
    [Mode::Reservation, Mode::Proxy, Mode::AutoProxy, Mode::Off]
        .into_iter()
        .enumerate()
        .map(|(i, mode)| Settings {
            mode,
            server_ip: Ipv4Addr::new(10, 99, 0, 1),
            http_base: "http://10.99.0.1:7080".into(),
            efi_binary: if i % 2 == 0 {
                "ipxe.efi"
            } else {
                "snponly.efi"
            }
            .into(),
            arm64_binary: i % 2 == 0,
        })
        .collect()
});

fn answer_all(req: &dhcproto::v4::Message) {
    for s in SETTINGS.iter() {
        for port in [Port::Dhcp, Port::Proxy] {
            let out = dhcp::respond(req, port, &SNAP, s);
            let Outcome::Reply(r) = out else { continue };
            let encoded = dhcp::encode(&r.msg);
            if let Some(w) = &r.wire {
                assert_eq!(
                    Some(w),
                    encoded.as_ref().ok(),
                    "{}: the sized bytes differ from encode(msg)",
                    r.kind
                );
            }
            if let Ok(bytes) = &encoded {
                assert!(
                    dhcp::decode(bytes).is_some(),
                    "{}: our own reply does not decode",
                    r.kind
                );
            }
            // The event's fields, as the server serialises them.
            let _ = serde_json::to_string(&r.fields);
            let _ = r.fields.boot_file();
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let Some(req) = dhcp::decode(data) else {
        return;
    };
    answer_all(&req);
    // The same packet from a known machine: htype Ethernet, chaddr (and hlen
    // 6) with one of the inventory's MACs. (`Message::chaddr()` panics when
    // the decoded hlen is over 16, so it is not read here; the daemon reads
    // it only after checking that hlen is 6.)
    let mut known = req;
    let mac = DHCP_MACS[known.xid() as usize % DHCP_MACS.len()];
    known.set_htype(dhcproto::v4::HType::Eth).set_chaddr(&mac);
    answer_all(&known);
});
