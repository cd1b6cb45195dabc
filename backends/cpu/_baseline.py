"""The raw-NumPy baseline of ``hal bench memory``: the same transfers with ``numpy.copyto``.

On the CPU emulator host memory and device memory are both NumPy byte arrays, so every
direction (``h2d``, ``d2h``, ``d2d``, ``peer``) is one ``numpy.copyto`` between two
uint8 arrays: exactly the work a hal copy does, without hal's validation and stream queue.
The device side of a direction is memory of the device's kind, as hal's copy has it: from
64 KiB a range of the process's shared arena (``HAL_CPU_ARENA``; 4 KiB shared-memory pages,
where NumPy's large arrays may get transparent huge pages), host memory a NumPy array.
"""

from __future__ import annotations

import statistics
import time

import numpy as np

from hal import spi
from hal.backends.cpu import _arena

__all__ = ["DIRECTIONS", "memory_baseline"]

#: the transfer directions :func:`memory_baseline` knows
DIRECTIONS = spi.TRANSFER_DIRECTIONS

_WARMUP = 2


def memory_baseline(direction: str, nbytes: int, repeat: int) -> float:
    """Time one ``numpy.copyto`` of ``nbytes`` bytes; return the median seconds per transfer.

    Both arrays are allocated and touched before timing; two untimed warm-up copies run
    first, then ``repeat`` timed copies (``copyto`` is synchronous: nothing to wait for).

    Args:
        direction: ``"h2d"``, ``"d2h"``, ``"d2d"`` or ``"peer"`` (all the same on the host).
        nbytes: bytes per transfer (> 0).
        repeat: timed transfers (>= 1).

    Raises:
        ValueError: unknown ``direction`` or bad sizes.
    """
    spi.check_baseline_args(direction, nbytes, repeat)
    src = _arena.device_array(nbytes) if direction != "h2d" else np.empty(nbytes, np.uint8)
    src[:] = np.resize(np.arange(251, dtype=np.uint8), nbytes)
    dst = _arena.device_array(nbytes) if direction != "d2h" else np.empty(nbytes, np.uint8)
    dst[:] = 0
    for _ in range(_WARMUP):
        np.copyto(dst, src)
    samples = []
    for _ in range(repeat):
        start = time.perf_counter()
        np.copyto(dst, src)
        samples.append(time.perf_counter() - start)
    if not np.array_equal(dst, src):  # pragma: no cover - would mean NumPy is broken
        raise AssertionError("numpy.copyto baseline produced a wrong result")
    return statistics.median(samples)
