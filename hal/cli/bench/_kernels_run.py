"""``hal bench kernels``: ops beside NumPy, BLAS, torch (CPU) and a raw PyOpenCL program; launch latency.

Fairness (docs/kernels.md "Speed"): every baseline does the same work the way its user would
(``out=`` buffers allocated before timing, no temporaries in the timed loop; NumPy's axpy in one
pass over memory, blocks of :data:`AXPY_BLOCK` elements whose temporary stays in cache; BLAS
``saxpy``; torch ops with ``out=`` where torch has one, ``torch.set_num_threads`` and the BLAS
threads set to the emulator's kernel threads); every side is warmed up (compilation included)
and timed with the same clock, the host's ``perf_counter`` around a batch of calls followed by
a synchronize (hal: ``Stream.synchronize``; PyOpenCL: ``queue.finish``); hal's device-event
time of the same batch is an extra column (``hal_event_ms``). The sides are interleaved batch
by batch and each keeps its best batch. Every ratio is hal time / baseline time (below 1: hal
faster): ``ratio`` against NumPy, ``blas_ratio``, ``torch_ratio``, ``raw_ratio``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
import time
from collections.abc import Callable
from typing import Any

import numpy as np

import hal
from hal.kernels import _dispatch
from hal.kernels._ops import axpy, layernorm, matmul, plan_route, rmsnorm, softmax
from hal.kernels._ops import sum as hsum
from hal.spi import impl_of, setting

__all__ = [
    "AXPY_BLOCK",
    "DEFAULT_SIZES",
    "BenchRow",
    "LaunchRow",
    "bench",
    "bench_launch",
    "blas_saxpy",
    "torch_baseline",
]

DEFAULT_SIZES: dict[str, list[int]] = {
    "axpy": [1 << 16, 1 << 20, 1 << 24],
    "sum": [1 << 16, 1 << 20, 1 << 24],
    "softmax": [1 << 16, 1 << 20, 1 << 22],
    "layernorm": [1 << 20, 1 << 22],
    "rmsnorm": [1 << 20, 1 << 22],
    "matmul": [128, 256, 512],
}
#: hal time / torch time (CPU) at most this (issue #13) ...
BASELINE_TARGET = 1.5
#: ... for the CPU emulator's dedicated kernels of these ops
TORCH_TARGET_OPS = ("softmax", "layernorm", "rmsnorm", "sum")
#: hal time / raw PyOpenCL time at most this for the generic OpenCL axpy (issue #13: "at least
#: as fast as a plain raw PyOpenCL program for the same op")
RAW_TARGET = 1.0
#: hal time / NumPy time at most this (the issue's "at least 0.9x NumPy's speed")
TARGETS = {
    ("axpy", "generic"): round(1 / 0.9, 2),
    ("sum", "generic"): round(1 / 0.9, 2),
    ("matmul", "dedicated"): round(1 / 0.9, 2),
}
#: NumPy's axpy runs in blocks of this many elements: the temporary of ``a * x`` stays in
#: cache, so that NumPy, like hal, reads x and y and writes the output once.
AXPY_BLOCK = 1 << 16


@dataclasses.dataclass
class BenchRow:
    """One measurement: an op at one size with one implementation, beside NumPy (and BLAS, torch, raw).

    Times are ms per call; every ``*ratio`` is hal time / baseline time (below 1: hal faster);
    ``target`` is the largest ``ratio`` (against NumPy) that meets the issue's target.
    """

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
    torch_ms: float | None = None
    torch_ratio: float | None = None
    raw_ms: float | None = None
    raw_ratio: float | None = None
    method: str = ""
    blas_ms: float | None = None
    blas_ratio: float | None = None
    hal_event_ms: float | None = None

    def to_dict(self) -> dict[str, Any]:
        """Return a JSON-friendly dict."""
        return dataclasses.asdict(self)


#: A timed side: (one call, synchronize after a batch, context around the batch or None).
Side = tuple[
    Callable[[], Any],
    Callable[[], Any],
    Callable[[], contextlib.AbstractContextManager[Any]] | None,
]


def _interleaved(sides: dict[str, Side], reps: int, batches: int) -> dict[str, float]:
    """Time every side batch by batch in turn (host clock around ``reps`` calls + synchronize).

    Each side is warmed up first (one call and a synchronize); returns each side's best mean
    seconds per call. A side's context (hal's route choice) is entered outside the clock.
    """
    for fn, sync, ctx in sides.values():
        with ctx() if ctx else contextlib.nullcontext():
            fn()
            sync()
    best = dict.fromkeys(sides, float("inf"))
    for _ in range(batches):
        for key, (fn, sync, ctx) in sides.items():
            with ctx() if ctx else contextlib.nullcontext():
                t0 = time.perf_counter()
                for _ in range(reps):
                    fn()
                sync()
                best[key] = min(best[key], (time.perf_counter() - t0) / reps)
    return best


def _runs_unforced(fn: Callable[[], None], stream: hal.Stream, impl: str) -> bool:
    """Return True if ``fn``'s op calls run ``impl`` without forcing the route.

    A forced route (:func:`hal.kernels.route`) takes the full dispatch at every call (the
    launch cache steps aside), so the route an op takes by itself is timed unforced, as a
    user's calls run.
    """
    with _dispatch.trace() as records:
        fn()
    stream.synchronize()
    return bool(records) and all(r.implementation == impl for r in records)


def _event_time(
    dev: hal.Device, stream: hal.Stream, fn: Callable[[], None], reps: int
) -> float | None:
    """Device-event seconds per call of one batch of ``fn`` (None where the device has no timing events)."""
    if not dev.capabilities.timing_events:
        return None
    with dev.create_event(timing=True) as start, dev.create_event(timing=True) as end:
        stream.synchronize()
        start.record(stream)
        for _ in range(reps):
            fn()
        end.record(stream)
        end.synchronize()
        return end.elapsed_ms(start) / 1e3 / reps


def _reps(nbytes: int) -> int:
    return int(max(3, min(200, (64 << 20) // max(nbytes, 1))))


def _closer(*objs: Any) -> Callable[[], None]:
    """Close every array and buffer of a case (in order)."""

    def close() -> None:
        for a in objs:
            a.close()

    return close


def _case(
    op: str,
    size: int,
    dev: hal.Device,
    stream: hal.Stream,
    rng: np.random.Generator,
    data: dict[str, np.ndarray[Any, Any]] | None = None,
) -> tuple[list[int], int, Callable[[], None], Callable[[], None], Callable[[], None]]:
    """Return shape, bytes moved, hal call, NumPy call, cleanup (``data`` gets the NumPy inputs)."""
    dt = np.float32
    data = {} if data is None else data
    if op in ("axpy", "sum"):
        x = rng.standard_normal(size).astype(dt)
        y = rng.standard_normal(size).astype(dt)
        data.update(x=x, y=y)
        hx, hy = hal.asarray(x, device=dev), hal.asarray(y, device=dev)
        if op == "axpy":
            o = np.empty_like(x)
            tmp = np.empty(min(size, AXPY_BLOCK), dt)
            out = hal.asarray(np.empty_like(y), device=dev)
            coef = np.float32(0.5)
            blocks = [slice(i, min(i + AXPY_BLOCK, size)) for i in range(0, size, AXPY_BLOCK)]

            def h() -> None:
                axpy(0.5, hx, hy, out=out, stream=stream)

            def n() -> None:  # one pass over memory: a block's a*x stays in cache
                for b in blocks:
                    t = tmp[: b.stop - b.start]
                    np.multiply(x[b], coef, out=t)
                    np.add(t, y[b], out=o[b])

            return [size], 3 * x.nbytes, h, n, _closer(hx, hy, out)
        buf = dev.alloc(4)
        res = buf.view(dt, ())
        r = np.empty((), dt)

        def h() -> None:
            hsum(hx, out=res, stream=stream)

        def n() -> None:
            np.sum(x, out=r)

        return [size], x.nbytes, h, n, _closer(hx, hy, res, buf)
    if op == "softmax":
        cols = 1024
        rows = max(1, size // cols)
        x = rng.standard_normal((rows, cols)).astype(dt)
        data.update(x=x)
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
    if op in ("layernorm", "rmsnorm"):
        cols = 1024
        rows = max(1, size // cols)
        x = rng.standard_normal((rows, cols)).astype(dt)
        w = rng.standard_normal(cols).astype(dt)
        b = rng.standard_normal(cols).astype(dt)
        data.update(x=x, w=w, b=b)
        hx, hw, hb = (hal.asarray(v, device=dev) for v in (x, w, b))
        out = hal.asarray(np.empty_like(x), device=dev)
        t = np.empty_like(x)
        s1 = np.empty((rows, 1), dtype=dt)
        s2 = np.empty((rows, 1), dtype=dt)

        if op == "layernorm":

            def h() -> None:
                layernorm(hx, hw, hb, out=out, stream=stream)

            def n() -> None:
                np.mean(x, axis=1, keepdims=True, out=s1)
                np.subtract(x, s1, out=t)
                np.multiply(t, t, out=out_np)
                np.mean(out_np, axis=1, keepdims=True, out=s2)
                np.add(s2, np.float32(1e-5), out=s2)
                np.sqrt(s2, out=s2)
                np.divide(t, s2, out=t)
                np.multiply(t, w, out=t)
                np.add(t, b, out=t)

        else:

            def h() -> None:
                rmsnorm(hx, hw, out=out, stream=stream)

            def n() -> None:
                np.multiply(x, x, out=out_np)
                np.mean(out_np, axis=1, keepdims=True, out=s2)
                np.add(s2, np.float32(1e-6), out=s2)
                np.sqrt(s2, out=s2)
                np.divide(x, s2, out=t)
                np.multiply(t, w, out=t)

        out_np = np.empty_like(x)
        return [rows, cols], 2 * x.nbytes, h, n, _closer(hx, hw, hb, out)
    k = size
    a = rng.standard_normal((k, k)).astype(dt)
    b = rng.standard_normal((k, k)).astype(dt)
    data.update(x=a, y=b)
    ha, hb = hal.asarray(a, device=dev), hal.asarray(b, device=dev)
    hc = hal.asarray(np.empty((k, k), dtype=dt), device=dev)
    c = np.empty((k, k), dtype=dt)

    def h_mm() -> None:
        matmul(ha, hb, out=hc, stream=stream)

    def n_mm() -> None:
        np.matmul(a, b, out=c)

    return [k, k], 3 * a.nbytes, h_mm, n_mm, _closer(ha, hb, hc)


def _kernel_threads() -> int:
    """The emulator's OpenMP threads per large launch (``HAL_CPU_KERNEL_THREADS``, default 1)."""
    n = setting("HAL_CPU_KERNEL_THREADS")  # 1..4096 or "auto" (hal.ConfigError)
    return len(os.sched_getaffinity(0)) if n == "auto" else int(n)


