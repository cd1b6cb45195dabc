"""STREAM-/EVENT-* beyond the basics: what asynchronous backends really get wrong.

Timing bounded below and above, event waits that capture the record they were issued
after, streams that finish their queued work when garbage-collected, and ``query()`` that
never blocks. Where a check needs work that stays pending for as long as it likes, it
holds a stream with a host signal (:meth:`hal.Stream.wait_host`, capability
``host_signal``), so the outcome does not depend on how fast the device is: the same
broken backend fails every run.
"""

from __future__ import annotations

import gc
import threading
import time
from collections.abc import Callable

import numpy as np

import hal
from hal.conformance._checks import download, expect_bytes, heavy, pattern, unlike
from hal.conformance._registry import requirement
from hal.conformance._target import Target

#: milliseconds a host-held interval lasts in the timing checks
HOLD_MS = 60.0
#: seconds a correct backend gets to finish work that nothing holds any more
SETTLE_S = 3.0
#: seconds a query() may take before it counts as blocking
QUERY_LIMIT_S = 2.0


def _poll(cond: Callable[[], bool], limit: float = SETTLE_S) -> bool:
    """Return True as soon as ``cond()`` is true, False after ``limit`` seconds."""
    t0 = time.monotonic()
    while not cond():
        if time.monotonic() - t0 > limit:
            return False
        time.sleep(0.0005)
    return True


def _sleep_until(deadline: float) -> None:
    while (left := deadline - time.perf_counter()) > 0:
        time.sleep(left)


@requirement(
    "EVENT-TIMING-BOUNDS",
    "elapsed_ms between two records that the host separates by a known interval is at least that "
    "interval and at most the host's wall time around both (milliseconds, not seconds or "
    "microseconds).",
    needs="timing_events",
)
def _timing_bounds(t: Target) -> None:
    s = t.stream()
    start, end = t.event(timing=True), t.event(timing=True)
    samples = []
    for hold in (HOLD_MS, HOLD_MS / 3):
        s.synchronize()
        h0 = time.perf_counter()
        start.record(s)
        start.synchronize()  # start's timestamp is taken before this returns
        t_start = time.perf_counter()
        _sleep_until(t_start + hold / 1e3)
        end.record(s)  # and end's only after this call
        end.synchronize()
        wall = (time.perf_counter() - h0) * 1e3
        ms = end.elapsed_ms(start)
        samples.append([round(ms, 4), round(hold, 1), round(wall, 4)])
        t.expect(
            ms >= hold - 1.0,
            f"elapsed_ms is {ms!r} for two records at least {hold:g} ms apart (a unit error, seconds?)",
        )
        t.expect(
            ms <= wall * 1.05 + 0.5,
            f"elapsed_ms is {ms:.4f} but the host measured {wall:.4f} ms around both records (microseconds?)",
        )
    t.attach("elapsed_ms_hold_wall", samples)


@requirement(
    "EVENT-TIMING-EXECUTION",
    "Timing events take their timestamp when the stream reaches them, not when record() is "
    "called: an interval stretched by waiting on another stream's held work measures that wait.",
    needs=("timing_events", "host_signal"),
)
def _timing_execution(t: Target) -> None:
    s, other = t.stream(), t.stream()
    start, end = t.event(timing=True), t.event(timing=True)
    gate = t.event()
    samples = []
    for rnd in range(2):
        s.synchronize()
        h0 = time.perf_counter()
        start.record(s)
        start.synchronize()
        t_start = time.perf_counter()
        sig = other.wait_host(timeout=30)
        gate.record(other)  # completes only once the host sets the signal
        s.wait(gate)
        end.record(s)  # called now, reached by the stream only after the signal
        _sleep_until(t_start + HOLD_MS / 1e3)
        sig.set()
        end.synchronize()
        wall = (time.perf_counter() - h0) * 1e3
        ms = end.elapsed_ms(start)
        samples.append([round(ms, 4), round(wall, 4)])
        t.expect(
            ms >= HOLD_MS - 1.0,
            f"round {rnd}: elapsed_ms is {ms:.4f} across a wait the host held for {HOLD_MS:g} ms: "
            "timestamps taken when record() is called, not when the stream reaches the event?",
        )
        t.expect(
            ms <= wall * 1.05 + 0.5,
            f"round {rnd}: elapsed_ms {ms:.4f} exceeds the host's {wall:.4f} ms",
        )
    t.attach("elapsed_ms_wall", samples)


