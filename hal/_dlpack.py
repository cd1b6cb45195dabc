"""DLPack in ctypes: read a producer's capsule (any dtype, bfloat16 included) and patch exports.

NumPy's own consumer refuses bfloat16 and memory of other devices, so hal reads the
``DLManagedTensor`` (legacy ``"dltensor"`` capsules) and ``DLManagedTensorVersioned``
(DLPack 1.x ``"dltensor_versioned"``) structures itself: :func:`consume` renames the capsule
to ``used_…`` (so the producer's capsule destructor leaves it alone) and hands back an
:class:`Imported` whose owner calls the producer's deleter exactly once, when the memory is
released. The layout is the one of ``dlpack.h`` (ABI-stable since 0.x; 1.x adds the versioned
struct).
"""

from __future__ import annotations

import ctypes
import dataclasses
import functools
import math
import weakref
from typing import Any, final

import numpy as np

__all__ = [
    "DEVICE_TYPES",
    "HOST_READABLE",
    "DLPackError",
    "Imported",
    "check_stream",
    "consume",
    "dl_dtype",
    "np_dtype",
    "patch_export",
]

#: DLPack device type codes -> names (``dlpack.h``).
DEVICE_TYPES = {
    1: "kDLCPU",
    2: "kDLCUDA",
    3: "kDLCUDAHost",
    4: "kDLOpenCL",
    7: "kDLVulkan",
    8: "kDLMetal",
    9: "kDLVPI",
    10: "kDLROCM",
    11: "kDLROCMHost",
    12: "kDLExtDev",
    13: "kDLCUDAManaged",
    14: "kDLOneAPI",
    15: "kDLWebGPU",
    16: "kDLHexagon",
    17: "kDLMAIA",
}
#: Device types whose memory the host CPU can read directly (plain and pinned host memory).
HOST_READABLE = frozenset({1, 3, 11})

_INT, _UINT, _FLOAT, _BFLOAT, _COMPLEX, _BOOL = 0, 1, 2, 4, 5, 6
_FLAG_READ_ONLY = 1 << 0
_FLAG_IS_COPIED = 1 << 1