def torch_baseline() -> tuple[Any, str]:
    """Return ``(torch, "")`` with its threads set like the emulator's kernels, or ``(None, reason)``."""
    try:
        import torch
    except ImportError as exc:
        return None, f"torch is not installed ({exc}); the torch column is skipped"
    torch.set_num_threads(_kernel_threads())
    return torch, ""


def _openblas() -> tuple[Any, str] | None:
    """NumPy's own OpenBLAS through ctypes: ``(library, symbol suffix)``, or None."""
    import ctypes
    import glob

    libs = os.path.join(os.path.dirname(os.path.dirname(np.__file__)), "numpy.libs")
    for path in sorted(glob.glob(os.path.join(libs, "*openblas*.so*"))):
        lib = ctypes.CDLL(path)
        for prefix, suffix in (("scipy_", "64_"), ("", "64_"), ("", "")):
            if hasattr(lib, f"{prefix}cblas_saxpy{suffix}"):
                return lib, f"{prefix}|{suffix}"
    return None


def blas_saxpy() -> tuple[Callable[..., Any] | None, str]:
    """Return ``(saxpy(alpha, x, y), description)``: BLAS ``y = alpha * x + y`` in place, or ``(None, why)``.

    scipy.linalg.blas.saxpy when SciPy is installed, else ``cblas_saxpy`` of the OpenBLAS that
    NumPy links (through ctypes). The BLAS threads are set to the emulator's kernel threads.
    """
    try:
        from scipy.linalg import blas  # type: ignore[import-not-found, import-untyped, unused-ignore]

        fn = blas.saxpy

        def scipy_saxpy(alpha: float, x: np.ndarray[Any, Any], y: np.ndarray[Any, Any]) -> None:
            fn(x, y, x.size, alpha)

        return scipy_saxpy, "scipy.linalg.blas.saxpy (y in place)"
    except ImportError:
        pass
    import ctypes

    found = _openblas()
    if found is None:
        return (
            None,
            "no BLAS found (no SciPy, no OpenBLAS in numpy.libs): the BLAS column is skipped",
        )
    lib, affixes = found
    prefix, suffix = affixes.split("|")
    name = f"{prefix}cblas_saxpy{suffix}"
    cfn = getattr(lib, name)
    index = ctypes.c_int64 if suffix else ctypes.c_int
    cfn.argtypes = [index, ctypes.c_float, ctypes.c_void_p, index, ctypes.c_void_p, index]
    cfn.restype = None
    threads = getattr(lib, f"{prefix}openblas_set_num_threads{suffix}", None)
    if threads is not None:
        threads.argtypes = [ctypes.c_int]
        threads(_kernel_threads())

    def saxpy(alpha: float, x: np.ndarray[Any, Any], y: np.ndarray[Any, Any]) -> None:
        cfn(x.size, alpha, x.ctypes.data, 1, y.ctypes.data, 1)

    return (
        saxpy,
        f"{name} of NumPy's OpenBLAS via ctypes (y in place), {_kernel_threads()} thread(s)",
    )


