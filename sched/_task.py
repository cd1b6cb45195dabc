"""Tasks, their futures, the context a task runs with, and their records."""

from __future__ import annotations

import dataclasses
import itertools
import logging
import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import hal

if TYPE_CHECKING:
    from hal.sched._scheduler import Scheduler

__all__ = [
    "DependencyError",
    "DeviceFailedError",
    "Future",
    "SchedulerError",
    "Task",
    "TaskCancelledError",
    "TaskContext",
    "TaskRecord",
    "TaskTimeoutError",
]


class SchedulerError(hal.HalError):
    """A task could not be scheduled or run (no eligible device, scheduler closed ...)."""


class DeviceFailedError(SchedulerError, hal.DeviceError):
    """A task failed because its device failed (or was evicted) and it could not be retried.

    Attributes:
        device: the device that failed (``"cpu:2"``). task: the task's name.
    """

    def __init__(self, message: str, *, device: str, task: str) -> None:
        hal.DeviceError.__init__(self, message, device=device)
        self.task = task


class DependencyError(SchedulerError):
    """A task did not run because a task it depends on failed."""


class TaskCancelledError(SchedulerError):
    """The scheduler closed before the task ran."""


class TaskTimeoutError(SchedulerError):
    """A task ran longer than its ``timeout``: its stream was abandoned and its device re-probed.

    Attributes:
        device: the device it ran on (``"cpu:1"``; a gang: the first of its devices).
        task: the task's name. timeout: the limit in seconds.
    """

    def __init__(self, message: str, *, device: str, task: str, timeout: float) -> None:
        super().__init__(message)
        self.device = device
        self.task = task
        self.timeout = timeout


class Future:
    """The eventual result of a submitted task.

    Pass a future as an argument to another :meth:`Scheduler.submit` to make a data
    dependency: the consumer runs after the producer, on the producer's data.

    A future holds one small lock and nothing else until someone waits: a thread that waits
    for an unfinished task adds a waiter of its own (a lock it blocks on), which the task's
    end releases; a finished future answers without any lock.
    """

    __slots__ = ("_callbacks", "_done", "_exc", "_lock", "_result", "_waiters", "task")

    def __init__(self, task: Task) -> None:
        self.task = task
        self._lock = _Lock()
        self._done = False
        self._result: Any = None
        self._exc: BaseException | None = None
        self._waiters: list[Any] | None = None  # one lock per waiting thread, made when it waits
        self._callbacks: list[Callable[[Future], None]] | None = None

    def done(self) -> bool:
        """Return True when the task has finished (successfully or not)."""
        return self._done

    def result(self, timeout: float | None = None) -> Any:
        """Wait for the task and return its result, or raise its exception.

        Raises:
            TimeoutError: not finished within ``timeout`` seconds.
        """
        if not self._done:
            self._wait(timeout)
        if self._exc is not None:
            raise self._exc
        return self._result

    def exception(self, timeout: float | None = None) -> BaseException | None:
        """Wait for the task and return its exception (None if it succeeded)."""
        if not self._done:
            self._wait(timeout)
        return self._exc

    def add_done_callback(self, fn: Callable[[Future], None]) -> None:
        """Call ``fn(future)`` when the task finishes (now if it has).

        An exception raised by ``fn`` is logged (logger ``hal.sched``), as
        ``concurrent.futures`` does, and never reaches the scheduler's workers.
        """
        with self._lock:
            if not self._done:
                if self._callbacks is None:
                    self._callbacks = [fn]
                else:
                    self._callbacks.append(fn)
                return
        _call(fn, self)

    @property
    def record(self) -> TaskRecord:
        """The task's times, device and bytes moved so far."""
        return self.task.record()

    def _wait(self, timeout: float | None) -> None:
        if self._done:  # finished already: no lock
            return
        with self._lock:
            if self._done:
                return
            waiter = _Lock()
            waiter.acquire()
            if self._waiters is None:
                self._waiters = [waiter]
            else:
                self._waiters.append(waiter)
        if waiter.acquire(True, -1 if timeout is None else max(float(timeout), 0.0)):
            return  # released by _finish
        with self._lock:
            if self._done:  # it finished between the timeout and here
                return
            if self._waiters is not None:
                self._waiters.remove(waiter)
        raise TimeoutError(f"task {self.task.name!r} not finished after {timeout} s")

    def _finish(self, result: Any = None, exc: BaseException | None = None) -> bool:
        """Set the outcome, release the waiters, run the callbacks; False if it was set already."""
        with self._lock:
            if self._done:
                return False
            self._result, self._exc = result, exc
            self._done = True  # last: a reader that sees it done sees the outcome
            waiters, self._waiters = self._waiters, None
            callbacks, self._callbacks = self._callbacks, None
        if waiters is not None:
            for w in waiters:
                w.release()
        if callbacks is not None:
            for cb in callbacks:
                _call(cb, self)
        return True

    def __repr__(self) -> str:
        state = "pending" if not self._done else ("failed" if self._exc else "done")
        return f"<hal.sched.Future {self.task.name!r} {state}>"


