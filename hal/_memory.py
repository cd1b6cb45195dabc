"""Device memory: ``Buffer`` (raw bytes) and ``Array`` (a typed view of a buffer)."""

from __future__ import annotations

import math
import operator
import weakref
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, final

import numpy as np

from hal._errors import InvalidBufferError
from hal._spi import MemoryImpl

if TYPE_CHECKING:
    from hal._device import Device
    from hal._stream import Stream

__all__ = ["Array", "Buffer", "asarray"]


def _as_size(value: object, name: str) -> int:
    """Return ``value`` as a non-negative int, or raise TypeError/ValueError naming it."""
    if isinstance(value, bool) or not hasattr(value, "__index__"):
        raise TypeError(f"{name}={value!r} must be an integer")
    n = operator.index(value)
    if n < 0:
        raise ValueError(f"{name}={n} must be >= 0")
    return n


def _free(impl: MemoryImpl) -> None:
    impl.free()


@final
class Buffer:
    """``nbytes`` bytes of memory on one device.

    Create with :meth:`hal.Device.alloc`. Release with :meth:`close` (idempotent) or use
    as a context manager; a finalizer frees the memory if the buffer is garbage-collected
    without being closed. Any use after ``close()`` raises :class:`hal.InvalidBufferError`.
    """

    __slots__ = ("__weakref__", "_device", "_finalizer", "_impl", "_nbytes")
    _device: Device
    _finalizer: weakref.finalize[..., Any]
    _impl: MemoryImpl | None
    _nbytes: int

    def __init__(self, *args: object, **kwargs: object) -> None:
        raise TypeError("Buffers come from Device.alloc(nbytes)")

    @classmethod
    def _allocate(cls, device: Device, nbytes: int) -> Buffer:
        n = _as_size(nbytes, "nbytes")
        limit = device.capabilities.max_alloc_bytes
        if limit is not None and n > limit:
            raise ValueError(f"nbytes={n} exceeds the largest allocation of {device} ({limit} bytes)")
        impl = device._impl.alloc(n) if n else _ZeroSize()
        self = object.__new__(cls)
        self._device = device
        self._nbytes = n
        self._impl = impl
        self._finalizer = weakref.finalize(self, _free, impl)
        return self

    @property
    def nbytes(self) -> int:
        """Size in bytes."""
        return self._nbytes

    @property
    def device(self) -> Device:
        """The device that owns the memory."""
        return self._device

    @property
    def closed(self) -> bool:
        """True after :meth:`close`."""
        return self._impl is None

    def _live(self) -> MemoryImpl:
        impl = self._impl
        if impl is None:
            raise InvalidBufferError(f"buffer of {self._nbytes} bytes on {self._device} is closed")
        return impl

    def close(self) -> None:
        """Free the memory. Idempotent. Work already enqueued that uses the buffer is not cancelled."""
        if self._impl is not None:
            self._impl = None
            self._finalizer()

    def __enter__(self) -> Buffer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def view(self, dtype: Any, shape: int | Sequence[int] | None = None, *, offset: int = 0) -> Array:
        """Return a typed :class:`hal.Array` view of this buffer.

        Args:
            dtype: a NumPy dtype (or anything ``numpy.dtype`` accepts).
            shape: the array shape; by default, as many elements as fit after ``offset``.
            offset: byte offset of the first element.
        """
        self._live()
        return Array._view(self, dtype, shape, offset)

    def __repr__(self) -> str:
        state = "closed" if self._impl is None else "open"
        return f"<hal.Buffer {self._nbytes} bytes on {self._device} ({state})>"


class _ZeroSize(MemoryImpl):
    """Backing for zero-byte buffers: nothing is allocated on the device."""

    nbytes = 0

    def free(self) -> None:
        pass


