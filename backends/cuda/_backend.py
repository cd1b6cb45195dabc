"""The ``cuda`` backend class: probes CuPy and the CUDA driver, lists the devices.

Importing this module does not import CuPy; :class:`CudaBackend` imports it when hal
probes the backend on a machine whose CUDA driver library loads (a machine without one is
told apart in about a millisecond, without CuPy), and turns every way of not having a usable
GPU into :class:`hal.BackendUnavailableError` with a reason a user can act on.
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Sequence
from typing import Any

from hal import BackendUnavailableError, __version__, spi
from hal.backends.cuda._errors import is_cuda_error, translate_cuda_error
from hal.spi import BackendImpl, DeviceImpl

__all__ = ["NOT_INSTALLED", "CudaBackend", "parse_device_filter"]

NOT_INSTALLED = 'CuPy is not installed: pip install "hal-sdk[cuda]"'
"""The reason given when CuPy cannot be imported at all."""


def parse_device_filter(text: str | None, count: int) -> list[int]:
    """Parse ``HAL_CUDA_DEVICES`` (``"0,2"``) into CUDA ordinals, in hal index order.

    ``None`` or an empty string selects every one of the ``count`` visible devices.

    Raises:
        ValueError: not a comma list of distinct integers in ``0..count-1``.
    """
    if text is None or not text.strip():
        return list(range(count))
    out: list[int] = []
    for part in text.split(","):
        item = part.strip()
        if not item.isdigit():
            raise ValueError(f"HAL_CUDA_DEVICES={text!r}: {item!r} is not a CUDA device ordinal")
        ordinal = int(item)
        if ordinal >= count:
            raise ValueError(
                f"HAL_CUDA_DEVICES={text!r}: ordinal {ordinal} is out of range ({count} CUDA device(s) visible)"
            )
        if ordinal in out:
            raise ValueError(f"HAL_CUDA_DEVICES={text!r}: ordinal {ordinal} is listed twice")
        out.append(ordinal)
    return out


def _driver_missing() -> str | None:
    """Return why the CUDA driver library cannot be loaded (Linux), or None when it loads.

    A ``dlopen`` of ``libcuda.so.1`` costs about a millisecond; importing CuPy to find out the
    same costs 150 ms or more, in every process that probes the backends (each rank of
    ``hal run``). Elsewhere than Linux nothing is checked here (None): CuPy's probe decides.
    """
    if not sys.platform.startswith("linux"):
        return None
    import ctypes

    try:
        ctypes.CDLL("libcuda.so.1")
    except OSError as exc:
        return str(exc) or "libcuda.so.1 cannot be loaded"
    return None


def _cupy_installed() -> bool:
    """Whether an importable ``cupy`` is on the path, without importing it."""
    try:
        return importlib.util.find_spec("cupy") is not None
    except (ImportError, ValueError):  # a half-imported or odd entry in sys.modules
        return False


def _import_cupy() -> Any:
    """Import CuPy or raise BackendUnavailableError saying how to install it.

    Without CuPy the reason is :data:`NOT_INSTALLED`. With CuPy but without a CUDA driver
    library (Linux: ``libcuda.so.1`` does not load) CuPy is not imported at all: the reason
    says that the driver was not found. Otherwise CuPy is imported and a CuPy that fails to
    import gets its own reason.
    """
    no_driver = _driver_missing()
    if no_driver is not None:
        if not _cupy_installed():
            raise BackendUnavailableError("cuda", NOT_INSTALLED)
        raise BackendUnavailableError(
            "cuda",
            f"CUDA driver not found ({no_driver}); install the NVIDIA driver to use the cuda "
            "backend (CuPy is installed but was not imported)",
        )
    try:
        import cupy
    except ImportError as exc:
        if exc.name in ("cupy", "cupy_backends"):
            raise BackendUnavailableError("cuda", NOT_INSTALLED) from exc
        raise BackendUnavailableError(
            "cuda",
            f"CuPy is installed but failed to import ({type(exc).__name__}: {exc}); reinstall it",
        ) from exc
    except Exception as exc:  # noqa: BLE001 - a broken CuPy install must not crash discovery
        raise BackendUnavailableError(
            "cuda",
            f"CuPy failed to import ({type(exc).__name__}: {exc}); check the CuPy installation",
        ) from exc
    return cupy


def _version(v: int) -> str:
    """Format a CUDA version number (13020) as ``"13.2"``."""
    return f"{v // 1000}.{(v % 1000) // 10}" if v else "none"


def _no_gpu_reason(exc: BaseException, cupy: Any) -> str:
    """Word why CUDA could not start, from CuPy's exception and the driver version."""
    from cupy_backends.cuda.api import runtime as rt

    try:
        driver = int(rt.driverGetVersion())
    except Exception:  # noqa: BLE001 - only refines the message
        driver = -1
    try:
        runtime = _version(int(rt.runtimeGetVersion()))
    except Exception:  # noqa: BLE001 - only refines the message
        runtime = "?"
    status = int(getattr(exc, "status", -1))
    if status == 35 and driver == 0:
        return (
            f"CUDA driver not found (CuPy {cupy.__version__}: {exc}); install the NVIDIA driver "
            f"for CUDA {runtime} or newer to use the cuda backend"
        )
    if status == 35 and driver > 0:
        return (
            f"the NVIDIA driver supports CUDA {_version(driver)} but CuPy {cupy.__version__} needs CUDA "
            f"{runtime} ({exc}); upgrade the driver or install the cupy-cudaXXx wheel matching it"
        )
    err = translate_cuda_error(exc) if is_cuda_error(exc) else None
    if isinstance(err, BackendUnavailableError):
        return f"{err.reason} [CuPy {cupy.__version__}]"
    return f"CUDA could not be initialized (CuPy {cupy.__version__}: {type(exc).__name__}: {exc})"


class CudaBackend(BackendImpl):
    """NVIDIA GPUs through CuPy: cudaMalloc memory, non-blocking streams, events, peer copies."""

    name = "cuda"
    api_version = (1, 1)

    def __init__(self) -> None:
        cupy = _import_cupy()
        try:
            from cupy_backends.cuda.api import runtime as rt

            count = int(rt.getDeviceCount())
        except (RuntimeError, OSError) as exc:  # CUDARuntimeError is a RuntimeError
            raise BackendUnavailableError("cuda", _no_gpu_reason(exc, cupy)) from exc
        if count == 0:
            raise BackendUnavailableError(
                "cuda",
                "no CUDA-capable device is visible (check nvidia-smi and CUDA_VISIBLE_DEVICES)",
            )
        ordinals = parse_device_filter(spi.setting("HAL_CUDA_DEVICES"), count)
        if not ordinals:  # pragma: no cover - parse_device_filter never returns [] for count > 0
            raise BackendUnavailableError("cuda", "HAL_CUDA_DEVICES selects no device")

        from hal.backends.cuda._device import CudaDevice, staging_from_env

        staging = staging_from_env()
        try:
            devices = [CudaDevice(i, o, staging) for i, o in enumerate(ordinals)]
            for dev in devices:
                dev.declare(devices)
        except RuntimeError as exc:
            if is_cuda_error(exc):
                raise translate_cuda_error(exc) from exc
            raise
        self._devices = devices
        self._versions = {
            "cupy": str(cupy.__version__),
            "cuda_runtime": _version(int(rt.runtimeGetVersion())),
            "cuda_driver": _version(int(rt.driverGetVersion())),
            "hal-sdk": __version__,
        }

    def devices(self) -> Sequence[DeviceImpl]:
        return self._devices

    def version_info(self) -> dict[str, str]:
        return dict(self._versions)
