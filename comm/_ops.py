"""Reduction ops, dtypes, argument checks and the call signature every rank agrees on."""

from __future__ import annotations

import dataclasses
import importlib.util
import struct
from collections.abc import Callable
from typing import Any

import numpy as np

import hal

__all__ = [
    "DTYPES",
    "HALF_DTYPES",
    "REDUCE_OPS",
    "SIGNATURE_BYTES",
    "Signature",
    "accumulate",
    "check_array",
    "check_dtype",
    "check_op",
    "finish_avg",
    "flat",
    "sub",
    "widen",
]

#: Reduction ops of every reducing collective. ``avg`` is ``sum`` then a scale by 1/ranks.
REDUCE_OPS = ("sum", "prod", "max", "min", "avg")


#: Element types the collectives accept (bfloat16 is ``ml_dtypes.bfloat16``, what torch's
#: bfloat16 tensors arrive as through DLPack). Built on first use (module ``__getattr__``):
#: it imports ml_dtypes, which costs ~1.3 s of CPU (0.7.0), so processes without bfloat16 skip it.
DTYPES: tuple[np.dtype[Any], ...]
#: Half-precision dtypes: their reductions accumulate in float32 and round once at the end.
#: Built on first use, as :data:`DTYPES`.
HALF_DTYPES: frozenset[np.dtype[Any]]
#: the dtypes of DTYPES that NumPy has itself, before and after bfloat16
_OWN = tuple(np.dtype(n) for n in ("float32", "float64", "int32", "int64", "float16"))
_BYTES = (np.dtype(np.int8), np.dtype(np.uint8))
#: the half-precision dtypes met so far (bfloat16 joins when first checked)
_HALF: set[np.dtype[Any]] = {np.dtype(np.float16)}
_WIDE = np.dtype(np.float32)
_BF16: list[np.dtype[Any]] = []  # ml_dtypes.bfloat16's dtype, once imported


def _bfloat16() -> np.dtype[Any] | None:
    """Return ``ml_dtypes.bfloat16``'s dtype, importing ml_dtypes on first use (None without it).

    ml_dtypes is imported only where bfloat16 is involved: a bfloat16 dtype object exists only
    once ml_dtypes was imported, and a name (``"bfloat16"``) comes here.
    """
    if not _BF16:
        try:
            import ml_dtypes
        except ImportError:  # pragma: no cover - ml_dtypes is a dependency of hal-sdk
            return None
        _BF16.append(np.dtype(ml_dtypes.bfloat16))
    return _BF16[0]


def _is_bfloat16(dt: np.dtype[Any]) -> bool:
    """Whether ``dt`` is ``ml_dtypes.bfloat16`` (a user-defined ``V`` kind dtype named bfloat16)."""
    if dt.kind != "V" or dt.name != "bfloat16":
        return False  # NumPy's own dtypes: ml_dtypes stays unimported
    bf = _bfloat16()
    return bf is not None and dt == bf


def _names() -> str:
    """The names of DTYPES, for messages (bfloat16 where ml_dtypes is installed, not imported)."""
    bf = ["bfloat16"] if _BF16 or importlib.util.find_spec("ml_dtypes") is not None else []
    return ", ".join([*(dt.name for dt in _OWN), *bf, *(dt.name for dt in _BYTES)])


def __getattr__(name: str) -> Any:
    """Build :data:`DTYPES` and :data:`HALF_DTYPES` on first use (they import ml_dtypes)."""
    if name == "DTYPES":
        bf = _bfloat16()
        value: Any = (*_OWN, *([bf] if bf is not None else []), *_BYTES)
    elif name == "HALF_DTYPES":
        value = frozenset(dt for dt in __getattr__("DTYPES") if dt.name in ("float16", "bfloat16"))
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value
    return value


def check_op(op: object) -> str:
    """Return ``op`` if it is a reduction op name, else raise naming it."""
    if not isinstance(op, str):
        raise TypeError(f"op={op!r} must be one of {', '.join(REDUCE_OPS)}")
    if op not in REDUCE_OPS:
        raise ValueError(f"op={op!r} is not a reduction op; use one of {', '.join(REDUCE_OPS)}")
    return op


