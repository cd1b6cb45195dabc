"""``hal kernels translate|plan|accuracy`` and ``hal cache info|clear`` (``hal bench kernels``: hal.cli.bench)."""

from __future__ import annotations

import argparse
import functools
import json
import sys
from collections.abc import Callable
from typing import Any

__all__ = ["add_commands"]


def _friendly(fn: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    """Turn bad input (unknown backend or op, unreadable file, unavailable backend) into a message."""

    @functools.wraps(fn)
    def run(args: argparse.Namespace) -> int:
        from hal import HalError

        try:
            return fn(args)
        except (ValueError, TypeError, OSError, HalError) as exc:
            print(f"hal: {exc}", file=sys.stderr)
            return 2 if isinstance(exc, (ValueError, TypeError, OSError)) else 1

    return run


def add_commands(sub: Any) -> None:
    """Add the ``kernels`` and ``cache`` groups to the subparsers ``sub``."""
    kp = sub.add_parser(
        "kernels", help="portable kernels: translate, coverage plan, accuracy report"
    )
    ks = kp.add_subparsers(dest="kernels_command", metavar="SUBCOMMAND")

    p = ks.add_parser(
        "translate", help="print the exact code a backend compiles for a portable kernel source"
    )
    p.add_argument("source", help="kernel source file ('-' reads stdin)")
    p.add_argument(
        "--backend",
        required=True,
        help="backend name (cpu, opencl, cuda ...) or dialect (c, opencl, cuda)",
    )
    p.add_argument(
        "-D",
        "--define",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a #define before the source",
    )
    p.set_defaults(func=cmd_translate)

    p = ks.add_parser("plan", help="which implementation each op and dtype runs on each backend")
    p.add_argument("--backend", help="only this backend")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=cmd_plan)

    p = ks.add_parser(
        "accuracy", help="error of every op and dtype against the float64 NumPy reference"
    )
    p.add_argument("--backend", help="only this backend")
    p.add_argument("--op", action="append", help="only this op (repeatable)")
    p.add_argument("--seed", type=int, default=0, help="input seed (default 0)")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=cmd_accuracy)

    def _usage_kernels(args: argparse.Namespace) -> int:
        kp.print_help()
        return 2

    kp.set_defaults(func=_usage_kernels)

    cp = sub.add_parser("cache", help="the kernel compile cache (HAL_CACHE_DIR)")
    cs = cp.add_subparsers(dest="cache_command", metavar="SUBCOMMAND")
    p = cs.add_parser("info", help="location, size, cap and entries of the compile cache")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=cmd_cache_info)
    p = cs.add_parser("clear", help="remove every compiled program from the cache")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=cmd_cache_clear)

    def _usage_cache(args: argparse.Namespace) -> int:
        cp.print_help()
        return 2

    cp.set_defaults(func=_usage_cache)


def _defines(items: list[str]) -> dict[str, str]:
    out = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise SystemExit(f"hal kernels translate: --define {item!r} must be NAME=VALUE")
        out[name] = value
    return out


@_friendly
def cmd_translate(args: argparse.Namespace) -> int:
    """Print the translated source."""
    import hal
    from hal.kernels import translate

    text = sys.stdin.read() if args.source == "-" else open(args.source, encoding="utf-8").read()
    try:
        print(translate(text, args.backend, defines=_defines(args.define)))
    except (ValueError, hal.HalError) as exc:
        print(f"hal kernels translate: {exc}", file=sys.stderr)
        return 1
    return 0


