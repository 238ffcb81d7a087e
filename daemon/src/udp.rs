//! `recvmsg` with IP_PKTINFO / IPV6_RECVPKTINFO, for the UDP servers that
//! must know where a datagram came in: DHCP (the interface, so a broadcast
//! reply leaves by it) and TFTP (the address the client asked, so the
//! transfer answers from it). Neither std nor tokio exposes control
//! messages; nix's safe wrappers do, and this is the one place that reads
//! them.

use nix::sys::socket::{self, ControlMessageOwned, MsgFlags, SockaddrStorage};
use std::io::{self, IoSliceMut};
use std::net::{IpAddr, SocketAddr};
use std::os::fd::RawFd;

/// One received datagram: its length in the buffer, its source, and what
/// the packet-info control message said (when the socket asked for it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Received {
    pub len: usize,
    pub src: SocketAddr,
    /// The interface it arrived on.
    pub ifindex: Option<u32>,
    /// The local address it was sent to (for a broadcast, the interface's
    /// address on v4: `ipi_spec_dst`).
    pub dst: Option<IpAddr>,
}

/// One `recvmsg` on `fd` (blocking or not, as the socket is; a non-blocking
/// socket with nothing queued gives `WouldBlock`).
pub fn recv_pktinfo(fd: RawFd, buf: &mut [u8]) -> io::Result<Received> {
    let mut iov = [IoSliceMut::new(buf)];
    // Room for either kind; a socket gets one or the other.
    let mut cmsg = nix::cmsg_space!(nix::libc::in6_pktinfo);
    let msg = socket::recvmsg::<SockaddrStorage>(fd, &mut iov, Some(&mut cmsg), MsgFlags::empty())?;
    let (mut ifindex, mut dst) = (None, None);
    for c in msg.cmsgs()? {
        match c {
            ControlMessageOwned::Ipv4PacketInfo(i) => {
                ifindex = u32::try_from(i.ipi_ifindex).ok();
                dst = Some(IpAddr::from(i.ipi_spec_dst.s_addr.to_ne_bytes()));
            }
            ControlMessageOwned::Ipv6PacketInfo(i) => {
                ifindex = Some(i.ipi6_ifindex);
                dst = Some(IpAddr::from(i.ipi6_addr.s6_addr));
            }
            _ => {}
        }
    }
    let src = msg
        .address
        .and_then(|a| {
            a.as_sockaddr_in()
                .map(|a| SocketAddr::from((a.ip(), a.port())))
                .or_else(|| {
                    a.as_sockaddr_in6()
                        .map(|a| SocketAddr::from((a.ip(), a.port())))
                })
        })
        .ok_or_else(|| io::Error::other("datagram without a source address"))?;
    Ok(Received {
        len: msg.bytes,
        src,
        ifindex,
        dst,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use nix::sys::socket::{setsockopt, sockopt};
    use std::net::UdpSocket;
    use std::os::fd::AsRawFd;

    /// Over loopback: the source, the length, and the packet info (lo's
    /// index and the address the datagram was sent to), v4 and v6.
    #[test]
    fn reads_source_and_packet_info() {
        for (bind, v6) in [("127.0.0.1:0", false), ("[::1]:0", true)] {
            let Ok(rx) = UdpSocket::bind(bind) else {
                assert!(v6, "no IPv4 loopback");
                continue; // a host without IPv6 on lo
            };
            if v6 {
                setsockopt(&rx, sockopt::Ipv6RecvPacketInfo, &true).unwrap();
            } else {
                setsockopt(&rx, sockopt::Ipv4PacketInfo, &true).unwrap();
            }
            let tx = UdpSocket::bind(bind).unwrap();
            tx.send_to(b"hello", rx.local_addr().unwrap()).unwrap();
            let mut buf = [0u8; 64];
            let r = recv_pktinfo(rx.as_raw_fd(), &mut buf).unwrap();
            assert_eq!(&buf[..r.len], b"hello");
            assert_eq!(r.src, tx.local_addr().unwrap());
            assert_eq!(r.dst, Some(rx.local_addr().unwrap().ip()));
            let lo = nix::net::if_::if_nametoindex("lo").unwrap();
            assert_eq!(r.ifindex, Some(lo));
        }
    }

    /// Without the option there is no packet info, and no error.
    #[test]
    fn without_packet_info() {
        let rx = UdpSocket::bind("127.0.0.1:0").unwrap();
        let tx = UdpSocket::bind("127.0.0.1:0").unwrap();
        tx.send_to(b"x", rx.local_addr().unwrap()).unwrap();
        let mut buf = [0u8; 8];
        let r = recv_pktinfo(rx.as_raw_fd(), &mut buf).unwrap();
        assert_eq!((r.len, r.ifindex, r.dst), (1, None, None));
    }
}
