"""``hal.copy``, ``hal.memset`` and ``hal.copy_path``: every data movement goes through here."""

from __future__ import annotations

import logging
from typing import Any, Literal

import numpy as np

from hal import _memory
from hal._device import Device
from hal._errors import DeviceMismatchError
from hal._hostmem import check_host_array
from hal._memory import Array, Buffer, _as_size
from hal._spi import MemoryImpl, StreamImpl
from hal._stream import Stream, _check_stream
from hal._trace import _open as _trace_open
from hal._trace import tracer

__all__ = ["CopyPath", "copy", "copy_path", "memset"]

CopyPath = Literal["local", "peer", "staged"]

_log = logging.getLogger("hal.copy")
_log_enabled = _log.isEnabledFor  # bound once (the logger's level may still change)
# The logger's own answer cache (emptied, never replaced, when levels change): False there
# means debug is off without a call; anything else asks isEnabledFor.
_log_known = getattr(_log, "_cache", {}).get
_DEBUG = logging.DEBUG
_ZERO = 0  # the int 0 (CPython keeps one): offsets left at 0 are this object, no type() needed
_ndarray = np.ndarray
_MEMORY = (Buffer, Array)


class _HostSide(MemoryImpl):
    """Placeholder ``impl`` of a host operand; never handed to a backend."""

    nbytes = 0

    def free(self) -> None:  # pragma: no cover - never called
        raise AssertionError("host operands own no device memory")


_HOST_SIDE = _HostSide()

#: A resolved copy operand: (device or None for host bytes, the SPI memory (``_HOST_SIDE`` for
#: host bytes), the host bytes as a flat ``"B"`` memoryview or None, base offset, size).
_Operand = tuple[Device | None, MemoryImpl, memoryview | None, int, int]

#: NumPy dtypes already checked as plain numbers (the check_host_array fast path)
_plain_dtypes: set[np.dtype[Any]] = set()


def _operand(value: Any, name: str, writable: bool) -> _Operand:
    cls = type(value)
    if cls is Buffer:
        impl = value._impl
        return (value._device, impl if impl is not None else value._live(), None, 0, value._nbytes)
    if cls is Array:
        buf = value._buffer
        impl = buf._impl
        if impl is None:
            impl = buf._live()
        return (buf._device, impl, None, value._offset, value.nbytes)
    if cls is np.ndarray:  # the hot path: a NumPy array of plain numbers, checked dtype
        if value.dtype in _plain_dtypes:
            view = memoryview(value)
            if view.c_contiguous and not (writable and view.readonly):
                if view.ndim != 1 or view.format != "B":
                    view = view.cast("B")
                return (None, _HOST_SIDE, view, 0, view.nbytes)
    check_host_array(value, name)  # plain numbers only: never PyObject* addresses or records
    direct = cls is np.ndarray  # its dtype passed check_host_array and the buffer protocol
    try:
        view = memoryview(value)
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
        direct = False
    if not view.c_contiguous:
        raise ValueError(f"{name} is a non-contiguous host buffer; pass a C-contiguous one")
    if writable and view.readonly:
        raise ValueError(f"{name} is a read-only host buffer; the destination must be writable")
    if direct:
        _plain_dtypes.add(value.dtype)
    view = view.cast("B") if view.ndim != 1 or view.format != "B" else view
    return (None, _HOST_SIDE, view, 0, view.nbytes)


def _path(ddev: Device | None, sdev: Device | None) -> CopyPath:
    if ddev is None or sdev is None or ddev is sdev or ddev == sdev:
        return "local"
    if ddev.can_access_peer(sdev):
        return "peer"
    return "staged"


def copy_path(dst: object, src: object) -> CopyPath:
    """Return how a copy from ``src`` to ``dst`` travels.

    ``"local"``: within one device, or between the host and a device; ``"peer"``: directly
    between two devices of one backend with peer access; ``"staged"``: through host memory
    (devices of different backends, or without peer access).
    """
    return _path(_operand(dst, "dst", True)[0], _operand(src, "src", False)[0])


def _fast_done(n: int, dst: object, src: object) -> CopyPath:
    """The end of hal.copy's fast path with debug logging on: the full path's log line; "local"."""
    _log.debug("copy %d bytes %s <- %s path=local", n, _side(dst), _side(src))
    return "local"


