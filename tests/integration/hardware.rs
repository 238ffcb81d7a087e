//! Hardware through the real CLI and API: Tinkerbell's own manifests,
//! realistic round trips, conflicts, auth and bad input.

use crate::common::*;
use serde_json::{Value, json};
use std::time::Duration;

fn by_name(items: &[Value], name: &str) -> Value {
    items
        .iter()
        .find(|d| d["metadata"]["name"] == name)
        .cloned()
        .unwrap_or_else(|| panic!("{name} not stored"))
}

#[test]
fn compat_corpus_applies_and_reads_back_unchanged() {
    let dir = compat_dir();
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("compat corpus {} missing: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| {
            p.file_name()
                .unwrap()
                .to_str()
                .unwrap()
                .starts_with("hardware-")
        })
        .collect();
    files.sort();
    assert!(
        files.len() >= 3,
        "expected the Hardware manifests in {}",
        dir.display()
    );
    for file in files {
        // One daemon per file: two of them are the same machine (sm01).
        let d = Daemon::start();
        let text = std::fs::read_to_string(&file).unwrap();
        let docs = yaml_docs(&text);
        let o = d.cli(&["hardware", "apply", "-f", file.to_str().unwrap()]);
        let stderr = String::from_utf8_lossy(&o.stderr).to_string();
        let stored = d.all_hardware();
        let mut expect_ok = 0;
        for doc in &docs {
            let name = doc["metadata"]["name"].as_str().unwrap();
            if name == "bad-data" {
                // The file backend's deliberately invalid entry: address "3".
                assert!(!o.status.success(), "bad-data must fail the apply");
                assert!(
                    stderr.contains("spec.interfaces[0].dhcp.ip.address")
                        && stderr.contains("\"3\""),
                    "error must name the field: {stderr}"
                );
                assert!(stored.iter().all(|s| s["metadata"]["name"] != "bad-data"));
                continue;
            }
            expect_ok += 1;
            assert_eq!(
                &by_name(&stored, name),
                doc,
                "{} / {name} changed on the way",
                file.display()
            );
            // And through the CLI's own renderings.
            let json: Value =
                serde_json::from_str(&d.cli_ok(&["hardware", "get", name, "-o", "json"])).unwrap();
            assert_eq!(&json, doc);
            let yaml = yaml_docs(&d.cli_ok(&["hardware", "get", name, "-o", "yaml"]));
            assert_eq!(&yaml[0], doc);
        }
        assert_eq!(stored.len(), expect_ok, "{}", file.display());
    }
}

/// Realistic manifests: multi-NIC, instance metadata with ips and ssh keys,
/// userData, netboot.osie, a BMC reference and fields tinkerbox does not
/// model (which must survive).
const REALISTIC: &str = r##"
apiVersion: tinkerbell.org/v1alpha1
kind: Hardware
metadata:
  name: worker-01
  namespace: lab
  labels:
    rack: r12
    tinkerbell.org/role: worker
  annotations:
    owner: "team-metal"
spec:
  agentID: "52:54:00:10:00:01"
  bmcRef:
    apiGroup: bmc.tinkerbell.org
    kind: Machine
    name: bmc-worker-01
  disks:
  - device: /dev/sda
  - device: /dev/nvme0n1
  interfaces:
  - dhcp:
      arch: x86_64
      hostname: worker-01
      ip:
        address: 10.99.0.21
        gateway: 10.99.0.1
        netmask: 255.255.255.0
        family: 4
      lease_time: 4294967294
      mac: "52:54:00:10:00:01"
      name_servers: [10.99.0.1, 1.1.1.1]
      time_servers: [10.99.0.1]
      uefi: true
      domain_name: lab.example
      vlan_id: "12"
      classless_static_routes:
      - destination_descriptor: 192.168.0.0/16
        router: 10.99.0.254
      iface_name: eno1
    netboot:
      allowPXE: true
      allowWorkflow: true
      osie:
        baseURL: http://10.99.0.1:7080/artifacts/
        kernel: vmlinuz-x86_64
        initrd: initramfs-x86_64
        kernelParams: ["console=ttyS0,115200", "tink.debug=1"]
      ipxe:
        binary: snponly.efi
  - dhcp:
      mac: "52:54:00:10:00:02"
      ip:
        address: 10.98.0.21
        netmask: 255.255.255.0
    disableDhcp: true
    netboot:
      allowPXE: false
    futureInterfaceField: {nested: [1, 2, 3]}
  metadata:
    facility:
      facility_code: lab1
      plan_slug: c3.small.x86
    manufacturer:
      slug: intel
    state: provisioning
    instance:
      id: 0f0b6c2e-3f0a-4a7e-9c61-1d2b3c4d5e6f
      hostname: worker-01
      allow_pxe: true
      ips:
      - address: 10.99.0.21
        netmask: 255.255.255.0
        gateway: 10.99.0.1
        family: 4
        public: false
        management: true
      - address: "2001:db8::21"
        family: 6
        public: true
      operating_system:
        distro: ubuntu
        version: "22.04"
        os_slug: ubuntu_22_04
        image_tag: v1.2.3
      ssh_keys:
      - ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIHzWhk6zqWnB0h4ZnH6m2eY1bN0Jc8zq4n6WbJtq5Xr1 ops@lab
      - ssh-rsa AAAAB3NzaC1yc2EAAAADAQABAAABAQC7 backup@lab
      tags: [k8s, worker]
      storage:
        disks:
        - device: /dev/sda
          wipe_table: true
          partitions:
          - {label: BIOS, number: 1, size: 4096}
          - {label: ROOT, number: 2, size: 0}
  userData: |
    #cloud-config
    users:
    - name: ops
      ssh_authorized_keys:
      - ssh-ed25519 AAAA ops@lab
    runcmd:
    - [sh, -c, 'echo "quotes: \"x\" and tabs	here"']
  vendorData: "#cloud-config\npackages: [htop]\n"
  tinkVersion: 2
  resources:
    cpu: "16"
    memory: 64Gi
  someFutureSpecField:
    enabled: true
    ratio: 0.75
    list: [a, b]
