//! The metadata service as a booting machine sees it: `tinkerbox serve`
//! inside a network namespace whose bridge br0 holds 10.99.0.1/24, clients
//! in other namespaces on veths into br0 (tests/lab/lib.sh), and Debian's
//! own cloud-init (22.4.2) driven by tests/metadata/cloudinit.py: its EC2
//! and NoCloud datasources fetch and parse, the tests only check what
//! cloud-init ended up with. curl covers the rest (IMDSv2 tokens, spoofing,
//! trusted proxies, 404s).
//!
//! Needs root (namespaces) and the Debian packages iproute2, curl and
//! cloud-init (tests/deps). Every lab is named after the test process's
//! PID and torn down on drop, panics included; every wait is bounded.

use crate::common::{Daemon, Setup};
use crate::netns::{self, in_ns, poll, run};
use serde_json::{Value, json};
use std::process::Command;
use std::time::Duration;

const DRIVER: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../tests/metadata/cloudinit.py"
);
/// Debian's interpreter: cloud-init is a Debian package, not on PyPI.
const PYTHON: &str = "/usr/bin/python3";

/// Fixed inside the lab namespace (nothing else listens there).
const HTTP_LISTEN: &str = "0.0.0.0:7080";
const URL: &str = "http://10.99.0.1:7080";

const A_NAME: &str = "worker-a";
const A_IP: &str = "10.99.0.21";
const A_MAC: &str = "52:54:00:10:00:21";
const A_ID: &str = "i-0a21c0ffee5eed001";
const A_KEYS: [&str; 2] = [
    "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIHq7ab1U4y0bq0n3XqzW6l6Hk1Zr ops@lab",
    "ssh-rsa AAAAB3NzaC1yc2EAAAADAQABAAABAQC7vbqajDhA9ZfGZ4gC8p8l backup@lab",
];
/// Quotes of both kinds, a tab, a backslash, trailing blanks, a blank
/// line, non-ASCII: it must come back byte for byte.
const A_USER_DATA: &str = "#cloud-config\n\
# worker-a: \"double\", 'single', tab:\t<-, backslash: \\ , café  \n\
hostname: worker-a\n\
\n\
write_files:\n\
  - path: /etc/motd\n\
    content: \"Welcome to \\\"worker-a\\\"\\n\"\n\
runcmd:\n\
  - [sh, -c, 'printf \"%s\\t%s\\n\" \"it''s\" done']\n\
  - \"echo \\\"tab:\there\\\"\"\n";
const A_VENDOR_DATA: &str = "#cloud-config\nntp:\n  enabled: true\n  servers: [\"10.99.0.1\"]\n";

const B_NAME: &str = "worker-b";
const B_IP: &str = "10.99.0.22";
const B_MAC: &str = "52:54:00:10:00:22";
const B_ID: &str = "i-0b22b0bb1e5";
const B_USER_DATA: &str = "#cloud-config\nhostname: worker-b\nruncmd:\n  - echo \"I am B\"\n";

/// A trusted proxy's address, when a test trusts one.
const PROXY_IP: &str = "10.99.0.5";
const UNKNOWN_IP: &str = "10.99.0.99";

// ---------------------------------------------------------------------------
// Processes: every wait bounded, every process stopped by PID.

// ---------------------------------------------------------------------------
// The lab: namespaces from tests/lab/lib.sh, removed on drop.

fn check_prerequisites() {
    netns::require("metadata", &[("ip", "iproute2"), ("curl", "curl")]);
    let mut c = Command::new(PYTHON);
    c.args(["-c", "import cloudinit.sources.DataSourceEc2"]);
    let r = run(c, Duration::from_secs(30));
    assert!(
        r.ok(),
        "Debian's cloud-init is missing: apt-get install cloud-init (tests/deps)\n{}",
        r.describe()
    );
}

netns::lab_newtype!(
    /// The namespace lab (`tbmd-TAG-PID`, see [`netns::Lab`]) with the
    /// metadata tests' own helpers.
    Lab
);

impl Lab {
    fn new(tag: &str) -> Lab {
        check_prerequisites();
        Lab(netns::Lab::new("tbmd", tag))
    }

    /// A client namespace (see [`netns::Lab::client`]) with `ip`/24, able
    /// to reach the daemon.
    fn client(&mut self, role: &str, mac: &str, ip: &str) -> String {
        let ns = self.0.client(role, mac, Some(&format!("{ip}/24")));
        // The bridge port forwards at once (no STP), but be sure.
        let reached = poll(Duration::from_secs(10), || {
            (curl(&ns, &[&format!("{URL}/healthz")]).0 == 200).then_some(())
        });
        assert!(reached.is_some(), "{ns} cannot reach {URL}/healthz");
        ns
    }

    /// tinkerbox in the lab namespace: HTTP on 0.0.0.0:7080, DHCP, TFTP and
    /// syslog off, `metadata` lines inside `[metadata]`.
    fn tinkerbox(&self, metadata: &str) -> Daemon {
        self.tinkerbox_on(HTTP_LISTEN, metadata)
    }

