"""Stream-ordered collectives: a call made with ``stream=s`` occupies ``s`` (as on NCCL).

A kernel enqueued on the same stream right after the call reads the call's output, and a
host read after ``s.synchronize()`` sees it, with no ``work.wait()``. ``work.wait(stream=o)``
orders another stream. In process (``hal.comm.create`` over two cpu or two opencl devices,
and hal core's host-wait fallback) and across processes (``hal run``, emulator jitter on).
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

import hal
import hal.comm
import hal.kernels as hk

HERE = Path(__file__).resolve().parent
N = 1 << 16  # 256 KiB of float32: larger than any inline threshold


@pytest.fixture(params=["native", "fallback"])
def devices(
    request: pytest.FixtureRequest,
    backend_devices: list[hal.Device],
    backend_name: str,
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[list[hal.Device]]:
    """Two devices of the backend under test; ``fallback`` makes them declare host_signal absent."""
    if len(backend_devices) < 2:
        pytest.skip(f"backend {backend_name} has one device")
    devs = backend_devices[:2]
    if request.param == "fallback":
        for d in devs:
            monkeypatch.setattr(
                d._impl,
                "capabilities",
                dataclasses.replace(d._impl.capabilities, host_signal=False),
            )
    yield devs


def _inputs(devs: list[hal.Device], rnd: int) -> list[hal.Array]:
    return [
        hal.asarray(np.full(N, (i + 1) * (rnd + 1), np.float32), device=d)
        for i, d in enumerate(devs)
    ]


def test_kernel_on_the_same_stream_reads_the_result_without_wait(devices: list[hal.Device]) -> None:
    comm = hal.comm.create(devices)
    streams = [d.create_stream() for d in devices]
    for rnd in range(4):
        a = _inputs(devices, rnd)
        out = [hal.asarray(np.zeros(N, np.float32), device=d) for d in devices]
        hosts = [np.zeros(N, np.float32) for _ in devices]
        comm.all_reduce(a, op="sum", streams=streams)  # no wait()
        for x, o, h, s in zip(a, out, hosts, streams, strict=True):
            hk.scale(x, 2.0, out=o, stream=s)  # reads the all_reduce's output on the same stream
            hal.copy(h, o, stream=s)
        for s in streams:
            s.synchronize()
        want = 2.0 * 3 * (rnd + 1)
        for i, h in enumerate(hosts):
            assert (h == want).all(), (
                f"round {rnd}, device {i}: {h[:4]} instead of {want} (ran before the all_reduce)"
            )
    parts = [np.zeros(4, np.int64) for _ in devices]
    for i, p in enumerate(parts):
        p[2 * i : 2 * i + 2] = i + 1  # in place: each device's part already sits in recv
    recv = [hal.asarray(p, device=d) for p, d in zip(parts, devices, strict=True)]
    work = comm.all_gather(None, recv, streams=streams)
    barrier = comm.barrier(streams=streams)
    got = [np.zeros(4, np.int64) for _ in devices]
    for r, g, s in zip(recv, got, streams, strict=True):
        hal.copy(g, r, stream=s)
    for s in streams:
        s.synchronize()
    assert work.done() and barrier.done()  # the streams waited for both calls
    for g in got:
        assert g.tolist() == [1, 1, 2, 2]
    comm.close()


def test_wait_on_another_stream(devices: list[hal.Device]) -> None:
    comm = hal.comm.create(devices)
    streams = [d.create_stream() for d in devices]
    others = [d.create_stream() for d in devices]
    a = _inputs(devices, 0)
    hosts = [np.zeros(N, np.float32) for _ in devices]
    work = comm.all_reduce(a, op="max", streams=streams)
    work.wait(stream=others[0])  # one stream waits for every device's part
    work.wait(stream=others[1])
    for x, h, o in zip(a, hosts, others, strict=True):
        hal.copy(h, x, stream=o)
    for o in others:
        o.synchronize()
    for h in hosts:
        assert (h == 2).all()
    with pytest.raises(TypeError, match=r"not a hal\.Stream"):
        work.wait(stream="s0")
    with pytest.raises(ValueError, match="timeout"):
        work.wait(1.0, stream=others[0])
    work.wait()  # the host wait keeps working
    comm.close()


def test_point_to_point_orders_with_wait_stream(devices: list[hal.Device]) -> None:
    """``wait(stream=other)`` orders another stream after a point-to-point call."""
    comm = hal.comm.create(devices)
    s0, s1 = (d.create_stream() for d in devices)
    other = devices[1].create_stream()
    x = hal.asarray(np.arange(N, dtype=np.float32), device=devices[0])
    y = hal.asarray(np.zeros(N, np.float32), device=devices[1])
    z = hal.asarray(np.zeros(N, np.float32), device=devices[1])
    host = np.zeros(N, np.float32)
    comm.send(x, 0, 1, stream=s0)
    w = comm.recv(y, 1, 0, stream=s1)
    w.wait(stream=other)
    hk.scale(y, 3.0, out=z, stream=other)
    hal.copy(host, z, stream=other)
    other.synchronize()
    assert (host == 3 * np.arange(N, dtype=np.float32)).all()
    s0.synchronize()
    s1.synchronize()
    comm.close()


def test_point_to_point_occupies_its_stream(devices: list[hal.Device]) -> None:
    """A kernel after ``recv`` on the same stream reads the received data with no wait; a crossing
    exchange posted back to back on one stream per device still completes (shared starting point)."""
    comm = hal.comm.create(devices)
    s0, s1 = (d.create_stream() for d in devices)
    x0 = hal.asarray(np.arange(N, dtype=np.float32), device=devices[0])
    x1 = hal.asarray(np.arange(N, dtype=np.float32) + 7, device=devices[1])
    y0 = hal.asarray(np.zeros(N, np.float32), device=devices[0])
    y1 = hal.asarray(np.zeros(N, np.float32), device=devices[1])
    z0 = hal.asarray(np.zeros(N, np.float32), device=devices[0])
    z1 = hal.asarray(np.zeros(N, np.float32), device=devices[1])
    h0, h1 = np.zeros(N, np.float32), np.zeros(N, np.float32)
    for _ in range(3):
        comm.send(x0, 0, 1, stream=s0)  # device 0: send, then receive, back to back on s0
        comm.recv(y0, 0, 1, stream=s0)
        comm.send(x1, 1, 0, stream=s1)  # device 1 likewise: a crossing exchange
        comm.recv(y1, 1, 0, stream=s1)
        hk.scale(y0, 2.0, out=z0, stream=s0)  # no wait(): the streams order after the receives
        hk.scale(y1, 2.0, out=z1, stream=s1)
        hal.copy(h0, z0, stream=s0)
        hal.copy(h1, z1, stream=s1)
        s0.synchronize()
        s1.synchronize()
        assert (h0 == 2 * (np.arange(N, dtype=np.float32) + 7)).all(), h0[:4]
        assert (h1 == 2 * np.arange(N, dtype=np.float32)).all(), h1[:4]
        for a in (y0, y1, z0, z1):
            hal.memset(a, 0, stream=s0 if a.device == devices[0] else s1)
    # Work between two point-to-point calls orders the second after the first: device 0 relays
    # what it receives, doubled, back to device 1.
    comm.send(x1, 1, 0, stream=s1)
    comm.recv(y1, 1, 0, stream=s1)
    comm.recv(y0, 0, 1, stream=s0)
    hk.scale(y0, 2.0, out=z0, stream=s0)  # reads the receive's output
    comm.send(z0, 0, 1, stream=s0)  # sends the kernel's output
    hal.copy(h1, y1, stream=s1)
    s0.synchronize()
    s1.synchronize()
    assert (h1 == 2 * (np.arange(N, dtype=np.float32) + 7)).all(), h1[:4]
    comm.close()


def test_failure_reaches_the_stream_and_wait(devices: list[hal.Device]) -> None:
    """A call that fails (here: rank 1 never joins, timeout) releases the stream with the error."""
    comm = hal.comm.create(devices, timeout_ms=300)
    s = devices[0].create_stream()
    a = _inputs(devices, 0)
    host = np.zeros(N, np.float32)
    work = comm.ranks[0].all_reduce(a[0], op="sum", stream=s)
    hal.copy(host, a[0], stream=s)
    with pytest.raises(hal.StreamError, match="no progress") as info:
        s.synchronize()
    assert isinstance(info.value.__cause__, hal.CommError)
    with pytest.raises(hal.CommError, match="no progress"):
        work.wait()
    s.synchronize()  # reported once; the stream is usable again
    # reported by wait() first: the stream does not raise it again (recovery goes on with it)
    work = comm.ranks[0].all_reduce(a[0], op="sum", stream=s)
    with pytest.raises(hal.CommError):
        work.wait()
    hal.copy(host, a[0], stream=s)
    s.synchronize()
    comm.close()


@pytest.mark.parametrize("backend", ["cpu", "opencl"])
def test_multiprocess(backend: str) -> None:
    """``hal run -n 2``: collectives then hal.kernels ops on the same stream, no wait() (cpu: jitter on;
    opencl: one PoCL device per process, memory the host cannot map)."""
    if backend == "opencl":
        pytest.importorskip("pyopencl", reason="pyopencl is not installed")
    child = {k: v for k, v in os.environ.items() if not k.startswith("HAL_")}
    if backend == "cpu":
        child.update({"HAL_BACKENDS": "cpu", "HAL_CPU_DEVICES": "1", "HAL_CPU_JITTER": "7"})
    else:
        child.update({"HAL_BACKENDS": "opencl", "POCL_DEVICES": "pthread"})
    proc = subprocess.run(
        [sys.executable, "-m", "hal", "run", "-n", "2", str(HERE / "stream_order_worker.py")],
        env=child,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count("OK ") == 2, proc.stdout + proc.stderr
