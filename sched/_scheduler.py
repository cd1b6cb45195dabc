"""The scheduler: a worker per device, a policy, health tracking, records and the timeline."""

from __future__ import annotations

import inspect
import threading
import time
from collections.abc import Callable, Generator, Iterable, Sequence
from typing import Any

import hal
from hal.sched._graph import Graph, plan_graph
from hal.sched._health import DeviceState, Health, HealthConfig
from hal.sched._model import Links, PerfModel
from hal.sched._policy import Policy, make_policy
from hal.sched._task import (
    DependencyError,
    DeviceFailedError,
    Future,
    SchedulerError,
    Task,
    TaskCancelledError,
    TaskContext,
    TaskRecord,
)

__all__ = ["Scheduler"]


def _is_kernel_op(fn: Callable[..., Any]) -> bool:
    return getattr(fn, "__module__", "").startswith("hal.kernels")


def _resolve_device(d: object) -> hal.Device:
    if isinstance(d, hal.Device):
        return d
    if isinstance(d, str):
        return hal.device(d)
    raise TypeError(f"device={d!r} is not a hal.Device or a 'backend:index' string")


class _DevStats:
    __slots__ = ("busy", "bytes_moved", "failures", "max_depth", "oom", "tasks", "transfer")

    def __init__(self) -> None:
        self.busy = 0.0
        self.transfer = 0.0
        self.bytes_moved = 0
        self.tasks = 0
        self.failures = 0
        self.max_depth = 0
        self.oom = 0


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
        if isinstance(memory_wait, bool) or not isinstance(memory_wait, (int, float)) or not 0 <= memory_wait < 1e9:
            raise ValueError(f"memory_wait={memory_wait!r} must be a number of seconds >= 0")
        self.memory_wait = float(memory_wait)
        self._mem_waiting: list[Task] = []  # tasks every eligible device was too full for
        self._mem_kick = False  # a task finished since: memory may have been freed
        self._mem_next = 0.0  # when waiting tasks are tried again anyway (memory freed outside)
        self.model = model if model is not None else PerfModel()
        self.links = links if links is not None else Links()
        self._cond = threading.Condition(threading.RLock())
        self._tasks: list[Task] = []
        self._outstanding = 0
        self._drained: set[hal.Device] = set()
        self._running: dict[hal.Device, list[Task]] = {d: [] for d in devs}
        self._stats = {d: _DevStats() for d in devs}
        self._closed = False
        self._stop = False
        self._t0 = time.perf_counter()
        self._streams = {d: d.create_stream() for d in devs}
        self.policy.attach(self)
        self.health = Health(devs, health or HealthConfig(), self._health_changed)
        self._threads = [
            threading.Thread(target=self._worker, args=(d,), name=f"hal-sched-{d}", daemon=True) for d in devs
        ]
        for t in self._threads:
            t.start()

    # -- the PolicyEnv side ------------------------------------------------------------------
    def now(self) -> float:
        """Return the scheduler's clock (``time.perf_counter()``)."""
        return time.perf_counter()

    def eligible(self, task: Task) -> list[hal.Device]:
        """Return the devices ``task`` may run on now."""
        return [
            d for d in self.devices
            if self.health.usable(d) and d not in self._drained and d not in task.excluded
            and d not in task.mem_excluded and task.memory_bytes <= d.total_memory
        ]

    def estimate(self, task: Task, device: hal.Device) -> float:
        """Return the model's compute-time estimate of ``task`` on ``device``."""
        return self.model.estimate(task.op, device, task.nbytes)[0]

    def explore(self, task: Task, devices: Sequence[hal.Device]) -> hal.Device | None:
        """Return a device whose history for ``task`` is stale (to measure again), or None."""
        for d in devices:
            if self.model.stale(task.op, d, task.nbytes):
                self.model.touch(task.op, d, task.nbytes)
                return d
        return None

    def transfer_cost(self, task: Task, device: hal.Device) -> float:
        """Return the estimated seconds to copy ``task``'s inputs that live elsewhere."""
        total = 0.0
        for a in self._inputs(task):
            if isinstance(a, hal.Array) and a.device != device:
                total += self.links.cost(a.device, device, a.nbytes)
        return total

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
        """
        if not callable(fn):
            raise TypeError(f"fn={fn!r} is not callable")
        if isinstance(priority, bool) or not isinstance(priority, (int, float)) or priority != priority:
            raise TypeError(f"priority={priority!r} must be a number")
        needs = list(needs)
        for n in needs:
            if not isinstance(n, Future):
                raise TypeError(f"needs contains {n!r}, not a hal.sched.Future")
        if isinstance(memory_bytes, bool) or not isinstance(memory_bytes, int) or memory_bytes < 0:
            raise ValueError(f"memory_bytes={memory_bytes!r} must be an integer >= 0")
        if isinstance(tags, str):
            tags = (tags,)
        tag_t = tuple(str(t) for t in tags)
        kernel_op = _is_kernel_op(fn)
        op = getattr(fn, "__qualname__", None) or type(fn).__name__
        if footprint is not None:
            op = f"{op}[{footprint}]"
        task = Task(
            fn, args, dict(kwargs), name=str(name or getattr(fn, "__name__", op)), op=op, priority=priority, needs=needs,
            idempotent=kernel_op if idempotent is None else bool(idempotent), tags=tag_t,
            kernel_op=kernel_op, submit=self.now(),
        )
        task.memory_bytes = memory_bytes
        return self._admit(task)

    def _admit(self, task: Task) -> Future:
        with self._cond:
            if self._closed:
                raise SchedulerError("the scheduler is closed")
            self._tasks.append(task)
            self._outstanding += 1
        task.future.add_done_callback(self._finished)
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

    def submit_graph(self, graph: Graph) -> dict[str, Future]:
        """Submit every task of ``graph`` (a DAG with data dependencies); return futures by name.

        With the ``heft`` policy the whole graph is planned first (HEFT: upward ranks,
        earliest finish with insertion, transfer costs from measured links) and each
        task runs on its planned device; other policies place tasks as they become ready.
        """
        if not isinstance(graph, Graph):
            raise TypeError(f"graph={graph!r} is not a hal.sched.Graph")
        order = graph.topological()
        plan = None
        if self.policy.name == "heft":
            plan = plan_graph(graph, self.devices, self.model, self.links)
        futures: dict[str, Future] = {}
        for node in order:
            args = [futures[a.name] if isinstance(a, Graph.Node) else a for a in node.args]
            needs = [futures[n.name] for n in node.needs]
            kernel_op = _is_kernel_op(node.fn)
            task = Task(
                node.fn, args, dict(node.kwargs), name=node.name, op=node.op, priority=node.priority,
                needs=needs, idempotent=kernel_op if node.idempotent is None else node.idempotent,
                tags=node.tags, kernel_op=kernel_op, submit=self.now(),
            )
            if plan is not None:
                task.planned = plan.placements[node.name].processor
                task.plan_rank = plan.ranks[node.name]
            futures[node.name] = self._admit(task)
        return futures

    def _make_ready(self, task: Task) -> None:
        failed = [f for f in task.deps if f.exception() is not None]
        if failed:
            names = ", ".join(repr(f.task.name) for f in failed)
            self._fail(task, DependencyError(f"task {task.name!r} did not run: its dependency {names} failed"))
            return
        task.nbytes = sum(a.nbytes for a in self._inputs(task) if isinstance(a, hal.Array))
        with self._cond:
            if task.ready_t is None:
                task.ready_t = self.now()
            self._push(task)

    def _push(self, task: Task) -> None:
        """Hand a ready task to the policy (under the lock), or fail it if nowhere can run it."""
        if not self.eligible(task):
            self._fail_locked(task)
            return
        task.state = "ready"
        self.policy.push(task)
        self._note_depths()
        self._cond.notify_all()

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
        if task.excluded:
            last = task.device
            exc: BaseException = DeviceFailedError(
                f"task {task.name!r} failed on {last} and no other device can take it ({'; '.join(why)})",
                device=str(last), task=task.name,
            )
        else:
            exc = SchedulerError(f"no device can run task {task.name!r}: {'; '.join(why)}")
        threading.Thread(target=self._fail, args=(task, exc), daemon=True).start()

    def _fail(self, task: Task, exc: BaseException) -> None:
        task.state = "cancelled" if isinstance(exc, TaskCancelledError) else "failed"
        task.error = f"{type(exc).__name__}: {exc}"
        task.future._finish(None, exc)

    def _finished(self, _f: Future) -> None:
        with self._cond:
            self._outstanding -= 1
            self._cond.notify_all()

    # -- running ---------------------------------------------------------------------------------
    def _worker(self, device: hal.Device) -> None:
        while True:
            with self._cond:
                task = None
                while task is None:
                    if self._stop:
                        return
                    if self._mem_waiting and (self._mem_kick or self.now() >= self._mem_next):
                        self._retry_memory_waiters()
                    if self.health.usable(device) and device not in self._drained:
                        task = self.policy.pop(device)
                    if task is None:
                        self._cond.wait(0.05 if self._mem_waiting else 0.1)
                self._note_depths()
            self._execute(task, device)

    def _yield_point(self, device: hal.Device, current: Task) -> int:
        ran = 0
        while True:
            with self._cond:
                if not self.health.usable(device) or device in self._drained:
                    break
                cand = self.policy.peek(device)
                if cand is None or cand.priority <= current.priority:
                    break
                task = self.policy.pop(device)
                self._note_depths()
            if task is None:
                break
            current.preemptions += 1
            self._execute(task, device)
            ran += 1
        return ran

    def _drive(self, gen: Generator[Any, Any, Any], device: hal.Device, task: Task) -> Any:
        try:
            while True:
                next(gen)
                self._yield_point(device, task)
        except StopIteration as stop:
            return stop.value

    def _execute(self, task: Task, device: hal.Device) -> None:
        stream = self._streams[device]
        with self._cond:
            self._running[device].append(task)
            task.state = "running"
            task.device = device
            task.attempts += 1
        task.start_t = start = self.now()
        st = self._stats[device]
        moved = 0
        transfer = 0.0
        try:
            if task.memory_bytes:
                free = free_memory(device)
                if free is not None and free < task.memory_bytes:
                    raise hal.OutOfMemoryError(
                        f"task {task.name!r} needs {task.memory_bytes} bytes; {free} free", device=str(device)
                    )
            args: list[Any] = []
            for a in self._inputs(task):
                if isinstance(a, hal.Array) and a.device != device:
                    dst = device.alloc(a.nbytes).view(a.dtype, a.shape)
                    hal.copy(dst, a, stream=stream)
                    moved += a.nbytes
                    a = dst
                args.append(a)
            if moved:
                stream.synchronize()
                transfer = self.now() - start
            if task.kernel_op:
                result = task.fn(*args, stream=stream, **task.kwargs)
            else:
                ctx = TaskContext(self, device, stream, task)
                result = task.fn(ctx, *args, **task.kwargs)
                if inspect.isgenerator(result):
                    result = self._drive(result, device, task)
            stream.synchronize()
            error: BaseException | None = None
        except BaseException as exc:  # noqa: BLE001 - routed to the future or a retry
            error = exc
            result = None
            try:
                stream.synchronize()  # clear sticky stream errors before the next task
            except hal.HalError:
                pass
        end = self.now()
        task.end_t = end
        task.transfer_s = transfer
        task.bytes_moved = moved
        with self._cond:
            self._running[device].remove(task)
            st.tasks += 1
            st.busy += end - start if len(self._running[device]) == 0 else 0.0
            st.transfer += transfer
            st.bytes_moved += moved
            self.policy.done(task, device)
            self._mem_kick = True
        self._trace(task, device, start, end, error)
        if error is None:
            self.model.observe(task.op, device, task.nbytes, end - start - transfer)
            if self.health.state(device) is DeviceState.SUSPECT:
                self.health.report(device, True)
            task.state = "done"
            task.future._finish(result)
            return
        if isinstance(error, hal.OutOfMemoryError) and not isinstance(error, DeviceFailedError):
            self._out_of_memory(task, device, error)
            return
        if not isinstance(error, hal.DeviceError):
            self._fail(task, error)
            return
        st.failures += 1
        self.health.report(device, False, f"task {task.name!r}: {error}")
        if task.idempotent and task.attempts <= self.retries:
            with self._cond:
                task.excluded.add(device)
                task.start_t = task.end_t = None
                self._push(task)
            return
        why = "it is not idempotent" if not task.idempotent else f"its retry budget ({self.retries}) is spent"
        self._fail(
            task,
            DeviceFailedError(
                f"task {task.name!r} failed on device {device} and is not retried ({why}): "
                f"{type(error).__name__}: {error}",
                device=str(device), task=task.name,
            ),
        )

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
                    f"(waited {waited:.1f} s, {task.oom_waits} tries; last: {error})", device=str(device))
                threading.Thread(target=self._fail, args=(task, exc), daemon=True).start()
                return
            task.start_t = task.end_t = None
            task.mem_excluded.add(device)
            if self.eligible(task):
                self._push(task)  # another device has room now, perhaps
                return
            task.mem_excluded.clear()
            task.state = "ready"
            self._mem_waiting.append(task)
            self._mem_next = now + 0.05
            self._cond.notify_all()

    def _retry_memory_waiters(self) -> None:
        """Hand tasks that waited for memory back to the policy (under the lock)."""
        waiting, self._mem_waiting = self._mem_waiting, []
        self._mem_kick = False
        for t in waiting:
            self._push(t)

    # -- health ------------------------------------------------------------------------------------
    def _health_changed(self, device: hal.Device, old: DeviceState, new: DeviceState) -> None:
        tr = hal.tracer()
        if tr is not None:
            tr.instant(f"{device} sched", f"{new.value}", "health", {"from": old.value, "reason": self.health.reason(device)})
        if new is DeviceState.EVICTED:
            self._requeue(device)
        with self._cond:
            self._cond.notify_all()

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
            if not self._cond.wait_for(lambda: not self._running[d], timeout):
                raise TimeoutError(f"{d} still runs a task after {timeout} s")
        return moved

    def admit(self, device: hal.Device | str) -> None:
        """Undo :meth:`drain`: place tasks on ``device`` again."""
        d = _resolve_device(device)
        with self._cond:
            self._drained.discard(d)
            self._cond.notify_all()

    # -- observing ---------------------------------------------------------------------------------
    def _note_depths(self) -> None:
        depth = self.policy.depth
        stats = self._stats
        tr = hal.tracer()
        if tr is None:  # the fast path: no names, no dict
            for d in self.devices:
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

    def _trace(self, task: Task, device: hal.Device, start: float, end: float, error: BaseException | None) -> None:
        tr = hal.tracer()
        if tr is None:
            return
        track = f"{device} sched"
        args: dict[str, Any] = {
            "task": task.id, "priority": task.priority, "effective_priority": round(task.effective_priority, 3),
            "wait_ms": round((start - (task.ready_t or start)) * 1e3, 3), "transfer_ms": round(task.transfer_s * 1e3, 3),
            "bytes_moved": task.bytes_moved, "attempt": task.attempts, "tags": list(task.tags),
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
        with self._cond:
            if not self._cond.wait_for(lambda: self._outstanding == 0, timeout):
                raise TimeoutError(f"{self._outstanding} task(s) still outstanding after {timeout} s")

    def close(self, *, cancel: bool = False) -> None:
        """Wait for every task (or, with ``cancel``, fail the queued ones), then stop. Idempotent."""
        with self._cond:
            if self._stop:
                return
            self._closed = True
            if cancel:
                waiting, self._mem_waiting = self._mem_waiting, []
                for task in self.policy.take_all() + waiting:
                    self._fail(task, TaskCancelledError(f"task {task.name!r} cancelled: the scheduler closed"))
        self.wait()
        with self._cond:
            self._stop = True
            self._cond.notify_all()
        for t in self._threads:
            t.join()
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