_TORCH_METHOD = {
    "axpy": "torch.add(y, x, alpha=0.5, out=o)",
    "sum": "torch.sum(x, dim=0, out=r)",
    "softmax": "torch.softmax(x, -1, out=o)",
    "layernorm": "torch.nn.functional.layer_norm(x, (1024,), w, b) (no out=: allocates)",
    "rmsnorm": "torch.nn.functional.rms_norm(x, (1024,), w, 1e-6) (no out=: allocates)",
    "matmul": "torch.matmul(a, b, out=c)",
}


def _torch_case(torch: Any, op: str, data: dict[str, np.ndarray[Any, Any]]) -> Callable[[], None]:
    x = torch.from_numpy(data["x"])
    if op == "axpy":
        y, o = torch.from_numpy(data["y"]), torch.empty_like(x)
        return lambda: torch.add(y, x, alpha=0.5, out=o)
    if op == "sum":
        r = torch.empty(())
        return lambda: torch.sum(x, dim=0, out=r)
    if op == "softmax":
        o = torch.empty_like(x)
        return lambda: torch.softmax(x, -1, out=o)
    if op == "layernorm":
        w, b = torch.from_numpy(data["w"]), torch.from_numpy(data["b"])
        fn = torch.nn.functional.layer_norm
        return lambda: fn(x, (x.shape[-1],), w, b, 1e-5)
    if op == "rmsnorm":
        w = torch.from_numpy(data["w"])
        fn = torch.nn.functional.rms_norm
        return lambda: fn(x, (x.shape[-1],), w, 1e-6)
    y, c = torch.from_numpy(data["y"]), torch.empty(x.shape[0], data["y"].shape[1])
    return lambda: torch.matmul(x, y, out=c)


