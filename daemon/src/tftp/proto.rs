//! The TFTP protocol for a read-only server, without sockets or clocks of
//! its own: request parsing (RFC 1350) with the blksize, timeout, tsize and
//! windowsize options (RFC 2347, 2348, 2349, 7440), and [`Sender`], the state
//! of one read transfer (window, ACKs, retransmission, bounded retries).
//! Time comes in as an argument, so every rule is tested without a socket.

use std::ops::{Range, RangeInclusive};
use std::time::{Duration, Instant};

pub const RRQ: u16 = 1;
pub const WRQ: u16 = 2;
pub const DATA: u16 = 3;
pub const ACK: u16 = 4;
pub const ERROR: u16 = 5;
pub const OACK: u16 = 6;

/// RFC 1350's default block size, and RFC 2348's bounds.
pub const DEFAULT_BLKSIZE: u16 = 512;
pub const MIN_BLKSIZE: u16 = 8;
pub const MAX_BLKSIZE: u16 = 65464;

/// RFC 1350 error codes (and 8, RFC 2347).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u16)]
pub enum ErrorCode {
    NotDefined = 0,
    FileNotFound = 1,
    AccessViolation = 2,
    IllegalOperation = 4,
}

/// An ERROR packet.
pub fn error_packet(code: ErrorCode, msg: &str) -> Vec<u8> {
    let mut p = Vec::with_capacity(5 + msg.len());
    p.extend_from_slice(&ERROR.to_be_bytes());
    p.extend_from_slice(&(code as u16).to_be_bytes());
    p.extend(msg.bytes().filter(|b| *b != 0));
    p.push(0);
    p
}

/// The 4-byte header of DATA block `block` (its number on the wire wraps
/// past 65535 to 0, as tftpd-hpa and most clients do).
pub fn data_header(block: u64) -> [u8; 4] {
    let n = (block & 0xFFFF) as u16;
    let [a, b] = DATA.to_be_bytes();
    let [c, d] = n.to_be_bytes();
    [a, b, c, d]
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Octet,
    /// Served byte for byte, like octet (as async-tftp did before): the
    /// files are firmware binaries, and no boot client asks for netascii.
    Netascii,
}

/// The options a client asked for, in its order; values out of their RFC's
/// range are dropped here (the option is then ignored, as RFC 2347 allows).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Options {
    pub blksize: Option<u16>,
    pub timeout: Option<u8>,
    pub tsize: Option<u64>,
    pub windowsize: Option<u16>,
    /// Names as the client spelled them, lowercased, in request order.
    order: Vec<&'static str>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    pub write: bool,
    /// The file name as sent; not UTF-8 bytes are replaced (such a name
    /// then names no file).
    pub path: String,
    pub mode: Mode,
    pub options: Options,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BadRequest {
    /// Not a request at all, or cut short: no reply (it may be a stray
    /// packet for an old transfer).
    Malformed,
    /// A request in a mode we do not serve (`mail`, ...): ERROR 4.
    Mode(String),
}

