"""Reduction ops, dtypes, argument checks and the call signature every rank agrees on."""

from __future__ import annotations

import dataclasses
import struct
from typing import Any

import numpy as np

import hal

__all__ = [
    "DTYPES",
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
]

#: Reduction ops of every reducing collective. ``avg`` is ``sum`` then a scale by 1/ranks.
REDUCE_OPS = ("sum", "prod", "max", "min", "avg")
#: Element types the collectives accept.
DTYPES = (np.dtype(np.float32), np.dtype(np.float64), np.dtype(np.int32), np.dtype(np.int64))


def check_op(op: object) -> str:
    """Return ``op`` if it is a reduction op name, else raise naming it."""
    if not isinstance(op, str):
        raise TypeError(f"op={op!r} must be one of {', '.join(REDUCE_OPS)}")
    if op not in REDUCE_OPS:
        raise ValueError(f"op={op!r} is not a reduction op; use one of {', '.join(REDUCE_OPS)}")
    return op


def check_dtype(dtype: Any, name: str = "dtype") -> np.dtype[Any]:
    """Return ``dtype`` as a NumPy dtype if collectives support it, else raise naming it."""
    dt = np.dtype(dtype)
    if dt not in DTYPES:
        raise TypeError(f"{name}={dt} is not supported by hal.comm; use float32, float64, int32 or int64")
    return dt


def check_array(value: object, name: str, device: hal.Device | None = None) -> hal.Array:
    """Return ``value`` if it is an open ``hal.Array`` of a supported dtype (on ``device``)."""
    if not isinstance(value, hal.Array):
        raise TypeError(f"{name}={value!r} is not a hal.Array")
    if value.buffer.closed:
        raise hal.InvalidBufferError(f"{name}: its buffer is closed")
    check_dtype(value.dtype, f"{name}.dtype")
    if device is not None and value.device != device:
        raise hal.DeviceMismatchError(f"{name} lives on {value.device}; this rank's device is {device}")
    return value


def flat(arr: hal.Array) -> hal.Array:
    """Return a 1-D view of all elements of ``arr``."""
    return arr.buffer.view(arr.dtype, arr.size, offset=arr.offset)


def sub(arr: hal.Array, start: int, count: int) -> hal.Array:
    """Return the 1-D view of ``count`` elements of ``arr`` (1-D) from element ``start``."""
    return arr.buffer.view(arr.dtype, count, offset=arr.offset + start * arr.dtype.itemsize)


def accumulate(dst: hal.Array, src: hal.Array, op: str, stream: hal.Stream) -> None:
    """Enqueue ``dst = op(dst, src)`` with hal.kernels (``avg`` accumulates as ``sum``)."""
    if dst.size == 0:
        return
    import hal.kernels

    with hal.kernels.internal():  # hal.comm's own step: never the user's fallback warning
        hal.kernels.accumulate(dst, src, op="sum" if op == "avg" else op, stream=stream)


def finish_avg(arr: hal.Array, ranks: int, stream: hal.Stream) -> None:
    """Enqueue the division of a summed ``arr`` by the rank count (``avg``)."""
    if arr.size == 0:
        return
    import hal.kernels

    with hal.kernels.internal():
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
        return f"{self.collective}(op={self.op}, dtype={self.dtype}, count={self.count}, root={self.root}) seq {self.seq}"


