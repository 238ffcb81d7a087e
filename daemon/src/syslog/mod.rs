//! Syslog receiver (UDP 514): lines from a known machine's IP land in its
//! event log, so an OSIE's boot messages sit next to its DHCP and TFTP
//! history. Lines from unknown addresses are counted, not stored.

use crate::events::{Event, EventSink};
use crate::inventory::Inventory;
use crate::metrics::Metrics;
use serde_json::json;
use std::sync::Arc;
use tokio::net::UdpSocket;

/// Longest message kept; syslog over UDP is at most a datagram anyway.
const MAX_MESSAGE: usize = 2048;

const SEVERITY: [&str; 8] = [
    "emerg", "alert", "crit", "err", "warning", "notice", "info", "debug",
];

/// A received line: facility and severity from `<PRI>`, then the text
/// (RFC 3164 or RFC 5424 header left in place; both are readable).
#[derive(Debug, PartialEq, Eq)]
pub struct Line {
    pub facility: u8,
    pub severity: &'static str,
    pub text: String,
}

pub fn parse(data: &[u8]) -> Option<Line> {
    let s = String::from_utf8_lossy(data);
    let s = s.trim_end_matches(['\n', '\r', '\0']);
    let pri = |p: &str| {
        (!p.is_empty() && p.len() <= 3 && p.bytes().all(|b| b.is_ascii_digit()))
            .then(|| p.parse::<u8>().ok())
            .flatten()
            .filter(|p| *p <= 191)
    };
    let (pri, rest) = match s.strip_prefix('<').and_then(|r| r.split_once('>')) {
        Some((p, rest)) if pri(p).is_some() => (pri(p).unwrap_or(13), rest),
        // RFC 3164 4.3.3: no (valid) PRI means user.notice, all of it text.
        _ => (13, s),
    };
    let mut text: String = rest
        .chars()
        .filter(|c| !c.is_control() || *c == '\t')
        .collect();
    if text.len() > MAX_MESSAGE {
        let mut cut = MAX_MESSAGE;
        while !text.is_char_boundary(cut) {
            cut -= 1;
        }
        text.truncate(cut);
    }
    if text.trim().is_empty() {
        return None;
    }
    Some(Line {
        facility: pri >> 3,
        severity: SEVERITY[(pri & 7) as usize],
        text,
    })
}

pub async fn serve(
    sock: UdpSocket,
    inventory: Arc<Inventory>,
    events: EventSink,
    metrics: Arc<Metrics>,
) {
    let mut buf = vec![0u8; 8192];
    loop {
        let (n, src) = match sock.recv_from(&mut buf).await {
            Ok(x) => x,
            Err(e) => {
                tracing::warn!(error = %e, "syslog: receive failed");
                continue;
            }
        };
        let Some(line) = parse(&buf[..n]) else {
            metrics.syslog("malformed");
            continue;
        };
        let snap = inventory.snapshot();
        let Some(m) = snap.by_ip(&src.ip()) else {
            metrics.syslog("unknown_source");
            continue;
        };
        metrics.syslog("stored");
        events.record(
            Event::new("syslog", line.text)
                .machine(m.key.clone())
                .ip(src.ip())
                .fields(json!({"facility": line.facility, "severity": line.severity})),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_rfc3164_and_5424() {
        let l = parse(b"<14>tb-lab: hello from 52:54:00:99:00:01\n").unwrap();
        assert_eq!((l.facility, l.severity), (1, "info"));
        assert_eq!(l.text, "tb-lab: hello from 52:54:00:99:00:01");
        let l = parse(b"<165>1 2003-10-11T22:14:15.003Z host app - ID47 - msg").unwrap();
        assert_eq!((l.facility, l.severity), (20, "notice"));
        assert!(l.text.starts_with("1 2003-10-11"));
        let l = parse(b"no pri here").unwrap();
        assert_eq!(
            (l.facility, l.severity, l.text.as_str()),
            (1, "notice", "no pri here")
        );
        assert_eq!(parse(b"<14>"), None);
        assert_eq!(parse(b"<999>x").unwrap().text, "<999>x", "bad PRI is text");
        assert_eq!(parse(b"<14>a\x1b[31mb\x00").unwrap().text, "a[31mb");
        let long = vec![b'x'; 9000];
        assert_eq!(parse(&long).unwrap().text.len(), MAX_MESSAGE);
        assert!(
            parse(&[0xff, 0xfe, b'a']).is_some(),
            "invalid UTF-8 is replaced, not dropped"
        );
    }
}
