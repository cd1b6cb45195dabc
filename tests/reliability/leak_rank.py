"""One rank of the leak test: ``hal run -n 2 leak_rank.py CYCLES``; prints ``LEAKS rank=R {json}``."""

from __future__ import annotations

import gc
import json
import os
import re
import sys
import threading
import time

import numpy as np

import hal
import hal.comm


def counts() -> dict[str, int]:
    """Return threads, open fds and this rank's /dev/shm segments (named with its pid).

    The rendezvous server of rank 0 serves each connection on a short-lived thread
    (``hal-comm-store-conn``) that ends when the other rank hangs up, a moment after its
    ``close()``: wait (bounded) for those to end first, so that a transient thread is not
    counted as a leak — one that never ends is still counted after the wait.
    """
    deadline = time.monotonic() + 5.0
    while time.monotonic() < deadline and any(
        t.name == "hal-comm-store-conn" for t in threading.enumerate()
    ):
        time.sleep(0.02)
    gc.collect()
    names = os.listdir("/dev/shm") if os.path.isdir("/dev/shm") else []
    me = re.compile(rf"hal-comm-[0-9a-f]+-\d+-{os.getpid()}(\.wake)?")  # this rank's segments
    shm = sum(bool(me.fullmatch(name)) for name in names)
    return {
        "threads": threading.active_count(),
        "fds": len(os.listdir("/proc/self/fd")),
        "shm": shm,
    }


def main(cycles: int) -> int:
    """Create, use and close ``cycles`` communicators; report counts before and after."""

    def one() -> None:
        comm = hal.comm.init()
        s = comm.device.create_stream()
        x = hal.asarray(np.ones(1 << 16, dtype=np.float32), device=comm.device)
        comm.all_reduce(x, op="sum", stream=s).wait()
        assert float(x.to_host()[0]) == comm.size
        x.close()
        s.close()
        comm.close()

    one()  # warm-up: the first communicator starts the rendezvous server (rank 0) for good
    mem = hal.devices()[0].memory_in_use
    before = counts()
    for _ in range(cycles):
        one()
    after = counts()
    rank = os.environ["HAL_RANK"]
    os.write(
        1,
        "LEAKS rank={} {}\n".format(
            rank,
            json.dumps(
                {"before": before, "after": after, "mem": [mem, hal.devices()[0].memory_in_use]}
            ),
        ).encode(),
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(int(sys.argv[1])))
