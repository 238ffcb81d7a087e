//! The daemon as a process: durability under SIGKILL, config refusal,
//! CLI discovery of server and token, TLS on the admin API, clean stop.

use crate::common::*;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// xorshift: enough randomness for kill timing, seed printed for replay.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

#[test]
fn every_acknowledged_apply_survives_sigkill() {
    let seed = std::env::var("TB_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64
                | 1
        });
    eprintln!("durability seed {seed} (TB_SEED={seed} to replay)");
    let mut rng = Rng(seed);
    let mut d = Daemon::start();
    let mut acknowledged: Vec<String> = Vec::new();
    let mut attempts = 0u32;
    const KILLS: usize = 24;
    for round in 0..KILLS {
        // A killer thread SIGKILLs the daemon after a random delay while this
        // thread applies as fast as the CLI can.
        let pid = d.child.as_ref().unwrap().id();
        let delay = Duration::from_millis(30 + rng.next() % 400);
        let done = Arc::new(AtomicBool::new(false));
        let done2 = done.clone();
        let killer = std::thread::spawn(move || {
            std::thread::sleep(delay);
            let _ = Command::new("kill")
                .args(["-KILL", &pid.to_string()])
                .status();
            done2.store(true, Ordering::SeqCst);
        });
        let mut i = 0;
        // Bounded: the killer fires within ~0.5s; 2000 tries is far more.
        while !done.load(Ordering::SeqCst) && i < 2000 {
            let n = acknowledged.len() + attempts as usize;
            let name = format!("m-{round}-{i}");
            let doc = hw_doc(
                &name,
                &format!(
                    "02:00:00:{:02x}:{:02x}:{:02x}",
                    (n >> 16) & 0xff,
                    (n >> 8) & 0xff,
                    n & 0xff
                ),
                &format!("10.{}.{}.{}", (n >> 16) & 0xff, (n >> 8) & 0xff, n & 0xff),
            );
            attempts += 1;
            let o = d.cli_stdin(&["hardware", "apply", "-f", "-"], Some(&doc));
            if o.status.success() {
                acknowledged.push(name);
            }
            i += 1;
        }
        killer.join().unwrap();
        d.kill9(); // reap
        // Before restarting: the file must be sound on its own.
        let rt = tokio::runtime::Runtime::new().unwrap();
        let check = rt.block_on(async {
            let s = tinkerbox::store::Store::open(&d.db_path()).await.unwrap();
            let r = s.integrity_check().await.unwrap();
            s.close().await;
            r
        });
        assert_eq!(check, "ok", "integrity_check after kill {round}");
        d.spawn();
        let stored: std::collections::HashSet<String> = d
            .all_hardware()
            .iter()
            .map(|h| h["metadata"]["name"].as_str().unwrap().to_string())
            .collect();
        for name in &acknowledged {
            assert!(
                stored.contains(name),
                "acknowledged apply of {name} lost after kill {round} (seed {seed})"
            );
        }
    }
    eprintln!(
        "{KILLS} kills, {attempts} applies attempted, {} acknowledged",
        acknowledged.len()
    );
    assert!(
        acknowledged.len() >= KILLS,
        "too few applies got through to mean anything"
    );
    // Inventory rebuilt from the store matches it.
    assert_eq!(
        d.metric("tinkerbox_hardware "),
        d.all_hardware().len() as f64
    );
}