_Lock = threading.Lock
_log = logging.getLogger("hal.sched")


def _call(fn: Callable[[Future], None], fut: Future) -> None:
    try:
        fn(fut)
    except Exception:
        _log.exception("a done callback of %r raised", fut)


@dataclasses.dataclass(frozen=True)
class TaskRecord:
    """What happened to one task (times are ``time.perf_counter()`` seconds).

    Attributes:
        id, name, tags: identity. priority: its class; effective_priority: with aging,
            when it was dispatched. device: where it ran (last attempt).
        submit, ready, start, end: times (None until reached). wait: start - ready.
        run: compute time (end - start - transfer). transfer: input copy time.
        bytes_moved: input bytes copied to the device. attempts, preemptions: counts.
        state: pending, ready, running, done, failed, cancelled, timeout. error: the failure.
        pool, job: where it was submitted. devices: a gang task's devices.
        inherited: priority lifted by a waiting dependant (priority inheritance).
    """

    id: int
    name: str
    tags: tuple[str, ...]
    priority: float
    effective_priority: float
    device: str | None
    submit: float
    ready: float | None
    start: float | None
    end: float | None
    transfer: float
    bytes_moved: int
    attempts: int
    preemptions: int
    state: str
    error: str | None
    pool: str = "default"
    job: str | None = None
    devices: tuple[str, ...] = ()
    inherited: float = 0.0

    @property
    def wait(self) -> float | None:
        """Seconds from ready to start."""
        return None if self.start is None or self.ready is None else self.start - self.ready

    @property
    def run(self) -> float | None:
        """Seconds of compute (end - start - transfer)."""
        return (
            None
            if self.end is None or self.start is None
            else self.end - self.start - self.transfer
        )

    def to_dict(self) -> dict[str, Any]:
        """Return a JSON-friendly dict (with ``wait`` and ``run``)."""
        d = dataclasses.asdict(self)
        d["tags"] = list(self.tags)
        d["wait"], d["run"] = self.wait, self.run
        return d


_ids = itertools.count(1)