def check_dtype(dtype: Any, name: str = "dtype") -> np.dtype[Any]:
    """Return ``dtype`` as a NumPy dtype if collectives support it, else raise naming it."""
    if isinstance(dtype, np.dtype) and dtype in _SUPPORTED:  # seen before: no conversion, no search
        return dtype
    # by name: NumPy knows the name once ml_dtypes is imported
    if isinstance(dtype, str) and dtype == "bfloat16":
        bf = _bfloat16()
        if bf is None:
            raise TypeError(f"{name}=bfloat16 needs the ml_dtypes package (pip install ml_dtypes)")
        dt = bf
    else:
        dt = np.dtype(dtype)
    if dt not in _OWN and dt not in _BYTES:
        if not _is_bfloat16(dt):
            raise TypeError(f"{name}={dt} is not supported by hal.comm; use one of {_names()}")
        _HALF.add(dt)
    _SUPPORTED.add(dt)
    return dt


#: the supported dtypes check_dtype met (a fast hit next time)
_SUPPORTED: set[np.dtype[Any]] = set()


def _who(value: object) -> str:
    cls = type(value)
    return f"a {cls.__module__}.{cls.__qualname__}" if cls.__module__ != "builtins" else repr(value)


def check_array(
    value: object, name: str, device: hal.Device | None = None, *, rank: int | None = None
) -> hal.Array:
    """Return ``value`` as an open ``hal.Array`` of a supported dtype (on ``device``), else raise.

    ``value`` is a ``hal.Array`` or any DLPack producer (a torch tensor, a NumPy array) whose
    memory is memory of ``device``: it is used zero-copy through :func:`hal.from_dlpack` (no
    copy is ever made). Errors name ``rank`` (when given), the argument and the value.
    """
    where = f"rank {rank}: " if rank is not None else ""
    if not isinstance(value, hal.Array):
        if not hasattr(value, "__dlpack__"):
            raise TypeError(
                f"{where}{name}={value!r} is neither a hal.Array nor a DLPack producer (__dlpack__)"
            )
        value = _from_producer(value, name, device, where)
    if value.buffer.closed:
        raise hal.InvalidBufferError(f"{where}{name}: its buffer is closed")
    check_dtype(value.dtype, f"{where}{name}.dtype")
    if device is not None and value.device != device:
        raise hal.DeviceMismatchError(
            f"{where}{name} lives on {value.device}; this rank's device is {device}"
        )
    return value


def _from_producer(value: object, name: str, device: hal.Device | None, where: str) -> hal.Array:
    """Adopt a DLPack producer's memory zero-copy, mapping refusals to hal's argument errors."""
    what = _who(value)
    try:
        return hal.from_dlpack(value, device=device, copy=False)
    except BufferError as exc:
        reason = getattr(exc, "reason", "")
        detail = str(exc).split("; pass copy=True")[
            0
        ]  # collectives never copy: no copy= to suggest
        text = f"{where}{name} ({what}): {detail}; hal.comm uses tensors zero-copy only"
        if reason == "device":
            raise hal.DeviceMismatchError(
                f"{where}{name} ({what}) is not on this rank's device {device}: {detail}; hal.comm uses "
                "tensors zero-copy only: move it there first (hal.from_dlpack(x, device=..., copy=True))"
            ) from exc
        if reason == "dtype":
            raise TypeError(f"{text}; its dtypes are {_names()}") from exc
        if reason == "strides":
            raise ValueError(f"{text}: pass a contiguous tensor (x.contiguous())") from exc
        raise ValueError(text) from exc  # read-only, or the producer refused to export


def flat(arr: hal.Array) -> hal.Array:
    """Return a 1-D view of all elements of ``arr`` (``arr`` itself when it is one already)."""
    if len(arr.shape) == 1:
        return arr  # arrays are immutable views: no new view per call
    return arr.buffer.view(arr.dtype, arr.size, offset=arr.offset)


#: dtype -> name (NumPy computes ``dtype.name`` anew on every read, ~3 µs)
_DTYPE_NAMES: dict[np.dtype[Any], str] = {}


def dtype_name(dt: np.dtype[Any]) -> str:
    """Return ``dt.name``, cached per dtype (read on every collective call)."""
    name = _DTYPE_NAMES.get(dt)
    if name is None:
        name = _DTYPE_NAMES[dt] = dt.name
    return name


def sub(arr: hal.Array, start: int, count: int) -> hal.Array:
    """Return the 1-D view of ``count`` elements of ``arr`` (1-D) from element ``start``."""
    return arr.buffer.view(arr.dtype, count, offset=arr.offset + start * arr.dtype.itemsize)