RAW_AXPY = """
__kernel void axpy(__global float* out, __global const float* x, __global const float* y, float alpha) {
    size_t i = get_global_id(0);
    out[i] = alpha * x[i] + y[i];
}
"""


def _nothing() -> None:
    """The synchronize of a library whose calls return when done (NumPy, BLAS, torch CPU)."""


def _raw_opencl(dev: hal.Device) -> tuple[Any, Any, Any] | None:
    """Return ``(pyopencl, queue, axpy kernel)``: a plain hand-written program on ``dev``'s OpenCL device."""
    if dev.backend != "opencl":
        return None
    import pyopencl as cl

    d = impl_of(dev)
    queue = cl.CommandQueue(d.context, d.cl_device)
    prg = cl.Program(d.context, RAW_AXPY).build(devices=[d.cl_device])
    return cl, queue, prg.axpy


def _raw_axpy(
    raw: tuple[Any, Any, Any], x: np.ndarray[Any, Any], y: np.ndarray[Any, Any]
) -> tuple[Callable[[], None], Callable[[], None]]:
    cl, queue, knl = raw
    mf = cl.mem_flags
    bx = cl.Buffer(queue.context, mf.READ_ONLY | mf.COPY_HOST_PTR, hostbuf=x)
    by = cl.Buffer(queue.context, mf.READ_ONLY | mf.COPY_HOST_PTR, hostbuf=y)
    bo = cl.Buffer(queue.context, mf.READ_WRITE, size=x.nbytes)
    knl.set_scalar_arg_dtypes([None, None, None, np.float32])
    n = (x.size,)
    alpha = np.float32(0.5)

    def run() -> None:  # what a PyOpenCL user writes: arguments set on each call
        knl(queue, n, None, bo, bx, by, alpha)

    return run, queue.finish


