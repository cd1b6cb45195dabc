"""``hal.asarray`` and ``hal.from_dlpack``: arrays made from host data and from DLPack producers.

Above the memory objects (:mod:`hal._memory`), copies (:mod:`hal._copy`) and device discovery
(:mod:`hal._discovery`, for the device that adopts host memory), which they use.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from hal import _dlpack
from hal._copy import copy as _copy
from hal._device import Device, _check_device
from hal._discovery import devices
from hal._hostmem import check_host_dtype
from hal._memory import Array, Buffer, _copied
from hal._stream import Stream, _check_stream

__all__ = ["asarray", "from_dlpack"]


def asarray(
    host_array: Any, *, device: Device, stream: Stream | None = None, dtype: Any = None
) -> Array:
    """Copy a host array into new memory on ``device`` and return it as a :class:`hal.Array`.

    Args:
        host_array: anything ``numpy.asarray`` accepts.
        device: the destination device.
        stream: enqueue the copy on this stream (asynchronous; the host data must stay
            unchanged until the stream reaches the copy). By default the copy completes
            before returning.
        dtype: convert to this dtype first.
    """
    _check_device(device, "device")
    host = np.asarray(host_array, dtype=dtype)
    host = np.ascontiguousarray(host).reshape(host.shape)  # ascontiguousarray makes 0-d arrays 1-d
    check_host_dtype(
        host.dtype, "host_array"
    )  # TypeError: object, structured, void, strings, datetimes
    if stream is not None:
        _check_stream(stream, device)
    buf = device.alloc(host.nbytes)
    arr = Array._view(buf, host.dtype, host.shape, 0, owns=True)
    if host.nbytes:
        s = stream if stream is not None else device._internal_stream()
        try:
            _copy(buf, host, stream=s)
            if stream is None:
                s.synchronize()
        except BaseException:
            buf.close()
            raise
        arr._keepalive = host
    return arr


def from_dlpack(x: Any, /, *, device: Device | None = None, copy: bool | None = None) -> Array:
    """Return ``x`` (any DLPack producer: a torch tensor, a NumPy array, a hal Array) as a :class:`hal.Array`.

    Zero-copy whenever the memory can serve as memory of a hal device as it is:

    - a ``hal.Array``: a view of the same buffer (same device);
    - memory a backend adopts (``DeviceImpl.adopt``): for the CPU emulator, host memory
      (DLPack ``kDLCPU``: NumPy arrays, torch CPU tensors) becomes memory of ``device``, by
      default the first CPU-emulator device (``cpu:0``); for CUDA, ``kDLCUDA`` memory (CuPy
      arrays, torch CUDA tensors) becomes memory of the ``cuda`` device of that ordinal.
      Adopted memory is not counted in
      ``memory_in_use``; the Array keeps the producer's memory alive until it is closed (or
      collected) and writes go straight to the producer's memory.

    Args:
        x: the producer (implements ``__dlpack__`` / ``__dlpack_device__``).
        device: the hal device the result lives on; by default the device that can adopt the
            memory (for a ``hal.Array``: its own device).
        copy: ``True``: always copy into a new buffer of ``device`` (host-readable or adoptable
            memory, any strides). ``None`` or ``False``: never copy: raise ``BufferError`` when
            zero-copy is impossible. (Stricter than the array API's ``None``, which allows a
            copy: hal never copies behind your back; pass ``copy=True``.)

    Raises:
        TypeError: ``x`` is not a DLPack producer, or ``device`` is not a hal.Device.
        BufferError: zero-copy is impossible (memory of another device type, not
            C-contiguous, read-only, or a dtype without a NumPy equivalent) and ``copy`` is not
            True; the message names the producer's DLPack device and what to do, and the
            exception's ``reason`` attribute says which case it is (``"device"``,
            ``"strides"``, ``"readonly"``, ``"dtype"``, ``"protocol"``).
    """
    if device is not None:
        _check_device(device, "device")
    if copy is not None and not isinstance(copy, bool):
        raise TypeError(f"copy={copy!r} must be True, False or None")
    if isinstance(x, Array):
        return _from_array(x, device, copy)
    imp = _dlpack.consume(x)
    where = _dlpack.device_name(imp.device)
    try:
        if copy is True:
            out = _copy_in(imp, device, where)
            imp.owner.release()  # the copy is complete: the producer gets its memory back now
            return out
        if not imp.contiguous:
            raise _dlpack.DLPackError(
                f"cannot use memory of {where} zero-copy: it is not C-contiguous (strides {imp.strides} "
                f"for shape {imp.shape}); pass copy=True to copy",
                "strides",
            )
        if imp.readonly:
            raise _dlpack.DLPackError(
                f"cannot use memory of {where} zero-copy: the producer marked it read-only; pass copy=True to copy",
                "readonly",
            )
        adopted = _adopt(imp, device)
        if adopted is None:
            target = f"device {device}" if device is not None else "any hal device"
            raise _dlpack.DLPackError(
                f"memory of {where} is not memory of {target} (no backend adopts it zero-copy); "
                "pass copy=True (and device=) to copy it into a new buffer",
                "device",
            )
        return adopted
    except BaseException:
        imp.owner.release()
        raise


def _candidates(device: Device | None) -> list[Device]:
    if device is not None:
        return [device]
    return devices()


def _adopt(imp: Any, device: Device | None) -> Array | None:
    """Return an owning Array over the producer's memory on the first device that adopts it."""
    for dev in _candidates(device):
        impl = dev._impl.adopt(
            dl_device=imp.device, address=imp.address, nbytes=imp.nbytes, owner=imp.owner
        )
        if impl is not None:
            buf = Buffer._adopt(dev, impl, imp.nbytes)
            return Array._view(buf, imp.dtype, imp.shape, 0, owns=True)
    return None


def _copy_in(imp: Any, device: Device | None, where: str) -> Array:
    """``copy=True``: copy the producer's memory into a new buffer (of ``device``)."""

    if imp.device[0] in _dlpack.HOST_READABLE:
        host = np.ascontiguousarray(imp.host_view()).reshape(imp.shape)
        target = device
        if target is None:  # the device that would adopt host memory (the emulator's first)
            for dev in _candidates(None):
                probe = dev._impl.adopt(dl_device=imp.device, address=0, nbytes=0, owner=None)
                if probe is not None:
                    probe.free()
                    target = dev
                    break
        if target is None:
            raise BufferError(
                f"no hal device takes memory of {where}: pass device= to copy it there"
            )
        return asarray(host, device=target)
    if not imp.contiguous:
        raise BufferError(
            f"cannot copy memory of {where} with strides {imp.strides}: hal reads it only C-contiguous"
        )
    src = _adopt(imp, None)
    if src is None:
        raise BufferError(
            f"hal cannot read memory of {where}: no backend adopts it, so it cannot be copied"
        )
    target = device if device is not None else src.device
    buf = target.alloc(src.nbytes)
    out = Array._view(buf, src.dtype, src.shape, 0, owns=True)
    try:
        if src.nbytes:
            s = target._internal_stream()
            _copy(out, src, stream=s)
            s.synchronize()
    except BaseException:
        buf.close()
        raise
    finally:
        src.close()
    return out


def _from_array(x: Array, device: Device | None, copy: bool | None) -> Array:
    x.buffer._live()
    target = device if device is not None else x.device
    if copy is True:
        return _copied(x, target)
    if target != x.device:
        raise _dlpack.DLPackError(
            f"x lives on {x.device}, not on device={target}; pass copy=True to copy it there",
            "device",
        )
    return Array._view(x.buffer, x.dtype, x.shape, x.offset)
