//! inspect (tinkerbox's own image): the machine's hardware, in the shape
//! of Metal3's `HardwareDetails` ([`crate::hardware`]), POSTed as JSON to
//! `CALLBACK_URL`, so that tinkerbox can fill a BareMetalHost's
//! `status.hardware` from an inspection Workflow. `BOOT_MAC` (optional)
//! marks the NIC the machine booted from as `pxe`.

use super::fetch::{self, chain};
use super::{ActionError, Env, Progress, Runner};
use crate::backoff::Backoff;
use crate::hardware::{self, Live};
use std::time::Duration;

/// How the report is sent: a server restarting or a lost packet is
/// retried; a server that says no is not asked again.
#[derive(Debug, Clone, Copy)]
pub struct Tries {
    pub count: u32,
    /// For one try, from connecting to the end of the answer.
    pub timeout: Duration,
    /// The wait after the first failure; it doubles.
    pub first_wait: Duration,
}

pub const TRIES: Tries = Tries {
    count: 3,
    timeout: Duration::from_secs(10),
    first_wait: Duration::from_secs(1),
};

/// Bytes of an error answer's body quoted in the action's message.
const QUOTED: usize = 200;

/// `CALLBACK_URL`, which must be http or https.
pub fn callback_url(env: &Env<'_>) -> Result<reqwest::Url, ActionError> {
    let v = env.required("CALLBACK_URL")?;
    let url = reqwest::Url::parse(v)
        .map_err(|e| ActionError::Env(format!("CALLBACK_URL={v:?} is not a URL: {e}")))?;
    if !matches!(url.scheme(), "http" | "https") || url.host_str().is_none() {
        return Err(ActionError::Env(format!(
            "CALLBACK_URL={v:?} must be an http or https URL"
        )));
    }
    Ok(url)
}

/// The URL as messages show it: a token in its query or user part stays
/// out of logs and the Workflow's status.
pub fn shown(url: &reqwest::Url) -> String {
    let mut u = url.clone();
    let _ = u.set_password(None);
    let _ = u.set_username("");
    u.set_fragment(None);
    let had_query = u.query().is_some();
    u.set_query(None);
    if had_query {
        format!("{u}?…")
    } else {
        u.to_string()
    }
}

enum TryError {
    /// Worth another try (no answer, a timeout, 5xx, 408, 429).
    Again(String),
    Final(String),
}

/// The first [`QUOTED`] bytes of the body, for the message.
async fn quote(mut resp: reqwest::Response) -> String {
    let mut buf = Vec::new();
    // Bounded: a body trickled in tiny chunks is cut short, not awaited.
    for _ in 0..64 {
        match resp.chunk().await {
            Ok(Some(c)) => {
                let room = QUOTED - buf.len();
                buf.extend_from_slice(&c[..c.len().min(room)]);
                if buf.len() >= QUOTED {
                    break;
                }
            }
            _ => break,
        }
    }
    String::from_utf8_lossy(&buf).trim().to_string()
}

async fn try_post(
    client: &reqwest::Client,
    url: &reqwest::Url,
    body: bytes::Bytes,
    timeout: Duration,
) -> Result<(), TryError> {
    let resp = client
        .post(url.clone())
        .header(reqwest::header::CONTENT_TYPE, "application/json")
        .timeout(timeout)
        .body(body)
        .send()
        .await
        .map_err(|e| TryError::Again(chain(&e)))?;
    let status = resp.status();
    if status.is_success() {
        return Ok(());
    }
    let body = quote(resp).await;
    let said = if body.is_empty() {
        status.to_string()
    } else {
        format!("{status}: {body}")
    };
    if status.is_server_error() || status.as_u16() == 408 || status.as_u16() == 429 {
        Err(TryError::Again(said))
    } else {
        Err(TryError::Final(said))
    }
}

/// POSTs `body` (JSON) to `url`, up to `tries.count` times.
pub async fn post(url: &reqwest::Url, body: Vec<u8>, tries: Tries) -> Result<(), ActionError> {
    let client = fetch::client()?;
    let body = bytes::Bytes::from(body);
    let mut wait = Backoff::new(tries.first_wait, 2.0, 0.2, tries.first_wait * 4);
    let mut last = String::new();
    for n in 1..=tries.count.max(1) {
        match try_post(&client, url, body.clone(), tries.timeout).await {
            Ok(()) => return Ok(()),
            Err(TryError::Final(e)) => {
                return Err(ActionError::Failed(format!("POST {}: {e}", shown(url))));
            }
            Err(TryError::Again(e)) => {
                tracing::warn!(url = %shown(url), try_ = n, error = %e, "inspect: POST failed");
                last = e;
            }
        }
        if n < tries.count {
            tokio::time::sleep(wait.next_wait()).await;
        }
    }
    Err(ActionError::Failed(format!(
        "POST {}: {last} ({} tries)",
        shown(url),
        tries.count.max(1)
    )))
}

