//! A DHCP load generator for `tests/bench`: full DORA exchanges at a fixed
//! rate, each for a MAC drawn at random from a list (as `perfdhcp -M`), as a
//! relay agent (giaddr, hops 1, replies to port 67: the path perfdhcp drives)
//! or as clients on the server's own segment (broadcast, giaddr 0: the path
//! perfdhcp cannot drive).
//!
//!     dhcpgen --relay GIADDR --server IP --macs FILE --rate R --secs S [--pxe] [--wait MS]
//!     dhcpgen --iface IF --macs FILE --rate R --secs S [--pxe] [--wait MS]
//!
//! Why not perfdhcp alone: on a 2-core machine the generator and the server
//! share the cores, and perfdhcp needs 90-154 µs of CPU per DORA there,
//! more than the servers it measures (tinkerbox ~35 µs, Kea ~90), so the
//! rate it finds is mostly its own. This one sends in batches (`sendmmsg`),
//! receives in batches (`recvmmsg`) and keeps an exchange as two words in
//! a vector: 23-43 µs per DORA, kernel time included. It prints its report
//! in perfdhcp's format (the counters and the `-x t` timestamps that
//! tests/bench/dhcpload.py reads), so every server is measured the same
//! way on it.
//!
//! Several may run side by side with distinct MAC lists: each takes only the
//! replies whose transaction ids are in its own range (on the direct path
//! every generator receives every broadcast reply).
#![deny(unsafe_code)]

mod wire;

use clap::Parser;
use nix::sys::socket::{self as nixsock, MsgFlags, MultiHeaders, SockaddrIn};
use rustix::event::{PollFd, PollFlags, Timespec};
use rustix::net::addr::SocketAddrArg;
use rustix::net::{MMsgHdr, SendAncillaryBuffer, SendFlags, SocketAddrAny};
use socket2::{Domain, Protocol, Socket, Type};
use std::io::{self, BufWriter, IoSlice, IoSliceMut, Write};
use std::net::{Ipv4Addr, SocketAddrV4, UdpSocket};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::time::Instant;
use wire::{Kind, Packet};

#[derive(Parser)]
#[command(about = "DHCP DORA load at a fixed rate; prints perfdhcp's report format")]
struct Args {
    /// Act as clients on this interface: DISCOVER/REQUEST broadcast from
    /// port 68 with the broadcast flag, replies taken as broadcasts on 68.
    #[arg(long, conflicts_with = "relay", required_unless_present = "relay")]
    iface: Option<String>,
    /// Act as a relay agent at this address: giaddr set, hops 1, unicast to
    /// --server port 67, replies taken on GIADDR:67.
    #[arg(long, requires = "server")]
    relay: Option<Ipv4Addr>,
    #[arg(long)]
    server: Option<Ipv4Addr>,
    /// Files of MACs, one a line (aa:bb:cc:dd:ee:ff); several comma-separated.
    #[arg(long, value_delimiter = ',', required = true)]
    macs: Vec<PathBuf>,
    /// DORA exchanges started per second.
    #[arg(long)]
    rate: f64,
    #[arg(long)]
    secs: f64,
    /// Options 93 and 60 of an x86-64 UEFI PXE client in every packet.
    #[arg(long)]
    pxe: bool,
    /// An exchange not finished this long (ms) after its last packet is lost.
    #[arg(long, default_value_t = 2000.0)]
    wait: f64,
    /// DISCOVERs due within this many µs leave together in one batch: a
    /// timer per DISCOVER costs a wake-up each (in a VM, timer exits too),
    /// which at 2000/s was most of this generator's CPU. Each packet's
    /// delay is timed from when it really left, but a burst queues at the
    /// server, so the tick is short: the delays should be the server's,
    /// not the burst's (at 1000 µs and 20000/s a burst was 10 DISCOVERs a
    /// generator; at 200 µs it is 2).
    #[arg(long, default_value_t = 200)]
    tick: u64,
    /// This generator's number among those running side by side (0-255):
    /// its transaction ids are INDEX * 2^24 and up.
    #[arg(long, default_value_t = 0)]
    index: u8,
}

