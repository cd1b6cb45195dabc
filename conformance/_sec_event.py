"""EVENT-*: cross-stream and cross-device ordering, synchronize, query, re-record, timing."""

from __future__ import annotations

import time

import numpy as np

import hal
from hal.conformance._checks import (
    delayed_round_trip,
    download,
    expect_bytes,
    heavy,
    pattern,
    raises,
    unlike,
    upload,
)
from hal.conformance._registry import requirement
from hal.conformance._target import Target


@requirement(
    "EVENT-CROSS-STREAM",
    "Stream.wait(event) orders work across streams: a consumer never reads data before, nor "
    "overwrites it during, the producer's recorded work.",
)
def _cross_stream(t: Target) -> None:
    for rnd in range(4):
        prod, cons = t.stream(), t.stream()
        src, dst = t.alloc(65_537), t.alloc(65_537)
        old = pattern(t.rng, src.nbytes)
        new = unlike(old)
        upload(src, old, prod)
        upload(dst, pattern(t.rng, dst.nbytes), cons)
        # read after write: the consumer copies what the producer wrote
        heavy(t, prod)
        hal.copy(src, new, stream=prod)
        ev = t.event()
        ev.record(prod)
        cons.wait(ev)
        hal.copy(dst, src, stream=cons)
        host = np.zeros(dst.nbytes, np.uint8)
        hal.copy(host, dst, stream=cons)
        cons.synchronize()
        expect_bytes(
            host, new, f"round {rnd}: consumer read after waiting for the producer's event"
        )
        # write after read: the consumer overwrites what the producer still reads
        seen = np.zeros(src.nbytes, np.uint8)
        heavy(t, prod)
        hal.copy(seen, src, stream=prod)
        ev2 = t.event()
        ev2.record(prod)
        cons.wait(ev2)
        hal.memset(src, 0x00, stream=cons)
        cons.synchronize()
        prod.synchronize()
        expect_bytes(
            seen, new, f"round {rnd}: producer read overwritten by a consumer that waited for it"
        )


@requirement(
    "EVENT-CROSS-DEVICE",
    "A stream of one device waiting on an event of another device of the backend runs its later "
    "work after the recorded work.",
    scope="pair",
)
def _cross_device(t: Target) -> None:
    a, b = t.device, t.peer
    for rnd in range(3):
        prod, cons = t.stream(a), t.stream(b)
        src, dst = t.alloc(65_537, a), t.alloc(65_537, b)
        old = pattern(t.rng, src.nbytes)
        new = unlike(old)
        upload(src, old, prod)
        heavy(t, prod)
        hal.copy(src, new, stream=prod)
        ev = t.event(a)
        ev.record(prod)
        cons.wait(ev)
        hal.copy(dst, src, stream=cons)
        expect_bytes(
            download(dst, cons),
            new,
            f"round {rnd}: {b} copied {a}'s buffer after waiting on {a}'s event",
        )


@requirement(
    "EVENT-SYNC",
    "Event.synchronize returns only after the work enqueued before the last record has completed, "
    "and query() is True afterwards.",
)
def _sync(t: Target) -> None:
    s = t.stream()
    for rnd in range(3):
        buf = t.alloc(65_537)
        host, data = delayed_round_trip(t, s, buf)
        ev = t.event()
        ev.record(s)
        ev.synchronize()
        expect_bytes(host, data, f"round {rnd}: host memory right after Event.synchronize")
        t.expect(ev.query() is True, f"round {rnd}: query() is not True after Event.synchronize")


@requirement(
    "EVENT-QUERY",
    "An event never recorded queries True and synchronizes at once; a recorded event becomes True "
    "without synchronize, and when True its work has landed.",
)
def _query(t: Target) -> None:
    ev = t.event()
    t.expect(ev.query() is True, "query() of a never-recorded event is not True")
    ev.synchronize()
    s = t.stream()
    for rnd in range(3):
        buf = t.alloc(65_537)
        host, data = delayed_round_trip(t, s, buf)
        ev.record(s)
        t0 = time.monotonic()
        while not ev.query():
            if time.monotonic() - t0 > 30:
                raise t.fail(f"round {rnd}: Event.query() stayed False for 30 s")
            time.sleep(0.0002)
        expect_bytes(host, data, f"round {rnd}: host memory when Event.query() first returned True")


@requirement(
    "EVENT-RERECORD",
    "Re-recording an event moves it: synchronize and waits issued afterwards refer to the last record.",
)
def _rerecord(t: Target) -> None:
    s, other = t.stream(), t.stream()
    ev = t.event()
    buf = t.alloc(65_537)
    ev.record(s)
    ev.synchronize()
    for rnd in range(3):
        host, data = delayed_round_trip(t, s, buf)
        ev.record(s)
        ev.synchronize()
        expect_bytes(host, data, f"round {rnd}: synchronize of a re-recorded event")
        new = unlike(data)
        heavy(t, s)
        hal.copy(buf, new, stream=s)
        ev.record(s)
        other.wait(ev)
        got = np.zeros(buf.nbytes, np.uint8)
        hal.copy(got, buf, stream=other)
        other.synchronize()
        expect_bytes(got, new, f"round {rnd}: a wait on a re-recorded event")


