//! DHCP on a real (virtual) wire: `tinkerbox serve` inside a network
//! namespace whose bridge br0 holds 10.99.0.1/24, and real clients in other
//! namespaces joined to br0 by veths (tests/lab/lib.sh): busybox udhcpc,
//! ISC dhclient, dnsmasq as the site's own DHCP server beside a proxy, and a
//! small python3 client for hand-built packets (NAK, PXE, relay agent).
//!
//! Needs root (namespaces) and the Debian packages busybox-static,
//! isc-dhcp-client, dnsmasq-base, python3, iproute2 and curl. Every lab is
//! named after the test process's PID and torn down on drop, panics included.

use crate::common::{Daemon, Setup};
use crate::netns::{self, Ran, in_ns, poll, run, run_ok};
use serde_json::{Value, json};
use std::fs::File;
use std::net::Ipv4Addr;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

pub(crate) const SERVER: &str = "10.99.0.1";
/// The lab network's bridge address, as lab_up wants it.
/// Fixed inside the lab namespace (nothing else listens there).
const HTTP_LISTEN: &str = "127.0.0.1:7080";
const API_LISTEN: &str = "127.0.0.1:7081";

// DHCP message types (RFC 2132 9.6).
pub(crate) const DISCOVER: u8 = 1;
pub(crate) const OFFER: u8 = 2;
pub(crate) const REQUEST: u8 = 3;
pub(crate) const ACK: u8 = 5;
pub(crate) const NAK: u8 = 6;

pub(crate) const PXE_CLASS: &str = "PXEClient:Arch:00000:UNDI:002001";

// ---------------------------------------------------------------------------
// Processes: every wait bounded, every process stopped by PID.

/// A long-running helper (dnsmasq), stopped by PID on drop: SIGTERM, then
/// SIGKILL after 5 s.
struct Background {
    child: Child,
    log: PathBuf,
}