@dataclasses.dataclass
class LaunchRow:
    """Launch latency: ``launches`` 1-element axpy launches then one synchronize, per launch."""

    backend: str
    device: str
    hal_us: float
    baseline: str
    baseline_us: float
    ratio: float
    target: float
    meets_target: bool
    method: str

    def to_dict(self) -> dict[str, Any]:
        """Return a JSON-friendly dict."""
        return dataclasses.asdict(self)


#: hal launch time / baseline launch time at most this (issue #13: torch on cpu x4, raw PyOpenCL x1.5)
LAUNCH_TARGETS = {"cpu": 4.0, "opencl": 1.5}


def bench_launch(
    backend: str | None = None, *, launches: int = 1000, batches: int = 11
) -> tuple[list[LaunchRow], list[str]]:
    """Time 1-element axpy launches (async, one synchronize per ``launches``) beside a baseline.

    Each side keeps its best of ``batches`` interleaved batches (a batch is a few tens of
    milliseconds: on a shared machine one stalled batch of five moved the ratio by 5x).

    cpu: torch's ``add(y, x, alpha=0.5, out=o)`` on 1-element tensors; opencl: the same
    kernel as a plain PyOpenCL program enqueued on its own queue, ``finish()`` per batch.
    Returns the rows and notes on skipped baselines.
    """
    from hal.kernels._plan import plan_devices

    rows: list[LaunchRow] = []
    notes: list[str] = []
    for dev in plan_devices(backend):
        if dev.backend in LAUNCH_TARGETS:
            row = _launch_row(dev, launches, batches, notes)
            if row is not None:
                rows.append(row)
    return rows, notes


def _launch_row(dev: hal.Device, launches: int, batches: int, notes: list[str]) -> LaunchRow | None:
    stream = dev.create_stream()
    one = np.ones(1, dtype=np.float32)
    hx, hy, ho = (hal.asarray(one, device=dev) for _ in range(3))
    try:

        def h() -> None:
            for _ in range(launches):
                axpy(0.5, hx, hy, out=ho, stream=stream)
            stream.synchronize()

        if dev.backend == "cpu":
            torch, why = torch_baseline()
            if torch is None:
                notes.append(why)
                return None
            tx, ty, to = torch.ones(1), torch.ones(1), torch.ones(1)

            def base() -> None:
                for _ in range(launches):
                    torch.add(ty, tx, alpha=0.5, out=to)

            name = "torch"
            method = f"hal.kernels.axpy vs torch.add(out=), 1 element, {launches} launches + sync"
        else:
            raw = _raw_opencl(dev)
            assert raw is not None
            run, finish = _raw_axpy(raw, one, one)

            def base() -> None:
                for _ in range(launches):
                    run()
                finish()

            name = "raw PyOpenCL"
            method = (
                "hal.kernels.axpy vs knl(queue, (1,), None, out, x, y, alpha) of a plain program "
                "(PyOpenCL's invoker: set_args + enqueue_nd_range_kernel), 1 element, "
                f"{launches} launches + finish"
            )
        h()
        base()
        t_hal = t_base = float("inf")
        for _ in range(batches):  # interleaved
            t0 = time.perf_counter()
            h()
            t_hal = min(t_hal, time.perf_counter() - t0)
            t0 = time.perf_counter()
            base()
            t_base = min(t_base, time.perf_counter() - t0)
        ratio = t_hal / t_base
        target = LAUNCH_TARGETS[dev.backend]
        return LaunchRow(
            dev.backend,
            str(dev),
            t_hal / launches * 1e6,
            name,
            t_base / launches * 1e6,
            ratio,
            target,
            ratio <= target,
            method,
        )
    finally:
        stream.synchronize()
        for a in (hx, hy, ho):
            a.close()
        stream.close()


