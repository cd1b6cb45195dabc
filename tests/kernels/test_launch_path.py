"""The cheap launch path keeps its answers: cached routes and records, argument reuse on OpenCL,
kernels without bounds checks, the CPU emulator's dedicated row kernels, the launch bench."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import hal
import hal.kernels as hk
import hal.kernels.spi as hks
from hal.kernels import _dispatch


def test_repeated_launches_share_one_record_and_see_new_registrations(
    kdev: hal.Device, stream: hal.Stream
) -> None:
    x = hal.asarray(np.arange(5, dtype=np.float32), device=kdev)
    with hk.trace() as records:
        hk.relu(x, stream=stream)
        hk.relu(x, stream=stream)
    assert records[0] is records[1] and records[0].implementation == "generic"

    calls: list[int] = []

    def mine(call: Any) -> None:
        calls.append(1)
        hk.scale(call.inputs[0], 1.0, out=call.out, stream=call.stream)

    hks.register("relu", kdev.backend, mine, dtypes=["float32"], name="test:relu")
    try:
        with hk.trace() as records:
            hk.relu(x, stream=stream)
        assert records[-1].kernel == "test:relu" and calls == [1]  # the cached route was dropped
    finally:
        _dispatch._reset_registry()
    with hk.trace() as records:
        hk.relu(x, stream=stream)
    assert records[0].implementation == "generic"


@pytest.mark.parametrize("n", [1, 7, 1000, 65537])
def test_elementwise_without_bounds_check_writes_exactly_n(
    kdev: hal.Device, stream: hal.Stream, n: int
) -> None:
    rng = np.random.default_rng(n)
    x, y = rng.standard_normal(n).astype(np.float32), rng.standard_normal(n).astype(np.float32)
    # out lives inside a larger buffer: an item past n would overwrite the guard bytes
    buf = kdev.alloc((n + 64) * 4)
    hal.copy(buf, np.full(n + 64, 7.0, np.float32), stream=stream)
    out = buf.view(np.float32, (n,))
    hk.axpy(0.5, hal.asarray(x, device=kdev), hal.asarray(y, device=kdev), out=out, stream=stream)
    got = np.empty(n + 64, np.float32)
    hal.copy(got, buf, stream=stream)
    stream.synchronize()
    np.testing.assert_allclose(got[:n], np.float32(0.5) * x + y, rtol=1e-6)
    assert (got[n:] == 7.0).all()


def test_launches_with_changing_arguments_use_the_new_ones(
    kdev: hal.Device, stream: hal.Stream
) -> None:
    """OpenCL skips set_args when a launch repeats the last arguments: a change must not be missed."""
    a = [hal.asarray(np.full(16, float(i), np.float32), device=kdev) for i in range(3)]
    outs = [kdev.alloc(64).view(np.float32, (16,)) for _ in range(6)]
    for k in range(6):
        hk.axpy(2.0 if k % 2 else 1.0, a[k % 3], a[(k + 1) % 3], out=outs[k], stream=stream)
    for k in range(6):
        alpha = 2.0 if k % 2 else 1.0
        assert (outs[k].to_host(stream=stream) == alpha * (k % 3) + (k + 1) % 3).all()


def _rows_reference(
    op: str, x: np.ndarray[Any, Any], w: np.ndarray[Any, Any], b: np.ndarray[Any, Any]
) -> Any:
    x = x.astype(np.float64)
    with np.errstate(all="ignore"):
        if op == "softmax":
            e = np.exp(x - x.max(axis=-1, keepdims=True))
            return e / e.sum(axis=-1, keepdims=True)
        if op == "layernorm":
            mu = x.mean(axis=-1, keepdims=True)
            var = ((x - mu) ** 2).mean(axis=-1, keepdims=True)
            return (x - mu) / np.sqrt(var + 1e-5) * w + b
        return x / np.sqrt((x**2).mean(axis=-1, keepdims=True) + 1e-6) * w


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("op", ["softmax", "layernorm", "rmsnorm"])
def test_cpu_dedicated_rows_match_the_reference(op: str, dtype: str) -> None:
    dev = hal.device("cpu:0")
    rng = np.random.default_rng(3)
    cols = 1000  # not a multiple of the vector width
    x = (rng.standard_normal((9, cols)) * 20).astype(dtype)
    x[1] += 300.0  # a large mean beside the spread
    x[2] = rng.standard_normal(cols).astype(dtype) * 1e-3 - 50  # tiny spread
    x[3, 0] = -200.0  # exp underflow inside a row
    w, b = rng.standard_normal(cols).astype(dtype), rng.standard_normal(cols).astype(dtype)
    hx, hw, hb = (hal.asarray(v, device=dev) for v in (x, w, b))
    with dev.create_stream() as s, hk.trace() as records:
        if op == "softmax":
            got = hk.softmax(hx, stream=s)
        elif op == "layernorm":
            got = hk.layernorm(hx, hw, hb, stream=s)
        else:
            got = hk.rmsnorm(hx, hw, stream=s)
        host = got.to_host(stream=s)
    assert records[0].implementation == "dedicated" and records[0].kernel == f"cpu:c.{op}(simd)"
    rtol, atol = (1.3e-6, 1e-5) if dtype == "float32" else (1e-7, 1e-7)
    np.testing.assert_allclose(host, _rows_reference(op, x, w, b), rtol=rtol, atol=atol)


def test_cpu_dedicated_softmax_special_values_match_the_generic_kernel() -> None:
    dev = hal.device("cpu:0")
    x = np.random.default_rng(1).standard_normal((6, 37)).astype(np.float32)
    x[1, 5] = np.nan
    x[2, :] = -np.inf
    x[3, 7] = np.inf
    x[4, :] = 100.0  # exp(0) everywhere
    x[5, 3] = -np.inf
    hx = hal.asarray(x, device=dev)
    with dev.create_stream() as s:
        ded = hk.softmax(hx, stream=s).to_host(stream=s)
        with hk.route("generic"):
            gen = hk.softmax(hx, stream=s).to_host(stream=s)
    np.testing.assert_array_equal(np.isnan(ded), np.isnan(gen))
    ok = ~np.isnan(gen)
    np.testing.assert_allclose(ded[ok], gen[ok], rtol=2e-6, atol=1e-7)
    assert ded[5, 3] == 0.0


def test_launch_bench_rows_name_their_baseline(kernel_backend: str) -> None:
    from hal.cli.bench._kernels_run import bench_launch

    rows, notes = bench_launch(kernel_backend, launches=5, batches=1)
    assert len(rows) + len(notes) >= 1
    for r in rows:
        assert r.backend == kernel_backend and r.hal_us > 0 and r.baseline_us > 0
        assert r.baseline == ("torch" if kernel_backend == "cpu" else "raw PyOpenCL")
        assert r.ratio == pytest.approx(r.hal_us / r.baseline_us) and r.method


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("n", [1, 31, 33, 4097, 100003])
def test_cpu_dedicated_full_reductions(dtype: str, n: int) -> None:
    dev = hal.device("cpu:0")
    x = np.random.default_rng(n).standard_normal(n).astype(dtype)
    hx = hal.asarray(x, device=dev)
    with dev.create_stream() as s, hk.trace() as records:
        got = [f(hx, stream=s).to_host(stream=s) for f in (hk.sum, hk.max, hk.min)]
        hk.sum(hal.asarray(x.reshape(1, n), device=dev), axis=1, stream=s)  # an axis: generic
    assert [r.kernel for r in records] == [
        "cpu:c.sum_full(simd)",
        "cpu:c.max_full(simd)",
        "cpu:c.min_full(simd)",
        "generic:sum_axis",
    ]
    ref = np.sum(x.astype(np.float64))
    tol = 1.3e-6 if dtype == "float32" else 1e-7
    assert abs(float(got[0]) - ref) <= 1e-5 + tol * np.sum(np.abs(x.astype(np.float64)))
    assert got[1] == x.max() and got[2] == x.min()
    if n > 40:
        x[n // 3] = np.nan
        hx = hal.asarray(x, device=dev)
        with dev.create_stream() as s:
            assert all(
                np.isnan(f(hx, stream=s).to_host(stream=s)) for f in (hk.sum, hk.max, hk.min)
            )
