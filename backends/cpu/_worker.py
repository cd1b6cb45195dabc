"""A stream's worker thread: runs queued operations in order, with optional jitter."""

from __future__ import annotations

import queue
import random
import threading
import time
from collections.abc import Callable
from typing import NoReturn

from hal import StreamError

Op = Callable[[], object]


def raise_failure(err: BaseException, label: str, device: str) -> NoReturn:
    """Raise ``err``, a stream's first failure, at its synchronize.

    A :class:`hal.StreamError` as it is; anything else as a StreamError that names it and the
    stream ``label``, chained to it.
    """
    if isinstance(err, StreamError):
        raise err
    raise StreamError(f"{type(err).__name__}: {err} (on {label})", device=device) from err


class Mark:
    """A point in a stream: set when the stream has executed everything before it."""

    __slots__ = ("done", "time")

    def __init__(self) -> None:
        self.done = threading.Event()
        self.time = 0.0

    def fire(self) -> None:
        self.time = time.perf_counter()
        self.done.set()


class HostWait:
    """A queued wait for a host signal (``Stream.wait_host``): blocks the worker until ``event`` is set.

    The worker counts the waits in progress so that :meth:`Worker.settle` can tell "blocked
    on the host" from "busy". Never faulted by the fault model, like event marks.
    """

    __slots__ = ("event", "worker")

    def __init__(self, worker: Worker) -> None:
        self.event = threading.Event()
        self.worker = worker

    def wait(self) -> None:
        w = self.worker
        with w._cond:
            w._host_waiting += 1
            w._cond.notify_all()
        try:
            self.event.wait()
        finally:
            with w._cond:
                w._host_waiting -= 1


class Worker:
    """One thread executing operations in submission order.

    Failures are sticky until the next :meth:`synchronize`, which raises the first one as
    :class:`hal.StreamError`; later operations still run so that events never hang.
    """

    def __init__(self, label: str, jitter_seed: int | None, slowdown: float = 1.0) -> None:
        self.label = label
        self.device = label.partition("/")[
            0
        ]  # "cpu:0/stream1" -> "cpu:0", as DeviceError.device says
        self._queue: queue.SimpleQueue[Op | None] = queue.SimpleQueue()
        self._cond = threading.Condition()
        self._submitted = 0
        self._completed = 0
        self._error: BaseException | None = None
        self._rng = random.Random(jitter_seed) if jitter_seed is not None else None
        self.slowdown = slowdown
        self._closed = False
        self._inline_busy = False
        self._host_waiting = 0  # HostWait ops in progress
        self._thread = threading.Thread(target=self._run, name=f"hal-{label}", daemon=True)
        self._thread.start()

    def submit(self, op: Op, *, inline: bool = False) -> None:
        """Queue ``op``; it runs after everything submitted before it.

        With ``inline=True`` the caller allows ``op`` to run right here, on the calling
        thread, when the stream is idle (nothing queued or running) and neither jitter
        nor a slowdown is configured: completing early is always a valid outcome of an
        asynchronous operation, and it saves the thread hand-off (and keeps the data in
        the caller's cache). Only short, non-blocking operations (copies, memset) may
        ask for it — never an event wait.
        """
        with self._cond:
            if self._closed:
                raise StreamError(f"{self.label} is closed", device=self.device)
            run_here = (
                inline
                and self._rng is None
                and self.slowdown == 1.0
                and not self._inline_busy
                and self._completed == self._submitted
            )
            self._submitted += 1
            if run_here:
                self._inline_busy = True
        if not run_here:
            self._queue.put(op)
            return
        try:
            op()
        except BaseException as exc:  # noqa: BLE001 - surfaced at synchronize
            self._fail(exc)
        with self._cond:
            self._inline_busy = False
            self._completed += 1
            self._cond.notify_all()

    def _fail(self, exc: BaseException) -> None:
        with self._cond:
            if self._error is None:
                self._error = exc

    def _run(self) -> None:
        while True:
            op = self._queue.get()
            if op is None:
                return
            if (
                self._inline_busy
            ):  # an operation submitted earlier is running on its caller's thread
                with self._cond:
                    self._cond.wait_for(lambda: not self._inline_busy)
            if self._rng is not None:
                time.sleep(self._rng.random() * 0.002)
            try:
                t0 = time.perf_counter() if self.slowdown != 1.0 else 0.0
                op()
                if self.slowdown > 1.0:
                    time.sleep((time.perf_counter() - t0) * (self.slowdown - 1.0))
            except BaseException as exc:  # noqa: BLE001 - surfaced at synchronize
                self._fail(exc)
            with self._cond:
                self._completed += 1
                self._cond.notify_all()

    def idle(self) -> bool:
        """True when every submitted operation has completed."""
        with self._cond:
            return self._completed == self._submitted

    def settle(self) -> None:
        """Wait until every submitted operation completed, or the worker waits for a host signal.

        In the second case the operations before the wait are done and the ones after it
        have not started: memory is as the host signal left it. Raises nothing.
        """
        with self._cond:
            target = self._submitted
            self._cond.wait_for(lambda: self._completed >= target or self._host_waiting > 0)

    def synchronize(self) -> None:
        """Wait for all submitted operations; raise the first failure since the last call."""
        with self._cond:
            target = self._submitted
            self._cond.wait_for(lambda: self._completed >= target)
            err, self._error = self._error, None
        if err is not None:
            raise_failure(err, self.label, self.device)

    def close(self) -> None:
        """Finish queued work and stop the thread. Idempotent."""
        with self._cond:
            if self._closed:
                return
            self._closed = True
        self._queue.put(None)
        if threading.current_thread() is not self._thread:
            self._thread.join()
