"""``hal bench comm``: hal.comm collectives with nccl-tests columns, beside MPICH, Open MPI or gloo.

The ranks run :mod:`hal.cli.bench._comm_worker` (its docstring gives the method). They are
started by ``hal run`` without a baseline; by the MPICH ``mpiexec`` of the ``mpi`` extra with
``--baseline mpi``; by Open MPI's ``mpirun`` with ``--baseline openmpi``, with mpi4py built
against Open MPI in its own virtual environment (:data:`OPENMPI_VENV_ENV`, default
:data:`DEFAULT_OPENMPI_VENV`) put first on the ranks' ``PYTHONPATH`` so that it does not clash
with the MPICH wheel of the main environment; by ``torchrun --standalone`` with
``--baseline gloo``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

__all__ = [
    "DEFAULT_OPENMPI_VENV",
    "OPENMPI_INSTALL",
    "OPENMPI_VENV_ENV",
    "add_command",
    "openmpi_launch",
    "run",
    "run_create",
]

#: Environment variable naming the virtual environment whose mpi4py is built against Open MPI.
OPENMPI_VENV_ENV = "HAL_BENCH_OPENMPI_VENV"
#: ... and its default.
DEFAULT_OPENMPI_VENV = "~/.cache/hal/openmpi-venv"
#: The commands that install what ``--baseline openmpi`` needs (``{venv}``: the venv's path).
OPENMPI_INSTALL = (
    "apt-get install -y openmpi-bin libopenmpi-dev",
    "python -m venv {venv}",
    "MPICC=/usr/bin/mpicc.openmpi {venv}/bin/pip install --no-binary mpi4py mpi4py",
)


def add_command(benches: Any) -> None:
    """Add ``comm`` to the ``hal bench`` subcommands."""
    from hal.cli.bench import parse_size, positive_int

    p = benches.add_parser(
        "comm",
        help="collectives across N local ranks (nccl-tests columns), optionally beside MPICH, Open MPI or gloo",
        description="Time a hal.comm collective across N ranks on this host for sizes from --min to --max "
        "(x2 steps): out-of-place and in-place time, algbw, busbw and #wrong, as nccl-tests prints them; "
        "with --baseline, the library's same collective interleaved with hal's, out of place against out of "
        "place and in place against in place (ratio = hal time / baseline time: < 1, hal faster).",
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
    p.add_argument(
        "-f",
        "--factor",
        type=_factor,
        default=2,
        help="size multiplier between rows, as nccl-tests' -f (default 2)",
    )
    p.add_argument("--dtype", default="float32", choices=["float32", "float64", "int32", "int64"])
    p.add_argument("--redop", default="sum", choices=["sum", "prod", "max", "min", "avg"])
    p.add_argument(
        "--iters", type=positive_int, default=0, help="iterations per batch (default: by size)"
    )
    p.add_argument(
        "--batches",
        type=positive_int,
        default=5,
        help="timed batches per side, interleaved with the baseline's; the best is kept (default 5)",
    )
    p.add_argument(
        "--baseline",
        choices=["mpi", "openmpi", "gloo"],
        default=None,
        help="also time the same collective in mpi4py over MPICH (mpi: ranks under the mpi extra's mpiexec), "
        "over Open MPI (openmpi: ranks under mpirun, mpi4py from --openmpi-venv) or in torch gloo (ranks "
        "under torchrun; also times a DDP training step on 'hal' and on gloo)",
    )
    p.add_argument(
        "--openmpi-venv",
        default=None,
        metavar="DIR",
        help=f"virtual environment with mpi4py built against Open MPI (default ${OPENMPI_VENV_ENV}, "
        f"else {DEFAULT_OPENMPI_VENV})",
    )
    p.add_argument(
        "--provider",
        default="generic",
        help="HAL_COMM_PROVIDER of the ranks: generic (hal's own algorithms, the default), nccl, mpi, a plugin's, "
        "or auto (what hal.comm.init picks)",
    )
    p.add_argument(
        "--transport",
        default=None,
        help="HAL_COMM_TRANSPORT of the ranks: shm, tcp, mpi (ranks under mpiexec: with --baseline mpi), ucx "
        "(UCX picks its own fabric: UCX_TLS, UCX_NET_DEVICES), a plugin's (default: shm on one host)",
    )
    p.add_argument(
        "--ddp-steps",
        type=positive_int,
        default=0,
        help="DDP steps timed with --baseline gloo (default 30)",
    )
    p.add_argument(
        "--ipc",
        action="store_true",
        help="also time hal.comm's direct intra-host IPC path (HAL_COMM_ALGO=OP:ipc; the CPU emulator needs "
        "HAL_CPU_IPC=1) interleaved with the slot path (then HAL_COMM_IPC=off): ipc_* fields, ipc/slot ratios",
    )
    p.add_argument(
        "--create",
        action="store_true",
        help="time instead hal.comm.create over --nranks devices of this process and close(): unused, "
        "and with one 4 KB all_reduce (what a framework's sub-group costs); no ranks are launched",
    )
    p.add_argument("--json", action="store_true", help="print JSON")

    def _run(args: argparse.Namespace) -> int:
        if getattr(args, "create", False):
            return run_create(args)
        if args.min > args.max:
            p.error(f"--min {args.min} is larger than --max {args.max}")
        return run(args)

    p.set_defaults(func=_run)


def _factor(text: str) -> int:
    """Parse ``--factor``: an integer >= 2 (argparse ``type``)."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 2:
        raise argparse.ArgumentTypeError(f"--factor {text!r} must be an integer >= 2")
    return value


