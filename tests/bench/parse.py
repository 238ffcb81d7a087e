#!/usr/bin/env python3
"""Small helpers of tests/bench/run.

    parse.py wrk < WRK_OUTPUT            wrk --latency's report as JSON (rps, latency percentiles in ms)
    parse.py download URL N BYTES        N parallel curl downloads of URL; JSON: seconds, MB/s, failures
"""
import json
import re
import subprocess
import sys
import time

UNITS = {"us": 0.001, "ms": 1.0, "s": 1000.0, "m": 60000.0}


def ms(v):
    m = re.fullmatch(r"([\d.]+)(us|ms|s|m)", v)
    return round(float(m.group(1)) * UNITS[m.group(2)], 3) if m else None


def wrk(text):
    d = {"rps": None, "requests": None, "errors": 0}
    m = re.search(r"Requests/sec:\s+([\d.]+)", text)
    if m:
        d["rps"] = float(m.group(1))
    m = re.search(r"(\d+) requests in ([\d.]+\w+)", text)
    if m:
        d["requests"] = int(m.group(1))
    m = re.search(r"Latency\s+(\S+)\s+(\S+)\s+(\S+)", text)
    if m:
        d["avg_ms"], d["stdev_ms"], d["max_ms"] = ms(m.group(1)), ms(m.group(2)), ms(m.group(3))
    for p in ("50", "75", "90", "99"):
        m = re.search(rf"^\s+{p}%\s+(\S+)", text, re.M)
        if m:
            d[f"p{p}_ms"] = ms(m.group(1))
    m = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", text)
    if m:
        d["errors"] += sum(int(x) for x in m.groups())
    m = re.search(r"Non-2xx or 3xx responses: (\d+)", text)
    if m:
        d["errors"] += int(m.group(1))
    return d


def download(url, n, size):
    t0 = time.monotonic()
    ps = [subprocess.Popen(["curl", "-s", "-o", "/dev/null", "-m", "300", "-w", "%{http_code} %{size_download}", url],
                           stdout=subprocess.PIPE, text=True) for _ in range(n)]
    ok = 0
    for p in ps:
        out, _ = p.communicate()
        parts = out.split()
        if p.returncode == 0 and len(parts) == 2 and parts[0] == "200" and int(parts[1]) == size:
            ok += 1
    secs = time.monotonic() - t0
    return {"n": n, "bytes": n * size, "seconds": round(secs, 3),
            "mb_per_s": round(ok * size / secs / 1e6, 1), "failed": n - ok}


def main():
    cmd = sys.argv[1]
    if cmd == "wrk":
        print(json.dumps(wrk(sys.stdin.read())))
    elif cmd == "download":
        print(json.dumps(download(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))))
    else:
        sys.exit(f"unknown command {cmd}")


if __name__ == "__main__":
    main()
