"""``hal bench comm``: hal.comm collectives with nccl-tests columns, optionally beside mpi4py or torch gloo."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from pathlib import Path
from typing import Any

__all__ = ["add_command", "run"]


def add_command(benches: Any) -> None:
    """Add ``comm`` to the ``hal bench`` subcommands."""
    from hal.cli.bench import parse_size, positive_int

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
        return run(args)

    p.set_defaults(func=_run)


def _format(result: dict[str, Any], baseline: str | None) -> str:
    from hal.cli.bench import format_size

    label = {"mpi": "mpi4py", "gloo": "  gloo"}.get(baseline or "", "")
    lines = [
        f"# hal bench comm: {result['op']}, {result['ranks']} ranks, transport {result['transport']}"
        + (f", collective provider {result['provider']}" if result.get("provider") else ""),
        "#                                              out-of-place                       in-place"
        + (f"                  {label}" if baseline else ""),
        "#        size       count    type  redop     time   algbw   busbw #wrong     time   algbw   busbw #wrong"
        + ("      time   busbw  ratio" if baseline else ""),
        "#         (B)  (elements)                    (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)"
        + ("       (us)  (GB/s)" if baseline else ""),
    ]
    for row in result["rows"]:
        line = f"{row['size']:>13} {row['count']:>11} {row['type']:>7} {row['redop']:>6}"
        for tag in ("oop", "inplace"):
            line += f" {row[tag + '_time_us']:>8.1f} {row[tag + '_algbw']:>7.2f} {row[tag + '_busbw']:>7.2f} {row[tag + '_wrong']:>6}"
        if baseline:
            line += f" {row[baseline + '_time_us']:>9.1f} {row[baseline + '_busbw']:>7.2f} {row['ratio']:>6.2f}"
        lines.append(line + f"   ({format_size(row['size'])})")
    ddp = result.get("ddp")
    if ddp:
        lines.append(
            f"# DDP step (examples/ddp_torch.py: MLP of {ddp['params']} parameters, batch {ddp['batch']}, "
            f"{ddp['ranks']} ranks, mean of {ddp['steps']} steps): hal {ddp['hal_step_ms']:.2f} ms, "
            f"gloo {ddp['gloo_step_ms']:.2f} ms (hal/gloo {ddp['ratio']:.2f}x)"
        )
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    """Run ``hal bench comm`` (launch the ranks, collect rank 0's result, print it)."""
    import tempfile

    from hal.cli._run import launch

    provider = getattr(args, "provider", "generic")
    # hal's own algorithms unless asked (under mpiexec the mpi provider would take the calls)
    os.environ["HAL_COMM_PROVIDER"] = "" if provider == "auto" else provider
    with tempfile.TemporaryDirectory(prefix="hal-bench-comm-") as tmp:
        out = os.path.join(tmp, "result.json")
        worker = [
            sys.executable,
            "-m",
            "hal.cli.bench._comm_worker",
            "--op",
            args.op,
            "--min",
            str(args.min),
            "--max-bytes",
            str(args.max),
            "--dtype",
            args.dtype,
            "--redop",
            args.redop,
            "--out",
            out,
        ]
        if args.iters:
            worker += ["--iters", str(args.iters)]
        if args.baseline == "gloo":
            torchrun = shutil.which(
                "torchrun",
                path=os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""),
            )
            if torchrun is None:
                print(
                    "hal bench comm: --baseline gloo needs torch and its torchrun (pip install 'hal-sdk[torch]')",
                    file=sys.stderr,
                )
                return 2
            import subprocess

            launch_torch = [torchrun, "--standalone", f"--nproc_per_node={args.nranks}", "-m"]
            if getattr(args, "ddp_steps", 0):
                worker += ["--ddp-steps", str(args.ddp_steps)]
            code = subprocess.run(
                [*launch_torch, *worker[2:], "--baseline", "gloo"], check=False
            ).returncode
            msg = "" if code == 0 else f"torchrun exited with code {code}"
        elif args.baseline == "mpi":
            worker += ["--baseline", "mpi"]
            mpiexec = shutil.which(
                "mpiexec",
                path=os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""),
            )
            if mpiexec is None:
                print(
                    "hal bench comm: --baseline mpi needs mpiexec and mpi4py (pip install 'hal-sdk[mpi]')",
                    file=sys.stderr,
                )
                return 2
            import subprocess

            code = subprocess.run(
                [mpiexec, "-n", str(args.nranks), *worker], check=False
            ).returncode
            msg = "" if code == 0 else f"mpiexec exited with code {code}"
        else:
            code, msg = launch(args.nranks, worker)
        if code != 0:
            print(f"hal bench comm: {msg}", file=sys.stderr)
            return code
        result = json.loads(Path(out).read_text())
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(_format(result, args.baseline))
    return 0
