"""Compile and launch portable kernels: same source, same results on every backend with kernels."""

from __future__ import annotations

import numpy as np
import pytest

import hal
import hal.kernels
from hal.kernels import KernelBuildError

SOURCE = """
HAL_KERNEL void axpy(HAL_GLOBAL T* y, HAL_GLOBAL const T* x, hal_f64 alpha, hal_i64 n) {
    hal_i64 i = HAL_GLOBAL_ID(0);
    if (i < n) y[i] = (T)(alpha * x[i] + y[i]);
}
HAL_DEVICE hal_f32 twice(hal_f32 v) { return v * 2.0f; }
HAL_KERNEL void grid(HAL_GLOBAL hal_f32* out, hal_i64 w, hal_i64 h) {
    hal_i64 x = HAL_GLOBAL_ID(0), y = HAL_GLOBAL_ID(1), z = HAL_GLOBAL_ID(2);
    out[(z * h + y) * w + x] = twice((hal_f32)(x + 10 * y + 100 * z)) + (hal_f32)HAL_GLOBAL_SIZE(2);
}
"""


def _run_axpy(dev: hal.Device, dtype: str) -> np.ndarray:
    prog = hal.kernels.compile(
        SOURCE, dev, defines={"T": {"float32": "hal_f32", "float64": "hal_f64"}[dtype]}
    )
    rng = np.random.default_rng(3)
    x = rng.standard_normal(1000).astype(dtype)
    y = rng.standard_normal(1000).astype(dtype)
    with dev.create_stream() as s:
        hx = hal.asarray(np.concatenate([np.zeros(5, dtype), x]), device=dev)
        hy = hal.asarray(y, device=dev)
        xv = hx.buffer.view(dtype, 1000, offset=5 * np.dtype(dtype).itemsize)  # an offset view
        prog.launch("axpy", 1000, [hy, xv, 0.25, 1000], stream=s)
        return hy.to_host(stream=s)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_same_source_same_results_on_every_backend(dtype: str) -> None:
    from tests.kernels.conftest import kernel_backends

    results = {b: _run_axpy(hal.device(f"{b}:0"), dtype) for b in kernel_backends()}
    rng = np.random.default_rng(3)
    x = rng.standard_normal(1000).astype(dtype)
    y = rng.standard_normal(1000).astype(dtype)
    expect = 0.25 * x.astype(np.float64) + y
    for b, got in results.items():
        np.testing.assert_allclose(got, expect, rtol=1e-6, atol=1e-6, err_msg=b)
    first = next(iter(results.values()))
    for b, got in results.items():
        np.testing.assert_allclose(
            got, first, rtol=2e-7 if dtype == "float32" else 1e-15, err_msg=b
        )


def test_three_dimensional_range(kdev: hal.Device, stream: hal.Stream) -> None:
    prog = hal.kernels.compile(SOURCE, kdev, defines={"T": "hal_f32"})
    w, h, d = 7, 5, 3
    out = hal.asarray(np.zeros(w * h * d, np.float32), device=kdev)
    prog.launch("grid", (w, h, d), [out, w, h], stream=stream)
    got = out.to_host(stream=stream).reshape(d, h, w)
    z, y, x = np.meshgrid(np.arange(d), np.arange(h), np.arange(w), indexing="ij")
    np.testing.assert_array_equal(got, 2.0 * (x + 10 * y + 100 * z) + d)


def test_compile_error_raises_with_build_log(kdev: hal.Device) -> None:
    bad = "HAL_KERNEL void broken(HAL_GLOBAL hal_f32* p) { p[0] = undeclared_name; }"
    with pytest.raises(KernelBuildError) as info:
        hal.kernels.compile(bad, kdev)
    assert "undeclared_name" in info.value.build_log
    assert "undeclared_name" in str(info.value)
    assert isinstance(info.value, hal.HalError)


def test_launch_validates_before_enqueueing(kdev: hal.Device, stream: hal.Stream) -> None:
    prog = hal.kernels.compile(SOURCE, kdev, defines={"T": "hal_f32"})
    y = hal.asarray(np.ones(4, np.float32), device=kdev)
    x64 = hal.asarray(np.ones(4, np.float64), device=kdev)
    with pytest.raises(ValueError, match="kernel='nope'"):
        prog.launch("nope", 4, [], stream=stream)
    with pytest.raises(TypeError, match="takes 4 arguments, got 3"):
        prog.launch("axpy", 4, [y, y, 1.0], stream=stream)
    with pytest.raises(TypeError, match="wants float32, got an array of float64"):
        prog.launch("axpy", 4, [y, x64, 1.0, 4], stream=stream)
    with pytest.raises(TypeError, match="must be a number"):
        prog.launch("axpy", 4, [y, y, "1.0", 4], stream=stream)
    with pytest.raises(ValueError, match="1 to 3 dimensions"):
        prog.launch("axpy", (1, 1, 1, 1), [y, y, 1.0, 4], stream=stream)
    with pytest.raises(ValueError, match=">= 0"):
        prog.launch("axpy", -1, [y, y, 1.0, 4], stream=stream)
    np.testing.assert_array_equal(y.to_host(stream=stream), np.ones(4))


def test_launch_rejects_other_device(stream: hal.Stream, kdev: hal.Device) -> None:
    others = [d for d in hal.devices(kdev.backend) if d != kdev]
    if not others:
        pytest.skip("needs a second device")
    prog = hal.kernels.compile(SOURCE, kdev, defines={"T": "hal_f32"})
    y = hal.asarray(np.ones(4, np.float32), device=others[0])
    with pytest.raises(hal.DeviceMismatchError):
        prog.launch("axpy", 4, [y, y, 1.0, 4], stream=stream)
    with others[0].create_stream() as s2, pytest.raises(hal.DeviceMismatchError):
        prog.launch("axpy", 4, [y, y, 1.0, 4], stream=s2)


def test_empty_range_enqueues_nothing(kdev: hal.Device, stream: hal.Stream) -> None:
    prog = hal.kernels.compile(SOURCE, kdev, defines={"T": "hal_f32"})
    y = hal.asarray(np.ones(4, np.float32), device=kdev)
    prog.launch("axpy", 0, [y, y, 1.0, 4], stream=stream)
    np.testing.assert_array_equal(y.to_host(stream=stream), np.ones(4))


def test_program_describes_itself(kdev: hal.Device) -> None:
    prog = hal.kernels.compile(SOURCE, kdev, defines={"T": "hal_f32"})
    assert set(prog.kernels) == {"axpy", "grid"}
    assert len(prog.hash) == 16 and prog.key.startswith(prog.hash)
    assert prog.source == hal.kernels.translate(SOURCE, kdev.backend, defines={"T": "hal_f32"})
    assert hal.kernels.compile(SOURCE, kdev, defines={"T": "hal_f32"}) is prog
