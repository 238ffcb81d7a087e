//! Addresses and numbers as text, for the event writer's per-row work.
//! Hand-written because `core::fmt` goes through its formatter for each
//! integer: a MAC address cost ~2,300 instructions to format, an IPv4
//! address ~1,300, and an event row for a DORA spent ~6,000 of its ~32,000
//! on such formatting (callgrind at 6,000 DORA/s, issue 34). These write
//! the same text as `Display` does (the tests compare them).

use std::net::{IpAddr, Ipv4Addr};

const HEX: &[u8; 16] = b"0123456789abcdef";

/// `n` in decimal, appended to `s`.
pub fn push_dec(s: &mut String, n: u64) {
    let mut buf = [0u8; 20];
    let mut at = buf.len();
    let mut n = n;
    loop {
        at -= 1;
        buf[at] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    // Only ASCII digits were written.
    s.extend(buf[at..].iter().map(|&b| b as char));
}

/// `ip` dotted, appended to `s`.
pub fn push_ipv4(s: &mut String, ip: Ipv4Addr) {
    for (i, o) in ip.octets().into_iter().enumerate() {
        if i > 0 {
            s.push('.');
        }
        push_dec(s, o.into());
    }
}

/// `ip` as `Display` writes it; IPv4 without the formatter.
pub fn ip(ip: IpAddr) -> String {
    match ip {
        IpAddr::V4(v4) => {
            let mut s = String::with_capacity(15);
            push_ipv4(&mut s, v4);
            s
        }
        IpAddr::V6(v6) => v6.to_string(),
    }
}

/// A MAC address as `aa:bb:cc:dd:ee:ff`.
pub fn mac(o: [u8; 6]) -> [u8; 17] {
    let mut out = [b':'; 17];
    for (i, b) in o.into_iter().enumerate() {
        out[i * 3] = HEX[usize::from(b >> 4)];
        out[i * 3 + 1] = HEX[usize::from(b & 0xf)];
    }
    out
}

/// `n` as `{:#010x}` writes it: `0x0000abcd`.
pub fn hex32(n: u32) -> [u8; 10] {
    let mut out = *b"0x00000000";
    for (i, b) in n.to_be_bytes().into_iter().enumerate() {
        out[2 + i * 2] = HEX[usize::from(b >> 4)];
        out[3 + i * 2] = HEX[usize::from(b & 0xf)];
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn as_display_writes_them() {
        for n in [0u64, 7, 10, 99, 100, 65535, 1_700_000_000_123, u64::MAX] {
            let mut s = String::from("x");
            push_dec(&mut s, n);
            assert_eq!(s, format!("x{n}"));
        }
        for a in [
            Ipv4Addr::UNSPECIFIED,
            Ipv4Addr::BROADCAST,
            Ipv4Addr::new(10, 0, 9, 200),
            Ipv4Addr::new(1, 20, 100, 0),
        ] {
            assert_eq!(ip(IpAddr::V4(a)), a.to_string());
        }
        let v6: IpAddr = "fe80::1:2".parse().unwrap();
        assert_eq!(ip(v6), "fe80::1:2");
        let o = [0x00, 0x0f, 0xa0, 0xff, 0x1b, 0xc9];
        assert_eq!(
            std::str::from_utf8(&mac(o)).unwrap(),
            format!(
                "{:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}",
                o[0], o[1], o[2], o[3], o[4], o[5]
            )
        );
        for n in [0u32, 0xabcd, 0xdead_beef, u32::MAX] {
            assert_eq!(
                std::str::from_utf8(&hex32(n)).unwrap(),
                format!("{n:#010x}")
            );
        }
    }
}
