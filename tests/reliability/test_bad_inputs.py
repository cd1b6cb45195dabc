"""The bad-input campaign of docs/reliability.md: every case is rejected with a clear error, no side effect.

Each case gets a fresh :class:`World` (two CPU-emulator devices, a stream, patterned buffers, a
closed buffer, an in-process communicator) and must raise the listed exception with a message
matching the listed text; afterwards every buffer still holds its pattern and no work is left
on the streams (nothing was enqueued or written).
"""

from __future__ import annotations

import ctypes
import json
import os
import socket
import struct
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import hal
import hal.comm
import hal.kernels
from hal.comm._config import job_secret
from hal.comm._init import detect_launcher
from hal.comm._topo import TopologyError, load
from hal.plugins._loader import PluginSystem


class World:
    """Devices, a stream, patterned buffers and arrays, a closed buffer, a communicator."""

    def __init__(self, tmp: Path) -> None:
        devs = hal.devices("cpu")
        assert len(devs) >= 2, "the campaign needs HAL_CPU_DEVICES >= 2 (tests/conftest.py sets 2)"
        self.d0, self.d1 = devs[0], devs[1]
        self.s0, self.s1 = self.d0.create_stream(), self.d1.create_stream()
        self.tmp = tmp
        self.pattern = np.arange(64, dtype=np.float32)
        self.a0 = hal.asarray(self.pattern, device=self.d0, stream=self.s0)
        self.b0 = hal.asarray(self.pattern[::-1].copy(), device=self.d0, stream=self.s0)
        self.a1 = hal.asarray(self.pattern * 2, device=self.d1, stream=self.s1)
        self.i0 = hal.asarray(np.arange(64, dtype=np.int32), device=self.d0, stream=self.s0)
        self.m0 = hal.asarray(np.ones((4, 8), dtype=np.float32), device=self.d0, stream=self.s0)
        self.host = np.full(64, 7.0, dtype=np.float32)
        self.closed = self.d0.alloc(256)
        self.closed.close()
        self.comm = hal.comm.create([self.d0, self.d1])
        self.s0.synchronize()
        self.s1.synchronize()

    def snapshot(self) -> list[np.ndarray]:
        """Return the contents of every live buffer (and the host array)."""
        return [x.to_host() for x in (self.a0, self.b0, self.a1, self.i0, self.m0)] + [
            self.host.copy()
        ]

    def close(self) -> None:
        """Release everything."""
        self.comm.close()
        for x in (self.a0, self.b0, self.a1, self.i0, self.m0):
            x.close()
        self.s0.close()
        self.s1.close()


def _garbage_on_rendezvous(w: World) -> None:
    """A client sends a 2^63-byte length header to the rendezvous server: refused, server unharmed."""
    from hal.comm._bootstrap import TcpBootstrap

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    boot = TcpBootstrap(0, 1, "127.0.0.1", port, 5.0)  # rank 0 serves
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=5) as bad:
            bad.sendall(struct.pack("<Q", 1 << 63) + b"\x00garbage")
            bad.settimeout(5)
            try:
                assert bad.recv(16) == b""  # the server hangs up on it
            except ConnectionResetError:
                pass  # (or resets: it did not read the rest)
        assert boot.allgather({"still": "serving"}) == [{"still": "serving"}]
    finally:
        boot.close()
    raise ConnectionRefusedError("garbage refused")  # the case's expected outcome, for the table


def _rendezvous_claim(w: World, rank: int, size: int, secret: bytes) -> None:
    """Rank 0 (secret b"job") serves; a client holding ``secret`` claims ``rank`` of ``size``."""
    from hal.comm._bootstrap import TcpBootstrap

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    boot = TcpBootstrap(0, 1, "127.0.0.1", port, 5.0, secret=b"job")
    try:
        TcpBootstrap(rank, size, "127.0.0.1", port, 5.0, secret=secret).close()
    finally:
        boot.close()


def _serve_at(addr: str) -> None:
    """Rank 0 of a world of one, serving the rendezvous at ``addr``."""
    from hal.comm._bootstrap import TcpBootstrap

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    TcpBootstrap(0, 1, addr, port, 2.0, secret=b"job").close()


def _secret_file(w: World, mode: int) -> str:
    p = w.tmp / "job.key"
    p.write_text("s3cret\n")
    p.chmod(mode)
    return str(p)


def _write(w: World, text: str) -> str:
    p = w.tmp / "topo.json"
    p.write_text(text)
    return str(p)


