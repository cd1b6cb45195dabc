"""Run ``hal.sched`` tasks on the devices of Dask workers (``pip install "hal-sdk[dask]"``).

Each Dask worker runs hal; the executor lists every worker's devices (``client.run``), places
each task on a (worker, device) pair by earliest finish time with a run-time history, and
submits it to that worker only (``workers=[address]``). On the worker the task is called as
``fn(ctx, *args, **kwargs)`` with a :class:`WorkerContext` (its device and a stream, which is
synchronized when the function returns), the same signature as :class:`hal.sched.Scheduler`'s
function tasks, so the same graph runs in one process or on a cluster.

A worker that leaves (killed, lost) fails the tasks placed on it: an idempotent task is placed
again on the remaining workers (within ``retries``), another fails with
:class:`WorkerLostError` naming the worker. Results come back to the client (the data of a
finished task does not depend on its worker staying alive) and are sent to dependants.
"""

from __future__ import annotations

import itertools
import statistics
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import hal
from hal.sched._task import SchedulerError

__all__ = ["DaskExecutor", "DaskFuture", "WorkerContext", "WorkerLostError"]


class WorkerLostError(SchedulerError):
    """A task's Dask worker left while the task ran (and the task could not be re-run).

    Attributes:
        worker: the worker's address. task: the task's name.
    """

    def __init__(self, message: str, *, worker: str, task: str) -> None:
        super().__init__(message)
        self.worker = worker
        self.task = task


class WorkerContext:
    """What a task receives first on a Dask worker: its device and a stream of it."""

    def __init__(self, device: hal.Device, stream: hal.Stream) -> None:
        self.device = device
        self.stream = stream

    def checkpoint(self) -> int:
        """A yield point (no preemption on a worker: returns 0)."""
        return 0


_worker_streams: dict[str, hal.Stream] = {}
_worker_lock = threading.Lock()


def _worker_devices() -> list[str]:
    """On a worker: the names of the devices hal sees there."""
    return [str(d) for d in hal.devices()]


def _run_on_worker(
    fn: Callable[..., Any], device: str, args: Sequence[Any], kwargs: dict[str, Any]
) -> tuple[Any, float]:
    """On a worker: run ``fn(ctx, *args, **kwargs)`` on ``device``; return (result, seconds)."""
    dev = hal.device(device)
    with _worker_lock:
        stream = _worker_streams.get(device)
        if stream is None:
            stream = _worker_streams[device] = dev.create_stream()
    t0 = time.perf_counter()
    result = fn(WorkerContext(dev, stream), *args, **kwargs)
    stream.synchronize()
    return result, time.perf_counter() - t0


class DaskFuture:
    """The eventual result of a task submitted to a :class:`DaskExecutor`.

    Attributes:
        name: the task's name. worker, device: where it ran (last attempt). attempts: tries.
    """

    def __init__(self, name: str, op: str, idempotent: bool) -> None:
        self.name = name
        self.op = op
        self.idempotent = idempotent
        self.worker: str | None = None
        self.device: str | None = None
        self.attempts = 0
        self._done = threading.Event()
        self._result: Any = None
        self._exc: BaseException | None = None
        self._callbacks: list[Callable[[DaskFuture], None]] = []
        self._lock = threading.Lock()
        self._dask: Any = None
        self._excluded: set[str] = set()
        self._call: tuple[Callable[..., Any], list[Any], dict[str, Any]] | None = None

    def done(self) -> bool:
        """True once the task has finished (successfully or not)."""
        return self._done.is_set()

    def result(self, timeout: float | None = None) -> Any:
        """Wait for the task and return its result, or raise its exception (TimeoutError: not done)."""
        if not self._done.wait(timeout):
            raise TimeoutError(f"task {self.name!r} not finished after {timeout} s")
        if self._exc is not None:
            raise self._exc
        return self._result

    def exception(self, timeout: float | None = None) -> BaseException | None:
        """Wait for the task; return its exception (None if it succeeded)."""
        if not self._done.wait(timeout):
            raise TimeoutError(f"task {self.name!r} not finished after {timeout} s")
        return self._exc

    def add_done_callback(self, fn: Callable[[DaskFuture], None]) -> None:
        """Call ``fn(future)`` when the task finishes (now if it has)."""
        with self._lock:
            if not self._done.is_set():
                self._callbacks.append(fn)
                return
        fn(self)

    def _finish(self, result: Any = None, exc: BaseException | None = None) -> None:
        with self._lock:
            if self._done.is_set():
                return
            self._result, self._exc = result, exc
            self._done.set()
            callbacks, self._callbacks = self._callbacks, []
        for cb in callbacks:
            cb(self)

    def __repr__(self) -> str:
        state = "pending" if not self.done() else ("failed" if self._exc else "done")
        return f"<hal.sched.DaskFuture {self.name!r} {state} on {self.worker} {self.device}>"


