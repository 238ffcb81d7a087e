//! The DHCP socket loops: UDP 67, and 4011 in the proxy modes. Each packet
//! is decoded, answered by [`super::respond`] from the current inventory
//! snapshot, encoded and sent; events and metrics are recorded on the way.

use super::{Dest, Outcome, Port, Settings, respond};
use crate::events::{Event, EventSink};
use crate::inventory::Inventory;
use crate::metrics::Metrics;
use dhcproto::v4::{DhcpOption, MessageType, OptionCode};
use socket2::{Domain, Protocol, Socket, Type};
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::sync::Arc;
use std::time::Instant;
use tokio::net::UdpSocket;

/// A UDP socket that may send broadcasts and share the port with another
/// DHCP server's socket on the same host (proxy mode beside dnsmasq).
pub fn bind(addr: SocketAddr, interface: Option<&str>) -> std::io::Result<UdpSocket> {
    let sock = Socket::new(Domain::for_address(addr), Type::DGRAM, Some(Protocol::UDP))?;
    sock.set_reuse_address(true)?;
    sock.set_broadcast(true)?;
    if let Some(ifname) = interface {
        // Replies (broadcasts included) leave through this interface only.
        sock.bind_device(Some(ifname.as_bytes()))?;
    }
    sock.set_nonblocking(true)?;
    sock.bind(&addr.into())?;
    UdpSocket::from_std(sock.into())
}

pub struct Shell {
    pub inventory: Arc<Inventory>,
    pub settings: Settings,
    pub events: EventSink,
    pub metrics: Arc<Metrics>,
}

impl Shell {
    /// Serve one socket until the task is dropped. Errors on a packet are
    /// logged and counted; the loop never stops for bad input.
    pub async fn run(self: Arc<Self>, sock: UdpSocket, port: Port) {
        let mut buf = vec![0u8; 4096];
        loop {
            let (n, src) = match sock.recv_from(&mut buf).await {
                Ok(x) => x,
                Err(e) => {
                    tracing::warn!(error = %e, "dhcp: receive failed");
                    continue;
                }
            };
            let t0 = Instant::now();
            self.handle(&sock, &buf[..n], src, port).await;
            self.metrics
                .dhcp_seconds
                .observe(t0.elapsed().as_secs_f64());
        }
    }

    async fn handle(&self, sock: &UdpSocket, data: &[u8], src: SocketAddr, port: Port) {
        let Some(req) = super::decode(data) else {
            self.metrics.dhcp_ignored("malformed");
            tracing::debug!(%src, len = data.len(), "dhcp: malformed packet");
            return;
        };
        let req_type = match req.opts().get(OptionCode::MessageType) {
            Some(DhcpOption::MessageType(t)) => type_name(*t),
            _ => "none",
        };
        self.metrics
            .dhcp_request(req_type, self.settings.mode.as_str());
        let snap = self.inventory.snapshot();
        match respond(&req, port, &snap, &self.settings) {
            Outcome::Ignore(why) => {
                self.metrics.dhcp_ignored(why);
                tracing::debug!(%src, reason = why, "dhcp: not answered");
            }
            Outcome::Note {
                kind,
                machine,
                mac,
                message,
            } => {
                self.events
                    .record(Event::new(kind, message).machine(machine).mac(mac));
            }
            Outcome::Reply(r) => {
                let to = match r.dest {
                    Dest::Broadcast => {
                        SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::BROADCAST, super::CLIENT_PORT))
                    }
                    Dest::Relay(g) => SocketAddr::V4(SocketAddrV4::new(g, super::SERVER_PORT)),
                    Dest::Client(c) => SocketAddr::V4(SocketAddrV4::new(c, super::CLIENT_PORT)),
                    Dest::Source => src,
                };
                let bytes = match super::encode(&r.msg) {
                    Ok(b) => b,
                    Err(e) => {
                        self.metrics.dhcp_ignored("encode_failed");
                        tracing::error!(error = %e, mac = %r.mac, "dhcp: cannot encode reply");
                        return;
                    }
                };
                if let Err(e) = sock.send_to(&bytes, to).await {
                    self.metrics.dhcp_ignored("send_failed");
                    tracing::warn!(error = %e, %to, "dhcp: send failed");
                    return;
                }
                self.metrics.dhcp_reply(r.kind, self.settings.mode.as_str());
                let what = r.kind.trim_start_matches("dhcp.").to_uppercase();
                let message = match r.fields.get("boot_file").and_then(|f| f.as_str()) {
                    Some(f) => format!("DHCP {what} to {to}, boot file {f}"),
                    None => format!("DHCP {what} to {to}"),
                };
                let mut e = Event::new(r.kind, message).mac(r.mac).fields(r.fields);
                if let Some(k) = r.machine {
                    e = e.machine(k);
                }
                self.events.record(e);
            }
        }
    }
}

fn type_name(t: MessageType) -> &'static str {
    match t {
        MessageType::Discover => "discover",
        MessageType::Request => "request",
        MessageType::Decline => "decline",
        MessageType::Release => "release",
        MessageType::Inform => "inform",
        MessageType::Offer | MessageType::Ack | MessageType::Nak => "reply",
        _ => "other",
    }
}
