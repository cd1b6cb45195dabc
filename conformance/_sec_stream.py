"""STREAM-*: in-order execution, synchronize, query, many streams, device synchronize, close, host signals."""

from __future__ import annotations

import threading
import time
from typing import Any

import numpy as np

import hal
from hal.conformance._checks import (
    delayed_round_trip,
    download,
    expect_bytes,
    pattern,
    raises,
    unlike,
    upload,
)
from hal.conformance._registry import requirement
from hal.conformance._target import Target

_POLL_LIMIT_S = 30.0


def _random_op(
    t: Target,
    s: hal.Stream,
    buf: hal.Buffer,
    model: np.ndarray[Any, Any],
    snaps: list[tuple[np.ndarray[Any, Any], np.ndarray[Any, Any], str]],
    other: tuple[hal.Buffer, np.ndarray[Any, Any]],
    where: str = "",
) -> None:
    """Enqueue one random overlapping operation on ``buf`` and apply it to the host ``model``."""
    rng = t.rng
    size = buf.nbytes
    a = int(rng.integers(0, size))
    n = int(rng.integers(1, size - a + 1))
    op = int(rng.integers(0, 5))
    if op == 0:
        v = int(rng.integers(0, 256))
        hal.memset(buf, v, stream=s, offset=a, nbytes=n)
        model[a : a + n] = v
    elif op == 1:
        data = t.keep(pattern(rng, n))
        hal.copy(buf, data, stream=s, dst_offset=a)
        model[a : a + n] = data
    elif op == 2:
        b = int(rng.integers(0, size - n + 1))
        hal.copy(buf, buf, stream=s, nbytes=n, dst_offset=a, src_offset=b)
        model[a : a + n] = model[b : b + n].copy()
    elif op == 3:
        obuf, ocontent = other
        n = min(n, obuf.nbytes)
        b = int(rng.integers(0, obuf.nbytes - n + 1))
        hal.copy(buf, obuf, stream=s, nbytes=n, dst_offset=a, src_offset=b)
        model[a : a + n] = ocontent[b : b + n]
    else:
        host = t.keep(np.empty(n, np.uint8))
        hal.copy(host, buf, stream=s, src_offset=a, nbytes=n)
        snaps.append((host, model[a : a + n].copy(), f"{where}read of bytes {a}..{a + n}"))


@requirement(
    "STREAM-IN-ORDER",
    "Work on one stream runs in submission order: random overlapping memsets and copies (every "
    "direction) give the sequential result at every read.",
)
def _in_order(t: Target) -> None:
    for rnd in range(3):
        s = t.stream()
        size = 4099
        buf = t.alloc(size)
        other = t.alloc(2053)
        ocontent = pattern(t.rng, 2053)
        model = pattern(t.rng, size)
        upload(other, ocontent, s)
        upload(buf, model, s)
        snaps: list[tuple[np.ndarray[Any, Any], np.ndarray[Any, Any], str]] = []
        for _ in range(150):
            _random_op(t, s, buf, model, snaps, (other, ocontent))
        s.synchronize()
        for k, (got, want, what) in enumerate(snaps):
            expect_bytes(got, want, f"round {rnd}, read {k}: {what}")
        expect_bytes(download(buf, s), model, f"round {rnd}: final contents after 150 operations")


@requirement(
    "STREAM-SYNC",
    "Stream.synchronize returns only after all work enqueued on the stream, including "
    "device-to-host copies, has completed.",
)
def _sync(t: Target) -> None:
    for rnd in range(3):
        s = t.stream()
        buf = t.alloc(65_537)
        host, data = delayed_round_trip(t, s, buf)
        s.synchronize()
        expect_bytes(host, data, f"round {rnd}: host memory right after Stream.synchronize")


@requirement(
    "STREAM-QUERY",
    "Stream.query() is True for an idle stream, becomes True without synchronize once the work is "
    "done, and when True all enqueued work has landed.",
)
def _query(t: Target) -> None:
    s = t.stream()
    t.expect(s.query() is True, "query() of a new stream with no work is not True")
    for rnd in range(3):
        buf = t.alloc(65_537)
        host, data = delayed_round_trip(t, s, buf)
        t0 = time.monotonic()
        while not s.query():
            if time.monotonic() - t0 > _POLL_LIMIT_S:
                raise t.fail(
                    f"round {rnd}: query() stayed False for {_POLL_LIMIT_S:g} s after the work was enqueued"
                )
            time.sleep(0.0002)
        expect_bytes(host, data, f"round {rnd}: host memory when query() first returned True")
        s.synchronize()
        t.expect(s.query() is True, f"round {rnd}: query() is not True after synchronize")


