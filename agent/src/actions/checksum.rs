//! The digest an image is checked against, from the action's environment:
//! `SHA256` (tinkerbox's: a hex sha256), or `CHECKSUM` and `CHECKSUM_TYPE`
//! as a Metal3 BareMetalHost's `spec.image.checksum` and `checksumType`
//! give them: a hex digest, or the URL of a checksum file.

use super::fetch::{self, Alg};
use super::{ActionError, Env};
use std::time::Duration;

/// A checksum file is a few lines; anything bigger is not one.
pub const FILE_MAX: usize = 1 << 20;
/// The whole fetch of a checksum file, connect to last byte.
pub const FILE_TIMEOUT: Duration = Duration::from_secs(60);

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Checksum {
    pub alg: Alg,
    /// Lower case.
    pub hex: String,
    /// Where it came from, for the mismatch message.
    pub from: String,
}

impl Checksum {
    pub fn sha256(hex: &str, from: &str) -> Checksum {
        Checksum {
            alg: Alg::Sha256,
            hex: hex.to_ascii_lowercase(),
            from: from.to_string(),
        }
    }
}

/// `CHECKSUM_TYPE`: None is auto (by the digest's length). Unset is auto
/// too: Metal3's API says an unset checksumType means md5, but also "if
/// in doubt use auto", and auto takes every md5 the other reading would.
pub fn parse_type(v: Option<&str>) -> Result<Option<Alg>, ActionError> {
    match v.map(str::to_ascii_lowercase).as_deref() {
        None | Some("auto") => Ok(None),
        Some("md5") => Ok(Some(Alg::Md5)),
        Some("sha256") => Ok(Some(Alg::Sha256)),
        Some("sha512") => Ok(Some(Alg::Sha512)),
        Some(_) => Err(ActionError::Env(format!(
            "CHECKSUM_TYPE={:?}: md5, sha256, sha512 or auto",
            v.unwrap_or_default()
        ))),
    }
}

/// `hex` as a digest of type `alg` (None: by its length).
pub fn digest(hex: &str, alg: Option<Alg>, from: &str) -> Result<Checksum, ActionError> {
    let hex = hex.trim();
    if hex.is_empty() || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(ActionError::Env(format!("{from}: {hex:?} is not hex")));
    }
    let alg = match alg {
        Some(a) if a.hex_len() == hex.len() => a,
        Some(a) => {
            return Err(ActionError::Env(format!(
                "{from}: {hex:?} has {} hex digits, an {} has {}",
                hex.len(),
                a.as_str(),
                a.hex_len()
            )));
        }
        None => Alg::by_hex_len(hex.len()).ok_or_else(|| {
            ActionError::Env(format!(
                "{from}: {hex:?} has {} hex digits: not an md5 (32), sha256 (64) or sha512 (128)",
                hex.len()
            ))
        })?,
    };
    Ok(Checksum {
        alg,
        hex: hex.to_ascii_lowercase(),
        from: from.to_string(),
    })
}

/// The checksum the action asks for, if any; a checksum file is fetched.
pub async fn from_env(env: &Env<'_>, image_url: &str) -> Result<Option<Checksum>, ActionError> {
    let ty = env.get("CHECKSUM_TYPE");
    match (env.get("SHA256"), env.get("CHECKSUM")) {
        (Some(_), Some(_)) => Err(ActionError::Env(
            "SHA256 and CHECKSUM are both set: set one".into(),
        )),
        (Some(s), None) => {
            if ty.is_some() {
                return Err(ActionError::Env(
                    "CHECKSUM_TYPE goes with CHECKSUM, not with SHA256".into(),
                ));
            }
            if s.len() != 64 || !s.bytes().all(|b| b.is_ascii_hexdigit()) {
                return Err(ActionError::Env(format!(
                    "SHA256={s:?} is not 64 hex digits"
                )));
            }
            Ok(Some(Checksum::sha256(s, "SHA256")))
        }
        (None, Some(c)) => {
            let alg = parse_type(ty)?;
            if c.starts_with("http://") || c.starts_with("https://") {
                let text = fetch_file(c).await?;
                let from = format!("CHECKSUM {c}");
                let hex = pick(&text, image_url)
                    .map_err(|e| ActionError::Failed(format!("{from}: {e}")))?;
                digest(hex, alg, &from).map(Some)
            } else {
                digest(c, alg, "CHECKSUM").map(Some)
            }
        }
        (None, None) if ty.is_some() => Err(ActionError::Env(
            "CHECKSUM_TYPE is set but CHECKSUM is not".into(),
        )),
        (None, None) => Ok(None),
    }
}

