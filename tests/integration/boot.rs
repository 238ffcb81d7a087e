//! The boot path on loopback, with real clients: tftp-hpa and curl for
//! TFTP, curl for iPXE scripts, binaries and artifacts (Range), util-linux
//! `logger` for syslog. A Hardware with IP 127.0.0.1 makes the test process
//! a known machine for by-IP lookups.

use crate::common::*;
use serde_json::Value;
use std::net::UdpSocket;
use std::process::Command;
use std::time::Duration;

const MAC: &str = "52:54:00:77:00:01";

fn machine_yaml(extra_netboot: &str) -> String {
    format!(
        "apiVersion: tinkerbell.org/v1alpha1\nkind: Hardware\nmetadata:\n  name: loop\nspec:\n  metadata: {{facility: {{facility_code: lab1}}}}\n  interfaces:\n  - dhcp:\n      mac: \"{MAC}\"\n      ip: {{address: 127.0.0.1, netmask: 255.0.0.0}}\n    netboot: {{allowPXE: true{extra_netboot}}}\n  - dhcp:\n      mac: \"52:54:00:77:00:02\"\n    netboot: {{allowPXE: false}}\n"
    )
}

fn free_udp_port() -> u16 {
    UdpSocket::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Pseudo-random bytes, so a corrupted transfer cannot look right by chance.
fn noise(len: usize, seed: u32) -> Vec<u8> {
    let mut x = seed | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            x as u8
        })
        .collect()
}

const NOTES: &str = "kernel notes\n";
/// Stands for a precompressed sibling (ServeDir sends it as is).
const NOTES_GZ: &[u8] = b"not really gzip";

struct Boot {
    d: Daemon,
    tftp_port: u16,
    syslog_port: u16,
    efi: Vec<u8>,
    kpxe: Vec<u8>,
    artifact: Vec<u8>,
}

fn start() -> Boot {
    let files = tempfile::tempdir().unwrap().keep();
    let efi = noise(1_000_003, 7); // not a multiple of any block size
    let kpxe = noise(512 * 130, 9); // an exact multiple: needs the empty last block
    std::fs::write(files.join("ipxe.efi"), &efi).unwrap();
    std::fs::write(files.join("undionly.kpxe"), &kpxe).unwrap();
    let artifacts = files.join("artifacts");
    std::fs::create_dir_all(artifacts.join("sub")).unwrap();
    let artifact = noise(3 << 20, 11);
    std::fs::write(artifacts.join("vmlinuz-x86_64"), &artifact).unwrap();
    std::fs::write(artifacts.join("sub/notes.txt"), NOTES).unwrap();
    std::fs::write(artifacts.join("sub/notes.txt.gz"), NOTES_GZ).unwrap();
    std::fs::write(artifacts.join("sub/my file.txt"), NOTES).unwrap();
    let tftp_port = free_udp_port();
    let syslog_port = free_udp_port();
    // The sendfile path logs each answer at debug: tests see which path served.
    let boot = format!(
        "[dhcp]\nmode = \"off\"\n[tftp]\nlisten = \"127.0.0.1:{tftp_port}\"\nipxe_dir = {:?}\n[syslog]\nlisten = \"127.0.0.1:{syslog_port}\"\n[log]\nlevel = \"info,tinkerbox::http::sendfile=debug\"\n",
        files.to_str().unwrap()
    );
    let http = format!(
        "artifacts_dir = {:?}\nextra_kernel_args = [\"console=ttyS0,115200\"]\n",
        artifacts.to_str().unwrap()
    );
    let d = Daemon::start_setup(Setup {
        boot: &boot,
        http: &http,
        ..Setup::default()
    });
    let f = write_file(&d.dir, "m.yaml", &machine_yaml(""));
    d.cli_ok(&["hardware", "apply", "-f", f.to_str().unwrap()]);
    Boot {
        d,
        tftp_port,
        syslog_port,
        efi,
        kpxe,
        artifact,
    }
}

