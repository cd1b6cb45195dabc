"""The ``hal`` command line. Starts fast: vendor SDKs load only when a backend is probed.

The CLI is the application layer: unlike hal core it may import ``hal.comm``,
``hal.kernels`` and ``hal.conformance`` (lazily, inside the subcommand that needs them).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from hal._errors import HalError
from hal.cli import (
    _conformance,
    _doctor,
    _info,
    _kernels,
    _memory,
    _run,
    _simulate,
    _topo,
    _trace,
    bench,
)
from hal.cli._run import run_ranks

__all__ = ["build_parser", "main", "run_ranks"]


def build_parser() -> argparse.ArgumentParser:
    """Return the argument parser of the ``hal`` command."""
    parser = argparse.ArgumentParser(
        prog="hal", description="hal-sdk: a narrow hardware abstraction layer."
    )
    parser.add_argument("--version", action="store_true", help="print the hal-sdk version and exit")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    _info.add_commands(sub)
    _doctor.add_commands(sub)
    _conformance.add_commands(sub)
    bench.add_commands(sub)
    _kernels.add_commands(sub)
    _memory.add_commands(sub)
    _run.add_commands(sub)
    _trace.add_commands(sub)
    _topo.add_commands(sub)
    _simulate.add_commands(sub)
    from hal.sched._top import add_commands as sched_commands  # `hal sched top`

    sched_commands(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``hal`` command; return its exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.version:
        from hal._version import __version__

        print(__version__)
        return 0
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except BrokenPipeError:  # pragma: no cover - `hal info | head`
        return 0
    except HalError as exc:
        print(f"hal {args.command}: error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