/// GET a checksum file: at most [`FILE_MAX`] bytes, within [`FILE_TIMEOUT`].
async fn fetch_file(url: &str) -> Result<String, ActionError> {
    let parsed = reqwest::Url::parse(url)
        .map_err(|e| ActionError::Env(format!("CHECKSUM {url:?} is not a URL: {e}")))?;
    let failed = |e: &dyn std::error::Error| {
        ActionError::Failed(format!("GET {url} (CHECKSUM): {}", fetch::chain(e)))
    };
    let mut resp = fetch::client()?
        .get(parsed)
        .timeout(FILE_TIMEOUT)
        .send()
        .await
        .map_err(|e| failed(&e))?;
    if !resp.status().is_success() {
        return Err(ActionError::Failed(format!(
            "GET {url} (CHECKSUM): {}",
            resp.status()
        )));
    }
    let too_big = || {
        ActionError::Failed(format!(
            "CHECKSUM {url} is over {FILE_MAX} bytes: not a checksum file"
        ))
    };
    if resp.content_length().is_some_and(|n| n > FILE_MAX as u64) {
        return Err(too_big());
    }
    let mut body = Vec::new();
    // Ends: each chunk grows the body toward FILE_MAX, and the request
    // has a timeout.
    while let Some(c) = resp.chunk().await.map_err(|e| failed(&e))? {
        if body.len() + c.len() > FILE_MAX {
            return Err(too_big());
        }
        body.extend_from_slice(&c);
    }
    String::from_utf8(body).map_err(|_| ActionError::Failed(format!("CHECKSUM {url} is not text")))
}

/// The file name at the end of `url`'s path, percent-decoded.
fn file_name(url: &str) -> Option<String> {
    let u = reqwest::Url::parse(url).ok()?;
    let last = u.path_segments()?.next_back()?;
    let name = percent_encoding::percent_decode_str(last)
        .decode_utf8()
        .ok()?;
    (!name.is_empty()).then(|| name.into_owned())
}

/// One line of a checksum file: `HASH  name` or `HASH *name`
/// (sha256sum's), `ALG (name) = HASH` (BSD's), or a lone `HASH`.
fn parse_line(line: &str) -> Option<(&str, Option<&str>)> {
    let line = line.trim();
    if line.is_empty() || line.starts_with('#') {
        return None;
    }
    let (hash, name) = if let (Some(open), Some(close)) = (line.find(" ("), line.rfind(") = ")) {
        let name = line.get(open + 2..close)?;
        (line.get(close + 4..)?.trim(), Some(name))
    } else {
        match line.split_once(char::is_whitespace) {
            Some((h, rest)) => {
                let rest = rest.trim_start();
                (h, Some(rest.strip_prefix('*').unwrap_or(rest)))
            }
            None => (line, None),
        }
    };
    let hash = hash.strip_prefix('\\').unwrap_or(hash);
    let hex = Alg::by_hex_len(hash.len()).is_some() && hash.bytes().all(|b| b.is_ascii_hexdigit());
    hex.then_some((hash, name.filter(|n| !n.is_empty())))
}

