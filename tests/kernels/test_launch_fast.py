"""The launch cache: a repeated op call of one kind takes the fast path; every change that can
make its answer wrong takes the full path (and raises the same error as a first call)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import hal
import hal.kernels as hk
import hal.kernels.spi as hks
from hal.kernels import _fast

pytestmark = pytest.mark.usefixtures("launch_hit")  # the launch cache's Python and C hits


def _counts(fn: Callable[[], Any]) -> tuple[int, int]:
    """Run ``fn``; return how many calls took the fast path and how many kinds were learned."""
    before = _fast.launch_counts()
    fn()
    after = _fast.launch_counts()
    return after["fast"] - before["fast"], after["learned"] - before["learned"]


def _arr(dev: hal.Device, values: Any, dtype: Any = np.float32) -> hal.Array:
    return hal.asarray(np.asarray(values, dtype=dtype), device=dev)


def test_repeated_calls_take_the_fast_path_with_their_own_arguments(
    kdev: hal.Device, stream: hal.Stream
) -> None:
    x, y, o = _arr(kdev, [1, 2, 3]), _arr(kdev, [10, 20, 30]), _arr(kdev, [0, 0, 0])
    assert _counts(lambda: hk.axpy(2.0, x, y, out=o, stream=stream)) == (0, 1)
    with hk.trace() as records:
        assert _counts(lambda: [hk.axpy(a, x, y, out=o, stream=stream) for a in (3.0, 4)]) == (2, 0)
    assert len(records) == 2 and records[0] is records[1] and records[0].op == "axpy"
    np.testing.assert_array_equal(o.to_host(stream=stream), [14, 28, 42])  # alpha=4, the last call
    # sum (dedicated with a `when` predicate on the CPU emulator) and a unary op: learned, then fast
    s0 = hal.asarray(np.zeros((), np.float32), device=kdev)
    for _ in range(2):
        hk.sum(x, out=s0, stream=stream)
        r = hk.relu(x, stream=stream)  # out allocated per call
    assert _counts(lambda: (hk.sum(x, out=s0, stream=stream), hk.relu(x, stream=stream))) == (2, 0)
    assert float(s0.to_host(stream=stream)) == 6.0
    np.testing.assert_array_equal(r.to_host(stream=stream), [1, 2, 3])


def test_a_closed_buffer_raises_the_first_calls_error(kdev: hal.Device, stream: hal.Stream) -> None:
    x, y = _arr(kdev, [1, 2]), _arr(kdev, [3, 4])
    hk.add(x, y, stream=stream)
    hk.add(x, y, stream=stream)
    stream.synchronize()
    x.close()
    with pytest.raises(hal.InvalidBufferError, match="add: x uses a closed buffer"):
        hk.add(x, y, stream=stream)


def test_other_dtype_shape_stream_or_device_take_the_full_path(
    kdev: hal.Device, stream: hal.Stream
) -> None:
    x32, y32 = _arr(kdev, [1, 2]), _arr(kdev, [3, 4])
    hk.mul(x32, y32, stream=stream)
    assert _counts(lambda: hk.mul(x32, y32, stream=stream)) == (1, 0)
    x3, y3 = _arr(kdev, [1, 2, 3]), _arr(kdev, [1, 1, 1])
    assert _counts(lambda: hk.mul(x3, y3, stream=stream)) == (0, 1)  # another shape
    if kdev.capabilities.fp64:
        x64, y64 = _arr(kdev, [1, 2], np.float64), _arr(kdev, [3, 4], np.float64)
        got: list[hal.Array] = []
        assert _counts(lambda: got.append(hk.mul(x64, y64, stream=stream))) == (0, 1)
        np.testing.assert_array_equal(got[0].to_host(stream=stream), [3, 8])
    with pytest.raises(ValueError, match="mul: x and y differ"):  # a mix is still refused
        hk.mul(x32, y3, stream=stream)
    with kdev.create_stream() as other:
        assert _counts(lambda: hk.mul(x32, y32, stream=other)) == (0, 1)  # each stream learns
        assert _counts(lambda: hk.mul(x32, y32, stream=other)) == (1, 0)
        other.synchronize()
    devs = hal.devices(kdev.backend)
    if len(devs) > 1:
        with devs[1].create_stream() as s1, pytest.raises(hal.DeviceMismatchError):
            hk.mul(x32, y32, stream=s1)


def test_out_aliasing_is_checked_per_call(kdev: hal.Device, stream: hal.Stream) -> None:
    buf = kdev.alloc(32)
    a, b = buf.view(np.float32, (4,)), buf.view(np.float32, (4,), offset=16)
    hal.copy(buf, np.arange(8, dtype=np.float32) / 8, stream=stream)
    x = _arr(kdev, [1, 1, 1, 1])
    hk.exp(x, out=a, stream=stream)
    hk.exp(x, out=a, stream=stream)  # learned, then fast: x and a share no buffer
    shifted = buf.view(np.float32, (4,), offset=4)  # same shape and dtype, overlaps a
    with pytest.raises(ValueError, match="out overlaps input 0"):
        hk.exp(a, out=shifted, stream=stream)
    hk.exp(b, out=b, stream=stream)  # in place (the same array): allowed, learned on its own
    hk.exp(b, out=b, stream=stream)
    got = b.to_host(stream=stream)
    np.testing.assert_allclose(
        got, np.exp(np.exp(np.arange(4, 8, dtype=np.float32) / 8)), rtol=1e-5
    )


def test_a_new_registration_takes_the_full_path(kdev: hal.Device, stream: hal.Stream) -> None:
    x = _arr(kdev, [-1, 2])
    hk.relu(x, stream=stream)
    assert _counts(lambda: hk.relu(x, stream=stream)) == (1, 0)
    calls: list[int] = []

    def mine(call: Any) -> None:
        calls.append(1)
        hk.scale(call.inputs[0], 1.0, out=call.out, stream=call.stream)

    hks.register("relu", kdev.backend, mine, dtypes=["float32"], name="test:fast-relu")
    try:
        with hk.trace() as records:
            assert _counts(lambda: hk.relu(x, stream=stream)) == (0, 2)  # relu and mine's scale
            assert _counts(lambda: hk.relu(x, stream=stream)) == (2, 0)
        assert [r.kernel for r in records if r.op == "relu"] == ["test:fast-relu"] * 2
        assert calls == [1, 1]
    finally:
        hal.runtime().clear_caches()


def test_a_when_predicate_is_asked_once_per_kind(kdev: hal.Device, stream: hal.Stream) -> None:
    asked: list[object] = []

    def when(call: Any) -> bool:
        asked.append(call.params["axis"])
        return call.params["axis"] is None

    def mine(call: Any) -> None:
        hk.scale(call.inputs[0], 0.0, out=call.inputs[0], stream=call.stream)  # visible effect

    hks.register("prod", kdev.backend, mine, dtypes=["float32"], when=when, name="test:prod")
    try:
        x = _arr(kdev, [[1, 2], [3, 4]])
        for _ in range(3):
            hk.prod(x, axis=1, stream=stream)  # the predicate says no: generic
        assert asked == [1]
        np.testing.assert_array_equal(
            hk.prod(x, axis=1, stream=stream).to_host(stream=stream), [2, 12]
        )
    finally:
        hal.runtime().clear_caches()


def test_strict_mode_and_options_are_seen_by_learned_calls(
    kdev: hal.Device, stream: hal.Stream, monkeypatch: pytest.MonkeyPatch
) -> None:
    x = _arr(kdev, [1, 2])
    hk.gelu(x, stream=stream)
    hk.gelu(x, stream=stream)
    assert _counts(lambda: hk.gelu(x, stream=stream)) == (1, 0)
    hk.configure(hk.KernelOptions(strict=True))
    try:
        with pytest.raises(hk.KernelFallbackError, match="'gelu'"):
            hk.gelu(x, stream=stream)
    finally:
        hk.configure(None)
    assert _counts(lambda: hk.gelu(x, stream=stream)) == (0, 1)  # configure() dropped the answers
    monkeypatch.setenv("HAL_KERNELS_STRICT", "1")
    with pytest.raises(hk.KernelFallbackError):
        hk.gelu(x, stream=stream)
    with hks.internal():  # a library's own step: strict mode does not apply, the fast path does
        assert _counts(lambda: hk.gelu(x, stream=stream)) == (1, 0)
    monkeypatch.delenv("HAL_KERNELS_STRICT")
    with hk.route("host"):  # a forced route: the full path, and the route it forces
        with hk.trace() as records:
            assert _counts(lambda: hk.gelu(x, stream=stream)) == (0, 0)
    assert records[0].implementation == "host"
    hal.runtime().reset()
    assert _counts(lambda: hk.gelu(x, stream=stream)) == (0, 1)
    stream.synchronize()
