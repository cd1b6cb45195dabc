"""``hal.copy``, ``hal.memset`` and ``hal.copy_path``: every data movement goes through here."""

from __future__ import annotations

import logging
from typing import Literal

import numpy as np

from hal._device import Device
from hal._errors import DeviceMismatchError
from hal._hostmem import check_host_array
from hal._memory import Array, Buffer, _as_size
from hal._spi import MemoryImpl, StreamImpl
from hal._stream import Stream, _check_stream
from hal._trace import tracer

__all__ = ["CopyPath", "copy", "copy_path", "memset"]

CopyPath = Literal["local", "peer", "staged"]

_log = logging.getLogger("hal.copy")


class _Operand:
    """A resolved copy operand: device memory (``buffer``) or host bytes (``host``)."""

    __slots__ = ("base", "buffer", "device", "host", "impl", "size")

    def __init__(
        self,
        device: Device | None,
        buffer: Buffer | None,
        impl: MemoryImpl,
        host: memoryview | None,
        base: int,
        size: int,
    ) -> None:
        self.device = device
        self.buffer = buffer
        self.impl = impl
        self.host = host
        self.base = base
        self.size = size


class _HostSide(MemoryImpl):
    """Placeholder ``impl`` of a host operand; never handed to a backend."""

    nbytes = 0

    def free(self) -> None:  # pragma: no cover - never called
        raise AssertionError("host operands own no device memory")


_HOST_SIDE = _HostSide()


def _operand(value: object, name: str, writable: bool) -> _Operand:
    cls = type(value)
    if cls is Buffer:
        assert isinstance(value, Buffer)
        return _Operand(value._device, value, value._live(), None, 0, value._nbytes)
    if cls is Array:
        assert isinstance(value, Array)
        buf = value._buffer
        return _Operand(buf._device, buf, buf._live(), None, value._offset, value.nbytes)
    check_host_array(value, name)  # plain numbers only: never PyObject* addresses or records
    try:
        view = memoryview(value)  # type: ignore[arg-type]
    except TypeError:
        raise TypeError(
            f"{name}={value!r} is neither a hal.Buffer/hal.Array nor a host object with the buffer protocol"
        ) from None
    except (
        ValueError
    ):  # a NumPy dtype the buffer protocol cannot express (bfloat16): copy its bytes
        if not (isinstance(value, np.ndarray) and value.flags.c_contiguous):
            raise
        view = memoryview(value.reshape(-1).view(np.uint8))  # type: ignore[arg-type]
    if not view.c_contiguous:
        raise ValueError(f"{name} is a non-contiguous host buffer; pass a C-contiguous one")
    if writable and view.readonly:
        raise ValueError(f"{name} is a read-only host buffer; the destination must be writable")
    view = view.cast("B") if view.ndim != 1 or view.format != "B" else view
    return _Operand(None, None, _HOST_SIDE, view, 0, view.nbytes)


def _path(dst: _Operand, src: _Operand) -> CopyPath:
    if (
        dst.device is None
        or src.device is None
        or dst.device is src.device
        or dst.device == src.device
    ):
        return "local"
    if dst.device.can_access_peer(src.device):
        return "peer"
    return "staged"


def copy_path(dst: object, src: object) -> CopyPath:
    """Return how a copy from ``src`` to ``dst`` travels.

    ``"local"``: within one device, or between the host and a device; ``"peer"``: directly
    between two devices of one backend with peer access; ``"staged"``: through host memory
    (devices of different backends, or without peer access).
    """
    return _path(_operand(dst, "dst", True), _operand(src, "src", False))


