//! The DHCP socket loops: UDP 67, and 4011 in the proxy modes. Each packet
//! is decoded, answered by [`super::respond`] from the current inventory
//! snapshot, encoded and sent; events and metrics are recorded on the way.
//!
//! Each socket is read by an OS thread of its own rather than by tasks on
//! the tokio runtime: on tokio every packet also went through epoll and
//! woke a second worker to look for work, about a third of the server's
//! CPU per DORA under load, and the answer could wait behind whatever task
//! shared its worker (measured: BENCHMARKS.md). The thread reads and sends
//! in batches (`recvmmsg`/`sendmmsg`), blocks for each request while they
//! are few and lets them gather under load ([`Pace`]); port 67's other
//! `dhcp.threads` help only with a backlog ([`Crew`]).

use super::{Dest, Ignore, Outcome, Port, Reply, Settings, respond};
use crate::events::{Event, EventSink};
use crate::inventory::Inventory;
use crate::metrics::{DhcpLabels, Metrics, Resolved};
use crate::udp::{Batch, Sender};
use dhcproto::v4::{DhcpOption, MessageType, OptionCode};
use nix::sys::socket::{self, sockopt};
use socket2::{Domain, Protocol, Socket, Type};
use std::io;
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
    /// The longest a gather lasts under load ([`Pace`]).
    pub gather: Duration,
}

/// Requests read, and replies sent, per system call at most.
const BATCH: usize = 32;

/// Under load, the longest the reader lets requests gather before it reads
/// them all in one call ([`Pace`]; `[dhcp] gather`). It bounds the gather
/// only below ~8,000 DORA/s (16,000 requests a second), where 8 requests
/// take longer. On the 2-vCPU VM of BENCHMARKS.md a thread's sleep and
/// wake-up cost 14-20 us of CPU, so at 6,000 DORA/s (perfdhcp) a 250 us
/// gather cost 37 us of CPU per DORA, 500 us ~22 and this one (667 us
/// there) 19-21, for a reply p99 of 0.40, 0.7 and 0.86-0.93 ms: at most
/// 0.75 ms more latency, at rates where a DHCP client waits seconds
/// between retries anyway.
pub const GATHER: Duration = Duration::from_micros(750);

/// Requests a gather waits for at the measured rate (when that takes less
/// than [`GATHER`]): at high rates the wait shrinks and the batch does
/// not, so latency stays low where the rate is bounded by it. With 12
/// (375 us at 16,000 DORA/s) or 9 (281 us) perfdhcp's PXE path missed
/// p99 < 1 ms at 16,000 DORA/s, and its best rate with p99 < 1 ms fell
/// from ~14,000-16,000 to 2,500-2,750; with 8 (250 us) it did not.
const GATHER_BATCH: u64 = 8;

/// The shortest gather: below this a sleep costs as much as it saves.
const GATHER_MIN: Duration = Duration::from_micros(40);

/// The reader's timer slack: how late the kernel may end a gather's
/// sleep to batch its timers (50 us by default, as long as a short gather).
const TIMER_SLACK_NS: u64 = 5_000;

/// Over how long [`Pace`] measures the request rate.
const PACE_WINDOW: Duration = Duration::from_millis(10);

/// Requests a second from which the reader gathers (6,000: three DORAs a
/// millisecond), and below which it blocks for each again. Below 6,000 a
/// [`GATHER`] holds one or two requests, too few to be worth the delay:
/// the reply latency at 2,000 DORA/s (BENCHMARKS.md) stays as it was.
const GATHER_FROM: u64 = 6000;
const GATHER_UNTIL: u64 = 4000;

/// When the socket's reader blocks for each request and when it sleeps
/// a little and then takes everything queued. Blocking answers at once
/// but costs a wake-up a request, and on this path a wake-up costs more
/// than the answer (a sleeping thread woken per packet was over half the
/// server's CPU at 6,000 DORA/s: `tests/bench/profile perf:6000`).
/// Sleeping costs one wake-up for all that gathered, and some latency:
/// long enough for [`GATHER_BATCH`] requests, at most [`GATHER`]. NAPI
/// makes the same choice between interrupts and polling; here it is made
/// on the request rate over the last [`PACE_WINDOW`], with hysteresis, and
/// an empty read ends gathering at once.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Pace {
    gathering: bool,
    since: Instant,
    count: u64,
    /// Requests a second over the last whole window.
    per_s: u64,
    /// The longest gather (`[dhcp] gather`); zero: never gather.
    max: Duration,
}

