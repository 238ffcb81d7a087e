#!/usr/bin/env python3
"""TFTP boot storm: N clients at once read one file (RFC 1350, with the
blksize (RFC 2348), tsize (2349) and windowsize (7440) options), for
tests/bench/run. The same client for every server, so that only the server
differs.

    tftpstorm.py --server IP[:PORT] --file NAME --size BYTES --clients N
                 [--blksize 512] [--windowsize 1] [--procs 2] [--timeout 1] [--deadline 120]

Prints one JSON object: seconds (first request to last byte), MB/s (all
bytes received by completed transfers / seconds), ok, failed, retransmitted
ACKs, whether the server accepted the options, and the clients' CPU seconds.
A transfer fails when the server is silent for `timeout` seconds 5 times in
a row, sends an ERROR, or the size read differs from BYTES.
A server without windowsize ignores the option (no OACK entry): the client
then ACKs every block, as RFC 7440 says.
"""
import argparse
import json
import multiprocessing as mp
import os
import selectors
import socket
import struct
import time

RRQ, DATA, ACK, ERROR, OACK = 1, 3, 4, 5, 6


class Client:
    def __init__(self, a, sel, server):
        self.a = a
        self.server = server
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
        self.sock.setblocking(False)
        self.sel = sel
        self.peer = None
        self.blksize = 512
        self.window = 1
        self.expect = 1  # next block number wanted (counts past 65535)
        self.got = 0
        self.in_window = 0
        self.done = False
        self.ok = False
        self.err = None
        self.retries = 0
        self.rexmit = 0
        self.oack = None
        self.last = None  # last packet sent (for retransmission)
        self.deadline = 0.0

    def start(self, now):
        opts = [b"octet"]
        if self.a.blksize != 512:
            opts += [b"blksize", str(self.a.blksize).encode()]
        opts += [b"tsize", b"0"]
        if self.a.windowsize > 1:
            opts += [b"windowsize", str(self.a.windowsize).encode()]
        pkt = struct.pack("!H", RRQ) + self.a.file.encode() + b"\0" + b"\0".join(opts) + b"\0"
        self.send(pkt, self.server, now)
        self.sel.register(self.sock, selectors.EVENT_READ, self)

    def send(self, pkt, to, now):
        self.last = (pkt, to)
        self.deadline = now + self.a.timeout
        try:
            self.sock.sendto(pkt, to)
        except BlockingIOError:
            pass

    def ack(self, block, now):
        self.send(struct.pack("!HH", ACK, block & 0xFFFF), self.peer, now)

    def finish(self, ok, err=None):
        self.done, self.ok, self.err = True, ok, err
        self.sel.unregister(self.sock)
        self.sock.close()

    def on_timeout(self, now):
        self.retries += 1
        if self.retries > 5:
            self.finish(False, "timeout")
            return
        self.rexmit += 1
        pkt, to = self.last
        self.send(pkt, to, now)
        self.in_window = 0

    def on_packet(self, data, src, now):
        if self.peer is None:
            self.peer = src
        elif src != self.peer:
            return
        if len(data) < 4:
            return
        op, num = struct.unpack_from("!HH", data)
        if op == ERROR:
            self.finish(False, "error: " + data[4:].split(b"\0")[0].decode(errors="replace"))
        elif op == OACK:
            parts = data[2:].split(b"\0")
            o = {parts[i].decode().lower(): parts[i + 1].decode() for i in range(0, len(parts) - 1, 2)}
            self.oack = o
            self.blksize = int(o.get("blksize", 512))
            self.window = int(o.get("windowsize", 1))
            self.retries = 0
            self.ack(0, now)
        elif op == DATA:
            if self.oack is None and self.got == 0 and self.expect == 1:
                self.oack = {}  # options refused: RFC 1350 defaults
            if num != self.expect & 0xFFFF:
                # Out of order (lost packet in a window) or a duplicate:
                # ACK the last block received in order, once per window.
                if self.window > 1 and self.in_window > 0:
                    self.in_window = 0
                    self.ack(self.expect - 1, now)
                elif self.window == 1:
                    self.ack(self.expect - 1, now)
                return
            self.retries = 0
            payload = len(data) - 4
            self.got += payload
            self.expect += 1
            self.in_window += 1
            last = payload < self.blksize
            if last or self.in_window >= self.window:
                self.in_window = 0
                self.ack(num, now)
            else:
                self.deadline = now + self.a.timeout
            if last:
                self.finish(self.got == self.a.size, None if self.got == self.a.size else f"size {self.got}")