/// Parse a datagram sent to port 69.
pub fn parse_request(pkt: &[u8]) -> Result<Request, BadRequest> {
    let op = match pkt {
        [a, b, ..] => u16::from_be_bytes([*a, *b]),
        _ => return Err(BadRequest::Malformed),
    };
    let write = match op {
        RRQ => false,
        WRQ => true,
        _ => return Err(BadRequest::Malformed),
    };
    // Fields are NUL-terminated; the last one must be terminated too.
    let body = &pkt[2..];
    let Some(body) = body.strip_suffix(&[0]) else {
        return Err(BadRequest::Malformed);
    };
    let mut fields = body.split(|b| *b == 0);
    let path = fields.next().ok_or(BadRequest::Malformed)?;
    let mode = fields.next().ok_or(BadRequest::Malformed)?;
    if path.is_empty() {
        return Err(BadRequest::Malformed);
    }
    let mode = String::from_utf8_lossy(mode).to_ascii_lowercase();
    let mode = match mode.as_str() {
        "octet" => Mode::Octet,
        "netascii" => Mode::Netascii,
        _ => return Err(BadRequest::Mode(mode)),
    };
    let mut options = Options::default();
    // Options come in name/value pairs; a dangling name is ignored.
    while let (Some(name), Some(value)) = (fields.next(), fields.next()) {
        let name = String::from_utf8_lossy(name).to_ascii_lowercase();
        let value = std::str::from_utf8(value).unwrap_or("");
        let key = match name.as_str() {
            "blksize" => match value.parse::<u16>() {
                Ok(v) if v >= MIN_BLKSIZE => {
                    // RFC 2348: larger than 65464 is offered as 65464.
                    options.blksize = Some(v.min(MAX_BLKSIZE));
                    "blksize"
                }
                _ => continue,
            },
            "timeout" => match value.parse::<u8>() {
                Ok(v) if v >= 1 => {
                    options.timeout = Some(v);
                    "timeout"
                }
                _ => continue,
            },
            "tsize" => match value.parse::<u64>() {
                Ok(v) => {
                    options.tsize = Some(v);
                    "tsize"
                }
                _ => continue,
            },
            "windowsize" => match value.parse::<u16>() {
                Ok(v) if v >= 1 => {
                    options.windowsize = Some(v);
                    "windowsize"
                }
                _ => continue,
            },
            _ => continue,
        };
        if !options.order.contains(&key) {
            options.order.push(key);
        }
    }
    Ok(Request {
        write,
        path: String::from_utf8_lossy(path).into_owned(),
        mode,
        options,
    })
}

/// What the server allows.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Retransmission timeout when the client names none.
    pub timeout: Duration,
    /// Retransmissions of one packet (or window) before giving up.
    pub retries: u32,
    pub max_blksize: u16,
    pub max_windowsize: u16,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            timeout: Duration::from_secs(2),
            retries: 5,
            max_blksize: MAX_BLKSIZE,
            max_windowsize: 64,
        }
    }
}

/// The parameters of one transfer after option negotiation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Negotiated {
    pub blksize: u16,
    pub windowsize: u16,
    pub timeout: Duration,
    /// The OACK to send first, when the client asked for any option we
    /// took (RFC 2347); else DATA 1 is the reply.
    pub oack: Option<Vec<u8>>,
}

/// Answer the client's options for a file of `size` bytes.
pub fn negotiate(opts: &Options, size: u64, limits: &Limits) -> Negotiated {
    let mut n = Negotiated {
        blksize: DEFAULT_BLKSIZE,
        windowsize: 1,
        timeout: limits.timeout,
        oack: None,
    };
    let mut oack = OACK.to_be_bytes().to_vec();
    for key in &opts.order {
        let value = match *key {
            "blksize" => {
                let Some(v) = opts.blksize else { continue };
                n.blksize = v.min(limits.max_blksize).max(MIN_BLKSIZE);
                n.blksize.to_string()
            }
            "timeout" => {
                let Some(v) = opts.timeout else { continue };
                n.timeout = Duration::from_secs(u64::from(v));
                v.to_string()
            }
            "tsize" => size.to_string(),
            "windowsize" => {
                let Some(v) = opts.windowsize else { continue };
                n.windowsize = v.clamp(1, limits.max_windowsize.max(1));
                n.windowsize.to_string()
            }
            _ => continue,
        };
        oack.extend_from_slice(key.as_bytes());
        oack.push(0);
        oack.extend_from_slice(value.as_bytes());
        oack.push(0);
    }
    if oack.len() > 2 {
        n.oack = Some(oack);
    }
    n
}

/// Why a transfer ended without its last ACK.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Failure {
    /// No answer after every retransmission.
    Timeout,
    /// The client sent an ERROR (code, message): it gave up or refused the
    /// OACK (code 8).
    ClientError(u16, String),
}

