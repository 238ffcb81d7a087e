//! A sendfile(2) fast path for plain artifact downloads, in front of hyper.
//!
//! Why hand-written: hyper (and so axum and tower-http's `ServeDir`) only
//! writes bodies from user-space buffers, one read and one write per chunk;
//! it has no way to hand a file descriptor to the kernel, and no crate offers
//! a sendfile path for hyper. Kernels and initrds are the bulk of what a
//! provisioning server sends, so the plain whole-file `GET`/`HEAD` of
//! `/artifacts/<path>` is answered here, and everything else still goes to
//! hyper and `ServeDir`, unchanged.
//!
//! How: [`listen`] wraps the public TCP listener. Every accepted connection
//! gets a task that *peeks* at the next request head (nothing consumed) and
//! parses it with [`decide`]. A plain artifact download is answered here:
//! exactly the head's bytes are read, the response head written, and the
//! body sent with sendfile; then the next request on the same keep-alive
//! connection is looked at. At the first request this path does not serve,
//! the untouched `TcpStream` (its unread bytes still in the kernel's buffer)
//! goes to axum through a channel that [`FastListener::accept`] reads. No
//! byte is lost or buffered twice, and hyper sees an ordinary connection.
//!
//! Served here, and only this: HTTP/1.0 or 1.1; `GET` or `HEAD`; a path
//! under `/artifacts/` that decodes (percent-encoding, UTF-8) to plain
//! segments (no empty, `.`, `..`, NUL or backslash) naming a regular file;
//! no `Range`, no `If-*`, no request body, no `Expect` or `Upgrade`; and no
//! `<file>.gz` sibling when the client sent `Accept-Encoding` (`ServeDir`
//! serves precompressed files). The answer carries the headers `ServeDir`
//! would send, and leaves the same counters and `http.artifact` event.

use super::{count, record_artifact};
use crate::app::App;
use axum::http::StatusCode;
use axum::serve::ListenerExt;
use nix::sys::sendfile::sendfile64;
use percent_encoding::percent_decode_str;
use std::io;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};
use tokio::io::{AsyncReadExt, AsyncWriteExt, Interest};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};

/// A request head that does not fit goes to hyper (which answers it as
/// it always did).
pub const MAX_HEAD: usize = 8 * 1024;
/// Most headers a fast-path request may have; more go to hyper.
const MAX_HEADERS: usize = 64;
/// A connection with no complete request head for this long is closed:
/// idle keep-alive connections, and heads that trickle in.
const HEAD_TIMEOUT: Duration = Duration::from_secs(30);
/// A client that accepts no byte of the response for this long is dropped.
const PROGRESS_TIMEOUT: Duration = Duration::from_secs(60);
/// Longest pause between two looks at a head that came in part: `peek`
/// returns at once while any byte is waiting, so a partial head is polled.
const MAX_PAUSE: Duration = Duration::from_millis(50);
/// Most bytes asked of one sendfile call (it sends what the socket takes).
const SENDFILE_MAX: usize = 1 << 30;
/// Connections waiting for axum to take them.
const HANDOFF_QUEUE: usize = 64;

