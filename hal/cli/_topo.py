"""``hal topo``: hosts, devices, the P2P matrix (path, bandwidth, latency) and links (docs/topology.md)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from hal.cli._output import write_output


def add_commands(sub: Any) -> None:
    """Add ``topo`` to the subparsers ``sub``."""
    p = sub.add_parser(
        "topo",
        help="discover the topology (devices, P2P paths with measured bandwidth/latency, links); "
        "HAL_TOPO_FILE loads one instead",
    )
    p.add_argument("--json", action="store_true", help="print the topology as JSON")
    p.add_argument(
        "--dump", metavar="FILE", help="write the topology to FILE (the format HAL_TOPO_FILE reads)"
    )
    p.add_argument("--size", default="4M", help="bytes per bandwidth measurement (default 4M)")
    p.set_defaults(func=cmd_topo)


def _table(topo: Any) -> str:
    lines = [f"topology ({topo.source}): {len(topo.hosts)} host(s)"]
    for h in topo.hosts:
        devs = topo.devices.get(h, ())
        lines.append(f"host {h}: {len(devs)} device(s)")
        for i, d in enumerate(devs):
            lines.append(f"  [{i}] {d}")
        pairs = topo.p2p.get(h, ())
        if pairs:
            lines.append(f"  {'src':>3} {'dst':>3}  {'path':<7} {'GB/s':>9} {'latency us':>11}")
            for p in pairs:
                lines.append(
                    f"  {p.src:>3} {p.dst:>3}  {p.path:<7} {p.bandwidth_gbps:>9.2f} {p.latency_us:>11.1f}"
                )
    if topo.links:
        lines.append("links:")
        for lk in topo.links:
            lines.append(
                f"  {lk.a} <-> {lk.b}: {lk.bandwidth_gbps:.2f} GB/s, {lk.latency_us:.1f} us"
            )
    else:
        lines.append("links: none (one host)")
    if topo.ranks:
        lines.append("ranks: " + ", ".join(f"{r}->{h}" for r, h in enumerate(topo.ranks)))
    lines.append(f"digest: {topo.digest()}")
    return "\n".join(lines)


def cmd_topo(args: argparse.Namespace) -> int:
    """Discover (or load from HAL_TOPO_FILE) and print the topology."""
    from hal.comm._config import parse_size
    from hal.comm._topo import discover, load

    try:
        size = parse_size(args.size, "--size")
    except ValueError as exc:
        print(f"hal topo: error: {exc}", file=sys.stderr)
        return 2
    if size < 8:
        print(f"hal topo: error: --size={args.size!r} must be at least 8 bytes", file=sys.stderr)
        return 2
    from hal.spi import setting

    path = setting("HAL_TOPO_FILE")
    topo = load(path) if path else discover(measure_bytes=size)
    if args.dump:
        text = topo.to_json() + "\n"
        if not write_output("hal topo: error", "--dump", args.dump, text):
            return 2
        print(
            f"hal topo: wrote {args.dump} (load it with HAL_TOPO_FILE={args.dump})", file=sys.stderr
        )
    if args.json:
        print(json.dumps(topo.to_dict(), indent=1))
    elif not args.dump:
        print(_table(topo))
    return 0
