//! The discovery pool on a real (virtual) wire: `tinkerbox serve` in
//! reservation mode with `[discovery]` on, inside a lab namespace (br0 =
//! 10.99.0.1/24), and real clients in namespaces of their own: busybox
//! udhcpc (as a PXE client with `-V PXEClient...`, and plain) and the
//! python client of `dhcp.rs` for hand-built DECLINE, RELEASE and RENEWING
//! packets. The pool is small (a few addresses) so that exhaustion and
//! reuse show within seconds.
//!
//! Needs root (namespaces) and busybox-static, python3, iproute2 and curl;
//! fails loudly, naming the package, when one is missing. Every lab is named
//! after the test process's PID and torn down on drop.

use crate::common::{Daemon, Setup};
use crate::dhcp::{
    ACK, DISCOVER, NAK, OFFER, PXE_CLASS, REQUEST, SERVER, hardware, hook_env, ignored, ip_bytes,
    msg_type, opt, opt_of, py_dhcp, replies, udhcpc, wait_metric,
};
use crate::netns::{self, in_ns, poll, run_ok};
use serde_json::{Value, json};
use std::net::Ipv4Addr;
use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::time::Duration;

// DHCP message types the python client sends (RFC 2132 9.6).
const DECLINE: u8 = 4;
const RELEASE: u8 = 7;

/// Reachable from the client namespaces (`/auto.ipxe` by source address).
const HTTP_LISTEN: &str = "0.0.0.0:7080";
const API_LISTEN: &str = "127.0.0.1:7081";

fn check_prerequisites() {
    netns::require(
        "discovery DHCP",
        &[
            ("ip", "iproute2"),
            ("busybox", "busybox-static"),
            ("python3", "python3"),
            ("curl", "curl"),
        ],
    );
}

netns::lab_newtype!(
    /// The namespace lab (`tbd-TAG-PID`, see [`netns::Lab`]).
    Lab
);

impl Lab {
    fn new(tag: &str) -> Lab {
        check_prerequisites();
        Lab(netns::Lab::new("tbd", tag))
    }