    fn tinkerbox_on(&self, http_listen: &str, metadata: &str) -> Daemon {
        let boot = format!(
            "[dhcp]\nmode = \"off\"\n[tftp]\nenabled = false\n[syslog]\nenabled = false\n\
             [metadata]\n{metadata}\n"
        );
        Daemon::start_setup(Setup {
            top: "public_ip = \"10.99.0.1\"",
            boot: &boot,
            netns: Some(&self.ns),
            http_listen: Some(http_listen),
            // Each lab has its own namespace: a fixed port cannot collide.
            api_listen: Some("127.0.0.1:7081"),
            ..Setup::default()
        })
    }

    /// The driver (tests/metadata/cloudinit.py) in namespace `ns`: what
    /// cloud-init found, as JSON. Its log is kept in the lab's directory.
    #[track_caller]
    fn cloud_init(&self, ns: &str, args: &[&str]) -> Value {
        let mut c = in_ns(ns, PYTHON);
        c.arg(DRIVER).args(args);
        let what = format!("cloudinit.py {}", args.join(" "));
        let r = run(c, Duration::from_secs(90));
        let log = self.path(&format!("cloudinit-{}.log", args[0]));
        let _ = std::fs::write(&log, &r.stderr);
        assert!(r.ok(), "{what} in {ns}: {}", r.describe());
        let v: Value = serde_json::from_str(r.stdout.trim())
            .unwrap_or_else(|e| panic!("{what}: not one JSON object ({e}): {}", r.describe()));
        let found = match &v["get_data"] {
            Value::Bool(ok) => format!("get_data={ok} "),
            _ => String::new(),
        };
        eprintln!(
            "{what} in {ns}: {found}in {}s (process {:.2}s)",
            v["seconds"],
            r.took.as_secs_f64()
        );
        // What cloud-init itself said about the datasource (shown with --no-capture).
        for line in r.stderr.lines().filter(|l| {
            l.contains("Crawl of metadata")
                || l.contains("metadata source")
                || l.contains("Read from")
        }) {
            eprintln!("  cloud-init: {line}");
        }
        v
    }
}

// ---------------------------------------------------------------------------
// HTTP from a client namespace.

/// curl inside `ns`: (status, body). Status 0 when nothing answered.
fn curl(ns: &str, args: &[&str]) -> (u16, String) {
    let mut c = in_ns(ns, "curl");
    c.args(["-sS", "--max-time", "30", "-o", "-", "-w", "\n%{http_code}"])
        .args(args);
    let r = run(c, Duration::from_secs(40));
    let (body, code) = r.stdout.rsplit_once('\n').unwrap_or(("", &r.stdout));
    match code.trim().parse() {
        Ok(code) if code > 0 => (code, body.to_string()),
        // No HTTP answer at all: say why (curl's own error), for the assertion.
        _ => (0, format!("curl failed in {ns}: {}", r.describe())),
    }
}

/// GET `path` from `ns` with extra headers.
fn get(ns: &str, path: &str, headers: &[&str]) -> (u16, String) {
    let mut args: Vec<String> = vec![];
    for h in headers {
        args.extend(["-H".to_string(), h.to_string()]);
    }
    args.push(format!("{URL}{path}"));
    curl(ns, &args.iter().map(String::as_str).collect::<Vec<_>>())
}

/// `PUT /latest/api/token` from `ns`: (status, token or error body).
fn put_token(ns: &str, headers: &[&str]) -> (u16, String) {
    let mut args: Vec<String> = vec!["-X".into(), "PUT".into()];
    for h in headers {
        args.extend(["-H".to_string(), h.to_string()]);
    }
    args.push(format!("{URL}/latest/api/token"));
    curl(ns, &args.iter().map(String::as_str).collect::<Vec<_>>())
}

fn ttl(seconds: &str) -> String {
    format!("X-aws-ec2-metadata-token-ttl-seconds: {seconds}")
}

fn with_token(token: &str) -> String {
    format!("X-aws-ec2-metadata-token: {token}")
}

/// A token for the caller in `ns` (asserting 200).
#[track_caller]
fn token(ns: &str, seconds: &str, headers: &[&str]) -> String {
    let mut h = vec![ttl(seconds)];
    h.extend(headers.iter().map(|s| s.to_string()));
    let (code, body) = put_token(ns, &h.iter().map(String::as_str).collect::<Vec<_>>());
    assert_eq!(code, 200, "token PUT from {ns}: {body}");
    assert!(!body.trim().is_empty());
    body
}

// ---------------------------------------------------------------------------
// Hardware, events, metrics.

fn hardware(name: &str, mac: &str, ip: &str, instance: Value, spec: Value) -> Value {
    let mut hw = json!({
        "apiVersion": "tinkerbell.org/v1alpha1",
        "kind": "Hardware",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "interfaces": [{
                "dhcp": {
                    "mac": mac,
                    "hostname": format!("{name}-eno1"),
                    "iface_name": "eno1",
                    "arch": "x86_64",
                    "lease_time": 86400,
                    "ip": {"address": ip, "netmask": "255.255.255.0", "gateway": "10.99.0.1"},
                    "name_servers": ["10.99.0.53", "10.99.0.54"],
                    "domain_name": "lab.example",
                },
                "netboot": {"allowPXE": true, "allowWorkflow": true},
            }],
            "metadata": {
                "facility": {"facility_code": "lab1", "plan_slug": "c3.small.x86"},
                "instance": instance,
            },
        },
    });
    for (k, v) in spec.as_object().unwrap() {
        hw["spec"][k] = v.clone();
    }
    hw
}

