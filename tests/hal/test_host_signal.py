"""Stream.wait_host(): a stream waits for a host-side signal (native on cpu and opencl, and the
core fallback that blocks the enqueuing thread instead), failures, timeouts, dropped signals."""

from __future__ import annotations

import dataclasses
import gc
import threading
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

import hal

BUILTIN = ("cpu", "opencl")  # the backends of hal-sdk that run in its suite, both with host signals


@pytest.fixture(params=["native", "fallback"])
def mode(
    request: pytest.FixtureRequest, device: hal.Device, monkeypatch: pytest.MonkeyPatch
) -> Iterator[str]:
    """Run the test on the backend's own host signals, then on hal core's fallback.

    The fallback is what a backend without ``Capabilities.host_signal`` gets; here the real
    device is made to declare the capability absent. A vendor's backend that declares it absent
    (docs/write-a-backend.md's) skips the native run with its reason; the built-in ones must
    declare it.
    """
    if request.param == "native":
        if device.backend in BUILTIN:
            assert device.capabilities.host_signal, f"{device} should declare host_signal"
        elif not device.capabilities.host_signal:
            pytest.skip(
                f"{device} declares host_signal absent: {device.capabilities.reason_absent('host_signal')}"
            )
    else:
        impl = device._impl
        monkeypatch.setattr(
            impl, "capabilities", dataclasses.replace(impl.capabilities, host_signal=False)
        )
    yield request.param


def _later_work(s: hal.Stream, buf: hal.Buffer, host: np.ndarray, value: int) -> None:
    hal.memset(buf, value, stream=s)
    hal.copy(host, buf, stream=s)


def test_later_work_waits_for_set(device: hal.Device, mode: str) -> None:
    s = device.create_stream()
    buf = device.alloc(4096)
    host = np.zeros(4096, np.uint8)
    hal.memset(buf, 1, stream=s)
    before = device.create_event()
    before.record(s)
    sig = s.wait_host()
    assert sig.native is (mode == "native") and not sig.is_set()
    seen: dict[str, object] = {}

    def setter() -> None:
        before.synchronize()  # the work enqueued before the wait runs while it is pending
        threading.Event().wait(0.1)
        seen["host"] = host.copy()
        seen["query"] = s.query()
        sig.set()

    t = threading.Thread(target=setter)
    t.start()
    _later_work(s, buf, host, 7)  # the fallback blocks right here until set()
    s.synchronize()
    t.join()
    assert not np.asarray(seen["host"]).any(), "work enqueued after wait_host ran before set()"
    assert seen["query"] is False
    assert (host == 7).all() and sig.is_set() and not sig.failed
    assert s.query()
    s.close()
    buf.close()


def test_signals_set_out_of_order(device: hal.Device, mode: str) -> None:
    s = device.create_stream()
    buf = device.alloc(64)
    host = np.zeros(64, np.uint8)
    first = s.wait_host()
    second = s.wait_host()
    seen: dict[str, object] = {}

    def setter() -> None:
        second.set()  # the stream still waits for the first one
        threading.Event().wait(0.1)
        seen["host"] = host.copy()
        first.set()

    t = threading.Thread(target=setter)
    t.start()
    _later_work(s, buf, host, 3)
    s.synchronize()
    t.join()
    assert not np.asarray(seen["host"]).any(), "work ran while an earlier signal was still pending"
    assert (host == 3).all()
    s.close()
    buf.close()


def test_fail_releases_and_raises_at_synchronize(device: hal.Device, mode: str) -> None:
    s = device.create_stream()
    buf = device.alloc(16)
    sig = s.wait_host()
    cause = hal.CommError("all_reduce failed on rank 1", op="all_reduce", ranks=(1,))
    threading.Timer(0.05, sig.fail, (cause,)).start()
    hal.memset(buf, 5, stream=s)
    with pytest.raises(hal.StreamError, match="all_reduce failed on rank 1") as info:
        s.synchronize()
    assert info.value.__cause__ is cause and sig.failed and sig.is_set()
    sig.set()  # the first release wins
    s.synchronize()  # the failure is reported once
    sig.fail("again")
    s.synchronize()
    s.close()
    buf.close()


def test_acknowledged_failure_is_not_raised_again(device: hal.Device, mode: str) -> None:
    s = device.create_stream()
    sig = s.wait_host()
    sig.acknowledge()  # nothing failed: nothing to withdraw
    sig.fail(hal.CommError("reported by the caller"))
    sig.acknowledge()
    s.synchronize()
    other = s.wait_host()
    other.set()
    other.acknowledge()
    s.synchronize()
    s.close()


