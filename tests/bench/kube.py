#!/usr/bin/env python3
"""Kubernetes mode figures: how long tinkerbox takes to mirror N Hardware
from an API server (a cold store, then a warm one), its RSS with them, and
how soon a change made in the cluster is served (change to served, over
CHANGES changes, one at a time: p50, p99, max).

  kube.py --bin TINKERBOX --python KMOCK_PYTHON [--n 10000] [--changes 1000]

The API server is kmock (tests/kube/kmock-server, a Python fake) because no
kube-apiserver can be had on the machines this was built on: its own cost
(a single-threaded Python server) is in every figure, so they are upper
bounds for tinkerbox's part. "Served" means tinkerbox's iPXE script URL for
the new MAC answers 200, read over HTTP as a booting machine reads it.
Prints one JSON object. Loopback only; every process is stopped by PID and
the temporary directory removed, also on failure.
"""
import argparse
import http.client
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
PATH = "/apis/tinkerbell.org/v1alpha1/namespaces/default/hardware"


def port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def mac(i, gen=0):
    return "02:%02x:%02x:%02x:%02x:%02x" % (gen, i >> 24 & 255, i >> 16 & 255, i >> 8 & 255, i & 255)


def hardware(i, gen=0):
    return {"apiVersion": "tinkerbell.org/v1alpha1", "kind": "Hardware",
            "metadata": {"name": f"m{i}", "namespace": "default"},
            "spec": {"interfaces": [{"dhcp": {"mac": mac(i, gen), "hostname": f"m{i}",
                                              "ip": {"address": "10.%d.%d.%d" % (i >> 16 & 255, i >> 8 & 255, i & 255),
                                                     "netmask": "255.0.0.0", "gateway": "10.0.0.1"}},
                                     "netboot": {"allowPXE": True, "allowWorkflow": True}}],
                     "metadata": {"instance": {"id": f"m{i}", "hostname": f"m{i}"}}}}


def request(conn, method, path, body=None, ctype="application/json"):
    headers = {"Content-Type": ctype} if body is not None else {}
    conn.request(method, path, body=json.dumps(body) if body is not None else None, headers=headers)
    r = conn.getresponse()
    data = r.read()
    return r.status, data


def wait(what, secs, f, interval=0.005):
    deadline = time.monotonic() + secs
    while time.monotonic() < deadline:
        if f():
            return
        time.sleep(interval)
    raise SystemExit(f"kube bench: {what}: not within {secs}s")


def get_status(host, path):
    try:
        c = http.client.HTTPConnection(host, timeout=5)
        st, body = request(c, "GET", path)
        c.close()
        return st, body.decode(errors="replace")
    except OSError:
        return 0, ""


def rss_mib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return round(int(line.split()[1]) / 1024, 1)
    return None


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--python", required=True, help="the kmock venv's python (tests/kube/kmock-venv)")
    ap.add_argument("--n", type=int, default=10000)
    ap.add_argument("--changes", type=int, default=1000)
    a = ap.parse_args()
    work = tempfile.mkdtemp(prefix="tinkerbox-kube-bench.")
    procs = []

    def stop(p, sig=signal.SIGTERM, secs=20):
        if p.poll() is None:
            p.send_signal(sig)
            try:
                p.wait(secs)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()

    try:
        kport = port()
        km = subprocess.Popen([a.python, os.path.join(REPO, "tests/kube/kmock-server"), "--port", str(kport)],
                              stdout=subprocess.PIPE, stderr=open(os.path.join(work, "kmock.log"), "w"), text=True)
        procs.append(km)
        line = km.stdout.readline()
        if not line.startswith("READY"):
            raise SystemExit(f"kmock-server said {line!r}")
        api = f"127.0.0.1:{kport}"

        # The cluster's Hardware, created as a client would, 16 at a time.
        t0 = time.monotonic()

        def create(chunk):
            c = http.client.HTTPConnection(api, timeout=30)
            for i in chunk:
                st, body = request(c, "POST", PATH, hardware(i))
                if st not in (200, 201):
                    raise SystemExit(f"create m{i}: {st} {body[:200]!r}")
            c.close()
        chunks = [range(k, a.n, 16) for k in range(16)]
        with ThreadPoolExecutor(16) as ex:
            list(ex.map(create, chunks))
        created_s = time.monotonic() - t0

        http_addr = f"127.0.0.1:{port()}"
        kubeconfig = os.path.join(work, "kubeconfig")
        with open(kubeconfig, "w") as f:
            f.write(f"apiVersion: v1\nkind: Config\nclusters:\n- name: b\n  cluster: {{server: \"http://{api}\"}}\n"
                    "users:\n- name: b\n  user: {}\ncontexts:\n- name: b\n  context: {cluster: b, user: b}\n"
                    "current-context: b\n")
        cfg = os.path.join(work, "t.toml")
        with open(cfg, "w") as f:
            f.write(f'public_ip = "127.0.0.1"\nstate_dir = "{work}/state"\n[dhcp]\nmode = "off"\n[tftp]\nenabled = false\n'
                    f'[syslog]\nenabled = false\n[http]\nlisten = "{http_addr}"\n[api]\nlisten = "127.0.0.1:{port()}"\n'
                    f'[tink]\nlisten = "127.0.0.1:{port()}"\n'
                    f'[kube]\nenabled = true\nkubeconfig = "{kubeconfig}"\nnamespace = "default"\ntink = "external"\n'
                    f'rufio = "external"\n')
        last = f"/ipxe/script/{mac(a.n - 1)}/auto.ipxe"

        def start():
            t = time.monotonic()
            p = subprocess.Popen([a.bin, "--config", cfg, "serve"], stdout=subprocess.DEVNULL,
                                 stderr=open(os.path.join(work, "tinkerbox.log"), "a"))
            procs.append(p)
            wait("the mirror current", 600,
                 lambda: "kube: current" in get_status(http_addr, "/healthz")[1]
                 and get_status(http_addr, last)[0] == 200)
            return p, time.monotonic() - t

        tb, cold_s = start()
        time.sleep(1)
        rss = rss_mib(tb.pid)
        stop(tb)
        tb, warm_s = start()

        # Change to served: each change a new MAC for one Hardware.
        lat = []
        c = http.client.HTTPConnection(api, timeout=30)
        s = http.client.HTTPConnection(http_addr, timeout=5)
        for k in range(a.changes):
            i = (k * 7919) % a.n
            new = mac(i, 1 + k // max(a.n, 1))
            body = {"spec": hardware(i, 1 + k // max(a.n, 1))["spec"]}
            t = time.monotonic()
            st, resp = request(c, "PATCH", f"{PATH}/m{i}", body, "application/merge-patch+json")
            if st != 200:
                raise SystemExit(f"patch m{i}: {st} {resp[:200]!r}")
            deadline = t + 10
            while True:
                st, _ = request(s, "GET", f"/ipxe/script/{new}/auto.ipxe")
                if st == 200:
                    break
                if time.monotonic() > deadline:
                    raise SystemExit(f"change {k} (m{i} -> {new}) not served within 10 s")
                time.sleep(0.0005)
            lat.append((time.monotonic() - t) * 1000)
        stop(tb)
        print(json.dumps({
            "n": a.n, "created_s": round(created_s, 2), "cold_sync_s": round(cold_s, 2),
            "warm_sync_s": round(warm_s, 2), "rss_mib": rss, "changes": len(lat),
            "change_ms": {"p50": round(statistics.median(lat), 2), "p99": round(pct(lat, 0.99), 2),
                          "max": round(max(lat), 2)},
        }))
    finally:
        for p in reversed(procs):
            stop(p)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