status:
  state: ok
---
apiVersion: tinkerbell.org/v1alpha1
kind: Hardware
metadata:
  name: tiny
spec:
  interfaces:
  - dhcp:
      mac: "52:54:00:10:00:03"
"##;

#[test]
fn realistic_manifests_round_trip_yaml_and_json() {
    let d = Daemon::start();
    let f = write_file(&d.dir, "realistic.yaml", REALISTIC);
    let out = d.cli_ok(&["hardware", "apply", "-f", f.to_str().unwrap()]);
    assert_eq!(
        out,
        "hardware.tinkerbell.org/lab/worker-01 created\nhardware.tinkerbell.org/tiny created\n"
    );
    let mut docs = yaml_docs(REALISTIC);
    // As the API server does, a Hardware without a namespace lands in "default".
    docs[1]["metadata"]["namespace"] = json!("default");

    let worker = d.cli_ok(&["hardware", "get", "worker-01", "-n", "lab", "-o", "yaml"]);
    assert_eq!(yaml_docs(&worker)[0], docs[0]);
    assert!(worker.contains("someFutureSpecField") && worker.contains("futureInterfaceField"));
    let worker_json: Value = serde_json::from_str(&d.cli_ok(&[
        "hardware",
        "get",
        "worker-01",
        "-n",
        "lab",
        "-o",
        "json",
    ]))
    .unwrap();
    assert_eq!(worker_json, docs[0]);
    assert_eq!(
        worker_json["spec"]["userData"], docs[0]["spec"]["userData"],
        "userData byte-exact"
    );

    // The whole list, in YAML, re-applies as "unchanged".
    let all = d.cli_ok(&["hardware", "get", "-A", "-o", "yaml"]);
    let listed = yaml_docs(&all);
    assert_eq!(
        listed,
        vec![docs[1].clone(), docs[0].clone()],
        "ordered by namespace, name"
    );
    let again = d.cli_stdin(&["hardware", "apply", "-f", "-"], Some(&all));
    assert!(again.status.success());
    assert_eq!(
        String::from_utf8_lossy(&again.stdout),
        "hardware.tinkerbell.org/tiny unchanged\nhardware.tinkerbell.org/lab/worker-01 unchanged\n"
    );

    // Table output: default namespace only, unless -A.
    let table = d.cli_ok(&["hardware", "get"]);
    assert!(
        table.starts_with("NAME ") && table.contains("tiny") && !table.contains("worker-01"),
        "{table}"
    );
    let table = d.cli_ok(&["hardware", "get", "-A"]);
    assert!(
        table.contains("lab         worker-01   52:54:00:10:00:01 (+1)   10.99.0.21"),
        "{table}"
    );

    // Update: a changed field is stored, and reported as configured.
    let changed = REALISTIC.replace("plan_slug: c3.small.x86", "plan_slug: m3.large.x86");
    let o = d.cli_stdin(&["hardware", "apply", "-f", "-"], Some(&changed));
    assert_eq!(
        String::from_utf8_lossy(&o.stdout),
        "hardware.tinkerbell.org/lab/worker-01 configured\nhardware.tinkerbell.org/tiny unchanged\n"
    );
    let (_, v) = d.api("GET", "/api/v1/hardware/worker-01?namespace=lab", None);
    assert_eq!(
        v["spec"]["metadata"]["facility"]["plan_slug"],
        "m3.large.x86"
    );

    // Delete, then it is gone and a second delete is a clear 404.
    assert_eq!(
        d.cli_ok(&["hardware", "delete", "tiny"]),
        "hardware.tinkerbell.org/tiny deleted\n"
    );
    let o = d.cli(&["hardware", "delete", "tiny"]);
    assert!(!o.status.success());
    assert_eq!(
        String::from_utf8_lossy(&o.stderr),
        "error: 404 Not Found: Hardware default/tiny not found\n"
    );
    let o = d.cli(&["hardware", "get", "tiny"]);
    assert!(!o.status.success());

    // The event log saw all of it (written within 0.1 s, in order).
    let mut ev = String::new();
    for _ in 0..100 {
        ev = d.cli_ok(&["events", "tiny"]);
        if ev.contains("hardware.deleted") {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let kinds: Vec<&str> = ev
        .lines()
        .skip(1)
        .map(|l| l.split_whitespace().nth(1).unwrap())
        .collect();
    assert_eq!(kinds, ["hardware.created", "hardware.deleted"], "{ev}");
    let ev: Value =
        serde_json::from_str(&d.cli_ok(&["events", "worker-01", "-n", "lab", "-o", "json"]))
            .unwrap();
    let kinds: Vec<&str> = ev
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["kind"].as_str().unwrap())
        .collect();
    assert_eq!(kinds, ["hardware.created", "hardware.updated"]);
}

#[test]
fn mac_spellings_normalise_and_find_conflicts() {
    let d = Daemon::start();
    let a = write_file(
        &d.dir,
        "a.yaml",
        &hw_doc("a", "52-54-00-AA-00-01", "10.0.0.1"),
    );
    d.cli_ok(&["hardware", "apply", "-f", a.to_str().unwrap()]);
    let (_, v) = d.api("GET", "/api/v1/hardware/a", None);
    assert_eq!(
        v["spec"]["interfaces"][0]["dhcp"]["mac"],
        "52:54:00:aa:00:01"
    );

    let before = d.all_hardware();
    // Same MAC in another spelling, on another Hardware: 409 naming the owner.
    let (code, v) = d.api(
        "POST",
        "/api/v1/hardware",
        Some((
            "application/yaml",
            hw_doc("b", "5254.00aa.0001", "10.0.0.2").as_bytes(),
        )),
    );
    assert_eq!(code, 409, "{v}");
    assert_eq!(v["field"], "spec.interfaces[0].dhcp.mac");
    assert_eq!(v["conflict"], "default/a");
    assert!(
        v["error"]
            .as_str()
            .unwrap()
            .contains("52:54:00:aa:00:01 already belongs to Hardware default/a")
    );
    // Same IP: 409 too.
    let (code, v) = d.api(
        "POST",
        "/api/v1/hardware",
        Some((
            "application/yaml",
            hw_doc("b", "52:54:00:aa:00:02", "10.0.0.1").as_bytes(),
        )),
    );
    assert_eq!(code, 409, "{v}");
    assert_eq!(v["field"], "spec.interfaces[0].dhcp.ip.address");
    // Through the CLI: one line, non-zero exit.
    let b = write_file(
        &d.dir,
        "b.yaml",
        &hw_doc("b", "52:54:00:aa:00:01", "10.0.0.9"),
    );
    let o = d.cli(&["hardware", "apply", "-f", b.to_str().unwrap()]);
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("409 Conflict: spec.interfaces[0].dhcp.mac: MAC 52:54:00:aa:00:01 already belongs to Hardware default/a"), "{err}");
    // An atomic batch with one conflicting item changes nothing at all.
    let batch = format!(
        "{}---\n{}",
        hw_doc("c", "52:54:00:aa:00:03", "10.0.0.3"),
        hw_doc("d", "52:54:00:aa:00:01", "10.0.0.4")
    );
    let (code, v) = d.api(
        "POST",
        "/api/v1/hardware",
        Some(("application/yaml", batch.as_bytes())),
    );
    assert_eq!(code, 409, "{v}");
    assert_eq!(v["field"], "[1].spec.interfaces[0].dhcp.mac");
    assert_eq!(d.all_hardware(), before, "store unchanged after conflicts");
    assert!(d.metric("tinkerbox_hardware_applies_total{outcome=\"conflict\"}") >= 3.0);

    // Moving a MAC between machines works once the old owner lets go.
    let a2 = write_file(
        &d.dir,
        "a2.yaml",
        &hw_doc("a", "52:54:00:aa:00:09", "10.0.0.1"),
    );
    d.cli_ok(&["hardware", "apply", "-f", a2.to_str().unwrap()]);
    d.cli_ok(&["hardware", "apply", "-f", b.to_str().unwrap()]);
    assert_eq!(d.metric("tinkerbox_hardware "), 2.0);
}

