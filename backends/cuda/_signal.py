"""Host signals on CUDA: ``cuStreamWaitValue32`` on a word of mapped, pinned host memory.

``wait_host`` takes a word from a per-device slab of pinned host memory (``cudaHostAlloc``
with ``cudaHostAllocMapped``) and enqueues ``cuStreamWaitValue32_v2(stream, word, target,
CU_STREAM_WAIT_VALUE_GEQ)``; ``set`` stores ``target`` into the word from the host, and the
GPU's front end, which polls the word, lets the stream go on. No host thread blocks and no
CUDA host-function thread is held (a blocking ``cudaLaunchHostFunc`` would stall every
other host function of the process).

Words are reused as soon as they are set: each use waits for a higher generation than the
last (``GEQ`` compares with wrap-around), so an old wait still polling a reused word was
already released by the store that ended it. The v2 stream memory operations need a CUDA
11.7+ driver (they are on by default there); without them the device declares
``host_signal`` absent with the reason and hal core falls back to a host wait.

A stream blocked in ``cuStreamWaitValue32`` holds its hardware queue. With more streams than
queues (``CUDA_DEVICE_MAX_CONNECTIONS``, 8 by default) another stream sharing that queue, a
``hal.comm`` engine's for instance, can be held back behind the wait, which CUDA cannot see
through: keep the stream count low, raise ``CUDA_DEVICE_MAX_CONNECTIONS``, or set
``HAL_CUDA_HOST_SIGNAL=0`` to use hal core's host wait instead.
"""

from __future__ import annotations

import ctypes
import threading
from typing import Any

import numpy as np
from cupy_backends.cuda.api import runtime as rt

from hal import StreamError, spi
from hal.spi import HostSignalImpl

__all__ = ["CudaHostSignal", "HostSignalSlab", "driver_wait_value", "enabled_from_env"]

_WAIT_GEQ = 0x0  # CU_STREAM_WAIT_VALUE_GEQ
_HOST_ALLOC_PORTABLE_MAPPED = 0x1 | 0x2  # cudaHostAllocPortable | cudaHostAllocMapped
_SLAB_WORDS = 4096

_driver: Any = None
_driver_reason: str | None = None
_driver_lock = threading.Lock()


def enabled_from_env() -> str | None:
    """Return why ``HAL_CUDA_HOST_SIGNAL`` turns native host signals off, or None (on, the default)."""
    if spi.setting("HAL_CUDA_HOST_SIGNAL"):  # hal.ConfigError (a ValueError) names a bad value
        return None
    return "disabled by HAL_CUDA_HOST_SIGNAL=0 (hal core waits on the host instead)"


def driver_wait_value() -> tuple[Any, str | None]:
    """Return ``(libcuda, None)`` when ``cuStreamWaitValue32_v2`` is callable, else ``(None, reason)``."""
    global _driver, _driver_reason
    with _driver_lock:
        if _driver is None and _driver_reason is None:
            try:
                lib = ctypes.CDLL("libcuda.so.1")
                wait = lib.cuStreamWaitValue32_v2
                devptr = lib.cuMemHostGetDevicePointer_v2
            except (OSError, AttributeError) as exc:
                _driver_reason = f"the CUDA driver has no cuStreamWaitValue32_v2 (a CUDA 11.7+ driver is needed): {exc}"
            else:
                wait.argtypes = [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_uint32, ctypes.c_uint]
                wait.restype = ctypes.c_int
                devptr.argtypes = [ctypes.POINTER(ctypes.c_uint64), ctypes.c_void_p, ctypes.c_uint]
                devptr.restype = ctypes.c_int
                _driver = lib
        return _driver, _driver_reason


class HostSignalSlab:
    """The pinned words of one device's host signals, with their free list and generations."""

    def __init__(self, label: str) -> None:
        self.label = label
        self._lock = threading.Lock()
        self._free: list[
            tuple[np.ndarray[Any, Any], int, int]
        ] = []  # (words, index, device address)
        self._generation: dict[tuple[int, int], int] = {}
        self._slabs: list[int] = []

    def _grow(self) -> None:
        lib, reason = driver_wait_value()
        if lib is None:
            raise StreamError(f"host signals are unavailable: {reason}", device=self.label)
        ptr = int(rt.hostAlloc(_SLAB_WORDS * 4, _HOST_ALLOC_PORTABLE_MAPPED))
        self._slabs.append(ptr)
        words = np.ctypeslib.as_array((ctypes.c_uint32 * _SLAB_WORDS).from_address(ptr))
        words[:] = 0
        dev = ctypes.c_uint64(0)
        status = lib.cuMemHostGetDevicePointer_v2(ctypes.byref(dev), ctypes.c_void_p(ptr), 0)
        if status != 0:
            raise StreamError(
                f"cuMemHostGetDevicePointer failed (CUresult {status})",
                device=self.label,
                code=status,
            )
        for i in range(_SLAB_WORDS):
            self._free.append((words, i, int(dev.value) + 4 * i))

    def take(self) -> tuple[np.ndarray[Any, Any], int, int, int]:
        """Return ``(words, index, device address, target)`` of a free word."""
        with self._lock:
            if not self._free:
                self._grow()
            words, i, addr = self._free.pop()
            key = (id(words), i)
            target = (self._generation.get(key, 0) + 1) & 0xFFFFFFFF
            self._generation[key] = target
            return words, i, addr, target

    def give_back(self, words: np.ndarray[Any, Any], i: int, addr: int) -> None:
        """Return a word whose store was made (its waits are all released)."""
        with self._lock:
            self._free.append((words, i, addr))

    def close(self) -> None:
        """Free the pinned memory (only when no wait can still read it: at backend close)."""
        with self._lock:
            for ptr in self._slabs:
                rt.freeHost(ptr)
            self._slabs.clear()
            self._free.clear()


class CudaHostSignal(HostSignalImpl):
    """One ``cuStreamWaitValue32`` wait; :meth:`set` stores its target value into the word."""

    __slots__ = ("_addr", "_index", "_slab", "_target", "_words")

    def __init__(self, slab: HostSignalSlab, stream_ptr: int) -> None:
        lib, reason = driver_wait_value()
        if lib is None:
            raise StreamError(f"host signals are unavailable: {reason}", device=slab.label)
        words, i, addr, target = slab.take()
        status = lib.cuStreamWaitValue32_v2(ctypes.c_void_p(stream_ptr), addr, target, _WAIT_GEQ)
        if status != 0:
            slab.give_back(words, i, addr)
            raise StreamError(
                f"cuStreamWaitValue32 failed (CUresult {status})", device=slab.label, code=status
            )
        self._slab, self._words, self._index, self._addr, self._target = (
            slab,
            words,
            i,
            addr,
            target,
        )

    def set(self) -> None:
        self._words[self._index] = self._target  # the GPU polls the word: the stream goes on
        self._slab.give_back(self._words, self._index, self._addr)
