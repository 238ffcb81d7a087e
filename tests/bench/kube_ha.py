#!/usr/bin/env python3
"""Two tinkerbox instances on one API server, under the status traffic of
a rack imaging at once: AGENTS simulated agents (the upstream .proto's
client, tests/tink/grpc-venv), half of them talking to the follower (which
forwards to the leader), each taking its action, reporting RUNNING, then a
progress report every second for SECONDS, then SUCCESS.

Measured: the agents' report latency; the API server requests per status
write (tinkerbox's own counters, and the API server's where it is a real
one); whether the Lease was renewed on time throughout (the leader's
longest gap between two renewals, and failed renewals); every Workflow
SUCCESS in the cluster at the end.

  kube_ha.py --bin TINKERBOX --grpc-venv 'PYTHON STUBS' --kmock-python PY
             [--agents 50] [--seconds 60]

The API server is a real kube-apiserver when KUBEBUILDER_ASSETS (default
/usr/local/kubebuilder/bin) has one, with etcd, as envtest starts them;
else kmock (tests/kube/kmock-server), said in the output. Loopback only;
every process is stopped by PID and the temporary directory removed, also
on failure. Prints one JSON object.
"""
import argparse
import json
import os
import random
import shutil
import signal
import ssl
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
from kube import pct, port, wait  # noqa: E402  (the kube bench's helpers)


def http_get(url, token=None, timeout=5):
    req = urllib.request.Request(url)
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    try:
        with urllib.request.urlopen(req, timeout=timeout, context=ctx) as r:
            return r.status, r.read().decode(errors="replace")
    except Exception:
        return 0, ""


def prom(text, name, labels=None):
    """The sum of a Prometheus text family's samples whose labels include `labels`."""
    total = 0.0
    for line in text.splitlines():
        if not line.startswith(name):
            continue
        rest = line[len(name):]
        if rest and rest[0] not in "{ ":
            continue
        if labels and not all(f'{k}="{v}"' in rest for k, v in labels.items()):
            continue
        try:
            total += float(line.rsplit(" ", 1)[1])
        except ValueError:
            pass
    return total