# (id, area, action, exception, message regex)
CASES: list[
    tuple[
        str, str, Callable[[World], Any], type[BaseException] | tuple[type[BaseException], ...], str
    ]
] = [
    # -- HAL ----------------------------------------------------------------------------------
    ("alloc-negative", "hal", lambda w: w.d0.alloc(-1), ValueError, "-1"),
    ("alloc-huge", "hal", lambda w: w.d0.alloc(1 << 62), hal.HalError, "4611686018427387904|bytes"),
    ("alloc-not-int", "hal", lambda w: w.d0.alloc("10"), TypeError, "10"),
    (
        "copy-negative-nbytes",
        "hal",
        lambda w: hal.copy(w.a0, w.b0, stream=w.s0, nbytes=-4),
        ValueError,
        "-4",
    ),
    (
        "copy-dst-offset-past-end",
        "hal",
        lambda w: hal.copy(w.a0, w.b0, stream=w.s0, nbytes=4, dst_offset=1 << 20),
        ValueError,
        "1048576",
    ),
    (
        "copy-negative-src-offset",
        "hal",
        lambda w: hal.copy(w.a0, w.b0, stream=w.s0, nbytes=4, src_offset=-8),
        ValueError,
        "-8",
    ),
    (
        "copy-larger-than-dst",
        "hal",
        lambda w: hal.copy(w.a0, np.zeros(1000, np.float32), stream=w.s0),
        ValueError,
        "4000|256",
    ),
    (
        "copy-from-closed-buffer",
        "hal",
        lambda w: hal.copy(w.a0, w.closed, stream=w.s0, nbytes=4),
        hal.HalError,
        "closed",
    ),
    (
        "copy-into-closed-buffer",
        "hal",
        lambda w: hal.copy(w.closed, w.host, stream=w.s0, nbytes=4),
        hal.HalError,
        "closed",
    ),
    (
        "copy-stream-not-a-stream",
        "hal",
        lambda w: hal.copy(w.a0, w.b0, stream="s0"),
        TypeError,
        "s0",
    ),
    (
        "copy-into-readonly-host",
        "hal",
        lambda w: hal.copy(_readonly(), w.a0, stream=w.s0, nbytes=16),
        (ValueError, TypeError),
        "read-only|readonly|writable",
    ),
    (
        "memset-value-256",
        "hal",
        lambda w: hal.memset(w.a0.buffer, 256, stream=w.s0),
        ValueError,
        "256",
    ),
    (
        "memset-closed-buffer",
        "hal",
        lambda w: hal.memset(w.closed, 0, stream=w.s0),
        hal.HalError,
        "closed",
    ),
    ("view-object-dtype", "hal", lambda w: w.a0.buffer.view(object), TypeError, "object"),
    (
        "view-shape-too-large",
        "hal",
        lambda w: w.a0.buffer.view(np.float32, 1000),
        ValueError,
        "1000",
    ),
    (
        "asarray-object-array",
        "hal",
        lambda w: hal.asarray(np.array([object()]), device=w.d0),
        TypeError,
        "object",
    ),
    ("reshape-wrong-size", "hal", lambda w: w.a0.reshape(7, 9), ValueError, "63|7, 9|\\(7, 9\\)"),
    (
        "unknown-device",
        "hal",
        lambda w: hal.device("nosuch:0"),
        (hal.HalError, ValueError),
        "nosuch",
    ),
    # -- kernels ------------------------------------------------------------------------------
    (
        "accumulate-unknown-op",
        "kernels",
        lambda w: hal.kernels.accumulate(w.a0, w.b0, op="mean", stream=w.s0),
        ValueError,
        "mean",
    ),
    (
        "accumulate-shape-mismatch",
        "kernels",
        lambda w: hal.kernels.accumulate(w.a0, w.m0, op="sum", stream=w.s0),
        ValueError,
        "shape|32|64",
    ),
    (
        "accumulate-dtype-mismatch",
        "kernels",
        lambda w: hal.kernels.accumulate(w.a0, w.i0, op="sum", stream=w.s0),
        (TypeError, ValueError),
        "int32|dtype",
    ),
    (
        "axpy-other-device",
        "kernels",
        lambda w: hal.kernels.axpy(2.0, w.a1, w.a0, stream=w.s0),
        hal.DeviceMismatchError,
        "cpu:1|device",
    ),
    (
        "matmul-inner-mismatch",
        "kernels",
        lambda w: hal.kernels.matmul(w.m0, w.m0, stream=w.s0),
        ValueError,
        "8|4|shape",
    ),
    (
        "matmul-1d",
        "kernels",
        lambda w: hal.kernels.matmul(w.a0, w.a0, stream=w.s0),
        ValueError,
        "2-d|ndim|2",
    ),
    (
        "scale-alpha-not-number",
        "kernels",
        lambda w: hal.kernels.scale(w.a0, "two", stream=w.s0),
        TypeError,
        "two",
    ),
    (
        "accumulate-host-array",
        "kernels",
        lambda w: hal.kernels.accumulate(w.host, w.a0, op="sum", stream=w.s0),
        TypeError,
        "ndarray|hal.Array",
    ),
    # -- comm ---------------------------------------------------------------------------------
    ("comm-create-empty", "comm", lambda w: hal.comm.create([]), ValueError, "non-empty"),
    (
        "comm-create-not-device",
        "comm",
        lambda w: hal.comm.create([w.d0, "cpu:1"]),
        TypeError,
        "cpu:1",
    ),
    (
        "comm-create-device-twice",
        "comm",
        lambda w: hal.comm.create([w.d0, w.d0]),
        ValueError,
        "twice",
    ),
    (
        "comm-unknown-op",
        "comm",
        lambda w: w.comm.all_reduce([w.a0, w.a1], op="mean", streams=[w.s0, w.s1]),
        ValueError,
        "mean",
    ),
    (
        "comm-wrong-array-count",
        "comm",
        lambda w: w.comm.all_reduce([w.a0], op="sum", streams=[w.s0, w.s1]),
        ValueError,
        "1|2",
    ),
    (
        "comm-mismatched-counts",
        "comm",
        lambda w: w.comm.all_reduce(
            [w.a0, hal.asarray(np.zeros(3, np.float32), device=w.d1)],
            op="sum",
            streams=[w.s0, w.s1],
        ),
        ValueError,
        "3|64|count|size",
    ),
    (
        "comm-mismatched-dtypes",
        "comm",
        lambda w: w.comm.all_reduce([w.i0, w.a1], op="sum", streams=[w.s0, w.s1]),
        (TypeError, ValueError),
        "int32|float32|dtype",
    ),
    (
        "comm-array-of-other-device",
        "comm",
        lambda w: w.comm.all_reduce([w.a1, w.a0], op="sum", streams=[w.s0, w.s1]),
        hal.DeviceMismatchError,
        "cpu",
    ),
    (
        "comm-root-out-of-range",
        "comm",
        lambda w: w.comm.broadcast([w.a0, w.a1], root=5, streams=[w.s0, w.s1]),
        ValueError,
        "5",
    ),
    (
        "comm-allgather-recv-too-small",
        "comm",
        lambda w: w.comm.all_gather([w.a0, w.a1], [w.b0, w.a1], streams=[w.s0, w.s1]),
        ValueError,
        "128|64",
    ),
    (
        "comm-unknown-algorithm",
        "comm",
        lambda w: _with_env(
            "HAL_COMM_ALGO", "allreduce:quantum", lambda: hal.comm.create([w.d0, w.d1])
        ),
        ValueError,
        "quantum",
    ),
    (
        "comm-negative-timeout",
        "comm",
        lambda w: hal.comm.create([w.d0, w.d1], timeout_ms=-1),
        ValueError,
        "-1",
    ),
    (
        "comm-garbage-on-rendezvous-socket",
        "comm",
        _garbage_on_rendezvous,
        ConnectionRefusedError,
        "garbage refused",
    ),
    (
        "topology-truncated-file",
        "comm",
        lambda w: load(_write(w, '{"version": 1, "hosts": [{"name": "a"')),
        TopologyError,
        "not valid JSON",
    ),
    (
        "topology-malicious-file",
        "comm",
        lambda w: load(
            _write(
                w,
                json.dumps(
                    {
                        "hosts": [
                            {
                                "name": "a",
                                "devices": 2,
                                "p2p": [
                                    {
                                        "src": 0,
                                        "dst": 10**12,
                                        "path": "peer",
                                        "bandwidth_gbps": 1,
                                        "latency_us": 0,
                                    }
                                ],
                            }
                        ]
                    }
                ),
            )
        ),
        TopologyError,
        "dst=1000000000000",
    ),
    (
        "topology-not-an-object",
        "comm",
        lambda w: load(_write(w, '"rm -rf /"')),
        TopologyError,
        "JSON object",
    ),
    # -- host memory the copy can trust (issue #12 item 5) --------------------------------------
    (
        "copy-object-host-src",
        "hal",
        lambda w: hal.copy(w.a0, np.array([object()] * 64), stream=w.s0, nbytes=16),
        TypeError,
        "dtype object",
    ),
    (
        "copy-object-host-dst",
        "hal",
        lambda w: hal.copy(np.empty(64, dtype=object), w.a0, stream=w.s0, nbytes=16),
        TypeError,
        "dtype object",
    ),
    (
        "copy-structured-with-objects",
        "hal",
        lambda w: hal.copy(w.a0, np.zeros(8, dtype=[("p", "O"), ("x", "f8")]), stream=w.s0),
        TypeError,
        "'O'.*object pointers",
    ),
    (
        "copy-pointer-buffer",
        "hal",
        lambda w: hal.copy(w.a0, (ctypes.c_void_p * 8)(), stream=w.s0),
        TypeError,
        "format '<P' \\(pointers\\)",
    ),
    (
        "asarray-structured",
        "hal",
        lambda w: hal.asarray(np.zeros(4, dtype=[("a", "i4"), ("b", "f4")]), device=w.d0),
        TypeError,
        "structured record",
    ),
    (
        "asarray-datetime",
        "hal",
        lambda w: hal.asarray(np.zeros(4, dtype="M8[s]"), device=w.d0),
        TypeError,
        "datetime64",
    ),
    (
        "view-structured-dtype",
        "hal",
        lambda w: w.a0.buffer.view([("a", "i4"), ("b", "f4")]),
        TypeError,
        "structured record",
    ),
    # -- settings: one parser, bounds, the variable named (issue #12 item 7) ---------------------
    (
        "cpu-devices-huge",
        "settings",
        lambda w: _with_env("HAL_CPU_DEVICES", "1000000000", _cpu_backend),
        hal.ConfigError,
        "HAL_CPU_DEVICES='1000000000' is out of range; allowed: an integer in 1..1024",
    ),
    (
        "cpu-devices-typo",
        "settings",
        lambda w: _with_env("HAL_CPU_DEVICES", "2x", _cpu_backend),
        hal.ConfigError,
        "HAL_CPU_DEVICES='2x' is not an integer",
    ),
    (
        "cpu-memory-nan",
        "settings",
        lambda w: _with_env("HAL_CPU_MEMORY", "nan", _cpu_backend),
        hal.ConfigError,
        "HAL_CPU_MEMORY='nan' is not a size",
    ),
    (
        "comm-timeout-env-inf",
        "settings",
        lambda w: _with_env("HAL_COMM_TIMEOUT_MS", "inf", lambda: hal.comm.create([w.d0, w.d1])),
        hal.ConfigError,
        "HAL_COMM_TIMEOUT_MS='inf' is not a finite number",
    ),
    (
        "comm-timeout-arg-nan",
        "settings",
        lambda w: hal.comm.create([w.d0, w.d1], timeout_ms=float("nan")),
        hal.ConfigError,
        "timeout_ms=nan is not a finite number",
    ),
    (
        "comm-inline-bytes-huge",
        "settings",
        lambda w: _with_env("HAL_COMM_INLINE_BYTES", "1T", lambda: hal.comm.create([w.d0, w.d1])),
        hal.ConfigError,
        "HAL_COMM_INLINE_BYTES='1T' is out of range",
    ),
    (
        "store-port-out-of-range",
        "settings",
        lambda w: detect_launcher(
            {"HAL_RANK": "0", "HAL_WORLD_SIZE": "2", "HAL_STORE_ADDR": "127.0.0.1:70000"}
        ),
        hal.ConfigError,
        "HAL_STORE_ADDR='127.0.0.1:70000' has a port out of range",
    ),
    (
        "master-port-zero",
        "settings",
        lambda w: detect_launcher(
            {"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "h", "MASTER_PORT": "0"}
        ),
        hal.ConfigError,
        "MASTER_PORT='0' is out of range; allowed: an integer in 1..65535",
    ),
    (
        "cache-max-bytes-inf",
        "settings",
        lambda w: _with_env("HAL_CACHE_MAX_BYTES", "inf", hal.kernels.cache_info),
        hal.ConfigError,
        "HAL_CACHE_MAX_BYTES='inf' is not a size",
    ),
    (
        "plugin-timeout-negative",
        "settings",
        lambda w: _with_env("HAL_PLUGIN_TIMEOUT_S", "-1", lambda: PluginSystem([])),
        hal.ConfigError,
        "HAL_PLUGIN_TIMEOUT_S='-1' is out of range",
    ),
    # -- topology files that are not what they claim (issue #12 item 7) --------------------------
    (
        "topology-binary-file",
        "comm",
        lambda w: load(_write_bytes(w, bytes(range(256)) * 4)),
        TopologyError,
        "not UTF-8 text",
    ),
    (
        "topology-too-deep",
        "comm",
        lambda w: load(_write(w, "[" * 100_000 + "]" * 100_000)),
        TopologyError,
        "too deeply",
    ),
    (
        "topology-fifo",
        "comm",
        lambda w: load(_fifo(w)),
        TopologyError,
        "is a FIFO, not a regular file",
    ),
    (
        "topology-too-large",
        "comm",
        lambda w: load(_sparse(w, 17 << 20)),
        TopologyError,
        "17825792 bytes; a topology file may have at most 16777216",
    ),
    # -- strangers, secrets, binding (issue #12 items 1-3; more in tests/comm/test_auth.py) -------
    (
        "comm-secret-file-readable-by-others",
        "comm",
        lambda w: job_secret({"HAL_COMM_SECRET_FILE": _secret_file(w, 0o644)}),
        hal.ConfigError,
        "job.key' is accessible to others \\(mode 0644\\); make it owner-only",
    ),
    (
        "comm-secret-twice",
        "comm",
        lambda w: job_secret({"HAL_COMM_SECRET": "a", "HAL_COMM_SECRET_FILE": "/x"}),
        hal.ConfigError,
        "HAL_COMM_SECRET and HAL_COMM_SECRET_FILE are both set",
    ),
    (
        "comm-rendezvous-wrong-secret",
        "comm",
        lambda w: _rendezvous_claim(w, 1, 2, b"a guess"),
        hal.CommError,
        "did not prove it holds the job's secret",
    ),
    (
        "comm-rendezvous-rank-outside-world",
        "comm",
        lambda w: _rendezvous_claim(w, 99, 2, b"job"),
        hal.CommError,
        "rank 99 is outside the world of 2 ranks",
    ),
    (
        "comm-master-addr-not-local",
        "comm",
        lambda w: _serve_at("198.51.100.7"),
        hal.CommError,
        "198.51.100.7.*is not an address of this host",
    ),
]


def _cpu_backend() -> object:
    from hal.backends.cpu import CpuBackend

    return CpuBackend()


def _write_bytes(w: World, data: bytes) -> str:
    p = w.tmp / "topo.bin"
    p.write_bytes(data)
    return str(p)


def _fifo(w: World) -> str:
    p = w.tmp / "topo.fifo"
    os.mkfifo(p)  # before: open() waited for a writer forever
    return str(p)


def _sparse(w: World, size: int) -> str:
    p = w.tmp / "topo-big.json"
    with open(p, "wb") as fh:
        fh.truncate(size)
    return str(p)


def _readonly() -> np.ndarray:
    a = np.zeros(16, dtype=np.float32)
    a.setflags(write=False)
    return a


def _with_env(name: str, value: str, fn: Callable[[], Any]) -> Any:
    old = os.environ.get(name)
    os.environ[name] = value
    try:
        return fn()
    finally:
        if old is None:
            del os.environ[name]
        else:
            os.environ[name] = old


@pytest.fixture
def world(tmp_path: Path) -> Iterator[World]:
    """A fresh :class:`World` per case."""
    w = World(tmp_path)
    yield w
    w.close()


def test_campaign_is_large_enough() -> None:
    """At least 30 bad inputs, spread over HAL, kernels and comm."""
    areas = [c[1] for c in CASES]
    assert len(CASES) >= 30 and {"hal", "kernels", "comm"} <= set(areas)
    assert len({c[0] for c in CASES}) == len(CASES)


@pytest.mark.parametrize(
    ("name", "area", "action", "exc", "match"), CASES, ids=[c[0] for c in CASES]
)
def test_bad_input_is_rejected_without_side_effect(
    world: World, name: str, area: str, action: Callable[[World], Any], exc: Any, match: str
) -> None:
    """The case raises ``exc`` with a message naming the bad value; every buffer is unchanged."""
    before = world.snapshot()
    with pytest.raises(exc, match=match):
        action(world)
    world.s0.synchronize()
    world.s1.synchronize()
    after = world.snapshot()
    for b, a in zip(before, after, strict=True):
        np.testing.assert_array_equal(a, b)
