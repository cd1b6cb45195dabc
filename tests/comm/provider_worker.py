"""One rank for tests/comm/test_providers.py (under mpiexec or ``hal run``).

Runs the collective matrix (tests/comm/matrix.py) once per ``HAL_COMM_PROVIDER`` setting given,
then the same float32 calls on random data under each, and checks that every setting gave the
same results. Prints ``OK <checks> provider=<name> served=<calls the provider ran>
fallbacks=<calls that fell back> rank=<rank>`` per setting, the failures and exit code 1 otherwise.
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import matrix
import numpy as np

import hal
import hal.comm
from hal.comm._algorithms import split


def random_calls(comm: hal.comm.Communicator) -> list[np.ndarray]:
    """all_reduce, reduce_scatter, all_gather, broadcast, reduce, all_to_all of random float32 data."""
    rng = np.random.default_rng([7, comm.rank])
    s = comm.device.create_stream()
    n = 6 * comm.size + 1
    out = []
    x = hal.asarray(rng.standard_normal(n).astype(np.float32), device=comm.device)
    comm.all_reduce(x, op="sum", stream=s).wait()
    out.append(x.to_host())
    x2 = hal.asarray(rng.standard_normal(n).astype(np.float32), device=comm.device)
    comm.reduce_scatter(x2, op="max", stream=s).wait()
    start, length = split(n, comm.size)[comm.rank]
    out.append(x2.to_host()[start : start + length])  # the rest of send is scratch space
    g = hal.asarray(np.zeros(3 * comm.size, np.float32), device=comm.device)
    mine = hal.asarray(rng.standard_normal(3).astype(np.float32), device=comm.device)
    comm.all_gather(mine, g, stream=s).wait()
    out.append(g.to_host())
    b = hal.asarray(rng.standard_normal(n).astype(np.float32), device=comm.device)
    comm.broadcast(b, root=comm.size - 1, stream=s).wait()
    out.append(b.to_host())
    r = hal.asarray(rng.standard_normal(n).astype(np.float32), device=comm.device)
    comm.reduce(r, op="avg", root=0, stream=s).wait()
    out.append(r.to_host())
    a = hal.asarray(rng.standard_normal(2 * comm.size).astype(np.float32), device=comm.device)
    comm.all_to_all(a, stream=s).wait()
    out.append(a.to_host())
    comm.barrier().wait()
    return out


def main() -> int:
    """Run on this rank."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--providers", default="generic,mpi")
    ap.add_argument("--sizes", default="0,1,13")
    ap.add_argument("--dtypes", default="float32,int32,float64")
    args = ap.parse_args()
    failures: list[str] = []
    results: dict[str, list[np.ndarray]] = {}
    for name in args.providers.split(","):
        os.environ["HAL_COMM_PROVIDER"] = name
        comm = hal.comm.init()
        try:
            n, f = matrix.run(
                comm,
                sizes=tuple(int(x) for x in args.sizes.split(",")),
                dtypes=tuple(args.dtypes.split(",")),
            )
            failures += [f"[{name}] {x}" for x in f]
            results[name] = random_calls(comm)
            plans = comm.plans
            served = sum(p.provider == comm.provider != "generic" for p in plans)
            fell = sum(bool(p.fallback) for p in plans)
            print(
                f"OK {n} provider={comm.provider} served={served} fallbacks={fell} rank={comm.rank}",
                flush=True,
            )
        finally:
            comm.close()
    names = list(results)
    for other in names[1:]:
        for i, (a, b) in enumerate(zip(results[names[0]], results[other], strict=True)):
            if not np.allclose(a, b, rtol=1e-5, atol=1e-6):
                failures.append(f"random call {i}: {names[0]} gave {a}, {other} gave {b}")
    if failures:
        print("\n".join(failures[:40]), file=sys.stderr)
        return 1
    print(f"SAME {','.join(names)} rank={comm.rank}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
