"""The scheduler: a worker per device, a policy, health tracking, records and the timeline."""

from __future__ import annotations

import os
import threading
import time
import types
from collections.abc import Callable, Generator, Iterable, Mapping, Sequence
from typing import Any

import hal
from hal.sched._graph import Graph, plan_graph
from hal.sched._health import DeviceState, Health, HealthConfig
from hal.sched._model import Links, PerfModel
from hal.sched._policy import Policy, make_policy
from hal.sched._pools import ConfigError, Pool, load_config
from hal.sched._task import (
    DependencyError,
    DeviceFailedError,
    Future,
    SchedulerError,
    Task,
    TaskCancelledError,
    TaskContext,
    TaskRecord,
    TaskTimeoutError,
)

__all__ = ["Scheduler"]

#: what a worker began: the devices it holds and the streams it runs on
_Begun = tuple[list[hal.Device], list[hal.Stream]]
#: a task a worker took and began, to run next
_Next = tuple[Task, _Begun]


_MISSING = object()
#: submit()'s defaults of tags, name, idempotent, timeout, device, device_class, job
_SUBMIT_DEFAULTS = ((), None, None, None, None, None, None)
_GeneratorType = types.GeneratorType
_tracer = hal.tracer


_sleep = time.sleep


def _take_lock(lock: Any) -> None:
    """Acquire the scheduler's ``lock``; a thread that finds it taken gives way first.

    It yields the interpreter once (``time.sleep(0)``) before it queues on the lock. The
    holder is most likely a thread the interpreter switched away from inside its critical
    section: it runs on and releases the lock. Queued at once, the thread would be handed the
    lock while it waits for the interpreter (a lock convoy): every later acquisition then
    blocks too, two context switches per task instead of a few per switch interval (issue #13:
    throughput of trivial tasks). Free, the lock costs one non-blocking acquire. Release it
    with ``lock.release()`` (in a ``finally``).
    """
    if not lock.acquire(False):
        _sleep(0)
        lock.acquire()


def _is_kernel_op(fn: Callable[..., Any]) -> bool:
    return getattr(fn, "__module__", "").startswith("hal.kernels")


def _resolve_device(d: object) -> hal.Device:
    if isinstance(d, hal.Device):
        return d
    if isinstance(d, str):
        return hal.device(d)
    raise TypeError(f"device={d!r} is not a hal.Device or a 'backend:index' string")


def _device_classes(d: hal.Device) -> set[str]:
    """The names ``device_class=`` matches: the backend (``"cpu"``), the model name, a ``class`` property."""
    out = {d.backend, d.name}
    try:
        cls = d.properties().get("class")
    except hal.HalError:
        cls = None
    if isinstance(cls, str):
        out.add(cls)
    return out


def _percentile(values: Sequence[float], q: float) -> float:
    if not values:
        return 0.0
    v = sorted(values)
    return v[min(len(v) - 1, max(0, round(q * (len(v) - 1))))]


class _DevStats:
    __slots__ = (
        "busy",
        "busy_since",
        "bytes_moved",
        "evictions",
        "failures",
        "max_depth",
        "oom",
        "tasks",
        "timeouts",
        "transfer",
    )

    def __init__(self) -> None:
        self.busy = 0.0
        self.busy_since = 0.0
        self.evictions = 0
        self.timeouts = 0
        self.transfer = 0.0
        self.bytes_moved = 0
        self.tasks = 0
        self.failures = 0
        self.max_depth = 0
        self.oom = 0


class _Lane:
    """One worker's fixed references, looked up once: its device and slot, the device's running
    list, counters, parked workers, name and health track, and what a task it begins runs on
    (``begun``: replaced when a timeout abandons the slot's stream)."""

    __slots__ = ("begun", "device", "name", "parked", "running", "slot", "stats", "track")

    def __init__(self, sched: Scheduler, device: hal.Device, slot: int) -> None:
        self.device = device
        self.slot = slot
        self.running = sched._running[device]
        self.stats = sched._stats[device]
        self.parked = sched._parked[device]
        self.name = sched._names[device]
        self.track = sched.health.track(device)
        self.begun: _Begun = ([device], [sched._slot_streams[(device, slot)]])


def free_memory(device: hal.Device) -> int | None:
    """Return the bytes of ``device`` a task may still allocate, or None when the backend does not count.

    ``total_memory - memory_in_use``: with hal's memory pool, ``memory_in_use`` counts the
    bytes of live buffers only (the pool's cache is given back when an allocation needs it).
    """
    used = device.memory_in_use
    return None if used is None else max(0, device.total_memory - used)


