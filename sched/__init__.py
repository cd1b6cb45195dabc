"""The device scheduler for heterogeneous pools (``hal.sched``).

Written only against the public HAL and ``hal.kernels``, so it runs the same on CUDA,
OpenCL and the CPU emulator:

- :class:`Scheduler` runs tasks (``hal.kernels`` ops or functions of a
  :class:`TaskContext`) on a pool of devices through a pluggable :class:`Policy`:
  ``eft`` (earliest finish time with a run-time history), ``heft`` (whole graphs),
  ``priority`` (aging), ``eager`` and ``round-robin`` (baselines).
- Data stays where it was produced; inputs on another device are copied with
  ``hal.copy`` and the measured link cost enters the placement.
- Preemption is cooperative (``ctx.checkpoint()`` or a generator's ``yield``).
- Health: probes and task outcomes move devices HEALTHY -> SUSPECT -> EVICTED; idempotent
  tasks of a failed device are retried elsewhere, others fail naming the device.
- Per-task timeouts (:class:`TaskTimeoutError`), pinning (``device=``, ``device_class=``),
  priority inheritance along dependencies, gang tasks (``gang=N``, with a communicator),
  named :class:`Pool` s with priorities and per-job quotas, a short/long queue split, a TOML
  configuration (:func:`load_config`, :meth:`Scheduler.from_config`), several tasks per device
  (``concurrency=``).
- :class:`DaskExecutor` runs the same function tasks on the devices of Dask workers.
- Every task has a :class:`TaskRecord`; :meth:`Scheduler.stats` summarises per device,
  :meth:`Scheduler.metrics` per pool (and :meth:`Scheduler.prometheus_text` for scraping);
  under ``hal.trace`` tasks, dependencies and queue depths appear on the timeline.

This module is the user API; what a custom policy or a planning tool uses (``PolicyEnv``, the
cost model's helpers, HEFT planning) is :mod:`hal.sched.spi`, where the old names here lead,
with a warning, until hal-sdk 2.0.
"""

from hal import spi as _hal_spi
from hal.sched._dask import DaskExecutor, DaskFuture, WorkerContext, WorkerLostError
from hal.sched._graph import Graph
from hal.sched._health import DeviceState, HealthConfig, probe
from hal.sched._model import Links, PerfModel
from hal.sched._policy import (
    POLICIES,
    EagerPolicy,
    EftPolicy,
    HeftPolicy,
    Policy,
    PriorityPolicy,
    RoundRobinPolicy,
)
from hal.sched._pools import ConfigError, Pool, SchedulerConfig, load_config
from hal.sched._scheduler import Scheduler
from hal.sched._task import (
    DependencyError,
    DeviceFailedError,
    Future,
    SchedulerError,
    TaskCancelledError,
    TaskContext,
    TaskRecord,
    TaskTimeoutError,
)

__all__ = [
    "POLICIES",
    "ConfigError",
    "DaskExecutor",
    "DaskFuture",
    "DependencyError",
    "DeviceFailedError",
    "DeviceState",
    "EagerPolicy",
    "EftPolicy",
    "Future",
    "Graph",
    "HealthConfig",
    "HeftPolicy",
    "Links",
    "PerfModel",
    "Policy",
    "Pool",
    "PriorityPolicy",
    "RoundRobinPolicy",
    "Scheduler",
    "SchedulerConfig",
    "SchedulerError",
    "TaskCancelledError",
    "TaskContext",
    "TaskRecord",
    "TaskTimeoutError",
    "WorkerContext",
    "WorkerLostError",
    "load_config",
    "probe",
]


#: Names that moved to :mod:`hal.sched.spi` in hal-sdk 1.2 (removed here in 2.0).
__getattr__ = _hal_spi.moved_names(
    "hal.sched",
    "hal.sched.spi",
    {
        "HeftPlan",
        "Placement",
        "PolicyEnv",
        "capability_score",
        "heft",
        "make_policy",
        "plan_graph",
        "size_bucket",
        "upward_ranks",
    },
)
