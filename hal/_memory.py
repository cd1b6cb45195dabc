"""Device memory: ``Buffer`` (raw bytes) and ``Array`` (a typed view of a buffer)."""

from __future__ import annotations

import itertools
import math
import operator
import weakref
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, final

import numpy as np

from hal._errors import HalError, InvalidBufferError
from hal._spi import MemoryImpl

if TYPE_CHECKING:
    from hal._device import Device
    from hal._pool import Block
    from hal._stream import Stream

__all__ = ["Array", "Buffer"]


#: ``hal.copy``, installed by :mod:`hal._copy` when it is imported (by ``import hal``): copies
#: sit above the memory objects they move, so this module never imports them.
_copy: Callable[..., Any] | None = None


def _as_size(value: object, name: str) -> int:
    """Return ``value`` as a non-negative int, or raise TypeError/ValueError naming it."""
    if isinstance(value, bool) or not hasattr(value, "__index__"):
        raise TypeError(f"{name}={value!r} must be an integer")
    n = operator.index(value)
    if n < 0:
        raise ValueError(f"{name}={n} must be >= 0")
    return n


_IPC_MAGIC = b"HALIPC1:"


def _free(impl: MemoryImpl) -> None:
    impl.free()


@final
class Buffer:
    """``nbytes`` bytes of memory on one device.

    Create with :meth:`hal.Device.alloc`. Release with :meth:`close` (idempotent) or use
    as a context manager; a finalizer frees the memory if the buffer is garbage-collected
    without being closed. Any use after ``close()`` raises :class:`hal.InvalidBufferError`.
    """

    __slots__ = ("__weakref__", "_block", "_device", "_finalizer", "_impl", "_nbytes")
    _block: Block | None  # the pool's block (None: allocated without the pool, adopted, zero-size)
    _device: Device
    _finalizer: weakref.finalize[..., Any]
    _impl: MemoryImpl | None
    _nbytes: int
    #: the :class:`hal.spi.MemoryImpl` behind the buffer, None once closed: a read-only view for
    #: extensions on hot paths (see "Fast-path views" in :mod:`hal.spi`; never assign it)
    spi_memory: MemoryImpl | None

    def __init__(self, *args: object, **kwargs: object) -> None:
        raise TypeError("Buffers come from Device.alloc(nbytes)")

    @classmethod
    def _allocate(cls, device: Device, nbytes: int, stream: Stream | None = None) -> Buffer:
        n = _as_size(nbytes, "nbytes")
        limit = device.capabilities.max_alloc_bytes
        if limit is not None and n > limit:
            raise ValueError(
                f"nbytes={n} exceeds the largest allocation of {device} ({limit} bytes)"
            )
        pool = device._memory_pool() if n else None
        self = object.__new__(cls)
        self._device = device
        self._nbytes = n
        if pool is not None:
            block = pool.alloc(n, stream)
            self._block = block
            self._impl = block.impl
            self._finalizer = weakref.finalize(self, pool.free, block, n)
            return self
        impl = device._impl.alloc(n) if n else _ZeroSize(device)
        self._block = None
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

    def view(
        self, dtype: Any, shape: int | Sequence[int] | None = None, *, offset: int = 0
    ) -> Array:
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

    def export_handle(self) -> bytes:
        """Return bytes another process passes to ``Device.import_handle`` to use this memory (IPC).

        The other process gets a buffer over the same memory (no copy): what one writes, the
        other reads, ordered by the processes themselves (synchronize before signalling the
        other side). Lifetime: the memory stays usable by importers that already opened it
        after this buffer is closed (it is then freed when the last of them closes); a handle
        imported after the close fails with ``hal.HalError``. An exported buffer's memory is
        never reused by the pool. Needs ``device.capabilities.ipc`` (the CPU emulator with
        ``HAL_CPU_IPC=1``; CUDA, where the memory lives at most as long as the exporting process).

        Raises:
            hal.InvalidBufferError: the buffer is closed.
            hal.HalError: the device has no IPC (the message gives the reason).
        """
        import json

        impl = self._live()
        caps = self._device.capabilities
        if not caps.ipc:
            why = caps.absent_reasons.get("ipc", "the backend does not declare it")
            raise HalError(f"{self._device} cannot share memory with other processes: {why}")
        if self._nbytes == 0:
            payload = ""
        else:
            try:
                payload = impl.export_handle()
            except NotImplementedError as exc:
                raise HalError(
                    f"{self._device} cannot share memory with other processes: {exc}"
                ) from None
            if self._block is not None:
                self._block.exported = (
                    True  # importers may use it after close: never handed out again
                )
        head = {
            "backend": self._device.backend,
            "index": self._device.index,
            "nbytes": self._nbytes,
            "payload": payload,
        }
        return _IPC_MAGIC + json.dumps(head, separators=(",", ":")).encode()

    @classmethod
    def _import(cls, device: Device, handle: object) -> Buffer:
        import json

        from hal._errors import DeviceMismatchError

        if not isinstance(handle, (bytes, bytearray, memoryview)):
            raise TypeError(f"handle={handle!r} is not bytes from Buffer.export_handle()")
        raw = bytes(handle)
        if not raw.startswith(_IPC_MAGIC):
            raise ValueError(
                f"handle={raw[:32]!r}... is not a hal memory handle (Buffer.export_handle())"
            )
        try:
            head = json.loads(raw[len(_IPC_MAGIC) :])
            backend, index, nbytes, payload = (
                head["backend"],
                head["index"],
                head["nbytes"],
                head["payload"],
            )
            nbytes = _as_size(nbytes, "nbytes")
        except (ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"handle={raw[:64]!r}... is malformed ({exc})") from None
        if (backend, index) != (device.backend, device.index):
            raise DeviceMismatchError(
                f"handle names memory of {backend}:{index}; import it on that device, not on {device}"
            )
        if not device.capabilities.ipc:
            why = device.capabilities.absent_reasons.get("ipc", "the backend does not declare it")
            raise HalError(f"{device} cannot open memory of other processes: {why}")
        try:
            impl = device._impl.import_handle(str(payload), nbytes) if nbytes else _ZeroSize(device)
        except NotImplementedError as exc:
            raise HalError(f"{device} cannot open memory of other processes: {exc}") from None
        return cls._adopt(device, impl, nbytes)

    @classmethod
    def _adopt(cls, device: Device, impl: MemoryImpl, nbytes: int) -> Buffer:
        """Wrap memory a backend adopted from a DLPack producer (``DeviceImpl.adopt``)."""
        self = object.__new__(cls)
        self._device = device
        self._nbytes = nbytes
        self._impl = impl
        self._block = None
        self._finalizer = weakref.finalize(self, _free, impl)
        return self


