"""The launch cache's hit in C (``kernels/_hit.c``, ``HAL_KERNELS_NATIVE``): loaded after the
first Python hits of a process, it serves a repeated call with the op function and the stream's
``_live`` as the only Python frames, and every check, record and counter stays as in Python
(tests/kernels/test_launch_*.py run with both hits)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest

import hal
import hal.kernels as hk
import hal.kernels.spi as hks
from hal.kernels import _dispatch, _fast, _native


@pytest.fixture
def native() -> Iterator[None]:
    """The C hit in use for the test (skipped where it cannot be built)."""
    was = _fast.native_active()
    if not _fast.use_native(True):
        pytest.skip(_native.unavailable_reason() or "HAL_KERNELS_NATIVE=0")
    try:
        yield
    finally:
        _fast.use_native(was)


def _arr(dev: hal.Device, values: Any) -> hal.Array:
    return hal.asarray(np.asarray(values, dtype=np.float32), device=dev)


def _calls(fn: Callable[[], Any], n: int = 20) -> dict[str, float]:
    """Python frames and C calls (``py:name``, ``c:name``) per call of ``fn``, as sys.setprofile sees them."""
    seen: dict[str, int] = {}

    def prof(frame: Any, event: str, arg: Any) -> None:
        if event == "call":
            name = "py:" + frame.f_code.co_name
        elif event == "c_call":
            name = "c:" + getattr(arg, "__name__", str(arg))
        else:
            return
        seen[name] = seen.get(name, 0) + 1

    sys.setprofile(prof)
    try:
        for _ in range(n):
            fn()
    finally:
        sys.setprofile(None)
    seen.pop("c:setprofile", None)
    return {k: v / n for k, v in seen.items()}


@pytest.mark.usefixtures("native")
def test_a_repeated_launch_runs_two_python_frames(kdev: hal.Device, stream: hal.Stream) -> None:
    """axpy and the stream's _live: the hit and the backend's prepared launch are C (or the
    backend's own generated launch where it has no native one)."""
    x, y, o = _arr(kdev, [1, 2]), _arr(kdev, [10, 20]), _arr(kdev, [0, 0])
    for _ in range(3):
        hk.axpy(2.0, x, y, out=o, stream=stream)
    before = stream.enqueue_count
    calls = _calls(lambda: hk.axpy(3.0, x, y, out=o, stream=stream))
    assert stream.enqueue_count == before + 20  # each launch counted by the stream (its _live)
    assert calls["py:axpy"] == 1 and calls["c:fast2"] == 1 and calls["py:_live"] == 1
    assert "py:fast2" not in calls and "py:run_axpy" not in calls
    np.testing.assert_array_equal(o.to_host(stream=stream), [13, 26])


@pytest.mark.usefixtures("native")
def test_fallbacks_records_and_internal_calls_are_counted_per_call(
    kdev: hal.Device, stream: hal.Stream
) -> None:
    x, y = _arr(kdev, [1, 2]), _arr(kdev, [3, 4])
    hk.add(x, y, out=y, stream=stream)
    hk.add(x, y, out=y, stream=stream)
    # this call's key (op, dtype, backend, impl): an earlier test of the process may have left
    # another dtype's add among the fallbacks
    found = [k for k in _dispatch._fallbacks if k[:3] == ("add", "float32", kdev.backend)]
    key = found[0] if found else None
    if key is None:
        pytest.skip(f"add has a dedicated kernel on {kdev.backend}")
    n0, f0 = _dispatch._fallbacks[key], _fast.launch_counts()["fast"]
    with hk.trace() as records:
        for _ in range(5):
            hk.add(x, y, out=y, stream=stream)
        with hks.internal():  # a library's own calls: run and recorded, not counted as fallbacks
            for _ in range(3):
                hk.add(x, y, out=y, stream=stream)
    assert _dispatch._fallbacks[key] == n0 + 5
    assert _fast.launch_counts()["fast"] == f0 + 8
    assert len(records) == 8 and all(r.op == "add" for r in records)
    np.testing.assert_array_equal(y.to_host(stream=stream), [3 + 10, 4 + 20])


@pytest.mark.usefixtures("native")
def test_invalidations_after_native_hits_raise_with_nothing_enqueued(
    kdev: hal.Device, stream: hal.Stream
) -> None:
    buf = kdev.alloc(32)
    x = buf.view(np.float32, (4,))
    hal.copy(x, np.ones(4, np.float32), stream=stream)
    y, o = _arr(kdev, [3, 4, 5, 6]), _arr(kdev, [0, 0, 0, 0])
    for _ in range(3):
        hk.axpy(2.0, x, y, out=o, stream=stream)
    stream.synchronize()
    before = stream.enqueue_count
    with pytest.raises(ValueError, match="out overlaps input 0"):  # shares x's buffer
        hk.axpy(2.0, x, y, out=buf.view(np.float32, (4,), offset=4), stream=stream)
    with pytest.raises(ValueError, match="axpy"):  # another kind (a shape): checked in full
        hk.axpy(2.0, x, _arr(kdev, [1, 2, 3]), out=o, stream=stream)
    y.close()
    with pytest.raises(hal.InvalidBufferError, match="axpy: y uses a closed buffer"):
        hk.axpy(2.0, x, y, out=o, stream=stream)
    assert stream.enqueue_count == before
    np.testing.assert_array_equal(o.to_host(stream=stream), [5, 6, 7, 8])
    stream.close()
    with pytest.raises(hal.InvalidBufferError, match="closed"):
        hk.axpy(2.0, x, o, out=o, stream=stream)


def test_native_switch_reads_the_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    was = _fast.native_active()
    try:
        monkeypatch.setenv("HAL_KERNELS_NATIVE", "0")
        assert _fast.use_native(True) is False and not _fast.native_active()
        monkeypatch.setenv("HAL_KERNELS_NATIVE", "maybe")
        with pytest.raises(hal.ConfigError, match="HAL_KERNELS_NATIVE"):
            _fast.use_native(True)
    finally:
        monkeypatch.delenv("HAL_KERNELS_NATIVE")
        _fast.use_native(was)


_CHILD = textwrap.dedent(
    """
    import numpy as np, hal, hal.kernels as hk
    from hal.kernels import _fast, _native
    dev = hal.device("cpu:0")
    s = dev.create_stream()
    x, y = (hal.asarray(np.ones(2, np.float32), device=dev) for _ in range(2))
    seen = []
    for i in range(_fast._NATIVE_AFTER + 3):
        try:
            hk.add(x, y, out=y, stream=s)
        except hal.ConfigError as exc:
            print("error", i, y.to_host(stream=s)[0], "HAL_KERNELS_NATIVE" in str(exc))
            raise SystemExit(0)
        seen.append(_fast.native_active())
    print(seen.index(True) if True in seen else -1, _native.unavailable_reason(), y.to_host(stream=s)[0])
    """
)


@pytest.mark.parametrize("setting", ["1", "0", "maybe"])
def test_a_process_switches_to_the_c_hit_after_its_first_hits(setting: str) -> None:
    """The Python hits serve the first _NATIVE_AFTER repeated calls (a short process builds
    nothing), then the C hit; HAL_KERNELS_NATIVE=0 keeps the Python hits."""
    import os

    env = {**os.environ, "HAL_KERNELS_NATIVE": setting, "HAL_BACKENDS": "cpu"}
    env["HAL_KERNELS_SUMMARY"] = "0"
    proc = subprocess.run(
        [sys.executable, "-c", _CHILD], env=env, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    if setting == "maybe":  # the hit that would switch raises hal.ConfigError, enqueuing nothing
        assert proc.stdout.split() == [
            "error",
            str(_fast._NATIVE_AFTER + 1),
            str(float(_fast._NATIVE_AFTER + 2)),
            "True",
        ]
        return
    first, reason, value = proc.stdout.split(maxsplit=2)
    n = _fast._NATIVE_AFTER + 3
    assert float(value) == 1 + n  # every call ran, whichever hit served it
    if setting == "0":
        assert first == "-1"
    elif reason == "None":
        # call 0 learns, calls 1.._NATIVE_AFTER are Python hits; the next loads the C hit first
        assert int(first) == _fast._NATIVE_AFTER + 1
    else:  # no compiler or headers here: the Python hits, the reason kept
        assert first == "-1"


@pytest.mark.usefixtures("native")
def test_alternating_kinds_and_aliasing_on_one_stream(kdev: hal.Device, stream: hal.Stream) -> None:
    """The C hit remembers each stream's last entry: calls of other kinds (another op, other
    aliasing, another shape) in between find their own entries, and a learn in between drops it."""
    x, y, o = _arr(kdev, [1, 2]), _arr(kdev, [3, 4]), _arr(kdev, [0, 0])
    hx, hy, ho = np.array([1, 2], np.float32), np.array([3, 4], np.float32), np.zeros(2, np.float32)
    big = _arr(kdev, [1, 1, 1])
    for i in range(6):
        hk.axpy(2.0, x, y, out=o, stream=stream)  # o = 2x + y
        ho = 2 * hx + hy
        hk.axpy(0.5, x, o, out=o, stream=stream)  # in place on o: another key (y is out)
        ho = 0.5 * hx + ho
        hk.add(o, x, out=y, stream=stream)  # another op
        hy = ho + hx
        if i == 3:
            hk.exp(big, out=big, stream=stream)  # a new kind learned in between
    np.testing.assert_allclose(o.to_host(stream=stream), ho)
    np.testing.assert_allclose(y.to_host(stream=stream), hy)
    np.testing.assert_allclose(big.to_host(stream=stream), np.exp([1, 1, 1]), rtol=1e-6)