def _fast_peer(stream: Stream, impl: StreamImpl, dev: Device, d: Any, x: Any) -> CopyPath | None:
    """hal.copy's fast path for whole open operands on two devices, one the stream's, with a peer
    path between them: the full path's ``copy_peer``; None (nothing done) for anything else."""
    if type(x) is Buffer:
        simpl, sdev, sbase, n = x._impl, x._device, 0, x._nbytes
    else:
        buf = x._buffer
        simpl, sdev, sbase = buf._impl, buf._device, x._offset
        n = x.nbytes if simpl is not None else 0
    if type(d) is Buffer:
        dimpl, ddev, dbase, dsize = d._impl, d._device, 0, d._nbytes
    else:
        buf = d._buffer
        dimpl, ddev, dbase = buf._impl, buf._device, d._offset
        dsize = d.nbytes if dimpl is not None else 0
    if (
        simpl is None
        or dimpl is None
        or not n
        or n > dsize
        or ddev is sdev
        or (dev is not ddev and dev is not sdev)
        # _path(ddev, sdev) == "peer", inlined (Device.can_access_peer without its checks; one
        # device under two handles, equal or not, is left to the full path)
        or ddev._backend != sdev._backend
        or ddev._impl is sdev._impl
        or not ddev._impl.can_access_peer(sdev._impl)
    ):
        return None
    stream._enqueues += 1  # before the call, as on the full path
    impl.copy_peer(dimpl, dbase, simpl, sbase, n)
    if _log_known(_DEBUG) is not False and _log_enabled(_DEBUG):
        _log.debug("copy %d bytes %s <- %s path=%s", n, ddev, sdev, "peer")
    return "peer"


def _side(x: object) -> object:
    """The device of a copy operand, or "host" (for the debug log)."""
    if isinstance(x, Buffer):
        return x.device
    if isinstance(x, Array):
        return x.device
    return "host"


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
    # The fast path: whole operands (default nbytes and offsets), both open memory of the
    # stream's device, or one of them a NumPy array of plain numbers handed to the backend's
    # copy_from_array/copy_to_array (no memoryview), or both open memory of two devices with a
    # peer path, one of them the stream's (_fast_peer: copy_peer); an open stream with no
    # fallback host wait; no trace. It enqueues what the full path would, with the same effects
    # (enqueue_count). Anything else (closed buffers, other devices, sizes that do not fit,
    # empty copies, host arrays the backend does not take) falls through, having done
    # nothing, to the full path below, which raises the usual errors.
    if (
        nbytes is None
        and dst_offset is _ZERO  # exactly the int 0 (a default, or any 0 CPython made)
        and src_offset is _ZERO
        and type(stream) is Stream
        and not _trace_open
    ):
        impl = stream._impl
        if impl is not None and not stream._gates:
            dev = stream._device
            d: Any = dst  # the operands, typed for the checks below
            x: Any = src
            # the source: open memory of the stream's device, or a host array (host -> device);
            # n stays 0 (the full path) for anything else
            cls = type(x)
            if cls is Buffer:
                simpl = x._impl
                n = x._nbytes if simpl is not None and x._device is dev else 0
                sbase = 0
            elif cls is Array:
                buf = x._buffer
                simpl = buf._impl
                n = x.nbytes if simpl is not None and buf._device is dev else 0
                sbase = x._offset
            elif cls is _ndarray and x.dtype in _plain_dtypes:
                simpl = None
                n = x.nbytes
            else:
                n = 0
            if n:
                cls = type(d)
                if cls is Buffer:
                    dimpl = d._impl
                    ok = dimpl is not None and d._device is dev and n <= d._nbytes
                    dbase = 0
                elif cls is Array:
                    buf = d._buffer
                    dimpl = buf._impl
                    ok = dimpl is not None and buf._device is dev and n <= d.nbytes
                    dbase = d._offset
                elif cls is _ndarray and simpl is not None and d.dtype in _plain_dtypes:
                    dimpl = None  # device -> host
                    ok = n <= d.nbytes and impl.copy_to_array(d, simpl, sbase, n)
                else:
                    ok = False
                if ok and dimpl is not None:
                    if simpl is None:  # host -> device
                        ok = impl.copy_from_array(dimpl, dbase, x, n)
                    else:  # device -> device
                        stream._enqueues += 1  # before the call, as on the full path
                        impl.copy(dimpl, dbase, simpl, sbase, n)
                        if _log_known(_DEBUG) is not False and _log_enabled(_DEBUG):
                            return _fast_done(n, d, x)
                        return "local"
                if ok:
                    stream._enqueues += 1
                    if _log_known(_DEBUG) is not False and _log_enabled(_DEBUG):
                        return _fast_done(n, d, x)
                    return "local"
            if type(d) in _MEMORY and type(x) in _MEMORY:  # two devices, one the stream's?
                peer = _fast_peer(stream, impl, dev, d, x)
                if peer is not None:
                    return peer
    ddev, dimpl, dhost, dbase, dsize = _operand(dst, "dst", True)
    sdev, simpl, shost, sbase, ssize = _operand(src, "src", False)
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
    if soff > ssize:
        raise ValueError(f"src_offset={soff} is past the end of src ({ssize} bytes)")
    n = ssize - soff if nbytes is None else _as_size(nbytes, "nbytes")
    if soff + n > ssize:
        raise ValueError(f"nbytes={n} at src_offset={soff} overruns src ({ssize} bytes)")
    if doff + n > dsize:
        raise ValueError(f"nbytes={n} at dst_offset={doff} overruns dst ({dsize} bytes)")
    if ddev is None and sdev is None:
        raise TypeError(
            "hal.copy needs device memory on at least one side (both dst and src are host objects)"
        )
    st = stream if type(stream) is Stream else _check_stream(stream)
    impl = st._impl  # Stream._live() inlined: open, no pending fallback host wait
    if impl is None or st._gates:
        impl = st._live()
    else:
        st._enqueues += 1
    stdev = st._device
    if stdev is not ddev and stdev is not sdev and stdev not in (ddev, sdev):
        raise DeviceMismatchError(
            f"stream belongs to {st.device}; the copy involves {ddev or 'host'} <- {sdev or 'host'}"
        )
    if ddev is None or sdev is None or ddev is sdev:
        path: CopyPath = "local"
    else:
        path = _path(ddev, sdev)
    if n == 0:
        return path
    doff += dbase
    soff += sbase
    if not _trace_open:  # tracing off (hal._trace.tracer() without the call)
        if dhost is not None:
            impl.copy_to_host(dhost if n == dsize else dhost[doff : doff + n], simpl, soff, n)
        elif shost is not None:
            impl.copy_from_host(dimpl, doff, shost if n == ssize else shost[soff : soff + n], n)
        elif path == "local":
            impl.copy(dimpl, doff, simpl, soff, n)
        else:
            _enqueue(ddev, dimpl, dhost, doff, sdev, simpl, shost, soff, n, st, impl, path)
    else:
        tr = tracer()
        if tr is None:
            _enqueue(ddev, dimpl, dhost, doff, sdev, simpl, shost, soff, n, st, impl, path)
        else:
            args = {
                "path": path,
                "bytes": n,
                "src": str(sdev or "host"),
                "dst": str(ddev or "host"),
            }
            name = "copy " + ("D2H" if dhost is not None else "H2D" if shost is not None else path)
            if path == "staged":
                with tr.span(tr.stream_track(st), name, "copy", args):
                    _enqueue(ddev, dimpl, dhost, doff, sdev, simpl, shost, soff, n, st, impl, path)
            else:
                with tr.stream_span(st, name, "copy", args):
                    _enqueue(ddev, dimpl, dhost, doff, sdev, simpl, shost, soff, n, st, impl, path)
    if _log_enabled(_DEBUG):
        _log.debug("copy %d bytes %s <- %s path=%s", n, ddev or "host", sdev or "host", path)
    return path


