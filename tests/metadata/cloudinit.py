#!/usr/bin/python3
"""Drive Debian's cloud-init against a metadata service, the way a booting
machine would, and report what cloud-init made of it.

    cloudinit.py ec2 URL [--aws] [--max-wait S] [--timeout S]
    cloudinit.py nocloud URL          (URL ends with "/", e.g. .../cloud-init/)
    cloudinit.py netcfg FILE          (a NoCloud network-config file)

Prints ONE JSON object on stdout; cloud-init's own log goes to stderr.
Nothing here parses metadata: DataSourceEc2, DataSourceNoCloudNet and
cloudinit.net.network_state do all of it. Run it with Debian's interpreter
(/usr/bin/python3, package cloud-init), not a pyenv/venv python.

ec2: the datasource is forced onto a platform instead of probing DMI:
"unknown" (plain IMDSv1 GETs, strict_id off) or, with --aws, "aws", whose
only path is IMDSv2: PUT /latest/api/token, then every GET carries the token,
and a failed PUT means no datasource at all (no IMDSv1 fallback).
"""

import argparse
import base64
import json
import logging
import os
import shutil
import sys
import tempfile
import time

# This file is itself named cloudinit.py: keep its directory off the module
# path, or "import cloudinit" would import this script instead of the package.
_here = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _here]


def log_to_stderr():
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        logging.Formatter("%(asctime)s %(name)s %(levelname)s: %(message)s")
    )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.DEBUG)


def text(raw):
    """bytes/str/None -> str (strict UTF-8) or None; undecodable -> None."""
    if raw is None:
        return None
    if isinstance(raw, str):
        return raw
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return None


def b64(raw):
    if raw is None:
        return None
    if isinstance(raw, str):
        raw = raw.encode("utf-8")
    return base64.b64encode(raw).decode("ascii")


def jsonable(value):
    """What cloud-init holds, made printable (bytes become text or base64)."""
    return json.loads(
        json.dumps(
            value,
            default=lambda o: text(o)
            if isinstance(o, bytes) and text(o) is not None
            else b64(o)
            if isinstance(o, bytes)
            else repr(o),
        )
    )


def datasource_env(tmp):
    """Paths and a Debian distro rooted in a scratch directory: get_data()
    writes instance-data.json and friends under run_dir."""
    from cloudinit import distros, helpers

    paths = helpers.Paths({"cloud_dir": tmp, "run_dir": tmp + "/run"})
    distro = distros.fetch("debian")("debian", {}, paths)
    return paths, distro


def found(ds, ok, seconds):
    """What a booting machine would take from a datasource."""
    out = {
        "get_data": bool(ok),
        "seconds": round(seconds, 3),
        "dsname": ds.dsname,
        "instance_id": None,
        "local_hostname": None,
        "public_keys": None,
        "userdata": None,
        "userdata_b64": None,
        "vendordata": None,
        "vendordata_b64": None,
        "metadata_keys": [],
        "metadata": None,
    }
    if not ok:
        return out
    hostname = ds.get_hostname()
    out.update(
        instance_id=ds.get_instance_id(),
        # 22.4 returns a DataSourceHostname(hostname, is_default) tuple.
        local_hostname=getattr(hostname, "hostname", hostname),
        public_keys=ds.get_public_ssh_keys(),
        userdata=text(ds.userdata_raw),
        userdata_b64=b64(ds.userdata_raw),
        vendordata=text(ds.vendordata_raw),
        vendordata_b64=b64(ds.vendordata_raw),
        metadata_keys=sorted(ds.metadata or {}),
        metadata=jsonable(ds.metadata),
    )
    return out


