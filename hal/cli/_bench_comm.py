"""``hal bench comm``: hal.comm collectives with nccl-tests columns, optionally beside mpi4py or torch gloo."""

from __future__ import annotations

import argparse
from typing import Any

__all__ = ["add_command"]


def add_command(benches: Any) -> None:
    """Add ``comm`` to the ``hal bench`` subcommands."""
    from hal.cli._bench import parse_size, positive_int

    p = benches.add_parser(
        "comm",
        help="collectives across N local ranks (nccl-tests columns), optionally beside mpi4py or gloo",
        description="Time a hal.comm collective across N ranks on this host for sizes from --min to --max "
        "(x2 steps): out-of-place and in-place time, algbw, busbw and #wrong, as nccl-tests prints them.",
    )
    p.add_argument(
        "--op",
        default="all_reduce",
        choices=["all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce", "all_to_all"],
    )
    p.add_argument(
        "-n", "--nranks", type=positive_int, default=2, help="number of ranks (default 2)"
    )
    p.add_argument(
        "--min",
        type=parse_size,
        default=parse_size("1K"),
        help="smallest size in bytes (default 1K)",
    )
    p.add_argument(
        "--max",
        type=parse_size,
        default=parse_size("64M"),
        help="largest size in bytes (default 64M)",
    )
    p.add_argument("--dtype", default="float32", choices=["float32", "float64", "int32", "int64"])
    p.add_argument("--redop", default="sum", choices=["sum", "prod", "max", "min", "avg"])
    p.add_argument(
        "--iters", type=positive_int, default=0, help="iterations per size (default: by size)"
    )
    p.add_argument(
        "--baseline",
        choices=["mpi", "gloo"],
        default=None,
        help="also time mpi4py's (ranks under mpiexec) or torch gloo's (ranks under torchrun) collective on the "
        "same data; gloo also times a DDP training step on 'hal' and on gloo",
    )
    p.add_argument(
        "--provider",
        default="generic",
        help="HAL_COMM_PROVIDER of the ranks: generic (hal's own algorithms, the default), nccl, mpi, a plugin's, "
        "or auto (what hal.comm.init picks)",
    )
    p.add_argument(
        "--ddp-steps",
        type=positive_int,
        default=0,
        help="DDP steps timed with --baseline gloo (default 30)",
    )
    p.add_argument("--json", action="store_true", help="print JSON")

    def _run(args: argparse.Namespace) -> int:
        if args.min > args.max:
            p.error(f"--min {args.min} is larger than --max {args.max}")
        from hal.comm._bench import run

        return run(args)

    p.set_defaults(func=_run)
