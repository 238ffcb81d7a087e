//! The DHCP socket loops: UDP 67, and 4011 in the proxy modes. Each packet
//! is decoded, answered by [`super::respond`] from the current inventory
//! snapshot, encoded and sent; events and metrics are recorded on the way.
//!
//! Each socket is read by OS threads of its own (port 67: `dhcp.threads`)
//! doing blocking `recvmsg`/`sendmsg` rather than tasks on the tokio
//! runtime: a request then costs two system calls and one wake-up of the
//! thread that answers it. On tokio every
//! packet also went through epoll and woke a second worker to look for
//! work, which was about a third of the server's CPU per DORA under load,
//! and the answer could wait behind whatever task shared its worker
//! (measured: BENCHMARKS.md).

use super::{Dest, Ignore, Outcome, Port, Reply, Settings, respond};
use crate::events::{Event, EventSink};
use crate::inventory::Inventory;
use crate::metrics::Metrics;
use dhcproto::v4::{DhcpOption, MessageType, OptionCode};
use nix::sys::socket::{self, ControlMessage, MsgFlags, SockaddrIn, sockopt};
use socket2::{Domain, Protocol, Socket, Type};
use std::io::{self, IoSlice};
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4, UdpSocket};
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// A UDP socket that may send broadcasts, share the port with another DHCP
/// server's socket on the same host (proxy mode beside dnsmasq), and learns
/// each request's interface (IP_PKTINFO) so that broadcast replies leave
/// through it, not through the default route's interface. Blocking, with a
/// receive timeout so that its thread sees a stop request.
pub fn bind(addr: SocketAddr, interface: Option<&str>) -> std::io::Result<UdpSocket> {
    let sock = Socket::new(Domain::for_address(addr), Type::DGRAM, Some(Protocol::UDP))?;
    sock.set_reuse_address(true)?;
    sock.set_broadcast(true)?;
    // Room for a burst (a rack powered on at once) while the thread is off
    // the CPU: the kernel default (~200 KiB) holds about 150 requests.
    // Beyond net.core.rmem_max only with CAP_NET_ADMIN (FORCE); without
    // it the kernel caps the plain request at rmem_max.
    if socket::setsockopt(&sock, sockopt::RcvBufForce, &RECV_BUFFER).is_err() {
        let _ = sock.set_recv_buffer_size(RECV_BUFFER);
    }
    socket::setsockopt(&sock, sockopt::Ipv4PacketInfo, &true)?;
    if let Some(ifname) = interface {
        // Replies (broadcasts included) leave through this interface only.
        sock.bind_device(Some(ifname.as_bytes()))?;
    }
    sock.set_read_timeout(Some(STOP_POLL))?;
    // A full send buffer is not worth blocking the answers behind it.
    sock.set_write_timeout(Some(SEND_TIMEOUT))?;
    sock.bind(&addr.into())?;
    Ok(sock.into())
}

/// Receive buffer asked for on the DHCP sockets.
const RECV_BUFFER: usize = 4 << 20;

/// How often an idle socket thread looks at its stop flag.
const STOP_POLL: Duration = Duration::from_millis(200);

/// Longest a reply may wait for room in the socket's send buffer.
const SEND_TIMEOUT: Duration = Duration::from_millis(100);

pub struct Shell {
    pub inventory: Arc<Inventory>,
    pub settings: Settings,
    pub events: EventSink,
    pub metrics: Arc<Metrics>,
    /// Reservation mode with a discovery pool: where unknown MACs go.
    pub pool: Option<super::discovery::Handoff>,
}

impl Shell {
    /// Serve `sock` on a thread of its own until `stop` is set (seen within
    /// [`STOP_POLL`]). Errors on a packet are logged and counted; the loop
    /// never stops for bad input.
    pub fn spawn(
        self: Arc<Self>,
        sock: UdpSocket,
        port: Port,
        stop: Arc<AtomicBool>,
    ) -> io::Result<JoinHandle<()>> {
        let name = match port {
            Port::Dhcp => "dhcp",
            Port::Proxy => "dhcp-proxy",
        };
        std::thread::Builder::new()
            .name(name.into())
            .spawn(move || self.run(&sock, port, &stop))
    }

