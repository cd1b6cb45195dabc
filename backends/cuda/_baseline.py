"""The raw-CuPy baseline of ``hal bench memory``: the same transfers with CuPy's own copy calls.

Each direction is one CuPy ``MemoryPointer`` copy on a non-blocking ``cupy.cuda.Stream``
followed by ``stream.synchronize()``, timed on the host with ``time.perf_counter`` (the
method ``hal bench memory`` uses for hal):

- ``h2d``: ``MemoryPointer.copy_from_host_async`` from host memory to device 0;
- ``d2h``: ``MemoryPointer.copy_to_host_async`` from device 0 to host memory;
- ``d2d``: ``MemoryPointer.copy_from_device_async`` within device 0;
- ``peer``: ``runtime.memcpyPeerAsync`` from device 1 to device 0 (peer access enabled).

Host memory is what hal is given in the benchmark, a NumPy array in pageable memory
(``HAL_CUDA_BASELINE_HOST=pageable``, the default), or page-locked memory from
``cupy.cuda.alloc_pinned_memory`` (``HAL_CUDA_BASELINE_HOST=pinned``: the fastest the
hardware does, to compare hal's pinned path with). "Device 0/1" are hal's ``cuda:0``/``cuda:1``
(``HAL_CUDA_DEVICES`` applies).
"""

from __future__ import annotations

import ctypes
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from hal import BackendUnavailableError, spi
from hal.backends.cuda._errors import is_cuda_error, translate_cuda_error

__all__ = ["DIRECTIONS", "HOST_KINDS", "memory_baseline", "transfer_seconds"]

#: the transfer directions :func:`memory_baseline` knows
DIRECTIONS = spi.TRANSFER_DIRECTIONS
#: the kinds of host memory for ``h2d``/``d2h``
HOST_KINDS = ("pageable", "pinned")

_WARMUP = 2

# The last prepared transfer, reused while the bench asks for the same one round after round
# (allocating 256 MiB of pinned memory per call would dominate the run).
_cached: tuple[tuple[str, int, str], Callable[[], None], int, Any] | None = None


def memory_baseline(direction: str, nbytes: int, repeat: int) -> float:
    """Time one raw-CuPy transfer of ``nbytes`` bytes; return the median seconds per transfer.

    Buffers are allocated and filled before timing; two untimed warm-up transfers run
    first, then ``repeat`` timed ones, each a copy enqueued on a non-blocking stream and
    ``stream.synchronize()``. Host memory kind: ``HAL_CUDA_BASELINE_HOST`` (module docstring).

    Args:
        direction: ``"h2d"``, ``"d2h"``, ``"d2d"`` or ``"peer"``.
        nbytes: bytes per transfer (> 0).
        repeat: timed transfers (>= 1).

    Raises:
        ValueError: unknown ``direction``, bad sizes, or ``peer`` with fewer than two devices.
        hal.BackendUnavailableError: CuPy, the driver or a GPU is missing (the reason says which).
    """
    host = str(spi.setting("HAL_CUDA_BASELINE_HOST"))
    return transfer_seconds(direction, nbytes, repeat, host=host)


