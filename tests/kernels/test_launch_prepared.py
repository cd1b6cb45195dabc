"""Prepared launches (``StreamImpl.launcher``, SPI 1.2) on OpenCL: the launch cache's repeated
calls go through a launch the backend prepared once, which sets only the arguments that
changed since its last launch. Every launch must still see its own arguments, and memory
freed since raises without enqueuing anything."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest

import hal
import hal.kernels as hk
from hal.kernels import _fast
from hal.spi import impl_of

pytestmark = pytest.mark.usefixtures("launch_hit")  # the launch cache's Python and C hits


@pytest.fixture
def odev() -> hal.Device:
    dev = next((d for d in hal.devices() if d.backend == "opencl"), None)
    if dev is None or not dev.capabilities.kernels:
        pytest.skip("no OpenCL device with kernels")
    return dev


@pytest.fixture
def ostream(odev: hal.Device) -> Iterator[hal.Stream]:
    s = odev.create_stream()
    yield s
    s.close()


def _arr(dev: hal.Device, values: Any) -> hal.Array:
    return hal.asarray(np.asarray(values, dtype=np.float32), device=dev)


def test_repeated_calls_take_the_prepared_launch(
    odev: hal.Device, ostream: hal.Stream, traced_calls: Callable[..., set[str]]
) -> None:
    x, y, o = _arr(odev, [1, 2]), _arr(odev, [10, 20]), _arr(odev, [0, 0])
    for _ in range(2):
        hk.axpy(2.0, x, y, out=o, stream=ostream)
    launched = impl_of(ostream)._launched  # the native helper's launch count (None: not used)
    before = None if launched is None else int(launched[0])
    names = traced_calls(lambda: hk.axpy(3.0, x, y, out=o, stream=ostream), where=True)
    if before is None:
        assert any(n.endswith(":bound") for n in names)  # the backend's generated launch
    else:  # the backend's native launch (a builtin: no Python frame)
        assert int(launched[0]) == before + 1
    assert not any(
        n.endswith("_stream.py:launch") or n.endswith("_kernels.py:launch") for n in names
    )
    np.testing.assert_array_equal(o.to_host(stream=ostream), [13, 26])


def test_each_launch_sees_its_own_buffers_offsets_and_scalars(
    odev: hal.Device, ostream: hal.Stream
) -> None:
    """Arguments are compared with the values last set: buffers, offsets (views of one
    buffer), alpha, including -0.0 after 0.0 (equal, yet a different sign) and NaN."""
    n = 4
    with odev.alloc(4 * n * 4) as buf:
        views = [buf.view(np.float32, (n,), offset=4 * n * i) for i in range(4)]
        for i, v in enumerate(views):
            hal.copy(v, np.full(n, float(i + 1), np.float32), stream=ostream)
        other = _arr(odev, np.full(n, -0.0))
        outs = [_arr(odev, np.zeros(n)) for _ in range(10)]
        calls: list[tuple[float, hal.Array, hal.Array]] = [
            (2.0, views[0], views[1]),
            (2.0, views[0], views[1]),  # nothing changed
            (2.0, views[2], views[1]),  # x at another offset of the same buffer
            (0.5, views[2], views[3]),  # alpha and y changed
            (0.0, views[0], other),  # another buffer: 0 * 1 + -0.0 = +0.0
            (-0.0, views[0], other),  # equal to 0.0, but -0.0 * 1 + -0.0 = -0.0
            (float("nan"), views[0], views[1]),
            (float("nan"), views[1], views[1]),
            (3, views[3], views[0]),  # an int alpha
            (3.0, views[3], views[0]),
        ]
        for (alpha, x, y), o in zip(calls, outs, strict=True):
            hk.axpy(alpha, x, y, out=o, stream=ostream)
        host = {id(v): np.full(n, float(i + 1), np.float32) for i, v in enumerate(views)}
        host[id(other)] = np.full(n, -0.0, np.float32)
        for (alpha, x, y), o in zip(calls, outs, strict=True):
            want = np.float32(alpha) * host[id(x)] + host[id(y)]
            got = o.to_host(stream=ostream)
            np.testing.assert_array_equal(got, want)
            assert (np.signbit(got) == np.signbit(want)).all(), (alpha, got)
        for a in (other, *outs):
            a.close()


def test_unary_and_binary_ops_and_allocated_outputs(odev: hal.Device, ostream: hal.Stream) -> None:
    x, y = _arr(odev, [-1, 2, -3]), _arr(odev, [1, 1, 1])
    got = []
    for k in range(3):
        got.append(hk.relu(x, stream=ostream).to_host(stream=ostream))  # out allocated per call
        got.append(hk.add(x, y, stream=ostream).to_host(stream=ostream))
        if k == 1:
            hal.copy(x, np.array([4, -5, 6], np.float32), stream=ostream)
    np.testing.assert_array_equal(got[0], [0, 2, 0])
    np.testing.assert_array_equal(got[1], [0, 3, -2])
    np.testing.assert_array_equal(got[4], [4, 0, 6])
    np.testing.assert_array_equal(got[5], [5, -4, 7])


def test_freed_memory_raises_and_enqueues_nothing(odev: hal.Device, ostream: hal.Stream) -> None:
    """At the SPI: memory freed since the last launch is refused before anything is set or
    enqueued, and the launch works again with live memory."""
    prog = hk.compile(
        "HAL_KERNEL void scale(HAL_GLOBAL T* y, hal_f64 a, hal_i64 n) {"
        " hal_i64 i = HAL_GLOBAL_ID(0); y[i] = (T)(a * (double)y[i]); }",
        odev,
        defines={"T": "hal_f32"},
    )
    simpl, dimpl = impl_of(ostream), impl_of(odev)
    launch = simpl.launcher(prog._impl, "scale", (4, 1, 1), work=4)
    assert launch is not None
    keep, gone = dimpl.alloc(16), dimpl.alloc(16)
    try:
        ones = np.ones(4, np.float32)
        simpl.copy_from_host(keep, 0, ones.data.cast("B"), 16)
        launch(keep, 0, 3.0, 4)
        launch(gone, 0, 3.0, 4)
        gone.free()
        simpl.synchronize()
        with pytest.raises(hal.StreamError, match="freed"):
            launch(gone, 0, 2.0, 4)
        assert not simpl._pending  # nothing enqueued (synchronize emptied it)
        launch(keep, 0, 2.0, 4)  # the launch still works
        got = np.zeros(4, np.float32)
        simpl.copy_to_host(got.data.cast("B"), keep, 0, 16)
        simpl.synchronize()
        np.testing.assert_array_equal(got, [6] * 4)
    finally:
        keep.free()


def test_a_closed_stream_and_a_reset_take_the_full_path(odev: hal.Device) -> None:
    x = _arr(odev, [1, 2])
    s = odev.create_stream()
    for _ in range(2):
        hk.axpy(1.0, x, x, out=x, stream=s)
    s.close()
    with pytest.raises(hal.InvalidBufferError, match="closed"):
        hk.axpy(1.0, x, x, out=x, stream=s)
    with odev.create_stream() as s2:
        hk.axpy(1.0, x, x, out=x, stream=s2)
        hal.runtime().reset()  # drops every learned entry and its prepared launch
        before = _fast.launch_counts()["learned"]
        hk.axpy(1.0, x, x, out=x, stream=s2)
        assert _fast.launch_counts()["learned"] == before + 1
        np.testing.assert_array_equal(x.to_host(stream=s2), [16, 32])


def test_streams_of_several_threads_launch_the_same_kernel(odev: hal.Device) -> None:
    """Each stream's prepared launch owns its kernel object: no argument of one thread's
    launch leaks into another's."""
    errors: list[BaseException] = []

    def work(k: int) -> None:
        try:
            with odev.create_stream() as s:
                x, y = _arr(odev, [k] * 8), _arr(odev, [1] * 8)
                outs = [_arr(odev, [0] * 8) for _ in range(50)]
                for i, o in enumerate(outs):
                    hk.axpy(float(i), x, y, out=o, stream=s)
                for i, o in enumerate(outs):
                    np.testing.assert_array_equal(o.to_host(stream=s), [i * k + 1] * 8)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(k,)) for k in (2, 3, 5)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors


