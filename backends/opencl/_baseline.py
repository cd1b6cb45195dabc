"""The raw-PyOpenCL baseline of ``hal bench memory``: the same transfers without hal.

Runs on the devices the backend selects (same ``HAL_OPENCL_PLATFORM``/``HAL_OPENCL_DEVICES``
filters, one context per platform like the backend), so the ratio measures hal's overhead.
"""

from __future__ import annotations

import functools
import os
import statistics
import time
from typing import TYPE_CHECKING, Any

import numpy as np

from hal._errors import DeviceMismatchError
from hal.backends.opencl._select import import_pyopencl, select_devices

if TYPE_CHECKING:
    import pyopencl as cl

__all__ = ["DIRECTIONS", "memory_baseline"]

#: the transfer directions :func:`memory_baseline` knows
DIRECTIONS = ("h2d", "d2h", "d2d", "peer")


def _setup() -> tuple[Any, list[tuple[cl.Device, cl.Context]]]:
    """Return pyopencl and the selected devices with their (per-platform) contexts."""
    env = tuple(os.environ.get(k, "") for k in ("HAL_OPENCL_PLATFORM", "HAL_OPENCL_DEVICES"))
    return _setup_for(env)


@functools.lru_cache(maxsize=4)
def _setup_for(env: tuple[str, ...]) -> tuple[Any, list[tuple[cl.Device, cl.Context]]]:
    """Build the contexts once per value of the ``HAL_OPENCL_*`` filters."""
    ocl = import_pyopencl()
    selection = select_devices(ocl)
    contexts = {}
    for platform in selection.platforms:
        contexts[platform.int_ptr] = ocl.Context([d for p, d in selection.devices if p == platform])
    return ocl, [(d, contexts[p.int_ptr]) for p, d in selection.devices]


def memory_baseline(direction: str, nbytes: int, repeat: int) -> float:
    """Time one transfer done with raw PyOpenCL ``enqueue_copy``; return the median seconds.

    Each transfer is a non-blocking ``enqueue_copy`` followed by ``queue.finish()`` on an
    in-order queue with profiling enabled (what a hal copy plus ``Stream.synchronize`` does),
    after one untimed warm-up. Buffers are allocated and made resident before timing.

    Args:
        direction: ``"h2d"`` (host -> device 0), ``"d2h"`` (device 0 -> host), ``"d2d"``
            (within device 0) or ``"peer"`` (device 1 -> device 0, same context).
        nbytes: bytes per transfer (> 0).
        repeat: timed transfers (>= 1).

    Raises:
        ValueError: unknown ``direction`` or bad sizes.
        hal.DeviceMismatchError: ``"peer"`` without two selected devices sharing a context.
        hal.BackendUnavailableError: no OpenCL device here.
    """
    if direction not in DIRECTIONS:
        raise ValueError(f"direction={direction!r} must be one of {', '.join(DIRECTIONS)}")
    if isinstance(nbytes, bool) or not isinstance(nbytes, int) or nbytes <= 0:
        raise ValueError(f"nbytes={nbytes!r} must be a positive integer")
    if isinstance(repeat, bool) or not isinstance(repeat, int) or repeat < 1:
        raise ValueError(f"repeat={repeat!r} must be an integer >= 1")
    ocl, devices = _setup()
    dev0, ctx = devices[0]
    if direction == "peer":
        peers = [d for d, c in devices[1:] if c is ctx]
        if not peers:
            raise DeviceMismatchError(
                "the peer baseline needs two selected OpenCL devices sharing a context "
                '(e.g. POCL_DEVICES="pthread pthread")'
            )
    queue = ocl.CommandQueue(ctx, dev0, properties=ocl.command_queue_properties.PROFILING_ENABLE)
    flags = ocl.mem_flags.READ_WRITE
    undefined = ocl.mem_migration_flags.CONTENT_UNDEFINED
    buffers = []

    def device_buffer(device: cl.Device) -> cl.Buffer:
        buf = ocl.Buffer(ctx, flags, nbytes)
        side = queue if device == dev0 else ocl.CommandQueue(ctx, device)
        ocl.enqueue_migrate_mem_objects(side, [buf], flags=undefined).wait()
        ocl.enqueue_fill_buffer(side, buf, np.zeros(1, np.uint8), 0, nbytes).wait()
        buffers.append(buf)
        return buf

    host = np.ones(nbytes, dtype=np.uint8)
    dst = device_buffer(dev0)
    if direction == "h2d":

        def transfer() -> None:
            ocl.enqueue_copy(queue, dst, host, is_blocking=False)
            queue.finish()
    elif direction == "d2h":

        def transfer() -> None:
            ocl.enqueue_copy(queue, host, dst, is_blocking=False)
            queue.finish()
    else:
        src = device_buffer(dev0 if direction == "d2d" else peers[0])

        def transfer() -> None:
            ocl.enqueue_copy(queue, dst, src, byte_count=nbytes)
            queue.finish()

    try:
        transfer()  # warm-up
        times = []
        for _ in range(repeat):
            start = time.perf_counter()
            transfer()
            times.append(time.perf_counter() - start)
    finally:
        queue.finish()
        for buf in buffers:
            buf.release()
    return statistics.median(times)