/// Hardware A: everything a real machine has.
fn hardware_a() -> Value {
    hardware(
        A_NAME,
        A_MAC,
        A_IP,
        json!({
            "id": A_ID,
            "hostname": A_NAME,
            "tags": ["k8s", "worker"],
            "ssh_keys": A_KEYS,
            "operating_system": {"distro": "ubuntu", "version": "22.04", "os_slug": "ubuntu_22_04", "image_tag": "v1"},
            "ips": [{"address": A_IP, "netmask": "255.255.255.0", "gateway": "10.99.0.1",
                     "family": 4, "public": false, "management": true}],
        }),
        json!({"userData": A_USER_DATA, "vendorData": A_VENDOR_DATA}),
    )
}

fn hardware_b() -> Value {
    hardware(
        B_NAME,
        B_MAC,
        B_IP,
        json!({
            "id": B_ID,
            "hostname": B_NAME,
            "ssh_keys": ["ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIBbBbBbB ops@lab"],
        }),
        json!({"userData": B_USER_DATA}),
    )
}

/// `hardware apply` of these documents (as one JSON list).
fn apply(d: &Daemon, lab: &Lab, docs: &[Value]) {
    let f = lab.path("hardware.json");
    std::fs::write(&f, serde_json::to_string_pretty(docs).unwrap()).unwrap();
    d.cli_ok(&["hardware", "apply", "-f", f.to_str().unwrap()]);
}

fn metadata_requests(code: u16) -> String {
    format!("tinkerbox_metadata_requests_total{{code=\"{code}\"}}")
}

fn events_json(d: &Daemon, name: &str) -> Vec<Value> {
    let out = d.cli_ok(&["events", name, "-o", "json", "--limit", "1000"]);
    serde_json::from_str::<Value>(&out)
        .unwrap()
        .as_array()
        .unwrap()
        .clone()
}

fn metadata_reads(events: &[Value]) -> Vec<Value> {
    events
        .iter()
        .filter(|e| e["kind"] == "metadata.read")
        .cloned()
        .collect()
}

/// Ways a client might claim another address (all A's, 10.99.0.21).
const SPOOF_HEADERS: &[&[&str]] = &[
    &["X-Forwarded-For: 10.99.0.21"],
    &["X-Forwarded-For: 10.99.0.21, 10.99.0.21"],
    &["X-Forwarded-For: 10.99.0.22, 10.99.0.21"],
    &["X-Forwarded-For: 10.99.0.21", "X-Forwarded-For: 10.99.0.21"],
    &["X-Forwarded-For: ::ffff:10.99.0.21"],
    &["X-Real-IP: 10.99.0.21"],
    &["Forwarded: for=10.99.0.21"],
    &["X-Client-IP: 10.99.0.21", "True-Client-IP: 10.99.0.21"],
    &[
        "X-Originating-IP: 10.99.0.21",
        "CF-Connecting-IP: 10.99.0.21",
    ],
    &["Client-IP: 10.99.0.21", "X-Cluster-Client-IP: 10.99.0.21"],
    &["Host: 10.99.0.21"],
];

// ---------------------------------------------------------------------------

#[test]
fn cloud_init_ec2_finds_the_instance() {
    let mut lab = Lab::new("ec2");
    let d = lab.tinkerbox("");
    apply(&d, &lab, &[hardware_a(), hardware_b()]);
    let a = lab.client("a", A_MAC, A_IP);

    // IMDSv1, as on any non-AWS platform.
    let v = lab.cloud_init(&a, &["ec2", URL]);
    assert_eq!(v["get_data"], true, "{v:#}");
    assert_eq!(v["cloud_name"], "unknown");
    assert_eq!(v["api_token"], Value::Null, "no IMDSv2 off AWS");
    assert_eq!(v["metadata_address"], URL);
    assert_eq!(v["instance_id"], A_ID);
    assert_eq!(v["local_hostname"], A_NAME);
    assert_eq!(v["public_keys"], json!(A_KEYS));
    assert_eq!(v["userdata"], A_USER_DATA, "user-data must be byte-exact");
    let md = &v["metadata"];
    assert_eq!(md["instance-id"], A_ID);
    assert_eq!(md["local-ipv4"], A_IP);
    assert_eq!(md["mac"], A_MAC);
    assert_eq!(md["tags"], json!(["k8s", "worker"]));
    assert_eq!(md["placement"]["availability-zone"], "lab1");
    assert_eq!(md["operating-system"]["slug"], "ubuntu_22_04");
    assert_eq!(
        md["network"]["interfaces"]["macs"][A_MAC]["subnet-ipv4-cidr-block"],
        "10.99.0.0/24"
    );
    assert!(
        v["seconds"].as_f64().unwrap() < 5.0,
        "no retries expected: {}",
        v["seconds"]
    );
    // 22.4's DataSourceEc2 does not read vendor-data; the service has it.
    assert_eq!(
        get(&a, "/latest/vendor-data", &[]),
        (200, A_VENDOR_DATA.to_string())
    );

    // IMDSv2, as on AWS: PUT /latest/api/token, then every GET carries it;
    // no IMDSv1 fallback, and a 401 anywhere would make cloud-init re-PUT.
    let (ok_before, refused_before) = (
        d.metric(&metadata_requests(200)),
        d.metric(&metadata_requests(401)) + d.metric(&metadata_requests(403)),
    );
    let v = lab.cloud_init(&a, &["ec2", URL, "--aws"]);
    assert_eq!(v["get_data"], true, "{v:#}");
    assert_eq!(v["cloud_name"], "aws");
    assert_eq!(v["instance_id"], A_ID);
    assert_eq!(v["local_hostname"], A_NAME);
    assert_eq!(v["public_keys"], json!(A_KEYS));
    assert_eq!(v["userdata"], A_USER_DATA);
    assert_eq!(
        v["identity"]["instanceId"], A_ID,
        "dynamic/instance-identity/document"
    );
    assert_eq!(v["identity"]["privateIp"], A_IP);
    assert_eq!(v["identity"]["availabilityZone"], "lab1");
    let tok = v["api_token"]
        .as_str()
        .expect("cloud-init holds an IMDSv2 token");
    // The token cloud-init got is one the daemon issued to A.
    assert_eq!(
        get(&a, "/latest/meta-data/instance-id", &[&with_token(tok)]),
        (200, A_ID.to_string())
    );
    assert!(d.metric(&metadata_requests(200)) > ok_before + 10.0);
    assert_eq!(
        d.metric(&metadata_requests(401)) + d.metric(&metadata_requests(403)),
        refused_before,
        "no token was refused during the IMDSv2 crawl"
    );
}

