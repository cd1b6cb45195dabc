"""The hal plugin system: pluggy hooks under the ``hal.backends`` entry-point group.

A vendor package exposes a module (or object) with hook implementations::

    from hal.plugins import hookimpl

    @hookimpl
    def hal_register_backends(registry):
        registry.add(MyBackend)

and declares it in its packaging metadata::

    [options.entry_points]
    hal.backends =
        mybackend = my_package.plugin
"""

from hal.plugins._hookspec import hookimpl, hookspec
from hal.plugins._loader import (
    ENTRY_POINT_GROUP,
    BackendRecord,
    PluginRecord,
    PluginSystem,
    get_system,
    reload,
)
from hal.plugins._registry import BackendRegistry, DeferredRequirements

__all__ = [
    "ENTRY_POINT_GROUP",
    "BackendRecord",
    "BackendRegistry",
    "DeferredRequirements",
    "PluginRecord",
    "PluginSystem",
    "get_system",
    "hookimpl",
    "hookspec",
    "reload",
]
