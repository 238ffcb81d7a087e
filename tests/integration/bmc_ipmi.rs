//! IPMI against ipmi_sim (OpenIPMI's BMC simulator) on a loopback UDP port:
//! tinkerbox's RMCP+ client (cipher suite 3) drives power and the boot
//! device; `ipmitool -I lanplus` reads the result back from the same
//! simulator, and the simulator's chassis control script records every
//! request that reached the "hardware". Debian packages: openipmi, ipmitool.

use std::net::UdpSocket;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use tinkerbox::bmc::ipmi::{self, BootOverride};
use tinkerbox::bmc::{BmcError, BootDevice, PowerAction, PowerState, Target};

const USER: &str = "admin";
const PASSWORD: &str = "tb-ipmi-Secret1";

/// The chassis control program ipmi_sim runs (`<prog> <mc> get|set ...`):
/// records each request, keeps power and boot device in files, and answers
/// `get power` / `get boot` from them. A soft shutdown powers off at once,
/// as an obliging OS would. With a file `lag` holding N, a power change
/// shows only N seconds after it was asked, as on a BMC that reports the old
/// state until the host has acted.
const CHASSIS_SCRIPT: &str = r#"#!/bin/sh
dir=$(dirname "$0")
echo "$*" >> "$dir/requests"
shift
op=$1
shift
case $op in
get)
    for p in "$@"; do
        case $p in
        power)
            if [ -f "$dir/pending" ]; then
                read -r v at < "$dir/pending"
                if [ "$(date +%s)" -ge "$at" ]; then echo "$v" > "$dir/power"; rm -f "$dir/pending"; fi
            fi
            echo "power:$(cat "$dir/power")" ;;
        boot) echo "boot:$(cat "$dir/boot")" ;;
        *) echo "Invalid parameter: $p"; exit 1 ;;
        esac
    done ;;
set)
    while [ $# -ge 2 ]; do
        case $1 in
        power)
            if [ -f "$dir/lag" ]; then
                echo "$2 $(( $(date +%s) + $(cat "$dir/lag") ))" > "$dir/pending"
            else
                echo "$2" > "$dir/power"
            fi ;;
        reset) ;;
        boot) echo "$2" > "$dir/boot" ;;
        shutdown) echo 0 > "$dir/power" ;;
        *) echo "Invalid parameter: $1"; exit 1 ;;
        esac
        shift 2
    done ;;
*) exit 1 ;;
esac
"#;

/// One ipmi_sim on 127.0.0.1:`port`, killed by PID on drop.
pub(crate) struct Sim {
    child: Child,
    port: u16,
    dir: PathBuf,
    _tmp: tempfile::TempDir,
}

impl Sim {
    pub(crate) fn start() -> Sim {
        check_prerequisites();
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().to_path_buf();
        let port = free_udp_port();
        let script = dir.join("chassis");
        std::fs::write(&script, CHASSIS_SCRIPT).unwrap();
        std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .unwrap();
        std::fs::write(dir.join("power"), "0\n").unwrap();
        std::fs::write(dir.join("boot"), "none\n").unwrap();
        std::fs::write(dir.join("requests"), "").unwrap();
        // RMCP+ offers every cipher suite ipmi_sim knows (0-14, 3 among
        // them) at up to ADMINISTRATOR; the allowed_auths lines only concern
        // IPMI 1.5. User 3 may not go beyond USER.
        let lan_conf = format!(
            r#"name "tinkerbox-test"
set_working_mc 0x20
  startlan 1
    addr 127.0.0.1 {port}
    priv_limit admin
    allowed_auths_callback none
    allowed_auths_user md5
    allowed_auths_operator md5
    allowed_auths_admin md5
    guid a123456789abcdefa123456789abcdef
  endlan
  chassis_control "{script} 0x20"
  user 2 true "{USER}" "{PASSWORD}" admin 10 md5
  user 3 true "viewer" "{PASSWORD}" user 10 md5
"#,
            script = script.display()
        );
        std::fs::write(dir.join("lan.conf"), lan_conf).unwrap();
        std::fs::write(
            dir.join("bmc.emu"),
            "mc_setbmc 0x20\nmc_add 0x20 0 no-device-sdrs 0x23 9 8 0x9f 0x1291 0xf02\nmc_enable 0x20\n",
        )
        .unwrap();
        std::fs::create_dir(dir.join("state")).unwrap();
        let log = std::fs::File::create(dir.join("ipmi_sim.log")).unwrap();
        let child = Command::new("ipmi_sim")
            .arg("-c")
            .arg(dir.join("lan.conf"))
            .arg("-f")
            .arg(dir.join("bmc.emu"))
            .arg("-s")
            .arg(dir.join("state"))
            .arg("-n")
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("spawn ipmi_sim");
        let mut sim = Sim {
            child,
            port,
            dir,
            _tmp: tmp,
        };
        sim.wait_ready();
        sim
    }