impl Background {
    fn spawn(mut cmd: Command, log: PathBuf) -> Background {
        let f = File::create(&log).unwrap();
        let child = cmd
            .stdin(Stdio::null())
            .stdout(f.try_clone().unwrap())
            .stderr(f)
            .spawn()
            .unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
        Background { child, log }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Wait (bounded) for `needle` in the log; panic if the process exits.
    fn wait_log(&mut self, needle: &str, limit: Duration) {
        let deadline = Instant::now() + limit;
        while !self.log().contains(needle) {
            if let Ok(Some(st)) = self.child.try_wait() {
                panic!(
                    "exited with {st} before logging {needle:?}:\n{}",
                    self.log()
                );
            }
            assert!(
                Instant::now() < deadline,
                "no {needle:?} within {limit:?}:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Background {
    fn drop(&mut self) {
        stop_pid(self.child.id());
        let _ = self.child.wait();
    }
}

fn pid_alive(pid: u32) -> bool {
    // A zombie has given up its sockets: count it as gone.
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => stat
            .rsplit_once(')')
            .is_some_and(|(_, rest)| !rest.trim_start().starts_with('Z')),
        Err(_) => false,
    }
}

/// SIGTERM, up to 5 s grace, SIGKILL.
fn stop_pid(pid: u32) {
    let signal = |sig: &str| {
        let _ = Command::new("kill")
            .args([sig, &pid.to_string()])
            .stderr(Stdio::null())
            .status();
    };
    signal("-TERM");
    let deadline = Instant::now() + Duration::from_secs(5);
    while pid_alive(pid) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    if pid_alive(pid) {
        signal("-KILL");
    }
}

// ---------------------------------------------------------------------------
// The lab: namespaces from tests/lab/lib.sh, removed on drop.

fn check_prerequisites() {
    netns::require(
        "DHCP",
        &[
            ("ip", "iproute2"),
            ("busybox", "busybox-static"),
            ("dhclient", "isc-dhcp-client"),
            ("dnsmasq", "dnsmasq-base"),
            ("python3", "python3"),
            ("curl", "curl"),
        ],
    );
}

netns::lab_newtype!(
    /// The namespace lab (`tb-TAG-PID`, see [`netns::Lab`]) with the DHCP
    /// tests' own helpers.
    Lab
);

impl Lab {
    fn new(tag: &str) -> Lab {
        check_prerequisites();
        Lab(netns::Lab::new("tb", tag))
    }

    /// An executable shell script in the lab's directory.
    fn script(&self, name: &str, body: &str) -> PathBuf {
        let p = self.path(name);
        std::fs::write(&p, body).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
        p
    }

    /// A second way out of the lab namespace, as on a host whose management
    /// NIC holds the default route: a veth `up0` (not on br0) with `cidr`,
    /// into a namespace `ROLE-TAG-PID` holding `gateway`, the default route.
    fn uplink(&mut self, role: &str, cidr: &str, gateway: &str) {
        let ns = self.own(role);
        let prefix = cidr.split_once('/').unwrap().1;
        let gw_cidr = format!("{gateway}/{prefix}");
        let (lab, up) = (self.ns.as_str(), ns.as_str());
        for args in [
            &["netns", "add", up][..],
            &[
                "-n", lab, "link", "add", "up0", "type", "veth", "peer", "name", "eth0", "netns",
                up,
            ],
            &["-n", lab, "addr", "add", cidr, "dev", "up0"],
            &["-n", up, "addr", "add", &gw_cidr, "dev", "eth0"],
            &["-n", lab, "link", "set", "up0", "up"],
            &["-n", up, "link", "set", "eth0", "up"],
            &["-n", lab, "route", "add", "default", "via", gateway],
        ] {
            let mut c = Command::new("ip");
            c.args(args);
            run_ok(c, Duration::from_secs(10));
        }
    }

    /// tinkerbox in the lab namespace, DHCP on br0 in `mode`.
    fn tinkerbox(&self, mode: &str) -> Daemon {
        self.tinkerbox_on(mode, Some("br0"))
    }

    /// tinkerbox in the lab namespace; `[dhcp] interface` unset when None.
    fn tinkerbox_on(&self, mode: &str, interface: Option<&str>) -> Daemon {
        let interface = interface
            .map(|i| format!("interface = \"{i}\"\n"))
            .unwrap_or_default();
        self.tinkerbox_dhcp(&format!("mode = \"{mode}\"\n{interface}"))
    }

    /// tinkerbox in the lab namespace with these lines in `[dhcp]`.
    fn tinkerbox_dhcp(&self, dhcp: &str) -> Daemon {
        let boot = format!(
            "[dhcp]\nlisten = \"0.0.0.0:67\"\n{dhcp}\
             [tftp]\nenabled = false\n[syslog]\nenabled = false\n"
        );
        Daemon::start_setup(Setup {
            top: "public_ip = \"10.99.0.1\"",
            boot: &boot,
            netns: Some(&self.ns),
            http_listen: Some(HTTP_LISTEN),
            api_listen: Some(API_LISTEN),
            ..Setup::default()
        })
    }
}

// ---------------------------------------------------------------------------
// Hardware, events, metrics.

pub(crate) fn hardware(name: &str, mac: &str, ip: &str) -> String {
    format!(
        "apiVersion: tinkerbell.org/v1alpha1
kind: Hardware
metadata:
  name: {name}
  namespace: default
spec:
  interfaces:
  - dhcp:
      mac: \"{mac}\"
      hostname: {name}-host
      domain_name: lab.example
      lease_time: 1800
      name_servers: [10.99.0.53, 10.99.0.54]
      arch: x86_64
      ip:
        address: {ip}
        netmask: 255.255.255.0
        gateway: 10.99.0.1
    netboot:
      allowPXE: true
      allowWorkflow: true
"
    )
}

fn apply(d: &Daemon, lab: &Lab, name: &str, mac: &str, ip: &str) {
    let f = lab.path(&format!("{name}.yaml"));
    std::fs::write(&f, hardware(name, mac, ip)).unwrap();
    d.cli_ok(&["hardware", "apply", "-f", f.to_str().unwrap()]);
}

fn events_json(d: &Daemon, name: &str) -> Vec<Value> {
    let o = d.cli(&["events", name, "-o", "json"]);
    serde_json::from_slice::<Value>(&o.stdout)
        .ok()
        .and_then(|v| v.as_array().cloned())
        .unwrap_or_default()
}

/// Whether `e` is a `kind` event; a `dhcp.offer` may be folded into the
/// ACK that followed it (`offered_ms_before`, see `events::fold_offers`).
fn is_kind(e: &Value, kind: &str) -> bool {
    e["kind"] == kind
        || (kind == "dhcp.offer"
            && e["kind"] == "dhcp.ack"
            && e["fields"]["offered_ms_before"].is_u64())
}

/// The machine's events once every kind in `kinds` is there (events are
/// written in batches: poll, at most 10 s).
#[track_caller]
fn wait_events(d: &Daemon, name: &str, kinds: &[&str]) -> Vec<Value> {
    let mut last = vec![];
    let found = poll(Duration::from_secs(10), || {
        last = events_json(d, name);
        kinds
            .iter()
            .all(|k| last.iter().any(|e| is_kind(e, k)))
            .then(|| last.clone())
    });
    match found {
        Some(ev) => ev,
        None => panic!(
            "events of {name}: want {kinds:?}, have {:#}\ndaemon log:\n{}",
            Value::Array(last),
            d.log()
        ),
    }
}

/// A counter's value once it reaches `at_least` (the reply counter moves
/// just after the packet leaves; poll, at most 10 s).
#[track_caller]
pub(crate) fn wait_metric(d: &Daemon, series: &str, at_least: f64) -> f64 {
    let mut v = 0.0;
    match poll(Duration::from_secs(10), || {
        v = d.metric(series);
        (v >= at_least).then_some(v)
    }) {
        Some(v) => v,
        None => panic!("{series} = {v}, want >= {at_least}"),
    }
}

pub(crate) fn requests(kind: &str, mode: &str) -> String {
    format!("tinkerbox_dhcp_requests_total{{kind=\"{kind}\",mode=\"{mode}\"}}")
}

pub(crate) fn replies(kind: &str, mode: &str) -> String {
    format!("tinkerbox_dhcp_replies_total{{kind=\"{kind}\",mode=\"{mode}\"}}")
}

pub(crate) fn ignored(reason: &str) -> String {
    format!("tinkerbox_dhcp_ignored_total{{reason=\"{reason}\"}}")
}

const REPLY_SECONDS_COUNT: &str = "tinkerbox_dhcp_reply_seconds_count";

// ---------------------------------------------------------------------------
// Clients.

/// The variables a DHCP client hook got (lower-case names: `ip`, `opt58`,
/// `new_ip_address`...), from an `env` dump; the inherited ones are left out.
pub(crate) fn hook_env(path: &Path) -> std::collections::BTreeMap<String, String> {
    let text = std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("{}: {e} (the hook did not run)", path.display()));
    text.lines()
        .filter_map(|l| l.split_once('='))
        .filter(|(k, _)| {
            k.chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
                && k != &"_"
        })
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// A udhcpc hook that saves its environment to `udhcpc.<event>.env`.
fn udhcpc_script(lab: &Lab) -> PathBuf {
    let dir = lab.dir().display();
    lab.script(
        "udhcpc.sh",
        &format!("#!/bin/sh\nenv > \"{dir}/udhcpc.$1.env\"\nexit 0\n"),
    )
}

/// busybox udhcpc in `ns`: `-n -q`, `tries` DISCOVERs one second apart.
pub(crate) fn udhcpc(ns: &str, script: &Path, tries: u32, extra: &[&str]) -> Ran {
    let mut c = in_ns(ns, "busybox");
    c.args(["udhcpc", "-i", "eth0", "-n", "-q", "-f", "-T", "1"])
        .args(["-t", &tries.to_string(), "-s", script.to_str().unwrap()])
        .args(extra);
    run(c, Duration::from_secs(u64::from(tries) * 4 + 10))
}

/// A DHCP client for hand-built packets: sends one BOOTP/DHCP message and
/// prints, as JSON, the replies with its xid and chaddr that arrive within
/// `wait` seconds (stopping after `count`), each with the address it was
/// sent to (`dst`, from IP_PKTINFO). The spec (argv[1], JSON):
/// mac, type, xid, iface (SO_BINDTODEVICE), bind_ip/bind_port, to_ip/to_port,
/// broadcast, ciaddr, giaddr, hops, options [[code, hex]...], wait, count.
const PY_CLIENT: &str = r#"
import json, socket, struct, sys, time

spec = json.loads(sys.argv[1])
mac = bytes.fromhex(spec["mac"].replace(":", ""))
xid = spec["xid"]
addr = lambda a: socket.inet_aton(a or "0.0.0.0")
pkt = struct.pack("!BBBBIHH4s4s4s4s16s64s128s4s",
                  1, 1, 6, spec.get("hops", 0), xid, 0,
                  0x8000 if spec.get("broadcast") else 0,
                  addr(spec.get("ciaddr")), addr(None), addr(None),
                  addr(spec.get("giaddr")), mac.ljust(16, b"\0"),
                  b"", b"", b"\x63\x82\x53\x63")
pkt += bytes([53, 1, spec["type"]])
for code, value in spec.get("options", []):
    value = bytes.fromhex(value)
    pkt += bytes([code, len(value)]) + value
pkt = (pkt + b"\xff").ljust(300, b"\0")

s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.setsockopt(socket.SOL_SOCKET, socket.SO_BROADCAST, 1)
if spec.get("iface"):
    s.setsockopt(socket.SOL_SOCKET, getattr(socket, "SO_BINDTODEVICE", 25),
                 spec["iface"].encode())
s.setsockopt(socket.IPPROTO_IP, getattr(socket, "IP_PKTINFO", 8), 1)
s.bind((spec.get("bind_ip", "0.0.0.0"), spec.get("bind_port", 68)))
s.sendto(pkt, (spec["to_ip"], spec["to_port"]))

cstr = lambda b: b.split(b"\0", 1)[0].decode("latin-1")
replies = []
deadline = time.monotonic() + spec.get("wait", 3.0)
while len(replies) < spec.get("count", 1):
    left = deadline - time.monotonic()
    if left <= 0:
        break
    s.settimeout(left)
    try:
        data, anc, _, src = s.recvmsg(4096, socket.CMSG_SPACE(12))
    except socket.timeout:
        break
    # struct in_pktinfo: ifindex, local address, header destination address
    dst = [socket.inet_ntoa(d[8:12]) for _, _, d in anc if len(d) >= 12]
    if (len(data) < 240 or data[0] != 2 or data[236:240] != b"\x63\x82\x53\x63"
            or struct.unpack("!I", data[4:8])[0] != xid or data[28:34] != mac):
        continue
    opts, i = {}, 240
    while i + 1 < len(data) and data[i] != 255:
        if data[i] == 0:
            i += 1
            continue
        code, n = data[i], data[i + 1]
        opts[str(code)] = opts.get(str(code), "") + data[i + 2:i + 2 + n].hex()
        i += 2 + n
    replies.append({
        "src": "%s:%d" % src, "dst": dst[0] if dst else None,
        "len": len(data), "hops": data[3],
        "flags": struct.unpack("!H", data[10:12])[0],
        "ciaddr": socket.inet_ntoa(data[12:16]),
        "yiaddr": socket.inet_ntoa(data[16:20]),
        "siaddr": socket.inet_ntoa(data[20:24]),
        "giaddr": socket.inet_ntoa(data[24:28]),
        "sname": cstr(data[44:108]), "file": cstr(data[108:236]),
        "options": opts,
    })
print(json.dumps(replies))
"#;

fn next_xid() -> u32 {
    static N: AtomicU32 = AtomicU32::new(1);
    (std::process::id() << 12) ^ N.fetch_add(1, Ordering::Relaxed)
}

/// Send one packet from namespace `ns` with the python client (the spec's
/// xid is filled in); the replies it collected.
#[track_caller]
pub(crate) fn py_dhcp(ns: &str, mut spec: Value) -> Vec<Value> {
    spec["xid"] = json!(next_xid());
    let wait = spec["wait"].as_f64().unwrap_or(3.0);
    let mut c = in_ns(ns, "python3");
    c.args(["-c", PY_CLIENT, &spec.to_string()]);
    let r = run_ok(c, Duration::from_secs_f64(wait + 15.0));
    match serde_json::from_str(r.stdout.trim()) {
        Ok(Value::Array(v)) => v,
        _ => panic!("python client output: {}", r.describe()),
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// An option for the python client's spec.
pub(crate) fn opt(code: u8, value: &[u8]) -> Value {
    json!([code, hex(value)])
}

pub(crate) fn ip_bytes(ip: &str) -> [u8; 4] {
    ip.parse::<Ipv4Addr>().unwrap().octets()
}

/// A reply's option `code`, as bytes.
pub(crate) fn opt_of(reply: &Value, code: u8) -> Option<Vec<u8>> {
    let h = reply["options"][code.to_string()].as_str()?;
    (0..h.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&h[i..i + 2], 16).ok())
        .collect()
}

pub(crate) fn msg_type(reply: &Value) -> u8 {
    opt_of(reply, 53)
        .and_then(|t| t.first().copied())
        .unwrap_or(0)
}

pub(crate) fn server_id(reply: &Value) -> Option<Ipv4Addr> {
    let b: [u8; 4] = opt_of(reply, 54)?.try_into().ok()?;
    Some(Ipv4Addr::from(b))
}

// ---------------------------------------------------------------------------
// The tests.

/// busybox udhcpc (RFC 2131 DISCOVER/OFFER/REQUEST/ACK over broadcast) gets
/// exactly what the Hardware reserves, every option in its hook's terms.
#[test]
fn udhcpc_gets_the_reservation() {
    const MAC: &str = "02:00:00:99:00:21";
    let mut lab = Lab::new("udh");
    let client = lab.client("cl", MAC, None);
    let d = lab.tinkerbox("reservation");
    apply(&d, &lab, "m-udh", MAC, "10.99.0.21");
    let script = udhcpc_script(&lab);

    let r = udhcpc(&client, &script, 5, &[]);
    assert!(r.ok(), "udhcpc: {}\ndaemon log:\n{}", r.describe(), d.log());
    let env = hook_env(&lab.path("udhcpc.bound.env"));
    for (key, want) in [
        ("ip", "10.99.0.21"),
        ("subnet", "255.255.255.0"),
        ("mask", "24"),
        ("broadcast", "10.99.0.255"),
        ("router", "10.99.0.1"),
        ("dns", "10.99.0.53 10.99.0.54"),
        ("hostname", "m-udh-host"),
        ("domain", "lab.example"),
        ("lease", "1800"),
        ("serverid", SERVER),
        ("opt58", "00000384"), // T1 = lease / 2
        ("opt59", "00000627"), // T2 = lease * 7/8
    ] {
        assert_eq!(
            env.get(key).map(String::as_str),
            Some(want),
            "{key}: {env:?}"
        );
    }
    assert!(
        r.stderr
            .contains("lease of 10.99.0.21 obtained from 10.99.0.1"),
        "{}",
        r.stderr
    );

    let mode = "reservation";
    wait_metric(&d, &requests("discover", mode), 1.0);
    wait_metric(&d, &requests("request", mode), 1.0);
    wait_metric(&d, &replies("dhcp.offer", mode), 1.0);
    wait_metric(&d, &replies("dhcp.ack", mode), 1.0);
    wait_metric(&d, REPLY_SECONDS_COUNT, 2.0);
    assert_eq!(d.metric(&replies("dhcp.nak", mode)), 0.0);
    wait_events(&d, "m-udh", &["dhcp.offer", "dhcp.ack"]);
}

/// `[dhcp] threads = 3`: one `dhcp` thread reads the socket and two
/// `dhcp-helper` threads stand by for a backlog; clients asking at once
/// all get their reservations, each exchange whole.
#[test]
fn several_threads_share_the_socket() {
    let mut lab = Lab::new("thr");
    let clients: Vec<(String, String, String)> = (0..4)
        .map(|i| {
            let mac = format!("02:00:00:99:01:{:02x}", 0x30 + i);
            let ns = lab.client(&format!("c{i}"), &mac, None);
            (ns, mac, format!("10.99.0.{}", 130 + i))
        })
        .collect();
    let d = lab.tinkerbox_dhcp("mode = \"reservation\"\ninterface = \"br0\"\nthreads = 3\n");
    let threads = |name: &str| {
        std::fs::read_dir(format!("/proc/{}/task", d.pid()))
            .unwrap()
            .flatten()
            .filter(|t| {
                std::fs::read_to_string(t.path().join("comm")).is_ok_and(|c| c.trim() == name)
            })
            .count()
    };
    assert_eq!(
        (threads("dhcp"), threads("dhcp-helper")),
        (1, 2),
        "daemon log:\n{}",
        d.log()
    );
    for (i, (_, mac, ip)) in clients.iter().enumerate() {
        apply(&d, &lab, &format!("m-thr{i}"), mac, ip);
    }
    let script = udhcpc_script(&lab);
    let runs: Vec<_> = clients
        .iter()
        .map(|(ns, _, _)| {
            let (ns, script) = (ns.clone(), script.clone());
            std::thread::spawn(move || udhcpc(&ns, &script, 5, &[]))
        })
        .collect();
    for ((_, _, ip), run) in clients.iter().zip(runs) {
        let r = run.join().unwrap();
        assert!(r.ok(), "udhcpc: {}\ndaemon log:\n{}", r.describe(), d.log());
        assert!(
            r.stderr.contains(&format!("lease of {ip} obtained")),
            "{}",
            r.stderr
        );
    }
    for i in 0..clients.len() {
        wait_events(&d, &format!("m-thr{i}"), &["dhcp.offer", "dhcp.ack"]);
    }
}

/// ISC dhclient gets the reservation into its lease file, configures it,
/// then releases it; the machine's event log shows the whole exchange.
#[test]
fn dhclient_gets_the_reservation() {
    const MAC: &str = "02:00:00:99:00:22";
    let mut lab = Lab::new("dhc");
    let client = lab.client("cl", MAC, None);
    let d = lab.tinkerbox("reservation");
    apply(&d, &lab, "m-dhc", MAC, "10.99.0.22");

    // Our own config and hook: not Debian's, which rewrites /etc/resolv.conf.
    let conf = lab.path("dhclient.conf");
    std::fs::write(
        &conf,
        "request subnet-mask, broadcast-address, routers, domain-name,\n  \
         domain-name-servers, host-name, dhcp-lease-time;\n",
    )
    .unwrap();
    let hook = lab.script(
        "dhclient.sh",
        &format!(
            r#"#!/bin/sh
env > "{dir}/dhclient.$reason.env"
case "$reason" in
BOUND|RENEW|REBIND|REBOOT) ip addr add "$new_ip_address/$new_subnet_mask" dev "$interface" ;;
RELEASE|STOP|EXPIRE|FAIL) ip addr flush dev "$interface" ;;
esac
"#,
            dir = lab.dir().display()
        ),
    );
    let (lease, pidfile) = (lab.path("dhclient.leases"), lab.path("dhclient.pid"));
    let dhclient = |extra: &[&str]| {
        let mut c = in_ns(&client, "dhclient");
        c.args(extra)
            .arg("-v")
            .args(["-cf", conf.to_str().unwrap()])
            .args(["-lf", lease.to_str().unwrap()])
            .args(["-pf", pidfile.to_str().unwrap()])
            .args(["-sf", hook.to_str().unwrap(), "eth0"]);
        c
    };

    // -1: one try; it forks into the background once bound.
    let r = run(dhclient(&["-1"]), Duration::from_secs(40));
    assert!(
        r.ok(),
        "dhclient: {}\ndaemon log:\n{}",
        r.describe(),
        d.log()
    );
    assert!(
        r.stderr.contains("DHCPACK of 10.99.0.22 from 10.99.0.1"),
        "{}",
        r.stderr
    );
    let leases = std::fs::read_to_string(&lease).unwrap();
    for want in [
        "fixed-address 10.99.0.22;",
        "option subnet-mask 255.255.255.0;",
        "option broadcast-address 10.99.0.255;",
        "option routers 10.99.0.1;",
        "option domain-name-servers 10.99.0.53,10.99.0.54;",
        "option host-name \"m-dhc-host\";",
        "option domain-name \"lab.example\";",
        "option dhcp-lease-time 1800;",
        "option dhcp-server-identifier 10.99.0.1;",
        "option dhcp-message-type 5;",
    ] {
        assert!(
            leases.contains(want),
            "lease file lacks {want:?}:\n{leases}"
        );
    }
    let mut c = in_ns(&client, "ip");
    c.args(["-4", "-o", "addr", "show", "dev", "eth0"]);
    let addrs = run_ok(c, Duration::from_secs(10)).stdout;
    assert!(addrs.contains("inet 10.99.0.22/24"), "{addrs}");

    // dhclient -r: DHCPRELEASE to the server, and the bound dhclient (its
    // PID from the pid file) is stopped.
    let pid: u32 = std::fs::read_to_string(&pidfile)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert!(
        pid_alive(pid),
        "dhclient {pid} is not running after binding"
    );
    let r = run(dhclient(&["-r"]), Duration::from_secs(30));
    assert!(r.ok(), "dhclient -r: {}", r.describe());
    assert!(
        r.stderr.contains("DHCPRELEASE of 10.99.0.22"),
        "{}",
        r.stderr
    );
    if poll(Duration::from_secs(5), || (!pid_alive(pid)).then_some(())).is_none() {
        stop_pid(pid);
        panic!("dhclient -r left dhclient {pid} running");
    }

    let ev = wait_events(&d, "m-dhc", &["dhcp.offer", "dhcp.ack", "dhcp.release"]);
    let release = ev.iter().find(|e| e["kind"] == "dhcp.release").unwrap();
    assert!(
        release["message"].as_str().unwrap().contains("10.99.0.22"),
        "{release}"
    );
    // The table the CLI prints by default names them too.
    let out = d.cli_ok(&["events", "m-dhc"]);
    let kinds: Vec<&str> = out
        .lines()
        .skip(1)
        .filter_map(|l| l.split_whitespace().nth(1))
        .collect();
    for k in ["hardware.created", "dhcp.ack", "dhcp.release"] {
        assert!(kinds.contains(&k), "{k} not in\n{out}");
    }
    // The OFFER: a row of its own, or folded into its ACK's.
    assert!(
        kinds.contains(&"dhcp.offer") || out.contains("(offered "),
        "no OFFER in\n{out}"
    );
    wait_metric(&d, &requests("release", "reservation"), 1.0);
    wait_metric(&d, &replies("dhcp.ack", "reservation"), 1.0);
}

/// A MAC that no Hardware has gets no answer at all, and the reason is
/// counted.
#[test]
fn unknown_mac_gets_nothing() {
    let mut lab = Lab::new("unk");
    let client = lab.client("cl", "02:00:00:99:00:66", None);
    let d = lab.tinkerbox("reservation");
    // The inventory is not empty: a neighbour is known.
    apply(&d, &lab, "m-unk", "02:00:00:99:00:23", "10.99.0.23");
    let script = udhcpc_script(&lab);
    assert_eq!(d.metric(&ignored("unknown_mac")), 0.0);

    let t0 = Instant::now();
    let r = udhcpc(&client, &script, 2, &[]);
    assert!(r.status.is_some(), "udhcpc hung: {}", r.describe());
    assert!(!r.ok(), "udhcpc got a lease: {}", r.describe());
    assert!(r.stderr.contains("no lease"), "{}", r.stderr);
    assert!(t0.elapsed() < Duration::from_secs(15), "{:?}", t0.elapsed());
    assert!(!lab.path("udhcpc.bound.env").exists());

    // Two DISCOVERs, both ignored as unknown; nothing sent.
    wait_metric(&d, &ignored("unknown_mac"), 2.0);
    assert!(d.metric(&requests("discover", "reservation")) >= 2.0);
    assert_eq!(d.metric(&replies("dhcp.offer", "reservation")), 0.0);
    // The latency histogram counts replies only.
    assert_eq!(d.metric(REPLY_SECONDS_COUNT), 0.0);
}

/// RFC 2131 4.3.2: an INIT-REBOOT REQUEST for another address gets a NAK
/// (broadcast), one for the reserved address an ACK, one naming another
/// server is left alone; a RENEWING client (ciaddr, unicast) gets its ACK
/// unicast.
#[test]
fn wrong_request_gets_nak() {
    const MAC: &str = "02:00:00:99:00:24";
    let mut lab = Lab::new("nak");
    let client = lab.client("cl", MAC, None);
    let d = lab.tinkerbox("reservation");
    apply(&d, &lab, "m-nak", MAC, "10.99.0.24");
    let request = |options: Vec<Value>, wait: f64| {
        py_dhcp(
            &client,
            json!({
                "mac": MAC, "type": REQUEST, "iface": "eth0",
                "to_ip": "255.255.255.255", "to_port": 67,
                "options": options, "wait": wait,
            }),
        )
    };

    let r = request(vec![opt(50, &ip_bytes("10.99.0.99"))], 3.0);
    assert_eq!(r.len(), 1, "{r:?}\ndaemon log:\n{}", d.log());
    let nak = &r[0];
    assert_eq!(msg_type(nak), NAK, "{nak}");
    assert_eq!(nak["src"], "10.99.0.1:67", "{nak}");
    assert_eq!(nak["dst"], "255.255.255.255", "{nak}");
    assert_eq!(server_id(nak), Some(SERVER.parse().unwrap()), "{nak}");
    assert_eq!(nak["yiaddr"], "0.0.0.0", "{nak}");
    assert_eq!(opt_of(nak, 51), None, "a NAK carries no lease: {nak}");
    let text = String::from_utf8(opt_of(nak, 56).unwrap_or_default()).unwrap();
    assert!(
        text.contains("10.99.0.99") && text.contains("10.99.0.24"),
        "{text:?}"
    );

    let r = request(vec![opt(50, &ip_bytes("10.99.0.24"))], 3.0);
    assert_eq!(r.len(), 1, "{r:?}");
    let ack = &r[0];
    assert_eq!(msg_type(ack), ACK, "{ack}");
    assert_eq!(ack["yiaddr"], "10.99.0.24", "{ack}");
    assert_eq!(ack["dst"], "255.255.255.255", "no address yet: {ack}");
    assert_eq!(
        opt_of(ack, 51),
        Some(1800u32.to_be_bytes().to_vec()),
        "{ack}"
    );
    assert_eq!(opt_of(ack, 1), Some(vec![255, 255, 255, 0]), "{ack}");

    // SELECTING a different server's offer: not ours to answer (no NAK).
    let r = request(
        vec![
            opt(50, &ip_bytes("10.99.0.24")),
            opt(54, &ip_bytes("10.99.0.2")),
        ],
        1.0,
    );
    assert!(r.is_empty(), "answered a REQUEST for another server: {r:?}");

    // RENEWING: the client has the address and asks the server directly.
    let mut c = in_ns(&client, "ip");
    c.args(["addr", "add", "10.99.0.24/24", "dev", "eth0"]);
    run_ok(c, Duration::from_secs(10));
    let r = py_dhcp(
        &client,
        json!({
            "mac": MAC, "type": REQUEST, "ciaddr": "10.99.0.24",
            "bind_ip": "10.99.0.24", "to_ip": SERVER, "to_port": 67,
        }),
    );
    assert_eq!(r.len(), 1, "{r:?}\ndaemon log:\n{}", d.log());
    assert_eq!(msg_type(&r[0]), ACK, "{}", r[0]);
    assert_eq!(r[0]["yiaddr"], "10.99.0.24", "{}", r[0]);
    assert_eq!(r[0]["dst"], "10.99.0.24", "unicast to ciaddr: {}", r[0]);

    let mode = "reservation";
    wait_metric(&d, &requests("request", mode), 4.0);
    wait_metric(&d, &replies("dhcp.nak", mode), 1.0);
    wait_metric(&d, &replies("dhcp.ack", mode), 2.0);
    wait_metric(&d, &ignored("other_server"), 1.0);
    let ev = wait_events(&d, "m-nak", &["dhcp.nak", "dhcp.ack"]);
    let nak = ev.iter().find(|e| e["kind"] == "dhcp.nak").unwrap();
    assert!(
        nak["fields"]["reason"]
            .as_str()
            .unwrap_or("")
            .contains("10.99.0.99"),
        "{nak}"
    );
}

/// Proxy mode beside the site's DHCP server (dnsmasq in its own namespace):
/// addresses come from dnsmasq only; tinkerbox adds a PXE offer without an
/// address for known machines, and answers the PXE REQUEST on port 4011.
/// auto-proxy answers unknown machines too.
#[test]
fn proxy_mode_beside_dnsmasq() {
    const KNOWN: &str = "02:00:00:99:00:25";
    const STRANGER: &str = "02:00:00:99:00:67";
    let mut lab = Lab::new("prx");
    let site = lab.client("dns", "02:00:00:99:00:02", Some("10.99.0.2/24"));
    let known = lab.client("cl", KNOWN, None);
    let stranger = lab.client("st", STRANGER, None);

    let mut dnsmasq = in_ns(&site, "dnsmasq");
    dnsmasq
        .args(["--no-daemon", "--conf-file=/dev/null", "--port=0"])
        .args([
            "--bind-interfaces",
            "--interface=eth0",
            "--except-interface=lo",
        ])
        .args(["--dhcp-range=10.99.0.100,10.99.0.150,1h", "--no-ping"])
        .arg(format!(
            "--dhcp-leasefile={}",
            lab.path("dnsmasq.leases").display()
        ))
        .args([
            "--pid-file=",
            "--user=root",
            "--log-dhcp",
            "--log-facility=-",
        ]);
    let mut dnsmasq = Background::spawn(dnsmasq, lab.path("dnsmasq.log"));
    dnsmasq.wait_log(
        "DHCP, IP range 10.99.0.100 -- 10.99.0.150",
        Duration::from_secs(10),
    );

    let mut d = lab.tinkerbox("proxy");
    // The reservation must not be handed out in proxy mode.
    apply(&d, &lab, "m-prx", KNOWN, "10.99.0.25");

    // A PXE-looking udhcpc of an unknown machine: its lease is dnsmasq's,
    // and tinkerbox counts the DISCOVER as unknown, unanswered. (udhcpc is
    // no PXE client: it takes the first OFFER, and would take a proxy offer
    // for a known MAC, with yiaddr 0.0.0.0, if it came first. Known MACs are
    // the python client's below, which sees every OFFER.)
    let script = udhcpc_script(&lab);
    let r = udhcpc(&stranger, &script, 5, &["-V", PXE_CLASS]);
    assert!(
        r.ok(),
        "udhcpc: {}\ndnsmasq:\n{}",
        r.describe(),
        dnsmasq.log()
    );
    let env = hook_env(&lab.path("udhcpc.bound.env"));
    assert_eq!(env["serverid"], "10.99.0.2", "{env:?}");
    let ip: Ipv4Addr = env["ip"].parse().unwrap();
    assert!(
        (100..=150).contains(&ip.octets()[3]) && ip.octets()[..3] == [10, 99, 0],
        "{ip} is not from dnsmasq's range"
    );
    wait_metric(&d, &ignored("unknown_mac"), 1.0);
    assert_eq!(d.metric(&replies("dhcp.proxy_offer", "proxy")), 0.0);

    // A PXE ROM's DISCOVER (class, arch 0 = BIOS, UUID) from a known
    // machine: two OFFERs, the address from dnsmasq, the boot file from us.
    let uuid: Vec<u8> = std::iter::once(0).chain(1..=16).collect();
    let pxe_options = || {
        vec![
            opt(60, PXE_CLASS.as_bytes()),
            opt(93, &[0, 0]),
            opt(94, &[1, 2, 1]),
            opt(97, &uuid),
            opt(55, &[1, 3, 6, 43, 54, 60, 66, 67, 97]),
        ]
    };
    let offers = py_dhcp(
        &known,
        json!({
            "mac": KNOWN, "type": DISCOVER, "iface": "eth0", "broadcast": true,
            "to_ip": "255.255.255.255", "to_port": 67,
            "options": pxe_options(), "wait": 2.0, "count": 10,
        }),
    );
    assert_eq!(offers.len(), 2, "{offers:#?}\ndnsmasq:\n{}", dnsmasq.log());
    assert!(offers.iter().all(|o| msg_type(o) == OFFER), "{offers:#?}");
    let by = |server: &str| {
        offers
            .iter()
            .find(|o| server_id(o) == Some(server.parse().unwrap()))
            .unwrap_or_else(|| panic!("no offer from {server}: {offers:#?}"))
    };
    let (site_offer, ours) = (by("10.99.0.2"), by(SERVER));
    let leased: Ipv4Addr = site_offer["yiaddr"].as_str().unwrap().parse().unwrap();
    assert!((100..=150).contains(&leased.octets()[3]), "{site_offer}");
    assert_eq!(
        ours["yiaddr"], "0.0.0.0",
        "a proxy offers no address: {ours}"
    );
    assert_eq!(ours["siaddr"], SERVER, "{ours}");
    assert_eq!(ours["dst"], "255.255.255.255", "{ours}");
    assert_eq!(ours["file"], "undionly.kpxe", "{ours}");
    assert_eq!(opt_of(ours, 60), Some(b"PXEClient".to_vec()), "{ours}");
    assert_eq!(opt_of(ours, 43), Some(vec![6, 1, 8, 255]), "{ours}");
    assert_eq!(opt_of(ours, 97), Some(uuid.clone()), "UUID echoed: {ours}");
    for code in [1, 3, 6, 51] {
        assert_eq!(
            opt_of(ours, code),
            None,
            "option {code} in a proxy offer: {ours}"
        );
    }

    // The ROM takes dnsmasq's address, then asks us on port 4011, unicast.
    let mut c = in_ns(&known, "ip");
    c.args(["addr", "add", &format!("{leased}/24"), "dev", "eth0"]);
    run_ok(c, Duration::from_secs(10));
    let acks = py_dhcp(
        &known,
        json!({
            "mac": KNOWN, "type": REQUEST, "ciaddr": leased.to_string(),
            "bind_ip": leased.to_string(), "bind_port": 68,
            "to_ip": SERVER, "to_port": 4011, "options": pxe_options(),
        }),
    );
    assert_eq!(acks.len(), 1, "{acks:?}\ndaemon log:\n{}", d.log());
    let ack = &acks[0];
    assert_eq!(msg_type(ack), ACK, "{ack}");
    assert_eq!(ack["src"], format!("{SERVER}:4011"), "{ack}");
    assert_eq!(ack["dst"], leased.to_string(), "{ack}");
    assert_eq!(ack["yiaddr"], "0.0.0.0", "{ack}");
    assert_eq!(ack["file"], "undionly.kpxe", "{ack}");
    assert_eq!(opt_of(ack, 60), Some(b"PXEClient".to_vec()), "{ack}");

    let mode = "proxy";
    wait_metric(&d, &requests("discover", mode), 2.0);
    wait_metric(&d, &replies("dhcp.proxy_offer", mode), 1.0);
    wait_metric(&d, &replies("dhcp.proxy_ack", mode), 1.0);
    assert_eq!(d.metric(&replies("dhcp.offer", mode)), 0.0);
    assert_eq!(d.metric(&replies("dhcp.ack", mode)), 0.0);
    let ev = wait_events(&d, "m-prx", &["dhcp.proxy_offer", "dhcp.proxy_ack"]);
    for e in ev
        .iter()
        .filter(|e| e["kind"].as_str().unwrap().starts_with("dhcp."))
    {
        assert_eq!(e["fields"]["boot_file"], "undionly.kpxe", "{e:#}");
        assert_eq!(e["fields"]["mode"], "proxy", "{e:#}");
    }

    // auto-proxy: the same stranger now gets a proxy offer.
    assert!(d.stop().success(), "{}", d.log());
    let d = lab.tinkerbox("auto-proxy");
    let offers = py_dhcp(
        &stranger,
        json!({
            "mac": STRANGER, "type": DISCOVER, "iface": "eth0", "broadcast": true,
            "to_ip": "255.255.255.255", "to_port": 67,
            "options": [opt(60, PXE_CLASS.as_bytes()), opt(93, &[0, 7])],
            "wait": 2.0, "count": 10,
        }),
    );
    let ours = offers
        .iter()
        .find(|o| server_id(o) == Some(SERVER.parse().unwrap()))
        .unwrap_or_else(|| panic!("auto-proxy did not answer: {offers:#?}\n{}", d.log()));
    assert_eq!(msg_type(ours), OFFER, "{ours}");
    assert_eq!(ours["yiaddr"], "0.0.0.0", "{ours}");
    assert_eq!(ours["file"], "ipxe.efi", "arch 7 = x86-64 UEFI: {ours}");
    assert!(
        offers
            .iter()
            .any(|o| server_id(o) == Some("10.99.0.2".parse().unwrap())),
        "{offers:#?}"
    );
    wait_metric(&d, &replies("dhcp.proxy_offer", "auto-proxy"), 1.0);
    wait_metric(&d, &requests("discover", "auto-proxy"), 1.0);
}

/// A relay agent (RFC 1542 / RFC 3046) at 10.99.0.254: the OFFER and ACK go
/// back to giaddr port 67 with option 82 echoed byte for byte, and the
/// circuit id lands in the machine's event log.
#[test]
fn relayed_discover_answered_to_giaddr() {
    const MAC: &str = "02:00:00:99:00:26";
    const RELAY: &str = "10.99.0.254";
    let mut lab = Lab::new("rly");
    let relay = lab.client("rl", "02:00:00:99:00:fe", Some("10.99.0.254/24"));
    let d = lab.tinkerbox("reservation");
    apply(&d, &lab, "m-rly", MAC, "10.99.0.26");

    let remote_id = [0x00, 0x11, 0x22, 0x33, 0x44, 0x55];
    let mut option82 = vec![1, 8];
    option82.extend_from_slice(b"eth1/0/7");
    option82.extend_from_slice(&[2, remote_id.len() as u8]);
    option82.extend_from_slice(&remote_id);
    let relayed = |msg: u8, options: Vec<Value>| {
        py_dhcp(
            &relay,
            json!({
                "mac": MAC, "type": msg, "giaddr": RELAY, "hops": 1,
                "bind_ip": RELAY, "bind_port": 67, "to_ip": SERVER, "to_port": 67,
                "options": options,
            }),
        )
    };

    let r = relayed(DISCOVER, vec![opt(82, &option82)]);
    assert_eq!(r.len(), 1, "{r:?}\ndaemon log:\n{}", d.log());
    let offer = &r[0];
    assert_eq!(msg_type(offer), OFFER, "{offer}");
    assert_eq!(offer["src"], "10.99.0.1:67", "{offer}");
    assert_eq!(offer["dst"], RELAY, "{offer}");
    assert_eq!(offer["yiaddr"], "10.99.0.26", "{offer}");
    assert_eq!(offer["giaddr"], RELAY, "{offer}");
    assert_eq!(opt_of(offer, 82), Some(option82.clone()), "{offer}");
    assert_eq!(opt_of(offer, 3), Some(ip_bytes(SERVER).to_vec()), "{offer}");

    let r = relayed(
        REQUEST,
        vec![
            opt(50, &ip_bytes("10.99.0.26")),
            opt(54, &ip_bytes(SERVER)),
            opt(82, &option82),
        ],
    );
    assert_eq!(r.len(), 1, "{r:?}");
    assert_eq!(msg_type(&r[0]), ACK, "{}", r[0]);
    assert_eq!(r[0]["yiaddr"], "10.99.0.26", "{}", r[0]);
    assert_eq!(opt_of(&r[0], 82), Some(option82.clone()), "{}", r[0]);

    let ev = wait_events(&d, "m-rly", &["dhcp.offer", "dhcp.ack"]);
    // The OFFER's row, or the ACK's it was folded into: either names the
    // relay, and goes back to it.
    let offer = ev.iter().find(|e| is_kind(e, "dhcp.offer")).unwrap();
    let relay_fields = &offer["fields"]["relay"];
    assert_eq!(relay_fields["circuit_id"], "eth1/0/7", "{offer:#}");
    assert_eq!(relay_fields["remote_id"], "00:11:22:33:44:55", "{offer:#}");
    assert_eq!(relay_fields["giaddr"], RELAY, "{offer:#}");
    assert!(
        offer["message"]
            .as_str()
            .unwrap()
            .contains("10.99.0.254:67"),
        "{offer:#}"
    );

    let mode = "reservation";
    wait_metric(&d, &requests("discover", mode), 1.0);
    wait_metric(&d, &replies("dhcp.offer", mode), 1.0);
    wait_metric(&d, &replies("dhcp.ack", mode), 1.0);
    wait_metric(&d, REPLY_SECONDS_COUNT, 2.0);
}

/// `[dhcp] interface` is optional (README: "serve only this interface"), so
/// without it a host with two networks must still answer a DISCOVER on the
/// network it came from. Here the lab namespace also has an uplink holding
/// the default route: a broadcast OFFER sent by plain routing leaves through
/// the uplink and the client never sees it (and with no default route at
/// all, sendto fails with ENETUNREACH).
#[test]
fn broadcast_replies_leave_through_the_receiving_interface() {
    const MAC: &str = "02:00:00:99:00:27";
    let mut lab = Lab::new("mh");
    let client = lab.client("cl", MAC, None);
    lab.uplink("up", "192.168.77.1/24", "192.168.77.254");
    let d = lab.tinkerbox_on("reservation", None);
    apply(&d, &lab, "m-mh", MAC, "10.99.0.27");
    let script = udhcpc_script(&lab);

    let r = udhcpc(&client, &script, 3, &[]);
    let sent = d.metric(&replies("dhcp.offer", "reservation"));
    assert!(
        r.ok(),
        "no lease with [dhcp] interface unset ({sent} OFFERs counted as sent, \
         {} send failures): {}",
        d.metric(&ignored("send_failed")),
        r.describe()
    );
    let env = hook_env(&lab.path("udhcpc.bound.env"));
    assert_eq!(env["ip"], "10.99.0.27", "{env:?}");
    assert_eq!(env["serverid"], SERVER, "{env:?}");
    assert_eq!(d.metric(&ignored("send_failed")), 0.0);
}