/// `[metadata] listen`: Hegel's port 50061, where CAPT's default template
/// points cloud-init, serves the same metadata (and only the metadata).
#[test]
fn hegel_port_serves_cloud_init_as_capt_points_it() {
    let mut lab = Lab::new("hegel");
    let d = lab.tinkerbox("listen = \"0.0.0.0:50061\"");
    apply(&d, &lab, &[hardware_a(), hardware_b()]);
    let a = lab.client("a", A_MAC, A_IP);
    let hegel = "http://10.99.0.1:50061";
    let v = lab.cloud_init(&a, &["ec2", hegel]);
    assert_eq!(v["get_data"], true, "{v:#}");
    assert_eq!(v["metadata_address"], hegel);
    assert_eq!(v["instance_id"], A_ID);
    assert_eq!(v["userdata"], A_USER_DATA);
    // Nothing but metadata there: no scripts, no artifacts, no health.
    let (code, _) = curl(&a, &[&format!("{hegel}/healthz")]);
    assert_eq!(code, 404);
    assert!(d.metric("tinkerbox_http_requests_total{listener=\"metadata\",code=\"200\"}") > 0.0);
}

#[test]
fn cloud_init_nocloud_finds_the_instance_and_network() {
    let mut lab = Lab::new("nocl");
    let d = lab.tinkerbox("");
    apply(&d, &lab, &[hardware_a(), hardware_b()]);
    let a = lab.client("a", A_MAC, A_IP);

    let v = lab.cloud_init(&a, &["nocloud", &format!("{URL}/cloud-init/")]);
    assert_eq!(v["get_data"], true, "{v:#}");
    assert_eq!(v["instance_id"], A_ID);
    assert_eq!(v["local_hostname"], A_NAME);
    assert_eq!(v["public_keys"], json!(A_KEYS));
    assert_eq!(v["userdata"], A_USER_DATA, "user-data must be byte-exact");
    assert_eq!(v["vendordata"], A_VENDOR_DATA);
    assert_eq!(v["metadata"]["dsmode"], "net");
    assert!(
        v["seconds"].as_f64().unwrap() < 5.0,
        "no retries expected (every file answers 200): {}",
        v["seconds"]
    );

    // 22.4 does not fetch network-config over HTTP: fetch it as a newer
    // cloud-init would and hand it to 22.4's own parser.
    let (code, netcfg) = get(&a, "/cloud-init/network-config", &[]);
    assert_eq!(code, 200, "{netcfg}");
    let file = lab.path("network-config");
    std::fs::write(&file, &netcfg).unwrap();
    // In the lab namespace: cloud-init maps MACs to local interfaces, and
    // nothing there has A's MAC.
    let n = lab.cloud_init(&lab.ns, &["netcfg", file.to_str().unwrap()]);
    assert_eq!(n["version"], 2);
    let ifaces = n["interfaces"].as_array().unwrap();
    assert_eq!(ifaces.len(), 1, "{n:#}");
    let eno1 = &ifaces[0];
    assert_eq!(eno1["name"], "eno1", "set-name");
    assert_eq!(eno1["type"], "physical");
    assert_eq!(eno1["mac_address"], A_MAC, "match.macaddress");
    let subnets = eno1["subnets"].as_array().unwrap();
    assert_eq!(subnets.len(), 1, "static only, no DHCP: {n:#}");
    let s = &subnets[0];
    assert_eq!(s["type"], "static");
    assert_eq!(s["address"], A_IP);
    assert_eq!(s["prefix"], 24);
    assert_eq!(s["netmask"], "255.255.255.0");
    assert_eq!(
        s["routes"],
        json!([{"gateway": "10.99.0.1", "netmask": "0.0.0.0", "network": "0.0.0.0", "prefix": 0}]),
        "default route via the gateway"
    );
    assert_eq!(n["has_default_route"], true);
    assert_eq!(s["dns_nameservers"], json!(["10.99.0.53", "10.99.0.54"]));
    assert_eq!(s["dns_search"], json!(["lab.example"]));
    assert_eq!(n["dns"]["nameservers"], json!(["10.99.0.53", "10.99.0.54"]));
    assert_eq!(n["dns"]["search"], json!(["lab.example"]));
}