impl Pace {
    pub(crate) fn new(now: Instant, max: Duration) -> Pace {
        Pace {
            gathering: false,
            since: now,
            count: 0,
            per_s: 0,
            max,
        }
    }

    /// How long the next read should let requests gather first; None:
    /// block for the next one instead.
    pub(crate) fn gather(&self) -> Option<Duration> {
        if !self.gathering {
            return None;
        }
        let us = GATHER_BATCH.saturating_mul(1_000_000) / self.per_s.max(1);
        Some(Duration::from_micros(us).clamp(GATHER_MIN.min(self.max), self.max))
    }

    /// A read returned `n` requests at `now`.
    pub(crate) fn saw(&mut self, n: usize, now: Instant) {
        if n == 0 && self.gathering {
            // Nothing came in a whole gather: the load is over.
            *self = Pace::new(now, self.max);
            return;
        }
        self.count += n as u64;
        let took = now.saturating_duration_since(self.since);
        if took < PACE_WINDOW {
            return;
        }
        self.per_s = self.count.saturating_mul(1_000_000) / (took.as_micros().max(1) as u64);
        if self.per_s >= GATHER_FROM && !self.max.is_zero() {
            self.gathering = true;
        } else if self.per_s < GATHER_UNTIL {
            self.gathering = false;
        }
        self.since = now;
        self.count = 0;
    }
}

/// The threads of one socket. One reads it ([`Shell::spawn`]); the others
/// wait here, off the socket, until the reader finds a backlog (a full
/// batch) and calls one in to read beside it until the queue is empty. If
/// they all waited on the socket, the kernel would wake one of them for
/// each request while the reader gathers.
#[derive(Default)]
pub struct Crew {
    calls: std::sync::Mutex<u64>,
    bell: std::sync::Condvar,
}

impl Crew {
    fn call(&self) {
        let mut n = self.calls.lock().unwrap_or_else(|p| p.into_inner());
        *n = n.wrapping_add(1);
        self.bell.notify_one();
    }

    /// Until a call newer than `seen` (true) or `timeout` (false).
    fn wait(&self, seen: &mut u64, timeout: Duration) -> bool {
        let n = self.calls.lock().unwrap_or_else(|p| p.into_inner());
        let (n, _) = self
            .bell
            .wait_timeout_while(n, timeout, |n| *n == *seen)
            .unwrap_or_else(|p| p.into_inner());
        let called = *n != *seen;
        *seen = *n;
        called
    }
}

/// Which of a socket's threads this is.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Role {
    Reader,
    Helper,
}

/// A reply ready to go, and what is recorded once it went.
pub(super) struct Outgoing {
    bytes: Vec<u8>,
    to: SocketAddrV4,
    /// The interface a broadcast leaves by.
    via: Option<u32>,
    reply: Box<Reply>,
}

/// A DHCP thread's counts of requests and replies by kind, in its mode,
/// through handles on the series found once ([`Resolved`]).
pub(super) struct Tally {
    mode: super::Mode,
    requests: Resolved<DhcpLabels>,
    replies: Resolved<DhcpLabels>,
}

impl Tally {
    pub(super) fn new(mode: super::Mode) -> Tally {
        Tally {
            mode,
            requests: Resolved::default(),
            replies: Resolved::default(),
        }
    }

    fn request(&mut self, metrics: &Metrics, kind: &'static str) {
        let mode = self.mode.as_str();
        self.requests
            .inc(&metrics.dhcp_requests, DhcpLabels { kind, mode });
    }

    fn reply(&mut self, metrics: &Metrics, kind: &'static str) {
        let mode = self.mode.as_str();
        self.replies
            .inc(&metrics.dhcp_replies, DhcpLabels { kind, mode });
    }
}

/// A socket thread's buffers: the batch read, the replies, their headers;
/// and its counts.
struct Worker {
    batch: Batch,
    sender: Sender,
    out: Vec<Outgoing>,
    tally: Tally,
}

impl Worker {
    fn new(mode: super::Mode) -> Worker {
        Worker {
            batch: Batch::new(BATCH, 4096),
            sender: Sender::new(BATCH),
            out: Vec::with_capacity(BATCH),
            tally: Tally::new(mode),
        }
    }