/// What to do with the request head at the start of a buffer.
#[derive(Debug, PartialEq, Eq)]
pub enum Decision {
    /// The head is not all there yet.
    Incomplete,
    /// Not for this path: hyper answers it, and the rest of the connection.
    Handoff(&'static str),
    /// A plain artifact download, if the file is there (see [`Plain`]).
    Serve(Plain),
}

/// A plain `GET`/`HEAD` of an artifact.
#[derive(Debug, PartialEq, Eq)]
pub struct Plain {
    /// Bytes of the request head, blank line included.
    pub head_len: usize,
    /// The path as sent, without the query (the event's `path`).
    pub uri_path: String,
    /// Decoded, checked, relative to `artifacts_dir`.
    pub file: PathBuf,
    pub head_only: bool,
    pub keep_alive: bool,
    /// HTTP/1.0: a kept-alive connection is said so in the answer.
    pub http10: bool,
    /// The client sent `Accept-Encoding`: a `.gz` sibling is ServeDir's.
    pub accepts_encoding: bool,
}

/// Looks at the request head at the start of `buf` (a peek at the socket).
pub fn decide(buf: &[u8]) -> Decision {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut req = httparse::Request::new(&mut headers);
    let head_len = match req.parse(buf) {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) if buf.len() >= MAX_HEAD => {
            return Decision::Handoff("head too large");
        }
        Ok(httparse::Status::Partial) => return Decision::Incomplete,
        Err(httparse::Error::TooManyHeaders) => return Decision::Handoff("too many headers"),
        Err(_) => return Decision::Handoff("not a valid request head"),
    };
    if head_len > MAX_HEAD {
        return Decision::Handoff("head too large");
    }
    let head_only = match req.method {
        Some("GET") => false,
        Some("HEAD") => true,
        _ => return Decision::Handoff("method"),
    };
    let http10 = match req.version {
        Some(0) => true,
        Some(1) => false,
        _ => return Decision::Handoff("version"),
    };
    let Some(target) = req.path else {
        return Decision::Handoff("no target");
    };
    let Some((uri_path, file)) = artifact_path(target) else {
        return Decision::Handoff("not a plain artifact path");
    };
    let (mut close, mut keep) = (false, false);
    let mut accepts_encoding = false;
    for h in req.headers.iter() {
        let name = h.name;
        if name.eq_ignore_ascii_case("connection") {
            for token in h.value.split(|&b| b == b',').map(<[u8]>::trim_ascii) {
                if token.eq_ignore_ascii_case(b"close") {
                    close = true;
                } else if token.eq_ignore_ascii_case(b"keep-alive") {
                    keep = true;
                } else if token.eq_ignore_ascii_case(b"upgrade") {
                    return Decision::Handoff("upgrade");
                }
            }
        } else if name.eq_ignore_ascii_case("content-length") {
            if h.value.trim_ascii() != b"0" {
                return Decision::Handoff("request body");
            }
        } else if name.eq_ignore_ascii_case("transfer-encoding") {
            return Decision::Handoff("request body");
        } else if name.eq_ignore_ascii_case("range") {
            return Decision::Handoff("range");
        } else if name.len() > 3 && name[..3].eq_ignore_ascii_case("if-") {
            return Decision::Handoff("conditional");
        } else if name.eq_ignore_ascii_case("expect") || name.eq_ignore_ascii_case("upgrade") {
            return Decision::Handoff("expect or upgrade");
        } else if name.eq_ignore_ascii_case("accept-encoding") {
            accepts_encoding = true;
        }
    }
    // As hyper: HTTP/1.1 keeps the connection unless told to close,
    // HTTP/1.0 closes it unless told to keep it; "close" wins.
    let keep_alive = !close && (keep || !http10);
    Decision::Serve(Plain {
        head_len,
        uri_path: uri_path.to_string(),
        file,
        head_only,
        keep_alive,
        http10,
        accepts_encoding,
    })
}

/// `/artifacts/<path>[?query]` to (the path as sent, the decoded relative
/// file), by ServeDir's rules (percent-decoded as a whole, then UTF-8, no
/// component other than a plain name) and stricter: only URI characters,
/// and an empty, `.` or `..` segment, a NUL or a backslash goes to
/// ServeDir to be answered as it always was.
fn artifact_path(target: &str) -> Option<(&str, PathBuf)> {
    let pchar = |c: u8| c.is_ascii_alphanumeric() || b"-._~!$&'()*+,;=:@/%?".contains(&c);
    if !target.bytes().all(pchar) {
        return None;
    }
    let uri_path = target.split('?').next()?;
    let rest = uri_path.strip_prefix("/artifacts/")?;
    let decoded = percent_decode_str(rest).decode_utf8().ok()?;
    let mut file = PathBuf::new();
    for seg in decoded.split('/') {
        if seg.is_empty() || seg == "." || seg == ".." || seg.contains(['\0', '\\']) {
            return None;
        }
        file.push(seg);
    }
    Some((uri_path, file))
}