/// Poll the machine's events (written in batches) until `kind` shows up.
fn wait_event(d: &Daemon, name: &str, kind: &str) -> Vec<Value> {
    for _ in 0..100 {
        let out = d.cli_ok(&["events", name, "-o", "json"]);
        let v: Vec<Value> = serde_json::from_str(&out).unwrap();
        if v.iter().any(|e| e["kind"] == kind) {
            return v;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("no {kind} event for {name}: {}", d.cli_ok(&["events"]));
}

#[test]
fn tftp_serves_byte_exact_with_real_clients() {
    let b = start();
    let dir = tempfile::tempdir().unwrap();
    let port = b.tftp_port.to_string();
    // tftp-hpa, plain RFC 1350 (512-byte blocks), binary mode.
    for (file, want) in [("ipxe.efi", &b.efi), ("undionly.kpxe", &b.kpxe)] {
        let out = dir.path().join(file);
        let o = Command::new("tftp")
            .args([
                "-m",
                "binary",
                "127.0.0.1",
                &port,
                "-c",
                "get",
                file,
                out.to_str().unwrap(),
            ])
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        assert!(
            std::fs::read(&out).unwrap() == *want,
            "tftp-hpa {file} differs"
        );
    }
    // curl with RFC 2348 blksize (and its tsize request), and the <mac>/ prefix.
    for blksize in ["512", "1468", "8192"] {
        let o = Command::new("curl")
            .args(["-sf", "--max-time", "30", "--tftp-blksize", blksize])
            .arg(format!("tftp://127.0.0.1:{port}/{MAC}/ipxe.efi"))
            .output()
            .unwrap();
        assert!(o.status.success(), "curl blksize {blksize}: {:?}", o.status);
        assert!(o.stdout == b.efi, "curl blksize {blksize}: bytes differ");
    }
    let v = wait_event(&b.d, "loop", "tftp.sent");
    let sent: Vec<&Value> = v.iter().filter(|e| e["kind"] == "tftp.sent").collect();
    assert!(
        sent.iter()
            .any(|e| e["fields"]["file"] == "ipxe.efi" && e["fields"]["bytes"] == 1_000_003),
        "{v:?}"
    );
    assert!(b.d.metric("tinkerbox_tftp_transfers_total{result=\"sent\"}") >= 4.0);
    assert!(b.d.metric("tinkerbox_tftp_sent_bytes_total") >= 4.0 * 1_000_003.0);
}

#[test]
fn tftp_refuses_writes_escapes_and_unknown_files() {
    let b = start();
    let dir = tempfile::tempdir().unwrap();
    let port = b.tftp_port.to_string();
    for file in [
        "nope.efi",
        "../etc/passwd",
        "/etc/passwd",
        "sub/../ipxe.efi",
    ] {
        let out = dir.path().join("x");
        let o = Command::new("tftp")
            .args([
                "-m",
                "binary",
                "127.0.0.1",
                &port,
                "-c",
                "get",
                file,
                out.to_str().unwrap(),
            ])
            .output()
            .unwrap();
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        );
        assert!(
            text.contains("Error code"),
            "{file}: tftp-hpa should report a TFTP error: {text}"
        );
    }
    // curl reports the TFTP error code: 1 (not found) or 2 (access violation).
    let o = Command::new("curl")
        .args(["-s", "--max-time", "10"])
        .arg(format!("tftp://127.0.0.1:{port}/nope.efi"))
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(68), "curl: TFTP file not found");
    // A write request is refused with an error, and nothing is written.
    let src = dir.path().join("upload");
    std::fs::write(&src, b"payload").unwrap();
    let o = Command::new("tftp")
        .current_dir(dir.path())
        .args([
            "-m",
            "binary",
            "127.0.0.1",
            &port,
            "-c",
            "put",
            "upload",
            "ipxe.efi",
        ])
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(
        text.contains("Error code") && text.contains("read-only"),
        "{text}"
    );
    let out = dir.path().join("after");
    let o = Command::new("tftp")
        .args([
            "-m",
            "binary",
            "127.0.0.1",
            &port,
            "-c",
            "get",
            "ipxe.efi",
            out.to_str().unwrap(),
        ])
        .output()
        .unwrap();
    assert!(o.status.success());
    assert!(
        std::fs::read(&out).unwrap() == b.efi,
        "write refused, file unchanged"
    );
    assert!(b.d.metric("tinkerbox_tftp_transfers_total{result=\"not_found\"}") >= 2.0);
    assert!(b.d.metric("tinkerbox_tftp_transfers_total{result=\"forbidden\"}") >= 2.0);
    assert!(b.d.metric("tinkerbox_tftp_transfers_total{result=\"write_refused\"}") >= 1.0);
    wait_event(&b.d, "loop", "tftp.refused");
}