def bench(
    backend: str | None = None,
    *,
    ops: list[str] | None = None,
    sizes: dict[str, list[int]] | None = None,
    batches: int = 3,
    seed: int = 0,
    routes: list[str] | None = None,
) -> list[BenchRow]:
    """Run the kernel benchmark on each available backend (or ``backend``); return the rows.

    ``routes`` keeps only these hal routes (``dedicated``, ``generic``, ``host``) where the op
    has them; by default every route the op has on the device is timed.
    """
    from hal.kernels._accuracy import plan_route_generic
    from hal.kernels._plan import plan_devices

    rows: list[BenchRow] = []
    table = dict(DEFAULT_SIZES if sizes is None else sizes)
    rng = np.random.default_rng(seed)
    torch: Any = None
    saxpy, saxpy_how = blas_saxpy()
    for dev in plan_devices(backend):
        if dev.backend == "cpu" and torch is None:
            torch, _why = torch_baseline()
        raw = _raw_opencl(dev) if dev.backend == "opencl" else None
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
                if routes:
                    impls = [i for i in impls if i in routes]
                    if not impls:
                        continue
                for size in table.get(op, DEFAULT_SIZES[op]):
                    data: dict[str, np.ndarray[Any, Any]] = {}
                    shape, nbytes, h, n, cleanup = _case(op, size, dev, stream, rng, data)
                    try:
                        reps = (
                            _reps(nbytes) if op != "matmul" else max(3, int(2e8 // (2 * size**3)))
                        )
                        sides: dict[str, Side] = {"numpy": (n, _nothing, None)}
                        method = "numpy out= (no temporaries"
                        method += (
                            f"; axpy in blocks of {AXPY_BLOCK}: one pass)" if op == "axpy" else ")"
                        )
                        if saxpy is not None and op == "axpy" and dev.backend == "cpu":
                            bx, by = data["x"], data["y"].copy()
                            sides["blas"] = (functools.partial(saxpy, 0.5, bx, by), _nothing, None)
                            method += f"; {saxpy_how}"
                        if torch is not None and dev.backend == "cpu":
                            sides["torch"] = (_torch_case(torch, op, data), _nothing, None)
                            method += f"; {_TORCH_METHOD[op]}, {torch.get_num_threads()} thread(s)"
                        if raw is not None and op == "axpy":
                            sides["raw"] = (*_raw_axpy(raw, data["x"], data["y"]), None)
                            method += "; raw PyOpenCL axpy program, no bounds check"
                        for impl in impls:
                            ctx = None  # the route a user's call takes: unforced (launch cache)
                            if not _runs_unforced(h, stream, impl):
                                ctx = functools.partial(_dispatch.route, impl)
                            sides[impl] = (h, stream.synchronize, ctx)
                        method += (
                            "; hal's default route unforced, as a user calls it (the launch "
                            "cache), another route forced; perf_counter around a batch + "
                            f"synchronize, every side, interleaved batch by batch, best of {batches}"
                        )
                        best = _interleaved(sides, reps, batches)
                        t_np = best["numpy"]
                        t_blas, t_torch, t_raw = (best.get(k) for k in ("blas", "torch", "raw"))
                        for impl in impls:
                            t_hal = best[impl]
                            with _dispatch.route(impl):
                                t_event = _event_time(dev, stream, h, reps)
                            ratio = t_hal / t_np if t_np > 0 else float("inf")
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
                                    None if target is None else ratio <= target,
                                    nbytes,
                                    None if t_torch is None else t_torch * 1e3,
                                    None if t_torch is None else t_hal / t_torch,
                                    None if t_raw is None else t_raw * 1e3,
                                    None if t_raw is None else t_hal / t_raw,
                                    method,
                                    None if t_blas is None else t_blas * 1e3,
                                    None if t_blas is None else t_hal / t_blas,
                                    None if t_event is None else t_event * 1e3,
                                )
                            )
                    finally:
                        stream.synchronize()
                        cleanup()
        finally:
            stream.close()
    return rows