/// An HTTP date, or `None` where httpdate would panic (before 1970, after
/// 9999): such a file is left to ServeDir.
fn http_date(t: SystemTime) -> Option<String> {
    let secs = t.duration_since(SystemTime::UNIX_EPOCH).ok()?.as_secs();
    (secs < 253_402_300_800).then(|| httpdate::fmt_http_date(t))
}

/// The response head, with the headers ServeDir sends and those hyper adds
/// (`date`, `connection`), names in lower case as hyper writes them.
fn response_head(
    len: u64,
    mime: &str,
    last_modified: Option<&str>,
    date: &str,
    keep_alive: bool,
    http10: bool,
) -> String {
    // hyper answers in the request's version.
    let version = if http10 { "1.0" } else { "1.1" };
    let mut h =
        format!("HTTP/{version} 200 OK\r\ncontent-type: {mime}\r\naccept-ranges: bytes\r\n");
    if let Some(lm) = last_modified {
        h.push_str(&format!("last-modified: {lm}\r\n"));
    }
    h.push_str(&format!("content-length: {len}\r\n"));
    if !keep_alive {
        h.push_str("connection: close\r\n");
    } else if http10 {
        h.push_str("connection: keep-alive\r\n");
    }
    h.push_str(&format!("date: {date}\r\n\r\n"));
    h
}

type Handoff = (TcpStream, SocketAddr);

/// The listener axum serves: the connections (or the rest of them) that
/// the fast path hands over.
pub struct FastListener {
    rx: mpsc::Receiver<Handoff>,
    local: SocketAddr,
    accept: tokio::task::AbortHandle,
}