#[test]
fn ipxe_scripts_by_mac_and_by_source_ip() {
    let b = start();
    let d = &b.d;
    let get = |path: &str| {
        let o = d.curl(&["-s", "-w", "\n%{http_code}", &d.url(path)]);
        let text = String::from_utf8_lossy(&o.stdout).to_string();
        let (body, code) = text.rsplit_once('\n').unwrap();
        (code.to_string(), body.to_string())
    };
    let (code, script) = get(&format!("/ipxe/script/{MAC}/auto.ipxe"));
    assert_eq!(code, "200", "{script}");
    assert!(script.starts_with("#!ipxe\n"));
    let base = format!("http://127.0.0.1:{}", d.http.port());
    assert!(
        script.contains(&format!("set base-url {base}/artifacts\n")),
        "{script}"
    );
    // grpc_authority: tinkerbox's own Tink server ([tink] listen's port).
    let tink = d.tink.port();
    assert!(script.contains(&format!(
        "facility=lab1 syslog_host=127.0.0.1 grpc_authority=127.0.0.1:{tink} tinkerbell_tls=false worker_id={MAC} hw_addr={MAC} modules=loop,squashfs,sd-mod,usb-storage initrd=initramfs-${{arch}} console=ttyS0,115200"
    )), "{script}");
    // The same script by source IP (127.0.0.1 is the machine's address).
    let (code, by_ip) = get("/auto.ipxe");
    assert_eq!(code, "200");
    assert_eq!(by_ip, script);
    // MAC spellings are normalised in the URL too.
    assert_eq!(get("/ipxe/script/52-54-00-77-00-01/auto.ipxe").0, "200");
    // Refusals: unknown MAC, allowPXE false, garbage.
    assert_eq!(get("/ipxe/script/52:54:00:77:00:99/auto.ipxe").0, "404");
    assert_eq!(get("/ipxe/script/52:54:00:77:00:02/auto.ipxe").0, "404");
    assert_eq!(get("/ipxe/script/not-a-mac/auto.ipxe").0, "404");
    let v = wait_event(d, "loop", "ipxe.refused");
    assert!(v.iter().any(|e| e["kind"] == "ipxe.script"));
    // A Hardware's own script is served as is.
    let f = write_file(
        &d.dir,
        "m2.yaml",
        &machine_yaml(", ipxe: {contents: \"#!ipxe\\necho custom\\n\"}"),
    );
    d.cli_ok(&["hardware", "apply", "-f", f.to_str().unwrap()]);
    assert_eq!(get("/auto.ipxe").1, "#!ipxe\necho custom\n");
    assert!(d.metric("tinkerbox_boot_http_requests_total{what=\"script\",code=\"200\"}") >= 3.0);
    assert!(d.metric("tinkerbox_boot_http_requests_total{what=\"script\",code=\"404\"}") >= 3.0);
}