@final
class Array:
    """A typed view (dtype, shape, C order) of a :class:`hal.Buffer`.

    Create with :func:`hal.asarray` or :meth:`hal.Buffer.view`. The array does not own the
    buffer unless it was made by :func:`hal.asarray` (then ``close()`` frees it).
    """

    __slots__ = ("_buffer", "_dtype", "_keepalive", "_offset", "_owns", "_shape")
    _buffer: Buffer
    _dtype: np.dtype[Any]
    _keepalive: object
    _offset: int
    _owns: bool
    _shape: tuple[int, ...]

    def __init__(self, *args: object, **kwargs: object) -> None:
        raise TypeError("Arrays come from hal.asarray(...) or Buffer.view(dtype, shape)")

    @classmethod
    def _view(
        cls, buffer: Buffer, dtype: Any, shape: int | Sequence[int] | None, offset: int, owns: bool = False
    ) -> Array:
        try:
            dt = np.dtype(dtype)
        except TypeError as exc:
            raise TypeError(f"dtype={dtype!r} is not a NumPy dtype") from exc
        if dt.hasobject or dt.itemsize == 0:
            raise TypeError(f"dtype={dt} cannot live in device memory")
        off = _as_size(offset, "offset")
        if off > buffer.nbytes:
            raise ValueError(f"offset={off} is past the end of a {buffer.nbytes}-byte buffer")
        if shape is None:
            shp: tuple[int, ...] = ((buffer.nbytes - off) // dt.itemsize,)
        elif isinstance(shape, Sequence):
            shp = tuple(_as_size(s, "shape") for s in shape)
        else:
            shp = (_as_size(shape, "shape"),)
        need = math.prod(shp) * dt.itemsize
        if off + need > buffer.nbytes:
            raise ValueError(
                f"shape={shp} of {dt} needs {need} bytes at offset={off}; the buffer has {buffer.nbytes}"
            )
        self = object.__new__(cls)
        self._buffer = buffer
        self._dtype = dt
        self._shape = shp
        self._offset = off
        self._owns = owns
        self._keepalive = None
        return self

    @property
    def buffer(self) -> Buffer:
        """The buffer holding the data."""
        return self._buffer

    @property
    def dtype(self) -> np.dtype[Any]:
        """Element type."""
        return self._dtype

    @property
    def shape(self) -> tuple[int, ...]:
        """Shape (C order)."""
        return self._shape

    @property
    def ndim(self) -> int:
        """Number of dimensions."""
        return len(self._shape)

    @property
    def size(self) -> int:
        """Number of elements."""
        return math.prod(self._shape)

    @property
    def nbytes(self) -> int:
        """Size of the view in bytes."""
        return self.size * self._dtype.itemsize

    @property
    def offset(self) -> int:
        """Byte offset of the first element in :attr:`buffer`."""
        return self._offset

    @property
    def device(self) -> Device:
        """Device that holds the data."""
        return self._buffer.device

    def reshape(self, *shape: int | Sequence[int]) -> Array:
        """Return a view of the same bytes with another shape (same number of elements)."""
        shp: Any = shape[0] if len(shape) == 1 and isinstance(shape[0], Sequence) else shape
        shp = tuple(_as_size(s, "shape") for s in shp)
        if math.prod(shp) != self.size:
            raise ValueError(f"shape={shp} does not hold {self.size} elements")
        return Array._view(self._buffer, self._dtype, shp, self._offset)

    def to_host(self, *, stream: Stream | None = None) -> np.ndarray[Any, Any]:
        """Copy the data into a new NumPy array and return it once the copy has completed.

        Args:
            stream: order the copy after the work already on this stream (a stream of the
                array's device); by default hal's internal stream of that device is used.
        """
        from hal._copy import copy

        self._buffer._live()  # a closed buffer raises even when there is nothing to copy
        out = np.empty(self._shape, dtype=self._dtype)
        s = stream if stream is not None else self.device._internal_stream()
        if out.nbytes:
            copy(out, self, stream=s)
        s.synchronize()
        return out

    def close(self) -> None:
        """Free the underlying buffer if this array owns it (made by :func:`hal.asarray`)."""
        self._keepalive = None
        if self._owns:
            self._buffer.close()

    def __enter__(self) -> Array:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- DLPack -------------------------------------------------------------------------
    def __dlpack_device__(self) -> tuple[int, int]:
        """Return the DLPack device of the memory, or raise ``BufferError`` if unreachable."""
        return self._buffer._live().dlpack_device()

    def __dlpack__(
        self,
        *,
        stream: Any = None,
        max_version: tuple[int, int] | None = None,
        dl_device: Any = None,
        copy: bool | None = None,
    ) -> Any:
        """Export the memory zero-copy as a DLPack capsule (``numpy.from_dlpack`` on the CPU emulator).

        Raises:
            BufferError: the backend's memory is not reachable by DLPack consumers, or a copy
                or another device was requested.
        """
        impl = self._buffer._live()
        if copy:
            raise BufferError("hal arrays export zero-copy only (copy=True was requested)")
        if dl_device is not None and tuple(dl_device) != tuple(impl.dlpack_device()):
            raise BufferError(f"dl_device={dl_device!r} differs from the array's device")
        return impl.dlpack(
            dtype=self._dtype, shape=self._shape, offset=self._offset, stream=stream, max_version=max_version
        )

    def __repr__(self) -> str:
        return f"<hal.Array shape={self._shape} dtype={self._dtype} on {self.device}>"


def asarray(host_array: Any, *, device: Device, stream: Stream | None = None, dtype: Any = None) -> Array:
    """Copy a host array into new memory on ``device`` and return it as a :class:`hal.Array`.

    Args:
        host_array: anything ``numpy.asarray`` accepts.
        device: the destination device.
        stream: enqueue the copy on this stream (asynchronous; the host data must stay
            unchanged until the stream reaches the copy). By default the copy completes
            before returning.
        dtype: convert to this dtype first.
    """
    from hal._copy import copy
    from hal._device import _check_device

    _check_device(device, "device")
    host = np.asarray(host_array, dtype=dtype)
    host = np.ascontiguousarray(host).reshape(host.shape)  # ascontiguousarray makes 0-d arrays 1-d
    if host.dtype.hasobject:
        raise TypeError(f"host_array of dtype {host.dtype} cannot be copied to a device")
    if stream is not None:
        from hal._stream import _check_stream

        _check_stream(stream, device)
    buf = device.alloc(host.nbytes)
    arr = Array._view(buf, host.dtype, host.shape, 0, owns=True)
    if host.nbytes:
        s = stream if stream is not None else device._internal_stream()
        try:
            copy(buf, host, stream=s)
            if stream is None:
                s.synchronize()
        except BaseException:
            buf.close()
            raise
        arr._keepalive = host
    return arr
