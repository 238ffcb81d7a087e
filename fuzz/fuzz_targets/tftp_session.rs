//! One read transfer, `tftp::proto::Sender`, driven by a client made of
//! the fuzzer's bytes: the file size and negotiated parameters first, then
//! a script of events (ACKs near or far from what was sent, ERRORs, odd
//! opcodes, short and garbage datagrams, clock jumps and timeouts).
//!
//! Checked besides "no panic", after every step:
//! - a window sent is a non-empty range of blocks within the file, at most
//!   `windowsize` long, starting right after the last acknowledged block;
//!   every block's byte range lies within the file and is at most blksize;
//! - acknowledged bytes never go back, never pass the size;
//! - after `Done` or `Failed` nothing more is sent;
//! - it terminates: once the script ends, a silent client makes it fail
//!   within `retries + 1` timeouts, and a well-behaved client finishes it
//!   within one step per window (plus the OACK) from where the script left it.
#![no_main]

use libfuzzer_sys::fuzz_target;
use std::sync::LazyLock;
use std::time::{Duration, Instant};
use tinkerbox::tftp::proto::{self, Limits, Negotiated, Sender, Step};
use tinkerbox_fuzz::Input;

static T0: LazyLock<Instant> = LazyLock::new(Instant::now);

/// Largest file: 2^20 bytes, enough for block numbers to wrap at blksize 8.
const MAX_SIZE: u64 = 1 << 20;

struct Run {
    s: Sender,
    size: u64,
    blksize: u64,
    window: u64,
    last: u64,
    /// Highest block acknowledged, as far as the sender's own counters show.
    acked_bytes: u64,
    /// The last window sent: what a well-behaved client ACKs.
    last_sent: Option<u64>,
    oack_pending: bool,
    finished: bool,
    now: Instant,
}

impl Run {
    fn check(&mut self, step: &Step) {
        let acked = self.s.bytes_acked();
        assert!(acked >= self.acked_bytes, "acknowledged bytes went back");
        assert!(
            acked <= self.size,
            "acknowledged {acked} > size {}",
            self.size
        );
        self.acked_bytes = acked;
        if self.finished {
            assert_eq!(*step, Step::Wait, "a step after the end");
            return;
        }
        match step {
            Step::SendBlocks(r) => {
                let (first, end) = (*r.start(), *r.end());
                assert!(first >= 1 && first <= end, "empty window {r:?}");
                assert!(end <= self.last, "block {end} past the last {}", self.last);
                assert!(end - first < self.window, "window {r:?} > {}", self.window);
                // The window starts right after what the client acknowledged.
                let acked_blocks = if acked == self.size {
                    // Only the last block can be short; `acked` rounds.
                    first - 1
                } else {
                    acked / self.blksize
                };
                assert_eq!(first - 1, acked_blocks, "window {r:?}, acked bytes {acked}");
                for b in [first, end] {
                    let br = self.s.block_range(b);
                    assert!(br.start <= br.end && br.end as u64 <= self.size, "{br:?}");
                    assert!((br.end - br.start) as u64 <= self.blksize);
                }
                // The last block is short (possibly empty), every other is full.
                let lr = self.s.block_range(self.last);
                assert!(((lr.end - lr.start) as u64) < self.blksize);
                self.last_sent = Some(end);
                self.oack_pending = false;
            }
            Step::SendOack => {
                assert!(!self.s.oack().is_empty(), "OACK step without an OACK");
                self.oack_pending = true;
            }
            Step::Done => {
                assert_eq!(self.s.bytes_acked(), self.size, "done before the end");
                self.finished = true;
            }
            Step::Failed(_) => self.finished = true,
            Step::Wait => {}
        }
    }

    fn packet(&mut self, pkt: &[u8]) {
        let step = self.s.on_packet(pkt, self.now);
        self.check(&step);
    }

    fn timeout(&mut self) {
        let step = self.s.on_timeout(self.now);
        self.check(&step);
    }
}

fn ack(n: u16) -> [u8; 4] {
    let [a, b] = proto::ACK.to_be_bytes();
    let [c, d] = n.to_be_bytes();
    [a, b, c, d]
}