class _ZeroSize(MemoryImpl):
    """Backing for zero-byte buffers: nothing is allocated on the device until a DLPack export.

    An export needs the device's DLPack device and a capsule: a 1-byte allocation made on
    first export answers both (and is freed with the buffer).
    """

    nbytes = 0

    def __init__(self, device: Device) -> None:
        self._device = device
        self._probe: MemoryImpl | None = None

    def _probe_impl(self) -> MemoryImpl:
        if self._probe is None:
            if not self._device.capabilities.dlpack:
                raise BufferError(
                    f"{self._device} does not declare DLPack (capabilities.dlpack is False)"
                )
            self._probe = self._device._impl.alloc(1)
        return self._probe

    def dlpack_device(self) -> tuple[int, int]:
        return self._probe_impl().dlpack_device()

    def dlpack(
        self, *, dtype: Any, shape: tuple[int, ...], offset: int, stream: Any, max_version: Any
    ) -> Any:
        return self._probe_impl().dlpack(
            dtype=dtype, shape=shape, offset=0, stream=stream, max_version=max_version
        )

    def free(self) -> None:
        probe, self._probe = self._probe, None
        if probe is not None:
            probe.free()


_SIGS: dict[tuple[Any, ...], int] = {}
_SIG_IDS = itertools.count(1)
_SIGS_MAX = 1 << 16


def _signature(dtype: np.dtype[Any], shape: tuple[int, ...], device: Device) -> int:
    """Return the int naming (dtype, shape, device): the same for equal kinds, never reused for another.

    Ids come from a counter that never restarts: when the table is full it is emptied, and a
    kind seen again gets a new id (a cache keyed on ids then misses once; it never confuses kinds).
    """
    key = (dtype, shape, device)
    sig = _SIGS.get(key)
    if sig is None:
        if len(_SIGS) >= _SIGS_MAX:
            _SIGS.clear()
        sig = _SIGS.setdefault(key, next(_SIG_IDS))
    return sig


