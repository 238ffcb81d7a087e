//! A real `tinkerbox serve` process on loopback ports, driven through the
//! real CLI binary and `curl`. Every daemon is killed by PID on drop.

use serde_json::Value;
use std::io::Write;
use std::net::{SocketAddr, TcpListener, UdpSocket};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

pub const BIN: &str = env!("CARGO_BIN_EXE_tinkerbox");

pub fn compat_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/compat")
}

/// A free loopback port for a daemon or peer the test starts.
///
/// Asking the kernel for port 0 and releasing it raced: the kernel hands
/// the same ephemeral range to every outgoing connection (curl, the
/// agents, sqlx...), and one of them took the port before the daemon bound
/// it ("Address already in use", seen in CI). So ports come from below the
/// ephemeral range (net.ipv4.ip_local_port_range starts at 32768), at
/// random, and each is claimed across the concurrent test processes with
/// an flock on a file named after it, held until this process exits.
pub fn free_port() -> u16 {
    static HELD: std::sync::Mutex<Vec<std::fs::File>> = std::sync::Mutex::new(Vec::new());
    let dir = std::env::temp_dir().join("tinkerbox-test-ports");
    std::fs::create_dir_all(&dir).unwrap();
    for _ in 0..1000 {
        let port = 20000 + (rand_u32() % 12000) as u16;
        let f = std::fs::File::create(dir.join(port.to_string())).unwrap();
        // Another test process holds it: try another.
        if rustix::fs::flock(&f, rustix::fs::FlockOperation::NonBlockingLockExclusive).is_err() {
            continue;
        }
        if TcpListener::bind(("127.0.0.1", port)).is_ok()
            && UdpSocket::bind(("127.0.0.1", port)).is_ok()
        {
            HELD.lock().unwrap().push(f);
            return port;
        }
    }
    panic!("no free port in 20000-31999 after 1000 tries");
}

/// A random u32 from the kernel (no rand crate for one number).
pub fn rand_u32() -> u32 {
    let mut b = [0u8; 4];
    getrandom::fill(&mut b).unwrap();
    u32::from_ne_bytes(b)
}

pub struct Daemon {
    pub child: Option<Child>,
    pub dir: PathBuf,
    pub config: PathBuf,
    pub http: SocketAddr,
    pub api: SocketAddr,
    pub tink: SocketAddr,
    /// Run the daemon, the CLI and curl inside this network namespace.
    pub netns: Option<String>,
    _tmp: Option<tempfile::TempDir>,
}

/// Boot services off: most tests need only the API and HTTP listeners.
pub const NO_BOOT: &str =
    "[dhcp]\nmode = \"off\"\n[tftp]\nenabled = false\n[syslog]\nenabled = false\n";

/// How to configure a daemon under test.
#[derive(Default)]
pub struct Setup<'a> {
    /// Root keys (before any table).
    pub top: &'a str,
    /// Lines inside `[api]`.
    pub api: &'a str,
    /// Lines inside `[http]`.
    pub http: &'a str,
    /// `[dhcp]`, `[tftp]`, `[syslog]` tables; `NO_BOOT` when empty.
    pub boot: &'a str,
    pub netns: Option<&'a str>,
    /// Fixed listen addresses (inside a namespace, ports need not be probed).
    pub http_listen: Option<&'a str>,
    pub api_listen: Option<&'a str>,
    /// Lines inside `[tink]`.
    pub tink: &'a str,
}

impl Daemon {
    pub fn start() -> Daemon {
        Self::start_setup(Setup::default())
    }

    /// Start with extra lines inside the `[api]` table.
    pub fn start_with(api: &str) -> Daemon {
        Self::start_setup(Setup {
            api,
            ..Setup::default()
        })
    }

    pub fn start_setup(s: Setup) -> Daemon {
        let tmp = tempfile::tempdir().unwrap();
        let mut d = Self::prepare(tmp.path(), &s);
        d._tmp = Some(tmp);
        d.spawn();
        d
    }

