"""Priorities with aging: low-priority work waits a bounded time under high-priority arrivals."""

from __future__ import annotations

import threading

import hal
from hal.sched import Future, PriorityPolicy, Scheduler

from .conftest import FAST_HEALTH


class _Clock:
    """A virtual scheduler clock that only the tasks advance: the same decisions on any host load."""

    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t

    def advance(self, seconds: float) -> None:
        self.t += seconds


def _run(device: hal.Device, policy: PriorityPolicy) -> tuple[int, int, float, float]:
    """Return (high tasks started before the low one, high tasks in all, low's class, low's effective).

    Every task takes 1 ms of the scheduler's (virtual) clock; each high task submits the next
    one while it runs, so the queue of high work never runs dry (60 queued, 180 in all).
    """
    clock = _Clock()
    gate = threading.Event()
    highs: list[Future] = []
    total = 180
    with Scheduler([device], policy=policy, health=FAST_HEALTH, clock=clock) as sched:

        def high(ctx: object) -> None:
            clock.advance(0.001)
            if len(highs) < total:  # a stream of arrivals (only this device's worker appends now)
                highs.append(sched.submit(high, priority=10, name="high"))

        def low_work(ctx: object) -> None:
            clock.advance(0.001)

        sched.submit(lambda ctx: gate.wait(), name="blocker", priority=100)
        highs += [sched.submit(high, priority=10, name="high") for _ in range(60)]
        low = sched.submit(low_work, priority=0, name="low")
        gate.set()
        sched.wait()
        low_rec = low.record
        assert low_rec.start is not None and len(highs) == total
        before = sum(
            1 for h in highs if h.record.start is not None and h.record.start < low_rec.start
        )
    return before, len(highs), low_rec.priority, low_rec.effective_priority


def test_aging_bounds_the_wait_of_low_priority_work(cpu_pair: list[hal.Device]) -> None:
    # +10 priority after 25 ms of waiting: the low task overtakes the class-10 stream
    before, total, prio, eff = _run(cpu_pair[0], PriorityPolicy(aging=400.0, aging_cap=100.0))
    assert before < total - 30, f"low-priority task waited behind {before} of {total} high tasks"
    assert prio == 0  # its class is reported unchanged ...
    assert eff > 10  # ... and the effective priority it was dispatched with separately


def test_without_aging_low_priority_work_waits_for_the_whole_stream(
    cpu_pair: list[hal.Device],
) -> None:
    before, total, _, eff = _run(cpu_pair[0], PriorityPolicy(aging=0.0))
    assert before == total
    assert eff == 0


def test_aging_is_capped(cpu_pair: list[hal.Device]) -> None:
    # a cap below the gap between the classes: aging never lifts the low task past them
    before, total, _, eff = _run(cpu_pair[0], PriorityPolicy(aging=400.0, aging_cap=5.0))
    assert before == total
    assert 0 < eff <= 5.0


def test_priority_orders_waiting_work(cpu_pair: list[hal.Device]) -> None:
    gate = threading.Event()
    order: list[int] = []
    with Scheduler([cpu_pair[0]], policy=PriorityPolicy(aging=0.0), health=FAST_HEALTH) as sched:
        sched.submit(lambda ctx: gate.wait(), priority=100)
        for p in (1, 5, 3, 9, 0):
            sched.submit(lambda ctx, p=p: order.append(p), priority=p)
        gate.set()
    assert order == [9, 5, 3, 1, 0]
