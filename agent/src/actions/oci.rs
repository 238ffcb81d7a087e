//! oci2disk: `IMG_URL` is an OCI reference (`10.99.0.1:5000/capt/ubuntu:
//! 2404-amd64.gz`, as `oras push` makes it) whose layer is a disk image;
//! the layer is streamed onto `DEST_DISK` as image2disk streams a URL, and
//! checked against its digest on the way.
//!
//! The OCI distribution API is spoken here directly (manifest, index,
//! blob, and the Bearer/Basic token dance): four GETs on the reqwest
//! client every action already has. The crates that do it (oci-client)
//! bring a second HTTP stack and buffer blobs in memory.
//!
//! HTTPS, always, unless the user allowed plain HTTP for the registry:
//! `http://` in `IMG_URL`, or the registry listed in `INSECURE_REGISTRIES`
//! (the action's) or `insecure_registries=` (the kernel command line,
//! HookOS's name), as docker's `insecure-registries`: then HTTPS is tried
//! first and plain HTTP only when no HTTPS answer came at all (a lab's
//! registry on :5000). Registry credentials are never sent in clear: with
//! them there is no fallback, and `http://` is refused. The blob is always
//! checked against the manifest's digest; pin the manifest too
//! (`repo@sha256:...`) to make the whole pull tamper-evident.

use super::disk::stream_to_disk;
use super::fetch::chain;
use super::{ActionError, Env, Progress};
use reqwest::StatusCode;
use reqwest::header::{ACCEPT, AUTHORIZATION, WWW_AUTHENTICATE};
use serde::Deserialize;
use sha2::Digest;

/// The layer media type oras gives a file by default, upstream's only one.
pub const LAYER_TAR: &str = "application/vnd.oci.image.layer.v1.tar";
const MANIFEST_TYPES: &str = "application/vnd.oci.image.manifest.v1+json, \
    application/vnd.oci.image.index.v1+json, \
    application/vnd.docker.distribution.manifest.v2+json, \
    application/vnd.docker.distribution.manifest.list.v2+json";

/// A parsed image reference.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reference {
    /// Explicitly `http://` or `https://`, else None (try https, then http).
    pub scheme: Option<String>,
    pub registry: String,
    pub repository: String,
    /// A tag or a `sha256:` digest.
    pub reference: String,
}

pub fn parse_reference(s: &str) -> Result<Reference, ActionError> {
    let bad = |why: &str| ActionError::Env(format!("IMG_URL={s:?} is not an OCI reference: {why}"));
    let (scheme, rest) = match s.split_once("://") {
        Some((sc @ ("http" | "https"), r)) => (Some(sc.to_string()), r),
        Some(_) => return Err(bad("the scheme may only be http or https")),
        None => (None, s),
    };
    let (first, path) = rest.split_once('/').ok_or_else(|| bad("no repository"))?;
    let is_host = first.contains('.') || first.contains(':') || first == "localhost";
    let (registry, path) = if is_host {
        (first.to_string(), path.to_string())
    } else {
        // Docker Hub, as `docker pull` reads a bare name.
        ("registry-1.docker.io".to_string(), rest.to_string())
    };
    let (repository, reference) = if let Some((r, d)) = path.split_once('@') {
        (r.to_string(), d.to_string())
    } else {
        match path.rsplit_once(':') {
            Some((r, t)) if !t.contains('/') => (r.to_string(), t.to_string()),
            _ => (path.clone(), "latest".to_string()),
        }
    };
    if repository.is_empty() || reference.is_empty() {
        return Err(bad("empty repository or tag"));
    }
    Ok(Reference {
        scheme,
        registry,
        repository,
        reference,
    })
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Descriptor {
    #[serde(default)]
    pub media_type: String,
    pub digest: String,
    #[serde(default)]
    pub size: u64,
    #[serde(default)]
    pub platform: Option<Platform>,
}

#[derive(Debug, Deserialize)]
pub struct Platform {
    #[serde(default)]
    pub architecture: String,
    #[serde(default)]
    pub os: String,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Manifest {
    #[serde(default)]
    pub media_type: String,
    /// An image manifest's.
    #[serde(default)]
    pub layers: Vec<Descriptor>,
    /// An index's.
    #[serde(default)]
    pub manifests: Vec<Descriptor>,
}

fn this_arch() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        a => a,
    }
}

