"""The public ``Device`` handle."""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any, final

from hal._capabilities import Capabilities
from hal._errors import DeviceMismatchError
from hal._spi import DeviceImpl

if TYPE_CHECKING:
    from hal._memory import Buffer
    from hal._stream import Event, Stream

__all__ = ["Device"]


@final
class Device:
    """One device of one backend, e.g. ``hal.device("cpu:1")``.

    Devices are obtained from :func:`hal.devices` / :func:`hal.device`, never constructed
    directly; each call returns the same handle. Handles obtained before and after
    ``hal.plugins.reload()`` are different devices and compare unequal.
    """

    __slots__ = ("__weakref__", "_backend", "_impl", "_index", "_internal", "_lock")

    def __init__(self, backend: str, index: int, impl: DeviceImpl, *, _token: object = None) -> None:
        if _token is not _TOKEN:
            raise TypeError("Device objects come from hal.devices() or hal.device('backend:index')")
        self._backend = backend
        self._index = index
        self._impl = impl
        self._internal: Stream | None = None
        self._lock = threading.Lock()

    # -- identity ----------------------------------------------------------------------
    @property
    def backend(self) -> str:
        """Name of the backend that owns this device (``"cpu"``, ``"opencl"``, ``"cuda"`` ...)."""
        return self._backend

    @property
    def index(self) -> int:
        """Index of this device within its backend."""
        return self._index

    @property
    def name(self) -> str:
        """Human-readable device name reported by the backend."""
        return self._impl.name

    @property
    def vendor(self) -> str:
        """Vendor name reported by the backend."""
        return self._impl.vendor

    @property
    def total_memory(self) -> int:
        """Total memory of the device in bytes."""
        return self._impl.total_memory

    @property
    def capabilities(self) -> Capabilities:
        """What this device can do (see :class:`hal.Capabilities`)."""
        return self._impl.capabilities

    @property
    def memory_in_use(self) -> int | None:
        """Bytes currently allocated on this device through hal, if the backend tracks it."""
        return self._impl.memory_in_use()

    def properties(self) -> dict[str, Any]:
        """Return backend-specific properties (JSON-friendly), for reports."""
        return dict(self._impl.properties())

    def __repr__(self) -> str:
        return f"<hal.Device {self._backend}:{self._index} {self.name!r}>"

    def __str__(self) -> str:
        return f"{self._backend}:{self._index}"

    def __eq__(self, other: object) -> bool:
        # Same backend:index *and* the same backend instance: after hal.plugins.reload() the
        # new handles are different devices (new contexts), never mixed up with the old.
        return (
            isinstance(other, Device)
            and self._impl is other._impl
            and (self._backend, self._index) == (other._backend, other._index)
        )

    def __hash__(self) -> int:
        return hash((self._backend, self._index))

    # -- factories ---------------------------------------------------------------------
    def alloc(self, nbytes: int) -> Buffer:
        """Allocate ``nbytes`` bytes of device memory (uninitialized).

        Raises:
            TypeError: ``nbytes`` is not an integer.
            ValueError: ``nbytes`` is negative or above the device's allocation limit.
            hal.OutOfMemoryError: the device has not enough free memory.
        """
        from hal._memory import Buffer

        return Buffer._allocate(self, nbytes)

    def create_stream(self) -> Stream:
        """Create a new stream (an in-order queue of work) on this device."""
        from hal._stream import Stream

        return Stream._create(self)

    def create_event(self, timing: bool = False) -> Event:
        """Create an event; with ``timing=True`` it records timestamps for ``elapsed_ms``."""
        from hal._stream import Event

        return Event._create(self, timing)

    # -- peers -------------------------------------------------------------------------
    def can_access_peer(self, other: Device) -> bool:
        """Return True if direct (peer) copies between this device and ``other`` work.

        Devices of different backends never have peer access.
        """
        _check_device(other, "other")
        if other._backend != self._backend or other is self or other == self:
            return False
        return bool(self._impl.can_access_peer(other._impl))

    def enable_peer_access(self, other: Device) -> None:
        """Enable direct access from this device to ``other``.

        Raises:
            hal.DeviceMismatchError: the pair has no peer access (see :meth:`can_access_peer`).
        """
        if not self.can_access_peer(other):
            raise DeviceMismatchError(f"{self} cannot access peer {other}: no peer path between them")
        self._impl.enable_peer_access(other._impl)

    def synchronize(self) -> None:
        """Block until all work on all streams of this device has completed."""
        self._impl.synchronize()

    # -- internal ----------------------------------------------------------------------
    def _internal_stream(self) -> Stream:
        """A stream owned by hal for synchronous helpers (staging, ``to_host`` without a stream)."""
        with self._lock:
            if self._internal is None:
                self._internal = self.create_stream()
            return self._internal


_TOKEN = object()


def _check_device(value: object, name: str) -> Device:
    if not isinstance(value, Device):
        raise TypeError(f"{name}={value!r} is not a hal.Device")
    return value


def _make_device(backend: str, index: int, impl: DeviceImpl) -> Device:
    return Device(backend, index, impl, _token=_TOKEN)