@final
class Array:
    """A typed view (dtype, shape, C order) of a :class:`hal.Buffer`.

    Create with :func:`hal.asarray` or :meth:`hal.Buffer.view`. The array does not own the
    buffer unless it was made by :func:`hal.asarray` (then ``close()`` frees it).
    """

    __slots__ = ("_buffer", "_dtype", "_keepalive", "_offset", "_owns", "_shape", "_sig")
    _buffer: Buffer
    _dtype: np.dtype[Any]
    _keepalive: object
    _offset: int
    _owns: bool
    _shape: tuple[int, ...]
    #: the array's kind, (dtype, shape, device), as a small int computed once (:func:`_signature`):
    #: equal for arrays of equal dtype, shape and device; hal.kernels' launch cache keys on it
    _sig: int
    #: the array's kind as an int: equal for arrays of equal dtype, shape and device, never the
    #: same for two kinds in one process (read-only; what a cache of per-kind work keys on)
    signature: int
    #: :attr:`buffer` and :attr:`offset` as read-only views for extensions on hot paths, at the
    #: cost of a plain attribute read (see "Fast-path views" in :mod:`hal.spi`; never assign them)
    spi_buffer: Buffer
    spi_offset: int

    def __init__(self, *args: object, **kwargs: object) -> None:
        raise TypeError("Arrays come from hal.asarray(...) or Buffer.view(dtype, shape)")

    @classmethod
    def _view(
        cls,
        buffer: Buffer,
        dtype: Any,
        shape: int | Sequence[int] | None,
        offset: int,
        owns: bool = False,
    ) -> Array:
        try:
            dt = np.dtype(dtype)
        except TypeError as exc:
            raise TypeError(f"dtype={dtype!r} is not a NumPy dtype") from exc
        from hal._hostmem import ACCEPTED, dtype_problem

        why = "zero-size elements" if dt.itemsize == 0 else dtype_problem(dt)
        if why is not None:
            raise TypeError(f"dtype={dt} cannot live in device memory ({why}); use {ACCEPTED}")
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
        self._sig = _signature(dt, shp, buffer._device)
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
        self._buffer._live()  # a closed buffer raises even when there is nothing to copy
        out = np.empty(self._shape, dtype=self._dtype)
        s = stream if stream is not None else self.device._internal_stream()
        if out.nbytes:
            assert _copy is not None, "hal._copy installs hal.copy here when hal is imported"
            _copy(out, self, stream=s)
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
        impl = self._buffer._live()
        try:
            return impl.dlpack_device()
        except BufferError as exc:
            raise self._unreachable(exc) from exc

    def _unreachable(self, exc: BufferError) -> BufferError:
        """The backend's refusal to export, naming the device and the way to a host copy."""
        return BufferError(
            f"{self.device}: {exc}; for a host copy pass copy=True (numpy.from_dlpack(x, copy=True); "
            "torch asks __dlpack_device__ first, so torch.from_dlpack(x.__dlpack__(copy=True))) "
            "or use x.to_host()"
        )

    def __dlpack__(
        self,
        *,
        stream: Any = None,
        max_version: tuple[int, int] | None = None,
        dl_device: Any = None,
        copy: bool | None = None,
    ) -> Any:
        """Export the memory as a DLPack capsule: zero-copy, or a host copy on request.

        Zero-copy where the backend exports its memory (the CPU emulator: ``kDLCPU``, so
        ``numpy.from_dlpack`` and ``torch.from_dlpack`` view device memory); zero-size arrays
        export too. ``copy=True`` of device memory (``kDLCUDA`` ...) with ``dl_device`` None or
        the array's own exports a copy in new memory of the same device; ``copy=True`` of host
        memory, or ``dl_device=(1, 0)`` (``kDLCPU``) for memory of another device type with
        ``copy`` not False, exports a copy in new host memory. Copies are complete when the
        capsule is returned and flagged ``IS_COPIED`` in DLPack 1.x capsules. bfloat16 exports
        as ``kDLBfloat``.

        Raises:
            BufferError: the backend's memory is not reachable by DLPack consumers, another
                device than the array's or the host was requested, a copy was needed but
                ``copy=False``, or the dtype has no DLPack equivalent.
            TypeError: ``copy`` is not True, False or None, ``dl_device`` is not a pair, or
                ``stream`` is not None or an int for host (``kDLCPU``) or CUDA/ROCm memory.
            ValueError: ``stream`` is an int the exported memory's device type does not define
                (host memory: only None or -1; CUDA: -1, 1, 2 or a pointer; ROCm: -1, 0 or a pointer).
            hal.InvalidBufferError: the buffer is closed.
        """
        from hal import _dlpack

        if copy is not None and not isinstance(copy, (bool, np.bool_)):
            raise TypeError(f"copy={copy!r} must be True, False or None")
        impl = self._buffer._live()
        if _dlpack.dl_dtype(self._dtype) is None:
            raise BufferError(f"dtype={self._dtype} has no DLPack equivalent")
        try:
            want = None if dl_device is None else tuple(dl_device)
        except TypeError:
            raise TypeError(
                f"dl_device={dl_device!r} must be None or a (device_type, device_id) pair"
            ) from None
        if want is not None and len(want) != 2:
            raise BufferError(f"dl_device={dl_device!r} must be a (device_type, device_id) pair")
        here = self._dlpack_device_or_none(impl)
        # the stream must suit the memory exported (array API): here's, the one asked for, or a host copy's
        _dlpack.check_stream(
            stream,
            want if want is not None else here if here is not None else (1, 0) if copy else None,
        )
        if (
            copy
            and here is not None
            and here[0] not in _dlpack.HOST_READABLE
            and want in (None, here)
        ):
            # a copy on the same device (kDLCUDA ...): a new buffer, filled and exported zero-copy; the
            # capsule keeps that memory alive (SPI dlpack contract) after the buffer is closed here
            dup = _copied(self, self.device)
            try:
                capsule = dup.__dlpack__(stream=stream, max_version=max_version)
            finally:
                dup.close()
            return _dlpack.patch_export(capsule, copied=True)
        if copy or (want is not None and want != here):
            if copy is False:
                own = (
                    here
                    if here is not None
                    else f"(none: {self.device} memory is not reachable through DLPack)"
                )
                raise BufferError(
                    f"dl_device={dl_device!r} differs from the array's DLPack device {own} and copy=False"
                )
            if (want if want is not None else here or (1, 0))[0] != 1:
                own = f"its own DLPack device {here}, or " if here is not None else ""
                raise BufferError(
                    f"dl_device={dl_device!r}: {self.device} exports only to {own}host memory "
                    "(kDLCPU, (1, 0)) as a copy"
                )
            # a copy into new host memory (DLPack kDLCPU), flagged IS_COPIED for DLPack 1.x consumers
            # complete on return: the consumer's stream (None or -1) needs no ordering
            host = self.to_host()
            capsule = _export_host(host, max_version)
            return _dlpack.patch_export(capsule, dtype=self._dtype, copied=True)
        if here is None:
            try:
                impl.dlpack_device()  # raises the backend's BufferError
            except BufferError as exc:
                raise self._unreachable(exc) from exc
        bf16 = self._dtype.name == "bfloat16"  # exported as uint16 bits, then relabelled kDLBfloat
        block = self._buffer._block
        if block is not None:
            block.exported = True  # the pool must not hand this memory to another buffer while a consumer holds it
        capsule = impl.dlpack(
            dtype=np.dtype(np.uint16) if bf16 else self._dtype,
            shape=self._shape,
            offset=self._offset,
            stream=stream,
            max_version=max_version,
        )
        return _dlpack.patch_export(capsule, dtype=self._dtype) if bf16 else capsule

    @staticmethod
    def _dlpack_device_or_none(impl: MemoryImpl) -> tuple[int, int] | None:
        try:
            return tuple(impl.dlpack_device())  # type: ignore[return-value]
        except BufferError:
            return None

    def __repr__(self) -> str:
        return f"<hal.Array shape={self._shape} dtype={self._dtype} on {self.device}>"


