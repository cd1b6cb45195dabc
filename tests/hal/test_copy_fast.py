"""hal.copy's fast path (whole operands, default offsets): after fast calls, every bad input still
raises the full path's error with no side effect, and queued copies keep their order and memory.

Each test runs on native streams of the CPU emulator (the backend's ``copy_from_array`` and
``copy_to_array`` take host arrays without a memoryview; small copies on an idle stream run in
the runtime's CPython builtins), on native streams of the runtime built for cffi's ABI mode (no
builtins: every copy through cffi) and on its Python workers (``HAL_CPU_NATIVE=0``: the backend
declines them and hal core takes its usual path).
"""

from __future__ import annotations

import gc
import logging
import os
import subprocess
import sys
import weakref
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

import hal
from hal import _copy
from hal.backends.cpu import _faults, _native, clear_faults, inject_fault
from hal.spi import impl_of

pytestmark = pytest.mark.usefixtures("requires_cpu")


_abi: list[_native.Runtime] = []  # the ABI-mode runtime, built (or taken from the cache) once


def _abi_runtime() -> _native.Runtime:
    if not _abi:
        _abi.append(_native._load(_native._build("abi"), "abi"))
    return _abi[0]


@pytest.fixture(params=["native", "abi", "python"])
def s(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[hal.Stream]:
    """A stream of cpu:0: a native one (extension module, or ABI mode), or a Python one."""
    if request.param == "python":
        monkeypatch.setenv("HAL_CPU_NATIVE", "0")
    else:
        if _native.runtime() is None:
            pytest.skip(str(_native.unavailable_reason()))
        monkeypatch.setenv("HAL_CPU_NATIVE", "1")
        if request.param == "abi":  # new streams take the plain library (no fast entries)
            monkeypatch.setattr(_native, "_runtime", _abi_runtime())
    with hal.device("cpu:0").create_stream() as stream:
        impl = impl_of(stream)
        if request.param == "abi":
            assert impl._rt.mode == "abi" and impl._fh2d is None
        elif request.param == "native" and impl._rt.mode == "api":
            assert impl._fh2d is not None  # the extension module's builtins
        yield stream


def _full_path_operands(monkeypatch: pytest.MonkeyPatch) -> list[object]:
    """Return the list that, from now on, gets each operand hal.copy resolves on its full path."""
    full: list[object] = []
    operand = _copy._operand

    def counted(value: object, name: str, writable: bool) -> Any:
        full.append(value)
        return operand(value, name, writable)

    monkeypatch.setattr(_copy, "_operand", counted)
    return full


def _warm(s: hal.Stream, a: hal.Buffer, b: hal.Buffer, host: np.ndarray) -> None:
    """Take every direction of the fast path once (h2d, d2d, d2h) and check the bytes."""
    out = np.zeros_like(host)
    hal.copy(a, host, stream=s)
    hal.copy(b, a, stream=s)
    hal.copy(out, b, stream=s)
    s.synchronize()
    assert np.array_equal(out, host)


def test_each_direction_counts_one_enqueue_and_moves_the_bytes(
    s: hal.Stream, monkeypatch: pytest.MonkeyPatch
) -> None:
    dev = s.device
    host = np.arange(256, dtype=np.uint8)
    with dev.alloc(256) as a, dev.alloc(256) as b:
        _warm(s, a, b, host)  # the first call of a dtype takes the full path (checks it once)
        full = _full_path_operands(monkeypatch)
        before = s.enqueue_count
        for _ in range(3):
            _warm(s, a, b, host)
        assert s.enqueue_count - before == 3 * 4  # three copies and a synchronize per round
        # native streams take host arrays in copy_from_array/copy_to_array; Python ones decline
        assert len(full) == (0 if impl_of(s).native is not None else 3 * 4)
        # typed views: hal.Array operands at an offset, host arrays of another dtype
        x = a.view(np.float32, 16, offset=64)
        src = np.linspace(0, 1, 16, dtype=np.float32)
        assert hal.copy(x, src, stream=s) == "local"
        back = np.empty(16, np.float32)
        assert hal.copy(back, x, stream=s) == "local"
        wide = np.full(64, -1, np.int32)  # a larger host destination: its first bytes only
        hal.copy(wide, b.view(np.int32, 8), stream=s)
        s.synchronize()
        np.testing.assert_array_equal(back, src)
        np.testing.assert_array_equal(wide[:8], host[:32].view(np.int32))
        assert (wide[8:] == -1).all()


def test_closed_buffers_and_stream_raise_after_fast_calls(s: hal.Stream) -> None:
    dev = s.device
    host = np.arange(64, dtype=np.uint8)
    a, b = dev.alloc(64), dev.alloc(64)
    _warm(s, a, b, host)
    b.close()
    count = s.enqueue_count
    for dst, src in ((b, a), (a, b), (b, host), (host, b)):
        with pytest.raises(hal.InvalidBufferError, match="buffer of 64 bytes on cpu:0 is closed"):
            hal.copy(dst, src, stream=s)
    view = a.view(np.uint8)
    a.close()
    with pytest.raises(hal.InvalidBufferError, match="is closed"):
        hal.copy(view, host, stream=s)
    assert s.enqueue_count == count  # nothing reached the stream
    with dev.alloc(64) as c, dev.alloc(64) as d:
        _warm(s, c, d, host)
        s.close()
        with pytest.raises(hal.InvalidBufferError, match="stream of cpu:0 is closed"):
            hal.copy(c, host, stream=s)
        with pytest.raises(hal.InvalidBufferError, match="stream of cpu:0 is closed"):
            hal.copy(c, d, stream=s)


def test_wrong_stream_and_sizes_raise_the_full_paths_errors(s: hal.Stream) -> None:
    d0, d1 = hal.devices("cpu")[:2]
    host = np.arange(64, dtype=np.uint8)
    with d0.alloc(64) as a, d0.alloc(64) as b, d0.alloc(32) as small, d1.create_stream() as s1:
        _warm(s, a, b, host)
        count = s.enqueue_count
        with pytest.raises(hal.DeviceMismatchError, match="stream belongs to cpu:1"):
            hal.copy(a, host, stream=s1)
        with pytest.raises(hal.DeviceMismatchError, match="stream belongs to cpu:1"):
            hal.copy(a, b, stream=s1)
        with pytest.raises(
            ValueError, match=r"nbytes=64 at dst_offset=0 overruns dst \(32 bytes\)"
        ):
            hal.copy(small, a, stream=s)
        with pytest.raises(
            ValueError, match=r"nbytes=64 at dst_offset=0 overruns dst \(32 bytes\)"
        ):
            hal.copy(small, host, stream=s)
        with pytest.raises(
            ValueError, match=r"nbytes=64 at dst_offset=0 overruns dst \(16 bytes\)"
        ):
            hal.copy(np.zeros(16, np.uint8), a, stream=s)
        with pytest.raises(TypeError, match=r"stream=None is not a hal\.Stream"):
            hal.copy(a, host, stream=None)  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="dst_offset=False must be an integer"):
            hal.copy(a, host, stream=s, dst_offset=False)
        assert s.enqueue_count == count
        s.synchronize()
        out = np.zeros(64, np.uint8)
        hal.copy(out, a, stream=s)
        s.synchronize()
        assert np.array_equal(out, host)  # the refused copies changed nothing


