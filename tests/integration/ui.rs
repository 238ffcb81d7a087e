//! The web UI over HTTP, with curl as the browser's network side: the
//! login into a session cookie and its attributes, pages refused or sent
//! to the login without it, the machines list, its filters, a machine's
//! page, the live feed (Server-Sent Events) carrying an event as it is
//! stored, CSRF on logout, and the security headers. (The pages in a real
//! browser are tests/ui's, in headless Chromium.)

use crate::common::*;
use std::process::Stdio;
use std::time::Duration;

/// `curl` with the cookie jar `jar` (a POST of `form` if given):
/// (status, headers, body).
fn request(d: &Daemon, jar: &str, path: &str, form: Option<&str>) -> (String, String, String) {
    let url = d.api_url(path);
    let mut args = vec![
        "-s",
        "-b",
        jar,
        "-c",
        jar,
        "-D",
        "-",
        "-w",
        "\n%{http_code}",
    ];
    if let Some(f) = form {
        args.extend(["--data", f]);
    }
    args.push(&url);
    let o = d.curl(&args);
    split(&String::from_utf8_lossy(&o.stdout))
}

fn get(d: &Daemon, jar: &str, path: &str) -> (String, String, String) {
    request(d, jar, path, None)
}

fn post(d: &Daemon, jar: &str, path: &str, form: &str) -> (String, String, String) {
    request(d, jar, path, Some(form))
}

/// curl -D - output: headers, blank line, body, then the -w code line.
fn split(out: &str) -> (String, String, String) {
    let (rest, code) = out.rsplit_once('\n').unwrap_or((out, ""));
    let (headers, body) = rest.split_once("\r\n\r\n").unwrap_or((rest, ""));
    (
        code.trim().to_string(),
        headers.to_string(),
        body.to_string(),
    )
}

fn csrf(body: &str) -> String {
    body.split("name=\"csrf\" content=\"")
        .nth(1)
        .and_then(|s| s.split('"').next())
        .unwrap_or_default()
        .to_string()
}

