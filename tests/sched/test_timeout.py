"""Per-task timeouts: a hung task fails with TaskTimeoutError, its device is never left blocked."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import numpy as np
import pytest

import hal
import hal.kernels
from hal.sched import HealthConfig, Scheduler, TaskTimeoutError

from .conftest import FAST_HEALTH

NO_PROBES = HealthConfig(interval=0.0)


@pytest.fixture
def gate() -> Iterator[threading.Event]:
    ev = threading.Event()
    yield ev
    ev.set()  # release abandoned work at the end


def test_a_hung_function_times_out_naming_task_and_device(
    cpu_pair: list[hal.Device], gate: threading.Event
) -> None:
    dev = cpu_pair[0]
    with Scheduler([dev], health=FAST_HEALTH) as sched:
        hung = sched.submit(lambda ctx: gate.wait(), name="hung", timeout=0.2)
        after = sched.submit(
            lambda ctx: 42, name="after"
        )  # queued behind the hung task, same device
        with pytest.raises(TaskTimeoutError) as info:
            hung.result(timeout=30)
        assert after.result(timeout=30) == 42  # the device was not left blocked
        assert not gate.is_set()  # ... although the hung function still hangs
        exc = info.value
        assert isinstance(exc, hal.HalError)
        assert "'hung'" in str(exc) and str(dev) in str(exc) and "0.2 s" in str(exc)
        assert exc.device == str(dev) and exc.task == "hung" and exc.timeout == 0.2
        rec = hung.record
        assert rec.state == "timeout" and rec.error is not None and "TaskTimeoutError" in rec.error
        assert after.record.device == str(dev)
        m = sched.metrics()
        assert m["timeouts"] == 1 and m["devices"][str(dev)]["timeouts"] == 1
        assert sched.stats()["tasks"] == {"timeout": 1, "done": 1}


def test_a_stalled_stream_is_abandoned_and_a_fresh_one_takes_its_place(
    cpu_pair: list[hal.Device],
) -> None:
    dev = cpu_pair[0]
    seen: list[hal.Stream] = []
    signals: list[hal.HostSignal] = []

    def stall(ctx: object) -> None:
        from hal.sched import TaskContext

        assert isinstance(ctx, TaskContext)
        seen.append(ctx.stream)
        signals.append(
            ctx.stream.wait_host()
        )  # the stream's later work waits for a host signal never set
        hal.asarray(np.ones(16, np.float32), device=ctx.device, stream=ctx.stream)

    def use(ctx: object) -> float:
        from hal.sched import TaskContext

        assert isinstance(ctx, TaskContext)
        seen.append(ctx.stream)
        x = hal.asarray(np.full(64, 2.0, np.float32), device=ctx.device, stream=ctx.stream)
        y = hal.kernels.relu(x, stream=ctx.stream)
        return float(y.to_host(stream=ctx.stream).sum())

    try:
        with Scheduler([dev], health=FAST_HEALTH) as sched:
            stalled = sched.submit(stall, name="stall", timeout=0.3)
            with pytest.raises(TaskTimeoutError, match="'stall'"):
                stalled.result(timeout=30)
            assert sched.submit(use, name="use").result(timeout=30) == 128.0
            assert seen[0] is not seen[1]  # the stalled stream was abandoned
            assert (
                sched.health.state(dev).value == "healthy"
            )  # a hung stream is not a broken device
    finally:
        for s in signals:
            s.set()


def test_the_device_is_probed_again_after_a_timeout(
    cpu_pair: list[hal.Device], gate: threading.Event
) -> None:
    dev = cpu_pair[0]
    with Scheduler([dev], health=NO_PROBES) as sched:  # no periodic probes: only the timeout probes
        ops = dev.properties()["ops"]
        with pytest.raises(TaskTimeoutError):
            sched.submit(lambda ctx: gate.wait(), name="hung", timeout=0.1).result(timeout=30)
        deadline = time.monotonic() + 20
        while dev.properties()["ops"] == ops and time.monotonic() < deadline:
            time.sleep(0.01)
        assert dev.properties()["ops"] > ops  # the probe's kernel ran on the device


def test_default_timeout_and_tasks_within_it(
    cpu_pair: list[hal.Device], gate: threading.Event
) -> None:
    with Scheduler(cpu_pair[:1], timeout=0.2, health=FAST_HEALTH) as sched:
        assert sched.submit(lambda ctx: 7, name="quick").result(timeout=30) == 7
        assert sched.submit(lambda ctx: 8, name="long-limit", timeout=60).result(timeout=30) == 8
        with pytest.raises(TaskTimeoutError, match=r"after 0\.2 s"):
            sched.submit(lambda ctx: gate.wait(), name="hung").result(timeout=30)


@pytest.mark.parametrize("bad", [0, -1, "1", True, float("nan")])
def test_bad_timeout_is_a_value_error_naming_it(cpu_pair: list[hal.Device], bad: object) -> None:
    with Scheduler(cpu_pair[:1], health=FAST_HEALTH) as sched:
        with pytest.raises(ValueError, match="timeout="):
            sched.submit(lambda ctx: 1, timeout=bad)  # type: ignore[arg-type]
        assert sched.records() == []  # no side effect
    with pytest.raises(ValueError, match="timeout="):
        Scheduler(cpu_pair[:1], timeout=bad)  # type: ignore[arg-type]
