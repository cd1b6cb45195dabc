"""Earliest finish time: history model, data locality, robustness to timing spikes, stats."""

from __future__ import annotations

import collections

import numpy as np
import pytest

import hal
import hal.kernels
from hal.backends.cpu import inject_fault
from hal.sched import PerfModel, Scheduler
from hal.sched.spi import capability_score, size_bucket

from .conftest import FAST_HEALTH


def test_model_gates_on_min_samples_and_ignores_outliers(cpu_pair: list[hal.Device]) -> None:
    d0, d1 = cpu_pair
    m = PerfModel(min_samples=3, explore_after=4)
    est, calibrated = m.estimate("op", d0, 1 << 20)
    assert not calibrated and est > 0  # capability-score guess until calibrated
    m.observe("op", d0, 1 << 20, 0.010)
    m.observe("op", d0, 1 << 20, 0.011)
    assert m.estimate("op", d0, 1 << 20)[1] is False
    m.observe("op", d0, 1 << 20, 1.000)  # a 100x spike
    est, calibrated = m.estimate("op", d0, 1 << 20)
    assert calibrated and est == pytest.approx(0.011)  # the median shrugs it off
    # another device borrows the calibrated one's figure, scaled by capability scores
    assert m.estimate("op", d1, 1 << 20) == (
        pytest.approx(0.011 * m.score(d0) / m.score(d1)),
        False,
    )
    # another size bucket on the same device scales linearly
    assert m.estimate("op", d0, 1 << 22)[0] == pytest.approx(0.044)
    # a device never tried for a key that others measured is stale: explore it once
    assert m.stale("op", d1, 1 << 20)
    m.touch("op", d1, 1 << 20)
    assert not m.stale("op", d1, 1 << 20)
    # ... and so is one without samples while 4 samples arrived elsewhere
    for _ in range(3):
        m.observe("op", d1, 1 << 20, 0.02)
    assert not m.stale("op", d0, 1 << 20)
    m.observe("op", d1, 1 << 20, 0.02)
    assert m.stale("op", d0, 1 << 20)
    m.touch("op", d0, 1 << 20)
    assert not m.stale("op", d0, 1 << 20)
    assert size_bucket(0) == 0 and size_bucket(1 << 20) == 20 and size_bucket((1 << 21) - 1) == 20


def test_trimmed_mean_estimator() -> None:
    m = PerfModel(min_samples=5, estimator="trimmed")
    for v in (1.0, 1.0, 1.0, 1.0, 100.0):
        m.observe("op", "cpu:0", 10, v)
    assert m._center(m.samples("op", "cpu:0", 10)) == pytest.approx(1.0)
    with pytest.raises(ValueError, match="estimator"):
        PerfModel(estimator="mean-ish")
    with pytest.raises(ValueError, match="min_samples"):
        PerfModel(min_samples=0)


def test_capability_score_reads_the_emulator_speed(cpu_pair: list[hal.Device]) -> None:
    inject_fault(cpu_pair[1].index, speed=0.25)
    assert capability_score(cpu_pair[1]) == pytest.approx(0.25 * capability_score(cpu_pair[0]))


def test_data_stays_where_it_was_produced(cpu_pair: list[hal.Device]) -> None:
    _, d1 = cpu_pair
    x = hal.asarray(np.eye(128, dtype=np.float32), device=d1)
    model = PerfModel()  # calibrated: equal devices (an uncalibrated one would be explored once)
    for d in cpu_pair:
        for _ in range(5):
            model.observe(hal.kernels.matmul.__qualname__, d, 2 * x.nbytes, 1e-3)
    with Scheduler(cpu_pair, policy="eft", health=FAST_HEALTH, model=model) as sched:
        f = sched.submit(hal.kernels.matmul, x, x)
        for _ in range(4):
            f = sched.submit(hal.kernels.matmul, f, x)
        f.result()
        recs = sched.records()
    assert all(r.device == str(d1) and r.bytes_moved == 0 for r in recs)


