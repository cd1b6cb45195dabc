"""The public ``Device`` handle."""

from __future__ import annotations

import dataclasses
import threading
import warnings
import weakref
from typing import TYPE_CHECKING, Any, final

from hal._capabilities import Capabilities
from hal._errors import DeviceError, DeviceMismatchError, HalError, HalWarning, OutOfMemoryError
from hal._spi import DeviceImpl

if TYPE_CHECKING:
    from hal._memory import Buffer
    from hal._pool import Pool
    from hal._stream import Event, Stream

__all__ = ["Device", "EventOptions"]


@final
@dataclasses.dataclass(frozen=True)
class EventOptions:
    """Options of :meth:`Device.create_event` (like cuda.core's ``EventOptions``).

    Attributes:
        timing: the event records a timestamp, for :meth:`hal.Event.elapsed_ms` (the device
            must declare ``capabilities.timing_events``).
    """

    timing: bool = False


@final
class Device:
    """One device of one backend, e.g. ``hal.device("cpu:1")``.

    Devices are obtained from :func:`hal.devices` / :func:`hal.device`, never constructed
    directly; each call returns the same handle. Handles obtained before and after
    ``hal.plugins.reload()`` are different devices and compare unequal.
    """

    __slots__ = (
        "__weakref__",
        "_backend",
        "_hash",
        "_impl",
        "_index",
        "_internal",
        "_lock",
        "_pool",
        "_streams",
        "_streams_lock",
    )

    def __init__(
        self, backend: str, index: int, impl: DeviceImpl, *, _token: object = None
    ) -> None:
        if _token is not _TOKEN:
            raise TypeError("Device objects come from hal.devices() or hal.device('backend:index')")
        self._backend = backend
        self._index = index
        self._hash = hash(
            (backend, index)
        )  # devices key many per-call dicts (hal.sched, hal.kernels)
        self._impl = impl
        self._internal: Stream | None = None
        self._lock = threading.Lock()
        self._pool: Pool | bool | None = False  # False: not decided yet; None: HAL_MEMORY_POOL=0
        self._streams: list[
            weakref.ref[Stream]
        ] = []  # for stream-ordered reuse (pruned as they go)
        self._streams_lock = threading.Lock()

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
        """Bytes of this device held by live buffers, if the backend tracks it.

        With the memory pool (the default) this is the backend's count minus the pool's cache:
        closing a buffer lowers it at once even though the pool keeps the memory for reuse
        (:meth:`memory_stats` has ``reserved``, what the pool holds). Blocks are rounded up to
        their size class (512 B below 1 MiB, 128 KiB above), so an allocation of ``n`` bytes
        adds at least ``n``.
        """
        pool = self._pool
        if pool:
            return pool.memory_in_use()  # type: ignore[union-attr]
        return self._impl.memory_in_use()

    # -- the memory pool ----------------------------------------------------------------
    def _memory_pool(self) -> Pool | None:
        """Return this device's pool (made at the first allocation), or None with HAL_MEMORY_POOL=0."""
        pool = self._pool
        if pool is not False:
            return pool  # type: ignore[return-value]
        with self._lock:
            if self._pool is False:
                from hal._pool import Pool, pool_settings

                on, limit, reserve = pool_settings()
                made = Pool(self, limit) if on else None
                if made is not None and reserve:
                    try:
                        made.reserve(reserve)
                    except OutOfMemoryError as exc:
                        warnings.warn(
                            f"HAL_MEMORY_RESERVE={reserve}: {exc}; going on without the reservation",
                            HalWarning,
                            stacklevel=4,
                        )
                self._pool = made
            return self._pool  # type: ignore[return-value]

    def memory_stats(self) -> dict[str, Any]:
        """Return the memory pool's statistics for this device (a JSON-friendly dict).

        Keys: ``device``, ``pool`` (False with ``HAL_MEMORY_POOL=0``: then only the backend's
        numbers), ``in_use`` (bytes of blocks held by live buffers), ``requested`` (bytes those
        buffers asked for), ``reserved`` (in use + cached, all taken from the backend),
        ``cached``, ``peak_in_use``, ``peak_reserved``, ``limit`` (``HAL_MEMORY_LIMIT`` or
        None), ``total_memory``, ``device_free`` (by the backend's count, or None),
        ``largest_free_block`` (the largest cached block), ``fragmentation`` (1 - largest free
        block / cached bytes: 0 when the cache is one block or empty), ``cached_blocks``,
        ``allocs``, ``frees``, ``cache_hits``, ``cache_misses``, ``backend_allocs``,
        ``backend_frees``, ``oom_retries``, ``ooms``, ``kept_by_reserve`` and
        ``size_classes`` (``{"<=4K": {"allocs": n, "live": m}, ...}`` by power of two).
        docs/memory.md explains them.
        """
        pool = self._memory_pool()
        if pool is not None:
            return pool.stats()
        used = self._impl.memory_in_use()
        return {
            "device": str(self),
            "pool": False,
            "in_use": used,
            "reserved": used,
            "cached": 0,
            "total_memory": self.total_memory,
            "device_free": None if used is None else max(0, self.total_memory - used),
            "largest_free_block": 0,
            "fragmentation": 0.0,
            "cached_blocks": 0,
        }

    def empty_cache(self) -> int:
        """Give the pool's cached blocks back to the backend; return the bytes released.

        Blocks a stream may still use are waited for first. What :meth:`reserve` asked for stays
        cached. A no-op (0) with ``HAL_MEMORY_POOL=0``.
        """
        pool = self._memory_pool()
        return 0 if pool is None else pool.empty_cache()

    def reserve(self, nbytes: int) -> int:
        """Pre-allocate ``nbytes`` for this device's pool and keep that much cached; return the bytes.

        The memory is taken from the backend now (one block of ``nbytes`` rounded up to its size
        class) and stays in the pool: an allocation of that class reuses it without a backend
        call, and any allocation that does not fit gets it back (the pool frees its cache and
        retries). :meth:`empty_cache` leaves this much cached. ``HAL_MEMORY_RESERVE`` does the
        same at the device's first allocation.

        Raises:
            TypeError: ``nbytes`` is not an integer.
            ValueError: ``nbytes`` is negative.
            hal.OutOfMemoryError: the device cannot hold it now.
            hal.HalError: the pool is off (``HAL_MEMORY_POOL=0``).
        """
        from hal._memory import _as_size

        n = _as_size(nbytes, "nbytes")
        limit = self.capabilities.max_alloc_bytes
        if limit is not None and n > limit:
            raise ValueError(f"nbytes={n} exceeds the largest allocation of {self} ({limit} bytes)")
        pool = self._memory_pool()
        if pool is None:
            raise HalError(
                f"{self}: Device.reserve({n}) needs the memory pool, which HAL_MEMORY_POOL=0 turned off"
            )
        return pool.reserve(n)

    def properties(self) -> dict[str, Any]:
        """Return backend-specific properties (JSON-friendly), for reports.

        Includes the device's error counters (:meth:`health`) under their own keys, unless
        the backend's properties already carry a key of that name.

        Raises:
            hal.DeviceError: the backend's ``properties()`` or ``health()`` failed (its own
                exception is the cause), so that a report can name the device and go on.
        """
        return {**self.health(), **self._backend_call("properties", self._impl.properties)}

    def health(self) -> dict[str, int]:
        """Return the device's error counters (``ecc_corrected``, ``ecc_uncorrected``, ``errors``,
        ``resets``; each present only where the backend reports it).

        Raises:
            hal.DeviceError: the backend's ``health()`` failed (its own exception is the cause).
        """
        getter = getattr(self._impl, "health", None)
        return self._backend_call("health", getter) if getter is not None else {}

    def _backend_call(self, what: str, getter: Any) -> dict[str, Any]:
        """``dict(getter())``, a failure of the backend's code (not hal's error tree) as a DeviceError."""
        try:
            return dict(getter())
        except HalError:
            raise
        except Exception as exc:
            raise DeviceError(
                f"the backend's {what}() failed: {type(exc).__name__}: {exc}", device=str(self)
            ) from exc

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
        return self._hash

    # -- factories ---------------------------------------------------------------------
    def alloc(self, nbytes: int, *, stream: Stream | None = None) -> Buffer:
        """Allocate ``nbytes`` bytes of device memory (uninitialized).

        The memory comes from the device's pool (see :meth:`memory_stats`). ``stream``: the
        stream that will use the buffer first; a block freed while work on that same stream may
        still use it is reused at once (the stream's order keeps them apart), blocks pending on
        other streams only after that work is done.

        Raises:
            TypeError: ``nbytes`` is not an integer.
            ValueError: ``nbytes`` is negative or above the device's allocation limit.
            hal.OutOfMemoryError: the device has not enough free memory.
        """
        from hal._memory import Buffer
        from hal._stream import _check_stream

        if stream is not None:
            _check_stream(stream, self)
        return Buffer._allocate(self, nbytes, stream)

    def import_handle(self, handle: bytes) -> Buffer:
        """Return a buffer over memory another process exported with ``Buffer.export_handle()`` (IPC).

        The memory is the exporter's: it is not counted in this device's ``memory_in_use``, and
        closing the returned buffer only unmaps it here. The handle must name this device
        (same backend and index) and the device must have ``capabilities.ipc``.

        Raises:
            TypeError: ``handle`` is not bytes.
            ValueError: ``handle`` is not a hal memory handle.
            hal.DeviceMismatchError: the handle names another device.
            hal.HalError: no IPC here, or the memory cannot be opened (the exporter freed it or exited).
        """
        from hal._memory import Buffer

        return Buffer._import(self, handle)

    def create_stream(self) -> Stream:
        """Create a new stream (an in-order queue of work) on this device."""
        from hal._stream import Stream

        s = Stream._create(self)
        with self._streams_lock:
            self._streams = [
                r for r in self._streams if (x := r()) is not None and x._impl is not None
            ]
            self._streams.append(weakref.ref(s))
        return s

    def _live_streams(self) -> list[Stream]:
        """Return the open streams of this device (the pool records events on the busy ones)."""
        out = []
        for r in self._streams:
            s = r()
            if s is not None and s._impl is not None:
                out.append(s)
        return out

    def create_event(
        self, timing: bool | None = None, *, options: EventOptions | None = None
    ) -> Event:
        """Create an event; with timing (``options.timing`` or ``timing=True``) it records
        timestamps for ``elapsed_ms``.

        ``timing`` is shorthand for ``options.timing`` and wins over it when both are given.

        Raises:
            TypeError: ``options`` is not a :class:`hal.EventOptions`, ``timing`` not a bool.
            hal.HalError: timing asked of a device without timing events.
        """
        from hal._stream import Event

        if options is not None and not isinstance(options, EventOptions):
            raise TypeError(f"options={options!r} is not a hal.EventOptions")
        if timing is None:
            timing = options.timing if options is not None else False
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
            raise DeviceMismatchError(
                f"{self} cannot access peer {other}: no peer path between them"
            )
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