fuzz_target!(|data: &[u8]| {
    let mut inp = Input::new(data);
    let size = u64::from(inp.u32()) % (MAX_SIZE + 1);
    // Any blksize and windowsize: the Sender must cope with values that
    // negotiate() would not produce (0, > MAX_BLKSIZE).
    let blksize = inp.u16();
    let windowsize = inp.u16();
    let timeout = Duration::from_millis(u64::from(inp.u16()));
    let flags = inp.u8();
    let retries = u32::from(flags >> 4);
    let n = Negotiated {
        blksize,
        windowsize,
        timeout,
        oack: (flags & 1 == 1).then(|| {
            let mut o = proto::OACK.to_be_bytes().to_vec();
            o.extend_from_slice(b"blksize\0512\0");
            o
        }),
    };
    let limits = Limits {
        timeout,
        retries,
        ..Limits::default()
    };
    let t0 = *T0;
    let s = Sender::new(size, n, &limits, t0);
    let real_blksize = s.blksize();
    let window = s.windowsize();
    assert!(real_blksize >= u64::from(proto::MIN_BLKSIZE));
    assert!(window >= 1);
    let mut run = Run {
        s,
        size,
        blksize: real_blksize,
        window,
        last: size / real_blksize + 1,
        acked_bytes: 0,
        last_sent: None,
        oack_pending: false,
        finished: false,
        now: t0,
    };
    let first = run.s.start(t0);
    run.check(&first);

    // The script: at most 4096 events.
    for _ in 0..4096 {
        if inp.is_empty() {
            break;
        }
        let op = inp.u8();
        match op % 10 {
            // ACK of the last window sent, or near it.
            0 | 1 => {
                let delta = i64::from(inp.u8() as i8) * i64::from(op >> 4);
                let base = if run.oack_pending {
                    0
                } else {
                    run.last_sent.unwrap_or(0) as i64
                };
                run.packet(&ack((base + delta) as u16));
            }
            // ACK of any number.
            2 => {
                let n = inp.u16();
                run.packet(&ack(n));
            }
            // ERROR from the client.
            3 => {
                let code = inp.u16();
                let msg = inp.field();
                let mut p = proto::ERROR.to_be_bytes().to_vec();
                p.extend_from_slice(&code.to_be_bytes());
                p.extend_from_slice(msg);
                if op & 0x10 == 0 {
                    p.push(0);
                }
                run.packet(&p);
            }
            // Any datagram: other opcodes, short, long.
            4 => {
                let p = inp.field();
                run.packet(p);
            }
            // A DATA or RRQ or OACK packet back at us.
            5 => {
                let opcode =
                    [proto::DATA, proto::RRQ, proto::OACK, proto::WRQ][usize::from(op >> 6)];
                let mut p = opcode.to_be_bytes().to_vec();
                p.extend_from_slice(&inp.u16().to_be_bytes());
                run.packet(&p);
            }
            // Time passes (up to ~65 s), then maybe a timeout call.
            6 | 7 => {
                run.now += Duration::from_millis(u64::from(inp.u16()));
                if op & 0x10 == 0 {
                    run.timeout();
                }
            }
            // A timeout call exactly at the deadline.
            8 => {
                run.now = run.now.max(run.s.deadline());
                run.timeout();
            }
            // A timeout call early (the shell's timer may fire before).
            _ => run.timeout(),
        }
    }

    // Termination, from wherever the script left it.
    if run.finished {
        return;
    }
    let deadline_steps = retries as usize + 2;
    let windows = (run.last.div_ceil(run.window)) as usize + 2;
    if op_bit(data) {
        // A silent client: only timeouts. Every call jumps to the deadline.
        for _ in 0..deadline_steps {
            run.now = run.now.max(run.s.deadline());
            run.timeout();
            if run.finished {
                return;
            }
        }
        panic!("still running after {deadline_steps} timeouts with a silent client");
    } else {
        // A well-behaved client: ACK 0 after an OACK, then the end of each
        // window; a lost window is resent on timeout.
        for _ in 0..windows + deadline_steps {
            if run.oack_pending {
                run.packet(&ack(0));
            } else if let Some(end) = run.last_sent {
                run.packet(&ack((end & 0xFFFF) as u16));
            } else {
                run.now = run.now.max(run.s.deadline());
                run.timeout();
            }
            if run.finished {
                return;
            }
        }
        panic!(
            "a well-behaved client did not finish {} blocks in {} steps",
            run.last,
            windows + deadline_steps
        );
    }
});

/// Which client ends the run: from the first byte, so the fuzzer can flip it.
fn op_bit(data: &[u8]) -> bool {
    data.first().is_some_and(|b| b & 0x80 != 0)
}
