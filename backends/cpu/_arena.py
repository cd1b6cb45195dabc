"""The CPU emulator's device-memory arena: one memfd, mapped once, shared with hal.comm peers.

Device memory of at least :data:`MIN_BYTES` is a page-aligned range of one sparse memfd of
this process (``HAL_CPU_ARENA``, default on), mapped once (``MAP_SHARED``). The arena is
registered as a shareable host region (:meth:`hal.spi.HostRegion.share`): a hal.comm peer on
the same host that may read this process's memory anyway (the ptrace rights cross-memory
attach needs) maps the whole arena once, and then moves a collective's pieces with a plain
``memcpy`` instead of ``process_vm_readv`` (which pins the pages one by one: 3x slower for
512 KiB here). As with CUDA device memory, which other processes may map through IPC handles,
this is device memory's nature, not a per-call option.

- Pages are taken when first touched and given back to the system (``MADV_REMOVE``) when the
  range is released: an allocation costs what ``numpy.empty`` costs, memory not used costs
  nothing, and the arena's size (:func:`arena_size`) is address space only.
- A range is released when the allocation's last view is gone (queued work, a DLPack export),
  as NumPy memory is: ``free`` of the device memory drops the allocation's own view.
- Where the arena has no room, or cannot exist (no ``memfd_create``), memory is private NumPy
  memory, as with ``HAL_CPU_ARENA=0``: hal.comm then reads it by cross-memory attach.
- A process forked from the owner keeps its copy of the memory as fork promises (its own
  writes stay its own): in the child the arena is mapped again privately (copy-on-write of the
  file), withdrawn from the shared regions, and takes no more allocations (the parent still
  owns the free ranges): the child's new memory is private NumPy memory.
- Frees arrive from finalizers (any thread, the garbage collector included): they only append
  to a queue, which the next allocation takes in under the lock.
"""

from __future__ import annotations

import bisect
import collections
import ctypes
import logging
import mmap
import os
import threading
from typing import Any

import numpy as np

from hal import spi

__all__ = ["MIN_BYTES", "Arena", "arena", "arena_size", "device_array", "storage"]

#: The smallest allocation placed in the arena (smaller ones are NumPy memory: collectives
#: send them through the shared-memory slots, not by reference).
MIN_BYTES = 64 << 10
_PAGE = mmap.PAGESIZE
_MAP_FIXED = 0x10
_MAP_NORESERVE = 0x4000
_log = logging.getLogger("hal.backends.cpu")


def arena_size(capacity: int, devices: int) -> int:
    """The arena's size (address space, not memory) for ``devices`` devices of ``capacity``
    bytes: twice their total (room to spare for fragmentation), at least 64 GiB, at most 1 TiB."""
    return min(max(2 * capacity * devices, 64 << 30), 1 << 40)


class _Release:
    """Kept in an allocation's ctypes object: when that object goes (its last view with it),
    the range returns to the arena."""

    __slots__ = ("arena", "nbytes", "offset")

    def __init__(self, arena: Arena, offset: int, nbytes: int) -> None:
        self.arena, self.offset, self.nbytes = arena, offset, nbytes

    def __del__(self) -> None:
        self.arena.give_back(self.offset, self.nbytes)