/// From an index, the manifest for this machine (linux and its
/// architecture), else the only one.
pub fn pick_manifest(index: &Manifest) -> Option<&Descriptor> {
    index
        .manifests
        .iter()
        .find(|d| {
            d.platform
                .as_ref()
                .is_some_and(|p| p.os == "linux" && p.architecture == this_arch())
        })
        .or_else(|| (index.manifests.len() == 1).then(|| &index.manifests[0]))
}

/// The disk image's layer: the one with oras's file media type, else the
/// only layer.
pub fn pick_layer(m: &Manifest) -> Result<&Descriptor, ActionError> {
    m.layers
        .iter()
        .find(|l| l.media_type == LAYER_TAR)
        .or_else(|| (m.layers.len() == 1).then(|| &m.layers[0]))
        .ok_or_else(|| {
            ActionError::Failed(format!(
                "the image has {} layers and none of type {LAYER_TAR}: which one is the disk image?",
                m.layers.len()
            ))
        })
}

/// `Bearer realm="...",service="...",scope="..."` → its parameters.
pub fn challenge(h: &str) -> Option<(String, Vec<(String, String)>)> {
    let (scheme, rest) = h.trim().split_once(' ')?;
    let mut params = Vec::new();
    let mut s = rest.trim();
    while !s.is_empty() {
        let (k, v) = s.split_once('=')?;
        let k = k.trim().trim_start_matches(',').trim().to_string();
        let v = v.trim_start();
        let (val, next) = if let Some(q) = v.strip_prefix('"') {
            let end = q.find('"')?;
            (q[..end].to_string(), &q[end + 1..])
        } else {
            let end = v.find(',').unwrap_or(v.len());
            (v[..end].trim().to_string(), &v[end..])
        };
        params.push((k, val));
        s = next.trim_start().trim_start_matches(',').trim_start();
    }
    Some((scheme.to_ascii_lowercase(), params))
}

/// The largest manifest or index read: real ones are a few KiB.
const MANIFEST_MAX: usize = 4 << 20;

/// Whether `registry` (`host[:port]`) is one the user allows plain HTTP
/// for: listed in `list` (comma or space separated, `host` or `host:port`).
pub fn plain_http_allowed(list: &str, registry: &str) -> bool {
    let host = registry
        .rsplit_once(':')
        .filter(|(_, p)| p.parse::<u16>().is_ok())
        .map_or(registry, |(h, _)| h);
    list.split([',', ' '])
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .any(|s| s.eq_ignore_ascii_case(registry) || s.eq_ignore_ascii_case(host))
}

/// The schemes tried, in order: HTTPS alone unless plain HTTP is allowed
/// for the registry and no credentials would go with it.
pub fn schemes(
    r: &Reference,
    plain_allowed: bool,
    credentials: bool,
) -> Result<Vec<&'static str>, ActionError> {
    match r.scheme.as_deref() {
        Some("http") if credentials => Err(ActionError::Env(format!(
            "IMG_URL is http:// and REGISTRY_USERNAME is set: credentials are never sent to {} in clear; use https",
            r.registry
        ))),
        Some("http") => Ok(vec!["http"]),
        Some(_) => Ok(vec!["https"]),
        None if plain_allowed && !credentials => Ok(vec!["https", "http"]),
        None => Ok(vec!["https"]),
    }
}

struct Registry {
    http: reqwest::Client,
    base: String,
    user: Option<(String, String)>,
    /// The Authorization header won from the registry, once.
    auth: Option<String>,
    /// Whether the registry answered anything over HTTP: only a registry
    /// that never did may be tried again in plain HTTP.
    answered: bool,
}

