"""``hal bench kernels``: axpy, sum, softmax and matmul beside NumPy on the same data.

Fairness: the NumPy baseline does the same work the fair way (``out=`` buffers allocated
before timing, no temporaries in the timed loop) on the same values; both sides are warmed
up (compilation included) before timing; hal is timed with timing events around a batch of
calls on one stream (dispatch overhead included), NumPy with ``perf_counter`` around the
same batch. Each figure is the best of several batches. ``ratio`` = NumPy time / hal
time: above 1 means hal is faster.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import Any

import numpy as np

import hal
from hal.kernels import _dispatch
from hal.kernels._ops import axpy, matmul, plan_route, softmax
from hal.kernels._ops import sum as hsum

__all__ = ["DEFAULT_SIZES", "BenchRow", "bench"]

DEFAULT_SIZES: dict[str, list[int]] = {
    "axpy": [1 << 16, 1 << 20, 1 << 24],
    "sum": [1 << 16, 1 << 20, 1 << 24],
    "softmax": [1 << 16, 1 << 20, 1 << 22],
    "matmul": [128, 256, 512],
}
TARGETS = {
    ("axpy", "generic"): 0.9,
    ("sum", "generic"): 0.9,
    ("matmul", "dedicated"): 0.9,
}


@dataclasses.dataclass
class BenchRow:
    """One measurement: an op at one size with one implementation, beside NumPy."""

    backend: str
    device: str
    op: str
    size: int
    shape: list[int]
    dtype: str
    implementation: str
    hal_ms: float
    numpy_ms: float
    ratio: float
    target: float | None
    meets_target: bool | None
    bytes_per_call: int

    def to_dict(self) -> dict[str, Any]:
        """Return a JSON-friendly dict."""
        return dataclasses.asdict(self)


def _best_time(fn: Callable[[], None], reps: int, batches: int) -> float:
    best = float("inf")
    for _ in range(batches):
        t0 = time.perf_counter()
        for _ in range(reps):
            fn()
        best = min(best, (time.perf_counter() - t0) / reps)
    return best


def _best_device_time(
    dev: hal.Device, stream: hal.Stream, fn: Callable[[], None], reps: int, batches: int
) -> float:
    start, end = dev.create_event(timing=True), dev.create_event(timing=True)
    best = float("inf")
    try:
        for _ in range(batches):
            start.record(stream)
            for _ in range(reps):
                fn()
            end.record(stream)
            end.synchronize()
            best = min(best, end.elapsed_ms(start) / 1e3 / reps)
    finally:
        start.close()
        end.close()
    return best


def _reps(nbytes: int) -> int:
    return int(max(3, min(200, (64 << 20) // max(nbytes, 1))))


def _closer(*arrays: hal.Array) -> Callable[[], None]:
    def close() -> None:
        for a in arrays:
            a.close()

    return close


def _case(
    op: str, size: int, dev: hal.Device, stream: hal.Stream, rng: np.random.Generator
) -> tuple[list[int], int, Callable[[], None], Callable[[], None], Callable[[], None]]:
    """Return shape, bytes moved, hal call, NumPy call, cleanup."""
    dt = np.float32
    if op in ("axpy", "sum"):
        x = rng.standard_normal(size).astype(dt)
        y = rng.standard_normal(size).astype(dt)
        hx, hy = hal.asarray(x, device=dev), hal.asarray(y, device=dev)
        if op == "axpy":
            tmp = np.empty_like(x)
            out = hal.asarray(np.empty_like(y), device=dev)

            def h() -> None:
                axpy(0.5, hx, hy, out=out, stream=stream)

            def n() -> None:
                np.multiply(x, np.float32(0.5), out=tmp)
                np.add(tmp, y, out=tmp)

            return [size], 3 * x.nbytes, h, n, _closer(hx, hy, out)
        res = dev.alloc(4).view(dt, ())

        def h() -> None:
            hsum(hx, out=res, stream=stream)

        def n() -> None:
            np.sum(x)

        return [size], x.nbytes, h, n, _closer(hx, hy)
    if op == "softmax":
        cols = 1024
        rows = max(1, size // cols)
        x = rng.standard_normal((rows, cols)).astype(dt)
        hx = hal.asarray(x, device=dev)
        out = hal.asarray(np.empty_like(x), device=dev)
        m = np.empty((rows, 1), dtype=dt)
        t = np.empty_like(x)
        s = np.empty((rows, 1), dtype=dt)

        def h() -> None:
            softmax(hx, out=out, stream=stream)

        def n() -> None:
            np.max(x, axis=1, keepdims=True, out=m)
            np.subtract(x, m, out=t)
            np.exp(t, out=t)
            np.sum(t, axis=1, keepdims=True, out=s)
            np.divide(t, s, out=t)

        return [rows, cols], 2 * x.nbytes, h, n, _closer(hx, out)
    k = size
    a = rng.standard_normal((k, k)).astype(dt)
    b = rng.standard_normal((k, k)).astype(dt)
    ha, hb = hal.asarray(a, device=dev), hal.asarray(b, device=dev)
    hc = hal.asarray(np.empty((k, k), dtype=dt), device=dev)
    c = np.empty((k, k), dtype=dt)

    def h_mm() -> None:
        matmul(ha, hb, out=hc, stream=stream)

    def n_mm() -> None:
        np.matmul(a, b, out=c)

    return [k, k], 3 * a.nbytes, h_mm, n_mm, _closer(ha, hb, hc)


def bench(
    backend: str | None = None,
    *,
    ops: list[str] | None = None,
    sizes: dict[str, list[int]] | None = None,
    batches: int = 3,
    seed: int = 0,
) -> list[BenchRow]:
    """Run the kernel benchmark on each available backend (or ``backend``); return the rows."""
    from hal.kernels._accuracy import plan_route_generic
    from hal.kernels._plan import plan_devices

    rows: list[BenchRow] = []
    table = dict(DEFAULT_SIZES if sizes is None else sizes)
    rng = np.random.default_rng(seed)
    for dev in plan_devices(backend):
        stream = dev.create_stream()
        try:
            for op in ops or list(DEFAULT_SIZES):
                if op not in DEFAULT_SIZES:
                    raise ValueError(
                        f"op={op!r} is not benchmarked (choose from {', '.join(DEFAULT_SIZES)})"
                    )
                impls = []
                route, _ = plan_route(op, dev, "float32")
                if route == "dedicated":
                    impls.append("dedicated")
                if plan_route_generic(dev, "float32"):
                    impls.append("generic")
                if not impls:
                    impls.append("host")
                for size in table.get(op, DEFAULT_SIZES[op]):
                    shape, nbytes, h, n, cleanup = _case(op, size, dev, stream, rng)
                    try:
                        reps = (
                            _reps(nbytes) if op != "matmul" else max(3, int(2e8 // (2 * size**3)))
                        )
                        n()
                        t_np = _best_time(n, reps, batches)
                        for impl in impls:
                            with _dispatch.route(impl):
                                h()
                                stream.synchronize()
                                t_hal = _best_device_time(dev, stream, h, reps, batches)
                            ratio = t_np / t_hal if t_hal > 0 else float("inf")
                            target = (
                                TARGETS.get((op, impl))
                                if (op == "matmul" or size >= 1 << 20) and dev.backend == "cpu"
                                else None
                            )
                            rows.append(
                                BenchRow(
                                    dev.backend,
                                    str(dev),
                                    op,
                                    size,
                                    shape,
                                    "float32",
                                    impl,
                                    t_hal * 1e3,
                                    t_np * 1e3,
                                    ratio,
                                    target,
                                    None if target is None else ratio >= target,
                                    nbytes,
                                )
                            )
                    finally:
                        stream.synchronize()
                        cleanup()
        finally:
            stream.close()
    return rows
