#!/usr/bin/env python3
"""A light DHCP load generator, for dhcpload.py: the direct (broadcast) path,
or the relay path at less CPU than perfdhcp.

    dhcpdirect.py --iface IF --macs FILE --rate R --secs S [--pxe] [--wait MS]
    dhcpdirect.py --relay GIADDR --server IP --macs FILE --rate R --secs S [--pxe] [--wait MS]

perfdhcp (v4) always acts as a relay (giaddr set, replies unicast to port
67), so the path a client on the server's own segment takes - a broadcast
DISCOVER with giaddr 0 and the broadcast flag, answered by broadcast to port
68 - needs a generator of its own. This one does full DORA exchanges at a
fixed rate, each for a MAC drawn at random from the list (as perfdhcp -M
does: the order decides how many of the server's pages a burst touches), and prints
its report in perfdhcp's format (the counters and `-x t` timestamps that
dhcpload.parse reads), so every server is measured the same way on it.

Run it in the client namespace, as root (port 68, SO_BINDTODEVICE). Several
may run at once with distinct MAC lists: every one receives each broadcast
reply and keeps those with its own transaction ids.

With --relay it acts as perfdhcp -l does: a relay agent at GIADDR (hops 1,
no broadcast flag) sending to the server's port 67 and taking the replies on
GIADDR:67. perfdhcp needs about 1.5 of this machine's 2 cores for 10k DORA/s,
so on the relay path it measures itself; this costs about half as much, and
every server is measured with it the same way.
"""
import argparse
import os
import random
import select
import socket
import struct
import sys
import time

MAGIC = b"\x63\x82\x53\x63"
# PXE client of x86-64 UEFI, as dhcpload.PXE_OPTS gives perfdhcp.
PXE = bytes([93, 2, 0, 7, 60, 32]) + b"PXEClient:Arch:00007:UNDI:003016"


def packet(kind, xid, mac, pxe, requested=None, server_id=None, giaddr=None):
    """A BOOTREQUEST, ciaddr 0: from a relay at giaddr (hops 1), or else with
    the broadcast flag and giaddr 0."""
    hops, flags = (1, 0) if giaddr else (0, 0x8000)
    head = struct.pack("!BBBBIHH4s4s4s4s16s64s128s", 1, 1, 6, hops, xid, 0, flags,
                       b"\0" * 4, b"\0" * 4, b"\0" * 4, giaddr or b"\0" * 4,
                       mac + b"\0" * 10, b"", b"")
    opts = bytes([53, 1, kind])
    if requested:
        opts += bytes([50, 4]) + requested
    if server_id:
        opts += bytes([54, 4]) + server_id
    if pxe:
        opts += PXE
    return head + MAGIC + opts + b"\xff"


def options(data):
    """Option code -> value of a reply (no overload handling: not needed)."""
    out, i = {}, 240
    while i < len(data):
        code = data[i]
        if code == 255:
            break
        if code == 0:
            i += 1
            continue
        if i + 1 >= len(data):
            break
        n = data[i + 1]
        out[code] = data[i + 2:i + 2 + n]
        i += 2 + n
    return out