#[test]
fn unknown_ip_fails_cleanly() {
    let mut lab = Lab::new("unkn");
    let d = lab.tinkerbox("");
    apply(&d, &lab, &[hardware_a(), hardware_b()]);
    let u = lab.client("u", "52:54:00:10:00:99", UNKNOWN_IP);

    // IMDSv1: the availability check sees 404 until max_wait runs out.
    let v = lab.cloud_init(&u, &["ec2", URL, "--max-wait", "2", "--timeout", "1"]);
    assert_eq!(v["get_data"], false, "{v:#}");
    assert_eq!(v["metadata_address"], Value::Null);
    let took = v["seconds"].as_f64().unwrap();
    assert!(took < 10.0, "gave up after {took}s with max_wait 2");
    // IMDSv2: the token PUT is refused (404), which ends it at once.
    let v = lab.cloud_init(
        &u,
        &["ec2", URL, "--aws", "--max-wait", "2", "--timeout", "1"],
    );
    assert_eq!(v["get_data"], false, "{v:#}");
    assert_eq!(v["api_token"], Value::Null);
    let took = v["seconds"].as_f64().unwrap();
    assert!(took < 5.0, "gave up after {took}s");

    for path in [
        "/latest/meta-data/instance-id",
        "/2009-04-04/meta-data/instance-id",
        "/latest/meta-data/",
        "/latest/user-data",
        "/latest/dynamic/instance-identity/document",
        "/metadata",
        "/cloud-init/meta-data",
        "/cloud-init/user-data",
        "/cloud-init/network-config",
    ] {
        let (code, body) = get(&u, path, &[]);
        assert_eq!(code, 404, "{path}: {body}");
        for secret in [A_ID, B_ID, "cloud-config"] {
            assert!(!body.contains(secret), "{path} leaks {secret}: {body}");
        }
    }
    assert_eq!(put_token(&u, &[&ttl("60")]).0, 404, "no token for nobody");
}

#[test]
fn identity_cannot_be_spoofed() {
    let mut lab = Lab::new("spoof");
    let mut d = lab.tinkerbox("");
    apply(&d, &lab, &[hardware_a(), hardware_b()]);
    let b = lab.client("b", B_MAC, B_IP);

    assert_eq!(
        get(&b, "/latest/user-data", &[]),
        (200, B_USER_DATA.to_string())
    );
    assert_eq!(
        get(&b, "/latest/user-data", &["X-Forwarded-For: 10.99.0.21"]),
        (200, B_USER_DATA.to_string()),
        "X-Forwarded-For from an untrusted peer is ignored"
    );
    // No header trick on any path shows B anything of A's.
    for headers in SPOOF_HEADERS {
        for (path, want) in [
            ("/latest/user-data", Some(B_USER_DATA)),
            ("/2009-04-04/user-data", Some(B_USER_DATA)),
            ("/cloud-init/user-data", Some(B_USER_DATA)),
            ("/latest/meta-data/instance-id", Some(B_ID)),
            ("/latest/vendor-data", None),
            ("/metadata", None),
            ("/cloud-init/meta-data", None),
        ] {
            let (code, body) = get(&b, path, headers);
            for secret in [A_ID, A_USER_DATA, A_VENDOR_DATA, A_NAME, A_KEYS[0]] {
                assert!(
                    !body.contains(secret),
                    "{path} with {headers:?} shows B A's data: {body}"
                );
            }
            if let Some(want) = want {
                assert_eq!((code, body.as_str()), (200, want), "{path} {headers:?}");
            }
        }
    }
    // As AWS: a token request relayed by an unknown proxy is refused.
    for xff in ["X-Forwarded-For: 10.99.0.21", "X-Forwarded-For: 10.99.0.22"] {
        let (code, body) = put_token(&b, &[&ttl("60"), xff]);
        assert_eq!(code, 403, "{xff}: {body}");
    }
    // Nor does A's token help B.
    let a = lab.client("a", A_MAC, A_IP);
    let a_token = token(&a, "60", &[]);
    let (code, body) = get(&b, "/latest/user-data", &[&with_token(&a_token)]);
    assert_eq!(code, 401, "{body}");

    // Behind a trusted proxy, the forwarded address is the caller: the
    // rightmost one that is not a trusted proxy.
    d.stop();
    drop(d);
    let d = lab.tinkerbox(&format!("trusted_proxies = [\"{PROXY_IP}/32\"]"));
    apply(&d, &lab, &[hardware_a(), hardware_b()]);
    let p = lab.client("p", "52:54:00:10:00:05", PROXY_IP);
    let xff = |v: &str| format!("X-Forwarded-For: {v}");
    assert_eq!(
        get(&p, "/latest/user-data", &[&xff(A_IP)]),
        (200, A_USER_DATA.to_string())
    );
    assert_eq!(
        get(&p, "/cloud-init/user-data", &[&xff(A_IP)]),
        (200, A_USER_DATA.to_string())
    );
    assert_eq!(
        get(&p, "/latest/user-data", &[&xff("10.99.0.21, 10.99.0.22")]),
        (200, B_USER_DATA.to_string()),
        "the rightmost untrusted hop wins, not the leftmost"
    );
    assert_eq!(
        get(
            &p,
            "/latest/meta-data/instance-id",
            &[&xff("10.99.0.22, 10.99.0.5")]
        ),
        (200, B_ID.to_string()),
        "trusted hops are skipped from the right"
    );
    assert_eq!(
        get(&p, "/latest/user-data", &[]).0,
        404,
        "without the header the proxy itself is the caller"
    );
    assert_eq!(
        get(&p, "/latest/user-data", &[&xff("10.99.0.21, junk")]).0,
        404,
        "garbage stops the walk at the proxy"
    );
    // Still nothing for B's own spoofing while a proxy is trusted.
    assert_eq!(
        get(&b, "/latest/user-data", &[&xff(A_IP)]),
        (200, B_USER_DATA.to_string())
    );
    assert_eq!(put_token(&b, &[&ttl("60"), &xff(A_IP)]).0, 403);
    // A token fetched through the proxy is A's, and only A's.
    let t = token(&p, "60", &[&xff(A_IP)]);
    assert_eq!(
        get(
            &p,
            "/latest/meta-data/instance-id",
            &[&xff(A_IP), &with_token(&t)]
        ),
        (200, A_ID.to_string())
    );
    assert_eq!(
        get(
            &p,
            "/latest/meta-data/instance-id",
            &[&xff(B_IP), &with_token(&t)]
        )
        .0,
        401
    );
    assert_eq!(
        get(&b, "/latest/meta-data/instance-id", &[&with_token(&t)]).0,
        401
    );
}