#[test]
fn auth_is_required_everywhere() {
    let d = Daemon::start();
    let body = hw_doc("a", "52:54:00:aa:00:01", "10.0.0.1");
    for token in [None, Some("wrong"), Some(""), Some(&d.token()[..63])] {
        for (method, path) in [
            ("GET", "/api/v1/hardware"),
            ("GET", "/api/v1/hardware/a"),
            ("DELETE", "/api/v1/hardware/a"),
            ("GET", "/api/v1/events"),
            ("GET", "/api/v1/nonexistent"),
        ] {
            let (code, _) = d.api_with_token(method, path, None, token);
            assert_eq!(code, 401, "{method} {path} with {token:?}");
        }
        let (code, v) = d.api_with_token(
            "POST",
            "/api/v1/hardware",
            Some(("application/yaml", body.as_bytes())),
            token,
        );
        assert_eq!(code, 401, "{v}");
    }
    assert!(d.all_hardware().is_empty(), "nothing was created");
    // The token file is private.
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(d.dir.join("state/api-token"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600);
    // The CLI with a wrong --token fails in one line.
    let o = d.cli(&["--token", "nope", "hardware", "get"]);
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.starts_with("error: 401 Unauthorized") && err.lines().count() == 1,
        "{err}"
    );
    assert!(d.metric("tinkerbox_http_requests_total{listener=\"api\",code=\"401\"}") >= 25.0);
}

