"""HEFT against the worked example of Topcuoglu, Hariri and Wu (IEEE TPDS 2002), and graphs."""

from __future__ import annotations

import numpy as np
import pytest

import hal
import hal.kernels
from hal.sched import Graph, Scheduler
from hal.sched.spi import heft, upward_ranks

# Table 1 of the paper: computation cost of each task on processors P1, P2, P3.
W = {
    1: (14, 16, 9),
    2: (13, 19, 18),
    3: (11, 13, 19),
    4: (13, 8, 17),
    5: (12, 13, 10),
    6: (13, 16, 9),
    7: (7, 15, 11),
    8: (5, 11, 14),
    9: (18, 12, 20),
    10: (21, 7, 16),
}
# Figure 2: the DAG and its (mean) communication costs.
EDGES = {
    (1, 2): 18,
    (1, 3): 12,
    (1, 4): 9,
    (1, 5): 11,
    (1, 6): 14,
    (2, 8): 19,
    (2, 9): 16,
    (3, 7): 23,
    (4, 8): 27,
    (4, 9): 23,
    (5, 9): 13,
    (6, 8): 15,
    (7, 10): 17,
    (8, 10): 11,
    (9, 10): 13,
}


def test_topcuoglu_example_makespan_is_80() -> None:
    plan = heft(list(W), ["P1", "P2", "P3"], lambda t, p: W[t][int(p[1]) - 1], EDGES)
    assert plan.makespan == pytest.approx(80.0)
    # the paper's schedule (Figure 3a): task -> (processor, start, finish)
    expected = {
        1: ("P3", 0, 9),
        3: ("P3", 9, 28),
        4: ("P2", 18, 26),
        2: ("P1", 27, 40),
        5: ("P3", 28, 38),
        6: ("P2", 26, 42),
        9: ("P2", 56, 68),
        7: ("P3", 38, 49),
        8: ("P1", 57, 62),
        10: ("P2", 73, 80),
    }
    for t, (p, s, f) in expected.items():
        got = plan.placements[t]
        assert (got.processor, got.start, got.finish) == (p, s, f), t


def test_topcuoglu_upward_ranks() -> None:
    ranks = upward_ranks(list(W), EDGES, lambda t: sum(W[t]) / 3)
    paper = {
        1: 108.0,
        2: 77.0,
        3: 80.0,
        4: 80.0,
        5: 69.0,
        6: 63.333,
        7: 42.667,
        8: 35.667,
        9: 44.333,
        10: 14.667,
    }
    for t, r in paper.items():
        assert ranks[t] == pytest.approx(r, abs=1e-3)


def test_heft_rejects_cycles_and_unknown_tasks() -> None:
    with pytest.raises(ValueError, match="cycle"):
        heft([1, 2], ["p"], lambda t, p: 1.0, {(1, 2): 1.0, (2, 1): 1.0})
    with pytest.raises(ValueError, match="not in tasks"):
        heft([1], ["p"], lambda t, p: 1.0, {(1, 3): 1.0})
    with pytest.raises(ValueError, match="processors is empty"):
        heft([1], [], lambda t, p: 1.0, {})


def _noop(ctx: object, *parents: object) -> str:
    return "ok"


def test_submit_graph_heft_runs_each_task_on_its_planned_device(cpu_pair: list[hal.Device]) -> None:
    d0, d1 = cpu_pair
    g = Graph()
    nodes: dict[int, Graph.Node] = {}
    for t in W:
        parents = [nodes[a] for (a, b) in EDGES if b == t]
        # two processors: the paper's P1 and P3 columns, in seconds / 1000
        nodes[t] = g.add(
            _noop, *parents, name=f"n{t}", cost={str(d0): W[t][0] / 1e3, str(d1): W[t][2] / 1e3}
        )
    with Scheduler([d0, d1], policy="heft") as sched:
        futures = sched.submit_graph(g)
        assert all(f.result() == "ok" for f in futures.values())
        recs = {r.name: r for r in sched.records()}
    plan = heft(
        list(W), ["a", "b"], lambda t, p: W[t][0 if p == "a" else 2], {e: 0.0 for e in EDGES}
    )
    for t in W:
        want = d0 if plan.placements[t].processor == "a" else d1
        assert recs[f"n{t}"].device == str(want)
    # dependencies held: every child started after its parents ended
    for a, b in EDGES:
        assert recs[f"n{b}"].start >= recs[f"n{a}"].end


def test_graph_data_dependencies_pass_results(cpu_pair: list[hal.Device]) -> None:
    d0, _ = cpu_pair
    x = hal.asarray(np.arange(16, dtype=np.float32).reshape(4, 4), device=d0)
    g = Graph()
    a = g.add(hal.kernels.matmul, x, x, name="a")
    g.add(hal.kernels.matmul, a, x, name="b")
    with Scheduler(cpu_pair, policy="heft") as sched:
        out = sched.submit_graph(g)["b"].result()
    host = np.arange(16, dtype=np.float32).reshape(4, 4)
    np.testing.assert_allclose(out.to_host(), host @ host @ host)


def test_graph_rejects_foreign_nodes_and_duplicates() -> None:
    g, h = Graph(), Graph()
    n = h.add(_noop, name="x")
    with pytest.raises(ValueError, match="not a node of this graph"):
        g.add(_noop, n)
    g.add(_noop, name="a")
    with pytest.raises(ValueError, match="already a node"):
        g.add(_noop, name="a")
