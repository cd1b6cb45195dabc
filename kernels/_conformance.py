"""KERN-*: the conformance section of hal.kernels (portable kernels, ops, accuracy table).

Registered through the ``hal_register_conformance`` hook of hal.kernels' built-in plugin
(kernels/_builtin.py), as a vendor's section is; being below the conformance layer it does not
import it: the suite declares the collected checks (:func:`declare_requirements`). The accuracy
requirement attaches the whole accuracy table (every op, dtype and implementation with errors
and tolerances) to the certificate.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

import numpy as np

import hal
import hal.kernels as hk
import hal.kernels.spi as hks
from hal.plugins import DeferredRequirements

if TYPE_CHECKING:
    from hal.conformance.spi import Target

__all__ = ["declare_requirements"]

# This section sits in hal.kernels, below the conformance layer, and never imports it: its checks
# are collected here and declared by the suite, which calls :func:`declare_requirements` with
# :mod:`hal.conformance.spi` after importing this module (registered by the
# ``hal_register_conformance`` hook of hal.kernels' built-in plugin).
_section = DeferredRequirements()
requirement = _section.requirement
declare_requirements = _section.declare


_SRC = """
HAL_KERNEL void affine(HAL_GLOBAL T* out, HAL_GLOBAL const T* x, hal_f64 a, hal_f64 b, hal_i64 w, hal_i64 h) {
    hal_i64 i = HAL_GLOBAL_ID(0), j = HAL_GLOBAL_ID(1), k = HAL_GLOBAL_ID(2);
    hal_i64 idx = (k * h + j) * w + i;
    out[idx] = (T)(a * (hal_f64)x[idx] + b + (hal_f64)(HAL_GLOBAL_SIZE(0) * 0));
}
"""


@requirement(
    "KERN-COMPILE-LAUNCH",
    "A portable kernel compiles for the device and runs over 1-, 2- and 3-dimensional ranges on "
    "arrays at byte offsets, matching NumPy.",
    needs="kernels",
)
def _compile_launch(t: Target) -> None:
    dtypes = ["float32"] + (["float64"] if t.device.capabilities.fp64 else [])
    s = t.stream()
    for dt in dtypes:
        prog = hk.compile(
            _SRC, t.device, defines={"T": {"float32": "hal_f32", "float64": "hal_f64"}[dt]}
        )
        for shape in ((257,), (13, 7), (5, 4, 3)):
            n = int(np.prod(shape))
            x = t.rng.standard_normal(n).astype(dt)
            pad = 3
            hx = t.keep(hal.asarray(np.concatenate([np.zeros(pad, dt), x]), device=t.device))
            xv = hx.buffer.view(dt, n, offset=pad * np.dtype(dt).itemsize)
            out = t.keep(hal.asarray(np.zeros(n, dt), device=t.device))
            w, h = shape[0], shape[1] if len(shape) > 1 else 1
            prog.launch("affine", shape, [out, xv, 2.0, 0.5, w, h], stream=s)
            got = out.to_host(stream=s)
            want = (2.0 * x.astype(np.float64) + 0.5).astype(dt)
            t.expect(
                np.allclose(got, want, rtol=1e-6, atol=1e-6),
                f"{dt} range {shape}: kernel results differ from NumPy",
            )


@requirement(
    "KERN-BUILD-ERROR",
    "A kernel that does not compile raises hal.kernels.KernelBuildError carrying the compiler's build log.",
    needs="kernels",
)
def _build_error(t: Target) -> None:
    bad = "HAL_KERNEL void broken(HAL_GLOBAL hal_f32* p) { p[0] = conformance_undeclared; }"
    try:
        hk.compile(bad, t.device)
    except hk.KernelBuildError as exc:
        t.expect(
            "conformance_undeclared" in exc.build_log,
            f"the build log does not name the error: {exc.build_log[:300]!r}",
        )
        return
    raise t.fail("compiling an invalid kernel did not raise KernelBuildError")


@requirement(
    "KERN-CACHE",
    "A compiled program comes back from the on-disk compile cache (a hit) and runs correctly.",
    needs="kernels",
)
def _cache(t: Target) -> None:
    from hal.kernels._program import _forget_programs

    tag = int(t.rng.integers(1 << 30))
    src = f"HAL_KERNEL void tag(HAL_GLOBAL hal_i32* p) {{ p[HAL_GLOBAL_ID(0)] = {tag}; }}"
    first = hk.compile(src, t.device)
    if first._impl.binary() is None:
        raise t.not_applicable(
            "the backend returns no program binary (ProgramImpl.binary() is None)"
        )
    if hk.cache_info().max_bytes == 0:
        raise t.not_applicable("the on-disk cache is disabled (HAL_CACHE_MAX_BYTES=0)")
    stats = hk.cache_stats()
    hits = stats.hits
    _forget_programs()
    again = hk.compile(src, t.device)
    t.expect(stats.hits == hits + 1, "the second compile of the same source was not a cache hit")
    s = t.stream()
    out = t.keep(hal.asarray(np.zeros(4, np.int32), device=t.device))
    again.launch("tag", 4, [out], stream=s)
    t.expect(
        out.to_host(stream=s).tolist() == [tag] * 4,
        "the program loaded from the cache computes wrong results",
    )


@requirement(
    "KERN-ACCUMULATE",
    "hal.kernels.accumulate (the reduction step of hal.comm) gives NumPy's sum, prod, max and min "
    "for float32, float64, int32 and int64, in stream order.",
)
def _accumulate(t: Target) -> None:
    s = t.stream()
    dtypes = ["float32", "int32", "int64"] + (["float64"] if t.device.capabilities.fp64 else [])
    for dt in dtypes:
        for op, fn in (
            ("sum", np.add),
            ("prod", np.multiply),
            ("max", np.maximum),
            ("min", np.minimum),
        ):
            a = t.rng.integers(-50, 50, 1031).astype(dt)
            b = t.rng.integers(-50, 50, 1031).astype(dt)
            dst = t.keep(hal.asarray(a, device=t.device))
            src = t.keep(hal.asarray(b, device=t.device))
            hk.accumulate(dst, src, op=op, stream=s)
            hk.accumulate(dst, src, op=op, stream=s)
            want = fn(fn(a, b), b)
            t.expect(
                np.array_equal(dst.to_host(stream=s), want),
                f"accumulate op={op} {dt} differs from NumPy",
            )


@requirement(
    "KERN-DISPATCH",
    "Every op call is recorded with the implementation that ran, and HAL_KERNELS_STRICT=1 turns a "
    "fallback into KernelFallbackError before anything is enqueued.",
)
def _dispatch(t: Target) -> None:
    s = t.stream()
    x = t.keep(hal.asarray(np.ones(8, np.float32), device=t.device))
    with hk.trace() as records:
        hk.relu(x, stream=s)
        hk.accumulate(x, x, op="sum", stream=s)
    s.synchronize()
    t.expect([r.op for r in records] == ["relu", "accumulate"], f"records: {records}")
    t.expect(
        all(r.implementation in hks.IMPLEMENTATIONS and r.device == str(t.device) for r in records),
        f"records: {records}",
    )
    t.attach("records", [r.to_dict() for r in records])
    plan = hk.plan(t.backend)
    fallbacks = [
        r
        for r in plan
        if r["implementation"] in ("generic", "host")
        and r["dtype"] == "float32"
        and r["op"] == "relu"
    ]
    if not fallbacks:
        return
    out = t.keep(hal.asarray(np.full(8, 7, np.float32), device=t.device))
    old = os.environ.get("HAL_KERNELS_STRICT")
    os.environ["HAL_KERNELS_STRICT"] = "1"
    try:
        hk.relu(x, out=out, stream=s)
    except hk.KernelFallbackError:
        pass
    else:
        raise t.fail("HAL_KERNELS_STRICT=1 did not stop a fallback relu")
    finally:
        if old is None:
            os.environ.pop("HAL_KERNELS_STRICT", None)
        else:
            os.environ["HAL_KERNELS_STRICT"] = old
    t.expect(
        np.array_equal(out.to_host(stream=s), np.full(8, 7, np.float32)),
        "a refused op wrote its output",
    )


@requirement(
    "KERN-ACCURACY",
    "Every op and dtype, on every implementation the backend runs, stays within PyTorch's "
    "per-dtype tolerances of the float64 NumPy reference and propagates NaN and Inf (the table "
    "goes into the certificate).",
    scope="backend",
)
def _accuracy(t: Target) -> None:
    from hal.kernels._accuracy import TOLERANCES, accuracy_device

    rows = accuracy_device(t.device, seed=t.seed)
    table: list[dict[str, Any]] = [r.to_dict() for r in rows]
    t.attach("accuracy", table)
    t.attach(
        "tolerances",
        {k: {"rtol": v[0], "atol": v[1], "source": v[2]} for k, v in TOLERANCES.items()},
    )
    bad = [
        f"{r.op}[{r.dtype}] {r.implementation}: {r.error or f'max_abs={r.max_abs:.3g} nan_inf={r.nan_inf}'}"
        for r in rows
        if not r.passed
    ]
    t.expect(not bad, f"{len(bad)} of {len(rows)} rows out of tolerance: " + "; ".join(bad[:8]))
