"""Streams and events: in-order execution, ordering across streams, timing, query, lifetime."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import hal

MiB = 1 << 20


def _read(buf: hal.Buffer) -> np.ndarray:
    return buf.view(np.uint8).to_host()


# -- one stream: in order ---------------------------------------------------------------------


def test_work_on_one_stream_runs_in_order(device: hal.Device, stream: hal.Stream) -> None:
    """Dependent copies and memsets, enqueued without any synchronization, see each other."""
    n = 1 << 16
    outs = [np.zeros(n, np.uint8) for _ in range(4)]
    with device.alloc(n) as a, device.alloc(n) as b:
        for i, out in enumerate(outs):
            hal.memset(a, i + 1, stream=stream)
            hal.copy(b, a, stream=stream)
            hal.memset(a, 0xFF, stream=stream, nbytes=n // 2)
            hal.copy(out, b, stream=stream)
        stream.synchronize()
        assert stream.query()
    for i, out in enumerate(outs):
        assert (out == i + 1).all(), f"copy {i} saw another step's data"


def test_close_waits_for_enqueued_work(device: hal.Device) -> None:
    host = np.zeros(4 * MiB, np.uint8)
    with device.alloc(host.nbytes) as buf:
        s = device.create_stream()
        hal.memset(buf, 7, stream=s)
        hal.copy(host, buf, stream=s)
        s.close()
    assert (host == 7).all()


def test_device_synchronize_waits_for_every_stream(device: hal.Device) -> None:
    hosts = [np.zeros(MiB, np.uint8) for _ in range(3)]
    streams = [device.create_stream() for _ in hosts]
    bufs = [device.alloc(MiB) for _ in hosts]
    for i, (s, b, h) in enumerate(zip(streams, bufs, hosts, strict=False)):
        hal.memset(b, i + 1, stream=s)
        hal.copy(h, b, stream=s)
    device.synchronize()
    for i, (s, h) in enumerate(zip(streams, hosts, strict=False)):
        assert s.query()
        assert (h == i + 1).all()
    for s in streams:
        s.close()
    for b in bufs:
        b.close()


# -- across streams: events order work ---------------------------------------------------------


def _producer_consumer(prod: hal.Device, cons: hal.Device, wait: bool, n: int = 1 << 18) -> bool:
    """Write 1, 2, 3 on a producer stream; read on a consumer stream; True if it saw 3."""
    a, b = prod.create_stream(), cons.create_stream()
    with prod.alloc(n) as src, cons.alloc(n) as dst:
        hal.memset(src, 0, stream=a)
        a.synchronize()
        for v in (1, 2, 3):
            hal.memset(src, v, stream=a)
        ev = prod.create_event()
        ev.record(a)
        if wait:
            b.wait(ev)
        hal.copy(dst, src, stream=b)
        out = np.zeros(n, np.uint8)
        hal.copy(out, dst, stream=b)
        b.synchronize()
        a.synchronize()
    a.close()
    b.close()
    return bool((out == 3).all())


def test_event_orders_streams_of_one_device(device: hal.Device) -> None:
    for _ in range(5):
        assert _producer_consumer(device, device, wait=True)


def test_event_orders_streams_of_two_devices(device_pair: tuple[hal.Device, hal.Device]) -> None:
    a, b = device_pair
    for _ in range(5):
        assert _producer_consumer(a, b, wait=True)
        assert _producer_consumer(b, a, wait=True)


def test_event_of_another_backend_is_waited_for() -> None:
    names = list(dict.fromkeys(d.backend for d in hal.devices()))
    if len(names) < 2:
        pytest.skip(
            "only one backend is available; cross-backend waits need two (e.g. cpu and opencl)"
        )
    for x, y in [(names[0], names[1]), (names[1], names[0])]:
        assert _producer_consumer_cross(hal.devices(x)[0], hal.devices(y)[0])


def _producer_consumer_cross(prod: hal.Device, cons: hal.Device) -> bool:
    n = 1 << 18
    a, b = prod.create_stream(), cons.create_stream()
    out = np.zeros(n, np.uint8)
    with prod.alloc(n) as src:
        hal.memset(src, 0, stream=a)
        a.synchronize()
        for v in (1, 2, 3):
            hal.memset(src, v, stream=a)
        ev = prod.create_event()
        ev.record(a)
        b.wait(ev)  # another backend: hal waits on the host
        assert ev.query()
        hal.copy(out, src, stream=a)
        a.synchronize()
    a.close()
    b.close()
    return bool((out == 3).all())


_JITTER_SCRIPT = """
import json, sys
import numpy as np
import hal