def _enqueue(
    ddev: Device | None,
    dimpl: MemoryImpl,
    dhost: memoryview | None,
    doff: int,
    sdev: Device | None,
    simpl: MemoryImpl,
    shost: memoryview | None,
    soff: int,
    n: int,
    st: Stream,
    impl: StreamImpl,
    path: CopyPath,
) -> None:
    if dhost is not None:
        impl.copy_to_host(dhost[doff : doff + n], simpl, soff, n)
    elif shost is not None:
        impl.copy_from_host(dimpl, doff, shost[soff : soff + n], n)
    elif path == "local":
        impl.copy(dimpl, doff, simpl, soff, n)
    elif path == "peer":
        impl.copy_peer(dimpl, doff, simpl, soff, n)
    else:
        assert ddev is not None and sdev is not None
        _staged(ddev, dimpl, doff, sdev, simpl, soff, n, st)


def _staged(
    ddev: Device,
    dimpl: MemoryImpl,
    doff: int,
    sdev: Device,
    simpl: MemoryImpl,
    soff: int,
    n: int,
    stream: Stream,
) -> None:
    """Copy between devices without a peer path, through a host bounce buffer."""
    stream.synchronize()
    bounce = np.empty(n, dtype=np.uint8)
    view = bounce.data
    src_stream = stream if stream.device == sdev else sdev._internal_stream()
    src_stream._live().copy_to_host(view, simpl, soff, n)
    src_stream.synchronize()
    dst_stream = stream if stream.device == ddev else ddev._internal_stream()
    dst_stream._live().copy_from_host(dimpl, doff, view, n)
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
    ddev, dimpl, _, dbase, dsize = _operand(buf, "buf", True)
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"value={value!r} must be an integer byte")
    if not 0 <= int(value) <= 255:
        raise ValueError(f"value={value} must be in 0..255")
    off = _as_size(offset, "offset")
    if off > dsize:
        raise ValueError(f"offset={off} is past the end of the buffer ({dsize} bytes)")
    n = dsize - off if nbytes is None else _as_size(nbytes, "nbytes")
    if off + n > dsize:
        raise ValueError(f"nbytes={n} at offset={off} overruns the buffer ({dsize} bytes)")
    st = _check_stream(stream, ddev)
    if n:
        st._live().memset(dimpl, dbase + off, int(value), n)


_memory._copy = copy  # Array.to_host copies through here (hal._memory never imports this module)