def _format(result: dict[str, Any], baseline: str | None) -> str:
    from hal.cli.bench import RATIO, format_size, machine_line

    label = {"mpi": "mpi4py + MPICH", "openmpi": "mpi4py + Open MPI", "gloo": "torch gloo"}.get(
        baseline or "", baseline or ""
    )
    lines = [
        f"# hal bench comm: {result['op']}, {result['ranks']} ranks, transport {result['transport']}"
        + (f", rank 0 on {result['device']}" if result.get("device") else "")
        + (f", collective provider {result['provider']}" if result.get("provider") else ""),
    ]
    if "loadavg" in result:
        lines.append(
            "# " + machine_line(result["loadavg"], result["loadavg_end"], result["memcpy_GBps"])
        )
    if baseline:
        lines.append(f"# baseline: {label} ({result.get('baseline_library', '')}); ratio = {RATIO}")
    lines += [
        "#                                              out-of-place                       in-place"
        + (f"              {label:>22}" if baseline else ""),
        "#        size       count    type  redop     time   algbw   busbw #wrong     time   algbw   busbw #wrong"
        + ("  oop time ip time  ratio ip ratio" if baseline else ""),
        "#         (B)  (elements)                    (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)"
        + ("      (us)    (us)" if baseline else ""),
    ]
    for row in result["rows"]:
        line = f"{row['size']:>13} {row['count']:>11} {row['type']:>7} {row['redop']:>6}"
        for tag in ("oop", "inplace"):
            line += (
                f" {row[tag + '_time_us']:>8.1f} {row[tag + '_algbw']:>7.2f} {row[tag + '_busbw']:>7.2f}"
                f" {row[tag + '_wrong']:>6}"
            )
        if baseline:
            line += (
                f" {row[baseline + '_time_us']:>9.1f} {row[baseline + '_inplace_time_us']:>7.1f}"
                f" {row['ratio']:>6.2f} {row['inplace_ratio']:>8.2f}"
            )
        lines.append(line + f"   ({format_size(row['size'])})")
    if any("ipc_time_us" in row for row in result["rows"]):  # hal bench comm --ipc
        lines.append(
            f"# ipc path (algorithm {result.get('ipc_algorithm', '?')}) beside the slot path above "
            "(HAL_COMM_IPC=off); ipc/slot < 1: ipc faster"
            + (f"; ipc/{label} the same against the baseline" if baseline else "")
        )
        for row in result["rows"]:
            line = (
                f"# {row['size']:>11} ipc oop {row['ipc_time_us']:>9.1f} us  ip {row['ipc_inplace_time_us']:>9.1f} us"
                f"  #wrong {row['ipc_wrong']}  ipc/slot oop {row['ipc_ratio']:.2f} ip {row['ipc_inplace_ratio']:.2f}"
            )
            if baseline:
                line += (
                    f"  ipc/{baseline} oop {row['ipc_time_us'] / row[baseline + '_time_us']:.2f}"
                    f" ip {row['ipc_inplace_time_us'] / row[baseline + '_inplace_time_us']:.2f}"
                )
            lines.append(line)
    ddp = result.get("ddp")
    if ddp:
        lines.append(
            f"# DDP step (examples/ddp_torch.py: MLP of {ddp['params']} parameters, batch {ddp['batch']}, "
            f"{ddp['ranks']} ranks, mean of {ddp['steps']} steps): hal {ddp['hal_step_ms']:.2f} ms, "
            f"gloo {ddp['gloo_step_ms']:.2f} ms (hal/gloo {ddp['ratio']:.2f}x)"
        )
    return "\n".join(lines)