class Bench:
    def __init__(self, a):
        self.a = a
        self.work = tempfile.mkdtemp(prefix="tinkerbox-kube-ha.")
        self.procs = []
        self.token = None
        self.server = "kmock"
        self.api = None

    def spawn(self, args, log, pipe=False):
        """Start a process, its output in `log` (stdout piped when `pipe`)."""
        with open(log, "w") as f:
            p = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE if pipe else f,
                                 stderr=f if pipe else subprocess.STDOUT, text=True)
        self.procs.append(p)
        return p

    def stop_all(self):
        for p in reversed(self.procs):
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
                try:
                    p.wait(20)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
        shutil.rmtree(self.work, ignore_errors=True)

    def kubectl(self, *args, stdin=None):
        r = subprocess.run(["kubectl", "--kubeconfig", self.kubeconfig, *args], input=stdin,
                           capture_output=True, text=True, timeout=120)
        if r.returncode != 0:
            raise SystemExit(f"kubectl {' '.join(args)}: {r.stderr.strip()[:400]}")
        return r.stdout

    def start_api(self):
        assets = os.environ.get("KUBEBUILDER_ASSETS", "/usr/local/kubebuilder/bin")
        apiserver = os.path.join(assets, "kube-apiserver")
        etcd = next((e for e in (os.path.join(assets, "etcd"), "/usr/bin/etcd") if os.path.exists(e)), None)
        self.kubeconfig = os.path.join(self.work, "kubeconfig")
        if os.path.exists(apiserver) and etcd:
            client, peer, secure = port(), port(), port()
            self.spawn([etcd, "--name", "default", "--data-dir", os.path.join(self.work, "etcd"),
                        f"--listen-client-urls=http://127.0.0.1:{client}",
                        f"--advertise-client-urls=http://127.0.0.1:{client}",
                        f"--listen-peer-urls=http://127.0.0.1:{peer}",
                        f"--initial-advertise-peer-urls=http://127.0.0.1:{peer}",
                        f"--initial-cluster=default=http://127.0.0.1:{peer}"], os.path.join(self.work, "etcd.log"))
            key = os.path.join(self.work, "sa.key")
            subprocess.run(["openssl", "genrsa", "-out", key, "2048"], check=True, capture_output=True)
            self.token = f"tb-{random.getrandbits(32)}"
            with open(os.path.join(self.work, "tokens.csv"), "w") as f:
                f.write(f"{self.token},admin,admin,system:masters\n")
            self.spawn([apiserver, f"--etcd-servers=http://127.0.0.1:{client}",
                        f"--cert-dir={self.work}/certs", f"--secure-port={secure}",
                        "--bind-address=127.0.0.1", "--advertise-address=127.0.0.1",
                        "--service-cluster-ip-range=10.0.0.0/24", "--allow-privileged=true",
                        "--service-account-issuer=https://kubernetes.default.svc",
                        f"--service-account-key-file={key}", f"--service-account-signing-key-file={key}",
                        f"--token-auth-file={self.work}/tokens.csv", "--authorization-mode=RBAC",
                        "--disable-admission-plugins=ServiceAccount"], os.path.join(self.work, "apiserver.log"))
            self.api = f"https://127.0.0.1:{secure}"
            with open(self.kubeconfig, "w") as f:
                f.write(f"apiVersion: v1\nkind: Config\nclusters:\n- name: b\n  cluster: {{server: \"{self.api}\", "
                        f"insecure-skip-tls-verify: true}}\nusers:\n- name: b\n  user: {{token: {self.token}}}\n"
                        "contexts:\n- name: b\n  context: {cluster: b, user: b, namespace: default}\n"
                        "current-context: b\n")
            wait("kube-apiserver ready", 90, lambda: http_get(f"{self.api}/readyz", self.token)[0] == 200, 0.25)
            self.kubectl("apply", "--server-side", "-f", os.path.join(REPO, "daemon/crds"))
            self.kubectl("wait", "--for=condition=Established", "crd", "--all", "--timeout=60s")
            v = json.loads(self.kubectl("version", "-o", "json"))
            self.server = f"kube-apiserver {v.get('serverVersion', {}).get('gitVersion', '?')}"
        else:
            kport = port()
            km = self.spawn([self.a.kmock_python, os.path.join(REPO, "tests/kube/kmock-server"), "--port", str(kport)],
                            os.path.join(self.work, "kmock.log"), pipe=True)
            line = km.stdout.readline()
            if not line.startswith("READY"):
                raise SystemExit(f"kmock-server said {line!r}")
            self.api = f"http://127.0.0.1:{kport}"
            with open(self.kubeconfig, "w") as f:
                f.write(f"apiVersion: v1\nkind: Config\nclusters:\n- name: b\n  cluster: {{server: \"{self.api}\"}}\n"
                        "users:\n- name: b\n  user: {}\ncontexts:\n- name: b\n  context: {cluster: b, user: b, "
                        "namespace: default}\ncurrent-context: b\n")

    def start_tinkerbox(self, name):
        http = f"127.0.0.1:{port()}"
        tink = f"127.0.0.1:{port()}"
        cfg = os.path.join(self.work, f"{name}.toml")
        with open(cfg, "w") as f:
            f.write(f'public_ip = "127.0.0.1"\nstate_dir = "{self.work}/{name}"\n[dhcp]\nmode = "off"\n'
                    f'[tftp]\nenabled = false\n[syslog]\nenabled = false\n[http]\nlisten = "{http}"\n'
                    f'[api]\nlisten = "127.0.0.1:{port()}"\n[tink]\nlisten = "{tink}"\n'
                    f'[kube]\nenabled = true\nkubeconfig = "{self.kubeconfig}"\nnamespace = "default"\n')
        p = self.spawn([self.a.bin, "--config", cfg, "serve"], os.path.join(self.work, f"{name}.log"))
        return {"name": name, "proc": p, "http": http, "tink": tink}

    def healthz(self, t):
        return http_get(f"http://{t['http']}/healthz")[1]

    def metrics(self, t):
        return http_get(f"http://{t['http']}/metrics")[1]

    def apiserver_metrics(self):
        if self.token is None:
            return None
        return http_get(f"{self.api}/metrics", self.token, timeout=20)[1]