/// What the shell should do next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// Send the OACK ([`Sender::oack`]).
    SendOack,
    /// Send these DATA blocks (absolute numbers, from 1), in order.
    SendBlocks(RangeInclusive<u64>),
    /// Nothing to send: wait for a packet or [`Sender::deadline`].
    Wait,
    /// The last block was acknowledged.
    Done,
    Failed(Failure),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Oack,
    Data,
    Done,
    Failed,
}

/// One read transfer. Blocks are counted from 1 without wrapping (the wire
/// number is the low 16 bits); the last block is shorter than blksize,
/// possibly empty.
#[derive(Debug)]
pub struct Sender {
    size: u64,
    blksize: u64,
    window: u64,
    last: u64,
    /// Every block up to this one is acknowledged.
    acked: u64,
    /// The highest block sent so far.
    sent: u64,
    oack: Option<Vec<u8>>,
    state: State,
    timeout: Duration,
    retries: u32,
    max_retries: u32,
    deadline: Instant,
    /// A duplicate ACK already made us resend the current window.
    dup_resent: bool,
}

impl Sender {
    pub fn new(size: u64, n: Negotiated, limits: &Limits, now: Instant) -> Sender {
        let blksize = u64::from(n.blksize.max(MIN_BLKSIZE));
        Sender {
            size,
            blksize,
            window: u64::from(n.windowsize.max(1)),
            last: size / blksize + 1,
            acked: 0,
            sent: 0,
            state: if n.oack.is_some() {
                State::Oack
            } else {
                State::Data
            },
            oack: n.oack,
            timeout: n.timeout,
            retries: 0,
            max_retries: limits.retries,
            deadline: now + n.timeout,
            dup_resent: false,
        }
    }

    /// The first thing to send.
    pub fn start(&mut self, now: Instant) -> Step {
        self.deadline = now + self.timeout;
        match self.state {
            State::Oack => Step::SendOack,
            _ => self.send_window(),
        }
    }

    pub fn oack(&self) -> &[u8] {
        self.oack.as_deref().unwrap_or(&[])
    }

    /// The byte range of `block` in the file.
    pub fn block_range(&self, block: u64) -> Range<usize> {
        let start = ((block.saturating_sub(1)) * self.blksize).min(self.size);
        let end = (start + self.blksize).min(self.size);
        start as usize..end as usize
    }

    /// When to call [`Sender::on_timeout`] if no packet comes.
    pub fn deadline(&self) -> Instant {
        self.deadline
    }

    pub fn blksize(&self) -> u64 {
        self.blksize
    }

    pub fn windowsize(&self) -> u64 {
        self.window
    }

    /// Bytes the client has acknowledged.
    pub fn bytes_acked(&self) -> u64 {
        (self.acked * self.blksize).min(self.size)
    }

    fn send_window(&mut self) -> Step {
        let first = self.acked + 1;
        let end = (self.acked + self.window).min(self.last);
        self.sent = self.sent.max(end);
        self.dup_resent = false;
        Step::SendBlocks(first..=end)
    }

    /// A datagram from the client (the socket is connected: only from it).
    pub fn on_packet(&mut self, pkt: &[u8], now: Instant) -> Step {
        if matches!(self.state, State::Done | State::Failed) {
            return Step::Wait;
        }
        let (op, num) = match pkt {
            [a, b, c, d, ..] => (u16::from_be_bytes([*a, *b]), u16::from_be_bytes([*c, *d])),
            _ => return Step::Wait,
        };
        match op {
            ERROR => {
                self.state = State::Failed;
                let msg = pkt[4..].split(|b| *b == 0).next().unwrap_or(&[]);
                Step::Failed(Failure::ClientError(
                    num,
                    String::from_utf8_lossy(msg).into_owned(),
                ))
            }
            ACK => self.on_ack(num, now),
            _ => Step::Wait,
        }
    }

