"""CPU emulator specifics: HAL_CPU_DEVICES / HAL_CPU_MEMORY / HAL_CPU_JITTER, worker errors, gating."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest

import hal
from hal.backends.cpu import _native
from hal.backends.cpu._backend import CpuStream, parse_size

GiB = 1 << 30


def _cpu_status() -> hal.BackendInfo:
    return next(b for b in hal.list_backends() if b.name == "cpu")


# -- HAL_CPU_DEVICES ------------------------------------------------------------------------


@pytest.mark.parametrize(("value", "count"), [(None, 2), ("1", 1), ("3", 3), (" 4 ", 4)])
def test_device_count(hal_env: Callable[..., None], value: str | None, count: int) -> None:
    hal_env(HAL_BACKENDS="cpu", HAL_CPU_DEVICES=value)
    devs = hal.devices("cpu")
    assert [str(d) for d in devs] == [f"cpu:{i}" for i in range(count)]
    assert len({d.name for d in devs}) == count


@pytest.mark.parametrize("value", ["0", "-1", "two", "2.5"])
def test_bad_device_count_fails_the_backend(hal_env: Callable[..., None], value: str) -> None:
    hal_env(HAL_BACKENDS="cpu", HAL_CPU_DEVICES=value)
    info = _cpu_status()
    assert info.status == "failed"
    assert f"HAL_CPU_DEVICES={value!r}" in info.reason
    with pytest.raises(hal.BackendUnavailableError, match="HAL_CPU_DEVICES"):
        hal.devices("cpu")


# -- HAL_CPU_MEMORY -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "nbytes"),
    [
        ("1048576", 1 << 20),
        ("0", 0),
        ("512M", 512 << 20),
        ("512m", 512 << 20),
        ("4G", 4 * GiB),
        ("64KiB", 64 << 10),
        ("64kb", 64 << 10),
        ("1.5K", 1536),
        ("2T", 2 << 40),
        (" 8 M ", 8 << 20),
        ("100B", 100),
    ],
)
def test_parse_size(text: str, nbytes: int) -> None:
    assert parse_size(text, "HAL_CPU_MEMORY") == nbytes


@pytest.mark.parametrize(
    "text", ["", "M", "lots", "12Q", "-1", "-2G", "1..5M", "inf", "nan", "1e400"]
)
def test_parse_size_rejects(text: str) -> None:
    with pytest.raises(ValueError, match=f"HAL_CPU_MEMORY={text!r}"):
        parse_size(text, "HAL_CPU_MEMORY")


def test_memory_capacity_from_env(hal_env: Callable[..., None]) -> None:
    hal_env(HAL_BACKENDS="cpu", HAL_CPU_MEMORY="3M")
    for d in hal.devices("cpu"):
        assert d.total_memory == 3 << 20
        assert d.memory_in_use == 0
        assert d.properties()["memory_in_use"] == 0


def test_default_capacity(hal_env: Callable[..., None]) -> None:
    hal_env(HAL_BACKENDS="cpu", HAL_CPU_MEMORY=None)
    assert hal.device("cpu:0").total_memory == 4 * GiB


def test_bad_memory_fails_the_backend(hal_env: Callable[..., None]) -> None:
    hal_env(HAL_BACKENDS="cpu", HAL_CPU_MEMORY="lots")
    info = _cpu_status()
    assert info.status == "failed"
    assert "HAL_CPU_MEMORY='lots'" in info.reason


# -- HAL_CPU_JITTER -------------------------------------------------------------------------


@pytest.mark.parametrize(("value", "seed"), [("42", 42), ("0", 0), ("", None), (None, None)])
def test_jitter_seed(hal_env: Callable[..., None], value: str | None, seed: int | None) -> None:
    hal_env(HAL_BACKENDS="cpu", HAL_CPU_JITTER=value)
    for d in hal.devices("cpu"):
        assert d.properties()["jitter_seed"] == seed


@pytest.mark.parametrize("value", ["abc", "1.5", "0x10"])
def test_bad_jitter_seed_fails_the_backend(hal_env: Callable[..., None], value: str) -> None:
    hal_env(HAL_BACKENDS="cpu", HAL_CPU_JITTER=value)
    info = _cpu_status()
    assert info.status == "failed"
    assert f"HAL_CPU_JITTER={value!r}" in info.reason


@pytest.mark.parametrize("native", ["1", "0"])
def test_jittered_streams_still_run_in_order(hal_env: Callable[..., None], native: str) -> None:
    hal_env(HAL_BACKENDS="cpu", HAL_CPU_JITTER="7", HAL_CPU_NATIVE=native)
    dev = hal.device("cpu:0")
    outs = [np.zeros(256, np.uint8) for _ in range(5)]
    with dev.create_stream() as s, dev.alloc(256) as buf:
        for i, out in enumerate(outs):
            hal.memset(buf, i, stream=s)
            hal.copy(out, buf, stream=s)
        s.synchronize()
    assert [int(o[0]) for o in outs] == list(range(5))
    assert all((o == o[0]).all() for o in outs)


# -- declared capabilities --------------------------------------------------------------------


@pytest.mark.usefixtures("requires_cpu")
def test_capabilities() -> None:
    caps = hal.device("cpu:0").capabilities
    assert caps.p2p and caps.dlpack and caps.timing_events and caps.concurrent_streams
    assert not caps.ipc
    assert caps.reason_absent("ipc")
    assert caps.reason_absent("p2p") is None
    with pytest.raises(ValueError, match="name='bogus'"):
        caps.reason_absent("bogus")
    assert hal.device("cpu:0").vendor == "hal-sdk"
    assert hal.device("cpu:0").can_access_peer(hal.device("cpu:1"))


# -- worker errors and gating -------------------------------------------------------------------


@pytest.fixture(params=["native", "python"])
def cpu_stream(
    requires_cpu: None, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[hal.Stream, CpuStream]]:
    """A stream of cpu:0 and its emulator implementation (for submitting host callables).

    Once a native stream (the default), once a Python worker (``HAL_CPU_NATIVE=0``).
    """
    if request.param == "native" and _native.runtime() is None:
        pytest.skip(str(_native.unavailable_reason()))
    monkeypatch.setenv("HAL_CPU_NATIVE", "1" if request.param == "native" else "0")
    s = hal.device("cpu:0").create_stream()
    impl = s._impl
    assert isinstance(impl, CpuStream)
    assert (impl.native is not None) == (request.param == "native")
    yield s, impl
    s.close()


def test_worker_error_surfaces_at_synchronize(cpu_stream: tuple[hal.Stream, CpuStream]) -> None:
    s, impl = cpu_stream
    dev = s.device
    out = np.zeros(16, np.uint8)
    with dev.alloc(16) as buf:
        impl.submit(lambda: 1 // 0)
        hal.memset(buf, 9, stream=s)  # work after the failure still runs
        hal.copy(out, buf, stream=s)
        with pytest.raises(hal.StreamError, match="ZeroDivisionError") as info:
            s.synchronize()
        assert isinstance(info.value.__cause__, ZeroDivisionError)
        assert info.value.device == "cpu:0"
        assert (out == 9).all()
        s.synchronize()  # the error is reported once
        impl.submit(lambda: (_ for _ in ()).throw(hal.StreamError("custom", device="cpu:0")))
        impl.submit(lambda: 1 // 0)
        with pytest.raises(hal.StreamError, match="custom"):  # the first failure wins
            s.synchronize()


def test_work_queued_before_close_still_completes(cpu_stream: tuple[hal.Stream, CpuStream]) -> None:
    """Buffer.close() does not cancel enqueued work: the copy still reads the data it was given."""
    s, impl = cpu_stream
    gate = threading.Event()
    before = s.device.memory_in_use
    buf = s.device.alloc(32)
    hal.memset(buf, 7, stream=s)
    s.synchronize()
    out = np.zeros(32, np.uint8)
    impl.submit(gate.wait)
    hal.copy(out, buf, stream=s)
    buf.close()
    assert s.device.memory_in_use == before  # accounting released at close
    with pytest.raises(hal.InvalidBufferError):
        hal.copy(out, buf, stream=s)
    gate.set()
    s.synchronize()
    assert (out == 7).all()


def test_query_does_not_block(cpu_stream: tuple[hal.Stream, CpuStream]) -> None:
    s, impl = cpu_stream
    dev = s.device
    gate = threading.Event()
    ev = dev.create_event()
    waiter = dev.create_stream()
    impl.submit(gate.wait)
    ev.record(s)
    waiter.wait(ev)
    out = np.zeros(8, np.uint8)
    with dev.alloc(8) as buf:
        hal.memset(buf, 4, stream=s)
        hal.copy(out, buf, stream=waiter)
        assert s.query() is False
        assert ev.query() is False
        assert waiter.query() is False
        assert (out == 0).all()
        gate.set()
        waiter.synchronize()
        assert ev.query() is True and waiter.query() is True
        s.synchronize()
        assert s.query() is True
    waiter.close()


def test_close_stream_stops_its_worker(cpu_stream: tuple[hal.Stream, CpuStream]) -> None:
    s, impl = cpu_stream
    thread = impl.worker._thread
    assert thread.is_alive()
    s.close()
    thread.join(timeout=10)
    assert not thread.is_alive()
    with pytest.raises(hal.StreamError, match="closed"):
        impl.submit(lambda: None)


# -- temporary files of kernel builds ---------------------------------------------------------

KERNEL_CODE = """
import os, signal, sys
import numpy as np, hal, hal.kernels
d = hal.devices("cpu")[0]
s = d.create_stream()
x = hal.asarray(np.ones(1000, np.float32), device=d)
y = hal.kernels.add(x, x, stream=s)
print("SUM", float(y.to_host(stream=s).sum()), flush=True)
if sys.argv[1] == "kill":
    os.kill(os.getpid(), signal.SIGKILL)
"""


@pytest.mark.parametrize("end", ["exit", "kill"])
def test_kernel_builds_leave_no_temporary_files(tmp_path: Path, end: str) -> None:
    """A process that compiled and loaded CPU kernels leaves nothing in TMPDIR, whether it exits
    (under -X dev -W error: no ResourceWarning about an implicitly cleaned directory) or is killed."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("HAL_")}
    env.update(TMPDIR=str(tmp), HAL_BACKENDS="cpu", HAL_CACHE_DIR=str(tmp_path / "cache"))
    proc = subprocess.run(
        [sys.executable, "-X", "dev", "-W", "error", "-c", KERNEL_CODE, end],
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert "SUM 2000.0" in proc.stdout, proc.stdout + proc.stderr
    assert proc.returncode == (-signal.SIGKILL if end == "kill" else 0), proc.stderr
    assert "Warning" not in proc.stderr, proc.stderr
    assert sorted(p.name for p in tmp.iterdir()) == []
