#!/usr/bin/env python3
"""The web UI under load, for tests/bench/run (section ui).

    uiperf.py streams --base URL --token T --n 100 --secs S
    uiperf.py page    --base URL --token T --driver URL --search TEXT [--runs 5]

`streams` logs in once (POST /ui/login) and holds N live pages' streams
open (GET /ui/stream with the session cookie, as each open machines list
does) for S seconds, reading everything they are sent; it prints one JSON
object: streams opened, still open at the end, SSE messages and bytes
received in all, and the fewest messages one stream got (0 would mean a
page that was not live).

`page` drives headless Chromium over WebDriver (chromedriver at --driver;
the protocol is plain JSON over HTTP, so urllib does): logs in with the
token, then loads the machines page --runs times and reads the browser's
own timings (the Paint Timing API's first-contentful-paint, and the
navigation's responseEnd and load end), and then types --search into the
search box and submits it, the time from the submit to the filtered
result's first paint and its row count. Prints one JSON object (medians
over the runs, and every run).
"""
import argparse
import json
import selectors
import socket
import statistics
import sys
import time
import urllib.parse
import urllib.request


def login(base, token):
    """The session cookie for the admin token (the login form's POST)."""
    body = urllib.parse.urlencode({"token": token}).encode()

    class NoRedirect(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, *a, **k):
            return None

    opener = urllib.request.build_opener(NoRedirect)
    try:
        r = opener.open(urllib.request.Request(base + "/ui/login", data=body), timeout=10)
        headers = r.headers
    except urllib.error.HTTPError as e:  # the 303 to /ui/
        headers = e.headers
    cookie = headers.get("Set-Cookie", "")
    if "tinkerbox_session=" not in cookie:
        sys.exit(f"login refused: {cookie!r}")
    return cookie.split(";", 1)[0]


def streams(a):
    u = urllib.parse.urlsplit(a.base)
    host, port = u.hostname, u.port or 80
    cookie = login(a.base, a.token)
    sel = selectors.DefaultSelector()
    got = {}
    for i in range(a.n):
        s = socket.create_connection((host, port), timeout=10)
        s.sendall((f"GET /ui/stream HTTP/1.1\r\nHost: {host}:{port}\r\nAccept: text/event-stream\r\n"
                   f"Cookie: {cookie}\r\n\r\n").encode())
        s.setblocking(False)
        sel.register(s, selectors.EVENT_READ, i)
        got[i] = [0, 0, b"", True]  # messages, bytes, partial line, open
    deadline = time.monotonic() + a.secs
    while time.monotonic() < deadline:
        for key, _ in sel.select(timeout=min(0.5, max(0.0, deadline - time.monotonic()))):
            g = got[key.data]
            try:
                data = key.fileobj.recv(1 << 16)
            except BlockingIOError:
                continue
            except OSError:
                data = b""
            if not data:
                g[3] = False
                sel.unregister(key.fileobj)
                key.fileobj.close()
                continue
            g[1] += len(data)
            buf = g[2] + data
            lines = buf.split(b"\n")
            g[2] = lines.pop()
            g[0] += sum(1 for line in lines if line.startswith(b"data:"))
    for key in list(sel.get_map().values()):
        key.fileobj.close()
    print(json.dumps({
        "streams": a.n,
        "open_at_end": sum(1 for g in got.values() if g[3]),
        "messages": sum(g[0] for g in got.values()),
        "bytes": sum(g[1] for g in got.values()),
        "fewest_messages": min((g[0] for g in got.values()), default=0),
        "secs": a.secs,
    }))


class WebDriver:
    """Just enough of the W3C WebDriver protocol (its JSON over HTTP)."""

    def __init__(self, url):
        self.url = url.rstrip("/")
        caps = {"capabilities": {"alwaysMatch": {"goog:chromeOptions": {
            "binary": "/usr/bin/chromium",
            "args": ["--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                     "--window-size=1360,900"]}}}}
        self.session = self.call("POST", "/session", caps)["sessionId"]

    def call(self, method, path, body=None):
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.url + path, data=data, method=method,
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=120) as r:
            return json.load(r)["value"]

    def s(self, method, path, body=None):
        return self.call(method, f"/session/{self.session}{path}", body)

    def go(self, url):
        self.s("POST", "/url", {"url": url})

    def js(self, script):
        return self.s("POST", "/execute/sync", {"script": script, "args": []})

    def until(self, script, secs=60):
        deadline = time.monotonic() + secs
        while time.monotonic() < deadline:
            if self.js(script) is True:
                return
            time.sleep(0.02)
        sys.exit(f"never true: {script}")

    def quit(self):
        try:
            self.s("DELETE", "")
        except OSError:
            pass


# Loaded and painted (the paint entry can come after the load event).
LOADED = ("document.readyState === 'complete' && "
          "performance.getEntriesByType('navigation')[0].loadEventEnd > 0 && "
          "performance.getEntriesByName('first-contentful-paint').length > 0")

# The page's own timings of its last navigation, in ms from its start.
TIMINGS = """
const n = performance.getEntriesByType('navigation')[0];
const p = performance.getEntriesByName('first-contentful-paint')[0];
return {fcp: p ? p.startTime : null, response_end: n.responseEnd,
        load_end: n.loadEventEnd, bytes: n.transferSize,
        rows: document.querySelectorAll('#machines tbody tr').length};
"""


def page(a):
    d = WebDriver(a.driver)
    try:
        d.go(a.base + "/ui/login")
        d.js(f"document.getElementById('token').value = {json.dumps(a.token)};"
             " document.querySelector('form').submit();")
        d.until("return location.pathname === '/ui/' && document.readyState === 'complete';")
        runs, filtered = [], []
        for _ in range(a.runs):
            d.go(a.base + "/ui/")
            d.until("return " + LOADED + ";")
            runs.append(d.js(TIMINGS))
            # The search as a person does it: type, press Enter (the form's
            # GET); the result page's timings start at the submit.
            d.js(f"const q = document.querySelector('input[name=q]'); q.value = {json.dumps(a.search)};"
                 " q.form.requestSubmit();")
            d.until("return location.search.includes('q=') && " + LOADED + ";")
            filtered.append(d.js(TIMINGS))
    finally:
        d.quit()

    def med(rows, k):
        v = [r[k] for r in rows if r.get(k) is not None]
        return round(statistics.median(v), 1) if v else None

    print(json.dumps({
        "runs": a.runs,
        "list_fcp_ms": med(runs, "fcp"), "list_response_ms": med(runs, "response_end"),
        "list_load_ms": med(runs, "load_end"), "list_rows": runs[0]["rows"], "list_bytes": runs[0]["bytes"],
        "filter_fcp_ms": med(filtered, "fcp"), "filter_load_ms": med(filtered, "load_end"),
        "filter_rows": filtered[0]["rows"],
        "list": runs, "filtered": filtered,
    }))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["streams", "page"])
    ap.add_argument("--base", required=True, help="the admin listener, http://HOST:PORT")
    ap.add_argument("--token", required=True)
    ap.add_argument("--n", type=int, default=100)
    ap.add_argument("--secs", type=float, default=10)
    ap.add_argument("--driver", help="chromedriver's URL")
    ap.add_argument("--search", default="")
    ap.add_argument("--runs", type=int, default=5)
    a = ap.parse_args()
    streams(a) if a.mode == "streams" else page(a)


if __name__ == "__main__":
    main()
