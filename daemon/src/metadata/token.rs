//! IMDSv2 session tokens: `PUT /latest/api/token` returns a token bound to
//! the caller's IP and an expiry, signed with a per-process key (HMAC-SHA256,
//! ring). Nothing is stored; a restart invalidates every token, as a clean
//! reboot of an EC2 metadata service would.

use ring::hmac;
use std::net::IpAddr;

/// AWS accepts 1 second to 6 hours.
pub const MAX_TTL: u64 = 21600;

pub struct Tokens {
    key: hmac::Key,
}

#[derive(Debug, PartialEq, Eq)]
pub enum TokenError {
    Malformed,
    Expired,
    /// Signed for another address, or not by us.
    Invalid,
}

impl Tokens {
    pub fn new() -> Result<Tokens, ring::error::Unspecified> {
        let rng = ring::rand::SystemRandom::new();
        Ok(Tokens {
            key: hmac::Key::generate(hmac::HMAC_SHA256, &rng)?,
        })
    }

    fn tag(&self, ip: IpAddr, expires: u64) -> String {
        let msg = format!("{ip}|{expires}");
        hex::encode(hmac::sign(&self.key, msg.as_bytes()))
    }

    /// A token for `ip`, valid until `now + ttl` (unix seconds).
    pub fn issue(&self, ip: IpAddr, now: u64, ttl: u64) -> String {
        let expires = now + ttl.min(MAX_TTL);
        format!("{expires}.{}", self.tag(ip, expires))
    }

    pub fn check(&self, token: &str, ip: IpAddr, now: u64) -> Result<(), TokenError> {
        let (exp, tag) = token.trim().split_once('.').ok_or(TokenError::Malformed)?;
        let expires: u64 = exp.parse().map_err(|_| TokenError::Malformed)?;
        let mut raw = [0u8; 32];
        hex::decode_to_slice(tag, &mut raw).map_err(|_| TokenError::Malformed)?;
        hmac::verify(&self.key, format!("{ip}|{expires}").as_bytes(), &raw)
            .map_err(|_| TokenError::Invalid)?;
        if now >= expires {
            return Err(TokenError::Expired);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bound_to_address_and_time() {
        let t = Tokens::new().unwrap();
        let a: IpAddr = "10.0.0.1".parse().unwrap();
        let b: IpAddr = "10.0.0.2".parse().unwrap();
        let tok = t.issue(a, 1000, 60);
        assert_eq!(t.check(&tok, a, 1000), Ok(()));
        assert_eq!(t.check(&tok, a, 1059), Ok(()));
        assert_eq!(t.check(&tok, a, 1060), Err(TokenError::Expired));
        assert_eq!(t.check(&tok, b, 1000), Err(TokenError::Invalid));
        // Stretching the expiry breaks the signature.
        let forged = tok.replacen("1060", "9999", 1);
        assert_eq!(t.check(&forged, a, 1000), Err(TokenError::Invalid));
        // Another process's key.
        assert_eq!(
            Tokens::new().unwrap().check(&tok, a, 1000),
            Err(TokenError::Invalid)
        );
        for bad in ["", "x", "1060.", "1060.zz", "abc.00", "1060.é1"] {
            assert_eq!(t.check(bad, a, 1000), Err(TokenError::Malformed), "{bad:?}");
        }
        // TTL is capped at six hours.
        let long = t.issue(a, 0, 10 * MAX_TTL);
        assert!(long.starts_with("21600."));
    }
}