class Arena:
    """``size`` bytes of one memfd mapped at ``base``; allocations are first-fit page ranges."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.fd = os.memfd_create("hal-cpu-arena", os.MFD_CLOEXEC)
        try:
            os.ftruncate(self.fd, size)
            self._map = mmap.mmap(self.fd, size)
        except OSError:
            os.close(self.fd)
            raise
        # the mapping is never closed (an allocation's views point into it)
        self._anchor = ctypes.c_char.from_buffer(self._map)
        self.base: int = ctypes.addressof(self._anchor)
        self.inode = os.fstat(self.fd).st_ino
        self.region = spi.HostRegion(self.base, size, self.fd, self.inode)
        self.forked = False
        self._lock = threading.Lock()
        self._starts = [0]  # free ranges, sorted by offset, never adjacent
        self._sizes = [size]
        self._freed: collections.deque[tuple[int, int]] = collections.deque()
        self.in_use = 0

    def _after_fork(self) -> None:
        """In a forked child: private copy-on-write mapping, withdrawn, no new allocations."""
        self.forked = True
        self._lock = threading.Lock()
        self.region.withdraw()
        libc = ctypes.CDLL(None, use_errno=True)
        libc.mmap.restype = ctypes.c_void_p
        libc.mmap.argtypes = [
            ctypes.c_void_p,
            ctypes.c_size_t,
            ctypes.c_int,
            ctypes.c_int,
            ctypes.c_int,
            ctypes.c_long,
        ]
        prot = mmap.PROT_READ | mmap.PROT_WRITE
        flags = mmap.MAP_PRIVATE | _MAP_FIXED | _MAP_NORESERVE

        def private(offset: int, n: int) -> bool:
            return bool(
                libc.mmap(self.base + offset, n, prot, flags, self.fd, offset) == self.base + offset
            )

        if private(0, self.size):
            return
        # no commit for the whole (strict overcommit): the ranges in use, each its own mapping
        at = 0
        for start, n in [*zip(self._starts, self._sizes, strict=True), (self.size, 0)]:
            if start > at and not private(at, start - at):  # pragma: no cover - out of memory
                _log.warning(
                    "hal cpu arena: a forked child shares %d bytes with its parent", start - at
                )
            at = start + n

    def take(self, nbytes: int) -> Any | None:
        """Return a ctypes byte array of ``nbytes`` in the arena (its range given back when the
        array and every view of it are gone), or None: no free range is large enough."""
        need = -(-max(nbytes, 1) // _PAGE) * _PAGE
        if self.forked:
            return None
        with self._lock:
            self._take_in_freed()
            for i, have in enumerate(self._sizes):
                if have >= need:
                    offset = self._starts[i]
                    if have == need:
                        del self._starts[i], self._sizes[i]
                    else:
                        self._starts[i] += need
                        self._sizes[i] -= need
                    self.in_use += need
                    break
            else:
                return None
        raw = (ctypes.c_uint8 * nbytes).from_address(self.base + offset)
        raw.hal_release = _Release(self, offset, need)  # type: ignore[attr-defined]
        return raw

    def give_back(self, offset: int, nbytes: int) -> None:
        """Free the range (its pages go back to the system now; the range at the next take)."""
        if self.forked:  # the parent's pages: the child's copy goes with its mapping
            return
        try:
            self._map.madvise(mmap.MADV_REMOVE, offset, nbytes)
        except (OSError, ValueError):  # pragma: no cover - the pages stay; the range is reused
            pass
        self._freed.append((offset, nbytes))

    def free_ranges(self) -> list[tuple[int, int]]:
        """The free ``(offset, size)`` ranges, in offset order (after the pending frees)."""
        with self._lock:
            self._take_in_freed()
            return list(zip(self._starts, self._sizes, strict=True))

    def _take_in_freed(self) -> None:
        starts, sizes = self._starts, self._sizes
        while self._freed:
            offset, n = self._freed.popleft()
            self.in_use -= n
            i = bisect.bisect(starts, offset)
            if i and starts[i - 1] + sizes[i - 1] == offset:  # joins the range before
                i -= 1
                sizes[i] += n
            else:
                starts.insert(i, offset)
                sizes.insert(i, n)
            if i + 1 < len(starts) and starts[i] + sizes[i] == starts[i + 1]:  # and the one after
                sizes[i] += sizes.pop(i + 1)
                del starts[i + 1]


_arena: Arena | None = None
_arena_tried = False
_arena_lock = threading.Lock()


def arena(size: int) -> Arena | None:
    """The process's arena (made at the first call, of ``size`` bytes, and registered as a
    shareable host region), or None: no memfd here (the caller reads ``HAL_CPU_ARENA``)."""
    global _arena, _arena_tried
    if _arena_tried:
        return _arena
    with _arena_lock:
        if not _arena_tried:
            if hasattr(os, "memfd_create"):
                try:
                    made = Arena(size)
                except OSError:
                    made = None
                if made is not None:
                    made.region.share()
                    os.register_at_fork(after_in_child=made._after_fork)
                _arena = made
            _arena_tried = True
    return _arena


def storage(arena: Arena | None, nbytes: int) -> np.ndarray[Any, Any] | None:
    """``nbytes`` (uint8) of ``arena`` for an allocation of that size, or None: no arena, under
    :data:`MIN_BYTES`, or no room (the caller's memory is private NumPy memory then)."""
    raw = arena.take(nbytes) if arena is not None and nbytes >= MIN_BYTES else None
    return None if raw is None else np.frombuffer(raw, dtype=np.uint8)


def device_array(nbytes: int) -> np.ndarray[Any, Any]:
    """``nbytes`` of memory of the kind a device allocation of that size gets (uint8): the
    memory bench's baseline copies between memory of the kinds hal's copy has."""
    got = storage(_arena if spi.setting("HAL_CPU_ARENA") else None, nbytes)
    return np.empty(nbytes, np.uint8) if got is None else got