prod, cons = hal.device(sys.argv[1]), hal.device(sys.argv[2])
trials, n = int(sys.argv[3]), 1 << 16
a, b = prod.create_stream(), cons.create_stream()
src, dst = prod.alloc(n), cons.alloc(n)
out = np.zeros(n, np.uint8)
wrong = {"without_wait": 0, "with_wait": 0}
for _ in range(trials):
    for key in wrong:
        hal.memset(src, 0, stream=a)
        a.synchronize()
        for v in (1, 2, 3):
            hal.memset(src, v, stream=a)
        ev = prod.create_event()
        ev.record(a)
        if key == "with_wait":
            b.wait(ev)
        hal.copy(dst, src, stream=b)
        hal.copy(out, dst, stream=b)
        b.synchronize()
        a.synchronize()
        wrong[key] += int(not (out == 3).all())
print(json.dumps({"trials": trials, "wrong": wrong,
                  "seed": prod.properties()["jitter_seed"]}))
"""


@pytest.mark.parametrize(
    ("prod", "cons", "seed"),
    [("cpu:0", "cpu:0", "1"), ("cpu:0", "cpu:1", "1234")],
    ids=["same-device", "peer"],
)
def test_jitter_shows_a_missing_event_wait(
    python_json: Callable[..., Any], prod: str, cons: str, seed: str
) -> None:
    """Under HAL_CPU_JITTER, forgetting the event wait gives wrong results; waiting never does.

    The "without wait" half proves that the ordering test can fail: without it, a stream
    that ignored ``wait`` would pass unnoticed.
    """
    res = python_json(
        ["-c", _JITTER_SCRIPT, prod, cons, "20"],
        env={"HAL_BACKENDS": "cpu", "HAL_CPU_JITTER": seed, "HAL_CPU_DEVICES": "2"},
    )
    assert res["seed"] == int(seed)
    assert res["wrong"]["with_wait"] == 0, res
    assert res["wrong"]["without_wait"] >= 1, res


# -- events: query, never recorded, re-record --------------------------------------------------


def test_event_never_recorded(device: hal.Device, stream: hal.Stream) -> None:
    ev = device.create_event()
    assert ev.query() is True
    ev.synchronize()
    stream.wait(ev)  # waiting for a never-recorded event is a no-op
    with device.alloc(8) as buf:
        hal.memset(buf, 3, stream=stream)
        stream.synchronize()
        assert (_read(buf) == 3).all()
    ev.close()


def test_event_query_and_synchronize(device: hal.Device, stream: hal.Stream) -> None:
    ev = device.create_event()
    with device.alloc(8 * MiB) as buf:
        for v in range(4):
            hal.memset(buf, v, stream=stream)
        ev.record(stream)
        assert isinstance(ev.query(), bool)
        assert isinstance(stream.query(), bool)
        ev.synchronize()
        assert ev.query() is True
        stream.synchronize()
        assert stream.query() is True


def test_event_rerecord_tracks_the_last_record(device: hal.Device, stream: hal.Stream) -> None:
    other = device.create_stream()
    ev = device.create_event()
    out = np.zeros(MiB, np.uint8)
    with device.alloc(MiB) as buf:
        hal.memset(buf, 1, stream=stream)
        ev.record(stream)
        hal.memset(buf, 2, stream=stream)
        ev.record(stream)  # the second record replaces the first
        other.wait(ev)
        hal.copy(out, buf, stream=other)
        other.synchronize()
        assert (out == 2).all()
        stream.synchronize()
    other.close()


# -- timing -------------------------------------------------------------------------------------


def test_timing_events_monotonic_and_plausible(device: hal.Device, stream: hal.Stream) -> None:
    if not device.capabilities.timing_events:
        pytest.skip(f"{device}: {device.capabilities.reason_absent('timing_events')}")
    events = [device.create_event(timing=True) for _ in range(3)]
    assert all(e.timing for e in events)
    with device.alloc(8 * MiB) as buf:
        hal.memset(buf, 0, stream=stream)
        stream.synchronize()
        t0 = time.perf_counter()
        events[0].record(stream)
        for v in range(4):
            hal.memset(buf, v, stream=stream)
        events[1].record(stream)
        for v in range(4):
            hal.memset(buf, v, stream=stream)
        events[2].record(stream)
        stream.synchronize()
        host_ms = (time.perf_counter() - t0) * 1e3
    first = events[1].elapsed_ms(events[0])
    second = events[2].elapsed_ms(events[1])
    total = events[2].elapsed_ms(events[0])
    assert isinstance(total, float)
    assert first >= 0 and second >= 0
    assert total > 0, "8 memsets of 8 MiB took no time at all"
    assert total == pytest.approx(first + second, abs=1e-3)
    assert events[0].elapsed_ms(events[0]) == 0
    assert events[0].elapsed_ms(events[2]) == pytest.approx(-total, abs=1e-3)
    assert total <= host_ms * 1.05 + 1.0, (
        f"device time {total:.3f} ms exceeds host time {host_ms:.3f} ms"
    )


def test_elapsed_ms_rejects_bad_events(device_pair: tuple[hal.Device, hal.Device]) -> None:
    a, b = device_pair
    if not a.capabilities.timing_events:
        pytest.skip(f"{a}: {a.capabilities.reason_absent('timing_events')}")
    with a.create_stream() as sa, b.create_stream() as sb:
        t1, t2, plain = a.create_event(timing=True), a.create_event(timing=True), a.create_event()
        with pytest.raises(hal.HalError, match="recorded"):
            t2.elapsed_ms(t1)
        t1.record(sa)
        plain.record(sa)
        with pytest.raises(hal.HalError, match="timing=True"):
            plain.elapsed_ms(t1)
        with pytest.raises(hal.HalError, match="timing=True"):
            t1.elapsed_ms(plain)
        with pytest.raises(TypeError, match="start_event"):
            t1.elapsed_ms(3)  # type: ignore[arg-type]
        other = b.create_event(timing=True)
        other.record(sb)
        with pytest.raises(hal.DeviceMismatchError):
            other.elapsed_ms(t1)


def test_event_and_stream_argument_checks(device_pair: tuple[hal.Device, hal.Device]) -> None:
    a, b = device_pair
    with pytest.raises(TypeError, match="timing='yes'"):
        a.create_event(timing="yes")  # type: ignore[arg-type]
    ev = a.create_event()
    with b.create_stream() as sb, a.create_stream() as sa:
        with pytest.raises(hal.DeviceMismatchError, match="belongs to"):
            ev.record(sb)
        with pytest.raises(TypeError, match="stream="):
            ev.record(None)  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="event="):
            sa.wait(None)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="create_stream"):
        hal.Stream()
    with pytest.raises(TypeError, match="create_event"):
        hal.Event()


# -- lifetime -----------------------------------------------------------------------------------


def test_closed_stream_and_event(device: hal.Device) -> None:
    s = device.create_stream()
    ev = device.create_event()
    live_stream = device.create_stream()
    s.close()
    s.close()
    assert "closed" in repr(s)
    for call in (s.synchronize, s.query, lambda: s.wait(ev), lambda: ev.record(s)):
        with pytest.raises(hal.InvalidBufferError, match="closed"):
            call()
    ev.close()
    ev.close()
    t = device.create_event()
    for call in (
        ev.synchronize,
        ev.query,
        lambda: ev.record(live_stream),
        lambda: live_stream.wait(ev),
        lambda: ev.elapsed_ms(t),
    ):
        with pytest.raises(hal.InvalidBufferError, match="closed"):
            call()
    with device.create_stream() as s2, device.create_event() as e2:
        e2.record(s2)
    with pytest.raises(hal.InvalidBufferError):
        s2.query()
    with pytest.raises(hal.InvalidBufferError):
        e2.query()
    live_stream.close()