    /// One read (`wait`: blocking for the first request), its answers
    /// sent; a full read calls a helper in. Returns how many were read.
    fn serve(
        &mut self,
        shell: &Shell,
        sock: &UdpSocket,
        port: Port,
        crew: &Crew,
        wait: bool,
    ) -> usize {
        let n = read(&mut self.batch, sock, wait);
        if n == 0 {
            return 0;
        }
        if n == BATCH {
            // A backlog: a helper reads beside this thread.
            crew.call();
        }
        let t0 = Instant::now();
        let snap = shell.inventory.snapshot();
        for i in 0..n {
            let Some((data, d)) = self.batch.get(i) else {
                continue;
            };
            if let Some(o) = shell.handle(&snap, data, d.src, d.ifindex, port, &mut self.tally) {
                self.out.push(o);
            }
        }
        flush(
            sock,
            &mut self.sender,
            &mut self.out,
            &mut self.tally,
            shell,
            t0,
        );
        n
    }
}

impl Shell {
    /// Serve `sock` on a thread of its own until `stop` is set (seen within
    /// [`STOP_POLL`]). Errors on a packet are logged and counted; the loop
    /// never stops for bad input.
    pub fn spawn(
        self: Arc<Self>,
        sock: UdpSocket,
        port: Port,
        role: Role,
        crew: Arc<Crew>,
        stop: Arc<AtomicBool>,
    ) -> io::Result<JoinHandle<()>> {
        let name = match (port, role) {
            (Port::Dhcp, Role::Reader) => "dhcp",
            (Port::Dhcp, Role::Helper) => "dhcp-helper",
            (Port::Proxy, _) => "dhcp-proxy",
        };
        std::thread::Builder::new()
            .name(name.into())
            .spawn(move || match role {
                Role::Reader => self.read(&sock, port, &crew, &stop),
                Role::Helper => self.help(&sock, port, &crew, &stop),
            })
    }

    fn read(&self, sock: &UdpSocket, port: Port, crew: &Crew, stop: &AtomicBool) {
        let mut w = Worker::new(self.settings.mode);
        let mut pace = Pace::new(Instant::now(), self.gather);
        // Best effort: without it a gather only ends a little later.
        let _ = nix::sys::prctl::set_timerslack(TIMER_SLACK_NS as _);
        let mut backlog = false;
        while !stop.load(Ordering::Relaxed) {
            let gather = pace.gather();
            // With a backlog there is no need to wait for more.
            if let Some(d) = gather
                && !backlog
            {
                std::thread::sleep(d);
            }
            let n = w.serve(self, sock, port, crew, gather.is_none());
            pace.saw(n, Instant::now());
            backlog = n == BATCH;
        }
    }

    fn help(&self, sock: &UdpSocket, port: Port, crew: &Crew, stop: &AtomicBool) {
        let mut w = Worker::new(self.settings.mode);
        let mut seen = 0;
        while !stop.load(Ordering::Relaxed) {
            if !crew.wait(&mut seen, STOP_POLL) {
                continue;
            }
            // Until the queue is empty (bounded: one read a batch).
            while !stop.load(Ordering::Relaxed) && w.serve(self, sock, port, crew, false) > 0 {}
        }
    }

    /// The reply to one request, ready to send, if it gets one.
    fn handle(
        &self,
        snap: &crate::inventory::Snapshot,
        data: &[u8],
        src: SocketAddr,
        ifindex: Option<u32>,
        port: Port,
        tally: &mut Tally,
    ) -> Option<Outgoing> {
        let Some(req) = super::decode(data) else {
            self.metrics.dhcp_ignored(Ignore::Malformed.as_str());
            tracing::debug!(%src, len = data.len(), "dhcp: malformed packet");
            return None;
        };
        let req_type = match req.opts().get(OptionCode::MessageType) {
            Some(DhcpOption::MessageType(t)) => type_name(*t),
            _ => "none",
        };
        tally.request(&self.metrics, req_type);
        match respond(&req, port, snap, &self.settings) {
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
                None
            }
            Outcome::Ignore(why) => {
                self.metrics.dhcp_ignored(why.as_str());
                tracing::debug!(%src, reason = why.as_str(), "dhcp: not answered");
                None
            }
            Outcome::Note {
                kind,
                machine,
                mac,
                message,
            } => {
                self.events
                    .record(Event::new(kind, message).machine(machine).mac(mac));
                None
            }
            Outcome::Reply(r) => prepare(r, src, ifindex, &self.metrics),
        }
    }
}

/// One batch read; 0 when nothing came (a receive timeout, an empty queue)
/// or the read failed (logged: the loop goes on).
fn read(batch: &mut Batch, sock: &UdpSocket, wait: bool) -> usize {
    match batch.read(sock.as_raw_fd(), wait) {
        Ok(n) => n,
        Err(e)
            if matches!(
                e.kind(),
                io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut | io::ErrorKind::Interrupted
            ) =>
        {
            0
        }
        Err(e) => {
            tracing::warn!(error = %e, "dhcp: receive failed");
            0
        }
    }
}

