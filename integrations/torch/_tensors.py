"""Moving torch tensors in and out of hal arrays on the rank's device.

Today every call stages: the tensor's bytes are copied into a hal buffer of the rank's device
(``hal.copy``), the collective runs there, and the result is copied back into the tensor.
On the CPU emulator both copies are memcpys of host memory.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

import hal
import hal.comm

__all__ = ["Staged", "check_tensor", "host_view"]

#: torch dtypes whose NumPy view hal.comm reduces (the rest raise TypeError naming the dtype).
_NUMPY = {
    torch.float32: np.float32,
    torch.float64: np.float64,
    torch.int32: np.int32,
    torch.int64: np.int64,
    torch.float16: np.float16,
    torch.int8: np.int8,
    torch.uint8: np.uint8,
}


def check_tensor(t: object, name: str) -> torch.Tensor:
    """Return ``t`` if hal can carry it: a dense, contiguous CPU tensor of a dtype hal.comm supports."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name}={t!r} is not a torch.Tensor")
    if t.device.type != "cpu":
        raise ValueError(f"{name} is on {t.device}; the 'hal' backend takes CPU tensors (devices=['cpu'])")
    if t.layout != torch.strided or not t.is_contiguous():
        raise ValueError(f"{name} (shape {tuple(t.shape)}, strides {t.stride()}) must be a dense contiguous tensor")
    dt = _NUMPY.get(t.dtype)
    if dt is None or np.dtype(dt) not in hal.comm.DTYPES:
        names = ", ".join(str(d) for d in hal.comm.DTYPES)
        raise TypeError(f"{name}.dtype={t.dtype} is not supported by hal.comm (supported: {names})")
    return t


def host_view(t: torch.Tensor) -> np.ndarray[Any, Any]:
    """The tensor's memory as a flat NumPy array (no copy)."""
    return t.detach().reshape(-1).numpy()


class Staged:
    """One hal array on ``device`` holding a concatenation of tensors (copied in at creation).

    Args:
        device, stream: the rank's device and the stream every copy and collective is ordered on.
        dtype: the element type.
        count: the number of elements.
        fill: tensors copied in back to back (their total may be less than ``count``).
    """

    def __init__(
        self, device: hal.Device, stream: hal.Stream, dtype: torch.dtype, count: int, fill: list[torch.Tensor] = ()  # type: ignore[assignment]
    ) -> None:
        npd = np.dtype(_NUMPY[dtype])
        self._stream = stream
        self._buf = device.alloc(max(count * npd.itemsize, npd.itemsize))
        self.array = self._buf.view(npd, count)
        self._itemsize = npd.itemsize
        off = 0
        for t in fill:
            if t.numel():
                hal.copy(self._buf, host_view(t), stream=stream, dst_offset=off)
            off += t.numel() * npd.itemsize

    def part(self, start: int, count: int) -> hal.Array:
        """Elements ``start .. start + count`` as a hal array view."""
        return self._buf.view(self.array.dtype, count, offset=start * self._itemsize)

    def copy_out(self, tensors: list[torch.Tensor], start: int = 0) -> None:
        """Copy elements from ``start`` on back into ``tensors`` (back to back), then wait for the copies."""
        off = start * self._itemsize
        for t in tensors:
            n = t.numel() * self._itemsize
            if n:
                hal.copy(host_view(t), self._buf, stream=self._stream, nbytes=n, src_offset=off)
            off += n
        self._stream.synchronize()

    def close(self) -> None:
        """Free the device buffer."""
        self._buf.close()

    def __enter__(self) -> Staged:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