class DaskExecutor:
    """Place ``hal.sched`` function tasks on the devices of a Dask cluster's workers.

    Args:
        client: a ``distributed.Client``.
        retries: times an idempotent task is placed again after its worker left.
        device_class: use only devices whose name starts with this backend (``"cpu"``); None: all.
        poll: seconds between checks of the cluster's membership (a lost worker is noticed
            within about this long).
    """

    def __init__(
        self, client: Any, *, retries: int = 2, device_class: str | None = None, poll: float = 0.1
    ) -> None:
        if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
            raise ValueError(f"retries={retries!r} must be an integer >= 0")
        self.client = client
        self.retries = retries
        self.poll = float(poll)
        found = client.run(_worker_devices)
        self.slots: list[tuple[str, str]] = [
            (addr, dev)
            for addr in sorted(found)
            for dev in found[addr]
            if device_class is None or dev.split(":")[0] == device_class
        ]
        if not self.slots:
            raise SchedulerError(
                f"no devices{'' if device_class is None else f' of class {device_class!r}'} on "
                f"the Dask workers {sorted(found)}"
            )
        self._lock = threading.Lock()
        self._history: dict[tuple[str, str, str], list[float]] = {}
        self._queued: dict[tuple[str, str], float] = dict.fromkeys(self.slots, 0.0)
        self._running: dict[str, list[tuple[DaskFuture, float]]] = {}  # worker -> (task, estimate)
        self._lost: set[str] = set()
        self._futures: list[DaskFuture] = []
        self._ids = itertools.count(1)
        self._stop = threading.Event()
        self._monitor = threading.Thread(target=self._watch, name="hal-sched-dask", daemon=True)
        self._monitor.start()

    # -- placement -----------------------------------------------------------------------------
    def estimate(self, op: str, slot: tuple[str, str]) -> float:
        """Return the estimated seconds of ``op`` on ``slot`` (worker, device): its median history,
        else the median over other slots, else 1 ms."""
        own = self._history.get((op, *slot))
        if own:
            return statistics.median(own)
        other = [s for (o, _w, _d), v in self._history.items() if o == op for s in v]
        return statistics.median(other) if other else 1e-3

    def _place(self, fut: DaskFuture) -> tuple[str, str] | None:
        best: tuple[float, int, tuple[str, str]] | None = None
        for i, slot in enumerate(self.slots):
            if slot[0] in self._lost or slot[0] in fut._excluded:
                continue
            key = (self._queued[slot] + self.estimate(fut.op, slot), i, slot)
            if best is None or key[:2] < best[:2]:
                best = key
        return None if best is None else best[2]

    # -- submitting ----------------------------------------------------------------------------
    def submit(
        self,
        fn: Callable[..., Any],
        /,
        *args: Any,
        needs: Iterable[DaskFuture] = (),
        idempotent: bool = False,
        name: str | None = None,
        **kwargs: Any,
    ) -> DaskFuture:
        """Submit ``fn(ctx, *args, **kwargs)`` to a worker's device; return a :class:`DaskFuture`.

        A :class:`DaskFuture` argument is a data dependency (its result is passed); ``needs``
        adds control dependencies; ``idempotent`` tasks are re-run elsewhere if their worker
        leaves.
        """
        if not callable(fn):
            raise TypeError(f"fn={fn!r} is not callable")
        needs = list(needs)
        for n in needs:
            if not isinstance(n, DaskFuture):
                raise TypeError(f"needs contains {n!r}, not a hal.sched.DaskFuture")
        op = getattr(fn, "__qualname__", None) or type(fn).__name__
        fut = DaskFuture(str(name or getattr(fn, "__name__", op)), op, bool(idempotent))
        with self._lock:
            self._futures.append(fut)
        deps = needs + [a for a in args if isinstance(a, DaskFuture)]
        pending = [d for d in deps if not d.done()]
        remaining = [len(pending)]
        guard = threading.Lock()

        def ready(_d: DaskFuture | None = None) -> None:
            if _d is not None:
                with guard:
                    remaining[0] -= 1
                    if remaining[0]:
                        return
            failed = [d for d in deps if d.exception() is not None]
            if failed:
                from hal.sched._task import DependencyError

                fut._finish(
                    None,
                    DependencyError(
                        f"task {fut.name!r} did not run: its dependency {failed[0].name!r} failed"
                    ),
                )
                return
            values = [a.result() if isinstance(a, DaskFuture) else a for a in args]
            self._launch(fut, fn, values, kwargs)

        if not pending:
            ready()
        else:
            for d in pending:
                d.add_done_callback(ready)
        return fut

    def _launch(
        self, fut: DaskFuture, fn: Callable[..., Any], args: list[Any], kwargs: dict[str, Any]
    ) -> None:
        with self._lock:
            slot = self._place(fut)
            if slot is None:
                lost = ", ".join(sorted(fut._excluded | self._lost))
                fut._finish(
                    None,
                    WorkerLostError(
                        f"task {fut.name!r}: no Dask worker left to run it (lost: {lost})",
                        worker=fut.worker or "",
                        task=fut.name,
                    ),
                )
                return
            est = self.estimate(fut.op, slot)
            self._queued[slot] += est
            fut.worker, fut.device = slot
            fut.attempts += 1
            self._running.setdefault(slot[0], []).append((fut, est))
            attempt = fut.attempts
            fut._call = (fn, args, kwargs)
        dfut = self.client.submit(
            _run_on_worker,
            fn,
            slot[1],
            args,
            kwargs,
            workers=[slot[0]],
            allow_other_workers=False,
            pure=False,
            key=f"hal-{fut.name}-{next(self._ids)}",
        )
        fut._dask = dfut
        dfut.add_done_callback(lambda d: self._landed(fut, slot, est, attempt, d))

    def _landed(
        self, fut: DaskFuture, slot: tuple[str, str], est: float, attempt: int, dfut: Any
    ) -> None:
        with self._lock:
            self._queued[slot] = max(0.0, self._queued[slot] - est)
            run = self._running.get(slot[0], [])
            if (fut, est) in run:
                run.remove((fut, est))
            stale = attempt != fut.attempts or slot[0] in self._lost
        if stale or fut.done():
            return  # a worker-loss handler owns this task now
        try:
            result, seconds = dfut.result()
        except BaseException as exc:  # noqa: BLE001 - the task's own exception, or the cluster's
            if dfut.status == "cancelled" or type(exc).__name__ in (
                "CancelledError",
                "KilledWorker",
            ):
                return  # the worker-loss handler decides
            fut._finish(None, exc)
            return
        with self._lock:
            self._history.setdefault((fut.op, *slot), []).append(seconds)
        fut._finish(result)

    # -- worker loss ---------------------------------------------------------------------------
    def _watch(self) -> None:
        while not self._stop.wait(self.poll):
            try:
                alive = set(self.client.scheduler_info().get("workers", {}))
            except Exception:  # noqa: BLE001 - the client is closing
                continue
            with self._lock:
                known = {w for w, _ in self.slots}
                gone = (known - self._lost) - alive
                self._lost |= gone
                victims = [(w, f) for w in gone for f, _ in self._running.pop(w, [])]
            for worker, f in victims:
                self._worker_lost(worker, f)

    def _worker_lost(self, worker: str, fut: DaskFuture) -> None:
        if fut.done():
            return
        if fut._dask is not None:
            fut._dask.cancel()
        if fut.idempotent and fut.attempts <= self.retries:
            fut._excluded.add(worker)
            assert fut._call is not None
            fn, args, kwargs = fut._call
            self._launch(fut, fn, args, kwargs)
            return
        why = (
            "it is not idempotent"
            if not fut.idempotent
            else f"its retry budget ({self.retries}) is spent"
        )
        fut._finish(
            None,
            WorkerLostError(
                f"task {fut.name!r} was running on Dask worker {worker} ({fut.device}), which left; not re-run ({why})",
                worker=worker,
                task=fut.name,
            ),
        )

    # -- lifetime --------------------------------------------------------------------------------
    def futures(self) -> list[DaskFuture]:
        """Every future submitted so far."""
        with self._lock:
            return list(self._futures)

    def wait(self, timeout: float | None = None) -> None:
        """Wait for every submitted task (TimeoutError naming the unfinished ones)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        for f in self.futures():
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not f._done.wait(left):
                raise TimeoutError(f"task {f.name!r} not finished after {timeout} s")

    def close(self) -> None:
        """Wait for every task, then stop watching the cluster (the client stays open)."""
        try:
            self.wait()
        finally:
            self._stop.set()
            self._monitor.join()

    def __enter__(self) -> DaskExecutor:
        return self

    def __exit__(self, *exc: object) -> None:
        if exc[0] is not None:
            self._stop.set()
            return
        self.close()