def worker(a, n, server, start_at, q):
    sel = selectors.DefaultSelector()
    clients = [Client(a, sel, server) for _ in range(n)]
    while time.time() < start_at:
        time.sleep(0.001)
    t0 = time.monotonic()
    for c in clients:
        c.start(t0)
    hard = t0 + a.deadline
    t_end = t0
    while True:
        live = [c for c in clients if not c.done]
        if not live:
            break
        now = time.monotonic()
        if now > hard:
            for c in live:
                c.finish(False, "deadline")
            break
        events = sel.select(timeout=0.05)
        for key, _ in events:
            c = key.data
            # Drain the socket: many DATA packets may wait.
            for _ in range(64):
                if c.done:
                    break
                try:
                    data, src = c.sock.recvfrom(65536)
                except (BlockingIOError, InterruptedError):
                    break
                c.on_packet(data, src, time.monotonic())
                if c.done:
                    t_end = max(t_end, time.monotonic())
        now = time.monotonic()
        for c in clients:
            if not c.done and now > c.deadline:
                c.on_timeout(now)
    ru = os.times()
    errs = {}
    for c in clients:
        if not c.ok:
            errs[c.err] = errs.get(c.err, 0) + 1
    q.put({"t0": t0, "t_end": t_end, "ok": sum(c.ok for c in clients),
           "failed": sum(not c.ok for c in clients),
           "bytes": sum(c.got for c in clients if c.ok),
           "rexmit": sum(c.rexmit for c in clients), "errors": errs,
           "oack": next((c.oack for c in clients if c.oack is not None), None),
           "cpu": ru.user + ru.system})


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--server", required=True)
    ap.add_argument("--file", required=True)
    ap.add_argument("--size", type=int, required=True)
    ap.add_argument("--clients", type=int, default=200)
    ap.add_argument("--blksize", type=int, default=512)
    ap.add_argument("--windowsize", type=int, default=1)
    ap.add_argument("--procs", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=1.0)
    ap.add_argument("--deadline", type=float, default=120)
    a = ap.parse_args()
    host, _, port = a.server.partition(":")
    server = (host, int(port or 69))
    procs = max(1, min(a.procs, a.clients))
    q = mp.Queue()
    start_at = time.time() + 0.3
    ps = []
    for i in range(procs):
        n = a.clients // procs + (1 if i < a.clients % procs else 0)
        p = mp.Process(target=worker, args=(a, n, server, start_at, q))
        p.start()
        ps.append(p)
    res = [q.get(timeout=a.deadline + 30) for _ in ps]
    for p in ps:
        p.join()
    # CLOCK_MONOTONIC is system-wide: the workers' times compare.
    secs = max(r["t_end"] for r in res) - min(r["t0"] for r in res)
    total = sum(r["bytes"] for r in res)
    errors = {}
    for r in res:
        for k, v in r["errors"].items():
            errors[k] = errors.get(k, 0) + v
    out = {"clients": a.clients, "blksize": a.blksize, "windowsize": a.windowsize,
           "seconds": round(secs, 3), "mb_per_s": round(total / secs / 1e6, 2) if secs > 0 else None,
           "ok": sum(r["ok"] for r in res), "failed": sum(r["failed"] for r in res),
           "rexmit_acks": sum(r["rexmit"] for r in res), "errors": errors,
           "oack": next((r["oack"] for r in res if r["oack"] is not None), None),
           "client_cpu_s": round(sum(r["cpu"] for r in res), 2)}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