impl Registry {
    async fn get(&mut self, path: &str, accept: &str) -> Result<reqwest::Response, ActionError> {
        let url = format!("{}{path}", self.base);
        for attempt in 0..2 {
            let mut req = self.http.get(&url).header(ACCEPT, accept);
            if let Some(a) = &self.auth {
                req = req.header(AUTHORIZATION, a);
            }
            let resp = req
                .send()
                .await
                .map_err(|e| ActionError::Failed(format!("GET {url}: {}", chain(&e))))?;
            self.answered = true;
            if resp.status() == StatusCode::UNAUTHORIZED && attempt == 0 {
                let h = resp
                    .headers()
                    .get(WWW_AUTHENTICATE)
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or("")
                    .to_string();
                self.auth = Some(self.authorize(&h).await?);
                continue;
            }
            if !resp.status().is_success() {
                return Err(ActionError::Failed(format!("GET {url}: {}", resp.status())));
            }
            return Ok(resp);
        }
        Err(ActionError::Failed(format!(
            "GET {url}: still unauthorized"
        )))
    }

    async fn authorize(&self, header: &str) -> Result<String, ActionError> {
        use base64::Engine;
        let basic = self.user.as_ref().map(|(u, p)| {
            format!(
                "Basic {}",
                base64::engine::general_purpose::STANDARD.encode(format!("{u}:{p}"))
            )
        });
        match challenge(header) {
            Some((s, params)) if s == "bearer" => {
                let get = |k: &str| {
                    params
                        .iter()
                        .find(|(pk, _)| pk == k)
                        .map(|(_, v)| v.clone())
                };
                let realm = get("realm").ok_or_else(|| {
                    ActionError::Failed(format!(
                        "the registry's Bearer challenge has no realm: {header}"
                    ))
                })?;
                let mut q: Vec<(String, String)> = Vec::new();
                for k in ["service", "scope"] {
                    if let Some(v) = get(k) {
                        q.push((k.to_string(), v));
                    }
                }
                let mut req = self.http.get(&realm).query(&q);
                if let Some(b) = &basic {
                    req = req.header(AUTHORIZATION, b);
                }
                #[derive(Deserialize)]
                struct Token {
                    #[serde(default)]
                    token: String,
                    #[serde(default)]
                    access_token: String,
                }
                let resp = req.send().await.map_err(|e| {
                    ActionError::Failed(format!("token from {realm}: {}", chain(&e)))
                })?;
                if !resp.status().is_success() {
                    return Err(ActionError::Failed(format!(
                        "token from {realm}: {}{}",
                        resp.status(),
                        if basic.is_none() {
                            " (set REGISTRY_USERNAME and REGISTRY_PASSWORD?)"
                        } else {
                            ""
                        }
                    )));
                }
                let t: Token = resp
                    .json()
                    .await
                    .map_err(|e| ActionError::Failed(format!("token from {realm}: {e}")))?;
                let t = if t.token.is_empty() {
                    t.access_token
                } else {
                    t.token
                };
                Ok(format!("Bearer {t}"))
            }
            Some((s, _)) if s == "basic" => basic.ok_or_else(|| {
                ActionError::Failed(
                    "the registry asks for a password: set REGISTRY_USERNAME and REGISTRY_PASSWORD"
                        .into(),
                )
            }),
            _ => Err(ActionError::Failed(format!(
                "the registry refused the pull (401) with no usable challenge: {header:?}"
            ))),
        }
    }

    async fn manifest(
        &mut self,
        r: &Reference,
        reference: &str,
    ) -> Result<(Manifest, Vec<u8>), ActionError> {
        let mut resp = self
            .get(
                &format!("/v2/{}/manifests/{reference}", r.repository),
                MANIFEST_TYPES,
            )
            .await?;
        let too_big = || ActionError::Failed(format!("the manifest is over {MANIFEST_MAX} bytes"));
        if resp
            .content_length()
            .is_some_and(|n| n > MANIFEST_MAX as u64)
        {
            return Err(too_big());
        }
        // Read under the limit, not whole first: a hostile registry's
        // endless body stops here.
        let mut body = Vec::new();
        while let Some(chunk) = resp
            .chunk()
            .await
            .map_err(|e| ActionError::Failed(format!("reading the manifest: {}", chain(&e))))?
        {
            if body.len() + chunk.len() > MANIFEST_MAX {
                return Err(too_big());
            }
            body.extend_from_slice(&chunk);
        }
        let m = serde_json::from_slice(&body).map_err(|e| {
            ActionError::Failed(format!("the manifest of {reference} is not JSON: {e}"))
        })?;
        Ok((m, body))
    }
}

