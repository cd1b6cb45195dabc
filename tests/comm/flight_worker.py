"""One rank of the flight-recorder / abort tests (started by ``hal run``): ``flight_worker.py SCENARIO``."""

from __future__ import annotations

import json
import os
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
    comm = hal.comm.init()
    dev = comm.device
    s = dev.create_stream()
    x = hal.asarray(np.ones(1 << 20, dtype=np.float32), device=dev)
    comm.all_reduce(x, op="sum", stream=s).wait()  # seq 1: every rank
    if name == "behind":  # rank 1 falls behind: it never calls the second all_reduce
        if comm.rank == 1:
            time.sleep(float(os.environ.get("BEHIND_S", "4")))
            comm.abort()
            say("rank 1 aborted")
            return 0
        try:
            comm.all_reduce(x, op="max", stream=s).wait()
        except hal.CommError as exc:
            rec = comm.flight_record()
            say(f"rank 0 CommError op={exc.op} ranks={exc.ranks}: {exc}")
            say(
                "RECORD "
                + json.dumps(
                    [(e["seq"], e["op"], e["state"], e["algorithm"], e["nbytes"]) for e in rec]
                )
            )
            comm.abort()
            return 0
        return 1
    if name == "abort":  # rank 0 aborts a call rank 1 never joins
        if comm.rank == 1:
            time.sleep(3)
            comm.abort()
            return 0
        # above the size a call runs inline on the caller's thread: queued, so abort() can fail it
        big = comm._engine.inline_bytes // 4 + 1024
        if big > x.size:
            x = hal.asarray(np.ones(big, dtype=np.float32), device=dev)
        work = comm.all_reduce(x, op="sum", stream=s)
        time.sleep(0.3)
        t0 = time.monotonic()
        comm.abort()
        try:
            work.wait()
        except hal.CommError as exc:
            rec = comm.flight_record()
            say(f"rank 0 aborted in {time.monotonic() - t0:.2f}s: {exc}")
            say("RECORD " + json.dumps([(e["seq"], e["op"], e["state"]) for e in rec]))
            try:
                comm.all_reduce(x, op="sum", stream=s)
            except hal.CommError as exc2:
                say(f"after abort: {exc2}")
            return 0
        return 1
    if name in (
        "shrink",
        "shrink0",
    ):  # rank 2 (or 0) stalls; the others time out, shrink to 2 ranks, go on
        victim = 2 if name == "shrink" else 0
        if comm.rank == victim:
            time.sleep(float(os.environ.get("STALL_S", "8")))
            comm.abort()
            return 0
        try:
            comm.all_reduce(x, op="sum", stream=s).wait()
            return 1
        except hal.CommError as exc:
            say(f"rank {comm.rank} CommError ranks={exc.ranks}: {exc}")
            new = comm.shrink(exclude=[victim])
        with new:
            y = hal.asarray(np.full(1001, new.rank + 1.0), device=new.device)
            new.all_reduce(y, op="sum", stream=s).wait()
            ok = bool(np.all(y.to_host() == 3.0))
            say(f"SHRUNK old={comm.rank} new={new.rank}/{new.size} ok={ok}")
            y.close()
        return 0
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
