"""Translate OpenCL status codes (``pyopencl.Error``) into the hal error tree.

This module does not import PyOpenCL: the table of status codes is the one of
``CL/cl.h`` (OpenCL 3.0) plus ``PLATFORM_NOT_FOUND_KHR`` from ``cl_khr_icd``.
"""

from __future__ import annotations

from hal import (
    BackendUnavailableError,
    DeviceError,
    HalError,
    OutOfMemoryError,
    StreamError,
)

__all__ = [
    "MEMORY_CODES",
    "OpenCLStatusError",
    "status_name",
    "translate_cl_error",
    "translate_status",
]

_NAMES: dict[int, str] = {
    0: "SUCCESS",
    -1: "DEVICE_NOT_FOUND",
    -2: "DEVICE_NOT_AVAILABLE",
    -3: "COMPILER_NOT_AVAILABLE",
    -4: "MEM_OBJECT_ALLOCATION_FAILURE",
    -5: "OUT_OF_RESOURCES",
    -6: "OUT_OF_HOST_MEMORY",
    -7: "PROFILING_INFO_NOT_AVAILABLE",
    -8: "MEM_COPY_OVERLAP",
    -9: "IMAGE_FORMAT_MISMATCH",
    -10: "IMAGE_FORMAT_NOT_SUPPORTED",
    -11: "BUILD_PROGRAM_FAILURE",
    -12: "MAP_FAILURE",
    -13: "MISALIGNED_SUB_BUFFER_OFFSET",
    -14: "EXEC_STATUS_ERROR_FOR_EVENTS_IN_WAIT_LIST",
    -15: "COMPILE_PROGRAM_FAILURE",
    -16: "LINKER_NOT_AVAILABLE",
    -17: "LINK_PROGRAM_FAILURE",
    -18: "DEVICE_PARTITION_FAILED",
    -19: "KERNEL_ARG_INFO_NOT_AVAILABLE",
    -30: "INVALID_VALUE",
    -31: "INVALID_DEVICE_TYPE",
    -32: "INVALID_PLATFORM",
    -33: "INVALID_DEVICE",
    -34: "INVALID_CONTEXT",
    -35: "INVALID_QUEUE_PROPERTIES",
    -36: "INVALID_COMMAND_QUEUE",
    -37: "INVALID_HOST_PTR",
    -38: "INVALID_MEM_OBJECT",
    -39: "INVALID_IMAGE_FORMAT_DESCRIPTOR",
    -40: "INVALID_IMAGE_SIZE",
    -41: "INVALID_SAMPLER",
    -42: "INVALID_BINARY",
    -43: "INVALID_BUILD_OPTIONS",
    -44: "INVALID_PROGRAM",
    -45: "INVALID_PROGRAM_EXECUTABLE",
    -46: "INVALID_KERNEL_NAME",
    -47: "INVALID_KERNEL_DEFINITION",
    -48: "INVALID_KERNEL",
    -49: "INVALID_ARG_INDEX",
    -50: "INVALID_ARG_VALUE",
    -51: "INVALID_ARG_SIZE",
    -52: "INVALID_KERNEL_ARGS",
    -53: "INVALID_WORK_DIMENSION",
    -54: "INVALID_WORK_GROUP_SIZE",
    -55: "INVALID_WORK_ITEM_SIZE",
    -56: "INVALID_GLOBAL_OFFSET",
    -57: "INVALID_EVENT_WAIT_LIST",
    -58: "INVALID_EVENT",
    -59: "INVALID_OPERATION",
    -60: "INVALID_GL_OBJECT",
    -61: "INVALID_BUFFER_SIZE",
    -62: "INVALID_MIP_LEVEL",
    -63: "INVALID_GLOBAL_WORK_SIZE",
    -64: "INVALID_PROPERTY",
    -65: "INVALID_IMAGE_DESCRIPTOR",
    -66: "INVALID_COMPILER_OPTIONS",
    -67: "INVALID_LINKER_OPTIONS",
    -68: "INVALID_DEVICE_PARTITION_COUNT",
    -69: "INVALID_PIPE_SIZE",
    -70: "INVALID_DEVICE_QUEUE",
    -71: "INVALID_SPEC_ID",
    -72: "MAX_SIZE_RESTRICTION_EXCEEDED",
    -1001: "PLATFORM_NOT_FOUND_KHR",
}

