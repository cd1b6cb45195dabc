"""One rank of the multi-host tests, run as ``ip netns exec NS python rank.py SCENARIO``.

The harness (tests/multihost/conftest.py) sets HAL_RANK, HAL_WORLD_SIZE, HAL_STORE_ADDR (rank 0's
address in its namespace), HAL_COMM_TRANSPORT=tcp. Lines printed:

- ``OK rank=R calls=N``: every all_reduce matched NumPy;
- ``STARTED rank=R``: the first call completed (the harness injects its fault after this);
- ``ERROR rank=R op=OP ranks=(..) after=S: message``: a CommError, S seconds after the last
  completed call;
- ``REFUSED rank=R ranks=(..): message``: ``hal.comm.init()`` failed (exit code 3);
- ``SHRUNK rank=R new_rank=Q size=N ok=True``: scenario ``shrink``, after the error: the default
  ``comm.shrink()`` and an all_reduce on the survivors' communicator.
"""

from __future__ import annotations

import os
import sys
import threading
import time

import numpy as np

import hal
import hal.comm


def say(line: str) -> None:
    """Print ``line`` with one write."""
    os.write(1, (line + "\n").encode())


def _hog(stop: threading.Event) -> None:
    x = 0
    while not stop.is_set():  # pure-Python work: holds the GIL most of the time
        for i in range(20000):
            x += i * i


def main(scenario: str) -> int:
    """Run ``scenario`` (``ok``, ``loop``, ``slow``, ``shrink``) on this rank."""
    try:
        comm = hal.comm.init()
    except hal.CommError as exc:
        say(f"REFUSED rank={os.environ.get('HAL_RANK')} ranks={exc.ranks}: {exc}")
        return 3
    dev = comm.device
    s = dev.create_stream()
    n = int(os.environ.get("MH_COUNT", str(1 << 20)))
    calls = int(os.environ.get("MH_CALLS", "3"))
    victim = int(os.environ.get("MH_VICTIM", "-1"))
    stop = threading.Event()
    if scenario == "slow" and comm.rank == victim:
        threading.Thread(target=_hog, args=(stop,), daemon=True).start()
    last = time.monotonic()
    done = 0
    try:
        for i in range(calls):
            data = np.full(n, float(comm.rank + 1 + i), dtype=np.float32)
            x = hal.asarray(data, device=dev)
            comm.all_reduce(x, op="sum", stream=s).wait()
            want = sum(r + 1 + i for r in range(comm.size))
            if not np.all(x.to_host() == want):
                say(f"WRONG rank={comm.rank} call={i}")
                return 1
            x.close()
            done += 1
            last = time.monotonic()
            if i == 0:
                say(f"STARTED rank={comm.rank}")
        say(
            f"OK rank={comm.rank} calls={done} algo={comm.last_plan.algorithm if comm.last_plan else '-'}"
        )
        comm.close()
        return 0
    except hal.CommError as exc:
        say(
            f"ERROR rank={comm.rank} op={exc.op} ranks={exc.ranks} after={time.monotonic() - last:.2f}: {exc}"
        )
        if scenario == "shrink":  # at once, as a resilient job would: the default names the dead
            return _shrink(comm)
        time.sleep(
            float(os.environ.get("MH_LINGER_S", "3"))
        )  # keep sockets open while the others decide
        comm.abort()
        return 0
    finally:
        stop.set()


def _shrink(comm: hal.comm.Communicator) -> int:
    new = comm.shrink()
    s = new.device.create_stream()
    x = hal.asarray(np.full(1024, float(new.rank + 1), dtype=np.float32), device=new.device)
    new.all_reduce(x, op="sum", stream=s).wait()
    ok = bool(np.all(x.to_host() == sum(r + 1 for r in range(new.size))))
    say(f"SHRUNK rank={comm.rank} new_rank={new.rank} size={new.size} ok={ok}")
    new.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