def run_ec2(args, tmp):
    from cloudinit.sources import DataSourceEc2 as ec2

    paths, distro = datasource_env(tmp)
    sys_cfg = {
        "datasource": {
            "Ec2": {
                "metadata_urls": [args.url],
                "strict_id": False,
                "max_wait": args.max_wait,
                "timeout": args.timeout,
            }
        }
    }
    ds = ec2.DataSourceEc2(sys_cfg=sys_cfg, distro=distro, paths=paths)
    # Instead of DMI/hypervisor probing (identify_platform).
    ds._cloud_name = "aws" if args.aws else "unknown"
    start = time.monotonic()
    ok = ds.get_data()
    out = found(ds, ok, time.monotonic() - start)
    crawled = getattr(ds, "_crawled_metadata", None) or {}
    out.update(
        cloud_name=ds.cloud_name,
        metadata_address=ds.metadata_address,
        api_version=crawled.get("_metadata_api_version"),
        # Set only by the IMDSv2 flow (PUT /latest/api/token).
        api_token=text(ds._api_token),
        identity=jsonable(getattr(ds, "identity", None)) if ok else None,
    )
    return out


def run_nocloud(args, tmp):
    from cloudinit.sources.DataSourceNoCloud import DataSourceNoCloudNet

    paths, distro = datasource_env(tmp)
    sys_cfg = {
        "datasource": {
            # fs_label None: no blkid scan for a cidata disk.
            "NoCloud": {"seedfrom": args.url, "fs_label": None}
        }
    }
    ds = DataSourceNoCloudNet(sys_cfg, distro, paths)
    start = time.monotonic()
    ok = ds.get_data()
    out = found(ds, ok, time.monotonic() - start)
    # 22.4 does not fetch network-config over HTTP (None); later ones do.
    out["network_config"] = jsonable(ds.network_config) if ok else None
    return out


def run_netcfg(args, _tmp):
    from cloudinit import stages, util
    from cloudinit.net.network_state import parse_net_config_data

    with open(args.file, "rb") as f:
        raw = f.read()
    start = time.monotonic()
    cfg = util.load_yaml(util.decode_binary(raw), default=None)
    if cfg is None:
        raise SystemExit("network-config is not a YAML mapping: %r" % raw[:200])
    # stages.Init does this to every network config: `network:` is optional.
    cfg = stages.Init._remove_top_level_network_key(None, cfg)
    state = parse_net_config_data(cfg, skip_broken=False)
    interfaces = []
    for iface in state.iter_interfaces():
        interfaces.append(
            {
                "name": iface.get("name"),
                "type": iface.get("type"),
                "mac_address": iface.get("mac_address"),
                "mtu": iface.get("mtu"),
                "subnets": iface.get("subnets", []),
            }
        )
    return {
        "version": state.version,
        "interfaces": jsonable(interfaces),
        "routes": jsonable(list(state.iter_routes())),
        "dns": {
            "nameservers": jsonable(state.dns_nameservers),
            "search": jsonable(state.dns_searchdomains),
        },
        "has_default_route": state.has_default_route,
        "seconds": round(time.monotonic() - start, 3),
    }


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    e = sub.add_parser("ec2", help="DataSourceEc2 against URL")
    e.add_argument("url")
    e.add_argument("--aws", action="store_true", help="IMDSv2 token flow")
    e.add_argument("--max-wait", type=float, default=5)
    e.add_argument("--timeout", type=float, default=2)
    n = sub.add_parser("nocloud", help="DataSourceNoCloudNet seeded from URL")
    n.add_argument("url")
    c = sub.add_parser("netcfg", help="parse a network-config file")
    c.add_argument("file")
    args = p.parse_args()
    if args.cmd == "nocloud" and not args.url.endswith("/"):
        p.error("cloud-init 22.4 appends file names to seedfrom: end it with /")

    log_to_stderr()
    started = time.monotonic()
    tmp = tempfile.mkdtemp(prefix="cloudinit-driver-")
    try:
        import cloudinit.version

        run = {"ec2": run_ec2, "nocloud": run_nocloud, "netcfg": run_netcfg}
        out = run[args.cmd](args, tmp)
        out["cloud_init_version"] = cloudinit.version.version_string()
        out["total_seconds"] = round(time.monotonic() - started, 3)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    json.dump(out, sys.stdout, sort_keys=True)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
