//! Read-only TFTP for the iPXE binaries, served from memory.
//!
//! [`resolve`] (pure) decides which bytes a request gets; [`proto`] is the
//! protocol without sockets (RFC 1350 with blksize, tsize, timeout and
//! windowsize, RFC 2347/2348/2349/7440); `server` is the tokio shell: one
//! task per transfer on its own ephemeral port, at most [`MAX_TRANSFERS`] at
//! once, none longer than [`MAX_TRANSFER_TIME`]. Each transfer is recorded as
//! an event (`tftp.sent`, `tftp.aborted`, `tftp.refused`).
//!
//! Why hand-written: async-tftp 0.4, used before, runs every transfer on one
//! async-executor driven from a single tokio task, with its own async-io
//! reactor thread beside tokio's, so every packet cost a cross-thread wake-up
//! (futex + eventfd), an epoll re-arm and a timerfd reset, all on one core,
//! and it sends a window one `sendto` per block. It has no knob for any of
//! that. In the boot-storm bench (tests/bench, 200 clients reading ipxe.efi,
//! 850 KB, over a veth pair on a 2-core VM) it took 10.5 s at blksize 512
//! and 4.4 s at 1468 where tftpd-hpa took 6.1 s and 2.4 s, and 1.27 s with
//! windowsize 16 (tftpd-hpa, without windows, 2.2 s). Here a lockstep packet
//! costs one `recv` and one `send` (no extra wake-ups), a window one UDP GSO
//! `sendmsg`: 0.48 s with windowsize 16 against tftpd-hpa's 3.1 s in one
//! run of the bench, and in lockstep half of tftpd-hpa's server CPU time
//! (3.4 s against 6.6 s for the storm at blksize 512, cpuacct cgroup). The
//! lockstep wall time is then set by the client and by the CPU share the
//! server gets on a busy machine (tftpd-hpa runs a process per client).

use crate::events::EventSink;
use crate::hardware::Mac;
use crate::inventory::Inventory;
use bytes::Bytes;
use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

pub mod proto;
mod server;

pub use server::{MAX_TRANSFER_TIME, MAX_TRANSFERS, serve};

/// Files larger than this in ipxe_dir are not loaded (iPXE binaries are ~1 MiB).
const MAX_FILE: u64 = 32 << 20;

/// The iPXE binaries, by file name.
#[derive(Default, Clone)]
pub struct Files(Arc<HashMap<String, Bytes>>);

impl Files {
    /// Every regular file directly in `dir`. A missing directory is not an
    /// error (TFTP then serves nothing, and says so in the log).
    pub fn load(dir: &Path) -> std::io::Result<Files> {
        let mut map = HashMap::new();
        let entries = match std::fs::read_dir(dir) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Files::default()),
            Err(e) => return Err(e),
        };
        for entry in entries {
            let entry = entry?;
            let meta = std::fs::metadata(entry.path())?;
            if !meta.is_file() || meta.len() > MAX_FILE {
                continue;
            }
            if let Some(name) = entry.file_name().to_str() {
                map.insert(name.to_string(), Bytes::from(std::fs::read(entry.path())?));
            }
        }
        Ok(Files(Arc::new(map)))
    }

    pub fn from_map(map: HashMap<String, Bytes>) -> Files {
        Files(Arc::new(map))
    }

    pub fn get(&self, name: &str) -> Option<&Bytes> {
        self.0.get(name)
    }

    pub fn has(&self, name: &str) -> bool {
        self.0.contains_key(name)
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

#[derive(Debug, PartialEq, Eq)]
pub enum Refusal {
    /// `..`, absolute paths, odd characters.
    Forbidden,
    NotFound,
    /// The boot file DHCP hands a machine whose `allowPXE` is false.
    NetbootNotAllowed,
}

/// Which file a request names. `<mac>/<file>` (as Smee serves) names
/// `<file>` for that machine.
pub fn resolve<'f>(
    path: &str,
    files: &'f Files,
) -> Result<(&'f Bytes, String, Option<Mac>), Refusal> {
    let denial = crate::dhcp::NETBOOT_NOT_ALLOWED;
    if let Some(rest) = path.strip_prefix('/') {
        let mac_dir = rest
            .strip_suffix(denial)
            .and_then(|d| d.strip_suffix('/'))
            .is_some_and(|d| d.parse::<Mac>().is_ok());
        if rest == denial || mac_dir {
            return Err(Refusal::NetbootNotAllowed);
        }
    }
    if path.starts_with('/') || path.contains('\\') || path.contains('\0') {
        return Err(Refusal::Forbidden);
    }
    let parts: Vec<&str> = path.split('/').collect();
    if parts
        .iter()
        .any(|p| *p == ".." || *p == "." || p.is_empty())
    {
        return Err(Refusal::Forbidden);
    }
    let (mac, name) = match parts.as_slice() {
        [name] => (None, *name),
        [dir, name] => match dir.parse::<Mac>() {
            Ok(m) => (Some(m), *name),
            Err(_) => return Err(Refusal::NotFound),
        },
        _ => return Err(Refusal::NotFound),
    };
    let bytes = files.get(name).ok_or(Refusal::NotFound)?;
    Ok((bytes, name.to_string(), mac))
}

