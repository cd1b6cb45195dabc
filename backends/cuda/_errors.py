"""Translate CUDA status codes (CuPy's ``CUDARuntimeError``/``CUDADriverError``) into hal errors.

This module does not import CuPy at import time: the tables are those of
``cuda_runtime_api.h`` (``cudaError_t``) and ``cuda.h`` (``CUresult``), and CuPy's
exception classes are looked up only when an exception is translated.
"""

from __future__ import annotations

from typing import Literal

from hal import (
    BackendUnavailableError,
    DeviceError,
    HalError,
    OutOfMemoryError,
    StreamError,
)

__all__ = [
    "CudaInvalidValueError",
    "is_cuda_error",
    "status_name",
    "translate_cuda_error",
    "translate_status",
]

Api = Literal["runtime", "driver"]

# cudaError_t values (CUDA 13 runtime API) that hal treats specially or names in reports.
_RUNTIME_NAMES: dict[int, str] = {
    0: "cudaSuccess",
    1: "cudaErrorInvalidValue",
    2: "cudaErrorMemoryAllocation",
    3: "cudaErrorInitializationError",
    4: "cudaErrorCudartUnloading",
    34: "cudaErrorStubLibrary",
    35: "cudaErrorInsufficientDriver",
    36: "cudaErrorCallRequiresNewerDriver",
    46: "cudaErrorDevicesUnavailable",
    100: "cudaErrorNoDevice",
    101: "cudaErrorInvalidDevice",
    217: "cudaErrorPeerAccessUnsupported",
    400: "cudaErrorInvalidResourceHandle",
    600: "cudaErrorNotReady",
    700: "cudaErrorIllegalAddress",
    702: "cudaErrorLaunchTimeout",
    704: "cudaErrorPeerAccessAlreadyEnabled",
    705: "cudaErrorPeerAccessNotEnabled",
    709: "cudaErrorContextIsDestroyed",
    714: "cudaErrorHardwareStackError",
    715: "cudaErrorIllegalInstruction",
    716: "cudaErrorMisalignedAddress",
    717: "cudaErrorInvalidAddressSpace",
    718: "cudaErrorInvalidPc",
    719: "cudaErrorLaunchFailure",
    803: "cudaErrorSystemDriverMismatch",
    804: "cudaErrorCompatNotSupportedOnDevice",
    999: "cudaErrorUnknown",
}

# CUresult values (CUDA 13 driver API), same treatment.
_DRIVER_NAMES: dict[int, str] = {
    0: "CUDA_SUCCESS",
    1: "CUDA_ERROR_INVALID_VALUE",
    2: "CUDA_ERROR_OUT_OF_MEMORY",
    3: "CUDA_ERROR_NOT_INITIALIZED",
    4: "CUDA_ERROR_DEINITIALIZED",
    34: "CUDA_ERROR_STUB_LIBRARY",
    46: "CUDA_ERROR_DEVICE_UNAVAILABLE",
    100: "CUDA_ERROR_NO_DEVICE",
    101: "CUDA_ERROR_INVALID_DEVICE",
    217: "CUDA_ERROR_PEER_ACCESS_UNSUPPORTED",
    400: "CUDA_ERROR_INVALID_HANDLE",
    600: "CUDA_ERROR_NOT_READY",
    700: "CUDA_ERROR_ILLEGAL_ADDRESS",
    702: "CUDA_ERROR_LAUNCH_TIMEOUT",
    704: "CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED",
    705: "CUDA_ERROR_PEER_ACCESS_NOT_ENABLED",
    709: "CUDA_ERROR_CONTEXT_IS_DESTROYED",
    714: "CUDA_ERROR_HARDWARE_STACK_ERROR",
    715: "CUDA_ERROR_ILLEGAL_INSTRUCTION",
    716: "CUDA_ERROR_MISALIGNED_ADDRESS",
    717: "CUDA_ERROR_INVALID_ADDRESS_SPACE",
    718: "CUDA_ERROR_INVALID_PC",
    719: "CUDA_ERROR_LAUNCH_FAILED",
    803: "CUDA_ERROR_SYSTEM_DRIVER_MISMATCH",
    804: "CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE",
    999: "CUDA_ERROR_UNKNOWN",
}

# The codes below coincide in both APIs, which keeps the translation one table.
_OUT_OF_MEMORY = frozenset({2})
_INVALID_VALUE = frozenset({1})
# The machine cannot run CUDA at all: no driver, a stub library, no device, a driver too old.
_UNAVAILABLE = frozenset({3, 4, 34, 35, 36, 46, 100, 803, 804})
# Sticky errors: earlier work on the device failed and the context is unusable.
_STICKY = frozenset({700, 702, 714, 715, 716, 717, 718, 719})