/// Where `r` goes (a broadcast through the interface the request came in
/// on, `ifindex`), encoded; None (counted) when it cannot be.
pub(super) fn prepare(
    mut r: Box<Reply>,
    src: SocketAddr,
    ifindex: Option<u32>,
    metrics: &Metrics,
) -> Option<Outgoing> {
    let to = match r.dest {
        Dest::Broadcast => SocketAddrV4::new(Ipv4Addr::BROADCAST, super::CLIENT_PORT),
        Dest::Relay(g) => SocketAddrV4::new(g, super::SERVER_PORT),
        Dest::Client(c) => SocketAddrV4::new(c, super::CLIENT_PORT),
        Dest::Source => match src {
            SocketAddr::V4(a) => a,
            SocketAddr::V6(_) => return None,
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
    match encoded {
        Ok(bytes) => Some(Outgoing {
            bytes,
            to,
            via,
            reply: r,
        }),
        Err(e) => {
            metrics.dhcp_ignored(Ignore::EncodeFailed.as_str());
            tracing::error!(error = %e, mac = %r.mac, "dhcp: cannot encode reply");
            None
        }
    }
}

/// Send `out` (emptied), in as few system calls as there are runs of
/// replies leaving by the same interface, then count each reply and record
/// its event; `t0`: when the batch was read.
fn flush(
    sock: &UdpSocket,
    sender: &mut Sender,
    out: &mut Vec<Outgoing>,
    tally: &mut Tally,
    shell: &Shell,
    t0: Instant,
) {
    let (metrics, events) = (&*shell.metrics, &shell.events);
    let mut sent = vec![false; out.len()];
    let mut start = 0;
    while start < out.len() {
        let via = out[start].via;
        let end = out[start..]
            .iter()
            .position(|o| o.via != via)
            .map_or(out.len(), |k| start + k);
        let msgs: Vec<(&[u8], SocketAddrV4)> = out[start..end]
            .iter()
            .map(|o| (o.bytes.as_slice(), o.to))
            .collect();
        let mut at = 0;
        while at < msgs.len() {
            let (n, err) = sender.send(sock.as_raw_fd(), &msgs[at..], via);
            sent[start + at..start + at + n].fill(true);
            at += n;
            if let Some(e) = err {
                // This one failed: count it and go on after it.
                metrics.dhcp_ignored(Ignore::SendFailed.as_str());
                tracing::warn!(error = %e, to = %msgs[at].1, "dhcp: send failed");
                at += 1;
            }
        }
        start = end;
    }
    for (o, sent) in out.drain(..).zip(sent) {
        if sent {
            metrics.dhcp_seconds.observe(t0.elapsed().as_secs_f64());
            record(o, tally, metrics, events);
        }
    }
}

/// A reply's event text, made by the event writer ([`crate::events::Text`]).
#[derive(Debug)]
struct ReplyText {
    kind: crate::events::Kind,
    to: SocketAddrV4,
    fields: super::Fields,
}

impl crate::events::Text for ReplyText {
    fn render(&self) -> (String, Option<String>) {
        (
            reply_message(self.kind.as_str(), self.to, self.fields.boot_file()),
            Some(crate::events::fields_json(self.kind, &self.fields)),
        )
    }
}

/// A reply went: its counter and its event.
fn record(o: Outgoing, tally: &mut Tally, metrics: &Metrics, events: &EventSink) {
    let Reply {
        msg,
        kind,
        machine,
        mac,
        fields,
        ..
    } = *o.reply;
    tally.reply(metrics, kind.as_str());
    let text = ReplyText {
        kind,
        to: o.to,
        fields,
    };
    let mut e = Event::later(kind, Arc::new(text)).mac(mac).xid(msg.xid());
    if !msg.yiaddr().is_unspecified() {
        e = e.ip(std::net::IpAddr::V4(msg.yiaddr()));
    }
    if let Some(k) = machine {
        e = e.machine(k);
    }
    events.record(e);
}

/// Send one reply where `r.dest` says, then count it and record its event.
/// True when it was sent. For the discovery pool's thread, which answers
/// one request at a time.
pub(super) fn deliver(
    sock: &UdpSocket,
    r: Box<Reply>,
    src: SocketAddr,
    ifindex: Option<u32>,
    metrics: &Metrics,
    events: &EventSink,
    tally: &mut Tally,
) -> bool {
    let Some(o) = prepare(r, src, ifindex, metrics) else {
        return false;
    };
    let (_, err) = Sender::new(1).send(sock.as_raw_fd(), &[(&o.bytes, o.to)], o.via);
    if let Some(e) = err {
        metrics.dhcp_ignored(Ignore::SendFailed.as_str());
        tracing::warn!(error = %e, to = %o.to, "dhcp: send failed");
        return false;
    }
    record(o, tally, metrics, events);
    true
}

/// `DHCP OFFER to 10.0.0.5:68, boot file ipxe.efi`, in one allocation.
fn reply_message(kind: &str, to: SocketAddrV4, boot_file: Option<&str>) -> String {
    let what = kind.strip_prefix("dhcp.").unwrap_or(kind);
    let mut m = String::with_capacity(48 + boot_file.map_or(0, str::len));
    m.push_str("DHCP ");
    m.extend(what.chars().map(|c| c.to_ascii_uppercase()));
    m.push_str(" to ");
    crate::text::push_ipv4(&mut m, *to.ip());
    m.push(':');
    crate::text::push_dec(&mut m, to.port().into());
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

    /// Blocking while quiet and at 2,000 DORA/s (4,000 requests a second),
    /// gathering from 6,000 requests a second, back only below 4,000 or at
    /// an empty read.
    #[test]
    fn pace_gathers_under_load_only() {
        let t0 = Instant::now();
        let ms = |n: u64| t0 + Duration::from_millis(n);
        let mut p = Pace::new(t0, GATHER);
        // 4,000/s: a request every 250 us, read one by one.
        for i in 1..=400u64 {
            p.saw(1, t0 + Duration::from_micros(250 * i));
        }
        assert!(p.gather().is_none(), "{p:?}");
        // 10,000/s: 60 requests in the first 6 ms of a window decide
        // nothing yet; 100 in 10 ms do.
        p.saw(60, ms(106));
        assert!(p.gather().is_none(), "a window has not passed: {p:?}");
        p.saw(40, ms(110));
        // 8 requests at 10,000/s take 800 us: the gather is the longest.
        assert_eq!(p.gather(), Some(GATHER), "{p:?}");
        // 5,000/s: between the thresholds, it keeps gathering.
        p.saw(25, ms(115));
        p.saw(30, ms(121));
        assert!(p.gather().is_some(), "{p:?}");
        // 2,000/s: back to blocking.
        p.saw(20, ms(131));
        assert!(p.gather().is_none(), "{p:?}");
        // Up again, then a gather that finds nothing ends it at once.
        p.saw(200, ms(142));
        // 200 in 11 ms: 8 of them in 440 us.
        assert_eq!(p.gather(), Some(Duration::from_micros(440)));
        // 80,000/s: 8 in 100 us; 400,000/s: the shortest.
        p.saw(800, ms(152));
        assert_eq!(p.gather(), Some(Duration::from_micros(100)));
        p.saw(4000, ms(162));
        assert_eq!(p.gather(), Some(GATHER_MIN));
        p.saw(0, ms(163));
        assert!(p.gather().is_none(), "{p:?}");
        // Idle for a long time, then one request: still blocking.
        p.saw(1, ms(60_000));
        assert!(p.gather().is_none());
    }

    /// `[dhcp] gather` bounds every gather; "0s" never gathers.
    #[test]
    fn pace_gathers_at_most_as_configured() {
        let t0 = Instant::now();
        let ms = |n: u64| t0 + Duration::from_millis(n);
        let short = Duration::from_micros(300);
        let mut p = Pace::new(t0, short);
        p.saw(100, ms(10));
        assert_eq!(p.gather(), Some(short), "{p:?}");
        p.saw(0, ms(11));
        // The reset keeps the bound.
        p.saw(100, ms(21));
        assert_eq!(p.gather(), Some(short), "{p:?}");
        let mut off = Pace::new(t0, Duration::ZERO);
        for i in 1..=10 {
            off.saw(4000, ms(10 * i));
            assert!(off.gather().is_none(), "{off:?}");
        }
    }

    /// The crew's bell: a call wakes a waiting helper once; no call times out.
    #[test]
    fn crew_calls_wake_a_helper() {
        let crew = Arc::new(Crew::default());
        let mut seen = 0;
        assert!(!crew.wait(&mut seen, Duration::from_millis(10)));
        let c = crew.clone();
        let t = std::thread::spawn(move || {
            let mut seen = 0;
            c.wait(&mut seen, Duration::from_secs(10))
        });
        std::thread::sleep(Duration::from_millis(20));
        crew.call();
        assert!(t.join().unwrap());
        assert!(
            crew.wait(&mut seen, Duration::from_millis(1)),
            "a call before the wait counts"
        );
        assert!(!crew.wait(&mut seen, Duration::from_millis(1)));
    }

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
