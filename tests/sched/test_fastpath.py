"""The scheduler's fast path keeps its answers: incremental estimates, O(1) pops, the overhead bench."""

from __future__ import annotations

import statistics

import pytest

import hal
from hal.cli.bench._sched import overhead
from hal.sched import Future, PerfModel, Scheduler
from hal.sched._policy import EftPolicy


def test_cached_center_follows_the_window() -> None:
    model = PerfModel(min_samples=3, window=8)
    dev = hal.devices("cpu")[0]
    samples = [1.0, 2.0, 3.0, 10.0, 11.0, 12.0, 13.0, 14.0, 15.0, 16.0]
    for i, s in enumerate(samples):
        model.observe("op", dev, 64, s)
        got, calibrated = model.estimate("op", dev, 64)
        if i + 1 < 3:
            assert not calibrated
            continue
        assert calibrated
        # the cached center is recomputed once a quarter of the window is new: never older
        stale_ok = {
            statistics.median(samples[max(0, j + 1 - 8) : j + 1])
            for j in range(max(2, i - 2), i + 1)
        }
        assert got in stale_ok
    model.observe("op", dev, 64, 100.0)
    model.observe("op", dev, 64, 100.0)
    assert model.estimate("op", dev, 64)[0] == statistics.median(model.samples("op", dev, 64))


def test_derived_estimates_move_when_another_device_calibrates() -> None:
    model = PerfModel(min_samples=2)
    a, b = hal.devices("cpu")[:2]
    first, cal = model.estimate("op", b, 4096)
    assert not cal
    for _ in range(2):
        model.observe("op", a, 4096, 0.5)
    second, cal = model.estimate("op", b, 4096)
    assert not cal and second != first  # now derived from a's history, not the byte-rate guess
    assert second == pytest.approx(0.5 * model.score(a) / model.score(b))


@pytest.mark.parametrize("priorities", [[0] * 12, [0, 0, 5, 0, 1, 1, 0, 5, 0, 0, 2, 0]])
def test_queue_head_pick_matches_the_full_scan(priorities: list[int]) -> None:
    import threading

    dev = hal.devices("cpu")[0]
    gate = threading.Event()
    with Scheduler([dev], policy="eft") as sched:
        pol = sched.policy
        assert isinstance(pol, EftPolicy)
        blocker = sched.submit(lambda ctx: gate.wait(30))
        while blocker.task.state != "running":
            gate.wait(0.001)
        futures = [sched.submit(lambda ctx, i=i: i, priority=p) for i, p in enumerate(priorities)]
        with sched._cond:
            queue = list(pol._queues[dev])
            now = sched.now()
            assert pol._pick(dev, now) is pol._best(queue, now)
            assert pol._simple[dev] is (len(set(priorities)) == 1)
        gate.set()
        assert [f.result() for f in futures] == list(range(len(priorities)))


def test_overhead_bench_reports_both_sides() -> None:
    res = overhead(tasks=40, latency_tasks=10, repeat=1)
    assert res["latency_us"]["sched"] > 0 and res["latency_us"]["executor"] > 0
    assert res["throughput_per_s"]["sched"] > 0 and res["throughput_per_s"]["executor"] > 0
    assert res["latency_ratio"] > 0 and res["target"] == 3.0 and len(res["loadavg"]) == 3


@pytest.mark.parametrize(
    ("policy", "per_device"),
    [("eft", True), ("heft", True), ("round-robin", True), ("priority", False), ("eager", False)],
)
def test_policies_say_where_a_push_went(policy: str, per_device: bool) -> None:
    """Per-device queues name the device (only its workers are woken); shared queues name none."""
    devs = hal.devices("cpu")[:2]
    with Scheduler(devs, policy=policy) as sched:
        seen = set()
        for _ in range(6):
            sched.submit(lambda ctx: ctx.device).result()
            seen.add(sched.policy.placed)
        if per_device:
            assert seen <= set(devs) and None not in seen
        else:
            assert seen == {None}


def test_an_idle_device_still_steals_after_targeted_wakeups() -> None:
    """A task queued behind a long one on its device is taken by the idle device."""
    import threading
    import time

    devs = hal.devices("cpu")[:2]
    release = threading.Event()
    with Scheduler(devs) as sched:
        blocker = sched.submit(lambda ctx: release.wait(30), device=devs[0])
        while blocker.task.state != "running":
            release.wait(0.001)
        # queued on devs[0] by hand (as a stale estimate would), devs[1] idle and waiting
        policy = sched.policy
        assert isinstance(policy, EftPolicy)
        futures = []
        with sched._cond:  # the workers wait for the lock: move what was placed on devs[1]
            for _ in range(3):
                futures.append(sched.submit(lambda ctx: ctx.device))
            moved = policy._queues[devs[1]]
            policy._queues[devs[1]] = []
            policy._queued[devs[1]] = 0.0
            for t in moved:
                policy._enqueue(t, devs[0], t.estimate)
            assert len(policy._queues[devs[0]]) == 3
        deadline = time.monotonic() + 30
        while not any(f.done() for f in futures):  # devs[0] is held: only a steal finishes one
            assert time.monotonic() < deadline, "the idle device never took the queued work"
            release.wait(0.001)
        release.set()
        ran_on = [f.result(timeout=30) for f in futures]
        blocker.result(timeout=30)
    assert devs[1] in ran_on


def test_submit_from_many_threads_runs_every_task_once() -> None:
    import threading

    devs = hal.devices("cpu")[:2]
    counts: dict[int, int] = {}
    lock = threading.Lock()

    def task(ctx: object, i: int) -> int:
        with lock:
            counts[i] = counts.get(i, 0) + 1
        return i

    with Scheduler(devs) as sched:
        futures: list[object] = []

        def submitter(base: int) -> None:
            for i in range(base, base + 200):
                futures.append(sched.submit(task, i))

        threads = [threading.Thread(target=submitter, args=(k * 1000,)) for k in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        sched.wait(timeout=60)
    assert len(counts) == 800 and set(counts.values()) == {1}


def test_threads_that_find_the_lock_taken_wait_for_it() -> None:
    """Submitters and workers that find the scheduler's lock held give way, then queue on it:
    nothing is admitted, begun or ended while another thread holds it, and all of it runs once
    the lock is free."""
    import threading
    import time

    devs = hal.devices("cpu")[:2]
    ran: list[int] = []

    def task(ctx: object, i: int) -> int:
        ran.append(i)
        return i * 2

    with Scheduler(devs) as sched:
        first = [sched.submit(task, i) for i in range(20)]
        futures: list[Future] = []
        with sched._lock:  # what a thread switched away from inside its critical section holds
            threads = [
                threading.Thread(
                    target=lambda b=b: futures.extend(
                        sched.submit(task, i) for i in range(b, b + 50)
                    )
                )
                for b in (100, 200)
            ]
            for t in threads:
                t.start()
            time.sleep(0.2)
            assert len(futures) == 0  # both submitters wait for the lock
            done_while_held = sum(f.done() for f in first)
            time.sleep(0.1)
            assert sum(f.done() for f in first) == done_while_held  # no task ends while it is held
        for t in threads:
            t.join(timeout=30)
        assert [f.result(timeout=30) for f in first] == [2 * i for i in range(20)]
        want = [2 * i for i in [*range(100, 150), *range(200, 250)]]
        assert sorted(f.result(timeout=30) for f in futures) == want
    assert sorted(ran) == [*range(20), *range(100, 150), *range(200, 250)]