def copy(
    dst: object,
    src: object,
    *,
    stream: Stream,
    nbytes: int | None = None,
    dst_offset: int = 0,
    src_offset: int = 0,
) -> CopyPath:
    """Copy ``nbytes`` bytes from ``src`` to ``dst`` in any direction; return the path taken.

    ``dst``/``src`` are :class:`hal.Buffer`, :class:`hal.Array` (their bytes) or host objects
    with the buffer protocol (C-contiguous; ``dst`` writable). At least one side is device
    memory and ``stream`` belongs to one of the devices involved.

    The copy is enqueued on ``stream`` after the work already there. Host memory must stay
    valid and unchanged until the stream reaches the copy. Staged copies (through host
    memory, ``copy_path == "staged"``) complete before this function returns.

    Args:
        nbytes: bytes to copy; by default everything from ``src_offset`` to the end of ``src``.
        dst_offset, src_offset: byte offsets into ``dst`` and ``src``.

    Raises:
        TypeError, ValueError: bad operands, sizes or offsets (nothing is enqueued).
        hal.DeviceMismatchError: ``stream`` is not on a device of the copy.
        hal.InvalidBufferError: a buffer or the stream is closed.
    """
    d = _operand(dst, "dst", True)
    s = _operand(src, "src", False)
    doff = (
        dst_offset
        if type(dst_offset) is int and dst_offset >= 0
        else _as_size(dst_offset, "dst_offset")
    )
    soff = (
        src_offset
        if type(src_offset) is int and src_offset >= 0
        else _as_size(src_offset, "src_offset")
    )
    if soff > s.size:
        raise ValueError(f"src_offset={soff} is past the end of src ({s.size} bytes)")
    n = s.size - soff if nbytes is None else _as_size(nbytes, "nbytes")
    if soff + n > s.size:
        raise ValueError(f"nbytes={n} at src_offset={soff} overruns src ({s.size} bytes)")
    if doff + n > d.size:
        raise ValueError(f"nbytes={n} at dst_offset={doff} overruns dst ({d.size} bytes)")
    if d.device is None and s.device is None:
        raise TypeError(
            "hal.copy needs device memory on at least one side (both dst and src are host objects)"
        )
    st = stream if type(stream) is Stream else _check_stream(stream)
    impl = st._live()
    sdev = st._device
    if sdev is not d.device and sdev is not s.device and sdev not in (d.device, s.device):
        raise DeviceMismatchError(
            f"stream belongs to {st.device}; the copy involves {d.device or 'host'} <- {s.device or 'host'}"
        )
    path = _path(d, s)
    if n == 0:
        return path
    doff += d.base
    soff += s.base
    tr = tracer()
    if tr is None:
        _enqueue(d, doff, s, soff, n, st, impl, path)
    else:
        args = {
            "path": path,
            "bytes": n,
            "src": str(s.device or "host"),
            "dst": str(d.device or "host"),
        }
        name = "copy " + ("D2H" if d.host is not None else "H2D" if s.host is not None else path)
        if path == "staged":
            with tr.span(tr.stream_track(st), name, "copy", args):
                _enqueue(d, doff, s, soff, n, st, impl, path)
        else:
            with tr.stream_span(st, name, "copy", args):
                _enqueue(d, doff, s, soff, n, st, impl, path)
    if _log.isEnabledFor(logging.DEBUG):
        _log.debug(
            "copy %d bytes %s <- %s path=%s", n, d.device or "host", s.device or "host", path
        )
    return path


def _enqueue(
    d: _Operand,
    doff: int,
    s: _Operand,
    soff: int,
    n: int,
    st: Stream,
    impl: StreamImpl,
    path: CopyPath,
) -> None:
    if d.host is not None:
        impl.copy_to_host(d.host[doff : doff + n], s.impl, soff, n)
    elif s.host is not None:
        impl.copy_from_host(d.impl, doff, s.host[soff : soff + n], n)
    elif path == "local":
        impl.copy(d.impl, doff, s.impl, soff, n)
    elif path == "peer":
        impl.copy_peer(d.impl, doff, s.impl, soff, n)
    else:
        _staged(d, doff, s, soff, n, st)


def _staged(d: _Operand, doff: int, s: _Operand, soff: int, n: int, stream: Stream) -> None:
    """Copy between devices without a peer path, through a host bounce buffer."""
    assert d.device is not None and s.device is not None
    stream.synchronize()
    bounce = np.empty(n, dtype=np.uint8)
    view = bounce.data
    src_stream = stream if stream.device == s.device else s.device._internal_stream()
    src_stream._live().copy_to_host(view, s.impl, soff, n)
    src_stream.synchronize()
    dst_stream = stream if stream.device == d.device else d.device._internal_stream()
    dst_stream._live().copy_from_host(d.impl, doff, view, n)
    dst_stream.synchronize()


def memset(
    buf: Buffer | Array, value: int, *, stream: Stream, nbytes: int | None = None, offset: int = 0
) -> None:
    """Set ``nbytes`` bytes of ``buf`` starting at ``offset`` to the byte ``value``.

    Args:
        buf: a :class:`hal.Buffer` or :class:`hal.Array` (its bytes).
        value: a byte, 0..255.
        stream: a stream of the buffer's device.
        nbytes: bytes to set; by default everything from ``offset`` to the end.
        offset: byte offset into ``buf``.
    """
    if not isinstance(buf, (Buffer, Array)):
        raise TypeError(f"buf={buf!r} is not a hal.Buffer or hal.Array")
    d = _operand(buf, "buf", True)
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"value={value!r} must be an integer byte")
    if not 0 <= int(value) <= 255:
        raise ValueError(f"value={value} must be in 0..255")
    off = _as_size(offset, "offset")
    if off > d.size:
        raise ValueError(f"offset={off} is past the end of the buffer ({d.size} bytes)")
    n = d.size - off if nbytes is None else _as_size(nbytes, "nbytes")
    if off + n > d.size:
        raise ValueError(f"nbytes={n} at offset={off} overruns the buffer ({d.size} bytes)")
    st = _check_stream(stream, d.device)
    if n:
        st._live().memset(d.impl, d.base + off, int(value), n)
