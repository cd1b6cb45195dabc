"""Cooperative preemption: other work runs only at a task's yield points, never between them."""

from __future__ import annotations

import threading
import time
from typing import Any

import hal
from hal.sched import PriorityPolicy, Scheduler, TaskContext

from .conftest import FAST_HEALTH


def test_high_priority_work_runs_only_at_yield_points(cpu_pair: list[hal.Device]) -> None:
    phases: list[tuple[float, float]] = []
    urgent: list[tuple[float, float]] = []
    started = threading.Event()

    def long_task(ctx: TaskContext) -> Any:
        for _ in range(8):  # eight micro-batches
            t0 = time.perf_counter()
            started.set()
            time.sleep(0.03)
            phases.append((t0, time.perf_counter()))
            yield  # a boundary: the scheduler may run waiting higher-priority work here
        return "trained"

    def urgent_task(ctx: TaskContext) -> None:
        t0 = time.perf_counter()
        time.sleep(0.002)
        urgent.append((t0, time.perf_counter()))

    with Scheduler([cpu_pair[0]], policy=PriorityPolicy(aging=0.0), health=FAST_HEALTH) as sched:
        long = sched.submit(long_task, priority=0)
        started.wait()
        for _ in range(3):
            sched.submit(urgent_task, priority=10)
        low = sched.submit(urgent_task, priority=0)  # same class as the running task: no preemption
        assert long.result() == "trained"
        sched.wait()
        rec = long.record
    assert len(urgent) == 4 and len(phases) == 8
    for u0, u1 in urgent:
        for p0, p1 in phases:
            assert u1 <= p0 or u0 >= p1, "work ran inside a micro-batch (between yield points)"
    # the urgent tasks ran before the long task ended: at a yield point, not after it
    assert all(u1 < phases[-1][0] for _, u1 in urgent[:3])
    assert rec.preemptions >= 1
    assert low.record.start >= rec.end  # equal priority waits for the end


def test_checkpoint_is_a_yield_point_for_plain_functions(cpu_pair: list[hal.Device]) -> None:
    events: list[str] = []
    started = threading.Event()
    release = threading.Event()

    def long_task(ctx: TaskContext) -> None:
        events.append("batch0")
        started.set()
        release.wait()
        events.append("checkpoint")
        ran = ctx.checkpoint()
        events.append(f"batch1 after {ran}")

    with Scheduler([cpu_pair[0]], policy="priority", health=FAST_HEALTH) as sched:
        f = sched.submit(long_task, priority=0)
        started.wait()
        sched.submit(lambda ctx: events.append("urgent"), priority=5)
        release.set()
        f.result()
    assert events == ["batch0", "checkpoint", "urgent", "batch1 after 1"]