/// The digest in checksum file `text` for the image at `image_url`: the
/// line naming the URL's file name (a path in the line is ignored), else
/// the file's only line.
pub fn pick<'a>(text: &'a str, image_url: &str) -> Result<&'a str, String> {
    let lines: Vec<_> = text.lines().filter_map(parse_line).collect();
    let want = file_name(image_url);
    let named: Vec<&str> = lines
        .iter()
        .filter(|(_, n)| {
            let base = n.map(|n| n.rsplit('/').next().unwrap_or(n));
            base.is_some() && base == want.as_deref()
        })
        .map(|(h, _)| *h)
        .collect();
    match (named.as_slice(), lines.as_slice()) {
        ([h, rest @ ..], _) if rest.iter().all(|r| r.eq_ignore_ascii_case(h)) => Ok(h),
        ([_, ..], _) => Err(format!(
            "several lines name {} with different digests",
            want.unwrap_or_default()
        )),
        ([], [(h, _)]) => Ok(h),
        ([], []) => Err("holds no checksum".into()),
        ([], _) => Err(format!(
            "none of its {} lines names {:?}",
            lines.len(),
            want.unwrap_or_default()
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    const MD5: &str = "d41d8cd98f00b204e9800998ecf8427e";

    fn env(kv: &[(&str, &str)]) -> BTreeMap<String, String> {
        kv.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn resolve(kv: &[(&str, &str)]) -> Result<Option<Checksum>, ActionError> {
        let m = env(kv);
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(from_env(&Env(&m), "http://h/images/x.img"))
    }

    #[test]
    fn types_and_lengths() {
        assert_eq!(resolve(&[]).unwrap(), None);
        let s = resolve(&[("SHA256", &"AB".repeat(32))]).unwrap().unwrap();
        assert_eq!((s.alg, s.hex), (Alg::Sha256, "ab".repeat(32)));
        // Unset and auto go by the length.
        for (hex, alg) in [
            (MD5.to_string(), Alg::Md5),
            ("1".repeat(64), Alg::Sha256),
            ("2".repeat(128), Alg::Sha512),
        ] {
            let s = resolve(&[("CHECKSUM", &hex)]).unwrap().unwrap();
            assert_eq!(s.alg, alg);
            let s = resolve(&[("CHECKSUM", &hex), ("CHECKSUM_TYPE", "Auto")])
                .unwrap()
                .unwrap();
            assert_eq!(s.alg, alg);
        }
        let s = resolve(&[("CHECKSUM", MD5), ("CHECKSUM_TYPE", "md5")])
            .unwrap()
            .unwrap();
        assert_eq!(s.alg, Alg::Md5);
        for (kv, msg) in [
            (
                vec![("CHECKSUM", MD5), ("CHECKSUM_TYPE", "sha256")],
                "an sha256 has 64",
            ),
            (vec![("CHECKSUM", "abc")], "not an md5"),
            (vec![("CHECKSUM", "xyz")], "not hex"),
            (
                vec![("CHECKSUM", MD5), ("CHECKSUM_TYPE", "crc")],
                "md5, sha256",
            ),
            (vec![("CHECKSUM_TYPE", "md5")], "CHECKSUM is not"),
            (vec![("SHA256", MD5)], "not 64 hex"),
            (vec![("SHA256", MD5), ("CHECKSUM", MD5)], "both set"),
            (vec![("SHA256", MD5), ("CHECKSUM_TYPE", "md5")], "goes with"),
        ] {
            let e = resolve(&kv).unwrap_err().to_string();
            assert!(e.contains(msg), "{kv:?}: {e}");
        }
    }

    #[test]
    fn checksum_files() {
        let a = "a".repeat(64);
        let b = "b".repeat(64);
        let url = "http://h/images/x%20y.qcow2?token=1";
        // sha256sum's text and binary lines, a path, a comment.
        let text = format!("# sums\n{a}  other.img\n{b} *dir/x y.qcow2\n");
        assert_eq!(pick(&text, url), Ok(b.as_str()));
        // BSD's.
        let text = format!("SHA256 (other) = {a}\nSHA256 (x y.qcow2) = {b}\n");
        assert_eq!(pick(&text, url), Ok(b.as_str()));
        // One line: whatever it names; a lone hash.
        assert_eq!(pick(&format!("{a}  other.img\n"), url), Ok(a.as_str()));
        assert_eq!(pick(&format!("{a}\n"), url), Ok(a.as_str()));
        assert!(
            pick(&format!("{a}  p\n{b}  q\n"), url)
                .unwrap_err()
                .contains("none of its 2")
        );
        assert!(pick(&format!("{a}  x y.qcow2\n{b}  x y.qcow2\n"), url).is_err());
        assert!(pick("", url).unwrap_err().contains("no checksum"));
        assert!(pick("not a hash line at all\n", url).is_err());
        assert!(pick("bad  x y.qcow2\n", url).is_err());
    }
}