@_friendly
def cmd_plan(args: argparse.Namespace) -> int:
    """Print the coverage table."""
    from hal.kernels import plan

    rows = plan(args.backend)
    if args.json:
        print(json.dumps({"plan": rows}, indent=2))
        return 0
    backends = sorted({r["backend"] for r in rows}, key=[r["backend"] for r in rows].index)
    dtypes = sorted({r["dtype"] for r in rows}, key=[r["dtype"] for r in rows].index)
    cell = {(r["backend"], r["op"], r["dtype"]): r for r in rows}
    short = {"dedicated": "D", "generic": "g", "host": "h", "unsupported": "-"}
    print(
        "implementation per op and dtype: D dedicated, g generic (portable kernels), h host fallback, - unsupported"
    )
    for b in backends:
        print(f"\n{b}  " + " ".join(f"{d:>8s}" for d in dtypes))
        ops = [r["op"] for r in rows if r["backend"] == b and r["dtype"] == dtypes[0]]
        names: dict[str, str] = {}
        for op in ops:
            marks = []
            for d in dtypes:
                r = cell[(b, op, d)]
                marks.append(f"{short[r['implementation']]:>8s}")
                if r["implementation"] == "dedicated":
                    names.setdefault(op, r["name"])
            extra = f"   {names[op]}" if op in names else ""
            print(f"  {op:11s}" + " ".join(marks) + extra)
    return 0


def _fmt(v: Any) -> str:
    return f"{v:.3g}" if isinstance(v, float) else str(v)


@_friendly
def cmd_accuracy(args: argparse.Namespace) -> int:
    """Print the accuracy report; exit 1 if a row fails."""
    from hal.kernels._accuracy import TOLERANCES, accuracy

    rows = accuracy(args.backend, seed=args.seed, ops=args.op)
    ok = all(r.passed for r in rows)
    if args.json:
        doc = {
            "pass": ok,
            "seed": args.seed,
            "tolerances": {
                k: {"rtol": v[0], "atol": v[1], "source": v[2]} for k, v in TOLERANCES.items()
            },
            "rows": [r.to_dict() for r in rows],
        }
        print(json.dumps(doc, indent=2))
        return 0 if ok else 1
    hdr = (
        f"{'backend':8s} {'op':11s} {'dtype':8s} {'impl':9s} {'max_abs':>9s} {'max_rel':>9s} "
        f"{'max_ulp':>9s} {'rtol':>7s} {'atol':>7s} {'nan/inf':8s} result"
    )
    print(hdr)
    for r in rows:
        print(
            f"{r.backend:8s} {r.op:11s} {r.dtype:8s} {r.implementation:9s} {_fmt(r.max_abs):>9s} {_fmt(r.max_rel):>9s} "
            f"{_fmt(r.max_ulp):>9s} {_fmt(r.rtol):>7s} {_fmt(r.atol):>7s} {r.nan_inf:8s} "
            f"{'pass' if r.passed else 'FAIL'}" + (f"  {r.error}" if r.error else "")
        )
    print(
        "\ntolerances: "
        + "; ".join(f"{k} rtol={v[0]:g} atol={v[1]:g} ({v[2]})" for k, v in TOLERANCES.items())
    )
    print(f"{sum(r.passed for r in rows)}/{len(rows)} pass")
    return 0 if ok else 1


@_friendly
def cmd_cache_info(args: argparse.Namespace) -> int:
    """Print the cache summary."""
    from hal.kernels import cache_info

    info = cache_info()
    if args.json:
        print(json.dumps(info.to_dict(), indent=2))
        return 0
    print(f"path:      {info.path}")
    print(f"entries:   {info.entries}")
    print(f"bytes:     {info.bytes}")
    print(
        f"max bytes: {info.max_bytes}  (HAL_CACHE_MAX_BYTES; least recently used entries are evicted)"
    )
    for item in info.items[:20]:
        print(
            f"  {item['key'][:16]}  {item['bytes']:>9d}  {item['backend']}  {', '.join(item['kernels'] or [])}"
        )
    if info.entries > 20:
        print(f"  ... {info.entries - 20} more")
    return 0


@_friendly
def cmd_cache_clear(args: argparse.Namespace) -> int:
    """Remove every cache entry."""
    from hal.kernels import cache_dir, clear_cache

    n = clear_cache()
    if args.json:
        print(json.dumps({"removed": n, "path": str(cache_dir() / "kernels")}))
    else:
        print(f"removed {n} cached program(s) from {cache_dir() / 'kernels'}")
    return 0