    fn on_ack(&mut self, num: u16, now: Instant) -> Step {
        if self.state == State::Oack {
            if num != 0 {
                return Step::Wait;
            }
            self.state = State::Data;
            self.progress(now);
            return self.send_window();
        }
        // Map the 16-bit number onto (acked, sent]: anything else is a
        // duplicate or a stale ACK from before.
        let diff = u64::from(num.wrapping_sub((self.acked & 0xFFFF) as u16));
        if diff == 0 {
            // A duplicate of the last ACK. In lockstep it is never answered
            // (the Sorcerer's Apprentice bug, RFC 1350 errata); with a
            // window it says the window's first block was lost: resend the
            // window, once per window, so duplicates cannot multiply.
            if self.window > 1 && !self.dup_resent && self.sent > self.acked {
                let step = self.send_window();
                self.dup_resent = true;
                self.deadline = now + self.timeout;
                return step;
            }
            return Step::Wait;
        }
        let block = self.acked + diff;
        if block > self.sent {
            return Step::Wait;
        }
        self.acked = block;
        self.progress(now);
        if block == self.last {
            self.state = State::Done;
            return Step::Done;
        }
        // A window acknowledged in part (RFC 7440): go on from there.
        self.send_window()
    }

    fn progress(&mut self, now: Instant) {
        self.retries = 0;
        self.deadline = now + self.timeout;
    }

