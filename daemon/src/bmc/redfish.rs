//! Redfish client: power (`ComputerSystem.Reset`), boot override (`PATCH`
//! of `Boot`) and virtual media (`VirtualMedia.InsertMedia`/`EjectMedia`)
//! on one ComputerSystem, as Rufio does through bmclib.
//!
//! Each call is one short conversation: read the service root, log in (a
//! session, or HTTP Basic), find the system, act, log out. Nothing is cached
//! between calls, so a BMC reboot or a changed password never leaves stale
//! state behind. Hand-written over reqwest + serde_json: the handful of
//! resources used here does not justify a Redfish crate.

use super::model::MediaKind;
use super::{BmcError, BootDevice, PowerAction, PowerState, Target};
use reqwest::header::{self, HeaderMap, HeaderValue};
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};
use std::time::{Duration, Instant};

/// No Redfish resource used here comes near this; a bigger answer is not a BMC.
const MAX_BODY: usize = 4 << 20;
/// A power cycle without `PowerCycle` waits this long for `ForceOff` to land
/// before sending `On` (a BMC refuses `On` while the system is still on).
const CYCLE_OFF_WAIT: Duration = Duration::from_secs(60);
/// How often the power-cycle fallback reads the power state.
const POLL_EVERY: Duration = Duration::from_millis(500);
/// Wire text quoted in an error is cut to this many characters.
const MAX_QUOTE: usize = 300;
/// Where DSP0266 puts the sessions collection when the root does not say.
const DEFAULT_SESSIONS: &str = "/redfish/v1/SessionService/Sessions";

protocol!(Redfish, "redfish");

/// Run a power action; `Status` only reads the state.
///
/// For an action, the state it leads to is returned once the BMC accepted
/// it: BMCs apply power changes asynchronously, so callers that need the
/// final state poll with `PowerAction::Status` (as Rufio's task controller
/// does). `On` on a system that is on, and `Off`/`Soft` on one that is off,
/// send nothing: some BMCs answer those with an error.
pub async fn power(t: &Target, action: PowerAction) -> Result<PowerState, BmcError> {
    let (conn, root) = Conn::open(t).await?;
    let result = conn.power(&root, action).await;
    conn.close().await;
    result
}

/// Set the next boot device (`persistent`: every boot, else once) and, when
/// the system reports a different one, the boot mode (`efi`: UEFI, else Legacy).
///
/// A BMC that answers 400 to `BootSourceOverrideMode` (some reject the field,
/// or the mode they cannot do) gets the same request again without it: the
/// device matters more than the mode, which usually follows the firmware.
pub async fn set_boot_device(
    t: &Target,
    dev: BootDevice,
    persistent: bool,
    efi: bool,
) -> Result<(), BmcError> {
    let (conn, root) = Conn::open(t).await?;
    let result = conn.set_boot_device(&root, dev, persistent, efi).await;
    conn.close().await;
    result
}

/// Insert `url` into the system's first virtual media device that takes
/// `kind` (ejecting what it holds first: BMCs refuse an insert into a full
/// drive), or only eject when `url` is empty. The device is looked for in
/// the system's `VirtualMedia` (Redfish 2019.4 and later, sushy-tools) and
/// then in its managers' (older BMCs: iDRAC, iLO 5), as bmclib does.
pub async fn virtual_media(t: &Target, kind: MediaKind, url: &str) -> Result<(), BmcError> {
    let (conn, root) = Conn::open(t).await?;
    let result = conn.virtual_media(&root, kind, url).await;
    conn.close().await;
    result
}

/// The system's boot override as the BMC reports it: `BootSourceOverrideTarget`,
/// `BootSourceOverrideEnabled` and, when present, `BootSourceOverrideMode`.
pub async fn boot_override(t: &Target) -> Result<(String, String, Option<String>), BmcError> {
    let (conn, root) = Conn::open(t).await?;
    let result = conn.boot_override(&root).await;
    conn.close().await;
    result
}

/// What the BMC says of its system's hardware ([`super::inventory`]): the
/// ComputerSystem, its Processors, Memory, EthernetInterfaces, the drives
/// of its Storage (else SimpleStorage devices) and its Bios, read in one
/// conversation. Only the system must answer; a collection the BMC does
/// not have (404, 501) is left out.
pub async fn inventory(t: &Target) -> Result<super::inventory::Read, BmcError> {
    let (conn, root) = Conn::open(t).await?;
    let result = conn.inventory(&root).await;
    conn.close().await;
    result
}

/// The `ResetType` for a Rufio power action (`None` for `Status`).
pub fn reset_type(action: PowerAction) -> Option<&'static str> {
    match action {
        PowerAction::On => Some("On"),
        PowerAction::Off => Some("ForceOff"),
        PowerAction::Soft => Some("GracefulShutdown"),
        PowerAction::Reset => Some("ForceRestart"),
        PowerAction::Cycle => Some("PowerCycle"),
        PowerAction::Status => None,
    }
}

/// The state a power action leads to.
fn resulting_state(action: PowerAction) -> PowerState {
    match action {
        PowerAction::On | PowerAction::Cycle | PowerAction::Reset => PowerState::On,
        PowerAction::Off | PowerAction::Soft => PowerState::Off,
        PowerAction::Status => PowerState::Unknown,
    }
}

/// `BootSourceOverrideTarget` for a Rufio boot device.
pub fn boot_target(dev: BootDevice) -> &'static str {
    match dev {
        BootDevice::Pxe => "Pxe",
        BootDevice::Disk => "Hdd",
        BootDevice::Bios => "BiosSetup",
        BootDevice::Cdrom => "Cd",
    }
}