def transfer_seconds(direction: str, nbytes: int, repeat: int, *, host: str = "pageable") -> float:
    """Like :func:`memory_baseline`, with the host memory kind given (``"pageable"``/``"pinned"``)."""
    global _cached
    spi.check_baseline_args(direction, nbytes, repeat)
    if host not in HOST_KINDS:
        raise ValueError(
            f"host={host!r} (HAL_CUDA_BASELINE_HOST) must be one of {', '.join(HOST_KINDS)}"
        )
    key = (direction, nbytes, host)
    if _cached is None or _cached[0] != key:
        _cached = None  # free the previous buffers first
        try:
            transfer, ordinal, keep = _prepare(direction, nbytes, host)
        except RuntimeError as exc:
            if is_cuda_error(exc):
                raise translate_cuda_error(exc) from exc
            raise
        _cached = (key, transfer, ordinal, keep)
        warmup = _WARMUP
    else:
        warmup = 0
    import cupy

    _, transfer, ordinal, _ = _cached
    samples = []
    with cupy.cuda.Device(ordinal):
        for _ in range(warmup):
            transfer()
        for _ in range(repeat):
            start = time.perf_counter()
            transfer()
            samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def _ordinals() -> list[int]:
    from hal.backends.cuda._backend import _import_cupy, _no_gpu_reason, parse_device_filter

    cupy = _import_cupy()  # BackendUnavailableError without CuPy or without a CUDA driver
    from cupy_backends.cuda.api import runtime as rt

    try:
        count = int(rt.getDeviceCount())
    except (RuntimeError, OSError) as exc:
        raise BackendUnavailableError("cuda", _no_gpu_reason(exc, cupy)) from exc
    return parse_device_filter(spi.setting("HAL_CUDA_DEVICES"), count)


def _host(nbytes: int, host: str) -> tuple[int, Any]:
    """Return ``(address, owner)`` of ``nbytes`` of filled host memory of kind ``host``."""
    import cupy

    if host == "pinned":
        mem = cupy.cuda.alloc_pinned_memory(nbytes)
        arr = np.frombuffer(
            memoryview((ctypes.c_ubyte * nbytes).from_address(int(mem.ptr))), dtype=np.uint8
        )
        arr[:] = np.resize(np.arange(251, dtype=np.uint8), nbytes)
        return int(mem.ptr), (mem, arr)
    arr = np.resize(np.arange(251, dtype=np.uint8), nbytes)
    return int(arr.ctypes.data), arr


def _prepare(direction: str, nbytes: int, host: str) -> tuple[Callable[[], None], int, Any]:
    """Allocate and fill the buffers of one transfer; return ``(transfer, ordinal, objects to keep)``."""
    ordinals = _ordinals()  # raises BackendUnavailableError before CuPy is used
    import cupy
    from cupy_backends.cuda.api import runtime as rt

    if direction == "peer" and len(ordinals) < 2:
        raise ValueError(f"direction='peer' needs two CUDA devices; {len(ordinals)} visible")
    d0 = ordinals[0]
    with cupy.cuda.Device(d0):
        stream = cupy.cuda.Stream(non_blocking=True)
        a = cupy.cuda.MemoryPointer(cupy.cuda.Memory(nbytes), 0)  # cudaMalloc, as hal allocates
        a.memset_async(1, nbytes, stream)
        if direction in ("h2d", "d2h"):
            ptr, owner = _host(nbytes, host)

            def transfer() -> None:
                if direction == "h2d":
                    a.copy_from_host_async(ptr, nbytes, stream)
                else:
                    a.copy_to_host_async(ptr, nbytes, stream)
                stream.synchronize()

            keep: Any = (stream, a, owner)
        elif direction == "d2d":
            b = cupy.cuda.MemoryPointer(cupy.cuda.Memory(nbytes), 0)
            b.memset_async(2, nbytes, stream)

            def transfer() -> None:
                a.copy_from_device_async(b, nbytes, stream)
                stream.synchronize()

            keep = (stream, a, b)
        else:
            d1 = ordinals[1]
            with cupy.cuda.Device(d1):
                b = cupy.cuda.MemoryPointer(cupy.cuda.Memory(nbytes), 0)
                b.memset(2, nbytes)
            for x, y in ((d0, d1), (d1, d0)):
                if rt.deviceCanAccessPeer(x, y):
                    with cupy.cuda.Device(x):
                        try:
                            rt.deviceEnablePeerAccess(y)
                        except RuntimeError as exc:
                            if int(getattr(exc, "status", -1)) != 704:  # already enabled
                                raise

            def transfer() -> None:
                rt.memcpyPeerAsync(a.ptr, d0, b.ptr, d1, nbytes, stream.ptr)
                stream.synchronize()

            keep = (stream, a, b)
        stream.synchronize()
    return transfer, d0, keep
