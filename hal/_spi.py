"""The backend SPI: the abstract classes a vendor implements.

The SPI is deliberately small. A backend provides a :class:`BackendImpl` that lists
:class:`DeviceImpl` objects; each device allocates :class:`MemoryImpl`, and creates
:class:`StreamImpl` and :class:`EventImpl`. hal core wraps these in the public
``Device``/``Buffer``/``Stream``/``Event`` objects, validates every argument *before*
calling into the SPI, and translates nothing else: an SPI method may assume its
arguments are in range, on the right device and not closed.

Ordering contract: every ``StreamImpl`` method that enqueues work (copies, memset,
``record``, ``wait``) returns immediately and the work runs in submission order on that
stream. Host memory passed to an enqueued copy must stay valid until the stream has
reached it (exactly as with ``cudaMemcpyAsync``); hal core guarantees that for the
copies it issues.

Errors: raise from the ``hal`` error tree (translate vendor status codes at this
boundary). Asynchronous failures are raised at the next ``synchronize``.
"""

from __future__ import annotations

import abc
from collections.abc import Sequence
from typing import Any, ClassVar

from hal._capabilities import Capabilities

__all__ = ["BackendImpl", "DeviceImpl", "EventImpl", "MemoryImpl", "StreamImpl"]


class MemoryImpl(abc.ABC):
    """One device allocation of ``nbytes`` bytes."""

    nbytes: int

    @abc.abstractmethod
    def free(self) -> None:
        """Release the allocation. Called exactly once by hal core."""

    def dlpack_device(self) -> tuple[int, int]:
        """Return ``(device_type, device_id)`` per the DLPack spec, or raise ``BufferError``."""
        raise BufferError("this backend's memory is not reachable through DLPack")

    def dlpack(
        self, *, dtype: Any, shape: tuple[int, ...], offset: int, stream: Any, max_version: Any
    ) -> Any:
        """Return a DLPack capsule for a typed view at ``offset``, or raise ``BufferError``."""
        raise BufferError("this backend's memory is not reachable through DLPack")


class EventImpl(abc.ABC):
    """A marker in a stream; optionally records a timestamp (``timing=True``)."""

    @abc.abstractmethod
    def synchronize(self) -> None:
        """Block until the work before the last ``record`` has completed."""

    @abc.abstractmethod
    def query(self) -> bool:
        """Return True if the last recorded work has completed (or it was never recorded)."""

    @abc.abstractmethod
    def elapsed_ms(self, start: EventImpl) -> float:
        """Return milliseconds between ``start`` and this event (both recorded and completed)."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release resources; optional."""


class StreamImpl(abc.ABC):
    """An in-order queue of work on one device."""

    @abc.abstractmethod
    def copy_from_host(self, dst: MemoryImpl, dst_offset: int, src: memoryview, nbytes: int) -> None:
        """Enqueue a host->device copy of ``nbytes`` from ``src`` (a contiguous byte view)."""

    @abc.abstractmethod
    def copy_to_host(self, dst: memoryview, src: MemoryImpl, src_offset: int, nbytes: int) -> None:
        """Enqueue a device->host copy into ``dst`` (a writable contiguous byte view)."""

    @abc.abstractmethod
    def copy(self, dst: MemoryImpl, dst_offset: int, src: MemoryImpl, src_offset: int, nbytes: int) -> None:
        """Enqueue a copy between two allocations of this stream's device (may overlap: memmove)."""

    def copy_peer(
        self, dst: MemoryImpl, dst_offset: int, src: MemoryImpl, src_offset: int, nbytes: int
    ) -> None:
        """Enqueue a direct copy between allocations of two devices of this backend.

        Called only when ``DeviceImpl.can_access_peer`` is true for the pair. The stream
        belongs to one of the two devices.
        """
        raise NotImplementedError("peer copies are not supported by this backend")

    @abc.abstractmethod
    def memset(self, dst: MemoryImpl, offset: int, value: int, nbytes: int) -> None:
        """Enqueue setting ``nbytes`` bytes at ``offset`` to the byte ``value`` (0..255)."""

    @abc.abstractmethod
    def record(self, event: EventImpl) -> None:
        """Enqueue ``event``: it completes when the work enqueued before it has completed."""

    @abc.abstractmethod
    def wait(self, event: EventImpl) -> None:
        """Make work enqueued after this call wait until ``event`` (as last recorded) completes."""

    @abc.abstractmethod
    def synchronize(self) -> None:
        """Block until all enqueued work has completed; raise any asynchronous failure."""

    @abc.abstractmethod
    def query(self) -> bool:
        """Return True if all enqueued work has completed."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release the stream (after its work has completed); optional."""


class DeviceImpl(abc.ABC):
    """One device of a backend."""

    name: str
    vendor: str
    total_memory: int
    capabilities: Capabilities

    @abc.abstractmethod
    def alloc(self, nbytes: int) -> MemoryImpl:
        """Allocate ``nbytes`` (> 0) bytes; raise ``hal.OutOfMemoryError`` when they do not fit."""

    @abc.abstractmethod
    def create_stream(self) -> StreamImpl:
        """Create a stream."""

    @abc.abstractmethod
    def create_event(self, timing: bool) -> EventImpl:
        """Create an event; ``timing`` asks for timestamps."""

    def can_access_peer(self, other: DeviceImpl) -> bool:
        """Return True if direct copies between this device and ``other`` (same backend) work."""
        return False

    def enable_peer_access(self, other: DeviceImpl) -> None:  # noqa: B027 - optional hook
        """Enable direct access to ``other``; called only when ``can_access_peer`` is true."""

    @abc.abstractmethod
    def synchronize(self) -> None:
        """Block until all work on all streams of this device has completed."""

    def memory_in_use(self) -> int | None:
        """Return the bytes currently allocated through this device, if the backend tracks it."""
        return None

    def properties(self) -> dict[str, Any]:
        """Return extra, backend-specific properties for ``hal info`` (JSON-friendly)."""
        return {}


class BackendImpl(abc.ABC):
    """A backend: a factory of devices. Registered by a plugin's ``hal_register_backends`` hook.

    Class attributes:
        name: the backend name used in ``"name:index"`` device strings.
        api_version: the SPI version this backend was written against; the major must match.
    """

    name: ClassVar[str]
    api_version: ClassVar[tuple[int, int]] = (1, 0)

    @abc.abstractmethod
    def __init__(self) -> None:
        """Probe the machine. Raise ``hal.BackendUnavailableError`` with an actionable reason
        when the backend cannot run here (SDK missing, no driver, no device)."""

    @abc.abstractmethod
    def devices(self) -> Sequence[DeviceImpl]:
        """Return the devices of this backend, in index order."""

    def version_info(self) -> dict[str, str]:
        """Return versions of the vendor stack (SDK, driver, runtime) for reports."""
        return {}

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release backend-wide resources at interpreter exit; optional."""
