"""HEFT: Heterogeneous Earliest Finish Time list scheduling of a task graph.

Topcuoglu, Hariri and Wu, "Performance-effective and low-complexity task scheduling for
heterogeneous computing", IEEE TPDS 13(3), 2002. Tasks are ranked by their upward rank
(mean computation cost plus the costliest path to an exit task, with mean communication
costs), then placed in that order on the processor giving the earliest finish time, with
insertion into idle gaps. Communication between tasks on the same processor costs 0.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import Generic, TypeVar

__all__ = ["HeftPlan", "Placement", "heft", "upward_ranks"]

T = TypeVar("T", bound=Hashable)
P = TypeVar("P", bound=Hashable)


@dataclasses.dataclass(frozen=True)
class Placement(Generic[P]):
    """Where and when HEFT runs one task: ``processor``, ``start``, ``finish``."""

    processor: P
    start: float
    finish: float


@dataclasses.dataclass(frozen=True)
class HeftPlan(Generic[T, P]):
    """A HEFT schedule: the placement of every task, its order, and the makespan."""

    placements: dict[T, Placement[P]]
    order: list[T]
    ranks: dict[T, float]

    @property
    def makespan(self) -> float:
        """Finish time of the last task."""
        return max((p.finish for p in self.placements.values()), default=0.0)


def _check_graph(tasks: Sequence[T], edges: Mapping[tuple[T, T], float]) -> dict[T, list[T]]:
    known = set(tasks)
    if len(known) != len(tasks):
        raise ValueError("tasks contain duplicates")
    succ: dict[T, list[T]] = {t: [] for t in tasks}
    for (a, b), c in edges.items():
        if a not in known or b not in known:
            raise ValueError(f"edge ({a!r}, {b!r}) names a task that is not in tasks")
        if c < 0:
            raise ValueError(f"edge ({a!r}, {b!r}) has a negative cost {c}")
        succ[a].append(b)
    # cycle check (Kahn)
    indeg = {t: 0 for t in tasks}
    for _, b in edges:
        indeg[b] += 1
    todo = [t for t in tasks if indeg[t] == 0]
    seen = 0
    while todo:
        t = todo.pop()
        seen += 1
        for s in succ[t]:
            indeg[s] -= 1
            if indeg[s] == 0:
                todo.append(s)
    if seen != len(tasks):
        raise ValueError("the task graph has a cycle")
    return succ


def upward_ranks(
    tasks: Sequence[T],
    edges: Mapping[tuple[T, T], float],
    mean_cost: Callable[[T], float],
) -> dict[T, float]:
    """Return each task's upward rank: ``mean_cost(t) + max over successors (c(t,s) + rank(s))``."""
    succ = _check_graph(tasks, edges)
    ranks: dict[T, float] = {}

    def rank(t: T) -> float:
        if t not in ranks:
            ranks[t] = mean_cost(t) + max((edges[(t, s)] + rank(s) for s in succ[t]), default=0.0)
        return ranks[t]

    for t in tasks:
        rank(t)
    return ranks


def heft(
    tasks: Sequence[T],
    processors: Sequence[P],
    cost: Callable[[T, P], float],
    edges: Mapping[tuple[T, T], float],
    comm: Callable[[T, T, P, P], float] | None = None,
) -> HeftPlan[T, P]:
    """Schedule a task graph with HEFT (insertion-based); return the plan.

    Args:
        tasks: the tasks (hashable ids).
        processors: where they can run.
        cost: ``cost(task, processor)``: computation time of ``task`` on ``processor``.
        edges: ``{(parent, child): mean communication cost}``; data dependencies.
        comm: ``comm(parent, child, p_parent, p_child)``: the actual communication time
            between two processors (default: the edge's cost, 0 on the same processor).
    """
    if not processors:
        raise ValueError("processors is empty")
    procs = list(processors)

    def mean(t: T) -> float:
        return sum(cost(t, p) for p in procs) / len(procs)

    ranks = upward_ranks(tasks, edges, mean)
    preds: dict[T, list[T]] = {t: [] for t in tasks}
    for a, b in edges:
        preds[b].append(a)

    def c(a: T, b: T, pa: P, pb: P) -> float:
        if comm is not None:
            return comm(a, b, pa, pb)
        return 0.0 if pa == pb else edges[(a, b)]

    index = {t: i for i, t in enumerate(tasks)}
    order = sorted(tasks, key=lambda t: (-ranks[t], index[t]))
    busy: dict[P, list[tuple[float, float]]] = {p: [] for p in procs}
    placed: dict[T, Placement[P]] = {}
    for t in order:
        best: Placement[P] | None = None
        for p in procs:
            ready = max(
                (placed[a].finish + c(a, t, placed[a].processor, p) for a in preds[t]), default=0.0
            )
            dur = cost(t, p)
            start = _earliest_slot(busy[p], ready, dur)
            cand = Placement(p, start, start + dur)
            if best is None or cand.finish < best.finish - 1e-12:
                best = cand
        assert best is not None
        placed[t] = best
        busy[best.processor].append((best.start, best.finish))
        busy[best.processor].sort()
    return HeftPlan(placed, order, ranks)


def _earliest_slot(slots: list[tuple[float, float]], ready: float, dur: float) -> float:
    """Return the earliest start >= ``ready`` of a ``dur`` long gap among sorted busy ``slots``."""
    t = ready
    for s, f in slots:
        if t + dur <= s + 1e-12:
            return t
        t = max(t, f)
    return t