def mac(i):
    return "02:00:00:6b:%02x:%02x" % (i >> 8 & 255, i & 255)


def objects(n):
    docs = ["apiVersion: tinkerbell.org/v1alpha1\nkind: Template\nmetadata: {name: bench, namespace: default}\n"
            "spec:\n  data: |\n    name: bench\n    tasks:\n"
            "    - {name: a, worker: \"{{.device_1}}\", actions: [{name: work, image: bash}]}\n"]
    for i in range(n):
        docs.append(
            f"apiVersion: tinkerbell.org/v1alpha1\nkind: Hardware\nmetadata: {{name: m{i}, namespace: default}}\n"
            f"spec:\n  interfaces:\n  - dhcp: {{mac: \"{mac(i)}\", ip: {{address: 10.20.{i >> 8 & 255}.{i & 255}, "
            f"netmask: 255.255.0.0}}}}\n    netboot: {{allowPXE: true, allowWorkflow: true}}\n")
        docs.append(
            f"apiVersion: tinkerbell.org/v1alpha1\nkind: Workflow\nmetadata: {{name: w{i}, namespace: default}}\n"
            f"spec:\n  templateRef: bench\n  hardwareRef: m{i}\n  hardwareMap: {{device_1: \"{mac(i)}\"}}\n")
    return "---\n".join(docs)