    fn prepare(dir: &Path, s: &Setup) -> Daemon {
        let http: SocketAddr = s
            .http_listen
            .map(|a| a.parse().unwrap())
            .unwrap_or_else(|| format!("127.0.0.1:{}", free_port()).parse().unwrap());
        let api: SocketAddr = s
            .api_listen
            .map(|a| a.parse().unwrap())
            .unwrap_or_else(|| format!("127.0.0.1:{}", free_port()).parse().unwrap());
        // Tink's gRPC port: a free one, so that daemons run side by side.
        let tink: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
        let config = dir.join("tinkerbox.toml");
        let top = if s.top.contains("public_ip") {
            s.top.to_string()
        } else {
            format!("public_ip = \"127.0.0.1\"\n{}", s.top)
        };
        let boot = if s.boot.is_empty() { NO_BOOT } else { s.boot };
        let mut f = std::fs::File::create(&config).unwrap();
        write!(
            f,
            "state_dir = {:?}\n{top}\n[http]\nlisten = \"{http}\"\n{}\n[api]\nlisten = \"{api}\"\n{}\n[tink]\nlisten = \"{tink}\"\n{}\n{boot}\n",
            dir.join("state"),
            s.http,
            s.api,
            s.tink,
        )
        .unwrap();
        Daemon {
            child: None,
            dir: dir.to_path_buf(),
            config,
            http,
            api,
            tink,
            netns: s.netns.map(str::to_string),
            _tmp: None,
        }
    }