    fn run(&self, sock: &UdpSocket, port: Port, stop: &AtomicBool) {
        let mut buf = vec![0u8; 4096];
        while !stop.load(Ordering::Relaxed) {
            let d = match crate::udp::recv_pktinfo(sock.as_raw_fd(), &mut buf) {
                Ok(d) => d,
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::WouldBlock
                            | io::ErrorKind::TimedOut
                            | io::ErrorKind::Interrupted
                    ) =>
                {
                    continue;
                }
                Err(e) => {
                    tracing::warn!(error = %e, "dhcp: receive failed");
                    continue;
                }
            };
            let t0 = Instant::now();
            if self.handle(sock, &buf[..d.len], d.src, d.ifindex, port) {
                self.metrics
                    .dhcp_seconds
                    .observe(t0.elapsed().as_secs_f64());
            }
        }
    }

    /// True when a reply was sent.
    fn handle(
        &self,
        sock: &UdpSocket,
        data: &[u8],
        src: SocketAddr,
        ifindex: Option<u32>,
        port: Port,
    ) -> bool {
        let Some(req) = super::decode(data) else {
            self.metrics.dhcp_ignored(Ignore::Malformed.as_str());
            tracing::debug!(%src, len = data.len(), "dhcp: malformed packet");
            return false;
        };
        let req_type = match req.opts().get(OptionCode::MessageType) {
            Some(DhcpOption::MessageType(t)) => type_name(*t),
            _ => "none",
        };
        self.metrics
            .dhcp_request(req_type, self.settings.mode.as_str());
        let snap = self.inventory.snapshot();
        match respond(&req, port, &snap, &self.settings) {
            Outcome::Ignore(Ignore::UnknownMac | Ignore::NoIpv4Reservation)
                if port == Port::Dhcp
                    && self.settings.mode == super::Mode::Reservation
                    && self.pool.is_some() =>
            {
                // Unknown MAC (or a Hardware interface with no address: a
                // discovered machine's other NICs), a pool to lease from:
                // its own thread decides, so the pool's work never holds
                // up the known hosts here.
                if let Some(pool) = &self.pool
                    && !pool.submit(req, src, ifindex)
                {
                    self.metrics.dhcp_ignored(Ignore::PoolBusy.as_str());
                    tracing::debug!(%src, "dhcp: discovery pool busy, request dropped");
                }
                false
            }
            Outcome::Ignore(why) => {
                self.metrics.dhcp_ignored(why.as_str());
                tracing::debug!(%src, reason = why.as_str(), "dhcp: not answered");
                false
            }
            Outcome::Note {
                kind,
                machine,
                mac,
                message,
            } => {
                self.events
                    .record(Event::new(kind, message).machine(machine).mac(mac));
                false
            }
            Outcome::Reply(r) => deliver(
                sock,
                r,
                src,
                ifindex,
                &self.metrics,
                &self.events,
                self.settings.mode,
            ),
        }
    }
}

/// Send a reply where `r.dest` says (a broadcast through the interface the
/// request came in on, `ifindex`), then count it and record its event.
/// True when it was sent. Shared by the socket threads and the discovery
/// pool's.
pub(super) fn deliver(
    sock: &UdpSocket,
    mut r: Box<Reply>,
    src: SocketAddr,
    ifindex: Option<u32>,
    metrics: &Metrics,
    events: &EventSink,
    mode: super::Mode,
) -> bool {
    let to = match r.dest {
        Dest::Broadcast => SocketAddrV4::new(Ipv4Addr::BROADCAST, super::CLIENT_PORT),
        Dest::Relay(g) => SocketAddrV4::new(g, super::SERVER_PORT),
        Dest::Client(c) => SocketAddrV4::new(c, super::CLIENT_PORT),
        Dest::Source => match src {
            SocketAddr::V4(a) => a,
            SocketAddr::V6(_) => return false,
        },
    };
    // Only a broadcast needs the interface named: unicast
    // follows the routing table to the relay or the client.
    let via = if r.dest == Dest::Broadcast {
        ifindex
    } else {
        None
    };
    let encoded = match r.wire.take() {
        Some(b) => Ok(b),
        None => super::encode(&r.msg),
    };
    let bytes = match encoded {
        Ok(b) => b,
        Err(e) => {
            metrics.dhcp_ignored(Ignore::EncodeFailed.as_str());
            tracing::error!(error = %e, mac = %r.mac, "dhcp: cannot encode reply");
            return false;
        }
    };
    if let Err(e) = send(sock, &bytes, to, via) {
        metrics.dhcp_ignored(Ignore::SendFailed.as_str());
        tracing::warn!(error = %e, %to, "dhcp: send failed");
        return false;
    }
    metrics.dhcp_reply(r.kind.as_str(), mode.as_str());
    let mut e = Event::new(
        r.kind,
        reply_message(r.kind.as_str(), to, r.fields.boot_file()),
    )
    .mac(r.mac)
    .fields(&r.fields);
    if !r.msg.yiaddr().is_unspecified() {
        e = e.ip(std::net::IpAddr::V4(r.msg.yiaddr()));
    }
    if let Some(k) = r.machine {
        e = e.machine(k);
    }
    events.record(e);
    true
}