/// What every transfer needs: the files, and where to record it.
#[derive(Clone)]
pub struct MemHandler {
    pub files: Files,
    pub inventory: Arc<Inventory>,
    pub events: EventSink,
    pub metrics: Arc<crate::metrics::Metrics>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn files() -> Files {
        Files::from_map(HashMap::from([
            ("ipxe.efi".to_string(), Bytes::from_static(b"EFI")),
            ("undionly.kpxe".to_string(), Bytes::from_static(b"KPXE")),
        ]))
    }

    #[test]
    fn resolves_names_and_mac_prefixes() {
        let f = files();
        let (b, name, mac) = resolve("ipxe.efi", &f).unwrap();
        assert_eq!(
            (b.as_ref(), name.as_str(), mac),
            (b"EFI".as_ref(), "ipxe.efi", None)
        );
        let (_, name, mac) = resolve("52:54:00:aa:bb:cc/undionly.kpxe", &f).unwrap();
        assert_eq!(name, "undionly.kpxe");
        assert_eq!(mac.unwrap().to_string(), "52:54:00:aa:bb:cc");
        let (_, _, mac) = resolve("52-54-00-AA-BB-CC/ipxe.efi", &f).unwrap();
        assert!(mac.is_some());
    }

    #[test]
    fn refuses_escapes_and_unknown_files() {
        let f = files();
        for p in [
            "../etc/passwd",
            "/ipxe.efi",
            "a/../ipxe.efi",
            "./ipxe.efi",
            "ipxe.efi/",
            "",
            "x\\ipxe.efi",
            "ipxe\0.efi",
        ] {
            assert_eq!(resolve(p, &f).unwrap_err(), Refusal::Forbidden, "{p:?}");
        }
        for p in [
            "nope.efi",
            "notamac/ipxe.efi",
            "52:54:00:aa:bb:cc/x/ipxe.efi",
            "52:54:00:aa:bb:cc/nope",
        ] {
            assert_eq!(resolve(p, &f).unwrap_err(), Refusal::NotFound, "{p:?}");
        }
        // What DHCP hands a machine that may not netboot (Smee's names).
        for p in [
            "/netboot-not-allowed",
            "/52:54:00:aa:bb:cc/netboot-not-allowed",
        ] {
            assert_eq!(
                resolve(p, &f).unwrap_err(),
                Refusal::NetbootNotAllowed,
                "{p:?}"
            );
        }
        for p in ["/x/netboot-not-allowed", "/../netboot-not-allowed"] {
            assert_eq!(resolve(p, &f).unwrap_err(), Refusal::Forbidden, "{p:?}");
        }
    }
}
