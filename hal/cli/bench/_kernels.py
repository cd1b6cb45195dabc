"""``hal bench kernels``: the command line of the kernel benchmark (the timing: ``_kernels_run``)."""

from __future__ import annotations

import argparse
import json
from typing import Any

from hal.cli._kernels import _friendly

__all__ = ["add_command", "cmd_bench"]


def add_command(benches: Any) -> None:
    """Add ``kernels`` to the ``hal bench`` subparsers."""
    p = benches.add_parser(
        "kernels",
        help="ops beside NumPy, torch (CPU) and a raw PyOpenCL program on the same data; launch latency",
    )
    p.add_argument("--backend", help="only this backend")
    p.add_argument(
        "--op",
        action="append",
        help="only this op (axpy, sum, softmax, layernorm, rmsnorm, matmul; repeatable)",
    )
    p.add_argument(
        "--size", action="append", type=int, help="element count (matmul: matrix order); repeatable"
    )
    p.add_argument(
        "--batches", type=int, default=3, help="timed batches, best one kept (default 3)"
    )
    p.add_argument(
        "--route",
        action="append",
        choices=["dedicated", "generic", "host"],
        help="only this hal route where the op has it (repeatable; default: every route)",
    )
    p.add_argument(
        "--launch",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="launch-latency rows (1-element axpy vs torch / raw PyOpenCL; default: on without --op)",
    )
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=cmd_bench)


@_friendly
def cmd_bench(args: argparse.Namespace) -> int:
    """Run ``hal bench kernels``."""
    from hal.cli.bench import RATIO, loadavg, machine_line, memcpy_bandwidth, method
    from hal.cli.bench._kernels_run import (
        BASELINE_TARGET,
        DEFAULT_SIZES,
        RAW_TARGET,
        TORCH_TARGET_OPS,
        bench,
        bench_launch,
    )

    sizes = None
    if args.size:
        sizes = {op: list(args.size) for op in DEFAULT_SIZES}
    load = loadavg()
    rows = bench(args.backend, ops=args.op, sizes=sizes, batches=args.batches, routes=args.route)
    launch = args.launch if args.launch is not None else not args.op
    lrows, notes = bench_launch(args.backend) if launch else ([], [])
    load_end = loadavg()
    memcpy = memcpy_bandwidth()
    if args.json:
        doc = {
            "benchmark": "kernels",
            "results": [r.to_dict() for r in rows],
            "launch": [r.to_dict() for r in lrows],
            "notes": notes,
            "loadavg": load,
            "loadavg_end": load_end,
            "memcpy_GBps": memcpy,
            "methodology": method(
                clock="time.perf_counter on the host around a batch of calls followed by a synchronize, "
                "for hal and every baseline (hal's device-event time of one batch: hal_event_ms, an extra "
                "column)",
                repetitions=f"{args.batches} batches per side, reps calls per batch (by size), after a "
                "warm-up call (compilation included)",
                statistic="the best batch's mean per call",
                interleaving="batch by batch: NumPy, BLAS, torch, raw PyOpenCL, then each hal route",
                placement="out of place (preallocated out=) on every side, except BLAS saxpy, which "
                "updates y in place (the same bytes moved)",
            ),
        }
        print(json.dumps(doc, indent=2))
        return 0

    def opt(v: float | None, fmt: str) -> str:
        return "-" if v is None else format(v, fmt)

    print(machine_line(load, load_end, memcpy))
    print(
        f"{'backend':8s} {'op':9s} {'size':>9s} {'impl':9s} {'hal ms':>9s} {'event ms':>9s} "
        f"{'numpy ms':>9s} {'hal/np':>6s} {'blas ms':>8s} {'hal/blas':>8s}"
        f" {'torch ms':>9s} {'hal/torch':>9s} {'raw ms':>8s} {'hal/raw':>7s}  target"
    )
    for r in rows:
        tgt = (
            ""
            if r.target is None
            else f"hal/np <= {r.target:g}: {'met' if r.meets_target else 'MISSED'}"
        )
        if (
            r.torch_ratio is not None
            and r.implementation == "dedicated"
            and r.op in TORCH_TARGET_OPS
        ):
            ok = r.torch_ratio <= BASELINE_TARGET
            tgt += f" hal/torch <= {BASELINE_TARGET:g}: {'met' if ok else 'MISSED'}"
        elif r.raw_ratio is not None:
            tgt += f" hal/raw <= {RAW_TARGET:g}: {'met' if r.raw_ratio <= RAW_TARGET else 'MISSED'}"
        print(
            f"{r.backend:8s} {r.op:9s} {r.size:>9d} {r.implementation:9s} {r.hal_ms:9.3f} "
            f"{opt(r.hal_event_ms, '9.3f')} {r.numpy_ms:9.3f} {r.ratio:6.2f} {opt(r.blas_ms, '8.3f')} "
            f"{opt(r.blas_ratio, '8.2f')} {opt(r.torch_ms, '9.3f')} {opt(r.torch_ratio, '9.2f')} "
            f"{opt(r.raw_ms, '8.3f')} {opt(r.raw_ratio, '7.2f')}  {tgt}"
        )
    print(f"every ratio = {RATIO}")
    if rows:
        print(f"method: {rows[-1].method}" if len({r.method for r in rows}) == 1 else "methods:")
        if len({r.method for r in rows}) > 1:
            for m in sorted({f"{r.backend} {r.op}: {r.method}" for r in rows}):
                print(f"  {m}")
    if lrows or notes:
        print()
        print(f"launch latency (load average {load_end[0]:.2f}):")
        print(
            f"{'backend':8s} {'hal us':>8s} {'baseline':14s} {'base us':>8s} {'ratio':>6s}  target"
        )
        for lr in lrows:
            verdict = "met" if lr.meets_target else "MISSED"
            print(
                f"{lr.backend:8s} {lr.hal_us:8.1f} {lr.baseline:14s} {lr.baseline_us:8.1f} "
                f"{lr.ratio:6.1f}  <= {lr.target:g}: {verdict}"
            )
        for lr in lrows:
            print(f"method ({lr.backend}): {lr.method}")
        for note in notes:
            print(f"note: {note}")
    return 0