#: Status codes that mean "the memory (device, resources or host) ran out".
MEMORY_CODES = frozenset({-4, -5, -6})
#: Status codes that mean "no platform or device to run on".
_UNAVAILABLE_CODES = frozenset({-1, -2, -1001})


def status_name(code: int) -> str:
    """Return the ``CL_`` name of an OpenCL status ``code`` (``-4`` -> ``"MEM_OBJECT_ALLOCATION_FAILURE"``)."""
    return _NAMES.get(int(code), f"UNKNOWN_STATUS_{int(code)}")


class OpenCLStatusError(StreamError):
    """An OpenCL command finished with a negative execution status (an asynchronous failure).

    ``code`` holds the status name (e.g. ``"OUT_OF_RESOURCES"``).
    """


def _error_code(exc: BaseException) -> int | None:
    code = getattr(exc, "code", None)
    if isinstance(code, int):
        return code
    return None


def translate_status(status: int, *, device: str | None, what: str) -> HalError:
    """Return the hal error for a command that ended with execution ``status`` (< 0).

    ``what`` names the command (``"copy host->device"``); memory codes give
    :class:`hal.OutOfMemoryError`, every other code a :class:`hal.StreamError`.
    """
    if status == -1:
        # drivers (PoCL: CL_FAILED) mark a command that never ran because an earlier command
        # or an event in its wait list failed with -1, which cl.h also names DEVICE_NOT_FOUND
        name = "FAILED"
        message = (
            f"{what} did not run: the driver marked it failed (status -1), "
            "because an earlier command or an awaited event failed"
        )
    else:
        name = status_name(status)
        message = f"{what} failed on the device with CL_{name} ({status})"
    if status in MEMORY_CODES:
        return OutOfMemoryError(message, device=device, code=name)
    return OpenCLStatusError(message, device=device, code=name)


def translate_cl_error(
    exc: BaseException,
    *,
    device: str | None,
    what: str,
    stream: bool = True,
    backend: str = "opencl",
) -> HalError:
    """Return the hal error for a ``pyopencl.Error`` raised while doing ``what``.

    - ``MEM_OBJECT_ALLOCATION_FAILURE``, ``OUT_OF_RESOURCES``, ``OUT_OF_HOST_MEMORY`` ->
      :class:`hal.OutOfMemoryError`;
    - ``PLATFORM_NOT_FOUND_KHR``, ``DEVICE_NOT_FOUND``, ``DEVICE_NOT_AVAILABLE`` outside a
      stream (probing, allocating) -> :class:`hal.BackendUnavailableError`;
    - anything else -> :class:`hal.StreamError` for work on a stream (``stream=True``), else
      :class:`hal.DeviceError`.

    The ``code`` attribute of the returned error is the status name. Raise the result
    ``from exc`` so the PyOpenCL error stays in the chain.
    """
    code = _error_code(exc)
    name = status_name(code) if code is not None else type(exc).__name__
    detail = str(exc)  # pyopencl: "<routine> failed: <CODE> - <driver message>"
    message = f"{what} failed: CL_{name}" + (f" [{detail}]" if detail else "")
    if code in MEMORY_CODES:
        return OutOfMemoryError(message, device=device, code=name)
    if code in _UNAVAILABLE_CODES and not stream:
        return BackendUnavailableError(backend, message)
    if stream:
        return StreamError(message, device=device, code=name)
    return DeviceError(message, device=device, code=name)
