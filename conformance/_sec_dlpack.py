"""DLPACK-*: export of device memory through DLPack, exactly when the capability is declared."""

from __future__ import annotations

from typing import Any

import numpy as np

import hal
from hal.conformance._checks import heavy, raises, upload
from hal.conformance._registry import requirement
from hal.conformance._target import Target

_KDLCPU = 1
#: DLPack device types whose memory the host reads directly (CPU, CUDA host, ROCm host).
_HOST_READABLE = (1, 3, 11)
_DTYPES = (np.uint8, np.int16, np.int32, np.float32, np.float64, np.complex64)
_SHAPES = ((7,), (3, 5), (2, 3, 4))


def _is_capsule(obj: object) -> bool:
    return type(obj).__name__ == "PyCapsule"


class _Producer:
    """An export of a hal.Array seen as a foreign producer (so hal.from_dlpack reads the capsule)."""

    def __init__(self, arr: hal.Array) -> None:
        self._arr = arr

    def __dlpack__(self, **kwargs: Any) -> Any:
        return self._arr.__dlpack__(**kwargs)

    def __dlpack_device__(self) -> tuple[int, int]:
        return self._arr.__dlpack_device__()


def _read_export(t: Target, arr: hal.Array, what: str) -> np.ndarray[Any, Any]:
    """Return a host copy of what a DLPack export of ``arr`` shows, on any device type.

    The capsule's own ``(device_type, device_id)`` must equal ``__dlpack_device__()``.
    Host-readable memory is read in place; any other memory through the backend's own
    adoption of its export (``hal.from_dlpack`` -> ``DeviceImpl.adopt``) and copy to host.
    """
    from hal._dlpack import consume

    declared = tuple(int(x) for x in arr.__dlpack_device__())
    imported = consume(_Producer(arr))
    try:
        t.expect(
            imported.device == declared,
            f"{what}: __dlpack_device__() says {declared} but the capsule says {imported.device}: "
            "the device type must name the memory the capsule points to",
        )
        t.expect(
            imported.shape == arr.shape and imported.dtype == arr.dtype,
            f"{what}: the capsule holds {imported.dtype}{imported.shape}, expected {arr.dtype}{arr.shape}",
        )
        if declared[0] in _HOST_READABLE:
            return np.array(imported.host_view(), copy=True)
    finally:
        imported.owner.release()
    try:
        adopted = hal.from_dlpack(_Producer(arr), device=t.device)
    except BufferError as exc:
        raise t.fail(
            f"{what}: the export of device type {declared[0]} cannot be read back through the "
            f"backend itself (hal.from_dlpack raised BufferError: {exc}); a backend exporting "
            "memory the host cannot read adopts its own exports (DeviceImpl.adopt)"
        ) from exc
    try:
        return adopted.to_host()
    finally:
        adopted.close()


@requirement(
    "DLPACK-CONSISTENT",
    "__dlpack__ and __dlpack_device__ work exactly when the device declares the dlpack "
    "capability, and raise BufferError otherwise.",
)
def _consistent(t: Target) -> None:
    arr = t.alloc(64).view(np.float32)
    if t.device.capabilities.dlpack:
        try:
            dev = arr.__dlpack_device__()
            cap = arr.__dlpack__()
        except BufferError as exc:
            raise t.fail(
                f"the device declares dlpack, but DLPack export raised BufferError: {exc}"
            ) from exc
        t.expect(
            isinstance(dev, tuple) and len(dev) == 2 and all(isinstance(int(x), int) for x in dev),
            f"__dlpack_device__() returned {dev!r}, expected (device_type, device_id)",
        )
        t.expect(
            _is_capsule(cap), f"__dlpack__() returned {type(cap).__name__}, expected a PyCapsule"
        )
    else:
        raises(BufferError, "__dlpack_device__ of a device without dlpack", arr.__dlpack_device__)
        raises(BufferError, "__dlpack__ of a device without dlpack", arr.__dlpack__)


