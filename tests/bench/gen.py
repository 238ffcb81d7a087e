#!/usr/bin/env python3
"""Inputs for tests/bench/run: the same N machines for every DHCP server.

    gen.py hardware N OUTPREFIX [FROM [relabel]]
                                    JSON batches of 5000 Hardware FROM..N-1 (POST /api/v1/hardware);
                                    relabel: the same machines with another label (an update)
    gen.py dnsmasq-hosts N FILE     dhcp-host lines (dhcp-hostsfile)
    gen.py kea N FILE LEASEDIR IFACE default|tuned   kea-dhcp4 config (memfile, raw sockets)
    gen.py macs N K PREFIX          K MAC lists (perfdhcp -M), machine i in list i % K
    gen.py workflows N FILE [A]     a Template of A actions (5) and a Workflow per machine 0..N-1
                                    (JSON, POST /api/v1/apply); worker = the machine's MAC

Machine i: MAC 02:00:xx:xx:xx:xx (i big-endian), IP 10.64.0.0 + 2 + i in
10.64.0.0/14 (so machine 0 is 10.64.0.2, the load generator's own address: its
metadata is what wrk reads), gateway/DNS 10.64.0.1, lease one day, netboot on.
"""
import ipaddress
import json
import sys

NET = ipaddress.ip_network("10.64.0.0/14")
SERVER = "10.64.0.1"


def mac(i):
    return "02:00:%02x:%02x:%02x:%02x" % (i >> 24 & 255, i >> 16 & 255, i >> 8 & 255, i & 255)


def ip(i):
    return str(NET.network_address + 2 + i)


def hardware(n, prefix, start=0, relabel=False):
    for b in range(start, n, 5000):
        docs = []
        for i in range(b, min(n, b + 5000)):
            docs.append({
                "apiVersion": "tinkerbell.org/v1alpha1", "kind": "Hardware",
                "metadata": {"name": f"m{i}", "namespace": "default",
                             "labels": {"bench": "relabelled" if relabel else "first"}},
                "spec": {
                    "interfaces": [{
                        "dhcp": {"mac": mac(i), "hostname": f"m{i}", "arch": "x86_64", "uefi": True,
                                 "lease_time": 86400, "name_servers": [SERVER],
                                 "ip": {"address": ip(i), "netmask": str(NET.netmask), "gateway": SERVER}},
                        "netboot": {"allowPXE": True, "allowWorkflow": True}}],
                    "metadata": {"instance": {"id": f"m{i}", "hostname": f"m{i}"}}}})
        with open(f"{prefix}.{(b - start) // 5000:05d}.json", "w") as f:
            json.dump(docs, f)


def workflows(n, path, actions=5):
    acts = "".join(f"      - {{name: a{k}, image: quay.io/tinkerbell/actions/writefile, timeout: 60}}\n"
                   for k in range(actions))
    data = ("version: '0.1'\nname: bench\nglobal_timeout: 600\ntasks:\n"
            "  - name: install\n    worker: '{{.device_1}}'\n    actions:\n" + acts)
    docs = [{"apiVersion": "tinkerbell.org/v1alpha1", "kind": "Template",
             "metadata": {"name": "bench", "namespace": "default"}, "spec": {"data": data}}]
    for i in range(n):
        docs.append({"apiVersion": "tinkerbell.org/v1alpha1", "kind": "Workflow",
                     "metadata": {"name": f"wf{i}", "namespace": "default"},
                     "spec": {"templateRef": "bench", "hardwareRef": f"m{i}",
                              "hardwareMap": {"device_1": mac(i)}}})
    with open(path, "w") as f:
        json.dump(docs, f)


def dnsmasq_hosts(n, path):
    with open(path, "w") as f:
        for i in range(n):
            f.write(f"{mac(i)},{ip(i)},m{i},24h\n")


def kea(n, path, leasedir, iface, flavour):
    tuned = flavour == "tuned"
    cfg = {"Dhcp4": {
        "interfaces-config": {"interfaces": [iface], "dhcp-socket-type": "raw"},
        "lease-database": {"type": "memfile", "name": f"{leasedir}/kea-leases4.csv",
                           "persist": not tuned, "lfc-interval": 3600},
        "valid-lifetime": 86400,
        "host-reservation-identifiers": ["hw-address"],
        "option-data": [{"name": "domain-name-servers", "data": SERVER},
                        {"name": "routers", "data": SERVER}],
        # PXE clients (option 93 = 7, x86-64 UEFI) get a boot file, as tinkerbox gives one.
        "client-classes": [{"name": "efi64", "test": "option[93].hex == 0x0007",
                            "next-server": SERVER, "boot-file-name": "ipxe.efi"}],
        "subnet4": [{"id": 1, "subnet": str(NET), "pools": [],
                     "reservations": [{"hw-address": mac(i), "ip-address": ip(i), "hostname": f"m{i}"}
                                      for i in range(n)]}],
        "loggers": [{"name": "kea-dhcp4", "output_options": [{"output": f"{leasedir}/kea.log"}],
                     # Debian's shipped config logs at INFO (a line per lease).
                     "severity": "WARN" if tuned else "INFO"}],
    }}
    d = cfg["Dhcp4"]
    if tuned:
        # Kea 2.2's own advice for performance: multi-threading, no
        # persistence, reservations looked up only where they are.
        d["multi-threading"] = {"enable-multi-threading": True, "thread-pool-size": 4,
                                "packet-queue-size": 256}
        d["subnet4"][0]["reservations-out-of-pool"] = True
        d["reservations-global"] = False
        d["reservations-in-subnet"] = True
        d["calculate-tee-times"] = False
    with open(path, "w") as f:
        json.dump(cfg, f)


def macs(n, k, prefix):
    files = [open(f"{prefix}.{j}", "w") for j in range(k)]
    # Machine 0 is the generator host itself; leave it out of the load.
    for i in range(1, n):
        files[i % k].write(mac(i) + "\n")
    for f in files:
        f.close()


def main():
    cmd, args = sys.argv[1], sys.argv[2:]
    if cmd == "hardware":
        hardware(int(args[0]), args[1], int(args[2]) if len(args) > 2 else 0,
                 len(args) > 3 and args[3] == "relabel")
    elif cmd == "dnsmasq-hosts":
        dnsmasq_hosts(int(args[0]), args[1])
    elif cmd == "kea":
        kea(int(args[0]), args[1], args[2], args[3], args[4])
    elif cmd == "macs":
        macs(int(args[0]), int(args[1]), args[2])
    elif cmd == "workflows":
        workflows(int(args[0]), args[1], int(args[2]) if len(args) > 2 else 5)
    else:
        sys.exit(f"unknown command {cmd}")


if __name__ == "__main__":
    main()
