//! What the agent's tests share: a small HTTP server of files in memory,
//! the peer the download actions are tested against (with the switches
//! real servers differ by: Range answered or not, a length sent or not).

use std::collections::HashMap;
use std::sync::Arc;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// One file: its body, and whether the length is sent (without it the
/// body ends with the connection).
pub struct File {
    pub body: Vec<u8>,
    pub length: bool,
}

impl File {
    pub fn sized(body: Vec<u8>) -> File {
        File { body, length: true }
    }
}

/// Connections the server takes before it stops (every loop is bounded).
const MAX_CONNECTIONS: usize = 256;

/// Serve `files` (by path; a query is ignored) on a loopback port, one
/// request per connection; `Range: bytes=a-b` is answered 206 when
/// `ranges`, else ignored (200 and the whole body). Returns
/// `http://127.0.0.1:PORT`.
pub async fn serve(files: HashMap<String, File>, ranges: bool) -> String {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", l.local_addr().unwrap());
    let files = Arc::new(files);
    tokio::spawn(async move {
        for _ in 0..MAX_CONNECTIONS {
            let Ok((mut c, _)) = l.accept().await else {
                return;
            };
            let files = files.clone();
            tokio::spawn(async move {
                let mut req = Vec::new();
                let mut buf = [0u8; 1024];
                while !req.windows(4).any(|w| w == b"\r\n\r\n") && req.len() < 16384 {
                    match c.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => req.extend_from_slice(&buf[..n]),
                    }
                }
                let req = String::from_utf8_lossy(&req).to_string();
                let target = req.split_whitespace().nth(1).unwrap_or("");
                let path = target.split('?').next().unwrap_or("");
                let range = req.lines().find_map(|l| {
                    let (k, v) = l.split_once(':')?;
                    let (a, b) = k
                        .eq_ignore_ascii_case("range")
                        .then_some(v.trim().strip_prefix("bytes=")?.split_once('-')?)?;
                    Some((a.parse::<usize>().ok()?, b.parse::<usize>().ok()?))
                });
                let (status, body, length) = match files.get(path) {
                    None => ("404 Not Found".to_string(), &[][..], true),
                    Some(f) => match range.filter(|_| ranges) {
                        Some((a, b)) if a < f.body.len() => {
                            let b = b.min(f.body.len() - 1);
                            (
                                format!(
                                    "206 Partial Content\r\nContent-Range: bytes {a}-{b}/{}",
                                    f.body.len()
                                ),
                                &f.body[a..=b],
                                true,
                            )
                        }
                        Some(_) => ("416 Range Not Satisfiable".into(), &[][..], true),
                        None => ("200 OK".into(), &f.body[..], f.length),
                    },
                };
                let mut head = format!("HTTP/1.1 {status}\r\nConnection: close\r\n");
                if length {
                    head.push_str(&format!("Content-Length: {}\r\n", body.len()));
                }
                head.push_str("\r\n");
                let _ = c.write_all(head.as_bytes()).await;
                let _ = c.write_all(body).await;
                let _ = c.shutdown().await;
            });
        }
    });
    base
}
