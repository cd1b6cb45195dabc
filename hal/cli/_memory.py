"""``hal memory``: the memory pool's statistics per device (docs/memory.md)."""

from __future__ import annotations

import argparse
import json
import runpy
import sys
from typing import Any

_MIB = 1 << 20


def add_commands(sub: Any) -> None:
    """Add ``memory`` to the subparsers ``sub``."""
    p = sub.add_parser(
        "memory",
        help="print the memory pool's statistics per device (in use, reserved, peak, largest free block, "
        "fragmentation, size classes), after running a script with --run",
    )
    p.add_argument("--json", action="store_true", help="print the statistics as JSON")
    p.add_argument("--backend", metavar="NAME", help="only the devices of this backend")
    p.add_argument(
        "--run", metavar="SCRIPT", help="run SCRIPT (python, in this process) first, then report"
    )
    p.add_argument("args", nargs=argparse.REMAINDER, help="arguments of SCRIPT")
    p.set_defaults(func=cmd_memory)


def _fmt(n: object) -> str:
    if not isinstance(n, int):
        return "-"
    return f"{n / _MIB:.2f} MiB" if n >= _MIB else f"{n} B"


def _table(stats: list[dict[str, Any]]) -> str:
    lines = []
    for st in stats:
        head = f"{st['device']}: pool {'on' if st['pool'] else 'off (HAL_MEMORY_POOL=0)'}"
        lines.append(head)
        keys = [
            "in_use",
            "reserved",
            "cached",
            "peak_in_use",
            "peak_reserved",
            "largest_free_block",
            "total_memory",
            "device_free",
            "limit",
        ]
        for k in keys:
            if k in st:
                lines.append(f"  {k:<20} {_fmt(st[k])}")
        if st["pool"]:
            lines.append(f"  {'fragmentation':<20} {st['fragmentation']:.3f}")
            lines.append(
                f"  {'allocs / frees':<20} {st['allocs']} / {st['frees']} "
                f"(cache hits {st['cache_hits']}, backend allocs {st['backend_allocs']}, "
                f"backend frees {st['backend_frees']}, retries after freeing the cache {st['oom_retries']}, "
                f"out of memory {st['ooms']})"
            )
            if st["size_classes"]:
                lines.append(
                    "  size classes (allocs, live): "
                    + ", ".join(
                        f"{k} {v['allocs']}/{v['live']}" for k, v in st["size_classes"].items()
                    )
                )
    return "\n".join(lines)


def cmd_memory(args: argparse.Namespace) -> int:
    """Run ``--run SCRIPT`` if given, then print ``Device.memory_stats()`` of every device."""
    import hal

    if args.run:
        argv = sys.argv
        sys.argv = [args.run, *args.args]
        try:
            runpy.run_path(args.run, run_name="__main__")
        except SystemExit as exc:
            if exc.code not in (None, 0):
                print(f"hal memory: {args.run} exited with {exc.code}", file=sys.stderr)
                return 1
        finally:
            sys.argv = argv
    elif args.args:
        print(
            f"hal memory: error: unexpected arguments {args.args!r} (give a script with --run)",
            file=sys.stderr,
        )
        return 2
    devices = hal.devices(args.backend) if args.backend else hal.devices()
    stats = [d.memory_stats() for d in devices]
    if args.json:
        print(json.dumps({"devices": stats}, indent=2))
    else:
        print(_table(stats) if stats else "no devices")
    return 0