/// The running machine's addresses; none when they cannot be listed
/// (the report is still worth sending without them).
fn addresses() -> Vec<(String, std::net::IpAddr)> {
    match if_addrs::get_if_addrs() {
        Ok(list) => list.into_iter().map(|i| (i.name.clone(), i.ip())).collect(),
        Err(e) => {
            tracing::warn!(error = %e, "inspect: listing the IP addresses");
            Vec::new()
        }
    }
}

pub async fn run(
    runner: &Runner,
    env: &Env<'_>,
    progress: &Progress,
) -> Result<String, ActionError> {
    run_with(runner, env, progress, TRIES).await
}

pub async fn run_with(
    runner: &Runner,
    env: &Env<'_>,
    progress: &Progress,
    tries: Tries,
) -> Result<String, ActionError> {
    let url = callback_url(env)?;
    let boot_mac = match env.get("BOOT_MAC") {
        None => None,
        Some(m) => Some(
            hardware::normalize_mac(m)
                .ok_or_else(|| ActionError::Env(format!("BOOT_MAC={m:?} is not a MAC address")))?,
        ),
    };
    progress.set("collecting the hardware".into());
    let root = runner.root.clone();
    let hw = tokio::task::spawn_blocking(move || {
        let live = Live {
            machine: rustix::system::uname()
                .machine()
                .to_string_lossy()
                .into_owned(),
            boot_mac,
            addrs: addresses(),
        };
        hardware::collect(&root, &live)
    })
    .await
    .map_err(|e| ActionError::Failed(format!("inspect stopped: {e}")))?;
    let body = serde_json::to_vec(&hw)
        .map_err(|e| ActionError::Failed(format!("encoding the hardware: {e}")))?;
    let what = hw.summary();
    progress.set(format!("sending {what} to {}", shown(&url)));
    post(&url, body, tries).await?;
    Ok(format!("sent {what} to {}", shown(&url)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;
    use tokio::sync::mpsc;

    /// One request as the test server saw it.
    #[derive(Debug)]
    struct Seen {
        head: String,
        body: Vec<u8>,
    }

    /// An HTTP server that answers each connection with the next of
    /// `answers` (status, body); None: accept and never answer.
    async fn server(answers: Vec<Option<(u16, String)>>) -> (String, mpsc::Receiver<Seen>) {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/inspect/m1?token=secret", l.local_addr().unwrap());
        let (tx, rx) = mpsc::channel(16);
        tokio::spawn(async move {
            for answer in answers {
                let (mut s, _) = l.accept().await.unwrap();
                let tx = tx.clone();
                tokio::spawn(async move {
                    let mut buf = Vec::new();
                    let mut chunk = [0u8; 8192];
                    let (head, start, need) = loop {
                        let n = s.read(&mut chunk).await.unwrap();
                        assert!(n > 0 && buf.len() < 1 << 20);
                        buf.extend_from_slice(&chunk[..n]);
                        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                            let head = String::from_utf8_lossy(&buf[..i]).to_lowercase();
                            let len: usize = head
                                .lines()
                                .find_map(|l| l.strip_prefix("content-length:"))
                                .map_or(0, |v| v.trim().parse().unwrap());
                            break (head, i + 4, i + 4 + len);
                        }
                    };
                    while buf.len() < need {
                        let n = s.read(&mut chunk).await.unwrap();
                        assert!(n > 0);
                        buf.extend_from_slice(&chunk[..n]);
                    }
                    let body = buf[start..need].to_vec();
                    tx.send(Seen { head, body }).await.unwrap();
                    match answer {
                        Some((status, body)) => {
                            let r = format!(
                                "HTTP/1.1 {status} X\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                                body.len()
                            );
                            s.write_all(r.as_bytes()).await.unwrap();
                        }
                        None => tokio::time::sleep(Duration::from_secs(30)).await,
                    }
                });
            }
        });
        (url, rx)
    }

    const FAST: Tries = Tries {
        count: 3,
        timeout: Duration::from_millis(500),
        first_wait: Duration::from_millis(10),
    };

    fn fixture() -> (tempfile::TempDir, Runner) {
        let d = tempfile::tempdir().unwrap();
        let put = |p: &str, v: &str| {
            let f = d.path().join(p);
            std::fs::create_dir_all(f.parent().unwrap()).unwrap();
            std::fs::write(f, v).unwrap();
        };
        put(
            "proc/cpuinfo",
            "processor : 0\nmodel name : Test CPU\nflags : b a\n",
        );
        put("proc/meminfo", "MemTotal: 2097152 kB\n");
        put("sys/block/vda/size", "2048\n");
        put("sys/class/net/eth0/address", "52:54:00:00:00:01\n");
        std::fs::create_dir_all(d.path().join("sys/class/net/eth0/device")).unwrap();
        let runner = Runner {
            root: d.path().to_path_buf(),
            power: false,
            ..Runner::default()
        };
        (d, runner)
    }

    fn env(kv: &[(&str, &str)]) -> BTreeMap<String, String> {
        kv.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[tokio::test]
    async fn posts_the_document_after_a_server_error() {
        let (_d, runner) = fixture();
        let (url, mut seen) = server(vec![
            Some((503, "restarting".into())),
            Some((204, String::new())),
        ])
        .await;
        let e = env(&[("CALLBACK_URL", &url), ("BOOT_MAC", "52-54-00-00-00-01")]);
        let (p, _rx) = Progress::channel();
        let msg = run_with(&runner, &Env(&e), &p, FAST).await.unwrap();
        let port = url.split('/').nth(2).unwrap();
        assert_eq!(
            msg,
            format!("sent 1 CPU, 2048 MiB, 1 disk, 1 NIC to http://{port}/inspect/m1?…")
        );
        for _ in 0..2 {
            let s = seen.recv().await.unwrap();
            assert!(
                s.head.starts_with("post /inspect/m1?token=secret "),
                "{}",
                s.head
            );
            assert!(
                s.head.contains("content-type: application/json"),
                "{}",
                s.head
            );
            let v: serde_json::Value = serde_json::from_slice(&s.body).unwrap();
            assert_eq!(v["cpu"]["flags"], serde_json::json!(["a", "b"]));
            assert_eq!(v["storage"][0]["sizeBytes"], 1048576);
            assert_eq!(v["nics"][0]["pxe"], true);
        }
    }

    #[tokio::test]
    async fn a_refusal_fails_at_once_with_the_answer() {
        let (_d, runner) = fixture();
        let long = "x".repeat(1000);
        let (url, mut seen) = server(vec![Some((400, format!("bad document {long}")))]).await;
        let e = env(&[("CALLBACK_URL", &url)]);
        let (p, _rx) = Progress::channel();
        let err = run_with(&runner, &Env(&e), &p, FAST)
            .await
            .unwrap_err()
            .to_string();
        assert!(err.contains("400 Bad Request: bad document xxx"), "{err}");
        assert!(!err.contains("secret"), "{err}");
        assert!(err.len() < 300, "the body is quoted, not copied: {err}");
        assert!(seen.recv().await.is_some());
        assert!(seen.recv().await.is_none(), "no second try");
    }

    #[tokio::test]
    async fn three_tries_then_the_last_error() {
        let (_d, runner) = fixture();
        let (url, _seen) = server(vec![
            None,
            Some((500, "oops".into())),
            Some((502, String::new())),
        ])
        .await;
        let e = env(&[("CALLBACK_URL", &url)]);
        let (p, _rx) = Progress::channel();
        let err = run_with(&runner, &Env(&e), &p, FAST)
            .await
            .unwrap_err()
            .to_string();
        assert!(err.ends_with("502 Bad Gateway (3 tries)"), "{err}");
    }

    #[tokio::test]
    async fn the_environment() {
        let (_d, runner) = fixture();
        let (p, _rx) = Progress::channel();
        for (kv, want) in [
            (vec![], "CALLBACK_URL is required"),
            (
                vec![("CALLBACK_URL", "ftp://h/x")],
                "must be an http or https URL",
            ),
            (vec![("CALLBACK_URL", "not a url")], "is not a URL"),
            (
                vec![("CALLBACK_URL", "http://h/x"), ("BOOT_MAC", "nope")],
                "BOOT_MAC=\"nope\" is not a MAC address",
            ),
        ] {
            let e = env(&kv);
            let err = run_with(&runner, &Env(&e), &p, FAST)
                .await
                .unwrap_err()
                .to_string();
            assert!(err.contains(want), "{kv:?}: {err}");
        }
        let u = reqwest::Url::parse("https://user:pw@h:8443/p?t=1").unwrap();
        assert_eq!(shown(&u), "https://h:8443/p?…");
    }
}
