//! The web UI in a real browser: Debian's headless Chromium, driven over
//! WebDriver (chromedriver, with the fantoccini client). It logs in with
//! the admin token, finds a machine by searching, opens its page and
//! watches its Workflow progress there, without a reload, while the
//! upstream-proto gRPC peer reports its actions; powers it on and off with
//! the page's buttons (confirmed) and sees the BMC jobs run against
//! ipmi_sim; and has a forged action refused. A BareMetalHost (its BMC
//! sushy-emulator) is claimed and released with its page's buttons and
//! followed live through provisioning and cleaning. With
//! `TB_UI_SCREENSHOTS=DIR` it also saves the pages as PNGs (the README's
//! screenshots: `TB_UI_SCREENSHOTS=docs/ui cargo nextest run ui_browser`).

use crate::common::*;
use crate::tink::peer;
use fantoccini::{Client, ClientBuilder, Locator};
use serde_json::json;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const MAC: &str = "52:54:00:ee:00:01";

/// chromedriver on a free port, stopped by PID when dropped.
struct Driver {
    child: Child,
    port: u16,
}

impl Driver {
    fn start(dir: &std::path::Path) -> Driver {
        for bin in ["/usr/bin/chromium", "/usr/bin/chromedriver"] {
            assert!(
                std::path::Path::new(bin).exists(),
                "{bin} is missing: tests/deps installs chromium and chromium-driver"
            );
        }
        let port = free_port();
        let log = std::fs::File::create(dir.join("chromedriver.log")).unwrap();
        let child = Command::new("/usr/bin/chromedriver")
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        let d = Driver { child, port };
        let deadline = Instant::now() + Duration::from_secs(20);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(Instant::now() < deadline, "chromedriver never listened");
            std::thread::sleep(Duration::from_millis(100));
        }
        d
    }
}

impl Drop for Driver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

async fn browser(port: u16) -> Client {
    let mut caps = serde_json::Map::new();
    caps.insert(
        "goog:chromeOptions".into(),
        json!({
            "binary": "/usr/bin/chromium",
            "args": ["--headless=new", "--no-sandbox", "--disable-dev-shm-usage",
                     "--disable-gpu", "--window-size=1360,900"],
        }),
    );
    ClientBuilder::new(hyper_util::client::legacy::connect::HttpConnector::new())
        .capabilities(caps)
        .connect(&format!("http://127.0.0.1:{port}"))
        .await
        .expect("a Chromium session through chromedriver")
}

/// The page's JavaScript value of `expr`.
async fn js(c: &Client, expr: &str) -> serde_json::Value {
    c.execute(&format!("return {expr};"), vec![]).await.unwrap()
}