#[test]
fn binaries_and_artifacts_over_http() {
    let b = start();
    let d = &b.d;
    let o = d.curl(&["-sf", &d.url("/ipxe/binary/ipxe.efi")]);
    assert!(
        o.status.success() && o.stdout == b.efi,
        "HTTP-boot binary differs"
    );
    assert_eq!(d.http_status(&d.url("/ipxe/binary/nope.efi")), "404");
    // Whole artifact, then a Range.
    let o = d.curl(&["-sf", &d.url("/artifacts/vmlinuz-x86_64")]);
    assert!(o.stdout == b.artifact);
    let o = d.curl(&[
        "-s",
        "-r",
        "1000-1999",
        "-w",
        "%{http_code}",
        "-o",
        "-",
        &d.url("/artifacts/vmlinuz-x86_64"),
    ]);
    let (body, code) = o.stdout.split_at(o.stdout.len() - 3);
    assert_eq!(code, b"206");
    assert_eq!(body, &b.artifact[1000..2000]);
    // No listing, no escape, nothing missing served.
    for path in [
        "/artifacts/",
        "/artifacts/sub/",
        "/artifacts/../tinkerbox.toml",
        "/artifacts/%2e%2e/tinkerbox.toml",
        // ipxe.efi is there, one level up.
        "/artifacts/../ipxe.efi",
        "/artifacts/%2e%2e/ipxe.efi",
        "/artifacts/%2E%2E%2Fipxe.efi",
        "/artifacts/sub/%2e%2e/%2e%2e/ipxe.efi",
        "/artifacts/sub/..%2f..%2fipxe.efi",
        "/artifacts/nope",
    ] {
        let o = d.curl(&[
            "-s",
            "--path-as-is",
            "-o",
            "/dev/null",
            "-w",
            "%{http_code}",
            &d.url(path),
        ]);
        let code = String::from_utf8_lossy(&o.stdout).to_string();
        assert!(code == "404" || code == "400", "{path}: {code}");
    }
    let v = wait_event(d, "loop", "http.artifact");
    assert!(
        v.iter()
            .any(|e| e["kind"] == "http.artifact" && e["fields"]["status"] == 206)
    );
    assert!(d.metric("tinkerbox_boot_http_requests_total{what=\"artifact\",code=\"206\"}") >= 1.0);
}

/// One response as curl saw it: status, headers (names lower case), body.
struct Got {
    code: u16,
    headers: std::collections::BTreeMap<String, String>,
    body: Vec<u8>,
}

/// curl with `args` (a URL among them), headers and body kept apart.
fn fetch(d: &Daemon, args: &[&str]) -> Got {
    let dir = tempfile::tempdir().unwrap();
    let (h, b) = (dir.path().join("h"), dir.path().join("b"));
    let o = d.curl(
        &[
            &["-s", "-D", h.to_str().unwrap(), "-o", b.to_str().unwrap()],
            args,
        ]
        .concat(),
    );
    assert!(o.status.success(), "curl {args:?}: {o:?}");
    let head = std::fs::read_to_string(&h).unwrap();
    let mut lines = head.lines();
    let code = lines
        .next()
        .and_then(|l| l.split(' ').nth(1))
        .and_then(|c| c.parse().ok())
        .unwrap();
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    Got {
        code,
        headers,
        body: std::fs::read(&b).unwrap_or_default(),
    }
}

/// The daemon's "answered with sendfile" log lines (debug, see `start`).
fn sendfile_lines(d: &Daemon) -> Vec<String> {
    d.log()
        .lines()
        .filter(|l| l.contains("artifact answered with sendfile"))
        .map(str::to_string)
        .collect()
}

/// Plain downloads take the sendfile path and answer as ServeDir does
/// (same bytes, same headers); conditional, precompressed and Range
/// requests still go to ServeDir.
/// The headers a file answer carries, whichever path sent it.
const FILE_HEADERS: [&str; 4] = [
    "content-type",
    "content-length",
    "last-modified",
    "accept-ranges",
];

