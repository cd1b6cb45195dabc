"""Task graphs (DAGs with data dependencies) for ``Scheduler.submit_graph``, and their HEFT plan."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import hal
from hal.sched._heft import HeftPlan, heft
from hal.sched._model import Links, PerfModel

__all__ = ["Graph", "plan_graph"]


class Graph:
    """A DAG of tasks. :meth:`add` returns a node; pass a node as an argument of a later
    :meth:`add` to make a data dependency (the consumer gets the producer's result).

    Example::

        g = hal.sched.Graph()
        a = g.add(hal.kernels.matmul, x, w1, name="h")
        b = g.add(hal.kernels.relu, a, name="act")
        futures = scheduler.submit_graph(g)
    """

    class Node:
        """One task of a :class:`Graph` (created by :meth:`Graph.add`)."""

        def __init__(
            self,
            fn: Callable[..., Any],
            args: tuple[Any, ...],
            kwargs: dict[str, Any],
            *,
            name: str,
            priority: float,
            needs: list[Graph.Node],
            idempotent: bool | None,
            tags: tuple[str, ...],
            cost: Mapping[str, float] | None,
            out_bytes: int | None,
        ) -> None:
            self.fn = fn
            self.args = args
            self.kwargs = kwargs
            self.name = name
            self.op = getattr(fn, "__qualname__", None) or type(fn).__name__
            self.priority = priority
            self.needs = needs
            self.idempotent = idempotent
            self.tags = tags
            self.cost = dict(cost) if cost is not None else None
            self.in_bytes = sum(a.nbytes for a in args if isinstance(a, hal.Array))
            self.out_bytes = out_bytes
            self.pool = "default"  # the scheduler pool it runs in

        @property
        def parents(self) -> list[Graph.Node]:
            """Nodes this one depends on (data and control)."""
            return [a for a in self.args if isinstance(a, Graph.Node)] + list(self.needs)

        def __repr__(self) -> str:
            return f"<Graph.Node {self.name!r}>"

    def __init__(self) -> None:
        self.nodes: dict[str, Graph.Node] = {}

    def add(
        self,
        fn: Callable[..., Any],
        /,
        *args: Any,
        name: str | None = None,
        priority: float = 0,
        needs: Iterable[Graph.Node] = (),
        idempotent: bool | None = None,
        tags: Iterable[str] = (),
        cost: Mapping[str, float] | None = None,
        out_bytes: int | None = None,
        footprint: object = None,
        pool: str = "default",
        **kwargs: Any,
    ) -> Graph.Node:
        """Add a task ``fn(*args, **kwargs)`` (as :meth:`Scheduler.submit` calls it).

        Args:
            name: unique in the graph (default: the function name and a number).
            cost: ``{"cpu:0": seconds, ...}``: known compute times for planning (otherwise
                the scheduler's history model estimates them).
            out_bytes: size of the result, for transfer costs in planning (default: the
                bytes of its array inputs).
            footprint: extends the run-time history's key (see :meth:`Scheduler.submit`).
            pool: the scheduler pool the task runs in (its devices and priority).
        """
        if not callable(fn):
            raise TypeError(f"fn={fn!r} is not callable")
        label = name or f"{getattr(fn, '__name__', 'task')}#{len(self.nodes)}"
        if label in self.nodes:
            raise ValueError(f"name={label!r} is already a node of this graph")
        needs_l = list(needs)
        for n in [*needs_l, *(a for a in args if isinstance(a, Graph.Node))]:
            if not isinstance(n, Graph.Node) or self.nodes.get(n.name) is not n:
                raise ValueError(f"{n!r} is not a node of this graph")
        node = Graph.Node(
            fn,
            tuple(args),
            dict(kwargs),
            name=label,
            priority=priority,
            needs=needs_l,
            idempotent=idempotent,
            tags=tuple(tags),
            cost=cost,
            out_bytes=out_bytes,
        )
        if footprint is not None:
            node.op = f"{node.op}[{footprint}]"
        node.pool = str(pool)
        self.nodes[label] = node
        return node

    def topological(self) -> list[Graph.Node]:
        """Return the nodes parents-first (insertion order already is; kept explicit)."""
        return list(self.nodes.values())

    def edges(self) -> list[tuple[Graph.Node, Graph.Node]]:
        """Return ``(parent, child)`` pairs."""
        return [(p, n) for n in self.nodes.values() for p in n.parents]


def _out_bytes(node: Graph.Node, memo: dict[str, int]) -> int:
    if node.name not in memo:
        if node.out_bytes is not None:
            memo[node.name] = node.out_bytes
        else:
            memo[node.name] = node.in_bytes + sum(
                _out_bytes(p, memo) for p in node.parents if any(a is p for a in node.args)
            )
    return memo[node.name]


def plan_graph(
    graph: Graph, devices: Sequence[hal.Device], model: PerfModel, links: Links
) -> HeftPlan[str, hal.Device]:
    """Plan ``graph`` on ``devices`` with HEFT, from given costs or the history model."""
    memo: dict[str, int] = {}
    nodes = graph.nodes
    in_bytes = {
        n.name: n.in_bytes + sum(_out_bytes(p, memo) for p in n.args if isinstance(p, Graph.Node))
        for n in nodes.values()
    }

    def cost(name: str, d: hal.Device) -> float:
        node = nodes[name]
        if node.cost is not None and str(d) in node.cost:
            return float(node.cost[str(d)])
        return model.estimate(node.op, d, in_bytes[name])[0]

    edges: dict[tuple[str, str], float] = {}
    pairs = [(a, b) for a in devices for b in devices if a != b]
    for p, c in graph.edges():
        nbytes = _out_bytes(p, memo) if any(a is p for a in c.args) else 0
        mean = (
            sum(links.cost(a, b, nbytes) for a, b in pairs) / len(pairs)
            if pairs and nbytes
            else 0.0
        )
        edges[(p.name, c.name)] = mean

    def comm(a: str, b: str, pa: hal.Device, pb: hal.Device) -> float:
        if pa == pb:
            return 0.0
        nbytes = _out_bytes(nodes[a], memo) if any(x is nodes[a] for x in nodes[b].args) else 0
        return links.cost(pa, pb, nbytes)

    return heft(list(nodes), list(devices), cost, edges, comm)