@requirement(
    "STREAM-MANY",
    "Sixteen streams with randomly interleaved submissions and event-ordered exchanges each run "
    "in order and give the sequential result.",
)
def _many(t: Target) -> None:
    k = 16
    size = 2053
    streams = [t.stream() for _ in range(k)]
    bufs = [t.alloc(size) for _ in range(k)]
    models = [pattern(t.rng, size) for _ in range(k)]
    helper = t.stream()
    for b, m in zip(bufs, models, strict=True):
        upload(b, m, helper)
    others = [(t.alloc(1), np.zeros(1, np.uint8)) for _ in range(k)]
    for b, m in others:
        upload(b, m, helper)
    snaps: list[tuple[np.ndarray[Any, Any], np.ndarray[Any, Any], str]] = []
    for step in range(400):
        i = int(t.rng.integers(0, k))
        if t.rng.random() < 0.15:
            j = int((i + t.rng.integers(1, k)) % k)
            exported = t.alloc(size)
            upload(exported, unlike(models[j]), helper)
            hal.copy(exported, bufs[j], stream=streams[j])
            snapshot = models[j].copy()
            ev = t.event()
            ev.record(streams[j])
            streams[i].wait(ev)
            a = int(t.rng.integers(0, size))
            n = int(t.rng.integers(1, size - a + 1))
            hal.copy(bufs[i], exported, stream=streams[i], nbytes=n, dst_offset=a, src_offset=a)
            models[i][a : a + n] = snapshot[a : a + n]
        else:
            _random_op(
                t, streams[i], bufs[i], models[i], snaps, others[i], f"stream {i}, step {step}: "
            )
    for s in streams:
        s.synchronize()
    for got, want, what in snaps:
        expect_bytes(got, want, what)
    for i, (b, m) in enumerate(zip(bufs, models, strict=True)):
        expect_bytes(download(b, helper), m, f"stream {i}: final contents")


@requirement(
    "STREAM-DEVICE-SYNC",
    "Device.synchronize returns only after the work of every stream of the device has completed, "
    "whichever stream has the most work.",
)
def _device_sync(t: Target) -> None:
    k = 4
    streams = [t.stream() for _ in range(k)]
    bufs = [t.alloc(4097) for _ in range(k)]
    for rnd in range(k):  # each stream in turn has far more work than the others
        hosts = []
        for i, (s, buf) in enumerate(zip(streams, bufs, strict=True)):
            hosts.append(delayed_round_trip(t, s, buf, ms=30 if i == rnd else 1))
        t.device.synchronize()
        for i, (host, data) in enumerate(hosts):
            what = "the long" if i == rnd else "a short"
            expect_bytes(
                host, data, f"round {rnd}: stream {i} ({what} work) right after Device.synchronize"
            )


@requirement(
    "STREAM-CLOSE",
    "Stream.close() waits for the stream's work and is idempotent; any later use raises "
    "hal.InvalidBufferError and enqueues nothing.",
)
def _close(t: Target) -> None:
    dev = t.device
    s = dev.create_stream()
    buf = t.alloc(8193)
    host, data = delayed_round_trip(t, s, buf)
    s.close()
    expect_bytes(host, data, "host memory right after Stream.close()")
    s.close()
    E = hal.InvalidBufferError
    ev = t.event()
    other = t.stream()
    ev.record(other)
    host2 = unlike(data)
    ref2 = host2.copy()
    raises(E, "closed stream .synchronize()", s.synchronize)
    raises(E, "closed stream .query()", s.query)
    raises(E, "closed stream .wait(event)", s.wait, ev)
    raises(E, "event.record(closed stream)", ev.record, s)
    raises(E, "copy(host, buffer, stream=closed)", hal.copy, host2, buf, stream=s)
    raises(E, "copy(buffer, host, stream=closed)", hal.copy, buf, host2, stream=s)
    raises(E, "memset(stream=closed)", hal.memset, buf, 0, stream=s)
    raises(E, "Array.to_host(stream=closed)", buf.view(np.uint8).to_host, stream=s)
    expect_bytes(host2, ref2, "host memory after copies refused on a closed stream")
    expect_bytes(
        download(buf, other), data, "device memory after operations refused on a closed stream"
    )
    with dev.create_stream() as s2:
        hal.memset(buf, 9, stream=s2, nbytes=1)
    raises(E, "a stream used after its with-block", s2.query)


