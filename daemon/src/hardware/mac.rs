//! MAC addresses as the inventory keys them: six octets, shown lowercase
//! with colons (the form Tinkerbell's CRD pattern and Smee's lookups use).

use std::fmt;
use std::str::FromStr;

#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Mac(pub [u8; 6]);

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("invalid MAC address {0:?}: want six hex octets such as 52:54:00:12:34:56")]
pub struct MacError(pub String);

impl Mac {
    pub fn octets(&self) -> [u8; 6] {
        self.0
    }
}

impl FromStr for Mac {
    type Err = MacError;

    /// Accepts `aa:bb:cc:dd:ee:ff`, `aa-bb-cc-dd-ee-ff`, `aabb.ccdd.eeff` and
    /// `aabbccddeeff`, any case: the spellings switches, BMCs and
    /// spreadsheets use. Hand-written: the `macaddr` crate rejects the dotted
    /// form and a dependency for twenty lines is not worth it.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let err = || MacError(s.to_string());
        let t = s.trim().as_bytes();
        // Where the separators sit; every other byte must be a hex digit.
        // No allocation: DHCP parses the MACs of a machine on each packet.
        let sep_at = |i: usize| match t.len() {
            17 => i % 3 == 2,
            14 => i % 5 == 4,
            _ => false,
        };
        let sep = match t.len() {
            17 if t[2] == b':' || t[2] == b'-' => t[2],
            14 => b'.',
            12 => 0,
            _ => return Err(err()),
        };
        let mut out = [0u8; 6];
        let mut n = 0;
        for (i, &b) in t.iter().enumerate() {
            if sep_at(i) {
                if b != sep {
                    return Err(err());
                }
                continue;
            }
            let v = match b {
                b'0'..=b'9' => b - b'0',
                b'a'..=b'f' => b - b'a' + 10,
                b'A'..=b'F' => b - b'A' + 10,
                _ => return Err(err()),
            };
            let o = out.get_mut(n / 2).ok_or_else(err)?;
            *o = (*o << 4) | v;
            n += 1;
        }
        if n != 12 {
            return Err(err());
        }
        Ok(Mac(out))
    }
}

impl fmt::Display for Mac {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let text = crate::text::mac(self.0);
        f.write_str(std::str::from_utf8(&text).map_err(|_| fmt::Error)?)
    }
}

impl fmt::Debug for Mac {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spellings_normalise() {
        for s in [
            "52:54:00:AB:cd:0F",
            "52-54-00-ab-CD-0f",
            "5254.00ab.cd0f",
            "525400abcd0f",
            " 52:54:00:ab:cd:0f ",
        ] {
            assert_eq!(
                s.parse::<Mac>().unwrap().to_string(),
                "52:54:00:ab:cd:0f",
                "{s}"
            );
        }
    }

    #[test]
    fn rejects_garbage() {
        for s in [
            "",
            "52:54:00:ab:cd",
            "52:54:00:ab:cd:0g",
            "52:54:00:ab:cd:0f:11",
            "52:54-00:ab:cd:0f",
            "+2:54:00:ab:cd:0f",
            "5254.00ab.cd0",
            "52545400abcd0f",
            "zz5400abcd0f",
            "525400abcd+f",
            "52:54:00:ab:cd-0f",
            "5254.00ab-cd0f",
            "52:54:00:ab:c:d0f",
        ] {
            assert!(s.parse::<Mac>().is_err(), "{s:?} should be rejected");
        }
    }
}