    /// tinkerbox in the lab namespace: reservation mode on br0, and
    /// `[discovery]` with these extra lines.
    fn tinkerbox(&self, discovery: &str) -> Daemon {
        let boot = format!(
            "[dhcp]\nlisten = \"0.0.0.0:67\"\nmode = \"reservation\"\ninterface = \"br0\"\n\
             [tftp]\nenabled = false\n[syslog]\nenabled = false\n\
             [discovery]\nenabled = true\nnetmask = \"255.255.255.0\"\ngateway = \"10.99.0.1\"\n\
             dns = [\"10.99.0.53\"]\nlease_time = \"10m\"\n{discovery}\n"
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

    /// A udhcpc hook saving its environment to `udhcpc.<event>.env`
    /// (removed first, so each run's is its own).
    fn udhcpc_script(&self) -> PathBuf {
        for event in ["bound", "renew", "deconfig", "leasefail"] {
            let _ = std::fs::remove_file(self.path(&format!("udhcpc.{event}.env")));
        }
        let p = self.path("udhcpc.sh");
        let dir = self.dir().display();
        std::fs::write(
            &p,
            format!("#!/bin/sh\nenv > \"{dir}/udhcpc.$1.env\"\nexit 0\n"),
        )
        .unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
        p
    }

    /// udhcpc in `ns` (`-V PXEClient...` when `pxe`); the address bound.
    #[track_caller]
    fn lease(
        &self,
        d: &Daemon,
        ns: &str,
        pxe: bool,
    ) -> (Ipv4Addr, std::collections::BTreeMap<String, String>) {
        let script = self.udhcpc_script();
        let extra: &[&str] = if pxe { &["-V", PXE_CLASS] } else { &[] };
        let r = udhcpc(ns, &script, 4, extra);
        assert!(r.ok(), "udhcpc: {}\ndaemon log:\n{}", r.describe(), d.log());
        let env = hook_env(&self.path("udhcpc.bound.env"));
        (env["ip"].parse().unwrap(), env)
    }

    /// udhcpc in `ns` gets nothing in two tries.
    #[track_caller]
    fn no_lease(&self, ns: &str, pxe: bool) {
        let script = self.udhcpc_script();
        let extra: &[&str] = if pxe { &["-V", PXE_CLASS] } else { &[] };
        let r = udhcpc(ns, &script, 2, extra);
        assert!(r.status.is_some(), "udhcpc hung: {}", r.describe());
        assert!(!r.ok(), "udhcpc got a lease: {}", r.describe());
        assert!(!self.path("udhcpc.bound.env").exists());
    }
}

fn in_pool(ip: Ipv4Addr, first: u8, last: u8) -> bool {
    ip.octets()[..3] == [10, 99, 0] && (first..=last).contains(&ip.octets()[3])
}

fn pool_gauge(state: &str) -> String {
    format!("tinkerbox_discovery_pool_addresses{{state=\"{state}\"}}")
}

/// The gauge once it equals `want` (the pool thread updates it just after
/// it answers; poll, at most 10 s).
#[track_caller]
fn wait_gauge(d: &Daemon, state: &str, want: f64) {
    let series = pool_gauge(state);
    let mut v = -1.0;
    if poll(Duration::from_secs(10), || {
        v = d.metric(&series);
        (v == want).then_some(())
    })
    .is_none()
    {
        panic!("{series} = {v}, want {want}\ndaemon log:\n{}", d.log());
    }
}

/// The leases `GET /api/v1/discovery/leases` lists.
fn leases(d: &Daemon) -> Vec<Value> {
    let (code, v) = d.api("GET", "/api/v1/discovery/leases", None);
    assert_eq!(code, 200, "{v}");
    v["items"].as_array().cloned().unwrap_or_default()
}

/// Every event of kind `kind` about `mac` once there is one (events are
/// written in batches: poll, at most 10 s).
#[track_caller]
fn wait_event(d: &Daemon, kind: &str, mac: &str) -> Value {
    let mut last = Value::Null;
    let found = poll(Duration::from_secs(10), || {
        let (code, v) = d.api("GET", "/api/v1/events?limit=10000", None);
        last = v.clone();
        if code != 200 {
            return None;
        }
        v["items"]
            .as_array()?
            .iter()
            .find(|e| e["kind"] == kind && e["mac"] == mac)
            .cloned()
    });
    found.unwrap_or_else(|| panic!("no {kind} event of {mac}: {last:#}"))
}

fn healthz(d: &Daemon) -> String {
    let o = d.curl(&["-s", &d.url("/healthz")]);
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn apply_hw(d: &Daemon, lab: &Lab, name: &str, mac: &str, ip: &str) {
    let f = lab.path(&format!("{name}.yaml"));
    std::fs::write(&f, hardware(name, mac, ip)).unwrap();
    d.cli_ok(&["hardware", "apply", "-f", f.to_str().unwrap()]);
}

/// The python client's DISCOVER as a PXE ROM sends it (option 50 when
/// `want`); the replies within `wait` seconds.
fn pxe_discover(ns: &str, mac: &str, want: Option<Ipv4Addr>, wait: f64) -> Vec<Value> {
    let mut options = vec![opt(60, PXE_CLASS.as_bytes()), opt(93, &[0, 0])];
    if let Some(ip) = want {
        options.push(opt(50, &ip.octets()));
    }
    py_dhcp(
        ns,
        json!({
            "mac": mac, "type": DISCOVER, "iface": "eth0", "broadcast": true,
            "to_ip": "255.255.255.255", "to_port": 67, "options": options, "wait": wait,
        }),
    )
}

/// A SELECTING REQUEST for `ip` (server id ours).
fn pxe_request(ns: &str, mac: &str, ip: Ipv4Addr) -> Vec<Value> {
    py_dhcp(
        ns,
        json!({
            "mac": mac, "type": REQUEST, "iface": "eth0", "broadcast": true,
            "to_ip": "255.255.255.255", "to_port": 67,
            "options": [opt(60, PXE_CLASS.as_bytes()), opt(50, &ip.octets()), opt(54, &ip_bytes(SERVER))],
        }),
    )
}

/// One packet that wants no answer (DECLINE, RELEASE): none comes.
#[track_caller]
fn send_quiet(ns: &str, spec: Value) {
    let r = py_dhcp(ns, spec);
    assert!(r.is_empty(), "answered: {r:?}");
}

fn yiaddr(reply: &Value) -> Ipv4Addr {
    reply["yiaddr"].as_str().unwrap().parse().unwrap()
}

/// An unknown PXE client (udhcpc -V PXEClient) is leased a pool address
/// with `[discovery]`'s options and a boot file; the lease is listed,
/// counted, in `/healthz` and the event log, and its machine gets the
/// default OSIE script by MAC and by address. After a restart the lease
/// still holds: another client cannot have the address, and the same
/// client gets it again.
#[test]
fn unknown_pxe_client_gets_a_pool_address_that_survives_a_restart() {
    const MAC: &str = "02:00:00:98:00:01";
    const OTHER: &str = "02:00:00:98:00:02";
    let mut lab = Lab::new("pxe");
    let client = lab.client("cl", MAC, None);
    let other = lab.client("ot", OTHER, None);
    let mut d = lab.tinkerbox("pool = \"10.99.0.100-10.99.0.109\"\n");
    wait_gauge(&d, "free", 10.0);

    let (ip, env) = lab.lease(&d, &client, true);
    assert!(in_pool(ip, 100, 109), "{ip}");
    for (key, want) in [
        ("subnet", "255.255.255.0"),
        ("router", "10.99.0.1"),
        ("dns", "10.99.0.53"),
        ("lease", "600"),
        ("serverid", SERVER),
        ("siaddr", SERVER),
        ("boot_file", "undionly.kpxe"),
    ] {
        assert_eq!(
            env.get(key).map(String::as_str),
            Some(want),
            "{key}: {env:?}"
        );
    }

    let listed = leases(&d);
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_eq!(listed[0]["mac"], MAC);
    assert_eq!(listed[0]["ip"], ip.to_string());
    assert_eq!(listed[0]["state"], "leased");
    wait_gauge(&d, "leased", 1.0);
    wait_gauge(&d, "free", 9.0);
    assert!(
        healthz(&d).contains("discovery pool: 1 of 10 leased"),
        "{}",
        healthz(&d)
    );
    wait_metric(&d, &replies("dhcp.ack", "reservation"), 1.0);
    let e = wait_event(&d, "discovery.lease", MAC);
    assert_eq!(e["ip"], ip.to_string(), "{e}");

    // The OSIE script for the unknown machine, by MAC and by its address.
    let by_mac = d.curl(&["-sf", &d.url(&format!("/ipxe/script/{MAC}/auto.ipxe"))]);
    let text = String::from_utf8_lossy(&by_mac.stdout);
    assert!(
        by_mac.status.success() && text.contains(&format!("worker_id={MAC} hw_addr={MAC}")),
        "{text}"
    );
    let mut c = in_ns(&client, "ip");
    c.args(["addr", "add", &format!("{ip}/24"), "dev", "eth0"]);
    run_ok(c, Duration::from_secs(10));
    let mut c = in_ns(&client, "curl");
    c.args([
        "-sf",
        "--max-time",
        "10",
        &format!("http://{SERVER}:7080/auto.ipxe"),
    ]);
    let by_ip = run_ok(c, Duration::from_secs(15));
    assert!(
        by_ip.stdout.contains(&format!("hw_addr={MAC}")),
        "{}",
        by_ip.stdout
    );
    // An address with neither Hardware nor lease: still 404.
    assert_eq!(d.http_status(&d.url("/auto.ipxe")), "404");

    // Restart: the lease is loaded back.
    assert!(d.stop().success(), "{}", d.log());
    d.spawn();
    assert_eq!(leases(&d).len(), 1);
    wait_gauge(&d, "leased", 1.0);
    let offers = pxe_discover(&other, OTHER, Some(ip), 2.0);
    assert_eq!(offers.len(), 1, "{offers:?}\ndaemon log:\n{}", d.log());
    assert_eq!(msg_type(&offers[0]), OFFER);
    assert_ne!(
        yiaddr(&offers[0]),
        ip,
        "offered a leased address: {}",
        offers[0]
    );
    let naks = pxe_request(&other, OTHER, ip);
    assert_eq!(naks.len(), 1, "{naks:?}");
    assert_eq!(msg_type(&naks[0]), NAK, "{}", naks[0]);
    let mut c = in_ns(&client, "ip");
    c.args(["addr", "flush", "dev", "eth0"]);
    run_ok(c, Duration::from_secs(10));
    let (again, _) = lab.lease(&d, &client, true);
    assert_eq!(again, ip, "the same MAC, the same address after a restart");
}

/// A known Hardware's reserved address inside the pool is never leased: the
/// unknown client gets the other one, the next finds the pool exhausted
/// (counted, a rate-limited event, a `/healthz` warning), and the known
/// machine still gets its reservation with its own options.
#[test]
fn reserved_addresses_are_never_leased_and_known_hosts_keep_theirs() {
    const KNOWN: &str = "02:00:00:98:01:01";
    const FIRST: &str = "02:00:00:98:01:02";
    const SECOND: &str = "02:00:00:98:01:03";
    let mut lab = Lab::new("rsv");
    let known = lab.client("kn", KNOWN, None);
    let first = lab.client("fi", FIRST, None);
    let second = lab.client("se", SECOND, None);
    let d = lab.tinkerbox("pool = \"10.99.0.100-10.99.0.101\"\n");
    apply_hw(&d, &lab, "m-known", KNOWN, "10.99.0.100");
    wait_gauge(&d, "reserved", 1.0);

    let (ip, _) = lab.lease(&d, &first, true);
    assert_eq!(ip, "10.99.0.101".parse::<Ipv4Addr>().unwrap());
    // The reserved address, even asked for by name, is not offered.
    let r = pxe_discover(&second, SECOND, Some("10.99.0.100".parse().unwrap()), 1.5);
    assert!(r.is_empty(), "offered from an exhausted pool: {r:?}");
    wait_metric(&d, "tinkerbox_discovery_pool_exhausted_total", 1.0);
    wait_metric(&d, &ignored("pool_exhausted"), 1.0);
    wait_gauge(&d, "free", 0.0);
    let h = healthz(&d);
    assert!(
        h.starts_with("ok\n") && h.contains("discovery pool exhausted"),
        "{h}"
    );
    let e = wait_event(&d, "discovery.exhausted", SECOND);
    assert!(
        e["message"]
            .as_str()
            .unwrap()
            .contains("1 reserved by Hardware"),
        "{e}"
    );
    // More DISCOVERs: counted, but one event a minute.
    pxe_discover(&second, SECOND, None, 0.5);
    wait_metric(&d, "tinkerbox_discovery_pool_exhausted_total", 2.0);
    let (_, v) = d.api("GET", "/api/v1/events?limit=10000", None);
    let n = v["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["kind"] == "discovery.exhausted")
        .count();
    assert_eq!(n, 1, "{v:#}");

    let (ip, env) = lab.lease(&d, &known, false);
    assert_eq!(ip, "10.99.0.100".parse::<Ipv4Addr>().unwrap());
    assert_eq!(env["lease"], "1800", "the Hardware's own options: {env:?}");
    assert_eq!(env["hostname"], "m-known-host", "{env:?}");
    assert_eq!(leases(&d).len(), 1);
}

/// `mac_patterns`: a netboot client whose MAC does not match gets nothing;
/// a matching one that is not netbooting gets nothing until it holds a
/// lease, and then, as a plain client (the OSIE's), gets the same address
/// and renews it (RENEWING: unicast, ciaddr).
#[test]
fn mac_patterns_and_plain_clients_holding_a_lease() {
    const STRANGER: &str = "02:00:00:96:00:01";
    const MATCHING: &str = "02:00:00:97:00:01";
    let mut lab = Lab::new("pat");
    let stranger = lab.client("st", STRANGER, None);
    let matching = lab.client("ma", MATCHING, None);
    let d =
        lab.tinkerbox("pool = \"10.99.0.100-10.99.0.104\"\nmac_patterns = [\"02:00:00:97:*\"]\n");

    lab.no_lease(&stranger, true);
    lab.no_lease(&matching, false);
    wait_metric(&d, &ignored("unknown_mac"), 4.0);
    assert!(leases(&d).is_empty());

    let (ip, _) = lab.lease(&d, &matching, true);
    assert!(in_pool(ip, 100, 104), "{ip}");
    let (plain, env) = lab.lease(&d, &matching, false);
    assert_eq!(plain, ip, "a plain client holding a lease keeps it");
    assert_eq!(
        env.get("boot_file"),
        None,
        "no boot file when not netbooting: {env:?}"
    );
    let expires = leases(&d)[0]["expiresMs"].as_i64().unwrap();

    let mut c = in_ns(&matching, "ip");
    c.args(["addr", "add", &format!("{ip}/24"), "dev", "eth0"]);
    run_ok(c, Duration::from_secs(10));
    std::thread::sleep(Duration::from_millis(20));
    let r = py_dhcp(
        &matching,
        json!({
            "mac": MATCHING, "type": REQUEST, "ciaddr": ip.to_string(),
            "bind_ip": ip.to_string(), "to_ip": SERVER, "to_port": 67,
        }),
    );
    assert_eq!(r.len(), 1, "{r:?}\ndaemon log:\n{}", d.log());
    assert_eq!(msg_type(&r[0]), ACK, "{}", r[0]);
    assert_eq!(yiaddr(&r[0]), ip);
    assert_eq!(r[0]["dst"], ip.to_string(), "unicast to ciaddr: {}", r[0]);
    assert_eq!(opt_of(&r[0], 51), Some(600u32.to_be_bytes().to_vec()));
    let renewed = leases(&d)[0]["expiresMs"].as_i64().unwrap();
    assert!(
        renewed > expires,
        "renewal committed: {renewed} <= {expires}"
    );
}

/// DECLINE keeps the address out of the pool (for every client, listed and
/// counted as declined); RELEASE frees the address at once.
#[test]
fn decline_keeps_an_address_out_and_release_frees_it() {
    const MAC: &str = "02:00:00:98:02:01";
    const OTHER: &str = "02:00:00:98:02:02";
    let mut lab = Lab::new("dec");
    let client = lab.client("cl", MAC, None);
    let other = lab.client("ot", OTHER, None);
    let d = lab.tinkerbox("pool = \"10.99.0.100-10.99.0.102\"\n");

    let bind = |mac: &str, ns: &str| -> Ipv4Addr {
        let offers = pxe_discover(ns, mac, None, 3.0);
        assert_eq!(offers.len(), 1, "{offers:?}\ndaemon log:\n{}", d.log());
        let ip = yiaddr(&offers[0]);
        let acks = pxe_request(ns, mac, ip);
        assert_eq!(acks.len(), 1, "{acks:?}");
        assert_eq!(msg_type(&acks[0]), ACK, "{}", acks[0]);
        assert_eq!(opt_of(&acks[0], 3), Some(ip_bytes(SERVER).to_vec()));
        ip
    };
    let declined = bind(MAC, &client);
    send_quiet(
        &client,
        json!({
            "mac": MAC, "type": DECLINE, "iface": "eth0", "broadcast": true,
            "to_ip": "255.255.255.255", "to_port": 67, "wait": 0.5,
            "options": [opt(50, &declined.octets()), opt(54, &ip_bytes(SERVER))],
        }),
    );
    wait_gauge(&d, "declined", 1.0);
    wait_gauge(&d, "leased", 0.0);
    let listed = leases(&d);
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_eq!(listed[0]["state"], "declined");
    assert_eq!(listed[0]["ip"], declined.to_string());
    wait_event(&d, "dhcp.decline", MAC);
    for (ns, mac) in [(&client, MAC), (&other, OTHER)] {
        let r = pxe_discover(ns, mac, Some(declined), 2.0);
        assert_eq!(r.len(), 1, "{r:?}");
        assert_ne!(
            yiaddr(&r[0]),
            declined,
            "a declined address offered: {}",
            r[0]
        );
    }

    let released = bind(MAC, &client);
    assert_ne!(released, declined);
    wait_gauge(&d, "leased", 1.0);
    send_quiet(
        &client,
        json!({
            "mac": MAC, "type": RELEASE, "ciaddr": released.to_string(), "iface": "eth0",
            "to_ip": "255.255.255.255", "to_port": 67, "wait": 0.5,
            "options": [opt(54, &ip_bytes(SERVER))],
        }),
    );
    wait_gauge(&d, "leased", 0.0);
    wait_event(&d, "dhcp.release", MAC);
    assert!(
        leases(&d).iter().all(|l| l["state"] != "leased"),
        "{:?}",
        leases(&d)
    );
    // Free at once: another client asking for it gets it.
    let r = pxe_discover(&other, OTHER, Some(released), 2.0);
    assert_eq!(r.len(), 1, "{r:?}");
    assert_eq!(yiaddr(&r[0]), released, "{}", r[0]);
}

/// auto-proxy with `[discovery]` on and a pool set: still no address from
/// us (a proxy offer, yiaddr 0.0.0.0), and the unknown machine's iPXE
/// script is the default OSIE.
#[test]
fn auto_proxy_gives_no_address_but_serves_the_osie_script() {
    const MAC: &str = "02:00:00:98:03:01";
    let mut lab = Lab::new("apx");
    let client = lab.client("cl", MAC, None);
    let boot = "[dhcp]\nlisten = \"0.0.0.0:67\"\nmode = \"auto-proxy\"\ninterface = \"br0\"\n\
                [tftp]\nenabled = false\n[syslog]\nenabled = false\n\
                [discovery]\nenabled = true\npool = \"10.99.0.100-10.99.0.109\"\n";
    let d = Daemon::start_setup(Setup {
        top: "public_ip = \"10.99.0.1\"",
        boot,
        netns: Some(&lab.ns),
        http_listen: Some(HTTP_LISTEN),
        api_listen: Some(API_LISTEN),
        ..Setup::default()
    });
    let offers = pxe_discover(&client, MAC, None, 1.5);
    assert_eq!(offers.len(), 1, "{offers:?}\ndaemon log:\n{}", d.log());
    assert_eq!(msg_type(&offers[0]), OFFER);
    assert_eq!(offers[0]["yiaddr"], "0.0.0.0", "{}", offers[0]);
    assert_eq!(offers[0]["file"], "undionly.kpxe", "{}", offers[0]);
    wait_metric(&d, &replies("dhcp.proxy_offer", "auto-proxy"), 1.0);
    assert!(leases(&d).is_empty());
    assert!(!healthz(&d).contains("discovery pool"), "{}", healthz(&d));
    let o = d.curl(&["-sf", &d.url(&format!("/ipxe/script/{MAC}/auto.ipxe"))]);
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success() && text.contains(&format!("worker_id={MAC} hw_addr={MAC}")),
        "{text}"
    );
}

/// A Hardware interface with no address (a BareMetalHost's) takes its
/// address from the pool; the metadata service knows the machine at that
/// address by the MAC its lease names, and only then: an unknown machine
/// holding a pool lease is not answered.
#[test]
fn a_hardware_without_an_address_gets_its_metadata_at_its_pool_address() {
    const MAC: &str = "02:00:00:98:00:21";
    const OTHER: &str = "02:00:00:98:00:22";
    let mut lab = Lab::new("pmd");
    let client = lab.client("cl", MAC, None);
    let other = lab.client("ot", OTHER, None);
    let d = lab.tinkerbox("pool = \"10.99.0.100-10.99.0.109\"\n");
    let f = lab.path("host.yaml");
    std::fs::write(
        &f,
        format!(
            "apiVersion: tinkerbell.org/v1alpha1\nkind: Hardware\nmetadata: {{name: host-0, namespace: default}}\n\
             spec:\n  interfaces:\n  - dhcp: {{mac: \"{MAC}\"}}\n    netboot: {{allowPXE: false}}\n\
             \x20 metadata:\n    instance: {{id: 6f1c0e9a-0b7d-4c55-9d0e-3c2b1a000021, hostname: host-0}}\n\
             \x20 userData: \"#cloud-config\\nhostname: host-0\\n\"\n"
        ),
    )
    .unwrap();
    d.cli_ok(&["apply", "-f", f.to_str().unwrap()]);
    let get = |ns: &str, ip: Ipv4Addr, path: &str| {
        let mut c = in_ns(ns, "ip");
        c.args(["addr", "replace", &format!("{ip}/24"), "dev", "eth0"]);
        run_ok(c, Duration::from_secs(10));
        let mut c = in_ns(ns, "curl");
        c.args([
            "-s",
            "--max-time",
            "10",
            "-w",
            "\n%{http_code}",
            &format!("http://{SERVER}:7080{path}"),
        ]);
        run_ok(c, Duration::from_secs(15)).stdout
    };
    let (ip, _) = lab.lease(&d, &client, true);
    assert!(in_pool(ip, 100, 109), "{ip}");
    let id = get(&client, ip, "/2009-04-04/meta-data/instance-id");
    assert_eq!(
        id,
        "6f1c0e9a-0b7d-4c55-9d0e-3c2b1a000021\n200",
        "{}",
        d.log()
    );
    let ud = get(&client, ip, "/2009-04-04/user-data");
    assert_eq!(ud, "#cloud-config\nhostname: host-0\n\n200");
    // An unknown machine with a pool lease is no Hardware's.
    let (oip, _) = lab.lease(&d, &other, true);
    assert_ne!(oip, ip);
    let o = get(&other, oip, "/2009-04-04/meta-data/instance-id");
    assert!(o.ends_with("404"), "{o}");
}
