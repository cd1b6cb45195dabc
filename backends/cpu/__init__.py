"""The CPU emulator backend: NumPy memory, threaded streams, several virtual devices.

Registered as the ``cpu`` entry point of the ``hal.backends`` group. Environment:

- ``HAL_CPU_DEVICES=N``: number of virtual devices (default 2).
- ``HAL_CPU_MEMORY=SIZE``: capacity of each device (bytes, or with K/M/G suffix; default 4G).
- ``HAL_CPU_JITTER=SEED``: random delays in stream execution (reproducible per seed).
- ``HAL_CPU_SPEED=1,0.25,...`` / ``HAL_CPU_CONFIG=faults.json``: per-device speed and injected
  faults; :func:`inject_fault` / :func:`clear_faults` change them at run time.
"""

from typing import Any

from hal.backends.cpu._backend import CpuBackend
from hal.backends.cpu._faults import clear as clear_faults
from hal.backends.cpu._faults import inject as inject_fault
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

    @hookimpl
    def hal_register_baselines(self, registry: Any) -> None:
        """Register the raw-library copy baseline of ``hal bench memory`` (imported when it runs)."""
        registry.add("cpu", "hal.backends.cpu._baseline:memory_baseline")


plugin = _Plugin()

__all__ = ["CpuBackend", "clear_faults", "inject_fault", "plugin"]
