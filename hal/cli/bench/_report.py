"""``hal bench report DIR``: Markdown tables from the JSON files a bench run wrote.

Reads every ``*.json`` in ``DIR`` written by ``hal bench memory|kernels|comm|sched --json``
(``nox -s bench`` writes them) and prints one Markdown table per file, each headed by the
load average at the start and the end of that bench, the machine's memcpy bandwidth (the
physical limit of a copy) and the method. Every ratio is hal time / baseline time: below 1,
hal is faster. The tables in docs/comm.md, docs/kernels.md and docs/backends/cpu.md are
pasted from this output.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hal.cli._output import write_output

__all__ = ["add_command", "report"]


def add_command(benches: Any) -> None:
    """Add ``report`` to the ``hal bench`` subcommands."""
    p = benches.add_parser(
        "report",
        help="Markdown tables (with the load average beside each) from the JSON files of a bench run",
        description=(__doc__ or "").split("\n\n")[1],
    )
    p.add_argument(
        "folder", metavar="DIR", help="folder holding the benches' --json output (*.json)"
    )
    p.add_argument("--out", metavar="FILE", help="write the Markdown here instead of stdout")

    def _run(args: argparse.Namespace) -> int:
        folder = Path(args.folder)
        if not folder.is_dir():
            print(f"hal bench report: {folder} is not a folder", file=sys.stderr)
            return 2
        text = report(folder)
        if args.out:
            if not write_output("hal bench report", "--out", args.out, text):
                return 2
        else:
            print(text, end="")
        return 0

    p.set_defaults(func=_run)


def _us(seconds_us: float | None) -> str:
    if seconds_us is None:
        return "-"
    if seconds_us >= 1000:
        return f"{seconds_us / 1000:.2f} ms"
    return f"{seconds_us:.1f} µs"


def _num(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.3g}"


def _size(nbytes: int) -> str:
    from hal.cli.bench import format_size

    return format_size(nbytes)


def _elements(n: int) -> str:
    """``65536`` -> ``64K``, ``16777216`` -> ``16M`` (binary multiples, as the docs write sizes)."""
    for unit, scale in (("M", 1 << 20), ("K", 1 << 10)):
        if n >= scale and n % scale == 0:
            return f"{n // scale}{unit}"
    return str(n)


def _machine(doc: dict[str, Any]) -> str:
    start, end = doc.get("loadavg"), doc.get("loadavg_end")
    parts = []
    if start:
        parts.append(
            f"load average {start[0]:.2f} at start"
            + (f", {end[0]:.2f} at end" if end else "")
            + f" ({os.cpu_count()} cores, shared with other jobs: timings move)"
        )
    if doc.get("memcpy_GBps"):
        parts.append(
            f"memcpy {doc['memcpy_GBps']:.1f} GB/s (numpy.copyto, 64 MiB: the physical limit)"
        )
    return "*" + "; ".join(parts) + "*" if parts else ""


def _method(doc: dict[str, Any]) -> str:
    m = doc.get("methodology")
    if not m:
        return ""
    return (
        f"Method: {m['clock']}; {m['repetitions']}; {m['statistic']}; interleaved {m['interleaving']}"
        + (f"; {m['placement']}" if m.get("placement") else "")
        + (f"; memory: {m['memory']}" if m.get("memory") else "")
        + f". Ratio = {m['ratio']}."
    )


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return out


def _comm(doc: dict[str, Any]) -> list[str]:
    base = doc.get("baseline")
    lib = doc.get("baseline_library", "")
    title = f"### `hal bench comm`: {doc['op']}, {doc['ranks']} ranks, transport {doc['transport']}"
    title += f", {doc['backend']} devices" if doc.get("backend") else ""
    title += f", beside {lib or base}" if base else ""
    if base:
        header = ["size", "hal out of place", f"{base} out of place", "ratio", "hal in place"]
        header += [f"{base} in place", "in-place ratio", "hal busbw (GB/s)", f"{base} busbw (GB/s)"]
    else:
        header = ["size", "hal out of place", "hal in place", "busbw (GB/s)", "#wrong"]
    rows = []
    for r in doc["rows"]:
        if base:
            rows.append(
                [
                    _size(r["size"]),
                    _us(r["oop_time_us"]),
                    _us(r[f"{base}_time_us"]),
                    _num(r["ratio"]),
                    _us(r["inplace_time_us"]),
                    _us(r.get(f"{base}_inplace_time_us")),
                    _num(r.get("inplace_ratio")),
                    _num(r["oop_busbw"]),
                    _num(r[f"{base}_busbw"]),
                ]
            )
        else:
            rows.append(
                [
                    _size(r["size"]),
                    _us(r["oop_time_us"]),
                    _us(r["inplace_time_us"]),
                    _num(r["oop_busbw"]),
                    str(r["oop_wrong"] + r["inplace_wrong"]),
                ]
            )
    lines = [title, "", _machine(doc), "", *_table(header, rows)]
    ddp = doc.get("ddp")
    if ddp:
        lines += [
            "",
            f"DDP step of examples/ddp_torch.py ({ddp['ranks']} ranks, mean of {ddp['steps']} steps): "
            f"hal {ddp['hal_step_ms']:.2f} ms, gloo {ddp['gloo_step_ms']:.2f} ms, ratio {ddp['ratio']:.2f}.",
        ]
    return lines


def _kernels(doc: dict[str, Any]) -> list[str]:
    header = [
        "backend",
        "op",
        "size",
        "hal impl",
        "hal ms",
        "hal event ms",
        "NumPy ms",
        "hal/NumPy",
    ]
    header += ["BLAS ms", "hal/BLAS", "torch ms", "hal/torch", "raw ms", "hal/raw"]
    rows = [
        [
            r["backend"],
            r["op"],
            _elements(r["size"]) if r["op"] != "matmul" else f"{r['size']}²",
            r["implementation"],
            _ms(r["hal_ms"]),
            _ms(r.get("hal_event_ms")),
            _ms(r["numpy_ms"]),
            _num(r["ratio"]),
            _ms(r.get("blas_ms")),
            _num(r.get("blas_ratio")),
            _ms(r.get("torch_ms")),
            _num(r.get("torch_ratio")),
            _ms(r.get("raw_ms")),
            _num(r.get("raw_ratio")),
        ]
        for r in doc["results"]
    ]
    lines = ["### `hal bench kernels` (float32; size in elements, matmul: matrix order)", ""]
    lines += [_machine(doc), ""]
    lines += _table(header, rows)
    if doc.get("launch"):
        lines += [
            "",
            "Launch latency (1-element axpy, 1,000 launches then one synchronize, per launch):",
            "",
        ]
        lines += _table(
            ["backend", "hal", "baseline", "ratio", "target"],
            [
                [
                    lr["backend"],
                    f"{lr['hal_us']:.1f} µs",
                    f"{lr['baseline']} {lr['baseline_us']:.1f} µs",
                    _num(lr["ratio"], 1),
                    f"≤ {lr['target']:g}: {'met' if lr['meets_target'] else 'missed'}",
                ]
                for lr in doc["launch"]
            ],
        )
    return lines


def _memory(doc: dict[str, Any]) -> list[str]:
    lines = ["### `hal bench memory`", "", _machine(doc), ""]
    for section in doc["backends"]:
        if section.get("status") != "available":
            lines += [f"{section['backend']}: not measured ({section.get('reason', '')})", ""]
            continue
        rows = [
            [
                r["direction"],
                _size(r["nbytes"]),
                _us(None if r.get("hal_s") is None else r["hal_s"] * 1e6),
                _us(None if r.get("raw_s") is None else r["raw_s"] * 1e6),
                _num(r.get("hal_GBps")),
                _num(r.get("raw_GBps")),
                _num(r.get("ratio")),
            ]
            for r in section["results"]
            if "skipped" not in r
        ]
        lines += [f"{section['backend']} (baseline {section.get('baseline', '')}):", ""]
        lines += _table(["dir", "size", "hal", "raw", "hal GB/s", "raw GB/s", "hal/raw"], rows)
        lines.append("")
    return lines


def _sched(doc: dict[str, Any]) -> list[str]:
    lines = ["### `hal bench sched --overhead`", "", _machine(doc), ""]
    lat, thr = doc["latency_us"], doc["throughput_per_s"]
    lines += _table(
        ["measure", "hal.sched", "ThreadPoolExecutor", "ratio", "target"],
        [
            [
                f"latency (submit + result, x{doc['latency_tasks']})",
                f"{lat['sched']:.0f} µs",
                f"{lat['executor']:.0f} µs",
                _num(doc["latency_ratio"]),
                f"≤ {doc['target']:g}",
            ],
            [
                f"throughput ({doc['tasks']} tasks)",
                f"{thr['sched']:.0f}/s",
                f"{thr['executor']:.0f}/s",
                _num(doc["throughput_ratio"]),
                f"≤ {doc['target']:g}",
            ],
        ],
    )
    return lines


def _makespan(doc: dict[str, Any]) -> list[str]:
    lines = ["### `hal bench sched` (makespan per policy)", "", _machine(doc), ""]
    base = doc["policies"].get("eft", {}).get("makespan_s")
    rows = [
        [
            name,
            f"{r['makespan_s'] * 1e3:.1f} ms",
            f"{r['median_s'] * 1e3:.1f} ms",
            _num(r["makespan_s"] / base) if base else "-",
        ]
        for name, r in doc["policies"].items()
    ]
    return lines + _table(["policy", "best", "median", "vs eft"], rows)


def _kind(doc: dict[str, Any]) -> Callable[[dict[str, Any]], list[str]] | None:
    kind = doc.get("benchmark")
    if kind == "comm" or ("rows" in doc and "op" in doc):
        return _comm
    if kind == "kernels" or ("results" in doc and "launch" in doc):
        return _kernels
    if kind == "memory":
        return _memory
    if "latency_us" in doc:
        return _sched
    if "policies" in doc:
        return _makespan
    return None


def report(folder: Path) -> str:
    """Return the Markdown of every bench JSON file in ``folder`` (sorted by name)."""
    out = [
        "## hal bench report",
        "",
        "Every ratio is hal time / baseline time: below 1, hal is faster. Measured on a shared machine: "
        "the load average beside each table says how loaded it was.",
        "",
    ]
    for path in sorted(folder.glob("*.json")):
        try:
            doc = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            out += [f"{path.name}: unreadable ({exc})", ""]
            continue
        make = _kind(doc) if isinstance(doc, dict) else None
        if make is None:
            continue
        out += [*make(doc), ""]
        method = _method(doc)
        if method:
            out += [method, ""]
        out += [f"(from {path.name})", ""]
    return "\n".join(out)
