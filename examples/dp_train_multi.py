"""Data-parallel training across 2 processes with ``hal run``: hal.kernels + hal.comm.all_reduce.

The same training as dp_train_single.py, one rank per process::

    hal run -n 2 examples/dp_train_multi.py

Run directly (``python examples/dp_train_multi.py``), it launches itself with ``hal run -n 2``.
Each rank computes its shard's gradient with hal.kernels on its own device, the ranks sum
their gradients with one ``all_reduce`` (shared memory between the processes), and every
rank applies the same update. Rank 0 checks the weights against NumPy.
"""

from __future__ import annotations

import sys

import numpy as np

STEPS, LR, BATCH, DIM, RANKS = 20, 0.1, 256, 8, 2


def make_data(seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Return X (BATCH, DIM) and y (BATCH, 1); every rank makes the same."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((BATCH, DIM))
    w_true = rng.standard_normal((DIM, 1))
    return x, x @ w_true + 0.01 * rng.standard_normal((BATCH, 1))


def train() -> None:
    """One rank's training loop."""
    import hal
    import hal.comm
    import hal.kernels as hk

    comm = hal.comm.init()
    dev, s = comm.device, comm.device.create_stream()
    x, y = make_data()
    shard = np.array_split(np.arange(BATCH), comm.size)[comm.rank]
    xd = hal.asarray(x[shard], device=dev)
    xtd = hal.asarray(np.ascontiguousarray(x[shard].T), device=dev)
    yd = hal.asarray(y[shard], device=dev)
    w = hal.asarray(np.zeros((DIM, 1)), device=dev)
    grad = hal.asarray(np.zeros((DIM, 1)), device=dev)
    pred = hal.asarray(np.zeros((len(shard), 1)), device=dev)  # outputs live as long as the loop
    err = hal.asarray(np.zeros((len(shard), 1)), device=dev)
    for _ in range(STEPS):
        hk.matmul(xd, w, out=pred, stream=s)
        hk.sub(pred, yd, out=err, stream=s)
        hk.matmul(xtd, err, out=grad, stream=s)
        hk.scale(grad, 2.0 / BATCH, out=grad, stream=s)
        comm.all_reduce(grad, op="sum", stream=s).wait()
        hk.axpy(-LR, grad, w, stream=s)
    final = w.to_host(stream=s)
    plan = comm.last_plan
    comm.close()
    want = np.zeros((DIM, 1))
    for _ in range(STEPS):
        want -= LR * (2.0 / BATCH) * x.T @ (x @ want - y)
    np.testing.assert_allclose(final, want, rtol=1e-9, atol=1e-12)
    if comm.rank == 0:
        loss = float(np.mean((x @ final - y) ** 2))
        print(f"all_reduce plan: {plan}")
        print(
            f"{STEPS} steps on {comm.size} ranks: loss {loss:.5f}; weights match NumPy on every rank"
        )


def main() -> int:
    """Train as a rank, or launch 2 ranks of this script when started directly."""
    from hal.cli import run_ranks

    return run_ranks(RANKS, train, __file__)


if __name__ == "__main__":
    sys.exit(main())
