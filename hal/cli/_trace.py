"""``hal trace merge|summary|check``: work with the timelines that ``HAL_TRACE`` / ``hal.trace`` write."""

from __future__ import annotations

import argparse
import collections
import json
import sys
from pathlib import Path
from typing import Any

from hal.cli._output import write_output

__all__ = ["add_commands", "check", "load", "merge", "summarize"]

#: Categories that count as communication in the summary's communication share.
COMM_CATEGORIES = ("copy", "collective")
#: Categories of device work (the denominator with communication).
WORK_CATEGORIES = ("kernel", "copy", "collective")


def load(path: str | Path) -> dict[str, Any]:
    """Read a trace file (object form ``{"traceEvents": [...]}`` or a bare event array).

    Raises:
        ValueError: the file is not JSON or not a Chrome trace (naming the file).
    """
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"{path}: not a readable JSON trace ({exc})") from None
    if isinstance(data, list):
        data = {"traceEvents": data}
    if not isinstance(data, dict) or not isinstance(data.get("traceEvents"), list):
        raise ValueError(f"{path}: no 'traceEvents' list: not a Chrome Trace Event file")
    return data


def merge(paths: list[str | Path]) -> dict[str, Any]:
    """Merge per-rank traces into one (each rank keeps its process id; clashes are renumbered)."""
    events: list[dict[str, Any]] = []
    used: set[int] = set()
    for p in paths:
        data = load(p)
        pids = {e.get("pid", 0) for e in data["traceEvents"]}
        remap = {}
        for pid in sorted(pids, key=str):
            new = (
                pid if isinstance(pid, int) and pid not in used else (max(used) + 1 if used else 0)
            )
            remap[pid] = new
            used.add(new)
        for e in data["traceEvents"]:
            e = dict(e)
            e["pid"] = remap[e.get("pid", 0)]
            events.append(e)
    meta = [e for e in events if e.get("ph") == "M"]
    body = sorted(
        (e for e in events if e.get("ph") != "M"), key=lambda e: (e.get("ts", 0), -e.get("dur", 0))
    )
    return {
        "traceEvents": meta + body,
        "displayTimeUnit": "ms",
        "otherData": {"merged_from": [str(p) for p in paths]},
    }


def check(data: dict[str, Any]) -> list[str]:
    """Return the problems of a trace: slices that partially overlap on one track, bad
    B/E pairs, events without the required fields. Empty when well nested."""
    problems: list[str] = []
    by_track: dict[tuple[Any, Any], list[tuple[float, float, str]]] = collections.defaultdict(list)
    open_b: dict[tuple[Any, Any], list[tuple[float, str]]] = collections.defaultdict(list)
    for e in data["traceEvents"]:
        ph = e.get("ph")
        if ph is None or "pid" not in e or (ph != "C" and ph != "M" and "tid" not in e):
            problems.append(f"event without ph/pid/tid: {e}")
            continue
        if ph == "M":
            continue
        if "ts" not in e:
            problems.append(f"event without ts: {e}")
            continue
        key = (e["pid"], e.get("tid"))
        if ph == "X":
            dur = float(e.get("dur", 0.0))
            if dur < 0:
                problems.append(f"negative duration: {e}")
            by_track[key].append((float(e["ts"]), float(e["ts"]) + dur, str(e.get("name"))))
        elif ph == "B":
            open_b[key].append((float(e["ts"]), str(e.get("name"))))
        elif ph == "E":
            if not open_b[key]:
                problems.append(f"E without B on track {key}: {e}")
            else:
                t0, name = open_b[key].pop()
                by_track[key].append((t0, float(e["ts"]), name))
    for key, unclosed in open_b.items():
        for _, name in unclosed:
            problems.append(f"B without E on track {key}: {name}")
    eps = 1e-3  # µs: rounding of ts and dur to 3 decimals
    for key, slices in by_track.items():
        slices.sort(key=lambda s: (s[0], -(s[1] - s[0])))
        stack: list[tuple[float, float, str]] = []
        for s in slices:
            while stack and stack[-1][1] <= s[0] + eps:
                stack.pop()
            if stack and s[1] > stack[-1][1] + eps:
                problems.append(
                    f"track {key}: {s[2]!r} [{s[0]}, {s[1]}] partially overlaps {stack[-1][2]!r} "
                    f"[{stack[-1][0]}, {stack[-1][1]}]"
                )
                continue
            stack.append(s)
    return problems


