"""Streams (in-order work queues) and events (ordering and timing)."""

from __future__ import annotations

import threading
import weakref
from typing import TYPE_CHECKING, Any, final

from hal._errors import DeviceMismatchError, HalError, InvalidBufferError, StreamError
from hal._signal import HostSignal, SignalState, check_timeout
from hal._spi import EventImpl, StreamImpl

if TYPE_CHECKING:
    from hal._device import Device

__all__ = ["Event", "HostSignal", "Stream"]


def _close_impl(impl: StreamImpl | EventImpl) -> None:
    impl.close()


@final
class Stream:
    """An in-order queue of work on one device.

    Work enqueued on a stream runs in submission order; work on different streams is
    ordered only by events (:meth:`wait`), and a stream waits for the host with
    :meth:`wait_host`. Create with :meth:`hal.Device.create_stream`.
    """

    __slots__ = (
        "__weakref__",
        "_device",
        "_enqueues",
        "_finalizer",
        "_gates",
        "_impl",
        "_signal_errors",
        "_signal_lock",
    )
    _device: Device
    _enqueues: int  # operations handed to the backend so far (see enqueue_count)
    _finalizer: weakref.finalize[..., Any]
    _impl: StreamImpl | None
    _gates: list[SignalState]  # fallback host signals not released yet, oldest first
    _signal_errors: list[BaseException]  # failures of host signals, raised at synchronize
    _signal_lock: threading.Lock

    def __init__(self, *args: object, **kwargs: object) -> None:
        raise TypeError("Streams come from Device.create_stream()")

    @classmethod
    def _create(cls, device: Device) -> Stream:
        impl = device._impl.create_stream()
        self = object.__new__(cls)
        self._device = device
        self._impl = impl
        self._gates = []
        self._enqueues = 0
        self._signal_errors = []
        self._signal_lock = threading.Lock()
        self._finalizer = weakref.finalize(self, _close_impl, impl)
        return self

    @property
    def device(self) -> Device:
        """The device this stream runs on."""
        return self._device

    def _open(self) -> StreamImpl:
        if self._impl is None:
            raise InvalidBufferError(f"stream of {self._device} is closed")
        return self._impl

    def _live(self) -> StreamImpl:
        """Return the SPI stream to enqueue on, after any fallback host wait was released."""
        impl = self._impl  # _open() inlined: this runs once per launch and copy
        if impl is None:
            raise InvalidBufferError(f"stream of {self._device} is closed")
        if self._gates:
            self._pass_gates()
        self._enqueues += 1
        return impl

    @property
    def enqueue_count(self) -> int:
        """How many calls reached this stream's queue so far (copies, kernels, event records, waits, syncs).

        A counter, not a queue length: compare two readings to tell whether anything was
        enqueued on this stream between them (host signals from :meth:`wait_host` do not count).
        """
        return self._enqueues

    def _pass_gates(self) -> None:
        """Fallback of :meth:`wait_host`: block this (host) thread until the waits are released."""
        with self._signal_lock:
            gates = list(self._gates)
        for gate in gates:
            gate.released.wait()
        self._prune_gates()

    def _prune_gates(self) -> bool:
        """Forget released fallback waits; return True if one is still pending."""
        with self._signal_lock:
            self._gates = [g for g in self._gates if not g.released.is_set()]
            return bool(self._gates)

    def _signal_failed(self, error: BaseException) -> None:
        with self._signal_lock:
            self._signal_errors.append(error)

    def _signal_acknowledged(self, error: BaseException) -> None:
        with self._signal_lock:
            self._signal_errors = [e for e in self._signal_errors if e is not error]

    def _signal_released(self, gate: SignalState) -> None:
        with self._signal_lock:
            if gate in self._gates:
                self._gates.remove(gate)

    def wait_host(self, *, timeout: float | None = None) -> HostSignal:
        """Make work enqueued after this call wait until the returned signal is set by the host.

        The stream's earlier work runs on; its later work (copies, kernels, event records)
        starts only after :meth:`HostSignal.set` (or :meth:`HostSignal.fail`), called from
        any thread. ``synchronize`` waits for the signal; ``query`` is False until it is set.

        On a backend declaring ``Capabilities.host_signal`` the wait is enqueued on the
        device's queue and nothing blocks the host. Otherwise (the fallback, ``signal.native``
        is False) the next call that enqueues on this stream blocks the calling thread until
        the signal is set: the same order, at the cost of a host wait.

        Args:
            timeout: seconds after which an unset signal fails by itself (its failure is
                raised by the next :meth:`synchronize`); ``None`` waits for ``set``/``fail``.
                A signal garbage-collected unset fails too, so a setter that died and let go
                of it never hangs the stream.

        Raises:
            ValueError: ``timeout`` is not a positive number of seconds.
            hal.InvalidBufferError: the stream is closed.
        """
        t = check_timeout(timeout)
        impl = self._open()  # no fallback wait here: signals queue up without blocking
        if self._device.capabilities.host_signal:
            return HostSignal._create(self, impl.wait_host(), t)
        sig = HostSignal._create(self, None, t)
        with self._signal_lock:
            self._gates.append(sig._state)
        return sig

    def _raise_signal_errors(self) -> None:
        with self._signal_lock:
            errors, self._signal_errors = self._signal_errors, []
        if errors:
            first = errors[0]
            more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
            if isinstance(first, StreamError):
                raise first
            raise StreamError(
                f"a host signal this stream waited for failed: {type(first).__name__}: {first}{more}",
                device=str(self._device),
            ) from first

    def synchronize(self) -> None:
        """Block until all work enqueued so far has completed.

        Raises:
            hal.StreamError: enqueued work failed (asynchronous errors surface here), or a
                host signal the stream waited for failed (:meth:`wait_host`).
        """
        impl = self._impl  # _live() inlined: open, no pending fallback host wait
        if impl is None or self._gates:
            impl = self._live()
        else:
            self._enqueues += 1
        impl.synchronize()
        if self._signal_errors:  # read without the lock first: the common case has none
            self._raise_signal_errors()

    def query(self) -> bool:
        """Return True if all work enqueued so far has completed (never blocks)."""
        impl = self._open()
        if self._gates and self._prune_gates():
            return False
        return bool(impl.query())

    def wait(self, event: Event) -> None:
        """Make work enqueued after this call wait for ``event`` (as last recorded).

        An event of another backend is waited for on the host before returning.
        """
        impl = self._live()
        ev = _check_event(event)
        if ev._device.backend != self._device.backend:
            ev.synchronize()
            return
        impl.wait(ev._live())

    def close(self) -> None:
        """Wait for the stream's work to complete, then release it. Idempotent."""
        if self._impl is not None:
            try:
                self._pass_gates()
                self._impl.synchronize()
            finally:
                self._impl = None
                self._finalizer()

    def __enter__(self) -> Stream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<hal.Stream on {self._device}{' (closed)' if self._impl is None else ''}>"