def accumulate(dst: hal.Array, src: hal.Array, op: str, stream: hal.Stream) -> None:
    """Enqueue ``dst = op(dst, src)`` with hal.kernels (``avg`` accumulates as ``sum``)."""
    if dst.size == 0:
        return
    import hal.kernels
    import hal.kernels.spi

    with hal.kernels.spi.internal():  # hal.comm's own step: never the user's fallback warning
        hal.kernels.accumulate(dst, src, op="sum" if op == "avg" else op, stream=stream)


def finish_avg(arr: hal.Array, ranks: int, stream: hal.Stream) -> None:
    """Enqueue the division of a summed ``arr`` by the rank count (``avg``)."""
    if arr.size == 0:
        return
    import hal.kernels
    import hal.kernels.spi

    with hal.kernels.spi.internal():
        hal.kernels.scale(arr, 1.0 / ranks, out=arr, stream=stream)


_SIG = struct.Struct("<q20s8s8s24sqqq")
#: Size of a packed :class:`Signature`.
SIGNATURE_BYTES = 96


@dataclasses.dataclass(frozen=True)
class Signature:
    """What one rank called: every rank compares its own with the others' before moving data."""

    seq: int
    collective: str
    op: str
    dtype: str
    count: int
    root: int
    chunk: int
    algorithm: str = ""

    def pack(self) -> bytes:
        """Return the fixed-size wire form (:data:`SIGNATURE_BYTES` bytes)."""
        return _SIG.pack(
            self.seq,
            self.collective.encode(),
            self.op.encode(),
            self.dtype.encode(),
            self.algorithm.encode(),
            self.count,
            self.root,
            self.chunk,
        ).ljust(SIGNATURE_BYTES, b"\0")

    @classmethod
    def unpack(cls, data: bytes) -> Signature:
        """Parse the wire form written by :meth:`pack`."""
        seq, coll, op, dt, algo, count, root, chunk = _SIG.unpack(bytes(data[: _SIG.size]))

        def text(b: bytes) -> str:
            return b.rstrip(b"\0").decode(errors="replace")

        return cls(seq, text(coll), text(op), text(dt), count, root, chunk, text(algo))

    def differences(self, other: Signature) -> list[str]:
        """Return ``field: mine vs theirs`` for every field that differs."""
        out = []
        for f in dataclasses.fields(self):
            a, b = getattr(self, f.name), getattr(other, f.name)
            if a != b:
                out.append(f"{f.name} {a!r} vs {b!r}")
        return out

    def describe(self) -> str:
        """Return a short human-readable form."""
        return (
            f"{self.collective}(op={self.op}, dtype={self.dtype}, count={self.count}, "
            f"root={self.root}) seq {self.seq}"
        )


def _cast(src: hal.Array, dst: hal.Array, stream: hal.Stream) -> None:
    if dst.size == 0:
        return
    import hal.kernels
    import hal.kernels.spi

    with hal.kernels.spi.internal():
        hal.kernels.cast(src, dst.dtype, out=dst, stream=stream)


def widen(
    call: Any, rank: int, size: int, temp: Callable[[Any, int], hal.Array], stream: hal.Stream
) -> tuple[Any, Callable[[], None] | None]:
    """Run a float16/bfloat16 reduction in float32: return the call to run and the step that narrows.

    ``all_reduce``, ``reduce`` and ``reduce_scatter`` of a half-precision dtype convert this
    rank's input into a float32 temporary (exact), reduce that (sum/prod/max/min, ``avg``'s
    division included) and round the result once, to nearest-even, into the caller's output
    (``narrow``, to call after the collective, on ``stream``). Other calls come back as they are
    with ``None``. Every rank widens alike, so the float32 data the ranks exchange match.
    """
    send = call.send
    if call.collective not in ("all_reduce", "reduce", "reduce_scatter") or send is None:
        return call, None
    if send.dtype not in _HALF and not _is_bfloat16(send.dtype):
        return call, None
    wide = temp(_WIDE, send.size)
    _cast(send, wide, stream)
    if call.collective == "all_reduce":
        out = call.recv if call.recv is not None else send
        return dataclasses.replace(call, send=wide, recv=wide), lambda: _cast(wide, out, stream)
    if call.collective == "reduce":
        new = dataclasses.replace(call, send=wide, recv=None)
        if rank != call.root:
            return new, None
        out = call.recv if call.recv is not None else send
        return new, lambda: _cast(wide, out, stream)
    from hal.comm._algorithms import split

    start, n = split(send.size, size)[rank]
    out = call.recv if call.recv is not None else sub(send, start, n)
    return dataclasses.replace(call, send=wide, recv=None), lambda: _cast(
        sub(wide, start, n), out, stream
    )