@requirement(
    "DLPACK-VALUES",
    "A DLPack export (any dtype, shape, offset view) shows exactly the array's values after all "
    "work enqueued before it, zero-copy for host-reachable memory.",
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
            if kind not in _HOST_READABLE:
                # no zero-copy view on the host: the values are read through the backend's own copy
                got = _read_export(t, arr, f"{np.dtype(dt)}{shape} at byte offset {offset}")
                t.expect(
                    np.array_equal(got.view(np.uint8), want.view(np.uint8)),
                    f"the DLPack export of a {np.dtype(dt)}{shape} view at byte offset {offset} shows other values",
                )
                hal.memset(arr, 0x11, stream=s)
                again = _read_export(t, arr, "after a memset")
                t.expect(
                    bool((again.view(np.uint8) == 0x11).all()),
                    "a DLPack export does not show a memset enqueued before it",
                )
                continue
            got = np.from_dlpack(arr)
            t.expect(
                got.shape == shape and got.dtype == np.dtype(dt),
                f"from_dlpack gave {got.dtype}{got.shape}, expected {np.dtype(dt)}{shape}",
            )
            t.expect(
                np.array_equal(got.view(np.uint8), want.view(np.uint8)),
                f"from_dlpack of a {np.dtype(dt)}{shape} view at byte offset {offset} shows other values",
            )
            # ordering: work enqueued before the export is visible in it
            heavy(t, s, ms=3)
            hal.memset(arr, 0x11, stream=s)
            again = np.from_dlpack(arr)
            t.expect(
                bool((again.view(np.uint8) == 0x11).all()),
                "a DLPack export does not show a memset enqueued before it",
            )
            # zero-copy: later device writes show through the first export
            hal.memset(arr, 0x22, stream=s)
            s.synchronize()
            t.expect(
                bool((got.view(np.uint8) == 0x22).all()),
                "a host-reachable DLPack export is a copy, not a view",
            )


@requirement(
    "DLPACK-ARGS",
    "__dlpack__(copy=True) exports a copy that does not alias the array (host memory: a NumPy "
    "copy), zero-size arrays export, a foreign dl_device raises BufferError, a closed buffer "
    "hal.InvalidBufferError.",
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
        t.expect(
            np.array_equal(host.view(np.uint8), np.arange(64, dtype=np.uint8)),
            "numpy.from_dlpack(copy=True) shows other values",
        )
        host[:] = 0
        t.expect(
            np.array_equal(np.from_dlpack(arr).view(np.uint8), np.arange(64, dtype=np.uint8)),
            "a copy=True export aliases the array",
        )
    empty = t.alloc(0).view(np.float32, (0,))
    t.expect(_is_capsule(empty.__dlpack__()), "a zero-size array did not export")
    raises(
        BufferError,
        "__dlpack__(dl_device=another device)",
        arr.__dlpack__,
        dl_device=(kind + 100, ident),
    )
    t.expect(
        _is_capsule(arr.__dlpack__(copy=False, dl_device=(kind, ident))),
        "__dlpack__(copy=False, dl_device=its own device) did not export",
    )
    buf.close()
    raises((hal.InvalidBufferError,), "__dlpack__ of a closed buffer", arr.__dlpack__)


@requirement(
    "DLPACK-DEVICE",
    "__dlpack_device__ names the device type and id of the exported memory: the capsule carries "
    "the same pair, and the memory reads back the array's values after all work enqueued before "
    "the export (host-readable types in place, others through the backend's own adoption and copy "
    "to host).",
    needs="dlpack",
)
def _device(t: Target) -> None:
    s = t.stream()
    buf = t.alloc(4096 + 40)
    raw = t.rng.integers(0, 256, size=buf.nbytes, dtype=np.uint8)
    upload(buf, raw, s)
    for dt, offset in ((np.float32, 8), (np.uint8, 33), (np.int64, 40)):
        count = (buf.nbytes - offset) // np.dtype(dt).itemsize
        arr = buf.view(dt, (count,), offset=offset)
        got = _read_export(t, arr, f"{np.dtype(dt)} view at byte offset {offset}")
        want = raw[offset : offset + count * np.dtype(dt).itemsize]
        t.expect(
            np.array_equal(got.view(np.uint8), want),
            f"the DLPack export of a {np.dtype(dt)} view at byte offset {offset} shows other values",
        )
        # and after work enqueued before the export (hal core does not synchronize for the backend)
        heavy(t, s, ms=5)
        hal.memset(arr, 0x5A, stream=s)
        again = _read_export(t, arr, f"{np.dtype(dt)} view after a memset")
        t.expect(
            bool((again.view(np.uint8) == 0x5A).all()),
            f"the DLPack export of a {np.dtype(dt)} view does not show a memset enqueued before the export",
        )
        upload(buf, raw, s)
    kind, ident = buf.view(np.uint8).__dlpack_device__()
    t.attach("dlpack_device", [int(kind), int(ident)])
