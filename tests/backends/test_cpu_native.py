"""The CPU emulator's native stream runtime (HAL_CPU_NATIVE) beside the Python workers.

Every test runs on real streams of the emulator; the ones parametrized over ``mode`` run once
on native streams and once on the Python workers (``HAL_CPU_NATIVE=0``), and check that both
give the same results.
"""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest

import hal
import hal.kernels
from hal.backends.cpu import _faults, _native, clear_faults, inject_fault
from hal.backends.cpu._backend import CpuStream
from hal.backends.cpu._worker import Worker
from hal.spi import impl_of

pytestmark = pytest.mark.usefixtures("requires_cpu")


def _native_or_skip() -> None:
    if _native.runtime() is None:
        pytest.skip(str(_native.unavailable_reason()))


@pytest.fixture(params=["native", "python"])
def mode(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """Streams and events made in the test are native ones, or Python ones (HAL_CPU_NATIVE=0)."""
    if request.param == "native":
        _native_or_skip()
        monkeypatch.setenv("HAL_CPU_NATIVE", "1")
    else:
        monkeypatch.setenv("HAL_CPU_NATIVE", "0")
    yield str(request.param)


def _impl(s: hal.Stream) -> CpuStream:
    impl = impl_of(s)
    assert isinstance(impl, CpuStream)
    return impl


def test_streams_follow_hal_cpu_native(monkeypatch: pytest.MonkeyPatch) -> None:
    _native_or_skip()
    dev = hal.device("cpu:0")
    monkeypatch.setenv("HAL_CPU_NATIVE", "1")
    with dev.create_stream() as s:
        assert isinstance(_impl(s).native, _native.NativeWorker)
        assert dev.properties()["native_runtime"] is True
    monkeypatch.setenv("HAL_CPU_NATIVE", "0")
    with dev.create_stream() as s:
        assert _impl(s).native is None
        assert isinstance(_impl(s).worker._worker, Worker)
        props = dev.properties()
        assert props["native_runtime"] is False and props["native_reason"] == "HAL_CPU_NATIVE=0"
    monkeypatch.setenv("HAL_CPU_NATIVE", "maybe")
    with pytest.raises(hal.ConfigError, match="HAL_CPU_NATIVE='maybe'"):
        dev.create_stream()


@pytest.mark.parametrize("nbytes", [1, 1000, 1 << 20])
def test_every_direction_and_memset(mode: str, nbytes: int) -> None:
    d0, d1 = hal.devices("cpu")[:2]
    rng = np.random.default_rng(nbytes)
    data = rng.integers(0, 256, nbytes, dtype=np.uint8)
    out = np.zeros(nbytes, np.uint8)
    with (
        d0.create_stream() as s,
        d0.alloc(nbytes) as a,
        d0.alloc(nbytes) as b,
        d1.alloc(nbytes) as p,
    ):
        hal.copy(a, data, stream=s)  # h2d
        hal.copy(b, a, stream=s)  # d2d
        hal.copy(p, b, stream=s)  # peer
        hal.memset(b, 0, stream=s)
        hal.copy(a, p, stream=s)  # peer, back
        hal.copy(out, a, stream=s)  # d2h
        s.synchronize()
        assert np.array_equal(out, data)
        hal.memset(a, 0xAB, stream=s, offset=nbytes // 2)
        hal.copy(out, a, stream=s, nbytes=nbytes - nbytes // 2, src_offset=nbytes // 2)
        s.synchronize()
        assert (out[: nbytes - nbytes // 2] == 0xAB).all()


def test_overlapping_copy_is_a_memmove(mode: str) -> None:
    dev = hal.device("cpu:0")
    data = np.arange(64, dtype=np.uint8)
    out = np.zeros(64, np.uint8)
    with dev.create_stream() as s, dev.alloc(64) as a:
        hal.copy(a, data, stream=s)
        hal.copy(a, a, stream=s, dst_offset=8, src_offset=0, nbytes=48)  # forward overlap
        hal.copy(out, a, stream=s)
        s.synchronize()
    expect = data.copy()
    expect[8:56] = data[0:48]
    assert np.array_equal(out, expect)


@pytest.mark.parametrize("nbytes", [2048, 4096 + 5, 64 << 10, (64 << 10) + 3, 300_000])
def test_copies_a_few_bytes_past_their_source_modulo_a_page(mode: str, nbytes: int) -> None:
    """Destination 16 bytes past the source modulo 4 KiB (copied in pieces, not one `rep movsb`):
    the bytes arrive, in every direction, inline and queued, and overlapping copies still move."""
    dev = hal.device("cpu:0")
    span = 2 * nbytes + 8192
    data = np.random.default_rng(nbytes).integers(0, 256, span, dtype=np.uint8)
    with dev.create_stream() as s, dev.alloc(span) as a:
        hal.copy(a, data, stream=s)
        dst = nbytes + 4096 - (nbytes % 4096) + 16  # past the source (offset 0), by 16 mod 4 KiB
        for queued in (False, True):
            gate = s.wait_host() if queued else None
            hal.copy(a, a, stream=s, dst_offset=dst, src_offset=0, nbytes=nbytes)
            if gate is not None:
                gate.set()
            s.synchronize()
            out = np.zeros(span, np.uint8)
            hal.copy(out, a, stream=s)
            s.synchronize()
            assert np.array_equal(out[dst : dst + nbytes], data[:nbytes])
            assert np.array_equal(out[:dst], data[:dst])
        # host memory 16 bytes past the device memory modulo 4 KiB, and the device memory past it
        base = impl_of(a).addr
        host = np.zeros(nbytes + 8192, np.uint8)
        skip = (base + 16 - host.ctypes.data) % 4096
        view = host[skip : skip + nbytes]
        hal.copy(view, a, stream=s, nbytes=nbytes)  # d2h
        s.synchronize()
        assert np.array_equal(view, data[:nbytes])
        skip = (base - 16 - host.ctypes.data) % 4096
        src = host[skip : skip + nbytes]
        src[:] = data[::-1][:nbytes]
        hal.copy(a, src, stream=s)  # h2d
        hal.copy(a, a, stream=s, dst_offset=16, nbytes=nbytes)  # overlapping: a memmove
        out = np.zeros(span, np.uint8)
        hal.copy(out, a, stream=s)
        s.synchronize()
        assert np.array_equal(out[16 : 16 + nbytes], data[::-1][:nbytes])


def test_queued_work_keeps_its_memory_alive(mode: str) -> None:
    """A device buffer closed and a host array dropped while copies wait in the queue: the data still lands."""
    dev = hal.device("cpu:0")
    out = np.zeros(4096, np.uint8)
    with dev.create_stream() as s:
        gate = s.wait_host()
        buf = dev.alloc(4096)
        hal.copy(buf, np.full(4096, 7, np.uint8), stream=s)  # the source array is a temporary
        hal.copy(out, buf, stream=s)
        buf.close()
        gc.collect()
        for _ in range(3):
            junk = [np.full(4096, 1, np.uint8) for _ in range(64)]  # reuse freed memory if any
            del junk
        assert (out == 0).all()
        gate.set()
        s.synchronize()
    assert (out == 7).all()


def test_events_order_streams_of_two_devices(mode: str) -> None:
    """cpu:1 waits for an event recorded on cpu:0 behind a host signal; timing events measure the wait."""
    d0, d1 = hal.devices("cpu")[:2]
    out = np.zeros(256, np.uint8)
    with d0.create_stream() as s0, d1.create_stream() as s1, d0.alloc(256) as a, d1.alloc(256) as b:
        start, done = d0.create_event(timing=True), d0.create_event(timing=True)
        hal.memset(a, 3, stream=s0)
        start.record(s0)
        gate = s0.wait_host()
        hal.memset(a, 5, stream=s0)
        done.record(s0)
        s1.wait(done)
        hal.copy(b, a, stream=s1)
        hal.copy(out, b, stream=s1)
        assert not done.query() and not s1.query()
        threading.Timer(0.02, gate.set).start()
        s1.synchronize()
        assert done.query() and start.query()
        assert (out == 5).all()
        ms = done.elapsed_ms(start)
        assert ms >= 10.0  # the stream waited for the timer's host signal in between
        start.close()
        done.close()


def test_an_event_never_recorded_and_a_rerecorded_one(mode: str) -> None:
    dev = hal.device("cpu:0")
    with dev.create_stream() as s, dev.create_stream() as t:
        ev = dev.create_event()
        assert ev.query()
        t.wait(ev)  # nothing recorded: nothing to wait for
        t.synchronize()
        gate = s.wait_host()
        ev.record(s)
        assert not ev.query()
        gate.set()
        ev.synchronize()
        ev.record(s)  # a second record replaces the first
        ev.synchronize()
        assert ev.query()


def test_settle_treats_a_host_wait_as_settled(mode: str) -> None:
    """DLPack export of a buffer whose stream waits for the host does not wait for the signal."""
    dev = hal.device("cpu:0")
    arr = hal.asarray(np.arange(16, dtype=np.float32), device=dev)
    with dev.create_stream() as s:
        gate = s.wait_host()
        hal.memset(arr.buffer, 0, stream=s)  # queued behind the gate
        view = np.from_dlpack(arr)  # settles: returns with the memset not run
        assert np.array_equal(view, np.arange(16, dtype=np.float32))
        gate.set()
        s.synchronize()
        assert (view == 0).all()
    arr.close()


_SCALARS = r"""
HAL_KERNEL void scalars(HAL_GLOBAL hal_f64* out, HAL_GLOBAL const hal_f32* x, hal_f32 a, hal_f64 b,
                        hal_i8 c, hal_u8 d, hal_i32 e, hal_u32 f, hal_i64 g, hal_u64 h) {
    hal_i64 i = HAL_GLOBAL_ID(0) + HAL_GLOBAL_ID(1) * HAL_GLOBAL_SIZE(0);
    out[i] = (hal_f64)x[i] * a + b + c + d + e + f + (hal_f64)g + (hal_f64)h + (hal_f64)HAL_GLOBAL_SIZE(1);
}
"""


def test_kernel_arguments_of_every_scalar_type(mode: str) -> None:
    """The argument block of the native call convention carries every scalar type and pointers."""
    dev = hal.device("cpu:0")
    if not dev.capabilities.kernels:
        pytest.skip(str(dev.capabilities.reason_absent("kernels")))
    prog = hal.kernels.compile(_SCALARS, dev)
    x = np.linspace(-2, 2, 24, dtype=np.float32)
    hx = hal.asarray(x, device=dev)
    out = hal.asarray(np.zeros(24), device=dev)
    args = [out, hx, 1.5, -0.25, -7, 200, -100000, 3000000000, -(1 << 40), (1 << 63) + 1]
    with dev.create_stream() as s:
        prog.launch("scalars", (12, 2), args, stream=s)
        s.synchronize()
    got = out.to_host()
    expect = (
        x.astype(np.float64) * np.float32(1.5)
        - 0.25
        - 7
        + 200
        - 100000
        + 3000000000
        - float(1 << 40)
        + float((1 << 63) + 1)
        + 2
    )
    np.testing.assert_allclose(got, expect, rtol=1e-12)
    hx.close()
    out.close()


def test_faults_injected_at_run_time_reach_native_streams(mode: str) -> None:
    """A native stream made before a fault was injected takes the fault model, and leaves it after clear."""
    dev = hal.device("cpu:0")
    out = np.zeros(64, np.uint8)
    with dev.create_stream() as s, dev.alloc(64) as a:
        hal.memset(a, 1, stream=s)
        s.synchronize()
        try:
            inject_fault(0, fail=True)
            hal.memset(a, 2, stream=s)
            with pytest.raises(hal.StreamError, match="injected fault"):
                s.synchronize()
        finally:
            clear_faults(0)
        hal.memset(a, 3, stream=s)
        hal.copy(out, a, stream=s)
        s.synchronize()
        assert (out == 3).all()
        assert _faults.faults(0).ops == 2  # counted on the cleared record


def test_python_callables_run_in_order_between_native_ops(mode: str) -> None:
    dev = hal.device("cpu:0")
    seen: list[int] = []
    out = np.zeros(8, np.uint8)
    with dev.create_stream() as s, dev.alloc(8) as a:
        impl = _impl(s)
        for i in range(20):
            hal.memset(a, i, stream=s)
            impl.submit(lambda i=i: seen.append(i))
        hal.copy(out, a, stream=s)
        s.synchronize()
    assert seen == list(range(20)) and (out == 19).all()


def test_a_closed_native_stream_refuses_work() -> None:
    _native_or_skip()
    s = hal.device("cpu:0").create_stream()
    impl = _impl(s)
    assert impl.native is not None
    thread = impl.worker._thread
    assert thread.is_alive()
    s.close()
    assert not thread.is_alive()
    with pytest.raises(hal.StreamError, match="closed"):
        impl.submit(lambda: None)
    with pytest.raises(hal.StreamError, match="closed"):
        impl.native.record(_native.new_mark(_native.runtime()))  # type: ignore[arg-type]


def test_jitter_on_native_streams(hal_env: Callable[..., None]) -> None:
    """HAL_CPU_JITTER delays native operations (never inline) and keeps them in order."""
    _native_or_skip()
    hal_env(HAL_BACKENDS="cpu", HAL_CPU_JITTER="11", HAL_CPU_NATIVE="1")
    dev = hal.device("cpu:0")
    assert dev.properties()["native_runtime"] is True
    outs = [np.zeros(64, np.uint8) for _ in range(6)]
    with dev.create_stream() as s, dev.alloc(64) as buf:
        for i, out in enumerate(outs):
            hal.memset(buf, i, stream=s)
            hal.copy(out, buf, stream=s)
        assert not s.query()  # jitter: nothing ran on the calling thread
        s.synchronize()
    assert [int(o[0]) for o in outs] == list(range(6))


def _run(code: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    full = {**os.environ, **env}
    full.pop("HAL_CPU_JITTER", None)
    return subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        env=full,
        check=False,
    )


_PROBE = (
    "import json, hal, numpy as np\n"
    "d = hal.device('cpu:0'); s = d.create_stream(); b = d.alloc(8)\n"
    "out = np.zeros(8, np.uint8); hal.memset(b, 9, stream=s); hal.copy(out, b, stream=s); s.synchronize()\n"
    "p = d.properties(); print(json.dumps([p['native_runtime'], p.get('native_reason'), int(out[0])]))\n"
)


def test_the_runtime_is_built_into_the_compile_cache(tmp_path: Path) -> None:
    _native_or_skip()
    env = {"HAL_CACHE_DIR": str(tmp_path), "HAL_BACKENDS": "cpu", "HAL_CPU_NATIVE": "1"}
    first = _run(_PROBE, env)
    assert first.returncode == 0, first.stderr
    assert json.loads(first.stdout.splitlines()[-1]) == [True, None, 9]
    entries = list((tmp_path / "kernels").glob("*.halk"))
    assert len(entries) == 1
    stamp = entries[0].stat().st_mtime_ns
    second = _run(_PROBE, env)  # loaded from the cache (the entry is touched, not rebuilt)
    assert second.returncode == 0, second.stderr
    assert json.loads(second.stdout.splitlines()[-1]) == [True, None, 9]
    assert list((tmp_path / "kernels").glob("*.halk")) == entries
    assert entries[0].stat().st_mtime_ns >= stamp


def test_without_a_compiler_the_python_workers_run(tmp_path: Path) -> None:
    """No C compiler on PATH: the streams fall back to Python with the reason logged and reported."""
    env = {
        "HAL_CACHE_DIR": str(tmp_path),
        "HAL_BACKENDS": "cpu",
        "PATH": str(tmp_path),  # no cc, no gcc
        "HAL_CPU_CC": "",
    }
    proc = _run(_PROBE, env)
    assert proc.returncode == 0, proc.stderr
    native, reason, value = json.loads(proc.stdout.splitlines()[-1])
    assert native is False and value == 9
    assert "C compiler" in reason and "Python worker threads" in reason
    assert "native stream runtime is unavailable" in proc.stderr


def test_the_abi_mode_library_runs_the_same_queue() -> None:
    """Where Python's headers are missing the runtime is a plain library opened with ffi.dlopen."""
    _native_or_skip()
    rt = _native._load(_native._build("abi"), "abi")
    assert rt.mode == "abi" and rt.fast is None  # no Python API in a plain library: cffi calls only
    w = _native.NativeWorker(rt, "cpu:0/abi", None)
    src, dst = np.arange(64, dtype=np.uint8), np.zeros(64, np.uint8)
    seen: list[np.ndarray] = []
    gate = _native.new_mark(rt)
    w.wait_host(gate)
    ps, pd = rt.from_buffer(rt.chars, src), rt.from_buffer(rt.chars, dst, True)
    addr = lambda p: int(rt.ffi.cast("uintptr_t", p))  # noqa: E731
    assert rt.lib.hal_rt_copy(w._s, addr(pd), addr(ps), 64, 1) > 0  # queued behind the host wait
    w.submit(lambda: seen.append(dst.copy()))
    assert not w.idle() and not seen
    rt.lib.hal_rt_mark_fire(gate)
    w.synchronize()
    assert np.array_equal(seen[0], src)
    w.close()
    assert not w._thread.is_alive()


_FRAMES = r"""
import gc, sys, numpy as np, hal
d = hal.device("cpu:0"); s = d.create_stream(); buf = d.alloc(999)
def tracer(frame, event, arg):
    if event == "line" and "seq" in frame.f_locals and frame.f_code.co_name in ("copy_to_host", "copy_from_host"):
        raise ValueError("stop")  # the copy's frame (with its locals) ends up in a traceback
    return tracer
caught = []
for _ in range(20):
    out = np.empty(999, np.uint8)
    for dst, src in ((buf, np.ones(999, np.uint8)), (out, buf)):
        sys.settrace(tracer)
        try:
            hal.copy(dst, src, stream=s)
        except ValueError as exc:
            exc.me = exc  # the exception, its traceback and the frames form a garbage cycle
            caught.append(exc)
        finally:
            sys.settrace(None)
    caught.clear()
    gc.collect()
s.synchronize()
print("ok", int(out[0]))
"""


def test_copy_frames_in_a_garbage_cycle(mode: str) -> None:
    """Frames of the copy calls collected in a cycle: no cffi view of a memoryview survives in them.

    A frame holding a memoryview and a live cffi export of it, collected in a cycle, crashes
    CPython's collector (it clears the memoryview first); the copies keep only the memoryview.
    """
    proc = _run(
        _FRAMES, {"HAL_BACKENDS": "cpu", "HAL_CPU_NATIVE": "1" if mode == "native" else "0"}
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert (
        "BufferError" not in proc.stderr
    )  # "Exception ignored in tp_clear": a memoryview still exported
    assert proc.stdout.split() == ["ok", "1"]
