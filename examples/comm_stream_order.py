"""Stream-ordered collectives: the work after an all_reduce on its stream sees the result, no wait().

::

    hal run -n 2 examples/comm_stream_order.py

Run directly (``python examples/comm_stream_order.py``), it launches itself with ``hal run -n 2``.
Each rank all-reduces its gradient on stream ``s``, enqueues a hal.kernels op on the same
stream that reads the result (an SGD step), copies the weights to the host, and calls only
``s.synchronize()``: the call occupies ``s`` like an NCCL collective, so the kernel starts
once the sum is in place. ``work.wait(stream=other)`` orders a second stream the same way.
"""

from __future__ import annotations

import sys

import numpy as np

RANKS, N = 2, 1 << 18


def main() -> None:
    """One rank's part."""
    import hal
    import hal.comm
    import hal.kernels as hk

    comm = hal.comm.init()
    r, p, dev = comm.rank, comm.size, comm.device
    s = dev.create_stream()
    grad = hal.asarray(np.full(N, r + 1.0, np.float32), device=dev)
    weights = hal.asarray(np.zeros(N, np.float32), device=dev)
    host = np.empty(N, np.float32)

    comm.all_reduce(grad, op="sum", stream=s)  # occupies s until the sum is in place
    hk.axpy(
        -0.1, grad, weights, stream=s
    )  # weights -= 0.1 * sum(grad): reads the all_reduce's output
    hal.copy(host, weights, stream=s)
    s.synchronize()  # no work.wait()
    want = -0.1 * sum(k + 1.0 for k in range(p))
    assert np.allclose(host, want), f"rank {r}: {host[:3]} != {want}"
    stepped = float(host[0])

    other = dev.create_stream()  # another stream waits for a call without blocking the host
    work = comm.all_reduce(grad, op="max", stream=s)
    work.wait(stream=other)
    hal.copy(host, grad, stream=other)
    other.synchronize()
    assert (host == host[0]).all() and host[0] == p * (p + 1) / 2, f"rank {r}: max gave {host[:3]}"
    print(
        f"rank {r}: SGD step after an all_reduce on the same stream, with no wait(): weights {stepped:.1f} "
        f"then max {host[0]:.0f} on another stream (transport {comm.transport})",
        flush=True,
    )
    other.close()
    s.close()
    comm.close()


def launch() -> int:
    """Run as a rank, or start 2 ranks of this script (``hal run -n 2``) when started directly."""
    from hal.cli import run_ranks

    return run_ranks(RANKS, main, __file__)


if __name__ == "__main__":
    sys.exit(launch())