def _alias_slots(cls: type, **aliases: str) -> None:
    """Give slots of ``cls`` a second, public name: the slot itself, read as fast as the first.

    A property costs a function call per read (about 100 ns on CPython 3.11, against about
    10 ns for a slot); the launch fast path of hal.kernels reads a dozen of these per call.
    """
    for public, slot in aliases.items():
        setattr(cls, public, cls.__dict__[slot])


# Fast-path views (documented in hal.spi): public names for what extensions read per call
_alias_slots(Array, signature="_sig", spi_buffer="_buffer", spi_offset="_offset")
_alias_slots(Buffer, spi_memory="_impl")


def _export_host(host: np.ndarray[Any, Any], max_version: Any) -> Any:
    """Export a host NumPy array (bfloat16 as its uint16 bits: the caller relabels it)."""
    if host.dtype.name == "bfloat16":
        host = host.view(np.uint16)
    if max_version is None:
        return host.__dlpack__()
    return host.__dlpack__(max_version=max_version)


def _copied(x: Array, target: Device) -> Array:
    """Return a new array of ``target`` holding a copy of ``x`` (complete when this returns)."""
    assert _copy is not None, "hal._copy installs hal.copy here when hal is imported"
    buf = target.alloc(x.nbytes)
    out = Array._view(buf, x.dtype, x.shape, 0, owns=True)
    try:
        if x.nbytes:
            s = target._internal_stream()
            _copy(out, x, stream=s)
            s.synchronize()
    except BaseException:
        buf.close()
        raise
    return out