_HINTS: dict[int, str] = {
    34: "only the CUDA stub library was found: install the NVIDIA driver",
    35: "the NVIDIA driver is missing or older than the CUDA runtime CuPy was built for",
    36: "the NVIDIA driver is older than this CUDA call needs: upgrade the driver",
    46: "every CUDA device is busy or unavailable (compute mode exclusive or prohibited?)",
    100: "no CUDA-capable device is visible (check nvidia-smi and CUDA_VISIBLE_DEVICES)",
    803: "the NVIDIA kernel driver and the user-mode driver differ: reinstall or reboot",
    804: "the CUDA forward-compatibility package does not support this device",
}


class CudaInvalidValueError(DeviceError, ValueError):
    """CUDA rejected an argument (``cudaErrorInvalidValue``); a ``ValueError`` as well."""


def status_name(status: int, api: Api = "runtime") -> str:
    """Return the symbolic name of a CUDA status code, e.g. ``2 -> "cudaErrorMemoryAllocation"``."""
    table = _RUNTIME_NAMES if api == "runtime" else _DRIVER_NAMES
    return table.get(status, f"CUDA {api} status {status}")


def translate_status(
    status: int, message: str = "", *, api: Api = "runtime", device: str | None = None
) -> HalError:
    """Return the hal exception for a CUDA status code (not raised).

    Args:
        status: a ``cudaError_t`` (``api="runtime"``) or ``CUresult`` (``api="driver"``).
        message: the vendor's text; the status name is used when empty.
        device: the ``cuda:N`` device concerned, if any.

    ``cudaErrorMemoryAllocation`` gives :class:`hal.OutOfMemoryError`,
    ``cudaErrorInvalidValue`` :class:`CudaInvalidValueError` (also a ``ValueError``),
    missing driver/device codes :class:`hal.BackendUnavailableError`, sticky launch
    failures :class:`hal.StreamError`, anything else :class:`hal.DeviceError`; the
    status name is kept in ``.code``.
    """
    if not isinstance(status, int) or isinstance(status, bool):
        raise TypeError(f"status={status!r} must be an int")
    name = status_name(status, api)
    text = message or name
    if name not in text:
        text = f"{name}: {text}"
    if status in _UNAVAILABLE:
        hint = _HINTS.get(status)
        return BackendUnavailableError("cuda", f"{hint} ({text})" if hint else text)
    if status in _OUT_OF_MEMORY:
        return OutOfMemoryError(text, device=device, code=name)
    if status in _INVALID_VALUE:
        return CudaInvalidValueError(text, device=device, code=name)
    if status in _STICKY:
        return StreamError(
            f"{text} (earlier work on the device failed; the CUDA context is unusable)",
            device=device,
            code=name,
        )
    return DeviceError(text, device=device, code=name)


def _cupy_error_types() -> tuple[type[BaseException], type[BaseException], type[BaseException]]:
    from cupy.cuda.memory import OutOfMemoryError as CupyOutOfMemoryError
    from cupy_backends.cuda.api.driver import CUDADriverError
    from cupy_backends.cuda.api.runtime import CUDARuntimeError

    return CUDARuntimeError, CUDADriverError, CupyOutOfMemoryError


def is_cuda_error(exc: BaseException) -> bool:
    """Return True if ``exc`` is one of CuPy's CUDA errors (runtime, driver, pool out-of-memory)."""
    try:
        types = _cupy_error_types()
    except ImportError:
        return False
    return isinstance(exc, types)


def translate_cuda_error(exc: BaseException, *, device: str | None = None) -> HalError:
    """Return the hal exception for a CuPy CUDA error (not raised); other exceptions pass through.

    Handles ``cupy_backends.cuda.api.runtime.CUDARuntimeError``,
    ``cupy_backends.cuda.api.driver.CUDADriverError`` (by their ``status``) and
    ``cupy.cuda.memory.OutOfMemoryError``. Any other exception gives a
    :class:`hal.DeviceError` wrapping it (an already-hal exception is returned as is).
    """
    if isinstance(exc, HalError):
        return exc
    try:
        runtime_error, driver_error, cupy_oom = _cupy_error_types()
    except ImportError:  # pragma: no cover - only reachable when CuPy vanished mid-run
        return DeviceError(f"{type(exc).__name__}: {exc}", device=device)
    if isinstance(exc, runtime_error):
        return translate_status(int(exc.status), str(exc), api="runtime", device=device)  # type: ignore[attr-defined]
    if isinstance(exc, driver_error):
        return translate_status(int(exc.status), str(exc), api="driver", device=device)  # type: ignore[attr-defined]
    if isinstance(exc, cupy_oom):
        return OutOfMemoryError(str(exc), device=device, code="cudaErrorMemoryAllocation")
    return DeviceError(f"{type(exc).__name__}: {exc}", device=device)