#[test]
fn artifacts_sendfile_path_answers_as_servedir_does() {
    let b = start();
    let d = &b.d;
    let url = d.url("/artifacts/vmlinuz-x86_64");
    // Sent before the file's time: ServeDir answers a full 200.
    let ims = "If-Modified-Since: Thu, 01 Jan 1970 00:00:01 GMT";
    let fast = fetch(d, &[&url]);
    let slow = fetch(d, &["-H", ims, &url]);
    assert_eq!((fast.code, slow.code), (200, 200));
    assert!(fast.body == b.artifact, "sendfile body differs");
    assert!(slow.body == b.artifact, "ServeDir body differs");
    assert_eq!(
        fast.headers.keys().collect::<Vec<_>>(),
        slow.headers.keys().collect::<Vec<_>>()
    );
    for h in FILE_HEADERS {
        assert_eq!(fast.headers.get(h), slow.headers.get(h), "{h}");
    }
    assert_eq!(fast.headers["content-length"], (3 << 20).to_string());
    assert_eq!(fast.headers["content-type"], "application/octet-stream");
    // HEAD: the same headers, no body.
    let head = fetch(d, &["-I", &url]);
    assert_eq!(head.code, 200);
    // (-I writes the head where the body would go: nothing after it.)
    assert!(head.body.ends_with(b"\r\n\r\n"), "{:?}", head.body);
    for h in FILE_HEADERS {
        assert_eq!(head.headers.get(h), fast.headers.get(h), "HEAD {h}");
    }
    // A Range is ServeDir's, and right.
    let part = fetch(d, &["-r", "3000000-", &url]);
    assert_eq!(part.code, 206);
    assert!(part.body == b.artifact[3000000..]);
    assert_eq!(
        part.headers.get("last-modified"),
        fast.headers.get("last-modified")
    );
    // A text file's type, and a percent-encoded name.
    let notes = d.url("/artifacts/sub/notes.txt");
    let fast = fetch(d, &[&notes]);
    let slow = fetch(d, &["-H", ims, &notes]);
    assert_eq!(fast.body, NOTES.as_bytes());
    assert_eq!(fast.headers["content-type"], "text/plain");
    for h in FILE_HEADERS {
        assert_eq!(fast.headers.get(h), slow.headers.get(h), "notes {h}");
    }
    let spaced = fetch(d, &[&d.url("/artifacts/sub/my%20file.txt")]);
    assert_eq!((spaced.code, &spaced.body[..]), (200, NOTES.as_bytes()));
    // The precompressed sibling goes to a client that takes gzip (ServeDir).
    let gz = fetch(d, &["-H", "Accept-Encoding: gzip", &notes]);
    assert_eq!(gz.body, NOTES_GZ);
    assert_eq!(gz.headers["content-encoding"], "gzip");
    let identity = fetch(
        d,
        &[
            "-H",
            "Accept-Encoding: identity",
            &d.url("/artifacts/vmlinuz-x86_64"),
        ],
    );
    assert!(identity.body == b.artifact);
    // HTTP/1.0: answered, then closed.
    let old = fetch(d, &["-0", &url]);
    assert!(old.body == b.artifact);
    assert_eq!(old.headers["connection"], "close");
    // Which path answered: the GET, the HEAD, notes, my file, vmlinuz with
    // Accept-Encoding (no .gz), HTTP/1.0. Not the If-Modified-Since ones,
    // the Range, the gzip one.
    let lines = sendfile_lines(d);
    assert_eq!(lines.len(), 6, "{lines:#?}");
    assert_eq!(
        lines
            .iter()
            .filter(|l| l.contains("path=/artifacts/vmlinuz-x86_64 bytes=3145728"))
            .count(),
        3,
        "{lines:#?}"
    );
    assert!(
        lines
            .iter()
            .any(|l| l.contains("path=/artifacts/vmlinuz-x86_64 bytes=0"))
    );
    assert!(
        lines
            .iter()
            .any(|l| l.contains("path=/artifacts/sub/my%20file.txt"))
    );
}

/// Splits raw HTTP/1.1 responses (each with a Content-Length) in order.
fn split_responses(mut raw: &[u8]) -> Vec<(String, Vec<u8>)> {
    let mut out = Vec::new();
    while !raw.is_empty() {
        let end = raw
            .windows(4)
            .position(|w| w == b"\r\n\r\n")
            .unwrap_or_else(|| panic!("no response head in {:?}", String::from_utf8_lossy(raw)))
            + 4;
        let head = String::from_utf8_lossy(&raw[..end]).to_string();
        let len: usize = head
            .lines()
            .find_map(|l| {
                l.to_ascii_lowercase()
                    .strip_prefix("content-length:")
                    .map(|v| v.trim().parse().unwrap())
            })
            .unwrap_or(0);
        out.push((head, raw[end..end + len].to_vec()));
        raw = &raw[end + len..];
    }
    out
}