def test_inputs_on_another_device_are_copied_and_counted(cpu_pair: list[hal.Device]) -> None:
    d0, d1 = cpu_pair
    x = hal.asarray(np.arange(64, dtype=np.float32).reshape(8, 8), device=d1)
    with Scheduler([d0], policy="eft", health=FAST_HEALTH) as sched:
        out = sched.submit(hal.kernels.matmul, x, x).result()
        rec = sched.records()[0]
        stats = sched.stats()["devices"][str(d0)]
    host = np.arange(64, dtype=np.float32).reshape(8, 8)
    np.testing.assert_allclose(out.to_host(), host @ host)
    assert out.device == d0 and rec.bytes_moved == 2 * x.nbytes
    assert stats["bytes_moved"] == 2 * x.nbytes and 0 < stats["communication_share"] < 1


def test_timing_spikes_do_not_collapse_placement(cpu_pool: list[hal.Device]) -> None:
    # equal devices (2 ms of emulated time per op, so host noise matters little); one op in
    # ten, at random, takes 100x as long (a mean-based history would exile devices)
    for d in cpu_pool:
        inject_fault(d.index, delay_ms=2.0, spike_prob=0.1, spike_factor=100.0)
    xs = {d: hal.asarray(np.ones((160, 160), dtype=np.float32), device=d) for d in cpu_pool}
    placed: collections.Counter[str] = collections.Counter()
    with Scheduler(cpu_pool, policy="eft", health=FAST_HEALTH) as sched:
        for wave in range(10):
            fs = [
                sched.submit(hal.kernels.matmul, xs[d], xs[d]) for d in cpu_pool for _ in range(2)
            ]
            for f in fs:
                f.result()
            if wave >= 3:  # history calibrated (and spiked) by now
                placed.update(f.record.device for f in fs)
        spikes = sum(d.properties()["spikes"] for d in cpu_pool)
    assert spikes > 0
    total = sum(placed.values())
    # equal devices stay in use: none takes most of the work, none is exiled
    assert max(placed.values()) <= 0.6 * total, f"placement collapsed: {dict(placed)}"
    assert all(placed[str(d)] >= 1 for d in cpu_pool), f"a device was exiled: {dict(placed)}"


def test_stats_and_records(cpu_pair: list[hal.Device]) -> None:
    x = hal.asarray(np.eye(32, dtype=np.float32), device=cpu_pair[0])
    with Scheduler(cpu_pair, policy="eft", health=FAST_HEALTH) as sched:
        fs = [sched.submit(hal.kernels.matmul, x, x, tags=("fwd",), priority=2) for _ in range(8)]
        [f.result() for f in fs]
        stats = sched.stats()
        recs = sched.records()
    assert stats["policy"] == "eft" and stats["tasks"] == {"done": 8}
    assert stats["makespan_s"] > 0
    for dev in stats["devices"].values():
        assert set(dev) >= {
            "utilization",
            "queue_depth",
            "communication_share",
            "busy_s",
            "bytes_moved",
        }
        assert 0 <= dev["utilization"] <= 1
    for r in recs:
        assert r.submit <= r.ready <= r.start <= r.end  # type: ignore[operator]
        assert r.wait is not None and r.wait >= 0 and r.run is not None and r.run >= 0
        assert r.tags == ("fwd",) and r.priority == 2
        assert r.to_dict()["state"] == "done"


def test_bad_arguments_are_rejected_before_anything_runs(cpu_pair: list[hal.Device]) -> None:
    with pytest.raises(ValueError, match="policy='nope'"):
        Scheduler(cpu_pair, policy="nope")
    with pytest.raises(ValueError, match="empty"):
        Scheduler([])
    with pytest.raises(ValueError, match="twice"):
        Scheduler([cpu_pair[0], cpu_pair[0]])
    with pytest.raises(ValueError, match="retries"):
        Scheduler(cpu_pair, retries=-1)
    with Scheduler(cpu_pair, health=FAST_HEALTH) as sched:
        with pytest.raises(TypeError, match="not callable"):
            sched.submit(42)  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="priority"):
            sched.submit(print, priority="high")  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="needs"):
            sched.submit(print, needs=[1])  # type: ignore[list-item]
        assert sched.records() == []
    with pytest.raises(hal.HalError, match="closed"):
        sched.submit(print)


def test_dependency_failure_propagates(cpu_pair: list[hal.Device]) -> None:
    def boom(ctx: object) -> None:
        raise ValueError("bad input")

    with Scheduler(cpu_pair, health=FAST_HEALTH) as sched:
        a = sched.submit(boom)
        b = sched.submit(lambda ctx, v: v, a)
        assert isinstance(a.exception(), ValueError)
        exc = b.exception()
    assert isinstance(exc, hal.sched.DependencyError) and "'boom'" in str(exc)


