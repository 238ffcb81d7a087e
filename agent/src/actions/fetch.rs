//! Downloads as a byte stream for a blocking consumer: the HTTP body is
//! read on the runtime and handed, chunk by chunk through a bounded
//! channel, to a thread that decompresses and writes. Network and disk
//! overlap, memory stays at a few chunks, and nothing is held whole.

use super::ActionError;
use bytes::Bytes;
use futures_util::StreamExt;
use std::io::Read;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use tokio::sync::mpsc;

/// Chunks in flight between the download and the writer.
const CHANNEL_CHUNKS: usize = 64;
/// A stalled download fails after this long without a byte.
pub const READ_TIMEOUT: Duration = Duration::from_secs(60);
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(30);

/// The HTTP client of every action: timeouts on connect and on every read
/// (a download may take long, a silent server may not).
pub fn client() -> Result<reqwest::Client, ActionError> {
    client_with(false)
}

/// The same, accepting any certificate when `insecure` (oci2disk's
/// SKIP_VERIFY). The TLS config is ours: reqwest's own wants the system's
/// CA store, which a bare OSIE does not have, and plain HTTP must work
/// without one.
pub fn client_with(insecure: bool) -> Result<reqwest::Client, ActionError> {
    let (tls, _) = crate::transport::rustls_config(insecure)
        .map_err(|e| ActionError::Failed(format!("TLS setup: {e}")))?;
    reqwest::Client::builder()
        .tls_backend_preconfigured(tls)
        .connect_timeout(CONNECT_TIMEOUT)
        .read_timeout(READ_TIMEOUT)
        .user_agent(concat!("tinkerbox-agent/", env!("CARGO_PKG_VERSION")))
        .build()
        .map_err(|e| ActionError::Failed(format!("HTTP client: {}", chain(&e))))
}

/// GET `url`, failing on a status other than 2xx.
pub async fn get(url: &str) -> Result<reqwest::Response, ActionError> {
    let parsed = reqwest::Url::parse(url)
        .map_err(|e| ActionError::Env(format!("{url:?} is not a URL: {e}")))?;
    if !matches!(parsed.scheme(), "http" | "https") {
        return Err(ActionError::Env(format!(
            "{url:?}: only http and https URLs can be fetched"
        )));
    }
    let resp = client()?
        .get(parsed)
        .send()
        .await
        .map_err(|e| ActionError::Failed(format!("GET {url}: {}", chain(&e))))?;
    if !resp.status().is_success() {
        return Err(ActionError::Failed(format!("GET {url}: {}", resp.status())));
    }
    Ok(resp)
}

/// The error and its causes on one line (reqwest's Display alone says
/// only "error sending request").
pub fn chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}

enum Chunk {
    Data(Bytes),
    Failed(String),
    End,
}

/// Bytes read from the network so far, for progress.
#[derive(Default)]
pub struct Counter(AtomicU64);

impl Counter {
    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
    pub fn add(&self, n: u64) {
        self.0.fetch_add(n, Ordering::Relaxed);
    }
}

/// The blocking end: a `Read` over the chunks. A download cut short (an
/// error, or the sender gone without saying it is done) is an error here,
/// never a silent end of file.
pub struct BodyReader {
    rx: mpsc::Receiver<Chunk>,
    cur: Bytes,
    done: bool,
}

impl Read for BodyReader {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        while self.cur.is_empty() {
            if self.done {
                return Ok(0);
            }
            match self.rx.blocking_recv() {
                Some(Chunk::Data(b)) => self.cur = b,
                Some(Chunk::End) => self.done = true,
                Some(Chunk::Failed(e)) => return Err(std::io::Error::other(e)),
                None => return Err(std::io::Error::other("the download was cut short")),
            }
        }
        let n = buf.len().min(self.cur.len());
        buf[..n].copy_from_slice(&self.cur[..n]);
        let _ = self.cur.split_to(n);
        Ok(n)
    }
}

/// Splits `resp` into the pump (await it on the runtime) and the reader
/// (use it on a blocking thread). The pump checks the body's length
/// against Content-Length.
pub fn stream(
    resp: reqwest::Response,
    read: Arc<Counter>,
) -> (impl std::future::Future<Output = ()>, BodyReader) {
    stream_after(Bytes::new(), resp, read)
}

