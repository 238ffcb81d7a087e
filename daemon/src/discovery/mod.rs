//! Zero-touch: machines nobody entered. In reservation mode an unknown
//! netboot client is leased an address from the discovery pool
//! (`pool.rs`, served by the DHCP shell); when its agent first asks for
//! work, it becomes Hardware `discovery-<mac>` (`hardware.rs`), and a
//! WorkflowRuleSet may enroll it (`rules.rs`). Everything a packet can make
//! us keep here is bounded.

pub mod hardware;
pub mod pool;
pub mod rules;

use crate::hardware::Mac;
use std::str::FromStr;

/// The most addresses one pool serves (a /16).
pub const POOL_MAX: usize = 1 << 16;

/// A MAC pattern from `discovery.mac_patterns`: six octets, each two hex
/// digits or `*`; a `*` in the last place given matches every octet after
/// it, so `52:54:00:*` is QEMU's prefix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MacPattern([Option<u8>; 6]);

impl FromStr for MacPattern {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let err = || {
            format!(
                "{s:?} is not a MAC pattern: want octets or '*' separated by ':', e.g. \"52:54:00:*\""
            )
        };
        let parts: Vec<&str> = s.trim().split([':', '-']).collect();
        if parts.is_empty() || parts.len() > 6 {
            return Err(err());
        }
        let mut out = [None; 6];
        for (i, p) in parts.iter().enumerate() {
            if *p == "*" {
                if i + 1 == parts.len() {
                    // A trailing star covers the rest.
                    return Ok(MacPattern(out));
                }
                continue;
            }
            if p.len() != 2 {
                return Err(err());
            }
            out[i] = Some(u8::from_str_radix(p, 16).map_err(|_| err())?);
        }
        if parts.len() < 6 {
            return Err(err());
        }
        Ok(MacPattern(out))
    }
}

impl MacPattern {
    pub fn matches(&self, mac: &Mac) -> bool {
        self.0
            .iter()
            .zip(mac.octets())
            .all(|(p, o)| p.is_none_or(|p| p == o))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mac_patterns() {
        let mac = |s: &str| s.parse::<Mac>().unwrap();
        let p: MacPattern = "52:54:00:*".parse().unwrap();
        assert!(p.matches(&mac("52:54:00:12:34:56")));
        assert!(!p.matches(&mac("52:54:01:12:34:56")));
        let p: MacPattern = "*:*:*:*:*:01".parse().unwrap();
        assert!(p.matches(&mac("aa:bb:cc:dd:ee:01")));
        assert!(!p.matches(&mac("aa:bb:cc:dd:ee:02")));
        let exact: MacPattern = "AA-BB-CC-DD-EE-FF".parse().unwrap();
        assert!(exact.matches(&mac("aa:bb:cc:dd:ee:ff")));
        for bad in [
            "",
            "52:54",
            "52:54:00:*:*:*:*",
            "5:54:00:*",
            "zz:*",
            "52:54:00:12:34:567",
        ] {
            assert!(bad.parse::<MacPattern>().is_err(), "{bad}");
        }
        assert!(
            "*".parse::<MacPattern>()
                .unwrap()
                .matches(&mac("01:02:03:04:05:06"))
        );
    }
}
