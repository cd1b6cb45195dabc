"""Health: hysteresis, eviction mid-run with migration of idempotent tasks, loud failures."""

from __future__ import annotations

import time

import numpy as np
import pytest

import hal
import hal.kernels
from hal.backends.cpu import clear_faults, inject_fault
from hal.sched import DeviceFailedError, DeviceState, HealthConfig, Scheduler
from hal.sched._health import Health

from .conftest import FAST_HEALTH


def _wait_for(predicate: object, what: str, limit: float = 60.0) -> None:
    """Poll ``predicate`` (a progress wait, not a timing assertion; the limit only avoids a hang)."""
    deadline = time.monotonic() + limit
    while not predicate():  # type: ignore[operator]
        if time.monotonic() > deadline:
            pytest.fail(f"never reached: {what}")
        time.sleep(0.01)


def test_hysteresis_one_failure_is_suspect_not_evicted(cpu_pair: list[hal.Device]) -> None:
    d = cpu_pair[0]
    changes: list[tuple[str, str]] = []
    h = Health(
        [d],
        HealthConfig(interval=0, evict_after=3, recover_after=2, readmit_after=2),
        lambda dev, old, new: changes.append((old.value, new.value)),
    )
    h.report(d, False, "boom")
    assert h.state(d) is DeviceState.SUSPECT
    h.report(d, True)
    h.report(d, False, "boom")  # not consecutive: the count restarted
    h.report(d, False, "boom")
    assert h.state(d) is DeviceState.SUSPECT
    h.report(d, False, "boom")
    assert h.state(d) is DeviceState.EVICTED
    h.report(d, True)
    h.report(d, True)  # task-like successes do not re-admit: only probes do
    assert h.state(d) is DeviceState.EVICTED
    h.report(d, True, probe=True)
    assert h.state(d) is DeviceState.HEALTHY
    assert changes == [("healthy", "suspect"), ("suspect", "evicted"), ("evicted", "healthy")]
    assert h.reason(d) == "boom"
    h.close()


def test_eviction_mid_run_migrates_idempotent_tasks(cpu_pair: list[hal.Device]) -> None:
    good, bad = cpu_pair
    x = hal.asarray(np.eye(64, dtype=np.float32), device=good)
    with Scheduler(cpu_pair, policy="round-robin", health=FAST_HEALTH, retries=2) as sched:
        first = [sched.submit(hal.kernels.matmul, x, x) for _ in range(10)]
        for f in first:
            f.result()
        assert {f.record.device for f in first} == {str(good), str(bad)}
        inject_fault(bad.index, fail=True)  # the device dies mid-run
        rest = [sched.submit(hal.kernels.matmul, x, x) for _ in range(30)]
        for f in rest:
            np.testing.assert_array_equal(f.result().to_host(), np.eye(64, dtype=np.float32))
        _wait_for(
            lambda: sched.health.state(bad) is DeviceState.EVICTED, "eviction of the failed device"
        )
        retried = [f.record for f in rest if f.record.attempts > 1]
        assert all(r.device == str(good) for r in retried)
        late = [sched.submit(hal.kernels.matmul, x, x) for _ in range(6)]
        assert all(f.result() is not None and f.record.device == str(good) for f in late)
        stats = sched.stats()
    assert stats["devices"][str(bad)]["state"] == "evicted"
    assert stats["tasks"] == {"done": 46}


def test_non_idempotent_task_fails_loudly_naming_the_device(cpu_pair: list[hal.Device]) -> None:
    _, bad = cpu_pair
    x = hal.asarray(np.ones(16, dtype=np.float32), device=bad)

    def update(ctx: hal.sched.TaskContext, a: hal.Array) -> None:
        hal.kernels.accumulate(a, a, op="sum", stream=ctx.stream)  # in place: not safe to re-run

    no_probe = HealthConfig(interval=0, evict_after=100)
    with Scheduler([bad], policy="eft", health=no_probe) as sched:
        inject_fault(bad.index, fail=True)
        f = sched.submit(update, x)
        exc = f.exception()
        g = sched.submit(hal.kernels.relu, x, idempotent=False)
        exc2 = g.exception()
    assert isinstance(exc, DeviceFailedError) and exc.device == str(bad)
    assert str(bad) in str(exc) and "not idempotent" in str(exc)
    assert isinstance(exc2, DeviceFailedError) and exc2.device == str(bad)


def test_evicted_device_is_readmitted_after_probes_pass(cpu_pair: list[hal.Device]) -> None:
    _, bad = cpu_pair
    with Scheduler(cpu_pair, policy="eft", health=FAST_HEALTH) as sched:
        inject_fault(bad.index, fail=True)
        _wait_for(lambda: sched.health.state(bad) is DeviceState.EVICTED, "eviction by probes")
        clear_faults(bad.index)
        _wait_for(lambda: sched.health.state(bad) is DeviceState.HEALTHY, "re-admission")
        states = [s for _, s, _ in sched.health.history(bad)]
    assert states == ["suspect", "evicted", "healthy"]


def test_stalled_device_trips_the_probe_timeout(cpu_pair: list[hal.Device]) -> None:
    _, slow = cpu_pair
    cfg = HealthConfig(interval=0.01, timeout=0.05, evict_after=2)
    with Scheduler([slow], policy="eft", health=cfg) as sched:
        inject_fault(slow.index, delay_ms=200)
        _wait_for(
            lambda: sched.health.state(slow) is DeviceState.EVICTED, "eviction by probe timeouts"
        )
        assert "timed out" in sched.health.reason(slow)
        clear_faults(slow.index)


def test_task_fails_when_no_device_is_left(cpu_pair: list[hal.Device]) -> None:
    _, bad = cpu_pair
    x = hal.asarray(np.ones(8, dtype=np.float32), device=bad)
    with Scheduler([bad], health=HealthConfig(interval=0, evict_after=100), retries=3) as sched:
        inject_fault(bad.index, fail=True)
        exc = sched.submit(hal.kernels.relu, x).exception()
    assert isinstance(exc, DeviceFailedError) and exc.device == str(bad)
    assert "no other device" in str(exc)
