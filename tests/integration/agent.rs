//! tinkerbox-agent (the workspace's second binary) against tinkerbox: real
//! Workflows run through the tink-agent API, with the actions doing their
//! real work on disk images: image2disk onto a file standing for a disk,
//! writefile, cexec and archive2disk into an ext4 filesystem on a loop
//! device (checked with debugfs, not by mounting), a reboot that is only
//! logged (--no-power), an unknown image, and a per-action timeout.

use crate::common::{BIN, Daemon, write_file};
use serde_json::Value;
use sha2::Digest;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

fn agent_bin() -> PathBuf {
    let p = Path::new(BIN).with_file_name("tinkerbox-agent");
    assert!(
        p.exists(),
        "{} is not built: cargo build -p tinkerbox-agent (the workspace's test run builds it)",
        p.display()
    );
    p
}

/// The agent, stopped by PID when the test ends however it ends.
struct Agent(Child);

impl Agent {
    fn start(d: &Daemon, id: &str) -> Agent {
        Agent::start_with(d, id, &[], &[])
    }

    fn command(d: &Daemon, id: &str, args: &[&str], env: &[(&str, &str)]) -> Command {
        let mut c = Command::new(agent_bin());
        c.args(["--grpc-server", &d.tink.to_string(), "--id", id])
            .args(["--cmdline", "/dev/null", "--no-power"])
            .arg("--work-dir")
            .arg(d.dir.join("agent-work"))
            .args(args)
            .env("RUST_LOG", "info");
        for (k, v) in env {
            c.env(k, v);
        }
        c
    }