#[test]
fn bad_config_refuses_start_naming_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let cases = [
        (
            "[api]\nlisten = \"127.0.0.1:notaport\"\n",
            "config key api.listen",
        ),
        (
            "[api]\nlistne = \"127.0.0.1:1\"\n",
            "config key api.listne: unknown key",
        ),
        ("wat = 1\n", "config key wat: unknown key"),
        (
            "[events]\nper_machine = -1\n",
            "config key events.per_machine",
        ),
        ("[log]\nlevel = \"[[[\"\n", "config key log.level"),
        ("[api\n", "config"),
    ];
    for (body, want) in cases {
        let p = write_file(dir.path(), "bad.toml", body);
        let o = Command::new(BIN)
            .args(["--config", p.to_str().unwrap(), "serve"])
            .env("TINKERBOX_STATE_DIR", dir.path().join("state"))
            .output()
            .unwrap();
        assert!(!o.status.success(), "{body:?} started");
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(
            err.starts_with("error: ") && err.contains(want),
            "{body:?}: {err}"
        );
    }
    // Env vars and --set are checked the same way.
    let ok = write_file(dir.path(), "ok.toml", "");
    let o = Command::new(BIN)
        .args(["--config", ok.to_str().unwrap(), "serve"])
        .env("TINKERBOX_HTTP_LISTEN", "nowhere")
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&o.stderr).contains("config key http.listen"));
    let o = Command::new(BIN)
        .args([
            "--config",
            ok.to_str().unwrap(),
            "serve",
            "--set",
            "events.queue=0",
        ])
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&o.stderr).contains("config key events.queue"));
    // A missing explicit config file is an error, not silent defaults.
    let o = Command::new(BIN)
        .args(["--config", "/nonexistent.toml", "serve"])
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&o.stderr).contains("/nonexistent.toml: not found"));
    // `config show` prints the effective config, layers applied.
    let o = Command::new(BIN)
        .args([
            "--config",
            ok.to_str().unwrap(),
            "config",
            "show",
            "--set",
            "api.listen=127.0.0.1:9999",
        ])
        .env("TINKERBOX_EVENTS_PER_MACHINE", "77")
        .output()
        .unwrap();
    let shown = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success());
    assert!(
        shown.contains("listen = \"127.0.0.1:9999\"") && shown.contains("per_machine = 77"),
        "{shown}"
    );
    // A port already in use: start refused naming the key.
    let d = Daemon::start();
    let clash = write_file(
        dir.path(),
        "clash.toml",
        &format!("[http]\nlisten = \"{}\"\n", d.http),
    );
    let o = Command::new(BIN)
        .args(["--config", clash.to_str().unwrap(), "serve"])
        .env("TINKERBOX_STATE_DIR", dir.path().join("state2"))
        .env("TINKERBOX_DHCP_MODE", "off")
        .env("TINKERBOX_TFTP_ENABLED", "false")
        .env("TINKERBOX_SYSLOG_ENABLED", "false")
        .env("TINKERBOX_API_LISTEN", format!("127.0.0.1:{}", free_port()))
        .output()
        .unwrap();
    assert!(!o.status.success());
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("http.listen"),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
}

