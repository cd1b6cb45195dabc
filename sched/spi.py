"""The extension API of hal.sched: what a policy author or a planning tool needs.

hal.sched's user API (:class:`hal.sched.Scheduler`, tasks, graphs, pools, the built-in
policies, health) is :mod:`hal.sched`; this module holds the parts a custom
:class:`hal.sched.Policy` or a tool built on the scheduler's model uses:

- :class:`PolicyEnv`: what a policy sees of the scheduler (devices, model, clock);
  :func:`make_policy` turns a name of :data:`hal.sched.POLICIES` or a policy into one.
- the cost model's helpers: :func:`size_bucket` (the history key of an input size) and
  :func:`capability_score` (a device's static speed estimate).
- HEFT planning: :func:`heft` (a whole-graph plan, :class:`HeftPlan` of
  :class:`Placement`), :func:`upward_ranks`, and :func:`plan_graph` (a :class:`hal.sched.Graph`
  planned on a device pool).

See docs/sched.md, "Policies".
"""

from hal.sched._graph import plan_graph
from hal.sched._heft import HeftPlan, Placement, heft, upward_ranks
from hal.sched._model import capability_score, size_bucket
from hal.sched._policy import PolicyEnv, make_policy

__all__ = [
    "HeftPlan",
    "Placement",
    "PolicyEnv",
    "capability_score",
    "heft",
    "make_policy",
    "plan_graph",
    "size_bucket",
    "upward_ranks",
]
