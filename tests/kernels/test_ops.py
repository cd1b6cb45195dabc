"""The op library: every op × dtype against the NumPy reference on every backend, and validation."""

from __future__ import annotations

import numpy as np
import pytest

import hal
import hal.kernels as hk
import hal.kernels.spi as hks
from hal.kernels._accuracy import accuracy


def test_every_op_and_dtype_matches_the_reference(kernel_backend: str) -> None:
    rows = accuracy(kernel_backend)
    failed = [r.to_dict() for r in rows if not r.passed]
    assert not failed, failed
    ops = {r.op for r in rows}
    assert ops == set(hks.OPS)
    assert {r.dtype for r in rows if r.op == "matmul"} == {"float16", "float32", "float64"}


# -- the contract hal.comm relies on -------------------------------------------------------
@pytest.mark.parametrize("dtype", ["float32", "float64", "int32", "int64"])
@pytest.mark.parametrize("op", ["sum", "prod", "max", "min"])
def test_accumulate_contract(kdev: hal.Device, stream: hal.Stream, op: str, dtype: str) -> None:
    rng = np.random.default_rng(7)
    a = (rng.standard_normal(1031) * 10).astype(dtype)
    b = (rng.standard_normal(1031) * 10).astype(dtype)
    dst, src = hal.asarray(a, device=kdev), hal.asarray(b, device=kdev)
    assert hk.accumulate(dst, src, op=op, stream=stream) is None
    ufunc = {"sum": np.add, "prod": np.multiply, "max": np.maximum, "min": np.minimum}[op]
    np.testing.assert_array_equal(dst.to_host(stream=stream), ufunc(a, b))
    np.testing.assert_array_equal(src.to_host(stream=stream), b)


def test_scale_in_place_makes_an_average(kdev: hal.Device, stream: hal.Stream) -> None:
    x = hal.asarray(np.arange(8, dtype=np.float32) * 4, device=kdev)
    assert hk.scale(x, 0.25, out=x, stream=stream) is x
    np.testing.assert_array_equal(x.to_host(stream=stream), np.arange(8, dtype=np.float32))


def test_accumulate_is_ordered_on_the_stream(kdev: hal.Device, stream: hal.Stream) -> None:
    dst = hal.asarray(np.zeros(4096, np.float32), device=kdev)
    one = hal.asarray(np.ones(4096, np.float32), device=kdev)
    for _ in range(50):
        hk.accumulate(dst, one, op="sum", stream=stream)
    np.testing.assert_array_equal(dst.to_host(stream=stream), np.full(4096, 50, np.float32))


def test_accumulate_rejects_bad_input_before_enqueueing(
    kdev: hal.Device, stream: hal.Stream
) -> None:
    dst = hal.asarray(np.zeros(4, np.float32), device=kdev)
    with pytest.raises(ValueError, match="op='avg'"):
        hk.accumulate(dst, dst, op="avg", stream=stream)
    with pytest.raises(ValueError, match="differ"):
        hk.accumulate(
            dst, hal.asarray(np.zeros(5, np.float32), device=kdev), op="sum", stream=stream
        )
    with pytest.raises(ValueError, match="differ"):
        hk.accumulate(
            dst, hal.asarray(np.zeros(4, np.float64), device=kdev), op="sum", stream=stream
        )
    with pytest.raises(TypeError, match="int16"):  # uint8 is an accumulate dtype since #11
        u = hal.asarray(np.zeros(4, np.int16), device=kdev)
        hk.accumulate(u, u, op="sum", stream=stream)
    with pytest.raises(TypeError, match="stream"):
        hk.accumulate(dst, dst, op="sum", stream=None)  # type: ignore[arg-type]


# -- shapes, axes, aliasing, empties ---------------------------------------------------------
def test_axis_reductions_and_negative_axis(kdev: hal.Device, stream: hal.Stream) -> None:
    x = np.random.default_rng(1).standard_normal((3, 4, 5)).astype(np.float64)
    hx = hal.asarray(x, device=kdev)
    for axis in (0, 1, 2, -1, -3):
        np.testing.assert_allclose(
            hk.sum(hx, axis, stream=stream).to_host(stream=stream), x.sum(axis), rtol=1e-12
        )
        np.testing.assert_array_equal(
            hk.max(hx, axis=axis, stream=stream).to_host(stream=stream), x.max(axis)
        )
    assert hk.sum(hx, stream=stream).shape == ()
    with pytest.raises(ValueError, match="axis=3"):
        hk.sum(hx, 3, stream=stream)


