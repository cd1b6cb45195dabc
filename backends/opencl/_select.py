"""Find PyOpenCL, the platforms and the devices the backend uses (``HAL_OPENCL_*`` filters).

Shared by the backend and by the raw-PyOpenCL benchmark baseline so both run on the same
devices. PyOpenCL is imported here, lazily, only when a probe runs.
"""

from __future__ import annotations

import dataclasses
import os
from types import ModuleType
from typing import TYPE_CHECKING

from hal import BackendUnavailableError, spi
from hal.backends.opencl._errors import status_name

if TYPE_CHECKING:
    import pyopencl as cl

__all__ = ["INSTALL_HINT", "Selection", "import_pyopencl", "select_devices"]

BACKEND = "opencl"
INSTALL_HINT = (
    'install an OpenCL driver (ICD): pip install "pyopencl[pocl]" gives a CPU device with no '
    "system step; for GPUs install the vendor's ICD (e.g. apt install pocl-opencl-icd, "
    "intel-opencl-icd, nvidia-opencl-icd or rocm-opencl-runtime)"
)


@dataclasses.dataclass(frozen=True)
class Selection:
    """The devices chosen for the backend, grouped by platform (one context per platform)."""

    platforms: tuple[cl.Platform, ...]
    #: (platform, device) pairs in HAL index order
    devices: tuple[tuple[cl.Platform, cl.Device], ...]


def import_pyopencl() -> ModuleType:
    """Import and return ``pyopencl``, or raise :class:`hal.BackendUnavailableError` saying what to install."""
    try:
        import pyopencl
    except ImportError as exc:
        raise BackendUnavailableError(
            BACKEND,
            f'PyOpenCL is not installed ({exc}): pip install "hal-sdk[opencl]" '
            '(or pip install "pyopencl[pocl]" for PyOpenCL with a CPU OpenCL device)',
        ) from exc
    return pyopencl


def _platforms(cl: ModuleType) -> list[cl.Platform]:
    try:
        platforms = list(cl.get_platforms())
    except cl.Error as exc:
        code = getattr(exc, "code", None)
        name = status_name(code) if isinstance(code, int) else type(exc).__name__
        vendors = os.environ.get("OCL_ICD_VENDORS")
        where = f"OCL_ICD_VENDORS={vendors!r}" if vendors else "/etc/OpenCL/vendors"
        raise BackendUnavailableError(
            BACKEND,
            f"no OpenCL platform: the ICD loader found no driver (CL_{name}; it looked in {where} "
            f"and beside PyOpenCL); {INSTALL_HINT}",
        ) from exc
    if not platforms:
        raise BackendUnavailableError(BACKEND, f"no OpenCL platform found; {INSTALL_HINT}")
    return platforms


def _filter_platforms(platforms: list[cl.Platform]) -> list[cl.Platform]:
    raw = spi.setting("HAL_OPENCL_PLATFORM") or ""
    if not raw:
        return platforms
    chosen = [p for p in platforms if raw.lower() in p.name.lower()]
    if not chosen:
        names = ", ".join(repr(p.name) for p in platforms)
        raise BackendUnavailableError(
            BACKEND,
            f"HAL_OPENCL_PLATFORM={raw!r} matches no platform name (platforms here: {names})",
        )
    return chosen


def _platform_devices(cl: ModuleType, platform: cl.Platform) -> list[cl.Device]:
    try:
        return list(platform.get_devices())
    except cl.Error as exc:  # DEVICE_NOT_FOUND on some ICDs instead of an empty list
        code = getattr(exc, "code", None)
        if code == -1:
            return []
        raise


def _parse_device_filter(raw: str) -> list[str]:
    items = [part.strip() for part in raw.split(",")]
    if any(not item for item in items):
        raise ValueError(
            f"HAL_OPENCL_DEVICES={raw!r} has an empty item; use a comma list of indices or name substrings"
        )
    return items


def _filter_devices(
    pairs: list[tuple[cl.Platform, cl.Device]],
) -> list[tuple[cl.Platform, cl.Device]]:
    raw = spi.setting("HAL_OPENCL_DEVICES") or ""
    if not raw:
        return pairs
    listing = "; ".join(f"{i}: {d.name.strip()!r}" for i, (_, d) in enumerate(pairs))
    chosen: list[int] = []
    for item in _parse_device_filter(raw):
        if item.lstrip("-").isdigit():
            index = int(item)
            if not 0 <= index < len(pairs):
                raise BackendUnavailableError(
                    BACKEND,
                    f"HAL_OPENCL_DEVICES={raw!r}: index {index} is out of range (devices here: {listing})",
                )
            matches = [index]
        else:
            matches = [i for i, (_, d) in enumerate(pairs) if item.lower() in d.name.lower()]
            if not matches:
                raise BackendUnavailableError(
                    BACKEND,
                    f"HAL_OPENCL_DEVICES={raw!r}: {item!r} matches no device name (devices here: {listing})",
                )
        chosen.extend(i for i in matches if i not in chosen)
    return [pairs[i] for i in chosen]


def select_devices(cl: ModuleType) -> Selection:
    """Return the platforms and devices selected by ``HAL_OPENCL_PLATFORM``/``HAL_OPENCL_DEVICES``.

    Raises:
        hal.BackendUnavailableError: no platform, no device, or a filter that selects nothing
            (the reason says what to install or which names exist).
        ValueError: a malformed ``HAL_OPENCL_DEVICES``.
    """
    platforms = _filter_platforms(_platforms(cl))
    pairs = [(p, d) for p in platforms for d in _platform_devices(cl, p)]
    if not pairs:
        names = ", ".join(repr(p.name) for p in platforms)
        pocl = os.environ.get("POCL_DEVICES")
        hint = (
            f" (POCL_DEVICES={pocl!r} may name no usable device driver)" if pocl is not None else ""
        )
        raise BackendUnavailableError(
            BACKEND, f"OpenCL platform(s) {names} have no device{hint}; {INSTALL_HINT}"
        )
    pairs = _filter_devices(pairs)
    used = tuple(p for p in platforms if any(p == q for q, _ in pairs))
    return Selection(platforms=used, devices=tuple(pairs))
