"""ERR-*: bad arguments are rejected with the right error, before anything is enqueued or written."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

import hal
from hal.conformance._checks import download, expect_bytes, pattern, raises, unlike, upload
from hal.conformance._registry import requirement
from hal.conformance._target import Target

Call = tuple[
    type[BaseException] | tuple[type[BaseException], ...],
    str,
    Callable[..., object],
    dict[str, Any],
]


class _Scene:
    """Two device buffers and two host arrays with known contents, to prove nothing was written."""

    def __init__(self, t: Target, n: int = 1000) -> None:
        self.t = t
        self.s = t.stream()
        self.a, self.b = t.alloc(n), t.alloc(n)
        self.ca, self.cb = pattern(t.rng, n), pattern(t.rng, n)
        upload(self.a, self.ca, self.s)
        upload(self.b, self.cb, self.s)
        self.h = pattern(t.rng, n)
        self.href = self.h.copy()
        self.in_use = t.device.memory_in_use

    def run(self, calls: list[Call]) -> None:
        for expected, what, fn, kwargs in calls:
            raises(expected, what, fn, **kwargs)
        self.verify("after the rejected calls")

    def verify(self, when: str) -> None:
        self.s.synchronize()
        self.t.device.synchronize()
        expect_bytes(self.h, self.href, f"host array {when}")
        expect_bytes(download(self.a, self.s), self.ca, f"device buffer a {when}")
        expect_bytes(download(self.b, self.s), self.cb, f"device buffer b {when}")
        now = self.t.device.memory_in_use
        self.t.expect(now == self.in_use, f"memory_in_use {self.in_use} before, {now} {when}")
        # the stream still works in order after the rejected calls
        probe = unlike(self.ca[:7])
        hal.copy(self.a, probe, stream=self.s)
        expect_bytes(download(self.a, self.s, nbytes=7), probe, f"the stream {when}")
        hal.copy(self.a, self.ca[:7], stream=self.s)
        self.s.synchronize()


@requirement(
    "ERR-COPY-BOUNDS",
    "Copies whose nbytes or offsets fall outside either operand, in any direction, raise "
    "ValueError (TypeError for non-integers) and write nothing.",
)
def _copy_bounds(t: Target) -> None:
    sc = _Scene(t)
    a, b, h, s = sc.a, sc.b, sc.h, sc.s
    n = a.nbytes
    calls: list[Call] = []
    for label, dst, src in (("H2D", a, h), ("D2H", h, a), ("D2D", b, a), ("within a buffer", a, a)):

        def c(exc: Any, what: str, **kw: Any) -> None:
            kwargs = {"dst": dst, "src": src, "stream": s, **kw}  # noqa: B023
            calls.append((exc, f"{label}: {what}", hal.copy, kwargs))  # noqa: B023

        c(ValueError, f"nbytes={n + 1} overruns both", nbytes=n + 1)
        c(ValueError, "nbytes=2 at dst_offset=n-1 overruns dst", nbytes=2, dst_offset=n - 1)
        c(ValueError, "nbytes=2 at src_offset=n-1 overruns src", nbytes=2, src_offset=n - 1)
        c(ValueError, "src_offset past the end", src_offset=n + 1)
        c(ValueError, "dst_offset past the end with default nbytes", dst_offset=1)
        c(ValueError, "negative nbytes", nbytes=-1)
        c(ValueError, "negative src_offset", src_offset=-1)
        c(ValueError, "negative dst_offset", dst_offset=-5, nbytes=1)
        c(ValueError, "huge nbytes", nbytes=1 << 62)
        c(TypeError, "float nbytes", nbytes=1.0)
        c(TypeError, "string offset", dst_offset="1")
        c(TypeError, "bool nbytes", nbytes=True)
    short = np.zeros(10, np.uint8)
    calls.append(
        (
            ValueError,
            "D2H into a host array smaller than the source",
            hal.copy,
            {"dst": short, "src": a, "stream": s},
        )
    )
    sc.run(calls)
    t.expect(not short.any(), "a refused D2H copy wrote into the host array")


@requirement(
    "ERR-COPY-OPERANDS",
    "Copies with operands that are neither buffers nor contiguous writable host memory, two host "
    "operands or a non-stream raise TypeError/ValueError and write nothing.",
)
def _copy_operands(t: Target) -> None:
    sc = _Scene(t)
    a, h, s = sc.a, sc.h, sc.s
    ro = np.frombuffer(h.tobytes(), dtype=np.uint8)
    strided = np.zeros(2000, np.uint8)[::2]
    calls: list[Call] = [
        (TypeError, "dst is an int", hal.copy, {"dst": 5, "src": a, "stream": s}),
        (TypeError, "src is a str", hal.copy, {"dst": a, "src": "abc", "stream": s}),
        (TypeError, "src is None", hal.copy, {"dst": a, "src": None, "stream": s}),
        (
            TypeError,
            "both operands on the host",
            hal.copy,
            {"dst": h, "src": h.copy(), "stream": s},
        ),
        (TypeError, "stream=None", hal.copy, {"dst": a, "src": h, "stream": None}),
        (TypeError, "stream is a Device", hal.copy, {"dst": a, "src": h, "stream": t.device}),
        (
            ValueError,
            "read-only host destination (bytes)",
            hal.copy,
            {"dst": h.tobytes(), "src": a, "stream": s},
        ),
        (
            ValueError,
            "read-only host destination (numpy)",
            hal.copy,
            {"dst": ro, "src": a, "stream": s},
        ),
        (
            ValueError,
            "non-contiguous host source",
            hal.copy,
            {"dst": a, "src": strided, "stream": s, "nbytes": 10},
        ),
        (
            ValueError,
            "non-contiguous host destination",
            hal.copy,
            {"dst": strided, "src": a, "stream": s, "nbytes": 10},
        ),
    ]
    sc.run(calls)
    t.expect(not strided.any(), "a refused copy wrote into a non-contiguous host array")


@requirement(
    "ERR-MEMSET-ARGS",
    "memset with a value outside 0..255, a non-integer value, a bad offset or nbytes, or a "
    "non-buffer raises ValueError/TypeError and writes nothing.",
)
def _memset_args(t: Target) -> None:
    sc = _Scene(t)
    a, s = sc.a, sc.s
    n = a.nbytes
    calls: list[Call] = [
        (ValueError, "value=256", hal.memset, {"buf": a, "value": 256, "stream": s}),
        (ValueError, "value=-1", hal.memset, {"buf": a, "value": -1, "stream": s}),
        (TypeError, "value=1.5", hal.memset, {"buf": a, "value": 1.5, "stream": s}),
        (TypeError, "value=True", hal.memset, {"buf": a, "value": True, "stream": s}),
        (TypeError, "value='a'", hal.memset, {"buf": a, "value": "a", "stream": s}),
        (
            ValueError,
            "offset past the end",
            hal.memset,
            {"buf": a, "value": 1, "stream": s, "offset": n + 1},
        ),
        (
            ValueError,
            "nbytes overruns",
            hal.memset,
            {"buf": a, "value": 1, "stream": s, "offset": 1, "nbytes": n},
        ),
        (
            ValueError,
            "negative nbytes",
            hal.memset,
            {"buf": a, "value": 1, "stream": s, "nbytes": -1},
        ),
        (TypeError, "float offset", hal.memset, {"buf": a, "value": 1, "stream": s, "offset": 0.0}),
        (TypeError, "buf is a host array", hal.memset, {"buf": sc.h, "value": 1, "stream": s}),
        (TypeError, "stream=None", hal.memset, {"buf": a, "value": 1, "stream": None}),
    ]
    sc.run(calls)


@requirement(
    "ERR-ALLOC-ARGS",
    "alloc with a negative or non-integer size, a bad view (dtype, shape, offset) or a bad "
    "hal.asarray raises ValueError/TypeError and allocates nothing.",
)
def _alloc_args(t: Target) -> None:
    sc = _Scene(t)
    dev = t.device
    a = sc.a
    calls: list[Call] = [
        (ValueError, "alloc(-1)", dev.alloc, {"nbytes": -1}),
        (TypeError, "alloc(1.5)", dev.alloc, {"nbytes": 1.5}),
        (TypeError, "alloc('8')", dev.alloc, {"nbytes": "8"}),
        (TypeError, "alloc(True)", dev.alloc, {"nbytes": True}),
        (TypeError, "alloc(None)", dev.alloc, {"nbytes": None}),
        (TypeError, "view(dtype=object)", a.view, {"dtype": object}),
        (TypeError, "view(dtype='not a dtype')", a.view, {"dtype": "not a dtype"}),
        (
            ValueError,
            "view(shape larger than the buffer)",
            a.view,
            {"dtype": np.float64, "shape": (126,)},
        ),
        (
            ValueError,
            "view(offset past the end)",
            a.view,
            {"dtype": np.uint8, "offset": a.nbytes + 1},
        ),
        (ValueError, "view(negative shape)", a.view, {"dtype": np.uint8, "shape": (-1,)}),
        (
            TypeError,
            "hal.asarray of objects",
            hal.asarray,
            {"host_array": np.array([object()]), "device": dev},
        ),
        (
            TypeError,
            "hal.asarray(device='cpu:0')",
            hal.asarray,
            {"host_array": np.zeros(3), "device": str(dev)},
        ),
        (TypeError, "create_event(timing='yes')", dev.create_event, {"timing": "yes"}),
    ]
    sc.run(calls)
    ok = dev.alloc(np.int64(8))  # type: ignore[arg-type]  # any integer with __index__ is accepted
    try:
        t.expect(ok.nbytes == 8, "alloc(numpy.int64(8)) did not allocate 8 bytes")
    finally:
        ok.close()


@requirement(
    "ERR-STREAM-MISMATCH",
    "Using a stream or event of another device (memset, copies, record, elapsed_ms) raises "
    "hal.DeviceMismatchError and writes nothing.",
    scope="pair",
)
def _mismatch(t: Target) -> None:
    sc = _Scene(t)
    a, h = sc.a, sc.h
    other = t.stream(t.peer)
    ev = t.event(t.device)
    E = hal.DeviceMismatchError
    calls: list[Call] = [
        (
            E,
            "memset(buffer of A, stream of B)",
            hal.memset,
            {"buf": a, "value": 1, "stream": other},
        ),
        (
            E,
            "copy(buffer of A, host, stream of B)",
            hal.copy,
            {"dst": a, "src": h, "stream": other},
        ),
        (
            E,
            "copy(host, buffer of A, stream of B)",
            hal.copy,
            {"dst": h, "src": a, "stream": other},
        ),
        (E, "copy(A, A, stream of B)", hal.copy, {"dst": a, "src": sc.b, "stream": other}),
        (E, "event of A recorded on a stream of B", ev.record, {"stream": other}),
    ]
    if t.device.capabilities.timing_events and t.peer.capabilities.timing_events:
        ea, eb = t.event(t.device, timing=True), t.event(t.peer, timing=True)
        ea.record(sc.s)
        eb.record(other)
        calls.append(
            (E, "elapsed_ms between events of two devices", ea.elapsed_ms, {"start_event": eb})
        )
    sc.run(calls)


@requirement(
    "ERR-EVENT-ARGS",
    "elapsed_ms without timing or before both records raises hal.HalError; wait/record with "
    "non-events or non-streams raise TypeError; nothing is enqueued.",
)
def _event_args(t: Target) -> None:
    sc = _Scene(t)
    s = sc.s
    plain1, plain2 = t.event(), t.event()
    plain1.record(s)
    plain2.record(s)
    calls: list[Call] = [
        (
            hal.HalError,
            "elapsed_ms between events without timing",
            plain2.elapsed_ms,
            {"start_event": plain1},
        ),
        (TypeError, "stream.wait(not an event)", s.wait, {"event": object()}),
        (TypeError, "event.record(not a stream)", plain1.record, {"stream": t.device}),
        (TypeError, "elapsed_ms(not an event)", plain1.elapsed_ms, {"start_event": 3}),
    ]
    if t.device.capabilities.timing_events:
        t1, t2 = t.event(timing=True), t.event(timing=True)
        calls.append(
            (
                hal.HalError,
                "elapsed_ms with neither event recorded",
                t2.elapsed_ms,
                {"start_event": t1},
            )
        )
        t1.record(s)
        calls.append(
            (
                hal.HalError,
                "elapsed_ms with the end event never recorded",
                t2.elapsed_ms,
                {"start_event": t1},
            )
        )
    else:
        calls.append(
            (
                hal.HalError,
                "create_event(timing=True) on a device without timing events",
                t.device.create_event,
                {"timing": True},
            )
        )
    sc.run(calls)


@requirement(
    "ERR-DISCOVERY",
    "hal.device and hal.devices reject an unknown backend, a malformed spec and an out-of-range "
    "index with ValueError/TypeError.",
    scope="backend",
)
def _discovery(t: Target) -> None:
    n = len(t.all_devices)
    raises(
        ValueError,
        f"hal.device('{t.backend}:{n}') (one past the last device)",
        hal.device,
        f"{t.backend}:{n}",
    )
    raises(ValueError, f"hal.device('{t.backend}:x')", hal.device, f"{t.backend}:x")
    raises(ValueError, "hal.devices('no-such-backend-0x5a')", hal.devices, "no-such-backend-0x5a")
    raises(TypeError, "hal.device(0)", hal.device, 0)
    for d in t.all_devices:
        same = hal.device(f"{t.backend}:{d.index}")
        t.expect(same == d and str(same) == str(d), f"hal.device('{d}') returned {same!r}")