/// Packets per `sendmmsg`/`recvmmsg`.
const BATCH: usize = 64;

#[derive(Clone, Copy, PartialEq, Eq)]
enum Stage {
    /// Not started, or its DISCOVER could not be sent.
    Idle,
    Discovered,
    Requested,
    /// Acknowledged, refused, or given up.
    Over,
}

#[derive(Clone, Copy)]
struct Exchange {
    stage: Stage,
    /// Seconds since the start when its last packet left.
    sent: f64,
}

struct Gen {
    sock: UdpSocket,
    dest: SocketAddrAny,
    giaddr: Option<Ipv4Addr>,
    pxe: bool,
    xid_base: u32,
    start: Instant,
    ex: Vec<Exchange>,
    /// Exchanges with a packet out and no answer yet.
    outstanding: usize,
    /// Every exchange before this one is over.
    oldest: usize,
    /// Packets waiting for the next `sendmmsg`, with their exchange.
    queue: Vec<(usize, Packet)>,
    sent_d: u64,
    sent_r: u64,
    got_o: u64,
    got_a: u64,
    /// (sent, received) of every OFFER and ACK, as perfdhcp -x t.
    stamps: Vec<(f64, f64)>,
}

impl Gen {
    fn now(&self) -> f64 {
        self.start.elapsed().as_secs_f64()
    }

    /// Sends the queued packets in batches; a packet the kernel refuses
    /// (full buffer) ends its exchange, as a lost packet would.
    fn flush(&mut self) {
        let mut at = 0;
        while at < self.queue.len() {
            let end = (at + BATCH).min(self.queue.len());
            let iovs: Vec<[IoSlice; 1]> = self.queue[at..end]
                .iter()
                .map(|(_, p)| [IoSlice::new(p.bytes())])
                .collect();
            let mut controls: Vec<SendAncillaryBuffer> = iovs
                .iter()
                .map(|_| SendAncillaryBuffer::default())
                .collect();
            let mut hdrs: Vec<MMsgHdr> = iovs
                .iter()
                .zip(controls.iter_mut())
                .map(|(iov, control)| MMsgHdr::new_with_addr(&self.dest, iov, control))
                .collect();
            let n = loop {
                match rustix::net::sendmmsg(&self.sock, &mut hdrs, SendFlags::DONTWAIT) {
                    Err(rustix::io::Errno::INTR) => continue,
                    Ok(n) => break n,
                    Err(_) => break 0,
                }
            };
            let now = self.now();
            for (k, (i, p)) in self.queue[at..end].iter().enumerate() {
                let Some(e) = self.ex.get_mut(*i) else {
                    continue;
                };
                match (k < n, p.kind()) {
                    (true, Kind::Discover) => {
                        *e = Exchange {
                            stage: Stage::Discovered,
                            sent: now,
                        };
                        self.sent_d += 1;
                        self.outstanding += 1;
                    }
                    (true, Kind::Request) => {
                        *e = Exchange {
                            stage: Stage::Requested,
                            sent: now,
                        };
                        self.sent_r += 1;
                    }
                    (false, Kind::Discover) => {}
                    (false, Kind::Request) => {
                        e.stage = Stage::Over;
                        self.outstanding -= 1;
                    }
                }
            }
            // A short count means the buffer is full: the rest would fail too.
            if n < end - at {
                self.queue.clear();
                return;
            }
            at = end;
        }
        self.queue.clear();
    }

    /// Gives up on exchanges whose last packet is older than `wait`. They
    /// were started in index order, so only the oldest need looking at.
    fn expire(&mut self, now: f64, wait: f64, started: usize) {
        while self.oldest < started {
            let e = &mut self.ex[self.oldest];
            match e.stage {
                Stage::Discovered | Stage::Requested if e.sent < now - wait => {
                    e.stage = Stage::Over;
                    self.outstanding -= 1;
                }
                Stage::Discovered | Stage::Requested => return,
                Stage::Idle | Stage::Over => {}
            }
            self.oldest += 1;
        }
    }