/// Wait (bounded) until `expr` is true in the page.
async fn until(c: &Client, secs: u64, expr: &str) {
    let deadline = Instant::now() + Duration::from_secs(secs);
    while js(c, expr).await != json!(true) {
        assert!(
            Instant::now() < deadline,
            "{expr} never true; the page:\n{}",
            js(c, "document.body.innerText").await
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn click(c: &Client, what: Locator<'_>) {
    c.find(what).await.unwrap().click().await.unwrap();
}

async fn shot(c: &Client, name: &str) {
    if let Ok(dir) = std::env::var("TB_UI_SCREENSHOTS") {
        let png = c.screenshot().await.unwrap();
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(std::path::Path::new(&dir).join(name), png).unwrap();
    }
}

#[test]
fn in_chromium_log_in_find_a_machine_and_watch_its_workflow_live() {
    let d = Daemon::start();
    let mut docs = String::new();
    for (i, name) in ["web-01", "web-02", "db-01"].iter().enumerate() {
        let mac = if i == 0 {
            MAC.to_string()
        } else {
            format!("52:54:00:ee:00:1{i}")
        };
        docs += &hw_doc(name, &mac, &format!("10.2.0.{}", 11 + i));
        docs += "---\n";
    }
    docs += &crate::kube::workflow_docs(
        "install",
        &["stream-image", "cloud-init", "reboot"],
        "web-01-install",
        "web-01",
        MAC,
        "",
    );
    // web-01's BMC: ipmi_sim, as Rufio's Machine `ipmi-1`.
    let docs = docs.replacen(
        "spec:\n  interfaces:",
        "spec:\n  bmcRef: {apiGroup: bmc.tinkerbell.org, kind: Machine, name: ipmi-1}\n  interfaces:",
        1,
    );
    let sim = crate::bmc_ipmi::Sim::start();
    let f = write_file(&d.dir, "bmc.yaml", &crate::bmc_ipmi::machine_docs(&sim));
    d.cli_ok(&["bmc", "apply", "-f", f.to_str().unwrap()]);
    let f = write_file(&d.dir, "docs.yaml", &docs);
    d.cli_ok(&["apply", "-f", f.to_str().unwrap()]);
    let (d, sim) = (&d, &sim);
    with_browser(d, |c| async move {
        // The login page; then in with the token.
        c.goto(&d.api_url("/ui/")).await.unwrap();
        until(&c, 10, "location.pathname === '/ui/login'").await;
        shot(&c, "login.png").await;
        c.find(Locator::Css("#token"))
            .await
            .unwrap()
            .send_keys(&d.token())
            .await
            .unwrap();
        click(&c, Locator::Css("button[type=submit]")).await;
        until(&c, 10, "location.pathname === '/ui/'").await;
        until(
            &c,
            10,
            "document.querySelectorAll('#machines tbody tr').length === 3",
        )
        .await;
        // The session cookie is not for scripts.
        assert_eq!(js(&c, "document.cookie").await, json!(""));
        shot(&c, "machines.png").await;

        // The dashboard: counts, health, and every machine's events, live.
        c.goto(&d.api_url("/ui/dashboard")).await.unwrap();
        until(
            &c,
            10,
            "document.getElementById('live').classList.contains('on')",
        )
        .await;
        let f = write_file(
            &d.dir,
            "new.yaml",
            &hw_doc("new-01", "52:54:00:ee:00:99", "10.2.0.99"),
        );
        d.cli_ok(&["apply", "-f", f.to_str().unwrap()]);
        until(
            &c,
            10,
            "document.querySelector('#timeline li').innerText.includes('default/new-01: Hardware default/new-01 created')",
        )
        .await;
        assert_eq!(
            js(&c, "document.querySelector('.health li').innerText").await,
            json!("ok")
        );
        shot(&c, "dashboard.png").await;
        c.goto(&d.api_url("/ui/")).await.unwrap();

        // Find it: a search by part of its MAC.
        // Found from the keyboard: "/" goes to the search box.
        c.find(Locator::Css("body"))
            .await
            .unwrap()
            .send_keys("/")
            .await
            .unwrap();
        assert_eq!(js(&c, "document.activeElement.name").await, json!("q"));
        c.active_element()
            .await
            .unwrap()
            .send_keys("ee:00:01\n")
            .await
            .unwrap();
        until(
            &c,
            10,
            "document.querySelectorAll('#machines tbody tr').length === 1",
        )
        .await;
        click(&c, Locator::LinkText("web-01")).await;
        until(
            &c,
            10,
            "location.pathname === '/ui/machines/default/web-01'",
        )
        .await;
        until(
            &c,
            10,
            "document.getElementById('live').classList.contains('on')",
        )
        .await;
        // A mark a reload would lose.
        js(&c, "(window.stillHere = true)").await;

        // The agent takes the first two actions and hangs in the third:
        // the page shows it, live.
        let out = peer(d, &["agent", MAC, "--hang", "reboot", "--polls", "400"]);
        assert!(out.iter().any(|e| e["event"] == "hung"), "{out:#?}");
        until(
            &c,
            20,
            "document.querySelector('#panels').innerText.includes('RUNNING') && \
             document.querySelectorAll('#panels tr.ok').length === 2 && \
             document.querySelector('#panels tr.run') !== null && \
             document.querySelector('#panels tr.run').innerText.includes('reboot')",
        )
        .await;
        until(
            &c,
            10,
            "document.querySelector('#panels progress').value === 66",
        )
        .await;
        until(
            &c,
            10,
            "[...document.querySelectorAll('#timeline .kind')].some(k => k.innerText === 'workflow.action_succeeded')",
        )
        .await;
        assert_eq!(
            js(&c, "window.stillHere === true").await,
            json!(true),
            "the page reloaded"
        );
        shot(&c, "machine.png").await;

        // Power on, then off, with the buttons: each asks first, then its
        // BMC job runs against ipmi_sim and the page follows it.
        for (button, power, done) in [
            ("power-on", "1", "power on"),
            ("power-off", "0", "power off"),
        ] {
            click(&c, Locator::Css(&format!("button[value={button}]"))).await;
            let asked = c.get_alert_text().await.unwrap();
            assert!(asked.contains("web-01"), "{asked}");
            c.accept_alert().await.unwrap();
            until(&c, 10, "document.querySelector('.notice') !== null").await;
            until(
                &c,
                30,
                &format!(
                    "[...document.querySelectorAll('#panels table.jobs tr.ok')].some(r => r.innerText.includes('{done}'))"
                ),
            )
            .await;
            let deadline = Instant::now() + Duration::from_secs(10);
            while sim.power_file() != power {
                assert!(Instant::now() < deadline, "ipmi_sim never saw {button}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
        // The Machine's power, as the BMC poll or job left it.
        c.refresh().await.unwrap();
        until(&c, 10, "document.querySelector('h1 .power.off') !== null").await;
        // A forged action (the wrong CSRF token) is refused.
        let status = c
            .execute_async(
                "const done = arguments[arguments.length - 1];
                 fetch(location.pathname + '/action', {method: 'POST',
                     body: new URLSearchParams({csrf: 'forged', action: 'power-on'})})
                   .then(r => done(r.status));",
                vec![],
            )
            .await
            .unwrap();
        assert_eq!(status, json!(403));
        assert_eq!(sim.power_file(), "0");

        // The Workflows list, and its Template rendered for the machine
        // (device_1 its MAC), as a check before running it.
        c.goto(&d.api_url("/ui/workflows")).await.unwrap();
        until(
            &c,
            10,
            "document.querySelector('table.objects').innerText.includes('web-01-install')",
        )
        .await;
        // Searched (any cell, any case): one row, then none.
        c.goto(&d.api_url("/ui/workflows?q=WEB-01")).await.unwrap();
        until(
            &c,
            10,
            "document.querySelectorAll('table.objects tbody tr').length === 1",
        )
        .await;
        c.goto(&d.api_url("/ui/workflows?q=no-such")).await.unwrap();
        until(&c, 10, "document.querySelector('table.objects') === null && document.querySelector('h1').innerText.includes('0 of 1')").await;
        c.goto(&d.api_url("/ui/templates/default/install?for=web-01"))
            .await
            .unwrap();
        until(
            &c,
            10,
            &format!(
                "document.querySelector('pre.rendered').innerText.includes('worker: \"{MAC}\"')"
            ),
        )
        .await;
        shot(&c, "template.png").await;
        // Run it on web-02 (a new Workflow, confirmed): its page follows it.
        c.goto(&d.api_url("/ui/templates/default/install?for=web-02"))
            .await
            .unwrap();
        click(&c, Locator::Css("form[action$='/run'] button")).await;
        c.accept_alert().await.unwrap();
        until(
            &c,
            10,
            "location.pathname === '/ui/machines/default/web-02'",
        )
        .await;
        until(
            &c,
            10,
            "document.querySelector('#panels').innerText.includes('install-web-02-')",
        )
        .await;

        // Back on the list, the row shows the Workflow under way.
        // (web-02's new one too).
        c.goto(&d.api_url("/ui/?state=installing")).await.unwrap();
        until(
            &c,
            10,
            "document.querySelectorAll('#machines tbody tr').length === 2",
        )
        .await;
        until(&c, 10, "[...document.querySelectorAll('#machines tbody tr')].some(r => r.innerText.includes('web-01-install (2/3)'))").await;
    });
}

/// Run `f` with a Chromium session, closed after; chromedriver stopped.
fn with_browser<F, Fut>(d: &Daemon, f: F)
where
    F: FnOnce(Client) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let driver = Driver::start(&d.dir);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let c = browser(driver.port).await;
        f(c.clone()).await;
        c.close().await.unwrap();
    });
    drop(driver);
}

/// Wait (bounded) until the badge at `sel` says `state`.
async fn badge(c: &Client, secs: u64, sel: &str, state: &str) {
    until(
        c,
        secs,
        &format!("document.querySelector('{sel}').textContent === '{state}'"),
    )
    .await;
}

/// The page was not reloaded since `window.stillHere` was set.
async fn still_here(c: &Client) {
    assert_eq!(
        js(c, "window.stillHere === true").await,
        json!(true),
        "the page reloaded"
    );
}

/// The agent takes the machine's Workflow to its end.
fn agent_runs(d: &Daemon, mac: &str) {
    let out = peer(d, &["agent", mac, "--polls", "800"]);
    assert!(out.iter().any(|e| e["event"] == "done"), "{out:#?}");
}

/// Log in with the token (the login page's form).
async fn log_in(c: &Client, d: &Daemon) {
    c.goto(&d.api_url("/ui/login")).await.unwrap();
    c.find(Locator::Css("#token"))
        .await
        .unwrap()
        .send_keys(&d.token())
        .await
        .unwrap();
    click(c, Locator::Css("button[type=submit]")).await;
    until(c, 10, "location.pathname === '/ui/'").await;
}

#[test]
fn in_chromium_a_bare_metal_host_is_claimed_and_released_with_its_buttons() {
    const MAC_B: &str = "52:54:00:77:00:0b";
    let sushy = crate::bmc_jobs::Sushy::start();
    let d = Daemon::start();
    let f = write_file(
        &d.dir,
        "bmh.yaml",
        &crate::metal3::bare_host("node-b", MAC_B, "r2", sushy.port),
    );
    d.cli_ok(&["apply", "-f", f.to_str().unwrap()]);
    crate::metal3::wait_named(&d, "node-b", "available");
    let d = &d;
    with_browser(d, |c| async move {
        log_in(&c, d).await;
        // The list, then the host's page: available, its inspection shown.
        c.goto(&d.api_url("/ui/baremetalhosts")).await.unwrap();
        click(&c, Locator::LinkText("node-b")).await;
        until(
            &c,
            10,
            "location.pathname === '/ui/baremetalhosts/default/node-b'",
        )
        .await;
        until(
            &c,
            10,
            "document.getElementById('live').classList.contains('on')",
        )
        .await;
        badge(&c, 10, "#panels .badge", "available").await;
        assert!(
            js(&c, "document.getElementById('panels').innerText")
                .await
                .as_str()
                .unwrap()
                .contains("20.0 GiB"),
            "the inspection's disk"
        );
        js(&c, "(window.stillHere = true)").await;

        // Claimed with the form (asked first): provisioning, live.
        for (field, value) in [
            ("image", "http://10.99.0.1/img.raw.gz"),
            ("checksum", "0123456789abcdef0123456789abcdef"),
            ("consumer", "web-1"),
        ] {
            c.find(Locator::Css(&format!("form.claim [name={field}]")))
                .await
                .unwrap()
                .send_keys(value)
                .await
                .unwrap();
        }
        click(&c, Locator::Css("form.claim button")).await;
        let asked = c.get_alert_text().await.unwrap();
        assert!(asked.contains("node-b"), "{asked}");
        c.accept_alert().await.unwrap();
        badge(&c, 15, "#panels .badge", "provisioning").await;
        assert!(
            js(&c, "document.getElementById('panels').innerText")
                .await
                .as_str()
                .unwrap()
                .contains("web-1")
        );
        // The page's own reload after the POST; from here it is live.
        js(&c, "(window.stillHere = true)").await;
        agent_runs(d, MAC_B);
        badge(&c, 20, "#panels .badge", "provisioned").await;
        still_here(&c).await;
        shot(&c, "baremetalhost.png").await;

        // Its Hardware's page shows the host too, with the same button.
        c.goto(&d.api_url("/ui/machines/default/node-b"))
            .await
            .unwrap();
        badge(&c, 10, "#panels .host .badge", "provisioned").await;

        // Released (asked first): cleaned, then the last step clears the
        // consumer, and the claim form is back.
        click(&c, Locator::Css("form[action$='/release'] button")).await;
        c.accept_alert().await.unwrap();
        badge(&c, 15, "#panels .host .badge", "deprovisioning").await;
        js(&c, "(window.stillHere = true)").await;
        agent_runs(d, MAC_B);
        badge(&c, 20, "#panels .host .badge", "available").await;
        still_here(&c).await;
        click(&c, Locator::Css("form[action$='/release'] button")).await;
        let asked = c.get_alert_text().await.unwrap();
        assert!(asked.contains("consumer"), "{asked}");
        c.accept_alert().await.unwrap();
        until(&c, 10, "document.querySelector('form.claim') !== null").await;
        let h: serde_json::Value =
            serde_json::from_str(&d.cli_ok(&["get", "bmh", "node-b", "-o", "json"])).unwrap();
        assert!(h["spec"].get("consumerRef").is_none(), "{h:#}");

        // A claim the host cannot take (no image URL scheme the webhook
        // takes) is refused with the reason, and changes nothing.
        let status = c
            .execute_async(
                "const done = arguments[arguments.length - 1];
                 const csrf = document.querySelector('form.claim [name=csrf]').value;
                 fetch('/ui/baremetalhosts/default/node-b/claim', {method: 'POST',
                     body: new URLSearchParams({csrf, image: 'http://x/i', format: 'floppy'})})
                   .then(async r => done([r.status, await r.text()]));",
                vec![],
            )
            .await
            .unwrap();
        assert_eq!(status[0], json!(422), "{status}");
        let forged = c
            .execute_async(
                "const done = arguments[arguments.length - 1];
                 fetch('/ui/baremetalhosts/default/node-b/claim', {method: 'POST',
                     body: new URLSearchParams({csrf: 'forged', image: 'http://x/i'})})
                   .then(r => done(r.status));",
                vec![],
            )
            .await
            .unwrap();
        assert_eq!(forged, json!(403));
        let h: serde_json::Value =
            serde_json::from_str(&d.cli_ok(&["get", "bmh", "node-b", "-o", "json"])).unwrap();
        assert!(
            h["spec"].get("consumerRef").is_none() && h["spec"].get("image").is_none(),
            "{h:#}"
        );
    });
}
