"""An example hal-sdk backend plugin: ``example`` devices over host memory.

The entry point ``example`` of the ``hal.backends`` group (see pyproject.toml) names
:data:`plugin`; hal calls its ``hal_register_backends`` hook, which registers
:class:`ExampleBackend`. Everything comes from the public SPI (``hal.spi``), the public
error tree (``hal``) and the hook marker (``hal.plugins``).
"""

from hal.plugins import BackendRegistry, hookimpl
from hal_backend_example._backend import ExampleBackend

__all__ = ["ExampleBackend", "plugin"]


class _Plugin:
    """The pluggy plugin object."""

    @hookimpl
    def hal_register_backends(self, registry: BackendRegistry) -> None:
        """Register :class:`ExampleBackend` (probing happens later, in its ``__init__``)."""
        registry.add(ExampleBackend)


plugin = _Plugin()
