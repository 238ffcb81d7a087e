//! A datagram on port 69: `tftp::proto::parse_request`, then what the
//! server does with a request: `tftp::resolve` on its file name,
//! `proto::negotiate` of its options (default and tight limits), and the
//! ERROR packet that would refuse it.
//!
//! Checked besides "no panic": a resolved name is one plain file name
//! that exists (no `/`, `..`, `\`, NUL), refusals of escapes are
//! `Forbidden`; negotiated values stay within the limits; an OACK is
//! `00 06` then NUL-terminated name/value pairs; an ERROR packet has
//! exactly one NUL, at its end.
#![no_main]

use bytes::Bytes;
use libfuzzer_sys::fuzz_target;
use std::collections::HashMap;
use std::sync::LazyLock;
use std::time::Duration;
use tinkerbox::tftp::proto::{self, BadRequest, ErrorCode, Limits};
use tinkerbox::tftp::{self, Files, Refusal};

static FILES: LazyLock<Files> = LazyLock::new(|| {
    Files::from_map(HashMap::from([
        ("ipxe.efi".to_string(), Bytes::from(vec![0x4d; 3000])),
        ("snp-arm64.efi".to_string(), Bytes::from(vec![0x5a; 513])),
        ("undionly.kpxe".to_string(), Bytes::from_static(b"KPXE")),
        ("empty".to_string(), Bytes::new()),
    ]))
});

const LIMITS: [Limits; 2] = [
    Limits {
        timeout: Duration::from_secs(2),
        retries: 5,
        max_blksize: proto::MAX_BLKSIZE,
        max_windowsize: 64,
    },
    // What a server behind a 1500-byte MTU and a small window would allow.
    Limits {
        timeout: Duration::from_secs(1),
        retries: 0,
        max_blksize: 1468,
        max_windowsize: 0,
    },
];

fn check_resolve(path: &str) {
    match tftp::resolve(path, &FILES) {
        Ok((bytes, name, _mac)) => {
            assert!(
                !name.is_empty()
                    && !name.contains(['/', '\\', '\0'])
                    && name != ".."
                    && name != ".",
                "resolved to {name:?}"
            );
            assert_eq!(FILES.get(&name), Some(bytes));
            assert!(path.ends_with(name.as_str()), "{path:?} -> {name:?}");
        }
        Err(Refusal::NotFound) => {
            assert!(
                !path.starts_with('/')
                    && !path.contains(['\\', '\0'])
                    && !path.split('/').any(|p| p == ".." || p == "."),
                "an escape {path:?} was only NotFound"
            );
        }
        Err(Refusal::Forbidden) => {}
        Err(Refusal::NetbootNotAllowed) => {
            assert!(
                path.ends_with("/netboot-not-allowed"),
                "{path:?} refused as the netboot denial"
            );
        }
    }
}

fn check_oack(oack: &[u8]) {
    assert_eq!(oack.get(..2), Some(&proto::OACK.to_be_bytes()[..]));
    let body = &oack[2..];
    assert_eq!(body.last(), Some(&0), "OACK not NUL-terminated");
    let fields = body[..body.len() - 1].split(|b| *b == 0).count();
    assert_eq!(fields % 2, 0, "OACK fields are not name/value pairs");
}

fn check_error_packet(msg: &str) {
    let p = proto::error_packet(ErrorCode::FileNotFound, msg);
    assert_eq!(p.get(..2), Some(&proto::ERROR.to_be_bytes()[..]));
    assert_eq!(p.iter().skip(4).filter(|b| **b == 0).count(), 1);
    assert_eq!(p.last(), Some(&0));
}

fuzz_target!(|data: &[u8]| {
    // The file-name rules on their own, on any text.
    check_resolve(&String::from_utf8_lossy(data));

    let req = match proto::parse_request(data) {
        Ok(r) => r,
        Err(BadRequest::Mode(m)) => {
            check_error_packet(&format!("mode {m} not supported"));
            return;
        }
        Err(BadRequest::Malformed) => return,
    };
    assert!(!req.path.is_empty());
    check_resolve(&req.path);
    check_error_packet(&req.path);
    let size = tftp::resolve(&req.path, &FILES)
        .map(|(b, _, _)| b.len() as u64)
        .unwrap_or(u64::MAX);
    for limits in &LIMITS {
        for size in [size, 0, u64::MAX] {
            let n = proto::negotiate(&req.options, size, limits);
            assert!(
                n.blksize >= proto::MIN_BLKSIZE
                    && n.blksize <= limits.max_blksize.max(proto::MIN_BLKSIZE),
                "blksize {}",
                n.blksize
            );
            assert!(
                n.windowsize >= 1 && n.windowsize <= limits.max_windowsize.max(1),
                "windowsize {}",
                n.windowsize
            );
            if let Some(o) = &n.oack {
                check_oack(o);
            }
        }
    }
});