@requirement(
    "EVENT-TIMING-MONOTONIC",
    "elapsed_ms along a chain of timing events on one stream is non-negative, increases over "
    "work, and is additive and antisymmetric.",
    needs="timing_events",
)
def _timing_monotonic(t: Target) -> None:
    s = t.stream()
    evs = [t.event(timing=True) for _ in range(6)]
    for i, ev in enumerate(evs):
        if i:
            heavy(t, s, ms=2 * i)
        ev.record(s)
    evs[-1].synchronize()
    first = evs[0]
    cum = [ev.elapsed_ms(first) for ev in evs]
    for i, v in enumerate(cum):
        t.expect(isinstance(v, float) and np.isfinite(v), f"elapsed_ms returned {v!r}")
        t.expect(v >= 0, f"event {i} is {v:.6f} ms before the first event recorded before it")
        if i:
            t.expect(
                v >= cum[i - 1], f"elapsed time went backwards: {cum[i - 1]:.6f} ms then {v:.6f} ms"
            )
    for i in range(1, len(evs) - 1):
        step1 = evs[i].elapsed_ms(evs[i - 1])
        step2 = evs[i + 1].elapsed_ms(evs[i])
        whole = evs[i + 1].elapsed_ms(evs[i - 1])
        t.expect(
            step1 > 0 and step2 > 0,
            f"a step over {2 * i} ms of work between consecutive events is not "
            f"positive: {step1}, {step2}",
        )
        t.expect(
            abs(whole - (step1 + step2)) <= 0.01 + 0.01 * whole,
            f"not additive: {whole:.6f} ms vs {step1:.6f} + {step2:.6f} ms",
        )
        back = evs[i - 1].elapsed_ms(evs[i])
        t.expect(
            abs(back + step1) <= 0.01 + 0.01 * abs(step1),
            f"not antisymmetric: {step1:.6f} ms forward, {back:.6f} ms backward",
        )
    t.attach("elapsed_ms", [round(v, 4) for v in cum])


@requirement(
    "EVENT-TIMING-PLAUSIBLE",
    "elapsed_ms of real work is positive and no larger than the host's wall time around it.",
    needs="timing_events",
)
def _timing_plausible(t: Target) -> None:
    s = t.stream()
    start, end = t.event(timing=True), t.event(timing=True)
    samples = []
    for ms in (3, 10, 20):
        s.synchronize()
        t0 = time.perf_counter()
        start.record(s)
        heavy(t, s, ms=ms)
        end.record(s)
        end.synchronize()
        wall = (time.perf_counter() - t0) * 1e3
        dev_ms = end.elapsed_ms(start)
        samples.append([round(dev_ms, 4), round(wall, 4)])
        t.expect(dev_ms > 0, f"elapsed_ms of about {ms} ms of work is {dev_ms!r}")
        t.expect(
            dev_ms <= wall * 1.05 + 0.5,
            f"elapsed_ms {dev_ms:.3f} exceeds the host wall time {wall:.3f} ms around the work (unit error?)",
        )
    s.synchronize()
    t0 = time.perf_counter()
    start.record(s)
    end.record(s)
    end.synchronize()
    wall = (time.perf_counter() - t0) * 1e3
    empty = end.elapsed_ms(start)
    t.expect(
        0 <= empty <= wall * 1.05 + 0.5,
        f"elapsed_ms of an empty interval is {empty!r} (host saw {wall:.3f} ms)",
    )
    t.attach("samples_device_vs_host_ms", samples)


@requirement(
    "EVENT-CLOSE",
    "Event.close() is idempotent; a closed event raises hal.InvalidBufferError on record, wait, "
    "query, synchronize and elapsed_ms.",
)
def _close(t: Target) -> None:
    s = t.stream()
    timing = t.device.capabilities.timing_events
    ev = t.device.create_event(timing=timing)
    ok = t.event(timing=timing)
    ev.record(s)
    ok.record(s)
    s.synchronize()
    ev.close()
    ev.close()
    E = hal.InvalidBufferError
    raises(E, "closed event .record()", ev.record, s)
    raises(E, "stream.wait(closed event)", s.wait, ev)
    raises(E, "closed event .query()", ev.query)
    raises(E, "closed event .synchronize()", ev.synchronize)
    if timing:
        raises(E, "closed event .elapsed_ms()", ev.elapsed_ms, ok)
        raises(E, "elapsed_ms(start_event=closed)", ok.elapsed_ms, ev)
    buf = t.alloc(16)
    upload(buf, np.arange(16, dtype=np.uint8), s)
    expect_bytes(
        download(buf, s),
        np.arange(16, dtype=np.uint8),
        "the stream after refused uses of a closed event",
    )