def test_drain_moves_queued_work(cpu_pair: list[hal.Device]) -> None:
    import threading

    d0, d1 = cpu_pair
    gate = threading.Event()
    with Scheduler(cpu_pair, policy="round-robin", health=FAST_HEALTH) as sched:
        blockers = [sched.submit(lambda ctx: gate.wait()) for _ in range(2)]
        queued = [sched.submit(lambda ctx: str(ctx.device)) for _ in range(6)]
        t = threading.Thread(target=lambda: sched.drain(d1))
        t.start()
        gate.set()
        t.join()
        assert {f.result() for f in queued} == {str(d0)}  # d1's queue moved to d0
        after = [sched.submit(lambda ctx: str(ctx.device)) for _ in range(4)]
        assert {f.result() for f in after} == {str(d0)}
        sched.admit(d1)
        [b.result() for b in blockers]
        assert sched.stats()["devices"][str(d1)]["drained"] is False


def test_footprint_extends_the_history_key(cpu_pair: list[hal.Device]) -> None:
    def layer(ctx: object, depth: int) -> int:
        return depth

    with Scheduler(cpu_pair[:1], health=FAST_HEALTH) as sched:
        for depth in (1, 4, 4):
            sched.submit(layer, depth, footprint=depth).result()
        op = layer.__qualname__
        assert len(sched.model.samples(f"{op}[4]", cpu_pair[0], 0)) == 2
        assert len(sched.model.samples(f"{op}[1]", cpu_pair[0], 0)) == 1
        assert sched.model.samples(op, cpu_pair[0], 0) == []


def test_links_use_a_topology_file(
    tmp_path: pytest.TempPathFactory, cpu_pair: list[hal.Device]
) -> None:
    import json
    from pathlib import Path

    from hal.sched import Links

    d0, d1 = cpu_pair
    topo = Path(str(tmp_path)) / "topo.json"
    topo.write_text(
        json.dumps(
            {
                "version": 1,
                "hosts": [
                    {
                        "name": "x",
                        "devices": [str(d0), str(d1)],
                        "p2p": [
                            {
                                "src": 0,
                                "dst": 1,
                                "path": "peer",
                                "bandwidth_gbps": 2.0,
                                "latency_us": 10.0,
                            }
                        ],
                    }
                ],
            }
        )
    )
    links = Links(topology=topo)
    assert links.measure(d0, d1) == (2e9, 1e-5)  # from the file, not measured
    assert links.cost(d0, d1, 2_000_000) == pytest.approx(1e-5 + 1e-3)
    topo.write_text("{broken")
    assert Links(topology=topo).table() == {}  # unusable file: pairs get measured instead


def test_inputs_cross_backends_by_staged_copies(cpu_pair: list[hal.Device]) -> None:
    ocls = [d for d in hal.devices() if d.backend == "opencl"]
    if not ocls:
        pytest.skip("no OpenCL devices here")
    ocl = ocls[0]
    host = np.arange(36, dtype=np.float32).reshape(6, 6)
    x = hal.asarray(host, device=ocl)
    with Scheduler([cpu_pair[0]], health=FAST_HEALTH) as sched:
        out = sched.submit(hal.kernels.matmul, x, x).result()
        rec = sched.records()[0]
    assert out.device == cpu_pair[0] and rec.bytes_moved == 2 * x.nbytes
    np.testing.assert_allclose(out.to_host(), host @ host)


def test_submit_graph_with_an_online_policy(cpu_pair: list[hal.Device]) -> None:
    from hal.sched import Graph

    x = hal.asarray(np.eye(8, dtype=np.float32) * 2, device=cpu_pair[0])
    g = Graph()
    a = g.add(hal.kernels.matmul, x, x, name="a")
    b = g.add(hal.kernels.matmul, x, x, name="b")
    g.add(hal.kernels.matmul, a, b, name="c")
    with Scheduler(cpu_pair, policy="eft", health=FAST_HEALTH) as sched:
        out = sched.submit_graph(g)["c"].result()
    np.testing.assert_allclose(out.to_host(), np.eye(8) * 16)