/// [`stream`] of a body whose first bytes, `head`, were already taken
/// off it (by [`peek`]).
pub fn stream_after(
    head: Bytes,
    resp: reqwest::Response,
    read: Arc<Counter>,
) -> (impl std::future::Future<Output = ()>, BodyReader) {
    let (tx, rx) = mpsc::channel(CHANNEL_CHUNKS);
    // What is left of the body: hyper counts Content-Length down as the
    // body is read.
    let expect = resp.content_length().map(|n| n + head.len() as u64);
    read.add(head.len() as u64);
    let mut got = head.len() as u64;
    let pump = async move {
        let mut body = resp.bytes_stream();
        while let Some(c) = body.next().await {
            match c {
                Ok(b) => {
                    got += b.len() as u64;
                    read.add(b.len() as u64);
                    if tx.send(Chunk::Data(b)).await.is_err() {
                        return; // the writer stopped; it says why
                    }
                }
                Err(e) => {
                    let _ = tx
                        .send(Chunk::Failed(format!("download failed: {}", chain(&e))))
                        .await;
                    return;
                }
            }
        }
        let last = match expect {
            Some(n) if n != got => {
                Chunk::Failed(format!("download ended after {got} of {n} bytes"))
            }
            _ => Chunk::End,
        };
        let _ = tx.send(last).await;
    };
    (
        pump,
        BodyReader {
            rx,
            cur: head,
            done: false,
        },
    )
}

/// Chunks [`peek`] waits for at most: a server that trickles a byte at a
/// time gets a shorter look, not a longer wait.
const PEEK_CHUNKS: usize = 64;

/// The first (up to) `n` bytes of `resp`'s body, taken off it, to tell
/// the image's format before choosing how to write it; give them back
/// with [`stream_after`].
pub async fn peek(
    mut resp: reqwest::Response,
    n: usize,
) -> Result<(Bytes, reqwest::Response), ActionError> {
    let mut head = bytes::BytesMut::new();
    for _ in 0..PEEK_CHUNKS {
        if head.len() >= n {
            break;
        }
        match resp.chunk().await {
            Ok(Some(c)) => head.extend_from_slice(&c),
            Ok(None) => break,
            Err(e) => {
                return Err(ActionError::Failed(format!(
                    "download failed: {}",
                    chain(&e)
                )));
            }
        }
    }
    Ok((head.freeze(), resp))
}

pub fn mib(n: u64) -> String {
    format!("{:.1} MiB", n as f64 / 1048576.0)
}

/// A checksum's algorithm, as the actions' variables name them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Alg {
    Md5,
    Sha256,
    Sha512,
}

impl Alg {
    pub fn as_str(self) -> &'static str {
        match self {
            Alg::Md5 => "md5",
            Alg::Sha256 => "sha256",
            Alg::Sha512 => "sha512",
        }
    }
    /// How many hex digits its digest has.
    pub fn hex_len(self) -> usize {
        match self {
            Alg::Md5 => 32,
            Alg::Sha256 => 64,
            Alg::Sha512 => 128,
        }
    }
    /// The algorithm whose digest has `n` hex digits.
    pub fn by_hex_len(n: usize) -> Option<Alg> {
        [Alg::Md5, Alg::Sha256, Alg::Sha512]
            .into_iter()
            .find(|a| a.hex_len() == n)
    }
}

enum Digest {
    // md-5 0.11 is on digest 0.11, sha2 0.10 on digest 0.10: each is
    // driven through its own crate's trait.
    Md5(md5::Md5),
    Sha256(sha2::Sha256),
    Sha512(sha2::Sha512),
}

/// The bytes read through it, hashed as they go by: the checksum an
/// action checks costs no second pass.
pub struct Hashing<R> {
    inner: R,
    hash: Option<Digest>,
}

impl<R> Hashing<R> {
    pub fn new(inner: R, alg: Option<Alg>) -> Self {
        use sha2::Digest as _;
        let hash = alg.map(|a| match a {
            Alg::Md5 => Digest::Md5(<md5::Md5 as md5::Digest>::new()),
            Alg::Sha256 => Digest::Sha256(sha2::Sha256::new()),
            Alg::Sha512 => Digest::Sha512(sha2::Sha512::new()),
        });
        Hashing { inner, hash }
    }

    /// The hex digest of everything read, when hashing.
    pub fn finish(self) -> Option<String> {
        use sha2::Digest as _;
        self.hash.map(|h| match h {
            Digest::Md5(h) => hex::encode(md5::Digest::finalize(h)),
            Digest::Sha256(h) => hex::encode(h.finalize()),
            Digest::Sha512(h) => hex::encode(h.finalize()),
        })
    }
}

impl<R: Read> Read for Hashing<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        use sha2::Digest as _;
        let n = self.inner.read(buf)?;
        match &mut self.hash {
            None => {}
            Some(Digest::Md5(h)) => md5::Digest::update(h, &buf[..n]),
            Some(Digest::Sha256(h)) => h.update(&buf[..n]),
            Some(Digest::Sha512(h)) => h.update(&buf[..n]),
        }
        Ok(n)
    }
}
