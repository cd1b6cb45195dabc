"""The device memory pool: one per device, written once in core over the SPI.

Every :meth:`hal.Device.alloc` goes through the pool of its device (unless
``HAL_MEMORY_POOL=0``). The pool caches whole backend allocations (*blocks*) instead of
returning them to the backend at ``close()``, and hands a cached block to a later
allocation of the same *size class*:

- sizes are rounded up to 512 bytes below 1 MiB and to 128 KiB from 1 MiB up; an allocation
  takes the smallest cached block of at least its rounded size and at most 1/8 larger
  (best fit within the class, so little memory is wasted inside a block);
- reuse is stream-ordered: when a block is freed while work queued on a stream may still use
  it, the pool records an event on each such stream; the block goes to an allocation on that
  same stream at once (``Device.alloc(n, stream=s)``: the stream's order already puts the new
  work after the old), to anyone else only once those events have completed;
- an allocation the backend refuses (out of memory, or past ``HAL_MEMORY_LIMIT``) frees the
  cache and is retried once (as CuPy does); the ``OutOfMemoryError`` that remains says what
  was requested, what is in use, what the pool holds, the largest free block and whether
  freeing the cache helped.

Accounting: *in use* = bytes of the blocks held by live buffers (each rounded up to its
class); *reserved* = in use + the cache, all taken from the backend. ``Device.memory_in_use``
stays "bytes held by live buffers": the backend's count minus the cache, so a closed buffer
returns its bytes at once, as without the pool. docs/memory.md describes it all.

Frees arrive from ``Buffer.close()`` and from the garbage collector (any thread, any time):
they only append to a queue; the pool takes the queue in at its next call, under its lock.
"""

from __future__ import annotations

import bisect
import collections
import threading
import weakref
from typing import TYPE_CHECKING, Any

from hal import _trace
from hal._errors import HalError, OutOfMemoryError
from hal._settings import MemoryOptions
from hal._spi import MemoryImpl

if TYPE_CHECKING:
    from hal._device import Device
    from hal._stream import Event, Stream

__all__ = ["Block", "Pool", "round_size", "size_class_label"]

_SMALL = 512
_LARGE = 128 << 10
_LARGE_FROM = 1 << 20
_SLACK = 8  # a cached block may be up to 1/_SLACK larger than the rounded request