@requirement(
    "EVENT-WAIT-SNAPSHOT",
    "Stream.wait(event) waits for the event's last record before the wait call: a wait on a "
    "never-recorded event waits for nothing, and a later record (even one still pending) does not "
    "change an earlier wait.",
    needs="host_signal",
)
def _wait_snapshot(t: Target) -> None:
    s, s2 = t.stream(), t.stream()
    buf = t.alloc(4097)
    for case in ("never recorded before the wait", "re-recorded after the wait"):
        ev = t.event()
        if case.startswith("re-"):
            ev.record(s2)
            ev.synchronize()  # the record the wait refers to has completed
        hold_s = s.wait_host(timeout=30)  # s reaches its wait only after the later record call
        s.wait(ev)
        data = pattern(t.rng, buf.nbytes)
        host = unlike(data)
        hal.copy(buf, data, stream=s)
        hal.copy(host, buf, stream=s)
        hold_s2 = s2.wait_host(timeout=30)
        ev.record(s2)  # pending until hold_s2 is set
        hold_s.set()
        finished = _poll(s.query)
        hold_s2.set()
        s2.synchronize()
        s.synchronize()
        t.expect(
            finished,
            f"event {case}: the waiting stream did not finish within {SETTLE_S:g} s while a "
            "record issued after its wait was pending (the wait looked the event up when the stream "
            "reached it, instead of when it was called)",
        )
        expect_bytes(host, data, f"event {case}: the waiting stream's round trip")


@requirement(
    "STREAM-GC",
    "A stream dropped (garbage-collected) with work still queued completes that work: nothing queued is lost.",
)
def _gc(t: Target) -> None:
    dev = t.device
    other = t.stream()
    for rnd in range(2):
        buf = t.alloc(65_537)
        data = pattern(t.rng, buf.nbytes)
        host = t.keep(unlike(data))
        s = dev.create_stream()
        timer = None
        if dev.capabilities.host_signal:
            hold = other.wait_host(timeout=30)
            gate = t.event()
            gate.record(other)
            s.wait(gate)  # s's work stays queued until the host sets the signal
            timer = threading.Timer(0.05, hold.set)
            timer.start()
        else:
            heavy(t, s)
        hal.copy(buf, data, stream=s)
        hal.copy(host, buf, stream=s)
        del s
        gc.collect()
        landed = _poll(lambda: bool(np.array_equal(host, data)))  # noqa: B023
        if timer is not None:
            timer.join()
        dev.synchronize()
        t.expect(
            landed,
            f"round {rnd}: the queued copies of a garbage-collected stream never ran "
            f"(host memory unchanged {SETTLE_S:g} s later)",
        )
        expect_bytes(
            download(buf, other),
            data,
            f"round {rnd}: device memory written by a garbage-collected stream",
        )


def _in_thread(fn: Callable[[], object], limit: float) -> tuple[bool, object]:
    """Run ``fn`` in a thread; return (returned within ``limit``, its result or exception)."""
    box: dict[str, object] = {}

    def body() -> None:
        try:
            box["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 - reported by the caller
            box["value"] = exc

    th = threading.Thread(target=body, name="hal-conformance query", daemon=True)
    th.start()
    th.join(limit)
    return not th.is_alive(), box.get("value")


@requirement(
    "STREAM-QUERY-NONBLOCKING",
    "Stream.query() and Event.query() return False at once while the work is pending; they never wait for it.",
    needs="host_signal",
)
def _query_nonblocking(t: Target) -> None:
    s = t.stream()
    ev = t.event()
    buf = t.alloc(65_537)
    hold = s.wait_host(timeout=30)
    hal.memset(buf, 7, stream=s)
    ev.record(s)
    try:
        quick_s, got_s = _in_thread(s.query, QUERY_LIMIT_S)
        quick_e, got_e = _in_thread(ev.query, QUERY_LIMIT_S) if quick_s else (False, None)
    finally:
        hold.set()
    s.synchronize()
    t.expect(
        quick_s,
        f"Stream.query() did not return within {QUERY_LIMIT_S:g} s while the stream's work was pending",
    )
    t.expect(
        got_s is False, f"Stream.query() returned {got_s!r} while the stream's work was pending"
    )
    t.expect(
        quick_e,
        f"Event.query() did not return within {QUERY_LIMIT_S:g} s while the recorded work was pending",
    )
    t.expect(
        got_e is False, f"Event.query() returned {got_e!r} while the recorded work was pending"
    )
    t.expect(s.query() is True and ev.query() is True, "query() is not True after synchronize")
    expect_bytes(
        download(buf, s),
        np.full(buf.nbytes, 7, np.uint8),
        "the work that was pending during query()",
    )
