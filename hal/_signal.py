"""Host signals: a stream waits for the host (``Stream.wait_host()``), the host releases it.

A :class:`HostSignal` is a point in a stream's queue: work enqueued on the stream after it
starts only once :meth:`HostSignal.set` (or :meth:`HostSignal.fail`) is called, from any
thread. Backends that declare ``Capabilities.host_signal`` enqueue a real wait
(``StreamImpl.wait_host``); for the others hal core blocks, on the host, the next call that
enqueues on the stream until the signal is released (the fallback).

A signal never holds its stream forever: a ``timeout`` fails it when it passes, and a
signal dropped unset (its setter died and let go of it) fails as it is collected.
"""

from __future__ import annotations

import heapq
import itertools
import threading
import time
import weakref
from typing import TYPE_CHECKING, Any, final

from hal._errors import StreamError
from hal._spi import HostSignalImpl

if TYPE_CHECKING:
    from hal._stream import Stream

__all__ = ["HostSignal"]

_PENDING, _SET, _FAILED = 0, 1, 2


class SignalState:
    """What outlives the public :class:`HostSignal`: the release, shared with the stream.

    The stream keeps it (the fallback waits on it); the watchdog keeps it (the timeout);
    neither keeps the public object, so dropping that object is seen (see ``_dropped``).
    """

    __slots__ = (
        "__weakref__",
        "device",
        "error",
        "failed_on",
        "impl",
        "lock",
        "released",
        "state",
        "stream",
    )

    def __init__(self, stream: Stream, impl: HostSignalImpl | None) -> None:
        self.stream: Stream | None = stream
        self.failed_on: weakref.ref[Stream] | None = None  # where the failure waits to be raised
        self.impl = impl
        self.device = str(stream.device)
        self.lock = threading.Lock()
        self.released = threading.Event()
        self.state = _PENDING
        self.error: BaseException | None = None

    def release(self, error: BaseException | None) -> bool:
        """Release the stream once; record ``error`` on it first. False if already released."""
        with self.lock:
            if self.state != _PENDING:
                return False
            self.state = _SET if error is None else _FAILED
            stream, self.stream = self.stream, None
            if error is not None:
                self.error = error
                if stream is not None:
                    stream._signal_failed(error)
                    self.failed_on = weakref.ref(stream)
        try:
            if self.impl is not None:
                self.impl.set()
        finally:
            self.released.set()
            if stream is not None:
                stream._signal_released(self)
        return True


def _dropped(state: SignalState) -> None:
    """Finalizer of a :class:`HostSignal`: an unset signal nobody can set any more fails."""
    if state.state == _PENDING:
        state.release(
            StreamError(
                "a host signal was dropped without set() (its setter is gone)", device=state.device
            )
        )


@final
class HostSignal:
    """A wait in a stream for the host: later work on the stream starts after :meth:`set`.

    Create with :meth:`hal.Stream.wait_host`. Call :meth:`set` when the host-side work the
    stream must wait for is complete (data in place), or :meth:`fail` when it failed: the
    stream is then released as well (nothing hangs) and its next
    :meth:`hal.Stream.synchronize` raises :class:`hal.StreamError` from the error. Both are
    thread-safe; the first call wins and later ones do nothing.

    Keep a reference until you set it: a signal garbage-collected unset fails (a setter that
    died cannot hang the stream). A ``timeout`` given to ``wait_host`` fails it when it passes.

    Attributes:
        native: True when the backend enqueued a real wait (``Capabilities.host_signal``);
            False for the fallback, where hal core blocks the next call that enqueues on the
            stream, on the host, until the signal is released.
    """

    __slots__ = ("__weakref__", "_finalizer", "_state", "native")
    _finalizer: weakref.finalize[..., Any]
    _state: SignalState
    native: bool

    def __init__(self, *args: object, **kwargs: object) -> None:
        raise TypeError("host signals come from Stream.wait_host()")

    @classmethod
    def _create(
        cls, stream: Stream, impl: HostSignalImpl | None, timeout: float | None
    ) -> HostSignal:
        self = object.__new__(cls)
        self._state = SignalState(stream, impl)
        self.native = impl is not None
        self._finalizer = weakref.finalize(self, _dropped, self._state)
        if timeout is not None:
            _watchdog.add(self._state, timeout)
        return self

    @property
    def stream(self) -> Stream | None:
        """The stream that waits (None once released)."""
        return self._state.stream

    def set(self) -> None:
        """Release the stream: the work enqueued after the wait may start. Idempotent."""
        self._state.release(None)

    def fail(self, error: BaseException | str) -> None:
        """Release the stream and make its next ``synchronize()`` raise ``hal.StreamError``.

        Args:
            error: the cause (an exception, chained as ``__cause__``, or a message).

        Work enqueued after the wait still runs where the backend cannot cancel it (so do
        not trust its results): only the error reports the failure.
        """
        if not isinstance(error, (BaseException, str)):
            raise TypeError(f"error={error!r} must be an exception or a message")
        self._state.release(
            error
            if isinstance(error, BaseException)
            else StreamError(error, device=self._state.device)
        )

    def acknowledge(self) -> None:
        """Say that the failure was reported another way: the stream's next ``synchronize()`` won't raise it.

        For a setter that also reports the error to its caller (``hal.comm``: ``work.wait()``
        raised it), so that one failure is raised once. Does nothing if the signal did not
        fail or the stream already raised the failure.
        """
        st = self._state
        ref = st.failed_on
        stream = ref() if ref is not None else None
        if stream is not None and st.error is not None:
            stream._signal_acknowledged(st.error)

    def is_set(self) -> bool:
        """Return True once the signal was set or failed (the stream is released)."""
        return self._state.state != _PENDING

    @property
    def failed(self) -> bool:
        """True if the signal was released by :meth:`fail` (or its timeout, or being dropped)."""
        return self._state.state == _FAILED

    def __repr__(self) -> str:
        st = self._state.state
        what = "pending" if st == _PENDING else "set" if st == _SET else "failed"
        return f"<hal.HostSignal {what}{'' if self.native else ' (host fallback)'}>"


class _Watchdog:
    """One lazily started thread that fails signals whose timeout passed."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._heap: list[tuple[float, int, weakref.ref[SignalState], float]] = []
        self._seq = itertools.count()
        self._thread: threading.Thread | None = None

    def add(self, state: SignalState, timeout: float) -> None:
        with self._cond:
            heapq.heappush(
                self._heap,
                (time.monotonic() + timeout, next(self._seq), weakref.ref(state), timeout),
            )
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="hal-host-signal-watchdog", daemon=True
                )
                self._thread.start()
            self._cond.notify()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._heap or self._heap[0][0] > time.monotonic():
                    wait = None if not self._heap else self._heap[0][0] - time.monotonic()
                    self._cond.wait(wait)
                _, _, ref, timeout = heapq.heappop(self._heap)
            state = ref()
            if state is not None and state.state == _PENDING:
                state.release(
                    StreamError(
                        f"a host signal was not set within {timeout:g} s (timeout)",
                        device=state.device,
                    )
                )


_watchdog = _Watchdog()


def check_timeout(timeout: Any) -> float | None:
    """Validate a ``wait_host`` timeout: seconds > 0, or None (``inf`` means None)."""
    if timeout is None:
        return None
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
        raise ValueError(f"timeout={timeout!r} must be a number of seconds > 0, or None")
    return None if timeout == float("inf") else float(timeout)
