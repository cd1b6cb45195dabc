"""An example hal-sdk backend plugin: ``example`` devices over host memory.

The entry point ``example`` of the ``hal.backends`` group (see pyproject.toml) names
:data:`plugin`; hal calls its ``hal_register_backends`` hook, which registers
:class:`ExampleBackend`. Everything comes from the public SPI (``hal.spi``), the public
error tree (``hal``) and the hook marker (``hal.plugins``).
"""

import time
from typing import Any

from hal import spi
from hal.plugins import BackendRegistry, hookimpl
from hal_backend_example._backend import ExampleBackend

__all__ = ["ExampleBackend", "memory_baseline", "plugin"]


class _Plugin:
    """The pluggy plugin object."""

    @hookimpl
    def hal_register_backends(self, registry: BackendRegistry) -> None:
        """Register :class:`ExampleBackend` (probing happens later, in its ``__init__``)."""
        registry.add(ExampleBackend)

    @hookimpl
    def hal_register_baselines(self, registry: Any) -> None:
        """Register the raw copy speed of ``hal bench memory`` (plain bytearray copies, no hal)."""
        registry.add("example", memory_baseline)


def memory_baseline(direction: str, nbytes: int, repeat: int) -> float:
    """Return seconds per copy of ``nbytes`` done the way the backend does it, without hal."""
    spi.check_baseline_args(direction, nbytes, repeat)  # the ValueErrors every baseline raises
    src, dst = bytearray(nbytes), bytearray(nbytes)
    start = time.perf_counter()
    for _ in range(repeat):
        dst[:] = src
    return (time.perf_counter() - start) / repeat


plugin = _Plugin()
