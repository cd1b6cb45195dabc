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
from typing import Any

__all__ = ["BENCHMARK_MODULES", "add_commands", "format_size", "parse_size", "positive_int"]

#: Modules defining ``add_command(subparsers)``, one per ``hal bench`` subcommand.
BENCHMARK_MODULES: tuple[str, ...] = (
    "hal.cli.bench._memory",
    "hal.cli.bench._kernels",
    "hal.cli.bench._comm",
    "hal.cli.bench._sched",
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