impl Drop for FastListener {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

impl axum::serve::Listener for FastListener {
    type Io = TcpStream;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (TcpStream, SocketAddr) {
        match self.rx.recv().await {
            Some(c) => c,
            // The accept task has stopped: so has the server.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> io::Result<SocketAddr> {
        Ok(self.local)
    }
}

/// What [`listen`] returns to axum: `ConnectInfo<SocketAddr>` is
/// implemented for `TcpListener` and for `TapIo<L, _>` (as `L::Addr`), not
/// for any listener, so the (no-op) `tap_io` keeps handlers' `ConnectInfo`.
pub type Listener = axum::serve::TapIo<FastListener, fn(&mut TcpStream)>;

/// Waits for the fast path's connections to end (see [`listen`]).
pub struct Drain(mpsc::Receiver<()>);

impl Drain {
    pub async fn wait(mut self) {
        while self.0.recv().await.is_some() {}
    }
}

/// Takes over `sock`: serves plain artifact downloads, hands every other
/// connection to the returned listener. Once `stop` is true, no connection
/// is accepted, idle ones close, and one in a response closes after it;
/// [`Drain::wait`] returns when they all have.
pub fn listen(sock: TcpListener, app: Arc<App>, stop: watch::Receiver<bool>) -> (Listener, Drain) {
    let local = sock
        .local_addr()
        .unwrap_or_else(|_| ([0, 0, 0, 0], 0).into());
    let (tx, rx) = mpsc::channel(HANDOFF_QUEUE);
    let (live, drained) = mpsc::channel(1);
    let shared = Arc::new(Shared {
        dir: app.config.artifacts_dir(),
        app,
        handoff: tx,
    });
    let accept = tokio::spawn(accept_loop(sock, shared, stop, live)).abort_handle();
    let fast = FastListener { rx, local, accept };
    let noop: fn(&mut TcpStream) = |_| {};
    (fast.tap_io(noop), Drain(drained))
}

struct Shared {
    app: Arc<App>,
    dir: PathBuf,
    handoff: mpsc::Sender<Handoff>,
}

/// Every connection task holds a clone of `live`, so [`Drain`] knows.
async fn accept_loop(
    sock: TcpListener,
    shared: Arc<Shared>,
    mut stop: watch::Receiver<bool>,
    live: mpsc::Sender<()>,
) {
    loop {
        let accepted = tokio::select! {
            _ = stop.wait_for(|s| *s) => return,
            a = sock.accept() => a,
        };
        match accepted {
            Ok((stream, peer)) => {
                tokio::spawn(connection(
                    stream,
                    peer,
                    shared.clone(),
                    stop.clone(),
                    live.clone(),
                ));
            }
            // As axum's own TcpListener does.
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::ConnectionRefused
                        | io::ErrorKind::ConnectionAborted
                        | io::ErrorKind::ConnectionReset
                ) => {}
            Err(e) => {
                tracing::error!(error = %e, "http: accept failed");
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        }
    }
}

async fn connection(
    mut stream: TcpStream,
    peer: SocketAddr,
    shared: Arc<Shared>,
    mut stop: watch::Receiver<bool>,
    _live: mpsc::Sender<()>,
) {
    let mut buf = vec![0u8; MAX_HEAD];
    loop {
        let next = tokio::select! {
            _ = stop.wait_for(|s| *s) => return,
            n = tokio::time::timeout(HEAD_TIMEOUT, next_head(&stream, &mut buf)) => n,
        };
        let plain = match next {
            Ok(Ok(Some(Decision::Serve(p)))) => p,
            Ok(Ok(Some(Decision::Handoff(why)))) => {
                tracing::trace!(%peer, why, "http: to hyper");
                let _ = shared.handoff.send((stream, peer)).await;
                return;
            }
            // Closed, failed, or no whole head in time.
            _ => return,
        };
        let Some(ready) = open(&shared.dir, &plain).await else {
            tracing::trace!(%peer, "http: artifact to ServeDir");
            let _ = shared.handoff.send((stream, peer)).await;
            return;
        };
        // The head is already in the kernel's buffer: this does not wait.
        if stream.read_exact(&mut buf[..plain.head_len]).await.is_err() {
            return;
        }
        count(&shared.app.metrics, "public", StatusCode::OK);
        record_artifact(
            &shared.app,
            Some(peer),
            &plain.uri_path,
            false,
            StatusCode::OK,
        );
        // Before the first byte, like the counters: whoever got the answer
        // finds it logged.
        tracing::debug!(
            %peer,
            path = %plain.uri_path,
            bytes = if plain.head_only { 0 } else { ready.len },
            "http: artifact answered with sendfile"
        );
        if let Err(e) = respond(&mut stream, &ready, plain.head_only).await {
            tracing::debug!(%peer, path = %plain.uri_path, error = %e, "http: artifact not completed");
            return;
        }
        if !plain.keep_alive || *stop.borrow() {
            let _ = stream.shutdown().await;
            return;
        }
    }
}

/// Peeks until a whole head is there (or the peer closed: `None`).
async fn next_head(stream: &TcpStream, buf: &mut [u8]) -> io::Result<Option<Decision>> {
    let mut pause = Duration::from_millis(1);
    loop {
        let n = stream.peek(buf).await?;
        if n == 0 {
            return Ok(None);
        }
        match decide(&buf[..n]) {
            Decision::Incomplete => {
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(MAX_PAUSE);
            }
            d => return Ok(Some(d)),
        }
    }
}

/// An artifact this path may serve, opened, and its response head.
struct Ready {
    file: std::fs::File,
    len: u64,
    head: String,
}

/// Opens the file when this path may serve it (`None`: ServeDir's).
async fn open(dir: &Path, plain: &Plain) -> Option<Ready> {
    let path = dir.join(&plain.file);
    if plain.accepts_encoding {
        let mut gz = path.clone().into_os_string();
        gz.push(".gz");
        match tokio::fs::metadata(&gz).await {
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            _ => return None,
        }
    }
    let file = tokio::fs::File::open(&path).await.ok()?;
    let meta = file.metadata().await.ok()?;
    if !meta.is_file() {
        return None;
    }
    let last_modified = match meta.modified() {
        Ok(t) => Some(http_date(t)?),
        Err(_) => None,
    };
    let mime = mime_guess::from_path(&path)
        .first_raw()
        .unwrap_or("application/octet-stream");
    let head = response_head(
        meta.len(),
        mime,
        last_modified.as_deref(),
        &httpdate::fmt_http_date(SystemTime::now()),
        plain.keep_alive,
        plain.http10,
    );
    Some(Ready {
        file: file.into_std().await,
        len: meta.len(),
        head,
    })
}

/// Writes the head, then (for a GET) the whole file with sendfile. Corked,
/// so the head and the first bytes share a segment, and the last segment
/// goes at once when uncorked.
async fn respond(stream: &mut TcpStream, r: &Ready, head_only: bool) -> io::Result<()> {
    let body = !head_only && r.len > 0;
    if body {
        socket2::SockRef::from(&*stream).set_tcp_cork(true)?;
    }
    tokio::time::timeout(PROGRESS_TIMEOUT, stream.write_all(r.head.as_bytes()))
        .await
        .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "no progress"))??;
    if body {
        send_body(stream, &r.file, r.len).await?;
        socket2::SockRef::from(&*stream).set_tcp_cork(false)?;
    }
    Ok(())
}

