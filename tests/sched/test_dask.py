"""hal.sched on a Dask cluster: a LocalCluster of 2 worker processes, placement, a killed worker."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

import hal
from hal.sched import DaskExecutor, SchedulerError, WorkerContext, WorkerLostError

distributed = pytest.importorskip("distributed")


@pytest.fixture(scope="module")
def client() -> Iterator[Any]:
    cluster = distributed.LocalCluster(
        n_workers=2,
        threads_per_worker=2,
        processes=True,
        dashboard_address=None,
        worker_dashboard_address=None,
    )
    c = distributed.Client(cluster)
    try:
        yield c
    finally:
        c.close()
        cluster.close()


def _tasks() -> tuple[Any, Any, Any]:
    """The task functions, as local functions so that Dask ships them by value (workers cannot import the tests)."""

    def square_sum(ctx: WorkerContext, n: int) -> tuple[str, float]:
        x = hal.asarray(np.arange(n, dtype=np.float32), device=ctx.device, stream=ctx.stream)
        host = x.to_host(stream=ctx.stream)
        return f"{os.getpid()}:{ctx.device}", float((host * host).sum())

    def add(ctx: WorkerContext, a: tuple[str, float], b: tuple[str, float]) -> float:
        return a[1] + b[1]

    def hang_on(ctx: WorkerContext, pid: int) -> int:
        """Hang (60 s) in process ``pid``, return at once elsewhere."""
        if os.getpid() == pid:
            time.sleep(60)
        return os.getpid()

    return square_sum, add, hang_on


def test_tasks_run_on_the_workers_devices(client: Any) -> None:
    square_sum, add, _ = _tasks()
    with DaskExecutor(client, device_class="cpu") as ex:
        assert len({w for w, _ in ex.slots}) == 2 and all(d.startswith("cpu:") for _, d in ex.slots)
        parts = [ex.submit(square_sum, 4, idempotent=True, name=f"sq{i}") for i in range(8)]
        total = ex.submit(add, parts[0], parts[1], name="add")  # data dependencies
        assert total.result(timeout=60) == 28.0
        places = {p.result(timeout=60)[0] for p in parts}
        assert len({p.split(":")[0] for p in places}) == 2  # both worker processes took work
        assert all(p.worker in {w for w, _ in ex.slots} and p.attempts == 1 for p in parts)
    with pytest.raises(SchedulerError, match="no devices of class 'tpu' on the Dask workers"):
        DaskExecutor(client, device_class="tpu")


def test_a_killed_worker(client: Any) -> None:
    _, _, hang_on = _tasks()
    pids = client.run(os.getpid)
    victim = sorted(pids)[
        0
    ]  # equal estimates: the first two tasks go to the first worker's two devices
    with DaskExecutor(client, retries=2, poll=0.05, device_class="cpu") as ex:
        once = ex.submit(hang_on, pids[victim], idempotent=False, name="once")
        again = ex.submit(hang_on, pids[victim], idempotent=True, name="again")
        assert once.worker == victim and again.worker == victim and once.device != again.device
        time.sleep(0.5)  # let both start there
        os.kill(pids[victim], signal.SIGKILL)
        with pytest.raises(
            WorkerLostError,
            match=f"task 'once' was running on Dask worker {victim} .*not idempotent",
        ) as info:
            once.result(timeout=120)
        assert info.value.worker == victim and info.value.task == "once"
        # the idempotent task ran again on the other worker
        assert again.result(timeout=120) != pids[victim]
        assert again.attempts == 2 and again.worker != victim