// std's UdpSocket has no sendmsg with control messages; nix's safe wrapper has.
fn send(sock: &UdpSocket, bytes: &[u8], to: SocketAddrV4, ifindex: Option<u32>) -> io::Result<()> {
    let dest = SockaddrIn::from(to);
    let info = ifindex
        .and_then(|i| i32::try_from(i).ok())
        .map(|i| nix::libc::in_pktinfo {
            ipi_ifindex: i,
            ipi_spec_dst: nix::libc::in_addr { s_addr: 0 },
            ipi_addr: nix::libc::in_addr { s_addr: 0 },
        });
    let cmsgs: Vec<ControlMessage> = info.iter().map(ControlMessage::Ipv4PacketInfo).collect();
    loop {
        match socket::sendmsg(
            sock.as_raw_fd(),
            &[IoSlice::new(bytes)],
            &cmsgs,
            MsgFlags::empty(),
            Some(&dest),
        ) {
            Err(nix::errno::Errno::EINTR) => continue,
            r => return r.map(drop).map_err(io::Error::from),
        }
    }
}

/// `DHCP OFFER to 10.0.0.5:68, boot file ipxe.efi`, in one allocation.
fn reply_message(kind: &str, to: SocketAddrV4, boot_file: Option<&str>) -> String {
    use std::fmt::Write;
    let what = kind.trim_start_matches("dhcp.");
    let mut m = String::with_capacity(48 + boot_file.map_or(0, str::len));
    m.push_str("DHCP ");
    m.extend(what.chars().map(|c| c.to_ascii_uppercase()));
    let _ = write!(m, " to {to}");
    if let Some(f) = boot_file {
        m.push_str(", boot file ");
        m.push_str(f);
    }
    m
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The buffer asked for, or as much of it as the kernel grants
    /// without privilege (`net.core.rmem_max`); never the default.
    #[test]
    fn sockets_get_a_burst_sized_receive_buffer() {
        let sock = bind("127.0.0.1:0".parse().unwrap(), None).unwrap();
        let got = socket2::SockRef::from(&sock).recv_buffer_size().unwrap();
        let rmem_max: usize = std::fs::read_to_string("/proc/sys/net/core/rmem_max")
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        let plain = UdpSocket::bind("127.0.0.1:0").unwrap();
        let default = socket2::SockRef::from(&plain).recv_buffer_size().unwrap();
        // The kernel reports twice what was set (its bookkeeping share).
        // SO_RCVBUFFORCE (with CAP_NET_ADMIN) grants it all; without, the
        // plain request is capped at rmem_max.
        let forced = socket::setsockopt(&plain, sockopt::RcvBufForce, &RECV_BUFFER).is_ok();
        let want = if forced {
            2 * RECV_BUFFER
        } else {
            2 * RECV_BUFFER.min(rmem_max)
        };
        assert_eq!(got, want, "default {default}, rmem_max {rmem_max}");
        assert!(
            got > default || rmem_max * 2 <= default,
            "{got} <= {default}"
        );
    }
}