/// The first `len` bytes of `file`, with sendfile, as fast as the socket
/// takes them; an error when no byte goes for [`PROGRESS_TIMEOUT`] or the
/// file got shorter (the client was promised `len` bytes: close).
async fn send_body(stream: &TcpStream, file: &std::fs::File, len: u64) -> io::Result<()> {
    let len = i64::try_from(len).map_err(|_| io::Error::other("file too large"))?;
    let mut offset: i64 = 0;
    while offset < len {
        tokio::time::timeout(PROGRESS_TIMEOUT, stream.writable())
            .await
            .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "no progress"))??;
        let want = usize::try_from(len - offset).map_or(SENDFILE_MAX, |n| n.min(SENDFILE_MAX));
        let sent = stream.try_io(Interest::WRITABLE, || {
            sendfile64(stream, file, Some(&mut offset), want).map_err(io::Error::from)
        });
        match sent {
            Ok(0) => return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "file shrank")),
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn serve(req: &str) -> Plain {
        match decide(req.as_bytes()) {
            Decision::Serve(p) => p,
            d => panic!("{req:?}: {d:?}"),
        }
    }

    fn handoff(req: &str) -> &'static str {
        match decide(req.as_bytes()) {
            Decision::Handoff(why) => why,
            d => panic!("{req:?}: {d:?}"),
        }
    }

    #[test]
    fn plain_get_and_head() {
        let req =
            "GET /artifacts/vmlinuz-x86_64 HTTP/1.1\r\nHost: x\r\nUser-Agent: iPXE/1.21\r\n\r\n";
        let p = serve(req);
        assert_eq!(
            p,
            Plain {
                head_len: req.len(),
                uri_path: "/artifacts/vmlinuz-x86_64".into(),
                file: "vmlinuz-x86_64".into(),
                head_only: false,
                keep_alive: true,
                http10: false,
                accepts_encoding: false,
            }
        );
        let p = serve("HEAD /artifacts/a/b.img HTTP/1.1\r\n\r\n");
        assert!(p.head_only);
        assert_eq!(p.file, Path::new("a/b.img"));
    }

    #[test]
    fn head_len_leaves_the_next_request_alone() {
        let first = "GET /artifacts/x HTTP/1.1\r\nHost: h\r\n\r\n";
        let both = format!("{first}GET /healthz HTTP/1.1\r\n\r\n");
        assert_eq!(serve(&both).head_len, first.len());
        // A body-less GET with Content-Length: 0 is still plain.
        assert!(!serve("GET /artifacts/x HTTP/1.1\r\nContent-Length: 0\r\n\r\n").head_only);
    }

    #[test]
    fn keep_alive_by_version_and_connection() {
        assert!(serve("GET /artifacts/x HTTP/1.1\r\n\r\n").keep_alive);
        assert!(!serve("GET /artifacts/x HTTP/1.1\r\nConnection: close\r\n\r\n").keep_alive);
        assert!(
            !serve("GET /artifacts/x HTTP/1.1\r\nconnection: Keep-Alive, CLOSE\r\n\r\n").keep_alive
        );
        let p = serve("GET /artifacts/x HTTP/1.0\r\n\r\n");
        assert!(p.http10 && !p.keep_alive);
        let p = serve("GET /artifacts/x HTTP/1.0\r\nConnection: keep-alive\r\n\r\n");
        assert!(p.http10 && p.keep_alive);
    }

    #[test]
    fn percent_encoding_is_decoded() {
        let p = serve("GET /artifacts/my%20file%2Bv1.img?cache=no HTTP/1.1\r\n\r\n");
        assert_eq!(p.file, Path::new("my file+v1.img"));
        assert_eq!(p.uri_path, "/artifacts/my%20file%2Bv1.img");
        // An encoded slash splits like ServeDir's whole-path decoding.
        assert_eq!(
            serve("GET /artifacts/a%2Fb HTTP/1.1\r\n\r\n").file,
            Path::new("a/b")
        );
        assert_eq!(
            serve("GET /artifacts/%C3%A9t%C3%A9 HTTP/1.1\r\n\r\n").file,
            Path::new("été")
        );
    }

    #[test]
    fn escapes_and_odd_paths_go_to_servedir() {
        for target in [
            "/artifacts/../tinkerbox.toml",
            "/artifacts/%2e%2e/tinkerbox.toml",
            "/artifacts/%2E%2E%2Ftinkerbox.toml",
            "/artifacts/a/../../x",
            "/artifacts/a/%2e%2e/%2e%2e/x",
            "/artifacts/./x",
            "/artifacts/a//x",
            "/artifacts/",
            "/artifacts/a/",
            "/artifacts/x%00.img",
            "/artifacts/..%5c..%5cx",
            "/artifacts/a%5Cb",
            "/artifacts/%ff%fe",
            "/artifacts",
            "/artifactsx/y",
            "/%61rtifacts/x",
            "/ipxe/script/52:54:00:00:00:01/auto.ipxe",
            "/healthz",
            "http://host/artifacts/x",
            "/artifacts/x#frag",
            "/artifacts/x\"y",
        ] {
            assert_eq!(
                handoff(&format!("GET {target} HTTP/1.1\r\n\r\n")),
                "not a plain artifact path",
                "{target}"
            );
        }
    }

    #[test]
    fn ranges_conditionals_and_bodies_go_to_servedir() {
        for (h, why) in [
            ("Range: bytes=0-9", "range"),
            (
                "If-Modified-Since: Sat, 22 Nov 2025 00:00:00 GMT",
                "conditional",
            ),
            ("if-none-match: \"x\"", "conditional"),
            ("If-Range: \"x\"", "conditional"),
            (
                "If-Unmodified-Since: Sat, 22 Nov 2025 00:00:00 GMT",
                "conditional",
            ),
            ("Content-Length: 5", "request body"),
            ("Transfer-Encoding: chunked", "request body"),
            ("Expect: 100-continue", "expect or upgrade"),
            ("Upgrade: websocket", "expect or upgrade"),
            ("Connection: Upgrade", "upgrade"),
        ] {
            assert_eq!(
                handoff(&format!("GET /artifacts/x HTTP/1.1\r\n{h}\r\n\r\n")),
                why,
                "{h}"
            );
        }
        // The .gz sibling is looked for only when the client takes gzip.
        assert!(
            serve("GET /artifacts/x HTTP/1.1\r\nAccept-Encoding: gzip\r\n\r\n").accepts_encoding
        );
    }

    #[test]
    fn other_methods_and_versions_go_to_hyper() {
        for m in ["POST", "PUT", "DELETE", "OPTIONS", "get", "CONNECT"] {
            assert_eq!(
                handoff(&format!("{m} /artifacts/x HTTP/1.1\r\n\r\n")),
                "method"
            );
        }
        assert_eq!(
            handoff("GET /artifacts/x HTTP/2.0\r\n\r\n"),
            "not a valid request head"
        );
        assert_eq!(
            handoff("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"),
            "not a valid request head"
        );
    }

    #[test]
    fn partial_oversized_and_garbage_heads() {
        assert_eq!(decide(b"GET /artifacts/x HT"), Decision::Incomplete);
        assert_eq!(
            decide(b"GET /artifacts/x HTTP/1.1\r\nHost: a\r\n"),
            Decision::Incomplete
        );
        let mut big = b"GET /artifacts/x HTTP/1.1\r\nX-Pad: ".to_vec();
        big.resize(MAX_HEAD, b'a');
        assert_eq!(decide(&big), Decision::Handoff("head too large"));
        let many: String = (0..MAX_HEADERS + 1)
            .map(|i| format!("X-{i}: y\r\n"))
            .collect();
        assert_eq!(
            handoff(&format!("GET /artifacts/x HTTP/1.1\r\n{many}\r\n")),
            "too many headers"
        );
        for junk in [
            &b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03"[..],
            b"GET /artifacts/x\r\n\r\n",
            b"GET  HTTP/1.1\r\n\r\n",
            b"GET /artifacts/x HTTP/1.1\r\nBad Header\r\n\r\n",
            b"\x00\x00\x00\x00",
        ] {
            assert!(
                matches!(decide(junk), Decision::Handoff(_)),
                "{junk:?}: {:?}",
                decide(junk)
            );
        }
    }

    #[test]
    fn response_head_matches_servedir_headers() {
        let date = "Sat, 22 Nov 2025 06:00:00 GMT";
        let h = response_head(
            3145728,
            "application/octet-stream",
            Some(date),
            date,
            true,
            false,
        );
        assert_eq!(
            h,
            "HTTP/1.1 200 OK\r\ncontent-type: application/octet-stream\r\naccept-ranges: bytes\r\n\
             last-modified: Sat, 22 Nov 2025 06:00:00 GMT\r\ncontent-length: 3145728\r\n\
             date: Sat, 22 Nov 2025 06:00:00 GMT\r\n\r\n"
        );
        let h = response_head(1, "t", None, date, false, true);
        assert!(h.starts_with("HTTP/1.0 200 OK\r\n"), "{h}");
        assert!(h.contains("\r\nconnection: close\r\n"), "{h}");
        let h = response_head(1, "t", None, date, true, true);
        assert!(h.starts_with("HTTP/1.0 200 OK\r\n"), "{h}");
        assert!(h.contains("\r\nconnection: keep-alive\r\n"), "{h}");
        assert!(!response_head(1, "t", None, date, true, false).contains("connection"));
        assert!(!response_head(1, "t", None, date, true, false).contains("last-modified"));
    }

    #[test]
    fn dates_httpdate_cannot_format_are_refused() {
        let epoch = SystemTime::UNIX_EPOCH;
        assert_eq!(
            http_date(epoch).as_deref(),
            Some("Thu, 01 Jan 1970 00:00:00 GMT")
        );
        assert_eq!(http_date(epoch - Duration::from_secs(1)), None);
        assert_eq!(
            http_date(epoch + Duration::from_secs(253_402_300_800)),
            None
        );
    }
}
