"""One rank of the topology tests (started by ``hal run``): ``topo_worker.py SCENARIO``.

``plan SIZES``: all_reduce of each size with the planner's choice, checked against NumPy;
prints ``OK rank=R algos=A,B,... hosts=H hash=X``.
``sockets N``: one all_reduce of N float32 over TCP; prints the bytes per socket per peer.
``disagree``: rank 1 uses another HAL_TOPO_FILE (``HAL_TOPO_FILE_RANK1``); prints the CommError.
"""

from __future__ import annotations

import json
import os
import sys

import numpy as np

import hal
import hal.comm


def say(line: str) -> None:
    """Print ``line`` with one write (ranks share the launcher's stdout)."""
    os.write(1, (line + "\n").encode())


def main(args: list[str]) -> int:
    """Run one scenario on this rank."""
    name = args[0]
    if name == "disagree":
        if os.environ["HAL_RANK"] == "1":
            os.environ["HAL_TOPO_FILE"] = os.environ["HAL_TOPO_FILE_RANK1"]
        try:
            hal.comm.init().close()
        except hal.CommError as exc:
            say(f"rank {os.environ['HAL_RANK']} CommError op={exc.op} ranks={exc.ranks}: {exc}")
            return 0
        return 1
    comm = hal.comm.init()
    if name == "sockets":  # one large all_reduce; report how the bytes spread over the sockets
        try:
            x = hal.asarray(np.ones(int(args[1]), dtype=np.float32), device=comm.device)
            s = comm.device.create_stream()
            comm.all_reduce(x, op="sum", stream=s).wait()
            ok = bool(np.all(x.to_host() == comm.size))
            tr = comm._engine.transport
            say(
                f"SOCKETS rank={comm.rank} ok={ok} iface={getattr(tr, 'interface', None)} "
                f"bytes={json.dumps(tr.socket_bytes())}"
            )
            x.close()
        finally:
            comm.close()
        return 0
    try:
        dev = comm.device
        s = dev.create_stream()
        algos = []
        for n in (int(x) for x in args[1].split(",")):
            rng = np.random.default_rng(n)
            data = [rng.integers(-50, 50, n).astype(np.float64) for _ in range(comm.size)]
            x = hal.asarray(data[comm.rank], device=dev)
            comm.all_reduce(x, op="sum", stream=s).wait()
            got = x.to_host()
            want = np.sum(data, axis=0)
            if not np.array_equal(got, want):
                say(
                    f"rank {comm.rank} WRONG n={n} algo={comm.last_plan.algorithm if comm.last_plan else None}"
                )
                return 1
            plan = comm.last_plan
            assert plan is not None
            algos.append(plan.algorithm)
            x.close()
        say(
            f"OK rank={comm.rank} algos={','.join(algos)} "
            f"hosts={comm.last_plan.hosts if comm.last_plan else 0} hash={comm.topology_hash}"
        )
    finally:
        comm.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