    /// One reply: an OFFER gets its REQUEST queued, an ACK or NAK ends it.
    fn reply(&mut self, data: &[u8], at: f64) {
        let Some(r) = wire::parse_reply(data) else {
            return;
        };
        let i = r.xid.wrapping_sub(self.xid_base) as usize;
        let Some(e) = self.ex.get_mut(i) else { return };
        match (r.kind, e.stage) {
            (wire::OFFER, Stage::Discovered) => {
                self.stamps.push((e.sent, at));
                self.got_o += 1;
                let req = Packet::request(
                    r.xid,
                    r.chaddr,
                    self.giaddr,
                    self.pxe,
                    r.yiaddr,
                    r.server_id,
                );
                self.queue.push((i, req));
            }
            (wire::ACK, Stage::Requested) => {
                self.stamps.push((e.sent, at));
                self.got_a += 1;
                e.stage = Stage::Over;
                self.outstanding -= 1;
            }
            (wire::NAK, Stage::Discovered | Stage::Requested) => {
                e.stage = Stage::Over;
                self.outstanding -= 1;
            }
            _ => {}
        }
    }
}

fn socket(a: &Args) -> io::Result<UdpSocket> {
    let s = Socket::new(Domain::IPV4, Type::DGRAM, Some(Protocol::UDP))?;
    s.set_reuse_address(true)?;
    // A second's worth of replies at the highest rates, while this process
    // is off the CPU.
    s.set_recv_buffer_size(8 << 20)?;
    s.set_send_buffer_size(4 << 20)?;
    s.set_nonblocking(true)?;
    let local = match (&a.iface, a.relay) {
        (_, Some(g)) => SocketAddrV4::new(g, 67),
        (Some(ifname), None) => {
            s.set_broadcast(true)?;
            s.bind_device(Some(ifname.as_bytes()))?;
            SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, 68)
        }
        (None, None) => return Err(io::Error::other("--iface or --relay")),
    };
    s.bind(&local.into())?;
    Ok(s.into())
}

fn read_macs(path: &Path) -> io::Result<Vec<[u8; 6]>> {
    let text = std::fs::read_to_string(path)?;
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(|l| {
            wire::parse_mac(l)
                .ok_or_else(|| io::Error::other(format!("{}: not a MAC: {l:?}", path.display())))
        })
        .collect()
}

