"""Gang tasks: N devices at once, all-or-nothing, no deadlock between crossing gangs, a communicator."""

from __future__ import annotations

import itertools
import threading

import numpy as np
import pytest

import hal
from hal.sched import Pool, Scheduler, SchedulerError, TaskContext

from .conftest import FAST_HEALTH


def _all_reduce(ctx: TaskContext) -> list[float]:
    xs = [
        hal.asarray(np.full(8, float(i + 1), np.float32), device=d, stream=s)
        for i, (d, s) in enumerate(zip(ctx.devices, ctx.streams, strict=True))
    ]
    ctx.comm.all_reduce(xs, op="sum", streams=ctx.streams).wait()
    return [float(x.to_host(stream=s)[0]) for x, s in zip(xs, ctx.streams, strict=True)]


def test_a_gang_gets_its_devices_and_a_communicator(cpu_pair: list[hal.Device]) -> None:
    with Scheduler(cpu_pair, health=FAST_HEALTH) as sched:
        fut = sched.submit(_all_reduce, gang=2, name="tp-step")
        assert fut.result(timeout=60) == [3.0, 3.0]
        rec = fut.record
        assert sorted(rec.devices) == ["cpu:0", "cpu:1"] and rec.state == "done"


def test_a_gang_holds_all_its_devices_while_it_runs(cpu_pair: list[hal.Device]) -> None:
    started, gate = threading.Event(), threading.Event()

    def step(ctx: TaskContext) -> list[str]:
        started.set()
        gate.wait(30)
        return [str(d) for d in ctx.devices]

    with Scheduler(cpu_pair, health=FAST_HEALTH) as sched:
        gang = sched.submit(step, gang=2)
        assert started.wait(30)
        singles = [sched.submit(lambda ctx: str(ctx.device)) for _ in range(4)]
        gate.set()
        assert sorted(gang.result(timeout=60)) == ["cpu:0", "cpu:1"]
        sched.wait(60)
        end = gang.record.end
        assert end is not None
        assert all((s.record.start or 0.0) >= end for s in singles)  # nothing ran beside the gang


def test_crossing_gangs_do_not_deadlock(cpu_pool: list[hal.Device]) -> None:
    """Gangs over {0,1}, {1,2}, {2,0} and {0,1,2}, mixed with single tasks: all finish, no device is shared at once."""
    pools = [
        Pool("a", devices=("cpu:0", "cpu:1")),
        Pool("b", devices=("cpu:1", "cpu:2")),
        Pool("c", devices=("cpu:2", "cpu:0")),
    ]
    with Scheduler(cpu_pool[:3], pools=pools, health=FAST_HEALTH) as sched:
        futs = []
        for i in range(12):
            for p in ("a", "b", "c"):
                futs.append(
                    sched.submit(lambda ctx: len(ctx.devices), gang=2, pool=p, name=f"{p}{i}")
                )
            if i % 3 == 0:
                futs.append(sched.submit(lambda ctx: len(ctx.devices), gang=3, name=f"all{i}"))
            futs.append(sched.submit(lambda ctx: len(ctx.devices), name=f"single{i}"))
        results = [f.result(timeout=120) for f in futs]
        assert sorted(set(results)) == [1, 2, 3]
        intervals: dict[str, list[tuple[float, float]]] = {}
        for f in futs:
            r = f.record
            assert r.start is not None and r.end is not None
            for d in r.devices or (r.device,):
                assert d is not None
                intervals.setdefault(d, []).append((r.start, r.end))
        for d, spans in intervals.items():
            spans.sort()
            for (_, e1), (s2, _) in itertools.pairwise(spans):
                assert s2 >= e1, f"two tasks overlapped on {d}"


def test_gang_sizes_are_checked_at_submit(cpu_pair: list[hal.Device]) -> None:
    import hal.kernels

    with Scheduler(cpu_pair, health=FAST_HEALTH) as sched:
        with pytest.raises(SchedulerError, match="gang=3 devices; only 2 may take it"):
            sched.submit(lambda ctx: 1, gang=3, name="big")
        with pytest.raises(SchedulerError, match="gang=2 devices; only 1 may take it"):
            sched.submit(lambda ctx: 1, gang=2, device_class="cpu", device="cpu:0")
        with pytest.raises(ValueError, match="gang=0"):
            sched.submit(lambda ctx: 1, gang=0)
        with pytest.raises(ValueError, match=r"not the hal\.kernels op"):
            sched.submit(hal.kernels.relu, 1, gang=2)
        assert sched.records() == []


def test_a_gang_that_fails_on_a_device_names_it(cpu_pair: list[hal.Device]) -> None:
    def bad(ctx: TaskContext) -> None:
        raise hal.DeviceError("lost", device=str(ctx.devices[1]))

    with Scheduler(cpu_pair, health=FAST_HEALTH) as sched:
        fut = sched.submit(bad, gang=2, name="g")
        with pytest.raises(hal.DeviceError, match="gang task 'g' failed on device cpu:"):
            fut.result(timeout=60)
