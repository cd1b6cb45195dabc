"""The OpenCL backend (PyOpenCL): one HAL device per OpenCL device.

Registered as the ``opencl`` entry point of the ``hal.backends`` group. Importing this
package does not import PyOpenCL; the backend imports it when probed. Environment:

- ``HAL_OPENCL_PLATFORM=TEXT``: use only platforms whose name contains TEXT (case-insensitive).
- ``HAL_OPENCL_DEVICES=LIST``: comma list of device indices (after the platform filter) or
  name substrings, in HAL index order.

See docs/backends/opencl.md for what maps to what.
"""

from typing import Any

from hal.backends.opencl._backend import OpenCLBackend
from hal.backends.opencl._errors import status_name, translate_cl_error, translate_status
from hal.plugins import BackendRegistry, hookimpl


class _Plugin:
    """The pluggy plugin object of the OpenCL backend."""

    @hookimpl
    def hal_register_backends(self, registry: BackendRegistry) -> None:
        """Register :class:`OpenCLBackend`."""
        registry.add(OpenCLBackend)

    @hookimpl
    def hal_register_kernels(self, registry: Any) -> None:
        """Register the OpenCL backend's dedicated ops (PyOpenCL's ReductionKernel) with hal.kernels."""
        from hal.backends.opencl._kernels import register_dedicated

        register_dedicated(registry)

    @hookimpl
    def hal_register_baselines(self, registry: Any) -> None:
        """Register the raw-library copy baseline of ``hal bench memory`` (imported when it runs)."""
        registry.add("opencl", "hal.backends.opencl._baseline:memory_baseline")


plugin = _Plugin()

__all__ = ["OpenCLBackend", "plugin", "status_name", "translate_cl_error", "translate_status"]
