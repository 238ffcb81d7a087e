//! The Redfish client against a real peer: sushy-emulator --fake (PyPI
//! sushy-tools, installed once by tests/bmc/sushy-venv) over plain HTTP and
//! over TLS with a self-signed certificate, with htpasswd Basic auth. sushy
//! has no SessionService, so session auth runs through a small proxy in
//! front of it that adds one (and records what the client sent).
//!
//! sushy's fake driver applies a power change 1–11 s after the request, so
//! the power tests poll the state, each wait bounded.

use crate::common::{free_port, self_signed_leaf, sushy_bin};
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderValue, Method, StatusCode, header};
use axum::response::Response;
use serde_json::{Value, json};
use std::collections::HashSet;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tinkerbox::bmc::{BmcError, BootDevice, PowerAction, PowerState, Target, redfish};

const USER: &str = "admin";
const PASS: &str = "s3cret-Redfish";
/// The fake driver's one system (its name, "fake", redirects here).
const FAKE_UUID: &str = "27946b59-9e44-4fa7-8e91-f3527a1ef094";
const SESSIONS: &str = "/redfish/v1/SessionService/Sessions";
/// The ETag the proxy gives systems when it wants If-Match.
const ETAG: &str = "W/\"tb-etag-1\"";
/// Longer than sushy's longest power delay (11 s).
const POWER_WAIT: Duration = Duration::from_secs(25);

fn init() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

#[derive(Default, Clone, Copy)]
struct Opts {
    /// htpasswd (bcrypt) Basic auth for USER/PASS.
    auth: bool,
    /// HTTPS with a fresh self-signed certificate for 127.0.0.1.
    tls: bool,
    /// Two fake systems instead of the default one.
    two_systems: bool,
}

/// sushy-emulator --fake on a loopback port, its state in its own temp dir,
/// killed by PID on drop.
struct Sushy {
    child: Child,
    port: u16,
    opts: Opts,
    /// Config, htpasswd, certificate, state and log.
    _dir: tempfile::TempDir,
}

impl Sushy {
    fn start(opts: Opts) -> Sushy {
        let bin = sushy_bin();
        let dir = tempfile::tempdir().unwrap();
        let d = &dir.path().to_path_buf();
        // The fake driver keeps state in sqlite under a state dir (default
        // $TMPDIR/sushy-emulator): one per emulator, or parallel tests share
        // a power state.
        let mut conf = format!("SUSHY_EMULATOR_STATE_DIR = {:?}\n", d.join("state"));
        if opts.auth {
            let python = bin.with_file_name("python");
            let o = Command::new(python)
                .args([
                    "-c",
                    "import bcrypt, sys; print(bcrypt.hashpw(sys.argv[1].encode(), bcrypt.gensalt(4)).decode())",
                    PASS,
                ])
                .output()
                .unwrap();
            assert!(
                o.status.success(),
                "bcrypt: {}",
                String::from_utf8_lossy(&o.stderr)
            );
            let hash = String::from_utf8_lossy(&o.stdout).trim().to_string();
            std::fs::write(d.join("htpasswd"), format!("{USER}:{hash}\n")).unwrap();
            conf += &format!("SUSHY_EMULATOR_AUTH_FILE = {:?}\n", d.join("htpasswd"));
        }
        if opts.two_systems {
            conf += r#"SUSHY_EMULATOR_FAKE_SYSTEMS = [
    {"uuid": "11111111-1111-4111-8111-111111111111", "name": "alpha", "power_state": "Off", "nics": []},
    {"uuid": "22222222-2222-4222-8222-222222222222", "name": "beta", "power_state": "Off", "nics": []},
]
"#;
        }
        std::fs::write(d.join("sushy.conf"), conf).unwrap();
        let mut tls_args: Vec<String> = Vec::new();
        if opts.tls {
            // A BMC's self-signed leaf: what rustls sees is an unknown issuer.
            self_signed_leaf(&d.join("cert.pem"), &d.join("key.pem"), "127.0.0.1");
            tls_args = vec![
                "--ssl-certificate".into(),
                d.join("cert.pem").display().to_string(),
                "--ssl-key".into(),
                d.join("key.pem").display().to_string(),
            ];
        }
        // A free port can be taken between probe and bind: try a few.
        let scheme = if opts.tls { "https" } else { "http" };
        for _ in 0..3 {
            let port = free_port();
            let log = std::fs::File::create(d.join("sushy.log")).unwrap();
            let mut child = Command::new(&bin)
                .arg("--config")
                .arg(d.join("sushy.conf"))
                .args(["--fake", "-i", "127.0.0.1", "-p", &port.to_string()])
                .args(&tls_args)
                .env("TMPDIR", d)
                .stdin(Stdio::null())
                .stdout(log.try_clone().unwrap())
                .stderr(log)
                .spawn()
                .unwrap();
            let url = format!("{scheme}://127.0.0.1:{port}");
            let deadline = Instant::now() + Duration::from_secs(30);
            while Instant::now() < deadline {
                if curl_get(&url, opts.auth, "/redfish/v1/").0 == 200 {
                    return Sushy {
                        child,
                        port,
                        opts,
                        _dir: dir,
                    };
                }
                if child.try_wait().ok().flatten().is_some() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            let _ = child.kill();
            let _ = child.wait();
            let log = std::fs::read_to_string(d.join("sushy.log")).unwrap_or_default();
            eprintln!("sushy-emulator on port {port} did not come up:\n{log}");
        }
        panic!("sushy-emulator did not start (see the logs above)");
    }

