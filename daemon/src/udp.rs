//! `recvmsg` with IP_PKTINFO / IPV6_RECVPKTINFO, for the UDP servers that
//! must know where a datagram came in: DHCP (the interface, so a broadcast
//! reply leaves by it) and TFTP (the address the client asked, so the
//! transfer answers from it). Neither std nor tokio exposes control
//! messages; nix's safe wrappers do, and this is the one place that reads
//! them. DHCP also reads and sends in batches ([`Batch`], [`Sender`]:
//! `recvmmsg`/`sendmmsg`), one system call for all that is queued.

use nix::sys::socket::{
    self, ControlMessage, ControlMessageOwned, MsgFlags, MultiHeaders, RecvMsg, SockaddrIn,
    SockaddrStorage,
};
use std::io::{self, IoSlice, IoSliceMut};
use std::net::{IpAddr, SocketAddr, SocketAddrV4};
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
    received(&msg)
}

/// What one received message's header says.
fn received(msg: &RecvMsg<'_, '_, SockaddrStorage>) -> io::Result<Received> {
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

/// Buffers for up to `n` datagrams, read in one `recvmmsg`.
pub struct Batch {
    headers: MultiHeaders<SockaddrStorage>,
    bufs: Vec<Vec<u8>>,
    got: Vec<Received>,
}

impl Batch {
    /// `n` datagrams of at most `size` bytes each (longer ones are cut).
    pub fn new(n: usize, size: usize) -> Batch {
        Batch {
            headers: MultiHeaders::preallocate(n, Some(nix::cmsg_space!(nix::libc::in6_pktinfo))),
            bufs: vec![vec![0; size]; n],
            got: Vec::with_capacity(n),
        }
    }

    /// How many datagrams a read takes at most.
    pub fn capacity(&self) -> usize {
        self.bufs.len()
    }

    /// Reads what is queued, up to [`Self::capacity`] datagrams. `wait`:
    /// first block for one, as long as the socket's receive timeout lets
    /// it (`MSG_WAITFORONE`: then only what is already there); otherwise
    /// an empty queue gives `WouldBlock`. A datagram without a source
    /// address (never from UDP) is left out.
    pub fn read(&mut self, fd: RawFd, wait: bool) -> io::Result<usize> {
        let flags = if wait {
            MsgFlags::MSG_WAITFORONE
        } else {
            MsgFlags::MSG_DONTWAIT
        };
        let Batch { headers, bufs, got } = self;
        got.clear();
        let mut iovs: Vec<[IoSliceMut<'_>; 1]> = bufs
            .iter_mut()
            .map(|b| [IoSliceMut::new(b.as_mut_slice())])
            .collect();
        let msgs = socket::recvmmsg(fd, headers, iovs.iter_mut(), flags, None)?;
        for m in msgs {
            // Every slot is one datagram (a failed one is not returned),
            // so the index stays the buffer's.
            got.push(received(&m).unwrap_or(Received {
                len: 0,
                src: SocketAddr::from(([0, 0, 0, 0], 0)),
                ifindex: None,
                dst: None,
            }));
        }
        if got.iter().any(|r| r.ifindex.is_none()) {
            // The kernel sets each header's control length to what it
            // wrote, and nix does not reset it: after a datagram without
            // packet info (a socket without the option) its slot would
            // have no room left for one. Fresh headers then; with the
            // option every datagram has the same info, which always fits.
            *headers = MultiHeaders::preallocate(
                bufs.len(),
                Some(nix::cmsg_space!(nix::libc::in6_pktinfo)),
            );
        }
        Ok(got.len())
    }

    /// The `i`th datagram of the last read (`i` below what it returned).
    pub fn get(&self, i: usize) -> Option<(&[u8], Received)> {
        let r = *self.got.get(i)?;
        if r.len == 0 {
            return None;
        }
        Some((self.bufs.get(i)?.get(..r.len)?, r))
    }
}

/// The packet info that sends a datagram out of interface `ifindex`.
fn pktinfo(ifindex: Option<u32>) -> Option<nix::libc::in_pktinfo> {
    ifindex
        .and_then(|i| i32::try_from(i).ok())
        .map(|i| nix::libc::in_pktinfo {
            ipi_ifindex: i,
            ipi_spec_dst: nix::libc::in_addr { s_addr: 0 },
            ipi_addr: nix::libc::in_addr { s_addr: 0 },
        })
}

/// Sends datagrams in batches (`sendmmsg`), all of one call with the same
/// interface (`IP_PKTINFO`, for broadcasts) or none.
pub struct Sender {
    plain: MultiHeaders<SockaddrIn>,
    with_info: MultiHeaders<SockaddrIn>,
    n: usize,
}

impl Sender {
    /// Up to `n` datagrams a call.
    pub fn new(n: usize) -> Sender {
        Sender {
            // Two sets of headers: one whose control space is unused would
            // be sent as an empty control message, which the kernel refuses.
            plain: MultiHeaders::preallocate(n, None),
            with_info: MultiHeaders::preallocate(n, Some(nix::cmsg_space!(nix::libc::in_pktinfo))),
            n,
        }
    }

    /// Sends `msgs` in order, leaving by interface `ifindex` when given.
    /// Returns how many were sent; fewer than all when the kernel refused
    /// the next one (that one's error with it), so the caller can count it
    /// and go on after it.
    pub fn send(
        &mut self,
        fd: RawFd,
        msgs: &[(&[u8], SocketAddrV4)],
        ifindex: Option<u32>,
    ) -> (usize, Option<io::Error>) {
        let info = pktinfo(ifindex);
        let cmsgs: Vec<ControlMessage<'_>> =
            info.iter().map(ControlMessage::Ipv4PacketInfo).collect();
        let headers = if cmsgs.is_empty() {
            &mut self.plain
        } else {
            &mut self.with_info
        };
        let mut done = 0;
        while done < msgs.len() {
            let chunk = &msgs[done..msgs.len().min(done + self.n)];
            let iovs: Vec<[IoSlice<'_>; 1]> =
                chunk.iter().map(|(b, _)| [IoSlice::new(b)]).collect();
            let addrs: Vec<Option<SockaddrIn>> = chunk
                .iter()
                .map(|(_, to)| Some(SockaddrIn::from(*to)))
                .collect();
            match socket::sendmmsg(fd, headers, &iovs, &addrs, &cmsgs, MsgFlags::empty()) {
                Ok(r) => {
                    let sent = r.count();
                    if sent == 0 {
                        return (done, Some(io::Error::other("sendmmsg sent nothing")));
                    }
                    done += sent;
                }
                Err(nix::errno::Errno::EINTR) => {}
                Err(e) => return (done, Some(e.into())),
            }
        }
        (done, None)
    }
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

    /// Batches over loopback: several datagrams in one read, each with its
    /// source and packet info, in a second read too (nix leaves the
    /// headers' lengths as the kernel shortened them); an empty queue is
    /// `WouldBlock` without waiting; sends with and without an interface.
    #[test]
    fn batches_read_and_send_with_packet_info() {
        let rx = UdpSocket::bind("127.0.0.1:0").unwrap();
        setsockopt(&rx, sockopt::Ipv4PacketInfo, &true).unwrap();
        let to = match rx.local_addr().unwrap() {
            SocketAddr::V4(a) => a,
            SocketAddr::V6(_) => unreachable!(),
        };
        let tx = UdpSocket::bind("127.0.0.1:0").unwrap();
        let lo = nix::net::if_::if_nametoindex("lo").unwrap();
        let mut batch = Batch::new(4, 16);
        let mut sender = Sender::new(2);
        for (round, via) in [(0u8, None), (1, Some(lo)), (2, None)] {
            let msgs: Vec<Vec<u8>> = (0..3u8).map(|i| vec![round, i]).collect();
            let refs: Vec<(&[u8], SocketAddrV4)> =
                msgs.iter().map(|m| (m.as_slice(), to)).collect();
            let (sent, err) = sender.send(tx.as_raw_fd(), &refs, via);
            assert_eq!((sent, err.map(|e| e.to_string())), (3, None));
            let mut got = Vec::new();
            for _ in 0..3 {
                let n = batch.read(rx.as_raw_fd(), true).unwrap();
                for i in 0..n {
                    let (data, r) = batch.get(i).unwrap();
                    assert_eq!(r.src, tx.local_addr().unwrap());
                    assert_eq!(r.ifindex, Some(lo), "round {round}");
                    assert_eq!(r.dst, Some(IpAddr::from([127, 0, 0, 1])));
                    got.push(data.to_vec());
                }
                if got.len() == 3 {
                    break;
                }
            }
            assert_eq!(got, msgs);
            assert!(batch.get(3).is_none());
        }
        // A datagram that came without packet info (the option off for a
        // while) leaves room for the next one's.
        setsockopt(&rx, sockopt::Ipv4PacketInfo, &false).unwrap();
        tx.send_to(b"a", rx.local_addr().unwrap()).unwrap();
        assert_eq!(batch.read(rx.as_raw_fd(), true).unwrap(), 1);
        assert_eq!(batch.get(0).unwrap().1.ifindex, None);
        setsockopt(&rx, sockopt::Ipv4PacketInfo, &true).unwrap();
        tx.send_to(b"b", rx.local_addr().unwrap()).unwrap();
        assert_eq!(batch.read(rx.as_raw_fd(), true).unwrap(), 1);
        assert_eq!(batch.get(0).unwrap().1.ifindex, Some(lo));
        let t = std::time::Instant::now();
        let e = batch.read(rx.as_raw_fd(), false).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::WouldBlock);
        assert!(t.elapsed() < std::time::Duration::from_secs(1));
        // A datagram longer than the buffer is cut to it.
        tx.send_to(&[7u8; 40], rx.local_addr().unwrap()).unwrap();
        assert_eq!(batch.read(rx.as_raw_fd(), true).unwrap(), 1);
        assert_eq!(batch.get(0).unwrap().0, &[7u8; 16][..]);
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
