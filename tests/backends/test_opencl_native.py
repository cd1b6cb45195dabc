"""The OpenCL backend's native launch helper (``backends/opencl/_native.py``, ``_launch.c``).

A repeated op call on OpenCL runs one C call (changed arguments + ``clEnqueueNDRangeKernel``
with no event). Each test runs on the native path and with ``HAL_OPENCL_NATIVE=0`` (PyOpenCL's
calls): results after arguments change, ordering with events and streams, freed memory, tracing,
and the fallback when the helper cannot be built (no C compiler on PATH)."""

from __future__ import annotations

import json
import logging
import os
import shutil
import sysconfig
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

import hal
import hal.kernels as hk
from hal.backends.opencl import _native
from hal.backends.opencl._kernels import translate_code
from hal.spi import impl_of


@pytest.fixture
def odev() -> hal.Device:
    dev = next((d for d in hal.devices() if d.backend == "opencl"), None)
    if dev is None or not dev.capabilities.kernels:
        pytest.skip("no OpenCL device with kernels")
    return dev


@pytest.fixture(params=["native", "pyopencl"])
def mode(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Each test on both paths (a launch is prepared per stream: the tests' streams are new)."""
    monkeypatch.setenv("HAL_OPENCL_NATIVE", "1" if request.param == "native" else "0")
    if request.param == "native" and _native.helper() is None:
        pytest.skip(f"native helper unavailable: {_native.unavailable_reason()}")
    return str(request.param)


@pytest.fixture
def ostream(odev: hal.Device, mode: str) -> Iterator[hal.Stream]:
    s = odev.create_stream()
    yield s
    s.close()


def _arr(dev: hal.Device, values: Any) -> hal.Array:
    return hal.asarray(np.asarray(values, dtype=np.float32), device=dev)


def _launched(stream: hal.Stream) -> int | None:
    """Launches the stream's native helper enqueued (None: no native launcher on it)."""
    c = impl_of(stream)._launched
    return None if c is None else int(c[0])


def test_the_helper_builds_where_a_compiler_and_python_headers_exist() -> None:
    have_cc = any(shutil.which(c) for c in ("cc", "gcc", "clang"))
    have_h = os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h"))
    if not (have_cc and have_h) or os.environ.get("HAL_OPENCL_NATIVE", "1") == "0":
        pytest.skip("no C compiler or Python headers here")
    h = _native.helper()
    assert h is not None, _native.unavailable_reason()
    assert h.mode == "api" and "libOpenCL" in os.path.basename(h.library)


def test_repeated_launches_take_one_native_call(
    odev: hal.Device, ostream: hal.Stream, mode: str, traced_calls: Any
) -> None:
    x, y, o = _arr(odev, [1, 2]), _arr(odev, [10, 20]), _arr(odev, [0, 0])
    for _ in range(2):
        hk.axpy(2.0, x, y, out=o, stream=ostream)
    before = _launched(ostream)
    simpl = impl_of(ostream)
    pending = len(simpl._pending)
    names = traced_calls(lambda: hk.axpy(3.0, x, y, out=o, stream=ostream), where=True)
    assert not any(n.endswith("_kernels.py:launch") for n in names)
    if mode == "native":
        assert before is not None and _launched(ostream) == before + 1
        assert len(simpl._pending) == pending  # no event made for the launch
        # axpy, the launch cache's hit, its run, the stream check; the launch itself is a
        # builtin of the helper's extension module (a Python function in ABI mode)
        called = {n for n in names if not n.endswith("<lambda>")}
        h = _native.helper()
        assert h is not None
        assert len(called) <= (4 if h.make is not None else 5), sorted(called)
        assert any(n.endswith(":bound") for n in names) == (h.make is None)
    else:
        assert before is None and _launched(ostream) is None
        assert any(n.endswith(":bound") for n in names)  # the generated Python launch
    np.testing.assert_array_equal(o.to_host(stream=ostream), [13, 26])


def test_results_follow_every_argument_change(odev: hal.Device, ostream: hal.Stream) -> None:
    n = 5
    xs = [_arr(odev, np.arange(n) + k) for k in range(3)]
    ys = [_arr(odev, np.full(n, 10.0 * k)) for k in range(3)]
    outs = [_arr(odev, np.zeros(n)) for _ in range(12)]
    alphas = [2.0, 2.0, -1.0, 0.0, -0.0, 0.5, 3, 2.0, 2.0, 1e30, -2.5, 2.0]
    want = []
    for i, (alpha, o) in enumerate(zip(alphas, outs, strict=True)):
        x, y = xs[i % 3], ys[(i // 2) % 3]
        hk.axpy(alpha, x, y, out=o, stream=ostream)
        want.append(np.float32(alpha) * (np.arange(n) + i % 3) + np.float32(10.0 * ((i // 2) % 3)))
    for o, w in zip(outs, want, strict=True):
        got = o.to_host(stream=ostream)
        np.testing.assert_array_equal(got, w.astype(np.float32))
        assert (np.signbit(got) == np.signbit(w.astype(np.float32))).all()
    # in place, many times: each launch sees the previous one's result
    acc = _arr(odev, np.zeros(n))
    for _ in range(300):
        hk.axpy(1.0, xs[1], acc, out=acc, stream=ostream)
    np.testing.assert_array_equal(acc.to_host(stream=ostream), 300 * (np.arange(n) + 1.0))


def test_events_and_other_streams_see_the_launches(
    odev: hal.Device, ostream: hal.Stream, mode: str
) -> None:
    """An event recorded after event-less launches completes after them; a stream waiting
    for it reads their result; query and synchronize cover them."""
    n = 1024
    x, acc = _arr(odev, np.ones(n)), _arr(odev, np.zeros(n))
    with odev.create_stream() as other:
        for rnd in range(1, 4):
            for _ in range(200):
                hk.axpy(1.0, x, acc, out=acc, stream=ostream)
            ev = odev.create_event()
            ev.record(ostream)
            other.wait(ev)
            host = acc.to_host(stream=other)
            np.testing.assert_array_equal(host, np.full(n, 200.0 * rnd))
            assert ev.query()
    for _ in range(50):
        hk.axpy(1.0, x, acc, out=acc, stream=ostream)
    simpl = impl_of(ostream)
    ostream.query()  # looks at (a marker after) the launches: never blocks
    if mode == "native":
        assert simpl._marked == _launched(ostream)
    ostream.synchronize()
    assert ostream.query()
    np.testing.assert_array_equal(acc.to_host(stream=ostream), np.full(n, 650.0))


def test_closed_buffers_raise_and_enqueue_nothing(
    odev: hal.Device, ostream: hal.Stream, mode: str
) -> None:
    x, y, o = _arr(odev, [1, 2]), _arr(odev, [3, 4]), _arr(odev, [0, 0])
    for _ in range(2):
        hk.axpy(1.0, x, y, out=o, stream=ostream)
    ostream.synchronize()
    before = _launched(ostream)
    x.close()
    with pytest.raises(hal.InvalidBufferError, match="closed"):
        hk.axpy(1.0, x, y, out=o, stream=ostream)
    assert _launched(ostream) == before
    # at the SPI: memory freed since the last launch is refused before anything is enqueued
    prog = hk.compile(
        "HAL_KERNEL void scale(HAL_GLOBAL T* y, hal_f64 a, hal_i64 n) {"
        " hal_i64 i = HAL_GLOBAL_ID(0); y[i] = (T)(a * (double)y[i]); }",
        odev,
        defines={"T": "hal_f32"},
    )
    simpl, dimpl = impl_of(ostream), impl_of(odev)
    launch = simpl.launcher(prog._impl, "scale", (4, 1, 1), work=4)
    assert launch is not None and simpl.launches_retain_memory
    keep, gone = dimpl.alloc(16), dimpl.alloc(16)
    try:
        simpl.copy_from_host(keep, 0, np.ones(4, np.float32).data.cast("B"), 16)
        launch(keep, 0, 3.0, 4)
        launch(gone, 0, 3.0, 4)
        gone.free()
        simpl.synchronize()
        count = _launched(ostream)
        with pytest.raises(hal.StreamError, match="freed"):
            launch(gone, 0, 2.0, 4)
        assert _launched(ostream) == count and not simpl._pending
        launch(keep, 0, 2.0, 4)
        got = np.zeros(4, np.float32)
        simpl.copy_to_host(got.data.cast("B"), keep, 0, 16)
        simpl.synchronize()
        np.testing.assert_array_equal(got, [6] * 4)
    finally:
        keep.free()


def test_tracing_records_launches_of_a_learned_call(odev: hal.Device, ostream: hal.Stream) -> None:
    x, y, o = _arr(odev, [1, 2]), _arr(odev, [3, 4]), _arr(odev, [0, 0])
    for _ in range(3):
        hk.axpy(1.0, x, y, out=o, stream=ostream)
    with hal.trace() as tr:
        for k in range(3):
            hk.axpy(float(k), x, y, out=o, stream=ostream)
        ostream.synchronize()
    kernels = [e for e in tr.to_json()["traceEvents"] if e.get("cat") == "kernel"]
    assert [k["name"] for k in kernels] == ["axpy"] * 3
    json.dumps(kernels)
    hk.axpy(5.0, x, y, out=o, stream=ostream)  # after the trace: the learned path again
    np.testing.assert_array_equal(o.to_host(stream=ostream), [8, 14])


def test_launch_error_codes_become_hal_errors() -> None:
    oom = translate_code(-4, device="opencl:0", what="launching kernel k")
    assert isinstance(oom, hal.OutOfMemoryError) and "MEM_OBJECT_ALLOCATION_FAILURE" in str(oom)
    bad = translate_code(-54, device="opencl:0", what="launching kernel k")
    assert type(bad) is hal.StreamError and "launching kernel k failed: CL_" in str(bad)
    assert bad.code == "INVALID_WORK_GROUP_SIZE"


def test_without_a_compiler_launches_use_pyopencl_and_say_why(
    odev: hal.Device, tmp_path: Any, monkeypatch: pytest.MonkeyPatch, caplog: Any
) -> None:
    """No C compiler on PATH: the helper is not built (the reason logged and shown in the
    devices' properties), and launches take PyOpenCL's calls with the same results."""
    monkeypatch.setenv("HAL_OPENCL_NATIVE", "1")
    monkeypatch.setenv("PATH", str(tmp_path))  # an empty folder: no cc, gcc or clang
    monkeypatch.setattr(_native, "_tried", False)
    monkeypatch.setattr(_native, "_helper", None)
    monkeypatch.setattr(_native, "_reason", None)
    with caplog.at_level(logging.INFO, logger="hal.backends.opencl"):
        assert _native.helper() is None
    reason = _native.unavailable_reason()
    assert reason is not None and "no C compiler" in reason
    assert any("no C compiler" in r.getMessage() for r in caplog.records)
    props = odev.properties()
    assert props["native_launch"] is False and "no C compiler" in props["native_launch_reason"]
    x, y, o = _arr(odev, [1, 2]), _arr(odev, [3, 4]), _arr(odev, [0, 0])
    with odev.create_stream() as s:
        for k in range(4):
            hk.axpy(float(k), x, y, out=o, stream=s)
        assert _launched(s) is None
        np.testing.assert_array_equal(o.to_host(stream=s), [6, 10])


def test_the_abi_library_launches_through_cffi(
    odev: hal.Device, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where the extension module cannot be built (no Python headers) the plain library opened
    with cffi's ABI mode runs the same launches, through a generated Python launcher."""
    monkeypatch.setenv("HAL_OPENCL_NATIVE", "1")
    if _native.helper() is None:
        pytest.skip(f"native helper unavailable: {_native.unavailable_reason()}")
    abi = _native._make("abi")
    assert abi.mode == "abi" and abi.make is None
    monkeypatch.setattr(_native, "_helper", abi)
    n = 6
    x, y = _arr(odev, np.arange(n)), _arr(odev, np.ones(n))
    outs = [_arr(odev, np.zeros(n)) for _ in range(4)]
    with odev.create_stream() as s:
        for k, o in enumerate(outs):
            hk.axpy(float(k), x if k % 2 else y, y, out=o, stream=s)
        assert _launched(s) == 3  # the first call took the full path and learned
        for k, o in enumerate(outs):
            want = k * (np.arange(n) if k % 2 else np.ones(n)) + 1.0
            np.testing.assert_array_equal(o.to_host(stream=s), want.astype(np.float32))


def test_disabled_by_the_variable(odev: hal.Device, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HAL_OPENCL_NATIVE", "0")
    assert _native.helper() is None and _native.unavailable_reason() == "HAL_OPENCL_NATIVE=0"
    assert odev.properties()["native_launch_reason"] == "HAL_OPENCL_NATIVE=0"


def test_a_bad_switch_fails_the_stream_creation(
    odev: hal.Device, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HAL_OPENCL_NATIVE", "maybe")
    with pytest.raises(hal.ConfigError, match="HAL_OPENCL_NATIVE='maybe'"):
        odev.create_stream()
