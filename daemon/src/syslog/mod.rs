//! Syslog receiver (UDP 514): lines from a known machine's IP land in its
//! event log, so an OSIE's boot messages sit next to its DHCP and TFTP
//! history. Lines from unknown addresses are counted, not stored.
//!
//! The parser is hand-written: `syslog_loose` 0.21, tried on the lines the
//! labs' OSIEs send (this module's tests), returned `<14>tb-lab: hello`
//! whole with no priority, gave up on structured data with `]` inside a
//! quoted value, and read BusyBox's `<13>Nov 22 01:49:16 root: msg` as
//! host `root` with no tag.

use crate::events::{Event, EventSink, Kind};
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

/// A received line: facility and severity from `<PRI>`, then the text as
/// `app: message`. RFC 5424 headers are taken apart; an RFC 3164 timestamp
/// is dropped (the event has its own), the rest kept.
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
    let (pri, rest) = match s
        .strip_prefix('<')
        .and_then(|r| r.split_once('>'))
        .and_then(|(p, rest)| Some((pri(p)?, rest)))
    {
        Some(x) => x,
        // RFC 3164 4.3.3: no (valid) PRI means user.notice, all of it text.
        None => (13, s),
    };
    let rest = strip_5424(rest).unwrap_or_else(|| strip_3164_time(rest).to_string());
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

/// `1 TIMESTAMP HOST APP PROCID MSGID SD [MSG]` -> `APP: MSG`.
fn strip_5424(s: &str) -> Option<String> {
    let mut it = s.splitn(7, ' ');
    if it.next()? != "1" {
        return None;
    }
    let (_ts, _host, app, _pid, _msgid) =
        (it.next()?, it.next()?, it.next()?, it.next()?, it.next()?);
    let rest = it.next().unwrap_or("");
    // Structured data: "-" or one or more [id k="v" ...] (quotes may hold
    // spaces and escaped brackets).
    let msg = if let Some(m) = rest.strip_prefix('-') {
        m
    } else {
        let b = rest.as_bytes();
        let mut i = 0;
        while i < b.len() && b[i] == b'[' {
            let mut in_quote = false;
            i += 1;
            while i < b.len() {
                match b[i] {
                    b'\\' if in_quote => i += 1,
                    b'"' => in_quote = !in_quote,
                    b']' if !in_quote => break,
                    _ => {}
                }
                i += 1;
            }
            i += 1;
        }
        rest.get(i.min(rest.len())..).unwrap_or("")
    };
    let msg = msg.trim_start().trim_start_matches('\u{feff}');
    Some(if app == "-" {
        msg.to_string()
    } else {
        format!("{app}: {msg}")
    })
}

/// Drop a leading `Mmm dd hh:mm:ss ` (RFC 3164 TIMESTAMP).
fn strip_3164_time(s: &str) -> &str {
    const MONTHS: [&str; 12] = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ];
    let b = s.as_bytes();
    let looks = b.len() > 16
        && MONTHS.iter().any(|m| s.starts_with(m))
        && b[3] == b' '
        && b[6] == b' '
        && b[9] == b':'
        && b[12] == b':'
        && b[15] == b' ';
    if looks { &s[16..] } else { s }
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
        let Some((m, _)) = snap.by_ip(&src.ip()) else {
            metrics.syslog("unknown_source");
            continue;
        };
        metrics.syslog("stored");
        events.record(
            Event::new(Kind::Syslog, line.text)
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
        assert_eq!(l.text, "app: msg");
        // util-linux logger --udp: RFC 5424 with structured data.
        let l = parse(b"<12>1 2026-11-22T01:58:01.859150+00:00 vm osie - - [timeQuality tzKnown=\"1\" isSynced=\"0\"] hello from the OSIE").unwrap();
        assert_eq!(l.text, "osie: hello from the OSIE");
        let l = parse(b"<12>1 - - - - - [a x=\"]] [\"][b] \xef\xbb\xbfbom").unwrap();
        assert_eq!(l.text, "bom");
        // busybox syslogd -R forwards RFC 3164 with a timestamp.
        let l =
            parse(b"<14>Nov 22 01:49:16 tb-lab: hello from 52:54:00:99:00:01 worker_id=x").unwrap();
        assert_eq!(l.text, "tb-lab: hello from 52:54:00:99:00:01 worker_id=x");
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