    fn start_with(d: &Daemon, id: &str, args: &[&str], env: &[(&str, &str)]) -> Agent {
        let log = std::fs::File::create(d.dir.join(format!("agent-{id}.log"))).unwrap();
        let child = Agent::command(d, id, args, env)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        Agent(child)
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A loop device over an ext4 image file, detached at the end.
struct Loop {
    dev: String,
    image: PathBuf,
}

impl Loop {
    fn ext4(dir: &Path) -> Loop {
        let image = dir.join("part.ext4");
        std::fs::File::create(&image)
            .unwrap()
            .set_len(32 << 20)
            .unwrap();
        let mk = Command::new("mkfs.ext4")
            .args(["-q", "-F"])
            .arg(&image)
            .output()
            .expect("mkfs.ext4 (e2fsprogs) is needed");
        assert!(
            mk.status.success(),
            "{}",
            String::from_utf8_lossy(&mk.stderr)
        );
        let o = Command::new("losetup")
            .args(["-f", "--show"])
            .arg(&image)
            .output()
            .unwrap();
        assert!(
            o.status.success(),
            "losetup (this test needs root and loop devices): {}",
            String::from_utf8_lossy(&o.stderr)
        );
        Loop {
            dev: String::from_utf8(o.stdout).unwrap().trim().to_string(),
            image,
        }
    }

    /// `debugfs -R CMD` on the image: what is in the filesystem, read
    /// without mounting it.
    fn debugfs(&self, cmd: &str) -> String {
        let o = Command::new("debugfs")
            .args(["-R", cmd])
            .arg(&self.image)
            .output()
            .unwrap();
        String::from_utf8_lossy(&o.stdout).into_owned()
    }
}

impl Drop for Loop {
    fn drop(&mut self) {
        let _ = Command::new("losetup").args(["-d", &self.dev]).status();
    }
}

fn workflow(d: &Daemon, name: &str) -> Value {
    serde_json::from_str(&d.cli_ok(&["get", "workflow", name, "-o", "json"])).unwrap()
}

fn wait_final(d: &Daemon, name: &str, bound: Duration) -> Value {
    let t0 = Instant::now();
    loop {
        let w = workflow(d, name);
        let s = w["status"]["state"].as_str().unwrap_or("");
        if matches!(s, "SUCCESS" | "FAILED" | "TIMEOUT") {
            return w;
        }
        assert!(t0.elapsed() < bound, "{name} did not end: {w:#}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

const MAC: &str = "02:00:00:00:00:21";

fn apply(d: &Daemon, name: &str, mac: &str, actions: &str) {
    // One address per MAC: its last byte.
    let last = mac.rsplit(':').next().unwrap_or("0");
    let ip = format!("10.0.0.{}", u8::from_str_radix(last, 16).unwrap_or(0));
    let docs = format!(
        r#"---
apiVersion: tinkerbell.org/v1alpha1
kind: Hardware
metadata: {{name: {name}}}
spec:
  disks: [{{device: /dev/vda}}]
  interfaces:
  - dhcp: {{mac: "{mac}", ip: {{address: {ip}, netmask: 255.255.255.0}}}}
    netboot: {{allowPXE: true, allowWorkflow: true}}
---
apiVersion: tinkerbell.org/v1alpha1
kind: Template
metadata: {{name: {name}}}
spec:
  data: |
    version: "0.1"
    name: {name}
    global_timeout: 600
    tasks:
    - name: install
      worker: "{{{{.device_1}}}}"
      actions:
{actions}
---
apiVersion: tinkerbell.org/v1alpha1
kind: Workflow
metadata: {{name: {name}}}
spec:
  templateRef: {name}
  hardwareRef: {name}
  hardwareMap: {{device_1: "{mac}"}}
"#
    );
    let f = write_file(&d.dir, &format!("{name}.yaml"), &docs);
    d.cli_ok(&["apply", "-f", f.to_str().unwrap()]);
}

/// 6 MiB that compress, with a marker at the start.
fn disk_image() -> Vec<u8> {
    let mut v: Vec<u8> = (0..6u32 << 20)
        .map(|i| (i % 253) as u8 ^ (i >> 13) as u8)
        .collect();
    v[..16].copy_from_slice(b"TINKERBOX-IMAGE!");
    v
}

/// image2disk (gzip, checked by SHA256), writefile, cexec, archive2disk
/// and a reboot: every action SUCCESS with its message, the disk holds the
/// image, the filesystem holds the files, and the Hardware the agent's
/// attributes.
#[test]
fn the_agent_installs_and_configures_a_machine() {
    let d = Daemon::start();
    let artifacts = d.dir.join("state/artifacts");
    std::fs::create_dir_all(&artifacts).unwrap();
    let raw = disk_image();
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    gz.write_all(&raw).unwrap();
    let gz = gz.finish().unwrap();
    let sum = hex::encode(sha2::Sha256::digest(&gz));
    std::fs::write(artifacts.join("disk.raw.gz"), &gz).unwrap();
    let mut tar = tar::Builder::new(Vec::new());
    let mut h = tar::Header::new_gnu();
    h.set_size(3);
    h.set_mode(0o640);
    h.set_uid(0);
    h.set_gid(0);
    h.set_mtime(0);
    h.set_cksum();
    tar.append_data(&mut h, "opt/app/VERSION", &b"42\n"[..])
        .unwrap();
    let tar = tar.into_inner().unwrap();
    let tar_sum = hex::encode(sha2::Sha256::digest(&tar));
    std::fs::write(artifacts.join("app.tar"), &tar).unwrap();

    let disk = d.dir.join("disk.img");
    std::fs::File::create(&disk)
        .unwrap()
        .set_len(8 << 20)
        .unwrap();
    let part = Loop::ext4(&d.dir);
    let http = d.http;
    let actions = format!(
        r#"      - name: stream
        image: quay.io/tinkerbell/actions/image2disk:latest
        timeout: 120
        environment:
          IMG_URL: http://{http}/artifacts/disk.raw.gz
          DEST_DISK: {disk}
          COMPRESSED: true
          SHA256: {sum}
      - name: hostname
        image: quay.io/tinkerbell/actions/writefile
        timeout: 60
        environment:
          DEST_DISK: {dev}
          FS_TYPE: ext4
          DEST_PATH: /etc/hostname
          CONTENTS: "node-21\n"
          UID: 0
          GID: 0
          MODE: 0600
          DIRMODE: 0755
      - name: marker
        image: quay.io/tinkerbell/actions/cexec
        timeout: 60
        environment:
          BLOCK_DEVICE: {dev}
          FS_TYPE: ext4
          DEFAULT_INTERPRETER: /bin/sh -c
          CMD_LINE: echo installed-by-cexec > marker
      - name: app
        image: quay.io/tinkerbell/actions/archive2disk
        timeout: 60
        environment:
          ARCHIVE_URL: http://{http}/artifacts/app.tar
          ARCHIVE_TYPE: tar
          DEST_DISK: {dev}
          FS_TYPE: ext4
          DEST_PATH: /
          TARFILE_CHECKSUM: sha256:{tar_sum}
      - name: reboot
        image: ghcr.io/jacobweinstock/waitdaemon:0.2.0
        timeout: 30
        command: ["reboot"]
        environment:
          IMAGE: alpine
          WAIT_SECONDS: 0
"#,
        disk = disk.display(),
        dev = part.dev,
    );
    apply(&d, "install", MAC, &actions);
    let _agent = Agent::start(&d, MAC);
    let w = wait_final(&d, "install", Duration::from_secs(90));
    let actions = &w["status"]["tasks"][0]["actions"];
    let log = std::fs::read_to_string(d.dir.join(format!("agent-{MAC}.log"))).unwrap_or_default();
    assert_eq!(
        w["status"]["state"], "SUCCESS",
        "{actions:#}\nagent log:\n{log}"
    );
    for a in actions.as_array().unwrap() {
        assert_eq!(a["state"], "SUCCESS", "{a:#}");
        assert!(a["executionDuration"].is_string(), "{a:#}");
    }
    let msg = actions[0]["message"].as_str().unwrap();
    assert!(msg.contains("gzip") && msg.contains("MB/s"), "{msg}");
    let got = std::fs::read(&disk).unwrap();
    assert_eq!(got.len(), 8 << 20, "the disk is not truncated");
    assert!(got[..raw.len()] == raw[..], "the disk holds the image");

    assert_eq!(part.debugfs("cat /etc/hostname"), "node-21\n");
    let st = part.debugfs("stat /etc/hostname");
    assert!(st.contains("Mode:  0600"), "{st}");
    assert_eq!(part.debugfs("cat /marker"), "installed-by-cexec\n");
    assert_eq!(part.debugfs("cat /opt/app/VERSION"), "42\n");
    assert!(
        actions[4]["message"]
            .as_str()
            .unwrap()
            .contains("reboot will run in 0s"),
        "{:#}",
        actions[4]
    );
    // The reboot ran after the report, and --no-power only logged it.
    let t0 = Instant::now();
    while !std::fs::read_to_string(d.dir.join(format!("agent-{MAC}.log")))
        .unwrap_or_default()
        .contains("the machine goes down")
    {
        assert!(t0.elapsed() < Duration::from_secs(10), "no reboot logged");
        std::thread::sleep(Duration::from_millis(100));
    }

    // Every step is in the machine's history: the engine's state changes
    // and each action the agent reported, with its seconds.
    // Events are written in batches: wait (bounded) for the last one.
    let t0 = Instant::now();
    let ev: Value = loop {
        let ev: Value =
            serde_json::from_str(&d.cli_ok(&["events", "install", "--limit", "500", "-o", "json"]))
                .unwrap();
        let done = ev
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e["kind"] == "workflow.state" && e["fields"]["to"] == "SUCCESS");
        if done || t0.elapsed() > Duration::from_secs(10) {
            break ev;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let kinds: Vec<&str> = ev
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|e| e["kind"].as_str())
        .collect();
    for k in [
        "workflow.state",
        "workflow.action_started",
        "workflow.action_succeeded",
    ] {
        assert!(kinds.contains(&k), "no {k} event: {kinds:?}");
    }
    let succeeded = kinds
        .iter()
        .filter(|k| **k == "workflow.action_succeeded")
        .count();
    assert_eq!(succeeded, 5, "{kinds:?}");
    let states: Vec<String> = ev
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["kind"] == "workflow.state")
        .map(|e| e["fields"]["to"].as_str().unwrap_or("").to_string())
        .collect();
    for s in ["PENDING", "RUNNING", "POST", "SUCCESS"] {
        assert!(states.iter().any(|x| x == s), "no move to {s}: {states:?}");
    }

    // The inventory learned the machine's hardware from the agent.
    let hw: Value =
        serde_json::from_str(&d.cli_ok(&["get", "hardware", "install", "-o", "json"])).unwrap();
    let attrs = hw["metadata"]["annotations"]["tinkerbell.org/agent-attributes"]
        .as_str()
        .unwrap_or_else(|| panic!("no agent attributes: {hw:#}"));
    let attrs: Value = serde_json::from_str(attrs).unwrap();
    assert!(
        attrs["cpu"]["totalThreads"].as_u64().unwrap() >= 1,
        "{attrs:#}"
    );
    assert!(attrs["memory"]["usable"].is_string(), "{attrs:#}");
}

/// An image with no native action fails at once, naming the image; a
/// download that never comes ends in TIMEOUT by the action's timeout.
#[test]
fn unknown_images_fail_and_timeouts_are_kept() {
    let d = Daemon::start();
    apply(
        &d,
        "unknown",
        MAC,
        "      - {name: sleep, image: bash, timeout: 60, command: [sleep, '2']}\n",
    );
    let agent = Agent::start(&d, MAC);
    let w = wait_final(&d, "unknown", Duration::from_secs(30));
    assert_eq!(w["status"]["state"], "FAILED", "{w:#}");
    let msg = w["status"]["tasks"][0]["actions"][0]["message"]
        .as_str()
        .unwrap();
    assert!(
        msg.contains("\"bash\"") && msg.contains("no container runtime"),
        "{msg}"
    );
    drop(agent);

    // A server that accepts and never answers.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = silent.local_addr().unwrap().port();
    let disk = d.dir.join("disk2.img");
    std::fs::write(&disk, b"").unwrap();
    // A second machine.
    let mac2 = "02:00:00:00:00:22";
    apply(
        &d,
        "slow",
        mac2,
        &format!(
            "      - {{name: stream, image: image2disk, timeout: 2, environment: {{IMG_URL: 'http://127.0.0.1:{port}/x.img', DEST_DISK: {}}}}}\n",
            disk.display()
        ),
    );
    let _agent = Agent::start(&d, mac2);
    let w = wait_final(&d, "slow", Duration::from_secs(30));
    assert_eq!(w["status"]["state"], "TIMEOUT", "{w:#}");
    let a = &w["status"]["tasks"][0]["actions"][0];
    assert_eq!(a["state"], "TIMEOUT", "{a:#}");
    assert!(
        a["message"]
            .as_str()
            .unwrap()
            .contains("timed out after 2s"),
        "{a:#}"
    );
    drop(silent);
}

/// A registry of the field (Debian's docker-registry, the CNCF
/// distribution server) on a free port, stopped by PID.
struct Registry {
    child: Child,
    addr: String,
}

impl Registry {
    fn start(dir: &Path) -> Registry {
        Registry::start_with(dir, None)
    }

    /// `tls`: the certificate and key it serves HTTPS with (only).
    fn start_with(dir: &Path, tls: Option<(&Path, &Path)>) -> Registry {
        let port = crate::common::free_port();
        let addr = format!("127.0.0.1:{port}");
        let tls_cfg = tls
            .map(|(c, k)| {
                format!(
                    ", tls: {{certificate: {}, key: {}}}",
                    c.display(),
                    k.display()
                )
            })
            .unwrap_or_default();
        let cfg = write_file(
            dir,
            "registry.yml",
            &format!(
                "version: 0.1\nlog: {{level: warn}}\nstorage: {{filesystem: {{rootdirectory: {}}}}}\nhttp: {{addr: {addr}{tls_cfg}}}\n",
                dir.join("registry").display()
            ),
        );
        let scheme = if tls.is_some() { "https" } else { "http" };
        let child = Command::new("docker-registry")
            .arg("serve")
            .arg(cfg)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.join("registry.log")).unwrap())
            .spawn()
            .expect("docker-registry (Debian's package) is needed");
        let r = Registry { child, addr };
        let t0 = Instant::now();
        while Command::new("curl")
            .args(["-skf", "-m", "1", &format!("{scheme}://{}/v2/", r.addr)])
            .output()
            .map(|o| !o.status.success())
            .unwrap_or(true)
        {
            assert!(
                t0.elapsed() < Duration::from_secs(15),
                "the registry did not start"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        r
    }

    /// Pushes `layer` as `oras push` would (an empty config, one layer of
    /// oras's file type), with the lab's client (tests/lab/oci-push).
    fn push_disk(&self, repo: &str, tag: &str, layer: &[u8], dir: &Path) {
        let f = dir.join("disk.raw.gz");
        std::fs::write(&f, layer).unwrap();
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/lab/oci-push");
        let o = Command::new("python3")
            .arg(script)
            .arg(&self.addr)
            .arg(format!("{repo}:{tag}"))
            .arg(&f)
            .output()
            .unwrap();
        assert!(
            o.status.success(),
            "oci-push: {}",
            String::from_utf8_lossy(&o.stderr)
        );
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// oci2disk pulls the disk image layer from a real registry (plain HTTP,
/// allowed by INSECURE_REGISTRIES: the agent tries HTTPS first and falls
/// back, as for a lab registry),
/// checks it against its digest and streams it onto the disk; a tag that
/// is not there fails the action with the registry's answer.
#[test]
fn oci2disk_streams_an_image_from_a_registry() {
    let d = Daemon::start();
    let reg = Registry::start(&d.dir);
    let raw = disk_image();
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    gz.write_all(&raw).unwrap();
    let gz = gz.finish().unwrap();
    reg.push_disk("capt/ubuntu", "2404-amd64.gz", &gz, &d.dir);
    let disk = d.dir.join("disk.img");
    std::fs::File::create(&disk)
        .unwrap()
        .set_len(8 << 20)
        .unwrap();
    apply(
        &d,
        "oci",
        MAC,
        &format!(
            "      - {{name: stream, image: quay.io/tinkerbell/actions/oci2disk, timeout: 120, environment: {{IMG_URL: '{}/capt/ubuntu:2404-amd64.gz', DEST_DISK: {}, COMPRESSED: true, INSECURE_REGISTRIES: '{}'}}}}\n",
            reg.addr,
            disk.display(),
            reg.addr
        ),
    );
    let agent = Agent::start(&d, MAC);
    let w = wait_final(&d, "oci", Duration::from_secs(60));
    let a = &w["status"]["tasks"][0]["actions"][0];
    assert_eq!(w["status"]["state"], "SUCCESS", "{a:#}");
    let msg = a["message"].as_str().unwrap();
    assert!(msg.contains("sha256:") && msg.contains("gzip"), "{msg}");
    let got = std::fs::read(&disk).unwrap();
    assert!(got[..raw.len()] == raw[..], "the disk holds the image");
    drop(agent);

    let mac2 = "02:00:00:00:00:22";
    apply(
        &d,
        "missing",
        mac2,
        &format!(
            "      - {{name: stream, image: oci2disk, timeout: 60, environment: {{IMG_URL: '{}/capt/ubuntu:nope', DEST_DISK: {}, INSECURE_REGISTRIES: '{}'}}}}\n",
            reg.addr,
            disk.display(),
            reg.addr
        ),
    );
    let _agent = Agent::start(&d, mac2);
    let w = wait_final(&d, "missing", Duration::from_secs(60));
    assert_eq!(w["status"]["state"], "FAILED", "{w:#}");
    let msg = w["status"]["tasks"][0]["actions"][0]["message"]
        .as_str()
        .unwrap();
    assert!(msg.contains("404") && msg.contains("nope"), "{msg}");
}

/// Registry credentials never travel in clear: an HTTPS registry whose
/// certificate the OSIE does not trust fails the action (no plain HTTP
/// retry, although the registry is listed as insecure, because the action
/// has credentials); a plain HTTP registry the user did not list is never
/// tried; `http://` with credentials is refused before any request.
#[test]
fn oci2disk_never_falls_back_to_plain_http_with_credentials() {
    let d = Daemon::start();
    let (cert, key) = (d.dir.join("reg.crt"), d.dir.join("reg.key"));
    crate::common::self_signed_leaf(&cert, &key, "registry");
    let tls = Registry::start_with(&d.dir, Some((&cert, &key)));
    let disk = d.dir.join("disk.img");
    std::fs::File::create(&disk)
        .unwrap()
        .set_len(1 << 20)
        .unwrap();
    let cases = [
        (
            "tls",
            "02:00:00:00:00:31",
            format!(
                "IMG_URL: '{0}/capt/ubuntu:x', INSECURE_REGISTRIES: '{0}', REGISTRY_USERNAME: u, REGISTRY_PASSWORD: p",
                tls.addr
            ),
        ),
        (
            "unlisted",
            "02:00:00:00:00:32",
            format!("IMG_URL: '{}/capt/ubuntu:x'", tls.addr),
        ),
        (
            "clear",
            "02:00:00:00:00:33",
            format!(
                "IMG_URL: 'http://{}/capt/ubuntu:x', REGISTRY_USERNAME: u, REGISTRY_PASSWORD: p",
                tls.addr
            ),
        ),
    ];
    let mut agents = vec![];
    for (name, mac, env) in &cases {
        apply(
            &d,
            name,
            mac,
            &format!(
                "      - {{name: stream, image: oci2disk, timeout: 30, environment: {{{env}, DEST_DISK: {}}}}}\n",
                disk.display()
            ),
        );
        agents.push(Agent::start(&d, mac));
    }
    let msg = |w: &serde_json::Value| {
        w["status"]["tasks"][0]["actions"][0]["message"]
            .as_str()
            .unwrap_or("")
            .to_string()
    };
    let w = wait_final(&d, "tls", Duration::from_secs(60));
    assert_eq!(w["status"]["state"], "FAILED", "{w:#}");
    let m = msg(&w);
    assert!(m.contains("https://") && m.contains("certificate"), "{m}");
    assert!(!m.contains("http://"), "no plain HTTP attempt: {m}");
    let w = wait_final(&d, "unlisted", Duration::from_secs(60));
    assert_eq!(w["status"]["state"], "FAILED", "{w:#}");
    assert!(msg(&w).contains("certificate"), "{}", msg(&w));
    let w = wait_final(&d, "clear", Duration::from_secs(60));
    assert_eq!(w["status"]["state"], "FAILED", "{w:#}");
    assert!(msg(&w).contains("never sent"), "{}", msg(&w));
    let log = std::fs::read_to_string(d.dir.join("registry.log"))
        .unwrap_or_default()
        .to_lowercase();
    assert!(
        !log.contains("http request to an https server"),
        "no plain HTTP request reached the registry: {log}"
    );
    drop(tls);
}

/// TLS to the Tink server: verified against the CA file the OSIE has
/// (SSL_CERT_FILE), or `tinkerbell_insecure_tls`; with neither a CA nor
/// insecure, the agent stops at once and says why.
#[test]
fn the_agent_speaks_tls_verified_or_insecure() {
    let dir = tempfile::tempdir().unwrap();
    let (cert, key) = (dir.path().join("tink.crt"), dir.path().join("tink.key"));
    crate::common::self_signed_leaf(&cert, &key, "tinkerbox");
    let tink = format!(
        "tls_cert = {:?}\ntls_key = {:?}\n",
        cert.to_str().unwrap(),
        key.to_str().unwrap()
    );
    let d = Daemon::start_setup(crate::common::Setup {
        tink: &tink,
        ..Default::default()
    });
    let reboot = "      - {name: reboot, image: quay.io/tinkerbell/actions/reboot, timeout: 30}\n";
    apply(&d, "verified", MAC, reboot);
    let cert_file = cert.to_str().unwrap();
    let _a = Agent::start_with(
        &d,
        MAC,
        &["--grpc-tls", "true"],
        &[
            ("SSL_CERT_FILE", cert_file),
            ("SSL_CERT_DIR", "/nonexistent"),
        ],
    );
    let w = wait_final(&d, "verified", Duration::from_secs(30));
    assert_eq!(w["status"]["state"], "SUCCESS", "{w:#}");

    let mac2 = "02:00:00:00:00:22";
    apply(&d, "insecure", mac2, reboot);
    let _b = Agent::start_with(
        &d,
        mac2,
        &["--grpc-tls", "true", "--grpc-insecure-tls", "true"],
        &[
            ("SSL_CERT_FILE", "/dev/null"),
            ("SSL_CERT_DIR", "/nonexistent"),
        ],
    );
    let w = wait_final(&d, "insecure", Duration::from_secs(30));
    assert_eq!(w["status"]["state"], "SUCCESS", "{w:#}");

    // A CA that did not sign the server's certificate: no connection.
    let (other, other_key) = (dir.path().join("other.crt"), dir.path().join("other.key"));
    crate::common::self_signed_leaf(&other, &other_key, "someone-else");
    let mac3 = "02:00:00:00:00:24";
    let docs = std::fs::read_to_string(d.dir.join("insecure.yaml"))
        .unwrap()
        .replace("insecure", "wrong-ca")
        .replace(mac2, mac3)
        .replace("10.0.0.34", "10.0.0.36");
    let f = write_file(&d.dir, "wrong-ca.yaml", &docs);
    d.cli_ok(&["apply", "-f", f.to_str().unwrap()]);
    let _c = Agent::start_with(
        &d,
        mac3,
        &["--grpc-tls", "true"],
        &[
            ("SSL_CERT_FILE", other.to_str().unwrap()),
            ("SSL_CERT_DIR", "/nonexistent"),
        ],
    );
    let log = d.dir.join(format!("agent-{mac3}.log"));
    let t0 = Instant::now();
    while !std::fs::read_to_string(&log)
        .unwrap_or_default()
        .contains("GetAction failed")
    {
        assert!(
            t0.elapsed() < Duration::from_secs(15),
            "no TLS failure logged"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(workflow(&d, "wrong-ca")["status"]["state"], "PENDING");

    // No CA and not insecure: a clear error, not a silent retry loop.
    let o = Agent::command(
        &d,
        "02:00:00:00:00:23",
        &["--grpc-tls", "true"],
        &[
            ("SSL_CERT_FILE", "/dev/null"),
            ("SSL_CERT_DIR", "/nonexistent"),
        ],
    )
    .output()
    .unwrap();
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("no CA certificates"), "{err}");
}