def agent(i, addr, stubs, seconds, out, start_at):
    sys.path.insert(0, f"{stubs}/agent")
    import grpc
    import get_action_request_pb2 as req_pb
    import report_action_status_request_pb2 as rep_pb
    import workflow_service_pb2_grpc as svc
    from google.protobuf import timestamp_pb2

    stub = svc.WorkflowServiceStub(grpc.insecure_channel(addr))
    S = rep_pb.ActionStatusRequest
    lat, codes = [], {}

    def call(f, *args):
        for _ in range(200):  # Unavailable is retried, as tink-agent does
            t = time.monotonic()
            try:
                r = f(*args, timeout=10)
                lat.append((time.monotonic() - t) * 1000)
                return r
            except grpc.RpcError as e:
                codes[e.code().name] = codes.get(e.code().name, 0) + 1
                time.sleep(0.2)
        raise RuntimeError(f"agent {i}: no answer after 200 tries: {codes}")

    r = None
    for _ in range(600):
        try:
            r = stub.GetAction(req_pb.ActionRequest(agent_id=mac(i)), timeout=10)
            break
        except grpc.RpcError as e:
            codes[e.code().name] = codes.get(e.code().name, 0) + 1
            time.sleep(0.1)
    if r is None:
        raise RuntimeError(f"agent {i}: never served: {codes}")
    base = dict(workflow_id=r.workflow_id, agent_id=mac(i), task_id=r.task_id, action_id=r.action_id,
                action_name=r.name)
    zero = timestamp_pb2.Timestamp(seconds=-62135596800)
    time.sleep(max(0.0, start_at - time.monotonic()))
    call(stub.ReportActionStatus, S(action_state=S.RUNNING, execution_start=zero, execution_stop=zero,
                                    message=rep_pb.ActionMessage(message="running action"), **base))
    t0 = time.monotonic()
    k = 0
    while time.monotonic() - t0 < seconds:
        k += 1
        time.sleep(max(0.0, t0 + k - time.monotonic()) + random.random() * 0.01)
        call(stub.ReportActionStatus, S(action_state=S.RUNNING, execution_start=zero, execution_stop=zero,
                                        message=rep_pb.ActionMessage(message=f"{k * 10} MB written"), **base))
    start = timestamp_pb2.Timestamp()
    start.GetCurrentTime()
    call(stub.ReportActionStatus, S(action_state=S.SUCCESS, execution_start=start, execution_stop=start,
                                    execution_duration="60s", message=rep_pb.ActionMessage(message="done"), **base))
    out[i] = {"lat": lat, "codes": codes}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--grpc-venv", required=True, help="tests/tink/grpc-venv's output: PYTHON STUBS")
    ap.add_argument("--kmock-python", required=True)
    ap.add_argument("--agents", type=int, default=50)
    ap.add_argument("--seconds", type=int, default=60)
    ap.add_argument("--leader-only", action="store_true",
                    help="every agent talks to the leader (for a build whose followers cannot forward)")
    a = ap.parse_args()
    _, stubs = a.grpc_venv.split(" ", 1)
    b = Bench(a)
    try:
        b.start_api()
        one = b.start_tinkerbox("a")
        wait("a leads", 60, lambda: "kube: leader" in b.healthz(one))
        two = b.start_tinkerbox("b")
        wait("b follows", 60, lambda: "kube: current" in b.healthz(two) and "kube: follower" in b.healthz(two))
        leader, follower = one, two
        b.kubectl("apply", "-f", "-", stdin=objects(a.agents))

        def pending():
            out = b.kubectl("get", "workflows", "-o", "jsonpath={.items[*].status.state}")
            return out.split().count("PENDING") == a.agents
        wait("every Workflow PENDING", 120, pending, 0.5)

        m0, s0 = b.metrics(leader), b.apiserver_metrics()
        results = {}
        start_at = time.monotonic() + 5
        threads = [threading.Thread(target=agent, args=(i, (follower if i % 2 and not a.leader_only else leader)["tink"], stubs,
                                                         a.seconds, results, start_at), daemon=True)
                   for i in range(a.agents)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(a.seconds + 300)
        if len(results) != a.agents:
            raise SystemExit(f"kube_ha bench: {a.agents - len(results)} agents did not finish")

        def succeeded():
            out = b.kubectl("get", "workflows", "-o", "jsonpath={.items[*].status.state}")
            return out.split().count("SUCCESS") == a.agents
        wait("every Workflow SUCCESS in the cluster", 60, succeeded, 0.5)
        time.sleep(2)  # the last renewals and writes land in the counters
        m1, s1 = b.metrics(leader), b.apiserver_metrics()

        def d(name, labels=None):
            return prom(m1, name, labels) - prom(m0, name, labels)
        writes = d("tinkerbox_kube_status_writes_total", {"kind": "Workflow"})
        requests = d("tinkerbox_kube_requests_total", {"client": "requests"})
        lat = [x for r in results.values() for x in r["lat"]]
        codes = {}
        for r in results.values():
            for k, v in r["codes"].items():
                codes[k] = codes.get(k, 0) + v
        out = {
            "server": b.server, "agents": a.agents, "seconds": a.seconds,
            "reports": len(lat),
            "report_ms": {"p50": round(statistics.median(lat), 2), "p99": round(pct(lat, 0.99), 2),
                          "max": round(max(lat), 2)},
            "retried_codes": codes,
            "workflow_status_writes": int(writes),
            "tinkerbox_requests": int(requests),
            "requests_per_status_write": round(requests / writes, 3) if writes else None,
            "lease": {"renewals_ok": int(prom(m1, "tinkerbox_kube_lease_renewals_total", {"result": "ok"})),
                      "renewals_failed": int(prom(m1, "tinkerbox_kube_lease_renewals_total", {"result": "failed"})),
                      "longest_gap_s": round(prom(m1, "tinkerbox_kube_lease_longest_gap_seconds"), 3)},
            "succeeded": a.agents,
        }
        if s0 is not None and s1 is not None:
            def sd(labels):
                return int(prom(s1, "apiserver_request_total", labels) - prom(s0, "apiserver_request_total", labels))
            wf = {"resource": "workflows"}
            out["apiserver_workflow_requests"] = {
                "GET": sd(dict(wf, verb="GET")), "PATCH": sd(dict(wf, verb="PATCH")),
                "APPLY": sd(dict(wf, verb="APPLY")), "PUT": sd(dict(wf, verb="PUT")),
            }
            out["apiserver_lease_requests"] = sd({"resource": "leases"})
        print(json.dumps(out))
    finally:
        b.stop_all()


if __name__ == "__main__":
    main()