class Task:
    """A unit of work: a callable, its arguments and its scheduling attributes (internal).

    Attributes whose start value is immutable are class defaults: an instance stores only what
    changed (a trivial task's submission sets a dozen attributes, not forty).
    """

    ready_t: float | None = None
    start_t: float | None = None
    end_t: float | None = None
    transfer_s = 0.0
    bytes_moved = 0
    attempts = 0
    preemptions = 0
    device: hal.Device | None = None
    planned: hal.Device | None = None  # HEFT's choice
    memory_bytes = 0  # device memory the task declared it needs (placement respects free memory)
    oom_since: float | None = None  # first out-of-memory of the current wait
    oom_waits = 0  # times it met a full device (never a health failure)
    plan_rank = 0.0
    estimate = 0.0
    state = "pending"
    error: str | None = None
    nbytes = 0  # input bytes (model key), set when ready
    timeout: float | None = None  # seconds it may run (None: no limit)
    timed_out = False  # the watchdog gave up on it: its late end changes nothing
    pinned: frozenset[hal.Device] | None = None  # device= / device_class= / pool restriction
    gang = 1  # devices it needs at once
    pool = "default"
    job: str | None = None
    short = False  # in the short queue (estimate below the scheduler's threshold)
    slot = 0  # the worker slot (stream) of its device it runs on
    deps: Sequence[Future] = ()  # data and control dependencies
    excluded: frozenset[hal.Device] = frozenset()  # devices it failed on (replaced, never mutated)
    mem_excluded: frozenset[hal.Device] = frozenset()  # out of memory there now: elsewhere or waits
    gang_devices: Sequence[hal.Device] = ()  # a gang task's devices while it runs

    def __init__(
        self,
        fn: Callable[..., Any],
        args: Sequence[Any],
        kwargs: dict[str, Any],
        *,
        name: str,
        op: str,
        priority: float,
        needs: Sequence[Future],
        idempotent: bool,
        tags: tuple[str, ...],
        kernel_op: bool,
        submit: float,
    ) -> None:
        self.id = self.seq = next(_ids)
        self.fn = fn
        self.args = args if type(args) is tuple else tuple(args)
        self.kwargs = kwargs  # the caller's own dict (submit's **kwargs is one already)
        self.name = name
        self.op = op
        # base: the class it was submitted with (inheritance may lift .priority)
        self.priority = self.base_priority = self.effective_priority = float(priority)
        if needs or self.args:
            self.deps = [*needs, *(a for a in self.args if isinstance(a, Future))]
        self.idempotent = idempotent
        self.tags = tags
        self.kernel_op = kernel_op
        self.submit_t = submit
        self.future = Future(self)

    def record(self) -> TaskRecord:
        """Return a snapshot :class:`TaskRecord`."""
        return TaskRecord(
            self.id,
            self.name,
            self.tags,
            self.base_priority,
            self.effective_priority,
            None if self.device is None else str(self.device),
            self.submit_t,
            self.ready_t,
            self.start_t,
            self.end_t,
            self.transfer_s,
            self.bytes_moved,
            self.attempts,
            self.preemptions,
            self.state,
            self.error,
            self.pool,
            self.job,
            tuple(str(d) for d in self.gang_devices),
            self.priority - self.base_priority,
        )

    def __repr__(self) -> str:
        return f"<Task {self.id} {self.name!r} prio={self.priority} {self.state}>"


class TaskContext:
    """What a task function receives first: its device, its stream, and yield points.

    Attributes:
        device: the device the task runs on. stream: the stream to enqueue on (the
            scheduler synchronizes it when the task returns). task: the task's record.
    """

    _comm: Any = None
    _devices: list[hal.Device] | None = None
    _streams: list[hal.Stream] | None = None

    def __init__(
        self,
        scheduler: Scheduler,
        device: hal.Device,
        stream: hal.Stream,
        task: Task,
        devices: Sequence[hal.Device] = (),
        streams: Sequence[hal.Stream] = (),
    ) -> None:
        self._scheduler = scheduler
        self.device = device
        self.stream = stream
        self._task = task
        if devices:  # a gang task's; a single device's are made when asked for
            self._devices = list(devices)
        if streams:
            self._streams = list(streams)

    @property
    def devices(self) -> list[hal.Device]:
        """A gang task's devices (one device otherwise), held together while it runs."""
        devices = self._devices
        if devices is None:
            devices = self._devices = [self.device]
        return devices

    @property
    def streams(self) -> list[hal.Stream]:
        """A stream per device of :attr:`devices`."""
        streams = self._streams
        if streams is None:
            streams = self._streams = [self.stream]
        return streams

    @property
    def comm(self) -> Any:
        """A ``hal.comm`` communicator over :attr:`devices` (``hal.comm.create``), made on first use.

        The scheduler closes it when the task ends.
        """
        if self._comm is None:
            import hal.comm

            self._comm = hal.comm.create(self.devices)
        return self._comm

    def _close(self) -> None:
        comm, self._comm = self._comm, None
        if comm is not None:
            close = getattr(comm, "close", None)
            if close is not None:
                try:
                    close()
                except hal.HalError:
                    pass

    @property
    def record(self) -> TaskRecord:
        """The running task's record."""
        return self._task.record()

    def checkpoint(self) -> int:
        """Mark a yield point: run waiting work of higher priority on this device now.

        Preemption is cooperative: the scheduler only ever interleaves other tasks here
        (or at a generator task's ``yield``), never inside a kernel. Returns the number
        of tasks run.
        """
        return self._scheduler._yield_point(self.device, self._task)
