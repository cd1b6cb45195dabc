"""Prepared dedicated launches: a dedicated implementation's ``prepare`` (``KernelRegistry.add``)
runs the launch cache's later calls of one kind (the CPU emulator's full reductions and softmax
through ``Program.launcher``), and every change after fast calls still takes the full path."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import hal
import hal.kernels as hk
import hal.kernels.spi as hks
from hal.kernels import _dispatch, _fast
from hal.spi import impl_of

pytestmark = pytest.mark.usefixtures("requires_cpu", "launch_hit")  # Python and C hits


@pytest.fixture
def s(cpu_kernel_stream: hal.Stream) -> hal.Stream:
    """A stream of cpu:0 with kernels, native and Python (tests/conftest.py's cpu_kernel_stream)."""
    return cpu_kernel_stream


def _arr(values: Any, dtype: Any = np.float32) -> hal.Array:
    return hal.asarray(np.asarray(values, dtype=dtype), device=hal.device("cpu:0"))


def _counts(fn: Any) -> tuple[int, int]:
    before = _fast.launch_counts()
    fn()
    after = _fast.launch_counts()
    return after["fast"] - before["fast"], after["learned"] - before["learned"]


def _dedicated(op: str) -> None:
    got = _dispatch.registry().lookup(op, "cpu", "float32")
    if got is None or not got[0].startswith("cpu:c."):
        pytest.skip("the CPU emulator's C kernels need cffi and a C compiler")


def test_repeated_sums_run_the_prepared_launch(
    s: hal.Stream, traced_calls: Callable[..., set[str]]
) -> None:
    _dedicated("sum")
    x, r = _arr([1, 2, 3, 4]), _arr(0.0)
    hk.sum(x, out=r, stream=s)
    hk.sum(x, out=r, stream=s)  # learned: the implementation's prepared call from now on
    native = impl_of(s).native is not None
    names = traced_calls(lambda: [hk.sum(x, out=r, stream=s) for _ in range(2)])
    assert "_full_reduction" not in names and "OpCall" not in names  # no OpCall, no dispatch
    assert ("bound" in names) is native  # the stream's generated launch (native streams)
    assert float(r.to_host(stream=s)) == 10.0
    with hk.trace() as records:
        assert _counts(lambda: hk.sum(x, out=r, stream=s)) == (1, 0)
    assert [(rec.implementation, rec.kernel) for rec in records] == [
        ("dedicated", "cpu:c.sum_full(simd)")
    ]
    # each call's own arrays (same kind: another input of the same shape, max and min too)
    y = _arr([5, -7, 1, 2])
    assert _counts(lambda: hk.sum(y, out=r, stream=s)) == (1, 0)
    assert float(r.to_host(stream=s)) == 1.0
    for op, want in (("max", 5.0), ("min", -7.0)):
        fn = getattr(hk, op)
        fn(y, out=r, stream=s)
        assert _counts(lambda fn=fn: fn(y, out=r, stream=s)) == (1, 0)
        assert float(r.to_host(stream=s)) == want
    z = hk.sum(y, stream=s)  # an allocated output each call
    assert float(hk.sum(y, stream=s).to_host(stream=s)) == 1.0
    assert float(z.to_host(stream=s)) == 1.0


def test_repeated_softmax_runs_the_prepared_launch(
    s: hal.Stream, traced_calls: Callable[..., set[str]]
) -> None:
    _dedicated("softmax")
    host = np.array([[1.0, 2.0, 3.0], [0.0, 0.0, 0.0]], np.float32)
    x, o = _arr(host), _arr(np.zeros((2, 3)))
    hk.softmax(x, out=o, stream=s)
    hk.softmax(x, out=o, stream=s)
    assert "_rows_op" not in traced_calls(lambda: hk.softmax(x, out=o, stream=s))
    e = np.exp(host - host.max(axis=1, keepdims=True))
    np.testing.assert_allclose(o.to_host(stream=s), e / e.sum(axis=1, keepdims=True), rtol=1e-6)


def test_tracing_switched_on_after_fast_sums_records_the_call(s: hal.Stream) -> None:
    _dedicated("sum")
    x, r = _arr([1, 2]), _arr(0.0)
    for _ in range(3):
        hk.sum(x, out=r, stream=s)
    with hal.trace() as t:
        assert _counts(lambda: hk.sum(x, out=r, stream=s)) == (0, 0)  # the full path: a span
    s.synchronize()
    spans = [ev for ev in t.events if ev.get("name") == "sum"]
    assert len(spans) == 1 and spans[0]["args"]["implementation"] == "dedicated"
    assert _counts(lambda: hk.sum(x, out=r, stream=s)) == (1, 0)  # tracing off: fast again


def test_a_route_forced_in_another_thread_stops_every_hit(s: hal.Stream) -> None:
    _dedicated("sum")
    x, r = _arr([1, 2, 3]), _arr(0.0)
    assert _counts(lambda: hk.sum(x, out=r, stream=s)) == (0, 1)
    assert _counts(lambda: hk.sum(x, out=r, stream=s)) == (1, 0)
    entered, leave = threading.Event(), threading.Event()

    def forcing() -> None:
        with hk.route("generic"):
            entered.set()
            leave.wait(10)

    th = threading.Thread(target=forcing)
    th.start()
    try:
        assert entered.wait(10)
        with hk.trace() as records:  # this thread forces nothing: its usual route, unlearned
            assert _counts(lambda: hk.sum(x, out=r, stream=s)) == (0, 0)
        assert records[0].implementation == "dedicated"
    finally:
        leave.set()
        th.join()
    assert _counts(lambda: hk.sum(x, out=r, stream=s)) == (1, 0)  # the entry holds again
    with hk.route("generic"), hk.trace() as records:  # forced here: the route it forces
        assert _counts(lambda: hk.sum(x, out=r, stream=s)) == (0, 0)
    assert records[0].implementation == "generic"
    assert float(r.to_host(stream=s)) == 6.0


def test_closed_buffers_and_streams_after_fast_sums_raise_the_usual_errors(s: hal.Stream) -> None:
    _dedicated("sum")
    x, r = _arr([1, 2]), _arr(0.0)
    for _ in range(3):
        hk.sum(x, out=r, stream=s)
    s.synchronize()
    x2 = _arr([1, 2])
    hk.sum(x2, out=r, stream=s)
    x2.close()
    with pytest.raises(hal.InvalidBufferError, match="sum: x uses a closed buffer"):
        hk.sum(x2, out=r, stream=s)
    buf = hal.device("cpu:0").alloc(16)
    a, o = buf.view(np.float32, (2,)), buf.view(np.float32, (), offset=8)
    hal.copy(a, np.array([1, 2], np.float32), stream=s)
    for _ in range(3):  # learned, then fast: a and o share a buffer but do not overlap
        hk.sum(a, out=o, stream=s)
    assert float(o.to_host(stream=s)) == 3.0
    with pytest.raises(ValueError, match="sum: out"):  # out inside x: refused as on a first call
        hk.sum(a, out=buf.view(np.float32, (), offset=4), stream=s)
    s.close()
    with pytest.raises(hal.InvalidBufferError, match="closed"):
        hk.sum(x, out=r, stream=s)


def test_a_registered_prepare_runs_later_calls_of_its_kind() -> None:
    dev = hal.device("cpu:0")
    prepared: list[tuple[str, tuple[int, ...]]] = []
    impl_calls: list[int] = []

    def impl(call: Any) -> None:
        impl_calls.append(1)
        hk.scale(call.inputs[0], 2.0, out=call.out, stream=call.stream)

    def prepare(call: Any) -> Any:
        prepared.append((call.op, call.inputs[0].shape))

        def run(stream: hal.Stream, ins: Any, out: hal.Array, sc: Any) -> None:
            assert sc == ()
            hk.scale(ins[0], 3.0, out=out, stream=stream)  # visibly not impl's

        return run

    hks.register("exp", "cpu", impl, dtypes=["float64"], name="test:exp", prepare=prepare)
    try:
        with dev.create_stream() as st:
            x, o = _arr([1, 2], np.float64), _arr([0, 0], np.float64)
            hk.exp(x, out=o, stream=st)
            assert impl_calls == [1] and prepared == [("exp", (2,))]
            np.testing.assert_array_equal(o.to_host(stream=st), [2, 4])
            with hk.trace() as records:
                hk.exp(x, out=o, stream=st)
            assert [r.kernel for r in records if r.op == "exp"] == ["test:exp"]
            assert impl_calls == [1] and prepared == [("exp", (2,))]  # asked once per kind
            np.testing.assert_array_equal(o.to_host(stream=st), [3, 6])
            y = _arr([5, 6], np.float64)
            hk.exp(y, out=o, stream=st)  # same kind, its own arrays
            np.testing.assert_array_equal(o.to_host(stream=st), [15, 18])
    finally:
        hal.runtime().clear_caches()


def test_a_prepare_returning_none_keeps_the_implementation() -> None:
    dev = hal.device("cpu:0")
    impl_calls: list[int] = []

    def impl(call: Any) -> None:
        impl_calls.append(1)
        hk.scale(call.inputs[0], 2.0, out=call.out, stream=call.stream)

    hks.register("exp", "cpu", impl, dtypes=["float64"], name="test:exp", prepare=lambda c: None)
    try:
        with dev.create_stream() as st:
            x, o = _arr([1, 2], np.float64), _arr([0, 0], np.float64)
            for _ in range(3):
                hk.exp(x, out=o, stream=st)
            assert impl_calls == [1, 1, 1]
            np.testing.assert_array_equal(o.to_host(stream=st), [2, 4])
    finally:
        hal.runtime().clear_caches()


def test_bad_prepare_and_launcher_arguments_are_refused() -> None:
    with pytest.raises(TypeError, match="prepare=3 is not callable"):
        hks.register("exp", "cpu", lambda c: None, prepare=3)  # type: ignore[arg-type]
    dev = hal.device("cpu:0")
    if not dev.capabilities.kernels:
        pytest.skip("no kernels")
    prog = hk.compile(
        "HAL_KERNEL void k(HAL_GLOBAL hal_f32* o, hal_i64 n) {"
        " hal_i64 i = HAL_GLOBAL_ID(0); if (i < n) o[i] = 1; }",
        dev,
    )
    with dev.create_stream() as st:
        with pytest.raises(ValueError, match="kernel='nope' is not in this program"):
            prog.launcher("nope", 1, stream=st)
        with pytest.raises(TypeError, match=r"is not a hal\.Stream"):
            prog.launcher("k", 1, stream="s")  # type: ignore[arg-type]
        assert prog.launcher("k", 0, stream=st) is None  # an empty range launches nothing
        bound = prog.launcher("k", 4, stream=st)
        o = _arr([0, 0, 0, 0])
        if bound is None:  # a Python stream: Program.launch is the way
            return
        hal.spi.stream_impl(st)
        bound(o.spi_buffer.spi_memory, o.spi_offset, 4)
        np.testing.assert_array_equal(o.to_host(stream=st), [1, 1, 1, 1])