def test_host_arrays_the_fast_path_declines_raise_the_usual_errors(s: hal.Stream) -> None:
    dev = s.device
    host = np.arange(64, dtype=np.uint8)
    with dev.alloc(64) as a, dev.alloc(64) as b:
        _warm(s, a, b, host)
        count = s.enqueue_count
        ro = host.copy()
        ro.flags.writeable = False
        with pytest.raises(ValueError, match="dst is a read-only host buffer"):
            hal.copy(ro, a, stream=s)
        strided = np.zeros(128, np.uint8)[::2]
        with pytest.raises(ValueError, match="src is a non-contiguous host buffer"):
            hal.copy(a, strided, stream=s)
        with pytest.raises(ValueError, match="dst is a non-contiguous host buffer"):
            hal.copy(strided, a, stream=s)
        fortran = np.asfortranarray(np.zeros((8, 8), np.uint8))  # contiguous, but not in C order
        with pytest.raises(ValueError, match="src is a non-contiguous host buffer"):
            hal.copy(a, fortran, stream=s)
        with pytest.raises(ValueError, match="dst is a non-contiguous host buffer"):
            hal.copy(fortran, a, stream=s)
        with pytest.raises(TypeError, match="object"):
            hal.copy(a, np.array([object()] * 8), stream=s)
        assert s.enqueue_count == count
        assert (ro == host).all() and (strided == 0).all() and (fortran == 0).all()
        # the same arrays, made acceptable, pass
        hal.copy(a, np.ascontiguousarray(fortran), stream=s)
        s.synchronize()
        assert hal.copy(b, a, stream=s) == "local"


