"""Host memory for fast transfers: ``hal.alloc_host`` and ``hal.empty_host``.

A backend may give host memory its device reaches fastest (``DeviceImpl.alloc_host``, SPI
1.1, optional): page-locked memory on CUDA (CuPy's pinned memory: copies from and to it are
asynchronous and skip the backend's pinned staging ring), a host-accessible mapped buffer on
OpenCL (``CL_MEM_ALLOC_HOST_PTR``). A backend without it (the CPU emulator) gives plain host
memory. Either way the result is a NumPy array that keeps the memory alive.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from hal._device import Device

__all__ = ["alloc_host", "empty_host"]


def _default_device(device: Device | str | None) -> Device:
    from hal._device import Device, _check_device
    from hal._discovery import devices

    if device is None:
        found = devices()
        if not found:
            raise ValueError("no device: pass device= (hal.devices() is empty)")
        return found[0]
    if isinstance(device, str):
        from hal._discovery import device as by_name

        return by_name(device)
    _check_device(device, "device")
    assert isinstance(device, Device)
    return device


def alloc_host(
    nbytes: int, *, device: Device | str | None = None
) -> np.ndarray[Any, np.dtype[np.uint8]]:
    """Return ``nbytes`` of host memory that ``device`` copies from and to fastest, as a uint8 array.

    Page-locked (pinned) memory on CUDA, a host-accessible mapped buffer on OpenCL, plain
    memory on the CPU emulator (and on any backend without ``DeviceImpl.alloc_host``). The
    memory is uninitialized and lives as long as the array (or a view of it). Use it as the
    host side of :func:`hal.copy`.

    Args:
        nbytes: the size in bytes (>= 0).
        device: the device the memory is for (a ``hal.Device`` or ``"backend:index"``); default:
            the first of ``hal.devices()``.

    Raises:
        TypeError: ``nbytes`` is not an integer, or ``device`` is not a device.
        ValueError: ``nbytes`` is negative.
        hal.OutOfMemoryError: the backend cannot pin that much.
    """
    from hal._memory import _as_size

    n = _as_size(nbytes, "nbytes")
    dev = _default_device(device)
    mem = dev._impl.alloc_host(n) if n else None
    if mem is None:
        return np.empty(n, np.uint8)
    arr = np.frombuffer(mem, np.uint8, count=n)  # keeps ``mem`` alive (arr.base)
    return arr


def empty_host(
    shape: int | Sequence[int], dtype: Any = np.float32, *, device: Device | str | None = None
) -> np.ndarray[Any, Any]:
    """Return an uninitialized C-contiguous array of ``shape`` and ``dtype`` in :func:`alloc_host` memory.

    Raises:
        TypeError: ``shape`` holds a non-integer, or ``dtype`` is not a NumPy dtype hal accepts.
        ValueError: a negative dimension.
    """
    from hal._hostmem import check_host_dtype

    try:
        dt = np.dtype(dtype)
    except TypeError as exc:
        raise TypeError(f"dtype={dtype!r} is not a NumPy dtype") from exc
    check_host_dtype(dt, "dtype")
    dims: tuple[Any, ...] = tuple(shape) if isinstance(shape, Sequence) else (shape,)
    shp = []
    for d in dims:
        if isinstance(d, bool) or not hasattr(d, "__index__"):
            raise TypeError(f"shape={tuple(dims)!r} must hold integers")
        v = operator.index(d)
        if v < 0:
            raise ValueError(f"shape={tuple(dims)!r} has a negative dimension")
        shp.append(v)
    raw = alloc_host(math.prod(shp) * dt.itemsize, device=device)
    return raw.view(dt).reshape(shp)