def test_timeout_fails_the_signal(device: hal.Device, mode: str) -> None:
    s = device.create_stream()
    buf = device.alloc(16)
    host = np.zeros(16, np.uint8)
    sig = s.wait_host(timeout=0.2)
    _later_work(s, buf, host, 9)
    with pytest.raises(hal.StreamError, match=r"not set within 0\.2 s"):
        s.synchronize()
    assert sig.failed
    assert (host == 9).all()  # the stream went on: nothing hangs
    s.close()
    buf.close()


def test_dropped_signal_fails_instead_of_hanging(device: hal.Device, mode: str) -> None:
    s = device.create_stream()
    sig = s.wait_host()
    del sig
    gc.collect()
    with pytest.raises(hal.StreamError, match="dropped without set"):
        s.synchronize()
    s.synchronize()
    s.close()


def test_close_waits_for_the_signal(device: hal.Device, mode: str) -> None:
    s = device.create_stream()
    buf = device.alloc(16)
    host = np.zeros(16, np.uint8)
    sig = s.wait_host()
    threading.Timer(0.1, sig.set).start()
    _later_work(s, buf, host, 4)
    s.close()
    assert (host == 4).all()
    buf.close()


def test_other_streams_are_not_held(device: hal.Device, mode: str) -> None:
    s, other = device.create_stream(), device.create_stream()
    buf = device.alloc(16)
    host = np.zeros(16, np.uint8)
    sig = s.wait_host()
    _later_work(other, buf, host, 6)
    other.synchronize()
    assert (host == 6).all() and not sig.is_set()
    ev = device.create_event()
    threading.Timer(0.05, sig.set).start()
    ev.record(s)  # an event recorded after the wait completes after the signal
    other.wait(ev)
    other.synchronize()
    assert sig.is_set()
    s.close()
    other.close()
    buf.close()


def test_bad_arguments(device: hal.Device) -> None:
    s = device.create_stream()
    for bad in (0, -1.0, float("nan"), "1", True):
        with pytest.raises(ValueError, match="timeout="):
            s.wait_host(timeout=bad)  # type: ignore[arg-type]
    assert s.query()  # nothing was enqueued
    with pytest.raises(TypeError, match="wait_host"):
        hal.HostSignal()
    sig = s.wait_host()
    with pytest.raises(TypeError, match="error="):
        sig.fail(42)  # type: ignore[arg-type]
    assert not sig.is_set()
    sig.set()
    s.close()
    with pytest.raises(hal.InvalidBufferError):
        s.wait_host()


def test_cpu_host_wait_is_never_faulted(requires_cpu: None) -> None:
    """An injected device failure fails the ops, not the host wait: the order still holds."""
    from hal.backends.cpu import clear_faults, inject_fault

    dev = hal.device("cpu:0")
    s = dev.create_stream()
    buf = dev.alloc(16)
    inject_fault(0, fail=True)
    try:
        sig = s.wait_host()
        ev = dev.create_event()
        ev.record(s)
        threading.Event().wait(0.05)
        assert not ev.query() and not s.query()  # held by the wait, which did not fail instead
        hal.memset(buf, 1, stream=s)
        sig.set()
        with pytest.raises(hal.StreamError, match="injected fault"):
            s.synchronize()
    finally:
        clear_faults(0)
    s.close()
    buf.close()


JITTER_CHECK = """
import threading, numpy as np, hal
for dev in hal.devices("cpu"):
    s = dev.create_stream()
    buf = dev.alloc(4096)
    for rnd in range(20):
        host = np.zeros(4096, np.uint8)
        sig = s.wait_host()
        hal.memset(buf, rnd + 1, stream=s)
        hal.copy(host, buf, stream=s)
        seen = []
        def setter():
            threading.Event().wait(0.005)
            seen.append(int(host.max()))
            sig.set()
        t = threading.Thread(target=setter); t.start()
        s.synchronize(); t.join()
        assert seen == [0] and (host == rnd + 1).all(), (rnd, seen, host[:4])
    s.close()
print("ok")
"""


def test_cpu_host_wait_under_jitter(requires_cpu: None, python_run: Any, tmp_path: Any) -> None:
    """HAL_CPU_JITTER delays every op, the host wait included; order holds in every round."""
    proc = python_run(
        ["-c", JITTER_CHECK], env={"HAL_CPU_JITTER": "11", "HAL_BACKENDS": "cpu"}, cwd=tmp_path
    )
    assert proc.stdout.strip() == "ok"
