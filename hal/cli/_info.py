"""``hal info`` and ``hal plugins``."""

from __future__ import annotations

import argparse
import json
from typing import Any


def add_commands(sub: Any) -> None:
    """Add ``info`` and ``plugins`` to the subparsers ``sub``."""
    p = sub.add_parser("info", help="backends and devices with capabilities; failures with reasons")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=cmd_info)
    p = sub.add_parser(
        "plugins", help="entry points of the hal.backends group: dists, versions, status"
    )
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=cmd_plugins)


def info_dict() -> dict[str, Any]:
    """Return what ``hal info --json`` prints."""
    import hal

    out: dict[str, Any] = {
        "hal_sdk": hal.__version__,
        "api_version": ".".join(map(str, hal.API_VERSION)),
    }
    backends = []
    for b in hal.list_backends():
        entry = b.to_dict()
        devs = hal.devices(b.name) if b.status == "available" else []
        try:
            entry["devices"] = [
                {
                    "index": d.index,
                    "name": d.name,
                    "spec": str(d),
                    "vendor": d.vendor,
                    "total_memory": d.total_memory,
                    "capabilities": d.capabilities.to_dict(),
                    "properties": _properties(d),
                }
                for d in devs
            ]
            entry["p2p"] = [[_path(a, b2) for b2 in devs] for a in devs]
        except Exception as exc:  # noqa: BLE001 - a backend breaking the SPI contract: name it, list the rest
            entry["devices"], entry["p2p"] = [], []
            entry["error"] = f"describing its devices failed: {type(exc).__name__}: {exc}"
        backends.append(entry)
    out["backends"] = backends
    return out


def _properties(d: Any) -> dict[str, Any]:
    """The device's properties, or ``{"error": why}`` when its backend fails to give them."""
    import hal

    try:
        return d.properties()
    except hal.HalError as exc:  # a vendor's properties()/health() raised: report it, list the rest
        return {"error": str(exc)}


def _path(a: Any, b: Any) -> str:
    if a == b:
        return "local"
    return "peer" if a.can_access_peer(b) else "staged"


def cmd_info(args: argparse.Namespace) -> int:
    """Print backends, devices, capabilities and the P2P matrix."""
    data = info_dict()
    if args.json:
        print(json.dumps(data, indent=2, default=str))
        return 0
    print(f"hal-sdk {data['hal_sdk']} (HAL API {data['api_version']})")
    for b in data["backends"]:
        where = f"{b['dist']} {b['version']}" if b["dist"] else "?"
        line = f"\nbackend {b['name']}: {b['status']}  [plugin {b['plugin']}, {where}, API {b['api_version'] or '?'}]"
        print(line)
        if b["reason"]:
            print(f"  reason: {b['reason']}")
        if b.get("error"):
            print(f"  error: {b['error']}")
        for d in b["devices"]:
            caps = d["capabilities"]
            flags = ", ".join(k for k, v in caps.items() if v is True)
            print(
                f"  {d['spec']}: {d['name']} ({d['vendor']}), {d['total_memory'] / 2**30:.2f} GiB; {flags}"
            )
            if "error" in d["properties"]:
                print(f"    properties unavailable: {d['properties']['error']}")
        if len(b["devices"]) > 1:
            print("  P2P matrix (row = dst, column = src):")
            for d, row in zip(b["devices"], b["p2p"], strict=True):
                print(f"    {d['spec']:>10}  " + "  ".join(f"{p:>6}" for p in row))
    return 0


def cmd_plugins(args: argparse.Namespace) -> int:
    """Print the plugins of the hal.backends entry-point group."""
    from hal.plugins import get_system

    system = get_system()
    rows = [p.to_dict() for p in system.plugins]
    if args.json:
        print(json.dumps({"plugins": rows}, indent=2))
        return 0
    for r in rows:
        dist = f"{r['dist']} {r['dist_version']}" if r["dist"] else "-"
        print(f"{r['name']:<12} {r['status']:<8} {dist:<28} {r['value']}")
        if r["reason"]:
            print(f"{'':<12} reason: {r['reason']}")
    return 0
