//! Read-only TFTP for the iPXE binaries, served from memory.
//!
//! The protocol (RFC 1350, options RFC 2347/2348/2349, windowsize RFC 7440,
//! retransmission, one ephemeral port per transfer) is async-tftp's; this
//! module decides which bytes a request gets ([`resolve`], pure) and records
//! each transfer as an event.

use crate::events::{Event, EventSink};
use crate::hardware::Mac;
use crate::inventory::Inventory;
use async_tftp::packet;
use async_tftp::server::{Handler, TftpServerBuilder};
use bytes::Bytes;
use futures_lite::AsyncRead;
use serde_json::json;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::Path;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

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
}

/// Which file a request names. `<mac>/<file>` (as Smee serves) names
/// `<file>` for that machine.
pub fn resolve<'f>(
    path: &str,
    files: &'f Files,
) -> Result<(&'f Bytes, String, Option<Mac>), Refusal> {
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

/// async-tftp's handler: files from memory, every write refused.
#[derive(Clone)]
pub struct MemHandler {
    pub files: Files,
    pub inventory: Arc<Inventory>,
    pub events: EventSink,
    pub metrics: Arc<crate::metrics::Metrics>,
}

impl Handler for MemHandler {
    type Reader = Transfer;
    type Writer = futures_lite::io::Sink;

    async fn read_req_open(
        &mut self,
        client: &SocketAddr,
        path: &Path,
    ) -> Result<(Transfer, Option<u64>), packet::Error> {
        let p = path.to_str().unwrap_or("\u{fffd}");
        let (bytes, name, mac) = match resolve(p, &self.files) {
            Ok(x) => x,
            Err(r) => {
                let why = match r {
                    Refusal::Forbidden => "forbidden",
                    Refusal::NotFound => "not_found",
                };
                self.metrics.tftp(why);
                tracing::info!(%client, path = p, reason = why, "tftp: refused");
                let mut e = Event::new("tftp.refused", format!("TFTP {p:?} refused: {why}"))
                    .ip(client.ip());
                if let Some(m) = self.inventory.snapshot().by_ip(&client.ip()) {
                    e = e.machine(m.key.clone());
                }
                self.events.record(e);
                return Err(match r {
                    Refusal::Forbidden => packet::Error::PermissionDenied,
                    Refusal::NotFound => packet::Error::FileNotFound,
                });
            }
        };
        self.metrics.tftp("started");
        let len = bytes.len() as u64;
        let t = Transfer {
            data: bytes.clone(),
            pos: 0,
            name,
            mac,
            client: *client,
            started: Instant::now(),
            done: false,
            handler: self.clone(),
        };
        Ok((t, Some(len)))
    }

    async fn write_req_open(
        &mut self,
        client: &SocketAddr,
        path: &Path,
        _size: Option<u64>,
    ) -> Result<Self::Writer, packet::Error> {
        self.metrics.tftp("write_refused");
        tracing::info!(%client, path = %path.display(), "tftp: write request refused");
        Err(packet::Error::Msg("tinkerbox TFTP is read-only".into()))
    }
}

/// One file being sent. Reaching the end records `tftp.sent`; being dropped
/// before it (client gone, timeout) records `tftp.aborted`.
pub struct Transfer {
    data: Bytes,
    pos: usize,
    name: String,
    mac: Option<Mac>,
    client: SocketAddr,
    started: Instant,
    done: bool,
    handler: MemHandler,
}

impl Transfer {
    fn record(&self, kind: &'static str) {
        let h = &self.handler;
        let secs = self.started.elapsed().as_secs_f64();
        let verb = if kind == "tftp.sent" {
            "sent"
        } else {
            "aborted"
        };
        h.metrics.tftp(verb);
        if kind == "tftp.sent" {
            h.metrics.tftp_bytes.inc_by(self.data.len() as u64);
        }
        let snap = h.inventory.snapshot();
        let machine = self
            .mac
            .and_then(|m| snap.by_mac(&m))
            .or_else(|| snap.by_ip(&self.client.ip()))
            .map(|m| m.key.clone());
        let mut e = Event::new(
            kind,
            format!(
                "TFTP {} {verb} to {} ({} of {} bytes, {secs:.2}s)",
                self.name,
                self.client,
                self.pos,
                self.data.len()
            ),
        )
        .ip(self.client.ip())
        .fields(
            json!({"file": self.name, "bytes": self.pos, "size": self.data.len(), "seconds": secs}),
        );
        if let Some(m) = self.mac {
            e = e.mac(m);
        }
        if let Some(k) = machine {
            e = e.machine(k);
        }
        h.events.record(e);
    }
}

impl AsyncRead for Transfer {
    fn poll_read(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
        buf: &mut [u8],
    ) -> Poll<std::io::Result<usize>> {
        let rest = &self.data[self.pos..];
        let n = rest.len().min(buf.len());
        buf[..n].copy_from_slice(&rest[..n]);
        self.pos += n;
        if n == 0 && !self.done {
            self.done = true;
            self.record("tftp.sent");
        }
        Poll::Ready(Ok(n))
    }
}

impl Drop for Transfer {
    fn drop(&mut self) {
        if !self.done {
            self.record("tftp.aborted");
        }
    }
}

/// Serve on `sock` until the task is dropped. async-tftp's loop ends only
/// on a socket error; the server is then rebuilt on a fresh socket.
pub async fn serve(sock: std::net::UdpSocket, listen: SocketAddr, handler: MemHandler) {
    let mut sock = Some(sock);
    loop {
        let builder = TftpServerBuilder::with_handler(handler.clone())
            .timeout(Duration::from_secs(3))
            .max_send_retries(5);
        let builder = match sock.take() {
            Some(s) => builder.std_socket(s),
            None => Ok(builder.bind(listen)),
        };
        let server = match builder {
            Ok(b) => b.build().await,
            Err(e) => Err(e),
        };
        match server {
            Ok(s) => {
                if let Err(e) = s.serve().await {
                    tracing::error!(error = %e, "tftp: server stopped; restarting");
                }
            }
            Err(e) => tracing::error!(error = %e, %listen, "tftp: cannot bind; retrying"),
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
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
    }
}