@final
class Event:
    """A marker recorded in a stream, used to order streams and to measure time.

    Create with :meth:`hal.Device.create_event`.
    """

    __slots__ = ("__weakref__", "_device", "_finalizer", "_impl", "_recorded", "_timing")
    _device: Device
    _finalizer: weakref.finalize[..., Any]
    _impl: EventImpl | None
    _recorded: bool
    _timing: bool

    def __init__(self, *args: object, **kwargs: object) -> None:
        raise TypeError("Events come from Device.create_event(timing=...)")

    @classmethod
    def _create(cls, device: Device, timing: bool) -> Event:
        if not isinstance(timing, bool):
            raise TypeError(f"timing={timing!r} must be a bool")
        if timing and not device.capabilities.timing_events:
            raise HalError(f"{device} does not support timing events")
        impl = device._impl.create_event(timing)
        self = object.__new__(cls)
        self._device = device
        self._impl = impl
        self._timing = timing
        self._recorded = False
        self._finalizer = weakref.finalize(self, _close_impl, impl)
        return self

    @property
    def device(self) -> Device:
        """The device whose streams this event is recorded on."""
        return self._device

    @property
    def timing(self) -> bool:
        """True if this event records timestamps."""
        return self._timing

    def _live(self) -> EventImpl:
        if self._impl is None:
            raise InvalidBufferError(f"event of {self._device} is closed")
        return self._impl

    def record(self, stream: Stream) -> None:
        """Record the event in ``stream``: it completes when the work enqueued before it has."""
        impl = self._live()
        s = _check_stream(stream, self._device)
        s._live().record(impl)
        self._recorded = True

    def synchronize(self) -> None:
        """Block until the work before the last :meth:`record` has completed."""
        self._live().synchronize()

    def query(self) -> bool:
        """Return True if the last recorded work has completed (or the event was never recorded)."""
        return bool(self._live().query())

    def elapsed_ms(self, start_event: Event) -> float:
        """Return milliseconds elapsed from ``start_event`` to this event.

        Both events must be timing events of the same device, recorded and completed.
        """
        impl = self._live()
        start = _check_event(start_event, "start_event")
        if not (self._timing and start._timing):
            raise HalError("elapsed_ms needs two events created with timing=True")
        if start._device != self._device:
            raise DeviceMismatchError(
                f"start_event is on {start._device}, this event on {self._device}"
            )
        if not (self._recorded and start._recorded):
            raise HalError("elapsed_ms needs both events to have been recorded")
        start_impl = start._live()
        start_impl.synchronize()
        impl.synchronize()
        return float(impl.elapsed_ms(start_impl))

    def close(self) -> None:
        """Release the event. Idempotent."""
        if self._impl is not None:
            self._impl = None
            self._finalizer()

    def __enter__(self) -> Event:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<hal.Event on {self._device} timing={self._timing}>"


def _check_stream(stream: object, device: Device | None = None, name: str = "stream") -> Stream:
    """Validate that ``stream`` is an open Stream (of ``device`` when given)."""
    if not isinstance(stream, Stream):
        raise TypeError(f"{name}={stream!r} is not a hal.Stream")
    stream._live()
    if device is not None and stream._device != device:
        raise DeviceMismatchError(
            f"{name} belongs to {stream._device}, expected a stream of {device}"
        )
    return stream


def _check_event(event: object, name: str = "event") -> Event:
    if not isinstance(event, Event):
        raise TypeError(f"{name}={event!r} is not a hal.Event")
    event._live()
    return event
