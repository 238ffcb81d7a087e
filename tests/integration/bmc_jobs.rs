//! BMC jobs through the daemon and its CLI, against a real Redfish BMC
//! (sushy-emulator --fake, PyPI sushy-tools): Rufio documents in, power and
//! boot-device jobs run, status and events out, credentials never shown.

use crate::common::*;
use serde_json::Value;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const PASSWORD: &str = "s3cret-Pa55";

/// sushy-emulator on a loopback port, stopped by PID on drop.
pub(crate) struct Sushy {
    child: Child,
    pub(crate) port: u16,
    /// sushy keeps the fake machines' state in files under TMPDIR: one
    /// directory per emulator, or parallel tests share a power state.
    _state: tempfile::TempDir,
}

impl Sushy {
    pub(crate) fn start() -> Sushy {
        Sushy::start_on(free_port())
    }

    /// On `port` (a BMC that comes up where a Machine already points).
    pub(crate) fn start_on(port: u16) -> Sushy {
        let bin = sushy_bin();
        let state = tempfile::tempdir().unwrap();
        let child = Command::new(&bin)
            .args(["--fake", "-i", "127.0.0.1", "-p", &port.to_string()])
            .env("TMPDIR", state.path())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let s = Sushy {
            child,
            port,
            _state: state,
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            if s.get("/redfish/v1/Systems").is_some() {
                return s;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!("sushy-emulator did not come up on port {port}");
    }

    fn get(&self, path: &str) -> Option<Value> {
        let o = Command::new("curl")
            .args(["-sf", "--max-time", "5"])
            .arg(format!("http://127.0.0.1:{}{path}", self.port))
            .output()
            .ok()?;
        serde_json::from_slice(&o.stdout).ok()
    }

    /// Wait (bounded) for the fake system's power state: sushy's fake
    /// driver applies resets after a delay of a few seconds.
    pub(crate) fn wait_power(&self, want: &str) {
        let deadline = Instant::now() + Duration::from_secs(15);
        while Instant::now() < deadline {
            if self.system()["PowerState"] == want {
                return;
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        panic!(
            "sushy system never reached power {want}: {:#}",
            self.system()
        );
    }

    /// The first (fake) system's resource.
    fn system(&self) -> Value {
        let systems = self.get("/redfish/v1/Systems").unwrap();
        let path = systems["Members"][0]["@odata.id"]
            .as_str()
            .unwrap()
            .to_string();
        self.get(&path).unwrap()
    }
}

impl Drop for Sushy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn docs(host: &str) -> String {
    format!(
        r#"apiVersion: v1
kind: Secret
metadata: {{name: bmc-creds, namespace: default}}
type: Opaque
stringData: {{username: admin, password: "{PASSWORD}"}}
---
apiVersion: bmc.tinkerbell.org/v1alpha1
kind: Machine
metadata: {{name: bmc-1, namespace: default}}
spec:
  connection:
    host: "{host}"
    insecureTLS: true
    authSecretRef: {{name: bmc-creds, namespace: default}}
    providerOptions:
      redfish: {{useBasicAuth: true}}
---
apiVersion: tinkerbell.org/v1alpha1
kind: Hardware
metadata: {{name: node-1, namespace: default}}
spec:
  bmcRef: {{apiGroup: bmc.tinkerbell.org, kind: Machine, name: bmc-1}}
  interfaces:
  - dhcp: {{mac: "52:54:00:88:00:01", uefi: true, ip: {{address: 10.88.0.11, netmask: 255.255.255.0}}}}
    netboot: {{allowPXE: false}}
"#
    )
}

/// The BMC documents for `sushy`, Hardware node-1, Template t1 (one action
/// for `worker`) and Workflow wf1 with `boot_options`, applied together;
/// what `apply` printed.
fn apply_workflow(d: &Daemon, sushy: &Sushy, worker: &str, boot_options: &str) -> String {
    let wf = format!(
        r#"---
apiVersion: tinkerbell.org/v1alpha1
kind: Template
metadata: {{name: t1}}
spec:
  data: |
    name: t1
    tasks:
    - {{name: a, worker: "{worker}", actions: [{{name: x, image: bash}}]}}
---
apiVersion: tinkerbell.org/v1alpha1
kind: Workflow
metadata: {{name: wf1}}
spec:
  templateRef: t1
  hardwareRef: node-1
  hardwareMap: {{device_1: "52:54:00:88:00:01"}}
  bootOptions: {boot_options}
"#
    );
    let all = format!("{}{wf}", docs(&format!("http://127.0.0.1:{}", sushy.port)));
    let f = write_file(&d.dir, "all.yaml", &all);
    d.cli_ok(&["apply", "-f", f.to_str().unwrap()])
}

fn apply_all(d: &Daemon, text: &str) {
    let (bmc, hw): (Vec<&str>, Vec<&str>) = text
        .split("---\n")
        .partition(|doc| !doc.contains("kind: Hardware"));
    let f = write_file(&d.dir, "bmc.yaml", &bmc.join("---\n"));
    let out = d.cli_ok(&["bmc", "apply", "-f", f.to_str().unwrap()]);
    assert!(
        out.contains("secret/bmc-creds created")
            && out.contains("machine.bmc.tinkerbell.org/bmc-1 created"),
        "{out}"
    );
    let f = write_file(&d.dir, "hw.yaml", &hw.join("---\n"));
    d.cli_ok(&["hardware", "apply", "-f", f.to_str().unwrap()]);
}

#[test]
fn power_bootdev_and_netboot_jobs_over_redfish() {
    let sushy = Sushy::start();
    let d = Daemon::start();
    apply_all(&d, &docs(&format!("http://127.0.0.1:{}", sushy.port)));

    let out = d.cli_ok(&["bmc", "power", "bmc-1", "off"]);
    assert_eq!(out, "power off via redfish: power is off\n");
    sushy.wait_power("Off");
    let out = d.cli_ok(&["bmc", "power", "bmc-1", "status"]);
    assert_eq!(out, "power status via redfish: power is off\n");
    let table = d.cli_ok(&["bmc", "get"]);
    assert!(
        table.contains("bmc-1") && table.contains(" off ") && table.contains("True"),
        "{table}"
    );

    d.cli_ok(&["bmc", "bootdev", "bmc-1", "pxe", "--efi"]);
    let boot = &sushy.system()["Boot"];
    assert_eq!(boot["BootSourceOverrideTarget"], "Pxe");
    // (sushy's fake driver always reports "Continuous" for Enabled; the
    // Once/Continuous mapping is checked in the Redfish client's own tests.)
    assert_eq!(boot["BootSourceOverrideMode"], "UEFI");

    // Rufio's common job for a Hardware: allowPXE on, off, PXE once, on.
    let out = d.cli_ok(&["machine", "netboot", "node-1"]);
    assert_eq!(
        out,
        "power off via redfish: power is off\nboot device pxe (once) EFI via redfish\npower on via redfish: power is on\n"
    );
    sushy.wait_power("On");
    let hw: Value =
        serde_json::from_str(&d.cli_ok(&["hardware", "get", "node-1", "-o", "json"])).unwrap();
    assert_eq!(hw["spec"]["interfaces"][0]["netboot"]["allowPXE"], true);
    // Every step is in the Hardware's event log.
    let mut kinds = vec![];
    for _ in 0..100 {
        let ev: Vec<Value> =
            serde_json::from_str(&d.cli_ok(&["events", "node-1", "-o", "json"])).unwrap();
        kinds = ev
            .iter()
            .map(|e| e["kind"].as_str().unwrap().to_string())
            .collect();
        if kinds.iter().filter(|k| *k == "bmc.power").count() >= 5 {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    for k in [
        "bmc.netboot",
        "bmc.power",
        "bmc.bootdev",
        "hardware.updated",
    ] {
        assert!(kinds.iter().any(|x| x == k), "{k} missing from {kinds:?}");
    }
    // Jobs are listed with their tasks.
    let jobs = d.cli_ok(&["bmc", "job", "get"]);
    assert!(jobs.contains("completed") && jobs.contains("3/3"), "{jobs}");

    // Credentials never leave: not in any answer, not in the log.
    for args in [
        vec!["bmc", "get", "-o", "json"],
        vec!["bmc", "get", "bmc-1", "-o", "yaml"],
        vec!["bmc", "job", "get", "-o", "json"],
        vec!["events", "-o", "json"],
    ] {
        assert!(
            !d.cli_ok(&args).contains(PASSWORD),
            "{args:?} shows the password"
        );
    }
    assert!(!d.log().contains(PASSWORD));
    // The database holding them is the owner's only.
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(d.db_path()).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600);
}

#[test]
fn unreachable_bmc_fails_in_time_and_others_go_on() {
    let sushy = Sushy::start();
    let d = Daemon::start_setup(Setup {
        boot: &format!("{NO_BOOT}[bmc]\ntask_timeout = \"2s\"\nattempts = 2\n"),
        ..Setup::default()
    });
    apply_all(&d, &docs(&format!("http://127.0.0.1:{}", sushy.port)));
    // A second BMC nobody answers for: a closed port on loopback.
    let dead = format!(
        "apiVersion: bmc.tinkerbell.org/v1alpha1\nkind: Machine\nmetadata: {{name: dead}}\nspec:\n  connection:\n    host: \"http://127.0.0.1:{}\"\n    insecureTLS: true\n    authSecretRef: {{name: bmc-creds}}\n",
        free_port()
    );
    let f = write_file(&d.dir, "dead.yaml", &dead);
    d.cli_ok(&["bmc", "apply", "-f", f.to_str().unwrap()]);
    let t0 = Instant::now();
    d.cli_ok(&["bmc", "power", "dead", "on", "--no-wait"]);
    // Meanwhile the good BMC's job completes.
    let out = d.cli_ok(&["bmc", "power", "bmc-1", "cycle"]);
    assert!(out.starts_with("power cycle via redfish"), "{out}");
    assert!(
        t0.elapsed() < Duration::from_secs(15),
        "the dead BMC held up another job: {:?}",
        t0.elapsed()
    );
    // The dead one fails with a clear message, within attempts x (timeout + backoff).
    let mut job = Value::Null;
    while t0.elapsed() < Duration::from_secs(30) {
        let jobs: Value =
            serde_json::from_str(&d.cli_ok(&["bmc", "job", "get", "-o", "json"])).unwrap();
        job = jobs["items"]
            .as_array()
            .unwrap()
            .iter()
            .find(|j| j["name"].as_str().unwrap().starts_with("dead-"))
            .cloned()
            .unwrap();
        if job["state"] == "failed" {
            break;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_eq!(job["state"], "failed", "{job:#}");
    assert!(t0.elapsed() < Duration::from_secs(25), "{:?}", t0.elapsed());
    assert_eq!(job["task_states"][0]["attempts"], 2);
    let msg = job["message"].as_str().unwrap();
    assert!(msg.starts_with("task 0 (power on): "), "{msg}");
    let table = d.cli_ok(&["bmc", "get", "dead"]);
    assert!(table.contains("False"), "Contactable False: {table}");
}

#[test]
fn restart_mid_task_never_sends_it_twice() {
    let mut d = Daemon::start_setup(Setup {
        boot: &format!("{NO_BOOT}[bmc]\ntask_timeout = \"20s\"\nattempts = 1\n"),
        ..Setup::default()
    });
    // A BMC that accepts the connection and never answers: the task stays
    // in flight until we pull the plug.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = silent.local_addr().unwrap().port();
    let docs = format!(
        "apiVersion: v1\nkind: Secret\nmetadata: {{name: c}}\nstringData: {{username: u, password: p}}\n---\napiVersion: bmc.tinkerbell.org/v1alpha1\nkind: Machine\nmetadata: {{name: slow}}\nspec:\n  connection:\n    host: \"http://127.0.0.1:{port}\"\n    insecureTLS: true\n    authSecretRef: {{name: c}}\n    providerOptions: {{preferredOrder: [redfish]}}\n---\napiVersion: bmc.tinkerbell.org/v1alpha1\nkind: Job\nmetadata: {{name: two-steps}}\nspec:\n  machineRef: {{name: slow, namespace: default}}\n  tasks:\n  - powerAction: \"off\"\n  - powerAction: \"on\"\n"
    );
    let f = write_file(&d.dir, "slow.yaml", &docs);
    d.cli_ok(&["bmc", "apply", "-f", f.to_str().unwrap()]);
    let job = |d: &Daemon| -> Value {
        serde_json::from_str(&d.cli_ok(&["bmc", "job", "get", "two-steps", "-o", "json"])).unwrap()
    };
    let t0 = Instant::now();
    while job(&d)["task_states"][0]["state"] != "running" {
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "task 0 never started"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    d.kill9();
    d.spawn();
    let j = job(&d);
    assert_eq!(j["state"], "failed", "{j:#}");
    assert_eq!(j["task_states"][0]["state"], "failed");
    assert_eq!(j["task_states"][0]["attempts"], 1, "sent once, never again");
    assert!(
        j["task_states"][0]["message"]
            .as_str()
            .unwrap()
            .contains("restart")
    );
    assert_eq!(
        j["task_states"][1]["state"], "pending",
        "the rest is not run"
    );
    // Rufio's Job documents are immutable once created.
    let changed = docs.replace("powerAction: \"on\"", "powerAction: \"cycle\"");
    let f = write_file(&d.dir, "changed.yaml", &changed);
    let o = d.cli(&["bmc", "apply", "-f", f.to_str().unwrap()]);
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("jobs cannot be changed"));
    drop(silent);
}

#[test]
fn power_changes_made_elsewhere_become_events() {
    let sushy = Sushy::start();
    let d = Daemon::start_setup(Setup {
        boot: &format!("{NO_BOOT}[bmc]\npoll_interval = \"1s\"\n"),
        ..Setup::default()
    });
    apply_all(&d, &docs(&format!("http://127.0.0.1:{}", sushy.port)));
    d.cli_ok(&["bmc", "power", "bmc-1", "on"]);
    sushy.wait_power("On");
    // Someone powers it off at the BMC itself.
    let forced_at = humantime::format_rfc3339_millis(std::time::SystemTime::now()).to_string();
    let sys = sushy.get("/redfish/v1/Systems").unwrap()["Members"][0]["@odata.id"]
        .as_str()
        .unwrap()
        .to_string();
    let o = Command::new("curl")
        .args([
            "-sf",
            "--max-time",
            "5",
            "-X",
            "POST",
            "-H",
            "Content-Type: application/json",
        ])
        .args(["-d", r#"{"ResetType": "ForceOff"}"#])
        .arg(format!(
            "http://127.0.0.1:{}{sys}/Actions/ComputerSystem.Reset",
            sushy.port
        ))
        .status()
        .unwrap();
    assert!(o.success());
    // sushy's fake driver applies a reset 1-11 s after accepting it, so the
    // poller may already have seen "off" (the power-on still pending) and
    // then "on". What counts is the latest change, made after the ForceOff,
    // and the Machine's status agreeing with it.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let ev: Vec<Value> =
            serde_json::from_str(&d.cli_ok(&["events", "node-1", "-o", "json"])).unwrap();
        let last = ev.iter().rfind(|e| e["kind"] == "bmc.power_changed");
        let get = d.cli_ok(&["bmc", "get"]);
        let after = last.filter(|e| e["time"].as_str() >= Some(forced_at.as_str()));
        if after.is_some_and(|e| e["message"] == "power changed from on to off")
            && get.contains(" off ")
        {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no bmc.power_changed to off after {forced_at}: {ev:?}\n{get}"
        );
        std::thread::sleep(Duration::from_millis(250));
    }
}

/// A Workflow with `bootMode: netboot` (what CAPT creates for a Hardware
/// with a bmcRef): in PREPARING the engine sets allowPXE and runs the job
/// `netboot-<workflow>` on the Hardware's BMC (sushy-emulator): power off,
/// PXE once with EFI (the Hardware says uefi), power on; the Workflow waits
/// for it and then is PENDING. Every kind in one `tinkerbox apply`.
#[test]
fn a_workflow_with_boot_mode_netboot_runs_its_bmc_job() {
    let sushy = Sushy::start();
    let d = Daemon::start();
    let out = apply_workflow(
        &d,
        &sushy,
        "{{.device_1}}",
        "{toggleAllowNetboot: true, bootMode: netboot}",
    );
    assert!(
        out.contains("machine.bmc.tinkerbell.org/bmc-1 created")
            && out.contains("workflow.tinkerbell.org/wf1 created"),
        "{out}"
    );
    let start = Instant::now();
    let w = loop {
        let w: Value =
            serde_json::from_str(&d.cli_ok(&["get", "workflow", "wf1", "-o", "json"])).unwrap();
        if w["status"]["state"] != "PREPARING" && w["status"]["state"] != "" {
            break w;
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "still preparing: {w:#}"
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    assert_eq!(w["status"]["state"], "PENDING", "{w:#}");
    assert_eq!(
        w["status"]["bootOptions"]["jobs"]["netboot-wf1"]["complete"], true,
        "{w:#}"
    );
    let kinds: Vec<&str> = w["status"]["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["type"].as_str().unwrap())
        .collect();
    for k in [
        "TemplateRenderedSuccess",
        "AllowNetbootTrue",
        "BootJobSetupComplete",
        "BootJobComplete",
    ] {
        assert!(kinds.contains(&k), "{k} missing: {kinds:?}");
    }
    let job: Value =
        serde_json::from_str(&d.cli_ok(&["bmc", "job", "get", "netboot-wf1", "-o", "json"]))
            .unwrap();
    assert_eq!(job["state"], "completed", "{job:#}");
    sushy.wait_power("On");
    let boot = &sushy.system()["Boot"];
    assert_eq!(boot["BootSourceOverrideTarget"], "Pxe");
    assert_eq!(boot["BootSourceOverrideMode"], "UEFI");
    let hw: Value =
        serde_json::from_str(&d.cli_ok(&["hardware", "get", "node-1", "-o", "json"])).unwrap();
    assert_eq!(hw["spec"]["interfaces"][0]["netboot"]["allowPXE"], true);
}

/// bootMode isoboot against sushy's virtual media: in PREPARING the BMC
/// fetches the ISO from tinkerbox's own artifact server and boots it once;
/// the agent runs the workflow; in POST the ISO is ejected; SUCCESS.
#[test]
fn a_workflow_with_boot_mode_isoboot_mounts_and_ejects_the_iso() {
    let sushy = Sushy::start();
    let d = Daemon::start();
    let artifacts = d.dir.join("state/artifacts");
    std::fs::create_dir_all(&artifacts).unwrap();
    std::fs::write(artifacts.join("hook.iso"), vec![0x5a_u8; 256 * 1024]).unwrap();
    let iso = format!("http://{}/artifacts/hook.iso", d.http);
    apply_workflow(
        &d,
        &sushy,
        "{{.device_1}}",
        &format!("{{toggleAllowNetboot: true, bootMode: isoboot, isoURL: \"{iso}\"}}"),
    );
    let state =
        |want: &str| crate::tink::wait_state_within(&d, "wf1", want, Duration::from_secs(60));
    let w = state("PENDING");
    assert_eq!(
        w["status"]["bootOptions"]["jobs"]["iso-mount-wf1"]["complete"], true,
        "{w:#}"
    );
    let sys = sushy.system();
    let cd_path = format!("{}/VirtualMedia/Cd", sys["@odata.id"].as_str().unwrap());
    let cd = sushy.get(&cd_path).unwrap();
    assert_eq!(cd["Inserted"], true, "{cd:#}");
    assert_eq!(cd["Image"], iso.as_str(), "{cd:#}");
    assert_eq!(sys["Boot"]["BootSourceOverrideTarget"], "Cd", "{sys:#}");
    sushy.wait_power("On");
    let job: Value =
        serde_json::from_str(&d.cli_ok(&["bmc", "job", "get", "iso-mount-wf1", "-o", "json"]))
            .unwrap();
    assert_eq!(job["tasks"].as_array().unwrap().len(), 5, "{job:#}");
    // The agent runs the one action; POST ejects.
    let lines = crate::tink::peer(&d, &["agent", "52:54:00:88:00:01"]);
    assert!(lines.iter().any(|l| l["event"] == "served"), "{lines:#?}");
    let w = state("SUCCESS");
    assert_eq!(
        w["status"]["bootOptions"]["jobs"]["iso-eject-wf1"]["complete"], true,
        "{w:#}"
    );
    let cd = sushy.get(&cd_path).unwrap();
    assert_eq!(cd["Inserted"], false, "{cd:#}");
    assert_eq!(cd["Image"], "", "{cd:#}");
    // The same by hand: `bmc media` inserts and ejects.
    d.cli_ok(&["bmc", "media", "bmc-1", &iso]);
    assert_eq!(sushy.get(&cd_path).unwrap()["Inserted"], true);
    d.cli_ok(&["bmc", "media", "bmc-1", "--eject"]);
    assert_eq!(sushy.get(&cd_path).unwrap()["Inserted"], false);
    let bad = d.cli(&["bmc", "media", "bmc-1", "file:///etc/passwd"]);
    assert!(!bad.status.success());
    assert!(
        String::from_utf8_lossy(&bad.stderr).contains("want an http:// or https:// URL"),
        "{}",
        String::from_utf8_lossy(&bad.stderr)
    );
    let ev: Vec<Value> =
        serde_json::from_str(&d.cli_ok(&["events", "node-1", "-o", "json"])).unwrap();
    let media: Vec<&str> = ev
        .iter()
        .filter(|e| e["kind"] == "bmc.media")
        .map(|e| e["message"].as_str().unwrap())
        .collect();
    assert!(
        media.iter().any(|m| m.contains("insert http://"))
            && media.iter().filter(|m| m.contains("eject")).count() >= 2,
        "{media:?}"
    );
}

/// An ISO the BMC cannot fetch fails the mount job, and the Workflow with it.
#[test]
fn an_iso_the_bmc_cannot_fetch_fails_the_workflow() {
    let sushy = Sushy::start();
    let d = Daemon::start();
    apply_workflow(
        &d,
        &sushy,
        "w",
        &format!(
            "{{bootMode: iso, isoURL: \"http://{}/artifacts/missing.iso\"}}",
            d.http
        ),
    );
    // The job retries with backoff before it gives up.
    let w = crate::tink::wait_state_within(&d, "wf1", "FAILED", Duration::from_secs(120));
    let failed = w["status"]["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == "BootJobFailed")
        .unwrap_or_else(|| panic!("{w:#}"));
    assert!(
        failed["message"]
            .as_str()
            .unwrap()
            .contains("iso-mount-wf1"),
        "{failed}"
    );
    let job: Value =
        serde_json::from_str(&d.cli_ok(&["bmc", "job", "get", "iso-mount-wf1", "-o", "json"]))
            .unwrap();
    assert!(
        job["message"].as_str().unwrap_or("").contains("404")
            || job["message"].as_str().unwrap_or("").contains("download"),
        "{job:#}"
    );
}

/// Rufio's inventory collection against sushy-emulator: the BMC's system
/// into the Hardware's `status.attributes.outOfBand`, read at once for a
/// Machine with `tinkerbell.org/refresh-inventory`, which is then removed.
#[test]
fn a_redfish_bmcs_inventory_lands_in_its_hardwares_status() {
    let sushy = Sushy::start();
    let d = Daemon::start();
    let docs = docs(&format!("http://127.0.0.1:{}", sushy.port)).replace(
        "metadata: {name: bmc-1, namespace: default}",
        "metadata: {name: bmc-1, namespace: default, annotations: {tinkerbell.org/refresh-inventory: \"true\"}}",
    );
    apply_all(&d, &docs);
    let start = Instant::now();
    let oob = loop {
        let hw: Value =
            serde_json::from_str(&d.cli_ok(&["get", "hardware", "node-1", "-o", "json"])).unwrap();
        let oob = hw["status"]["attributes"]["outOfBand"].clone();
        if oob.is_object() {
            break oob;
        }
        assert!(
            start.elapsed() < Duration::from_secs(40),
            "no inventory: {hw:#}\n{}",
            d.log()
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    assert_eq!(oob["collectionMethod"], "redfish", "{oob:#}");
    assert_eq!(oob["product"]["vendor"], "Sushy Emulator", "{oob:#}");
    assert!(oob["lastUpdated"].is_string(), "{oob:#}");
    let nics = oob["networkInterfaces"].as_array().map_or(0, Vec::len);
    assert!(nics >= 1, "sushy's fake system has NICs: {oob:#}");
    let start = Instant::now();
    loop {
        let m: Value =
            serde_json::from_str(&d.cli_ok(&["get", "machine", "bmc-1", "-o", "json"])).unwrap();
        if m["metadata"]["annotations"]["tinkerbell.org/refresh-inventory"].is_null() {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "refresh annotation kept: {m:#}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    // The event log is written in batches (every 100 ms): waited for.
    let start = Instant::now();
    loop {
        let events = d.cli_ok(&["events", "node-1"]);
        if events.contains("out-of-band inventory read from BMC default/bmc-1") {
            break;
        }
        assert!(start.elapsed() < Duration::from_secs(5), "{events}");
        std::thread::sleep(Duration::from_millis(100));
    }
}