    /// Until the simulator answers an RMCP presence ping (5 s at most).
    fn wait_ready(&mut self) {
        let socket = UdpSocket::bind("127.0.0.1:0").unwrap();
        socket.connect(("127.0.0.1", self.port)).unwrap();
        socket
            .set_read_timeout(Some(Duration::from_millis(100)))
            .unwrap();
        let ping = [
            0x06, 0x00, 0xFF, 0x06, 0, 0, 0x11, 0xBE, 0x80, 0x01, 0x00, 0x00,
        ];
        let deadline = Instant::now() + Duration::from_secs(5);
        let mut buf = [0u8; 64];
        while Instant::now() < deadline {
            if let Some(status) = self.child.try_wait().unwrap() {
                panic!("ipmi_sim exited ({status}): {}", self.log());
            }
            socket.send(&ping).ok();
            if socket.recv(&mut buf).is_ok() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("ipmi_sim did not answer within 5 s: {}", self.log());
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("ipmi_sim.log")).unwrap_or_default()
    }

    fn target(&self) -> Target {
        target(
            "127.0.0.1",
            self.port,
            USER,
            PASSWORD,
            Duration::from_secs(5),
        )
    }

    /// What the chassis control script was asked, one request a line
    /// (without the MC address).
    fn requests(&self) -> Vec<String> {
        std::fs::read_to_string(self.dir.join("requests"))
            .unwrap()
            .lines()
            .map(|l| l.split_once(' ').map_or(l, |(_, r)| r).to_string())
            .collect()
    }

    /// Only the requests that changed something.
    fn sets(&self) -> Vec<String> {
        self.requests()
            .into_iter()
            .filter(|r| r.starts_with("set "))
            .collect()
    }

    fn clear_requests(&self) {
        std::fs::write(self.dir.join("requests"), "").unwrap();
    }

    pub(crate) fn power_file(&self) -> String {
        std::fs::read_to_string(self.dir.join("power"))
            .unwrap()
            .trim()
            .to_string()
    }

    /// `ipmitool -I lanplus ... -C 3 <args>` against this simulator; the
    /// password goes through the environment, not the command line.
    fn ipmitool(&self, args: &[&str]) -> String {
        let port = self.port.to_string();
        let mut cmd = Command::new("ipmitool");
        cmd.args([
            "-I",
            "lanplus",
            "-H",
            "127.0.0.1",
            "-p",
            &port,
            "-U",
            USER,
            "-E",
        ])
        .args(["-C", "3", "-N", "1", "-R", "3"])
        .args(args)
        .env("IPMI_PASSWORD", PASSWORD);
        let (ok, out) = run_bounded(cmd, Duration::from_secs(20));
        assert!(ok, "ipmitool {args:?} failed: {out}");
        out
    }

    fn ipmitool_power(&self) -> String {
        self.ipmitool(&["chassis", "power", "status"])
            .trim()
            .to_string()
    }

    /// The number of active sessions, as Get Session Info reports it from
    /// ipmitool's own session.
    fn active_sessions(&self) -> usize {
        let out = self.ipmitool(&["session", "info", "active"]);
        out.lines()
            .find_map(|l| l.strip_prefix("active sessions"))
            .and_then(|v| v.trim().trim_start_matches(':').trim().parse().ok())
            .unwrap_or_else(|| panic!("no session count in: {out}"))
    }
}

impl Drop for Sim {
    fn drop(&mut self) {
        let pid = self.child.id().to_string();
        Command::new("kill").arg(&pid).status().ok();
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        self.child.kill().ok();
        self.child.wait().ok();
    }
}

fn have(program: &str) -> bool {
    let path = std::env::var("PATH").unwrap_or_default();
    path.split(':')
        .chain(["/usr/sbin", "/sbin"])
        .any(|dir| Path::new(dir).join(program).is_file())
}

fn check_prerequisites() {
    for (program, package) in [("ipmi_sim", "openipmi"), ("ipmitool", "ipmitool")] {
        assert!(
            have(program),
            "{program} not found: apt-get install {package} (tests/deps)"
        );
    }
}

