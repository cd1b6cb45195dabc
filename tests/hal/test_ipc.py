"""Memory shared between processes (issue #15, item 3): Buffer.export_handle / Device.import_handle.

The CPU emulator keeps its memory in memfds with ``HAL_CPU_IPC=1``; real second processes
(``tests/hal/ipc_child.py``) import the handle, read what this process wrote, write back, and
keep reading after the exporter closed its buffer.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

import hal

CHILD = str(Path(__file__).resolve().parent / "ipc_child.py")
N = 1024  # uint32 values


@pytest.fixture
def ipc_cpu(hal_env: Callable[..., None]) -> hal.Device:
    hal_env(HAL_BACKENDS="cpu", HAL_CPU_DEVICES="1", HAL_CPU_IPC="1")
    dev = hal.device("cpu:0")
    assert dev.capabilities.ipc
    return dev


def _children(handle: bytes, count: int) -> list[subprocess.Popen[str]]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HAL_")}
    env.update(HAL_BACKENDS="cpu", HAL_CPU_DEVICES="1", HAL_CPU_IPC="1")
    return [
        subprocess.Popen(
            [sys.executable, CHILD, handle.hex(), str(k + 1)],
            env=env,
            text=True,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        for k in range(count)
    ]


def _line(p: subprocess.Popen[str], prefix: str) -> str:
    assert p.stdout is not None
    line = p.stdout.readline()
    if not line.startswith(prefix):
        raise AssertionError(
            f"expected {prefix!r}, got {line!r}; stderr: {p.stderr.read() if p.stderr else ''}"
        )
    return line.strip()


@pytest.mark.parametrize("processes", [2, 4])
def test_processes_share_one_buffer_and_the_close_is_defined(
    ipc_cpu: hal.Device, processes: int
) -> None:
    dev = ipc_cpu
    s = dev.create_stream()
    buf = dev.alloc(4 * N)
    hal.copy(buf, np.arange(N, dtype=np.uint32) + 7, stream=s)
    s.synchronize()
    handle = buf.export_handle()
    assert isinstance(handle, bytes) and handle.startswith(b"HALIPC1:")
    kids = _children(handle, processes - 1)
    try:
        for p in kids:
            assert _line(p, "IN_USE") == "IN_USE 0"  # the memory is the exporter's
            assert _line(p, "SEEN") == f"SEEN 7 {N - 1 + 7}"  # what this process wrote
            _line(p, "WROTE")
        got = buf.view(np.uint32).to_host(stream=s)
        assert [int(got[k]) for k in range(1, processes)] == [
            1000 + k for k in range(1, processes)
        ]  # theirs
        used = dev.memory_in_use
        buf.close()  # the exporter lets go while the importers hold the memory
        assert (
            dev.memory_in_use == used - 4 * N and dev.memory_stats()["cached"] == 0
        )  # not kept for reuse
        for p in kids:
            assert p.stdin is not None
            p.stdin.write("closed\n")
            p.stdin.flush()
            assert _line(p, "AFTER") == "AFTER 7"  # still mapped there: readable
            assert _line(p, "REIMPORT").startswith(
                "REIMPORT HalError cpu:0: "
            )  # a new import fails, named
        for p in kids:
            _, err = p.communicate(timeout=60)
            assert p.returncode == 0, err
    finally:
        for p in kids:
            if p.poll() is None:
                p.kill()
            p.communicate()  # closes the pipes


def test_bad_handles_and_devices_without_ipc(
    ipc_cpu: hal.Device, hal_env: Callable[..., None]
) -> None:
    dev = ipc_cpu
    with pytest.raises(TypeError, match="is not bytes"):
        dev.import_handle("HALIPC1:{}")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="is not a hal memory handle"):
        dev.import_handle(b"nope")
    with pytest.raises(ValueError, match="is malformed"):
        dev.import_handle(b"HALIPC1:{bad json")
    other = b'HALIPC1:{"backend":"cpu","index":5,"nbytes":4,"payload":"1:2:3:4"}'
    with pytest.raises(hal.DeviceMismatchError, match="import it on that device, not on cpu:0"):
        dev.import_handle(other)
    gone = b'HALIPC1:{"backend":"cpu","index":0,"nbytes":4,"payload":"999999999:3:1:1"}'
    with pytest.raises(hal.HalError, match="cannot open the memory of process 999999999"):
        dev.import_handle(gone)
    with dev.alloc(0) as empty:
        assert dev.import_handle(empty.export_handle()).nbytes == 0
    closed = dev.alloc(8)
    closed.close()
    with pytest.raises(hal.InvalidBufferError):
        closed.export_handle()
    hal_env(HAL_BACKENDS="cpu", HAL_CPU_DEVICES="1", HAL_CPU_IPC=None)
    plain = hal.device("cpu:0")
    assert (
        not plain.capabilities.ipc and "HAL_CPU_IPC=1" in plain.capabilities.absent_reasons["ipc"]
    )
    with (
        plain.alloc(8) as b,
        pytest.raises(hal.HalError, match="cannot share memory with other processes"),
    ):
        b.export_handle()


def test_opencl_declares_ipc_absent_with_its_reason() -> None:
    try:
        devs = hal.devices("opencl")
    except (hal.HalError, ValueError):
        pytest.skip("no OpenCL here")
    assert devs and not devs[0].capabilities.ipc
    assert "OpenCL has no memory handles" in devs[0].capabilities.absent_reasons["ipc"]
