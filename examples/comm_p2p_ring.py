"""Point-to-point with hal.comm: a ring pass and a halo exchange between 3 processes.

::

    hal run -n 3 examples/comm_p2p_ring.py

Run directly (``python examples/comm_p2p_ring.py``), it launches itself with ``hal run -n 3``.
Every rank posts its send to the next rank and its receive from the previous one before it
waits for either (what ring attention and pipeline stages do), then swaps edge cells with
both neighbours in one ``comm.group()``. Each rank checks what it received.
"""

from __future__ import annotations

import sys

import numpy as np

RANKS, N, HALO = 3, 1 << 20, 4


def main() -> None:
    """One rank's part."""
    import hal
    import hal.comm

    comm = hal.comm.init()
    r, p, dev = comm.rank, comm.size, comm.device
    s = dev.create_stream()
    nxt, prv = (r + 1) % p, (r - 1) % p

    # 1. ring: send to r+1 and receive from r-1, both posted before any wait
    mine = hal.asarray(np.full(N, r, np.float32), device=dev)
    got = hal.asarray(np.zeros(N, np.float32), device=dev)
    sent = comm.isend(mine, nxt, stream=s)
    recvd = comm.irecv(got, prv, stream=s)
    sent.wait()
    recvd.wait()
    assert (got.to_host() == prv).all(), f"rank {r}: ring received {got.to_host()[:3]}"

    # 2. halo exchange in a group: edges to both neighbours, tagged by direction
    field = np.arange(16, dtype=np.float64) + 100 * r
    left = hal.asarray(np.zeros(HALO), device=dev)
    right = hal.asarray(np.zeros(HALO), device=dev)
    with comm.group():
        works = [
            comm.isend(
                hal.asarray(field[:HALO], device=dev), prv, tag=0, stream=s
            ),  # my left edge goes left
            comm.isend(
                hal.asarray(field[-HALO:], device=dev), nxt, tag=1, stream=s
            ),  # my right edge goes right
            comm.irecv(left, prv, tag=1, stream=s),  # the left neighbour's right edge
            comm.irecv(right, nxt, tag=0, stream=s),  # the right neighbour's left edge
        ]
    for w in works:
        w.wait()
    assert (left.to_host() == np.arange(12, 16) + 100 * prv).all(), (
        f"rank {r}: left halo {left.to_host()}"
    )
    assert (right.to_host() == np.arange(0, 4) + 100 * nxt).all(), (
        f"rank {r}: right halo {right.to_host()}"
    )
    print(
        f"rank {r}: ring got {N} x {prv:.0f} from rank {prv}; halos from ranks {prv} and {nxt} correct "
        f"(transport {comm.transport})",
        flush=True,
    )
    s.close()
    comm.close()


def launch() -> int:
    """Run as a rank, or start 3 ranks of this script (``hal run -n 3``) when started directly."""
    from hal.cli import run_ranks

    return run_ranks(RANKS, main, __file__)


if __name__ == "__main__":
    sys.exit(launch())