def test_queued_fast_copies_keep_order_and_their_host_memory(s: hal.Stream) -> None:
    """Copies queued behind a host wait: the temporary source array is kept alive, the order kept."""
    dev = s.device
    out = np.zeros(512, np.uint8)
    with dev.alloc(512) as a, dev.alloc(512) as b:
        hal.copy(a, np.zeros(512, np.uint8), stream=s)
        s.synchronize()
        gate = s.wait_host()
        src = np.full(512, 9, np.uint8)
        ref = weakref.ref(src)
        hal.copy(a, src, stream=s)  # queued: the stream waits for the gate
        del src
        hal.copy(b, a, stream=s)
        hal.copy(out, b, stream=s)
        ev = dev.create_event()
        ev.record(s)
        gc.collect()
        assert (out == 0).all() and not ev.query()
        if impl_of(s).native is not None:
            assert ref() is not None  # pinned until the copy ran
        gate.set()
        ev.synchronize()
        assert (out == 9).all()
        s.synchronize()


def test_faults_injected_after_fast_calls_apply_to_copies(s: hal.Stream) -> None:
    """The fast path follows the fault model's epoch: an injected failure reaches a copy."""
    dev = s.device
    host = np.arange(64, dtype=np.uint8)
    with dev.alloc(64) as a, dev.alloc(64) as b:
        _warm(s, a, b, host)
        ops = _faults.faults(0).ops
        hal.copy(a, host, stream=s)
        hal.copy(b, a, stream=s)
        s.synchronize()
        assert _faults.faults(0).ops == ops + 2  # the fast path counts its operations
        try:
            inject_fault(0, fail=True)
            hal.copy(a, host, stream=s)
            with pytest.raises(hal.StreamError, match="injected fault"):
                s.synchronize()
        finally:
            clear_faults(0)
        out = np.zeros(64, np.uint8)
        hal.copy(out, a, stream=s)
        s.synchronize()
        assert np.array_equal(out, host)


def test_fast_copies_log_like_the_full_path(
    s: hal.Stream, caplog: pytest.LogCaptureFixture
) -> None:
    dev = s.device
    a = dev.alloc(16)
    hal.copy(a, np.ones(16, np.uint8), stream=s)  # debug off: the logger's cache says so
    assert not caplog.records
    with caplog.at_level(logging.DEBUG, logger="hal.copy"):  # a level change empties it
        hal.copy(a, np.ones(16, np.uint8), stream=s)
        hal.copy(np.ones(16, np.uint8), a, stream=s)
        s.synchronize()
    lines = [r.getMessage() for r in caplog.records if r.name == "hal.copy"]
    assert lines == [
        "copy 16 bytes cpu:0 <- host path=local",
        "copy 16 bytes host <- cpu:0 path=local",
    ]
    a.close()


def test_explicit_zero_offsets_stay_fast_and_other_zeros_take_the_full_path(
    s: hal.Stream, monkeypatch: pytest.MonkeyPatch
) -> None:
    dev = s.device
    host = np.arange(128, dtype=np.uint8)
    with dev.alloc(128) as a, dev.alloc(128) as b:
        _warm(s, a, b, host)
        full = _full_path_operands(monkeypatch)
        assert hal.copy(b, host[::-1].copy(), stream=s, dst_offset=0, src_offset=0) == "local"
        assert len(full) == (0 if impl_of(s).native is not None else 2)
        full.clear()
        zeros: list[Any] = [np.int64(0), np.uint8(0)]
        assert hal.copy(a, b, stream=s, dst_offset=zeros[0], src_offset=zeros[1]) == "local"
        assert len(full) == 2  # a NumPy zero is not the int 0: the full path, same result
        out = np.zeros(128, np.uint8)
        hal.copy(out, a, stream=s)
        s.synchronize()
        assert np.array_equal(out, host[::-1])


