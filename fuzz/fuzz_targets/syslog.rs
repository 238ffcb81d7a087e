//! A datagram on port 514: `syslog::parse`.
//!
//! Checked besides "no panic": a parsed line has a facility of 0-23 and a
//! known severity, and its text is non-blank, at most 2048 bytes, without
//! control characters other than tab (it is stored and shown as one line).
#![no_main]

use libfuzzer_sys::fuzz_target;
use tinkerbox::syslog;

const SEVERITIES: [&str; 8] = [
    "emerg", "alert", "crit", "err", "warning", "notice", "info", "debug",
];

fuzz_target!(|data: &[u8]| {
    let Some(line) = syslog::parse(data) else {
        return;
    };
    assert!(line.facility <= 23, "facility {}", line.facility);
    assert!(SEVERITIES.contains(&line.severity));
    assert!(!line.text.trim().is_empty(), "blank text kept");
    assert!(line.text.len() <= 2048, "text of {} bytes", line.text.len());
    assert!(
        !line.text.chars().any(|c| c.is_control() && c != '\t'),
        "control character in {:?}",
        line.text
    );
});