/// Whether the `PATCH` should carry `BootSourceOverrideMode`: only when the
/// system reports a mode and it is not the one wanted. A system that does
/// not report the property does not support it (Redfish: unknown properties
/// are refused), and changing a mode is not free on every BMC (sushy's
/// libvirt driver rebuilds the domain's loader, and fails for a SeaBIOS
/// domain asked for Legacy). The device is what matters.
fn mode_needs_setting(current: Option<&str>, efi: bool) -> bool {
    let want = if efi { "UEFI" } else { "Legacy" };
    current.is_some_and(|c| !c.eq_ignore_ascii_case(want))
}

/// The body of the boot override `PATCH`.
fn boot_patch(dev: BootDevice, persistent: bool, efi: bool, with_mode: bool) -> Value {
    let mut boot = json!({
        "BootSourceOverrideTarget": boot_target(dev),
        "BootSourceOverrideEnabled": if persistent { "Continuous" } else { "Once" },
    });
    if with_mode && let Some(b) = boot.as_object_mut() {
        b.insert(
            "BootSourceOverrideMode".into(),
            Value::from(if efi { "UEFI" } else { "Legacy" }),
        );
    }
    json!({ "Boot": boot })
}

/// Redfish `PowerState` to Rufio's: the transitional states (`PoweringOn`,
/// `PoweringOff`, `Paused`) are neither, so a poller keeps waiting.
fn parse_power_state(s: Option<&str>) -> PowerState {
    match s {
        Some("On") => PowerState::On,
        Some("Off") => PowerState::Off,
        _ => PowerState::Unknown,
    }
}

/// The human part of a Redfish error body: every
/// `error.@Message.ExtendedInfo[].Message`, else `error.message`; a short
/// plain-text body as it is. `None` for an empty or HTML body.
pub fn error_message(body: &[u8]) -> Option<String> {
    let text = String::from_utf8_lossy(body);
    let text = text.trim();
    if text.is_empty() {
        return None;
    }
    let Ok(v) = serde_json::from_str::<Value>(text) else {
        if text.starts_with('<') {
            return None;
        }
        return Some(quote(text.lines().next().unwrap_or_default()));
    };
    let err = v.get("error").unwrap_or(&v);
    let mut msgs: Vec<String> = Vec::new();
    let infos = err
        .get("@Message.ExtendedInfo")
        .and_then(Value::as_array)
        .into_iter()
        .flatten();
    for info in infos {
        if let Some(m) = info.get("Message").and_then(Value::as_str) {
            let m = m.trim();
            if !m.is_empty() && !msgs.iter().any(|x| x == m) {
                msgs.push(m.to_string());
            }
        }
    }
    if msgs.is_empty()
        && let Some(m) = err.get("message").and_then(Value::as_str)
        && !m.trim().is_empty()
    {
        msgs.push(m.trim().to_string());
    }
    if msgs.is_empty() {
        None
    } else {
        Some(quote(&msgs.join("; ")))
    }
}

/// Wire text made safe to put in a log line: no control characters, bounded.
fn quote(s: &str) -> String {
    let mut out: String = s
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .take(MAX_QUOTE)
        .collect();
    if s.chars().count() > MAX_QUOTE {
        out.push('…');
    }
    out
}

/// A system id goes into a URL path as one segment: refuse anything that
/// would change the path or need escaping rather than guess.
fn valid_system_id(id: &str) -> bool {
    !id.is_empty()
        && id != "."
        && id != ".."
        && id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-._~:@!$&'()*+,;=".contains(c))
}