def test_debug_logging_switched_on_after_fast_calls_logs_each_call(
    odev: hal.Device, ostream: hal.Stream, caplog: pytest.LogCaptureFixture
) -> None:
    """The fast path reads the logger's answer cache first: a level change (which empties
    that cache) is seen at the next call."""
    import logging

    x = _arr(odev, [1, 2])
    for _ in range(3):
        hk.axpy(1.0, x, x, out=x, stream=ostream)
    assert not [r for r in caplog.records if r.name == "hal.kernels"]
    with caplog.at_level(logging.DEBUG, logger="hal.kernels"):
        before = _fast.launch_counts()["fast"]
        hk.axpy(1.0, x, x, out=x, stream=ostream)
        hk.axpy(1.0, x, x, out=x, stream=ostream)
        assert _fast.launch_counts()["fast"] == before + 2
    logged = [r for r in caplog.records if r.name == "hal.kernels" and "dispatch" in r.getMessage()]
    assert len(logged) == 2
    hk.axpy(1.0, x, x, out=x, stream=ostream)  # the level is back: nothing more
    assert len([r for r in caplog.records if r.name == "hal.kernels"]) == 2


def test_the_bench_times_the_default_route_unforced(odev: hal.Device) -> None:
    """``hal bench kernels`` times the route an op takes by itself without forcing it (a
    forced route bypasses the launch cache at every call, which no user's call does)."""
    from hal.cli.bench._kernels_run import _runs_unforced, bench

    x, y = _arr(odev, [1, 2]), _arr(odev, [3, 4])
    with odev.create_stream() as s:
        assert _runs_unforced(lambda: hk.add(x, y, stream=s), s, "generic")
        assert not _runs_unforced(lambda: hk.add(x, y, stream=s), s, "host")
    before = _fast.launch_counts()["fast"]
    rows = bench("opencl", ops=["axpy"], sizes={"axpy": [1024]}, batches=1)
    assert [r.implementation for r in rows] == ["generic"] and rows[0].raw_ratio is not None
    assert _fast.launch_counts()["fast"] - before >= 100  # the timed batch: cached launches
