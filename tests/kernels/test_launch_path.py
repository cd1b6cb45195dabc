"""The cheap launch path keeps its answers: cached routes and records, argument reuse on OpenCL,
kernels without bounds checks, the CPU emulator's dedicated row kernels, the launch bench."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import hal
import hal.kernels as hk
import hal.kernels.spi as hks


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
        hal.runtime().clear_caches()  # the registration goes; hooks run again on next use
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
    """Cached kernels and routes never reuse stale arguments: each launch sees its own."""
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


# -- the caches of the launch path are keyed on what can change ----------------------------
def test_cached_route_follows_dtype_shape_and_device(kernel_backend: str) -> None:
    devs = [d for d in hal.devices() if d.backend == kernel_backend][:2]
    for dev in devs:
        with dev.create_stream() as s, hk.trace() as records:
            for dtype, n in [("float32", 5), ("float64", 5), ("float32", 9)]:
                if dtype == "float64" and not dev.capabilities.fp64:
                    continue
                x = np.arange(n, dtype=dtype)
                got = hk.add(
                    hal.asarray(x, device=dev), hal.asarray(x, device=dev), stream=s
                ).to_host(stream=s)
                assert got.dtype == np.dtype(dtype) and (got == 2 * x).all()
        assert all(r.device == str(dev) for r in records)
        by_dtype = {r.dtype: r.kernel_hash for r in records}
        assert by_dtype["float32"]
        if "float64" in by_dtype:  # one program per dtype: another hash
            assert by_dtype["float64"] != by_dtype["float32"]


def test_closed_buffer_is_rejected_after_cached_launches(
    kdev: hal.Device, stream: hal.Stream
) -> None:
    x = hal.asarray(np.ones(8, np.float32), device=kdev)
    y = hal.asarray(np.ones(8, np.float32), device=kdev)
    for _ in range(3):
        hk.add(x, y, out=y, stream=stream)
    stream.synchronize()
    x.buffer.close()
    with pytest.raises(hal.InvalidBufferError, match="add: x uses a closed buffer"):
        hk.add(x, y, out=y, stream=stream)
    prog = hk.compile(_AXPY, kdev, defines={"T": "hal_f32"})
    z = hal.asarray(np.ones(8, np.float32), device=kdev)
    for _ in range(2):
        prog.launch("axpy", 8, [y, z, 0.5, 8], stream=stream)
    z.buffer.close()
    with pytest.raises(hal.InvalidBufferError, match="closed"):
        prog.launch("axpy", 8, [y, z, 0.5, 8], stream=stream)
    assert (y.to_host(stream=stream) == 5.0).all()  # 1 + 1 + 1 + 1, then two axpy of 0.5 * 1


_AXPY = """
HAL_KERNEL void axpy(HAL_GLOBAL T* y, HAL_GLOBAL const T* x, hal_f64 alpha, hal_i64 n) {
    hal_i64 i = HAL_GLOBAL_ID(0);
    y[i] = (T)(alpha * x[i] + y[i]);
}
"""


def test_program_launch_checks_each_call_after_cached_ones(
    kdev: hal.Device, stream: hal.Stream
) -> None:
    prog = hk.compile(_AXPY, kdev, defines={"T": "hal_f32"})
    y = hal.asarray(np.zeros(4, np.float32), device=kdev)
    x = hal.asarray(np.ones(4, np.float32), device=kdev)
    for _ in range(3):
        prog.launch("axpy", 4, [y, x, 2.0, 4], stream=stream)
    wrong = hal.asarray(np.ones(4, np.float64), device=kdev)
    with pytest.raises(TypeError, match="argument 'x' wants float32, got an array of float64"):
        prog.launch("axpy", 4, [y, wrong, 2.0, 4], stream=stream)
    with pytest.raises(TypeError, match="takes 4 arguments, got 3"):
        prog.launch("axpy", 4, [y, x, 2.0], stream=stream)
    with pytest.raises(TypeError, match="must be a number"):
        prog.launch("axpy", 4, [y, x, "2", 4], stream=stream)
    other = next((d for d in hal.devices() if d != kdev), None)
    if other is not None:
        with other.create_stream() as s2:
            with pytest.raises(hal.DeviceMismatchError):
                prog.launch("axpy", 4, [y, x, 2.0, 4], stream=s2)
    prog.launch("axpy", [2], [y, x, 1.0, 4], stream=stream)  # another range: the same kernel
    assert y.to_host(stream=stream).tolist() == [7.0, 7.0, 6.0, 6.0]


def test_cached_route_still_honours_strict_mode_and_forced_routes(
    kdev: hal.Device, stream: hal.Stream, monkeypatch: pytest.MonkeyPatch
) -> None:
    x = hal.asarray(np.arange(4, dtype=np.float32), device=kdev)
    with hk.trace() as records:
        hk.exp(x, stream=stream)
        with hk.route("host"):
            hk.exp(x, stream=stream)
    assert [r.implementation for r in records] == ["generic", "host"]
    monkeypatch.setenv("HAL_KERNELS_STRICT", "1")
    with pytest.raises(hk.KernelFallbackError, match="'exp'"):
        hk.exp(x, stream=stream)


def test_a_collected_stream_drops_its_kept_arrays(kdev: hal.Device) -> None:
    import gc

    from hal.kernels import _generic

    s = kdev.create_stream()
    x = hal.asarray(np.ones(4, np.float32), device=kdev)
    hk.relu(x, stream=s)
    key = id(s)
    assert key in _generic._keep
    s.synchronize()
    del s
    gc.collect()
    assert key not in _generic._keep or _generic._keep[key][0]() is not None


def test_opencl_launch_runs_without_a_synchronize() -> None:
    """Work starts by itself, with or without a clFlush per command (the driver decides)."""
    import time

    dev = next((d for d in hal.devices() if d.backend == "opencl"), None)
    if dev is None:
        pytest.skip("no OpenCL device")
    x = hal.asarray(np.ones(1 << 16, np.float32), device=dev)
    with dev.create_stream() as s:
        hk.relu(x, out=x, stream=s)
        deadline = time.monotonic() + 30
        while not s.query():
            assert time.monotonic() < deadline, "an enqueued launch never ran"
            time.sleep(0.001)
    props = dev.properties()
    assert isinstance(props["flush_per_command"], bool)
    assert props["preferred_vector_width_float"] >= 1 and props["max_work_group_size"] >= 1


def test_opencl_local_size_divides_the_range() -> None:
    dev = next((d for d in hal.devices() if d.backend == "opencl"), None)
    if dev is None:
        pytest.skip("no OpenCL device")
    from hal.backends.opencl._kernels import local_size
    from hal.spi import impl_of

    prog = hk.compile(_AXPY, dev, defines={"T": "hal_f32"})
    impl = prog._impl
    impl.kernel("axpy")
    for n in (1, 7, 256, 1000, 1 << 20):
        ls = local_size(impl, "axpy", (n,))
        if impl_of(dev).is_cpu:
            assert ls is None  # the driver's choice on CPU devices
        else:
            assert ls is None or n % ls[0] == 0
    assert local_size(impl, "axpy", (16, 16)) is None