/// Writes `parts` (pausing after each as told) on one connection, then
/// reads until the daemon closes it.
fn raw_exchange(d: &Daemon, parts: &[(&[u8], u64)]) -> Vec<u8> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(d.http).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    for (bytes, pause_ms) in parts {
        s.write_all(bytes).unwrap();
        std::thread::sleep(Duration::from_millis(*pause_ms));
    }
    // What came before a reset too: the callers check the bytes.
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    out
}

/// The sendfile path keeps a connection alive, then hands it (with the
/// bytes it has not read) to hyper at the first request it does not
/// serve: nothing lost, everything answered in order.
#[test]
fn artifacts_keep_alive_then_hyper_on_one_connection() {
    let b = start();
    let d = &b.d;
    let dir = tempfile::tempdir().unwrap();
    let out = |i: usize| dir.path().join(i.to_string());
    let art = d.url("/artifacts/vmlinuz-x86_64");
    let o = d.curl(&[
        "-sf",
        "-o",
        out(1).to_str().unwrap(),
        &art,
        "-o",
        out(2).to_str().unwrap(),
        &d.url("/healthz"),
        "-o",
        out(3).to_str().unwrap(),
        &d.url(&format!("/ipxe/script/{MAC}/auto.ipxe")),
        "-o",
        out(4).to_str().unwrap(),
        &art,
        "-w",
        "%{num_connects} ",
    ]);
    assert!(o.status.success(), "{o:?}");
    // One connection for the four.
    assert_eq!(String::from_utf8_lossy(&o.stdout), "1 0 0 0 ");
    assert!(std::fs::read(out(1)).unwrap() == b.artifact);
    assert_eq!(std::fs::read_to_string(out(2)).unwrap(), "ok\n");
    assert!(
        std::fs::read_to_string(out(3))
            .unwrap()
            .starts_with("#!ipxe\n")
    );
    assert!(std::fs::read(out(4)).unwrap() == b.artifact);
    // Only the first went by sendfile: hyper keeps the rest.
    assert_eq!(sendfile_lines(d).len(), 1, "{:#?}", sendfile_lines(d));

    // Pipelined: three requests in one write.
    let raw = raw_exchange(
        d,
        &[(
            b"GET /artifacts/vmlinuz-x86_64 HTTP/1.1\r\nHost: t\r\n\r\n\
              GET /healthz HTTP/1.1\r\nHost: t\r\n\r\n\
              GET /artifacts/sub/notes.txt HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n",
            0,
        )],
    );
    let r = split_responses(&raw);
    assert_eq!(r.len(), 3);
    assert!(r[0].0.starts_with("HTTP/1.1 200 OK\r\n") && r[0].1 == b.artifact);
    assert!(r[1].0.starts_with("HTTP/1.1 200 OK\r\n") && r[1].1 == b"ok\n");
    assert!(r[2].0.starts_with("HTTP/1.1 200 OK\r\n") && r[2].1 == NOTES.as_bytes());
    assert_eq!(sendfile_lines(d).len(), 2);

    // Two artifacts by sendfile on one connection, the head of the first
    // arriving in two parts.
    let raw = raw_exchange(
        d,
        &[
            (b"GET /artifacts/sub/no", 200),
            (
                b"tes.txt HTTP/1.1\r\nHost: t\r\n\r\n\
                  GET /artifacts/vmlinuz-x86_64 HTTP/1.1\r\nConnection: close\r\n\r\n",
                0,
            ),
        ],
    );
    let r = split_responses(&raw);
    assert_eq!(r.len(), 2);
    assert_eq!(r[0].1, NOTES.as_bytes());
    assert!(r[1].0.contains("\r\nconnection: close\r\n") && r[1].1 == b.artifact);
    assert_eq!(sendfile_lines(d).len(), 4);

    // A head over 8 KiB is hyper's (which takes it).
    let mut big = b"GET /artifacts/sub/notes.txt HTTP/1.1\r\nConnection: close\r\nX-Pad: ".to_vec();
    big.resize(big.len() + 9000, b'p');
    big.extend_from_slice(b"\r\n\r\n");
    let r = split_responses(&raw_exchange(d, &[(&big, 0)]));
    assert_eq!(r.len(), 1);
    assert_eq!(r[0].1, NOTES.as_bytes());
    assert_eq!(sendfile_lines(d).len(), 4);

    // Garbage goes to hyper, which refuses it; the daemon carries on.
    let raw = raw_exchange(
        d,
        &[(b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03\r\n\r\n", 0)],
    );
    assert!(
        raw.is_empty() || raw.starts_with(b"HTTP/1.1 400"),
        "{raw:?}"
    );
    let o = d.curl(&["-sf", &d.url("/healthz")]);
    assert_eq!(o.stdout, b"ok\n");
}

/// The sendfile path leaves what ServeDir's did: the counters and, for a
/// known machine, an `http.artifact` event with the same fields.
#[test]
fn artifacts_sendfile_path_counts_and_records() {
    let b = start();
    let d = &b.d;
    let artifact_200 = "tinkerbox_boot_http_requests_total{what=\"artifact\",code=\"200\"}";
    let public_200 = "tinkerbox_http_requests_total{listener=\"public\",code=\"200\"}";
    let (a0, p0) = (d.metric(artifact_200), d.metric(public_200));
    let o = d.curl(&[
        "-sf",
        "-o",
        "/dev/null",
        &d.url("/artifacts/vmlinuz-x86_64"),
    ]);
    assert!(o.status.success());
    let o = d.curl(&["-sfI", &d.url("/artifacts/sub/my%20file.txt")]);
    assert!(o.status.success());
    assert_eq!(sendfile_lines(d).len(), 2);
    assert_eq!(d.metric(artifact_200), a0 + 2.0);
    // The two downloads, and the two /metrics reads since p0's (each is
    // counted once answered).
    assert_eq!(d.metric(public_200), p0 + 4.0);
    // Events are written in batches: wait for both.
    let paths = ["/artifacts/vmlinuz-x86_64", "/artifacts/sub/my%20file.txt"];
    let mut sent = Vec::new();
    for _ in 0..100 {
        let v = wait_event(d, "loop", "http.artifact");
        sent = v
            .into_iter()
            .filter(|e| e["kind"] == "http.artifact")
            .collect();
        if paths
            .iter()
            .all(|p| sent.iter().any(|e| e["fields"]["path"] == *p))
        {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    for path in paths {
        let e = sent
            .iter()
            .find(|e| e["fields"]["path"] == path)
            .unwrap_or_else(|| panic!("no event for {path}: {sent:#?}"));
        assert_eq!(e["fields"]["status"], 200);
        assert_eq!(e["fields"]["range"], false);
        assert_eq!(e["message"], format!("{path} sent (200)"));
    }
}

#[test]
fn syslog_lines_land_in_the_machines_log() {
    let b = start();
    let d = &b.d;
    let st = Command::new("logger")
        .args([
            "--udp",
            "-n",
            "127.0.0.1",
            "-P",
            &b.syslog_port.to_string(),
            "-t",
            "osie",
            "-p",
            "user.warning",
        ])
        .arg("hello from the OSIE")
        .status()
        .unwrap();
    assert!(st.success());
    let v = wait_event(d, "loop", "syslog");
    let line = v.iter().find(|e| e["kind"] == "syslog").unwrap();
    assert!(
        line["message"]
            .as_str()
            .unwrap()
            .contains("osie: hello from the OSIE"),
        "{line}"
    );
    assert_eq!(line["fields"]["severity"], "warning");
    // From an address no Hardware has: counted, not stored.
    let s = UdpSocket::bind("127.0.0.2:0").unwrap();
    s.send_to(b"<14>stranger", ("127.0.0.1", b.syslog_port))
        .unwrap();
    let mut n = 0.0;
    for _ in 0..100 {
        n = d.metric("tinkerbox_syslog_lines_total{result=\"unknown_source\"}");
        if n >= 1.0 {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(n, 1.0);
    // Events are stored in order: once a later line from the machine is
    // in the log, the stranger's would be too, had it been stored.
    let s = UdpSocket::bind("127.0.0.1:0").unwrap();
    s.send_to(
        b"<14>osie: after the stranger",
        ("127.0.0.1", b.syslog_port),
    )
    .unwrap();
    for _ in 0..100 {
        if d.cli_ok(&["events", "loop"]).contains("after the stranger") {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let all = d.cli_ok(&["events"]);
    assert!(all.contains("after the stranger"), "{all}");
    assert_eq!(all.matches("stranger").count(), 1, "{all}");
}

/// A TFTP client for what tftp-hpa and curl do not do: RFC 7440 windowsize,
/// RFC 2349 timeout, and a lost ACK the server must recover from.
const PY_TFTP: &str = r#"
import socket, struct, sys
host, port, name, window, drop_block = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.settimeout(5)
opts = b"blksize\0" + b"1468\0" + b"tsize\0" + b"0\0" + b"timeout\0" + b"1\0"
if window > 1:
    opts += b"windowsize\0" + str(window).encode() + b"\0"
s.sendto(b"\0\1" + name.encode() + b"\0octet\0" + opts, (host, port))
pkt, peer = s.recvfrom(65536)
assert pkt[:2] == b"\0\6", ("expected OACK", pkt[:40])
fields = pkt[2:].split(b"\0")
oack = dict(zip(fields[0::2], fields[1::2]))
print("OACK", {k.decode(): v.decode() for k, v in oack.items() if k})
blksize = int(oack[b"blksize"])
s.sendto(b"\0\4\0\0", peer)
data, expect, dropped, acks = bytearray(), 1, False, 0
while True:
    pkt, p = s.recvfrom(65536)
    assert p == peer
    op, blk = struct.unpack("!HH", pkt[:4])
    assert op == 3, ("expected DATA", op)
    if blk != expect:
        continue  # duplicate of an earlier window: ignore
    if blk == drop_block and not dropped:
        dropped = True  # pretend it was lost: no ACK, wait for the retransmission
        continue
    data += pkt[4:]
    last = len(pkt) - 4 < blksize
    if last or blk % window == 0:
        s.sendto(struct.pack("!HH", 4, blk), peer)
        acks += 1
    expect = (blk + 1) & 0xFFFF
    if last:
        break
sys.stdout.buffer.write(b"ACKS %d\n" % acks)
open(sys.argv[6], "wb").write(data)
"#;

#[test]
fn tftp_windowsize_timeout_and_a_lost_packet() {
    let b = start();
    let dir = tempfile::tempdir().unwrap();
    for (window, drop) in [(8, 0), (1, 5), (16, 40)] {
        let out = dir.path().join(format!("w{window}"));
        let o = Command::new("python3")
            .args([
                "-c",
                PY_TFTP,
                "127.0.0.1",
                &b.tftp_port.to_string(),
                "ipxe.efi",
            ])
            .args([window.to_string(), drop.to_string()])
            .arg(&out)
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&o.stdout).to_string();
        assert!(
            o.status.success(),
            "window {window}: {stdout}{}",
            String::from_utf8_lossy(&o.stderr)
        );
        assert!(
            stdout.contains("'blksize': '1468'") && stdout.contains("'tsize': '1000003'"),
            "{stdout}"
        );
        assert!(stdout.contains("'timeout': '1'"), "{stdout}");
        if window > 1 {
            assert!(
                stdout.contains(&format!("'windowsize': '{window}'")),
                "{stdout}"
            );
        }
        assert!(
            std::fs::read(&out).unwrap() == b.efi,
            "window {window}, lost block {drop}: bytes differ"
        );
        let blocks = 1_000_003 / 1468 + 1;
        let acks: usize = stdout
            .lines()
            .find_map(|l| l.strip_prefix("ACKS "))
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        assert!(
            acks <= blocks / window + 2,
            "one ACK per window: {acks} for {blocks} blocks"
        );
    }
}
