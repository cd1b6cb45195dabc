"""Data-parallel training on 4 emulated devices of one process: hal.kernels + hal.comm.all_reduce.

A linear model ``y = X @ w`` is trained by full-batch gradient descent on least squares. The
batch is split across 4 CPU-emulator devices; each device computes its shard's gradient with
hal.kernels (matmul, sub, scale), one ``all_reduce`` sums the gradients across devices, and
every device applies the same update (axpy). The result is checked against NumPy doing the
same steps on the whole batch::

    python examples/dp_train_single.py
"""

from __future__ import annotations

import os

os.environ["HAL_CPU_DEVICES"] = "4"  # before hal loads its backends

import numpy as np

import hal
import hal.comm
import hal.kernels as hk

STEPS, LR, BATCH, DIM = 20, 0.1, 256, 8


def make_data(seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Return X (BATCH, DIM), y (BATCH, 1) and the true weights."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((BATCH, DIM))
    w_true = rng.standard_normal((DIM, 1))
    return x, x @ w_true + 0.01 * rng.standard_normal((BATCH, 1)), w_true


def reference(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """The same training in NumPy, on the whole batch."""
    w = np.zeros((DIM, 1))
    for _ in range(STEPS):
        w -= LR * (2.0 / BATCH) * x.T @ (x @ w - y)
    return w


def main() -> None:
    """Train on 4 devices and compare with NumPy."""
    devices = hal.devices("cpu")
    assert len(devices) == 4, devices
    x, y, _ = make_data()
    comm = hal.comm.create(devices)
    streams = [d.create_stream() for d in devices]
    shards = np.array_split(np.arange(BATCH), len(devices))
    xs = [hal.asarray(x[s], device=d) for s, d in zip(shards, devices, strict=True)]
    xts = [
        hal.asarray(np.ascontiguousarray(x[s].T), device=d)
        for s, d in zip(shards, devices, strict=True)
    ]
    ys = [hal.asarray(y[s], device=d) for s, d in zip(shards, devices, strict=True)]
    ws = [hal.asarray(np.zeros((DIM, 1)), device=d) for d in devices]
    grads = [hal.asarray(np.zeros((DIM, 1)), device=d) for d in devices]
    # outputs are allocated once and outlive the loop: enqueued work must never see freed memory
    preds = [
        hal.asarray(np.zeros((len(sh), 1)), device=d) for sh, d in zip(shards, devices, strict=True)
    ]
    errs = [
        hal.asarray(np.zeros((len(sh), 1)), device=d) for sh, d in zip(shards, devices, strict=True)
    ]
    for step in range(STEPS):
        for i, s in enumerate(streams):  # local gradient: (2/B) X_i^T (X_i w - y_i)
            hk.matmul(xs[i], ws[i], out=preds[i], stream=s)
            hk.sub(preds[i], ys[i], out=errs[i], stream=s)
            hk.matmul(xts[i], errs[i], out=grads[i], stream=s)
            hk.scale(grads[i], 2.0 / BATCH, out=grads[i], stream=s)
        work = comm.all_reduce(grads, op="sum", streams=streams)  # ordered after each stream's work
        work.wait()
        for i, s in enumerate(streams):
            hk.axpy(-LR, grads[i], ws[i], stream=s)
        if step == 0:
            print(f"all_reduce plan: {work.plan[0]}")
    finals = [w.to_host(stream=s) for w, s in zip(ws, streams, strict=True)]
    comm.close()
    want = reference(x, y)
    for w in finals:
        np.testing.assert_allclose(w, want, rtol=1e-9, atol=1e-12)
    loss = float(np.mean((x @ finals[0] - y) ** 2))
    print(
        f"{STEPS} steps on {len(devices)} devices: loss {loss:.5f}; weights match NumPy on every device"
    )


if __name__ == "__main__":
    main()
