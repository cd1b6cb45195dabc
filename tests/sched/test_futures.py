"""Futures without a Condition: waiters made lazily, outcomes seen before and after the end, races."""

from __future__ import annotations

import logging
import threading

import pytest

import hal
from hal.sched import PerfModel, Scheduler
from hal.sched._task import Future


def _gated(
    sched: Scheduler, gate: threading.Event, value: object = 7, device: hal.Device | None = None
) -> Future:
    """A task that runs (on ``device``, pinned) until ``gate`` is set, then returns or raises ``value``."""

    def task(ctx: object) -> object:
        gate.wait(30)
        if isinstance(value, BaseException):
            raise value
        return value

    fut = sched.submit(task, device=device)
    while fut.task.state != "running":
        gate.wait(0.001)
    return fut


def test_a_future_allocates_no_waiter_until_someone_waits(cpu_pair: list[hal.Device]) -> None:
    with Scheduler(cpu_pair) as sched:
        fut = sched.submit(lambda ctx: 3)
        assert fut.result(timeout=30) == 3
        assert fut._waiters is None  # finished before anyone blocked, or released and dropped
        gate = threading.Event()
        blocked = _gated(sched, gate)
        assert blocked._waiters is None and not blocked.done()
        with pytest.raises(TimeoutError, match=r"not finished after 0\.05 s"):
            blocked.result(timeout=0.05)
        assert blocked._waiters == []  # the timed-out waiter took itself out
        gate.set()
        assert blocked.result(timeout=30) == 7
        assert blocked._waiters is None


def test_waiters_before_and_after_the_end_see_the_same_outcome(
    cpu_pair: list[hal.Device],
) -> None:
    with Scheduler(cpu_pair) as sched:
        gate = threading.Event()
        ok = _gated(sched, gate, "ok", cpu_pair[0])
        failed = _gated(sched, gate, KeyError("boom"), cpu_pair[1])  # both run at once
        seen: list[object] = []
        lock = threading.Lock()

        def wait_for(fut: Future) -> None:
            try:
                got: object = fut.result(timeout=30)
            except KeyError as exc:
                got = exc
            with lock:
                seen.append(got)

        early = [
            threading.Thread(target=wait_for, args=(f,)) for f in (ok, failed) for _ in range(8)
        ]
        for t in early:
            t.start()
        gate.set()
        for t in early:
            t.join(30)
        assert ok.result() == "ok"  # arrived after the end: no lock, same answer
        with pytest.raises(KeyError, match="boom"):
            failed.result()
        assert isinstance(failed.exception(), KeyError) and ok.exception() is None
        assert seen.count("ok") == 8
        assert sum(isinstance(s, KeyError) for s in seen) == 8


def test_timeouts_racing_the_end_lose_no_wakeup(cpu_pair: list[hal.Device]) -> None:
    """Waiters time out while the task ends: each either times out or sees the result, and a
    later wait always sees the result (no waiter is left behind, none is released twice)."""
    with Scheduler(cpu_pair) as sched:
        for round_ in range(20):
            gate = threading.Event()
            fut = _gated(sched, gate, round_)
            outcomes: list[str] = []

            def waiter(fut: Future = fut, outcomes: list[str] = outcomes) -> None:
                try:
                    fut.result(timeout=0.001 * (len(outcomes) % 3))
                    outcomes.append("result")
                except TimeoutError:
                    outcomes.append("timeout")

            threads = [threading.Thread(target=waiter) for _ in range(6)]
            for t in threads:
                t.start()
            gate.set()
            for t in threads:
                t.join(30)
            assert len(outcomes) == 6
            assert fut.result(timeout=30) == round_ and fut._waiters is None


def test_a_raising_done_callback_is_logged_and_the_scheduler_goes_on(
    cpu_pair: list[hal.Device], caplog: pytest.LogCaptureFixture
) -> None:
    with Scheduler(cpu_pair) as sched:
        gate = threading.Event()
        fut = _gated(sched, gate)
        called: list[object] = []

        def bad(f: Future) -> None:
            raise RuntimeError("callback failed")

        fut.add_done_callback(bad)
        fut.add_done_callback(lambda f: called.append(f.result()))
        with caplog.at_level(logging.ERROR, logger="hal.sched"):
            gate.set()
            assert fut.result(timeout=30) == 7
            sched.wait(timeout=30)  # the count of outstanding tasks still reached zero
            assert sched.submit(lambda ctx: 5).result(timeout=30) == 5  # its worker lives on
        assert called == [7]
        assert any("done callback" in r.getMessage() for r in caplog.records)
        late: list[object] = []
        fut.add_done_callback(lambda f: late.append(f.result()))  # already done: called now
        assert late == [7]


def test_a_dependant_made_ready_by_an_end_runs_before_queued_work(
    cpu_pair: list[hal.Device],
) -> None:
    """A worker takes its next task in the critical section where the last one ended, except
    when something waits for that task: its dependant, made ready by the end, comes first."""
    gate = threading.Event()
    with Scheduler(cpu_pair[:1]) as sched:
        first = _gated(sched, gate, 1)
        queued = [sched.submit(lambda ctx: None, name=f"q{i}") for i in range(5)]
        dependant = sched.submit(lambda ctx, x: x + 1, first, priority=10)
        gate.set()
        assert dependant.result(timeout=30) == 2
        sched.wait(timeout=30)
        start = dependant.record.start
        assert start is not None
        assert all((q.record.start or 0.0) > start for q in queued)


def test_a_push_releases_the_parked_worker_of_its_device_only(cpu_pair: list[hal.Device]) -> None:
    """Idle workers park (and re-park every 0.1 s); a task placed on a device releases that
    device's parked worker at once, the other device's stays parked; work submitted after
    several park timeouts still runs."""
    import time

    with Scheduler(cpu_pair) as sched:
        for i in range(3):
            deadline = time.monotonic() + 30
            while True:  # both workers parked (under the lock the lists cannot change)
                with sched._lock:
                    if all(len(sched._parked[d]) == 1 for d in cpu_pair):
                        assert sched._n_waiting == 2
                        fut = sched.submit(lambda ctx, i=i: (i, ctx.device))
                        placed = sched.policy.placed
                        assert placed in cpu_pair
                        other = cpu_pair[1] if placed == cpu_pair[0] else cpu_pair[0]
                        assert sched._parked[placed] == [] and len(sched._parked[other]) == 1
                        break
                assert time.monotonic() < deadline, "the workers never parked"
                threading.Event().wait(0.005)
            assert fut.result(timeout=30) == (i, placed)
            threading.Event().wait(0.25)  # let the workers time out and park again


def test_the_stale_device_check_keeps_its_answer_while_cached() -> None:
    """first_stale caches 'none stale until N samples' per key; it still names a device once
    explore_after samples arrived elsewhere, and answers each device list by itself."""
    a, b = hal.devices("cpu")[:2]
    model = PerfModel(min_samples=1, explore_after=4)
    assert model.first_stale("op", [a, b], 64) is None  # no sample anywhere
    model.observe("op", a, 64, 0.1)
    assert model.first_stale("op", [a, b], 64) is b  # never tried
    model.observe("op", b, 64, 0.1)
    for _ in range(3):
        assert model.first_stale("op", [a, b], 64) is None
        model.observe("op", a, 64, 0.1)
    assert model.first_stale("op", [a, b], 64) is None
    model.observe("op", a, 64, 0.1)  # 4 samples on a since b's last one
    assert model.first_stale("op", [a, b], 64) is b
    assert model.first_stale("op", [a], 64) is None  # another list: its own answer
    assert [model.stale("op", d, 64) for d in (a, b)] == [False, True]