/// The first error in `e`'s chain that is rustls's (a TLS handshake failure).
/// An io::Error hides what it wraps from `source()` (and may wrap another
/// io::Error), so step into it with `get_ref()` instead.
fn find_rustls<'e>(e: &'e (dyn std::error::Error + 'static)) -> Option<&'e rustls::Error> {
    let mut cur = Some(e);
    while let Some(err) = cur {
        if let Some(r) = err.downcast_ref::<rustls::Error>() {
            return Some(r);
        }
        cur = match err.downcast_ref::<std::io::Error>() {
            Some(io) => io
                .get_ref()
                .map(|inner| inner as &(dyn std::error::Error + 'static)),
            None => err.source(),
        };
    }
    None
}

/// The causes under a reqwest error ("connection refused", ...), without
/// reqwest's own "error sending request for url (...)" line.
fn causes(e: &reqwest::Error) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut cur = std::error::Error::source(e);
    while let Some(err) = cur {
        let s = err.to_string();
        // hyper's "client error (Connect)" says nothing the next cause does not.
        if !s.is_empty()
            && !s.starts_with("client error (")
            && !parts.iter().any(|p| p.contains(&s))
        {
            parts.push(s);
        }
        cur = err.source();
    }
    if parts.is_empty() {
        e.to_string()
    } else {
        parts.join(": ")
    }
}

/// How requests authenticate.
enum Auth {
    /// Before the session exists (service root, login).
    Anonymous,
    Basic,
    /// `uri` is deleted at the end to free the BMC's (few) session slots.
    Session {
        token: String,
        uri: Option<String>,
    },
}

/// One HTTP answer, read whole.
struct Reply {
    status: StatusCode,
    headers: HeaderMap,
    body: Vec<u8>,
}

/// The ComputerSystem being driven.
struct System {
    path: String,
    json: Value,
    etag: Option<String>,
}

/// One conversation with one BMC.
struct Conn<'a> {
    t: &'a Target,
    http: reqwest::Client,
    /// `https://host:port`: every request goes here, whatever a body says.
    origin: String,
    auth: Auth,
}

impl<'a> Conn<'a> {
    /// Connect, read the service root and log in. Returns the root.
    async fn open(t: &'a Target) -> Result<(Conn<'a>, Value), BmcError> {
        if t.host.trim().is_empty() {
            return Err(BmcError::Protocol("Redfish: no BMC host given".into()));
        }
        let scheme = if t.plain_http { "http" } else { "https" };
        let port = t.port.unwrap_or(if t.plain_http { 80 } else { 443 });
        let host = if t.host.contains(':') && !t.host.starts_with('[') {
            format!("[{}]", t.host)
        } else {
            t.host.clone()
        };
        let origin = format!("{scheme}://{host}:{port}");
        // reqwest panics without a process-wide provider; main.rs installs
        // ring, and this is a no-op then.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let http = reqwest::Client::builder()
            .timeout(t.timeout)
            .connect_timeout(t.timeout)
            // A BMC sits on a management network: never through a proxy.
            .no_proxy()
            .tls_danger_accept_invalid_certs(t.insecure_tls)
            .redirect(same_origin_redirects())
            .user_agent(concat!("tinkerbox/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|e| BmcError::Protocol(format!("Redfish client for {origin}: {e}")))?;
        let mut conn = Conn {
            t,
            http,
            origin,
            auth: if t.basic_auth {
                Auth::Basic
            } else {
                Auth::Anonymous
            },
        };
        let root_path = "/redfish/v1/";
        let reply = conn.send(Method::GET, root_path, None, None).await?;
        let root = if matches!(reply.status, StatusCode::UNAUTHORIZED)
            && matches!(conn.auth, Auth::Anonymous)
        {
            // The root should be open (DSP0266), but some BMCs want a login
            // first: try the standard sessions collection, then read it.
            conn.login(DEFAULT_SESSIONS).await?;
            let reply = conn.send(Method::GET, root_path, None, None).await;
            match reply.and_then(|r| conn.json(&Method::GET, root_path, r)) {
                Ok(root) => root,
                Err(e) => {
                    conn.close().await;
                    return Err(e);
                }
            }
        } else {
            let root = conn.json(&Method::GET, root_path, reply)?;
            if matches!(conn.auth, Auth::Anonymous) {
                match sessions_path(&root) {
                    Some(p) => conn.login(&p).await?,
                    None => {
                        tracing::debug!(bmc = %conn.origin, "no SessionService: using HTTP Basic");
                        conn.auth = Auth::Basic;
                    }
                }
            }
            root
        };
        Ok((conn, root))
    }

    /// Create a session (`POST` user name and password, keep `X-Auth-Token`).
    /// A service without sessions there (404/405/501) gets Basic instead.
    async fn login(&mut self, sessions: &str) -> Result<(), BmcError> {
        let body = json!({ "UserName": self.t.username, "Password": self.t.password });
        let reply = self.send(Method::POST, sessions, Some(&body), None).await?;
        match reply.status {
            s if s.is_success() => {
                let token = reply
                    .headers
                    .get("x-auth-token")
                    .and_then(|v| v.to_str().ok())
                    .map(str::trim)
                    .filter(|v| !v.is_empty())
                    .ok_or_else(|| {
                        BmcError::Protocol(format!(
                            "BMC at {}: session created without an X-Auth-Token",
                            self.origin
                        ))
                    })?
                    .to_string();
                let uri = reply
                    .headers
                    .get(header::LOCATION)
                    .and_then(|v| v.to_str().ok())
                    .map(str::to_string)
                    .or_else(|| {
                        serde_json::from_slice::<Value>(&reply.body)
                            .ok()
                            .and_then(|v| v.get("@odata.id")?.as_str().map(str::to_string))
                    });
                self.auth = Auth::Session { token, uri };
                Ok(())
            }
            StatusCode::NOT_FOUND
            | StatusCode::METHOD_NOT_ALLOWED
            | StatusCode::NOT_IMPLEMENTED => {
                tracing::debug!(bmc = %self.origin, status = %reply.status, "no sessions: using HTTP Basic");
                self.auth = Auth::Basic;
                Ok(())
            }
            _ => Err(self.status_error(&Method::POST, sessions, &reply)),
        }
    }

    /// Log out: a BMC has few session slots, and an abandoned session holds
    /// one until it times out. Failures only get logged.
    async fn close(self) {
        if let Auth::Session { uri: Some(uri), .. } = &self.auth {
            match self.send(Method::DELETE, uri, None, None).await {
                Ok(r) if r.status.is_success() || r.status == StatusCode::NOT_FOUND => {}
                Ok(r) => {
                    tracing::debug!(bmc = %self.origin, status = %r.status, "Redfish logout refused")
                }
                Err(e) => tracing::debug!(bmc = %self.origin, error = %e, "Redfish logout failed"),
            }
        }
    }

    /// Absolute URL for a path from us or from the BMC. A full URL in a
    /// body is reduced to its path: credentials only ever go to `origin`.
    fn url(&self, path: &str) -> String {
        if (path.starts_with("http://") || path.starts_with("https://"))
            && let Ok(u) = reqwest::Url::parse(path)
        {
            return match u.query() {
                Some(q) => format!("{}{}?{q}", self.origin, u.path()),
                None => format!("{}{}", self.origin, u.path()),
            };
        }
        if path.starts_with('/') {
            format!("{}{path}", self.origin)
        } else {
            format!("{}/{path}", self.origin)
        }
    }

    /// One request, its whole answer read; any status comes back as `Ok`.
    async fn send(
        &self,
        method: Method,
        path: &str,
        body: Option<&Value>,
        if_match: Option<&str>,
    ) -> Result<Reply, BmcError> {
        tracing::debug!(bmc = %self.origin, %method, path, "Redfish request");
        let mut req = self
            .http
            .request(method.clone(), self.url(path))
            .header(header::ACCEPT, "application/json")
            .header("OData-Version", "4.0");
        req = match &self.auth {
            Auth::Anonymous => req,
            Auth::Basic => req.basic_auth(&self.t.username, Some(&self.t.password)),
            Auth::Session { token, .. } => match HeaderValue::from_str(token) {
                Ok(mut v) => {
                    v.set_sensitive(true);
                    req.header("X-Auth-Token", v)
                }
                Err(_) => {
                    return Err(BmcError::Protocol(format!(
                        "BMC at {}: session token is not a valid header value",
                        self.origin
                    )));
                }
            },
        };
        if let Some(etag) = if_match {
            req = req.header(header::IF_MATCH, etag);
        }
        if let Some(b) = body {
            req = req.json(b);
        }
        let mut resp = req
            .send()
            .await
            .map_err(|e| self.transport_error(&method, path, &e))?;
        let status = resp.status();
        let headers = resp.headers().clone();
        let mut buf = Vec::new();
        while let Some(chunk) = resp
            .chunk()
            .await
            .map_err(|e| self.transport_error(&method, path, &e))?
        {
            if buf.len() + chunk.len() > MAX_BODY {
                return Err(BmcError::Protocol(format!(
                    "BMC at {}: {method} {path}: answer larger than {MAX_BODY} bytes",
                    self.origin
                )));
            }
            buf.extend_from_slice(&chunk);
        }
        Ok(Reply {
            status,
            headers,
            body: buf,
        })
    }

    /// A failure below HTTP: timeout, refused connection, TLS.
    fn transport_error(&self, method: &Method, path: &str, e: &reqwest::Error) -> BmcError {
        if e.is_timeout() {
            return BmcError::Timeout(self.origin.clone(), self.t.timeout);
        }
        if let Some(tls) = find_rustls(e) {
            let hint = match tls {
                rustls::Error::InvalidCertificate(_) if !self.t.insecure_tls => {
                    " (a self-signed BMC certificate? set insecure_tls for this machine)"
                }
                _ => "",
            };
            return BmcError::Protocol(format!(
                "TLS with BMC at {} failed: {tls}{hint}",
                self.origin
            ));
        }
        if e.is_connect() {
            return BmcError::Protocol(format!(
                "cannot connect to BMC at {}: {}",
                self.origin,
                causes(e)
            ));
        }
        BmcError::Protocol(format!(
            "BMC at {}: {method} {path}: {}",
            self.origin,
            causes(e)
        ))
    }

    /// An HTTP error status, with the BMC's own words when it gave some.
    fn status_error(&self, method: &Method, path: &str, r: &Reply) -> BmcError {
        let detail = error_message(&r.body)
            .map(|m| format!(": {m}"))
            .unwrap_or_default();
        match r.status {
            StatusCode::UNAUTHORIZED => BmcError::Auth(format!(
                "BMC at {} rejected the user name or password (HTTP {}){detail}",
                self.origin, r.status
            )),
            StatusCode::FORBIDDEN => BmcError::Auth(format!(
                "BMC at {} refused {method} {path} for this user (HTTP {}): wrong credentials or too few privileges{detail}",
                self.origin, r.status
            )),
            _ => BmcError::Protocol(format!(
                "BMC at {}: {method} {path}: HTTP {}{detail}",
                self.origin, r.status
            )),
        }
    }

    /// A 2xx answer's JSON body.
    fn json(&self, method: &Method, path: &str, r: Reply) -> Result<Value, BmcError> {
        if !r.status.is_success() {
            return Err(self.status_error(method, path, &r));
        }
        serde_json::from_slice(&r.body).map_err(|e| {
            BmcError::Protocol(format!(
                "BMC at {}: {method} {path}: answer is not JSON ({e})",
                self.origin
            ))
        })
    }

    async fn get(&self, path: &str) -> Result<Value, BmcError> {
        let r = self.send(Method::GET, path, None, None).await?;
        self.json(&Method::GET, path, r)
    }

    /// The ComputerSystem: `t.system` in the Systems collection, else the
    /// only (or first) member.
    async fn system(&self, root: &Value) -> Result<System, BmcError> {
        let coll = root
            .pointer("/Systems/@odata.id")
            .and_then(Value::as_str)
            .unwrap_or("/redfish/v1/Systems")
            .trim_end_matches('/')
            .to_string();
        let path = match &self.t.system {
            Some(id) => {
                if !valid_system_id(id) {
                    return Err(BmcError::Protocol(format!(
                        "Redfish system id {id:?} is not a plain path segment"
                    )));
                }
                format!("{coll}/{id}")
            }
            None => {
                let members = self.members(&coll).await?;
                let Some(first) = members.first() else {
                    return Err(BmcError::Protocol(format!(
                        "BMC at {} lists no ComputerSystem in {coll}",
                        self.origin
                    )));
                };
                if members.len() > 1 {
                    tracing::info!(bmc = %self.origin, systems = members.len(), using = %first,
                        "BMC has several systems: using the first (set the system id to choose)");
                }
                first.clone()
            }
        };
        let reply = self.send(Method::GET, &path, None, None).await?;
        if reply.status == StatusCode::NOT_FOUND
            && let Some(id) = &self.t.system
        {
            let have = match self.members(&coll).await {
                Ok(m) if m.is_empty() => "none".to_string(),
                Ok(m) => m
                    .iter()
                    .map(|p| p.rsplit('/').next().unwrap_or(p))
                    .collect::<Vec<_>>()
                    .join(", "),
                Err(_) => "unknown".to_string(),
            };
            return Err(BmcError::Protocol(format!(
                "BMC at {} has no system {id:?} (it has: {have})",
                self.origin
            )));
        }
        let etag = reply
            .headers
            .get(header::ETAG)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        let json = self.json(&Method::GET, &path, reply)?;
        let etag = etag.or_else(|| {
            json.get("@odata.etag")
                .and_then(Value::as_str)
                .map(str::to_string)
        });
        // After a redirect (an alias id) the canonical path avoids another.
        let path = json
            .get("@odata.id")
            .and_then(Value::as_str)
            .filter(|p| p.starts_with('/'))
            .map(|p| p.trim_end_matches('/').to_string())
            .unwrap_or(path);
        Ok(System { path, json, etag })
    }

    /// A resource the BMC may not have: None for any failure.
    async fn optional(&self, path: &str) -> Option<Value> {
        match self.get(path).await {
            Ok(v) => Some(v),
            Err(e) => {
                tracing::debug!(bmc = %self.origin, path, error = %e, "redfish: not read");
                None
            }
        }
    }

    /// The members of the collection `sys[key]` links to, each read (at
    /// most [`super::inventory::MAX_MEMBERS`]).
    async fn listed(&self, sys: &Value, key: &str) -> Vec<Value> {
        let Some(coll) = sys
            .pointer(&format!("/{key}/@odata.id"))
            .and_then(Value::as_str)
        else {
            return vec![];
        };
        let Some(c) = self.optional(coll).await else {
            return vec![];
        };
        let mut out = vec![];
        for m in odata_ids(c.get("Members"))
            .iter()
            .take(super::inventory::MAX_MEMBERS)
        {
            out.extend(self.optional(m).await);
        }
        out
    }

    async fn inventory(&self, root: &Value) -> Result<super::inventory::Read, BmcError> {
        let sys = self.system(root).await?.json;
        let mut drives = vec![];
        for storage in self.listed(&sys, "Storage").await {
            for d in odata_ids(storage.get("Drives")) {
                if drives.len() >= super::inventory::MAX_MEMBERS {
                    break;
                }
                drives.extend(self.optional(&d).await);
            }
        }
        if drives.is_empty() {
            for s in self.listed(&sys, "SimpleStorage").await {
                let devices = s.get("Devices").and_then(Value::as_array).cloned();
                drives.extend(devices.into_iter().flatten());
            }
            drives.truncate(super::inventory::MAX_MEMBERS);
        }
        let bios = match sys.pointer("/Bios/@odata.id").and_then(Value::as_str) {
            Some(p) => self.optional(p).await,
            None => None,
        };
        Ok(super::inventory::Read {
            processors: self.listed(&sys, "Processors").await,
            memory: self.listed(&sys, "Memory").await,
            nics: self.listed(&sys, "EthernetInterfaces").await,
            drives,
            bios,
            system: sys,
        })
    }

    /// `@odata.id` of each member of a collection.
    async fn members(&self, coll: &str) -> Result<Vec<String>, BmcError> {
        let v = self.get(coll).await?;
        Ok(odata_ids(v.get("Members")))
    }

    async fn power(&self, root: &Value, action: PowerAction) -> Result<PowerState, BmcError> {
        let sys = self.system(root).await?;
        let state = parse_power_state(sys.json.get("PowerState").and_then(Value::as_str));
        match action {
            PowerAction::Status => return Ok(state),
            PowerAction::On if state == PowerState::On => return Ok(state),
            PowerAction::Off | PowerAction::Soft if state == PowerState::Off => return Ok(state),
            PowerAction::Cycle => {
                let allowed = self.allowed_resets(&sys).await;
                if allowed.iter().flatten().any(|v| v == "PowerCycle") {
                    self.reset(&sys, "PowerCycle").await?;
                } else if state == PowerState::Off {
                    // Cycling an off machine means starting it (as bmclib).
                    self.reset(&sys, "On").await?;
                } else {
                    tracing::debug!(bmc = %self.origin, "no PowerCycle: ForceOff, then On");
                    self.reset(&sys, "ForceOff").await?;
                    self.wait_off(&sys.path).await?;
                    self.reset(&sys, "On").await?;
                }
            }
            _ => {
                if let Some(rt) = reset_type(action) {
                    self.reset(&sys, rt).await?;
                }
            }
        }
        Ok(resulting_state(action))
    }

    /// `ResetType` values the system allows, from the action's annotation or
    /// its `@Redfish.ActionInfo`; `None` when the BMC does not say.
    async fn allowed_resets(&self, sys: &System) -> Option<Vec<String>> {
        let action = sys.json.pointer("/Actions/#ComputerSystem.Reset")?;
        let strings = |v: &Value| -> Vec<String> {
            v.as_array()
                .into_iter()
                .flatten()
                .filter_map(Value::as_str)
                .map(str::to_string)
                .collect()
        };
        if let Some(list) = action.get("ResetType@Redfish.AllowableValues") {
            return Some(strings(list));
        }
        let info_path = action.get("@Redfish.ActionInfo")?.as_str()?;
        let info = self.get(info_path).await.ok()?;
        info.get("Parameters")?
            .as_array()?
            .iter()
            .find(|p| p.get("Name").and_then(Value::as_str) == Some("ResetType"))
            .and_then(|p| p.get("AllowableValues"))
            .map(strings)
    }

    /// `POST` the system's `ComputerSystem.Reset` action.
    async fn reset(&self, sys: &System, reset_type: &str) -> Result<(), BmcError> {
        let target = sys
            .json
            .pointer("/Actions/#ComputerSystem.Reset/target")
            .and_then(Value::as_str)
            .map(str::to_string)
            .unwrap_or_else(|| format!("{}/Actions/ComputerSystem.Reset", sys.path));
        let body = json!({ "ResetType": reset_type });
        let r = self.send(Method::POST, &target, Some(&body), None).await?;
        if r.status.is_success() {
            tracing::debug!(bmc = %self.origin, reset_type, "Redfish reset accepted");
            Ok(())
        } else {
            Err(self.status_error(&Method::POST, &target, &r))
        }
    }

    /// Poll until the system reports `Off`, at most `CYCLE_OFF_WAIT`.
    async fn wait_off(&self, path: &str) -> Result<(), BmcError> {
        let start = Instant::now();
        loop {
            let v = self.get(path).await?;
            if parse_power_state(v.get("PowerState").and_then(Value::as_str)) == PowerState::Off {
                return Ok(());
            }
            if start.elapsed() >= CYCLE_OFF_WAIT {
                return Err(BmcError::Protocol(format!(
                    "BMC at {}: system still not off {CYCLE_OFF_WAIT:?} after ForceOff",
                    self.origin
                )));
            }
            tokio::time::sleep(POLL_EVERY).await;
        }
    }

    async fn set_boot_device(
        &self,
        root: &Value,
        dev: BootDevice,
        persistent: bool,
        efi: bool,
    ) -> Result<(), BmcError> {
        let sys = self.system(root).await?;
        let mut with_mode = mode_needs_setting(
            sys.json
                .pointer("/Boot/BootSourceOverrideMode")
                .and_then(Value::as_str),
            efi,
        );
        let mut if_match: Option<&str> = None;
        // At most: once plain, once with If-Match, once without the mode.
        for _ in 0..3 {
            let body = boot_patch(dev, persistent, efi, with_mode);
            let r = self
                .send(Method::PATCH, &sys.path, Some(&body), if_match)
                .await?;
            if r.status.is_success() {
                return Ok(());
            }
            if r.status == StatusCode::PRECONDITION_REQUIRED
                && if_match.is_none()
                && sys.etag.is_some()
            {
                // This BMC wants the ETag of what is being changed.
                if_match = sys.etag.as_deref();
                continue;
            }
            if r.status == StatusCode::BAD_REQUEST && with_mode {
                tracing::warn!(
                    bmc = %self.origin,
                    reason = error_message(&r.body).unwrap_or_default(),
                    "BMC refused BootSourceOverrideMode: setting the boot device without it"
                );
                with_mode = false;
                continue;
            }
            return Err(self.status_error(&Method::PATCH, &sys.path, &r));
        }
        Err(BmcError::Protocol(format!(
            "BMC at {}: PATCH {}: boot override refused",
            self.origin, sys.path
        )))
    }

    async fn virtual_media(
        &self,
        root: &Value,
        kind: MediaKind,
        url: &str,
    ) -> Result<(), BmcError> {
        let sys = self.system(root).await?;
        let mut collections: Vec<String> = sys
            .json
            .pointer("/VirtualMedia/@odata.id")
            .and_then(Value::as_str)
            .map(str::to_string)
            .into_iter()
            .collect();
        let mut managers = odata_ids(sys.json.pointer("/Links/ManagedBy"));
        if managers.is_empty()
            && let Some(coll) = root.pointer("/Managers/@odata.id").and_then(Value::as_str)
        {
            managers = self.members(coll).await.unwrap_or_default();
        }
        for m in managers.iter().take(MAX_MANAGERS) {
            if let Ok(v) = self.get(m).await
                && let Some(p) = v.pointer("/VirtualMedia/@odata.id").and_then(Value::as_str)
            {
                collections.push(p.to_string());
            }
        }
        let mut seen = vec![];
        for coll in &collections {
            let Ok(devices) = self.members(coll).await else {
                continue;
            };
            for path in devices.into_iter().take(MAX_MEDIA_DEVICES) {
                let dev = self.get(&path).await?;
                let types = odata_strings(dev.get("MediaTypes"));
                if !types.iter().any(|t| t.eq_ignore_ascii_case(kind.as_str())) {
                    seen.push(format!("{path} ({})", types.join(", ")));
                    continue;
                }
                if holds_media(&dev) {
                    self.media_action(&path, &dev, "EjectMedia", json!({}))
                        .await?;
                }
                if url.is_empty() {
                    return Ok(());
                }
                let body = json!({ "Image": url, "Inserted": true, "WriteProtected": true });
                return self.media_action(&path, &dev, "InsertMedia", body).await;
            }
        }
        Err(BmcError::Protocol(format!(
            "BMC at {} has no virtual media device for {} (found: {})",
            self.origin,
            kind.as_str(),
            if seen.is_empty() {
                "none".to_string()
            } else {
                seen.join("; ")
            }
        )))
    }

    /// `POST` a device's `VirtualMedia.<action>`, at the target it names.
    async fn media_action(
        &self,
        path: &str,
        dev: &Value,
        action: &str,
        body: Value,
    ) -> Result<(), BmcError> {
        let target = media_target(path, dev, action);
        let r = self.send(Method::POST, &target, Some(&body), None).await?;
        if r.status.is_success() {
            tracing::debug!(bmc = %self.origin, action, device = path, "Redfish virtual media");
            Ok(())
        } else {
            Err(self.status_error(&Method::POST, &target, &r))
        }
    }

    async fn boot_override(
        &self,
        root: &Value,
    ) -> Result<(String, String, Option<String>), BmcError> {
        let sys = self.system(root).await?;
        let field = |name: &str| {
            sys.json
                .get("Boot")
                .and_then(|b| b.get(name))
                .and_then(Value::as_str)
                .map(str::to_string)
        };
        let missing = |name: &str| {
            BmcError::Protocol(format!(
                "BMC at {}: {} has no Boot.{name}",
                self.origin, sys.path
            ))
        };
        let target =
            field("BootSourceOverrideTarget").ok_or_else(|| missing("BootSourceOverrideTarget"))?;
        let enabled = field("BootSourceOverrideEnabled")
            .ok_or_else(|| missing("BootSourceOverrideEnabled"))?;
        Ok((target, enabled, field("BootSourceOverrideMode")))
    }
}

/// A BMC with more managers or media devices than this is not one.
const MAX_MANAGERS: usize = 16;
const MAX_MEDIA_DEVICES: usize = 32;

/// The `@odata.id` of each link in a list of links.
fn odata_ids(v: Option<&Value>) -> Vec<String> {
    v.and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|m| m.get("@odata.id").and_then(Value::as_str))
        .map(str::to_string)
        .collect()
}

fn odata_strings(v: Option<&Value>) -> Vec<String> {
    v.and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .map(str::to_string)
        .collect()
}

/// A device holds media when it says `Inserted`, or names an image
/// (some BMCs leave `Inserted` out).
fn holds_media(dev: &Value) -> bool {
    dev.get("Inserted")
        .and_then(Value::as_bool)
        .unwrap_or(false)
        || dev
            .get("Image")
            .and_then(Value::as_str)
            .is_some_and(|i| !i.is_empty())
}

/// The action's `target` as the device gives it, else where DSP0266 puts it.
fn media_target(path: &str, dev: &Value, action: &str) -> String {
    dev.pointer(&format!("/Actions/#VirtualMedia.{action}/target"))
        .and_then(Value::as_str)
        .map(str::to_string)
        .unwrap_or_else(|| {
            format!(
                "{}/Actions/VirtualMedia.{action}",
                path.trim_end_matches('/')
            )
        })
}

/// Where the service root says sessions are created; `None` without a
/// SessionService (then Basic is the only way in).
fn sessions_path(root: &Value) -> Option<String> {
    if let Some(p) = root
        .pointer("/Links/Sessions/@odata.id")
        .and_then(Value::as_str)
    {
        return Some(p.to_string());
    }
    root.get("SessionService")
        .map(|_| DEFAULT_SESSIONS.to_string())
}

/// Follow redirects (an alias system id, a trailing slash) only to the same
/// origin, so credentials never leave for another host.
fn same_origin_redirects() -> reqwest::redirect::Policy {
    reqwest::redirect::Policy::custom(|attempt| {
        let same = attempt
            .previous()
            .first()
            .is_some_and(|first| first.origin() == attempt.url().origin());
        if attempt.previous().len() > 5 {
            attempt.error("too many redirects")
        } else if same {
            attempt.follow()
        } else {
            attempt.stop()
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn power_actions_map_to_rufio_reset_types() {
        assert_eq!(reset_type(PowerAction::On), Some("On"));
        assert_eq!(reset_type(PowerAction::Off), Some("ForceOff"));
        assert_eq!(reset_type(PowerAction::Soft), Some("GracefulShutdown"));
        assert_eq!(reset_type(PowerAction::Reset), Some("ForceRestart"));
        assert_eq!(reset_type(PowerAction::Cycle), Some("PowerCycle"));
        assert_eq!(reset_type(PowerAction::Status), None);
        assert_eq!(resulting_state(PowerAction::Cycle), PowerState::On);
        assert_eq!(resulting_state(PowerAction::Soft), PowerState::Off);
    }

    #[test]
    fn power_states() {
        assert_eq!(parse_power_state(Some("On")), PowerState::On);
        assert_eq!(parse_power_state(Some("Off")), PowerState::Off);
        assert_eq!(parse_power_state(Some("PoweringOn")), PowerState::Unknown);
        assert_eq!(parse_power_state(None), PowerState::Unknown);
    }

    #[test]
    fn boot_devices_map_to_override_targets() {
        assert_eq!(boot_target(BootDevice::Pxe), "Pxe");
        assert_eq!(boot_target(BootDevice::Disk), "Hdd");
        assert_eq!(boot_target(BootDevice::Bios), "BiosSetup");
        assert_eq!(boot_target(BootDevice::Cdrom), "Cd");
    }

    #[test]
    fn boot_mode_only_when_it_changes() {
        assert!(!mode_needs_setting(Some("UEFI"), true));
        assert!(!mode_needs_setting(Some("legacy"), false));
        assert!(mode_needs_setting(Some("UEFI"), false));
        assert!(mode_needs_setting(Some("Legacy"), true));
        // Not reported: not supported, so not sent.
        assert!(!mode_needs_setting(None, true));
        assert!(!mode_needs_setting(None, false));
    }

    #[test]
    fn boot_patch_bodies() {
        assert_eq!(
            boot_patch(BootDevice::Pxe, false, true, true),
            json!({"Boot": {"BootSourceOverrideTarget": "Pxe",
                "BootSourceOverrideEnabled": "Once", "BootSourceOverrideMode": "UEFI"}})
        );
        assert_eq!(
            boot_patch(BootDevice::Disk, true, false, true),
            json!({"Boot": {"BootSourceOverrideTarget": "Hdd",
                "BootSourceOverrideEnabled": "Continuous", "BootSourceOverrideMode": "Legacy"}})
        );
        assert_eq!(
            boot_patch(BootDevice::Cdrom, true, true, false),
            json!({"Boot": {"BootSourceOverrideTarget": "Cd",
                "BootSourceOverrideEnabled": "Continuous"}})
        );
    }

    #[test]
    fn virtual_media_devices() {
        let cd = json!({
            "MediaTypes": ["CD", "DVD"],
            "Inserted": false,
            "Image": "",
            "Actions": {"#VirtualMedia.InsertMedia": {"target": "/redfish/v1/Systems/s/VirtualMedia/Cd/Actions/VirtualMedia.InsertMedia"}}
        });
        assert!(!holds_media(&cd));
        assert!(holds_media(&json!({"Inserted": true})));
        assert!(holds_media(&json!({"Image": "http://x/a.iso"})));
        assert_eq!(
            media_target("/redfish/v1/Systems/s/VirtualMedia/Cd", &cd, "InsertMedia"),
            "/redfish/v1/Systems/s/VirtualMedia/Cd/Actions/VirtualMedia.InsertMedia"
        );
        assert_eq!(
            media_target("/redfish/v1/Managers/1/VirtualMedia/2/", &cd, "EjectMedia"),
            "/redfish/v1/Managers/1/VirtualMedia/2/Actions/VirtualMedia.EjectMedia"
        );
        assert_eq!(
            odata_ids(Some(
                &json!([{"@odata.id": "/a"}, {"x": 1}, {"@odata.id": "/b"}])
            )),
            ["/a", "/b"]
        );
        assert_eq!(odata_strings(cd.get("MediaTypes")), ["CD", "DVD"]);
    }

    #[test]
    fn error_body_extended_info_messages() {
        let body = br#"{"error": {"code": "Base.1.8.GeneralError", "message": "A general error",
            "@Message.ExtendedInfo": [
                {"MessageId": "Base.1.8.PropertyValueNotInList",
                 "Message": "The value Foo for the property BootSourceOverrideTarget is not in the list of acceptable values."},
                {"MessageId": "Base.1.8.Other", "Message": "Second\nline."},
                {"MessageId": "Base.1.8.Dup", "Message": "Second\nline."}
            ]}}"#;
        assert_eq!(
            error_message(body).as_deref(),
            Some(
                "The value Foo for the property BootSourceOverrideTarget is not in the list of \
                 acceptable values.; Second line."
            )
        );
    }

    #[test]
    fn error_body_fallbacks() {
        // sushy-emulator: ExtendedInfo without Message.
        let body =
            br#"{"error": {"code": "Base.1.0.GeneralError", "message": "401 Unauthorized: bad",
            "@Message.ExtendedInfo": [{"MessageId": "Base.1.0.GeneralError"}]}}"#;
        assert_eq!(
            error_message(body).as_deref(),
            Some("401 Unauthorized: bad")
        );
        // Top-level ExtendedInfo (some BMCs answer so).
        let body = br#"{"@Message.ExtendedInfo": [{"Message": "Done."}]}"#;
        assert_eq!(error_message(body).as_deref(), Some("Done."));
        assert_eq!(
            error_message(b"PATCH only works for Boot\n").as_deref(),
            Some("PATCH only works for Boot")
        );
        assert_eq!(error_message(b"<html><body>Bad</body></html>"), None);
        assert_eq!(error_message(b"  "), None);
        assert_eq!(error_message(br#"{"error": {}}"#), None);
        assert_eq!(error_message(br#"[1, 2]"#), None);
        assert_eq!(
            error_message(&[0xff, 0xfe, b'x']).as_deref(),
            Some("\u{fffd}\u{fffd}x")
        );
        let long = "x".repeat(1000);
        let m = error_message(long.as_bytes()).unwrap_or_default();
        assert_eq!(m.chars().count(), MAX_QUOTE + 1);
    }

    #[test]
    fn system_ids() {
        assert!(valid_system_id("System.Embedded.1"));
        assert!(valid_system_id("27946b59-9e44-4fa7-8e91-f3527a1ef094"));
        assert!(!valid_system_id("a/b"));
        assert!(!valid_system_id(".."));
        assert!(!valid_system_id("a b"));
        assert!(!valid_system_id("a?b"));
        assert!(!valid_system_id(""));
    }

    #[test]
    fn session_paths() {
        let root = json!({"SessionService": {"@odata.id": "/redfish/v1/SessionService"},
            "Links": {"Sessions": {"@odata.id": "/redfish/v1/Sessions"}}});
        assert_eq!(
            sessions_path(&root).as_deref(),
            Some("/redfish/v1/Sessions")
        );
        let root = json!({"SessionService": {"@odata.id": "/redfish/v1/SessionService"}});
        assert_eq!(sessions_path(&root).as_deref(), Some(DEFAULT_SESSIONS));
        assert_eq!(sessions_path(&json!({"Systems": {}})), None);
    }

    fn target() -> Target {
        Target {
            host: "bmc.example".into(),
            port: Some(8443),
            username: "u".into(),
            password: "p".into(),
            insecure_tls: false,
            plain_http: false,
            basic_auth: true,
            system: None,
            cipher_suite: 3,
            timeout: Duration::from_secs(1),
        }
    }

    #[test]
    fn urls_stay_on_the_bmc() {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let t = target();
        let conn = Conn {
            t: &t,
            http: reqwest::Client::new(),
            origin: "https://bmc.example:8443".into(),
            auth: Auth::Basic,
        };
        assert_eq!(
            conn.url("/redfish/v1/Systems"),
            "https://bmc.example:8443/redfish/v1/Systems"
        );
        assert_eq!(
            conn.url("https://evil.example/redfish/v1/SessionService/Sessions/1?x=1"),
            "https://bmc.example:8443/redfish/v1/SessionService/Sessions/1?x=1"
        );
    }
}
