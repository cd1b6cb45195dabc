"""The raw-PyOpenCL baseline of ``hal bench memory``: the same transfers without hal.

Runs on the devices the backend selects (same ``HAL_OPENCL_PLATFORM``/``HAL_OPENCL_DEVICES``
filters, one context per platform like the backend), so the ratio measures hal's overhead.
"""

from __future__ import annotations

import functools
import statistics
import time
from typing import TYPE_CHECKING, Any

import numpy as np

from hal import DeviceMismatchError, spi
from hal.backends.opencl._select import import_pyopencl, select_devices

if TYPE_CHECKING:
    import pyopencl as cl

__all__ = ["DIRECTIONS", "memory_baseline"]

#: the transfer directions :func:`memory_baseline` knows
DIRECTIONS = spi.TRANSFER_DIRECTIONS


def _setup() -> tuple[Any, list[tuple[cl.Device, cl.Context]]]:
    """Return pyopencl and the selected devices with their (per-platform) contexts."""
    env = tuple(spi.setting(k) or "" for k in ("HAL_OPENCL_PLATFORM", "HAL_OPENCL_DEVICES"))
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


class _Prepared:
    """One prepared raw transfer: a queue, resident buffers, host memory and the copy."""

    def __init__(
        self, ocl: Any, devices: list[tuple[cl.Device, cl.Context]], direction: str, nbytes: int
    ) -> None:
        dev0, ctx = devices[0]
        peer = None
        if direction == "peer":
            peers = [d for d, c in devices[1:] if c is ctx]
            if not peers:
                raise DeviceMismatchError(
                    "the peer baseline needs two selected OpenCL devices sharing a context "
                    '(e.g. POCL_DEVICES="pthread pthread")'
                )
            peer = peers[0]
        self.ocl = ocl
        self.queue = ocl.CommandQueue(
            ctx, dev0, properties=ocl.command_queue_properties.PROFILING_ENABLE
        )
        self.buffers: list[cl.Buffer] = []
        self.host = np.resize(np.arange(251, dtype=np.uint8), nbytes)  # pages touched
        self.direction = direction
        self.nbytes = nbytes
        try:
            self.dst = self._resident(ctx, dev0)
            self.src = None
            if direction in ("d2d", "peer"):
                self.src = self._resident(ctx, dev0 if peer is None else peer)
            self.transfer()  # warm-up, once per preparation
        except BaseException:
            self.release()
            raise

    def _resident(self, ctx: cl.Context, device: cl.Device | None) -> cl.Buffer:
        ocl = self.ocl
        buf = ocl.Buffer(ctx, ocl.mem_flags.READ_WRITE, self.nbytes)
        self.buffers.append(buf)
        side = self.queue if device == self.queue.device else ocl.CommandQueue(ctx, device)
        undefined = ocl.mem_migration_flags.CONTENT_UNDEFINED
        ocl.enqueue_migrate_mem_objects(side, [buf], flags=undefined).wait()
        ocl.enqueue_copy(side, buf, self.host, is_blocking=True)
        return buf

    def transfer(self) -> None:
        """Do one transfer and wait for it."""
        ocl, queue = self.ocl, self.queue
        if self.direction == "h2d":
            ocl.enqueue_copy(queue, self.dst, self.host, is_blocking=False)
        elif self.direction == "d2h":
            ocl.enqueue_copy(queue, self.host, self.dst, is_blocking=False)
        else:
            ocl.enqueue_copy(queue, self.dst, self.src, byte_count=self.nbytes)
        queue.finish()

    def release(self) -> None:
        """Free the buffers."""
        self.queue.finish()
        for buf in self.buffers:
            buf.release()
        self.buffers.clear()


_prepared: dict[tuple[object, ...], _Prepared] = {}


def memory_baseline(direction: str, nbytes: int, repeat: int) -> float:
    """Time one transfer done with raw PyOpenCL ``enqueue_copy``; return the median seconds.

    Each transfer is a non-blocking ``enqueue_copy`` followed by ``queue.finish()`` on an
    in-order queue with profiling enabled (what a hal copy plus ``Stream.synchronize`` does).
    Buffers are allocated, made resident and filled, and one untimed warm-up transfer done,
    when a ``(direction, nbytes)`` is first asked for; consecutive calls for the same pair
    reuse them (the previous pair's buffers are freed), so a caller that alternates rounds of
    hal and baseline samples sees both sides in the same state.

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
    spi.check_baseline_args(direction, nbytes, repeat)
    ocl, devices = _setup()
    key = (id(devices), direction, nbytes)
    prepared = _prepared.get(key)
    if prepared is None:
        for old in _prepared.values():
            old.release()
        _prepared.clear()
        prepared = _prepared[key] = _Prepared(ocl, devices, direction, nbytes)
    transfer = prepared.transfer
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        transfer()
        times.append(time.perf_counter() - start)
    return statistics.median(times)
