//! The tokio shell around [`proto`](super::proto): port 69 takes requests;
//! each accepted read runs in its own task on its own ephemeral UDP socket
//! (RFC 1350's transfer ID), connected to the client, bound to the address
//! the client asked (IP_PKTINFO), so replies leave from where it expects.

use super::proto::{self, BadRequest, ErrorCode, Limits, Step};
use super::{MemHandler, Refusal, resolve};
use crate::events::{Event, Kind};
use crate::hardware::Mac;
use bytes::Bytes;
use nix::sys::socket::{self, ControlMessage, MsgFlags, sockopt};
use serde_json::json;
use std::collections::HashSet;
use std::io::{self, IoSlice};
use std::net::{IpAddr, SocketAddr};
use std::os::fd::AsRawFd;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::io::Interest;
use tokio::net::UdpSocket;
use tokio::sync::Semaphore;

/// Transfers at once; requests beyond are dropped (clients retransmit
/// their RRQ), so a storm cannot exhaust file descriptors or memory.
pub const MAX_TRANSFERS: usize = 1024;
/// No transfer lives longer than this, however it goes (32 MiB at most,
/// the slowest lockstep client still finishes well within it).
pub const MAX_TRANSFER_TIME: Duration = Duration::from_secs(600);

/// Serve on `sock` (bound to `listen`) until the task is dropped.
pub async fn serve(sock: std::net::UdpSocket, listen: SocketAddr, handler: MemHandler) {
    let mut sock = Some(sock);
    loop {
        let s = match sock.take() {
            Some(s) => Ok(s),
            None => std::net::UdpSocket::bind(listen),
        };
        match s.and_then(listener) {
            Ok(s) => {
                let e = accept_loop(s, listen, handler.clone(), Limits::default()).await;
                tracing::error!(error = %e, "tftp: listener failed; restarting");
            }
            Err(e) => tracing::error!(error = %e, %listen, "tftp: cannot bind; retrying"),
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

fn listener(s: std::net::UdpSocket) -> io::Result<UdpSocket> {
    s.set_nonblocking(true)?;
    match s.local_addr()? {
        SocketAddr::V4(_) => socket::setsockopt(&s, sockopt::Ipv4PacketInfo, &true)?,
        SocketAddr::V6(_) => socket::setsockopt(&s, sockopt::Ipv6RecvPacketInfo, &true)?,
    }
    UdpSocket::from_std(s)
}

/// Who is being served: one transfer per client address and port, so a
/// retransmitted RRQ does not start a second one.
type Active = Arc<Mutex<HashSet<SocketAddr>>>;

struct Slot {
    active: Active,
    peer: SocketAddr,
    _permit: tokio::sync::OwnedSemaphorePermit,
}

impl Drop for Slot {
    fn drop(&mut self) {
        if let Ok(mut a) = self.active.lock() {
            a.remove(&self.peer);
        }
    }
}

async fn accept_loop(
    sock: UdpSocket,
    listen: SocketAddr,
    handler: MemHandler,
    limits: Limits,
) -> io::Error {
    let permits = Arc::new(Semaphore::new(MAX_TRANSFERS));
    let active: Active = Arc::default();
    let mut buf = vec![0u8; 2048];
    let mut busy_logged = Instant::now() - Duration::from_secs(60);
    loop {
        let (len, peer, local) = match recv_with_dst(&sock, &mut buf).await {
            Ok(x) => x,
            Err(e) if transient(&e) => continue,
            Err(e) => return e,
        };
        let req = match proto::parse_request(&buf[..len]) {
            Ok(r) => Ok(r),
            Err(BadRequest::Malformed) => continue,
            Err(BadRequest::Mode(m)) => Err(m),
        };
        {
            let Ok(mut a) = active.lock() else { continue };
            if a.contains(&peer) {
                continue; // a retransmitted request: the transfer is under way
            }
            let Ok(permit) = permits.clone().try_acquire_owned() else {
                if busy_logged.elapsed() > Duration::from_secs(10) {
                    busy_logged = Instant::now();
                    tracing::warn!(
                        max = MAX_TRANSFERS,
                        "tftp: too many transfers; dropping requests"
                    );
                }
                handler.metrics.tftp("busy");
                continue;
            };
            a.insert(peer);
            let slot = Slot {
                active: active.clone(),
                peer,
                _permit: permit,
            };
            let h = handler.clone();
            let ip = local.unwrap_or(listen.ip());
            tokio::spawn(async move {
                let _slot = slot;
                handle(h, req, peer, ip, limits).await;
            });
        }
    }
}

/// Errors a UDP socket reports for earlier sends (ICMP), not fatal.
fn transient(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::ConnectionRefused
            | io::ErrorKind::ConnectionReset
            | io::ErrorKind::HostUnreachable
            | io::ErrorKind::NetworkUnreachable
            | io::ErrorKind::Interrupted
    )
}

/// A datagram, its source, and the local address it was sent to.
async fn recv_with_dst(
    sock: &UdpSocket,
    buf: &mut [u8],
) -> io::Result<(usize, SocketAddr, Option<IpAddr>)> {
    let fd = sock.as_raw_fd();
    loop {
        sock.readable().await?;
        let r = sock
            .try_io(Interest::READABLE, || {
                crate::udp::recv_pktinfo(fd, &mut *buf)
            })
            .map(|d| (d.len, d.src, d.dst));
        match r {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
            other => return other,
        }
    }
}

/// A socket for one transfer: a fresh port on `local`, connected to `peer`.
async fn transfer_socket(local: IpAddr, peer: SocketAddr) -> io::Result<UdpSocket> {
    let sock = UdpSocket::bind(SocketAddr::new(local, 0)).await?;
    sock.connect(peer).await?;
    Ok(sock)
}

/// One request, from its own port: an ERROR, or the file.
async fn handle(
    h: MemHandler,
    req: Result<proto::Request, String>,
    peer: SocketAddr,
    local: IpAddr,
    limits: Limits,
) {
    let sock = match transfer_socket(local, peer).await {
        Ok(s) => s,
        Err(e) => {
            tracing::warn!(error = %e, client = %peer, "tftp: no socket for a transfer");
            return;
        }
    };
    let req = match req {
        Ok(r) => r,
        Err(mode) => {
            h.metrics.tftp("bad_mode");
            tracing::info!(client = %peer, mode, "tftp: mode refused");
            let pkt = proto::error_packet(ErrorCode::IllegalOperation, "unsupported mode");
            let _ = sock.send(&pkt).await;
            return;
        }
    };
    if req.write {
        h.metrics.tftp("write_refused");
        tracing::info!(client = %peer, path = req.path, "tftp: write request refused");
        let pkt = proto::error_packet(ErrorCode::AccessViolation, "tinkerbox TFTP is read-only");
        let _ = sock.send(&pkt).await;
        return;
    }
    let (data, name, mac) = match resolve(&req.path, &h.files) {
        Ok((b, name, mac)) => (b.clone(), name, mac),
        Err(r) => {
            let (why, code) = match r {
                Refusal::Forbidden => ("forbidden", ErrorCode::AccessViolation),
                Refusal::NotFound => ("not_found", ErrorCode::FileNotFound),
                Refusal::NetbootNotAllowed => ("netboot_not_allowed", ErrorCode::FileNotFound),
            };
            h.metrics.tftp(why);
            tracing::info!(client = %peer, path = req.path, reason = why, "tftp: refused");
            let p = &req.path;
            let mut e =
                Event::new(Kind::TftpRefused, format!("TFTP {p:?} refused: {why}")).ip(peer.ip());
            if let Some((m, _)) = h.inventory.snapshot().by_ip(&peer.ip()) {
                e = e.machine(m.key.clone());
            }
            h.events.record(e);
            let msg = match r {
                Refusal::Forbidden => "access violation",
                Refusal::NotFound => "file not found",
                Refusal::NetbootNotAllowed => "netboot not allowed (allowPXE is false)",
            };
            let _ = sock.send(&proto::error_packet(code, msg)).await;
            return;
        }
    };
    h.metrics.tftp("started");
    let started = Instant::now();
    let neg = proto::negotiate(&req.options, data.len() as u64, &limits);
    let mut s = proto::Sender::new(data.len() as u64, neg, &limits, started);
    let hard_end = tokio::time::Instant::from_std(started + MAX_TRANSFER_TIME);
    let outcome = tokio::select! {
        o = run(&sock, &data, &mut s) => o,
        _ = tokio::time::sleep_until(hard_end) => Err(Abort::TooLong),
    };
    if let Err(why) = &outcome {
        tracing::info!(client = %peer, file = name, reason = %why, "tftp: transfer aborted");
        if !matches!(why, Abort::ClientError) {
            let pkt = proto::error_packet(ErrorCode::NotDefined, &why.to_string());
            let _ = sock.try_send(&pkt);
        }
    }
    let sent = outcome.is_ok();
    record(
        &h,
        sent,
        &name,
        mac,
        peer,
        started,
        if sent {
            data.len() as u64
        } else {
            s.bytes_acked()
        },
        data.len(),
    );
}

/// Why a transfer ended before its last block was acknowledged.
#[derive(Debug, thiserror::Error)]
enum Abort {
    #[error("took too long")]
    TooLong,
    #[error("timed out")]
    TimedOut,
    /// The client sent an ERROR: it needs none back.
    #[error("client error")]
    ClientError,
    #[error("client port closed")]
    ClientGone,
    /// This route or kernel cannot do UDP GSO: send block by block.
    #[error("gso unsupported")]
    GsoUnsupported,
    #[error("receive: {0}")]
    Receive(io::Error),
    #[error("send: {0}")]
    Send(io::Error),
}

/// Drive one transfer to its end: Ok when the last block is acknowledged.
async fn run(sock: &UdpSocket, data: &Bytes, s: &mut proto::Sender) -> Result<(), Abort> {
    let mut out = Vec::with_capacity(4 + s.blksize() as usize);
    let mut rx = [0u8; 1024];
    let mut step = s.start(Instant::now());
    let mut gso = s.windowsize() > 1;
    loop {
        match step {
            Step::SendOack => send(sock, s.oack()).await?,
            Step::SendBlocks(blocks) => {
                let (mut b, end) = blocks.into_inner();
                while b <= end {
                    if gso && end > b {
                        let n = (end - b + 1).min(gso_batch(s.blksize()));
                        match send_gso(sock, data, s, b, b + n - 1).await {
                            Ok(()) => {
                                b += n;
                                continue;
                            }
                            Err(Abort::GsoUnsupported) => gso = false,
                            Err(e) => return Err(e),
                        }
                    }
                    out.clear();
                    out.extend_from_slice(&proto::data_header(b));
                    out.extend_from_slice(&data[s.block_range(b)]);
                    send(sock, &out).await?;
                    b += 1;
                }
            }
            Step::Wait => {}
            Step::Done => return Ok(()),
            Step::Failed(proto::Failure::Timeout) => return Err(Abort::TimedOut),
            Step::Failed(proto::Failure::ClientError(..)) => return Err(Abort::ClientError),
        }
        let deadline = tokio::time::Instant::from_std(s.deadline());
        step = match tokio::time::timeout_at(deadline, sock.recv(&mut rx)).await {
            Ok(Ok(n)) => s.on_packet(&rx[..n], Instant::now()),
            // ICMP port unreachable: the client is gone.
            Ok(Err(e)) if e.kind() == io::ErrorKind::ConnectionRefused => {
                return Err(Abort::ClientGone);
            }
            Ok(Err(e)) => return Err(Abort::Receive(e)),
            Err(_) => s.on_timeout(Instant::now()),
        };
    }
}

/// Blocks sent with one `sendmsg` (UDP GSO: the kernel cuts the buffer into
/// datagrams of 4 + blksize bytes): at most 64 segments and 64 KB.
fn gso_batch(blksize: u64) -> u64 {
    (65_000 / (4 + blksize)).clamp(1, 64)
}

/// Blocks `first..=last` in one UDP GSO send: a window costs one system
/// call instead of one per block. Fails with [`Abort::GsoUnsupported`]
/// where the kernel or route cannot (datagrams larger than the MTU, old
/// kernels).
async fn send_gso(
    sock: &UdpSocket,
    data: &Bytes,
    s: &proto::Sender,
    first: u64,
    last: u64,
) -> Result<(), Abort> {
    let headers: Vec<[u8; 4]> = (first..=last).map(proto::data_header).collect();
    let mut iov = Vec::with_capacity(headers.len() * 2);
    for (h, b) in headers.iter().zip(first..=last) {
        iov.push(IoSlice::new(h));
        iov.push(IoSlice::new(&data[s.block_range(b)]));
    }
    let seg = (4 + s.blksize()) as u16;
    let cmsg = [ControlMessage::UdpGsoSegments(&seg)];
    let fd = sock.as_raw_fd();
    loop {
        let r = sock.try_io(Interest::WRITABLE, || {
            socket::sendmsg::<()>(fd, &iov, &cmsg, MsgFlags::empty(), None).map_err(io::Error::from)
        });
        match r {
            Ok(_) => return Ok(()),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                sock.writable().await.map_err(Abort::Send)?;
            }
            Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => {
                return Err(Abort::ClientGone);
            }
            Err(e)
                if matches!(
                    e.raw_os_error(),
                    Some(
                        nix::libc::EINVAL
                            | nix::libc::EMSGSIZE
                            | nix::libc::EIO
                            | nix::libc::ENOPROTOOPT
                            | nix::libc::EOPNOTSUPP
                    )
                ) =>
            {
                return Err(Abort::GsoUnsupported);
            }
            Err(e) if transient(&e) || e.raw_os_error() == Some(nix::libc::ENOBUFS) => {
                return Ok(());
            }
            Err(e) => return Err(Abort::Send(e)),
        }
    }
}

async fn send(sock: &UdpSocket, pkt: &[u8]) -> Result<(), Abort> {
    match sock.send(pkt).await {
        Ok(_) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => Err(Abort::ClientGone),
        // Dropped on the way out (buffer full, ...): retransmission covers it.
        Err(e) if transient(&e) || e.raw_os_error() == Some(nix::libc::ENOBUFS) => Ok(()),
        Err(e) => Err(Abort::Send(e)),
    }
}

/// `tftp.sent` or `tftp.aborted`, with metrics.
#[allow(clippy::too_many_arguments)]
fn record(
    h: &MemHandler,
    sent: bool,
    name: &str,
    mac: Option<Mac>,
    client: SocketAddr,
    started: Instant,
    bytes: u64,
    size: usize,
) {
    let secs = started.elapsed().as_secs_f64();
    let (kind, verb) = if sent {
        (Kind::TftpSent, "sent")
    } else {
        (Kind::TftpAborted, "aborted")
    };
    h.metrics.tftp(verb);
    if sent {
        h.metrics.tftp_bytes.inc_by(size as u64);
    }
    let snap = h.inventory.snapshot();
    let machine = mac
        .and_then(|m| snap.by_mac(&m))
        .or_else(|| snap.by_ip(&client.ip()))
        .map(|(m, _)| m.key.clone());
    let mut e = Event::new(
        kind,
        format!("TFTP {name} {verb} to {client} ({bytes} of {size} bytes, {secs:.2}s)"),
    )
    .ip(client.ip())
    .fields(json!({"file": name, "bytes": bytes, "size": size, "seconds": secs}));
    if let Some(m) = mac {
        e = e.mac(m);
    }
    if let Some(k) = machine {
        e = e.machine(k);
    }
    h.events.record(e);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::inventory::{Inventory, Snapshot};
    use crate::metrics::Metrics;
    use std::collections::HashMap;
    use tokio::sync::mpsc;

    const FILE: &[u8; 100] = &[7u8; 100];

    fn json_of(fields: Option<String>) -> serde_json::Value {
        serde_json::from_str(&fields.unwrap()).unwrap()
    }

    async fn start(limits: Limits) -> (SocketAddr, mpsc::Receiver<Event>) {
        let metrics = Arc::new(Metrics::new());
        let (events, rx) = crate::events::channel(64, metrics.clone());
        let h = MemHandler {
            files: super::super::Files::from_map(HashMap::from([(
                "f.bin".to_string(),
                Bytes::from_static(FILE),
            )])),
            inventory: Arc::new(Inventory::new(Snapshot::default())),
            events,
            metrics,
        };
        let std = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let addr = std.local_addr().unwrap();
        let sock = listener(std).unwrap();
        tokio::spawn(accept_loop(sock, addr, h, limits));
        (addr, rx)
    }

    fn rrq(path: &str, mode: &str, opts: &[&str]) -> Vec<u8> {
        let mut p = vec![0, 1];
        for f in [path, mode].iter().chain(opts) {
            p.extend_from_slice(f.as_bytes());
            p.push(0);
        }
        p
    }

    async fn recv(c: &UdpSocket) -> Option<(Vec<u8>, SocketAddr)> {
        let mut b = [0u8; 2048];
        let (n, from) = tokio::time::timeout(Duration::from_secs(2), c.recv_from(&mut b))
            .await
            .ok()?
            .ok()?;
        Some((b[..n].to_vec(), from))
    }

    async fn event(rx: &mut mpsc::Receiver<Event>) -> Event {
        tokio::time::timeout(Duration::from_secs(2), rx.recv())
            .await
            .unwrap()
            .unwrap()
    }

    #[tokio::test]
    async fn windowed_transfer_from_one_port_despite_a_repeated_request() {
        let (srv, mut rx) = start(Limits::default()).await;
        let c = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let req = rrq(
            "f.bin",
            "octet",
            &["blksize", "30", "windowsize", "4", "tsize", "0"],
        );
        c.send_to(&req, srv).await.unwrap();
        let (oack, port) = recv(&c).await.unwrap();
        assert_eq!(
            oack,
            b"\0\x06blksize\x0030\0windowsize\x004\0tsize\x00100\0"
        );
        assert_ne!(port, srv);
        // The same RRQ again (a client that thought it lost): ignored.
        c.send_to(&req, srv).await.unwrap();
        c.send_to(&[0, 4, 0, 0], port).await.unwrap();
        let mut got = Vec::new();
        for block in 1..=4u8 {
            let (d, from) = recv(&c).await.unwrap();
            assert_eq!(from, port);
            assert_eq!(&d[..4], &[0, 3, 0, block]);
            got.extend_from_slice(&d[4..]);
        }
        assert_eq!(got.as_slice(), FILE);
        c.send_to(&[0, 4, 0, 4], port).await.unwrap();
        let e = event(&mut rx).await;
        assert_eq!(e.kind, Kind::TftpSent, "{e:?}");
        assert_eq!(json_of(e.fields)["bytes"], 100);
        // Nothing else came, from either port.
        assert!(
            tokio::time::timeout(Duration::from_millis(200), c.recv_from(&mut [0u8; 64]))
                .await
                .is_err()
        );
    }

    #[tokio::test]
    async fn silent_client_is_retried_then_dropped() {
        let limits = Limits {
            timeout: Duration::from_millis(50),
            retries: 2,
            ..Limits::default()
        };
        let (srv, mut rx) = start(limits).await;
        let c = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        c.send_to(&rrq("f.bin", "octet", &[]), srv).await.unwrap();
        for _ in 0..3 {
            let (d, _) = recv(&c).await.unwrap();
            assert_eq!(&d[..4], &[0, 3, 0, 1]);
            assert_eq!(&d[4..], &FILE[..]);
        }
        let (e, _) = recv(&c).await.unwrap();
        assert_eq!(&e[..4], &[0, 5, 0, 0], "an ERROR at the end");
        let ev = event(&mut rx).await;
        assert_eq!(ev.kind, Kind::TftpAborted);
        assert_eq!(json_of(ev.fields)["bytes"], 0);
    }

    #[tokio::test]
    async fn refusals_come_as_errors() {
        let (srv, mut rx) = start(Limits::default()).await;
        let c = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        for (req, code) in [
            (rrq("f.bin", "mail", &[]), 4u8),
            (rrq("nope", "octet", &[]), 1),
            (rrq("../f.bin", "netascii", &[]), 2),
            (
                {
                    let mut w = rrq("f.bin", "octet", &[]);
                    w[1] = 2;
                    w
                },
                2,
            ),
        ] {
            c.send_to(&req, srv).await.unwrap();
            let (e, _) = recv(&c).await.unwrap();
            assert_eq!(&e[..4], &[0, 5, 0, code], "{req:?}");
        }
        assert_eq!(event(&mut rx).await.kind, Kind::TftpRefused);
        assert_eq!(event(&mut rx).await.kind, Kind::TftpRefused);
        // Garbage gets no answer.
        c.send_to(b"\0\x09hello", srv).await.unwrap();
        assert!(
            tokio::time::timeout(Duration::from_millis(200), c.recv_from(&mut [0u8; 64]))
                .await
                .is_err()
        );
    }
}
