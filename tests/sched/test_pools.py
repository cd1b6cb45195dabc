"""Pools (devices, priorities), per-job quotas, the short/long queue split, preemption grace, the TOML file."""

from __future__ import annotations

import threading
from collections.abc import Generator
from pathlib import Path

import pytest

import hal
from hal.sched import (
    ConfigError,
    PerfModel,
    Pool,
    PriorityPolicy,
    Scheduler,
    SchedulerError,
    TaskContext,
    load_config,
)

from .conftest import FAST_HEALTH


def test_a_pool_uses_only_its_devices(cpu_pool: list[hal.Device]) -> None:
    pools = [Pool("train", devices=("cpu:2", "cpu:3")), Pool("infer", devices=("cpu:0",))]
    with Scheduler(cpu_pool, pools=pools, health=FAST_HEALTH) as sched:
        train = [sched.submit(lambda ctx: str(ctx.device), pool="train") for _ in range(12)]
        infer = [sched.submit(lambda ctx: str(ctx.device), pool="infer") for _ in range(6)]
        assert {f.result(timeout=60) for f in train} <= {"cpu:2", "cpu:3"}
        assert {f.result(timeout=60) for f in infer} == {"cpu:0"}
        assert set(sched.metrics()["pools"]) == {"train", "infer", "default"}
        with pytest.raises(ValueError, match="pool='nope' is not one of this scheduler's pools"):
            sched.submit(lambda ctx: 1, pool="nope")


def test_a_higher_pool_goes_first_on_a_shared_device(cpu_pair: list[hal.Device]) -> None:
    gate = threading.Event()
    pools = [Pool("batch", priority=0), Pool("infer", priority=10)]  # both share cpu:0
    with Scheduler(
        cpu_pair[:1], policy=PriorityPolicy(aging=0.0), pools=pools, health=FAST_HEALTH
    ) as sched:
        sched.submit(lambda ctx: gate.wait(), priority=100)
        batch = [sched.submit(lambda ctx: None, pool="batch", priority=5) for _ in range(5)]
        infer = [sched.submit(lambda ctx: None, pool="infer") for _ in range(5)]
        gate.set()
        sched.wait(60)
        last_infer = max(f.record.start or 0.0 for f in infer)
        assert all((f.record.start or 0.0) > last_infer for f in batch)
        assert infer[0].record.pool == "infer" and infer[0].record.priority == 10


def test_max_cards_bounds_the_devices_a_job_holds(cpu_pool: list[hal.Device]) -> None:
    lock = threading.Lock()
    running = {"j1": 0, "j2": 0}
    peak = {"j1": 0, "j2": 0}

    def work(ctx: TaskContext, job: str) -> None:
        with lock:
            running[job] += 1
            peak[job] = max(peak[job], running[job])
        ev = threading.Event()
        ev.wait(0.01)
        with lock:
            running[job] -= 1

    pools = [Pool("train", max_cards=2)]
    with Scheduler(cpu_pool, pools=pools, health=FAST_HEALTH) as sched:
        futs = [
            sched.submit(work, job, pool="train", job=job)
            for _ in range(10)
            for job in ("j1", "j2")
        ]
        for f in futs:
            f.result(timeout=60)
        assert 1 <= peak["j1"] <= 2 and 1 <= peak["j2"] <= 2
        with pytest.raises(
            SchedulerError, match="gang=3 devices; pool 'train' allows a job max_cards=2"
        ):
            sched.submit(lambda ctx: 1, gang=3, pool="train", job="j1")


def test_max_memory_bounds_a_jobs_declared_memory(cpu_pair: list[hal.Device]) -> None:
    lock = threading.Lock()
    state = {"now": 0, "peak": 0}

    def work(ctx: TaskContext) -> None:
        with lock:
            state["now"] += 1
            state["peak"] = max(state["peak"], state["now"])
        threading.Event().wait(0.01)
        with lock:
            state["now"] -= 1

    with Scheduler(cpu_pair, pools=[Pool("p", max_memory=1 << 20)], health=FAST_HEALTH) as sched:
        for f in [sched.submit(work, pool="p", job="j", memory_bytes=600 << 10) for _ in range(8)]:
            f.result(timeout=60)
        assert state["peak"] == 1  # two would declare 1.2 MiB > 1 MiB
        with pytest.raises(SchedulerError, match="max_memory=1048576"):
            sched.submit(work, pool="p", job="j", memory_bytes=2 << 20)


def test_short_tasks_go_first(cpu_pair: list[hal.Device]) -> None:
    dev = cpu_pair[0]
    model = PerfModel()

    def work(ctx: TaskContext) -> None:
        return None

    for _ in range(5):  # a history: "long" takes a second, "short" a millisecond
        model.observe(f"{work.__qualname__}[long]", dev, 0, 1.0)
        model.observe(f"{work.__qualname__}[short]", dev, 0, 0.001)
    gate = threading.Event()
    with Scheduler(
        [dev],
        policy=PriorityPolicy(aging=0.0),
        model=model,
        short_threshold=0.01,
        health=FAST_HEALTH,
    ) as sched:
        sched.submit(lambda ctx: gate.wait(), priority=100)
        longs = [sched.submit(work, footprint="long") for _ in range(4)]
        shorts = [sched.submit(work, footprint="short") for _ in range(4)]
        gate.set()
        sched.wait(60)
        last_short = max(f.record.start or 0.0 for f in shorts)
        assert all((f.record.start or 0.0) > last_short for f in longs)