#[test]
fn bad_input_gets_clear_4xx_and_service_continues() {
    let d = Daemon::start();
    let good = hw_doc("ok", "52:54:00:aa:00:01", "10.0.0.1");
    let cases: Vec<(&str, Vec<u8>, u16, &str)> = vec![
        ("application/yaml", b"apiVersion: [unclosed".to_vec(), 400, "malformed YAML"),
        ("application/json", b"{\"apiVersion\": ".to_vec(), 400, "malformed JSON"),
        ("application/yaml", good.replace("kind: Hardware", "kind: Pod").into_bytes(), 400, "kind"),
        (
            "application/yaml",
            good.replace("tinkerbell.org/v1alpha1", "tinkerbell.org/v2").into_bytes(),
            400,
            "apiVersion",
        ),
        (
            "application/yaml",
            good.replace("52:54:00:aa:00:01", "52:54:00:aa:00").into_bytes(),
            400,
            "spec.interfaces[0].dhcp.mac",
        ),
        (
            "application/yaml",
            good.replace("10.0.0.1", "10.0.0.256").into_bytes(),
            400,
            "spec.interfaces[0].dhcp.ip.address",
        ),
        (
            "application/yaml",
            good.replace("allowPXE: true", "allowPXE: maybe").into_bytes(),
            400,
            "spec.interfaces[0].netboot.allowPXE",
        ),
        ("application/yaml", good.replace("name: ok", "name: Not_OK").into_bytes(), 400, "metadata.name"),
        ("application/yaml", b"".to_vec(), 400, "no documents"),
        ("application/yaml", vec![0xff, 0xfe, 0x00], 400, "UTF-8"),
        ("application/yaml", b"- 1\n- 2\n".to_vec(), 400, "mapping"),
        // Alias expansion bombs are refused by the parser's budget.
        (
            "application/yaml",
            b"a: &a [x,x,x,x,x,x,x,x,x]\nb: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a]\nc: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b]\nd: &d [*c,*c,*c,*c,*c,*c,*c,*c,*c]\ne: &e [*d,*d,*d,*d,*d,*d,*d,*d,*d]\nf: &f [*e,*e,*e,*e,*e,*e,*e,*e,*e]\ng: &g [*f,*f,*f,*f,*f,*f,*f,*f,*f]\nh: &h [*g,*g,*g,*g,*g,*g,*g,*g,*g]\n".to_vec(),
            400,
            "",
        ),
    ];
    for (ctype, body, want, needle) in &cases {
        let (code, v) = d.api("POST", "/api/v1/hardware", Some((ctype, body)));
        assert_eq!(
            code,
            *want,
            "{}: {v}",
            String::from_utf8_lossy(&body[..body.len().min(60)])
        );
        let text = v.to_string();
        assert!(text.contains(needle), "{needle:?} not in {text}");
    }
    // Over the limit: refused before it is parsed.
    let big = vec![b'#'; tinkerbox::api::BODY_LIMIT + 1];
    let (code, v) = d.api("POST", "/api/v1/hardware", Some(("application/yaml", &big)));
    assert_eq!(code, 413, "{v}");
    assert!(v["error"].as_str().unwrap().contains("larger than"), "{v}");
    // Bad query parameters and unknown paths.
    let (code, _) = d.api("GET", "/api/v1/events?limit=abc", None);
    assert_eq!(code, 400);
    let (code, _) = d.api("GET", "/api/v1/events?limit=0", None);
    assert_eq!(code, 400);
    let (code, _) = d.api("GET", "/api/v1/hardware?bogus=1", None);
    assert_eq!(code, 400);
    let (code, _) = d.api("GET", "/api/v1/nope", None);
    assert_eq!(code, 404);
    // Still serving, nothing stored, and the good document goes in.
    assert!(d.all_hardware().is_empty());
    let (code, v) = d.api(
        "POST",
        "/api/v1/hardware",
        Some(("application/yaml", good.as_bytes())),
    );
    assert_eq!(code, 201, "{v}");
    assert_eq!(v["items"][0]["result"], "created");
    assert!(d.metric("tinkerbox_hardware_applies_total{outcome=\"rejected\"}") >= 11.0);
    // CLI: a malformed file is one readable line.
    let f = write_file(&d.dir, "bad.yaml", "kind: Hardware\n  bad: indent\n");
    let o = d.cli(&["hardware", "apply", "-f", f.to_str().unwrap()]);
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("bad.yaml: malformed YAML") && err.lines().count() == 1,
        "{err}"
    );
    let o = d.cli(&["hardware", "apply", "-f", "/nonexistent.yaml"]);
    assert!(String::from_utf8_lossy(&o.stderr).contains("reading /nonexistent.yaml"));
}

