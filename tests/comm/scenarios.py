"""Small rank programs for the failure tests: ``python scenarios.py NAME`` under ``hal run``."""

from __future__ import annotations

import os
import signal
import sys
import time

import numpy as np

import hal
import hal.comm


def say(line: str) -> None:
    """Print ``line`` with one write (ranks share the launcher's stdout)."""
    os.write(1, (line + "\n").encode())


def main(name: str) -> int:
    """Run scenario ``name`` on this rank."""
    if name == "fail_rank1":  # rank 1 fails at once; rank 0 would run for a long time
        if os.environ["HAL_RANK"] == "1":
            print("rank 1 fails on purpose", file=sys.stderr)
            return 3
        time.sleep(120)
        return 0
    if name == "kill_rank1":  # rank 1 is killed by a signal
        if os.environ["HAL_RANK"] == "1":
            os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(120)
        return 0
    comm = hal.comm.init()
    dev = comm.device
    s = dev.create_stream()
    x = hal.asarray(np.arange(10, dtype=np.float32), device=dev)
    if name == "mismatch":
        try:
            if comm.rank == 0:
                comm.all_reduce(x, op="sum", stream=s).wait()
            else:
                y = hal.asarray(np.arange(12, dtype=np.float32), device=dev)
                comm.all_reduce(y, op="max", stream=s).wait()
        except hal.CommError as exc:
            say(f"rank {comm.rank} CommError ranks={exc.ranks}: {exc}")
            return 0
        return 1
    if name == "mismatch_collective":
        try:
            if comm.rank == 0:
                comm.broadcast(x, root=0, stream=s).wait()
            else:
                comm.all_reduce(x, stream=s).wait()
        except hal.CommError as exc:
            say(f"rank {comm.rank} CommError ranks={exc.ranks}: {exc}")
            return 0
        return 1
    if name == "stall":  # rank 1 stops answering (alive, never calls)
        comm.all_reduce(x, stream=s).wait()
        if comm.rank == 1:
            time.sleep(float(os.environ["HAL_COMM_TIMEOUT_MS"]) / 1e3 * 4)  # alive, silent
            return 0
        t0 = time.monotonic()
        try:
            comm.all_reduce(x, stream=s).wait()
        except hal.CommError as exc:
            say(
                f"rank 0 CommError after {time.monotonic() - t0:.2f}s op={exc.op} ranks={exc.ranks}: {exc}"
            )
            return 0
        return 1
    if name == "die":  # rank 1 dies between collectives
        comm.all_reduce(x, stream=s).wait()
        if comm.rank == 1:
            os._exit(0)
        try:
            comm.all_reduce(x, stream=s).wait()
        except hal.CommError as exc:
            say(f"rank 0 CommError ranks={exc.ranks}: {exc}")
            return 0
        return 1
    if name == "plan":  # print the plans of a small and a large all_reduce
        for n in (16, 1 << 20):
            y = hal.asarray(np.ones(n, np.float32), device=dev)
            w = comm.all_reduce(y, stream=s)
            w.wait()
            assert float(y.to_host()[0]) == comm.size
            if comm.rank == 0:
                say(str(w.plan))
        return 0
    raise SystemExit(f"unknown scenario {name!r}")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