def _preempted(grace: float, device: hal.Device) -> int:
    started, gate = threading.Event(), threading.Event()

    def low(ctx: TaskContext) -> Generator[None, None, None]:
        started.set()
        gate.wait(30)
        yield
        yield

    with Scheduler(
        [device], policy=PriorityPolicy(aging=0.0), preemption_grace=grace, health=FAST_HEALTH
    ) as sched:
        lo = sched.submit(low, priority=0)
        assert started.wait(30)
        sched.submit(lambda ctx: None, priority=10)
        gate.set()
        sched.wait(60)
        return lo.record.preemptions


def test_preemption_grace(cpu_pair: list[hal.Device]) -> None:
    assert _preempted(0.0, cpu_pair[0]) == 1
    assert _preempted(1e6, cpu_pair[0]) == 0  # within its grace a task is not preempted


CONFIG = """
[scheduler]
policy = "priority"
timeout = 30.0
short_threshold = 0.005
preemption_grace = 0.25
memory_wait = 10

[health]
interval = 0.5
timeout = 3.0

[pools.infer]
devices = ["cpu:0"]
priority = 10

[pools.train]
devices = ["cpu:0", "cpu:1"]
priority = 1
quota = { max_cards = 1, max_memory = 1048576 }
"""


def test_configuration_file(cpu_pair: list[hal.Device], tmp_path: Path) -> None:
    path = tmp_path / "sched.toml"
    path.write_text(CONFIG)
    cfg = load_config(path)
    assert cfg.timeout == 30.0 and cfg.health.interval == 0.5 and cfg.health.timeout == 3.0
    assert cfg.pools[1] == Pool(
        "train", devices=("cpu:0", "cpu:1"), priority=1, max_cards=1, max_memory=1 << 20
    )
    with Scheduler.from_config(path, devices=cpu_pair) as sched:
        assert (
            sched.policy.name == "priority"
            and sched.timeout == 30.0
            and sched.preemption_grace == 0.25
        )
        assert sched.short_threshold == 0.005 and sched.memory_wait == 10
        assert sched.health.config.interval == 0.5
        assert sched.submit(lambda ctx: str(ctx.device), pool="infer").result(timeout=60) == "cpu:0"
        assert sched.submit(lambda ctx: 1, pool="train", job="a").result(timeout=60) == 1


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("[scheduler]\npolicy = 'eft'\ntimout = 3\n", r"\[scheduler\]: unknown key\(s\) timout"),
        ("[health]\ninterval = -1\n", r"\[health\]: interval=-1"),
        ("[pools.a]\npriority = 'high'\n", r"pool 'a': priority='high' must be a number"),
        ("[pools.a]\nquota = { max_cards = 0 }\n", r"pool 'a': max_cards=0"),
        ("[pools.a]\nquota = { cards = 2 }\n", r"\[pools.a\] quota: unknown key\(s\) cards"),
        ("[scheduler\n", r"not valid TOML"),
    ],
)
def test_a_bad_configuration_names_the_field(tmp_path: Path, text: str, match: str) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=match):
        load_config(path)


def test_a_pool_naming_an_unknown_device_is_a_config_error(cpu_pair: list[hal.Device]) -> None:
    with pytest.raises(
        ConfigError, match="pool 'x': device 'cpu:7' is not in the scheduler's devices"
    ):
        Scheduler(cpu_pair, pools=[Pool("x", devices=("cpu:7",))])
    with pytest.raises(ConfigError, match="cannot read scheduler configuration"):
        load_config("/nonexistent/sched.toml")


@pytest.mark.parametrize("policy", ["eft", "heft"])
def test_graph_nodes_run_in_their_pools(cpu_pool: list[hal.Device], policy: str) -> None:
    from hal.sched import Graph

    g = Graph()
    a = g.add(lambda ctx: str(ctx.device), name="a", pool="left")
    g.add(lambda ctx, x: (x, str(ctx.device)), a, name="b", pool="right")
    pools = [Pool("left", devices=("cpu:0",), priority=3), Pool("right", devices=("cpu:3",))]
    with Scheduler(cpu_pool, policy=policy, pools=pools, health=FAST_HEALTH) as sched:
        futs = sched.submit_graph(g)
        assert futs["b"].result(timeout=60) == ("cpu:0", "cpu:3")
        assert futs["a"].record.pool == "left" and futs["a"].record.priority == 3
        bad = Graph()
        bad.add(lambda ctx: 1, pool="nope")
        with pytest.raises(ValueError, match="pool='nope'"):
            sched.submit_graph(bad)