fn main() -> std::process::ExitCode {
    let a = Args::parse();
    match run(&a) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("dhcpgen: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn run(a: &Args) -> io::Result<()> {
    let mut macs = Vec::new();
    for f in &a.macs {
        macs.extend(read_macs(f)?);
    }
    if macs.is_empty() {
        return Err(io::Error::other("no MACs"));
    }
    if !(a.rate > 0.0 && a.secs > 0.0 && a.wait >= 0.0) {
        return Err(io::Error::other("--rate and --secs must be positive"));
    }
    let dest = match a.relay {
        Some(_) => SocketAddrV4::new(a.server.unwrap_or(Ipv4Addr::BROADCAST), 67),
        None => SocketAddrV4::new(Ipv4Addr::BROADCAST, 67),
    };
    // Transaction ids: this generator's own range of 2^24, so that
    // generators side by side tell their replies apart.
    let total = ((a.rate * a.secs) as usize).min(1 << 24);
    let mut rng = wire::Rng::new(u64::from(std::process::id()) << 8 | u64::from(a.index));
    let mut g = Gen {
        sock: socket(a)?,
        dest: dest.as_any(),
        giaddr: a.relay,
        pxe: a.pxe,
        xid_base: u32::from(a.index) << 24,
        start: Instant::now(),
        ex: vec![
            Exchange {
                stage: Stage::Idle,
                sent: 0.0
            };
            total
        ],
        outstanding: 0,
        oldest: 0,
        queue: Vec::with_capacity(BATCH),
        sent_d: 0,
        sent_r: 0,
        got_o: 0,
        got_a: 0,
        stamps: Vec::with_capacity(2 * total),
    };
    let wait = a.wait / 1000.0;
    let tick = (a.tick.max(1) as f64) / 1e6;
    let end = a.secs + wait;
    let mut headers = MultiHeaders::<SockaddrIn>::preallocate(BATCH, None);
    let mut bufs = vec![[0u8; 1500]; BATCH];
    let mut started = 0usize;
    loop {
        let now = g.now();
        // What is due (bounded by `total`).
        while started < total && started as f64 / a.rate <= now {
            let xid = g.xid_base.wrapping_add(started as u32);
            let mac = macs[rng.below(macs.len())];
            g.queue
                .push((started, Packet::discover(xid, mac, a.relay, a.pxe)));
            started += 1;
        }
        g.flush();
        g.expire(now, wait, started);
        if now >= end || (started >= total && g.outstanding == 0) {
            break;
        }
        let next = if started < total {
            // The next DISCOVER's due time, rounded up to the tick.
            (started as f64 / a.rate / tick).ceil() * tick
        } else {
            end
        };
        let timeout = Timespec::try_from(std::time::Duration::from_secs_f64(
            (next - now).clamp(0.0, 1.0),
        ))
        .unwrap_or(Timespec {
            tv_sec: 0,
            tv_nsec: 1_000_000,
        });
        let mut fds = [PollFd::new(&g.sock, PollFlags::IN)];
        match rustix::event::poll(&mut fds, Some(&timeout)) {
            Ok(0) | Err(rustix::io::Errno::INTR) => continue,
            Ok(_) => {}
            Err(e) => return Err(e.into()),
        }
        // Everything queued, a batch at a time (bounded: 64 batches).
        for _ in 0..64 {
            let lens: Vec<usize> = {
                let mut iovs: Vec<[IoSliceMut; 1]> = bufs
                    .iter_mut()
                    .map(|b| [IoSliceMut::new(&mut b[..])])
                    .collect();
                match nixsock::recvmmsg(
                    g.sock.as_raw_fd(),
                    &mut headers,
                    iovs.iter_mut(),
                    MsgFlags::MSG_DONTWAIT,
                    None,
                ) {
                    Ok(msgs) => msgs.map(|m| m.bytes).collect(),
                    Err(nix::errno::Errno::EINTR) => continue,
                    Err(_) => break,
                }
            };
            let at = g.now();
            for (buf, len) in bufs.iter().zip(&lens) {
                g.reply(&buf[..(*len).min(buf.len())], at);
            }
            g.flush();
            if lens.len() < BATCH {
                break;
            }
        }
    }
    report(&g, a)
}

/// perfdhcp's report, the parts dhcpload.py reads.
fn report(g: &Gen, a: &Args) -> io::Result<()> {
    let elapsed = g.now().min(a.secs).max(1e-9);
    let mut out = BufWriter::new(io::stdout().lock());
    writeln!(
        out,
        "Rate: {:.3} 4-way exchanges/second, expected rate: {}",
        g.got_a as f64 / elapsed,
        a.rate
    )?;
    writeln!(out, "***Statistics for: DISCOVER-OFFER***")?;
    writeln!(
        out,
        "sent packets: {}\nreceived packets: {}\ndrops: {}",
        g.sent_d,
        g.got_o,
        g.sent_d - g.got_o
    )?;
    writeln!(out, "***Statistics for: REQUEST-ACK***")?;
    writeln!(
        out,
        "sent packets: {}\nreceived packets: {}\ndrops: {}",
        g.sent_r,
        g.got_a,
        g.sent_r - g.got_a
    )?;
    writeln!(out, "***Timestamps for packets:")?;
    for (sent, got) in &g.stamps {
        writeln!(out, "sent / received: {sent:.6} / {got:.6}")?;
    }
    out.flush()
}
