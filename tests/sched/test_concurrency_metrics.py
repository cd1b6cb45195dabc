"""Several tasks per device on their own streams; metrics() and the Prometheus text exposition."""

from __future__ import annotations

import re
import threading

import pytest

import hal
from hal.backends.cpu import inject_fault
from hal.sched import Pool, Scheduler, TaskContext, TaskTimeoutError

from .conftest import FAST_HEALTH


def test_concurrency_runs_tasks_side_by_side_on_their_own_streams(
    cpu_pair: list[hal.Device],
) -> None:
    dev = cpu_pair[0]
    assert dev.capabilities.concurrent_streams
    barrier = threading.Barrier(
        3, timeout=30
    )  # passes only if three tasks run at once on one device
    streams: list[hal.Stream] = []

    def meet(ctx: TaskContext) -> str:
        streams.append(ctx.stream)
        barrier.wait()
        return str(ctx.device)

    with Scheduler([dev], concurrency=3, health=FAST_HEALTH) as sched:
        assert sched.slots(dev) == 3
        futs = [sched.submit(meet) for _ in range(3)]
        assert [f.result(timeout=60) for f in futs] == [str(dev)] * 3
        assert len({id(s) for s in streams}) == 3  # one stream per task
        assert sched.stats()["devices"][str(dev)]["busy_s"] > 0


def test_one_task_at_a_time_without_concurrency(cpu_pair: list[hal.Device]) -> None:
    barrier = threading.Barrier(2, timeout=0.5)

    def meet(ctx: TaskContext) -> None:
        barrier.wait()

    with Scheduler(cpu_pair[:1], health=FAST_HEALTH) as sched:
        futs = [sched.submit(meet) for _ in range(2)]
        with pytest.raises(threading.BrokenBarrierError):
            futs[0].result(timeout=60)


def test_concurrency_is_checked(cpu_pair: list[hal.Device]) -> None:
    with pytest.raises(ValueError, match="concurrency=0"):
        Scheduler(cpu_pair, concurrency=0)


PROM_LINE = re.compile(
    r'^hal_sched_[a-z_]+(\{([a-z_]+="[^"]*",?)*\})? -?[0-9.e+-]+$|^# (HELP|TYPE) hal_sched_[a-z_]+ .+$'
)


def test_metrics_per_pool_and_device(cpu_pool: list[hal.Device]) -> None:
    gate = threading.Event()
    running = threading.Event()

    def block(ctx: object) -> bool:
        running.set()
        return gate.wait(30)

    pools = [
        Pool("infer", devices=("cpu:0",), priority=5),
        Pool("batch", devices=("cpu:1", "cpu:2")),
    ]
    with Scheduler(cpu_pool[:3], pools=pools, health=FAST_HEALTH) as sched:
        blocker = sched.submit(block, pool="infer")
        assert running.wait(60)  # the blocker holds cpu:0 before the others queue behind it
        queued = [sched.submit(lambda ctx: 1, pool="infer") for _ in range(3)]
        done = [sched.submit(lambda ctx: 2, pool="batch") for _ in range(6)]
        for f in done:
            f.result(timeout=60)
        m = sched.metrics()
        assert m["pools"]["infer"]["queue_length"] == 3 and m["pools"]["infer"]["running"] == 1
        assert m["queue_length"] == 3 and m["running"] == 1
        assert (
            m["pools"]["batch"]["tasks"] == {"done": 6}
            and m["pools"]["batch"]["wait_s"]["count"] == 6
        )
        assert m["pools"]["batch"]["run_s"]["p99"] >= m["pools"]["batch"]["run_s"]["p50"] >= 0
        assert m["devices"]["cpu:0"]["running"] == 1 and m["devices"]["cpu:0"]["utilization"] > 0
        with pytest.raises(TaskTimeoutError):
            sched.submit(lambda ctx: gate.wait(30), pool="batch", timeout=0.05).result(timeout=60)
        gate.set()
        blocker.result(timeout=60)
        for f in queued:
            f.result(timeout=60)
        m = sched.metrics()
        assert (
            m["timeouts"] == 1 and m["pools"]["batch"]["timeouts"] == 1 and m["queue_length"] == 0
        )
        text = sched.prometheus_text()
    for line in text.splitlines():
        assert PROM_LINE.match(line), line
    assert 'hal_sched_tasks{pool="infer",state="done"} 4.0' in text
    assert 'hal_sched_queue_length{pool="infer"} 0.0' in text
    assert "# TYPE hal_sched_wait_seconds summary" in text
    assert (
        'hal_sched_device_timeouts_total{device="cpu:1"}' in text
        or 'hal_sched_device_timeouts_total{device="cpu:2"}' in text
    )


def test_evictions_are_counted(cpu_pair: list[hal.Device]) -> None:
    bad = cpu_pair[1]
    with Scheduler(cpu_pair, health=FAST_HEALTH) as sched:
        inject_fault(bad.index, fail=True)
        deadline = threading.Event()
        for _ in range(500):  # probes every 20 ms: three failures evict
            if sched.metrics()["evictions"]:
                break
            deadline.wait(0.02)
        m = sched.metrics()
        assert m["evictions"] == 1 and m["devices"][str(bad)]["evictions"] == 1
        assert m["devices"][str(bad)]["state"] == "evicted"
        assert f'hal_sched_device_evictions_total{{device="{bad}"}} 1.0' in sched.prometheus_text()