#[test]
fn imdsv2_tokens() {
    let mut lab = Lab::new("tok");
    let mut d = lab.tinkerbox("");
    apply(&d, &lab, &[hardware_a(), hardware_b()]);
    let a = lab.client("a", A_MAC, A_IP);
    let b = lab.client("b", B_MAC, B_IP);

    // Issued with the TTL echoed, as AWS does.
    let (code, headers) = curl(
        &a,
        &[
            "-X",
            "PUT",
            "-D",
            "-",
            "-o",
            "/dev/null",
            "-H",
            &ttl("21600"),
            &format!("{URL}/latest/api/token"),
        ],
    );
    assert_eq!(code, 200, "{headers}");
    assert!(
        headers
            .to_ascii_lowercase()
            .contains("x-aws-ec2-metadata-token-ttl-seconds: 21600"),
        "{headers}"
    );

    let t = token(&a, "60", &[]);
    let id = "/latest/meta-data/instance-id";
    assert_eq!(get(&a, id, &[&with_token(&t)]), (200, A_ID.to_string()));
    assert_eq!(
        get(&a, "/latest/user-data", &[&with_token(&t)]),
        (200, A_USER_DATA.to_string())
    );
    assert_eq!(
        get(&b, id, &[&with_token(&t)]).0,
        401,
        "bound to A's address"
    );
    assert_eq!(get(&b, "/cloud-init/user-data", &[&with_token(&t)]).0, 401);
    for bad in [
        "X-aws-ec2-metadata-token;".to_string(), // present and empty
        with_token("garbage"),
        with_token(&t.replacen('.', ".0", 1)),
        with_token(&format!("{}.{}", u32::MAX, t.split_once('.').unwrap().1)),
    ] {
        assert_eq!(get(&a, id, &[&bad]).0, 401, "{bad}");
    }

    // Expiry: whole seconds, so a TTL of 1 is gone 2 s later.
    let short = token(&a, "1", &[]);
    std::thread::sleep(Duration::from_secs(2));
    let (code, body) = get(&a, id, &[&with_token(&short)]);
    assert_eq!(code, 401, "{body}");

    // TTL: 1..=21600, an integer, required.
    for bad in ["0", "21601", "-1", "abc", "1.5"] {
        let (code, body) = put_token(&a, &[&ttl(bad)]);
        assert_eq!(code, 400, "TTL {bad:?}: {body}");
    }
    let (code, body) = put_token(&a, &["X-aws-ec2-metadata-token-ttl-seconds;"]);
    assert_eq!(code, 400, "empty TTL: {body}");
    let (code, body) = put_token(&a, &[]);
    assert_eq!(code, 400, "no TTL header: {body}");
    assert_eq!(put_token(&a, &[&ttl("1")]).0, 200);

    // IMDSv1 off: no token, no data; with one, all of it.
    let old = token(&a, "300", &[]);
    d.stop();
    drop(d);
    let d = lab.tinkerbox("require_token = true");
    apply(&d, &lab, &[hardware_a(), hardware_b()]);
    assert_eq!(
        get(&a, id, &[&with_token(&old)]).0,
        401,
        "a token from before a restart is void (per-process key)"
    );
    let t = token(&a, "300", &[]);
    for path in [
        id,
        "/latest/meta-data/",
        "/latest/user-data",
        "/2009-04-04/user-data",
        "/latest/dynamic/instance-identity/document",
        "/metadata",
        "/cloud-init/meta-data",
        "/cloud-init/user-data",
    ] {
        let (code, body) = get(&a, path, &[]);
        assert_eq!(code, 401, "{path} without a token: {body}");
        let (code, body) = get(&a, path, &[&with_token(&t)]);
        assert_eq!(code, 200, "{path} with a token: {body}");
    }
    assert_eq!(get(&a, id, &[&with_token(&t)]), (200, A_ID.to_string()));
    // cloud-init on AWS sends the token on every request...
    let v = lab.cloud_init(&a, &["ec2", URL, "--aws"]);
    assert_eq!(v["get_data"], true, "{v:#}");
    assert_eq!(v["instance_id"], A_ID);
    assert_eq!(v["userdata"], A_USER_DATA);
    // ...and elsewhere it never does, so it finds nothing.
    let v = lab.cloud_init(&a, &["ec2", URL, "--max-wait", "2", "--timeout", "1"]);
    assert_eq!(v["get_data"], false, "{v:#}");
}