fn check_digest(digest: &str, body: &[u8]) -> Result<(), ActionError> {
    if let Some(want) = digest.strip_prefix("sha256:") {
        let got = hex::encode(sha2::Sha256::digest(body));
        if got != want {
            return Err(ActionError::Failed(format!(
                "the manifest is sha256:{got}, not the {digest} asked for"
            )));
        }
    }
    Ok(())
}

/// `insecure`: the registries the agent's command line allows plain HTTP
/// for (`insecure_registries=`).
pub async fn oci2disk(
    env: &Env<'_>,
    insecure: &str,
    progress: &Progress,
) -> Result<String, ActionError> {
    let img = env.required("IMG_URL")?;
    let dest = env.required("DEST_DISK")?;
    let compressed = env.flag("COMPRESSED", false)?;
    let skip_verify = env.flag("SKIP_VERIFY", false)?;
    let user = match (env.get("REGISTRY_USERNAME"), env.get("REGISTRY_PASSWORD")) {
        (Some(u), Some(p)) => Some((u.to_string(), p.to_string())),
        _ => None,
    };
    let r = parse_reference(img)?;
    let http = super::fetch::client_with(skip_verify)?;
    let allowed = plain_http_allowed(env.get("INSECURE_REGISTRIES").unwrap_or(""), &r.registry)
        || plain_http_allowed(insecure, &r.registry);
    let mut last = None;
    let mut found = None;
    for scheme in schemes(&r, allowed, user.is_some())? {
        let mut reg = Registry {
            http: http.clone(),
            base: format!("{scheme}://{}", r.registry),
            user: user.clone(),
            auth: None,
            answered: false,
        };
        match reg.manifest(&r, &r.reference).await {
            Ok(m) => {
                found = Some((reg, m));
                break;
            }
            Err(e) => {
                tracing::info!(registry = %reg.base, error = %e, "oci2disk: manifest");
                let answered = reg.answered;
                last = Some(e);
                if answered {
                    // An HTTPS answer (401, 404, ...) is the registry's
                    // word: plain HTTP would not change it.
                    break;
                }
            }
        }
    }
    let (mut reg, (mut manifest, body)) = match found {
        Some(f) => f,
        None => {
            return Err(last.unwrap_or_else(|| ActionError::Failed("no registry answered".into())));
        }
    };
    check_digest(&r.reference, &body)?;
    if !manifest.manifests.is_empty() {
        let d = pick_manifest(&manifest).ok_or_else(|| {
            ActionError::Failed(format!(
                "{img} is an index with no manifest for linux/{}",
                this_arch()
            ))
        })?;
        let digest = d.digest.clone();
        let (m, body) = reg.manifest(&r, &digest).await?;
        check_digest(&digest, &body)?;
        manifest = m;
    }
    let layer = pick_layer(&manifest)?;
    let sha = (layer.digest.strip_prefix("sha256:"))
        .map(|h| super::checksum::Checksum::sha256(h, "the layer's digest"));
    let resp = reg
        .get(
            &format!("/v2/{}/blobs/{}", r.repository, layer.digest),
            "*/*",
        )
        .await?;
    let source = format!("{img} ({}, {} bytes)", layer.digest, layer.size);
    let done = stream_to_disk(
        &source,
        bytes::Bytes::new(),
        resp,
        dest,
        compressed,
        sha,
        progress,
    )
    .await?;
    Ok(format!(
        "{done}; layer {} of {img} from {}",
        layer.digest, reg.base
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn references() {
        let r = parse_reference("10.99.0.1:5000/capt/ubuntu:2404-amd64.gz").unwrap();
        assert_eq!(
            r,
            Reference {
                scheme: None,
                registry: "10.99.0.1:5000".into(),
                repository: "capt/ubuntu".into(),
                reference: "2404-amd64.gz".into(),
            }
        );
        let r = parse_reference("http://localhost/os@sha256:abcd").unwrap();
        assert_eq!(r.scheme.as_deref(), Some("http"));
        assert_eq!(r.reference, "sha256:abcd");
        let r = parse_reference("library/debian").unwrap();
        assert_eq!(r.registry, "registry-1.docker.io");
        assert_eq!(r.repository, "library/debian");
        assert_eq!(r.reference, "latest");
        let r = parse_reference("reg.example:443/a/b").unwrap();
        assert_eq!(
            (r.repository.as_str(), r.reference.as_str()),
            ("a/b", "latest")
        );
        assert!(parse_reference("ftp://x/y").is_err());
        assert!(parse_reference("justaname").is_err());
    }

    /// Plain HTTP only where the user allowed it, never with credentials.
    #[test]
    fn plain_http_needs_permission_and_no_credentials() {
        let bare = parse_reference("10.99.0.1:5000/capt/ubuntu:x").unwrap();
        assert_eq!(schemes(&bare, false, false).unwrap(), ["https"]);
        assert_eq!(schemes(&bare, true, false).unwrap(), ["https", "http"]);
        assert_eq!(
            schemes(&bare, true, true).unwrap(),
            ["https"],
            "credentials"
        );
        let http = parse_reference("http://10.99.0.1:5000/capt/ubuntu:x").unwrap();
        assert_eq!(schemes(&http, false, false).unwrap(), ["http"]);
        assert!(schemes(&http, false, true).is_err());
        let https = parse_reference("https://reg.example/a:b").unwrap();
        assert_eq!(schemes(&https, true, false).unwrap(), ["https"]);
        assert!(plain_http_allowed("10.99.0.1:5000", "10.99.0.1:5000"));
        assert!(plain_http_allowed("reg.lab, 10.99.0.1", "10.99.0.1:5000"));
        assert!(!plain_http_allowed("10.99.0.1:5001", "10.99.0.1:5000"));
        assert!(!plain_http_allowed("", "10.99.0.1:5000"));
        assert!(!plain_http_allowed("10.99.0.10", "10.99.0.1:5000"));
    }

    #[test]
    fn challenges() {
        let (s, p) = challenge(
            r#"Bearer realm="https://auth.docker.io/token",service="registry.docker.io",scope="repository:library/debian:pull""#,
        )
        .unwrap();
        assert_eq!(s, "bearer");
        assert_eq!(
            p[0],
            ("realm".into(), "https://auth.docker.io/token".into())
        );
        assert_eq!(p[2].1, "repository:library/debian:pull");
        let (s, p) = challenge(r#"Basic realm="Registry Realm""#).unwrap();
        assert_eq!(s, "basic");
        assert_eq!(p.len(), 1);
        assert!(challenge("garbage").is_none());
    }

    #[test]
    fn layers_and_indexes() {
        let m: Manifest = serde_json::from_str(
            r#"{"mediaType":"application/vnd.oci.image.manifest.v1+json",
                "config":{"mediaType":"application/vnd.oci.empty.v1+json","digest":"sha256:44","size":2},
                "layers":[{"mediaType":"application/vnd.oci.image.layer.v1.tar","digest":"sha256:aa","size":10,
                  "annotations":{"org.opencontainers.image.title":"disk.raw.gz"}}]}"#,
        )
        .unwrap();
        assert_eq!(pick_layer(&m).unwrap().digest, "sha256:aa");
        let two: Manifest = serde_json::from_str(
            r#"{"layers":[{"mediaType":"x","digest":"sha256:1"},{"mediaType":"y","digest":"sha256:2"}]}"#,
        )
        .unwrap();
        assert!(pick_layer(&two).is_err());
        let idx: Manifest = serde_json::from_str(&format!(
            r#"{{"manifests":[{{"digest":"sha256:arm","platform":{{"os":"linux","architecture":"riscv"}}}},
                {{"digest":"sha256:me","platform":{{"os":"linux","architecture":"{}"}}}}]}}"#,
            this_arch()
        ))
        .unwrap();
        assert_eq!(pick_manifest(&idx).unwrap().digest, "sha256:me");
        check_digest("sha256:".to_string().as_str(), b"").unwrap_err();
        let body = b"{}";
        let d = format!("sha256:{}", hex::encode(sha2::Sha256::digest(body)));
        check_digest(&d, body).unwrap();
        check_digest("a-tag", body).unwrap();
    }
}