def main():
    ap = argparse.ArgumentParser()
    where = ap.add_mutually_exclusive_group(required=True)
    where.add_argument("--iface")
    where.add_argument("--relay", metavar="GIADDR")
    ap.add_argument("--server", help="with --relay")
    ap.add_argument("--macs", required=True)
    ap.add_argument("--rate", type=float, required=True)
    ap.add_argument("--secs", type=float, required=True)
    ap.add_argument("--pxe", action="store_true")
    # An exchange not finished this long after its DISCOVER is lost.
    ap.add_argument("--wait", type=float, default=2000, help="ms")
    a = ap.parse_args()
    with open(a.macs) as f:
        macs = [bytes.fromhex(line.strip().replace(":", "")) for line in f if line.strip()]
    if not macs:
        sys.exit("no MACs")
    if a.relay and not a.server:
        sys.exit("--relay needs --server")
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
    if a.relay:
        giaddr = socket.inet_aton(a.relay)
        s.bind((a.relay, 67))
        dest = (a.server, 67)
    else:
        giaddr = None
        s.setsockopt(socket.SOL_SOCKET, socket.SO_BROADCAST, 1)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_BINDTODEVICE, a.iface.encode())
        s.bind(("0.0.0.0", 68))
        dest = ("255.255.255.255", 67)
    s.setblocking(False)
    # Transaction ids: this process's own range, so that generators side by
    # side (each sees every broadcast) tell their replies apart.
    xid_base = (os.getpid() & 0xFFFF) << 16
    pick = random.Random(os.getpid()).choice
    pending = {}  # xid -> [stage, sent_at]; stage 1 = DISCOVER out, 2 = REQUEST out
    stamps = []  # (sent, received) of every OFFER and ACK, as perfdhcp -x t
    sent_d = sent_r = got_o = got_a = 0
    total = int(a.rate * a.secs)
    wait = a.wait / 1000.0
    t0 = time.monotonic()
    end = t0 + a.secs + wait
    i = 0
    next_sweep = t0
    while True:
        now = time.monotonic()
        # Send what is due (bounded: at most the whole run's DISCOVERs).
        while i < total and t0 + i / a.rate <= now:
            xid = (xid_base + i) & 0xFFFFFFFF
            try:
                s.sendto(packet(1, xid, pick(macs), a.pxe, giaddr=giaddr), dest)
                pending[xid] = [1, time.monotonic()]
                sent_d += 1
            except BlockingIOError:
                pass
            i += 1
        # Forget exchanges that ran out of time (counted as lost), at most
        # ten times a second: a scan of everything pending.
        if now >= next_sweep:
            next_sweep = now + 0.1
            for x in [x for x, p in pending.items() if p[1] < now - wait]:
                del pending[x]
        if now >= end or (i >= total and not pending):
            break
        nxt = t0 + i / a.rate if i < total else end
        r, _, _ = select.select([s], [], [], max(0.0, min(nxt, end) - time.monotonic()))
        if not r:
            continue
        for _ in range(256):
            try:
                data = s.recv(2048)
            except BlockingIOError:
                break
            got = time.monotonic()
            if len(data) < 244 or data[0] != 2:
                continue
            xid = struct.unpack_from("!I", data, 4)[0]
            p = pending.get(xid)
            if p is None:
                continue
            o = options(data)
            kind = o.get(53, b"\0")[0]
            if kind == 2 and p[0] == 1:
                stamps.append((p[1], got))
                got_o += 1
                req = packet(3, xid, data[28:34], a.pxe, requested=data[16:20],
                             server_id=o.get(54), giaddr=giaddr)
                try:
                    s.sendto(req, dest)
                    p[0], p[1] = 2, time.monotonic()
                    sent_r += 1
                except BlockingIOError:
                    del pending[xid]
            elif kind == 5 and p[0] == 2:
                stamps.append((p[1], got))
                got_a += 1
                del pending[xid]
            elif kind == 6:
                del pending[xid]
    elapsed = max(1e-9, min(time.monotonic(), t0 + a.secs) - t0)
    print(f"Rate: {got_a / elapsed:.3f} 4-way exchanges/second, expected rate: {a.rate:g}")
    print("***Statistics for: DISCOVER-OFFER***")
    print(f"sent packets: {sent_d}\nreceived packets: {got_o}\ndrops: {sent_d - got_o}")
    print("***Statistics for: REQUEST-ACK***")
    print(f"sent packets: {sent_r}\nreceived packets: {got_a}\ndrops: {sent_r - got_a}")
    print("***Timestamps for packets:")
    for sent, got in stamps:
        print(f"sent / received: {sent:.6f} / {got:.6f}")


if __name__ == "__main__":
    main()