#[test]
fn metadata_reads_are_events() {
    let mut lab = Lab::new("ev");
    let d = lab.tinkerbox("");
    apply(&d, &lab, &[hardware_a(), hardware_b()]);
    let a = lab.client("a", A_MAC, A_IP);

    let ok_before = d.metric(&metadata_requests(200));
    for path in [
        "/latest/meta-data/instance-id",
        "/latest/user-data",
        "/latest/vendor-data",
        "/metadata",
        "/cloud-init/meta-data",
        "/cloud-init/network-config",
    ] {
        let (code, body) = get(&a, path, &[]);
        assert_eq!(code, 200, "{path}: {body}");
    }
    assert!(
        d.metric(&metadata_requests(200)) >= ok_before + 6.0,
        "tinkerbox_metadata_requests_total{{code=\"200\"}} did not move by 6"
    );

    // Events are written in batches: poll, at most 10 s.
    let wanted = [
        "instance-id",
        "user-data",
        "vendor-data",
        "/metadata",
        "NoCloud meta-data",
        "NoCloud network-config",
    ];
    let mut last = vec![];
    let reads = poll(Duration::from_secs(10), || {
        last = metadata_reads(&events_json(&d, A_NAME));
        wanted
            .iter()
            .all(|w| {
                last.iter()
                    .any(|e| e["message"].as_str().unwrap().contains(w))
            })
            .then(|| last.clone())
    })
    .unwrap_or_else(|| {
        panic!(
            "metadata.read events of {A_NAME}: want {wanted:?}, have {:#}\n{}",
            Value::Array(last.clone()),
            d.log()
        )
    });
    for e in &reads {
        assert_eq!(e["ip"], A_IP, "{e}");
        assert_eq!(e["name"], A_NAME, "{e}");
        assert_eq!(e["namespace"], "default", "{e}");
    }
    assert!(
        reads
            .iter()
            .any(|e| e["message"].as_str().unwrap().contains(A_ID)),
        "the NoCloud read names the instance id: {reads:#?}"
    );
    assert!(
        metadata_reads(&events_json(&d, B_NAME)).is_empty(),
        "A's reads are not B's"
    );
}

// ---------------------------------------------------------------------------
// Found while writing the above; these assert the correct behaviour.

/// EC2's `public-keys/` listing is `<n>=<name>`, and cloud-init keys its
/// dict by `<name>`: keys with the same comment, without one, or with a
/// comment that looks like a made-up name must still all reach cloud-init.
#[test]
fn cloud_init_ec2_gets_every_key_even_without_comments() {
    let mut lab = Lab::new("keys");
    let d = lab.tinkerbox("");
    let keys = [
        "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOne",
        "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAITwo",
        "ssh-rsa AAAAB3NzaC1yc2EAAAADAQABAAABAQThree ops@lab",
        "ssh-rsa AAAAB3NzaC1yc2EAAAADAQABAAABAQFour ops@lab",
        // A comment equal to the name a later comment-less key would get.
        "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIFive key-5",
        "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAISix",
    ];
    let mut b = hardware_b();
    b["spec"]["metadata"]["instance"]["ssh_keys"] = json!(keys);
    apply(&d, &lab, &[b]);
    let c = lab.client("b", B_MAC, B_IP);
    let v = lab.cloud_init(&c, &["ec2", URL]);
    assert_eq!(v["get_data"], true, "{v:#}");
    let mut got: Vec<String> = serde_json::from_value(v["public_keys"].clone()).unwrap();
    got.sort();
    let mut want: Vec<String> = keys.iter().map(|k| k.to_string()).collect();
    want.sort();
    assert_eq!(
        got,
        want,
        "public-keys/ listing:\n{}",
        get(&c, "/latest/meta-data/public-keys", &[]).1
    );
}