    /// [`Sender::deadline`] passed without progress.
    pub fn on_timeout(&mut self, now: Instant) -> Step {
        match self.state {
            State::Done | State::Failed => return Step::Wait,
            _ if now < self.deadline => return Step::Wait,
            _ => {}
        }
        if self.retries >= self.max_retries {
            self.state = State::Failed;
            return Step::Failed(Failure::Timeout);
        }
        self.retries += 1;
        self.deadline = now + self.timeout;
        match self.state {
            State::Oack => Step::SendOack,
            _ => {
                let step = self.send_window();
                // Keep the once-per-window duplicate resend available.
                self.dup_resent = false;
                step
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rrq(path: &str, mode: &str, opts: &[(&str, &str)]) -> Vec<u8> {
        let mut p = RRQ.to_be_bytes().to_vec();
        for f in [path, mode] {
            p.extend_from_slice(f.as_bytes());
            p.push(0);
        }
        for (k, v) in opts {
            for f in [k, v] {
                p.extend_from_slice(f.as_bytes());
                p.push(0);
            }
        }
        p
    }

    fn ack(n: u16) -> Vec<u8> {
        let mut p = ACK.to_be_bytes().to_vec();
        p.extend_from_slice(&n.to_be_bytes());
        p
    }

    fn oack_fields(p: &[u8]) -> Vec<String> {
        assert_eq!(&p[..2], &OACK.to_be_bytes());
        let s = std::str::from_utf8(&p[2..]).unwrap();
        s.strip_suffix('\0')
            .unwrap()
            .split('\0')
            .map(String::from)
            .collect()
    }

    #[test]
    fn parses_requests_with_options() {
        let r = parse_request(&rrq(
            "ipxe.efi",
            "OCTET",
            &[
                ("BLKSIZE", "1468"),
                ("tsize", "0"),
                ("windowsize", "16"),
                ("timeout", "3"),
                ("multicast", ""),
            ],
        ))
        .unwrap();
        assert!(!r.write);
        assert_eq!(r.path, "ipxe.efi");
        assert_eq!(r.mode, Mode::Octet);
        assert_eq!(r.options.blksize, Some(1468));
        assert_eq!(r.options.tsize, Some(0));
        assert_eq!(r.options.windowsize, Some(16));
        assert_eq!(r.options.timeout, Some(3));
        assert_eq!(
            r.options.order,
            vec!["blksize", "tsize", "windowsize", "timeout"]
        );
        let w = parse_request(&{
            let mut p = rrq("x", "netascii", &[]);
            p[1] = WRQ as u8;
            p
        })
        .unwrap();
        assert!(w.write);
        assert_eq!(w.mode, Mode::Netascii);
    }

    #[test]
    fn drops_out_of_range_option_values() {
        let r = parse_request(&rrq(
            "f",
            "octet",
            &[
                ("blksize", "7"),
                ("timeout", "0"),
                ("windowsize", "0"),
                ("tsize", "-1"),
            ],
        ))
        .unwrap();
        assert_eq!(r.options, Options::default());
        let r = parse_request(&rrq(
            "f",
            "octet",
            &[("blksize", "65535"), ("timeout", "256")],
        ))
        .unwrap();
        assert_eq!(r.options.blksize, Some(MAX_BLKSIZE));
        assert_eq!(r.options.timeout, None);
        assert_eq!(
            negotiate(&r.options, 10, &Limits::default()).blksize,
            MAX_BLKSIZE
        );
    }

    #[test]
    fn refuses_malformed_requests_and_odd_modes() {
        for p in [
            &b""[..],
            b"\x00",
            b"\x00\x01",
            b"\x00\x01file",
            b"\x00\x01file\x00octet",
            b"\x00\x01\x00octet\x00",
            b"\x00\x03file\x00octet\x00",
            b"\x00\x04\x00\x01",
            b"\x00\x01file\x00",
        ] {
            assert_eq!(parse_request(p), Err(BadRequest::Malformed), "{p:?}");
        }
        assert_eq!(
            parse_request(&rrq("f", "mail", &[])),
            Err(BadRequest::Mode("mail".into()))
        );
        // A dangling option name is ignored, not fatal.
        let r = parse_request(b"\x00\x01f\x00octet\x00blksize\x00").unwrap();
        assert_eq!(r.options.blksize, None);
    }

    #[test]
    fn negotiates_in_request_order_within_limits() {
        let r = parse_request(&rrq(
            "f",
            "octet",
            &[("windowsize", "500"), ("tsize", "0"), ("blksize", "9000")],
        ))
        .unwrap();
        let limits = Limits {
            max_blksize: 1468,
            ..Limits::default()
        };
        let n = negotiate(&r.options, 850_528, &limits);
        assert_eq!(n.blksize, 1468);
        assert_eq!(n.windowsize, 64);
        assert_eq!(
            oack_fields(n.oack.as_ref().unwrap()),
            ["windowsize", "64", "tsize", "850528", "blksize", "1468"]
        );
        let none = negotiate(&Options::default(), 5, &limits);
        assert_eq!(
            none,
            Negotiated {
                blksize: 512,
                windowsize: 1,
                timeout: limits.timeout,
                oack: None
            }
        );
        let t = parse_request(&rrq("f", "octet", &[("timeout", "7")])).unwrap();
        let n = negotiate(&t.options, 5, &limits);
        assert_eq!(n.timeout, Duration::from_secs(7));
        assert_eq!(oack_fields(n.oack.as_ref().unwrap()), ["timeout", "7"]);
    }

    #[test]
    fn encodes_errors_and_data_headers() {
        assert_eq!(
            error_packet(ErrorCode::FileNotFound, "no\0pe"),
            b"\x00\x05\x00\x01nope\x00"
        );
        assert_eq!(data_header(1), [0, 3, 0, 1]);
        assert_eq!(data_header(65535), [0, 3, 255, 255]);
        assert_eq!(data_header(65536), [0, 3, 0, 0]);
        assert_eq!(data_header(65537), [0, 3, 0, 1]);
    }

    fn sender(size: u64, blksize: u16, window: u16, oack: bool) -> (Sender, Instant) {
        let t0 = Instant::now();
        let n = Negotiated {
            blksize,
            windowsize: window,
            timeout: Duration::from_secs(1),
            oack: oack.then(|| OACK.to_be_bytes().to_vec()),
        };
        (Sender::new(size, n, &Limits::default(), t0), t0)
    }

    #[test]
    fn lockstep_without_options() {
        let (mut s, t) = sender(1000, 512, 1, false);
        assert_eq!(s.start(t), Step::SendBlocks(1..=1));
        assert_eq!(s.block_range(1), 0..512);
        assert_eq!(s.block_range(2), 512..1000);
        assert_eq!(s.on_packet(&ack(1), t), Step::SendBlocks(2..=2));
        assert_eq!(s.bytes_acked(), 512);
        assert_eq!(s.on_packet(&ack(2), t), Step::Done);
        assert_eq!(s.bytes_acked(), 1000);
        // Nothing after the end.
        assert_eq!(s.on_packet(&ack(2), t), Step::Wait);
        assert_eq!(s.on_timeout(t + Duration::from_secs(9)), Step::Wait);
    }

    #[test]
    fn exact_multiple_ends_with_an_empty_block() {
        let (mut s, t) = sender(1024, 512, 1, false);
        s.start(t);
        s.on_packet(&ack(1), t);
        assert_eq!(s.on_packet(&ack(2), t), Step::SendBlocks(3..=3));
        assert_eq!(s.block_range(3), 1024..1024);
        assert_eq!(s.on_packet(&ack(3), t), Step::Done);
        let (mut empty, t) = sender(0, 512, 1, false);
        assert_eq!(empty.start(t), Step::SendBlocks(1..=1));
        assert_eq!(empty.block_range(1), 0..0);
        assert_eq!(empty.on_packet(&ack(1), t), Step::Done);
    }

    #[test]
    fn oack_waits_for_ack_zero() {
        let (mut s, t) = sender(3000, 1000, 1, true);
        assert_eq!(s.start(t), Step::SendOack);
        assert_eq!(s.on_packet(&ack(1), t), Step::Wait);
        assert_eq!(s.on_packet(b"\x00\x03\x00\x00", t), Step::Wait);
        let late = t + Duration::from_millis(1500);
        assert_eq!(s.on_timeout(late), Step::SendOack);
        assert_eq!(s.on_packet(&ack(0), late), Step::SendBlocks(1..=1));
        assert_eq!(s.deadline(), late + Duration::from_secs(1));
    }

    #[test]
    fn client_error_ends_the_transfer() {
        let (mut s, t) = sender(3000, 1000, 1, true);
        s.start(t);
        assert_eq!(
            s.on_packet(b"\x00\x05\x00\x08no options\x00", t),
            Step::Failed(Failure::ClientError(8, "no options".into()))
        );
        assert_eq!(s.on_packet(&ack(0), t), Step::Wait);
    }

    #[test]
    fn duplicate_acks_are_not_answered_in_lockstep() {
        let (mut s, t) = sender(5000, 512, 1, false);
        s.start(t);
        assert_eq!(s.on_packet(&ack(1), t), Step::SendBlocks(2..=2));
        for _ in 0..3 {
            assert_eq!(s.on_packet(&ack(1), t), Step::Wait);
        }
        // Old ACKs and ACKs for blocks not sent yet are ignored too.
        assert_eq!(s.on_packet(&ack(0), t), Step::Wait);
        assert_eq!(s.on_packet(&ack(3), t), Step::Wait);
        assert_eq!(s.on_packet(&ack(9), t), Step::Wait);
        // Short or unknown packets too.
        assert_eq!(s.on_packet(b"\x00\x04\x00", t), Step::Wait);
        assert_eq!(s.on_packet(b"\x00\x09\x00\x02", t), Step::Wait);
        assert_eq!(s.on_packet(&ack(2), t), Step::SendBlocks(3..=3));
    }

    #[test]
    fn retransmits_on_timeout_then_gives_up() {
        let (mut s, t) = sender(5000, 512, 4, false);
        assert_eq!(s.start(t), Step::SendBlocks(1..=4));
        // Before the deadline a timeout call does nothing.
        assert_eq!(s.on_timeout(t + Duration::from_millis(999)), Step::Wait);
        let mut now = t;
        for _ in 0..5 {
            now += Duration::from_secs(1);
            assert_eq!(s.on_timeout(now), Step::SendBlocks(1..=4));
        }
        now += Duration::from_secs(1);
        assert_eq!(s.on_timeout(now), Step::Failed(Failure::Timeout));
        assert_eq!(s.on_packet(&ack(4), now), Step::Wait);
    }

    #[test]
    fn progress_resets_retries() {
        let (mut s, t) = sender(5000, 512, 1, false);
        s.start(t);
        let mut now = t;
        for i in 1..=9u16 {
            for _ in 0..5 {
                now += Duration::from_secs(1);
                assert!(matches!(s.on_timeout(now), Step::SendBlocks(_)));
            }
            let step = s.on_packet(&ack(i), now);
            assert!(matches!(step, Step::SendBlocks(_)), "{step:?}");
        }
        assert_eq!(s.on_packet(&ack(10), now), Step::Done);
    }

    #[test]
    fn windows_advance_on_partial_acks() {
        // 10 blocks of 100 bytes, then an empty 11th.
        let (mut s, t) = sender(1000, 100, 4, true);
        assert_eq!(s.start(t), Step::SendOack);
        assert_eq!(s.on_packet(&ack(0), t), Step::SendBlocks(1..=4));
        // Client got 1..2 then lost 3: ACK 2, send from 3.
        assert_eq!(s.on_packet(&ack(2), t), Step::SendBlocks(3..=6));
        assert_eq!(s.on_packet(&ack(6), t), Step::SendBlocks(7..=10));
        // A late ACK of the earlier window is stale.
        assert_eq!(s.on_packet(&ack(4), t), Step::Wait);
        assert_eq!(s.on_packet(&ack(10), t), Step::SendBlocks(11..=11));
        assert_eq!(s.block_range(11), 1000..1000);
        assert_eq!(s.on_packet(&ack(11), t), Step::Done);
    }

    #[test]
    fn duplicate_ack_resends_a_window_once() {
        let (mut s, t) = sender(10_000, 100, 8, false);
        assert_eq!(s.start(t), Step::SendBlocks(1..=8));
        assert_eq!(s.on_packet(&ack(8), t), Step::SendBlocks(9..=16));
        // Block 9 lost: the client re-ACKs 8.
        assert_eq!(s.on_packet(&ack(8), t), Step::SendBlocks(9..=16));
        assert_eq!(s.on_packet(&ack(8), t), Step::Wait);
        assert_eq!(s.on_packet(&ack(8), t), Step::Wait);
        assert_eq!(s.on_packet(&ack(16), t), Step::SendBlocks(17..=24));
        assert_eq!(s.on_packet(&ack(16), t), Step::SendBlocks(17..=24));
    }

    #[test]
    fn block_numbers_wrap_past_65535() {
        // 70000 blocks of 8 bytes (then an empty last one).
        let size = 70_000 * 8;
        let (mut s, t) = sender(size, 8, 16, false);
        let mut step = s.start(t);
        let mut acks = 0;
        loop {
            match step {
                Step::SendBlocks(r) => {
                    let end = *r.end();
                    step = s.on_packet(&ack((end & 0xFFFF) as u16), t);
                    acks += 1;
                }
                Step::Done => break,
                other => panic!("{other:?}"),
            }
        }
        assert_eq!(acks, 70_001usize.div_ceil(16));
        assert_eq!(s.bytes_acked(), size);
        // Across the wrap, a stale ACK stays stale.
        let (mut s, t) = sender(size, 8, 4, false);
        s.start(t);
        let mut last = 0u64;
        while last < 65_534 {
            match s.on_packet(&ack(((last + 4) & 0xFFFF) as u16), t) {
                Step::SendBlocks(r) => last = *r.start() - 1,
                other => panic!("{other:?}"),
            }
        }
        // acked = 65534 (or so); sent up to acked + 4, crossing 65535.
        let acked = last;
        let sent_end = acked + 4;
        assert!(sent_end > 65_535);
        assert_eq!(
            s.on_packet(&ack(((acked - 2) & 0xFFFF) as u16), t),
            Step::Wait
        );
        assert_eq!(
            s.on_packet(&ack((sent_end & 0xFFFF) as u16), t),
            Step::SendBlocks(sent_end + 1..=sent_end + 4)
        );
    }
}