    fn url(&self) -> String {
        let scheme = if self.opts.tls { "https" } else { "http" };
        format!("{scheme}://127.0.0.1:{}", self.port)
    }

    /// GET with curl, straight to the emulator: (status, JSON body).
    fn curl(&self, path: &str) -> (u16, Value) {
        curl_get(&self.url(), self.opts.auth, path)
    }

    fn system(&self, id: &str) -> Value {
        let (code, v) = self.curl(&format!("/redfish/v1/Systems/{id}"));
        assert_eq!(code, 200, "GET system {id}: {v}");
        v
    }

    fn target(&self) -> Target {
        Target {
            host: "127.0.0.1".into(),
            port: Some(self.port),
            username: USER.into(),
            password: PASS.into(),
            insecure_tls: false,
            plain_http: !self.opts.tls,
            basic_auth: true,
            system: None,
            cipher_suite: 3,
            timeout: Duration::from_secs(5),
        }
    }
}

impl Drop for Sushy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// GET with curl: (status, JSON body); status 0 when nothing answered.
fn curl_get(base: &str, auth: bool, path: &str) -> (u16, Value) {
    let mut c = Command::new("curl");
    c.args(["-sk", "--max-time", "5", "-w", "\n%{http_code}"]);
    if auth {
        c.args(["-u", &format!("{USER}:{PASS}")]);
    }
    let Ok(o) = c.arg(format!("{base}{path}")).output() else {
        return (0, Value::Null);
    };
    let out = String::from_utf8_lossy(&o.stdout);
    let (body, code) = out.rsplit_once('\n').unwrap_or(("", "0"));
    (
        code.trim().parse().unwrap_or(0),
        serde_json::from_str(body).unwrap_or(Value::Null),
    )
}

