"""``hal sched top URL``: a running scheduler's metrics, live in the terminal.

The scheduler serves them with :meth:`hal.sched.Scheduler.serve_metrics`; this polls
``URL/metrics.json`` and redraws a table of pools and devices (with ``rich`` when it is
installed, plain text otherwise).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import urllib.error
import urllib.request
from typing import Any

__all__ = ["add_commands", "fetch", "render"]


def fetch(url: str, timeout: float = 5.0) -> dict[str, Any]:
    """Return the metrics served at ``url`` (the base URL or ``.../metrics.json``)."""
    if not url.endswith("/metrics.json"):
        url = url.rstrip("/") + "/metrics.json"
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        data: dict[str, Any] = json.loads(resp.read())
    return data


def render(m: dict[str, Any]) -> str:
    """Return the metrics as a plain-text table."""
    lines = [
        f"hal.sched ({m.get('policy', '?')}): queue {m['queue_length']}, running {m['running']}, "
        f"timeouts {m['timeouts']}, evictions {m['evictions']}",
        f"  {'pool':<12} {'queue':>6} {'run':>5} {'done':>6} {'failed':>6} {'wait p50 ms':>12} "
        f"{'wait p99 ms':>12} {'run p50 ms':>11}",
    ]
    for name, p in m["pools"].items():
        t = p["tasks"]
        lines.append(
            f"  {name:<12} {p['queue_length']:>6} {p['running']:>5} {t.get('done', 0):>6} "
            f"{t.get('failed', 0) + t.get('timeout', 0):>6} {p['wait_s']['p50'] * 1e3:>12.2f} "
            f"{p['wait_s']['p99'] * 1e3:>12.2f} {p['run_s']['p50'] * 1e3:>11.2f}"
        )
    lines.append(
        f"  {'device':<12} {'state':>8} {'util':>6} {'run':>5} {'queue':>6} {'tasks':>6} {'evict':>6} {'t/o':>5}"
    )
    for name, d in m["devices"].items():
        lines.append(
            f"  {name:<12} {d['state']:>8} {d['utilization'] * 100:>5.1f}% {d['running']:>5} {d['queue_depth']:>6} "
            f"{d['tasks']:>6} {d['evictions']:>6} {d['timeouts']:>5}"
        )
    return "\n".join(lines)


def _top(args: argparse.Namespace) -> int:
    try:
        m = fetch(args.url)
    except (OSError, urllib.error.URLError, ValueError) as exc:
        print(
            f"hal sched top: error: cannot read metrics from {args.url!r}: {exc}", file=sys.stderr
        )
        return 1
    if args.once:
        print(render(m))
        return 0
    live_cls: Any = None  # rich's Live where rich is installed (typed Any: it may not be)
    try:
        from rich.live import Live
        from rich.text import Text

        live_cls = Live
    except ImportError:
        pass
    try:
        if live_cls is not None:
            with live_cls(Text(render(m)), refresh_per_second=4) as live:
                while True:
                    time.sleep(args.interval)
                    live.update(Text(render(fetch(args.url))))
        while True:
            sys.stdout.write("\x1b[H\x1b[2J" + render(m) + "\n")
            sys.stdout.flush()
            time.sleep(args.interval)
            m = fetch(args.url)
    except KeyboardInterrupt:
        return 0
    except (OSError, urllib.error.URLError, ValueError) as exc:
        print(f"hal sched top: the scheduler at {args.url!r} went away: {exc}", file=sys.stderr)
        return 1


def add_commands(sub: Any) -> None:
    """Add ``hal sched`` (with ``top``) to the ``hal`` command."""
    p = sub.add_parser("sched", help="a running hal.sched scheduler (see Scheduler.serve_metrics)")
    cmds = p.add_subparsers(dest="sched_command", metavar="SUBCOMMAND")
    top = cmds.add_parser(
        "top", help="queue, waits, utilization per pool and device, live", description=__doc__
    )
    top.add_argument("url", help="the URL Scheduler.serve_metrics() returned")
    top.add_argument(
        "--interval", type=float, default=1.0, help="seconds between refreshes (default 1)"
    )
    top.add_argument("--once", action="store_true", help="print the table once and exit")
    top.set_defaults(func=_top)