class Scheduler:
    """Run tasks on a pool of devices of any backends.

    Args:
        devices: the pool (``hal.Device`` objects or ``"cpu:0"``-style names); default:
            every device of ``hal.devices()``.
        policy: a :class:`Policy` or a name: ``eft`` (default; earliest finish time with
            history), ``heft`` (plans whole graphs), ``priority`` (aging priority queue),
            ``eager``, ``round-robin`` (baselines).
        retries: how many times an idempotent task is retried on another device after
            its device failed.
        model: the run-time history (shared between schedulers if you pass one).
        links: measured link bandwidths (shared likewise).
        health: probe thresholds and interval (:class:`HealthConfig`).
        memory_wait: seconds a task may keep meeting full devices before it fails with the
            ``hal.OutOfMemoryError`` (out of memory is back-pressure, never a device failure:
            the task is placed on another device with room, or waits until memory is freed).
        timeout: the default per-task timeout in seconds (``submit(timeout=)`` overrides it);
            None: no limit.
        pools: named :class:`Pool` s (their devices, priority and per-job quota); a pool
            ``"default"`` with every device exists unless given.
        short_threshold: tasks estimated to run at most this many seconds go to the short
            queue, served before long tasks of the same priority; None: one queue.
        preemption_grace: seconds a task runs before its yield points may run other work.
        concurrency: tasks run at once per device (each on its own stream), where the device
            declares ``concurrent_streams``; 1 elsewhere.
        priority_inheritance: a waiting task lifts the priority of its unfinished
            dependencies to its own (no priority inversion).
        clock: the scheduler's clock (seconds; default ``time.perf_counter``): ready, start
            and end times, aging and estimates of queued work use it. A virtual clock makes
            scheduling decisions reproducible (tests, simulations); timeouts and waits stay
            in real seconds. The attribute ``clock`` is that callable (what :meth:`now`
            calls; policies may call it directly).

    Use as a context manager: leaving the block waits for every task and releases the
    workers, probes and streams.
    """

    def __init__(
        self,
        devices: Iterable[hal.Device | str] | None = None,
        policy: str | Policy = "eft",
        *,
        retries: int = 2,
        model: PerfModel | None = None,
        links: Links | None = None,
        health: HealthConfig | None = None,
        memory_wait: float = 60.0,
        timeout: float | None = None,
        pools: Iterable[Pool] | Mapping[str, Pool] | None = None,
        short_threshold: float | None = None,
        preemption_grace: float = 0.0,
        concurrency: int = 1,
        priority_inheritance: bool = True,
        clock: Callable[[], float] | None = None,
    ) -> None:
        devs = [_resolve_device(d) for d in (hal.devices() if devices is None else devices)]
        if not devs:
            raise ValueError("devices is empty: a scheduler needs at least one device")
        if len(set(devs)) != len(devs):
            raise ValueError(f"devices={[str(d) for d in devs]} lists a device twice")
        if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
            raise ValueError(f"retries={retries!r} must be an integer >= 0")
        self.devices: list[hal.Device] = devs
        self.policy = make_policy(policy)
        self.retries = retries
        if (
            isinstance(memory_wait, bool)
            or not isinstance(memory_wait, (int, float))
            or not 0 <= memory_wait < 1e9
        ):
            raise ValueError(f"memory_wait={memory_wait!r} must be a number of seconds >= 0")
        self.memory_wait = float(memory_wait)
        if clock is not None and not callable(clock):
            raise TypeError(f"clock={clock!r} is not callable")
        self._clock: Callable[[], float] = clock or time.perf_counter
        #: the scheduler's clock itself (what :meth:`now` calls): policies call it directly
        self.clock: Callable[[], float] = self._clock
        self.timeout = self._check_timeout(timeout)
        for key, v in (
            ("short_threshold", short_threshold),
            ("preemption_grace", preemption_grace),
        ):
            if v is not None and (
                isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v < 1e9
            ):
                raise ValueError(f"{key}={v!r} must be a number of seconds >= 0")
        self.short_threshold = None if short_threshold is None else float(short_threshold)
        self.preemption_grace = float(preemption_grace or 0.0)
        if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1:
            raise ValueError(f"concurrency={concurrency!r} must be an integer >= 1")
        self.concurrency = concurrency
        self.priority_inheritance = bool(priority_inheritance)
        self.pools = self._make_pools(devs, pools)
        self._slots = {d: concurrency if d.capabilities.concurrent_streams else 1 for d in devs}
        self._held: set[hal.Device] = set()  # devices a gang task holds
        self._gangs: list[Task] = []  # ready gang tasks, waiting for all their devices at once
        self._quota_waiting: list[Task] = []  # tasks whose job was at its quota
        self._job_cards: dict[tuple[str, str], int] = {}
        self._job_mem: dict[tuple[str, str], int] = {}
        self._mem_waiting: list[Task] = []  # tasks every eligible device was too full for
        self._mem_kick = False  # a task finished since: memory may have been freed
        self._mem_next = 0.0  # when waiting tasks are tried again anyway (memory freed outside)
        self.model = model if model is not None else PerfModel()
        self.links = links if links is not None else Links()
        lock = self._lock = threading.RLock()  # taken directly on the hot paths (no Python frame)
        self._cond = threading.Condition(lock)
        #: the workers of each device waiting for work, as the lock each blocks on (parked under
        #: the scheduler's lock; a waker pops and releases them): a task placed on a device wakes
        #: that device's workers only, and no waiter means no wake-up at all
        self._parked: dict[hal.Device, list[Any]] = {d: [] for d in devs}
        self._n_waiting = 0  # parked workers, woken or not yet running again
        self._cond_waiters = 0  # threads waiting on _cond (drain)
        #: every usable device, in order, while no health state changed (``_health_gen``)
        self._usable: tuple[int, list[hal.Device]] | None = None
        self._health_gen = 0
        self._eligible_memo: tuple[Task, list[hal.Device]] | None = None
        self._estimates: dict[tuple[str, int, hal.Device], tuple[int, float]] = {}
        #: (op, input bytes) -> (model version, devices, an estimate per device): see estimates()
        self._estimates_of: dict[
            tuple[str, int], tuple[int, list[hal.Device], tuple[float, ...]]
        ] = {}
        #: what submit() needs of a function, per function (see _fn_info)
        self._fn_infos: dict[Callable[..., Any], tuple[bool, str, str]] = {}
        #: ``_pinning("default", None, None)``, resolved once (pools are fixed at construction)
        self._default_pin: tuple[frozenset[hal.Device] | None, Pool] | None = None
        self._tasks: list[Task] = []
        #: tasks admitted (counted under the scheduler's lock) and finished (under _done_lock): the
        #: difference is what wait() waits for; a submission takes no second lock
        self._admitted = 0
        self._settled = 0
        #: what wait() waits on: its own lock, so a finishing task does not take the scheduler's
        self._done_lock = threading.Lock()
        self._done_cond = threading.Condition(self._done_lock)
        self._drained: set[hal.Device] = set()
        self._running: dict[hal.Device, list[Task]] = {d: [] for d in devs}
        self._stats = {d: _DevStats() for d in devs}
        self._names = {d: str(d) for d in devs}
        self._closed = False
        self._stop = False
        self._t0 = self._clock()
        self._slot_streams = {
            (d, k): d.create_stream() for d in devs for k in range(self._slots[d])
        }
        self._streams = {d: self._slot_streams[(d, 0)] for d in devs}
        self._abandoned: list[hal.Stream] = []
        self._servers: list[Any] = []  # metrics endpoints (serve_metrics)
        self.policy.attach(self)
        if "default" in self.pools:
            self._default_pin = self._pinning("default", None, None)
        self.health = Health(devs, health or HealthConfig(), self._health_changed)
        self._lanes = {(d, k): _Lane(self, d, k) for d in devs for k in range(self._slots[d])}
        #: a lane of each device (its first): the device's records in one lookup
        self._recs = {d: self._lanes[(d, 0)] for d in devs}
        self._threads = [
            threading.Thread(
                target=self._worker, args=(lane,), name=f"hal-sched-{d}-{k}", daemon=True
            )
            for (d, k), lane in self._lanes.items()
        ]
        for t in self._threads:
            t.start()

    @staticmethod
    def _check_timeout(timeout: object) -> float | None:
        if timeout is None:
            return None
        if (
            isinstance(timeout, bool)
            or not isinstance(timeout, (int, float))
            or not 0 < timeout < 1e9
        ):
            raise ValueError(f"timeout={timeout!r} must be a number of seconds > 0 or None")
        return float(timeout)

    @staticmethod
    def _make_pools(
        devs: Sequence[hal.Device], pools: Iterable[Pool] | Mapping[str, Pool] | None
    ) -> dict[str, Pool]:
        given = list(pools.values()) if isinstance(pools, Mapping) else list(pools or ())
        out: dict[str, Pool] = {}
        names = {str(d) for d in devs}
        for p in given:
            if not isinstance(p, Pool):
                raise TypeError(f"pools contains {p!r}, not a hal.sched.Pool")
            if p.name in out:
                raise ConfigError(f"pool {p.name!r} is given twice")
            for d in p.devices or ():
                if d not in names:
                    raise ConfigError(
                        f"pool {p.name!r}: device {d!r} is not in the scheduler's devices ({', '.join(sorted(names))})"
                    )
            out[p.name] = p
        out.setdefault("default", Pool("default"))
        return out

    @classmethod
    def from_config(cls, path: str | os.PathLike[str], **overrides: Any) -> Scheduler:
        """Build a scheduler from a configuration file (TOML, see :func:`hal.sched.load_config`).

        Keyword arguments override the file's values (e.g. ``devices=``).
        """
        kwargs = load_config(path).kwargs()
        kwargs.update(overrides)
        return cls(**kwargs)

    # -- the PolicyEnv side ------------------------------------------------------------------
    def now(self) -> float:
        """Return the scheduler's clock (``time.perf_counter()`` unless ``clock=`` was given)."""
        return self._clock()

    def eligible(self, task: Task) -> list[hal.Device]:
        """Return the devices ``task`` may run on now."""
        memo = self._eligible_memo
        if memo is not None and memo[0] is task:
            return list(memo[1])
        return list(self._eligible(task))

    def _eligible(self, task: Task) -> list[hal.Device]:
        """:meth:`eligible`, possibly a list the scheduler keeps: read it, never change it."""
        if (
            task.pinned is None
            and not task.excluded
            and not task.mem_excluded
            and not task.memory_bytes
            and not self._drained
        ):  # the common case: every usable device, kept while no health state changes
            cached = self._usable
            if cached is None or cached[0] != self._health_gen:
                gen = self._health_gen  # read first: a change meanwhile makes the entry stale
                usable = self.health.usable
                cached = self._usable = (gen, [d for d in self.devices if usable(d)])
            return cached[1]
        return [
            d
            for d in self.devices
            if self.health.usable(d)
            and d not in self._drained
            and d not in task.excluded
            and d not in task.mem_excluded
            and task.memory_bytes <= d.total_memory
            and (task.pinned is None or d in task.pinned)
        ]

    def slots(self, device: hal.Device) -> int:
        """Return how many tasks ``device`` runs at once (``concurrency`` where it declares concurrent streams)."""
        return self._slots[device]

    def estimate(self, task: Task, device: hal.Device) -> float:
        """Return the model's compute-time estimate of ``task`` on ``device``.

        Kept per (op, input bytes, device) while the model's ``version`` holds (it changes
        when an estimate may have): placing a task costs dictionary hits, not model queries.
        """
        key = (task.op, task.nbytes, device)
        model = self.model
        hit = self._estimates.get(key)
        if hit is not None and hit[0] == model.version:
            return hit[1]
        version = model.version  # read first: a change meanwhile makes the entry stale, not wrong
        value = model.estimate(task.op, device, task.nbytes)[0]
        if len(self._estimates) > 4096:
            self._estimates.clear()
        self._estimates[key] = (version, value)
        return value

    def estimates(self, task: Task, devices: Sequence[hal.Device]) -> Sequence[float]:
        """Return :meth:`estimate` of ``task`` on each of ``devices``, in order.

        Kept per (op, input bytes) while the model's ``version`` and the devices hold: placing
        a task costs one dictionary hit. The sequence is the scheduler's: read it, never change it.
        """
        key = (task.op, task.nbytes)
        hit = self._estimates_of.get(key)
        version = self.model.version  # read first: a change meanwhile makes the entry stale
        if hit is not None and hit[0] == version and hit[1] == devices:
            return hit[2]
        values = tuple([self.estimate(task, d) for d in devices])
        if len(self._estimates_of) > 4096:
            self._estimates_of.clear()
        self._estimates_of[key] = (version, list(devices), values)  # compared with a list
        return values

    def explore(self, task: Task, devices: Sequence[hal.Device]) -> hal.Device | None:
        """Return a device whose history for ``task`` is stale (to measure again), or None."""
        d = self.model.first_stale(task.op, devices, task.nbytes)
        if d is not None:
            self.model.touch(task.op, d, task.nbytes)
        return d

    def transfer_cost(self, task: Task, device: hal.Device) -> float:
        """Return the estimated seconds to copy ``task``'s inputs that live elsewhere."""
        if not task.args:
            return 0.0
        total = 0.0
        for a in self._inputs(task):
            if isinstance(a, hal.Array) and a.device != device:
                total += self.links.cost(a.device, device, a.nbytes)
        return total

    @staticmethod
    def _input_bytes(task: Task) -> int:
        """Return the bytes of ``task``'s array inputs (the history model's size key)."""
        if not task.args:
            return 0
        return sum(a.nbytes for a in Scheduler._inputs(task) if isinstance(a, hal.Array))

    @staticmethod
    def _inputs(task: Task) -> list[Any]:
        out = []
        for a in task.args:
            if isinstance(a, Future):
                a = a._result if a.done() else None
            out.append(a)
        return out

    # -- submitting ----------------------------------------------------------------------------
    def submit(
        self,
        fn: Callable[..., Any],
        /,
        *args: Any,
        priority: float = 0,
        needs: Sequence[Future] = (),
        idempotent: bool | None = None,
        tags: Iterable[str] = (),
        name: str | None = None,
        footprint: object = None,
        memory_bytes: int = 0,
        timeout: float | None = None,
        device: hal.Device | str | None = None,
        device_class: str | None = None,
        gang: int = 1,
        pool: str = "default",
        job: str | None = None,
        **kwargs: Any,
    ) -> Future:
        """Submit ``fn(*args, **kwargs)``; return its :class:`Future`.

        ``fn`` is either a ``hal.kernels`` op (called as ``fn(*args, stream=s, **kwargs)``)
        or a function called as ``fn(ctx, *args, **kwargs)`` with a :class:`TaskContext`
        (its device and stream). A function that is a generator yields at its own
        boundaries: each ``yield`` (like ``ctx.checkpoint()``) is a point where waiting
        work of a higher priority class may run. The scheduler synchronizes the stream
        when the task returns.

        Args:
            args: ``hal.Array`` arguments on another device are copied (``hal.copy``) to
                the chosen device first; a :class:`Future` argument is a data dependency
                (its result is passed).
            priority: the task's priority class (higher runs first; waiting ages it).
            needs: futures that must finish first (control dependencies).
            idempotent: may the task be re-run elsewhere if its device fails? Default:
                True for ``hal.kernels`` ops (they write fresh outputs), else False.
            tags: labels kept in records and the timeline.
            name: the name in records (default: the function's name).
            footprint: what, besides the input bytes, decides the task's cost (StarPU's
                footprint), e.g. a layer's depth: it extends the run-time history's key.
            memory_bytes: device memory the task needs besides its inputs: it is placed only
                on devices that hold that much, and runs where that much is free now (else it
                goes to another device or waits; see ``memory_wait``).
            timeout: seconds the task may run (default: the scheduler's ``timeout``). Past it
                the future raises :class:`TaskTimeoutError` naming the task and device, the
                device's stream is abandoned (a fresh one takes its place) and the device is
                probed again: it is never left blocked.
            device: pin the task to this device (a ``hal.Device`` or ``"cpu:1"``).
            device_class: run only on devices of this class: a backend (``"cpu"``), a device
                model name, or the device's ``class`` property.
            gang: the number of devices the task needs at once (a function task): it starts
                only when all are held, gets them as ``ctx.devices`` / ``ctx.streams`` and a
                communicator over them as ``ctx.comm`` (``hal.comm.create``).
            pool: the :class:`Pool` it runs in (its devices and priority).
            job: the job it counts against for its pool's quota (``max_cards``, ``max_memory``).

        Raises:
            SchedulerError: no device can ever take the task (pinning, pool, gang size, quota),
                naming why; TypeError/ValueError: a bad argument, naming it.
        """
        if not callable(fn):
            raise TypeError(f"fn={fn!r} is not callable")
        pin = self._default_pin
        # the common case: every scheduling keyword at its default, nothing to check (the tuple's
        # items are then the default objects themselves: equal at the identity check)
        if (
            pin is not None
            and type(priority) is int
            and type(memory_bytes) is int
            and not memory_bytes
            and type(gang) is int
            and gang == 1
            and pool == "default"
            and not needs
            and footprint is None  # any object: never compared
            and (tags, name, idempotent, timeout, device, device_class, job) == _SUBMIT_DEFAULTS
        ):
            try:
                kernel_op, label, op = self._fn_infos[fn]
            except (KeyError, TypeError):
                kernel_op, label, op = self._fn_info(fn)
            task = Task(
                fn,
                args,
                kwargs,
                name=label,
                op=op,
                priority=priority,
                needs=(),
                idempotent=kernel_op,
                tags=(),
                kernel_op=kernel_op,
                submit=self._clock(),
            )
            if self.timeout is not None:
                task.timeout = self.timeout
            pinned, pool_p = pin
            if pinned is not None:
                task.pinned = pinned
            if pool_p.priority:
                task.priority += pool_p.priority
                task.base_priority = task.priority
                task.effective_priority = task.priority
            return self._admit(task)
        # an int is a number: the common case checks nothing more
        if type(priority) is not int and (
            isinstance(priority, bool)
            or not isinstance(priority, (int, float))
            or priority != priority
        ):
            raise TypeError(f"priority={priority!r} must be a number")
        if needs:
            needs = list(needs)
            for n in needs:
                if not isinstance(n, Future):
                    raise TypeError(f"needs contains {n!r}, not a hal.sched.Future")
        if type(memory_bytes) is not int or memory_bytes < 0:
            if (
                isinstance(memory_bytes, bool)
                or not isinstance(memory_bytes, int)
                or memory_bytes < 0
            ):
                raise ValueError(f"memory_bytes={memory_bytes!r} must be an integer >= 0")
        if isinstance(tags, str):
            tags = (tags,)
        tag_t = tuple(str(t) for t in tags) if tags else ()
        task_timeout = self.timeout if timeout is None else self._check_timeout(timeout)
        if device is None and device_class is None and pool == "default" and self._default_pin:
            pinned, pool_p = self._default_pin  # the common case, resolved once
        else:
            pinned, pool_p = self._pinning(pool, device, device_class)
        if type(gang) is not int or gang < 1:
            if isinstance(gang, bool) or not isinstance(gang, int) or gang < 1:
                raise ValueError(f"gang={gang!r} must be an integer >= 1")
        kernel_op = getattr(fn, "__module__", "").startswith("hal.kernels")  # _is_kernel_op(fn)
        fn_name = getattr(fn, "__name__", _MISSING)
        label = str(name or (fn_name if fn_name is not _MISSING else "task"))
        if gang > 1:
            if kernel_op:
                raise ValueError(
                    f"gang={gang} needs a function of a TaskContext, not the hal.kernels op {label!r}"
                )
            cands = [d for d in self.devices if pinned is None or d in pinned]
            if gang > len(cands):
                raise SchedulerError(
                    f"task {label!r} asks for gang={gang} devices; only {len(cands)} may take it "
                    f"({', '.join(map(str, cands)) or 'none'})"
                )
        if job is not None and pool_p.max_cards is not None and gang > pool_p.max_cards:
            raise SchedulerError(
                f"task {label!r} asks for gang={gang} devices; pool {pool!r} allows a job max_cards={pool_p.max_cards}"
            )
        if job is not None and pool_p.max_memory is not None and memory_bytes > pool_p.max_memory:
            raise SchedulerError(
                f"task {label!r} needs memory_bytes={memory_bytes}; pool {pool!r} allows a job "
                f"max_memory={pool_p.max_memory}"
            )
        op = getattr(fn, "__qualname__", None) or type(fn).__name__
        if footprint is not None:
            op = f"{op}[{footprint}]"
        task = Task(
            fn,
            args,
            kwargs,  # a fresh dict already (**kwargs)
            name=name
            if type(name) is str and name
            else str(name or (fn_name if fn_name is not _MISSING else op)),
            op=op,
            priority=priority,
            needs=needs,
            idempotent=kernel_op if idempotent is None else bool(idempotent),
            tags=tag_t,
            kernel_op=kernel_op,
            submit=self._clock(),
        )
        # the class defaults hold for the common case: set only what differs
        if memory_bytes:
            task.memory_bytes = memory_bytes
        if task_timeout is not None:
            task.timeout = task_timeout
        if pinned is not None:
            task.pinned = pinned
        if gang != 1:
            task.gang = gang
        if pool != "default":
            task.pool = pool
        if job is not None:
            task.job = str(job)
        if pool_p.priority:
            task.priority += pool_p.priority
            task.base_priority = task.priority
            task.effective_priority = task.priority
        return self._admit(task)

    def _fn_info(self, fn: Callable[..., Any]) -> tuple[bool, str, str]:
        """Return ``(is a hal.kernels op, default task name, op)`` of ``fn``, kept per function
        (a few hundred at most) when it is hashable."""
        kernel_op = getattr(fn, "__module__", "").startswith("hal.kernels")  # _is_kernel_op(fn)
        fn_name = getattr(fn, "__name__", _MISSING)
        op = getattr(fn, "__qualname__", None) or type(fn).__name__
        info = (kernel_op, str(fn_name if fn_name is not _MISSING else op), op)
        infos = self._fn_infos
        if len(infos) >= 256:
            infos.clear()
        try:
            infos[fn] = info
        except TypeError:  # an unhashable callable: nothing kept
            pass
        return info

    def _pinning(
        self, pool: str, device: hal.Device | str | None, device_class: str | None
    ) -> tuple[frozenset[hal.Device] | None, Pool]:
        """Return the devices a task may use (None: any) from its pool, ``device=`` and ``device_class=``."""
        p = self.pools.get(pool) if isinstance(pool, str) else None
        if p is None:
            raise ValueError(
                f"pool={pool!r} is not one of this scheduler's pools ({', '.join(self.pools)})"
            )
        allowed: set[hal.Device] | None = None
        if p.devices is not None:
            allowed = {d for d in self.devices if str(d) in p.devices}
        if device is not None:
            d = _resolve_device(device)
            if d not in self._running:
                raise ValueError(
                    f"device={d} is not in this scheduler's pool ({', '.join(map(str, self.devices))})"
                )
            if allowed is not None and d not in allowed:
                raise SchedulerError(
                    f"device={d} is not a device of pool {pool!r} ({', '.join(p.devices or ())})"
                )
            allowed = {d}
        if device_class is not None:
            if not isinstance(device_class, str):
                raise TypeError(f"device_class={device_class!r} must be a string")
            of_class = {d for d in self.devices if device_class in _device_classes(d)}
            if not of_class:
                raise SchedulerError(
                    f"device_class={device_class!r} matches none of {', '.join(map(str, self.devices))}"
                )
            allowed = of_class if allowed is None else allowed & of_class
            if not allowed:
                raise SchedulerError(
                    f"device_class={device_class!r} leaves no device for the task (pinned to {device})"
                )
        return (None if allowed is None else frozenset(allowed)), p

    def _admit(self, task: Task) -> Future:
        if not task.deps:  # the fast path: ready at once, one pass under the lock
            if task.args:
                task.nbytes = self._input_bytes(task)
            big = self._lock
            _take_lock(big)
            try:
                if self._closed:
                    raise SchedulerError("the scheduler is closed")
                self._tasks.append(task)
                self._admitted += 1
                task.ready_t = self._clock()
                self._push(task)
            finally:
                big.release()
            return task.future
        with self._cond:
            if self._closed:
                raise SchedulerError("the scheduler is closed")
            self._tasks.append(task)
            self._admitted += 1
            if self.priority_inheritance:
                for f in task.deps:
                    self._inherit(f.task, task.priority)
        pending = [f for f in task.deps if not f.done()]
        if not pending:
            self._make_ready(task)
        else:
            remaining = [len(pending)]
            lock = threading.Lock()

            def dep_done(_f: Future) -> None:
                with lock:
                    remaining[0] -= 1
                    last = remaining[0] == 0
                if last:
                    self._make_ready(task)

            for f in pending:
                f.add_done_callback(dep_done)
        return task.future

    def _inherit(self, dep: Task, priority: float) -> None:
        """Lift ``dep`` (and its own unfinished dependencies) to ``priority`` (under the lock)."""
        stack = [dep]
        while stack:
            t = stack.pop()
            if t.priority >= priority or t.state not in ("pending", "ready"):
                continue
            t.priority = priority
            if t.state == "ready":
                self.policy.reprioritize(t)
            stack.extend(f.task for f in t.deps if not f.done())

    def submit_graph(self, graph: Graph) -> dict[str, Future]:
        """Submit every task of ``graph`` (a DAG with data dependencies); return futures by name.

        With the ``heft`` policy the whole graph is planned first (HEFT: upward ranks,
        earliest finish with insertion, transfer costs from measured links) and each
        task runs on its planned device; other policies place tasks as they become ready.
        """
        if not isinstance(graph, Graph):
            raise TypeError(f"graph={graph!r} is not a hal.sched.Graph")
        order = graph.topological()
        pinning = {
            node.name: self._pinning(node.pool, None, None) for node in order
        }  # bad pools raise first
        plan = None
        if self.policy.name == "heft":
            plan = plan_graph(graph, self.devices, self.model, self.links)
        futures: dict[str, Future] = {}
        for node in order:
            args = [futures[a.name] if isinstance(a, Graph.Node) else a for a in node.args]
            needs = [futures[n.name] for n in node.needs]
            kernel_op = _is_kernel_op(node.fn)
            task = Task(
                node.fn,
                args,
                dict(node.kwargs),
                name=node.name,
                op=node.op,
                priority=node.priority,
                needs=needs,
                idempotent=kernel_op if node.idempotent is None else node.idempotent,
                tags=node.tags,
                kernel_op=kernel_op,
                submit=self.now(),
            )
            task.pinned, pool_p = pinning[node.name]
            task.pool = node.pool
            task.priority += pool_p.priority
            task.base_priority = task.effective_priority = task.priority
            if plan is not None:
                task.planned = plan.placements[node.name].processor
                task.plan_rank = plan.ranks[node.name]
            futures[node.name] = self._admit(task)
        return futures

    def _make_ready(self, task: Task) -> None:
        failed = [f for f in task.deps if f.exception() is not None]
        if failed:
            names = ", ".join(repr(f.task.name) for f in failed)
            self._fail(
                task,
                DependencyError(f"task {task.name!r} did not run: its dependency {names} failed"),
            )
            return
        task.nbytes = self._input_bytes(task)
        with self._cond:
            if task.ready_t is None:
                task.ready_t = self.now()
            self._push(task)

    def _push(self, task: Task) -> None:
        """Hand a ready task to the policy (under the lock), or fail it if nowhere can run it."""
        devs = self._eligible(task)
        if len(devs) < task.gang or not devs:
            self._fail_locked(task)
            return
        task.state = "ready"
        if task.gang > 1:
            self._gangs.append(task)
            self._notify_all()
            return
        if self.short_threshold is not None:
            task.short = min(self.estimate(task, d) for d in devs) <= self.short_threshold
        policy = self.policy
        policy.placed = None
        self._eligible_memo = (task, devs)  # the policy asks again: same lock, same answer
        try:
            policy.push(task)
        finally:
            self._eligible_memo = None
        placed = policy.placed
        rec = None if placed is None else self._recs.get(placed)
        if rec is None:  # a shared queue: any worker may take it
            self._note_depths()
            self._notify_all()
            return
        if _tracer() is None:  # _note_depths(placed), inlined: only its queue grew
            n = policy.depth(placed)
            st = rec.stats
            if n > st.max_depth:
                st.max_depth = n
        else:
            self._note_depths(placed)
        if not self._n_waiting:  # every worker is busy: each looks at the queues before it waits
            return
        parked = rec.parked
        while parked:
            parked.pop().release()
        if rec.running:  # it waits behind running work: an idle device may take it
            self._wake_idle(placed)

    def _wake_idle(self, busy: hal.Device) -> None:
        """Wake the waiting workers of idle devices other than ``busy`` (they may steal from its queue)."""
        if not self._n_waiting:
            return
        running, held = self._running, self._held
        for d, parked in self._parked.items():
            if parked and d is not busy and not running[d] and d not in held:
                while parked:
                    parked.pop().release()

    def _notify_all(self) -> None:
        """Wake every worker and every waiter of the scheduler (under the lock)."""
        self._cond.notify_all()
        for parked in self._parked.values():
            while parked:
                parked.pop().release()

    def _park(self, device: hal.Device, me: Any, timeout: float) -> None:
        """Wait (holding the scheduler's lock once) until a task for ``device`` may be there or
        ``timeout`` passes: what ``Condition.wait`` does, without its per-wait allocations."""
        me.acquire(False)  # held: a release from an earlier, timed-out park is cleared
        parked = self._parked[device]
        parked.append(me)
        self._n_waiting += 1
        self._lock.release()
        try:
            me.acquire(True, timeout)
        finally:
            _take_lock(self._lock)
            self._n_waiting -= 1
            if me in parked:  # timed out: nobody popped it
                parked.remove(me)

    def _fail_locked(self, task: Task) -> None:
        why = []
        for d in self.devices:
            if d in task.excluded:
                why.append(f"{d} failed this task")
            elif not self.health.usable(d):
                why.append(f"{d} evicted ({self.health.reason(d)})")
            elif d in self._drained:
                why.append(f"{d} drained")
            elif task.memory_bytes > d.total_memory:
                why.append(f"{d} holds {d.total_memory} bytes, the task needs {task.memory_bytes}")
            elif task.pinned is not None and d not in task.pinned:
                why.append(f"{d} is outside the task's pinning")
        if task.gang > 1:
            why.append(f"it needs gang={task.gang} devices at once")
        if task.excluded:
            last = task.device
            exc: BaseException = DeviceFailedError(
                f"task {task.name!r} failed on {last} and no other device can take it ({'; '.join(why)})",
                device=str(last),
                task=task.name,
            )
        else:
            exc = SchedulerError(f"no device can run task {task.name!r}: {'; '.join(why)}")
        threading.Thread(target=self._fail, args=(task, exc), daemon=True).start()

    def _fail(self, task: Task, exc: BaseException) -> None:
        task.state = "cancelled" if isinstance(exc, TaskCancelledError) else "failed"
        task.error = f"{type(exc).__name__}: {exc}"
        self._settle(task, None, exc)

    def _settle(self, task: Task, result: Any = None, exc: BaseException | None = None) -> None:
        """Finish ``task``'s future (once: a second outcome is dropped) and count it out of :meth:`wait`."""
        if task.future._finish(result, exc):
            with self._done_lock:
                self._settled += 1
                if self._settled == self._admitted:
                    self._done_cond.notify_all()  # wait() and close(): no worker waits for this

    # -- running ---------------------------------------------------------------------------------
    def _worker(self, lane: _Lane) -> None:
        """Serve ``lane`` (a device's worker slot): take a task, run it, and take the next one in
        the critical section where the last one ended (one lock pass per task while work is
        queued)."""
        me = threading.Lock()  # what this worker blocks on while it waits for work
        nxt: _Next | None = None
        lock = self._lock
        device, slot = lane.device, lane.slot
        while True:
            if nxt is None:
                _take_lock(lock)
                try:
                    while True:
                        if self._stop:
                            return
                        task = self._take(lane)
                        if task is not None:
                            break
                        self._park(device, me, 0.05 if self._mem_waiting else 0.1)
                    nxt = task, self._dispatch(task, lane)
                finally:
                    lock.release()
            task, begun = nxt
            if task.timeout is None and task.gang == 1:  # what _run does for it, without the call
                nxt = self._execute(task, device, begun[1], lane)
            else:
                nxt = self._run(task, device, slot, begun, lane=lane)

    def _take(self, lane: _Lane) -> Task | None:
        """Return the task ``lane``'s worker runs next, removed from its queue, or None (under
        the lock; never waits)."""
        if self._mem_waiting and (self._mem_kick or self.now() >= self._mem_next):
            self._retry_memory_waiters()
        device = lane.device
        if (
            lane.track.state is DeviceState.EVICTED  # not health.usable(device)
            or (self._drained and device in self._drained)
            or (self._held and device in self._held)
        ):
            return None
        task: Task | None
        if not self._gangs:  # the common case
            task = self.policy.pop(device)
            if task is None or task.job is None or self._quota_ok(task, 1):
                return task
            self._quota_waiting.append(task)  # its job is at its quota: later
        while True:
            task = None
            reserved = False
            if self._gangs:
                task, reserved = self._claim_gang(device)
            if task is None and not reserved:
                task = self.policy.pop(device)
                if task is not None and task.job is not None and not self._quota_ok(task, 1):
                    self._quota_waiting.append(task)  # its job is at its quota: later
                    continue
            return task

    def _dispatch(self, task: Task, lane: _Lane) -> _Begun:
        """Begin ``task`` taken by ``lane``'s worker (under the lock, where it was taken)."""
        if _tracer() is not None:  # a pop grows no queue: only the timeline's counter
            self._note_depths(lane.device)
        if task.gang > 1 or task.job is not None:
            return self._begin_streams(task, lane.device, lane.slot)
        # _begin_streams of a single-device task outside any job's quota, inlined
        running = lane.running
        if not running:
            lane.stats.busy_since = self._clock()
        running.append(task)
        task.state = "running"
        task.device = lane.device
        task.slot = lane.slot
        task.attempts += 1
        return lane.begun

    def _idle(self, d: hal.Device) -> bool:
        return not self._running[d] and d not in self._held

    def _claim_gang(self, device: hal.Device) -> tuple[Task | None, bool]:
        """Start a waiting gang task on ``device`` and idle devices if it can have them all now.

        All of a gang's devices are taken at once under the lock (no gang ever holds some
        and waits for others: crossing gangs cannot deadlock). The head gang (highest
        priority, then oldest) reserves its devices: they take no new single tasks until it
        has started, so it cannot starve behind them. Returns ``(task, reserved)``.
        """
        reserved: set[hal.Device] = set()
        for g in sorted(self._gangs, key=lambda t: (-t.priority, t.seq)):
            devs = self.eligible(g)
            if len(devs) < g.gang:
                self._gangs.remove(g)
                self._fail_locked(g)
                continue
            free = [d for d in devs if d not in reserved and self._idle(d)]
            if device in free and len(free) >= g.gang and self._quota_ok(g, g.gang):
                self._gangs.remove(g)
                chosen = [device, *[d for d in free if d != device][: g.gang - 1]]
                g.gang_devices = chosen
                self._held.update(chosen)
                return g, False
            if not reserved:
                reserved = set(devs)
        return None, device in reserved

    def _quota_ok(self, task: Task, cards: int) -> bool:
        if task.job is None:
            return True
        p = self.pools[task.pool]
        key = (task.pool, task.job)
        if p.max_cards is not None and self._job_cards.get(key, 0) + cards > p.max_cards:
            return False
        return not (
            p.max_memory is not None
            and self._job_mem.get(key, 0) + task.memory_bytes > p.max_memory
        )

    def _begin(self, task: Task, device: hal.Device, slot: int) -> list[hal.Device]:
        """Mark ``task`` running on its device(s) (under the lock); return them."""
        devs = list(task.gang_devices) if task.gang > 1 else [device]
        now = self._clock()
        for d in devs:
            running = self._running[d]
            if not running:
                self._stats[d].busy_since = now
            running.append(task)
        if task.job is not None:
            key = (task.pool, task.job)
            self._job_cards[key] = self._job_cards.get(key, 0) + len(devs)
            self._job_mem[key] = self._job_mem.get(key, 0) + task.memory_bytes
        task.state = "running"
        task.device = device
        task.slot = slot
        task.attempts += 1
        return devs

    def _release(self, task: Task, devs: Sequence[hal.Device], end: float) -> None:
        """Undo :meth:`_begin` (under the lock): devices, busy time, quota; wake the workers."""
        held = self._held
        for d in devs:
            running = self._running[d]
            if task in running:
                running.remove(task)
                if not running:
                    st = self._stats[d]
                    st.busy += end - st.busy_since
            if held:
                held.discard(d)
        if task.job is not None:
            key = (task.pool, task.job)
            self._job_cards[key] = self._job_cards.get(key, 0) - len(devs)
            self._job_mem[key] = self._job_mem.get(key, 0) - task.memory_bytes
        if self._quota_waiting:
            waiting, self._quota_waiting = self._quota_waiting, []
            for t in waiting:
                self._push(t)
        self.policy.done(task, devs[0])
        self._mem_kick = True
        if self._gangs or self._mem_waiting:  # they may start now: every worker looks
            self._notify_all()
        else:  # drain() and the released devices' waiting workers; new work wakes the others
            if self._cond_waiters:
                self._cond.notify_all()
            if self._n_waiting:
                for d in devs:
                    parked = self._parked[d]
                    while parked:
                        parked.pop().release()
                if self.policy.depth(devs[0]):  # work still queued here: idle devices may take it
                    self._wake_idle(devs[0])

    def _begin_streams(self, task: Task, device: hal.Device, slot: int) -> _Begun:
        """:meth:`_begin` plus the streams the task runs on (under the lock)."""
        devs = self._begin(task, device, slot)
        streams = [self._slot_streams[(device, slot)]]
        if len(devs) > 1:
            streams += [self._slot_streams[(d, 0)] for d in devs[1:]]
        return devs, streams

    def _run(
        self,
        task: Task,
        device: hal.Device,
        slot: int,
        begun: _Begun | None = None,
        *,
        lane: _Lane | None = None,
    ) -> _Next | None:
        """Run ``task`` on ``device`` (a gang: on its devices); with a timeout, under a watchdog.

        ``begun``: what :meth:`_begin_streams` returned when the caller already began the task
        (in the critical section where it took it). ``lane``: the caller is the worker of
        ``(device, slot)``; a single-device task without a timeout that succeeds then takes and
        begins the worker's next task in the critical section where it ends, and returns it.
        """
        if begun is None:
            with self._cond:
                begun = self._begin_streams(task, device, slot)
        devs, streams = begun
        if task.timeout is None:
            if task.gang > 1:
                self._execute_gang(task, device, streams)
                return None
            return self._execute(task, device, streams, lane)
        body = self._execute_gang if task.gang > 1 else self._execute
        finished = threading.Event()

        def target() -> None:
            try:
                body(task, device, streams)
            finally:
                finished.set()

        threading.Thread(target=target, name=f"hal-sched-task-{task.id}", daemon=True).start()
        if not finished.wait(task.timeout):
            self._time_out(task, device, slot, devs)
        return None

    def _time_out(self, task: Task, device: hal.Device, slot: int, devs: list[hal.Device]) -> None:
        """Give up on a task past its timeout: fresh streams, device(s) re-probed, future fails."""
        with self._cond:
            if task not in self._running[device]:
                return  # it finished just now
            task.timed_out = True
            keys = [(device, slot)] + [(d, 0) for d in devs[1:]]
            for k in keys:
                self._abandoned.append(self._slot_streams[k])
                self._slot_streams[k] = k[0].create_stream()
                if k[1] == 0:
                    self._streams[k[0]] = self._slot_streams[k]
                self._lanes[k].begun = ([k[0]], [self._slot_streams[k]])
            end = self.now()
            self._release(task, devs, end)
            self._stats[device].timeouts += 1
            task.end_t = end
            where = ", ".join(map(str, devs))
            exc = TaskTimeoutError(
                f"task {task.name!r} timed out after {task.timeout:g} s on {'devices ' if len(devs) > 1 else 'device '}"
                f"{where}: its stream was abandoned and the device re-probed",
                device=str(device),
                task=task.name,
                timeout=float(task.timeout or 0.0),
            )
            task.state = "timeout"
            task.error = f"TaskTimeoutError: {exc}"
        tr = hal.tracer()
        if tr is not None:
            tr.instant(f"{device} sched", "timeout", "task", {"task": task.id, "name": task.name})
        for d in devs:
            self.health.probe_now(d)
        self._settle(task, None, exc)

    def _end(
        self,
        task: Task,
        devs: Sequence[hal.Device],
        streams: Sequence[hal.Stream],
        end: float,
        moved: tuple[float, int] | None = None,
        lane: _Lane | None = None,
    ) -> tuple[bool, _Next | None]:
        """Finish the bookkeeping of a task that returned; ``(False, None)`` when its watchdog gave
        up on it.

        ``moved``: ``(transfer seconds, bytes)`` of a single-device task, added to its device's
        counters in the same critical section. ``lane``: the worker of ``devs[0]`` that ran it
        (a success): its next task is taken and begun in this critical section too, and returned.
        """
        nxt: _Next | None = None
        lock = self._lock
        _take_lock(lock)
        try:
            if moved is not None:
                st = self._stats[devs[0]] if lane is None else lane.stats
                st.tasks += 1
                if moved[1]:
                    st.transfer += moved[0]
                    st.bytes_moved += moved[1]
            if task.timed_out:
                late = True
            else:
                late = False
                if (
                    lane is None
                    or task.job is not None
                    or self._held
                    or self._quota_waiting
                    or self._gangs
                    or self._mem_waiting
                    or self._cond_waiters
                ):
                    self._release(task, devs, end)
                else:  # _release of a single-device task when nothing else waits, inlined
                    running = lane.running
                    running.remove(task)
                    if not running:
                        st = lane.stats
                        st.busy += end - st.busy_since
                    self.policy.done(task, lane.device)
                    self._mem_kick = True
                    if self._n_waiting:
                        parked = lane.parked
                        while parked:
                            parked.pop().release()
                        if self.policy.depth(lane.device):  # idle devices may take queued work
                            self._wake_idle(lane.device)
                # no dependant or callback waits for it (they must see it done before the next
                # pop: a dependant made ready by its end may be the next task)
                if lane is not None and not self._stop and task.future._callbacks is None:
                    t = self._take(lane)
                    if t is not None:
                        nxt = t, self._dispatch(t, lane)
        finally:
            lock.release()
        if late:  # its streams were abandoned: close them now that it came back
            for s in streams:
                try:
                    s.close()
                except hal.HalError:
                    pass
            return False, None
        return True, nxt

    def _execute_gang(self, task: Task, device: hal.Device, streams: list[hal.Stream]) -> None:
        devs = task.gang_devices
        task.start_t = start = self.now()
        ctx = TaskContext(self, device, streams[0], task, devs, streams)
        try:
            result = task.fn(ctx, *self._inputs(task), **task.kwargs)
            if isinstance(result, _GeneratorType):
                result = self._drive(result, device, task)
            for s in streams:
                s.synchronize()
            error: BaseException | None = None
        except BaseException as exc:  # noqa: BLE001 - routed to the future
            error, result = exc, None
            for s in streams:
                try:
                    s.synchronize()
                except hal.HalError:
                    pass
        finally:
            ctx._close()
        end = task.end_t = self.now()
        with self._cond:
            for d in devs:
                self._stats[d].tasks += 1
        if not self._end(task, devs, streams, end)[0]:
            return
        self._trace(task, device, start, end, error)
        if error is None:
            task.state = "done"
            self._settle(task, result)
            return
        if isinstance(error, hal.DeviceError):
            bad = next((d for d in devs if str(d) == getattr(error, "device", None)), device)
            self._stats[bad].failures += 1
            self.health.report(bad, False, f"task {task.name!r}: {error}")
            error = DeviceFailedError(
                f"gang task {task.name!r} failed on device {bad} (of {', '.join(map(str, devs))}) and is not "
                f"retried: {type(error).__name__}: {error}",
                device=str(bad),
                task=task.name,
            )
        self._fail(task, error)

    def _yield_point(self, device: hal.Device, current: Task) -> int:
        ran = 0
        while True:
            with self._cond:
                if not self.health.usable(device) or device in self._drained or current.timed_out:
                    break
                if (
                    self.preemption_grace
                    and self.now() - (current.start_t or 0.0) < self.preemption_grace
                ):
                    break
                cand = self.policy.peek(device)
                if cand is None or cand.priority <= current.priority:
                    break
                task = self.policy.pop(device)
                self._note_depths()
            if task is None:
                break
            current.preemptions += 1
            self._run(task, device, current.slot)
            ran += 1
        return ran

    def _drive(self, gen: Generator[Any, Any, Any], device: hal.Device, task: Task) -> Any:
        try:
            while True:
                next(gen)
                self._yield_point(device, task)
        except StopIteration as stop:
            return stop.value

    def _execute(
        self, task: Task, device: hal.Device, streams: list[hal.Stream], lane: _Lane | None = None
    ) -> _Next | None:
        """Run a single-device task and settle it; ``lane``: see :meth:`_end` (its next task)."""
        stream = streams[0]
        task.start_t = start = self._clock()
        moved = 0
        transfer = 0.0
        try:
            if task.memory_bytes:
                free = free_memory(device)
                if free is not None and free < task.memory_bytes:
                    raise hal.OutOfMemoryError(
                        f"task {task.name!r} needs {task.memory_bytes} bytes; {free} free",
                        device=str(device),
                    )
            args: list[Any] | tuple[()] = ()
            if task.args:
                args = []
                for a in self._inputs(task):
                    if isinstance(a, hal.Array) and a.device != device:
                        dst = device.alloc(a.nbytes).view(a.dtype, a.shape)
                        hal.copy(dst, a, stream=stream)
                        moved += a.nbytes
                        a = dst
                    args.append(a)
            if moved:
                stream.synchronize()
                transfer = self._clock() - start
            enqueued = stream.enqueue_count
            if task.kernel_op:
                result = task.fn(*args, stream=stream, **task.kwargs)
            else:
                ctx = TaskContext(self, device, stream, task)
                result = task.fn(ctx, *args, **task.kwargs)
                if isinstance(result, _GeneratorType):
                    result = self._drive(result, device, task)
            if stream.enqueue_count != enqueued:  # nothing enqueued: nothing to wait for
                stream.synchronize()
            error: BaseException | None = None
        except BaseException as exc:  # noqa: BLE001 - routed to the future or a retry
            error = exc
            result = None
            try:
                stream.synchronize()  # clear sticky stream errors before the next task
            except hal.HalError:
                pass
        end = self._clock()
        task.end_t = end
        if (
            moved or task.bytes_moved
        ):  # class defaults 0: set when this or an earlier try moved data
            task.transfer_s = transfer
            task.bytes_moved = moved
        if error is None and lane is not None:
            ok, nxt = self._end(task, lane.begun[0], streams, end, (transfer, moved), lane)
        else:
            ok, nxt = self._end(task, [device], streams, end, (transfer, moved))
        if not ok:
            return None
        if _tracer() is not None:
            self._trace(task, device, start, end, error)
        if error is None:
            self.model.observe(
                task.op,
                self._names[device] if lane is None else lane.name,
                task.nbytes,
                end - start - transfer,
            )
            state = self.health.state(device) if lane is None else lane.track.state
            if state is DeviceState.SUSPECT:
                self.health.report(device, True)
            task.state = "done"
            if task.future._finish(result, None):  # _settle(task, result), inlined
                with self._done_lock:
                    self._settled += 1
                    if self._settled == self._admitted:
                        self._done_cond.notify_all()
            return nxt
        if isinstance(error, hal.OutOfMemoryError) and not isinstance(error, DeviceFailedError):
            self._out_of_memory(task, device, error)
            return None
        if not isinstance(error, hal.DeviceError):
            self._fail(task, error)
            return None
        self._stats[device].failures += 1
        self.health.report(device, False, f"task {task.name!r}: {error}")
        if task.idempotent and task.attempts <= self.retries:
            with self._cond:
                task.excluded = task.excluded | {device}
                task.start_t = task.end_t = None
                self._push(task)
            return None
        why = (
            "it is not idempotent"
            if not task.idempotent
            else f"its retry budget ({self.retries}) is spent"
        )
        self._fail(
            task,
            DeviceFailedError(
                f"task {task.name!r} failed on device {device} and is not retried ({why}): "
                f"{type(error).__name__}: {error}",
                device=str(device),
                task=task.name,
            ),
        )
        return None

    # -- memory back-pressure ----------------------------------------------------------------------
    def _out_of_memory(self, task: Task, device: hal.Device, error: hal.OutOfMemoryError) -> None:
        """A full device is back-pressure: place ``task`` elsewhere or let it wait; never a health report."""
        now = self.now()
        with self._cond:
            self._stats[device].oom += 1
            task.oom_waits += 1
            task.attempts -= 1  # no retry budget spent: the device did not fail
            if task.oom_since is None:
                task.oom_since = now
            elif now - task.oom_since > self.memory_wait:
                waited = now - task.oom_since
                task.error = f"OutOfMemoryError: {error}"
                exc = hal.OutOfMemoryError(
                    f"task {task.name!r} found no device with room for {self.memory_wait:g} s "
                    f"(waited {waited:.1f} s, {task.oom_waits} tries; last: {error})",
                    device=str(device),
                )
                threading.Thread(target=self._fail, args=(task, exc), daemon=True).start()
                return
            task.start_t = task.end_t = None
            task.mem_excluded = task.mem_excluded | {device}
            if self.eligible(task):
                self._push(task)  # another device has room now, perhaps
                return
            task.mem_excluded = frozenset()
            task.state = "ready"
            self._mem_waiting.append(task)
            self._mem_next = now + 0.05
            self._notify_all()

    def _retry_memory_waiters(self) -> None:
        """Hand tasks that waited for memory back to the policy (under the lock)."""
        waiting, self._mem_waiting = self._mem_waiting, []
        self._mem_kick = False
        for t in waiting:
            self._push(t)

    # -- health ------------------------------------------------------------------------------------
    def _health_changed(self, device: hal.Device, old: DeviceState, new: DeviceState) -> None:
        with self._cond:
            self._health_gen += 1  # the cached list of usable devices is stale
        tr = hal.tracer()
        if tr is not None:
            tr.instant(
                f"{device} sched",
                f"{new.value}",
                "health",
                {"from": old.value, "reason": self.health.reason(device)},
            )
        if new is DeviceState.EVICTED:
            self._stats[device].evictions += 1
            self._requeue(device)
        with self._cond:
            self._notify_all()

    def _requeue(self, device: hal.Device) -> int:
        with self._cond:
            tasks = self.policy.remove(device)
            for t in tasks:
                self._push(t)
            return len(tasks)

    def drain(self, device: hal.Device | str, timeout: float | None = None) -> int:
        """Stop using ``device``: move its queued tasks elsewhere and wait for its running one.

        Returns the number of tasks moved. :meth:`admit` puts the device back.
        """
        d = _resolve_device(device)
        if d not in self._running:
            raise ValueError(f"device={d} is not in this scheduler's pool")
        with self._cond:
            self._drained.add(d)
            moved = self._requeue(d)
            self._cond_waiters += 1
            try:
                if not self._cond.wait_for(lambda: not self._running[d], timeout):
                    raise TimeoutError(f"{d} still runs a task after {timeout} s")
            finally:
                self._cond_waiters -= 1
        return moved

    def admit(self, device: hal.Device | str) -> None:
        """Undo :meth:`drain`: place tasks on ``device`` again."""
        d = _resolve_device(device)
        with self._cond:
            self._drained.discard(d)
            self._notify_all()

    # -- observing ---------------------------------------------------------------------------------
    def _note_depths(self, device: hal.Device | None = None) -> None:
        """Record queue depth maxima (and the timeline counter); ``device``: only its queue grew."""
        depth = self.policy.depth
        stats = self._stats
        tr = hal.tracer()
        if tr is None:  # the fast path: no names, no dict
            for d in self.devices if device is None else (device,):
                st = stats[d]
                n = depth(d)
                if n > st.max_depth:
                    st.max_depth = n
            return
        depths = {str(d): depth(d) for d in self.devices}
        for d in self.devices:
            st = stats[d]
            st.max_depth = max(st.max_depth, depths[str(d)])
        tr.counter("sched queue depth", depths)

    def _trace(
        self, task: Task, device: hal.Device, start: float, end: float, error: BaseException | None
    ) -> None:
        tr = hal.tracer()
        if tr is None:
            return
        track = f"{device} sched"
        args: dict[str, Any] = {
            "task": task.id,
            "priority": task.priority,
            "effective_priority": round(task.effective_priority, 3),
            "wait_ms": round((start - (task.ready_t or start)) * 1e3, 3),
            "transfer_ms": round(task.transfer_s * 1e3, 3),
            "bytes_moved": task.bytes_moved,
            "attempt": task.attempts,
            "tags": list(task.tags),
        }
        if task.preemptions:
            args["preemptions"] = task.preemptions
        if error is not None:
            args["error"] = f"{type(error).__name__}: {error}"
        tr.complete(track, task.name, "task", start, end, args)
        eps = min(1e-6, max(end - start, 0.0) / 4)
        for f in task.deps:
            dep = f.task
            if dep.device is None or dep.end_t is None or dep.start_t is None:
                continue
            fid = tr.new_flow_id()
            deps_eps = min(1e-6, max(dep.end_t - dep.start_t, 0.0) / 4)
            tr.flow(fid, f"{dep.device} sched", dep.end_t - deps_eps, end=False)
            tr.flow(fid, track, start + eps, end=True)

    def metrics(self) -> dict[str, Any]:
        """Return what a cluster operator watches, overall and per pool.

        ``queue_length`` (tasks ready but not started, gangs and quota waits included),
        ``running``, task counts by state, ``wait_s`` and ``run_s`` (``mean``, ``p50``,
        ``p99``, ``count`` of finished tasks), ``evictions``, ``timeouts``; per device
        ``state``, ``utilization``, ``busy_s``, ``tasks``, ``running``, ``queue_depth``,
        ``evictions``, ``timeouts``, ``failures``, ``out_of_memory``; and the same task figures
        per pool under ``pools``. :meth:`prometheus_text` exposes them for scraping.
        """
        now = self.now()
        with self._cond:
            tasks = list(self._tasks)
            window = max(now - self._t0, 1e-9)
            devices: dict[str, dict[str, Any]] = {}
            for d in self.devices:
                st = self._stats[d]
                busy = st.busy + (now - st.busy_since if self._running[d] else 0.0)
                devices[str(d)] = {
                    "state": self.health.state(d).value,
                    "utilization": min(busy / window, 1.0),
                    "busy_s": busy,
                    "tasks": st.tasks,
                    "running": len(self._running[d]),
                    "queue_depth": self.policy.depth(d),
                    "evictions": st.evictions,
                    "timeouts": st.timeouts,
                    "failures": st.failures,
                    "out_of_memory": st.oom,
                }

        def summary(group: list[Task]) -> dict[str, Any]:
            states: dict[str, int] = {}
            waits, runs = [], []
            for t in group:
                states[t.state] = states.get(t.state, 0) + 1
                if t.start_t is not None and t.ready_t is not None:
                    waits.append(t.start_t - t.ready_t)
                if t.end_t is not None and t.start_t is not None and t.state == "done":
                    runs.append(t.end_t - t.start_t - t.transfer_s)

            def dist(v: list[float]) -> dict[str, float]:
                return {
                    "count": len(v),
                    "mean": sum(v) / len(v) if v else 0.0,
                    "p50": _percentile(v, 0.5),
                    "p99": _percentile(v, 0.99),
                }

            return {
                "queue_length": states.get("ready", 0),
                "running": states.get("running", 0),
                "tasks": states,
                "wait_s": dist(waits),
                "run_s": dist(runs),
                "timeouts": states.get("timeout", 0),
            }

        out = summary(tasks)
        out["policy"] = self.policy.name
        out["evictions"] = sum(v["evictions"] for v in devices.values())
        out["devices"] = devices
        out["pools"] = {}
        for name, p in self.pools.items():
            ps = summary([t for t in tasks if t.pool == name])
            ps["priority"] = p.priority
            ps["devices"] = (
                list(p.devices) if p.devices is not None else [str(d) for d in self.devices]
            )
            out["pools"][name] = ps
        return out

    def prometheus_text(self) -> str:
        """Return :meth:`metrics` in the Prometheus text exposition format (version 0.0.4).

        Serve it from any HTTP handler (``Content-Type: text/plain; version=0.0.4``); no
        ``prometheus_client`` needed. Metric names start with ``hal_sched_``.
        """
        m = self.metrics()
        lines: list[str] = []

        def esc(v: str) -> str:
            return v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")

        def metric(
            name: str, kind: str, help_: str, samples: list[tuple[dict[str, str], float]]
        ) -> None:
            lines.append(f"# HELP hal_sched_{name} {help_}")
            lines.append(f"# TYPE hal_sched_{name} {kind}")
            for labels, value in samples:
                lab = ",".join(f'{k}="{esc(v)}"' for k, v in labels.items())
                lines.append(
                    f"hal_sched_{name}{{{lab}}} {float(value)!r}"
                    if lab
                    else f"hal_sched_{name} {float(value)!r}"
                )

        pools = m["pools"]
        metric(
            "queue_length",
            "gauge",
            "Tasks ready and waiting for a device.",
            [({"pool": p}, v["queue_length"]) for p, v in pools.items()],
        )
        metric(
            "running_tasks",
            "gauge",
            "Tasks running now.",
            [({"pool": p}, v["running"]) for p, v in pools.items()],
        )
        metric(
            "tasks",
            "gauge",
            "Tasks by state (pending, ready, running, done, failed, cancelled, timeout).",
            [
                ({"pool": p, "state": s}, n)
                for p, v in pools.items()
                for s, n in sorted(v["tasks"].items())
            ],
        )
        for key, what in (
            ("wait_s", "Seconds from ready to start"),
            ("run_s", "Seconds of compute per finished task"),
        ):
            name = "wait_seconds" if key == "wait_s" else "run_seconds"
            samples: list[tuple[dict[str, str], float]] = []
            for p, v in pools.items():
                for q in ("p50", "p99"):
                    samples.append(
                        ({"pool": p, "quantile": "0.5" if q == "p50" else "0.99"}, v[key][q])
                    )
            metric(name, "summary", f"{what}.", samples)
            lines.extend(
                f'hal_sched_{name}_count{{pool="{esc(p)}"}} {float(v[key]["count"])!r}'
                for p, v in pools.items()
            )
            lines.extend(
                f'hal_sched_{name}_sum{{pool="{esc(p)}"}} {float(v[key]["mean"] * v[key]["count"])!r}'
                for p, v in pools.items()
            )
        devs = m["devices"]
        metric(
            "device_utilization",
            "gauge",
            "Busy share of the scheduler's lifetime.",
            [({"device": d}, v["utilization"]) for d, v in devs.items()],
        )
        metric(
            "device_busy_seconds_total",
            "counter",
            "Seconds the device ran tasks.",
            [({"device": d}, v["busy_s"]) for d, v in devs.items()],
        )
        metric(
            "device_queue_depth",
            "gauge",
            "Tasks queued for the device.",
            [({"device": d}, v["queue_depth"]) for d, v in devs.items()],
        )
        metric(
            "device_healthy",
            "gauge",
            "1 when the device is HEALTHY, 0.5 SUSPECT, 0 EVICTED.",
            [
                ({"device": d}, {"healthy": 1.0, "suspect": 0.5}.get(v["state"], 0.0))
                for d, v in devs.items()
            ],
        )
        for key, help_ in (
            ("evictions", "Times the device was evicted."),
            ("timeouts", "Tasks that timed out on the device."),
            ("failures", "Task failures counted against the device."),
            ("out_of_memory", "Times a task met the device full."),
        ):
            metric(
                f"device_{key}_total",
                "counter",
                help_,
                [({"device": d}, v[key]) for d, v in devs.items()],
            )
        return "\n".join(lines) + "\n"

    def serve_metrics(self, port: int = 0, host: str = "127.0.0.1") -> str:
        """Serve :meth:`prometheus_text` at ``/metrics`` and :meth:`metrics` as JSON at
        ``/metrics.json`` over HTTP, in a background thread, until :meth:`close`.

        Returns the base URL (``http://127.0.0.1:PORT``; port 0 picks a free one): point
        Prometheus at ``URL/metrics`` and ``hal sched top URL`` at it.
        """
        import http.server
        import json

        if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port < 65536:
            raise ValueError(f"port={port!r} must be an integer in 0..65535")
        sched = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                path = self.path.split("?", 1)[0].rstrip("/")
                if path == "/metrics":
                    body, kind = (
                        sched.prometheus_text().encode(),
                        "text/plain; version=0.0.4; charset=utf-8",
                    )
                elif path == "/metrics.json":
                    body, kind = json.dumps(sched.metrics()).encode(), "application/json"
                else:
                    self.send_error(404, "try /metrics or /metrics.json")
                    return
                self.send_response(200)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                return

        server = http.server.ThreadingHTTPServer((host, port), Handler)
        server.daemon_threads = True
        threading.Thread(target=server.serve_forever, name="hal-sched-metrics", daemon=True).start()
        self._servers.append(server)
        return f"http://{host}:{server.server_address[1]}"

    def records(self) -> list[TaskRecord]:
        """Return a record of every task submitted so far."""
        with self._cond:
            return [t.record() for t in self._tasks]

    def stats(self) -> dict[str, Any]:
        """Summarise per device: state, tasks, busy seconds, utilization, queue depth
        (now and max), transfer seconds, bytes moved, communication share, failures;
        and overall: task counts, makespan, mean wait."""
        now = self.now()
        with self._cond:
            recs = [t.record() for t in self._tasks]
            starts = [r.start for r in recs if r.start is not None]
            ends = [r.end for r in recs if r.end is not None]
            span = (max(ends) - min(starts)) if starts and ends else 0.0
            window = max((max(ends) if ends else now) - self._t0, 1e-9)
            devices = {}
            for d in self.devices:
                st = self._stats[d]
                devices[str(d)] = {
                    "state": self.health.state(d).value,
                    "drained": d in self._drained,
                    "tasks": st.tasks,
                    "busy_s": st.busy,
                    "utilization": min(st.busy / window, 1.0),
                    "queue_depth": self.policy.depth(d),
                    "max_queue_depth": st.max_depth,
                    "transfer_s": st.transfer,
                    "bytes_moved": st.bytes_moved,
                    "communication_share": st.transfer / st.busy if st.busy > 0 else 0.0,
                    "failures": st.failures,
                    "out_of_memory": st.oom,
                }
        waits = [r.wait for r in recs if r.wait is not None]
        states: dict[str, int] = {}
        for r in recs:
            states[r.state] = states.get(r.state, 0) + 1
        return {
            "policy": self.policy.name,
            "tasks": states,
            "makespan_s": span,
            "mean_wait_s": sum(waits) / len(waits) if waits else 0.0,
            "devices": devices,
        }

    # -- lifetime ----------------------------------------------------------------------------------
    def wait(self, timeout: float | None = None) -> None:
        """Block until every submitted task has finished."""
        with self._done_cond:
            if not self._done_cond.wait_for(lambda: self._settled == self._admitted, timeout):
                raise TimeoutError(
                    f"{self._admitted - self._settled} task(s) still outstanding after {timeout} s"
                )

    def close(self, *, cancel: bool = False) -> None:
        """Wait for every task (or, with ``cancel``, fail the queued ones), then stop. Idempotent."""
        with self._cond:
            if self._stop:
                return
            self._closed = True
            if cancel:
                waiting, self._mem_waiting = self._mem_waiting, []
                waiting += self._gangs + self._quota_waiting
                self._gangs, self._quota_waiting = [], []
                for task in self.policy.take_all() + waiting:
                    self._fail(
                        task,
                        TaskCancelledError(f"task {task.name!r} cancelled: the scheduler closed"),
                    )
        self.wait()
        with self._cond:
            self._stop = True
            self._notify_all()
        for t in self._threads:
            t.join()
        for server in self._servers:
            server.shutdown()
            server.server_close()
        self.health.close()
        for s in self._streams.values():
            try:
                s.close()
            except hal.HalError:
                pass

    def __enter__(self) -> Scheduler:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close(cancel=exc[0] is not None)

    def __repr__(self) -> str:
        return f"<hal.sched.Scheduler {self.policy.name} on {', '.join(map(str, self.devices))}>"