#[test]
fn cli_finds_server_and_token_in_order() {
    let d = Daemon::start();
    let token = d.token();
    let server = format!("http://{}", d.api);
    let run = |args: &[&str], env: &[(&str, &str)]| {
        let mut c = Command::new(BIN);
        c.args(args)
            .env_remove("TINKERBOX_SERVER")
            .env_remove("TINKERBOX_TOKEN")
            .env_remove("TINKERBOX_CONFIG");
        for (k, v) in env {
            c.env(k, v);
        }
        c.output().unwrap()
    };
    let cfg = d.config.to_str().unwrap();
    // Flags alone (no config anywhere).
    let o = run(
        &["--server", &server, "--token", &token, "hardware", "get"],
        &[],
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    // Env alone.
    let o = run(
        &["hardware", "get"],
        &[("TINKERBOX_SERVER", &server), ("TINKERBOX_TOKEN", &token)],
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    // Config file (via env TINKERBOX_CONFIG) gives both.
    let o = run(&["hardware", "get"], &[("TINKERBOX_CONFIG", cfg)]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    // Flags beat env: a wrong env token is overridden by the right flag...
    let o = run(
        &["--token", &token, "hardware", "get"],
        &[("TINKERBOX_CONFIG", cfg), ("TINKERBOX_TOKEN", "bad")],
    );
    assert!(o.status.success());
    // ...and env beats the config file.
    let o = run(
        &["hardware", "get"],
        &[("TINKERBOX_CONFIG", cfg), ("TINKERBOX_TOKEN", "bad")],
    );
    assert!(String::from_utf8_lossy(&o.stderr).starts_with("error: 401"));
    let dead = format!("http://127.0.0.1:{}", free_port());
    let o = run(
        &["--config", cfg, "hardware", "get"],
        &[("TINKERBOX_SERVER", &dead)],
    );
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success() && err.contains("cannot connect") && err.lines().count() == 1,
        "{err}"
    );
    // No token anywhere: a clear message.
    let o = run(
        &[
            "--server",
            &server,
            "--config",
            "/nonexistent.toml",
            "hardware",
            "get",
        ],
        &[],
    );
    assert!(String::from_utf8_lossy(&o.stderr).contains("not found"));
}

#[test]
fn admin_api_over_tls() {
    let dir = tempfile::tempdir().unwrap();
    let (cert, key) = (dir.path().join("api.crt"), dir.path().join("api.key"));
    self_signed_leaf(&cert, &key, "tinkerbox");
    let d = Daemon::start_with(&format!(
        "tls_cert = {:?}\ntls_key = {:?}\n",
        cert.to_str().unwrap(),
        key.to_str().unwrap()
    ));
    // The CLI trusts the configured certificate and speaks HTTPS.
    let f = write_file(
        &d.dir,
        "a.yaml",
        &hw_doc("a", "52:54:00:00:00:aa", "10.1.0.1"),
    );
    assert_eq!(
        d.cli_ok(&["hardware", "apply", "-f", f.to_str().unwrap()]),
        "hardware.tinkerbell.org/a created\n"
    );
    // curl with the CA sees TLS; plain HTTP on the TLS port gets nowhere.
    let url = format!("https://{}/api/v1/hardware/a", d.api);
    let o = d.curl(&[
        "-s",
        "--cacert",
        cert.to_str().unwrap(),
        "-H",
        &format!("Authorization: Bearer {}", d.token()),
        &url,
    ]);
    assert!(String::from_utf8_lossy(&o.stdout).contains("52:54:00:00:00:aa"));
    assert_ne!(d.http_status(&d.api_url("/api/v1/hardware")), "200");
    // A client that does not trust the certificate is refused by TLS.
    let o = d.curl(&["-s", &url]);
    assert_eq!(
        o.status.code(),
        Some(60),
        "curl: peer certificate not trusted"
    );
}

#[test]
fn metrics_health_and_clean_stop() {
    let mut d = Daemon::start();
    let o = d.curl(&["-s", &d.url("/healthz")]);
    assert_eq!(String::from_utf8_lossy(&o.stdout), "ok\n");
    assert_eq!(d.http_status(&d.url("/nope")), "404");
    let f = write_file(
        &d.dir,
        "a.yaml",
        &hw_doc("a", "52:54:00:00:00:01", "10.2.0.1"),
    );
    d.cli_ok(&["hardware", "apply", "-f", f.to_str().unwrap()]);
    d.cli_ok(&["hardware", "apply", "-f", f.to_str().unwrap()]);
    d.cli_ok(&["hardware", "delete", "a"]);
    // Every counter declared has moved.
    let text = String::from_utf8_lossy(&d.curl(&["-s", &d.url("/metrics")]).stdout).to_string();
    for (name, at_least) in [
        (
            "tinkerbox_http_requests_total{listener=\"public\",code=\"200\"}",
            1.0,
        ),
        (
            "tinkerbox_http_requests_total{listener=\"public\",code=\"404\"}",
            1.0,
        ),
        (
            "tinkerbox_http_requests_total{listener=\"api\",code=\"201\"}",
            1.0,
        ),
        ("tinkerbox_hardware_applies_total{outcome=\"created\"}", 1.0),
        (
            "tinkerbox_hardware_applies_total{outcome=\"unchanged\"}",
            1.0,
        ),
        ("tinkerbox_hardware_deletes_total", 1.0),
        ("tinkerbox_inventory_swaps_total", 2.0),
        ("tinkerbox_build_info{version=", 1.0),
    ] {
        let v = text
            .lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or_else(|| panic!("{name} missing:\n{text}"));
        assert!(v >= at_least, "{name} = {v}");
    }
    assert!(text.contains("tinkerbox_hardware 0"), "{text}");
    // Events are batched: give the writer a moment, bounded.
    let mut written = 0.0;
    for _ in 0..100 {
        written = d.metric("tinkerbox_events_written_total");
        if written >= 2.0 {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(written >= 2.0, "events_written {written}");
    assert!(d.stop().success(), "SIGTERM exits 0");
    assert!(d.log().contains("stopping"));
}