def test_empty_reductions(kdev: hal.Device, stream: hal.Stream) -> None:
    e = hal.asarray(np.zeros((0, 3), np.float32), device=kdev)
    assert hk.sum(e, stream=stream).to_host(stream=stream) == 0
    assert hk.prod(e, stream=stream).to_host(stream=stream) == 1
    np.testing.assert_array_equal(hk.sum(e, 0, stream=stream).to_host(stream=stream), np.zeros(3))
    with pytest.raises(ValueError, match="zero-size"):
        hk.max(e, stream=stream)


def test_axpy_defaults_to_in_place(kdev: hal.Device, stream: hal.Stream) -> None:
    x = hal.asarray(np.ones(10, np.float32), device=kdev)
    y = hal.asarray(np.arange(10, dtype=np.float32), device=kdev)
    assert hk.axpy(2.0, x, y, stream=stream) is y
    np.testing.assert_array_equal(y.to_host(stream=stream), np.arange(10) + 2)


def test_out_validation(kdev: hal.Device, stream: hal.Stream) -> None:
    a = hal.asarray(np.ones((4, 4), np.float32), device=kdev)
    with pytest.raises(ValueError, match="expected"):
        hk.add(a, a, out=hal.asarray(np.ones(16, np.float32), device=kdev), stream=stream)
    with pytest.raises(ValueError, match="overlaps"):
        hk.matmul(a, a, out=a, stream=stream)
    with pytest.raises(ValueError, match="do not chain"):
        hk.matmul(a, hal.asarray(np.ones((3, 4), np.float32), device=kdev), stream=stream)
    with pytest.raises(ValueError, match="last axis"):
        hk.softmax(a, axis=0, stream=stream)
    with pytest.raises(TypeError, match="alpha"):
        hk.scale(a, "2", stream=stream)  # type: ignore[arg-type]


def test_norms_with_weight_and_bias(kdev: hal.Device, stream: hal.Stream) -> None:
    rng = np.random.default_rng(2)
    x = rng.standard_normal((6, 33))
    w, b = rng.standard_normal(33), rng.standard_normal(33)
    hx, hw, hb = (hal.asarray(v, device=kdev) for v in (x, w, b))
    got = hk.layernorm(hx, hw, hb, eps=1e-5, stream=stream).to_host(stream=stream)
    ref = (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + 1e-5) * w + b
    np.testing.assert_allclose(got, ref, rtol=1e-12, atol=1e-12)
    got = hk.rmsnorm(hx, hw, eps=1e-6, stream=stream).to_host(stream=stream)
    np.testing.assert_allclose(
        got, x / np.sqrt((x * x).mean(-1, keepdims=True) + 1e-6) * w, rtol=1e-12
    )
    with pytest.raises(ValueError, match="weight must have shape"):
        hk.rmsnorm(hx, hal.asarray(np.ones(3), device=kdev), stream=stream)


def test_cast_between_dtypes(kdev: hal.Device, stream: hal.Stream) -> None:
    x = hal.asarray(np.array([1.75, -2.5, 3.0, 1e6]), device=kdev)
    assert hk.cast(x, "int32", stream=stream).to_host(stream=stream).tolist() == [1, -2, 3, 1000000]
    f = hk.cast(x, np.float32, stream=stream).to_host(stream=stream)
    assert f.dtype == np.float32 and f.tolist() == [1.75, -2.5, 3.0, 1e6]


def test_temporaries_stay_alive_until_the_stream_is_past_them(
    kdev: hal.Device, stream: hal.Stream
) -> None:
    import gc

    x = hal.asarray(np.ones((64, 32), np.float32), device=kdev)
    w = hal.asarray(np.full((32, 16), 0.5, np.float32), device=kdev)
    y = hal.asarray(np.ones((64, 16), np.float32), device=kdev)
    outs = []
    # Everything older than the loop (the test process's whole heap: torch, NumPy, ...) moves to
    # the permanent generation: each full collection below then scans only what the loop made,
    # the temporaries included (the same check, not one collection of the whole heap per call).
    gc.freeze()
    try:
        for i in range(100):  # the matmul output is garbage as soon as sub has been enqueued
            outs.append(
                hk.scale(
                    hk.sub(hk.matmul(x, w, stream=stream), y, stream=stream),
                    float(i),
                    stream=stream,
                )
            )
            gc.collect()
    finally:
        gc.unfreeze()
    for i in (0, 1, 99):
        np.testing.assert_array_equal(
            outs[i].to_host(stream=stream), np.full((64, 16), 15.0 * i, np.float32)
        )