def _which(name: str) -> str | None:
    """``name`` on this interpreter's bin directory first, then ``PATH``."""
    return shutil.which(
        name, path=os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")
    )


def openmpi_launch(venv: str | None = None) -> tuple[list[str], dict[str, str]] | str:
    """Return ``(mpirun command prefix, environment)`` for ranks under Open MPI, or why not.

    ``venv`` (else ``$HAL_BENCH_OPENMPI_VENV``, else ``~/.cache/hal/openmpi-venv``) must hold
    mpi4py built against Open MPI for this interpreter's Python version; its site-packages go
    first on the ranks' ``PYTHONPATH``. The environment allows Open MPI to run as root
    (``OMPI_ALLOW_RUN_AS_ROOT=1``, ``OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1``). The reason string,
    when something is missing, ends with the exact commands that install it.
    """
    from hal.spi import setting

    path = Path(os.path.expanduser(venv or setting(OPENMPI_VENV_ENV) or DEFAULT_OPENMPI_VENV))
    install = "\n".join(f"  {c.format(venv=path)}" for c in OPENMPI_INSTALL)
    how = f"; install it with:\n{install}"
    mpirun = shutil.which("mpirun.openmpi") or shutil.which("mpiexec.openmpi")
    if mpirun is None:
        return "--baseline openmpi needs Open MPI's mpirun (mpirun.openmpi not found)" + how
    python = path / "bin" / "python"
    if not python.exists():
        return (
            f"--baseline openmpi needs mpi4py built against Open MPI in the venv {path} (not found)"
            + how
        )
    probe = (
        "import sys, os, mpi4py; mpi4py.rc.initialize = False; from mpi4py import MPI; "
        "print(os.path.dirname(os.path.dirname(mpi4py.__file__))); "
        "print('%d.%d' % sys.version_info[:2]); print(MPI.Get_library_version().splitlines()[0])"
    )
    proc = subprocess.run([str(python), "-c", probe], capture_output=True, text=True, check=False)
    lines = proc.stdout.splitlines()
    if proc.returncode != 0 or len(lines) < 3:
        why = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        return f"--baseline openmpi: mpi4py in {path} does not load ({why})" + how
    site, version, library = lines[0], lines[1], lines[2]
    if "Open MPI" not in library:
        return (
            f"--baseline openmpi: mpi4py in {path} is built against {library!r}, not Open MPI" + how
        )
    mine = f"{sys.version_info[0]}.{sys.version_info[1]}"
    if version != mine:
        return (
            f"--baseline openmpi: the venv {path} is Python {version}, this interpreter {mine}"
            + how
        )
    env = {
        "PYTHONPATH": os.pathsep.join(x for x in (site, os.environ.get("PYTHONPATH", "")) if x),
        "OMPI_ALLOW_RUN_AS_ROOT": "1",
        "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
    }
    # --oversubscribe: more ranks than cores is what the 4-rank rows ask for on a 2-core machine
    return [mpirun, "--oversubscribe"], env


def run_create(args: argparse.Namespace) -> int:
    """Run ``hal bench comm --create``: the cost of ``hal.comm.create(devices)`` + ``close()`` in this process.

    Two timings per batch of ``--iters`` cycles (default 500), the best of ``--batches`` kept:
    ``create_close_us``, a communicator never called; ``cycle_us``, create, one 4 KB all_reduce
    (``--redop``, float32) and close, as tests/reliability/test_leaks.py runs 10,000 times.
    """
    import time

    import numpy as np

    import hal
    import hal.comm
    from hal.cli.bench import loadavg

    devs = hal.devices()
    devs = [d for d in devs if devs and d.backend == devs[0].backend][: args.nranks]
    if len(devs) < args.nranks:
        print(
            f"hal bench comm --create: {args.nranks} devices wanted, {len(devs)} found "
            "(HAL_CPU_DEVICES sets the CPU emulator's count)",
            file=sys.stderr,
        )
        return 1
    iters = args.iters or 500
    streams = [d.create_stream() for d in devs]
    xs = [hal.asarray(np.ones(1024, np.float32), device=d) for d in devs]
    load = loadavg()
    best = {"create_close_us": float("inf"), "cycle_us": float("inf")}
    try:
        for _ in range(args.batches):
            t = time.perf_counter()
            for _ in range(iters):
                hal.comm.create(devs).close()
            best["create_close_us"] = min(
                best["create_close_us"], (time.perf_counter() - t) / iters * 1e6
            )
            t = time.perf_counter()
            for _ in range(iters):
                with hal.comm.create(devs) as comm:
                    comm.all_reduce(xs, op=args.redop, streams=streams).wait()
            best["cycle_us"] = min(best["cycle_us"], (time.perf_counter() - t) / iters * 1e6)
    finally:
        for x in xs:
            x.close()
        for s in streams:
            s.close()
    result = {
        "devices": [str(d) for d in devs],
        "iters": iters,
        "batches": args.batches,
        "loadavg": load,
        "loadavg_end": loadavg(),
        **{k: round(v, 1) for k, v in best.items()},
    }
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(
            f"# hal bench comm --create: {len(devs)} devices ({', '.join(result['devices'])}), best of "
            f"{args.batches} batches of {iters}; load average {load[0]:.2f} at start, "
            f"{result['loadavg_end'][0]:.2f} at end ({os.cpu_count()} cores)\n"
            f"create + close (unused)            {result['create_close_us']:>10.1f} us\n"
            f"create + all_reduce 4 KB + close   {result['cycle_us']:>10.1f} us"
        )
    return 0


