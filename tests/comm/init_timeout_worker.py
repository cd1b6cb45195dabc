"""One rank of tests/comm/test_init_timeout.py: ``init_timeout_worker.py LATE_RANK LATE_S [stall]``.

Rank ``LATE_RANK`` sleeps ``LATE_S`` seconds before ``hal.comm.init()`` (``LATE_S`` < 0: it never
calls it and exits). The others print ``INIT-ERROR`` with the CommError when init fails. After
init every rank all_reduces; with ``stall``, the late rank then stays away from a second
all_reduce, which must fail on the others after the (short) collective timeout.
"""

from __future__ import annotations

import os
import sys
import time

import numpy as np

import hal
import hal.comm


def say(line: str) -> None:
    """Print ``line`` with one write (ranks share the launcher's stdout)."""
    os.write(1, (line + "\n").encode())


def main(late: int, late_s: float, stall: bool) -> int:
    """Run this rank (``HAL_RANK`` or torchrun's ``RANK``)."""
    rank = int(os.environ.get("HAL_RANK", os.environ.get("RANK", "0")))
    if rank == late:
        if late_s < 0:
            say(f"ABSENT rank={rank}")
            return 0
        time.sleep(late_s)
    try:
        comm = hal.comm.init()
    except hal.CommError as exc:
        say(f"INIT-ERROR rank={rank} op={exc.op} ranks={exc.ranks}: {exc}")
        return 0
    with comm:
        s = comm.device.create_stream()
        x = hal.asarray(np.full(1000, rank + 1.0, dtype=np.float32), device=comm.device)
        comm.all_reduce(x, op="sum", stream=s).wait()
        total = comm.size * (comm.size + 1) / 2
        say(f"OK rank={rank} sum_ok={bool(np.all(x.to_host() == total))}")
        if stall:
            if rank == late:
                time.sleep(float(os.environ["HAL_COMM_TIMEOUT_MS"]) / 1e3 * 2.5)  # alive, silent
                comm.abort()
                return 0
            try:
                comm.all_reduce(x, op="sum", stream=s).wait()
                say(f"STALL-NOT-DETECTED rank={rank}")
            except hal.CommError as exc:
                say(f"CALL-ERROR rank={rank} op={exc.op} ranks={exc.ranks}: {exc}")
        x.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(int(sys.argv[1]), float(sys.argv[2]), "stall" in sys.argv[3:]))