/// A UDP port nothing listens on (bound then released).
fn free_udp_port() -> u16 {
    UdpSocket::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Runs `cmd` and gives up (killing it) after `limit`: (success, stdout+stderr).
fn run_bounded(mut cmd: Command, limit: Duration) -> (bool, String) {
    let dir = tempfile::tempdir().unwrap();
    let out_path = dir.path().join("out");
    let out = std::fs::File::create(&out_path).unwrap();
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(out.try_clone().unwrap())
        .stderr(out)
        .spawn()
        .expect("spawn");
    let deadline = Instant::now() + limit;
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break Some(status);
        }
        if Instant::now() >= deadline {
            child.kill().ok();
            child.wait().ok();
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let text = std::fs::read_to_string(&out_path).unwrap_or_default();
    (status.is_some_and(|s| s.success()), text)
}

fn target(host: &str, port: u16, user: &str, password: &str, timeout: Duration) -> Target {
    Target {
        host: host.to_string(),
        port: Some(port),
        username: user.to_string(),
        password: password.to_string(),
        insecure_tls: false,
        plain_http: false,
        basic_auth: false,
        system: None,
        cipher_suite: 3,
        timeout,
    }
}

fn block_on<F: std::future::Future>(f: F) -> F::Output {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
        .block_on(f)
}

fn power(t: &Target, action: PowerAction) -> Result<PowerState, BmcError> {
    block_on(ipmi::power(t, action))
}

/// Polls `f` every 100 ms for up to `limit`.
fn eventually(limit: Duration, what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        if f() {
            return;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    panic!("not within {limit:?}: {what}");
}

#[test]
fn ipmi_power_on_off_status() {
    let sim = Sim::start();
    let t = sim.target();

    assert_eq!(power(&t, PowerAction::Status).unwrap(), PowerState::Off);
    assert_eq!(sim.ipmitool_power(), "Chassis Power is off");
    assert!(
        sim.sets().is_empty(),
        "status changed something: {:?}",
        sim.sets()
    );

    assert_eq!(power(&t, PowerAction::On).unwrap(), PowerState::On);
    assert_eq!(sim.sets(), ["set power 1"]);
    assert_eq!(sim.power_file(), "1");
    assert_eq!(sim.ipmitool_power(), "Chassis Power is on");
    assert_eq!(power(&t, PowerAction::Status).unwrap(), PowerState::On);

    sim.clear_requests();
    assert_eq!(power(&t, PowerAction::Off).unwrap(), PowerState::Off);
    assert_eq!(sim.sets(), ["set power 0"]);
    assert_eq!(sim.ipmitool_power(), "Chassis Power is off");

    // Every session was closed: only ipmitool's own is active.
    assert_eq!(sim.active_sessions(), 1);
}

#[test]
fn ipmi_power_cycle_reset_soft() {
    let sim = Sim::start();
    let t = sim.target();
    assert_eq!(power(&t, PowerAction::On).unwrap(), PowerState::On);

    // Cycle: ipmi_sim powers off now and on again a second later; the
    // state read right after the action is whatever the BMC says then.
    sim.clear_requests();
    let state = power(&t, PowerAction::Cycle).unwrap();
    assert_ne!(state, PowerState::Unknown);
    eventually(Duration::from_secs(5), "power back on after cycle", || {
        sim.sets() == ["set power 0", "set power 1"]
    });
    assert_eq!(sim.ipmitool_power(), "Chassis Power is on");
    assert_eq!(power(&t, PowerAction::Status).unwrap(), PowerState::On);

    sim.clear_requests();
    assert_eq!(power(&t, PowerAction::Reset).unwrap(), PowerState::On);
    assert_eq!(sim.sets(), ["set reset 1"]);
    assert_eq!(sim.ipmitool_power(), "Chassis Power is on");

    sim.clear_requests();
    assert_eq!(power(&t, PowerAction::Soft).unwrap(), PowerState::Off);
    assert_eq!(sim.sets(), ["set shutdown 1"]);
    assert_eq!(sim.ipmitool_power(), "Chassis Power is off");
    assert_eq!(sim.active_sessions(), 1);
}

#[test]
fn ipmi_boot_device() {
    let sim = Sim::start();
    let t = sim.target();

    block_on(ipmi::set_boot_device(&t, BootDevice::Pxe, true, true)).unwrap();
    assert_eq!(sim.sets(), ["set boot pxe"]);
    let param = sim.ipmitool(&["chassis", "bootparam", "get", "5"]);
    assert!(
        param.contains("Boot Device Selector : Force PXE"),
        "ipmitool: {param}"
    );
    // ipmi_sim keeps only the device selector: valid, persistent and EFI
    // bits are not stored (their encoding is covered by the unit tests).
    assert_eq!(
        block_on(ipmi::boot_device(&t)).unwrap(),
        BootOverride {
            valid: false,
            device: Some(BootDevice::Pxe),
            persistent: false,
            efi: false
        }
    );

    for (dev, script, ipmitool) in [
        (
            BootDevice::Disk,
            "default",
            "Force Boot from default Hard-Drive",
        ),
        (BootDevice::Cdrom, "cdrom", "Force Boot from CD/DVD"),
        (BootDevice::Bios, "bios", "Force Boot into BIOS Setup"),
    ] {
        sim.clear_requests();
        block_on(ipmi::set_boot_device(&t, dev, false, false)).unwrap();
        assert_eq!(sim.sets(), [format!("set boot {script}")], "{dev:?}");
        let param = sim.ipmitool(&["chassis", "bootparam", "get", "5"]);
        assert!(param.contains(ipmitool), "{dev:?}: {param}");
        assert_eq!(block_on(ipmi::boot_device(&t)).unwrap().device, Some(dev));
    }
    assert_eq!(sim.active_sessions(), 1);
}

#[test]
fn ipmi_wrong_credentials_are_auth_errors() {
    let sim = Sim::start();
    let started = Instant::now();
    let t = target(
        "127.0.0.1",
        sim.port,
        USER,
        "not-the-password",
        Duration::from_secs(5),
    );
    match power(&t, PowerAction::On) {
        Err(BmcError::Auth(m)) => assert!(m.contains("wrong password"), "{m}"),
        other => panic!("expected an authentication error, got {other:?}"),
    }
    let e = power(&t, PowerAction::Status).unwrap_err();
    assert!(
        !e.to_string().contains("not-the-password"),
        "the password leaked into the error: {e}"
    );

    let t = target(
        "127.0.0.1",
        sim.port,
        "nobody",
        PASSWORD,
        Duration::from_secs(5),
    );
    match power(&t, PowerAction::On) {
        Err(BmcError::Auth(m)) => assert!(m.contains("user name"), "{m}"),
        other => panic!("expected an authentication error, got {other:?}"),
    }

    // A USER-level account cannot open an ADMINISTRATOR session.
    let t = target(
        "127.0.0.1",
        sim.port,
        "viewer",
        PASSWORD,
        Duration::from_secs(5),
    );
    assert!(
        matches!(power(&t, PowerAction::On), Err(BmcError::Auth(_))),
        "USER account"
    );

    // Refused at once, not after the timeout; nothing reached the chassis.
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
    assert!(sim.sets().is_empty(), "{:?}", sim.sets());
    assert_eq!(sim.power_file(), "0");
}

#[test]
fn ipmi_unreachable_bmc_times_out() {
    check_prerequisites();
    let limit = Duration::from_millis(1500);
    let bounded = |started: Instant| {
        let took = started.elapsed();
        assert!(
            // The upper bound only tells one timeout from a hang or a
            // retry loop: a loaded 2-core CI machine adds seconds of delay.
            took >= limit - Duration::from_millis(100) && took < limit * 3,
            "took {took:?} for a {limit:?} timeout"
        );
    };

    // Nothing listens: the kernel answers with ICMP port unreachable.
    let port = free_udp_port();
    let t = target("127.0.0.1", port, USER, PASSWORD, limit);
    let started = Instant::now();
    match power(&t, PowerAction::Status) {
        Err(BmcError::Timeout(at, d)) => {
            assert_eq!(at, format!("127.0.0.1:{port}"));
            assert_eq!(d, limit);
        }
        other => panic!("expected a timeout, got {other:?}"),
    }
    bounded(started);

    // A black hole: datagrams arrive and nobody answers.
    let hole = UdpSocket::bind("127.0.0.1:0").unwrap();
    let port = hole.local_addr().unwrap().port();
    let t = target("127.0.0.1", port, USER, PASSWORD, limit);
    let started = Instant::now();
    let result = block_on(ipmi::set_boot_device(&t, BootDevice::Pxe, false, false));
    assert!(
        matches!(result, Err(BmcError::Timeout(..))),
        "expected a timeout, got {result:?}"
    );
    bounded(started);
    // The client resent its probe rather than waiting on one datagram.
    hole.set_nonblocking(true).unwrap();
    let mut buf = [0u8; 512];
    let mut tries = 0;
    while hole.recv(&mut buf).is_ok() {
        tries += 1;
    }
    assert!(tries >= 2, "{tries} datagram(s) sent in {limit:?}");
}

/// Rufio's documents for the simulator: its credentials' Secret and a BMC
/// Machine `ipmi-1` that reaches it over IPMI only.
pub(crate) fn machine_docs(sim: &Sim) -> String {
    format!(
        "apiVersion: v1\nkind: Secret\nmetadata: {{name: ipmi-creds}}\ndata: {{username: YWRtaW4=, password: \"{}\"}}\n---\napiVersion: bmc.tinkerbell.org/v1alpha1\nkind: Machine\nmetadata: {{name: ipmi-1}}\nspec:\n  connection:\n    host: 127.0.0.1\n    port: {}\n    insecureTLS: false\n    authSecretRef: {{name: ipmi-creds}}\n    providerOptions: {{preferredOrder: [ipmitool], ipmitool: {{cipherSuite: \"3\"}}}}\n",
        base64_of(PASSWORD),
        sim.port
    )
}

/// The same simulator driven through the daemon: Rufio documents applied
/// with the CLI, power and boot device as jobs, answered over IPMI.
#[test]
fn ipmi_jobs_through_the_daemon() {
    check_prerequisites();
    let sim = Sim::start();
    let d = crate::common::Daemon::start();
    let docs = machine_docs(&sim);
    let f = crate::common::write_file(&d.dir, "ipmi.yaml", &docs);
    d.cli_ok(&["bmc", "apply", "-f", f.to_str().unwrap()]);
    assert_eq!(
        d.cli_ok(&["bmc", "power", "ipmi-1", "on"]),
        "power on via ipmi: power is on\n"
    );
    assert_eq!(sim.power_file(), "1");
    assert_eq!(
        d.cli_ok(&["bmc", "power", "ipmi-1", "off"]),
        "power off via ipmi: power is off\n"
    );
    assert_eq!(sim.ipmitool_power(), "Chassis Power is off");
    assert_eq!(
        d.cli_ok(&["bmc", "bootdev", "ipmi-1", "pxe"]),
        "boot device pxe (once) via ipmi\n"
    );
    assert!(
        sim.sets()
            .iter()
            .any(|s| s.contains("boot") && s.contains("pxe")),
        "{:?}",
        sim.sets()
    );
    assert!(d.cli_ok(&["bmc", "get", "ipmi-1"]).contains(" off "));
    // A wrong password: the job fails at once (no retries), clearly.
    let bad = docs.replace(&base64_of(PASSWORD), &base64_of("wrong-password"));
    let f = crate::common::write_file(&d.dir, "bad.yaml", &bad);
    d.cli_ok(&["bmc", "apply", "-f", f.to_str().unwrap()]);
    let o = d.cli(&["bmc", "power", "ipmi-1", "status"]);
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("authentication failed") && !err.contains("wrong-password"),
        "{err}"
    );
}

/// A BMC that accepts a power change and reports it only later: the job's
/// task completes once power reads back as asked, and the Machine's status
/// says so (kubectl get machines, in kube mode), not the state of the
/// moment the command was accepted.
#[test]
fn a_power_task_completes_once_the_bmc_reports_the_change() {
    check_prerequisites();
    let sim = Sim::start();
    std::fs::write(sim.dir.join("lag"), "2\n").unwrap();
    let d = crate::common::Daemon::start();
    let docs = machine_docs(&sim);
    let f = crate::common::write_file(&d.dir, "ipmi.yaml", &docs);
    d.cli_ok(&["bmc", "apply", "-f", f.to_str().unwrap()]);
    assert_eq!(
        d.cli_ok(&["bmc", "power", "ipmi-1", "on"]),
        "power on via ipmi: power is on\n"
    );
    assert!(d.cli_ok(&["bmc", "get", "ipmi-1"]).contains(" on "));
    assert_eq!(
        d.cli_ok(&["bmc", "power", "ipmi-1", "off"]),
        "power off via ipmi: power is off\n"
    );
    let get = d.cli_ok(&["bmc", "get", "ipmi-1"]);
    assert!(get.contains(" off "), "{get}");
    // Asked once each: waiting for the state is reading it, not asking again.
    let sets = sim.sets();
    assert_eq!(
        sets.iter().filter(|s| s.contains("power")).count(),
        2,
        "{sets:?}"
    );
}

fn base64_of(s: &str) -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(s)
}