/// `[http] listen = "[::]:PORT"` takes IPv4 too, as IPv4-mapped IPv6
/// peers (::ffff:a.b.c.d): they are still the machine at a.b.c.d.
#[test]
fn dual_stack_listener_knows_ipv4_callers() {
    let mut lab = Lab::new("dual");
    let d = lab.tinkerbox_on(
        "[::]:7080",
        &format!("trusted_proxies = [\"{PROXY_IP}/32\"]"),
    );
    apply(&d, &lab, &[hardware_a(), hardware_b()]);
    let a = lab.client("a", A_MAC, A_IP);
    assert_eq!(
        get(&a, "/latest/meta-data/instance-id", &[]),
        (200, A_ID.to_string())
    );
    let t = token(&a, "60", &[]);
    assert_eq!(
        get(&a, "/latest/user-data", &[&with_token(&t)]),
        (200, A_USER_DATA.to_string())
    );
    let p = lab.client("p", "52:54:00:10:00:05", PROXY_IP);
    assert_eq!(
        get(&p, "/latest/user-data", &["X-Forwarded-For: 10.99.0.22"]),
        (200, B_USER_DATA.to_string()),
        "a trusted IPv4 proxy stays trusted"
    );
}

/// Answers are cached per caller, so an applied change must show on the
/// very next request; repeated reads of a document are one event per
/// window (60 s), while the request counter counts every read.
#[test]
fn applied_changes_show_at_once_and_reads_are_coalesced() {
    let mut lab = Lab::new("cc");
    let d = lab.tinkerbox("");
    apply(&d, &lab, &[hardware_a(), hardware_b()]);
    let a = lab.client("a", A_MAC, A_IP);
    let reads = [
        "/latest/meta-data/instance-id",
        "/metadata",
        "/latest/user-data",
        "/cloud-init/meta-data",
    ];

    let ok_before = d.metric(&metadata_requests(200));
    for _ in 0..3 {
        for path in reads {
            let (code, body) = get(&a, path, &[]);
            assert_eq!(code, 200, "{path}: {body}");
        }
    }
    let (_, listing) = get(&a, "/latest/", &[]);
    assert!(listing.contains("vendor-data"), "{listing}");
    assert_eq!(get(&a, "/latest/meta-data/instance-id", &[]).1, A_ID);
    assert!(
        d.metric(&metadata_requests(200)) >= ok_before + 14.0,
        "every read is counted"
    );

    // Change A: another instance id and hostname, new user data, no vendor data.
    let mut changed = hardware_a();
    changed["spec"]["metadata"]["instance"]["id"] = json!("i-changed");
    changed["spec"]["metadata"]["instance"]["hostname"] = json!("worker-a2");
    changed["spec"]["userData"] = json!("#cloud-config\nhostname: worker-a2\n");
    changed["spec"]
        .as_object_mut()
        .unwrap()
        .remove("vendorData");
    apply(&d, &lab, &[changed, hardware_b()]);

    for _ in 0..2 {
        assert_eq!(
            get(&a, "/latest/meta-data/instance-id", &[]),
            (200, "i-changed".to_string())
        );
        let (code, body) = get(&a, "/metadata", &[]);
        assert_eq!(code, 200, "{body}");
        let v: Value = serde_json::from_str(&body).unwrap();
        assert_eq!(v["id"], "i-changed", "{v:#}");
        assert_eq!(v["hostname"], "worker-a2", "{v:#}");
        assert_eq!(
            get(&a, "/latest/user-data", &[]),
            (200, "#cloud-config\nhostname: worker-a2\n".to_string())
        );
        let (code, body) = get(&a, "/cloud-init/meta-data", &[]);
        assert_eq!(code, 200, "{body}");
        assert!(body.contains("i-changed"), "{body}");
        assert!(body.contains("worker-a2"), "{body}");
        assert_eq!(
            get(&a, "/latest/meta-data/hostname", &[]),
            (200, "worker-a2".to_string())
        );
        let (_, listing) = get(&a, "/latest/", &[]);
        assert!(!listing.contains("vendor-data"), "{listing}");
        assert_eq!(get(&a, "/latest/vendor-data", &[]).0, 404);
    }

    // A last, new document: once its event is stored, so are all before
    // it (one writer, in order).
    assert_eq!(get(&a, "/cloud-init/network-config", &[]).0, 200);
    let mut last = vec![];
    poll(Duration::from_secs(10), || {
        last = metadata_reads(&events_json(&d, A_NAME));
        last.iter()
            .any(|e| e["message"] == "metadata read: NoCloud network-config")
            .then_some(())
    })
    .unwrap_or_else(|| panic!("no network-config read: {last:#?}\n{}", d.log()));
    let count = |m: &str| last.iter().filter(|e| e["message"] == m).count();
    // One before the change, one after, however many reads.
    for m in [
        "metadata read: instance-id",
        "metadata read: /metadata",
        "metadata read: user-data",
    ] {
        assert_eq!(count(m), 2, "{m}: {last:#?}");
    }
    assert_eq!(
        count(&format!(
            "metadata read: NoCloud meta-data (instance-id {A_ID})"
        )),
        1,
        "{last:#?}"
    );
    assert_eq!(
        count("metadata read: NoCloud meta-data (instance-id i-changed)"),
        1,
        "{last:#?}"
    );
    assert!(metadata_reads(&events_json(&d, B_NAME)).is_empty());
}
