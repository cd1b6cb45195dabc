"""One rank of tests/comm/test_stream_order.py (``hal run -n N stream_order_worker.py``).

Every collective is followed, on the same stream and with no ``work.wait()``, by a
hal.kernels op reading its output and a copy to the host; ``s.synchronize()`` must then
show the result. Sizes below and above ``HAL_COMM_INLINE_BYTES`` (inline and engine
paths). Prints ``OK <checks>``, or the failures and exits 1.
"""

from __future__ import annotations

import sys

import numpy as np

import hal
import hal.comm
import hal.kernels as hk


def main() -> int:
    """Run the checks on this rank."""
    comm = hal.comm.init()
    r, n, dev = comm.rank, comm.size, comm.device
    s = dev.create_stream()
    failures: list[str] = []
    checks = 0
    # 200_003: above 1 MiB; 600_011: above 4 MiB; 2_100_007: above the native engine's 16 MiB
    # inline (its engine thread)
    for count in (5, 1 << 15, 100_003, 200_003, 600_011, 2_100_007):
        for rnd in range(3):
            a = hal.asarray(np.full(count, r + 1 + rnd, np.float64), device=dev)
            out = hal.asarray(np.zeros(count, np.float64), device=dev)
            host = np.zeros(count, np.float64)
            comm.all_reduce(a, op="sum", stream=s)
            hk.scale(a, 0.5, out=out, stream=s)
            hal.copy(host, out, stream=s)
            s.synchronize()
            want = 0.5 * sum(k + 1 + rnd for k in range(n))
            checks += 1
            if not (host == want).all():
                failures.append(f"all_reduce count={count} round {rnd}: {host[:3]} != {want}")
            b = hal.asarray(np.full(count, float(r), np.float64), device=dev)
            comm.broadcast(b, root=n - 1, stream=s)
            hk.scale(b, 2.0, out=out, stream=s)
            hal.copy(host, out, stream=s)
            s.synchronize()
            checks += 1
            if not (host == 2.0 * (n - 1)).all():
                failures.append(
                    f"broadcast count={count} round {rnd}: {host[:3]} != {2.0 * (n - 1)}"
                )
            g = hal.asarray(np.zeros(n * count, np.float64), device=dev)
            comm.all_gather(hal.asarray(np.full(count, r + 10.0), device=dev), g, stream=s)
            whole = np.zeros(n * count, np.float64)
            hk.scale(g, 1.0, out=g, stream=s)
            hal.copy(whole, g, stream=s)
            s.synchronize()
            checks += 1
            if not (whole == np.repeat(np.arange(n) + 10.0, count)).all():
                failures.append(f"all_gather count={count} round {rnd}: {whole[::count]}")
    comm.barrier(stream=s)
    s.synchronize()
    comm.close()
    if failures:
        print(f"rank {r}:\n" + "\n".join(failures[:20]), file=sys.stderr)
        return 1
    print(f"OK {checks} rank={r} transport={comm.transport}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