    /// A command, inside the daemon's namespace when it has one.
    pub fn command(&self, program: &str) -> Command {
        match &self.netns {
            Some(ns) => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", ns, program]);
                c
            }
            None => Command::new(program),
        }
    }

    pub fn spawn(&mut self) {
        assert!(self.child.is_none());
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join("daemon.log"))
            .unwrap();
        let child = self
            .command(BIN)
            .args(["--config", self.config.to_str().unwrap(), "serve"])
            .env_remove("TINKERBOX_SERVER")
            .env_remove("TINKERBOX_TOKEN")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        self.child = Some(child);
        self.wait_healthy();
    }

    fn wait_healthy(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            if let Some(Ok(Some(st))) = self.child.as_mut().map(|c| c.try_wait()) {
                panic!("daemon exited early with {st}: {}", self.log());
            }
            // curl runs in the daemon's namespace, if it has one.
            if self.curl(&["-sf", &self.url("/healthz")]).status.success() {
                return;
            }
            std::thread::sleep(Duration::from_millis(25));
        }
        panic!("daemon not healthy within 20s: {}", self.log());
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("daemon.log")).unwrap_or_default()
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.http)
    }

    pub fn api_url(&self, path: &str) -> String {
        format!("http://{}{path}", self.api)
    }

    pub fn token(&self) -> String {
        std::fs::read_to_string(self.dir.join("state/api-token"))
            .unwrap()
            .trim()
            .to_string()
    }

    /// The daemon's PID (`ip netns exec` execs it, so the child's own).
    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("running").id()
    }

    pub fn db_path(&self) -> PathBuf {
        self.dir.join("state/tinkerbox.db")
    }

    /// Stop with SIGKILL: nothing gets to flush.
    pub fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Stop with SIGTERM and wait (bounded) for a clean exit.
    pub fn stop(&mut self) -> std::process::ExitStatus {
        let mut c = self.child.take().expect("running");
        let _ = Command::new("kill")
            .args(["-TERM", &c.id().to_string()])
            .status();
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            if let Ok(Some(st)) = c.try_wait() {
                return st;
            }
            if Instant::now() > deadline {
                let _ = c.kill();
                let _ = c.wait();
                panic!("daemon ignored SIGTERM for 15s; its log:\n{}", self.log());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The CLI, pointed at this daemon through its config file.
    pub fn cli(&self, args: &[&str]) -> Output {
        self.cli_stdin(args, None)
    }

    pub fn cli_stdin(&self, args: &[&str], stdin: Option<&str>) -> Output {
        let mut cmd = self.command(BIN);
        cmd.args(["--config", self.config.to_str().unwrap()])
            .args(args)
            .env_remove("TINKERBOX_SERVER")
            .env_remove("TINKERBOX_TOKEN")
            .stdin(if stdin.is_some() {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = cmd.spawn().unwrap();
        if let Some(s) = stdin {
            child.stdin.take().unwrap().write_all(s.as_bytes()).unwrap();
        }
        child.wait_with_output().unwrap()
    }

    /// `cli`, asserting success; returns stdout.
    pub fn cli_ok(&self, args: &[&str]) -> String {
        let o = self.cli(args);
        assert!(
            o.status.success(),
            "tinkerbox {args:?} failed: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        String::from_utf8(o.stdout).unwrap()
    }

    /// The HTTP status code curl gets for `url` (a GET), as text ("000"
    /// when nothing answered).
    pub fn http_status(&self, url: &str) -> String {
        let o = self.curl(&["-s", "-o", "/dev/null", "-w", "%{http_code}", url]);
        String::from_utf8_lossy(&o.stdout).into_owned()
    }

    pub fn curl(&self, args: &[&str]) -> Output {
        self.command("curl")
            .args(["--max-time", "20"])
            .args(args)
            .output()
            .expect("curl")
    }

    /// An admin API call with the token: (status, JSON body).
    pub fn api(&self, method: &str, path: &str, body: Option<(&str, &[u8])>) -> (u16, Value) {
        self.api_with_token(method, path, body, Some(&self.token()))
    }

    pub fn api_with_token(
        &self,
        method: &str,
        path: &str,
        body: Option<(&str, &[u8])>,
        token: Option<&str>,
    ) -> (u16, Value) {
        let mut cmd = self.command("curl");
        cmd.args([
            "--max-time",
            "20",
            "-s",
            "-o",
            "-",
            "-w",
            "\n%{http_code}",
            "-X",
            method,
        ]);
        if let Some(t) = token {
            cmd.args(["-H", &format!("Authorization: Bearer {t}")]);
        }
        if let Some((ctype, _)) = body {
            cmd.args([
                "-H",
                &format!("Content-Type: {ctype}"),
                "--data-binary",
                "@-",
            ]);
            cmd.stdin(Stdio::piped());
        }
        cmd.arg(self.api_url(path))
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = cmd.spawn().unwrap();
        if let Some((_, data)) = body {
            let mut stdin = child.stdin.take().unwrap();
            // curl may stop reading early when the server answers 413.
            let _ = stdin.write_all(data);
        }
        let out = child.wait_with_output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout).to_string();
        let (body, code) = text.rsplit_once('\n').unwrap_or(("", &text));
        let code: u16 = code.trim().parse().unwrap_or(0);
        let v = serde_json::from_str(body).unwrap_or(Value::String(body.to_string()));
        (code, v)
    }

    /// Every Hardware as stored, via the API.
    pub fn all_hardware(&self) -> Vec<Value> {
        let (code, v) = self.api("GET", "/api/v1/hardware", None);
        assert_eq!(code, 200, "{v}");
        v["items"].as_array().unwrap().clone()
    }

    pub fn metric(&self, line_prefix: &str) -> f64 {
        let o = self.curl(&["-sf", &self.url("/metrics")]);
        let text = String::from_utf8_lossy(&o.stdout).to_string();
        text.lines()
            .find(|l| l.starts_with(line_prefix))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse().ok())
            .unwrap_or(0.0)
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        self.kill9();
    }
}

pub fn yaml_docs(text: &str) -> Vec<Value> {
    tinkerbox::hardware::parse_documents(text).unwrap()
}

pub fn write_file(dir: &Path, name: &str, text: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p
}

pub fn hw_doc(name: &str, mac: &str, ip: &str) -> String {
    format!(
        "apiVersion: tinkerbell.org/v1alpha1\nkind: Hardware\nmetadata:\n  name: {name}\n  namespace: default\nspec:\n  interfaces:\n  - dhcp:\n      mac: \"{mac}\"\n      ip:\n        address: {ip}\n        netmask: 255.255.255.0\n    netboot:\n      allowPXE: true\n"
    )
}

/// A self-signed P-256 leaf certificate for 127.0.0.1 (CN `cn`), made by
/// openssl: `CA:FALSE`, since rustls refuses a CA certificate used as an
/// end entity, and a client that does not trust it sees an unknown issuer.
pub fn self_signed_leaf(cert: &Path, key: &Path, cn: &str) {
    let o = std::process::Command::new("openssl")
        .args(["req", "-x509", "-newkey", "ec", "-pkeyopt"])
        .args(["ec_paramgen_curve:prime256v1", "-nodes", "-days", "2"])
        .args(["-subj", &format!("/CN={cn}")])
        .args(["-addext", "subjectAltName=IP:127.0.0.1"])
        .args(["-addext", "basicConstraints=critical,CA:FALSE"])
        .arg("-keyout")
        .arg(key)
        .arg("-out")
        .arg(cert)
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "openssl: {}",
        String::from_utf8_lossy(&o.stderr)
    );
}

/// The sushy-emulator (PyPI sushy-tools) binary, its venv made on first use
/// by `tests/bmc/sushy-venv`.
pub fn sushy_bin() -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let o = Command::new(root.join("tests/bmc/sushy-venv"))
        .output()
        .expect("run tests/bmc/sushy-venv");
    assert!(
        o.status.success(),
        "tests/bmc/sushy-venv failed: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    PathBuf::from(String::from_utf8_lossy(&o.stdout).trim())
}