/// An inventory of thousands of machines in one file applies (YAML's
/// default budget refused the 1,025th document), in few requests; a bad
/// document is named with its index and line, and the rest go in.
#[test]
fn thousands_of_documents_in_one_file() {
    let d = Daemon::start();
    let n = 1500;
    let mut text = String::new();
    let mut bad_line = 0;
    for i in 0..n {
        if i > 0 {
            text.push_str("---\n");
        }
        let mac = if i == 700 {
            bad_line = text.lines().count() + 1;
            "not-a-mac".to_string()
        } else {
            format!("02:00:00:00:{:02x}:{:02x}", i >> 8, i & 255)
        };
        text.push_str(&hw_doc(
            &format!("m{i}"),
            &mac,
            &format!("10.1.{}.{}", i >> 8, i & 255),
        ));
    }
    let f = write_file(&d.dir, "big.yaml", &text);
    let o = d.cli(&["hardware", "apply", "-f", f.to_str().unwrap()]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "{err}");
    let want = format!(
        "big.yaml: document 701 (m700, line {bad_line}): spec.interfaces[0].dhcp.mac: invalid MAC"
    );
    assert!(err.contains(&want), "{want:?} not in {err}");
    assert!(err.contains("1 document(s) not applied"), "{err}");
    let out = String::from_utf8_lossy(&o.stdout);
    assert_eq!(
        out.lines().filter(|l| l.ends_with(" created")).count(),
        n - 1
    );
    assert_eq!(d.all_hardware().len(), n - 1);
    // Each batch is one request: the daemon saw a handful, not 1499.
    assert!(d.metric("tinkerbox_http_requests_total{listener=\"api\",code=\"201\"}") <= 4.0);
    // The same file, atomic: nothing is sent while a document is bad.
    let o = d.cli(&["hardware", "apply", "--atomic", "-f", f.to_str().unwrap()]);
    assert!(String::from_utf8_lossy(&o.stderr).contains("nothing applied (--atomic)"));
    // Fixed, it applies atomically in one request.
    let fixed = text.replace("not-a-mac", "02:00:00:00:02:bc");
    let f = write_file(&d.dir, "big.yaml", &fixed);
    let out = d.cli_ok(&["hardware", "apply", "--atomic", "-f", f.to_str().unwrap()]);
    assert_eq!(out.lines().filter(|l| l.ends_with(" created")).count(), 1);
    assert_eq!(
        out.lines().filter(|l| l.ends_with(" unchanged")).count(),
        n - 1
    );
}