def summarize(data: dict[str, Any], top: int = 10) -> dict[str, Any]:
    """Return the top costs by (category, name), totals per category, the communication
    share and the scheduler's waits of a trace."""
    groups: dict[tuple[str, str], list[float]] = collections.defaultdict(list)
    per_cat: dict[str, float] = collections.defaultdict(float)
    waits: list[float] = []
    t_min, t_max = float("inf"), float("-inf")
    for e in data["traceEvents"]:
        if e.get("ph") != "X":
            continue
        cat, dur = str(e.get("cat", "")), float(e.get("dur", 0.0))
        groups[(cat, str(e.get("name")))].append(dur)
        per_cat[cat] += dur
        t_min, t_max = min(t_min, e["ts"]), max(t_max, e["ts"] + dur)
        if cat == "task" and isinstance(e.get("args", {}).get("wait_ms"), (int, float)):
            waits.append(float(e["args"]["wait_ms"]))
    rows: list[dict[str, Any]] = sorted(
        (
            {
                "cat": c,
                "name": n,
                "count": len(v),
                "total_ms": sum(v) / 1e3,
                "mean_ms": sum(v) / len(v) / 1e3,
            }
            for (c, n), v in groups.items()
        ),
        key=lambda r: -r["total_ms"],
    )
    comm = sum(per_cat.get(c, 0.0) for c in COMM_CATEGORIES)
    work = sum(per_cat.get(c, 0.0) for c in WORK_CATEGORIES)
    return {
        "span_ms": (t_max - t_min) / 1e3 if rows else 0.0,
        "categories_ms": {c: v / 1e3 for c, v in sorted(per_cat.items())},
        "communication_share": comm / work if work else 0.0,
        "top": rows[:top],
        "tasks": {
            "count": len(waits),
            "mean_wait_ms": sum(waits) / len(waits) if waits else 0.0,
            "max_wait_ms": max(waits, default=0.0),
        },
    }


def _cmd_merge(args: argparse.Namespace) -> int:
    data = merge(args.inputs)
    text = json.dumps(data, separators=(",", ":"))
    if not write_output("hal trace: error", "-o", args.output, text):
        return 2
    n = sum(1 for e in data["traceEvents"] if e.get("ph") != "M")
    print(f"merged {len(args.inputs)} trace(s), {n} events -> {args.output}")
    return 0


def _cmd_summary(args: argparse.Namespace) -> int:
    s = summarize(load(args.trace), top=args.top)
    if args.json:
        print(json.dumps(s, indent=2))
        return 0
    print(f"trace {args.trace}: span {s['span_ms']:.3f} ms")
    print("  " + ", ".join(f"{c or '-'} {v:.3f} ms" for c, v in s["categories_ms"].items()))
    print(
        f"  communication share: {s['communication_share']:.1%} (copies + collectives of device work)"
    )
    if s["tasks"]["count"]:
        t = s["tasks"]
        print(
            f"  scheduler tasks: {t['count']}, mean wait {t['mean_wait_ms']:.3f} ms, max {t['max_wait_ms']:.3f} ms"
        )
    print(f"  {'category':<11} {'name':<28} {'count':>6} {'total ms':>10} {'mean ms':>9}")
    for r in s["top"]:
        print(
            f"  {r['cat']:<11} {r['name'][:28]:<28} {r['count']:>6} {r['total_ms']:>10.3f} {r['mean_ms']:>9.3f}"
        )
    return 0


def _cmd_check(args: argparse.Namespace) -> int:
    problems = check(load(args.trace))
    for p in problems[:50]:
        print(p, file=sys.stderr)
    if problems:
        print(f"{args.trace}: {len(problems)} problem(s)", file=sys.stderr)
        return 1
    print(f"{args.trace}: valid and well nested")
    return 0


def add_commands(sub: Any) -> None:
    """Add ``trace merge|summary|check`` to the subparsers ``sub``."""
    parser = sub.add_parser("trace", help="merge, summarise and check HAL_TRACE timelines")
    cmds = parser.add_subparsers(dest="trace_command", metavar="ACTION")

    p = cmds.add_parser("merge", help="merge per-rank traces (trace.rank0.json ...) into one file")
    p.add_argument("-o", "--output", required=True, help="the merged trace to write")
    p.add_argument("inputs", nargs="+", help="trace files to merge")
    p.set_defaults(func=_wrap(_cmd_merge))

    p = cmds.add_parser("summary", help="top costs and the communication share of a trace")
    p.add_argument("trace")
    p.add_argument("--top", type=int, default=10, help="rows of top costs (default 10)")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=_wrap(_cmd_summary))

    p = cmds.add_parser(
        "check", help="validate a trace: JSON, required fields, slices well nested per track"
    )
    p.add_argument("trace")
    p.set_defaults(func=_wrap(_cmd_check))

    def _usage(args: argparse.Namespace) -> int:
        parser.print_help()
        return 2

    parser.set_defaults(func=_usage)


def _wrap(fn: Any) -> Any:
    def run(args: argparse.Namespace) -> int:
        try:
            return int(fn(args))
        except ValueError as exc:
            print(f"hal trace: error: {exc}", file=sys.stderr)
            return 2

    return run
