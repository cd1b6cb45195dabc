"""The CUDA backend (CuPy): one hal device per visible CUDA device.

Registered as the ``cuda`` entry point of the ``hal.backends`` group. Importing this
package does not import CuPy; the backend imports it when hal probes it. Without CuPy,
a driver or a GPU the backend reports status ``unavailable`` with the reason.
Environment:

- ``HAL_CUDA_DEVICES=LIST``: comma list of CUDA ordinals (after ``CUDA_VISIBLE_DEVICES``),
  in hal index order (``"1,0"`` makes ordinal 1 ``cuda:0``).
- ``HAL_CUDA_STAGING=0``: copy pageable host memory to the device directly instead of
  through the pinned staging ring.
- ``HAL_CUDA_HOST_SIGNAL=0``: declare ``host_signal`` absent (``Stream.wait_host`` then
  waits on the host) instead of ``cuStreamWaitValue32`` on pinned memory.

See docs/backends/cuda.md for what maps to what.
"""

from typing import Any

from hal.backends.cuda._backend import NOT_INSTALLED, CudaBackend, parse_device_filter
from hal.backends.cuda._errors import (
    CudaInvalidValueError,
    status_name,
    translate_cuda_error,
    translate_status,
)
from hal.plugins import BackendRegistry, hookimpl


class _Plugin:
    """The pluggy plugin object of the CUDA backend."""

    @hookimpl
    def hal_register_backends(self, registry: BackendRegistry) -> None:
        """Register :class:`CudaBackend`."""
        registry.add(CudaBackend)

    @hookimpl
    def hal_register_kernels(self, registry: Any) -> None:
        """Register the CUDA backend's dedicated ops (CuPy: cuBLAS, CUB) with hal.kernels."""
        from hal.backends.cuda._kernels import register_dedicated

        register_dedicated(registry)

    @hookimpl
    def hal_register_baselines(self, registry: Any) -> None:
        """Register the raw-library copy baseline of ``hal bench memory`` (imported when it runs)."""
        registry.add("cuda", "hal.backends.cuda._baseline:memory_baseline")


plugin = _Plugin()

__all__ = [
    "NOT_INSTALLED",
    "CudaBackend",
    "CudaInvalidValueError",
    "parse_device_filter",
    "plugin",
    "status_name",
    "translate_cuda_error",
    "translate_status",
]
