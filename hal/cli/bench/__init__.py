"""``hal bench``: benchmarks that put hal beside the raw vendor library, in the same run.

All benchmark code of hal-sdk lives in this package, the top (application) layer: the
layers below (``hal.comm``, ``hal.kernels``, ``hal.sched`` ...) never import it.
Each benchmark is a sub-subcommand (``hal bench memory`` ...) living in its own module
listed in :data:`BENCHMARK_MODULES`; the module defines ``add_command(subparsers)``.
Modules import NumPy, hal and vendor SDKs only inside the command they run (the heavy
parts live in separate modules: ``_kernels_run``, ``_comm_worker``, ``_ddp``), so that
``hal --help`` stays fast.
"""

from __future__ import annotations

import argparse
import importlib
import os
import time
from typing import Any

__all__ = [
    "BENCHMARK_MODULES",
    "RATIO",
    "add_commands",
    "format_size",
    "loadavg",
    "machine_line",
    "memcpy_bandwidth",
    "method",
    "parse_size",
    "positive_int",
]

#: The one ratio direction of every ``hal bench`` (JSON ``ratio`` fields and the tables).
RATIO = "hal time / baseline time (< 1: hal faster, > 1: hal slower)"

#: Modules defining ``add_command(subparsers)``, one per ``hal bench`` subcommand.
BENCHMARK_MODULES: tuple[str, ...] = (
    "hal.cli.bench._memory",
    "hal.cli.bench._kernels",
    "hal.cli.bench._comm",
    "hal.cli.bench._sched",
    "hal.cli.bench._report",
)

_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def parse_size(text: str) -> int:
    """Parse a byte count such as ``1024``, ``64K``, ``16M``, ``256MiB`` or ``1G``.

    Raises:
        argparse.ArgumentTypeError: ``text`` is not a positive size (argparse reports it).
    """
    raw = text.strip().upper().removesuffix("IB").removesuffix("B")
    unit = raw[-1:] if raw[-1:] in _UNITS else ""
    number = raw[: len(raw) - len(unit)]
    if not number.isdigit() or int(number) <= 0:
        raise argparse.ArgumentTypeError(
            f"size={text!r} must be a positive byte count like 1024, 64K, 16M"
        )
    return int(number) * _UNITS[unit]


def format_size(nbytes: int) -> str:
    """Return ``nbytes`` as ``"64 KiB"``, ``"16 MiB"`` ... (exact binary units when possible)."""
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= scale and nbytes % scale == 0:
            return f"{nbytes // scale} {unit}"
    return f"{nbytes} B"


def positive_int(text: str) -> int:
    """Parse a positive integer (argparse ``type``)."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} must be an integer >= 1")
    return value


def loadavg() -> list[float]:
    """Return the 1, 5 and 15 minute load averages (``os.getloadavg()``), rounded to 0.01."""
    return [round(x, 2) for x in os.getloadavg()]


def memcpy_bandwidth(nbytes: int = 64 << 20, repeat: int = 5) -> float:
    """Return this machine's host copy speed in GB/s: the physical limit of every bench here.

    ``numpy.copyto`` between two buffers of ``nbytes`` (allocated and touched first), the
    best of ``repeat`` copies timed with ``time.perf_counter``; GB/s counts the bytes copied
    (not read + written), as ``hal bench memory`` does.
    """
    import numpy as np

    src = np.ones(nbytes, np.uint8)
    dst = np.zeros(nbytes, np.uint8)
    np.copyto(dst, src)
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        np.copyto(dst, src)
        best = min(best, time.perf_counter() - t0)
    return nbytes / best / 1e9


def method(
    *,
    clock: str,
    repetitions: str,
    statistic: str,
    interleaving: str,
    placement: str = "",
    **extra: str,
) -> dict[str, str]:
    """Return the ``methodology`` section of a bench's JSON: how both sides were timed.

    Every ``hal bench`` prints one (``--json``): the clock (the same for hal and the
    baseline), the repetitions, the statistic kept, how hal and the baseline were
    interleaved, in place / out of place, and :data:`RATIO`.
    """
    out = {
        "clock": clock,
        "repetitions": repetitions,
        "statistic": statistic,
        "interleaving": interleaving,
        "ratio": RATIO,
    }
    if placement:
        out["placement"] = placement
    out.update(extra)
    return out


def machine_line(load_start: list[float], load_end: list[float], memcpy_GBps: float) -> str:
    """One line for a table's header: load average at start and end, and the memcpy limit."""
    return (
        f"load average {load_start[0]:.2f} at start, {load_end[0]:.2f} at end "
        f"({os.cpu_count()} cores, shared machine: timings move); "
        f"memcpy {memcpy_GBps:.1f} GB/s (numpy.copyto, 64 MiB: the physical limit)"
    )


def add_commands(sub: Any) -> None:
    """Add ``bench`` and its benchmarks (``bench memory`` ...) to the subparsers ``sub``."""
    parser = sub.add_parser(
        "bench", help="benchmarks: hal beside the raw vendor library, with ratios"
    )
    benches = parser.add_subparsers(dest="benchmark", metavar="BENCHMARK")
    for name in BENCHMARK_MODULES:
        importlib.import_module(name).add_command(benches)

    def _usage(args: argparse.Namespace) -> int:
        parser.print_help()
        return 2

    parser.set_defaults(func=_usage)
