#!/usr/bin/env python3
"""The discovery rate tinkerbox sustains, for tests/bench/run: AGENTS machines
nobody entered each ask once for work (GetAction with tink-agent's
attributes, a distinct MAC as the agent id), from THREADS at once, through a
gRPC client generated from the upstream .proto files (tests/tink/grpc-venv).
Each first GetAction makes Hardware discovery-<mac>; the answer is NotFound
(no Workflow, enrollment off). Prints one JSON object: agents, seconds,
discovered per second, the codes answered, and the call latency p50/p99/max.

    discover.py --stubs DIR --addr HOST:PORT --agents N [--threads 8]

Every call has a 10 s deadline; the run is bounded by N calls.
"""
import argparse
import json
import statistics
import sys
import threading
import time


def pct(v, p):
    if not v:
        return None
    v = sorted(v)
    return round(v[min(len(v) - 1, int(len(v) * p / 100))], 2)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--stubs", required=True)
    ap.add_argument("--addr", required=True)
    ap.add_argument("--agents", type=int, required=True)
    ap.add_argument("--threads", type=int, default=8)
    a = ap.parse_args()
    sys.path.insert(0, f"{a.stubs}/agent")
    import grpc
    import get_action_request_pb2 as req_pb
    import workflow_service_pb2_grpc as svc

    lat, codes, lock = [], {}, threading.Lock()
    ids = [f"0a:{i >> 24 & 255:02x}:{i >> 16 & 255:02x}:{i >> 8 & 255:02x}:{i & 255:02x}:01" for i in range(a.agents)]

    def run(chunk):
        stub = svc.WorkflowServiceStub(grpc.insecure_channel(a.addr))
        for agent in chunk:
            attrs = req_pb.AgentAttributes(
                cpu=req_pb.CPU(total_cores=8, total_threads=16),
                memory=req_pb.Memory(total="32GB", usable="31GB"),
                block=[req_pb.Block(name="nvme0n1", drive_type="SSD", size="477GB")],
                network=[req_pb.Network(name="eth0", mac=agent, speed="10000Mb/s")],
                product=req_pb.Product(name="NUC13ANHi7", vendor="Intel Corporation"),
            )
            t0 = time.perf_counter()
            try:
                stub.GetAction(req_pb.ActionRequest(agent_id=agent, agent_attributes=attrs), timeout=10)
                c = "OK"
            except grpc.RpcError as e:
                c = e.code().name
            ms = (time.perf_counter() - t0) * 1000
            with lock:
                lat.append(ms)
                codes[c] = codes.get(c, 0) + 1

    chunks = [ids[i::a.threads] for i in range(a.threads)]
    threads = [threading.Thread(target=run, args=(c,)) for c in chunks]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    secs = time.perf_counter() - t0
    print(json.dumps({"agents": a.agents, "threads": a.threads, "seconds": round(secs, 2),
                      "per_s": round(a.agents / secs, 1), "codes": codes,
                      "lat_ms": {"p50": pct(lat, 50), "p99": pct(lat, 99), "max": round(max(lat), 2) if lat else None,
                                 "mean": round(statistics.mean(lat), 2) if lat else None}}))


if __name__ == "__main__":
    main()