def _worker_command(args: argparse.Namespace, out: str) -> list[str]:
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
        "--batches",
        str(getattr(args, "batches", 5)),
        "--factor",
        str(getattr(args, "factor", 2)),
        "--out",
        out,
    ]
    if args.iters:
        worker += ["--iters", str(args.iters)]
    if getattr(args, "ipc", False):
        worker += ["--ipc"]
    return worker


def run(args: argparse.Namespace) -> int:
    """Run ``hal bench comm`` (launch the ranks, collect rank 0's result, print it)."""
    import tempfile

    from hal.cli._run import launch

    provider = getattr(args, "provider", "generic")
    # hal's own algorithms unless asked (under mpiexec the mpi provider would take the calls)
    os.environ["HAL_COMM_PROVIDER"] = "" if provider == "auto" else provider
    if getattr(args, "transport", None):
        from hal.comm._init import transports

        try:
            cls = transports().get(args.transport)
        except ValueError as exc:
            print(f"hal bench comm: --transport: {exc}", file=sys.stderr)
            return 2
        why = cls.missing()
        if why is not None:
            print(f"hal bench comm: --transport {args.transport}: {why}", file=sys.stderr)
            return 2
        os.environ["HAL_COMM_TRANSPORT"] = args.transport
    with tempfile.TemporaryDirectory(prefix="hal-bench-comm-") as tmp:
        out = os.path.join(tmp, "result.json")
        worker = _worker_command(args, out)
        if args.baseline == "gloo":
            torchrun = _which("torchrun")
            if torchrun is None:
                print(
                    "hal bench comm: --baseline gloo needs torch and its torchrun (pip install 'hal-sdk[torch]')",
                    file=sys.stderr,
                )
                return 2
            launch_torch = [torchrun, "--standalone", f"--nproc_per_node={args.nranks}", "-m"]
            if getattr(args, "ddp_steps", 0):
                worker += ["--ddp-steps", str(args.ddp_steps)]
            code = subprocess.run(
                [*launch_torch, *worker[2:], "--baseline", "gloo"], check=False
            ).returncode
            msg = "" if code == 0 else f"torchrun exited with code {code}"
        elif args.baseline == "mpi":
            mpiexec = _which("mpiexec")
            if mpiexec is None:
                print(
                    "hal bench comm: --baseline mpi needs mpiexec and mpi4py (pip install 'hal-sdk[mpi]')",
                    file=sys.stderr,
                )
                return 2
            code = subprocess.run(
                [mpiexec, "-n", str(args.nranks), *worker, "--baseline", "mpi"],
                stdin=subprocess.DEVNULL,  # mpiexec forwards stdin to rank 0: keep the caller's
                check=False,
            ).returncode
            msg = "" if code == 0 else f"mpiexec exited with code {code}"
        elif args.baseline == "openmpi":
            found = openmpi_launch(getattr(args, "openmpi_venv", None))
            if isinstance(found, str):
                print(f"hal bench comm: {found}", file=sys.stderr)
                return 2
            mpirun, env = found
            extra = ["--baseline", "mpi", "--baseline-name", "openmpi"]
            code = subprocess.run(
                [*mpirun, "-n", str(args.nranks), *worker, *extra],
                env={**os.environ, **env},
                stdin=subprocess.DEVNULL,
                check=False,
            ).returncode
            msg = "" if code == 0 else f"Open MPI's mpirun exited with code {code}"
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