def round_size(nbytes: int) -> int:
    """Return the block size the pool allocates for ``nbytes``: 512 B steps below 1 MiB, then 128 KiB."""
    step = _SMALL if nbytes < _LARGE_FROM else _LARGE
    return max(step, -(-nbytes // step) * step)


def size_class_label(size: int) -> str:
    """Return the name of the statistics bucket of a block of ``size`` bytes (powers of two)."""
    top = 1 << max(9, (size - 1).bit_length())
    for unit, shift in (("G", 30), ("M", 20), ("K", 10)):
        if top >= 1 << shift:
            return f"<={top >> shift}{unit}"
    return f"<={top}"


class Block:
    """One backend allocation owned by the pool (live in a buffer, or cached)."""

    __slots__ = ("counts", "events", "exported", "impl", "size")

    def __init__(self, impl: MemoryImpl, size: int, counts: list[int]) -> None:
        self.impl = impl
        self.size = size
        self.counts = counts  # [allocs, live] of its size class (shared by the class)
        #: exported zero-copy (DLPack): a consumer may still read it, so it goes back to the backend
        self.exported = False
        #: (stream, event) per stream that may still use the block since it was freed
        self.events: list[tuple[weakref.ref[Stream], Event]] = []


class Pool:
    """The memory pool of one device (internal; reached through :class:`hal.Device`).

    Args:
        device: the device.
        limit: most bytes the pool takes from the backend (``HAL_MEMORY_LIMIT``; 0: none).
    """

    def __init__(self, device: Device, limit: int = 0) -> None:
        self._device = device
        self._impl = device._impl
        self._max_alloc = device.capabilities.max_alloc_bytes  # a class may not round past it
        self.limit = limit
        self._lock = threading.RLock()
        self._freed: collections.deque[tuple[Block, int]] = collections.deque()
        self._cache: dict[int, list[Block]] = {}
        self._sizes: list[int] = []  # sorted sizes with cached blocks
        self._cached = 0  # bytes of cached blocks
        self._live = 0  # bytes of blocks held by live buffers
        self._inflight = 0  # bytes being allocated from the backend right now (without the lock)
        self._requested = 0  # bytes live buffers asked for
        self._peak = 0
        self._peak_reserved = 0
        self._keep = 0  # Device.reserve(): bytes empty_cache() leaves cached
        self.allocs = 0
        self.frees = 0
        self.hits = 0
        self.misses = 0
        self.backend_allocs = 0
        self.backend_frees = 0
        self.oom_retries = 0
        self.ooms = 0
        self._classes: dict[str, list[int]] = {}  # label -> [allocs, live blocks]

    # -- the public side (through Device) ---------------------------------------------------
    def alloc(self, nbytes: int, stream: Stream | None) -> Block:
        """Return a block of at least ``nbytes`` (> 0) bytes; raise ``hal.OutOfMemoryError``."""
        size = round_size(nbytes)
        with self._lock:
            self._take_freed()
            block = self._from_cache(size, stream)
            if block is not None:
                self.hits += 1
                self._account(block, nbytes)
        if block is None:  # the backend is called without the lock: other threads' hits go on
            block = self._from_backend(nbytes, size, live=True)
        if _trace.tracer() is not None:
            self._count()
        return block

    def _account(self, block: Block, nbytes: int) -> None:
        self.allocs += 1
        self._live += block.size
        self._requested += nbytes
        if self._live > self._peak:
            self._peak = self._live
        counts = block.counts
        counts[0] += 1
        counts[1] += 1

    def free(self, block: Block, nbytes: int) -> None:
        """Take ``block`` back (a buffer was closed or collected). Safe from any thread, at any time."""
        if (
            block.exported
        ):  # to the backend at once, as without the pool (an importer sees it freed)
            block.impl.free()
        self._freed.append((block, nbytes))  # atomic; taken in under the lock at the next call

    def empty_cache(self, *, keep: int | None = None) -> int:
        """Return the cached blocks whose streams are done to the backend; return the bytes released.

        Blocks still awaited by a stream are waited for first (their events are synchronized).
        ``keep`` (default: what :meth:`reserve` asked for) bytes of cache stay.
        """
        with self._lock:
            self._take_freed()
            released = self._release_cache(self._keep if keep is None else keep)
        if _trace.tracer() is not None:
            self._count()
        return released

    def reserve(self, nbytes: int) -> int:
        """Pre-allocate ``nbytes`` into the cache (one block) and keep that much cached; return bytes added."""
        if nbytes <= 0:
            return 0
        size = round_size(nbytes)
        with self._lock:
            self._take_freed()
            block = self._from_backend(nbytes, size, live=False)
            self._put(block)
            self._keep = max(self._keep, block.size)
        if _trace.tracer() is not None:
            self._count()
        return block.size

    def memory_in_use(self) -> int | None:
        """Bytes of the device held by live buffers (the backend's count minus the cache), or None."""
        with self._lock:
            self._take_freed()
            used = self._impl.memory_in_use()
            return None if used is None else used - self._cached

    def stats(self) -> dict[str, Any]:
        """Return the statistics of :meth:`hal.Device.memory_stats`."""
        with self._lock:
            self._take_freed()
            largest = self._sizes[-1] if self._sizes else 0
            reserved = self._live + self._cached
            backend = self._impl.memory_in_use()
            total = self._impl.total_memory
            device_free = None if backend is None else max(0, total - backend)
            return {
                "device": str(self._device),
                "pool": True,
                "in_use": self._live,
                "requested": self._requested,
                "reserved": reserved,
                "cached": self._cached,
                "peak_in_use": self._peak,
                "peak_reserved": self._peak_reserved,
                "limit": self.limit or None,
                "total_memory": total,
                "device_free": device_free,
                "largest_free_block": largest,
                "fragmentation": (1.0 - largest / self._cached) if self._cached else 0.0,
                "cached_blocks": sum(len(v) for v in self._cache.values()),
                "allocs": self.allocs,
                "frees": self.frees,
                "cache_hits": self.hits,
                "cache_misses": self.misses,
                "backend_allocs": self.backend_allocs,
                "backend_frees": self.backend_frees,
                "oom_retries": self.oom_retries,
                "ooms": self.ooms,
                "kept_by_reserve": self._keep,
                "size_classes": {
                    k: {"allocs": v[0], "live": v[1]}
                    for k, v in sorted(self._classes.items(), key=lambda kv: _label_bytes(kv[0]))
                },
            }

    # -- internals (under the lock) ----------------------------------------------------------
    def _take_freed(self) -> None:
        freed = self._freed
        while freed:
            block, nbytes = freed.popleft()
            self.frees += 1
            self._live -= block.size
            self._requested -= nbytes
            block.counts[1] -= 1
            if (
                block.exported
            ):  # never reused; freed by free(): the backend keeps it alive for consumers
                self.backend_frees += 1
                continue
            block.events = self._pending_streams()
            self._put(block)

    def _pending_streams(self) -> list[tuple[weakref.ref[Stream], Event]]:
        """Record an event on every stream of the device with queued work (it may use the block)."""
        out: list[tuple[weakref.ref[Stream], Event]] = []
        for s in self._device._live_streams():
            try:
                if s.query():
                    continue
                ev = self._device.create_event()
                # straight on the SPI stream: a fallback host wait (Stream.wait_host without a
                # native signal) must not block a free; what used the block is already enqueued
                s._open().record(ev._live())
                ev._recorded = True
            except HalError:
                continue  # a failed or closing stream runs nothing more on the block
            out.append((weakref.ref(s), ev))
        return out

    def _put(self, block: Block) -> None:
        lst = self._cache.get(block.size)
        if lst is None:
            lst = self._cache[block.size] = []
            bisect.insort(self._sizes, block.size)
        lst.append(block)
        self._cached += block.size

    def _remove(self, block: Block) -> None:
        lst = self._cache[block.size]
        lst.remove(block)
        if not lst:
            del self._cache[block.size]
            del self._sizes[bisect.bisect_left(self._sizes, block.size)]
        self._cached -= block.size

    @staticmethod
    def _ready(block: Block, stream: Stream | None) -> bool:
        if not block.events:
            return True
        if stream is not None and all(ref() is stream for ref, _ in block.events):
            return True  # the same stream: its order puts the new work after the old
        try:
            if all(ev.query() for _, ev in block.events):
                for _, ev in block.events:
                    ev.close()
                block.events = []
                return True
        except HalError:
            return False
        return False

    def _from_cache(self, size: int, stream: Stream | None) -> Block | None:
        i = bisect.bisect_left(self._sizes, size)
        top = size + size // _SLACK
        while i < len(self._sizes) and self._sizes[i] <= top:
            for block in self._cache[self._sizes[i]]:
                if self._ready(block, stream):
                    self._remove(block)
                    for _, ev in block.events:
                        ev.close()
                    block.events = []
                    return block
            i += 1
        return None

    def _from_backend(self, nbytes: int, size: int, *, live: bool) -> Block:
        """Allocate a new block from the backend (retried once after freeing the cache)."""
        lock = self._lock
        with lock:
            self.misses += 1
        freed = 0
        first: OutOfMemoryError | None = None
        for attempt in (0, 1):
            if attempt:
                with lock:
                    if not self._cached or self._room_after_freeing() < nbytes:
                        break  # freeing the cache cannot help: keep it, no second try
                    self.oom_retries += 1
                    freed = self._release_cache(0)
            top = self._max_alloc
            first_try = size if top is None or size <= top else nbytes
            for want in dict.fromkeys(
                (first_try, nbytes)
            ):  # the exact size when the class does not fit
                with lock:
                    held = self._live + self._cached + self._inflight
                    if self.limit and held + want > self.limit:
                        if first is None:
                            first = OutOfMemoryError(
                                f"HAL_MEMORY_LIMIT={self.limit} allows {max(0, self.limit - held)} more bytes",
                                device=str(self._device),
                            )
                        continue
                    self._inflight += want
                try:
                    impl = self._impl.alloc(want)
                except OutOfMemoryError as exc:
                    with lock:
                        self._inflight -= want
                    first = first or exc
                    continue
                except BaseException:
                    with lock:
                        self._inflight -= want
                    raise
                with lock:
                    self._inflight -= want
                    self.backend_allocs += 1
                    label = size_class_label(want)
                    counts = self._classes.get(label)
                    if counts is None:
                        counts = self._classes[label] = [0, 0]
                    block = Block(impl, want, counts)
                    if live:
                        self._account(block, nbytes)
                    self._peak_reserved = max(
                        self._peak_reserved,
                        self._live + self._cached + self._inflight + (0 if live else want),
                    )
                return block
        with lock:
            self.ooms += 1
            raise self._oom_error(nbytes, size, freed, first)

    def _room_after_freeing(self) -> int:
        """Bytes an allocation could get once the cache is freed (by the backend's count and the limit)."""
        room = 1 << 62
        used = self._impl.memory_in_use()
        if used is not None:
            room = self._impl.total_memory - used + self._cached
        if self.limit:
            room = min(room, self.limit - self._live - self._inflight)
        return max(0, room)

    def _oom_error(
        self, nbytes: int, size: int, freed: int, cause: OutOfMemoryError | None
    ) -> OutOfMemoryError:
        dev = str(self._device)
        why = str(cause) if cause is not None else "the backend refused"
        if why.startswith(f"{dev}: "):
            why = why[len(dev) + 2 :]
        largest = self._sizes[-1] if self._sizes else 0
        if freed:
            helped = f"freeing the cache ({freed} bytes) and retrying did not help"
        elif self._cached:
            helped = (
                f"freeing the cache ({self._cached} bytes) would not help: "
                f"{self._room_after_freeing()} bytes would be free; kept it"
            )
        else:
            helped = "the cache was empty: freeing it would not help"
        exc = OutOfMemoryError(
            f"{why}; pool: requested {nbytes} bytes (block {size}), in use {self._live}, "
            f"reserved {self._live + self._cached}, largest free block {largest}; {helped}",
            device=dev,
        )
        exc.__cause__ = cause
        return exc

    def _release_cache(self, keep: int) -> int:
        released = 0
        for size in sorted(self._sizes):  # small blocks first: what stays is few, large blocks
            for block in list(self._cache.get(size, ())):
                if self._cached <= keep:
                    return released
                if block.events:
                    for _, ev in block.events:
                        try:
                            ev.synchronize()
                        except HalError:
                            pass
                        ev.close()
                    block.events = []
                self._remove(block)
                block.impl.free()
                self.backend_frees += 1
                released += block.size
        return released

    def _count(self) -> None:
        tr = _trace.tracer()
        if tr is not None:
            with self._lock:
                values = {"in_use": self._live, "reserved": self._live + self._cached}
            tr.counter(f"{self._device} memory", values)


def _label_bytes(label: str) -> int:
    num = label[2:]
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(num[-1:], 1)
    return int(num.rstrip("KMG")) * mult


def pool_settings() -> tuple[bool, int, int]:
    """Read ``HAL_MEMORY_POOL``, ``HAL_MEMORY_LIMIT`` and ``HAL_MEMORY_RESERVE`` (hal.ConfigError when bad)."""
    opts = MemoryOptions.from_env()
    return bool(opts.pool), int(opts.limit or 0), int(opts.reserve or 0)
