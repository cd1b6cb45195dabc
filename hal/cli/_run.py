"""``hal run -n N script.py [args]``: launch N ranks of a script on this host (like torchrun).

Each rank gets ``HAL_RANK``, ``HAL_WORLD_SIZE``, ``HAL_LOCAL_RANK``, ``HAL_LOCAL_WORLD_SIZE``
and ``HAL_STORE_ADDR`` (rank 0 serves the rendezvous there), which :func:`hal.comm.init`
reads, and ``HAL_COMM_SECRET``, a fresh random job secret (unless ``HAL_COMM_SECRET`` or
``HAL_COMM_SECRET_FILE`` is set already) that every hello of the job must prove. If a rank
fails, the others are stopped and ``hal run`` exits with the failed rank's exit code and a
message naming it.

Hygiene:

- ranks die with their launcher: each is started with a parent-death signal (Linux
  ``prctl(PR_SET_PDEATHSIG, SIGKILL)``), so even a ``kill -9`` of ``hal run`` leaves no rank
  running as an orphan;
- ``OMP_NUM_THREADS=1`` for every rank when more than one rank runs and the variable is not
  set already (as torchrun does), so that N ranks do not each start one OpenMP thread per core;
- before starting, ``/dev/shm/hal-comm-*`` files of this user left by ranks that died during
  a shared-memory set-up (their process is gone) are removed.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

__all__ = ["add_commands", "launch", "run_ranks"]

_GRACE_S = 3.0
_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> Any:
    """Return a ``preexec_fn`` that makes the child receive SIGKILL when this process dies (Linux).

    None where ``prctl`` is not available (the ranks are then stopped only by a live ``hal run``).
    """
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    parent = os.getpid()

    def preexec() -> None:
        prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
        if os.getppid() != parent:  # the launcher died between fork and prctl
            os._exit(128 + int(signal.SIGKILL))

    return preexec


def _remove_stale_shm() -> None:
    try:
        from hal.comm._shm import remove_stale_segments
    except ImportError:  # pragma: no cover - hal.comm not installed
        return
    remove_stale_segments()


#: ports after the store's that a job may listen on later: comm.shrink's new leader serves at
#: the store's port + the shrink count
_SHRINK_PORTS = 4


def _ephemeral_start() -> int:
    """The first port of the kernel's ephemeral range (Linux's default where it cannot be read)."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as fh:
            return int(fh.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def _bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _free_port() -> int:
    """A free port for the job's store, below the kernel's ephemeral range when it can be, with
    the next ``_SHRINK_PORTS`` free too.

    A port the kernel hands out (``bind(0)``) lies in the ephemeral range, where every outgoing
    connection of the host takes its local port: a later bind of that port + 1 (a shrink's
    rendezvous) then failed on a busy host, "the address is in use" with no listener to name.
    """
    lo = _ephemeral_start()
    if lo > 10_000 + 2 * _SHRINK_PORTS:
        for _ in range(64):
            port = random.randrange(10_000, lo - _SHRINK_PORTS)
            if all(_bindable(port + k) for k in range(_SHRINK_PORTS + 1)):
                return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _describe(code: int) -> str:
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"


def run_ranks(nranks: int, main: Callable[[], object], script: str) -> int:
    """Run ``main()`` as a rank, or start ``nranks`` ranks of ``script`` when it is started directly.

    For a script that launches itself (the examples: ``python examples/comm_p2p_ring.py``).
    Under ``hal run``, torchrun or mpiexec (``HAL_RANK``, ``RANK`` or ``PMI_RANK`` set), call
    ``main()`` and return 0; else run ``python script`` as ``nranks`` ranks as ``hal run -n``
    does (:func:`launch`), print the failing rank's message on stderr and return the exit code::

        if __name__ == "__main__":
            sys.exit(hal.cli.run_ranks(2, main, __file__))

    Args:
        nranks: ranks to start (>= 1).
        main: what one rank runs.
        script: the path of the script (``__file__``).
    """
    if "HAL_RANK" in os.environ or "RANK" in os.environ or "PMI_RANK" in os.environ:
        main()
        return 0
    code, msg = launch(nranks, [sys.executable, os.path.abspath(script)])
    if msg:
        print(msg, file=sys.stderr)
    return code


def launch(
    nranks: int,
    command: Sequence[str],
    *,
    env: dict[str, str] | None = None,
    port: int | None = None,
    stderr: Any = None,
) -> tuple[int, str]:
    """Run ``command`` as ``nranks`` ranks; return ``(exit code, message)``.

    The exit code is 0 when every rank succeeded, else that of the first rank to fail
    (128 + signal number for a rank killed by a signal); the message names that rank.
    """
    if nranks < 1:
        raise ValueError(f"-n {nranks}: the number of ranks must be >= 1")
    base = dict(os.environ if env is None else env)
    if nranks > 1 and "OMP_NUM_THREADS" not in base:
        base["OMP_NUM_THREADS"] = "1"  # like torchrun: N ranks x all cores would oversubscribe
    _remove_stale_shm()
    addr = f"127.0.0.1:{port or _free_port()}"
    if "HAL_COMM_SECRET" not in base and "HAL_COMM_SECRET_FILE" not in base:
        import secrets  # a fresh job secret: only these ranks can join (docs/security.md)

        base["HAL_COMM_SECRET"] = secrets.token_hex(32)
    preexec = _die_with_parent()
    procs: list[subprocess.Popen[bytes]] = []
    for rank in range(nranks):
        child = dict(base)
        child.update(
            HAL_RANK=str(rank),
            HAL_WORLD_SIZE=str(nranks),
            HAL_LOCAL_RANK=str(rank),
            HAL_LOCAL_WORLD_SIZE=str(nranks),
            HAL_STORE_ADDR=addr,
        )
        procs.append(subprocess.Popen(list(command), env=child, stderr=stderr, preexec_fn=preexec))
    failed: tuple[int, int] | None = None
    previous = None
    if threading.current_thread() is threading.main_thread():

        def _terminate(signum: int, frame: object) -> None:
            raise KeyboardInterrupt  # SIGTERM to hal run stops every rank too

        previous = signal.signal(signal.SIGTERM, _terminate)
    try:
        while True:
            running = False
            for rank, p in enumerate(procs):
                code = p.poll()
                if code is None:
                    running = True
                elif code != 0 and failed is None:
                    failed = (rank, code)
            if failed is not None or not running:
                break
            time.sleep(0.02)
    except KeyboardInterrupt:
        failed = failed or (-1, 130)
    finally:
        _stop(procs)
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
    if failed is None:
        return 0, ""
    rank, code = failed
    if rank < 0:
        return 130, "hal run: interrupted; stopped every rank"
    exit_code = code if code > 0 else 128 + (-code)
    others = [r for r in range(nranks) if r != rank]
    msg = f"hal run: rank {rank} {_describe(code)}"
    if others:
        msg += f"; stopped the other rank(s) {', '.join(map(str, others))}"
    return exit_code, msg


def _stop(procs: list[subprocess.Popen[bytes]]) -> None:
    live = [p for p in procs if p.poll() is None]
    for p in live:
        p.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + _GRACE_S
    for p in live:
        try:
            p.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def cmd_run(args: argparse.Namespace) -> int:
    """Run the ``hal run`` command."""
    script = list(args.script)
    if script[:1] == ["--"]:
        script = script[1:]
    if not script:
        print(
            "hal run: give a script (hal run -n 2 train.py [args]) or -m MODULE [args]",
            file=sys.stderr,
        )
        return 2
    if args.nranks < 1:
        print(f"hal run: -n {args.nranks}: the number of ranks must be >= 1", file=sys.stderr)
        return 2
    command = [sys.executable, "-m", *script] if args.module else [sys.executable, *script]
    code, msg = launch(args.nranks, command)
    if msg:
        print(msg, file=sys.stderr)
    return code


def add_commands(sub: Any) -> None:
    """Register ``hal run``."""
    p = sub.add_parser(
        "run",
        help="launch N ranks of a Python script on this host",
        description="Launch N ranks of a Python script on this host; hal.comm.init() connects them. "
        "If one rank fails the others are stopped and the exit code is the failed rank's.",
    )
    p.add_argument("-n", "--nranks", type=int, required=True, metavar="N", help="number of ranks")
    p.add_argument(
        "-m",
        dest="module",
        action="store_true",
        help="run a module (python -m MODULE [args]) instead of a script",
    )
    p.add_argument(
        "script", nargs=argparse.REMAINDER, help="script.py [args...] (or MODULE [args...] with -m)"
    )
    p.set_defaults(func=cmd_run)