/// Poll `status` until it reads `want`, at most POWER_WAIT.
async fn wait_power(t: &Target, want: PowerState) {
    let start = Instant::now();
    let mut last = None;
    while start.elapsed() < POWER_WAIT {
        let s = redfish::power(t, PowerAction::Status).await;
        if matches!(s, Ok(st) if st == want) {
            return;
        }
        last = Some(s);
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    panic!("power state not {want:?} after {POWER_WAIT:?}: last {last:?}");
}

// ---------------------------------------------------------------------------
// A SessionService in front of sushy.

#[derive(Default)]
struct ProxyLog {
    /// (method, path, body) of every request.
    requests: Vec<(String, String, String)>,
    created: usize,
    deleted: usize,
    /// Requests that carried an Authorization header.
    basic: usize,
    tokens: HashSet<String>,
}

struct Proxy {
    upstream: String,
    /// Offer sessions (root links + SessionService/Sessions).
    sessions: bool,
    /// Answer 400 to a PATCH that sets BootSourceOverrideMode.
    reject_mode: bool,
    /// Advertise PowerCycle (and run it upstream as ForceRestart).
    power_cycle: bool,
    /// The service root too wants a session (against DSP0266, as some do).
    root_auth: bool,
    /// Give systems an ETag and answer 428 to a PATCH without If-Match.
    if_match: bool,
    /// Send USER/PASS upstream (Basic) for requests made with a session.
    upstream_basic: bool,
    http: reqwest::Client,
    log: Mutex<ProxyLog>,
}

impl Proxy {
    fn log(&self) -> std::sync::MutexGuard<'_, ProxyLog> {
        self.log.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn posted_resets(&self) -> Vec<String> {
        self.log()
            .requests
            .iter()
            .filter(|(m, p, _)| m == "POST" && p.ends_with("ComputerSystem.Reset"))
            .map(|(_, _, b)| {
                serde_json::from_str::<Value>(b).unwrap_or_default()["ResetType"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string()
            })
            .collect()
    }

    fn patches(&self) -> Vec<Value> {
        self.log()
            .requests
            .iter()
            .filter(|(m, _, _)| m == "PATCH")
            .map(|(_, _, b)| serde_json::from_str(b).unwrap_or_default())
            .collect()
    }
}

fn redfish_error(status: StatusCode, msg: &str) -> Response {
    let body = json!({"error": {"code": "Base.1.8.GeneralError",
        "message": "See @Message.ExtendedInfo",
        "@Message.ExtendedInfo": [{"MessageId": "Base.1.8.GeneralError", "Message": msg}]}});
    let mut r = Response::new(Body::from(body.to_string()));
    *r.status_mut() = status;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    r
}

async fn proxy_handler(State(p): State<Arc<Proxy>>, req: Request) -> Response {
    let (parts, body) = req.into_parts();
    let body = axum::body::to_bytes(body, 1 << 20)
        .await
        .unwrap_or_default();
    let path = parts.uri.path().to_string();
    let norm = path.trim_end_matches('/').to_string();
    let pq = parts
        .uri
        .path_and_query()
        .map(|x| x.as_str().to_string())
        .unwrap_or_else(|| path.clone());
    let has_basic = parts.headers.contains_key(header::AUTHORIZATION);
    let token = parts
        .headers
        .get("x-auth-token")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let token_ok = {
        let mut log = p.log();
        log.requests.push((
            parts.method.to_string(),
            path.clone(),
            String::from_utf8_lossy(&body).into_owned(),
        ));
        if has_basic {
            log.basic += 1;
        }
        token.as_ref().is_some_and(|t| log.tokens.contains(t))
    };
    if p.root_auth && norm == "/redfish/v1" && !has_basic && !token_ok {
        return redfish_error(StatusCode::UNAUTHORIZED, "Log in first.");
    }
    if p.sessions {
        if parts.method == Method::POST && norm == SESSIONS {
            let v: Value = serde_json::from_slice(&body).unwrap_or_default();
            if v["UserName"] != USER || v["Password"] != PASS {
                return redfish_error(StatusCode::UNAUTHORIZED, "Invalid username or password.");
            }
            let mut log = p.log();
            log.created += 1;
            let n = log.created;
            log.tokens.insert(format!("tok-{n}"));
            let mut r = Response::new(Body::from(
                json!({"@odata.id": format!("{SESSIONS}/{n}"), "Id": n.to_string(), "UserName": USER})
                    .to_string(),
            ));
            *r.status_mut() = StatusCode::CREATED;
            let h = r.headers_mut();
            h.insert(
                "x-auth-token",
                HeaderValue::from_str(&format!("tok-{n}")).unwrap(),
            );
            h.insert(
                header::LOCATION,
                HeaderValue::from_str(&format!("{SESSIONS}/{n}")).unwrap(),
            );
            return r;
        }
        if parts.method == Method::DELETE && norm.starts_with(&format!("{SESSIONS}/")) {
            let id = norm.rsplit('/').next().unwrap_or_default();
            let mut log = p.log();
            return match &token {
                Some(t) if token_ok && *t == format!("tok-{id}") => {
                    log.tokens.remove(t);
                    log.deleted += 1;
                    let mut r = Response::new(Body::empty());
                    *r.status_mut() = StatusCode::NO_CONTENT;
                    r
                }
                _ => redfish_error(StatusCode::UNAUTHORIZED, "No such session."),
            };
        }
        if norm != "/redfish/v1" && !has_basic && !token_ok {
            return redfish_error(StatusCode::UNAUTHORIZED, "No valid session.");
        }
    }
    if p.reject_mode
        && parts.method == Method::PATCH
        && String::from_utf8_lossy(&body).contains("BootSourceOverrideMode")
    {
        return redfish_error(
            StatusCode::BAD_REQUEST,
            "The property BootSourceOverrideMode is not a known property.",
        );
    }
    if p.if_match
        && parts.method == Method::PATCH
        && parts.headers.get(header::IF_MATCH).map(|v| v.as_bytes()) != Some(ETAG.as_bytes())
    {
        return redfish_error(
            StatusCode::PRECONDITION_REQUIRED,
            "An If-Match header with the resource's ETag is required.",
        );
    }
    let mut body = body.to_vec();
    if p.power_cycle && parts.method == Method::POST && norm.ends_with("ComputerSystem.Reset") {
        let v: Value = serde_json::from_slice(&body).unwrap_or_default();
        if v["ResetType"] == "PowerCycle" {
            body = json!({"ResetType": "ForceRestart"})
                .to_string()
                .into_bytes();
        }
    }
    let mut up = p
        .http
        .request(parts.method.clone(), format!("{}{pq}", p.upstream))
        .body(body);
    if let Some(ct) = parts.headers.get(header::CONTENT_TYPE) {
        up = up.header(header::CONTENT_TYPE, ct.clone());
    }
    if let Some(a) = parts.headers.get(header::AUTHORIZATION) {
        up = up.header(header::AUTHORIZATION, a.clone());
    } else if token_ok && p.upstream_basic {
        up = up.basic_auth(USER, Some(PASS));
    }
    let resp = match up.send().await {
        Ok(r) => r,
        Err(e) => return redfish_error(StatusCode::BAD_GATEWAY, &e.to_string()),
    };
    let status = resp.status();
    let headers = resp.headers().clone();
    let mut bytes = resp.bytes().await.unwrap_or_default().to_vec();
    if parts.method == Method::GET
        && status.is_success()
        && let Ok(mut v) = serde_json::from_slice::<Value>(&bytes)
    {
        let mut changed = false;
        if p.sessions && norm == "/redfish/v1" {
            v["SessionService"] = json!({"@odata.id": "/redfish/v1/SessionService"});
            v["Links"] = json!({"Sessions": {"@odata.id": SESSIONS}});
            changed = true;
        }
        if p.power_cycle
            && let Some(list) = v
                .pointer_mut("/Actions/#ComputerSystem.Reset/ResetType@Redfish.AllowableValues")
                .and_then(Value::as_array_mut)
        {
            list.push(json!("PowerCycle"));
            changed = true;
        }
        if changed {
            bytes = v.to_string().into_bytes();
        }
    }
    let mut r = Response::new(Body::from(bytes));
    *r.status_mut() = status;
    for name in [header::CONTENT_TYPE, header::LOCATION] {
        if let Some(v) = headers.get(&name) {
            r.headers_mut().insert(name, v.clone());
        }
    }
    if p.if_match && parts.method == Method::GET && norm.starts_with("/redfish/v1/Systems/") {
        r.headers_mut()
            .insert(header::ETAG, HeaderValue::from_static(ETAG));
    }
    r
}

#[derive(Default, Clone, Copy)]
struct ProxyOpts {
    sessions: bool,
    reject_mode: bool,
    power_cycle: bool,
    root_auth: bool,
    if_match: bool,
}

/// Serve the proxy on a loopback port for the rest of the test's runtime.
async fn start_proxy(sushy: &Sushy, o: ProxyOpts) -> (Arc<Proxy>, u16) {
    assert!(!sushy.opts.tls, "the proxy talks plain HTTP upstream");
    let p = Arc::new(Proxy {
        upstream: sushy.url(),
        sessions: o.sessions,
        reject_mode: o.reject_mode,
        power_cycle: o.power_cycle,
        root_auth: o.root_auth,
        if_match: o.if_match,
        upstream_basic: sushy.opts.auth,
        http: reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .no_proxy()
            .timeout(Duration::from_secs(10))
            .build()
            .unwrap(),
        log: Mutex::new(ProxyLog::default()),
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let app = axum::Router::new()
        .fallback(proxy_handler)
        .with_state(p.clone());
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    (p, port)
}

fn proxied(sushy: &Sushy, port: u16, basic_auth: bool) -> Target {
    Target {
        port: Some(port),
        plain_http: true,
        basic_auth,
        ..sushy.target()
    }
}

// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn power_on_soft_and_status_over_http_basic() {
    init();
    let sushy = Sushy::start(Opts {
        auth: true,
        ..Opts::default()
    });
    let t = sushy.target();
    assert_eq!(
        redfish::power(&t, PowerAction::Status).await.unwrap(),
        PowerState::Off
    );

    assert_eq!(
        redfish::power(&t, PowerAction::On).await.unwrap(),
        PowerState::On
    );
    wait_power(&t, PowerState::On).await;
    assert_eq!(sushy.system(FAKE_UUID)["PowerState"], "On");
    // Already on: nothing to send, still On.
    assert_eq!(
        redfish::power(&t, PowerAction::On).await.unwrap(),
        PowerState::On
    );

    assert_eq!(
        redfish::power(&t, PowerAction::Soft).await.unwrap(),
        PowerState::Off
    );
    wait_power(&t, PowerState::Off).await;
    assert_eq!(sushy.system(FAKE_UUID)["PowerState"], "Off");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn power_off_and_reset_send_rufio_reset_types() {
    init();
    let sushy = Sushy::start(Opts {
        auth: true,
        ..Opts::default()
    });
    let (proxy, port) = start_proxy(&sushy, ProxyOpts::default()).await;
    let t = proxied(&sushy, port, true);

    redfish::power(&t, PowerAction::On).await.unwrap();
    wait_power(&t, PowerState::On).await;
    assert_eq!(
        redfish::power(&t, PowerAction::Off).await.unwrap(),
        PowerState::Off
    );
    wait_power(&t, PowerState::Off).await;
    assert_eq!(
        redfish::power(&t, PowerAction::Reset).await.unwrap(),
        PowerState::On
    );
    wait_power(&t, PowerState::On).await;
    assert_eq!(sushy.system(FAKE_UUID)["PowerState"], "On");
    assert_eq!(proxy.posted_resets(), ["On", "ForceOff", "ForceRestart"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn power_cycle_falls_back_to_forceoff_then_on() {
    init();
    let sushy = Sushy::start(Opts::default());
    let (proxy, port) = start_proxy(&sushy, ProxyOpts::default()).await;
    let t = proxied(&sushy, port, true);

    // sushy does not offer PowerCycle. An off machine is just started.
    assert_eq!(
        redfish::power(&t, PowerAction::Cycle).await.unwrap(),
        PowerState::On
    );
    assert_eq!(proxy.posted_resets(), ["On"]);
    wait_power(&t, PowerState::On).await;

    // An on machine: ForceOff, wait until it reads Off, then On.
    let start = Instant::now();
    assert_eq!(
        redfish::power(&t, PowerAction::Cycle).await.unwrap(),
        PowerState::On
    );
    eprintln!("cycle via ForceOff+On took {:?}", start.elapsed());
    assert_eq!(proxy.posted_resets(), ["On", "ForceOff", "On"]);
    wait_power(&t, PowerState::On).await;
    // Between the two resets the client saw the system off.
    let log = proxy.log();
    let (off_at, on_at) = {
        let resets: Vec<usize> = log
            .requests
            .iter()
            .enumerate()
            .filter(|(_, (m, p, _))| m == "POST" && p.ends_with("ComputerSystem.Reset"))
            .map(|(i, _)| i)
            .collect();
        (resets[1], resets[2])
    };
    assert!(
        log.requests[off_at + 1..on_at]
            .iter()
            .any(|(m, p, _)| m == "GET" && p.ends_with(FAKE_UUID)),
        "no state poll between ForceOff and On: {:?}",
        &log.requests[off_at..=on_at]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn power_cycle_uses_powercycle_when_offered() {
    init();
    let sushy = Sushy::start(Opts::default());
    let (proxy, port) = start_proxy(
        &sushy,
        ProxyOpts {
            power_cycle: true,
            ..ProxyOpts::default()
        },
    )
    .await;
    let t = proxied(&sushy, port, true);
    assert_eq!(
        redfish::power(&t, PowerAction::Cycle).await.unwrap(),
        PowerState::On
    );
    assert_eq!(proxy.posted_resets(), ["PowerCycle"]);
    wait_power(&t, PowerState::On).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn boot_override_over_sessions_visible_on_next_get() {
    init();
    let sushy = Sushy::start(Opts {
        auth: true,
        ..Opts::default()
    });
    let (proxy, port) = start_proxy(
        &sushy,
        ProxyOpts {
            sessions: true,
            ..ProxyOpts::default()
        },
    )
    .await;
    let t = proxied(&sushy, port, false);

    redfish::set_boot_device(&t, BootDevice::Pxe, true, true)
        .await
        .unwrap();
    assert_eq!(
        redfish::boot_override(&t).await.unwrap(),
        ("Pxe".into(), "Continuous".into(), Some("UEFI".into()))
    );
    let boot = &sushy.system(FAKE_UUID)["Boot"];
    assert_eq!(boot["BootSourceOverrideTarget"], "Pxe");
    assert_eq!(boot["BootSourceOverrideMode"], "UEFI");

    redfish::set_boot_device(&t, BootDevice::Disk, false, false)
        .await
        .unwrap();
    // sushy always reports Continuous (it ignores ...Enabled): what was sent
    // is checked on the proxy below.
    let (target, _, mode) = redfish::boot_override(&t).await.unwrap();
    assert_eq!((target.as_str(), mode.as_deref()), ("Hdd", Some("Legacy")));
    assert_eq!(
        sushy.system(FAKE_UUID)["Boot"]["BootSourceOverrideTarget"],
        "Hdd"
    );

    redfish::set_boot_device(&t, BootDevice::Bios, false, true)
        .await
        .unwrap();
    assert_eq!(redfish::boot_override(&t).await.unwrap().0, "BiosSetup");
    redfish::set_boot_device(&t, BootDevice::Cdrom, true, true)
        .await
        .unwrap();
    assert_eq!(redfish::boot_override(&t).await.unwrap().0, "Cd");
    assert_eq!(
        sushy.system(FAKE_UUID)["Boot"]["BootSourceOverrideTarget"],
        "Cd"
    );

    assert_eq!(
        proxy.patches(),
        [
            // sushy starts in UEFI mode: the mode is sent only when it changes.
            json!({"Boot": {"BootSourceOverrideTarget": "Pxe", "BootSourceOverrideEnabled": "Continuous"}}),
            json!({"Boot": {"BootSourceOverrideTarget": "Hdd", "BootSourceOverrideEnabled": "Once", "BootSourceOverrideMode": "Legacy"}}),
            json!({"Boot": {"BootSourceOverrideTarget": "BiosSetup", "BootSourceOverrideEnabled": "Once", "BootSourceOverrideMode": "UEFI"}}),
            json!({"Boot": {"BootSourceOverrideTarget": "Cd", "BootSourceOverrideEnabled": "Continuous"}}),
        ]
    );
    // Session auth: one session per call, each deleted; no Basic at all.
    let log = proxy.log();
    assert_eq!(log.created, 8, "{:?}", log.requests);
    assert_eq!(log.deleted, 8);
    assert!(log.tokens.is_empty());
    assert_eq!(log.basic, 0);
    assert!(
        !log.requests
            .iter()
            .any(|(_, _, b)| b.contains(PASS) && !b.contains("UserName")),
        "password outside the session login"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn boot_mode_refused_is_retried_without_it() {
    init();
    let sushy = Sushy::start(Opts::default());
    let (proxy, port) = start_proxy(
        &sushy,
        ProxyOpts {
            sessions: true,
            reject_mode: true,
            ..ProxyOpts::default()
        },
    )
    .await;
    let t = proxied(&sushy, port, false);
    // Legacy: sushy's system is in UEFI mode, so the mode is sent (and refused).
    redfish::set_boot_device(&t, BootDevice::Pxe, false, false)
        .await
        .unwrap();
    assert_eq!(
        proxy.patches(),
        [
            json!({"Boot": {"BootSourceOverrideTarget": "Pxe", "BootSourceOverrideEnabled": "Once", "BootSourceOverrideMode": "Legacy"}}),
            json!({"Boot": {"BootSourceOverrideTarget": "Pxe", "BootSourceOverrideEnabled": "Once"}}),
        ]
    );
    assert_eq!(redfish::boot_override(&t).await.unwrap().0, "Pxe");
    // An error that is not about the mode is reported, with the BMC's words.
    let (_, port2) = start_proxy(
        &sushy,
        ProxyOpts {
            sessions: true,
            ..ProxyOpts::default()
        },
    )
    .await;
    let t2 = Target {
        system: Some("no-such-system".into()),
        ..proxied(&sushy, port2, false)
    };
    match redfish::set_boot_device(&t2, BootDevice::Pxe, false, true).await {
        Err(BmcError::Protocol(m)) => {
            eprintln!("unknown system: {m}");
            assert!(m.contains("no system \"no-such-system\""), "{m}");
            assert!(m.contains(FAKE_UUID), "{m}");
        }
        other => panic!("expected a Protocol error, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn closed_service_root_and_if_match() {
    init();
    let sushy = Sushy::start(Opts {
        auth: true,
        ..Opts::default()
    });
    let (proxy, port) = start_proxy(
        &sushy,
        ProxyOpts {
            sessions: true,
            root_auth: true,
            if_match: true,
            ..ProxyOpts::default()
        },
    )
    .await;
    let t = proxied(&sushy, port, false);
    // The root answers 401 without a session: log in at the standard
    // sessions path first. The PATCH answered 428 is sent again with the
    // system's ETag.
    redfish::set_boot_device(&t, BootDevice::Disk, true, true)
        .await
        .unwrap();
    assert_eq!(
        sushy.system(FAKE_UUID)["Boot"]["BootSourceOverrideTarget"],
        "Hdd"
    );
    // (No mode: the system already reports UEFI.)
    let patch = json!({"Boot": {"BootSourceOverrideTarget": "Hdd",
        "BootSourceOverrideEnabled": "Continuous"}});
    assert_eq!(proxy.patches(), [patch.clone(), patch]);
    let log = proxy.log();
    assert_eq!((log.created, log.deleted, log.basic), (1, 1, 0));
    let first: Vec<_> = log
        .requests
        .iter()
        .take(3)
        .map(|(m, p, _)| format!("{m} {p}"))
        .collect();
    assert_eq!(
        first,
        [
            "GET /redfish/v1/",
            &format!("POST {SESSIONS}"),
            "GET /redfish/v1/"
        ]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn basic_and_session_auth_and_wrong_passwords() {
    init();
    let sushy = Sushy::start(Opts {
        auth: true,
        ..Opts::default()
    });
    let good = sushy.target();
    let bad = Target {
        password: "wrong-password".into(),
        ..sushy.target()
    };
    // Basic.
    assert_eq!(
        redfish::power(&good, PowerAction::Status).await.unwrap(),
        PowerState::Off
    );
    match redfish::power(&bad, PowerAction::Status).await {
        Err(BmcError::Auth(m)) => {
            eprintln!("basic, wrong password: {m}");
            assert!(m.contains("rejected the user name or password"), "{m}");
            assert!(m.contains("401"), "{m}");
            assert!(!m.contains("wrong-password"), "{m}");
        }
        other => panic!("expected an Auth error, got {other:?}"),
    }
    // Session mode on sushy (no SessionService): falls back to Basic.
    let session = Target {
        basic_auth: false,
        ..good.clone()
    };
    assert_eq!(
        redfish::power(&session, PowerAction::Status).await.unwrap(),
        PowerState::Off
    );
    let session_bad = Target {
        basic_auth: false,
        ..bad.clone()
    };
    assert!(matches!(
        redfish::boot_override(&session_bad).await,
        Err(BmcError::Auth(_))
    ));
    // Real sessions (proxy): a wrong password fails the login.
    let (proxy, port) = start_proxy(
        &sushy,
        ProxyOpts {
            sessions: true,
            ..ProxyOpts::default()
        },
    )
    .await;
    let sess_good = proxied(&sushy, port, false);
    let sess_bad = Target {
        password: "wrong-password".into(),
        ..sess_good.clone()
    };
    assert_eq!(
        redfish::power(&sess_good, PowerAction::Status)
            .await
            .unwrap(),
        PowerState::Off
    );
    match redfish::power(&sess_bad, PowerAction::On).await {
        Err(BmcError::Auth(m)) => {
            eprintln!("session, wrong password: {m}");
            assert!(m.contains("Invalid username or password."), "{m}");
        }
        other => panic!("expected an Auth error, got {other:?}"),
    }
    let log = proxy.log();
    assert_eq!((log.created, log.deleted, log.basic), (1, 1, 0));
    assert!(
        !log.requests
            .iter()
            .any(|(m, p, _)| m == "POST" && p.contains("Reset"))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_self_signed_needs_insecure_tls() {
    init();
    let sushy = Sushy::start(Opts {
        auth: true,
        tls: true,
        ..Opts::default()
    });
    let strict = sushy.target();
    assert!(!strict.plain_http);
    let start = Instant::now();
    match redfish::power(&strict, PowerAction::Status).await {
        Err(BmcError::Protocol(m)) => {
            eprintln!("strict TLS: {m}");
            assert!(m.contains("TLS"), "{m}");
            assert!(m.contains("certificate"), "{m}");
            assert!(m.contains("insecure_tls"), "{m}");
            assert!(m.contains(&format!("127.0.0.1:{}", sushy.port)), "{m}");
        }
        other => panic!("expected a TLS error, got {other:?}"),
    }
    assert!(start.elapsed() < Duration::from_secs(5));

    let insecure = Target {
        insecure_tls: true,
        ..strict.clone()
    };
    assert_eq!(
        redfish::power(&insecure, PowerAction::Status)
            .await
            .unwrap(),
        PowerState::Off
    );
    redfish::set_boot_device(&insecure, BootDevice::Pxe, false, true)
        .await
        .unwrap();
    assert_eq!(redfish::boot_override(&insecure).await.unwrap().0, "Pxe");
    let (code, v) = sushy.curl(&format!("/redfish/v1/Systems/{FAKE_UUID}"));
    assert_eq!(code, 200);
    assert_eq!(v["Boot"]["BootSourceOverrideTarget"], "Pxe");
    redfish::power(&insecure, PowerAction::On).await.unwrap();
    wait_power(&insecure, PowerState::On).await;
    // Wrong password over TLS is still an Auth error.
    let bad = Target {
        password: "nope".into(),
        ..insecure.clone()
    };
    assert!(matches!(
        redfish::power(&bad, PowerAction::Status).await,
        Err(BmcError::Auth(_))
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn systems_chosen_by_id_or_alias() {
    init();
    let sushy = Sushy::start(Opts {
        two_systems: true,
        ..Opts::default()
    });
    let beta = "22222222-2222-4222-8222-222222222222";
    let alpha = "11111111-1111-4111-8111-111111111111";
    let t = Target {
        system: Some(beta.into()),
        ..sushy.target()
    };
    redfish::power(&t, PowerAction::On).await.unwrap();
    wait_power(&t, PowerState::On).await;
    assert_eq!(sushy.system(beta)["PowerState"], "On");
    assert_eq!(sushy.system(alpha)["PowerState"], "Off");
    // A name redirects (307) to the UUID on the same BMC: followed.
    let by_name = Target {
        system: Some("alpha".into()),
        ..sushy.target()
    };
    redfish::set_boot_device(&by_name, BootDevice::Cdrom, false, false)
        .await
        .unwrap();
    assert_eq!(
        sushy.system(alpha)["Boot"]["BootSourceOverrideTarget"],
        "Cd"
    );
    assert_ne!(sushy.system(beta)["Boot"]["BootSourceOverrideTarget"], "Cd");
    // No id: the first member, whichever sushy lists first.
    let (_, coll) = sushy.curl("/redfish/v1/Systems");
    let first = coll["Members"][0]["@odata.id"]
        .as_str()
        .unwrap()
        .to_string();
    let any = sushy.target();
    redfish::set_boot_device(&any, BootDevice::Bios, false, true)
        .await
        .unwrap();
    assert_eq!(
        sushy.curl(&first).1["Boot"]["BootSourceOverrideTarget"],
        "BiosSetup"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreachable_bmc_fails_within_the_timeout() {
    init();
    let timeout = Duration::from_secs(2);
    let base = Target {
        host: "127.0.0.1".into(),
        port: None,
        username: USER.into(),
        password: PASS.into(),
        insecure_tls: false,
        plain_http: true,
        basic_auth: false,
        system: None,
        cipher_suite: 3,
        timeout,
    };
    // A closed port: refused at once, named.
    let closed = free_port();
    let t = Target {
        port: Some(closed),
        ..base.clone()
    };
    let start = Instant::now();
    match redfish::power(&t, PowerAction::Status).await {
        Err(BmcError::Protocol(m)) => {
            eprintln!("closed port: {m}");
            assert!(m.contains(&format!("127.0.0.1:{closed}")), "{m}");
            assert!(m.to_lowercase().contains("refused"), "{m}");
        }
        other => panic!("expected a Protocol error, got {other:?}"),
    }
    assert!(start.elapsed() < timeout, "{:?}", start.elapsed());

    // A port that accepts but never answers (HTTP and TLS): a Timeout.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = silent.local_addr().unwrap().port();
    for plain_http in [true, false] {
        let t = Target {
            port: Some(port),
            plain_http,
            ..base.clone()
        };
        let start = Instant::now();
        let r = redfish::set_boot_device(&t, BootDevice::Pxe, false, true).await;
        let took = start.elapsed();
        match r {
            Err(e @ BmcError::Timeout(..)) => {
                eprintln!("silent port: {e}");
                let BmcError::Timeout(host, d) = e else {
                    unreachable!()
                };
                assert!(host.contains(&format!("127.0.0.1:{port}")), "{host}");
                assert_eq!(d, timeout);
            }
            other => panic!("expected a Timeout, got {other:?}"),
        }
        assert!(
            took >= timeout && took < timeout + Duration::from_secs(2),
            "{took:?}"
        );
    }
    drop(silent);
}
