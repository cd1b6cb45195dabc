"""Torch tensors as hal arrays, zero-copy.

A dense contiguous CPU tensor enters hal.comm through DLPack (:func:`hal.from_dlpack`): the CPU
emulator adopts the tensor's memory as memory of the rank's device, so a collective reads and
writes the tensor itself. Lists of tensors (``all_gather`` into a list, ``reduce_scatter`` from
one, coalesced calls) go through one flat tensor, packed and unpacked with torch copies.
"""

from __future__ import annotations

from typing import Any

import torch

import hal
import hal.comm

__all__ = ["as_hal", "check_tensor"]


def check_tensor(t: object, name: str) -> torch.Tensor:
    """Return ``t`` if hal can carry it: a dense, contiguous CPU tensor of a dtype hal.comm reduces."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name}={t!r} is not a torch.Tensor")
    if t.device.type != "cpu":
        raise ValueError(
            f"{name} is on {t.device}; the 'hal' backend takes CPU tensors (devices=['cpu'])"
        )
    if t.layout != torch.strided or not t.is_contiguous():
        raise ValueError(
            f"{name} (shape {tuple(t.shape)}, strides {t.stride()}) must be a dense contiguous tensor"
        )
    if (
        t.is_complex()
        or t.dtype == torch.bool
        or str(t.dtype).removeprefix("torch.") not in _names()
    ):
        raise TypeError(
            f"{name}.dtype={t.dtype} is not supported by hal.comm (supported: {', '.join(sorted(_names()))})"
        )
    return t


def _names() -> set[str]:
    return {d.name for d in hal.comm.DTYPES}


def as_hal(t: torch.Tensor, device: hal.Device) -> hal.Array:
    """The tensor's memory as a hal array of ``device`` (no copy; writes land in the tensor)."""
    return hal.from_dlpack(t.detach(), device=device, copy=False)


def flat_cat(tensors: Any, dtype: torch.dtype) -> torch.Tensor:
    """One contiguous 1-D tensor holding ``tensors`` back to back (a copy)."""
    parts = [t.reshape(-1) for t in tensors]
    return torch.cat(parts) if parts else torch.empty(0, dtype=dtype)


def unpack(flat: torch.Tensor, tensors: Any, start: int = 0) -> None:
    """Copy ``flat[start:]`` back into ``tensors``, back to back."""
    off = start
    for t in tensors:
        n = t.numel()
        t.view(-1).copy_(flat[off : off + n])
        off += n