class DLPackError(BufferError):
    """A ``BufferError`` of :func:`hal.from_dlpack` that says why, in ``reason``.

    Attributes:
        reason: ``"device"`` (memory of another device), ``"strides"`` (not C-contiguous),
            ``"readonly"``, ``"dtype"`` (no NumPy equivalent) or ``"protocol"``.
    """

    def __init__(self, message: str, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


def check_stream(stream: Any, dl_device: tuple[int, int] | None) -> None:
    """Check the consumer's ``stream`` of ``__dlpack__`` for an export to ``dl_device`` (array API rules).

    ``None`` is always accepted. For host memory (``kDLCPU``, pinned host) only ``None`` and ``-1``
    ("no synchronization", which asks nothing of a device without streams) are; for ``kDLCUDA``
    ``-1``, ``1`` (legacy default), ``2`` (per-thread default) or a stream pointer ``> 2``; for
    ``kDLROCM`` ``-1``, ``0`` or a pointer ``> 2``. Other device types (or unknown: ``None``) take
    what their backend accepts, so nothing is checked here.

    Raises:
        TypeError: ``stream`` is not None or an int (a bool, a string, a hal.Stream) where the
            device type needs an int.
        ValueError: an int the device type does not define (``stream=1`` for host memory).
    """
    if stream is None or dl_device is None:
        return
    kind = dl_device[0]
    if kind not in HOST_READABLE and kind not in (2, 10):
        return  # a stream convention of that device type (a SYCL queue ...): the backend's call
    where = device_name(dl_device)
    if isinstance(stream, bool) or not isinstance(stream, (int, np.integer)):
        raise TypeError(
            f"stream={stream!r} must be None or an int (the DLPack consumer's stream) for memory of {where}"
        )
    value = int(stream)
    if kind in HOST_READABLE:
        if value != -1:
            raise ValueError(
                f"stream={value}: memory of {where} has no streams; a DLPack consumer passes None "
                "(or -1, no synchronization)"
            )
    elif kind == 2 and (value < -1 or value == 0):
        raise ValueError(
            f"stream={value}: for memory of {where} the DLPack consumer's stream is None, -1, "
            "1 (legacy default), 2 (per-thread default) or a cudaStream_t pointer (> 2); 0 is ambiguous"
        )
    elif kind == 10 and (value < -1 or value in (1, 2)):
        raise ValueError(
            f"stream={value}: for memory of {where} the DLPack consumer's stream is None, -1, "
            "0 (default stream) or a hipStream_t pointer (> 2)"
        )


def device_name(dl_device: tuple[int, int]) -> str:
    """Return ``"kDLCPU:0"`` style text for a DLPack device tuple."""
    kind, index = dl_device
    return f"{DEVICE_TYPES.get(kind, f'device type {kind}')}:{index}"


class _Device(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _Tensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", _Device),
        ("ndim", ctypes.c_int32),
        ("dtype", _DType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


# PYFUNCTYPE: the deleter runs with the GIL held (NumPy's and others' deleters touch Python objects)
_Deleter = ctypes.PYFUNCTYPE(None, ctypes.c_void_p)


class _Managed(ctypes.Structure):
    _fields_ = [
        ("dl_tensor", _Tensor),
        ("manager_ctx", ctypes.c_void_p),
        ("deleter", ctypes.c_void_p),
    ]


class _Version(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32)]


class _ManagedVersioned(ctypes.Structure):
    _fields_ = [
        ("version", _Version),
        ("manager_ctx", ctypes.c_void_p),
        ("deleter", ctypes.c_void_p),
        ("flags", ctypes.c_uint64),
        ("dl_tensor", _Tensor),
    ]


_api = ctypes.pythonapi
_api.PyCapsule_IsValid.restype = ctypes.c_int
_api.PyCapsule_IsValid.argtypes = [ctypes.py_object, ctypes.c_char_p]
_api.PyCapsule_GetPointer.restype = ctypes.c_void_p
_api.PyCapsule_GetPointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
_api.PyCapsule_SetName.restype = ctypes.c_int
_api.PyCapsule_SetName.argtypes = [ctypes.py_object, ctypes.c_char_p]

_USED = b"used_dltensor"
_USED_VERSIONED = b"used_dltensor_versioned"


@functools.lru_cache(maxsize=64)
def np_dtype(code: int, bits: int, lanes: int) -> np.dtype[Any]:
    """Return the NumPy dtype of a DLPack ``(code, bits, lanes)``, or raise ``BufferError``."""
    if lanes != 1:
        raise DLPackError(
            f"DLPack dtype with lanes={lanes} (vector types) is not supported", "dtype"
        )
    if code == _BFLOAT and bits == 16:
        return bfloat16()
    kind = {_INT: "i", _UINT: "u", _FLOAT: "f", _COMPLEX: "c", _BOOL: "b"}.get(code)
    if kind is None or bits % 8:
        raise DLPackError(f"DLPack dtype code={code} bits={bits} has no NumPy equivalent", "dtype")
    try:
        return np.dtype(f"{kind}{bits // 8}") if kind != "b" else np.dtype(np.bool_)
    except TypeError as exc:
        raise DLPackError(
            f"DLPack dtype code={code} bits={bits} has no NumPy equivalent", "dtype"
        ) from exc


def dl_dtype(dtype: np.dtype[Any]) -> tuple[int, int, int] | None:
    """Return the DLPack ``(code, bits, lanes)`` for ``dtype``, or None if it has none."""
    if dtype.name == "bfloat16":
        return (_BFLOAT, 16, 1)
    code = {"i": _INT, "u": _UINT, "f": _FLOAT, "c": _COMPLEX, "b": _BOOL}.get(dtype.kind)
    return None if code is None else (code, dtype.itemsize * 8, 1)


def bfloat16() -> np.dtype[Any]:
    """Return the bfloat16 NumPy dtype (from ``ml_dtypes``), or raise ``BufferError`` naming the package."""
    try:
        import ml_dtypes
    except ImportError as exc:  # a dependency of hal-sdk; only a broken install lacks it
        raise DLPackError(
            "bfloat16 needs the ml_dtypes package (pip install ml_dtypes)", "dtype"
        ) from exc
    return np.dtype(ml_dtypes.bfloat16)


def _release(deleter: int, managed: int) -> None:
    if deleter:
        _Deleter(deleter)(managed)


@final
class _Owner:
    """Holds a consumed managed tensor; calls its deleter once when released or collected."""

    __slots__ = ("__weakref__", "_finalizer")

    def __init__(self, deleter: int, managed: int) -> None:
        self._finalizer = weakref.finalize(self, _release, deleter, managed)

    def release(self) -> None:
        """Call the producer's deleter now (idempotent)."""
        self._finalizer()


@final
@dataclasses.dataclass
class Imported:
    """A consumed DLPack tensor.

    Attributes:
        device: the DLPack ``(device_type, device_id)``.
        address: address of the first element (``data + byte_offset``).
        dtype: the NumPy dtype.
        shape: the shape.
        strides: strides in elements, or None (C-contiguous).
        readonly: the producer marked the memory read-only (DLPack 1.x flag).
        owner: keeps the producer's memory alive; ``owner.release()`` gives it back.
    """

    device: tuple[int, int]
    address: int
    dtype: np.dtype[Any]
    shape: tuple[int, ...]
    strides: tuple[int, ...] | None
    readonly: bool
    owner: _Owner

    @property
    def nbytes(self) -> int:
        """Bytes of a C-contiguous block of this shape and dtype."""
        return math.prod(self.shape) * self.dtype.itemsize

    @property
    def contiguous(self) -> bool:
        """True if the elements are C-contiguous (size-1 dimensions' strides ignored)."""
        if self.strides is None or math.prod(self.shape) == 0:
            return True
        expect = 1
        for n, s in zip(reversed(self.shape), reversed(self.strides), strict=True):
            if n != 1 and s != expect:
                return False
            expect *= n
        return True

    def host_view(self) -> np.ndarray[Any, Any]:
        """Return a NumPy view of host-readable memory (strides honoured); the owner must stay alive."""
        if self.device[0] not in HOST_READABLE:
            raise BufferError(f"memory of {device_name(self.device)} is not readable by the host")
        item = self.dtype.itemsize
        if not self.shape or math.prod(self.shape) == 0 or not self.address:
            return np.zeros(self.shape, dtype=self.dtype)
        strides = self.strides if self.strides is not None else _c_strides(self.shape)
        lo = sum(min(0, (n - 1) * s) for n, s in zip(self.shape, strides, strict=True))
        hi = sum(max(0, (n - 1) * s) for n, s in zip(self.shape, strides, strict=True)) + 1
        raw = (ctypes.c_uint8 * ((hi - lo) * item)).from_address(self.address + lo * item)
        base = np.frombuffer(raw, dtype=np.uint8).view(self.dtype)  # type: ignore[call-overload]
        return np.lib.stride_tricks.as_strided(
            base[-lo:], shape=self.shape, strides=tuple(s * item for s in strides), writeable=False
        )


def _c_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    out, acc = [], 1
    for n in reversed(shape):
        out.append(acc)
        acc *= n
    return tuple(reversed(out))


def consume(obj: Any) -> Imported:
    """Call ``obj.__dlpack__()`` (asking for DLPack 1.x first) and take ownership of the tensor.

    Raises:
        TypeError: ``obj`` does not implement ``__dlpack__``.
        BufferError: the producer refused, or its dtype has no NumPy equivalent.
    """
    export = getattr(obj, "__dlpack__", None)
    if export is None:
        raise TypeError(f"x={obj!r} does not implement the DLPack protocol (__dlpack__)")
    try:
        try:
            capsule = export(max_version=(1, 0))
        except TypeError:  # a pre-1.0 producer: no max_version keyword
            capsule = export()
    except DLPackError:
        raise
    except (
        Exception
    ) as exc:  # e.g. torch's BufferError "Can't export tensors that require gradient"
        raise DLPackError(
            f"the producer refused to export: {type(exc).__name__}: {exc}", "protocol"
        ) from exc
    if _api.PyCapsule_IsValid(capsule, b"dltensor_versioned"):
        ptr = _api.PyCapsule_GetPointer(capsule, b"dltensor_versioned")
        mv = _ManagedVersioned.from_address(ptr)
        if mv.version.major > 1:
            raise DLPackError(
                f"DLPack version {mv.version.major}.{mv.version.minor} is newer than hal reads (1.x)",
                "protocol",
            )
        tensor, deleter, flags, used = mv.dl_tensor, mv.deleter or 0, int(mv.flags), _USED_VERSIONED
    elif _api.PyCapsule_IsValid(capsule, b"dltensor"):
        ptr = _api.PyCapsule_GetPointer(capsule, b"dltensor")
        m = _Managed.from_address(ptr)
        tensor, deleter, flags, used = m.dl_tensor, m.deleter or 0, 0, _USED
    else:
        raise DLPackError(f"x.__dlpack__() returned {capsule!r}, not a DLPack capsule", "protocol")
    # from here the tensor is ours: the producer's capsule destructor skips a renamed capsule
    _api.PyCapsule_SetName(capsule, used)
    owner = _Owner(deleter, ptr)
    try:
        ndim = int(tensor.ndim)
        shape = tuple(int(tensor.shape[i]) for i in range(ndim))
        strides = tuple(int(tensor.strides[i]) for i in range(ndim)) if tensor.strides else None
        dt = np_dtype(int(tensor.dtype.code), int(tensor.dtype.bits), int(tensor.dtype.lanes))
        device = (int(tensor.device.device_type), int(tensor.device.device_id))
        address = (int(tensor.data or 0) + int(tensor.byte_offset)) if math.prod(shape) else 0
    except BaseException:
        owner.release()
        raise
    return Imported(device, address, dt, shape, strides, bool(flags & _FLAG_READ_ONLY), owner)


def patch_export(capsule: Any, *, dtype: np.dtype[Any] | None = None, copied: bool = False) -> Any:
    """Rewrite an unconsumed capsule's dtype (bfloat16 exported as uint16) and/or set IS_COPIED."""
    if _api.PyCapsule_IsValid(capsule, b"dltensor_versioned"):
        mv = _ManagedVersioned.from_address(
            _api.PyCapsule_GetPointer(capsule, b"dltensor_versioned")
        )
        tensor = mv.dl_tensor
        if copied:
            mv.flags = int(mv.flags) | _FLAG_IS_COPIED
    elif _api.PyCapsule_IsValid(capsule, b"dltensor"):
        tensor = _Managed.from_address(_api.PyCapsule_GetPointer(capsule, b"dltensor")).dl_tensor
    else:
        return capsule
    if dtype is not None:
        code = dl_dtype(dtype)
        if code is not None:
            tensor.dtype.code, tensor.dtype.bits, tensor.dtype.lanes = code
    return capsule
