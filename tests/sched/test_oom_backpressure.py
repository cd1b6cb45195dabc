"""Out of memory is back-pressure in hal.sched, never a device failure (issue #15, item 5).

Before: an ``OutOfMemoryError`` was a ``DeviceError`` like any other, so three tasks meeting a
full device made it SUSPECT then EVICTED, although it was healthy, only full.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np
import pytest

import hal
import hal.kernels
from hal.sched import DeviceState, Scheduler, SchedulerError, TaskContext

from .conftest import FAST_HEALTH

N = 128  # a 128 x 128 float32 matmul writes 64 KiB


@pytest.fixture
def small_pair(hal_env: Callable[..., None]) -> list[hal.Device]:
    """Two CPU-emulator devices of 2 MiB each."""
    hal_env(
        HAL_BACKENDS="cpu",
        HAL_CPU_DEVICES="2",
        HAL_CPU_MEMORY="2M",
        HAL_CPU_SPEED=None,
        HAL_CPU_CONFIG=None,
    )
    return hal.devices("cpu")


def _fill(dev: hal.Device) -> hal.Buffer:
    """Take every free byte of ``dev``."""
    used = dev.memory_in_use
    assert used is not None
    return dev.alloc(dev.total_memory - used)


def _wait_for(predicate: Callable[[], bool], what: str, limit: float = 60.0) -> None:
    deadline = time.monotonic() + limit
    while not predicate():
        if time.monotonic() > deadline:
            pytest.fail(f"never reached: {what}")
        time.sleep(0.01)


def test_a_full_device_sends_work_elsewhere_and_is_never_evicted(
    small_pair: list[hal.Device],
) -> None:
    full, other = small_pair
    x = hal.asarray(np.eye(N, dtype=np.float32) * 2, device=full)
    hog = _fill(full)
    with Scheduler(small_pair, policy="round-robin", health=FAST_HEALTH, retries=0) as sched:
        futs = [sched.submit(hal.kernels.matmul, x, x) for _ in range(12)]
        for f in futs:
            np.testing.assert_array_equal(f.result().to_host(), np.eye(N, dtype=np.float32) * 4)
        time.sleep(
            5 * FAST_HEALTH.interval
        )  # probes of the full device run (and meet no room) meanwhile
        stats = sched.stats()["devices"]
        assert stats[str(full)]["out_of_memory"] > 0, (
            stats
        )  # round-robin did send tasks to the full one
        assert {f.record.device for f in futs} == {str(other)}
        assert stats[str(full)]["failures"] == 0 and stats[str(full)]["state"] == "healthy", stats
        assert sched.health.state(full) is DeviceState.HEALTHY
        assert sched.health.history(full) == [], sched.health.history(full)
        assert all(f.record.attempts == 1 for f in futs), [f.record for f in futs]
        hog.close()  # room again: the device takes work again
        more = [sched.submit(hal.kernels.matmul, x, x) for _ in range(6)]
        assert str(full) in {f.result().device.__str__() for f in more}
        assert sched.health.state(full) is DeviceState.HEALTHY


def test_the_only_device_full_makes_tasks_wait_until_memory_is_freed(
    small_pair: list[hal.Device],
) -> None:
    dev = small_pair[0]
    x = hal.asarray(np.eye(N, dtype=np.float32), device=dev)
    hog = _fill(dev)
    with Scheduler([dev], health=FAST_HEALTH) as sched:
        futs = [sched.submit(hal.kernels.matmul, x, x) for _ in range(4)]
        _wait_for(
            lambda: sched.stats()["devices"][str(dev)]["out_of_memory"] >= 4,
            "tasks meeting the full device",
        )
        assert not any(f.done() for f in futs)
        hog.close()
        for f in futs:
            np.testing.assert_array_equal(f.result().to_host(), np.eye(N, dtype=np.float32))
        assert sched.health.state(dev) is DeviceState.HEALTHY and sched.health.history(dev) == []


def test_memory_wait_bounds_the_wait_with_the_out_of_memory_error(
    small_pair: list[hal.Device],
) -> None:
    dev = small_pair[0]
    x = hal.asarray(np.eye(N, dtype=np.float32), device=dev)
    hog = _fill(dev)
    with Scheduler([dev], health=FAST_HEALTH, memory_wait=0.2) as sched:
        fut = sched.submit(hal.kernels.matmul, x, x)
        with pytest.raises(
            hal.OutOfMemoryError, match=r"found no device with room for 0.2 s"
        ) as info:
            fut.result()
        assert "cannot allocate" in str(info.value)  # the last allocation's own message
        assert sched.health.state(dev) is DeviceState.HEALTHY
    hog.close()


def test_declared_memory_places_tasks_where_it_is_free(small_pair: list[hal.Device]) -> None:
    full, other = small_pair
    hog = _fill(full)
    ran: list[str] = []

    def task(ctx: TaskContext) -> str:
        ran.append(str(ctx.device))
        with ctx.device.alloc(1 << 20):
            return str(ctx.device)

    with Scheduler(small_pair, policy="round-robin", health=FAST_HEALTH) as sched:
        futs = [sched.submit(task, memory_bytes=1 << 20) for _ in range(6)]
        assert [f.result() for f in futs] == [str(other)] * 6
        assert ran == [str(other)] * 6  # never even started on the full device
        too_big = sched.submit(task, memory_bytes=4 << 20)
        with pytest.raises(
            SchedulerError, match=r"cpu:0 holds 2097152 bytes, the task needs 4194304"
        ):
            too_big.result()
        with pytest.raises(ValueError, match=r"memory_bytes=-1"):
            sched.submit(task, memory_bytes=-1)
        assert sched.health.state(full) is DeviceState.HEALTHY
    hog.close()