#[test]
fn login_pages_filters_the_live_feed_and_logout() {
    let d = Daemon::start();
    let f = write_file(
        &d.dir,
        "hw.yaml",
        &format!(
            "{}---\n{}",
            hw_doc("web-01", "52:54:00:12:34:01", "10.1.0.11"),
            hw_doc("db-01", "52:54:00:12:34:02", "10.1.0.12").replace(
                "  namespace: default\n",
                "  namespace: default\n  labels: {rack: r2}\n"
            )
        ),
    );
    d.cli_ok(&["apply", "-f", f.to_str().unwrap()]);
    let jar = d.dir.join("cookies.txt");
    let jar = jar.to_str().unwrap();

    // Without a session: pages go to the login, the rest is refused.
    let (code, headers, _) = get(&d, jar, "/ui/");
    assert_eq!(code, "303", "{headers}");
    assert!(
        headers.to_lowercase().contains("location: /ui/login"),
        "{headers}"
    );
    assert_eq!(get(&d, jar, "/ui/stream").0, "401");
    assert_eq!(get(&d, jar, "/ui/machines/default/web-01/row").0, "401");
    assert_eq!(
        post(
            &d,
            jar,
            "/ui/machines/default/web-01/action",
            "csrf=x&action=power-off"
        )
        .0,
        "401",
        "an action without a session"
    );
    // The API's bearer check is not the UI's, nor the other way round.
    assert_eq!(d.http_status(&d.api_url("/api/v1/hardware")), "401");

    // A wrong token: refused, saying what to use; the right one: a cookie.
    let (code, _, body) = post(&d, jar, "/ui/login", "token=not-it");
    assert_eq!(code, "401");
    assert!(body.contains("api-token"), "{body}");
    let (code, headers, _) = post(&d, jar, "/ui/login", &format!("token={}", d.token()));
    assert_eq!(code, "303", "{headers}");
    let cookie = headers
        .lines()
        .find(|l| l.to_lowercase().starts_with("set-cookie:"))
        .unwrap_or_default();
    for attr in ["HttpOnly", "SameSite=Strict", "Path=/ui"] {
        assert!(cookie.contains(attr), "{attr}: {cookie}");
    }
    assert!(!cookie.contains("Secure"), "no TLS here: {cookie}");

    // The list: both machines, with their addresses; the headers.
    let (code, headers, body) = get(&d, jar, "/ui/");
    assert_eq!(code, "200");
    assert!(body.contains("web-01") && body.contains("db-01"), "{body}");
    assert!(body.contains("10.1.0.11") && body.contains("52:54:00:12:34:02"));
    let h = headers.to_lowercase();
    assert!(
        h.contains("content-security-policy: default-src 'self'"),
        "{headers}"
    );
    assert!(h.contains("x-content-type-options: nosniff"));
    assert!(h.contains("cache-control: no-store"), "{headers}");
    // The assets, named by their hash: kept by the browser for good.
    let css = body
        .split("href=\"")
        .find_map(|p| p.strip_prefix("/ui/assets/ui.css?v="))
        .and_then(|p| p.split('"').next())
        .unwrap_or_default()
        .to_string();
    assert_eq!(css.len(), 16, "{body}");
    let (code, headers, _) = get(&d, jar, &format!("/ui/assets/ui.css?v={css}"));
    assert_eq!(code, "200");
    assert!(
        headers
            .to_lowercase()
            .contains("cache-control: public, max-age=31536000, immutable"),
        "{headers}"
    );
    // Search by MAC, filter by label, by state; a bad selector says so.
    let (_, _, body) = get(&d, jar, "/ui/?q=12:34:02");
    assert!(
        body.contains("db-01") && !body.contains(">web-01<"),
        "{body}"
    );
    let (_, _, body) = get(&d, jar, "/ui/?l=rack%3Dr2");
    assert!(
        body.contains("db-01") && !body.contains(">web-01<"),
        "{body}"
    );
    let (_, _, body) = get(&d, jar, "/ui/?state=installed");
    assert!(body.contains("0 of 2 machines"), "{body}");
    let (_, _, body) = get(&d, jar, "/ui/?l=rack%3D%3D%3D");
    assert!(body.contains("label selector"), "{body}");
    // Text from the store is escaped.
    let (_, _, body) = get(&d, jar, "/ui/?q=%3Cscript%3E");
    assert!(!body.contains("<script>"), "{body}");
    assert!(
        body.contains("&#60;script&#62;") || body.contains("&lt;script&gt;"),
        "{body}"
    );

    // The dashboard: the machines per state, the health lines, events.
    let (code, _, body) = get(&d, jar, "/ui/dashboard");
    assert_eq!(code, "200");
    assert!(
        body.contains("<b>2</b> machines") && body.contains("<li>ok</li>"),
        "{body}"
    );
    assert!(
        body.contains("default/web-01: Hardware default/web-01 created"),
        "{body}"
    );

    // A machine's page: its interface and its timeline.
    let (code, _, body) = get(&d, jar, "/ui/machines/default/web-01");
    assert_eq!(code, "200");
    assert!(
        body.contains("10.1.0.11") && body.contains("hardware.created"),
        "{body}"
    );
    assert_eq!(get(&d, jar, "/ui/machines/default/nope").0, "404");
    // The page's stream resumes after its newest event, as the page's
    // script asks: a stream that connects late still gets what came after.
    let after: i64 = body
        .split("&amp;after=")
        .nth(1)
        .and_then(|t| t.split('"').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no after= in the page: {body}"));

    // A list page's stream names machines as namespace/name. (Checked
    // before the streams start: `get` rewrites the cookie jar they read.)
    assert_eq!(get(&d, jar, "/ui/stream?machines=db-01").0, "400");
    // The live feed: an event stored while the page listens reaches it.
    let sse = d
        .command("curl")
        .args(["-s", "-N", "--max-time", "6", "-b", jar])
        .arg(d.api_url(&format!("/ui/stream?machine=default/web-01&after={after}")))
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    // And a list page's: the machines it shows.
    let listed = d
        .command("curl")
        .args(["-s", "-N", "--max-time", "6", "-b", jar])
        .arg(d.api_url(&format!(
            "/ui/stream?machines=default/db-01,default/gone&after={after}"
        )))
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(800));
    let f = write_file(
        &d.dir,
        "hw2.yaml",
        &hw_doc("web-01", "52:54:00:12:34:01", "10.1.0.21"),
    );
    d.cli_ok(&["apply", "-f", f.to_str().unwrap()]);
    let f = write_file(
        &d.dir,
        "hw3.yaml",
        &hw_doc("db-01", "52:54:00:12:34:02", "10.1.0.22"),
    );
    d.cli_ok(&["apply", "-f", f.to_str().unwrap()]);
    let out = sse.wait_with_output().unwrap();
    let out = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.contains("hardware.updated") && out.contains("web-01"),
        "{out}"
    );
    assert!(!out.contains("db-01"), "another machine's event: {out}");
    let list = listed.wait_with_output().unwrap();
    let list = String::from_utf8_lossy(&list.stdout);
    assert!(list.contains("db-01") && !list.contains("web-01"), "{list}");
    assert!(out.contains("\nid: ") || out.starts_with("id: "), "{out}");
    // Resumed from an id: what came after it, from the log.
    let first_id: i64 = out
        .lines()
        .find_map(|l| l.strip_prefix("id: "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap();
    let o = d.curl(&[
        "-s",
        "-N",
        "--max-time",
        "2",
        "-b",
        jar,
        &d.api_url(&format!("/ui/stream?after={}", first_id - 1)),
    ]);
    let resumed = String::from_utf8_lossy(&o.stdout);
    assert!(
        resumed.contains("web-01") && resumed.contains("db-01"),
        "{resumed}"
    );
    // The row fragment, as the list's script fetches it.
    let (code, _, body) = get(&d, jar, "/ui/machines/default/web-01/row");
    assert_eq!(code, "200");
    assert!(body.contains("10.1.0.21"), "{body}");
    // The list too (its cache of the documents follows every change).
    let (_, _, body) = get(&d, jar, "/ui/?q=web-01");
    assert!(
        body.contains("10.1.0.21") && !body.contains("10.1.0.11"),
        "{body}"
    );

    // Logout: a wrong CSRF token is refused; the right one ends the session.
    let (_, _, page) = get(&d, jar, "/ui/");
    let token = csrf(&page);
    assert_eq!(token.len(), 32, "{page}");
    assert_eq!(post(&d, jar, "/ui/logout", "csrf=0000").0, "403");
    assert_eq!(get(&d, jar, "/ui/").0, "200");
    let jar_text = std::fs::read_to_string(jar).unwrap();
    let session = jar_text
        .lines()
        .find(|l| l.contains("tinkerbox_session"))
        .and_then(|l| l.split('\t').next_back())
        .unwrap()
        .to_string();
    assert_eq!(
        post(&d, jar, "/ui/logout", &format!("csrf={token}")).0,
        "303"
    );
    assert_eq!(get(&d, jar, "/ui/").0, "303");
    // The session is over on the server, not only gone from the jar.
    let o = d.curl(&[
        "-s",
        "-o",
        "/dev/null",
        "-w",
        "%{http_code}",
        "-H",
        &format!("Cookie: tinkerbox_session={session}"),
        &d.api_url("/ui/"),
    ]);
    assert_eq!(String::from_utf8_lossy(&o.stdout), "303");
}