def test_a_failure_queued_before_fast_copies_surfaces_at_synchronize(s: hal.Stream) -> None:
    """synchronize (one builtin on native streams) raises a queued callable's failure once."""
    dev = s.device
    host = np.arange(64, dtype=np.uint8)
    with dev.alloc(64) as a, dev.alloc(64) as b:
        _warm(s, a, b, host)
        impl_of(s).submit(lambda: 1 / 0)
        hal.copy(a, host[::-1].copy(), stream=s)
        with pytest.raises(hal.StreamError, match="ZeroDivisionError"):
            s.synchronize()
        s.synchronize()  # reported once
        out = np.zeros(64, np.uint8)
        hal.copy(out, a, stream=s)
        s.synchronize()
        assert np.array_equal(out, host[::-1])


def test_peer_copies_take_the_fast_path_and_raise_the_full_paths_errors(
    s: hal.Stream, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Whole buffers of two emulator devices (peer access), the stream on either: copy_peer
    without the general resolution; closed buffers, a third device's stream and sizes that do
    not fit still take the full path, as whole buffers of another backend do (staged)."""
    d0, d1 = hal.devices("cpu")[:2]
    host = np.arange(96, dtype=np.uint8)
    with d0.alloc(96) as a, d1.alloc(96) as b, d1.alloc(32) as small, d1.create_stream() as s1:
        hal.copy(a, host, stream=s)
        s.synchronize()
        full = _full_path_operands(monkeypatch)
        before = s.enqueue_count
        assert hal.copy(b, a, stream=s) == "peer"  # the stream on the source's device
        s.synchronize()
        assert hal.copy(a.view(np.uint8, 48, offset=48), b.view(np.uint8, 48), stream=s1) == "peer"
        s1.synchronize()
        assert not full and s.enqueue_count == before + 2
        out = np.zeros(96, np.uint8)
        hal.copy(out, a, stream=s)
        s.synchronize()
        assert np.array_equal(out, np.concatenate([host[:48], host[:48]]))
        with caplog.at_level(logging.DEBUG, logger="hal.copy"):
            hal.copy(b, a, stream=s)
        assert "copy 96 bytes cpu:1 <- cpu:0 path=peer" in [r.getMessage() for r in caplog.records]
        count = s.enqueue_count
        full.clear()
        with pytest.raises(
            ValueError, match=r"nbytes=96 at dst_offset=0 overruns dst \(32 bytes\)"
        ):
            hal.copy(small, a, stream=s)
        if len(hal.devices("cpu")) > 2:
            with hal.devices("cpu")[2].create_stream() as s2:
                with pytest.raises(hal.DeviceMismatchError, match="stream belongs to cpu:2"):
                    hal.copy(b, a, stream=s2)
        small.close()
        with pytest.raises(hal.InvalidBufferError, match="is closed"):
            hal.copy(small, a, stream=s)
        assert s.enqueue_count == count
        assert full == [small, a, small]  # each refused copy took the general resolution
        other = [d for d in hal.devices() if d.backend != "cpu"]
        if other:  # no peer path: staged through the host, by the full path
            with other[0].alloc(96) as c, other[0].create_stream() as so:
                assert hal.copy(c, a, stream=s) == "staged"
                back = np.zeros(96, np.uint8)
                hal.copy(back, c, stream=so)
                so.synchronize()
                assert np.array_equal(back, out)


def _fast_entries() -> tuple[Any, ...]:
    rt = _native.runtime()
    if rt is None or rt.fast is None:
        pytest.skip("no extension-module runtime (its CPython fast entries)")
    return rt.fast


def test_runtime_fast_entries_copy_only_on_an_idle_stream(monkeypatch: pytest.MonkeyPatch) -> None:
    """The builtins copy inline on an idle open stream, else do nothing and return False."""
    h2d, d2h, d2d, sync, _ = _fast_entries()
    monkeypatch.setenv("HAL_CPU_NATIVE", "1")
    rt = _native.runtime()
    assert rt is not None
    dev = hal.device("cpu:0")
    n = 256
    src = np.arange(n, dtype=np.uint8)
    out = np.zeros(n, np.uint8)
    with dev.create_stream() as s, dev.alloc(n) as a, dev.alloc(n) as b:
        w = impl_of(s).native
        sa, pa, pb = w.address, impl_of(a).addr, impl_of(b).addr
        done = rt.lib.hal_rt_completed(w._s)
        assert h2d(sa, pa, src, n) is True
        assert d2d(sa, pb, pa, n) is True
        assert d2h(sa, out, pb, n) is True
        assert np.array_equal(out, src) and w.idle()
        assert rt.lib.hal_rt_completed(w._s) == done + 3  # each counts as one operation
        assert sync(sa) is None
        # declined, nothing written: empty, too large for the builtins, larger than the buffer,
        # read-only or strided destinations, objects without a buffer
        out[:] = 0
        big = np.zeros(rt.fast_max + 1, np.uint8)
        ro = np.zeros(n, np.uint8)
        ro.flags.writeable = False
        assert h2d(sa, pa, src, 0) is False
        assert h2d(sa, pa, big, big.nbytes) is False
        assert h2d(sa, pa, src[:16], 32) is False
        assert d2h(sa, out[:16], pa, 32) is False
        assert d2h(sa, ro, pa, n) is False
        assert d2h(sa, np.zeros(2 * n, np.uint8)[::2], pa, n) is False
        assert h2d(sa, pa, [1, 2, 3], 3) is False
        assert d2d(sa, pb, pa, rt.fast_max + 1) is False
        assert not out.any() and not ro.any()
        with pytest.raises(TypeError, match="expected 4 arguments"):
            h2d(sa, pa, src)
        jittery = _native.NativeWorker(rt, "cpu:0/jitter", 7)
        try:
            assert h2d(jittery.address, pa, src, n) is False  # jitter: every op on the worker
        finally:
            jittery.close()
        # hal.copy of a host array on the idle stream goes through the builtin
        seen: list[bool] = []

        def counted(*args: Any) -> bool:
            seen.append(h2d(*args))
            return seen[-1]

        monkeypatch.setattr(impl_of(s), "_fh2d", counted)
        hal.copy(a, src, stream=s)
        assert seen == [True]
        # behind pending work (a host wait): nothing runs, the copies queue through cffi in order
        gate = s.wait_host()
        assert h2d(sa, pa, np.full(n, 7, np.uint8), n) is False
        assert d2d(sa, pb, pa, n) is False
        assert d2h(sa, out, pb, n) is False
        later = np.full(n, 9, np.uint8)
        hal.copy(a, later, stream=s)
        hal.copy(out, a, stream=s)
        assert not out.any() and len(w._pins) == 2  # queued, their memory pinned
        gate.set()
        s.synchronize()
        assert (out == 9).all() and not w._pins  # synchronize unpinned the completed work
        s.close()
        assert h2d(sa, pa, src, n) is False  # a closed stream: the cffi path raises


_FRAMES = r"""
import gc, sys, numpy as np, hal
from hal.backends.cpu import _native
N = _native.runtime().fast_max + 999  # past the runtime's fast entries: cffi's view of the array
d = hal.device("cpu:0"); s = d.create_stream(); buf = d.alloc(N)
hal.copy(buf, np.ones(N, np.uint8), stream=s); hal.copy(np.empty(N, np.uint8), buf, stream=s)
def tracer(frame, event, arg):
    if event == "line" and "seq" in frame.f_locals and frame.f_code.co_name in ("copy_to_array", "copy_from_array"):
        raise ValueError("stop")  # the fast copy's frame (with its cffi view) ends up in a traceback
    return tracer
caught, stopped = [], 0
for _ in range(20):
    out = np.empty(N, np.uint8)
    for dst, src in ((buf, np.ones(N, np.uint8)), (out, buf)):
        sys.settrace(tracer)
        try:
            hal.copy(dst, src, stream=s)
        except ValueError as exc:
            exc.me = exc  # the exception, its traceback and the frames form a garbage cycle
            caught.append(exc)
            stopped += 1
        finally:
            sys.settrace(None)
    caught.clear()
    gc.collect()
s.synchronize()
hal.copy(out, buf, stream=s); s.synchronize()
print("ok", stopped, int(out[0]))
"""


def test_fast_copy_frames_in_a_garbage_cycle() -> None:
    """The fast copies' frames (a host array and cffi's view of it) collected in a cycle: no crash."""
    if _native.runtime() is None:
        pytest.skip(str(_native.unavailable_reason()))
    env = {**os.environ, "HAL_BACKENDS": "cpu", "HAL_CPU_NATIVE": "1"}
    env.pop("HAL_CPU_JITTER", None)
    proc = subprocess.run(
        [sys.executable, "-c", _FRAMES],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "BufferError" not in proc.stderr
    assert proc.stdout.split() == ["ok", "40", "1"]
