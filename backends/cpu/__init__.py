"""The CPU emulator backend: NumPy memory, threaded streams, several virtual devices.

Registered as the ``cpu`` entry point of the ``hal.backends`` group. Environment:

- ``HAL_CPU_DEVICES=N``: number of virtual devices (default 2).
- ``HAL_CPU_MEMORY=SIZE``: capacity of each device (bytes, or with K/M/G suffix; default 4G).
- ``HAL_CPU_JITTER=SEED``: random delays in stream execution (reproducible per seed).
"""

from typing import Any

from hal.backends.cpu._backend import CpuBackend
from hal.plugins import BackendRegistry, hookimpl


class _Plugin:
    """The pluggy plugin object of the CPU emulator."""

    @hookimpl
    def hal_register_backends(self, registry: BackendRegistry) -> None:
        """Register :class:`CpuBackend`."""
        registry.add(CpuBackend)

    @hookimpl
    def hal_register_kernels(self, registry: Any) -> None:
        """Register the emulator's dedicated ops (NumPy/BLAS) with hal.kernels."""
        from hal.backends.cpu._kernels import register_dedicated

        register_dedicated(registry)


plugin = _Plugin()

__all__ = ["CpuBackend", "plugin"]