def _changed(host: np.ndarray[Any, Any], stale: np.ndarray[Any, Any]) -> Any:
    """Return a probe that is True once ``host`` no longer holds ``stale``."""
    return lambda: not np.array_equal(host, stale)


def _hold(t: Target, s: hal.Stream, hold_s: float, checks: list[tuple[str, Any]]) -> None:
    """For ``hold_s`` seconds, fail if any ``(what, probe)`` probe returns True (work ran early)."""
    end = time.monotonic() + hold_s
    while True:
        for what, probe in checks:
            if probe():
                raise t.fail(f"{what} before the host signal was set")
        if time.monotonic() >= end:
            return
        time.sleep(0.002)


@requirement(
    "STREAM-HOST-SIGNAL",
    "Work enqueued after Stream.wait_host() does not start before another thread sets the signal, "
    "starts without synchronize once it is set, and earlier work and other streams run on "
    "meanwhile.",
    needs="host_signal",
)
def _host_signal(t: Target) -> None:
    timing = t.device.capabilities.timing_events
    hold_s = 0.03
    for rnd in range(3):
        s, other = t.stream(), t.stream()
        before_buf, buf = t.alloc(4097), t.alloc(65_537)
        before_host, before_data = delayed_round_trip(t, s, before_buf, ms=5)
        start = t.event(timing=timing)
        start.record(s)
        sig = s.wait_host()
        t.expect(
            sig.native,
            f"round {rnd}: wait_host() fell back to a host wait although host_signal is declared",
        )
        data = pattern(t.rng, buf.nbytes)
        host = unlike(data)
        stale = host.copy()
        hal.copy(buf, data, stream=s)
        hal.copy(host, buf, stream=s)
        end = t.event(timing=timing)
        end.record(s)
        # the work before the wait completes while the signal is pending
        start.synchronize()
        expect_bytes(
            before_host,
            before_data,
            f"round {rnd}: work enqueued before wait_host() (signal pending)",
        )
        # another stream is not held
        side = t.alloc(257)
        side_data = pattern(t.rng, 257)
        hal.copy(side, side_data, stream=other)
        expect_bytes(
            download(side, other),
            side_data,
            f"round {rnd}: another stream while a signal is pending",
        )
        _hold(
            t,
            s,
            hold_s,
            [
                (f"round {rnd}: Stream.query() was True", s.query),
                (f"round {rnd}: an event recorded after wait_host() completed", end.query),
                (
                    f"round {rnd}: a device-to-host copy enqueued after wait_host() landed",
                    _changed(host, stale),
                ),
            ],
        )
        setter = threading.Thread(target=sig.set)  # set from another thread, as a comm engine does
        setter.start()
        setter.join()
        t0 = time.monotonic()
        while not end.query():
            if time.monotonic() - t0 > _POLL_LIMIT_S:
                raise t.fail(
                    f"round {rnd}: the work after wait_host() did not complete {_POLL_LIMIT_S:g} s after set()"
                )
            time.sleep(0.0005)
        expect_bytes(
            host, data, f"round {rnd}: device-to-host copy enqueued after wait_host(), once set"
        )
        s.synchronize()
        if timing:
            gap = end.elapsed_ms(start)
            t.expect(
                gap >= hold_s * 1e3 * 0.5,
                f"round {rnd}: the work after wait_host() ran {gap:.3f} ms after the work before it, "
                f"but the signal was held for {hold_s * 1e3:.0f} ms",
            )
    # several signals: the stream goes on only once every one is set, in any order
    s = t.stream()
    buf = t.alloc(1031)
    first, second = s.wait_host(), s.wait_host()
    data = pattern(t.rng, buf.nbytes)
    host = unlike(data)
    stale = host.copy()
    hal.copy(buf, data, stream=s)
    hal.copy(host, buf, stream=s)
    second.set()
    _hold(
        t,
        s,
        hold_s,
        [
            (
                "with the first of two signals unset, a copy enqueued after both landed",
                _changed(host, stale),
            )
        ],
    )
    first.set()
    s.synchronize()
    expect_bytes(host, data, "copy after two host signals set in reverse order")
