"""DLPACK-*: export of device memory through DLPack, exactly when the capability is declared."""

from __future__ import annotations

import numpy as np

import hal
from hal.conformance._checks import heavy, raises, upload
from hal.conformance._registry import requirement
from hal.conformance._target import Target

_KDLCPU = 1
_DTYPES = (np.uint8, np.int16, np.int32, np.float32, np.float64, np.complex64)
_SHAPES = ((7,), (3, 5), (2, 3, 4))


def _is_capsule(obj: object) -> bool:
    return type(obj).__name__ == "PyCapsule"


@requirement(
    "DLPACK-CONSISTENT",
    "__dlpack__ and __dlpack_device__ work exactly when the device declares the dlpack capability, and raise BufferError otherwise.",
)
def _consistent(t: Target) -> None:
    arr = t.alloc(64).view(np.float32)
    if t.device.capabilities.dlpack:
        try:
            dev = arr.__dlpack_device__()
            cap = arr.__dlpack__()
        except BufferError as exc:
            raise t.fail(f"the device declares dlpack, but DLPack export raised BufferError: {exc}") from exc
        t.expect(isinstance(dev, tuple) and len(dev) == 2 and all(isinstance(int(x), int) for x in dev),
                 f"__dlpack_device__() returned {dev!r}, expected (device_type, device_id)")
        t.expect(_is_capsule(cap), f"__dlpack__() returned {type(cap).__name__}, expected a PyCapsule")
    else:
        raises(BufferError, "__dlpack_device__ of a device without dlpack", arr.__dlpack_device__)
        raises(BufferError, "__dlpack__ of a device without dlpack", arr.__dlpack__)


@requirement(
    "DLPACK-VALUES",
    "A DLPack export (any dtype, shape, offset view) shows exactly the array's values after all work enqueued before it, zero-copy for host-reachable memory.",
    needs="dlpack",
)
def _values(t: Target) -> None:
    s = t.stream()
    for dt in _DTYPES:
        for shape in _SHAPES:
            itemsize = np.dtype(dt).itemsize
            count = int(np.prod(shape))
            offset = itemsize * 3
            buf = t.alloc(offset + count * itemsize + 16)
            raw = t.rng.integers(0, 256, size=buf.nbytes, dtype=np.uint8)
            upload(buf, raw, s)
            arr = buf.view(dt, shape, offset=offset)
            want = raw[offset : offset + count * itemsize].view(dt).reshape(shape)
            kind, _ = arr.__dlpack_device__()
            if kind != _KDLCPU:
                t.expect(_is_capsule(arr.__dlpack__(stream=None)), f"__dlpack__ of {dt.__name__}{shape} is not a capsule")
                continue
            got = np.from_dlpack(arr)
            t.expect(got.shape == shape and got.dtype == np.dtype(dt),
                     f"from_dlpack gave {got.dtype}{got.shape}, expected {np.dtype(dt)}{shape}")
            t.expect(np.array_equal(got.view(np.uint8), want.view(np.uint8)),
                     f"from_dlpack of a {np.dtype(dt)}{shape} view at byte offset {offset} shows other values")
            # ordering: work enqueued before the export is visible in it
            heavy(t, s, ms=3)
            hal.memset(arr, 0x11, stream=s)
            again = np.from_dlpack(arr)
            t.expect(bool((again.view(np.uint8) == 0x11).all()), "a DLPack export does not show a memset enqueued before it")
            # zero-copy: later device writes show through the first export
            hal.memset(arr, 0x22, stream=s)
            s.synchronize()
            t.expect(bool((got.view(np.uint8) == 0x22).all()), "a host-reachable DLPack export is a copy, not a view")


@requirement(
    "DLPACK-ARGS",
    "__dlpack__(copy=True) exports a copy that does not alias the array (host memory: a NumPy copy), zero-size arrays export, a foreign dl_device raises BufferError, a closed buffer hal.InvalidBufferError.",
    needs="dlpack",
)
def _args(t: Target) -> None:
    buf = t.alloc(64)
    arr = buf.view(np.float32)
    kind, ident = arr.__dlpack_device__()
    s = t.stream()
    upload(buf, np.arange(64, dtype=np.uint8), s)
    copied = arr.__dlpack__(copy=True)
    t.expect(_is_capsule(copied), "__dlpack__(copy=True) did not export a capsule")
    if kind == _KDLCPU:
        host = np.from_dlpack(arr, copy=True)
        t.expect(np.array_equal(host.view(np.uint8), np.arange(64, dtype=np.uint8)), "numpy.from_dlpack(copy=True) shows other values")
        host[:] = 0
        t.expect(np.array_equal(np.from_dlpack(arr).view(np.uint8), np.arange(64, dtype=np.uint8)),
                 "a copy=True export aliases the array")
    empty = t.alloc(0).view(np.float32, (0,))
    t.expect(_is_capsule(empty.__dlpack__()), "a zero-size array did not export")
    raises(BufferError, "__dlpack__(dl_device=another device)", arr.__dlpack__, dl_device=(kind + 100, ident))
    t.expect(_is_capsule(arr.__dlpack__(copy=False, dl_device=(kind, ident))),
             "__dlpack__(copy=False, dl_device=its own device) did not export")
    buf.close()
    raises((hal.InvalidBufferError,), "__dlpack__ of a closed buffer", arr.__dlpack__)
